/*
 * kvt_metrics.c - histogram bookkeeping and Prometheus text of kvt_metrics_t.
 */
#include <stdio.h>
#include <string.h>

#include "kvt/kvt_metrics.h"
#include "pdb/pdb_prom.h"

const double kvt_metrics_bucket_bounds[KVT_METRICS_NBUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0};

void kvt_metrics_observe(kvt_metrics_t *m, double seconds)
{
    m->transfer_count++;
    m->transfer_seconds_sum += seconds;
    for (int i = 0; i < KVT_METRICS_NBUCKETS; i++) {
        if (seconds <= kvt_metrics_bucket_bounds[i])
            m->transfer_buckets[i]++;
    }
}

/* One sample of a kvt_* family (HELP/TYPE first when <help> is set); <labels> are the
 * caller's pre-rendered labels, <extra> this sample's own. */
static void sample(pdb_prom_t *p, const char *name, const char *help, const char *type,
                   const char *labels, const char *extra, double v)
{
    char raw[512];
    int has = labels != NULL && labels[0] != '\0';
    int hex = extra != NULL && extra[0] != '\0';

    if (help != NULL)
        pdb_prom_family(p, name, type, help);
    snprintf(raw, sizeof(raw), "%s%s%s", has ? labels : "", has && hex ? "," : "",
             hex ? extra : "");
    pdb_prom_sample(p, name, raw, NULL, v);
}

size_t kvt_metrics_format(const kvt_metrics_t *m, const char *labels, char *buf, size_t size)
{
    pdb_buf_t out = PDB_BUF_INIT;
    pdb_prom_t prom, *o = &prom;
    char le[64];
    size_t len;

    if (size > 0)
        buf[0] = '\0';
    pdb_prom_init(o, &out);
    sample(o, "kvt_bytes_total", "Payload bytes moved by one-sided operations this engine issued.",
           "counter", labels, "op=\"write\"", (double)m->bytes_write);
    sample(o, "kvt_bytes_total", NULL, NULL, labels, "op=\"read\"", (double)m->bytes_read);
    pdb_prom_family(o, "kvt_transfer_seconds", "histogram", "Time of one transfer batch.");
    for (int i = 0; i < KVT_METRICS_NBUCKETS; i++) {
        snprintf(le, sizeof(le), "le=\"%g\"", kvt_metrics_bucket_bounds[i]);
        sample(o, "kvt_transfer_seconds_bucket", NULL, NULL, labels, le,
               (double)m->transfer_buckets[i]);
    }
    sample(o, "kvt_transfer_seconds_bucket", NULL, NULL, labels, "le=\"+Inf\"",
           (double)m->transfer_count);
    sample(o, "kvt_transfer_seconds_sum", NULL, NULL, labels, NULL, m->transfer_seconds_sum);
    sample(o, "kvt_transfer_seconds_count", NULL, NULL, labels, NULL, (double)m->transfer_count);
    sample(o, "kvt_alloc_failures_total", "Pages a receiver could not allocate.", "counter", labels,
           NULL, (double)m->alloc_failures_total);
    sample(o, "kvt_pinned_pages", "Pages pinned by transfers.", "gauge", labels, NULL,
           (double)m->pinned_pages);
    sample(o, "kvt_free_pages", "Free pages of the KV buffer.", "gauge", labels, NULL,
           (double)m->free_pages);
    sample(o, "kvt_used_pages", "Used pages of the KV buffer.", "gauge", labels, NULL,
           (double)m->used_pages);
    sample(o, "kvt_breaker_open", "Peers backed off by the circuit breaker.", "gauge", labels, NULL,
           (double)m->breaker_open);
    sample(o, "kvt_breaker_skips_total", "Transfers skipped by the circuit breaker.", "counter",
           labels, NULL, (double)m->breaker_skips_total);
    sample(o, "kvt_bad_messages_total", "Malformed control messages dropped.", "counter", labels,
           NULL, (double)m->bad_messages_total);
    sample(o, "kvt_refusals_total", "Requests a receiver refused (reason logged).", "counter",
           labels, NULL, (double)m->refusals_total);
    sample(o, "kvt_ctrl_timeouts_total", "Control requests that timed out.", "counter", labels,
           NULL, (double)m->ctrl_timeouts_total);
    sample(o, "kvt_proxy_notifs_total", "ProxyNotif messages sent.", "counter", labels, NULL,
           (double)m->proxy_notifs_total);
    sample(o, "kvt_pull_expired_total", "Pulls released by the TTL sweep.", "counter", labels, NULL,
           (double)m->pull_expired_total);
    sample(o, "kvt_pull_early_done_total", "PullDoneSignals that came before their pull.",
           "counter", labels, NULL, (double)m->pull_early_done_total);
    sample(o, "kvt_cancels_total", "CancelNotif handled.", "counter", labels, NULL,
           (double)m->cancels_total);
    sample(o, "kvt_backpressure_total", "Stores refused by backpressure.", "counter", labels, NULL,
           (double)m->backpressure_total);
    sample(o, "kvt_already_sent_total", "Chunks skipped because the receiver had them.", "counter",
           labels, NULL, (double)m->already_sent_total);
    sample(o, "kvt_transfer_errors_total", "Transfer batches that failed.", "counter", labels, NULL,
           (double)m->transfer_errors_total);
    sample(o, "kvt_reserve_granted_total", "Reservations granted.", "counter", labels, NULL,
           (double)m->reserve_granted_total);
    sample(o, "kvt_reserve_refused_total", "Reservations refused.", "counter", labels, NULL,
           (double)m->reserve_refused_total);
    sample(o, "kvt_alloc_expired_total",
           "Receiver allocations nobody wrote or claimed within pd_alloc_ttl, freed.", "counter",
           labels, NULL, (double)m->alloc_expired_total);
    sample(o, "kvt_alloc_quota_refused_total",
           "Chunks refused: their sender held its pd_alloc_quota of unclaimed pages.", "counter",
           labels, NULL, (double)m->alloc_quota_refused_total);
    sample(o, "kvt_data_lanes_refused_total",
           "Data lanes refused: a lane cap (cap) or no valid HELLO in time (hello).", "counter",
           labels, "reason=\"cap\"", (double)m->lanes_refused_cap);
    sample(o, "kvt_data_lanes_refused_total", NULL, NULL, labels, "reason=\"hello\"",
           (double)m->lanes_refused_hello);
    sample(o, "kvt_data_lanes_closed_total",
           "Served data lanes closed: idle timeout (idle) or stalled mid-frame (stall).", "counter",
           labels, "reason=\"idle\"", (double)m->lanes_closed_idle);
    sample(o, "kvt_data_lanes_closed_total", NULL, NULL, labels, "reason=\"stall\"",
           (double)m->lanes_closed_stall);
    sample(o, "kvt_data_access_denied_total", "Data accesses outside the pages granted to a peer.",
           "counter", labels, NULL, (double)m->data_access_denied);
    sample(o, "kvt_data_bad_frames_total", "Malformed frames on the data port.", "counter", labels,
           NULL, (double)m->data_bad_frames);
    /* snprintf's contract: the full length, as much as fits copied (NUL-terminated) */
    len = pdb_prom_status(o) == PDB_OK ? out.len : 0;
    if (size > 0 && len > 0) {
        size_t n = len < size ? len : size - 1;
        memcpy(buf, out.data, n);
        buf[n] = '\0';
    }
    pdb_buf_free(&out);
    return len;
}
