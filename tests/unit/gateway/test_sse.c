/*
 * test_sse.c - the incremental SSE parser: events split at every possible byte boundary
 * (also inside CRLF pairs), comments, multi-line data, event names, [DONE], truncated
 * streams and the event size limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_sse.h"

#define MAX_EV 16

typedef struct collected {
    char raw[MAX_EV][256];
    char data[MAX_EV][256];
    char event[MAX_EV][64];
    int done[MAX_EV];
    int has_data[MAX_EV];
    int n;
    int stop_after; /* 0 = never */
} collected_t;

static int on_event(void *arg, const pdgw_sse_event_t *ev)
{
    collected_t *c = arg;
    assert_true(c->n < MAX_EV);
    assert_true(ev->raw_len < sizeof(c->raw[0]));
    memcpy(c->raw[c->n], ev->raw, ev->raw_len);
    c->raw[c->n][ev->raw_len] = '\0';
    assert_int_equal(strlen(ev->data), ev->data_len);
    snprintf(c->data[c->n], sizeof(c->data[0]), "%s", ev->data);
    snprintf(c->event[c->n], sizeof(c->event[0]), "%s", ev->event);
    c->done[c->n] = ev->is_done;
    c->has_data[c->n] = ev->has_data;
    c->n++;
    return c->stop_after && c->n >= c->stop_after;
}

/* A mix of everything: LF, CRLF, CR-only line ends, comments, multi-line data, event
 * names, a field without a colon, "data:" without space, and [DONE]. */
static const char STREAM[] = "data: {\"a\":1}\n\n"
                             ": keep-alive comment\n\n"
                             "event: message\r\ndata: line1\r\ndata: line2\r\n\r\n"
                             "data:nospace\r\rdata\n\n"
                             ": c\ndata: x\nid: 7\n\n"
                             "data: [DONE]\n\n";

static void check_stream(const collected_t *c)
{
    assert_int_equal(c->n, 5);
    assert_string_equal(c->raw[0], "data: {\"a\":1}\n\n");
    assert_string_equal(c->data[0], "{\"a\":1}");
    assert_false(c->done[0]);
    assert_string_equal(c->raw[1], "event: message\r\ndata: line1\r\ndata: line2\r\n\r\n");
    assert_string_equal(c->data[1], "line1\nline2");
    assert_string_equal(c->event[1], "message");
    assert_string_equal(c->raw[2], "data:nospace\r\r");
    assert_string_equal(c->data[2], "nospace");
    /* "data" without a colon is a data field with an empty value. */
    assert_string_equal(c->raw[3], "data\n\n");
    assert_string_equal(c->data[3], "");
    assert_true(c->has_data[3]);
    /* The event with a comment line, data and id passes through with its raw bytes. */
    assert_string_equal(c->raw[4], ": c\ndata: x\nid: 7\n\n");
    assert_string_equal(c->data[4], "x");
}

static void test_whole_buffer(void **state)
{
    pdgw_sse_t p;
    collected_t c;
    (void)state;
    memset(&c, 0, sizeof(c));
    pdgw_sse_init(&p);
    assert_int_equal(pdgw_sse_feed(&p, STREAM, sizeof(STREAM) - 1, on_event, &c), PDGW_OK);
    /* The last event is [DONE]. */
    assert_int_equal(c.n, 6);
    assert_true(c.done[5]);
    c.n = 5;
    check_stream(&c);
    assert_false(pdgw_sse_finish(&p, on_event, &c));
    pdgw_sse_free(&p);
}

static void test_every_split_point(void **state)
{
    size_t len = sizeof(STREAM) - 1;
    size_t i, j;
    (void)state;
    /* Two cuts at every pair of positions: three chunks of every shape. */
    for (i = 0; i <= len; i++) {
        for (j = i; j <= len; j += (j < i + 8 ? 1 : 7)) {
            pdgw_sse_t p;
            collected_t c;
            memset(&c, 0, sizeof(c));
            pdgw_sse_init(&p);
            assert_int_equal(pdgw_sse_feed(&p, STREAM, i, on_event, &c), PDGW_OK);
            assert_int_equal(pdgw_sse_feed(&p, STREAM + i, j - i, on_event, &c), PDGW_OK);
            assert_int_equal(pdgw_sse_feed(&p, STREAM + j, len - j, on_event, &c), PDGW_OK);
            assert_int_equal(c.n, 6);
            assert_true(c.done[5]);
            c.n = 5;
            check_stream(&c);
            assert_int_equal(pdgw_sse_pending(&p), 0);
            pdgw_sse_free(&p);
        }
    }
}

static void test_byte_by_byte(void **state)
{
    pdgw_sse_t p;
    collected_t c;
    size_t i;
    (void)state;
    memset(&c, 0, sizeof(c));
    pdgw_sse_init(&p);
    for (i = 0; i < sizeof(STREAM) - 1; i++)
        assert_int_equal(pdgw_sse_feed(&p, STREAM + i, 1, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 6);
    c.n = 5;
    check_stream(&c);
    pdgw_sse_free(&p);
}

static void test_truncated_stream(void **state)
{
    pdgw_sse_t p;
    collected_t c;
    static const char cut[] = "data: one\n\ndata: tw";
    (void)state;
    memset(&c, 0, sizeof(c));
    pdgw_sse_init(&p);
    assert_int_equal(pdgw_sse_feed(&p, cut, sizeof(cut) - 1, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 1);
    /* The partial second event is dropped and reported as a cut. */
    assert_true(pdgw_sse_finish(&p, on_event, &c));
    assert_int_equal(c.n, 1);
    /* A stream ending with a lone CR completes the line but not the event. */
    memset(&c, 0, sizeof(c));
    assert_int_equal(pdgw_sse_feed(&p, "data: a\r\r", 9, on_event, &c), PDGW_OK);
    /* "\r\r" at the end: the second CR may start a CRLF, so the event waits... */
    assert_true(pdgw_sse_finish(&p, on_event, &c) == false);
    /* ...and finish() completes it. */
    assert_int_equal(c.n, 1);
    assert_string_equal(c.data[0], "a");
    /* Only a comment left: not a cut. */
    assert_int_equal(pdgw_sse_feed(&p, ": ping", 6, on_event, &c), PDGW_OK);
    assert_false(pdgw_sse_finish(&p, on_event, &c));
    pdgw_sse_free(&p);
}

static void test_limit_and_stop(void **state)
{
    pdgw_sse_t p;
    collected_t c;
    char big[300];
    (void)state;
    memset(&c, 0, sizeof(c));
    pdgw_sse_init(&p);
    p.max_event = 100;
    memset(big, 'x', sizeof(big));
    memcpy(big, "data: ", 6);
    assert_int_equal(pdgw_sse_feed(&p, big, sizeof(big), on_event, &c), PDGW_ERR_TOO_LARGE);
    pdgw_sse_free(&p);

    /* The callback may stop: later events stay queued and come with the next feed. */
    memset(&c, 0, sizeof(c));
    c.stop_after = 1;
    pdgw_sse_init(&p);
    assert_int_equal(pdgw_sse_feed(&p, "data: 1\n\ndata: 2\n\n", 18, on_event, &c),
                     PDGW_ERR_CANCELLED);
    assert_int_equal(c.n, 1);
    c.stop_after = 0;
    assert_int_equal(pdgw_sse_feed(&p, NULL, 0, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 2);
    assert_string_equal(c.data[1], "2");
    pdgw_sse_free(&p);
}

/* Whole events are parsed where they lie; only an incomplete event is kept, and nothing is
 * held once it is handed out (thousands of parked streams). */
static void test_no_buffer_between_events(void **state)
{
    pdgw_sse_t p;
    collected_t c;
    (void)state;
    memset(&c, 0, sizeof(c));
    pdgw_sse_init(&p);
    assert_int_equal(pdgw_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 2);
    assert_int_equal(p.buf.cap, 0);
    assert_int_equal(p.data.cap, 0);
    /* an event cut after its first line: only its bytes stay */
    assert_int_equal(pdgw_sse_feed(&p, "data: c\n\nevent: e\ndata: d", 25, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 3);
    assert_int_equal(pdgw_sse_pending(&p), strlen("event: e\ndata: d"));
    assert_int_equal(pdgw_sse_feed(&p, "1\n\n", 3, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 4);
    assert_string_equal(c.raw[3], "event: e\ndata: d1\n\n");
    assert_string_equal(c.data[3], "d1");
    assert_int_equal(p.buf.cap, 0);
    assert_int_equal(p.data.cap, 0);
    /* a stop in a chunk parsed in place keeps the rest, raw bytes intact */
    c.stop_after = 5;
    assert_int_equal(pdgw_sse_feed(&p, "data: 5\n\ndata: 6\r\n\r\n", 20, on_event, &c),
                     PDGW_ERR_CANCELLED);
    assert_int_equal(c.n, 5);
    assert_int_equal(pdgw_sse_pending(&p), 11);
    c.stop_after = 0;
    assert_int_equal(pdgw_sse_feed(&p, NULL, 0, on_event, &c), PDGW_OK);
    assert_int_equal(c.n, 6);
    assert_string_equal(c.raw[5], "data: 6\r\n\r\n");
    assert_int_equal(p.buf.cap, 0);
    assert_false(pdgw_sse_finish(&p, on_event, &c));
    pdgw_sse_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_buffer),   cmocka_unit_test(test_every_split_point),
        cmocka_unit_test(test_byte_by_byte),   cmocka_unit_test(test_truncated_stream),
        cmocka_unit_test(test_limit_and_stop), cmocka_unit_test(test_no_buffer_between_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
