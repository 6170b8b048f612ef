/*
 * One allocation wrapper for libpdsched so tests can fail the Nth
 * allocation (sched_alloc_fail_after) and check every error path unwinds.
 */
#ifndef PDSCHED_SCHED_ALLOC_INT_H
#define PDSCHED_SCHED_ALLOC_INT_H

#include <stddef.h>

void *sched_malloc(size_t size);
void *sched_calloc(size_t n, size_t size);
void *sched_realloc(void *ptr, size_t size);
char *sched_strdup(const char *s);
/* Zeroed, aligned to <align> (a power of two ≥ sizeof(void *)); free with sched_free. */
void *sched_aligned_calloc(size_t align, size_t size);
void sched_free(void *ptr);

/* Test hook: the <n>th allocation from now (0-based) and every later one
 * fail until reset with a negative <n>. */
void sched_alloc_fail_after(long n);

#endif /* PDSCHED_SCHED_ALLOC_INT_H */
