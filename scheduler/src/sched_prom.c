/*
 * A small Prometheus text-format reader for the engine metrics the
 * scheduler uses (docs/protocols/README.md, engine metrics): vLLM's vllm:num_requests_running /
 * vllm:num_requests_waiting / vllm:kv_cache_usage_perc (vllm/v1/metrics/
 * loggers.py) and SGLang's sglang:num_running_reqs / sglang:num_queue_reqs
 * (+ its PD queues) / sglang:token_usage (python/sglang/srt/metrics/
 * collector.py). Counts are summed over their label sets (several models or
 * DP ranks behind one endpoint); the usage fraction takes the largest.
 * Malformed lines are skipped; nothing in the input can make it read
 * outside [text, text + len).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* Parse one sample line [p, end); false when malformed. */
static bool parse_line(const char *p, const char *end, const char **name, size_t *name_len,
                       double *value)
{
    const char *n0 = p;
    char num[64];
    size_t nl;
    char *stop;

    if (p >= end || !name_char(*p, true))
        return false;
    while (p < end && name_char(*p, false))
        p++;
    *name = n0;
    *name_len = (size_t)(p - n0);
    if (p < end && *p == '{') {
        bool in_str = false;
        p++;
        while (p < end) {
            if (in_str) {
                if (*p == '\\')
                    p++;
                else if (*p == '"')
                    in_str = false;
            } else if (*p == '"') {
                in_str = true;
            } else if (*p == '}') {
                break;
            }
            p++;
        }
        if (p >= end)
            return false;
        p++;
    }
    if (p >= end || (*p != ' ' && *p != '\t'))
        return false;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    nl = 0;
    while (p < end && *p != ' ' && *p != '\t' && nl < sizeof(num) - 1)
        num[nl++] = *p++;
    num[nl] = '\0';
    if (nl == 0)
        return false;
    *value = strtod(num, &stop);
    return *stop == '\0' && isfinite(*value);
}

static bool is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && memcmp(name, want, len) == 0;
}

/* SGLang's PD queues of requests not yet running: a prefill's bootstrap queue (waiting for
 * its decode), a decode's pre-allocation and KV-transfer queues. Names from upstream
 * python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector). */
static bool sglang_pd_queue(const char *name, size_t len)
{
    return is(name, len, "sglang:num_prefill_prealloc_queue_reqs") ||
           is(name, len, "sglang:num_decode_prealloc_queue_reqs") ||
           is(name, len, "sglang:num_decode_transfer_queue_reqs");
}

sched_status_t sched_prom_parse(const char *text, size_t len, sched_engine_metrics_t *out)
{
    const char *p = text, *end = text + len;
    double gpu_usage = 0;
    bool have_gpu = false;

    memset(out, 0, sizeof(*out));
    if (!text)
        return SCHED_ERR_INVALID;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        const char *name;
        size_t nlen;
        double v;

        while (p < line_end && (*p == ' ' || *p == '\t'))
            p++;
        if (p < line_end && *p != '#' && parse_line(p, line_end, &name, &nlen, &v)) {
            if (is(name, nlen, "vllm:num_requests_running") ||
                is(name, nlen, "sglang:num_running_reqs")) {
                out->running += v;
                out->have_running = true;
            } else if (is(name, nlen, "vllm:num_requests_waiting") ||
                       is(name, nlen, "sglang:num_queue_reqs") || sglang_pd_queue(name, nlen)) {
                out->waiting += v;
                out->have_waiting = true;
            } else if (is(name, nlen, "vllm:kv_cache_usage_perc") ||
                       is(name, nlen, "sglang:token_usage")) {
                out->kv_usage = out->have_kv_usage && out->kv_usage > v ? out->kv_usage : v;
                out->have_kv_usage = true;
            } else if (is(name, nlen, "vllm:gpu_cache_usage_perc")) {
                gpu_usage = have_gpu && gpu_usage > v ? gpu_usage : v;
                have_gpu = true;
            }
        }
        p = eol ? eol + 1 : end;
    }
    if (!out->have_kv_usage && have_gpu) {
        out->kv_usage = gpu_usage;
        out->have_kv_usage = true;
    }
    /* The *_perc gauges are fractions; accept percents from odd exporters. */
    if (out->kv_usage > 1.0)
        out->kv_usage /= 100.0;
    if (out->kv_usage < 0)
        out->kv_usage = 0;
    if (out->kv_usage > 1.0)
        out->kv_usage = 1.0;
    if (out->running < 0)
        out->running = 0;
    if (out->waiting < 0)
        out->waiting = 0;
    return (out->have_running || out->have_waiting || out->have_kv_usage) ? SCHED_OK
                                                                          : SCHED_ERR_NOT_FOUND;
}
