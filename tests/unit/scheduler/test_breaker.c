/* Circuit breaker state machine and overload back-off (manual clock). */
#include "sched_test_util.h"

static sched_pool_t *breaker_pool(void)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;

    test_config(&cfg, SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    cfg.breaker_failures = 3;
    cfg.breaker_open_ms = 10000;
    cfg.overload_penalty_ms = 5000;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    test_add(pool, "d0", 9000, SCHED_ROLE_DECODE, "", 4);
    return pool;
}

/* Book d0 (the only decode) and finish it with <outcome>. */
static sched_status_t run_once(sched_pool_t *pool, sched_outcome_t outcome, int http)
{
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_result_t r = {.outcome = outcome, .http_status = http, .detail = "test"};
    sched_status_t st = sched_book_decode(pool, &req, &b);

    if (st != SCHED_OK)
        return st;
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
    sched_booking_destroy(&b);
    return SCHED_OK;
}

static void test_opens_after_n_failures(void **state)
{
    sched_pool_t *pool = breaker_pool();
    sched_instance_t *d0 = test_inst(pool, "d0");

    (void)state;
    assert_int_equal(run_once(pool, SCHED_OUTCOME_CONNECT_ERROR, 0), SCHED_OK);
    assert_int_equal(run_once(pool, SCHED_OUTCOME_SERVER_ERROR, 500), SCHED_OK);
    /* a success in between resets the count */
    assert_int_equal(run_once(pool, SCHED_OUTCOME_SUCCESS, 200), SCHED_OK);
    assert_int_equal(run_once(pool, SCHED_OUTCOME_TRANSFER_ERROR, 0), SCHED_OK);
    assert_int_equal(run_once(pool, SCHED_OUTCOME_SERVER_ERROR, 502), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_CLOSED);
    /* client errors and cancellations are not the instance's fault */
    assert_int_equal(run_once(pool, SCHED_OUTCOME_CANCELLED, 0), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_CLOSED);
    assert_int_equal(run_once(pool, SCHED_OUTCOME_CONNECT_ERROR, 0), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_OPEN);
    assert_int_equal(run_once(pool, SCHED_OUTCOME_SUCCESS, 200), SCHED_ERR_NO_INSTANCE);
    assert_false(sched_pool_ready(pool, SCHED_ROLE_DECODE));
    sched_pool_destroy(pool);
}

static void test_half_open_single_probe(void **state)
{
    sched_pool_t *pool = breaker_pool();
    sched_instance_t *d0 = test_inst(pool, "d0");
    sched_request_t req = {0};
    sched_booking_t *probe = NULL, *other = NULL;
    sched_result_t fail = {.outcome = SCHED_OUTCOME_CONNECT_ERROR};
    const char *le;
    json_t *j;

    (void)state;
    for (int i = 0; i < 3; i++)
        assert_int_equal(run_once(pool, SCHED_OUTCOME_CONNECT_ERROR, 0), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_OPEN);
    j = sched_admin_get(pool, "d0");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "breaker"), "state")),
                        "open");
    le = json_string_value(json_object_get(j, "last_error"));
    assert_non_null(le); /* NULL under an injected allocation failure: never to strstr */
    assert_non_null(strstr(le, "connect_error"));
    json_decref(j);

    test_advance(9999);
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_ERR_NO_INSTANCE);
    test_advance(1);
    /* exactly one booking gets the probe slot */
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_OK);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_HALF_OPEN);
    assert_int_equal(sched_book_decode(pool, &req, &other), SCHED_ERR_NO_INSTANCE);
    /* probe fails → open again for a full period */
    assert_int_equal(sched_booking_finish(probe, SCHED_LEG_DECODE, &fail), SCHED_OK);
    sched_booking_destroy(&probe);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_OPEN);
    test_advance(5000);
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_ERR_NO_INSTANCE);
    test_advance(5000);
    /* a cancelled probe gives the slot back */
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_OK);
    sched_booking_destroy(&probe);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_OPEN);
    /* probe succeeds → closed, everyone may book */
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_OK);
    assert_int_equal(sched_booking_finish(probe, SCHED_LEG_DECODE, NULL), SCHED_OK);
    sched_booking_destroy(&probe);
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_CLOSED);
    assert_int_equal(sched_book_decode(pool, &req, &probe), SCHED_OK);
    assert_int_equal(sched_book_decode(pool, &req, &other), SCHED_OK);
    sched_booking_destroy(&probe);
    sched_booking_destroy(&other);
    sched_pool_destroy(pool);
}

static void test_overload_lowers_weight_not_breaker(void **state)
{
    sched_pool_t *pool = breaker_pool();
    sched_instance_t *d0 = test_inst(pool, "d0");
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_result_t busy = {.outcome = SCHED_OUTCOME_OVERLOADED, .http_status = 503};
    sched_result_t retry_after = {
        .outcome = SCHED_OUTCOME_OVERLOADED, .http_status = 429, .retry_after_ms = 20000};
    uint64_t now;

    (void)state;
    assert_int_equal(sched_outcome_from_http(429), SCHED_OUTCOME_OVERLOADED);
    assert_int_equal(sched_outcome_from_http(503), SCHED_OUTCOME_OVERLOADED);
    assert_int_equal(sched_outcome_from_http(500), SCHED_OUTCOME_SERVER_ERROR);
    assert_int_equal(sched_outcome_from_http(404), SCHED_OUTCOME_CLIENT_ERROR);
    assert_int_equal(sched_outcome_from_http(0), SCHED_OUTCOME_CONNECT_ERROR);
    assert_int_equal(sched_outcome_from_http(200), SCHED_OUTCOME_SUCCESS);

    now = test_now_ms;
    assert_int_equal(sched_instance_effective_weight(d0, now), 4 * 1024);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &busy), SCHED_OK);
        sched_booking_destroy(&b);
        if (i == 0)
            assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 2 * 1024);
        if (i == 1)
            assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 1024);
    }
    /* never opened, still selectable, weight cut to 1/16 at most */
    assert_int_equal(sched_instance_breaker_state(d0), SCHED_BREAKER_CLOSED);
    assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 4 * 1024 / 16);
    assert_int_equal(sched_pool_usable_count(pool, SCHED_ROLE_DECODE), 1);
    /* the penalty ends after overload_penalty_ms */
    test_advance(5001);
    assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 4 * 1024);
    /* Retry-After sets the span */
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &retry_after), SCHED_OK);
    sched_booking_destroy(&b);
    test_advance(19000);
    assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 2 * 1024);
    test_advance(1001);
    assert_int_equal(sched_instance_effective_weight(d0, test_now_ms), 4 * 1024);
    sched_pool_destroy(pool);
}

/* An overloaded instance loses least-load picks to an idle peer even if
 * it is idle too. */
static void test_overload_shifts_least_load(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_result_t busy = {.outcome = SCHED_OUTCOME_OVERLOADED, .http_status = 429};

    (void)state;
    test_add(pool, "a", 9000, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "b", 9001, SCHED_ROLE_DECODE, "", 1);
    do {
        sched_booking_destroy(&b);
        assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    } while (strcmp(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "a") != 0);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &busy), SCHED_OK);
    sched_booking_destroy(&b);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
        assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "b");
        sched_booking_destroy(&b);
    }
    sched_pool_destroy(pool);
}

/* Prefill and decode outcomes land on their own instances. */
static void test_outcomes_per_leg(void **state)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    sched_result_t fail = {.outcome = SCHED_OUTCOME_SERVER_ERROR, .http_status = 500};

    (void)state;
    test_config(&cfg, SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    cfg.breaker_failures = 2;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    test_add(pool, "p", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "d", 9001, SCHED_ROLE_DECODE, "", 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, NULL), SCHED_OK);
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &fail), SCHED_OK);
        sched_booking_destroy(&b);
    }
    assert_int_equal(sched_instance_breaker_state(test_inst(pool, "p")), SCHED_BREAKER_CLOSED);
    assert_int_equal(sched_instance_breaker_state(test_inst(pool, "d")), SCHED_BREAKER_OPEN);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opens_after_n_failures),
        cmocka_unit_test(test_half_open_single_probe),
        cmocka_unit_test(test_overload_lowers_weight_not_breaker),
        cmocka_unit_test(test_overload_shifts_least_load),
        cmocka_unit_test(test_outcomes_per_leg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
