/*
 * The slo policy (scheduler/src/sched_slo.c) over latency models learnt through bookings:
 * a slower prefill gets proportionally less, a decode whose predicted time per output token
 * misses the request's target is passed over, one very fast instance is not made the hot
 * spot, a cold fleet is filled deterministically, a prompt cached on one prefill (its KV
 * events) is predicted as what is left to compute there, sched_slo_estimate says what the
 * fleet can do, and a (prefill, decode) pair whose KV handoff is slower than the decode's others
 * is learnt and avoided, the prefill and the decode chosen together. The speeds are the test's own;
 * the scheduler learns them from timings.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "sched_kvev_int.h"
#include "sched_test_util.h"

/* Seconds to the first token on an instance of <speed>, <queued> prompt tokens ahead. */
static double law_ttft(uint32_t n, uint64_t queued, double speed)
{
    return (0.025 + 0.0003 * n + 0.0003 * (double)queued) / speed;
}

static double speed_of(const sched_instance_t *inst)
{
    const char *id = sched_instance_id(inst);
    return strncmp(id, "slow", 4) == 0     ? 0.4
           : strncmp(id, "rocket", 6) == 0 ? 10.0
           : strncmp(id, "brisk", 5) == 0  ? 1.1
                                           : 1.0;
}

/* Decode: 10 ms per token, 40 ms on the ones called slow-*. */
static double law_tpot(const sched_instance_t *inst)
{
    return speed_of(inst) < 1.0 ? 0.040 : 0.010;
}

/* The KV handoff of a PD decode leg (its time to the first token after the prefill answered):
 * 5 ms + 10 ms per kToken, 4x on the path from slow_path_prefill to slow_path_decode. */
static const char *slow_path_prefill = "", *slow_path_decode = "";
static double law_handoff(const sched_instance_t *p, const sched_instance_t *d, uint32_t n)
{
    double t = 0.005 + 0.010 * n * 1e-3;
    return strcmp(sched_instance_id(p), slow_path_prefill) == 0 &&
                   strcmp(sched_instance_id(d), slow_path_decode) == 0
               ? 4.0 * t
               : t;
}

/* What a trained decode leg reports: its later tokens only, its first token too (the
 * handoff after the prefill), or a whole answer (its time and output tokens only). */
typedef enum { DECODE_LATER_TOKENS, DECODE_STREAMED, DECODE_WHOLE } decode_timing_t;

/* Teach every instance: book each request (round-robin during training), finish it timed. */
static void train_as(sched_pool_t *pool, int requests, decode_timing_t timing)
{
    assert_int_equal(sched_pool_set_policy(pool, SCHED_ROLE_PREFILL, SCHED_POLICY_ROUND_ROBIN),
                     SCHED_OK);
    assert_int_equal(sched_pool_set_policy(pool, SCHED_ROLE_DECODE, SCHED_POLICY_ROUND_ROBIN),
                     SCHED_OK);
    for (int i = 0; i < requests; i++) {
        uint32_t n = 200 + (uint32_t)((i * 7919) % 3800);
        sched_request_t req = {.prompt_tokens = n, .max_tokens = 32};
        sched_booking_t *b = NULL;
        sched_result_t r = {.outcome = SCHED_OUTCOME_SUCCESS};
        sched_instance_t *p, *d;
        assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
        p = sched_booking_instance(b, SCHED_LEG_PREFILL);
        d = sched_booking_instance(b, SCHED_LEG_DECODE);
        r.first_token_s = law_ttft(n, 0, speed_of(p));
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_PREFILL, &r), SCHED_OK);
        r.first_token_s = timing == DECODE_LATER_TOKENS ? 0.0 : law_handoff(p, d, n);
        r.later_tokens = 31;
        r.later_tokens_s = 31 * law_tpot(d);
        if (timing == DECODE_WHOLE) {
            uint32_t out = 2 + (uint32_t)((i * 31) % 120);
            r.answer_s = r.first_token_s + (out - 1) * law_tpot(d);
            r.answer_tokens = out;
            r.first_token_s = r.later_tokens_s = 0.0;
            r.later_tokens = 0;
        }
        assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &r), SCHED_OK);
        sched_booking_destroy(&b);
    }
    assert_int_equal(sched_pool_set_policy(pool, SCHED_ROLE_PREFILL, SCHED_POLICY_SLO), SCHED_OK);
    assert_int_equal(sched_pool_set_policy(pool, SCHED_ROLE_DECODE, SCHED_POLICY_SLO), SCHED_OK);
}

static void train(sched_pool_t *pool, int requests)
{
    train_as(pool, requests, DECODE_LATER_TOKENS);
}

static void train_pd(sched_pool_t *pool, int requests)
{
    train_as(pool, requests, DECODE_STREAMED);
}

static sched_pool_t *fleet(const char *const *prefills, size_t np, const char *const *decodes,
                           size_t nd)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_SLO, SCHED_POLICY_SLO);
    int port = 9100;
    for (size_t i = 0; i < np; i++)
        test_add(pool, prefills[i], port++, SCHED_ROLE_PREFILL, NULL, 1);
    for (size_t i = 0; i < nd; i++)
        test_add(pool, decodes[i], port++, SCHED_ROLE_DECODE, NULL, 1);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

/* Book <n> prefill legs of 1000 tokens without finishing them (a burst), count by id. */
static void burst(sched_pool_t *pool, int n, sched_booking_t **held, int *fast, int *slow)
{
    *fast = *slow = 0;
    for (int i = 0; i < n; i++) {
        sched_request_t req = {.prompt_tokens = 1000, .max_tokens = 32};
        assert_int_equal(sched_book_prefill(pool, &req, &held[i]), SCHED_OK);
        if (speed_of(sched_booking_instance(held[i], SCHED_LEG_PREFILL)) < 1.0)
            (*slow)++;
        else
            (*fast)++;
    }
}

static void test_slower_prefill_gets_proportionally_less(void **s)
{
    static const char *const p[] = {"fast-1", "slow-1"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 2, d, 1);
    sched_booking_t *held[60];
    int fast, slow;
    (void)s;
    train(pool, 200);
    burst(pool, 60, held, &fast, &slow);
    print_message("fast %d, slow %d of 60\n", fast, slow);
    /* Equal predicted finish times: the fast one takes about 2.5x as many (bounded by 1.5x
     * the mean, 45 of 60). */
    assert_in_range(fast, 38, 45);
    assert_in_range(slow, 15, 22);
    for (int i = 0; i < 60; i++)
        sched_booking_destroy(&held[i]);
    sched_pool_destroy(pool);
}

/* One instance 10x faster than three others: bounded load keeps it to 1.5x its share. */
static void test_fast_instance_is_not_the_hot_spot(void **s)
{
    static const char *const p[] = {"rocket", "fast-1", "fast-2", "fast-3"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 4, d, 1);
    sched_booking_t *held[40];
    int rocket = 0;
    (void)s;
    train(pool, 200);
    for (int i = 0; i < 40; i++) {
        sched_request_t req = {.prompt_tokens = 1000, .max_tokens = 32};
        assert_int_equal(sched_book_prefill(pool, &req, &held[i]), SCHED_OK);
        rocket += strcmp(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_PREFILL)),
                         "rocket") == 0;
    }
    assert_in_range(rocket, 10, 15); /* its share is 10; the bound 1.5x of it */
    for (int i = 0; i < 40; i++)
        sched_booking_destroy(&held[i]);
    sched_pool_destroy(pool);
}

/* A 20 ms TPOT target: the 40 ms decode is never chosen, even while the other holds more
 * (within the bound); without a target it takes its turn (these whole-request legs by their
 * predicted time to first token, which grows with the prompts queued on each). */
static void test_decode_tpot_target_respected(void **s)
{
    static const char *const p[] = {"fast-1"}, *const d[] = {"d-fast", "slow-d"};
    sched_pool_t *pool = fleet(p, 1, d, 2);
    sched_booking_t *held[20];
    int on_slow = 0;
    (void)s;
    train(pool, 100);
    for (int i = 0; i < 8; i++) {
        sched_request_t req = {.prompt_tokens = 500, .max_tokens = 64, .slo_tpot_ms = 20};
        assert_int_equal(sched_book_decode(pool, &req, &held[i]), SCHED_OK);
        on_slow += strcmp(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_DECODE)),
                          "slow-d") == 0;
    }
    assert_int_equal(on_slow, 0);
    for (int i = 8; i < 20; i++) {
        sched_request_t req = {.prompt_tokens = 500, .max_tokens = 64};
        assert_int_equal(sched_book_decode(pool, &req, &held[i]), SCHED_OK);
        on_slow += strcmp(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_DECODE)),
                          "slow-d") == 0;
    }
    assert_true(on_slow >= 6); /* least load: it catches up with the 8 held on d-fast */
    for (int i = 0; i < 20; i++)
        sched_booking_destroy(&held[i]);
    sched_pool_destroy(pool);
}

/* Cold and identical: the lowest uid first, then the booked queue moves the next on. */
static void test_cold_fleet_is_deterministic(void **s)
{
    static const char *const p[] = {"fast-1", "fast-2", "fast-3"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 3, d, 1);
    sched_booking_t *held[3];
    (void)s;
    for (int i = 0; i < 3; i++) {
        sched_request_t req = {.prompt_tokens = 1000, .max_tokens = 32};
        assert_int_equal(sched_book_prefill(pool, &req, &held[i]), SCHED_OK);
        assert_string_equal(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_PREFILL)),
                            p[i]);
    }
    for (int i = 0; i < 3; i++)
        sched_booking_destroy(&held[i]);
    sched_pool_destroy(pool);
}

/* A role of 200: a pick looks at a window of 64, yet an instance outside every window's
 * reach for its model (the only one serving it) is still found. */
static void test_large_role_window(void **s)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_SLO, SCHED_POLICY_SLO);
    char id[32], url[64], err[256];
    (void)s;
    for (int i = 0; i < 200; i++) {
        sched_instance_desc_t d;
        sched_instance_desc_init(&d);
        snprintf(id, sizeof(id), "p-%03d", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 10000 + i);
        d.id = id;
        d.url = url;
        d.role = i == 199 ? SCHED_ROLE_BOTH : SCHED_ROLE_PREFILL;
        d.models[0] = i == 199 ? "rare" : "common";
        d.n_models = 1;
        assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
    }
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    for (int k = 0; k < 20; k++) {
        sched_request_t req = {.prompt_tokens = 100, .model = k % 2 ? "rare" : "common"};
        sched_booking_t *b = NULL;
        assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
        assert_int_equal(
            strcmp(sched_instance_id(sched_booking_instance(b, SCHED_LEG_PREFILL)), "p-199") == 0,
            k % 2);
        sched_booking_destroy(&b);
    }
    sched_pool_destroy(pool);
}

/* With KV events, a prefill whose engine holds most of the prompt is predicted to compute
 * only the rest: it wins over an equal one that holds nothing (a tie would go to the lower
 * uid), and the booking's prediction is the rest's time. */
static void test_cached_prefix_from_kv_events(void **s)
{
    static const char *const p[] = {"fast-1", "fast-2"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 2, d, 1);
    static uint32_t tokens[2000];
    uint64_t hashes[100];
    sched_kvev_event_t ev = {.kind = SCHED_KVEV_STORED, .group_idx = -1, .medium_gpu = true};
    sched_booking_t *b = NULL;
    double pred = 0.0;
    (void)s;
    train(pool, 200);
    assert_non_null(pool->kvev_index); /* slo keeps the index too */
    for (int i = 0; i < 2000; i++)
        tokens[i] = 5000u + (uint32_t)i;
    for (int i = 0; i < 100; i++)
        hashes[i] = 70000u + (uint64_t)i;
    ev.block_hashes = hashes;
    ev.n_block_hashes = 100; /* 1,600 tokens of blocks of 16 */
    ev.token_ids = tokens;
    ev.n_token_ids = 1600;
    ev.block_size = 16;
    sched_kvev_index_apply(pool->kvev_index,
                           sched_kvev_index_slot(pool->kvev_index, test_inst(pool, "fast-2")->uid),
                           &ev);
    sched_request_t req = {
        .tokens = tokens, .n_tokens = 2000, .prompt_tokens = 2000, .max_tokens = 32};
    assert_int_equal(sched_book_prefill(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_PREFILL)), "fast-2");
    sched_booking_predicted(b, SCHED_LEG_PREFILL, &pred, NULL);
    assert_true(fabs(pred - law_ttft(400, 0, 1.0)) / law_ttft(400, 0, 1.0) < 0.15);
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

static void test_estimate(void **s)
{
    static const char *const p[] = {"fast-1", "slow-1"}, *const d[] = {"d-fast", "slow-d"};
    sched_pool_t *pool = fleet(p, 2, d, 2);
    sched_request_t req = {.prompt_tokens = 2000, .max_tokens = 100};
    sched_slo_estimate_t e;
    (void)s;
    assert_int_equal(sched_slo_estimate(pool, &req, &e), SCHED_OK);
    assert_true(e.cold);
    train(pool, 200);
    assert_int_equal(sched_slo_estimate(pool, &req, &e), SCHED_OK);
    assert_false(e.cold);
    assert_true(fabs(e.ttft_s - law_ttft(2000, 0, 1.0)) / law_ttft(2000, 0, 1.0) < 0.1);
    assert_true(fabs(e.tpot_s - 0.010) / 0.010 < 0.15);
    /* excluded instances do not count */
    {
        const char *ex[] = {"fast-1"};
        req.exclude_ids = ex;
        req.n_exclude_ids = 1;
        assert_int_equal(sched_slo_estimate(pool, &req, &e), SCHED_OK);
        assert_true(fabs(e.ttft_s - law_ttft(2000, 0, 0.4)) / law_ttft(2000, 0, 0.4) < 0.1);
    }
    sched_pool_destroy(pool);
}

/* Book <n> PD requests of 4000 tokens one after the other (each finished before the next:
 * an idle fleet), counting the ones that went to <prefill> and to <decode>. */
static void sequential_pd(sched_pool_t *pool, int n, const char *prefill, const char *decode,
                          int *on_prefill, int *on_decode)
{
    *on_prefill = *on_decode = 0;
    for (int i = 0; i < n; i++) {
        sched_request_t req = {.prompt_tokens = 4000, .max_tokens = 32};
        sched_booking_t *b = NULL;
        assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
        *on_prefill +=
            strcmp(sched_instance_id(sched_booking_instance(b, SCHED_LEG_PREFILL)), prefill) == 0;
        *on_decode +=
            strcmp(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), decode) == 0;
        sched_booking_destroy(&b);
    }
}

/* Two prefills, the brisk one 10 % faster, whose path to the only decode is 4x slower: at 4000
 * tokens the prefill saves 0.11 s and the handoff costs 0.135 s more, so the pair through the
 * other prefill starts sooner. Chosen one leg at a time, the brisk prefill would win every
 * time (the control: the same fleet with the path normal). */
static void test_pair_chosen_together(void **s)
{
    static const char *const p[] = {"brisk-1", "p-2"}, *const d[] = {"d-1"};
    sched_pool_t *pool;
    int on_p, on_d;
    (void)s;
    slow_path_prefill = "nobody";
    slow_path_decode = "d-1";
    pool = fleet(p, 2, d, 1);
    train_pd(pool, 200);
    sequential_pd(pool, 20, "brisk-1", "d-1", &on_p, &on_d);
    assert_int_equal(on_p, 20); /* control: the faster prefill, the paths equal */
    sched_pool_destroy(pool);

    slow_path_prefill = "brisk-1";
    pool = fleet(p, 2, d, 1);
    train_pd(pool, 200);
    sequential_pd(pool, 20, "brisk-1", "d-1", &on_p, &on_d);
    print_message("brisk-1 (slow path) took %d of 20\n", on_p);
    assert_int_equal(on_p, 0);
    sched_pool_destroy(pool);
}

/* One prefill, two equal decodes, the path to d-1 4x slower: the decode pick after that
 * prefill takes d-2 (least loaded alone would alternate or take the lower uid). */
static void test_decode_by_pair_handoff(void **s)
{
    static const char *const p[] = {"p-1"}, *const d[] = {"d-1", "d-2"};
    sched_pool_t *pool;
    int on_p, on_d1;
    (void)s;
    slow_path_prefill = "p-1";
    slow_path_decode = "d-1";
    pool = fleet(p, 1, d, 2);
    train_pd(pool, 200);
    sequential_pd(pool, 20, "p-1", "d-1", &on_p, &on_d1);
    print_message("d-1 (slow path) took %d of 20\n", on_d1);
    assert_int_equal(on_d1, 0);
    sched_pool_destroy(pool);
}

/* The pair table itself: a step change on one path is followed within a few legs, the other
 * paths keep their factor, and a decode keeps the SCHED_PAIR_SLOTS prefills it saw last. */
static void test_pair_factor_tracks_and_is_bounded(void **s)
{
    static const char *const p[] = {"p-1"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 1, d, 1);
    sched_instance_t *dec = sched_pool_get(pool, "d-1");
    double x[SCHED_TRANSFER_DIM];
    uint64_t now = 1;
    (void)s;
    assert_non_null(dec);
    sched_transfer_features(x, 2000, 0);
    for (int i = 0; i < 40; i++) /* the decode's own model, through prefill 1 */
        sched_handoff_observe(dec, 1, x, 0.025, now++);
    assert_true(fabs(sched_pair_factor(&dec->pairs, 1) - 1.0) < 0.1);
    for (int i = 0; i < 8; i++) /* prefill 2's path turns 3x slower */
        sched_handoff_observe(dec, 2, x, 0.075, now++);
    print_message("factor of the slow path %.2f\n", sched_pair_factor(&dec->pairs, 2));
    assert_true(sched_pair_factor(&dec->pairs, 2) > 2.4);
    assert_true(fabs(sched_pair_factor(&dec->pairs, 1) - 1.0) < 0.2);
    {
        sched_prediction_t h1, h2;
        sched_handoff_predict(dec, 1, x, &h1);
        sched_handoff_predict(dec, 2, x, &h2);
        assert_true(fabs(h1.mean - 0.025) / 0.025 < 0.2);
        assert_true(fabs(h2.mean - 0.075) / 0.075 < 0.2);
    }
    /* SCHED_PAIR_SLOTS more prefills, the last one's path 3x slower too */
    for (uint64_t u = 100; u < 100 + SCHED_PAIR_SLOTS; u++)
        for (int i = 0; i < 4; i++)
            sched_handoff_observe(dec, u, x, u == 100 + SCHED_PAIR_SLOTS - 1 ? 0.075 : 0.025,
                                  now++);
    assert_true(sched_pair_factor(&dec->pairs, 2) == 1.0); /* the least recently seen: gone */
    assert_true(sched_pair_factor(&dec->pairs, 100 + SCHED_PAIR_SLOTS - 1) > 2.0);
    assert_true(fabs(sched_pair_factor(&dec->pairs, 100) - 1.0) < 0.2);
    sched_instance_unref(dec);
    sched_pool_destroy(pool);
}

/* PD decode legs answered whole: the decode's handoff and TPOT models learn from the sums
 * (each within 15 % of the law at 4000 tokens), and the slow path is still found. */
static void test_whole_pd_answers_teach_handoff_and_tpot(void **s)
{
    static const char *const p[] = {"p-1"}, *const d[] = {"d-1", "d-2"};
    sched_pool_t *pool;
    sched_instance_t *d2;
    sched_prediction_t h, tp;
    double x[SCHED_TRANSFER_DIM];
    int on_p, on_d1;
    (void)s;
    slow_path_prefill = "p-1";
    slow_path_decode = "d-1";
    pool = fleet(p, 1, d, 2);
    train_as(pool, 400, DECODE_WHOLE);
    d2 = sched_pool_get(pool, "d-2");
    sched_transfer_features(x, 4000, 0);
    sched_latency_model_predict(&d2->lat_handoff, x, &h);
    sched_instance_predict_tpot(d2, 4000 + 32, &tp);
    print_message("d-2 handoff %.4f (law 0.0450), tpot %.4f (law 0.0100)\n", h.mean, tp.mean);
    assert_true(fabs(h.mean - 0.045) / 0.045 < 0.15);
    assert_true(fabs(tp.mean - 0.010) / 0.010 < 0.15);
    sched_instance_unref(d2);
    sequential_pd(pool, 20, "p-1", "d-1", &on_p, &on_d1);
    assert_int_equal(on_d1, 0);
    sched_pool_destroy(pool);
}

/* Picks read the pair table while legs rewrite it (slots taken over by other prefills): every
 * factor read is one that was written (within [1/8, 8]), never a torn one. */
typedef struct pair_race {
    sched_instance_t *dec;
    atomic_bool reading, stop;
} pair_race_t;

static void *pair_writer(void *arg)
{
    pair_race_t *r = arg;
    double x[SCHED_TRANSFER_DIM];
    uint64_t now = 1;
    sched_transfer_features(x, 1000, 0);
    while (!atomic_load(&r->reading)) /* overlap the reader, however the threads start */
        sched_yield();
    for (int i = 0; i < 20000; i++) /* 64 prefills through 16 slots: constant rewrites */
        sched_handoff_observe(r->dec, 1 + (uint64_t)(i % 64), x, i % 64 < 32 ? 0.02 : 0.06, now++);
    atomic_store(&r->stop, true);
    return NULL;
}

static void test_pair_table_read_while_rewritten(void **s)
{
    static const char *const p[] = {"p-1"}, *const d[] = {"d-1"};
    sched_pool_t *pool = fleet(p, 1, d, 1);
    pair_race_t r = {.dec = sched_pool_get(pool, "d-1")};
    pthread_t th;
    (void)s;
    atomic_init(&r.reading, false);
    atomic_init(&r.stop, false);
    assert_int_equal(pthread_create(&th, NULL, pair_writer, &r), 0);
    do {
        uint64_t uids[4] = {1, 17, 33, 63};
        double f[4];
        sched_pair_factors(&r.dec->pairs, uids, 4, f);
        for (int k = 0; k < 4; k++)
            assert_true(f[k] >= 0.124 && f[k] <= 8.01);
        atomic_store(&r.reading, true);
    } while (!atomic_load(&r.stop));
    pthread_join(th, NULL);
    sched_instance_unref(r.dec);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slower_prefill_gets_proportionally_less),
        cmocka_unit_test(test_fast_instance_is_not_the_hot_spot),
        cmocka_unit_test(test_decode_tpot_target_respected),
        cmocka_unit_test(test_cold_fleet_is_deterministic),
        cmocka_unit_test(test_large_role_window),
        cmocka_unit_test(test_cached_prefix_from_kv_events),
        cmocka_unit_test(test_estimate),
        cmocka_unit_test(test_pair_chosen_together),
        cmocka_unit_test(test_decode_by_pair_handoff),
        cmocka_unit_test(test_pair_factor_tracks_and_is_bounded),
        cmocka_unit_test(test_whole_pd_answers_teach_handoff_and_tpot),
        cmocka_unit_test(test_pair_table_read_while_rewritten),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
