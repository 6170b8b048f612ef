/*
 * Per-instance circuit breaker and overload back-off.
 *
 * closed --(breaker_failures consecutive failures)--> open
 * open --(breaker_open_ms elapsed, next booking takes the probe)--> half-open
 * half-open --(probe succeeds / answers at all)--> closed
 * half-open --(probe fails)--> open again
 * A cancelled probe gives the slot back (open, immediately probe-able).
 *
 * Overload answers (429/503) are not failures: they shift the instance's
 * effective weight right by one more bit (down to 1/16) for Retry-After
 * or overload_penalty_ms.
 */
#include <stdio.h>

#include "sched_int.h"

#define RELAXED                  memory_order_relaxed
#define SCHED_MAX_RETRY_AFTER_MS 60000u

bool sched_breaker_acquire(sched_instance_t *inst, uint64_t now_ms, bool *probe_out)
{
    uint32_t br = sched_gate_breaker(inst);

    if (br == SCHED_BREAKER_CLOSED) {
        *probe_out = false;
        return true;
    }
    if (br == SCHED_BREAKER_OPEN &&
        now_ms >= atomic_load_explicit(&inst->breaker_until_ms, RELAXED) &&
        sched_gate_set_breaker(inst, SCHED_BREAKER_OPEN, SCHED_BREAKER_HALF_OPEN)) {
        *probe_out = true;
        return true;
    }
    return false;
}

void sched_breaker_release_probe(sched_instance_t *inst, uint64_t now_ms)
{
    pthread_mutex_lock(&inst->mu);
    atomic_store_explicit(&inst->breaker_until_ms, now_ms, RELAXED);
    sched_gate_set_breaker(inst, SCHED_BREAKER_HALF_OPEN, SCHED_BREAKER_OPEN);
    pthread_mutex_unlock(&inst->mu);
}

static bool outcome_is_failure(sched_outcome_t o)
{
    return o == SCHED_OUTCOME_CONNECT_ERROR || o == SCHED_OUTCOME_SERVER_ERROR ||
           o == SCHED_OUTCOME_TRANSFER_ERROR || o == SCHED_OUTCOME_TIMEOUT;
}

static void open_breaker(sched_pool_t *pool, sched_instance_t *inst, uint64_t now_ms)
{
    atomic_store_explicit(&inst->breaker_until_ms, now_ms + pool->breaker_open_ms, RELAXED);
    sched_gate_set_breaker(inst, UINT32_MAX, SCHED_BREAKER_OPEN);
}

static void note_overload(sched_pool_t *pool, sched_instance_t *inst, uint64_t now_ms,
                          const sched_result_t *r)
{
    uint64_t span = r->retry_after_ms ? r->retry_after_ms : pool->overload_penalty_ms;
    uint64_t prev_until = atomic_load_explicit(&inst->overload_until_ms, RELAXED);
    uint32_t shift = atomic_load_explicit(&inst->overload_shift, RELAXED);

    if (span > SCHED_MAX_RETRY_AFTER_MS)
        span = SCHED_MAX_RETRY_AFTER_MS;
    if (prev_until > now_ms)
        shift = shift < SCHED_OVERLOAD_MAX_SHIFT ? shift + 1 : SCHED_OVERLOAD_MAX_SHIFT;
    else
        shift = 1;
    atomic_store_explicit(&inst->overload_shift, shift, RELAXED);
    if (prev_until < now_ms + span)
        atomic_store_explicit(&inst->overload_until_ms, now_ms + span, RELAXED);
}

void sched_breaker_report(sched_pool_t *pool, sched_instance_t *inst, bool probe, uint64_t now_ms,
                          const sched_result_t *r)
{
    static const sched_result_t success = {.outcome = SCHED_OUTCOME_SUCCESS};
    const char *detail;

    if (!r)
        r = &success;
    detail = r->detail ? r->detail : "";

    if (r->outcome == SCHED_OUTCOME_CANCELLED) {
        if (probe)
            sched_breaker_release_probe(inst, now_ms);
        return;
    }

    pthread_mutex_lock(&inst->mu);
    if (outcome_is_failure(r->outcome)) {
        inst->breaker_failures++;
        if (r->http_status)
            snprintf(inst->last_error, sizeof(inst->last_error), "%s (HTTP %d)%s%s",
                     sched_outcome_name(r->outcome), r->http_status, *detail ? ": " : "", detail);
        else
            snprintf(inst->last_error, sizeof(inst->last_error), "%s%s%s",
                     sched_outcome_name(r->outcome), *detail ? ": " : "", detail);
        inst->last_error_ms = now_ms;
        if (probe) {
            open_breaker(pool, inst, now_ms);
        } else if (sched_gate_breaker(inst) == SCHED_BREAKER_CLOSED &&
                   inst->breaker_failures >= pool->breaker_failures) {
            open_breaker(pool, inst, now_ms);
            pthread_mutex_unlock(&inst->mu);
            sched_pool_logf(pool, SCHED_LOG_WARN,
                            "instance %s: breaker open after %u consecutive failures (%s)",
                            inst->desc.id, pool->breaker_failures, sched_outcome_name(r->outcome));
            return;
        }
    } else {
        if (r->outcome == SCHED_OUTCOME_OVERLOADED) {
            note_overload(pool, inst, now_ms, r);
            snprintf(inst->last_error, sizeof(inst->last_error), "overloaded (HTTP %d)%s%s",
                     r->http_status, *detail ? ": " : "", detail);
            inst->last_error_ms = now_ms;
        } else {
            inst->breaker_failures = 0;
        }
        if (probe) {
            inst->breaker_failures = 0;
            sched_gate_set_breaker(inst, UINT32_MAX, SCHED_BREAKER_CLOSED);
        }
    }
    pthread_mutex_unlock(&inst->mu);
}
