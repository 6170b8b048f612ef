/*
 * OpenAI request validation (vLLM's rules and messages where they matter to
 * a client) and response formatting: full JSON bodies and SSE chunks in the
 * shape vLLM streams them.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

char *sim_openai_error_json(int status, const char *msg, const char *type, const char *param)
{
    json_t *err = json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", msg, "type", type, "param",
                            param ? json_string(param) : json_null(), "code", status);
    char *s = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    return s;
}

static int bad(char **msg, const char **param, const char *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(msg, fmt, ap) < 0)
        *msg = NULL;
    va_end(ap);
    *param = p;
    return 400;
}

/* Optional integer field: absent/null leaves *out; wrong type is an error. */
static int get_int(json_t *body, const char *key, long long lo, long long hi, long long *out,
                   int *present, char **msg, const char **param)
{
    json_t *v = json_object_get(body, key);
    if (present)
        *present = 0;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d))
            return bad(msg, param, key, "%s must be an integer", key);
        v = NULL;
        if (d < (double)lo || d > (double)hi)
            return bad(msg, param, key, "%s must be in [%lld, %lld], got %g", key, lo, hi, d);
        *out = (long long)d;
    } else if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < lo || x > hi)
            return bad(msg, param, key, "%s must be in [%lld, %lld], got %lld", key, lo, hi, x);
        *out = x;
    } else {
        return bad(msg, param, key, "%s must be an integer", key);
    }
    if (present)
        *present = 1;
    return 0;
}

static int get_num(json_t *body, const char *key, double lo, double hi, double *out, char **msg,
                   const char **param)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return bad(msg, param, key, "%s must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return bad(msg, param, key, "%s must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

static int get_bool(json_t *body, const char *key, int *out, char **msg, const char **param)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return bad(msg, param, key, "%s must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(json_t *body, sim_sampling_t *sp, char **msg, const char **param)
{
    json_t *v = json_object_get(body, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        sp->stop = calloc(1, sizeof(char *));
        if (!sp->stop || !(sp->stop[0] = strdup(json_string_value(v))))
            return bad(msg, param, "stop", "out of memory");
        sp->n_stop = 1;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *s;
        sp->stop = calloc(json_array_size(v) + 1, sizeof(char *));
        if (!sp->stop)
            return bad(msg, param, "stop", "out of memory");
        json_array_foreach(v, i, s)
        {
            if (!json_is_string(s))
                return bad(msg, param, "stop", "stop must be a string or a list of strings");
            if (!(sp->stop[sp->n_stop] = strdup(json_string_value(s))))
                return bad(msg, param, "stop", "out of memory");
            sp->n_stop++;
        }
    } else {
        return bad(msg, param, "stop", "stop must be a string or a list of strings");
    }
    for (size_t i = 0; i < sp->n_stop; i++)
        if (!sp->stop[i][0])
            return bad(msg, param, "stop", "stop strings must not be empty");
    return 0;
}

static int parse_prompt(json_t *body, sim_req_t *req, char **msg, const char **param)
{
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p))
        return bad(msg, param, "prompt", "prompt is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (sim_tokenize_text(body, json_string_value(p), json_string_length(p), &req->prompt))
            return bad(msg, param, "prompt", "the prompt does not tokenize");
    } else if (json_is_array(p)) {
        size_t i;
        json_t *t;
        if (json_array_size(p) && json_is_string(json_array_get(p, 0)))
            return bad(msg, param, "prompt", "only one prompt per request is supported");
        json_array_foreach(p, i, t)
        {
            if (!json_is_integer(t) || json_integer_value(t) < 0 ||
                json_integer_value(t) > 0x7fffffff)
                return bad(msg, param, "prompt",
                           "prompt must be a string, a list of token ids or one such list");
            if (sim_tokens_push(&req->prompt, (uint32_t)json_integer_value(t)))
                return bad(msg, param, "prompt", "out of memory");
        }
    } else {
        return bad(msg, param, "prompt",
                   "prompt must be a string, a list of token ids or one such list");
    }
    if (req->prompt.n == 0)
        return bad(msg, param, "prompt", "prompt cannot be empty");
    return 0;
}

static int parse_messages(json_t *body, sim_req_t *req, char **msg, const char **param)
{
    json_t *m = json_object_get(body, "messages");
    size_t i;
    json_t *e;
    if (!m || json_is_null(m))
        return bad(msg, param, "messages", "messages is required");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return bad(msg, param, "messages", "messages must be a non-empty list");
    json_array_foreach(m, i, e)
    {
        json_t *role = json_object_get(e, "role");
        json_t *content = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(role))
            return bad(msg, param, "messages", "messages[%zu] must be an object with a role", i);
        if (content && !json_is_null(content) && !json_is_string(content) &&
            !json_is_array(content))
            return bad(msg, param, "messages",
                       "messages[%zu].content must be a string or a list of parts", i);
    }
    char why[256];
    if (sim_tokenize_chat(body, &req->prompt, why, sizeof(why)) != 0)
        return bad(msg, param, "messages", "chat template: %s", why);
    return 0;
}

/* vLLM's prompt truncation (vllm/renderers/params.py, TokenizeParams): truncate_prompt_tokens
 * keeps that many prompt tokens (-1: the model length less max_tokens; no more than that may be
 * asked), the last ones unless truncation_side is "right" (a generation model's tokenizer cuts
 * from the left, vllm/tokenizers/registry.py). It applies to a prompt of text and of ids alike,
 * and to chat's templated prompt. */
static int truncate_prompt(json_t *body, sim_req_t *req, char **msg, const char **param)
{
    long long keep = 0, max_input = (long long)sim_cfg.max_model_len - req->sp.max_tokens;
    int present, rc;
    json_t *side = json_object_get(body, "truncation_side");
    int right = 0;
    if (side && !json_is_null(side)) {
        const char *s = json_string_value(side);
        if (s == NULL || (strcmp(s, "left") != 0 && strcmp(s, "right") != 0))
            return bad(msg, param, "truncation_side", "truncation_side must be 'left' or 'right'");
        right = strcmp(s, "right") == 0;
    }
    rc = get_int(body, "truncate_prompt_tokens", -1, INT64_MAX, &keep, &present, msg, param);
    if (rc || !present)
        return rc;
    if (keep == -1)
        keep = max_input;
    else if (keep > max_input)
        return bad(msg, param, "truncate_prompt_tokens",
                   "truncate_prompt_tokens=%lld cannot be greater than max_model_len - "
                   "max_tokens = %lld. Please request a smaller truncation size.",
                   keep, max_input);
    if (keep < 0 || (size_t)keep >= req->prompt.n)
        return 0;
    if (!right)
        memmove(req->prompt.ids, req->prompt.ids + (req->prompt.n - (size_t)keep),
                (size_t)keep * sizeof(req->prompt.ids[0]));
    req->prompt.n = (size_t)keep;
    if (req->prompt.n == 0)
        return bad(msg, param, "truncate_prompt_tokens", "prompt cannot be empty");
    return 0;
}

int sim_openai_parse(json_t *body, int is_chat, sim_req_t *req, char **msg, const char **param)
{
    int rc;
    long long v;
    int present;
    sim_sampling_t *sp = &req->sp;
    *msg = NULL;
    *param = NULL;
    req->is_chat = is_chat;

    json_t *model = json_object_get(body, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model))
            return bad(msg, param, "model", "model must be a string");
        if (!sim_model_served(json_string_value(model))) {
            if (asprintf(msg, "The model `%s` does not exist.", json_string_value(model)) < 0)
                *msg = NULL;
            *param = "model";
            return 404;
        }
    }
    /* vLLM's cache_salt (vllm/entrypoints/openai/completion/protocol.py and the chat one): a
     * string that salts the prefix cache */
    json_t *salt = json_object_get(body, "cache_salt");
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt) || json_string_length(salt) == 0)
            return bad(msg, param, "cache_salt", "cache_salt must be a non-empty string");
        free(req->prompt.cache_salt);
        if (!(req->prompt.cache_salt = strdup(json_string_value(salt))))
            return bad(msg, param, "cache_salt", "out of memory");
    }
    if ((rc = get_bool(body, "stream", &req->stream, msg, param)))
        return rc;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return bad(msg, param, "stream_options", "stream_options must be an object");
        if (!req->stream)
            return bad(msg, param, "stream_options",
                       "Stream options can only be defined when `stream=True`.");
        if ((rc = get_bool(so, "include_usage", &req->include_usage, msg, param)))
            return rc;
    }
    /* vLLM completion/protocol.py return_token_ids: the answer carries the prompt's and the
     * output's token ids (chat's variant is not imitated here) */
    if (!is_chat && !sim_cfg.no_return_token_ids &&
        (rc = get_bool(body, "return_token_ids", &req->return_token_ids, msg, param)))
        return rc;
    if ((rc = get_int(body, "n", 1, 1, &v, NULL, msg, param)))
        return rc;
    v = sim_cfg.max_tokens_default;
    if ((rc = get_int(body, "max_tokens", 1, 1 << 30, &v, &present, msg, param)))
        return rc;
    if (is_chat && (rc = get_int(body, "max_completion_tokens", 1, 1 << 30, &v, NULL, msg, param)))
        return rc;
    sp->max_tokens = (int)v;
    v = 0;
    if ((rc = get_int(body, "min_tokens", 0, 1 << 30, &v, NULL, msg, param)))
        return rc;
    if (v > sp->max_tokens)
        return bad(msg, param, "min_tokens",
                   "min_tokens must be less than or equal to "
                   "max_tokens=%d, got %lld",
                   sp->max_tokens, v);
    sp->min_tokens = (int)v;
    sp->temperature = 1.0;
    if ((rc = get_num(body, "temperature", 0, 1e6, &sp->temperature, msg, param)))
        return rc;
    double top_p = 1;
    if ((rc = get_num(body, "top_p", 0, 1, &top_p, msg, param)))
        return rc;
    if ((rc = get_int(body, "seed", -(1ll << 62), 1ll << 62, &v, &present, msg, param)))
        return rc;
    sp->seed = v;
    sp->has_seed = present;
    if ((rc = get_bool(body, "ignore_eos", &sp->ignore_eos, msg, param)))
        return rc;
    if ((rc = parse_stop(body, sp, msg, param)))
        return rc;
    rc = is_chat ? parse_messages(body, req, msg, param) : parse_prompt(body, req, msg, param);
    if (rc || (rc = truncate_prompt(body, req, msg, param)))
        return rc;
    if (req->prompt.n + (size_t)sp->max_tokens > (size_t)sim_cfg.max_model_len)
        return bad(msg, param, is_chat ? "messages" : "prompt",
                   "This model's maximum context length is %d tokens. However, you requested "
                   "%zu tokens (%zu in the messages, %d in the completion). Please reduce the "
                   "length of the messages or completion.",
                   sim_cfg.max_model_len, req->prompt.n + (size_t)sp->max_tokens, req->prompt.n,
                   sp->max_tokens);
    if (sim_blocks_needed(req->prompt.n + (size_t)sp->max_tokens) >
        sim_cfg.kv_capacity_tokens / sim_cfg.block_size)
        return bad(msg, param, is_chat ? "messages" : "prompt",
                   "request needs %zu tokens of KV cache but the engine holds only %d",
                   req->prompt.n + (size_t)sp->max_tokens, sim_cfg.kv_capacity_tokens);
    req->prompt_hash = sim_prompt_hash(&req->prompt);
    if (sim_output_plan(&req->prompt, sp, &req->out))
        return bad(msg, param, NULL, "out of memory");
    return 0;
}

/* vLLM (entrypoints/openai/serving_chat.py, serving_completion.py): prompt_tokens_details
 * carries cached_tokens only with --enable-prompt-tokens-details and a non-zero count. */
static json_t *usage_json(sim_req_t *req)
{
    json_t *details = sim_cfg.prompt_tokens_details && req->cached_tokens > 0
                          ? json_pack("{s:I}", "cached_tokens", (json_int_t)req->cached_tokens)
                          : json_null();
    return json_pack("{s:I,s:I,s:I,s:o}", "prompt_tokens", (json_int_t)req->prompt.n,
                     "completion_tokens", (json_int_t)req->out.n, "total_tokens",
                     (json_int_t)(req->prompt.n + req->out.n), "prompt_tokens_details", details);
}

static json_t *ids_json(const uint32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

char *sim_openai_full_response(sim_req_t *req)
{
    json_t *choice, *root;
    json_t *stop_reason = req->out.stop_reason ? json_string(req->out.stop_reason) : json_null();
    if (req->is_chat)
        choice = json_pack("{s:i,s:{s:s,s:s,s:[]},s:n,s:s,s:o}", "index", 0, "message", "role",
                           "assistant", "content", req->out.text, "tool_calls", "logprobs",
                           "finish_reason", req->out.finish_reason, "stop_reason", stop_reason);
    else
        choice = json_pack("{s:i,s:s,s:n,s:s,s:o,s:n}", "index", 0, "text", req->out.text,
                           "logprobs", "finish_reason", req->out.finish_reason, "stop_reason",
                           stop_reason, "prompt_logprobs");
    if (choice != NULL && req->return_token_ids) {
        /* vLLM completion/serving.py: the choice's prompt_token_ids and token_ids */
        json_object_set_new(choice, "prompt_token_ids", ids_json(req->prompt.ids, req->prompt.n));
        json_object_set_new(choice, "token_ids", ids_json(req->out.ids, req->out.n));
    }
    uint64_t engine_us = (req->t_done - req->t_arrive) / 1000;
    root = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:o,s:I}", "id", req->resp_id, "object",
                     req->is_chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)req->created, "model", sim_model_name(), "choices", choice,
                     "usage", usage_json(req), "kv_transfer_params",
                     req->resp_kv_params ? json_incref(req->resp_kv_params) : json_null(),
                     "sim_engine_time_us", (json_int_t)engine_us);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* ---- streaming ---- */
static int pend_reserve(sim_req_t *req, size_t add)
{
    if (req->pend_len + add + 1 <= req->pend_cap)
        return 0;
    size_t cap = req->pend_cap ? req->pend_cap : 512;
    while (cap < req->pend_len + add + 1)
        cap *= 2;
    char *p = realloc(req->pend, cap);
    if (!p)
        return -1;
    req->pend = p;
    req->pend_cap = cap;
    return 0;
}

static void pend_put(sim_req_t *req, const char *s, size_t n)
{
    if (pend_reserve(req, n))
        return;
    memcpy(req->pend + req->pend_len, s, n);
    req->pend_len += n;
    req->pend[req->pend_len] = 0;
}

#define PUTS(r, lit) pend_put((r), (lit), sizeof(lit) - 1)

static void pend_printf(sim_req_t *req, const char *fmt, ...)
{
    va_list ap;
    char small[512];
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        pend_put(req, small, (size_t)n);
        return;
    }
    if (pend_reserve(req, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(req->pend + req->pend_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    req->pend_len += (size_t)n;
}

static void pend_json_str(sim_req_t *req, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    PUTS(req, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            pend_put(req, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            pend_put(req, e, 6);
        } else {
            pend_put(req, (const char *)&c, 1);
        }
    }
    PUTS(req, "\"");
}

static void chunk_head(sim_req_t *req)
{
    PUTS(req, "data: {\"id\":");
    pend_json_str(req, req->resp_id, strlen(req->resp_id));
    pend_printf(req, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
                req->is_chat ? "chat.completion.chunk" : "text_completion",
                (long long)req->created);
    pend_json_str(req, sim_model_name(), strlen(sim_model_name()));
}

static void chunk_tail(sim_req_t *req)
{
    if (sim_cfg.emit_timestamps)
        pend_printf(req, ",\"sim_emit_ns\":%llu", (unsigned long long)sim_wall_ns());
    PUTS(req, "}\n\n");
}

static void pend_ids(sim_req_t *req, const char *name, const uint32_t *ids, size_t n)
{
    pend_printf(req, ",\"%s\":[", name);
    for (size_t i = 0; i < n; i++)
        pend_printf(req, i ? ",%u" : "%u", ids[i]);
    PUTS(req, "]");
}

/* Token <i>'s chunk; with return_token_ids it carries its id, and the first one the prompt's
 * (vLLM completion/serving.py, the stream generator). */
static void chunk_token(sim_req_t *req, size_t i, const char *piece, size_t n, const char *finish)
{
    chunk_head(req);
    if (req->is_chat)
        PUTS(req, ",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
    else
        PUTS(req, ",\"choices\":[{\"index\":0,\"text\":");
    pend_json_str(req, piece, n);
    if (req->is_chat)
        PUTS(req, "}");
    PUTS(req, ",\"logprobs\":null,\"finish_reason\":");
    if (finish)
        pend_printf(req, "\"%s\"", finish);
    else
        PUTS(req, "null");
    PUTS(req, ",\"stop_reason\":");
    if (finish && req->out.stop_reason)
        pend_json_str(req, req->out.stop_reason, strlen(req->out.stop_reason));
    else
        PUTS(req, "null");
    if (req->return_token_ids) {
        if (i == 0)
            pend_ids(req, "prompt_token_ids", req->prompt.ids, req->prompt.n);
        pend_ids(req, "token_ids", req->out.ids + i, 1);
    }
    PUTS(req, "}]");
    chunk_tail(req);
}

int sim_openai_stream_next(sim_req_t *req)
{
    int produced = 0;
    if (req->tail_sent)
        return -1;
    if (!req->head_sent) {
        req->head_sent = 1;
        if (req->is_chat && req->state != SIM_RS_FAILED) {
            chunk_head(req);
            PUTS(req,
                 ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"
                 ",\"logprobs\":null,\"finish_reason\":null}]");
            chunk_tail(req);
            produced = 1;
        }
    }
    size_t limit = req->emitted + 64; /* bound the work per call */
    while (req->emitted < req->tokens_ready && req->emitted < limit) {
        size_t i = req->emitted++;
        const char *piece = req->out.text + req->out.off[i];
        size_t n = req->out.off[i + 1] - req->out.off[i];
        int last = i + 1 == req->out.n;
        if (last)
            chunk_token(req, i, piece, n, req->out.finish_reason);
        else if (n || req->return_token_ids) /* a token without text still has its id */
            chunk_token(req, i, piece, n, NULL);
        produced = 1;
    }
    if (req->emitted < req->tokens_ready)
        return 1;
    if (req->state == SIM_RS_FAILED || req->state == SIM_RS_CANCELLED) {
        char *err =
            sim_openai_error_json(req->http_status ? req->http_status : 500,
                                  req->error_msg ? req->error_msg : "request aborted",
                                  req->error_type ? req->error_type : "InternalServerError", NULL);
        if (err) {
            pend_printf(req, "data: %s\n\n", err);
            free(err);
        }
        PUTS(req, "data: [DONE]\n\n");
        req->tail_sent = 1;
        return 1;
    }
    if (req->state == SIM_RS_DONE && req->emitted == req->out.n) {
        if (req->include_usage) {
            chunk_head(req);
            PUTS(req, ",\"choices\":[],\"usage\":");
            json_t *u = usage_json(req);
            char *us = u ? json_dumps(u, JSON_COMPACT) : NULL;
            json_decref(u);
            if (us) {
                pend_put(req, us, strlen(us));
                free(us);
            }
            chunk_tail(req);
        }
        PUTS(req, "data: [DONE]\n\n");
        req->tail_sent = 1;
        return 1;
    }
    return produced;
}
