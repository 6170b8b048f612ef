/*
 * pdgw_doctor_int.h - what the doctor's probe files share: one target per instance, the
 * row writer, and the small network helpers (bounded HTTP GET, TCP connect, ZeroMQ greeting).
 */
#ifndef PDGW_DOCTOR_INT_H
#define PDGW_DOCTOR_INT_H

#include <pthread.h>

#include <pdgw/forwarder.h>
#include <pdsched/kvev.h>

#include "pdgw_doctor.h"

#define DOC_MAX_SERVED 64 /* model names kept per instance */
#define DOC_MAX_DP     64 /* DP ranks tracked in events */

/* One instance under probe. The probes of one target run on one thread; the runner reads
 * the outcome after every thread was joined. */
typedef struct doc_target {
    size_t index;
    sched_instance_t *inst; /* referenced */
    pdgw_instance_t view;   /* borrowed from inst */
    const sched_instance_desc_t *desc;
    /* outcome, for the fleet-wide checks */
    bool reachable;
    bool models_known;
    char *served[DOC_MAX_SERVED];
    size_t n_served;
    int block_size; /* from BlockStored events; 0 = none seen */
    bool mixed_block_sizes;
} doc_target_t;

/* The report's rows (pdgw_doctor.c); the runner and the tests fill one. */
struct pdgw_doctor_report {
    pthread_mutex_t mu;
    pdgw_doctor_row_t *rows;
    size_t n, cap;
    size_t seq;
    size_t instances;
};

/* An empty report of <instances> instance(s); NULL without memory. */
pdgw_doctor_report_t *doc_report_new(size_t instances);
/* Sort the rows: by instance (fleet rows last), then in the order they were written. */
void doc_report_sort(pdgw_doctor_report_t *rep);

typedef struct doc_run {
    const pdgw_doctor_opts_t *opts;
    pdgw_doctor_report_t *rep;
    const char *protocol;
} doc_run_t;

/* Append a row (thread-safe). <fix> may be NULL. Formats with printf rules. */
void doc_row(doc_run_t *run, const doc_target_t *t, const char *check, pdgw_doctor_result_t r,
             const char *fix, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ---- pdgw_doctor.c: checks that compare the instances (after every probe ran) */
/* `models:` names no instance serves. */
void doc_check_fleet_models(doc_run_t *run, const doc_target_t *t, size_t n);
/* Instances of one model whose KV events carry different block sizes. */
void doc_check_block_sizes(doc_run_t *run, const doc_target_t *t, size_t n);

/* ---- pdgw_doctor_http.c */
/* GET <url> within <timeout_ms>: *status (0 = no answer, with err), body malloc'd and
 * NUL-terminated in *body (at most <max_bytes>; *truncated says so). PDGW_OK when an HTTP
 * answer came, PDGW_ERR_CONNECT / PDGW_ERR_TIMEOUT / PDGW_ERR_NOMEM otherwise. */
pdgw_status_t doc_http_get(const char *url, uint64_t timeout_ms, size_t max_bytes, long *status,
                           char **body, bool *truncated, char *err, size_t errlen);
/* "http://host:port" with IPv6 brackets where needed. */
void doc_http_base(const char *host, int port, char *out, size_t cap);
/* health, models, metrics of <t>. */
void doc_probe_http(doc_run_t *run, doc_target_t *t);
/* The verdicts on an answer (no I/O): GET /v1/models answered <status> with <body> (fills
 * t->served), GET /metrics answered 200 with <body> (the names of pdsched/engine_metrics.h). */
void doc_models_verdict(doc_run_t *run, doc_target_t *t, long status, const char *body);
void doc_metrics_verdict(doc_run_t *run, doc_target_t *t, const char *body);

/* ---- pdgw_doctor_proto.c */
/* The protocol's side channels of <t> (by run->protocol). */
void doc_probe_proto(doc_run_t *run, doc_target_t *t);
/* TCP connect to host:port within <timeout_ms> and read the ZeroMQ greeting's signature
 * (0xFF, 8 bytes, 0x7F): nothing is sent. 1 = a ZeroMQ peer, 0 = something else answered
 * (why in err), -1 = no connection (why in err). */
int doc_zmtp_probe(const char *host, int port, uint64_t timeout_ms, char *err, size_t errlen);
/* TCP connect only: 0 connected, -1 with why in err. */
int doc_tcp_probe(const char *host, int port, uint64_t timeout_ms, char *err, size_t errlen);

/* ---- pdgw_doctor_kvev.c */
void doc_probe_kvev(doc_run_t *run, doc_target_t *t);

/* What a kv_events_endpoint names, before anything is probed. */
typedef enum doc_kv_endpoint {
    DOC_KV_EP_TCP = 0,   /* tcp://host:port: host and port filled */
    DOC_KV_EP_BIND = 1,  /* host "*", 0.0.0.0 or "::": a bind address, nothing to connect to */
    DOC_KV_EP_OTHER = 2, /* ipc://, inproc://, or no port: not probed by TCP */
} doc_kv_endpoint_t;
doc_kv_endpoint_t doc_kvev_endpoint(const char *ep, char *host, size_t cap, int *port);

/* What listening to one publisher saw. */
typedef struct doc_kv_seen {
    uint64_t live, replayed, undecodable;
    bool replay_end;
    int block_size;   /* the last seen; 0 = none */
    bool mixed;       /* several block sizes */
    uint64_t dp_mask; /* ranks 0..63 seen */
    bool dp_big;      /* a rank >= 64 */
    char last_error[160];
} doc_kv_seen_t;

/* Fold one message's summary (sched_kvev_summarize's status <st>) into <s>. */
void doc_kvev_seen_add(doc_kv_seen_t *s, sched_kvev_source_t from, sched_status_t st,
                       const sched_kvev_summary_t *sum);
/* The rows of <t> after listening to <ep> saw <s> for run->opts->events_wait_ms; sets
 * t->block_size and t->mixed_block_sizes. */
void doc_kvev_verdict(doc_run_t *run, doc_target_t *t, const char *ep, const doc_kv_seen_t *s);

#endif /* PDGW_DOCTOR_INT_H */
