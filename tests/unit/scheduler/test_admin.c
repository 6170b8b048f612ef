/* Descriptors (URL parsing, JSON validation), config validation, admin JSON, metrics text. */
#include <sys/wait.h>
#include <unistd.h>

#include "sched_test_util.h"

static void test_desc_normalise(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_instance_desc_t d;
    const sched_instance_desc_t *out;
    sched_instance_t *inst;
    char err[256];

    (void)state;
    sched_instance_desc_init(&d);
    d.url = "http://[::1]:8100/v1base/";
    d.role = SCHED_ROLE_PREFILL;
    d.alloc_ports[0] = 7000;
    d.alloc_ports[1] = 7001;
    d.n_alloc_ports = 2;
    d.labels[0].key = "zone";
    d.labels[0].value = "z1";
    d.labels[1].key = "rack";
    d.labels[1].value = "r7";
    d.n_labels = 2;
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
    inst = sched_pool_get(pool, "[::1]:8100"); /* id derived from the url */
    assert_non_null(inst);
    out = sched_instance_desc(inst);
    assert_string_equal(out->url, "http://[::1]:8100/v1base");
    assert_string_equal(out->host, "::1");
    assert_int_equal(out->port, 8100);
    assert_string_equal(out->base_path, "/v1base");
    assert_string_equal(out->kv_host, "::1");
    assert_int_equal(out->tp_size, 2); /* from the port count */
    assert_string_equal(out->zone, "z1");
    assert_string_equal(sched_instance_label(inst, "rack"), "r7");
    assert_null(sched_instance_label(inst, "nope"));
    sched_instance_unref(inst);

    sched_instance_desc_init(&d);
    d.url = "https://engine.example";
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
    inst = sched_pool_get(pool, "engine.example:443");
    assert_non_null(inst);
    assert_string_equal(sched_instance_url(inst), "https://engine.example:443");
    sched_instance_unref(inst);
    /* same id again */
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_ERR_EXISTS);
    assert_non_null(strstr(err, "already exists"));
    sched_pool_destroy(pool);
}

static void expect_invalid(const char *json, const char *key_in_msg)
{
    json_error_t jerr;
    json_t *obj = json_loads(json, 0, &jerr);
    sched_instance_desc_t d;
    char err[256] = "";

    assert_non_null(obj);
    assert_int_equal(sched_instance_desc_from_json(obj, &d, err, sizeof(err)), SCHED_ERR_INVALID);
    if (!strstr(err, key_in_msg))
        fail_msg("error \"%s\" does not name \"%s\" for %s", err, key_in_msg, json);
    json_decref(obj);
}

static void test_desc_json_validation(void **state)
{
    json_error_t jerr;
    json_t *obj;
    sched_instance_desc_t d;
    char err[256];

    (void)state;
    expect_invalid("{}", "url");
    expect_invalid("{\"url\": \"ftp://x:1\"}", "url");
    expect_invalid("{\"url\": \"http://h:99999\"}", "url");
    expect_invalid("{\"url\": \"http://user@h:1\"}", "url");
    expect_invalid("{\"url\": \"http://h:1/?q\"}", "url");
    expect_invalid("{\"url\": \"http://h:1\", \"role\": \"leader\"}", "role");
    expect_invalid("{\"url\": \"http://h:1\", \"weight\": -1}", "weight");
    expect_invalid("{\"url\": \"http://h:1\", \"kv_port\": 70000}", "kv_port");
    expect_invalid("{\"url\": \"http://h:1\", \"kv_port\": \"1\"}", "kv_port");
    expect_invalid("{\"url\": \"http://h:1\", \"alloc_ports\": [1, 0]}", "alloc_ports[1]");
    expect_invalid("{\"url\": \"http://h:1\", \"tp_size\": 2, \"alloc_ports\": [5]}",
                   "alloc_ports");
    expect_invalid("{\"url\": \"http://h:1\", \"dp_rank\": 2, \"dp_size\": 2}", "dp_rank");
    expect_invalid("{\"url\": \"http://h:1\", \"labels\": {\"zone\": 3}}", "labels.zone");
    expect_invalid("{\"url\": \"http://h:1\", \"id\": \"a/b\"}", "id");
    expect_invalid("{\"url\": \"http://h:1\", \"colour\": \"red\"}", "colour");
    expect_invalid("[]", "object");

    obj = json_loads("{\"id\": \"p0\", \"url\": \"http://10.0.0.1:8100\", \"role\": \"prefill\","
                     " \"zone\": \"a\", \"weight\": 3, \"kv_port\": 14579,"
                     " \"bootstrap_port\": 8998, \"engine_id\": \"e0\", \"tp_size\": 2,"
                     " \"alloc_ports\": [7000, 7001], \"init_ports\": [7100, 7101],"
                     " \"dp_rank\": 1, \"dp_size\": 2, \"labels\": {\"rack\": \"r1\"}}",
                     0, &jerr);
    assert_non_null(obj);
    assert_int_equal(sched_instance_desc_from_json(obj, &d, err, sizeof(err)), SCHED_OK);
    assert_string_equal(d.id, "p0");
    assert_int_equal(d.role, SCHED_ROLE_PREFILL);
    assert_int_equal(d.weight, 3);
    assert_int_equal(d.kv_port, 14579);
    assert_int_equal(d.bootstrap_port, 8998);
    assert_int_equal(d.n_init_ports, 2);
    assert_int_equal(d.init_ports[1], 7101);
    assert_int_equal(d.dp_rank, 1);
    assert_string_equal(d.labels[0].key, "rack");
    json_decref(obj);
}

static void test_config_validation(void **state)
{
    sched_config_t cfg;
    sched_instance_desc_t inst[2];
    sched_policy_t p;
    char err[256];

    (void)state;
    assert_int_equal(sched_policy_parse("power-of-two", &p), SCHED_OK);
    assert_int_equal(p, SCHED_POLICY_POWER_OF_TWO);
    assert_int_equal(sched_policy_parse("fastest", &p), SCHED_ERR_UNSUPPORTED);
    for (int i = 0; i < SCHED_POLICY_COUNT; i++) {
        assert_int_equal(sched_policy_parse(sched_policy_name((sched_policy_t)i), &p), SCHED_OK);
        assert_int_equal(p, i);
    }
    sched_config_init(&cfg);
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_OK);
    cfg.unhealthy_threshold = 0;
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "unhealthy_threshold"));
    sched_config_init(&cfg);
    cfg.dns.decode = "decode.svc";
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "discovery.dns.decode"));
    sched_config_init(&cfg);
    sched_instance_desc_init(&inst[0]);
    sched_instance_desc_init(&inst[1]);
    inst[0].url = "http://a:1";
    inst[1].url = "http://a:1";
    cfg.instances = inst;
    cfg.n_instances = 2;
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "instances[1].id"));
    inst[1].url = "nope";
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "instances[1].url"));
    assert_string_equal(sched_strerror(SCHED_ERR_NO_INSTANCE), "no usable instance");
}

static void test_admin_add_list_drain_remove(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    json_error_t jerr;
    json_t *body, *created = NULL, *list, *e;
    char err[256];
    sched_request_t req = {.prompt_tokens = 10, .max_tokens = 20};
    sched_booking_t *b = NULL;

    (void)state;
    body = json_loads("{\"id\": \"d9\", \"url\": \"http://127.0.0.1:9009\", \"role\": \"decode\","
                      " \"zone\": \"eu\", \"weight\": 2}",
                      0, &jerr);
    assert_int_equal(sched_admin_add(pool, body, &created, err, sizeof(err)), SCHED_OK);
    assert_string_equal(json_string_value(json_object_get(created, "id")), "d9");
    assert_string_equal(json_string_value(json_object_get(created, "source")), "admin");
    json_decref(created);
    assert_int_equal(sched_admin_add(pool, body, NULL, err, sizeof(err)), SCHED_ERR_EXISTS);
    json_decref(body);
    body = json_loads("{\"url\": 5}", 0, &jerr);
    assert_int_equal(sched_admin_add(pool, body, NULL, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "url"));
    json_decref(body);

    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    list = sched_admin_list(pool);
    assert_int_equal(json_array_size(list), 1);
    e = json_array_get(list, 0);
    assert_string_equal(json_string_value(json_object_get(e, "state")), "up");
    assert_string_equal(json_string_value(json_object_get(e, "role")), "decode");
    assert_string_equal(json_string_value(json_object_get(e, "url")), "http://127.0.0.1:9009");
    assert_string_equal(json_string_value(json_object_get(e, "zone")), "eu");
    assert_int_equal(json_integer_value(json_object_get(e, "weight")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "load"), "inflight")),
                     1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "load"), "kv_tokens")),
                     30);
    assert_true(json_is_null(json_object_get(json_object_get(e, "load"), "scraped")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "breaker"), "state")),
                        "closed");
    assert_true(json_is_null(json_object_get(e, "last_error")));
    json_decref(list);

    assert_int_equal(sched_pool_drain(pool, "d9"), SCHED_OK);
    e = sched_admin_get(pool, "d9");
    assert_string_equal(json_string_value(json_object_get(e, "state")), "draining");
    json_decref(e);
    assert_int_equal(sched_pool_drain(pool, "nope"), SCHED_ERR_NOT_FOUND);
    assert_int_equal(sched_pool_undrain(pool, "d9"), SCHED_OK);
    assert_int_equal(sched_pool_remove(pool, "d9"), SCHED_OK);
    assert_null(sched_admin_get(pool, "d9"));
    list = sched_admin_list(pool);
    assert_int_equal(json_array_size(list), 0);
    json_decref(list);
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

/* The exposition text passes promtool (installed with the test deps). */
static void test_metrics_text_promtool(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    char *text, path[] = "/tmp/sched-metrics-XXXXXX", cmd[128];
    int fd, rc;

    (void)state;
    test_add(pool, "p@[::1]:0", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "d0", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    atomic_fetch_or(&test_inst(pool, "d0")->gate, SCHED_GATE_DOWN);
    text = sched_metrics_text(pool);
    assert_non_null(text);
    assert_non_null(
        strstr(text, "pdgw_instance_inflight{instance=\"p@[::1]:0\",role=\"prefill\"} 1\n"));
    assert_non_null(strstr(text, "pdgw_instance_inflight{instance=\"d0\",role=\"decode\"} 1\n"));
    assert_non_null(strstr(text, "pdgw_instance_healthy{instance=\"d0\",role=\"decode\"} 0\n"));
    assert_non_null(strstr(text, "pdgw_breaker_state{instance=\"d0\"} 0\n"));
    assert_non_null(strstr(text, "pdgw_schedule_seconds_bucket{le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(text, "pdgw_schedule_seconds_count 1\n"));
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    if (access("/usr/bin/promtool", X_OK) == 0) {
        snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s", path);
        rc = system(cmd);
        assert_int_equal(WEXITSTATUS(rc), 0);
    } else {
        print_message("promtool not installed: exposition syntax not checked\n");
    }
    unlink(path);
    free(text);
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_desc_normalise),
        cmocka_unit_test(test_desc_json_validation),
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_admin_add_list_drain_remove),
        cmocka_unit_test(test_metrics_text_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
