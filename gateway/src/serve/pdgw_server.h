/*
 * pdgw_server.h - the gateway's serving core: N shared-nothing workers, each with its own
 * libmicrohttpd daemon (external epoll, SO_REUSEPORT on the common port), its own libcurl
 * multi handle (socket API) and one epoll loop serving both.
 *
 * Life cycle (staged start-up): pdgw_server_create() (configures the forwarder, binds every
 * worker's listening socket; no thread yet) -> pdgw_server_start() (threads) ->
 * pdgw_server_drain() on SIGTERM (stop accepting, /ready 503) -> pdgw_server_wait_idle() ->
 * pdgw_server_destroy().
 */
#ifndef PDGW_SERVER_H
#define PDGW_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <pdsched/sched.h>

#include "pdgw/forwarder.h"
#include "pdgw_errors.h"
#include "pdgw_metrics.h"
#include "pdgw_req_info.h"

typedef struct pdgw_server pdgw_server_t;

/* Which HTTP client carries upstream legs (https:// upstreams always use libcurl). */
typedef enum { PDGW_UPSTREAM_CURL = 0, PDGW_UPSTREAM_NATIVE = 1 } pdgw_upstream_client_t;

/* Who writes a committed stream's body to a plain-HTTP/1.1 client: pdgw itself on the socket
 * (direct), or libmicrohttpd through its reader (library). */
typedef enum { PDGW_STREAM_OUT_LIBRARY = 0, PDGW_STREAM_OUT_DIRECT = 1 } pdgw_stream_output_t;
/* Who serves client connections: libmicrohttpd, pdgw's own HTTP/1.x server, or the latter
 * unless TLS is configured (auto; resolved when the server is created). */
typedef enum {
    PDGW_FRONTEND_MHD = 0,
    PDGW_FRONTEND_NATIVE = 1,
    PDGW_FRONTEND_AUTO = 2
} pdgw_frontend_t;

/* Everything the server needs; pointers are borrowed and must outlive the server. */
/* What the routing room (workflow/pdgw_route.h) is given: selective PD and tokenize before
 * routing. */
typedef struct pdgw_route_opts {
    /* Selective PD. A prompt of fewer tokens goes decode-only; so does one whose part the
     * booked decode does not hold is shorter (llm-d's nonCachedTokens). 0 = off. */
    unsigned pd_min_prompt_tokens;
    /* Decode-only when the booked decode holds at least this percentage of the prompt's
     * tokens (precise-prefix KV events). 0 = off. */
    unsigned pd_skip_cached_percent;
    /* Decode-only when the decode's latency models predict a sooner first token without the
     * prefill leg and a stall of its running requests within their TPOT slack. */
    bool pd_skip_predicted;
    /* Longest wait for POST /tokenize before routing without tokens; 0 = never ask. */
    uint64_t tokenize_timeout_ms;
    /* Tokenizations kept (by prompt hash). */
    unsigned tokenize_cache_entries;
    /* Tokenizers loaded in the gateway, model -> PATH or "engine" (config `tokenizers`);
     * borrowed for the server's start. NULL = every model asks its engine. */
    const struct pdgw_kv_list *tokenizers;
} pdgw_route_opts_t;

typedef struct pdgw_server_opts {
    const char *listen_host; /* "" or NULL = any address */
    int listen_port;         /* 0 = ephemeral (see pdgw_server_port) */
    unsigned workers;        /* >= 1 */
    const char *protocol;    /* registered forwarder name */
    pdgw_mode_t mode;
    const json_t *protocol_options; /* JSON object; NULL = {} */
    uint64_t max_body_bytes;
    uint64_t client_buffer_size; /* per client connection: request line, headers, body pieces */
    uint64_t max_buffered_body_bytes; /* all requests' bodies at once; 0 = no budget */
    uint64_t request_timeout_ms;
    uint64_t max_request_timeout_ms; /* cap of X-Request-Timeout; 0 = request_timeout */
    bool admin_untrusted_loopback;   /* admin writes need admin_api_key from loopback too */
    bool metrics_need_key;           /* /metrics behind the API keys */
    uint64_t connect_timeout_ms;
    uint64_t first_byte_timeout_ms;
    uint64_t idle_timeout_ms;
    unsigned retries;
    /* Client side: time to receive complete request headers (from accept or the end of the
     * previous request on the connection); 0 = no deadline. */
    uint64_t client_header_timeout_ms;
    unsigned max_connections;               /* all workers; 0 = derived from RLIMIT_NOFILE */
    unsigned max_connections_per_client;    /* per client address, all workers; 0 = no cap */
    pdgw_pd_fields_mode_t client_pd_fields; /* PD control fields from clients (reject) */
    const struct pdgw_auth *auth;           /* API keys (pdgw_auth.h); NULL = open */
    const char *const *models;              /* served model names; NULL/0 = ask the instances */
    size_t n_models;
    bool no_passthrough; /* other engine endpoints get pdgw's 404 instead of being proxied */
    const char *const *cors_origins; /* CORS allowed origins ("*" = any); NULL/0 = no CORS */
    size_t n_cors_origins;
    sched_pool_t *pool;              /* instance selection (required) */
    struct pdgw_otel *otel;          /* trace exporter; NULL = tracing off */
    pdgw_gateway_metrics_t *metrics; /* required */
    pdgw_route_opts_t route;         /* tokenize before routing, selective PD */
    struct pdgw_admit *admit;        /* admission, backoff, affinity (pdgw_admit.h); NULL = none */
    struct pdq *quota;               /* tenants' budgets and fair queue (pdquota.h); NULL = none */
    int quota_output_estimate;       /* completion tokens charged without max_tokens */
    /* KV bytes of one token per model (kv_bytes_per_token; owned by the caller): the KV a
     * tenant's PD request moved, for its usage. */
    const char *const *kv_bpt_models;
    const uint64_t *kv_bpt;
    size_t n_kv_bpt;
    struct pdgw_slo_config *slo;            /* SLO defaults and policy (pdgw_slo.h); NULL = none */
    struct pdgw_reload *reload;             /* POST /admin/reload; NULL = not available */
    const struct pdgw_tls *tls;             /* HTTPS front end; NULL = plain HTTP */
    pdgw_upstream_client_t upstream_client; /* native (default) or curl */
    pdgw_stream_output_t stream_output;     /* direct (default) or library */
    pdgw_frontend_t frontend;               /* auto (default), native (plain HTTP only), mhd */
} pdgw_server_opts_t;

/* Fill defaults (1 worker, neutral, batch, 16 MiB, 600 s / 3 s / 300 s / 60 s, 1 retry,
 * 30 s for headers, derived connection limit, 1024 connections per client address, the
 * native upstream client). */
void pdgw_server_opts_init(pdgw_server_opts_t *opts);

/*
 * Resolve and configure the forwarder, plan its dispatch, create and bind every worker.
 * On error a message is written to <err> and nothing stays allocated.
 */
pdgw_status_t pdgw_server_create(const pdgw_server_opts_t *opts, pdgw_server_t **out, char *err,
                                 size_t errlen);
/* Apply request_timeout, max_body_bytes, retries and protocol_options on config reloads
 * (pdgw_server_reload.c); <srv> must outlive every reload of <rl>. */
struct pdgw_reload;
pdgw_status_t pdgw_server_reload_register(pdgw_server_t *srv, struct pdgw_reload *rl);
/* Start the worker threads. */
pdgw_status_t pdgw_server_start(pdgw_server_t *srv);
/* The bound port (useful with listen_port 0). */
int pdgw_server_port(const pdgw_server_t *srv);
/* Stop accepting new connections, make /ready answer 503. Idempotent; any thread. */
void pdgw_server_drain(pdgw_server_t *srv);
/* Requests being served right now (all workers). */
uint64_t pdgw_server_inflight(const pdgw_server_t *srv);
/* Wait until no request is in flight or <timeout_ms> passed; true when idle. */
bool pdgw_server_wait_idle(pdgw_server_t *srv, uint64_t timeout_ms);
/* Stop the workers (in-flight requests are cancelled), free everything. NULL-safe. */
void pdgw_server_destroy(pdgw_server_t *srv);

#endif /* PDGW_SERVER_H */
