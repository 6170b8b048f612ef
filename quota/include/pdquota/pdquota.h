/*
 * pdquota.h - tenants' budgets, weighted fair admission and usage accounting.
 *
 * Per request the gateway calls, in this order:
 *
 *   idx = pdq_tenant_by_key(q, api_key);                  (NULL key = default tenant)
 *   st = pdq_admit(q, idx, model, est_prompt, est_completion, on_ready, arg, &t, &verdict);
 *     PDQ_OK       admitted: run it; send verdict.headers with the answer
 *     PDQ_REFUSED  answer verdict.http_status with verdict.headers (Retry-After is in them)
 *     PDQ_WAIT     queued for a concurrency slot: on_ready(t, arg) fires once it has one;
 *                  a client that goes away or a wait that times out: pdq_cancel(t)
 *   pdq_ticket_phase(t, PDQ_PHASE_PREFILL, ns) ...          (as phases end)
 *   pdq_reconcile(t, prompt, cached_prompt, completion);    (once, when the answer ends)
 *   pdq_release(t);                                         (always, exactly once)
 *
 * Threads: every call may come from any thread. Admission takes the tenant's own mutex (and
 * the wait queue's lock only while the gateway is full); nothing waits on the network.
 */
#ifndef PDQUOTA_H
#define PDQUOTA_H

#include <stdbool.h>

#include <jansson.h>

#include "pdb/pdb_clock.h"
#include "pdb/pdb_prom.h"
#include "pdquota/pdq_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdq pdq_t;
typedef struct pdq_ticket pdq_ticket_t;

/* Called once when a queued ticket got its slot. It runs with the wait queue's lock held, on
 * the thread that freed the slot: post the ticket to your own loop and return; never call
 * pdq from it. */
typedef void (*pdq_on_ready_fn)(pdq_ticket_t *t, void *arg);

/* Short static description of <st>; never NULL. */
const char *pdq_strerror(pdq_status_t st);
/* "rate_limited", "tokens_exhausted", "queue_full", "quota_store_unavailable" (OpenAI-style
 * error codes); "" for PDQ_CODE_NONE. */
const char *pdq_code_name(pdq_code_t code);

/*
 * Build the quota object from <cfg> (copied: the caller may free it afterwards) on <clock>
 * (NULL = CLOCK_MONOTONIC; copied). With cfg->store.url set, a background thread owns the
 * store connection from pdq_start on. <err> (may be NULL) receives a message on failure.
 */
pdq_status_t pdq_new(const pdq_config_t *cfg, const pdb_clock_t *clock, pdq_t **out, char *err,
                     size_t errlen);
/* Start the store thread (no-op without a store). Registration and config first, then this. */
pdq_status_t pdq_start(pdq_t *q);
/* Stop the store thread (giving unused leases back), free everything. Every ticket must have
 * been released or cancelled. NULL is ignored. */
void pdq_free(pdq_t *q);

/*
 * A reload of the tenants, in two steps so that it can be refused before anything changes:
 * prepare checks <cfg> against the running tenants and allocates what commit needs; commit
 * applies it and cannot fail; free drops a prepared update that was not committed. prepare
 * returns PDQ_ERR_INVALID for a configuration pdq_new would refuse too, PDQ_ERR_STATE for a
 * change only a new quota object can take (below), each with a message.
 * Applied live: every tenant's budgets (what was spent in the period counts against the new
 * size; a budget switched on starts full), concurrency limits, reserved slots, queue bound, weight,
 * priority and API keys (a key moved to another tenant counts there from the next request), the
 * default tenant, and tenants added or removed. Tenants are matched by name: a new name is a
 * new tenant (it starts with full budgets); a name the new config lacks is removed (its keys
 * stop leading to it, what it runs and queues finishes under its old limits, its usage stays
 * readable; the same name later gets its slot back). A rename is a removal plus an addition.
 * Refused (a restart applies them): a budget for a model no tenant had one for, max_concurrent
 * turned on or off, more tenants than PDQ_MAX_TENANTS added over the object's life. The store
 * settings are not read (they stay the running ones). In-flight and queued requests keep their
 * tickets; usage accounting goes on. One update is prepared at a time.
 */
typedef struct pdq_update pdq_update_t;
pdq_status_t pdq_update_prepare(pdq_t *q, const pdq_config_t *cfg, pdq_update_t **out, char *err,
                                size_t errlen);
void pdq_update_commit(pdq_t *q, pdq_update_t *u); /* frees <u> */
void pdq_update_free(pdq_update_t *u);
/* What a prepared update adds, removes and brings back ("added \"c\", removed \"b\""), "" when
 * the set of tenants stays. */
const char *pdq_update_summary(const pdq_update_t *u);

/* Tenant of an API key: NULL or "" = the default tenant, an unknown key = "other". */
size_t pdq_tenant_by_key(const pdq_t *q, const char *api_key);
/* Tenant by name, or (size_t)-1. */
size_t pdq_tenant_by_name(const pdq_t *q, const char *name);
/* Tenant slots: the configured tenants, "other" (slot count at start - 1), then tenants added
 * by reloads (a removed tenant keeps its slot); and a slot's name (borrowed). */
size_t pdq_tenant_count(const pdq_t *q);
const char *pdq_tenant_name(const pdq_t *q, size_t tenant);

/*
 * Admit one request of <tenant> for <model> (may be NULL) with estimated token counts.
 * PDQ_OK: *out is the admitted ticket. PDQ_WAIT: *out is queued (its rate budgets are charged
 * already; pdq_cancel refunds them). PDQ_REFUSED: *out is NULL and *verdict says why.
 * <verdict> (may be NULL) always gets the x-ratelimit-* headers of the tenant.
 */
pdq_status_t pdq_admit(pdq_t *q, size_t tenant, const char *model, uint64_t est_prompt_tokens,
                       uint64_t est_completion_tokens, pdq_on_ready_fn on_ready, void *arg,
                       pdq_ticket_t **out, pdq_verdict_t *verdict);

/* As pdq_admit, with a deadline for the wait (any increasing unit, e.g. arrival + TTFT target
 * in ms; 0 = none): a tenant's turn in the fair queue goes to its waiter of the earliest
 * deadline (among its 64 oldest; those without one after the others, oldest first) instead
 * of its oldest; the shares between tenants are unchanged. */
pdq_status_t pdq_admit_deadline(pdq_t *q, size_t tenant, const char *model,
                                uint64_t est_prompt_tokens, uint64_t est_completion_tokens,
                                uint64_t deadline, pdq_on_ready_fn on_ready, void *arg,
                                pdq_ticket_t **out, pdq_verdict_t *verdict);

/* The answer's real token counts: the difference to the estimate is charged (or refunded) to
 * every token budget, and they are what usage accounting records. Call at most once. */
void pdq_reconcile(pdq_ticket_t *t, uint64_t prompt_tokens, uint64_t cached_prompt_tokens,
                   uint64_t completion_tokens);
/* Add <ns> to a phase's time, <bytes> of KV moved. */
void pdq_ticket_phase(pdq_ticket_t *t, pdq_phase_t phase, uint64_t ns);
void pdq_ticket_kv_bytes(pdq_ticket_t *t, uint64_t bytes);
/* Tenant of a ticket. */
size_t pdq_ticket_tenant(const pdq_ticket_t *t);
/* The request ended (admitted ticket): frees its slot, records usage, frees <t>. A ticket
 * still waiting is cancelled instead (see pdq_cancel). */
void pdq_release(pdq_ticket_t *t);
/* Give up a queued ticket (client gone, wait timed out): its charges are refunded, on_ready
 * will not fire, <t> is freed. Returns true if it was still waiting; false means it had its
 * slot already (on_ready has run) and was released like pdq_release. */
bool pdq_cancel(pdq_ticket_t *t);

/* x-ratelimit-* headers of <tenant> (and <model>, may be NULL) now, for admitted answers. */
void pdq_ratelimit_headers(pdq_t *q, size_t tenant, const char *model, pdq_headers_t *out);

/* Prometheus families of the quota layer (usage by phase, refusals, queue, store health)
 * with bounded labels: configured tenants + "other", configured models + "other". */
void pdq_usage_prometheus(pdq_t *q, pdb_prom_t *p);

/*
 * Usage for GET /admin/usage: <window_s> = 0 for totals since start (fleet-wide from the store
 * when one is configured and reachable), else the last <window_s> seconds (at most 3600,
 * this replica, per-minute resolution). Filters may be NULL. Returns a new reference (the
 * caller owns it), NULL when out of memory.
 */
json_t *pdq_usage_json(pdq_t *q, uint32_t window_s, const char *tenant_filter,
                       const char *model_filter);

/* Store state, for health output and tests. */
typedef struct pdq_store_stats {
    bool configured, connected;
    uint64_t errors, reconnects, syncs, noscript_fallbacks;
} pdq_store_stats_t;
void pdq_store_stats(pdq_t *q, pdq_store_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* PDQUOTA_H */
