/*
 * fwd_vllm_mooncake.c - the `vllm-mooncake` forwarder (docs/protocols/vllm-mooncake.md).
 *
 * Option mooncake_dispatch:
 *   parallel (default; upstream vLLM's MooncakeConnector and its proxy): both legs at once,
 *     sharing transfer_id T = "xfer-<the attempt's request id>":
 *     prefill {do_remote_decode: true, do_remote_prefill: false, transfer_id: T}
 *             (+ header X-data-parallel-rank when the prefill instance has dp_size > 1);
 *     decode  {do_remote_prefill: true, do_remote_decode: false,
 *              remote_bootstrap_addr: "http://P_HOST:P_BOOTSTRAP_PORT",
 *              remote_engine_id: E, transfer_id: T}; the prefill pushes into the decode.
 *     E is the engine id of the prefill's DP rank, learnt from its bootstrap server
 *     (GET /query, fwd_mc_bootstrap.c) before the legs start, without blocking the worker.
 *   serial (Llumnix's vLLM fork): hardened prefill leg with
 *     kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
 *                           remote_engine_id/remote_block_ids/remote_host/remote_port: null};
 *     the prefill's answer kv_transfer_params is copied whole into the decode leg (decode
 *     pulls). Staged scheduling picks the decode only after the prefill answered.
 * Option missing_kv_params (serial): recompute (default) | fail.
 * Option mooncake_bootstrap_fields (parallel): addr (default, remote_bootstrap_addr) |
 *   host_port (older connectors: bootstrap_server_host + bootstrap_server_port).
 * Option mooncake_engine_id (parallel): bootstrap (default; discovered) | config (the
 *   instance's engine_id, an explicit override for prefills whose id is pinned).
 * Options mooncake_bootstrap_ttl_ms (10000): refresh period of the discovered ids;
 *   mooncake_bootstrap_timeout_ms (2000): one GET /query.
 * Retry (parallel): a decode failure re-picks the decode only; a decode-only retry of an
 *   answered prefill reuses its transfer_id (pdgw_fwd_mooncake_transfer_reuses_total).
 */
#include "fwd_pd.h"
#include "fwd_mc_bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_NAME "vllm-mooncake"
/* vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default, also its proxy's default. */
#define MC_DEFAULT_BOOTSTRAP_PORT 8998

typedef struct mc_ctx {
    int parallel;
    int fail_on_missing;
    int old_bootstrap_fields; /* bootstrap_server_host/port instead of remote_bootstrap_addr */
    int static_engine_id;     /* mooncake_engine_id: config */
    fwd_mc_boot_t *boot;      /* parallel + discovery */
} mc_ctx_t;

typedef struct mc_state {
    json_t *kvp;           /* serial: the prefill's params */
    char transfer_id[192]; /* parallel */
    char engine_id[192];   /* parallel: E of the prefill's DP rank ("" until known) */
    char boot_host[128];   /* the prefill's bootstrap server */
    int boot_port;
    const pdgw_instance_t *prefill; /* the attempt's (valid for the whole attempt) */
    fwd_mc_fetch_t fetch;           /* this request's GET /query, when it asks */
    int dp_rank;                    /* -1: the prefill has no DP (no header, rank 0's id) */
    int decode_built; /* parallel: a decode leg was built (for attempt decode_attempt) */
    unsigned decode_attempt;
} mc_state_t;

static pdgw_fwd_status_t mc_configure(const json_t *options, const pdgw_fwd_env_t *env, void **ctx,
                                      char *err, size_t errlen)
{
    static const char *const known[] = {"mooncake_dispatch",
                                        "missing_kv_params",
                                        "mooncake_bootstrap_fields",
                                        "mooncake_engine_id",
                                        "mooncake_bootstrap_ttl_ms",
                                        "mooncake_bootstrap_timeout_ms",
                                        NULL};
    static const char *const fields[] = {"addr", "host_port", NULL};
    static const char *const shapes[] = {"parallel", "serial", NULL};
    static const char *const missing[] = {"recompute", "fail", NULL};
    static const char *const sources[] = {"bootstrap", "config", NULL};
    mc_ctx_t *c;
    int shape = 0, m = 0, f = 0, src = 0;
    int64_t ttl = 0, timeout = 0;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        fwd_pd_opt_enum(options, "mooncake_dispatch", shapes, 0, &shape, err, errlen) ||
        fwd_pd_opt_enum(options, "missing_kv_params", missing, 0, &m, err, errlen) ||
        fwd_pd_opt_enum(options, "mooncake_bootstrap_fields", fields, 0, &f, err, errlen) ||
        fwd_pd_opt_enum(options, "mooncake_engine_id", sources, 0, &src, err, errlen) ||
        fwd_pd_opt_int(options, "mooncake_bootstrap_ttl_ms", 10000, 100, 3600000, &ttl, err,
                       errlen) ||
        fwd_pd_opt_int(options, "mooncake_bootstrap_timeout_ms", 2000, 50, 60000, &timeout, err,
                       errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    c->parallel = shape == 0;
    c->fail_on_missing = m == 1;
    c->old_bootstrap_fields = f == 1;
    c->static_engine_id = src == 1;
    if (c->parallel && !c->static_engine_id && !env->check_only &&
        fwd_mc_boot_create(ttl, timeout, &c->boot, err, errlen) != PDGW_FWD_OK) {
        free(c);
        return PDGW_FWD_ERR_CONFIG;
    }
    *ctx = c;
    return PDGW_FWD_OK;
}

static void mc_destroy(void *ctx)
{
    mc_ctx_t *c = ctx;
    if (c == NULL)
        return;
    fwd_mc_boot_destroy(c->boot);
    free(c);
}

static pdgw_fwd_status_t mc_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                 size_t errlen)
{
    mc_ctx_t *c = ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = c == NULL || c->parallel ? PDGW_DISPATCH_PARALLEL : PDGW_DISPATCH_SERIAL;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t mc_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                         const pdgw_fwd_peers_t *peers, void **state,
                                         pdgw_fwd_error_t *err)
{
    mc_ctx_t *c = ctx;
    const pdgw_instance_t *p = peers->prefill;
    mc_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    /* The attempt's request id is a fresh uuid4, so T is unique per request and attempt: a
     * late push of a failed attempt never lands in a new one. Upstream's proxy: xfer-<uuid>. */
    snprintf(s->transfer_id, sizeof(s->transfer_id), "xfer-%s", req->request_id);
    s->dp_rank = -1;
    if (c->parallel && p != NULL) {
        snprintf(s->boot_host, sizeof(s->boot_host), "%s", p->host);
        s->prefill = p;
        s->boot_port = p->bootstrap_port > 0 ? p->bootstrap_port : MC_DEFAULT_BOOTSTRAP_PORT;
        if (p->dp_size > 1)
            s->dp_rank = p->dp_rank;
        if (c->static_engine_id) {
            if (p->engine_id[0] == '\0') {
                /* The decode finds the prefill's KV by remote_engine_id: "" cannot match. */
                pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 0, 500,
                                   "prefill instance %s has no engine_id (needed by "
                                   "mooncake_engine_id config)",
                                   p->id);
                free(s);
                return PDGW_FWD_ERR;
            }
            snprintf(s->engine_id, sizeof(s->engine_id), "%s", p->engine_id);
        }
    }
    *state = s;
    return PDGW_FWD_OK;
}

/* BEFORE_PREFILL (parallel, discovery): the engine id of the prefill's DP rank, from the
 * cache or, PENDING, once a request's GET /query brought it. */
static pdgw_fwd_status_t mc_gate(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 pdgw_gate_point_t point, pdgw_fwd_error_t *err)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    char msg[200] = "";
    pdgw_fwd_status_t st;
    if (point != PDGW_GATE_BEFORE_PREFILL || c->boot == NULL || s->engine_id[0] != '\0' ||
        s->boot_host[0] == '\0')
        return PDGW_FWD_OK;
    st = fwd_mc_boot_lookup(c->boot, &s->fetch, req, s->prefill, s->boot_port,
                            s->dp_rank < 0 ? 0 : s->dp_rank, s->engine_id, sizeof(s->engine_id),
                            msg, sizeof(msg));
    if (st == PDGW_FWD_ERR)
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 502,
                           "no engine id for the Mooncake prefill: %s", msg);
    return st;
}

static json_t *mc_parallel_kvp(const mc_ctx_t *c, const mc_state_t *s, pdgw_leg_kind_t kind,
                               pdgw_fwd_error_t *err)
{
    char addr[320];
    if (kind == PDGW_LEG_PREFILL)
        return json_pack("{s:b,s:b,s:s}", "do_remote_decode", 1, "do_remote_prefill", 0,
                         "transfer_id", s->transfer_id);
    if (s->engine_id[0] == '\0' || s->boot_host[0] == '\0') {
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 502,
                           "the Mooncake prefill's engine id is not known");
        return NULL;
    }
    if (c->old_bootstrap_fields)
        return json_pack("{s:b,s:b,s:s,s:i,s:s,s:s}", "do_remote_prefill", 1, "do_remote_decode", 0,
                         "bootstrap_server_host", s->boot_host, "bootstrap_server_port",
                         s->boot_port, "remote_engine_id", s->engine_id, "transfer_id",
                         s->transfer_id);
    snprintf(addr, sizeof(addr), strchr(s->boot_host, ':') ? "http://[%s]:%d" : "http://%s:%d",
             s->boot_host, s->boot_port);
    return json_pack("{s:b,s:b,s:s,s:s,s:s}", "do_remote_prefill", 1, "do_remote_decode", 0,
                     "remote_bootstrap_addr", addr, "remote_engine_id", s->engine_id, "transfer_id",
                     s->transfer_id);
}

static pdgw_fwd_status_t mc_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                      pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                      pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    (void)peers;
    if (c->parallel) {
        json_t *kvp = mc_parallel_kvp(c, s, kind, err);
        if (kvp == NULL) {
            if (err->message[0] == '\0')
                pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
            return PDGW_FWD_ERR;
        }
        if (kind == PDGW_LEG_DECODE) {
            if (s->decode_built && s->decode_attempt != req->attempt)
                /* A decode-only retry (the engine kept the answered prefill): the new decode
                 * names the same transfer_id, so it takes the KV the prefill holds for it
                 * instead of leaving it pinned until VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT. */
                pdgw_fwd_counter_inc(MC_NAME, "mooncake_transfer_reuses",
                                     "Decode-only retries that reused the answered prefill's "
                                     "pending Mooncake transfer (same transfer_id).");
            s->decode_built = 1;
            s->decode_attempt = req->attempt;
        }
        leg->body =
            kind == PDGW_LEG_PREFILL ? fwd_pd_body_prefill(req, kvp) : fwd_pd_body_decode(req, kvp);
        if (kind == PDGW_LEG_PREFILL && s->dp_rank >= 0) {
            /* vLLM routes a request to a DP rank by this header; E is that rank's id. */
            snprintf(leg->headers[leg->n_headers++], sizeof(leg->headers[0]),
                     "X-data-parallel-rank: %d", s->dp_rank);
        }
    } else if (kind == PDGW_LEG_PREFILL) {
        leg->body = fwd_pd_body_prefill(req, fwd_pd_kvp_remote_decode());
    } else {
        leg->body = fwd_pd_body_decode(req, s->kvp ? json_incref(s->kvp) : NULL);
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
    if (c->parallel) {
        fwd_mc_boot_settle(c->boot, &s->fetch, 0); /* a background refresh's answer */
        return PDGW_FWD_OK;                        /* the prefill pushed; nothing to copy */
    }
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
    s->kvp = json_incref(kvp); /* by reference: nothing edits a prefill answer */
    return PDGW_FWD_OK;
}

/* A failed attempt may have used an engine id that went stale (the prefill restarted and the
 * decode found no such engine): make the next lookup ask the bootstrap server again. */
static void mc_forget_engine_id(mc_ctx_t *c, mc_state_t *s)
{
    if (c->boot != NULL && s != NULL && s->engine_id[0] != '\0')
        fwd_mc_boot_invalidate(c->boot, s->boot_host, s->boot_port, s->engine_id);
}

static unsigned mc_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                               const pdgw_fwd_error_t *failure)
{
    mc_ctx_t *c = ctx;
    mc_state_t *s = state;
    (void)req;
    mc_forget_engine_id(c, s);
    if (failure->phase == PDGW_PHASE_PREFILL)
        return c->parallel ? PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE : PDGW_REPICK_PREFILL;
    /* Serial: the prefill holds its KV for a reader; a new decode may pull it. Parallel: a
     * failed decode does not implicate the prefill (often it named a stale engine id), so only
     * the decode changes. When the prefill had answered and the decode never reached an
     * engine, the engine keeps the prefill and the new decode names the same transfer_id: the
     * prefill keys its pending send by transfer_id and sends to whichever decode asks for it
     * (mooncake_connector.py, send_kv_to_decode). Otherwise the next attempt sends both legs
     * again with a new transfer_id (a decode that reached vLLM has had the old one freed). */
    if (failure->phase == PDGW_PHASE_DECODE && !c->parallel && s != NULL && s->kvp != NULL)
        return PDGW_REPICK_DECODE;
    if (failure->phase == PDGW_PHASE_DECODE && c->parallel)
        return PDGW_REPICK_DECODE;
    return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void mc_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                               pdgw_end_reason_t reason)
{
    mc_state_t *s = state;
    (void)req;
    if (s == NULL)
        return;
    if (ctx != NULL)
        fwd_mc_boot_settle(((mc_ctx_t *)ctx)->boot, &s->fetch, 1);
    if (reason == PDGW_END_FAILED || reason == PDGW_END_RETRY || reason == PDGW_END_TIMEOUT)
        mc_forget_engine_id(ctx, s);
    json_decref(s->kvp);
    free(s);
}

/* Parallel dispatch names the prefill to the decode up front by the engine id the decode
 * matches the pushed KV by; with mooncake_engine_id: config that id comes from the instance
 * (otherwise from the prefill's bootstrap server, whose port defaults to vLLM's 8998).
 * Serial copies everything from the prefill's answer and needs nothing configured. */
static pdgw_fwd_status_t mc_check_instance(void *ctx, const pdgw_instance_t *inst, char *err,
                                           size_t errlen)
{
    const mc_ctx_t *c = ctx;
    if (c == NULL || !c->parallel || !c->static_engine_id || inst->role != PDGW_FWD_ROLE_PREFILL)
        return PDGW_FWD_OK;
    if (inst->engine_id[0] == '\0') {
        snprintf(err, errlen, "prefill instance needs engine_id (mooncake_engine_id: config)");
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
    .gate = mc_gate,
    .retry_scope = mc_retry_scope,
    .attempt_cleanup = mc_attempt_cleanup,
    .check_instance = mc_check_instance,
};

/* All the prefill's answer gives the decode (mc_on_prefill_response), as vLLM's proxy reads it
 * (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, which Mooncake's docs use). */
static const char *const mc_answer_members[] = {"kv_transfer_params", NULL};

static const pdgw_fwd_desc_t fwd_vllm_mooncake_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = MC_NAME,
    .summary = "vLLM MooncakeConnector: parallel (transfer_id + bootstrap engine id) or serial "
               "(params copied, Llumnix)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL | PDGW_DISPATCH_PARALLEL,
    .ops = &mc_ops,
    .prefill_answer_members = mc_answer_members,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_vllm_mooncake_desc)
