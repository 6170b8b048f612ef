/*
 * pdgw-sim internals: configuration, the request object shared by the HTTP
 * front end and the engine thread, and the module entry points.
 *
 * Threads: one libmicrohttpd thread (epoll, suspended connections), one
 * engine thread (admission, timing, token emission) and, for PD roles, the
 * KV threads of sim_kv.c. All engine-visible request state is guarded by the
 * engine lock (sim_engine_lock()).
 */
#ifndef PDGW_SIM_INT_H
#define PDGW_SIM_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

struct MHD_Connection;

typedef enum {
    SIM_ROLE_BOTH = 0,
    SIM_ROLE_PREFILL,
    SIM_ROLE_DECODE,
} sim_role_t;

typedef enum {
    SIM_KV_MODE_AUTO = 0, /* the protocol's natural mode */
    SIM_KV_MODE_PUSH,
    SIM_KV_MODE_PULL_EAGER,
    SIM_KV_MODE_PULL_DELAY,
} sim_kv_mode_t;

#define SIM_MAX_TP     8
#define SIM_MAX_SERVED 8

typedef struct sim_config {
    sim_role_t role;
    char host[64];
    int port;
    char model[128];
    double ttft_ms;              /* base time to first token */
    double tpot_ms;              /* time per output token */
    double prefill_ms_per_token; /* extra TTFT per uncached prompt token */
    int max_tokens_default;
    int max_model_len;
    int zero_delay;
    int emit_timestamps;
    int prompt_tokens_details; /* --enable-prompt-tokens-details */
    int max_batch;
    /* The step model (sim_engine.c): vLLM's --max-num-batched-tokens (tokens one engine step
     * computes), the cost of a decoding sequence and of 1000 KV tokens it attends in a step,
     * speed factors (< 1 slower) and --timing per-request (each request its own clock). */
    int max_num_batched_tokens;
    double step_ms_per_seq;    /* < 0: --tpot-ms / 100 */
    double step_ms_per_ktoken; /* 0: context length costs nothing */
    double speed, prefill_speed, decode_speed;
    int timing_per_request;
    int block_size;
    int kv_bytes_per_token;
    int kv_capacity_tokens;
    int eos_period; /* 0 = never EOS */
    int no_prefix_cache;
    /* CPU offload tier (sim_cpu_tier.c): vLLM's --kv-offloading-size in GiB, or an exact
     * block count; 0 = off. A token loaded from it costs load_cost x prefill_ms_per_token. */
    double kv_offloading_size_gib;
    int kv_offloading_blocks;
    double kv_offloading_load_cost;
    int record_capacity;
    int record_tokenize;     /* /tokenize and /detokenize calls are recorded too */
    int no_return_token_ids; /* return_token_ids ignored (a vLLM from before the field) */
    int kv_buffer_mb;        /* libkvt buffer per engine */
    double kv_link_gbps;     /* link model for KV pushes/pulls; 0 = none */
    /* KV side channels */
    char kv_host[64]; /* advertised host of this instance's KV endpoints */
    int kv_port;
    int bootstrap_port;
    int dp_size;          /* data-parallel ranks behind this instance (bootstrap /query) */
    int dp_size_set;      /* --dp-size given: X-data-parallel-rank is checked and used */
    int mooncake_prefill; /* --kv-connector mooncake: vLLM MooncakeConnector prefill rules */
    int alloc_ports[SIM_MAX_TP];
    int n_alloc_ports;
    int init_ports[SIM_MAX_TP];
    int n_init_ports;
    char engine_id[64];
    char proxy_host[64];
    int proxy_port;
    sim_kv_mode_t kv_mode;
    int layers;
    int layerwise;
    int kv_hold_timeout_ms;
    int nixl_older;         /* NIXL prefill answers in the older vLLM shape (flat block ids) */
    int nixl_stop_drops;    /* a NIXL prefill that stopped (EOS, stop string) returns no
                               kv_transfer_params and frees its KV (vLLM before
                               FINISHED_STOPPED was accepted); -1 = as --nixl-shape */
    int lmcache_chunk_size; /* LMCache's chunk_size: tokens per LMCache KV chunk */
    int lmcache_ascend;     /* this instance's LMCache receivers answer as LMCache-Ascend */
    int kv_wait_timeout_ms; /* decode: deadline for remote KV */
    int kv_alloc_ttl_ms;    /* libkvt receivers: unclaimed allocations freed after (0 = never) */
    double kv_alloc_quota;  /* libkvt receivers: share of the pool one sender holds unclaimed */
    int skip_last_n_tokens; /* lmcache decode: KV looked up for prompt[:-n] */
    /* faults */
    double fail_rate;
    int fail_status;
    int fail_retry_after_s; /* Retry-After of injected faults (0 = none) */
    int fail_in_front;      /* injected faults come from a proxy in front: the engine never
                               sees the request (no KV-transfer cleanup) */
    int stall_after_tokens; /* -1 = off */
    int crash_after_ms;     /* -1 = off */
    double kv_corrupt_rate;
    uint64_t fault_seed;
    /* KV events (sim_kv_events.c) */
    const char *kv_events_config; /* vLLM's --kv-events-config JSON, or NULL */
    const char *tokenizer;        /* --tokenizer: the model's tokenizer.json, or NULL */
    const char *kv_events_layout; /* "map" (current vLLM) or "array" (older) */
    /* vLLM's --served-model-name NAME [NAME ...]: the names requests may use; the first
     * is the one responses carry. None = the --model name. */
    char served[SIM_MAX_SERVED][128];
    int n_served;
} sim_config_t;

extern sim_config_t sim_cfg;

/* Is <name> one of the served model names? The name responses carry. (sim_config.c) */
int sim_model_served(const char *name);
const char *sim_model_name(void);

/* sim_bootstrap.c: the prefill's bootstrap server (HTTP on --bootstrap-port) */
extern int sim_side_port; /* the ZeroMQ side channel port, once bound (0 = none) */
int sim_bootstrap_start(void);
void sim_bootstrap_stop(void);
/* Engine id of DP rank <rank> now (new ids after every simulated restart). */
void sim_engine_id_of(int rank, char *out, size_t cap);
/* The DP rank whose current engine id is <eid>, or -1. */
int sim_engine_id_rank(const char *eid);
/* Simulate a restart: new engine ids. Returns the new generation. */
int sim_restart_bump(void);
/* Scale every phase by <f> from now on (times --speed; POST /sim/speed?factor=F). */
void sim_engine_set_live_speed(double f);
/* GET http://host:port<path>: the body (malloc'd) of a 200 answer, or NULL with err. */
char *sim_http_get(const char *host, int port, const char *path, int timeout_ms, char *err,
                   size_t errlen);

/* sim_config.c */
int sim_config_parse(int argc, char **argv, sim_config_t *cfg);
const char *sim_role_name(sim_role_t role);
const char *sim_kv_mode_name(sim_kv_mode_t mode);

/* ---- time ---- */
uint64_t sim_now_ns(void);  /* CLOCK_MONOTONIC */
uint64_t sim_wall_ns(void); /* CLOCK_REALTIME */

/* ---- deterministic tokenizer and output (sim_text.c) ---- */
typedef struct sim_tokens {
    uint32_t *ids;
    size_t n, cap;
    /* A prompt's cache_salt (vLLM's request field), folded into its first block's hash as
     * vllm/v1/core/kv_cache_utils.py does; owned, NULL when absent. */
    char *cache_salt;
} sim_tokens_t;

int sim_tokens_push(sim_tokens_t *t, uint32_t id);
void sim_tokens_free(sim_tokens_t *t);
/* Split text on whitespace and punctuation; append one id per piece. */
int sim_tokenize(const char *text, size_t len, sim_tokens_t *out);
/* Chat template: "<|role|>\n" content "\n" per message, then "<|assistant|>\n". */
char *sim_chat_template(json_t *messages);
/* The model's tokenizer (--tokenizer, sim_hf_tokenizer.c): load (-1 with <err>) and free. */
int sim_hf_tokenizer_load(const char *path, char *err, size_t errlen);
void sim_hf_tokenizer_free(void);
/* A completions prompt of text as the engine tokenizes it: the model's tokenizer when loaded
 * (add_special_tokens of <body>, true when absent), else the built-in one. */
int sim_tokenize_text(const json_t *body, const char *text, size_t len, sim_tokens_t *out);
/* A chat request (<body>: messages, tools, add_generation_prompt, chat_template_kwargs)
 * through the chat template, then tokenized; -1 with <err> (a template that raises). */
int sim_tokenize_chat(const json_t *body, sim_tokens_t *out, char *err, size_t errlen);

typedef struct sim_sampling {
    int64_t seed;
    int has_seed;
    double temperature;
    int ignore_eos;
    int min_tokens;
    int max_tokens;
    char **stop;
    size_t n_stop;
} sim_sampling_t;

/* The planned output of a request. text holds the visible text; off[i] is
 * where the piece revealed with token i starts (off[n] = strlen(text)). */
typedef struct sim_output {
    char *text;
    size_t *off;
    uint32_t *ids;             /* token id of each completion token */
    size_t n;                  /* completion tokens (incl. an EOS token) */
    const char *finish_reason; /* "length" | "stop" */
    char *stop_reason;         /* matched stop string or NULL */
} sim_output_t;

uint64_t sim_prompt_hash(const sim_tokens_t *prompt);
/* The token id the tokenizer gives an output word, and back (NULL: not an output word). */
#define SIM_EOS_TOKEN_ID 2u
uint32_t sim_word_id(const char *w);
/* POST /tokenize or /detokenize (vLLM): the JSON answer (caller frees), or NULL with *status and
 * *msg (caller frees) set. */
char *sim_tokenize_handle(const char *path, const char *body, size_t len, int *status, char **msg);
const char *sim_word_of_id(uint32_t id);
int sim_output_plan(const sim_tokens_t *prompt, const sim_sampling_t *sp, sim_output_t *out);
void sim_output_free(sim_output_t *out);

/* ---- the request ---- */
typedef enum {
    SIM_RS_NEW = 0,
    SIM_RS_KV_WAIT, /* decode: waiting for remote KV before it may run */
    SIM_RS_WAITING, /* queued for a batch slot / KV capacity */
    SIM_RS_PREFILL,
    SIM_RS_DECODE,
    SIM_RS_DONE,
    SIM_RS_FAILED,
    SIM_RS_CANCELLED,
} sim_req_state_t;

struct sim_kv_req; /* sim_kv.c */

typedef struct sim_req {
    int refs; /* under the engine lock */
    uint64_t seq;
    char *request_id; /* X-Request-Id (in or generated) */
    int dp_rank;      /* X-data-parallel-rank, -1 when absent */
    char *resp_id;    /* cmpl-... / chatcmpl-... */
    int is_chat;
    int generate;       /* SGLang's native /generate (sim_generate.c) */
    int return_logprob; /* /generate: meta_info carries token logprobs */
    int stream;
    int include_usage;
    int return_token_ids; /* completions: answers carry prompt_token_ids and token_ids */
    int64_t created;
    sim_tokens_t prompt;
    uint64_t prompt_hash;
    sim_sampling_t sp;
    sim_output_t out;

    /* engine state */
    sim_req_state_t state;
    size_t heap_idx;
    struct sim_req *wq_prev, *wq_next;
    uint64_t t_arrive, t_admit, t_first, t_done, t_next;
    size_t tokens_ready;
    int *blocks; /* KV block ids held while running */
    size_t n_blocks;
    size_t cached_tokens;  /* prefix-cache hit tokens (GPU and CPU tier, as vLLM counts) */
    size_t cpu_hit_tokens; /* of those, loaded from the CPU offload tier */
    uint32_t *cpu_pages;   /* CPU-tier pages held while that load runs (the prefill) */
    size_t n_cpu_pages;
    uint64_t prefill_ns;
    /* step model: tokens with KV (vLLM's num_computed_tokens), tokens scheduled in the
     * running step, times preempted, earliest admission, CPU-tier load cost still to pay */
    size_t computed, sched;
    int preemptions;
    uint64_t t_eligible;
    int heap_ev; /* step model: what its heap entry is (0 = next layer, 1 = t_eligible) */
    double load_ms;
    int layer_i;        /* next layer to finish (layer-wise prefill) */
    int response_ready; /* headers may be sent (first token / done / error) */
    int http_status;    /* != 200 → error_msg */
    char *error_msg;
    const char *error_type;
    int stalled; /* fault: stream stops after N tokens */

    /* connection (MHD thread; guarded by the engine lock) */
    struct MHD_Connection *conn;
    int suspended;
    int conn_gone;
    int http;            /* arrived over HTTP (else an internal request) */
    int client_gone;     /* the client went away before its answer was sent */
    uint32_t watch_slot; /* disconnect watcher slot + 1 (0 = not watched) */
    int watch_fd;        /* the suspended connection's socket while watched */
    size_t emitted;      /* stream: token chunks formatted */
    int head_sent, tail_sent;
    char *pend;
    size_t pend_len, pend_off, pend_cap;

    /* PD */
    struct sim_kv_req *kv;
    json_t *resp_kv_params; /* kv_transfer_params returned in the response */
    size_t rec_idx;         /* slot in /sim/requests */
    uint64_t rec_seq;
} sim_req_t;

/* ---- engine (sim_engine.c) ---- */
int sim_engine_start(void);
void sim_engine_stop(void);
void sim_engine_lock(void);
void sim_engine_unlock(void);
/* Hand a planned request to the engine (takes a reference). */
void sim_engine_submit(sim_req_t *req);
/* Under the lock: let a KV_WAIT request proceed (kv_ok) or fail it. */
void sim_engine_kv_ready_locked(sim_req_t *req, int kv_ok, int status, const char *msg);
/* Under the lock: the connection went away. */
void sim_engine_cancel_locked(sim_req_t *req);
/* Under the lock: capacity was freed outside the engine thread. */
void sim_engine_signal_locked(void);
/* Under the lock: schedule MHD_resume_connection after the lock drops. */
void sim_engine_wake_conn_locked(sim_req_t *req);
void sim_req_unref_locked(sim_req_t *req);
void sim_req_free(sim_req_t *req);

typedef struct sim_engine_stats {
    int running, waiting;
    double kv_usage;
    int blocks_total, blocks_used;
} sim_engine_stats_t;
void sim_engine_stats(sim_engine_stats_t *st);

/* ---- KV blocks and prefix cache (sim_blocks.c), under the engine lock ---- */
int sim_blocks_init(int total_blocks);
void sim_blocks_fini(void);
/* Allocate blocks for n_tokens of which the prompt prefix may hit the cache.
 * Returns 0 and fills blocks/cached_tokens, or -1 if not enough free blocks. */
int sim_blocks_alloc(const sim_tokens_t *prompt, size_t n_tokens, int **blocks, size_t *n_blocks,
                     size_t *cached_tokens);
/* The step model's allocation: prefix-cache hits for a request of <total> tokens (prompt
 * first; at most the full prompt blocks, never the last token's) plus blocks covering
 * <cover> tokens. 0, or -1 with nothing taken. */
int sim_blocks_alloc_cover(const sim_tokens_t *prompt, size_t total, size_t cover, int **blocks,
                           size_t *n_blocks, size_t *cached_tokens);
/* The tokens sim_blocks_alloc_cover would find cached now. */
size_t sim_blocks_count_hits(const sim_tokens_t *prompt, size_t total);
/* Grow a request's blocks to cover <cover> tokens (*blocks realloc'd). 0, or -1 with nothing
 * taken when the free blocks do not suffice. */
int sim_blocks_grow(int **blocks, size_t *n_blocks, size_t cover);
/* Make the full prompt blocks of a computed prefill discoverable. */
void sim_blocks_commit(const sim_tokens_t *prompt, const int *blocks, size_t n_blocks);
void sim_blocks_release(int *blocks, size_t n_blocks);
/* The chained hashes of the first min(max, full blocks) prompt blocks: the
 * names the prefix cache, the CPU tier and the KV events use. */
size_t sim_blocks_hashes(const sim_tokens_t *prompt, size_t max, uint64_t *out);
int sim_blocks_total(void);
int sim_blocks_used(void);
int sim_blocks_needed(size_t n_tokens);

/* ---- CPU offload tier (sim_cpu_tier.c, libkvt's prefix cache), under the engine lock ---- */
int sim_cpu_tier_init(void); /* from sim_cfg: 0 (also when off) or -1 */
void sim_cpu_tier_fini(void);
int sim_cpu_tier_enabled(void);
/* Admission, after the GPU prefix hits: take the next prompt blocks the tier holds (bytes
 * checked), held until sim_cpu_tier_release_locked(); returns the tokens loaded. */
size_t sim_cpu_tier_load_locked(sim_req_t *req);
void sim_cpu_tier_release_locked(sim_req_t *req);
/* After a prefill: copy the full prompt blocks the tier lacks into it. */
void sim_cpu_tier_store_locked(const sim_tokens_t *prompt);
typedef struct sim_cpu_tier_stats {
    uint32_t blocks, free_blocks, cached_blocks;
} sim_cpu_tier_stats_t;
void sim_cpu_tier_stats(sim_cpu_tier_stats_t *st);
/* The bytes of one page (page_bytes each), for tests. */
uint8_t *sim_cpu_tier_page(uint32_t page);
size_t sim_cpu_tier_page_bytes(void);

/* ---- KV events as vLLM publishes them (sim_kv_events.c) ---- */
int sim_kvev_configure(const char *json_text, const char *layout);
void sim_kvev_stop(void);
/* Under the engine lock: queue events, then publish them as one batch. */
/* medium: "GPU" (the block pool) or "CPU" (the offload tier, sim_cpu_tier.c). */
void sim_kvev_stored(const char *medium, int has_parent, uint64_t parent, const uint64_t *hashes,
                     size_t n, const uint32_t *tokens, int block_size);
/* A GPU run of <prompt>'s blocks from block <first_block> on, with current vLLM's extra_keys,
 * group_idx and kv_cache_spec_kind. */
void sim_kvev_stored_prompt(int has_parent, uint64_t parent, const uint64_t *hashes, size_t n,
                            const sim_tokens_t *prompt, size_t first_block, int block_size);
void sim_kvev_removed(const char *medium, uint64_t hash);
void sim_kvev_flush(void);
/* KV-event batches published so far (tests compare it with what a subscriber applied). */
unsigned long long sim_kvev_published(void);

/* ---- metrics (sim_metrics.c) ---- */
typedef struct sim_counters {
    atomic_ullong prompt_tokens;
    atomic_ullong generation_tokens;
    atomic_ullong prefix_queries;
    atomic_ullong prefix_hits;
    atomic_ullong external_queries; /* CPU tier: tokens asked for, hit (vLLM's external_*) */
    atomic_ullong external_hits;
    atomic_ullong offload_stored; /* CPU-tier blocks: copied in, evicted, loaded back */
    atomic_ullong offload_evicted;
    atomic_ullong offload_loaded;
    atomic_ullong offload_no_space;        /* blocks not stored: every page in use */
    atomic_ullong offload_verify_failures; /* loaded pages whose bytes were wrong */
    atomic_ullong req_finished_length;
    atomic_ullong req_finished_stop;
    atomic_ullong req_finished_abort;
    atomic_ullong preemptions; /* vllm:num_preemptions_total */
    atomic_ullong req_errors;
    atomic_ullong http_requests;
    atomic_ullong http_4xx;
    atomic_ullong http_5xx;
    atomic_ullong faults_injected;
    atomic_ullong client_disconnects;
    atomic_ullong kv_bytes_received;
    atomic_ullong kv_bytes_sent;
    atomic_ullong kv_verify_failures;
    atomic_ullong kv_transfers_ok;
    atomic_ullong kv_transfers_failed;
    atomic_ullong kv_hold_timeouts;
    atomic_ullong kv_rejected_releases; /* prefill: held KV freed at a decode's rejection */
    atomic_ullong kv_invalid_params;    /* decode: unusable NIXL params, prompt recomputed */
    atomic_ullong kv_corruptions_injected;
    atomic_llong active_connections;
    atomic_llong open_streams;
    atomic_llong inflight; /* inference requests with a live connection */
    atomic_ullong ttft_us_sum;
    atomic_ullong ttft_count;
} sim_counters_t;

extern sim_counters_t sim_ctr;
char *sim_metrics_render(void);

/* ---- /sim/requests ring (sim_record.c) ---- */
int sim_record_init(int capacity);
void sim_record_fini(void);
/* Store one received request; takes ownership of entry. Its t_recv_us is now unless the
 * entry has one. Returns its seq. */
uint64_t sim_record_add(json_t *entry);
/* Attach key=value (stolen) to the entry with seq (if still in the ring). */
void sim_record_set(uint64_t seq, const char *key, json_t *value);
char *sim_record_dump(const char *request_id_filter);
void sim_record_clear(void);

/* ---- HTTP (sim_http.c) ---- */
int sim_http_start(void);
void sim_http_stop(void);
void sim_http_resume(struct MHD_Connection *conn);

/* ---- disconnect watcher (sim_watch.c) ---- */
int sim_watch_start(void);
void sim_watch_stop(void);
/* Under the engine lock: watch the socket fd of a request whose connection
 * was just suspended before its response started. */
void sim_watch_add_locked(sim_req_t *req, int fd);
/* Under the engine lock, before the connection is resumed or ends. */
void sim_watch_remove_locked(sim_req_t *req);
/* Under the engine lock: has the client of this request gone away? (Checks
 * the socket of a watched request directly; counts a newly seen close.) */
int sim_watch_client_gone_locked(sim_req_t *req);

/* ---- OpenAI request parsing / response formatting (sim_openai.c) ---- */
/* Parse and validate a completions/chat body into req. On error returns the
 * HTTP status (400/404) and sets *msg (malloc'd) and *param. */
int sim_openai_parse(json_t *body, int is_chat, sim_req_t *req, char **msg, const char **param);
char *sim_openai_error_json(int status, const char *msg, const char *type, const char *param);
char *sim_openai_full_response(sim_req_t *req);
/* sim_generate.c: SGLang's native /generate (parse, full answer, stream events) */
int sim_generate_parse(json_t *body, sim_req_t *req, char **msg, const char **param);
char *sim_generate_full_response(sim_req_t *req);
int sim_generate_stream_next(sim_req_t *req);
/* Append the next SSE events of a stream to req->pend; returns 1 if something
 * was produced, 0 if nothing is ready yet, -1 when the stream is finished. */
int sim_openai_stream_next(sim_req_t *req);

/* ---- faults (sim_fault.c) ---- */
int sim_fault_roll(double rate);
void sim_fault_arm_crash(void);

/* ---- KV / PD (sim_kv.c) ---- */
int sim_kv_start(void);
void sim_kv_stop(void);
/* Decide what a request's kv_transfer_params / bootstrap fields ask for.
 * Returns 0, or an HTTP status with *msg set on bad fields. */
int sim_kv_prepare(sim_req_t *req, json_t *body, char **msg);
/* Decode: the serving layer refused <body> before the engine admitted it; a NIXL request
 * that names a prefill's held KV has the prefill free it at once (sim_pd.c). */
void sim_kv_reject(const json_t *body);
/* Does this request's prefill run layer by layer (KV leaves per layer)? */
int sim_kv_layered(const sim_req_t *req);
/* Under the lock: layer <layer> of a layered prefill was computed. */
void sim_kv_on_layer_done_locked(sim_req_t *req, int layer);
/* Under the lock, when a request finished its prefill compute. */
void sim_kv_on_prefill_done_locked(sim_req_t *req);
/* Under the lock, a request left the engine (done/failed/cancelled). */
void sim_kv_on_finish_locked(sim_req_t *req);
/* Under the lock: the client went away before the answer reached it; drop
 * whatever KV the request still exports. */
void sim_kv_on_client_gone_locked(sim_req_t *req);
void sim_kv_req_free(struct sim_kv_req *kv);
/* Did the prompt's KV come from a remote prefill (no prompt compute)? */
int sim_kv_remote_filled(const sim_req_t *req);
/* Does this request wait for remote KV before running? */
int sim_kv_needs_remote(const sim_req_t *req);
/* Start fetching remote KV for a KV_WAIT request (called without the lock). */
void sim_kv_begin_remote(sim_req_t *req);
/* Timing: KV compute per layer for a prefill (ns per layer), used for
 * layer-wise pushes. */
char *sim_kv_metrics_render(void);
/* KV transfer pages in use / pinned (libkvt pools + KV held for a reader). */
void sim_kv_pages(long long *used, long long *pinned);

#endif
