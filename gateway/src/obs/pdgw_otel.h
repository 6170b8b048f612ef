/*
 * pdgw_otel.h - OpenTelemetry traces over OTLP/HTTP with JSON bodies (libcurl + jansson).
 *
 * One span per sampled request ("pdgw <path>", kind SERVER) with child spans for the phases
 * that happened: queue (arrival to the first upstream leg), prefill (the prefill leg),
 * kv_transfer (prefill done to the first decode byte/event) and decode (the decode leg).
 * The request span's id is the span id pdgw forwards to the engines in `traceparent`, so
 * engine spans hang below it; a client's traceparent makes it the parent.
 *
 * Requests are recorded on the worker threads into a bounded queue (a full queue drops the
 * spans and counts them); one exporter thread sends batches to <endpoint>/v1/traces, off the
 * request path. Configuration: config keys tracing.otlp_endpoint / tracing.service_name /
 * tracing.sample_ratio, else the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (full URL),
 * OTEL_EXPORTER_OTLP_ENDPOINT (base URL), OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and
 * OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_SCHEDULE_DELAY (ms between exports, default 5000).
 */
#ifndef PDGW_OTEL_H
#define PDGW_OTEL_H

#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"
#include "pdgw_util.h"

typedef struct pdgw_otel pdgw_otel_t;

typedef struct pdgw_otel_config {
    char traces_url[512];   /* full URL the batches are POSTed to; "" = tracing off */
    char service_name[128]; /* resource attribute service.name */
    double sample_ratio;    /* 0..1, for roots without a sampled parent */
    bool parent_based;      /* a parent's sampled flag decides when there is one */
    uint64_t schedule_delay_ms;
    size_t max_queue_spans;
    size_t max_batch_spans;
} pdgw_otel_config_t;

/*
 * Fill <cfg> from the config keys (borrowed strings, "" = unset) and the environment
 * <envp> (NULL-terminated, "K=V"). Tracing stays off (traces_url "") when no endpoint is
 * set. PDGW_ERR_INVALID with a message in <err> for a bad ratio, sampler or URL.
 */
pdgw_status_t pdgw_otel_config_load(const char *endpoint, const char *service_name,
                                    const char *sample_ratio, char *const *envp,
                                    pdgw_otel_config_t *cfg, char *err, size_t errlen);

/* Start the exporter thread. *out stays NULL (and PDGW_OK) when tracing is off. */
pdgw_status_t pdgw_otel_create(const pdgw_otel_config_t *cfg, pdgw_otel_t **out, char *err,
                               size_t errlen);

/* Export what is queued (one last attempt), stop the thread, free. NULL-safe. */
void pdgw_otel_destroy(pdgw_otel_t *otel);

/* What a finished request contributes; times are CLOCK_MONOTONIC, 0 = did not happen. */
typedef struct pdgw_otel_request {
    const pdgw_traceparent_t *span;   /* trace id + this request's span id (forwarded) */
    const pdgw_traceparent_t *parent; /* the client's context, NULL when it sent none */
    const char *path;
    const char *method;
    const char *protocol;
    const char *model;
    const char *prefill_instance;
    const char *decode_instance;
    const char *request_id;
    const char *failure_phase; /* NULL on success */
    const char *error;         /* NULL on success */
    int status;
    unsigned retries;
    bool stream;
    uint32_t slo_ttft_ms, slo_tpot_ms; /* the request's latency targets; 0 = none */
    const char *slo_result;            /* met, missed_ttft, ...; NULL = no target */
    const char *tenant;                /* NULL = no tenants configured */
    int64_t cached_prompt_tokens;      /* of the prompt, served from cache; < 0 = unknown */
    int64_t prompt_tokens;             /* engine usage; < 0 = not reported */
    int64_t completion_tokens;
    uint64_t start_ns, end_ns;                 /* whole request */
    uint64_t first_leg_ns;                     /* end of the queue phase */
    uint64_t prefill_start_ns, prefill_end_ns; /* prefill leg */
    uint64_t decode_start_ns, decode_end_ns;   /* decode leg */
    uint64_t decode_first_ns;                  /* first byte of the decode leg */
} pdgw_otel_request_t;

/* Whether a request with context <span> (and the client's <parent>, NULL if none) is
 * traced: the parent's sampled flag when parent-based, else the trace-id ratio. The same
 * answer every time for the same ids. false when <otel> is NULL. */
bool pdgw_otel_sampled(const pdgw_otel_t *otel, const pdgw_traceparent_t *span,
                       const pdgw_traceparent_t *parent);

/* Sample and queue the spans of one request; never blocks on the network. NULL-safe. */
void pdgw_otel_record(pdgw_otel_t *otel, const pdgw_otel_request_t *req);

/* Prometheus text of the exporter's counters (pdgw_otel_spans_total{result}). */
pdgw_status_t pdgw_otel_metrics(void *otel, pdgw_buf_t *out);

#endif
