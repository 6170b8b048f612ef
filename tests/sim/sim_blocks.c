/*
 * KV capacity model and prefix cache (the vLLM block manager in miniature).
 *
 * The KV space is total_blocks blocks of --block-size tokens. A full prompt
 * block gets a chained hash (hash of the previous block's hash and its token
 * ids). Blocks are ref-counted; a block whose count drops to zero goes to the
 * tail of an LRU free queue but keeps its hash, so a later request with the
 * same prefix finds it (a hit) until it is evicted for a new allocation.
 * Blocks never used yet are not on any list (a "fresh" range), so a huge
 * --kv-capacity-tokens costs only what is touched. Everything here runs
 * under the engine lock.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_int.h"

typedef struct blk {
    int ref;
    int has_hash;
    uint64_t hash;
    int prev, next; /* free queue (LRU: head = evict first) */
    int hnext;      /* hash bucket chain */
    int in_free;
} blk_t;

static blk_t *blks;
static int nblk, nused;
static int free_head = -1, free_tail = -1;
static int *buckets; /* block index + 1, 0 = empty (calloc'd: untouched pages stay free) */
static int nbuckets;
static int nfresh; /* blocks [nfresh, nblk) were never used */

static void free_unlink(int b)
{
    blk_t *k = &blks[b];
    if (!k->in_free)
        return;
    if (k->prev >= 0)
        blks[k->prev].next = k->next;
    else
        free_head = k->next;
    if (k->next >= 0)
        blks[k->next].prev = k->prev;
    else
        free_tail = k->prev;
    k->prev = k->next = -1;
    k->in_free = 0;
}

static void free_append(int b)
{
    blk_t *k = &blks[b];
    k->prev = free_tail;
    k->next = -1;
    if (free_tail >= 0)
        blks[free_tail].next = b;
    else
        free_head = b;
    free_tail = b;
    k->in_free = 1;
}

static void hash_remove(int b)
{
    blk_t *k = &blks[b];
    if (!k->has_hash)
        return;
    sim_kvev_removed("GPU", k->hash); /* a cached block evicted (vLLM: BlockRemoved) */
    int *pp = &buckets[k->hash % (uint64_t)nbuckets];
    while (*pp) {
        if (*pp - 1 == b) {
            *pp = k->hnext;
            break;
        }
        pp = &blks[*pp - 1].hnext;
    }
    k->has_hash = 0;
    k->hnext = 0;
}

static int hash_find(uint64_t h)
{
    for (int b = buckets[h % (uint64_t)nbuckets]; b; b = blks[b - 1].hnext)
        if (blks[b - 1].hash == h)
            return b - 1;
    return -1;
}

static void hash_insert(int b, uint64_t h)
{
    blk_t *k = &blks[b];
    k->hash = h;
    k->has_hash = 1;
    size_t i = h % (uint64_t)nbuckets;
    k->hnext = buckets[i];
    buckets[i] = b + 1;
}

int sim_blocks_init(int total_blocks)
{
    nblk = total_blocks;
    nbuckets = total_blocks * 2 + 1;
    nfresh = 0;
    blks = calloc((size_t)nblk, sizeof(*blks));
    buckets = calloc((size_t)nbuckets, sizeof(int));
    if (!blks || !buckets) {
        free(blks);
        free(buckets);
        blks = NULL;
        buckets = NULL;
        return -1;
    }
    return 0;
}

void sim_blocks_fini(void)
{
    free(blks);
    free(buckets);
    blks = NULL;
    buckets = NULL;
    nblk = nused = nfresh = 0;
    free_head = free_tail = -1;
}

/* <salt>: the extra key of the prompt's first block (vLLM folds the cache_salt into that
 * block's hash only, vllm/v1/core/kv_cache_utils.py), else NULL. */
static uint64_t block_hash(uint64_t prev, const uint32_t *ids, int n, const char *salt)
{
    XXH64_state_t *st = XXH64_createState();
    uint64_t h;
    if (!st)
        return prev * 31 + 7;
    XXH64_reset(st, 0xb10c);
    XXH64_update(st, &prev, sizeof(prev));
    XXH64_update(st, ids, (size_t)n * sizeof(uint32_t));
    if (salt)
        XXH64_update(st, salt, strlen(salt) + 1);
    h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

size_t sim_blocks_hashes(const sim_tokens_t *prompt, size_t max, uint64_t *out)
{
    size_t bs = (size_t)sim_cfg.block_size, n = prompt->n / bs;
    uint64_t h = 0;
    if (n > max)
        n = max;
    for (size_t i = 0; i < n; i++)
        out[i] = h = block_hash(h, prompt->ids + i * bs, (int)bs, i ? NULL : prompt->cache_salt);
    return n;
}

int sim_blocks_needed(size_t n_tokens)
{
    return (int)((n_tokens + (size_t)sim_cfg.block_size - 1) / (size_t)sim_cfg.block_size);
}

int sim_blocks_total(void)
{
    return nblk;
}

int sim_blocks_used(void)
{
    return nused;
}

static void take(int b)
{
    if (blks[b].ref++ == 0) {
        free_unlink(b);
        nused++;
    }
}

/* The prompt's leading blocks the prefix cache holds, at most <max_hit> (into out, if not
 * NULL). */
static int find_hits(const sim_tokens_t *prompt, int max_hit, int *out)
{
    int bs = sim_cfg.block_size, hits = 0;
    uint64_t h = 0;
    if (sim_cfg.no_prefix_cache)
        return 0;
    for (int i = 0; i < max_hit; i++) {
        h = block_hash(h, prompt->ids + (size_t)i * (size_t)bs, bs, i ? NULL : prompt->cache_salt);
        int b = hash_find(h);
        if (b < 0)
            break;
        if (out)
            out[hits] = b;
        hits++;
    }
    return hits;
}

/* A free block for new KV: a never-used one, else the LRU head (its cached hash evicted). */
static int take_free(void)
{
    int b;
    if (nfresh < nblk) {
        b = nfresh++; /* never used: nothing cached to evict */
        blks[b].prev = blks[b].next = -1;
    } else {
        b = free_head;
        hash_remove(b);
    }
    take(b);
    return b;
}

/* The hits a request of <total> tokens (prompt first) may use: full prompt blocks, never
 * the block of its last token (at least one token is always computed). */
static int max_hits(const sim_tokens_t *prompt, size_t total)
{
    size_t bs = (size_t)sim_cfg.block_size, full = prompt->n / bs;
    size_t cap = total ? (total - 1) / bs : 0;
    return (int)(full < cap ? full : cap);
}

size_t sim_blocks_count_hits(const sim_tokens_t *prompt, size_t total)
{
    return (size_t)find_hits(prompt, max_hits(prompt, total), NULL) * (size_t)sim_cfg.block_size;
}

int sim_blocks_alloc_cover(const sim_tokens_t *prompt, size_t total, size_t cover, int **blocks,
                           size_t *n_blocks, size_t *cached_tokens)
{
    int bs = sim_cfg.block_size;
    int max_hit = max_hits(prompt, total);
    int *out = malloc((size_t)(max_hit + sim_blocks_needed(cover) + 1) * sizeof(int));
    if (!out)
        return -1;
    int hits = find_hits(prompt, max_hit, out);
    int need = sim_blocks_needed(cover);
    if (need < hits)
        need = hits;
    /* free blocks not among the hits */
    int avail = nblk - nused;
    for (int i = 0; i < hits; i++)
        if (blks[out[i]].ref == 0)
            avail--;
    if (avail < need - hits) {
        free(out);
        return -1;
    }
    for (int i = 0; i < hits; i++)
        take(out[i]);
    for (int i = hits; i < need; i++)
        out[i] = take_free();
    sim_kvev_flush();
    *blocks = out;
    *n_blocks = (size_t)need;
    *cached_tokens = (size_t)hits * (size_t)bs;
    return 0;
}

int sim_blocks_alloc(const sim_tokens_t *prompt, size_t n_tokens, int **blocks, size_t *n_blocks,
                     size_t *cached_tokens)
{
    return sim_blocks_alloc_cover(prompt, prompt->n, n_tokens, blocks, n_blocks, cached_tokens);
}

int sim_blocks_grow(int **blocks, size_t *n_blocks, size_t cover)
{
    size_t need = (size_t)sim_blocks_needed(cover);
    if (need <= *n_blocks)
        return 0;
    if ((size_t)(nblk - nused) < need - *n_blocks)
        return -1;
    int *nb = realloc(*blocks, need * sizeof(int));
    if (!nb)
        return -1;
    for (size_t i = *n_blocks; i < need; i++)
        nb[i] = take_free();
    sim_kvev_flush();
    *blocks = nb;
    *n_blocks = need;
    return 0;
}

void sim_blocks_commit(const sim_tokens_t *prompt, const int *blocks, size_t n_blocks)
{
    if (sim_cfg.no_prefix_cache)
        return;
    int bs = sim_cfg.block_size;
    size_t full = prompt->n / (size_t)bs;
    uint64_t h = 0, prev = 0;
    /* a run of newly cached blocks is one BlockStored (vLLM's
     * cache_full_blocks): its parent is the hash just before the run */
    uint64_t *run = malloc((full ? full : 1) * sizeof(uint64_t));
    size_t n_run = 0, run_start = 0;
    uint64_t run_parent = 0;
    for (size_t i = 0; i < full && i < n_blocks; i++) {
        prev = h;
        h = block_hash(h, prompt->ids + i * (size_t)bs, bs, i ? NULL : prompt->cache_salt);
        int b = blocks[i];
        int cached = (blks[b].has_hash && blks[b].hash == h) || hash_find(h) >= 0;
        if (!cached) {
            hash_remove(b);
            hash_insert(b, h);
            if (run && n_run == 0) {
                run_start = i;
                run_parent = prev;
                run[n_run++] = h;
                continue;
            }
            if (run) {
                run[n_run++] = h;
                continue;
            }
        }
        if (run && n_run) {
            sim_kvev_stored_prompt(run_start > 0, run_parent, run, n_run, prompt, run_start, bs);
            n_run = 0;
        }
    }
    if (run && n_run)
        sim_kvev_stored_prompt(run_start > 0, run_parent, run, n_run, prompt, run_start, bs);
    free(run);
    sim_kvev_flush();
}

void sim_blocks_release(int *blocks, size_t n_blocks)
{
    /* release in reverse so a request's tail blocks are evicted first */
    for (size_t i = n_blocks; i-- > 0;) {
        int b = blocks[i];
        if (b < 0 || b >= nfresh || blks[b].ref <= 0)
            continue;
        if (--blks[b].ref == 0) {
            nused--;
            free_append(b);
        }
    }
}
