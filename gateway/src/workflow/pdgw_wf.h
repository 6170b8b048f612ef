/*
 * pdgw_wf.h - the workflow object: what one request needs while upstream work runs for it
 * (attempts, booking, legs, the forwarder's state, admission, retries), apart from the
 * connection object (pdgw_req_t: HTTP route, body, reply, output, suspension).
 *
 * Included by pdgw_server_int.h once the leg type is known; not on its own.
 *
 * Lifetimes:
 *   - A request that needs upstream work (inference, pass-through, GET /v1/models fan-out)
 *     gets one at dispatch (pdgw_wf_create, from its worker's free list); health, metrics,
 *     admin and other local replies never do. r->wf points to it, wf->req back.
 *   - Its legs, booking, waker, admission ticket and forwarder attempt are its own; legs
 *     report to it through their owner callbacks (leg->wf).
 *   - When the outcome is decided (stage FINISHED) its legs are stopped, but it stays while
 *     the client reads the rest of a stream: it is released by pdgw_req_finalize at the
 *     connection's completion, after the access log, the trace and the per-model metrics
 *     read what it measured. A client that goes away mid-workflow ends there too: the
 *     workflow is cancelled (legs aborted, forwarder cleanup, bookings cancelled), then
 *     released.
 *   - The forwarder context (refcounted across reloads) is held by the request from its
 *     arrival to its release; the workflow borrows it (wf->fwd_ctx).
 *   - The waker handed to the forwarder is refcounted: the workflow drops its reference and
 *     detaches it at its end, so a late wake finds no workflow.
 *   - A KV release leg that outlives its request runs under a bare owner request with a
 *     workflow object of its own (pdgw_kv_release.c), freed when that leg ends.
 *
 * What stays on the request although the workflow uses it: what the client sent and the
 * gateway parsed before any workflow exists (id, traceparent, json/info, deadline, headers to
 * forward, the limits of its arrival), the outcome the client saw (final status, error text,
 * failed PD phase: local replies and the connection guard set them too, the sink reads
 * them), and the deadline timer (pdgw_server.c: it also arms the client's hang-up watch;
 * armed only while a workflow runs, so in_active implies r->wf).
 */
#ifndef PDGW_WF_H
#define PDGW_WF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <pdsched/sched.h>

#include "pdgw/forwarder.h"
#include "pdgw_admit.h"
#include "pdgw_leg.h"
#include "pdgw_phases.h"
#include "pdquota/pdq_types.h"

typedef struct pdgw_req pdgw_req_t;
typedef struct pdgw_worker pdgw_worker_t;

typedef enum {
    PDGW_WF_NONE = 0,
    PDGW_WF_GATE,     /* waiting for the forwarder's gate */
    PDGW_WF_PREFILL,  /* serial: prefill leg running */
    PDGW_WF_DECODE,   /* decode (or single, or parallel) legs running */
    PDGW_WF_FINISHED, /* the outcome is decided */
    PDGW_WF_WAIT,     /* admission queue or retry backoff (pdgw_admit_req.c) */
} pdgw_wf_stage_t;

#define WF_FAILED_MAX 4 /* failed instances a request remembers */

struct pdgw_wf {
    pdgw_req_t *req; /* the request it runs for */
    pdgw_worker_t *w;
    void *fwd_ctx; /* borrowed from req (it holds the reference) */
    pdgw_wf_stage_t stage;
    pdgw_gate_point_t gate_point;
    uint64_t gate_deadline_ms;
    sched_booking_t *booking;
    pdgw_instance_t inst_view[2]; /* [PDGW_LEG_PREFILL], [PDGW_LEG_DECODE] */
    bool inst_set[2];
    sched_instance_t *sched_inst[2]; /* referenced instances behind inst_view */
    pdgw_fwd_request_t freq;
    pdgw_fwd_peers_t peers;
    void *fwd_state;
    bool attempt_live; /* attempt_init ran, cleanup pending */
    bool passthrough;  /* not a forwarder workflow (GET /v1/models, pass-through) */
    /* Minted per attempt (uuid4, 122 random bits): the X-Request-Id the engines see and
     * the name of every KV transfer. Never derived from anything the client sent. */
    char leg_id[PDGW_UUID_STR_LEN + 1];
    unsigned attempt;
    pdgw_leg_origin_t origin; /* what its legs send for the request (pdgw_leg.h) */
    pdgw_leg_t legs[2];
    struct pdgw_fwd_waker *waker;
    /* instances that failed an attempt (excluded from the next pick; WF_FAILED_MAX at most):
     * allocated at the first failure, as most requests never have one */
    char (*failed_ids)[SCHED_ID_MAX];
    size_t n_failed;
    uint64_t t_prefill_done_ms;
    bool kv_wait_observed;
    bool decode_parked; /* parallel: the decode's answer waits for the prefill's */
    /* GET /v1/models without configured names: one leg per usable instance. */
    pdgw_leg_t *mlegs;
    pdgw_instance_t *minst;
    char **mstr; /* owned copies of the instances' ids and urls */
    size_t n_mlegs;
    size_t n_mdone;
    struct pdgw_req_route *rt; /* tokens and the PD decision (pdgw_route.h); NULL = none */
    /* admission, retry backoff, session affinity (pdgw_admit_req.c) */
    pdgw_admit_ticket_t admit;
    bool admit_waiting;       /* queued for admission (stage WAIT) */
    uint64_t retry_at_ms;     /* backoff: the next attempt starts then (stage WAIT) */
    bool retry_decode_only;   /* ... and it is a new decode for the kept prefill */
    const char *affinity_key; /* borrowed (MHD header or req->json), NULL = none */
    /* tenants' budgets and fair queue (pdgw_quota_req.c) */
    struct pdq_ticket *quota;    /* admitted or queued; NULL = none (or released) */
    _Atomic bool quota_ready;    /* set by the quota layer's thread when a slot is granted */
    bool quota_waiting;          /* queued for a tenant's fair share (stage WAIT) */
    bool quota_hide_usage;       /* usage asked of the engine for the budget, not the client */
    bool quota_tenant_set;       /* quota_tenant is valid */
    uint32_t quota_tenant;       /* pdq tenant index */
    uint64_t quota_deadline_ms;  /* longest wait for the fair share */
    uint64_t quota_est_prompt;   /* what admission charged */
    pdq_headers_t quota_headers; /* x-ratelimit-* (and retry-after when refused) */
    /* pass-through (pdgw_passthrough.c) */
    bool pt;               /* a pass-through workflow (PDGW_ROUTE_PASSTHROUGH) */
    bool pt_relayed;       /* the engine's status and first bytes went to the client */
    char *pt_model;        /* the body's "model" (owned) or NULL */
    pdgw_buf_t pt_headers; /* the engine's response headers to relay ("Name\0value\0"...) */
    /* What it measured, read at completion (access log, trace, per-model metrics). */
    char prefill_id[SCHED_ID_MAX];
    char decode_id[SCHED_ID_MAX];
    uint64_t t_first_token_ns;
    uint64_t t_last_token_ns;
    uint32_t n_later_events;           /* relayed data events after the first token's */
    uint32_t slo_ttft_ms, slo_tpot_ms; /* the request's targets, 0 = none (pdgw_slo.c) */
    uint64_t t_prefill_us;
    /* The latency models' predictions for the booked legs (sched_booking_predicted; 0 =
     * cold): the prefill leg (or a whole-request decode's first token) and the decode's TPOT. */
    double pred_first_s, pred_tpot_s;
    uint64_t t_decode_us;
    bool usage_seen; /* the engine reported usage: usage_prompt/usage_completion */
    int64_t usage_prompt, usage_completion;
    int64_t usage_cached;    /* usage.prompt_tokens_details.cached_tokens (0 = none) */
    bool prefill_usage_seen; /* the prefill's own answer had usage: */
    int64_t prefill_cached;  /* its cached_tokens */
    uint64_t t_kv_wait_us;   /* prefill end to the first decode event */
};

/* ---- pdgw_wf.c */
/* The workflow object of <r> (r->wf), zeroed from its worker's free list with both legs
 * ready; NULL when out of memory. */
pdgw_wf_t *pdgw_wf_create(pdgw_req_t *r);
/* Free everything <wf> still holds (legs, fan-out, route state, pass-through buffers) and
 * give it back; its request's r->wf becomes NULL. Its workflow must have been stopped
 * (pdgw_wf_stop). */
void pdgw_wf_release(pdgw_wf_t *wf);

/* ---- pdgw_workflow.c */
/* Start the workflow of a validated inference request (or a GET /v1/models fan-out). */
void pdgw_wf_start(pdgw_wf_t *wf);
/* The workflow as the owner of a request's prefill and decode legs. */
extern const pdgw_leg_owner_t pdgw_wf_leg_owner;
/* An owner's `moved` for legs of a request's workflow: its timer brought forward. */
void pdgw_wf_leg_moved(pdgw_leg_t *leg);
/* Deadlines of <wf> at <now_ms>. */
void pdgw_wf_check_deadlines(pdgw_wf_t *wf, uint64_t now_ms);
/* The earliest deadline of <wf> (absolute mono ms), UINT64_MAX = none. */
uint64_t pdgw_wf_next_deadline(const pdgw_wf_t *wf);
/* The forwarder's waker fired. */
void pdgw_wf_on_wake(pdgw_wf_t *wf);
/* The outcome is decided: no more deadlines. */
void pdgw_wf_set_finished(pdgw_wf_t *wf);
/* The client is gone or the request is being torn down: stop all, cleanup once. */
void pdgw_wf_cancel(pdgw_wf_t *wf);
/* Has it started and not decided its outcome yet? */
bool pdgw_wf_running(const pdgw_wf_t *wf);
/* The request ends: cancel what runs, leave admission, detach the waker, drop the booking.
 * What it measured stays readable until pdgw_wf_release. */
void pdgw_wf_stop(pdgw_wf_t *wf);

/* pdgw_req_report.c: the access line and the trace of a finished request (a finish hook). */
void pdgw_req_report_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                            uint64_t now_ns);

/* pdgw_req_body.c: the INFER route's body hook, the free hook of its validated fields, and
 * its job (pdgw_phases.h). */
bool pdgw_req_infer_body(pdgw_req_t *r);
void pdgw_req_info_free(pdgw_req_t *r);
extern const pdgw_job_ops_t pdgw_infer_job;

#include "pdgw_admit_req.h" /* admission's side of the workflow object */

#endif /* PDGW_WF_H */
