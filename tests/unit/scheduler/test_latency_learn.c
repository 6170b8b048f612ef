/*
 * Latency models learnt through bookings (scheduler/src/sched_booking.c): the timings a leg
 * finishes with teach its instance's models, against what was queued and running on it
 * when it was booked. Two prefills of one fleet, one 2.5x slower than the other (the test's
 * own law; the scheduler is never told), end up predicted in that ratio; a failed or
 * untimed leg teaches nothing; the wait behind an engine that computes prompts first come
 * first served in steps of a token budget is predicted by replaying those steps with the
 * learnt step cost; cached prompt tokens are learnt as not computed.
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
        one_request(pool, 200 + (uint32_t)(uniform() * 1800), SCHED_OUTCOME_SUCCESS, true);
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

/* One prefill engine as the test imagines it: first come first served, each prompt taking
 * (25 ms + 0.3 ms per computed token) / speed once the ones before it are done. */
static double law_service(uint32_t n, double speed)
{
    return (0.025 + 0.0003 * n) / speed;
}

static sched_pool_t *one_prefill(void)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    test_add(pool, "p", 9001, SCHED_ROLE_PREFILL, NULL, 1);
    test_add(pool, "d", 9003, SCHED_ROLE_DECODE, NULL, 1);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

#define QUEUE_REQUESTS 400
typedef struct queued_leg {
    sched_booking_t *b;
    uint64_t arrive_ms, finish_ms;
} queued_leg_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The test's own engine: first come first served in steps of at most STEP_TOKENS tokens
 * (the waiting prompts in arrival order, the last one cut where the budget ends), each step
 * 20 ms + 0.3 ms per token it computes; a prompt's answer comes when the step computing its
 * last token ends. The finish time of every leg, from the arrivals alone. */
#define STEP_TOKENS 2048
static void engine_steps(const double *arrive, const uint32_t *tokens, size_t n, double *finish)
{
    uint32_t left[QUEUE_REQUESTS];
    size_t first = 0, arrived = 0;
    double t = 0.0;

    for (size_t i = 0; i < n; i++)
        left[i] = tokens[i];
    while (first < n) {
        uint32_t room = STEP_TOKENS, computed = 0;
        while (arrived < n && arrive[arrived] <= t)
            arrived++;
        if (arrived == first) { /* idle until the next arrival */
            t = arrive[first];
            continue;
        }
        for (size_t i = first; i < arrived && room > 0; i++) {
            uint32_t take = left[i] < room ? left[i] : room;
            left[i] -= take;
            room -= take;
            computed += take;
        }
        t += 0.020 + 0.0003 * computed;
        for (size_t i = first; i < arrived && left[i] == 0; i++)
            if (finish[i] == 0.0)
                finish[i] = t;
        while (first < n && left[first] == 0)
            first++;
    }
}

/* Poisson arrivals at 80 % of that engine's capacity on the driven clock: queues come and
 * go, and under load a prompt shares its step with the ones that came while the previous
 * step ran (after it, too). Each leg's prediction at booking is scored against its time to
 * the answer; the scheduler never sees the law, only the answers' times. */
static void test_queue_wait_predicted(void **s)
{
    sched_pool_t *pool = one_prefill();
    static queued_leg_t legs[QUEUE_REQUESTS];
    static double arrive[QUEUE_REQUESTS], finish[QUEUE_REQUESTS];
    static uint32_t tokens[QUEUE_REQUESTS];
    double errs[QUEUE_REQUESTS], t = 0.0;
    /* full steps compute 2,048 tokens in 0.634 s; prompts average 1,100 tokens */
    double capacity_per_s = STEP_TOKENS / (0.020 + 0.0003 * STEP_TOKENS) / 1100.0;
    size_t n_err = 0, done = 0;
    uint64_t t0 = test_clock(NULL);
    (void)s;
    for (int i = 0; i < QUEUE_REQUESTS; i++) {
        tokens[i] = 200 + (uint32_t)(uniform() * 1800);
        t += -log(1.0 - uniform()) / (0.8 * capacity_per_s);
        arrive[i] = floor(t * 1000.0) / 1000.0; /* on the pool's millisecond clock */
        finish[i] = 0.0;
    }
    engine_steps(arrive, tokens, QUEUE_REQUESTS, finish);
    for (int i = 0; i < QUEUE_REQUESTS; i++) {
        sched_request_t req = {.prompt_tokens = tokens[i], .max_tokens = 16};
        double pred = 0.0;
        legs[i].arrive_ms = t0 + (uint64_t)llround(arrive[i] * 1000.0);
        legs[i].finish_ms = t0 + (uint64_t)llround(finish[i] * 1000.0);
        /* the answers that came before this arrival, in their order */
        while (done < (size_t)i && legs[done].finish_ms <= legs[i].arrive_ms) {
            sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
            test_set_now(legs[done].finish_ms);
            r.first_token_s = (double)(legs[done].finish_ms - legs[done].arrive_ms) / 1e3;
            assert_int_equal(sched_booking_finish(legs[done].b, SCHED_LEG_PREFILL, &r), SCHED_OK);
            sched_booking_destroy(&legs[done].b);
            done++;
        }
        test_set_now(legs[i].arrive_ms);
        assert_int_equal(sched_book_prefill(pool, &req, &legs[i].b), SCHED_OK);
        sched_booking_predicted(legs[i].b, SCHED_LEG_PREFILL, &pred, NULL);
        if (i >= QUEUE_REQUESTS / 2) {
            double actual = (double)(legs[i].finish_ms - legs[i].arrive_ms) / 1e3;
            assert_true(pred > 0.0); /* warm */
            errs[n_err++] = fabs(pred - actual) / actual;
        }
    }
    for (; done < QUEUE_REQUESTS; done++)
        sched_booking_destroy(&legs[done].b);
    qsort(errs, n_err, sizeof(errs[0]), cmp_double);
    print_message("queue wait: median relative error %.3f, p90 %.3f\n", errs[n_err / 2],
                  errs[n_err * 9 / 10]);
    assert_true(errs[n_err / 2] < 0.05);
    assert_true(errs[n_err * 9 / 10] < 0.30);
    sched_pool_destroy(pool);
}

/* Work booked now lengthens the prediction by what the learnt step cost says (3 x 2,048
 * tokens booked together: 3 full steps before the next full one's), and that wait shrinks as
 * the clock runs while nothing answers (the engine keeps computing). */
static void test_backlog_drains_with_time(void **s)
{
    sched_pool_t *pool = one_prefill();
    sched_booking_t *held[3] = {NULL};
    sched_instance_t *p = test_inst(pool, "p");
    sched_prediction_t idle, busy, later;
    double ahead;
    (void)s;
    for (int i = 0; i < 100; i++) { /* learn the rate from legs that meet no queue */
        sched_request_t req = {.prompt_tokens = 200 + (uint32_t)(uniform() * 1848)};
        sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
        sched_booking_t *b = NULL;
        assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
        r.first_token_s = law_service(req.prompt_tokens, 1.0);
        test_advance((uint64_t)(r.first_token_s * 1000.0));
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
        sched_booking_destroy(&b);
        test_advance(5000); /* idle */
    }
    sched_instance_predict_ttft(p, 2048, &idle);
    assert_true(fabs(idle.mean - law_service(2048, 1.0)) / law_service(2048, 1.0) < 0.1);
    for (int k = 0; k < 3; k++) {
        sched_request_t req = {.prompt_tokens = 2048};
        assert_int_equal(sched_book_prefill(pool, &req, &held[k]), SCHED_OK);
    }
    sched_instance_predict_ttft(p, 2048, &busy);
    ahead = 3 * law_service(2048, 1.0);
    assert_true(fabs((busy.mean - idle.mean) - ahead) < 0.1 * ahead);
    test_advance((uint64_t)(ahead * 500.0)); /* half of that work */
    sched_instance_predict_ttft(p, 2048, &later);
    assert_true(fabs((later.mean - idle.mean) - ahead / 2) < 0.1 * ahead);
    test_advance(5000); /* all of it, and more: never below idle */
    sched_instance_predict_ttft(p, 2048, &later);
    assert_true(fabs(later.mean - idle.mean) < 1e-9);
    for (int k = 0; k < 3; k++)
        sched_booking_destroy(&held[k]);
    sched_pool_destroy(pool);
}

/* A prefill whose engine says part of the prompt came from its cache is learnt against
 * what it computed: the model predicts an uncached prompt right, not 40 % short. */
static void test_cached_tokens_learnt_as_not_computed(void **s)
{
    sched_pool_t *pool = one_prefill();
    sched_prediction_t p;
    (void)s;
    for (int i = 0; i < 150; i++) {
        sched_request_t req = {.prompt_tokens = 400 + (uint32_t)(uniform() * 1648)};
        sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
        sched_booking_t *b = NULL;
        uint32_t cached = (i % 2) ? req.prompt_tokens / 2 : 0;
        assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
        r.first_token_s = law_service(req.prompt_tokens - cached, 1.0);
        r.cached_tokens = cached;
        test_advance((uint64_t)(r.first_token_s * 1000.0));
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
        sched_booking_destroy(&b);
        test_advance(5000);
    }
    sched_instance_predict_ttft(test_inst(pool, "p"), 2000, &p);
    assert_true(fabs(p.mean - law_service(2000, 1.0)) / law_service(2000, 1.0) < 0.1);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_instance_predicted_slow),
        cmocka_unit_test(test_failed_or_untimed_legs_teach_nothing),
        cmocka_unit_test(test_queue_wait_predicted),
        cmocka_unit_test(test_backlog_drains_with_time),
        cmocka_unit_test(test_cached_tokens_learnt_as_not_computed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
