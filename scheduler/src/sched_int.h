/*
 * Internal types of libpdsched: instance, pool, snapshot, booking.
 *
 * Concurrency model:
 *  - The set of instances is a snapshot (arrays per role) guarded by a
 *    writer-preferring rwlock. Picks hold the read lock for the few
 *    microseconds of a choice plus its booking, so an instance found in
 *    the snapshot cannot be freed under them. Membership changes build new
 *    arrays and swap them under the write lock.
 *  - Everything a pick reads on an instance is an atomic in one cache
 *    line (load counters, drain/health flags, breaker state, overload).
 *  - Cold per-instance state (breaker counters, last error, scraped
 *    values) sits under the instance's mutex.
 *  - Probe/scrape bookkeeping is touched only by the pool thread.
 */
#ifndef PDSCHED_SCHED_INT_H
#define PDSCHED_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include <pdsched/discovery.h>
#include <pdsched/predict.h>
#include <pdsched/sched.h>

#include "pdb/pdb_map.h"
#include "sched_alloc_int.h"

/* Role index of the per-role arrays: 0 = can prefill, 1 = can decode. */
#define SCHED_RIDX_PREFILL 0
#define SCHED_RIDX_DECODE  1

/* Bits of an instance's gate word: everything that can keep it from
 * being picked, so the hot path tests one word (0 = selectable). */
#define SCHED_DRAIN_ADMIN     0x1u
#define SCHED_DRAIN_DISCOVERY 0x2u
#define SCHED_DRAIN_RETIRING  0x4u
#define SCHED_GATE_DRAIN_MASK 0x7u
#define SCHED_GATE_DOWN       0x8u /* failed unhealthy_threshold probes */
#define SCHED_GATE_BR_SHIFT   4u   /* sched_breaker_state_t in bits 4-5 */
#define SCHED_GATE_BR_MASK    0x30u

/* Loads are integers in milli-requests. */
#define SCHED_LOAD_UNIT 1000ull
/* In-flight prompt tokens per request-equivalent of prefill load. */
#define SCHED_PREFILL_TOKENS_PER_UNIT 2048ull
/* Projected KV tokens per request-equivalent of decode load. */
#define SCHED_DECODE_TOKENS_PER_UNIT 8192ull
/* Extra load of an instance whose last KV hint said it is full. */
#define SCHED_KV_FULL_PENALTY    (100ull * SCHED_LOAD_UNIT)
#define SCHED_OVERLOAD_MAX_SHIFT 4u

#define SCHED_LAST_ERROR_MAX 192
#define SCHED_RR_MODEL_SLOTS 64

/* The prefill replay's state (sched_prefill_queue.c). */
#define SCHED_PQ_MAX                 64
#define SCHED_PQ_DEFAULT_STEP_TOKENS 2048
typedef struct sched_pq_leg {
    uint32_t id;
    uint32_t tokens; /* to compute */
    uint32_t done;   /* of them, computed by the replay's account at the anchor */
    uint64_t booked_ms;
} sched_pq_leg_t;
typedef struct sched_prefill_queue {
    pthread_mutex_t mu;
    uint64_t anchor_ms;   /* a step ended then (a leg answered), or the engine left idle */
    uint32_t step_tokens; /* the engine's token budget per step */
    uint32_t next_id;
    double rate_acc;     /* tokens booked, decayed: the arrival rate's average */
    uint64_t rate_at_ms; /* when rate_acc was last decayed */
    size_t n;
    sched_pq_leg_t legs[SCHED_PQ_MAX]; /* in booking order */
} sched_prefill_queue_t;
/* A replay's answer: from <start_ms>, <steps> steps computing <tokens> end at <end_ms> with
 * the leg's last token; <elapsed_s> of them had run by the time asked; <later_tokens> of the
 * tokens are prompts expected to arrive after the leg (a prediction's, not booked yet). */
typedef struct sched_pq_steps {
    uint32_t steps;
    uint64_t tokens, later_tokens;
    double start_ms, end_ms, elapsed_s;
} sched_pq_steps_t;

/* The KV handoff factors of the prefills a decode was last paired with (sched_pair.c). */
#define SCHED_PAIR_SLOTS 16
typedef struct sched_pair_slot {
    _Atomic uint64_t prefill_uid; /* 0 = empty, or being rewritten */
    _Atomic double factor;        /* what a pick multiplies the decode's prediction by */
    /* under the table's mu: the running mean of ln(actual / the decode's prediction), the
     * legs it was learnt from, when the pair was last seen */
    double log_factor;
    uint32_t n;
    uint64_t seen_ms;
} sched_pair_slot_t;
typedef struct sched_pair_table {
    pthread_mutex_t mu; /* writers */
    sched_pair_slot_t slot[SCHED_PAIR_SLOTS];
} sched_pair_table_t;

struct sched_instance {
    /* ---- hot: everything a pick reads (first cache line + inv_weight) ---- */
    _Alignas(64) _Atomic uint32_t inflight;
    _Atomic uint32_t gate;        /* SCHED_DRAIN_* | SCHED_GATE_DOWN | breaker << 4 */
    _Atomic uint64_t token_milli; /* milli-load of in-flight prompt and projected KV tokens */
    _Atomic uint64_t scraped;     /* milli (running + waiting) << 32 | milli extras; 0 stale */
    _Atomic uint64_t overload_until_ms;
    _Atomic uint64_t kv_full_until_ms; /* last KV hint said "no free chunks" until then */
    _Atomic uint32_t overload_shift;   /* effective weight = weight >> shift while overloaded */
    uint32_t weight;
    uint64_t inv_weight; /* ceil(2^32 / weight): scores divide by a multiply */

    /* ---- immutable ------------------------------------------------ */
    _Atomic uint64_t breaker_until_ms; /* OPEN: earliest half-open probe */
    _Atomic uint32_t refcnt;
    uint64_t uid;         /* unique per pool object, never reused; given when it joins */
    uint8_t roles;        /* SCHED_ROLE_* bits */
    sched_clock_fn clock; /* the pool's clock (for hints set by the gateway) */
    void *clock_arg;
    uint64_t kv_ttl_ms;
    _Atomic uint64_t kv_free_chunks; /* last hint, for the admin view */
    _Atomic uint64_t kv_free_at_ms;  /* 0 = no hint */
    _Atomic uint64_t prompt_tokens; /* in-flight prompt tokens (prefill legs, whole-request legs) */
    _Atomic uint64_t kv_tokens;     /* projected KV tokens (decode legs), for the admin view */
    /* KV headroom (sched_kv_headroom.c): what the engine can hold, in tokens (0 = unknown:
     * every booking fits), where that figure comes from (SCHED_KV_CAP_*), the tokens the
     * engine last reported in use (usage x capacity; 0 when stale), the prompt part of
     * kv_tokens, and the bookings that passed this decode over for lack of room. */
    _Atomic uint64_t kv_capacity;
    _Atomic uint32_t kv_capacity_source;
    atomic_bool kv_capacity_warned; /* a declared capacity the engine contradicts: said once */
    _Atomic uint64_t kv_engine_used;
    _Atomic uint64_t kv_decode_prompt;
    _Atomic uint64_t kv_refusals;

    /* ---- cold, under mu ------------------------------------------- */
    pthread_mutex_t mu;
    unsigned breaker_failures; /* consecutive */
    char last_error[SCHED_LAST_ERROR_MAX];
    uint64_t last_error_ms;
    double scraped_running, scraped_waiting, scraped_kv_usage;
    uint64_t scraped_at_ms; /* 0 = never */
    unsigned health_ok, health_fail;
    uint64_t last_probe_ms;
    int last_probe_status;
    struct sched_models *learnt; /* names from the engine's /v1/models; NULL = not known */

    /* ---- latency models, learnt from finished legs (each its own lock) ---- */
    sched_latency_model_t lat_prefill; /* a leg's time to its first token */
    sched_latency_model_t lat_tpot;    /* its time per output token after that */
    /* a PD decode leg's time to its first token: the KV handed over and its first step */
    sched_latency_model_t lat_handoff;
    sched_pair_table_t pairs; /* how each prefill's path to it differs from lat_handoff */
    sched_prefill_queue_t pq; /* its open prefill work, for the replay (own lock) */

    /* ---- pool thread only ------------------------------------------ */
    uint64_t next_probe_ms, next_scrape_ms;
    bool probe_busy, scrape_busy, models_busy;

    /* ---- pool writers only (write_mu) -------------------------------- */
    bool leaving; /* left out of the snapshot being built */

    sched_instance_desc_t desc; /* owned copy, immutable */
};

/* Immutable view of the instance set; replaced as a whole. Its arrays borrow the
 * instances: the pool's id index holds the reference of each member. */
typedef struct sched_snapshot {
    size_t n_all;
    sched_instance_t **all; /* sorted by uid */
    size_t n_role[2];
    sched_instance_t **role[2]; /* borrowed from all[] */
    uint64_t *wsum[2];          /* running sums of role[r][i]->weight (weighted policy) */
} sched_snapshot_t;

typedef struct sched_prefix_index sched_prefix_index_t;
typedef struct sched_discovery_slot {
    const sched_discovery_ops_t *ops;
    void *state;
} sched_discovery_slot_t;

#define SCHED_HIST_BUCKETS  12
#define SCHED_MAX_DISCOVERY 8

typedef struct sched_health sched_health_t;

struct sched_pool {
    /* configuration (owned copies); the policies may change while serving
     * (sched_pool_set_policy), so they are read atomically */
    _Atomic sched_policy_t policy[2];
    uint64_t health_interval_ms, health_timeout_ms;
    unsigned healthy_threshold, unhealthy_threshold;
    uint64_t scrape_interval_ms, stale_ms;
    char *health_path, *metrics_path;
    unsigned breaker_failures;
    uint64_t breaker_open_ms, overload_penalty_ms;
    unsigned prefix_block_tokens;
    uint32_t prefill_step_tokens; /* the engines' token budget per step (the prefill replay) */
    size_t prefix_max_blocks;
    uint64_t prefix_slack, zone_slack; /* milli */
    uint32_t default_max_tokens;
    sched_clock_fn clock;
    void *clock_arg;
    sched_log_fn log;
    void *log_arg;

    /* instance set */
    pthread_rwlock_t lock;
    sched_snapshot_t *snap;
    /* id → sched_member_t of every instance in snap: read under lock (read), written with
     * write_mu and lock (write) held, together with the swap of snap */
    pdb_map_t by_id;
    pthread_mutex_t write_mu; /* serialises writers building snapshots */
    _Atomic uint64_t next_uid;
    _Atomic uint64_t rr[2];
    _Atomic uint64_t rr_model[2][SCHED_RR_MODEL_SLOTS]; /* round-robin turns per model hash */

    sched_prefix_index_t *prefix[2];

    /* precise-prefix (sched_kvev_*.c); NULL unless a role uses it */
    struct sched_kvev_index *kvev_index;
    struct sched_kvev_sub *kvev_sub;
    double kvev_prefix_w, kvev_load_w, kvev_other_w;

    /* discovery */
    sched_discovery_slot_t discovery[SCHED_MAX_DISCOVERY];
    size_t n_discovery;

    /* background */
    sched_health_t *health;
    pthread_t thread;
    bool started;
    _Atomic bool stopping;

    /* metrics */
    _Atomic uint64_t hist[SCHED_HIST_BUCKETS + 1]; /* last = +Inf */
    _Atomic uint64_t hist_sum_ns;
    _Atomic uint64_t hist_count;
    _Atomic uint64_t no_instance[2];
    _Atomic uint64_t affinity_home[2], affinity_moved[2]; /* sched_affinity.c */
    _Atomic uint64_t double_release;
    _Atomic uint64_t bookings;
    _Atomic uint64_t kv_refusals;   /* decode bookings that passed a full decode over */
    _Atomic uint64_t kv_overcommit; /* decode bookings made when no decode had room */

    struct sched_autoscale *autoscale; /* sched_autoscale.c: demand and replica signals */
};

/* ---- sched_instance.c ---- */
sched_status_t sched_instance_create(sched_pool_t *pool, const sched_instance_desc_t *desc,
                                     char *err, size_t err_len, sched_instance_t **inst_out);

/* ---- gate word -------------------------------------------------- */
static inline uint32_t sched_gate_drain(const sched_instance_t *inst)
{
    return atomic_load_explicit(&inst->gate, memory_order_relaxed) & SCHED_GATE_DRAIN_MASK;
}

static inline bool sched_gate_down(const sched_instance_t *inst)
{
    return (atomic_load_explicit(&inst->gate, memory_order_relaxed) & SCHED_GATE_DOWN) != 0;
}

static inline uint32_t sched_gate_breaker(const sched_instance_t *inst)
{
    return (atomic_load_explicit(&inst->gate, memory_order_acquire) & SCHED_GATE_BR_MASK) >>
           SCHED_GATE_BR_SHIFT;
}

/* Set the breaker bits to <to>; if <from> is not UINT32_MAX, only when
 * they are <from> now. True when the word was changed that way. */
static inline bool sched_gate_set_breaker(sched_instance_t *inst, uint32_t from, uint32_t to)
{
    uint32_t g = atomic_load_explicit(&inst->gate, memory_order_relaxed);

    for (;;) {
        uint32_t next = (g & ~SCHED_GATE_BR_MASK) | (to << SCHED_GATE_BR_SHIFT);
        if (from != UINT32_MAX && ((g & SCHED_GATE_BR_MASK) >> SCHED_GATE_BR_SHIFT) != from)
            return false;
        if (atomic_compare_exchange_weak_explicit(&inst->gate, &g, next, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return true;
    }
}

/* Could take a new booking now (up, not draining, breaker closed or due
 * for its half-open probe). Hot path: inline. */
static inline bool sched_instance_selectable(const sched_instance_t *inst, uint64_t now_ms)
{
    uint32_t g = atomic_load_explicit(&inst->gate, memory_order_relaxed);

    if (g == 0)
        return true;
    if (g & (SCHED_GATE_DRAIN_MASK | SCHED_GATE_DOWN))
        return false;
    if ((g & SCHED_GATE_BR_MASK) >> SCHED_GATE_BR_SHIFT == SCHED_BREAKER_OPEN)
        return now_ms >= atomic_load_explicit(&inst->breaker_until_ms, memory_order_relaxed);
    return false; /* half-open: its single probe is out */
}

/* Room for one more leg under the instance's max_concurrent (0 = unlimited). A hint for the
 * policies; sched_instance_take_slot() is the exact check. */
static inline bool sched_instance_has_room(const sched_instance_t *inst)
{
    return inst->desc.max_concurrent == 0 ||
           atomic_load_explicit(&inst->inflight, memory_order_relaxed) < inst->desc.max_concurrent;
}

/* Count one more open leg, unless that would pass max_concurrent (false, nothing counted). */
static inline bool sched_instance_take_slot(sched_instance_t *inst)
{
    uint32_t cur = atomic_load_explicit(&inst->inflight, memory_order_relaxed);
    if (inst->desc.max_concurrent == 0) {
        atomic_fetch_add_explicit(&inst->inflight, 1, memory_order_relaxed);
        return true;
    }
    do {
        if (cur >= inst->desc.max_concurrent)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&inst->inflight, &cur, cur + 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

/*
 * Load score in milli-requests per unit of weight (lower is better):
 * max(local in-flight, scraped running + waiting) + scraped extras
 * (waiting again, KV usage) + in-flight prompt and projected KV tokens +
 * a KV-full penalty + 1 (so weights order idle instances too), shifted
 * left by the overload level and divided by the weight.
 */
static inline uint64_t sched_instance_score(const sched_instance_t *inst, uint64_t now_ms)
{
    uint64_t local =
        (uint64_t)atomic_load_explicit(&inst->inflight, memory_order_relaxed) * SCHED_LOAD_UNIT;
    uint64_t scraped = atomic_load_explicit(&inst->scraped, memory_order_relaxed);
    uint64_t sreq = scraped >> 32;
    uint64_t load = (local > sreq ? local : sreq) + (scraped & 0xffffffffu) + SCHED_LOAD_UNIT +
                    atomic_load_explicit(&inst->token_milli, memory_order_relaxed);

    if (atomic_load_explicit(&inst->kv_full_until_ms, memory_order_relaxed) > now_ms)
        load += SCHED_KV_FULL_PENALTY;
    if (atomic_load_explicit(&inst->overload_until_ms, memory_order_relaxed) > now_ms)
        load <<= atomic_load_explicit(&inst->overload_shift, memory_order_relaxed);
    return (uint64_t)(((unsigned __int128)load * inst->inv_weight) >> 32);
}

/* Milli-load charged for a prefill leg of <prompt> tokens / a decode leg
 * projecting <kv> tokens. */
static inline uint64_t sched_prefill_milli(uint64_t prompt)
{
    return prompt * SCHED_LOAD_UNIT / SCHED_PREFILL_TOKENS_PER_UNIT;
}

static inline uint64_t sched_decode_milli(uint64_t kv)
{
    return kv * SCHED_LOAD_UNIT / SCHED_DECODE_TOKENS_PER_UNIT;
}

static inline uint32_t sched_scraped_reqs(const sched_instance_t *inst)
{
    return (uint32_t)(atomic_load_explicit(&inst->scraped, memory_order_relaxed) >> 32);
}

static inline uint32_t sched_scraped_extra(const sched_instance_t *inst)
{
    return (uint32_t)atomic_load_explicit(&inst->scraped, memory_order_relaxed);
}

/* weight × 1024, halved per overload step while the overload lasts */
uint32_t sched_instance_effective_weight(const sched_instance_t *inst, uint64_t now_ms);
void sched_instance_set_error(sched_instance_t *inst, uint64_t now_ms, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
sched_state_t sched_instance_state_now(const sched_instance_t *inst);

/* ---- sched_models.c ---- */
/* Model names learnt from an engine (immutable once built; swapped under inst->mu). */
typedef struct sched_models {
    size_t n;
    char **names;
    char **entries; /* the engine's list entry of each name, compact JSON text */
    bool *adapter;  /* listed with a `parent` model: a LoRA adapter of it */
} sched_models_t;
void sched_models_free(sched_models_t *m);
/* Replace <inst>'s learnt names with those of a GET /v1/models body (OpenAI list shape).
 * A body that is not such a list, or lists nothing, keeps what was known. */
void sched_models_learn(sched_pool_t *pool, sched_instance_t *inst, const char *body, size_t len);
/* The pick filter: sched_instance_serves() for ctx requests (takes inst->mu when learnt). */
bool sched_models_allow(sched_instance_t *inst, const char *model);

/* ---- sched_desc.c ---- */
/* Validate, deep-copy and normalise <src> into <dst> (url normalised to
 * scheme://host:port/base, id derived, defaults applied). */
sched_status_t sched_desc_copy(const sched_instance_desc_t *src, sched_instance_desc_t *dst,
                               char *err, size_t err_len);
void sched_desc_free(sched_instance_desc_t *desc);
bool sched_desc_equal(const sched_instance_desc_t *a, const sched_instance_desc_t *b);
/* Split "host:port" / "[v6]:port"; host copied into <host> (NUL-terminated). */
sched_status_t sched_split_hostport(const char *in, char *host, size_t host_len, int *port_out);

/* ---- sched_breaker.c ---- */
/* Try to take <inst> for a new booking; *probe_out set when this booking is
 * the half-open probe. False when the breaker refuses. */
bool sched_breaker_acquire(sched_instance_t *inst, uint64_t now_ms, bool *probe_out);
/* Give back an unused probe slot (booking reverted or cancelled). */
void sched_breaker_release_probe(sched_instance_t *inst, uint64_t now_ms);
void sched_breaker_report(sched_pool_t *pool, sched_instance_t *inst, bool probe, uint64_t now_ms,
                          const sched_result_t *result);

/* ---- sched_pool.c ---- */
/* An entry of pool->by_id: the instance holding that id now, with the pool's reference. */
typedef struct sched_member {
    sched_instance_t *inst;
} sched_member_t;

uint64_t sched_pool_now(const sched_pool_t *pool);

/* sched_instance_predict_ttft at a time the caller read once (a pick asks it of every
 * candidate). */
void sched_instance_predict_ttft_at(const sched_instance_t *inst, uint64_t uncached_tokens,
                                    uint64_t now_ms, sched_prediction_t *out);
/* The same, with the replay's steps it was made from. */
void sched_instance_predict_ttft_replay(const sched_instance_t *inst, uint64_t uncached_tokens,
                                        uint64_t now_ms, sched_pq_steps_t *st,
                                        sched_prediction_t *out);

/* ---- the prefill replay (sched_prefill_queue.c) ---- */
void sched_pq_init(sched_prefill_queue_t *q, uint32_t step_tokens);
void sched_pq_fini(sched_prefill_queue_t *q);
/* Queue a leg of <tokens> booked at <now_ms>; its id (0: the queue is full, not replayed). */
uint64_t sched_pq_add(sched_instance_t *inst, uint64_t now_ms, uint64_t tokens);
/* The replay of a leg of <tokens> booked now, behind what is queued. */
void sched_pq_predict(const sched_instance_t *inst, uint64_t now_ms, uint64_t tokens,
                      sched_pq_steps_t *out);
/* Leg <id> answered at <now_ms> having computed <computed> tokens (0 = as queued): a step
 * ended now. LEARNT with <learn> filled when the replay reached it: the steps and tokens from
 * the anchor it ran from to its end (learn->start_ms) - the prefill model's observation; SEEN
 * when the replay had it done already (it shared the step of a leg answered before it: that
 * one taught the step); ABSENT when it was not queued. */
typedef enum { SCHED_PQ_LEARNT, SCHED_PQ_SEEN, SCHED_PQ_ABSENT } sched_pq_answer_t;
sched_pq_answer_t sched_pq_answered(sched_instance_t *inst, uint64_t id, uint64_t now_ms,
                                    uint64_t computed, sched_pq_steps_t *learn);
/* Leg <id> ended without saying when its prompt was done (failed, cancelled, or a whole
 * request's leg that streamed on): out of the replay. */
void sched_pq_drop(sched_instance_t *inst, uint64_t id);
/* The tokens still queued by the replay's account (admin view, autoscaling). */
uint64_t sched_pq_tokens(const sched_instance_t *inst);
uint64_t sched_pool_kv_ttl_ms(const sched_pool_t *pool);
/* Remove retiring instances with nothing in flight (pool thread). */
void sched_pool_reap_retired(sched_pool_t *pool);
/* Copy the current snapshot's instances with a reference each; caller
 * unrefs every entry and frees the array. */
sched_status_t sched_pool_collect(sched_pool_t *pool, sched_instance_t ***out, size_t *n_out);
void sched_pool_release_collected(sched_instance_t **arr, size_t n);

/* ---- sched_policy.c ---- */
typedef struct sched_pick_ctx {
    sched_pool_t *pool;
    const sched_request_t *req;
    const uint64_t *block_hashes; /* NULL when not computed */
    size_t n_blocks;
    const uint64_t *kv_keys; /* precise-prefix keys; NULL when not computed */
    size_t n_kv_keys;
    const uint64_t *exclude_uids; /* extra uids to skip */
    size_t n_exclude_uids;
    uint64_t now_ms;
    uint64_t *rng;      /* per-thread state */
    bool any_exclude;   /* exclude_uids or req->exclude_ids non-empty */
    bool whole_request; /* a decode leg that runs the whole request (its prefill too) */
    uint64_t kv_need;   /* KV tokens the leg will hold (decode legs; 0 = no headroom test) */
    /* slo: a prefill chosen together with the decode that will follow it (both legs booked
     * at once, the decodes' policy slo too), and the prefill a decode follows (0 = none) */
    bool pair_decodes;
    uint64_t pair_prefill_uid;
} sched_pick_ctx_t;

/* Choose an instance for role index <ridx> from <snap> (read lock held).
 * NULL when none is usable. Does not book. */
sched_instance_t *sched_policy_pick(const sched_snapshot_t *snap, int ridx, sched_policy_t policy,
                                    const sched_pick_ctx_t *ctx);
bool sched_pick_allowed(const sched_instance_t *inst, const sched_pick_ctx_t *ctx);
/* Least-score selectable instance of <ridx> whose zone is <zone>, or NULL. */
sched_instance_t *sched_policy_least_in_zone(const sched_snapshot_t *snap, int ridx,
                                             const char *zone, const sched_pick_ctx_t *ctx,
                                             uint64_t *score_out);
/* ---- sched_slo.c ---- */
sched_instance_t *sched_slo_pick(sched_instance_t *const *arr, size_t n, int ridx,
                                 const sched_pick_ctx_t *ctx);
/* ---- sched_pair.c ---- */
void sched_pair_table_init(sched_pair_table_t *t);
void sched_pair_table_fini(sched_pair_table_t *t);
/* The handoff factor of the pair (<prefill_uid>, the table's decode): 1 when not learnt. */
double sched_pair_factor(const sched_pair_table_t *t, uint64_t prefill_uid);
/* The same for <n> prefills at once (out[k] for prefill_uids[k]; uid 0 matches none). */
void sched_pair_factors(const sched_pair_table_t *t, const uint64_t *prefill_uids, size_t n,
                        double *out);
/* A PD decode leg's time to its first token on <decode> after a prefill on <prefill_uid>
 * (0 = not known: the decode's model alone), features sched_transfer_features(). */
void sched_handoff_predict(const sched_instance_t *decode, uint64_t prefill_uid, const double *x,
                           sched_prediction_t *out);
/* Learn what such a leg took: the decode's model and the pair's factor. */
void sched_handoff_observe(sched_instance_t *decode, uint64_t prefill_uid, const double *x,
                           double seconds, uint64_t now_ms);
/* ---- sched_kv_headroom.c ---- */
/* Where an instance's KV capacity comes from. */
#define SCHED_KV_CAP_NONE     0u /* unknown: the headroom test passes */
#define SCHED_KV_CAP_LEARNT   1u /* booked tokens / scraped usage */
#define SCHED_KV_CAP_ENGINE   2u /* vllm:cache_config_info num_gpu_blocks x block_size */
#define SCHED_KV_CAP_DECLARED 3u /* the descriptor's kv_capacity_tokens */
const char *sched_kv_capacity_source_name(uint32_t source);

/* KV tokens the instance is projected to hold: what pdgw booked on it (prompt + max_tokens
 * of its open decode legs) or what its engine last reported in use, the larger. */
static inline uint64_t sched_kv_projected(const sched_instance_t *inst)
{
    uint64_t booked = atomic_load_explicit(&inst->kv_tokens, memory_order_relaxed);
    uint64_t used = atomic_load_explicit(&inst->kv_engine_used, memory_order_relaxed);
    return booked > used ? booked : used;
}

/* Would a leg holding <need> KV tokens fit without the engine having to preempt? An
 * instance of unknown capacity always fits (nothing says otherwise). Hot path: inline. */
static inline bool sched_kv_fits(const sched_instance_t *inst, uint64_t need)
{
    uint64_t cap = atomic_load_explicit(&inst->kv_capacity, memory_order_relaxed);
    return cap == 0 || need == 0 || sched_kv_projected(inst) + need <= cap;
}

/* (projected + need) / capacity: how far over its memory a leg would take the instance
 * (0 when its capacity is unknown). */
double sched_kv_fill_ratio(const sched_instance_t *inst, uint64_t need);
/* Among the allowed instances of arr[0, n): the one the leg overfills least (all of them are
 * full), counted in pdgw_decode_kv_overcommit_total. NULL when none is allowed. */
sched_instance_t *sched_kv_least_bad(sched_instance_t *const *arr, size_t n,
                                     const sched_pick_ctx_t *ctx);
/* <chosen> fitted while other allowed instances of arr[0, n) did not: count a refusal on
 * each of those (pdgw_decode_kv_headroom_refusals_total). */
void sched_kv_count_refusals(sched_instance_t *const *arr, size_t n, const sched_pick_ctx_t *ctx,
                             const sched_instance_t *chosen);
/* A scrape arrived (pool thread): the engine's capacity if it exports one, else learn it
 * from the usage fraction against what pdgw booked there; the engine's tokens in use. */
struct sched_engine_metrics;
void sched_kv_on_scrape(sched_pool_t *pool, sched_instance_t *inst,
                        const struct sched_engine_metrics *m);
/* The scrape went stale: forget the engine's tokens in use (booked ones still count). */
void sched_kv_on_stale(sched_instance_t *inst);

/* ---- sched_autoscale.c ---- */
/* A booking of <req> (model, prompt, max_tokens, targets) arrived / one finished with
 * <output_tokens> generated (0 = unknown). Lock-free counters per model. */
void sched_autoscale_note_request(sched_pool_t *pool, const sched_request_t *req);
void sched_autoscale_note_output(sched_pool_t *pool, const char *model, uint32_t output_tokens);
sched_status_t sched_autoscale_create(sched_pool_t *pool, const sched_config_t *cfg);
void sched_autoscale_destroy(sched_pool_t *pool);
/* Append pdgw_autoscale_* families (updates the smoothed signals first). */
struct pdb_prom;
void sched_autoscale_emit(struct pdb_prom *p, sched_pool_t *pool);

/* ---- sched_affinity.c ---- */
/* Hash of a session-affinity key (stable for the life of the process). */
uint64_t sched_affinity_hash(const char *key, size_t len);
/* Rendezvous choice for <key_hash> among the allowed instances of <ridx>; counts whether
 * it is the key's home (its choice among all of the role's instances) or moved. */
sched_instance_t *sched_affinity_pick(sched_pool_t *pool, const sched_snapshot_t *snap, int ridx,
                                      uint64_t key_hash, const sched_pick_ctx_t *ctx);
uint64_t *sched_thread_rng(void);
/* Seed of every thread's generator (first non-zero call wins). */
void sched_rng_seed_base(uint64_t seed);
uint64_t sched_rng_next(uint64_t *state);

/* ---- sched_prefix.c ---- */
sched_status_t sched_prefix_create(size_t max_blocks, sched_prefix_index_t **out);
void sched_prefix_destroy(sched_prefix_index_t *idx);
/* Block hashes of the request prompt (tokens, else text); at most max_out. */
size_t sched_prefix_hash_request(const sched_request_t *req, unsigned block_tokens, uint64_t *out,
                                 size_t max_out);
/* Longest indexed prefix: number of matched blocks; up to 2 instance uids
 * that served it (most recent first, 0 = none). */
size_t sched_prefix_match(sched_prefix_index_t *idx, const uint64_t *hashes, size_t n,
                          uint64_t uids_out[2]);
void sched_prefix_record(sched_prefix_index_t *idx, const uint64_t *hashes, size_t n, uint64_t uid);
size_t sched_prefix_size(sched_prefix_index_t *idx);
size_t sched_prefix_capacity(sched_prefix_index_t *idx);

#define SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST 1024

/* ---- sched_kvev_policy.c ---- */
sched_instance_t *sched_kvev_pick(sched_instance_t *const *arr, size_t n, int ridx,
                                  const sched_pick_ctx_t *ctx);
/* Keys of the request's token ids at the fleet's block size (*keys_out
 * NULL, *n_out 0 when there is nothing to match); caller frees. */
sched_status_t sched_kvev_request_keys(sched_pool_t *pool, const sched_request_t *req,
                                       uint64_t **keys_out, size_t *n_out);
/* Pool hooks: create/destroy the index and subscriber; follow the set. */
sched_status_t sched_kvev_pool_create(sched_pool_t *pool, const sched_config_t *cfg);
sched_status_t sched_kvev_pool_start(sched_pool_t *pool);
void sched_kvev_pool_destroy(sched_pool_t *pool);
/* The set changed: <gone> left it, <added> joined it (a replaced instance is both: the old
 * object left, the new one joined). Called by the writer after the swap. */
void sched_kvev_pool_sync(sched_pool_t *pool, sched_instance_t *const *gone, size_t n_gone,
                          sched_instance_t *const *added, size_t n_added);
/* Least-score allowed instance (exported from sched_policy.c). */
sched_instance_t *sched_policy_least(sched_instance_t *const *arr, size_t n,
                                     const sched_pick_ctx_t *ctx, uint64_t *score_out);

/* ---- sched_health.c ---- */
sched_status_t sched_health_create(sched_pool_t *pool, sched_health_t **out);
void sched_health_destroy(sched_health_t *h);
/* One iteration of background work; waits at most timeout_ms. */
void sched_health_run_once(sched_pool_t *pool, int timeout_ms);
void sched_health_wakeup(sched_health_t *h);

/* ---- sched_prom.c ---- */
typedef struct sched_engine_metrics {
    double running, waiting, kv_usage; /* kv_usage in 0..1 */
    bool have_running, have_waiting, have_kv_usage;
    /* vllm:cache_config_info num_gpu_blocks x block_size, summed over its label sets (one
     * per engine behind the endpoint); have_ false when absent or not yet known ("None"). */
    double kv_capacity_tokens;
    bool have_kv_capacity;
} sched_engine_metrics_t;
/* Parse Prometheus text; sums samples across label sets. */
sched_status_t sched_prom_parse(const char *text, size_t len, sched_engine_metrics_t *out);

/* ---- sched_discovery.c ---- */
sched_status_t sched_discovery_create_all(sched_pool_t *pool, const sched_config_t *cfg);
sched_status_t sched_discovery_start_all(sched_pool_t *pool);
void sched_discovery_tick_all(sched_pool_t *pool, uint64_t now_ms);
void sched_discovery_destroy_all(sched_pool_t *pool);

/* ---- sched_metrics.c ---- */
void sched_metrics_observe_schedule(sched_pool_t *pool, uint64_t ns);

/* ---- sched_admin.c ---- */
json_t *sched_instance_to_json(sched_pool_t *pool, sched_instance_t *inst, uint64_t now_ms);

/* small helpers */
void sched_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* PDSCHED_SCHED_INT_H */
