/*
 * pdgw_tokenize.c - the prompt's token ids before routing, from the engine itself.
 *
 * The precise-prefix policy matches a prompt against the blocks the engines report through
 * their KV events, and those carry token ids: a text prompt must be tokenized exactly as the
 * engine does it, chat template included. A model configured with its own tokenizer
 * (`tokenizers`, pdgw_tokenize_local.c) is tokenized in process; pdgw never guesses one, and
 * every other model asks a usable engine of the fleet, as llm-d's tokenizer does:
 *   vLLM  POST /tokenize {model, prompt} or {model, messages, add_generation_prompt, ...}
 *         -> {count, max_model_len, tokens}
 *         (vllm/entrypoints/serve/tokenize/protocol.py: TokenizeCompletionRequest,
 *         TokenizeChatRequest, TokenizeResponse; SGLang serves the same shape).
 * The leg runs on the request's worker like any other leg; the request waits at most
 * tokenize_timeout and is then routed without tokens (counted). Answers are cached by a
 * 128-bit hash of the exact tokenize body (model and chat options included), in a bounded
 * set-associative table shared by the workers.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pdgw_route.h"
#include "pdgw_alloc.h"
#include "pdgw_json_load.h"
#include "pdgw_log.h"

#include "pdgw_route_int.h"
#include "pdgw_tokenize_body.h"
#include "pdgw_server_int.h"
#include "pdgw_fwd_sdk.h"   /* pdgw_fwd_ids_text_u32 */
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */
#include "pdgw_wf.h"

#define TOK_WAYS       4
#define TOK_MAX_TOKENS (1u << 20) /* longer answers are not believed */

static void tok_count(pdgw_routing_t *rt, const char *result)
{
    if (rt && rt->tokenize_total)
        pdgw_counter_inc(pdgw_metric_family_series1(rt->tokenize_total, result));
}

pdgw_status_t pdgw_route_create(const pdgw_route_opts_t *o, bool want_tokens, pdgw_metrics_t *reg,
                                pdgw_routing_t **out)
{
    static const char *const l_reason[] = {"reason"};
    static const char *const l_result[] = {"result"};
    static const char *const l_reason_result[] = {"reason", "result"};
    pdgw_routing_t *rt = pdgw_calloc(1, sizeof(*rt));
    size_t sets;

    if (rt == NULL)
        return PDGW_ERR_NOMEM;
    rt->o = *o;
    rt->want_tokens = want_tokens || o->pd_min_prompt_tokens > 0 || o->pd_skip_cached_percent > 0 ||
                      o->pd_skip_predicted;
    sets = (o->tokenize_cache_entries + TOK_WAYS - 1) / TOK_WAYS;
    rt->n_sets = sets;
    if (sets > 0) {
        rt->slots = pdgw_calloc(sets * TOK_WAYS, sizeof(*rt->slots));
        if (rt->slots == NULL) {
            pdgw_free(rt);
            return PDGW_ERR_NOMEM;
        }
    }
    pthread_mutex_init(&rt->mu, NULL);
    pthread_mutex_init(&rt->toks_mu, NULL);
    atomic_init(&rt->any_local, false);
    {
        pdgw_tok_set_t *set = NULL;
        char err[256];
        if (pdgw_tok_set_load(o->tokenizers, false, err, sizeof(err), &set) != PDGW_OK) {
            pdgw_route_destroy(rt);
            return PDGW_ERR_NOMEM;
        }
        pdgw_tok_set_install(rt, set);
    }
    if (reg) {
        static const char *const l_how[] = {"how"};
        static const double tok_buckets[] = {1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05};
        if (pdgw_metrics_family_add(reg, PDGW_METRIC_HISTOGRAM, "pdgw_tokenize_seconds",
                                    "Time to tokenize a prompt in the gateway (config "
                                    "`tokenizers`), by how: text (a completions prompt), chat "
                                    "(the template rendered, then encoded).",
                                    l_how, 1, tok_buckets,
                                    sizeof(tok_buckets) / sizeof(tok_buckets[0]),
                                    &rt->tokenize_seconds) != PDGW_OK)
            rt->tokenize_seconds = pdgw_metrics_family_find(reg, "pdgw_tokenize_seconds");
        /* Both may exist already when a test builds a second server on one registry. */
        if (pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_pd_skipped_total",
                                    "Requests of a two-leg protocol sent decode-only (selective "
                                    "PD), by reason: short (prompt below pd_min_prompt_tokens), "
                                    "cached (the chosen decode holds most of the prompt), "
                                    "predicted (faster by the latency models).",
                                    l_reason, 1, NULL, 0, &rt->pd_skipped) != PDGW_OK)
            rt->pd_skipped = pdgw_metrics_family_find(reg, "pdgw_pd_skipped_total");
        if (pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_tokenize_total",
                                    "Prompt tokenizations for routing, by result: local (in the "
                                    "gateway), ok (by an engine), cache_hit, timeout and error "
                                    "(routed without tokens), no_instance.",
                                    l_result, 1, NULL, 0, &rt->tokenize_total) != PDGW_OK)
            rt->tokenize_total = pdgw_metrics_family_find(reg, "pdgw_tokenize_total");
        if (pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_kv_release_total",
                                    "Prefill KV released through a decode engine because the "
                                    "request's decode never reached one, by reason (client_gone, "
                                    "no_decode, decode_refused, timeout, retry) and result (ok, "
                                    "failed, no_instance, error).",
                                    l_reason_result, 2, NULL, 0, &rt->kv_release) != PDGW_OK)
            rt->kv_release = pdgw_metrics_family_find(reg, "pdgw_kv_release_total");
    }
    *out = rt;
    return PDGW_OK;
}

void pdgw_route_destroy(pdgw_routing_t *rt)
{
    if (rt == NULL)
        return;
    for (size_t i = 0; i < rt->n_sets * TOK_WAYS; i++)
        pdgw_free(rt->slots[i].tokens);
    pdgw_free(rt->slots);
    pdgw_tok_set_install(rt, NULL);
    pthread_mutex_destroy(&rt->toks_mu);
    pthread_mutex_destroy(&rt->mu);
    pdgw_free(rt);
}

/* ---------------------------------------------------------------- cache */

static bool cache_get(pdgw_routing_t *rt, const uint64_t key[2], uint32_t **tokens, size_t *n)
{
    bool hit = false;
    if (rt->n_sets == 0)
        return false;
    pthread_mutex_lock(&rt->mu);
    {
        pdgw_tok_slot_t *set = &rt->slots[(key[0] % rt->n_sets) * TOK_WAYS];
        for (int w = 0; w < TOK_WAYS; w++) {
            pdgw_tok_slot_t *s = &set[w];
            if (s->tokens == NULL || s->key[0] != key[0] || s->key[1] != key[1])
                continue;
            *tokens = pdgw_malloc(s->n ? s->n * sizeof(uint32_t) : 1);
            if (*tokens) {
                memcpy(*tokens, s->tokens, s->n * sizeof(uint32_t));
                *n = s->n;
                s->used = ++rt->tick;
                hit = true;
            }
            break;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    return hit;
}

static void cache_put(pdgw_routing_t *rt, const uint64_t key[2], const uint32_t *tokens, size_t n)
{
    uint32_t *copy;
    if (rt->n_sets == 0)
        return;
    copy = pdgw_malloc(n ? n * sizeof(uint32_t) : 1);
    if (copy == NULL)
        return;
    memcpy(copy, tokens, n * sizeof(uint32_t));
    pthread_mutex_lock(&rt->mu);
    {
        pdgw_tok_slot_t *set = &rt->slots[(key[0] % rt->n_sets) * TOK_WAYS], *victim = &set[0];
        for (int w = 0; w < TOK_WAYS; w++) {
            pdgw_tok_slot_t *s = &set[w];
            if (s->tokens && s->key[0] == key[0] && s->key[1] == key[1]) {
                victim = s; /* same prompt answered twice: refresh */
                break;
            }
            if (s->tokens == NULL || s->used < victim->used)
                victim = s; /* free way first, else the least recently used */
            if (s->tokens == NULL)
                break;
        }
        pdgw_free(victim->tokens);
        victim->tokens = copy;
        victim->n = n;
        victim->key[0] = key[0];
        victim->key[1] = key[1];
        victim->used = ++rt->tick;
    }
    pthread_mutex_unlock(&rt->mu);
}

/* ---------------------------------------------------------------- request */

pdgw_req_route_t *pdgw_route_req(pdgw_wf_t *wf)
{
    if (wf->rt == NULL)
        wf->rt = pdgw_calloc(1, sizeof(*wf->rt));
    return wf->rt;
}

const uint32_t *pdgw_route_tokens(const pdgw_wf_t *wf, size_t *n_out)
{
    if (wf->rt == NULL || wf->rt->tokens == NULL)
        return NULL;
    *n_out = wf->rt->n_tokens;
    return wf->rt->tokens;
}

json_t *pdgw_fwd_prompt_ids_text(const pdgw_fwd_request_t *req, size_t *count)
{
    /* ops run on the request's worker, which alone sets and clears the waker's workflow */
    const pdgw_wf_t *wf = req != NULL && req->waker != NULL ? req->waker->wf : NULL;
    const uint32_t *ids;
    size_t n = 0;
    json_t *text;

    *count = 0;
    if (wf == NULL || (ids = pdgw_route_tokens(wf, &n)) == NULL || n == 0)
        return NULL;
    text = pdgw_fwd_ids_text_u32(ids, n);
    if (text != NULL)
        *count = n;
    return text;
}

static void tok_leg_free(pdgw_req_route_t *q)
{
    if (q->leg) {
        pdgw_leg_release(q->leg);
        pdgw_free(q->leg);
        q->leg = NULL;
    }
    if (q->si) {
        sched_instance_unref(q->si);
        q->si = NULL;
    }
}

void pdgw_route_req_release(pdgw_wf_t *wf)
{
    if (wf->rt == NULL)
        return;
    tok_leg_free(wf->rt);
    pdgw_free(wf->rt->tokens);
    pdgw_free(wf->rt);
    wf->rt = NULL;
}

/* The tokenize body for the client's request, or NULL when the prompt is not one text
 * (token ids already, a batch of prompts) or the body is unusual. Sorted keys, so equal
 * requests hash equal. */
static char *tok_body(pdgw_wf_t *wf, size_t *len, json_t **tree)
{
    pdgw_req_t *r = wf->req;
    json_t *b = pdgw_tokenize_body(r->json, r->kind == PDGW_API_CHAT_COMPLETIONS,
                                   json_object_get(r->json, "prompt"), r->info.model);
    char *text = NULL;

    if (b == NULL)
        return NULL;
    text = json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS);
    if (text)
        *len = strlen(text);
    if (text != NULL && tree != NULL)
        *tree = b;
    else
        json_decref(b);
    return text;
}

/* The /tokenize leg reports here (its owner), which resumes the workflow. */
static void tokenize_on_leg_done(pdgw_leg_t *leg)
{
    (void)pdgw_tokenize_leg_done(leg->wf, leg);
}

static const pdgw_leg_owner_t tokenize_leg_owner = {.on_done = tokenize_on_leg_done,
                                                    .moved = pdgw_wf_leg_moved};

/* The ids of the request's prompt when they are known without an engine: its tokenize body's
 * hash in the cache, else the model's own tokenizer <lt> (when not NULL). 1: known (wf->rt has
 * them); 0: not known, *body_out is the tokenize body for an engine (the caller's); -1: nothing
 * to tokenize (not one text prompt) or no memory. */
static int tok_known(pdgw_wf_t *wf, pdgw_routing_t *rt, const pdgw_tok_set_t *set,
                     const pdgw_local_tok_t *lt, char **body_out, size_t *len_out)
{
    pdgw_req_t *r = wf->req;
    pdgw_req_route_t *q;
    XXH128_hash_t h;
    json_t *tree = NULL;
    size_t len = 0;
    char *body = tok_body(wf, &len, lt != NULL ? &tree : NULL);

    if (body == NULL)
        return -1;
    q = pdgw_route_req(wf);
    if (q == NULL) {
        free(body);
        json_decref(tree);
        return -1;
    }
    h = XXH3_128bits(body, len);
    q->key[0] = h.low64;
    /* the tokenizers' generation: ids cached before a reload changed them are never read */
    q->key[1] = h.high64 ^ (pdgw_tok_set_gen(set) * 0x9e3779b97f4a7c15ull);
    if (cache_get(rt, q->key, &q->tokens, &q->n_tokens)) {
        free(body);
        json_decref(tree);
        tok_count(rt, "cache_hit");
        return 1;
    }
    /* The model's own tokenizer in the gateway: the ids now, no exchange. */
    if (lt != NULL && pdgw_tokenize_local_ids(rt, lt, tree, r->kind == PDGW_API_CHAT_COMPLETIONS,
                                              &q->tokens, &q->n_tokens)) {
        free(body);
        json_decref(tree);
        cache_put(rt, q->key, q->tokens, q->n_tokens);
        tok_count(rt, "local");
        return 1;
    }
    json_decref(tree);
    *body_out = body;
    *len_out = len;
    return 0;
}

/* Whether <r> is a request whose one text prompt the gateway may tokenize. */
static bool tok_wanted(pdgw_req_t *r)
{
    return r->info_valid && r->info.prompt_tokens == NULL && pdgw_req_json(r) != NULL;
}

bool pdgw_tokenize_enter(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_routing_t *rt = wf->w->srv->routing;
    pdgw_tok_set_t *set;
    const pdgw_local_tok_t *lt;
    char *body = NULL;
    size_t len = 0;

    /* A model with its own tokenizer is tokenized before admission on every request (it costs
     * microseconds), so its latency targets, budgets and load see the prompt's real length. */
    if (rt == NULL || !tok_wanted(r) || (set = pdgw_tok_set_get(rt)) == NULL)
        return true;
    lt = pdgw_tokenize_local_find(set, r->info.model);
    if (lt != NULL) {
        int known = tok_known(wf, rt, set, lt, &body, &len);
        if (known == 1)
            r->info.est_prompt_tokens = (int64_t)wf->rt->n_tokens;
        else if (known == 0)
            free(body); /* the engine is asked later, if routing needs the ids */
    }
    pdgw_tok_set_put(set);
    return true;
}

bool pdgw_tokenize_begin(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    pdgw_routing_t *rt = srv->routing;
    pdgw_tok_set_t *set;
    const pdgw_local_tok_t *lt;
    pdgw_req_route_t *q;
    char *body = NULL;
    size_t len = 0;
    int known;
    pdgw_status_t st;

    if (rt == NULL || !rt->want_tokens || !tok_wanted(r))
        return false;
    if (wf->rt != NULL && wf->rt->tokens != NULL)
        return false; /* known since admission (pdgw_tokenize_enter) */
    set = pdgw_tok_set_get(rt);
    lt = pdgw_tokenize_local_find(set, r->info.model);
    if (lt == NULL && rt->o.tokenize_timeout_ms == 0) {
        pdgw_tok_set_put(set);
        return false;
    }
    known = tok_known(wf, rt, set, lt, &body, &len);
    pdgw_tok_set_put(set);
    if (known != 0)
        return false;
    q = wf->rt;
    if (rt->o.tokenize_timeout_ms == 0) {
        free(body);
        return false;
    }
    /* fleet hook: the tokenizer of the request's model */
    q->si = sched_pool_pick_usable_model(srv->opts.pool, SCHED_ROLE_DECODE,
                                         atomic_fetch_add(&rt->turn, 1),
                                         r->info_valid ? r->info.model : NULL);
    if (q->si == NULL) {
        free(body);
        tok_count(rt, "no_instance");
        return false;
    }
    pdgw_instance_view_from_sched(&q->inst, q->si);
    q->leg = pdgw_calloc(1, sizeof(*q->leg));
    if (q->leg == NULL) {
        free(body);
        tok_leg_free(q);
        tok_count(rt, "error");
        return false;
    }
    pdgw_leg_init(q->leg, &wf->origin, wf, PDGW_LEG_DECODE, &tokenize_leg_owner);
    /* The leg takes the body (pdgw_free is free, json_dumps used malloc). */
    st = pdgw_leg_start(q->leg, &q->inst, "/tokenize", "POST", body, len, NULL);
    if (st != PDGW_OK) {
        pdgw_free(body);
        tok_leg_free(q);
        tok_count(rt, "error");
        return false;
    }
    q->t_deadline_ms = q->leg->t_start_ms + rt->o.tokenize_timeout_ms;
    pdgw_req_timer_update(r); /* the request's timer knows this deadline */
    return true;
}

/* Parse {count, max_model_len, tokens}; false when it is not that. */
static bool tok_parse(const pdgw_leg_t *leg, uint32_t **tokens, size_t *n)
{
    json_t *resp, *arr, *v;
    size_t i, cnt;
    uint32_t *ids;

    if (leg->err != PDGW_LEGERR_NONE || leg->status != 200)
        return false;
    resp = pdgw_json_loadb(leg->resp.data ? leg->resp.data : "", leg->resp.len, NULL);
    arr = json_object_get(resp, "tokens");
    cnt = json_array_size(arr);
    if (!json_is_array(arr) || cnt == 0 || cnt > TOK_MAX_TOKENS ||
        ((v = json_object_get(resp, "count")) != NULL &&
         (!json_is_integer(v) || json_integer_value(v) != (json_int_t)cnt))) {
        json_decref(resp);
        return false;
    }
    ids = pdgw_malloc(cnt * sizeof(uint32_t));
    if (ids == NULL) {
        json_decref(resp);
        return false;
    }
    json_array_foreach(arr, i, v)
    {
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x > (json_int_t)UINT32_MAX) {
            pdgw_free(ids);
            json_decref(resp);
            return false;
        }
        ids[i] = (uint32_t)x;
    }
    json_decref(resp);
    *tokens = ids;
    *n = cnt;
    return true;
}

bool pdgw_tokenize_leg_done(pdgw_wf_t *wf, pdgw_leg_t *leg)
{
    pdgw_req_t *r = wf->req;
    pdgw_routing_t *rt = wf->w->srv->routing;
    pdgw_req_route_t *q = wf->rt;

    if (q == NULL || leg != q->leg)
        return false;
    if (tok_parse(leg, &q->tokens, &q->n_tokens)) {
        cache_put(rt, q->key, q->tokens, q->n_tokens);
        tok_count(rt, "ok");
    } else {
        static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
        uint64_t skipped = 0;
        tok_count(rt, "error");
        if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
            pdgw_log_warn("tokenize",
                          "req=%s POST /tokenize at %s gave no tokens (%s); routed without "
                          "(%llu similar suppressed)",
                          r->id, q->inst.id,
                          leg->errmsg[0] ? leg->errmsg : "not a tokenize response",
                          (unsigned long long)skipped);
    }
    tok_leg_free(q);
    if (wf->stage != PDGW_WF_FINISHED)
        pdgw_wf_start_attempt(wf);
    return true;
}

bool pdgw_tokenize_check_deadline(pdgw_wf_t *wf, uint64_t now_ms)
{
    pdgw_req_route_t *q = wf->rt;
    if (q == NULL || q->leg == NULL)
        return false;
    if (now_ms < q->t_deadline_ms)
        return true;
    /* Too slow: route without tokens rather than hold the request. */
    tok_count(wf->w->srv->routing, "timeout");
    tok_leg_free(q);
    if (wf->stage != PDGW_WF_FINISHED)
        pdgw_wf_start_attempt(wf);
    return false;
}

pdgw_status_t pdgw_route_server_start(pdgw_server_t *srv, char *err, size_t errlen)
{
    const pdgw_server_opts_t *o = &srv->opts;
    pdgw_status_t st = pdgw_route_create(&o->route, o->pool && sched_pool_has_kv_index(o->pool),
                                         o->metrics ? o->metrics->reg : NULL, &srv->routing);
    if (st != PDGW_OK)
        snprintf(err, errlen, "out of memory");
    return st;
}

void pdgw_route_server_stop(pdgw_server_t *srv)
{
    pdgw_route_destroy(srv->routing);
    srv->routing = NULL;
}
