/* Allocation wrapper with failure injection for tests. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sched_alloc_int.h"

static _Atomic long fail_countdown = -1;

static int should_fail(void)
{
    long cur = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    while (cur >= 0) {
        if (cur == 0)
            return 1;
        if (atomic_compare_exchange_weak(&fail_countdown, &cur, cur - 1))
            return 0;
    }
    return 0;
}

void sched_alloc_fail_after(long n)
{
    atomic_store(&fail_countdown, n < 0 ? -1 : n);
}

void *sched_malloc(size_t size)
{
    if (should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *sched_calloc(size_t n, size_t size)
{
    if (should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *sched_realloc(void *ptr, size_t size)
{
    if (should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
}

void *sched_aligned_calloc(size_t align, size_t size)
{
    void *p = NULL;

    if (should_fail())
        return NULL;
    if (posix_memalign(&p, align, size ? size : 1) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

char *sched_strdup(const char *s)
{
    size_t len;
    char *copy;

    if (!s)
        s = "";
    len = strlen(s);
    copy = sched_malloc(len + 1);
    if (copy)
        memcpy(copy, s, len + 1);
    return copy;
}

void sched_free(void *ptr)
{
    free(ptr);
}
