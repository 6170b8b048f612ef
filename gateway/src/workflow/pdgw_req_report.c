/*
 * pdgw_req_report.c - what is told of a finished request: its access log line (pdgw_log.h
 * writes it) and its spans (pdgw_otel.h), with what its workflow measured. A finish hook
 * (pdgw_phases.h).
 */
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

#include "pdgw_otel.h"
#include "pdgw_slo.h"

#include <arpa/inet.h>
#include <string.h>

/* "a.b.c.d" or the IPv6 text of the peer's address; NULL when unknown. */
static const char *client_addr_text(const pdgw_req_t *r, char *out, size_t len)
{
    const void *addr = NULL;
    if (r->client_addr.sa.sa_family == AF_INET)
        addr = &r->client_addr.in.sin_addr;
    else if (r->client_addr.sa.sa_family == AF_INET6)
        addr = &r->client_addr.in6.sin6_addr;
    if (addr == NULL || inet_ntop(r->client_addr.sa.sa_family, addr, out, (socklen_t)len) == NULL)
        return NULL;
    return out;
}

static void access_log(const pdgw_req_t *r, int status, bool disconnected, uint64_t now_ns)
{
    const pdgw_wf_t *wf = r->wf; /* what the workflow measured, NULL = none */
    pdgw_access_entry_t a;
    char addr[INET6_ADDRSTRLEN];
    pdgw_access_entry_init(&a);
    a.request_id = r->id;
    a.method = r->method;
    a.client_addr = client_addr_text(r, addr, sizeof(addr));
    a.path = r->path;
    a.protocol = r->w->srv->desc->name;
    a.model = r->info_valid ? r->info.model : wf ? wf->pt_model : NULL;
    a.prefill_instance = wf && wf->prefill_id[0] ? wf->prefill_id : NULL;
    a.decode_instance = wf && wf->decode_id[0] ? wf->decode_id : NULL;
    a.error = pdgw_req_error(r)[0] ? pdgw_req_error(r) : NULL;
    a.status = status;
    a.retries = wf ? wf->attempt : 0;
    a.stream = r->info_valid && r->info.stream;
    a.client_disconnected = disconnected;
    a.total_us = (int64_t)((now_ns - r->t_start_ns) / 1000u);
    if (wf && wf->t_first_token_ns)
        a.ttft_us = (int64_t)((wf->t_first_token_ns - r->t_start_ns) / 1000u);
    if (wf && wf->t_prefill_us)
        a.prefill_us = (int64_t)wf->t_prefill_us;
    if (wf && wf->t_decode_us)
        a.decode_us = (int64_t)wf->t_decode_us;
    if (wf && wf->pred_first_s > 0.0)
        a.pred_prefill_us = (int64_t)(wf->pred_first_s * 1e6);
    if (wf && wf->pred_tpot_s > 0.0)
        a.pred_tpot_us = (int64_t)(wf->pred_tpot_s * 1e6);
    a.bytes_in = r->body.len;
    if (r->pd_phase != PDGW_PHASE_NONE) {
        a.pd_phase = pdgw_phase_name(r->pd_phase);
        a.pd_retryable = r->pd_retryable;
    }
    if (r->info_valid)
        a.prompt_tokens = r->info.est_prompt_tokens;
    a.bytes_out = r->bytes_out;
    if (wf) {
        a.slo_ttft_ms = wf->slo_ttft_ms;
        a.slo_tpot_ms = wf->slo_tpot_ms;
        a.slo_result = pdgw_slo_result(wf, r, status);
        if (wf->quota_tenant_set) {
            a.tenant = pdgw_quota_tenant_name(wf);
            if (wf->usage_seen) { /* what the tenant is charged */
                a.prompt_tokens = wf->usage_prompt;
                a.completion_tokens = wf->usage_completion;
            }
        }
    }
    pdgw_access_log(&a);
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
    t.cached_prompt_tokens = -1;
    t.start_ns = r->t_start_ns;
    t.end_ns = now_ns;
    if (wf != NULL) {
        t.prefill_instance = wf->prefill_id[0] ? wf->prefill_id : NULL;
        t.decode_instance = wf->decode_id[0] ? wf->decode_id : NULL;
        t.retries = wf->attempt;
        t.slo_ttft_ms = wf->slo_ttft_ms;
        t.slo_tpot_ms = wf->slo_tpot_ms;
        t.slo_result = pdgw_slo_result(wf, r, status);
        if (wf->quota_tenant_set)
            t.tenant = pdgw_quota_tenant_name(wf);
        if (wf->usage_seen) {
            t.prompt_tokens = wf->usage_prompt;
            t.completion_tokens = wf->usage_completion;
            if (wf->quota_tenant_set)
                t.cached_prompt_tokens =
                    wf->prefill_usage_seen ? wf->prefill_cached : wf->usage_cached;
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

void pdgw_req_report_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected,
                            uint64_t now_ns)
{
    (void)dur_s;
    if (pdgw_log_access_enabled())
        access_log(r, status, disconnected, now_ns);
    if (r->route == PDGW_ROUTE_INFER && r->w->srv->opts.otel != NULL)
        req_trace(r, status, now_ns);
}
