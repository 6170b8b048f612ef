/* Fault injection: dice for --fail-rate / --kv-corrupt-rate and the
 * --crash-after-ms timer (a SIGKILL to itself, like an engine crash). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "sim_int.h"

static pthread_mutex_t flock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t state;
static int crash_armed;

static uint64_t next_rand(void)
{
    /* splitmix64 */
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 1 with probability rate (0 never rolls). */
int sim_fault_roll(double rate)
{
    if (rate <= 0)
        return 0;
    if (rate >= 1)
        return 1;
    pthread_mutex_lock(&flock);
    if (!state)
        state = sim_cfg.fault_seed ? sim_cfg.fault_seed : 1;
    double u = (double)(next_rand() >> 11) / 9007199254740992.0;
    pthread_mutex_unlock(&flock);
    return u < rate;
}

static void *crash_main(void *arg)
{
    struct timespec ts = {.tv_sec = sim_cfg.crash_after_ms / 1000,
                          .tv_nsec = (long)(sim_cfg.crash_after_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts))
        ;
    fprintf(stderr, "pdgw-sim: --crash-after-ms %d reached, crashing\n", sim_cfg.crash_after_ms);
    fflush(stderr);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Start the crash timer at the first inference request (idempotent). */
void sim_fault_arm_crash(void)
{
    pthread_t t;
    if (sim_cfg.crash_after_ms < 0)
        return;
    pthread_mutex_lock(&flock);
    int first = !crash_armed;
    crash_armed = 1;
    pthread_mutex_unlock(&flock);
    if (first && pthread_create(&t, NULL, crash_main, NULL) == 0)
        pthread_detach(t);
}
