/*
 * fwd_lmcache_tok.c - the tokenize call of the lmcache forwarder's first_tok flow.
 *
 * LMCache's disagg proxy (examples/disagg_prefill/disagg_proxy_server.py) asks an engine's
 * vLLM POST /tokenize ({"prompt": ...} or {"messages": ...}; answer {"tokens": [...]}) before
 * the prefill leg, and sends the token ids as the prompt of both legs. The call runs on the
 * request's worker (forwarder.h pdgw_fwd_call_post): a thread of our own would cost two
 * hand-overs between threads per request and serialise every request's call on it.
 */
#include "fwd_lmcache_int.h"

#include <stdio.h>

lmc_tok_job_t *lmc_tok_start(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                             json_t *body, int64_t timeout_ms)
{
    return pdgw_fwd_call_post(req, inst, "/tokenize", body, timeout_ms > 0 ? timeout_ms : 1);
}

int lmc_tok_result(const lmc_tok_job_t *j, json_t **tokens, char *msg, size_t cap)
{
    const char *data = NULL;
    size_t len = 0, i;
    long status = 0;
    json_t *doc, *toks, *v;
    char why[200];
    int st = pdgw_fwd_call_result(j, &status, &data, &len, why, sizeof(why));
    if (st == 0)
        return 0;
    if (st < 0) {
        snprintf(msg, cap, "tokenize call failed: %s", why);
        return -1;
    }
    if (status != 200) {
        snprintf(msg, cap, "tokenize answered HTTP %ld", status);
        return -1;
    }
    toks = pdgw_fwd_answer_ids_text(data, len, "tokens", &i);
    if (toks != NULL && i > 0) {
        *tokens = toks; /* kept as text: never a jansson integer per id */
        return 1;
    }
    json_decref(toks);
    /* not a plain id list: the whole parse says what is wrong */
    doc = json_loadb(data, len, 0, NULL);
    toks = doc ? json_object_get(doc, "tokens") : NULL;
    if (!json_is_array(toks) || json_array_size(toks) == 0) {
        snprintf(msg, cap, "tokenize answer has no tokens list");
        json_decref(doc);
        return -1;
    }
    json_array_foreach(toks, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(msg, cap, "tokenize answer has a token that is not an id");
            json_decref(doc);
            return -1;
        }
    }
    /* Valid after all (written in a way the text reader leaves to the parser: "1e0"?). */
    *tokens = pdgw_fwd_ids_text_from(toks, &i);
    json_decref(doc);
    if (*tokens == NULL) {
        snprintf(msg, cap, "tokenize answer has a token that is not an id");
        return -1;
    }
    return 1;
}

void lmc_tok_release(lmc_tok_job_t *j)
{
    pdgw_fwd_call_release(j);
}
