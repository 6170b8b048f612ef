/*
 * pdb_clock.c - the process clocks behind pdb_clock.h.
 */
#include "pdb/pdb_clock.h"

#include <time.h>

static uint64_t read_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * PDB_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t pdb_clock_mono_ns(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

uint64_t pdb_clock_real_ns(void)
{
    return read_clock(CLOCK_REALTIME);
}
