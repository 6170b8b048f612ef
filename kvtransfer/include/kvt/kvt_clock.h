/*
 * kvt_clock.h -- injectable monotonic clock.
 *
 * Time-based tables (circuit breaker, pull-pending TTL, reservations) take a
 * kvt_clock_t so tests can drive time by hand. A NULL clock function means
 * CLOCK_MONOTONIC.
 */
#ifndef KVT_CLOCK_H
#define KVT_CLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_clock.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NSEC_PER_SEC  PDB_NSEC_PER_SEC
#define KVT_NSEC_PER_MSEC PDB_NSEC_PER_MSEC

/* libkvt's names for the base clock (pdb/pdb_clock.h). */
typedef pdb_clock_fn kvt_clock_fn;
typedef pdb_clock_t kvt_clock_t;

static inline uint64_t kvt_clock_monotonic_ns(void)
{
    return pdb_clock_mono_ns();
}

static inline uint64_t kvt_clock_now(const kvt_clock_t *c)
{
    return pdb_clock_now(c);
}

/* Seconds (as in the pd_*_ttl config keys) to nanoseconds; negative -> 0. */
static inline uint64_t kvt_sec_to_ns(double s)
{
    return s <= 0.0 ? 0 : (uint64_t)(s * 1e9);
}

#ifdef __cplusplus
}
#endif
#endif /* KVT_CLOCK_H */
