/*
 * Registered regions of a verbs transport instance. A region is registered once, when its pool
 * is created (through the pool's registration hook), as one MR -- or as ceil(len / max_mr_size)
 * MRs cut exactly at max_mr_size when the device cannot cover it with one. Never per page, never
 * on the transfer path. The first region also decides the device (NUMA-nearest NIC).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kvt_verbs_tl_int.h"

static uint64_t mr_limit(const kvt_tl_t *tl)
{
    uint64_t dev = tl->dev->max_mr_size;

    if (tl->cfg.max_mr_size != 0 && (dev == 0 || tl->cfg.max_mr_size < dev))
        return tl->cfg.max_mr_size;
    return dev;
}

void kvt_verbs_region_free(kvt_tl_region_t *r)
{
    for (uint32_t i = 0; i < r->nmrs; i++)
        if (r->mrs[i] != NULL && ibv_dereg_mr(r->mrs[i]) != 0)
            kvt_verbs_log("ibv_dereg_mr of region %s failed", r->uuid);
    kvt_free(r->mrs);
    kvt_verbs_mr_map_clear(&r->lmap);
    kvt_verbs_mr_map_clear(&r->rmap);
    kvt_free(r);
}

kvt_status_t kvt_verbs_reg_region(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                                  kvt_tl_region_t **out)
{
    kvt_tl_region_t *r, *it;
    kvt_status_t st;
    uint64_t base;

    if (p == NULL || p->uuid == NULL || strlen(p->uuid) != KVT_TL_UUID_LEN || p->base == NULL ||
        p->length == 0 || (p->page_size != 0 && p->length % p->page_size != 0))
        return KVT_ERR_INVALID;
    base = (uint64_t)(uintptr_t)p->base;
    r = kvt_calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NOMEM;
    snprintf(r->uuid, sizeof(r->uuid), "%s", p->uuid);
    r->base = p->base;
    r->length = p->length;
    pthread_mutex_lock(&tl->lock);
    for (it = tl->regions; it != NULL; it = it->next) {
        if (strcmp(it->uuid, r->uuid) == 0) {
            st = KVT_ERR_EXISTS;
            goto err_unlock;
        }
    }
    st = kvt_verbs_tl_ensure_dev(tl, kvt_verbs_numa_of(p->base));
    if (st != KVT_OK)
        goto err_unlock;
    st = kvt_verbs_mr_map_init(&r->lmap, r->uuid, base, p->length, mr_limit(tl));
    if (st == KVT_OK)
        st = kvt_verbs_mr_map_init(&r->rmap, r->uuid, base, p->length, mr_limit(tl));
    if (st != KVT_OK)
        goto err_unlock;
    r->mrs = kvt_calloc(r->lmap.nkeys, sizeof(*r->mrs));
    if (r->mrs == NULL) {
        st = KVT_ERR_NOMEM;
        goto err_unlock;
    }
    for (uint32_t i = 0; i < r->lmap.nkeys; i++) {
        uint64_t off = (uint64_t)i * r->lmap.chunk_size;
        uint64_t len = p->length - off < r->lmap.chunk_size ? p->length - off : r->lmap.chunk_size;

        r->mrs[i] =
            ibv_reg_mr(tl->dev->pd, (uint8_t *)p->base + off, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        if (r->mrs[i] == NULL) {
            kvt_verbs_log("ibv_reg_mr of region %s (%" PRIu64 " bytes at +%" PRIu64 ") failed: %s",
                          r->uuid, len, off, strerror(errno));
            st = KVT_ERR_IO;
            goto err_unlock;
        }
        r->nmrs++;
        r->lmap.keys[i] = r->mrs[i]->lkey;
        r->rmap.keys[i] = r->mrs[i]->rkey;
    }
    r->next = tl->regions;
    tl->regions = r;
    tl->nregions++;
    pthread_mutex_unlock(&tl->lock);
    *out = r;
    return KVT_OK;

err_unlock:
    pthread_mutex_unlock(&tl->lock);
    kvt_verbs_region_free(r);
    return st;
}

void kvt_verbs_dereg_region(kvt_tl_t *tl, kvt_tl_region_t *region)
{
    kvt_tl_region_t **pp;

    if (region == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    for (pp = &tl->regions; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == region) {
            *pp = region->next;
            tl->nregions--;
            break;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    kvt_verbs_region_free(region);
}

/* tl->lock held. */
