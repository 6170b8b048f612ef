/*
 * Prefix index for the prefix-aware policy.
 *
 * A prompt is cut into blocks of block_tokens tokens (4 bytes each) or,
 * without token ids, of block_tokens × 4 bytes of text. Block i's hash is
 * XXH3(block i, seed = hash of block i-1), so one hash names a whole
 * prefix. The index maps block hash → the last two instances that served
 * a prompt with that prefix.
 *
 * Memory is bounded: a fixed array of max_blocks entries kept in LRU
 * order, plus an open-addressing table (linear probing, backward-shift
 * deletion) of twice that many slots. Recording a prompt touches its
 * blocks deepest first, so shallow (widely shared) prefixes are the most
 * recent and are evicted last; the longest match is then found with a
 * binary search over the block list. Entries moved to the head recently
 * are not moved again (approximate LRU), which keeps recording cheap.
 */
#include <string.h>

#include <xxhash.h>

#include "sched_int.h"

#define NIL UINT32_MAX

typedef struct prefix_entry {
    uint64_t hash;
    uint64_t uid[2]; /* most recent first; 0 = empty */
    uint64_t stamp;  /* idx->ticks when last moved to the LRU head */
    uint32_t prev, next;
} prefix_entry_t;

struct sched_prefix_index {
    pthread_mutex_t mu;
    uint32_t cap, used;
    uint32_t head, tail; /* head = most recent */
    prefix_entry_t *entries;
    uint32_t mask;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    uint64_t ticks;  /* blocks recorded so far */
    uint64_t fresh;  /* entries moved within this many ticks stay put */
};

sched_status_t sched_prefix_create(size_t max_blocks, sched_prefix_index_t **out)
{
    sched_prefix_index_t *idx;
    size_t nslots = 16;

    if (max_blocks < 16)
        max_blocks = 16;
    if (max_blocks > (1u << 26))
        max_blocks = 1u << 26;
    while (nslots < max_blocks * 2)
        nslots <<= 1;
    idx = sched_calloc(1, sizeof(*idx));
    if (!idx)
        return SCHED_ERR_NO_MEMORY;
    idx->entries = sched_calloc(max_blocks, sizeof(prefix_entry_t));
    idx->slots = sched_calloc(nslots, sizeof(uint32_t));
    if (!idx->entries || !idx->slots)
        goto err_free;
    if (pthread_mutex_init(&idx->mu, NULL) != 0)
        goto err_free;
    idx->cap = (uint32_t)max_blocks;
    idx->fresh = max_blocks / 8;
    idx->mask = (uint32_t)(nslots - 1);
    idx->head = idx->tail = NIL;
    *out = idx;
    return SCHED_OK;

err_free:
    sched_free(idx->entries);
    sched_free(idx->slots);
    sched_free(idx);
    return SCHED_ERR_NO_MEMORY;
}

void sched_prefix_destroy(sched_prefix_index_t *idx)
{
    if (!idx)
        return;
    pthread_mutex_destroy(&idx->mu);
    sched_free(idx->entries);
    sched_free(idx->slots);
    sched_free(idx);
}

size_t sched_prefix_hash_request(const sched_request_t *req, unsigned block_tokens, uint64_t *out,
                                 size_t max_out)
{
    const unsigned char *data;
    size_t len, bsize, n;
    uint64_t h = 0;

    if (req->tokens && req->n_tokens) {
        data = (const unsigned char *)req->tokens;
        len = req->n_tokens * sizeof(uint32_t);
    } else if (req->text && req->text_len) {
        data = (const unsigned char *)req->text;
        len = req->text_len;
    } else {
        return 0;
    }
    bsize = (size_t)(block_tokens ? block_tokens : 16) * 4u;
    n = len / bsize;
    if (n > max_out)
        n = max_out;
    for (size_t i = 0; i < n; i++) {
        h = XXH3_64bits_withSeed(data + i * bsize, bsize, h);
        out[i] = h ? h : 1; /* 0 is never a key */
    }
    return n;
}

static uint32_t slot_of(const sched_prefix_index_t *idx, uint64_t hash)
{
    return (uint32_t)(hash ^ (hash >> 29)) & idx->mask;
}

/* Entry index for <hash>, or NIL. */
static uint32_t find(const sched_prefix_index_t *idx, uint64_t hash)
{
    uint32_t s = slot_of(idx, hash);

    for (;;) {
        uint32_t e = idx->slots[s];
        if (e == 0)
            return NIL;
        if (idx->entries[e - 1].hash == hash)
            return e - 1;
        s = (s + 1) & idx->mask;
    }
}

static void lru_unlink(sched_prefix_index_t *idx, uint32_t e)
{
    prefix_entry_t *en = &idx->entries[e];

    if (en->prev != NIL)
        idx->entries[en->prev].next = en->next;
    else
        idx->head = en->next;
    if (en->next != NIL)
        idx->entries[en->next].prev = en->prev;
    else
        idx->tail = en->prev;
    en->prev = en->next = NIL;
}

static void lru_push_head(sched_prefix_index_t *idx, uint32_t e)
{
    prefix_entry_t *en = &idx->entries[e];

    en->prev = NIL;
    en->next = idx->head;
    if (idx->head != NIL)
        idx->entries[idx->head].prev = e;
    idx->head = e;
    if (idx->tail == NIL)
        idx->tail = e;
}

/* Remove <hash>'s slot with backward-shift deletion (no tombstones). */
static void table_delete(sched_prefix_index_t *idx, uint64_t hash)
{
    uint32_t i = slot_of(idx, hash), j;

    while (idx->slots[i] && idx->entries[idx->slots[i] - 1].hash != hash)
        i = (i + 1) & idx->mask;
    if (!idx->slots[i])
        return;
    idx->slots[i] = 0;
    j = i;
    for (;;) {
        uint32_t k;
        bool stays;
        j = (j + 1) & idx->mask;
        if (!idx->slots[j])
            break;
        k = slot_of(idx, idx->entries[idx->slots[j] - 1].hash);
        /* the entry at j may stay if its home k lies cyclically in (i, j] */
        stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        idx->slots[i] = idx->slots[j];
        idx->slots[j] = 0;
        i = j;
    }
}

static void table_insert(sched_prefix_index_t *idx, uint32_t e)
{
    uint32_t s = slot_of(idx, idx->entries[e].hash);

    while (idx->slots[s])
        s = (s + 1) & idx->mask;
    idx->slots[s] = e + 1;
}

size_t sched_prefix_match(sched_prefix_index_t *idx, const uint64_t *hashes, size_t n,
                          uint64_t uids_out[2])
{
    size_t lo = 0, hi = n; /* answer in [lo, hi]: blocks [0, lo) known present */
    uint32_t best = NIL;

    uids_out[0] = uids_out[1] = 0;
    if (n == 0)
        return 0;
    pthread_mutex_lock(&idx->mu);
    /* Try the full prompt first: repeated prompts are the common hit. */
    best = find(idx, hashes[n - 1]);
    if (best != NIL) {
        lo = n;
    } else {
        hi = n - 1;
        while (lo < hi) {
            size_t mid = lo + (hi - lo + 1) / 2; /* candidate length in blocks */
            uint32_t e = find(idx, hashes[mid - 1]);
            if (e != NIL) {
                lo = mid;
                best = e;
            } else {
                hi = mid - 1;
            }
        }
    }
    if (best != NIL) {
        uids_out[0] = idx->entries[best].uid[0];
        uids_out[1] = idx->entries[best].uid[1];
    }
    pthread_mutex_unlock(&idx->mu);
    return best != NIL ? lo : 0;
}

void sched_prefix_record(sched_prefix_index_t *idx, const uint64_t *hashes, size_t n, uint64_t uid)
{
    pthread_mutex_lock(&idx->mu);
    for (size_t i = n; i-- > 0;) {
        uint32_t e = find(idx, hashes[i]);
        prefix_entry_t *en;
        if (e == NIL) {
            if (idx->used < idx->cap) {
                e = idx->used++;
            } else {
                e = idx->tail;
                lru_unlink(idx, e);
                table_delete(idx, idx->entries[e].hash);
            }
            en = &idx->entries[e];
            en->hash = hashes[i];
            en->uid[0] = uid;
            en->uid[1] = 0;
            en->prev = en->next = NIL;
            en->stamp = ++idx->ticks;
            table_insert(idx, e);
            lru_push_head(idx, e);
            continue;
        }
        en = &idx->entries[e];
        if (en->uid[0] != uid) {
            en->uid[1] = en->uid[0];
            en->uid[0] = uid;
        }
        /* Approximate LRU: an entry moved to the head during the last
         * cap/8 recorded blocks is still far from eviction; leave it, so
         * hot shared prefixes cost one lookup per request. */
        idx->ticks++;
        if (idx->head != e && en->stamp + idx->fresh < idx->ticks) {
            en->stamp = idx->ticks;
            lru_unlink(idx, e);
            lru_push_head(idx, e);
        }
    }
    pthread_mutex_unlock(&idx->mu);
}

size_t sched_prefix_size(sched_prefix_index_t *idx)
{
    size_t n;

    pthread_mutex_lock(&idx->mu);
    n = idx->used;
    pthread_mutex_unlock(&idx->mu);
    return n;
}

size_t sched_prefix_capacity(sched_prefix_index_t *idx)
{
    return idx->cap;
}
