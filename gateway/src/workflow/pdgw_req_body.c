/*
 * pdgw_req_body.c - an inference request's body before its workflow: validated (on its text
 * when the forwarder never reads the tree, else parsed), the client's PD fields refused,
 * stripped or passed; and the inference job the serving core runs for the route
 * (pdgw_phases.h).
 */
#include "pdgw_validate.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_log.h"

/* PD control fields in the client body (pdgw_validate_pd.c): refused, stripped or, for a
 * plain proxy whose operator opted in, passed. A stripped body is re-encoded so that a
 * forwarder that forwards the client's bytes (neutral) sends the stripped version too.
 * false = the request was refused (<e> filled). */
static bool req_pd_fields(pdgw_req_t *r, pdgw_api_error_t *e)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_pd_fields_mode_t mode = srv->opts.client_pd_fields;
    pdgw_pd_fields_result_t res;
    const char *action;
    pdgw_status_t st = pdgw_request_pd_fields(r->json, mode, srv->desc->client_fields, &res, e);
    size_t i;
    if (res.n_hits == 0)
        return true;
    action = mode == PDGW_PD_FIELDS_REJECT  ? "rejected"
             : mode == PDGW_PD_FIELDS_STRIP ? "stripped"
                                            : "passed";
    for (i = 0; i < res.n_hits && i < PDGW_PD_FIELDS_MAX_HITS; i++)
        pdgw_gateway_metrics_client_pd_field(srv->opts.metrics, srv->desc->name, res.rules[i],
                                             action);
    pdgw_log_debug("http", "request %s: client PD field '%s' (%zu in all) %s", r->id,
                   res.first_param, res.n_hits, action);
    if (st != PDGW_OK)
        return false;
    if (mode == PDGW_PD_FIELDS_STRIP) {
        char *text = json_dumps(r->json, JSON_COMPACT);
        if (text == NULL) {
            pdgw_api_error_set(e, PDGW_API_ERR_INTERNAL, NULL, "Out of memory.");
            return false;
        }
        r->body.len = 0;
        if (pdgw_buf_append(&r->body, text, strlen(text)) != PDGW_OK) {
            free(text);
            pdgw_api_error_set(e, PDGW_API_ERR_INTERNAL, NULL, "Out of memory.");
            return false;
        }
        free(text);
    }
    return true;
}

/* A body of scalar members for a forwarder that never reads the tree is validated on its text;
 * the tree is built only if something asks for it (pdgw_req_json). */
static bool dispatch_infer_flat(pdgw_req_t *r)
{
    const pdgw_server_t *srv = r->w->srv;
    if (!srv->desc->body_unread ||
        !pdgw_request_validate_flat(r->kind, r->body.data, r->body.len, srv->desc->client_fields,
                                    &r->info, r->model_copy, sizeof(r->model_copy)))
        return false;
    r->info_valid = true;
    r->json_deferred = true;
    return true;
}

/* A completions / chat body: parsed, validated, PD fields handled (a body hook of the INFER
 * route); false = answered. */
static bool dispatch_infer_body(pdgw_req_t *r)
{
    pdgw_gateway_metrics_t *gm = r->w->srv->opts.metrics;
    pdgw_api_error_t e;

    if (dispatch_infer_flat(r))
        return true;
    if (pdgw_request_parse(r->body.data ? r->body.data : "", r->body.len, &r->json, &e) !=
        PDGW_OK) {
        pdgw_gateway_metrics_rejected(gm, "bad_json");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    if (pdgw_request_validate(r->kind, r->json, &r->info, &e) != PDGW_OK) {
        pdgw_gateway_metrics_rejected(gm, "invalid");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    r->info_valid = true;
    if (!req_pd_fields(r, &e)) {
        pdgw_gateway_metrics_rejected(gm, "client_pd_field");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    return true;
}

void pdgw_req_info_free(pdgw_req_t *r)
{
    if (r->info_valid)
        pdgw_request_info_release(&r->info);
}

bool pdgw_req_infer_body(pdgw_req_t *r)
{
    return dispatch_infer_body(r);
}

const pdgw_job_ops_t pdgw_infer_job = {
    .name = "inference",
    .start = pdgw_wf_start,
    .wake = pdgw_wf_on_wake,
    .next_deadline = pdgw_wf_next_deadline,
    .check_deadlines = pdgw_wf_check_deadlines,
    .running = pdgw_wf_running,
    .stop = pdgw_wf_stop,
    .release = pdgw_wf_release,
};
