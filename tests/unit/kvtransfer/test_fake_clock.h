/*
 * test_fake_clock.h - an injectable clock for the engine tests: it stands still until the
 * test moves it (atomically: the engine's progress thread reads it), so a TTL can neither
 * expire early nor late however busy the machine is.
 */
#ifndef TEST_FAKE_CLOCK_H
#define TEST_FAKE_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvt/kvt_clock.h"

static atomic_ullong fake_ns;

static uint64_t fake_now(void *arg)
{
    (void)arg;
    return atomic_load(&fake_ns);
}

static const kvt_clock_t fake_clock = {.now = fake_now, .arg = NULL};

/* A fresh clock at 1000 s. */
static inline const kvt_clock_t *fake_clock_start(void)
{
    atomic_store(&fake_ns, 1000ull * KVT_NSEC_PER_SEC);
    return &fake_clock;
}

#endif
