/*
 * kvt_pool_int.h -- pool internals shared by kvt_pool.c and kvt_pool_mem.c.
 */
#ifndef KVT_POOL_INT_H
#define KVT_POOL_INT_H

#include <pthread.h>
#include "kvt/kvt_pool.h"

typedef struct kvt_pool_region {
    kvt_region_info_t info;
    int external; /* memory belongs to the caller */
    void *handles[KVT_POOL_MAX_HOOKS];
} kvt_pool_region_t;

struct kvt_pool {
    pthread_mutex_t lock;      /* pages, counts, stats */
    pthread_mutex_t hook_lock; /* hooks and region handles */
    char *name;
    kvt_mem_class_t mem_class;
    const kvt_mem_ops_t *ops;
    void *ops_ctx;
    size_t page_size;
    uint32_t total_pages;
    uint32_t nregions;
    kvt_pool_region_t *regions;
    kvt_region_hook_t hooks[KVT_POOL_MAX_HOOKS];
    uint32_t nhooks;

    uint32_t *ref;
    uint32_t *pin;
    uint32_t *free_stack; /* free pages; top = next handed out */
    uint32_t nfree;
    uint32_t npinned;

    uint64_t alloc_total;
    uint64_t alloc_fail_total;
    uint64_t too_large_total;
    uint64_t double_free_total;
    uint64_t underflow_total;
    uint64_t bounds_error_total;
};

/* Region holding pool page <page> (page < total_pages). */
const kvt_pool_region_t *kvt_pool_region_of(const kvt_pool_t *pool, kvt_page_t page);

#endif /* KVT_POOL_INT_H */
