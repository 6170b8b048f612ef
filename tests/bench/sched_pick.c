/*
 * sched-pick: median and p99 latency of one scheduler pick (choice plus
 * booking of one decode leg) for every policy at 10 / 100 / 1,000 /
 * 10,000 instances with random loads, of one PD booking (both legs: slo weighs
 * the prefills with the decodes' learnt pair handoffs), and of the prefix-aware
 * match of a 4,096-token prompt against a warm index.
 *
 * Usage: sched-pick [--quick] [--policy NAME] [--instances N]
 *   --quick      fewer iterations
 *   --policy     only this policy (and no match table)
 *   --instances  only this pool size
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched_int.h"

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static void quiet(void *arg, sched_log_level_t level, const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg;
}

static void report(const char *what, size_t n_inst, uint64_t *samples, size_t n)
{
    qsort(samples, n, sizeof(*samples), cmp_u64);
    printf("%-14s %7zu %10.2f %10.2f\n", what, n_inst, samples[n / 2] / 1000.0,
           samples[(size_t)((double)n * 0.99)] / 1000.0);
    fflush(stdout);
}

static sched_pool_t *make_pool_role(sched_policy_t policy, size_t n, unsigned seed,
                                    sched_role_t role)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;
    char err[256];

    sched_config_init(&cfg);
    cfg.prefill_policy = policy;
    cfg.decode_policy = policy;
    cfg.health_interval_ms = 0;
    cfg.metrics_scrape_interval_ms = 0;
    cfg.log = quiet;
    if (sched_pool_create(&cfg, &pool) != SCHED_OK) {
        fprintf(stderr, "sched-pick: pool create failed\n");
        exit(1);
    }
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        sched_instance_desc_t d;
        char id[32], url[64];
        sched_instance_t *inst;
        sched_instance_desc_init(&d);
        snprintf(id, sizeof(id), "d%zu", i);
        snprintf(url, sizeof(url), "http://10.%zu.%zu.%zu:8000", i >> 16, (i >> 8) & 255, i & 255);
        d.id = id;
        d.url = url;
        d.role = role;
        d.weight = 1 + (unsigned)(rand() % 4);
        if (sched_pool_add(pool, &d, err, sizeof(err)) != SCHED_OK) {
            fprintf(stderr, "sched-pick: add failed: %s\n", err);
            exit(1);
        }
        inst = sched_pool_get(pool, id);
        atomic_store(&inst->inflight, (uint32_t)(rand() % 64));
        atomic_store(&inst->kv_tokens, (uint64_t)(rand() % 200000));
        sched_instance_unref(inst);
    }
    return pool;
}

static sched_pool_t *make_pool(sched_policy_t policy, size_t n, unsigned seed)
{
    return make_pool_role(policy, n, seed, SCHED_ROLE_DECODE);
}

/* <max_iter> bookings of a 1,024-token request by <book>, each destroyed at once, timed into
 * <samples> (after 100 unmeasured ones). */
typedef sched_status_t (*book_fn)(sched_pool_t *, const sched_request_t *, sched_booking_t **);
static void time_bookings(sched_pool_t *pool, book_fn book, size_t max_iter, uint64_t *samples)
{
    for (size_t i = 0; i < max_iter + 100; i++) {
        sched_request_t req = {.prompt_tokens = 1024, .max_tokens = 256};
        sched_booking_t *b = NULL;
        uint64_t t0 = now_ns(), t1;
        if (book(pool, &req, &b) != SCHED_OK) {
            fprintf(stderr, "sched-pick: no instance to book\n");
            exit(1);
        }
        t1 = now_ns();
        sched_booking_destroy(&b);
        if (i >= 100)
            samples[i - 100] = t1 - t0;
    }
}

/* One prefill pick with prefill work open on the instances (4 legs each, booked by the
 * policy itself): least-load counts them, slo replays each candidate's queue in engine steps
 * to predict the new prompt's answer. */
static void prefill_picks(size_t max_iter, int only_policy, size_t only_size)
{
    static const size_t sizes[] = {10, 100, 1000};
    static const sched_policy_t pols[] = {SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_SLO};

    printf("\none prefill pick with 4 open prefill legs per instance, microseconds\n");
    printf("%-14s %7s %10s %10s\n", "policy", "inst", "median", "p99");
    for (size_t k = 0; k < sizeof(pols) / sizeof(pols[0]); k++) {
        if (only_policy >= 0 && (int)pols[k] != only_policy)
            continue;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            size_t n = only_size ? only_size : sizes[s], held_n = n * 4;
            sched_pool_t *pool = make_pool_role(pols[k], n, 42, SCHED_ROLE_PREFILL);
            sched_booking_t **held = calloc(held_n, sizeof(*held));
            uint64_t *samples = malloc(max_iter * sizeof(uint64_t));
            if (!held || !samples) {
                fprintf(stderr, "sched-pick: out of memory\n");
                exit(1);
            }
            for (size_t i = 0; i < held_n; i++) {
                sched_request_t req = {.prompt_tokens = 200 + (uint32_t)(i * 7919 % 3000)};
                if (sched_book_prefill(pool, &req, &held[i]) != SCHED_OK) {
                    fprintf(stderr, "sched-pick: no prefill instance\n");
                    exit(1);
                }
            }
            time_bookings(pool, sched_book_prefill, max_iter, samples);
            report(sched_policy_name(pols[k]), n, samples, max_iter);
            for (size_t i = 0; i < held_n; i++)
                sched_booking_destroy(&held[i]);
            free(held);
            free(samples);
            sched_pool_destroy(pool);
            if (only_size)
                break;
        }
    }
}

/* One PD booking (prefill and decode chosen, both legs booked) on <n> prefills and <n>
 * decodes with random loads; every decode's handoff model warm and its pair table full (16
 * prefills each), so slo weighs its few best prefills against every decode's pair factor. */
static void pd_picks(size_t max_iter, int only_policy, size_t only_size)
{
    static const size_t sizes[] = {10, 100, 1000};
    static const sched_policy_t pols[] = {SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_SLO};

    printf("\none PD booking (prefill + decode) per role size, microseconds\n");
    printf("%-14s %7s %10s %10s\n", "policy", "inst", "median", "p99");
    for (size_t k = 0; k < sizeof(pols) / sizeof(pols[0]); k++) {
        if (only_policy >= 0 && (int)pols[k] != only_policy)
            continue;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            size_t n = only_size ? only_size : sizes[s];
            sched_pool_t *pool = make_pool_role(pols[k], n, 42, SCHED_ROLE_DECODE);
            uint64_t *samples = malloc(max_iter * sizeof(uint64_t));
            char err[256];
            if (!samples) {
                fprintf(stderr, "sched-pick: out of memory\n");
                exit(1);
            }
            for (size_t i = 0; i < n; i++) {
                sched_instance_desc_t d;
                char id[32], url[64];
                sched_instance_desc_init(&d);
                snprintf(id, sizeof(id), "p%zu", i);
                snprintf(url, sizeof(url), "http://10.200.%zu.%zu:8000", i >> 8, i & 255);
                d.id = id;
                d.url = url;
                d.role = SCHED_ROLE_PREFILL;
                if (sched_pool_add(pool, &d, err, sizeof(err)) != SCHED_OK) {
                    fprintf(stderr, "sched-pick: add failed: %s\n", err);
                    exit(1);
                }
            }
            for (size_t i = 0; i < n; i++) {
                char id[32];
                double x[SCHED_TRANSFER_DIM];
                sched_instance_t *dec;
                snprintf(id, sizeof(id), "d%zu", i);
                dec = sched_pool_get(pool, id);
                sched_transfer_features(x, 1024, 8);
                for (uint64_t u = 1; u <= 16 + 8; u++) /* its own model, then 16 pairs */
                    sched_handoff_observe(dec, u <= 8 ? 0 : n + 1 + (u * 7 + i) % n, x,
                                          0.02 + 0.001 * (double)(u % 5), u);
                sched_instance_unref(dec);
            }
            time_bookings(pool, sched_book_pd, max_iter, samples);
            report(sched_policy_name(pols[k]), n, samples, max_iter);
            free(samples);
            sched_pool_destroy(pool);
            if (only_size)
                break;
        }
    }
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {10, 100, 1000, 10000};
    bool quick = false;
    int only_policy = -1;
    size_t only_size = 0;
    uint32_t *tokens;
    uint64_t *samples;
    size_t max_iter;

    for (int a = 1; a < argc; a++) {
        sched_policy_t pol;
        if (strcmp(argv[a], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[a], "--policy") == 0 && a + 1 < argc &&
                   sched_policy_parse(argv[a + 1], &pol) == SCHED_OK) {
            only_policy = (int)pol;
            a++;
        } else if (strcmp(argv[a], "--instances") == 0 && a + 1 < argc && atol(argv[a + 1]) > 0) {
            only_size = (size_t)atol(argv[++a]);
        } else {
            fprintf(stderr, "usage: sched-pick [--quick] [--policy NAME] [--instances N]\n");
            return 2;
        }
    }
    max_iter = quick ? 2000 : 20000;
    tokens = malloc(4096 * sizeof(uint32_t));
    samples = malloc(max_iter * sizeof(uint64_t));
    if (!tokens || !samples)
        return 1;
    for (size_t i = 0; i < 4096; i++)
        tokens[i] = (uint32_t)(i * 2654435761u);

    printf("one decode pick (choice + booking), microseconds\n");
    printf("%-14s %7s %10s %10s\n", "policy", "inst", "median", "p99");
    for (int p = 0; p < SCHED_POLICY_COUNT; p++) {
        if (only_policy >= 0 && p != only_policy)
            continue;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            size_t n = only_size ? only_size : sizes[s];
            if (only_size && s > 0)
                break;
            size_t iters = n >= 10000 ? max_iter / 10 : max_iter;
            sched_pool_t *pool = make_pool((sched_policy_t)p, n, 42);
            sched_request_t req = {.prompt_tokens = 4096, .max_tokens = 256};
            if (p == SCHED_POLICY_PREFIX_AWARE) {
                req.tokens = tokens;
                req.n_tokens = 4096;
            }
            for (size_t i = 0; i < iters + 100; i++) {
                sched_booking_t *b = NULL;
                uint64_t t0, t1;
                if (p == SCHED_POLICY_PREFIX_AWARE)
                    tokens[4095] = (uint32_t)(i % 64); /* 64 prompts sharing 255 blocks */
                t0 = now_ns();
                if (sched_book_decode(pool, &req, &b) != SCHED_OK) {
                    fprintf(stderr, "sched-pick: no instance\n");
                    return 1;
                }
                t1 = now_ns();
                sched_booking_destroy(&b);
                if (i >= 100)
                    samples[i - 100] = t1 - t0;
            }
            report(sched_policy_name((sched_policy_t)p), n, samples, iters);
            sched_pool_destroy(pool);
        }
    }

    prefill_picks(max_iter, only_policy, only_size);
    pd_picks(max_iter, only_policy, only_size);

    /* Prefix match of a 4,096-token prompt (hash 256 blocks + longest match). */
    if (only_policy < 0) {
        sched_prefix_index_t *idx;
        uint64_t hashes[SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST], uids[2];
        sched_request_t req = {.tokens = tokens, .n_tokens = 4096};
        size_t iters = max_iter;

        if (sched_prefix_create(65536, &idx) != SCHED_OK)
            return 1;
        /* warm: 200 prompts of 4,096 tokens, 4 distinct systems prefixes */
        for (uint32_t k = 0; k < 200; k++) {
            size_t n;
            tokens[0] = k % 4;
            tokens[2048] = k;
            n = sched_prefix_hash_request(&req, 16, hashes, SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST);
            sched_prefix_record(idx, hashes, n, k + 1);
        }
        printf("\nprefix-aware match of a 4,096-token prompt, microseconds\n");
        printf("%-14s %7s %10s %10s\n", "case", "blocks", "median", "p99");
        for (int c = 0; c < 3; c++) {
            const char *name = c == 0 ? "full-hit" : c == 1 ? "half-hit" : "miss";
            for (size_t i = 0; i < iters; i++) {
                size_t n;
                uint64_t t0, t1;
                tokens[0] = c == 2 ? 1000 + (uint32_t)i : (uint32_t)(i % 4);
                tokens[2048] = c == 0 ? (uint32_t)(i % 200 / 4 * 4 + i % 4) : 5000;
                t0 = now_ns();
                n = sched_prefix_hash_request(&req, 16, hashes,
                                              SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST);
                sched_prefix_match(idx, hashes, n, uids);
                t1 = now_ns();
                samples[i] = t1 - t0;
            }
            report(name, 256, samples, iters);
        }
        sched_prefix_destroy(idx);
    }
    free(tokens);
    free(samples);
    return 0;
}
