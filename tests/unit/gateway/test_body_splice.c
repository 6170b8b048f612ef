/*
 * test_body_splice.c - leg bodies spliced from the client's bytes (pdgw_body_splice.c): the
 * result always parses to the leg object; untouched members keep the client's exact bytes
 * (whitespace and escapes included), changed ones are written where the client had them, new
 * ones at the end; text that cannot be spliced safely is refused so the caller serialises.
 * Token-id lists are written and read without jansson's general paths (pdgw_json_text.c):
 * the same text, and only what a parser accepts; kept as text (pdgw_json_raw.h, the SDK's
 * pdgw_fwd_ids_text_*) they are written into a body as they are.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <pdgw/forwarder.h>

#include "pdgw_alloc.h"
#include "pdgw_body_splice.h"
#include "pdgw_json_raw.h"
#include "pdgw_json_text.h"

typedef struct {
    json_t *client;
    json_t *leg; /* shares the client's member values, as pdgw_fwd_body_shared makes it */
    pdgw_buf_t out;
} splice_t;

static void setup(splice_t *s, const char *raw)
{
    json_error_t e;
    s->client = json_loads(raw, 0, &e);
    assert_non_null(s->client);
    s->leg = json_copy(s->client);
    assert_non_null(s->leg);
    pdgw_buf_init(&s->out);
}

static void teardown(splice_t *s)
{
    json_decref(s->client);
    json_decref(s->leg);
    pdgw_buf_free(&s->out);
}

/* Splice <raw> and check the text parses to an object equal to the leg. */
static const char *splice_ok(splice_t *s, const char *raw)
{
    json_error_t e;
    json_t *back;
    assert_int_equal(pdgw_body_splice(raw, strlen(raw), s->client, s->leg, &s->out), PDGW_OK);
    assert_non_null(s->out.data); /* NUL-terminated by pdgw_buf_append */
    back = json_loadb(s->out.data, s->out.len, 0, &e);
    assert_non_null(back);
    assert_true(json_equal(back, s->leg));
    json_decref(back);
    return s->out.data;
}

static void test_untouched_body_keeps_the_client_bytes(void **state)
{
    /* Python's json.dumps spacing and an escaped prompt stay byte for byte. */
    const char *raw = "{\"model\": \"m\", \"prompt\": \"a \\\"quoted\\\" \\u00e9 line\\n\", "
                      "\"messages\": [{\"role\": \"user\", \"content\": [1, 2, {\"x\": \"]}\"}]}]}";
    splice_t s;
    (void)state;
    setup(&s, raw);
    assert_string_equal(
        splice_ok(&s, raw),
        "{\"model\":\"m\",\"prompt\":\"a \\\"quoted\\\" \\u00e9 line\\n\","
        "\"messages\":[{\"role\": \"user\", \"content\": [1, 2, {\"x\": \"]}\"}]}]}");
    teardown(&s);
}

static void test_set_delete_and_add(void **state)
{
    const char *raw = "{\"model\":\"m\",\"prompt\":\"long prompt\",\"max_tokens\":100,"
                      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":1}";
    splice_t s;
    (void)state;
    setup(&s, raw);
    json_object_set_new(s.leg, "max_tokens", json_integer(1));
    json_object_set_new(s.leg, "stream", json_false());
    json_object_del(s.leg, "stream_options");
    json_object_set_new(s.leg, "kv_transfer_params", json_pack("{s:b}", "do_remote_decode", 1));
    assert_string_equal(splice_ok(&s, raw),
                        "{\"model\":\"m\",\"prompt\":\"long prompt\",\"max_tokens\":1,"
                        "\"stream\":false,\"n\":1,"
                        "\"kv_transfer_params\":{\"do_remote_decode\":true}}");
    teardown(&s);
}

static void test_same_literal_singleton_is_copied(void **state)
{
    /* jansson's true/false/null are singletons: setting the value the client already had
     * leaves the pointer equal, and the client's literal is the same text. */
    const char *raw = "{ \"stream\" : false , \"echo\":null }";
    splice_t s;
    (void)state;
    setup(&s, raw);
    json_object_set_new(s.leg, "stream", json_false());
    assert_string_equal(splice_ok(&s, raw), "{\"stream\":false,\"echo\":null}");
    teardown(&s);
}

static void test_numbers_and_nesting_at_the_edges(void **state)
{
    const char *raw = "{\"a\":-1.5e3,\"b\":[[],{},[1,[2,[3]]]],\"c\":\"\\\\\",\"d\":0}";
    splice_t s;
    (void)state;
    setup(&s, raw);
    json_object_del(s.leg, "d");
    assert_string_equal(splice_ok(&s, raw),
                        "{\"a\":-1.5e3,\"b\":[[],{},[1,[2,[3]]]],\"c\":\"\\\\\"}");
    teardown(&s);
}

static void test_empty_object_and_all_new(void **state)
{
    const char *raw = " {} ";
    splice_t s;
    (void)state;
    setup(&s, raw);
    json_object_set_new(s.leg, "prompt", json_string("x\"y"));
    assert_string_equal(splice_ok(&s, raw), "{\"prompt\":\"x\\\"y\"}");
    teardown(&s);
}

static void refused(const char *raw)
{
    json_t *client = json_loads(raw, 0, NULL);
    json_t *leg = client ? json_copy(client) : json_object();
    pdgw_buf_t out;
    pdgw_buf_init(&out);
    assert_int_equal(pdgw_body_splice(raw, strlen(raw), client ? client : leg, leg, &out),
                     PDGW_ERR_INVALID);
    pdgw_buf_free(&out);
    json_decref(client);
    json_decref(leg);
}

static void test_unsafe_text_is_refused(void **state)
{
    (void)state;
    /* A key written with an escape: the bytes do not name the parsed key. */
    refused("{\"mo\\u0064el\":\"m\"}");
    /* A key twice: jansson keeps one, the bytes would carry both. */
    refused("{\"stream\":true,\"stream\":false}");
    /* Not an object. */
    refused("[1,2]");
}

static void test_text_cut_short_is_refused(void **state)
{
    const char *raw = "{\"model\":\"m\",\"prompt\":\"abc\"}";
    json_t *client = json_loads(raw, 0, NULL);
    json_t *leg = json_copy(client);
    pdgw_buf_t out;
    (void)state;
    /* The parse of the whole text against a prefix of it: the walk must stop, not read on. */
    for (size_t n = 0; n + 1 < strlen(raw); n++) {
        pdgw_buf_init(&out);
        assert_int_equal(pdgw_body_splice(raw, n, client, leg, &out), PDGW_ERR_INVALID);
        pdgw_buf_free(&out);
    }
    json_decref(client);
    json_decref(leg);
}

static void test_token_id_prompt_is_written_as_jansson_would(void **state)
{
    const char *raw = "{\"model\":\"m\",\"prompt\":\"text\",\"max_tokens\":5}";
    json_t *ids = json_pack("[I,I,I,I,I]", (json_int_t)0, (json_int_t)7, (json_int_t)1445121646,
                            (json_int_t)INT64_MAX, (json_int_t)INT64_MIN);
    json_t *mixed = json_pack("[i,s]", 1, "x");
    char *want;
    splice_t s;
    (void)state;
    setup(&s, raw);
    json_object_set(s.leg, "prompt", ids);
    json_object_set_new(s.leg, "extra", mixed); /* not all integers: jansson writes it */
    json_object_set_new(s.leg, "none", json_array());
    want = json_dumps(ids, JSON_COMPACT);
    assert_string_equal(splice_ok(&s, raw),
                        "{\"model\":\"m\",\"prompt\":[0,7,1445121646,9223372036854775807,"
                        "-9223372036854775808],\"max_tokens\":5,\"extra\":[1,\"x\"],\"none\":[]}");
    assert_non_null(strstr(s.out.data, want));
    free(want);
    json_decref(ids);
    teardown(&s);
}

static void test_body_text_splices_or_serialises(void **state)
{
    const char *raw = "{\"prompt\": \"a\\u00e9\", \"model\": \"m\"}";
    json_t *client = json_loads(raw, 0, NULL);
    json_t *call =
        json_pack("{s:O,s:s}", "prompt", json_object_get(client, "prompt"), "model", "other");
    size_t len = 0;
    char *text;
    (void)state;
    /* the prompt's bytes as the client wrote them, the new model serialised */
    text = pdgw_body_text(raw, strlen(raw), client, call, &len);
    assert_non_null(text);
    assert_string_equal(text, "{\"prompt\":\"a\\u00e9\",\"model\":\"other\"}");
    assert_int_equal(len, strlen(text));
    pdgw_free(text);
    /* no client text to splice from: the whole body serialised (the prompt in UTF-8) */
    text = pdgw_body_text(NULL, 0, NULL, call, &len);
    assert_non_null(text);
    assert_string_equal(text, "{\"prompt\":\"a\xc3\xa9\",\"model\":\"other\"}");
    pdgw_free(text);
    json_decref(call);
    json_decref(client);
}

/* <text> read as an id list equals jansson's parse of it; counted the same. */
static void ids_ok(const char *text)
{
    json_t *fast = pdgw_json_id_list(text, strlen(text));
    json_t *slow = json_loads(text, JSON_DECODE_ANY, NULL);
    size_t n = 99;
    assert_non_null(fast);
    assert_non_null(slow);
    assert_true(json_equal(fast, slow));
    assert_true(pdgw_json_id_list_count(text, strlen(text), &n));
    assert_int_equal(n, json_array_size(slow));
    json_decref(fast);
    json_decref(slow);
}

static void ids_refused(const char *text)
{
    size_t n;
    assert_null(pdgw_json_id_list(text, strlen(text)));
    assert_false(pdgw_json_id_list_count(text, strlen(text), &n));
}

static void test_id_list_reads_only_what_a_parser_accepts(void **state)
{
    (void)state;
    ids_ok("[1,2,3]");
    ids_ok(" [ 0 , 10\t,\n9223372036854775807 ] ");
    ids_ok("[]");
    ids_refused("[9223372036854775808]"); /* beyond int64: jansson refuses it too */
    ids_refused("[-1]");                  /* not an id */
    ids_refused("[01]");                  /* not JSON */
    ids_refused("[1.0]");
    ids_refused("[1e3]");
    ids_refused("[1,]");
    ids_refused("[,1]");
    ids_refused("[1 2]");
    ids_refused("[1]x");
    ids_refused("[\"1\"]");
    ids_refused("[[1]]");
    ids_refused("[1");
    ids_refused("");
    ids_refused("{}");
}

/* A /tokenize answer as vLLM writes it (vllm-project/vllm vllm/entrypoints/openai/protocol.py,
 * TokenizeResponse: count, max_model_len, tokens as a list of ints, token_strs optional). */
static void test_member_id_list(void **state)
{
    const char *answer = "{\"count\":3,\"max_model_len\":8192,\"tokens\":[5, 6, 7]}";
    const char *twice = "{\"tokens\":[1],\"tokens\":[2,3]}";
    json_t *got;
    (void)state;
    got = pdgw_json_member_id_list(answer, strlen(answer), "tokens");
    assert_non_null(got);
    assert_int_equal(json_array_size(got), 3);
    assert_int_equal(json_integer_value(json_array_get(got, 2)), 7);
    json_decref(got);
    /* a name given twice: the last one, as jansson keeps it */
    got = pdgw_json_member_id_list(twice, strlen(twice), "tokens");
    assert_non_null(got);
    assert_int_equal(json_array_size(got), 2);
    json_decref(got);
    /* anything the fast path cannot be sure of is left to the parser */
    assert_null(pdgw_json_member_id_list("{\"count\":3}", 11, "tokens"));
    assert_null(pdgw_json_member_id_list("{\"tok\\u0065ns\":[1]}", 19, "tokens"));
    assert_null(pdgw_json_member_id_list("{\"tokens\":[1]", 13, "tokens"));
    assert_null(pdgw_json_member_id_list("{\"tokens\":[1]} x", 16, "tokens"));
    assert_null(pdgw_json_member_id_list("[1]", 3, "tokens"));
}

/* The last member <name> of <text> is <want> (NULL: none is found). */
static void last_member_is(const char *text, const char *name, const char *want)
{
    const char *val = NULL;
    size_t len = 0;
    bool got = pdgw_json_last_member(text, strlen(text), name, &val, &len);
    if (want == NULL) {
        if (got)
            fail_msg("%s in %s: found %.*s, wanted none", name, text, (int)len, val);
        return;
    }
    if (!got || len != strlen(want) || memcmp(val, want, len) != 0)
        fail_msg("%s in %s: %s %.*s, wanted %s", name, text, got ? "found" : "none", (int)len,
                 got ? val : "", want);
}

/* A non-stream answer as vLLM writes it ends with usage and then kv_transfer_params
 * (vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py, CompletionResponse): the
 * member is found walking back from the end, past values of every kind. */
static void test_last_member_walks_back(void **state)
{
    (void)state;
    last_member_is("{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"a \\\"usage\\\": {}\"}],"
                   "\"usage\":{\"prompt_tokens\":9},\"kv_transfer_params\":{\"remote_block_ids\":"
                   "[1,2],\"remote_host\":\"10.0.0.1\",\"do_remote_decode\":false}}",
                   "usage", "{\"prompt_tokens\":9}");
    /* numbers, literals, strings ending in escaped backslashes and brackets, whitespace */
    last_member_is(" { \"usage\" : [1, {\"a\": \"]\"}] ,\n\"n\": -1.5e3, \"t\":true,\"z\":null,"
                   "\"s\":\"\\\\\",\"b\":\"}\\\"{\" } \n",
                   "usage", "[1, {\"a\": \"]\"}]");
    last_member_is("{\"x\":1,\"usage\":null}", "usage", "null");
    /* the last of a repeated name, as a parser keeps it; nested members are not the object's */
    last_member_is("{\"usage\":1,\"usage\":2}", "usage", "2");
    last_member_is("{\"usage\":1,\"o\":{\"usage\":3}}", "usage", "1");
    last_member_is("{\"o\":{\"usage\":3},\"a\":[{\"usage\":4}]}", "usage", NULL);
    /* a value that happens to read "usage", an escaped name, an empty object */
    last_member_is("{\"k\":\"usage\"}", "usage", NULL);
    last_member_is("{\"us\\u0061ge\":1}", "usage", NULL);
    last_member_is("{}", "usage", NULL);
    /* text that does not end like an object's members */
    last_member_is("[{\"usage\":1}]", "usage", NULL);
    last_member_is("{\"usage\":1} x", "usage", NULL);
    last_member_is("{\"usage\":1,}", "usage", NULL);
    last_member_is("{\"usage\":}", "usage", NULL);
    last_member_is("{\"usage\" 1}", "usage", NULL);
    last_member_is("\"usage\":1}", "usage", NULL);
    last_member_is("{\"a\":\"x}", "usage", NULL);
    last_member_is("", "usage", NULL);
    /* the text before the member is not read: what only ends like an object answers too */
    last_member_is("[garbage,\"usage\":1}", "usage", "1");
}

/* The body's text, parsed, equals <want> (JSON text). */
static void body_is(const char *raw, const json_t *client, const json_t *body, const char *want)
{
    size_t len = 0;
    char *text = pdgw_body_text(raw, raw ? strlen(raw) : 0, client, body, &len);
    json_t *got, *exp = json_loads(want, 0, NULL);
    assert_non_null(text);
    got = json_loadb(text, len, 0, NULL);
    assert_non_null(got);
    assert_non_null(exp);
    assert_true(json_equal(got, exp));
    json_decref(got);
    json_decref(exp);
    pdgw_free(text);
}

/* A body whose prompt is the string <s> is written with a string there. */
static void written_as_string(const char *s)
{
    json_t *body = json_pack("{s:s}", "prompt", s), *back;
    size_t len = 0;
    char *text;
    assert_non_null(body);
    text = pdgw_body_text(NULL, 0, NULL, body, &len);
    assert_non_null(text);
    back = json_loadb(text, len, 0, NULL);
    assert_non_null(back);
    assert_string_equal(json_string_value(json_object_get(back, "prompt")), s);
    json_decref(back);
    json_decref(body);
    pdgw_free(text);
}

/* Token ids held as text (the lmcache flow's prompt): written into a leg body as they are,
 * whether it is spliced or serialised whole, and never mistaken for a client's string. */
static void test_ids_kept_as_text(void **state)
{
    const char *answer = "{\"count\":3,\"max_model_len\":8192,\"tokens\":[5, 6, 7]}";
    const char *raw = "{\"model\":\"m\",\"prompt\":\"hi\"}";
    const char *escaped = "{\"mod\\u0065l\":\"m\",\"prompt\":\"hi\"}"; /* refused by the splice */
    json_t *client = json_loads(raw, 0, NULL), *client2 = json_loads(escaped, 0, NULL);
    json_t *ids, *more, *body, *arr;
    const char *t;
    size_t n = 0, tl;
    char forged[128];
    (void)state;

    ids = pdgw_fwd_answer_ids_text(answer, strlen(answer), "tokens", &n);
    assert_non_null(ids);
    assert_int_equal(n, 3);
    assert_true(pdgw_json_raw_text(ids, &t, &tl));
    assert_int_equal(tl, strlen("[5, 6, 7]")); /* the engine's bytes, checked, not rewritten */
    more = pdgw_fwd_ids_text_append(ids, 8);
    assert_non_null(more);

    /* spliced: the prompt changed, the model is the client's */
    body = json_copy(client);
    json_object_set(body, "prompt", ids);
    body_is(raw, client, body, "{\"model\":\"m\",\"prompt\":[5,6,7]}");
    /* a new member, and the same ids + [8] */
    json_object_set(body, "prompt", more);
    json_object_set(body, "ids", ids);
    body_is(raw, client, body, "{\"model\":\"m\",\"prompt\":[5,6,7,8],\"ids\":[5,6,7]}");
    json_decref(body);
    /* serialised whole (a key written with an escape cannot be spliced) */
    body = json_copy(client2);
    json_object_set(body, "prompt", more);
    body_is(escaped, client2, body, "{\"model\":\"m\",\"prompt\":[5,6,7,8]}");
    json_decref(body);

    /* a client string that starts like the marker is a string still: cut short, or of the
     * marker's length with one random digit changed */
    assert_true(pdgw_json_raw_text(ids, &t, &tl));
    {
        size_t ml = (size_t)(t - json_string_value(ids));
        assert_true(ml + 4 <= sizeof(forged));
        memcpy(forged, json_string_value(ids), ml - 3);
        memcpy(forged + ml - 3, "[1]", 4);
        written_as_string(forged);
        memcpy(forged, json_string_value(ids), ml);
        forged[ml - 2] = forged[ml - 2] == 'a' ? 'b' : 'a';
        memcpy(forged + ml, "[1]", 4);
        written_as_string(forged);
    }

    /* a client's own ids, and the edges of append */
    arr = json_pack("[iii]", 0, 42, 9);
    json_decref(more);
    more = pdgw_fwd_ids_text_from(arr, &n);
    assert_non_null(more);
    assert_int_equal(n, 3);
    assert_true(pdgw_json_raw_text(more, &t, &tl));
    assert_int_equal(tl, 8);
    assert_memory_equal(t, "[0,42,9]", 8);
    json_decref(more);
    json_array_append_new(arr, json_integer(-1));
    assert_null(pdgw_fwd_ids_text_from(arr, &n));
    json_decref(arr);
    arr = json_pack("[s]", "1");
    assert_null(pdgw_fwd_ids_text_from(arr, &n));
    json_decref(arr);
    arr = json_array();
    more = pdgw_fwd_ids_text_from(arr, &n);
    assert_int_equal(n, 0);
    body = pdgw_fwd_ids_text_append(more, 3); /* [] + 3 */
    assert_true(pdgw_json_raw_text(body, &t, &tl));
    assert_int_equal(tl, 3);
    assert_memory_equal(t, "[3]", 3);
    json_decref(body);
    json_decref(more);
    json_decref(arr);
    assert_null(pdgw_fwd_ids_text_append(ids, -1));
    assert_null(pdgw_fwd_ids_text_append(client, 1)); /* not ids held as text */
    assert_null(pdgw_fwd_answer_ids_text("{\"tokens\":[1,-2]}", 18, "tokens", &n));
    assert_null(pdgw_fwd_answer_ids_text("{\"count\":1}", 11, "tokens", &n));

    json_decref(ids);
    json_decref(client);
    json_decref(client2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untouched_body_keeps_the_client_bytes),
        cmocka_unit_test(test_set_delete_and_add),
        cmocka_unit_test(test_same_literal_singleton_is_copied),
        cmocka_unit_test(test_numbers_and_nesting_at_the_edges),
        cmocka_unit_test(test_empty_object_and_all_new),
        cmocka_unit_test(test_unsafe_text_is_refused),
        cmocka_unit_test(test_text_cut_short_is_refused),
        cmocka_unit_test(test_token_id_prompt_is_written_as_jansson_would),
        cmocka_unit_test(test_body_text_splices_or_serialises),
        cmocka_unit_test(test_id_list_reads_only_what_a_parser_accepts),
        cmocka_unit_test(test_member_id_list),
        cmocka_unit_test(test_last_member_walks_back),
        cmocka_unit_test(test_ids_kept_as_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
