/*
 * test_lmcache_rewrite_text.c - the lmcache forwarder's answer rewrite done on the text
 * (fwd_lmcache_text.c) against the same rewrite done on the tree (lmc_flow_rewrite), answer
 * by answer: both must give the client the same JSON, or the text one must hand the answer
 * to the tree one (-1). The shapes are those of vLLM's completions answer and stream chunks
 * (vllm/entrypoints/openai/protocol.py CompletionResponse, CompletionStreamResponse: id,
 * object, created, model, choices[{index, text, logprobs, finish_reason, stop_reason}],
 * usage {prompt_tokens, completion_tokens, total_tokens}); also the text-walk helpers the
 * forwarder SDK gives (pdgw_fwd_json_*, pdgw_fwd_text_*).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../../forwarders/fwd_lmcache_int.h"
#include "pdgw_fwd_text.h"
#include "pdgw_json_dump.h"
#include "pdgw_json_raw.h"

static void head_init(lmc_head_t *h, const char *text)
{
    memset(h, 0, sizeof(*h));
    h->first_tok = 42;
    h->text = strdup(text);
    h->id = strdup("cmpl-prefill");
    h->model = strdup("m");
    h->created = 1700000000;
}

static json_t *parse(const char *s, size_t n)
{
    json_error_t e;
    json_t *v = json_loadb(s, n, 0, &e);
    if (v == NULL)
        fail_msg("not JSON (%s): %.*s", e.text, (int)n, s);
    return v;
}

/* Non-stream: the text rewrite gives what the tree rewrite gives, or hands over (-1). Returns
 * the text rewrite's result. */
static int check_answer(const char *answer, const char *first, int chat, int done)
{
    lmc_head_t ht, hj;
    pdgw_fwd_request_t req = {.is_chat = chat};
    pdgw_fwd_text_t out = {0};
    json_t *in = parse(answer, strlen(answer)), *want;
    int got;
    head_init(&ht, first);
    head_init(&hj, first);
    ht.done = hj.done = done;
    got = lmc_flow_rewrite_text(&ht, &req, 0, answer, strlen(answer), &out);
    want = lmc_flow_rewrite(&hj, &req, 0, in);
    if (got == 1) {
        json_t *have = parse(out.buf.data, out.buf.len);
        assert_non_null(want);
        if (!json_equal(have, want)) {
            char *w = json_dumps(want, JSON_SORT_KEYS);
            fail_msg("text rewrite\n  %.*s\ntree rewrite\n  %s", (int)out.buf.len, out.buf.data, w);
        }
        json_decref(have);
    } else if (got == 0) {
        assert_null(want); /* unchanged both ways */
    }
    json_decref(want);
    json_decref(in);
    pdgw_buf_free(&out.buf);
    lmc_head_clear(&ht);
    lmc_head_clear(&hj);
    return got;
}

#define ANSWER(text_member, usage)                                                                 \
    "{\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"created\":1700000001,\"model\":\"m\","    \
    "\"choices\":[{\"index\":0," text_member ",\"logprobs\":null,\"finish_reason\":\"length\","    \
    "\"stop_reason\":null,\"prompt_logprobs\":null}],\"usage\":" usage                             \
    ",\"kv_transfer_params\":null}"

static void test_answer_edits_match_the_tree(void **state)
{
    (void)state;
    /* the usual answer */
    assert_int_equal(check_answer(ANSWER("\"text\":\" jumps over\"",
                                         "{\"prompt_tokens\":12,\"completion_tokens\":15,"
                                         "\"total_tokens\":27,\"prompt_tokens_details\":null}"),
                                  " fox", 0, 0),
                     1);
    /* a first token that needs escapes, a decode text with escapes of its own */
    assert_int_equal(check_answer(ANSWER("\"text\":\"\\\"b\\\\c\\n\\u00e9\"",
                                         "{\"prompt_tokens\":3,\"completion_tokens\":1,"
                                         "\"total_tokens\":4}"),
                                  "\"a\\\n\t\xc3\xa9\x01", 0, 0),
                     1);
    /* usage before choices, whitespace everywhere, members repeated (the last one counts) */
    assert_int_equal(
        check_answer("{ \"usage\" : { \"prompt_tokens\" : 9 , \"completion_tokens\" : 0 ,"
                     " \"prompt_tokens\" : 8 } ,\n \"choices\" : [ { \"text\" : \"x\" ,"
                     " \"logprobs\" : { \"tokens\" : [ \"}]\" , \"[{\\\"\" ] ,"
                     " \"token_logprobs\" : [ -0.5 , 1e-3 ] } } , { \"text\" : \"y\" } ] }\n",
                     "T", 0, 0),
        1);
    /* counts the tree leaves alone are left alone */
    assert_int_equal(check_answer(ANSWER("\"text\":\"x\"", "null"), "T", 0, 0), 1);
    assert_int_equal(check_answer(ANSWER("\"text\":\"x\"", "{\"prompt_tokens\":0,"
                                                           "\"completion_tokens\":3}"),
                                  "T", 0, 0),
                     1);
    assert_int_equal(check_answer(ANSWER("\"text\":\"x\"", "{\"prompt_tokens\":4.0,"
                                                           "\"completion_tokens\":3}"),
                                  "T", 0, 0),
                     1);
    assert_int_equal(check_answer(ANSWER("\"text\":\"x\"", "{\"prompt_tokens\":4}"), "T", 0, 0), 1);
    assert_int_equal(check_answer("{\"choices\":[{\"text\":\"\"}]}", "", 0, 0), 1);
    /* chat: the answer as a chat.completion, the first token in front of the message */
    assert_int_equal(check_answer(ANSWER("\"text\":\" jumps\"",
                                         "{\"prompt_tokens\":12,\"completion_tokens\":15}"),
                                  "\"q\"\n", 1, 0),
                     1);
    assert_int_equal(
        check_answer("{\"choices\":[{\"index\":0,\"text\":null,\"stop_reason\":7}]}", "T", 1, 0),
        1);
    assert_int_equal(
        check_answer("{\"id\":\"x\",\"choices\" : [ {\"index\":0} ] ,\"usage\":null}", "T", 1, 0),
        1);
}

static void test_answer_handed_to_the_tree(void **state)
{
    (void)state;
    /* an error answer passes unchanged */
    assert_int_equal(check_answer("{\"error\":{\"message\":\"x\"}}", "T", 0, 0), 0);
    /* a name written with escapes, no text, no choices, a text that is not a string, an
     * answer the first token already ended: the tree decides */
    assert_int_equal(check_answer(ANSWER("\"t\\u0065xt\":\"x\"", "null"), "T", 0, 0), -1);
    assert_int_equal(check_answer("{\"choices\":[{\"index\":0}]}", "T", 0, 0), -1);
    assert_int_equal(check_answer("{\"choices\":[]}", "T", 0, 0), -1);
    assert_int_equal(check_answer("{\"id\":\"x\"}", "T", 0, 0), -1);
    assert_int_equal(check_answer("{\"choices\":[{\"text\":null}]}", "T", 0, 0), -1);
    assert_int_equal(check_answer("{\"choices\":[{\"text\":\"x\"}],\"us\\u0061ge\":{}}", "T", 0, 0),
                     -1);
    assert_int_equal(check_answer(ANSWER("\"text\":\"x\"", "null"), "T", 0, 1), -1);
    /* chat with more than one choice: the tree writes them all */
    assert_int_equal(check_answer("{\"choices\":[{\"index\":0,\"text\":\"a\"},{\"index\":1,"
                                  "\"text\":\"b\"}]}",
                                  "T", 1, 0),
                     -1);
    assert_int_equal(check_answer("{\"choices\":[{\"text\":\"a\"}]}", "T", 1, 0), -1);
}

/* The "data: <json>\n\n" events of <text> as JSON objects, in order. */
static json_t *events_of(const char *text, size_t len)
{
    json_t *arr = json_array();
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        assert_memory_equal(p, "data: ", 6);
        json_array_append_new(arr, parse(p + 6, (size_t)(e - p - 6)));
        p = e + 2;
    }
    return arr;
}

/* Stream: one event through both rewrites, each with its own head state (kept across calls),
 * for a completions or a chat client. */
static int check_stream(lmc_head_t *ht, lmc_head_t *hj, const char *data, int chat)
{
    pdgw_fwd_request_t req = {.is_chat = chat};
    pdgw_fwd_text_t out = {0};
    json_t *in = parse(data, strlen(data)), *want;
    int got = lmc_flow_rewrite_text(ht, &req, 1, data, strlen(data), &out);
    want = lmc_flow_rewrite(hj, &req, 1, in);
    if (got == 1) {
        json_t *have = events_of(out.buf.data, out.buf.len);
        assert_non_null(want);
        if (!json_equal(have, want)) {
            char *w = json_dumps(want, JSON_SORT_KEYS);
            fail_msg("text rewrite\n  %.*s\ntree rewrite\n  %s", (int)out.buf.len, out.buf.data, w);
        }
        json_decref(have);
    } else if (got == 0) {
        /* relayed as it came: the tree wrote it again unchanged, or left it */
        assert_true(want == NULL ||
                    (json_array_size(want) == 1 && json_equal(json_array_get(want, 0), in)));
    }
    assert_int_equal(ht->sent, hj->sent);
    json_decref(want);
    json_decref(in);
    pdgw_buf_free(&out.buf);
    return got;
}

#define CHUNK(text, usage)                                                                         \
    "{\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"created\":1700000001,\"model\":\"m\","    \
    "\"choices\":[{\"index\":0,\"text\":\"" text "\",\"logprobs\":null,\"finish_reason\":null,"    \
    "\"stop_reason\":null}],\"usage\":" usage "}"

static void test_stream_events_match_the_tree(void **state)
{
    lmc_head_t ht, hj;
    (void)state;
    head_init(&ht, " fox");
    head_init(&hj, " fox");
    /* an error event before anything: unchanged, and no head yet */
    assert_int_equal(check_stream(&ht, &hj, "{\"error\":{\"message\":\"x\",\"code\":500}}", 0), 0);
    assert_int_equal(ht.sent, 0);
    /* the first chunk brings the head before it */
    assert_int_equal(check_stream(&ht, &hj, CHUNK(" jumps", "null"), 0), 1);
    assert_int_equal(ht.sent, 1);
    /* later chunks without usage go as they came */
    assert_int_equal(check_stream(&ht, &hj, CHUNK(" over", "null"), 0), 0);
    assert_int_equal(check_stream(&ht, &hj, "{\"choices\":[{\"text\":\"a\"}]}", 0), 0);
    /* the usage chunk (stream_options.include_usage) counts the first token as generated */
    assert_int_equal(check_stream(&ht, &hj,
                                  "{\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"created\":1,"
                                  "\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":13,"
                                  "\"completion_tokens\":15,\"total_tokens\":28}}",
                                  0),
                     1);
    lmc_head_clear(&ht);
    lmc_head_clear(&hj);
    /* a first chunk that already has usage: head, then the edited chunk */
    head_init(&ht, "\"q\"");
    head_init(&hj, "\"q\"");
    assert_int_equal(
        check_stream(&ht, &hj, CHUNK("z", "{\"prompt_tokens\":2,\"completion_tokens\":1}"), 0), 1);
    lmc_head_clear(&ht);
    lmc_head_clear(&hj);
}

static void test_chat_stream_events_match_the_tree(void **state)
{
    lmc_head_t ht, hj;
    (void)state;
    head_init(&ht, " fox");
    head_init(&hj, " fox");
    assert_int_equal(check_stream(&ht, &hj, "{\"error\":{\"message\":\"x\"}}", 1), 0);
    assert_int_equal(check_stream(&ht, &hj, CHUNK(" jumps\\\"", "null"), 1), 1);
    assert_int_equal(ht.sent, 1);
    assert_int_equal(check_stream(&ht, &hj, CHUNK(" over", "null"), 1), 1);
    assert_int_equal(
        check_stream(
            &ht, &hj,
            "{\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":{\"a\":[1]},"
            "\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":{"
            "\"prompt_tokens\":13,\"completion_tokens\":15,\"total_tokens\":28}}",
            1),
        1);
    lmc_head_clear(&ht);
    lmc_head_clear(&hj);
}

static void assert_heads_equal(const lmc_head_t *a, const lmc_head_t *b)
{
    assert_int_equal(a->first_tok, b->first_tok);
    assert_int_equal(a->done, b->done);
    assert_string_equal(a->text, b->text);
    assert_string_equal(a->id, b->id);
    assert_string_equal(a->model, b->model);
    assert_int_equal(a->created, b->created);
    assert_true(json_equal(a->usage, b->usage) || (a->usage == NULL && b->usage == NULL));
    assert_true(json_equal(a->stop_reason, b->stop_reason) ||
                (a->stop_reason == NULL && b->stop_reason == NULL));
}

/* A prefill's answer read on its text (lmc_flow_read_prefill_text) gives the head the tree
 * reader gives, and the prompt's ids as written (vLLM completion/serving.py: with
 * return_token_ids the choice carries prompt_token_ids and token_ids). */
static void test_prefill_answer_read_on_its_text(void **state)
{
    static const struct {
        const char *answer, *ids; /* ids NULL: none to read */
    } cases[] = {
        {"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":17,\"model\":\"m\","
         "\"choices\":[{\"index\":0,\"text\":\" a\\\"b\",\"logprobs\":null,\"finish_reason\":"
         "\"length\",\"stop_reason\":null,\"token_ids\":[9],\"prompt_token_ids\":[1, 22,333]}],"
         "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4},"
         "\"kv_transfer_params\":{\"first_tok\":9}}",
         "[1, 22,333]"},
        /* an engine from before return_token_ids; the first token ended the answer */
        {"{\"id\":\"cmpl-2\",\"created\":18,\"model\":\"m\",\"choices\":[{\"text\":\"x\","
         "\"finish_reason\":\"stop\",\"stop_reason\":\"</s>\"}],\"kv_transfer_params\":"
         "{\"first_tok\":2}}",
         NULL},
        /* a member name written with an escape: the text readers hand it to the parser */
        {"{\"id\":\"cmpl-3\",\"created\":19,\"model\":\"m\",\"choices\":[{\"text\":\"y\","
         "\"finish_reason\":\"length\",\"prompt_\\u0074oken_ids\":[5,6]}],"
         "\"kv_transfer_params\":{\"first_tok\":7}}",
         "[5,6]"},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *a = cases[i].answer, *t;
        size_t tl;
        char msg[200];
        lmc_head_t from_text, from_tree;
        json_t *ids = NULL, *tree = parse(a, strlen(a));
        memset(&from_text, 0, sizeof(from_text));
        memset(&from_tree, 0, sizeof(from_tree));
        assert_int_equal(
            lmc_flow_read_prefill_text(a, strlen(a), &from_text, &ids, msg, sizeof(msg)), 0);
        assert_int_equal(lmc_flow_read_prefill(tree, &from_tree, msg, sizeof(msg)), 0);
        assert_heads_equal(&from_text, &from_tree);
        if (cases[i].ids == NULL) {
            assert_null(ids);
        } else {
            assert_non_null(ids);
            assert_true(pdgw_json_raw_text(ids, &t, &tl));
            /* as written, or (parsed) written again without spaces */
            assert_true((tl == strlen(cases[i].ids) && memcmp(t, cases[i].ids, tl) == 0) ||
                        (i == 2 && tl == 5 && memcmp(t, "[5,6]", 5) == 0));
        }
        json_decref(ids);
        json_decref(tree);
        lmc_head_clear(&from_text);
        lmc_head_clear(&from_tree);
    }
    {
        /* no first_tok, or not JSON: refused, and no ids are left behind */
        static const char *const bad[] = {
            "{\"choices\":[{\"text\":\"x\",\"prompt_token_ids\":[1]}]}", "not json", ""};
        for (i = 0; i < 3; i++) {
            char msg[200];
            lmc_head_t h;
            json_t *ids = NULL;
            memset(&h, 0, sizeof(h));
            assert_int_equal(
                lmc_flow_read_prefill_text(bad[i], strlen(bad[i]), &h, &ids, msg, sizeof(msg)), -1);
            assert_null(ids);
            assert_non_null(strstr(msg, "first_tok"));
        }
    }
}

static void test_text_helpers(void **state)
{
    const char *v;
    size_t n;
    int64_t x;
    pdgw_fwd_text_t t = {0};
    (void)state;
    assert_int_equal(pdgw_fwd_json_member("{\"a\":1,\"b\":[1,2],\"a\":\"s\"}",
                                          strlen("{\"a\":1,\"b\":[1,2],\"a\":\"s\"}"), "a", &v, &n),
                     1);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "\"s\"", 3);
    assert_int_equal(pdgw_fwd_json_member("{\"a\":1}", strlen("{\"a\":1}"), "b", &v, &n), 0);
    assert_int_equal(pdgw_fwd_json_member("[1]", strlen("[1]"), "a", &v, &n), -1);
    assert_int_equal(pdgw_fwd_json_member("{\"a\":1", strlen("{\"a\":1"), "a", &v, &n), -1);
    assert_int_equal(
        pdgw_fwd_json_member("{\"\\u0061\":1}", strlen("{\"\\u0061\":1}"), "b", &v, &n), -1);
    {
        static const char *const names[] = {"b", "zz", "a", NULL};
        const char *vs[3];
        size_t ns[3];
        const char *obj = "{\"a\":1,\"b\":[1,{\"a\":2}],\"a\":\"s\",\"ab\":3}";
        assert_int_equal(pdgw_fwd_json_members(obj, strlen(obj), names, vs, ns), 0);
        assert_int_equal(ns[0], 11);
        assert_memory_equal(vs[0], "[1,{\"a\":2}]", 11);
        assert_null(vs[1]);
        assert_int_equal(ns[2], 3); /* the last "a", not the nested one or "ab" */
        assert_memory_equal(vs[2], "\"s\"", 3);
        assert_int_equal(pdgw_fwd_json_members("{\"a\":1,}", 8, names, vs, ns), -1);
    }
    assert_int_equal(pdgw_fwd_json_first(" [ 12 , 3]", strlen(" [ 12 , 3]"), &v, &n), 1);
    assert_int_equal(n, 2);
    assert_memory_equal(v, "12", 2);
    assert_int_equal(pdgw_fwd_json_first("[7]", strlen("[7]"), &v, &n), 1);
    assert_int_equal(n, 1);
    assert_int_equal(pdgw_fwd_json_first("[ ]", strlen("[ ]"), &v, &n), 0);
    assert_int_equal(pdgw_fwd_json_first("{}", strlen("{}"), &v, &n), -1);
    assert_int_equal(pdgw_fwd_json_int("-12", strlen("-12"), &x), 1);
    assert_int_equal(x, -12);
    assert_int_equal(pdgw_fwd_json_int("9223372036854775807", strlen("9223372036854775807"), &x),
                     1);
    assert_true(x == INT64_MAX);
    assert_int_equal(pdgw_fwd_json_int("9223372036854775808", strlen("9223372036854775808"), &x),
                     0);
    assert_int_equal(pdgw_fwd_json_int("012", strlen("012"), &x), 0);
    assert_int_equal(pdgw_fwd_json_int("1.0", strlen("1.0"), &x), 0);
    assert_int_equal(pdgw_fwd_json_int("1e2", strlen("1e2"), &x), 0);
    assert_int_equal(pdgw_fwd_json_int("-", strlen("-"), &x), 0);
    assert_int_equal(pdgw_fwd_text_append(&t, "[\"", 2), 0);
    assert_int_equal(pdgw_fwd_text_append_escaped(&t, "a\"\\\n\x7f\xc3\xa9", 7), 0);
    assert_int_equal(pdgw_fwd_text_append_escaped(&t, "\xff", 1), -1); /* not UTF-8 */
    assert_int_equal(pdgw_fwd_text_append(&t, "\",", 2), 0);
    {
        json_t *v2 = json_pack("{s:i}", "k", 1);
        assert_int_equal(pdgw_fwd_text_append_json(&t, v2), 0);
        json_decref(v2);
    }
    assert_int_equal(pdgw_fwd_text_append(&t, "]", 1), 0);
    {
        json_t *arr = parse(t.buf.data, t.buf.len);
        assert_string_equal(json_string_value(json_array_get(arr, 0)), "a\"\\\n\x7f\xc3\xa9");
        assert_int_equal(json_integer_value(json_object_get(json_array_get(arr, 1), "k")), 1);
        json_decref(arr);
    }
    pdgw_buf_free(&t.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_edits_match_the_tree),
        cmocka_unit_test(test_answer_handed_to_the_tree),
        cmocka_unit_test(test_stream_events_match_the_tree),
        cmocka_unit_test(test_chat_stream_events_match_the_tree),
        cmocka_unit_test(test_text_helpers),
        cmocka_unit_test(test_prefill_answer_read_on_its_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
