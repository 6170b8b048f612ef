/*
 * pdgw_access.c - the access log line of a finished request (pdgw_log.h writes it).
 */
#include "pdgw_server_int.h"

#include "pdgw_log.h"
#include "pdgw_slo.h"

#include <arpa/inet.h>

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

void pdgw_req_access_log(const pdgw_req_t *r, int status, bool disconnected, uint64_t now_ns)
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
    }
    pdgw_access_log(&a);
}
