/*
 * test_fwd_pd_bodies.c - the PD forwarders' leg bodies, field by field (docs/protocols/),
 * built through each registered forwarder's ops from one fixed client body and
 * fixed prefill/decode instances; plus options, plans, retry scopes and error paths.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdgw_registry.h"

int64_t fwd_sglang_room(int64_t random63, int dp_rank, int dp_size);

static const int d_alloc[] = {7400, 7401};
static const int d_init[] = {7300, 7301};

static const pdgw_instance_t inst_p = {.id = "p0",
                                       .url = "http://10.0.0.1:8100",
                                       .host = "10.0.0.1",
                                       .port = 8100,
                                       .role = PDGW_FWD_ROLE_PREFILL,
                                       .zone = "",
                                       .kv_host = "10.0.1.1",
                                       .kv_port = 28000,
                                       .bootstrap_port = 8998,
                                       .engine_id = "eng-p0",
                                       .tp_size = 1,
                                       .dp_size = 1,
                                       .weight = 1};
static const pdgw_instance_t inst_d = {.id = "d0",
                                       .url = "http://10.0.0.2:8200",
                                       .host = "10.0.0.2",
                                       .port = 8200,
                                       .role = PDGW_FWD_ROLE_DECODE,
                                       .zone = "",
                                       .kv_host = "10.0.1.2",
                                       .engine_id = "eng-d0",
                                       .alloc_ports = d_alloc,
                                       .n_alloc_ports = 2,
                                       .init_ports = d_init,
                                       .n_init_ports = 2,
                                       .tp_size = 2,
                                       .dp_rank = 1,
                                       .dp_size = 4,
                                       .weight = 1};

#define CLIENT_BODY                                                                                \
    "{\"model\":\"m\",\"prompt\":\"hello world\",\"max_tokens\":8,\"stream\":true,"                \
    "\"stream_options\":{\"include_usage\":true},\"stop\":[\"x\"],\"stop_token_ids\":[7],"         \
    "\"min_tokens\":2,\"temperature\":0.5}"

/* The hardened prefill copy of CLIENT_BODY (A.1), before kv_transfer_params. */
#define PREFILL_BODY                                                                               \
    "{\"model\":\"m\",\"prompt\":\"hello world\",\"max_tokens\":1,\"stream\":false,"               \
    "\"temperature\":0.5,\"ignore_eos\":true}"

typedef struct fx {
    const pdgw_fwd_desc_t *d;
    void *ctx;
    void *st;
    json_t *client;
    pdgw_fwd_request_t req;
    pdgw_fwd_peers_t peers;
    pdgw_fwd_plan_t plan;
} fx_t;

static void fx_open(fx_t *f, const char *name, const char *opts_json, pdgw_mode_t mode)
{
    json_t *opts = json_loads(opts_json, 0, NULL);
    pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, name, mode, 1, 0, NULL};
    char err[256] = "";
    pdgw_fwd_error_t e;
    memset(f, 0, sizeof(*f));
    f->d = pdgw_registry_find(name);
    assert_non_null(f->d);
    assert_non_null(opts);
    if (f->d->ops->configure)
        assert_int_equal(f->d->ops->configure(opts, &env, &f->ctx, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    assert_int_equal(f->d->ops->plan(f->ctx, mode, &f->plan, err, sizeof(err)), PDGW_FWD_OK);
    f->client = json_loads(CLIENT_BODY, 0, NULL);
    assert_non_null(f->client);
    f->req.request_id = "rid-1";
    f->req.path = "/v1/completions";
    f->req.body = f->client;
    f->req.stream = 1;
    f->req.mode = mode;
    f->req.dispatch = f->plan.dispatch;
    f->req.model = "m";
    f->req.prompt_tokens = 600;
    f->req.max_tokens = 8;
    f->peers.prefill = &inst_p;
    f->peers.decode =
        mode == PDGW_MODE_STAGED && f->plan.dispatch == PDGW_DISPATCH_SERIAL ? NULL : &inst_d;
    memset(&e, 0, sizeof(e));
    if (f->d->ops->attempt_init)
        assert_int_equal(f->d->ops->attempt_init(f->ctx, &f->req, &f->peers, &f->st, &e),
                         PDGW_FWD_OK);
}

static void fx_close(fx_t *f, pdgw_end_reason_t reason)
{
    if (f->d->ops->attempt_cleanup)
        f->d->ops->attempt_cleanup(f->ctx, f->st, &f->req, reason);
    if (f->d->ops->destroy)
        f->d->ops->destroy(f->ctx);
    json_decref(f->client);
}

/* Build one leg and compare it with <want_json> (the whole body). */
static void fx_leg(fx_t *f, pdgw_leg_kind_t kind, const char *want_json)
{
    pdgw_fwd_leg_t leg;
    pdgw_fwd_error_t e;
    json_t *want = json_loads(want_json, 0, NULL);
    memset(&leg, 0, sizeof(leg));
    memset(&e, 0, sizeof(e));
    assert_non_null(want);
    if (kind == PDGW_LEG_DECODE)
        f->peers.decode = &inst_d;
    assert_int_equal(f->d->ops->build_leg(f->ctx, f->st, &f->req, kind, &f->peers, &leg, &e),
                     PDGW_FWD_OK);
    assert_non_null(leg.body);
    if (!json_equal(leg.body, want)) {
        char *got = json_dumps(leg.body, JSON_SORT_KEYS);
        char *exp = json_dumps(want, JSON_SORT_KEYS);
        print_error("got  %s\nwant %s\n", got, exp);
        free(got);
        free(exp);
        fail();
    }
    json_decref(leg.body);
    json_decref(want);
}

static pdgw_fwd_status_t fx_prefill_resp(fx_t *f, const char *resp_json, pdgw_fwd_error_t *e)
{
    json_t *resp = json_loads(resp_json, 0, NULL);
    pdgw_fwd_status_t st;
    memset(e, 0, sizeof(*e));
    assert_non_null(resp);
    st = f->d->ops->on_prefill_response
             ? f->d->ops->on_prefill_response(f->ctx, f->st, &f->req, 200, resp, e)
             : PDGW_FWD_OK;
    json_decref(resp);
    return st;
}

/* CLIENT_BODY with kv_transfer_params appended (decode legs). */
static char *decode_with(const char *kvp)
{
    static char buf[1024];
    if (kvp == NULL)
        return (char *)CLIENT_BODY;
    snprintf(buf, sizeof(buf), "%.*s,\"kv_transfer_params\":%s}", (int)strlen(CLIENT_BODY) - 1,
             CLIENT_BODY, kvp);
    return buf;
}

static char *prefill_with(const char *kvp)
{
    static char buf[1024];
    snprintf(buf, sizeof(buf), "%.*s,\"kv_transfer_params\":%s}", (int)strlen(PREFILL_BODY) - 1,
             PREFILL_BODY, kvp);
    return buf;
}

#define NIXL_PREFILL_KVP                                                                           \
    "{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"            \
    "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}"
#define NIXL_RESP_KVP                                                                              \
    "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_block_ids\":[1,2,3],"         \
    "\"remote_engine_id\":\"eng-p0\",\"remote_request_id\":\"rid-1\",\"remote_host\":"             \
    "\"10.0.1.1\",\"remote_port\":5600,\"tp_size\":1}"

static void test_nixl(void **state)
{
    pdgw_mode_t modes[] = {PDGW_MODE_BATCH, PDGW_MODE_STAGED};
    pdgw_fwd_error_t e;
    size_t i;
    (void)state;
    for (i = 0; i < 2; i++) {
        fx_t f;
        fx_open(&f, "vllm-nixl", "{}", modes[i]);
        assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_SERIAL);
        fx_leg(&f, PDGW_LEG_PREFILL, prefill_with(NIXL_PREFILL_KVP));
        assert_int_equal(
            fx_prefill_resp(&f, "{\"id\":\"x\",\"kv_transfer_params\":" NIXL_RESP_KVP "}", &e),
            PDGW_FWD_OK);
        fx_leg(&f, PDGW_LEG_DECODE, decode_with(NIXL_RESP_KVP)); /* copied verbatim */
        /* decode failure: a new decode reuses the same prefill's params */
        e.phase = PDGW_PHASE_DECODE;
        assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e), PDGW_REPICK_DECODE);
        e.phase = PDGW_PHASE_PREFILL;
        assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e), PDGW_REPICK_PREFILL);
        fx_close(&f, PDGW_END_OK);
    }
}

static void test_nixl_missing_and_bad_params(void **state)
{
    pdgw_fwd_error_t e;
    fx_t f;
    (void)state;
    /* default: no params -> the decode recomputes (no kv_transfer_params on the decode leg) */
    fx_open(&f, "vllm-nixl", "{}", PDGW_MODE_BATCH);
    assert_int_equal(fx_prefill_resp(&f, "{\"kv_transfer_params\":null}", &e), PDGW_FWD_OK);
    fx_leg(&f, PDGW_LEG_DECODE, decode_with(NULL));
    fx_close(&f, PDGW_END_FAILED);
    /* incomplete params (vLLM's decode would recompute, nixl/pull_scheduler.py): passed on
     * verbatim as vLLM's proxy does; a decode retry re-runs the prefill (nothing is held) */
    fx_open(&f, "vllm-nixl", "{}", PDGW_MODE_BATCH);
    assert_int_equal(fx_prefill_resp(&f,
                                     "{\"kv_transfer_params\":{\"remote_block_ids\":[1],"
                                     "\"remote_engine_id\":\"e\",\"remote_port\":1}}",
                                     &e),
                     PDGW_FWD_OK);
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"remote_block_ids\":[1],\"remote_engine_id\":\"e\",\"remote_port\":1}"));
    e.phase = PDGW_PHASE_DECODE;
    assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e),
                     PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
    fx_close(&f, PDGW_END_FAILED);
    /* ... and with missing_kv_params: fail, a retryable kv_transfer failure naming the field */
    fx_open(&f, "vllm-nixl", "{\"missing_kv_params\":\"fail\"}", PDGW_MODE_BATCH);
    assert_int_equal(fx_prefill_resp(&f,
                                     "{\"kv_transfer_params\":{\"remote_block_ids\":[[]],"
                                     "\"remote_engine_id\":\"e\",\"remote_request_id\":\"r\","
                                     "\"remote_port\":1}}",
                                     &e),
                     PDGW_FWD_ERR);
    assert_int_equal(e.phase, PDGW_PHASE_KV_TRANSFER);
    assert_true(e.retryable);
    assert_non_null(strstr(e.message, "remote_host"));
    fx_close(&f, PDGW_END_FAILED);
    /* missing_kv_params: fail */
    fx_open(&f, "vllm-nixl", "{\"missing_kv_params\":\"fail\"}", PDGW_MODE_BATCH);
    assert_int_equal(fx_prefill_resp(&f, "{\"choices\":[]}", &e), PDGW_FWD_ERR);
    assert_int_equal(e.phase, PDGW_PHASE_KV_TRANSFER);
    fx_close(&f, PDGW_END_FAILED);
}

static void test_options_refused(void **state)
{
    const char *names[] = {"vllm-nixl", "vllm-mooncake", "vllm-kvt", "lmcache"};
    size_t i;
    (void)state;
    for (i = 0; i < 4; i++) {
        const pdgw_fwd_desc_t *d = pdgw_registry_find(names[i]);
        json_t *opts = json_pack("{s:i}", "no_such_key", 1);
        pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, names[i], PDGW_MODE_BATCH, 1, 0, NULL};
        char err[256] = "";
        void *ctx = NULL;
        assert_non_null(d);
        assert_int_equal(d->ops->configure(opts, &env, &ctx, err, sizeof(err)),
                         PDGW_FWD_ERR_CONFIG);
        assert_non_null(strstr(err, "no_such_key"));
        json_decref(opts);
    }
    {
        const pdgw_fwd_desc_t *d = pdgw_registry_find("vllm-mooncake");
        json_t *opts = json_pack("{s:s}", "mooncake_dispatch", "sideways");
        pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, "vllm-mooncake", PDGW_MODE_BATCH, 1, 0, NULL};
        char err[256] = "";
        void *ctx = NULL;
        assert_int_equal(d->ops->configure(opts, &env, &ctx, err, sizeof(err)),
                         PDGW_FWD_ERR_CONFIG);
        assert_non_null(strstr(err, "mooncake_dispatch"));
        json_decref(opts);
    }
}

static void test_mooncake_serial(void **state)
{
    pdgw_fwd_error_t e;
    fx_t f;
    (void)state;
    fx_open(&f, "vllm-mooncake", "{\"mooncake_dispatch\":\"serial\"}", PDGW_MODE_STAGED);
    assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_SERIAL);
    fx_leg(&f, PDGW_LEG_PREFILL, prefill_with(NIXL_PREFILL_KVP));
    assert_int_equal(fx_prefill_resp(&f,
                                     "{\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                                     "\"do_remote_decode\":false,\"remote_host\":\"10.0.1.1\","
                                     "\"remote_port\":17000,\"extra\":[1]}}",
                                     &e),
                     PDGW_FWD_OK);
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_host\":"
                       "\"10.0.1.1\",\"remote_port\":17000,\"extra\":[1]}"));
    fx_close(&f, PDGW_END_OK);
}

static void test_mooncake_parallel(void **state)
{
    pdgw_fwd_error_t e;
    pdgw_mode_t modes[] = {PDGW_MODE_BATCH, PDGW_MODE_STAGED};
    size_t i;
    (void)state;
    for (i = 0; i < 2; i++) {
        fx_t f;
        /* parallel is the default; the engine id from config (no bootstrap server here) */
        fx_open(&f, "vllm-mooncake", "{\"mooncake_engine_id\":\"config\"}", modes[i]);
        assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_PARALLEL);
        fx_leg(&f, PDGW_LEG_PREFILL,
               prefill_with("{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                            "\"transfer_id\":\"xfer-rid-1\"}"));
        fx_leg(&f, PDGW_LEG_DECODE,
               decode_with("{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                           "\"remote_bootstrap_addr\":\"http://10.0.0.1:8998\","
                           "\"remote_engine_id\":\"eng-p0\",\"transfer_id\":\"xfer-rid-1\"}"));
        assert_int_equal(fx_prefill_resp(&f, "{\"kv_transfer_params\":null}", &e), PDGW_FWD_OK);
        e.phase = PDGW_PHASE_DECODE;
        assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e), PDGW_REPICK_DECODE);
        e.phase = PDGW_PHASE_PREFILL;
        assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e),
                         PDGW_REPICK_PREFILL | PDGW_REPICK_DECODE);
        fx_close(&f, PDGW_END_OK);
    }
}

/* mooncake_engine_id config: a prefill without engine_id cannot be named to the decode (the
 * attempt is refused instead of sending remote_engine_id ""); a prefill without a bootstrap
 * port is named with vLLM's default 8998. */
static void test_mooncake_parallel_needs_prefill_ids(void **state)
{
    pdgw_instance_t no_engine = inst_p, no_port = inst_p;
    pdgw_fwd_peers_t peers = {&no_engine, &inst_d};
    pdgw_fwd_error_t e;
    void *st = NULL;
    fx_t f;
    (void)state;
    no_engine.engine_id = "";
    no_port.bootstrap_port = 0;
    fx_open(&f, "vllm-mooncake", "{\"mooncake_engine_id\":\"config\"}", PDGW_MODE_BATCH);
    memset(&e, 0, sizeof(e));
    assert_int_equal(f.d->ops->attempt_init(f.ctx, &f.req, &peers, &st, &e), PDGW_FWD_ERR);
    assert_null(st);
    assert_int_equal(e.phase, PDGW_PHASE_PREFILL);
    assert_non_null(strstr(e.message, "engine_id"));
    fx_close(&f, PDGW_END_FAILED);

    fx_open(&f, "vllm-mooncake", "{\"mooncake_engine_id\":\"config\"}", PDGW_MODE_BATCH);
    f.d->ops->attempt_cleanup(f.ctx, f.st, &f.req, PDGW_END_FAILED);
    f.st = NULL;
    f.peers.prefill = &no_port;
    assert_int_equal(f.d->ops->attempt_init(f.ctx, &f.req, &f.peers, &f.st, &e), PDGW_FWD_OK);
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                       "\"remote_bootstrap_addr\":\"http://10.0.0.1:8998\","
                       "\"remote_engine_id\":\"eng-p0\",\"transfer_id\":\"xfer-rid-1\"}"));
    fx_close(&f, PDGW_END_OK);
}

static void test_mooncake_parallel_old_fields(void **state)
{
    fx_t f;
    (void)state;
    fx_open(&f, "vllm-mooncake",
            "{\"mooncake_engine_id\":\"config\",\"mooncake_bootstrap_fields\":\"host_port\"}",
            PDGW_MODE_BATCH);
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                       "\"bootstrap_server_host\":\"10.0.0.1\",\"bootstrap_server_port\":8998,"
                       "\"remote_engine_id\":\"eng-p0\",\"transfer_id\":\"xfer-rid-1\"}"));
    fx_close(&f, PDGW_END_OK);
}

static void test_kvt(void **state)
{
    fx_t f;
    pdgw_fwd_error_t e;
    (void)state;
    /* batch: single-stage, only the decode leg, with the prefill's KV side channel */
    fx_open(&f, "vllm-kvt", "{\"reserve\":false}", PDGW_MODE_BATCH);
    assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_SINGLE);
    assert_int_equal(f.plan.single_role, PDGW_FWD_ROLE_DECODE);
    assert_true(f.plan.single_needs_prefill);
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"remote_host\":\"10.0.1.1\",\"remote_port\":28000}"));
    memset(&e, 0, sizeof(e));
    assert_int_equal(f.d->ops->gate(f.ctx, f.st, &f.req, PDGW_GATE_BEFORE_PREFILL, &e),
                     PDGW_FWD_OK);
    fx_close(&f, PDGW_END_OK);
    /* staged: serial */
    fx_open(&f, "vllm-kvt", "{}", PDGW_MODE_STAGED);
    assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_SERIAL);
    fx_leg(&f, PDGW_LEG_PREFILL, prefill_with("{\"do_remote_decode\":true}"));
    fx_leg(&f, PDGW_LEG_DECODE,
           decode_with("{\"do_remote_prefill\":true,\"remote_host\":\"10.0.1.1\","
                       "\"remote_port\":28000}"));
    e.phase = PDGW_PHASE_DECODE;
    assert_int_equal(f.d->ops->retry_scope(f.ctx, f.st, &f.req, &e), PDGW_REPICK_DECODE);
    fx_close(&f, PDGW_END_OK);
}

static void test_sglang(void **state)
{
    pdgw_mode_t modes[] = {PDGW_MODE_BATCH, PDGW_MODE_STAGED};
    size_t i;
    (void)state;
    for (i = 0; i < 2; i++) {
        fx_t f;
        pdgw_fwd_leg_t pl, dl;
        pdgw_fwd_error_t e;
        json_t *room;
        fx_open(&f, "sglang", "{}", modes[i]);
        assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_PARALLEL);
        memset(&pl, 0, sizeof(pl));
        memset(&dl, 0, sizeof(dl));
        assert_int_equal(
            f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_PREFILL, &f.peers, &pl, &e),
            PDGW_FWD_OK);
        assert_int_equal(
            f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_DECODE, &f.peers, &dl, &e),
            PDGW_FWD_OK);
        room = json_object_get(dl.body, "bootstrap_room");
        assert_true(json_is_integer(room));
        assert_true(json_integer_value(room) >= 0);
        assert_true(json_equal(room, json_object_get(pl.body, "bootstrap_room")));
        /* the decode is DP rank 1 of 4: pinned with routed_dp_rank (sgl-model-gateway
         * pd_router.rs); the prefill has no DP, so nothing else is pinned */
        assert_int_equal(json_integer_value(json_object_get(dl.body, "routed_dp_rank")), 1);
        json_object_del(dl.body, "routed_dp_rank");
        /* everything else, field by field */
        json_object_del(pl.body, "bootstrap_room");
        json_object_del(dl.body, "bootstrap_room");
        {
            /* the prefill gets the client's sampling settings, as mini_lb.py sends both legs
             * the same body (SGLang's prefill samples the first token), only not streamed */
            json_t *wp = json_loads(CLIENT_BODY, 0, NULL);
            json_t *wd = json_loads(CLIENT_BODY, 0, NULL);
            json_object_set_new(wp, "stream", json_false());
            json_object_del(wp, "stream_options");
            json_object_set_new(wp, "bootstrap_host", json_string("10.0.0.1"));
            json_object_set_new(wp, "bootstrap_port", json_integer(8998));
            json_object_set_new(wd, "bootstrap_host", json_string("10.0.0.1"));
            json_object_set_new(wd, "bootstrap_port", json_integer(8998));
            assert_true(json_equal(pl.body, wp));
            assert_true(json_equal(dl.body, wd));
            json_decref(wp);
            json_decref(wd);
        }
        json_decref(pl.body);
        json_decref(dl.body);
        fx_close(&f, PDGW_END_OK);
    }
    /* dp-rank alignment */
    assert_int_equal(fwd_sglang_room(1000, 3, 8) % 8, 3);
    assert_int_equal(fwd_sglang_room(1003, 3, 8), 1003);
    assert_int_equal(fwd_sglang_room(INT64_MAX, 0, 1), INT64_MAX);
    assert_true(fwd_sglang_room(INT64_MAX, 6, 7) >= 0);
    assert_int_equal(fwd_sglang_room(INT64_MAX, 6, 7) % 7, 6);
}

/* A prefill without a bootstrap port and with DP (rank 2 of 3): bootstrap_port null on both
 * legs (mini_lb.py / pd_router.rs send None; the engine uses its own port), the room lands on
 * the prefill's rank, routed_dp_rank on the prefill leg, disagg_prefill_dp_rank (the prefill's)
 * and routed_dp_rank (the decode's) on the decode leg. */
static void test_sglang_prefill_dp_null_port(void **state)
{
    pdgw_instance_t p = inst_p;
    pdgw_fwd_leg_t pl, dl;
    pdgw_fwd_error_t e;
    fx_t f;
    (void)state;
    p.bootstrap_port = 0;
    p.dp_rank = 2;
    p.dp_size = 3;
    for (int n = 0; n < 50; n++) {
        fx_open(&f, "sglang", "{}", PDGW_MODE_BATCH);
        f.d->ops->attempt_cleanup(f.ctx, f.st, &f.req, PDGW_END_FAILED);
        f.st = NULL;
        f.peers.prefill = &p;
        assert_int_equal(f.d->ops->attempt_init(f.ctx, &f.req, &f.peers, &f.st, &e), PDGW_FWD_OK);
        memset(&pl, 0, sizeof(pl));
        memset(&dl, 0, sizeof(dl));
        assert_int_equal(
            f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_PREFILL, &f.peers, &pl, &e),
            PDGW_FWD_OK);
        assert_int_equal(
            f.d->ops->build_leg(f.ctx, f.st, &f.req, PDGW_LEG_DECODE, &f.peers, &dl, &e),
            PDGW_FWD_OK);
        assert_true(json_is_null(json_object_get(pl.body, "bootstrap_port")));
        assert_true(json_is_null(json_object_get(dl.body, "bootstrap_port")));
        assert_int_equal(json_integer_value(json_object_get(pl.body, "bootstrap_room")) % 3, 2);
        assert_int_equal(json_integer_value(json_object_get(pl.body, "routed_dp_rank")), 2);
        assert_null(json_object_get(pl.body, "disagg_prefill_dp_rank"));
        assert_int_equal(json_integer_value(json_object_get(dl.body, "disagg_prefill_dp_rank")), 2);
        assert_int_equal(json_integer_value(json_object_get(dl.body, "routed_dp_rank")), 1);
        json_decref(pl.body);
        json_decref(dl.body);
        fx_close(&f, PDGW_END_OK);
    }
}

static void test_lmcache(void **state)
{
    fx_t f;
    pdgw_fwd_error_t e;
    char err[256] = "";
    pdgw_fwd_plan_t plan;
    (void)state;
    fx_open(&f, "lmcache",
            "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"reserve\":false,"
            "\"notif_timeout_ms\":50,\"admission_chunks\":0,\"flow\":\"client_body\"}",
            PDGW_MODE_BATCH);
    assert_int_equal(f.plan.dispatch, PDGW_DISPATCH_SERIAL);
    memset(&plan, 0, sizeof(plan));
    assert_int_equal(f.d->ops->plan(f.ctx, PDGW_MODE_STAGED, &plan, err, sizeof(err)),
                     PDGW_FWD_ERR_CONFIG);
    fx_leg(
        &f, PDGW_LEG_PREFILL,
        prefill_with("{\"disagg_spec\":{\"req_id\":\"rid-1\",\"receiver_host\":\"10.0.1.2\","
                     "\"receiver_init_port\":[7300,7301],\"receiver_alloc_port\":[7400,7401]}}"));
    fx_leg(&f, PDGW_LEG_DECODE, decode_with(NULL));
    memset(&e, 0, sizeof(e));
    assert_int_equal(f.d->ops->gate(f.ctx, f.st, &f.req, PDGW_GATE_BEFORE_PREFILL, &e),
                     PDGW_FWD_OK);
    /* no ProxyNotif ever comes: pending, then a clear kv_transfer error at the deadline */
    assert_int_equal(f.d->ops->gate(f.ctx, f.st, &f.req, PDGW_GATE_BEFORE_DECODE, &e),
                     PDGW_FWD_PENDING);
    {
        int i;
        pdgw_fwd_status_t st = PDGW_FWD_PENDING;
        for (i = 0; i < 200 && st == PDGW_FWD_PENDING; i++) {
            usleep(5000);
            st = f.d->ops->gate(f.ctx, f.st, &f.req, PDGW_GATE_BEFORE_DECODE, &e);
        }
        assert_int_equal(st, PDGW_FWD_ERR);
    }
    assert_int_equal(e.phase, PDGW_PHASE_KV_TRANSFER);
    assert_int_equal(e.http_status, 504);
    assert_non_null(strstr(e.message, "ProxyNotif{req_id=rid-1} arrived from 0 of 2 TP ranks"));
    fx_close(&f, PDGW_END_TIMEOUT);
}

/* Weighted admission (docs/protocols/lmcache.md): ceil(prompt_tokens / chunk_tokens) slots each, FIFO. */
static void test_lmcache_admission(void **state)
{
    const pdgw_fwd_desc_t *d = pdgw_registry_find("lmcache");
    json_t *opts = json_loads("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"reserve\":false,"
                              "\"chunk_tokens\":100,\"admission_chunks\":4}",
                              0, NULL);
    pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, "lmcache", PDGW_MODE_BATCH, 1, 0, NULL};
    pdgw_fwd_peers_t peers = {&inst_p, &inst_d};
    pdgw_fwd_request_t ra, rb, rc, rd, rbig, rfull;
    void *ctx = NULL, *sa = NULL, *sb = NULL, *sc = NULL, *sd = NULL, *sbig = NULL, *sfull = NULL;
    pdgw_fwd_error_t e;
    char err[256];
    (void)state;
    assert_int_equal(d->ops->configure(opts, &env, &ctx, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    memset(&ra, 0, sizeof(ra));
    ra.request_id = "a";
    ra.mode = PDGW_MODE_BATCH;
    ra.prompt_tokens = 300; /* 3 slots */
    rb = ra;
    rb.request_id = "b";
    rb.prompt_tokens = 101; /* 2 slots */
    rc = ra;
    rc.request_id = "c";
    rc.prompt_tokens = 1; /* 1 slot: fits now, but must not overtake b */
    rbig = ra;
    rbig.request_id = "big";
    rbig.prompt_tokens = 401; /* 5 slots > capacity: fails at once */
    memset(&e, 0, sizeof(e));
    assert_int_equal(d->ops->attempt_init(ctx, &ra, &peers, &sa, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->attempt_init(ctx, &rb, &peers, &sb, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->attempt_init(ctx, &rc, &peers, &sc, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->attempt_init(ctx, &rbig, &peers, &sbig, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->gate(ctx, sa, &ra, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->gate(ctx, sb, &rb, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_PENDING);
    assert_int_equal(d->ops->gate(ctx, sc, &rc, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_PENDING);
    assert_int_equal(d->ops->gate(ctx, sb, &rb, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_PENDING);
    assert_int_equal(d->ops->gate(ctx, sbig, &rbig, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_ERR);
    assert_int_equal(e.http_status, 400);
    assert_non_null(strstr(e.message, "admission capacity"));
    d->ops->attempt_cleanup(ctx, sbig, &rbig, PDGW_END_FAILED);
    /* a ends: b (2) and then c (1) are admitted in order: 3 of 4 slots */
    d->ops->attempt_cleanup(ctx, sa, &ra, PDGW_END_OK);
    assert_int_equal(d->ops->gate(ctx, sb, &rb, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->gate(ctx, sc, &rc, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_OK);
    /* a cancelled waiter gives its place up: a (2 slots) waits for room, d (1 slot,
     * which would fit) queues behind it; once a is cancelled d is admitted at once */
    assert_int_equal(d->ops->attempt_init(ctx, &ra, &peers, &sa, &e), PDGW_FWD_OK);
    ra.prompt_tokens = 200;
    assert_int_equal(d->ops->gate(ctx, sa, &ra, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_PENDING);
    rd = rc;
    rd.request_id = "d";
    assert_int_equal(d->ops->attempt_init(ctx, &rd, &peers, &sd, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->gate(ctx, sd, &rd, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_PENDING);
    d->ops->attempt_cleanup(ctx, sa, &ra, PDGW_END_CANCELLED);
    assert_int_equal(d->ops->gate(ctx, sd, &rd, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_OK);
    d->ops->attempt_cleanup(ctx, sb, &rb, PDGW_END_OK);
    d->ops->attempt_cleanup(ctx, sc, &rc, PDGW_END_OK);
    d->ops->attempt_cleanup(ctx, sd, &rd, PDGW_END_OK);
    /* ... and holds no slot: with everyone gone the whole capacity is free */
    rfull = ra;
    rfull.request_id = "full";
    rfull.prompt_tokens = 400; /* 4 slots = admission_chunks */
    assert_int_equal(d->ops->attempt_init(ctx, &rfull, &peers, &sfull, &e), PDGW_FWD_OK);
    assert_int_equal(d->ops->gate(ctx, sfull, &rfull, PDGW_GATE_BEFORE_PREFILL, &e), PDGW_FWD_OK);
    d->ops->attempt_cleanup(ctx, sfull, &rfull, PDGW_END_OK);
    d->ops->destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nixl),
        cmocka_unit_test(test_nixl_missing_and_bad_params),
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_mooncake_serial),
        cmocka_unit_test(test_mooncake_parallel_needs_prefill_ids),
        cmocka_unit_test(test_mooncake_parallel),
        cmocka_unit_test(test_mooncake_parallel_old_fields),
        cmocka_unit_test(test_kvt),
        cmocka_unit_test(test_sglang),
        cmocka_unit_test(test_sglang_prefill_dp_null_port),
        cmocka_unit_test(test_lmcache),
        cmocka_unit_test(test_lmcache_admission),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
