/*
 * kvt_pool_geom.c -- KV chunk geometry: (fmt, shape, dtype) -> bytes, with a
 * short last chunk sized by last_chunk_toks.
 */
#include "kvt/kvt_pool.h"

#include <string.h>

struct dtype_size {
    const char *name;
    uint32_t size;
};

static const struct dtype_size dtype_sizes[] = {
    {"bfloat16", 2},
    {"bf16", 2},
    {"half", 2},
    {"float16", 2},
    {"fp16", 2},
    {"float", 4},
    {"float32", 4},
    {"fp32", 4},
    {"double", 8},
    {"float64", 8},
    {"int8", 1},
    {"uint8", 1},
    {"int16", 2},
    {"short", 2},
    {"int32", 4},
    {"int", 4},
    {"int64", 8},
    {"long", 8},
    {"bool", 1},
    {"float8_e4m3fn", 1},
    {"float8_e5m2", 1},
    {"float8_e4m3fnuz", 1},
    {"float8_e5m2fnuz", 1},
    /* LMCache's own names (lmcache/utils.py TORCH_DTYPE_TO_STR_DTYPE; older
     * releases wrote "fp8" for uint8 and "fp8_e4m3" / "fp8_e5m2") */
    {"fp8", 1},
    {"fp8_e4m3", 1},
    {"fp8_e4m3fn", 1},
    {"fp8_e4m3fnuz", 1},
    {"fp8_e5m2", 1},
    {"fp8_e5m2fnuz", 1},
};

uint32_t kvt_dtype_size(const char *dtype)
{
    if (dtype == NULL)
        return 0;
    if (strncmp(dtype, "torch.", 6) == 0)
        dtype += 6;
    for (size_t i = 0; i < sizeof(dtype_sizes) / sizeof(dtype_sizes[0]); i++)
        if (strcmp(dtype, dtype_sizes[i].name) == 0)
            return dtype_sizes[i].size;
    return 0;
}

int kvt_fmt_token_dim(int32_t fmt)
{
    switch (fmt) {
    case KVT_FMT_KV_2LTD:
        return 2;
    case KVT_FMT_KV_T2D:
        return 0;
    case KVT_FMT_KV_2TD:
        return 1;
    case KVT_FMT_KV_MLA:
        return 2;
    default:
        return -1;
    }
}

kvt_status_t kvt_chunk_geom_init(kvt_chunk_geom_t *g, int32_t fmt, const int64_t *shape,
                                 uint32_t ndim, const char *dtype)
{
    kvt_chunk_geom_t t;
    size_t bytes;

    if (g == NULL || shape == NULL || dtype == NULL || ndim == 0 || ndim > KVT_MAX_DIMS)
        return KVT_ERR_INVALID;
    memset(&t, 0, sizeof(t));
    t.fmt = fmt;
    t.ndim = ndim;
    t.elem_size = kvt_dtype_size(dtype);
    if (t.elem_size == 0 || strlen(dtype) >= sizeof(t.dtype))
        return KVT_ERR_INVALID;
    strcpy(t.dtype, dtype);
    t.token_dim = kvt_fmt_token_dim(fmt);
    if (t.token_dim >= (int32_t)ndim)
        return KVT_ERR_INVALID;
    bytes = t.elem_size;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return KVT_ERR_INVALID;
        if ((uint64_t)shape[i] > SIZE_MAX / bytes)
            return KVT_ERR_INVALID;
        bytes *= (size_t)shape[i];
        t.shape[i] = shape[i];
    }
    *g = t;
    return KVT_OK;
}

int64_t kvt_chunk_full_tokens(const kvt_chunk_geom_t *g)
{
    return g->token_dim < 0 ? 0 : g->shape[g->token_dim];
}

size_t kvt_chunk_bytes(const kvt_chunk_geom_t *g)
{
    size_t bytes = g->elem_size;
    for (uint32_t i = 0; i < g->ndim; i++)
        bytes *= (size_t)g->shape[i];
    return bytes;
}

size_t kvt_chunk_bytes_toks(const kvt_chunk_geom_t *g, int64_t ntoks)
{
    int64_t full = kvt_chunk_full_tokens(g);

    if (g->token_dim < 0 || ntoks <= 0 || ntoks >= full)
        return kvt_chunk_bytes(g);
    return kvt_chunk_bytes(g) / (size_t)full * (size_t)ntoks;
}

kvt_status_t kvt_chunk_geom_lmcache(kvt_chunk_geom_t *g, int64_t layers, int64_t chunk_tokens,
                                    int64_t hidden, const char *dtype, int mla)
{
    int64_t shape[4] = {mla ? 1 : 2, layers, chunk_tokens, hidden};

    return kvt_chunk_geom_init(g, mla ? KVT_FMT_KV_MLA : KVT_FMT_KV_2LTD, shape, 4, dtype);
}
