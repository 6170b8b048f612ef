/*
 * Bounded index of the blocks the engines report as cached.
 *
 * A record is one residency: (instance slot, engine block hash, tier, KV-cache
 * group) → our key. Records come from a fixed array of max_records, kept in LRU
 * order (least recently stored evicted first), chained in two hash tables:
 * by (slot, engine hash) to apply removals and to find a parent's key, and
 * per key entry so a key knows which slots hold it and in which tier.
 * Key entries come from a second fixed array of the same size (a key needs
 * at least one record), so memory is fixed at creation.
 *
 * Our key of block i is XXH3(tokens of block i, seed = key of block i-1
 * mixed with the digest of the block's extra keys), the first block seeded by
 * the block size. It names the whole prefix and what vLLM folds into its own
 * block hash besides the tokens (vllm/v1/core/kv_cache_utils.py
 * hash_block_tokens: LoRA name, multimodal hashes, cache salt), whatever seed
 * or algorithm the engine hashes with.
 *
 * Groups (hybrid models, vllm/v1/core/kv_cache_coordinator.py): every KV-cache
 * group stores and evicts its own copy of a block, announced with its
 * group_idx, so a removal applies to the group it names only. Full-attention
 * groups need the whole prefix and decide a hit; sliding-window, chunked-local
 * and mamba groups keep only a tail, so their evictions of early blocks say
 * nothing about a hit. A slot holds a key when every deciding group it has
 * announced holds it (all its groups, when none is full attention).
 */
#include <string.h>

#include <msgpack.h>
#include <xxhash.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

#define NIL UINT32_MAX

typedef struct kv_rec {
    uint64_t ehash;
    uint32_t key_idx;
    uint32_t hnext;      /* (slot, ehash) chain */
    uint32_t knext;      /* records of the same key */
    uint32_t prev, next; /* LRU (head = most recent); free list uses next */
    uint8_t slot;
    uint8_t gpu;
    uint8_t group; /* group_idx (absent: 0; 63 and above share 63) */
} kv_rec_t;

typedef struct kv_key {
    uint64_t key;
    uint64_t gpu_mask, other_mask;
    uint32_t hnext; /* key chain; free list uses hnext */
    uint32_t recs;  /* first record */
} kv_key_t;

struct sched_kvev_index {
    pthread_mutex_t mu;
    uint32_t cap;
    kv_rec_t *recs;
    kv_key_t *keys;
    uint32_t *rbucket, *kbucket; /* heads; mask + 1 buckets each */
    uint32_t mask;
    uint32_t head, tail, rfree, kfree;
    uint64_t n_recs, n_keys;
    uint64_t slot_uid[SCHED_KVEV_MAX_SLOTS]; /* 0 = free */
    uint32_t slot_block_size[SCHED_KVEV_MAX_SLOTS];
    uint64_t slot_groups[SCHED_KVEV_MAX_SLOTS];  /* groups the slot announced */
    uint64_t slot_partial[SCHED_KVEV_MAX_SLOTS]; /* of those, the ones that keep a tail */
    uint32_t last_block_size;                    /* of any instance */
    uint64_t evicted, orphans, bad_events, remote, kept;
};

#define KEY_SEED  0x6b76657673ull
#define MAX_GROUP 63

static uint32_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (uint32_t)h;
}

static uint32_t rbucket_of(const sched_kvev_index_t *idx, int slot, uint64_t ehash)
{
    return mix(ehash * 31u + (uint64_t)slot) & idx->mask;
}

sched_status_t sched_kvev_index_create(size_t max_records, sched_kvev_index_t **out)
{
    sched_kvev_index_t *idx;
    size_t nb = 16;

    if (max_records < 64)
        max_records = 64;
    if (max_records > (1u << 26))
        max_records = 1u << 26;
    while (nb < max_records)
        nb <<= 1;
    idx = sched_calloc(1, sizeof(*idx));
    if (!idx)
        return SCHED_ERR_NO_MEMORY;
    idx->recs = sched_calloc(max_records, sizeof(kv_rec_t));
    idx->keys = sched_calloc(max_records, sizeof(kv_key_t));
    idx->rbucket = sched_malloc(nb * sizeof(uint32_t));
    idx->kbucket = sched_malloc(nb * sizeof(uint32_t));
    if (!idx->recs || !idx->keys || !idx->rbucket || !idx->kbucket)
        goto err_free;
    if (pthread_mutex_init(&idx->mu, NULL) != 0)
        goto err_free;
    idx->cap = (uint32_t)max_records;
    idx->mask = (uint32_t)(nb - 1);
    memset(idx->rbucket, 0xff, nb * sizeof(uint32_t));
    memset(idx->kbucket, 0xff, nb * sizeof(uint32_t));
    for (uint32_t i = 0; i < idx->cap; i++) {
        idx->recs[i].next = i + 1 < idx->cap ? i + 1 : NIL;
        idx->keys[i].hnext = i + 1 < idx->cap ? i + 1 : NIL;
    }
    idx->rfree = idx->kfree = 0;
    idx->head = idx->tail = NIL;
    *out = idx;
    return SCHED_OK;

err_free:
    sched_free(idx->recs);
    sched_free(idx->keys);
    sched_free(idx->rbucket);
    sched_free(idx->kbucket);
    sched_free(idx);
    return SCHED_ERR_NO_MEMORY;
}

void sched_kvev_index_destroy(sched_kvev_index_t *idx)
{
    if (!idx)
        return;
    pthread_mutex_destroy(&idx->mu);
    sched_free(idx->recs);
    sched_free(idx->keys);
    sched_free(idx->rbucket);
    sched_free(idx->kbucket);
    sched_free(idx);
}

static uint64_t block_key(uint64_t prev, const uint32_t *tokens, uint32_t block_size,
                          uint64_t extra)
{
    if (extra)
        prev = XXH3_64bits_withSeed(&extra, sizeof(extra), prev);
    return XXH3_64bits_withSeed(tokens, (size_t)block_size * sizeof(uint32_t), prev);
}

/* The digest of the extra-keys tuple vLLM builds for a text block: (lora,) on every block,
 * (lora, salt) or (salt,) on the first; 0 when the tuple would be empty (None). */
static uint64_t text_extra(const char *lora_name, const char *cache_salt, bool first)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t n = (lora_name ? 1 : 0) + (first && cache_salt && *cache_salt ? 1 : 0);
    uint64_t d = 0;

    if (n == 0)
        return 0;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, n);
    if (lora_name) {
        msgpack_pack_str(&pk, strlen(lora_name));
        msgpack_pack_str_body(&pk, lora_name, strlen(lora_name));
    }
    if (first && cache_salt && *cache_salt) {
        msgpack_pack_str(&pk, strlen(cache_salt));
        msgpack_pack_str_body(&pk, cache_salt, strlen(cache_salt));
    }
    if (sb.data)
        d = sched_kvev_extra_digest(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return d;
}

size_t sched_kvev_keys(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                       const char *lora_name, const char *cache_salt, uint64_t *out, size_t max_out)
{
    uint64_t h, first, rest;
    size_t n;

    if (block_size == 0)
        return 0;
    h = KEY_SEED ^ block_size;
    n = n_tokens / block_size;
    if (n > max_out)
        n = max_out;
    first = text_extra(lora_name, cache_salt, true);
    rest = text_extra(lora_name, cache_salt, false);
    for (size_t i = 0; i < n; i++) {
        h = block_key(h, tokens + i * block_size, block_size, i == 0 ? first : rest);
        out[i] = h;
    }
    return n;
}

/* ---- key entries ---- */

static uint32_t key_find(const sched_kvev_index_t *idx, uint64_t key)
{
    for (uint32_t k = idx->kbucket[mix(key) & idx->mask]; k != NIL; k = idx->keys[k].hnext)
        if (idx->keys[k].key == key)
            return k;
    return NIL;
}

static uint32_t key_get(sched_kvev_index_t *idx, uint64_t key)
{
    uint32_t k = key_find(idx, key), b;

    if (k != NIL)
        return k;
    k = idx->kfree; /* never NIL: keys ≤ records ≤ cap, and a record was freed first */
    idx->kfree = idx->keys[k].hnext;
    b = mix(key) & idx->mask;
    idx->keys[k] = (kv_key_t){.key = key, .hnext = idx->kbucket[b], .recs = NIL};
    idx->kbucket[b] = k;
    idx->n_keys++;
    return k;
}

/* The groups that decide a hit on <slot>: its full-attention groups, or all it announced
 * when it announced none of those. */
static uint64_t deciding_groups(const sched_kvev_index_t *idx, int slot)
{
    uint64_t full = idx->slot_groups[slot] & ~idx->slot_partial[slot];
    return full ? full : idx->slot_groups[slot];
}

static void key_refresh(sched_kvev_index_t *idx, uint32_t k)
{
    kv_key_t *e = &idx->keys[k];
    uint64_t seen = 0, gpu_g[SCHED_KVEV_MAX_SLOTS], any_g[SCHED_KVEV_MAX_SLOTS];
    uint32_t *pp;

    e->gpu_mask = e->other_mask = 0;
    for (uint32_t r = e->recs; r != NIL; r = idx->recs[r].knext) {
        const kv_rec_t *rec = &idx->recs[r];
        uint64_t bit = 1ull << rec->group;
        if (!(seen >> rec->slot & 1)) {
            seen |= 1ull << rec->slot;
            gpu_g[rec->slot] = any_g[rec->slot] = 0;
        }
        any_g[rec->slot] |= bit;
        if (rec->gpu)
            gpu_g[rec->slot] |= bit;
    }
    for (uint64_t m = seen; m; m &= m - 1) {
        int s = __builtin_ctzll(m);
        uint64_t need = deciding_groups(idx, s);
        if ((gpu_g[s] & need) == need)
            e->gpu_mask |= 1ull << s;
        else if ((any_g[s] & need) == need)
            e->other_mask |= 1ull << s;
    }
    if (e->recs != NIL)
        return;
    for (pp = &idx->kbucket[mix(e->key) & idx->mask]; *pp != k; pp = &idx->keys[*pp].hnext)
        ;
    *pp = e->hnext;
    e->hnext = idx->kfree;
    idx->kfree = k;
    idx->n_keys--;
}

/* ---- records ---- */

/* <gpu>, <group>: -1 = any. */
static uint32_t rec_find(const sched_kvev_index_t *idx, int slot, uint64_t ehash, int gpu,
                         int group)
{
    for (uint32_t r = idx->rbucket[rbucket_of(idx, slot, ehash)]; r != NIL; r = idx->recs[r].hnext)
        if (idx->recs[r].ehash == ehash && idx->recs[r].slot == slot &&
            (gpu < 0 || idx->recs[r].gpu == gpu) && (group < 0 || idx->recs[r].group == group))
            return r;
    return NIL;
}

/* A record of <ehash> on <slot>, in <group> if it has one there, else in any group (the
 * engine hashes a block alike in every group of one block size). */
static uint32_t rec_find_near(const sched_kvev_index_t *idx, int slot, uint64_t ehash, int gpu,
                              int group)
{
    uint32_t r = rec_find(idx, slot, ehash, gpu, group);
    return r != NIL ? r : rec_find(idx, slot, ehash, gpu, -1);
}

static int group_of(const sched_kvev_event_t *ev)
{
    return ev->group_idx < 0 ? 0 : ev->group_idx > MAX_GROUP ? MAX_GROUP : (int)ev->group_idx;
}

static void lru_unlink(sched_kvev_index_t *idx, uint32_t r)
{
    kv_rec_t *e = &idx->recs[r];
    if (e->prev != NIL)
        idx->recs[e->prev].next = e->next;
    else
        idx->head = e->next;
    if (e->next != NIL)
        idx->recs[e->next].prev = e->prev;
    else
        idx->tail = e->prev;
}

static void lru_push(sched_kvev_index_t *idx, uint32_t r)
{
    kv_rec_t *e = &idx->recs[r];
    e->prev = NIL;
    e->next = idx->head;
    if (idx->head != NIL)
        idx->recs[idx->head].prev = r;
    idx->head = r;
    if (idx->tail == NIL)
        idx->tail = r;
}

static void rec_free(sched_kvev_index_t *idx, uint32_t r)
{
    kv_rec_t *e = &idx->recs[r];
    uint32_t *pp, k = e->key_idx;

    for (pp = &idx->rbucket[rbucket_of(idx, e->slot, e->ehash)]; *pp != r;
         pp = &idx->recs[*pp].hnext)
        ;
    *pp = e->hnext;
    for (pp = &idx->keys[k].recs; *pp != r; pp = &idx->recs[*pp].knext)
        ;
    *pp = e->knext;
    lru_unlink(idx, r);
    e->next = idx->rfree;
    idx->rfree = r;
    idx->n_recs--;
    key_refresh(idx, k);
}

static void rec_store(sched_kvev_index_t *idx, int slot, uint64_t ehash, bool gpu, int group,
                      uint64_t key)
{
    uint32_t r = rec_find(idx, slot, ehash, gpu, group), k, b;
    kv_rec_t *e;

    if (r != NIL) {
        if (idx->keys[idx->recs[r].key_idx].key == key) {
            lru_unlink(idx, r);
            lru_push(idx, r);
            return;
        }
        rec_free(idx, r); /* same engine hash, other tokens: the engine reused it */
    }
    if (idx->rfree == NIL) {
        rec_free(idx, idx->tail);
        idx->evicted++;
    }
    r = idx->rfree;
    e = &idx->recs[r];
    idx->rfree = e->next;
    k = key_get(idx, key);
    b = rbucket_of(idx, slot, ehash);
    *e = (kv_rec_t){.ehash = ehash,
                    .key_idx = k,
                    .hnext = idx->rbucket[b],
                    .knext = idx->keys[k].recs,
                    .slot = (uint8_t)slot,
                    .gpu = gpu,
                    .group = (uint8_t)group};
    idx->rbucket[b] = r;
    idx->keys[k].recs = r;
    lru_push(idx, r);
    idx->n_recs++;
    key_refresh(idx, k);
}

int sched_kvev_index_slot(sched_kvev_index_t *idx, uint64_t uid)
{
    int free_slot = -1, found = -1;

    pthread_mutex_lock(&idx->mu);
    for (int s = 0; s < SCHED_KVEV_MAX_SLOTS; s++) {
        if (idx->slot_uid[s] == uid) {
            found = s;
            break;
        }
        if (idx->slot_uid[s] == 0 && free_slot < 0)
            free_slot = s;
    }
    if (found < 0 && free_slot >= 0) {
        idx->slot_uid[free_slot] = uid;
        idx->slot_block_size[free_slot] = 0;
        idx->slot_groups[free_slot] = idx->slot_partial[free_slot] = 0;
        found = free_slot;
    }
    pthread_mutex_unlock(&idx->mu);
    return found;
}

static void clear_locked(sched_kvev_index_t *idx, int slot)
{
    uint32_t r = idx->head;

    while (r != NIL) {
        uint32_t next = idx->recs[r].next;
        if (idx->recs[r].slot == slot)
            rec_free(idx, r);
        r = next;
    }
}

void sched_kvev_index_clear(sched_kvev_index_t *idx, int slot, bool release)
{
    if (slot < 0 || slot >= SCHED_KVEV_MAX_SLOTS)
        return;
    pthread_mutex_lock(&idx->mu);
    clear_locked(idx, slot);
    if (release) {
        idx->slot_uid[slot] = 0;
        idx->slot_block_size[slot] = 0;
        idx->slot_groups[slot] = idx->slot_partial[slot] = 0;
    }
    pthread_mutex_unlock(&idx->mu);
}

/*
 * A block copied to another tier, announced without its tokens: vLLM's
 * offloading connector publishes its CPU stores so (BlockStored with
 * medium "CPU", no parent, no token ids: vllm/distributed/kv_transfer/
 * kv_connector/v1/offloading_connector.py take_events), naming each block
 * by the engine hash its GPU copy was announced with. Such a block takes the
 * key of that copy; one the slot never announced cannot be named (orphan).
 */
static void apply_stored_copy(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev)
{
    int group = group_of(ev);

    for (size_t i = 0; i < ev->n_block_hashes; i++) {
        uint32_t r = rec_find_near(idx, slot, ev->block_hashes[i], -1, group);
        if (r == NIL) {
            idx->orphans++;
            continue;
        }
        rec_store(idx, slot, ev->block_hashes[i], false, group,
                  idx->keys[idx->recs[r].key_idx].key);
    }
}

/* Learn <group>'s kind on <slot>; when that changes which groups decide, the keys the slot
 * holds are judged again. */
static void learn_group(sched_kvev_index_t *idx, int slot, int group, sched_kvev_spec_t spec)
{
    uint64_t bit = 1ull << group, before = deciding_groups(idx, slot);

    idx->slot_groups[slot] |= bit;
    if (spec == SCHED_KVEV_SPEC_PARTIAL)
        idx->slot_partial[slot] |= bit;
    else if (spec == SCHED_KVEV_SPEC_FULL)
        idx->slot_partial[slot] &= ~bit;
    if (deciding_groups(idx, slot) == before)
        return;
    for (uint32_t r = idx->head; r != NIL; r = idx->recs[r].next)
        if (idx->recs[r].slot == slot)
            key_refresh(idx, idx->recs[r].key_idx);
}

static void apply_stored(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev)
{
    uint64_t key, lora_extra = 0;
    size_t n = ev->n_block_hashes;
    int group = group_of(ev);

    if (ev->locality == SCHED_KVEV_LOC_REMOTE) {
        /* Storage not local to the instance (vLLM's FS/OBJ tiers may share it with the
         * whole fleet): it is no reason to prefer this instance. */
        idx->remote += n;
        return;
    }
    learn_group(idx, slot, group, ev->spec);
    if (n > 0 && ev->n_token_ids == 0 && !ev->medium_gpu && !ev->has_parent) {
        apply_stored_copy(idx, slot, ev);
        return;
    }
    if (n == 0 || ev->block_size == 0 || ev->n_token_ids != n * ev->block_size) {
        idx->bad_events++;
        return;
    }
    if (ev->has_parent) {
        uint32_t p = rec_find_near(idx, slot, ev->parent_block_hash, -1, group);
        if (p == NIL) {
            /* Its prefix was never seen or already forgotten: the chain
             * cannot be named, so these blocks cannot be routed to. */
            idx->orphans++;
            return;
        }
        key = idx->keys[idx->recs[p].key_idx].key;
    } else {
        key = KEY_SEED ^ ev->block_size;
    }
    /* An engine that sends no extra_keys (older vLLM) still folded its LoRA name into every
     * block's hash; the salt and multimodal hashes it folded are unknown then. */
    if (!ev->extra_digests)
        lora_extra = text_extra(ev->lora_name, NULL, false);
    idx->slot_block_size[slot] = ev->block_size;
    idx->last_block_size = ev->block_size;
    for (size_t i = 0; i < n; i++) {
        key = block_key(key, ev->token_ids + i * ev->block_size, ev->block_size,
                        ev->extra_digests ? ev->extra_digests[i] : lora_extra);
        rec_store(idx, slot, ev->block_hashes[i], ev->medium_gpu, group, key);
    }
}

static void apply_removed(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev)
{
    int group = group_of(ev);

    if (ev->locality == SCHED_KVEV_LOC_REMOTE)
        return; /* never stored (apply_stored) */
    for (size_t i = 0; i < ev->n_block_hashes; i++) {
        uint32_t r;
        if (ev->remaining_copies && ev->remaining_copies[i] > 0) {
            /* One physical copy went; the engine still caches the hash (vLLM does not
             * deduplicate blocks, block_pool.py). */
            idx->kept++;
            continue;
        }
        r = rec_find(idx, slot, ev->block_hashes[i], ev->medium_gpu, group);
        if (r != NIL)
            rec_free(idx, r);
    }
}

void sched_kvev_index_apply(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev)
{
    if (slot < 0 || slot >= SCHED_KVEV_MAX_SLOTS)
        return;
    pthread_mutex_lock(&idx->mu);
    switch (ev->kind) {
    case SCHED_KVEV_STORED:
        apply_stored(idx, slot, ev);
        break;
    case SCHED_KVEV_REMOVED:
        apply_removed(idx, slot, ev);
        break;
    case SCHED_KVEV_CLEARED:
        clear_locked(idx, slot);
        break;
    }
    pthread_mutex_unlock(&idx->mu);
}

void sched_kvev_index_match(sched_kvev_index_t *idx, const uint64_t *keys, size_t n_keys,
                            const uint64_t *uids, size_t n_uids, double other_tier_weight,
                            size_t *depth_out, double *weighted_out)
{
    int slot_of[SCHED_KVEV_MAX_SLOTS];
    uint64_t alive = 0;
    size_t depth[SCHED_KVEV_MAX_SLOTS] = {0};
    double weighted[SCHED_KVEV_MAX_SLOTS] = {0};

    pthread_mutex_lock(&idx->mu);
    for (size_t u = 0; u < n_uids; u++) {
        slot_of[u < SCHED_KVEV_MAX_SLOTS ? u : 0] = -1;
        depth_out[u] = 0;
        weighted_out[u] = 0;
        if (u >= SCHED_KVEV_MAX_SLOTS)
            continue;
        for (int s = 0; s < SCHED_KVEV_MAX_SLOTS; s++)
            if (uids[u] && idx->slot_uid[s] == uids[u]) {
                slot_of[u] = s;
                alive |= 1ull << s;
            }
    }
    /* Consecutive from the first block: a slot drops out at its first miss. */
    for (size_t i = 0; i < n_keys && alive; i++) {
        uint32_t k = key_find(idx, keys[i]);
        uint64_t gpu = k == NIL ? 0 : idx->keys[k].gpu_mask;
        uint64_t other = k == NIL ? 0 : idx->keys[k].other_mask;
        alive &= gpu | other;
        for (uint64_t m = alive; m; m &= m - 1) {
            int s = __builtin_ctzll(m);
            depth[s]++;
            weighted[s] += (gpu >> s) & 1 ? 1.0 : other_tier_weight;
        }
    }
    for (size_t u = 0; u < n_uids && u < SCHED_KVEV_MAX_SLOTS; u++) {
        if (slot_of[u] < 0)
            continue;
        depth_out[u] = depth[slot_of[u]];
        weighted_out[u] = weighted[slot_of[u]];
    }
    pthread_mutex_unlock(&idx->mu);
}

uint32_t sched_kvev_index_block_size(sched_kvev_index_t *idx, uint64_t uid)
{
    uint32_t bs = 0;

    pthread_mutex_lock(&idx->mu);
    if (uid == 0)
        bs = idx->last_block_size;
    for (int s = 0; s < SCHED_KVEV_MAX_SLOTS; s++)
        if (uid && idx->slot_uid[s] == uid)
            bs = idx->slot_block_size[s];
    pthread_mutex_unlock(&idx->mu);
    return bs;
}

void sched_kvev_index_stats(sched_kvev_index_t *idx, sched_kvev_index_stats_t *out)
{
    pthread_mutex_lock(&idx->mu);
    *out = (sched_kvev_index_stats_t){.records = idx->n_recs,
                                      .keys = idx->n_keys,
                                      .capacity = idx->cap,
                                      .evicted = idx->evicted,
                                      .orphans = idx->orphans,
                                      .bad_events = idx->bad_events,
                                      .remote = idx->remote,
                                      .kept = idx->kept};
    pthread_mutex_unlock(&idx->mu);
}
