/*
 * pdgw forwarder API.
 *
 * A forwarder teaches the gateway one prefill/decode (PD) protocol. It is a
 * `const` ops table plus a separate descriptor, registered from the bottom of
 * its own file with PDGW_FORWARDER_REGISTER(). The gateway's workflow engine
 * runs the stages (instance selection, HTTP legs, SSE relay, retries,
 * deadlines, cancellation); a forwarder only:
 *   - parses its `protocol_options`                       (configure)
 *   - says which dispatch pattern it uses for a mode        (plan)
 *   - keeps per-attempt state                               (attempt_init / attempt_cleanup)
 *   - builds each leg's JSON body                           (build_leg)
 *   - reads the prefill response                            (on_prefill_response)
 *   - optionally gates a stage on an external event         (gate)
 *   - optionally narrows what a retry may re-pick           (retry_scope)
 * Forwarders never see the HTTP server's internals. See forwarders/README.md
 * for the request lifecycle and a worked example.
 *
 * Threading: every op of one request runs on the worker thread that owns the
 * request. `configure`/`destroy` run on the main thread at start-up and exit.
 * Only pdgw_fwd_waker_wake() and pdgw_fwd_waker_unref() may be called from
 * other threads.
 */
#ifndef PDGW_FORWARDER_H
#define PDGW_FORWARDER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on every change of the descriptor or ops layout. A plugin built against a
 * version outside [PDGW_FWD_ABI_MIN_VERSION, PDGW_FWD_ABI_VERSION] is refused at load time
 * with a clear error; older accepted versions lack only trailing descriptor fields, which
 * then take their defaults.
 *   1: the first layout.
 *   2: pdgw_fwd_desc_t.client_fields (default: NULL, none).
 *   3: pdgw_fwd_desc_t.native_paths (default: NULL, none); the ops rewrite_decode and
 *      check_instance (an older plugin's table, which ends before them, is completed with
 *      NULL).
 *   4: pdgw_fwd_desc_t.struct_size / ops_size (sizeof both tables as the plugin saw them:
 *      from now on the gateway completes a shorter table with defaults, so adding a field
 *      or an op needs no new version), ctx_size + options (an option table the gateway
 *      parses into a context it allocates: no configure/destroy needed) and state_size
 *      (a zeroed per-attempt state from the attempt arena: no attempt_init needed). Fill
 *      the four size/version fields with PDGW_FWD_DESC_HEADER. */
#define PDGW_FWD_ABI_VERSION     4
#define PDGW_FWD_ABI_MIN_VERSION 1

/* Result of every forwarder op. */
typedef enum {
    PDGW_FWD_OK = 0,
    PDGW_FWD_PENDING = 1,    /* gate: not yet; wake me through the waker */
    PDGW_FWD_ERR = -1,       /* failure; details in the pdgw_fwd_error_t */
    PDGW_FWD_ERR_CONFIG = -2 /* configure/plan: bad options or unsupported mode */
} pdgw_fwd_status_t;

/* Workflow modes (bit flags in the descriptor). */
typedef enum {
    PDGW_MODE_BATCH = 1u << 0, /* prefill and decode picked and booked before any send */
    PDGW_MODE_STAGED = 1u << 1 /* prefill first; decode picked when prefill completes */
} pdgw_mode_t;

/* Dispatch patterns (bit flags in the descriptor). */
typedef enum {
    PDGW_DISPATCH_SINGLE = 1u << 0,  /* one leg (decode/both); it drives any remote prefill */
    PDGW_DISPATCH_SERIAL = 1u << 1,  /* prefill leg, then decode leg with what prefill returned */
    PDGW_DISPATCH_PARALLEL = 1u << 2 /* both legs at once; only decode is relayed */
} pdgw_dispatch_t;

typedef enum {
    PDGW_FWD_ROLE_PREFILL = 0,
    PDGW_FWD_ROLE_DECODE = 1,
    PDGW_FWD_ROLE_BOTH = 2
} pdgw_fwd_role_t;

/* The leg a build_leg call is for. */
typedef enum { PDGW_LEG_PREFILL = 0, PDGW_LEG_DECODE = 1 } pdgw_leg_kind_t;

/* Where a failure happened (access log, metrics, retry decision). */
typedef enum {
    PDGW_PHASE_NONE = 0,
    PDGW_PHASE_PREFILL,
    PDGW_PHASE_KV_TRANSFER,
    PDGW_PHASE_DECODE
} pdgw_phase_t;

/* Gate points: where the engine asks the forwarder's gate op for permission. */
typedef enum {
    PDGW_GATE_BEFORE_PREFILL = 0, /* after instances are booked, before the first leg */
    PDGW_GATE_BEFORE_DECODE = 1   /* serial: after on_prefill_response, before the decode leg */
} pdgw_gate_point_t;

/* Which sides a retry re-picks (bit flags, returned by retry_scope). */
enum { PDGW_REPICK_NONE = 0, PDGW_REPICK_PREFILL = 1u << 0, PDGW_REPICK_DECODE = 1u << 1 };

/* Why an attempt ends (attempt_cleanup). */
typedef enum {
    PDGW_END_OK = 0,    /* the response was relayed completely */
    PDGW_END_FAILED,    /* a leg or op failed; the client got an error */
    PDGW_END_RETRY,     /* failed; another attempt follows */
    PDGW_END_CANCELLED, /* client went away or the gateway is shutting down */
    PDGW_END_TIMEOUT    /* a deadline passed */
} pdgw_end_reason_t;

/* pdgw_instance_t.kv_engine */
enum { PDGW_KV_ENGINE_UPSTREAM = 0, PDGW_KV_ENGINE_LIBKVT = 1 };

/*
 * One instance, as chosen by the scheduler. Read-only for forwarders and valid
 * for the whole attempt. Strings are never NULL (empty when unset).
 */
typedef struct pdgw_instance {
    const char *id;
    const char *url;  /* base URL, e.g. "http://10.0.0.5:8100" */
    const char *host; /* host part of url */
    int port;         /* port part of url */
    pdgw_fwd_role_t role;
    const char *zone;
    const char *kv_host; /* KV side-channel host (defaults to host) */
    int kv_port;         /* vllm-kvt side channel */
    int bootstrap_port;  /* sglang / mooncake bootstrap */
    const char *engine_id;
    const int *alloc_ports; /* lmcache receiver alloc port per TP rank */
    size_t n_alloc_ports;
    const int *init_ports; /* lmcache receiver init port per TP rank */
    size_t n_init_ports;
    int tp_size;
    int dp_rank;
    int dp_size;
    int weight;
    /* The instance's KV engine: only a PDGW_KV_ENGINE_LIBKVT peer may be sent pdgw's
     * extensions of the LMCache control messages (ReserveRequest, delimiter-less frames). */
    int kv_engine;
    /* The instance's protocol attributes (config `attrs:`), opaque to the scheduler: read
     * them with pdgw_fwd_instance_attr(). Gateway-owned text; may be NULL in views built by
     * an older gateway. */
    const char *attrs;
} pdgw_instance_t;

/* Thread-safe handle that re-runs a pending gate. */
typedef struct pdgw_fwd_waker pdgw_fwd_waker_t;

/* Everything the forwarder may read about the request. Valid for the attempt. */
typedef struct pdgw_fwd_request {
    /* Minted by the gateway for each attempt (a uuid4: 122 random bits) and sent as
     * X-Request-Id on every leg of the attempt. Name every KV transfer after it
     * (transfer_id, disagg_spec.req_id, reservations): it is unique and unguessable. */
    const char *request_id;
    const char *path;   /* "/v1/completions", "/v1/chat/completions" or a native path */
    const json_t *body; /* the client's parsed body (borrowed, read-only) */
    int stream;         /* client asked for stream: true */
    int is_chat;        /* chat completions */
    pdgw_mode_t mode;   /* configured scheduling mode */
    pdgw_dispatch_t dispatch;
    unsigned attempt;        /* 0 for the first attempt, 1.. for retries */
    int64_t deadline_ms;     /* absolute CLOCK_MONOTONIC ms when the request expires */
    pdgw_fwd_waker_t *waker; /* borrowed; take a ref to keep it beyond the attempt */
    const char *model;       /* the body's "model" */
    int64_t prompt_tokens;   /* estimate: token ids counted, else ceil(prompt bytes / 4) */
    int64_t max_tokens;      /* max_completion_tokens, else max_tokens; -1 when absent */
    /* The client's X-Request-Id (or the one pdgw minted for a client that sent none):
     * for logs and messages only; never a transfer name, since clients may repeat it. */
    const char *client_request_id;
    /* The gateway's per-attempt arena (pdgw_fwd_alloc, pdgw_fwd_keep); opaque. */
    struct pdgw_fwd_arena *arena;
} pdgw_fwd_request_t;

/* A text the gateway owns, written by rewrite_decode_text (pdgw_fwd_text_append ...). */
typedef struct pdgw_fwd_text pdgw_fwd_text_t;

/* The instances of this attempt. Members are NULL when not (yet) chosen:
 * in staged mode `decode` is NULL while building the prefill leg. */
typedef struct pdgw_fwd_peers {
    const pdgw_instance_t *prefill;
    const pdgw_instance_t *decode; /* the `both` instance for neutral single-stage */
} pdgw_fwd_peers_t;

/* Output of build_leg. The engine owns `body` after the call. */
#define PDGW_FWD_LEG_MAX_HEADERS 4
typedef struct pdgw_fwd_leg {
    /* New reference set by the forwarder; required unless client_body is set. */
    json_t *body;
    /* Non-zero (with body NULL): send the client's request bytes unchanged, without
     * re-encoding them (plain proxying). */
    int client_body;
    const char *path; /* NULL = the client's path */
    /* Extra request headers ("Name: value"), copied by the engine. */
    char headers[PDGW_FWD_LEG_MAX_HEADERS][256];
    size_t n_headers;
} pdgw_fwd_leg_t;

/* Failure details an op fills when it returns PDGW_FWD_ERR. */
typedef struct pdgw_fwd_error {
    pdgw_phase_t phase;
    int retryable;   /* a retry on other instances may succeed */
    int http_status; /* status for the client when no retry follows (0 = 502) */
    char message[256];
} pdgw_fwd_error_t;

/* Start-up result of plan(). */
typedef struct pdgw_fwd_plan {
    pdgw_dispatch_t dispatch;
    /* SINGLE only: the role of the one instance the request goes to
     * (PDGW_FWD_ROLE_BOTH for a plain proxy, PDGW_FWD_ROLE_DECODE for PD engines
     * that pull from a prefill themselves). Either way the scheduler books a
     * decode-capable instance (role decode or both); the field states intent. */
    pdgw_fwd_role_t single_role;
    /* SINGLE only: also pick and book a prefill instance, whose endpoints the
     * forwarder puts into the decode body. */
    int single_needs_prefill;
    /* Per-request timeout of a pending gate in ms (0 = the request deadline). */
    int64_t gate_timeout_ms;
} pdgw_fwd_plan_t;

/* Services the gateway offers to a forwarder in configure(). */
typedef struct pdgw_fwd_env {
    unsigned abi_version; /* PDGW_FWD_ABI_VERSION of the running gateway */
    const char *protocol; /* the configured protocol name */
    pdgw_mode_t mode;     /* configured scheduling mode */
    unsigned n_workers;   /* worker threads */
    /* Non-zero under `pdgw --check-config`: parse and check the options only; open no
     * socket and start no thread (destroy follows at once). */
    int check_only;
    /* The gateway's: where pdgw_fwd_kv_svc_open keeps the service it opens, so the server
     * stops it at shutdown, applies reloads to it and hands it its workers' socket events
     * (opaque; NULL: the forwarder alone holds the service). */
    struct pdgw_fwd_kv_svcs *kv_svcs;
} pdgw_fwd_env_t;

/*
 * The ops table. Only build_leg is required; every other op may be NULL and
 * then has the default written next to it.
 */
typedef struct pdgw_fwd_ops {
    /* Parse `options` (the config's protocol_options as a JSON object, borrowed,
     * never NULL; values that look like integers or true/false are JSON integers
     * and booleans, everything else a string)
     * and create the forwarder's global context. Called once at start-up,
     * after registration and config loading, before workers start. On error
     * write a message naming the bad key into err (size errlen).
     * Default: no context, options must be empty. */
    pdgw_fwd_status_t (*configure)(const json_t *options, const pdgw_fwd_env_t *env, void **ctx,
                                   char *err, size_t errlen);
    /* Free the global context at exit (after all requests ended). */
    void (*destroy)(void *ctx);

    /* Choose the dispatch pattern for `mode`, once at start-up. Return
     * PDGW_FWD_ERR_CONFIG with a message for an unsupported combination.
     * Default: the lowest dispatch bit of the descriptor, single_role BOTH. */
    pdgw_fwd_status_t (*plan)(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                              size_t errlen);

    /* Create per-attempt state (*state, may stay NULL). Called once per
     * attempt, after the instances of the first stage are chosen.
     * Default: no state. */
    pdgw_fwd_status_t (*attempt_init)(void *ctx, const pdgw_fwd_request_t *req,
                                      const pdgw_fwd_peers_t *peers, void **state,
                                      pdgw_fwd_error_t *err);

    /* Build one leg's body (REQUIRED), or set leg->client_body to pass the client's bytes
     * through unchanged. For SINGLE only the DECODE leg is built;
     * SERIAL builds PREFILL, then (after on_prefill_response and the
     * BEFORE_DECODE gate) DECODE; PARALLEL builds PREFILL then DECODE before
     * either is sent. The helpers pdgw_fwd_body_copy() and
     * pdgw_fwd_body_prefill() make the usual starting points. */
    pdgw_fwd_status_t (*build_leg)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                   pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                   pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err);

    /* The prefill leg completed with HTTP `status` and body `resp` (parsed
     * JSON, borrowed; NULL if the body was not JSON). SERIAL: before the decode
     * leg is built; copy what decode needs into the state. PARALLEL: when the
     * drained prefill ends; an error aborts the decode leg if the client has
     * not received a byte yet, else ends the stream with an error event.
     * Called only for 2xx prefill responses; other statuses fail the attempt
     * in the engine (phase prefill). Default: OK. */
    pdgw_fwd_status_t (*on_prefill_response)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                             long status, const json_t *resp,
                                             pdgw_fwd_error_t *err);

    /* Gate a stage on an external event. Return OK to proceed, PENDING to
     * wait: the engine calls gate again (same point) after
     * pdgw_fwd_waker_wake(req->waker), and fails the attempt with 504, phase
     * kv_transfer, when plan.gate_timeout_ms (or the request deadline)
     * passes. Default: always OK. */
    pdgw_fwd_status_t (*gate)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                              pdgw_gate_point_t point, pdgw_fwd_error_t *err);

    /* Which sides a retry re-picks after `failure` (retryable, before the first
     * byte reached the client). The failed instance is always excluded.
     * Return PDGW_REPICK_NONE to forbid the retry.
     * Default: the side whose phase failed (kv_transfer: both). */
    unsigned (*retry_scope)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                            const pdgw_fwd_error_t *failure);

    /* Called exactly once per attempt that ran attempt_init, whatever the
     * outcome, after every leg of the attempt has stopped: release
     * reservations, send cancel notices, free *state. */
    void (*attempt_cleanup)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                            pdgw_end_reason_t reason);

    /* Rewrite the decode leg's answer before the client sees it (optional; NULL = relay
     * unchanged). `resp` is the parsed JSON (borrowed) of one SSE data event (`sse` set;
     * [DONE] and non-JSON events are never passed) or of a 2xx non-stream answer. Return a new
     * reference: for an event, a JSON array of objects sent as events in its place (empty =
     * drop it); for a non-stream answer, the object sent instead. NULL = unchanged.
     * PARALLEL only: called with `resp` NULL (sse 0) when the decode's non-stream answer is
     * complete while the prefill still runs; a non-NULL return (released by the gateway)
     * holds the answer until the prefill's has reached on_prefill_response. */
    json_t *(*rewrite_decode)(void *ctx, void *state, const pdgw_fwd_request_t *req, int sse,
                              const json_t *resp);

    /* Whether `inst` carries what this protocol needs of an instance of its role (a
     * prefill's bootstrap port, a decode's receiver ports, ...). `pdgw --check-config`
     * calls it for every configured instance, after configure; on error write a message
     * naming the missing field into err (size errlen): every request through that instance
     * would fail. Default: every instance is usable. */
    pdgw_fwd_status_t (*check_instance)(void *ctx, const pdgw_instance_t *inst, char *err,
                                        size_t errlen);

    /* Whether rewrite_decode may change this attempt's decode answer (optional; default: it
     * may, and every answer and SSE event is parsed and offered to it). A forwarder that
     * rewrites only some requests (sglang: those asking for logprobs) answers 0 for the
     * others, and their answers are relayed without being parsed. Asked on the request's
     * worker, any number of times; the answer must not change during an attempt. */
    int (*rewrites_decode)(void *ctx, void *state, const pdgw_fwd_request_t *req);

    /* rewrite_decode done on the text (optional; tried first, for the same answers and
     * events): `text` is one SSE event's data (`sse` set) or a whole 2xx non-stream answer, as
     * the decode sent it. Return 1 with the replacement written into `out` (an event: the
     * events sent in its place, each written whole as "data: <json>\n\n", none = drop it; an
     * answer: the body sent instead), 0 to relay it unchanged, -1 when this one needs the parse
     * (`out` is then discarded and rewrite_decode gets the tree). A rewrite that changes a few
     * values of a long answer costs a copy of its bytes instead of a parse, a tree and a
     * serialisation (the pdgw_fwd_text_* and pdgw_fwd_json_* helpers below). */
    int (*rewrite_decode_text)(void *ctx, void *state, const pdgw_fwd_request_t *req, int sse,
                               const char *text, size_t len, pdgw_fwd_text_t *out);

    /* ABI 4, later op. The prefill's 2xx answer as the prefill sent it (optional; `text`
     * borrowed for the call), before on_prefill_response and with the same contract: for
     * what a tree costs too much to build (the prompt's token ids of a long answer:
     * pdgw_fwd_answer_ids_text and the pdgw_fwd_json_* helpers read them on the text). A
     * forwarder that reads everything here leaves on_prefill_response NULL, and the answer is
     * never parsed. */
    pdgw_fwd_status_t (*on_prefill_text)(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                         long status, const char *text, size_t len,
                                         pdgw_fwd_error_t *err);
} pdgw_fwd_ops_t;

/* ---- option tables (ABI 4) ----
 * Options declared beside the forwarder that reads them: one row per key of
 * protocol_options, naming the field of the forwarder's context struct it fills. The
 * gateway refuses unknown keys, applies defaults and checks types and ranges, and
 * `pdgw --help-protocol` can list them. */
typedef enum {
    PDGW_FWD_OPT_INT = 1, /* int64_t field; integer in [min, max] */
    PDGW_FWD_OPT_BOOL,    /* int field; true/false */
    PDGW_FWD_OPT_STR,     /* char[] field; non-empty string shorter than the array */
    PDGW_FWD_OPT_ENUM     /* int field; index of the string in choices */
} pdgw_fwd_opt_type_t;

typedef struct pdgw_fwd_option {
    const char *name; /* NULL ends the table */
    pdgw_fwd_opt_type_t type;
    size_t offset;              /* of the field in the context struct */
    size_t size;                /* of the field (STR: the array's capacity) */
    int64_t def, min, max;      /* INT: default and range; BOOL/ENUM: default (index) */
    const char *def_str;        /* STR: default ("" = none) */
    const char *const *choices; /* ENUM: NULL-terminated */
    const char *help;
} pdgw_fwd_option_t;

#define PDGW_FWD_OPT_INT(ctx_t, field, def_, min_, max_, help_)                                    \
    {                                                                                              \
#field, PDGW_FWD_OPT_INT, offsetof(ctx_t, field), sizeof(((ctx_t *)0)->field), (def_),     \
            (min_), (max_), NULL, NULL, (help_)                                                    \
    }
#define PDGW_FWD_OPT_BOOL(ctx_t, field, def_, help_)                                               \
    {                                                                                              \
#field, PDGW_FWD_OPT_BOOL, offsetof(ctx_t, field), sizeof(((ctx_t *)0)->field), (def_), 0, \
            1, NULL, NULL, (help_)                                                                 \
    }
#define PDGW_FWD_OPT_STR(ctx_t, field, def_, help_)                                                \
    {                                                                                              \
#field, PDGW_FWD_OPT_STR, offsetof(ctx_t, field), sizeof(((ctx_t *)0)->field), 0, 0, 0,    \
            (def_), NULL, (help_)                                                                  \
    }
#define PDGW_FWD_OPT_ENUM(ctx_t, field, choices_, def_, help_)                                     \
    {                                                                                              \
#field, PDGW_FWD_OPT_ENUM, offsetof(ctx_t, field), sizeof(((ctx_t *)0)->field), (def_), 0, \
            0, NULL, (choices_), (help_)                                                           \
    }
#define PDGW_FWD_OPT_END                                                                           \
    {                                                                                              \
        NULL, (pdgw_fwd_opt_type_t)0, 0, 0, 0, 0, 0, NULL, NULL, NULL                              \
    }

/* ---- instance attribute tables (ABI 4, later) ----
 * The `attrs:` a forwarder reads of its instances (pdgw_fwd_instance_attr), declared beside it
 * so that the gateway checks them where it checks instances (start-up, --check-config,
 * reloads): an attribute the protocol does not declare, or a value of the wrong type, is an
 * error naming the instance and the key instead of a setting silently ignored. */
typedef enum {
    PDGW_FWD_ATTR_INT = 1, /* an integer in [min, max] */
    PDGW_FWD_ATTR_STR      /* non-empty text */
} pdgw_fwd_attr_type_t;

typedef struct pdgw_fwd_attr {
    const char *name; /* NULL ends the table */
    pdgw_fwd_attr_type_t type;
    int64_t min, max; /* INT */
    const char *help;
} pdgw_fwd_attr_t;

#define PDGW_FWD_ATTR_INT(name_, min_, max_, help_)                                                \
    {                                                                                              \
        (name_), PDGW_FWD_ATTR_INT, (min_), (max_), (help_)                                        \
    }
#define PDGW_FWD_ATTR_STR(name_, help_)                                                            \
    {                                                                                              \
        (name_), PDGW_FWD_ATTR_STR, 0, 0, (help_)                                                  \
    }
#define PDGW_FWD_ATTR_END                                                                          \
    {                                                                                              \
        NULL, (pdgw_fwd_attr_type_t)0, 0, 0, NULL                                                  \
    }
/* The table of a protocol that reads no attributes. */
extern const pdgw_fwd_attr_t pdgw_fwd_attrs_none[];

/* Descriptor: what the forwarder is. `abi_version` MUST stay the first field. */
typedef struct pdgw_fwd_desc {
    unsigned abi_version; /* PDGW_FWD_ABI_VERSION at build time */
    const char *name;     /* protocol name used by --protocol */
    const char *summary;  /* one line for --help / logs */
    unsigned modes;       /* PDGW_MODE_* bits supported */
    unsigned dispatch;    /* PDGW_DISPATCH_* bits it may use */
    const pdgw_fwd_ops_t *ops;
    /* ABI 2. Top-level body fields this protocol's engines read as PD control (NULL-terminated;
     * a name ending in '*' is a prefix), beyond the gateway's own list (kv_transfer_params,
     * bootstrap_*, remote_*, DP ranks, ...; docs/protocols/client-fields.md). Clients may not
     * send them: the gateway refuses or strips them (config client_pd_fields) before
     * build_leg runs. NULL = none. */
    const char *const *client_fields;
    /* ABI 3. Engine-native inference paths this protocol serves besides the OpenAI ones
     * (NULL-terminated, e.g. "/generate" for SGLang). The gateway answers 404 on such a path
     * unless the configured protocol lists it; its body is then validated by the path's own
     * rules and the forwarder sees it in pdgw_fwd_request_t.path. NULL = none. */
    const char *const *native_paths;
    /* ABI 4. sizeof(pdgw_fwd_desc_t) and sizeof(pdgw_fwd_ops_t) as the plugin was built:
     * fields and ops beyond them take their defaults. Set by PDGW_FWD_DESC_HEADER. */
    size_t struct_size;
    size_t ops_size;
    /* ABI 4. With `options` (PDGW_FWD_OPT_END-terminated) and no configure op, the gateway
     * allocates a zeroed context of ctx_size bytes, fills it from protocol_options by the
     * table, and frees it at exit (no destroy op needed). */
    size_t ctx_size;
    const pdgw_fwd_option_t *options;
    /* ABI 4. Without an attempt_init op: the `state` of every op is a zeroed block of
     * state_size bytes from the attempt arena, released after attempt_cleanup. */
    size_t state_size;
    /* ABI 4, later field. The top-level members of the prefill's answer that
     * on_prefill_response reads (NULL-terminated, e.g. "kv_transfer_params"): its `resp` then
     * holds only those, and the rest of the answer is walked past, not parsed into a tree
     * (only its structure is checked). NULL = the whole answer. Without an
     * on_prefill_response op the answer is not parsed at all. */
    const char *const *prefill_answer_members;
    /* ABI 4, later field. Nonzero: no op of this forwarder reads pdgw_fwd_request_t.body (its
     * legs send the client's bytes as they came, pdgw_fwd_leg_t.client_body), so the gateway
     * may validate a request on its text and leave body NULL instead of parsing it into a
     * tree. 0 = body is always the parsed tree. */
    int body_unread;
    /* ABI 4, later field. The instance attributes this protocol reads (PDGW_FWD_ATTR_END-
     * terminated; pdgw_fwd_attrs_none for none): any other `attrs:` key of its instances is
     * refused. NULL = not declared: every attribute is accepted (plugins built before). */
    const pdgw_fwd_attr_t *instance_attrs;
} pdgw_fwd_desc_t;

/* The versioning fields of a descriptor, first in its designated initializer:
 *   static const pdgw_fwd_desc_t my_desc = { PDGW_FWD_DESC_HEADER, .name = "x", ... }; */
#define PDGW_FWD_DESC_HEADER                                                                       \
    .abi_version = PDGW_FWD_ABI_VERSION, .struct_size = sizeof(pdgw_fwd_desc_t),                   \
    .ops_size = sizeof(pdgw_fwd_ops_t)

/* Register a forwarder (normally through PDGW_FORWARDER_REGISTER). Does no
 * I/O: refusals (duplicate name, ABI mismatch, missing ops) are recorded and
 * reported when the gateway starts or the plugin loader returns.
 * Returns 0 on success, -1 when refused. */
int pdgw_fwd_register(const pdgw_fwd_desc_t *desc);

/* Self-registration: one line at the bottom of the forwarder's file. */
#define PDGW_FORWARDER_REGISTER(desc_)                                                             \
    __attribute__((constructor)) static void pdgw_fwd_register_##desc_(void)                       \
    {                                                                                              \
        (void)pdgw_fwd_register(&(desc_));                                                         \
    }

/* ---- helpers exported by the gateway for forwarders ---- */

/* A deep copy of the client body (new reference). */
json_t *pdgw_fwd_body_copy(const pdgw_fwd_request_t *req);

/* The hardened prefill body (new reference): a copy of the client body with
 * max_tokens 1 (max_completion_tokens 1 if present), stream false,
 * stream_options/min_tokens/min_completion_tokens removed, ignore_eos true,
 * stop/stop_token_ids removed. */
json_t *pdgw_fwd_body_prefill(const pdgw_fwd_request_t *req);

/* A new object whose members are the client body's own values, shared rather than copied
 * (new reference; NULL on no memory or a body that is not an object). Set or delete
 * members freely, but replace a member's value instead of editing it in place: the client
 * body and the other leg hold the same values. This is what keeps a long prompt in memory
 * once. */
json_t *pdgw_fwd_body_shared(const pdgw_fwd_request_t *req);
/* Hardens <b> (stolen) as pdgw_fwd_body_prefill does; returns it, or NULL (b released) when
 * it is not an object. */
json_t *pdgw_fwd_body_harden_prefill(json_t *b);

/* ---- SDK helpers (ABI 4): bodies, options, the attempt arena ---- */

/* The hardened prefill body (as pdgw_fwd_body_prefill, but sharing member values as
 * pdgw_fwd_body_shared) with kv_transfer_params = kvp (stolen; NULL = none). New reference;
 * NULL on no memory (kvp released). */
json_t *pdgw_fwd_body_prefill_kvp(const pdgw_fwd_request_t *req, json_t *kvp);
/* The client body (members shared as pdgw_fwd_body_shared) with kv_transfer_params = kvp
 * (stolen; NULL = as the client sent it). New reference; NULL on no memory or a body that is
 * not an object (kvp released). */
json_t *pdgw_fwd_body_decode_kvp(const pdgw_fwd_request_t *req, json_t *kvp);
/* A response's kv_transfer_params when it is a non-empty object (borrowed), else NULL. */
json_t *pdgw_fwd_resp_kvp(const json_t *resp);

/* Parse <options> into the struct <ctx> by <table> (PDGW_FWD_OPT_END-terminated): unknown
 * keys refused, defaults applied first. On error a message naming the key is in err. */
pdgw_fwd_status_t pdgw_fwd_options_parse(const pdgw_fwd_option_t *table, const json_t *options,
                                         void *ctx, char *err, size_t errlen);
/* The single-option building blocks (options absent from <options> take <def>). */
pdgw_fwd_status_t pdgw_fwd_opts_check(const json_t *options, const char *const *known, char *err,
                                      size_t errlen);
pdgw_fwd_status_t pdgw_fwd_opt_int(const json_t *options, const char *key, int64_t def, int64_t min,
                                   int64_t max, int64_t *out, char *err, size_t errlen);
pdgw_fwd_status_t pdgw_fwd_opt_bool(const json_t *options, const char *key, int def, int *out,
                                    char *err, size_t errlen);
pdgw_fwd_status_t pdgw_fwd_opt_enum(const json_t *options, const char *key,
                                    const char *const *choices, int def, int *out, char *err,
                                    size_t errlen);
pdgw_fwd_status_t pdgw_fwd_opt_str(const json_t *options, const char *key, const char *def,
                                   char *out, size_t cap, char *err, size_t errlen);

/* An attribute of <inst> as text into out (cap bytes): the instance's `attrs:` map, then the
 * built-in fields by their config names (kv_host, kv_port, bootstrap_port, engine_id,
 * alloc_ports and init_ports as "p1,p2,...", tp_size, dp_rank, dp_size, zone). Returns 1 when
 * found (a value that does not fit is cut), 0 when the instance has no such attribute. So a
 * new protocol's instance field needs no new field in the scheduler or this header. */
int pdgw_fwd_instance_attr(const pdgw_instance_t *inst, const char *name, char *out, size_t cap);
/* The same as an integer: <def> when absent or not an integer. */
int64_t pdgw_fwd_instance_attr_int(const pdgw_instance_t *inst, const char *name, int64_t def);

/* ---- the KV control client (libkvt's control plane, run by the gateway) ----
 * ReserveRequest and CancelNotif to a libkvt/LMCache receiver's alloc port, and the decoding
 * of ProxyNotif messages: the blocking building blocks of the KV control service below, which
 * is what a forwarder normally uses. reserve and cancel block for up to their timeout: never
 * call them from a request op. One client per thread. */
typedef struct pdgw_fwd_kv_client pdgw_fwd_kv_client_t;
pdgw_fwd_status_t pdgw_fwd_kv_client_create(pdgw_fwd_kv_client_t **out, char *err, size_t errlen);
void pdgw_fwd_kv_client_destroy(pdgw_fwd_kv_client_t *c);
/* ReserveRequest{req_id, chunks, ttl_ms} to host:port, waiting up to timeout_ms for the
 * answer: OK with *granted and *free_chunks (-1 = not reported), or ERR (message in err). */
pdgw_fwd_status_t pdgw_fwd_kv_reserve(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                      const char *req_id, int64_t chunks, int64_t ttl_ms,
                                      int timeout_ms, int *granted, int64_t *free_chunks, char *err,
                                      size_t errlen);
/* CancelNotif{req_id} to host:port (fire and forget). */
pdgw_fwd_status_t pdgw_fwd_kv_cancel(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                     const char *req_id, char *err, size_t errlen);
/* One ProxyNotif message (a msgpack frame): 1 with its req_id copied into req_id (cap bytes),
 * 0 when the frame is not a well-formed ProxyNotif with a req_id shorter than cap. */
int pdgw_fwd_kv_proxy_notif_decode(const void *data, size_t len, char *req_id, size_t cap);

/* ---- the KV control service (run by the gateway) ----
 * libkvt's control plane and LMCache's ProxyNotif side channel as a gateway service: a
 * forwarder opens one in configure (its options parsed by pdgw_fwd_kv_opts_parse) and drives
 * it per attempt from its request ops, which never block: a reservation, the weighted
 * admission and the wait for ProxyNotifs answer PENDING and wake the attempt's gate through
 * its waker. The gateway runs the service's thread and sockets, stops it when the server
 * shuts down (after the last attempt ended and its CancelNotifs went out) and counts what it
 * does (pdgw_fwd_*_total{protocol}, docs/protocols/lmcache.md). */
typedef enum {
    PDGW_FWD_KV_REFUSAL_QUEUE = 0,
    PDGW_FWD_KV_REFUSAL_REPICK = 1
} pdgw_fwd_kv_refusal_t;

typedef struct pdgw_fwd_kv_opts {
    int reserve;            /* send ReserveRequest before prefill (batch) */
    int64_t chunk_tokens;   /* tokens per KV chunk */
    int64_t reserve_ttl_ms; /* ReserveRequest.ttl_ms */
    int64_t reserve_timeout_ms;
    int64_t reserve_retry_ms; /* queue: ask again after this */
    pdgw_fwd_kv_refusal_t on_refusal;
    int proxy; /* bind the ProxyNotif PULL (the notif options below apply) */
    char proxy_host[128];
    int64_t proxy_port;
    int64_t notif_timeout_ms;
    int64_t admission_chunks;    /* weighted admission capacity; 0 = off */
    int notif_check_peer;        /* accept a ProxyNotif only from the request's prefill addresses */
    int notif_fallback_decode;   /* at the deadline send the decode anyway (it recomputes) */
    int skip_proxy_notification; /* engines run with pd_skip_proxy_notification: no wait */
    char curve_secret_key_file[256]; /* "" = plain TCP */
    char curve_client_keys_file[256];
    char notif_relay_peers[512]; /* replicas of this gateway: "host:port, ..." ("" = none) */
    int64_t notif_relay_port;    /* where the peers' notices come in */
} pdgw_fwd_kv_opts_t;

/* The protocol_options keys pdgw_fwd_kv_opts_parse reads (for pdgw_fwd_opts_check): the
 * reservation's, and with notif the ProxyNotif listener's. */
#define PDGW_FWD_KV_OPT_KEYS                                                                       \
    "reserve", "chunk_tokens", "reserve_ttl_ms", "reserve_timeout_ms", "reserve_retry_ms",         \
        "reserve_on_refusal"
#define PDGW_FWD_KV_NOTIF_OPT_KEYS                                                                 \
    "proxy_host", "proxy_port", "notif_timeout_ms", "admission_chunks", "notif_check_peer",        \
        "notif_fallback", "skip_proxy_notification", "notif_curve_secret_key_file",                \
        "notif_curve_client_keys_file", "notif_relay_peers", "notif_relay_port"
/* Parse them into <o> (defaults for absent keys; o->proxy = notif). proxy_host defaults to the
 * pod's address ($POD_IP), else the address of the host's name, else 127.0.0.1. */
pdgw_fwd_status_t pdgw_fwd_kv_opts_parse(const json_t *options, int reserve_default, int notif,
                                         pdgw_fwd_kv_opts_t *o, char *err, size_t errlen);

typedef struct pdgw_fwd_kv_svc pdgw_fwd_kv_svc_t;   /* one per forwarder */
typedef struct pdgw_fwd_kv_req pdgw_fwd_kv_req_t;   /* one per attempt */
typedef struct pdgw_fwd_kv_svcs pdgw_fwd_kv_svcs_t; /* the services a server owns */

/* Start the service for env->protocol (binds the ProxyNotif PULL, and the relay, when
 * o->proxy), kept in env->kv_svcs. Call from configure with the <env> it was given (never
 * under check_only); close from destroy. */
pdgw_fwd_status_t pdgw_fwd_kv_svc_open_env(const pdgw_fwd_env_t *env, const pdgw_fwd_kv_opts_t *o,
                                           pdgw_fwd_kv_svc_t **out, char *err, size_t errlen);
/* The same for a plugin built before the env form (ABI 4 as first published): a service of
 * its own that the server does not own (shutdown and reloads do not reach it; its thread
 * watches the reservation sockets itself). */
pdgw_fwd_status_t pdgw_fwd_kv_svc_open(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                       pdgw_fwd_kv_svc_t **out, char *err, size_t errlen);
void pdgw_fwd_kv_svc_close(pdgw_fwd_kv_svc_t *svc);
/* The bound ProxyNotif port (0 when none). */
int pdgw_fwd_kv_svc_notif_port(const pdgw_fwd_kv_svc_t *svc);

/* Per attempt (attempt_init). <kv_req_id> names the transfer (disagg_spec.req_id, the
 * reservation): normally req->request_id. NULL on no memory. */
pdgw_fwd_kv_req_t *pdgw_fwd_kv_req_new(pdgw_fwd_kv_svc_t *svc, const pdgw_fwd_request_t *req,
                                       const char *kv_req_id);
const char *pdgw_fwd_kv_req_id(const pdgw_fwd_kv_req_t *q);
/* Gate BEFORE_PREFILL: weighted admission (admission_chunks), then ReserveRequest on every
 * alloc port of <decode> (option reserve, batch mode, a decode with alloc ports). OK, PENDING
 * (woken when it may go on) or ERR: 400 a prompt larger than the admission capacity, 503 a
 * refused reservation (retryable; pdgw_fwd_kv_req_refused tells it apart). */
pdgw_fwd_status_t pdgw_fwd_kv_req_before_prefill(pdgw_fwd_kv_req_t *q,
                                                 const pdgw_fwd_request_t *req,
                                                 const pdgw_instance_t *decode,
                                                 pdgw_fwd_error_t *err);
/* Before the prefill leg: from now on <need> ProxyNotif{kv_req_id} count, and (option
 * notif_check_peer) only from <prefill>'s host or kv_host, at most once per TP rank. */
void pdgw_fwd_kv_req_expect_notifs(pdgw_fwd_kv_req_t *q, int need, const pdgw_instance_t *prefill);
/* Gate BEFORE_DECODE: OK once <need> notices arrived (at once with skip_proxy_notification),
 * else PENDING. At notif_timeout_ms: ERR 504 kv_transfer, or OK with notif_fallback decode. */
pdgw_fwd_status_t pdgw_fwd_kv_req_wait_notifs(pdgw_fwd_kv_req_t *q, const pdgw_fwd_request_t *req,
                                              int need, pdgw_fwd_error_t *err);
/* Whether the last failure was a refused reservation (retry_scope: re-pick the decode). */
int pdgw_fwd_kv_req_refused(const pdgw_fwd_kv_req_t *q);
/* Remember the decode (its KV host and alloc ports) for the CancelNotif at the end. */
void pdgw_fwd_kv_req_set_decode(pdgw_fwd_kv_req_t *q, const pdgw_instance_t *decode);
/* attempt_cleanup: release admission; an attempt that did not complete (reason != OK) sends
 * CancelNotif{kv_req_id} to the remembered decode (pdgw_pd_cancel_notifs_total). Frees q;
 * NULL is a no-op. */
void pdgw_fwd_kv_req_end(pdgw_fwd_kv_req_t *q, pdgw_end_reason_t reason);

/* The attempt arena: memory that lives until the attempt ends (after attempt_cleanup), so
 * per-attempt data needs no free. pdgw_fwd_alloc returns zeroed memory (NULL on no memory);
 * pdgw_fwd_strdup a copy of s; pdgw_fwd_keep holds the reference <v> (stolen) until then and
 * returns it (NULL stays NULL; on no memory v is released at once and NULL returned). */
void *pdgw_fwd_alloc(const pdgw_fwd_request_t *req, size_t size);
char *pdgw_fwd_strdup(const pdgw_fwd_request_t *req, const char *s);
json_t *pdgw_fwd_keep(const pdgw_fwd_request_t *req, json_t *v);

/* Fill an error: pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502, "...%s", x). */
void pdgw_fwd_error_set(pdgw_fwd_error_t *err, pdgw_phase_t phase, int retryable, int http_status,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Waker: re-run a pending gate. wake() may be called from any thread, any
 * number of times, also after the request ended (then it does nothing).
 * Keep it past the attempt with ref(); every ref() needs one unref(). */
void pdgw_fwd_waker_wake(pdgw_fwd_waker_t *w);
pdgw_fwd_waker_t *pdgw_fwd_waker_ref(pdgw_fwd_waker_t *w);
void pdgw_fwd_waker_unref(pdgw_fwd_waker_t *w);

/* A call of the forwarder's own to an instance (e.g. LMCache's proxy asks POST /tokenize
 * before the prefill), on the request's worker with the gateway's upstream client: no thread
 * of the forwarder's and no hand-over between threads. Start it from a request op (gate,
 * attempt_init); when it ends the request's waker runs the pending gate again. <inst> must
 * outlive the call (a peer of the attempt does); <body> is stolen. NULL when it cannot start
 * (no memory, no socket). Release it (running or not) from a request op, at the latest in
 * attempt_cleanup. */
typedef struct pdgw_fwd_call pdgw_fwd_call_t;
pdgw_fwd_call_t *pdgw_fwd_call_post(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                    const char *path, json_t *body, int64_t timeout_ms);
/* ABI 4, later function. GET <path> of a service the instance runs beside its API, on its
 * host at <port> over plain HTTP (a Mooncake prefill's bootstrap server); otherwise as
 * pdgw_fwd_call_post. NULL also when the host, port or path is not usable. */
pdgw_fwd_call_t *pdgw_fwd_call_get_port(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                        int port, const char *path, int64_t timeout_ms);
/* 0 running; 1 answered (*status, the body in *data / *len, borrowed until the release);
 * -1 failed (transport error or timeout; msg says why). */
int pdgw_fwd_call_result(const pdgw_fwd_call_t *c, long *status, const char **data, size_t *len,
                         char *msg, size_t cap);
void pdgw_fwd_call_release(pdgw_fwd_call_t *c);
/* The token ids under the top-level member <name> of a JSON answer (a /tokenize answer's
 * "tokens"), read without a general parse (a prompt of thousands of tokens costs a fraction of
 * one): a new array of non-negative integers. NULL when the member is missing or is anything
 * else: parse the answer then, to say why. */
json_t *pdgw_fwd_answer_ids(const char *answer, size_t len, const char *name);
/* Token ids kept as their JSON text: a prompt of thousands of ids is one value, not thousands
 * of integers each allocated, written and freed once per leg. Set one as a top-level member of
 * a leg body (json_object_set) and the gateway writes its text there; anywhere else it is an
 * opaque jansson string (nested values are written as strings: do not nest it).
 * pdgw_fwd_answer_ids_text: the ids under <name> of a JSON answer, as pdgw_fwd_answer_ids
 *   reads them (NULL when it would return NULL); *count gets how many.
 * pdgw_fwd_ids_text_from: the ids of a jansson array of non-negative integers (a client's
 *   prompt of ids); NULL when it is anything else. *count as above.
 * pdgw_fwd_ids_text_append: a new value, <ids> (one of the above) followed by <id> >= 0.
 * NULL also on no memory. */
json_t *pdgw_fwd_answer_ids_text(const char *answer, size_t len, const char *name, size_t *count);
/* The body of an engine's POST /tokenize (vLLM's) for the client's request, so the ids are the
 * ones the request itself runs on: chat: its messages and every chat-template option it set
 * (tools, chat_template_kwargs, add_generation_prompt, ...); completions: <prompt> (one text)
 * and add_special_tokens when set; the request's model. NULL when there is no such prompt. */
json_t *pdgw_fwd_tokenize_body(const pdgw_fwd_request_t *req, const json_t *prompt);
json_t *pdgw_fwd_ids_text_from(const json_t *array, size_t *count);
json_t *pdgw_fwd_ids_text_append(const json_t *ids, json_int_t id);
/* ABI 4, later function. The request's prompt ids the gateway already holds: from the model's
 * own tokenizer (config `tokenizers`) or from its tokenize cache (an engine's answer to the
 * same /tokenize body), as ids text; *count gets how many. They are the ids of the body
 * pdgw_fwd_tokenize_body builds for the request. NULL when it holds none (no tokenizer of the
 * model's, a prompt that is not one text, a field only the engine applies): ask the engine. */
json_t *pdgw_fwd_prompt_ids_text(const pdgw_fwd_request_t *req, size_t *count);

/* Answers rewritten on their text (rewrite_decode_text). The output buffer is the gateway's;
 * each append returns 0, or -1 on no memory (or, escaped, text that is not UTF-8).
 * pdgw_fwd_text_append_escaped: <s> as the inside of a JSON string (no quotes), escaped as
 *   the gateway escapes every string it writes.
 * pdgw_fwd_text_append_json: <v> serialised compactly.
 * pdgw_fwd_json_member: the bytes of the member <name> of the object at <text> (the last one
 *   when a name repeats, as a parser keeps it): 1 found, 0 none, -1 when the text is not one
 *   object or a name in it is written with escapes (then parse). Only bounds are checked: use
 *   it on text a parser would accept, such as an engine's answer.
 * pdgw_fwd_json_members: several members in one walk of <text>: for each name of the
 *   NULL-terminated <names>, vals[i] / val_lens[i] (vals[i] NULL when there is none); 0, or
 *   -1 as above.
 * pdgw_fwd_json_first: the first element of the array at <text>: 1, 0 when it is empty, -1
 *   when it is not an array.
 * pdgw_fwd_json_int: the integer at <text> (-?digits, no fraction or exponent, within
 *   int64): 1 with *v, else 0. */
int pdgw_fwd_text_append(pdgw_fwd_text_t *t, const char *s, size_t n);
int pdgw_fwd_text_append_escaped(pdgw_fwd_text_t *t, const char *s, size_t n);
int pdgw_fwd_text_append_json(pdgw_fwd_text_t *t, const json_t *v);
int pdgw_fwd_json_member(const char *text, size_t len, const char *name, const char **val,
                         size_t *val_len);
int pdgw_fwd_json_members(const char *text, size_t len, const char *const *names, const char **vals,
                          size_t *val_lens);
int pdgw_fwd_json_first(const char *text, size_t len, const char **val, size_t *val_len);
int pdgw_fwd_json_int(const char *text, size_t len, int64_t *v);

/* Logging and a forwarder-specific counter (exposed on /metrics as
 * pdgw_fwd_<name>_total{protocol="..."}); both thread-safe. */
typedef enum {
    PDGW_FWD_LOG_DEBUG,
    PDGW_FWD_LOG_INFO,
    PDGW_FWD_LOG_WARN,
    PDGW_FWD_LOG_ERROR
} pdgw_fwd_log_level_t;
void pdgw_fwd_log(pdgw_fwd_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void pdgw_fwd_counter_inc(const char *protocol, const char *name, const char *help);
/* The same with a second label, reason="<reason>" (pdgw_fwd_<name>_total{protocol,reason}). */
void pdgw_fwd_counter_inc_reason(const char *protocol, const char *name, const char *help,
                                 const char *reason);

/* PD bookkeeping (thread-safe):
 *  - the prefill answered without the KV parameters decode needs
 *    (pdgw_prefill_missing_kv_params_total{protocol});
 *  - a KV cancel notice was sent (pdgw_pd_cancel_notifs_total{protocol});
 *  - a decode instance reported its free KV chunks (e.g. ReserveResponse.free_chunks): the
 *    scheduler avoids instances whose last report said they are full. */
void pdgw_fwd_prefill_missing_kv_params(const char *protocol);
void pdgw_fwd_cancel_notif_sent(const char *protocol);
void pdgw_fwd_instance_set_kv_free_chunks(const pdgw_instance_t *inst, int64_t free_chunks);

/* The gateway's clocks in milliseconds: monotonic (deadlines, TTLs; the clock of
 * pdgw_fwd_request_t.deadline_ms) and wall-clock (timestamps other hosts send). */
int64_t pdgw_fwd_now_ms(void);
int64_t pdgw_fwd_wall_ms(void);

/* Names for logs. */
const char *pdgw_phase_name(pdgw_phase_t phase);
const char *pdgw_fwd_role_name(pdgw_fwd_role_t role);
const char *pdgw_fwd_strerror(pdgw_fwd_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* PDGW_FORWARDER_H */
