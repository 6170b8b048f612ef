/*
 * fwd_example.c - a PD forwarder plugin built outside pdgw's tree against the installed SDK
 * (forwarders/README.md):
 *   cc -shared -fPIC $(pkg-config --cflags pdgw) -o fwd_example.so fwd_example.c
 *   pdgw --plugin ./fwd_example.so --protocol example-pd --prefill URL --decode URL
 * Two-stage serial, in the shape of vLLM's disaggregated proxy: the prefill leg asks for
 * do_remote_decode, the decode leg carries what the prefill answered in kv_transfer_params.
 * Option `leg_header` ("Name: value") adds one header to both legs.
 */
#include <stdio.h>

#include <pdgw/forwarder.h>

typedef struct example_ctx {
    char leg_header[200];
} example_ctx_t; /* filled from protocol_options by the table below */

typedef struct example_state {
    json_t *kvp; /* the prefill's kv_transfer_params, kept in the attempt arena */
} example_state_t;

static const pdgw_fwd_option_t example_options[] = {
    PDGW_FWD_OPT_STR(example_ctx_t, leg_header, "", "header line added to both legs"),
    PDGW_FWD_OPT_END,
};

static pdgw_fwd_status_t example_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                           pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                           pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    const example_ctx_t *c = ctx;
    const example_state_t *s = state;

    if (kind == PDGW_LEG_PREFILL)
        leg->body = pdgw_fwd_body_prefill_kvp(req, json_pack("{s:b}", "do_remote_decode", 1));
    else
        leg->body = pdgw_fwd_body_decode_kvp(req, json_deep_copy(s->kvp));
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    if (c->leg_header[0] != '\0')
        snprintf(leg->headers[leg->n_headers++], sizeof(leg->headers[0]), "%s", c->leg_header);
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t example_on_prefill(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                            long status, const json_t *resp, pdgw_fwd_error_t *err)
{
    example_state_t *s = state;
    json_t *kvp = pdgw_fwd_resp_kvp(resp);

    if (kvp == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 502, "prefill sent no kv_transfer_params");
        return PDGW_FWD_ERR;
    }
    s->kvp = pdgw_fwd_keep(req, json_incref(kvp));
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t example_ops = {
    .build_leg = example_build_leg,
    .on_prefill_response = example_on_prefill,
};

static const pdgw_fwd_desc_t example_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = "example-pd",
    .summary = "example serial PD forwarder (out-of-tree plugin)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &example_ops,
    .ctx_size = sizeof(example_ctx_t),
    .options = example_options,
    .state_size = sizeof(example_state_t),
};
PDGW_FORWARDER_REGISTER(example_desc)
