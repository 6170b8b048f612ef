/*
 * pdgw_admit_queue.h - the admission wait queue: waiters ordered most urgent first, then by
 * their deadline when the caller gives one, first come first served otherwise.
 *
 * Priorities follow vLLM's priority scheduling: a LOWER value is served EARLIER, ties go by
 * arrival (vllm/v1/core/sched/request_queue.py, PriorityRequestQueue). The queue is a binary
 * heap of caller-owned waiters that know their own position, so a waiter whose client left
 * is taken out in O(log n) at once, not when it reaches the head.
 *
 * No lock and no clock: the admission controller (pdgw_admit.c) holds its mutex around
 * every call and stamps the times. The bound (queue_size) is the controller's business too,
 * since a reload may change it while waiters are queued.
 */
#ifndef PDGW_ADMIT_QUEUE_H
#define PDGW_ADMIT_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"

#define PDGW_ADMIT_NOT_QUEUED ((size_t)-1)

/* One waiter; embedded in its owner (the request's admission ticket). */
typedef struct pdgw_admit_waiter {
    int64_t priority;     /* lower = more urgent (vLLM) */
    uint64_t deadline_ms; /* within a priority, earlier first; UINT64_MAX = none (last) */
    uint64_t seq;         /* arrival order, set by push */
    size_t idx;           /* heap position, PDGW_ADMIT_NOT_QUEUED when not queued */
} pdgw_admit_waiter_t;

typedef struct pdgw_admit_queue {
    pdgw_admit_waiter_t **heap;
    size_t n, cap;
    uint64_t next_seq;
} pdgw_admit_queue_t;

/* An empty queue (no allocation until the first push). */
void pdgw_admit_queue_init(pdgw_admit_queue_t *q);
/* Free the array; the waiters are the caller's (marked not queued). */
void pdgw_admit_queue_fini(pdgw_admit_queue_t *q);
/* Queue <w> (borrowed until popped or removed) after everyone of its priority or more
 * urgent. PDGW_ERR_NOMEM when the array cannot grow (nothing changed). */
pdgw_status_t pdgw_admit_queue_push(pdgw_admit_queue_t *q, pdgw_admit_waiter_t *w);
/* The most urgent waiter (NULL when empty); pop also takes it out. */
pdgw_admit_waiter_t *pdgw_admit_queue_peek(const pdgw_admit_queue_t *q);
pdgw_admit_waiter_t *pdgw_admit_queue_pop(pdgw_admit_queue_t *q);
/* Take <w> out wherever it is; false when it was not queued. */
bool pdgw_admit_queue_remove(pdgw_admit_queue_t *q, pdgw_admit_waiter_t *w);
static inline size_t pdgw_admit_queue_len(const pdgw_admit_queue_t *q)
{
    return q->n;
}
static inline bool pdgw_admit_waiter_queued(const pdgw_admit_waiter_t *w)
{
    return w->idx != PDGW_ADMIT_NOT_QUEUED;
}

#endif /* PDGW_ADMIT_QUEUE_H */
