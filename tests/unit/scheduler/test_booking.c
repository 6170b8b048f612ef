/* Bookings: batch revert, exactly-once release, retries, concurrency, removal while held. */
#include <pthread.h>

#include "sched_test_util.h"

static uint32_t inflight(sched_pool_t *pool, const char *id)
{
    return sched_instance_inflight(test_inst(pool, id));
}

static void test_batch_reverts_prefill(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {.prompt_tokens = 500, .max_tokens = 10};
    sched_booking_t *b = NULL;
    sched_instance_t *p;

    (void)state;
    test_add(pool, "p", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "d", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_pool_drain(pool, "d"), SCHED_OK);
    p = test_inst(pool, "p");
    /* prefill is available, decode is not: nothing stays booked */
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_ERR_NO_INSTANCE);
    assert_null(b);
    assert_int_equal(inflight(pool, "p"), 0);
    assert_int_equal(atomic_load(&p->prompt_tokens), 0);

    /* a half-open prefill whose pair fails gets its probe slot back */
    sched_gate_set_breaker(p, UINT32_MAX, SCHED_BREAKER_OPEN);
    atomic_store(&p->breaker_until_ms, test_now_ms);
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_ERR_NO_INSTANCE);
    assert_int_equal(sched_instance_breaker_state(p), SCHED_BREAKER_OPEN);
    assert_int_equal(sched_pool_undrain(pool, "d"), SCHED_OK);
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(p), SCHED_BREAKER_HALF_OPEN);
    sched_booking_destroy(&b);
    assert_int_equal(sched_pool_double_releases(pool), 0);
    sched_pool_destroy(pool);
}

static void test_exactly_once_error_and_cancel(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {.prompt_tokens = 100, .max_tokens = 100};
    sched_result_t err = {.outcome = SCHED_OUTCOME_SERVER_ERROR, .http_status = 500};
    sched_booking_t *b = NULL;
    sched_instance_t *d;
    char *text;

    (void)state;
    test_add(pool, "p", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "d", 9001, SCHED_ROLE_DECODE, "", 1);
    d = test_inst(pool, "d");

    /* error path: finish both, destroy must not release again */
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    assert_int_equal(inflight(pool, "p"), 1);
    assert_int_equal(inflight(pool, "d"), 1);
    assert_int_equal(atomic_load(&d->kv_tokens), 200);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, NULL), SCHED_OK);
    assert_int_equal(inflight(pool, "p"), 0);
    assert_true(sched_booking_leg_open(b, SCHED_LEG_DECODE));
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &err), SCHED_OK);
    assert_false(sched_booking_leg_open(b, SCHED_LEG_DECODE));
    /* a second finish is refused and counted, load untouched */
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &err), SCHED_ERR_ALREADY_RELEASED);
    assert_int_equal(sched_pool_double_releases(pool), 1);
    assert_int_equal(inflight(pool, "d"), 0);
    assert_int_equal(atomic_load(&d->kv_tokens), 0);
    sched_booking_destroy(&b);
    assert_null(b);
    sched_booking_destroy(&b); /* no-op through the NULLed pointer */
    assert_int_equal(inflight(pool, "d"), 0);

    /* cancel path: destroy releases every open leg once, no breaker judgement */
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    sched_booking_destroy(&b);
    assert_int_equal(inflight(pool, "p"), 0);
    assert_int_equal(inflight(pool, "d"), 0);
    assert_int_equal(sched_pool_double_releases(pool), 1);

    /* staged booking that never got its decode leg */
    assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
    assert_null(sched_booking_instance(b, SCHED_LEG_DECODE));
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, NULL), SCHED_ERR_STATE);
    sched_booking_destroy(&b);
    assert_int_equal(inflight(pool, "p"), 0);

    text = sched_metrics_text(pool);
    assert_non_null(strstr(text, "pdgw_sched_double_release_total 1\n"));
    free(text);
    sched_pool_destroy(pool);
}

static void test_rebook_excludes_failed(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    sched_request_t req = {0};
    sched_result_t fail = {.outcome = SCHED_OUTCOME_CONNECT_ERROR, .detail = "refused"};
    sched_booking_t *b = NULL;
    sched_instance_t *first, *second;

    (void)state;
    test_add(pool, "d0", 9000, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "d1", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    first = sched_booking_instance(b, SCHED_LEG_DECODE);
    assert_int_equal(sched_booking_rebook(b, SCHED_LEG_DECODE), SCHED_ERR_STATE); /* still open */
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &fail), SCHED_OK);
    for (int i = 0; i < 2; i++) {
        /* round-robin would come back to the failed one: exclusion wins */
        assert_int_equal(sched_booking_rebook(b, SCHED_LEG_DECODE), SCHED_OK);
        second = sched_booking_instance(b, SCHED_LEG_DECODE);
        assert_ptr_not_equal(first, second);
        assert_int_equal(sched_instance_inflight(first), 0);
        assert_int_equal(sched_instance_inflight(second), 1);
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &fail), SCHED_OK);
        /* both failed now: nothing left */
        assert_int_equal(sched_booking_rebook(b, SCHED_LEG_DECODE), SCHED_ERR_NO_INSTANCE);
        assert_null(NULL);
        break;
    }
    sched_booking_destroy(&b);
    assert_int_equal(inflight(pool, "d0"), 0);
    assert_int_equal(inflight(pool, "d1"), 0);
    sched_pool_destroy(pool);
}

static void test_removed_while_booked(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_instance_t *d;

    (void)state;
    test_add(pool, "d", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    d = sched_booking_instance(b, SCHED_LEG_DECODE);
    assert_int_equal(sched_pool_remove(pool, "d"), SCHED_OK);
    assert_int_equal(sched_pool_remove(pool, "d"), SCHED_ERR_NOT_FOUND);
    assert_int_equal(sched_pool_size(pool), 0);
    /* still readable through the booking's reference */
    assert_string_equal(sched_instance_desc(d)->url, "http://127.0.0.1:9001");
    assert_int_equal(sched_instance_inflight(d), 1);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, NULL), SCHED_OK);
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

static void test_retire_when_idle(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_instance_desc_t d;
    char err[128];

    (void)state;
    test_add(pool, "d", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_int_equal(sched_pool_retire(pool, "d"), SCHED_OK);
    assert_int_equal(sched_instance_state(test_inst(pool, "d")), SCHED_STATE_DRAINING);
    assert_int_equal(sched_pool_poll(pool, 0), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), 1); /* busy: stays */
    sched_booking_destroy(&b);
    /* upsert of the same descriptor cancels the retirement */
    sched_instance_desc_init(&d);
    d.id = "d";
    d.url = "http://127.0.0.1:9001";
    d.role = SCHED_ROLE_DECODE;
    assert_int_equal(sched_pool_upsert(pool, &d, err, sizeof(err)), SCHED_OK);
    assert_int_equal(sched_instance_state(test_inst(pool, "d")), SCHED_STATE_UP);
    assert_int_equal(sched_pool_poll(pool, 0), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), 1);
    assert_int_equal(sched_pool_retire(pool, "d"), SCHED_OK);
    assert_int_equal(sched_pool_poll(pool, 0), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), 0); /* idle: removed */
    sched_pool_destroy(pool);
}

/* ---- concurrency -------------------------------------------------- */

typedef struct worker_arg {
    sched_pool_t *pool;
    int iterations;
    int failures;
} worker_arg_t;

static void *worker(void *p)
{
    worker_arg_t *a = p;
    sched_request_t req = {.prompt_tokens = 64, .max_tokens = 32};
    sched_result_t err = {.outcome = SCHED_OUTCOME_TRANSFER_ERROR};

    for (int i = 0; i < a->iterations; i++) {
        sched_booking_t *b = NULL;
        if (sched_book_pd(a->pool, &req, &b) != SCHED_OK) {
            a->failures++;
            continue;
        }
        switch (i % 3) {
        case 0: /* success */
            sched_booking_finish(b, SCHED_LEG_PREFILL, NULL);
            sched_booking_finish(b, SCHED_LEG_DECODE, NULL);
            break;
        case 1: /* error on decode, then a racing second finish */
            sched_booking_finish(b, SCHED_LEG_PREFILL, NULL);
            sched_booking_finish(b, SCHED_LEG_DECODE, &err);
            sched_booking_finish(b, SCHED_LEG_DECODE, &err);
            break;
        default: /* cancel */
            break;
        }
        sched_booking_destroy(&b);
    }
    return NULL;
}

static void *churn(void *p)
{
    worker_arg_t *a = p;

    /* no cmocka asserts off the main thread: count failures instead */
    for (int i = 0; i < a->iterations; i++) {
        char id[32], url[64], err[128];
        sched_instance_desc_t d;
        snprintf(id, sizeof(id), "extra%d", (i / 2) % 4);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9500 + (i / 2) % 4);
        sched_instance_desc_init(&d);
        d.id = id;
        d.url = url;
        if (i % 2 == 0) {
            if (sched_pool_add(a->pool, &d, err, sizeof(err)) != SCHED_OK)
                a->failures++;
        } else if (sched_pool_remove(a->pool, id) != SCHED_OK) {
            a->failures++;
        }
        sched_pool_drain(a->pool, "d1");
        sched_pool_undrain(a->pool, "d1");
    }
    return NULL;
}

static void test_concurrent_picks(void **state)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;
    pthread_t th[5];
    worker_arg_t args[5];

    (void)state;
    test_config(&cfg, SCHED_POLICY_POWER_OF_TWO, SCHED_POLICY_LEAST_LOAD);
    cfg.breaker_failures = 1000000; /* keep everyone selectable */
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof(id), "p%d", i);
        test_add(pool, id, 9000 + i, SCHED_ROLE_PREFILL, "", 1);
        snprintf(id, sizeof(id), "d%d", i);
        test_add(pool, id, 9100 + i, SCHED_ROLE_DECODE, "", 1);
    }
    for (int t = 0; t < 5; t++) {
        args[t].pool = pool;
        args[t].iterations = t == 4 ? 200 : 3000;
        args[t].failures = 0;
        assert_int_equal(pthread_create(&th[t], NULL, t == 4 ? churn : worker, &args[t]), 0);
    }
    for (int t = 0; t < 5; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 5; t++)
        assert_int_equal(args[t].failures, 0);
    /* every booking was released exactly once */
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof(id), "p%d", i);
        assert_int_equal(inflight(pool, id), 0);
        assert_int_equal(atomic_load(&test_inst(pool, id)->prompt_tokens), 0);
        snprintf(id, sizeof(id), "d%d", i);
        assert_int_equal(inflight(pool, id), 0);
        assert_int_equal(atomic_load(&test_inst(pool, id)->kv_tokens), 0);
    }
    /* only the deliberate second finishes were refused */
    assert_int_equal(sched_pool_double_releases(pool), 4 * 1000);
    sched_pool_destroy(pool);
}

static void test_alloc_failures_unwind(void **state)
{
    sched_pool_t *pool = NULL;
    sched_config_t cfg;
    sched_request_t req = {.text = "hello world, a prompt long enough for one block or two of "
                                   "text to be hashed by the prefix-aware policy",
                           .text_len = 120};
    int ok = 0;

    (void)state;
    test_config(&cfg, SCHED_POLICY_PREFIX_AWARE, SCHED_POLICY_PREFIX_AWARE);
    /* every allocation site of create/add/book fails once, nothing leaks */
    for (long n = 0; n < 60; n++) {
        sched_booking_t *b = NULL;
        sched_instance_desc_t d;
        char err[128];
        sched_alloc_fail_after(n);
        if (sched_pool_create(&cfg, &pool) != SCHED_OK) {
            sched_alloc_fail_after(-1);
            continue;
        }
        sched_instance_desc_init(&d);
        d.url = "http://127.0.0.1:9000";
        if (sched_pool_add(pool, &d, err, sizeof(err)) == SCHED_OK &&
            sched_book_pd(pool, &req, &b) == SCHED_OK) {
            ok++;
            sched_booking_destroy(&b);
        }
        sched_alloc_fail_after(-1);
        assert_int_equal(sched_pool_size(pool) <= 1, 1);
        sched_pool_destroy(pool);
    }
    assert_true(ok > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_reverts_prefill),
        cmocka_unit_test(test_exactly_once_error_and_cancel),
        cmocka_unit_test(test_rebook_excludes_failed),
        cmocka_unit_test(test_removed_while_booked),
        cmocka_unit_test(test_retire_when_idle),
        cmocka_unit_test(test_concurrent_picks),
        cmocka_unit_test(test_alloc_failures_unwind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
