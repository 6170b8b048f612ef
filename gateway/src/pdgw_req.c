/*
 * pdgw_req.c - the end of a request (its connection completed) and its error text.
 *
 * The request object lives from the first handler call to MHD's completion notice; its
 * workflow, when it has one, ends here too: stopped first, then read (access log, trace,
 * per-model metrics), then released, then the request itself.
 */
#include "pdgw_server_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_fleet.h"
#include "pdgw_json_load.h"
#include "pdgw_json_text.h"
#include "pdgw_log.h"
#include "pdgw_otel.h"
#include "pdgw_route.h"

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

/* The spans of a finished request (pdgw_otel.h); the legs' and instances' part comes from
 * its workflow when it had one. Leg times are in ms, the request's in ns. */
static void req_trace(const pdgw_req_t *r, int status, uint64_t now_ns)
{
    const pdgw_wf_t *wf = r->wf;
    const pdgw_leg_t *p = wf ? &wf->legs[PDGW_LEG_PREFILL] : NULL;
    const pdgw_leg_t *d = wf ? &wf->legs[PDGW_LEG_DECODE] : NULL;
    pdgw_traceparent_t span;
    pdgw_otel_request_t t;
    uint64_t ms = 1000000u;

    if (pdgw_traceparent_parse(r->traceparent, strlen(r->traceparent), &span) != PDGW_OK)
        return;
    memset(&t, 0, sizeof(t));
    t.span = &span;
    t.parent = r->has_client_tp ? &r->client_tp : NULL;
    t.path = r->path;
    t.method = r->method;
    t.protocol = r->w->srv->desc->name;
    t.model = r->info_valid ? r->info.model : NULL;
    t.request_id = r->id;
    t.failure_phase = r->pd_phase != PDGW_PHASE_NONE ? pdgw_phase_name(r->pd_phase) : NULL;
    t.error = pdgw_req_error(r)[0] ? pdgw_req_error(r) : NULL;
    t.status = status;
    t.stream = r->info_valid && r->info.stream;
    t.prompt_tokens = -1;
    t.completion_tokens = -1;
    t.start_ns = r->t_start_ns;
    t.end_ns = now_ns;
    if (wf != NULL) {
        t.prefill_instance = wf->prefill_id[0] ? wf->prefill_id : NULL;
        t.decode_instance = wf->decode_id[0] ? wf->decode_id : NULL;
        t.retries = wf->attempt;
        if (wf->usage_seen) {
            t.prompt_tokens = wf->usage_prompt;
            t.completion_tokens = wf->usage_completion;
        }
        /* The legs of the last attempt (a retry restarts them). */
        if (p->t_start_ms) {
            t.prefill_start_ns = p->t_start_ms * ms;
            t.prefill_end_ns = p->t_end_ms * ms;
        }
        if (d->t_start_ms) {
            t.decode_start_ns = d->t_start_ms * ms;
            t.decode_end_ns = d->t_end_ms * ms;
            t.decode_first_ns = d->t_first_ms * ms;
        }
        t.first_leg_ns = p->t_start_ms && (!d->t_start_ms || p->t_start_ms <= d->t_start_ms)
                             ? t.prefill_start_ns
                             : t.decode_start_ns;
        if (wf->attempt > 0)
            t.first_leg_ns = 0; /* the queue phase of the first attempt is not known any more */
        if (!t.prefill_end_ns)
            t.decode_first_ns = 0; /* no KV wait without a prefill */
    }
    pdgw_otel_record(r->w->srv->opts.otel, &t);
}

void pdgw_req_finalize(pdgw_req_t *r, bool client_disconnected)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_gateway_metrics_t *gm = srv->opts.metrics;
    pdgw_wf_t *wf = r->wf;
    bool was_running = wf != NULL && pdgw_wf_running(wf);
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
        pdgw_wf_stop(wf); /* legs stopped, bookings and admission done; its figures stay */

    if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
        r->route == PDGW_ROUTE_NONE || r->route == PDGW_ROUTE_PASSTHROUGH) {
        int status = r->final_status ? r->final_status : r->reply_status;
        double dur = (double)(now_ns - r->t_start_ns) / 1e9;
        if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
            r->route == PDGW_ROUTE_PASSTHROUGH)
            pdgw_gateway_metrics_request_done(&srv->proto_metrics, status, dur);
        /* fleet hooks: per-model and pass-through metrics */
        pdgw_models_request_done(r,
                                 wf != NULL && wf->pt ? wf->pt_model
                                 : r->info_valid      ? r->info.model
                                                      : NULL,
                                 status, dur);
        pdgw_pt_finalize(r, status, dur);
        if (pdgw_log_access_enabled())
            pdgw_req_access_log(r, status, client_disconnected && (was_running || stream_cut),
                                now_ns);
        if (r->route == PDGW_ROUTE_INFER && srv->opts.otel != NULL)
            req_trace(r, status, now_ns);
    }
    if (wf != NULL)
        pdgw_wf_release(wf);
    pdgw_worker_active_remove(r->w, r);
    if (r->counted) {
        atomic_fetch_sub(&srv->inflight, 1);
        pdgw_gauge_dec(gm->inflight);
    }
    if (r->info_valid)
        pdgw_request_info_release(&r->info);
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
