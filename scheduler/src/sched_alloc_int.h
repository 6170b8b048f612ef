/*
 * libpdsched's names for the base allocation wrapper (pdb/pdb_alloc.h), so tests can fail
 * the Nth allocation (sched_alloc_fail_after) and check every error path unwinds.
 */
#ifndef PDSCHED_SCHED_ALLOC_INT_H
#define PDSCHED_SCHED_ALLOC_INT_H

#include <stddef.h>

#include "pdb/pdb_alloc.h"

/* sched_strdup(NULL) copies "" (callers rely on a non-NULL copy). */
static inline const char *sched_str_or_empty(const char *s)
{
    return s != NULL ? s : "";
}

#define sched_malloc(size)       pdb_malloc(size)
#define sched_calloc(n, size)    pdb_calloc((n), (size))
#define sched_realloc(ptr, size) pdb_realloc((ptr), (size))
#define sched_strdup(s)          pdb_strdup(sched_str_or_empty(s))
/* Zeroed, aligned to <align> (a power of two >= sizeof(void *)); free with sched_free. */
#define sched_aligned_calloc(align, size) pdb_aligned_calloc((align), (size))
#define sched_free                        pdb_free

/* Test hook: the <n>th allocation from now (0-based) and every later one
 * fail until reset with a negative <n>. */
static inline void sched_alloc_fail_after(long n)
{
    pdb_alloc_fail_at(n < 0 ? 0 : (uint64_t)n + 1, 1);
}

#endif /* PDSCHED_SCHED_ALLOC_INT_H */
