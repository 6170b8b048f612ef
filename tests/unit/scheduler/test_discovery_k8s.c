/*
 * Kubernetes discovery: EndpointSlice / watch event / annotation parsing,
 * descriptor building, and the back-end's configuration checks. The
 * list/watch client runs end to end against a fake API server in
 * tests/integration/deploy/test_k8s_discovery.py.
 */
#include <unistd.h>

#include "sched_test_util.h"

#include "sched_discovery_k8s_int.h"

static json_t *load(const char *text)
{
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (j == NULL) {
        fail_msg("test JSON does not parse: %s: %s", jerr.text, text);
    }
    return j;
}

static const char *SLICE_OK =
    "{\"metadata\": {\"name\": \"vllm-prefill-abc12\", \"resourceVersion\": \"42\","
    "  \"labels\": {\"kubernetes.io/service-name\": \"vllm-prefill\"}},"
    " \"addressType\": \"IPv4\","
    " \"ports\": [{\"name\": \"kv\", \"port\": 28000}, {\"name\": \"http\", \"port\": 8100},"
    "            {\"name\": \"bootstrap\", \"port\": 8998}, {\"name\": \"all\", \"port\": null}],"
    " \"endpoints\": ["
    "  {\"addresses\": [\"10.0.0.5\"], \"conditions\": {\"ready\": true},"
    "   \"targetRef\": {\"kind\": \"Pod\", \"name\": \"vllm-prefill-0\"},"
    "   \"zone\": \"us-east-1a\", \"nodeName\": \"node-7\"},"
    "  {\"addresses\": [\"10.0.0.6\"], \"conditions\": {\"ready\": false}},"
    "  {\"addresses\": [\"10.0.0.7\"],"
    "   \"conditions\": {\"ready\": true, \"serving\": true, \"terminating\": true},"
    "   \"targetRef\": {\"kind\": \"Pod\", \"name\": \"vllm-prefill-2\"}},"
    "  {\"addresses\": [\"10.0.0.8\"]},"
    "  {\"addresses\": []}"
    " ]}";

static void test_slice_parse_ok(void **state)
{
    json_t *j = load(SLICE_OK);
    sched_k8s_slice_t s;
    char err[256] = "";

    (void)state;
    assert_int_equal(sched_k8s_slice_parse(j, "http", &s, err, sizeof(err)), SCHED_OK);
    assert_string_equal(s.name, "vllm-prefill-abc12");
    assert_string_equal(s.service, "vllm-prefill");
    assert_false(s.port_missing);
    assert_int_equal(s.n_eps, 4); /* the one without addresses is skipped */

    assert_string_equal(s.eps[0].id, "vllm-prefill-0");
    assert_string_equal(s.eps[0].host, "10.0.0.5");
    assert_int_equal(s.eps[0].port, 8100);
    assert_int_equal(s.eps[0].kv_port, 28000);
    assert_int_equal(s.eps[0].bootstrap_port, 8998);
    assert_true(s.eps[0].ready);
    assert_string_equal(s.eps[0].zone, "us-east-1a");
    assert_string_equal(s.eps[0].node, "node-7");

    /* No pod reference: id from address and port. */
    assert_string_equal(s.eps[1].id, "10.0.0.6-8100");
    assert_false(s.eps[1].ready);

    /* Terminating wins over ready. */
    assert_true(s.eps[2].terminating);
    assert_false(s.eps[2].ready);

    /* Conditions absent: ready per the API's "unknown means ready". */
    assert_true(s.eps[3].ready);
    assert_false(s.eps[3].terminating);

    assert_string_equal(sched_k8s_resource_version(j), "42");
    sched_k8s_slice_clear(&s);
    assert_null(s.eps);
    json_decref(j);
}

static void test_slice_port_missing(void **state)
{
    json_t *j = load(SLICE_OK);
    sched_k8s_slice_t s;

    (void)state;
    assert_int_equal(sched_k8s_slice_parse(j, "openai", &s, NULL, 0), SCHED_OK);
    assert_true(s.port_missing);
    assert_int_equal(s.n_eps, 0);
    sched_k8s_slice_clear(&s);
    json_decref(j);
}

static void test_slice_ipv6_url_and_id(void **state)
{
    json_t *j = load("{\"metadata\": {\"name\": \"s6\"}, \"addressType\": \"IPv6\","
                     " \"ports\": [{\"name\": \"http\", \"port\": 8000}],"
                     " \"endpoints\": [{\"addresses\": [\"fd00::1\"]}]}");
    sched_k8s_slice_t s;
    sched_instance_desc_t d;
    char url[300];

    (void)state;
    assert_int_equal(sched_k8s_slice_parse(j, "http", &s, NULL, 0), SCHED_OK);
    assert_int_equal(s.n_eps, 1);
    assert_string_equal(s.eps[0].id, "fd00..1-8000"); /* path-safe */
    sched_k8s_endpoint_desc(&s.eps[0], NULL, SCHED_ROLE_DECODE, s.service, url, sizeof(url), &d);
    assert_string_equal(d.url, "http://[fd00::1]:8000");
    assert_int_equal(d.role, SCHED_ROLE_DECODE);
    assert_int_equal(d.source, SCHED_SOURCE_K8S);
    assert_int_equal(sched_instance_desc_validate(&d, NULL, 0), SCHED_OK);
    sched_k8s_slice_clear(&s);
    json_decref(j);
}

/* A pod name that is not a DNS-1123 name (it would reach the pod lookup URL and the admin
 * paths) is not used: the endpoint keeps its address-based id and no pod is looked up. */
static void test_slice_unsafe_pod_name(void **state)
{
    static const char *const bad[] = {"../../secrets", "a/b", "x?watch=1", "Upper", "-lead"};
    char text[512];
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sched_k8s_slice_t s;
        json_t *j;
        snprintf(text, sizeof(text),
                 "{\"metadata\": {\"name\": \"s7\"}, \"addressType\": \"IPv4\","
                 " \"ports\": [{\"name\": \"http\", \"port\": 8000}],"
                 " \"endpoints\": [{\"addresses\": [\"10.0.0.7\"],"
                 " \"targetRef\": {\"kind\": \"Pod\", \"name\": \"%s\"}}]}",
                 bad[i]);
        j = load(text);
        assert_int_equal(sched_k8s_slice_parse(j, "http", &s, NULL, 0), SCHED_OK);
        assert_int_equal(s.n_eps, 1);
        assert_string_equal(s.eps[0].pod, "");
        assert_string_equal(s.eps[0].id, "10.0.0.7-8000");
        sched_k8s_slice_clear(&s);
        json_decref(j);
    }
}

/* Each of these must be refused with an error message, never crash. */
static void test_slice_parse_rejects(void **state)
{
    static const char *const bad[] = {
        "[]",
        "{}",
        "{\"metadata\": {\"name\": 5}}",
        "{\"metadata\": {\"name\": \"\"}}",
        "{\"metadata\": {\"name\": \"s\"}, \"addressType\": \"IPX\"}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": {}}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [7]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 0}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 70000}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": \"80\"}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": {}}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [5]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [{\"addresses\": [7]}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [{\"addresses\": [\"10.0.0.1/evil\"]}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [{\"addresses\": [\"h@x\"]}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [{\"addresses\": [\"10.0.0.1\"], \"conditions\": {\"ready\": \"yes\"}}]}",
        "{\"metadata\": {\"name\": \"s\"}, \"ports\": [{\"name\": \"http\", \"port\": 80}],"
        " \"endpoints\": [{\"addresses\": [\"10.0.0.1\"], \"conditions\": []}]}",
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = load(bad[i]);
        sched_k8s_slice_t s;
        char err[256] = "";
        memset(&s, 0x5a, sizeof(s));
        if (sched_k8s_slice_parse(j, "http", &s, err, sizeof(err)) != SCHED_ERR_INVALID) {
            fail_msg("accepted: %s", bad[i]);
        }
        assert_true(err[0] != '\0');
        assert_int_equal(((unsigned char *)&s)[0], 0x5a); /* output untouched */
        json_decref(j);
    }
}

static void test_slice_parse_alloc_failure(void **state)
{
    json_t *j = load(SLICE_OK);
    sched_k8s_slice_t s;

    (void)state;
    sched_alloc_fail_after(0);
    assert_int_equal(sched_k8s_slice_parse(j, "http", &s, NULL, 0), SCHED_ERR_NO_MEMORY);
    sched_alloc_fail_after(-1);
    json_decref(j);
}

static void test_annotations(void **state)
{
    json_t *ann = load("{\"pdgw.io/kv-port\": \"28001\","
                       " \"sglang.ai/bootstrap-port\": \"8998\","
                       " \"pdgw.io/engine-id\": \"engine-x\","
                       " \"pdgw.io/init-ports\": \"7300,7301\","
                       " \"pdgw.io/alloc-ports\": \"7400, 7401\","
                       " \"pdgw.io/tp-size\": \"2\","
                       " \"pdgw.io/dp-rank\": \"1\", \"pdgw.io/dp-size\": \"4\","
                       " \"pdgw.io/weight\": \"3\","
                       " \"pdgw.io/kv-host\": \"10.1.2.3\","
                       " \"pdgw.io/kv-engine\": \"libkvt\","
                       " \"pdgw.io/models\": \"llama-8b, llama-8b-chat\","
                       " \"pdgw.io/something-else\": \"whatever\","
                       " \"app\": \"vllm\"}");
    sched_k8s_kv_t kv;
    char err[256];

    (void)state;
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, err, sizeof(err)), 0);
    assert_true(kv.has_kv_port && kv.kv_port == 28001);
    assert_true(kv.has_bootstrap_port && kv.bootstrap_port == 8998);
    assert_string_equal(kv.engine_id, "engine-x");
    assert_int_equal(kv.n_init_ports, 2);
    assert_int_equal(kv.init_ports[1], 7301);
    assert_int_equal(kv.n_alloc_ports, 2);
    assert_int_equal(kv.alloc_ports[0], 7400);
    assert_int_equal(kv.tp_size, 2);
    assert_int_equal(kv.dp_rank, 1);
    assert_int_equal(kv.dp_size, 4);
    assert_int_equal(kv.weight, 3);
    assert_string_equal(kv.kv_host, "10.1.2.3");
    assert_int_equal(kv.kv_engine, SCHED_KV_ENGINE_LIBKVT);
    assert_int_equal(kv.n_models, 2);
    assert_string_equal(kv.models[0], "llama-8b");
    assert_string_equal(kv.models[1], "llama-8b-chat");
    json_decref(ann);

    /* pdgw.io/models: an empty name is invalid and names nothing */
    ann = load("{\"pdgw.io/models\": \"a,,b\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 1);
    assert_int_equal(kv.n_models, 0);
    json_decref(ann);

    /* pdgw.io/kv-engine: lmcache (the default) or libkvt; anything else is invalid. */
    ann = load("{\"pdgw.io/kv-engine\": \"lmcache\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);
    assert_int_equal(kv.kv_engine, SCHED_KV_ENGINE_UPSTREAM);
    json_decref(ann);
    ann = load("{\"pdgw.io/kv-engine\": \"LIBKVT\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 1);
    assert_int_equal(kv.kv_engine, SCHED_KV_ENGINE_UPSTREAM);
    json_decref(ann);

    /* pdgw.io/bootstrap-port wins over SGLang's annotation, in any order. */
    ann = load("{\"pdgw.io/bootstrap-port\": \"9000\", \"sglang.ai/bootstrap-port\": \"8998\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);
    assert_int_equal(kv.bootstrap_port, 9000);
    json_decref(ann);
    ann = load("{\"sglang.ai/bootstrap-port\": \"8998\", \"pdgw.io/bootstrap-port\": \"9000\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);
    assert_int_equal(kv.bootstrap_port, 9000);
    json_decref(ann);

    /* Invalid values are counted and skipped, the valid ones kept. */
    ann = load("{\"pdgw.io/kv-port\": \"99999\", \"pdgw.io/tp-size\": \"two\","
               " \"pdgw.io/init-ports\": \"7300,,x\", \"pdgw.io/engine-id\": \"\","
               " \"pdgw.io/kv-host\": \"a/b\", \"pdgw.io/weight\": 5,"
               " \"pdgw.io/dp-rank\": \"4\", \"pdgw.io/dp-size\": \"4\","
               " \"sglang.ai/bootstrap-port\": \"8998 \"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, err, sizeof(err)), 7);
    assert_true(strstr(err, "invalid annotation") != NULL);
    assert_false(kv.has_kv_port);
    assert_false(kv.has_tp_size);
    assert_int_equal(kv.n_init_ports, 0);
    assert_false(kv.has_engine_id);
    assert_false(kv.has_kv_host);
    assert_false(kv.has_weight);
    assert_false(kv.has_dp_rank); /* rank must be below size */
    assert_true(kv.has_dp_size);
    assert_true(kv.has_bootstrap_port); /* trailing blank tolerated */
    json_decref(ann);

    /* No annotations at all. */
    assert_int_equal(sched_k8s_kv_from_annotations(NULL, &kv, NULL, 0), 0);
    assert_false(kv.has_kv_port);
}

/* KV-event endpoints from pod annotations, spelt as vLLM's --kv-events-config
 * spells them (vllm-project/vllm vllm/config/kv_events.py: endpoint
 * endpoint "tcp://HOST:5557" with HOST "*", replay_endpoint; the publisher binds the wildcard): the
 * wildcard host becomes the endpoint's address, anything else stays. */
static void test_kv_events_annotations(void **state)
{
    json_t *j = load(SLICE_OK);
    json_t *ann = load("{\"pdgw.io/kv-events-endpoint\": \"tcp://*:5557\","
                       " \"pdgw.io/kv-events-replay-endpoint\": \"tcp://0.0.0.0:5558\"}");
    sched_k8s_slice_t s;
    sched_k8s_kv_t kv;
    sched_instance_desc_t d;
    char url[300];

    (void)state;
    assert_int_equal(sched_k8s_slice_parse(j, "http", &s, NULL, 0), SCHED_OK);
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);
    sched_k8s_endpoint_desc(&s.eps[0], &kv, SCHED_ROLE_DECODE, s.service, url, sizeof(url), &d);
    assert_string_equal(d.kv_events_endpoint, "tcp://10.0.0.5:5557");
    assert_string_equal(d.kv_events_replay_endpoint, "tcp://10.0.0.5:5558");
    assert_int_equal(sched_instance_desc_validate(&d, NULL, 0), SCHED_OK);
    json_decref(ann);

    /* A named host stays as given; no replay annotation, no replay endpoint. */
    ann = load("{\"pdgw.io/kv-events-endpoint\": \"tcp://events.svc:6000\"}");
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);
    sched_k8s_endpoint_desc(&s.eps[0], &kv, SCHED_ROLE_DECODE, s.service, url, sizeof(url), &d);
    assert_string_equal(d.kv_events_endpoint, "tcp://events.svc:6000");
    assert_null(d.kv_events_replay_endpoint);
    json_decref(ann);

    /* Not an endpoint a subscriber in another pod can use: refused, counted, not set. */
    {
        static const char *const bad[] = {"5557",          "tcp://*",       "tcp://*:0",
                                          "tcp://*:70000", "ipc:///tmp/kv", "tcp://a b:1",
                                          "tcp://h:1/x",   "tcp://u@h:5557"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            json_t *a = json_pack("{s:s}", "pdgw.io/kv-events-endpoint", bad[i]);
            char err[256];
            assert_int_equal(sched_k8s_kv_from_annotations(a, &kv, err, sizeof(err)), 1);
            assert_non_null(strstr(err, "kv-events-endpoint"));
            sched_k8s_endpoint_desc(&s.eps[0], &kv, SCHED_ROLE_DECODE, s.service, url, sizeof(url),
                                    &d);
            assert_null(d.kv_events_endpoint);
            json_decref(a);
        }
    }
    sched_k8s_slice_clear(&s);
    json_decref(j);
}

static void test_endpoint_desc(void **state)
{
    json_t *j = load(SLICE_OK);
    json_t *ann = load("{\"pdgw.io/kv-port\": \"28001\", \"pdgw.io/engine-id\": \"e0\"}");
    sched_k8s_slice_t s;
    sched_k8s_kv_t kv;
    sched_instance_desc_t d;
    char url[300];
    size_t i;
    bool node = false, service = false;

    (void)state;
    assert_int_equal(sched_k8s_slice_parse(j, "http", &s, NULL, 0), SCHED_OK);
    assert_int_equal(sched_k8s_kv_from_annotations(ann, &kv, NULL, 0), 0);

    /* Named ports only. */
    sched_k8s_endpoint_desc(&s.eps[0], NULL, SCHED_ROLE_PREFILL, s.service, url, sizeof(url), &d);
    assert_string_equal(d.id, "vllm-prefill-0");
    assert_string_equal(d.url, "http://10.0.0.5:8100");
    assert_int_equal(d.kv_port, 28000);
    assert_int_equal(d.bootstrap_port, 8998);
    assert_string_equal(d.zone, "us-east-1a");
    for (i = 0; i < d.n_labels; i++) {
        node |= strcmp(d.labels[i].key, "node") == 0 && strcmp(d.labels[i].value, "node-7") == 0;
        service |= strcmp(d.labels[i].key, "service") == 0 &&
                   strcmp(d.labels[i].value, "vllm-prefill") == 0;
    }
    assert_true(node && service);
    assert_int_equal(sched_instance_desc_validate(&d, NULL, 0), SCHED_OK);

    /* Annotations win over named ports. */
    sched_k8s_endpoint_desc(&s.eps[0], &kv, SCHED_ROLE_PREFILL, s.service, url, sizeof(url), &d);
    assert_int_equal(d.kv_port, 28001);
    assert_int_equal(d.bootstrap_port, 8998);
    assert_string_equal(d.engine_id, "e0");

    sched_k8s_slice_clear(&s);
    json_decref(ann);
    json_decref(j);
}

static void test_event_parse(void **state)
{
    static const struct {
        const char *text;
        sched_status_t status;
        sched_k8s_event_type_t type;
    } cases[] = {
        {"{\"type\": \"ADDED\", \"object\": {}}", SCHED_OK, K8S_EVENT_ADDED},
        {"{\"type\": \"MODIFIED\", \"object\": {}}", SCHED_OK, K8S_EVENT_MODIFIED},
        {"{\"type\": \"DELETED\", \"object\": {}}", SCHED_OK, K8S_EVENT_DELETED},
        {"{\"type\": \"BOOKMARK\", \"object\": {}}", SCHED_OK, K8S_EVENT_BOOKMARK},
        {"{\"type\": \"ERROR\", \"object\": {\"code\": 410}}", SCHED_OK, K8S_EVENT_ERROR},
        {"{\"type\": \"RENAMED\", \"object\": {}}", SCHED_ERR_INVALID, 0},
        {"{\"type\": \"ADDED\"}", SCHED_ERR_INVALID, 0},
        {"{\"type\": \"ADDED\", \"object\": []}", SCHED_ERR_INVALID, 0},
        {"{\"object\": {}}", SCHED_ERR_INVALID, 0},
        {"[1, 2]", SCHED_ERR_INVALID, 0},
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = load(cases[i].text);
        sched_k8s_event_type_t type;
        const json_t *obj = NULL;
        assert_int_equal(sched_k8s_event_parse(j, &type, &obj, NULL, 0), cases[i].status);
        if (cases[i].status == SCHED_OK) {
            assert_int_equal(type, cases[i].type);
            assert_non_null(obj);
            if (type == K8S_EVENT_ERROR) {
                assert_int_equal(sched_k8s_status_code(obj), 410);
            }
        }
        json_decref(j);
    }
}

/* The back-end refuses a configuration it cannot work with, and builds and
 * frees its state for a good one (no thread started here). */
static void test_create_config(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    const sched_discovery_ops_t *ops = sched_discovery_find("kubernetes");
    sched_config_t cfg;
    void *st = NULL;
    char dir[] = "/tmp/pdsched-k8s-XXXXXX";
    char token[64], ns[64];
    FILE *f;

    (void)state;
    assert_non_null(ops);
    assert_ptr_equal(ops, &sched_discovery_k8s_ops);
    assert_int_equal(ops->source, SCHED_SOURCE_K8S);
    assert_non_null(mkdtemp(dir));
    snprintf(token, sizeof(token), "%s/token", dir);
    snprintf(ns, sizeof(ns), "%s/namespace", dir);

    test_config(&cfg, SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    assert_false(ops->configured(&cfg));
    cfg.kubernetes.decode_selector = "app=vllm-decode";
    assert_true(ops->configured(&cfg));

    /* Outside a pod, without api_server: refused. */
    unsetenv("KUBERNETES_SERVICE_HOST");
    cfg.kubernetes.token_file = token;
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_ERR_INVALID);
    assert_null(st);

    /* api_server that is not http(s). */
    cfg.kubernetes.api_server = "ftp://example";
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_ERR_INVALID);

    /* No namespace configured and no namespace file beside the token. */
    cfg.kubernetes.api_server = "http://127.0.0.1:1";
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_ERR_INVALID);

    /* The namespace file is read (trailing newline trimmed). */
    f = fopen(ns, "w");
    assert_non_null(f);
    fputs("team-a\n", f);
    fclose(f);
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_OK);
    assert_non_null(st);
    if (ops->metrics_text != NULL) {
        char *text = ops->metrics_text(st);
        assert_non_null(text);
        assert_non_null(strstr(text, "pdgw_discovery_k8s_lists_total{role=\"decode\","
                                     "cause=\"initial\"} 0"));
        assert_null(strstr(text, "role=\"prefill\""));
        free(text);
    }
    ops->destroy(st);
    st = NULL;

    /* A namespace that cannot go into a URL path. */
    cfg.kubernetes.namespace_ = "a/b";
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_ERR_INVALID);

    /* In a pod: the API server comes from the service environment. */
    cfg.kubernetes.namespace_ = "default";
    cfg.kubernetes.api_server = "";
    setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    assert_int_equal(ops->create(&cfg, pool, &st), SCHED_OK);
    ops->destroy(st);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");

    /* Allocation failures anywhere in create unwind cleanly. */
    for (long n = 0; n < 12; n++) {
        st = NULL;
        cfg.kubernetes.api_server = "http://127.0.0.1:1";
        sched_alloc_fail_after(n);
        sched_status_t status = ops->create(&cfg, pool, &st);
        sched_alloc_fail_after(-1);
        if (status == SCHED_OK) {
            ops->destroy(st);
        } else {
            assert_int_equal(status, SCHED_ERR_NO_MEMORY);
            assert_null(st);
        }
    }

    unlink(ns);
    rmdir(dir);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice_parse_ok),
        cmocka_unit_test(test_slice_port_missing),
        cmocka_unit_test(test_slice_ipv6_url_and_id),
        cmocka_unit_test(test_slice_unsafe_pod_name),
        cmocka_unit_test(test_slice_parse_rejects),
        cmocka_unit_test(test_slice_parse_alloc_failure),
        cmocka_unit_test(test_annotations),
        cmocka_unit_test(test_endpoint_desc),
        cmocka_unit_test(test_kv_events_annotations),
        cmocka_unit_test(test_event_parse),
        cmocka_unit_test(test_create_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
