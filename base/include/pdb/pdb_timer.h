/*
 * pdb_timer.h - a timer heap: a binary min-heap of deadlines owned by one thread.
 *
 * Every deadline of an event loop is a pdb_timer_t embedded in the object it belongs to and
 * armed in the loop's heap. The loop sleeps until the earliest one (pdb_timers_next) and runs
 * those that are due (pdb_timers_run); nothing scans all objects. Arming, re-arming (one
 * sift from where the timer is) and cancelling cost O(log n) and never allocate except to
 * grow the heap (pdb_timers_reserve grows it ahead, so arming cannot fail afterwards).
 *
 * Time is whatever unit the owner picks (the gateway's workers use milliseconds, libkvt
 * nanoseconds of its pdb_clock); the heap only compares numbers. Timers due at the same time
 * run in the order they were armed. A callback may arm, re-arm or cancel any timer (itself
 * included) and may free the timer's owner once it has cancelled or not re-armed it.
 *
 * Not thread-safe: one heap, one thread (the owner's loop).
 */
#ifndef PDB_TIMER_H
#define PDB_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdb_timer pdb_timer_t;
typedef void (*pdb_timer_fn)(pdb_timer_t *t, uint64_t now);

struct pdb_timer {
    uint64_t due; /* absolute time (the last one stays readable after it ran) */
    uint64_t seq; /* arm order: ties run first armed, first run */
    size_t idx;   /* position in the heap; PDB_TIMER_IDLE when not armed */
    pdb_timer_fn fn;
    void *arg; /* the owner's, untouched by the heap */
};

#define PDB_TIMER_IDLE ((size_t)-1)

/* One heap slot: the timer's key is kept next to it, so a sift compares slots without reading
 * the timers it passes. */
typedef struct pdb_timer_slot {
    uint64_t due, seq;
    pdb_timer_t *t;
} pdb_timer_slot_t;

typedef struct pdb_timers {
    pdb_timer_slot_t *v;
    size_t n, cap;
    uint64_t seq;
} pdb_timers_t;

void pdb_timers_init(pdb_timers_t *h);
/* Free the heap. Timers still armed are not touched (their owners may be freed already) and
 * must not be used with this heap again. */
void pdb_timers_free(pdb_timers_t *h);
/* Room for <n> armed timers in all, so that arming up to that many cannot fail.
 * PDB_ERR_NOMEM when the heap cannot grow (it keeps its old room). */
pdb_status_t pdb_timers_reserve(pdb_timers_t *h, size_t n);
void pdb_timer_init(pdb_timer_t *t, pdb_timer_fn fn, void *arg);
static inline bool pdb_timer_armed(const pdb_timer_t *t)
{
    return t->idx != PDB_TIMER_IDLE;
}
/* Arm <t> for <due>, moving it when armed already. PDB_ERR_NOMEM when the heap cannot grow
 * (the timer is then not armed). */
pdb_status_t pdb_timer_arm(pdb_timers_t *h, pdb_timer_t *t, uint64_t due);
/* Arm <t> for <due> unless it is armed for that time or earlier already. */
pdb_status_t pdb_timer_arm_earlier(pdb_timers_t *h, pdb_timer_t *t, uint64_t due);
void pdb_timer_cancel(pdb_timers_t *h, pdb_timer_t *t);
/* The earliest due time (at most INT64_MAX), -1 when nothing is armed. */
int64_t pdb_timers_next(const pdb_timers_t *h);
/* Disarm and run, earliest first, every timer due at <now>; returns how many ran.
 * Timers armed by callbacks for <now> or earlier run in the same call. */
size_t pdb_timers_run(pdb_timers_t *h, uint64_t now);
static inline size_t pdb_timers_count(const pdb_timers_t *h)
{
    return h->n;
}

#ifdef __cplusplus
}
#endif
#endif /* PDB_TIMER_H */
