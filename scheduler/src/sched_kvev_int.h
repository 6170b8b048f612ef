/*
 * KV events: what the engines say their prefix caches hold.
 *
 * vLLM (and SGLang) publish every block their prefix cache stores or
 * evicts on a ZeroMQ PUB socket (vllm/distributed/kv_events.py). Three
 * parts live here, each in its own file:
 *   sched_kvev_decode.c  one msgpack payload → a list of events;
 *   sched_kvev_index.c   bounded index: our block key → instances, tier;
 *   sched_kvev_sub.c     one SUB (+ replay DEALER) per instance, gap and
 *                        restart handling, feeding the index.
 * The precise-prefix policy (sched_kvev_policy.c) reads the index.
 *
 * Engine block hashes depend on the engine's hash seed and algorithm, so
 * the index never relies on them to name a prefix: it rehashes the token
 * ids each BlockStored carries with its own chained hash and keeps
 * engine hash → own key only to apply removals.
 */
#ifndef PDSCHED_SCHED_KVEV_INT_H
#define PDSCHED_SCHED_KVEV_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdsched/sched.h>

/* ---- decoder ----------------------------------------------------- */

typedef enum sched_kvev_kind {
    SCHED_KVEV_STORED = 1,
    SCHED_KVEV_REMOVED = 2,
    SCHED_KVEV_CLEARED = 3,
} sched_kvev_kind_t;

/* Where a block's storage is relative to the publishing instance (vLLM's optional
 * `locality`, set by its FS/OBJ offload tiers); absent means unspecified. */
typedef enum sched_kvev_locality {
    SCHED_KVEV_LOC_UNSPECIFIED = 0,
    SCHED_KVEV_LOC_LOCAL = 1,
    SCHED_KVEV_LOC_REMOTE = 2,
} sched_kvev_locality_t;

/* The KV-cache group's attention kind (`kv_cache_spec_kind` of a BlockStored). */
typedef enum sched_kvev_spec {
    SCHED_KVEV_SPEC_UNKNOWN = 0, /* absent: counted as full attention */
    SCHED_KVEV_SPEC_FULL = 1,    /* "full_attention" (and any other kind that keeps the
                                    whole prefix) */
    SCHED_KVEV_SPEC_PARTIAL = 2, /* sliding window, chunked local, mamba: keeps only a tail */
} sched_kvev_spec_t;

/* One event; arrays point into the decoder's zone (valid until the batch
 * is freed). Hashes given as bytes are folded to their last 8 bytes. */
typedef struct sched_kvev_event {
    sched_kvev_kind_t kind;
    const uint64_t *block_hashes;
    size_t n_block_hashes;
    bool has_parent;
    uint64_t parent_block_hash;
    const uint32_t *token_ids; /* STORED */
    size_t n_token_ids;
    uint32_t block_size;   /* STORED */
    bool medium_gpu;       /* medium absent/nil/"GPU" → true */
    const char *lora_name; /* NUL-terminated, NULL when absent */
    int64_t group_idx;     /* -1 when absent */
    /* STORED: one digest per block of its extra_keys entry (sched_kvev_extra_digest; 0 for a
     * nil entry), NULL when the event has no extra_keys. */
    const uint64_t *extra_digests;
    sched_kvev_spec_t spec;         /* STORED */
    int64_t sliding_window;         /* STORED; -1 when absent */
    sched_kvev_locality_t locality; /* both */
    /* REMOVED: copies of each hash the engine still holds after this removal, one per
     * block hash; NULL when absent (older engines: a removal then removes). */
    const uint32_t *remaining_copies;
} sched_kvev_event_t;

typedef struct sched_kvev_batch {
    double ts;
    int64_t dp_rank; /* -1 when absent */
    bool map_layout; /* batch was a map (newer vLLM), else an array */
    sched_kvev_event_t *events;
    size_t n_events;
    size_t n_unknown;  /* events of a type we do not know (skipped) */
    size_t n_trailing; /* batch elements after the ones we know (array layout), ignored */
    void *zone_;       /* owned */
} sched_kvev_batch_t;

/* Most msgpack elements (all levels) one payload may hold: an engine step's batch has about
 * 1.1 per token it caches (the token ids, a hash per block), so 4M is 3.7M tokens in one step,
 * and msgpack-c's 24 bytes per element stay under 100 MiB for the largest payload taken. */
#define SCHED_KVEV_MAX_OBJECTS ((uint64_t)1 << 22)

/*
 * Decode one payload (the third frame of a KV-event message). Accepts the
 * array layout (older vLLM: [ts, [events], dp_rank], events ["Tag", ...])
 * and the map layout (newer: {"ts":..,"events":[{"type":"Tag",..}],..}).
 * SCHED_ERR_INVALID with a reason in <err> for anything malformed (or of
 * more than SCHED_KVEV_MAX_OBJECTS elements); the batch is then left
 * empty. Free with sched_kvev_batch_free().
 */
sched_status_t sched_kvev_decode(const void *buf, size_t len, sched_kvev_batch_t *out, char *err,
                                 size_t err_len);
void sched_kvev_batch_free(sched_kvev_batch_t *batch);

/* ---- index ------------------------------------------------------- */

#define SCHED_KVEV_MAX_SLOTS 64 /* instances one index can tell apart */

typedef struct sched_kvev_index sched_kvev_index_t;

typedef struct sched_kvev_index_stats {
    uint64_t records;    /* (instance, engine hash, tier) residencies held */
    uint64_t keys;       /* distinct block keys */
    uint64_t capacity;   /* record bound */
    uint64_t evicted;    /* records dropped by the LRU bound */
    uint64_t orphans;    /* stored blocks whose parent we did not know */
    uint64_t bad_events; /* inconsistent events (token count, block size) */
    uint64_t remote;     /* stored blocks skipped: locality REMOTE */
    uint64_t kept;       /* removals skipped: the engine still holds another copy */
} sched_kvev_index_stats_t;

/* <max_records> bounds memory (at least 64). */
sched_status_t sched_kvev_index_create(size_t max_records, sched_kvev_index_t **out);
void sched_kvev_index_destroy(sched_kvev_index_t *idx);

/* Slot of instance <uid>, allocated on first use; -1 when all are taken. */
int sched_kvev_index_slot(sched_kvev_index_t *idx, uint64_t uid);
/* Forget everything slot <slot> holds (AllBlocksCleared, restart); with
 * <release>, the slot is freed for another instance too. */
void sched_kvev_index_clear(sched_kvev_index_t *idx, int slot, bool release);
/* Apply one decoded event for <slot>. */
void sched_kvev_index_apply(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev);

/* The digest of one block's extra_keys entry (vLLM kv_cache_utils.py
 * generate_block_hash_extra_keys: LoRA name, then (multimodal hash, offset) pairs, then the
 * cache salt on the first block, then prompt-embedding digests), given as its msgpack bytes:
 * the entry is packed again by msgpack-c, so the digest does not depend on how the
 * publisher sized its headers. Never 0 (0 = no extra keys). */
uint64_t sched_kvev_extra_digest(const void *msgpack_entry, size_t len);

/* Our chained key of each full block of <tokens> (<block_size> tokens per block), with the
 * extra keys vLLM folds into a text request's block hash: LoRA <lora_name> on every block
 * and <cache_salt> on the first (either NULL); returns how many were written. */
size_t sched_kvev_keys(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                       const char *lora_name, const char *cache_salt, uint64_t *out,
                       size_t max_out);

/*
 * For each of <n_uids> instances, the number of leading blocks of <keys>
 * it holds (depth_out) and the tier-weighted count (gpu blocks count 1,
 * other tiers <other_tier_weight>) in weighted_out. Unknown uids: 0.
 */
void sched_kvev_index_match(sched_kvev_index_t *idx, const uint64_t *keys, size_t n_keys,
                            const uint64_t *uids, size_t n_uids, double other_tier_weight,
                            size_t *depth_out, double *weighted_out);
/* Block size the events of <uid> use (0 when unknown yet); uid 0: the
 * last block size any instance reported. */
uint32_t sched_kvev_index_block_size(sched_kvev_index_t *idx, uint64_t uid);
void sched_kvev_index_stats(sched_kvev_index_t *idx, sched_kvev_index_stats_t *out);

/* ---- subscriber -------------------------------------------------- */

typedef struct sched_kvev_sub sched_kvev_sub_t;

typedef struct sched_kvev_sub_stats {
    uint64_t messages;      /* batches applied */
    uint64_t events;        /* events applied */
    uint64_t gaps;          /* sequence gaps seen */
    uint64_t replays;       /* replay requests sent */
    uint64_t replays_done;  /* replays answered to their end */
    uint64_t replay_failed; /* replays that timed out or were refused */
    uint64_t restarts;      /* publisher restarts (sequence went back) */
    uint64_t cleared;       /* AllBlocksCleared applied */
    uint64_t bad_messages;  /* undecodable or misframed */
    uint64_t reconnects;    /* sockets opened again after their connection dropped */
    uint64_t lag_ms;        /* now − ts of the last batch, last seen */
} sched_kvev_sub_stats_t;

/* Default bound of one message (ZMQ_MAXMSGSIZE), sched_config_t.kv_events_max_message_bytes. */
#define SCHED_KVEV_MAX_MSG_BYTES ((size_t)16 << 20)

/* The subscriber feeds <idx> (borrowed); it takes messages of at most <max_msg_bytes> (0: the
 * default), a larger one drops the connection, which is then opened again. <log> may be
 * NULL. */
sched_status_t sched_kvev_sub_create(sched_kvev_index_t *idx, size_t max_msg_bytes,
                                     sched_log_fn log, void *log_arg, sched_kvev_sub_t **out);
void sched_kvev_sub_destroy(sched_kvev_sub_t *sub);
/* How long a replay may take to answer before live messages are taken again (<= 0: the
 * default 1 s), and how long after joining the second catch-up replay is asked (< 0: never;
 * default 1 s). Tests whose fake answers replays only between steps make both deterministic. */
void sched_kvev_sub_set_timing(sched_kvev_sub_t *sub, int replay_timeout_ms, int catchup_delay_ms);
/* Subscribe to instance <uid>'s publisher (<replay> may be NULL/""). Adding
 * a uid already present is a no-op; thread-safe. */
sched_status_t sched_kvev_sub_add(sched_kvev_sub_t *sub, uint64_t uid, const char *endpoint,
                                  const char *replay);
/* Stop listening to <uid> and drop what the index holds for it. */
void sched_kvev_sub_remove(sched_kvev_sub_t *sub, uint64_t uid);
/* Process what arrived, waiting at most <timeout_ms> (one thread only). */
void sched_kvev_sub_poll(sched_kvev_sub_t *sub, int timeout_ms);
/* Run sched_kvev_sub_poll in a thread of its own until destroy. */
sched_status_t sched_kvev_sub_start(sched_kvev_sub_t *sub);
void sched_kvev_sub_stats(sched_kvev_sub_t *sub, sched_kvev_sub_stats_t *out);

/*
 * Silence. An idle engine publishes nothing, so quiet alone proves nothing; an instance is
 * silent while needed when precise-prefix routed a request to it (one with tokens) and no
 * message came from its publisher for <silence_ms> after the first such request since its
 * last message (or since it joined). Then one warning per instance; when a message comes,
 * one line says events resumed. <clock> (NULL: monotonic) also times the gauge.
 */
void sched_kvev_sub_set_silence(sched_kvev_sub_t *sub, uint64_t silence_ms, sched_clock_fn clock,
                                void *clock_arg);
/* precise-prefix routed a request that has tokens to <uid>. */
void sched_kvev_sub_note_routed(sched_kvev_sub_t *sub, uint64_t uid);
/* Warn about instances that turned silent (the polling thread calls it too); returns the ms
 * until the next one could, UINT64_MAX when none is pending. */
uint64_t sched_kvev_sub_check_silence(sched_kvev_sub_t *sub);

typedef struct sched_kvev_silence {
    uint64_t silence_ms; /* since the last message, or since joining when none came */
    bool ever;           /* a message came since joining */
    bool silent;         /* silent while needed (warned, not yet resumed) */
    uint64_t routed;     /* requests routed to it since its last message */
} sched_kvev_silence_t;

/* What is known of <uid>'s publisher; false when it is not subscribed. */
bool sched_kvev_sub_silence(sched_kvev_sub_t *sub, uint64_t uid, sched_kvev_silence_t *out);

/* The endpoint rank <dp_rank> of a data-parallel engine configured with <endpoint> publishes
 * on (vLLM's per-rank offset); false when it has none (sched_kvev_query.c). */
bool sched_kvev_rank_endpoint(const char *endpoint, int dp_rank, char *out, size_t out_len);

#endif /* PDSCHED_SCHED_KVEV_INT_H */
