/*
 * SGLang's native POST /generate, as pdgw-sim imitates it (one prompt per request):
 *   request: "text" or "input_ids", "sampling_params" (max_new_tokens, temperature, top_p,
 *            stop, ignore_eos), "stream", "return_logprob", the PD bootstrap fields;
 *   answer:  {"text", "meta_info": {"id", "finish_reason", "prompt_tokens",
 *            "completion_tokens", "cached_tokens", and with return_logprob
 *            "input_token_logprobs" / "output_token_logprobs" as [logprob, token_id, null]}};
 *   stream:  "data: <the same object so far>" per token, the text cumulative, then
 *            "data: [DONE]" (python/sglang/srt/entrypoints/http_server.py;
 *            test/srt/test_httpserver_decode_stream.py reads "text" as cumulative).
 * A PD prefill reports the prompt's logprobs; a PD decode, which never ran the prompt through
 * the model, an empty list (what SGLang's mini_lb.py prepends the prefill's list to).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static int gen_bad(char **msg, const char **param, const char *p, const char *m)
{
    *msg = strdup(m);
    *param = p;
    return 400;
}

int sim_generate_parse(json_t *body, sim_req_t *req, char **msg, const char **param)
{
    json_t *text = json_object_get(body, "text"), *ids = json_object_get(body, "input_ids");
    json_t *sp = json_object_get(body, "sampling_params"), *o, *v;
    static const char *const pass[] = {"temperature", "top_p", "stop", "ignore_eos", "seed"};
    int rc;
    size_t i;
    *msg = NULL;
    *param = NULL;
    if (json_is_null(text))
        text = NULL;
    if (json_is_null(ids))
        ids = NULL;
    if ((text == NULL) == (ids == NULL))
        return gen_bad(msg, param, "text", "Either text or input_ids should be provided.");
    if ((text && !json_is_string(text)) || (ids && json_is_array(json_array_get(ids, 0))))
        return gen_bad(msg, param, text ? "text" : "input_ids",
                       "pdgw-sim serves one prompt per /generate request");
    if (sp != NULL && !json_is_null(sp) && !json_is_object(sp))
        return gen_bad(msg, param, "sampling_params", "sampling_params must be an object");
    /* The OpenAI parser does the rest: the same sampling, tokenizer and output plan. */
    o = json_object();
    if (o == NULL)
        return gen_bad(msg, param, NULL, "out of memory");
    json_object_set(o, "prompt", text ? text : ids);
    if ((v = json_object_get(body, "stream")) != NULL)
        json_object_set(o, "stream", v);
    if (json_is_object(sp)) {
        if ((v = json_object_get(sp, "max_new_tokens")) != NULL)
            json_object_set(o, "max_tokens", v);
        for (i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
            if ((v = json_object_get(sp, pass[i])) != NULL)
                json_object_set(o, pass[i], v);
    }
    rc = sim_openai_parse(o, 0, req, msg, param);
    json_decref(o);
    if (rc && *param && !strcmp(*param, "max_tokens"))
        *param = "sampling_params.max_new_tokens";
    if (rc && *param && !strcmp(*param, "prompt"))
        *param = text ? "text" : "input_ids";
    req->generate = 1;
    req->return_logprob = json_is_true(json_object_get(body, "return_logprob"));
    return rc;
}

/* A deterministic stand-in for a logprob and an output token id. */
static double gen_logprob(uint64_t h, size_t i)
{
    return -(double)((h >> (i % 48)) % 1000 + i % 7) / 250.0;
}

static json_t *gen_logprob_list(sim_req_t *req, int input, size_t n)
{
    json_t *a = json_array();
    size_t i;
    for (i = 0; a != NULL && i < n; i++) {
        json_int_t id = input ? (json_int_t)req->prompt.ids[i]
                              : (json_int_t)((req->prompt_hash + 7919u * (i + 1)) % 32000u);
        json_array_append_new(
            a, json_pack("[f,I,n]", gen_logprob(req->prompt_hash, i + (input ? 0 : 4096)), id));
    }
    return a;
}

/* The answer after <k> output tokens (the whole one when k == out.n and the request is done). */
static json_t *gen_object(sim_req_t *req, size_t k)
{
    json_t *fr = json_null(), *meta, *root;
    int done = k == req->out.n; /* the output is planned up front */
    if (done && req->out.stop_reason)
        fr = json_pack("{s:s,s:s}", "type", "stop", "matched", req->out.stop_reason);
    else if (done && !strcmp(req->out.finish_reason, "length"))
        fr = json_pack("{s:s,s:I}", "type", "length", "length", (json_int_t)req->out.n);
    else if (done)
        fr = json_pack("{s:s,s:n}", "type", "stop", "matched");
    meta = json_pack("{s:s,s:o,s:I,s:I,s:I}", "id", req->request_id, "finish_reason", fr,
                     "prompt_tokens", (json_int_t)req->prompt.n, "completion_tokens", (json_int_t)k,
                     "cached_tokens", (json_int_t)req->cached_tokens);
    if (meta != NULL && req->return_logprob) {
        size_t n_in = sim_cfg.role == SIM_ROLE_DECODE ? 0 : req->prompt.n;
        json_object_set_new(meta, "input_token_logprobs", gen_logprob_list(req, 1, n_in));
        json_object_set_new(meta, "output_token_logprobs", gen_logprob_list(req, 0, k));
    }
    root = json_pack("{s:s%,s:o}", "text", req->out.text, req->out.off[k], "meta_info", meta);
    return root;
}

char *sim_generate_full_response(sim_req_t *req)
{
    json_t *o = gen_object(req, req->out.n);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static void gen_put(sim_req_t *req, const char *s, size_t n)
{
    if (req->pend_len + n + 1 > req->pend_cap) {
        size_t cap = req->pend_cap ? req->pend_cap : 512;
        char *p;
        while (cap < req->pend_len + n + 1)
            cap *= 2;
        p = realloc(req->pend, cap);
        if (p == NULL)
            return;
        req->pend = p;
        req->pend_cap = cap;
    }
    memcpy(req->pend + req->pend_len, s, n);
    req->pend_len += n;
    req->pend[req->pend_len] = 0;
}

static void gen_event(sim_req_t *req, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s == NULL)
        return;
    gen_put(req, "data: ", 6);
    gen_put(req, s, strlen(s));
    gen_put(req, "\n\n", 2);
    free(s);
}

int sim_generate_stream_next(sim_req_t *req)
{
    int produced = 0;
    size_t limit = req->emitted + 64; /* bound the work per call */
    if (req->tail_sent)
        return -1;
    while (req->emitted < req->tokens_ready && req->emitted < limit) {
        req->emitted++;
        gen_event(req, gen_object(req, req->emitted));
        produced = 1;
    }
    if (req->emitted < req->tokens_ready)
        return 1;
    if (req->state == SIM_RS_FAILED || req->state == SIM_RS_CANCELLED) {
        gen_event(req, json_pack("{s:{s:s}}", "error", "message",
                                 req->error_msg ? req->error_msg : "request aborted"));
        gen_put(req, "data: [DONE]\n\n", 14);
        req->tail_sent = 1;
        return 1;
    }
    if (req->state == SIM_RS_DONE && req->emitted == req->out.n) {
        gen_put(req, "data: [DONE]\n\n", 14);
        req->tail_sent = 1;
        return 1;
    }
    return produced;
}
