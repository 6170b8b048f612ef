/*
 * test_req.c - the request's error text (pdgw_req.c): allocated by the first error only,
 * first-wins for error replies, replaced by a later verdict, kept to PDGW_REQ_ERROR_MAX
 * bytes; and without memory for it the request goes on with none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_alloc.h"
#include "pdgw_server_int.h"

static void test_error_text_on_demand(void **state)
{
    pdgw_req_t *r = calloc(1, sizeof(*r));
    (void)state;
    assert_non_null(r);
    /* Most requests never fail: no buffer, and readers see "". */
    assert_null(r->error_text);
    assert_string_equal(pdgw_req_error(r), "");
    /* An error reply records its message only if nothing was recorded before. */
    pdgw_req_error_first(r, "model not served: %s", "m");
    assert_non_null(r->error_text);
    pdgw_req_error_first(r, "%s", "later");
    assert_string_equal(pdgw_req_error(r), "model not served: m");
    /* A later verdict (a client that went away) replaces it. */
    pdgw_req_error_set(r, "client disconnected%s", " mid-stream");
    assert_string_equal(pdgw_req_error(r), "client disconnected mid-stream");
    pdgw_free(r->error_text);
    free(r);
}

static void test_error_text_bounded(void **state)
{
    pdgw_req_t *r = calloc(1, sizeof(*r));
    char big[2 * PDGW_REQ_ERROR_MAX];
    (void)state;
    assert_non_null(r);
    memset(big, 'e', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pdgw_req_error_set(r, "%s", big);
    assert_int_equal(strlen(pdgw_req_error(r)), PDGW_REQ_ERROR_MAX - 1);
    pdgw_free(r->error_text);
    free(r);
}

static void test_error_text_out_of_memory(void **state)
{
    pdgw_req_t *r = calloc(1, sizeof(*r));
    (void)state;
    assert_non_null(r);
    pdgw_alloc_fail_at(1, 0);
    pdgw_req_error_set(r, "%s", "lost");
    pdgw_alloc_fail_at(0, 0);
    assert_null(r->error_text);
    assert_string_equal(pdgw_req_error(r), "");
    /* The next error gets its buffer. */
    pdgw_req_error_first(r, "%s", "kept");
    assert_string_equal(pdgw_req_error(r), "kept");
    pdgw_free(r->error_text);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_text_on_demand),
        cmocka_unit_test(test_error_text_bounded),
        cmocka_unit_test(test_error_text_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
