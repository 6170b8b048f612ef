/*
 * pdgw_freelist.c - per-worker free lists of fixed-size objects (pdgw_freelist.h).
 *
 * Each object carries a small header in front of it that links it into the list while it is
 * listed, so the whole object can be poisoned for AddressSanitizer.
 */
#include "pdgw_freelist.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "pdgw_alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define FL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FL_ASAN 1
#endif
#endif
#ifdef FL_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* 16 bytes keep the object aligned like malloc's memory. */
typedef union fl_hdr {
    void *next;
    max_align_t align;
} fl_hdr_t;

static atomic_bool fl_bypass;

void pdgw_freelist_test_bypass(bool on)
{
    atomic_store_explicit(&fl_bypass, on, memory_order_relaxed);
}

void pdgw_freelist_init(pdgw_freelist_t *fl, size_t obj_size, unsigned max_free)
{
    memset(fl, 0, sizeof(*fl));
    fl->obj_size = obj_size;
    fl->max_free = max_free;
}

/* A listed object unpoisoned (its bytes as they were left), or NULL when none is listed. */
static void *take_listed(pdgw_freelist_t *fl)
{
    fl_hdr_t *h = fl->head;
    if (h == NULL || atomic_load_explicit(&fl_bypass, memory_order_relaxed))
        return NULL;
    fl->head = h->next;
    fl->n_free--;
    fl->n_reuse++;
    UNPOISON(h + 1, fl->obj_size);
    return h + 1;
}

static void *take_new(pdgw_freelist_t *fl)
{
    fl_hdr_t *h = pdgw_calloc(1, sizeof(*h) + fl->obj_size);
    if (h == NULL)
        return NULL;
    fl->n_alloc++;
    return h + 1;
}

void *pdgw_freelist_get(pdgw_freelist_t *fl)
{
    void *p = take_listed(fl);
    if (p != NULL)
        return memset(p, 0, fl->obj_size);
    return take_new(fl);
}

void *pdgw_freelist_get_dirty(pdgw_freelist_t *fl)
{
    void *p = take_listed(fl);
    return p != NULL ? p : take_new(fl);
}

void pdgw_freelist_put(pdgw_freelist_t *fl, void *p)
{
    fl_hdr_t *h;
    if (p == NULL)
        return;
    h = (fl_hdr_t *)p - 1;
    if (fl->n_free >= fl->max_free || atomic_load_explicit(&fl_bypass, memory_order_relaxed)) {
        pdgw_free(h);
        return;
    }
    POISON(p, fl->obj_size);
    h->next = fl->head;
    fl->head = h;
    fl->n_free++;
}

void pdgw_freelist_drain(pdgw_freelist_t *fl)
{
    while (fl->head != NULL) {
        fl_hdr_t *h = fl->head;
        fl->head = h->next;
        UNPOISON(h + 1, fl->obj_size);
        pdgw_free(h);
    }
    fl->n_free = 0;
}
