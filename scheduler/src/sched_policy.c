/*
 * Selection policies. Each runs over one role array of the snapshot with
 * the read lock held and returns a candidate; booking (breaker probe slot,
 * load counters) happens in sched_booking.c.
 *
 * Scans start at a random offset so that equal scores spread instead of
 * piling onto the first instance.
 */
#include <string.h>
#include <time.h>

#include "sched_int.h"
#include "pdb/pdb_clock.h"

static _Atomic uint64_t rng_seed_base;
static _Thread_local uint64_t rng_state;

void sched_rng_seed_base(uint64_t seed)
{
    uint64_t expect = 0;

    if (seed)
        atomic_compare_exchange_strong(&rng_seed_base, &expect, seed);
}

uint64_t *sched_thread_rng(void)
{
    if (!rng_state) {
        static _Atomic uint64_t counter;
        uint64_t base = atomic_load(&rng_seed_base);
        uint64_t n = atomic_fetch_add(&counter, 1) + 1;
        if (!base) {
            uint64_t ns = pdb_clock_mono_ns();
            base = (ns % 1000000000u) * 0x9E3779B97F4A7C15ull ^ (ns / 1000000000u);
        }
        rng_state = (base ^ (n * 0xBF58476D1CE4E5B9ull)) | 1;
    }
    return &rng_state;
}

/* xorshift64* */
uint64_t sched_rng_next(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static size_t rng_below(const sched_pick_ctx_t *ctx, size_t n)
{
    return (size_t)((sched_rng_next(ctx->rng) >> 11) % n);
}

static bool excluded(const sched_instance_t *inst, const sched_pick_ctx_t *ctx)
{
    for (size_t i = 0; i < ctx->n_exclude_uids; i++) {
        if (ctx->exclude_uids[i] == inst->uid)
            return true;
    }
    if (ctx->req) {
        for (size_t i = 0; i < ctx->req->n_exclude_ids; i++) {
            const char *id = ctx->req->exclude_ids[i];
            if (id && strcmp(id, inst->desc.id) == 0)
                return true;
        }
    }
    return false;
}

static inline bool allowed(const sched_instance_t *inst, const sched_pick_ctx_t *ctx)
{
    return sched_instance_selectable(inst, ctx->now_ms) && sched_instance_has_room(inst) &&
           (!ctx->any_exclude || !excluded(inst, ctx)) &&
           (!ctx->req ||
            ((!ctx->req->only_role || inst->roles == ctx->req->only_role) &&
             (!ctx->req->model || sched_models_allow((sched_instance_t *)inst, ctx->req->model))));
}

bool sched_pick_allowed(const sched_instance_t *inst, const sched_pick_ctx_t *ctx)
{
    return allowed(inst, ctx);
}

/* Round-robin among the instances of one model: the model's own turn counter (a hashed
 * slot) over the allowed instances only, so each model's instances take turns evenly
 * whatever the other models' traffic and the order of the instance array. */
static sched_instance_t *pick_round_robin_model(sched_instance_t *const *arr, size_t n, int ridx,
                                                const sched_pick_ctx_t *ctx)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    size_t m = 0, k;

    for (const char *p = ctx->req->model; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (size_t i = 0; i < n; i++)
        m += allowed(arr[i], ctx);
    if (m == 0)
        return NULL;
    k = (size_t)(atomic_fetch_add_explicit(&ctx->pool->rr_model[ridx][h % SCHED_RR_MODEL_SLOTS], 1,
                                           memory_order_relaxed) %
                 m);
    for (size_t i = 0; i < n; i++) {
        if (allowed(arr[i], ctx) && k-- == 0)
            return arr[i];
    }
    return NULL; /* the set changed between the two passes */
}

static sched_instance_t *pick_round_robin(sched_instance_t *const *arr, size_t n, int ridx,
                                          const sched_pick_ctx_t *ctx)
{
    size_t start;

    if (ctx->req && ctx->req->model && ctx->req->model[0])
        return pick_round_robin_model(arr, n, ridx, ctx);
    start = (size_t)(atomic_fetch_add_explicit(&ctx->pool->rr[ridx], 1, memory_order_relaxed) % n);

    for (size_t k = 0, i = start; k < n; k++, i = (i + 1 == n) ? 0 : i + 1) {
        if (allowed(arr[i], ctx))
            return arr[i];
    }
    return NULL;
}

static sched_instance_t *pick_random(sched_instance_t *const *arr, size_t n,
                                     const sched_pick_ctx_t *ctx, const sched_instance_t *avoid)
{
    size_t start;

    for (int tries = 0; tries < 4; tries++) {
        sched_instance_t *c = arr[rng_below(ctx, n)];
        if (c != avoid && allowed(c, ctx))
            return c;
    }
    start = rng_below(ctx, n);
    for (size_t k = 0, i = start; k < n; k++, i = (i + 1 == n) ? 0 : i + 1) {
        if (arr[i] != avoid && allowed(arr[i], ctx))
            return arr[i];
    }
    return NULL;
}

/* Least score over arr[lo, hi); updates *best / *best_score. A decode leg (kv_need) takes
 * only instances with KV headroom; *nofit counts the allowed ones without. */
static inline void scan_least(sched_instance_t *const *arr, size_t lo, size_t hi,
                              const sched_pick_ctx_t *ctx, sched_instance_t **best,
                              uint64_t *best_score, size_t *nofit)
{
    for (size_t i = lo; i < hi; i++) {
        const sched_instance_t *c = arr[i];
        uint64_t s;
        if (i + 8 < hi)
            __builtin_prefetch(arr[i + 8]);
        if (!allowed(c, ctx))
            continue;
        if (ctx->kv_need && !sched_kv_fits(c, ctx->kv_need)) {
            (*nofit)++;
            continue;
        }
        s = sched_instance_score(c, ctx->now_ms);
        if (s < *best_score) {
            *best = arr[i];
            *best_score = s;
        }
    }
}

static sched_instance_t *pick_least(sched_instance_t *const *arr, size_t n,
                                    const sched_pick_ctx_t *ctx, uint64_t *score_out)
{
    sched_instance_t *best = NULL;
    uint64_t best_score = UINT64_MAX;
    size_t start = rng_below(ctx, n), nofit = 0;

    /* random start: equal scores spread instead of piling onto arr[0] */
    scan_least(arr, start, n, ctx, &best, &best_score, &nofit);
    scan_least(arr, 0, start, ctx, &best, &best_score, &nofit);
    if (nofit && best) {
        sched_kv_count_refusals(arr, n, ctx, best);
    } else if (nofit) { /* every allowed decode is full: the one overfilled least */
        best = sched_kv_least_bad(arr, n, ctx);
        best_score = best ? sched_instance_score(best, ctx->now_ms) : UINT64_MAX;
    }
    if (score_out)
        *score_out = best_score;
    return best;
}

static sched_instance_t *pick_power_of_two(sched_instance_t *const *arr, size_t n,
                                           const sched_pick_ctx_t *ctx)
{
    sched_instance_t *a = pick_random(arr, n, ctx, NULL), *b;

    if (!a || n == 1)
        return a;
    b = pick_random(arr, n, ctx, a);
    if (!b)
        return a;
    if (ctx->kv_need) { /* headroom first: a full one of the two loses to one with room */
        bool fa = sched_kv_fits(a, ctx->kv_need), fb = sched_kv_fits(b, ctx->kv_need);
        if (!fa && !fb)
            return pick_least(arr, n, ctx, NULL); /* both full: look at all of them */
        if (fa != fb)
            return fa ? a : b;
    }
    return sched_instance_score(b, ctx->now_ms) < sched_instance_score(a, ctx->now_ms) ? b : a;
}

/* Exact weighted draw by effective weight: two passes over the array. */
static sched_instance_t *pick_weighted_scan(sched_instance_t *const *arr, size_t n,
                                            const sched_pick_ctx_t *ctx)
{
    uint64_t total = 0, r;

    for (size_t i = 0; i < n; i++) {
        if (allowed(arr[i], ctx))
            total += sched_instance_effective_weight(arr[i], ctx->now_ms);
    }
    if (total == 0)
        return NULL;
    r = (sched_rng_next(ctx->rng) >> 11) % total;
    for (size_t i = 0; i < n; i++) {
        uint64_t w;
        if (!allowed(arr[i], ctx))
            continue;
        w = sched_instance_effective_weight(arr[i], ctx->now_ms);
        if (r < w)
            return arr[i];
        r -= w;
    }
    return NULL; /* weights changed between the passes and nothing is left */
}

/*
 * Weighted by effective weight in O(log n): draw by configured weight
 * from the snapshot's running sums, then accept with probability
 * effective / configured weight (0 for instances that cannot be picked).
 * Accepted draws follow the effective weights exactly; after a few
 * rejections (many unusable or overloaded instances) the exact scan
 * decides, which keeps the result exact too.
 */
static sched_instance_t *pick_weighted(sched_instance_t *const *arr, const uint64_t *wsum, size_t n,
                                       const sched_pick_ctx_t *ctx)
{
    uint64_t total = wsum[n - 1];

    for (int tries = 0; tries < 16; tries++) {
        uint64_t r = (sched_rng_next(ctx->rng) >> 11) % total;
        size_t lo = 0, hi = n - 1;
        sched_instance_t *c;
        uint32_t eff, full;
        while (lo < hi) { /* first i with wsum[i] > r */
            size_t mid = lo + (hi - lo) / 2;
            if (wsum[mid] > r)
                hi = mid;
            else
                lo = mid + 1;
        }
        c = arr[lo];
        if (!allowed(c, ctx))
            continue;
        eff = sched_instance_effective_weight(c, ctx->now_ms);
        full = c->weight * 1024u;
        if (eff >= full || (sched_rng_next(ctx->rng) >> 11) % full < eff)
            return c;
    }
    return pick_weighted_scan(arr, n, ctx);
}

/* Role arrays are sorted by uid (uids only grow, snapshots keep order). */
static sched_instance_t *find_uid(sched_instance_t *const *arr, size_t n, uint64_t uid)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (arr[mid]->uid == uid)
            return arr[mid];
        if (arr[mid]->uid < uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static sched_instance_t *pick_prefix(sched_instance_t *const *arr, size_t n, int ridx,
                                     const sched_pick_ctx_t *ctx)
{
    uint64_t least_score, uids[2];
    sched_instance_t *least, *match = NULL;
    uint64_t match_score = UINT64_MAX;
    sched_prefix_index_t *idx = ctx->pool->prefix[ridx];

    if (idx && ctx->block_hashes && ctx->n_blocks &&
        sched_prefix_match(idx, ctx->block_hashes, ctx->n_blocks, uids) > 0) {
        for (int k = 0; k < 2; k++) {
            sched_instance_t *c;
            uint64_t s;
            if (!uids[k])
                continue;
            c = find_uid(arr, n, uids[k]);
            if (!c || !allowed(c, ctx) || (ctx->kv_need && !sched_kv_fits(c, ctx->kv_need)))
                continue;
            s = sched_instance_score(c, ctx->now_ms);
            if (s < match_score) {
                match = c;
                match_score = s;
            }
        }
    }
    /* A match loaded less than the slack is within it of any least load:
     * no need to scan. */
    if (match && match_score <= ctx->pool->prefix_slack)
        return match;
    least = pick_least(arr, n, ctx, &least_score);
    /* Affinity unless the match is overloaded compared with the least loaded. */
    if (match && least && match_score <= least_score + ctx->pool->prefix_slack)
        return match;
    return least;
}

sched_instance_t *sched_policy_pick(const sched_snapshot_t *snap, int ridx, sched_policy_t policy,
                                    const sched_pick_ctx_t *ctx)
{
    sched_instance_t *const *arr = snap->role[ridx];
    size_t n = snap->n_role[ridx];

    if (n == 0)
        return NULL;
    switch (policy) {
    case SCHED_POLICY_ROUND_ROBIN:
        return pick_round_robin(arr, n, ridx, ctx);
    case SCHED_POLICY_RANDOM:
        return pick_random(arr, n, ctx, NULL);
    case SCHED_POLICY_LEAST_LOAD:
        return pick_least(arr, n, ctx, NULL);
    case SCHED_POLICY_POWER_OF_TWO:
        return pick_power_of_two(arr, n, ctx);
    case SCHED_POLICY_PREFIX_AWARE:
        return pick_prefix(arr, n, ridx, ctx);
    case SCHED_POLICY_WEIGHTED:
        return pick_weighted(arr, snap->wsum[ridx], n, ctx);
    case SCHED_POLICY_PRECISE_PREFIX:
        return sched_kvev_pick(arr, n, ridx, ctx);
    case SCHED_POLICY_SLO:
        return sched_slo_pick(arr, n, ridx, ctx);
    }
    return NULL;
}

sched_instance_t *sched_policy_least_in_zone(const sched_snapshot_t *snap, int ridx,
                                             const char *zone, const sched_pick_ctx_t *ctx,
                                             uint64_t *score_out)
{
    sched_instance_t *best = NULL;
    uint64_t best_score = UINT64_MAX;

    for (size_t i = 0; i < snap->n_role[ridx]; i++) {
        sched_instance_t *c = snap->role[ridx][i];
        uint64_t s;
        if (strcmp(c->desc.zone, zone) != 0 || !allowed(c, ctx) ||
            (ctx->kv_need && !sched_kv_fits(c, ctx->kv_need)))
            continue;
        s = sched_instance_score(c, ctx->now_ms);
        if (s < best_score) {
            best = c;
            best_score = s;
        }
    }
    *score_out = best_score;
    return best;
}

sched_instance_t *sched_policy_least(sched_instance_t *const *arr, size_t n,
                                     const sched_pick_ctx_t *ctx, uint64_t *score_out)
{
    return pick_least(arr, n, ctx, score_out);
}
