/*
 * test_json_dump.c - pdgw_json_dump writes what json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)
 * writes, byte for byte: leg bodies and rewritten answers go to engines and clients as text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_json_dump.h"

static void same_as_jansson(const json_t *v)
{
    char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t len = 0;
    char *got = pdgw_json_dumps(v, &len);
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(len, strlen(want));
    assert_string_equal(got, want);
    free(want);
    free(got);
}

static void test_every_byte_of_a_string(void **state)
{
    static const char *const malformed[] = {"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                            "\xe2\x82", "\x80",         "ok \xff"};
    char all[127 + 9];
    size_t len;
    (void)state;
    for (int i = 0; i < 127; i++)
        all[i] = (char)(i + 1);                                   /* control characters, '/', DEL */
    memcpy(all + 127, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9); /* 2, 3 and 4 bytes */
    json_t *s = json_stringn_nocheck(all, sizeof(all));
    same_as_jansson(s);
    json_decref(s);
    /* strings that are not UTF-8 (only a *_nocheck constructor makes them): both refuse */
    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
        json_t *bad = json_pack("{s:o}", "k", json_string_nocheck(malformed[i]));
        char *want = json_dumps(bad, JSON_COMPACT);
        assert_null(want);
        assert_null(pdgw_json_dumps(bad, &len));
        json_decref(bad);
    }
    /* a name written alone, as the body splice writes the names it changes */
    pdgw_buf_t b = PDGW_BUF_INIT;
    assert_int_equal(pdgw_json_dump_string(&b, "k\"\\\n\x01\x1f\x7f/", 8), PDGW_OK);
    assert_string_equal(b.data, "\"k\\\"\\\\\\n\\u0001\\u001F\x7f/\"");
    assert_int_equal(pdgw_json_dump_string(&b, "\xff", 1), PDGW_ERR_INVALID);
    pdgw_buf_free(&b);
}

static void test_names_values_and_nesting(void **state)
{
    json_t *o;
    (void)state;
    o = json_pack("{s:s,s:I,s:I,s:I,s:b,s:b,s:n,s:[],s:{},s:[i,[i,{s:[s]}]]}", "prompt",
                  "line\n\"quoted\" caf\xc3\xa9 \\ / \t end", "min", (json_int_t)INT64_MIN, "max",
                  (json_int_t)INT64_MAX, "zero", (json_int_t)0, "t", 1, "f", 0, "nothing",
                  "empty_list", "empty_object", "nested", 1, 2, "deep", "x");
    assert_non_null(o);
    /* names that need escaping, one with a NUL inside (jansson keeps a name's length) */
    json_object_set_new(o, "k\"e\\y\x01\x7f", json_string("v"));
    json_object_setn_new(o, "nul\0name", 8, json_integer(-7));
    /* a later set of an existing name keeps its place */
    json_object_set_new(o, "min", json_integer(-1));
    same_as_jansson(o);
    json_decref(o);
}

static void test_reals_as_jansson_formats_them(void **state)
{
    static const double reals[] = {0.0, -0.0, 1.0, 0.1, -2.5e-7, 1e300, 123456789.125, 3e-320};
    json_t *a = json_array();
    (void)state;
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++)
        json_array_append_new(a, json_real(reals[i]));
    same_as_jansson(a);
    json_decref(a);
}

static void test_nesting_beyond_the_limit_is_refused(void **state)
{
    json_t *root = json_array(), *at = root;
    pdgw_buf_t out = PDGW_BUF_INIT;
    size_t len;
    (void)state;
    for (int i = 0; i < PDGW_JSON_DUMP_DEPTH_MAX + 1; i++) {
        json_t *inner = json_array();
        json_array_append_new(at, inner);
        at = inner;
    }
    assert_int_equal(pdgw_json_dump(&out, root), PDGW_ERR_INVALID);
    assert_null(pdgw_json_dumps(root, &len));
    pdgw_buf_free(&out);
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_byte_of_a_string),
        cmocka_unit_test(test_names_values_and_nesting),
        cmocka_unit_test(test_reals_as_jansson_formats_them),
        cmocka_unit_test(test_nesting_beyond_the_limit_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
