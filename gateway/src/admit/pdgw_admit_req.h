/*
 * pdgw_admit_req.h - admission control on a request's workflow object (pdgw_admit_req.c):
 * entering, waiting, the retry backoff, session affinity; and the API key check of the
 * access phase (pdgw_phases.h).
 */
#ifndef PDGW_ADMIT_REQ_H
#define PDGW_ADMIT_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pdgw_phases.h"

typedef struct pdgw_wf pdgw_wf_t;
typedef struct pdgw_leg pdgw_leg_t;
typedef struct pdgw_req pdgw_req_t;

/* dispatch: true = run the workflow now; false = refused (reply set) or queued (it starts
 * when granted). */
bool pdgw_admit_req_enter(pdgw_wf_t *wf);
/* a wake: true when it was admission's (the workflow was started or the wake ignored). */
bool pdgw_admit_req_on_wake(pdgw_wf_t *wf);
/* deadline scan: true when <wf> waits in the admission queue (timed out or still waiting). */
bool pdgw_admit_req_check(pdgw_wf_t *wf, uint64_t now_ms);
/* the request ends: leave the queue or release the slot, exactly once. */
void pdgw_admit_req_done(pdgw_wf_t *wf);
/* Backoff before retrying <failed_leg>'s 429/503: false = no retry fits before the
 * deadline; true with *delay_ms (0 = retry at once: not an overload answer). */
bool pdgw_admit_retry_delay(pdgw_wf_t *wf, const pdgw_leg_t *failed_leg, uint64_t *delay_ms);

/* The access hook: a route that needs a key gets the Bearer check (401 answered: false). */
bool pdgw_auth_access(pdgw_req_t *r);
/* The API key the client presented ("Authorization: Bearer <key>", blanks trimmed; not
 * NUL-terminated, *len bytes), NULL when none. */
const char *pdgw_req_bearer(pdgw_req_t *r, size_t *len);
/* The request's priority: the body's `priority`, else the X-Priority header, else 0 (lower
 * is served earlier, as vLLM reads it). false with <e> set when it is not an integer. */
bool pdgw_req_priority(pdgw_req_t *r, int64_t *out, pdgw_api_error_t *e);

/* ---- tenants' budgets and fair queue (pdgw_quota_req.c), called from the above */
/* true = go on; false = refused (reply set) or queued for the tenant's share. */
bool pdgw_quota_req_enter(pdgw_wf_t *wf);
/* A wake: -1 not waiting for the quota, 0 still waiting, 1 granted (stage back to NONE). */
int pdgw_quota_req_on_wake(pdgw_wf_t *wf);
/* Deadline scan: true while it waits for the quota (a timed-out wait is answered 429). */
bool pdgw_quota_req_check(pdgw_wf_t *wf, uint64_t now_ms);
/* The request ends: reconcile with the engine's usage and release, or cancel a wait. */
void pdgw_quota_req_done(pdgw_wf_t *wf);
/* The tenant's name ("" without tenants). */
const char *pdgw_quota_tenant_name(const pdgw_wf_t *wf);
/* The headers hook: x-ratelimit-* on every answer of a tenant's request. */
void pdgw_quota_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o);
/* A decode leg's <body> of a stream whose usage is the budget's: include_usage set. */
json_t *pdgw_quota_usage_leg(pdgw_wf_t *wf, json_t *body);
/* Keep this relayed event (its <data>, <had_usage>: it held usage) from the client? */
bool pdgw_quota_hide_event(const pdgw_wf_t *wf, const char *data, size_t len, bool had_usage);

#endif /* PDGW_ADMIT_REQ_H */
