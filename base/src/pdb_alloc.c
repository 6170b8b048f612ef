/*
 * pdb_alloc.c - allocation wrapper with fault injection (see pdb_alloc.h), and the hook
 * that routes jansson's allocations through it.
 */
#include "pdb/pdb_alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t alloc_count;
/* Allocations are counted only once something asks (a test, the environment): a production
 * process pays one plain load per allocation, not an atomic add on a line both workers share. */
static atomic_int counting;
static atomic_uint_fast64_t fail_at; /* absolute allocation number that fails; 0 = never */
static atomic_int fail_sticky;
static int report_failures; /* set from the environment: name each injected failure */

static pthread_mutex_t site_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t site_number;
static const char *site_file;
static int site_line;

void pdb_alloc_fail_at(uint64_t n, int sticky)
{
    atomic_store(&counting, 1);
    atomic_store(&fail_sticky, sticky != 0);
    atomic_store(&fail_at, n == 0 ? 0 : atomic_load(&alloc_count) + n);
}

uint64_t pdb_alloc_count(void)
{
    atomic_store(&counting, 1);
    return atomic_load(&alloc_count);
}

uint64_t pdb_alloc_last_failure(char *buf, size_t len)
{
    uint64_t n;

    pthread_mutex_lock(&site_lock);
    n = site_number;
    if (len > 0)
        snprintf(buf, len, "%s:%d", site_file != NULL ? site_file : "", site_line);
    if (n == 0 && len > 0)
        buf[0] = '\0';
    pthread_mutex_unlock(&site_lock);
    return n;
}

/* Counts one allocation; non-zero when it must fail (the site is then remembered). */
static int should_fail(const char *file, int line)
{
    uint64_t n, at;

    if (!atomic_load_explicit(&counting, memory_order_relaxed))
        return 0;
    n = atomic_fetch_add(&alloc_count, 1) + 1;
    at = atomic_load(&fail_at);

    if (at == 0 || n < at || (n > at && !atomic_load(&fail_sticky)))
        return 0;
    pthread_mutex_lock(&site_lock);
    site_number = n;
    site_file = file;
    site_line = line;
    pthread_mutex_unlock(&site_lock);
    if (report_failures && n == at)
        fprintf(stderr, "pdb: injected failure of allocation %llu at %s:%d\n",
                (unsigned long long)n, file, line);
    return 1;
}

void *pdb_malloc_at(size_t size, const char *file, int line)
{
    return should_fail(file, line) ? NULL : malloc(size != 0 ? size : 1);
}

/* glibc's calloc skips the per-thread cache and takes the arena lock every time; a small block
 * (the cache holds blocks up to about 1 KiB) is cheaper taken from the cache and zeroed here.
 * Larger ones stay with calloc, which knows when fresh pages are already zero. */
#define CALLOC_FROM_CACHE_MAX 1024

void *pdb_calloc_at(size_t n, size_t size, const char *file, int line)
{
    size_t total;
    void *p;
    if (should_fail(file, line))
        return NULL;
    if (n == 0 || size == 0)
        return calloc(1, 1);
    if (__builtin_mul_overflow(n, size, &total) || total > CALLOC_FROM_CACHE_MAX)
        return calloc(n, size);
    if ((p = malloc(total)) != NULL) {
        /* Compilers turn malloc-then-memset back into calloc; the barrier keeps them apart. */
        __asm__ volatile("" : : "r"(p) : "memory");
        memset(p, 0, total);
    }
    return p;
}

void *pdb_realloc_at(void *ptr, size_t size, const char *file, int line)
{
    return should_fail(file, line) ? NULL : realloc(ptr, size != 0 ? size : 1);
}

char *pdb_strndup_at(const char *s, size_t n, const char *file, int line)
{
    size_t len;
    char *p;

    if (s == NULL)
        return NULL;
    len = strnlen(s, n);
    p = pdb_malloc_at(len + 1, file, line);
    if (p != NULL) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

char *pdb_strdup_at(const char *s, const char *file, int line)
{
    return s != NULL ? pdb_strndup_at(s, strlen(s), file, line) : NULL;
}

void *pdb_aligned_calloc_at(size_t align, size_t size, const char *file, int line)
{
    void *p = NULL;

    if (should_fail(file, line) || posix_memalign(&p, align, size != 0 ? size : 1) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

void pdb_free(void *ptr)
{
    if (ptr != NULL) /* a request frees many fields it never filled: no call for those */
        free(ptr);
}

static void *json_alloc(size_t size)
{
    return pdb_malloc_at(size, "jansson", 0);
}

static const char *count_file;

static void write_count(void)
{
    FILE *f = fopen(count_file, "w");
    if (f != NULL) {
        fprintf(f, "%llu\n", (unsigned long long)pdb_alloc_count());
        fclose(f);
    }
}

/* Before main(): jansson allocates through the wrapper, and the environment may arm it. */
__attribute__((constructor)) static void pdb_alloc_setup(void)
{
    const char *n = getenv("PDB_ALLOC_FAIL");
    const char *sticky = getenv("PDB_ALLOC_FAIL_STICKY");

    json_set_alloc_funcs(json_alloc, free);
    count_file = getenv("PDB_ALLOC_COUNT_FILE");
    if (count_file != NULL && count_file[0] != '\0') {
        atomic_store(&counting, 1);
        atexit(write_count);
    }
    if (n != NULL && strtoull(n, NULL, 10) > 0) {
        atomic_store(&counting, 1);
        /* N counts from the start of the process, constructors included */
        report_failures = 1;
        atomic_store(&fail_sticky, sticky != NULL && sticky[0] == '1');
        atomic_store(&fail_at, strtoull(n, NULL, 10));
    }
}
