/*
 * test_util.c - pdgw_util (buffer, UUID, traceparent, parsers) and pdgw_alloc.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdgw_alloc.h"
#include "pdgw_util.h"

static void test_buf_basic(void **state)
{
    (void)state;
    pdgw_buf_t b = PDGW_BUF_INIT;
    assert_int_equal(pdgw_buf_append_str(&b, "hello"), PDGW_OK);
    assert_int_equal(pdgw_buf_appendf(&b, " %d %s", 42, "x"), PDGW_OK);
    assert_string_equal(b.data, "hello 42 x");
    assert_int_equal(b.len, 10);
    pdgw_buf_consume(&b, 6);
    assert_string_equal(b.data, "42 x");
    /* large formatted append goes through the slow path */
    char big[1000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(pdgw_buf_appendf(&b, "%s|", big), PDGW_OK);
    assert_int_equal(b.len, 4 + 999 + 1);
    assert_int_equal(b.data[b.len - 1], '|');
    assert_int_equal(b.data[b.len], '\0');
    pdgw_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_int_equal(pdgw_buf_append(&b, "a\"b\\c\n\x01", 7), PDGW_OK);
    assert_string_equal(b.data, "a\"b\\c\n\x01");
    size_t len;
    char *s = pdgw_buf_steal(&b, &len);
    assert_non_null(s);
    assert_int_equal(len, 7);
    assert_null(b.data);
    free(s);
    /* steal of an empty buffer gives "" */
    s = pdgw_buf_steal(&b, &len);
    assert_non_null(s);
    assert_string_equal(s, "");
    free(s);
    pdgw_buf_free(&b);
}

static void test_buf_limit_and_oom(void **state)
{
    (void)state;
    pdgw_buf_t b = PDGW_BUF_INIT;
    b.limit = 8;
    assert_int_equal(pdgw_buf_append_str(&b, "12345678"), PDGW_OK);
    assert_int_equal(pdgw_buf_append_str(&b, "9"), PDGW_ERR_TOO_LARGE);
    assert_string_equal(b.data, "12345678");
    pdgw_buf_free(&b);

    pdgw_alloc_fail_at(1, 0);
    assert_int_equal(pdgw_buf_append_str(&b, "x"), PDGW_ERR_NOMEM);
    assert_int_equal(b.len, 0);
    assert_int_equal(pdgw_buf_append_str(&b, "x"), PDGW_OK); /* only the 1st failed */
    assert_string_equal(b.data, "x");
    pdgw_buf_free(&b);

    pdgw_alloc_fail_at(1, 1); /* sticky */
    assert_null(pdgw_malloc(1));
    assert_null(pdgw_strdup("a"));
    pdgw_alloc_fail_at(0, 0);
    char *p = pdgw_strdup("abc");
    assert_string_equal(p, "abc");
    pdgw_free(p);
}

static void test_uuid(void **state)
{
    (void)state;
    char a[PDGW_UUID_STR_LEN + 1], b[PDGW_UUID_STR_LEN + 1];
    for (int i = 0; i < 200; i++) {
        assert_int_equal(pdgw_uuid4(a), PDGW_OK);
        assert_int_equal(strlen(a), 36);
        assert_true(pdgw_uuid_is_valid(a, 36));
        assert_int_equal(a[8], '-');
        assert_int_equal(a[13], '-');
        assert_int_equal(a[14], '4');
        assert_non_null(strchr("89ab", a[19]));
        for (int k = 0; k < 36; k++)
            assert_true(a[k] == '-' || (a[k] >= '0' && a[k] <= '9') ||
                        (a[k] >= 'a' && a[k] <= 'f'));
    }
    assert_int_equal(pdgw_uuid4(b), PDGW_OK);
    assert_string_not_equal(a, b);
    assert_false(pdgw_uuid_is_valid("not-a-uuid", 10));
    assert_false(pdgw_uuid_is_valid("123e4567-e89b-12d3-a456-42661417400g", 36));
    assert_true(pdgw_uuid_is_valid("123e4567-e89b-12d3-a456-426614174000", 36));

    assert_true(pdgw_request_id_is_valid("abc-123_x.y:z", 13));
    assert_false(pdgw_request_id_is_valid("", 0));
    assert_false(pdgw_request_id_is_valid("a b", 3));
    assert_false(pdgw_request_id_is_valid("a\r\nX-Evil: 1", 13));
    char longid[200];
    memset(longid, 'a', sizeof(longid));
    assert_false(pdgw_request_id_is_valid(longid, 129));
    assert_true(pdgw_request_id_is_valid(longid, 128));
}

static void test_random_pool(void **state)
{
    (void)state;
    /* many small draws: all distinct (pool refills) */
    uint8_t prev[16] = {0}, cur[16];
    for (int i = 0; i < 500; i++) {
        assert_int_equal(pdgw_random_bytes(cur, sizeof(cur)), PDGW_OK);
        assert_memory_not_equal(prev, cur, sizeof(cur));
        memcpy(prev, cur, sizeof(cur));
    }
    uint8_t big[4096];
    assert_int_equal(pdgw_random_bytes(big, sizeof(big)), PDGW_OK);
    /* a forked child must not replay the parent's pooled bytes */
    assert_int_equal(pdgw_random_bytes(cur, 8), PDGW_OK); /* pool is warm */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t child[16];
        pdgw_random_bytes(child, sizeof(child));
        ssize_t w = write(fds[1], child, sizeof(child));
        _exit(w == (ssize_t)sizeof(child) ? 0 : 1);
    }
    uint8_t mine[16], theirs[16];
    assert_int_equal(pdgw_random_bytes(mine, sizeof(mine)), PDGW_OK);
    assert_int_equal(read(fds[0], theirs, sizeof(theirs)), (ssize_t)sizeof(theirs));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_memory_not_equal(mine, theirs, sizeof(mine));
    close(fds[0]);
    close(fds[1]);
}

static void test_traceparent(void **state)
{
    (void)state;
    const char *good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    pdgw_traceparent_t tp;
    assert_int_equal(pdgw_traceparent_parse(good, strlen(good), &tp), PDGW_OK);
    assert_int_equal(tp.version, 0);
    assert_int_equal(tp.trace_id[0], 0x4b);
    assert_int_equal(tp.trace_id[15], 0x36);
    assert_int_equal(tp.parent_id[0], 0x00);
    assert_int_equal(tp.parent_id[7], 0xb7);
    assert_int_equal(tp.flags, 1);
    char out[PDGW_TRACEPARENT_LEN + 1];
    pdgw_traceparent_format(&tp, out);
    assert_string_equal(out, good);

    /* surrounding blanks are tolerated; future versions may append fields */
    const char *padded = "  00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ";
    assert_int_equal(pdgw_traceparent_parse(padded, strlen(padded), &tp), PDGW_OK);
    assert_int_equal(tp.flags, 0);
    const char *v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
    assert_int_equal(pdgw_traceparent_parse(v1, strlen(v1), &tp), PDGW_OK);
    assert_int_equal(tp.version, 1);

    static const char *const bad[] = {
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",    /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", /* v00 with extra */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* version ff */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   /* zero span id */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   /* uppercase */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* separator */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   /* non-hex */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  /* v01 junk */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdgw_traceparent_t keep = {.version = 0x77};
        assert_int_equal(pdgw_traceparent_parse(bad[i], strlen(bad[i]), &keep), PDGW_ERR_PARSE);
        assert_int_equal(keep.version, 0x77); /* untouched on error */
    }

    pdgw_traceparent_t root, child;
    assert_int_equal(pdgw_traceparent_new(&root), PDGW_OK);
    assert_int_equal(root.flags, 1);
    assert_int_equal(pdgw_traceparent_child(&root, &child), PDGW_OK);
    assert_memory_equal(root.trace_id, child.trace_id, 16);
    assert_memory_not_equal(root.parent_id, child.parent_id, 8);
    pdgw_traceparent_format(&child, out);
    assert_int_equal(strlen(out), 55);
    pdgw_traceparent_t back;
    assert_int_equal(pdgw_traceparent_parse(out, 55, &back), PDGW_OK);
    assert_memory_equal(&back.trace_id, child.trace_id, 16);
    /* a child of a v01 parent is written as v00 */
    assert_int_equal(pdgw_traceparent_parse(v1, strlen(v1), &tp), PDGW_OK);
    assert_int_equal(pdgw_traceparent_child(&tp, &child), PDGW_OK);
    pdgw_traceparent_format(&child, out);
    assert_memory_equal(out, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36);
}

static void test_duration(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t ms;
    } ok[] = {{"500ms", 500}, {"30s", 30000}, {"2m", 120000},    {"1h", 3600000}, {"5", 5000},
              {"0.25", 250},  {"1.5s", 1500}, {" 10 s ", 10000}, {"0", 0},        {"0ms", 0}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t ms = 999999;
        assert_int_equal(pdgw_duration_parse(ok[i].in, &ms), PDGW_OK);
        assert_int_equal(ms, ok[i].ms);
    }
    static const char *const bad[] = {"", "abc", "-1s", "5x", "1.s", ".5", "5 m s", "1e3", "1,5s",
                                      "99999999999999999999h",
                                      /* found by fuzz_header_values: above 2^63 ms llround
                                       * overflowed into a garbage deadline */
                                      "10000000000000000000ms", "9300000000000000s"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t ms = 7;
        assert_int_equal(pdgw_duration_parse(bad[i], &ms), PDGW_ERR_PARSE);
        assert_int_equal(ms, 7);
    }
    char out[32];
    pdgw_duration_format(500, out, sizeof(out));
    assert_string_equal(out, "500ms");
    pdgw_duration_format(30000, out, sizeof(out));
    assert_string_equal(out, "30s");
    pdgw_duration_format(120000, out, sizeof(out));
    assert_string_equal(out, "2m");
    pdgw_duration_format(7200000, out, sizeof(out));
    assert_string_equal(out, "2h");
    pdgw_duration_format(1500, out, sizeof(out));
    assert_string_equal(out, "1500ms");
    pdgw_duration_format(0, out, sizeof(out));
    assert_string_equal(out, "0s");
}

static void test_size(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t b;
    } ok[] = {{"16777216", 16777216},
              {"16MiB", 16777216},
              {"16 MiB", 16777216},
              {"1KiB", 1024},
              {"1kb", 1000},
              {"2G", 2000000000},
              {"1.5MiB", 1572864},
              {"0", 0},
              {"10B", 10},
              {"1TiB", 1099511627776ull}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t b = 1;
        assert_int_equal(pdgw_size_parse(ok[i].in, &b), PDGW_OK);
        assert_int_equal(b, ok[i].b);
    }
    static const char *const bad[] = {"", "MiB", "-1", "1.5", "12XB", "1 2", "0x10"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t b = 3;
        assert_int_not_equal(pdgw_size_parse(bad[i], &b), PDGW_OK);
        assert_int_equal(b, 3);
    }
    uint64_t b;
    assert_int_equal(pdgw_size_parse("99999999999999999999999", &b), PDGW_ERR_TOO_LARGE);
    char out[32];
    pdgw_size_format(16777216, out, sizeof(out));
    assert_string_equal(out, "16MiB");
    pdgw_size_format(1000, out, sizeof(out));
    assert_string_equal(out, "1000");
}

static void test_numbers(void **state)
{
    (void)state;
    int64_t v;
    assert_int_equal(pdgw_int_parse(" 42 ", 0, 100, &v), PDGW_OK);
    assert_int_equal(v, 42);
    assert_int_equal(pdgw_int_parse("-3", -5, 5, &v), PDGW_OK);
    assert_int_equal(v, -3);
    assert_int_equal(pdgw_int_parse("101", 0, 100, &v), PDGW_ERR_INVALID);
    assert_int_equal(pdgw_int_parse("4x", 0, 100, &v), PDGW_ERR_PARSE);
    assert_int_equal(pdgw_int_parse("", 0, 100, &v), PDGW_ERR_PARSE);
    assert_int_equal(pdgw_int_parse("99999999999999999999", 0, INT64_MAX, &v), PDGW_ERR_INVALID);
    bool b;
    assert_int_equal(pdgw_bool_parse("Yes", &b), PDGW_OK);
    assert_true(b);
    assert_int_equal(pdgw_bool_parse("off", &b), PDGW_OK);
    assert_false(b);
    assert_int_equal(pdgw_bool_parse("maybe", &b), PDGW_ERR_PARSE);
}

static void test_hostport_url(void **state)
{
    (void)state;
    char host[64];
    int port;
    assert_int_equal(pdgw_hostport_parse("0.0.0.0:8000", false, host, sizeof(host), &port),
                     PDGW_OK);
    assert_string_equal(host, "0.0.0.0");
    assert_int_equal(port, 8000);
    assert_int_equal(pdgw_hostport_parse("[::1]:9", false, host, sizeof(host), &port), PDGW_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 9);
    assert_int_equal(pdgw_hostport_parse(":80", false, host, sizeof(host), &port), PDGW_OK);
    assert_string_equal(host, "");
    assert_int_equal(pdgw_hostport_parse("h:0", true, host, sizeof(host), &port), PDGW_OK);
    assert_int_equal(pdgw_hostport_parse("h:0", false, host, sizeof(host), &port),
                     PDGW_ERR_INVALID);
    assert_int_equal(pdgw_hostport_parse("h:65536", false, host, sizeof(host), &port),
                     PDGW_ERR_INVALID);
    static const char *const bad[] = {"host", "::1:80",  "h:",    "h:x",
                                      "h:-1", "[::1]80", "a b:1", "h: 80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(pdgw_hostport_parse(bad[i], false, host, sizeof(host), &port),
                         PDGW_ERR_PARSE);

    pdgw_url_t u;
    assert_int_equal(pdgw_url_parse("http://127.0.0.1:8100", &u), PDGW_OK);
    assert_string_equal(u.scheme, "http");
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8100);
    assert_string_equal(u.path, "");
    assert_int_equal(pdgw_url_parse("https://engine.local/v1", &u), PDGW_OK);
    assert_int_equal(u.port, 443);
    assert_string_equal(u.path, "/v1");
    assert_int_equal(pdgw_url_parse("http://[fe80::1]:8000/", &u), PDGW_OK);
    assert_string_equal(u.host, "fe80::1");
    assert_int_equal(u.port, 8000);
    assert_int_equal(pdgw_url_parse("http://[fe80::1]", &u), PDGW_OK);
    assert_int_equal(u.port, 80);
    static const char *const badu[] = {"127.0.0.1:8100", "ftp://x",      "http://",
                                       "http://:80",     "http://u@h:1", "http://h:99999",
                                       "http://h:x"};
    for (size_t i = 0; i < sizeof(badu) / sizeof(badu[0]); i++)
        assert_int_equal(pdgw_url_parse(badu[i], &u), PDGW_ERR_PARSE);
}

static void test_time(void **state)
{
    (void)state;
    uint64_t a = pdgw_time_mono_ns();
    uint64_t b = pdgw_time_mono_ns();
    assert_true(b >= a);
    assert_true(pdgw_time_mono_ms() >= a / 1000000u);
    char ts[40];
    size_t n = pdgw_time_format_rfc3339(1700000000123456789ull, ts, sizeof(ts));
    assert_int_equal(n, 24);
    assert_string_equal(ts, "2023-11-14T22:13:20.123Z");
    assert_true(pdgw_time_ns_to_sec(1500000000ull) == 1.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_basic),    cmocka_unit_test(test_buf_limit_and_oom),
        cmocka_unit_test(test_uuid),         cmocka_unit_test(test_random_pool),
        cmocka_unit_test(test_traceparent),  cmocka_unit_test(test_duration),
        cmocka_unit_test(test_size),         cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_hostport_url), cmocka_unit_test(test_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
