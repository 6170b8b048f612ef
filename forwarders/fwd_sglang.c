/*
 * fwd_sglang.c - the `sglang` forwarder (SGLang PD with Mooncake/NIXL transfer,
 * docs/protocols/sglang.md).
 *
 * Two-stage parallel in both scheduling modes (both instances are booked together): the
 * same request goes to prefill and decode at once, each with
 *   bootstrap_host = the prefill's host,
 *   bootstrap_port = its bootstrap port, or null when none is configured (the prefill engine
 *                    then uses its own --disaggregation-bootstrap-port, default 8998),
 *   bootstrap_room = a random integer in [0, 2^63-1]; when the prefill instance is one DP
 *                    rank of a DP engine, aligned to that rank (room % dp_size == dp_rank),
 *                    which is where a prefill following the room runs it and where the
 *                    decode fetches it from.
 * DP ranks pdgw pins (as SGLang's model gateway PD router does): the prefill leg carries
 * routed_dp_rank = the prefill's rank and the decode leg disagg_prefill_dp_rank = that rank;
 * the decode leg carries routed_dp_rank = the decode's rank.
 * The prefill leg is the hardened one (A.1); only the decode's answer is relayed and the
 * prefill's is drained. The engine aborts the other leg when one fails, so neither side waits
 * out SGLang's disaggregation timeout. A retry re-picks both sides with a new room.
 */
#include "fwd_pd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SGL_NAME "sglang"

typedef struct sgl_state {
    int64_t room;
} sgl_state_t;

/* A random room that lands on <dp_rank> of <dp_size> (exported for the unit test). */
int64_t fwd_sglang_room(int64_t random63, int dp_rank, int dp_size)
{
    int64_t room = random63 < 0 ? -(random63 + 1) : random63;
    if (dp_size > 1 && dp_rank >= 0 && dp_rank < dp_size) {
        room -= room % dp_size; /* a multiple of dp_size, <= INT64_MAX - (dp_size - 1) */
        if (room > INT64_MAX - dp_size)
            room -= dp_size;
        room += dp_rank;
    }
    return room;
}

static pdgw_fwd_status_t sgl_plan(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                  size_t errlen)
{
    (void)ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = PDGW_DISPATCH_PARALLEL;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t sgl_attempt_init(void *ctx, const pdgw_fwd_request_t *req,
                                          const pdgw_fwd_peers_t *peers, void **state,
                                          pdgw_fwd_error_t *err)
{
    sgl_state_t *s;
    const pdgw_instance_t *p = peers->prefill;
    (void)ctx;
    (void)req;
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    s->room = fwd_sglang_room(fwd_pd_random63(), p ? p->dp_rank : 0, p ? p->dp_size : 1);
    *state = s;
    return PDGW_FWD_OK;
}

/* The DP ranks pdgw pinned; -1 on failure. */
static int sgl_set_ranks(json_t *b, pdgw_leg_kind_t kind, const pdgw_instance_t *p,
                         const pdgw_instance_t *d)
{
    if (p->dp_size > 1 &&
        json_object_set_new(b,
                            kind == PDGW_LEG_PREFILL ? "routed_dp_rank" : "disagg_prefill_dp_rank",
                            json_integer(p->dp_rank)))
        return -1;
    if (kind == PDGW_LEG_DECODE && d != NULL && d->dp_size > 1 &&
        json_object_set_new(b, "routed_dp_rank", json_integer(d->dp_rank)))
        return -1;
    return 0;
}

static pdgw_fwd_status_t sgl_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                       pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                       pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    sgl_state_t *s = state;
    const pdgw_instance_t *p = peers->prefill;
    json_t *b;
    (void)ctx;
    const pdgw_instance_t *d = peers->decode;
    if (p == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 0, 500, "no prefill instance");
        return PDGW_FWD_ERR;
    }
    b = kind == PDGW_LEG_PREFILL ? fwd_pd_body_prefill(req, NULL) : fwd_pd_body_decode(req, NULL);
    if (b == NULL || json_object_set_new(b, "bootstrap_host", json_string(p->host)) ||
        json_object_set_new(b, "bootstrap_port",
                            p->bootstrap_port > 0 ? json_integer(p->bootstrap_port)
                                                  : json_null()) ||
        json_object_set_new(b, "bootstrap_room", json_integer(s->room)) ||
        sgl_set_ranks(b, kind, p, d)) {
        json_decref(b);
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    leg->body = b;
    return PDGW_FWD_OK;
}

static unsigned sgl_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                const pdgw_fwd_error_t *failure)
{
    (void)ctx;
    (void)state;
    (void)req;
    (void)failure;
    /* The room pairs one prefill with one decode: start both over. */
    return PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE;
}

static void sgl_attempt_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                pdgw_end_reason_t reason)
{
    (void)ctx;
    (void)req;
    (void)reason;
    free(state);
}

/* A prefill is found by its bootstrap server (SGLang's --disaggregation-bootstrap-port). */
static pdgw_fwd_status_t sgl_check_instance(void *ctx, const pdgw_instance_t *inst, char *err,
                                            size_t errlen)
{
    (void)ctx;
    if (inst->role == PDGW_FWD_ROLE_PREFILL && inst->bootstrap_port <= 0) {
        snprintf(err, errlen,
                 "prefill instance has no bootstrap_port (the engine's "
                 "--disaggregation-bootstrap-port)");
        return PDGW_FWD_ERR_CONFIG;
    }
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t sgl_ops = {
    .plan = sgl_plan,
    .attempt_init = sgl_attempt_init,
    .build_leg = sgl_build_leg,
    .retry_scope = sgl_retry_scope,
    .attempt_cleanup = sgl_attempt_cleanup,
    .check_instance = sgl_check_instance,
};

static const pdgw_fwd_desc_t fwd_sglang_desc = {
    .abi_version = PDGW_FWD_ABI_VERSION,
    .name = SGL_NAME,
    .summary = "SGLang PD: both legs at once with bootstrap_host/port/room (parallel), DP ranks "
               "pinned",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_PARALLEL,
    .ops = &sgl_ops,
};

PDGW_FORWARDER_REGISTER(fwd_sglang_desc)
