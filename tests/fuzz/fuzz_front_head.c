/*
 * fuzz_front_head.c - a client's bytes into the native front end's request parser
 * (gateway/src/serve/pdgw_front_parse.c) and, after the head, into the body reader it uses (the
 * upstream parser's body states, chunked or Content-Length).
 *
 * The end of the head must be found at the same place whether the bytes come whole or one
 * at a time; a head is parsed from an allocation of exactly its size (an over-read is caught);
 * an accepted head must hold what the request path relies on (a token method, a path starting
 * with '/' or "*", header names that are tokens, values without line breaks, the lookup finds
 * each name); a refusal is one of the statuses the front end sends. An accepted path that the
 * request path routes (pdgw_path.c) becomes an upstream target without CR, LF, space or any
 * other control byte: no escape smuggles a second request line. The body is read whole and
 * byte by byte with the same result. Never a crash, leak or over-read.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pdgw_front.h"
#include "pdgw_path.h"
#include "pdgw_upstream_h1.h"

typedef struct {
    uint64_t h;
    size_t n;
} body_digest_t;

static int on_body(void *arg, const char *data, size_t len)
{
    body_digest_t *d = arg;
    for (size_t i = 0; i < len; i++)
        d->h = (d->h ^ (uint8_t)data[i]) * 1099511628211ull;
    d->n += len;
    return PDGW_H1_BODY_OK;
}

static const pdgw_h1p_cb_t body_cb = {NULL, NULL, on_body};

static bool count_arg(void *arg, const char *name, const char *value)
{
    (void)name;
    (void)value;
    ++*(unsigned *)arg;
    return true;
}

static void check_head(const pdgw_front_head_t *h, size_t head_len)
{
    unsigned i;
    if (h->method == NULL || h->method[0] == '\0' || h->path == NULL)
        abort();
    for (const char *m = h->method; *m; m++)
        if (!pdgw_h1_is_tchar((unsigned char)*m))
            abort();
    if (h->path[0] != '/' && strcmp(h->path, "*") != 0)
        abort();
    if (h->version_minor != 0 && h->version_minor != 1)
        abort();
    {
        char routed[256];
        const char *why;
        pdgw_buf_t target = PDGW_BUF_INIT;
        if (pdgw_path_clean(h->path, routed, sizeof(routed), &why) == 0) {
            if (pdgw_path_encode(&target, routed) != PDGW_OK)
                abort();
            for (size_t k = 0; k < target.len; k++)
                if ((unsigned char)target.data[k] <= 0x20 || target.data[k] == 0x7f)
                    abort();
            pdgw_buf_free(&target);
        }
    }
    if (h->n_headers > PDGW_FRONT_MAX_HEADERS)
        abort();
    for (i = 0; i < h->n_headers; i++) {
        const char *n = h->headers[i].name, *v = h->headers[i].value;
        if (n[0] == '\0' || strpbrk(v, "\r\n") != NULL)
            abort();
        for (; *n; n++)
            if (!pdgw_h1_is_tchar((unsigned char)*n))
                abort();
        /* every name is found again, and its recorded length is its length */
        if (h->headers[i].name_len != strlen(h->headers[i].name) ||
            pdgw_front_head_get(h, h->headers[i].name, h->headers[i].name_len) == NULL)
            abort();
    }
    if (h->query != NULL) {
        unsigned args = 0;
        char *scratch = malloc(strlen(h->query) + 2);
        if (scratch == NULL)
            return;
        pdgw_front_query_each(h->query, scratch, count_arg, &args);
        free(scratch);
    }
    (void)head_len;
}

/* Read <data, len> as the body of <h>; the digest of what came out. */
static body_digest_t read_body(const pdgw_front_head_t *h, const uint8_t *data, size_t len,
                               bool byte_by_byte, int *state)
{
    pdgw_h1p_t p;
    body_digest_t d = {1469598103934665603ull, 0};
    size_t off = 0, have = 0; /* have: bytes given before and not consumed */
    pdgw_h1p_init_body(&p, h->chunked, h->has_length ? h->content_length : 0);
    /* Byte by byte: the unconsumed bytes stay in front, as the front end's buffer keeps them. */
    while (p.state != PDGW_H1P_DONE && p.state != PDGW_H1P_ERROR && off < len) {
        size_t avail = byte_by_byte && have + 1 < len - off ? have + 1 : len - off;
        long k = pdgw_h1p_feed(&p, (const char *)data + off, avail, &body_cb, &d);
        if (k < 0)
            break;
        if ((size_t)k > avail)
            abort();
        off += (size_t)k;
        have = avail - (size_t)k;
        if (k == 0 && avail == len - (off - (size_t)k) && (!byte_by_byte || avail == len - off))
            break; /* everything was given and nothing more can be read */
    }
    *state = p.state;
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t end = pdgw_front_head_end((const char *)data, size, 0), prev = 0, cut;
    pdgw_front_head_t h;
    const char *why = NULL;
    char *copy;
    int st;

    /* The same end when the bytes arrive one at a time. */
    for (cut = 1; cut <= size && cut <= 8192; cut++) {
        size_t e = pdgw_front_head_end((const char *)data, cut, prev);
        if (e != 0) {
            if (e != end)
                abort();
            break;
        }
        prev = cut;
    }
    if (end == 0)
        return 0;
    copy = malloc(end);
    if (copy == NULL)
        return 0;
    memcpy(copy, data, end);
    st = pdgw_front_head_parse(copy, end, &h, &why);
    if (st != 0) {
        if ((st != 400 && st != 431 && st != 501 && st != 505) || why == NULL)
            abort();
    } else {
        int s1, s2;
        body_digest_t whole, bytes;
        check_head(&h, end);
        whole = read_body(&h, data + end, size - end, false, &s1);
        bytes = read_body(&h, data + end, size - end, true, &s2);
        if (s1 != s2 || whole.h != bytes.h || whole.n != bytes.n)
            abort();
    }
    free(copy);
    return 0;
}
