/*
 * fuzz_engine_metrics.c - an engine's Prometheus /metrics page into the
 * scheduler's parser (scheduler/src/sched_prom.c, sched_prom_parse), which
 * reads the vLLM gauges and counters the load-aware policies use.
 * Never a crash, over-read (the text is an exact-size copy without a NUL)
 * or leak; the parse is deterministic.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sched_engine_metrics_t a, b;
    char *text = malloc(size ? size : 1);
    sched_status_t sa, sb;

    memcpy(text, data, size);
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    sa = sched_prom_parse(text, size, &a);
    sb = sched_prom_parse(text, size, &b);
    if (sa != sb || (sa == SCHED_OK && memcmp(&a, &b, sizeof(a)) != 0))
        abort();
    free(text);
    return 0;
}
