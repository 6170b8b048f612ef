/*
 * pdgw_pd_decide.c - selective PD: does this request need its prefill leg?
 *
 * A prefill leg pays a second scheduling, a KV transfer and a second queue; for a short
 * prompt, or for a decode that already holds most of the prompt in its prefix cache, the
 * decode computes the rest faster by itself. Upstream routers decide the same way:
 *   llm-d   pkg/plugins/profile/prefix_based_pd_decider.go (llm-d-inference-scheduler):
 *           parameter nonCachedTokens; a prompt shorter than it, or whose part the chosen
 *           decode does not hold is shorter than it, runs the decode profile only;
 *   vLLM's router and SGLang's model gateway: a threshold of uncached prompt tokens below
 *           which the request is not disaggregated.
 * pdgw's options:
 *   pd_min_prompt_tokens    like nonCachedTokens: prompt tokens (the engine's count when
 *                           the request was tokenized, else the estimate), and the part the
 *                           booked decode does not hold (precise-prefix KV events);
 *   pd_skip_cached_percent  the booked decode holds at least this share of the prompt.
 * A decode-only request is the client's body sent unchanged to the decode instance, which
 * computes the prompt itself (it is a full vLLM/SGLang server; its connector sees no
 * kv_transfer_params and loads nothing).
 */
#include <stdio.h>
#include <strings.h>

#include "pdgw_route.h"
#include "pdgw_route_int.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

const char *pdgw_pd_decision_name(pdgw_pd_decision_t d)
{
    switch (d) {
    case PDGW_PD_SKIP_SHORT:
        return "short";
    case PDGW_PD_SKIP_CACHED:
        return "cached";
    default:
        return "pd";
    }
}

/* The prompt's length in tokens: the engine's when known, else the estimate. */
static uint64_t prompt_tokens(const pdgw_wf_t *wf, const sched_request_t *sr)
{
    const pdgw_req_t *r = wf->req;
    if (sr->tokens && sr->n_tokens)
        return sr->n_tokens;
    if (r->info_valid && r->info.est_prompt_tokens > 0)
        return (uint64_t)r->info.est_prompt_tokens;
    return 0;
}

pdgw_pd_decision_t pdgw_pd_decide_before_book(pdgw_wf_t *wf, const sched_request_t *sr)
{
    const pdgw_routing_t *rt = wf->w->srv->routing;
    uint64_t n;
    if (rt == NULL || rt->o.pd_min_prompt_tokens == 0)
        return PDGW_PD_RUN;
    n = prompt_tokens(wf, sr);
    if (n == 0) /* nothing known about the prompt: keep the configured protocol */
        return PDGW_PD_RUN;
    return n < rt->o.pd_min_prompt_tokens ? PDGW_PD_SKIP_SHORT : PDGW_PD_RUN;
}

pdgw_pd_decision_t pdgw_pd_decide_after_book(pdgw_wf_t *wf, const sched_request_t *sr,
                                             sched_instance_t *decode)
{
    const pdgw_routing_t *rt = wf->w->srv->routing;
    size_t cached = 0;
    uint64_t n;

    if (rt == NULL || decode == NULL ||
        (rt->o.pd_min_prompt_tokens == 0 && rt->o.pd_skip_cached_percent == 0))
        return PDGW_PD_RUN;
    n = prompt_tokens(wf, sr);
    if (n == 0 || !sched_kvev_cached_tokens(wf->w->srv->opts.pool, sr, decode, &cached))
        return PDGW_PD_RUN;
    if (cached > n)
        cached = n;
    if (rt->o.pd_skip_cached_percent > 0 && cached * 100u >= n * rt->o.pd_skip_cached_percent)
        return PDGW_PD_SKIP_CACHED;
    if (rt->o.pd_min_prompt_tokens > 0 && cached > 0 && n - cached < rt->o.pd_min_prompt_tokens)
        return PDGW_PD_SKIP_CACHED;
    return PDGW_PD_RUN;
}

void pdgw_pd_count(pdgw_wf_t *wf, pdgw_pd_decision_t d)
{
    pdgw_routing_t *rt = wf->w->srv->routing;
    pdgw_req_route_t *q;
    if (d == PDGW_PD_RUN)
        return;
    q = pdgw_route_req(wf);
    if (q)
        q->pd = d;
    if (rt && rt->pd_skipped)
        pdgw_counter_inc(pdgw_metric_family_series1(rt->pd_skipped, pdgw_pd_decision_name(d)));
}

bool pdgw_pd_decode_only(const pdgw_wf_t *wf)
{
    return wf->rt != NULL && wf->rt->pd != PDGW_PD_RUN;
}

/* vllm-project/vllm vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank reads
 * X-data-parallel-rank (any case) and sends the request to that engine core. */
void pdgw_route_dp_header(const pdgw_instance_t *inst, pdgw_fwd_leg_t *fl)
{
    if (inst == NULL || inst->dp_size <= 1 || fl->n_headers >= PDGW_FWD_LEG_MAX_HEADERS)
        return;
    for (size_t i = 0; i < fl->n_headers; i++)
        if (strncasecmp(fl->headers[i], "X-data-parallel-rank:", 21) == 0)
            return;
    snprintf(fl->headers[fl->n_headers++], sizeof(fl->headers[0]), "X-data-parallel-rank: %d",
             inst->dp_rank);
}
