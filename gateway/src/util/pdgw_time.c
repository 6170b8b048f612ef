/*
 * pdgw_time.c - monotonic and wall clocks, RFC 3339 timestamps.
 * Declared in pdgw_util.h.
 */

#include <stdio.h>
#include <time.h>

#include "pdb/pdb_clock.h"

/* ---------------------------------------------------------------- time */

uint64_t pdgw_time_mono_ns(void)
{
    return pdb_clock_mono_ns();
}

uint64_t pdgw_time_mono_ms(void)
{
    return pdgw_time_mono_ns() / 1000000u;
}

uint64_t pdgw_time_real_ns(void)
{
    return pdb_clock_real_ns();
}

size_t pdgw_time_format_rfc3339(uint64_t real_ns, char *out, size_t out_len)
{
    if (real_ns == 0)
        real_ns = pdgw_time_real_ns();
    time_t sec = (time_t)(real_ns / 1000000000u);
    unsigned ms = (unsigned)((real_ns / 1000000u) % 1000u);
    struct tm tm;
    gmtime_r(&sec, &tm);
    int n = snprintf(out, out_len, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
    if (n < 0)
        return 0;
    return (size_t)n < out_len ? (size_t)n : (out_len > 0 ? out_len - 1 : 0);
}

_Thread_local const uint64_t *pdgw_loop_clock;
_Thread_local struct pdgw_worker *pdgw_this_worker;

uint64_t pdgw_now_ms(void)
{
    /* On a worker: the time of this turn of its loop, read when the turn starts and after its
     * events (as nginx keeps its current msec): deadlines and millisecond durations need no
     * clock read each, and a request took about ten. Elsewhere: the clock. */
    const uint64_t *turn = pdgw_loop_clock;
    return turn != NULL && *turn != 0 ? *turn : pdgw_time_mono_ms();
}
