/*
 * fuzz_upstream_h1.c - an upstream engine's HTTP/1.1 response into the native client's
 * parser (gateway/src/upstream/pdgw_upstream_h1_parse.c).
 *
 * Byte 0: bit 0 = the request was HEAD (no body), bit 1 = the body callback pauses every
 * other call (back-pressure hands the same bytes out again). The rest is the response as the
 * socket delivers it, fed twice: whole, and cut into pieces whose sizes come from the input
 * (unconsumed bytes kept in front of the next piece, as the client's read buffer does), then
 * end of stream. Both runs must give the same headers, body, status, keep-alive verdict and
 * end state; never a crash, over-read, leak or a consumed count beyond what was given.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_upstream_h1.h"

typedef struct digest {
    uint64_t h;
    int status;
    int pause;     /* pause every other body call */
    unsigned tick; /* body calls so far */
    bool paused;   /* the last feed stopped at a pause */
} digest_t;

static void mix(digest_t *d, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        d->h = (d->h ^ b[i]) * 1099511628211ull;
}

static int on_header(void *arg, const char *line, size_t len)
{
    digest_t *d = arg;
    if (len == 0 || line[len - 1] != '\n')
        abort(); /* a header line is handed out whole */
    mix(d, line, len);
    d->h = (d->h ^ 0x100) * 1099511628211ull;
    return 0;
}

static int on_headers_done(void *arg, int status)
{
    digest_t *d = arg;
    if (status < 100 || status > 999 || (status >= 100 && status < 200))
        abort(); /* only a final status ends the head */
    d->status = status;
    return 0;
}

static int on_body(void *arg, const char *data, size_t len)
{
    digest_t *d = arg;
    if (len == 0)
        abort();
    if (d->pause && (d->tick++ & 1) == 0) {
        d->paused = true;
        return PDGW_H1_BODY_PAUSE;
    }
    mix(d, data, len); /* body bytes as one stream: cut points must not show */
    return PDGW_H1_BODY_OK;
}

static const pdgw_h1p_cb_t cb = {on_header, on_headers_done, on_body};

typedef struct verdict {
    pdgw_h1p_state_t state;
    bool keep_alive, eof_ok;
} verdict_t;

static void run(const uint8_t *data, size_t size, bool head, const uint8_t *cuts, size_t ncuts,
                digest_t *d, verdict_t *v)
{
    char *pending = malloc(size + 1);
    size_t plen = 0, off = 0, k = 0;
    pdgw_h1p_t p;
    pdgw_h1p_init(&p, head);
    while (off < size && p.state != PDGW_H1P_ERROR && p.state != PDGW_H1P_DONE) {
        size_t n = size - off;
        long used;
        if (cuts != NULL) {
            size_t c = 1 + cuts[k++ % ncuts] % 23;
            n = c < n ? c : n;
        }
        memcpy(pending + plen, data + off, n);
        plen += n;
        off += n;
        /* A pause returns early: call again, as the unpause from the loop does. */
        for (;;) {
            d->paused = false;
            used = pdgw_h1p_feed(&p, pending, plen, &cb, d);
            if (used < 0)
                break;
            if ((size_t)used > plen)
                abort();
            memmove(pending, pending + used, plen - (size_t)used);
            plen -= (size_t)used;
            if (p.state == PDGW_H1P_DONE || !d->paused)
                break;
        }
    }
    v->eof_ok =
        p.state == PDGW_H1P_DONE || (p.state != PDGW_H1P_ERROR && plen == 0 && pdgw_h1p_eof(&p));
    v->state = p.state;
    v->keep_alive = p.keep_alive;
    free(pending);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    digest_t whole = {.h = 14695981039346656037ull}, pieces;
    verdict_t a, b;
    bool head;
    if (size < 1)
        return 0;
    head = data[0] & 1;
    whole.pause = (data[0] >> 1) & 1;
    pieces = whole;
    data++;
    size--;
    run(data, size, head, NULL, 0, &whole, &a);
    run(data, size, head, data, size, &pieces, &b);
    /* Where an error stops depends on the cut; everything else may not. */
    if ((a.state == PDGW_H1P_ERROR) != (b.state == PDGW_H1P_ERROR))
        abort();
    if (a.state != PDGW_H1P_ERROR &&
        (whole.h != pieces.h || whole.status != pieces.status || a.state != b.state ||
         a.keep_alive != b.keep_alive || a.eof_ok != b.eof_ok))
        abort();
    return 0;
}
