/*
 * pdgw_fleet.h - hooks of the fleet features into the serving core: per-model routing and
 * listing (pdgw_models.c), pass-through of other engine endpoints (pdgw_passthrough.c) and
 * CORS (pdgw_cors.c). The core calls these at a few marked points; each file owns its state.
 */
#ifndef PDGW_FLEET_H
#define PDGW_FLEET_H

#include "pdgw_server_int.h"

/* ---- pdgw_models.c */
/* Before booking: a request for a <model> no instance serves gets the OpenAI 404 (code
 * model_not_found) from pdgw itself. false = answered. NULL/"" model = any instance. */
bool pdgw_models_admit(pdgw_req_t *r, const char *model);
/* GET /v1/models without configured names: the union the pool knows. false = some usable
 * instance's names are not known yet (the caller asks the engines instead). */
bool pdgw_models_serve_list(pdgw_req_t *r);
/* At the end of a request with a model: pdgw_model_* metrics (requests, duration, TTFT,
 * tokens) labelled by model. */
void pdgw_models_request_done(pdgw_req_t *r, const char *model, int status, double dur_s);

/* ---- pdgw_passthrough.c */
/* Is r->path one the gateway proxies unchanged (any other /v1/ path, engine utilities)? */
bool pdgw_pt_route(pdgw_req_t *r); /* the route hook */
/* Before admission: the body's model (unknown model: 404 answered, false) and, for a JSON
 * body, r->json so admission reads `priority` / `user` as for chat. */
bool pdgw_pt_prepare(pdgw_wf_t *wf);
/* Start proxying (authenticated, body complete, not draining, admitted). */
void pdgw_pt_start(pdgw_wf_t *wf);
/* The kept headers on the client's response. */
void pdgw_pt_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *out);
/* Request deadline, first-byte and idle timeouts of the raw leg. */
void pdgw_pt_check_deadlines(pdgw_wf_t *wf, uint64_t now_ms);
/* Connection completion: metrics (r->wf->pt_model is freed with the workflow). */
void pdgw_pt_finalize(pdgw_req_t *r, int status, double dur_s);

/* ---- pdgw_cors.c */
typedef enum {
    PDGW_CORS_NONE = 0, /* no Origin header, or CORS not configured */
    PDGW_CORS_ALLOWED,  /* the Origin is allowed: CORS headers on the response */
    PDGW_CORS_REFUSED,  /* an Origin that is not allowed */
} pdgw_cors_t;
/* Read the request's Origin once its headers are in (sets r->cors). */
/* OPTIONS preflight: answered (204 or 403) → true. */
bool pdgw_cors_preflight(pdgw_req_t *r);
/* The CORS headers of an allowed Origin on any response (replies, streams, errors). */
void pdgw_cors_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *out);

/* ---- pdgw_models.c (GET /v1/models) */
/* Answer from the configured model names. */
void pdgw_models_serve_local(pdgw_req_t *r);
/* Ask every usable instance; the reply is sent when the last one answered. */
void pdgw_models_start(pdgw_wf_t *wf);
void pdgw_models_leg_done(pdgw_wf_t *wf);
void pdgw_models_check_deadlines(pdgw_wf_t *wf, uint64_t now);
uint64_t pdgw_models_next_deadline(const pdgw_wf_t *wf);
void pdgw_models_release(pdgw_wf_t *wf);

/* ---- pdgw_admin_instances.c */
/* /admin/instances[/<id>[/drain|/undrain]] (r->admin_path is the part after the prefix). */
void pdgw_admin_instances_serve(pdgw_req_t *r);

/* ---- pdgw_admin.c */
/* The /admin/... rule (admin_api_key, loopback-only writes without it); false = refused, the
 * reply is queued and counted. */
bool pdgw_admin_authorize(pdgw_req_t *r);
/* POST /admin/reload; false when <r> is another admin path. */
bool pdgw_admin_serve(pdgw_req_t *r);
/* GET /admin/usage: the tenants' usage by phase (pdgw_admin_usage.c); false: not its path. */
bool pdgw_admin_usage_serve(pdgw_req_t *r);
/* With tls_ca: a verified client certificate (not asked of /health, /ready); false =
 * refused (403 queued, counted). */
bool pdgw_tls_authorize(pdgw_req_t *r);

/* ---- the hooks of these features (pdgw_phases.h), registered by the wiring */
void pdgw_cors_classify(pdgw_req_t *r); /* arrive */
bool pdgw_cors_head(pdgw_req_t *r);     /* head: the preflight */
bool pdgw_admin_access(pdgw_req_t *r);  /* access: the admin rule */
bool pdgw_models_body(pdgw_req_t *r);   /* body (INFER): model served */
void pdgw_models_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                        uint64_t now_ns); /* finish: per-model metrics */
void pdgw_pt_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                    uint64_t now_ns); /* finish: pass-through's */
extern const pdgw_job_ops_t pdgw_pt_job, pdgw_models_job;
extern const pdgw_route_ops_t pdgw_models_route, pdgw_admin_route;

#endif /* PDGW_FLEET_H */
