/*
 * test_config.c - configuration: defaults, YAML with every key, precedence CLI > env >
 * file > default for each value type, errors that name the key (and YAML line),
 * --check-config, quick-start flags, --help generated from the table, print/reload round
 * trip, the deploy/examples files, and allocation failures while loading.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdgw_alloc.h"
#include "pdgw_config.h"
#include "pdgw_log.h"

/* ---------------------------------------------------------------- helpers */

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/pdgw_cfg_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return strdup(path);
}

typedef struct run {
    pdgw_config_t cfg;
    pdgw_status_t st;
    pdgw_config_action_t action;
    pdgw_config_error_t err;
    char *out;
    char *errout;
} run_t;

static char *empty_env[] = {NULL};

/* Run pdgw_config_from_args on a NULL-terminated argv (argv[0] implied). */
static void run_args(run_t *r, char **envp, const pdgw_config_hooks_t *base_hooks, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "pdgw";
    va_list ap;
    va_start(ap, base_hooks);
    char *a;
    while ((a = va_arg(ap, char *)) != NULL)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    size_t ol = 0, el = 0;
    FILE *out = open_memstream(&r->out, &ol);
    FILE *err = open_memstream(&r->errout, &el);
    pdgw_config_hooks_t hooks = {0};
    if (base_hooks != NULL)
        hooks = *base_hooks;
    hooks.out = out;
    hooks.err = err;
    r->st = pdgw_config_from_args(&r->cfg, argc, argv, envp != NULL ? envp : empty_env, &hooks,
                                  &r->action, &r->err);
    fclose(out);
    fclose(err);
}

static void run_free(run_t *r)
{
    pdgw_config_free(&r->cfg);
    free(r->out);
    free(r->errout);
    memset(r, 0, sizeof(*r));
}

/* Expect failure whose message contains every NULL-terminated fragment. */
static void expect_error(run_t *r, const char *key, ...)
{
    if (r->st == PDGW_OK)
        fail_msg("expected an error naming %s, got success", key);
    if (key != NULL && strcmp(r->err.key, key) != 0)
        fail_msg("error key '%s' != '%s' (%s)", r->err.key, key, r->err.message);
    va_list ap;
    va_start(ap, key);
    const char *frag;
    while ((frag = va_arg(ap, const char *)) != NULL) {
        if (strstr(r->err.message, frag) == NULL)
            fail_msg("message lacks '%s': %s", frag, r->err.message);
        if (strstr(r->errout, frag) == NULL)
            fail_msg("printed error lacks '%s': %s", frag, r->errout);
    }
    va_end(ap);
}

/* A file that sets every key. */
static const char *full_yaml = "# every key of the schema\n"
                               "listen: \"127.0.0.1:9000\"\n"
                               "workers: 3\n"
                               "protocol: vllm-kvt\n"
                               "scheduling: staged\n"
                               "protocol_options:\n"
                               "  mooncake_dispatch: parallel\n"
                               "  proxy_port: 7500\n"
                               "plugins: []\n"
                               "max_body_bytes: 1MiB\n"
                               "request_timeout: 2m\n"
                               "connect_timeout: 500ms\n"
                               "first_byte_timeout: 45\n"
                               "idle_timeout: 20s\n"
                               "retries: 2\n"
                               "drain_timeout: 5s\n"
                               "api_keys: [sk-one, \"sk-two\"]\n"
                               "api_key_file: \"\"\n"
                               "log_level: debug\n"
                               "log_format: json\n"
                               "access_log: false\n"
                               "models: [llama]\n"
                               "prefill_policy: prefix-aware\n"
                               "decode_policy: power-of-two\n"
                               "health_interval: 3s\n"
                               "health_timeout: 1500ms\n"
                               "healthy_threshold: 2\n"
                               "unhealthy_threshold: 4\n"
                               "metrics_scrape_interval: 0\n"
                               "breaker_failures: 7\n"
                               "breaker_open_time: 1m\n"
                               "instances:\n"
                               "  - id: prefill-0\n"
                               "    url: http://10.0.0.1:8100\n"
                               "    role: prefill\n"
                               "    zone: a\n"
                               "    weight: 2\n"
                               "    kv_host: 192.168.0.1\n"
                               "    kv_port: 17000\n"
                               "    bootstrap_port: 8998\n"
                               "    engine_id: eng-p0\n"
                               "    alloc_ports: [7001, 7002]\n"
                               "    init_ports: [7101, 7102]\n"
                               "    tp_size: 2\n"
                               "    dp_rank: 1\n"
                               "    dp_size: 2\n"
                               "    labels: {rack: r1}\n"
                               "    attrs: {trt_port: 9000, mode: fast}\n"
                               "  - url: http://10.0.0.2:8200\n"
                               "    role: decode\n"
                               "discovery:\n"
                               "  dns:\n"
                               "    prefill: \"prefill.svc.cluster.local:8000\"\n"
                               "    decode: \"decode.svc.cluster.local:8000\"\n"
                               "    interval: 10s\n"
                               "  kubernetes:\n"
                               "    namespace: llm\n"
                               "    prefill_selector: app=vllm-prefill\n"
                               "    decode_selector: app=vllm-decode\n"
                               "    both_selector: \"\"\n"
                               "    port_name: api\n"
                               "    api_server: https://10.96.0.1:443\n"
                               "    token_file: /tmp/token\n"
                               "    ca_file: /tmp/ca.crt\n";

/* ---------------------------------------------------------------- tests */

static void test_defaults(void **state)
{
    (void)state;
    pdgw_config_t c;
    assert_int_equal(pdgw_config_init(&c), PDGW_OK);
    /* loopback unless the operator opens it up (deploy/ configs say 0.0.0.0 themselves) */
    assert_string_equal(c.listen, "127.0.0.1:8000");
    assert_string_equal(c.listen_host, "127.0.0.1");
    assert_string_equal(c.tls_cert, "");
    assert_string_equal(c.admin_api_key, "");
    assert_int_equal(c.listen_port, 8000);
    assert_int_equal(c.workers, 0);
    assert_true(pdgw_config_workers(&c) >= 1);
    assert_string_equal(c.protocol, "neutral");
    assert_int_equal(c.scheduling, PDGW_SCHED_BATCH);
    assert_int_equal(c.protocol_options.count, 0);
    assert_int_equal(c.plugins.count, 0);
    assert_int_equal(c.max_body_bytes, 16777216);
    assert_int_equal(c.request_timeout_ms, 600000);
    assert_int_equal(c.connect_timeout_ms, 3000);
    assert_int_equal(c.first_byte_timeout_ms, 300000);
    assert_int_equal(c.idle_timeout_ms, 60000);
    assert_int_equal(c.retries, 1);
    assert_int_equal(c.drain_timeout_ms, 30000);
    assert_int_equal(c.api_keys.count, 0);
    assert_string_equal(c.api_key_file, "");
    assert_int_equal(c.log_level, PDGW_LOG_LEVEL_INFO);
    assert_int_equal(c.log_format, PDGW_LOG_FORMAT_TEXT);
    assert_true(c.access_log);
    assert_int_equal(c.prefill_policy, PDGW_POLICY_LEAST_LOAD);
    assert_int_equal(c.decode_policy, PDGW_POLICY_LEAST_LOAD);
    assert_int_equal(c.health_interval_ms, 2000);
    assert_int_equal(c.health_timeout_ms, 1000);
    assert_int_equal(c.healthy_threshold, 1);
    assert_int_equal(c.unhealthy_threshold, 2);
    assert_int_equal(c.metrics_scrape_interval_ms, 2000);
    assert_int_equal(c.breaker_failures, 5);
    assert_int_equal(c.breaker_open_time_ms, 10000);
    assert_int_equal(c.n_instances, 0);
    assert_false(c.dns_enabled);
    assert_false(c.k8s_enabled);
    assert_int_equal(c.dns.interval_ms, 5000);
    assert_string_equal(c.k8s.port_name, "http");
    assert_string_equal(c.k8s.token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token");
    assert_null(c.config_file);
    pdgw_config_free(&c);
}

static void test_full_yaml(void **state)
{
    (void)state;
    char *path = write_tmp(full_yaml);
    pdgw_config_t c;
    pdgw_config_error_t err;
    assert_int_equal(pdgw_config_init(&c), PDGW_OK);
    pdgw_status_t st = pdgw_config_load_file(&c, path, &err);
    if (st != PDGW_OK)
        fail_msg("%s", err.message);
    assert_string_equal(c.config_file, path);
    assert_string_equal(c.listen_host, "127.0.0.1");
    assert_int_equal(c.listen_port, 9000);
    assert_int_equal(c.workers, 3);
    assert_string_equal(c.protocol, "vllm-kvt");
    assert_int_equal(c.scheduling, PDGW_SCHED_STAGED);
    assert_string_equal(pdgw_kv_list_get(&c.protocol_options, "mooncake_dispatch"), "parallel");
    assert_string_equal(pdgw_kv_list_get(&c.protocol_options, "proxy_port"), "7500");
    assert_null(pdgw_kv_list_get(&c.protocol_options, "nope"));
    assert_int_equal(c.max_body_bytes, 1048576);
    assert_int_equal(c.request_timeout_ms, 120000);
    assert_int_equal(c.connect_timeout_ms, 500);
    assert_int_equal(c.first_byte_timeout_ms, 45000);
    assert_int_equal(c.idle_timeout_ms, 20000);
    assert_int_equal(c.retries, 2);
    assert_int_equal(c.drain_timeout_ms, 5000);
    assert_int_equal(c.api_keys.count, 2);
    assert_string_equal(c.api_keys.items[1], "sk-two");
    assert_int_equal(c.log_level, PDGW_LOG_LEVEL_DEBUG);
    assert_int_equal(c.log_format, PDGW_LOG_FORMAT_JSON);
    assert_false(c.access_log);
    assert_int_equal(c.models.count, 1);
    assert_int_equal(c.prefill_policy, PDGW_POLICY_PREFIX_AWARE);
    assert_int_equal(c.decode_policy, PDGW_POLICY_POWER_OF_TWO);
    assert_string_equal(pdgw_policy_name(c.decode_policy), "power-of-two");
    assert_int_equal(c.health_interval_ms, 3000);
    assert_int_equal(c.health_timeout_ms, 1500);
    assert_int_equal(c.healthy_threshold, 2);
    assert_int_equal(c.unhealthy_threshold, 4);
    assert_int_equal(c.metrics_scrape_interval_ms, 0);
    assert_int_equal(c.breaker_failures, 7);
    assert_int_equal(c.breaker_open_time_ms, 60000);
    assert_int_equal(c.n_instances, 2);
    const pdgw_instance_config_t *p = &c.instances[0];
    assert_string_equal(p->id, "prefill-0");
    assert_int_equal(p->role, PDGW_ROLE_PREFILL);
    assert_string_equal(p->zone, "a");
    assert_string_equal(pdgw_kv_list_get(&p->labels, "zone"), "a");
    assert_string_equal(pdgw_kv_list_get(&p->labels, "rack"), "r1");
    /* protocol attributes travel as opaque "key=value" lines */
    assert_string_equal(pdgw_kv_list_get(&p->attrs, "trt_port"), "9000");
    assert_string_equal(p->attrs_text, "trt_port=9000\nmode=fast\n");
    assert_int_equal(p->weight, 2);
    assert_string_equal(p->kv_host, "192.168.0.1");
    assert_int_equal(p->kv_port, 17000);
    assert_int_equal(p->bootstrap_port, 8998);
    assert_string_equal(p->engine_id, "eng-p0");
    assert_int_equal(p->alloc_ports.count, 2);
    assert_int_equal(p->alloc_ports.items[1], 7002);
    assert_int_equal(p->init_ports.items[0], 7101);
    assert_int_equal(p->tp_size, 2);
    assert_int_equal(p->dp_rank, 1);
    assert_int_equal(p->dp_size, 2);
    assert_string_equal(p->host, "10.0.0.1");
    assert_int_equal(p->port, 8100);
    const pdgw_instance_config_t *d = &c.instances[1];
    assert_string_equal(d->id, "10.0.0.2:8200"); /* derived from the url */
    assert_string_equal(d->kv_host, "10.0.0.2");
    assert_int_equal(d->role, PDGW_ROLE_DECODE);
    assert_int_equal(d->weight, 1);
    assert_int_equal(d->tp_size, 1);
    assert_true(c.dns_enabled);
    assert_string_equal(c.dns.prefill, "prefill.svc.cluster.local:8000");
    assert_int_equal(c.dns.interval_ms, 10000);
    assert_true(c.k8s_enabled);
    assert_string_equal(c.k8s.namespace_name, "llm");
    assert_string_equal(c.k8s.decode_selector, "app=vllm-decode");
    assert_string_equal(c.k8s.port_name, "api");
    assert_string_equal(c.k8s.ca_file, "/tmp/ca.crt");
    assert_int_equal(pdgw_config_check(&c, NULL, &err), PDGW_OK);
    pdgw_config_free(&c);
    unlink(path);
    free(path);
}

static void test_precedence(void **state)
{
    (void)state;
    char *path = write_tmp("listen: 127.0.0.1:1000\nworkers: 2\nprotocol: sglang\n"
                           "access_log: false\nrequest_timeout: 10s\nmax_body_bytes: 1KiB\n"
                           "api_keys: [file-key]\nlog_level: warn\n"
                           "protocol_options: {a: file, b: file}\n"
                           "discovery: {dns: {interval: 7s}}\n"
                           "instances:\n  - url: http://127.0.0.1:8100\n");
    /* file only */
    run_t r = {0};
    run_args(&r, NULL, NULL, "--config", path, NULL);
    if (r.st != PDGW_OK)
        fail_msg("%s", r.err.message);
    assert_int_equal(r.action, PDGW_CONFIG_RUN);
    assert_int_equal(r.cfg.listen_port, 1000);
    assert_int_equal(r.cfg.workers, 2);
    assert_string_equal(r.cfg.protocol, "sglang");
    assert_false(r.cfg.access_log);
    assert_int_equal(r.cfg.request_timeout_ms, 10000);
    assert_int_equal(r.cfg.max_body_bytes, 1024);
    assert_string_equal(r.cfg.api_keys.items[0], "file-key");
    assert_int_equal(r.cfg.log_level, PDGW_LOG_LEVEL_WARN);
    assert_int_equal(r.cfg.dns.interval_ms, 7000);
    assert_int_equal(r.cfg.retries, 1); /* default survives */
    run_free(&r);

    /* env over file (PDGW_CONFIG names the file) */
    char cfgvar[128];
    snprintf(cfgvar, sizeof(cfgvar), "PDGW_CONFIG=%s", path);
    char *env[] = {cfgvar,
                   "PDGW_LISTEN=127.0.0.1:2000",
                   "PDGW_WORKERS=4",
                   "PDGW_PROTOCOL=lmcache",
                   "PDGW_ACCESS_LOG=yes",
                   "PDGW_REQUEST_TIMEOUT=20s",
                   "PDGW_MAX_BODY_BYTES=2KiB",
                   "PDGW_API_KEYS=env-a, env-b",
                   "PDGW_LOG_LEVEL=error",
                   "PDGW_PROTOCOL_OPTIONS=b=env,c=env",
                   "PDGW_DISCOVERY_DNS_INTERVAL=8s",
                   "PDGW_BIN_DIR=/ignored",
                   "HOME=/root",
                   NULL};
    run_args(&r, env, NULL, NULL);
    if (r.st != PDGW_OK)
        fail_msg("%s", r.err.message);
    assert_int_equal(r.cfg.listen_port, 2000);
    assert_int_equal(r.cfg.workers, 4);
    assert_string_equal(r.cfg.protocol, "lmcache");
    assert_true(r.cfg.access_log);
    assert_int_equal(r.cfg.request_timeout_ms, 20000);
    assert_int_equal(r.cfg.max_body_bytes, 2048);
    assert_int_equal(r.cfg.api_keys.count, 2); /* env list replaces the file's list */
    assert_string_equal(r.cfg.api_keys.items[1], "env-b");
    assert_int_equal(r.cfg.log_level, PDGW_LOG_LEVEL_ERROR);
    /* protocol_options: env replaces the map as a whole (a is gone) */
    assert_null(pdgw_kv_list_get(&r.cfg.protocol_options, "a"));
    assert_string_equal(pdgw_kv_list_get(&r.cfg.protocol_options, "b"), "env");
    assert_int_equal(r.cfg.dns.interval_ms, 8000);
    run_free(&r);

    /* CLI over env over file */
    run_args(&r, env, NULL, "--listen", "[::1]:3000", "--workers=6", "--protocol", "vllm-nixl",
             "--no-access-log", "--request-timeout", "30s", "--max-body-bytes", "3KiB", "--api-key",
             "cli-1", "--api-key", "cli-2", "--api-key", "cli-3", "--log-level", "debug",
             "--protocol-opt", "c=cli", "--protocol-opt", "d=x=y", "--discovery-dns-interval", "9s",
             NULL);
    if (r.st != PDGW_OK)
        fail_msg("%s", r.err.message);
    assert_string_equal(r.cfg.listen_host, "::1");
    assert_int_equal(r.cfg.listen_port, 3000);
    assert_int_equal(r.cfg.workers, 6);
    assert_string_equal(r.cfg.protocol, "vllm-nixl");
    assert_false(r.cfg.access_log);
    assert_int_equal(r.cfg.request_timeout_ms, 30000);
    assert_int_equal(r.cfg.max_body_bytes, 3072);
    assert_int_equal(r.cfg.api_keys.count, 3);
    assert_string_equal(r.cfg.api_keys.items[0], "cli-1");
    assert_int_equal(r.cfg.log_level, PDGW_LOG_LEVEL_DEBUG);
    assert_string_equal(pdgw_kv_list_get(&r.cfg.protocol_options, "c"), "cli");
    assert_string_equal(pdgw_kv_list_get(&r.cfg.protocol_options, "d"), "x=y");
    assert_null(pdgw_kv_list_get(&r.cfg.protocol_options, "b"));
    assert_int_equal(r.cfg.dns.interval_ms, 9000);
    assert_int_equal(r.cfg.n_instances, 1); /* from the file */
    run_free(&r);

    /* --access-log=true form and -c short option */
    run_args(&r, NULL, NULL, "-c", path, "--access-log=true", NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_true(r.cfg.access_log);
    run_free(&r);
    unlink(path);
    free(path);
}

static void test_quick_start(void **state)
{
    (void)state;
    run_t r = {0};
    run_args(&r, NULL, NULL, "--listen", "127.0.0.1:8000", "--protocol", "vllm-kvt", "--prefill",
             "http://127.0.0.1:8100", "--prefill", "http://127.0.0.1:8101", "--decode",
             "https://dec.example:8443/", NULL);
    if (r.st != PDGW_OK)
        fail_msg("%s", r.err.message);
    assert_int_equal(r.cfg.n_instances, 3);
    assert_int_equal(r.cfg.instances[0].role, PDGW_ROLE_PREFILL);
    assert_string_equal(r.cfg.instances[1].id, "127.0.0.1:8101");
    assert_int_equal(r.cfg.instances[2].role, PDGW_ROLE_DECODE);
    assert_string_equal(r.cfg.instances[2].host, "dec.example");
    assert_int_equal(r.cfg.instances[2].port, 8443);
    assert_string_equal(r.cfg.instances[2].kv_host, "dec.example");
    run_free(&r);

    char *env[] = {"PDGW_BOTH=http://127.0.0.1:9001, http://127.0.0.1:9002", NULL};
    run_args(&r, env, NULL, "--both", "http://127.0.0.1:9003", NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_int_equal(r.cfg.n_instances, 3);
    assert_int_equal(r.cfg.instances[2].port, 9003);
    assert_int_equal(r.cfg.instances[0].role, PDGW_ROLE_BOTH);
    run_free(&r);

    run_args(&r, NULL, NULL, "--both", "127.0.0.1:8100", NULL);
    expect_error(&r, "instances[0].url", "--both", "http://", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--both", "http://a:1", "--both", "http://a:1", NULL);
    expect_error(&r, "instances[1].id", "duplicate instance id", NULL);
    run_free(&r);
}

static void test_yaml_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *key;
        int line;
        const char *frag;
    } cases[] = {
        {"listen: 1.2.3.4:80\nlisen: x\n", "lisen", 2, "did you mean 'listen'"},
        {"workers: many\n", "workers", 1, "expected an integer in 0..1024"},
        {"workers: 5000\n", "workers", 1, "0..1024"},
        {"scheduling: eager\n", "scheduling", 1, "expected one of batch, staged"},
        {"request_timeout: 10 parsecs\n", "request_timeout", 1, "duration"},
        {"request_timeout: 0\n", "request_timeout", 1, "at least"},
        {"max_body_bytes: lots\n", "max_body_bytes", 1, "16MiB"},
        {"access_log: sometimes\n", "access_log", 1, "true or false"},
        {"listen: 8000\n", "listen", 1, "host:port"},
        {"api_keys: sk-x\n", "api_keys", 1, "expected a list"},
        {"protocol_options: [a]\n", "protocol_options", 1, "mapping"},
        {"protocol_options:\n  a: [1, 2]\n", "protocol_options.a", 2, "scalar"},
        {"protocol: [neutral]\n", "protocol", 1, "expected a scalar"},
        {"discovery:\n  dns:\n    intervall: 5s\n", "discovery.dns.intervall", 3,
         "did you mean 'interval'"},
        {"discovery:\n  consul: {}\n", "discovery.consul", 2, "unknown key"},
        {"discovery: 5\n", "discovery", 1, "expected a mapping"},
        {"retries: 1\nretries: 2\n", "retries", 2, "duplicate key"},
        {"instances:\n  - url: http://a:1\n  - url: http://b:2\n    kv_port: abc\n",
         "instances[1].kv_port", 4, "0..65535"},
        {"instances:\n  - url: http://a:1\n    kv_prot: 5\n", "instances[0].kv_prot", 3,
         "did you mean 'kv_port'"},
        {"instances:\n  - url: http://a:1\n    role: leader\n", "instances[0].role", 3,
         "prefill, decode, both"},
        {"instances:\n  - role: prefill\n", "instances[0].url", 2, "missing required url"},
        {"instances:\n  - url: a:1\n", "instances[0].url", 2, "http://"},
        {"instances:\n  - http://a:1\n", "instances[0]", 2, "expected a mapping"},
        {"instances:\n  - url: http://a:1\n    alloc_ports: [1, x]\n",
         "instances[0].alloc_ports[1]", 3, "1..65535"},
        {"instances:\n  - url: http://a:1\n    zone: a\n    labels: {zone: b}\n",
         "instances[0].zone", 2, "contradicts"},
        {"instance:\n  - url: http://a:1\n", "instance", 1, "did you mean 'instances'"},
        {"- a\n- b\n", "", 1, "top level must be a mapping"},
        {"listen: [\n", "", 2, "YAML syntax error"},
        {"a: b\n---\nc: d\n", "a", 1, "unknown key"},
        {"workers: 1\n---\nworkers: 2\n", "", 3, "more than one YAML document"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pdgw_config_t c;
        pdgw_config_error_t err;
        memset(&err, 0, sizeof(err));
        assert_int_equal(pdgw_config_init(&c), PDGW_OK);
        pdgw_status_t st =
            pdgw_config_load_yaml(&c, cases[i].yaml, strlen(cases[i].yaml), "t.yaml", &err);
        if (st == PDGW_OK)
            fail_msg("case %zu accepted: %s", i, cases[i].yaml);
        if (strcmp(err.key, cases[i].key) != 0 || err.line != cases[i].line ||
            strstr(err.message, cases[i].frag) == NULL)
            fail_msg("case %zu: key '%s' line %d message '%s'", i, err.key, err.line, err.message);
        char where[32];
        snprintf(where, sizeof(where), "t.yaml:%d: ", cases[i].line);
        if (strncmp(err.message, where, strlen(where)) != 0)
            fail_msg("case %zu: message does not start with %s: %s", i, where, err.message);
        if (cases[i].key[0] != '\0') {
            char named[160];
            snprintf(named, sizeof(named), "%s: ", cases[i].key);
            if (strstr(err.message, named) == NULL)
                fail_msg("case %zu: message does not name %s: %s", i, cases[i].key, err.message);
        }
        pdgw_config_free(&c);
    }
}

static void test_cli_env_errors(void **state)
{
    (void)state;
    run_t r = {0};
    run_args(&r, NULL, NULL, "--retries", "many", NULL);
    expect_error(&r, "retries", "--retries: expected an integer in 0..10, got \"many\"", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--retires", "2", NULL);
    expect_error(&r, "", "unknown option '--retires'", "did you mean '--retries'", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--listen", NULL);
    expect_error(&r, "", "needs a value", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--scheduling", "eager", NULL);
    expect_error(&r, "scheduling", "--scheduling: expected one of batch, staged", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--protocol-opt", "novalue", NULL);
    expect_error(&r, "protocol_options", "expected key=value", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--both", "http://a:1", "stray", NULL);
    expect_error(&r, "", "unexpected argument 'stray'", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--access-log=perhaps", NULL);
    expect_error(&r, "access_log", "--access-log: expected true or false", NULL);
    run_free(&r);
    run_args(&r, NULL, NULL, "--config", "/nonexistent/pdgw.yaml", NULL);
    expect_error(&r, "", "/nonexistent/pdgw.yaml", "cannot open", NULL);
    run_free(&r);

    char *env[] = {"PDGW_IDLE_TIMEOUT=forever", NULL};
    run_args(&r, env, NULL, "--both", "http://a:1", NULL);
    expect_error(&r, "idle_timeout", "PDGW_IDLE_TIMEOUT: expected a duration", NULL);
    run_free(&r);
    char *env2[] = {"PDGW_DISCOVERY_DNS_PREFILL=nohost", NULL};
    run_args(&r, env2, NULL, NULL);
    expect_error(&r, "discovery.dns.prefill", "PDGW_DISCOVERY_DNS_PREFILL", "host:port", NULL);
    run_free(&r);
    /* unknown PDGW_ variables are only a warning */
    char *env3[] = {"PDGW_RETRYS=3", NULL};
    run_args(&r, env3, NULL, "--both", "http://a:1", NULL);
    assert_int_equal(r.st, PDGW_OK);
    run_free(&r);
}

/* A hook standing in for the forwarder registry. */
static pdgw_status_t test_proto(void *ctx, const pdgw_config_t *cfg, pdgw_protocol_info_t *info,
                                char *err, size_t errlen)
{
    int *calls = ctx;
    (*calls)++;
    if (strcmp(cfg->protocol, "myproto") == 0) {
        *info = (pdgw_protocol_info_t){.needs_decode = true, .supports_batch = true};
        return PDGW_OK;
    }
    snprintf(err, errlen, "no forwarder named \"%s\" is registered", cfg->protocol);
    return PDGW_ERR_NOT_FOUND;
}

static void test_check_config(void **state)
{
    (void)state;
    run_t r = {0};
    char *good = write_tmp("protocol: vllm-kvt\ninstances:\n"
                           "  - {url: \"http://127.0.0.1:8100\", role: prefill}\n"
                           "  - {url: \"http://127.0.0.1:8200\", role: decode}\n");
    run_args(&r, NULL, NULL, "--check-config", good, NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    assert_string_equal(r.out, "config OK\n");
    assert_string_equal(r.errout, "");
    run_free(&r);

    /* env and other flags do not leak into --check-config */
    char *env[] = {"PDGW_PROTOCOL=neutral", NULL};
    run_args(&r, env, NULL, "--check-config", good, "--protocol", "neutral", NULL);
    assert_int_equal(r.st, PDGW_OK);
    run_free(&r);

    static const struct {
        const char *yaml;
        const char *key;
        const char *frag;
    } bad[] = {
        {"protocol: vllm-kvt\ninstances:\n  - {url: \"http://a:1\", role: prefill}\n", "instances",
         "needs prefill and decode instances, but no decode"},
        {"protocol: sglang\n", "instances", "no prefill instance"},
        /* single-leg protocols need a decode-capable instance, as the registry's descriptor
         * says (no second protocol table in the config code) */
        {"protocol: neutral\ninstances:\n  - {url: \"http://a:1\", role: prefill}\n", "instances",
         "no decode or both instance"},
        {"protocol: nosuch\ninstances:\n  - {url: \"http://a:1\"}\n", "protocol",
         "unknown forwarder 'nosuch'"},
        {"instances:\n  - {url: \"http://a:1\", tp_size: 2, alloc_ports: [1]}\n",
         "instances[0].alloc_ports", "one port per TP rank"},
        {"instances:\n  - {url: \"http://a:1\", dp_rank: 2, dp_size: 2}\n", "instances[0].dp_rank",
         "below dp_size"},
        {"instances:\n  - {url: \"http://a:1\", id: x}\n  - {url: \"http://b:1\", id: x}\n",
         "instances[1].id", "duplicate"},
        {"api_key_file: /nonexistent/keys\ninstances:\n  - {url: \"http://a:1\"}\n", "api_key_file",
         "cannot read"},
        {"plugins: [/nonexistent/p.so]\ninstances:\n  - {url: \"http://a:1\"}\n", "plugins[0]",
         "cannot read"},
        {"health_timeout: 5s\nhealth_interval: 1s\ninstances:\n  - {url: \"http://a:1\"}\n",
         "health_timeout", "must not exceed"},
        {"api_keys: [\"a b\"]\ninstances:\n  - {url: \"http://a:1\"}\n", "api_keys[0]", "blanks"},
        {"workers: x\n", "workers", "expected an integer"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = write_tmp(bad[i].yaml);
        run_args(&r, NULL, NULL, "--check-config", path, NULL);
        if (r.st == PDGW_OK)
            fail_msg("case %zu accepted", i);
        assert_int_equal(r.action, PDGW_CONFIG_RUN);
        assert_string_equal(r.out, "");
        if (strcmp(r.err.key, bad[i].key) != 0 || strstr(r.errout, bad[i].frag) == NULL)
            fail_msg("case %zu: key '%s' printed '%s'", i, r.err.key, r.errout);
        run_free(&r);
        unlink(path);
        free(path);
    }

    /* discovery satisfies the role requirement */
    char *disc = write_tmp("protocol: vllm-kvt\ndiscovery:\n  kubernetes:\n"
                           "    prefill_selector: app=p\n    decode_selector: app=d\n");
    run_args(&r, NULL, NULL, "--check-config", disc, NULL);
    assert_int_equal(r.st, PDGW_OK);
    run_free(&r);

    /* a hook decides about protocols (plugins) */
    int calls = 0;
    pdgw_config_hooks_t hooks = {.protocol_info = test_proto, .ctx = &calls};
    char *mine = write_tmp("protocol: myproto\nscheduling: staged\ninstances:\n"
                           "  - {url: \"http://a:1\", role: decode}\n");
    run_args(&r, NULL, &hooks, "--check-config", mine, NULL);
    expect_error(&r, "scheduling", "does not support staged", NULL);
    assert_int_equal(calls, 1);
    run_free(&r);
    run_args(&r, NULL, &hooks, "--config", mine, "--scheduling", "batch", NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_int_equal(r.action, PDGW_CONFIG_RUN);
    run_free(&r);
    run_args(&r, NULL, &hooks, "--config", mine, "--protocol", "other", NULL);
    expect_error(&r, "protocol", "no forwarder named \"other\"", NULL);
    run_free(&r);

    unlink(mine);
    unlink(disc);
    unlink(good);
    free(mine);
    free(disc);
    free(good);
}

static void test_help_version(void **state)
{
    (void)state;
    run_t r = {0};
    run_args(&r, NULL, NULL, "--help", NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        char flag[96];
        snprintf(flag, sizeof(flag), "  --%s", tab[i].flag);
        if (strstr(r.out, flag) == NULL)
            fail_msg("--help lacks %s", flag);
        if (tab[i].env != NULL && strstr(r.out, tab[i].env) == NULL)
            fail_msg("--help lacks %s", tab[i].env);
        if (tab[i].type == PDGW_OPT_BOOL) {
            snprintf(flag, sizeof(flag), "--no-%s", tab[i].flag);
            assert_non_null(strstr(r.out, flag));
        }
    }
    const pdgw_config_option_t *itab = pdgw_config_instance_options(&n);
    for (size_t i = 0; i < n; i++)
        assert_non_null(strstr(r.out, itab[i].key));
    assert_non_null(strstr(r.out, "default 16MiB"));
    assert_non_null(strstr(r.out, "one of batch|staged"));
    run_free(&r);

    run_args(&r, NULL, NULL, "-h", NULL);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    run_free(&r);

    /* Found by fuzz_pdgw_config: "-hhh" is several options in one argument, and the option
     * list was sized by argument count (heap overflow under ASan). */
    run_args(&r, NULL, NULL, "-hhhhhhhhhhhhhhhh", "-VhVhVhVh", NULL);
    assert_int_equal(r.st, PDGW_OK);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    run_free(&r);
    run_args(&r, NULL, NULL, "--version", NULL);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    assert_string_equal(r.out, "pdgw " PDGW_VERSION_STRING "\n");
    run_free(&r);
}

static void test_print_roundtrip(void **state)
{
    (void)state;
    char *path = write_tmp(full_yaml);
    run_t r = {0};
    run_args(&r, NULL, NULL, "--config", path, "--print-config", "--protocol-opt",
             "q=\"quoted\" \\ value", NULL);
    if (r.st != PDGW_OK)
        fail_msg("%s", r.err.message);
    assert_int_equal(r.action, PDGW_CONFIG_EXIT);
    assert_non_null(strstr(r.out, "api_keys: [\"***\", \"***\"]"));
    assert_null(strstr(r.out, "sk-one"));
    /* reload what was printed: same effective values */
    pdgw_config_t c;
    pdgw_config_error_t err;
    assert_int_equal(pdgw_config_init(&c), PDGW_OK);
    if (pdgw_config_load_yaml(&c, r.out, strlen(r.out), "printed", &err) != PDGW_OK)
        fail_msg("%s\n%s", err.message, r.out);
    assert_string_equal(c.listen, r.cfg.listen);
    assert_int_equal(c.request_timeout_ms, r.cfg.request_timeout_ms);
    assert_int_equal(c.connect_timeout_ms, 500);
    assert_int_equal(c.max_body_bytes, r.cfg.max_body_bytes);
    assert_int_equal(c.scheduling, r.cfg.scheduling);
    assert_int_equal(c.n_instances, r.cfg.n_instances);
    assert_string_equal(c.instances[0].engine_id, "eng-p0");
    assert_int_equal(c.instances[0].init_ports.items[1], 7102);
    assert_string_equal(pdgw_kv_list_get(&c.instances[0].labels, "rack"), "r1");
    assert_string_equal(pdgw_kv_list_get(&c.protocol_options, "q"), "\"quoted\" \\ value");
    assert_string_equal(c.k8s.api_server, "https://10.96.0.1:443");
    assert_int_equal(c.dns.interval_ms, 10000);
    pdgw_config_free(&c);
    run_free(&r);
    unlink(path);
    free(path);
}

static void test_examples(void **state)
{
    (void)state;
    /* tests/unit/gateway/test_config.c -> <root>/deploy/examples */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", __FILE__);
    char *cut = strstr(dir, "tests/unit/gateway/");
    assert_non_null(cut);
    snprintf(cut, sizeof(dir) - (size_t)(cut - dir), "deploy/examples");
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("cannot open %s", dir);
    int checked = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".yaml") != 0)
            continue;
        char path[1400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        run_t r = {0};
        run_args(&r, NULL, NULL, "--check-config", path, NULL);
        if (r.st != PDGW_OK)
            fail_msg("%s: %s", e->d_name, r.errout);
        assert_string_equal(r.out, "config OK\n");
        run_free(&r);
        checked++;
    }
    closedir(d);
    assert_true(checked >= 9);
}

static void test_mutations(void **state)
{
    (void)state;
    /* Damaged files never crash, hang or leak: each is loaded or refused with a message. */
    static const char alphabet[] = ":-[]{}#&*!|>'\"\n %@`,?~0a\t\\";
    size_t len = strlen(full_yaml);
    char *buf = malloc(len + 1);
    uint32_t seed = 12345;
    int refused = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, full_yaml, len + 1);
        size_t cut = len;
        int nmut = 1 + iter % 3;
        for (int m = 0; m < nmut; m++) {
            seed = seed * 1103515245u + 12345u;
            size_t pos = (seed >> 8) % len;
            seed = seed * 1103515245u + 12345u;
            buf[pos] = alphabet[(seed >> 8) % (sizeof(alphabet) - 1)];
        }
        if (iter % 5 == 0) {
            seed = seed * 1103515245u + 12345u;
            cut = (seed >> 8) % len;
        }
        pdgw_config_t c;
        pdgw_config_error_t err;
        memset(&err, 0, sizeof(err));
        assert_int_equal(pdgw_config_init(&c), PDGW_OK);
        pdgw_status_t st = pdgw_config_load_yaml(&c, buf, cut, "m.yaml", &err);
        if (st != PDGW_OK) {
            assert_true(st == PDGW_ERR_INVALID || st == PDGW_ERR_PARSE);
            assert_true(strncmp(err.message, "m.yaml:", 7) == 0);
            refused++;
        } else {
            (void)pdgw_config_check(&c, NULL, &err);
        }
        pdgw_config_free(&c);
    }
    free(buf);
    assert_true(refused > 500);
}

static void test_load_oom(void **state)
{
    (void)state;
    /* Fail every allocation in turn while loading the full file: clean error, no leak. */
    int failures = 0;
    for (long n = 1;; n++) {
        pdgw_config_t c;
        pdgw_config_error_t err;
        memset(&err, 0, sizeof(err));
        pdgw_alloc_fail_at(n, 0);
        pdgw_status_t st = pdgw_config_init(&c);
        if (st == PDGW_OK)
            st = pdgw_config_load_yaml(&c, full_yaml, strlen(full_yaml), "oom", &err);
        pdgw_alloc_fail_at(0, 0);
        if (st == PDGW_OK) {
            assert_int_equal(c.n_instances, 2);
            pdgw_config_free(&c);
            break;
        }
        assert_int_equal(st, PDGW_ERR_NOMEM);
        failures++;
        pdgw_config_free(&c);
        assert_true(n < 5000);
    }
    assert_true(failures > 50);
}

int main(void)
{
    pdgw_log_set_level(PDGW_LOG_LEVEL_ERROR); /* keep warnings of negative tests quiet */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),        cmocka_unit_test(test_full_yaml),
        cmocka_unit_test(test_precedence),      cmocka_unit_test(test_quick_start),
        cmocka_unit_test(test_yaml_errors),     cmocka_unit_test(test_cli_env_errors),
        cmocka_unit_test(test_check_config),    cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_print_roundtrip), cmocka_unit_test(test_examples),
        cmocka_unit_test(test_load_oom),        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
