/*
 * The online latency models (scheduler/src/sched_predict.c): they converge on observations
 * drawn from a law they were never told, follow a step change (an instance that slows
 * down), start from their priors (or a peer's fit) when cold, shrug off an outlier and
 * garbage, do not wind up on repeated identical features, track the p90 of their spread,
 * and stay consistent while one thread observes and others predict. The laws below are the
 * test's own numbers; nothing in the models knows them.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <pdsched/predict.h>

/* Deterministic noise: xorshift64*, uniform in [0, 1). */
static uint64_t rng = 88172645463325252ull;
static double uniform(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static double gaussian(void)
{
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u > 1e-12 ? u : 1e-12)) * cos(6.283185307179586 * v);
}

/* A prefill instance's true law (seconds) over <steps> engine steps computing <tokens>:
 * 30 ms a step + 0.25 ms a token. */
static double law_prefill(uint64_t steps, uint64_t tokens, double speed)
{
    return (0.030 * (double)steps + 0.25 * (double)tokens / 1000.0) / speed;
}

/* A replay's answer: 1..8 steps of up to 2,048 tokens each. */
static void draw(uint64_t *n, uint64_t *q)
{
    *n = 1 + (uint64_t)(uniform() * 8.0);
    *q = 16 + (uint64_t)(uniform() * 2032.0 * (double)*n);
}

static void feed_prefill(sched_latency_model_t *m, int count, double speed, double noise)
{
    for (int i = 0; i < count; i++) {
        uint64_t n, q;
        double x[SCHED_PREFILL_DIM];
        draw(&n, &q);
        sched_prefill_features(x, (uint32_t)n, q);
        sched_latency_model_observe(m, x, law_prefill(n, q, speed) * exp(noise * gaussian()));
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median |predicted - true| / true over fresh points. */
static double median_rel_err(const sched_latency_model_t *m, double speed)
{
    double e[201];
    for (int i = 0; i < 201; i++) {
        uint64_t n, q;
        double x[SCHED_PREFILL_DIM], t;
        sched_prediction_t p;
        draw(&n, &q);
        sched_prefill_features(x, (uint32_t)n, q);
        sched_latency_model_predict(m, x, &p);
        t = law_prefill(n, q, speed);
        e[i] = fabs(p.mean - t) / t;
    }
    qsort(e, 201, sizeof(e[0]), cmp_double);
    return e[100];
}

static void test_converges_on_an_unknown_law(void **s)
{
    sched_latency_model_t m;
    sched_prediction_t p;
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_PREFILL, NULL);
    assert_true(median_rel_err(&m, 1.0) > 0.2); /* the prior is far from this law */
    feed_prefill(&m, 300, 1.0, 0.05);
    assert_true(median_rel_err(&m, 1.0) < 0.05);
    {
        double x[SCHED_PREFILL_DIM];
        sched_prefill_features(x, 1, 2000);
        sched_latency_model_predict(&m, x, &p);
    }
    assert_int_equal(p.observed, 300);
    assert_true(p.err > 0.01 && p.err < 0.08); /* its own error estimate: about the noise */
    assert_true(p.upper > p.mean);
    sched_latency_model_fini(&m);
}

/* The instance becomes 2.5x slower: within 30 requests the model says so (forgetting alone
 * was still 20 % off after 60). */
static void test_follows_a_step_change(void **s)
{
    sched_latency_model_t m;
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_PREFILL, NULL);
    feed_prefill(&m, 300, 1.0, 0.05);
    assert_true(median_rel_err(&m, 0.4) > 0.5); /* still the old law */
    feed_prefill(&m, 30, 0.4, 0.05);
    assert_true(median_rel_err(&m, 0.4) < 0.10);
    /* and back: it got faster again */
    feed_prefill(&m, 30, 1.0, 0.05);
    assert_true(median_rel_err(&m, 1.0) < 0.10);
    sched_latency_model_fini(&m);
}

static void test_cold_start_and_seeding(void **s)
{
    sched_latency_model_t warm, cold, seeded;
    sched_prediction_t pw, pc, ps;
    double x[SCHED_PREFILL_DIM];
    const double *prior = sched_phase_prior(SCHED_PHASE_PREFILL);
    (void)s;
    sched_latency_model_init(&cold, SCHED_PHASE_PREFILL, NULL);
    sched_prefill_features(x, 1, 1000);
    sched_latency_model_predict(&cold, x, &pc);
    assert_true(fabs(pc.mean - (prior[0] + prior[1])) < 1e-12);
    assert_int_equal(pc.observed, 0);
    assert_true(pc.upper > pc.mean); /* unsure while cold */

    sched_latency_model_init(&warm, SCHED_PHASE_PREFILL, NULL);
    feed_prefill(&warm, 300, 1.0, 0.02);
    sched_latency_model_init(&seeded, SCHED_PHASE_PREFILL, NULL);
    sched_latency_model_seed(&seeded, &warm);
    sched_latency_model_predict(&warm, x, &pw);
    sched_latency_model_predict(&seeded, x, &ps);
    assert_true(fabs(ps.mean - pw.mean) < 1e-12);
    assert_int_equal(ps.observed, 0);
    /* seeding a model that has observations of its own changes nothing */
    sched_latency_model_seed(&warm, &cold);
    sched_latency_model_predict(&warm, x, &pc);
    assert_true(fabs(pc.mean - pw.mean) < 1e-12);
    sched_latency_model_fini(&cold);
    sched_latency_model_fini(&warm);
    sched_latency_model_fini(&seeded);
}

/* One request that sat 100x longer (a retry, a stall) and garbage observations. */
static void test_outliers_and_garbage(void **s)
{
    sched_latency_model_t m;
    sched_prediction_t before, after;
    double x[SCHED_PREFILL_DIM], bad[SCHED_PREFILL_DIM];
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_PREFILL, NULL);
    feed_prefill(&m, 300, 1.0, 0.05);
    sched_prefill_features(x, 3, 5000);
    sched_latency_model_predict(&m, x, &before);
    sched_latency_model_observe(&m, x, law_prefill(3, 5000, 1.0) * 100.0);
    sched_latency_model_predict(&m, x, &after);
    assert_true(fabs(after.mean - before.mean) / before.mean < 0.10);
    sched_latency_model_observe(&m, x, -1.0);
    sched_latency_model_observe(&m, x, 0.0);
    sched_latency_model_observe(&m, x, NAN);
    sched_latency_model_observe(&m, x, INFINITY);
    bad[0] = 1.0;
    bad[1] = NAN;
    sched_latency_model_observe(&m, bad, 0.5);
    sched_latency_model_predict(&m, x, &before);
    assert_int_equal(before.observed, 301); /* the five were not taken */
    assert_true(isfinite(before.mean) && isfinite(before.upper));
    sched_latency_model_fini(&m);
}

/* Thousands of requests of one size (one excited direction) must not wind the fit up: when
 * other sizes come, it learns them as fast as a fresh one would. */
static void test_no_windup_on_repeated_features(void **s)
{
    sched_latency_model_t m;
    double x[SCHED_PREFILL_DIM], tr = 0.0;
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_PREFILL, NULL);
    sched_prefill_features(x, 1, 512);
    for (int i = 0; i < 20000; i++)
        sched_latency_model_observe(&m, x, law_prefill(1, 512, 1.0));
    for (unsigned i = 0; i < m.fit.dim; i++)
        tr += m.fit.p[i][i];
    assert_true(isfinite(tr) && tr <= m.fit.prior_var * m.fit.dim * (1.0 + 1e-9));
    feed_prefill(&m, 150, 1.0, 0.02);
    assert_true(median_rel_err(&m, 1.0) < 0.05);
    sched_latency_model_fini(&m);
}

/* Log-normal noise of sigma 0.2 around a law the fit knows: the tracked p90 of
 * actual / predicted settles near e^(1.2816 * 0.2) = 1.29, and about 90 % of the actual
 * durations fall below the upper prediction. */
static void test_tracks_its_p90(void **s)
{
    sched_latency_model_t m;
    int below = 0;
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_TPOT, NULL);
    for (int i = 0; i < 3000; i++) {
        double x[SCHED_TPOT_DIM];
        uint32_t b = (uint32_t)(1 + uniform() * 63);
        uint64_t kv = (uint64_t)(uniform() * 200000);
        double t = 0.008 + 0.004 * b / 16.0 + 0.003 * (double)kv / 10000.0;
        double y = t * exp(0.2 * gaussian());
        sched_prediction_t p;
        sched_tpot_features(x, b, kv);
        sched_latency_model_predict(&m, x, &p);
        if (i >= 2000 && y <= p.upper)
            below++;
        sched_latency_model_observe(&m, x, y);
    }
    assert_in_range(below, 850, 950);
    assert_true(fabs(atomic_load(&m.spread) - 1.29) < 0.12);
    sched_latency_model_fini(&m);
}

/* Fixed size: no model grows with what it observed. */
static void test_bounded_memory(void **s)
{
    (void)s;
    assert_true(sizeof(sched_latency_model_t) <= 512);
}

typedef struct {
    sched_latency_model_t *m;
    _Atomic int stop;
    long bad;
} race_t;

static void *predictor(void *arg)
{
    race_t *r = arg;
    double x[SCHED_PREFILL_DIM];
    sched_prefill_features(x, 3, 5000);
    while (!atomic_load(&r->stop)) {
        sched_prediction_t p;
        sched_latency_model_predict(r->m, x, &p);
        /* between the prior's and the law's values, never torn into garbage */
        if (!(p.mean >= 0.0 && p.mean < 10.0 && p.upper >= 0.0 && p.upper < 100.0))
            r->bad++;
    }
    return NULL;
}

static void test_predict_while_observing(void **s)
{
    sched_latency_model_t m;
    race_t r = {.m = &m};
    pthread_t t[2];
    (void)s;
    sched_latency_model_init(&m, SCHED_PHASE_PREFILL, NULL);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, predictor, &r), 0);
    feed_prefill(&m, 20000, 1.0, 0.05);
    atomic_store(&r.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(r.bad, 0);
    sched_latency_model_fini(&m);
}

/* Whole answers: only first token + later tokens together is seen. A handoff of 8 ms + 15 ms
 * per kToken and a TPOT of 9 ms + 6 ms per 16 running, learnt from the sums of both over
 * varied prompts, batches and output lengths (each model from its own priors, which are off
 * by about 2x), come out within 15 % of each law. */
static void test_whole_answers_split_into_the_phases(void **s)
{
    sched_latency_model_t h, t;
    (void)s;
    sched_latency_model_init(&h, SCHED_PHASE_TRANSFER, NULL);
    sched_latency_model_init(&t, SCHED_PHASE_TPOT, NULL);
    for (int i = 0; i < 600; i++) {
        uint64_t prompt = 100 + (uint64_t)(uniform() * 6000);
        uint32_t running = (uint32_t)(uniform() * 48), out = 2 + (uint32_t)(uniform() * 200);
        double xa[SCHED_TRANSFER_DIM], xt[SCHED_TPOT_DIM], xb[SCHED_TPOT_DIM];
        double first = 0.008 + 0.015 * (double)prompt * 1e-3;
        double tpot = 0.009 + 0.006 * running / 16.0;
        sched_transfer_features(xa, prompt, running);
        sched_tpot_features(xt, running, 0);
        for (unsigned k = 0; k < SCHED_TPOT_DIM; k++)
            xb[k] = xt[k] * (double)(out - 1);
        sched_latency_model_observe_sum(&h, xa, &t, xb,
                                        (first + tpot * (out - 1)) * (1.0 + 0.02 * gaussian()));
    }
    {
        double xa[SCHED_TRANSFER_DIM], xt[SCHED_TPOT_DIM];
        sched_prediction_t ph, pt;
        sched_transfer_features(xa, 3000, 8);
        sched_tpot_features(xt, 8, 0);
        sched_latency_model_predict(&h, xa, &ph);
        sched_latency_model_predict(&t, xt, &pt);
        print_message("handoff %.4f (law 0.0530), tpot %.4f (law 0.0120)\n", ph.mean, pt.mean);
        assert_true(fabs(ph.mean - 0.053) / 0.053 < 0.15);
        assert_true(fabs(pt.mean - 0.012) / 0.012 < 0.15);
        assert_int_equal(ph.observed, 600);
        assert_int_equal(pt.observed, 600);
    }
    sched_latency_model_fini(&h);
    sched_latency_model_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_answers_split_into_the_phases),
        cmocka_unit_test(test_converges_on_an_unknown_law),
        cmocka_unit_test(test_follows_a_step_change),
        cmocka_unit_test(test_cold_start_and_seeding),
        cmocka_unit_test(test_outliers_and_garbage),
        cmocka_unit_test(test_no_windup_on_repeated_features),
        cmocka_unit_test(test_tracks_its_p90),
        cmocka_unit_test(test_bounded_memory),
        cmocka_unit_test(test_predict_while_observing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
