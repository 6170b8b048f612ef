/*
 * pdgw_alloc.h - the gateway's names for the base allocation wrapper (pdb/pdb_alloc.h).
 *
 * Everything the gateway allocates goes through these, so a test can make the Nth
 * allocation fail (pdgw_alloc_fail_at) and check that every error path unwinds cleanly;
 * the failing call's file:line is recorded. Memory is released with pdgw_free() (free()).
 */
#ifndef PDGW_ALLOC_H
#define PDGW_ALLOC_H

#include <stddef.h>

#include "pdb/pdb_alloc.h"

#define pdgw_malloc(size)       pdb_malloc(size)
#define pdgw_calloc(n, size)    pdb_calloc((n), (size))
#define pdgw_realloc(ptr, size) pdb_realloc((ptr), (size))
#define pdgw_strdup(s)          pdb_strdup(s)
#define pdgw_strndup(s, n)      pdb_strndup((s), (n))
#define pdgw_free               pdb_free

/*
 * Test hook: the <n>th allocation from now (1 = the next one) fails, and every later one
 * too when <sticky> is non-zero. n = 0 disables failure injection. Process-wide.
 */
static inline void pdgw_alloc_fail_at(long n, int sticky)
{
    pdb_alloc_fail_at(n > 0 ? (uint64_t)n : 0, sticky);
}

/* Number of allocations made through the wrapper since start (for sizing torture loops). */
static inline long pdgw_alloc_count(void)
{
    return (long)pdb_alloc_count();
}

#endif /* PDGW_ALLOC_H */
