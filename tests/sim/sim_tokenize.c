/*
 * vLLM's tokenizer endpoints (vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest
 * {model, prompt, add_special_tokens}, TokenizeChatRequest {model, messages,
 * add_generation_prompt, ...} -> TokenizeResponse {count, max_model_len, tokens};
 * DetokenizeRequest {model, tokens} -> DetokenizeResponse {prompt}).
 *
 * LMCache's disagg proxy (examples/disagg_prefill/disagg_proxy_server.py) calls POST /tokenize
 * with {"prompt": ...} or {"messages": ...} and sends the returned ids as the prefill's and
 * the decode's prompt. The ids are the ones its completions endpoints compute from text (the
 * model's tokenizer with --tokenizer, else the simulator's own, sim_text.c), so a prompt given
 * as ids is the same request as the text. Detokenizing knows the words the simulator generates;
 * other ids are a 400, as vLLM answers for ids outside its vocabulary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static char *fail(int *status, char **msg, const char *m)
{
    *status = 400;
    *msg = strdup(m);
    return NULL;
}

static char *tokenize(json_t *body, int *status, char **msg)
{
    json_t *prompt = json_object_get(body, "prompt");
    json_t *messages = json_object_get(body, "messages");
    sim_tokens_t t = {0};
    json_t *ids, *resp;
    char *out;
    if ((prompt != NULL) == (messages != NULL))
        return fail(status, msg, "exactly one of prompt or messages is required");
    if (prompt) {
        if (!json_is_string(prompt))
            return fail(status, msg, "prompt must be a string");
        if (sim_tokenize_text(body, json_string_value(prompt), json_string_length(prompt), &t)) {
            sim_tokens_free(&t);
            return fail(status, msg, "prompt does not tokenize");
        }
    } else {
        size_t i;
        json_t *m;
        char why[256];
        if (!json_is_array(messages) || json_array_size(messages) == 0)
            return fail(status, msg, "messages must be a non-empty list");
        json_array_foreach(messages, i, m) if (!json_is_object(m)) return fail(
            status, msg, "each message must be an object");
        if (sim_tokenize_chat(body, &t, why, sizeof(why)) != 0) {
            sim_tokens_free(&t);
            return fail(status, msg, why);
        }
    }
    ids = json_array();
    for (size_t i = 0; ids && i < t.n; i++)
        json_array_append_new(ids, json_integer(t.ids[i]));
    resp = ids ? json_pack("{s:I,s:i,s:o}", "count", (json_int_t)t.n, "max_model_len",
                           sim_cfg.max_model_len, "tokens", ids)
               : NULL;
    sim_tokens_free(&t);
    out = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
    json_decref(resp);
    return out;
}

static char *detokenize(json_t *body, int *status, char **msg)
{
    json_t *toks = json_object_get(body, "tokens");
    json_t *t, *resp;
    size_t i, len = 0;
    char *text, *out;
    if (!json_is_array(toks))
        return fail(status, msg, "tokens must be a list of integers");
    text = calloc(1, json_array_size(toks) * 16 + 1);
    if (!text)
        return NULL;
    json_array_foreach(toks, i, t)
    {
        const char *w =
            json_is_integer(t) && json_integer_value(t) >= 0 && json_integer_value(t) <= 0x7fffffff
                ? sim_word_of_id((uint32_t)json_integer_value(t))
                : NULL;
        if (json_is_integer(t) && json_integer_value(t) == SIM_EOS_TOKEN_ID)
            continue; /* a special token: skipped like vLLM's default */
        if (!w) {
            free(text);
            return fail(status, msg, "token id out of vocabulary");
        }
        len += (size_t)sprintf(text + len, " %s", w);
    }
    resp = json_pack("{s:s}", "prompt", text);
    free(text);
    out = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
    json_decref(resp);
    return out;
}

char *sim_tokenize_handle(const char *path, const char *body, size_t len, int *status, char **msg)
{
    json_t *b = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, NULL);
    char *out;
    *status = 200;
    *msg = NULL;
    if (!json_is_object(b)) {
        json_decref(b);
        return fail(status, msg, "request body must be a JSON object");
    }
    {
        /* vLLM checks `model` first (serving_tokenization.py: _check_model → 404); an
         * absent or null model is the served one. */
        json_t *m = json_object_get(b, "model");
        if (m && !json_is_null(m) &&
            (!json_is_string(m) || !sim_model_served(json_string_value(m)))) {
            *status = 404;
            if (asprintf(msg, "The model `%s` does not exist.",
                         json_is_string(m) ? json_string_value(m) : "?") < 0)
                *msg = NULL;
            json_decref(b);
            return NULL;
        }
    }
    out = !strcmp(path, "/tokenize") ? tokenize(b, status, msg) : detokenize(b, status, msg);
    json_decref(b);
    if (!out && !*msg) {
        *status = 500;
        *msg = strdup("out of memory");
    }
    return out;
}
