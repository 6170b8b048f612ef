/*
 * pdq_fairq.h - weighted fair queue of waiting requests across tenants.
 *
 * Start-time fair queuing on token costs: a request pushed for tenant i gets the start tag
 * S = max(V, F_i) and the tenant's finish tag becomes F_i = S + cost / weight_i; pop serves the
 * lowest start tag among tenants' head requests and moves the virtual time V to it. A tenant
 * that floods only pushes its own tags further out, so a newcomer is served within one
 * request of each other tenant; long-run shares of tokens follow the weights. Priority
 * classes come strictly first (each class keeps its own virtual time).
 *
 * The tenants live in a min-heap (the base layer's timer heap, keyed by class and start
 * tag): push, pop and remove cost O(log tenants) (by_deadline: plus a scan of at most
 * PDQ_FAIRQ_DEADLINE_SCAN of the tenant's waiters). A tenant can be blocked (it is at its own
 * concurrency limit) and is then skipped until unblocked. Not thread-safe: the owner locks.
 */
#ifndef PDQ_FAIRQ_H
#define PDQ_FAIRQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_dlist.h"
#include "pdb/pdb_timer.h"
#include "pdquota/pdq_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Embedded in the waiting object; the queue never allocates per item. */
typedef struct pdq_fairq_item {
    pdb_dlink_t link;
    uint64_t start;    /* virtual start tag */
    uint64_t deadline; /* set before push: 0 none; a by_deadline queue serves it earlier */
    uint32_t tenant;
    bool queued;
} pdq_fairq_item_t;

typedef struct pdq_fairq_tenant {
    pdb_timer_t node;  /* in the heap while it has items and is not blocked */
    pdb_dlist_t items; /* pushed at the head: the tail is the oldest */
    pdb_dlink_t *tail;
    uint64_t finish;     /* virtual finish tag of its last item */
    uint64_t inv_weight; /* virtual time per token, fixed point */
    unsigned priority;
    size_t count;
    bool blocked;
} pdq_fairq_tenant_t;

typedef struct pdq_fairq {
    pdb_timers_t heap;
    pdq_fairq_tenant_t *tenants;
    size_t n_tenants;
    uint64_t vtime[PDQ_MAX_PRIORITY + 1];
    size_t count;
    /* Within a tenant, serve the earliest deadline among its PDQ_FAIRQ_DEADLINE_SCAN oldest
     * waiters (those without one after, oldest first) instead of the oldest: the tenant's
     * turns and shares do not change, only which of its requests takes each turn. */
    bool by_deadline;
} pdq_fairq_t;

#define PDQ_FAIRQ_DEADLINE_SCAN 64

/* <weights>[i] > 0 (0 = 1), <priorities>[i] <= PDQ_MAX_PRIORITY (NULL = all 0). */
pdq_status_t pdq_fairq_init(pdq_fairq_t *fq, size_t n_tenants, const double *weights,
                            const unsigned *priorities);
void pdq_fairq_fini(pdq_fairq_t *fq);
/* A new weight and priority class for <tenant> (a reload): tags given from now on follow them;
 * waiters keep the tags they have. */
void pdq_fairq_set_share(pdq_fairq_t *fq, uint32_t tenant, double weight, unsigned priority);
/* Queue <item> for <tenant> at <cost> tokens (0 counts as 1). */
void pdq_fairq_push(pdq_fairq_t *fq, uint32_t tenant, uint64_t cost, pdq_fairq_item_t *item);
/* The next item across unblocked tenants (not removed), or NULL. */
pdq_fairq_item_t *pdq_fairq_peek(const pdq_fairq_t *fq);
/* Take the next item, or NULL. */
pdq_fairq_item_t *pdq_fairq_pop(pdq_fairq_t *fq);
/* Take the next item of <tenant> (blocked or not): its oldest, or by_deadline its earliest
 * deadline; NULL when it has none. */
pdq_fairq_item_t *pdq_fairq_pop_tenant(pdq_fairq_t *fq, uint32_t tenant);
/* Take <item> out wherever it is; no-op if it is not queued. */
void pdq_fairq_remove(pdq_fairq_t *fq, pdq_fairq_item_t *item);
/* Skip <tenant> in peek/pop until unblocked. */
void pdq_fairq_block(pdq_fairq_t *fq, uint32_t tenant);
void pdq_fairq_unblock(pdq_fairq_t *fq, uint32_t tenant);

static inline size_t pdq_fairq_count(const pdq_fairq_t *fq)
{
    return fq->count;
}
static inline size_t pdq_fairq_tenant_count(const pdq_fairq_t *fq, uint32_t tenant)
{
    return fq->tenants[tenant].count;
}

#ifdef __cplusplus
}
#endif
#endif /* PDQ_FAIRQ_H */
