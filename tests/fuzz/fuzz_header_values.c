/*
 * fuzz_header_values.c - request header values the gateway parses from
 * clients: `traceparent` (pdgw_traceparent_parse) and `X-Request-Timeout`
 * (pdgw_duration_parse), in gateway/src/util/pdgw_ids.c and gateway/src/util/pdgw_parse.c.
 *
 * Byte 0 picks the header, the rest is its value. Never a crash or an
 * over-read (the value is handed over without a NUL where the API takes a
 * length); what parses formats back to text that parses to the same value;
 * a timeout parses only below 2^63 ms.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_util.h"

static void traceparent(const char *s, size_t len)
{
    pdgw_traceparent_t tp, again;
    char text[PDGW_TRACEPARENT_LEN + 1];
    char *copy;

    /* an exact-size heap copy: ASan sees any read past <len> */
    copy = malloc(len ? len : 1);
    memcpy(copy, s, len);
    if (pdgw_traceparent_parse(copy, len, &tp) == PDGW_OK) {
        pdgw_traceparent_format(&tp, text);
        if (strlen(text) != PDGW_TRACEPARENT_LEN ||
            pdgw_traceparent_parse(text, strlen(text), &again) != PDGW_OK ||
            memcmp(again.trace_id, tp.trace_id, sizeof(tp.trace_id)) != 0 ||
            memcmp(again.parent_id, tp.parent_id, sizeof(tp.parent_id)) != 0 ||
            again.flags != tp.flags)
            abort();
    }
    free(copy);
}

static void request_timeout(const char *s, size_t len)
{
    char *z = malloc(len + 1);
    uint64_t ms, again;
    char text[64];

    memcpy(z, s, len);
    z[len] = '\0';
    if (pdgw_duration_parse(z, &ms) == PDGW_OK) {
        if (ms >= 9200000000000000000ull)
            abort();
        /* the parse goes through a double: exact (and so round-trips) up to 2^53 ms */
        if (ms <= (1ull << 53)) {
            size_t n = pdgw_duration_format(ms, text, sizeof(text));
            if (n == 0 || n >= sizeof(text) || pdgw_duration_parse(text, &again) != PDGW_OK ||
                again != ms)
                abort();
        }
    }
    free(z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        request_timeout((const char *)data + 1, size - 1);
    else
        traceparent((const char *)data + 1, size - 1);
    return 0;
}
