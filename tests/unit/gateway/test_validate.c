/*
 * test_validate.c - request validation table (param, code, status), extraction of
 * scheduling hints, and the OpenAI error builders of pdgw_errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_alloc.h"
#include "pdgw_errors.h"
#include "pdgw_validate.h"

typedef struct vcase {
    pdgw_api_kind_t kind;
    const char *body;
    const char *param; /* NULL = JSON null */
    const char *code;
} vcase_t;

#define CMPL PDGW_API_COMPLETIONS
#define CHAT PDGW_API_CHAT_COMPLETIONS

/* Every row must be refused with 400 invalid_request_error and exactly this param/code. */
static const vcase_t bad_cases[] = {
    {CMPL, "[]", NULL, "invalid_type"},
    {CMPL, "{\"prompt\":\"hi\"}", "model", "missing_required_parameter"},
    {CMPL, "{\"model\":null,\"prompt\":\"hi\"}", "model", "missing_required_parameter"},
    {CMPL, "{\"model\":5,\"prompt\":\"hi\"}", "model", "invalid_type"},
    {CMPL, "{\"model\":\"\",\"prompt\":\"hi\"}", "model", "invalid_value"},
    {CMPL, "{\"model\":\"m\"}", "prompt", "missing_required_parameter"},
    {CMPL, "{\"model\":\"m\",\"prompt\":5}", "prompt", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":{}}", "prompt", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[]}", "prompt", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[\"a\",1]}", "prompt[1]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt[1]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt[1]", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[1,4294967296]}", "prompt[1]", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[[1],[]]}", "prompt[1]", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[[1],[2,\"x\"]]}", "prompt[1][1]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[[1],3]}", "prompt[1]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":[true]}", "prompt[0]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", "stream", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":1}", "stream", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-5}", "max_tokens", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":\"10\"}", "max_tokens",
     "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature",
     "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":-1}", "top_p", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":-0.1}", "temperature",
     "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}", "top_p", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":1.01}", "top_p", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":0}", "n", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":-2}", "top_k", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"presence_penalty\":3}", "presence_penalty",
     "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"repetition_penalty\":0}", "repetition_penalty",
     "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":5}", "stop", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",null]}", "stop[1]", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":-1}", "logprobs", "invalid_value"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"echo\":\"no\"}", "echo", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"seed\":1.0}", "seed", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"user\":7}", "user", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}",
     "stream_options", "invalid_value"},
    {CMPL,
     "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":"
     "1}}",
     "stream_options.include_usage", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":[]}",
     "stream_options", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"50256\":\"x\"}}",
     "logit_bias.50256", "invalid_type"},
    {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[1,\"2\"]}", "stop_token_ids[1]",
     "invalid_type"},
    {CHAT, "{\"model\":\"m\"}", "messages", "missing_required_parameter"},
    {CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "messages", "invalid_type"},
    {CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages", "invalid_value"},
    {CHAT, "{\"model\":\"m\",\"messages\":[5]}", "messages[0]", "invalid_type"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role",
     "missing_required_parameter"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role",
     "invalid_type"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\"}]"
     "}",
     "messages[1].content", "missing_required_parameter"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
     "messages[0].content", "invalid_type"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
     "messages[0].content[0]", "invalid_type"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}",
     "messages[0].content[0].type", "invalid_type"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
     "\"text\":3}]}]}",
     "messages[0].content[0].text", "invalid_type"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}",
     "logprobs", "invalid_type"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":"
     "-1}",
     "top_logprobs", "invalid_value"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
     "\"max_completion_tokens\":0}",
     "max_completion_tokens", "invalid_value"},
    {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[1]}",
     "tools[0]", "invalid_type"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":1}",
     "tool_choice", "invalid_type"},
    {CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
     "{}}",
     "response_format.type", "invalid_type"},
};

static void test_bad_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const vcase_t *c = &bad_cases[i];
        json_error_t jerr;
        json_t *body = json_loads(c->body, JSON_DECODE_ANY, &jerr);
        if (body == NULL)
            fail_msg("case %zu: test body does not parse: %s", i, jerr.text);
        pdgw_request_info_t info;
        pdgw_api_error_t err;
        memset(&err, 0, sizeof(err));
        pdgw_status_t st = pdgw_request_validate(c->kind, body, &info, &err);
        if (st != PDGW_ERR_INVALID)
            fail_msg("case %zu (%s): accepted", i, c->body);
        assert_int_equal(pdgw_api_error_http_status(&err), 400);
        assert_string_equal(pdgw_api_err_type(err.kind), "invalid_request_error");
        if (strcmp(err.param, c->param ? c->param : "") != 0 || strcmp(err.code, c->code) != 0)
            fail_msg("case %zu (%s): got param '%s' code '%s' msg '%s'", i, c->body, err.param,
                     err.code, err.message);
        assert_true(strlen(err.message) > 10);
        json_decref(body);
    }
}

/* Each optional field is checked where its API has it, with the wrong type refused under its
 * own name, and left alone by the API that does not have it. */
static void test_every_optional_field_is_checked(void **state)
{
    static const struct {
        const char *name;
        unsigned apis; /* 1: completions, 2: chat */
        const char *wrong;
    } fields[] = {
        {"stream", 3, "\"x\""},
        {"echo", 1, "\"x\""},
        {"ignore_eos", 3, "\"x\""},
        {"skip_special_tokens", 3, "\"x\""},
        {"include_stop_str_in_output", 3, "\"x\""},
        {"parallel_tool_calls", 2, "\"x\""},
        {"logprobs", 3, "\"x\""},
        {"max_tokens", 3, "\"x\""},
        {"max_completion_tokens", 2, "\"x\""},
        {"min_tokens", 3, "\"x\""},
        {"n", 3, "\"x\""},
        {"best_of", 3, "\"x\""},
        {"top_logprobs", 2, "\"x\""},
        {"top_k", 3, "\"x\""},
        {"seed", 3, "\"x\""},
        {"temperature", 3, "\"x\""},
        {"top_p", 3, "\"x\""},
        {"min_p", 3, "\"x\""},
        {"presence_penalty", 3, "\"x\""},
        {"frequency_penalty", 3, "\"x\""},
        {"repetition_penalty", 3, "\"x\""},
        {"user", 3, "5"},
        {"suffix", 1, "5"},
        {"stop", 3, "5"},
        {"stop_token_ids", 3, "\"x\""},
        {"stream_options", 3, "\"x\""},
        {"response_format", 3, "\"x\""},
        {"metadata", 3, "\"x\""},
        {"logit_bias", 3, "\"x\""},
        {"tools", 2, "\"x\""},
        {"tool_choice", 2, "5"},
    };
    static const char *const base[] = {
        "{\"model\":\"m\",\"prompt\":\"x\",\"%s\":%s}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"%s\":%s}",
    };
    static const pdgw_api_kind_t kinds[] = {CMPL, CHAT};
    (void)state;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        for (int k = 0; k < 2; k++) {
            char text[256];
            pdgw_request_info_t info;
            pdgw_api_error_t err;
            snprintf(text, sizeof(text), base[k], fields[i].name, fields[i].wrong);
            json_t *body = json_loads(text, 0, NULL);
            assert_non_null(body);
            memset(&err, 0, sizeof(err));
            pdgw_status_t st = pdgw_request_validate(kinds[k], body, &info, &err);
            if (fields[i].apis & (1u << k)) {
                if (st != PDGW_ERR_INVALID || strcmp(err.param, fields[i].name) != 0 ||
                    strcmp(err.code, "invalid_type") != 0)
                    fail_msg("%s: status %d, param '%s', code '%s'", text, st, err.param, err.code);
            } else {
                if (st != PDGW_OK)
                    fail_msg("%s: refused (%s) where the API has no such field", text, err.message);
                pdgw_request_info_release(&info);
            }
            json_decref(body);
        }
    }
}

static json_t *load(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

static void test_good_completions(void **state)
{
    (void)state;
    pdgw_request_info_t info;
    pdgw_api_error_t err;
    json_t *b = load("{\"model\":\"m1\",\"prompt\":\"hello world!\",\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true},\"max_tokens\":16,"
                     "\"temperature\":3.5,\"top_p\":1,\"logprobs\":50,\"best_of\":300,\"stop\":["
                     "\"\\n\"],\"seed\":-1,"
                     "\"user\":null,\"n\":2}");
    assert_int_equal(pdgw_request_validate(CMPL, b, &info, &err), PDGW_OK);
    assert_string_equal(info.model, "m1");
    assert_true(info.stream);
    assert_true(info.include_usage);
    assert_int_equal(info.max_tokens, 16);
    assert_int_equal(info.n, 2);
    assert_string_equal(info.prompt_text, "hello world!");
    assert_int_equal(info.prompt_text_len, 12);
    assert_null(info.prompt_tokens);
    assert_int_equal(info.n_prompts, 1);
    assert_int_equal(info.est_prompt_tokens, 3);
    pdgw_request_info_release(&info);
    json_decref(b);

    b = load("{\"model\":\"m\",\"prompt\":[1,2,3,4,5]}");
    assert_int_equal(pdgw_request_validate(CMPL, b, &info, &err), PDGW_OK);
    assert_false(info.stream);
    assert_int_equal(info.max_tokens, -1);
    assert_int_equal(info.n, 1);
    assert_null(info.prompt_text);
    assert_int_equal(info.n_prompt_tokens, 5);
    assert_int_equal(info.prompt_tokens[4], 5);
    assert_int_equal(info.est_prompt_tokens, 5);
    pdgw_request_info_release(&info);
    json_decref(b);

    b = load("{\"model\":\"m\",\"prompt\":[[7,8],[9,10,11]]}");
    assert_int_equal(pdgw_request_validate(CMPL, b, &info, &err), PDGW_OK);
    assert_int_equal(info.n_prompts, 2);
    assert_int_equal(info.n_prompt_tokens, 2);
    assert_int_equal(info.prompt_tokens[0], 7);
    assert_int_equal(info.est_prompt_tokens, 5);
    pdgw_request_info_release(&info);
    json_decref(b);

    b = load("{\"model\":\"m\",\"prompt\":[\"abcd\",\"abcdefgh\"]}");
    assert_int_equal(pdgw_request_validate(CMPL, b, &info, &err), PDGW_OK);
    assert_string_equal(info.prompt_text, "abcd");
    assert_int_equal(info.n_prompts, 2);
    assert_int_equal(info.est_prompt_tokens, 3);
    pdgw_request_info_release(&info);
    json_decref(b);
}

static void test_good_chat(void **state)
{
    (void)state;
    pdgw_request_info_t info;
    pdgw_api_error_t err;
    json_t *b = load("{\"model\":\"m\",\"messages\":["
                     "{\"role\":\"system\",\"content\":\"be brief\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
                     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}],"
                     "\"max_tokens\":5,\"max_completion_tokens\":9,\"logprobs\":true,"
                     "\"top_logprobs\":2,\"tool_choice\":\"auto\"}");
    assert_int_equal(pdgw_request_validate(CHAT, b, &info, &err), PDGW_OK);
    assert_int_equal(info.kind, CHAT);
    assert_int_equal(info.max_tokens, 9); /* max_completion_tokens wins */
    assert_string_equal(info.prompt_text, "system\nbe brief\nuser\nhi\nassistant\n");
    assert_int_equal(info.prompt_text_len, strlen(info.prompt_text));
    assert_int_equal(info.est_prompt_tokens, (int64_t)(strlen(info.prompt_text) + 3) / 4);
    pdgw_request_info_release(&info);
    json_decref(b);
}

static void test_parse(void **state)
{
    (void)state;
    json_t *j = NULL;
    pdgw_api_error_t err;
    assert_int_equal(pdgw_request_parse("{\"a\":", 5, &j, &err), PDGW_ERR_PARSE);
    assert_null(j);
    assert_int_equal(pdgw_api_error_http_status(&err), 400);
    assert_string_equal(err.code, "invalid_json");
    assert_non_null(strstr(err.message, "line 1"));
    assert_int_equal(pdgw_request_parse("", 0, &j, &err), PDGW_ERR_PARSE);
    assert_int_equal(pdgw_request_parse("[1]", 3, &j, &err), PDGW_ERR_PARSE);
    assert_non_null(strstr(err.message, "JSON object"));
    assert_int_equal(pdgw_request_parse("{\"a\":\"\\u0000\"}", 14, &j, &err), PDGW_ERR_PARSE);
    assert_int_equal(pdgw_request_parse("{\"a\":1} x", 9, &j, &err), PDGW_ERR_PARSE);
    assert_int_equal(pdgw_request_parse("{\"a\":1}", 7, &j, &err), PDGW_OK);
    assert_non_null(j);
    json_decref(j);

    pdgw_api_kind_t k;
    assert_int_equal(pdgw_api_kind_from_path("/v1/completions", &k), PDGW_OK);
    assert_int_equal(k, CMPL);
    assert_int_equal(pdgw_api_kind_from_path("/v1/chat/completions", &k), PDGW_OK);
    assert_int_equal(k, CHAT);
    assert_int_equal(pdgw_api_kind_from_path("/v1/embeddings", &k), PDGW_ERR_NOT_FOUND);
}

static void test_validate_oom(void **state)
{
    (void)state;
    json_t *b = load("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    /* Fail each allocation in turn: always a clean error, never a leak or crash. */
    for (long n = 1; n < 20; n++) {
        pdgw_request_info_t info;
        pdgw_api_error_t err;
        pdgw_alloc_fail_at(n, 0);
        pdgw_status_t st = pdgw_request_validate(CHAT, b, &info, &err);
        pdgw_alloc_fail_at(0, 0);
        if (st == PDGW_OK) {
            assert_string_equal(info.prompt_text, "user\nhi\n");
            pdgw_request_info_release(&info);
        } else {
            assert_int_equal(st, PDGW_ERR_NOMEM);
            assert_int_equal(pdgw_api_error_http_status(&err), 500);
        }
    }
    json_decref(b);
}

static void test_error_builders(void **state)
{
    (void)state;
    static const struct {
        pdgw_api_err_kind_t kind;
        int http;
        const char *type;
    } map[] = {
        {PDGW_API_ERR_BAD_REQUEST, 400, "invalid_request_error"},
        {PDGW_API_ERR_UNAUTHORIZED, 401, "authentication_error"},
        {PDGW_API_ERR_NOT_FOUND, 404, "not_found_error"},
        {PDGW_API_ERR_METHOD_NOT_ALLOWED, 405, "invalid_request_error"},
        {PDGW_API_ERR_TOO_LARGE, 413, "invalid_request_error"},
        {PDGW_API_ERR_RATE_LIMITED, 429, "rate_limit_error"},
        {PDGW_API_ERR_INTERNAL, 500, "server_error"},
        {PDGW_API_ERR_BAD_GATEWAY, 502, "upstream_error"},
        {PDGW_API_ERR_UNAVAILABLE, 503, "service_unavailable_error"},
        {PDGW_API_ERR_TIMEOUT, 504, "timeout_error"},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        assert_int_equal(pdgw_api_err_http_status(map[i].kind), map[i].http);
        assert_string_equal(pdgw_api_err_type(map[i].kind), map[i].type);
        assert_int_equal(pdgw_api_err_kind_from_http(map[i].http), map[i].kind);
    }
    assert_int_equal(pdgw_api_err_kind_from_http(418), PDGW_API_ERR_BAD_REQUEST);
    assert_int_equal(pdgw_api_err_kind_from_http(599), PDGW_API_ERR_BAD_GATEWAY);

    pdgw_api_error_t e;
    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, "messages[0].role", "bad \"%s\"", "x");
    pdgw_api_error_set_code(&e, "invalid_type");
    size_t len;
    char *body = pdgw_api_error_body(&e, &len);
    assert_string_equal(body, "{\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"messages[0].role\","
                              "\"code\":\"invalid_type\"}}\n");
    assert_int_equal(len, strlen(body));
    free(body);

    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_GATEWAY, NULL, "upstream died");
    body = pdgw_api_error_sse(&e, 1, &len);
    assert_string_equal(body, "data: {\"error\":{\"message\":\"upstream died\",\"type\":"
                              "\"upstream_error\",\"param\":null,\"code\":\"upstream_error\"}}"
                              "\n\ndata: [DONE]\n\n");
    free(body);
    body = pdgw_api_error_sse(&e, 0, NULL);
    assert_non_null(strstr(body, "}}\n\n"));
    assert_null(strstr(body, "[DONE]"));
    free(body);

    /* type override (PD failure taxonomy) keeps the kind's HTTP status */
    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_GATEWAY, NULL, "kv lost");
    pdgw_api_error_set_type(&e, "pd_kv_transfer_error");
    pdgw_api_error_set_code(&e, "retryable");
    assert_int_equal(pdgw_api_error_http_status(&e), 502);
    body = pdgw_api_error_body(&e, NULL);
    assert_string_equal(body, "{\"error\":{\"message\":\"kv lost\",\"type\":"
                              "\"pd_kv_transfer_error\",\"param\":null,\"code\":\"retryable\"}}\n");
    free(body);
    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_GATEWAY, NULL, "again"); /* resets the override */
    assert_string_equal(e.type, "");

    body = pdgw_api_error_body_make(PDGW_API_ERR_BAD_REQUEST, NULL, "m", NULL);
    json_t *j = json_loads(body, 0, NULL);
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "code")));
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
    free(body);

    /* Invalid UTF-8 in a message never yields invalid JSON. */
    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, NULL, "bad \xff byte");
    body = pdgw_api_error_body(&e, NULL);
    j = json_loads(body, 0, NULL);
    assert_non_null(j);
    json_decref(j);
    free(body);

    assert_string_equal(pdgw_strerror(PDGW_OK), "success");
    assert_string_equal(pdgw_strerror(PDGW_ERR_NOMEM), "out of memory");
    assert_string_equal(pdgw_strerror((pdgw_status_t)-999), "unknown status");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_table),
        cmocka_unit_test(test_every_optional_field_is_checked),
        cmocka_unit_test(test_good_completions),
        cmocka_unit_test(test_good_chat),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_validate_oom),
        cmocka_unit_test(test_error_builders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
