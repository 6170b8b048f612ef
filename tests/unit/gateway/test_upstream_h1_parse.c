/*
 * test_upstream_h1_parse.c - the native client's HTTP/1.1 response parser: every way of
 * cutting a response (each split point, byte by byte) gives the same status, headers, body
 * and verdict; Content-Length, chunked (extensions, trailers), close-delimited and bodiless
 * responses; back-pressure (a paused body is handed out again); refused input with its
 * reason. The rules are RFC 9112's (sections 2.2, 4, 5.2, 6.1, 6.3, 7.1).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_upstream_h1.h"

typedef struct seen {
    char headers[2048];
    size_t hlen;
    char body[4096];
    size_t blen;
    int final_status;
    int n_headers_done;
    int pause_next; /* pause this many body calls */
    int abort_body;
} seen_t;

static int on_header(void *arg, const char *line, size_t len)
{
    seen_t *s = arg;
    assert_true(s->hlen + len < sizeof(s->headers));
    memcpy(s->headers + s->hlen, line, len);
    s->hlen += len;
    s->headers[s->hlen] = '\0';
    return 0;
}

static int on_headers_done(void *arg, int status)
{
    seen_t *s = arg;
    s->final_status = status;
    s->n_headers_done++;
    return 0;
}

static int on_body(void *arg, const char *data, size_t len)
{
    seen_t *s = arg;
    if (s->abort_body)
        return PDGW_H1_BODY_ABORT;
    if (s->pause_next > 0) {
        s->pause_next--;
        return PDGW_H1_BODY_PAUSE;
    }
    assert_true(s->blen + len < sizeof(s->body));
    memcpy(s->body + s->blen, data, len);
    s->blen += len;
    s->body[s->blen] = '\0';
    return PDGW_H1_BODY_OK;
}

static const pdgw_h1p_cb_t cb = {on_header, on_headers_done, on_body};

typedef struct result {
    seen_t seen;
    pdgw_h1p_state_t state;
    bool keep_alive;
    bool eof_ok; /* what pdgw_h1p_eof said at the end (when not DONE before) */
    const char *err;
    size_t left; /* bytes not consumed (after the end of the response) */
} result_t;

/* Feed <msg> in pieces of the sizes in <cuts> (0-terminated; the rest whole), keeping
 * unconsumed bytes in front of the next piece as the client does; then EOF when <eof>. */
static void feed_cut(const char *msg, size_t len, const size_t *cuts, bool eof, bool head,
                     result_t *out)
{
    char pending[8192];
    size_t plen = 0, off = 0;
    int i = 0;
    pdgw_h1p_t p;
    memset(out, 0, sizeof(*out));
    pdgw_h1p_init(&p, head);
    while (off < len) {
        size_t n = cuts && cuts[i] ? cuts[i++] : len - off;
        long used;
        if (n > len - off)
            n = len - off;
        assert_true(plen + n <= sizeof(pending));
        memcpy(pending + plen, msg + off, n);
        plen += n;
        off += n;
        used = pdgw_h1p_feed(&p, pending, plen, &cb, &out->seen);
        if (used >= 0) {
            memmove(pending, pending + used, plen - (size_t)used);
            plen -= (size_t)used;
        }
        if (used < 0 || p.state == PDGW_H1P_DONE)
            break;
    }
    out->left = plen + (len - off);
    out->eof_ok = p.state == PDGW_H1P_DONE;
    if (eof && p.state != PDGW_H1P_DONE && p.state != PDGW_H1P_ERROR)
        out->eof_ok = pdgw_h1p_eof(&p) && plen == 0;
    out->state = p.state;
    out->keep_alive = p.keep_alive;
    out->err = p.err;
}

static void assert_same(const result_t *a, const result_t *b)
{
    assert_string_equal(a->seen.headers, b->seen.headers);
    assert_int_equal(a->seen.blen, b->seen.blen);
    assert_memory_equal(a->seen.body, b->seen.body, a->seen.blen);
    assert_int_equal(a->seen.final_status, b->seen.final_status);
    assert_int_equal(a->seen.n_headers_done, b->seen.n_headers_done);
    assert_int_equal(a->state, b->state);
    assert_int_equal(a->keep_alive, b->keep_alive);
    assert_int_equal(a->eof_ok, b->eof_ok);
    if (a->state != PDGW_H1P_ERROR) /* where an error stops depends on the cut */
        assert_int_equal(a->left, b->left);
    if (a->err || b->err)
        assert_string_equal(a->err ? a->err : "", b->err ? b->err : "");
}

/* Whole, cut at every single point, and byte by byte: all the same. */
static void check_all_cuts(const char *msg, bool eof, bool head, result_t *whole)
{
    size_t len = strlen(msg), at;
    size_t ones[8192];
    result_t r;
    feed_cut(msg, len, NULL, eof, head, whole);
    for (at = 1; at < len; at++) {
        size_t cuts[2] = {at, 0};
        feed_cut(msg, len, cuts, eof, head, &r);
        assert_same(whole, &r);
    }
    assert_true(len < sizeof(ones) / sizeof(ones[0]));
    for (at = 0; at < len; at++)
        ones[at] = 1;
    ones[len] = 0;
    feed_cut(msg, len, ones, eof, head, &r);
    assert_same(whole, &r);
}

static void test_content_length(void **state)
{
    result_t r;
    (void)state;
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
                   "Retry-After: 3\r\n\r\n{\"a\":1}",
                   false, false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_int_equal(r.seen.final_status, 200);
    assert_string_equal(r.seen.body, "{\"a\":1}");
    assert_true(r.keep_alive);
    /* the status line is handed out first, as libcurl does; lines keep their CRLF */
    assert_string_equal(r.seen.headers, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                        "Content-Length: 7\r\nRetry-After: 3\r\n");
    /* bytes after the end belong to nobody: left unconsumed (the client closes) */
    check_all_cuts("HTTP/1.1 204 No Content\r\n\r\nextra", false, false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_int_equal(r.left, 5);
    assert_int_equal(r.seen.blen, 0);
}

static void test_chunked(void **state)
{
    result_t r;
    (void)state;
    /* RFC 9112 7.1: hex sizes, extensions after ';', trailer fields after the last chunk */
    check_all_cuts("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5;name=value;flag\r\nhello\r\n"
                   "1A ; ext=\"quoted\"\r\nabcdefghijklmnopqrstuvwxyz\r\n"
                   "0\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n",
                   false, false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_string_equal(r.seen.body, "helloabcdefghijklmnopqrstuvwxyz");
    assert_true(r.keep_alive);
    assert_null(strstr(r.seen.headers, "X-Trailer")); /* trailers are not headers */
    assert_int_equal(r.left, 0);
    /* bare LF line ends are accepted (RFC 9112 2.2) */
    check_all_cuts("HTTP/1.1 200 OK\nTransfer-Encoding: gzip, chunked\n\n3\nabc\n0\n\n", false,
                   false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_string_equal(r.seen.body, "abc");
    /* an SSE stream as engines send it: chunked events, cut off without the last chunk */
    check_all_cuts("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   "transfer-encoding: chunked\r\n\r\n"
                   "f\r\ndata: {\"a\":1}\n\n\r\n",
                   true, false, &r);
    assert_false(r.eof_ok);
    assert_string_equal(r.err, "connection closed inside the response body");
    assert_string_equal(r.seen.body, "data: {\"a\":1}\n\n");
}

static void test_close_delimited_and_bodiless(void **state)
{
    result_t r;
    (void)state;
    /* no length: the body runs until the engine closes; the connection is not kept */
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close", true, false,
                   &r);
    assert_true(r.eof_ok);
    assert_false(r.keep_alive);
    assert_string_equal(r.seen.body, "until close");
    /* Transfer-Encoding that does not end in chunked: read to close (RFC 9112 6.3 item 4) */
    check_all_cuts("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nxyz",
                   true, false, &r);
    assert_true(r.eof_ok);
    assert_false(r.keep_alive);
    assert_string_equal(r.seen.body, "xyz");
    /* HEAD: Content-Length describes a body that is not sent */
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", false, true, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_true(r.keep_alive);
    /* 304 and 1xx have no body; an interim 100 is followed by the real response */
    check_all_cuts(
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        false, false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_int_equal(r.seen.final_status, 304);
    assert_int_equal(r.seen.n_headers_done, 1);
    assert_non_null(strstr(r.seen.headers, "HTTP/1.1 100 Continue\r\nHTTP/1.1 304"));
    /* HTTP/1.0 closes unless it says keep-alive; Connection: close is honoured */
    check_all_cuts("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", false, false, &r);
    assert_false(r.keep_alive);
    check_all_cuts("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx", false,
                   false, &r);
    assert_true(r.keep_alive);
    check_all_cuts("HTTP/1.1 503 Busy\r\nConnection: foo, close\r\nContent-Length: 1\r\n\r\nx",
                   false, false, &r);
    assert_false(r.keep_alive);
    assert_int_equal(r.seen.final_status, 503);
    /* chunked and Content-Length together: chunked wins, the connection is not reused */
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "1\r\nz\r\n0\r\n\r\n",
                   false, false, &r);
    assert_int_equal(r.state, PDGW_H1P_DONE);
    assert_false(r.keep_alive);
    assert_string_equal(r.seen.body, "z");
}

static void test_cut_short(void **state)
{
    result_t r;
    (void)state;
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345", true, false, &r);
    assert_false(r.eof_ok);
    assert_string_equal(r.err, "connection closed inside the response body");
    check_all_cuts("HTTP/1.1 200 OK\r\nContent-Le", true, false, &r);
    assert_false(r.eof_ok);
    assert_string_equal(r.err, "connection closed before the response head was complete");
}

/* Input that must be refused, and the reason given. */
static void expect_refused(const char *msg, const char *why)
{
    result_t r;
    check_all_cuts(msg, true, false, &r);
    assert_int_equal(r.state, PDGW_H1P_ERROR);
    assert_non_null(r.err);
    assert_string_equal(r.err, why);
}

static void test_refused(void **state)
{
    char big[70 * 1024];
    pdgw_h1p_t p;
    seen_t s;
    size_t n;
    (void)state;
    expect_refused("HTTP/2 200 OK\r\n\r\n", "malformed status line");
    expect_refused("HTTP/1.1 20 OK\r\n\r\n", "malformed status code");
    expect_refused("HTTP/1.1 2000 OK\r\n\r\n", "malformed status line");
    expect_refused("ICY 200 OK\r\n\r\n", "malformed status line");
    expect_refused("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", "invalid Content-Length");
    expect_refused("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length");
    expect_refused("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
                   "invalid Content-Length");
    expect_refused("HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n", "invalid Content-Length");
    expect_refused("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                   "conflicting Content-Length headers");
    expect_refused("HTTP/1.1 200 OK\r\nX-A: 1\r\n  folded\r\n\r\n",
                   "obsolete line folding in a header");
    expect_refused("HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line");
    expect_refused("HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n", "malformed header name");
    expect_refused("HTTP/1.1 200 OK\r\nX-A: a\rb\r\n\r\n", "control character in a header value");
    expect_refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                   "malformed chunk size");
    expect_refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n",
                   "chunk size too large");
    expect_refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
                   "chunk data longer than its size");
    expect_refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nno colon\r\n\r\n",
                   "malformed trailer line");
    expect_refused("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
                   "unexpected protocol switch");
    /* a head larger than 64 KiB, whole or cut */
    n = (size_t)snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nX-Big: ");
    memset(big + n, 'a', sizeof(big) - n - 1);
    big[sizeof(big) - 1] = '\0';
    memset(&s, 0, sizeof(s));
    pdgw_h1p_init(&p, false);
    assert_int_equal(pdgw_h1p_feed(&p, big, strlen(big), &cb, &s), -1);
    assert_string_equal(p.err, "response head too large");
    /* a NUL inside a header value */
    memset(&s, 0, sizeof(s));
    pdgw_h1p_init(&p, false);
    assert_int_equal(pdgw_h1p_feed(&p, "HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n", 27, &cb, &s), -1);
    assert_string_equal(p.err, "control character in a header value");
}

/* Values are scanned a word at a time: a NUL or CR at every offset of a value of every length
 * around a word is refused, and the same value without it is taken. */
static void test_value_bytes_at_every_offset(void **state)
{
    static const char bad[] = {'\0', '\r'};
    (void)state;
    for (size_t len = 1; len <= 20; len++) {
        for (size_t at = 0; at <= len; at++) {
            for (size_t k = 0; k <= sizeof(bad); k++) {
                char text[128];
                pdgw_h1p_t p;
                seen_t s;
                size_t n = (size_t)snprintf(text, sizeof(text), "HTTP/1.1 200 OK\r\nX-A: ");
                bool poisoned = k < sizeof(bad) && at < len;
                for (size_t i = 0; i < len; i++)
                    text[n++] = poisoned && i == at ? bad[k] : (char)('a' + i % 26);
                n += (size_t)snprintf(text + n, sizeof(text) - n, "\r\nContent-Length: 0\r\n\r\n");
                memset(&s, 0, sizeof(s));
                pdgw_h1p_init(&p, false);
                long rc = pdgw_h1p_feed(&p, text, n, &cb, &s);
                if (poisoned) {
                    if (rc != -1 || strcmp(p.err, "control character in a header value") != 0)
                        fail_msg("byte %#x at %zu of %zu: not refused", bad[k], at, len);
                } else if (rc != (long)n) {
                    fail_msg("clean value of %zu bytes: %ld of %zu taken (%s)", len, rc, n,
                             p.err ? p.err : "");
                }
            }
        }
    }
}

static void test_pause_and_abort(void **state)
{
    static const char msg[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    pdgw_h1p_t p;
    seen_t s;
    long used;
    (void)state;
    memset(&s, 0, sizeof(s));
    s.pause_next = 1;
    pdgw_h1p_init(&p, false);
    used = pdgw_h1p_feed(&p, msg, sizeof(msg) - 1, &cb, &s);
    /* the head is consumed, the refused body is left where it was */
    assert_int_equal(used, (long)(sizeof(msg) - 1 - 5));
    assert_int_equal(s.blen, 0);
    assert_int_equal(p.state, PDGW_H1P_BODY_LENGTH);
    used = pdgw_h1p_feed(&p, msg + used, 5, &cb, &s);
    assert_int_equal(used, 5);
    assert_string_equal(s.body, "hello");
    assert_int_equal(p.state, PDGW_H1P_DONE);

    memset(&s, 0, sizeof(s));
    s.abort_body = 1;
    pdgw_h1p_init(&p, false);
    assert_int_equal(pdgw_h1p_feed(&p, msg, sizeof(msg) - 1, &cb, &s), -1);
    assert_string_equal(p.err, "aborted");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_length),
        cmocka_unit_test(test_chunked),
        cmocka_unit_test(test_close_delimited_and_bodiless),
        cmocka_unit_test(test_cut_short),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_value_bytes_at_every_offset),
        cmocka_unit_test(test_pause_and_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
