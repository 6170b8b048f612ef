/*
 * fwd_lmcache.c - the `lmcache` forwarder (LMCache PD backend and its disagg proxy,
 * PROTOCOLS.md A.6).
 *
 * Serial, batch scheduling (the prefill leg must name the decode's receiver, so both
 * instances are picked before any send; staged scheduling is refused at start-up):
 *   1. gate BEFORE_PREFILL: weighted admission, ceil(prompt_tokens / chunk_tokens) slots of
 *      admission_chunks (FIFO), then ReserveRequest for the whole prompt on every alloc port
 *      of the decode (option reserve, default true; decodes without alloc ports skip it).
 *   2. prefill leg: hardened body + kv_transfer_params.disagg_spec = {req_id,
 *      receiver_host: D_KV_HOST, receiver_init_port: [..], receiver_alloc_port: [..]}
 *      (one port per TP rank). The prefill pushes its KV to the decode's receiver and sends
 *      ProxyNotif{req_id} per TP rank to the gateway's ZMQ PULL (proxy_host:proxy_port, bound
 *      through libkvt's control plane).
 *   3. gate BEFORE_DECODE: wait for one ProxyNotif per init port; at notif_timeout_ms the
 *      request fails with 504, phase kv_transfer.
 *   4. decode leg: the client body unchanged (the decode finds the KV by content).
 *   End: admission slots released; CancelNotif{req_id} to the decode releases any
 *   reservation or pinned pages (counted when the attempt did not complete).
 */
#include "fwd_pd.h"

#include <stdio.h>
#include <stdlib.h>

#define LMC_NAME "lmcache"

typedef struct lmc_ctx {
    fwd_pd_kv_t *kv;
} lmc_ctx_t;

typedef struct lmc_state {
    fwd_pd_kvreq_t *q;
    const pdgw_instance_t *decode;
} lmc_state_t;

static pdgw_fwd_status_t lmc_configure(const json_t *options, const pdgw_fwd_env_t *env, void **ctx,
                                       char *err, size_t errlen)
{
    static const char *const known[] = {FWD_PD_KV_OPT_KEYS, FWD_PD_PROXY_OPT_KEYS, NULL};
    fwd_pd_kv_opts_t o;
    lmc_ctx_t *c;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        fwd_pd_kv_opts_parse(options, 1, 1, &o, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    if (!env->check_only && fwd_pd_kv_create(LMC_NAME, &o, &c->kv, err, errlen) != PDGW_FWD_OK) {
        free(c);
        return PDGW_FWD_ERR_CONFIG;
    }
    *ctx = c;
    return PDGW_FWD_OK;
}

static void lmc_destroy(void *ctx)
{
    lmc_ctx_t *c = ctx;
    if (c == NULL)
        return;
    fwd_pd_kv_destroy(c->kv);
    free(c);
}

static pdgw_fwd_status_t lmc_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                  size_t errlen)
{
    (void)ctx;
    if (mode != PDGW_MODE_BATCH) {
        snprintf(err, errlen,
                 "lmcache needs --scheduling batch: its prefill leg names the decode's KV "
                 "receiver (disagg_spec), so the decode is picked before the prefill");
        return PDGW_FWD_ERR_CONFIG;
    }
    plan->dispatch = PDGW_DISPATCH_SERIAL;
    plan->gate_timeout_ms = 0; /* the ProxyNotif deadline is the forwarder's own */
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t lmc_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                          const pdgw_fwd_peers_t *peers, void **state,
                                          pdgw_fwd_error_t *err)
{
    lmc_ctx_t *c = ctx;
    lmc_state_t *s;
    const pdgw_instance_t *d = peers->decode;
    char id[160];
    if (d == NULL || d->n_init_ports == 0 || d->n_alloc_ports != d->n_init_ports) {
        pdgw_fwd_error_set(err, PDGW_PHASE_DECODE, 0, 500,
                           "decode instance %s needs init_ports and alloc_ports (one per TP "
                           "rank) for lmcache",
                           d ? d->id : "?");
        return PDGW_FWD_ERR;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    /* A retry gets its own transfer id, so late notices of a failed attempt never count. */
    if (req->attempt == 0)
        snprintf(id, sizeof(id), "%s", req->request_id);
    else
        snprintf(id, sizeof(id), "%s-a%u", req->request_id, req->attempt);
    s->q = fwd_pd_kvreq_new(c->kv, req, id);
    if (s->q == NULL) {
        free(s);
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    s->decode = d;
    fwd_pd_kvreq_set_decode(s->q, d);
    *state = s;
    return PDGW_FWD_OK;
}

static json_t *lmc_ports(const int *ports, size_t n)
{
    json_t *a = json_array();
    size_t i;
    for (i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(ports[i]));
    return a;
}

static pdgw_fwd_status_t lmc_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                       pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                       pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    lmc_state_t *s = state;
    const pdgw_instance_t *d = s->decode;
    (void)ctx;
    (void)peers;
    if (kind == PDGW_LEG_PREFILL) {
        json_t *spec =
            json_pack("{s:s,s:s,s:o,s:o}", "req_id", fwd_pd_kvreq_id(s->q), "receiver_host",
                      d->kv_host, "receiver_init_port", lmc_ports(d->init_ports, d->n_init_ports),
                      "receiver_alloc_port", lmc_ports(d->alloc_ports, d->n_alloc_ports));
        leg->body = spec ? fwd_pd_body_prefill(req, json_pack("{s:o}", "disagg_spec", spec)) : NULL;
    } else {
        leg->body = fwd_pd_body_decode(req, NULL);
    }
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t lmc_gate(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                  pdgw_gate_point_t point, pdgw_fwd_error_t *err)
{
    lmc_state_t *s = state;
    (void)ctx;
    if (point == PDGW_GATE_BEFORE_PREFILL)
        return fwd_pd_kvreq_before_prefill(s->q, req, s->decode, err);
    return fwd_pd_kvreq_wait_notifs(s->q, req, (int)s->decode->n_init_ports, err);
}

static unsigned lmc_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                const pdgw_fwd_error_t *failure)
{
    lmc_state_t *s = state;
    (void)ctx;
    (void)req;
    if (s != NULL && fwd_pd_kvreq_refused(s->q))
        return PDGW_REPICK_DECODE; /* no room on that decode: try another one */
    if (failure->phase == PDGW_PHASE_PREFILL)
        return PDGW_REPICK_PREFILL;
    /* The KV was pushed into that decode: both sides start over. */
    return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void lmc_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                pdgw_end_reason_t reason)
{
    lmc_state_t *s = state;
    (void)ctx;
    (void)req;
    if (s == NULL)
        return;
    fwd_pd_kvreq_end(s->q, reason);
    free(s);
}

/* The prefill pushes into the decode's LMCache receiver: one init and one alloc port per TP
 * rank (pd_peer_init_port / pd_peer_alloc_port of the receiver's config). */
static pdgw_fwd_status_t lmc_check_instance(void *ctx, const pdgw_instance_t *inst, char *err,
                                            size_t errlen)
{
    (void)ctx;
    if (inst->role == PDGW_FWD_ROLE_DECODE &&
        (inst->n_init_ports == 0 || inst->n_alloc_ports != inst->n_init_ports)) {
        snprintf(err, errlen, "decode instance needs init_ports and alloc_ports (one per TP rank)");
        return PDGW_FWD_ERR_CONFIG;
    }
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t lmc_ops = {
    .configure = lmc_configure,
    .destroy = lmc_destroy,
    .plan = lmc_plan,
    .attempt_init = lmc_attempt_init,
    .build_leg = lmc_build_leg,
    .gate = lmc_gate,
    .retry_scope = lmc_retry_scope,
    .attempt_cleanup = lmc_attempt_cleanup,
    .check_instance = lmc_check_instance,
};

static const pdgw_fwd_desc_t fwd_lmcache_desc = {
    .abi_version = PDGW_FWD_ABI_VERSION,
    .name = LMC_NAME,
    .summary = "LMCache PD: prefill pushes to the decode named in disagg_spec, decode after "
               "ProxyNotif from every TP rank (serial)",
    .modes = PDGW_MODE_BATCH,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &lmc_ops,
};

PDGW_FORWARDER_REGISTER(fwd_lmcache_desc)
