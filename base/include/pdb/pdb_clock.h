/*
 * pdb_clock.h - the one monotonic clock, injectable.
 *
 * Objects with time-based state (TTLs, breakers, reservations, health) take a pdb_clock_t so
 * tests drive time by hand; a NULL clock or a NULL <now> is CLOCK_MONOTONIC.
 */
#ifndef PDB_CLOCK_H
#define PDB_CLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDB_NSEC_PER_SEC  1000000000ull
#define PDB_NSEC_PER_MSEC 1000000ull
#define PDB_NSEC_PER_USEC 1000ull

/* Returns monotonic nanoseconds. */
typedef uint64_t (*pdb_clock_fn)(void *arg);

typedef struct pdb_clock {
    pdb_clock_fn now; /* NULL = CLOCK_MONOTONIC */
    void *arg;
} pdb_clock_t;

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t pdb_clock_mono_ns(void);
/* CLOCK_REALTIME in nanoseconds (timestamps for humans, never for intervals). */
uint64_t pdb_clock_real_ns(void);

/* Now, on <c> (NULL = CLOCK_MONOTONIC), in nanoseconds. */
static inline uint64_t pdb_clock_now(const pdb_clock_t *c)
{
    if (c != NULL && c->now != NULL)
        return c->now(c->arg);
    return pdb_clock_mono_ns();
}

static inline uint64_t pdb_clock_mono_ms(void)
{
    return pdb_clock_mono_ns() / PDB_NSEC_PER_MSEC;
}

static inline double pdb_clock_mono_sec(void)
{
    return (double)pdb_clock_mono_ns() / 1e9;
}

/* Seconds to nanoseconds; negative or NaN -> 0. */
static inline uint64_t pdb_sec_to_ns(double s)
{
    return s > 0.0 ? (uint64_t)(s * 1e9) : 0;
}

#ifdef __cplusplus
}
#endif
#endif /* PDB_CLOCK_H */
