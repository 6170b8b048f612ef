/*
 * kvt_status.h -- libkvt status codes and the allocation wrapper.
 *
 * Every libkvt function that can fail returns a kvt_status_t: 0 is success,
 * a positive value means "in progress / not finished yet", a negative value
 * is an error.  Output parameters are written only on KVT_OK (unless a
 * function documents otherwise).
 *
 * All heap memory of libkvt goes through kvt_malloc()/kvt_calloc()/
 * kvt_realloc()/kvt_strdup()/kvt_free() so tests can make the Nth allocation
 * fail (kvt_alloc_fail_at()) and check that every error path unwinds.
 */
#ifndef KVT_STATUS_H
#define KVT_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvt_status {
    KVT_OK = 0,
    KVT_INPROGRESS = 1, /* operation started, completion reported later */

    KVT_ERR_INVALID = -1,       /* bad argument from the caller */
    KVT_ERR_NOMEM = -2,         /* heap allocation failed */
    KVT_ERR_NOT_FOUND = -3,     /* unknown key / id / region */
    KVT_ERR_EXISTS = -4,        /* duplicate key / id */
    KVT_ERR_TIMEOUT = -5,       /* a wait ran out of time */
    KVT_ERR_NOSPACE = -6,       /* pool has not enough free pages */
    KVT_ERR_TOO_LARGE = -7,     /* request larger than the whole buffer: fails fast */
    KVT_ERR_BOUNDS = -8,        /* buffer ref / offset out of the registered region */
    KVT_ERR_ACCESS = -9,        /* access to pages not granted to that peer */
    KVT_ERR_DOUBLE_FREE = -10,  /* free / unref of a page that is not allocated */
    KVT_ERR_UNDERFLOW = -11,    /* unpin below zero */
    KVT_ERR_BUSY = -12,         /* resource in use (pinned page, ...) */
    KVT_ERR_BACKOFF = -13,      /* peer is backed off by the circuit breaker */
    KVT_ERR_BACKPRESSURE = -14, /* pinned pages above the high-water mark */
    KVT_ERR_PEER = -15,         /* peer failed / connection lost */
    KVT_ERR_PROTO = -16,        /* malformed message (msgpack or frame) */
    KVT_ERR_MSG_TYPE = -17,     /* well-formed message of an unknown "type" */
    KVT_ERR_MSG_FIELD = -18,    /* missing required field or field of wrong type */
    KVT_ERR_LIMIT = -19,        /* input exceeds a size bound (keys, string length, ...) */
    KVT_ERR_CANCELLED = -20,    /* request cancelled (CancelNotif, shutdown) */
    KVT_ERR_CLOSED = -21,       /* engine / socket closed or shutting down */
    KVT_ERR_IO = -22,           /* system call failed (errno logged) */
    KVT_ERR_ALLOC_FAILED = -23, /* the remote side answered alloc_failed */
    KVT_ERR_CONFIG = -24,       /* bad configuration (unknown key, bad value) */
    KVT_ERR_UNSUPPORTED = -25,  /* feature not built in / not available */
    KVT_ERR_STATE = -26,        /* call not valid in the object's current state */
    KVT_ERR_LAST = -27          /* sentinel, not a real status */
} kvt_status_t;

/* Short static description of <status>; never NULL ("unknown status" for
 * values outside the enum). */
const char *kvt_strerror(kvt_status_t status);

/* Stable symbolic name of <status>, e.g. "KVT_ERR_NOSPACE"; never NULL. Useful
 * as a metric label. */
const char *kvt_status_name(kvt_status_t status);

/* ---- allocation wrapper -------------------------------------------------
 * libkvt's names for the base wrapper (pdb/pdb_alloc.h): same contracts as
 * malloc/calloc/realloc/strdup/free; kvt_strndup copies at most n bytes and
 * always NUL-terminates; the failing call's file:line is recorded. */
#define kvt_malloc(size)        pdb_malloc(size)
#define kvt_calloc(nmemb, size) pdb_calloc((nmemb), (size))
#define kvt_realloc(ptr, size)  pdb_realloc((ptr), (size))
#define kvt_strdup(s)           pdb_strdup(s)
#define kvt_strndup(s, n)       pdb_strndup((s), (n))
#define kvt_free                pdb_free

/* Fault injection for tests: the <n>th allocation from now (1 = the next one)
 * fails, as do all later ones when <sticky> is non-zero. n = 0 disarms.
 * Process-wide (every library allocates through the base wrapper). */
static inline void kvt_alloc_fail_at(uint64_t n, int sticky)
{
    pdb_alloc_fail_at(n, sticky);
}

/* Number of allocations made through the wrapper since process start
 * (successful or not). Lets a test loop "fail allocation 1..N". */
static inline uint64_t kvt_alloc_count(void)
{
    return pdb_alloc_count();
}

#ifdef __cplusplus
}
#endif
#endif /* KVT_STATUS_H */
