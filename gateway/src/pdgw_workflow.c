/*
 * pdgw_workflow.c - the workflow engine: runs one inference request through the forwarder.
 *
 *   book instances (batch: P+D together; staged: P now, D after prefill; single: one)
 *   -> attempt_init -> gate(BEFORE_PREFILL)
 *   -> SINGLE:   decode leg (relayed)
 *      SERIAL:   prefill leg (buffered) -> on_prefill_response -> [staged: book D]
 *                -> gate(BEFORE_DECODE) -> decode leg (relayed)
 *      PARALLEL: prefill leg (drained) and decode leg (relayed) at once; either failing
 *                aborts the other
 *   -> relay: SSE events pass through unchanged, [DONE] guaranteed; or the buffered reply
 *   -> attempt_cleanup exactly once per attempt; bookings finished exactly once per leg.
 * A failure before the first byte reached the client may be retried on other instances.
 */
#include "pdgw_fwd_sdk.h"
#include "pdgw_server_int.h"
#include "pdgw_body_splice.h"
#include "pdgw_fleet.h"

#include "pdgw_otel.h"

#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

static void wf_fail(pdgw_req_t *r, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg);
static void wf_start_attempt(pdgw_req_t *r);
static void wf_run_decode_stage(pdgw_req_t *r);
static void wf_decode_finish(pdgw_req_t *r, pdgw_leg_t *leg);
static char *wf_rewrite_reply(pdgw_req_t *r, const pdgw_leg_t *leg, size_t *len);

static const char *protocol_of(const pdgw_req_t *r)
{
    return r->w->srv->desc->name;
}

static const pdgw_fwd_ops_t *ops_of(const pdgw_req_t *r)
{
    return r->w->srv->desc->ops;
}

/* ---------------------------------------------------------------- instances */

void pdgw_instance_view_from_sched(pdgw_instance_t *v, sched_instance_t *si)
{
    const sched_instance_desc_t *d = sched_instance_desc(si);
    memset(v, 0, sizeof(*v));
    v->id = d->id ? d->id : "";
    v->url = sched_instance_url(si);
    v->host = d->host ? d->host : "";
    v->port = d->port;
    v->role = d->role == SCHED_ROLE_PREFILL  ? PDGW_FWD_ROLE_PREFILL
              : d->role == SCHED_ROLE_DECODE ? PDGW_FWD_ROLE_DECODE
                                             : PDGW_FWD_ROLE_BOTH;
    v->zone = d->zone ? d->zone : "";
    v->kv_host = d->kv_host && d->kv_host[0] ? d->kv_host : v->host;
    v->kv_port = d->kv_port;
    v->bootstrap_port = d->bootstrap_port;
    v->engine_id = d->engine_id ? d->engine_id : "";
    v->alloc_ports = d->alloc_ports;
    v->n_alloc_ports = d->n_alloc_ports;
    v->init_ports = d->init_ports;
    v->n_init_ports = d->n_init_ports;
    v->tp_size = d->tp_size > 0 ? d->tp_size : 1;
    v->dp_rank = d->dp_rank;
    v->dp_size = d->dp_size > 0 ? d->dp_size : 1;
    v->weight = (int)d->weight;
    v->kv_engine =
        d->kv_engine == SCHED_KV_ENGINE_LIBKVT ? PDGW_KV_ENGINE_LIBKVT : PDGW_KV_ENGINE_UPSTREAM;
    v->attrs = d->attrs ? d->attrs : "";
}

/* Refresh the peer views from the booking. */
static void wf_refresh_peers(pdgw_req_t *r)
{
    int k;
    r->peers.prefill = r->peers.decode = NULL;
    for (k = 0; k < 2; k++) {
        sched_instance_t *si;
        r->inst_set[k] = false;
        r->sched_inst[k] = NULL;
        if (r->booking == NULL)
            continue;
        si = sched_booking_instance(r->booking, k == 0 ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE);
        if (si == NULL)
            continue;
        pdgw_instance_view_from_sched(&r->inst_view[k], si);
        r->inst_set[k] = true;
        r->sched_inst[k] = si; /* borrowed: valid while the booking lives */
        snprintf(k == 0 ? r->prefill_id : r->decode_id, SCHED_ID_MAX, "%s", r->inst_view[k].id);
    }
    if (r->inst_set[0])
        r->peers.prefill = &r->inst_view[0];
    if (r->inst_set[1])
        r->peers.decode = &r->inst_view[1];
}

static void wf_sched_request(pdgw_req_t *r, sched_request_t *sr, const char **excl)
{
    size_t i;
    memset(sr, 0, sizeof(*sr));
    if (r->info_valid) {
        sr->text = r->info.prompt_text;
        sr->text_len = r->info.prompt_text_len;
        if (r->info.prompt_tokens && r->info.n_prompt_tokens) {
            sr->tokens = (const uint32_t *)r->info.prompt_tokens;
            sr->n_tokens = r->info.n_prompt_tokens;
        }
        sr->prompt_tokens = r->info.est_prompt_tokens > 0 && r->info.est_prompt_tokens < UINT32_MAX
                                ? (uint32_t)r->info.est_prompt_tokens
                                : 0;
        sr->max_tokens = r->info.max_tokens > 0 && r->info.max_tokens < UINT32_MAX
                             ? (uint32_t)r->info.max_tokens
                             : 0;
        sr->model = r->info.model; /* fleet hook: only instances serving the model */
    }
    sr->affinity_key = r->affinity_key; /* session affinity (pdgw_admit_req.c) */
    {
        /* route hook: the engine's token ids of a text prompt (pdgw_tokenize.c) */
        size_t n_tok = 0;
        const uint32_t *tok = pdgw_route_tokens(r, &n_tok);
        if (tok) {
            sr->tokens = tok;
            sr->n_tokens = n_tok;
            sr->prompt_tokens = n_tok < UINT32_MAX ? (uint32_t)n_tok : 0;
        }
    }
    for (i = 0; i < r->n_failed; i++)
        excl[i] = r->failed_ids[i];
    sr->exclude_ids = excl;
    sr->n_exclude_ids = r->n_failed;
}

/* Finish one booked leg exactly once. */
static void wf_finish_booking(pdgw_req_t *r, pdgw_leg_kind_t k, sched_outcome_t outcome,
                              const pdgw_leg_t *leg)
{
    sched_leg_t sl = k == PDGW_LEG_PREFILL ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE;
    sched_result_t res;
    if (r->booking == NULL || !sched_booking_leg_open(r->booking, sl))
        return;
    memset(&res, 0, sizeof(res));
    res.outcome = outcome;
    if (leg) {
        res.http_status = (int)leg->status;
        res.retry_after_ms = leg->retry_after_ms;
        res.detail = leg->errmsg[0] ? leg->errmsg : NULL;
    }
    (void)sched_booking_finish(r->booking, sl, &res);
}

/* ---------------------------------------------------------------- attempts */

static void wf_attempt_end(pdgw_req_t *r, pdgw_end_reason_t reason)
{
    int k;
    pdgw_kv_release_attempt_end(r, reason); /* route hook: no stranded prefill KV */
    for (k = 0; k < 2; k++) {
        if (r->legs[k].state == PDGW_LEG_RUNNING) {
            pdgw_leg_abort(&r->legs[k]);
            wf_finish_booking(r, (pdgw_leg_kind_t)k, SCHED_OUTCOME_CANCELLED, NULL);
        }
    }
    if (r->attempt_live) {
        r->attempt_live = false;
        if (ops_of(r)->attempt_cleanup)
            ops_of(r)->attempt_cleanup(r->fwd_ctx, r->fwd_state, &r->freq, reason);
        r->fwd_state = NULL;
        pdgw_fwd_attempt_end(&r->freq);
    }
}

void pdgw_wf_set_finished(pdgw_req_t *r)
{
    r->stage = PDGW_WF_FINISHED;
    pdgw_worker_active_remove(r->w, r);
}

/* Success of the whole request: the relay is complete. */
static void wf_succeed(pdgw_req_t *r)
{
    int k;
    for (k = 0; k < 2; k++)
        wf_finish_booking(r, (pdgw_leg_kind_t)k, SCHED_OUTCOME_SUCCESS, NULL);
    wf_attempt_end(r, PDGW_END_OK);
    pdgw_wf_set_finished(r);
}

static int dump_to_buf(const char *chunk, size_t n, void *arg)
{
    return pdgw_buf_append(arg, chunk, n) == PDGW_OK ? 0 : -1;
}

/* A leg body is about the client body's size: one exact buffer instead of jansson's doubling
 * buffer plus its final copy (three prompt-sized blocks at the peak of each dump). Members the
 * leg shares with the client body are copied from the client's bytes (pdgw_body_splice.h);
 * a body that cannot be spliced is serialised whole. */
static char *json_text(const pdgw_req_t *r, json_t *body, size_t *len)
{
    pdgw_buf_t b;
    pdgw_status_t st;

    pdgw_buf_init(&b);
    if (pdgw_buf_reserve_exact(&b, r->body.len + 256) != PDGW_OK)
        return NULL;
    st = pdgw_body_splice(r->body.data, r->body.len, r->json, body, &b);
    if (st == PDGW_ERR_INVALID) {
        b.len = 0;
        st =
            json_dump_callback(body, dump_to_buf, &b, JSON_COMPACT) == 0 ? PDGW_OK : PDGW_ERR_NOMEM;
    }
    if (st != PDGW_OK) {
        pdgw_buf_free(&b);
        return NULL;
    }
    return pdgw_buf_steal(&b, len);
}

static bool wf_build_and_start(pdgw_req_t *r, pdgw_leg_kind_t k)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    pdgw_fwd_leg_t fl;
    pdgw_fwd_error_t e;
    pdgw_leg_t *leg = &r->legs[k];
    const pdgw_instance_t *inst = k == PDGW_LEG_PREFILL ? r->peers.prefill : r->peers.decode;
    char *text;
    size_t len;
    pdgw_status_t st;

    memset(&fl, 0, sizeof(fl));
    memset(&e, 0, sizeof(e));
    if (inst == NULL) {
        pdgw_fwd_error_set(&e, k == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE, 0,
                           503, "no %s instance booked",
                           k == PDGW_LEG_PREFILL ? "prefill" : "decode");
        wf_fail(r, &e, NULL);
        return false;
    }
    if (pdgw_pd_decode_only(r))
        fl.client_body = 1; /* route hook: decode-only, the engine computes the prompt */
    else if (ops->build_leg(r->fwd_ctx, r->fwd_state, &r->freq, k, &r->peers, &fl, &e) !=
                 PDGW_FWD_OK ||
             (fl.body == NULL && !fl.client_body)) {
        json_decref(fl.body);
        if (e.message[0] == '\0')
            pdgw_fwd_error_set(&e, k == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE,
                               0, 500, "forwarder %s could not build the %s leg", protocol_of(r),
                               k == PDGW_LEG_PREFILL ? "prefill" : "decode");
        wf_fail(r, &e, NULL);
        return false;
    }
    pdgw_route_dp_header(inst, &fl); /* route hook: pin a data-parallel engine's rank */
    if (fl.body == NULL) {
        /* Plain proxying: the client's bytes as received. */
        leg->relay = k == PDGW_LEG_DECODE;
        leg->sse = leg->relay && r->info.stream;
        leg->body_borrowed = true; /* r->body outlives every leg of the request */
        st = pdgw_leg_start(leg, inst, fl.path ? fl.path : r->path, "POST", r->body.data,
                            r->body.len, &fl);
        if (st == PDGW_OK)
            return true;
        leg->body_borrowed = false;
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "cannot start upstream request: %s",
                           pdgw_strerror(st));
        wf_fail(r, &e, NULL);
        return false;
    }
    text = json_text(r, fl.body, &len);
    json_decref(fl.body);
    if (text == NULL) {
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "out of memory");
        wf_fail(r, &e, NULL);
        return false;
    }
    leg->relay = k == PDGW_LEG_DECODE;
    leg->sse = leg->relay && r->info.stream;
    st = pdgw_leg_start(leg, inst, fl.path ? fl.path : r->path, "POST", text, len, &fl);
    if (st != PDGW_OK) {
        free(text);
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "cannot start upstream request: %s",
                           pdgw_strerror(st));
        wf_fail(r, &e, NULL);
        return false;
    }
    return true;
}

/* Run the gate at <point>; true to go on now. */
static bool wf_gate(pdgw_req_t *r, pdgw_gate_point_t point)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    pdgw_fwd_error_t e;
    pdgw_fwd_status_t fs;
    if (ops->gate == NULL || pdgw_pd_decode_only(r)) /* decode-only: the forwarder has no part */
        return true;
    memset(&e, 0, sizeof(e));
    fs = ops->gate(r->fwd_ctx, r->fwd_state, &r->freq, point, &e);
    if (fs == PDGW_FWD_OK)
        return true;
    if (fs == PDGW_FWD_PENDING) {
        uint64_t now = pdgw_now_ms();
        if (r->stage != PDGW_WF_GATE || r->gate_point != point) {
            int64_t gt = r->w->srv->plan.gate_timeout_ms;
            r->gate_deadline_ms = gt > 0 ? now + (uint64_t)gt : r->deadline_ms;
            if (r->gate_deadline_ms > r->deadline_ms)
                r->gate_deadline_ms = r->deadline_ms;
        }
        r->stage = PDGW_WF_GATE;
        r->gate_point = point;
        pdgw_req_timer_update(r);
        return false;
    }
    if (e.message[0] == '\0')
        pdgw_fwd_error_set(
            &e, point == PDGW_GATE_BEFORE_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_KV_TRANSFER, 0,
            503, "forwarder %s refused the request at its gate", protocol_of(r));
    wf_fail(r, &e, NULL);
    return false;
}

static void wf_run_first_stage(pdgw_req_t *r)
{
    if (r->attempt == 0) /* queue: arrival to the first leg (booking, gate waits) */
        pdgw_gateway_metrics_observe_phase(r->w->srv->opts.metrics, protocol_of(r), "queue",
                                           (double)(pdgw_now_ms() - r->t_start_ms) / 1e3);
    switch (r->freq.dispatch) {
    case PDGW_DISPATCH_SINGLE:
        wf_run_decode_stage(r);
        return;
    case PDGW_DISPATCH_SERIAL:
        r->stage = PDGW_WF_PREFILL;
        (void)wf_build_and_start(r, PDGW_LEG_PREFILL);
        return;
    case PDGW_DISPATCH_PARALLEL:
        r->stage = PDGW_WF_DECODE;
        /* Adding a transfer only arms curl's timer: nothing is sent before this function
         * returns to the loop, so both bodies are built before either leg goes out (a
         * failure building the decode body aborts the prefill unsent). */
        if (!wf_build_and_start(r, PDGW_LEG_PREFILL))
            return;
        (void)wf_build_and_start(r, PDGW_LEG_DECODE);
        return;
    }
}

/* Book what this attempt needs up front. false when it failed (reply sent). */
static bool wf_book(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    sched_request_t sr;
    const char *excl[4];
    sched_status_t st = SCHED_OK;
    pdgw_fwd_error_t e;

    if (r->booking != NULL)
        return true; /* retry: rebooked by wf_retry */
    wf_sched_request(r, &sr, excl);
    /* route hook: selective PD (pdgw_pd_decide.c) - a short prompt goes decode-only */
    if (r->freq.dispatch != PDGW_DISPATCH_SINGLE &&
        pdgw_pd_decide_before_book(r, &sr) != PDGW_PD_RUN) {
        st = sched_book_decode(srv->opts.pool, &sr, &r->booking);
        if (st == SCHED_OK) {
            pdgw_pd_count(r, PDGW_PD_SKIP_SHORT);
            r->freq.dispatch = PDGW_DISPATCH_SINGLE;
            return true;
        }
    }
    switch (r->freq.dispatch) {
    case PDGW_DISPATCH_SINGLE:
        st = srv->plan.single_needs_prefill ? sched_book_pd(srv->opts.pool, &sr, &r->booking)
                                            : sched_book_decode(srv->opts.pool, &sr, &r->booking);
        break;
    case PDGW_DISPATCH_SERIAL:
        st = r->freq.mode == PDGW_MODE_STAGED ? sched_book_prefill(srv->opts.pool, &sr, &r->booking)
                                              : sched_book_pd(srv->opts.pool, &sr, &r->booking);
        break;
    case PDGW_DISPATCH_PARALLEL:
        st = sched_book_pd(srv->opts.pool, &sr, &r->booking);
        break;
    }
    if (st != SCHED_OK) {
        memset(&e, 0, sizeof(e));
        if (st == SCHED_ERR_NO_INSTANCE && r->n_failed == 0 &&
            sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_DECODE) > 0 &&
            (r->freq.dispatch == PDGW_DISPATCH_SINGLE ||
             sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_PREFILL) > 0)) {
            /* Instances are up but every one is at its max_concurrent: overload, 429. */
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 429,
                               "every usable instance is at its max_concurrent; retry later");
            r->reply_retry_after_s = 1;
        } else if (st == SCHED_ERR_NO_INSTANCE)
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 503, "no usable %sinstance",
                               sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_PREFILL) == 0 &&
                                       r->freq.dispatch != PDGW_DISPATCH_SINGLE
                                   ? "prefill "
                               : sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_DECODE) == 0
                                   ? "decode "
                                   : "");
        else
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 503, "cannot book an instance: %s",
                               sched_strerror(st));
        r->booking = NULL;
        wf_fail(r, &e, NULL);
        return false;
    }
    /* route hook: selective PD - the booked decode already holds most of the prompt */
    if (r->freq.dispatch != PDGW_DISPATCH_SINGLE &&
        sched_booking_leg_open(r->booking, SCHED_LEG_PREFILL) &&
        pdgw_pd_decide_after_book(r, &sr, sched_booking_instance(r->booking, SCHED_LEG_DECODE)) ==
            PDGW_PD_SKIP_CACHED) {
        sched_result_t res = {.outcome = SCHED_OUTCOME_CANCELLED};
        (void)sched_booking_finish(r->booking, SCHED_LEG_PREFILL, &res);
        pdgw_pd_count(r, PDGW_PD_SKIP_CACHED);
        r->freq.dispatch = PDGW_DISPATCH_SINGLE;
    }
    return true;
}

static void wf_start_attempt(pdgw_req_t *r)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    pdgw_fwd_error_t e;

    r->freq.attempt = r->attempt;
    r->decode_parked = false;
    if (pdgw_uuid4(r->leg_id) != PDGW_OK) {
        pdgw_fwd_error_t ue;
        pdgw_fwd_error_set(&ue, PDGW_PHASE_NONE, 0, 503, "no randomness for a transfer name");
        wf_fail(r, &ue, NULL);
        return;
    }
    r->freq.request_id = r->leg_id;
    if (!wf_book(r))
        return;
    wf_refresh_peers(r);
    memset(&e, 0, sizeof(e));
    r->fwd_state = NULL;
    if (pdgw_pd_decode_only(r)) {
        /* route hook: decode-only needs neither the forwarder's state nor its gate */
        if (r->inst_set[0]) {
            r->inst_set[0] = false;
            r->peers.prefill = NULL;
            r->prefill_id[0] = '\0';
        }
        r->stage = PDGW_WF_NONE;
        wf_run_first_stage(r);
        return;
    }
    if (pdgw_fwd_attempt_begin(r->w->srv->desc, &r->freq, &r->fwd_state) != PDGW_OK) {
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "out of memory");
        wf_fail(r, &e, NULL);
        return;
    }
    if (ops->attempt_init) {
        if (ops->attempt_init(r->fwd_ctx, &r->freq, &r->peers, &r->fwd_state, &e) != PDGW_FWD_OK) {
            if (e.message[0] == '\0')
                pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "forwarder %s: attempt_init",
                                   protocol_of(r));
            pdgw_fwd_attempt_end(&r->freq);
            wf_fail(r, &e, NULL);
            return;
        }
    }
    r->attempt_live = true;
    r->stage = PDGW_WF_NONE;
    if (!wf_gate(r, PDGW_GATE_BEFORE_PREFILL))
        return;
    wf_run_first_stage(r);
}

void pdgw_wf_start(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    if (r->route == PDGW_ROUTE_MODELS) {
        pdgw_models_start(r);
        return;
    }
    memset(&r->freq, 0, sizeof(r->freq));
    r->freq.client_request_id = r->id;
    r->freq.path = r->path;
    r->freq.body = r->json;
    r->freq.stream = r->info.stream;
    r->freq.is_chat = r->kind == PDGW_API_CHAT_COMPLETIONS;
    r->freq.mode = srv->opts.mode;
    r->freq.dispatch = srv->plan.dispatch;
    r->freq.deadline_ms = (int64_t)r->deadline_ms;
    r->freq.model = r->info.model ? r->info.model : "";
    r->freq.prompt_tokens = r->info.est_prompt_tokens;
    r->freq.max_tokens = r->info.max_tokens;
    if (r->waker == NULL) /* admission may have made it */
        r->waker = pdgw_waker_create(r->w, r);
    r->freq.waker = r->waker;
    r->stage = PDGW_WF_NONE;
    pdgw_worker_active_add(r->w, r);
    if (pdgw_tokenize_begin(r)) /* route hook: resumed by pdgw_wf_start_attempt */
        return;
    wf_start_attempt(r);
}

void pdgw_wf_start_attempt(pdgw_req_t *r)
{
    wf_start_attempt(r);
}

/* ---------------------------------------------------------------- stages */

static void wf_run_decode_stage(pdgw_req_t *r)
{
    r->stage = PDGW_WF_DECODE;
    (void)wf_build_and_start(r, PDGW_LEG_DECODE);
}

/* Serial: prefill answered 2xx. */
static void wf_after_prefill(pdgw_req_t *r, pdgw_leg_t *leg)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    pdgw_fwd_error_t e;
    json_t *resp;

    memset(&e, 0, sizeof(e));
    resp = json_loadb(leg->resp.data ? leg->resp.data : "", leg->resp.len, 0, NULL);
    if (ops->on_prefill_response &&
        ops->on_prefill_response(r->fwd_ctx, r->fwd_state, &r->freq, leg->status, resp, &e) !=
            PDGW_FWD_OK) {
        json_decref(resp);
        if (e.message[0] == '\0')
            pdgw_fwd_error_set(&e, PDGW_PHASE_KV_TRANSFER, 1, 502,
                               "forwarder %s rejected the prefill response", protocol_of(r));
        wf_fail(r, &e, NULL);
        return;
    }
    json_decref(resp);
    if (r->freq.dispatch == PDGW_DISPATCH_PARALLEL) {
        /* decode is already running, or its answer waited for this one */
        if (r->decode_parked) {
            r->decode_parked = false;
            wf_decode_finish(r, &r->legs[PDGW_LEG_DECODE]);
        }
        return;
    }
    if (r->freq.mode == PDGW_MODE_STAGED && !sched_booking_leg_open(r->booking, SCHED_LEG_DECODE) &&
        sched_booking_instance(r->booking, SCHED_LEG_DECODE) == NULL) {
        sched_status_t st = sched_booking_book_decode(r->booking);
        if (st != SCHED_OK) {
            pdgw_fwd_error_set(&e, PDGW_PHASE_DECODE, 0, 503, "no usable decode instance: %s",
                               sched_strerror(st));
            wf_fail(r, &e, NULL);
            return;
        }
        wf_refresh_peers(r);
    }
    if (!wf_gate(r, PDGW_GATE_BEFORE_DECODE))
        return;
    wf_run_decode_stage(r);
}

static void wf_add_failed(pdgw_req_t *r, const char *id)
{
    size_t i;
    for (i = 0; i < r->n_failed; i++)
        if (strcmp(r->failed_ids[i], id) == 0)
            return;
    if (r->n_failed < 4)
        snprintf(r->failed_ids[r->n_failed++], SCHED_ID_MAX, "%s", id);
}

/* Error from a leg that failed (transport or status). */
static void wf_leg_error(pdgw_req_t *r, pdgw_leg_t *leg, pdgw_fwd_error_t *e)
{
    pdgw_phase_t phase = leg->kind == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE;
    int status = 502;
    int retryable = 0;
    switch (leg->err) {
    case PDGW_LEGERR_CONNECT:
        retryable = 1;
        break;
    case PDGW_LEGERR_TIMEOUT:
        status = 504;
        break;
    case PDGW_LEGERR_STATUS:
        if (leg->status == 429 || leg->status == 503) {
            retryable = 1;
            status = (int)leg->status;
        } else if (leg->status >= 500) {
            retryable = 1;
        } else {
            status = (int)leg->status; /* the engine's own verdict on the request */
        }
        break;
    case PDGW_LEGERR_RESET:
        retryable = 1;
        break;
    case PDGW_LEGERR_LOCAL:
        /* Another instance would not help: the shortage is ours. 503 + Retry-After. */
        status = 503;
        r->reply_retry_after_s = 1;
        break;
    default:
        break;
    }
    pdgw_fwd_error_set(e, phase, retryable, status, "%s",
                       leg->errmsg[0] ? leg->errmsg : "upstream failed");
}

/* The gateway itself ran short (descriptors, memory): counted as its own trouble and
 * logged at most once a second, since it comes in storms. */
static void wf_note_local_shortage(pdgw_req_t *r, const pdgw_leg_t *leg)
{
    static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
    uint64_t skipped = 0;
    pdgw_gateway_metrics_local_resource_error(r->w->srv->opts.metrics,
                                              leg->os_errno ? "fd" : "memory");
    if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
        pdgw_log_warn("upstream", "req=%s %s (%llu similar suppressed)", r->id, leg->errmsg,
                      (unsigned long long)skipped);
}

/* The relayed decode leg completed: hand its answer to the client. */
static void wf_decode_finish(pdgw_req_t *r, pdgw_leg_t *leg)
{
    if (leg->sse) {
        if (!r->committed) {
            /* 200 but not one event: still a valid (empty) stream. */
            pdgw_req_commit_stream(r);
        }
        if (!leg->saw_done)
            pdgw_req_out_append(r, "data: [DONE]\n\n", 14);
        pdgw_req_out_end(r);
    } else {
        size_t len = 0;
        char *body = wf_rewrite_reply(r, leg, &len);
        if (body == NULL)
            body = pdgw_buf_steal(&leg->resp, &len);
        if (body != NULL)
            r->usage_seen |=
                pdgw_gateway_metrics_usage(r->w->srv->opts.metrics, protocol_of(r), body, len,
                                           &r->usage_prompt, &r->usage_completion);
        pdgw_req_reply(r, (int)leg->status, body, body ? len : 0,
                       leg->content_type[0] ? leg->content_type : "application/json");
    }
    if (r->freq.dispatch == PDGW_DISPATCH_PARALLEL &&
        r->legs[PDGW_LEG_PREFILL].state == PDGW_LEG_RUNNING) {
        /* The drained prefill is of no use any more. */
        pdgw_leg_abort(&r->legs[PDGW_LEG_PREFILL]);
        wf_finish_booking(r, PDGW_LEG_PREFILL, SCHED_OUTCOME_SUCCESS, NULL);
    }
    wf_succeed(r);
}

/* Parallel: does the forwarder want the prefill's answer before the decode's goes out (asked
 * with a NULL response), and is the prefill still running? */
static bool wf_decode_waits(pdgw_req_t *r)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    json_t *wants;
    if (ops->rewrite_decode == NULL || pdgw_pd_decode_only(r) ||
        r->freq.dispatch != PDGW_DISPATCH_PARALLEL ||
        r->legs[PDGW_LEG_PREFILL].state != PDGW_LEG_RUNNING)
        return false;
    wants = ops->rewrite_decode(r->fwd_ctx, r->fwd_state, &r->freq, 0, NULL);
    json_decref(wants);
    return wants != NULL;
}

/* A leg ended (success or error). */
static void wf_leg_done(pdgw_leg_t *leg)
{
    pdgw_req_t *r = leg->req;
    pdgw_fwd_error_t e;
    uint64_t dur_us = (leg->t_end_ms - leg->t_start_ms) * 1000u;

    if (leg->raw) { /* fleet hook: pass-through */
        pdgw_pt_leg_done(r, leg);
        return;
    }
    if (leg->kind == PDGW_LEG_PREFILL)
        r->t_prefill_us = dur_us;
    else
        r->t_decode_us = dur_us;
    if (r->stage == PDGW_WF_FINISHED)
        return;
    if (leg->err == PDGW_LEGERR_LOCAL)
        wf_note_local_shortage(r, leg);
    if (leg->err != PDGW_LEGERR_NONE) {
        if (leg->err != PDGW_LEGERR_LOCAL)
            pdgw_gateway_metrics_upstream_error(r->w->srv->opts.metrics, protocol_of(r),
                                                leg->inst->id, pdgw_leg_err_name(leg->err));
        memset(&e, 0, sizeof(e));
        wf_leg_error(r, leg, &e);
        wf_fail(r, &e, leg);
        return;
    }
    if (leg->kind == PDGW_LEG_PREFILL) {
        wf_finish_booking(r, PDGW_LEG_PREFILL, SCHED_OUTCOME_SUCCESS, leg);
        r->t_prefill_done_ms = leg->t_end_ms;
        pdgw_gateway_metrics_observe_phase(r->w->srv->opts.metrics, protocol_of(r), "prefill",
                                           (double)dur_us / 1e6);
        pdgw_gateway_metrics_observe_prefill(r->w->srv->opts.metrics, protocol_of(r),
                                             (double)dur_us / 1e6);
        wf_after_prefill(r, leg);
        return;
    }
    /* Decode (relayed) leg completed. */
    pdgw_gateway_metrics_observe_phase(r->w->srv->opts.metrics, protocol_of(r), "decode",
                                       (double)dur_us / 1e6);
    pdgw_gateway_metrics_observe_decode(r->w->srv->opts.metrics, protocol_of(r),
                                        (double)dur_us / 1e6);
    if (!leg->sse && r->t_prefill_done_ms && !r->kv_wait_observed) {
        /* Non-stream: the KV wait ends with the decode leg's first byte. */
        r->kv_wait_observed = true;
        if (leg->t_first_ms >= r->t_prefill_done_ms)
            pdgw_gateway_metrics_observe_kv_wait(r->w->srv->opts.metrics, protocol_of(r),
                                                 (double)(leg->t_first_ms - r->t_prefill_done_ms) /
                                                     1e3);
    }
    if (!leg->sse && wf_decode_waits(r)) {
        r->decode_parked = true; /* finished by wf_after_prefill */
        return;
    }
    wf_decode_finish(r, leg);
}

/* ---------------------------------------------------------------- failure and retry */

static unsigned default_scope(const pdgw_fwd_error_t *e)
{
    switch (e->phase) {
    case PDGW_PHASE_PREFILL:
        return PDGW_REPICK_PREFILL;
    case PDGW_PHASE_DECODE:
        return PDGW_REPICK_DECODE;
    default:
        return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
    }
}

/* Try another attempt; true when one was started. */
/* A serial request whose decode failed after its prefill answered may keep that prefill:
 * its result (e.g. vllm-nixl's kv_transfer_params) stays valid on the prefill until a decode
 * reads it or it expires, and the forwarder's retry_scope said so by re-picking the decode
 * only. Not when the failed decode reached a vLLM engine: that one has had the prefill free
 * the blocks (pdgw_kv_still_held), so the prefill runs again. */
static bool wf_can_keep_prefill(const pdgw_req_t *r, unsigned scope, const pdgw_leg_t *failed_leg)
{
    const pdgw_leg_t *p = &r->legs[PDGW_LEG_PREFILL];
    return scope == PDGW_REPICK_DECODE && r->freq.dispatch == PDGW_DISPATCH_SERIAL &&
           failed_leg != NULL && failed_leg->kind == PDGW_LEG_DECODE && p->state == PDGW_LEG_DONE &&
           p->err == PDGW_LEGERR_NONE && pdgw_kv_still_held(r, failed_leg);
}

/* Run the decode stage again for the kept prefill (after a backoff, or at once). */
static void wf_resume_decode(pdgw_req_t *r)
{
    wf_refresh_peers(r);
    if (wf_gate(r, PDGW_GATE_BEFORE_DECODE))
        wf_run_decode_stage(r);
}

/* Retry with a new decode inside the same attempt: no new prefill leg, the forwarder's
 * state (what the prefill returned) carries over, the decode leg is built again for the
 * newly booked decode. false when no other decode can be booked, or when a decode's
 * 429/503 asks for a backoff that does not fit before the deadline. */
static bool wf_retry_decode_keep_prefill(pdgw_req_t *r, const pdgw_fwd_error_t *e,
                                         pdgw_leg_t *failed_leg)
{
    pdgw_server_t *srv = r->w->srv;
    uint64_t delay_ms = 0;
    /* A decode's 429/503 is overload: the same backoff (exponential, jitter, Retry-After,
     * deadline) as any other retry, so an overloaded fleet is not hit again at once. */
    if (!pdgw_admit_retry_delay(r, failed_leg, &delay_ms))
        return false;
    wf_finish_booking(r, PDGW_LEG_DECODE, pdgw_leg_outcome(failed_leg), failed_leg);
    wf_add_failed(r, failed_leg->inst->id);
    if (sched_booking_rebook(r->booking, SCHED_LEG_DECODE) != SCHED_OK)
        return false; /* nothing left: the caller reports the original failure */
    r->attempt++;
    r->freq.attempt = r->attempt;
    pdgw_gateway_metrics_retry(srv->opts.metrics, protocol_of(r));
    pdgw_log_info("workflow", "req=%s retry %u with a new decode, keeping the prefill: %s", r->id,
                  r->attempt, e->message);
    pdgw_leg_release(&r->legs[PDGW_LEG_DECODE]);
    pdgw_leg_init(&r->legs[PDGW_LEG_DECODE], r, PDGW_LEG_DECODE, &pdgw_wf_leg_owner);
    if (delay_ms > 0) {
        /* The deadline scan resumes the decode when the backoff is over. */
        pdgw_log_debug("workflow", "req=%s backing off %llu ms before decode retry %u", r->id,
                       (unsigned long long)delay_ms, r->attempt);
        r->retry_at_ms = pdgw_now_ms() + delay_ms;
        r->retry_decode_only = true;
        r->stage = PDGW_WF_WAIT;
        pdgw_req_timer_update(r);
        return true;
    }
    wf_resume_decode(r);
    return true;
}

static bool wf_retry(pdgw_req_t *r, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg)
{
    pdgw_server_t *srv = r->w->srv;
    unsigned scope;
    int k;
    bool overload, fresh;
    uint64_t delay_ms = 0;

    if (r->passthrough || !e->retryable || r->committed || r->attempt >= r->max_retries ||
        r->booking == NULL || pdgw_now_ms() >= r->deadline_ms || r->client_gone)
        return false;
    scope = ops_of(r)->retry_scope ? ops_of(r)->retry_scope(r->fwd_ctx, r->fwd_state, &r->freq, e)
                                   : default_scope(e);
    if (r->freq.dispatch == PDGW_DISPATCH_SINGLE && !srv->plan.single_needs_prefill)
        scope &= PDGW_REPICK_DECODE;
    if (scope == PDGW_REPICK_NONE)
        return false;
    if (wf_can_keep_prefill(r, scope, failed_leg))
        return wf_retry_decode_keep_prefill(r, e, failed_leg);
    /* An engine's 429/503 is overload, not failure: back off (pdgw_admit_req.c), then book
     * afresh, the same instance allowed (it may be the only one). */
    overload = failed_leg != NULL && failed_leg->err == PDGW_LEGERR_STATUS &&
               (failed_leg->status == 429 || failed_leg->status == 503);
    if (overload && !pdgw_admit_retry_delay(r, failed_leg, &delay_ms))
        return false; /* no retry fits before the deadline */
    /* Book afresh (the same prefill allowed, the failed decode not) when overloaded, or when
     * the decode that failed after a serial prefill had the prefill's KV freed: that prefill
     * must run again (pdgw_kv_still_held). */
    fresh = overload || (failed_leg != NULL && failed_leg->kind == PDGW_LEG_DECODE &&
                         r->freq.dispatch == PDGW_DISPATCH_SERIAL &&
                         r->legs[PDGW_LEG_PREFILL].state == PDGW_LEG_DONE &&
                         !pdgw_kv_still_held(r, failed_leg));
    /* Close this attempt: failed leg with its outcome, the rest cancelled. */
    if (failed_leg) {
        wf_finish_booking(r, failed_leg->kind, pdgw_leg_outcome(failed_leg), failed_leg);
        if (!overload)
            wf_add_failed(r, failed_leg->inst->id);
    }
    wf_attempt_end(r, PDGW_END_RETRY);
    if (fresh)
        sched_booking_destroy(&r->booking);
    for (k = 0; k < 2 && r->booking != NULL; k++) {
        sched_leg_t sl = k == 0 ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE;
        unsigned bit = k == 0 ? PDGW_REPICK_PREFILL : PDGW_REPICK_DECODE;
        if (!(scope & bit) || sched_booking_instance(r->booking, sl) == NULL)
            continue;
        wf_finish_booking(r, (pdgw_leg_kind_t)k, SCHED_OUTCOME_CANCELLED, NULL);
        if (sched_booking_rebook(r->booking, sl) != SCHED_OK)
            return false; /* nothing left: the caller reports the original failure */
    }
    r->attempt++;
    pdgw_gateway_metrics_retry(srv->opts.metrics, protocol_of(r));
    pdgw_log_info("workflow", "req=%s retry %u after %s failure: %s", r->id, r->attempt,
                  pdgw_phase_name(e->phase), e->message);
    for (k = 0; k < 2; k++) {
        pdgw_leg_release(&r->legs[k]);
        pdgw_leg_init(&r->legs[k], r, (pdgw_leg_kind_t)k, &pdgw_wf_leg_owner);
    }
    if (delay_ms > 0) {
        /* The deadline scan starts the attempt when the backoff is over. */
        pdgw_log_debug("workflow", "req=%s backing off %llu ms before retry %u", r->id,
                       (unsigned long long)delay_ms, r->attempt);
        r->retry_at_ms = pdgw_now_ms() + delay_ms;
        r->stage = PDGW_WF_WAIT;
        pdgw_req_timer_update(r); /* the backoff's end is the request's next deadline */
        return true;
    }
    wf_start_attempt(r);
    return true;
}

/* The stream to the client already started (200 and some bytes are out): the failure ends
 * it with one error event in our own words, saying which instance did what after how many
 * bytes, and that the client cannot simply be retried for it (it got part of an answer).
 * It is counted and logged with the failure's status, not the 200 on the wire. */
static void wf_fail_midstream(pdgw_req_t *r, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg,
                              int status)
{
    pdgw_api_error_t api;
    char msg[PDGW_API_ERR_MESSAGE_MAX];
    size_t len;
    char *ev;

    if (failed_leg != NULL && failed_leg->inst != NULL) {
        const char *what = failed_leg->kind == PDGW_LEG_PREFILL ? "prefill" : "decode";
        unsigned long long n = (unsigned long long)failed_leg->bytes_in;
        switch (failed_leg->err) {
        case PDGW_LEGERR_TIMEOUT:
            if (failed_leg->t_first_ms == 0)
                snprintf(msg, sizeof(msg), "%s instance %s sent no response in time", what,
                         failed_leg->inst->id);
            else
                snprintf(msg, sizeof(msg), "%s instance %s went silent after %llu bytes", what,
                         failed_leg->inst->id, n);
            break;
        case PDGW_LEGERR_CONNECT:
            snprintf(msg, sizeof(msg), "%s instance %s could not be reached", what,
                     failed_leg->inst->id);
            break;
        case PDGW_LEGERR_STATUS:
            snprintf(msg, sizeof(msg), "%s instance %s answered HTTP %ld", what,
                     failed_leg->inst->id, failed_leg->status);
            break;
        case PDGW_LEGERR_LOCAL:
            snprintf(msg, sizeof(msg), "the gateway ran out of resources for the %s leg", what);
            break;
        case PDGW_LEGERR_PROTOCOL:
            snprintf(msg, sizeof(msg), "%s instance %s sent a malformed stream after %llu bytes",
                     what, failed_leg->inst->id, n);
            break;
        default:
            snprintf(msg, sizeof(msg), "%s instance %s closed the stream after %llu bytes", what,
                     failed_leg->inst->id, n);
            break;
        }
    } else {
        snprintf(msg, sizeof(msg), "%s after %llu bytes of the response were sent", e->message,
                 (unsigned long long)(r->bytes_out + pdgw_req_out_pending(r)));
    }
    snprintf(r->error_text, sizeof(r->error_text), "%s: %s (stream interrupted)",
             pdgw_phase_name(e->phase), msg);
    pdgw_log_info("workflow", "req=%s stream interrupted: %s (%s)", r->id, msg, e->message);
    pdgw_api_error_set(&api, pdgw_api_err_kind_from_http(status), NULL, "%s", msg);
    if (e->phase != PDGW_PHASE_NONE && !r->passthrough &&
        (r->freq.dispatch != PDGW_DISPATCH_SINGLE || r->w->srv->plan.single_needs_prefill)) {
        char type[48];
        r->pd_phase = e->phase;
        snprintf(type, sizeof(type), "pd_%s_error", pdgw_phase_name(e->phase));
        pdgw_api_error_set_type(&api, type);
        pdgw_gateway_metrics_pd_failure(r->w->srv->opts.metrics, protocol_of(r),
                                        pdgw_phase_name(e->phase));
    }
    r->pd_retryable = 0;
    pdgw_api_error_set_code(&api, "stream_interrupted_not_retryable");
    r->final_status = status;
    ev = pdgw_api_error_sse(&api, 1, &len);
    if (ev) {
        pdgw_req_out_append(r, ev, len);
        free(ev);
    }
    pdgw_req_out_end(r);
}

static void wf_fail(pdgw_req_t *r, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg)
{
    pdgw_api_error_t api;
    int status;

    if (r->stage == PDGW_WF_FINISHED)
        return;
    if (wf_retry(r, e, failed_leg))
        return;
    snprintf(r->error_text, sizeof(r->error_text), "%s: %s", pdgw_phase_name(e->phase), e->message);
    /* Stop everything; finish bookings with what happened. */
    if (failed_leg)
        wf_finish_booking(r, failed_leg->kind, pdgw_leg_outcome(failed_leg), failed_leg);
    wf_attempt_end(r, e->http_status == 504 ? PDGW_END_TIMEOUT : PDGW_END_FAILED);
    pdgw_wf_set_finished(r);

    status = e->http_status ? e->http_status : 502;
    if (r->committed) {
        wf_fail_midstream(r, e, failed_leg, status);
        return;
    }
    pdgw_api_error_set(&api, pdgw_api_err_kind_from_http(status), NULL, "%s", e->message);
    if (status == 504)
        pdgw_api_error_set_code(&api, "upstream_timeout");
    /* PD protocols tag the failure with its phase; a plain proxy keeps OpenAI's types. */
    if (e->phase != PDGW_PHASE_NONE && !r->passthrough &&
        (r->freq.dispatch != PDGW_DISPATCH_SINGLE || r->w->srv->plan.single_needs_prefill)) {
        char type[48];
        r->pd_phase = e->phase;
        r->pd_retryable = e->retryable ? 1 : 0;
        snprintf(type, sizeof(type), "pd_%s_error", pdgw_phase_name(e->phase));
        pdgw_api_error_set_type(&api, type);
        pdgw_api_error_set_code(&api, e->retryable ? "retryable" : "not_retryable");
        pdgw_gateway_metrics_pd_failure(r->w->srv->opts.metrics, protocol_of(r),
                                        pdgw_phase_name(e->phase));
    }
    /* An engine's Retry-After (429/503 not retried) reaches the client too. */
    if (failed_leg && failed_leg->err == PDGW_LEGERR_STATUS && failed_leg->retry_after_ms > 0 &&
        r->reply_retry_after_s == 0)
        r->reply_retry_after_s = (unsigned)((failed_leg->retry_after_ms + 999) / 1000);
    /* An upstream 4xx is the engine's verdict on the request: relay it as is. */
    if (failed_leg && failed_leg->err == PDGW_LEGERR_STATUS && failed_leg->status >= 400 &&
        failed_leg->status < 500 && failed_leg->resp.len > 0) {
        size_t len;
        char *body = pdgw_buf_steal(&failed_leg->resp, &len);
        pdgw_req_reply(r, (int)failed_leg->status, body, len,
                       failed_leg->content_type[0] ? failed_leg->content_type : "application/json");
        return;
    }
    {
        size_t len;
        char *body = pdgw_api_error_body(&api, &len);
        pdgw_req_reply(r, status, body, body ? len : 0, "application/json");
    }
}

/* ---------------------------------------------------------------- relay */

/* Does this event carry generated output (text, content, reasoning or a tool call; not only a
 * role delta, usage or an error)? Only called until the first such event of a stream, so the
 * parse is paid once or twice. */
static bool event_has_content(const pdgw_sse_event_t *ev)
{
    json_t *o = json_loadb(ev->data, ev->data_len, 0, NULL);
    json_t *choices, *ch;
    size_t i;
    bool found = false;
    if (o == NULL)
        return false;
    choices = json_object_get(o, "choices");
    json_array_foreach(choices, i, ch)
    {
        const json_t *delta = json_object_get(ch, "delta");
        const char *text = json_string_value(json_object_get(ch, "text"));
        const char *content = json_string_value(json_object_get(delta, "content"));
        const char *reasoning = json_string_value(json_object_get(delta, "reasoning_content"));
        if ((text && text[0]) || (content && content[0]) || (reasoning && reasoning[0]) ||
            json_array_size(json_object_get(delta, "tool_calls")) > 0) {
            found = true;
            break;
        }
    }
    json_decref(o);
    return found;
}

/* The forwarder's rewrite of one decode event: true when it replaced the event (the new
 * events were appended), false to pass the original through. */
static bool wf_rewrite_event(pdgw_req_t *r, const pdgw_sse_event_t *ev)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    json_t *in, *out, *item;
    size_t i;
    if (ops->rewrite_decode == NULL || pdgw_pd_decode_only(r) || ev->is_done || !ev->has_data)
        return false;
    in = json_loadb(ev->data, ev->data_len, 0, NULL);
    if (in == NULL)
        return false;
    out = ops->rewrite_decode(r->fwd_ctx, r->fwd_state, &r->freq, 1, in);
    json_decref(in);
    if (out == NULL)
        return false;
    json_array_foreach(out, i, item)
    {
        char *s = json_dumps(item, JSON_COMPACT);
        if (s == NULL)
            continue;
        pdgw_req_out_append(r, "data: ", 6);
        pdgw_req_out_append(r, s, strlen(s));
        pdgw_req_out_append(r, "\n\n", 2);
        free(s);
    }
    json_decref(out);
    return true;
}

/* The forwarder's rewrite of a non-stream decode answer (new body or NULL). */
static char *wf_rewrite_reply(pdgw_req_t *r, const pdgw_leg_t *leg, size_t *len)
{
    const pdgw_fwd_ops_t *ops = ops_of(r);
    json_t *in, *out;
    char *s;
    if (ops->rewrite_decode == NULL || pdgw_pd_decode_only(r) || leg->status < 200 ||
        leg->status >= 300)
        return NULL;
    in = json_loadb(leg->resp.data ? leg->resp.data : "", leg->resp.len, 0, NULL);
    if (in == NULL)
        return NULL;
    out = ops->rewrite_decode(r->fwd_ctx, r->fwd_state, &r->freq, 0, in);
    json_decref(in);
    if (out == NULL)
        return NULL;
    s = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (s != NULL)
        *len = strlen(s);
    return s;
}

/* Relay: one SSE event of the decode leg (from the leg's parser). Non-zero stops the leg. */
static int wf_relay_event(pdgw_leg_t *leg, const pdgw_sse_event_t *ev)
{
    pdgw_req_t *r = leg->req;
    uint64_t now_ns = pdgw_time_mono_ns();
    uint64_t now = now_ns / 1000000u;
    if (r->stage == PDGW_WF_FINISHED)
        return 1;
    if (ev->is_done) {
        if (leg->saw_done)
            return 0; /* one [DONE] only */
        leg->saw_done = true;
    } else if (ev->has_data) {
        if (r->t_prefill_done_ms && !r->kv_wait_observed && now >= r->t_prefill_done_ms) {
            /* From the prefill's end to the first relayed decode event. */
            r->kv_wait_observed = true;
            pdgw_gateway_metrics_observe_kv_wait(r->w->srv->opts.metrics, protocol_of(r),
                                                 (double)(now - r->t_prefill_done_ms) / 1e3);
        }
        if (r->t_first_token_ns == 0) {
            /* TTFT: the first event with generated text (chat starts with a role delta). */
            if (event_has_content(ev)) {
                r->t_first_token_ns = now_ns;
                r->t_last_token_ns = now_ns;
                pdgw_gateway_metrics_observe_ttft(r->w->srv->opts.metrics, protocol_of(r),
                                                  (double)(now_ns - r->t_start_ns) / 1e9);
            }
        } else {
            /* TPOT: every later data event is a step of the generation. */
            pdgw_gateway_metrics_observe_tpot(r->w->srv->opts.metrics, protocol_of(r),
                                              (double)(now_ns - r->t_last_token_ns) / 1e9);
            r->t_last_token_ns = now_ns;
        }
    }
    if (ev->has_data && !ev->is_done)
        r->usage_seen |=
            pdgw_gateway_metrics_usage(r->w->srv->opts.metrics, protocol_of(r), ev->data,
                                       ev->data_len, &r->usage_prompt, &r->usage_completion);
    /* Pass the event through byte for byte, unless the forwarder rewrites decode answers. */
    if (!wf_rewrite_event(r, ev))
        pdgw_req_out_append(r, ev->raw, ev->raw_len);
    if (!r->committed)
        pdgw_req_commit_stream(r);
    return 0;
}

/* ---------------------------------------------------------------- tracing */

/* The spans of a finished request (pdgw_otel.h). Leg times are in ms, the request's in ns. */
static void wf_trace(pdgw_req_t *r, int status, uint64_t now_ns)
{
    const pdgw_leg_t *p = &r->legs[PDGW_LEG_PREFILL], *d = &r->legs[PDGW_LEG_DECODE];
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
    t.protocol = protocol_of(r);
    t.model = r->info_valid ? r->info.model : NULL;
    t.prefill_instance = r->prefill_id[0] ? r->prefill_id : NULL;
    t.decode_instance = r->decode_id[0] ? r->decode_id : NULL;
    t.request_id = r->id;
    t.failure_phase = r->pd_phase != PDGW_PHASE_NONE ? pdgw_phase_name(r->pd_phase) : NULL;
    t.error = r->error_text[0] ? r->error_text : NULL;
    t.status = status;
    t.retries = r->attempt;
    t.stream = r->info_valid && r->info.stream;
    t.prompt_tokens = r->usage_seen ? r->usage_prompt : -1;
    t.completion_tokens = r->usage_seen ? r->usage_completion : -1;
    t.start_ns = r->t_start_ns;
    t.end_ns = now_ns;
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
    if (r->attempt > 0)
        t.first_leg_ns = 0; /* the queue phase of the first attempt is not known any more */
    if (!t.prefill_end_ns)
        t.decode_first_ns = 0; /* no KV wait without a prefill */
    pdgw_otel_record(r->w->srv->opts.otel, &t);
}

/* ---------------------------------------------------------------- deadlines, wake, end */

void pdgw_wf_check_deadlines(pdgw_req_t *r, uint64_t now)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_fwd_error_t e;
    int k;

    if (pdgw_kv_release_check_deadline(r, now)) /* route hook: a release's owner */
        return;
    if (r->stage == PDGW_WF_FINISHED)
        return;
    if (r->n_mlegs) {
        pdgw_models_check_deadlines(r, now);
        return;
    }
    if (r->stage == PDGW_WF_WAIT) {
        /* Waiting for admission or for a retry's backoff (pdgw_admit_req.c). */
        if (pdgw_admit_req_check(r, now))
            return;
        if (now >= r->retry_at_ms) {
            r->retry_at_ms = 0;
            if (r->retry_decode_only) {
                r->retry_decode_only = false;
                wf_resume_decode(r);
            } else {
                wf_start_attempt(r);
            }
        }
        return;
    }
    if (r->pt) { /* fleet hook: pass-through */
        pdgw_pt_check_deadlines(r, now);
        return;
    }
    if (pdgw_tokenize_check_deadline(r, now)) /* route hook: waiting for the tokens */
        return;
    memset(&e, 0, sizeof(e));
    if (now >= r->deadline_ms) {
        pdgw_fwd_error_set(&e,
                           r->stage == PDGW_WF_PREFILL ? PDGW_PHASE_PREFILL
                           : r->stage == PDGW_WF_GATE  ? PDGW_PHASE_KV_TRANSFER
                                                       : PDGW_PHASE_DECODE,
                           0, 504, "request deadline passed");
        wf_fail(r, &e, NULL);
        return;
    }
    if (r->stage == PDGW_WF_GATE) {
        if (now >= r->gate_deadline_ms) {
            pdgw_fwd_error_set(
                &e, PDGW_PHASE_KV_TRANSFER, 0, 504, "timed out waiting for the %s gate of %s",
                r->gate_point == PDGW_GATE_BEFORE_PREFILL ? "prefill" : "decode", protocol_of(r));
            wf_fail(r, &e, NULL);
        }
        return;
    }
    for (k = 0; k < 2; k++) {
        pdgw_leg_t *leg = &r->legs[k];
        uint64_t limit;
        if (leg->state != PDGW_LEG_RUNNING || leg->paused)
            continue;
        if (leg->t_first_ms == 0) {
            limit = srv->opts.first_byte_timeout_ms;
            if (limit && now >= leg->t_start_ms + limit) {
                snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: no response within %llu ms",
                         leg->inst->id, (unsigned long long)limit);
            } else {
                continue;
            }
        } else {
            limit = srv->opts.idle_timeout_ms;
            if (limit && now >= leg->t_last_ms + limit) {
                snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: idle for %llu ms", leg->inst->id,
                         (unsigned long long)limit);
            } else {
                continue;
            }
        }
        leg->err = PDGW_LEGERR_TIMEOUT;
        pdgw_leg_abort(leg);
        pdgw_gateway_metrics_upstream_error(srv->opts.metrics, protocol_of(r), leg->inst->id,
                                            "timeout");
        wf_leg_error(r, leg, &e);
        wf_fail(r, &e, leg);
        return;
    }
}

uint64_t pdgw_wf_next_deadline(const pdgw_req_t *r)
{
    const pdgw_server_opts_t *o = &r->w->srv->opts;
    uint64_t due = UINT64_MAX;
    int k;

    if (r->stage == PDGW_WF_WAIT) /* admission queue or retry backoff (pdgw_admit_req.c) */
        return r->admit_waiting ? r->admit.deadline_ms : r->retry_at_ms;
    if (r->rt != NULL && r->rt->release) /* route: a KV release's owner, one deadline */
        return r->rt->leg && r->rt->leg->state == PDGW_LEG_RUNNING ? r->rt->t_deadline_ms
                                                                   : UINT64_MAX;
    if (r->stage == PDGW_WF_FINISHED)
        return UINT64_MAX;
    if (r->n_mlegs)
        return pdgw_models_next_deadline(r);
    if (r->rt != NULL && r->rt->leg != NULL && r->rt->leg->state == PDGW_LEG_RUNNING)
        return r->rt->t_deadline_ms; /* route: waiting for the prompt's tokens */
    due = r->deadline_ms;
    if (r->stage == PDGW_WF_GATE)
        return r->gate_deadline_ms < due ? r->gate_deadline_ms : due;
    for (k = 0; k < 2; k++) {
        const pdgw_leg_t *leg = &r->legs[k];
        uint64_t t;
        if (leg->state != PDGW_LEG_RUNNING || leg->paused)
            continue;
        if (leg->t_first_ms == 0) {
            if (o->first_byte_timeout_ms == 0)
                continue;
            t = leg->t_start_ms + o->first_byte_timeout_ms;
        } else {
            if (o->idle_timeout_ms == 0)
                continue;
            t = leg->t_last_ms + o->idle_timeout_ms;
        }
        if (t < due)
            due = t;
    }
    return due;
}

void pdgw_wf_on_wake(pdgw_req_t *r)
{
    pdgw_gate_point_t point = r->gate_point;
    if (pdgw_admit_req_on_wake(r)) /* admission granted (pdgw_admit_req.c) */
        return;
    if (r->stage != PDGW_WF_GATE)
        return;
    if (!wf_gate(r, point))
        return;
    if (point == PDGW_GATE_BEFORE_PREFILL)
        wf_run_first_stage(r);
    else
        wf_run_decode_stage(r);
}

void pdgw_wf_cancel(pdgw_req_t *r)
{
    if (r->stage == PDGW_WF_FINISHED || r->stage == PDGW_WF_NONE) {
        if (r->attempt_live)
            wf_attempt_end(r, PDGW_END_CANCELLED);
        pdgw_wf_set_finished(r);
        return;
    }
    snprintf(r->error_text, sizeof(r->error_text), "client disconnected");
    wf_attempt_end(r, PDGW_END_CANCELLED);
    pdgw_wf_set_finished(r);
}

void pdgw_wf_finalize(pdgw_req_t *r, bool client_disconnected)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_gateway_metrics_t *gm = srv->opts.metrics;
    bool was_running = r->stage != PDGW_WF_FINISHED && r->stage != PDGW_WF_NONE;
    bool stream_cut = r->committed && !r->out_done;
    uint64_t now_ns = pdgw_time_mono_ns();
    int k;

    if (r->finalized)
        return;
    r->finalized = true;
    if (client_disconnected && (was_running || stream_cut) && r->route == PDGW_ROUTE_INFER) {
        pdgw_gateway_metrics_client_disconnect(gm, protocol_of(r));
        /* 499 (nginx's "client closed request"), also after the 200 of a stream went out:
         * the client did not get the whole answer. */
        r->final_status = 499;
        snprintf(r->error_text, sizeof(r->error_text), "client disconnected%s",
                 r->committed ? " mid-stream" : "");
    }
    pdgw_wf_cancel(r);
    pdgw_admit_req_done(r); /* the admission slot or queue place, exactly once */
    if (r->waker) {
        pdgw_waker_detach(r->waker);
        r->waker = NULL;
    }
    sched_booking_destroy(&r->booking);

    if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
        r->route == PDGW_ROUTE_NONE || r->route == PDGW_ROUTE_PASSTHROUGH) {
        int status = r->final_status ? r->final_status : r->reply_status;
        double dur = (double)(now_ns - r->t_start_ns) / 1e9;
        if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
            r->route == PDGW_ROUTE_PASSTHROUGH)
            pdgw_gateway_metrics_request_done(gm, protocol_of(r), status, dur);
        /* fleet hooks: per-model and pass-through metrics */
        pdgw_models_request_done(r,
                                 r->pt           ? r->pt_model
                                 : r->info_valid ? r->info.model
                                                 : NULL,
                                 status, dur);
        pdgw_pt_finalize(r, status, dur);
        if (pdgw_log_access_enabled())
            pdgw_req_access_log(r, status, client_disconnected && (was_running || stream_cut),
                                now_ns);
        if (r->route == PDGW_ROUTE_INFER && srv->opts.otel != NULL)
            wf_trace(r, status, now_ns);
    }
    for (k = 0; k < 2; k++)
        pdgw_leg_release(&r->legs[k]);
    pdgw_models_release(r);
    pdgw_route_req_release(r); /* route hook */
    pdgw_worker_active_remove(r->w, r);
    if (r->counted) {
        atomic_fetch_sub(&srv->inflight, 1);
        pdgw_gauge_dec(gm->inflight);
    }
    if (r->info_valid)
        pdgw_request_info_release(&r->info);
    json_decref(r->json);
    pdgw_free(r->pt_model); /* fleet: pass-through's model and headers */
    pdgw_buf_free(&r->pt_headers);
    pdgw_buf_free(&r->body);
    pdgw_buf_free(&r->fwd_headers);
    pdgw_buf_free(&r->out);
    pdgw_free(r->reply_body);
    pdgw_req_release(r);
}

const pdgw_leg_owner_t pdgw_wf_leg_owner = {wf_relay_event, wf_leg_done};
