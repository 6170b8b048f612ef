/*
 * kvt_prefix_cache.c -- chained xxh3 block hashes, hash -> page map (open
 * addressing), ref-counted pages and an LRU free queue that evicts the least
 * recently released unreferenced page.
 */
#include "kvt/kvt_prefix_cache.h"

#include <pthread.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define NIL         UINT32_MAX
#define SMALL_BLOCK 256u /* blocks up to this many tokens hash from a stack buffer */

/* ---- hashing ---------------------------------------------------------------- */

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_tokens_le(uint8_t *p, const uint32_t *tokens, uint32_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, tokens, (size_t)n * 4);
#else
    for (uint32_t i = 0; i < n; i++) {
        p[4 * i] = (uint8_t)tokens[i];
        p[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
        p[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
        p[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
    }
#endif
}

kvt_block_hash_t kvt_prefix_hash_next(kvt_block_hash_t prev, const uint32_t *tokens,
                                      uint32_t block_size)
{
    if (block_size <= SMALL_BLOCK) {
        uint8_t buf[8 + 4 * SMALL_BLOCK];
        put_le64(buf, prev);
        put_tokens_le(buf + 8, tokens, block_size);
        return XXH3_64bits(buf, 8 + (size_t)block_size * 4);
    } else {
        /* same bytes, streamed in slices */
        XXH3_state_t st;
        uint8_t buf[4 * SMALL_BLOCK];
        put_le64(buf, prev);
        XXH3_64bits_reset(&st);
        XXH3_64bits_update(&st, buf, 8);
        for (uint32_t off = 0; off < block_size; off += SMALL_BLOCK) {
            uint32_t n = block_size - off < SMALL_BLOCK ? block_size - off : SMALL_BLOCK;
            put_tokens_le(buf, tokens + off, n);
            XXH3_64bits_update(&st, buf, (size_t)n * 4);
        }
        return XXH3_64bits_digest(&st);
    }
}

kvt_status_t kvt_prefix_hash_blocks(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                                    uint64_t seed, kvt_block_hash_t *out, size_t max_out,
                                    size_t *nout)
{
    size_t nblocks;
    kvt_block_hash_t h = seed;

    if (block_size == 0 || block_size > KVT_PREFIX_MAX_BLOCK || nout == NULL ||
        (ntokens > 0 && tokens == NULL))
        return KVT_ERR_INVALID;
    nblocks = ntokens / block_size;
    if (nblocks > max_out)
        nblocks = max_out;
    if (nblocks > 0 && out == NULL)
        return KVT_ERR_INVALID;
    for (size_t i = 0; i < nblocks; i++) {
        h = kvt_prefix_hash_next(h, tokens + i * block_size, block_size);
        out[i] = h;
    }
    *nout = nblocks;
    return KVT_OK;
}

/* ---- cache ------------------------------------------------------------------ */

typedef struct slot {
    uint64_t hash;
    uint32_t page1; /* page + 1; 0 = empty */
} slot_t;

struct kvt_prefix_cache {
    pthread_mutex_t lock;
    uint32_t npages;
    uint32_t block_size;
    uint64_t seed;
    uint32_t *ref;
    uint32_t *pin;
    uint8_t *has_hash;
    uint64_t *hash;
    uint32_t *prev, *next; /* LRU free queue links */
    uint32_t head, tail;   /* head = evicted first */
    uint32_t nfree;
    uint32_t ncached;
    uint32_t npinned;
    slot_t *slots;
    uint64_t mask;
    uint64_t queries, hits, evictions, double_free_total;
};

static uint64_t slot_index(const kvt_prefix_cache_t *pc, uint64_t h)
{
    /* hashes are already uniformly mixed */
    return h & pc->mask;
}

static uint32_t map_get(const kvt_prefix_cache_t *pc, uint64_t h)
{
    for (uint64_t i = slot_index(pc, h);; i = (i + 1) & pc->mask) {
        if (pc->slots[i].page1 == 0)
            return NIL;
        if (pc->slots[i].hash == h)
            return pc->slots[i].page1 - 1;
    }
}

static void map_put(kvt_prefix_cache_t *pc, uint64_t h, uint32_t page)
{
    uint64_t i = slot_index(pc, h);
    while (pc->slots[i].page1 != 0)
        i = (i + 1) & pc->mask;
    pc->slots[i].hash = h;
    pc->slots[i].page1 = page + 1;
}

/* Linear-probing delete with backward shift (no tombstones). */
static void map_del(kvt_prefix_cache_t *pc, uint64_t h)
{
    uint64_t i = slot_index(pc, h), j;

    while (pc->slots[i].page1 != 0 && pc->slots[i].hash != h)
        i = (i + 1) & pc->mask;
    if (pc->slots[i].page1 == 0)
        return;
    j = i;
    for (;;) {
        uint64_t k;
        j = (j + 1) & pc->mask;
        if (pc->slots[j].page1 == 0)
            break;
        k = slot_index(pc, pc->slots[j].hash);
        /* move j back to i unless its home k lies cyclically in (i, j] */
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            pc->slots[i] = pc->slots[j];
            i = j;
        }
    }
    pc->slots[i].page1 = 0;
    pc->slots[i].hash = 0;
}

static void lru_unlink(kvt_prefix_cache_t *pc, uint32_t p)
{
    if (pc->prev[p] != NIL)
        pc->next[pc->prev[p]] = pc->next[p];
    else
        pc->head = pc->next[p];
    if (pc->next[p] != NIL)
        pc->prev[pc->next[p]] = pc->prev[p];
    else
        pc->tail = pc->prev[p];
    pc->prev[p] = pc->next[p] = NIL;
    pc->nfree--;
}

static void lru_append(kvt_prefix_cache_t *pc, uint32_t p)
{
    pc->prev[p] = pc->tail;
    pc->next[p] = NIL;
    if (pc->tail != NIL)
        pc->next[pc->tail] = p;
    else
        pc->head = p;
    pc->tail = p;
    pc->nfree++;
}

kvt_status_t kvt_prefix_cache_create(const kvt_prefix_cache_params_t *p, kvt_prefix_cache_t **out)
{
    kvt_prefix_cache_t *pc;
    uint64_t cap = 16;

    if (p == NULL || out == NULL || p->npages == 0 || p->npages >= NIL - 1 || p->block_size == 0 ||
        p->block_size > KVT_PREFIX_MAX_BLOCK)
        return KVT_ERR_INVALID;
    while (cap < (uint64_t)p->npages * 2)
        cap *= 2;
    pc = kvt_calloc(1, sizeof(*pc));
    if (pc == NULL)
        return KVT_ERR_NOMEM;
    pc->npages = p->npages;
    pc->block_size = p->block_size;
    pc->seed = p->seed;
    pc->ref = kvt_calloc(p->npages, sizeof(uint32_t));
    pc->pin = kvt_calloc(p->npages, sizeof(uint32_t));
    pc->has_hash = kvt_calloc(p->npages, 1);
    pc->hash = kvt_calloc(p->npages, sizeof(uint64_t));
    pc->prev = kvt_malloc((size_t)p->npages * sizeof(uint32_t));
    pc->next = kvt_malloc((size_t)p->npages * sizeof(uint32_t));
    pc->slots = kvt_calloc(cap, sizeof(slot_t));
    if (pc->ref == NULL || pc->pin == NULL || pc->has_hash == NULL || pc->hash == NULL ||
        pc->prev == NULL || pc->next == NULL || pc->slots == NULL) {
        kvt_prefix_cache_destroy(pc);
        return KVT_ERR_NOMEM;
    }
    pc->mask = cap - 1;
    pc->head = pc->tail = NIL;
    for (uint32_t i = 0; i < p->npages; i++)
        lru_append(pc, i);
    pthread_mutex_init(&pc->lock, NULL);
    *out = pc;
    return KVT_OK;
}

void kvt_prefix_cache_destroy(kvt_prefix_cache_t *pc)
{
    if (pc == NULL)
        return;
    if (pc->slots != NULL && pc->next != NULL) /* fully constructed */
        pthread_mutex_destroy(&pc->lock);
    kvt_free(pc->slots);
    kvt_free(pc->next);
    kvt_free(pc->prev);
    kvt_free(pc->hash);
    kvt_free(pc->has_hash);
    kvt_free(pc->pin);
    kvt_free(pc->ref);
    kvt_free(pc);
}

uint32_t kvt_prefix_cache_block_size(const kvt_prefix_cache_t *pc)
{
    return pc->block_size;
}

void kvt_prefix_cache_stats(kvt_prefix_cache_t *pc, kvt_prefix_cache_stats_t *out)
{
    pthread_mutex_lock(&pc->lock);
    out->npages = pc->npages;
    out->free_pages = pc->nfree;
    out->cached_pages = pc->ncached;
    out->pinned_pages = pc->npinned;
    out->queries = pc->queries;
    out->hits = pc->hits;
    out->evictions = pc->evictions;
    out->double_free_total = pc->double_free_total;
    pthread_mutex_unlock(&pc->lock);
}

static void drop_hash(kvt_prefix_cache_t *pc, uint32_t page)
{
    if (!pc->has_hash[page])
        return;
    map_del(pc, pc->hash[page]);
    pc->has_hash[page] = 0;
    pc->ncached--;
}

kvt_status_t kvt_prefix_cache_alloc(kvt_prefix_cache_t *pc, uint32_t n, uint32_t *pages_out)
{
    if (pc == NULL || (n > 0 && pages_out == NULL))
        return KVT_ERR_INVALID;
    if (n > pc->npages)
        return KVT_ERR_TOO_LARGE;
    pthread_mutex_lock(&pc->lock);
    if (pc->nfree < n) {
        pthread_mutex_unlock(&pc->lock);
        return KVT_ERR_NOSPACE;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = pc->head;
        lru_unlink(pc, p);
        if (pc->has_hash[p]) {
            drop_hash(pc, p);
            pc->evictions++;
        }
        pc->ref[p] = 1;
        pages_out[i] = p;
    }
    pthread_mutex_unlock(&pc->lock);
    return KVT_OK;
}

kvt_status_t kvt_prefix_cache_insert(kvt_prefix_cache_t *pc, uint32_t page, kvt_block_hash_t hash,
                                     uint32_t *existing_out)
{
    uint32_t cur;
    kvt_status_t status = KVT_OK;

    if (pc == NULL)
        return KVT_ERR_INVALID;
    if (page >= pc->npages)
        return KVT_ERR_BOUNDS;
    pthread_mutex_lock(&pc->lock);
    if (pc->ref[page] == 0) {
        status = KVT_ERR_STATE;
    } else if ((cur = map_get(pc, hash)) != NIL) {
        if (cur != page) {
            status = KVT_ERR_EXISTS;
            if (existing_out != NULL)
                *existing_out = cur;
        }
    } else {
        drop_hash(pc, page);
        map_put(pc, hash, page);
        pc->hash[page] = hash;
        pc->has_hash[page] = 1;
        pc->ncached++;
    }
    pthread_mutex_unlock(&pc->lock);
    return status;
}

/* Lock held. */
static void touch_locked(kvt_prefix_cache_t *pc, uint32_t p)
{
    if (pc->ref[p]++ == 0)
        lru_unlink(pc, p);
}

static kvt_status_t release_locked(kvt_prefix_cache_t *pc, uint32_t p)
{
    if (pc->ref[p] == 0 || pc->ref[p] == pc->pin[p]) {
        pc->double_free_total++;
        return KVT_ERR_DOUBLE_FREE;
    }
    if (--pc->ref[p] == 0)
        lru_append(pc, p);
    return KVT_OK;
}

typedef enum { PC_TOUCH, PC_RELEASE, PC_PIN, PC_UNPIN } pc_op_t;

static kvt_status_t pc_batch(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n, pc_op_t op)
{
    kvt_status_t first = KVT_OK;

    if (pc == NULL || (n > 0 && pages == NULL))
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pc->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = pages[i];
        kvt_status_t st = KVT_OK;
        if (p >= pc->npages) {
            st = KVT_ERR_BOUNDS;
        } else {
            switch (op) {
            case PC_TOUCH:
                touch_locked(pc, p);
                break;
            case PC_PIN:
                touch_locked(pc, p);
                if (pc->pin[p]++ == 0)
                    pc->npinned++;
                break;
            case PC_RELEASE:
                st = release_locked(pc, p);
                break;
            case PC_UNPIN:
                if (pc->pin[p] == 0) {
                    st = KVT_ERR_UNDERFLOW;
                    break;
                }
                if (--pc->pin[p] == 0)
                    pc->npinned--;
                if (--pc->ref[p] == 0)
                    lru_append(pc, p);
                break;
            }
        }
        if (st != KVT_OK && first == KVT_OK)
            first = st;
    }
    pthread_mutex_unlock(&pc->lock);
    return first;
}

kvt_status_t kvt_prefix_cache_touch(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n)
{
    return pc_batch(pc, pages, n, PC_TOUCH);
}

kvt_status_t kvt_prefix_cache_release(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n)
{
    return pc_batch(pc, pages, n, PC_RELEASE);
}

kvt_status_t kvt_prefix_cache_pin(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n)
{
    return pc_batch(pc, pages, n, PC_PIN);
}

kvt_status_t kvt_prefix_cache_unpin(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n)
{
    return pc_batch(pc, pages, n, PC_UNPIN);
}

kvt_status_t kvt_prefix_cache_lookup(kvt_prefix_cache_t *pc, const kvt_block_hash_t *hashes,
                                     size_t nhash, uint32_t *pages_out, size_t *nmatched)
{
    size_t i;

    if (pc == NULL || nmatched == NULL || (nhash > 0 && (hashes == NULL || pages_out == NULL)))
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pc->lock);
    for (i = 0; i < nhash; i++) {
        uint32_t p = map_get(pc, hashes[i]);
        if (p == NIL)
            break;
        touch_locked(pc, p);
        pages_out[i] = p;
    }
    pc->queries += nhash;
    pc->hits += i;
    pthread_mutex_unlock(&pc->lock);
    *nmatched = i;
    return KVT_OK;
}

kvt_status_t kvt_prefix_cache_peek(kvt_prefix_cache_t *pc, kvt_block_hash_t hash,
                                   uint32_t *page_out)
{
    uint32_t p;

    if (pc == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pc->lock);
    p = map_get(pc, hash);
    pthread_mutex_unlock(&pc->lock);
    if (p == NIL)
        return KVT_ERR_NOT_FOUND;
    if (page_out != NULL)
        *page_out = p;
    return KVT_OK;
}

kvt_status_t kvt_prefix_cache_forget(kvt_prefix_cache_t *pc, uint32_t page)
{
    if (pc == NULL)
        return KVT_ERR_INVALID;
    if (page >= pc->npages)
        return KVT_ERR_BOUNDS;
    pthread_mutex_lock(&pc->lock);
    drop_hash(pc, page);
    pthread_mutex_unlock(&pc->lock);
    return KVT_OK;
}

#define MATCH_BATCH 32 /* blocks hashed outside the lock per round */

kvt_status_t kvt_prefix_cache_match(kvt_prefix_cache_t *pc, const uint32_t *tokens, size_t ntokens,
                                    uint32_t *pages_out, size_t *nmatched, size_t *matched_tokens)
{
    kvt_block_hash_t hb[MATCH_BATCH];
    size_t nblocks, i = 0;
    kvt_block_hash_t h;
    int miss = 0;

    if (pc == NULL || nmatched == NULL || (ntokens > 0 && tokens == NULL))
        return KVT_ERR_INVALID;
    nblocks = ntokens / pc->block_size;
    if (nblocks > 0 && pages_out == NULL)
        return KVT_ERR_INVALID;
    h = pc->seed;
    /* hash a batch without the lock, then look it up under the lock; pages
     * matched so far are held (ref+1), so they survive between rounds */
    while (i < nblocks && !miss) {
        size_t nb = nblocks - i < MATCH_BATCH ? nblocks - i : MATCH_BATCH, k;
        for (k = 0; k < nb; k++) {
            h = kvt_prefix_hash_next(h, tokens + (i + k) * pc->block_size, pc->block_size);
            hb[k] = h;
        }
        pthread_mutex_lock(&pc->lock);
        for (k = 0; k < nb; k++) {
            uint32_t p = map_get(pc, hb[k]);
            if (p == NIL) {
                miss = 1;
                break;
            }
            touch_locked(pc, p);
            pages_out[i + k] = p;
        }
        pc->hits += k;
        pthread_mutex_unlock(&pc->lock);
        i += k;
    }
    pthread_mutex_lock(&pc->lock);
    pc->queries += nblocks;
    pthread_mutex_unlock(&pc->lock);
    *nmatched = i;
    if (matched_tokens != NULL)
        *matched_tokens = i * pc->block_size;
    return KVT_OK;
}

kvt_status_t kvt_prefix_cache_page_info(kvt_prefix_cache_t *pc, uint32_t page, uint32_t *ref_out,
                                        int *has_hash_out, kvt_block_hash_t *hash_out)
{
    if (pc == NULL)
        return KVT_ERR_INVALID;
    if (page >= pc->npages)
        return KVT_ERR_BOUNDS;
    pthread_mutex_lock(&pc->lock);
    if (ref_out != NULL)
        *ref_out = pc->ref[page];
    if (has_hash_out != NULL)
        *has_hash_out = pc->has_hash[page];
    if (hash_out != NULL)
        *hash_out = pc->hash[page];
    pthread_mutex_unlock(&pc->lock);
    return KVT_OK;
}
