/*
 * test_registry.c - forwarder registry and plugin loading: built-in forwarders are
 * registered by their constructors, duplicates and bad descriptors are refused, a plugin
 * loads and its forwarder works through the ops table, a plugin built for another ABI
 * version or re-using a built-in name is refused with a clear error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_fwd_sdk.h"
#include "pdgw_fwd_setup.h"
#include "pdgw_log.h"
#include "pdgw_registry.h"

static pdgw_fwd_status_t dummy_build(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                     pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                     pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)state;
    (void)kind;
    (void)peers;
    (void)err;
    leg->body = pdgw_fwd_body_copy(req);
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t dummy_ops = {.build_leg = dummy_build};
static const pdgw_fwd_ops_t empty_ops = {.build_leg = NULL};

static void test_builtin_registered(void **state)
{
    const pdgw_fwd_desc_t *d = pdgw_registry_find("neutral");
    char names[256];
    (void)state;
    assert_non_null(d);
    assert_int_equal(d->abi_version, PDGW_FWD_ABI_VERSION);
    assert_int_equal(d->dispatch, PDGW_DISPATCH_SINGLE);
    assert_null(pdgw_registry_find("no-such-protocol"));
    pdgw_registry_names(names, sizeof(names));
    assert_non_null(strstr(names, "neutral"));
}

static void test_duplicates_and_bad_descriptors(void **state)
{
    static const pdgw_fwd_desc_t dup = {.abi_version = 3,
                                        .name = "neutral",
                                        .summary = "dup",
                                        .modes = PDGW_MODE_BATCH,
                                        .dispatch = PDGW_DISPATCH_SINGLE,
                                        .ops = &dummy_ops};
    static const pdgw_fwd_desc_t fresh = {.abi_version = 3,
                                          .name = "t-fresh",
                                          .summary = "fresh",
                                          .modes = PDGW_MODE_BATCH,
                                          .dispatch = PDGW_DISPATCH_SINGLE,
                                          .ops = &dummy_ops};
    static const pdgw_fwd_desc_t wrong_abi = {.abi_version = PDGW_FWD_ABI_VERSION + 1,
                                              .name = "t-abi",
                                              .summary = "abi",
                                              .modes = PDGW_MODE_BATCH,
                                              .dispatch = PDGW_DISPATCH_SINGLE,
                                              .ops = &dummy_ops};
    static const pdgw_fwd_desc_t no_build = {.abi_version = 3,
                                             .name = "t-nobuild",
                                             .summary = "nobuild",
                                             .modes = PDGW_MODE_BATCH,
                                             .dispatch = PDGW_DISPATCH_SINGLE,
                                             .ops = &empty_ops};
    const pdgw_fwd_desc_t *before = pdgw_registry_find("neutral");
    (void)state;
    assert_int_equal(pdgw_fwd_register(&dup), -1);
    /* The original stays. */
    assert_ptr_equal(pdgw_registry_find("neutral"), before);
    assert_int_equal(pdgw_fwd_register(&fresh), 0);
    assert_int_equal(pdgw_fwd_register(&fresh), -1);
    assert_int_equal(pdgw_fwd_register(&wrong_abi), -1);
    assert_null(pdgw_registry_find("t-abi"));
    assert_int_equal(pdgw_fwd_register(&no_build), -1);
    assert_int_equal(pdgw_fwd_register(NULL), -1);
    /* Five refusals are reported once each. */
    assert_int_equal(pdgw_registry_log(), 5);
    assert_int_equal(pdgw_registry_log(), 0);
}

/* A plugin built against ABI 1 (descriptor without client_fields) still registers, and the
 * gateway sees its descriptor completed with the default (no extra client fields). */
typedef struct {
    unsigned abi_version;
    const char *name, *summary;
    unsigned modes, dispatch;
    const pdgw_fwd_ops_t *ops;
} abi1_desc_t;

static void test_abi1_descriptor_loads(void **state)
{
    /* Followed in memory by a non-NULL pointer the gateway must not mistake for
     * client_fields. */
    static const struct {
        abi1_desc_t d;
        const char *const *junk;
    } old = {{1, "t-abi1", "abi 1", PDGW_MODE_BATCH, PDGW_DISPATCH_SINGLE, &dummy_ops},
             (const char *const *)&old};
    const pdgw_fwd_desc_t *d;
    (void)state;
    assert_int_equal(pdgw_fwd_register((const pdgw_fwd_desc_t *)(const void *)&old.d), 0);
    d = pdgw_registry_find("t-abi1");
    assert_non_null(d);
    assert_int_equal(d->abi_version, 1);
    assert_string_equal(d->summary, "abi 1");
    /* Its ops table is copied up to where ABI 1 ended; the later op reads as NULL. */
    assert_ptr_equal(d->ops->build_leg, dummy_ops.build_leg);
    assert_null(d->ops->rewrite_decode);
    assert_null(d->client_fields);
    (void)pdgw_registry_log();
}

/* A plugin built against ABI 2 (descriptor ending at client_fields) keeps loading and serves
 * no native paths, whatever follows its descriptor in memory. */
typedef struct {
    abi1_desc_t d1;
    const char *const *client_fields;
} abi2_desc_t;

/* Stands for whatever follows an ABI 2 ops table in memory. */
static json_t *junk_op(void *ctx, void *st, const pdgw_fwd_request_t *req, int sse,
                       const json_t *resp)
{
    (void)ctx;
    (void)st;
    (void)req;
    (void)sse;
    (void)resp;
    return NULL;
}

static void test_abi2_descriptor_loads(void **state)
{
    static const pdgw_fwd_ops_t junk_tail_ops = {.build_leg = dummy_build,
                                                 .rewrite_decode = junk_op};
    static const char *const fields[] = {"t_abi2_field", NULL};
    static const struct {
        abi2_desc_t d;
        const char *const *junk;
    } old = {
        {{2, "t-abi2", "abi 2", PDGW_MODE_BATCH, PDGW_DISPATCH_SINGLE, &junk_tail_ops}, fields},
        (const char *const *)&old};
    const pdgw_fwd_desc_t *d;
    (void)state;
    assert_int_equal(pdgw_fwd_register((const pdgw_fwd_desc_t *)(const void *)&old.d), 0);
    d = pdgw_registry_find("t-abi2");
    assert_non_null(d);
    assert_int_equal(d->abi_version, 2);
    assert_ptr_equal(d->client_fields, fields);
    assert_null(d->native_paths);
    assert_ptr_equal(d->ops->build_leg, dummy_build);
    assert_null(d->ops->rewrite_decode);
    assert_null(d->ops->check_instance);
    (void)pdgw_registry_log();
}

/* An ABI 4 context and its option table (forwarder.h, option tables). */
typedef struct t4_ctx {
    int64_t chunk;
    int flag;
    char host[16];
    int mode;
} t4_ctx_t;
static const char *const t4_modes[] = {"a", "b", NULL};
static const pdgw_fwd_option_t t4_options[] = {
    PDGW_FWD_OPT_INT(t4_ctx_t, chunk, 256, 1, 1024, "chunk"),
    PDGW_FWD_OPT_BOOL(t4_ctx_t, flag, 1, "flag"),
    PDGW_FWD_OPT_STR(t4_ctx_t, host, "localhost", "host"),
    PDGW_FWD_OPT_ENUM(t4_ctx_t, mode, t4_modes, 0, "mode"),
    PDGW_FWD_OPT_END,
};

static void test_abi4_sizes_tables_and_arena(void **state)
{
    /* ops_size covers build_leg only: what lies beyond it in the plugin's table is not read */
    static const pdgw_fwd_ops_t ops = {.build_leg = dummy_build, .rewrite_decode = junk_op};
    static const pdgw_fwd_desc_t d4 = {.abi_version = PDGW_FWD_ABI_VERSION,
                                       .struct_size = sizeof(pdgw_fwd_desc_t),
                                       .ops_size =
                                           offsetof(pdgw_fwd_ops_t, build_leg) + sizeof(void *),
                                       .name = "t-abi4",
                                       .modes = PDGW_MODE_BATCH,
                                       .dispatch = PDGW_DISPATCH_SINGLE,
                                       .ops = &ops,
                                       .ctx_size = sizeof(t4_ctx_t),
                                       .options = t4_options,
                                       .state_size = 24};
    static const pdgw_fwd_desc_t nosize = {.abi_version = PDGW_FWD_ABI_VERSION,
                                           .name = "t-abi4-nosize",
                                           .modes = PDGW_MODE_BATCH,
                                           .dispatch = PDGW_DISPATCH_SINGLE,
                                           .ops = &dummy_ops};
    pdgw_fwd_env_t env = {PDGW_FWD_ABI_VERSION, "t-abi4", PDGW_MODE_BATCH, 1, 0, NULL};
    pdgw_fwd_request_t req;
    const pdgw_fwd_desc_t *d;
    t4_ctx_t *c = NULL;
    char err[256] = "";
    void *st = NULL;
    json_t *opts;
    (void)state;

    assert_int_equal(pdgw_fwd_register(&nosize), -1);
    assert_null(pdgw_registry_find("t-abi4-nosize"));
    assert_int_equal(pdgw_fwd_register(&d4), 0);
    d = pdgw_registry_find("t-abi4");
    assert_non_null(d);
    assert_null(d->ops->rewrite_decode);
    /* the option table stands for configure and destroy */
    assert_non_null(d->ops->configure);
    assert_non_null(d->ops->destroy);
    opts = json_pack("{s:i,s:b,s:s}", "chunk", 512, "flag", 0, "mode", "b");
    assert_int_equal(d->ops->configure(opts, &env, (void **)&c, err, sizeof(err)), PDGW_FWD_OK);
    assert_int_equal(c->chunk, 512);
    assert_int_equal(c->flag, 0);
    assert_string_equal(c->host, "localhost");
    assert_int_equal(c->mode, 1);
    d->ops->destroy(c);
    json_object_set_new(opts, "chunk", json_integer(4096));
    assert_int_equal(d->ops->configure(opts, &env, (void **)&c, err, sizeof(err)),
                     PDGW_FWD_ERR_CONFIG);
    assert_non_null(strstr(err, "'chunk'"));
    json_object_set_new(opts, "nope", json_true());
    assert_int_equal(d->ops->configure(opts, &env, (void **)&c, err, sizeof(err)),
                     PDGW_FWD_ERR_CONFIG);
    assert_non_null(strstr(err, "unknown protocol option 'nope'"));
    json_decref(opts);

    /* the attempt arena: zeroed state, memory and JSON released at the end */
    memset(&req, 0, sizeof(req));
    assert_int_equal(pdgw_fwd_attempt_begin(d, &req, &st), PDGW_OK);
    assert_non_null(st);
    assert_int_equal(((char *)st)[23], 0);
    char *big = pdgw_fwd_alloc(&req, 10000);
    assert_non_null(big);
    big[9999] = 'x';
    assert_string_equal(pdgw_fwd_strdup(&req, "kept"), "kept");
    assert_non_null(pdgw_fwd_keep(&req, json_string("released at the end")));
    pdgw_fwd_attempt_end(&req);
    assert_null(req.arena);
    assert_null(pdgw_fwd_alloc(&req, 8));
}

/* Protocol attributes: the instance's attrs map first, then the built-in fields by name. */
static void test_instance_attrs(void **state)
{
    pdgw_instance_t inst;
    char v[64];
    (void)state;

    memset(&inst, 0, sizeof(inst));
    inst.kv_port = 7100;
    inst.engine_id = "e-1";
    inst.kv_host = "";
    inst.alloc_ports = (const int[]){8001, 8002};
    inst.n_alloc_ports = 2;
    inst.attrs = "trt_port=9000\nbootstrap_port=1234\nname=a=b\n";
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "trt_port", v, sizeof(v)), 1);
    assert_string_equal(v, "9000");
    assert_int_equal(pdgw_fwd_instance_attr_int(&inst, "trt_port", -1), 9000);
    /* attrs win over the built-in field of the same name */
    assert_int_equal(pdgw_fwd_instance_attr_int(&inst, "bootstrap_port", -1), 1234);
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "name", v, sizeof(v)), 1);
    assert_string_equal(v, "a=b");
    assert_int_equal(pdgw_fwd_instance_attr_int(&inst, "kv_port", -1), 7100);
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "engine_id", v, sizeof(v)), 1);
    assert_string_equal(v, "e-1");
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "alloc_ports", v, sizeof(v)), 1);
    assert_string_equal(v, "8001,8002");
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "kv_host", v, sizeof(v)), 0);
    assert_int_equal(pdgw_fwd_instance_attr(&inst, "trt", v, sizeof(v)), 0);
    assert_int_equal(pdgw_fwd_instance_attr_int(&inst, "name", 5), 5);
    inst.attrs = NULL;
    assert_int_equal(pdgw_fwd_instance_attr_int(&inst, "trt_port", -1), -1);
}

/* Declared instance attributes: an undeclared key or a value of the wrong type is refused by
 * the instance check (start-up, --check-config, reloads) with the key named; a protocol that
 * declares none refuses every one; a descriptor without a table accepts any (older plugins). */
static void test_declared_instance_attrs(void **state)
{
    static const pdgw_fwd_attr_t attrs[] = {
        PDGW_FWD_ATTR_INT("trt_port", 1, 65535, "side channel"),
        PDGW_FWD_ATTR_STR("mode", "fast or slow"),
        PDGW_FWD_ATTR_END,
    };
    static const pdgw_fwd_desc_t typed = {PDGW_FWD_DESC_HEADER,
                                          .name = "t-attrs",
                                          .summary = "attrs",
                                          .modes = PDGW_MODE_BATCH,
                                          .dispatch = PDGW_DISPATCH_SINGLE,
                                          .ops = &dummy_ops,
                                          .instance_attrs = attrs};
    static const pdgw_fwd_desc_t untyped = {PDGW_FWD_DESC_HEADER,
                                            .name = "t-attrs-any",
                                            .summary = "attrs",
                                            .modes = PDGW_MODE_BATCH,
                                            .dispatch = PDGW_DISPATCH_SINGLE,
                                            .ops = &dummy_ops};
    pdgw_instance_t inst;
    pdgw_fwd_setup_t fs = {0};
    char err[256];
    (void)state;
    assert_int_equal(pdgw_fwd_register(&typed), 0);
    assert_int_equal(pdgw_fwd_register(&untyped), 0);
    memset(&inst, 0, sizeof(inst));
    inst.id = "p1";

    fs.desc = pdgw_registry_find("t-attrs");
    inst.attrs = "trt_port=9000\nmode=fast\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_OK);
    inst.attrs = "trt_port=9000\nmdoe=fast\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "attrs.mdoe"));
    assert_non_null(strstr(err, "trt_port, mode")); /* what it reads instead */
    inst.attrs = "trt_port=90000\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "[1, 65535]"));
    inst.attrs = "trt_port=9k\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_ERR_INVALID);
    inst.attrs = "mode=\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "empty"));
    inst.attrs = NULL;
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_OK);

    fs.desc = pdgw_registry_find("t-attrs-any");
    inst.attrs = "anything=1\n";
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_OK);

    fs.desc = pdgw_registry_find("vllm-nixl"); /* in-tree: reads none */
    assert_non_null(fs.desc);
    assert_int_equal(pdgw_fwd_check_instance(&fs, &inst, err, sizeof(err)), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "reads no instance attributes"));
}

static void test_plugin_loads_and_works(void **state)
{
    char err[512] = "";
    const pdgw_fwd_desc_t *d;
    pdgw_fwd_request_t req;
    pdgw_fwd_peers_t peers;
    pdgw_fwd_leg_t leg;
    pdgw_fwd_error_t ferr;
    pdgw_fwd_env_t env;
    json_t *body, *opts, *resp;
    void *ctx = NULL, *st = NULL;
    (void)state;

    assert_int_equal(pdgw_registry_load_plugin(PLUGIN_DIR "/fwd_example_ok.so", err, sizeof(err)),
                     PDGW_OK);
    d = pdgw_registry_find("example-serial");
    assert_non_null(d);
    assert_int_equal(d->dispatch, PDGW_DISPATCH_SERIAL);

    /* Drive its ops as the workflow engine does. */
    memset(&env, 0, sizeof(env));
    env.abi_version = PDGW_FWD_ABI_VERSION;
    opts = json_pack("{s:i}", "bogus", 1);
    assert_int_equal(d->ops->configure(opts, &env, &ctx, err, sizeof(err)), PDGW_FWD_ERR_CONFIG);
    assert_non_null(strstr(err, "bogus"));
    json_decref(opts);
    opts = json_pack("{s:s}", "leg_header", "X-Example: 1");
    assert_int_equal(d->ops->configure(opts, &env, &ctx, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);

    body = json_pack("{s:s,s:s,s:i,s:b,s:[s]}", "model", "m", "prompt", "hi", "max_tokens", 9,
                     "stream", 1, "stop", "x");
    memset(&req, 0, sizeof(req));
    req.request_id = "r1";
    req.body = body;
    memset(&peers, 0, sizeof(peers));
    memset(&ferr, 0, sizeof(ferr));
    assert_int_equal(d->ops->attempt_init(ctx, &req, &peers, &st, &ferr), PDGW_FWD_OK);

    memset(&leg, 0, sizeof(leg));
    assert_int_equal(d->ops->build_leg(ctx, st, &req, PDGW_LEG_PREFILL, &peers, &leg, &ferr),
                     PDGW_FWD_OK);
    assert_int_equal(json_integer_value(json_object_get(leg.body, "max_tokens")), 1);
    assert_true(json_is_false(json_object_get(leg.body, "stream")));
    assert_null(json_object_get(leg.body, "stop"));
    assert_true(json_is_true(
        json_object_get(json_object_get(leg.body, "kv_transfer_params"), "do_remote_decode")));
    assert_string_equal(leg.headers[0], "X-Example: 1");
    json_decref(leg.body);

    /* A prefill response without params is a retryable kv_transfer failure. */
    resp = json_pack("{s:s}", "id", "x");
    assert_int_equal(d->ops->on_prefill_response(ctx, st, &req, 200, resp, &ferr), PDGW_FWD_ERR);
    assert_int_equal(ferr.phase, PDGW_PHASE_KV_TRANSFER);
    assert_true(ferr.retryable);
    json_decref(resp);
    resp = json_pack("{s:{s:[i,i],s:s}}", "kv_transfer_params", "remote_block_ids", 1, 2,
                     "remote_engine_id", "e1");
    assert_int_equal(d->ops->on_prefill_response(ctx, st, &req, 200, resp, &ferr), PDGW_FWD_OK);
    json_decref(resp);

    memset(&leg, 0, sizeof(leg));
    assert_int_equal(d->ops->build_leg(ctx, st, &req, PDGW_LEG_DECODE, &peers, &leg, &ferr),
                     PDGW_FWD_OK);
    assert_int_equal(json_integer_value(json_object_get(leg.body, "max_tokens")), 9);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(leg.body, "kv_transfer_params"), "remote_engine_id")),
                        "e1");
    json_decref(leg.body);
    d->ops->attempt_cleanup(ctx, st, &req, PDGW_END_OK);
    d->ops->destroy(ctx);
    json_decref(body);
}

static void test_plugin_wrong_abi(void **state)
{
    char err[512] = "";
    (void)state;
    assert_int_equal(
        pdgw_registry_load_plugin(PLUGIN_DIR "/fwd_example_badabi.so", err, sizeof(err)),
        PDGW_ERR_ABI);
    /* The message names the plugin and both versions. */
    assert_non_null(strstr(err, "fwd_example_badabi.so"));
    assert_non_null(strstr(err, "ABI version 99"));
    assert_non_null(strstr(err, "provides ABI versions 1..4"));
    assert_null(pdgw_registry_find("example-badabi"));
}

static void test_plugin_duplicate_and_missing(void **state)
{
    char err[512] = "";
    (void)state;
    assert_int_equal(pdgw_registry_load_plugin(PLUGIN_DIR "/fwd_example_dup.so", err, sizeof(err)),
                     PDGW_ERR_EXISTS);
    assert_non_null(strstr(err, "'neutral'"));
    assert_non_null(strstr(err, "already registered"));
    assert_int_equal(pdgw_registry_load_plugin(PLUGIN_DIR "/no_such_plugin.so", err, sizeof(err)),
                     PDGW_ERR_IO);
    assert_non_null(strstr(err, "cannot load"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_registered),
        cmocka_unit_test(test_duplicates_and_bad_descriptors),
        cmocka_unit_test(test_abi1_descriptor_loads),
        cmocka_unit_test(test_abi2_descriptor_loads),
        cmocka_unit_test(test_abi4_sizes_tables_and_arena),
        cmocka_unit_test(test_instance_attrs),
        cmocka_unit_test(test_declared_instance_attrs),
        cmocka_unit_test(test_plugin_loads_and_works),
        cmocka_unit_test(test_plugin_wrong_abi),
        cmocka_unit_test(test_plugin_duplicate_and_missing),
    };
    pdgw_log_set_level(PDGW_LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
