/* Prometheus text of the scheduler (appended by the gateway to /metrics). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

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

typedef struct strbuf {
    char *p;
    size_t len, cap;
    bool failed;
} strbuf_t;

static void sb_printf(strbuf_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(strbuf_t *sb, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (sb->failed)
        return;
    for (;;) {
        size_t room = sb->cap - sb->len;
        va_start(ap, fmt);
        n = vsnprintf(sb->p + sb->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            sb->failed = true;
            return;
        }
        if ((size_t)n < room) {
            sb->len += (size_t)n;
            return;
        }
        {
            size_t cap = sb->cap * 2 + (size_t)n;
            char *np = sched_realloc(sb->p, cap);
            if (!np) {
                sb->failed = true;
                return;
            }
            sb->p = np;
            sb->cap = cap;
        }
    }
}

/* Label value escaped per the exposition format into <out>. */
static const char *esc(const char *in, char *out, size_t out_len)
{
    size_t o = 0;

    for (; *in && o + 3 < out_len; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    out[o] = '\0';
    return out;
}

/* The engines' own load, as last scraped from their /metrics (vLLM or SGLang names, see
 * sched_prom.c): one series per instance whose scrape is fresh; a stale or never-scraped
 * instance has no series rather than an old value. */
static void emit_engine_load(strbuf_t *sb, sched_pool_t *pool, sched_instance_t **arr, size_t n)
{
    static const struct {
        const char *name, *help;
    } fam[3] = {
        {"pdgw_engine_running_requests", "Requests the engine reports running (scraped)."},
        {"pdgw_engine_waiting_requests",
         "Requests the engine reports queued, PD queues included (scraped)."},
        {"pdgw_engine_kv_cache_usage_ratio", "KV cache in use on the engine, 0..1 (scraped)."},
    };
    char id[2 * SCHED_ID_MAX + 4];
    uint64_t now = sched_pool_now(pool);
    for (size_t f = 0; f < 3; f++) {
        sb_printf(sb, "# HELP %s %s\n# TYPE %s gauge\n", fam[f].name, fam[f].help, fam[f].name);
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
                sb_printf(sb, "%s{instance=\"%s\",role=\"%s\"} %.6g\n", fam[f].name,
                          esc(inst->desc.id, id, sizeof(id)), sched_role_name(inst->desc.role),
                          v[f]);
        }
    }
}

char *sched_metrics_text(sched_pool_t *pool)
{
    strbuf_t sb = {0};
    sched_instance_t **arr;
    size_t n;
    char id[2 * SCHED_ID_MAX + 4];
    uint64_t cum = 0;

    sb.cap = 4096;
    sb.p = sched_malloc(sb.cap);
    if (!sb.p)
        return NULL;
    sb.p[0] = '\0';
    if (sched_pool_collect(pool, &arr, &n) != SCHED_OK) {
        sched_free(sb.p);
        return NULL;
    }

    sb_printf(&sb, "# HELP pdgw_instance_inflight Booked requests in flight on an instance.\n"
                   "# TYPE pdgw_instance_inflight gauge\n");
    for (size_t i = 0; i < n; i++)
        sb_printf(&sb, "pdgw_instance_inflight{instance=\"%s\",role=\"%s\"} %u\n",
                  esc(arr[i]->desc.id, id, sizeof(id)), sched_role_name(arr[i]->desc.role),
                  atomic_load(&arr[i]->inflight));
    sb_printf(&sb, "# HELP pdgw_instance_healthy 1 when health probes report the instance up.\n"
                   "# TYPE pdgw_instance_healthy gauge\n");
    for (size_t i = 0; i < n; i++)
        sb_printf(&sb, "pdgw_instance_healthy{instance=\"%s\",role=\"%s\"} %d\n",
                  esc(arr[i]->desc.id, id, sizeof(id)), sched_role_name(arr[i]->desc.role),
                  sched_gate_down(arr[i]) ? 0 : 1);
    sb_printf(&sb, "# HELP pdgw_instance_draining 1 while the instance takes no new requests.\n"
                   "# TYPE pdgw_instance_draining gauge\n");
    for (size_t i = 0; i < n; i++)
        sb_printf(&sb, "pdgw_instance_draining{instance=\"%s\",role=\"%s\"} %d\n",
                  esc(arr[i]->desc.id, id, sizeof(id)), sched_role_name(arr[i]->desc.role),
                  sched_gate_drain(arr[i]) ? 1 : 0);
    emit_engine_load(&sb, pool, arr, n);
    sb_printf(&sb, "# HELP pdgw_breaker_state Circuit breaker: 0 closed, 1 open, 2 half-open.\n"
                   "# TYPE pdgw_breaker_state gauge\n");
    for (size_t i = 0; i < n; i++)
        sb_printf(&sb, "pdgw_breaker_state{instance=\"%s\"} %u\n",
                  esc(arr[i]->desc.id, id, sizeof(id)), sched_gate_breaker(arr[i]));
    sched_pool_release_collected(arr, n);

    sb_printf(&sb, "# HELP pdgw_schedule_seconds Time to choose and book instances.\n"
                   "# TYPE pdgw_schedule_seconds histogram\n");
    for (size_t b = 0; b < SCHED_HIST_BUCKETS; b++) {
        cum += atomic_load(&pool->hist[b]);
        sb_printf(&sb, "pdgw_schedule_seconds_bucket{le=\"%s\"} %llu\n", bucket_le[b],
                  (unsigned long long)cum);
    }
    cum += atomic_load(&pool->hist[SCHED_HIST_BUCKETS]);
    sb_printf(&sb, "pdgw_schedule_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    sb_printf(&sb, "pdgw_schedule_seconds_sum %.9f\n",
              (double)atomic_load(&pool->hist_sum_ns) / 1e9);
    sb_printf(&sb, "pdgw_schedule_seconds_count %llu\n", (unsigned long long)cum);

    sb_printf(&sb,
              "# HELP pdgw_no_instance_total Bookings that found no usable instance.\n"
              "# TYPE pdgw_no_instance_total counter\n"
              "pdgw_no_instance_total{role=\"prefill\"} %llu\n"
              "pdgw_no_instance_total{role=\"decode\"} %llu\n",
              (unsigned long long)atomic_load(&pool->no_instance[SCHED_RIDX_PREFILL]),
              (unsigned long long)atomic_load(&pool->no_instance[SCHED_RIDX_DECODE]));
    sb_printf(&sb,
              "# HELP pdgw_session_affinity_total Bookings by session affinity: on the key's "
              "home instance, or moved because the home was not usable.\n"
              "# TYPE pdgw_session_affinity_total counter\n"
              "pdgw_session_affinity_total{role=\"prefill\",result=\"home\"} %llu\n"
              "pdgw_session_affinity_total{role=\"prefill\",result=\"moved\"} %llu\n"
              "pdgw_session_affinity_total{role=\"decode\",result=\"home\"} %llu\n"
              "pdgw_session_affinity_total{role=\"decode\",result=\"moved\"} %llu\n",
              (unsigned long long)atomic_load(&pool->affinity_home[SCHED_RIDX_PREFILL]),
              (unsigned long long)atomic_load(&pool->affinity_moved[SCHED_RIDX_PREFILL]),
              (unsigned long long)atomic_load(&pool->affinity_home[SCHED_RIDX_DECODE]),
              (unsigned long long)atomic_load(&pool->affinity_moved[SCHED_RIDX_DECODE]));
    sb_printf(&sb,
              "# HELP pdgw_sched_double_release_total Booking legs finished twice "
              "(refused).\n"
              "# TYPE pdgw_sched_double_release_total counter\n"
              "pdgw_sched_double_release_total %llu\n",
              (unsigned long long)atomic_load(&pool->double_release));
    if (pool->kvev_sub) {
        sched_kvev_sub_stats_t ss;
        sched_kvev_index_stats_t is;
        sched_kvev_sub_stats(pool->kvev_sub, &ss);
        sched_kvev_index_stats(pool->kvev_index, &is);
        sb_printf(&sb,
                  "# HELP pdgw_kv_events_total KV events applied from the engines.\n"
                  "# TYPE pdgw_kv_events_total counter\npdgw_kv_events_total %llu\n"
                  "# HELP pdgw_kv_event_batches_total KV-event batches applied.\n"
                  "# TYPE pdgw_kv_event_batches_total counter\n"
                  "pdgw_kv_event_batches_total %llu\n"
                  "# HELP pdgw_kv_event_gaps_total Sequence gaps in KV-event streams.\n"
                  "# TYPE pdgw_kv_event_gaps_total counter\npdgw_kv_event_gaps_total %llu\n"
                  "# HELP pdgw_kv_event_replays_total Replays requested (failed: timed out).\n"
                  "# TYPE pdgw_kv_event_replays_total counter\n"
                  "pdgw_kv_event_replays_total{result=\"sent\"} %llu\n"
                  "pdgw_kv_event_replays_total{result=\"failed\"} %llu\n"
                  "# HELP pdgw_kv_event_restarts_total Publisher restarts (sequence reset).\n"
                  "# TYPE pdgw_kv_event_restarts_total counter\n"
                  "pdgw_kv_event_restarts_total %llu\n"
                  "# HELP pdgw_kv_event_bad_total Undecodable or misframed KV-event messages.\n"
                  "# TYPE pdgw_kv_event_bad_total counter\npdgw_kv_event_bad_total %llu\n"
                  "# HELP pdgw_kv_event_lag_seconds Age of the last batch when applied.\n"
                  "# TYPE pdgw_kv_event_lag_seconds gauge\npdgw_kv_event_lag_seconds %.3f\n"
                  "# HELP pdgw_kv_index_blocks Block residencies held by the KV index.\n"
                  "# TYPE pdgw_kv_index_blocks gauge\npdgw_kv_index_blocks %llu\n"
                  "# HELP pdgw_kv_index_capacity Bound of the KV index.\n"
                  "# TYPE pdgw_kv_index_capacity gauge\npdgw_kv_index_capacity %llu\n"
                  "# HELP pdgw_kv_index_evicted_total Residencies dropped by the bound.\n"
                  "# TYPE pdgw_kv_index_evicted_total counter\n"
                  "pdgw_kv_index_evicted_total %llu\n"
                  "# HELP pdgw_kv_index_orphans_total Stored blocks whose parent was unknown.\n"
                  "# TYPE pdgw_kv_index_orphans_total counter\n"
                  "pdgw_kv_index_orphans_total %llu\n",
                  (unsigned long long)ss.events, (unsigned long long)ss.messages,
                  (unsigned long long)ss.gaps, (unsigned long long)ss.replays,
                  (unsigned long long)ss.replay_failed, (unsigned long long)ss.restarts,
                  (unsigned long long)ss.bad_messages, (double)ss.lag_ms / 1000.0,
                  (unsigned long long)is.records, (unsigned long long)is.capacity,
                  (unsigned long long)is.evicted, (unsigned long long)is.orphans);
    }
    for (size_t i = 0; i < pool->n_discovery; i++) {
        const sched_discovery_slot_t *s = &pool->discovery[i];
        char *text;
        if (!s->ops->metrics_text)
            continue;
        text = s->ops->metrics_text(s->state);
        if (text) {
            sb_printf(&sb, "%s", text);
            if (sb.len && sb.p[sb.len - 1] != '\n')
                sb_printf(&sb, "\n");
            free(text);
        }
    }
    if (sb.failed) {
        sched_free(sb.p);
        return NULL;
    }
    return sb.p;
}
