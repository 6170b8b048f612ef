/*
 * tmpl_test_util.h - helpers of the chat-template unit tests: render a template source with a
 * request given as JSON text, and compare.
 */
#ifndef TMPL_TEST_UTIL_H
#define TMPL_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdtok/template.h"

/* Renders <src> for <req_json> (NULL = one user message); returns a malloc'd text, or NULL
 * with the message (load or render) in <err>. */
static char *render_err(const char *src, const char *req_json, char *err, size_t errlen)
{
    pdtok_template_t *t = pdtok_template_parse(src, strlen(src), "<s>", "</s>", err, errlen);
    if (t == NULL)
        return NULL;
    json_error_t jerr;
    json_t *req = json_loads(
        req_json ? req_json : "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0, &jerr);
    assert_non_null(req);
    pdb_buf_t out = PDB_BUF_INIT;
    char *res = NULL;
    if (pdtok_template_render(t, req, &out, err, errlen) == 0) {
        res = strdup(out.data ? out.data : "");
    }
    pdb_buf_free(&out);
    json_decref(req);
    pdtok_template_free(t);
    return res;
}

#define assert_render(src, req, expected)                                                          \
    do {                                                                                           \
        char e_[512] = "";                                                                         \
        char *got_ = render_err((src), (req), e_, sizeof(e_));                                     \
        if (got_ == NULL)                                                                          \
            fail_msg("render failed: %s", e_);                                                     \
        assert_string_equal(got_, (expected));                                                     \
        free(got_);                                                                                \
    } while (0)

/* Load or render fails with a message containing <needle>. */
#define assert_render_fails(src, req, needle)                                                      \
    do {                                                                                           \
        char e_[512] = "";                                                                         \
        char *got_ = render_err((src), (req), e_, sizeof(e_));                                     \
        if (got_ != NULL)                                                                          \
            fail_msg("expected failure, got \"%s\"", got_);                                        \
        if (strstr(e_, (needle)) == NULL)                                                          \
            fail_msg("error \"%s\" lacks \"%s\"", e_, (needle));                                   \
    } while (0)

#endif
