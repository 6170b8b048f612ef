/*
 * test_config.c -- kvt_config: defaults, YAML / JSON / key=value loaders,
 * unknown keys and bad values named in the error, validation rules, derived
 * values, the seed's example LMCache configs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvt/kvt_config.h"

static void test_defaults(void **state)
{
    kvt_config_t c;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    assert_int_equal(c.pd_role, KVT_ROLE_BOTH);
    assert_true(c.pd_alloc_fail_backoff_ttl == 2.0);
    assert_true(c.pd_pull_pending_ttl == 360.0);
    assert_true(c.pd_pull_backpressure_reserve_pct == 2.0);
    assert_true(c.pd_allocation_timeout_sec == 5.0);
    assert_true(c.pd_alloc_ttl == 30.0);  /* unclaimed receiver allocations */
    assert_true(c.pd_alloc_quota == 0.5); /* one sender's share of the pool */
    assert_int_equal(c.pd_buffer_size, 1ull << 30);
    assert_string_equal(c.pd_buffer_device, "cpu");
    assert_int_equal(c.pd_buffer_is_device, 0);
    assert_int_equal(c.transfer_channel, KVT_CHANNEL_TCP);
    assert_int_equal(c.transfer_lanes, 0);
    assert_int_equal(c.verbs_gid_index, -1);
    assert_int_equal(c.chunk_size, 256);
    assert_int_equal(c.pd_pull_mode, 0);
    assert_int_equal(c.pd_cpu_buffer_size, 0);
    assert_int_equal(kvt_config_cpu_buffer_size(&c), 1ull << 30);
    /* "both" needs an alloc port to be valid */
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_peer_alloc_port");
    c.pd_role = KVT_ROLE_SENDER;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);

    /* pd_peer_flavour: which LMCache sender a receiver answers (auto = tell
     * from the request); "libkvt" is negotiated on the wire, never configured */
    assert_string_equal(c.pd_peer_flavour, "auto");
    assert_int_equal(kvt_config_set(&c, "pd_peer_flavour", "ascend", &err), KVT_OK);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
    assert_int_equal(kvt_config_set(&c, "pd_peer_flavour", "libkvt", &err), KVT_OK);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_peer_flavour");
    assert_int_equal(kvt_config_set(&c, "pd_peer_flavour", "vllm", &err), KVT_OK);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    {
        kvt_flavour_t f;
        assert_int_equal(kvt_flavour_parse("async", &f), KVT_OK);
        assert_int_equal(f, KVT_FLAVOUR_ASYNC);
        assert_string_equal(kvt_flavour_name(KVT_FLAVOUR_SYNC), "sync");
        assert_int_equal(kvt_flavour_parse("ASYNC", &f), KVT_ERR_CONFIG);
    }
}

/* The seed's sender example (pull-delay with CPU offload), verbatim keys. */
static const char sender_yaml[] = "local_cpu: False\n"
                                  "\n"
                                  "enable_pd: True\n"
                                  "transfer_channel: \"tcp\"\n"
                                  "pd_role: \"sender\"\n"
                                  "pd_pull_mode: True\n"
                                  "pd_delay_pull: True\n"
                                  "pd_pull_done_port: [7600, 7601]\n"
                                  "pd_use_cpu_offload: True\n"
                                  "pd_cpu_buffer_size: 21474836480   # 20 GB\n"
                                  "pd_peer_host: \"10.1.2.3\"\n"
                                  "pd_proxy_host: \"10.1.2.4\"\n"
                                  "pd_proxy_port: 8500\n"
                                  "pd_buffer_size: 32225472\n"
                                  "pd_buffer_device: \"npu\"\n";

static const char receiver_yaml[] = "enable_pd: True\n"
                                    "pd_role: receiver\n"
                                    "pd_peer_host: 10.1.2.5\n"
                                    "pd_pull_mode: True\n"
                                    "pd_delay_pull: True\n"
                                    "pd_peer_init_port: [7300, 7301]\n"
                                    "pd_peer_alloc_port:\n"
                                    "  - 7400\n"
                                    "  - 7401\n"
                                    "pd_buffer_size: 128MiB\n"
                                    "pd_buffer_device: npu\n"
                                    "pd_tp_rank: 1\n"
                                    "pd_alloc_fail_backoff_ttl: 500ms\n"
                                    "pd_pull_pending_ttl: 2m\n";

static void test_yaml_seed_examples(void **state)
{
    kvt_config_t c;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    assert_int_equal(kvt_config_load_yaml_string(&c, sender_yaml, strlen(sender_yaml), &err),
                     KVT_OK);
    assert_int_equal(c.pd_role, KVT_ROLE_SENDER);
    assert_int_equal(c.pd_pull_mode, 1);
    assert_int_equal(c.pd_delay_pull, 1);
    assert_int_equal(c.pd_pull_done_port.n, 2);
    assert_int_equal(c.pd_pull_done_port.v[1], 7601);
    assert_int_equal(c.pd_use_cpu_offload, 1);
    assert_int_equal(c.pd_cpu_buffer_size, 21474836480ull);
    assert_string_equal(c.pd_peer_host, "10.1.2.3");
    assert_int_equal(c.pd_proxy_port, 8500);
    assert_int_equal(c.pd_buffer_size, 32225472);
    assert_int_equal(c.pd_buffer_is_device, 1);
    assert_int_equal(c.local_cpu, 0);
    assert_int_equal(c.enable_pd, 1);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
    assert_int_equal(kvt_config_cpu_buffer_size(&c), 21474836480ull);
    assert_int_equal(kvt_config_pull_done_port(&c), 7600);

    kvt_config_defaults(&c);
    assert_int_equal(kvt_config_load_yaml_string(&c, receiver_yaml, strlen(receiver_yaml), &err),
                     KVT_OK);
    assert_int_equal(c.pd_role, KVT_ROLE_RECEIVER);
    assert_int_equal(c.pd_buffer_size, 128u << 20);
    assert_int_equal(c.pd_peer_alloc_port.n, 2);
    assert_int_equal(kvt_config_port(&c, &c.pd_peer_alloc_port), 7401);
    assert_int_equal(kvt_config_port(&c, &c.pd_peer_init_port), 7301);
    /* no pd_pull_done_port: alloc port + 100 */
    assert_int_equal(kvt_config_pull_done_port(&c), 7501);
    assert_true(c.pd_alloc_fail_backoff_ttl == 0.5);
    assert_true(c.pd_pull_pending_ttl == 120.0);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
}

static void expect_yaml_error(const char *yaml, const char *key, const char *needle, int line)
{
    kvt_config_t c, before;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    c.pd_proxy_port = 1234; /* something to check stays unchanged */
    before = c;
    assert_int_equal(kvt_config_load_yaml_string(&c, yaml, strlen(yaml), &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, key);
    if (needle != NULL && strstr(err.msg, needle) == NULL)
        fail_msg("error message '%s' lacks '%s'", err.msg, needle);
    if (line > 0)
        assert_int_equal(err.line, line);
    assert_memory_equal(&c, &before, sizeof(c));
}

static void test_yaml_errors(void **state)
{
    expect_yaml_error("pd_proxy_port: 80\npd_bufer_size: 10\n", "pd_bufer_size",
                      "unknown key 'pd_bufer_size'", 2);
    expect_yaml_error("pd_role: master\n", "pd_role", "sender, receiver or both", 1);
    expect_yaml_error("transfer_channel: hccl\n", "transfer_channel", "tcp, verbs or shm", 1);
    expect_yaml_error("pd_buffer_size: lots\n", "pd_buffer_size", "byte size", 1);
    expect_yaml_error("pd_buffer_size: -5\n", "pd_buffer_size", NULL, 1);
    expect_yaml_error("pd_pull_mode: maybe\n", "pd_pull_mode", "true or false", 1);
    expect_yaml_error("pd_peer_alloc_port: [7400, 70000]\n", "pd_peer_alloc_port", "70000", 1);
    expect_yaml_error("pd_peer_alloc_port: [7400, [1]]\n", "pd_peer_alloc_port", "flat list", 1);
    expect_yaml_error("pd_proxy_port: [1, 2]\n", "pd_proxy_port", "single value", 1);
    expect_yaml_error("pd_pull_pending_ttl: 5 minutes\n", "pd_pull_pending_ttl", "seconds", 1);
    expect_yaml_error("pd_tp_rank: -1\n", "pd_tp_rank", ">= 0", 1);
    expect_yaml_error("pd_peer_host: {a: 1}\n", "pd_peer_host", "scalar or a list", 1);
    expect_yaml_error("pd_role: sender\npd_role: receiver\n", "pd_role", "duplicate", 2);
    expect_yaml_error("- a\n- b\n", "", "mapping", 1);
    expect_yaml_error("just a string\n", "", "mapping", 1);
    expect_yaml_error("pd_role: [sender\n", "", "YAML syntax error", 0);
    expect_yaml_error("pd_pull_backpressure_reserve_pct: 2%\n", "pd_pull_backpressure_reserve_pct",
                      "number", 1);
}

static void test_yaml_null_and_empty(void **state)
{
    kvt_config_t c;
    kvt_config_err_t err;
    const char *y = "pd_pull_done_port: None\npd_cpu_buffer_size: null\npd_proxy_host: ~\n";

    kvt_config_defaults(&c);
    c.pd_cpu_buffer_size = 5;
    c.pd_pull_done_port.n = 1;
    assert_int_equal(kvt_config_load_yaml_string(&c, y, strlen(y), &err), KVT_OK);
    assert_int_equal(c.pd_cpu_buffer_size, 0);
    assert_int_equal(c.pd_pull_done_port.n, 0);
    assert_int_equal(kvt_config_load_yaml_string(&c, "", 0, &err), KVT_OK);
    assert_int_equal(kvt_config_load_yaml_string(&c, "# only a comment\n", 17, &err), KVT_OK);
    /* quoted strings are values, not nulls */
    assert_int_equal(kvt_config_load_yaml_string(&c, "pd_node_id: \"null\"\n", 19, &err), KVT_OK);
    assert_string_equal(c.pd_node_id, "null");
}

static void test_json(void **state)
{
    kvt_config_t c, before;
    kvt_config_err_t err;
    const char *j = "{\"pd_role\": \"receiver\", \"pd_peer_alloc_port\": [7400], "
                    "\"pd_buffer_size\": 1048576, \"pd_pull_backpressure_reserve_pct\": 5.5, "
                    "\"pd_pull_mode\": true, \"pd_alloc_fail_backoff_ttl\": 1, "
                    "\"transfer_channel\": \"verbs\", \"verbs_device\": \"mlx5_0\", "
                    "\"verbs_gid_index\": 3, \"transfer_lanes\": 2}";

    kvt_config_defaults(&c);
    assert_int_equal(kvt_config_load_json_string(&c, j, strlen(j), &err), KVT_OK);
    assert_int_equal(c.pd_role, KVT_ROLE_RECEIVER);
    assert_int_equal(c.pd_buffer_size, 1048576);
    assert_true(c.pd_pull_backpressure_reserve_pct == 5.5);
    assert_true(c.pd_alloc_fail_backoff_ttl == 1.0);
    assert_int_equal(c.transfer_channel, KVT_CHANNEL_VERBS);
    assert_string_equal(c.verbs_device, "mlx5_0");
    assert_int_equal(c.verbs_gid_index, 3);
    assert_int_equal(c.transfer_lanes, 2);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);

    before = c;
    assert_int_equal(kvt_config_load_json_string(&c, "{\"pd_rol\": 1}", 13, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_rol");
    assert_int_equal(kvt_config_load_json_string(&c, "{\"pd_pull_mode\": {}}", 20, &err),
                     KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_pull_mode");
    assert_int_equal(kvt_config_load_json_string(&c, "{\"pd_role\": \"x\",}", 17, &err),
                     KVT_ERR_CONFIG);
    assert_int_equal(err.line, 1);
    assert_int_equal(kvt_config_load_json_string(&c, "[]", 2, &err), KVT_ERR_CONFIG);
    assert_int_equal(kvt_config_load_json_string(
                         &c, "{\"pd_role\": \"sender\", \"pd_role\": \"both\"}", 40, &err),
                     KVT_ERR_CONFIG);
    assert_memory_equal(&c, &before, sizeof(c));
}

static void test_files(void **state)
{
    char ypath[] = "/tmp/kvt_cfg_XXXXXX.yaml";
    char jpath[] = "/tmp/kvt_cfg_XXXXXX.json";
    kvt_config_t c;
    kvt_config_err_t err;
    int fd;

    fd = mkstemps(ypath, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, receiver_yaml, strlen(receiver_yaml)),
                     (ssize_t)strlen(receiver_yaml));
    close(fd);
    fd = mkstemps(jpath, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "{\"pd_tp_rank\": 3}", 17), 17);
    close(fd);

    kvt_config_defaults(&c);
    assert_int_equal(kvt_config_load_file(&c, ypath, &err), KVT_OK);
    assert_int_equal(c.pd_role, KVT_ROLE_RECEIVER);
    assert_int_equal(kvt_config_load_file(&c, jpath, &err), KVT_OK);
    assert_int_equal(c.pd_tp_rank, 3);
    /* rank 3 is not covered by the 2-entry port lists */
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_peer_alloc_port");
    unlink(ypath);
    unlink(jpath);
    assert_int_equal(kvt_config_load_file(&c, "/nonexistent/kvt.yaml", &err), KVT_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "cannot open"));
}

static void test_set_key_value(void **state)
{
    kvt_config_t c;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    assert_int_equal(kvt_config_set(&c, "pd_peer_alloc_port", "7400,7401", &err), KVT_OK);
    assert_int_equal(c.pd_peer_alloc_port.n, 2);
    assert_int_equal(kvt_config_set(&c, "pd_peer_init_port", "[7300, 7301]", &err), KVT_OK);
    assert_int_equal(c.pd_peer_init_port.v[1], 7301);
    assert_int_equal(kvt_config_set(&c, "pd_pull_done_port", "7600", &err), KVT_OK);
    assert_int_equal(c.pd_pull_done_port.n, 1);
    assert_int_equal(kvt_config_set(&c, "pd_buffer_size", "1.5GiB", &err), KVT_OK);
    assert_int_equal(c.pd_buffer_size, 3ull << 29);
    assert_int_equal(kvt_config_set(&c, "pd_buffer_size", "2GB", &err), KVT_OK);
    assert_int_equal(c.pd_buffer_size, 2000000000ull);
    assert_int_equal(kvt_config_set(&c, "pd_buffer_size", "1.5", &err), KVT_ERR_CONFIG);
    assert_int_equal(kvt_config_set(&c, "pd_alloc_fail_backoff_ttl", "250ms", &err), KVT_OK);
    assert_true(c.pd_alloc_fail_backoff_ttl == 0.25);
    assert_int_equal(kvt_config_set(&c, "pd_pull_mode", "yes", &err), KVT_OK);
    assert_int_equal(c.pd_pull_mode, 1);
    assert_int_equal(kvt_config_set(&c, "transfer_channel", "shm", &err), KVT_OK);
    assert_int_equal(c.transfer_channel, KVT_CHANNEL_SHM);
    assert_int_equal(kvt_config_set(&c, "nope", "1", &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "nope");
    assert_int_equal(kvt_config_set(&c, "pd_peer_alloc_port", "1,x", &err), KVT_ERR_CONFIG);
    assert_int_equal(c.pd_peer_alloc_port.n, 2); /* unchanged */
    {
        char big[400];
        memset(big, 'h', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        assert_int_equal(kvt_config_set(&c, "pd_peer_host", big, &err), KVT_ERR_CONFIG);
        assert_non_null(strstr(err.msg, "too long"));
    }
    {
        char ports[600] = "";
        for (int i = 0; i < 65; i++)
            snprintf(ports + strlen(ports), sizeof(ports) - strlen(ports), "%d,", 1000 + i);
        ports[strlen(ports) - 1] = '\0';
        assert_int_equal(kvt_config_set(&c, "pd_peer_init_port", ports, &err), KVT_ERR_CONFIG);
    }
}

static void test_validate_rules(void **state)
{
    kvt_config_t c;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    c.pd_role = KVT_ROLE_SENDER;
    c.pd_delay_pull = 1;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_delay_pull");
    c.pd_pull_mode = 1;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);

    kvt_config_set(&c, "pd_role", "receiver", NULL);
    kvt_config_set(&c, "pd_peer_alloc_port", "7400", NULL);
    c.pd_use_cpu_offload = 1;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_use_cpu_offload");
    c.pd_use_cpu_offload = 0;

    c.pd_pull_backpressure_reserve_pct = 100.0;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_pull_backpressure_reserve_pct");
    c.pd_pull_backpressure_reserve_pct = 2.0;
    c.transfer_lanes = 65;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "transfer_lanes");
    c.transfer_lanes = 4;
    c.pd_buffer_size = 0;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    c.pd_buffer_size = 1;
    c.chunk_size = 0;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    c.chunk_size = 16;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
    /* pd_alloc_ttl >= 0 (0 = no expiry; "500ms" style accepted), pd_alloc_quota in (0, 1] */
    assert_int_equal(kvt_config_set(&c, "pd_alloc_ttl", "500ms", &err), KVT_OK);
    assert_true(c.pd_alloc_ttl == 0.5);
    c.pd_alloc_ttl = -1;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_alloc_ttl");
    c.pd_alloc_ttl = 0;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
    assert_int_equal(kvt_config_set(&c, "pd_alloc_quota", "0", &err), KVT_OK);
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_alloc_quota");
    c.pd_alloc_quota = 1.5;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_ERR_CONFIG);
    c.pd_alloc_quota = 1.0;
    assert_int_equal(kvt_config_validate(&c, &err), KVT_OK);
}

static void test_to_json(void **state)
{
    kvt_config_t c;
    char buf[4096];
    size_t n;

    kvt_config_defaults(&c);
    kvt_config_set(&c, "pd_peer_alloc_port", "7400,7401", NULL);
    n = kvt_config_to_json(&c, buf, sizeof(buf));
    assert_true(n > 0 && n < sizeof(buf));
    assert_non_null(strstr(buf, "\"pd_role\":\"both\""));
    assert_non_null(strstr(buf, "\"pd_peer_alloc_port\":[7400,7401]"));
    assert_non_null(strstr(buf, "\"pd_pull_pending_ttl\":360.0"));
    /* snprintf-like: the needed length even when the buffer is short */
    assert_int_equal(kvt_config_to_json(&c, buf, 8), n);
    assert_int_equal(strlen(buf), 7);
}

static void test_env(void **state)
{
    kvt_config_t c, before;
    kvt_config_err_t err;

    kvt_config_defaults(&c);
    setenv("KVTTEST_PD_ROLE", "receiver", 1);
    setenv("KVTTEST_PD_PEER_ALLOC_PORT", "7400,7401", 1);
    setenv("KVTTEST_PD_PULL_PENDING_TTL", "30s", 1);
    assert_int_equal(kvt_config_load_env(&c, "KVTTEST_", &err), KVT_OK);
    assert_int_equal(c.pd_role, KVT_ROLE_RECEIVER);
    assert_int_equal(c.pd_peer_alloc_port.n, 2);
    assert_true(c.pd_pull_pending_ttl == 30.0);
    before = c;
    setenv("KVTTEST_PD_BUFFER_SIZE", "big", 1);
    assert_int_equal(kvt_config_load_env(&c, "KVTTEST_", &err), KVT_ERR_CONFIG);
    assert_string_equal(err.key, "pd_buffer_size");
    assert_memory_equal(&c, &before, sizeof(c));
    unsetenv("KVTTEST_PD_ROLE");
    unsetenv("KVTTEST_PD_PEER_ALLOC_PORT");
    unsetenv("KVTTEST_PD_PULL_PENDING_TTL");
    unsetenv("KVTTEST_PD_BUFFER_SIZE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_yaml_seed_examples),
        cmocka_unit_test(test_yaml_errors),   cmocka_unit_test(test_yaml_null_and_empty),
        cmocka_unit_test(test_json),          cmocka_unit_test(test_files),
        cmocka_unit_test(test_set_key_value), cmocka_unit_test(test_validate_rules),
        cmocka_unit_test(test_to_json),       cmocka_unit_test(test_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
