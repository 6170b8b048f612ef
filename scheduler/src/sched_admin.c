/* Admin surface: instances as JSON, add from a JSON body. */
#include <math.h>
#include <string.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

#define RELAXED memory_order_relaxed

static json_t *ports_json(const int *ports, size_t n)
{
    json_t *arr = json_array();

    for (size_t i = 0; arr && i < n; i++)
        json_array_append_new(arr, json_integer(ports[i]));
    return arr;
}

/* Model names: configured ones, else learnt ones ("models_source" says which;
 * "any" = not known yet, the instance takes every model). */
static void instance_models_json(json_t *o, sched_instance_t *inst)
{
    const sched_instance_desc_t *d = &inst->desc;
    json_t *models = json_array();
    const char *msrc = "config";

    for (size_t i = 0; i < d->n_models; i++)
        json_array_append_new(models, json_string(d->models[i]));
    if (d->n_models == 0) {
        pthread_mutex_lock(&inst->mu);
        msrc = inst->learnt ? "engine" : "any";
        for (size_t i = 0; inst->learnt && i < inst->learnt->n; i++)
            json_array_append_new(models, json_string(inst->learnt->names[i]));
        pthread_mutex_unlock(&inst->mu);
    }
    json_object_set_new(o, "models", models);
    json_object_set_new(o, "models_source", json_string(msrc));
}

/* KV transfer endpoints and engine topology of the descriptor. */
static void instance_engine_json(json_t *o, const sched_instance_desc_t *d)
{
    json_object_set_new(o, "kv_host", json_string(d->kv_host));
    json_object_set_new(o, "kv_port", json_integer(d->kv_port));
    json_object_set_new(o, "bootstrap_port", json_integer(d->bootstrap_port));
    json_object_set_new(o, "engine_id", json_string(d->engine_id));
    json_object_set_new(o, "alloc_ports", ports_json(d->alloc_ports, d->n_alloc_ports));
    json_object_set_new(o, "init_ports", ports_json(d->init_ports, d->n_init_ports));
    json_object_set_new(o, "tp_size", json_integer(d->tp_size));
    json_object_set_new(o, "max_concurrent", json_integer((json_int_t)d->max_concurrent));
    json_object_set_new(o, "kv_capacity_tokens", json_integer((json_int_t)d->kv_capacity_tokens));
    json_object_set_new(o, "dp_rank", json_integer(d->dp_rank));
    json_object_set_new(o, "dp_size", json_integer(d->dp_size));
    json_object_set_new(o, "kv_engine",
                        json_string(d->kv_engine == SCHED_KV_ENGINE_LIBKVT ? "libkvt" : "lmcache"));
}

static void instance_load_json(json_t *load, sched_pool_t *pool, sched_instance_t *inst,
                               uint64_t now, uint64_t free_at)
{
    json_object_set_new(load, "inflight", json_integer(atomic_load(&inst->inflight)));
    json_object_set_new(load, "prompt_tokens",
                        json_integer((json_int_t)atomic_load(&inst->prompt_tokens)));
    json_object_set_new(load, "kv_tokens", json_integer((json_int_t)atomic_load(&inst->kv_tokens)));
    if (free_at && now < free_at + sched_pool_kv_ttl_ms(pool))
        json_object_set_new(load, "kv_free_chunks",
                            json_integer((json_int_t)atomic_load(&inst->kv_free_chunks)));
    else
        json_object_set_new(load, "kv_free_chunks", json_null());
    json_object_set_new(
        load, "score",
        json_real((double)sched_instance_score(inst, now) / (double)SCHED_LOAD_UNIT));
}

/* Figures scraped from the engine's /metrics; the caller holds inst->mu. */
static void instance_scraped_json(json_t *load, sched_pool_t *pool, sched_instance_t *inst,
                                  uint64_t now)
{
    json_t *scraped;

    if (inst->scraped_at_ms) {
        uint64_t age = now > inst->scraped_at_ms ? now - inst->scraped_at_ms : 0;
        scraped = json_object();
        if (scraped) {
            json_object_set_new(scraped, "running", json_real(inst->scraped_running));
            json_object_set_new(scraped, "waiting", json_real(inst->scraped_waiting));
            json_object_set_new(scraped, "kv_cache_usage", json_real(inst->scraped_kv_usage));
            json_object_set_new(scraped, "age_ms", json_integer((json_int_t)age));
            json_object_set_new(scraped, "stale", json_boolean(age > pool->stale_ms));
            json_object_set_new(load, "scraped", scraped);
        }
    } else {
        json_object_set_new(load, "scraped", json_null());
    }
}

/* Health-probe state; the caller holds inst->mu. */
static void instance_health_json(json_t *health, sched_instance_t *inst, uint64_t now)
{
    json_object_set_new(health, "up", json_boolean(!sched_gate_down(inst)));
    json_object_set_new(health, "consecutive_ok", json_integer(inst->health_ok));
    json_object_set_new(health, "consecutive_fail", json_integer(inst->health_fail));
    json_object_set_new(health, "last_status", json_integer(inst->last_probe_status));
    if (inst->last_probe_ms)
        json_object_set_new(
            health, "last_probe_age_ms",
            json_integer((json_int_t)(now > inst->last_probe_ms ? now - inst->last_probe_ms : 0)));
    else
        json_object_set_new(health, "last_probe_age_ms", json_null());
}

/* Circuit-breaker state; the caller holds inst->mu. */
static void instance_breaker_json(json_t *breaker, sched_instance_t *inst, sched_breaker_state_t br,
                                  uint64_t br_until, uint64_t now)
{
    json_object_set_new(breaker, "state", json_string(sched_breaker_state_name(br)));
    json_object_set_new(breaker, "consecutive_failures", json_integer(inst->breaker_failures));
    json_object_set_new(breaker, "retry_in_ms",
                        json_integer(br == SCHED_BREAKER_OPEN && br_until > now
                                         ? (json_int_t)(br_until - now)
                                         : 0));
}

/* "kv_events": what its publisher said lately (precise-prefix only; null when it has none). */
static void instance_kv_events_json(json_t *o, sched_pool_t *pool, sched_instance_t *inst)
{
    sched_kvev_silence_t si;
    json_t *kv;

    if (!pool->kvev_sub || !sched_kvev_sub_silence(pool->kvev_sub, inst->uid, &si)) {
        json_object_set_new(o, "kv_events", json_null());
        return;
    }
    kv = json_object();
    if (!kv)
        return;
    json_object_set_new(kv, "silence_seconds", json_real((double)si.silence_ms / 1000.0));
    json_object_set_new(kv, "ever", json_boolean(si.ever));
    json_object_set_new(kv, "silent", json_boolean(si.silent));
    json_object_set_new(kv, "routed_since_last_event", json_integer((json_int_t)si.routed));
    json_object_set_new(o, "kv_events", kv);
}

/* "latency": what its latency models predict now (a 1000-token prompt behind the prefill
 * work booked on it; one more request of 1000 KV tokens running), p90 and mean, and how
 * well they did so far. */
static void instance_latency_json(json_t *o, const sched_instance_t *inst)
{
    sched_prediction_t t, d;
    json_t *lat = json_object(), *ttft = json_object(), *tpot = json_object();

    if (!lat || !ttft || !tpot) {
        json_decref(lat);
        json_decref(ttft);
        json_decref(tpot);
        return;
    }
    sched_instance_predict_ttft(inst, 1000, &t);
    sched_instance_predict_tpot(inst, 1000, &d);
    json_object_set_new(ttft, "seconds_1k_tokens", json_real(t.mean));
    json_object_set_new(ttft, "p90_1k_tokens", json_real(t.upper));
    json_object_set_new(ttft, "observed", json_integer((json_int_t)t.observed));
    json_object_set_new(ttft, "error_ratio",
                        t.observed > SCHED_PREDICT_SCORED_AFTER && !isnan(t.err) ? json_real(t.err)
                                                                                 : json_null());
    json_object_set_new(tpot, "seconds", json_real(d.mean));
    json_object_set_new(tpot, "p90", json_real(d.upper));
    json_object_set_new(tpot, "observed", json_integer((json_int_t)d.observed));
    json_object_set_new(tpot, "error_ratio",
                        d.observed > SCHED_PREDICT_SCORED_AFTER && !isnan(d.err) ? json_real(d.err)
                                                                                 : json_null());
    json_object_set_new(lat, "ttft", ttft);
    json_object_set_new(lat, "tpot", tpot);
    json_object_set_new(o, "latency", lat);
}

/* "kv_headroom": the KV capacity the decode picks respect (sched_kv_headroom.c). */
static void instance_kv_headroom_json(json_t *o, const sched_instance_t *inst)
{
    json_t *kv = json_object();
    uint64_t cap = atomic_load_explicit(&inst->kv_capacity, RELAXED);

    if (!kv)
        return;
    json_object_set_new(kv, "capacity_tokens", cap ? json_integer((json_int_t)cap) : json_null());
    json_object_set_new(kv, "capacity_source",
                        json_string(sched_kv_capacity_source_name(
                            atomic_load_explicit(&inst->kv_capacity_source, RELAXED))));
    json_object_set_new(kv, "projected_tokens", json_integer((json_int_t)sched_kv_projected(inst)));
    json_object_set_new(
        kv, "engine_used_tokens",
        json_integer((json_int_t)atomic_load_explicit(&inst->kv_engine_used, RELAXED)));
    json_object_set_new(
        kv, "refusals",
        json_integer((json_int_t)atomic_load_explicit(&inst->kv_refusals, RELAXED)));
    json_object_set_new(o, "kv_headroom", kv);
}

json_t *sched_instance_to_json(sched_pool_t *pool, sched_instance_t *inst, uint64_t now)
{
    const sched_instance_desc_t *d = &inst->desc;
    json_t *o, *labels, *load, *health, *breaker;
    uint64_t free_at = atomic_load_explicit(&inst->kv_free_at_ms, RELAXED);
    uint64_t ov_until = atomic_load_explicit(&inst->overload_until_ms, RELAXED);
    uint64_t br_until = atomic_load_explicit(&inst->breaker_until_ms, RELAXED);
    sched_breaker_state_t br = sched_instance_breaker_state(inst);

    o = json_object();
    labels = json_object();
    load = json_object();
    health = json_object();
    breaker = json_object();
    if (!o || !labels || !load || !health || !breaker)
        goto err_free;
    for (size_t i = 0; i < d->n_labels; i++)
        json_object_set_new(labels, d->labels[i].key, json_string(d->labels[i].value));
    if (d->zone[0])
        json_object_set_new(labels, "zone", json_string(d->zone));

    json_object_set_new(o, "id", json_string(d->id));
    json_object_set_new(o, "url", json_string(d->url));
    json_object_set_new(o, "role", json_string(sched_role_name(d->role)));
    json_object_set_new(o, "state", json_string(sched_state_name(sched_instance_state(inst))));
    json_object_set_new(o, "source", json_string(sched_source_name(d->source)));
    json_object_set_new(o, "weight", json_integer(d->weight));
    json_object_set_new(o, "effective_weight",
                        json_real(sched_instance_effective_weight(inst, now) / 1024.0));
    json_object_set_new(o, "overloaded", json_boolean(ov_until > now));
    json_object_set_new(o, "zone", json_string(d->zone));
    json_object_set_new(o, "labels", labels);
    labels = NULL;
    instance_models_json(o, inst);
    instance_engine_json(o, d);

    instance_load_json(load, pool, inst, now, free_at);

    pthread_mutex_lock(&inst->mu);
    instance_scraped_json(load, pool, inst, now);
    instance_health_json(health, inst, now);
    instance_breaker_json(breaker, inst, br, br_until, now);
    json_object_set_new(o, "last_error",
                        inst->last_error[0] ? json_string(inst->last_error) : json_null());
    pthread_mutex_unlock(&inst->mu);

    json_object_set_new(o, "load", load);
    json_object_set_new(o, "health", health);
    json_object_set_new(o, "breaker", breaker);
    instance_kv_events_json(o, pool, inst);
    instance_latency_json(o, inst);
    instance_kv_headroom_json(o, inst);
    return o;

err_free:
    json_decref(o);
    json_decref(labels);
    json_decref(load);
    json_decref(health);
    json_decref(breaker);
    return NULL;
}

json_t *sched_admin_list(sched_pool_t *pool)
{
    sched_instance_t **arr;
    size_t n;
    json_t *list = json_array();
    uint64_t now = sched_pool_now(pool);

    if (!list)
        return NULL;
    if (sched_pool_collect(pool, &arr, &n) != SCHED_OK) {
        json_decref(list);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *o = sched_instance_to_json(pool, arr[i], now);
        if (!o || json_array_append_new(list, o) != 0) {
            json_decref(list);
            list = NULL;
            break;
        }
    }
    sched_pool_release_collected(arr, n);
    return list;
}

json_t *sched_admin_get(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);
    json_t *o;

    if (!inst)
        return NULL;
    o = sched_instance_to_json(pool, inst, sched_pool_now(pool));
    sched_instance_unref(inst);
    return o;
}

sched_status_t sched_admin_add(sched_pool_t *pool, const json_t *body, json_t **created_out,
                               char *err, size_t err_len)
{
    return sched_admin_add_checked(pool, body, NULL, NULL, created_out, err, err_len);
}

sched_status_t sched_admin_add_checked(sched_pool_t *pool, const json_t *body,
                                       sched_admin_check_fn check, void *arg, json_t **created_out,
                                       char *err, size_t err_len)
{
    sched_instance_desc_t d;
    sched_instance_t *inst;
    sched_status_t status;

    status = sched_instance_desc_from_json(body, &d, err, err_len);
    if (status != SCHED_OK)
        return status;
    d.source = SCHED_SOURCE_ADMIN;
    status = sched_instance_create(pool, &d, err, err_len, &inst);
    if (status != SCHED_OK)
        return status;
    if (check && !check(inst, arg, err, err_len)) {
        sched_instance_unref(inst);
        return SCHED_ERR_INVALID;
    }
    status = sched_pool_add(pool, &d, err, err_len);
    if (status == SCHED_OK && created_out) {
        json_t *o = sched_admin_get(pool, inst->desc.id);
        *created_out = o;
    }
    sched_instance_unref(inst);
    return status;
}
