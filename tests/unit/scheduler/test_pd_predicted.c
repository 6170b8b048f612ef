/*
 * Selective PD by prediction (sched_booking_predict_pd, sched_booking_decode_only in
 * scheduler/src/sched_booking.c). A PD decode leg's first token teaches its instance the KV
 * handoff, not a prefill; a decode-only leg teaches the decode its own prefill. With the
 * prefill's answers, the handoff and the decode's TPOT learnt from the test's own laws (the
 * scheduler is never told them), a short prompt behind a queued prefill is predicted sooner
 * decode-only, a long one on an idle prefill is not, and the stall it would put on the
 * decode's running requests grows with the prompt.
 */
#include <math.h>

#include "sched_test_util.h"

/* The test's engines: a prefill answers in 30 ms + 0.4 ms per token once the prompts before
 * it are done; the decode's first token after the handoff comes 6 ms + 3 ms per kToken of
 * KV later; it then emits a token every 12 ms. */
static double law_prefill(uint32_t n)
{
    return 0.030 + 0.0004 * n;
}
static double law_handoff(uint32_t n)
{
    return 0.006 + 0.003 * n * 1e-3;
}
#define LAW_TPOT 0.012

static sched_pool_t *fleet(void)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    test_add(pool, "p", 9001, SCHED_ROLE_PREFILL, NULL, 1);
    test_add(pool, "d", 9002, SCHED_ROLE_DECODE, NULL, 1);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

/* One PD request on idle engines, finished with the laws' timings. */
static void pd_request(sched_pool_t *pool, uint32_t prompt)
{
    sched_request_t req = {.prompt_tokens = prompt, .max_tokens = 32};
    sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
    sched_booking_t *b = NULL;

    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    r.first_token_s = law_prefill(prompt);
    test_advance((uint64_t)(r.first_token_s * 1000.0));
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
    r.first_token_s = law_handoff(prompt);
    r.later_tokens = 31;
    r.later_tokens_s = 31 * LAW_TPOT;
    test_advance((uint64_t)((r.first_token_s + r.later_tokens_s) * 1000.0));
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
    sched_booking_destroy(&b);
    test_advance(2000);
}

static void train(sched_pool_t *pool)
{
    for (int i = 0; i < 80; i++)
        pd_request(pool, 100 + (uint32_t)(i % 8) * 250);
}

static void test_cold_predicts_nothing(void **s)
{
    sched_pool_t *pool = fleet();
    sched_request_t req = {.prompt_tokens = 64, .max_tokens = 8};
    sched_booking_t *b = NULL;
    sched_pd_prediction_t p;
    (void)s;
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    assert_false(sched_booking_predict_pd(b, &p)); /* nothing learnt: keep PD */
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

/* PD decode legs teach the handoff; the decode's own prefill stays unobserved. */
static void test_pd_decode_legs_teach_the_handoff(void **s)
{
    sched_pool_t *pool = fleet();
    sched_prediction_t own;
    (void)s;
    train(pool);
    sched_instance_predict_ttft(test_inst(pool, "d"), 1000, &own);
    assert_int_equal(own.observed, 0);
    assert_int_equal(atomic_load(&test_inst(pool, "d")->lat_handoff.observed), 80);
    sched_pool_destroy(pool);
}

static void test_short_prompt_behind_a_queue_goes_decode_only(void **s)
{
    sched_pool_t *pool = fleet();
    sched_request_t big = {.prompt_tokens = 2000, .max_tokens = 8};
    sched_request_t small = {.prompt_tokens = 60, .max_tokens = 8};
    sched_request_t large = {.prompt_tokens = 3000, .max_tokens = 8};
    sched_booking_t *held[3] = {NULL}, *b = NULL;
    sched_pd_prediction_t ps, pl;
    (void)s;
    train(pool);

    /* idle prefill, long prompt: PD is sooner, decode-only would stall the decode ~1.2 s */
    assert_int_equal(sched_book_pd(pool, &large, &b), SCHED_OK);
    assert_true(sched_booking_predict_pd(b, &pl));
    print_message("long, idle: with prefill %.3f s, decode-only %.3f s, stall %.3f s\n",
                  pl.with_prefill_s, pl.decode_only_s, pl.stall_s);
    assert_true(fabs(pl.with_prefill_s - (law_prefill(3000) + law_handoff(3000))) <
                0.15 * (law_prefill(3000) + law_handoff(3000)));
    assert_true(pl.stall_s > 0.5 * 0.0004 * 3000);
    assert_true(fabs(pl.tpot_s - LAW_TPOT) < 0.3 * LAW_TPOT);
    assert_int_equal(pl.uncached_tokens, 3000);
    sched_booking_destroy(&b);

    /* three long prompts queued on the prefill: a short one waits ~2.5 s for it */
    for (int k = 0; k < 3; k++)
        assert_int_equal(sched_book_prefill(pool, &big, &held[k]), SCHED_OK);
    assert_int_equal(sched_book_pd(pool, &small, &b), SCHED_OK);
    assert_true(sched_booking_predict_pd(b, &ps));
    print_message("short, queued: with prefill %.3f s, decode-only %.3f s, stall %.3f s\n",
                  ps.with_prefill_s, ps.decode_only_s, ps.stall_s);
    assert_true(ps.with_prefill_s > 3 * law_prefill(2000) * 0.8);
    assert_true(ps.decode_only_s < 0.1);
    assert_true(ps.decode_only_s < ps.with_prefill_s);
    assert_true(ps.stall_s < pl.stall_s / 20);

    /* go decode-only: the prefill is released, the decode carries the prompt's work, and
     * its first token teaches the decode's own prefill, not the handoff */
    assert_int_equal(sched_booking_decode_only(b), SCHED_OK);
    assert_false(sched_booking_leg_open(b, SCHED_LEG_PREFILL));
    assert_true(sched_booking_leg_open(b, SCHED_LEG_DECODE));
    assert_int_equal(sched_booking_decode_only(b), SCHED_ERR_STATE);
    assert_int_equal(atomic_load(&test_inst(pool, "d")->prompt_tokens), 60);
    {
        sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS, .first_token_s = 0.030};
        sched_prediction_t own;
        uint64_t handoffs = atomic_load(&test_inst(pool, "d")->lat_handoff.observed);
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
        sched_instance_predict_ttft(test_inst(pool, "d"), 60, &own);
        assert_int_equal(own.observed, 1);
        assert_int_equal(atomic_load(&test_inst(pool, "d")->lat_handoff.observed), handoffs);
        assert_int_equal(atomic_load(&test_inst(pool, "d")->prompt_tokens), 0);
    }
    sched_booking_destroy(&b);
    for (int k = 0; k < 3; k++)
        sched_booking_destroy(&held[k]);
    sched_pool_destroy(pool);
}

/* Early refusal's estimate of the first token includes the handoff once a decode learnt it. */
static void test_estimate_includes_the_handoff(void **s)
{
    sched_pool_t *pool = fleet();
    sched_request_t req = {.prompt_tokens = 1000, .max_tokens = 8};
    sched_slo_estimate_t cold, warm;
    sched_prediction_t prefill;
    double want = law_prefill(1000) + law_handoff(1000);
    (void)s;
    for (int i = 0; i < 7; i++) /* the handoff model is not trusted yet */
        pd_request(pool, 100 + (uint32_t)(i % 8) * 250);
    assert_int_equal(sched_slo_estimate(pool, &req, &cold), SCHED_OK);
    sched_instance_predict_ttft(test_inst(pool, "p"), 1000, &prefill);
    assert_true(fabs(cold.ttft_s - prefill.mean) < 1e-6); /* the prefill's alone */
    train(pool);
    assert_int_equal(sched_slo_estimate(pool, &req, &warm), SCHED_OK);
    print_message("estimate: %.4f s, prefill + handoff %.4f s\n", warm.ttft_s, want);
    assert_true(fabs(warm.ttft_s - want) < 0.1 * want);
    assert_true(warm.ttft_s - law_prefill(1000) > 0.5 * law_handoff(1000));
    sched_pool_destroy(pool);
}

/* A booking without both legs open predicts nothing and cannot go decode-only. */
static void test_needs_both_legs(void **s)
{
    sched_pool_t *pool = fleet();
    sched_request_t req = {.prompt_tokens = 60, .max_tokens = 8};
    sched_booking_t *b = NULL;
    sched_pd_prediction_t p;
    (void)s;
    train(pool);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_false(sched_booking_predict_pd(b, &p));
    assert_int_equal(sched_booking_decode_only(b), SCHED_ERR_STATE);
    sched_booking_destroy(&b);
    assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
    assert_false(sched_booking_predict_pd(b, &p));
    assert_int_equal(sched_booking_decode_only(b), SCHED_ERR_STATE);
    sched_booking_destroy(&b);
    assert_false(sched_booking_predict_pd(NULL, &p));
    assert_int_equal(sched_booking_decode_only(NULL), SCHED_ERR_STATE);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_predicts_nothing),
        cmocka_unit_test(test_pd_decode_legs_teach_the_handoff),
        cmocka_unit_test(test_short_prompt_behind_a_queue_goes_decode_only),
        cmocka_unit_test(test_estimate_includes_the_handoff),
        cmocka_unit_test(test_needs_both_legs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
