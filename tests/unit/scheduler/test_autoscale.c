/*
 * Autoscaling signals (scheduler/src/sched_autoscale.c): desired replicas per model and role
 * in throughput mode (demand over learnt capacity, as Dynamo's planner sizes them in
 * components/src/dynamo/planner/utils/prefill_planner.py / decode_planner.py) and latency
 * mode (every instance's load over the load meeting the target: +1, all under: -1), the
 * utilisation ratio, and the smoothing: demand averages follow a change within a few time
 * constants, desired replicas rise at once and fall only after the stabilisation window.
 * Driven by the manual clock.
 */
#include <math.h>

#include "sched_test_util.h"

static double sample(sched_pool_t *pool, const char *series)
{
    char *text = sched_metrics_text(pool), *at;
    double v;

    assert_non_null(text);
    at = strstr(text, series);
    if (at == NULL)
        fail_msg("no %s in:\n%s", series, text);
    v = strtod(at + strlen(series), NULL);
    free(text);
    return v;
}

#define DESIRED(role, mode)                                                                        \
    "pdgw_autoscale_desired_replicas{model=\"m\",role=\"" role "\",mode=\"" mode "\"} "
#define UTIL(role) "pdgw_autoscale_utilization_ratio{model=\"m\",role=\"" role "\"} "

static sched_pool_t *fleet(void)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    test_add(pool, "p0", 9400, SCHED_ROLE_PREFILL, NULL, 1);
    test_add(pool, "d0", 9401, SCHED_ROLE_DECODE, NULL, 1);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

/* <seconds> of <per_s> requests a second (1000 prompt tokens, 100 output), each finished at
 * once, the metrics read every second. */
static void drive(sched_pool_t *pool, int seconds, int per_s)
{
    for (int s = 0; s < seconds; s++) {
        for (int i = 0; i < per_s; i++) {
            sched_request_t req = {.prompt_tokens = 1000, .max_tokens = 200, .model = "m"};
            sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS, .later_tokens = 99};
            sched_booking_t *b = NULL;
            assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
            assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, NULL), SCHED_OK);
            assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
            sched_booking_destroy(&b);
        }
        test_advance(1000);
        free(sched_metrics_text(pool));
    }
}

static void test_throughput_follows_demand(void **state)
{
    sched_pool_t *pool = fleet();
    double u10, u20, d;

    (void)state;
    drive(pool, 150, 10); /* five time constants: settled */
    u10 = sample(pool, UTIL("prefill"));
    drive(pool, 150, 20);
    u20 = sample(pool, UTIL("prefill"));
    /* twice the arrivals of the same prompts: twice the need */
    assert_true(u10 > 0.0);
    assert_true(fabs(u20 / u10 - 2.0) < 0.05);
    d = sample(pool, DESIRED("prefill", "throughput"));
    assert_true(d == ceil(u20 - 1e-9) || (u20 < 1.0 && d == 1.0));
    assert_true(sample(pool, UTIL("decode")) > 0.0);
    assert_true(sample(pool, DESIRED("decode", "throughput")) >= 1.0);
    /* mean lengths as seen: 1000 prompt tokens, 100 output tokens (99 after the first) */
    assert_true(fabs(sample(pool, "pdgw_autoscale_demand{model=\"m\",what=\"prompt_tokens\"} ") -
                     1000.0) < 1e-6);
    assert_true(fabs(sample(pool, "pdgw_autoscale_demand{model=\"m\",what=\"output_tokens\"} ") -
                     100.0) < 1e-6);
    assert_true(fabs(sample(pool, "pdgw_autoscale_demand{model=\"m\",what="
                                  "\"requests_per_second\"} ") -
                     20.0) < 0.5);
    sched_pool_destroy(pool);
}

static void test_scale_down_waits_for_the_window(void **state)
{
    sched_pool_t *pool = fleet();
    double high;

    (void)state;
    drive(pool, 150, 80);
    high = sample(pool, DESIRED("prefill", "throughput"));
    assert_true(high >= 2.0);
    /* demand stops: the averages fall within seconds, the desired replicas do not */
    drive(pool, 60, 0);
    assert_true(sample(pool, UTIL("prefill")) < 0.5 * high);
    assert_true(sample(pool, DESIRED("prefill", "throughput")) == high);
    /* after the window (120 s) it follows */
    drive(pool, 120, 0);
    assert_true(sample(pool, DESIRED("prefill", "throughput")) < high);
    /* and a rise shows at once */
    drive(pool, 1, 400);
    assert_true(sample(pool, DESIRED("prefill", "throughput")) >= 2.0);
    sched_pool_destroy(pool);
}

static void test_latency_mode(void **state)
{
    sched_pool_t *pool = fleet();
    sched_instance_t *p0 = test_inst(pool, "p0");

    (void)state;
    drive(pool, 5, 1);
    /* an idle fleet of one: one replica */
    assert_true(sample(pool, DESIRED("prefill", "latency")) == 1.0);
    /* a queue far past what meets the TTFT target on its only prefill: one more */
    atomic_store(&p0->prompt_tokens, 10000000);
    test_advance(1000);
    assert_true(sample(pool, DESIRED("prefill", "latency")) == 2.0);
    atomic_store(&p0->prompt_tokens, 0);
    sched_pool_destroy(pool);
}

/* Targets carried by the requests tighten the sizing. */
static void test_request_targets(void **state)
{
    sched_pool_t *loose = fleet(), *tight = fleet();

    (void)state;
    drive(loose, 100, 20);
    for (int s = 0; s < 100; s++) {
        for (int i = 0; i < 20; i++) {
            sched_request_t req = {.prompt_tokens = 1000,
                                   .max_tokens = 200,
                                   .model = "m",
                                   .slo_ttft_ms = 200,
                                   .slo_tpot_ms = 20};
            sched_booking_t *b = NULL;
            assert_int_equal(sched_book_pd(tight, &req, &b), SCHED_OK);
            sched_booking_destroy(&b);
        }
        test_advance(1000);
        free(sched_metrics_text(tight));
    }
    assert_true(sample(tight, UTIL("prefill")) > sample(loose, UTIL("prefill")));
    assert_true(sample(tight, UTIL("decode")) > sample(loose, UTIL("decode")));
    sched_pool_destroy(loose);
    sched_pool_destroy(tight);
}

/* Many model names: bounded, the excess shares one slot. */
static void test_model_bound(void **state)
{
    sched_pool_t *pool = fleet();
    char name[32], *text;

    (void)state;
    for (int i = 0; i < 100; i++) {
        sched_request_t req = {.prompt_tokens = 10, .model = name};
        sched_booking_t *b = NULL;
        snprintf(name, sizeof(name), "model-%d", i);
        assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
        sched_booking_destroy(&b);
    }
    text = sched_metrics_text(pool);
    assert_non_null(strstr(text, "model=\"_other\""));
    assert_null(strstr(text, "model=\"model-99\""));
    free(text);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_throughput_follows_demand),
        cmocka_unit_test(test_scale_down_waits_for_the_window),
        cmocka_unit_test(test_latency_mode),
        cmocka_unit_test(test_request_targets),
        cmocka_unit_test(test_model_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
