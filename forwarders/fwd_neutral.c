/*
 * fwd_neutral.c - the `neutral` forwarder: a plain proxy to one `both` instance.
 *
 * Single-stage dispatch: the client body goes unchanged to one instance that does prefill
 * and decode itself. No options, no state. It is the baseline for the gateway's own
 * overhead and the smallest example of the forwarder API.
 */
#include <pdgw/forwarder.h>

static pdgw_fwd_status_t fwd_neutral_build_leg(void *ctx, void *state,
                                               const pdgw_fwd_request_t *req, pdgw_leg_kind_t kind,
                                               const pdgw_fwd_peers_t *peers, pdgw_fwd_leg_t *leg,
                                               pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)state;
    (void)kind;
    (void)peers;
    (void)req;
    (void)err;
    /* The engine gets exactly what the client sent: no re-encoding. */
    leg->client_body = 1;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t fwd_neutral_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan,
                                          char *err, size_t errlen)
{
    (void)ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = PDGW_DISPATCH_SINGLE;
    plan->single_role = PDGW_FWD_ROLE_BOTH;
    plan->single_needs_prefill = 0;
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t fwd_neutral_ops = {
    .plan = fwd_neutral_plan,
    .build_leg = fwd_neutral_build_leg,
};

static const pdgw_fwd_desc_t fwd_neutral_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = "neutral",
    .summary = "plain proxy to one instance that does prefill and decode (no PD)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SINGLE,
    .ops = &fwd_neutral_ops,
    .body_unread = 1,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_neutral_desc)
