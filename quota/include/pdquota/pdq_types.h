/*
 * pdq_types.h - the types of libpdquota (type-only: config, verdict, headers, usage).
 *
 * The gateway fills a pdq_config_t (from its own option table or with pdq_config_from_json)
 * and hands it to pdq_new; everything else here is an output of the library.
 */
#ifndef PDQ_TYPES_H
#define PDQ_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One status enum for the library: 0 OK, >0 "not yet", <0 errors. */
typedef enum pdq_status {
    PDQ_OK = 0,
    PDQ_WAIT = 1,    /* pdq_admit: queued for a concurrency slot; on_ready fires later */
    PDQ_REFUSED = 2, /* pdq_admit: refused; the verdict says why and when to retry */
    PDQ_ERR_NOMEM = -1,
    PDQ_ERR_INVALID = -2,     /* bad argument or configuration */
    PDQ_ERR_UNSUPPORTED = -3, /* e.g. rediss:// in a build without GnuTLS */
    PDQ_ERR_STATE = -4,       /* call not valid in the object's state */
} pdq_status_t;

/* Budgets of one tenant or one (tenant, model): 0 = unlimited. */
typedef struct pdq_budget {
    uint64_t rps;            /* requests per second */
    uint64_t rpm;            /* requests per minute */
    uint64_t tpm;            /* tokens per minute, prompt + completion */
    uint64_t prompt_tpm;     /* prompt tokens per minute */
    uint64_t completion_tpm; /* completion tokens per minute */
} pdq_budget_t;

typedef struct pdq_model_budget {
    const char *model;
    pdq_budget_t budget;
} pdq_model_budget_t;

typedef struct pdq_tenant_config {
    const char *name;            /* label value; [A-Za-z0-9_.-]{1,64}, not "other" */
    double weight;               /* share of tokens among waiting tenants; 0 = 1, else >= 0.01 */
    unsigned priority;           /* 0 = most urgent; classes are served strictly in order */
    uint32_t max_concurrent;     /* 0 = no per-tenant limit */
    uint32_t reserved;           /* slots of the global max_concurrent kept for this tenant */
    uint32_t max_waiting;        /* queued requests at most; 0 = PDQ_DEFAULT_MAX_WAITING */
    const char *const *api_keys; /* keys of this tenant (borrowed during pdq_new) */
    size_t n_api_keys;
    pdq_budget_t budget;
    const pdq_model_budget_t *models; /* optional per-model budgets */
    size_t n_models;
} pdq_tenant_config_t;

#define PDQ_DEFAULT_MAX_WAITING 1024u
#define PDQ_MAX_PRIORITY        7u
#define PDQ_MAX_TENANTS         1024u
#define PDQ_MAX_MODELS          256u

typedef enum pdq_fail_mode {
    PDQ_FAIL_OPEN = 0,   /* store down: serve on local limits = budget / expected_replicas */
    PDQ_FAIL_CLOSED = 1, /* store down: refuse (503-style verdict) */
} pdq_fail_mode_t;

/* The fleet-wide store: redis://[user:password@]HOST:PORT/DB. url NULL = local only. */
typedef struct pdq_store_config {
    const char *url;
    uint32_t connect_timeout_ms; /* 0 = 200 */
    uint32_t command_timeout_ms; /* 0 = 200: a hung server is given up after this */
    uint32_t sync_interval_ms;   /* 0 = 100: how often leases are topped up */
    uint32_t usage_interval_ms;  /* 0 = 1000: how often usage totals are pushed */
    uint32_t backoff_max_ms;     /* 0 = 5000: reconnect backoff cap (starts at 50 ms) */
    uint32_t lease_idle_ms;      /* 0 = 1000: an unused lease goes back after this */
    uint32_t expected_replicas;  /* 0 = 1: fail-open share and default slice */
    double lease_fraction;       /* slice = budget * this; 0 = 1 / (4 * expected_replicas) */
    pdq_fail_mode_t fail_mode;
    const char *key_prefix; /* 0 = "pdq:" */
    const char *password;   /* NULL = the URL's; else AUTH with this one (kept out of URLs) */
    /* rediss:// only (NULL/"" = unset): the CA bundle that signs the server's certificate
     * (default: the system's trust store), a client certificate and key (Redis asks for one
     * unless tls-auth-clients is off), the name to verify (default: the URL's host). */
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_server_name;
} pdq_store_config_t;

/* Messages for a human (store lost / back): the gateway's logger. level: 0 info, 1 warn. */
typedef void (*pdq_log_fn)(void *arg, int level, const char *msg);

typedef struct pdq_config {
    const pdq_tenant_config_t *tenants;
    size_t n_tenants;
    const char *default_tenant;       /* requests without an API key; NULL = the first tenant */
    const pdq_tenant_config_t *other; /* limits of "other" (unknown keys); NULL = default's */
    uint32_t max_concurrent;          /* gateway-wide in-flight requests; 0 = unlimited */
    const char *const *models;        /* model labels of usage besides those budgets name */
    size_t n_models;
    pdq_store_config_t store;
    pdq_log_fn log;
    void *log_arg;
} pdq_config_t;

/* Why a request was refused (or must wait). */
typedef enum pdq_code {
    PDQ_CODE_NONE = 0,
    PDQ_CODE_RATE_LIMITED,      /* a requests budget (rps, rpm) */
    PDQ_CODE_TOKENS_EXHAUSTED,  /* a tokens budget (tpm, prompt, completion) */
    PDQ_CODE_QUEUE_FULL,        /* max_waiting requests queued already */
    PDQ_CODE_STORE_UNAVAILABLE, /* fail_closed and the store is down: 503 */
    PDQ_CODE_COUNT
} pdq_code_t;

/* One response header, ready to send. */
typedef struct pdq_header {
    char name[40];
    char value[32];
} pdq_header_t;

#define PDQ_MAX_HEADERS 8

typedef struct pdq_headers {
    size_t n;
    pdq_header_t h[PDQ_MAX_HEADERS];
} pdq_headers_t;

typedef struct pdq_verdict {
    pdq_code_t code;
    int http_status;         /* 429, 503; 0 when admitted or waiting */
    uint64_t retry_after_ms; /* when a retry can succeed (0 = unknown / now) */
    pdq_headers_t headers;   /* x-ratelimit-* plus retry-after / retry-after-ms when refused */
} pdq_verdict_t;

/* Phases whose times are summed per (tenant, model). */
typedef enum pdq_phase {
    PDQ_PHASE_QUEUE = 0, /* measured by the library (admit to slot) */
    PDQ_PHASE_PREFILL,
    PDQ_PHASE_TRANSFER,
    PDQ_PHASE_DECODE,
    PDQ_PHASE_COUNT
} pdq_phase_t;

/* Usage counters of one (tenant, model); also the unit of the per-minute history. */
typedef struct pdq_usage {
    uint64_t requests;
    uint64_t prompt_tokens;        /* computed on a prefill */
    uint64_t cached_prompt_tokens; /* served from cache */
    uint64_t completion_tokens;    /* decode */
    uint64_t kv_bytes;
    uint64_t phase_ns[PDQ_PHASE_COUNT];
} pdq_usage_t;

#define PDQ_USAGE_FIELDS (5 + PDQ_PHASE_COUNT)

#ifdef __cplusplus
}
#endif
#endif /* PDQ_TYPES_H */
