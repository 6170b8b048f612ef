/*
 * test_path.c - the routing path and the upstream target built from it (pdgw_path.c).
 *
 * What a user relies on: a path routes as it reads once decoded, but no decoded byte can end
 * an upstream request line (CR, LF, SP, any control byte), "%2F" and "%3F" reach the engine as
 * they came (a decoded '/' would move a segment boundary, a decoded '?' start a query), a ".."
 * segment is refused as nginx refuses one, and a path longer than the routing buffer is 414,
 * never cut and forwarded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_path.h"

/* The routing path of <raw> in a 256-byte buffer; the status. */
static int clean(const char *raw, char *out)
{
    const char *why = NULL;
    int st = pdgw_path_clean(raw, out, 256, &why);
    if (st != 0)
        assert_non_null(why);
    return st;
}

/* The upstream target of the routing path of <raw> (owned). */
static char *target_of(const char *raw)
{
    char path[256];
    pdgw_buf_t out = PDGW_BUF_INIT;
    size_t len;
    assert_int_equal(clean(raw, path), 0);
    assert_int_equal(pdgw_path_encode(&out, path), PDGW_OK);
    assert_int_equal(pdgw_buf_append_char(&out, '\0'), PDGW_OK);
    return pdgw_buf_steal(&out, &len);
}

static void test_decodes_for_routing(void **state)
{
    char p[256];
    (void)state;
    assert_int_equal(clean("/v1/chat/completions", p), 0);
    assert_string_equal(p, "/v1/chat/completions");
    assert_int_equal(clean("/v1/%63hat/completions", p), 0);
    assert_string_equal(p, "/v1/chat/completions");
    /* the escapes that change a path's meaning stay as they came */
    assert_int_equal(clean("/v1/chat%2Fcompletions", p), 0);
    assert_string_equal(p, "/v1/chat%2Fcompletions");
    assert_int_equal(clean("/v1/a%3fb%25c", p), 0);
    assert_string_equal(p, "/v1/a%3fb%25c");
    /* a '%' that starts no escape is one */
    assert_int_equal(clean("/v1/100%", p), 0);
    assert_string_equal(p, "/v1/100%25");
    assert_int_equal(clean("/v1/%%32%46", p), 0); /* '%' '2' 'F', not an escape of '/' */
    assert_string_equal(p, "/v1/%252F");
    /* a raw '?' (the front ends split the query off first) is the escape it goes up as */
    assert_int_equal(clean("/v1/a?b", p), 0);
    assert_string_equal(p, "/v1/a%3Fb");
    assert_int_equal(clean("*", p), 0);
    assert_string_equal(p, "*");
}

static void test_refuses_what_ends_a_request_line(void **state)
{
    char p[256];
    (void)state;
    /* the smuggling request: a second request line, headers and all, in escapes */
    assert_int_equal(clean("/v1/x%20HTTP/1.1%0d%0aHost:%20x%0d%0aContent-Length:%200%0d%0a%0d%0a"
                           "POST%20/v1/completions",
                           p),
                     400);
    assert_int_equal(clean("/v1/a%20b", p), 400);
    assert_int_equal(clean("/v1/a%0Ab", p), 400);
    assert_int_equal(clean("/v1/a%0db", p), 400);
    assert_int_equal(clean("/v1/a%00b", p), 400);
    assert_int_equal(clean("/v1/a%09b", p), 400);
    assert_int_equal(clean("/v1/a%7Fb", p), 400);
    assert_int_equal(clean("/v1/a b", p), 400); /* a raw space (libmicrohttpd lets one in) */
    assert_int_equal(clean("/v1/a\tb", p), 400);
}

static void test_refuses_dot_dot(void **state)
{
    char p[256];
    (void)state;
    assert_int_equal(clean("/v1/../admin/reload", p), 400);
    assert_int_equal(clean("/v1/%2E%2E/admin", p), 400);
    assert_int_equal(clean("/v1/.%2e", p), 400);
    assert_int_equal(clean("/v1%2F..%2Fadmin", p), 400); /* a segment between kept %2F */
    assert_int_equal(clean("/v1/a%2f..", p), 400);
    assert_int_equal(clean("/..", p), 400);
    /* dots that are no ".." segment */
    assert_int_equal(clean("/v1/a..b/...", p), 0);
    assert_int_equal(clean("/v1/./x", p), 0);
}

static void test_too_long_is_414(void **state)
{
    char raw[400], p[256], small[8];
    const char *why;
    (void)state;
    memset(raw, 'a', sizeof(raw) - 1);
    raw[0] = '/';
    raw[sizeof(raw) - 1] = '\0';
    assert_int_equal(clean(raw, p), 414); /* 399 bytes into 256 */
    raw[256] = '\0';
    assert_int_equal(clean(raw, p), 414); /* 256 bytes and the NUL do not fit */
    raw[255] = '\0';
    assert_int_equal(clean(raw, p), 0); /* 255 and the NUL: exactly 256 */
    assert_int_equal(strlen(p), 255);
    /* a kept escape that would not fit whole */
    assert_int_equal(pdgw_path_clean("/%2F", small, 4, &why), 414);
    assert_int_equal(pdgw_path_clean("/%2F", small, 5, &why), 0);
    assert_string_equal(small, "/%2F");
}

static void test_upstream_target(void **state)
{
    char *t;
    (void)state;
    t = target_of("/v1/embeddings");
    assert_string_equal(t, "/v1/embeddings");
    free(t);
    t = target_of("/v1/files/a%2Fb%3Fc%25d"); /* kept as they came */
    assert_string_equal(t, "/v1/files/a%2Fb%3Fc%25d");
    free(t);
    t = target_of("/v1/files/%e2%82%ac%22%3C%5c"); /* decoded, then encoded again */
    assert_string_equal(t, "/v1/files/%E2%82%AC%22%3C%5C");
    free(t);
    t = target_of("/v1/a:b@c!$&'()*+,;=-._~"); /* pchar passes as it is */
    assert_string_equal(t, "/v1/a:b@c!$&'()*+,;=-._~");
    free(t);
    t = target_of("/v1/100%");
    assert_string_equal(t, "/v1/100%25");
    free(t);
}

/* Whatever the client sends, a target that is built holds no byte that ends a line. */
static void test_target_never_breaks_the_line(void **state)
{
    unsigned c;
    (void)state;
    for (c = 1; c < 256; c++) {
        char raw[16], path[256];
        const char *why;
        pdgw_buf_t out = PDGW_BUF_INIT;
        size_t i;
        snprintf(raw, sizeof(raw), "/v1/%%%02X%c", c, (char)(c == '%' ? 'x' : c));
        if (pdgw_path_clean(raw, path, sizeof(path), &why) != 0)
            continue;
        assert_int_equal(pdgw_path_encode(&out, path), PDGW_OK);
        for (i = 0; i < out.len; i++)
            assert_true((unsigned char)out.data[i] > 0x20 && out.data[i] != 0x7f);
        pdgw_buf_free(&out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decodes_for_routing),
        cmocka_unit_test(test_refuses_what_ends_a_request_line),
        cmocka_unit_test(test_refuses_dot_dot),
        cmocka_unit_test(test_too_long_is_414),
        cmocka_unit_test(test_upstream_target),
        cmocka_unit_test(test_target_never_breaks_the_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
