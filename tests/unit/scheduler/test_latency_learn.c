/*
 * Latency models learnt through bookings (scheduler/src/sched_booking.c): the timings a leg
 * finishes with teach its instance's models, against what was queued and running on it
 * when it was booked. Two prefills of one fleet, one 2.5x slower than the other (the test's
 * own law; the scheduler is never told), end up predicted in that ratio; a failed or
 * untimed leg teaches nothing; what is booked on an instance now lengthens its predicted
 * time to first token.
 */
#include <math.h>

#include "sched_test_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

/* Seconds to the first token for <n> prompt tokens with <queued> booked ahead. */
static double law_ttft(uint32_t n, uint64_t queued, double speed)
{
    return (0.025 + 0.0003 * n + 0.0002 * (double)queued) / speed;
}

static double law_tpot(uint32_t running)
{
    return 0.010 + 0.001 * running;
}

/* Book one request, finish both legs with the law's timings (the prefill's from whichever
 * instance was chosen); <outcome> for both legs. */
static void one_request(sched_pool_t *pool, uint32_t prompt, sched_outcome_t outcome, bool timed)
{
    sched_request_t req = {.prompt_tokens = prompt, .max_tokens = 64};
    sched_booking_t *b = NULL;
    sched_result_t r = {.outcome = outcome};
    sched_instance_t *p;
    double speed;

    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    p = sched_booking_instance(b, SCHED_LEG_PREFILL);
    speed = strcmp(sched_instance_id(p), "p-slow") == 0 ? 0.4 : 1.0;
    if (timed)
        r.first_token_s = law_ttft(prompt, 0, speed);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
    r.first_token_s = timed ? 0.004 : 0.0;
    r.later_tokens = timed ? 63 : 0;
    r.later_tokens_s = 63 * law_tpot(1);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
    sched_booking_destroy(&b);
}

static sched_pool_t *fleet(void)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    test_add(pool, "p-fast", 9001, SCHED_ROLE_PREFILL, NULL, 1);
    test_add(pool, "p-slow", 9002, SCHED_ROLE_PREFILL, NULL, 1);
    test_add(pool, "d", 9003, SCHED_ROLE_DECODE, NULL, 1);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

static void test_slow_instance_predicted_slow(void **s)
{
    sched_pool_t *pool = fleet();
    sched_prediction_t fast, slow, tpot;
    (void)s;
    for (int i = 0; i < 200; i++)
        one_request(pool, 200 + (uint32_t)(uniform() * 3800), SCHED_OUTCOME_SUCCESS, true);
    sched_instance_predict_ttft(test_inst(pool, "p-fast"), 2000, &fast);
    sched_instance_predict_ttft(test_inst(pool, "p-slow"), 2000, &slow);
    assert_true(fast.observed >= 90 && slow.observed >= 90); /* round-robin: half each */
    assert_true(fabs(fast.mean - law_ttft(2000, 0, 1.0)) / law_ttft(2000, 0, 1.0) < 0.05);
    assert_true(fabs(slow.mean / fast.mean - 2.5) < 0.25);
    sched_instance_predict_tpot(test_inst(pool, "d"), 0, &tpot);
    assert_true(tpot.observed >= 190);
    assert_true(fabs(tpot.mean - law_tpot(1)) / law_tpot(1) < 0.1);
    sched_pool_destroy(pool);
}

static void test_failed_or_untimed_legs_teach_nothing(void **s)
{
    sched_pool_t *pool = fleet();
    sched_prediction_t p;
    (void)s;
    for (int i = 0; i < 20; i++) {
        one_request(pool, 1000, SCHED_OUTCOME_SERVER_ERROR, true);
        one_request(pool, 1000, SCHED_OUTCOME_CANCELLED, true);
        one_request(pool, 1000, SCHED_OUTCOME_SUCCESS, false);
    }
    sched_instance_predict_ttft(test_inst(pool, "p-fast"), 1000, &p);
    assert_int_equal(p.observed, 0);
    sched_instance_predict_tpot(test_inst(pool, "d"), 0, &p);
    assert_int_equal(p.observed, 0);
    sched_pool_destroy(pool);
}

/* Learnt with work queued ahead: a prefill with 8k prompt tokens booked on it now is
 * predicted slower than with none, by about what the law says. */
static void test_queued_work_lengthens_the_prediction(void **s)
{
    sched_pool_t *pool = fleet();
    sched_booking_t *held[4] = {NULL};
    sched_prediction_t idle, busy;
    (void)s;
    /* learn with queues of 0..12k tokens: book k requests first, time the last */
    for (int i = 0; i < 300; i++) {
        sched_request_t req = {.prompt_tokens = 500 + (uint32_t)(uniform() * 2500),
                               .max_tokens = 16};
        sched_booking_t *b = NULL;
        sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
        uint64_t queued;
        sched_instance_t *p;
        assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
        p = sched_booking_instance(b, SCHED_LEG_PREFILL);
        queued = atomic_load(&p->prompt_tokens) - req.prompt_tokens; /* booked ahead of it */
        r.first_token_s =
            law_ttft(req.prompt_tokens, queued, strcmp(sched_instance_id(p), "p-slow") ? 1.0 : 0.4);
        if (i % 5 != 4) { /* keep up to four booked: the queue of the next */
            for (int k = 0; k < 4; k++) {
                if (!held[k]) {
                    held[k] = b;
                    b = NULL;
                    break;
                }
            }
        }
        if (b) {
            assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
            sched_booking_destroy(&b);
        }
        if (i % 5 == 4) {
            for (int k = 0; k < 4; k++) /* untimed: only the queue they made was the point */
                sched_booking_destroy(&held[k]);
        }
    }
    for (int k = 0; k < 4; k++)
        sched_booking_destroy(&held[k]);
    sched_instance_predict_ttft(test_inst(pool, "p-fast"), 1000, &idle);
    atomic_fetch_add(&test_inst(pool, "p-fast")->prompt_tokens, 8000);
    sched_instance_predict_ttft(test_inst(pool, "p-fast"), 1000, &busy);
    atomic_fetch_sub(&test_inst(pool, "p-fast")->prompt_tokens, 8000);
    assert_true(fabs((busy.mean - idle.mean) - 0.0002 * 8000) < 0.4 * 0.0002 * 8000);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_instance_predicted_slow),
        cmocka_unit_test(test_failed_or_untimed_legs_teach_nothing),
        cmocka_unit_test(test_queued_work_lengthens_the_prediction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
