/*
 * pdgw_admit.h - admission control: how many requests may be at the engines at once, who
 * waits, for how long, in which order, and how fast one API key may send.
 *
 *   enter:  rate limit (per key token bucket) -> a free slot (max_concurrent_requests) ->
 *           else a place in the bounded wait queue (queue_size), most urgent first
 *   leave:  a held slot goes straight to the head waiter; a queued waiter leaves the queue
 *
 * Names follow SGLang's model gateway (sgl-model-gateway: max_concurrent_requests,
 * queue_size, queue_timeout_secs; a full queue is 429 there too). Priorities follow vLLM
 * (a lower `priority` is served earlier).
 *
 * One controller for all worker threads, one mutex. Every limit lives in one struct
 * (pdgw_admit_limits_t) that pdgw_admit_set_limits() swaps at run time (config reload):
 * raising max_concurrent_requests admits waiters at once; lowering it lets the requests in
 * flight finish; waiters already queued keep their place when queue_size shrinks.
 *
 * A slot is held by a ticket embedded in its owner (the request). A ticket is granted,
 * cancelled, timed out or released exactly once, whatever order the events come in: the
 * state change happens under the mutex. The grant callback runs under the mutex too (it only
 * wakes the owner's thread); it must not call back into the controller.
 * There is no clock inside: callers pass monotonic milliseconds (tests drive them).
 */
#ifndef PDGW_ADMIT_H
#define PDGW_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_admit_queue.h"
#include "pdgw_errors.h"
#include "pdgw_metrics.h"

struct pdgw_config;

typedef enum pdgw_affinity_mode {
    PDGW_AFFINITY_NONE = 0,
    PDGW_AFFINITY_HEADER, /* "header:<name>": the value of a request header */
    PDGW_AFFINITY_USER,   /* "user": the body's OpenAI `user` field */
} pdgw_affinity_mode_t;

#define PDGW_AFFINITY_HEADER_MAX 64

typedef struct pdgw_admit_key_limit {
    char *key; /* the API key (owned) */
    double rate, burst;
} pdgw_admit_key_limit_t;

/* Everything reloadable about admission, retries and affinity. Strings are owned. */
typedef struct pdgw_admit_limits {
    unsigned max_concurrent;      /* requests at the engines at once; 0 = unlimited */
    unsigned queue_size;          /* waiters beyond that; 0 = refuse at once */
    uint64_t queue_timeout_ms;    /* longest wait in the queue (and never past the deadline) */
    bool by_slo_deadline;         /* within a priority: arrival + TTFT target, not arrival */
    double rate, burst;           /* per API key by default; rate 0 = no rate limit */
    pdgw_admit_key_limit_t *keys; /* per-key overrides */
    size_t n_keys;
    uint64_t retry_backoff_base_ms; /* first backoff after an engine's 429/503 */
    uint64_t retry_backoff_max_ms;  /* cap of the exponential part */
    pdgw_affinity_mode_t affinity;
    char affinity_header[PDGW_AFFINITY_HEADER_MAX];
} pdgw_admit_limits_t;

/* Defaults: no limits, backoff 100 ms .. 5 s, no affinity. */
void pdgw_admit_limits_init(pdgw_admit_limits_t *l);
void pdgw_admit_limits_free(pdgw_admit_limits_t *l);
/* The limits of a loaded config; PDGW_ERR_INVALID with a message naming the key. */
pdgw_status_t pdgw_admit_limits_from_config(const struct pdgw_config *cfg, pdgw_admit_limits_t *out,
                                            char *err, size_t errlen);
/* Parse "header:<name>" | "user" | "" (none). */
pdgw_status_t pdgw_affinity_parse(const char *text, pdgw_affinity_mode_t *mode, char *header,
                                  size_t header_len);

typedef enum pdgw_admit_result {
    PDGW_ADMIT_ADMITTED = 0,      /* holds a slot now */
    PDGW_ADMIT_QUEUED = 1,        /* waits; on_grant will be called, or it times out */
    PDGW_ADMIT_QUEUE_FULL = -1,   /* refused: no slot and no place in the queue */
    PDGW_ADMIT_RATE_LIMITED = -2, /* refused: the key's bucket is empty */
    PDGW_ADMIT_NOMEM = -3,
} pdgw_admit_result_t;

typedef enum pdgw_ticket_state {
    PDGW_TICKET_IDLE = 0,
    PDGW_TICKET_QUEUED,
    PDGW_TICKET_HELD, /* holds a slot (admitted directly or granted from the queue) */
    PDGW_TICKET_DONE, /* released, cancelled or timed out */
} pdgw_ticket_state_t;

typedef struct pdgw_admit_ticket {
    pdgw_admit_waiter_t waiter; /* priority is the caller's to set before enter */
    pdgw_ticket_state_t state;
    bool was_queued;
    uint64_t t_queued_ms;
    uint64_t deadline_ms; /* queue deadline: min(enter + queue_timeout, the cap given) */
    void (*on_grant)(void *arg);
    void *grant_arg;
} pdgw_admit_ticket_t;

typedef struct pdgw_admit pdgw_admit_t;

/* A controller with <limits> (copied). Metrics go to <reg> (may be NULL). */
pdgw_status_t pdgw_admit_create(const pdgw_admit_limits_t *limits, pdgw_metrics_t *reg,
                                pdgw_admit_t **out);
void pdgw_admit_destroy(pdgw_admit_t *a);
/* Swap the limits (copied) at <now_ms>; admits waiters if slots opened. */
pdgw_status_t pdgw_admit_set_limits(pdgw_admit_t *a, const pdgw_admit_limits_t *limits,
                                    uint64_t now_ms);
/* A copy of what the request path reads (backoff, affinity); the key list is not copied. */
void pdgw_admit_get_path_limits(pdgw_admit_t *a, pdgw_admit_limits_t *out);

/* Initialise a ticket (state IDLE, priority 0). */
void pdgw_admit_ticket_init(pdgw_admit_ticket_t *t);

/*
 * Ask for a slot for <t> (IDLE) at <now_ms>: key hash <key_hash> for the rate limit
 * (pdgw_rate_key_hash; <key> is the API key text used to find a per-key override, may be
 * NULL), waiting no later than <deadline_cap_ms> (0 = no cap). On a refusal
 * *retry_after_ms says when to come back (>= 1000 for whole seconds on the wire).
 * On QUEUED, <on_grant>(<arg>) is called later from whichever thread frees a slot.
 */
pdgw_admit_result_t pdgw_admit_enter(pdgw_admit_t *a, pdgw_admit_ticket_t *t, const char *key,
                                     size_t key_len, uint64_t now_ms, uint64_t deadline_cap_ms,
                                     void (*on_grant)(void *arg), void *arg,
                                     uint64_t *retry_after_ms);
/* A queued ticket whose deadline passed at <now_ms> leaves the queue: true when it timed
 * out now (false when it was granted meanwhile or its time has not come). */
bool pdgw_admit_expire(pdgw_admit_t *a, pdgw_admit_ticket_t *t, uint64_t now_ms);
/* The owner is done with <t> (any state): a held slot is released (and handed to the head
 * waiter), a queued ticket leaves the queue (counted as cancelled). Idempotent.
 * Returns the state <t> was in. */
pdgw_ticket_state_t pdgw_admit_leave(pdgw_admit_t *a, pdgw_admit_ticket_t *t, uint64_t now_ms);

/* Reload: the limits of <cfg> replace the current ones at <now_ms> (in-flight requests and
 * waiters keep their slot or place). An invalid config changes nothing: PDGW_ERR_INVALID with
 * the message in <err>. */
pdgw_status_t pdgw_admit_reload(pdgw_admit_t *a, const struct pdgw_config *cfg, uint64_t now_ms,
                                char *err, size_t errlen);

/* Join config reloads: the admission keys (limits, queue, rate limits, backoff, affinity) are
 * applied live through pdgw_admit_set_limits. */
struct pdgw_reload;
pdgw_status_t pdgw_admit_reload_register(pdgw_admit_t *a, struct pdgw_reload *rl);

/* The state of <t> now (read under the lock: another thread may be granting it). */
pdgw_ticket_state_t pdgw_admit_ticket_state(pdgw_admit_t *a, const pdgw_admit_ticket_t *t);

/* Counters for tests and /metrics. */
typedef struct pdgw_admit_stats {
    unsigned inflight;
    size_t queued;
    uint64_t admitted, granted, queue_full, rate_limited, timed_out, cancelled;
} pdgw_admit_stats_t;
void pdgw_admit_stats(pdgw_admit_t *a, pdgw_admit_stats_t *out);

/*
 * Backoff before retry number <attempt> (0 = the first) after an engine's 429/503:
 * base * 2^attempt capped at <max_ms>, with equal jitter from <rnd> (half fixed, half
 * random), and never shorter than the engine's Retry-After (<retry_after_ms>, 0 = none).
 */
uint64_t pdgw_retry_backoff_ms(uint64_t base_ms, uint64_t max_ms, unsigned attempt,
                               uint64_t retry_after_ms, uint64_t rnd);

#endif /* PDGW_ADMIT_H */
