/*
 * fwd_lmcache.c - the `lmcache` forwarder (LMCache PD backend and its disagg proxy,
 * docs/protocols/lmcache.md).
 *
 * Serial, batch scheduling (the prefill leg must name the decode's receiver, so both
 * instances are picked before any send; staged scheduling is refused at start-up).
 * Option flow: first_tok (default, LMCache's current proxy; fwd_lmcache_flow.c) or
 * client_body (its older proxy: the decode gets the client's body unchanged).
 *   0. first_tok: the prompt's token ids. Option prompt_ids: prefill (default) sends a
 *      completions prompt of text to the prefill as it is, with return_token_ids, and takes
 *      the ids from its answer (choices[0].prompt_token_ids; an engine that answers none gets
 *      the /tokenize call then, while its KV is on the way); chat, and prompt_ids: tokenize
 *      (LMCache's proxy), POST /tokenize to the prefill instance first (fwd_lmcache_tok.c) and
 *      send the ids as the prefill's prompt (no call when the gateway holds the ids: the
 *      model's tokenizer runs in the gateway, or its tokenize cache has the prompt); with
 *      truncate_prompt_tokens the prefill is asked return_token_ids too and the decode gets
 *      the ids it kept.
 *   1. gate BEFORE_PREFILL: weighted admission, ceil(prompt_tokens / chunk_tokens) slots of
 *      admission_chunks (FIFO), then ReserveRequest for the whole prompt on every alloc port
 *      of the decode (option reserve, default true), only to decodes with kv_engine: libkvt.
 *   2. prefill leg: hardened body + kv_transfer_params.disagg_spec = {req_id,
 *      receiver_host: D_KV_HOST, receiver_init_port: [..], receiver_alloc_port: [..]}
 *      (one port per TP rank). The prefill pushes its KV to the decode's receiver and sends
 *      ProxyNotif{req_id} per TP rank to the gateway's ZMQ PULL (proxy_host:proxy_port,
 *      the gateway's KV control service, forwarder.h pdgw_fwd_kv_*; notices are checked)).
 * first_tok: the prefill also gets ret_first_tok and answers kv_transfer_params.first_tok.
 *   3. gate BEFORE_DECODE: wait for one ProxyNotif per init port; at notif_timeout_ms the
 *      request fails with 504, phase kv_transfer (or, notif_fallback: decode, the decode goes
 *      anyway and recomputes; skip_proxy_notification: no wait).
 *   4. decode leg: first_tok: ids + [first_tok], max_tokens - 1, and the answer rewritten so
 *      the client gets the first token first; client_body: the client body unchanged (the
 *      decode finds the KV by content).
 *   End: admission slots released; CancelNotif{req_id} to the decode releases any
 *   reservation or pinned pages (counted when the attempt did not complete).
 */
#include "fwd_lmcache_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LMC_NAME "lmcache"

typedef struct lmc_ctx {
    pdgw_fwd_kv_svc_t *kv;
    int first_tok;               /* option flow: first_tok (1) or client_body (0) */
    int ids_from_prefill;        /* option prompt_ids: prefill (1) or tokenize (0) */
    int64_t tokenize_timeout_ms; /* one /tokenize call */
} lmc_ctx_t;

typedef struct lmc_state {
    pdgw_fwd_kv_req_t *q;
    const pdgw_instance_t *decode;
    const pdgw_instance_t *prefill; /* /tokenize goes to the prefill instance */
    int libkvt;                     /* the decode runs libkvt (instance kv_engine) */
    int first_tok;                  /* this request runs the first_tok flow */
    int text_to_prefill;            /* the prefill gets the client's text, no /tokenize first */
    int ids_asked;                  /* the prefill answers the ids (return_token_ids) */
    int ids_answered;               /* and it did: they are the prompt after its truncation */
    lmc_tok_job_t *job;             /* its /tokenize call */
    json_t *ids;                    /* the prompt's token ids, as text */
    lmc_head_t head;                /* what the prefill answered */
} lmc_state_t;

static pdgw_fwd_status_t lmc_configure(const json_t *options, const pdgw_fwd_env_t *env, void **ctx,
                                       char *err, size_t errlen)
{
    static const char *const known[] = {
        PDGW_FWD_KV_OPT_KEYS,  PDGW_FWD_KV_NOTIF_OPT_KEYS, "flow", "prompt_ids",
        "tokenize_timeout_ms", "pd_bidirectional",         NULL};
    static const char *const flows[] = {"client_body", "first_tok", NULL};
    static const char *const id_sources[] = {"tokenize", "prefill", NULL};
    pdgw_fwd_kv_opts_t o;
    lmc_ctx_t *c;
    int flow = 1, id_source = 1, bidir = 0;
    int64_t tok_ms = 0;
    if (fwd_pd_opts_check(options, known, err, errlen) ||
        pdgw_fwd_kv_opts_parse(options, 1, 1, &o, err, errlen) ||
        fwd_pd_opt_enum(options, "flow", flows, 1, &flow, err, errlen) ||
        fwd_pd_opt_enum(options, "prompt_ids", id_sources, 1, &id_source, err, errlen) ||
        fwd_pd_opt_int(options, "tokenize_timeout_ms", 10000, 1, 600000, &tok_ms, err, errlen) ||
        fwd_pd_opt_bool(options, "pd_bidirectional", 0, &bidir, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    if (bidir) {
        /* LMCache's bidirectional PD mode (LMCache engine config pd_bidirectional): the
         * sender asks the decode's cache over a query port (receiver_query_port per TP rank in
         * disagg_spec, CacheQueryRequest / CacheQueryResponse) and reads that list by its TP
         * rank. pdgw has no instance field for those ports and libkvt answers no cache query,
         * so such a sender would index a missing list: refused, not half supported. */
        snprintf(err, errlen,
                 "pd_bidirectional: true is not supported: LMCache's bidirectional PD mode "
                 "needs receiver_query_port in disagg_spec and a decode that answers "
                 "CacheQueryRequest, which pdgw and libkvt do not provide; run the LMCache "
                 "engines with pd_bidirectional: false (pd_role sender / receiver)");
        return PDGW_FWD_ERR_CONFIG;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    c->first_tok = flow == 1;
    c->ids_from_prefill = id_source == 1;
    c->tokenize_timeout_ms = tok_ms;
    /* --check-config (check_only): no ProxyNotif socket. */
    if (!env->check_only && pdgw_fwd_kv_svc_open_env(env, &o, &c->kv, err, errlen) != PDGW_FWD_OK) {
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
    pdgw_fwd_kv_svc_close(c->kv);
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
    /* request_id is minted per attempt (uuid4): late notices of a failed attempt never count
     * for a retry, and a transfer name cannot be guessed from outside. */
    s->q = pdgw_fwd_kv_req_new(c->kv, req, req->request_id);
    if (s->q == NULL) {
        free(s);
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    s->decode = d;
    s->prefill = peers->prefill;
    /* pdgw's own control messages (ReserveRequest, CancelNotif without LMCache's delimiter
     * frame) go only to decodes that run libkvt; an upstream LMCache receiver gets nothing
     * from the gateway, exactly as behind LMCache's own proxy. */
    s->libkvt = d->kv_engine == PDGW_KV_ENGINE_LIBKVT;
    if (s->libkvt)
        pdgw_fwd_kv_req_set_decode(s->q, d);
    /* first_tok needs the answer's first token to be the only one the prefill made, so a
     * request that asks for one token at most (or gives no max_tokens) runs client_body, and
     * so does one whose answer the flow cannot put together whole (echo, n, logprobs...). */
    s->first_tok = c->first_tok && req->max_tokens >= 2 && req->dispatch == PDGW_DISPATCH_SERIAL;
    if (s->first_tok && !lmc_flow_answer_fits(req)) {
        s->first_tok = 0;
        if (req->attempt == 0) /* once per request, not again for each retry */
            pdgw_fwd_counter_inc(LMC_NAME, "client_body_answers",
                                 "Requests the first_tok flow cannot answer whole (echo, several "
                                 "choices, logprobs, structured outputs, chat tools or media) that "
                                 "ran the client_body flow.");
    }
    /* a completions prompt of text goes to the prefill as it is, which answers its ids */
    s->text_to_prefill = s->first_tok && c->ids_from_prefill && lmc_flow_prompt_is_text(req);
    /* A prefill that truncates the prompt (truncate_prompt_tokens) is asked for the ids it kept
     * whichever way its prompt came: ids + [first_tok] cut again by the decode would start one
     * token later than the prefill's KV. */
    s->ids_asked = s->text_to_prefill || (s->first_tok && lmc_flow_truncates(req));
    /* In flight from now: ProxyNotifs count only for it and only from its prefill. */
    pdgw_fwd_kv_req_expect_notifs(s->q, (int)d->n_init_ports, peers->prefill);
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
            json_pack("{s:s,s:s,s:o,s:o}", "req_id", pdgw_fwd_kv_req_id(s->q), "receiver_host",
                      d->kv_host, "receiver_init_port", lmc_ports(d->init_ports, d->n_init_ports),
                      "receiver_alloc_port", lmc_ports(d->alloc_ports, d->n_alloc_ports));
        if (s->first_tok)
            leg->body = lmc_flow_prefill_body(req, s->ids, s->ids_asked, spec);
        else
            leg->body =
                spec ? fwd_pd_body_prefill(req, json_pack("{s:o}", "disagg_spec", spec)) : NULL;
    } else if (s->first_tok) {
        leg->body = lmc_flow_decode_body(req, s->ids, s->ids_answered, &s->head);
    } else {
        leg->body = fwd_pd_body_decode(req, NULL);
    }
    if (s->first_tok)
        leg->path = "/v1/completions"; /* both legs, chat too: the prompt is token ids */
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "cannot build the %s body",
                           kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

/* first_tok step 0: the prompt's token ids: the gateway's when it holds them, else from the
 * prefill's /tokenize (PENDING meanwhile). */
static pdgw_fwd_status_t lmc_tokenize(lmc_ctx_t *c, lmc_state_t *s, const pdgw_fwd_request_t *req,
                                      pdgw_fwd_error_t *err)
{
    char msg[200];
    size_t n;
    int st;
    if (s->ids != NULL)
        return PDGW_FWD_OK;
    if (s->job == NULL) {
        json_t *body = lmc_flow_tokenize_body(req, &s->ids);
        if (s->ids != NULL)
            return PDGW_FWD_OK; /* the client already sent token ids */
        if (body == NULL && s->text_to_prefill) {
            pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 500, "out of memory");
            return PDGW_FWD_ERR;
        }
        if (body == NULL) {
            s->first_tok = 0; /* a prompt /tokenize cannot take (several prompts): older flow */
            return PDGW_FWD_OK;
        }
        /* the ids the gateway holds (the model's tokenizer in the gateway, or its tokenize
         * cache) are the answer this call would get: no exchange */
        s->ids = pdgw_fwd_prompt_ids_text(req, &n);
        if (s->ids != NULL) {
            json_decref(body);
            pdgw_fwd_counter_inc(LMC_NAME, "gateway_prompt_ids",
                                 "Prompts whose ids the gateway held (its own tokenizer of the "
                                 "model or its tokenize cache): no POST /tokenize call.");
            return PDGW_FWD_OK;
        }
        s->job = lmc_tok_start(req, s->prefill, body, c->tokenize_timeout_ms);
        if (s->job == NULL) {
            pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 503,
                               "cannot start the tokenize call to the prefill instance");
            return PDGW_FWD_ERR;
        }
        pdgw_fwd_counter_inc(LMC_NAME, "tokenize_calls", "POST /tokenize calls (first_tok flow).");
    }
    st = lmc_tok_result(s->job, &s->ids, msg, sizeof(msg));
    if (st == 0)
        return PDGW_FWD_PENDING;
    lmc_tok_release(s->job); /* its connection and answer are no longer needed */
    s->job = NULL;
    if (st < 0) {
        pdgw_fwd_counter_inc(LMC_NAME, "tokenize_errors", "Failed POST /tokenize calls.");
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 502, "%s", msg);
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

/* Read on its text: the prompt's ids in a prefill's answer are as long as the prompt. */
static pdgw_fwd_status_t lmc_on_prefill_text(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                             long status, const char *text, size_t len,
                                             pdgw_fwd_error_t *err)
{
    lmc_state_t *s = state;
    json_t *answered = NULL;
    char msg[200];
    (void)ctx;
    (void)req;
    (void)status;
    if (!s->first_tok)
        return PDGW_FWD_OK;
    if (lmc_flow_read_prefill_text(text, len, &s->head, s->ids_asked ? &answered : NULL, msg,
                                   sizeof(msg)) != 0) {
        fwd_pd_count_missing_kv_params(LMC_NAME);
        pdgw_fwd_error_set(err, PDGW_PHASE_PREFILL, 1, 502, "%s", msg);
        return PDGW_FWD_ERR;
    }
    if (answered != NULL) { /* the prompt as the prefill ran it: these, not /tokenize's */
        json_decref(s->ids);
        s->ids = answered;
        s->ids_answered = 1;
    } else if (s->ids_asked) {
        pdgw_fwd_counter_inc(LMC_NAME, "prompt_ids_fallback",
                             "Prefill answers without prompt_token_ids (an engine without "
                             "return_token_ids): the ids came from /tokenize.");
    }
    return PDGW_FWD_OK;
}

static json_t *lmc_rewrite_decode(void *ctx, void *state, const pdgw_fwd_request_t *req, int sse,
                                  const json_t *resp)
{
    lmc_state_t *s = state;
    (void)ctx;
    if (s == NULL || !s->first_tok)
        return NULL;
    return lmc_flow_rewrite(&s->head, req, sse, resp);
}

static int lmc_rewrite_decode_text(void *ctx, void *state, const pdgw_fwd_request_t *req, int sse,
                                   const char *text, size_t len, pdgw_fwd_text_t *out)
{
    lmc_state_t *s = state;
    (void)ctx;
    if (s == NULL || !s->first_tok)
        return 0;
    return lmc_flow_rewrite_text(&s->head, req, sse, text, len, out);
}

static pdgw_fwd_status_t lmc_gate(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                  pdgw_gate_point_t point, pdgw_fwd_error_t *err)
{
    lmc_ctx_t *c = ctx;
    lmc_state_t *s = state;
    pdgw_fwd_status_t st;
    if (point == PDGW_GATE_BEFORE_PREFILL) {
        st = s->first_tok && !s->text_to_prefill ? lmc_tokenize(c, s, req, err) : PDGW_FWD_OK;
        if (st != PDGW_FWD_OK)
            return st;
        return pdgw_fwd_kv_req_before_prefill(s->q, req, s->libkvt ? s->decode : NULL, err);
    }
    /* a prefill that did not answer the ids: /tokenize now, while its KV is on the way */
    st = s->first_tok && s->ids == NULL ? lmc_tokenize(c, s, req, err) : PDGW_FWD_OK;
    if (st != PDGW_FWD_OK)
        return st;
    return pdgw_fwd_kv_req_wait_notifs(s->q, req, (int)s->decode->n_init_ports, err);
}

static unsigned lmc_retry_scope(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                const pdgw_fwd_error_t *failure)
{
    lmc_state_t *s = state;
    (void)ctx;
    (void)req;
    if (s != NULL && pdgw_fwd_kv_req_refused(s->q))
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
    pdgw_fwd_kv_req_end(s->q, reason);
    lmc_tok_release(s->job);
    json_decref(s->ids);
    lmc_head_clear(&s->head);
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
    .rewrite_decode = lmc_rewrite_decode,
    .check_instance = lmc_check_instance,
    .rewrite_decode_text = lmc_rewrite_decode_text,
    .on_prefill_text = lmc_on_prefill_text,
};

static const pdgw_fwd_desc_t fwd_lmcache_desc = {
    PDGW_FWD_DESC_HEADER,
    .name = LMC_NAME,
    .summary = "LMCache PD: prefill pushes to the decode named in disagg_spec, decode after "
               "ProxyNotif from every TP rank (serial)",
    .modes = PDGW_MODE_BATCH,
    .dispatch = PDGW_DISPATCH_SERIAL,
    .ops = &lmc_ops,
    /* reads no `attrs:` (its instance fields are gateway keys: kv_port, ...) */
    .instance_attrs = pdgw_fwd_attrs_none,
};

PDGW_FORWARDER_REGISTER(fwd_lmcache_desc)
