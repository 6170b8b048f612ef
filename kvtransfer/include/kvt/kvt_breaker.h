/*
 * kvt_breaker.h -- per-peer circuit breaker (pd_alloc_fail_backoff_ttl).
 *
 * When a receiver answers alloc_failed, the sender trips the breaker of that
 * peer: transfers to it are skipped until now + ttl; after that the peer is
 * allowed again (and the entry disappears). Pure data structure with an
 * injectable clock; thread-safe.
 */
#ifndef KVT_BREAKER_H
#define KVT_BREAKER_H

#include <stdint.h>
#include "kvt/kvt_clock.h"
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_breaker kvt_breaker_t;

typedef struct kvt_breaker_stats {
    uint32_t open_peers;    /* gauge kvt_breaker_open (expired entries pruned first) */
    uint64_t trips_total;   /* trip() calls */
    uint64_t skips_total;   /* check()/allow() calls refused */
    uint64_t resumes_total; /* peers allowed again after their TTL */
} kvt_breaker_stats_t;

/* <ttl_s> seconds of backoff (pd_alloc_fail_backoff_ttl; 0 disables the
 * breaker: nothing is ever skipped). <clock> is copied; NULL = monotonic. */
kvt_status_t kvt_breaker_create(double ttl_s, const kvt_clock_t *clock, kvt_breaker_t **out);
void kvt_breaker_destroy(kvt_breaker_t *b);

/* Back <peer> off until now + ttl (a trip while open extends it). */
kvt_status_t kvt_breaker_trip(kvt_breaker_t *b, const char *peer);

/* KVT_OK if transfers to <peer> may go ahead, KVT_ERR_BACKOFF (counted as a
 * skip) while backed off. Optional *remaining_ns_out = time left (0 if OK). */
kvt_status_t kvt_breaker_check(kvt_breaker_t *b, const char *peer, uint64_t *remaining_ns_out);

/* Close the breaker of <peer> at once (e.g. an allocation succeeded). */
void kvt_breaker_reset(kvt_breaker_t *b, const char *peer);

void kvt_breaker_stats(kvt_breaker_t *b, kvt_breaker_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* KVT_BREAKER_H */
