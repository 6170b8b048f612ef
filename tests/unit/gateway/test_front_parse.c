/*
 * test_front_parse.c - the native front end's request head: where a head ends (cut at every
 * byte), what it says (method, raw path, raw query, version, keep-alive, framing,
 * 100-continue), header lookup, query decoding, and every refusal with its status. The rules
 * are RFC 9112's (sections 2.2, 3, 3.2, 5.1, 5.2, 6.1, 6.3, 9.3) and RFC 9110's (7.2, 10.1.1).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_front.h"

/* Parse <text> from a writable copy (kept in <copy>, which must outlive <h>'s use). */
static const char *head_get(const pdgw_front_head_t *h, const char *name)
{
    return pdgw_front_head_get(h, name, strlen(name));
}

static int parse(const char *text, char *copy, size_t cap, pdgw_front_head_t *h, const char **why)
{
    size_t n = strlen(text);
    assert_true(n < cap);
    memcpy(copy, text, n + 1);
    return pdgw_front_head_parse(copy, n, h, why);
}

static void test_head_end_at_every_cut(void **state)
{
    static const char *heads[] = {
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\nHost: a\n\n",
        "GET / HTTP/1.1\r\nHost: a\n\r\n",
    };
    const char *tail = "BODY";
    size_t k;
    (void)state;
    for (k = 0; k < sizeof(heads) / sizeof(heads[0]); k++) {
        char buf[128];
        size_t n = strlen(heads[k]), cut, prev = 0;
        snprintf(buf, sizeof(buf), "%s%s", heads[k], tail);
        /* Fed as it arrives, the end is found exactly when its last byte is in. */
        for (cut = 0; cut <= n + strlen(tail); cut++) {
            size_t end = pdgw_front_head_end(buf, cut, prev);
            if (cut < n) {
                assert_int_equal(end, 0);
                prev = cut;
            } else {
                assert_int_equal(end, n);
            }
        }
    }
    /* A lone CR before the last LF is not an empty line. */
    assert_int_equal(pdgw_front_head_end("GET / HTTP/1.1\r\nHost: a\r\n\rX\n", 27, 0), 0);
}

static void test_request_fields(void **state)
{
    char copy[512];
    pdgw_front_head_t h;
    const char *why;
    (void)state;
    assert_int_equal(parse("POST /v1/chat%2Fcompletions?a=1&b HTTP/1.1\r\n"
                           "Host: gw\r\nContent-Length: 12\r\nX-Empty:\r\n"
                           "X-Pad:  padded value \t\r\nexpect: 100-continue\r\n\r\n",
                           copy, sizeof(copy), &h, &why),
                     0);
    assert_string_equal(h.method, "POST");
    /* the path as it came: the request path decodes it (pdgw_path.c, tests/unit/gateway/
     * test_path.c), and %2F is never decoded into a segment boundary */
    assert_string_equal(h.path, "/v1/chat%2Fcompletions");
    assert_string_equal(h.query, "a=1&b");
    assert_int_equal(h.version_minor, 1);
    assert_true(h.keep_alive);
    assert_true(h.has_length);
    assert_int_equal(h.content_length, 12);
    assert_false(h.chunked);
    assert_true(h.expect_continue);
    assert_int_equal(h.n_headers, 5);
    assert_string_equal(head_get(&h, "content-length"), "12");
    assert_string_equal(head_get(&h, "X-EMPTY"), "");
    assert_string_equal(head_get(&h, "x-pad"), "padded value");
    assert_null(head_get(&h, "Origin"));
    /* a name of a present length but other letters, and one 64 bytes longer (the same bit of
     * the length mask), are absent */
    assert_null(head_get(&h, "x-paf"));
    assert_null(head_get(&h, "x-pad-----------------------------------------------------------"
                             "-----"));

    /* HTTP/1.0: keep-alive only when asked; no Host needed; no 100-continue. */
    assert_int_equal(
        parse("GET /health HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", copy, sizeof(copy), &h, &why),
        0);
    assert_int_equal(h.version_minor, 0);
    assert_false(h.keep_alive);
    assert_false(h.expect_continue);
    assert_null(h.query);
    assert_int_equal(parse("GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", copy,
                           sizeof(copy), &h, &why),
                     0);
    assert_true(h.keep_alive);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: x, close\r\n\r\n", copy,
                           sizeof(copy), &h, &why),
                     0);
    assert_false(h.keep_alive);

    /* chunked; absolute-form targets; OPTIONS * */
    assert_int_equal(parse("POST http://gw:8000/v1/completions?x HTTP/1.1\r\nHost: gw\r\n"
                           "Transfer-Encoding: Chunked\r\n\r\n",
                           copy, sizeof(copy), &h, &why),
                     0);
    assert_true(h.chunked);
    assert_string_equal(h.path, "/v1/completions");
    assert_string_equal(h.query, "x");
    assert_int_equal(
        parse("GET https://gw HTTP/1.1\r\nHost: gw\r\n\r\n", copy, sizeof(copy), &h, &why), 0);
    assert_string_equal(h.path, "/");
    assert_int_equal(parse("OPTIONS * HTTP/1.1\r\nHost: gw\r\n\r\n", copy, sizeof(copy), &h, &why),
                     0);
    assert_string_equal(h.path, "*");
}

static void test_refusals(void **state)
{
    static const struct {
        const char *text;
        int status;
    } cases[] = {
        {"GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400},             /* obs-fold */
        {"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400},   /* obs-fold */
        {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},             /* space before colon */
        {"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400},   /* no colon */
        {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n", 400}, /* control character */
        {"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400},        /* bare CR */
        {"GET / HTTP/1.1\r\n\r\n", 400},                         /* no Host */
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},   /* two Hosts */
        {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400},             /* double space */
        {"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400},             /* trailing space */
        {"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", 400},              /* method not a token */
        {"GET v1 HTTP/1.1\r\nHost: a\r\n\r\n", 400},             /* not origin-form */
        {"GET /%00x HTTP/1.1\r\nHost: a\r\n\r\n", 400},          /* decodes to NUL */
        /* escapes that would end an upstream request line once decoded */
        {"POST /v1/x%20HTTP/1.1%0d%0aHost:%20x%0d%0a%0d%0aPOST%20/v1/completions HTTP/1.1\r\n"
         "Host: a\r\n\r\n",
         400},
        {"GET /a%0Ab HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET /a%7f HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET / http/1.1\r\nHost: a\r\n\r\n", 400}, /* version is case-sensitive */
        {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
        {"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
         "Transfer-Encoding: chunked\r\n\r\n",
         400},
        {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char copy[512];
        pdgw_front_head_t h;
        const char *why = NULL;
        int st = parse(cases[i].text, copy, sizeof(copy), &h, &why);
        if (st != cases[i].status)
            fail_msg("case %zu: status %d, want %d", i, st, cases[i].status);
        assert_non_null(why);
    }
}

/* Values are scanned a word at a time: a control byte or DEL at every offset of a value of
 * every length around a word is refused; a tab there is taken. */
static void test_value_bytes_at_every_offset(void **state)
{
    static const struct {
        char c;
        int status;
    } bytes[] = {{'\x01', 400}, {'\x1f', 400}, {'\x7f', 400}, {'\t', 0}, {'~', 0}};
    (void)state;
    for (size_t len = 1; len <= 20; len++) {
        for (size_t at = 0; at < len; at++) {
            for (size_t k = 0; k < sizeof(bytes) / sizeof(bytes[0]); k++) {
                char text[128], copy[256], value[32];
                pdgw_front_head_t h;
                const char *why = NULL;
                for (size_t i = 0; i < len; i++)
                    value[i] = i == at ? bytes[k].c : (char)('a' + i % 26);
                /* a tab at either end is trimmed whitespace: keep it inside */
                if (bytes[k].c == '\t' && (at == 0 || at == len - 1))
                    continue;
                value[len] = '\0';
                snprintf(text, sizeof(text), "GET / HTTP/1.1\r\nHost: a\r\nX: %s\r\n\r\n", value);
                int st = parse(text, copy, sizeof(copy), &h, &why);
                if (st != bytes[k].status)
                    fail_msg("byte %#x at %zu of %zu: status %d, want %d", bytes[k].c, at, len, st,
                             bytes[k].status);
            }
        }
    }
}

static void test_too_many_fields(void **state)
{
    char text[8192], copy[8192];
    size_t n = 0;
    unsigned i;
    pdgw_front_head_t h;
    const char *why;
    (void)state;
    n += (size_t)snprintf(text + n, sizeof(text) - n, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (i = 1; i < PDGW_FRONT_MAX_HEADERS; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "X-%u: v\r\n", i);
    snprintf(text + n, sizeof(text) - n, "\r\n");
    assert_int_equal(parse(text, copy, sizeof(copy), &h, &why), 0);
    assert_int_equal(h.n_headers, PDGW_FRONT_MAX_HEADERS);
    snprintf(text + n, sizeof(text) - n, "X-last: v\r\n\r\n");
    assert_int_equal(parse(text, copy, sizeof(copy), &h, &why), 431);
}

typedef struct {
    char seen[256];
    size_t len;
    int stop_after;
} query_seen_t;

static bool on_arg(void *arg, const char *name, const char *value)
{
    query_seen_t *q = arg;
    q->len += (size_t)snprintf(q->seen + q->len, sizeof(q->seen) - q->len, "[%s=%s]", name,
                               value ? value : "(none)");
    return --q->stop_after != 0;
}

static void test_query_decoding(void **state)
{
    const char *query = "a=1&b&&c=x%20y+z&d%3D=%zz&e=";
    char scratch[64];
    query_seen_t q = {{0}, 0, -1};
    (void)state;
    pdgw_front_query_each(query, scratch, on_arg, &q);
    assert_string_equal(q.seen, "[a=1][b=(none)][c=x y z][d==%zz][e=]");
    q = (query_seen_t){{0}, 0, 2};
    pdgw_front_query_each(query, scratch, on_arg, &q);
    assert_string_equal(q.seen, "[a=1][b=(none)]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_end_at_every_cut),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_value_bytes_at_every_offset),
        cmocka_unit_test(test_too_many_fields),
        cmocka_unit_test(test_query_decoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
