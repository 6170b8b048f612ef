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
bool pdgw_pt_route(const pdgw_req_t *r);
/* Before admission: the body's model (unknown model: 404 answered, false) and, for a JSON
 * body, r->json so admission reads `priority` / `user` as for chat. */
bool pdgw_pt_prepare(pdgw_wf_t *wf);
/* Start proxying (authenticated, body complete, not draining, admitted). */
void pdgw_pt_start(pdgw_wf_t *wf);
/* curl header callback of a raw leg: keep the engine's end-to-end headers. */
void pdgw_pt_on_header(pdgw_leg_t *leg, const char *line, size_t len);
/* The kept headers on the client's response. */
void pdgw_pt_add_headers(const pdgw_req_t *r, pdgw_hdr_out_t *out);
/* curl write callback of a raw leg. */
size_t pdgw_pt_on_write(pdgw_leg_t *leg, const char *data, size_t len);
/* The raw leg ended. */
void pdgw_pt_leg_done(pdgw_wf_t *wf, pdgw_leg_t *leg);
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
void pdgw_cors_classify(pdgw_req_t *r);
/* OPTIONS preflight: answered (204 or 403) → true. */
bool pdgw_cors_preflight(pdgw_req_t *r);
/* The CORS headers of an allowed Origin on any response (replies, streams, errors). */
void pdgw_cors_add_headers(const pdgw_req_t *r, pdgw_hdr_out_t *out);

#endif /* PDGW_FLEET_H */
