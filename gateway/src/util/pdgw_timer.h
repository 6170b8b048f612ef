/*
 * pdgw_timer.h - per-worker timers: the base timer heap (pdb/pdb_timer.h) under the
 * gateway's names, in milliseconds.
 *
 * Every deadline of the serving core (request headers and body, request deadline, gate,
 * upstream first byte and idle, hang-up watches) is a pdgw_timer_t embedded in the object it
 * belongs to and armed in its worker's heap. The worker loop sleeps until the earliest one and
 * runs those that are due; nothing scans all connections or requests. See pdb_timer.h for the
 * rules (ties run in arm order; a callback may arm, re-arm or cancel any timer).
 */
#ifndef PDGW_TIMER_H
#define PDGW_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_timer.h"
#include "pdgw_errors.h"

typedef pdb_timer_t pdgw_timer_t; /* .due is absolute monotonic ms */
typedef pdb_timer_fn pdgw_timer_fn;
typedef pdb_timers_t pdgw_timers_t;

#define PDGW_TIMER_IDLE PDB_TIMER_IDLE

static inline void pdgw_timers_init(pdgw_timers_t *h)
{
    pdb_timers_init(h);
}
/* Free the heap. Timers still armed are not touched (their owners may be freed already) and
 * must not be used with this heap again. */
static inline void pdgw_timers_free(pdgw_timers_t *h)
{
    pdb_timers_free(h);
}
static inline void pdgw_timer_init(pdgw_timer_t *t, pdgw_timer_fn fn)
{
    pdb_timer_init(t, fn, NULL);
}
static inline bool pdgw_timer_armed(const pdgw_timer_t *t)
{
    return pdb_timer_armed(t);
}
/* Arm <t> for <due_ms>, moving it when armed already. PDGW_ERR_NOMEM when the heap cannot
 * grow (the timer is then not armed). */
static inline pdgw_status_t pdgw_timer_arm(pdgw_timers_t *h, pdgw_timer_t *t, uint64_t due_ms)
{
    return pdb_timer_arm(h, t, due_ms) == PDB_OK ? PDGW_OK : PDGW_ERR_NOMEM;
}
/* Arm <t> for <due_ms> unless it is armed for that time or earlier already. */
static inline pdgw_status_t pdgw_timer_arm_earlier(pdgw_timers_t *h, pdgw_timer_t *t,
                                                   uint64_t due_ms)
{
    return pdb_timer_arm_earlier(h, t, due_ms) == PDB_OK ? PDGW_OK : PDGW_ERR_NOMEM;
}
static inline void pdgw_timer_cancel(pdgw_timers_t *h, pdgw_timer_t *t)
{
    pdb_timer_cancel(h, t);
}
/* The earliest due time, -1 when nothing is armed. */
static inline int64_t pdgw_timers_next(const pdgw_timers_t *h)
{
    return pdb_timers_next(h);
}
/* Disarm and run, earliest first, every timer due at <now_ms>; returns how many ran.
 * Timers armed by callbacks for <now_ms> or earlier run in the same call. */
static inline size_t pdgw_timers_run(pdgw_timers_t *h, uint64_t now_ms)
{
    return pdb_timers_run(h, now_ms);
}
static inline size_t pdgw_timers_count(const pdgw_timers_t *h)
{
    return pdb_timers_count(h);
}

#endif /* PDGW_TIMER_H */
