/*
 * pdq_bucket.h - one budget as a token bucket (internal).
 *
 * Why a token bucket (GCRA in continuous form) and not a window counter: it holds the budget
 * over every interval, not only aligned minutes (a fixed window lets 2x through at a
 * boundary, a two-bucket sliding window only approximates), and it answers the three
 * questions the client wants exactly: how much is left now, when a request of a given cost
 * fits (Retry-After), and when the bucket is full again (x-ratelimit-reset-*). A budget of
 * L per period T is a bucket of L refilled at L/T.
 *
 * A request larger than the whole budget is admitted once the bucket is full and leaves it
 * in debt (level < 0), so it can never wait forever; reconcile may also leave debt.
 *
 * Local mode refills from the clock. Leased mode (a store is configured and reachable)
 * refills only from leases that the store thread takes from the fleet-wide bucket. A
 * replica's balance swings within one slice: leases top it up to +slice/2, and it may run
 * down to -slice/2 (debt the store thread pays back from the fleet first) so that an empty
 * lease does not refuse while the fleet has tokens. So N replicas admit at most N x slice
 * more than one bucket would, and hold at most N x slice/2 unused (see quota/README.md).
 */
#ifndef PDQ_BUCKET_H
#define PDQ_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pdq_bucket {
    double cap;       /* budget per period; 0 = unlimited (the bucket is off) */
    double local_cap; /* cap while serving on local limits (fail open: cap / replicas) */
    double period_ns;
    double level;   /* tokens spendable now; < 0 = debt */
    uint64_t stamp; /* time of level (local mode) */
    bool leased;    /* level comes from store leases, no refill */
    /* leased mode, written by the store thread under the tenant's lock */
    double fleet_level; /* the fleet bucket's level at the last sync */
    uint64_t fleet_stamp;
    bool fleet_known; /* a sync has reported the fleet's level since leased mode began */
    double want;      /* largest cost refused since the last sync */
    double slice;     /* a replica's swing: leased up to +slice/2, may run down to -slice/2 */
    uint64_t sync_ns; /* the store's sync interval: the soonest a new lease can come */
    uint64_t last_use;
} pdq_bucket_t;

void pdq_bucket_init(pdq_bucket_t *b, uint64_t budget, double period_s, double local_share,
                     uint64_t now);
/* Bring a local bucket's level to <now>. */
void pdq_bucket_refill(pdq_bucket_t *b, uint64_t now);
/* Nanoseconds until <cost> fits (0 = now); UINT64_MAX when it never will by refill alone. */
uint64_t pdq_bucket_wait_ns(const pdq_bucket_t *b, double cost, uint64_t now);
/* Spend <cost> (may be negative to refund; the level never exceeds the cap). */
void pdq_bucket_spend(pdq_bucket_t *b, double cost, uint64_t now);
/* Tokens left (>= 0) and nanoseconds until full, as the client should see them. */
double pdq_bucket_remaining(const pdq_bucket_t *b, uint64_t now);
uint64_t pdq_bucket_reset_ns(const pdq_bucket_t *b, uint64_t now);
/* Switch to leased mode (keeping any debt) or back to local mode (keeping what is held). */
void pdq_bucket_set_leased(pdq_bucket_t *b, bool leased, uint64_t now);

static inline bool pdq_bucket_on(const pdq_bucket_t *b)
{
    return b->cap > 0;
}

#endif /* PDQ_BUCKET_H */
