/*
 * pdgw_alloc.h - the one allocation wrapper of the gateway.
 *
 * Everything the gateway allocates may go through these, so a test can make the Nth
 * allocation fail (pdgw_alloc_fail_at) and check that every error path unwinds cleanly.
 * Memory from these functions is released with pdgw_free() (which is free()), so it may
 * be mixed with plain malloc/free.
 */
#ifndef PDGW_ALLOC_H
#define PDGW_ALLOC_H

#include <stddef.h>

void *pdgw_malloc(size_t size);
void *pdgw_calloc(size_t n, size_t size);
void *pdgw_realloc(void *ptr, size_t size);
char *pdgw_strdup(const char *s);
char *pdgw_strndup(const char *s, size_t n);
void pdgw_free(void *ptr);

/*
 * Test hook: the <n>th allocation from now (1 = the next one) fails, and every later one
 * too when <sticky> is non-zero. n = 0 disables failure injection. Thread-safe.
 */
void pdgw_alloc_fail_at(long n, int sticky);
/* Number of allocations made through the wrapper since start (for sizing torture loops). */
long pdgw_alloc_count(void);

#endif /* PDGW_ALLOC_H */
