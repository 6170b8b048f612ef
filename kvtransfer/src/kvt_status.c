/*
 * kvt_status.c -- status strings, the allocation wrapper with fault
 * injection, and the default monotonic clock.
 */
#include "kvt/kvt_status.h"
#include "kvt/kvt_clock.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct status_desc {
    const char *name;
    const char *text;
};

/* Indexed by -status for errors (0 = KVT_OK); KVT_INPROGRESS handled apart. */
static const struct status_desc status_table[] = {
    [0] = {"KVT_OK", "success"},
    [1] = {"KVT_ERR_INVALID", "invalid argument"},
    [2] = {"KVT_ERR_NOMEM", "out of memory"},
    [3] = {"KVT_ERR_NOT_FOUND", "not found"},
    [4] = {"KVT_ERR_EXISTS", "already exists"},
    [5] = {"KVT_ERR_TIMEOUT", "timed out"},
    [6] = {"KVT_ERR_NOSPACE", "not enough free pages"},
    [7] = {"KVT_ERR_TOO_LARGE", "request larger than the whole buffer"},
    [8] = {"KVT_ERR_BOUNDS", "out of the registered region's bounds"},
    [9] = {"KVT_ERR_ACCESS", "access to pages not granted"},
    [10] = {"KVT_ERR_DOUBLE_FREE", "double free of a page"},
    [11] = {"KVT_ERR_UNDERFLOW", "count dropped below zero"},
    [12] = {"KVT_ERR_BUSY", "resource busy"},
    [13] = {"KVT_ERR_BACKOFF", "peer backed off (circuit breaker open)"},
    [14] = {"KVT_ERR_BACKPRESSURE", "pinned pages above the high-water mark"},
    [15] = {"KVT_ERR_PEER", "peer failed or connection lost"},
    [16] = {"KVT_ERR_PROTO", "malformed message"},
    [17] = {"KVT_ERR_MSG_TYPE", "unknown message type"},
    [18] = {"KVT_ERR_MSG_FIELD", "missing or mistyped message field"},
    [19] = {"KVT_ERR_LIMIT", "size limit exceeded"},
    [20] = {"KVT_ERR_CANCELLED", "cancelled"},
    [21] = {"KVT_ERR_CLOSED", "closed or shutting down"},
    [22] = {"KVT_ERR_IO", "I/O error"},
    [23] = {"KVT_ERR_ALLOC_FAILED", "remote allocation failed"},
    [24] = {"KVT_ERR_CONFIG", "invalid configuration"},
    [25] = {"KVT_ERR_UNSUPPORTED", "not supported"},
    [26] = {"KVT_ERR_STATE", "invalid state for this call"},
};

static const struct status_desc *status_lookup(kvt_status_t status)
{
    if (status == KVT_INPROGRESS) {
        static const struct status_desc inprogress = {"KVT_INPROGRESS", "in progress"};
        return &inprogress;
    }
    if (status > 0 || status <= KVT_ERR_LAST)
        return NULL;
    return &status_table[-(int)status];
}

const char *kvt_strerror(kvt_status_t status)
{
    const struct status_desc *d = status_lookup(status);
    return d != NULL ? d->text : "unknown status";
}

const char *kvt_status_name(kvt_status_t status)
{
    const struct status_desc *d = status_lookup(status);
    return d != NULL ? d->name : "KVT_UNKNOWN";
}

/* ---- allocation wrapper ------------------------------------------------ */

static atomic_uint_fast64_t alloc_count;
static atomic_uint_fast64_t fail_at; /* absolute count that fails; 0 = off */
static atomic_int fail_sticky;

void kvt_alloc_fail_at(uint64_t n, int sticky)
{
    atomic_store(&fail_sticky, sticky ? 1 : 0);
    atomic_store(&fail_at, n == 0 ? 0 : atomic_load(&alloc_count) + n);
}

uint64_t kvt_alloc_count(void)
{
    return atomic_load(&alloc_count);
}

/* Counts one allocation; returns non-zero when it must fail. */
static int alloc_should_fail(void)
{
    uint64_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    uint64_t at = atomic_load(&fail_at);
    if (at == 0)
        return 0;
    if (n == at)
        return 1;
    return n > at && atomic_load(&fail_sticky);
}

void *kvt_malloc(size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return malloc(size == 0 ? 1 : size);
}

void *kvt_calloc(size_t nmemb, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    if (nmemb == 0 || size == 0)
        return calloc(1, 1);
    return calloc(nmemb, size);
}

void *kvt_realloc(void *ptr, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return realloc(ptr, size == 0 ? 1 : size);
}

char *kvt_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    return kvt_strndup(s, strlen(s));
}

char *kvt_strndup(const char *s, size_t n)
{
    size_t len;
    char *p;

    if (s == NULL)
        return NULL;
    len = strnlen(s, n);
    p = kvt_malloc(len + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

void kvt_free(void *ptr)
{
    free(ptr);
}

/* ---- clock --------------------------------------------------------------- */

uint64_t kvt_clock_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * KVT_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}
