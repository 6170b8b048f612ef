/*
 * pdgw_phases.h - where the rooms above the serving core hook into a request's path, as
 * nginx's phase handlers do: the core runs what is registered, in registration order, and
 * names no feature. The wiring (app/pdgw_wiring.c) registers everything once, before the
 * first server is made; the tables are read-only after that, so workers read them unlocked.
 *
 *   arrive     the head is read: what a room notes of it first (the CORS origin)
 *   route      a path no built-in route took: claim it (pass-through)
 *   head       the head is in, before the route is judged (client certificate, CORS preflight)
 *   access     the route and method are known: who may use it (admin rule, API keys)
 *   local      a route answered by the gateway itself (admin, /v1/models)
 *   body       the whole body is in: check it for its route (validation, the model served)
 *   job        upstream work of a route: its object's operations (pdgw_job_ops_t)
 *   enter      before the job starts: latency targets, pass-through's model, admission
 *   headers    response headers on every reply or stream (CORS, pass-through's kept ones)
 *   finish     the request ended: per-model and pass-through metrics, access line, trace
 *   free       the request object is recycled: what a room attached to it
 *   server / worker   start and stop of a server; a worker's stop
 */
#ifndef PDGW_PHASES_H
#define PDGW_PHASES_H

#include <stdbool.h>
#include <stdint.h>

#include "pdgw_errors.h"

typedef struct pdgw_req pdgw_req_t;
typedef struct pdgw_wf pdgw_wf_t;
typedef struct pdgw_worker pdgw_worker_t;
typedef struct pdgw_server pdgw_server_t;
typedef struct pdgw_hdr_out pdgw_hdr_out_t;

/* Hooks of one kind at most (more is a wiring bug, refused at registration). */
#define PDGW_PHASE_MAX 8

/* Routes of the request path (r->route). */
typedef enum {
    PDGW_ROUTE_NONE = 0,
    PDGW_ROUTE_INFER, /* completions / chat completions */
    PDGW_ROUTE_MODELS,
    PDGW_ROUTE_HEALTH,
    PDGW_ROUTE_READY,
    PDGW_ROUTE_METRICS,
    PDGW_ROUTE_ADMIN,
    PDGW_ROUTE_PASSTHROUGH, /* other /v1/ paths and engine utility endpoints */
    PDGW_ROUTE_COUNT
} pdgw_route_t;

/* A hook that may answer the request itself: false = answered (a reply is queued). */
typedef bool (*pdgw_req_check_fn)(pdgw_req_t *r);

/* What the serving core does with a request's upstream work, whatever its kind (inference,
 * the /v1/models fan-out, pass-through): the kind's own functions. */
typedef struct pdgw_job_ops {
    const char *name;
    /* Admitted: run. */
    void (*start)(pdgw_wf_t *wf);
    /* Its waker fired on the worker (a forwarder's gate, admission granted). */
    void (*wake)(pdgw_wf_t *wf);
    /* Deadlines: the next one (UINT64_MAX = none) / those passed at <now> handled. */
    uint64_t (*next_deadline)(const pdgw_wf_t *wf);
    void (*check_deadlines)(pdgw_wf_t *wf, uint64_t now_ms);
    /* Does it still run (legs, gates, waits)? Stop it (the request is ending). */
    bool (*running)(const pdgw_wf_t *wf);
    void (*stop)(pdgw_wf_t *wf);
    /* Give its object back (after finish hooks read its figures). */
    void (*release)(pdgw_wf_t *wf);
    /* A passed deadline's check may free the request itself (nothing touches it after). */
    bool may_free;
} pdgw_job_ops_t;

/* How a route is served once its body is in: local (true = answered; NULL = not local),
 * body checks (false = answered), and the job it runs otherwise. */
typedef struct pdgw_route_ops {
    bool (*local)(pdgw_req_t *r);
    const pdgw_job_ops_t *job;
    /* Makes the job's object for <r> (NULL = out of memory). */
    pdgw_wf_t *(*job_create)(pdgw_req_t *r);
} pdgw_route_ops_t;

typedef enum { PDGW_HEADERS_REPLY, PDGW_HEADERS_STREAM } pdgw_headers_kind_t;
typedef void (*pdgw_headers_fn)(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o);
/* The end of a request with its final <status> and duration; <disconnected> = the client left
 * before the whole answer. */
typedef void (*pdgw_finish_fn)(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                               uint64_t now_ns);

/* Registration (the wiring, once). Each returns PDGW_ERR_LIMIT past PDGW_PHASE_MAX. */
pdgw_status_t pdgw_phase_arrive(void (*note)(pdgw_req_t *r));
pdgw_status_t pdgw_phase_route(pdgw_req_check_fn claim); /* true = claimed as PASSTHROUGH */
pdgw_status_t pdgw_phase_head(pdgw_req_check_fn check);
pdgw_status_t pdgw_phase_access(pdgw_req_check_fn check);
pdgw_status_t pdgw_phase_body(pdgw_route_t route, pdgw_req_check_fn check);
pdgw_status_t pdgw_phase_enter(pdgw_route_t route, bool (*enter)(pdgw_wf_t *wf));
pdgw_status_t pdgw_phase_headers(pdgw_headers_fn add);
pdgw_status_t pdgw_phase_finish(pdgw_finish_fn done);
/* The request object is about to be recycled: free what a room attached to it. */
pdgw_status_t pdgw_phase_free(void (*free_fn)(pdgw_req_t *r));
void pdgw_phase_route_ops(pdgw_route_t route, const pdgw_route_ops_t *ops);
pdgw_status_t pdgw_phase_server(pdgw_status_t (*start)(pdgw_server_t *srv, char *err,
                                                       size_t errlen),
                                void (*stop)(pdgw_server_t *srv));
pdgw_status_t pdgw_phase_worker_stop(void (*stop)(pdgw_worker_t *w));

/* Running them (the serving core). */
void pdgw_phases_arrive(pdgw_req_t *r);
bool pdgw_phases_claim_route(pdgw_req_t *r);
bool pdgw_phases_head(pdgw_req_t *r);
bool pdgw_phases_access(pdgw_req_t *r);
bool pdgw_phases_body(pdgw_req_t *r);
bool pdgw_phases_enter(pdgw_wf_t *wf, pdgw_route_t route);
void pdgw_phases_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o);
void pdgw_phases_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                        uint64_t now_ns);
void pdgw_phases_free(pdgw_req_t *r);
const pdgw_route_ops_t *pdgw_phases_route_ops(pdgw_route_t route);
pdgw_status_t pdgw_phases_server_start(pdgw_server_t *srv, char *err, size_t errlen);
void pdgw_phases_server_stop(pdgw_server_t *srv);
void pdgw_phases_worker_stop(pdgw_worker_t *w);

#endif /* PDGW_PHASES_H */
