/*
 * test_log.c - text and JSON log lines, escaping, levels, truncation, access log, and
 * whole lines under concurrent writers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_log.h"
#include "pdgw_util.h"

typedef struct capture {
    char lines[64][20000];
    size_t n;
    size_t total; /* lines seen, including those not stored */
} capture_t;

static capture_t cap;

static void sink(void *ctx, pdgw_log_level_t level, const char *line, size_t len)
{
    capture_t *c = ctx;
    (void)level;
    if (c->n < 64 && len < sizeof(c->lines[0])) {
        memcpy(c->lines[c->n], line, len);
        c->lines[c->n][len] = '\0';
        c->n++;
    }
    c->total++;
}

static int setup(void **state)
{
    (void)state;
    memset(&cap, 0, sizeof(cap));
    pdgw_log_set_sink(sink, &cap);
    pdgw_log_init(PDGW_LOG_LEVEL_INFO, PDGW_LOG_FORMAT_TEXT, -1);
    pdgw_log_set_access(true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pdgw_log_set_sink(NULL, NULL);
    pdgw_log_init(PDGW_LOG_LEVEL_INFO, PDGW_LOG_FORMAT_TEXT, -1);
    return 0;
}

static void test_text(void **state)
{
    (void)state;
    pdgw_log_debug("x", "hidden %d", 1);
    pdgw_log_info("worker", "hello %s", "world");
    pdgw_log_warn(NULL, "multi\nline\r\n");
    pdgw_log_write_req(PDGW_LOG_LEVEL_ERROR, "upstream", "req-1", "failed: %d", 502);
    assert_int_equal(cap.n, 3);
    /* 2026-11-21T10:00:00.123Z INFO  [worker] hello world */
    assert_int_equal(strlen(cap.lines[0]) > 24, 1);
    assert_int_equal(cap.lines[0][23], 'Z');
    assert_string_equal(cap.lines[0] + 24, " INFO  [worker] hello world\n");
    assert_string_equal(cap.lines[1] + 24, " WARN  multi\\nline\n");
    assert_string_equal(cap.lines[2] + 24, " ERROR [upstream] req=req-1 failed: 502\n");

    pdgw_log_set_level(PDGW_LOG_LEVEL_DEBUG);
    assert_true(pdgw_log_enabled(PDGW_LOG_LEVEL_DEBUG));
    pdgw_log_debug("x", "shown");
    assert_int_equal(cap.n, 4);
    pdgw_log_set_level(PDGW_LOG_LEVEL_ERROR);
    pdgw_log_warn("x", "hidden");
    assert_int_equal(cap.n, 4);

    pdgw_log_level_t lv;
    assert_int_equal(pdgw_log_level_parse("WARN", &lv), PDGW_OK);
    assert_int_equal(lv, PDGW_LOG_LEVEL_WARN);
    assert_int_equal(pdgw_log_level_parse("loud", &lv), PDGW_ERR_PARSE);
    assert_string_equal(pdgw_log_level_name(PDGW_LOG_LEVEL_DEBUG), "debug");
}

static json_t *parse_line(const char *line)
{
    size_t len = strlen(line);
    assert_true(len > 0 && line[len - 1] == '\n');
    assert_null(memchr(line, '\n', len - 1)); /* exactly one line */
    json_error_t e;
    json_t *j = json_loadb(line, len - 1, 0, &e);
    if (j == NULL)
        fail_msg("not JSON (%s): %s", e.text, line);
    return j;
}

static void test_json(void **state)
{
    (void)state;
    pdgw_log_set_format(PDGW_LOG_FORMAT_JSON);
    pdgw_log_info("cfg", "quote \" backslash \\ tab\t ctl \x01 nl\n utf8 \xc3\xa9");
    pdgw_log_write_req(PDGW_LOG_LEVEL_WARN, "w", "id\"1", "m");
    assert_int_equal(cap.n, 2);
    json_t *j = parse_line(cap.lines[0]);
    assert_string_equal(json_string_value(json_object_get(j, "level")), "info");
    assert_string_equal(json_string_value(json_object_get(j, "component")), "cfg");
    assert_string_equal(json_string_value(json_object_get(j, "msg")),
                        "quote \" backslash \\ tab\t ctl \x01 nl\n utf8 \xc3\xa9");
    assert_int_equal(strlen(json_string_value(json_object_get(j, "ts"))), 24);
    json_decref(j);
    j = parse_line(cap.lines[1]);
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), "id\"1");
    assert_string_equal(json_string_value(json_object_get(j, "level")), "warn");
    json_decref(j);
    /* broken UTF-8 (e.g. echoed from a client) becomes U+FFFD, the line stays valid JSON */
    pdgw_log_info("x", "bad \xff\xc3 end");
    j = parse_line(cap.lines[2]);
    assert_string_equal(json_string_value(json_object_get(j, "msg")),
                        "bad \xef\xbf\xbd\xef\xbf\xbd end");
    json_decref(j);
}

static void test_truncation(void **state)
{
    (void)state;
    /* An 8 KiB message of characters that double when escaped overflows the line. */
    char *msg = malloc(9000);
    for (int variant = 0; variant < 4; variant++) {
        for (int i = 0; i < 8999; i++)
            msg[i] = variant == 0 ? '"' : variant == 1 ? 'a' : variant == 2 ? '\x01' : 'b';
        msg[8999] = '\0';
        if (variant == 3) { /* multi-byte UTF-8 across the cut */
            for (int i = 0; i + 1 < 8999; i += 2) {
                msg[i] = '\xc3';
                msg[i + 1] = '\xa9';
            }
        }
        memset(&cap, 0, sizeof(cap));
        pdgw_log_set_format(PDGW_LOG_FORMAT_JSON);
        pdgw_log_info("t", "%s", msg);
        assert_int_equal(cap.n, 1);
        json_t *j = parse_line(cap.lines[0]);
        const char *m = json_string_value(json_object_get(j, "msg"));
        assert_non_null(m);
        assert_true(strlen(m) > 1000);
        json_decref(j);
    }
    free(msg);
}

static void test_access(void **state)
{
    (void)state;
    pdgw_access_entry_t e;
    pdgw_access_entry_init(&e);
    e.request_id = "abc";
    e.method = "POST";
    e.path = "/v1/chat/completions";
    e.protocol = "vllm-kvt";
    e.model = "my model";
    e.prefill_instance = "p0";
    e.decode_instance = "d1";
    e.status = 200;
    e.retries = 1;
    e.stream = true;
    e.total_us = 12345;
    e.ttft_us = 2000;
    e.prefill_us = 1500;
    e.decode_us = 10000;
    e.bytes_in = 100;
    e.bytes_out = 2048;
    e.prompt_tokens = 7;
    pdgw_log_set_level(PDGW_LOG_LEVEL_ERROR); /* access lines ignore the level */
    pdgw_access_log(&e);
    assert_int_equal(cap.n, 1);
    assert_string_equal(cap.lines[0] + 24,
                        " INFO  access id=abc method=POST path=/v1/chat/completions "
                        "protocol=vllm-kvt model=\"my model\" prefill=p0 decode=d1 status=200 "
                        "retries=1 stream=1 total_ms=12.345 ttft_ms=2.000 prefill_ms=1.500 "
                        "decode_ms=10.000 bytes_in=100 bytes_out=2048 prompt_tokens=7\n");

    pdgw_log_set_format(PDGW_LOG_FORMAT_JSON);
    e.error = "upstream \"reset\"";
    e.client_disconnected = true;
    e.pd_phase = "kv_transfer";
    e.pd_retryable = 0;
    e.decode_instance = NULL;
    pdgw_access_log(&e);
    assert_int_equal(cap.n, 2);
    json_t *j = parse_line(cap.lines[1]);
    assert_string_equal(json_string_value(json_object_get(j, "type")), "access");
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), "abc");
    assert_string_equal(json_string_value(json_object_get(j, "decode")), "-");
    assert_int_equal(json_integer_value(json_object_get(j, "status")), 200);
    assert_true(json_number_value(json_object_get(j, "total_ms")) == 12.345);
    assert_null(json_object_get(j, "kv_ms"));
    assert_true(json_is_true(json_object_get(j, "stream")));
    assert_true(json_is_true(json_object_get(j, "disconnected")));
    assert_string_equal(json_string_value(json_object_get(j, "error")), "upstream \"reset\"");
    assert_string_equal(json_string_value(json_object_get(j, "pd_phase")), "kv_transfer");
    assert_true(json_is_false(json_object_get(j, "pd_retryable")));
    json_decref(j);

    pdgw_log_set_access(false);
    pdgw_access_log(&e);
    assert_int_equal(cap.n, 2);
}

static void vwrap(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pdgw_log_vwrite(PDGW_LOG_LEVEL_WARN, "sched", fmt, ap);
    va_end(ap);
}

static void test_vwrite(void **state)
{
    (void)state;
    vwrap("instance %s left", "d1");
    assert_int_equal(cap.n, 1);
    assert_string_equal(cap.lines[0] + 24, " WARN  [sched] instance d1 left\n");
}

static void test_ratelimit(void **state)
{
    (void)state;
    pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
    uint64_t skipped = 99;
    /* A window far longer than the test, so no stall of a busy machine ends it early. */
    assert_true(pdgw_log_ratelimit_allow(&rl, 600000, &skipped));
    assert_int_equal(skipped, 0);
    for (int i = 0; i < 10; i++)
        assert_false(pdgw_log_ratelimit_allow(&rl, 600000, &skipped));
    /* The window ends once the monotonic clock reaches next_ms: move it there instead
     * of sleeping the window out. */
    atomic_store(&rl.next_ms, pdgw_time_mono_ms());
    assert_true(pdgw_log_ratelimit_allow(&rl, 600000, &skipped));
    assert_int_equal(skipped, 10);
    assert_false(pdgw_log_ratelimit_allow(&rl, 600000, NULL));
}

#define WRITERS 4
#define LINES   500

static void *writer(void *arg)
{
    long id = (long)arg;
    for (int i = 0; i < LINES; i++)
        pdgw_log_info("w", "writer %ld line %d %s", id, i,
                      "payload-payload-payload-payload-payload-payload-payload");
    return NULL;
}

static void test_threads_fd(void **state)
{
    (void)state;
    /* Real fd output: every line must arrive whole through a pipe. */
    pdgw_log_set_sink(NULL, NULL);
    int p[2];
    assert_int_equal(pipe(p), 0);
    char path[] = "/tmp/pdgw_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(p[0]);
    close(p[1]);
    pdgw_log_init(PDGW_LOG_LEVEL_INFO, PDGW_LOG_FORMAT_JSON, fd);
    pthread_t th[WRITERS];
    for (long i = 0; i < WRITERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, writer, (void *)i), 0);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);
    pdgw_log_init(PDGW_LOG_LEVEL_INFO, PDGW_LOG_FORMAT_TEXT, 2);
    FILE *f = fdopen(fd, "r");
    assert_non_null(f);
    rewind(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        json_t *j = parse_line(line);
        assert_non_null(strstr(json_string_value(json_object_get(j, "msg")), "payload"));
        json_decref(j);
        n++;
    }
    assert_int_equal(n, WRITERS * LINES);
    fclose(f);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_access, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vwrite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ratelimit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_fd, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
