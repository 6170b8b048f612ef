/*
 * test_json_load.c - the one-pass body parser (pdgw_json_load.c) gives jansson's tree, in
 * jansson's member order, for what it takes; declines what jansson refuses or may read
 * differently; and pdgw_json_loadb then gives jansson's own error at jansson's position.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_json_load.h"

/* <piece> repeated until the body is long: {"prompt":"<piece>...<piece>",<rest>} */
static char *body_with(const char *piece, const char *rest)
{
    size_t n = strlen(piece), reps = 600 / n + 1, len = reps * n + strlen(rest) + 32;
    char *b = malloc(len), *w = b;
    assert_non_null(b);
    w += sprintf(w, "{\"prompt\":\"");
    for (size_t i = 0; i < reps; i++)
        w += sprintf(w, "%s", piece);
    sprintf(w, "\"%s}", rest);
    return b;
}

/* <fast>: the one-pass parser takes the text (else it declines and jansson parses it). */
static void same_as_jansson(const char *text, bool fast)
{
    json_error_t e1, e2;
    json_t *quick = pdgw_json_load_fast(text, strlen(text));
    json_t *loaded = pdgw_json_loadb(text, strlen(text), &e1);
    json_t *slow = json_loadb(text, strlen(text), 0, &e2);
    assert_int_equal(quick != NULL, fast);
    /* the check alone takes the objects the parser loads and nothing else */
    assert_int_equal(pdgw_json_check_members(text, strlen(text), NULL, NULL),
                     quick != NULL && json_is_object(quick));
    json_decref(quick);
    if (slow == NULL) {
        assert_null(loaded);
        assert_string_equal(e1.text, e2.text);
        assert_int_equal(e1.line, e2.line);
        assert_int_equal(e1.column, e2.column);
        return;
    }
    assert_non_null(loaded);
    assert_true(json_equal(loaded, slow));
    /* the same member order too: leg bodies are written from the tree */
    char *a = json_dumps(loaded, JSON_COMPACT), *b = json_dumps(slow, JSON_COMPACT);
    assert_string_equal(a, b);
    free(a);
    free(b);
    json_decref(loaded);
    json_decref(slow);
}

static void test_long_prompt_with_every_escape(void **state)
{
    char *b;
    (void)state;
    /* the simple escapes, \u forms in both cases, a surrogate pair, raw UTF-8 of 2-4 bytes */
    b = body_with("a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\u00E9\\u20ac\\ud83d\\ude00"
                  " caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 ",
                  ",\"model\":\"m\",\"max_tokens\":3");
    same_as_jansson(b, true);
    free(b);
}

/* Strings are scanned eight bytes at a time: a byte that needs a look (closing quote,
 * backslash, control character, UTF-8 lead or continuation byte, raw 0x7f and 0x20 at the
 * edges) at every offset of the first words, in strings of every length around a word. */
static void test_each_byte_that_needs_a_look_at_every_offset(void **state)
{
    static const char *const odd[] = {
        "\"",   "\\n",  "\x01", "\x1f", " ", "\x7f", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
        "\x80", "\xff", "\xc3"};
    char text[128];
    (void)state;
    for (size_t k = 0; k < sizeof(odd) / sizeof(odd[0]); k++) {
        for (int before = 0; before <= 17; before++) {
            for (int after = 0; after <= 9; after += 3) {
                int n = snprintf(text, sizeof(text), "{\"p\":\"%.*s%s%.*s\",\"q\":1}", before,
                                 "abcdefghijklmnopqrstuvwxyz", odd[k], after, "ABCDEFGHIJ");
                assert_true(n > 0 && (size_t)n < sizeof(text));
                /* what jansson takes the one-pass parser takes too; it declines the rest */
                json_t *slow = json_loads(text, 0, NULL);
                same_as_jansson(text, slow != NULL);
                json_decref(slow);
            }
        }
    }
}

static void test_long_strings_anywhere_but_names(void **state)
{
    char name[400];
    char text[2048];
    (void)state;
    memset(name, 'k', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    /* chat contents nested in arrays and objects; a long member name stays jansson's */
    snprintf(text, sizeof(text),
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"},{\"role\":\"assistant\","
             "\"content\":[{\"type\":\"text\",\"text\":\"%s\"}]}],\"%s\":[\"%s\", 1, null]}",
             name, name, name, name);
    same_as_jansson(text, true);
}

static void test_what_jansson_refuses_it_refuses_alike(void **state)
{
    static const char *const bad[] = {
        "\\ud800 alone",
        "\\udc00 first",
        "\\ud800\\u0041",
        "\\u0000",
        "\\x",
        "\\u12g4",
        "raw \x01 control",
        "\xc0\x80 overlong",
        "\xed\xa0\x80 surrogate",
        "\xf5\x80\x80\x80",
        "\xe2\x82 cut",
        "\x80 continuation",
        "\xf4\x90\x80\x80 above",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *b = body_with("fine text ", "");
        /* the bad piece in the middle of a long prompt */
        char *mid = strstr(b, "fine text fine");
        char *t = malloc(strlen(b) + strlen(bad[i]) + 1);
        assert_non_null(mid);
        assert_non_null(t);
        sprintf(t, "%.*s%s%s", (int)(mid - b), b, bad[i], mid);
        same_as_jansson(t, false);
        free(t);
        free(b);
    }
    /* the string does not close; the body is cut; a syntax error after a long string */
    {
        char cut[320] = "{\"prompt\":\"";
        memset(cut + strlen(cut), 'x', 300); /* a long string that never closes */
        same_as_jansson(cut, false);
    }
    {
        char *b = body_with("y", ",\"max_tokens\":}");
        same_as_jansson(b, false); /* a syntax error after a long string */
        free(b);
    }
}

static void test_numbers_as_jansson_reads_them(void **state)
{
    static const char *const taken[] = {
        "[0, -0, 7, -7, 16, 9223372036854775807, -9223372036854775808]",
        "[0.0, -0.0, 1.5, -2.25e3, 1E5, 1e+2, 1e-2, 123456789.123456789, 2.2250738585072014e-308]",
        "{\"max_tokens\":16,\"temperature\":0.7,\"top_p\":1}",
    };
    /* out of range: jansson refuses overflow and keeps underflow; the parser declines both */
    static const char *const declined[] = {
        "[9223372036854775808]",
        "[-9223372036854775809]",
        "[1e400]",
        "[-1e400]",
        "[1e-400]",
        "[01]",
        "[-]",
        "[1.]",
        "[.5]",
        "[1e]",
        "[1e+]",
        "[+1]",
        "[0x10]",
        "[1.5.2]",
        "[11111111111111111111111111111111111111111111111111111111111111111111111.5]",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        same_as_jansson(taken[i], true);
    for (size_t i = 0; i < sizeof(declined) / sizeof(declined[0]); i++)
        same_as_jansson(declined[i], false);
}

static void test_roots_literals_and_what_follows(void **state)
{
    static const char *const taken[] = {
        "{}",
        " [ ] ",
        "\r\n\t{\"a\" : [ true , false , null ] }\n",
        "[[[[]]],{}]",
        "{\"\":\"\",\"k\\u00e9y\":\"v\\n\",\"k\\\"q\":{\"x\\ty\":\"\\u20ac\"}}",
    };
    static const char *const declined[] = {
        "",
        "   ",
        "\"root string\"",
        "1",
        "true",
        "null",
        "{} x",
        "{}{}",
        "[] ]",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "[1,]",
        "[,1]",
        "{,}",
        "[tru]",
        "[truex]",
        "[nul]",
        "{\"a\" 1}",
        "{a:1}",
        "['a']",
        "\xef\xbb\xbf{}",
        "[\"a\"\"b\"]",
        "{\"a\":1 \"b\":2}",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        same_as_jansson(taken[i], true);
    for (size_t i = 0; i < sizeof(declined) / sizeof(declined[0]); i++)
        same_as_jansson(declined[i], false);
}

static void test_escaped_names_do_not_share_the_values_buffer(void **state)
{
    /* a name with escapes, then a value with escapes: the name must survive the value's
     * decoding; repeated names with escapes replace the earlier member in its place */
    (void)state;
    same_as_jansson("{\"n\\u00e9\":\"v\\u00e8\\t\",\"b\":1,\"n\\u00e9\":\"w\\n\"}", true);
    same_as_jansson("{\"a\\\\b\":{\"c\\/d\":[\"e\\\"f\",\"g\\bh\"]}}", true);
}

static void test_nesting_deeper_than_the_parser_goes(void **state)
{
    char deep[2 * 600 + 1];
    (void)state;
    for (int levels = 255; levels <= 257; levels++) { /* around the parser's own limit */
        memset(deep, '[', (size_t)levels);
        memset(deep + levels, ']', (size_t)levels);
        deep[2 * levels] = '\0';
        same_as_jansson(deep, levels <= 256);
    }
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    deep[1200] = '\0';
    same_as_jansson(deep, false); /* jansson still takes it */
}

static void test_duplicate_names_keep_the_last(void **state)
{
    char *b = body_with("first ", ",\"prompt\":\"second\"");
    json_t *j = pdgw_json_loadb(b, strlen(b), NULL);
    (void)state;
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "prompt")), "second");
    json_decref(j);
    free(b);
}

/* A prefill's answer read for the members its forwarder names (pdgw_json_load_members): those
 * as jansson reads them, nothing else, and no tree at all from text that is not one object or
 * whose wanted value does not parse. */
static const char *const kvp_members[] = {"kv_transfer_params", "n", NULL};

static json_t *members_of(const char *text)
{
    return pdgw_json_load_members(text, strlen(text), kvp_members);
}

static void test_only_the_named_members(void **state)
{
    static const char answer[] =
        "{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"} ] {\\\" x\",\"logprobs\":null}],"
        "\"kv_transfer_params\":{\"remote_block_ids\":[[0,1]],\"remote_host\":\"h\"},"
        "\"usage\":{\"prompt_tokens\":24}, \"n\" : 7 }";
    json_t *got, *want;
    (void)state;
    got = members_of(answer);
    want = json_loads(answer, 0, NULL);
    assert_non_null(got);
    assert_non_null(want);
    assert_int_equal(json_object_size(got), 2);
    assert_true(json_equal(json_object_get(got, "kv_transfer_params"),
                           json_object_get(want, "kv_transfer_params")));
    assert_int_equal(json_integer_value(json_object_get(got, "n")), 7);
    json_decref(got);
    json_decref(want);

    /* a name given twice: the last one, as jansson keeps it */
    got = members_of("{\"n\":1,\"n\":{\"a\":2}}");
    assert_non_null(got);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(got, "n"), "a")), 2);
    json_decref(got);
    /* none of them: an empty object, not a failure */
    got = members_of("{\"id\":\"x\"}");
    assert_non_null(got);
    assert_int_equal(json_object_size(got), 0);
    json_decref(got);
    /* an escaped name may be a wanted one: the whole answer is read */
    got = members_of("{\"\\u006e\":3,\"id\":1}");
    assert_non_null(got);
    assert_int_equal(json_integer_value(json_object_get(got, "n")), 3);
    json_decref(got);
    /* not one object; a wanted value that is not JSON; text after the object */
    assert_null(members_of("[1]"));
    assert_null(members_of("{\"n\":tru}"));
    assert_null(members_of("{\"kv_transfer_params\":{\"a\":}}"));
    assert_null(members_of("{\"id\":\"open}"));
    assert_null(members_of("{\"n\":1} x"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_prompt_with_every_escape),
        cmocka_unit_test(test_each_byte_that_needs_a_look_at_every_offset),
        cmocka_unit_test(test_long_strings_anywhere_but_names),
        cmocka_unit_test(test_what_jansson_refuses_it_refuses_alike),
        cmocka_unit_test(test_numbers_as_jansson_reads_them),
        cmocka_unit_test(test_roots_literals_and_what_follows),
        cmocka_unit_test(test_escaped_names_do_not_share_the_values_buffer),
        cmocka_unit_test(test_nesting_deeper_than_the_parser_goes),
        cmocka_unit_test(test_duplicate_names_keep_the_last),
        cmocka_unit_test(test_only_the_named_members),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
