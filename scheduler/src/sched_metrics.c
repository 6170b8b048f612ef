/* Prometheus text of the scheduler (appended by the gateway to /metrics). */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "sched_int.h"
#include "sched_kvev_int.h"
#include "pdb/pdb_prom.h"

/* Upper bounds of pdgw_schedule_seconds, in nanoseconds and as text. */
static const uint64_t bucket_ns[SCHED_HIST_BUCKETS] = {
    1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 5000000, 10000000,
};
static const char *const bucket_le[SCHED_HIST_BUCKETS] = {
    "1e-06",  "2.5e-06", "5e-06",  "1e-05", "2.5e-05", "5e-05",
    "0.0001", "0.00025", "0.0005", "0.001", "0.005",   "0.01",
};

void sched_metrics_observe_schedule(sched_pool_t *pool, uint64_t ns)
{
    size_t b = 0;

    while (b < SCHED_HIST_BUCKETS && ns > bucket_ns[b])
        b++;
    atomic_fetch_add_explicit(&pool->hist[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->hist_sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->hist_count, 1, memory_order_relaxed);
}

/* The {instance, role} label pairs of <inst> (values escaped by the writer). */
#define INST_LABELS(inst)                                                                          \
    (const char *const[])                                                                          \
    {                                                                                              \
        "instance", (inst)->desc.id, "role", sched_role_name((inst)->desc.role), NULL              \
    }

/* The engines' own load, as last scraped from their /metrics (vLLM or SGLang names, see
 * sched_prom.c): one series per instance whose scrape is fresh; a stale or never-scraped
 * instance has no series rather than an old value. */
static void emit_engine_load(pdb_prom_t *p, sched_pool_t *pool, sched_instance_t **arr, size_t n)
{
    static const struct {
        const char *name, *help;
    } fam[3] = {
        {"pdgw_engine_running_requests", "Requests the engine reports running (scraped)."},
        {"pdgw_engine_waiting_requests",
         "Requests the engine reports queued, PD queues included (scraped)."},
        {"pdgw_engine_kv_cache_usage_ratio", "KV cache in use on the engine, 0..1 (scraped)."},
    };
    uint64_t now = sched_pool_now(pool);
    for (size_t f = 0; f < 3; f++) {
        pdb_prom_family(p, fam[f].name, "gauge", fam[f].help);
        for (size_t i = 0; i < n; i++) {
            sched_instance_t *inst = arr[i];
            double v[3];
            bool fresh;
            pthread_mutex_lock(&inst->mu);
            fresh = inst->scraped_at_ms != 0 &&
                    (now <= inst->scraped_at_ms || now - inst->scraped_at_ms <= pool->stale_ms);
            v[0] = inst->scraped_running;
            v[1] = inst->scraped_waiting;
            v[2] = inst->scraped_kv_usage;
            pthread_mutex_unlock(&inst->mu);
            if (fresh)
                pdb_prom_sample(p, fam[f].name, NULL, INST_LABELS(inst), v[f]);
        }
    }
}

/* Per-instance gauges: in flight, healthy, draining, breaker state. */
static void emit_instances(pdb_prom_t *p, sched_instance_t **arr, size_t n)
{
    pdb_prom_family(p, "pdgw_instance_inflight", "gauge",
                    "Booked requests in flight on an instance.");
    for (size_t i = 0; i < n; i++)
        pdb_prom_sample_u64(p, "pdgw_instance_inflight", NULL, INST_LABELS(arr[i]),
                            atomic_load(&arr[i]->inflight));
    pdb_prom_family(p, "pdgw_instance_healthy", "gauge",
                    "1 when health probes report the instance up.");
    for (size_t i = 0; i < n; i++)
        pdb_prom_sample_u64(p, "pdgw_instance_healthy", NULL, INST_LABELS(arr[i]),
                            sched_gate_down(arr[i]) ? 0 : 1);
    pdb_prom_family(p, "pdgw_instance_draining", "gauge",
                    "1 while the instance takes no new requests.");
    for (size_t i = 0; i < n; i++)
        pdb_prom_sample_u64(p, "pdgw_instance_draining", NULL, INST_LABELS(arr[i]),
                            sched_gate_drain(arr[i]) ? 1 : 0);
}

/* KV headroom of each instance (sched_kv_headroom.c): its capacity (labelled with where the
 * figure comes from; no series while unknown), what it is projected to hold, and how often a
 * booking passed it over for lack of room; the pool's bookings made with every decode full. */
static void emit_kv_headroom(pdb_prom_t *p, sched_pool_t *pool, sched_instance_t **arr, size_t n)
{
    pdb_prom_family(p, "pdgw_instance_kv_capacity_tokens", "gauge",
                    "KV tokens the engine holds: declared, from vllm:cache_config_info, or "
                    "learnt from its usage (source).");
    for (size_t i = 0; i < n; i++) {
        uint64_t cap = atomic_load(&arr[i]->kv_capacity);
        const char *const labels[] = {
            "instance", arr[i]->desc.id,
            "role",     sched_role_name(arr[i]->desc.role),
            "source",   sched_kv_capacity_source_name(atomic_load(&arr[i]->kv_capacity_source)),
            NULL};
        if (cap)
            pdb_prom_sample_u64(p, "pdgw_instance_kv_capacity_tokens", NULL, labels, cap);
    }
    pdb_prom_family(p, "pdgw_instance_kv_projected_tokens", "gauge",
                    "KV tokens the instance is projected to hold: booked (prompt + max_tokens of "
                    "open decode legs) or reported in use, the larger.");
    for (size_t i = 0; i < n; i++)
        pdb_prom_sample_u64(p, "pdgw_instance_kv_projected_tokens", NULL, INST_LABELS(arr[i]),
                            sched_kv_projected(arr[i]));
    pdb_prom_family(p, "pdgw_decode_kv_headroom_refusals_total", "counter",
                    "Decode bookings that passed the instance over: the request would not have "
                    "fitted in its KV memory while another decode had room.");
    for (size_t i = 0; i < n; i++) {
        if (arr[i]->roles & SCHED_ROLE_DECODE)
            pdb_prom_sample_u64(p, "pdgw_decode_kv_headroom_refusals_total", NULL,
                                (const char *const[]){"instance", arr[i]->desc.id, NULL},
                                atomic_load(&arr[i]->kv_refusals));
    }
    pdb_prom_family(p, "pdgw_decode_kv_overcommit_total", "counter",
                    "Decode bookings made while no usable decode had KV room for the request "
                    "(the least-filled one was chosen).");
    pdb_prom_sample_u64(p, "pdgw_decode_kv_overcommit_total", NULL, NULL,
                        atomic_load(&pool->kv_overcommit));
}

/* The latency models (sched_predict.c): per instance and phase, how many finished legs taught
 * it and its mean relative error; an instance not observed yet has no error series. */
static void emit_predictions(pdb_prom_t *p, sched_instance_t **arr, size_t n)
{
    static const char *const phase[3] = {"ttft", "tpot", "kv_handoff"};
    pdb_prom_family(p, "pdgw_predict_observations_total", "counter",
                    "Finished legs that taught an instance's latency model.");
    pdb_prom_family(p, "pdgw_predict_error_ratio", "gauge",
                    "Mean |actual - predicted| / actual of an instance's latency model (recent "
                    "legs weigh more).");
    for (size_t i = 0; i < n; i++) {
        const sched_latency_model_t *m[3] = {&arr[i]->lat_prefill, &arr[i]->lat_tpot,
                                             &arr[i]->lat_handoff};
        for (int k = 0; k < 3; k++) {
            const char *const labels[] = {"instance", arr[i]->desc.id, "phase", phase[k], NULL};
            uint64_t obs = atomic_load(&m[k]->observed);
            pdb_prom_sample_u64(p, "pdgw_predict_observations_total", NULL, labels, obs);
            double err = atomic_load(&m[k]->err);
            if (obs > SCHED_PREDICT_SCORED_AFTER && !isnan(err))
                pdb_prom_sample(p, "pdgw_predict_error_ratio", NULL, labels, err);
        }
    }
}

static void emit_breakers(pdb_prom_t *p, sched_instance_t **arr, size_t n)
{
    pdb_prom_family(p, "pdgw_breaker_state", "gauge",
                    "Circuit breaker: 0 closed, 1 open, 2 half-open.");
    for (size_t i = 0; i < n; i++)
        pdb_prom_sample_u64(p, "pdgw_breaker_state", NULL,
                            (const char *const[]){"instance", arr[i]->desc.id, NULL},
                            sched_gate_breaker(arr[i]));
}

static void emit_schedule(pdb_prom_t *p, sched_pool_t *pool)
{
    uint64_t cum = 0;
    char le[32];

    pdb_prom_family(p, "pdgw_schedule_seconds", "histogram", "Time to choose and book instances.");
    for (size_t b = 0; b <= SCHED_HIST_BUCKETS; b++) {
        cum += atomic_load(&pool->hist[b]);
        snprintf(le, sizeof(le), "le=\"%s\"", b < SCHED_HIST_BUCKETS ? bucket_le[b] : "+Inf");
        pdb_prom_sample_u64(p, "pdgw_schedule_seconds_bucket", le, NULL, cum);
    }
    pdb_prom_sample(p, "pdgw_schedule_seconds_sum", NULL, NULL,
                    (double)atomic_load(&pool->hist_sum_ns) / 1e9);
    pdb_prom_sample_u64(p, "pdgw_schedule_seconds_count", NULL, NULL, cum);
    pdb_prom_family(p, "pdgw_no_instance_total", "counter",
                    "Bookings that found no usable instance.");
    pdb_prom_sample_u64(p, "pdgw_no_instance_total", "role=\"prefill\"", NULL,
                        atomic_load(&pool->no_instance[SCHED_RIDX_PREFILL]));
    pdb_prom_sample_u64(p, "pdgw_no_instance_total", "role=\"decode\"", NULL,
                        atomic_load(&pool->no_instance[SCHED_RIDX_DECODE]));
    pdb_prom_family(p, "pdgw_session_affinity_total", "counter",
                    "Bookings by session affinity: on the key's home instance, or moved "
                    "because the home was not usable.");
    pdb_prom_sample_u64(p, "pdgw_session_affinity_total", "role=\"prefill\",result=\"home\"", NULL,
                        atomic_load(&pool->affinity_home[SCHED_RIDX_PREFILL]));
    pdb_prom_sample_u64(p, "pdgw_session_affinity_total", "role=\"prefill\",result=\"moved\"", NULL,
                        atomic_load(&pool->affinity_moved[SCHED_RIDX_PREFILL]));
    pdb_prom_sample_u64(p, "pdgw_session_affinity_total", "role=\"decode\",result=\"home\"", NULL,
                        atomic_load(&pool->affinity_home[SCHED_RIDX_DECODE]));
    pdb_prom_sample_u64(p, "pdgw_session_affinity_total", "role=\"decode\",result=\"moved\"", NULL,
                        atomic_load(&pool->affinity_moved[SCHED_RIDX_DECODE]));
    pdb_prom_family(p, "pdgw_sched_double_release_total", "counter",
                    "Booking legs finished twice (refused).");
    pdb_prom_sample_u64(p, "pdgw_sched_double_release_total", NULL, NULL,
                        atomic_load(&pool->double_release));
}

/* One single-sample family. */
static void emit_one(pdb_prom_t *p, const char *name, const char *type, const char *help,
                     const char *labels, double v)
{
    pdb_prom_family(p, name, type, help);
    pdb_prom_sample(p, name, labels, NULL, v);
}

static void emit_kv_events(pdb_prom_t *p, sched_pool_t *pool)
{
    sched_kvev_sub_stats_t ss;
    sched_kvev_index_stats_t is;

    sched_kvev_sub_stats(pool->kvev_sub, &ss);
    sched_kvev_index_stats(pool->kvev_index, &is);
    emit_one(p, "pdgw_kv_events_total", "counter", "KV events applied from the engines.", NULL,
             (double)ss.events);
    emit_one(p, "pdgw_kv_event_batches_total", "counter", "KV-event batches applied.", NULL,
             (double)ss.messages);
    emit_one(p, "pdgw_kv_event_gaps_total", "counter", "Sequence gaps in KV-event streams.", NULL,
             (double)ss.gaps);
    emit_one(p, "pdgw_kv_event_replays_total", "counter", "Replays requested (failed: timed out).",
             "result=\"sent\"", (double)ss.replays);
    pdb_prom_sample(p, "pdgw_kv_event_replays_total", "result=\"failed\"", NULL,
                    (double)ss.replay_failed);
    emit_one(p, "pdgw_kv_event_restarts_total", "counter", "Publisher restarts (sequence reset).",
             NULL, (double)ss.restarts);
    emit_one(p, "pdgw_kv_event_bad_total", "counter", "Undecodable or misframed KV-event messages.",
             NULL, (double)ss.bad_messages);
    emit_one(p, "pdgw_kv_event_reconnects_total", "counter",
             "KV-event connections lost (engine restart, a message over "
             "kv_events_max_message_bytes, a protocol error) and opened again.",
             NULL, (double)ss.reconnects);
    emit_one(p, "pdgw_kv_event_lag_seconds", "gauge", "Age of the last batch when applied.", NULL,
             (double)ss.lag_ms / 1000.0);
    emit_one(p, "pdgw_kv_index_blocks", "gauge", "Block residencies held by the KV index.", NULL,
             (double)is.records);
    emit_one(p, "pdgw_kv_index_capacity", "gauge", "Bound of the KV index.", NULL,
             (double)is.capacity);
    emit_one(p, "pdgw_kv_index_evicted_total", "counter", "Residencies dropped by the bound.", NULL,
             (double)is.evicted);
    emit_one(p, "pdgw_kv_index_orphans_total", "counter", "Stored blocks whose parent was unknown.",
             NULL, (double)is.orphans);
    emit_one(p, "pdgw_kv_index_remote_total", "counter",
             "Stored blocks not indexed: their storage is remote to the instance (locality).", NULL,
             (double)is.remote);
    emit_one(p, "pdgw_kv_index_removals_kept_total", "counter",
             "Block removals not applied: the engine still holds a copy (remaining_copy_counts).",
             NULL, (double)is.kept);
}

/* Per instance that publishes KV events: seconds since its last message (since it joined when
 * none came), and whether that silence is one while it is needed (sched_kvev_sub_silence). */
static void emit_kv_silence(pdb_prom_t *p, sched_pool_t *pool, sched_instance_t **arr, size_t n)
{
    pdb_prom_family(p, "pdgw_kv_event_silence_seconds", "gauge",
                    "Seconds since the instance's KV-event publisher sent its last message "
                    "(since it joined, when none came).");
    for (size_t i = 0; i < n; i++) {
        sched_kvev_silence_t si;
        if (sched_kvev_sub_silence(pool->kvev_sub, arr[i]->uid, &si))
            pdb_prom_sample(p, "pdgw_kv_event_silence_seconds", NULL,
                            (const char *const[]){"instance", arr[i]->desc.id, NULL},
                            (double)si.silence_ms / 1000.0);
    }
    pdb_prom_family(p, "pdgw_kv_event_silent", "gauge",
                    "1 while precise-prefix routes to the instance and its KV events stay away "
                    "longer than kv_events_silence.");
    for (size_t i = 0; i < n; i++) {
        sched_kvev_silence_t si;
        if (sched_kvev_sub_silence(pool->kvev_sub, arr[i]->uid, &si))
            pdb_prom_sample_u64(p, "pdgw_kv_event_silent", NULL,
                                (const char *const[]){"instance", arr[i]->desc.id, NULL},
                                si.silent ? 1 : 0);
    }
}

char *sched_metrics_text(sched_pool_t *pool)
{
    pdb_buf_t out = PDB_BUF_INIT;
    pdb_prom_t p;
    sched_instance_t **arr;
    size_t n;

    pdb_prom_init(&p, &out);
    if (sched_pool_collect(pool, &arr, &n) != SCHED_OK)
        return NULL;
    emit_instances(&p, arr, n);
    emit_engine_load(&p, pool, arr, n);
    emit_breakers(&p, arr, n);
    emit_predictions(&p, arr, n);
    emit_kv_headroom(&p, pool, arr, n);
    if (pool->kvev_sub)
        emit_kv_silence(&p, pool, arr, n);
    sched_pool_release_collected(arr, n);
    emit_schedule(&p, pool);
    sched_autoscale_emit(&p, pool);
    if (pool->kvev_sub)
        emit_kv_events(&p, pool);
    for (size_t i = 0; i < pool->n_discovery; i++) {
        const sched_discovery_slot_t *s = &pool->discovery[i];
        char *text;
        if (!s->ops->metrics_text)
            continue;
        text = s->ops->metrics_text(s->state);
        if (text) {
            pdb_prom_text(&p, text);
            free(text);
        }
    }
    if (pdb_prom_status(&p) != PDB_OK) {
        pdb_buf_free(&out);
        return NULL;
    }
    return pdb_buf_steal(&out, NULL);
}
