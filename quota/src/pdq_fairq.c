/*
 * pdq_fairq.c - start-time fair queuing across tenants (see pdq_fairq.h).
 *
 * Tags are fixed point (PDQ_VT_ONE per token at weight 1) so that the heap compares integers;
 * the priority class sits above the tag in the heap key, so every item of class 0 sorts
 * before any of class 1. A tag grows by at most 2^24 tokens x 1024 / 0.01 (the largest cost
 * counted, the smallest weight allowed) per request, so 2^60 leaves room for at least 10^7
 * such requests of one class, and about 10^15 tokens at weight 1: decades of traffic.
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdquota/pdq_fairq.h"

#define PDQ_VT_ONE   1024u
#define PDQ_TAG_BITS 60
#define PDQ_TAG_MASK ((1ull << PDQ_TAG_BITS) - 1)
#define PDQ_MAX_COST (1ull << 24) /* more than any context window; keeps tags small */

static pdq_fairq_item_t *oldest(const pdq_fairq_tenant_t *ft)
{
    return ft->tail ? PDB_DLIST_ENTRY(ft->tail, pdq_fairq_item_t, link) : NULL;
}

/* The item that takes <ft>'s next turn: its oldest or, by deadline, the earliest deadline
 * among its oldest PDQ_FAIRQ_DEADLINE_SCAN (ties and items without one: the older first). */
static pdq_fairq_item_t *next_of(const pdq_fairq_t *fq, const pdq_fairq_tenant_t *ft)
{
    pdq_fairq_item_t *best = oldest(ft);
    if (best == NULL || !fq->by_deadline)
        return best;
    size_t seen = 0;
    for (pdb_dlink_t *l = ft->tail; l != NULL && seen < PDQ_FAIRQ_DEADLINE_SCAN;
         l = l->prev, seen++) { /* prev: toward the newer */
        pdq_fairq_item_t *it = PDB_DLIST_ENTRY(l, pdq_fairq_item_t, link);
        if (it->deadline != 0 && (best->deadline == 0 || it->deadline < best->deadline))
            best = it;
    }
    return best;
}

/* <item> takes its tenant's turn (the oldest's tag): the tags of the waiters older than it move
 * one place towards the oldest, so the remaining ones keep the tenant's tag sequence. */
static void take_turn(pdq_fairq_t *fq, pdq_fairq_item_t *item)
{
    pdq_fairq_tenant_t *ft = &fq->tenants[item->tenant];
    uint64_t carry = item->start;
    if (ft->tail == &item->link)
        return;
    for (pdb_dlink_t *l = item->link.next; l != NULL; l = l->next) { /* next: the older */
        pdq_fairq_item_t *it = PDB_DLIST_ENTRY(l, pdq_fairq_item_t, link);
        uint64_t mine = it->start;
        it->start = carry;
        carry = mine;
    }
    item->start = carry; /* the oldest's tag: the one this turn was given by */
}

/* Put <ft> in the heap under its oldest item's tag, or take it out. */
static void rekey(pdq_fairq_t *fq, pdq_fairq_tenant_t *ft)
{
    pdq_fairq_item_t *head = oldest(ft);
    if (head == NULL || ft->blocked) {
        pdb_timer_cancel(&fq->heap, &ft->node);
        return;
    }
    uint64_t key = ((uint64_t)ft->priority << PDQ_TAG_BITS) | (head->start & PDQ_TAG_MASK);
    if (!pdb_timer_armed(&ft->node) || ft->node.due != key)
        (void)pdb_timer_arm(&fq->heap, &ft->node, key); /* room reserved at init */
}

pdq_status_t pdq_fairq_init(pdq_fairq_t *fq, size_t n_tenants, const double *weights,
                            const unsigned *priorities)
{
    memset(fq, 0, sizeof(*fq));
    pdb_timers_init(&fq->heap);
    if (n_tenants == 0 || n_tenants > PDQ_MAX_TENANTS + 1)
        return PDQ_ERR_INVALID;
    fq->tenants = pdb_calloc(n_tenants, sizeof(*fq->tenants));
    if (fq->tenants == NULL)
        return PDQ_ERR_NOMEM;
    if (pdb_timers_reserve(&fq->heap, n_tenants) != PDB_OK) {
        pdb_free(fq->tenants);
        fq->tenants = NULL;
        return PDQ_ERR_NOMEM;
    }
    fq->n_tenants = n_tenants;
    for (size_t i = 0; i < n_tenants; i++) {
        pdq_fairq_tenant_t *ft = &fq->tenants[i];
        double w = weights && weights[i] > 0 ? weights[i] : 1.0;
        unsigned prio = priorities ? priorities[i] : 0;
        pdb_timer_init(&ft->node, NULL, ft);
        ft->inv_weight = (uint64_t)(PDQ_VT_ONE / w) ? (uint64_t)(PDQ_VT_ONE / w) : 1;
        ft->priority = prio > PDQ_MAX_PRIORITY ? PDQ_MAX_PRIORITY : prio;
    }
    return PDQ_OK;
}

void pdq_fairq_set_share(pdq_fairq_t *fq, uint32_t tenant, double weight, unsigned priority)
{
    pdq_fairq_tenant_t *ft = &fq->tenants[tenant];
    double w = weight > 0 ? weight : 1.0;
    ft->inv_weight = (uint64_t)(PDQ_VT_ONE / w) ? (uint64_t)(PDQ_VT_ONE / w) : 1;
    ft->priority = priority > PDQ_MAX_PRIORITY ? PDQ_MAX_PRIORITY : priority;
    rekey(fq, ft); /* its class may have moved */
}

void pdq_fairq_fini(pdq_fairq_t *fq)
{
    pdb_timers_free(&fq->heap);
    pdb_free(fq->tenants);
    fq->tenants = NULL;
    fq->n_tenants = 0;
}

void pdq_fairq_push(pdq_fairq_t *fq, uint32_t tenant, uint64_t cost, pdq_fairq_item_t *item)
{
    pdq_fairq_tenant_t *ft = &fq->tenants[tenant];
    uint64_t v = fq->vtime[ft->priority];
    item->tenant = tenant;
    item->start = ft->finish > v ? ft->finish : v;
    cost = cost == 0 ? 1 : cost > PDQ_MAX_COST ? PDQ_MAX_COST : cost;
    ft->finish = item->start + cost * ft->inv_weight;
    item->link.prev = item->link.next = NULL;
    pdb_dlist_push(&ft->items, &item->link);
    if (ft->tail == NULL)
        ft->tail = &item->link;
    item->queued = true;
    ft->count++;
    fq->count++;
    if (ft->count == 1)
        rekey(fq, ft);
}

pdq_fairq_item_t *pdq_fairq_peek(const pdq_fairq_t *fq)
{
    if (fq->heap.n == 0)
        return NULL;
    const pdq_fairq_tenant_t *ft = fq->heap.v[0].t->arg;
    return next_of(fq, ft);
}

void pdq_fairq_remove(pdq_fairq_t *fq, pdq_fairq_item_t *item)
{
    if (!item->queued)
        return;
    pdq_fairq_tenant_t *ft = &fq->tenants[item->tenant];
    bool was_oldest = ft->tail == &item->link;
    if (was_oldest)
        ft->tail = item->link.prev;
    pdb_dlist_remove(&ft->items, &item->link);
    item->queued = false;
    ft->count--;
    fq->count--;
    if (ft->count == 0) {
        ft->tail = NULL;     /* finish stays: a tenant gets no credit for emptying its queue */
        ft->blocked = false; /* blocking is about queued items; the next ones are judged anew */
    }
    if (was_oldest)
        rekey(fq, ft);
}

pdq_fairq_item_t *pdq_fairq_pop(pdq_fairq_t *fq)
{
    pdq_fairq_item_t *item = pdq_fairq_peek(fq);
    if (item == NULL)
        return NULL;
    take_turn(fq, item);
    unsigned prio = fq->tenants[item->tenant].priority;
    if (item->start > fq->vtime[prio])
        fq->vtime[prio] = item->start;
    pdq_fairq_remove(fq, item);
    rekey(fq, &fq->tenants[item->tenant]); /* its oldest may carry a new tag */
    return item;
}

pdq_fairq_item_t *pdq_fairq_pop_tenant(pdq_fairq_t *fq, uint32_t tenant)
{
    pdq_fairq_item_t *item = next_of(fq, &fq->tenants[tenant]);
    if (item != NULL) {
        take_turn(fq, item);
        pdq_fairq_remove(fq, item);
        rekey(fq, &fq->tenants[tenant]);
    }
    return item;
}

void pdq_fairq_block(pdq_fairq_t *fq, uint32_t tenant)
{
    pdq_fairq_tenant_t *ft = &fq->tenants[tenant];
    if (!ft->blocked) {
        ft->blocked = true;
        rekey(fq, ft);
    }
}

void pdq_fairq_unblock(pdq_fairq_t *fq, uint32_t tenant)
{
    pdq_fairq_tenant_t *ft = &fq->tenants[tenant];
    if (ft->blocked) {
        ft->blocked = false;
        rekey(fq, ft);
    }
}
