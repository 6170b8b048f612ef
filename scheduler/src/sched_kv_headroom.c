/*
 * KV headroom of decodes: in PD a decode that runs out of KV memory preempts a running
 * request and recomputes it (vLLM V1's scheduler), which costs far more than choosing
 * another decode. So each instance carries what it can hold and what it is projected to
 * hold, and the decode picks keep to instances with room while one has it.
 *
 *  - projected: max(KV booked by pdgw, KV the engine reports in use); booked is prompt +
 *    max_tokens of every open decode leg, the worst case of what the leg will hold;
 *  - capacity, by trust: declared in the descriptor (kv_capacity_tokens), else the engine's
 *    own vllm:cache_config_info (num_gpu_blocks x block_size, vllm/v1/metrics/loggers.py
 *    log_metrics_info with the labels of vllm/config/cache.py metrics_info), else learnt:
 *    the tokens pdgw booked there that are probably resident (the prompts and half of the
 *    outputs) over the scraped usage fraction, once that fraction says something (>= 10%),
 *    smoothed. A learnt capacity is approximate (other clients' requests make it low,
 *    outputs that end early make it high); unknown capacity never refuses.
 *
 * When no allowed decode has room the least-bad one (the smallest fill ratio) is chosen
 * rather than the booking refused: the projection is a worst case (max_tokens is rarely
 * reached), a full engine queues the request rather than failing it, and whether to turn
 * work away is the gateway's admission decision (slo reject, 429), not the picker's.
 */
#include <math.h>

#include "sched_int.h"

#define RELAXED memory_order_relaxed
/* The usage fraction below which it says too little to learn a capacity from. */
#define KV_LEARN_MIN_USAGE 0.10
/* Weight of a new estimate in the learnt capacity. */
#define KV_LEARN_WEIGHT 0.3

const char *sched_kv_capacity_source_name(uint32_t source)
{
    switch (source) {
    case SCHED_KV_CAP_LEARNT:
        return "learnt";
    case SCHED_KV_CAP_ENGINE:
        return "engine";
    case SCHED_KV_CAP_DECLARED:
        return "declared";
    default:
        return "unknown";
    }
}

double sched_kv_fill_ratio(const sched_instance_t *inst, uint64_t need)
{
    uint64_t cap = atomic_load_explicit(&inst->kv_capacity, RELAXED);
    return cap == 0 ? 0.0 : (double)(sched_kv_projected(inst) + need) / (double)cap;
}

sched_instance_t *sched_kv_least_bad(sched_instance_t *const *arr, size_t n,
                                     const sched_pick_ctx_t *ctx)
{
    sched_instance_t *best = NULL;
    double best_r = 0.0;

    for (size_t i = 0; i < n; i++) {
        double r;
        if (!sched_pick_allowed(arr[i], ctx))
            continue;
        r = sched_kv_fill_ratio(arr[i], ctx->kv_need);
        if (best == NULL || r < best_r || (r == best_r && arr[i]->uid < best->uid))
            best = arr[i], best_r = r;
    }
    if (best)
        atomic_fetch_add_explicit(&ctx->pool->kv_overcommit, 1, RELAXED);
    return best;
}

void sched_kv_count_refusals(sched_instance_t *const *arr, size_t n, const sched_pick_ctx_t *ctx,
                             const sched_instance_t *chosen)
{
    bool any = false;

    if (chosen == NULL || ctx->kv_need == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        if (arr[i] == chosen || sched_kv_fits(arr[i], ctx->kv_need) ||
            !sched_pick_allowed(arr[i], ctx))
            continue;
        atomic_fetch_add_explicit(&arr[i]->kv_refusals, 1, RELAXED);
        any = true;
    }
    if (any)
        atomic_fetch_add_explicit(&ctx->pool->kv_refusals, 1, RELAXED);
}

/* The booked tokens probably resident now: every prompt, half of the projected outputs. */
static double resident_estimate(const sched_instance_t *inst)
{
    uint64_t kv = atomic_load_explicit(&inst->kv_tokens, RELAXED);
    uint64_t prompt = atomic_load_explicit(&inst->kv_decode_prompt, RELAXED);
    if (prompt > kv)
        prompt = kv;
    return (double)prompt + (double)(kv - prompt) / 2.0;
}

/* A declared capacity more than a tenth away from what the engine itself reports is a wrong
 * setting (the declared one is still used: the operator may know better, e.g. memory kept for
 * other work); said once per instance. */
static void check_declared(sched_pool_t *pool, sched_instance_t *inst, uint64_t declared,
                           double engine)
{
    double off = ((double)declared - engine) / engine;
    if ((off > 0.1 || off < -0.1) && !atomic_exchange(&inst->kv_capacity_warned, true))
        sched_pool_logf(pool, SCHED_LOG_WARN,
                        "instance %s: kv_capacity_tokens %llu declared, the engine reports %.0f "
                        "(vllm:cache_config_info num_gpu_blocks x block_size); the declared "
                        "value is used",
                        inst->desc.id, (unsigned long long)declared, engine);
}

void sched_kv_on_scrape(sched_pool_t *pool, sched_instance_t *inst, const sched_engine_metrics_t *m)
{
    uint32_t src = atomic_load_explicit(&inst->kv_capacity_source, RELAXED);
    uint64_t cap = atomic_load_explicit(&inst->kv_capacity, RELAXED);

    if (src == SCHED_KV_CAP_DECLARED && m->have_kv_capacity && m->kv_capacity_tokens >= 1.0)
        check_declared(pool, inst, cap, m->kv_capacity_tokens);
    if (src != SCHED_KV_CAP_DECLARED && m->have_kv_capacity && m->kv_capacity_tokens >= 1.0 &&
        m->kv_capacity_tokens < 1e15) {
        cap = (uint64_t)m->kv_capacity_tokens;
        src = SCHED_KV_CAP_ENGINE;
    } else if ((src == SCHED_KV_CAP_NONE || src == SCHED_KV_CAP_LEARNT) && m->have_kv_usage &&
               m->kv_usage >= KV_LEARN_MIN_USAGE) {
        double est = resident_estimate(inst) / m->kv_usage;
        if (est >= 1.0 && est < 1e15) {
            cap = cap && src == SCHED_KV_CAP_LEARNT
                      ? (uint64_t)llround((1.0 - KV_LEARN_WEIGHT) * (double)cap +
                                          KV_LEARN_WEIGHT * est)
                      : (uint64_t)llround(est);
            src = SCHED_KV_CAP_LEARNT;
        }
    }
    atomic_store_explicit(&inst->kv_capacity, cap, RELAXED);
    atomic_store_explicit(&inst->kv_capacity_source, src, RELAXED);
    atomic_store_explicit(
        &inst->kv_engine_used,
        cap && m->have_kv_usage ? (uint64_t)llround(m->kv_usage * (double)cap) : 0, RELAXED);
}

void sched_kv_on_stale(sched_instance_t *inst)
{
    atomic_store_explicit(&inst->kv_engine_used, 0, RELAXED);
}
