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
#include "pdgw_route.h"
#include "pdgw_server_int.h"
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */
#include "pdgw_wf.h"
#include "pdgw_fwd_sdk.h"
#include "pdgw_fwd_text.h"

#include "pdgw_body_splice.h"
#include "pdgw_json_dump.h"
#include "pdgw_json_load.h"

#include <stdio.h>
#include <string.h>

#include "pdb/pdb_str.h"
#include "pdgw_alloc.h"
#include "pdgw_log.h"

static void wf_fail(pdgw_wf_t *wf, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg);
static void wf_start_attempt(pdgw_wf_t *wf);
static void wf_run_decode_stage(pdgw_wf_t *wf);
static void wf_decode_finish(pdgw_wf_t *wf, pdgw_leg_t *leg);
static char *wf_rewrite_reply(pdgw_wf_t *wf, const pdgw_leg_t *leg, size_t *len, bool *usage_read);

static const char *protocol_of(const pdgw_wf_t *wf)
{
    return wf->w->srv->desc->name;
}

static const pdgw_fwd_ops_t *ops_of(const pdgw_wf_t *wf)
{
    return wf->w->srv->desc->ops;
}

/* ---------------------------------------------------------------- instances */

/* Refresh the peer views from the booking. */
static void wf_refresh_peers(pdgw_wf_t *wf)
{
    int k;
    wf->peers.prefill = wf->peers.decode = NULL;
    for (k = 0; k < 2; k++) {
        sched_instance_t *si;
        wf->inst_set[k] = false;
        wf->sched_inst[k] = NULL;
        if (wf->booking == NULL)
            continue;
        si = sched_booking_instance(wf->booking, k == 0 ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE);
        if (si == NULL)
            continue;
        pdgw_instance_view_from_sched(&wf->inst_view[k], si);
        wf->inst_set[k] = true;
        wf->sched_inst[k] = si; /* borrowed: valid while the booking lives */
        pdb_str_join(k == 0 ? wf->prefill_id : wf->decode_id, SCHED_ID_MAX, wf->inst_view[k].id,
                     "");
    }
    if (wf->booking != NULL) {
        double first = 0.0, tpot = 0.0;
        sched_booking_predicted(wf->booking, SCHED_LEG_PREFILL, &first, NULL);
        if (!wf->inst_set[0]) /* decode-only: the decode's own first token */
            sched_booking_predicted(wf->booking, SCHED_LEG_DECODE, &first, NULL);
        sched_booking_predicted(wf->booking, SCHED_LEG_DECODE, NULL, &tpot);
        wf->pred_first_s = first;
        wf->pred_tpot_s = tpot;
    }
    if (wf->inst_set[0])
        wf->peers.prefill = &wf->inst_view[0];
    if (wf->inst_set[1])
        wf->peers.decode = &wf->inst_view[1];
}

static void wf_sched_request(pdgw_wf_t *wf, sched_request_t *sr, const char **excl)
{
    pdgw_req_t *r = wf->req;
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
        if (sched_pool_has_kv_index(wf->w->srv->opts.pool)) {
            /* precise-prefix: the extra keys vLLM folds into the prompt's block hashes
             * (vllm/v1/core/kv_cache_utils.py): the body's cache_salt and, when the model is
             * an adapter the engines list, its name */
            sr->cache_salt = json_string_value(pdgw_req_json_member(r, "cache_salt"));
            if (sched_pool_model_is_adapter(wf->w->srv->opts.pool, sr->model))
                sr->lora_name = sr->model;
        }
    }
    sr->affinity_key = wf->affinity_key; /* session affinity (pdgw_admit_req.c) */
    sr->slo_ttft_ms = wf->slo_ttft_ms;   /* latency targets (pdgw_slo.c) */
    sr->slo_tpot_ms = wf->slo_tpot_ms;
    {
        /* route hook: the engine's token ids of a text prompt (pdgw_tokenize.c) */
        size_t n_tok = 0;
        const uint32_t *tok = pdgw_route_tokens(wf, &n_tok);
        if (tok) {
            sr->tokens = tok;
            sr->n_tokens = n_tok;
            sr->prompt_tokens = n_tok < UINT32_MAX ? (uint32_t)n_tok : 0;
        }
    }
    for (i = 0; i < wf->n_failed; i++)
        excl[i] = wf->failed_ids[i];
    sr->exclude_ids = excl;
    sr->n_exclude_ids = wf->n_failed;
}

/* What a successful leg took, for its instance's latency models (pdsched/predict.h): a
 * prefill leg's whole time (its answer is the first token); a decode leg's time to the
 * first relayed token and the stream's later events (about one token each, vLLM's stream
 * interval aside) with the time they took. A PD decode leg's first token waits for the KV
 * handoff, which starts once the prefill answered: it counts from the later of its own
 * start and that answer (both legs sent at once, the parallel protocols, would otherwise
 * teach the handoff the prefill's time too). A whole (non-stream) answer gives its time and
 * its output tokens (usage), from which the first token's model and the TPOT model learn
 * together (sched_result_t answer_s). */
static void wf_leg_timings(const pdgw_wf_t *wf, pdgw_leg_kind_t k, sched_result_t *res)
{
    const pdgw_leg_t *leg = &wf->legs[k];
    const pdgw_leg_t *prefill = &wf->legs[PDGW_LEG_PREFILL];
    uint64_t first_ms = wf->t_first_token_ns / 1000000u, from_ms, end_ms;
    bool whole;

    if (k == PDGW_LEG_PREFILL) {
        if (leg->t_end_ms > leg->t_start_ms)
            res->first_token_s = (double)(leg->t_end_ms - leg->t_start_ms) / 1e3;
        if (wf->prefill_usage_seen && wf->prefill_cached > 0 && wf->prefill_cached <= UINT32_MAX)
            res->cached_tokens = (uint32_t)wf->prefill_cached;
        return;
    }
    whole = wf->t_first_token_ns == 0;
    end_ms = whole ? leg->t_end_ms : first_ms;
    if (leg->t_start_ms == 0 || end_ms < leg->t_start_ms)
        return;
    from_ms = leg->t_start_ms;
    if (prefill->t_end_ms > from_ms) /* overlapping legs: from the prefill's answer */
        from_ms = prefill->t_end_ms < end_ms ? prefill->t_end_ms : end_ms;
    if (whole) {
        if (wf->req->info.stream || wf->req->info.n > 1 || !wf->usage_seen ||
            wf->usage_completion <= 0 || wf->usage_completion > UINT32_MAX || end_ms <= from_ms)
            return;
        res->answer_s = (double)(end_ms - from_ms) / 1e3;
        res->answer_tokens = (uint32_t)wf->usage_completion;
        return;
    }
    res->first_token_s = (double)(first_ms - from_ms) / 1e3;
    if (first_ms == from_ms)
        res->first_token_s = 0.0005; /* within the loop's millisecond */
    if (wf->n_later_events > 0 && wf->t_last_token_ns > wf->t_first_token_ns) {
        res->later_tokens = wf->n_later_events;
        res->later_tokens_s = (double)(wf->t_last_token_ns - wf->t_first_token_ns) / 1e9;
    }
}

/* Finish one booked leg exactly once. */
static void wf_finish_booking(pdgw_wf_t *wf, pdgw_leg_kind_t k, sched_outcome_t outcome,
                              const pdgw_leg_t *leg)
{
    sched_leg_t sl = k == PDGW_LEG_PREFILL ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE;
    sched_result_t res;
    if (wf->booking == NULL || !sched_booking_leg_open(wf->booking, sl))
        return;
    memset(&res, 0, sizeof(res));
    res.outcome = outcome;
    if (leg) {
        res.http_status = (int)leg->status;
        res.retry_after_ms = leg->retry_after_ms;
        res.detail = leg->errmsg[0] ? leg->errmsg : NULL;
    }
    if (outcome == SCHED_OUTCOME_SUCCESS)
        wf_leg_timings(wf, k, &res);
    (void)sched_booking_finish(wf->booking, sl, &res);
}

/* ---------------------------------------------------------------- attempts */

static void wf_attempt_end(pdgw_wf_t *wf, pdgw_end_reason_t reason)
{
    int k;
    pdgw_kv_release_attempt_end(wf, reason); /* route hook: no stranded prefill KV */
    for (k = 0; k < 2; k++) {
        if (wf->legs[k].state == PDGW_LEG_RUNNING) {
            pdgw_leg_abort(&wf->legs[k]);
            wf_finish_booking(wf, (pdgw_leg_kind_t)k, SCHED_OUTCOME_CANCELLED, NULL);
        }
    }
    if (wf->attempt_live) {
        wf->attempt_live = false;
        if (ops_of(wf)->attempt_cleanup)
            ops_of(wf)->attempt_cleanup(wf->fwd_ctx, wf->fwd_state, &wf->freq, reason);
        wf->fwd_state = NULL;
        pdgw_fwd_attempt_end(&wf->freq);
    }
}

void pdgw_wf_set_finished(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    wf->stage = PDGW_WF_FINISHED;
    pdgw_worker_active_remove(wf->w, r);
}

/* Success of the whole request: the relay is complete. */
static void wf_succeed(pdgw_wf_t *wf)
{
    int k;
    for (k = 0; k < 2; k++)
        wf_finish_booking(wf, (pdgw_leg_kind_t)k, SCHED_OUTCOME_SUCCESS, NULL);
    wf_attempt_end(wf, PDGW_END_OK);
    pdgw_wf_set_finished(wf);
}

static bool wf_build_and_start(pdgw_wf_t *wf, pdgw_leg_kind_t k)
{
    pdgw_req_t *r = wf->req;
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    pdgw_fwd_leg_t fl;
    pdgw_fwd_error_t e;
    pdgw_leg_t *leg = &wf->legs[k];
    const pdgw_instance_t *inst = k == PDGW_LEG_PREFILL ? wf->peers.prefill : wf->peers.decode;
    char *text;
    size_t len;
    pdgw_status_t st;

    memset(&fl, 0, sizeof(fl));
    memset(&e, 0, sizeof(e));
    if (inst == NULL) {
        pdgw_fwd_error_set(&e, k == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE, 0,
                           503, "no %s instance booked",
                           k == PDGW_LEG_PREFILL ? "prefill" : "decode");
        wf_fail(wf, &e, NULL);
        return false;
    }
    if (pdgw_pd_decode_only(wf))
        fl.client_body = 1; /* route hook: decode-only, the engine computes the prompt */
    else if (ops->build_leg(wf->fwd_ctx, wf->fwd_state, &wf->freq, k, &wf->peers, &fl, &e) !=
                 PDGW_FWD_OK ||
             (fl.body == NULL && !fl.client_body)) {
        json_decref(fl.body);
        if (e.message[0] == '\0')
            pdgw_fwd_error_set(&e, k == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE,
                               0, 500, "forwarder %s could not build the %s leg", protocol_of(wf),
                               k == PDGW_LEG_PREFILL ? "prefill" : "decode");
        wf_fail(wf, &e, NULL);
        return false;
    }
    pdgw_route_dp_header(inst, &fl); /* route hook: pin a data-parallel engine's rank */
    if (k == PDGW_LEG_DECODE && wf->quota_hide_usage) {
        /* the tenant's budget needs the stream's usage: asked of the engine on this leg */
        if (fl.body == NULL)
            fl.body = json_copy(pdgw_req_json(r));
        fl.body = pdgw_quota_usage_leg(wf, fl.body);
        if (fl.body == NULL)
            wf->quota_hide_usage = false;
    }
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
        wf_fail(wf, &e, NULL);
        return false;
    }
    /* members the leg shares with the client body are copied from the client's bytes */
    text = pdgw_body_text(r->body.data, r->body.len, pdgw_req_json(r), fl.body, &len);
    json_decref(fl.body);
    if (text == NULL) {
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "out of memory");
        wf_fail(wf, &e, NULL);
        return false;
    }
    leg->relay = k == PDGW_LEG_DECODE;
    leg->sse = leg->relay && r->info.stream;
    st = pdgw_leg_start(leg, inst, fl.path ? fl.path : r->path, "POST", text, len, &fl);
    if (st != PDGW_OK) {
        free(text);
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "cannot start upstream request: %s",
                           pdgw_strerror(st));
        wf_fail(wf, &e, NULL);
        return false;
    }
    return true;
}

/* Run the gate at <point>; true to go on now. */
static bool wf_gate(pdgw_wf_t *wf, pdgw_gate_point_t point)
{
    pdgw_req_t *r = wf->req;
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    pdgw_fwd_error_t e;
    pdgw_fwd_status_t fs;
    if (ops->gate == NULL || pdgw_pd_decode_only(wf)) /* decode-only: the forwarder has no part */
        return true;
    memset(&e, 0, sizeof(e));
    fs = ops->gate(wf->fwd_ctx, wf->fwd_state, &wf->freq, point, &e);
    if (fs == PDGW_FWD_OK)
        return true;
    if (fs == PDGW_FWD_PENDING) {
        uint64_t now = pdgw_now_ms();
        if (wf->stage != PDGW_WF_GATE || wf->gate_point != point) {
            int64_t gt = wf->w->srv->plan.gate_timeout_ms;
            wf->gate_deadline_ms = gt > 0 ? now + (uint64_t)gt : r->deadline_ms;
            if (wf->gate_deadline_ms > r->deadline_ms)
                wf->gate_deadline_ms = r->deadline_ms;
        }
        wf->stage = PDGW_WF_GATE;
        wf->gate_point = point;
        pdgw_req_timer_update(r);
        return false;
    }
    if (e.message[0] == '\0')
        pdgw_fwd_error_set(
            &e, point == PDGW_GATE_BEFORE_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_KV_TRANSFER, 0,
            503, "forwarder %s refused the request at its gate", protocol_of(wf));
    wf_fail(wf, &e, NULL);
    return false;
}

static void wf_run_first_stage(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    if (wf->attempt == 0) /* queue: arrival to the first leg (booking, gate waits) */
        pdgw_gateway_metrics_observe_phase(&wf->w->srv->proto_metrics, PDGW_DURATION_QUEUE,
                                           (double)(pdgw_now_ms() - r->t_start_ms) / 1e3);
    switch (wf->freq.dispatch) {
    case PDGW_DISPATCH_SINGLE:
        wf_run_decode_stage(wf);
        return;
    case PDGW_DISPATCH_SERIAL:
        wf->stage = PDGW_WF_PREFILL;
        (void)wf_build_and_start(wf, PDGW_LEG_PREFILL);
        return;
    case PDGW_DISPATCH_PARALLEL:
        wf->stage = PDGW_WF_DECODE;
        /* Adding a transfer only arms curl's timer: nothing is sent before this function
         * returns to the loop, so both bodies are built before either leg goes out (a
         * failure building the decode body aborts the prefill unsent). */
        if (!wf_build_and_start(wf, PDGW_LEG_PREFILL))
            return;
        (void)wf_build_and_start(wf, PDGW_LEG_DECODE);
        return;
    }
}

/* Book what this attempt needs up front. false when it failed (reply sent). */
static bool wf_book(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    sched_request_t sr;
    const char *excl[WF_FAILED_MAX];
    sched_status_t st = SCHED_OK;
    pdgw_fwd_error_t e;

    if (wf->booking != NULL)
        return true; /* retry: rebooked by wf_retry */
    wf_sched_request(wf, &sr, excl);
    /* route hook: selective PD (pdgw_pd_decide.c) - a short prompt goes decode-only */
    if (wf->freq.dispatch != PDGW_DISPATCH_SINGLE &&
        pdgw_pd_decide_before_book(wf, &sr) != PDGW_PD_RUN) {
        st = sched_book_decode(srv->opts.pool, &sr, &wf->booking);
        if (st == SCHED_OK) {
            pdgw_pd_count(wf, PDGW_PD_SKIP_SHORT);
            wf->freq.dispatch = PDGW_DISPATCH_SINGLE;
            return true;
        }
    }
    switch (wf->freq.dispatch) {
    case PDGW_DISPATCH_SINGLE:
        st = srv->plan.single_needs_prefill ? sched_book_pd(srv->opts.pool, &sr, &wf->booking)
                                            : sched_book_decode(srv->opts.pool, &sr, &wf->booking);
        break;
    case PDGW_DISPATCH_SERIAL:
        st = wf->freq.mode == PDGW_MODE_STAGED
                 ? sched_book_prefill(srv->opts.pool, &sr, &wf->booking)
                 : sched_book_pd(srv->opts.pool, &sr, &wf->booking);
        break;
    case PDGW_DISPATCH_PARALLEL:
        st = sched_book_pd(srv->opts.pool, &sr, &wf->booking);
        break;
    }
    if (st != SCHED_OK) {
        memset(&e, 0, sizeof(e));
        if (st == SCHED_ERR_NO_INSTANCE && wf->n_failed == 0 &&
            sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_DECODE) > 0 &&
            (wf->freq.dispatch == PDGW_DISPATCH_SINGLE ||
             sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_PREFILL) > 0)) {
            /* Instances are up but every one is at its max_concurrent: overload, 429. */
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 429,
                               "every usable instance is at its max_concurrent; retry later");
            r->reply_retry_after_s = 1;
        } else if (st == SCHED_ERR_NO_INSTANCE)
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 503, "no usable %sinstance",
                               sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_PREFILL) == 0 &&
                                       wf->freq.dispatch != PDGW_DISPATCH_SINGLE
                                   ? "prefill "
                               : sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_DECODE) == 0
                                   ? "decode "
                                   : "");
        else
            pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 503, "cannot book an instance: %s",
                               sched_strerror(st));
        wf->booking = NULL;
        wf_fail(wf, &e, NULL);
        return false;
    }
    /* route hook: selective PD - the booked decode holds most of the prompt, or is predicted
     * to answer sooner computing it itself; it then carries the prompt's work */
    if (wf->freq.dispatch != PDGW_DISPATCH_SINGLE) {
        pdgw_pd_decision_t d = pdgw_pd_decide_after_book(wf, &sr, wf->booking);
        if (d != PDGW_PD_RUN && sched_booking_decode_only(wf->booking) == SCHED_OK) {
            pdgw_pd_count(wf, d);
            wf->freq.dispatch = PDGW_DISPATCH_SINGLE;
        }
    }
    return true;
}

static void wf_start_attempt(pdgw_wf_t *wf)
{
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    pdgw_fwd_error_t e;

    wf->freq.attempt = wf->attempt;
    wf->decode_parked = false;
    if (pdgw_uuid4(wf->leg_id) != PDGW_OK) {
        pdgw_fwd_error_t ue;
        pdgw_fwd_error_set(&ue, PDGW_PHASE_NONE, 0, 503, "no randomness for a transfer name");
        wf_fail(wf, &ue, NULL);
        return;
    }
    wf->freq.request_id = wf->leg_id;
    if (!wf_book(wf))
        return;
    wf_refresh_peers(wf);
    memset(&e, 0, sizeof(e));
    wf->fwd_state = NULL;
    if (pdgw_pd_decode_only(wf)) {
        /* route hook: decode-only needs neither the forwarder's state nor its gate */
        if (wf->inst_set[0]) {
            wf->inst_set[0] = false;
            wf->peers.prefill = NULL;
            wf->prefill_id[0] = '\0';
        }
        wf->stage = PDGW_WF_NONE;
        wf_run_first_stage(wf);
        return;
    }
    if (pdgw_fwd_attempt_begin(wf->w->srv->desc, &wf->freq, &wf->fwd_state) != PDGW_OK) {
        pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "out of memory");
        wf_fail(wf, &e, NULL);
        return;
    }
    if (ops->attempt_init) {
        if (ops->attempt_init(wf->fwd_ctx, &wf->freq, &wf->peers, &wf->fwd_state, &e) !=
            PDGW_FWD_OK) {
            if (e.message[0] == '\0')
                pdgw_fwd_error_set(&e, PDGW_PHASE_NONE, 0, 500, "forwarder %s: attempt_init",
                                   protocol_of(wf));
            pdgw_fwd_attempt_end(&wf->freq);
            wf_fail(wf, &e, NULL);
            return;
        }
    }
    wf->attempt_live = true;
    wf->stage = PDGW_WF_NONE;
    if (!wf_gate(wf, PDGW_GATE_BEFORE_PREFILL))
        return;
    wf_run_first_stage(wf);
}

void pdgw_wf_start(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    memset(&wf->freq, 0, sizeof(wf->freq));
    wf->freq.client_request_id = r->id;
    wf->freq.path = r->path;
    /* a forwarder that never reads the tree does not make the gateway build it */
    wf->freq.body = srv->desc->body_unread ? r->json : pdgw_req_json(r);
    wf->freq.stream = r->info.stream;
    wf->freq.is_chat = r->kind == PDGW_API_CHAT_COMPLETIONS;
    wf->freq.mode = srv->opts.mode;
    wf->freq.dispatch = srv->plan.dispatch;
    wf->freq.deadline_ms = (int64_t)r->deadline_ms;
    wf->freq.model = r->info.model ? r->info.model : "";
    wf->freq.prompt_tokens = r->info.est_prompt_tokens;
    wf->freq.max_tokens = r->info.max_tokens;
    if (wf->waker == NULL) /* admission may have made it */
        wf->waker = pdgw_waker_create(wf->w, wf, r->job->wake);
    wf->freq.waker = wf->waker;
    wf->stage = PDGW_WF_NONE;
    pdgw_worker_active_add(wf->w, r);
    if (pdgw_tokenize_begin(wf)) /* route hook: resumed by pdgw_wf_start_attempt */
        return;
    wf_start_attempt(wf);
}

void pdgw_wf_start_attempt(pdgw_wf_t *wf)
{
    wf_start_attempt(wf);
}

/* ---------------------------------------------------------------- stages */

static void wf_run_decode_stage(pdgw_wf_t *wf)
{
    wf->stage = PDGW_WF_DECODE;
    (void)wf_build_and_start(wf, PDGW_LEG_DECODE);
}

/* The prefill's answer as on_prefill_response sees it: only the members the forwarder reads
 * are built (a whole completion answer costs more to build than the legs' bodies). */
static json_t *wf_prefill_answer(const pdgw_wf_t *wf, const pdgw_leg_t *leg)
{
    const char *const *members = wf->w->srv->desc->prefill_answer_members;
    const char *text = leg->resp.data ? leg->resp.data : "";
    return members != NULL ? pdgw_json_load_members(text, leg->resp.len, members)
                           : pdgw_json_loadb(text, leg->resp.len, NULL);
}

/* The forwarder reads the prefill's 2xx answer: its text (on_prefill_text), then its tree
 * (on_prefill_response). */
static pdgw_fwd_status_t wf_read_prefill(pdgw_wf_t *wf, const pdgw_leg_t *leg, pdgw_fwd_error_t *e)
{
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    pdgw_fwd_status_t st = PDGW_FWD_OK;
    json_t *resp;

    if (ops->on_prefill_text != NULL)
        st = ops->on_prefill_text(wf->fwd_ctx, wf->fwd_state, &wf->freq, leg->status,
                                  leg->resp.data ? leg->resp.data : "", leg->resp.len, e);
    if (st != PDGW_FWD_OK || ops->on_prefill_response == NULL)
        return st;
    resp = wf_prefill_answer(wf, leg);
    st = ops->on_prefill_response(wf->fwd_ctx, wf->fwd_state, &wf->freq, leg->status, resp, e);
    json_decref(resp);
    return st;
}

/* Serial: prefill answered 2xx. */
static void wf_after_prefill(pdgw_wf_t *wf, pdgw_leg_t *leg)
{
    pdgw_fwd_error_t e;

    memset(&e, 0, sizeof(e));
    if (wf_read_prefill(wf, leg, &e) != PDGW_FWD_OK) {
        if (e.message[0] == '\0')
            pdgw_fwd_error_set(&e, PDGW_PHASE_KV_TRANSFER, 1, 502,
                               "forwarder %s rejected the prefill response", protocol_of(wf));
        wf_fail(wf, &e, NULL);
        return;
    }
    if (wf->freq.dispatch == PDGW_DISPATCH_PARALLEL) {
        /* decode is already running, or its answer waited for this one */
        if (wf->decode_parked) {
            wf->decode_parked = false;
            wf_decode_finish(wf, &wf->legs[PDGW_LEG_DECODE]);
        }
        return;
    }
    if (wf->freq.mode == PDGW_MODE_STAGED &&
        !sched_booking_leg_open(wf->booking, SCHED_LEG_DECODE) &&
        sched_booking_instance(wf->booking, SCHED_LEG_DECODE) == NULL) {
        sched_status_t st = sched_booking_book_decode(wf->booking);
        if (st != SCHED_OK) {
            pdgw_fwd_error_set(&e, PDGW_PHASE_DECODE, 0, 503, "no usable decode instance: %s",
                               sched_strerror(st));
            wf_fail(wf, &e, NULL);
            return;
        }
        wf_refresh_peers(wf);
    }
    if (!wf_gate(wf, PDGW_GATE_BEFORE_DECODE))
        return;
    wf_run_decode_stage(wf);
}

static void wf_add_failed(pdgw_wf_t *wf, const char *id)
{
    size_t i;
    for (i = 0; i < wf->n_failed; i++)
        if (strcmp(wf->failed_ids[i], id) == 0)
            return;
    if (wf->failed_ids == NULL &&
        (wf->failed_ids = pdgw_calloc(WF_FAILED_MAX, sizeof(*wf->failed_ids))) == NULL)
        return; /* out of memory: the next pick may choose it again */
    if (wf->n_failed < WF_FAILED_MAX)
        snprintf(wf->failed_ids[wf->n_failed++], SCHED_ID_MAX, "%s", id);
}

/* Error from a leg that failed (transport or status). */
static void wf_leg_error(pdgw_wf_t *wf, pdgw_leg_t *leg, pdgw_fwd_error_t *e)
{
    pdgw_req_t *r = wf->req;
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
static void wf_note_local_shortage(pdgw_wf_t *wf, const pdgw_leg_t *leg)
{
    pdgw_req_t *r = wf->req;
    static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
    uint64_t skipped = 0;
    pdgw_gateway_metrics_local_resource_error(wf->w->srv->opts.metrics,
                                              leg->os_errno ? "fd" : "memory");
    if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
        pdgw_log_warn("upstream", "req=%s %s (%llu similar suppressed)", r->id, leg->errmsg,
                      (unsigned long long)skipped);
}

/* The relayed decode leg completed: hand its answer to the client. */
static void wf_decode_finish(pdgw_wf_t *wf, pdgw_leg_t *leg)
{
    pdgw_req_t *r = wf->req;
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
        bool usage_read = false;
        char *body = wf_rewrite_reply(wf, leg, &len, &usage_read);
        if (body == NULL)
            body = pdgw_buf_steal(&leg->resp, &len);
        if (body != NULL && !usage_read)
            wf->usage_seen |= pdgw_gateway_metrics_usage_cached(
                &wf->w->srv->proto_metrics, body, len, true, &wf->usage_prompt,
                &wf->usage_completion, wf->quota != NULL ? &wf->usage_cached : NULL);
        else if (body != NULL && wf->quota != NULL) /* the rewrite read the counts */
            (void)pdgw_usage_cached_tokens(body, len, &wf->usage_cached);
        pdgw_req_reply(r, (int)leg->status, body, body ? len : 0,
                       leg->content_type[0] ? leg->content_type : "application/json");
    }
    if (wf->freq.dispatch == PDGW_DISPATCH_PARALLEL &&
        wf->legs[PDGW_LEG_PREFILL].state == PDGW_LEG_RUNNING) {
        /* The drained prefill is of no use any more. */
        pdgw_leg_abort(&wf->legs[PDGW_LEG_PREFILL]);
        wf_finish_booking(wf, PDGW_LEG_PREFILL, SCHED_OUTCOME_SUCCESS, NULL);
    }
    wf_succeed(wf);
}

/* Parallel: does the forwarder want the prefill's answer before the decode's goes out (asked
 * with a NULL response), and is the prefill still running? */
static bool wf_decode_waits(pdgw_wf_t *wf)
{
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    json_t *wants;
    if (ops->rewrite_decode == NULL || pdgw_pd_decode_only(wf) ||
        wf->freq.dispatch != PDGW_DISPATCH_PARALLEL ||
        wf->legs[PDGW_LEG_PREFILL].state != PDGW_LEG_RUNNING)
        return false;
    wants = ops->rewrite_decode(wf->fwd_ctx, wf->fwd_state, &wf->freq, 0, NULL);
    json_decref(wants);
    return wants != NULL;
}

/* A leg ended (success or error). */
static void wf_leg_done(pdgw_leg_t *leg)
{
    pdgw_wf_t *wf = leg->wf;
    pdgw_fwd_error_t e;
    uint64_t dur_us = (leg->t_end_ms - leg->t_start_ms) * 1000u;

    if (leg->kind == PDGW_LEG_PREFILL)
        wf->t_prefill_us = dur_us;
    else
        wf->t_decode_us = dur_us;
    if (wf->stage == PDGW_WF_FINISHED)
        return;
    if (leg->err == PDGW_LEGERR_LOCAL)
        wf_note_local_shortage(wf, leg);
    if (leg->err != PDGW_LEGERR_NONE) {
        if (leg->err != PDGW_LEGERR_LOCAL)
            pdgw_gateway_metrics_upstream_error(wf->w->srv->opts.metrics, protocol_of(wf),
                                                leg->inst->id, pdgw_leg_err_name(leg->err));
        memset(&e, 0, sizeof(e));
        wf_leg_error(wf, leg, &e);
        wf_fail(wf, &e, leg);
        return;
    }
    if (leg->kind == PDGW_LEG_PREFILL) {
        /* what the prefill did not compute: its latency model and the tenant's usage */
        if (leg->resp.data != NULL)
            wf->prefill_usage_seen =
                pdgw_usage_cached_tokens(leg->resp.data, leg->resp.len, &wf->prefill_cached) ||
                memmem(leg->resp.data, leg->resp.len, "\"usage\"", 7) != NULL;
        wf_finish_booking(wf, PDGW_LEG_PREFILL, SCHED_OUTCOME_SUCCESS, leg);
        wf->t_prefill_done_ms = leg->t_end_ms;
        pdgw_gateway_metrics_observe_phase(&wf->w->srv->proto_metrics, PDGW_DURATION_PREFILL,
                                           (double)dur_us / 1e6);
        pdgw_gateway_metrics_observe_prefill(&wf->w->srv->proto_metrics, (double)dur_us / 1e6);
        wf_after_prefill(wf, leg);
        return;
    }
    /* Decode (relayed) leg completed. */
    pdgw_gateway_metrics_observe_phase(&wf->w->srv->proto_metrics, PDGW_DURATION_DECODE,
                                       (double)dur_us / 1e6);
    pdgw_gateway_metrics_observe_decode(&wf->w->srv->proto_metrics, (double)dur_us / 1e6);
    if (!leg->sse && wf->t_prefill_done_ms && !wf->kv_wait_observed) {
        /* Non-stream: the KV wait ends with the decode leg's first byte. */
        wf->kv_wait_observed = true;
        if (leg->t_first_ms >= wf->t_prefill_done_ms)
            wf->t_kv_wait_us = (leg->t_first_ms - wf->t_prefill_done_ms) * 1000u;
        if (leg->t_first_ms >= wf->t_prefill_done_ms)
            pdgw_gateway_metrics_observe_kv_wait(&wf->w->srv->proto_metrics,
                                                 (double)(leg->t_first_ms - wf->t_prefill_done_ms) /
                                                     1e3);
    }
    if (!leg->sse && wf_decode_waits(wf)) {
        wf->decode_parked = true; /* finished by wf_after_prefill */
        return;
    }
    wf_decode_finish(wf, leg);
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
/* A request whose decode failed after its prefill answered may keep that prefill: its result
 * (vllm-nixl's kv_transfer_params; a parallel vllm-mooncake prefill's KV held under its
 * transfer_id) stays valid on the prefill until a decode reads it or it expires, and the
 * forwarder's retry_scope said so by re-picking the decode only. Not when the failed decode
 * reached a vLLM engine: that one has had the prefill free the blocks (pdgw_kv_still_held),
 * so the prefill runs again. */
static bool wf_can_keep_prefill(const pdgw_wf_t *wf, unsigned scope, const pdgw_leg_t *failed_leg)
{
    const pdgw_leg_t *p = &wf->legs[PDGW_LEG_PREFILL];
    return scope == PDGW_REPICK_DECODE && wf->freq.dispatch != PDGW_DISPATCH_SINGLE &&
           failed_leg != NULL && failed_leg->kind == PDGW_LEG_DECODE && p->state == PDGW_LEG_DONE &&
           p->err == PDGW_LEGERR_NONE && pdgw_kv_still_held(wf, failed_leg);
}

/* Run the decode stage again for the kept prefill (after a backoff, or at once). */
static void wf_resume_decode(pdgw_wf_t *wf)
{
    wf_refresh_peers(wf);
    if (wf_gate(wf, PDGW_GATE_BEFORE_DECODE))
        wf_run_decode_stage(wf);
}

/* Retry with a new decode inside the same attempt: no new prefill leg, the forwarder's
 * state (what the prefill returned) carries over, the decode leg is built again for the
 * newly booked decode. false when no other decode can be booked, or when a decode's
 * 429/503 asks for a backoff that does not fit before the deadline. */
static bool wf_retry_decode_keep_prefill(pdgw_wf_t *wf, const pdgw_fwd_error_t *e,
                                         pdgw_leg_t *failed_leg)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    uint64_t delay_ms = 0;
    /* A decode's 429/503 is overload: the same backoff (exponential, jitter, Retry-After,
     * deadline) as any other retry, so an overloaded fleet is not hit again at once. */
    if (!pdgw_admit_retry_delay(wf, failed_leg, &delay_ms))
        return false;
    wf_finish_booking(wf, PDGW_LEG_DECODE, pdgw_leg_outcome(failed_leg), failed_leg);
    wf_add_failed(wf, failed_leg->inst->id);
    if (sched_booking_rebook(wf->booking, SCHED_LEG_DECODE) != SCHED_OK)
        return false; /* nothing left: the caller reports the original failure */
    wf->attempt++;
    wf->freq.attempt = wf->attempt;
    pdgw_gateway_metrics_retry(srv->opts.metrics, protocol_of(wf));
    pdgw_log_info("workflow", "req=%s retry %u with a new decode, keeping the prefill: %s", r->id,
                  wf->attempt, e->message);
    pdgw_leg_release(&wf->legs[PDGW_LEG_DECODE]);
    pdgw_leg_init(&wf->legs[PDGW_LEG_DECODE], &wf->origin, wf, PDGW_LEG_DECODE, &pdgw_wf_leg_owner);
    if (delay_ms > 0) {
        /* The deadline scan resumes the decode when the backoff is over. */
        pdgw_log_debug("workflow", "req=%s backing off %llu ms before decode retry %u", r->id,
                       (unsigned long long)delay_ms, wf->attempt);
        wf->retry_at_ms = pdgw_now_ms() + delay_ms;
        wf->retry_decode_only = true;
        wf->stage = PDGW_WF_WAIT;
        pdgw_req_timer_update(r);
        return true;
    }
    wf_resume_decode(wf);
    return true;
}

static bool wf_retry(pdgw_wf_t *wf, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    unsigned scope;
    int k;
    bool overload, fresh;
    uint64_t delay_ms = 0;

    if (wf->passthrough || !e->retryable || r->committed || wf->attempt >= r->max_retries ||
        wf->booking == NULL || pdgw_now_ms() >= r->deadline_ms || r->client_gone)
        return false;
    scope = ops_of(wf)->retry_scope
                ? ops_of(wf)->retry_scope(wf->fwd_ctx, wf->fwd_state, &wf->freq, e)
                : default_scope(e);
    if (wf->freq.dispatch == PDGW_DISPATCH_SINGLE && !srv->plan.single_needs_prefill)
        scope &= PDGW_REPICK_DECODE;
    if (scope == PDGW_REPICK_NONE)
        return false;
    if (wf_can_keep_prefill(wf, scope, failed_leg))
        return wf_retry_decode_keep_prefill(wf, e, failed_leg);
    /* An engine's 429/503 is overload, not failure: back off (pdgw_admit_req.c), then book
     * afresh, the same instance allowed (it may be the only one). */
    overload = failed_leg != NULL && failed_leg->err == PDGW_LEGERR_STATUS &&
               (failed_leg->status == 429 || failed_leg->status == 503);
    if (overload && !pdgw_admit_retry_delay(wf, failed_leg, &delay_ms))
        return false; /* no retry fits before the deadline */
    /* Book afresh (the same prefill allowed, the failed decode not) when overloaded, or when
     * the decode that failed after a serial prefill had the prefill's KV freed: that prefill
     * must run again (pdgw_kv_still_held). */
    fresh = overload || (failed_leg != NULL && failed_leg->kind == PDGW_LEG_DECODE &&
                         wf->freq.dispatch == PDGW_DISPATCH_SERIAL &&
                         wf->legs[PDGW_LEG_PREFILL].state == PDGW_LEG_DONE &&
                         !pdgw_kv_still_held(wf, failed_leg));
    /* Close this attempt: failed leg with its outcome, the rest cancelled. */
    if (failed_leg) {
        wf_finish_booking(wf, failed_leg->kind, pdgw_leg_outcome(failed_leg), failed_leg);
        if (!overload)
            wf_add_failed(wf, failed_leg->inst->id);
    }
    wf_attempt_end(wf, PDGW_END_RETRY);
    if (fresh)
        sched_booking_destroy(&wf->booking);
    for (k = 0; k < 2 && wf->booking != NULL; k++) {
        sched_leg_t sl = k == 0 ? SCHED_LEG_PREFILL : SCHED_LEG_DECODE;
        unsigned bit = k == 0 ? PDGW_REPICK_PREFILL : PDGW_REPICK_DECODE;
        if (!(scope & bit) || sched_booking_instance(wf->booking, sl) == NULL)
            continue;
        wf_finish_booking(wf, (pdgw_leg_kind_t)k, SCHED_OUTCOME_CANCELLED, NULL);
        if (sched_booking_rebook(wf->booking, sl) != SCHED_OK)
            return false; /* nothing left: the caller reports the original failure */
    }
    wf->attempt++;
    pdgw_gateway_metrics_retry(srv->opts.metrics, protocol_of(wf));
    pdgw_log_info("workflow", "req=%s retry %u after %s failure: %s", r->id, wf->attempt,
                  pdgw_phase_name(e->phase), e->message);
    for (k = 0; k < 2; k++) {
        pdgw_leg_release(&wf->legs[k]);
        pdgw_leg_init(&wf->legs[k], &wf->origin, wf, (pdgw_leg_kind_t)k, &pdgw_wf_leg_owner);
    }
    if (delay_ms > 0) {
        /* The deadline scan starts the attempt when the backoff is over. */
        pdgw_log_debug("workflow", "req=%s backing off %llu ms before retry %u", r->id,
                       (unsigned long long)delay_ms, wf->attempt);
        wf->retry_at_ms = pdgw_now_ms() + delay_ms;
        wf->stage = PDGW_WF_WAIT;
        pdgw_req_timer_update(r); /* the backoff's end is the request's next deadline */
        return true;
    }
    wf_start_attempt(wf);
    return true;
}

/* The stream to the client already started (200 and some bytes are out): the failure ends
 * it with one error event in our own words, saying which instance did what after how many
 * bytes, and that the client cannot simply be retried for it (it got part of an answer).
 * It is counted and logged with the failure's status, not the 200 on the wire. */
static void wf_fail_midstream(pdgw_wf_t *wf, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg,
                              int status)
{
    pdgw_req_t *r = wf->req;
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
    pdgw_req_error_set(r, "%s: %s (stream interrupted)", pdgw_phase_name(e->phase), msg);
    pdgw_log_info("workflow", "req=%s stream interrupted: %s (%s)", r->id, msg, e->message);
    pdgw_api_error_set(&api, pdgw_api_err_kind_from_http(status), NULL, "%s", msg);
    if (e->phase != PDGW_PHASE_NONE && !wf->passthrough &&
        (wf->freq.dispatch != PDGW_DISPATCH_SINGLE || wf->w->srv->plan.single_needs_prefill)) {
        char type[48];
        r->pd_phase = e->phase;
        snprintf(type, sizeof(type), "pd_%s_error", pdgw_phase_name(e->phase));
        pdgw_api_error_set_type(&api, type);
        pdgw_gateway_metrics_pd_failure(wf->w->srv->opts.metrics, protocol_of(wf),
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

static void wf_fail(pdgw_wf_t *wf, const pdgw_fwd_error_t *e, pdgw_leg_t *failed_leg)
{
    pdgw_req_t *r = wf->req;
    pdgw_api_error_t api;
    int status;

    if (wf->stage == PDGW_WF_FINISHED)
        return;
    if (wf_retry(wf, e, failed_leg))
        return;
    pdgw_req_error_set(r, "%s: %s", pdgw_phase_name(e->phase), e->message);
    /* Stop everything; finish bookings with what happened. */
    if (failed_leg)
        wf_finish_booking(wf, failed_leg->kind, pdgw_leg_outcome(failed_leg), failed_leg);
    wf_attempt_end(wf, e->http_status == 504 ? PDGW_END_TIMEOUT : PDGW_END_FAILED);
    pdgw_wf_set_finished(wf);

    status = e->http_status ? e->http_status : 502;
    if (r->committed) {
        wf_fail_midstream(wf, e, failed_leg, status);
        return;
    }
    pdgw_api_error_set(&api, pdgw_api_err_kind_from_http(status), NULL, "%s", e->message);
    if (status == 504)
        pdgw_api_error_set_code(&api, "upstream_timeout");
    /* PD protocols tag the failure with its phase; a plain proxy keeps OpenAI's types. */
    if (e->phase != PDGW_PHASE_NONE && !wf->passthrough &&
        (wf->freq.dispatch != PDGW_DISPATCH_SINGLE || wf->w->srv->plan.single_needs_prefill)) {
        char type[48];
        r->pd_phase = e->phase;
        r->pd_retryable = e->retryable ? 1 : 0;
        snprintf(type, sizeof(type), "pd_%s_error", pdgw_phase_name(e->phase));
        pdgw_api_error_set_type(&api, type);
        pdgw_api_error_set_code(&api, e->retryable ? "retryable" : "not_retryable");
        pdgw_gateway_metrics_pd_failure(wf->w->srv->opts.metrics, protocol_of(wf),
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
    json_t *o = pdgw_json_loadb(ev->data, ev->data_len, NULL);
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

/* Whether the forwarder may rewrite this attempt's decode answer: else it is relayed
 * without being parsed. */
static bool wf_rewrites(pdgw_wf_t *wf)
{
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    return ops->rewrite_decode != NULL && !pdgw_pd_decode_only(wf) &&
           (ops->rewrites_decode == NULL ||
            ops->rewrites_decode(wf->fwd_ctx, wf->fwd_state, &wf->freq) != 0);
}

/* The forwarder's rewrite of one decode event: true when it replaced the event (the new
 * events were appended), false to pass the original through. */
static bool wf_rewrite_event(pdgw_wf_t *wf, const pdgw_sse_event_t *ev)
{
    pdgw_req_t *r = wf->req;
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    json_t *in, *out, *item;
    size_t i;
    if (ev->is_done || !ev->has_data || !wf_rewrites(wf))
        return false;
    if (ops->rewrite_decode_text != NULL) {
        pdgw_fwd_text_t t = {0};
        int got = ops->rewrite_decode_text(wf->fwd_ctx, wf->fwd_state, &wf->freq, 1, ev->data,
                                           ev->data_len, &t);
        if (got == 1 && t.buf.len > 0)
            pdgw_req_out_append(r, t.buf.data, t.buf.len);
        pdgw_buf_free(&t.buf);
        if (got >= 0)
            return got == 1;
    }
    in = pdgw_json_loadb(ev->data, ev->data_len, NULL);
    if (in == NULL)
        return false;
    out = ops->rewrite_decode(wf->fwd_ctx, wf->fwd_state, &wf->freq, 1, in);
    json_decref(in);
    if (out == NULL)
        return false;
    json_array_foreach(out, i, item)
    {
        size_t n;
        char *s = json_is_object(item) || json_is_array(item) ? pdgw_json_dumps(item, &n) : NULL;
        if (s == NULL)
            continue;
        pdgw_req_out_append(r, "data: ", 6);
        pdgw_req_out_append(r, s, n);
        pdgw_req_out_append(r, "\n\n", 2);
        pdgw_free(s);
    }
    json_decref(out);
    return true;
}

/* The forwarder's rewrite of a non-stream decode answer: the new body, NULL when it is relayed
 * as it came. The rewritten tree's usage is counted here (*usage_read), so the text written from
 * it is not scanned again. */
static char *wf_rewrite_reply(pdgw_wf_t *wf, const pdgw_leg_t *leg, size_t *len, bool *usage_read)
{
    const pdgw_fwd_ops_t *ops = ops_of(wf);
    json_t *in, *out;
    char *s;
    if (leg->status < 200 || leg->status >= 300 || !wf_rewrites(wf))
        return NULL;
    if (ops->rewrite_decode_text != NULL) {
        pdgw_fwd_text_t t = {0};
        int got = ops->rewrite_decode_text(wf->fwd_ctx, wf->fwd_state, &wf->freq, 0,
                                           leg->resp.data ? leg->resp.data : "", leg->resp.len, &t);
        if (got == 1)
            return pdgw_buf_steal(&t.buf, len); /* its usage is read from the text */
        pdgw_buf_free(&t.buf);
        if (got == 0)
            return NULL;
    }
    /* a whole answer: its text can be thousands of tokens long */
    in = pdgw_json_loadb(leg->resp.data ? leg->resp.data : "", leg->resp.len, NULL);
    if (in == NULL)
        return NULL;
    out = ops->rewrite_decode(wf->fwd_ctx, wf->fwd_state, &wf->freq, 0, in);
    json_decref(in);
    if (out == NULL)
        return NULL;
    s = json_is_object(out) || json_is_array(out) ? pdgw_json_dumps(out, len) : NULL;
    if (s != NULL)
        wf->usage_seen |= pdgw_gateway_metrics_usage_tree(&wf->w->srv->proto_metrics, out,
                                                          &wf->usage_prompt, &wf->usage_completion);
    *usage_read = s != NULL;
    json_decref(out);
    return s;
}

/* Relay: one SSE event of the decode leg (from the leg's parser). Non-zero stops the leg. */
static int wf_relay_event(pdgw_leg_t *leg, const pdgw_sse_event_t *ev)
{
    pdgw_wf_t *wf = leg->wf;
    pdgw_req_t *r = wf->req;
    uint64_t now_ns = pdgw_time_mono_ns();
    uint64_t now = now_ns / 1000000u;
    if (wf->stage == PDGW_WF_FINISHED)
        return 1;
    if (ev->is_done) {
        if (leg->saw_done)
            return 0; /* one [DONE] only */
        leg->saw_done = true;
    } else if (ev->has_data) {
        if (wf->t_prefill_done_ms && !wf->kv_wait_observed && now >= wf->t_prefill_done_ms) {
            /* From the prefill's end to the first relayed decode event. */
            wf->kv_wait_observed = true;
            wf->t_kv_wait_us = (now - wf->t_prefill_done_ms) * 1000u;
            pdgw_gateway_metrics_observe_kv_wait(&wf->w->srv->proto_metrics,
                                                 (double)(now - wf->t_prefill_done_ms) / 1e3);
        }
        if (wf->t_first_token_ns == 0) {
            /* TTFT: the first event with generated text (chat starts with a role delta). */
            if (event_has_content(ev)) {
                wf->t_first_token_ns = now_ns;
                wf->t_last_token_ns = now_ns;
                pdgw_gateway_metrics_observe_ttft(&wf->w->srv->proto_metrics,
                                                  (double)(now_ns - r->t_start_ns) / 1e9);
            }
        } else {
            /* TPOT: every later data event is a step of the generation. */
            pdgw_gateway_metrics_observe_tpot(&wf->w->srv->proto_metrics,
                                              (double)(now_ns - wf->t_last_token_ns) / 1e9);
            wf->t_last_token_ns = now_ns;
            wf->n_later_events++;
        }
    }
    if (ev->has_data && !ev->is_done &&
        pdgw_gateway_metrics_usage_cached(&wf->w->srv->proto_metrics, ev->data, ev->data_len, false,
                                          &wf->usage_prompt, &wf->usage_completion,
                                          wf->quota != NULL ? &wf->usage_cached : NULL)) {
        wf->usage_seen = true;
        if (pdgw_quota_hide_event(wf, ev->data, ev->data_len, true))
            return 0; /* the usage chunk was asked for the budget, not by the client */
    }
    /* Pass the event through byte for byte, unless the forwarder rewrites decode answers. */
    if (!wf_rewrite_event(wf, ev))
        pdgw_req_out_append(r, ev->raw, ev->raw_len);
    if (!r->committed)
        pdgw_req_commit_stream(r);
    return 0;
}

/* ---------------------------------------------------------------- deadlines, wake, end */

void pdgw_wf_check_deadlines(pdgw_wf_t *wf, uint64_t now)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    pdgw_fwd_error_t e;
    int k;

    if (wf->stage == PDGW_WF_FINISHED)
        return;
    if (wf->stage == PDGW_WF_WAIT) {
        /* Waiting for admission or for a retry's backoff (pdgw_admit_req.c). */
        if (pdgw_admit_req_check(wf, now))
            return;
        if (now >= wf->retry_at_ms) {
            wf->retry_at_ms = 0;
            if (wf->retry_decode_only) {
                wf->retry_decode_only = false;
                wf_resume_decode(wf);
            } else {
                wf_start_attempt(wf);
            }
        }
        return;
    }
    if (pdgw_tokenize_check_deadline(wf, now)) /* route hook: waiting for the tokens */
        return;
    memset(&e, 0, sizeof(e));
    if (now >= r->deadline_ms) {
        pdgw_fwd_error_set(&e,
                           wf->stage == PDGW_WF_PREFILL ? PDGW_PHASE_PREFILL
                           : wf->stage == PDGW_WF_GATE  ? PDGW_PHASE_KV_TRANSFER
                                                        : PDGW_PHASE_DECODE,
                           0, 504, "request deadline passed");
        wf_fail(wf, &e, NULL);
        return;
    }
    if (wf->stage == PDGW_WF_GATE) {
        if (now >= wf->gate_deadline_ms) {
            pdgw_fwd_error_set(
                &e, PDGW_PHASE_KV_TRANSFER, 0, 504, "timed out waiting for the %s gate of %s",
                wf->gate_point == PDGW_GATE_BEFORE_PREFILL ? "prefill" : "decode", protocol_of(wf));
            wf_fail(wf, &e, NULL);
        }
        return;
    }
    for (k = 0; k < 2; k++) {
        pdgw_leg_t *leg = &wf->legs[k];
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
        pdgw_gateway_metrics_upstream_error(srv->opts.metrics, protocol_of(wf), leg->inst->id,
                                            "timeout");
        wf_leg_error(wf, leg, &e);
        wf_fail(wf, &e, leg);
        return;
    }
}

uint64_t pdgw_wf_next_deadline(const pdgw_wf_t *wf)
{
    const pdgw_req_t *r = wf->req;
    const pdgw_server_opts_t *o = &wf->w->srv->opts;
    uint64_t due = UINT64_MAX;
    int k;

    if (wf->stage == PDGW_WF_WAIT) /* admission queue or retry backoff (pdgw_admit_req.c) */
        return wf->quota_waiting   ? wf->quota_deadline_ms
               : wf->admit_waiting ? wf->admit.deadline_ms
                                   : wf->retry_at_ms;
    if (wf->stage == PDGW_WF_FINISHED)
        return UINT64_MAX;
    if (wf->rt != NULL && wf->rt->leg != NULL && wf->rt->leg->state == PDGW_LEG_RUNNING)
        return wf->rt->t_deadline_ms; /* route: waiting for the prompt's tokens */
    due = r->deadline_ms;
    if (wf->stage == PDGW_WF_GATE)
        return wf->gate_deadline_ms < due ? wf->gate_deadline_ms : due;
    for (k = 0; k < 2; k++) {
        const pdgw_leg_t *leg = &wf->legs[k];
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

void pdgw_wf_on_wake(pdgw_wf_t *wf)
{
    pdgw_gate_point_t point = wf->gate_point;
    if (pdgw_admit_req_on_wake(wf)) /* admission granted (pdgw_admit_req.c) */
        return;
    if (wf->stage != PDGW_WF_GATE)
        return;
    if (!wf_gate(wf, point))
        return;
    if (point == PDGW_GATE_BEFORE_PREFILL)
        wf_run_first_stage(wf);
    else
        wf_run_decode_stage(wf);
}

void pdgw_wf_cancel(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    if (wf->stage == PDGW_WF_FINISHED || wf->stage == PDGW_WF_NONE) {
        if (wf->attempt_live)
            wf_attempt_end(wf, PDGW_END_CANCELLED);
        pdgw_wf_set_finished(wf);
        return;
    }
    pdgw_req_error_set(r, "client disconnected");
    wf_attempt_end(wf, PDGW_END_CANCELLED);
    pdgw_wf_set_finished(wf);
}

bool pdgw_wf_running(const pdgw_wf_t *wf)
{
    return wf->stage != PDGW_WF_FINISHED && wf->stage != PDGW_WF_NONE;
}

void pdgw_wf_stop(pdgw_wf_t *wf)
{
    pdgw_wf_cancel(wf);
    pdgw_admit_req_done(wf); /* the admission slot or queue place, exactly once */
    if (wf->waker) {
        pdgw_waker_detach(wf->waker);
        wf->waker = NULL;
    }
    sched_booking_destroy(&wf->booking);
}

static void wf_leg_drained(void *arg)
{
    pdgw_leg_unpause(arg);
}

/* The client is PDGW_OUT_HIGH_WATER behind: the relayed leg waits until it drained. */
static bool wf_leg_hold(pdgw_leg_t *leg)
{
    pdgw_req_t *r = leg->wf->req;
    if (pdgw_req_out_writable(r))
        return false;
    pdgw_req_on_drain(r, wf_leg_drained, leg);
    return true;
}

void pdgw_wf_leg_moved(pdgw_leg_t *leg)
{
    pdgw_req_timer_update(leg->wf->req);
}

const pdgw_leg_owner_t pdgw_wf_leg_owner = {.on_event = wf_relay_event,
                                            .on_done = wf_leg_done,
                                            .hold = wf_leg_hold,
                                            .moved = pdgw_wf_leg_moved};
