/*
 * pdgw_metrics.h - a small Prometheus registry (text exposition format 0.0.4).
 *
 * A registry holds families (name, help, type, label names, buckets); a family holds series
 * (one per set of label values). Series are created on first use and live as long as the
 * registry; their handles (pdgw_metric_t *) may be cached and used from any thread.
 *
 * Hot path: counter/gauge/histogram updates are lock-free atomics on the series. Looking a
 * series up by label values is lock-free too (append-only table); only creating a new
 * series takes the family mutex. Each family holds at most `max_series` series: beyond the
 * cap a lookup returns NULL, the refusal is counted in pdgw_metrics_series_refused_total,
 * and every update function accepts NULL as a no-op - so a hostile label value can never
 * grow memory without bound.
 *
 * Names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* and not
 * start with "__"; "le" is reserved for histograms. Label values are escaped on output.
 */
#ifndef PDGW_METRICS_H
#define PDGW_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"
#include "pdgw_util.h"

typedef struct pdgw_metrics pdgw_metrics_t;
typedef struct pdgw_metric_family pdgw_metric_family_t;
typedef struct pdgw_metric pdgw_metric_t;

typedef enum pdgw_metric_type {
    PDGW_METRIC_COUNTER = 0,
    PDGW_METRIC_GAUGE = 1,
    PDGW_METRIC_HISTOGRAM = 2,
} pdgw_metric_type_t;

#define PDGW_METRICS_MAX_LABELS         8
#define PDGW_METRICS_MAX_BUCKETS        64
#define PDGW_METRICS_DEFAULT_MAX_SERIES 1000

/*
 * Collector: appends already formatted exposition text (its own HELP/TYPE lines) at the end
 * of every render, e.g. scheduler or libkvt metrics. Called under the registry's render
 * lock; must not call back into the same registry's render.
 */
typedef pdgw_status_t (*pdgw_metrics_collect_fn)(void *ctx, pdgw_buf_t *out);

/* New empty registry; <max_series_per_family> 0 = PDGW_METRICS_DEFAULT_MAX_SERIES. */
pdgw_status_t pdgw_metrics_create(size_t max_series_per_family, pdgw_metrics_t **out);
/* Frees the registry, its families and series (all handles become invalid). NULL is a no-op. */
void pdgw_metrics_destroy(pdgw_metrics_t *reg);

/*
 * Add a family. <label_names> (n_labels <= PDGW_METRICS_MAX_LABELS) and <help> are copied.
 * For histograms <buckets> are the finite upper bounds, strictly increasing, n_buckets <=
 * PDGW_METRICS_MAX_BUCKETS (+Inf is implicit); NULL/0 = the default latency buckets
 * (0.005 .. 10 s). Ignored for other types. PDGW_ERR_EXISTS for a duplicate name,
 * PDGW_ERR_INVALID for a bad name/label/bucket list. <out> is borrowed from the registry.
 */
pdgw_status_t pdgw_metrics_family_add(pdgw_metrics_t *reg, pdgw_metric_type_t type,
                                      const char *name, const char *help,
                                      const char *const *label_names, size_t n_labels,
                                      const double *buckets, size_t n_buckets,
                                      pdgw_metric_family_t **out);

/* Find a family by name; NULL if none. */
pdgw_metric_family_t *pdgw_metrics_family_find(pdgw_metrics_t *reg, const char *name);

/*
 * The series of <fam> for <label_values> (one per label name, in order; NULL array for a
 * family without labels), created on first use. Returns NULL when the cardinality cap is
 * reached, on OOM, or when a value is NULL or longer than 256 bytes. Never blocks other
 * lookups; safe from any thread.
 */
pdgw_metric_t *pdgw_metric_family_series(pdgw_metric_family_t *fam,
                                         const char *const *label_values);
/* Convenience for families with one or two labels. */
pdgw_metric_t *pdgw_metric_family_series1(pdgw_metric_family_t *fam, const char *v1);
pdgw_metric_t *pdgw_metric_family_series2(pdgw_metric_family_t *fam, const char *v1,
                                          const char *v2);
/* Number of series the family has now. */
size_t pdgw_metric_family_size(const pdgw_metric_family_t *fam);
/* An HTTP status as a label value ("200"), written into <buf>. */
#define PDGW_STATUS_LABEL_SIZE 12
const char *pdgw_metric_status_label(int status, char buf[PDGW_STATUS_LABEL_SIZE]);

/* Shortcuts: family without labels and its single series. NULL on error (logged). */
pdgw_metric_t *pdgw_metrics_counter_new(pdgw_metrics_t *reg, const char *name, const char *help);
pdgw_metric_t *pdgw_metrics_gauge_new(pdgw_metrics_t *reg, const char *name, const char *help);
pdgw_metric_t *pdgw_metrics_histogram_new(pdgw_metrics_t *reg, const char *name, const char *help,
                                          const double *buckets, size_t n_buckets);

/* Updates. <m> may be NULL (no-op). Using the wrong type's function is a no-op. */
void pdgw_counter_inc(pdgw_metric_t *m);
void pdgw_counter_add(pdgw_metric_t *m, uint64_t n);
/* Non-integer increments (e.g. seconds); negative or NaN values are ignored. */
void pdgw_counter_add_f(pdgw_metric_t *m, double v);
void pdgw_gauge_set(pdgw_metric_t *m, double v);
void pdgw_gauge_add(pdgw_metric_t *m, double v);
void pdgw_gauge_inc(pdgw_metric_t *m);
void pdgw_gauge_dec(pdgw_metric_t *m);
void pdgw_histogram_observe(pdgw_metric_t *m, double v);

/* Reads (tests, /admin): counter or gauge value; histogram: its sum. 0 for NULL. */
double pdgw_metric_value(const pdgw_metric_t *m);
uint64_t pdgw_histogram_count(const pdgw_metric_t *m);
double pdgw_histogram_sum(const pdgw_metric_t *m);

/* Register/unregister an external text collector (see pdgw_metrics_collect_fn). */
pdgw_status_t pdgw_metrics_collector_add(pdgw_metrics_t *reg, pdgw_metrics_collect_fn fn,
                                         void *ctx);
void pdgw_metrics_collector_remove(pdgw_metrics_t *reg, pdgw_metrics_collect_fn fn, void *ctx);

/*
 * Append the whole exposition (families in registration order, series in creation order,
 * then collectors) to <out>. Each family: "# HELP", "# TYPE", samples; histograms give
 * cumulative name_bucket{...,le="..."} lines ending with le="+Inf", then name_sum and
 * name_count (count equals the +Inf bucket). Families without series print only HELP/TYPE
 * (the *_new shortcuts create the single series of a label-free family right away).
 */
pdgw_status_t pdgw_metrics_render(pdgw_metrics_t *reg, pdgw_buf_t *out);

/* Content-Type of the rendered text. */
#define PDGW_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---------------------------------------------------------------- the gateway's metrics */

/* Default buckets (seconds) used by the gateway's standard histograms. */
extern const double pdgw_metrics_duration_buckets[]; /* request duration, 0.005..600 s */
extern const size_t pdgw_metrics_duration_buckets_n;
extern const double pdgw_metrics_ttft_buckets[]; /* 0.001..60 s */
extern const size_t pdgw_metrics_ttft_buckets_n;
extern const double pdgw_metrics_tpot_buckets[]; /* 0.001..5 s */
extern const size_t pdgw_metrics_tpot_buckets_n;

/*
 * Ready-made handles of the gateway's standard metrics (all in one registry):
 *   pdgw_requests_total{protocol,status}                counter   status = HTTP code "200"
 *   pdgw_request_duration_seconds{protocol}             histogram whole request
 *   pdgw_ttft_seconds{protocol}                         histogram first content event
 *   pdgw_tpot_seconds{protocol}                         histogram gap between tokens
 *   pdgw_phase_duration_seconds{protocol,phase}         histogram phase = queue|prefill|
 *                                                                 kv_transfer|decode
 *   pdgw_inflight_requests                              gauge
 *   pdgw_instance_inflight_requests{instance,role}      gauge
 *   pdgw_upstream_errors_total{protocol,instance,kind}  counter   kind = connect|timeout|
 *                                                                 status|protocol|reset
 *   pdgw_client_disconnects_total{protocol}             counter
 *   pdgw_retries_total{protocol}                        counter
 *   pdgw_rejected_requests_total{reason}                counter   reason = body_too_large|
 *                                                                 bad_json|invalid|auth|
 *                                                                 not_found|method|overload|
 *                                                                 ambiguous_length|client_pd_field|
 *                                                                 admin_auth|admin_forbidden|
 *                                                                 client_cert
 *   pdgw_requests_total{protocol,status}                          a stream cut after its 200
 *                                                                 counts as 502 (504 on a
 *                                                                 timeout), a client gone as 499
 *   pdgw_prefill_seconds{protocol}                      histogram prefill leg
 *   pdgw_kv_wait_seconds{protocol}                      histogram prefill done -> first decode
 *                                                                 event (two-stage only)
 *   pdgw_decode_seconds{protocol}                       histogram decode leg
 *   pdgw_pd_failures_total{protocol,phase}              counter   final failures by PD phase
 *   pdgw_prefill_missing_kv_params_total{protocol}      counter   prefill gave no
 *                                                                 kv_transfer_params
 *   pdgw_pd_cancel_notifs_total{protocol}               counter   KV cancel notices sent
 *   pdgw_local_resource_errors_total{kind}              counter   the gateway ran short itself:
 *                                                                 kind = fd|memory|socket|accept
 *                                                                 (not the instance's fault)
 *   pdgw_client_connections_closed_total{reason}        counter   reason = connection_limit|
 *                                                                 per_client_limit|
 *                                                                 descriptor_limit (refused at
 *                                                                 accept)|header_timeout|
 *                                                                 body_timeout|write_timeout
 *                                                                 (closed late)|
 *                                                                 malformed_request|
 *                                                                 head_too_large (native front
 *                                                                 end: head refused)
 *   pdgw_prompt_tokens_total{protocol}                  counter   usage.prompt_tokens the
 *                                                                 engines reported
 *   pdgw_completion_tokens_total{protocol}              counter   usage.completion_tokens
 *   pdgw_client_pd_fields_total{protocol,field,action}  counter   PD control fields a client
 *                                                                 sent; field = rule name
 *                                                                 (bounded), action = rejected|
 *                                                                 stripped|passed
 *   pdgw_client_streams_total{writer}                   counter   committed streams: direct
 *                                                                 (pdgw writes the socket) |
 *                                                                 library (MHD: TLS, HTTP/1.0)
 *   pdgw_build_info{version}                            gauge     always 1
 *   pdgw_metrics_series_refused_total                   counter   cardinality cap hits
 * Families are borrowed from <reg>; the struct itself is plain data (no destroy needed).
 */
typedef struct pdgw_gateway_metrics {
    pdgw_metrics_t *reg;
    pdgw_metric_family_t *requests_total;
    pdgw_metric_family_t *request_duration;
    pdgw_metric_family_t *ttft;
    pdgw_metric_family_t *tpot;
    pdgw_metric_family_t *phase_duration;
    pdgw_metric_t *inflight;
    pdgw_metric_family_t *instance_inflight;
    pdgw_metric_family_t *upstream_errors;
    pdgw_metric_family_t *client_disconnects;
    pdgw_metric_family_t *retries;
    pdgw_metric_family_t *rejected;
    pdgw_metric_t *build_info;
    /* PD phases (added for the PD forwarders; all labelled {protocol} unless noted) */
    pdgw_metric_family_t *prefill_seconds; /* prefill leg start -> prefill leg done */
    pdgw_metric_family_t *kv_wait_seconds; /* prefill done -> first relayed decode event */
    pdgw_metric_family_t *decode_seconds;  /* decode leg start -> decode leg done */
    pdgw_metric_family_t *pd_failures;     /* {protocol,phase} requests failed for good */
    pdgw_metric_family_t *prefill_missing_kv_params; /* prefill answered without params */
    pdgw_metric_family_t *pd_cancel_notifs;          /* KV cancel notices sent */
    pdgw_metric_family_t *local_resource_errors;     /* {kind}: the gateway's own shortage */
    pdgw_metric_family_t *conn_closed;   /* {reason}: client connections refused or closed */
    pdgw_metric_family_t *prompt_tokens; /* engine-reported usage */
    pdgw_metric_family_t *completion_tokens;
    pdgw_metric_family_t *client_pd_fields; /* {protocol,field,action} client PD fields */
    pdgw_metric_family_t *client_streams;   /* {writer}: direct | library */
} pdgw_gateway_metrics_t;

/* Register the standard families in <reg> and fill <gm>. <version> labels pdgw_build_info. */
pdgw_status_t pdgw_gateway_metrics_init(pdgw_metrics_t *reg, const char *version,
                                        pdgw_gateway_metrics_t *gm);

/* The phases of pdgw_phase_duration_seconds. */
typedef enum pdgw_duration_phase {
    PDGW_DURATION_QUEUE,
    PDGW_DURATION_PREFILL,
    PDGW_DURATION_KV_TRANSFER,
    PDGW_DURATION_DECODE,
    PDGW_DURATION_PHASES
} pdgw_duration_phase_t;

/* The series one protocol's requests observe, each looked up at its first use and kept
 * (the protocol of a server never changes and series are never dropped): a request's figures
 * then cost no lookup. requests_total is kept for status 200 only. Workers share a view: the
 * slots are atomic, and a lookup made twice finds the same series. */
typedef struct pdgw_proto_metrics {
    pdgw_gateway_metrics_t *gm; /* NULL: nothing is counted */
    const char *protocol;       /* borrowed: outlives the view */
    _Atomic(pdgw_metric_t *) requests_ok;
    _Atomic(pdgw_metric_t *) request_duration, ttft, tpot;
    _Atomic(pdgw_metric_t *) prefill_seconds, kv_wait_seconds, decode_seconds;
    _Atomic(pdgw_metric_t *) prompt_tokens, completion_tokens;
    _Atomic(pdgw_metric_t *) phase[PDGW_DURATION_PHASES];
} pdgw_proto_metrics_t;

/* A view of <protocol> (NULL <gm> or <protocol>: one that counts nothing). */
void pdgw_proto_metrics_init(pdgw_proto_metrics_t *pm, pdgw_gateway_metrics_t *gm,
                             const char *protocol);

/* What a request of the view's protocol observed (NULL-safe). */
void pdgw_gateway_metrics_request_done(pdgw_proto_metrics_t *pm, int http_status,
                                       double duration_s);
void pdgw_gateway_metrics_observe_ttft(pdgw_proto_metrics_t *pm, double seconds);
void pdgw_gateway_metrics_observe_tpot(pdgw_proto_metrics_t *pm, double seconds);
void pdgw_gateway_metrics_observe_phase(pdgw_proto_metrics_t *pm, pdgw_duration_phase_t phase,
                                        double seconds);
void pdgw_gateway_metrics_observe_prefill(pdgw_proto_metrics_t *pm, double seconds);
/* The KV wait, which is also the kv_transfer phase. */
void pdgw_gateway_metrics_observe_kv_wait(pdgw_proto_metrics_t *pm, double seconds);
void pdgw_gateway_metrics_observe_decode(pdgw_proto_metrics_t *pm, double seconds);

/* Helpers over the families above for rarer events (lookups are lock-free; NULL-safe). */
void pdgw_gateway_metrics_upstream_error(pdgw_gateway_metrics_t *gm, const char *protocol,
                                         const char *instance, const char *kind);
void pdgw_gateway_metrics_client_disconnect(pdgw_gateway_metrics_t *gm, const char *protocol);
void pdgw_gateway_metrics_retry(pdgw_gateway_metrics_t *gm, const char *protocol);
void pdgw_gateway_metrics_rejected(pdgw_gateway_metrics_t *gm, const char *reason);
/* A committed stream, by who writes its body ("direct" or "library"). */
void pdgw_gateway_metrics_client_stream(pdgw_gateway_metrics_t *gm, const char *writer);
void pdgw_gateway_metrics_pd_failure(pdgw_gateway_metrics_t *gm, const char *protocol,
                                     const char *phase);
void pdgw_gateway_metrics_prefill_missing_kv_params(pdgw_gateway_metrics_t *gm,
                                                    const char *protocol);
void pdgw_gateway_metrics_cancel_notif(pdgw_gateway_metrics_t *gm, const char *protocol);
/* Count the engine-reported token usage in one relayed response body or SSE event <json>
 * (<len> bytes; a body without a "usage" object costs one scan and counts nothing). Returns
 * true and sets *prompt_out / *completion_out (when not NULL) when it held usage. */
bool pdgw_gateway_metrics_usage(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                int64_t *prompt_out, int64_t *completion_out);
/* usage.prompt_tokens_details.cached_tokens of a JSON text (an answer or an SSE event), as
 * vLLM reports it with --enable-prompt-tokens-details: true and *cached > 0 when present. */
bool pdgw_usage_cached_tokens(const char *json, size_t len, int64_t *cached);
/* pdgw_gateway_metrics_usage (or, <answer>, _usage_answer) and the cached tokens in the same
 * walk (*cached_out 0 when absent): what a tenant's accounting needs, read once. */
bool pdgw_gateway_metrics_usage_cached(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                       bool answer, int64_t *prompt_out, int64_t *completion_out,
                                       int64_t *cached_out);
/* The same for a whole non-stream answer, which nearly always holds usage: read back from its
 * end, without the quick look for "usage" that spares most SSE events the walk. */
bool pdgw_gateway_metrics_usage_answer(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                       int64_t *prompt_out, int64_t *completion_out);
/* The same for a reply the gateway holds as a tree (a rewritten answer): its top-level
 * "usage" object, the counts read as json_integer_value reads them. */
bool pdgw_gateway_metrics_usage_tree(pdgw_proto_metrics_t *pm, const json_t *reply,
                                     int64_t *prompt_out, int64_t *completion_out);
/* An upstream leg to <instance> (of role <role>: prefill|decode|both) started (+1) or
 * ended (-1): pdgw_instance_inflight_requests. */
void pdgw_gateway_metrics_instance_leg(pdgw_gateway_metrics_t *gm, const char *instance,
                                       const char *role, int delta);
void pdgw_gateway_metrics_client_pd_field(pdgw_gateway_metrics_t *gm, const char *protocol,
                                          const char *field, const char *action);
void pdgw_gateway_metrics_local_resource_error(pdgw_gateway_metrics_t *gm, const char *kind);
/* A client connection refused at accept (connection_limit, per_client_limit,
 * descriptor_limit) or closed by the gateway (header_timeout, body_timeout, write_timeout,
 * malformed_request, head_too_large). */
void pdgw_gateway_metrics_conn_closed(pdgw_gateway_metrics_t *gm, const char *reason);

/*
 * Create the {protocol} series of the configured protocol up front, so counters and
 * histograms without further labels show 0 from the first scrape (rate() works at once).
 */
void pdgw_gateway_metrics_touch_protocol(pdgw_gateway_metrics_t *gm, const char *protocol);

#endif /* PDGW_METRICS_H */
