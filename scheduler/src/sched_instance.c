/* Instance objects: creation, references, accessors, load score. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sched_int.h"

#define RELAXED memory_order_relaxed

sched_status_t sched_instance_create(sched_pool_t *pool, const sched_instance_desc_t *desc,
                                     char *err, size_t err_len, sched_instance_t **inst_out)
{
    sched_instance_t *inst;
    sched_status_t status;

    inst = sched_aligned_calloc(64, sizeof(*inst));
    if (!inst) {
        sched_set_err(err, err_len, "out of memory");
        return SCHED_ERR_NO_MEMORY;
    }
    status = sched_desc_copy(desc, &inst->desc, err, err_len);
    if (status != SCHED_OK)
        goto err_free;
    if (pthread_mutex_init(&inst->mu, NULL) != 0) {
        sched_set_err(err, err_len, "mutex init failed");
        status = SCHED_ERR_NO_MEMORY;
        goto err_desc;
    }
    atomic_init(&inst->refcnt, 1);
    sched_latency_model_init(&inst->lat_prefill, SCHED_PHASE_PREFILL, NULL);
    sched_latency_model_init(&inst->lat_tpot, SCHED_PHASE_TPOT, NULL);
    sched_latency_model_init(&inst->lat_handoff, SCHED_PHASE_TRANSFER, NULL);
    sched_pair_table_init(&inst->pairs);
    sched_pq_init(&inst->pq, pool->prefill_step_tokens);
    inst->weight = inst->desc.weight;
    inst->inv_weight = ((1ull << 32) + inst->weight - 1) / inst->weight;
    inst->roles = (uint8_t)inst->desc.role;
    if (inst->desc.kv_capacity_tokens) {
        atomic_init(&inst->kv_capacity, inst->desc.kv_capacity_tokens);
        atomic_init(&inst->kv_capacity_source, SCHED_KV_CAP_DECLARED);
    }
    inst->kv_ttl_ms = sched_pool_kv_ttl_ms(pool);
    inst->clock = pool->clock;
    inst->clock_arg = pool->clock_arg;
    *inst_out = inst;
    return SCHED_OK;

err_desc:
    sched_desc_free(&inst->desc);
err_free:
    sched_free(inst);
    return status;
}

sched_instance_t *sched_instance_ref(sched_instance_t *inst)
{
    if (inst)
        atomic_fetch_add_explicit(&inst->refcnt, 1, RELAXED);
    return inst;
}

void sched_instance_unref(sched_instance_t *inst)
{
    if (!inst)
        return;
    if (atomic_fetch_sub_explicit(&inst->refcnt, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&inst->mu);
    sched_latency_model_fini(&inst->lat_prefill);
    sched_latency_model_fini(&inst->lat_tpot);
    sched_latency_model_fini(&inst->lat_handoff);
    sched_pair_table_fini(&inst->pairs);
    sched_pq_fini(&inst->pq);
    sched_models_free(inst->learnt);
    sched_desc_free(&inst->desc);
    sched_free(inst);
}

const sched_instance_desc_t *sched_instance_desc(const sched_instance_t *inst)
{
    return &inst->desc;
}

const char *sched_instance_id(const sched_instance_t *inst)
{
    return inst->desc.id;
}

const char *sched_instance_url(const sched_instance_t *inst)
{
    return inst->desc.url;
}

const char *sched_instance_label(const sched_instance_t *inst, const char *key)
{
    if (strcmp(key, "zone") == 0)
        return inst->desc.zone[0] ? inst->desc.zone : NULL;
    for (size_t i = 0; i < inst->desc.n_labels; i++) {
        if (strcmp(inst->desc.labels[i].key, key) == 0)
            return inst->desc.labels[i].value;
    }
    return NULL;
}

sched_state_t sched_instance_state_now(const sched_instance_t *inst)
{
    if (sched_gate_drain(inst))
        return SCHED_STATE_DRAINING;
    if (sched_gate_down(inst))
        return SCHED_STATE_DOWN;
    return SCHED_STATE_UP;
}

sched_state_t sched_instance_state(const sched_instance_t *inst)
{
    return sched_instance_state_now(inst);
}

sched_breaker_state_t sched_instance_breaker_state(const sched_instance_t *inst)
{
    return (sched_breaker_state_t)sched_gate_breaker(inst);
}

uint32_t sched_instance_inflight(const sched_instance_t *inst)
{
    return atomic_load_explicit(&inst->inflight, RELAXED);
}

void sched_instance_set_kv_free_chunks(sched_instance_t *inst, uint64_t free_chunks)
{
    uint64_t now = inst->clock(inst->clock_arg);

    atomic_store_explicit(&inst->kv_free_chunks, free_chunks, RELAXED);
    atomic_store_explicit(&inst->kv_free_at_ms, now ? now : 1, RELAXED);
    atomic_store_explicit(&inst->kv_full_until_ms, free_chunks ? 0 : now + inst->kv_ttl_ms,
                          RELAXED);
}

uint32_t sched_instance_effective_weight(const sched_instance_t *inst, uint64_t now_ms)
{
    uint32_t shift = 0;

    if (atomic_load_explicit(&inst->overload_until_ms, RELAXED) > now_ms)
        shift = atomic_load_explicit(&inst->overload_shift, RELAXED);
    return (inst->weight * 1024u) >> shift;
}

void sched_instance_set_error(sched_instance_t *inst, uint64_t now_ms, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&inst->mu);
    va_start(ap, fmt);
    vsnprintf(inst->last_error, sizeof(inst->last_error), fmt, ap);
    va_end(ap);
    inst->last_error_ms = now_ms;
    pthread_mutex_unlock(&inst->mu);
}

/* What a leg of <tokens> takes on an idle instance: one step of them (or as many steps as
 * the budget cuts them into). A replay cannot predict less than that. */
static double inst_alone_s(const sched_instance_t *inst, uint64_t tokens)
{
    const sched_latency_model_t *m = &inst->lat_prefill;
    uint32_t budget = inst->pq.step_tokens;
    uint64_t steps = tokens == 0 ? 1 : (tokens + budget - 1) / budget;

    return atomic_load_explicit(&m->coef[0], RELAXED) * (double)steps +
           atomic_load_explicit(&m->coef[1], RELAXED) * (double)tokens * 1e-3;
}

void sched_instance_predict_ttft_replay(const sched_instance_t *inst, uint64_t uncached_tokens,
                                        uint64_t now_ms, sched_pq_steps_t *st,
                                        sched_prediction_t *out)
{
    double x[SCHED_PREFILL_DIM];

    /* The replay lays the steps out from its anchor; the model says how long they take; what
     * of that had run by now is not this leg's to wait. */
    sched_pq_predict(inst, now_ms, uncached_tokens, st);
    sched_prefill_features(x, st->steps, st->tokens);
    sched_latency_model_predict(&inst->lat_prefill, x, out);
    sched_prediction_shift(out, -st->elapsed_s, inst_alone_s(inst, uncached_tokens));
}

void sched_instance_predict_ttft_at(const sched_instance_t *inst, uint64_t uncached_tokens,
                                    uint64_t now_ms, sched_prediction_t *out)
{
    sched_pq_steps_t st;
    sched_instance_predict_ttft_replay(inst, uncached_tokens, now_ms, &st, out);
}

void sched_instance_predict_ttft(const sched_instance_t *inst, uint64_t uncached_tokens,
                                 sched_prediction_t *out)
{
    sched_instance_predict_ttft_at(inst, uncached_tokens, inst->clock(inst->clock_arg), out);
}

void sched_instance_predict_tpot(const sched_instance_t *inst, uint64_t kv_tokens,
                                 sched_prediction_t *out)
{
    double x[SCHED_TPOT_DIM];
    sched_tpot_features(x, atomic_load_explicit(&inst->inflight, RELAXED) + 1,
                        atomic_load_explicit(&inst->kv_tokens, RELAXED) + kv_tokens);
    sched_latency_model_predict(&inst->lat_tpot, x, out);
}
