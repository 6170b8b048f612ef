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
 * The prefill leg carries the client's body as upstream's routers send it (mini_lb.py, the
 * model gateway: the same body to both legs), not vLLM's hardened prefill: SGLang's prefill
 * samples the answer's first token with the request's own sampling settings (min_tokens,
 * stop, max_tokens...) and the decode appends that token (decode_schedule_batch_mixin.py),
 * so a prefill without them could start the answer with a token the client excluded. Its
 * only change is stream false without stream_options: its answer is drained, and only the
 * decode's is relayed. The engine aborts the other leg when one fails, so neither side waits
 * out SGLang's disaggregation timeout. A retry re-picks both sides with a new room.
 * SGLang's native POST /generate is served too: both legs get the client's body unchanged
 * (its sampling_params are SGLang's own; the prefill's only hardening is stream false) plus
 * the bootstrap fields, one entry per item for a batch (a list "text" / list of "input_ids"
 * lists), each item with its own room, as mini_lb.py does. With return_logprob the prefill's
 * meta_info.input_token_logprobs is put in front of the decode's (rewrite_decode).
 */
#include "fwd_pd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SGL_NAME "sglang"

typedef struct sgl_state {
    int64_t room;
    json_t *prefill_logprobs; /* /generate: the prefill's meta_info.input_token_logprobs */
    size_t n_items;           /* /generate batch size; 0 = not a batch */
    int64_t rooms[];          /* one room per batch item */
} sgl_state_t;

/* The batch size of a native /generate body, 0 when it is a single prompt (upstream's
 * _get_request_batch_size in mini_lb.py: a list "text", or "input_ids" whose first entry is a
 * list). */
static size_t sgl_batch_size(const pdgw_fwd_request_t *req)
{
    const json_t *t, *ids;
    if (req->path == NULL || strcmp(req->path, "/generate") != 0)
        return 0;
    t = json_object_get(req->body, "text");
    if (t != NULL && !json_is_null(t))
        return json_is_array(t) ? json_array_size(t) : 0;
    ids = json_object_get(req->body, "input_ids");
    return json_is_array(json_array_get(ids, 0)) ? json_array_size(ids) : 0;
}

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
    size_t n = sgl_batch_size(req), i;
    (void)ctx;
    s = calloc(1, sizeof(*s) + n * sizeof(s->rooms[0]));
    if (s == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    s->room = fwd_sglang_room(fwd_pd_random63(), p ? p->dp_rank : 0, p ? p->dp_size : 1);
    s->n_items = n;
    for (i = 0; i < n; i++)
        s->rooms[i] = fwd_sglang_room(fwd_pd_random63(), p ? p->dp_rank : 0, p ? p->dp_size : 1);
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

/* bootstrap_host/port/room: scalars, or one entry per item of a /generate batch; -1 on failure. */
static int sgl_set_bootstrap(json_t *b, const sgl_state_t *s, const pdgw_instance_t *p)
{
    json_t *h, *pt, *rm;
    size_t i;
    if (s->n_items == 0)
        return json_object_set_new(b, "bootstrap_host", json_string(p->host)) ||
               json_object_set_new(b, "bootstrap_port",
                                   p->bootstrap_port > 0 ? json_integer(p->bootstrap_port)
                                                         : json_null()) ||
               json_object_set_new(b, "bootstrap_room", json_integer(s->room));
    h = json_array();
    pt = json_array();
    rm = json_array();
    if (json_object_set_new(b, "bootstrap_host", h) ||
        json_object_set_new(b, "bootstrap_port", pt) ||
        json_object_set_new(b, "bootstrap_room", rm))
        return -1;
    for (i = 0; i < s->n_items; i++)
        if (json_array_append_new(h, json_string(p->host)) ||
            json_array_append_new(pt, p->bootstrap_port > 0 ? json_integer(p->bootstrap_port)
                                                            : json_null()) ||
            json_array_append_new(rm, json_integer(s->rooms[i])))
            return -1;
    return 0;
}

/* A leg's body: the client's as is (its sampling settings reach both engines, as upstream's
 * routers send them), the prefill's without streaming (its answer is drained). */
static json_t *sgl_leg_body(const pdgw_fwd_request_t *req, pdgw_leg_kind_t kind)
{
    json_t *b = pdgw_fwd_body_shared(req);
    if (b == NULL || kind != PDGW_LEG_PREFILL)
        return b;
    if (json_object_set_new(b, "stream", json_false())) {
        json_decref(b);
        return NULL;
    }
    json_object_del(b, "stream_options"); /* only valid with stream true */
    return b;
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
    b = sgl_leg_body(req, kind);
    if (b == NULL || sgl_set_bootstrap(b, s, p) || sgl_set_ranks(b, kind, p, d)) {
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
    if (state != NULL)
        json_decref(((sgl_state_t *)state)->prefill_logprobs);
    free(state);
}

static int sgl_is_generate(const pdgw_fwd_request_t *req)
{
    return req->path != NULL && strcmp(req->path, "/generate") == 0;
}

/* /generate with return_logprob: keep the prefill's prompt logprobs for the decode's answer. */
static pdgw_fwd_status_t sgl_on_prefill_response(void *ctx, void *state,
                                                 const pdgw_fwd_request_t *req, long status,
                                                 const json_t *resp, pdgw_fwd_error_t *err)
{
    sgl_state_t *s = state;
    const json_t *l;
    (void)ctx;
    (void)status;
    (void)err;
    if (!sgl_is_generate(req) || !json_is_true(json_object_get(req->body, "return_logprob")))
        return PDGW_FWD_OK;
    l = json_object_get(json_object_get(resp, "meta_info"), "input_token_logprobs");
    if (json_is_array(l)) {
        json_decref(s->prefill_logprobs);
        s->prefill_logprobs = json_deep_copy(l);
    }
    return PDGW_FWD_OK;
}

/* The decode computed no logits for the prompt: put the prefill's input_token_logprobs in front
 * of the decode's, in the answer and in every streamed event (what mini_lb.py does for
 * /generate). Asked with resp NULL, hold a finished decode answer for the prefill's. A decode
 * event relayed before the prefill answered goes as it is (counted). */
static json_t *sgl_rewrite_decode(void *ctx, void *state, const pdgw_fwd_request_t *req, int sse,
                                  const json_t *resp)
{
    sgl_state_t *s = state;
    json_t *out, *merged, *dl;
    (void)ctx;
    if (s == NULL || !sgl_is_generate(req) ||
        !json_is_true(json_object_get(req->body, "return_logprob")))
        return NULL;
    if (resp == NULL)
        return json_true(); /* hold the answer for the prefill's logprobs */
    dl = json_object_get(json_object_get(resp, "meta_info"), "input_token_logprobs");
    if (!json_is_array(dl))
        return NULL;
    if (s->prefill_logprobs == NULL) {
        pdgw_fwd_counter_inc(SGL_NAME, "logprob_merge_missing_prefill",
                             "decode answers relayed without the prefill's input_token_logprobs "
                             "(the prefill had not answered yet)");
        return NULL;
    }
    out = json_deep_copy(resp);
    merged = json_deep_copy(s->prefill_logprobs);
    if (out == NULL || merged == NULL || json_array_extend(merged, dl) ||
        json_object_set(json_object_get(out, "meta_info"), "input_token_logprobs", merged)) {
        json_decref(merged);
        json_decref(out);
        return NULL; /* out of memory: relayed as it is */
    }
    json_decref(merged);
    return sse ? json_pack("[o]", out) : out;
}

/* Only a request asking for logprobs has its decode answer rewritten: the others are relayed
 * without the gateway parsing every event. */
static int sgl_rewrites_decode(void *ctx, void *state, const pdgw_fwd_request_t *req)
{
    (void)ctx;
    return state != NULL && sgl_is_generate(req) &&
           json_is_true(json_object_get(req->body, "return_logprob"));
}

static const pdgw_fwd_ops_t sgl_ops = {
    .plan = sgl_plan,
    .attempt_init = sgl_attempt_init,
    .build_leg = sgl_build_leg,
    .retry_scope = sgl_retry_scope,
    .attempt_cleanup = sgl_attempt_cleanup,
    .on_prefill_response = sgl_on_prefill_response,
    .rewrite_decode = sgl_rewrite_decode,
    .rewrites_decode = sgl_rewrites_decode,
};

/* SGLang's native generate endpoint (python/sglang/srt/entrypoints/http_server.py). */
static const char *const sgl_native_paths[] = {"/generate", NULL};

/* What sgl_on_prefill_response reads of the prefill's answer: its prompt logprobs. */
static const char *const sgl_answer_members[] = {"meta_info", NULL};

static const pdgw_fwd_desc_t fwd_sglang_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = SGL_NAME,
    .summary = "SGLang PD: both legs at once with bootstrap_host/port/room (parallel), DP ranks "
               "pinned",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_PARALLEL,
    .ops = &sgl_ops,
    .native_paths = sgl_native_paths,
    .prefill_answer_members = sgl_answer_members,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_sglang_desc)
