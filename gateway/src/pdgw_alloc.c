/*
 * pdgw_alloc.c - allocation wrapper with failure injection for tests.
 */
#include "pdgw_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long alloc_count;
static atomic_long fail_at; /* absolute allocation number that fails, 0 = never */
static atomic_int fail_sticky;

void pdgw_alloc_fail_at(long n, int sticky)
{
    atomic_store(&fail_sticky, sticky != 0);
    atomic_store(&fail_at, n > 0 ? atomic_load(&alloc_count) + n : 0);
}

long pdgw_alloc_count(void)
{
    return atomic_load(&alloc_count);
}

/* Counts the allocation; non-zero when it must fail. */
static int should_fail(void)
{
    long n = atomic_fetch_add(&alloc_count, 1) + 1;
    long f = atomic_load(&fail_at);
    if (f == 0)
        return 0;
    return n == f || (n > f && atomic_load(&fail_sticky));
}

void *pdgw_malloc(size_t size)
{
    return should_fail() ? NULL : malloc(size);
}

void *pdgw_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : calloc(n, size);
}

void *pdgw_realloc(void *ptr, size_t size)
{
    return should_fail() ? NULL : realloc(ptr, size);
}

char *pdgw_strdup(const char *s)
{
    return pdgw_strndup(s, strlen(s));
}

char *pdgw_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *p = pdgw_malloc(len + 1);
    if (p != NULL) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

void pdgw_free(void *ptr)
{
    free(ptr);
}
