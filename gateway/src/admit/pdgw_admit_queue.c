/*
 * pdgw_admit_queue.c - binary min-heap on (priority, deadline, arrival) with positions kept in the
 * waiters (see pdgw_admit_queue.h).
 */
#include "pdgw_admit_queue.h"

#include "pdgw_alloc.h"

/* a before b: more urgent, or as urgent and due earlier, or both the same and earlier. */
static bool before(const pdgw_admit_waiter_t *a, const pdgw_admit_waiter_t *b)
{
    if (a->priority != b->priority)
        return a->priority < b->priority;
    return a->deadline_ms != b->deadline_ms ? a->deadline_ms < b->deadline_ms : a->seq < b->seq;
}

static void place(pdgw_admit_queue_t *q, size_t i, pdgw_admit_waiter_t *w)
{
    q->heap[i] = w;
    w->idx = i;
}

static void sift_up(pdgw_admit_queue_t *q, size_t i)
{
    pdgw_admit_waiter_t *w = q->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(w, q->heap[parent]))
            break;
        place(q, i, q->heap[parent]);
        i = parent;
    }
    place(q, i, w);
}

static void sift_down(pdgw_admit_queue_t *q, size_t i)
{
    pdgw_admit_waiter_t *w = q->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = l;
        if (l >= q->n)
            break;
        if (r < q->n && before(q->heap[r], q->heap[l]))
            m = r;
        if (!before(q->heap[m], w))
            break;
        place(q, i, q->heap[m]);
        i = m;
    }
    place(q, i, w);
}

void pdgw_admit_queue_init(pdgw_admit_queue_t *q)
{
    q->heap = NULL;
    q->n = q->cap = 0;
    q->next_seq = 1;
}

void pdgw_admit_queue_fini(pdgw_admit_queue_t *q)
{
    size_t i;
    for (i = 0; i < q->n; i++)
        q->heap[i]->idx = PDGW_ADMIT_NOT_QUEUED;
    pdgw_free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}

pdgw_status_t pdgw_admit_queue_push(pdgw_admit_queue_t *q, pdgw_admit_waiter_t *w)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 64;
        pdgw_admit_waiter_t **h = pdgw_realloc(q->heap, cap * sizeof(*h));
        if (h == NULL)
            return PDGW_ERR_NOMEM;
        q->heap = h;
        q->cap = cap;
    }
    w->seq = q->next_seq++;
    place(q, q->n++, w);
    sift_up(q, w->idx);
    return PDGW_OK;
}

pdgw_admit_waiter_t *pdgw_admit_queue_peek(const pdgw_admit_queue_t *q)
{
    return q->n ? q->heap[0] : NULL;
}

bool pdgw_admit_queue_remove(pdgw_admit_queue_t *q, pdgw_admit_waiter_t *w)
{
    size_t i = w->idx;
    pdgw_admit_waiter_t *last;
    if (i == PDGW_ADMIT_NOT_QUEUED || i >= q->n || q->heap[i] != w)
        return false;
    w->idx = PDGW_ADMIT_NOT_QUEUED;
    last = q->heap[--q->n];
    if (i == q->n)
        return true;
    place(q, i, last);
    /* The moved waiter may belong above or below its new place. */
    if (i > 0 && before(last, q->heap[(i - 1) / 2]))
        sift_up(q, i);
    else
        sift_down(q, i);
    return true;
}

pdgw_admit_waiter_t *pdgw_admit_queue_pop(pdgw_admit_queue_t *q)
{
    pdgw_admit_waiter_t *w = pdgw_admit_queue_peek(q);
    if (w != NULL)
        (void)pdgw_admit_queue_remove(q, w);
    return w;
}
