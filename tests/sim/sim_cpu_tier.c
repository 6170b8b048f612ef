/*
 * The CPU offload tier: vLLM's CPU KV offloading (--kv-offloading-size) in
 * miniature, on libkvt's prefix cache (kvt_prefix_cache.c: hash -> page map,
 * ref-counted pages, LRU queue of unreferenced pages).
 *
 * The flow is the one of vLLM's SimpleCPUOffloadConnector scheduler
 * (vllm/v1/simple_kv_offload/manager.py; seed 004):
 *  - store: the full prompt blocks of a computed prefill that the tier does
 *    not hold yet get a page each (the LRU head: its old block is evicted),
 *    their bytes copied in, their hash stamped; the page is then released
 *    and waits in the LRU queue. No free page left: the rest is not stored.
 *  - load: at admission, after the GPU prefix hits, the following blocks
 *    the tier holds (consecutive from there, at least one prompt token left
 *    to compute) are looked up; the lookup takes a reference, so a page in
 *    use by the load cannot be evicted until the prefill ends.
 * The copy "GPU -> CPU" is modelled as done when the prefill ends, the load
 * as lasting the whole prefill. Block content is generated from the block
 * hash (what the GPU block would hold); a load compares the page with it, so
 * a page that does not hold what was stored is caught, not served, and its
 * block leaves the tier (the prefill's store puts it back).
 *
 * Events: blocks stored and evicted here are published as BlockStored /
 * BlockRemoved with medium "CPU" (vllm/v1/kv_offload/mediums.py). Under the
 * engine lock, like sim_blocks.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvt/kvt_prefix_cache.h"
#include "sim_int.h"

#define MAX_PAGES (1u << 22) /* metadata stays below ~100 MB */

static kvt_prefix_cache_t *pc;
static uint8_t *bytes; /* npages x page_bytes, calloc'd: untouched pages cost nothing */
static size_t page_bytes;
static uint32_t npages;
/* what each page held when it was last stamped, to name the block an
 * allocation evicts (the cache drops it silently) */
static uint64_t *page_hash;
static uint8_t *page_stamped;
static uint8_t *scratch; /* one block of expected content */

int sim_cpu_tier_enabled(void)
{
    return pc != NULL;
}

size_t sim_cpu_tier_page_bytes(void)
{
    return page_bytes;
}

uint8_t *sim_cpu_tier_page(uint32_t page)
{
    return pc && page < npages ? bytes + (size_t)page * page_bytes : NULL;
}

static uint32_t pages_wanted(void)
{
    double per_block = (double)sim_cfg.block_size * (double)sim_cfg.kv_bytes_per_token;
    double n;
    if (sim_cfg.kv_offloading_blocks > 0)
        return (uint32_t)sim_cfg.kv_offloading_blocks;
    n = sim_cfg.kv_offloading_size_gib * 1073741824.0 / per_block;
    return n < 1 ? 1 : n > MAX_PAGES + 1.0 ? MAX_PAGES + 1 : (uint32_t)n; /* vLLM: at least 1 */
}

int sim_cpu_tier_init(void)
{
    kvt_prefix_cache_params_t p = {0};

    if (sim_cfg.kv_offloading_blocks <= 0 && sim_cfg.kv_offloading_size_gib <= 0)
        return 0;
    if (sim_cfg.no_prefix_cache) {
        /* vLLM's SimpleCPUOffloadConnector turns itself off the same way */
        fprintf(stderr, "pdgw-sim: prefix caching is off: CPU offloading disabled\n");
        return 0;
    }
    npages = pages_wanted();
    if (npages > MAX_PAGES) {
        fprintf(stderr, "pdgw-sim: CPU offload tier: more than %u blocks\n", MAX_PAGES);
        npages = 0;
        return -1;
    }
    page_bytes = (size_t)sim_cfg.block_size * (size_t)sim_cfg.kv_bytes_per_token;
    p.npages = npages;
    p.block_size = (uint32_t)sim_cfg.block_size;
    bytes = calloc(npages, page_bytes);
    page_hash = calloc(npages, sizeof(*page_hash));
    page_stamped = calloc(npages, 1);
    scratch = malloc(page_bytes);
    if (!bytes || !page_hash || !page_stamped || !scratch || kvt_prefix_cache_create(&p, &pc)) {
        fprintf(stderr, "pdgw-sim: CPU offload tier: cannot allocate %u blocks of %zu bytes\n",
                npages, page_bytes);
        sim_cpu_tier_fini();
        return -1;
    }
    return 0;
}

void sim_cpu_tier_fini(void)
{
    kvt_prefix_cache_destroy(pc);
    pc = NULL;
    free(bytes);
    free(page_hash);
    free(page_stamped);
    free(scratch);
    bytes = NULL;
    page_hash = NULL;
    page_stamped = NULL;
    scratch = NULL;
    npages = 0;
}

void sim_cpu_tier_stats(sim_cpu_tier_stats_t *st)
{
    kvt_prefix_cache_stats_t s;
    memset(st, 0, sizeof(*st));
    if (!pc)
        return;
    kvt_prefix_cache_stats(pc, &s);
    st->blocks = s.npages;
    st->free_blocks = s.free_pages;
    st->cached_blocks = s.cached_pages;
}

/* The KV a GPU block with this hash holds: 8 bytes per word from the hash. */
static void block_content(uint64_t hash, uint8_t *out)
{
    for (size_t off = 0; off < page_bytes; off += 8) {
        uint64_t w = XXH64(&off, sizeof(off), hash);
        memcpy(out + off, &w, page_bytes - off < 8 ? page_bytes - off : 8);
    }
}

static void release_pages(uint32_t *pages, size_t n)
{
    if (n)
        kvt_prefix_cache_release(pc, pages, (uint32_t)n);
}

size_t sim_cpu_tier_load_locked(sim_req_t *req)
{
    size_t bs = (size_t)sim_cfg.block_size;
    size_t gpu = req->cached_tokens / bs, nmax, m = 0;
    uint64_t *h;
    uint32_t *pages;

    if (!pc || req->cpu_pages || req->prompt.n == 0)
        return 0;
    /* vLLM records the request's tokens as queried whatever the outcome */
    atomic_fetch_add(&sim_ctr.external_queries, req->prompt.n);
    nmax = (req->prompt.n - 1) / bs; /* the last prompt token is always computed */
    if (gpu >= nmax)
        return 0;
    h = malloc(nmax * sizeof(*h));
    pages = malloc((nmax - gpu) * sizeof(*pages));
    if (!h || !pages || sim_blocks_hashes(&req->prompt, nmax, h) != nmax ||
        kvt_prefix_cache_lookup(pc, h + gpu, nmax - gpu, pages, &m) != KVT_OK)
        m = 0;
    /* the load copies each page out: a page whose bytes are not the block's
     * ends the hit there (the rest is computed, as after a miss) */
    for (size_t i = 0; i < m; i++) {
        block_content(h[gpu + i], scratch);
        if (memcmp(sim_cpu_tier_page(pages[i]), scratch, page_bytes) != 0) {
            /* not served again: the block leaves the tier, the prefill's
             * store will put it back */
            atomic_fetch_add(&sim_ctr.offload_verify_failures, 1);
            kvt_prefix_cache_forget(pc, pages[i]);
            if (page_stamped[pages[i]])
                sim_kvev_removed("CPU", page_hash[pages[i]]);
            page_stamped[pages[i]] = 0;
            release_pages(pages + i, m - i);
            m = i;
        }
    }
    free(h);
    if (m == 0) {
        free(pages);
        return 0;
    }
    req->cpu_pages = pages;
    req->n_cpu_pages = m;
    req->cpu_hit_tokens = m * bs;
    atomic_fetch_add(&sim_ctr.offload_loaded, m);
    atomic_fetch_add(&sim_ctr.external_hits, m * bs);
    return m * bs;
}

void sim_cpu_tier_release_locked(sim_req_t *req)
{
    if (!pc || !req->cpu_pages)
        return;
    release_pages(req->cpu_pages, req->n_cpu_pages);
    free(req->cpu_pages);
    req->cpu_pages = NULL;
    req->n_cpu_pages = 0;
}

/* A page for a block to store: the LRU head, whose old block is evicted
 * (BlockRemoved). The page stays referenced until the store is done, so
 * the store's own allocations cannot take it back. -1: all pages in use. */
static int take_page(uint32_t *p)
{
    if (kvt_prefix_cache_alloc(pc, 1, p) != KVT_OK)
        return -1;
    if (page_stamped[*p]) {
        sim_kvev_removed("CPU", page_hash[*p]);
        atomic_fetch_add(&sim_ctr.offload_evicted, 1);
        page_stamped[*p] = 0;
    }
    return 0;
}

/* Blocks [i - run, i) were stored: one BlockStored, its parent the block
 * before the run (vLLM's block pool names a run the same way). */
static void stored_event(const sim_tokens_t *prompt, const uint64_t *h, size_t i, size_t run)
{
    size_t bs = (size_t)sim_cfg.block_size, first = i - run;
    if (run)
        sim_kvev_stored("CPU", first > 0, first > 0 ? h[first - 1] : 0, h + first, run,
                        prompt->ids + first * bs, (int)bs);
}

void sim_cpu_tier_store_locked(const sim_tokens_t *prompt)
{
    size_t full = prompt->n / (size_t)sim_cfg.block_size, n = 0, run = 0, i;
    uint64_t *h;
    uint32_t *pages;
    uint8_t *take;

    if (!pc || full == 0)
        return;
    h = malloc(full * sizeof(*h));
    pages = malloc(full * sizeof(*pages));
    take = calloc(full, 1);
    if (!h || !pages || !take)
        goto out;
    sim_blocks_hashes(prompt, full, h);
    /* 1: pages for the blocks the tier lacks, as vLLM allocates a store's
     * CPU blocks in one go before the copy */
    for (i = 0; i < full; i++) {
        if (kvt_prefix_cache_peek(pc, h[i], NULL) == KVT_OK)
            continue;
        if (take_page(&pages[n])) {
            atomic_fetch_add(&sim_ctr.offload_no_space, full - i);
            break;
        }
        take[i] = 1;
        n++;
    }
    full = i; /* blocks after a failed allocation are not stored */
    /* 2: the copy, then the hash stamped (now discoverable) */
    for (i = 0, n = 0; i < full; i++) {
        if (!take[i]) {
            stored_event(prompt, h, i, run);
            run = 0;
            continue;
        }
        block_content(h[i], sim_cpu_tier_page(pages[n]));
        page_stamped[pages[n]] = kvt_prefix_cache_insert(pc, pages[n], h[i], NULL) == KVT_OK;
        page_hash[pages[n]] = h[i];
        n++;
        run++;
    }
    stored_event(prompt, h, i, run);
    atomic_fetch_add(&sim_ctr.offload_stored, n);
    release_pages(pages, n); /* in block order: the first blocks are evicted first */
out:
    free(h);
    free(pages);
    free(take);
    sim_kvev_flush();
}
