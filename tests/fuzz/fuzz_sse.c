/*
 * fuzz_sse.c - an upstream engine's text/event-stream into the gateway's SSE
 * parser (gateway/src/upstream/pdgw_sse.c).
 *
 * The input is fed twice: whole, and in pieces whose sizes come from the
 * input itself (TCP may cut a stream anywhere). Both runs must yield the
 * same events (raw bytes, data, event name, [DONE]) and the same end-of-stream verdict;
 * never a crash, over-read or leak. Byte 0 sets a small max_event so the
 * size limit is exercised too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_sse.h"

typedef struct digest {
    uint64_t h;
    size_t events;
} digest_t;

static void mix(digest_t *d, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        d->h = (d->h ^ b[i]) * 1099511628211ull;
    d->h = (d->h ^ n) * 1099511628211ull;
}

static int on_event(void *arg, const pdgw_sse_event_t *ev)
{
    digest_t *d = arg;
    if (strlen(ev->data) != ev->data_len && memchr(ev->data, '\0', ev->data_len) == NULL)
        abort();
    mix(d, ev->raw, ev->raw_len);
    mix(d, ev->data, ev->data_len);
    mix(d, ev->event, strlen(ev->event));
    mix(d, &ev->is_done, sizeof(ev->is_done));
    mix(d, &ev->has_data, sizeof(ev->has_data));
    d->events++;
    return 0;
}

/* Returns the feed status of the first failure (or PDGW_OK) and the finish verdict. */
static pdgw_status_t run(const uint8_t *data, size_t size, size_t max_event, const uint8_t *cuts,
                         size_t ncuts, digest_t *d, bool *cut_off)
{
    pdgw_sse_t p;
    pdgw_status_t st = PDGW_OK;
    size_t off = 0, k = 0;

    pdgw_sse_init(&p);
    p.max_event = max_event;
    while (off < size && st == PDGW_OK) {
        size_t n = size - off;
        if (cuts != NULL) {
            size_t c = 1 + cuts[k++ % ncuts] % 17;
            n = c < n ? c : n;
        }
        st = pdgw_sse_feed(&p, (const char *)data + off, n, on_event, d);
        off += n;
    }
    *cut_off = st == PDGW_OK ? pdgw_sse_finish(&p, on_event, d) : false;
    pdgw_sse_free(&p);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    digest_t whole = {.h = 14695981039346656037ull}, pieces = whole;
    bool cut_whole, cut_pieces;
    pdgw_status_t a, b;
    size_t max_event;

    if (size < 1)
        return 0;
    max_event = (data[0] & 1) ? 64 : 0;
    data++;
    size--;
    a = run(data, size, max_event, NULL, 0, &whole, &cut_whole);
    b = run(data, size, max_event, data, size, &pieces, &cut_pieces);
    /* an over-size event may be noticed earlier or later depending on the cut; otherwise
     * the cuts must not matter */
    if (a == PDGW_OK && b == PDGW_OK &&
        (whole.h != pieces.h || whole.events != pieces.events || cut_whole != cut_pieces))
        abort();
    return 0;
}
