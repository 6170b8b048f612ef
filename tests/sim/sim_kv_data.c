/*
 * KV chunk naming and content, in LMCache's terms. Content is generated,
 * never stored: the sender fills a page when it sends it and the receiver
 * regenerates the expected bytes to compare with what it loaded.
 *
 * A chunk is LMCache's memory object (LMCache lmcache/v1/gpu_connector.py
 * get_shape, lmcache/v1/memory_management.py MemoryFormat.KV_2LTD): shape
 * [2, num_layers, chunk_tokens, hidden] -- K of every layer, then V of every
 * layer, token rows of <hidden> bfloat16 values -- the last chunk of a prompt
 * shorter. Layer-wise streaming sends one layer of it at a time
 * ([2, 1, tokens, hidden]). Keys are CacheEngineKey strings (LMCache
 * lmcache/utils.py): model@world_size@worker_id@chunk_hash_hex@dtype, and a
 * LayerCacheEngineKey adds @layer_id.
 */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "sim_pd_int.h"

int sim_kv_geom_init(sim_kv_geom_t *g, int ntp)
{
    if (ntp < 1 || ntp > SIM_MAX_TP)
        return -1;
    size_t per_layer = (size_t)sim_cfg.kv_bytes_per_token / (size_t)sim_cfg.layers;
    if (per_layer % ((size_t)ntp * 4))
        return -1;
    g->layers = sim_cfg.layers;
    g->ntp = ntp;
    g->block_size = sim_cfg.block_size;
    g->tok_bytes = per_layer / (size_t)ntp;
    g->hidden = (int64_t)(g->tok_bytes / 4);
    /* one page holds a whole chunk: all layers x chunk tokens, as LMCache
     * sizes its PD buffer (pd_backend_async.py initialize_allocator) */
    /* = kvt_chunk_bytes(kvt_chunk_geom_lmcache(layers, block, hidden, bf16));
     * this file also builds without libkvt */
    g->page_bytes = 2 * (size_t)g->layers * (size_t)g->block_size * (size_t)g->hidden * 2;
    g->unit_layers = sim_cfg.layerwise ? 1 : g->layers;
    return 0;
}

int sim_kv_geom_lmcache(sim_kv_geom_t *g, int ntp)
{
    if (sim_kv_geom_init(g, ntp))
        return -1;
    /* LMCache cuts KV into chunks of its own chunk_size (lmcache/v1/config.py, 256),
     * whatever vLLM's block size is */
    g->block_size = sim_cfg.lmcache_chunk_size;
    g->page_bytes = 2 * (size_t)g->layers * (size_t)g->block_size * (size_t)g->hidden * 2;
    return 0;
}

size_t sim_kv_engine_page_bytes(void)
{
    sim_kv_geom_t b, l;
    if (sim_kv_geom_init(&b, 1) || sim_kv_geom_lmcache(&l, 1))
        return 0;
    return b.page_bytes > l.page_bytes ? b.page_bytes : l.page_bytes;
}

size_t sim_kv_nchunks(const sim_kv_geom_t *g, size_t ntokens)
{
    return (ntokens + (size_t)g->block_size - 1) / (size_t)g->block_size;
}

size_t sim_kv_chunk_tokens(const sim_kv_geom_t *g, size_t ntokens, size_t c)
{
    size_t start = c * (size_t)g->block_size;
    size_t left = ntokens > start ? ntokens - start : 0;
    return left < (size_t)g->block_size ? left : (size_t)g->block_size;
}

void sim_kv_chunk_hashes(const sim_tokens_t *prompt, const sim_kv_geom_t *g, uint64_t *out)
{
    uint64_t h = 0x6b76; /* "kv" */
    size_t n = sim_kv_nchunks(g, prompt->n);
    for (size_t c = 0; c < n; c++) {
        size_t t = sim_kv_chunk_tokens(g, prompt->n, c);
        h = XXH64(prompt->ids + c * (size_t)g->block_size, t * sizeof(uint32_t), h);
        out[c] = h;
    }
}

int sim_kv_key(char *buf, size_t cap, const char *scope, int ntp, int rank, int layer,
               uint64_t chunk_hash)
{
    /* LMCache keys are content addresses; a transfer-scoped key (every
     * protocol but lmcache) folds the transfer name into the hash */
    uint64_t h = scope != NULL ? XXH64(scope, strlen(scope), chunk_hash) : chunk_hash;
    if (layer < 0)
        return snprintf(buf, cap, "%s@%d@%d@%llx@bfloat16", sim_cfg.model, ntp, rank,
                        (unsigned long long)h);
    return snprintf(buf, cap, "%s@%d@%d@%llx@bfloat16@%d", sim_cfg.model, ntp, rank,
                    (unsigned long long)h, layer);
}

static uint64_t seed_of(uint32_t id, size_t pos, int layer, int rank, int half)
{
    uint64_t v[4] = {id, pos, ((uint64_t)(uint32_t)layer << 32) | (uint32_t)rank, (uint64_t)half};
    return XXH64(v, sizeof(v), 0x6b7664617461ull);
}

static void gen(uint8_t *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    while (n) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        size_t k = n < 8 ? n : 8;
        memcpy(dst, &z, k);
        dst += k;
        n -= k;
    }
}

size_t sim_kv_fill(const sim_tokens_t *prompt, const sim_kv_geom_t *g, int rank, int layer,
                   size_t c, uint8_t *buf)
{
    size_t t = sim_kv_chunk_tokens(g, prompt->n, c);
    size_t row = (size_t)g->hidden * 2; /* bytes of one token's K (or V) */
    int l0 = layer < 0 ? 0 : layer, nl = layer < 0 ? g->layers : 1;
    uint8_t *p = buf;
    for (int half = 0; half < 2; half++)
        for (int l = l0; l < l0 + nl; l++)
            for (size_t j = 0; j < t; j++, p += row) {
                size_t pos = c * (size_t)g->block_size + j;
                gen(p, row, seed_of(prompt->ids[pos], pos, l, rank, half));
            }
    return (size_t)(p - buf);
}

int sim_kv_verify(const sim_tokens_t *prompt, const sim_kv_geom_t *g, int rank, int layer, size_t c,
                  const uint8_t *buf, size_t len, uint8_t *scratch)
{
    size_t want = sim_kv_fill(prompt, g, rank, layer, c, scratch);
    return want == len && memcmp(buf, scratch, len) == 0;
}
