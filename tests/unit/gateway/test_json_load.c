/*
 * test_json_load.c - client bodies whose long strings are decoded outside jansson
 * (pdgw_json_load.c) give jansson's tree for what it accepts and jansson's own error, at
 * jansson's position, for what it refuses.
 */
#include <setjmp.h>
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

/* <fast_strings> long strings decoded by the fast path (0: jansson parses the text whole). */
static void same_as_jansson(const char *text, size_t fast_strings)
{
    json_error_t e1, e2;
    json_t *fast = pdgw_json_loadb(text, strlen(text), &e1);
    json_t *slow = json_loadb(text, strlen(text), 0, &e2);
    assert_int_equal(pdgw_json_long_strings(text, strlen(text)), fast_strings);
    if (slow == NULL) {
        assert_null(fast);
        assert_string_equal(e1.text, e2.text);
        assert_int_equal(e1.line, e2.line);
        assert_int_equal(e1.column, e2.column);
        return;
    }
    assert_non_null(fast);
    assert_true(json_equal(fast, slow));
    json_decref(fast);
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
    same_as_jansson(b, 1);
    free(b);
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
    same_as_jansson(text, 3);
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
        same_as_jansson(t, 0);
        free(t);
        free(b);
    }
    /* the string does not close; the body is cut; a syntax error after a long string */
    {
        char cut[320] = "{\"prompt\":\"";
        memset(cut + strlen(cut), 'x', 300); /* a long string that never closes */
        same_as_jansson(cut, 0);
    }
    {
        char *b = body_with("y", ",\"max_tokens\":}");
        same_as_jansson(b, 1); /* decoded, then jansson's error on the rest */
        free(b);
    }
}

static void test_a_client_cannot_name_a_placeholder(void **state)
{
    /* strings that look like the placeholders stay what the client wrote */
    char *b = body_with("z", ",\"fake\":\"\\u0001pdgw0000000000000000:0\","
                             "\"fake2\":\"\\u0001pdgw\",\"dup\":\"x\",\"dup\":\"y\"");
    (void)state;
    same_as_jansson(b, 1);
    free(b);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_prompt_with_every_escape),
        cmocka_unit_test(test_long_strings_anywhere_but_names),
        cmocka_unit_test(test_what_jansson_refuses_it_refuses_alike),
        cmocka_unit_test(test_a_client_cannot_name_a_placeholder),
        cmocka_unit_test(test_duplicate_names_keep_the_last),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
