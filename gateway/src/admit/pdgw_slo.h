/*
 * pdgw_slo.h - latency targets of a request (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms as
 * llm-d's router names them, or their older names x-slo-ttft-ms, x-slo-tpot-ms; else the
 * config's defaults per API key and per model) and the early refusal of what the fleet
 * cannot serve in time (slo_policy: reject), from the scheduler's latency models.
 */
#ifndef PDGW_SLO_H
#define PDGW_SLO_H

#include <stdbool.h>
#include <stdint.h>

#include "pdgw_config.h"

struct pdgw_wf;
struct pdgw_req;

typedef struct pdgw_slo_target {
    uint32_t ttft_ms; /* 0 = none */
    uint32_t tpot_ms;
} pdgw_slo_target_t;

/* What the config says of SLOs (defaults, per model, the policy), parsed once; owned. */
typedef struct pdgw_slo_config pdgw_slo_config_t;

/* "TTFT[:TPOT]", each a duration ("500ms", "2s", or seconds); either may be 0 = none. */
pdgw_status_t pdgw_slo_parse_target(const char *text, pdgw_slo_target_t *out);
/* From cfg's slo_ttft, slo_tpot, slo_models, slo_keys, slo_policy, slo_reject_margin_percent. NULL
 * out when nothing is configured (no defaults, best effort): requests' own headers still count. */
pdgw_status_t pdgw_slo_config_create(const pdgw_config_t *cfg, pdgw_slo_config_t **out, char *err,
                                     size_t errlen);
void pdgw_slo_config_destroy(pdgw_slo_config_t *c);

/* The request's targets (its headers, else its API key's defaults, else its model's, else
 * the global ones) into wf; with slo_policy: reject, a request whose best predicted time misses its
 * target by more than the margin is answered 429 slo_unattainable with a Retry-After. Malformed
 * headers get 400 naming the header. False when <wf>'s request was answered here. */
bool pdgw_slo_req_enter(struct pdgw_wf *wf);

/* The request's attainment for the per-model metric: "met", "missed_ttft", "missed_tpot",
 * "missed_both", or NULL when it had no target or did not succeed. */
const char *pdgw_slo_result(const struct pdgw_wf *wf, const struct pdgw_req *r, int status);

#endif /* PDGW_SLO_H */
