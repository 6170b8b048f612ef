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

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NSEC_PER_SEC  1000000000ull
#define KVT_NSEC_PER_MSEC 1000000ull

/* Returns monotonic nanoseconds. */
typedef uint64_t (*kvt_clock_fn)(void *arg);

typedef struct kvt_clock {
    kvt_clock_fn now; /* NULL = CLOCK_MONOTONIC */
    void *arg;
} kvt_clock_t;

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kvt_clock_monotonic_ns(void);

static inline uint64_t kvt_clock_now(const kvt_clock_t *c)
{
    if (c != NULL && c->now != NULL)
        return c->now(c->arg);
    return kvt_clock_monotonic_ns();
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
