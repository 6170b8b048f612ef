/*
 * pdgw_validate.c - OpenAI request body validation and scheduling hints.
 *
 * Optional fields are checked from one table (name, applicable API, rule, bounds) so adding
 * a field is one row. null is accepted for every optional field and means "absent".
 * Bounds are the ones every engine enforces (vLLM's SamplingParams); limits an engine may
 * configure (max_logprobs, n) are left to the engine, so the gateway never refuses what the
 * engine behind it would accept.
 */
#include "pdgw_validate.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_json_load.h"
#include "pdgw_util.h"
#include "pdgw_validate_int.h"

static const field_rule_t field_rules[] = {
    {"stream", API_ANY, R_BOOL, 0, 0, 0, 0, false},
    {"echo", API_CMPL, R_BOOL, 0, 0, 0, 0, false},
    {"ignore_eos", API_ANY, R_BOOL, 0, 0, 0, 0, false},
    {"skip_special_tokens", API_ANY, R_BOOL, 0, 0, 0, 0, false},
    {"include_stop_str_in_output", API_ANY, R_BOOL, 0, 0, 0, 0, false},
    {"parallel_tool_calls", API_CHAT, R_BOOL, 0, 0, 0, 0, false},
    {"logprobs", API_CHAT, R_BOOL, 0, 0, 0, 0, false},
    {"max_tokens", API_ANY, R_INT, 1, BIG, 0, 0, false},
    {"max_completion_tokens", API_CHAT, R_INT, 1, BIG, 0, 0, false},
    {"min_tokens", API_ANY, R_INT, 0, BIG, 0, 0, false},
    {"n", API_ANY, R_INT, 1, BIG, 0, 0, false},
    {"best_of", API_ANY, R_INT, 1, BIG, 0, 0, false},
    {"logprobs", API_CMPL, R_INT, 0, BIG, 0, 0, false},
    {"top_logprobs", API_CHAT, R_INT, 0, BIG, 0, 0, false},
    {"top_k", API_ANY, R_INT, -1, BIG, 0, 0, false},
    {"seed", API_ANY, R_INT, INT64_MIN, BIG, 0, 0, false},
    {"temperature", API_ANY, R_NUM, 0, 0, 0.0, HUGE_VAL, false},
    {"top_p", API_ANY, R_NUM, 0, 0, 0.0, 1.0, true},
    {"min_p", API_ANY, R_NUM, 0, 0, 0.0, 1.0, false},
    {"presence_penalty", API_ANY, R_NUM, 0, 0, -2.0, 2.0, false},
    {"frequency_penalty", API_ANY, R_NUM, 0, 0, -2.0, 2.0, false},
    {"repetition_penalty", API_ANY, R_NUM, 0, 0, 0.0, HUGE_VAL, true},
    {"user", API_ANY, R_STRING, 0, 0, 0, 0, false},
    {"suffix", API_CMPL, R_STRING, 0, 0, 0, 0, false},
    {"stop", API_ANY, R_STOP, 0, 0, 0, 0, false},
    {"stop_token_ids", API_ANY, R_INT_ARRAY, 0, 0, 0, 0, false},
    {"stream_options", API_ANY, R_OBJECT, 0, 0, 0, 0, false},
    {"response_format", API_ANY, R_OBJECT, 0, 0, 0, 0, false},
    {"metadata", API_ANY, R_OBJECT, 0, 0, 0, 0, false},
    {"logit_bias", API_ANY, R_NUM_MAP, 0, 0, 0, 0, false},
    {"tools", API_CHAT, R_ARRAY_OBJ, 0, 0, 0, 0, false},
    {"tool_choice", API_CHAT, R_STR_OBJ, 0, 0, 0, 0, false},
};

#define N_FIELD_RULES (sizeof(field_rules) / sizeof(field_rules[0]))
_Static_assert(N_FIELD_RULES <= 64, "rules_by_letter holds a 64-bit set per letter");

/* For each first letter of a name, the set of rules (bit i: field_rules[i]) with a name that
 * starts with it: a body key is compared with those alone. */
static uint64_t rules_by_letter[26];
static pthread_once_t rules_indexed = PTHREAD_ONCE_INIT;

static void index_rules(void)
{
    for (size_t i = 0; i < N_FIELD_RULES; i++) {
        unsigned char c = (unsigned char)field_rules[i].name[0];
        if (c >= 'a' && c <= 'z')
            rules_by_letter[c - 'a'] |= 1ull << i;
    }
}

const field_rule_t *pdgw_validate_rule_for(const char *key, unsigned api)
{
    unsigned char c = (unsigned char)key[0];
    if (c < 'a' || c > 'z')
        return NULL;
    pthread_once(&rules_indexed, index_rules);
    for (uint64_t set = rules_by_letter[c - 'a']; set != 0; set &= set - 1) {
        const field_rule_t *r = &field_rules[__builtin_ctzll(set)];
        if ((r->apis & api) && strcmp(r->name, key) == 0)
            return r;
    }
    return NULL;
}

/* ---------------------------------------------------------------- error helpers */

static pdgw_status_t fail(pdgw_api_error_t *err, const char *param, const char *code,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static pdgw_status_t fail(pdgw_api_error_t *err, const char *param, const char *code,
                          const char *fmt, ...)
{
    char msg[PDGW_API_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pdgw_api_error_set(err, PDGW_API_ERR_BAD_REQUEST, param, "%s", msg);
    pdgw_api_error_set_code(err, code);
    return PDGW_ERR_INVALID;
}

static pdgw_status_t fail_type(pdgw_api_error_t *err, const char *param, const char *expected)
{
    return fail(err, param, "invalid_type", "Invalid type for '%s': expected %s.", param, expected);
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- parse */

pdgw_status_t pdgw_request_parse(const char *body, size_t len, json_t **out, pdgw_api_error_t *err)
{
    if (body == NULL || len == 0) {
        pdgw_api_error_set(err, PDGW_API_ERR_BAD_REQUEST, NULL,
                           "Request body is empty: expected a JSON object.");
        pdgw_api_error_set_code(err, "invalid_json");
        return PDGW_ERR_PARSE;
    }
    json_error_t jerr;
    json_t *j = pdgw_json_loadb(body, len, &jerr); /* long prompts decoded fast */
    if (j == NULL) {
        pdgw_api_error_set(err, PDGW_API_ERR_BAD_REQUEST, NULL,
                           "Invalid JSON in request body at line %d, column %d: %s", jerr.line,
                           jerr.column, jerr.text);
        pdgw_api_error_set_code(err, "invalid_json");
        return PDGW_ERR_PARSE;
    }
    if (!json_is_object(j)) {
        pdgw_api_error_set(err, PDGW_API_ERR_BAD_REQUEST, NULL,
                           "Request body must be a JSON object, got %s.", json_type_name(j));
        pdgw_api_error_set_code(err, "invalid_json");
        json_decref(j);
        return PDGW_ERR_PARSE;
    }
    *out = j;
    return PDGW_OK;
}

pdgw_status_t pdgw_api_kind_from_path(const char *path, pdgw_api_kind_t *out)
{
    if (path == NULL)
        return PDGW_ERR_NOT_FOUND;
    if (strcmp(path, "/v1/completions") == 0) {
        *out = PDGW_API_COMPLETIONS;
        return PDGW_OK;
    }
    if (strcmp(path, "/v1/chat/completions") == 0) {
        *out = PDGW_API_CHAT_COMPLETIONS;
        return PDGW_OK;
    }
    return PDGW_ERR_NOT_FOUND;
}

/* ---------------------------------------------------------------- optional fields */

static pdgw_status_t check_rule(const field_rule_t *r, const json_t *v, pdgw_api_error_t *err)
{
    const char *p = r->name;
    char sub[PDGW_API_ERR_PARAM_MAX];
    switch (r->rule) {
    case R_BOOL:
        return json_is_boolean(v) ? PDGW_OK : fail_type(err, p, "a boolean");
    case R_INT: {
        if (!json_is_integer(v))
            return fail_type(err, p, "an integer");
        json_int_t x = json_integer_value(v);
        if (x < r->imin || x > r->imax) {
            if (r->imax == BIG)
                return fail(err, p, "invalid_value", "'%s' must be >= %lld, got %lld.", p,
                            (long long)r->imin, (long long)x);
            return fail(err, p, "invalid_value", "'%s' must be between %lld and %lld, got %lld.", p,
                        (long long)r->imin, (long long)r->imax, (long long)x);
        }
        return PDGW_OK;
    }
    case R_NUM: {
        if (!json_is_number(v))
            return fail_type(err, p, "a number");
        double x = json_number_value(v);
        bool low = r->min_open ? !(x > r->dmin) : !(x >= r->dmin);
        if (low || !(x <= r->dmax)) {
            if (isinf(r->dmax))
                return fail(err, p, "invalid_value", "'%s' must be > %g, got %g.", p, r->dmin, x);
            return fail(err, p, "invalid_value", "'%s' must be in %s%g, %g], got %g.", p,
                        r->min_open ? "(" : "[", r->dmin, r->dmax, x);
        }
        return PDGW_OK;
    }
    case R_STRING:
        return json_is_string(v) ? PDGW_OK : fail_type(err, p, "a string");
    case R_STOP:
        if (json_is_string(v))
            return PDGW_OK;
        if (!json_is_array(v))
            return fail_type(err, p, "a string or an array of strings");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (!json_is_string(json_array_get(v, i))) {
                snprintf(sub, sizeof(sub), "%s[%zu]", p, i);
                return fail_type(err, sub, "a string");
            }
        }
        return PDGW_OK;
    case R_INT_ARRAY:
        if (!json_is_array(v))
            return fail_type(err, p, "an array of integers");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (!json_is_integer(json_array_get(v, i))) {
                snprintf(sub, sizeof(sub), "%s[%zu]", p, i);
                return fail_type(err, sub, "an integer");
            }
        }
        return PDGW_OK;
    case R_OBJECT:
        return json_is_object(v) ? PDGW_OK : fail_type(err, p, "an object");
    case R_NUM_MAP: {
        if (!json_is_object(v))
            return fail_type(err, p, "an object");
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            if (!json_is_number(x)) {
                snprintf(sub, sizeof(sub), "%s.%s", p, k);
                return fail_type(err, sub, "a number");
            }
        }
        return PDGW_OK;
    }
    case R_ARRAY_OBJ:
        if (!json_is_array(v))
            return fail_type(err, p, "an array of objects");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (!json_is_object(json_array_get(v, i))) {
                snprintf(sub, sizeof(sub), "%s[%zu]", p, i);
                return fail_type(err, sub, "an object");
            }
        }
        return PDGW_OK;
    case R_STR_OBJ:
        return json_is_string(v) || json_is_object(v) ? PDGW_OK
                                                      : fail_type(err, p, "a string or an object");
    }
    return PDGW_OK;
}

/* The members validation reads by name, found in one walk of the body: a lookup by name
 * hashes the name each time, and a body has a handful of members. NULL = absent; a jansson
 * object holds each name once, so this is what json_object_get gives. */
typedef struct known {
    const json_t *model, *stream, *stream_options, *response_format, *max_tokens,
        *max_completion_tokens, *n, *prompt;
} known_t;

static void find_known(const json_t *body, known_t *k)
{
    const char *key;
    const json_t *v;
    memset(k, 0, sizeof(*k));
    json_object_foreach((json_t *)body, key, v)
    {
        switch (key[0]) {
        case 'm':
            if (strcmp(key, "model") == 0)
                k->model = v;
            else if (strcmp(key, "max_tokens") == 0)
                k->max_tokens = v;
            else if (strcmp(key, "max_completion_tokens") == 0)
                k->max_completion_tokens = v;
            break;
        case 's':
            if (strcmp(key, "stream") == 0)
                k->stream = v;
            else if (strcmp(key, "stream_options") == 0)
                k->stream_options = v;
            break;
        case 'r':
            if (strcmp(key, "response_format") == 0)
                k->response_format = v;
            break;
        case 'n':
            if (key[1] == '\0')
                k->n = v;
            break;
        case 'p':
            if (strcmp(key, "prompt") == 0)
                k->prompt = v;
            break;
        default:
            break;
        }
    }
}

static pdgw_status_t check_optional(pdgw_api_kind_t kind, const json_t *body, const known_t *k,
                                    pdgw_api_error_t *err)
{
    unsigned api = 1u << kind;
    /* Walk the body's keys (a handful) rather than probing every rule (dozens). */
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)body, key, v)
    {
        if (json_is_null(v))
            continue;
        const field_rule_t *r = pdgw_validate_rule_for(key, api);
        pdgw_status_t st = r != NULL ? check_rule(r, v, err) : PDGW_OK;
        if (st != PDGW_OK)
            return st;
    }
    const json_t *so = k->stream_options;
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_true(k->stream))
            return fail(err, "stream_options", "invalid_value",
                        "'stream_options' is only allowed when 'stream' is true.");
        static const char *const so_bools[] = {"include_usage", "continuous_usage_stats"};
        for (size_t i = 0; i < 2; i++) {
            const json_t *b = json_object_get(so, so_bools[i]);
            if (b != NULL && !json_is_null(b) && !json_is_boolean(b)) {
                char sub[64];
                snprintf(sub, sizeof(sub), "stream_options.%s", so_bools[i]);
                return fail_type(err, sub, "a boolean");
            }
        }
    }
    const json_t *rf = k->response_format;
    if (rf != NULL && json_is_object(rf) && !json_is_string(json_object_get(rf, "type")))
        return fail_type(err, "response_format.type", "a string");
    return PDGW_OK;
}

/* ---------------------------------------------------------------- prompts */

/* Token id arrays: every element an integer in [0, INT32_MAX]; <name> for messages. */
static pdgw_status_t check_ids(const json_t *arr, const char *name, pdgw_api_error_t *err)
{
    char sub[PDGW_API_ERR_PARAM_MAX];
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *x = json_array_get(arr, i);
        snprintf(sub, sizeof(sub), "%s[%zu]", name, i);
        if (!json_is_integer(x))
            return fail_type(err, sub, "an integer token id");
        json_int_t t = json_integer_value(x);
        if (t < 0 || t > INT32_MAX)
            return fail(err, sub, "invalid_value", "Token id %lld in '%s' is out of range.",
                        (long long)t, sub);
    }
    return PDGW_OK;
}

static pdgw_status_t copy_ids(const json_t *arr, pdgw_request_info_t *info)
{
    size_t n = json_array_size(arr);
    info->prompt_tokens = pdgw_malloc((n ? n : 1) * sizeof(int32_t));
    if (info->prompt_tokens == NULL)
        return PDGW_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        info->prompt_tokens[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    info->n_prompt_tokens = n;
    return PDGW_OK;
}

int64_t pdgw_validate_est_tokens(size_t bytes)
{
    return (int64_t)((bytes + 3) / 4);
}

/* <key> holds the prompt(s): "prompt" (completions), "text" or "input_ids" (native generate). */
static pdgw_status_t validate_prompt_key(const json_t *prompt, const char *key,
                                         pdgw_request_info_t *info, pdgw_api_error_t *err)
{
    if (prompt == NULL || json_is_null(prompt))
        return fail(err, key, "missing_required_parameter", "Missing required parameter: '%s'.",
                    key);
    const char *expected =
        "a string, an array of strings, an array of token ids or an array of token id arrays";
    if (json_is_string(prompt)) {
        size_t len = json_string_length(prompt);
        info->prompt_text = json_string_value(prompt);
        info->prompt_text_len = len;
        info->n_prompts = 1;
        info->est_prompt_tokens = pdgw_validate_est_tokens(len);
        return PDGW_OK;
    }
    if (!json_is_array(prompt))
        return fail_type(err, key, expected);
    size_t n = json_array_size(prompt);
    if (n == 0)
        return fail(err, key, "invalid_value", "'%s' must not be empty.", key);
    const json_t *first = json_array_get(prompt, 0);
    char sub[PDGW_API_ERR_PARAM_MAX];
    pdgw_status_t st;
    if (json_is_integer(first)) {
        st = check_ids(prompt, key, err);
        if (st != PDGW_OK)
            return st;
        info->n_prompts = 1;
        info->est_prompt_tokens = (int64_t)n;
        return copy_ids(prompt, info);
    }
    if (json_is_string(first)) {
        int64_t est = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(prompt, i);
            if (!json_is_string(x)) {
                snprintf(sub, sizeof(sub), "%s[%zu]", key, i);
                return fail_type(err, sub, "a string");
            }
            est += pdgw_validate_est_tokens(json_string_length(x));
        }
        info->prompt_text = json_string_value(first);
        info->prompt_text_len = json_string_length(first);
        info->n_prompts = n;
        info->est_prompt_tokens = est;
        return PDGW_OK;
    }
    if (json_is_array(first)) {
        int64_t est = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(prompt, i);
            snprintf(sub, sizeof(sub), "%s[%zu]", key, i);
            if (!json_is_array(x))
                return fail_type(err, sub, "an array of token ids");
            if (json_array_size(x) == 0)
                return fail(err, sub, "invalid_value", "'%s' must not be empty.", sub);
            st = check_ids(x, sub, err);
            if (st != PDGW_OK)
                return st;
            est += (int64_t)json_array_size(x);
        }
        info->n_prompts = n;
        info->est_prompt_tokens = est;
        return copy_ids(first, info);
    }
    snprintf(sub, sizeof(sub), "%s[0]", key);
    return fail_type(err, sub, "a string, a token id or an array of token ids");
}

static pdgw_status_t validate_messages(const json_t *body, pdgw_request_info_t *info,
                                       pdgw_api_error_t *err)
{
    const json_t *msgs = json_object_get(body, "messages");
    if (msgs == NULL || json_is_null(msgs))
        return fail(err, "messages", "missing_required_parameter",
                    "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs))
        return fail_type(err, "messages", "an array of message objects");
    if (json_array_size(msgs) == 0)
        return fail(err, "messages", "invalid_value", "'messages' must not be empty.");

    pdgw_buf_t text = PDGW_BUF_INIT;
    pdgw_status_t st = PDGW_OK;
    char sub[PDGW_API_ERR_PARAM_MAX];
    for (size_t i = 0; i < json_array_size(msgs) && st == PDGW_OK; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            snprintf(sub, sizeof(sub), "messages[%zu]", i);
            st = fail_type(err, sub, "an object");
            break;
        }
        const json_t *role = json_object_get(m, "role");
        snprintf(sub, sizeof(sub), "messages[%zu].role", i);
        if (role == NULL || json_is_null(role)) {
            st = fail(err, sub, "missing_required_parameter", "Missing required parameter: '%s'.",
                      sub);
            break;
        }
        if (!json_is_string(role) || json_string_length(role) == 0) {
            st = json_is_string(role) ? fail(err, sub, "invalid_value", "'%s' is empty.", sub)
                                      : fail_type(err, sub, "a string");
            break;
        }
        const char *r = json_string_value(role);
        const json_t *content = json_object_get(m, "content");
        snprintf(sub, sizeof(sub), "messages[%zu].content", i);
        bool may_omit = strcmp(r, "assistant") == 0;
        if (content == NULL || json_is_null(content)) {
            if (!may_omit) {
                st = fail(err, sub, "missing_required_parameter",
                          "Missing required parameter: '%s'.", sub);
                break;
            }
        } else if (!json_is_string(content) && !json_is_array(content)) {
            st = fail_type(err, sub, "a string or an array of content parts");
            break;
        }
        st = pdgw_buf_appendf(&text, "%s\n", r);
        if (st != PDGW_OK)
            break;
        if (json_is_string(content)) {
            st = pdgw_buf_append(&text, json_string_value(content), json_string_length(content));
            if (st == PDGW_OK)
                st = pdgw_buf_append_char(&text, '\n');
        } else if (json_is_array(content)) {
            for (size_t k = 0; k < json_array_size(content) && st == PDGW_OK; k++) {
                const json_t *part = json_array_get(content, k);
                snprintf(sub, sizeof(sub), "messages[%zu].content[%zu]", i, k);
                if (!json_is_object(part)) {
                    st = fail_type(err, sub, "a content part object");
                    break;
                }
                const json_t *type = json_object_get(part, "type");
                if (!json_is_string(type)) {
                    snprintf(sub, sizeof(sub), "messages[%zu].content[%zu].type", i, k);
                    st = fail_type(err, sub, "a string");
                    break;
                }
                if (strcmp(json_string_value(type), "text") != 0)
                    continue;
                const json_t *t = json_object_get(part, "text");
                if (!json_is_string(t)) {
                    snprintf(sub, sizeof(sub), "messages[%zu].content[%zu].text", i, k);
                    st = fail_type(err, sub, "a string");
                    break;
                }
                st = pdgw_buf_append(&text, json_string_value(t), json_string_length(t));
                if (st == PDGW_OK)
                    st = pdgw_buf_append_char(&text, '\n');
            }
        }
    }
    if (st != PDGW_OK) {
        pdgw_buf_free(&text);
        return st;
    }
    info->prompt_text_len = text.len;
    info->prompt_text = pdgw_buf_steal(&text, NULL);
    if (info->prompt_text == NULL)
        return PDGW_ERR_NOMEM;
    info->prompt_text_owned = true;
    info->n_prompts = 1;
    info->est_prompt_tokens = pdgw_validate_est_tokens(info->prompt_text_len);
    return PDGW_OK;
}

/* ---------------------------------------------------------------- native generate */

/* SGLang's POST /generate (GenerateReqInput, python/sglang/srt/managers/io_struct.py): the
 * prompt is "text" (a string or a batch of strings) or "input_ids" (ids or a batch of id
 * arrays), not both; "sampling_params" is an object, or one per item of a batch, whose
 * "max_new_tokens" bounds the output; "stream" is a boolean; "model" is optional. Other
 * fields are left to the engine. */
static pdgw_status_t validate_generate(const json_t *body, pdgw_request_info_t *info,
                                       pdgw_api_error_t *err)
{
    const json_t *text = json_object_get(body, "text");
    const json_t *ids = json_object_get(body, "input_ids");
    const json_t *sp = json_object_get(body, "sampling_params");
    const json_t *st0 = json_object_get(body, "stream");
    const json_t *model = json_object_get(body, "model");
    const json_t *mnt;
    pdgw_request_info_t r;
    pdgw_status_t st;
    bool has_text = text != NULL && !json_is_null(text);
    bool has_ids = ids != NULL && !json_is_null(ids);
    if (!json_is_object(body))
        return fail(err, NULL, "invalid_type", "Request body must be a JSON object.");
    if (has_text == has_ids)
        return fail(err, has_text ? "input_ids" : "text",
                    has_text ? "invalid_value" : "missing_required_parameter",
                    "Exactly one of 'text' and 'input_ids' must be given.");
    if (st0 != NULL && !json_is_null(st0) && !json_is_boolean(st0))
        return fail_type(err, "stream", "a boolean");
    if (model != NULL && !json_is_null(model) && !json_is_string(model))
        return fail_type(err, "model", "a string");
    if (sp != NULL && !json_is_null(sp) && !json_is_object(sp) && !json_is_array(sp))
        return fail_type(err, "sampling_params", "an object or an array of objects");
    mnt = json_is_object(sp) ? json_object_get(sp, "max_new_tokens") : NULL;
    if (mnt != NULL && !json_is_null(mnt) && (!json_is_integer(mnt) || json_integer_value(mnt) < 0))
        return fail(err, "sampling_params.max_new_tokens", "invalid_value",
                    "'sampling_params.max_new_tokens' must be an integer >= 0.");
    memset(&r, 0, sizeof(r));
    r.kind = PDGW_API_GENERATE;
    r.model = json_is_string(model) ? json_string_value(model) : NULL;
    r.stream = json_is_true(st0);
    r.max_tokens = json_is_integer(mnt) ? json_integer_value(mnt) : -1;
    r.n = 1;
    st = validate_prompt_key(has_text ? text : ids, has_text ? "text" : "input_ids", &r, err);
    if (st == PDGW_OK && has_text && !json_is_string(text) &&
        !json_is_string(json_array_get(text, 0)))
        st = fail_type(err, "text", "a string or an array of strings");
    if (st != PDGW_OK) {
        pdgw_request_info_release(&r);
        if (st == PDGW_ERR_NOMEM)
            pdgw_api_error_set(err, PDGW_API_ERR_INTERNAL, NULL, "Out of memory.");
        return st;
    }
    *info = r;
    return PDGW_OK;
}

/* ---------------------------------------------------------------- entry point */

pdgw_status_t pdgw_request_validate(pdgw_api_kind_t kind, const json_t *body,
                                    pdgw_request_info_t *info, pdgw_api_error_t *err)
{
    if (kind == PDGW_API_GENERATE)
        return validate_generate(body, info, err);
    if (kind != PDGW_API_COMPLETIONS && kind != PDGW_API_CHAT_COMPLETIONS)
        return PDGW_ERR_INVALID;
    if (!json_is_object(body))
        return fail(err, NULL, "invalid_type", "Request body must be a JSON object.");
    known_t k;
    find_known(body, &k);
    const json_t *model = k.model;
    if (model == NULL || json_is_null(model))
        return fail(err, "model", "missing_required_parameter",
                    "Missing required parameter: 'model'.");
    if (!json_is_string(model))
        return fail_type(err, "model", "a string");
    if (json_string_length(model) == 0)
        return fail(err, "model", "invalid_value", "'model' must not be empty.");

    pdgw_status_t st = check_optional(kind, body, &k, err);
    if (st != PDGW_OK)
        return st;

    pdgw_request_info_t r;
    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.model = json_string_value(model);
    r.stream = json_is_true(k.stream);
    r.include_usage = k.stream_options != NULL &&
                      json_is_true(json_object_get(k.stream_options, "include_usage"));
    r.max_tokens = -1;
    const json_t *mt = k.max_completion_tokens;
    if (kind != PDGW_API_CHAT_COMPLETIONS || !json_is_integer(mt))
        mt = k.max_tokens;
    if (json_is_integer(mt))
        r.max_tokens = json_integer_value(mt);
    r.n = json_is_integer(k.n) ? json_integer_value(k.n) : 1;

    st = kind == PDGW_API_COMPLETIONS ? validate_prompt_key(k.prompt, "prompt", &r, err)
                                      : validate_messages(body, &r, err);
    if (st != PDGW_OK) {
        pdgw_request_info_release(&r);
        if (st == PDGW_ERR_NOMEM)
            pdgw_api_error_set(err, PDGW_API_ERR_INTERNAL, NULL, "Out of memory.");
        return st;
    }
    *info = r;
    return PDGW_OK;
}

void pdgw_request_info_release(pdgw_request_info_t *info)
{
    if (info == NULL)
        return;
    if (info->prompt_text_owned)
        pdgw_free((char *)info->prompt_text);
    pdgw_free(info->prompt_tokens);
    info->prompt_text = NULL;
    info->prompt_text_owned = false;
    info->prompt_tokens = NULL;
    info->prompt_text_len = 0;
    info->n_prompt_tokens = 0;
}
