/*
 * test_breaker.c -- per-peer circuit breaker with a fake clock: a tripped
 * peer is skipped until its TTL passes, then resumes; other peers are not
 * affected; the open gauge and counters follow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "kvt/kvt_breaker.h"

static uint64_t fake_now;

static uint64_t fake_clock(void *arg)
{
    return fake_now;
}

static const kvt_clock_t clk = {fake_clock, NULL};

static void test_skip_then_resume(void **state)
{
    kvt_breaker_t *b;
    kvt_breaker_stats_t st;
    uint64_t rem;

    fake_now = 1000 * KVT_NSEC_PER_SEC;
    assert_int_equal(kvt_breaker_create(2.0, &clk, &b), KVT_OK);
    assert_int_equal(kvt_breaker_check(b, "decode-0", &rem), KVT_OK);
    assert_int_equal(rem, 0);

    assert_int_equal(kvt_breaker_trip(b, "decode-0"), KVT_OK);
    assert_int_equal(kvt_breaker_check(b, "decode-0", &rem), KVT_ERR_BACKOFF);
    assert_true(rem == 2 * KVT_NSEC_PER_SEC);
    assert_int_equal(kvt_breaker_check(b, "decode-1", NULL), KVT_OK); /* other peers fine */

    fake_now += 1999 * KVT_NSEC_PER_MSEC;
    assert_int_equal(kvt_breaker_check(b, "decode-0", &rem), KVT_ERR_BACKOFF);
    assert_true(rem == KVT_NSEC_PER_MSEC);
    kvt_breaker_stats(b, &st);
    assert_int_equal(st.open_peers, 1);
    assert_int_equal(st.skips_total, 2);
    assert_int_equal(st.trips_total, 1);

    fake_now += KVT_NSEC_PER_MSEC; /* exactly at the TTL: resumes */
    assert_int_equal(kvt_breaker_check(b, "decode-0", &rem), KVT_OK);
    assert_int_equal(rem, 0);
    kvt_breaker_stats(b, &st);
    assert_int_equal(st.open_peers, 0);
    assert_int_equal(st.resumes_total, 1);
    kvt_breaker_destroy(b);
}

static void test_retrip_extends_and_reset(void **state)
{
    kvt_breaker_t *b;
    kvt_breaker_stats_t st;

    fake_now = 5 * KVT_NSEC_PER_SEC;
    assert_int_equal(kvt_breaker_create(1.0, &clk, &b), KVT_OK);
    kvt_breaker_trip(b, "p");
    fake_now += 800 * KVT_NSEC_PER_MSEC;
    kvt_breaker_trip(b, "p"); /* still failing: the window restarts */
    fake_now += 800 * KVT_NSEC_PER_MSEC;
    assert_int_equal(kvt_breaker_check(b, "p", NULL), KVT_ERR_BACKOFF);
    kvt_breaker_reset(b, "p");
    assert_int_equal(kvt_breaker_check(b, "p", NULL), KVT_OK);

    /* the gauge prunes expired peers even if nobody checks them */
    kvt_breaker_trip(b, "q");
    kvt_breaker_trip(b, "r");
    kvt_breaker_stats(b, &st);
    assert_int_equal(st.open_peers, 2);
    fake_now += 2 * KVT_NSEC_PER_SEC;
    kvt_breaker_stats(b, &st);
    assert_int_equal(st.open_peers, 0);
    kvt_breaker_destroy(b);
}

static void test_disabled_and_invalid(void **state)
{
    kvt_breaker_t *b;

    assert_int_equal(kvt_breaker_create(-1.0, &clk, &b), KVT_ERR_INVALID);
    assert_int_equal(kvt_breaker_create(0.0, &clk, &b), KVT_OK);
    kvt_breaker_trip(b, "p");
    assert_int_equal(kvt_breaker_check(b, "p", NULL), KVT_OK);
    assert_int_equal(kvt_breaker_check(b, NULL, NULL), KVT_ERR_INVALID);
    kvt_breaker_destroy(b);

    /* the real clock works too */
    assert_int_equal(kvt_breaker_create(60.0, NULL, &b), KVT_OK);
    kvt_breaker_trip(b, "p");
    assert_int_equal(kvt_breaker_check(b, "p", NULL), KVT_ERR_BACKOFF);
    kvt_breaker_destroy(b);
}

static void test_many_peers(void **state)
{
    kvt_breaker_t *b;
    kvt_breaker_stats_t st;
    char name[32];

    fake_now = 0;
    assert_int_equal(kvt_breaker_create(1.0, &clk, &b), KVT_OK);
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof(name), "peer-%d", i);
        if (i % 2 == 0)
            kvt_breaker_trip(b, name);
    }
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof(name), "peer-%d", i);
        assert_int_equal(kvt_breaker_check(b, name, NULL), i % 2 == 0 ? KVT_ERR_BACKOFF : KVT_OK);
    }
    kvt_breaker_stats(b, &st);
    assert_int_equal(st.open_peers, 500);
    kvt_breaker_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_then_resume),
        cmocka_unit_test(test_retrip_extends_and_reset),
        cmocka_unit_test(test_disabled_and_invalid),
        cmocka_unit_test(test_many_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
