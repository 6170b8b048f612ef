/*
 * pdgw_route.h - what the gateway learns about a request before it books instances.
 *
 *   pdgw_tokenize.c   the prompt's token ids, asked of an engine's POST /tokenize (vLLM's
 *                     shape) on a leg of its own, bounded in time and cached by prompt hash,
 *                     so the precise-prefix policy can match a text prompt against the
 *                     engines' KV events. Slow or failed: the request is routed without.
 *   pdgw_pd_decide.c  selective PD: whether a request of a two-leg protocol needs its
 *                     prefill leg at all (short prompt, or the booked decode already holds
 *                     most of it), else it goes decode-only.
 *
 * The workflow calls the hooks below at marked places; the state lives in the server
 * (pdgw_routing_t) and in the request (pdgw_req_route_t).
 */
#ifndef PDGW_ROUTE_H
#define PDGW_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <pdgw/forwarder.h>
#include <pdsched/sched.h>

#include "pdgw_config.h" /* pdgw_kv_list_t */
#include "pdgw_metrics.h"
#include "pdgw_server.h" /* pdgw_route_opts_t */
#include "pdgw_util.h"

typedef struct pdgw_req pdgw_req_t;
typedef struct pdgw_wf pdgw_wf_t;
typedef struct pdgw_leg pdgw_leg_t;
typedef struct pdgw_worker pdgw_worker_t;

typedef struct pdgw_routing pdgw_routing_t;

/* Per server. <want_tokens>: a policy matches token ids (precise-prefix), so text prompts
 * are tokenized before routing. Families are added to <reg>. */
pdgw_status_t pdgw_route_create(const pdgw_route_opts_t *o, bool want_tokens, pdgw_metrics_t *reg,
                                pdgw_routing_t **out);
void pdgw_route_destroy(pdgw_routing_t *rt);
/* --check-config: load each of `tokenizers` (MODEL -> PATH; "engine" skipped) and its chat
 * template, then free them. A tokenizer that does not load is an error naming the model and
 * the path (start-up would only warn and leave that model to its engine); a chat template
 * that does not render is written to <warn> (when not NULL) and is not an error. */
pdgw_status_t pdgw_tokenizers_check(const pdgw_kv_list_t *list, FILE *warn, char *err,
                                    size_t errlen);

/* Apply `tokenizers` on a config reload (pdgw_tokenize_reload.c). */
typedef struct pdgw_reload pdgw_reload_t;
typedef struct pdgw_server pdgw_server_t;
pdgw_status_t pdgw_tokenize_reload_register(pdgw_server_t *srv, pdgw_reload_t *rl);

/* Reasons a request went decode-only. */
typedef enum {
    PDGW_PD_RUN = 0,        /* both legs */
    PDGW_PD_SKIP_SHORT,     /* prompt below pd_min_prompt_tokens */
    PDGW_PD_SKIP_CACHED,    /* the booked decode holds most of the prompt */
    PDGW_PD_SKIP_PREDICTED, /* the latency models: sooner without the prefill leg */
} pdgw_pd_decision_t;

const char *pdgw_pd_decision_name(pdgw_pd_decision_t d);

/* Per request (owned by the request, freed by pdgw_route_req_release). */
typedef struct pdgw_req_route {
    /* tokenization */
    pdgw_leg_t *leg; /* the /tokenize leg while it runs */
    pdgw_instance_t inst;
    sched_instance_t *si; /* referenced while the leg lives */
    uint64_t t_deadline_ms;
    uint64_t key[2];  /* prompt hash */
    uint32_t *tokens; /* the prompt's ids, when known */
    size_t n_tokens;
    /* selective PD */
    pdgw_pd_decision_t pd;
    /* this request only owns a KV release leg (pdgw_kv_release.c) */
    bool release;
    const char *release_reason;
} pdgw_req_route_t;

/* ---- hooks called by the workflow (pdgw_workflow.c) ---- */

/* Enter phase (before admission): a model with its own tokenizer (`tokenizers`) gets its
 * prompt's ids now, and r->info.est_prompt_tokens becomes their count, so latency targets,
 * budgets and load weigh the real prompt. Always true (a prompt it cannot tokenize goes on). */
bool pdgw_tokenize_enter(pdgw_wf_t *wf);
/* Before the first attempt. true: a tokenize leg was started, the workflow waits and is
 * resumed by pdgw_wf_start_attempt(); false: go on now (tokens from the cache or none). */
bool pdgw_tokenize_begin(pdgw_wf_t *wf);
/* <leg> ended: true when it was the tokenize leg (handled, the workflow resumed). */
bool pdgw_tokenize_leg_done(pdgw_wf_t *wf, pdgw_leg_t *leg);
/* Periodic: true while the request still waits for its tokens (nothing else to check). */
bool pdgw_tokenize_check_deadline(pdgw_wf_t *wf, uint64_t now_ms);
/* The ids learnt for <wf> (NULL when none). */
const uint32_t *pdgw_route_tokens(const pdgw_wf_t *wf, size_t *n_out);
/* Free the request's route state (aborts a running tokenize leg). */
void pdgw_route_req_release(pdgw_wf_t *wf);

/* Selective PD before booking: PDGW_PD_SKIP_SHORT or PDGW_PD_RUN. */
pdgw_pd_decision_t pdgw_pd_decide_before_book(pdgw_wf_t *wf, const sched_request_t *sr);
/* After a PD booking: PDGW_PD_SKIP_CACHED when the booked decode holds enough,
 * PDGW_PD_SKIP_PREDICTED when its predicted first token comes sooner without the prefill. */
pdgw_pd_decision_t pdgw_pd_decide_after_book(pdgw_wf_t *wf, const sched_request_t *sr,
                                             const sched_booking_t *booking);
/* The rule of PDGW_PD_SKIP_PREDICTED on one prediction: decode-only is sooner and the
 * prompt's work on the decode stalls its running requests by at most their TPOT slack
 * (<tpot_target_ms> - the TPOT now; without a target, the TPOT now). */
bool pdgw_pd_predicted_skip(const sched_pd_prediction_t *p, uint32_t tpot_target_ms);
/* Record a decision taken for <wf> and count it (pdgw_pd_skipped_total{reason}). */
void pdgw_pd_count(pdgw_wf_t *wf, pdgw_pd_decision_t d);
/* The request goes decode-only (a skip was recorded). */
bool pdgw_pd_decode_only(const pdgw_wf_t *wf);

/* No stranded KV (pdgw_kv_release.c). An attempt of <wf> ends for <reason>: when its prefill
 * answered and its decode never reached an engine, a decode engine is asked to take the
 * prefill's KV now (pdgw_kv_release_total{reason,result}). Call before the forwarder's
 * attempt state is cleaned up. */
void pdgw_kv_release_attempt_end(pdgw_wf_t *wf, pdgw_end_reason_t reason);
/* Is the prefill's KV still held for another decode after the decode leg <d> of <wf> ended?
 * Always for protocols whose prefill does not hold KV for a decode; for vllm-nixl /
 * vllm-mooncake only when <d> never reached a decode engine (one that answered, even with
 * an error, has had the prefill free the blocks or read them). */
bool pdgw_kv_still_held(const pdgw_wf_t *wf, const pdgw_leg_t *d);
/* <leg> of <wf> ended: true when it was a release leg (handled, <wf> freed). */
bool pdgw_kv_release_leg_done(pdgw_wf_t *wf, pdgw_leg_t *leg);
/* Periodic: true when <wf> only owns a release leg (its deadline checked; <wf> may be freed). */
bool pdgw_kv_release_check_deadline(pdgw_wf_t *wf, uint64_t now_ms);
/* Worker shutdown: free every release still running on <w>. */
void pdgw_kv_release_drop_all(pdgw_worker_t *w);

/* A leg to one rank of a data-parallel engine (dp_size > 1) names the rank in
 * X-data-parallel-rank (vLLM's header) unless the forwarder already did: the instance the
 * policy chose is that rank, whose KV events said what it holds. */
void pdgw_route_dp_header(const pdgw_instance_t *inst, pdgw_fwd_leg_t *fl);

/* The workflow's entry after the tokens are known (or given up). */
void pdgw_wf_start_attempt(pdgw_wf_t *wf);

struct pdgw_server;
/* The server hooks (pdgw_phases.h): srv->routing made from srv->opts.route / destroyed. */
pdgw_status_t pdgw_route_server_start(struct pdgw_server *srv, char *err, size_t errlen);
void pdgw_route_server_stop(struct pdgw_server *srv);

#endif /* PDGW_ROUTE_H */
