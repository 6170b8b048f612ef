/*
 * test_doctor.c - the engine doctor's own logic, without engines (pdgw_doctor*.c): what a
 * kv_events_endpoint names and the connect/connect diagnosis, the verdicts from what
 * listening to a publisher saw (block sizes, undecodable batches, DP rank against the port),
 * mixed block sizes across a model's instances, `models:` nobody serves, the models and
 * metrics verdicts on an engine's answers, and the table and --json rendering.
 *
 * Upstream facts checked here, from vllm-project/vllm vllm/distributed/kv_events.py
 * (ZmqEventPublisher): the PUB socket binds when the endpoint holds "*" or "::" or is ipc://
 * / inproc://, else it connects (so pdgw, which connects too, finds nobody listening); DP
 * rank r publishes on the endpoint's port + r (offset_endpoint_port); a batch without
 * data_parallel_rank comes from an engine that did not set one (rank 0). Gauge names: the
 * scheduler's table (pdsched/engine_metrics.h; vllm/v1/metrics/loggers.py, SGLang
 * python/sglang/srt/metrics/collector.py).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "pdgw_alloc.h"
#include "pdgw_doctor_int.h"

typedef struct fixture {
    pdgw_config_t cfg;
    pdgw_doctor_opts_t opts;
    doc_run_t run;
    sched_instance_desc_t desc[3];
    doc_target_t t[3];
} fixture_t;

static int setup(void **state)
{
    static const char *const ids[3] = {"p0", "d0", "d1"};
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(pdgw_config_init(&f->cfg), PDGW_OK);
    f->opts = (pdgw_doctor_opts_t){.cfg = &f->cfg, .timeout_ms = 500, .stop_fd = -1};
    f->run.opts = &f->opts;
    f->run.rep = doc_report_new(3);
    f->run.protocol = "neutral";
    assert_non_null(f->run.rep);
    for (size_t i = 0; i < 3; i++) {
        f->t[i].index = i;
        f->t[i].view.id = ids[i];
        f->t[i].desc = &f->desc[i];
        f->desc[i].role = i == 0 ? SCHED_ROLE_PREFILL : SCHED_ROLE_DECODE;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    for (size_t i = 0; i < 3; i++) {
        for (size_t j = 0; j < f->t[i].n_served; j++)
            pdgw_free(f->t[i].served[j]);
    }
    pdgw_doctor_report_free(f->run.rep);
    pdgw_config_free(&f->cfg);
    free(f);
    return 0;
}

/* The row of <inst> and <check> (the only one), or NULL. */
static const pdgw_doctor_row_t *row_of(const fixture_t *f, const char *inst, const char *check)
{
    size_t n, i;
    const pdgw_doctor_row_t *rows = pdgw_doctor_rows(f->run.rep, &n), *found = NULL;
    for (i = 0; i < n; i++) {
        if (strcmp(rows[i].instance, inst) == 0 && strcmp(rows[i].check, check) == 0) {
            assert_null(found);
            found = &rows[i];
        }
    }
    return found;
}

static size_t n_rows(const fixture_t *f)
{
    size_t n;
    (void)pdgw_doctor_rows(f->run.rep, &n);
    return n;
}

/* ---------------------------------------------------------------- endpoints */

static void test_endpoint_kinds(void **state)
{
    char host[64];
    int port = 0;
    (void)state;
    assert_int_equal(doc_kvev_endpoint("tcp://*:5557", host, sizeof(host), &port), DOC_KV_EP_BIND);
    assert_int_equal(doc_kvev_endpoint("tcp://0.0.0.0:5557", host, sizeof(host), &port),
                     DOC_KV_EP_BIND);
    assert_int_equal(doc_kvev_endpoint("tcp://[::]:5557", host, sizeof(host), &port),
                     DOC_KV_EP_BIND);
    assert_int_equal(doc_kvev_endpoint("tcp://10.0.0.5:5558", host, sizeof(host), &port),
                     DOC_KV_EP_TCP);
    assert_string_equal(host, "10.0.0.5");
    assert_int_equal(port, 5558);
    /* "::1" has "::" too: vLLM binds it, and it is a host pdgw can reach */
    assert_int_equal(doc_kvev_endpoint("tcp://[::1]:5559", host, sizeof(host), &port),
                     DOC_KV_EP_TCP);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 5559);
    assert_int_equal(doc_kvev_endpoint("ipc:///tmp/kv", host, sizeof(host), &port),
                     DOC_KV_EP_OTHER);
    assert_int_equal(doc_kvev_endpoint("inproc://kv", host, sizeof(host), &port), DOC_KV_EP_OTHER);
    assert_int_equal(doc_kvev_endpoint("tcp://engine", host, sizeof(host), &port), DOC_KV_EP_OTHER);
    assert_int_equal(doc_kvev_endpoint("tcp://engine:0", host, sizeof(host), &port),
                     DOC_KV_EP_OTHER);
    assert_int_equal(doc_kvev_endpoint("tcp://engine:70000", host, sizeof(host), &port),
                     DOC_KV_EP_OTHER);
    assert_int_equal(doc_kvev_endpoint("tcp://engine:55x", host, sizeof(host), &port),
                     DOC_KV_EP_OTHER);
}

/* A loopback TCP socket bound to an ephemeral port: listening or not. */
static int tcp_socket(bool listening, int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    if (listening)
        assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* An engine given tcp://<its host>:PORT connects to it; pdgw connects too: nobody listens. */
static void test_connect_connect(void **state)
{
    fixture_t *f = *state;
    char ep[64];
    int port, fd = tcp_socket(false, &port); /* bound, not listening: refused */
    const pdgw_doctor_row_t *r;

    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    f->desc[0].kv_events_endpoint = ep;
    doc_probe_kvev(&f->run, &f->t[0]);
    close(fd);
    r = row_of(f, "p0", "kv-events");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "nothing listens on"));
    assert_non_null(strstr(r->detail, ep));
    assert_non_null(strstr(r->fix, "tcp://*:PORT"));
}

static void test_endpoint_listening(void **state)
{
    fixture_t *f = *state;
    char ep[64];
    int port, fd = tcp_socket(true, &port);
    const pdgw_doctor_row_t *r;

    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    f->desc[1].kv_events_endpoint = ep;
    doc_probe_kvev(&f->run, &f->t[1]); /* events_wait 0: connecting is the whole check */
    close(fd);
    r = row_of(f, "d0", "kv-events");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_OK);
    assert_non_null(strstr(r->detail, "accepts connections"));
}

static void test_endpoint_bind_address_and_missing(void **state)
{
    fixture_t *f = *state;
    const pdgw_doctor_row_t *r;

    f->desc[0].kv_events_endpoint = "tcp://*:5557";
    doc_probe_kvev(&f->run, &f->t[0]);
    r = row_of(f, "p0", "kv-events");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "bind address"));
    assert_non_null(strstr(r->fix, "ENGINE_HOST"));

    /* no endpoint: nothing to say, unless precise-prefix needs the events */
    doc_probe_kvev(&f->run, &f->t[1]);
    assert_null(row_of(f, "d0", "kv-events"));
    /* precise-prefix for the prefill role only: a decode's events are not needed */
    f->cfg.prefill_policy = PDGW_POLICY_PRECISE_PREFIX;
    doc_probe_kvev(&f->run, &f->t[1]);
    assert_null(row_of(f, "d0", "kv-events"));
    f->cfg.decode_policy = PDGW_POLICY_PRECISE_PREFIX;
    doc_probe_kvev(&f->run, &f->t[1]);
    r = row_of(f, "d0", "kv-events");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "scored by load only"));
}

/* ---------------------------------------------------------------- listened */

static sched_kvev_summary_t batch(int64_t dp_rank, uint32_t bs1, uint32_t bs2)
{
    sched_kvev_summary_t s = {.dp_rank = dp_rank, .n_events = 2, .n_stored = 2};
    if (bs1)
        s.block_sizes[s.n_block_sizes++] = bs1;
    if (bs2)
        s.block_sizes[s.n_block_sizes++] = bs2;
    return s;
}

static void test_verdict_nothing_and_idle(void **state)
{
    fixture_t *f = *state;
    doc_kv_seen_t none = {0}, idle = {0};
    sched_kvev_summary_t end = {.replay_end = true, .dp_rank = -1};
    const pdgw_doctor_row_t *r;

    f->opts.events_wait_ms = 300;
    doc_kvev_verdict(&f->run, &f->t[0], "tcp://e:1", &none);
    r = row_of(f, "p0", "kv-events");
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "no event within 300 ms"));
    assert_non_null(strstr(r->fix, "kv_events_replay_endpoint"));

    doc_kvev_seen_add(&idle, SCHED_KVEV_FROM_REPLAY, SCHED_OK, &end);
    assert_true(idle.replay_end);
    assert_int_equal(idle.replayed, 0);
    doc_kvev_verdict(&f->run, &f->t[1], "tcp://e:2", &idle);
    r = row_of(f, "d0", "kv-events");
    assert_int_equal(r->result, PDGW_DOCTOR_OK);
    assert_non_null(strstr(r->detail, "idle engine"));
    assert_null(row_of(f, "d0", "kv-events block size"));
}

static void test_verdict_batches(void **state)
{
    fixture_t *f = *state;
    doc_kv_seen_t s = {0};
    sched_kvev_summary_t b = batch(-1, 16, 0);
    const pdgw_doctor_row_t *r;

    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_PUB, SCHED_OK, &b);
    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_REPLAY, SCHED_OK, &b);
    doc_kvev_verdict(&f->run, &f->t[0], "tcp://e:1", &s);
    r = row_of(f, "p0", "kv-events");
    assert_int_equal(r->result, PDGW_DOCTOR_OK);
    assert_non_null(
        strstr(r->detail, "1 live + 1 replayed batch(es), block size 16; DP rank(s) 0"));
    r = row_of(f, "p0", "kv-events block size");
    assert_int_equal(r->result, PDGW_DOCTOR_INFO);
    assert_string_equal(r->detail, "block size 16");
    assert_int_equal(f->t[0].block_size, 16);
    assert_false(f->t[0].mixed_block_sizes);
}

static void test_verdict_mixed_and_undecodable(void **state)
{
    fixture_t *f = *state;
    doc_kv_seen_t s = {0}, one = {0};
    sched_kvev_summary_t b16 = batch(0, 16, 0), b32 = batch(0, 32, 0), both = batch(0, 16, 32);
    sched_kvev_summary_t bad = {.dp_rank = -1};
    const pdgw_doctor_row_t *r;

    /* across two batches */
    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_PUB, SCHED_OK, &b16);
    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_PUB, SCHED_OK, &b32);
    snprintf(bad.error, sizeof(bad.error), "payload: not msgpack");
    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_PUB, SCHED_ERR_INVALID, &bad);
    assert_int_equal(s.live, 3);
    assert_int_equal(s.undecodable, 1);
    doc_kvev_verdict(&f->run, &f->t[0], "tcp://e:1", &s);
    r = row_of(f, "p0", "kv-events block size");
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "several block sizes, the last 32"));
    assert_non_null(strstr(r->fix, "--block-size"));
    r = row_of(f, "p0", "kv-events");
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "1 undecodable (payload: not msgpack)"));
    assert_true(f->t[0].mixed_block_sizes);

    /* within one batch */
    doc_kvev_seen_add(&one, SCHED_KVEV_FROM_PUB, SCHED_OK, &both);
    assert_true(one.mixed);
    assert_int_equal(one.block_size, 32);
}

static void test_verdict_dp_rank(void **state)
{
    fixture_t *f = *state;
    doc_kv_seen_t s = {0}, ok = {0};
    sched_kvev_summary_t r0 = batch(0, 16, 0), r1 = batch(1, 16, 0), r70 = batch(70, 16, 0);
    const pdgw_doctor_row_t *r;

    /* DP rank 1 of 2, but the port it was given is rank 0's */
    f->t[0].view.dp_size = 2;
    f->t[0].view.dp_rank = 1;
    doc_kvev_seen_add(&s, SCHED_KVEV_FROM_PUB, SCHED_OK, &r0);
    doc_kvev_verdict(&f->run, &f->t[0], "tcp://e:5557", &s);
    r = row_of(f, "p0", "kv-events DP rank");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "the instance is DP rank 1, the events on tcp://e:5557 "
                                      "carry rank(s) 0"));
    assert_non_null(strstr(r->fix, "port + r"));

    f->t[1].view.dp_size = 2;
    f->t[1].view.dp_rank = 1;
    doc_kvev_seen_add(&ok, SCHED_KVEV_FROM_PUB, SCHED_OK, &r1);
    doc_kvev_seen_add(&ok, SCHED_KVEV_FROM_PUB, SCHED_OK, &r70);
    doc_kvev_verdict(&f->run, &f->t[1], "tcp://e:5558", &ok);
    assert_null(row_of(f, "d0", "kv-events DP rank"));
    assert_non_null(strstr(row_of(f, "d0", "kv-events")->detail, "DP rank(s) 1,64+"));
}

/* ---------------------------------------------------------------- fleet */

static void serve(doc_target_t *t, const char *model)
{
    t->served[t->n_served] = pdgw_strdup(model);
    assert_non_null(t->served[t->n_served]);
    t->n_served++;
    t->models_known = true;
}

static void test_fleet_block_sizes(void **state)
{
    fixture_t *f = *state;
    const pdgw_doctor_row_t *r;

    serve(&f->t[0], "m");
    serve(&f->t[1], "m");
    serve(&f->t[2], "other");
    f->t[0].block_size = 16;
    f->t[1].block_size = 32;
    f->t[2].block_size = 64; /* another model: may differ */
    doc_check_block_sizes(&f->run, f->t, 3);
    r = row_of(f, "p0", "kv-events block size");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "block size 16, instance d0 of the same model 32"));
    assert_non_null(row_of(f, "d0", "kv-events block size"));
    assert_null(row_of(f, "d1", "kv-events block size"));
    assert_int_equal(n_rows(f), 2);

    /* the same sizes: nothing */
    teardown(state);
    setup(state);
    f = *state;
    serve(&f->t[0], "m");
    serve(&f->t[1], "m");
    f->t[0].block_size = f->t[1].block_size = 16;
    doc_check_block_sizes(&f->run, f->t, 3);
    assert_int_equal(n_rows(f), 0);
}

static void test_fleet_models(void **state)
{
    fixture_t *f = *state;
    char *names[2] = {(char *)"m", (char *)"ghost"};
    pdgw_str_list_t saved = f->cfg.models;
    const pdgw_doctor_row_t *r;

    serve(&f->t[0], "m");
    f->cfg.models.items = names;
    f->cfg.models.count = 2;
    doc_check_fleet_models(&f->run, f->t, 3);
    f->cfg.models = saved;
    r = row_of(f, "*", "models");
    assert_non_null(r);
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "\"ghost\""));
    assert_int_equal(n_rows(f), 1);
}

/* ---------------------------------------------------------------- answers */

static void test_models_verdict(void **state)
{
    fixture_t *f = *state;
    const char *body = "{\"object\":\"list\",\"data\":[{\"id\":\"a\"},{\"id\":\"b\"}]}";
    const pdgw_doctor_row_t *r;

    f->desc[0].models[0] = "b";
    f->desc[0].n_models = 1;
    doc_models_verdict(&f->run, &f->t[0], 200, body);
    r = row_of(f, "p0", "models");
    assert_int_equal(r->result, PDGW_DOCTOR_OK);
    assert_string_equal(r->detail, "engine serves: a, b (as configured)");
    assert_int_equal(f->t[0].n_served, 2);

    f->desc[1].models[0] = "c";
    f->desc[1].n_models = 1;
    doc_models_verdict(&f->run, &f->t[1], 200, body);
    r = row_of(f, "d0", "models");
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "serves \"c\", the engine serves: a, b"));
    assert_non_null(strstr(r->fix, "--served-model-name"));

    doc_models_verdict(&f->run, &f->t[2], 404, "{\"detail\":\"Not Found\"}");
    r = row_of(f, "d1", "models");
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "answered 404 without a model list"));
    assert_false(f->t[2].models_known);
}

static void test_metrics_verdict(void **state)
{
    fixture_t *f = *state;
    const pdgw_doctor_row_t *r;

    doc_metrics_verdict(&f->run, &f->t[0],
                        "# HELP vllm:num_requests_running x\n"
                        "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1.0\n"
                        "vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 0.0\n"
                        "vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.1\n");
    r = row_of(f, "p0", "metrics");
    assert_int_equal(r->result, PDGW_DOCTOR_OK); /* the older name is read too */
    assert_string_equal(r->detail, "vLLM load gauges present");

    doc_metrics_verdict(&f->run, &f->t[1],
                        "sglang:num_running_reqs{tp_rank=\"0\"} 1\n"
                        "sglang:num_queue_reqs{tp_rank=\"0\"} 0\n"
                        "sglang:num_decode_transfer_queue_reqs{tp_rank=\"0\"} 0\n");
    r = row_of(f, "d0", "metrics");
    assert_int_equal(r->result, PDGW_DOCTOR_WARN);
    assert_non_null(strstr(r->detail, "missing KV cache usage (sglang:token_usage)"));

    /* an exporter that renamed ':' to '_' */
    doc_metrics_verdict(&f->run, &f->t[2],
                        "vllm_num_requests_running 1\nvllm_num_requests_waiting 0\n"
                        "vllm_kv_cache_usage_perc 0\n");
    r = row_of(f, "d1", "metrics");
    assert_int_equal(r->result, PDGW_DOCTOR_ERROR);
    assert_non_null(strstr(r->detail, "KV cache usage "
                                      "(vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc)"));
    assert_non_null(strstr(r->detail, "; found vllm_num_requests_running"));
    assert_non_null(strstr(r->fix, "with ':'"));
}

/* ---------------------------------------------------------------- output */

static void fill_report(fixture_t *f)
{
    doc_row(&f->run, NULL, "models", PDGW_DOCTOR_ERROR, "fix the fleet", "fleet-wide %d", 1);
    doc_row(&f->run, &f->t[1], "health", PDGW_DOCTOR_OK, NULL, "GET /health: 200");
    doc_row(&f->run, &f->t[0], "health", PDGW_DOCTOR_OK, NULL, "GET /health: 200");
    doc_row(&f->run, &f->t[0], "kv-events", PDGW_DOCTOR_WARN, "look", "quiet \"%s\"", "x");
    doc_report_sort(f->run.rep);
}

static char *render(fixture_t *f, bool json)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    pdgw_doctor_print(f->run.rep, json, out);
    fclose(out);
    return text;
}

static void test_table(void **state)
{
    fixture_t *f = *state;
    char *text, *p0h, *p0k, *d0, *fleet;
    fill_report(f);
    text = render(f, false);
    static const char head[] = "INSTANCE  CHECK      RESULT  FINDING / WHAT TO CHANGE\n";
    assert_true(strncmp(text, head, strlen(head)) == 0);
    /* by instance index, then the order written; the fleet last */
    p0h = strstr(text, "p0        health     ok      GET /health: 200\n");
    p0k = strstr(text, "p0        kv-events  warn    quiet \"x\"\n"
                       "                             -> look\n");
    d0 = strstr(text, "d0        health     ok ");
    fleet = strstr(text, "*         models     error   fleet-wide 1\n");
    assert_non_null(p0h);
    assert_non_null(p0k);
    assert_non_null(d0);
    assert_non_null(fleet);
    assert_true(p0h < p0k && p0k < d0 && d0 < fleet);
    assert_non_null(strstr(text, "3 instance(s), 4 check(s): 1 error(s), 1 warning(s)\n"));
    free(text);
}

static void test_json(void **state)
{
    fixture_t *f = *state;
    char *text;
    json_error_t e;
    json_t *o, *checks, *c;
    fill_report(f);
    text = render(f, true);
    o = json_loads(text, 0, &e);
    free(text);
    assert_non_null(o);
    assert_true(json_is_false(json_object_get(o, "ok")));
    assert_int_equal(json_integer_value(json_object_get(o, "errors")), 1);
    assert_int_equal(json_integer_value(json_object_get(o, "warnings")), 1);
    assert_int_equal(json_integer_value(json_object_get(o, "instances")), 3);
    checks = json_object_get(o, "checks");
    assert_int_equal(json_array_size(checks), 4);
    c = json_array_get(checks, 1);
    assert_string_equal(json_string_value(json_object_get(c, "instance")), "p0");
    assert_string_equal(json_string_value(json_object_get(c, "check")), "kv-events");
    assert_string_equal(json_string_value(json_object_get(c, "result")), "warn");
    assert_string_equal(json_string_value(json_object_get(c, "detail")), "quiet \"x\"");
    assert_string_equal(json_string_value(json_object_get(c, "fix")), "look");
    c = json_array_get(checks, 3);
    assert_string_equal(json_string_value(json_object_get(c, "instance")), "*");
    json_decref(o);

    /* nothing wrong: ok */
    teardown(state);
    setup(state);
    f = *state;
    doc_row(&f->run, &f->t[0], "health", PDGW_DOCTOR_OK, NULL, "fine");
    text = render(f, true);
    o = json_loads(text, 0, &e);
    free(text);
    assert_true(json_is_true(json_object_get(o, "ok")));
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(o, "checks"), 0), "fix")),
        "");
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_kinds),
        cmocka_unit_test_setup_teardown(test_connect_connect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_listening, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_bind_address_and_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_nothing_and_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_mixed_and_undecodable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdict_dp_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fleet_block_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fleet_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_models_verdict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_verdict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
