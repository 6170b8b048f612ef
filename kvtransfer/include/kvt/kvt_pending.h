/*
 * kvt_pending.h -- sender-side pull bookkeeping: the pull-pending table with
 * its TTL sweep (pd_pull_pending_ttl), early PullDoneSignal handling, and the
 * backpressure check (pd_pull_backpressure_reserve_pct).
 *
 * A pull is registered with the pages it pinned. It leaves the table in
 * exactly one of three ways, each handing the entry back to the caller, who
 * then unpins the pages (kvt_pending_entry_release() does it for pool pages):
 *   - kvt_pending_done()   a PullDoneSignal arrived;
 *   - kvt_pending_sweep()  its TTL ran out (dead receiver);
 *   - kvt_pending_cancel() a CancelNotif for its req_id.
 * A PullDoneSignal that arrives BEFORE its pull was added (the receiver can
 * be faster than the sender's bookkeeping) is remembered (bounded, same TTL);
 * the later kvt_pending_add() then reports "already done" and the caller
 * releases at once.
 *
 * Pure data structure with an injectable clock; thread-safe. Callbacks run
 * without the table lock held.
 */
#ifndef KVT_PENDING_H
#define KVT_PENDING_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_clock.h"
#include "kvt/kvt_pool.h"
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_PENDING_MAX_EARLY 65536u /* remembered early done signals */

typedef struct kvt_pending kvt_pending_t;

/* An entry handed back to the caller; owns pull_id, req_id and pages. */
typedef struct kvt_pending_entry {
    char *pull_id;
    char *req_id;
    kvt_pool_t *pool; /* pool of <pages> (may be NULL if the caller manages pages) */
    kvt_page_t *pages;
    uint32_t npages;
    void *user; /* caller's context, untouched */
    uint64_t added_ns;
    uint64_t deadline_ns;
} kvt_pending_entry_t;

typedef struct kvt_pending_stats {
    uint32_t entries; /* pulls pending */
    uint64_t pages;   /* pages held by pending pulls */
    uint32_t early;   /* early done signals remembered */
    uint64_t done_total;
    uint64_t expired_total; /* released by the sweep */
    uint64_t cancelled_total;
    uint64_t early_total;         /* done signals that came before their pull */
    uint64_t early_dropped_total; /* early records dropped (bound / TTL) */
} kvt_pending_stats_t;

/* <ttl_s>: pd_pull_pending_ttl. <clock> copied; NULL = monotonic. */
kvt_status_t kvt_pending_create(double ttl_s, const kvt_clock_t *clock, kvt_pending_t **out);
/* Frees the table and every entry still in it WITHOUT releasing pages (call
 * kvt_pending_drain first to get them). */
void kvt_pending_destroy(kvt_pending_t *t);

/* Register pull <pull_id> of request <req_id> ("" allowed) holding <pages>
 * (copied) of <pool>. KVT_ERR_EXISTS if pull_id is pending already.
 * If its done signal already came: nothing is added, *already_done_out = 1
 * and the caller releases the pages now; else *already_done_out = 0. */
kvt_status_t kvt_pending_add(kvt_pending_t *t, const char *pull_id, const char *req_id,
                             kvt_pool_t *pool, const kvt_page_t *pages, uint32_t npages, void *user,
                             int *already_done_out);

/* A PullDoneSignal for <pull_id>. KVT_OK: the entry is moved to *out (caller
 * releases, then kvt_pending_entry_clear). KVT_ERR_NOT_FOUND: not registered
 * (yet) -- remembered as an early done signal. */
kvt_status_t kvt_pending_done(kvt_pending_t *t, const char *pull_id, kvt_pending_entry_t *out);

/* Called for each entry removed by sweep / cancel / drain. The callback owns
 * the entry's contents for its duration; the table clears it afterwards. If
 * NULL, the entry's pages are released with kvt_pending_entry_release(). */
typedef void (*kvt_pending_cb)(void *arg, kvt_pending_entry_t *e);

/* Remove every entry whose deadline passed (and stale early records); calls
 * <cb> for each removed entry. Returns the number removed via *nexpired_out
 * (may be NULL). */
kvt_status_t kvt_pending_sweep(kvt_pending_t *t, kvt_pending_cb cb, void *arg,
                               uint32_t *nexpired_out);

/* Remove every entry of <req_id> (CancelNotif). */
kvt_status_t kvt_pending_cancel(kvt_pending_t *t, const char *req_id, kvt_pending_cb cb, void *arg,
                                uint32_t *ncancelled_out);

/* Remove everything (shutdown). */
void kvt_pending_drain(kvt_pending_t *t, kvt_pending_cb cb, void *arg);

/* Earliest deadline of a pending entry (to size a poll timeout); UINT64_MAX
 * when empty. */
uint64_t kvt_pending_next_deadline(kvt_pending_t *t);

void kvt_pending_stats(kvt_pending_t *t, kvt_pending_stats_t *out);

/* Unpin the entry's pages in its pool (no-op without a pool). */
kvt_status_t kvt_pending_entry_release(kvt_pending_entry_t *e);
/* Free the entry's contents (not the struct). */
void kvt_pending_entry_clear(kvt_pending_entry_t *e);

/* ---- backpressure --------------------------------------------------------
 * New pinned pulls are refused while pinned + n_new would exceed the
 * high-water mark floor((1 - reserve_pct/100) * total_pages). A request that
 * alone exceeds the mark is admitted when nothing is pinned (otherwise it
 * could never run). KVT_OK or KVT_ERR_BACKPRESSURE. */
kvt_status_t kvt_backpressure_check(uint32_t pinned_pages, uint32_t total_pages, double reserve_pct,
                                    uint32_t n_new);
/* The high-water mark itself. */
uint32_t kvt_backpressure_hwm(uint32_t total_pages, double reserve_pct);
/* Same check against a pool's current pinned count. */
kvt_status_t kvt_backpressure_check_pool(kvt_pool_t *pool, double reserve_pct, uint32_t n_new);

#ifdef __cplusplus
}
#endif
#endif /* KVT_PENDING_H */
