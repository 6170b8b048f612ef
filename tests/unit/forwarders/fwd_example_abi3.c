/*
 * fwd_example_abi3.c - an out-of-tree forwarder plugin written for forwarder ABI 3 (no
 * struct sizes, its own configure/attempt_init/cleanup): a pdgw of a later ABI must keep
 * loading it. The current SDK's example is examples/forwarder/fwd_example.c. Build it as a
 * shared object against gateway/include and load it with
 * `pdgw --plugin ./fwd_example_ok.so --protocol example-serial`.
 *
 * Protocol: two-stage serial. The prefill leg is the hardened prefill body with
 * kv_transfer_params {"do_remote_decode": true}; the prefill response's
 * kv_transfer_params are copied into the decode leg. Option `leg_header` (string) adds
 * that header to both legs.
 *
 * FWD_EXAMPLE_ABI overrides the ABI version so the tests can build a mismatching plugin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdgw/forwarder.h>

#ifndef FWD_EXAMPLE_ABI
#define FWD_EXAMPLE_ABI 3
#endif
#ifndef FWD_EXAMPLE_NAME
#define FWD_EXAMPLE_NAME "example-serial"
#endif

/* Global context: the parsed options. */
typedef struct fwd_example_ctx {
    char leg_header[200];
} fwd_example_ctx_t;

/* Per-attempt state: what the prefill returned. */
typedef struct fwd_example_state {
    json_t *kv_params;
} fwd_example_state_t;

static pdgw_fwd_status_t fwd_example_configure(const json_t *options, const pdgw_fwd_env_t *env,
                                               void **ctx, char *err, size_t errlen)
{
    fwd_example_ctx_t *c;
    const char *key;
    json_t *value;
    (void)env;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR;
    }
    json_object_foreach((json_t *)options, key, value)
    {
        if (strcmp(key, "leg_header") == 0 && json_is_string(value)) {
            snprintf(c->leg_header, sizeof(c->leg_header), "%s", json_string_value(value));
        } else {
            snprintf(err, errlen, "unknown or invalid option '%s'", key);
            free(c);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    *ctx = c;
    return PDGW_FWD_OK;
}

static void fwd_example_destroy(void *ctx)
{
    free(ctx);
}

static pdgw_fwd_status_t fwd_example_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                                  const pdgw_fwd_peers_t *peers, void **state,
                                                  pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)req;
    (void)peers;
    *state = calloc(1, sizeof(fwd_example_state_t));
    if (*state == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t fwd_example_build_leg(void *ctx, void *state,
                                               const pdgw_fwd_request_t *req, pdgw_leg_kind_t kind,
                                               const pdgw_fwd_peers_t *peers, pdgw_fwd_leg_t *leg,
                                               pdgw_fwd_error_t *err)
{
    fwd_example_ctx_t *c = ctx;
    fwd_example_state_t *s = state;
    (void)peers;
    if (kind == PDGW_LEG_PREFILL) {
        leg->body = pdgw_fwd_body_prefill(req);
        if (leg->body)
            json_object_set_new(
                leg->body, "kv_transfer_params",
                json_pack("{s:b,s:b}", "do_remote_decode", 1, "do_remote_prefill", 0));
    } else {
        leg->body = pdgw_fwd_body_copy(req);
        if (leg->body && s->kv_params)
            json_object_set(leg->body, "kv_transfer_params", s->kv_params);
    }
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    if (c->leg_header[0]) {
        snprintf(leg->headers[0], sizeof(leg->headers[0]), "%s", c->leg_header);
        leg->n_headers = 1;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t fwd_example_on_prefill_response(void *ctx, void *state,
                                                         const pdgw_fwd_request_t *req, long status,
                                                         const json_t *resp, pdgw_fwd_error_t *err)
{
    fwd_example_state_t *s = state;
    json_t *kv = json_object_get(resp, "kv_transfer_params");
    (void)ctx;
    (void)status;
    if (!json_is_object(kv)) {
        /* Without them the decode would recompute the prompt: count it, retry elsewhere. */
        pdgw_fwd_counter_inc("example-serial", "prefill_without_kv_params",
                             "Prefill responses without kv_transfer_params.");
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502,
                           "prefill for %s returned no kv_transfer_params", req->request_id);
        return PDGW_FWD_ERR;
    }
    s->kv_params = json_deep_copy(kv);
    return PDGW_FWD_OK;
}

static unsigned fwd_example_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        const pdgw_fwd_error_t *failure)
{
    (void)ctx;
    (void)state;
    (void)req;
    /* The KV lives on the prefill: a decode failure needs a new prefill too. */
    return failure->phase == PDGW_PHASE_PREFILL ? PDGW_REPICK_PREFILL
                                                : PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void fwd_example_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        pdgw_end_reason_t reason)
{
    fwd_example_state_t *s = state;
    (void)ctx;
    (void)req;
    (void)reason;
    json_decref(s->kv_params);
    free(s);
}

static const pdgw_fwd_ops_t fwd_example_ops = {
    .configure = fwd_example_configure,
    .destroy = fwd_example_destroy,
    .attempt_init = fwd_example_attempt_init,
    .build_leg = fwd_example_build_leg,
    .on_prefill_response = fwd_example_on_prefill_response,
    .retry_scope = fwd_example_retry_scope,
    .attempt_cleanup = fwd_example_attempt_cleanup,
};

/* Body fields this protocol's engines would read as PD control (ABI 2): the gateway keeps
 * clients from setting them, like its own list. */
static const char *const fwd_example_client_fields[] = {"example_peer", "example_route_*", NULL};

static const pdgw_fwd_desc_t fwd_example_desc = {
    .abi_version = FWD_EXAMPLE_ABI,
    .name = FWD_EXAMPLE_NAME,
    .summary = "example two-stage serial forwarder (plugin)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &fwd_example_ops,
    .client_fields = fwd_example_client_fields,
};

PDGW_FORWARDER_REGISTER(fwd_example_desc)
