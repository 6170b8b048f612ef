/*
 * pdgw_config.h - the gateway's configuration: one struct, one table of option descriptors
 * from which the YAML keys, the CLI flags (getopt_long), the PDGW_* environment variables,
 * the defaults and `pdgw --help` are all derived.
 *
 * Layers, lowest first: defaults < YAML file (--config FILE or PDGW_CONFIG) < PDGW_* env <
 * CLI flags. A scalar key set on a higher layer replaces the lower value. A list key
 * (api_keys, plugins, models) given on a higher layer replaces the lower layer's list
 * (repeat the flag to give several values; env lists are comma-separated).
 * protocol_options merge per key. Instances from --both/--prefill/--decode (or PDGW_BOTH,
 * PDGW_PREFILL, PDGW_DECODE, comma-separated) are appended to the file's instances.
 *
 * Every key's flag is the key with '.' and '_' turned into '-' ("discovery.dns.interval" ->
 * --discovery-dns-interval, "max_body_bytes" -> --max-body-bytes), its env var is PDGW_ +
 * the key upper-cased with '.' -> '_' (PDGW_DISCOVERY_DNS_INTERVAL). Exceptions, for
 * repeatable flags: --api-key, --plugin, --model, --protocol-opt.
 *
 * Errors name the key, the bad value and for YAML the file and line, e.g.
 *   pdgw.yaml:12: instances[1].kv_port: expected an integer in 0..65535, got "abc"
 *
 * Protocol names are not known here (forwarders register at run time and plugins are
 * loaded from this very config), so the cross-field check asks a caller-supplied hook
 * (pdgw_config_hooks_t.protocol_info) what a protocol needs; main's hook loads the plugins
 * and asks the forwarder registry. Without a hook a built-in table of the in-tree protocol
 * names is used.
 *
 * The struct is written only while loading; afterwards it is read-only and may be shared
 * by all threads. Every string is owned by the struct (pdgw_config_free releases them).
 */
#ifndef PDGW_CONFIG_H
#define PDGW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pdgw_errors.h"
#include "pdgw_log.h"
#include "pdgw_util.h" /* PDGW_VERSION_STRING */
#include <pdsched/sched.h>

/* ---------------------------------------------------------------- value types */

typedef struct pdgw_str_list {
    char **items;
    size_t count;
} pdgw_str_list_t;

typedef struct pdgw_int_list {
    int *items;
    size_t count;
} pdgw_int_list_t;

typedef struct pdgw_kv {
    char *key;
    char *value; /* scalars as text: numbers and bools keep their YAML spelling */
} pdgw_kv_t;

typedef struct pdgw_kv_list {
    pdgw_kv_t *items;
    size_t count;
} pdgw_kv_list_t;

/* Value of <key> in <list>, NULL if absent. */
const char *pdgw_kv_list_get(const pdgw_kv_list_t *list, const char *key);

typedef enum pdgw_role {
    PDGW_ROLE_PREFILL = 0,
    PDGW_ROLE_DECODE = 1,
    PDGW_ROLE_BOTH = 2,
} pdgw_role_t;

typedef enum pdgw_sched_mode {
    PDGW_SCHED_BATCH = 0,  /* prefill and decode chosen together up front */
    PDGW_SCHED_STAGED = 1, /* decode chosen when prefill completes */
} pdgw_sched_mode_t;

typedef enum pdgw_policy {
    PDGW_POLICY_ROUND_ROBIN = 0,
    PDGW_POLICY_RANDOM,
    PDGW_POLICY_LEAST_LOAD,
    PDGW_POLICY_POWER_OF_TWO,
    PDGW_POLICY_PREFIX_AWARE,
    PDGW_POLICY_WEIGHTED,
    PDGW_POLICY_PRECISE_PREFIX,
    PDGW_POLICY_SLO,
} pdgw_policy_t;

/* slo_policy: a request no instance is predicted to serve in time is served anyway, or
 * refused at once (429 slo_unattainable). */
typedef enum pdgw_slo_policy {
    PDGW_SLO_BEST_EFFORT = 0,
    PDGW_SLO_REJECT = 1,
} pdgw_slo_policy_t;

/* "round-robin" ... "slo": the policy's name as the config and the scheduler spell it; and the
 * scheduler's policy of that name (least-load if it had none). */
const char *pdgw_policy_name(pdgw_policy_t policy);
sched_policy_t pdgw_policy_to_sched(pdgw_policy_t policy);

/* One static instance (YAML `instances:` item or a quick-start flag). */
typedef struct pdgw_instance_config {
    char *id;         /* default: "<host>:<port>" of url */
    char *url;        /* http(s)://host:port, required */
    pdgw_role_t role; /* default both */
    char *zone;       /* "" = none (labels.zone shorthand; copied into labels too) */
    int weight;       /* >= 1, default 1 */
    char *kv_host;    /* default: host of url */
    int kv_port;      /* 0 = unset */
    int bootstrap_port;
    char *engine_id;                 /* "" = unset */
    char *kv_events_endpoint;        /* "" = unset */
    char *kv_events_replay_endpoint; /* "" = unset */
    pdgw_int_list_t alloc_ports;
    pdgw_int_list_t init_ports;
    int tp_size;            /* >= 1 */
    int kv_capacity_tokens; /* 0 = from the engine or learnt */
    int dp_rank;            /* 0 .. dp_size-1 */
    int dp_size;            /* >= 1 */
    pdgw_kv_list_t labels;
    pdgw_str_list_t models; /* model names served; none = learnt from GET /v1/models */
    int kv_engine;          /* 0 lmcache (upstream engine), 1 libkvt */
    int max_concurrent;     /* capacity: open legs at once, 0 = unlimited */
    pdgw_kv_list_t attrs;   /* protocol attributes (pdgw_fwd_instance_attr) */
    /* derived from url by the loader */
    char *host;
    int port;
    char *attrs_text; /* attrs as "key=value\n" lines, what the scheduler carries */
} pdgw_instance_config_t;

typedef struct pdgw_dns_discovery_config {
    char *prefill; /* "host:port" re-resolved every interval; "" = off for this role */
    char *decode;
    char *both;
    uint64_t interval_ms; /* default 5 s */
} pdgw_dns_discovery_config_t;

typedef struct pdgw_k8s_discovery_config {
    char *namespace_name; /* "" = read the pod's namespace file */
    char *prefill_selector;
    char *decode_selector;
    char *both_selector;
    char *port_name;  /* default "http" */
    char *api_server; /* "" = https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT */
    char *token_file;
    char *ca_file;
} pdgw_k8s_discovery_config_t;

typedef struct pdgw_config {
    char *listen;      /* as given, default "127.0.0.1:8000" */
    char *listen_host; /* derived: "" = any */
    int listen_port;   /* derived */
    int workers;       /* 0 = number of cores (see pdgw_config_workers) */
    char *tls_cert;    /* PEM file, "" = plain HTTP */
    char *tls_key;     /* PEM file, "" = plain HTTP */
    char *tls_ca;      /* PEM CA file for client certificates, "" = none asked */
    char *protocol;    /* default "neutral" */
    pdgw_sched_mode_t scheduling;
    pdgw_kv_list_t protocol_options;
    pdgw_str_list_t plugins;
    uint64_t max_body_bytes;
    uint64_t client_buffer_size;      /* libmicrohttpd's memory per connection */
    uint64_t max_buffered_body_bytes; /* all requests' bodies at once; 0 = no budget */
    uint64_t request_timeout_ms;
    uint64_t max_request_timeout_ms; /* cap of X-Request-Timeout; 0 = request_timeout */
    uint64_t connect_timeout_ms;
    uint64_t first_byte_timeout_ms;
    uint64_t idle_timeout_ms;
    int retries;
    /* admission control, retry backoff, session affinity (pdgw_admit.h) */
    int max_concurrent_requests; /* 0 / -1 = unlimited */
    int queue_size;
    uint64_t queue_timeout_ms;
    char *rate_limit;           /* "RPS[:BURST]", "" = none */
    pdgw_kv_list_t rate_limits; /* API key -> "RPS[:BURST]" */
    uint64_t retry_backoff_base_ms;
    uint64_t retry_backoff_max_ms;
    char *session_affinity; /* "", "user", "header:NAME" */
    uint64_t client_header_timeout_ms;
    int max_connections;            /* 0 = derived from RLIMIT_NOFILE */
    int max_connections_per_client; /* 0 = no cap */
    /* precise-prefix (integers like llm-d's scorer weights) */
    int kv_events_prefix_weight;
    int kv_events_load_weight;
    int kv_events_other_tier_percent;
    int kv_events_max_blocks;
    uint64_t kv_events_max_message_bytes;
    /* Latency targets and what to do when none can be met (pdgw_slo.h). */
    uint64_t slo_ttft_ms, slo_tpot_ms; /* defaults of requests without headers; 0 = none */
    pdgw_kv_list_t slo_models;         /* model -> "TTFT[:TPOT]" */
    pdgw_kv_list_t slo_keys;           /* API key -> "TTFT[:TPOT]" */
    pdgw_kv_list_t kv_bytes_per_token; /* model -> KV bytes of one token */
    /* autoscaling signals (scheduler sched_autoscale.c): targets (0 = the slo_* ones),
     * smoothing and scale-down window */
    uint64_t autoscale_ttft_ms, autoscale_tpot_ms, autoscale_tau_ms, autoscale_window_ms;
    int slo_policy;      /* pdgw_slo_policy_t */
    int admission_order; /* 0 arrival, 1 slo_deadline */
    int slo_reject_margin_percent;
    int engine_step_tokens;
    uint64_t kv_events_silence_ms;
    /* tokenize before routing, selective PD (pdgw_route.h) */
    uint64_t tokenize_timeout_ms;
    int tokenize_cache_entries;
    pdgw_kv_list_t tokenizers; /* model -> tokenizer PATH, or "engine" */
    int pd_min_prompt_tokens;
    int pd_skip_cached_percent;
    bool pd_skip_predicted; /* decode-only when the latency models say it is faster */
    int client_pd_fields;   /* pdgw_pd_fields_mode_t: reject | strip | pass */
    int upstream_client;    /* pdgw_upstream_client_t: curl | native */
    int stream_output;      /* pdgw_stream_output_t: library | direct */
    int frontend;           /* pdgw_frontend_t: mhd | native */
    uint64_t drain_timeout_ms;
    bool check_engines_at_start;           /* the engine doctor once at start (warnings) */
    uint64_t check_engines_timeout_ms;     /* one probe */
    uint64_t check_engines_events_wait_ms; /* listening to each KV-event publisher */
    pdgw_str_list_t api_keys;
    bool api_keys_cleared; /* the file says `api_keys: []`: a reload may drop every key */
    char *api_key_file;    /* "" = none */
    char *admin_api_key;   /* "" = none: admin writes from loopback only */
    pdgw_log_level_t log_level;
    pdgw_log_format_t log_format;
    bool access_log;
    bool admin_trust_loopback; /* admin writes from loopback peers without admin_api_key */
    bool metrics_need_key;     /* /metrics behind the API keys */
    pdgw_str_list_t models;
    bool passthrough;                     /* proxy other /v1/ paths and engine utility endpoints */
    pdgw_str_list_t cors_allowed_origins; /* browser origins let in by CORS; "*" = any */
    pdgw_policy_t prefill_policy;
    pdgw_policy_t decode_policy;
    uint64_t health_interval_ms;
    uint64_t health_timeout_ms;
    int healthy_threshold;
    int unhealthy_threshold;
    uint64_t metrics_scrape_interval_ms;
    int breaker_failures;
    uint64_t breaker_open_time_ms;
    pdgw_instance_config_t *instances;
    size_t n_instances;
    bool dns_enabled; /* derived: any dns role set */
    pdgw_dns_discovery_config_t dns;
    bool k8s_enabled; /* derived: any selector set */
    pdgw_k8s_discovery_config_t k8s;
    char *tenants_json; /* the YAML `tenants:` list as JSON text; "" = no tenants */
    char *quota_store;  /* redis://... or "" */
    struct {
        char *password;
        char *tls_ca_file, *tls_cert_file, *tls_key_file, *tls_server_name; /* rediss:// */
        int fail_mode; /* pdq_fail_mode_t: open | closed */
        int expected_replicas;
        uint64_t sync_interval_ms;
        uint64_t usage_interval_ms;
        uint64_t timeout_ms;
        char *lease_fraction; /* "" = the library's default */
        char *key_prefix;
        char *default_tenant;
        int output_estimate;
    } quota;
    struct {
        char *otlp_endpoint; /* "" = OTEL_EXPORTER_OTLP_ENDPOINT, else tracing off */
        char *service_name;  /* "" = OTEL_SERVICE_NAME, else "pdgw" */
        char *sample_ratio;  /* "" = OTEL_TRACES_SAMPLER_ARG, else 1 */
    } tracing;
    char *config_file; /* path of the loaded YAML file, NULL if none */
} pdgw_config_t;

/* ---------------------------------------------------------------- errors */

typedef struct pdgw_config_error {
    char message[768]; /* full text, "file:line: key: what" */
    char key[128];     /* key path, e.g. "instances[1].kv_port", "" if none */
    char file[256];    /* "" unless from YAML */
    int line;          /* 1-based YAML line, 0 if none */
} pdgw_config_error_t;

/* ---------------------------------------------------------------- option table */

typedef enum pdgw_opt_type {
    PDGW_OPT_STRING = 0,
    PDGW_OPT_INT,      /* int within [min, max] */
    PDGW_OPT_BOOL,     /* true/false/yes/no/on/off/1/0; CLI: --flag, --no-flag, --flag=false */
    PDGW_OPT_DURATION, /* uint64_t milliseconds */
    PDGW_OPT_SIZE,     /* uint64_t bytes, >= min */
    PDGW_OPT_LIST,     /* pdgw_str_list_t */
    PDGW_OPT_ENUM,     /* int index into enum_names */
    PDGW_OPT_MAP,      /* pdgw_kv_list_t */
    PDGW_OPT_INT_LIST, /* pdgw_int_list_t (instance ports) */
    PDGW_OPT_HOSTPORT, /* string "host:port" checked by pdgw_hostport_parse */
    PDGW_OPT_ACTION,   /* CLI only: --config, --help, --both, ... */
} pdgw_opt_type_t;

/* One row of the table. Rows with key == NULL are CLI-only. */
typedef struct pdgw_config_option {
    const char *key;  /* YAML path ("discovery.dns.interval") or NULL */
    const char *flag; /* long flag without "--" */
    const char *env;  /* environment variable or NULL (none) */
    pdgw_opt_type_t type;
    const char *const *enum_names; /* NULL-terminated, for PDGW_OPT_ENUM */
    long min, max;                 /* bounds for INT / INT_LIST items / SIZE min */
    const char *def;               /* default as text (parsed by the same code), NULL = empty */
    const char *metavar;           /* shown in --help */
    const char *help;
    size_t offset; /* into pdgw_config_t (or pdgw_instance_config_t for instance rows) */
} pdgw_config_option_t;

/* The top-level table (keys, discovery, CLI-only actions), <n_out> rows. */
const pdgw_config_option_t *pdgw_config_options(size_t *n_out);
/* Per-instance fields (key = field name inside an `instances:` item). */
const pdgw_config_option_t *pdgw_config_instance_options(size_t *n_out);

/* ---------------------------------------------------------------- protocol hook */

/* What a protocol needs from the instance set; filled by the hook. */
typedef struct pdgw_protocol_info {
    bool needs_prefill; /* at least one prefill (or both) instance/discovery source */
    bool needs_decode;  /* at least one decode (or both) instance/discovery source */
    bool needs_both;    /* at least one instance of role both (single-instance forwarding) */
    bool supports_batch;
    bool supports_staged;
} pdgw_protocol_info_t;

/*
 * Resolve cfg->protocol. Return PDGW_OK with *info filled, PDGW_ERR_NOT_FOUND for an
 * unknown protocol, or any error with a message in <err> (errlen bytes). Called once, after
 * all layers are merged (so cfg->plugins is final).
 */
typedef pdgw_status_t (*pdgw_config_protocol_fn)(void *ctx, const pdgw_config_t *cfg,
                                                 pdgw_protocol_info_t *info, char *err,
                                                 size_t errlen);

/* The registry's answer: the registered descriptor's modes and dispatch (the plugins must be
 * loaded before; pdgw_main's hook loads them, then asks this). */
pdgw_status_t pdgw_config_builtin_protocol_info(void *ctx, const pdgw_config_t *cfg,
                                                pdgw_protocol_info_t *info, char *err,
                                                size_t errlen);

/*
 * `--check-config` only, after pdgw_config_check passed: what start-up would do next with
 * <cfg> short of binding ports (the forwarder's configure and plan, the instance set, the
 * protocol's per-instance needs). PDGW_OK or an error with a message in <err>.
 */
typedef pdgw_status_t (*pdgw_config_deep_check_fn)(void *ctx, const pdgw_config_t *cfg, char *err,
                                                   size_t errlen);

typedef struct pdgw_config_hooks {
    pdgw_config_protocol_fn protocol_info; /* NULL = pdgw_config_builtin_protocol_info */
    pdgw_config_deep_check_fn deep_check;  /* NULL = none */
    void *ctx;
    FILE *out;            /* --help, --version, "config OK"; NULL = stdout */
    FILE *err;            /* error messages; NULL = stderr */
    const char *version;  /* --version text; NULL = PDGW_VERSION_STRING */
    const char *progname; /* for --help; NULL = "pdgw" */
} pdgw_config_hooks_t;

/* ---------------------------------------------------------------- loading */

/* Fill <cfg> with the defaults of the table. PDGW_ERR_NOMEM only. */
pdgw_status_t pdgw_config_init(pdgw_config_t *cfg);
/* Release everything <cfg> owns; <cfg> is zeroed. NULL-safe. */
void pdgw_config_free(pdgw_config_t *cfg);

/* Merge a YAML file / YAML text (<name> is used in messages) into <cfg>. */
pdgw_status_t pdgw_config_load_file(pdgw_config_t *cfg, const char *path, pdgw_config_error_t *err);
pdgw_status_t pdgw_config_load_yaml(pdgw_config_t *cfg, const char *text, size_t len,
                                    const char *name, pdgw_config_error_t *err);
/*
 * Merge PDGW_* variables of <envp> (NULL = environ). PDGW_CONFIG is handled by
 * pdgw_config_from_args. Unknown PDGW_* variables are logged as a warning naming the
 * variable (other tools of the project use the prefix too: PDGW_BIN_DIR, PDGW_SIM_*, ...).
 */
pdgw_status_t pdgw_config_load_env(pdgw_config_t *cfg, char *const *envp, pdgw_config_error_t *err);

/* Cross-field validation (instances, discovery, protocol needs). Fills <err>. */
pdgw_status_t pdgw_config_check(const pdgw_config_t *cfg, const pdgw_config_hooks_t *hooks,
                                pdgw_config_error_t *err);

typedef enum pdgw_config_action {
    PDGW_CONFIG_RUN = 0,                /* start the gateway with <cfg> */
    PDGW_CONFIG_EXIT = 1,               /* done (--help, --version, --check-config OK): exit 0 */
    PDGW_CONFIG_CHECK_ENGINES = 2,      /* --check-engines: probe the fleet, print a table */
    PDGW_CONFIG_CHECK_ENGINES_JSON = 3, /* --check-engines --json */
} pdgw_config_action_t;

/*
 * The whole start-up parse: defaults, --config/PDGW_CONFIG file, env, CLI, check.
 * On PDGW_OK, *action says whether to run or to exit 0 (help/version/check-config success
 * were printed to hooks->out). On error the message was printed to hooks->err and is in
 * <err> (may be NULL); main exits 1. <cfg> is initialised by this function and must be
 * freed by the caller in every case. Resets getopt (optind) so it may be called repeatedly.
 * `--check-config FILE` checks defaults + that file only (env and other flags ignored).
 */
pdgw_status_t pdgw_config_from_args(pdgw_config_t *cfg, int argc, char **argv, char **envp,
                                    const pdgw_config_hooks_t *hooks, pdgw_config_action_t *action,
                                    pdgw_config_error_t *err);

/* ---------------------------------------------------------------- output */

/* `--help` text generated from the table. */
void pdgw_config_print_help(FILE *out, const char *progname);
/* One reference table of gateway/CONFIG.md, from the option table: <table> "keys" (top-level
 * keys), "cli" (command-line only) or "instances" (fields of `instances:`) as Markdown.
 * PDGW_ERR_INVALID for another name. */
pdgw_status_t pdgw_config_print_doc(FILE *out, const char *table);
/* Effective config as YAML (api keys masked). For --print-config and logs. */
void pdgw_config_print(const pdgw_config_t *cfg, FILE *out);

/* Effective number of worker threads (workers, or online CPUs when 0). */
int pdgw_config_workers(const pdgw_config_t *cfg);

/* A kv_bytes_per_token value: a whole number 1..1e9. */
pdgw_status_t pdgw_kv_bytes_parse(const char *text, uint64_t *out);

#endif /* PDGW_CONFIG_H */
