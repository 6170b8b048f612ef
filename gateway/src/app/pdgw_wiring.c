/*
 * pdgw_wiring.c - the one place that knows every room: it registers the rooms' hooks with
 * the serving core's phases (pdgw_phases.h), once, before the first server is made. A new
 * feature adds its hook here and lives in its own room.
 */
#include "pdgw_wiring.h"

#include <pthread.h>

#include "pdgw_admit_req.h"
#include "pdgw_fleet.h"
#include "pdgw_route.h"
#include "pdgw_wf.h"

#include "pdgw_slo.h"

static pdgw_status_t wire_status = PDGW_OK;
static pthread_once_t wire_once = PTHREAD_ONCE_INIT;

static const pdgw_route_ops_t infer_route = {.job = &pdgw_infer_job, .job_create = pdgw_wf_create};
static const pdgw_route_ops_t passthrough_route = {.job = &pdgw_pt_job,
                                                   .job_create = pdgw_wf_create};

static pdgw_status_t wire(void)
{
    pdgw_status_t st = PDGW_OK;
#define REG(call)                                                                                  \
    do {                                                                                           \
        if (st == PDGW_OK)                                                                         \
            st = (call);                                                                           \
    } while (0)
    /* The head: the CORS origin noted; client certificates, then preflights. */
    REG(pdgw_phase_arrive(pdgw_cors_classify));
    REG(pdgw_phase_head(pdgw_tls_authorize));
    REG(pdgw_phase_head(pdgw_cors_head));
    /* Paths no built-in route takes: pass-through. */
    REG(pdgw_phase_route(pdgw_pt_route));
    /* Who may use the route. */
    REG(pdgw_phase_access(pdgw_admin_access));
    REG(pdgw_phase_access(pdgw_auth_access));
    /* Routes. */
    pdgw_phase_route_ops(PDGW_ROUTE_ADMIN, &pdgw_admin_route);
    pdgw_phase_route_ops(PDGW_ROUTE_MODELS, &pdgw_models_route);
    pdgw_phase_route_ops(PDGW_ROUTE_INFER, &infer_route);
    pdgw_phase_route_ops(PDGW_ROUTE_PASSTHROUGH, &passthrough_route);
    REG(pdgw_phase_body(PDGW_ROUTE_INFER, pdgw_req_infer_body));
    REG(pdgw_phase_body(PDGW_ROUTE_INFER, pdgw_models_body)); /* unknown model: 404 */
    /* Before a job starts: pass-through's model, the prompt's ids, latency targets, admission. */
    REG(pdgw_phase_enter(PDGW_ROUTE_PASSTHROUGH, pdgw_pt_prepare));
    REG(pdgw_phase_enter(PDGW_ROUTE_PASSTHROUGH, pdgw_admit_req_enter));
    REG(pdgw_phase_enter(PDGW_ROUTE_INFER, pdgw_tokenize_enter)); /* the gateway's own ids */
    REG(pdgw_phase_enter(PDGW_ROUTE_INFER, pdgw_slo_req_enter));
    REG(pdgw_phase_enter(PDGW_ROUTE_INFER, pdgw_admit_req_enter));
    REG(pdgw_phase_enter(PDGW_ROUTE_MODELS, pdgw_admit_req_enter));
    /* Response headers: pass-through's kept ones, CORS, the tenant's limits. */
    REG(pdgw_phase_headers(pdgw_pt_add_headers));
    REG(pdgw_phase_headers(pdgw_cors_add_headers));
    REG(pdgw_phase_headers(pdgw_quota_add_headers)); /* x-ratelimit-* of the tenant */
    /* The end: per-model and pass-through metrics, then the access line and the trace. */
    REG(pdgw_phase_finish(pdgw_models_finish));
    REG(pdgw_phase_finish(pdgw_pt_finish));
    REG(pdgw_phase_finish(pdgw_req_report_finish));
    REG(pdgw_phase_free(pdgw_req_info_free));
    /* Per server: tokenize cache and selective PD; per worker: KV releases still running. */
    REG(pdgw_phase_server(pdgw_route_server_start, pdgw_route_server_stop));
    REG(pdgw_phase_worker_stop(pdgw_kv_release_drop_all));
#undef REG
    return st;
}

static void wire_once_fn(void)
{
    wire_status = wire();
}

pdgw_status_t pdgw_gateway_wire(void)
{
    pthread_once(&wire_once, wire_once_fn);
    return wire_status;
}
