/*
 * test_tokenize_body.c - the body of an engine's POST /tokenize for a client's request
 * (pdgw_tokenize_body.c), used by the precise-prefix router and the lmcache forwarder. The
 * fields are vLLM's (vllm/entrypoints/serve/tokenize/protocol.py): TokenizeChatRequest
 * {model, messages, add_generation_prompt, continue_final_message, add_special_tokens,
 * chat_template, chat_template_kwargs, media_io_kwargs, mm_processor_kwargs, tools} and
 * TokenizeCompletionRequest {model, prompt, add_special_tokens}.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_tokenize_body.h"

static json_t *load(const char *s)
{
    json_t *v = json_loads(s, 0, NULL);
    assert_non_null(v);
    return v;
}

static void assert_json(const json_t *got, const char *want_text)
{
    json_t *want = load(want_text);
    char *g = json_dumps(got, JSON_SORT_KEYS | JSON_COMPACT);
    if (!json_equal(got, want))
        fail_msg("got %s, want %s", g ? g : "(null)", want_text);
    free(g);
    json_decref(want);
}

/* Every chat-template option the client set goes along; sampling and PD fields do not. */
static void test_chat_takes_the_template_options(void **state)
{
    json_t *client =
        load("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
             "\"chat_template_kwargs\":{\"enable_thinking\":false},\"add_generation_prompt\":false,"
             "\"continue_final_message\":true,\"add_special_tokens\":true,\"chat_template\":\"T\","
             "\"media_io_kwargs\":{\"image\":{}},\"mm_processor_kwargs\":{\"x\":1},"
             "\"max_tokens\":5,\"stream\":true,\"temperature\":0.5,\"kv_transfer_params\":{}}");
    json_t *b = pdgw_tokenize_body(client, 1, NULL, "m");
    (void)state;
    assert_non_null(b);
    assert_json(b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                   "\"chat_template_kwargs\":{\"enable_thinking\":false},"
                   "\"add_generation_prompt\":false,\"continue_final_message\":true,"
                   "\"add_special_tokens\":true,\"chat_template\":\"T\","
                   "\"media_io_kwargs\":{\"image\":{}},\"mm_processor_kwargs\":{\"x\":1}}");
    json_decref(b);
    /* none set: vLLM's defaults apply; no model: none sent */
    json_object_clear(client);
    json_object_set_new(client, "messages", load("[{\"role\":\"user\",\"content\":\"x\"}]"));
    b = pdgw_tokenize_body(client, 1, NULL, "");
    assert_json(b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    json_decref(b);
    json_decref(client);
}

static void test_completions_take_the_text_and_special_tokens(void **state)
{
    json_t *client = load("{\"prompt\":[\"hello\"],\"add_special_tokens\":false,\"echo\":true,"
                          "\"tools\":[]}");
    json_t *b =
        pdgw_tokenize_body(client, 0, json_array_get(json_object_get(client, "prompt"), 0), "m");
    (void)state;
    assert_json(b, "{\"model\":\"m\",\"prompt\":\"hello\",\"add_special_tokens\":false}");
    json_decref(b);
    json_decref(client);
}

/* No prompt to tokenize: no body. */
static void test_no_prompt_no_body(void **state)
{
    json_t *chat_empty = load("{\"messages\":[]}"), *chat_none = load("{\"prompt\":\"x\"}");
    json_t *ids = load("{\"prompt\":[1,2]}");
    (void)state;
    assert_null(pdgw_tokenize_body(chat_empty, 1, NULL, "m"));
    assert_null(pdgw_tokenize_body(chat_none, 1, NULL, "m"));
    assert_null(pdgw_tokenize_body(ids, 0, json_object_get(ids, "prompt"), "m"));
    assert_null(pdgw_tokenize_body(ids, 0, NULL, "m"));
    json_decref(chat_empty);
    json_decref(chat_none);
    json_decref(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_takes_the_template_options),
        cmocka_unit_test(test_completions_take_the_text_and_special_tokens),
        cmocka_unit_test(test_no_prompt_no_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
