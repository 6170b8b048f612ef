/*
 * kvt_metrics.c - histogram bookkeeping and Prometheus text of kvt_metrics_t.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvt/kvt_metrics.h"

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

typedef struct out {
    char *buf;
    size_t size;
    size_t len;
} out_t;

__attribute__((format(printf, 2, 3))) static void emit(out_t *o, const char *fmt, ...)
{
    va_list ap;
    int n;
    size_t room = o->len < o->size ? o->size - o->len : 0;

    va_start(ap, fmt);
    n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

static void sample(out_t *o, const char *name, const char *help, const char *type,
                   const char *labels, const char *extra, double v)
{
    int has = labels != NULL && labels[0] != '\0';
    int hex = extra != NULL && extra[0] != '\0';

    if (help != NULL)
        emit(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    if (has || hex)
        emit(o, "%s{%s%s%s} %.17g\n", name, has ? labels : "", has && hex ? "," : "",
             hex ? extra : "", v);
    else
        emit(o, "%s %.17g\n", name, v);
}

size_t kvt_metrics_format(const kvt_metrics_t *m, const char *labels, char *buf, size_t size)
{
    out_t o = {.buf = buf, .size = size, .len = 0};
    char le[64];

    if (size > 0)
        buf[0] = '\0';
    sample(&o, "kvt_bytes_total", "Payload bytes moved by one-sided operations this engine issued.",
           "counter", labels, "op=\"write\"", (double)m->bytes_write);
    sample(&o, "kvt_bytes_total", NULL, NULL, labels, "op=\"read\"", (double)m->bytes_read);
    emit(&o, "# HELP kvt_transfer_seconds Time of one transfer batch.\n"
             "# TYPE kvt_transfer_seconds histogram\n");
    for (int i = 0; i < KVT_METRICS_NBUCKETS; i++) {
        snprintf(le, sizeof(le), "le=\"%g\"", kvt_metrics_bucket_bounds[i]);
        sample(&o, "kvt_transfer_seconds_bucket", NULL, NULL, labels, le,
               (double)m->transfer_buckets[i]);
    }
    sample(&o, "kvt_transfer_seconds_bucket", NULL, NULL, labels, "le=\"+Inf\"",
           (double)m->transfer_count);
    sample(&o, "kvt_transfer_seconds_sum", NULL, NULL, labels, NULL, m->transfer_seconds_sum);
    sample(&o, "kvt_transfer_seconds_count", NULL, NULL, labels, NULL, (double)m->transfer_count);
    sample(&o, "kvt_alloc_failures_total", "Pages a receiver could not allocate.", "counter",
           labels, NULL, (double)m->alloc_failures_total);
    sample(&o, "kvt_pinned_pages", "Pages pinned by transfers.", "gauge", labels, NULL,
           (double)m->pinned_pages);
    sample(&o, "kvt_free_pages", "Free pages of the KV buffer.", "gauge", labels, NULL,
           (double)m->free_pages);
    sample(&o, "kvt_used_pages", "Used pages of the KV buffer.", "gauge", labels, NULL,
           (double)m->used_pages);
    sample(&o, "kvt_breaker_open", "Peers backed off by the circuit breaker.", "gauge", labels,
           NULL, (double)m->breaker_open);
    sample(&o, "kvt_breaker_skips_total", "Transfers skipped by the circuit breaker.", "counter",
           labels, NULL, (double)m->breaker_skips_total);
    sample(&o, "kvt_bad_messages_total", "Malformed control messages dropped.", "counter", labels,
           NULL, (double)m->bad_messages_total);
    sample(&o, "kvt_refusals_total", "Requests a receiver refused (reason logged).", "counter",
           labels, NULL, (double)m->refusals_total);
    sample(&o, "kvt_ctrl_timeouts_total", "Control requests that timed out.", "counter", labels,
           NULL, (double)m->ctrl_timeouts_total);
    sample(&o, "kvt_proxy_notifs_total", "ProxyNotif messages sent.", "counter", labels, NULL,
           (double)m->proxy_notifs_total);
    sample(&o, "kvt_pull_expired_total", "Pulls released by the TTL sweep.", "counter", labels,
           NULL, (double)m->pull_expired_total);
    sample(&o, "kvt_pull_early_done_total", "PullDoneSignals that came before their pull.",
           "counter", labels, NULL, (double)m->pull_early_done_total);
    sample(&o, "kvt_cancels_total", "CancelNotif handled.", "counter", labels, NULL,
           (double)m->cancels_total);
    sample(&o, "kvt_backpressure_total", "Stores refused by backpressure.", "counter", labels, NULL,
           (double)m->backpressure_total);
    sample(&o, "kvt_already_sent_total", "Chunks skipped because the receiver had them.", "counter",
           labels, NULL, (double)m->already_sent_total);
    sample(&o, "kvt_transfer_errors_total", "Transfer batches that failed.", "counter", labels,
           NULL, (double)m->transfer_errors_total);
    sample(&o, "kvt_reserve_granted_total", "Reservations granted.", "counter", labels, NULL,
           (double)m->reserve_granted_total);
    sample(&o, "kvt_reserve_refused_total", "Reservations refused.", "counter", labels, NULL,
           (double)m->reserve_refused_total);
    return o.len;
}
