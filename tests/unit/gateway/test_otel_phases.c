/*
 * test_otel_phases.c - the phase spans a traced request gets (queue, prefill, kv_transfer,
 * decode): each lies inside the request span, and a leg whose millisecond loop-turn time reads
 * earlier than its request's own start still gets its phases (the turn's time is read before
 * its events, the request's start when its bytes are read).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_otel.c"

/* An exporter whose queue the test reads (no thread: nothing is sent). */
static pdgw_otel_t *queue_only(void)
{
    pdgw_otel_t *o = pdgw_calloc(1, sizeof(*o));
    assert_non_null(o);
    o->cfg.sample_ratio = 1.0;
    o->cfg.parent_based = true;
    o->cfg.max_queue_spans = 16;
    o->cfg.max_batch_spans = 16;
    o->ring = pdgw_calloc(16, sizeof(otel_span_t));
    assert_non_null(o->ring);
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->cond, NULL);
    return o;
}

static void queue_free(pdgw_otel_t *o)
{
    pthread_cond_destroy(&o->cond);
    pthread_mutex_destroy(&o->lock);
    pdgw_free(o->ring);
    pdgw_free(o);
}

static const otel_span_t *span_named(const pdgw_otel_t *o, const char *name)
{
    for (size_t i = 0; i < o->count; i++)
        if (strcmp(o->ring[i].name, name) == 0)
            return &o->ring[i];
    return NULL;
}

static void test_phases_inside_the_request(void **state)
{
    const uint64_t ms = 1000000u, t0 = 5000 * ms + 700000; /* a request read 0.7 ms into a ms */
    pdgw_traceparent_t tp = {.flags = 1};                  /* sampled */
    pdgw_otel_t *o = queue_only();
    pdgw_otel_request_t req = {
        .span = &tp,
        .method = "POST",
        .path = "/v1/completions",
        .protocol = "vllm-kvt",
        .status = 200,
        .start_ns = t0,
        .end_ns = t0 + 90 * ms,
        /* the prefill leg started in the same loop turn, whose time was read 3 ms earlier
         * (a slow turn): its millisecond time is before the request's start */
        .first_leg_ns = t0 - 3 * ms - 700000,
        .prefill_start_ns = t0 - 3 * ms - 700000,
        .prefill_end_ns = t0 + 20 * ms,
        .decode_start_ns = t0 + 20 * ms,
        .decode_first_ns = t0 + 60 * ms,
        .decode_end_ns = t0 + 89 * ms,
    };
    const otel_span_t *root, *q, *p, *kv, *d;
    (void)state;
    memset(tp.trace_id, 0xab, sizeof(tp.trace_id));
    memset(tp.parent_id, 0xcd, sizeof(tp.parent_id));
    pdgw_otel_record(o, &req);
    assert_int_equal(o->count, 5);
    root = &o->ring[0];
    q = span_named(o, "queue");
    p = span_named(o, "prefill");
    kv = span_named(o, "kv_transfer");
    d = span_named(o, "decode");
    assert_non_null(q);
    assert_non_null(p);
    assert_non_null(kv);
    assert_non_null(d);
    /* every phase inside the request span */
    for (const otel_span_t *s = &o->ring[1]; s < &o->ring[5]; s++) {
        assert_true(s->start_unix_ns >= root->start_unix_ns);
        assert_true(s->end_unix_ns <= root->end_unix_ns);
        assert_true(s->start_unix_ns <= s->end_unix_ns);
        assert_memory_equal(s->parent_id, root->span_id, 8);
    }
    assert_true(q->start_unix_ns == q->end_unix_ns); /* the leg started at once */
    assert_true(p->end_unix_ns - p->start_unix_ns == 20 * ms);
    assert_true(kv->end_unix_ns - kv->start_unix_ns == 40 * ms);
    queue_free(o);
}

static void test_inverted_phase_left_out(void **state)
{
    const uint64_t ms = 1000000u, t0 = 9000 * ms;
    pdgw_traceparent_t tp = {.flags = 1}; /* sampled */
    pdgw_otel_t *o = queue_only();
    /* parallel legs: the decode's first byte came before the prefill ended, so there is no
     * kv_transfer phase between them */
    pdgw_otel_request_t req = {.span = &tp,
                               .status = 200,
                               .start_ns = t0,
                               .end_ns = t0 + 50 * ms,
                               .first_leg_ns = t0,
                               .prefill_start_ns = t0,
                               .prefill_end_ns = t0 + 40 * ms,
                               .decode_start_ns = t0,
                               .decode_first_ns = t0 + 10 * ms,
                               .decode_end_ns = t0 + 45 * ms};
    (void)state;
    pdgw_otel_record(o, &req);
    assert_int_equal(o->count, 4);
    assert_null(span_named(o, "kv_transfer"));
    assert_non_null(span_named(o, "queue"));
    queue_free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phases_inside_the_request),
        cmocka_unit_test(test_inverted_phase_left_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
