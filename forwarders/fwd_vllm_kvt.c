/*
 * fwd_vllm_kvt.c - the `vllm-kvt` forwarder (Llumnix with the KVT backend, forwarders/README.md,
 * seed 003).
 *
 * batch  : single-stage. Prefill and decode are booked together, only the decode gets the
 *          request, with kv_transfer_params = {remote_host: P_KV_HOST, remote_port: P_KV_PORT}
 *          (the prefill's KV side channel); its connector drives the remote prefill.
 *          Before that leg the gateway reserves receiver buffer for the whole prompt on the
 *          decode's libkvt alloc ports (ReserveRequest; option reserve, default true; decodes
 *          without alloc ports are not asked) and releases it at the end (CancelNotif).
 * staged : serial. Hardened prefill leg with kv_transfer_params = {do_remote_decode: true}
 *          (the prefill holds its KV); after it answered the decode is picked and gets
 *          {do_remote_prefill: true, remote_host: P_KV_HOST, remote_port: P_KV_PORT}.
 * Options: see fwd_pd.h (reserve, chunk_tokens, reserve_ttl_ms, reserve_timeout_ms,
 * reserve_retry_ms, reserve_on_refusal queue|repick).
 */
#include "fwd_pd.h"

#include <stdio.h>
#include <stdlib.h>

#define KVT_NAME "vllm-kvt"

typedef struct kvtf_ctx {
    pdgw_fwd_kv_svc_t *kv;
} kvtf_ctx_t;

typedef struct kvtf_state {
    pdgw_fwd_kv_req_t *q;
    const pdgw_instance_t *decode; /* batch: booked with the prefill; valid for the attempt */
} kvtf_state_t;

static pdgw_fwd_status_t kvtf_configure(const json_t *options, const pdgw_fwd_env_t *env,
                                        void **ctx, char *err, size_t errlen)
{
    static const char *const known[] = {PDGW_FWD_KV_OPT_KEYS, NULL};
    pdgw_fwd_kv_opts_t o;
    kvtf_ctx_t *c;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        pdgw_fwd_kv_opts_parse(options, 1, 0, &o, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    if (o.reserve && !env->check_only &&
        pdgw_fwd_kv_svc_open_env(env, &o, &c->kv, err, errlen) != PDGW_FWD_OK) {
        free(c);
        return PDGW_FWD_ERR_CONFIG;
    }
    *ctx = c;
    return PDGW_FWD_OK;
}

static void kvtf_destroy(void *ctx)
{
    kvtf_ctx_t *c = ctx;
    if (c == NULL)
        return;
    pdgw_fwd_kv_svc_close(c->kv);
    free(c);
}

static pdgw_fwd_status_t kvtf_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                   size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    if (mode == PDGW_MODE_BATCH) {
        plan->dispatch = PDGW_DISPATCH_SINGLE;
        plan->single_role = PDGW_FWD_ROLE_DECODE;
        plan->single_needs_prefill = 1;
    } else {
        plan->dispatch = PDGW_DISPATCH_SERIAL;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t kvtf_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                           const pdgw_fwd_peers_t *peers, void **state,
                                           pdgw_fwd_error_t *err)
{
    kvtf_ctx_t *c = ctx;
    kvtf_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    if (c->kv != NULL && req->mode == PDGW_MODE_BATCH) {
        /* The decode's transfer is named by the leg's X-Request-Id (a fresh one per attempt,
         * so a failed attempt's release never meets its retry's reservation): the reservation
         * must carry that name to be the one the transfer draws from. */
        s->q = pdgw_fwd_kv_req_new(c->kv, req, req->request_id);
        if (s->q == NULL) {
            free(s);
            pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
            return PDGW_FWD_ERR;
        }
    }
    s->decode = peers->decode;
    *state = s;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t kvtf_gate(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                   pdgw_gate_point_t point, pdgw_fwd_error_t *err)
{
    kvtf_state_t *s = state;
    (void)ctx;
    if (point != PDGW_GATE_BEFORE_PREFILL || s == NULL || s->q == NULL)
        return PDGW_FWD_OK;
    return pdgw_fwd_kv_req_before_prefill(s->q, req, s->decode, err);
}

static pdgw_fwd_status_t kvtf_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                        pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    const pdgw_instance_t *p = peers->prefill;
    (void)ctx;
    (void)state;
    if (kind == PDGW_LEG_PREFILL) {
        leg->body = fwd_pd_body_prefill(req, json_pack("{s:b}", "do_remote_decode", 1));
    } else {
        if (p == NULL || p->kv_port <= 0) {
            pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 0, 500,
                               "prefill instance %s has no kv_port (its KV side channel)",
                               p ? p->id : "?");
            return PDGW_FWD_ERR;
        }
        leg->body = req->mode == PDGW_MODE_BATCH
                        ? fwd_pd_body_decode(req, json_pack("{s:s,s:i}", "remote_host", p->kv_host,
                                                            "remote_port", p->kv_port))
                        : fwd_pd_body_decode(req, json_pack("{s:b,s:s,s:i}", "do_remote_prefill", 1,
                                                            "remote_host", p->kv_host,
                                                            "remote_port", p->kv_port));
    }
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static unsigned kvtf_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 const pdgw_fwd_error_t *failure)
{
    kvtf_state_t *s = state;
    (void)ctx;
    if (s != NULL && pdgw_fwd_kv_req_refused(s->q))
        return PDGW_REPICK_DECODE; /* no room on that decode: try another one */
    if (req->mode == PDGW_MODE_STAGED && failure->phase == PDGW_PHASE_DECODE)
        return PDGW_REPICK_DECODE; /* the prefill holds its KV for whoever pulls it */
    if (failure->phase == PDGW_PHASE_PREFILL)
        return PDGW_REPICK_PREFILL;
    return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void kvtf_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 pdgw_end_reason_t reason)
{
    kvtf_state_t *s = state;
    (void)ctx;
    (void)req;
    if (s == NULL)
        return;
    pdgw_fwd_kv_req_end(s->q, reason);
    free(s);
}

/* The decode reaches a prefill's KV through its side channel. */
static pdgw_fwd_status_t kvtf_check_instance(void *ctx, const pdgw_instance_t *inst, char *err,
                                             size_t errlen)
{
    (void)ctx;
    if (inst->role == PDGW_FWD_ROLE_PREFILL && inst->kv_port <= 0) {
        snprintf(err, errlen, "prefill instance has no kv_port (its KV side channel)");
        return PDGW_FWD_ERR_CONFIG;
    }
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t kvtf_ops = {
    .configure = kvtf_configure,
    .destroy = kvtf_destroy,
    .plan = kvtf_plan,
    .attempt_init = kvtf_attempt_init,
    .build_leg = kvtf_build_leg,
    .gate = kvtf_gate,
    .retry_scope = kvtf_retry_scope,
    .attempt_cleanup = kvtf_attempt_cleanup,
    .check_instance = kvtf_check_instance,
};

static const pdgw_fwd_desc_t fwd_vllm_kvt_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = KVT_NAME,
    .summary = "Llumnix KVT: batch = decode only with the prefill's KV side channel; staged = "
               "serial",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SINGLE | PDGW_DISPATCH_SERIAL,
    .ops = &kvtf_ops,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_vllm_kvt_desc)
