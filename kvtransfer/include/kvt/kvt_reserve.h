/*
 * kvt_reserve.h -- receiver-side capacity reservations (ReserveRequest).
 *
 * A proxy reserves <total_chunks> pages of the receiver pool for a request
 * before its prefill starts. Granted if the pool's unreserved free pages
 * cover it. Allocations for that req_id then draw from the reservation
 * first (never failing for lack of pages while it lasts), while allocations
 * of other requests cannot eat into reserved pages. A reservation ends on
 * kvt_reserve_release() (request completed or CancelNotif) or when its TTL
 * passes without a draw (every draw renews it).
 *   free_chunks = pool free pages - pages still reserved.
 * Without any reservation the table is transparent: kvt_reserve_alloc() is
 * kvt_pool_alloc().
 *
 * Thread-safe; lock order reserve table -> pool.
 */
#ifndef KVT_RESERVE_H
#define KVT_RESERVE_H

#include <stdint.h>
#include "kvt/kvt_clock.h"
#include "kvt/kvt_pool.h"
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_RESERVE_MAX_ENTRIES 65536u

typedef struct kvt_reserve kvt_reserve_t;

typedef struct kvt_reserve_stats {
    uint32_t entries;        /* live reservations */
    uint64_t reserved_pages; /* pages still reserved (not yet drawn) */
    uint64_t granted_total;
    uint64_t refused_total;
    uint64_t expired_total;
    uint64_t released_total;
} kvt_reserve_stats_t;

/* <pool> is borrowed and must outlive the table. <default_ttl_ms> applies to
 * requests with ttl_ms <= 0. <clock> copied; NULL = monotonic. */
kvt_status_t kvt_reserve_create(kvt_pool_t *pool, uint64_t default_ttl_ms, const kvt_clock_t *clock,
                                kvt_reserve_t **out);
void kvt_reserve_destroy(kvt_reserve_t *t);

/* Handle a ReserveRequest. Always KVT_OK for valid arguments (the answer is
 * *granted_out); KVT_ERR_INVALID for an empty req_id or total_chunks < 0.
 * A second request for a live req_id re-sizes it to max(remaining, asked)
 * (granted if the extra fits). total_chunks > whole pool -> not granted.
 * *free_chunks_out = free_chunks after the decision. */
kvt_status_t kvt_reserve_request(kvt_reserve_t *t, const char *req_id, int64_t total_chunks,
                                 int64_t ttl_ms, int *granted_out, int64_t *free_chunks_out);

/* Allocate for <req_id> (NULL or "" = no reservation): same contract as
 * kvt_pool_alloc (flags KVT_ALLOC_PARTIAL, failed bitmap, TOO_LARGE fast
 * fail). Pages come from the req_id's reservation first, then from
 * unreserved free pages. */
kvt_status_t kvt_reserve_alloc(kvt_reserve_t *t, const char *req_id, uint32_t n, unsigned flags,
                               kvt_page_t *pages_out, uint8_t *failed_bitmap, uint32_t *nalloc_out);

/* End the reservation of <req_id> (unused pages become free for everybody).
 * KVT_ERR_NOT_FOUND if there is none. */
kvt_status_t kvt_reserve_release(kvt_reserve_t *t, const char *req_id);

/* Drop reservations whose TTL passed; *nexpired_out (may be NULL). */
kvt_status_t kvt_reserve_sweep(kvt_reserve_t *t, uint32_t *nexpired_out);

/* free pages - reserved pages (>= 0). */
int64_t kvt_reserve_free_chunks(kvt_reserve_t *t);

/* The earliest expiry (clock ns) of a reservation held, UINT64_MAX when none. */
uint64_t kvt_reserve_next_deadline(kvt_reserve_t *t);

/* Pages still reserved for <req_id>; KVT_ERR_NOT_FOUND if none. */
kvt_status_t kvt_reserve_remaining(kvt_reserve_t *t, const char *req_id, uint32_t *remaining_out);

void kvt_reserve_stats(kvt_reserve_t *t, kvt_reserve_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* KVT_RESERVE_H */
