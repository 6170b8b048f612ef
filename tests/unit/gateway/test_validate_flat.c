/*
 * test_validate_flat.c - a completions body validated on its text (pdgw_validate_flat.c)
 * against the tree's decision (pdgw_request_parse + pdgw_request_validate +
 * pdgw_request_pd_fields): every body the text walk accepts, the tree accepts with the same
 * request info and no PD field; the bodies it must take (plain scalar members) it takes; the
 * others it leaves to the tree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_json_text.h"
#include "pdgw_validate.h"

#define CMPL PDGW_API_COMPLETIONS
#define CHAT PDGW_API_CHAT_COMPLETIONS

static const char *const no_fields[] = {NULL};
static const char *const fwd_fields[] = {"my_peer", "route_*", NULL};

/* The flat decision on <body>; when it accepts, the tree must accept too, with equal info
 * and no PD field (with <fields> as the forwarder's own). */
static bool flat_agrees(pdgw_api_kind_t kind, const char *body, const char *const *fields)
{
    pdgw_request_info_t flat, tree;
    pdgw_api_error_t err;
    pdgw_pd_fields_result_t res;
    char model[64];
    json_t *j = NULL;
    size_t len = strlen(body);

    if (!pdgw_request_validate_flat(kind, body, len, fields, &flat, model, sizeof(model)))
        return false;
    memset(&err, 0, sizeof(err));
    if (pdgw_request_parse(body, len, &j, &err) != PDGW_OK)
        fail_msg("flat accepted what the parser refuses: %s", body);
    if (pdgw_request_validate(kind, j, &tree, &err) != PDGW_OK)
        fail_msg("flat accepted what the validator refuses (%s): %s", err.code, body);
    if (pdgw_request_pd_fields(j, PDGW_PD_FIELDS_PASS, fields, &res, &err) != PDGW_OK ||
        res.n_hits != 0)
        fail_msg("flat accepted a PD field: %s", body);
    assert_ptr_equal(flat.model, model);
    assert_string_equal(flat.model, tree.model);
    assert_int_equal(flat.kind, tree.kind);
    assert_int_equal(flat.stream, tree.stream);
    assert_int_equal(flat.include_usage, tree.include_usage);
    assert_int_equal(flat.max_tokens, tree.max_tokens);
    assert_int_equal(flat.n, tree.n);
    assert_int_equal(flat.prompt_text_len, tree.prompt_text_len);
    assert_memory_equal(flat.prompt_text, tree.prompt_text, tree.prompt_text_len);
    assert_true(flat.prompt_text >= body && flat.prompt_text + flat.prompt_text_len <= body + len);
    assert_false(flat.prompt_text_owned);
    assert_null(flat.prompt_tokens);
    assert_int_equal(flat.n_prompts, tree.n_prompts);
    assert_int_equal(flat.est_prompt_tokens, tree.est_prompt_tokens);
    /* every member is in the name set: a lookup never misses one that is there */
    {
        const char *key;
        json_t *v;
        uint64_t names = 0;
        json_object_foreach(j, key, v)
        {
            uint64_t bit = pdgw_json_name_bit(key, strlen(key));
            if (!(flat.member_names & bit))
                fail_msg("member %s missing from the name set: %s", key, body);
            names |= bit;
        }
        assert_true(flat.member_names == names); /* and nothing else */
    }
    pdgw_request_info_release(&tree);
    pdgw_request_info_release(&flat);
    json_decref(j);
    return true;
}

/* Bodies of scalar members: taken on their text, with the tree's info. */
static void test_takes_scalar_bodies(void **state)
{
    static const char *const bodies[] = {
        /* the benchmark's body, and OpenAI's completions fields at their edges */
        "{\"model\":\"sim-model\",\"prompt\":\"The quick brown fox\",\"max_tokens\":16}",
        "{\"model\":\"m\",\"prompt\":\"\"}",
        " {\"model\" : \"m\" , \"prompt\" : \"x\" } \n",
        "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"n\":3,\"best_of\":4,\"echo\":false}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":false,\"max_tokens\":9223372036854775807}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":0,\"top_p\":1,\"min_p\":0.0,"
        "\"top_k\":-1,\"seed\":-9223372036854775808,\"frequency_penalty\":-2,"
        "\"presence_penalty\":2.0,\"repetition_penalty\":1e-3,\"logprobs\":0}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":\"\\n\"}", /* escapes outside model and prompt
                                                                */
        "{\"model\":\"m\",\"prompt\":\"x\",\"user\":\"u1\",\"suffix\":\"s\",\"stop\":\"END\"}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"user\":\"caf\\u00e9\"}",
        /* null is absent, for every optional field, also ones with object rules */
        "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":null,\"max_tokens\":null,"
        "\"n\":null,\"stream\":null,\"logit_bias\":null,\"response_format\":null}",
        /* members no rule reads are passed as they are, nested or not */
        "{\"model\":\"m\",\"prompt\":\"x\",\"priority\":-5,\"extra\":{\"a\":[1,{\"b\":null}]},"
        "\"max_completion_tokens\":\"not a completions field\"}",
        /* UTF-8 in the prompt and the model name */
        "{\"model\":\"mod\xc3\xa8le\",\"prompt\":\"na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80\"}",
        /* a later duplicate replaces an earlier one, as in the tree */
        "{\"model\":\"a\",\"prompt\":\"x\",\"model\":\"b\",\"max_tokens\":2,\"max_tokens\":5,"
        "\"prompt\":[1,2],\"prompt\":\"y\",\"stream\":true,\"stream\":false}",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        if (!flat_agrees(CMPL, bodies[i], no_fields))
            fail_msg("case %zu declined: %s", i, bodies[i]);
}

/* Everything else goes the tree's way: what the tree refuses, what needs a look inside a
 * value, PD control fields, chat. */
static void test_leaves_the_rest_to_the_tree(void **state)
{
    static const struct {
        pdgw_api_kind_t kind;
        const char *body;
    } cases[] = {
        /* refused by the tree */
        {CMPL, "{\"prompt\":\"x\"}"},
        {CMPL, "{\"model\":\"\",\"prompt\":\"x\"}"},
        {CMPL, "{\"model\":null,\"prompt\":\"x\"}"},
        {CMPL, "{\"model\":\"m\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":null}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1.0}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":-1e-9}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"true\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"user\":7}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":0,\"n\":1}"}, /* the tree takes the last */
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"seed\":99999999999999999999}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":1e999}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\"} x"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"\x01\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"\xff\"}"},
        {CMPL, "[{\"model\":\"m\",\"prompt\":\"x\"}]"},
        {CMPL, ""},
        /* valid, but a look inside a value or an escape is the tree's */
        {CMPL, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":[1,2,3]}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"line\\nbreak\"}"},
        {CMPL, "{\"model\":\"m\\u0031\",\"prompt\":\"x\"}"},
        {CMPL, "{\"mod\\u0065l\":\"m\",\"prompt\":\"x\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\"]}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"1\":2}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":{}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"0123456789012345678901234567890123456789012345"
               "67890123456789012345678901234567890123456789012345678901234567890123456789012"
               "34567890\":1}"},
        /* a model name longer than the copy the request holds */
        {CMPL, "{\"model\":\"0123456789012345678901234567890123456789012345678901234567890123"
               "\",\"prompt\":\"x\"}"},
        /* PD control fields: the built-in ones, vllm_xargs, the forwarder's own */
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"kv_transfer_params\":{\"remote_host\":\"h\"}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"kv_transfer_params\":null}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"bootstrap_host\":\"10.0.0.9\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"remote_engine_id\":\"e\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"vllm_xargs\":{\"kv_transfer_params\":{}}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"vllm_xargs\":{\"other\":1}}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"my_peer\":\"h\"}"},
        {CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"route_hint\":1}"},
        /* chat: messages are checked on the tree */
        {CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
        {PDGW_API_GENERATE, "{\"text\":\"x\"}"},
    };
    pdgw_request_info_t info;
    char model[64];
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *b = cases[i].body;
        memset(&info, 0x5a, sizeof(info));
        if (pdgw_request_validate_flat(cases[i].kind, b, strlen(b), fwd_fields, &info, model,
                                       sizeof(model)))
            fail_msg("case %zu taken on its text: %s", i, b);
    }
    /* the forwarder's fields count only when it names them */
    assert_true(
        flat_agrees(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"my_peer\":\"h\"}", no_fields));
    /* no body at all */
    assert_false(pdgw_request_validate_flat(CMPL, NULL, 0, no_fields, &info, model, sizeof(model)));
}

/* A body cut short at every byte is never taken, whole it is. */
static void test_every_prefix(void **state)
{
    static const char body[] = "{\"model\":\"m\",\"prompt\":\"abc\",\"temperature\":0.5,"
                               "\"stream\":true,\"n\":2}";
    pdgw_request_info_t info;
    char model[8];
    (void)state;
    for (size_t n = 0; n < sizeof(body) - 1; n++) {
        char copy[sizeof(body)];
        memcpy(copy, body, n); /* exactly n bytes: nothing past them is read */
        assert_false(
            pdgw_request_validate_flat(CMPL, copy, n, no_fields, &info, model, sizeof(model)));
    }
    assert_true(flat_agrees(CMPL, body, no_fields));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes_scalar_bodies),
        cmocka_unit_test(test_leaves_the_rest_to_the_tree),
        cmocka_unit_test(test_every_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
