/*
 * kvt_pool.c -- paged allocator over registered regions: creation,
 * registration hooks, page allocation with a partial-result bitmap, ref and
 * pin counts with double-free / underflow detection, bounds-checked refs.
 */
#include "kvt_pool_int.h"

#include <string.h>

const kvt_pool_region_t *kvt_pool_region_of(const kvt_pool_t *pool, kvt_page_t page)
{
    uint32_t lo = 0, hi = pool->nregions;

    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pool->regions[mid].info.first_page <= page)
            lo = mid;
        else
            hi = mid;
    }
    return &pool->regions[lo];
}

static void hooks_deregister(kvt_pool_t *pool, uint32_t hook_idx, uint32_t nregions)
{
    const kvt_region_hook_t *h = &pool->hooks[hook_idx];

    for (uint32_t r = nregions; r-- > 0;) {
        if (h->on_deregister != NULL)
            h->on_deregister(h->arg, &pool->regions[r].info, pool->regions[r].handles[hook_idx]);
        pool->regions[r].handles[hook_idx] = NULL;
    }
}

/* Run hook <hook_idx> over every region; undo on failure. */
static kvt_status_t hooks_register(kvt_pool_t *pool, uint32_t hook_idx)
{
    const kvt_region_hook_t *h = &pool->hooks[hook_idx];

    if (h->on_register == NULL)
        return KVT_OK;
    for (uint32_t r = 0; r < pool->nregions; r++) {
        void *handle = NULL;
        kvt_status_t status = h->on_register(h->arg, &pool->regions[r].info, &handle);
        if (status != KVT_OK) {
            hooks_deregister(pool, hook_idx, r);
            return status;
        }
        pool->regions[r].handles[hook_idx] = handle;
    }
    return KVT_OK;
}

static void regions_free(kvt_pool_t *pool, uint32_t n)
{
    for (uint32_t r = n; r-- > 0;) {
        kvt_pool_region_t *reg = &pool->regions[r];
        if (!reg->external && reg->info.base != NULL)
            pool->ops->free(pool->ops_ctx, reg->info.base, reg->info.length);
    }
}

kvt_status_t kvt_pool_create(const kvt_pool_params_t *p, kvt_pool_t **out)
{
    kvt_pool_t *pool;
    uint64_t total;
    uint32_t nregions, first = 0, hooks_done = 0;
    kvt_status_t status = KVT_ERR_NOMEM;

    if (p == NULL || out == NULL || p->page_size == 0 || p->nhooks > KVT_POOL_MAX_HOOKS ||
        (p->nhooks > 0 && p->hooks == NULL))
        return KVT_ERR_INVALID;
    if (p->mem_class != KVT_MEM_HOST && p->mem_class != KVT_MEM_DEVICE)
        return KVT_ERR_INVALID;
    total = p->buffer_size / p->page_size;
    if (total == 0 || total >= KVT_PAGE_NONE)
        return KVT_ERR_INVALID;
    nregions = p->nregions ? p->nregions : 1;
    if (nregions > KVT_POOL_MAX_REGIONS || nregions > total ||
        (p->external_base != NULL && nregions != 1))
        return KVT_ERR_INVALID;

    pool = kvt_calloc(1, sizeof(*pool));
    if (pool == NULL)
        return KVT_ERR_NOMEM;
    pool->mem_class = p->mem_class;
    pool->ops = p->ops != NULL
                    ? p->ops
                    : (p->mem_class == KVT_MEM_HOST ? &kvt_mem_host_ops : &kvt_mem_device_emul_ops);
    pool->ops_ctx = p->ops_ctx;
    pool->page_size = p->page_size;
    pool->total_pages = (uint32_t)total;
    pool->nregions = nregions;
    pool->name = kvt_strdup(p->name != NULL ? p->name : "kv");
    if (pool->name == NULL)
        goto err_pool;
    pool->regions = kvt_calloc(nregions, sizeof(*pool->regions));
    pool->ref = kvt_calloc(total, sizeof(uint32_t));
    pool->pin = kvt_calloc(total, sizeof(uint32_t));
    pool->free_stack = kvt_malloc(total * sizeof(uint32_t));
    if (pool->regions == NULL || pool->ref == NULL || pool->pin == NULL || pool->free_stack == NULL)
        goto err_arrays;
    /* stack top is the last element: hand out page 0 first */
    for (uint32_t i = 0; i < total; i++)
        pool->free_stack[i] = (uint32_t)(total - 1 - i);
    pool->nfree = (uint32_t)total;

    for (uint32_t r = 0; r < nregions; r++) {
        kvt_pool_region_t *reg = &pool->regions[r];
        uint32_t np = (uint32_t)(total / nregions) + (r < total % nregions ? 1 : 0);
        reg->info.npages = np;
        reg->info.first_page = first;
        reg->info.page_size = p->page_size;
        reg->info.length = (size_t)np * p->page_size;
        reg->info.mem_class = p->mem_class;
        reg->info.host_addressable = pool->ops->host_addressable;
        first += np;
        if (p->region_uuids != NULL)
            reg->info.uuid = p->region_uuids[r];
        else if ((status = kvt_uuid_generate(&reg->info.uuid)) != KVT_OK)
            goto err_regions;
        if (p->external_base != NULL) {
            reg->external = 1;
            reg->info.base = p->external_base;
        } else {
            status = pool->ops->alloc(pool->ops_ctx, reg->info.length, &reg->info.base);
            if (status != KVT_OK) {
                regions_free(pool, r);
                goto err_arrays;
            }
        }
    }

    for (; hooks_done < p->nhooks; hooks_done++) {
        pool->hooks[hooks_done] = p->hooks[hooks_done];
        pool->nhooks = hooks_done + 1;
        status = hooks_register(pool, hooks_done);
        if (status != KVT_OK)
            goto err_hooks;
    }

    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->hook_lock, NULL);
    *out = pool;
    return KVT_OK;

err_hooks:
    while (hooks_done-- > 0)
        hooks_deregister(pool, hooks_done, nregions);
err_regions:
    regions_free(pool, nregions);
err_arrays:
    kvt_free(pool->free_stack);
    kvt_free(pool->pin);
    kvt_free(pool->ref);
    kvt_free(pool->regions);
    kvt_free(pool->name);
err_pool:
    kvt_free(pool);
    return status;
}

void kvt_pool_destroy(kvt_pool_t *pool)
{
    if (pool == NULL)
        return;
    for (uint32_t h = pool->nhooks; h-- > 0;)
        hooks_deregister(pool, h, pool->nregions);
    regions_free(pool, pool->nregions);
    pthread_mutex_destroy(&pool->hook_lock);
    pthread_mutex_destroy(&pool->lock);
    kvt_free(pool->free_stack);
    kvt_free(pool->pin);
    kvt_free(pool->ref);
    kvt_free(pool->regions);
    kvt_free(pool->name);
    kvt_free(pool);
}

const char *kvt_pool_name(const kvt_pool_t *pool)
{
    return pool->name;
}

size_t kvt_pool_page_size(const kvt_pool_t *pool)
{
    return pool->page_size;
}

uint32_t kvt_pool_total_pages(const kvt_pool_t *pool)
{
    return pool->total_pages;
}

kvt_mem_class_t kvt_pool_mem_class(const kvt_pool_t *pool)
{
    return pool->mem_class;
}

const kvt_mem_ops_t *kvt_pool_mem_ops(const kvt_pool_t *pool)
{
    return pool->ops;
}

void kvt_pool_stats(kvt_pool_t *pool, kvt_pool_stats_t *out)
{
    pthread_mutex_lock(&pool->lock);
    out->total_pages = pool->total_pages;
    out->free_pages = pool->nfree;
    out->used_pages = pool->total_pages - pool->nfree;
    out->pinned_pages = pool->npinned;
    out->page_size = pool->page_size;
    out->alloc_total = pool->alloc_total;
    out->alloc_fail_total = pool->alloc_fail_total;
    out->too_large_total = pool->too_large_total;
    out->double_free_total = pool->double_free_total;
    out->underflow_total = pool->underflow_total;
    out->bounds_error_total = pool->bounds_error_total;
    pthread_mutex_unlock(&pool->lock);
}

uint32_t kvt_pool_nregions(const kvt_pool_t *pool)
{
    return pool->nregions;
}

kvt_status_t kvt_pool_region(const kvt_pool_t *pool, uint32_t i, kvt_region_info_t *out)
{
    if (pool == NULL || out == NULL)
        return KVT_ERR_INVALID;
    if (i >= pool->nregions)
        return KVT_ERR_BOUNDS;
    *out = pool->regions[i].info;
    return KVT_OK;
}

static const kvt_pool_region_t *region_by_uuid(const kvt_pool_t *pool, const kvt_uuid_t *uuid)
{
    for (uint32_t r = 0; r < pool->nregions; r++)
        if (kvt_uuid_equal(&pool->regions[r].info.uuid, uuid))
            return &pool->regions[r];
    return NULL;
}

kvt_status_t kvt_pool_region_find(const kvt_pool_t *pool, const kvt_uuid_t *uuid,
                                  kvt_region_info_t *out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || uuid == NULL || out == NULL)
        return KVT_ERR_INVALID;
    reg = region_by_uuid(pool, uuid);
    if (reg == NULL)
        return KVT_ERR_NOT_FOUND;
    *out = reg->info;
    return KVT_OK;
}

kvt_status_t kvt_pool_add_hook(kvt_pool_t *pool, const kvt_region_hook_t *hook)
{
    kvt_status_t status;

    if (pool == NULL || hook == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pool->hook_lock);
    if (pool->nhooks == KVT_POOL_MAX_HOOKS) {
        pthread_mutex_unlock(&pool->hook_lock);
        return KVT_ERR_LIMIT;
    }
    pool->hooks[pool->nhooks] = *hook;
    status = hooks_register(pool, pool->nhooks);
    if (status == KVT_OK)
        pool->nhooks++;
    else
        memset(&pool->hooks[pool->nhooks], 0, sizeof(pool->hooks[0]));
    pthread_mutex_unlock(&pool->hook_lock);
    return status;
}

kvt_status_t kvt_pool_remove_hook(kvt_pool_t *pool, const kvt_region_hook_t *hook)
{
    if (pool == NULL || hook == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pool->hook_lock);
    for (uint32_t h = 0; h < pool->nhooks; h++) {
        if (pool->hooks[h].on_register != hook->on_register || pool->hooks[h].arg != hook->arg)
            continue;
        hooks_deregister(pool, h, pool->nregions);
        /* keep later hooks' indexes stable for kvt_pool_region_handle users:
         * shift down, as documented "order of addition" of live hooks */
        for (uint32_t k = h; k + 1 < pool->nhooks; k++) {
            pool->hooks[k] = pool->hooks[k + 1];
            for (uint32_t r = 0; r < pool->nregions; r++)
                pool->regions[r].handles[k] = pool->regions[r].handles[k + 1];
        }
        pool->nhooks--;
        memset(&pool->hooks[pool->nhooks], 0, sizeof(pool->hooks[0]));
        for (uint32_t r = 0; r < pool->nregions; r++)
            pool->regions[r].handles[pool->nhooks] = NULL;
        pthread_mutex_unlock(&pool->hook_lock);
        return KVT_OK;
    }
    pthread_mutex_unlock(&pool->hook_lock);
    return KVT_ERR_NOT_FOUND;
}

void *kvt_pool_region_handle(const kvt_pool_t *pool, uint32_t i, uint32_t hook_idx)
{
    void *h;

    if (pool == NULL || i >= pool->nregions || hook_idx >= KVT_POOL_MAX_HOOKS)
        return NULL;
    pthread_mutex_lock((pthread_mutex_t *)&pool->hook_lock);
    h = pool->regions[i].handles[hook_idx];
    pthread_mutex_unlock((pthread_mutex_t *)&pool->hook_lock);
    return h;
}

/* ---- allocation ------------------------------------------------------------- */

kvt_status_t kvt_pool_alloc_keep(kvt_pool_t *pool, uint32_t n, uint32_t keep_free, unsigned flags,
                                 kvt_page_t *pages_out, uint8_t *failed_bitmap,
                                 uint32_t *nalloc_out)
{
    uint32_t avail, give;

    if (pool == NULL || (n > 0 && pages_out == NULL))
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pool->lock);
    if (n > pool->total_pages) {
        pool->too_large_total++;
        pool->alloc_fail_total += n;
        pthread_mutex_unlock(&pool->lock);
        return KVT_ERR_TOO_LARGE;
    }
    avail = pool->nfree > keep_free ? pool->nfree - keep_free : 0;
    if (avail < n && !(flags & KVT_ALLOC_PARTIAL)) {
        pool->alloc_fail_total += n;
        pthread_mutex_unlock(&pool->lock);
        return KVT_ERR_NOSPACE;
    }
    give = avail < n ? avail : n;
    for (uint32_t i = 0; i < give; i++) {
        kvt_page_t pg = pool->free_stack[--pool->nfree];
        pool->ref[pg] = 1;
        pool->pin[pg] = 0;
        pages_out[i] = pg;
    }
    for (uint32_t i = give; i < n; i++)
        pages_out[i] = KVT_PAGE_NONE;
    pool->alloc_total += give;
    pool->alloc_fail_total += n - give;
    pthread_mutex_unlock(&pool->lock);

    if (failed_bitmap != NULL) {
        memset(failed_bitmap, 0, kvt_bitmap_bytes(n));
        for (uint32_t i = give; i < n; i++)
            kvt_bitmap_set(failed_bitmap, i);
    }
    if (nalloc_out != NULL)
        *nalloc_out = give;
    return KVT_OK;
}

kvt_status_t kvt_pool_alloc(kvt_pool_t *pool, uint32_t n, unsigned flags, kvt_page_t *pages_out,
                            uint8_t *failed_bitmap, uint32_t *nalloc_out)
{
    return kvt_pool_alloc_keep(pool, n, 0, flags, pages_out, failed_bitmap, nalloc_out);
}

/* ---- counts ------------------------------------------------------------------ */

/* Drop one ref of <pg> (lock held); back to the free stack at zero. */
static void page_unref_locked(kvt_pool_t *pool, kvt_page_t pg)
{
    if (--pool->ref[pg] == 0)
        pool->free_stack[pool->nfree++] = pg;
}

typedef enum { OP_REF, OP_UNREF, OP_PIN, OP_UNPIN } count_op_t;

static kvt_status_t pool_count_op(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n,
                                  count_op_t op)
{
    kvt_status_t first = KVT_OK;

    if (pool == NULL || (n > 0 && pages == NULL))
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_page_t pg = pages[i];
        kvt_status_t st = KVT_OK;

        if (pg == KVT_PAGE_NONE)
            continue;
        if (pg >= pool->total_pages) {
            pool->bounds_error_total++;
            st = KVT_ERR_BOUNDS;
        } else {
            switch (op) {
            case OP_REF:
            case OP_PIN:
                if (pool->ref[pg] == 0) {
                    st = KVT_ERR_STATE; /* page is free: nobody may ref/pin it */
                } else if (pool->ref[pg] == UINT32_MAX) {
                    st = KVT_ERR_LIMIT;
                } else {
                    pool->ref[pg]++;
                    if (op == OP_PIN && pool->pin[pg]++ == 0)
                        pool->npinned++;
                }
                break;
            case OP_UNREF:
                if (pool->ref[pg] == 0) {
                    pool->double_free_total++;
                    st = KVT_ERR_DOUBLE_FREE;
                } else if (pool->ref[pg] == pool->pin[pg]) {
                    /* every remaining ref belongs to a pin: the owner's ref is gone */
                    pool->double_free_total++;
                    st = KVT_ERR_DOUBLE_FREE;
                } else {
                    page_unref_locked(pool, pg);
                }
                break;
            case OP_UNPIN:
                if (pool->pin[pg] == 0) {
                    pool->underflow_total++;
                    st = KVT_ERR_UNDERFLOW;
                } else {
                    if (--pool->pin[pg] == 0)
                        pool->npinned--;
                    page_unref_locked(pool, pg);
                }
                break;
            }
        }
        if (st != KVT_OK && first == KVT_OK)
            first = st;
    }
    pthread_mutex_unlock(&pool->lock);
    return first;
}

kvt_status_t kvt_pool_ref(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n)
{
    return pool_count_op(pool, pages, n, OP_REF);
}

kvt_status_t kvt_pool_unref(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n)
{
    return pool_count_op(pool, pages, n, OP_UNREF);
}

kvt_status_t kvt_pool_free(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n)
{
    return pool_count_op(pool, pages, n, OP_UNREF);
}

kvt_status_t kvt_pool_pin(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n)
{
    return pool_count_op(pool, pages, n, OP_PIN);
}

kvt_status_t kvt_pool_unpin(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n)
{
    return pool_count_op(pool, pages, n, OP_UNPIN);
}

kvt_status_t kvt_pool_page_counts(kvt_pool_t *pool, kvt_page_t page, uint32_t *ref_out,
                                  uint32_t *pin_out)
{
    if (pool == NULL)
        return KVT_ERR_INVALID;
    if (page >= pool->total_pages)
        return KVT_ERR_BOUNDS;
    pthread_mutex_lock(&pool->lock);
    if (ref_out != NULL)
        *ref_out = pool->ref[page];
    if (pin_out != NULL)
        *pin_out = pool->pin[page];
    pthread_mutex_unlock(&pool->lock);
    return KVT_OK;
}

/* ---- addressing ---------------------------------------------------------------- */

kvt_status_t kvt_pool_page_addr(const kvt_pool_t *pool, kvt_page_t page, void **addr_out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || addr_out == NULL)
        return KVT_ERR_INVALID;
    if (page >= pool->total_pages)
        return KVT_ERR_BOUNDS;
    reg = kvt_pool_region_of(pool, page);
    *addr_out = (char *)reg->info.base + (size_t)(page - reg->info.first_page) * pool->page_size;
    return KVT_OK;
}

kvt_status_t kvt_pool_page_to_ref(const kvt_pool_t *pool, kvt_page_t page, kvt_buf_ref_t *out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || out == NULL)
        return KVT_ERR_INVALID;
    if (page >= pool->total_pages)
        return KVT_ERR_BOUNDS;
    reg = kvt_pool_region_of(pool, page);
    out->region = reg->info.uuid;
    out->page = page - reg->info.first_page;
    return KVT_OK;
}

static void count_bounds_error(kvt_pool_t *pool)
{
    pthread_mutex_lock(&pool->lock);
    pool->bounds_error_total++;
    pthread_mutex_unlock(&pool->lock);
}

kvt_status_t kvt_pool_ref_to_page(const kvt_pool_t *pool, const kvt_buf_ref_t *ref, kvt_page_t *out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || ref == NULL || out == NULL)
        return KVT_ERR_INVALID;
    reg = region_by_uuid(pool, &ref->region);
    if (reg == NULL)
        return KVT_ERR_NOT_FOUND;
    if (ref->page >= reg->info.npages)
        return KVT_ERR_BOUNDS;
    *out = reg->info.first_page + ref->page;
    return KVT_OK;
}

kvt_status_t kvt_pool_ref_resolve(kvt_pool_t *pool, const kvt_buf_ref_t *ref, void **addr_out,
                                  size_t *len_out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || ref == NULL || addr_out == NULL)
        return KVT_ERR_INVALID;
    reg = region_by_uuid(pool, &ref->region);
    if (reg == NULL || ref->page >= reg->info.npages) {
        count_bounds_error(pool);
        return reg == NULL ? KVT_ERR_NOT_FOUND : KVT_ERR_BOUNDS;
    }
    *addr_out = (char *)reg->info.base + (size_t)ref->page * pool->page_size;
    if (len_out != NULL)
        *len_out = pool->page_size;
    return KVT_OK;
}

kvt_status_t kvt_pool_range_check(kvt_pool_t *pool, const kvt_uuid_t *uuid, uint64_t offset,
                                  uint64_t len, void **addr_out, kvt_page_t *page_out)
{
    const kvt_pool_region_t *reg;

    if (pool == NULL || uuid == NULL || addr_out == NULL)
        return KVT_ERR_INVALID;
    reg = region_by_uuid(pool, uuid);
    if (reg == NULL) {
        count_bounds_error(pool);
        return KVT_ERR_NOT_FOUND;
    }
    if (offset > reg->info.length || len > reg->info.length - offset ||
        (len == 0 && offset == reg->info.length)) {
        count_bounds_error(pool);
        return KVT_ERR_BOUNDS;
    }
    *addr_out = (char *)reg->info.base + offset;
    if (page_out != NULL)
        *page_out = reg->info.first_page + (kvt_page_t)(offset / pool->page_size);
    return KVT_OK;
}
