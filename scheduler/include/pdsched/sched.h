/*
 * libpdsched — the prefill/decode scheduler of pdgw.
 *
 * An instance pool (static, DNS and pluggable discovery), active health
 * probes and engine metric scrapes on a background thread (libcurl multi),
 * local load accounting, per-role selection policies, per-instance circuit
 * breakers and P/D bookings with exactly-once release. The library serves
 * no HTTP; the gateway routes its admin and metrics surfaces to the
 * functions at the end of this header.
 *
 * Start-up: sched_config_init() → fill the config → sched_pool_create() →
 * sched_pool_add() for extra instances → sched_pool_start() → picks/bookings
 * from any thread → sched_pool_destroy().
 *
 * Thread safety: every function taking a sched_pool_t, sched_instance_t or
 * sched_booking_t may be called from any thread, except that one booking
 * must not be used by two threads at the same moment (a booking belongs to
 * one request).
 */
#ifndef PDSCHED_SCHED_H
#define PDSCHED_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include <pdsched/predict.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Status                                                              */
/* ------------------------------------------------------------------ */

/* 0 OK, > 0 in progress / informational, < 0 errors. */
typedef enum sched_status {
    SCHED_OK = 0,
    SCHED_INPROGRESS = 1,
    SCHED_ERR_INVALID = -1,          /* bad argument or bad descriptor/config */
    SCHED_ERR_NO_MEMORY = -2,        /* allocation failed */
    SCHED_ERR_NOT_FOUND = -3,        /* no instance with that id */
    SCHED_ERR_EXISTS = -4,           /* id already present (add) / name registered */
    SCHED_ERR_NO_INSTANCE = -5,      /* no usable instance for the role */
    SCHED_ERR_ALREADY_RELEASED = -6, /* booking leg already finished (counted) */
    SCHED_ERR_UNSUPPORTED = -7,      /* unknown policy / discovery back-end */
    SCHED_ERR_STATE = -8,            /* wrong state (e.g. pool not started, leg not booked) */
    SCHED_ERR_IO = -9,               /* resolver / system call failure */
    SCHED_ERR_CLOSED = -10,          /* pool is shutting down */
} sched_status_t;

/* Static English text for a status; never NULL. */
const char *sched_strerror(sched_status_t status);

/* ------------------------------------------------------------------ */
/* Instances                                                           */
/* ------------------------------------------------------------------ */

typedef enum sched_role {
    SCHED_ROLE_PREFILL = 1,
    SCHED_ROLE_DECODE = 2,
    SCHED_ROLE_BOTH = 3, /* PREFILL | DECODE: serves either leg */
} sched_role_t;

typedef enum sched_state {
    SCHED_STATE_UP = 0,       /* selectable (unless its breaker is open) */
    SCHED_STATE_DRAINING = 1, /* no new bookings; in-flight ones finish */
    SCHED_STATE_DOWN = 2,     /* failed health probes; not selectable */
} sched_state_t;

typedef enum sched_source {
    SCHED_SOURCE_STATIC = 0, /* gateway config / quick-start flags */
    SCHED_SOURCE_DNS = 1,
    SCHED_SOURCE_K8S = 2,
    SCHED_SOURCE_ADMIN = 3, /* POST /admin/instances */
} sched_source_t;

typedef enum sched_breaker_state {
    SCHED_BREAKER_CLOSED = 0,
    SCHED_BREAKER_OPEN = 1,
    SCHED_BREAKER_HALF_OPEN = 2, /* one probe booking allowed */
} sched_breaker_state_t;

#define SCHED_ID_MAX         128 /* ids are at most 127 bytes */
#define SCHED_MAX_TP         64  /* alloc/init ports per TP rank */
#define SCHED_MAX_LABELS     16
#define SCHED_MAX_MODELS     16  /* configured model names per instance */
#define SCHED_MODEL_NAME_MAX 255 /* bytes of one model name */

typedef struct sched_label {
    const char *key;
    const char *value;
} sched_label_t;

/*
 * Everything known about one engine instance. As input (sched_pool_add,
 * sched_pool_upsert) the strings are borrowed and copied by the pool; the
 * "parsed" fields are ignored. As output (sched_instance_desc) the whole
 * struct is owned by the instance, immutable, and valid while the caller
 * holds a reference to the instance.
 */
typedef struct sched_instance_desc {
    const char *id;  /* NULL/"" → derived from the URL ("host:port") */
    const char *url; /* http://host:port[/base], required */
    sched_role_t role;
    unsigned weight;     /* 0 → 1 */
    const char *kv_host; /* NULL/"" → host of url */
    int kv_port;         /* vllm-kvt side channel, 0 = none */
    int bootstrap_port;  /* sglang / mooncake bootstrap, 0 = none */
    const char *engine_id;
    int alloc_ports[SCHED_MAX_TP]; /* lmcache receiver alloc port per TP rank */
    size_t n_alloc_ports;
    int init_ports[SCHED_MAX_TP]; /* lmcache receiver init port per TP rank */
    size_t n_init_ports;
    int tp_size; /* 0 → number of alloc_ports, at least 1 */
    int dp_rank;
    int dp_size;      /* 0 → 1 */
    const char *zone; /* shorthand for labels.zone; wins over labels */
    sched_label_t labels[SCHED_MAX_LABELS];
    size_t n_labels;
    /* Model names the instance serves (OpenAI `model`). None → learnt from the engine's
     * GET /v1/models with each health probe; until then the instance takes any model. */
    const char *models[SCHED_MAX_MODELS];
    size_t n_models;
    sched_source_t source;
    /* KV-event publisher of the engine ("tcp://host:port", vLLM's
     * --kv-events-config endpoint as seen from here) and its optional
     * replay ROUTER; "" = none. Read by the precise-prefix policy. */
    const char *kv_events_endpoint;
    const char *kv_events_replay_endpoint;
    /* Which KV engine the instance runs (SCHED_KV_ENGINE_*): pdgw extensions of the
     * LMCache control messages go only to libkvt peers. */
    int kv_engine;
    /* Capacity: legs open on this instance at once; 0 = unlimited. An instance at capacity
     * is skipped by every policy (and by session affinity) until a leg finishes. */
    unsigned max_concurrent;
    /* KV memory of the engine in tokens (its num_gpu_blocks x block_size); 0 = read it from
     * the engine's vllm:cache_config_info, else learn it from its KV usage. Decode picks keep
     * to decodes whose projected KV (booked and reported) leaves room for the request. */
    uint64_t kv_capacity_tokens;
    /* Protocol attributes: text the scheduler copies and compares but never reads (the
     * gateway's "key=value\n" lines for the forwarders); NULL = "". A protocol that needs a
     * new instance field adds it here without a scheduler change. */
    const char *attrs;

    /* Parsed from url by the pool (output only). */
    const char *scheme;    /* "http" or "https" */
    const char *host;      /* without IPv6 brackets */
    int port;              /* explicit or scheme default */
    const char *base_path; /* "" or "/prefix" without trailing slash */
} sched_instance_desc_t;

enum {
    SCHED_KV_ENGINE_UPSTREAM = 0, /* the engine's own KV stack (LMCache, NIXL, ...) */
    SCHED_KV_ENGINE_LIBKVT = 1    /* pdgw's libkvt (pdgw-sim, engines embedding libkvt) */
};

/* Zero the descriptor (role BOTH, weight 1, dp size 1, source static). */
void sched_instance_desc_init(sched_instance_desc_t *desc);

/*
 * Fill <desc> from a JSON object with the instance keys of the config
 * schema (id, url, role, zone, weight, kv_host, kv_port, bootstrap_port,
 * engine_id, alloc_ports, init_ports, tp_size, dp_rank, dp_size, labels,
 * models, kv_events_endpoint, kv_events_replay_endpoint).
 * Strings in <desc> are borrowed from <obj> (keep it alive). Unknown keys
 * and bad values are SCHED_ERR_INVALID with a message naming the key in
 * <err> (may be NULL).
 */
sched_status_t sched_instance_desc_from_json(const json_t *obj, sched_instance_desc_t *desc,
                                             char *err, size_t err_len);

/* Check a descriptor (URL parses, ports in range, sizes...) without adding it. */
sched_status_t sched_instance_desc_validate(const sched_instance_desc_t *desc, char *err,
                                            size_t err_len);

const char *sched_role_name(sched_role_t role);
sched_status_t sched_role_parse(const char *name, sched_role_t *role_out);
const char *sched_state_name(sched_state_t state);
const char *sched_source_name(sched_source_t source);
const char *sched_breaker_state_name(sched_breaker_state_t state);

typedef struct sched_instance sched_instance_t; /* opaque, ref-counted */

/* Take / drop a reference. An instance stays valid (descriptor included)
 * while referenced, even after it was removed from the pool. */
sched_instance_t *sched_instance_ref(sched_instance_t *inst);
void sched_instance_unref(sched_instance_t *inst);

/* The immutable descriptor (owned by the instance). */
const sched_instance_desc_t *sched_instance_desc(const sched_instance_t *inst);
const char *sched_instance_id(const sched_instance_t *inst);
const char *sched_instance_url(const sched_instance_t *inst); /* normalised, no trailing '/' */
/* Value of label <key>, or NULL. "zone" is always answered from the zone. */
const char *sched_instance_label(const sched_instance_t *inst, const char *key);
sched_state_t sched_instance_state(const sched_instance_t *inst);
sched_breaker_state_t sched_instance_breaker_state(const sched_instance_t *inst);
uint32_t sched_instance_inflight(const sched_instance_t *inst);
/* Does <inst> serve <model>? Configured names first, else the names learnt from the engine's
 * /v1/models; an instance whose names are not known yet serves any model. NULL/"" → true. */
bool sched_instance_serves(sched_instance_t *inst, const char *model);

/* Predictions of the instance's latency models, learnt from the legs finished on it with
 * timings (sched_result_t): the time to the first token of a prompt of <uncached_tokens>
 * with the prefill work still ahead on it now queued ahead (the booked prompts, less what
 * its learnt rate has computed of them since), and the time per output token with
 * one more request of <kv_tokens> running on it. Lock-free; a cold instance answers its
 * priors (out->observed 0). */
void sched_instance_predict_ttft(const sched_instance_t *inst, uint64_t uncached_tokens,
                                 sched_prediction_t *out);
void sched_instance_predict_tpot(const sched_instance_t *inst, uint64_t kv_tokens,
                                 sched_prediction_t *out);

/*
 * KV free-space hint for a decode instance, from libkvt's ReserveResponse
 * (free chunks after the reservation). The decode choice avoids instances
 * whose last hint said they are full. Expires after 4 × the scrape
 * interval (at least 5 s).
 */
void sched_instance_set_kv_free_chunks(sched_instance_t *inst, uint64_t free_chunks);

/* ------------------------------------------------------------------ */
/* Policies and configuration                                          */
/* ------------------------------------------------------------------ */

typedef enum sched_policy {
    SCHED_POLICY_ROUND_ROBIN = 0,
    SCHED_POLICY_RANDOM = 1,
    SCHED_POLICY_LEAST_LOAD = 2,
    SCHED_POLICY_POWER_OF_TWO = 3,
    SCHED_POLICY_PREFIX_AWARE = 4,
    SCHED_POLICY_WEIGHTED = 5,
    SCHED_POLICY_PRECISE_PREFIX = 6, /* engines' KV events (kv_events_endpoint) */
    SCHED_POLICY_SLO = 7,            /* predicted latency (sched_instance_predict_*) */
} sched_policy_t;

#define SCHED_POLICY_COUNT 8

/* Names of the config schema: round-robin, random, least-load,
 * power-of-two, prefix-aware, weighted, precise-prefix, slo. */
const char *sched_policy_name(sched_policy_t policy);
sched_status_t sched_policy_parse(const char *name, sched_policy_t *policy_out);

/*
 * Resolver used by DNS discovery: write up to <max_addrs> numeric
 * addresses of <host> (IPv4 dotted or IPv6 without brackets, each < 64
 * bytes) to <addrs>, set *n_out. SCHED_OK with *n_out == 0 means "the
 * name has no addresses" (all its instances drain); an error status keeps
 * the previous set unchanged. The default uses getaddrinfo().
 */
typedef struct sched_addr {
    char ip[64];
} sched_addr_t;
typedef sched_status_t (*sched_resolve_fn)(void *arg, const char *host, sched_addr_t *addrs,
                                           size_t max_addrs, size_t *n_out);

/* Monotonic milliseconds; injectable for tests. */
typedef uint64_t (*sched_clock_fn)(void *arg);

/* Log levels of sched_log_fn. */
typedef enum sched_log_level {
    SCHED_LOG_DEBUG = 0,
    SCHED_LOG_INFO = 1,
    SCHED_LOG_WARN = 2,
    SCHED_LOG_ERROR = 3,
} sched_log_level_t;

/* One log line (no trailing newline); called from any pool thread. */
typedef void (*sched_log_fn)(void *arg, sched_log_level_t level, const char *msg);

typedef struct sched_dns_config {
    const char *prefill; /* "host:port" or "" */
    const char *decode;
    const char *both;
    uint64_t interval_ms;     /* default 5000 */
    sched_resolve_fn resolve; /* NULL → getaddrinfo */
    void *resolve_arg;
} sched_dns_config_t;

/* Read by the Kubernetes EndpointSlice back-end (see discovery.h). */
typedef struct sched_k8s_config {
    const char *namespace_; /* "" → the pod's namespace file */
    const char *prefill_selector;
    const char *decode_selector;
    const char *both_selector;
    const char *port_name;  /* default "http" */
    const char *api_server; /* "" → https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT */
    const char *token_file;
    const char *ca_file;
} sched_k8s_config_t;

/*
 * Pool configuration; sched_config_init() sets the schema defaults. All
 * strings and arrays are borrowed for the duration of sched_pool_create()
 * only (the pool copies what it keeps), except the dns.resolve_arg and
 * clock_arg pointers, which must outlive the pool.
 */
typedef struct sched_config {
    sched_policy_t prefill_policy; /* default least-load */
    sched_policy_t decode_policy;  /* default least-load */

    uint64_t health_interval_ms; /* default 2000; 0 disables probes */
    uint64_t health_timeout_ms;  /* default 1000 */
    unsigned healthy_threshold;  /* default 1 */
    unsigned unhealthy_threshold;
    uint64_t metrics_scrape_interval_ms; /* default 2000; 0 disables scrapes */
    uint64_t metrics_stale_ms;           /* 0 → 3 × scrape interval */
    const char *health_path;             /* default "/health" */
    const char *metrics_path;            /* default "/metrics" */

    unsigned breaker_failures;    /* consecutive failures that open; default 5 */
    uint64_t breaker_open_ms;     /* default 10000 */
    uint64_t overload_penalty_ms; /* weight cut without Retry-After; default 5000 */

    unsigned prefix_block_tokens; /* tokens per hashed block; default 16 (text: ×4 bytes) */
    /* The engines' token budget per step (vLLM's --max-num-batched-tokens, SGLang's
     * --chunked-prefill-size): how the prefill replay cuts the queued prompts into steps;
     * default 2048 (vLLM's SchedulerConfig default). */
    uint32_t prefill_step_tokens;
    size_t prefix_max_blocks;    /* bounded index size per role; default 65536 */
    double prefix_load_slack;    /* best match is "overloaded" when its load exceeds the
                                    least load by more than this (requests); default 4 */
    double zone_load_slack;      /* same-zone decode preferred if within this; default 1 */
    uint32_t default_max_tokens; /* projected decode tokens when max_tokens is 0; 512 */

    /* precise-prefix: score = prefix_weight × cached fraction of the prompt
     * + load_weight × (1 − relative load), among instances loaded at most
     * prefix_load_slack above the least loaded. */
    double kv_events_prefix_weight;     /* default 2 */
    double kv_events_load_weight;       /* default 1 */
    double kv_events_other_tier_weight; /* a non-GPU cached block counts this much; 0.5 */
    size_t kv_events_max_blocks;        /* index bound (residency records); 1 << 20 */
    /* Largest KV-event message taken from a publisher or its replay ROUTER (ZMQ_MAXMSGSIZE);
     * a larger one drops that connection, which is opened again. 16 MiB (0 = that); at least
     * 64 KiB, at most 1 GiB. */
    size_t kv_events_max_message_bytes;
    /* precise-prefix: an instance routed a request (with tokens) whose publisher then sends
     * nothing for this long is warned about, once, as silent (gauge
     * pdgw_kv_event_silence_seconds, /admin/instances); 30000 (0 = that); at most 1 h. */
    uint64_t kv_events_silence_ms;

    /* Autoscaling signals (sched_autoscale.c; pdgw_autoscale_* in sched_metrics_text): the
     * latency targets replicas are sized for when requests carry none (ms; 1000 / 50), the
     * time constant of the demand averages (ms; 30000) and the scale-down stabilisation
     * window (ms; 120000: desired replicas fall only to the highest need seen in it). */
    uint32_t autoscale_ttft_ms;
    uint32_t autoscale_tpot_ms;
    uint64_t autoscale_tau_ms;
    uint64_t autoscale_window_ms;

    /* Static instances (config `instances:`), added at sched_pool_start(). */
    const sched_instance_desc_t *instances;
    size_t n_instances;

    sched_dns_config_t dns;
    sched_k8s_config_t kubernetes;

    sched_clock_fn clock; /* NULL → CLOCK_MONOTONIC */
    void *clock_arg;
    sched_log_fn log; /* NULL → warnings and errors to stderr */
    void *log_arg;
    uint64_t seed; /* random policies; 0 → time-based */
} sched_config_t;

void sched_config_init(sched_config_t *cfg);

/* Validate a config (policies, thresholds, static instances, DNS names)
 * for `pdgw --check-config`; message in <err> names the key. */
sched_status_t sched_config_validate(const sched_config_t *cfg, char *err, size_t err_len);

/* ------------------------------------------------------------------ */
/* Pool                                                                */
/* ------------------------------------------------------------------ */

typedef struct sched_pool sched_pool_t;

/* Allocate a pool (no threads, no I/O). *pool_out set on success only. */
sched_status_t sched_pool_create(const sched_config_t *cfg, sched_pool_t **pool_out);

/* Add the static instances, start discovery back-ends and the background
 * thread (probes, scrapes, discovery ticks, idle removals). */
sched_status_t sched_pool_start(sched_pool_t *pool);

/*
 * Run one iteration of the background work in the calling thread, waiting
 * at most <timeout_ms> for network events. Only for a pool that was not
 * started (tests, single-threaded tools); SCHED_ERR_STATE otherwise.
 */
sched_status_t sched_pool_poll(sched_pool_t *pool, int timeout_ms);

/* Stop the thread and discovery, drop every instance reference the pool
 * holds. Instances still referenced elsewhere live on until unref'd;
 * bookings must be destroyed before the pool. */
void sched_pool_destroy(sched_pool_t *pool);

/* Add one instance (source as in desc). SCHED_ERR_EXISTS if the id is taken. */
sched_status_t sched_pool_add(sched_pool_t *pool, const sched_instance_desc_t *desc, char *err,
                              size_t err_len);
/* Add descs[0..n) in one step: all of them or, on an error, none (SCHED_ERR_EXISTS for an
 * id already in the pool or twice in <descs>, SCHED_ERR_INVALID for a bad descriptor; <err>
 * names it). One snapshot for all: adding n instances one by one copies the set n times. */
sched_status_t sched_pool_add_many(sched_pool_t *pool, const sched_instance_desc_t *descs, size_t n,
                                   char *err, size_t err_len);

/* Look up by id; returns a new reference (unref it) or NULL. */
sched_instance_t *sched_pool_get(sched_pool_t *pool, const char *id);

/* Administrative state changes by id. Drain: no new bookings. Undrain:
 * back to up (probes decide from there). Remove: leaves the pool now;
 * bookings holding it finish normally. */
sched_status_t sched_pool_drain(sched_pool_t *pool, const char *id);
sched_status_t sched_pool_undrain(sched_pool_t *pool, const char *id);
sched_status_t sched_pool_remove(sched_pool_t *pool, const char *id);

/* Change how instances of <role> (PREFILL or DECODE) are chosen, from the next booking on
 * (config reload). SCHED_ERR_STATE when <policy> needs what the pool builds only at creation
 * (prefix-aware's index, precise-prefix's KV-event index): that change takes a restart. */
sched_status_t sched_pool_set_policy(sched_pool_t *pool, sched_role_t role, sched_policy_t policy);

/* Number of instances that could take a booking of <role> now (up, not
 * draining, breaker not open). PREFILL counts prefill+both instances,
 * DECODE decode+both, BOTH only instances of role both. */
size_t sched_pool_usable_count(sched_pool_t *pool, sched_role_t role);
size_t sched_pool_size(sched_pool_t *pool);

/* /ready: true when every role in <roles> (PREFILL, DECODE or BOTH = both
 * legs) has at least one usable instance. */
bool sched_pool_ready(sched_pool_t *pool, sched_role_t roles);

/* A usable instance of <role> (the <turn>-th of them, modulo their number) to
 * ask something of, e.g. a tokenization; a new reference (unref it), or NULL
 * when none is usable. Books nothing. */
sched_instance_t *sched_pool_pick_usable(sched_pool_t *pool, sched_role_t role, uint64_t turn);
/* The same among the instances serving <model> (NULL/"" = any; sched_models.c). */
sched_instance_t *sched_pool_pick_usable_model(sched_pool_t *pool, sched_role_t role, uint64_t turn,
                                               const char *model);

/* True when a policy of the pool matches prompts against the engines' KV
 * events (precise-prefix): routing then wants the prompt's token ids. */
bool sched_pool_has_kv_index(sched_pool_t *pool);

/* ------------------------------------------------------------------ */
/* Requests, bookings, outcomes                                        */
/* ------------------------------------------------------------------ */

/*
 * What the policies need to know about one request. Borrowed for the call.
 * Prefix-aware uses <tokens> when given, else <text> (the prompt, or the
 * chat messages' contents concatenated by the caller).
 */
typedef struct sched_request {
    const uint32_t *tokens; /* prompt token ids, or NULL */
    size_t n_tokens;
    const char *text;       /* prompt text, or NULL */
    size_t text_len;        /* 0 → strlen(text) */
    uint32_t prompt_tokens; /* estimate for accounting; 0 → n_tokens or text_len / 4 */
    uint32_t max_tokens;    /* 0 → config default_max_tokens */
    /* Ids never to pick for this request (e.g. failed on an earlier try). */
    const char *const *exclude_ids;
    size_t n_exclude_ids;
    /* Session affinity: requests with the same key go to the same instance of a role while
     * it is usable (rendezvous hashing over the role's instances, so an instance going away
     * moves only its own keys); NULL = the policy decides. Borrowed for the call. */
    const char *affinity_key;
    size_t affinity_key_len; /* 0 → strlen(affinity_key) */
    /* Only instances serving this model are picked (sched_instance_serves); NULL/"" = any. */
    const char *model;
    /* 0 = any role the leg allows; else only instances of exactly this role (e.g. BOTH for
     * requests that want an instance able to run a whole request by itself). */
    sched_role_t only_role;
    /* precise-prefix: the extra keys vLLM folds into a prompt's block hashes (vllm/v1/core/
     * kv_cache_utils.py): the LoRA adapter the request runs under and its cache_salt; NULL =
     * none. Borrowed for the call. */
    const char *lora_name;
    const char *cache_salt;
    /* Latency targets (milliseconds; 0 = none): time to first token, time per output token.
     * The slo policy keeps decodes whose predicted TPOT passes the target. */
    uint32_t slo_ttft_ms;
    uint32_t slo_tpot_ms;
} sched_request_t;

typedef enum sched_leg {
    SCHED_LEG_PREFILL = 0,
    SCHED_LEG_DECODE = 1,
} sched_leg_t;

typedef enum sched_outcome {
    SCHED_OUTCOME_SUCCESS = 0,
    SCHED_OUTCOME_CANCELLED = 1,      /* client went away / request aborted: no judgement */
    SCHED_OUTCOME_CLIENT_ERROR = 2,   /* 4xx other than 429: not the instance's fault */
    SCHED_OUTCOME_OVERLOADED = 3,     /* 429 / 503: weight cut, breaker untouched */
    SCHED_OUTCOME_CONNECT_ERROR = 4,  /* breaker failure */
    SCHED_OUTCOME_SERVER_ERROR = 5,   /* 5xx except 503: breaker failure */
    SCHED_OUTCOME_TRANSFER_ERROR = 6, /* broken stream, KV transfer failure: breaker failure */
    SCHED_OUTCOME_TIMEOUT = 7,        /* deadline hit upstream: breaker failure */
} sched_outcome_t;

const char *sched_outcome_name(sched_outcome_t outcome);

/* Map an upstream HTTP status to an outcome (2xx/3xx success, 429/503
 * overloaded, other 4xx client error, 5xx server error, 0 connect error). */
sched_outcome_t sched_outcome_from_http(int http_status);

/* How one leg ended. */
typedef struct sched_result {
    sched_outcome_t outcome;
    int http_status;         /* 0 if none */
    uint64_t retry_after_ms; /* from Retry-After on 429/503; 0 = absent */
    const char *detail;      /* short text kept as the instance's last error; may be NULL */
    /* What the caller timed of the leg, for the instance's latency models (pdsched/predict.h;
     * 0 = not timed; only a SUCCESS teaches them): from sending the leg to its first token
     * (a prefill leg: to its answer), and the output tokens after the first with the time
     * they took. */
    double first_token_s;
    uint32_t later_tokens;
    double later_tokens_s;
    /* Prompt tokens the engine said it served from its cache (usage's
     * prompt_tokens_details.cached_tokens; 0 = none or not said): the prefill model learns
     * what was computed. */
    uint32_t cached_tokens;
    /* A whole (non-stream) answer, where first_token_s is 0: its time (a decode leg's from
     * the same start as first_token_s) and its output tokens (usage's completion_tokens).
     * The first token's model and the TPOT model learn the sum of the two. */
    double answer_s;
    uint32_t answer_tokens;
} sched_result_t;

/*
 * A booking: the instances chosen for one request, with their load
 * counted until each leg is finished. One owner (the request). Every
 * booked leg is released exactly once: by sched_booking_finish(), or by
 * sched_booking_destroy() for legs still open (counted as cancelled).
 * Finishing a leg twice returns SCHED_ERR_ALREADY_RELEASED and bumps the
 * pool's double-release counter; it never changes the load twice.
 */
typedef struct sched_booking sched_booking_t;

/* Batch: choose and book prefill and decode together (decode preferring
 * the prefill's zone); if either role has no usable instance nothing
 * stays booked. */
sched_status_t sched_book_pd(sched_pool_t *pool, const sched_request_t *req,
                             sched_booking_t **booking_out);

/* Staged, step 1: book prefill only; add decode later with
 * sched_booking_book_decode(). */
sched_status_t sched_book_prefill(sched_pool_t *pool, const sched_request_t *req,
                                  sched_booking_t **booking_out);

/* What the fleet can do for <req> now, by the latency models: the least predicted time to
 * first token over the usable prefill-capable instances (plus the least predicted KV handoff
 * of the decodes whose handoff model is warm: PD's first token comes after it) and the least
 * predicted time per output token over the usable decode-capable ones (means, seconds; 0 for
 * a role without a usable instance). <cold>: none of them has been observed yet, the numbers are
 * priors. Exact up to 256 instances of a role; beyond, over 256 of them from a random offset (a
 * bounded cost per request). For early refusal of what nobody can serve in time; books
 * nothing. */
typedef struct sched_slo_estimate {
    double ttft_s;
    double tpot_s;
    bool cold;
} sched_slo_estimate_t;
sched_status_t sched_slo_estimate(sched_pool_t *pool, const sched_request_t *req,
                                  sched_slo_estimate_t *out);

/* Single-stage protocols (decode drives its own prefill): decode only. */
sched_status_t sched_book_decode(sched_pool_t *pool, const sched_request_t *req,
                                 sched_booking_t **booking_out);

/* Staged, step 2: book the decode leg of an existing booking (the request
 * is the one given at step 1). SCHED_ERR_STATE if decode is booked and
 * not finished. On failure the booking is unchanged. */
sched_status_t sched_booking_book_decode(sched_booking_t *booking);

/*
 * Retry: book a new instance for <leg>, excluding every instance that
 * already failed (or was finished) on this leg of this booking and the
 * request's exclude list. The leg must have been finished first
 * (SCHED_ERR_STATE otherwise). On failure the leg stays unbooked.
 */
sched_status_t sched_booking_rebook(sched_booking_t *booking, sched_leg_t leg);

/* The instance currently booked for <leg> (borrowed: valid until the
 * booking is destroyed), or NULL if that leg was never booked. */
sched_instance_t *sched_booking_instance(const sched_booking_t *booking, sched_leg_t leg);

/* What <leg>'s instance's latency models predicted when it was booked (means, seconds; 0 =
 * that model was still cold, or the leg was never booked): its first token (a prefill leg:
 * its answer) and its time per output token. For logs and traces: prediction against what
 * happened. Either pointer may be NULL. */
void sched_booking_predicted(const sched_booking_t *booking, sched_leg_t leg, double *first_token_s,
                             double *tpot_s);

/* True while <leg> is booked and not yet finished. */
bool sched_booking_leg_open(const sched_booking_t *booking, sched_leg_t leg);

/* Selective PD by prediction. For a booking with both legs open: the predicted time to first
 * token with the prefill leg (its prefill, then the KV handoff to the decode: the decode's
 * model of its PD legs' first tokens) and without it (the decode computing the part of the
 * prompt it does not hold: its own model when decode-only legs taught it, else a step of its
 * running batch to wait for, the prompt's steps, and each token at the booked prefill's cost),
 * the time those prompt tokens hold up the decode's running requests, and the decode's time
 * per output token now. False while the decode's handoff or TPOT model is cold (nothing to
 * weigh yet). Books nothing. */
typedef struct sched_pd_prediction {
    double with_prefill_s, decode_only_s, stall_s, tpot_s;
    uint64_t uncached_tokens; /* of the prompt, on the decode */
} sched_pd_prediction_t;
bool sched_booking_predict_pd(const sched_booking_t *booking, sched_pd_prediction_t *out);
/* Go decode-only: the prefill leg is released without judging its instance, and the decode
 * leg from now on computes the prompt (charged and predicted as a decode-only booking's).
 * SCHED_ERR_STATE unless both legs are open. */
sched_status_t sched_booking_decode_only(sched_booking_t *booking);

/*
 * Finish one leg: release its load and report <result> (NULL = success)
 * to that leg's instance (breaker, overload weight, last error).
 */
sched_status_t sched_booking_finish(sched_booking_t *booking, sched_leg_t leg,
                                    const sched_result_t *result);

/* Finish any still-open leg as cancelled, free the booking and set
 * *booking to NULL. NULL or *booking == NULL is a no-op. */
void sched_booking_destroy(sched_booking_t **booking);

/* precise-prefix: the number of leading prompt tokens of <req> (its token ids)
 * that <inst>'s engine reports cached through its KV events, any tier, in
 * *cached_tokens_out. false when unknown: no KV-event index in the pool, no
 * token ids in <req>, or no engine reported a block size yet. */
bool sched_kvev_cached_tokens(sched_pool_t *pool, const sched_request_t *req,
                              const sched_instance_t *inst, size_t *cached_tokens_out);

/* ------------------------------------------------------------------ */
/* Admin and metrics surfaces (routed by the gateway)                  */
/* ------------------------------------------------------------------ */

/* GET /admin/instances: new JSON array (caller owns the reference). Each
 * element: id, url, role, state, source, weight, effective_weight, zone,
 * labels, kv fields, load {inflight, prompt_tokens, kv_tokens,
 * kv_free_chunks, scraped {running, waiting, kv_cache_usage, age_ms,
 * stale}}, health {consecutive_ok, consecutive_fail, last_probe_ms},
 * breaker {state, consecutive_failures}, last_error, kv_headroom {capacity_tokens,
 * capacity_source, projected_tokens, engine_used_tokens, refusals}. */
json_t *sched_admin_list(sched_pool_t *pool);

/* One instance as above (new reference), or NULL if absent. */
json_t *sched_admin_get(sched_pool_t *pool, const char *id);

/* POST /admin/instances with a body in the config's instance shape.
 * SCHED_ERR_INVALID (message in err naming the key) → 400, SCHED_ERR_EXISTS
 * → 409. On success *created_out (may be NULL) is a new reference to the
 * instance's JSON. */
sched_status_t sched_admin_add(sched_pool_t *pool, const json_t *body, json_t **created_out,
                               char *err, size_t err_len);
/* The same, <check> asked of the instance before it joins the pool (the caller's own rules:
 * what the configured protocol needs of an instance); false refuses it with
 * SCHED_ERR_INVALID and the reason it wrote into <err>. */
typedef bool (*sched_admin_check_fn)(sched_instance_t *inst, void *arg, char *err, size_t err_len);
sched_status_t sched_admin_add_checked(sched_pool_t *pool, const json_t *body,
                                       sched_admin_check_fn check, void *arg, json_t **created_out,
                                       char *err, size_t err_len);

/* Prometheus text: pdgw_instance_inflight{instance,role},
 * pdgw_instance_healthy{instance,role}, pdgw_breaker_state{instance},
 * pdgw_schedule_seconds histogram, pdgw_no_instance_total{role},
 * pdgw_session_affinity_total{role,result} (result = home | moved),
 * pdgw_sched_double_release_total, the KV headroom families
 * (pdgw_instance_kv_capacity_tokens, pdgw_instance_kv_projected_tokens,
 * pdgw_decode_kv_headroom_refusals_total, pdgw_decode_kv_overcommit_total) and the
 * autoscaling signals (pdgw_autoscale_desired_replicas{model,role,mode},
 * pdgw_autoscale_utilization_ratio{model,role}, pdgw_autoscale_demand{model,what}; see
 * scheduler/README.md). Returns a malloc'd NUL-terminated string
 * the caller frees, or NULL on allocation failure. */
char *sched_metrics_text(sched_pool_t *pool);

/* ------------------------------------------------------------------ */
/* Models (sched_models.c)                                             */
/* ------------------------------------------------------------------ */

/* Is <model> served by any instance of the pool, whatever its state (an instance whose
 * names are not known yet counts as serving it)? false → the model is unknown here. */
bool sched_pool_has_model(sched_pool_t *pool, const char *model);

/* Does some instance's engine list <model> as a LoRA adapter (an entry of its GET /v1/models
 * with a `parent` model, as vLLM lists the adapters it serves)? Then a request for <model> runs
 * under that adapter, whose name vLLM folds into the prompt's block hashes. false for NULL/"",
 * configured-only or unknown names. Takes the pool's read lock. */
bool sched_pool_model_is_adapter(sched_pool_t *pool, const char *model);

/* The instances that could take a booking now (up, not draining, breaker not open), in pool
 * order, each referenced: release with sched_pool_release_usable. SCHED_ERR_NO_MEMORY. */
sched_status_t sched_pool_usable(sched_pool_t *pool, sched_instance_t ***out, size_t *n_out);
void sched_pool_release_usable(sched_instance_t **arr, size_t n);

/* One model the usable instances serve, as sched_pool_models_each hands it out (valid for the
 * callback only). */
typedef struct sched_model_info {
    const char *name;
    sched_instance_t *const *instances; /* the usable instances serving it, in pool order */
    size_t n_instances;
    unsigned roles;       /* the union of their roles (SCHED_ROLE_* bits) */
    bool configured;      /* named by an instance's `models:` (else learnt from its engine) */
    int64_t created;      /* the engine's `created` (unix s); configured: the time of the call */
    const char *owned_by; /* the engine's `owned_by`; NULL when configured or not sent */
    const char *entry;    /* learnt: the engine's own list entry (compact JSON), else NULL */
} sched_model_info_t;

/* Return false to stop the iteration. */
typedef bool (*sched_model_fn_t)(const sched_model_info_t *model, void *arg);

/*
 * Call <fn> once per model name the usable instances serve, in the order the instances list
 * them (an instance's configured names, else the names learnt from its engine). Runs outside
 * the pool's locks (the instances are referenced meanwhile). *all_known_out (may be NULL) is
 * false when some usable instance's names are not known yet (the caller may then ask the
 * engines itself). SCHED_OK, or SCHED_ERR_NO_MEMORY (fn not called).
 */
sched_status_t sched_pool_models_each(sched_pool_t *pool, sched_model_fn_t fn, void *arg,
                                      bool *all_known_out);

/* Debug counter: finishes that hit an already released leg (should stay 0). */
uint64_t sched_pool_double_releases(sched_pool_t *pool);

#ifdef __cplusplus
}
#endif

#endif /* PDSCHED_SCHED_H */
