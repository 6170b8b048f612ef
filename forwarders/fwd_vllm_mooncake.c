/*
 * fwd_vllm_mooncake.c - the `vllm-mooncake` forwarder (PROTOCOLS.md A.3, seed 003).
 *
 * Option mooncake_dispatch:
 *   serial (default; Llumnix's shape): hardened prefill leg with
 *     kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
 *                           remote_engine_id/remote_block_ids/remote_host/remote_port: null};
 *     the prefill's answer kv_transfer_params is copied whole into the decode leg (decode
 *     pulls). Staged scheduling picks the decode only after the prefill answered.
 *   parallel (vLLM's newer MooncakeConnector): both legs at once, sharing a transfer_id T:
 *     prefill {do_remote_decode: true, do_remote_prefill: false, transfer_id: T};
 *     decode  {do_remote_prefill: true, do_remote_decode: false,
 *              remote_bootstrap_addr: "http://P_HOST:P_BOOTSTRAP_PORT",
 *              remote_engine_id: E, transfer_id: T}; the prefill pushes into the decode.
 *     Both instances are booked together in either scheduling mode.
 * Option missing_kv_params (serial): recompute (default) | fail.
 * Option mooncake_bootstrap_fields (parallel): addr (default, remote_bootstrap_addr) |
 * host_port (older connectors: bootstrap_server_host + bootstrap_server_port).
 */
#include "fwd_pd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_NAME "vllm-mooncake"

typedef struct mc_ctx {
    int parallel;
    int fail_on_missing;
    int old_bootstrap_fields; /* bootstrap_server_host/port instead of remote_bootstrap_addr */
} mc_ctx_t;

typedef struct mc_state {
    json_t *kvp;           /* serial: the prefill's params */
    char transfer_id[192]; /* parallel */
} mc_state_t;

static pdgw_fwd_status_t mc_configure(const json_t *options, const pdgw_fwd_env_t *env, void **ctx,
                                      char *err, size_t errlen)
{
    static const char *const known[] = {"mooncake_dispatch", "missing_kv_params",
                                        "mooncake_bootstrap_fields", NULL};
    static const char *const fields[] = {"addr", "host_port", NULL};
    static const char *const shapes[] = {"serial", "parallel", NULL};
    static const char *const missing[] = {"recompute", "fail", NULL};
    mc_ctx_t *c;
    int shape = 0, m = 0, f = 0;
    (void)env;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        fwd_pd_opt_enum(options, "mooncake_dispatch", shapes, 0, &shape, err, errlen) ||
        fwd_pd_opt_enum(options, "missing_kv_params", missing, 0, &m, err, errlen) ||
        fwd_pd_opt_enum(options, "mooncake_bootstrap_fields", fields, 0, &f, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    c->parallel = shape == 1;
    c->fail_on_missing = m == 1;
    c->old_bootstrap_fields = f == 1;
    *ctx = c;
    return PDGW_FWD_OK;
}

static void mc_destroy(void *ctx)
{
    free(ctx);
}

static pdgw_fwd_status_t mc_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                 size_t errlen)
{
    mc_ctx_t *c = ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = c && c->parallel ? PDGW_DISPATCH_PARALLEL : PDGW_DISPATCH_SERIAL;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t mc_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                         const pdgw_fwd_peers_t *peers, void **state,
                                         pdgw_fwd_error_t *err)
{
    mc_state_t *s = calloc(1, sizeof(*s));
    (void)ctx;
    (void)peers;
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    /* Unique per attempt, so a late push of a failed attempt never lands in a new one. */
    snprintf(s->transfer_id, sizeof(s->transfer_id), "%s-%u", req->request_id, req->attempt);
    *state = s;
    return PDGW_FWD_OK;
}

static json_t *mc_parallel_kvp(const mc_ctx_t *c, const mc_state_t *s, pdgw_leg_kind_t kind,
                               const pdgw_instance_t *prefill, pdgw_fwd_error_t *err)
{
    char addr[320];
    if (kind == PDGW_LEG_PREFILL)
        return json_pack("{s:b,s:b,s:s}", "do_remote_decode", 1, "do_remote_prefill", 0,
                         "transfer_id", s->transfer_id);
    if (prefill == NULL || prefill->bootstrap_port <= 0) {
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 0, 500,
                           "prefill instance %s has no bootstrap_port (needed by "
                           "mooncake_dispatch parallel)",
                           prefill ? prefill->id : "?");
        return NULL;
    }
    if (prefill->engine_id[0] == '\0') {
        /* The decode finds the prefill's KV by remote_engine_id: an empty one cannot match. */
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 0, 500,
                           "prefill instance %s has no engine_id (needed by mooncake_dispatch "
                           "parallel)",
                           prefill->id);
        return NULL;
    }
    if (c->old_bootstrap_fields)
        return json_pack("{s:b,s:b,s:s,s:i,s:s,s:s}", "do_remote_prefill", 1, "do_remote_decode", 0,
                         "bootstrap_server_host", prefill->host, "bootstrap_server_port",
                         prefill->bootstrap_port, "remote_engine_id", prefill->engine_id,
                         "transfer_id", s->transfer_id);
    snprintf(addr, sizeof(addr), "http://%s:%d", prefill->host, prefill->bootstrap_port);
    return json_pack("{s:b,s:b,s:s,s:s,s:s}", "do_remote_prefill", 1, "do_remote_decode", 0,
                     "remote_bootstrap_addr", addr, "remote_engine_id", prefill->engine_id,
                     "transfer_id", s->transfer_id);
}

static pdgw_fwd_status_t mc_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                      pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                      pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    if (c->parallel) {
        json_t *kvp = mc_parallel_kvp(c, s, kind, peers->prefill, err);
        if (kvp == NULL) {
            if (err->message[0] == '\0')
                pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
            return PDGW_FWD_ERR;
        }
        leg->body =
            kind == PDGW_LEG_PREFILL ? fwd_pd_body_prefill(req, kvp) : fwd_pd_body_decode(req, kvp);
    } else if (kind == PDGW_LEG_PREFILL) {
        leg->body = fwd_pd_body_prefill(req, fwd_pd_kvp_remote_decode());
    } else {
        leg->body = fwd_pd_body_decode(req, s->kvp ? json_deep_copy(s->kvp) : NULL);
    }
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t mc_on_prefill_response(void *ctx, void *state,
                                                const pdgw_fwd_request_t *req, long status,
                                                const json_t *resp, pdgw_fwd_error_t *err)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    json_t *kvp;
    (void)status;
    if (c->parallel)
        return PDGW_FWD_OK; /* the prefill pushed; nothing to copy */
    kvp = fwd_pd_resp_kvp(resp);
    if (kvp == NULL) {
        fwd_pd_count_missing_kv_params(MC_NAME);
        if (c->fail_on_missing) {
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502,
                               "prefill returned no kv_transfer_params");
            return PDGW_FWD_ERR;
        }
        pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                     "%s req=%s: prefill returned no kv_transfer_params; "
                     "the decode recomputes the prompt",
                     MC_NAME, req->request_id);
        return PDGW_FWD_OK;
    }
    json_decref(s->kvp);
    s->kvp = json_deep_copy(kvp);
    return PDGW_FWD_OK;
}

static unsigned mc_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                               const pdgw_fwd_error_t *failure)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    (void)req;
    if (failure->phase == PDGW_PHASE_PREFILL)
        return c->parallel ? PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE : PDGW_REPICK_PREFILL;
    /* Serial: the prefill holds its KV for a reader; a new decode may pull it. Parallel: the
     * push went to the failed decode, so both sides start over. */
    if (failure->phase == PDGW_PHASE_DECODE && !c->parallel && s != NULL && s->kvp != NULL)
        return PDGW_REPICK_DECODE;
    return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void mc_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                               pdgw_end_reason_t reason)
{
    mc_state_t *s = state;
    (void)ctx;
    (void)req;
    (void)reason;
    if (s == NULL)
        return;
    json_decref(s->kvp);
    free(s);
}

/* Parallel dispatch names the prefill to the decode up front: its bootstrap server and the
 * engine id the decode matches the pushed KV by. Serial copies both from the prefill's
 * answer and needs nothing configured. */
static pdgw_fwd_status_t mc_check_instance(void *ctx, const pdgw_instance_t *inst, char *err,
                                           size_t errlen)
{
    const mc_ctx_t *c = ctx;
    if (c == NULL || !c->parallel || inst->role != PDGW_FWD_ROLE_PREFILL)
        return PDGW_FWD_OK;
    if (inst->bootstrap_port <= 0 || inst->engine_id[0] == '\0') {
        snprintf(err, errlen, "prefill instance needs %s (mooncake_dispatch parallel)",
                 inst->bootstrap_port <= 0 ? "bootstrap_port" : "engine_id");
        return PDGW_FWD_ERR_CONFIG;
    }
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t mc_ops = {
    .configure = mc_configure,
    .destroy = mc_destroy,
    .plan = mc_plan,
    .attempt_init = mc_attempt_init,
    .build_leg = mc_build_leg,
    .on_prefill_response = mc_on_prefill_response,
    .retry_scope = mc_retry_scope,
    .attempt_cleanup = mc_attempt_cleanup,
    .check_instance = mc_check_instance,
};

static const pdgw_fwd_desc_t fwd_vllm_mooncake_desc = {
    .abi_version = PDGW_FWD_ABI_VERSION,
    .name = MC_NAME,
    .summary = "vLLM MooncakeConnector: serial (params copied) or parallel (transfer_id + "
               "bootstrap)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL | PDGW_DISPATCH_PARALLEL,
    .ops = &mc_ops,
};

PDGW_FORWARDER_REGISTER(fwd_vllm_mooncake_desc)
