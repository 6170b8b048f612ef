/*
 * pdgw_req.c - the end of a request (its connection completed) and its error text.
 *
 * The request object lives from the first handler call to MHD's completion notice; its
 * workflow, when it has one, ends here too: stopped first, then read (access log, trace,
 * per-model metrics), then released, then the request itself.
 */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_server_int.h"
#include "pdgw_json_load.h"

/* The text buffer of <r>'s error, allocated the first time (NULL: out of memory). */
static char *error_buf(pdgw_req_t *r)
{
    if (r->error_text == NULL) {
        r->error_text = pdgw_malloc(PDGW_REQ_ERROR_MAX);
        if (r->error_text != NULL)
            r->error_text[0] = '\0';
    }
    return r->error_text;
}

void pdgw_req_error_set(pdgw_req_t *r, const char *fmt, ...)
{
    char *buf = error_buf(r);
    va_list ap;
    if (buf == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, PDGW_REQ_ERROR_MAX, fmt, ap);
    va_end(ap);
}

void pdgw_req_error_first(pdgw_req_t *r, const char *fmt, ...)
{
    char *buf;
    va_list ap;
    if (r->error_text != NULL && r->error_text[0] != '\0')
        return;
    buf = error_buf(r);
    if (buf == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, PDGW_REQ_ERROR_MAX, fmt, ap);
    va_end(ap);
}

const char *pdgw_req_error(const pdgw_req_t *r)
{
    return r->error_text != NULL ? r->error_text : "";
}

json_t *pdgw_req_json(pdgw_req_t *r)
{
    /* The text was checked by the same parser, so only memory can fail here. */
    if (r->json == NULL && r->json_deferred &&
        (r->json = pdgw_json_load_fast(r->body.data, r->body.len)) != NULL)
        r->json_deferred = false;
    return r->json;
}

json_t *pdgw_req_json_member(pdgw_req_t *r, const char *name)
{
    const char *v;
    size_t n;
    json_t *body;
    /* a body validated on its text has no escaped names: the names its walk saw, then its
     * text, say whether the member is there, and the tree is built only when it is */
    if (r->json == NULL && r->json_deferred &&
        (!(r->info.member_names & pdgw_json_name_bit(name, strlen(name))) ||
         !pdgw_json_member_value(r->body.data, r->body.len, name, &v, &n)))
        return NULL;
    body = pdgw_req_json(r);
    return body != NULL ? json_object_get(body, name) : NULL;
}

void pdgw_req_finalize(pdgw_req_t *r, bool client_disconnected)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_gateway_metrics_t *gm = srv->opts.metrics;
    pdgw_wf_t *wf = r->wf;
    bool was_running = wf != NULL && r->job->running(wf);
    bool stream_cut = r->committed && !r->out_done;
    uint64_t now_ns = pdgw_time_mono_ns();

    if (r->finalized)
        return;
    r->finalized = true;
    if (client_disconnected && (was_running || stream_cut) && r->route == PDGW_ROUTE_INFER) {
        pdgw_gateway_metrics_client_disconnect(gm, srv->desc->name);
        /* 499 (nginx's "client closed request"), also after the 200 of a stream went out:
         * the client did not get the whole answer. */
        r->final_status = 499;
        pdgw_req_error_set(r, "client disconnected%s", r->committed ? " mid-stream" : "");
    }
    if (wf != NULL)
        r->job->stop(wf); /* legs stopped, bookings and admission done; its figures stay */

    if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
        r->route == PDGW_ROUTE_NONE || r->route == PDGW_ROUTE_PASSTHROUGH) {
        int status = r->final_status ? r->final_status : r->reply_status;
        double dur = (double)(now_ns - r->t_start_ns) / 1e9;
        if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
            r->route == PDGW_ROUTE_PASSTHROUGH)
            pdgw_gateway_metrics_request_done(&srv->proto_metrics, status, dur);
        /* per-model and pass-through metrics, the access line, the trace */
        pdgw_phases_finish(r, status, dur, client_disconnected && (was_running || stream_cut),
                           now_ns);
    }
    if (wf != NULL)
        r->job->release(wf);
    pdgw_worker_active_remove(r->w, r);
    if (r->counted) {
        atomic_fetch_sub(&srv->inflight, 1);
        pdgw_gauge_dec(gm->inflight);
    }
    pdgw_phases_free(r); /* what the rooms above attached to the request */
    json_decref(r->json);
    if (r->body_held > 0)
        atomic_fetch_sub(&srv->body_bytes_held, r->body_held);
    r->body_held = 0;
    pdgw_buf_free(&r->body);
    pdgw_buf_free(&r->fwd_headers);
    pdgw_buf_free(&r->out);
    pdgw_free(r->reply_body);
    pdgw_free(r->error_text);
    pdgw_free(r->admin_path);
    pdgw_req_release(r);
}
