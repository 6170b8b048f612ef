/*
 * fwd_vllm_nixl.c - the `vllm-nixl` forwarder (vLLM NixlConnector, PROTOCOLS.md A.2).
 *
 * Two-stage serial in both scheduling modes: the hardened prefill leg carries
 *   kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
 *                         remote_engine_id/remote_block_ids/remote_host/remote_port: null};
 * the prefill answers with the params the decode needs (remote_block_ids, remote_engine_id,
 * remote_request_id, remote_host, remote_port, tp_size), copied verbatim into the decode leg,
 * which pulls the KV (RDMA READ) and tells the prefill to free it.
 *
 * Options: missing_kv_params = recompute (default: the decode computes the prompt itself) |
 * fail (retryable kv_transfer error); kv_params_ttl_ms (480000, the prefill's
 * VLLM_NIXL_ABORT_REQUEST_TIMEOUT): a decode failure re-picks only the decode while the
 * prefill's params are younger than that.
 */
#include "fwd_pd.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NIXL_NAME "vllm-nixl"

typedef struct nixl_ctx {
    int fail_on_missing;
    int64_t params_ttl_ms;
} nixl_ctx_t;

typedef struct nixl_state {
    json_t *kvp; /* from the prefill response; NULL = decode recomputes */
    int64_t t_params_ms;
} nixl_state_t;

static int64_t nixl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pdgw_fwd_status_t nixl_configure(const json_t *options, const pdgw_fwd_env_t *env,
                                        void **ctx, char *err, size_t errlen)
{
    static const char *const known[] = {"missing_kv_params", "kv_params_ttl_ms", NULL};
    static const char *const missing[] = {"recompute", "fail", NULL};
    nixl_ctx_t *c;
    int m = 0;
    int64_t ttl = 0;
    (void)env;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        fwd_pd_opt_enum(options, "missing_kv_params", missing, 0, &m, err, errlen) ||
        fwd_pd_opt_int(options, "kv_params_ttl_ms", 480000, 1, 86400000, &ttl, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    c->fail_on_missing = m == 1;
    c->params_ttl_ms = ttl;
    *ctx = c;
    return PDGW_FWD_OK;
}

static void nixl_destroy(void *ctx)
{
    free(ctx);
}

static pdgw_fwd_status_t nixl_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                   size_t errlen)
{
    (void)ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = PDGW_DISPATCH_SERIAL;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t nixl_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                           const pdgw_fwd_peers_t *peers, void **state,
                                           pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)req;
    (void)peers;
    *state = calloc(1, sizeof(nixl_state_t));
    if (*state == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t nixl_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                        pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    nixl_state_t *s = state;
    (void)ctx;
    (void)peers;
    if (kind == PDGW_LEG_PREFILL)
        leg->body = fwd_pd_body_prefill(req, fwd_pd_kvp_remote_decode());
    else
        leg->body = fwd_pd_body_decode(req, s && s->kvp ? json_deep_copy(s->kvp) : NULL);
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, kind == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE,
                           0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t nixl_on_prefill_response(void *ctx, void *state,
                                                  const pdgw_fwd_request_t *req, long status,
                                                  const json_t *resp, pdgw_fwd_error_t *err)
{
    static const char *const required[] = {"remote_block_ids", "remote_engine_id", "remote_host",
                                           "remote_port"};
    nixl_ctx_t *c = ctx;
    nixl_state_t *s = state;
    json_t *kvp = fwd_pd_resp_kvp(resp);
    size_t i;
    (void)req;
    (void)status;
    if (kvp == NULL) {
        /* Prefill ended on EOS/stop despite ignore_eos (A.1): the decode must recompute. */
        fwd_pd_count_missing_kv_params(NIXL_NAME);
        if (c->fail_on_missing) {
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502,
                               "prefill returned no kv_transfer_params");
            return PDGW_FWD_ERR;
        }
        pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                     "%s req=%s: prefill returned no kv_transfer_params; "
                     "the decode recomputes the prompt",
                     NIXL_NAME, req->request_id);
        return PDGW_FWD_OK;
    }
    for (i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        json_t *v = json_object_get(kvp, required[i]);
        if (v == NULL || json_is_null(v)) {
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502,
                               "prefill kv_transfer_params lack %s", required[i]);
            return PDGW_FWD_ERR;
        }
    }
    json_decref(s->kvp);
    s->kvp = json_deep_copy(kvp);
    s->t_params_ms = nixl_now_ms();
    return PDGW_FWD_OK;
}

static unsigned nixl_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 const pdgw_fwd_error_t *failure)
{
    nixl_ctx_t *c = ctx;
    nixl_state_t *s = state;
    (void)req;
    switch (failure->phase) {
    case PDGW_PHASE_PREFILL:
        return PDGW_REPICK_PREFILL;
    case PDGW_PHASE_DECODE:
        /* The KV stays on the prefill until a decode reads it or its abort timeout passes:
         * a new decode may use the same prefill within the params' lifetime. */
        if (s != NULL && s->kvp != NULL && nixl_now_ms() - s->t_params_ms < c->params_ttl_ms)
            return PDGW_REPICK_DECODE;
        return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
    default:
        return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
    }
}

static void nixl_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 pdgw_end_reason_t reason)
{
    nixl_state_t *s = state;
    (void)ctx;
    (void)req;
    (void)reason;
    if (s == NULL)
        return;
    json_decref(s->kvp);
    free(s);
}

static const pdgw_fwd_ops_t nixl_ops = {
    .configure = nixl_configure,
    .destroy = nixl_destroy,
    .plan = nixl_plan,
    .attempt_init = nixl_attempt_init,
    .build_leg = nixl_build_leg,
    .on_prefill_response = nixl_on_prefill_response,
    .retry_scope = nixl_retry_scope,
    .attempt_cleanup = nixl_attempt_cleanup,
};

static const pdgw_fwd_desc_t fwd_vllm_nixl_desc = {
    .abi_version = PDGW_FWD_ABI_VERSION,
    .name = NIXL_NAME,
    .summary = "vLLM NixlConnector: prefill returns kv_transfer_params, decode pulls (serial)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &nixl_ops,
};

PDGW_FORWARDER_REGISTER(fwd_vllm_nixl_desc)
