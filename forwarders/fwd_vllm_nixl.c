/*
 * fwd_vllm_nixl.c - the `vllm-nixl` forwarder (vLLM NixlConnector, docs/protocols/vllm-nixl.md,
 * docs/protocols/vllm-nixl.md).
 *
 * Two-stage serial in both scheduling modes, as vLLM's toy proxy
 * (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): the hardened prefill leg carries
 *   kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
 *                         remote_engine_id/remote_block_ids/remote_host/remote_port: null};
 * the prefill answers with the params the decode needs, copied verbatim into the decode leg,
 * which pulls the KV and tells the prefill to free it.
 *
 * The decode uses the params only when remote_block_ids is non-empty and remote_engine_id,
 * remote_request_id, remote_host and remote_port are present (vLLM
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py,
 * update_state_after_alloc); otherwise it logs "Got invalid KVTransferParams" and recomputes
 * the prompt. The gateway checks the same, counts it and warns (rate-limited).
 *
 * The prefill holds the KV for a lease (kv_connector_extra_config kv_lease_duration, 30 s by
 * default, nixl/base_scheduler.py): a decode failure re-picks only the decode within the lease,
 * afterwards the prefill runs again.
 *
 * A leg to an instance with dp_size > 1 carries `X-data-parallel-rank: <dp_rank>` (vLLM's
 * OpenAI server routes the request to that DP engine; the prefill's side channel is
 * VLLM_NIXL_SIDE_CHANNEL_PORT + DP index).
 *
 * Options: missing_kv_params = recompute (default: the decode computes the prompt itself) |
 * fail (retryable kv_transfer error); kv_lease_ms (30000) the lease assumed when the prefill
 * does not state one (kv_params_ttl_ms is its older name).
 */
#include "fwd_pd.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NIXL_NAME "vllm-nixl"
/* At most one warning about incomplete params per this many ms (the counter has them all). */
#define NIXL_WARN_EVERY_MS 10000

typedef struct nixl_ctx {
    int fail_on_missing;
    int64_t lease_ms;
    atomic_int_fast64_t last_warn_ms;
    atomic_uint_fast64_t warn_suppressed;
} nixl_ctx_t;

typedef struct nixl_state {
    json_t *kvp;          /* from the prefill response; NULL = decode recomputes */
    int64_t lease_end_ms; /* CLOCK_MONOTONIC: the prefill may free its KV after this */
} nixl_state_t;

static pdgw_fwd_status_t nixl_configure(const json_t *options, const pdgw_fwd_env_t *env,
                                        void **ctx, char *err, size_t errlen)
{
    static const char *const known[] = {"missing_kv_params", "kv_lease_ms", "kv_params_ttl_ms",
                                        NULL};
    static const char *const missing[] = {"recompute", "fail", NULL};
    nixl_ctx_t *c;
    int m = 0;
    int64_t lease = 0;
    const char *lease_key =
        json_object_get(options, "kv_params_ttl_ms") ? "kv_params_ttl_ms" : "kv_lease_ms";
    (void)env;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        fwd_pd_opt_enum(options, "missing_kv_params", missing, 0, &m, err, errlen) ||
        fwd_pd_opt_int(options, lease_key, 30000, 1, 86400000, &lease, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    c->fail_on_missing = m == 1;
    c->lease_ms = lease;
    atomic_init(&c->last_warn_ms, INT64_MIN / 2);
    atomic_init(&c->warn_suppressed, 0);
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

/* vLLM's OpenAI server routes a request to the DP engine named by this header
 * (_get_data_parallel_rank in vllm/entrypoints/openai/serving_engine.py). */
static void nixl_dp_header(const pdgw_instance_t *inst, pdgw_fwd_leg_t *leg)
{
    if (inst == NULL || inst->dp_size <= 1 || leg->n_headers >= PDGW_FWD_LEG_MAX_HEADERS)
        return;
    snprintf(leg->headers[leg->n_headers++], sizeof(leg->headers[0]), "X-data-parallel-rank: %d",
             inst->dp_rank);
}

static pdgw_fwd_status_t nixl_build_leg(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                        pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    nixl_state_t *s = state;
    (void)ctx;
    if (kind == PDGW_LEG_PREFILL)
        leg->body = fwd_pd_body_prefill(req, fwd_pd_kvp_remote_decode());
    else
        leg->body = fwd_pd_body_decode(req, s && s->kvp ? json_incref(s->kvp) : NULL);
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, kind == PDGW_LEG_PREFILL ? PDGW_PHASE_PREFILL : PDGW_PHASE_DECODE,
                           0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    nixl_dp_header(kind == PDGW_LEG_PREFILL ? peers->prefill : peers->decode, leg);
    return PDGW_FWD_OK;
}

/* Python's truth value of a JSON value (null, false, 0, "", [] and {} are false). */
static int nixl_truthy(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL:
    case JSON_FALSE:
        return 0;
    case JSON_INTEGER:
        return json_integer_value(v) != 0;
    case JSON_REAL:
        return json_real_value(v) != 0.0;
    case JSON_STRING:
        return json_string_length(v) != 0;
    case JSON_ARRAY:
        return json_array_size(v) != 0;
    case JSON_OBJECT:
        return json_object_size(v) != 0;
    default:
        return 1;
    }
}

/* The first thing the decode would miss in <kvp> (NULL when it can pull): the same test as
 * the decode's update_state_after_alloc (pull_scheduler.py): remote_block_ids true as Python
 * sees it, and the keys remote_engine_id, remote_request_id, remote_host and remote_port
 * present (`p in params`: a key whose value is null is present, and the decode goes on with
 * it). */
static const char *nixl_params_gap(const json_t *kvp)
{
    static const char *const required[] = {"remote_engine_id", "remote_request_id", "remote_host",
                                           "remote_port"};
    const json_t *ids = json_object_get(kvp, "remote_block_ids");
    size_t i;
    if (ids == NULL || !nixl_truthy(ids))
        return "remote_block_ids";
    for (i = 0; i < sizeof(required) / sizeof(required[0]); i++)
        if (json_object_get(kvp, required[i]) == NULL)
            return required[i];
    return NULL;
}

/* One warning per NIXL_WARN_EVERY_MS at most; the rest are only counted. */
static void nixl_warn(nixl_ctx_t *c, const pdgw_fwd_request_t *req, const char *what)
{
    int64_t now = pdgw_fwd_now_ms();
    int_fast64_t last = atomic_load(&c->last_warn_ms);
    if (now - last < NIXL_WARN_EVERY_MS ||
        !atomic_compare_exchange_strong(&c->last_warn_ms, &last, now)) {
        atomic_fetch_add(&c->warn_suppressed, 1);
        return;
    }
    pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                 "%s req=%s: prefill kv_transfer_params %s; the decode will recompute the prompt "
                 "(%llu similar warnings suppressed)",
                 NIXL_NAME, req->client_request_id ? req->client_request_id : req->request_id, what,
                 (unsigned long long)atomic_exchange(&c->warn_suppressed, 0));
}

/* When the prefill frees the KV, on our monotonic clock. The newest vLLM states
 * remote_blocks_expiry_time only on a decode's own result and as its time.perf_counter(), a
 * clock we cannot read; a value that is a Unix time (after 2001) is honoured, anything else
 * means the configured lease from now. */
static int64_t nixl_lease_end(const nixl_ctx_t *c, const json_t *kvp)
{
    int64_t now = pdgw_fwd_now_ms();
    const json_t *exp = json_object_get(kvp, "remote_blocks_expiry_time");
    if (json_is_number(exp) && json_number_value(exp) > 1e9 && json_number_value(exp) < 1e11) {
        int64_t left = (int64_t)(json_number_value(exp) * 1000.0) - pdgw_fwd_wall_ms();
        return now + (left > 0 ? left : 0);
    }
    return now + c->lease_ms;
}

static pdgw_fwd_status_t nixl_on_prefill_response(void *ctx, void *state,
                                                  const pdgw_fwd_request_t *req, long status,
                                                  const json_t *resp, pdgw_fwd_error_t *err)
{
    nixl_ctx_t *c = ctx;
    nixl_state_t *s = state;
    json_t *kvp = fwd_pd_resp_kvp(resp);
    const char *gap = NULL;
    char what[96];
    (void)status;
    if (kvp != NULL)
        gap = nixl_params_gap(kvp);
    if (kvp == NULL || gap != NULL) {
        /* Prefill ended on EOS/stop despite ignore_eos (A.1), or answered params the decode
         * cannot use: the decode computes the prompt itself, silently. */
        fwd_pd_count_missing_kv_params(NIXL_NAME);
        if (kvp != NULL)
            pdgw_fwd_counter_inc(NIXL_NAME, "incomplete_kv_params",
                                 "Prefill kv_transfer_params the decode cannot use (it "
                                 "recomputes the prompt).");
        if (kvp == NULL)
            snprintf(what, sizeof(what), "are missing");
        else
            snprintf(what, sizeof(what), "lack a usable %s", gap);
        if (c->fail_on_missing) {
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 502, "prefill kv_transfer_params %s",
                               what);
            return PDGW_FWD_ERR;
        }
        nixl_warn(c, req, what);
    }
    json_decref(s->kvp);
    /* Passed on verbatim even when incomplete, as vLLM's proxy does: the decode decides.
     * Kept by reference, not copied: nothing edits a prefill answer or a built leg body. */
    s->kvp = kvp ? json_incref(kvp) : NULL;
    s->lease_end_ms = kvp && gap == NULL ? nixl_lease_end(c, kvp) : 0;
    return PDGW_FWD_OK;
}

static unsigned nixl_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 const pdgw_fwd_error_t *failure)
{
    nixl_state_t *s = state;
    (void)ctx;
    (void)req;
    switch (failure->phase) {
    case PDGW_PHASE_PREFILL:
        return PDGW_REPICK_PREFILL;
    case PDGW_PHASE_DECODE:
        /* The prefill keeps the KV until a decode reads it or its lease ends: within the
         * lease a new decode may read the same blocks; afterwards run the prefill again. */
        if (s != NULL && s->kvp != NULL && s->lease_end_ms > 0 &&
            pdgw_fwd_now_ms() < s->lease_end_ms)
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

/* All the prefill's answer gives the decode (nixl_on_prefill_response), as vLLM's own proxy
 * reads it (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py). */
static const char *const nixl_answer_members[] = {"kv_transfer_params", NULL};

static const pdgw_fwd_desc_t fwd_vllm_nixl_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = NIXL_NAME,
    .summary = "vLLM NixlConnector: prefill returns kv_transfer_params, decode pulls (serial)",
    .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &nixl_ops,
    .prefill_answer_members = nixl_answer_members,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_vllm_nixl_desc)
