/*
 * pdgw_config.c - the option table, defaults, typed setters, instances and cross-field
 * checks. YAML loading is in pdgw_config_yaml.c, env/CLI/help in pdgw_config_cli.c.
 */
#include "pdgw_registry.h"
#include "pdgw_config.h"

#include "pdgw_admit.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "pdb/pdb_map.h"
#include "pdgw_alloc.h"
#include "pdgw_config_int.h"
#include "pdgw_slo.h"

/* ---------------------------------------------------------------- names */

static const char *const role_names[] = {"prefill", "decode", "both", NULL};
static const char *const kv_engine_names[] = {"lmcache", "libkvt", NULL};
static const char *const sched_names[] = {"batch", "staged", NULL};
static const char *const policy_names[] = {"round-robin",    "random",       "least-load",
                                           "power-of-two",   "prefix-aware", "weighted",
                                           "precise-prefix", "slo",          NULL};
/* pdgw_slo_policy_t order */
static const char *const slo_policy_names[] = {"best_effort", "reject", NULL};
static const char *const admission_order_names[] = {"arrival", "slo_deadline", NULL};
static const char *const level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const format_names[] = {"text", "json", NULL};
/* pdgw_pd_fields_mode_t order */
static const char *const pd_fields_names[] = {"reject", "strip", "pass", NULL};
/* pdgw_upstream_client_t order */
static const char *const upstream_client_names[] = {"curl", "native", NULL};
/* pdgw_frontend_t order */
static const char *const frontend_names[] = {"mhd", "native", "auto", NULL};
/* pdgw_stream_output_t order */
static const char *const stream_output_names[] = {"library", "direct", NULL};
/* pdq_fail_mode_t order */
static const char *const quota_fail_names[] = {"open", "closed", NULL};

static const char *name_of(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : "unknown";
}

const char *pdgw_policy_name(pdgw_policy_t policy)
{
    return name_of(policy_names, 8, (int)policy);
}

sched_policy_t pdgw_policy_to_sched(pdgw_policy_t policy)
{
    sched_policy_t out = SCHED_POLICY_LEAST_LOAD;
    (void)sched_policy_parse(pdgw_policy_name(policy), &out);
    return out;
}

static int enum_index(const char *const *names, const char *s)
{
    for (int i = 0; names[i] != NULL; i++) {
        if (strcasecmp(names[i], s) == 0)
            return i;
    }
    return -1;
}

/* ---------------------------------------------------------------- the table */

#define C(field) offsetof(pdgw_config_t, field)
#define I(field) offsetof(pdgw_instance_config_t, field)
#define SA_TOKEN "/var/run/secrets/kubernetes.io/serviceaccount/token"
#define SA_CA    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

/* clang-format off */
static const pdgw_config_option_t options[] = {
    {"listen", "listen", "PDGW_LISTEN", PDGW_OPT_HOSTPORT, NULL, 1, 0, "127.0.0.1:8000",
     "HOST:PORT", "Address and port the HTTP front end listens on. Loopback by default: say "
     "`0.0.0.0:8000` (or `[::]:8000`) to serve other hosts, as the container and "
     "Kubernetes configs in `deploy/` do.", C(listen)},
    {"tls_cert", "tls-cert", "PDGW_TLS_CERT", PDGW_OPT_STRING, NULL, 0, 0, "", "PATH",
     "PEM certificate (chain) of the front end; with `tls_key`, clients must speak HTTPS. "
     "See \"TLS\".",
     C(tls_cert)},
    {"tls_key", "tls-key", "PDGW_TLS_KEY", PDGW_OPT_STRING, NULL, 0, 0, "", "PATH",
     "PEM private key of `tls_cert` (unencrypted).", C(tls_key)},
    {"tls_ca", "tls-ca", "PDGW_TLS_CA", PDGW_OPT_STRING, NULL, 0, 0, "", "PATH",
     "PEM CA certificate(s): clients must present a certificate they signed (`/health` "
     "and `/ready` excepted); `\"\"` = no client certificates.", C(tls_ca)},
    {"workers", "workers", "PDGW_WORKERS", PDGW_OPT_INT, NULL, 0, 1024, "0", "N",
     "Worker threads, each with its own event loop; 0 = number of CPU cores.", C(workers)},
    {"protocol", "protocol", "PDGW_PROTOCOL", PDGW_OPT_STRING, NULL, 0, 0, "neutral", "NAME",
     "Forwarder protocol: neutral, vllm-nixl, vllm-mooncake, vllm-kvt, sglang, lmcache or "
     "one registered by a plugin.", C(protocol)},
    {"scheduling", "scheduling", "PDGW_SCHEDULING", PDGW_OPT_ENUM, sched_names, 0, 0, "batch",
     "MODE", "batch: choose prefill and decode together; staged: choose decode when "
     "prefill completes.", C(scheduling)},
    {"protocol_options", "protocol-opt", "PDGW_PROTOCOL_OPTIONS", PDGW_OPT_MAP, NULL, 0, 0,
     NULL, "KEY=VALUE", "Option handed to the forwarder (repeatable; env: comma-separated "
     "k=v list).", C(protocol_options)},
    {"plugins", "plugin", "PDGW_PLUGINS", PDGW_OPT_LIST, NULL, 0, 0, NULL, "PATH",
     "Out-of-tree forwarder plugin (.so) to load (repeatable).", C(plugins)},
    {"max_body_bytes", "max-body-bytes", "PDGW_MAX_BODY_BYTES", PDGW_OPT_SIZE, NULL, 1, 0,
     "16MiB", "SIZE", "Largest accepted request body (bytes or 16MiB-style); larger gives "
     "413.", C(max_body_bytes)},
    {"max_buffered_body_bytes", "max-buffered-body-bytes", "PDGW_MAX_BUFFERED_BODY_BYTES",
     PDGW_OPT_SIZE, NULL, 0, 0, "256MiB", "SIZE", "Request bodies held at once by all requests "
     "(declared lengths and bytes read); a "
     "request that would pass it gets 503 with `Retry-After` before its body is read (0 = "
     "no budget).",
     C(max_buffered_body_bytes)},
    {"client_buffer_size", "client-buffer-size", "PDGW_CLIENT_BUFFER_SIZE", PDGW_OPT_SIZE, NULL,
     2048, 0, "5KiB", "SIZE", "Memory of each client connection for its request: the request "
     "line and headers must fit in it (a larger head gets 431), the body passes through it in "
     "pieces. Every open connection holds it, streams included.", C(client_buffer_size)},
    {"request_timeout", "request-timeout", "PDGW_REQUEST_TIMEOUT", PDGW_OPT_DURATION, NULL,
     1, 0, "600s", "DURATION", "Deadline of a whole request; header X-Request-Timeout "
     "(seconds) overrides it per "
     "request, up to `max_request_timeout`.", C(request_timeout_ms)},
    {"max_request_timeout", "max-request-timeout", "PDGW_MAX_REQUEST_TIMEOUT",
     PDGW_OPT_DURATION, NULL, 0, 0, "0", "DURATION", "Longest deadline a client may ask for "
     "with `X-Request-Timeout` (0 = "
     "`request_timeout`: the header can only shorten it).",
     C(max_request_timeout_ms)},
    {"connect_timeout", "connect-timeout", "PDGW_CONNECT_TIMEOUT", PDGW_OPT_DURATION, NULL, 0,
     0, "3s", "DURATION", "Upstream connect timeout per leg (0 = only the request "
     "deadline).", C(connect_timeout_ms)},
    {"first_byte_timeout", "first-byte-timeout", "PDGW_FIRST_BYTE_TIMEOUT", PDGW_OPT_DURATION,
     NULL, 0, 0, "300s", "DURATION", "Time allowed until an upstream leg sends its first "
     "byte (0 = only the request deadline).", C(first_byte_timeout_ms)},
    {"idle_timeout", "idle-timeout", "PDGW_IDLE_TIMEOUT", PDGW_OPT_DURATION, NULL, 0, 0, "60s",
     "DURATION", "Longest silence allowed between upstream bytes (0 = only the request "
     "deadline).", C(idle_timeout_ms)},
    {"client_pd_fields", "client-pd-fields", "PDGW_CLIENT_PD_FIELDS", PDGW_OPT_ENUM,
     pd_fields_names, 0, 0, "reject", "ACTION", "PD control fields in a client body "
     "(kv_transfer_params, bootstrap_*, remote_*, DP ranks...): reject (400), strip, or pass "
     "(plain-proxy protocols such as neutral only).", C(client_pd_fields)},
    {"upstream_client", "upstream-client", "PDGW_UPSTREAM_CLIENT", PDGW_OPT_ENUM,
     upstream_client_names, 0, 0, "native", "CLIENT", "HTTP client of upstream legs: native "
     "(pdgw's own HTTP/1.1 client; https:// upstreams use curl) or curl (libcurl for all).",
     C(upstream_client)},
    {"frontend", "frontend", "PDGW_FRONTEND", PDGW_OPT_ENUM, frontend_names, 0, 0, "auto",
     "SERVER", "HTTP server of client connections: native (pdgw's own HTTP/1.x server on the "
     "worker loop; plain HTTP only), mhd (libmicrohttpd: plain HTTP and TLS), or auto (native, "
     "mhd when tls_cert is set).",
     C(frontend)},
    {"stream_output", "stream-output", "PDGW_STREAM_OUTPUT", PDGW_OPT_ENUM, stream_output_names,
     0, 0, "direct", "WRITER", "Who writes a stream's body to a plain-HTTP/1.1 client once its "
     "headers are sent: direct (pdgw, on the socket) or library (libmicrohttpd; always so for "
     "TLS and HTTP/1.0).", C(stream_output)},
    {"retries", "retries", "PDGW_RETRIES", PDGW_OPT_INT, NULL, 0, 10, "1", "N",
     "Retries on another instance, only before the first byte reached the client.",
     C(retries)},
    /* Admission control, retry backoff and session affinity (pdgw_admit.c); reloadable. */
    {"max_concurrent_requests", "max-concurrent-requests", "PDGW_MAX_CONCURRENT_REQUESTS",
     PDGW_OPT_INT, NULL, -1, 1000000, "0", "N", "Inference requests at the engines at once, "
     "over all workers; the rest wait in the "
     "queue (0 or -1 = unlimited). Name as SGLang's model gateway.", C(max_concurrent_requests)},
    {"queue_size", "queue-size", "PDGW_QUEUE_SIZE", PDGW_OPT_INT, NULL, 0, 1000000, "100", "N",
     "Requests that may wait for admission; beyond it 429 with code `queue_full` (0 = none "
     "wait).",
     C(queue_size)},
    {"queue_timeout", "queue-timeout", "PDGW_QUEUE_TIMEOUT", PDGW_OPT_DURATION, NULL, 0, 0, "60s",
     "DURATION", "Longest wait for admission (never past the request deadline); then 429 with code "
     "`queue_timeout`.", C(queue_timeout_ms)},
    {"admission_order", "admission-order", "PDGW_ADMISSION_ORDER", PDGW_OPT_ENUM,
     admission_order_names, 0, 0, "arrival", "ORDER",
     "Order of the waiters within one priority: `arrival` (first come first served) or "
     "`slo_deadline` (arrival + the request's TTFT target, earliest first; requests without "
     "a target after those with one, as llm-d's SLO deadline ordering).",
     C(admission_order)},
    {"rate_limit", "rate-limit", "PDGW_RATE_LIMIT", PDGW_OPT_STRING, NULL, 0, 0, "", "RPS[:BURST]",
     "Token bucket per API key: requests per second and burst (default RPS); over it 429 "
     "with code `rate_limited`. \"\" = none.",
     C(rate_limit)},
    {"rate_limits", "rate-limit-key", "PDGW_RATE_LIMITS", PDGW_OPT_MAP, NULL, 0, 0, NULL,
     "KEY=RPS[:BURST]", "Per-API-key override of `rate_limit` (repeatable; keys masked by "
     "`--print-config`).",
     C(rate_limits)},
    {"retry_backoff_base", "retry-backoff-base", "PDGW_RETRY_BACKOFF_BASE", PDGW_OPT_DURATION,
     NULL, 0, 0, "100ms", "DURATION", "First wait before retrying an engine's 429/503; doubles "
     "per retry with jitter; the "
     "engine's Retry-After is honoured when longer; never past the request "
     "deadline.", C(retry_backoff_base_ms)},
    {"retry_backoff_max", "retry-backoff-max", "PDGW_RETRY_BACKOFF_MAX", PDGW_OPT_DURATION, NULL,
     0, 0, "5s", "DURATION", "Cap of the exponential backoff (not of an engine's "
     "Retry-After).", C(retry_backoff_max_ms)},
    {"session_affinity", "session-affinity", "PDGW_SESSION_AFFINITY", PDGW_OPT_STRING, NULL, 0, 0,
     "", "header:NAME|user", "Sticky sessions: requests with the same header value (or body "
     "`user`) go to the "
     "same instance of each role while it is usable (rendezvous hashing). \"\" = "
     "off.", C(session_affinity)},
    {"client_header_timeout", "client-header-timeout", "PDGW_CLIENT_HEADER_TIMEOUT",
     PDGW_OPT_DURATION, NULL, 0, 0, "30s", "DURATION", "Time a client has to send complete "
     "request headers, from connect or the end of its previous request; the body then has "
     "until the request deadline. Trickled bytes do not extend either (0 = no limit).",
     C(client_header_timeout_ms)},
    {"max_connections", "max-connections", "PDGW_MAX_CONNECTIONS", PDGW_OPT_INT, NULL, 0,
     10000000, "0", "N", "Client connections open at once, all workers (0 = derived from the "
     "descriptor limit: (RLIMIT_NOFILE - reserve) / 2 for one-leg protocols, / 3 when prefill "
     "and decode run at once, leaving room for upstream legs).",
     C(max_connections)},
    {"max_connections_per_client", "max-connections-per-client",
     "PDGW_MAX_CONNECTIONS_PER_CLIENT", PDGW_OPT_INT, NULL, 0, 10000000, "1024", "N",
     "Client connections open at once from one client address (0 = no cap; raise it behind "
     "a proxy that funnels many clients through few addresses).",
     C(max_connections_per_client)},
    {"kv_events_prefix_weight", "kv-events-prefix-weight", "PDGW_KV_EVENTS_PREFIX_WEIGHT",
     PDGW_OPT_INT, NULL, 0, 1000, "2", "N",
     "precise-prefix: weight of the cached fraction of the prompt.", C(kv_events_prefix_weight)},
    {"kv_events_load_weight", "kv-events-load-weight", "PDGW_KV_EVENTS_LOAD_WEIGHT", PDGW_OPT_INT,
     NULL, 0, 1000, "1", "N", "precise-prefix: weight of the (relative) load.",
     C(kv_events_load_weight)},
    {"kv_events_other_tier_percent", "kv-events-other-tier-percent",
     "PDGW_KV_EVENTS_OTHER_TIER_PERCENT", PDGW_OPT_INT, NULL, 0, 100, "50", "PERCENT",
     "precise-prefix: worth of a block cached outside GPU memory.",
     C(kv_events_other_tier_percent)},
    {"kv_events_max_blocks", "kv-events-max-blocks", "PDGW_KV_EVENTS_MAX_BLOCKS", PDGW_OPT_INT,
     NULL, 64, 67108864, "1048576", "N", "precise-prefix: bound of the KV-event block index.",
     C(kv_events_max_blocks)},
    {"slo_ttft", "slo-ttft", "PDGW_SLO_TTFT", PDGW_OPT_DURATION, NULL, 0, 0, "0", "DURATION",
     "Time-to-first-token target of a request without an `x-llm-d-slo-ttft-ms` (or older "
     "`x-slo-ttft-ms`) header (0 = none). "
     "The `slo` policy and `slo_policy` act on it; attainment in "
     "`pdgw_model_slo_requests_total`.", C(slo_ttft_ms)},
    {"slo_tpot", "slo-tpot", "PDGW_SLO_TPOT", PDGW_OPT_DURATION, NULL, 0, 0, "0", "DURATION",
     "Time-per-output-token target of a request without an `x-llm-d-slo-tpot-ms` (or older "
     "`x-slo-tpot-ms`) header (0 = "
     "none).", C(slo_tpot_ms)},
    {"slo_models", "slo-model", "PDGW_SLO_MODELS", PDGW_OPT_MAP, NULL, 0, 0, NULL,
     "MODEL=TTFT[:TPOT]", "Targets of one model's requests without headers, instead of "
     "`slo_ttft` / `slo_tpot` (repeatable; e.g. `chat=500ms:50ms`).", C(slo_models)},
    {"slo_keys", "slo-key", "PDGW_SLO_KEYS", PDGW_OPT_MAP, NULL, 0, 0, NULL, "KEY=TTFT[:TPOT]",
     "Targets of one API key's requests without headers, before `slo_models` and the global "
     "ones (repeatable; keys masked by `--print-config`).",
     C(slo_keys)},
    {"slo_policy", "slo-policy", "PDGW_SLO_POLICY", PDGW_OPT_ENUM, slo_policy_names, 0, 0,
     "best_effort", "POLICY", "A request with a target that no instance is predicted to "
     "meet (by more than `slo_reject_margin_percent`): served anyway, or refused at once with "
     "429 `slo_unattainable` and a `Retry-After`. Never while the latency models are cold.",
     C(slo_policy)},
    {"engine_step_tokens", "engine-step-tokens", "PDGW_ENGINE_STEP_TOKENS", PDGW_OPT_INT, NULL,
     16, 1048576, "2048", "N",
     "Tokens an engine computes per step (vLLM's `--max-num-batched-tokens`, SGLang's "
     "`--chunked-prefill-size`): how the latency models lay out queued prompts in steps. "
     "Set it to the engines' value.",
     C(engine_step_tokens)},
    {"slo_reject_margin_percent", "slo-reject-margin-percent",
     "PDGW_SLO_REJECT_MARGIN_PERCENT", PDGW_OPT_INT, NULL, 0, 10000, "0", "PERCENT",
     "How far past its target the best prediction must be before `slo_policy: reject` "
     "refuses a request.", C(slo_reject_margin_percent)},
    {"autoscale_ttft", "autoscale-ttft", "PDGW_AUTOSCALE_TTFT", PDGW_OPT_DURATION, NULL, 0, 0,
     "0", "DURATION", "TTFT the `pdgw_autoscale_desired_replicas` signals size the pools for "
     "when requests carry no target (0 = `slo_ttft`, else 1s).", C(autoscale_ttft_ms)},
    {"autoscale_tpot", "autoscale-tpot", "PDGW_AUTOSCALE_TPOT", PDGW_OPT_DURATION, NULL, 0, 0,
     "0", "DURATION", "TPOT the autoscaling signals size the decode pool for when requests "
     "carry no target (0 = `slo_tpot`, else 50ms).", C(autoscale_tpot_ms)},
    {"autoscale_smoothing", "autoscale-smoothing", "PDGW_AUTOSCALE_SMOOTHING", PDGW_OPT_DURATION,
     NULL, 0, 0, "30s", "DURATION", "Time constant of the demand averages behind the "
     "autoscaling signals.", C(autoscale_tau_ms)},
    {"autoscale_window", "autoscale-window", "PDGW_AUTOSCALE_WINDOW", PDGW_OPT_DURATION, NULL, 0,
     0, "2m", "DURATION", "Scale-down stabilisation: desired replicas fall only to the highest "
     "need seen in this window.", C(autoscale_window_ms)},
    {"kv_events_max_message_bytes", "kv-events-max-message-bytes",
     "PDGW_KV_EVENTS_MAX_MESSAGE_BYTES", PDGW_OPT_SIZE, NULL, 65536, 1073741824, "16MiB", "SIZE",
     "Largest KV-event message (precise-prefix) taken from an engine's publisher or "
     "replay socket; a larger one drops that connection, which is opened again and "
     "counted in `pdgw_kv_event_reconnects_total`.",
     C(kv_events_max_message_bytes)},
    {"kv_events_silence", "kv-events-silence", "PDGW_KV_EVENTS_SILENCE", PDGW_OPT_DURATION, NULL,
     1, 3600000, "30s", "DURATION", "precise-prefix: an instance routed a request whose "
     "KV-event publisher then sends "
     "nothing for this long is warned about once (gauge `pdgw_kv_event_silence_seconds`, "
     "`/admin/instances`).", C(kv_events_silence_ms)},
    {"tokenize_timeout", "tokenize-timeout", "PDGW_TOKENIZE_TIMEOUT", PDGW_OPT_DURATION, NULL,
     0, 0, "250ms", "DURATION", "Longest wait for an engine's POST /tokenize of a text prompt "
     "(precise-prefix, selective PD) before the request is routed without tokens "
     "(0 = never tokenize).", C(tokenize_timeout_ms)},
    {"tokenize_cache_entries", "tokenize-cache-entries", "PDGW_TOKENIZE_CACHE_ENTRIES",
     PDGW_OPT_INT, NULL, 0, 16777216, "4096", "N", "Tokenized prompts kept, by prompt hash "
     "(0 = no cache).", C(tokenize_cache_entries)},
    {"tokenizers", "tokenizer", "PDGW_TOKENIZERS", PDGW_OPT_MAP, NULL, 0, 0, NULL,
     "MODEL=PATH", "A model's tokenizer in the gateway: a Hugging Face `tokenizer.json` or the "
     "directory holding it (with `tokenizer_config.json` for the chat template), or `engine`. "
     "Its prompts are tokenized in process before admission, so precise-prefix, selective PD, "
     "latency targets, token budgets and lmcache's prompt ids use exact ids without the "
     "engine's POST /tokenize; one the gateway cannot run exactly is reported at start and "
     "that model asks the engine (repeatable; every model not named asks its engine).",
     C(tokenizers)},
    {"pd_min_prompt_tokens", "pd-min-prompt-tokens", "PDGW_PD_MIN_PROMPT_TOKENS", PDGW_OPT_INT,
     NULL, 0, 100000000, "0", "N", "Selective PD: a prompt of fewer tokens, or whose part the "
     "chosen decode does not hold is shorter, goes decode-only (0 = always PD).",
     C(pd_min_prompt_tokens)},
    {"pd_skip_cached_percent", "pd-skip-cached-percent", "PDGW_PD_SKIP_CACHED_PERCENT",
     PDGW_OPT_INT, NULL, 0, 100, "0", "PERCENT", "Selective PD: decode-only when the chosen "
     "decode holds at least this share of the prompt (precise-prefix KV events; 0 = off).",
     C(pd_skip_cached_percent)},
    {"pd_skip_predicted", "pd-skip-predicted", "PDGW_PD_SKIP_PREDICTED", PDGW_OPT_BOOL, NULL, 0,
     0, "false", NULL, "Selective PD by prediction: decode-only when the chosen decode is "
     "predicted to reach the first token sooner by computing the prompt itself than through "
     "the prefill and the KV handoff, and that work holds up its running requests by less "
     "than their time-per-output-token slack (learnt latency models; until they have seen "
     "enough legs, PD).",
     C(pd_skip_predicted)},
    {"drain_timeout", "drain-timeout", "PDGW_DRAIN_TIMEOUT", PDGW_OPT_DURATION, NULL, 0, 0,
     "30s", "DURATION", "On SIGTERM, how long in-flight requests may finish.",
     C(drain_timeout_ms)},
    {"check_engines_at_start", "check-engines-at-start", "PDGW_CHECK_ENGINES_AT_START",
     PDGW_OPT_BOOL, NULL, 0, 0, "false", NULL, "Run the probes of `--check-engines` once at "
     "start-up, in the background; what they "
     "find is logged as warnings and counted in `pdgw_engine_checks{result}` (the gateway "
     "serves anyway).", C(check_engines_at_start)},
    {"check_engines_timeout", "check-engines-timeout", "PDGW_CHECK_ENGINES_TIMEOUT",
     PDGW_OPT_DURATION, NULL, 1, 0, "2s", "DURATION", "Timeout of each probe of the engine "
     "checks (HTTP request, TCP connect, ZeroMQ greeting).", C(check_engines_timeout_ms)},
    {"check_engines_events_wait", "check-engines-events-wait", "PDGW_CHECK_ENGINES_EVENTS_WAIT",
     PDGW_OPT_DURATION, NULL, 0, 0, "3s", "DURATION", "How long the engine checks listen to "
     "each KV-event publisher (all at once; 0 = connect only).",
     C(check_engines_events_wait_ms)},
    {"api_keys", "api-key", "PDGW_API_KEYS", PDGW_OPT_LIST, NULL, 0, 0, NULL, "KEY",
     "Accepted API key for \"Authorization: Bearer\" (repeatable; none = no auth).",
     C(api_keys)},
    {"api_key_file", "api-key-file", "PDGW_API_KEY_FILE", PDGW_OPT_STRING, NULL, 0, 0, "",
     "PATH", "File of API keys, one per line ('#' comments).", C(api_key_file)},
    {"admin_api_key", "admin-api-key", "PDGW_ADMIN_API_KEY", PDGW_OPT_STRING, NULL, 0, 0, "",
     "KEY", "Bearer key required for `/admin/*` writes (and accepted for reads); unset = admin "
     "writes only from loopback clients. See \"Admin API\".", C(admin_api_key)},
    {"admin_trust_loopback", "admin-trust-loopback", "PDGW_ADMIN_TRUST_LOOPBACK", PDGW_OPT_BOOL,
     NULL, 0, 0, "true", NULL, "Without `admin_api_key`, accept admin writes from loopback "
     "peers. Turn it off "
     "behind a proxy or sidecar on the same host. See \"Admin API\".", C(admin_trust_loopback)},
    {"metrics_need_key", "metrics-need-key", "PDGW_METRICS_NEED_KEY", PDGW_OPT_BOOL, NULL, 0,
     0, "false", NULL, "`/metrics` needs an API key when keys are configured; by default it, "
     "`/health` and "
     "`/ready` need none.", C(metrics_need_key)},
    {"log_level", "log-level", "PDGW_LOG_LEVEL", PDGW_OPT_ENUM, level_names, 0, 0, "info",
     "LEVEL", "Log level.", C(log_level)},
    {"log_format", "log-format", "PDGW_LOG_FORMAT", PDGW_OPT_ENUM, format_names, 0, 0, "text",
     "FORMAT", "Log format: text lines or JSON lines.", C(log_format)},
    {"access_log", "access-log", "PDGW_ACCESS_LOG", PDGW_OPT_BOOL, NULL, 0, 0, "true", NULL,
     "One log line per request (--no-access-log to disable).", C(access_log)},
    {"models", "model", "PDGW_MODELS", PDGW_OPT_LIST, NULL, 0, 0, NULL, "NAME",
     "Model name served by /v1/models (repeatable; none = aggregate from instances).",
     C(models)},
    {"passthrough", "passthrough", "PDGW_PASSTHROUGH", PDGW_OPT_BOOL, NULL, 0, 0, "true", NULL,
     "Proxy any other /v1/ path and the engines' utility endpoints (/tokenize, /pooling, "
     "/score, /rerank, ...) unchanged to an instance of the body's model (--no-passthrough: "
     "404 from pdgw).",
     C(passthrough)},
    {"cors_allowed_origins", "cors-allowed-origin", "PDGW_CORS_ALLOWED_ORIGINS", PDGW_OPT_LIST,
     NULL, 0, 0, NULL, "ORIGIN", "Browser origin (scheme://host[:port]) allowed by CORS, or * "
     "for any (repeatable; none = no CORS headers, preflights refused with 403).",
     C(cors_allowed_origins)},
    {"prefill_policy", "prefill-policy", "PDGW_PREFILL_POLICY", PDGW_OPT_ENUM, policy_names, 0,
     0, "least-load", "POLICY", "How a prefill instance is chosen.", C(prefill_policy)},
    {"decode_policy", "decode-policy", "PDGW_DECODE_POLICY", PDGW_OPT_ENUM, policy_names, 0, 0,
     "least-load", "POLICY", "How a decode instance is chosen.", C(decode_policy)},
    {"health_interval", "health-interval", "PDGW_HEALTH_INTERVAL", PDGW_OPT_DURATION, NULL, 1,
     0, "2s", "DURATION", "Period of active health probes (GET /health).",
     C(health_interval_ms)},
    {"health_timeout", "health-timeout", "PDGW_HEALTH_TIMEOUT", PDGW_OPT_DURATION, NULL, 1, 0,
     "1s", "DURATION", "Timeout of one health probe.", C(health_timeout_ms)},
    {"healthy_threshold", "healthy-threshold", "PDGW_HEALTHY_THRESHOLD", PDGW_OPT_INT, NULL, 1,
     100, "1", "N", "Successful probes before an instance is usable again.",
     C(healthy_threshold)},
    {"unhealthy_threshold", "unhealthy-threshold", "PDGW_UNHEALTHY_THRESHOLD", PDGW_OPT_INT,
     NULL, 1, 100, "2", "N", "Failed probes before an instance is taken out.",
     C(unhealthy_threshold)},
    {"metrics_scrape_interval", "metrics-scrape-interval", "PDGW_METRICS_SCRAPE_INTERVAL",
     PDGW_OPT_DURATION, NULL, 0, 0, "2s", "DURATION", "Period of engine /metrics scrapes for "
     "load (0 = off).", C(metrics_scrape_interval_ms)},
    {"breaker_failures", "breaker-failures", "PDGW_BREAKER_FAILURES", PDGW_OPT_INT, NULL, 0,
     1000, "5", "N", "Consecutive failures that open an instance's circuit breaker (0 = "
     "never).", C(breaker_failures)},
    {"breaker_open_time", "breaker-open-time", "PDGW_BREAKER_OPEN_TIME", PDGW_OPT_DURATION,
     NULL, 0, 0, "10s", "DURATION", "How long an open breaker waits before a half-open try.",
     C(breaker_open_time_ms)},
    {"discovery.dns.prefill", "discovery-dns-prefill", "PDGW_DISCOVERY_DNS_PREFILL",
     PDGW_OPT_HOSTPORT, NULL, 0, 0, "", "HOST:PORT", "DNS name whose addresses are prefill "
     "instances (re-resolved).", C(dns.prefill)},
    {"discovery.dns.decode", "discovery-dns-decode", "PDGW_DISCOVERY_DNS_DECODE",
     PDGW_OPT_HOSTPORT, NULL, 0, 0, "", "HOST:PORT", "DNS name whose addresses are decode "
     "instances.", C(dns.decode)},
    {"discovery.dns.both", "discovery-dns-both", "PDGW_DISCOVERY_DNS_BOTH", PDGW_OPT_HOSTPORT,
     NULL, 0, 0, "", "HOST:PORT", "DNS name whose addresses serve both roles.", C(dns.both)},
    {"discovery.dns.interval", "discovery-dns-interval", "PDGW_DISCOVERY_DNS_INTERVAL",
     PDGW_OPT_DURATION, NULL, 1, 0, "5s", "DURATION", "Re-resolution period.",
     C(dns.interval_ms)},
    {"discovery.kubernetes.namespace", "discovery-kubernetes-namespace",
     "PDGW_DISCOVERY_KUBERNETES_NAMESPACE", PDGW_OPT_STRING, NULL, 0, 0, "", "NS",
     "Namespace to watch; empty = the pod's own namespace.", C(k8s.namespace_name)},
    {"discovery.kubernetes.prefill_selector", "discovery-kubernetes-prefill-selector",
     "PDGW_DISCOVERY_KUBERNETES_PREFILL_SELECTOR", PDGW_OPT_STRING, NULL, 0, 0, "", "SELECTOR",
     "Label selector of the prefill Services (EndpointSlices).", C(k8s.prefill_selector)},
    {"discovery.kubernetes.decode_selector", "discovery-kubernetes-decode-selector",
     "PDGW_DISCOVERY_KUBERNETES_DECODE_SELECTOR", PDGW_OPT_STRING, NULL, 0, 0, "", "SELECTOR",
     "Label selector of the decode Services.", C(k8s.decode_selector)},
    {"discovery.kubernetes.both_selector", "discovery-kubernetes-both-selector",
     "PDGW_DISCOVERY_KUBERNETES_BOTH_SELECTOR", PDGW_OPT_STRING, NULL, 0, 0, "", "SELECTOR",
     "Label selector of Services serving both roles.", C(k8s.both_selector)},
    {"discovery.kubernetes.port_name", "discovery-kubernetes-port-name",
     "PDGW_DISCOVERY_KUBERNETES_PORT_NAME", PDGW_OPT_STRING, NULL, 0, 0, "http", "NAME",
     "EndpointSlice port name of the engines' HTTP port.", C(k8s.port_name)},
    {"discovery.kubernetes.api_server", "discovery-kubernetes-api-server",
     "PDGW_DISCOVERY_KUBERNETES_API_SERVER", PDGW_OPT_STRING, NULL, 0, 0, "", "URL",
     "API server URL; empty = https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.",
     C(k8s.api_server)},
    {"discovery.kubernetes.token_file", "discovery-kubernetes-token-file",
     "PDGW_DISCOVERY_KUBERNETES_TOKEN_FILE", PDGW_OPT_STRING, NULL, 0, 0, SA_TOKEN, "PATH",
     "Service-account token file.", C(k8s.token_file)},
    {"discovery.kubernetes.ca_file", "discovery-kubernetes-ca-file",
     "PDGW_DISCOVERY_KUBERNETES_CA_FILE", PDGW_OPT_STRING, NULL, 0, 0, SA_CA, "PATH",
     "CA bundle of the API server.", C(k8s.ca_file)},
    {"kv_bytes_per_token", "kv-bytes-per-token", "PDGW_KV_BYTES_PER_TOKEN", PDGW_OPT_MAP, NULL, 0,
     0, NULL, "MODEL=BYTES",
     "KV cache bytes of one token of MODEL (2 x layers x KV heads x head size x bytes per "
     "value; e.g. 131072 for Llama 3 8B in bf16): the tenants' usage counts the KV of their PD "
     "requests' prompts, handed from prefill to decode (`pdgw_quota_kv_bytes_total`; an upper "
     "bound: blocks a decode held already are not pulled). None = not counted (no PD protocol "
     "tells the proxy the bytes).",
     C(kv_bytes_per_token)},
    {"quota_store", "quota-store", "PDGW_QUOTA_STORE", PDGW_OPT_STRING, NULL, 0, 0, "", "URL",
     "Where the tenants' budgets and usage are shared by every replica: "
     "`redis://[user:password@]HOST:PORT/DB`, or `rediss://...` for TLS (`quota.tls_*`). "
     "\"\" = each replica keeps its own (budgets are then per replica).", C(quota_store)},
    {"quota.password", "quota-password", "PDGW_QUOTA_PASSWORD", PDGW_OPT_STRING, NULL, 0, 0, "",
     "SECRET", "Password for the quota store (Redis AUTH), instead of one in the URL: keep it "
     "in a secret's environment variable.", C(quota.password)},
    {"quota.tls_ca_file", "quota-tls-ca-file", "PDGW_QUOTA_TLS_CA_FILE", PDGW_OPT_STRING, NULL,
     0, 0, "", "PATH", "`rediss://` only: PEM CA certificate(s) that sign the store's "
     "certificate. \"\" = the system's trust store.", C(quota.tls_ca_file)},
    {"quota.tls_cert_file", "quota-tls-cert-file", "PDGW_QUOTA_TLS_CERT_FILE", PDGW_OPT_STRING,
     NULL, 0, 0, "", "PATH", "`rediss://` only: PEM client certificate shown to the store "
     "(Redis asks for one unless its `tls-auth-clients` is `no`); with `quota.tls_key_file`.",
     C(quota.tls_cert_file)},
    {"quota.tls_key_file", "quota-tls-key-file", "PDGW_QUOTA_TLS_KEY_FILE", PDGW_OPT_STRING,
     NULL, 0, 0, "", "PATH", "`rediss://` only: PEM private key of `quota.tls_cert_file` "
     "(unencrypted).", C(quota.tls_key_file)},
    {"quota.tls_server_name", "quota-tls-server-name", "PDGW_QUOTA_TLS_SERVER_NAME",
     PDGW_OPT_STRING, NULL, 0, 0, "", "NAME", "`rediss://` only: the name (or IP address) the "
     "store's certificate must carry, and the SNI sent. \"\" = the URL's host.",
     C(quota.tls_server_name)},
    {"quota.fail_mode", "quota-fail-mode", "PDGW_QUOTA_FAIL_MODE", PDGW_OPT_ENUM,
     quota_fail_names, 0, 0, "open", "MODE", "The quota store unreachable: `open` serves on "
     "local limits (each budget / `quota.expected_replicas`), `closed` answers 503 "
     "`quota_store_unavailable`.", C(quota.fail_mode)},
    {"quota.expected_replicas", "quota-expected-replicas", "PDGW_QUOTA_EXPECTED_REPLICAS",
     PDGW_OPT_INT, NULL, 1, 10000, "1", "N", "Gateway replicas sharing the store: sizes each "
     "replica's lease of a budget and its share when the store is down.",
     C(quota.expected_replicas)},
    {"quota.sync_interval", "quota-sync-interval", "PDGW_QUOTA_SYNC_INTERVAL", PDGW_OPT_DURATION,
     NULL, 0, 0, "100ms", "DURATION", "How often a replica tops up its leases from the store.",
     C(quota.sync_interval_ms)},
    {"quota.usage_interval", "quota-usage-interval", "PDGW_QUOTA_USAGE_INTERVAL",
     PDGW_OPT_DURATION, NULL, 0, 0, "1s", "DURATION", "How often usage totals are pushed to the "
     "store.", C(quota.usage_interval_ms)},
    {"quota.timeout", "quota-timeout", "PDGW_QUOTA_TIMEOUT", PDGW_OPT_DURATION, NULL, 0, 0,
     "200ms", "DURATION", "Longest connect or command to the store; a store slower than this "
     "counts as down (requests never wait for it).", C(quota.timeout_ms)},
    {"quota.lease_fraction", "quota-lease-fraction", "PDGW_QUOTA_LEASE_FRACTION",
     PDGW_OPT_STRING, NULL, 0, 0, "", "FRACTION", "Share of a budget one replica leases at a "
     "time, 0..1 (at least 2 units): N replicas admit at most N leases more than one budget "
     "allows. \"\" = 1 / (4 x `quota.expected_replicas`).", C(quota.lease_fraction)},
    {"quota.key_prefix", "quota-key-prefix", "PDGW_QUOTA_KEY_PREFIX", PDGW_OPT_STRING, NULL, 0,
     0, "pdq:", "PREFIX", "Prefix of every key pdgw writes in the store (several fleets may "
     "share one Redis).", C(quota.key_prefix)},
    {"quota.default_tenant", "quota-default-tenant", "PDGW_QUOTA_DEFAULT_TENANT",
     PDGW_OPT_STRING, NULL, 0, 0, "", "NAME", "Tenant of requests without an API key; \"\" = "
     "the first of `tenants`.", C(quota.default_tenant)},
    {"quota.output_estimate", "quota-output-estimate", "PDGW_QUOTA_OUTPUT_ESTIMATE",
     PDGW_OPT_INT, NULL, 1, 10000000, "512", "TOKENS", "Completion tokens charged at admission "
     "to a request without `max_tokens` (reconciled with the engine's usage when it ends).",
     C(quota.output_estimate)},
    {"tracing.otlp_endpoint", "tracing-otlp-endpoint", "PDGW_TRACING_OTLP_ENDPOINT",
     PDGW_OPT_STRING, NULL, 0, 0, "", "URL", "OpenTelemetry collector base URL (OTLP/HTTP, "
     "spans POSTed as JSON to URL/v1/traces); empty = OTEL_EXPORTER_OTLP_ENDPOINT, else no "
     "tracing.", C(tracing.otlp_endpoint)},
    {"tracing.service_name", "tracing-service-name", "PDGW_TRACING_SERVICE_NAME",
     PDGW_OPT_STRING, NULL, 0, 0, "", "NAME", "service.name of the spans; empty = "
     "OTEL_SERVICE_NAME, else pdgw.", C(tracing.service_name)},
    {"tracing.sample_ratio", "tracing-sample-ratio", "PDGW_TRACING_SAMPLE_RATIO",
     PDGW_OPT_STRING, NULL, 0, 0, "", "RATIO", "Share of requests without a sampled parent "
     "that are traced, 0..1; empty = OTEL_TRACES_SAMPLER_ARG, else 1.",
     C(tracing.sample_ratio)},
    /* CLI-only actions */
    {NULL, "config", "PDGW_CONFIG", PDGW_OPT_ACTION, NULL, 0, 0, NULL, "FILE",
     "Load this YAML config file (short: -c).", 0},
    {NULL, "both", "PDGW_BOTH", PDGW_OPT_ACTION, NULL, 0, 0, NULL, "URL",
     "Add an instance serving prefill and decode (repeatable; env: comma-separated).", 0},
    {NULL, "prefill", "PDGW_PREFILL", PDGW_OPT_ACTION, NULL, 0, 0, NULL, "URL",
     "Add a prefill instance (repeatable).", 0},
    {NULL, "decode", "PDGW_DECODE", PDGW_OPT_ACTION, NULL, 0, 0, NULL, "URL",
     "Add a decode instance (repeatable).", 0},
    {NULL, "check-config", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, "FILE",
     "Validate FILE (defaults + file, with cross-field checks), print \"config OK\" or the "
     "error, exit 0/1.", 0},
    {NULL, "check-engines", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, NULL,
     "Probe every configured and discovered instance (health, models, metrics, the "
     "protocol's ports, KV events), print one table, exit 1 when a check fails. See "
     "docs/operator-guide.md, \"Checking the engines\".", 0},
    {NULL, "json", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, NULL,
     "With `--check-engines`: print the result as one JSON object (alone: an error).", 0},
    {NULL, "print-config", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, NULL,
     "Print the effective configuration as YAML and exit.", 0},
    {NULL, "help", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, NULL,
     "Show this help and exit (short: -h).", 0},
    {NULL, "version", NULL, PDGW_OPT_ACTION, NULL, 0, 0, NULL, NULL,
     "Print the version and exit (short: -V).", 0},
};

static const pdgw_config_option_t instance_options[] = {
    {"id", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "ID",
     "Unique instance id; default host:port of url.", I(id)},
    {"url", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "URL",
     "Engine HTTP base URL (required), e.g. http://10.0.0.5:8000.", I(url)},
    {"role", NULL, NULL, PDGW_OPT_ENUM, role_names, 0, 0, "both", "ROLE",
     "prefill, decode or both.", I(role)},
    {"zone", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "ZONE",
     "Zone label (shorthand for labels.zone), used to pair prefill and decode.", I(zone)},
    {"weight", NULL, NULL, PDGW_OPT_INT, NULL, 1, 1000000, "1", "N",
     "Weight for the weighted policy.", I(weight)},
    {"kv_host", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "HOST",
     "Host of the KV side channels; default the host of url.", I(kv_host)},
    {"kv_port", NULL, NULL, PDGW_OPT_INT, NULL, 0, 65535, "0", "PORT",
     "KV transfer side-channel port (vllm-kvt); 0 = unset.", I(kv_port)},
    {"bootstrap_port", NULL, NULL, PDGW_OPT_INT, NULL, 0, 65535, "0", "PORT",
     "Bootstrap port (sglang, vllm-mooncake); 0 = unset.", I(bootstrap_port)},
    {"engine_id", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "ID",
     "Engine id used by the KV connector (e.g. NIXL engine id).", I(engine_id)},
    {"kv_events_endpoint", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "ENDPOINT",
     "Engine's KV-event publisher (tcp://host:port) for precise-prefix; \"\" = none.",
     I(kv_events_endpoint)},
    {"kv_events_replay_endpoint", NULL, NULL, PDGW_OPT_STRING, NULL, 0, 0, "", "ENDPOINT",
     "Engine's KV-event replay ROUTER (tcp://host:port); \"\" = none.",
     I(kv_events_replay_endpoint)},
    {"alloc_ports", NULL, NULL, PDGW_OPT_INT_LIST, NULL, 1, 65535, NULL, "PORTS",
     "lmcache receiver allocation port per TP rank.", I(alloc_ports)},
    {"init_ports", NULL, NULL, PDGW_OPT_INT_LIST, NULL, 1, 65535, NULL, "PORTS",
     "lmcache receiver init port per TP rank.", I(init_ports)},
    {"tp_size", NULL, NULL, PDGW_OPT_INT, NULL, 1, 1024, "1", "N", "Tensor-parallel size.",
     I(tp_size)},
    {"kv_capacity_tokens", NULL, NULL, PDGW_OPT_INT, NULL, 0, 2000000000, "0", "TOKENS",
     "KV memory of the engine in tokens (num_gpu_blocks x block_size); 0 = read from its "
     "`vllm:cache_config_info`, else learnt from its KV usage. A decode whose projected KV "
     "would not fit the request is passed over while another has room.",
     I(kv_capacity_tokens)},
    {"dp_rank", NULL, NULL, PDGW_OPT_INT, NULL, 0, 65535, "0", "N",
     "Data-parallel rank, below dp_size.",
     I(dp_rank)},
    {"dp_size", NULL, NULL, PDGW_OPT_INT, NULL, 1, 65536, "1", "N", "Data-parallel size.",
     I(dp_size)},
    {"labels", NULL, NULL, PDGW_OPT_MAP, NULL, 0, 0, NULL, "MAP",
     "Free-form labels (zone, rack, ...).", I(labels)},
    {"max_concurrent", NULL, NULL, PDGW_OPT_INT, NULL, 0, 1000000, "0", "N",
     "Capacity: legs open on this instance at once; a full instance is skipped by every "
     "policy (all full: 429). 0 = unlimited.",
     I(max_concurrent)},
    {"models", NULL, NULL, PDGW_OPT_LIST, NULL, 0, 0, NULL, "NAMES",
     "Model names the instance serves (at most 16); requests of other models never reach it. "
     "None = learnt from the engine's GET /v1/models with each health probe.", I(models)},
    {"attrs", NULL, NULL, PDGW_OPT_MAP, NULL, 0, 0, NULL, "MAP",
     "Protocol attributes of the instance, opaque to the scheduler; forwarders read them with "
     "pdgw_fwd_instance_attr() (a new protocol's fields need no new key here). The protocol "
     "declares the ones it reads: another key or a value of the wrong type is an error at "
     "start-up, --check-config and reloads (the in-tree protocols read none).",
     I(attrs)},
    {"kv_engine", NULL, NULL, PDGW_OPT_ENUM, kv_engine_names, 0, 0, "lmcache", "ENGINE",
     "KV engine of the instance: `lmcache` (upstream; only LMCache's own control messages) "
     "or `libkvt` (pdgw extensions such as ReserveRequest allowed).", I(kv_engine)},
};
/* clang-format on */

const pdgw_config_option_t *pdgw_config_options(size_t *n_out)
{
    *n_out = sizeof(options) / sizeof(options[0]);
    return options;
}

const pdgw_config_option_t *pdgw_config_instance_options(size_t *n_out)
{
    *n_out = sizeof(instance_options) / sizeof(instance_options[0]);
    return instance_options;
}

/* ---------------------------------------------------------------- errors, suggestions */

pdgw_status_t pdgw_cfg_fail(pdgw_cfg_src_t *src, const char *key, const char *fmt, ...)
{
    if (src == NULL || src->err == NULL)
        return PDGW_ERR_INVALID;
    pdgw_config_error_t *e = src->err;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(e->key, sizeof(e->key), "%s", key != NULL ? key : "");
    snprintf(e->file, sizeof(e->file), "%s", src->file != NULL ? src->file : "");
    e->line = src->file != NULL ? src->line : 0;
    const char *name = src->label != NULL ? src->label : key;
    size_t cap = sizeof(e->message), off = 0;
    int n = 0;
    e->message[0] = '\0';
    if (src->file != NULL && src->line > 0)
        n = snprintf(e->message, cap, "%.255s:%d: ", src->file, src->line);
    else if (src->file != NULL)
        n = snprintf(e->message, cap, "%.255s: ", src->file);
    off = n > 0 ? (size_t)n : 0;
    if (name != NULL && name[0] != '\0' && off < cap) {
        n = snprintf(e->message + off, cap - off, "%.127s: ", name);
        off += n > 0 ? (size_t)n : 0;
    }
    if (off < cap)
        snprintf(e->message + off, cap - off, "%.*s", (int)(cap - off - 1), msg);
    return PDGW_ERR_INVALID;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(size_t) * (lb + 1));
    }
    return prev[lb];
}

const char *pdgw_cfg_suggest(const char *word, const char *const *cands, size_t n)
{
    const char *best = NULL;
    size_t best_d = 4;
    for (size_t i = 0; i < n; i++) {
        if (cands[i] == NULL)
            continue;
        size_t d = edit_distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best;
}

void pdgw_cfg_suggest_key(const pdgw_config_option_t *tab, size_t n, const char *prefix,
                          const char *word, char *out, size_t out_len)
{
    const char *cands[128];
    char store[128][64];
    size_t nc = 0, pl = strlen(prefix);
    for (size_t i = 0; i < n && nc < 128; i++) {
        const char *k = tab[i].key;
        if (k == NULL || strncmp(k, prefix, pl) != 0)
            continue;
        /* the next path component below prefix */
        const char *rest = k + pl;
        size_t cl = strcspn(rest, ".");
        if (cl == 0 || cl >= 64)
            continue;
        memcpy(store[nc], rest, cl);
        store[nc][cl] = '\0';
        cands[nc] = store[nc];
        nc++;
    }
    const char *s = pdgw_cfg_suggest(word, cands, nc);
    if (s != NULL)
        snprintf(out, out_len, " (did you mean '%s'?)", s);
    else if (out_len > 0)
        out[0] = '\0';
}

const pdgw_config_option_t *pdgw_cfg_find_key(const pdgw_config_option_t *tab, size_t n,
                                              const char *key)
{
    for (size_t i = 0; i < n; i++) {
        if (tab[i].key != NULL && strcmp(tab[i].key, key) == 0)
            return &tab[i];
    }
    return NULL;
}

/* ---------------------------------------------------------------- containers */

pdgw_status_t pdgw_cfg_str_set(char **field, const char *s)
{
    char *copy = pdgw_strdup(s != NULL ? s : "");
    if (copy == NULL)
        return PDGW_ERR_NOMEM;
    pdgw_free(*field);
    *field = copy;
    return PDGW_OK;
}

pdgw_status_t pdgw_cfg_list_append(pdgw_str_list_t *l, const char *s)
{
    char *copy = pdgw_strdup(s);
    if (copy == NULL)
        return PDGW_ERR_NOMEM;
    char **items = pdgw_realloc(l->items, (l->count + 1) * sizeof(char *));
    if (items == NULL) {
        pdgw_free(copy);
        return PDGW_ERR_NOMEM;
    }
    items[l->count++] = copy;
    l->items = items;
    return PDGW_OK;
}

void pdgw_cfg_list_free(pdgw_str_list_t *l)
{
    for (size_t i = 0; i < l->count; i++)
        pdgw_free(l->items[i]);
    pdgw_free(l->items);
    l->items = NULL;
    l->count = 0;
}

pdgw_status_t pdgw_cfg_map_set(pdgw_kv_list_t *m, const char *k, const char *v)
{
    for (size_t i = 0; i < m->count; i++) {
        if (strcmp(m->items[i].key, k) == 0)
            return pdgw_cfg_str_set(&m->items[i].value, v);
    }
    char *kc = pdgw_strdup(k), *vc = pdgw_strdup(v);
    pdgw_kv_t *items = NULL;
    if (kc != NULL && vc != NULL)
        items = pdgw_realloc(m->items, (m->count + 1) * sizeof(pdgw_kv_t));
    if (items == NULL) {
        pdgw_free(kc);
        pdgw_free(vc);
        return PDGW_ERR_NOMEM;
    }
    items[m->count].key = kc;
    items[m->count].value = vc;
    m->items = items;
    m->count++;
    return PDGW_OK;
}

void pdgw_cfg_map_free(pdgw_kv_list_t *m)
{
    for (size_t i = 0; i < m->count; i++) {
        pdgw_free(m->items[i].key);
        pdgw_free(m->items[i].value);
    }
    pdgw_free(m->items);
    m->items = NULL;
    m->count = 0;
}

const char *pdgw_kv_list_get(const pdgw_kv_list_t *list, const char *key)
{
    for (size_t i = 0; list != NULL && i < list->count; i++) {
        if (strcmp(list->items[i].key, key) == 0)
            return list->items[i].value;
    }
    return NULL;
}

pdgw_status_t pdgw_cfg_int_list_append(pdgw_int_list_t *l, int v)
{
    int *items = pdgw_realloc(l->items, (l->count + 1) * sizeof(int));
    if (items == NULL)
        return PDGW_ERR_NOMEM;
    items[l->count++] = v;
    l->items = items;
    return PDGW_OK;
}

/* ---------------------------------------------------------------- typed setters */

static void *field_at(void *base, const pdgw_config_option_t *o)
{
    return (char *)base + o->offset;
}

static void enum_list(const char *const *names, char *out, size_t out_len)
{
    size_t off = 0;
    out[0] = '\0';
    for (size_t i = 0; names[i] != NULL && off < out_len; i++)
        off += (size_t)snprintf(out + off, out_len - off, "%s%s", i ? ", " : "", names[i]);
}

void pdgw_cfg_opt_clear(const pdgw_config_option_t *o, void *base)
{
    if (o->type == PDGW_OPT_LIST)
        pdgw_cfg_list_free(field_at(base, o));
    else if (o->type == PDGW_OPT_MAP)
        pdgw_cfg_map_free(field_at(base, o));
    else if (o->type == PDGW_OPT_INT_LIST) {
        pdgw_int_list_t *l = field_at(base, o);
        pdgw_free(l->items);
        l->items = NULL;
        l->count = 0;
    }
}

pdgw_status_t pdgw_cfg_opt_set_text(const pdgw_config_option_t *o, void *base, const char *text,
                                    const char *key, pdgw_cfg_src_t *src)
{
    void *f = field_at(base, o);
    pdgw_status_t st;
    switch (o->type) {
    case PDGW_OPT_STRING:
        return pdgw_cfg_str_set(f, text);
    case PDGW_OPT_HOSTPORT: {
        if (text[0] == '\0') {
            if (o->min > 0)
                return pdgw_cfg_fail(src, key, "expected host:port, got an empty value");
            return pdgw_cfg_str_set(f, text);
        }
        char host[256];
        int port;
        /* listen may name port 0: the kernel picks a free port, the log line names it. */
        bool port0 = strcmp(o->key, "listen") == 0;
        st = pdgw_hostport_parse(text, port0, host, sizeof(host), &port);
        if (st != PDGW_OK)
            return pdgw_cfg_fail(
                src, key, "expected host:port (port %s..65535, IPv6 in brackets), got \"%s\"",
                port0 ? "0" : "1", text);
        return pdgw_cfg_str_set(f, text);
    }
    case PDGW_OPT_INT: {
        int64_t v;
        if (pdgw_int_parse(text, o->min, o->max, &v) != PDGW_OK)
            return pdgw_cfg_fail(src, key, "expected an integer in %ld..%ld, got \"%s\"", o->min,
                                 o->max, text);
        *(int *)f = (int)v;
        return PDGW_OK;
    }
    case PDGW_OPT_BOOL: {
        bool b;
        if (pdgw_bool_parse(text, &b) != PDGW_OK)
            return pdgw_cfg_fail(src, key, "expected true or false, got \"%s\"", text);
        *(bool *)f = b;
        return PDGW_OK;
    }
    case PDGW_OPT_DURATION: {
        uint64_t ms;
        if (pdgw_duration_parse(text, &ms) != PDGW_OK)
            return pdgw_cfg_fail(src, key,
                                 "expected a duration such as 500ms, 30s, 2m or a number of "
                                 "seconds, got \"%s\"",
                                 text);
        if (o->min > 0 && ms < (uint64_t)o->min)
            return pdgw_cfg_fail(src, key, "must be at least %ldms, got \"%s\"", o->min, text);
        *(uint64_t *)f = ms;
        return PDGW_OK;
    }
    case PDGW_OPT_SIZE: {
        uint64_t b;
        if (pdgw_size_parse(text, &b) != PDGW_OK)
            return pdgw_cfg_fail(src, key,
                                 "expected a size such as 16MiB, 512KiB or a number of bytes, got "
                                 "\"%s\"",
                                 text);
        if (o->min > 0 && b < (uint64_t)o->min)
            return pdgw_cfg_fail(src, key, "must be at least %ld bytes, got \"%s\"", o->min, text);
        if (o->max > 0 && b > (uint64_t)o->max)
            return pdgw_cfg_fail(src, key, "must be at most %ld bytes, got \"%s\"", o->max, text);
        *(uint64_t *)f = b;
        return PDGW_OK;
    }
    case PDGW_OPT_ENUM: {
        int i = enum_index(o->enum_names, text);
        if (i < 0) {
            char list[256];
            enum_list(o->enum_names, list, sizeof(list));
            return pdgw_cfg_fail(src, key, "expected one of %s, got \"%s\"", list, text);
        }
        *(int *)f = i;
        return PDGW_OK;
    }
    case PDGW_OPT_LIST:
        if (text[0] == '\0')
            return pdgw_cfg_fail(src, key, "empty list item");
        return pdgw_cfg_list_append(f, text);
    case PDGW_OPT_MAP: {
        const char *eq = strchr(text, '=');
        if (eq == NULL || eq == text)
            return pdgw_cfg_fail(src, key, "expected key=value, got \"%s\"", text);
        char k[256];
        size_t kl = (size_t)(eq - text);
        if (kl >= sizeof(k))
            return pdgw_cfg_fail(src, key, "key too long in \"%s\"", text);
        memcpy(k, text, kl);
        k[kl] = '\0';
        return pdgw_cfg_map_set(f, k, eq + 1);
    }
    case PDGW_OPT_INT_LIST: {
        int64_t v;
        if (pdgw_int_parse(text, o->min, o->max, &v) != PDGW_OK)
            return pdgw_cfg_fail(src, key, "expected an integer in %ld..%ld, got \"%s\"", o->min,
                                 o->max, text);
        return pdgw_cfg_int_list_append(f, (int)v);
    }
    case PDGW_OPT_ACTION:
        break;
    }
    return PDGW_ERR_INVALID;
}

/* Apply the defaults of <tab> to <base>. */
static pdgw_status_t apply_defaults(const pdgw_config_option_t *tab, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        if (o->key == NULL || o->type == PDGW_OPT_ACTION)
            continue;
        if (o->def == NULL)
            continue;
        pdgw_status_t st = pdgw_cfg_opt_set_text(o, base, o->def, o->key, NULL);
        if (st != PDGW_OK)
            return st == PDGW_ERR_NOMEM ? st : PDGW_ERR_INVALID;
    }
    return PDGW_OK;
}

/* Free every owned member of <base> described by <tab>. */
static void free_fields(const pdgw_config_option_t *tab, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        if (o->key == NULL)
            continue;
        if (o->type == PDGW_OPT_STRING || o->type == PDGW_OPT_HOSTPORT) {
            char **p = field_at(base, o);
            pdgw_free(*p);
            *p = NULL;
        } else {
            pdgw_cfg_opt_clear(o, base);
        }
    }
}

/* ---------------------------------------------------------------- instances */

pdgw_status_t pdgw_cfg_instance_init(pdgw_instance_config_t *inst)
{
    memset(inst, 0, sizeof(*inst));
    pdgw_status_t st = apply_defaults(instance_options,
                                      sizeof(instance_options) / sizeof(instance_options[0]), inst);
    if (st != PDGW_OK)
        pdgw_cfg_instance_free(inst);
    return st;
}

void pdgw_cfg_instance_free(pdgw_instance_config_t *inst)
{
    free_fields(instance_options, sizeof(instance_options) / sizeof(instance_options[0]), inst);
    pdgw_free(inst->host);
    inst->host = NULL;
    pdgw_free(inst->attrs_text);
    inst->attrs_text = NULL;
}

/* attrs as the scheduler carries them, opaque: "key=value\n" lines. Keys may not hold '=' or
 * a newline, values no newline. */
static pdgw_status_t encode_attrs(pdgw_instance_config_t *inst, size_t index, pdgw_cfg_src_t *src)
{
    pdgw_buf_t b = PDGW_BUF_INIT;
    char key[64];

    for (size_t i = 0; i < inst->attrs.count; i++) {
        const pdgw_kv_t *kv = &inst->attrs.items[i];
        if (kv->key[0] == '\0' || strpbrk(kv->key, "=\n") != NULL || strchr(kv->value, '\n')) {
            pdgw_buf_free(&b);
            snprintf(key, sizeof(key), "instances[%zu].attrs", index);
            return pdgw_cfg_fail(src, key,
                                 "\"%s\": keys may not hold '=' or newlines, values "
                                 "no newlines",
                                 kv->key);
        }
        if (pdgw_buf_appendf(&b, "%s=%s\n", kv->key, kv->value) != PDGW_OK) {
            pdgw_buf_free(&b);
            return PDGW_ERR_NOMEM;
        }
    }
    pdgw_free(inst->attrs_text);
    inst->attrs_text = pdgw_buf_steal(&b, NULL);
    return inst->attrs_text != NULL ? PDGW_OK : PDGW_ERR_NOMEM;
}

pdgw_status_t pdgw_cfg_instance_add(pdgw_config_t *cfg, pdgw_instance_config_t *inst)
{
    pdgw_instance_config_t *arr =
        pdgw_realloc(cfg->instances, (cfg->n_instances + 1) * sizeof(*arr));
    if (arr == NULL)
        return PDGW_ERR_NOMEM;
    arr[cfg->n_instances++] = *inst;
    cfg->instances = arr;
    memset(inst, 0, sizeof(*inst));
    return PDGW_OK;
}

pdgw_status_t pdgw_cfg_instance_finalize(pdgw_instance_config_t *inst, size_t index,
                                         pdgw_cfg_src_t *src)
{
    char key[64];
    snprintf(key, sizeof(key), "instances[%zu].url", index);
    if (inst->url == NULL || inst->url[0] == '\0')
        return pdgw_cfg_fail(src, key, "missing required url");
    pdgw_url_t u;
    if (pdgw_url_parse(inst->url, &u) != PDGW_OK)
        return pdgw_cfg_fail(
            src, key, "expected an http:// or https:// URL with a host, got \"%s\"", inst->url);
    pdgw_status_t st = pdgw_cfg_str_set(&inst->host, u.host);
    if (st != PDGW_OK)
        return st;
    inst->port = u.port;
    if (inst->id == NULL || inst->id[0] == '\0') {
        char id[300];
        bool v6 = strchr(u.host, ':') != NULL;
        snprintf(id, sizeof(id), v6 ? "[%s]:%d" : "%s:%d", u.host, u.port);
        st = pdgw_cfg_str_set(&inst->id, id);
        if (st != PDGW_OK)
            return st;
    }
    if (inst->models.count > 16) { /* SCHED_MAX_MODELS */
        snprintf(key, sizeof(key), "instances[%zu].models", index);
        return pdgw_cfg_fail(src, key, "at most 16 model names, got %zu", inst->models.count);
    }
    for (size_t i = 0; i < inst->models.count; i++) {
        if (inst->models.items[i][0] == '\0' || strlen(inst->models.items[i]) > 255) {
            snprintf(key, sizeof(key), "instances[%zu].models", index);
            return pdgw_cfg_fail(src, key, "a model name has 1-255 bytes");
        }
    }
    if (inst->kv_host == NULL || inst->kv_host[0] == '\0') {
        st = pdgw_cfg_str_set(&inst->kv_host, u.host);
        if (st != PDGW_OK)
            return st;
    }
    if (inst->zone != NULL && inst->zone[0] != '\0') {
        const char *lz = pdgw_kv_list_get(&inst->labels, "zone");
        if (lz == NULL) {
            st = pdgw_cfg_map_set(&inst->labels, "zone", inst->zone);
            if (st != PDGW_OK)
                return st;
        } else if (strcmp(lz, inst->zone) != 0) {
            snprintf(key, sizeof(key), "instances[%zu].zone", index);
            return pdgw_cfg_fail(src, key, "zone \"%s\" contradicts labels.zone \"%s\"", inst->zone,
                                 lz);
        }
    } else {
        const char *lz = pdgw_kv_list_get(&inst->labels, "zone");
        if (lz != NULL) {
            st = pdgw_cfg_str_set(&inst->zone, lz);
            if (st != PDGW_OK)
                return st;
        }
    }
    return encode_attrs(inst, index, src);
}

pdgw_status_t pdgw_cfg_instance_quick(pdgw_config_t *cfg, pdgw_role_t role, const char *url,
                                      pdgw_cfg_src_t *src)
{
    pdgw_instance_config_t inst;
    pdgw_status_t st = pdgw_cfg_instance_init(&inst);
    if (st != PDGW_OK)
        return st;
    inst.role = role;
    st = pdgw_cfg_str_set(&inst.url, url);
    if (st == PDGW_OK)
        st = pdgw_cfg_instance_finalize(&inst, cfg->n_instances, src);
    if (st == PDGW_OK)
        st = pdgw_cfg_instance_add(cfg, &inst);
    if (st != PDGW_OK)
        pdgw_cfg_instance_free(&inst);
    return st;
}

/* ---------------------------------------------------------------- whole config */

pdgw_status_t pdgw_config_init(pdgw_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    pdgw_status_t st = apply_defaults(options, sizeof(options) / sizeof(options[0]), cfg);
    if (st == PDGW_OK)
        st = pdgw_cfg_finalize(cfg, NULL);
    if (st != PDGW_OK)
        pdgw_config_free(cfg);
    return st;
}

void pdgw_config_free(pdgw_config_t *cfg)
{
    if (cfg == NULL)
        return;
    free_fields(options, sizeof(options) / sizeof(options[0]), cfg);
    for (size_t i = 0; i < cfg->n_instances; i++)
        pdgw_cfg_instance_free(&cfg->instances[i]);
    pdgw_free(cfg->instances);
    pdgw_free(cfg->listen_host);
    pdgw_free(cfg->config_file);
    pdgw_free(cfg->tenants_json);
    memset(cfg, 0, sizeof(*cfg));
}

pdgw_status_t pdgw_cfg_finalize(pdgw_config_t *cfg, pdgw_cfg_src_t *src)
{
    char host[256];
    int port;
    if (pdgw_hostport_parse(cfg->listen, true, host, sizeof(host), &port) != PDGW_OK)
        return pdgw_cfg_fail(src, "listen", "expected host:port, got \"%s\"", cfg->listen);
    pdgw_status_t st = pdgw_cfg_str_set(&cfg->listen_host, host);
    if (st != PDGW_OK)
        return st;
    cfg->listen_port = port;
    cfg->dns_enabled = cfg->dns.prefill[0] || cfg->dns.decode[0] || cfg->dns.both[0];
    cfg->k8s_enabled =
        cfg->k8s.prefill_selector[0] || cfg->k8s.decode_selector[0] || cfg->k8s.both_selector[0];
    return PDGW_OK;
}

int pdgw_config_workers(const pdgw_config_t *cfg)
{
    if (cfg->workers > 0)
        return cfg->workers;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---------------------------------------------------------------- protocols, checks */

pdgw_status_t pdgw_config_builtin_protocol_info(void *ctx, const pdgw_config_t *cfg,
                                                pdgw_protocol_info_t *info, char *err,
                                                size_t errlen)
{
    /* The registry is the only truth about a protocol: its descriptor's modes and dispatch. */
    const pdgw_fwd_desc_t *desc = pdgw_registry_find(cfg->protocol);
    (void)ctx;
    if (desc == NULL) {
        char names[512];
        pdgw_registry_names(names, sizeof(names));
        snprintf(err, errlen, "unknown forwarder '%s' (registered: %s)", cfg->protocol, names);
        return PDGW_ERR_NOT_FOUND;
    }
    memset(info, 0, sizeof(*info));
    info->supports_batch = (desc->modes & PDGW_MODE_BATCH) != 0;
    info->supports_staged = (desc->modes & PDGW_MODE_STAGED) != 0;
    info->needs_decode = true; /* SINGLE: a decode-capable (decode or both) instance */
    info->needs_prefill = desc->dispatch != PDGW_DISPATCH_SINGLE;
    return PDGW_OK;
}

typedef struct {
    size_t prefill, decode, both;
} role_counts_t;

/* Instance ids unique, DP rank and per-TP-rank ports consistent; counts the roles. */
static pdgw_status_t check_instances(const pdgw_config_t *cfg, pdgw_cfg_src_t *src,
                                     role_counts_t *n)
{
    char key[96];
    pdb_map_t seen; /* id -> its index + 1 (hashed: a fleet of thousands stays linear) */
    pdgw_status_t st = PDGW_OK;

    if (pdb_map_init(&seen, cfg->n_instances) != PDB_OK)
        return pdgw_cfg_fail(src, "instances", "out of memory");
    for (size_t i = 0; st == PDGW_OK && i < cfg->n_instances; i++) {
        const pdgw_instance_config_t *in = &cfg->instances[i];
        void *prev = pdb_map_get(&seen, in->id);
        if (prev != NULL) {
            snprintf(key, sizeof(key), "instances[%zu].id", i);
            st = pdgw_cfg_fail(src, key, "duplicate instance id \"%s\" (also instances[%zu])",
                               in->id, (size_t)(uintptr_t)prev - 1);
        } else if (pdb_map_put(&seen, in->id, (void *)(uintptr_t)(i + 1)) != PDB_OK) {
            st = pdgw_cfg_fail(src, "instances", "out of memory");
        } else if (in->dp_rank >= in->dp_size) {
            snprintf(key, sizeof(key), "instances[%zu].dp_rank", i);
            st = pdgw_cfg_fail(src, key, "dp_rank %d must be below dp_size %d", in->dp_rank,
                               in->dp_size);
        } else if (in->alloc_ports.count != 0 && in->alloc_ports.count != (size_t)in->tp_size) {
            snprintf(key, sizeof(key), "instances[%zu].alloc_ports", i);
            st = pdgw_cfg_fail(src, key, "needs one port per TP rank (tp_size %d), got %zu",
                               in->tp_size, in->alloc_ports.count);
        } else if (in->init_ports.count != 0 && in->init_ports.count != (size_t)in->tp_size) {
            snprintf(key, sizeof(key), "instances[%zu].init_ports", i);
            st = pdgw_cfg_fail(src, key, "needs one port per TP rank (tp_size %d), got %zu",
                               in->tp_size, in->init_ports.count);
        } else if (in->role == PDGW_ROLE_PREFILL) {
            n->prefill++;
        } else if (in->role == PDGW_ROLE_DECODE) {
            n->decode++;
        } else {
            n->both++;
        }
    }
    pdb_map_fini(&seen, NULL);
    return st;
}

/* Credentials printable and bounded; TLS files and the files named readable. */
static pdgw_status_t check_keys_and_files(const pdgw_config_t *cfg, pdgw_cfg_src_t *src)
{
    char key[96];

    for (size_t i = 0; i < cfg->api_keys.count; i++) {
        const char *k = cfg->api_keys.items[i];
        snprintf(key, sizeof(key), "api_keys[%zu]", i);
        if (strlen(k) > 256)
            return pdgw_cfg_fail(src, key, "longer than 256 bytes");
        for (const char *c = k; *c; c++) {
            if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
                return pdgw_cfg_fail(src, key, "contains blanks or non-printable characters");
        }
    }
    if (strlen(cfg->admin_api_key) > 256)
        return pdgw_cfg_fail(src, "admin_api_key", "longer than 256 bytes");
    for (const char *c = cfg->admin_api_key; *c; c++) {
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
            return pdgw_cfg_fail(src, "admin_api_key",
                                 "contains blanks or non-printable characters");
    }
    if (cfg->frontend == 1 /* native */ && cfg->tls_cert[0] != '\0')
        return pdgw_cfg_fail(src, "frontend",
                             "the native front end serves plain HTTP; TLS needs frontend: mhd");
    if ((cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0'))
        return pdgw_cfg_fail(src, cfg->tls_cert[0] ? "tls_key" : "tls_cert",
                             "tls_cert and tls_key go together");
    if (cfg->tls_cert[0] != '\0' && access(cfg->tls_cert, R_OK) != 0)
        return pdgw_cfg_fail(src, "tls_cert", "cannot read \"%s\"", cfg->tls_cert);
    if (cfg->tls_key[0] != '\0' && access(cfg->tls_key, R_OK) != 0)
        return pdgw_cfg_fail(src, "tls_key", "cannot read \"%s\"", cfg->tls_key);
    if (cfg->tls_ca[0] != '\0' && cfg->tls_cert[0] == '\0')
        return pdgw_cfg_fail(src, "tls_ca", "needs tls_cert and tls_key");
    if (cfg->tls_ca[0] != '\0' && access(cfg->tls_ca, R_OK) != 0)
        return pdgw_cfg_fail(src, "tls_ca", "cannot read \"%s\"", cfg->tls_ca);
    if (cfg->api_key_file[0] != '\0' && access(cfg->api_key_file, R_OK) != 0)
        return pdgw_cfg_fail(src, "api_key_file", "cannot read \"%s\"", cfg->api_key_file);
    for (size_t i = 0; i < cfg->plugins.count; i++) {
        if (access(cfg->plugins.items[i], R_OK) != 0) {
            snprintf(key, sizeof(key), "plugins[%zu]", i);
            return pdgw_cfg_fail(src, key, "cannot read \"%s\"", cfg->plugins.items[i]);
        }
    }
    return PDGW_OK;
}

/* Admission, backoff and affinity: the same parse the gateway runs (pdgw_admit.c). */
static pdgw_status_t check_admission(const pdgw_config_t *cfg, pdgw_cfg_src_t *src)
{
    pdgw_admit_limits_t al;
    char aerr[256];
    pdgw_admit_limits_init(&al);
    if (pdgw_admit_limits_from_config(cfg, &al, aerr, sizeof(aerr)) != PDGW_OK) {
        char akey[64];
        const char *colon = strchr(aerr, ':');
        size_t n = colon ? (size_t)(colon - aerr) : 0;
        snprintf(akey, sizeof(akey), "%.*s", (int)n, aerr);
        return pdgw_cfg_fail(src, akey, "%s", colon ? colon + 2 : aerr);
    }
    pdgw_admit_limits_free(&al);
    return PDGW_OK;
}

pdgw_status_t pdgw_kv_bytes_parse(const char *text, uint64_t *out)
{
    char *end;
    unsigned long long v;
    if (text == NULL || *text < '0' || *text > '9')
        return PDGW_ERR_INVALID;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < 1 || v > 1000000000ull)
        return PDGW_ERR_INVALID;
    *out = (uint64_t)v;
    return PDGW_OK;
}

/* Latency targets: each model's "TTFT[:TPOT]" parses (pdgw_slo.c), within the bounds the
 * headers have. */
static pdgw_status_t check_slo(const pdgw_config_t *cfg, pdgw_cfg_src_t *src)
{
    for (size_t i = 0; i < cfg->slo_models.count; i++) {
        pdgw_slo_target_t t;
        if (pdgw_slo_parse_target(cfg->slo_models.items[i].value, &t) != PDGW_OK)
            return pdgw_cfg_fail(src, "slo_models",
                                 "%s: expected TTFT[:TPOT] durations (at most 1h and 1m), got "
                                 "\"%s\"",
                                 cfg->slo_models.items[i].key, cfg->slo_models.items[i].value);
    }
    for (size_t i = 0; i < cfg->slo_keys.count; i++) {
        pdgw_slo_target_t t;
        if (pdgw_slo_parse_target(cfg->slo_keys.items[i].value, &t) != PDGW_OK)
            return pdgw_cfg_fail(src, "slo_keys",
                                 "entry %zu: expected TTFT[:TPOT] durations (at most 1h and 1m), "
                                 "got \"%s\"",
                                 i + 1, cfg->slo_keys.items[i].value); /* the key is a secret */
    }
    for (size_t i = 0; i < cfg->kv_bytes_per_token.count; i++) {
        uint64_t b;
        if (pdgw_kv_bytes_parse(cfg->kv_bytes_per_token.items[i].value, &b) != PDGW_OK)
            return pdgw_cfg_fail(src, "kv_bytes_per_token",
                                 "%s: expected a whole number of bytes, 1..1000000000, got \"%s\"",
                                 cfg->kv_bytes_per_token.items[i].key,
                                 cfg->kv_bytes_per_token.items[i].value);
    }
    if (cfg->slo_ttft_ms > 3600000u)
        return pdgw_cfg_fail(src, "slo_ttft", "at most 1h");
    if (cfg->slo_tpot_ms > 60000u)
        return pdgw_cfg_fail(src, "slo_tpot", "at most 1m");
    return PDGW_OK;
}

/* The protocol exists, supports the scheduling mode, and has the instance roles it needs
 * (configured or discoverable). */
static pdgw_status_t check_protocol(const pdgw_config_t *cfg, const pdgw_config_hooks_t *hooks,
                                    pdgw_cfg_src_t *src, const role_counts_t *n)
{
    pdgw_config_protocol_fn fn = pdgw_config_builtin_protocol_info;
    void *ctx = NULL;
    if (hooks != NULL && hooks->protocol_info != NULL) {
        fn = hooks->protocol_info;
        ctx = hooks->ctx;
    }
    pdgw_protocol_info_t info;
    memset(&info, 0, sizeof(info));
    char perr[400] = "";
    pdgw_status_t st = fn(ctx, cfg, &info, perr, sizeof(perr));
    if (st != PDGW_OK) {
        if (perr[0] == '\0')
            snprintf(perr, sizeof(perr), "unknown protocol \"%s\"", cfg->protocol);
        return pdgw_cfg_fail(src, "protocol", "%s", perr);
    }
    if (cfg->scheduling == PDGW_SCHED_STAGED && !info.supports_staged)
        return pdgw_cfg_fail(src, "scheduling", "protocol %s does not support staged scheduling",
                             cfg->protocol);
    if (cfg->scheduling == PDGW_SCHED_BATCH && !info.supports_batch)
        return pdgw_cfg_fail(src, "scheduling", "protocol %s does not support batch scheduling",
                             cfg->protocol);
    bool dyn_prefill = cfg->dns.prefill[0] || cfg->k8s.prefill_selector[0];
    bool dyn_decode = cfg->dns.decode[0] || cfg->k8s.decode_selector[0];
    bool dyn_both = cfg->dns.both[0] || cfg->k8s.both_selector[0];
    if (info.needs_both && n->both == 0 && !dyn_both)
        return pdgw_cfg_fail(src, "instances",
                             "protocol %s forwards each request to one instance that serves both "
                             "roles: add --both URL, an instance with role: both, or "
                             "discovery.*.both",
                             cfg->protocol);
    bool have_p = n->prefill + n->both > 0 || dyn_prefill || dyn_both;
    bool have_d = n->decode + n->both > 0 || dyn_decode || dyn_both;
    if (!info.needs_prefill && info.needs_decode && !have_d)
        return pdgw_cfg_fail(src, "instances",
                             "protocol %s forwards each request to one decode-capable instance, "
                             "but no decode or both instance is configured (add --decode URL, "
                             "--both URL, or discovery)",
                             cfg->protocol);
    if ((info.needs_prefill && !have_p) || (info.needs_decode && !have_d))
        return pdgw_cfg_fail(src, "instances",
                             "protocol %s needs prefill and decode instances, but no %s instance "
                             "is configured (add --%s URL, instances with role: %s, or "
                             "discovery)",
                             cfg->protocol, !have_p ? "prefill" : "decode",
                             !have_p ? "prefill" : "decode", !have_p ? "prefill" : "decode");
    return PDGW_OK;
}

pdgw_status_t pdgw_config_check(const pdgw_config_t *cfg, const pdgw_config_hooks_t *hooks,
                                pdgw_config_error_t *err)
{
    pdgw_cfg_src_t src = {.err = err};
    role_counts_t n = {0, 0, 0};
    pdgw_status_t st;

    if ((st = check_instances(cfg, &src, &n)) != PDGW_OK ||
        (st = check_keys_and_files(cfg, &src)) != PDGW_OK ||
        (st = check_admission(cfg, &src)) != PDGW_OK || (st = check_slo(cfg, &src)) != PDGW_OK)
        return st;
    if (cfg->health_timeout_ms > cfg->health_interval_ms)
        return pdgw_cfg_fail(&src, "health_timeout", "must not exceed health_interval");
    if (cfg->k8s.api_server[0] != '\0') {
        pdgw_url_t u;
        if (pdgw_url_parse(cfg->k8s.api_server, &u) != PDGW_OK)
            return pdgw_cfg_fail(&src, "discovery.kubernetes.api_server",
                                 "expected an http(s):// URL, got \"%s\"", cfg->k8s.api_server);
    }
    if (cfg->protocol[0] == '\0')
        return pdgw_cfg_fail(&src, "protocol", "must not be empty");

    return check_protocol(cfg, hooks, &src, &n);
}
