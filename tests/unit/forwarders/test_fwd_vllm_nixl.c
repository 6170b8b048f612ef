/*
 * test_fwd_vllm_nixl.c - the vllm-nixl forwarder against upstream vLLM's NixlConnector:
 *   - the lease: a decode-only retry is allowed while the prefill holds the KV
 *     (kv_connector_extra_config kv_lease_duration, 30 s by default;
 *     vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py), afterwards the
 *     prefill runs again; a Unix-time remote_blocks_expiry_time is honoured;
 *   - params the decode cannot use (vllm .../nixl/pull_scheduler.py update_state_after_alloc:
 *     non-empty remote_block_ids, remote_engine_id, remote_request_id, remote_host,
 *     remote_port) are counted and passed on; the newest list-of-lists block ids are usable;
 *     a key present with null counts as present (`p in params`);
 *   - X-data-parallel-rank on legs to DP instances (vllm/entrypoints/openai/serving_engine.py
 *     _get_data_parallel_rank).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw/forwarder.h"
#include "pdgw_registry.h"

static const pdgw_instance_t inst_p = {.id = "p0",
                                       .url = "http://10.0.0.1:8100",
                                       .host = "10.0.0.1",
                                       .port = 8100,
                                       .role = PDGW_FWD_ROLE_PREFILL,
                                       .zone = "",
                                       .kv_host = "10.0.0.1",
                                       .engine_id = "",
                                       .tp_size = 1,
                                       .dp_rank = 3,
                                       .dp_size = 4};
static const pdgw_instance_t inst_d = {.id = "d0",
                                       .url = "http://10.0.0.2:8200",
                                       .host = "10.0.0.2",
                                       .port = 8200,
                                       .role = PDGW_FWD_ROLE_DECODE,
                                       .zone = "",
                                       .kv_host = "10.0.0.2",
                                       .engine_id = "",
                                       .tp_size = 1,
                                       .dp_rank = 0,
                                       .dp_size = 1};

typedef struct fx {
    const pdgw_fwd_desc_t *d;
    void *ctx, *st;
    json_t *client;
    pdgw_fwd_request_t req;
    pdgw_fwd_peers_t peers;
} fx_t;

static void fx_open(fx_t *f, const char *opts_json)
{
    json_t *opts = json_loads(opts_json, 0, NULL);
    pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, "vllm-nixl", PDGW_MODE_BATCH, 1, 0, NULL};
    char err[256] = "";
    pdgw_fwd_error_t e;
    memset(f, 0, sizeof(*f));
    f->d = pdgw_registry_find("vllm-nixl");
    assert_non_null(f->d);
    assert_non_null(opts);
    assert_int_equal(f->d->ops->configure(opts, &env, &f->ctx, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    f->client = json_pack("{s:s,s:s,s:i}", "model", "m", "prompt", "hello", "max_tokens", 8);
    f->req.request_id = "2b9f6a62-2a0e-4c4e-9f55-0f1c2d3e4f50";
    f->req.client_request_id = "client-1";
    f->req.path = "/v1/completions";
    f->req.body = f->client;
    f->req.mode = PDGW_MODE_BATCH;
    f->req.dispatch = PDGW_DISPATCH_SERIAL;
    f->peers.prefill = &inst_p;
    f->peers.decode = &inst_d;
    memset(&e, 0, sizeof(e));
    assert_int_equal(f->d->ops->attempt_init(f->ctx, &f->req, &f->peers, &f->st, &e), PDGW_FWD_OK);
}

static void fx_close(fx_t *f)
{
    f->d->ops->attempt_cleanup(f->ctx, f->st, &f->req, PDGW_END_OK);
    f->d->ops->destroy(f->ctx);
    json_decref(f->client);
}

static pdgw_fwd_status_t fx_resp(fx_t *f, json_t *kvp)
{
    json_t *resp = json_pack("{s:s,s:o}", "id", "cmpl-x", "kv_transfer_params", kvp);
    pdgw_fwd_error_t e;
    pdgw_fwd_status_t st;
    memset(&e, 0, sizeof(e));
    st = f->d->ops->on_prefill_response(f->ctx, f->st, &f->req, 200, resp, &e);
    json_decref(resp);
    return st;
}

static unsigned fx_decode_failed(fx_t *f)
{
    pdgw_fwd_error_t e;
    memset(&e, 0, sizeof(e));
    e.phase = PDGW_PHASE_DECODE;
    e.retryable = 1;
    return f->d->ops->retry_scope(f->ctx, f->st, &f->req, &e);
}

/* The newest prefill answer (pull_scheduler.py request_finished on a prefill). */
static json_t *newest_params(void)
{
    return json_pack("{s:b,s:b,s:[[i,i]],s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:n,s:s}",
                     "do_remote_prefill", 1, "do_remote_decode", 0, "remote_block_ids", 4, 5,
                     "remote_engine_id", "eng-p", "remote_request_id",
                     "cmpl-2b9f6a62-2a0e-4c4e-9f55-0f1c2d3e4f50-0-1a2b3c4d", "remote_host",
                     "10.0.0.1", "remote_port", 5603, "tp_size", 1, "dcp_size", 1, "pp_size", 1,
                     "remote_num_tokens", 30, "remote_blocks_expiry_time", "transfer_mode", "pull");
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void test_lease_default(void **state)
{
    fx_t f;
    (void)state;
    /* the default lease (30 s) holds: a failed decode is replaced, the prefill kept */
    fx_open(&f, "{}");
    assert_int_equal(fx_resp(&f, newest_params()), PDGW_FWD_OK);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_DECODE);
    fx_close(&f);
    /* a short lease runs out: the prefill must run again (the lease is not checked
     * before it ends: on a busy machine 20 ms can pass before the first look) */
    fx_open(&f, "{\"kv_lease_ms\":20}");
    assert_int_equal(fx_resp(&f, newest_params()), PDGW_FWD_OK);
    sleep_ms(40);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
    fx_close(&f);
}

static void test_lease_from_expiry_time(void **state)
{
    fx_t f;
    json_t *kvp;
    (void)state;
    /* a Unix-time expiry in the past wins over the (long) default */
    fx_open(&f, "{}");
    kvp = newest_params();
    json_object_set_new(kvp, "remote_blocks_expiry_time", json_real((double)time(NULL) - 5.0));
    assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_OK);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
    fx_close(&f);
    /* one in the future wins over a short default */
    fx_open(&f, "{\"kv_lease_ms\":1}");
    kvp = newest_params();
    json_object_set_new(kvp, "remote_blocks_expiry_time", json_real((double)time(NULL) + 60.0));
    assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_OK);
    sleep_ms(5);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_DECODE);
    fx_close(&f);
    /* a perf_counter() value (seconds of the engine's uptime) cannot be read: default */
    fx_open(&f, "{\"kv_lease_ms\":1}");
    kvp = newest_params();
    json_object_set_new(kvp, "remote_blocks_expiry_time", json_real(123456.5));
    assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_OK);
    sleep_ms(5);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
    fx_close(&f);
}

static void test_unusable_params(void **state)
{
    static const char *const drop[] = {"remote_block_ids", "remote_engine_id", "remote_request_id",
                                       "remote_host", "remote_port"};
    fx_t f;
    (void)state;
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) {
        json_t *kvp = newest_params();
        pdgw_fwd_leg_t leg;
        pdgw_fwd_error_t e;
        fx_open(&f, "{}");
        json_object_del(kvp, drop[i]);
        assert_int_equal(fx_resp(&f, json_incref(kvp)), PDGW_FWD_OK);
        /* passed on verbatim: the decode decides (and recomputes) */
        memset(&leg, 0, sizeof(leg));
        memset(&e, 0, sizeof(e));
        assert_int_equal(
            f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_DECODE, &f.peers, &leg, &e),
            PDGW_FWD_OK);
        assert_true(json_equal(json_object_get(leg.body, "kv_transfer_params"), kvp));
        json_decref(leg.body);
        /* nothing is held on the prefill: a decode retry re-runs it */
        assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
        json_decref(kvp);
        fx_close(&f);
    }
    /* empty block lists: the decode would not pull */
    fx_open(&f, "{\"missing_kv_params\":\"fail\"}");
    {
        json_t *kvp = newest_params();
        json_object_set_new(kvp, "remote_block_ids", json_array());
        assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_ERR);
    }
    fx_close(&f);
}

/* Presence, not value: the decode tests `p in params` for the four keys and the truth of
 * remote_block_ids (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py,
 * update_state_after_alloc), so a key sent as null is usable as far as that test goes, and
 * null or empty block ids are not. */
static void test_null_counts_as_present(void **state)
{
    static const char *const keys[] = {"remote_engine_id", "remote_request_id", "remote_host",
                                       "remote_port"};
    fx_t f;
    (void)state;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *kvp = newest_params();
        fx_open(&f, "{\"missing_kv_params\":\"fail\"}");
        json_object_set_new(kvp, keys[i], json_null());
        assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_OK);
        /* usable params: the prefill holds them, a decode retry keeps it */
        assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_DECODE);
        fx_close(&f);
    }
    {
        json_t *kvp = newest_params();
        fx_open(&f, "{\"missing_kv_params\":\"fail\"}");
        json_object_set_new(kvp, "remote_block_ids", json_null());
        assert_int_equal(fx_resp(&f, kvp), PDGW_FWD_ERR);
        fx_close(&f);
    }
}

/* NixlPushConnector's prefill answer (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
 * push_scheduler.py request_finished: the same remote_* keys, transfer_mode "push"): usable,
 * passed on unchanged, and a decode-only retry keeps the prefill (the new decode registers
 * under the same request id; push_worker.py matches by it). */
static void test_push_mode_params(void **state)
{
    fx_t f;
    json_t *kvp = newest_params();
    pdgw_fwd_leg_t leg;
    pdgw_fwd_error_t e;
    (void)state;
    json_object_set_new(kvp, "transfer_mode", json_string("push"));
    fx_open(&f, "{\"missing_kv_params\":\"fail\"}");
    assert_int_equal(fx_resp(&f, json_incref(kvp)), PDGW_FWD_OK);
    assert_int_equal(fx_decode_failed(&f), PDGW_REPICK_DECODE);
    memset(&leg, 0, sizeof(leg));
    memset(&e, 0, sizeof(e));
    assert_int_equal(f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_DECODE, &f.peers, &leg, &e),
                     PDGW_FWD_OK);
    assert_true(json_equal(json_object_get(leg.body, "kv_transfer_params"), kvp));
    json_decref(leg.body);
    json_decref(kvp);
    fx_close(&f);
}

static void test_dp_rank_header(void **state)
{
    fx_t f;
    pdgw_fwd_leg_t leg;
    pdgw_fwd_error_t e;
    (void)state;
    fx_open(&f, "{}");
    memset(&leg, 0, sizeof(leg));
    memset(&e, 0, sizeof(e));
    assert_int_equal(f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_PREFILL, &f.peers, &leg, &e),
                     PDGW_FWD_OK);
    assert_int_equal(leg.n_headers, 1);
    assert_string_equal(leg.headers[0], "X-data-parallel-rank: 3");
    json_decref(leg.body);
    /* the decode instance has no DP: no header */
    assert_int_equal(fx_resp(&f, newest_params()), PDGW_FWD_OK);
    memset(&leg, 0, sizeof(leg));
    assert_int_equal(f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_DECODE, &f.peers, &leg, &e),
                     PDGW_FWD_OK);
    assert_int_equal(leg.n_headers, 0);
    json_decref(leg.body);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lease_default),    cmocka_unit_test(test_lease_from_expiry_time),
        cmocka_unit_test(test_unusable_params),  cmocka_unit_test(test_null_counts_as_present),
        cmocka_unit_test(test_push_mode_params), cmocka_unit_test(test_dp_rank_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
