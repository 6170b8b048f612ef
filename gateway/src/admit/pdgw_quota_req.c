/*
 * pdgw_quota_req.c - tenants' budgets and fair queuing in the request path (the quota layer,
 * libpdquota, behind srv->opts.quota).
 *
 *   enter:  tenant of the API key -> pdq_admit with an estimate (prompt: the tokenizer's or
 *           the body's count; output: max_tokens, else quota.output_estimate, times n)
 *           refused: 429 rate_limited | tokens_exhausted | queue_full, 503
 *           quota_store_unavailable, with Retry-After and x-ratelimit-* headers
 *           queued:  stage WAIT until the fair queue grants a slot (its thread sets
 *                    quota_ready and wakes the worker) or the wait times out
 *   done:   the engine's usage (or what was relayed) reconciles the estimate, phase times go
 *           to usage accounting, the slot is released: exactly once, in finalize.
 *
 * A stream whose client did not ask for usage gets stream_options.include_usage on its
 * decode leg (pdgw_quota_usage_leg) and the usage chunk is kept from the client
 * (pdgw_quota_hide_event): a budget needs the real counts.
 */
#include <string.h>
#include <strings.h>

#include "pdgw_auth.h"
#include "pdgw_log.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"
#include "pdquota/pdquota.h"

/* The tenant's name for labels and logs, "" without tenants. */
const char *pdgw_quota_tenant_name(const pdgw_wf_t *wf)
{
    pdq_t *q;
    if (wf == NULL || !wf->quota_tenant_set || (q = wf->w->srv->opts.quota) == NULL)
        return "";
    return pdq_tenant_name(q, wf->quota_tenant);
}

static void on_ready(pdq_ticket_t *t, void *arg)
{
    /* The quota layer's lock is held, on whichever thread freed a slot: flag and wake. */
    pdgw_wf_t *wf = arg;
    (void)t;
    atomic_store(&wf->quota_ready, true);
    pdgw_fwd_waker_wake(wf->waker);
}

static uint64_t estimate_completion(const pdgw_req_t *r, int fallback)
{
    const pdgw_request_info_t *in = &r->info;
    uint64_t per = in->max_tokens >= 0 ? (uint64_t)in->max_tokens : (uint64_t)fallback;
    uint64_t n = in->n > 1 ? (uint64_t)in->n : 1;
    uint64_t prompts = in->n_prompts > 1 ? in->n_prompts : 1;
    return per * n * prompts;
}

static void refuse(pdgw_wf_t *wf, const pdq_verdict_t *v)
{
    pdgw_req_t *r = wf->req;
    pdgw_api_error_t e;
    const char *code = pdq_code_name(v->code);
    const char *tenant = pdgw_quota_tenant_name(wf);
    if (v->http_status == 503) {
        pdgw_api_error_set(&e, PDGW_API_ERR_UNAVAILABLE, NULL,
                           "The quota store is unreachable and the gateway is configured to "
                           "refuse meanwhile (quota.fail_mode: closed); retry later.");
    } else if (v->code == PDQ_CODE_TOKENS_EXHAUSTED) {
        pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL,
                           "Token budget of tenant '%s' exhausted; retry later.", tenant);
    } else if (v->code == PDQ_CODE_QUEUE_FULL) {
        pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL,
                           "Too many requests of tenant '%s' are waiting; retry later.", tenant);
    } else {
        pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL,
                           "Request rate limit of tenant '%s' exceeded; retry later.", tenant);
    }
    pdgw_api_error_set_code(&e, code);
    pdgw_gateway_metrics_rejected(wf->w->srv->opts.metrics, "quota");
    pdgw_req_reply_error(r, &e);
}

bool pdgw_quota_req_enter(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    const pdgw_server_opts_t *o = &wf->w->srv->opts;
    pdq_t *q = o->quota;
    char key[PDGW_AUTH_KEY_MAX + 1];
    const char *k, *model;
    size_t len;
    uint64_t est_prompt, now;
    pdq_verdict_t v;
    uint64_t deadline = 0;
    pdq_status_t st;

    if (q == NULL || (r->route != PDGW_ROUTE_INFER && r->route != PDGW_ROUTE_PASSTHROUGH))
        return true;
    k = pdgw_req_bearer(r, &len);
    if (k != NULL && len <= PDGW_AUTH_KEY_MAX) {
        memcpy(key, k, len);
        key[len] = '\0';
    } else {
        key[0] = '\0';
    }
    wf->quota_tenant = (uint32_t)pdq_tenant_by_key(q, key);
    wf->quota_tenant_set = true;
    if (r->route == PDGW_ROUTE_INFER) {
        model = r->info.model;
        est_prompt = r->info.est_prompt_tokens > 0 ? (uint64_t)r->info.est_prompt_tokens : 1;
    } else {
        model = wf->pt_model;
        est_prompt = r->body.len / 4 + 1;
    }
    wf->quota_est_prompt = est_prompt;
    if (wf->waker == NULL)
        wf->waker = pdgw_waker_create(wf->w, wf, r->job->wake);
    if (wf->waker == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return false;
    }
    atomic_store(&wf->quota_ready, false);
    /* admission_order: slo_deadline orders each tenant's waiters by arrival + TTFT target */
    if (o->admit != NULL && wf->slo_ttft_ms > 0) {
        pdgw_admit_limits_t l;
        pdgw_admit_get_path_limits(o->admit, &l);
        if (l.by_slo_deadline)
            deadline = r->t_start_ms + wf->slo_ttft_ms;
    }
    st = pdq_admit_deadline(q, wf->quota_tenant, model, est_prompt,
                            r->route == PDGW_ROUTE_INFER
                                ? estimate_completion(r, o->quota_output_estimate)
                                : (uint64_t)o->quota_output_estimate,
                            deadline, on_ready, wf, &wf->quota, &v);
    wf->quota_headers = v.headers;
    /* a stream is asked for its usage when the client did not ask: the budget needs it */
    wf->quota_hide_usage = r->route == PDGW_ROUTE_INFER && r->info.stream && !r->info.include_usage;
    switch (st) {
    case PDQ_OK:
        return true;
    case PDQ_WAIT:
        now = pdgw_now_ms();
        wf->quota_waiting = true;
        wf->quota_deadline_ms = r->deadline_ms;
        if (o->admit != NULL) {
            pdgw_admit_limits_t l;
            pdgw_admit_get_path_limits(o->admit, &l);
            if (l.queue_timeout_ms > 0 && now + l.queue_timeout_ms < wf->quota_deadline_ms)
                wf->quota_deadline_ms = now + l.queue_timeout_ms;
        }
        wf->stage = PDGW_WF_WAIT;
        pdgw_worker_active_add(wf->w, r);
        pdgw_req_timer_update(r); /* fires at the wait's deadline (pdgw_wf_next_deadline) */
        return false;
    case PDQ_REFUSED:
        wf->quota = NULL;
        wf->quota_hide_usage = false;
        refuse(wf, &v);
        return false;
    default:
        wf->quota = NULL;
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return false;
    }
}

int pdgw_quota_req_on_wake(pdgw_wf_t *wf)
{
    if (!wf->quota_waiting)
        return -1;
    if (!atomic_load(&wf->quota_ready))
        return 0; /* a wake for something else, or stale */
    wf->quota_waiting = false;
    pdgw_worker_active_remove(wf->w, wf->req);
    wf->stage = PDGW_WF_NONE;
    return 1;
}

bool pdgw_quota_req_check(pdgw_wf_t *wf, uint64_t now)
{
    pdgw_req_t *r = wf->req;
    pdgw_api_error_t e;
    if (!wf->quota_waiting)
        return false;
    if (now < wf->quota_deadline_ms)
        return true;
    /* false: the grant raced the deadline and the ticket was released; refused all the same */
    (void)pdq_cancel(wf->quota);
    wf->quota = NULL;
    wf->quota_waiting = false;
    wf->quota_hide_usage = false;
    wf->stage = PDGW_WF_FINISHED;
    pdgw_worker_active_remove(wf->w, r);
    r->reply_retry_after_s = 1;
    pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL,
                       "Too many requests: timed out waiting for tenant '%s''s share; retry "
                       "later.",
                       pdgw_quota_tenant_name(wf));
    pdgw_api_error_set_code(&e, "queue_timeout");
    pdgw_req_reply_error(r, &e);
    return true;
}

/* The KV a PD request handed from its prefill to its decode: the prompt's tokens times the
 * model's kv_bytes_per_token. An upper bound: blocks the decode held already are not pulled,
 * and no engine tells the proxy which (a decode's own cached_tokens counts the pulled ones
 * too). 0 without that figure, or when no prefill answered (decode-only). */
static uint64_t kv_bytes_moved(const pdgw_wf_t *wf, uint64_t prompt)
{
    const pdgw_server_opts_t *o = &wf->w->srv->opts;
    const char *model = wf->req->info_valid ? wf->req->info.model : wf->pt_model;
    if (wf->t_prefill_done_ms == 0 || model == NULL || prompt == 0)
        return 0;
    for (size_t i = 0; i < o->n_kv_bpt; i++) {
        if (strcmp(o->kv_bpt_models[i], model) == 0)
            return prompt * o->kv_bpt[i];
    }
    return 0;
}

void pdgw_quota_req_done(pdgw_wf_t *wf)
{
    pdq_ticket_t *t = wf->quota;
    uint64_t prompt, cached, completion;
    if (t == NULL)
        return;
    wf->quota = NULL;
    if (wf->quota_waiting) {
        wf->quota_waiting = false;
        (void)pdq_cancel(t); /* the client left while it waited: refunded */
        return;
    }
    if (wf->usage_seen) {
        prompt = wf->usage_prompt > 0 ? (uint64_t)wf->usage_prompt : 0;
        completion = wf->usage_completion > 0 ? (uint64_t)wf->usage_completion : 0;
        /* what the prefill found cached is what it did not compute */
        cached = wf->prefill_usage_seen ? (uint64_t)wf->prefill_cached
                                        : (uint64_t)(wf->usage_cached > 0 ? wf->usage_cached : 0);
        if (cached > prompt)
            cached = prompt;
    } else if (wf->t_first_token_ns != 0) {
        /* cut short before the engine's usage: what was relayed */
        prompt = wf->quota_est_prompt;
        cached = 0;
        completion = (uint64_t)wf->n_later_events + 1;
    } else {
        prompt = cached = completion = 0; /* nothing was produced: nothing is charged */
    }
    pdq_reconcile(t, prompt, cached, completion);
    pdq_ticket_kv_bytes(t, kv_bytes_moved(wf, prompt));
    pdq_ticket_phase(t, PDQ_PHASE_PREFILL, wf->t_prefill_us * 1000u);
    pdq_ticket_phase(t, PDQ_PHASE_TRANSFER, wf->t_kv_wait_us * 1000u);
    pdq_ticket_phase(t, PDQ_PHASE_DECODE, wf->t_decode_us * 1000u);
    pdq_release(t);
}

void pdgw_quota_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o)
{
    const pdgw_wf_t *wf = r->wf;
    (void)kind;
    if (wf == NULL || !wf->quota_tenant_set)
        return;
    for (size_t i = 0; i < wf->quota_headers.n && i < PDQ_MAX_HEADERS; i++) {
        const pdq_header_t *h = &wf->quota_headers.h[i];
        /* a refusal's Retry-After may be the reply's own already */
        if (r->reply_retry_after_s > 0 && strcasecmp(h->name, "retry-after") == 0)
            continue;
        pdgw_hdr_add(o, h->name, h->value);
    }
}

json_t *pdgw_quota_usage_leg(pdgw_wf_t *wf, json_t *body)
{
    json_t *so, *copy;
    if (!wf->quota_hide_usage || body == NULL)
        return body;
    so = json_object_get(body, "stream_options");
    copy = json_is_object(so) ? json_copy(so) : json_object();
    if (copy != NULL && json_object_set_new(copy, "include_usage", json_true()) != 0) {
        json_decref(copy);
        copy = NULL;
    }
    /* set_new takes <copy> whatever it returns */
    if (copy == NULL || json_object_set_new(body, "stream_options", copy) != 0)
        wf->quota_hide_usage = false; /* reconciled from what is relayed instead */
    return body;
}

bool pdgw_quota_hide_event(const pdgw_wf_t *wf, const char *data, size_t len, bool had_usage)
{
    /* The usage-only chunk the engine adds last: "choices" empty, "usage" an object. */
    return wf->quota_hide_usage && had_usage && memmem(data, len, "\"choices\":[]", 12) != NULL;
}
