/*
 * Bookings: the prefill/decode instances of one request and the load they
 * carry until each leg is finished.
 *
 * Exactly-once release: each leg has an atomic "open" flag that only one
 * finisher can clear (atomic exchange); a second finish is refused,
 * counted (pdgw_sched_double_release_total) and never touches the load.
 * sched_booking_destroy() takes the caller's pointer by address and sets
 * it to NULL, so the owner cannot destroy twice through it.
 */
#include <string.h>
#include <time.h>

#include "sched_int.h"
#include "sched_kvev_int.h"
#include "pdb/pdb_clock.h"

#define RELAXED         memory_order_relaxed
#define LEG_MAX_EXCLUDE 16
#define PICK_ATTEMPTS   4

typedef struct booking_leg {
    sched_instance_t *inst; /* reference held until rebook/destroy */
    _Atomic bool open;
    bool probe; /* this leg holds its instance's half-open probe slot */
    uint64_t prompt_charge, kv_charge, milli_charge;
    uint64_t kv_prompt_charge; /* the prompt part of kv_charge (KV headroom learning) */
    /* The latency models' features as the leg was booked (what was queued and running on
     * its instance then), scored against the timings it finishes with. */
    double x_ttft[SCHED_PREFILL_DIM], x_tpot[SCHED_TPOT_DIM], x_handoff[SCHED_TRANSFER_DIM];
    /* What the models predicted then (means; 0 while a model was cold), and the prefill's
     * prediction cold or not (scored against the leg's time either way). */
    double pred_first_s, pred_tpot_s, pred_first_raw_s;
    /* The prompt tokens it computes; how much of the replay's steps had run when it was
     * booked (the features count from the replay's anchor); its place in the instance's
     * prefill replay (0 = not there), and the replay's steps to its end when it answered. */
    uint64_t x_prompt;
    double x_elapsed_s;
    uint64_t pq_id;
    sched_pq_steps_t answered;
    sched_pq_answer_t answer; /* what the replay made of its answer */
    uint64_t excluded[LEG_MAX_EXCLUDE];
    size_t n_excluded;
} booking_leg_t;

struct sched_booking {
    sched_pool_t *pool;
    sched_request_t req; /* tokens/text dropped; exclude ids point into exclude_store */
    char **exclude_store;
    char *model; /* req.model points here */
    uint64_t *hashes;
    size_t n_hashes;
    uint64_t *kv_keys; /* precise-prefix block keys of the prompt */
    size_t n_kv_keys;
    bool whole;        /* decode only: the decode runs the whole request (its prefill too) */
    bool pd;           /* both legs booked together: the prefill is chosen with its decode */
    bool has_affinity; /* session affinity: rendezvous on affinity_hash */
    uint64_t affinity_hash;
    booking_leg_t legs[2];
};

static uint64_t mono_ns(void)
{
    return pdb_clock_mono_ns();
}

static void booking_free(sched_booking_t *b)
{
    for (int l = 0; l < 2; l++)
        sched_instance_unref(b->legs[l].inst);
    for (size_t i = 0; i < b->req.n_exclude_ids; i++)
        sched_free(b->exclude_store[i]);
    sched_free(b->exclude_store);
    sched_free(b->model);
    sched_free(b->hashes);
    sched_free(b->kv_keys);
    sched_free(b);
}

static sched_status_t booking_new(sched_pool_t *pool, const sched_request_t *in,
                                  sched_booking_t **out)
{
    sched_booking_t *b;
    sched_request_t local;
    const sched_request_t *req = &local;
    uint64_t prompt;

    if (!pool || !in || !out)
        return SCHED_ERR_INVALID;
    local = *in;
    if (local.text && !local.text_len)
        local.text_len = strlen(local.text);
    b = sched_calloc(1, sizeof(*b));
    if (!b)
        return SCHED_ERR_NO_MEMORY;
    b->pool = pool;
    prompt = req->prompt_tokens ? req->prompt_tokens
                                : (req->n_tokens ? req->n_tokens : (req->text_len + 3) / 4);
    b->req.prompt_tokens = (uint32_t)(prompt > UINT32_MAX ? UINT32_MAX : prompt);
    b->req.max_tokens = req->max_tokens ? req->max_tokens : pool->default_max_tokens;
    if (req->affinity_key != NULL && req->affinity_key[0] != '\0') {
        b->has_affinity = true;
        b->affinity_hash = sched_affinity_hash(req->affinity_key, req->affinity_key_len
                                                                      ? req->affinity_key_len
                                                                      : strlen(req->affinity_key));
    }
    b->req.affinity_key = NULL; /* borrowed by the caller: only the hash is kept */
    if (req->model && *req->model) {
        b->model = sched_strdup(req->model);
        if (!b->model)
            goto err_nomem;
        b->req.model = b->model;
    }
    b->req.only_role = req->only_role;
    b->req.slo_ttft_ms = req->slo_ttft_ms;
    b->req.slo_tpot_ms = req->slo_tpot_ms;
    if (req->n_exclude_ids) {
        b->exclude_store = sched_calloc(req->n_exclude_ids, sizeof(char *));
        if (!b->exclude_store)
            goto err_nomem;
        for (size_t i = 0; i < req->n_exclude_ids; i++) {
            b->exclude_store[i] = sched_strdup(req->exclude_ids[i]);
            if (!b->exclude_store[i])
                goto err_nomem;
            b->req.n_exclude_ids = i + 1;
        }
        b->req.exclude_ids = (const char *const *)b->exclude_store;
    }
    if (pool->policy[0] == SCHED_POLICY_PREFIX_AWARE ||
        pool->policy[1] == SCHED_POLICY_PREFIX_AWARE) {
        uint64_t tmp[SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST];
        size_t n = sched_prefix_hash_request(req, pool->prefix_block_tokens, tmp,
                                             SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST);
        if (n) {
            b->hashes = sched_malloc(n * sizeof(uint64_t));
            if (!b->hashes)
                goto err_nomem;
            memcpy(b->hashes, tmp, n * sizeof(uint64_t));
            b->n_hashes = n;
        }
    }
    if (pool->kvev_index &&
        sched_kvev_request_keys(pool, req, &b->kv_keys, &b->n_kv_keys) != SCHED_OK)
        goto err_nomem;
    *out = b;
    return SCHED_OK;

err_nomem:
    booking_free(b);
    return SCHED_ERR_NO_MEMORY;
}

static void leg_exclude(booking_leg_t *leg, uint64_t uid)
{
    for (size_t i = 0; i < leg->n_excluded; i++) {
        if (leg->excluded[i] == uid)
            return;
    }
    if (leg->n_excluded < LEG_MAX_EXCLUDE)
        leg->excluded[leg->n_excluded++] = uid;
}

/* Take back the load of an open leg (caller won the open flag). */
static void leg_unload(booking_leg_t *leg)
{
    sched_instance_t *inst = leg->inst;

    atomic_fetch_sub_explicit(&inst->inflight, 1, RELAXED);
    atomic_fetch_sub_explicit(&inst->token_milli, leg->milli_charge, RELAXED);
    if (leg->prompt_charge)
        atomic_fetch_sub_explicit(&inst->prompt_tokens, leg->prompt_charge, RELAXED);
    if (leg->kv_charge)
        atomic_fetch_sub_explicit(&inst->kv_tokens, leg->kv_charge, RELAXED);
    if (leg->kv_prompt_charge)
        atomic_fetch_sub_explicit(&inst->kv_decode_prompt, leg->kv_prompt_charge, RELAXED);
    if (leg->pq_id) /* ended without its answer taking it out of the replay */
        sched_pq_drop(inst, leg->pq_id);
    leg->pq_id = 0;
}

/* A model's mean for <x>, or 0 while it is cold (its priors say little of this instance). */
static double warm_mean(const sched_latency_model_t *m, const double *x)
{
    sched_prediction_t p;

    sched_latency_model_predict(m, x, &p);
    return p.observed >= SCHED_PREDICT_SCORED_AFTER ? p.mean : 0.0;
}

/* The prompt tokens <inst> would compute for <b>: all of them, less the leading blocks its
 * engine reports cached (KV events, when the pool keeps their index; at least one token). */
static uint64_t booking_uncached(const sched_booking_t *b, const sched_instance_t *inst)
{
    uint64_t prompt = b->req.prompt_tokens, uid = inst->uid, cached;
    size_t depth = 0;
    double weighted = 0.0;

    if (!b->pool->kvev_index || !b->kv_keys || b->n_kv_keys == 0)
        return prompt;
    sched_kvev_index_match(b->pool->kvev_index, b->kv_keys, b->n_kv_keys, &uid, 1, 1.0, &depth,
                           &weighted);
    cached = (uint64_t)depth * sched_kvev_index_block_size(b->pool->kvev_index, 0);
    return cached >= prompt ? 1 : prompt - cached;
}

/* What the leg's latency will be predicted and learnt against: the prompt tokens it computes
 * (the cached ones as far as KV events tell, corrected when the engine's answer says), laid
 * out by the instance's prefill replay behind the work queued there; the requests and KV
 * tokens running with it, itself included. */
static void leg_prompt_features(booking_leg_t *leg, const sched_instance_t *inst,
                                const sched_booking_t *b, uint64_t now_ms)
{
    sched_prediction_t p;
    sched_pq_steps_t st;

    leg->x_prompt = booking_uncached(b, inst);
    sched_instance_predict_ttft_replay(inst, leg->x_prompt, now_ms, &st, &p);
    /* learnt against what was booked: the arrivals the prediction expected are not known to
     * have come */
    sched_prefill_features(leg->x_ttft, st.steps, st.tokens - st.later_tokens);
    leg->x_elapsed_s = st.elapsed_s;
    leg->pred_first_raw_s = p.mean;
    leg->pred_first_s = p.observed >= SCHED_PREDICT_SCORED_AFTER ? p.mean : 0.0;
}

static void leg_features(booking_leg_t *leg, const sched_instance_t *inst, const sched_booking_t *b,
                         uint64_t now_ms)
{
    const sched_request_t *req = &b->req;
    uint64_t kv = atomic_load_explicit(&inst->kv_tokens, RELAXED);
    uint32_t running = atomic_load_explicit(&inst->inflight, RELAXED);

    leg_prompt_features(leg, inst, b, now_ms);
    sched_tpot_features(leg->x_tpot, running,
                        kv + (uint64_t)req->prompt_tokens + req->max_tokens / 2);
    /* the others running beside it (its own slot is taken by now), as a pick sees them */
    sched_transfer_features(leg->x_handoff, req->prompt_tokens, running > 0 ? running - 1 : 0);
    leg->pred_tpot_s = warm_mean(&inst->lat_tpot, leg->x_tpot);
}

/* A prefill leg answered: out of the replay, which says what steps it took since the anchor
 * (the observation its model learns). Before the leg's load is released. */
static void leg_answered(booking_leg_t *leg, const sched_result_t *r, uint64_t now_ms)
{
    uint64_t computed = 0;

    leg->answer = SCHED_PQ_ABSENT;
    if (!leg->pq_id || !r || r->outcome != SCHED_OUTCOME_SUCCESS || !(r->first_token_s > 0.0))
        return;
    if (r->cached_tokens > 0 && r->cached_tokens < leg->prompt_charge)
        computed = leg->prompt_charge - r->cached_tokens;
    leg->answer = sched_pq_answered(leg->inst, leg->pq_id, now_ms, computed, &leg->answered);
    if (leg->answer == SCHED_PQ_LEARNT && !((double)now_ms > leg->answered.start_ms))
        leg->answer = SCHED_PQ_ABSENT; /* within the clock's tick: learnt from its own timing */
    leg->pq_id = 0;
}

/* A decode leg's whole answer: its first token's time and its later tokens' together, the
 * first token's model (the handoff after a prefill; its own prefill for a whole request) and
 * the TPOT model learn the sum, each its share. */
static void leg_learn_whole_answer(booking_leg_t *leg, const sched_instance_t *prefill,
                                   const sched_result_t *r)
{
    double xb[SCHED_TPOT_DIM], later = (double)(r->answer_tokens - 1);

    for (unsigned i = 0; i < SCHED_TPOT_DIM; i++)
        xb[i] = leg->x_tpot[i] * later;
    if (leg->prompt_charge == 0) { /* after a prefill: the handoff, as its pair sees it */
        double xa[SCHED_TRANSFER_DIM];
        double f = sched_pair_factor(&leg->inst->pairs, prefill ? prefill->uid : 0);
        for (unsigned i = 0; i < SCHED_TRANSFER_DIM; i++)
            xa[i] = leg->x_handoff[i] * f;
        sched_latency_model_observe_sum(&leg->inst->lat_handoff, xa, &leg->inst->lat_tpot, xb,
                                        r->answer_s);
    } else { /* the whole request: its prompt as booked, behind the replay's elapsed part */
        sched_latency_model_observe_sum(&leg->inst->lat_prefill, leg->x_ttft, &leg->inst->lat_tpot,
                                        xb, leg->x_elapsed_s + r->answer_s);
    }
}

/* Teach the instance's models what a successful leg took (<prefill>: the booking's prefill
 * instance, for a decode leg's handoff). */
static void leg_learn(booking_leg_t *leg, const sched_instance_t *prefill, const sched_result_t *r,
                      uint64_t now_ms)
{
    if (r->outcome != SCHED_OUTCOME_SUCCESS)
        return;
    if (r->first_token_s > 0.0 && leg->prompt_charge == 0 && leg->kv_charge > 0) {
        /* a PD decode leg: its first token waited for the KV handed over from the prefill */
        sched_handoff_observe(leg->inst, prefill ? prefill->uid : 0, leg->x_handoff,
                              r->first_token_s, now_ms);
    } else if (r->first_token_s > 0.0) {
        double x[SCHED_PREFILL_DIM];
        if (leg->answer == SCHED_PQ_LEARNT) { /* in hindsight: the replay's steps to now */
            sched_prefill_features(x, leg->answered.steps, leg->answered.tokens);
            sched_latency_model_observe_scored(&leg->inst->lat_prefill, x,
                                               ((double)now_ms - leg->answered.start_ms) * 1e-3,
                                               leg->pred_first_raw_s, r->first_token_s);
        } else if (leg->answer == SCHED_PQ_SEEN) { /* its step was learnt: scored only */
            sched_latency_model_observe_scored(&leg->inst->lat_prefill, leg->x_ttft, 0.0,
                                               leg->pred_first_raw_s, r->first_token_s);
        } else { /* as booked (a leg whose prompt ends mid-stream, or not replayed) */
            sched_latency_model_observe_scored(&leg->inst->lat_prefill, leg->x_ttft,
                                               leg->x_elapsed_s + r->first_token_s,
                                               leg->pred_first_raw_s, r->first_token_s);
        }
    }
    if (r->later_tokens > 0 && r->later_tokens_s > 0.0)
        sched_latency_model_observe(&leg->inst->lat_tpot, leg->x_tpot,
                                    r->later_tokens_s / r->later_tokens);
    if (!(r->first_token_s > 0.0) && r->answer_s > 0.0 && r->answer_tokens > 0 && leg->kv_charge)
        leg_learn_whole_answer(leg, prefill, r);
}

/* Choose and book <which> for <b>. Decode prefers the prefill's zone. */
static sched_status_t book_leg(sched_booking_t *b, sched_leg_t which)
{
    sched_pool_t *pool = b->pool;
    booking_leg_t *leg = &b->legs[which];
    const sched_instance_t *pair =
        which == SCHED_LEG_DECODE ? b->legs[SCHED_LEG_PREFILL].inst : NULL;
    uint64_t excl[LEG_MAX_EXCLUDE + PICK_ATTEMPTS];
    sched_pick_ctx_t ctx;
    sched_instance_t *chosen = NULL;
    bool probe = false;
    int ridx = which == SCHED_LEG_PREFILL ? SCHED_RIDX_PREFILL : SCHED_RIDX_DECODE;

    memcpy(excl, leg->excluded, leg->n_excluded * sizeof(uint64_t));
    memset(&ctx, 0, sizeof(ctx));
    ctx.pool = pool;
    ctx.req = &b->req;
    ctx.block_hashes = b->hashes;
    ctx.n_blocks = b->n_hashes;
    ctx.kv_keys = b->kv_keys;
    ctx.n_kv_keys = b->n_kv_keys;
    ctx.exclude_uids = excl;
    ctx.n_exclude_uids = leg->n_excluded;
    ctx.now_ms = sched_pool_now(pool);
    ctx.rng = sched_thread_rng();
    ctx.any_exclude = leg->n_excluded > 0 || b->req.n_exclude_ids > 0;
    ctx.whole_request = b->whole && which == SCHED_LEG_DECODE;
    if (which == SCHED_LEG_DECODE) /* what it will hold: the headroom the picks look for */
        ctx.kv_need = (uint64_t)b->req.prompt_tokens + b->req.max_tokens;
    ctx.pair_decodes = which == SCHED_LEG_PREFILL && b->pd && !b->has_affinity &&
                       atomic_load(&pool->policy[SCHED_RIDX_DECODE]) == SCHED_POLICY_SLO;
    ctx.pair_prefill_uid = pair ? pair->uid : 0;

    pthread_rwlock_rdlock(&pool->lock);
    for (int attempt = 0; attempt < PICK_ATTEMPTS; attempt++) {
        sched_instance_t *c =
            b->has_affinity ? sched_affinity_pick(pool, pool->snap, ridx, b->affinity_hash, &ctx)
                            : sched_policy_pick(pool->snap, ridx, pool->policy[ridx], &ctx);
        if (!c)
            break;
        if (!b->has_affinity && pair && pair->desc.zone[0] &&
            strcmp(c->desc.zone, pair->desc.zone) != 0) {
            uint64_t zscore;
            sched_instance_t *z =
                sched_policy_least_in_zone(pool->snap, ridx, pair->desc.zone, &ctx, &zscore);
            if (z && zscore <= sched_instance_score(c, ctx.now_ms) + pool->zone_slack)
                c = z;
        }
        if (sched_breaker_acquire(c, ctx.now_ms, &probe)) {
            if (sched_instance_take_slot(c)) {
                chosen = c;
                break;
            }
            /* Filled up since the pick (max_concurrent): give the probe back, pick again. */
            if (probe)
                sched_breaker_release_probe(c, ctx.now_ms);
            probe = false;
        }
        excl[ctx.n_exclude_uids++] = c->uid; /* lost the probe race: pick again */
        ctx.any_exclude = true;
    }
    if (chosen) {
        sched_instance_ref(chosen); /* its inflight was counted by sched_instance_take_slot */
        uint64_t now_ms = sched_pool_now(pool);
        leg_features(leg, chosen, b, now_ms);
        leg->prompt_charge = leg->kv_charge = leg->kv_prompt_charge = 0;
        leg->pq_id = 0;
        leg->answer = SCHED_PQ_ABSENT;
        if (which == SCHED_LEG_PREFILL) {
            leg->prompt_charge = b->req.prompt_tokens;
            leg->milli_charge = sched_prefill_milli(leg->prompt_charge);
            atomic_fetch_add_explicit(&chosen->prompt_tokens, leg->prompt_charge, RELAXED);
            leg->pq_id = sched_pq_add(chosen, now_ms, leg->x_prompt);
        } else {
            leg->kv_charge = (uint64_t)b->req.prompt_tokens + b->req.max_tokens;
            leg->milli_charge = sched_decode_milli(leg->kv_charge);
            atomic_fetch_add_explicit(&chosen->kv_tokens, leg->kv_charge, RELAXED);
            leg->kv_prompt_charge = b->req.prompt_tokens;
            atomic_fetch_add_explicit(&chosen->kv_decode_prompt, leg->kv_prompt_charge, RELAXED);
            if (b->whole) { /* it computes the prompt too: queued prefill work on it */
                leg->prompt_charge = b->req.prompt_tokens;
                atomic_fetch_add_explicit(&chosen->prompt_tokens, leg->prompt_charge, RELAXED);
                leg->pq_id = sched_pq_add(chosen, now_ms, leg->x_prompt);
            }
        }
        atomic_fetch_add_explicit(&chosen->token_milli, leg->milli_charge, RELAXED);
    }
    pthread_rwlock_unlock(&pool->lock);

    if (!chosen) {
        atomic_fetch_add_explicit(&pool->no_instance[ridx], 1, RELAXED);
        return SCHED_ERR_NO_INSTANCE;
    }
    if (pool->prefix[ridx] && b->n_hashes)
        sched_prefix_record(pool->prefix[ridx], b->hashes, b->n_hashes, chosen->uid);
    sched_instance_unref(leg->inst); /* previous (finished) instance of a rebook */
    leg->inst = chosen;
    leg->probe = probe;
    atomic_store_explicit(&leg->open, true, memory_order_release);
    return SCHED_OK;
}

/* Undo a booked leg without judging the instance (batch revert). */
static void leg_revert(sched_booking_t *b, sched_leg_t which)
{
    booking_leg_t *leg = &b->legs[which];

    if (!atomic_exchange(&leg->open, false))
        return;
    leg_unload(leg);
    if (leg->probe)
        sched_breaker_release_probe(leg->inst, sched_pool_now(b->pool));
    leg->probe = false;
}

typedef enum { BOOK_PD, BOOK_P, BOOK_D } book_kind_t;

static sched_status_t book(sched_pool_t *pool, const sched_request_t *req, book_kind_t kind,
                           sched_booking_t **booking_out)
{
    uint64_t t0 = mono_ns();
    sched_booking_t *b;
    sched_status_t status;

    status = booking_new(pool, req, &b);
    if (status != SCHED_OK)
        return status;
    b->whole = kind == BOOK_D;
    b->pd = kind == BOOK_PD;
    if (kind != BOOK_D) {
        status = book_leg(b, SCHED_LEG_PREFILL);
        if (status != SCHED_OK)
            goto err_free;
    }
    if (kind != BOOK_P) {
        status = book_leg(b, SCHED_LEG_DECODE);
        if (status != SCHED_OK)
            goto err_revert;
    }
    atomic_fetch_add_explicit(&pool->bookings, 1, RELAXED);
    sched_autoscale_note_request(pool, &b->req);
    sched_metrics_observe_schedule(pool, mono_ns() - t0);
    *booking_out = b;
    return SCHED_OK;

err_revert:
    leg_revert(b, SCHED_LEG_PREFILL);
err_free:
    sched_metrics_observe_schedule(pool, mono_ns() - t0);
    booking_free(b);
    return status;
}

sched_status_t sched_book_pd(sched_pool_t *pool, const sched_request_t *req,
                             sched_booking_t **booking_out)
{
    return book(pool, req, BOOK_PD, booking_out);
}

sched_status_t sched_book_prefill(sched_pool_t *pool, const sched_request_t *req,
                                  sched_booking_t **booking_out)
{
    return book(pool, req, BOOK_P, booking_out);
}

sched_status_t sched_book_decode(sched_pool_t *pool, const sched_request_t *req,
                                 sched_booking_t **booking_out)
{
    return book(pool, req, BOOK_D, booking_out);
}

sched_status_t sched_booking_book_decode(sched_booking_t *b)
{
    uint64_t t0;
    sched_status_t status;

    if (!b)
        return SCHED_ERR_INVALID;
    if (atomic_load(&b->legs[SCHED_LEG_DECODE].open))
        return SCHED_ERR_STATE;
    t0 = mono_ns();
    if (b->legs[SCHED_LEG_DECODE].inst)
        leg_exclude(&b->legs[SCHED_LEG_DECODE], b->legs[SCHED_LEG_DECODE].inst->uid);
    status = book_leg(b, SCHED_LEG_DECODE);
    sched_metrics_observe_schedule(b->pool, mono_ns() - t0);
    return status;
}

sched_status_t sched_booking_rebook(sched_booking_t *b, sched_leg_t which)
{
    booking_leg_t *leg;
    uint64_t t0;
    sched_status_t status;

    if (!b || (which != SCHED_LEG_PREFILL && which != SCHED_LEG_DECODE))
        return SCHED_ERR_INVALID;
    leg = &b->legs[which];
    if (!leg->inst || atomic_load(&leg->open))
        return SCHED_ERR_STATE;
    t0 = mono_ns();
    leg_exclude(leg, leg->inst->uid);
    status = book_leg(b, which);
    sched_metrics_observe_schedule(b->pool, mono_ns() - t0);
    return status;
}

sched_instance_t *sched_booking_instance(const sched_booking_t *b, sched_leg_t which)
{
    if (!b || (which != SCHED_LEG_PREFILL && which != SCHED_LEG_DECODE))
        return NULL;
    return b->legs[which].inst;
}

void sched_booking_predicted(const sched_booking_t *b, sched_leg_t which, double *first_token_s,
                             double *tpot_s)
{
    const booking_leg_t *leg =
        b && (which == SCHED_LEG_PREFILL || which == SCHED_LEG_DECODE) ? &b->legs[which] : NULL;

    if (first_token_s)
        *first_token_s = leg && leg->inst ? leg->pred_first_s : 0.0;
    if (tpot_s)
        *tpot_s = leg && leg->inst ? leg->pred_tpot_s : 0.0;
}

sched_status_t sched_booking_decode_only(sched_booking_t *b)
{
    static const sched_result_t dropped = {.outcome = SCHED_OUTCOME_CANCELLED};
    booking_leg_t *d;
    uint64_t now_ms;

    if (!b || !sched_booking_leg_open(b, SCHED_LEG_PREFILL) ||
        !sched_booking_leg_open(b, SCHED_LEG_DECODE))
        return SCHED_ERR_STATE;
    (void)sched_booking_finish(b, SCHED_LEG_PREFILL, &dropped);
    /* From here the decode computes the prompt: its prefill work, as a decode-only booking
     * would have charged it, and what it learns is its own prefill, not a handoff. */
    d = &b->legs[SCHED_LEG_DECODE];
    now_ms = sched_pool_now(b->pool);
    b->whole = true;
    leg_prompt_features(d, d->inst, b, now_ms);
    d->prompt_charge = b->req.prompt_tokens;
    atomic_fetch_add_explicit(&d->inst->prompt_tokens, d->prompt_charge, RELAXED);
    d->pq_id = sched_pq_add(d->inst, now_ms, d->x_prompt);
    return SCHED_OK;
}

bool sched_booking_predict_pd(const sched_booking_t *b, sched_pd_prediction_t *out)
{
    const booking_leg_t *p, *d;
    sched_prediction_t handoff, tpot, own;
    double per_ktok;
    uint64_t uncached;

    if (!b || !out)
        return false;
    p = &b->legs[SCHED_LEG_PREFILL];
    d = &b->legs[SCHED_LEG_DECODE];
    if (!p->inst || !d->inst || !atomic_load(&p->open) || !atomic_load(&d->open))
        return false;
    sched_handoff_predict(d->inst, p->inst->uid, d->x_handoff, &handoff);
    sched_latency_model_predict(&d->inst->lat_tpot, d->x_tpot, &tpot);
    if (handoff.observed < SCHED_PREDICT_SCORED_AFTER ||
        tpot.observed < SCHED_PREDICT_SCORED_AFTER || p->pred_first_s <= 0.0)
        return false; /* the PD side is not known yet: nothing to weigh */
    uncached = booking_uncached(b, d->inst);
    sched_instance_predict_ttft(d->inst, uncached, &own);
    if (own.observed >= SCHED_PREDICT_SCORED_AFTER) {
        /* decode-only legs taught the decode its own prefill */
        per_ktok = atomic_load_explicit(&d->inst->lat_prefill.coef[1], RELAXED);
        out->decode_only_s = own.mean;
    } else {
        /* Not yet: a step of its running batch to wait for, one to compute the prompt in,
         * each token at what the booked prefill's engine takes for one (the same model on a
         * peer; a decode is not a faster prefill). */
        uint32_t budget = d->inst->pq.step_tokens ? d->inst->pq.step_tokens : 2048;
        uint64_t steps = (uncached + budget - 1) / budget;
        per_ktok = atomic_load_explicit(&p->inst->lat_prefill.coef[1], RELAXED);
        if (!(per_ktok > 0.0))
            return false;
        out->decode_only_s = tpot.mean * (double)(1 + steps) + per_ktok * (double)uncached * 1e-3;
    }
    out->with_prefill_s = p->pred_first_s + handoff.mean;
    /* the prompt's tokens computed in the decode's steps hold up its running requests */
    out->stall_s = per_ktok > 0.0 ? per_ktok * (double)uncached * 1e-3 : 0.0;
    out->tpot_s = tpot.mean;
    out->uncached_tokens = uncached;
    return true;
}

bool sched_booking_leg_open(const sched_booking_t *b, sched_leg_t which)
{
    if (!b || (which != SCHED_LEG_PREFILL && which != SCHED_LEG_DECODE))
        return false;
    return atomic_load(&b->legs[which].open);
}

static bool outcome_excludes(sched_outcome_t o)
{
    return o != SCHED_OUTCOME_SUCCESS && o != SCHED_OUTCOME_CANCELLED &&
           o != SCHED_OUTCOME_CLIENT_ERROR;
}

sched_status_t sched_booking_finish(sched_booking_t *b, sched_leg_t which,
                                    const sched_result_t *result)
{
    booking_leg_t *leg;
    uint64_t now_ms;
    bool probe;

    if (!b || (which != SCHED_LEG_PREFILL && which != SCHED_LEG_DECODE))
        return SCHED_ERR_INVALID;
    leg = &b->legs[which];
    if (!leg->inst)
        return SCHED_ERR_STATE;
    if (!atomic_exchange(&leg->open, false)) {
        atomic_fetch_add(&b->pool->double_release, 1);
        sched_pool_logf(b->pool, SCHED_LOG_ERROR, "booking on %s: %s leg finished twice (ignored)",
                        leg->inst->desc.id, which == SCHED_LEG_PREFILL ? "prefill" : "decode");
        return SCHED_ERR_ALREADY_RELEASED;
    }
    probe = leg->probe;
    leg->probe = false;
    now_ms = sched_pool_now(b->pool);
    /* A prefill's answer ends its prompt (a whole request's leg streams on past it). */
    if (which == SCHED_LEG_PREFILL)
        leg_answered(leg, result, now_ms);
    leg_unload(leg);
    sched_breaker_report(b->pool, leg->inst, probe, now_ms, result);
    if (result)
        leg_learn(leg, b->legs[SCHED_LEG_PREFILL].inst, result, now_ms);
    if (which == SCHED_LEG_DECODE && result && result->outcome == SCHED_OUTCOME_SUCCESS &&
        (result->first_token_s > 0.0 || result->later_tokens > 0))
        sched_autoscale_note_output(b->pool, b->req.model, result->later_tokens + 1);
    if (result && outcome_excludes(result->outcome))
        leg_exclude(leg, leg->inst->uid);
    return SCHED_OK;
}

void sched_booking_destroy(sched_booking_t **bp)
{
    static const sched_result_t cancelled = {.outcome = SCHED_OUTCOME_CANCELLED};
    sched_booking_t *b;

    if (!bp || !*bp)
        return;
    b = *bp;
    *bp = NULL;
    for (int l = 0; l < 2; l++) {
        booking_leg_t *leg = &b->legs[l];
        if (leg->inst && atomic_exchange(&leg->open, false)) {
            bool probe = leg->probe;
            leg->probe = false;
            leg_unload(leg);
            sched_breaker_report(b->pool, leg->inst, probe, sched_pool_now(b->pool), &cancelled);
        }
    }
    booking_free(b);
}
