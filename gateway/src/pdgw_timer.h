/*
 * pdgw_timer.h - per-worker timers: a binary min-heap of deadlines owned by one thread.
 *
 * Every deadline of the serving core (request headers and body, request deadline, gate,
 * upstream first byte and idle, hang-up watches) is a pdgw_timer_t embedded in the object it
 * belongs to and armed in its worker's heap. The worker loop sleeps until the earliest one and
 * runs those that are due; nothing scans all connections or requests. Arming, re-arming and
 * cancelling cost O(log n) and never allocate except to grow the heap.
 *
 * Timers due at the same millisecond run in the order they were armed. A callback may arm,
 * re-arm or cancel any timer (itself included) and may free the timer's owner once it has
 * cancelled or not re-armed it.
 */
#ifndef PDGW_TIMER_H
#define PDGW_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"

typedef struct pdgw_timer pdgw_timer_t;
typedef void (*pdgw_timer_fn)(pdgw_timer_t *t, uint64_t now_ms);

struct pdgw_timer {
    uint64_t due_ms; /* absolute monotonic ms (the last one stays readable after it ran) */
    uint64_t seq;    /* arm order: ties run first armed, first run */
    size_t idx;      /* position in the heap; PDGW_TIMER_IDLE when not armed */
    pdgw_timer_fn fn;
};

#define PDGW_TIMER_IDLE ((size_t)-1)

typedef struct pdgw_timers {
    pdgw_timer_t **v;
    size_t n, cap;
    uint64_t seq;
} pdgw_timers_t;

void pdgw_timers_init(pdgw_timers_t *h);
/* Free the heap. Timers still armed are not touched (their owners may be freed already) and
 * must not be used with this heap again. */
void pdgw_timers_free(pdgw_timers_t *h);
void pdgw_timer_init(pdgw_timer_t *t, pdgw_timer_fn fn);
static inline bool pdgw_timer_armed(const pdgw_timer_t *t)
{
    return t->idx != PDGW_TIMER_IDLE;
}
/* Arm <t> for <due_ms>, moving it when armed already. PDGW_ERR_NOMEM when the heap cannot
 * grow (the timer is then not armed). */
pdgw_status_t pdgw_timer_arm(pdgw_timers_t *h, pdgw_timer_t *t, uint64_t due_ms);
/* Arm <t> for <due_ms> unless it is armed for that time or earlier already. */
pdgw_status_t pdgw_timer_arm_earlier(pdgw_timers_t *h, pdgw_timer_t *t, uint64_t due_ms);
void pdgw_timer_cancel(pdgw_timers_t *h, pdgw_timer_t *t);
/* The earliest due time, -1 when nothing is armed. */
int64_t pdgw_timers_next(const pdgw_timers_t *h);
/* Disarm and run, earliest first, every timer due at <now_ms>; returns how many ran.
 * Timers armed by callbacks for <now_ms> or earlier run in the same call. */
size_t pdgw_timers_run(pdgw_timers_t *h, uint64_t now_ms);
static inline size_t pdgw_timers_count(const pdgw_timers_t *h)
{
    return h->n;
}

#endif /* PDGW_TIMER_H */
