/*
 * fwd_lmcache_flow.c - LMCache's current disagg flow ("first_tok"), as its reference proxy
 * runs it (LMCache examples/disagg_prefill/disagg_proxy_server.py, handle_completions and
 * handle_chat_completions):
 *   1. POST /tokenize {"prompt": p} (chat: {"messages": m}) -> token ids;
 *   2. prefill: the request with prompt = ids, max_tokens 1 (max_completion_tokens 1 when
 *      present), stream false, no stream_options, kv_transfer_params = {ret_first_tok: true,
 *      disagg_spec: {...}}, always to /v1/completions; its answer carries
 *      kv_transfer_params.first_tok (LMCache's vLLM connector, vllm_v1_adapter.py
 *      request_finished) and the first token's text in choices[0].text;
 *   3. decode: the request with prompt = ids + [first_tok], max_tokens - 1 (and
 *      max_completion_tokens - 1), no kv_transfer_params, to /v1/completions; a decode run with
 *      skip_last_n_tokens: 1 looks up the KV of ids alone;
 *   4. the client first gets the first token (completions: one text_completion chunk with the
 *      prefill's id, created and model; chat: a role chunk, then a content chunk), then the
 *      decode's chunks (chat: converted to chat.completion.chunk).
 * Where pdgw differs on purpose: the decode keeps the client's stream flag and a non-stream
 * answer is merged into one object; usage counts the first token as generated (prompt_tokens
 * - 1, completion_tokens + 1: the decode saw it as prompt); min_tokens / min_completion_tokens
 * are split between the legs (1 for the prefill's token, the rest for the decode) and the chat
 * messages from both legs once the prompt holds their token ids; /tokenize also gets the
 * client's model and chat-template options (tools, chat_template_kwargs, ...); and when the first
 * token already ended the answer (EOS or a stop string: the prefill's finish_reason is "stop") the
 * decode is asked for one token only and its output is dropped, where LMCache's proxy would let the
 * decode continue past the end. A completions prompt of text skips step 1 (option prompt_ids:
 * prefill, the default): the prefill gets the text and return_token_ids, and vLLM answers the ids
 * it made in choices[0].prompt_token_ids (vllm/entrypoints/openai/completion/serving.py), one call
 * less per request. Unlike the other two-stage flows the prefill keeps ignore_eos and stop as the
 * client sent them: its one token is the first token of the answer.
 */
#include "fwd_lmcache_int.h"

#include <stdlib.h>
#include <string.h>

/* The completions prompt, unwrapped when it is one prompt (a text or an id list) in a list. */
static const json_t *one_prompt(const pdgw_fwd_request_t *req)
{
    const json_t *p = json_object_get(req->body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    return p;
}

json_t *lmc_flow_tokenize_body(const pdgw_fwd_request_t *req, json_t **ids)
{
    const json_t *p = req->is_chat ? NULL : one_prompt(req);
    *ids = NULL;
    if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n;
        /* already token ids: nothing to tokenize (NULL ids when they are not all ids, or on
         * no memory: the older flow runs then) */
        *ids = pdgw_fwd_ids_text_from(p, &n);
        return NULL;
    }
    /* with the chat-template options the client set (tools, chat_template_kwargs, ...),
     * which LMCache's proxy leaves out: the ids are the ones the request itself runs on */
    return pdgw_fwd_tokenize_body(req, p);
}

int lmc_flow_prompt_is_text(const pdgw_fwd_request_t *req)
{
    return !req->is_chat && json_is_string(one_prompt(req));
}

/* Whether the client set <key> to something that asks for it: true, a string, list or object,
 * or a number above <above>; absent, null and false do not. */
static int asks(const json_t *body, const char *key, json_int_t above)
{
    const json_t *v = json_object_get(body, key);
    if (v == NULL || json_is_null(v) || json_is_false(v))
        return 0;
    return !json_is_integer(v) || json_integer_value(v) > above;
}

/* A grammar the engine applies to the answer from its first token (structured outputs:
 * response_format other than text, structured_outputs, the older guided_* fields): the decode
 * would start it again after the prefill's token. */
static int constrained(const json_t *b)
{
    static const char *const fields[] = {"structured_outputs", "guided_json",    "guided_regex",
                                         "guided_choice",      "guided_grammar", NULL};
    const json_t *rf = json_object_get(b, "response_format");
    const char *type = json_string_value(json_object_get(rf, "type"));
    size_t i;
    if (json_is_object(rf) && (type == NULL || strcmp(type, "text") != 0))
        return 1;
    for (i = 0; fields[i] != NULL; i++)
        if (asks(b, fields[i], INT64_MIN))
            return 1;
    return 0;
}

/* What only a chat endpoint answers: tool calls (tools with a tool_choice other than "none",
 * which vLLM's chat_completion/protocol.py makes "auto" when tools come without one; a
 * "required" or named tool_choice is also a JSON schema the answer follows from its first
 * token, vllm/tool_parsers/utils.py) and media in the messages (ids from /tokenize carry no
 * image or audio: the same protocol file drops forwarded ids when messages hold non-text
 * content). The first_tok flow's legs are completions requests. */
static int needs_chat_endpoint(const json_t *b)
{
    const json_t *tools = json_object_get(b, "tools"), *tc = json_object_get(b, "tool_choice");
    const json_t *msg, *part;
    const char *choice = json_string_value(tc);
    size_t i, j;
    if (json_is_object(tc) || (choice != NULL && strcmp(choice, "required") == 0) ||
        (json_is_array(tools) && json_array_size(tools) > 0 &&
         !(choice != NULL && strcmp(choice, "none") == 0)))
        return 1;
    json_array_foreach(json_object_get(b, "messages"), i, msg)
    {
        json_array_foreach(json_object_get(msg, "content"), j, part)
        {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (type == NULL || strcmp(type, "text") != 0)
                return 1;
        }
    }
    return 0;
}

int lmc_flow_answer_fits(const pdgw_fwd_request_t *req)
{
    const json_t *b = req->body;
    if (req->is_chat && needs_chat_endpoint(b))
        return 0;
    /* echo (completions: the prompt's text first; chat's prefill leg is a completions
     * request too), several choices, beam search, per-token or prompt logprobs
     * (vllm/entrypoints/openai/completion/protocol.py, chat_completion/protocol.py) */
    return !asks(b, "echo", -1) && !asks(b, "n", 1) && !asks(b, "best_of", 1) &&
           !asks(b, "use_beam_search", -1) && !asks(b, "logprobs", INT64_MIN) &&
           !asks(b, "prompt_logprobs", INT64_MIN) && !constrained(b);
}

int lmc_flow_truncates(const pdgw_fwd_request_t *req)
{
    const json_t *t = json_object_get(req->body, "truncate_prompt_tokens");
    return t != NULL && !json_is_null(t);
}

/* min_tokens of the prefill's one token: 1 when the client asked any, else none. */
static void min_one(json_t *b, const char *key)
{
    json_t *v = json_object_get(b, key);
    if (json_is_integer(v) && json_integer_value(v) > 0)
        json_object_set_new(b, key, json_integer(1));
    else
        json_object_del(b, key);
}

json_t *lmc_flow_prefill_body(const pdgw_fwd_request_t *req, const json_t *ids, int ask_ids,
                              json_t *spec)
{
    json_t *kvp = spec ? json_pack("{s:b,s:o}", "ret_first_tok", 1, "disagg_spec", spec) : NULL;
    json_t *b = kvp ? fwd_pd_body_decode(req, kvp) : NULL;
    if (b == NULL)
        return NULL;
    json_object_del(b, "messages");
    /* the ids as text (forwarder.h pdgw_fwd_ids_text_*): never changed once read, so the
     * prefill body shares them */
    if (ids != NULL)
        json_object_set(b, "prompt", (json_t *)ids);
    if (ask_ids)
        json_object_set_new(b, "return_token_ids", json_true()); /* the ids come back */
    json_object_set_new(b, "max_tokens", json_integer(1));
    if (json_object_get(b, "max_completion_tokens"))
        json_object_set_new(b, "max_completion_tokens", json_integer(1));
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
    /* min_tokens counts the whole answer, whose first token this is: at most 1 here (an engine
     * refuses more than max_tokens), and 1 keeps EOS from ending the answer at once, as it
     * would on one engine; the decode gets the rest */
    min_one(b, "min_tokens");
    min_one(b, "min_completion_tokens");
    return b;
}

/* <key> less the prefill's one token, not below 0 (max_tokens, min_tokens and the like). */
static void minus_one(json_t *b, const char *key)
{
    json_t *v = json_object_get(b, key);
    if (json_is_integer(v) && json_integer_value(v) > 0)
        json_object_set_new(b, key, json_integer(json_integer_value(v) - 1));
}

json_t *lmc_flow_decode_body(const pdgw_fwd_request_t *req, const json_t *ids, int ids_cut,
                             const lmc_head_t *head)
{
    json_int_t first_tok = head->first_tok;
    json_t *b = fwd_pd_body_decode(req, NULL);
    json_t *prompt = pdgw_fwd_ids_text_append(ids, first_tok); /* ids + [first_tok] */
    if (b == NULL || prompt == NULL) {
        json_decref(b);
        json_decref(prompt);
        return NULL;
    }
    json_object_del(b, "messages");
    json_object_del(b, "kv_transfer_params");
    json_object_set_new(b, "prompt", prompt);
    if (ids_cut) /* the prefill's prompt_token_ids are already cut: cutting them again would
                  * move the decode's window off the KV the prefill made */
        json_object_del(b, "truncate_prompt_tokens");
    minus_one(b, "max_tokens");
    minus_one(b, "max_completion_tokens");
    minus_one(b, "min_tokens");
    minus_one(b, "min_completion_tokens");
    if (head->done) {
        /* the answer is complete: the decode's output will be dropped, keep it short */
        json_object_set_new(b, "max_tokens", json_integer(1));
        if (json_object_get(b, "max_completion_tokens"))
            json_object_set_new(b, "max_completion_tokens", json_integer(1));
        json_object_del(b, "min_tokens");
        json_object_del(b, "min_completion_tokens");
    }
    return b;
}

static char *dup_str(const json_t *v, const char *def)
{
    const char *s = json_string_value(v);
    return strdup(s ? s : def);
}

int lmc_flow_read_prefill(const json_t *resp, lmc_head_t *head, char *msg, size_t cap)
{
    const json_t *kvp = json_object_get(resp, "kv_transfer_params");
    const json_t *ft = json_object_get(kvp, "first_tok");
    const json_t *ch = json_array_get(json_object_get(resp, "choices"), 0);
    if (!json_is_integer(ft) || json_integer_value(ft) < 0) {
        snprintf(msg, cap,
                 "prefill answer has no kv_transfer_params.first_tok (does the prefill run "
                 "LMCache's connector with ret_first_tok support?)");
        return -1;
    }
    lmc_head_clear(head);
    head->first_tok = json_integer_value(ft);
    head->text = dup_str(json_object_get(ch, "text"), "");
    head->id = dup_str(json_object_get(resp, "id"), "");
    head->model = dup_str(json_object_get(resp, "model"), "");
    head->created = json_integer_value(json_object_get(resp, "created"));
    {
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        head->done = fr != NULL && strcmp(fr, "stop") == 0;
        if (json_is_object(json_object_get(resp, "usage")))
            head->usage = json_deep_copy(json_object_get(resp, "usage"));
        if (head->done)
            head->stop_reason = json_deep_copy(json_object_get(ch, "stop_reason"));
    }
    if (!head->text || !head->id || !head->model) {
        lmc_head_clear(head);
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    return 0;
}

/* <names>' values of the object at <text>, each parsed on its own, into a new object; -1 when
 * the text must be parsed whole (a member name written with escapes). */
static int small_members(const char *text, size_t len, const char *const *names, size_t n,
                         json_t **obj, const char **vals, size_t *lens)
{
    size_t i;
    if (pdgw_fwd_json_members(text, len, names, vals, lens) != 0 || (*obj = json_object()) == NULL)
        return -1;
    for (i = 0; i < n; i++)
        if (vals[i] != NULL)
            json_object_set_new(*obj, names[i],
                                json_loadb(vals[i], lens[i], JSON_DECODE_ANY, NULL));
    return 0;
}

int lmc_flow_read_prefill_text(const char *text, size_t len, lmc_head_t *head, json_t **ids,
                               char *msg, size_t cap)
{
    /* "choices" is read apart (its prompt_token_ids are read as text, not as a tree) */
    static const char *const top[] = {
        "kv_transfer_params", "id", "model", "created", "usage", "choices", NULL};
    static const char *const inner[] = {"text", "finish_reason", "stop_reason", NULL};
    const char *tv[6], *cv[3], *ch = NULL;
    size_t tl[6], cl[3], chl = 0, n;
    json_t *resp = NULL, *choice = NULL;
    int rc;

    if (small_members(text, len, top, 5, &resp, tv, tl) != 0 ||
        (tv[5] != NULL && pdgw_fwd_json_first(tv[5], tl[5], &ch, &chl) < 0) ||
        (ch != NULL && small_members(ch, chl, inner, 3, &choice, cv, cl) != 0)) {
        /* written in a way the text readers leave to the parser */
        const json_t *p;
        json_decref(resp);
        resp = json_loadb(text, len, 0, NULL);
        p = json_object_get(json_array_get(json_object_get(resp, "choices"), 0),
                            "prompt_token_ids");
        if (ids != NULL)
            *ids = pdgw_fwd_ids_text_from(p, &n);
    } else {
        if (choice != NULL)
            json_object_set_new(resp, "choices", json_pack("[o]", choice));
        if (ids != NULL)
            *ids = ch ? pdgw_fwd_answer_ids_text(ch, chl, "prompt_token_ids", &n) : NULL;
    }
    rc = lmc_flow_read_prefill(resp, head, msg, cap);
    json_decref(resp);
    if (rc != 0 && ids != NULL) {
        json_decref(*ids);
        *ids = NULL;
    }
    return rc;
}

void lmc_head_clear(lmc_head_t *head)
{
    free(head->text);
    free(head->id);
    free(head->model);
    json_decref(head->stop_reason);
    json_decref(head->usage);
    memset(head, 0, sizeof(*head));
}

/* The first token was generated, not prompt: move it from prompt_tokens to completion_tokens. */
static void fix_usage(json_t *obj)
{
    json_t *u = json_object_get(obj, "usage");
    json_t *pt = json_object_get(u, "prompt_tokens");
    json_t *ct = json_object_get(u, "completion_tokens");
    if (!json_is_object(u) || !json_is_integer(pt) || !json_is_integer(ct) ||
        json_integer_value(pt) < 1)
        return;
    json_object_set_new(u, "prompt_tokens", json_integer(json_integer_value(pt) - 1));
    json_object_set_new(u, "completion_tokens", json_integer(json_integer_value(ct) + 1));
}

/* The head events (stream): what LMCache's proxy yields before the decode's chunks. */
static void add_head(json_t *out, const lmc_head_t *h, int chat)
{
    if (chat) {
        json_array_append_new(out, json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:{s:s,s:s},s:n,s:n}]}",
                                             "id", h->id, "object", "chat.completion.chunk",
                                             "created", h->created, "model", h->model, "choices",
                                             "index", 0, "delta", "role", "assistant", "content",
                                             "", "logprobs", "finish_reason"));
        json_array_append_new(out,
                              json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:{s:s},s:n,s:n}]}", "id", h->id,
                                        "object", "chat.completion.chunk", "created", h->created,
                                        "model", h->model, "choices", "index", 0, "delta",
                                        "content", h->text, "logprobs", "finish_reason"));
    } else {
        json_array_append_new(out,
                              json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:s,s:n,s:n,s:n}],s:n}", "id",
                                        h->id, "object", "text_completion", "created", h->created,
                                        "model", h->model, "choices", "index", 0, "text", h->text,
                                        "logprobs", "finish_reason", "stop_reason", "usage"));
    }
}

json_t *lmc_flow_head_events(const lmc_head_t *h, int chat)
{
    json_t *out = json_array();
    if (out != NULL)
        add_head(out, h, chat);
    return out;
}

/* A text_completion object (chunk or whole answer) as its chat counterpart. */
static json_t *to_chat(const json_t *c, int sse, const char *prefix)
{
    json_t *choices = json_array(), *o, *ch;
    size_t i;
    json_array_foreach(json_object_get(c, "choices"), i, ch)
    {
        const char *text = json_string_value(json_object_get(ch, "text"));
        char *full = NULL;
        json_t *msg, *item;
        if (prefix != NULL) {
            size_t n = strlen(prefix) + strlen(text ? text : "") + 1;
            full = malloc(n);
            if (full)
                snprintf(full, n, "%s%s", prefix, text ? text : "");
        }
        msg = sse ? json_pack("{s:s}", "content", text ? text : "")
                  : json_pack("{s:s,s:s}", "role", "assistant", "content",
                              full ? full : (text ? text : ""));
        free(full);
        item = json_pack("{s:O,s:o,s:O,s:O}", "index", json_object_get(ch, "index"),
                         sse ? "delta" : "message", msg, "logprobs",
                         json_object_get(ch, "logprobs") ? json_object_get(ch, "logprobs")
                                                         : json_null(),
                         "finish_reason",
                         json_object_get(ch, "finish_reason") ? json_object_get(ch, "finish_reason")
                                                              : json_null());
        if (item && !sse && json_object_get(ch, "stop_reason"))
            json_object_set(item, "stop_reason", json_object_get(ch, "stop_reason"));
        json_array_append_new(choices, item);
    }
    o = json_pack("{s:O,s:s,s:O,s:O,s:o}", "id",
                  json_object_get(c, "id") ? json_object_get(c, "id") : json_null(), "object",
                  sse ? "chat.completion.chunk" : "chat.completion", "created",
                  json_object_get(c, "created") ? json_object_get(c, "created") : json_null(),
                  "model", json_object_get(c, "model") ? json_object_get(c, "model") : json_null(),
                  "choices", choices);
    if (o && json_object_get(c, "usage"))
        json_object_set(o, "usage", json_object_get(c, "usage"));
    return o;
}

/* The prefill's one token ended the answer: the client's answer is the prefill's. */
static json_t *rewrite_done(lmc_head_t *h, const pdgw_fwd_request_t *req, int sse,
                            const json_t *resp)
{
    json_t *o, *out;
    /* the prefill's own usage (stream: where the decode reports usage) */
    json_t *u = h->usage && (!sse || json_is_object(json_object_get(resp, "usage")))
                    ? json_deep_copy(h->usage)
                    : NULL;
    json_t *sr = h->stop_reason ? json_incref(h->stop_reason) : json_null();
    if (!sse) {
        json_t *choice = req->is_chat
                             ? json_pack("{s:i,s:{s:s,s:s},s:n,s:s,s:o}", "index", 0, "message",
                                         "role", "assistant", "content", h->text, "logprobs",
                                         "finish_reason", "stop", "stop_reason", sr)
                             : json_pack("{s:i,s:s,s:n,s:s,s:o}", "index", 0, "text", h->text,
                                         "logprobs", "finish_reason", "stop", "stop_reason", sr);
        o = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", h->id, "object",
                      req->is_chat ? "chat.completion" : "text_completion", "created", h->created,
                      "model", h->model, "choices", choice);
        if (o && u)
            json_object_set_new(o, "usage", u);
        else
            json_decref(u);
        return o;
    }
    json_decref(sr);
    out = json_array();
    if (out != NULL && !h->sent) {
        add_head(out, h, req->is_chat);
        /* the end of the answer, as a chunk of its own */
        json_array_append_new(
            out,
            req->is_chat
                ? json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:{},s:n,s:s}]}", "id", h->id, "object",
                            "chat.completion.chunk", "created", h->created, "model", h->model,
                            "choices", "index", 0, "delta", "logprobs", "finish_reason", "stop")
                : json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:s,s:n,s:s}]}", "id", h->id, "object",
                            "text_completion", "created", h->created, "model", h->model, "choices",
                            "index", 0, "text", "", "logprobs", "finish_reason", "stop"));
        h->sent = 1;
    }
    if (out != NULL && u != NULL) {
        /* stream_options.include_usage: the usage chunk, for the prefill's answer */
        json_array_append_new(
            out, json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", h->id, "object",
                           req->is_chat ? "chat.completion.chunk" : "text_completion", "created",
                           h->created, "model", h->model, "choices", "usage", u));
        u = NULL;
    }
    json_decref(u);
    return out;
}

/* <resp> with new objects where the rewrite edits it (the top level, choices, choices[0],
 * usage); every other value is shared with <resp>. A deep copy would rebuild the whole answer,
 * logprobs and all, for every request. */
static json_t *copy_for_edit(const json_t *resp)
{
    json_t *c = json_copy((json_t *)resp), *chs, *u;
    if (c == NULL)
        return NULL;
    chs = json_object_get(c, "choices");
    if (json_is_array(chs)) {
        json_t *nchs = json_copy(chs);
        json_t *ch0 = json_array_get(nchs, 0);
        if (nchs == NULL || json_object_set_new(c, "choices", nchs) != 0 ||
            (json_is_object(ch0) && json_array_set_new(nchs, 0, json_copy(ch0)) != 0))
            goto fail;
    }
    u = json_object_get(c, "usage");
    if (json_is_object(u) && json_object_set_new(c, "usage", json_copy(u)) != 0)
        goto fail;
    return c;
fail:
    json_decref(c);
    return NULL;
}

json_t *lmc_flow_rewrite(lmc_head_t *head, const pdgw_fwd_request_t *req, int sse,
                         const json_t *resp)
{
    json_t *c;
    if (!json_is_object(resp) || json_object_get(resp, "error"))
        return NULL; /* an error event or body passes unchanged */
    if (head->done)
        return rewrite_done(head, req, sse, resp);
    if (!sse) {
        json_t *ch;
        if (req->is_chat) {
            c = to_chat(resp, 0, head->text);
        } else {
            const char *text;
            char *full;
            size_t n;
            c = copy_for_edit(resp);
            ch = json_array_get(json_object_get(c, "choices"), 0);
            text = json_string_value(json_object_get(ch, "text"));
            n = strlen(head->text) + strlen(text ? text : "") + 1;
            full = malloc(n);
            if (ch && full) {
                snprintf(full, n, "%s%s", head->text, text ? text : "");
                json_object_set_new(ch, "text", json_string(full));
            }
            free(full);
        }
        if (c)
            fix_usage(c);
        return c;
    }
    {
        json_t *out = json_array();
        if (out == NULL)
            return NULL;
        if (!head->sent) {
            add_head(out, head, req->is_chat);
            head->sent = 1;
        }
        c = req->is_chat ? to_chat(resp, 1, NULL) : copy_for_edit(resp);
        if (c) {
            fix_usage(c);
            json_array_append_new(out, c);
        }
        return out;
    }
}
