/*
 * test_validate_pd.c - PD control fields in client bodies (pdgw_validate_pd.c): every field
 * upstream engines read as PD control is refused with a 400 naming it, or stripped; other
 * fields are left alone; a forwarder's own extra fields count too.
 *
 * Field list checked against vLLM vllm/entrypoints/openai/completion/protocol.py and
 * chat_completion/protocol.py (kv_transfer_params, ec_transfer_params, vllm_xargs merged into
 * SamplingParams.extra_args) and SGLang python/sglang/srt/managers/io_struct.py
 * (GenerateReqInput: bootstrap_host/port/room/pair_key, decode_tp_size, routed_dp_rank,
 * disagg_prefill_dp_rank, data_parallel_rank).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_errors.h"
#include "pdgw_validate.h"

static json_t *body_with(const char *key, json_t *value)
{
    json_t *b = json_pack("{s:s,s:s,s:i}", "model", "m", "prompt", "hi", "max_tokens", 4);
    assert_non_null(b);
    json_object_set_new(b, key, value);
    return b;
}

static void test_each_field_rejected_and_named(void **state)
{
    static const char *const fields[] = {
        "kv_transfer_params",    "ec_transfer_params",
        "disagg_spec",           "transfer_id",
        "do_remote_prefill",     "do_remote_decode",
        "bootstrap_host",        "bootstrap_port",
        "bootstrap_room",        "bootstrap_pair_key",
        "bootstrap_server_host", "decode_tp_size",
        "routed_dp_rank",        "disagg_prefill_dp_rank",
        "data_parallel_rank",    "remote_host",
        "remote_port",           "remote_engine_id",
        "remote_block_ids",      "remote_request_id",
        "remote_bootstrap_addr", "kv_router_hint",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        json_t *b = body_with(fields[i], json_string("127.0.0.1"));
        pdgw_pd_fields_result_t res;
        pdgw_api_error_t err;
        memset(&err, 0, sizeof(err));
        if (pdgw_request_pd_fields(b, PDGW_PD_FIELDS_REJECT, NULL, &res, &err) != PDGW_ERR_INVALID)
            fail_msg("%s accepted", fields[i]);
        assert_int_equal(pdgw_api_error_http_status(&err), 400);
        assert_string_equal(err.param, fields[i]);
        assert_non_null(strstr(err.message, fields[i]));
        assert_int_equal(res.n_hits, 1);
        /* the body is left as it was */
        assert_non_null(json_object_get(b, fields[i]));
        json_decref(b);
    }
}

static void test_ordinary_fields_pass(void **state)
{
    pdgw_pd_fields_result_t res;
    pdgw_api_error_t err;
    json_t *b =
        json_pack("{s:s,s:s,s:i,s:b,s:s,s:s,s:{s:i}}", "model", "m", "prompt", "hi", "max_tokens",
                  4, "stream", 1, "user", "u", "request_id", "x", "vllm_xargs", "my_arg", 1);
    (void)state;
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_REJECT, NULL, &res, &err), PDGW_OK);
    assert_int_equal(res.n_hits, 0);
    json_decref(b);
}

static void test_xargs_kv_params(void **state)
{
    /* vLLM starts extra_args from vllm_xargs and only overwrites kv_transfer_params when the
     * top-level one is truthy: a client could slip params in through vllm_xargs. */
    pdgw_pd_fields_result_t res;
    pdgw_api_error_t err;
    json_t *b =
        body_with("vllm_xargs", json_pack("{s:s,s:i}", "kv_transfer_params", "x", "keep", 1));
    (void)state;
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_REJECT, NULL, &res, &err),
                     PDGW_ERR_INVALID);
    assert_string_equal(err.param, "vllm_xargs.kv_transfer_params");
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_STRIP, NULL, &res, &err), PDGW_OK);
    assert_int_equal(res.n_hits, 1);
    assert_null(json_object_get(json_object_get(b, "vllm_xargs"), "kv_transfer_params"));
    assert_non_null(json_object_get(json_object_get(b, "vllm_xargs"), "keep"));
    json_decref(b);
}

static void test_strip_removes_all(void **state)
{
    pdgw_pd_fields_result_t res;
    pdgw_api_error_t err;
    json_t *b = json_pack("{s:s,s:s,s:s,s:i,s:i,s:{s:s},s:i}", "model", "m", "prompt", "hi",
                          "bootstrap_host", "10.0.0.9", "bootstrap_port", 1, "bootstrap_room", 7,
                          "kv_transfer_params", "remote_host", "10.0.0.9", "temperature", 0);
    (void)state;
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_STRIP, NULL, &res, &err), PDGW_OK);
    assert_int_equal(res.n_hits, 4);
    assert_null(json_object_get(b, "bootstrap_host"));
    assert_null(json_object_get(b, "bootstrap_port"));
    assert_null(json_object_get(b, "bootstrap_room"));
    assert_null(json_object_get(b, "kv_transfer_params"));
    assert_non_null(json_object_get(b, "prompt"));
    assert_non_null(json_object_get(b, "temperature"));
    json_decref(b);
}

static void test_pass_counts_only(void **state)
{
    pdgw_pd_fields_result_t res;
    pdgw_api_error_t err;
    json_t *b = body_with("bootstrap_room", json_integer(5));
    (void)state;
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_PASS, NULL, &res, &err), PDGW_OK);
    assert_int_equal(res.n_hits, 1);
    assert_string_equal(res.rules[0], "bootstrap_*");
    assert_non_null(json_object_get(b, "bootstrap_room"));
    json_decref(b);
}

static void test_forwarder_extra_fields(void **state)
{
    static const char *const extra[] = {"rid", "my_proto_*", NULL};
    pdgw_pd_fields_result_t res;
    pdgw_api_error_t err;
    json_t *b = body_with("my_proto_peer", json_string("h:1"));
    (void)state;
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_REJECT, NULL, &res, &err), PDGW_OK);
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_REJECT, extra, &res, &err),
                     PDGW_ERR_INVALID);
    assert_string_equal(err.param, "my_proto_peer");
    assert_string_equal(res.rules[0], "my_proto_*");
    json_decref(b);
    b = body_with("rid", json_string("other-request"));
    assert_int_equal(pdgw_request_pd_fields(b, PDGW_PD_FIELDS_STRIP, extra, &res, &err), PDGW_OK);
    assert_null(json_object_get(b, "rid"));
    json_decref(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_field_rejected_and_named),
        cmocka_unit_test(test_ordinary_fields_pass),
        cmocka_unit_test(test_xargs_kv_params),
        cmocka_unit_test(test_strip_removes_all),
        cmocka_unit_test(test_pass_counts_only),
        cmocka_unit_test(test_forwarder_extra_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
