/*
 * MR planning: a registered area becomes as few memory regions as the device
 * allows. An area is cut only when it is larger than the device's max_mr_size,
 * and then at exact multiples of it, so the chunk holding an address is (addr -
 * base) / chunk_size -- no search and no per-page registration on any path.
 */
#include <stdlib.h>
#include <string.h>

#include "kvt_verbs_int.h"

uint32_t kvt_verbs_mr_plan_count(uint64_t len, uint64_t max_mr_size)
{
    uint64_t n;

    if (len == 0)
        return 0;
    if (max_mr_size == 0 || max_mr_size >= len)
        return 1;
    n = len / max_mr_size + (len % max_mr_size != 0);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

kvt_status_t kvt_verbs_mr_plan(uint64_t base, uint64_t len, uint64_t max_mr_size,
                               kvt_verbs_mr_chunk_t *out, uint32_t cap, uint32_t *nout)
{
    uint32_t n, i;
    uint64_t off = 0;

    if (len == 0 || base + len < base)
        return KVT_ERR_INVALID;
    n = kvt_verbs_mr_plan_count(len, max_mr_size);
    if (n > cap)
        return KVT_ERR_INVALID;
    for (i = 0; i < n; i++) {
        uint64_t left = len - off;
        uint64_t l = (max_mr_size == 0 || left < max_mr_size) ? left : max_mr_size;

        out[i].addr = base + off;
        out[i].len = l;
        off += l;
    }
    *nout = n;
    return KVT_OK;
}

kvt_status_t kvt_verbs_mr_map_init(kvt_verbs_mr_map_t *map, const char *uuid, uint64_t base,
                                   uint64_t len, uint64_t max_mr_size)
{
    uint32_t n;

    if (len == 0 || base + len < base || uuid == NULL || strlen(uuid) > KVT_VERBS_UUID_LEN)
        return KVT_ERR_INVALID;
    n = kvt_verbs_mr_plan_count(len, max_mr_size);
    if (n > KVT_VERBS_MAX_MR_CHUNKS)
        return KVT_ERR_INVALID;
    memset(map, 0, sizeof(*map));
    map->keys = kvt_calloc(n, sizeof(*map->keys));
    if (map->keys == NULL)
        return KVT_ERR_NOMEM;
    strcpy(map->uuid, uuid);
    map->base = base;
    map->len = len;
    map->chunk_size = (max_mr_size == 0 || max_mr_size >= len) ? len : max_mr_size;
    map->nkeys = n;
    return KVT_OK;
}

void kvt_verbs_mr_map_clear(kvt_verbs_mr_map_t *map)
{
    kvt_free(map->keys);
    memset(map, 0, sizeof(*map));
}

kvt_status_t kvt_verbs_mr_map_copy(kvt_verbs_mr_map_t *dst, const kvt_verbs_mr_map_t *src)
{
    *dst = *src;
    dst->keys = kvt_malloc((size_t)src->nkeys * sizeof(*dst->keys));
    if (dst->keys == NULL) {
        memset(dst, 0, sizeof(*dst));
        return KVT_ERR_NOMEM;
    }
    memcpy(dst->keys, src->keys, (size_t)src->nkeys * sizeof(*dst->keys));
    return KVT_OK;
}

kvt_status_t kvt_verbs_mr_map_lookup(const kvt_verbs_mr_map_t *map, uint64_t addr, uint64_t len,
                                     uint32_t *key, uint64_t *chunk_left)
{
    uint64_t off, idx, chunk_end;

    if (map == NULL || map->nkeys == 0 || map->chunk_size == 0 || len == 0)
        return KVT_ERR_INVALID;
    if (addr < map->base || addr + len < addr || addr + len > map->base + map->len)
        return KVT_ERR_INVALID;
    off = addr - map->base;
    idx = off / map->chunk_size;
    if (idx >= map->nkeys)
        return KVT_ERR_INVALID;
    chunk_end = (idx + 1) * map->chunk_size;
    if (chunk_end > map->len)
        chunk_end = map->len;
    *key = map->keys[idx];
    *chunk_left = chunk_end - off;
    return KVT_OK;
}
