/*
 * Bounded index of the blocks the engines report as cached.
 *
 * A record is one residency: (instance slot, engine block hash, tier) →
 * our key. Records come from a fixed array of max_records, kept in LRU
 * order (least recently stored evicted first), chained in two hash tables:
 * by (slot, engine hash) to apply removals and to find a parent's key, and
 * per key entry so a key knows which slots hold it and in which tier.
 * Key entries come from a second fixed array of the same size (a key needs
 * at least one record), so memory is fixed at creation.
 *
 * Our key of block i is XXH3(tokens of block i, seed = key of block i-1),
 * the first block seeded by the LoRA name and block size. It names the
 * whole prefix, whatever seed or algorithm the engine hashes with.
 */
#include <string.h>

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
    uint32_t last_block_size; /* of any instance */
    uint64_t evicted, orphans, bad_events;
};

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

size_t sched_kvev_keys(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                       const char *lora_name, uint64_t *out, size_t max_out)
{
    uint64_t h;
    size_t n;

    if (block_size == 0)
        return 0;
    h = XXH3_64bits_withSeed(lora_name ? lora_name : "", lora_name ? strlen(lora_name) : 0,
                             0x6b76657673ull ^ block_size);
    n = n_tokens / block_size;
    if (n > max_out)
        n = max_out;
    for (size_t i = 0; i < n; i++) {
        h = XXH3_64bits_withSeed(tokens + i * block_size, (size_t)block_size * sizeof(uint32_t), h);
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

static void key_refresh(sched_kvev_index_t *idx, uint32_t k)
{
    kv_key_t *e = &idx->keys[k];
    uint32_t *pp;

    e->gpu_mask = e->other_mask = 0;
    for (uint32_t r = e->recs; r != NIL; r = idx->recs[r].knext) {
        if (idx->recs[r].gpu)
            e->gpu_mask |= 1ull << idx->recs[r].slot;
        else
            e->other_mask |= 1ull << idx->recs[r].slot;
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

static uint32_t rec_find(const sched_kvev_index_t *idx, int slot, uint64_t ehash, int gpu)
{
    for (uint32_t r = idx->rbucket[rbucket_of(idx, slot, ehash)]; r != NIL; r = idx->recs[r].hnext)
        if (idx->recs[r].ehash == ehash && idx->recs[r].slot == slot &&
            (gpu < 0 || idx->recs[r].gpu == gpu))
            return r;
    return NIL;
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

static void rec_store(sched_kvev_index_t *idx, int slot, uint64_t ehash, bool gpu, uint64_t key)
{
    uint32_t r = rec_find(idx, slot, ehash, gpu), k, b;
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
                    .gpu = gpu};
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
    for (size_t i = 0; i < ev->n_block_hashes; i++) {
        uint32_t r = rec_find(idx, slot, ev->block_hashes[i], -1);
        if (r == NIL) {
            idx->orphans++;
            continue;
        }
        rec_store(idx, slot, ev->block_hashes[i], false, idx->keys[idx->recs[r].key_idx].key);
    }
}

static void apply_stored(sched_kvev_index_t *idx, int slot, const sched_kvev_event_t *ev)
{
    uint64_t key;
    size_t n = ev->n_block_hashes;

    if (n > 0 && ev->n_token_ids == 0 && !ev->medium_gpu && !ev->has_parent) {
        apply_stored_copy(idx, slot, ev);
        return;
    }
    if (n == 0 || ev->block_size == 0 || ev->n_token_ids != n * ev->block_size) {
        idx->bad_events++;
        return;
    }
    if (ev->has_parent) {
        uint32_t p = rec_find(idx, slot, ev->parent_block_hash, -1);
        if (p == NIL) {
            /* Its prefix was never seen or already forgotten: the chain
             * cannot be named, so these blocks cannot be routed to. */
            idx->orphans++;
            return;
        }
        key = idx->keys[idx->recs[p].key_idx].key;
    } else {
        key = 0;
    }
    idx->slot_block_size[slot] = ev->block_size;
    idx->last_block_size = ev->block_size;
    for (size_t i = 0; i < n; i++) {
        uint64_t k;
        if (i == 0 && !ev->has_parent)
            sched_kvev_keys(ev->token_ids, ev->block_size, ev->block_size, ev->lora_name, &k, 1);
        else
            k = XXH3_64bits_withSeed(ev->token_ids + i * ev->block_size,
                                     (size_t)ev->block_size * sizeof(uint32_t), key);
        key = k;
        rec_store(idx, slot, ev->block_hashes[i], ev->medium_gpu, key);
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
        for (size_t i = 0; i < ev->n_block_hashes; i++) {
            uint32_t r = rec_find(idx, slot, ev->block_hashes[i], ev->medium_gpu);
            if (r != NIL)
                rec_free(idx, r);
        }
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
                                      .bad_events = idx->bad_events};
    pthread_mutex_unlock(&idx->mu);
}
