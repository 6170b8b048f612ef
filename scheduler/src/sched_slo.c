/*
 * The `slo` policy: choose by predicted time, from the instances' latency models
 * (sched_predict.c, learnt through bookings).
 *
 *  - prefill: the least predicted time to first token at the models' p90 (the prompt tokens
 *    each instance would compute - less its cached leading blocks when the fleet publishes
 *    KV events - with the prefill work still ahead on it), so a slower instance gets
 *    proportionally less, one that holds a long queue is passed over, and one that holds
 *    the prompt's prefix is preferred by what it saves;
 *  - decode: among the decodes whose predicted time per output token (p90, with this
 *    request's KV running on them) meets the request's target, the one its KV reaches
 *    soonest from the booked prefill (the decode's handoff model with its running batch,
 *    times the pair's factor: sched_pair.c), equal ones by load; without a prefill, the
 *    least loaded; when none meets the target, the fastest (best effort: whether to serve it
 *    at all is the caller's choice, sched_slo_estimate());
 *  - the pair together: a request whose two legs are booked at once takes, of the
 *    SLO_PAIR_PREFILLS best prefills, the one with the least ttft + handoff to its best
 *    decode (llm-d's PD SLO pair optimiser adds the same parts; it scores all N x M pairs,
 *    we the few prefills that can win, so a pick stays a few microseconds), and the decode
 *    pick then finds that decode;
 *  - bounded load on both: an instance holding more than SLO_LOAD_BOUND times its share
 *    of the role's open legs is passed over while another is not, so one fast instance
 *    does not become the hot spot that its own queue then makes slow;
 *  - KV headroom on decodes: a decode where this request would not fit (sched_kv_fits: its
 *    projected KV plus this one's prompt + max_tokens over its capacity) is passed over
 *    while another has room, counted as a refusal on it; when none has, the least-bad one
 *    (sched_kv_least_bad) - the engine would preempt, but refusing is the caller's call;
 *  - ties go to the lower uid (deterministic: an idle cold fleet fills in uid order, and
 *    each booking's queued tokens then move the next one on);
 *  - at most SLO_WINDOW instances are evaluated per pick (a window at a random offset in a
 *    larger role), so the cost stays flat with the fleet's size.
 */
#include <string.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

/* Most open legs an instance holds, in shares of the role's mean (bounded-load choice). */
#define SLO_LOAD_BOUND 1.5
/* Instances evaluated per pick: beyond this many, a window of consecutive ones from a random
 * offset (the arrays are in uid order, which says nothing of speed or load), so that a pick
 * costs the same at 1,000 instances as at 64. */
#define SLO_WINDOW 64
/* The same for an estimate of what the fleet can do (it refuses requests: a wider sample,
 * exact up to this many instances of a role). */
#define SLO_ESTIMATE_WINDOW 256

/* The instances one pick looks at: arr[(start + i) % n] for i < len. */
typedef struct slo_window {
    sched_instance_t *const *arr;
    size_t n, start, len;
} slo_window_t;

static inline sched_instance_t *at(const slo_window_t *w, size_t i)
{
    size_t k = w->start + i;
    return w->arr[k < w->n ? k : k - w->n];
}

/* The ceiling of open legs per instance: SLO_LOAD_BOUND times the window's mean, this request
 * counted (over all of its instances: one cheap pass over the hot counters). */
static uint32_t load_bound(const slo_window_t *w)
{
    uint64_t total = 1; /* this request */

    for (size_t i = 0; i < w->len; i++)
        total += atomic_load_explicit(&at(w, i)->inflight, memory_order_relaxed);
    return (uint32_t)((double)total / (double)w->len * SLO_LOAD_BOUND + 0.999);
}

static bool better(double s, const sched_instance_t *c, double best_s, const sched_instance_t *best)
{
    return best == NULL || s < best_s || (s == best_s && c->uid < best->uid);
}

/* The score of a candidate by its prediction: an idle instance observed fewer than
 * SCHED_PREDICT_SCORED_AFTER times is tried first (its model is its priors: without trying
 * it the fleet's others would never be learnt or compared). Only while idle: a cold
 * instance's priors know nothing of its speed, and sending it one request after another on
 * them is how a slow engine gets a long queue before its model has said it is slow. */
static double explore_score(const sched_instance_t *c, const sched_prediction_t *p, double s)
{
    /* a thousandth: below any tried instance, still ordered by what is queued on it */
    return p->observed < SCHED_PREDICT_SCORED_AFTER &&
                   atomic_load_explicit(&c->inflight, memory_order_relaxed) == 0
               ? s * 1e-3
               : s;
}

/* The prompt tokens each instance of the window would compute: all of them, less the
 * leading blocks its engine reports cached when the fleet publishes KV events (precise-
 * prefix's index; the prompt's token ids are hashed once per booking). At least one: an
 * engine computes the last prompt token even on a full hit. */
static void window_uncached(const slo_window_t *w, const sched_pick_ctx_t *ctx,
                            uint64_t uncached[SLO_WINDOW])
{
    uint64_t prompt = ctx->req ? ctx->req->prompt_tokens : 0, uids[SLO_WINDOW];
    size_t depth[SLO_WINDOW], n = w->len < SLO_WINDOW ? w->len : SLO_WINDOW;
    double weighted[SLO_WINDOW];
    uint32_t bs;

    for (size_t i = 0; i < n; i++)
        uncached[i] = prompt;
    if (!ctx->pool->kvev_index || !ctx->kv_keys || ctx->n_kv_keys == 0 || w->len > SLO_WINDOW)
        return;
    bs = sched_kvev_index_block_size(ctx->pool->kvev_index, 0);
    for (size_t i = 0; i < n; i++)
        uids[i] = at(w, i)->uid;
    sched_kvev_index_match(ctx->pool->kvev_index, ctx->kv_keys, ctx->n_kv_keys, uids, n, 1.0, depth,
                           weighted);
    for (size_t i = 0; i < n; i++) {
        uint64_t cached = (uint64_t)depth[i] * bs;
        uncached[i] = cached >= prompt ? 1 : prompt - cached;
    }
}

/* What a decode is to a request: no room for its KV, a candidate (within the load bound and
 * meeting its TPOT target, or untried), or only a fallback (over the bound or too slow). */
typedef enum { DECODE_NOFIT, DECODE_MEETS, DECODE_FALLBACK } decode_fit_t;

static decode_fit_t decode_fit(const sched_instance_t *c, const sched_pick_ctx_t *ctx,
                               uint64_t kv_need, uint32_t bound, sched_prediction_t *tpot)
{
    const sched_request_t *req = ctx->req;
    double target = req && req->slo_tpot_ms ? req->slo_tpot_ms / 1000.0 : 0.0;
    uint64_t kv = req ? (uint64_t)req->prompt_tokens + req->max_tokens : 0;

    if (!sched_kv_fits(c, kv_need))
        return DECODE_NOFIT;
    sched_instance_predict_tpot(c, kv, tpot);
    if (atomic_load_explicit(&c->inflight, memory_order_relaxed) + 1 <= bound &&
        (target == 0.0 || tpot->upper <= target || tpot->observed == 0))
        return DECODE_MEETS;
    return DECODE_FALLBACK;
}

/* The handoff to <c> of a request's KV after a prefill on <prefill_uid>, as its decode pick
 * predicts it (the others running on it now). */
static void handoff_to(const sched_instance_t *c, uint64_t prefill_uid, const sched_pick_ctx_t *ctx,
                       sched_prediction_t *out)
{
    double x[SCHED_TRANSFER_DIM];

    sched_transfer_features(x, ctx->req ? ctx->req->prompt_tokens : 0,
                            atomic_load_explicit(&c->inflight, memory_order_relaxed));
    sched_handoff_predict(c, prefill_uid, x, out);
}

/* Prefills whose pairings with the decodes are weighed (the best by their own score). */
#define SLO_PAIR_PREFILLS 4

/* The decodes a PD request's decode pick would take now (DECODE_MEETS over its window), for
 * choosing the prefill together with them. 0 when none: the decode is best effort then and
 * the prefill is chosen on its own. */
static size_t pair_candidates(const sched_pick_ctx_t *ctx, sched_instance_t *out[SLO_WINDOW])
{
    const sched_snapshot_t *snap = ctx->pool->snap;
    slo_window_t w = {.arr = snap->role[SCHED_RIDX_DECODE], .n = snap->n_role[SCHED_RIDX_DECODE]};
    const sched_request_t *req = ctx->req;
    uint64_t kv_need = req ? (uint64_t)req->prompt_tokens + req->max_tokens : 0;
    uint32_t bound;
    size_t n = 0;

    if (w.n == 0)
        return 0;
    w.len = w.n < SLO_WINDOW ? w.n : SLO_WINDOW;
    if (w.n > SLO_WINDOW)
        w.start = (size_t)((sched_rng_next(ctx->rng) >> 11) % w.n);
    bound = load_bound(&w);
    for (size_t i = 0; i < w.len; i++) {
        sched_instance_t *c = at(&w, i);
        sched_prediction_t tpot;
        if (sched_pick_allowed(c, ctx) && decode_fit(c, ctx, kv_need, bound, &tpot) == DECODE_MEETS)
            out[n++] = c;
    }
    return n;
}

/* Of the best prefills by their own score, the one whose first token comes soonest with the
 * KV handed to its best decode: min over (p, d) of ttft(p) + handoff(p, d), which is the
 * pair a PD request is predicted to start soonest on (the decode pick then takes the d). */
static sched_instance_t *pair_best(sched_instance_t *const *top, const double *top_s, size_t n_top,
                                   const sched_pick_ctx_t *ctx)
{
    sched_instance_t *dec[SLO_WINDOW], *best = NULL;
    uint64_t uids[SLO_PAIR_PREFILLS];
    double h[SLO_PAIR_PREFILLS], best_j = 0.0;
    size_t n_dec = pair_candidates(ctx, dec);

    if (n_dec == 0)
        return top[0];
    for (size_t i = 0; i < n_top; i++) {
        uids[i] = top[i]->uid;
        h[i] = -1.0;
    }
    for (size_t d = 0; d < n_dec; d++) {
        sched_prediction_t base; /* the decode's own; each pair's factor on it */
        double f[SLO_PAIR_PREFILLS];
        handoff_to(dec[d], 0, ctx, &base);
        sched_pair_factors(&dec[d]->pairs, uids, n_top, f);
        for (size_t i = 0; i < n_top; i++) {
            if (h[i] < 0.0 || base.mean * f[i] < h[i])
                h[i] = base.mean * f[i];
        }
    }
    for (size_t i = 0; i < n_top; i++) {
        if (best == NULL || top_s[i] + h[i] < best_j)
            best = top[i], best_j = top_s[i] + h[i];
    }
    return best;
}

static sched_instance_t *pick_prefill(const slo_window_t *w, const sched_pick_ctx_t *ctx)
{
    uint32_t bound = load_bound(w);
    sched_instance_t *over = NULL, *top[SLO_PAIR_PREFILLS];
    double over_s = 0.0, top_s[SLO_PAIR_PREFILLS];
    size_t n_top = 0, keep = ctx->pair_decodes ? SLO_PAIR_PREFILLS : 1;
    uint64_t uncached[SLO_WINDOW];

    window_uncached(w, ctx, uncached);
    for (size_t i = 0; i < w->len; i++) {
        sched_instance_t *c = at(w, i);
        sched_prediction_t p;
        double s;
        size_t k;
        if (!sched_pick_allowed(c, ctx))
            continue;
        sched_instance_predict_ttft_at(c, i < SLO_WINDOW ? uncached[i] : uncached[0], ctx->now_ms,
                                       &p);
        if (atomic_load_explicit(&c->inflight, memory_order_relaxed) + 1 > bound) {
            if (better(p.upper, c, over_s, over))
                over = c, over_s = p.upper;
            continue;
        }
        /* kept in order, best first: the <keep> best by their own score */
        s = explore_score(c, &p, p.upper);
        for (k = n_top; k > 0 && better(s, c, top_s[k - 1], top[k - 1]); k--) {
            if (k < keep) {
                top[k] = top[k - 1];
                top_s[k] = top_s[k - 1];
            }
        }
        if (k < keep) {
            top[k] = c;
            top_s[k] = s;
            if (n_top < keep)
                n_top++;
        }
    }
    if (n_top == 0)
        return over;
    return n_top > 1 ? pair_best(top, top_s, n_top, ctx) : top[0];
}

/* Decode candidates compared by <s>; equal ones by what they hold, then by uid. */
static bool better_decode(double s, const sched_instance_t *c, double best_s,
                          const sched_instance_t *best, uint64_t now_ms)
{
    uint64_t a, b;

    if (best == NULL || s != best_s)
        return best == NULL || s < best_s;
    a = sched_instance_score(c, now_ms);
    b = sched_instance_score(best, now_ms);
    return a < b || (a == b && c->uid < best->uid);
}

static sched_instance_t *pick_decode(const slo_window_t *w, const sched_pick_ctx_t *ctx)
{
    uint32_t bound = load_bound(w);
    uint64_t uncached[SLO_WINDOW];
    sched_instance_t *meets = NULL, *fastest = NULL, *full = NULL, *chosen;
    double meets_s = 0.0, fastest_s = 0.0, full_r = 0.0;
    size_t nofit = 0;

    if (ctx->whole_request)
        window_uncached(w, ctx, uncached);

    for (size_t i = 0; i < w->len; i++) {
        sched_instance_t *c = at(w, i);
        sched_prediction_t p;
        double s;
        decode_fit_t fit;
        if (!sched_pick_allowed(c, ctx))
            continue;
        fit = decode_fit(c, ctx, ctx->kv_need, bound, &p);
        if (fit == DECODE_NOFIT) { /* no room: only the least-bad, if all full */
            double r = sched_kv_fill_ratio(c, ctx->kv_need);
            if (full == NULL || r < full_r || (r == full_r && c->uid < full->uid))
                full = c, full_r = r;
            nofit++;
            continue;
        }
        if (ctx->whole_request) {
            /* It runs the prefill too: the least predicted time to first token wins. */
            sched_prediction_t t;
            sched_instance_predict_ttft_at(c, i < SLO_WINDOW ? uncached[i] : uncached[0],
                                           ctx->now_ms, &t);
            s = explore_score(c, &t, t.upper);
        } else if (p.observed < SCHED_PREDICT_SCORED_AFTER) {
            s = 0.0; /* untried: try it */
        } else if (ctx->pair_prefill_uid != 0) {
            /* After its prefill: the soonest KV handoff from that prefill to a decode (its
             * path, its running batch), which is this request's time to first token beyond
             * the prefill's. */
            sched_prediction_t h;
            handoff_to(c, ctx->pair_prefill_uid, ctx, &h);
            s = h.mean;
        } else {
            s = (double)sched_instance_score(c, ctx->now_ms);
        }
        if (fit == DECODE_MEETS && better_decode(s, c, meets_s, meets, ctx->now_ms))
            meets = c, meets_s = s;
        if (better(p.upper, c, fastest_s, fastest))
            fastest = c, fastest_s = p.upper;
    }
    chosen = meets ? meets : fastest;
    if (chosen && nofit) {
        for (size_t i = 0; i < w->len; i++) {
            sched_instance_t *c = at(w, i);
            if (sched_pick_allowed(c, ctx) && !sched_kv_fits(c, ctx->kv_need))
                atomic_fetch_add_explicit(&c->kv_refusals, 1, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&ctx->pool->kv_refusals, 1, memory_order_relaxed);
    } else if (!chosen && full) {
        atomic_fetch_add_explicit(&ctx->pool->kv_overcommit, 1, memory_order_relaxed);
        chosen = full;
    }
    return chosen;
}

sched_instance_t *sched_slo_pick(sched_instance_t *const *arr, size_t n, int ridx,
                                 const sched_pick_ctx_t *ctx)
{
    slo_window_t w = {.arr = arr, .n = n, .start = 0, .len = n};
    sched_instance_t *c;

    if (n > SLO_WINDOW) {
        w.start = (size_t)((sched_rng_next(ctx->rng) >> 11) % n);
        w.len = SLO_WINDOW;
    }
    c = ridx == SCHED_RIDX_PREFILL ? pick_prefill(&w, ctx) : pick_decode(&w, ctx);
    if (c == NULL && w.len < n) { /* none allowed in the window (a rare model): all of them */
        w.start = 0;
        w.len = n;
        c = ridx == SCHED_RIDX_PREFILL ? pick_prefill(&w, ctx) : pick_decode(&w, ctx);
    }
    return c;
}

sched_status_t sched_slo_estimate(sched_pool_t *pool, const sched_request_t *req,
                                  sched_slo_estimate_t *out)
{
    sched_pick_ctx_t ctx;
    sched_slo_estimate_t e = {0};
    bool have[2] = {false, false};
    double handoff_s = -1.0;
    uint64_t *keys = NULL, prefill_uid = 0; /* the prefill a pick would choose, when known */

    if (!pool || !req || !out)
        return SCHED_ERR_INVALID;
    memset(&ctx, 0, sizeof(ctx));
    ctx.pool = pool;
    ctx.req = req;
    ctx.now_ms = sched_pool_now(pool);
    ctx.rng = sched_thread_rng();
    ctx.any_exclude = req->n_exclude_ids > 0;
    e.cold = true;
    pthread_rwlock_rdlock(&pool->lock);
    /* the prompt's block keys, to count what each prefill has cached (as a pick does) */
    if (pool->kvev_index && sched_kvev_request_keys(pool, req, &keys, &ctx.n_kv_keys) == SCHED_OK &&
        keys)
        ctx.kv_keys = keys;
    for (int r = 0; r < 2; r++) {
        const sched_snapshot_t *snap = pool->snap;
        slo_window_t w = {.arr = snap->role[r], .n = snap->n_role[r], .len = snap->n_role[r]};
        double *best = r == SCHED_RIDX_PREFILL ? &e.ttft_s : &e.tpot_s;
        uint64_t uncached[SLO_WINDOW];
        if (w.n > SLO_ESTIMATE_WINDOW) {
            w.start = (size_t)((sched_rng_next(ctx.rng) >> 11) % w.n);
            w.len = SLO_ESTIMATE_WINDOW;
        }
        if (r == SCHED_RIDX_PREFILL && w.len <= SLO_WINDOW) {
            /* The instance a pick would choose now (bounded load, exploration and all): what
             * a request admitted on this estimate is then sent to. */
            sched_instance_t *c = pick_prefill(&w, &ctx);
            if (c != NULL) {
                sched_prediction_t p = {0};
                window_uncached(&w, &ctx, uncached);
                for (size_t i = 0; i < w.len; i++)
                    if (at(&w, i) == c)
                        sched_instance_predict_ttft_at(c, uncached[i], ctx.now_ms, &p);
                *best = p.mean;
                have[r] = true;
                e.cold = e.cold && p.observed == 0;
                prefill_uid = c->uid;
            }
            continue;
        }
        for (size_t i = 0; i < w.len; i++) {
            sched_instance_t *c = at(&w, i);
            sched_prediction_t p;
            if (r == SCHED_RIDX_PREFILL && i % SLO_WINDOW == 0) { /* the next SLO_WINDOW */
                slo_window_t part = {.arr = w.arr,
                                     .n = w.n,
                                     .start = (w.start + i) % w.n,
                                     .len = w.len - i < SLO_WINDOW ? w.len - i : SLO_WINDOW};
                window_uncached(&part, &ctx, uncached);
            }
            if (!sched_pick_allowed(c, &ctx))
                continue;
            if (r == SCHED_RIDX_PREFILL)
                sched_instance_predict_ttft_at(c, uncached[i % SLO_WINDOW], ctx.now_ms, &p);
            else {
                sched_prediction_t h;
                sched_instance_predict_tpot(c, (uint64_t)req->prompt_tokens + req->max_tokens, &p);
                /* after a prefill, the KV handed over to this decode before its first token */
                handoff_to(c, prefill_uid, &ctx, &h);
                if (h.observed >= SCHED_PREDICT_SCORED_AFTER &&
                    (handoff_s < 0.0 || h.mean < handoff_s))
                    handoff_s = h.mean;
            }
            if (!have[r] || p.mean < *best)
                *best = p.mean;
            have[r] = true;
            if (p.observed > 0)
                e.cold = false;
        }
    }
    pthread_rwlock_unlock(&pool->lock);
    sched_free(keys);
    if (!have[SCHED_RIDX_PREFILL] && !have[SCHED_RIDX_DECODE])
        return SCHED_ERR_NO_INSTANCE;
    if (have[SCHED_RIDX_PREFILL] && handoff_s > 0.0)
        e.ttft_s += handoff_s; /* the least any decode has taken: still a lower bound */
    *out = e;
    return SCHED_OK;
}
