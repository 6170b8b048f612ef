/*
 * kvt_metrics.h - counters of a libkvt engine, as a struct and as
 * Prometheus text the embedding process appends to its /metrics.
 */
#ifndef KVT_METRICS_H
#define KVT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Upper bounds (seconds) of the kvt_transfer_seconds histogram buckets. */
#define KVT_METRICS_NBUCKETS 12
extern const double kvt_metrics_bucket_bounds[KVT_METRICS_NBUCKETS];

typedef struct kvt_metrics {
    /* kvt_bytes_total{op="write"|"read"}: payload bytes this engine moved as
     * the initiator of one-sided operations. */
    uint64_t bytes_write;
    uint64_t bytes_read;
    /* kvt_transfer_seconds: one observation per completed transfer batch. */
    uint64_t transfer_count;
    double transfer_seconds_sum;
    uint64_t transfer_buckets[KVT_METRICS_NBUCKETS]; /* cumulative */
    uint64_t alloc_failures_total;                   /* kvt_alloc_failures_total (both sides) */
    uint32_t pinned_pages;                           /* kvt_pinned_pages (gauge) */
    uint32_t free_pages;                             /* kvt_free_pages (gauge) */
    uint32_t used_pages;                             /* kvt_used_pages (gauge) */
    uint32_t breaker_open;          /* kvt_breaker_open (gauge, peers backed off) */
    uint64_t breaker_skips_total;   /* kvt_breaker_skips_total */
    uint64_t bad_messages_total;    /* kvt_bad_messages_total (garbage on any socket) */
    uint64_t refusals_total;        /* kvt_refusals_total (requests a receiver refused) */
    uint64_t ctrl_timeouts_total;   /* kvt_ctrl_timeouts_total (replaced sockets) */
    uint64_t proxy_notifs_total;    /* kvt_proxy_notifs_total (sent) */
    uint64_t pull_expired_total;    /* kvt_pull_expired_total (released by the TTL sweep) */
    uint64_t pull_early_done_total; /* kvt_pull_early_done_total */
    uint64_t cancels_total;         /* kvt_cancels_total (CancelNotif handled) */
    uint64_t backpressure_total;    /* kvt_backpressure_total (stores refused) */
    uint64_t already_sent_total;    /* kvt_already_sent_total (keys skipped by dedup) */
    uint64_t transfer_errors_total; /* kvt_transfer_errors_total */
    uint64_t reserve_granted_total; /* kvt_reserve_granted_total */
    uint64_t reserve_refused_total; /* kvt_reserve_refused_total */
    /* Receiver allocations nobody wrote or claimed within pd_alloc_ttl, freed by the expiry
     * timer (kvt_alloc_expired_total), and chunks refused because their sender (source
     * address) held its pd_alloc_quota of unclaimed pages (kvt_alloc_quota_refused_total). */
    uint64_t alloc_expired_total;
    uint64_t alloc_quota_refused_total;
    /* Data listener (from the transport's stats): kvt_data_lanes_refused_total{reason},
     * kvt_data_lanes_closed_total{reason}, kvt_data_access_denied_total,
     * kvt_data_bad_frames_total. */
    uint64_t lanes_refused_cap, lanes_refused_hello, lanes_closed_idle, lanes_closed_stall;
    uint64_t data_access_denied, data_bad_frames;
} kvt_metrics_t;

/* Record one transfer of <seconds> into <m>'s histogram. */
void kvt_metrics_observe(kvt_metrics_t *m, double seconds);

/* Write <m> as Prometheus text (HELP/TYPE lines + samples). <labels> is
 * either NULL or a label list without braces (e.g. `instance="p0"`) added
 * to every sample. Returns the length needed (like snprintf); the output is
 * NUL-terminated when size > 0; 0 when out of memory. */
size_t kvt_metrics_format(const kvt_metrics_t *m, const char *labels, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KVT_METRICS_H */
