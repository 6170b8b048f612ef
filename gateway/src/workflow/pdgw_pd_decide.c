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
 *   pd_skip_cached_percent  the booked decode holds at least this share of the prompt;
 *   pd_skip_predicted       the scheduler's latency models (learnt from the legs pdgw ran):
 *                           the decode's predicted first token computing the uncached part
 *                           itself comes sooner than the prefill's predicted answer plus the
 *                           KV handoff, and the prompt's work in the decode's steps lengthens
 *                           its running requests' token gap by no more than their TPOT slack.
 *                           A fixed threshold cannot know either: the same prompt is worth
 *                           disaggregating behind an idle prefill and not behind a busy one.
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
    case PDGW_PD_SKIP_PREDICTED:
        return "predicted";
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

bool pdgw_pd_predicted_skip(const sched_pd_prediction_t *p, uint32_t tpot_target_ms)
{
    double slack;
    if (!(p->decode_only_s < p->with_prefill_s))
        return false;
    /* A running request's next token waits for the step that computes the prompt. Without a
     * target, allow that gap to double at most; with one, keep it within the target. */
    slack = tpot_target_ms > 0 ? (double)tpot_target_ms * 1e-3 - p->tpot_s : p->tpot_s;
    return p->stall_s <= slack;
}

/* The static rules: the decode's cached share of the prompt (precise-prefix). */
static pdgw_pd_decision_t decide_cached(pdgw_wf_t *wf, const pdgw_routing_t *rt,
                                        const sched_request_t *sr, sched_instance_t *decode)
{
    size_t cached = 0;
    uint64_t n;

    if (rt->o.pd_min_prompt_tokens == 0 && rt->o.pd_skip_cached_percent == 0)
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

pdgw_pd_decision_t pdgw_pd_decide_after_book(pdgw_wf_t *wf, const sched_request_t *sr,
                                             const sched_booking_t *booking)
{
    const pdgw_routing_t *rt = wf->w->srv->routing;
    sched_instance_t *decode = sched_booking_instance(booking, SCHED_LEG_DECODE);
    sched_pd_prediction_t p;

    if (rt == NULL || decode == NULL || !sched_booking_leg_open(booking, SCHED_LEG_PREFILL))
        return PDGW_PD_RUN;
    if (decide_cached(wf, rt, sr, decode) == PDGW_PD_SKIP_CACHED)
        return PDGW_PD_SKIP_CACHED;
    if (rt->o.pd_skip_predicted && sched_booking_predict_pd(booking, &p) &&
        pdgw_pd_predicted_skip(&p, sr->slo_tpot_ms))
        return PDGW_PD_SKIP_PREDICTED;
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
