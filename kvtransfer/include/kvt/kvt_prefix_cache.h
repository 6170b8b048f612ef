/*
 * kvt_prefix_cache.h -- prefix cache over a fixed set of pages.
 *
 * Block hashes are chained over token ids: with block size B,
 *   hash_0 = xxh3_64(seed_le64 || tokens[0..B) as u32 little-endian)
 *   hash_i = xxh3_64(hash_{i-1}_le64 || tokens[i*B..(i+1)*B) as u32 LE)
 * so a hash names a block AND everything before it. Only full blocks hash.
 *
 * The cache manages pages 0..npages-1 (the caller maps them to its pool,
 * e.g. kvt_pool pages). Each page has a ref count and optionally the hash of
 * the block it holds. Pages with ref 0 sit in an LRU free queue: new
 * allocations take the head (least recently released) and evict the hash it
 * held; released pages go to the tail. So a cached block survives until the
 * free queue reaches it, and a page in use (ref > 0: touched, pinned for a
 * transfer, or matched by a lookup) is never evicted.
 *
 * Typical flow (seed 004): lookup() -> matched pages are locked (ref+1) ->
 * load from them -> release(); store: alloc() -> write -> insert(hash) ->
 * release() (page stays cached in the free queue).
 *
 * Thread-safe (one mutex).
 */
#ifndef KVT_PREFIX_CACHE_H
#define KVT_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t kvt_block_hash_t;
#define KVT_PREFIX_MAX_BLOCK 8192u /* tokens per block */

/* Hash the full blocks of <tokens>: writes min(ntokens / block_size, max_out)
 * chained hashes to <out> and their count to *nout. */
kvt_status_t kvt_prefix_hash_blocks(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                                    uint64_t seed, kvt_block_hash_t *out, size_t max_out,
                                    size_t *nout);

/* One chain step: hash of the block <tokens>[0..block_size) after <prev>
 * (prev = seed for block 0). */
kvt_block_hash_t kvt_prefix_hash_next(kvt_block_hash_t prev, const uint32_t *tokens,
                                      uint32_t block_size);

typedef struct kvt_prefix_cache kvt_prefix_cache_t;

typedef struct kvt_prefix_cache_params {
    uint32_t npages;     /* pages managed (>= 1) */
    uint32_t block_size; /* tokens per block (1..KVT_PREFIX_MAX_BLOCK) */
    uint64_t seed;       /* chain seed (e.g. a model/config salt) */
} kvt_prefix_cache_params_t;

typedef struct kvt_prefix_cache_stats {
    uint32_t npages;
    uint32_t free_pages;        /* ref 0 (cached or not) */
    uint32_t cached_pages;      /* pages holding a hash */
    uint32_t pinned_pages;      /* pages with pin > 0 */
    uint64_t queries;           /* blocks asked for by lookups */
    uint64_t hits;              /* blocks matched */
    uint64_t evictions;         /* cached hashes dropped to reuse a page */
    uint64_t double_free_total; /* release of a page with ref 0 */
} kvt_prefix_cache_stats_t;

kvt_status_t kvt_prefix_cache_create(const kvt_prefix_cache_params_t *p, kvt_prefix_cache_t **out);
void kvt_prefix_cache_destroy(kvt_prefix_cache_t *pc);
uint32_t kvt_prefix_cache_block_size(const kvt_prefix_cache_t *pc);
void kvt_prefix_cache_stats(kvt_prefix_cache_t *pc, kvt_prefix_cache_stats_t *out);

/* Take <n> pages from the LRU head (evicting their hashes), ref = 1.
 * n > npages: KVT_ERR_TOO_LARGE; fewer than n free: KVT_ERR_NOSPACE (nothing
 * taken). */
kvt_status_t kvt_prefix_cache_alloc(kvt_prefix_cache_t *pc, uint32_t n, uint32_t *pages_out);

/* Record that <page> (ref > 0, else KVT_ERR_STATE) holds block <hash>. If the
 * hash is already cached on another page: KVT_ERR_EXISTS and *existing_out
 * (may be NULL) = that page (the caller may drop its duplicate). A page that
 * held another hash is re-stamped. */
kvt_status_t kvt_prefix_cache_insert(kvt_prefix_cache_t *pc, uint32_t page, kvt_block_hash_t hash,
                                     uint32_t *existing_out);

/* ref += 1 for each page (a ref-0 page leaves the free queue). */
kvt_status_t kvt_prefix_cache_touch(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n);

/* ref -= 1 for each page, in the order given; a page reaching 0 goes to the
 * LRU tail. Release of a ref-0 page: KVT_ERR_DOUBLE_FREE (counted, skipped;
 * the others are still released). */
kvt_status_t kvt_prefix_cache_release(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n);

/* Pin for a transfer: pin += 1 and ref += 1; unpin undoes both
 * (KVT_ERR_UNDERFLOW if not pinned). */
kvt_status_t kvt_prefix_cache_pin(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n);
kvt_status_t kvt_prefix_cache_unpin(kvt_prefix_cache_t *pc, const uint32_t *pages, uint32_t n);

/* Longest cached prefix of the chain <hashes>[0..nhash): the matched pages go
 * to pages_out[0..*nmatched) and are locked (ref += 1) until released with
 * kvt_prefix_cache_release(). <pages_out> must hold nhash entries. */
kvt_status_t kvt_prefix_cache_lookup(kvt_prefix_cache_t *pc, const kvt_block_hash_t *hashes,
                                     size_t nhash, uint32_t *pages_out, size_t *nmatched);

/* Is <hash> cached, and on which page (may be NULL)? KVT_ERR_NOT_FOUND if
 * not. Unlike lookup() it takes no reference and leaves the LRU order as
 * it is: a store that skips blocks already cached must not make them look
 * recently used (vLLM's CPU offload store path checks the same way). */
kvt_status_t kvt_prefix_cache_peek(kvt_prefix_cache_t *pc, kvt_block_hash_t hash,
                                   uint32_t *page_out);

/* Drop the hash <page> holds, if any (its references stay as they are): a
 * block found to be bad is no longer served, and a later store may put it
 * back. */
kvt_status_t kvt_prefix_cache_forget(kvt_prefix_cache_t *pc, uint32_t page);

/* Hash-and-match in one pass over <tokens> (stops hashing at the first miss).
 * <pages_out> must hold ntokens / block_size entries; *matched_tokens =
 * matched blocks * block_size. Matched pages are locked as by lookup. */
kvt_status_t kvt_prefix_cache_match(kvt_prefix_cache_t *pc, const uint32_t *tokens, size_t ntokens,
                                    uint32_t *pages_out, size_t *nmatched, size_t *matched_tokens);

/* Page counts and hash (for tests). has_hash 0 = no hash. */
kvt_status_t kvt_prefix_cache_page_info(kvt_prefix_cache_t *pc, uint32_t page, uint32_t *ref_out,
                                        int *has_hash_out, kvt_block_hash_t *hash_out);

#ifdef __cplusplus
}
#endif
#endif /* KVT_PREFIX_CACHE_H */
