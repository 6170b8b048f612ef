/*
 * pdgw_freelist.h - a per-worker free list of fixed-size objects.
 *
 * Request objects and their buffers are allocated once per worker and then recycled: a
 * freed object goes onto its worker's list (up to a bound) and the next allocation takes it
 * back zeroed, so the steady state of a busy worker makes no malloc/free calls for them.
 * One thread owns a list; nothing is locked.
 *
 * Under AddressSanitizer a listed object is poisoned, so a use after "free" is still
 * reported as one even though the memory was not given back to the allocator.
 */
#ifndef PDGW_FREELIST_H
#define PDGW_FREELIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pdgw_freelist {
    size_t obj_size;
    unsigned max_free; /* objects kept at most; beyond that they are freed */
    unsigned n_free;
    void *head; /* listed objects, linked through a header in front of each */
    /* counters (tests, metrics) */
    unsigned long n_alloc; /* objects taken from the allocator */
    unsigned long n_reuse; /* objects taken from the list */
} pdgw_freelist_t;

void pdgw_freelist_init(pdgw_freelist_t *fl, size_t obj_size, unsigned max_free);
/* A zeroed object of fl->obj_size bytes (from the list, or a new one); NULL when out of
 * memory. */
void *pdgw_freelist_get(pdgw_freelist_t *fl);
/* The same without the zeroing: a listed object keeps the bytes its last user left, for a
 * caller that sets every byte itself (zeroing a large object it then initializes part by
 * part writes its memory twice). */
void *pdgw_freelist_get_dirty(pdgw_freelist_t *fl);
/* Give <p> (from pdgw_freelist_get of the same list, or NULL) back. */
void pdgw_freelist_put(pdgw_freelist_t *fl, void *p);
/* Free every listed object. */
void pdgw_freelist_drain(pdgw_freelist_t *fl);

/* Test hook, process-wide, may be flipped from any thread: while <on>, every list hands out
 * new objects and frees those given back (its listed ones stay listed), so each object a
 * request takes is an allocation a torture run can fail. */
void pdgw_freelist_test_bypass(bool on);

#endif /* PDGW_FREELIST_H */
