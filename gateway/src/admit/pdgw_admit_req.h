/*
 * pdgw_admit_req.h - admission control on a request's workflow object (pdgw_admit_req.c):
 * entering, waiting, the retry backoff, session affinity; and the API key check of the
 * access phase (pdgw_phases.h).
 */
#ifndef PDGW_ADMIT_REQ_H
#define PDGW_ADMIT_REQ_H

#include <stdbool.h>
#include <stdint.h>

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

#endif /* PDGW_ADMIT_REQ_H */
