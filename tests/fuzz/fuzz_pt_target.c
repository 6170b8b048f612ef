/*
 * fuzz_pt_target.c - a client's request path into the routing path and the upstream target
 * that pass-through builds from it (gateway/src/serve/pdgw_path.c).
 *
 * Properties: a path is refused (400, 414, with a reason) or routed; a routed path fits its
 * buffer and holds no control byte, space or ".." segment; its upstream target holds no byte
 * that could end a request line; routing the target again gives the same routing path (the
 * engine reads what pdgw routed). Never a crash, leak or over-read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_path.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *raw, routed[256], again[256];
    const char *why = NULL;
    pdgw_buf_t target = PDGW_BUF_INIT;
    int st;
    if (size > 4096)
        return 0;
    raw = malloc(size + 1);
    if (raw == NULL)
        return 0;
    memcpy(raw, data, size);
    raw[size] = '\0';
    st = pdgw_path_clean(raw, routed, sizeof(routed), &why);
    if (st != 0) {
        if ((st != 400 && st != 414) || why == NULL)
            abort();
        free(raw);
        return 0;
    }
    for (const char *p = routed; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            abort();
    if (pdgw_path_encode(&target, routed) != PDGW_OK)
        abort();
    for (size_t k = 0; k < target.len; k++)
        if ((unsigned char)target.data[k] <= 0x20 || target.data[k] == 0x7f)
            abort();
    if (pdgw_buf_append_char(&target, '\0') != PDGW_OK)
        abort();
    /* The target routes to the same path, unless its escapes make it longer than the buffer. */
    st = pdgw_path_clean(target.data, again, sizeof(again), &why);
    if (st == 0 ? strcmp(again, routed) != 0 : st != 414)
        abort();
    pdgw_buf_free(&target);
    free(raw);
    return 0;
}
