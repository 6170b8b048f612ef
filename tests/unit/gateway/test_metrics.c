/*
 * test_metrics.c - Prometheus registry: golden exposition text, histogram semantics,
 * label escaping, cardinality cap, concurrent updates, collectors, and `promtool check
 * metrics` on the output (Debian package prometheus, installed by deploy/install-deps.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>

#include <cmocka.h>

#include "pdgw/forwarder.h"
#include "pdgw_metrics.h"
#include "pdgw_server_int.h"

static const char *promtool_path(void)
{
    static const char *const cands[] = {"/usr/bin/promtool", "/usr/local/bin/promtool"};
    for (size_t i = 0; i < 2; i++) {
        if (access(cands[i], X_OK) == 0)
            return cands[i];
    }
    return NULL;
}

/* Run promtool check metrics on <text>; returns its exit status, output in <out>. */
static int promtool_check(const char *text, char *out, size_t out_len)
{
    const char *tool = promtool_path();
    if (tool == NULL)
        fail_msg("promtool not found: install the Debian package prometheus "
                 "(deploy/install-deps.sh does)");
    char path[] = "/tmp/pdgw_metrics_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s check metrics < %s 2>&1", tool, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, out_len - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    unlink(path);
    return rc;
}

static void test_golden(void **state)
{
    (void)state;
    pdgw_metrics_t *reg;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    static const char *const lbl[] = {"protocol", "status"};
    pdgw_metric_family_t *req, *lat;
    assert_int_equal(pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "t_requests_total",
                                             "Requests.\nSecond \\ line.", lbl, 2, NULL, 0, &req),
                     PDGW_OK);
    static const double buckets[] = {0.1, 0.5, 1};
    static const char *const l1[] = {"protocol"};
    assert_int_equal(pdgw_metrics_family_add(reg, PDGW_METRIC_HISTOGRAM, "t_latency_seconds",
                                             "Latency.", l1, 1, buckets, 3, &lat),
                     PDGW_OK);
    pdgw_metric_t *g = pdgw_metrics_gauge_new(reg, "t_inflight", "In flight.");
    assert_non_null(g);

    pdgw_counter_add(pdgw_metric_family_series2(req, "neutral", "200"), 3);
    pdgw_counter_inc(pdgw_metric_family_series2(req, "we\"ird\\p\nx", "502"));
    pdgw_metric_t *h = pdgw_metric_family_series1(lat, "neutral");
    pdgw_histogram_observe(h, 0.1); /* le is inclusive */
    pdgw_histogram_observe(h, 0.3);
    pdgw_histogram_observe(h, 7);
    pdgw_gauge_inc(g);
    pdgw_gauge_inc(g);
    pdgw_gauge_dec(g);
    pdgw_gauge_add(g, 0.5);

    pdgw_buf_t out = PDGW_BUF_INIT;
    assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
    const char *expected =
        "# HELP pdgw_metrics_series_refused_total Label sets refused because a metric family "
        "reached its series cap.\n"
        "# TYPE pdgw_metrics_series_refused_total counter\n"
        "pdgw_metrics_series_refused_total 0\n"
        "# HELP t_requests_total Requests.\\nSecond \\\\ line.\n"
        "# TYPE t_requests_total counter\n"
        "t_requests_total{protocol=\"neutral\",status=\"200\"} 3\n"
        "t_requests_total{protocol=\"we\\\"ird\\\\p\\nx\",status=\"502\"} 1\n"
        "# HELP t_latency_seconds Latency.\n"
        "# TYPE t_latency_seconds histogram\n"
        "t_latency_seconds_bucket{protocol=\"neutral\",le=\"0.1\"} 1\n"
        "t_latency_seconds_bucket{protocol=\"neutral\",le=\"0.5\"} 2\n"
        "t_latency_seconds_bucket{protocol=\"neutral\",le=\"1\"} 2\n"
        "t_latency_seconds_bucket{protocol=\"neutral\",le=\"+Inf\"} 3\n"
        "t_latency_seconds_sum{protocol=\"neutral\"} 7.4\n"
        "t_latency_seconds_count{protocol=\"neutral\"} 3\n"
        "# HELP t_inflight In flight.\n"
        "# TYPE t_inflight gauge\n"
        "t_inflight 1.5\n";
    assert_string_equal(out.data, expected);
    assert_int_equal(pdgw_histogram_count(h), 3);
    assert_true(pdgw_metric_value(g) == 1.5);

    char msg[4096];
    int rc = promtool_check(out.data, msg, sizeof(msg));
    if (rc != 0)
        fail_msg("promtool: %s", msg);
    pdgw_buf_free(&out);
    pdgw_metrics_destroy(reg);
}

static void test_invalid_and_null(void **state)
{
    (void)state;
    pdgw_metrics_t *reg;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    pdgw_metric_family_t *f;
    static const char *const le[] = {"le"};
    static const char *const dunder[] = {"__x"};
    static const char *const dup[] = {"a", "a"};
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "1bad", "", NULL, 0, NULL, 0, &f),
        PDGW_ERR_INVALID);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "bad-name", "", NULL, 0, NULL, 0, &f),
        PDGW_ERR_INVALID);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_HISTOGRAM, "h", "", le, 1, NULL, 0, &f),
        PDGW_ERR_INVALID);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_GAUGE, "g", "", dunder, 1, NULL, 0, &f),
        PDGW_ERR_INVALID);
    assert_int_equal(pdgw_metrics_family_add(reg, PDGW_METRIC_GAUGE, "g", "", dup, 2, NULL, 0, &f),
                     PDGW_ERR_INVALID);
    static const double unsorted[] = {1, 0.5};
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_HISTOGRAM, "h", "", NULL, 0, unsorted, 2, &f),
        PDGW_ERR_INVALID);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "c_total", "", NULL, 0, NULL, 0, &f),
        PDGW_OK);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "c_total", "", NULL, 0, NULL, 0, &f),
        PDGW_ERR_EXISTS);
    assert_ptr_equal(pdgw_metrics_family_find(reg, "c_total"), f);
    assert_null(pdgw_metrics_family_find(reg, "nope"));
    /* NULL handles are no-ops; the wrong type's update is a no-op */
    pdgw_counter_inc(NULL);
    pdgw_gauge_set(NULL, 1);
    pdgw_histogram_observe(NULL, 1);
    pdgw_metric_t *c = pdgw_metric_family_series(f, NULL);
    pdgw_gauge_set(c, 42);
    pdgw_histogram_observe(c, 1);
    pdgw_counter_add_f(c, -1);
    pdgw_counter_add_f(c, 0.25);
    assert_true(pdgw_metric_value(c) == 0.25);
    /* label values: invalid UTF-8 and oversized values are refused */
    static const char *const l1[] = {"v"};
    pdgw_metric_family_t *lf;
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "l_total", "", l1, 1, NULL, 0, &lf),
        PDGW_OK);
    assert_null(pdgw_metric_family_series1(lf, "\xff\xfe"));
    assert_null(pdgw_metric_family_series1(lf, NULL));
    char big[300];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_null(pdgw_metric_family_series1(lf, big));
    assert_non_null(pdgw_metric_family_series1(lf, "h\xc3\xa9llo"));
    /* a value checked once is found again; a refused one stays refused */
    assert_ptr_equal(pdgw_metric_family_series1(lf, "h\xc3\xa9llo"),
                     pdgw_metric_family_series1(lf, "h\xc3\xa9llo"));
    assert_null(pdgw_metric_family_series1(lf, big));
    /* status labels */
    char code[PDGW_STATUS_LABEL_SIZE];
    assert_string_equal(pdgw_metric_status_label(200, code), "200");
    assert_string_equal(pdgw_metric_status_label(504, code), "504");
    assert_string_equal(pdgw_metric_status_label(0, code), "0");
    assert_string_equal(pdgw_metric_status_label(1000, code), "1000");
    assert_string_equal(pdgw_metric_status_label(-1, code), "-1");
    pdgw_metrics_destroy(reg);
}

static void test_cardinality_cap(void **state)
{
    (void)state;
    pdgw_metrics_t *reg;
    assert_int_equal(pdgw_metrics_create(4, &reg), PDGW_OK);
    static const char *const l1[] = {"path"};
    pdgw_metric_family_t *f;
    assert_int_equal(pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "hits_total", "Hits.", l1, 1,
                                             NULL, 0, &f),
                     PDGW_OK);
    char v[16];
    int accepted = 0;
    for (int i = 0; i < 10; i++) {
        snprintf(v, sizeof(v), "p%d", i);
        pdgw_metric_t *m = pdgw_metric_family_series1(f, v);
        if (m != NULL) {
            accepted++;
            pdgw_counter_inc(m);
        }
    }
    assert_int_equal(accepted, 4);
    assert_int_equal(pdgw_metric_family_size(f), 4);
    /* existing series are still found after the cap is reached */
    assert_non_null(pdgw_metric_family_series1(f, "p0"));
    pdgw_buf_t out = PDGW_BUF_INIT;
    assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
    assert_non_null(strstr(out.data, "pdgw_metrics_series_refused_total 6\n"));
    assert_null(strstr(out.data, "p4"));
    pdgw_buf_free(&out);
    pdgw_metrics_destroy(reg);
}

#define THREADS 4
#define ITERS   50000

typedef struct tctx {
    pdgw_metric_family_t *fam;
    pdgw_metric_t *hist;
    pdgw_metric_t *gauge;
    int id;
} tctx_t;

static void *hammer(void *arg)
{
    tctx_t *t = arg;
    char v[8];
    for (int i = 0; i < ITERS; i++) {
        snprintf(v, sizeof(v), "s%d", i % 8); /* creation races on the first rounds */
        pdgw_counter_inc(pdgw_metric_family_series1(t->fam, v));
        pdgw_histogram_observe(t->hist, 0.5);
        pdgw_gauge_inc(t->gauge);
        pdgw_gauge_dec(t->gauge);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    pdgw_metrics_t *reg;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    static const char *const l1[] = {"s"};
    tctx_t t[THREADS];
    pdgw_metric_family_t *fam;
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "x_total", "X.", l1, 1, NULL, 0, &fam),
        PDGW_OK);
    pdgw_metric_t *hist = pdgw_metrics_histogram_new(reg, "y_seconds", "Y.", NULL, 0);
    pdgw_metric_t *gauge = pdgw_metrics_gauge_new(reg, "z", "Z.");
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (tctx_t){fam, hist, gauge, i};
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &t[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(pdgw_metric_family_size(fam), 8);
    double total = 0;
    for (int i = 0; i < 8; i++) {
        char v[8];
        snprintf(v, sizeof(v), "s%d", i);
        total += pdgw_metric_value(pdgw_metric_family_series1(fam, v));
    }
    assert_true(total == (double)THREADS * ITERS);
    assert_int_equal(pdgw_histogram_count(hist), THREADS * ITERS);
    assert_true(pdgw_histogram_sum(hist) == 0.5 * THREADS * ITERS);
    assert_true(pdgw_metric_value(gauge) == 0);
    pdgw_metrics_destroy(reg);
}

static pdgw_status_t ext_collect(void *ctx, pdgw_buf_t *out)
{
    int *calls = ctx;
    (*calls)++;
    return pdgw_buf_append_str(out, "# HELP kvt_pinned_pages Pinned pages.\n"
                                    "# TYPE kvt_pinned_pages gauge\n"
                                    "kvt_pinned_pages 12"); /* no final newline on purpose */
}

static void test_gateway_metrics_and_collector(void **state)
{
    (void)state;
    pdgw_metrics_t *reg;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    pdgw_gateway_metrics_t gm;
    assert_int_equal(pdgw_gateway_metrics_init(reg, "0.1.0", &gm), PDGW_OK);
    /* freshly registered: labelled families have no samples yet, still valid text */
    pdgw_buf_t fresh = PDGW_BUF_INIT;
    assert_int_equal(pdgw_metrics_render(reg, &fresh), PDGW_OK);
    assert_non_null(strstr(fresh.data, "# TYPE pdgw_requests_total counter\n"));
    assert_non_null(strstr(fresh.data, "pdgw_inflight_requests 0\n"));
    char fmsg[4096];
    if (promtool_check(fresh.data, fmsg, sizeof(fmsg)) != 0)
        fail_msg("promtool (fresh registry): %s", fmsg);
    pdgw_buf_free(&fresh);
    int calls = 0;
    assert_int_equal(pdgw_metrics_collector_add(reg, ext_collect, &calls), PDGW_OK);

    pdgw_proto_metrics_t neutral, kvt, none;
    pdgw_proto_metrics_init(&neutral, &gm, "neutral");
    pdgw_proto_metrics_init(&kvt, &gm, "vllm-kvt");
    pdgw_proto_metrics_init(&none, NULL, "neutral"); /* counts nothing, and does not crash */
    pdgw_gateway_metrics_request_done(&none, 200, 1);
    pdgw_gateway_metrics_observe_phase(&none, PDGW_DURATION_DECODE, 1);
    pdgw_gauge_inc(gm.inflight);
    pdgw_gateway_metrics_request_done(&neutral, 200, 0.25);
    pdgw_gateway_metrics_request_done(&neutral, 200, 0.75);
    pdgw_gateway_metrics_request_done(&kvt, 502, 1.0);
    pdgw_gateway_metrics_request_done(&kvt, 200, 0.5);
    pdgw_gateway_metrics_observe_ttft(&neutral, 0.05);
    pdgw_gateway_metrics_observe_tpot(&neutral, 0.01);
    pdgw_gateway_metrics_observe_phase(&kvt, PDGW_DURATION_PREFILL, 0.2);
    pdgw_gateway_metrics_observe_phase(&kvt, PDGW_DURATION_PHASES, 0.2); /* no such phase */
    pdgw_gateway_metrics_upstream_error(&gm, "vllm-kvt", "10.0.0.1:8000", "connect");
    pdgw_gateway_metrics_client_disconnect(&gm, "neutral");
    pdgw_gateway_metrics_retry(&gm, "vllm-kvt");
    pdgw_gateway_metrics_rejected(&gm, "bad_json");
    pdgw_gauge_set(pdgw_metric_family_series2(gm.instance_inflight, "p0", "prefill"), 3);
    pdgw_gateway_metrics_touch_protocol(&gm, "sglang");
    pdgw_gateway_metrics_observe_prefill(&kvt, 0.5);
    pdgw_gateway_metrics_observe_kv_wait(&kvt, 0.02);
    pdgw_gateway_metrics_observe_decode(&kvt, 2);
    pdgw_gateway_metrics_pd_failure(&gm, "vllm-kvt", "kv_transfer");
    pdgw_gateway_metrics_prefill_missing_kv_params(&gm, "vllm-kvt");
    pdgw_gateway_metrics_cancel_notif(&gm, "lmcache");
    pdgw_gateway_metrics_local_resource_error(&gm, "fd");

    pdgw_buf_t out = PDGW_BUF_INIT;
    assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
    assert_int_equal(calls, 1);
    static const char *const must[] = {
        "pdgw_requests_total{protocol=\"neutral\",status=\"200\"} 2\n",
        "pdgw_requests_total{protocol=\"vllm-kvt\",status=\"502\"} 1\n",
        "pdgw_requests_total{protocol=\"vllm-kvt\",status=\"200\"} 1\n",
        "pdgw_request_duration_seconds_count{protocol=\"neutral\"} 2\n",
        "pdgw_request_duration_seconds_sum{protocol=\"neutral\"} 1\n",
        "pdgw_request_duration_seconds_bucket{protocol=\"neutral\",le=\"0.25\"} 1\n",
        "pdgw_ttft_seconds_count{protocol=\"neutral\"} 1\n",
        "pdgw_tpot_seconds_count{protocol=\"neutral\"} 1\n",
        "pdgw_phase_duration_seconds_count{protocol=\"vllm-kvt\",phase=\"prefill\"} 1\n",
        /* the KV wait is also the kv_transfer phase */
        "pdgw_phase_duration_seconds_count{protocol=\"vllm-kvt\",phase=\"kv_transfer\"} 1\n",
        "pdgw_inflight_requests 1\n",
        "pdgw_instance_inflight_requests{instance=\"p0\",role=\"prefill\"} 3\n",
        "pdgw_upstream_errors_total{protocol=\"vllm-kvt\",instance=\"10.0.0.1:8000\","
        "kind=\"connect\"} 1\n",
        "pdgw_client_disconnects_total{protocol=\"neutral\"} 1\n",
        "pdgw_retries_total{protocol=\"vllm-kvt\"} 1\n",
        "pdgw_rejected_requests_total{reason=\"bad_json\"} 1\n",
        "pdgw_build_info{version=\"0.1.0\"} 1\n",
        "# TYPE pdgw_request_duration_seconds histogram\n",
        "kvt_pinned_pages 12\n",
        "pdgw_prefill_seconds_sum{protocol=\"vllm-kvt\"} 0.5\n",
        "pdgw_kv_wait_seconds_count{protocol=\"vllm-kvt\"} 1\n",
        "pdgw_decode_seconds_bucket{protocol=\"vllm-kvt\",le=\"2.5\"} 1\n",
        "pdgw_pd_failures_total{protocol=\"vllm-kvt\",phase=\"kv_transfer\"} 1\n",
        "pdgw_prefill_missing_kv_params_total{protocol=\"vllm-kvt\"} 1\n",
        "pdgw_pd_cancel_notifs_total{protocol=\"lmcache\"} 1\n",
        "pdgw_local_resource_errors_total{kind=\"fd\"} 1\n",
        /* touched up front: zero-valued series exist */
        "pdgw_retries_total{protocol=\"sglang\"} 0\n",
        "pdgw_prefill_missing_kv_params_total{protocol=\"sglang\"} 0\n",
        "pdgw_ttft_seconds_count{protocol=\"sglang\"} 0\n",
    };
    for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++) {
        if (strstr(out.data, must[i]) == NULL)
            fail_msg("missing line: %s\nin:\n%s", must[i], out.data);
    }
    char msg[8192];
    int rc = promtool_check(out.data, msg, sizeof(msg));
    if (rc != 0)
        fail_msg("promtool: %s\n%s", msg, out.data);

    pdgw_metrics_collector_remove(reg, ext_collect, &calls);
    pdgw_buf_reset(&out);
    assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
    assert_int_equal(calls, 1);
    assert_null(strstr(out.data, "kvt_pinned_pages"));
    pdgw_buf_free(&out);
    pdgw_metrics_destroy(reg);
}

/* Usage is read from the top-level "usage" member only, without parsing the whole answer; the
 * figures must be what a full parse (jansson, last duplicate key wins) finds. */
static bool usage_by_full_parse(const char *text, int64_t *pt, int64_t *ct)
{
    json_t *root = json_loads(text, 0, NULL);
    json_t *u = json_is_object(root) ? json_object_get(root, "usage") : NULL;
    bool ok = json_is_object(u);
    if (ok) {
        *pt = json_integer_value(json_object_get(u, "prompt_tokens"));
        *ct = json_integer_value(json_object_get(u, "completion_tokens"));
    }
    json_decref(root);
    return ok;
}

static void test_usage_matches_full_parse(void **state)
{
    static const char *const cases[] = {
        "{\"id\":\"a\",\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}",
        " {\"usage\" : { \"completion_tokens\": 5, \"prompt_tokens\": 2 } }\n",
        /* nested "usage" members are not the answer's */
        "{\"choices\":[{\"usage\":{\"prompt_tokens\":9}}],\"x\":{\"usage\":{\"prompt_tokens\":1}}}",
        /* in a string, with escapes */
        "{\"text\":\"\\\"usage\\\": {\\\"prompt_tokens\\\": 4}\",\"usage\":{\"prompt_tokens\":6}}",
        /* "usage" as a value, not a key */
        "{\"k\":\"usage\",\"v\":{\"prompt_tokens\":1}}",
        /* duplicates: the last wins */
        "{\"usage\":{\"prompt_tokens\":1},\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":2}}",
        "{\"usage\":{\"prompt_tokens\":1},\"usage\":null}",
        "{\"usage\":null}",
        "{\"usage\":{\"prompt_tokens\":\"12\",\"completion_tokens\":1.5}}",
        /* vLLM's shape: details nested in usage are not its counts */
        "{\"usage\":{\"prompt_tokens\":20,\"total_tokens\":24,\"completion_tokens\":4,"
        "\"prompt_tokens_details\":{\"cached_tokens\":16,\"prompt_tokens\":99}}}",
        "{\"usage\":{\"prompt_tokens_details\":{\"prompt_tokens\":5},\"completion_tokens\":-3}}",
        "{\"usage\":{\"prompt_tokens\":1e3,\"completion_tokens\":0,\"prompt_tokens\":[1]}}",
        /* numbers a parse refuses: no usage at all */
        "{\"usage\":{\"prompt_tokens\":99999999999999999999}}",
        "{\"usage\":{\"prompt_tokens\":01}}",
        "{\"usage\":{\"completion_tokens\":-}}",
        "{\"usage\":{\"prompt_tokens\":9223372036854775807,\"completion_tokens\":1}}",
        "{\"usage\":{\"prompt_tokens\":9223372036854775808,\"completion_tokens\":1}}",
        "{\"usage\":{\"prompt_tokens\":-9223372036854775808,\"completion_tokens\":-0}}",
        "{\"usage\":{\"prompt_tokens\":-9223372036854775809,\"completion_tokens\":2}}",
        "{\"usage\":{\"prompt_tokens\":18446744073709551616,\"completion_tokens\":2}}",
        /* escaped quotes and backslashes, short and long, before the usage */
        "{\"a\":\"x\\\"y\\\\\",\"b\":\"0123456789012345678901234567890123\\\\\\\"\\\\\","
        "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
        "{\"a\":\"0123456789012345678901234567890123456789\\\",\"usage\":{\"prompt_tokens\":3}}\"}",
        /* not one object */
        "[{\"usage\":{\"prompt_tokens\":1}}]",
        "{\"usage\":{\"prompt_tokens\":1}} trailing",
        "{\"usage\":{\"prompt_tokens\":1}",
        "{\"usage\":{\"prompt_tokens\":1}}}",
        "",
    };
    pdgw_metrics_t *reg;
    pdgw_gateway_metrics_t gm;
    size_t i;
    (void)state;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    assert_int_equal(pdgw_gateway_metrics_init(reg, "0.1.0", &gm), PDGW_OK);
    pdgw_proto_metrics_t pm;
    pdgw_proto_metrics_init(&pm, &gm, "neutral");
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t p1 = -1, c1 = -1, p2 = -1, c2 = -1;
        bool want = usage_by_full_parse(cases[i], &p2, &c2);
        bool got = pdgw_gateway_metrics_usage(&pm, cases[i], strlen(cases[i]), &p1, &c1);
        if (got != want || (want && (p1 != p2 || c1 != c2)))
            fail_msg("case %zu (%s): got %d %lld/%lld, a full parse %d %lld/%lld", i, cases[i], got,
                     (long long)p1, (long long)c1, want, (long long)p2, (long long)c2);
        /* a whole answer, walked without the quick look first, reads the same */
        p1 = c1 = -1;
        got = pdgw_gateway_metrics_usage_answer(&pm, cases[i], strlen(cases[i]), &p1, &c1);
        if (got != want || (want && (p1 != p2 || c1 != c2)))
            fail_msg("case %zu (%s): as an answer %d %lld/%lld, a full parse %d %lld/%lld", i,
                     cases[i], got, (long long)p1, (long long)c1, want, (long long)p2,
                     (long long)c2);
        /* a rewritten answer's tree gives what its text would */
        json_t *tree = json_loads(cases[i], 0, NULL);
        int64_t p3 = -1, c3 = -1;
        bool from_tree = tree != NULL && pdgw_gateway_metrics_usage_tree(&pm, tree, &p3, &c3);
        if (from_tree != want || (want && (p3 != p2 || c3 != c2)))
            fail_msg("case %zu (%s): from the tree %d %lld/%lld, a full parse %d %lld/%lld", i,
                     cases[i], from_tree, (long long)p3, (long long)c3, want, (long long)p2,
                     (long long)c2);
        json_decref(tree);
    }
    pdgw_metrics_destroy(reg);
}

/* The exposition of <reg> contains <line>. */
static bool exposition_has(pdgw_metrics_t *reg, const char *line)
{
    pdgw_buf_t out = {0};
    bool has;
    assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
    has = out.data != NULL && strstr(out.data, line) != NULL;
    pdgw_buf_free(&out);
    return has;
}

/* A lookup is remembered per thread by the addresses of its label values: the same address
 * holding other text must find the other series, and a family made where a destroyed one was
 * must never be handed the old family's series (ASan would see the freed memory). */
static void test_series_lookup_memo(void **state)
{
    static const char *const lbl[] = {"model"};
    char value[16] = "alpha";
    pdgw_metrics_t *reg;
    pdgw_metric_family_t *fam;
    pdgw_metric_t *alpha, *beta;
    (void)state;
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    assert_int_equal(
        pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "memo_total", "h", lbl, 1, NULL, 0, &fam),
        PDGW_OK);
    alpha = pdgw_metric_family_series1(fam, value);
    assert_non_null(alpha);
    assert_ptr_equal(pdgw_metric_family_series1(fam, value), alpha);
    strcpy(value, "beta"); /* same address, other text */
    beta = pdgw_metric_family_series1(fam, value);
    assert_non_null(beta);
    assert_ptr_not_equal(beta, alpha);
    pdgw_counter_add(beta, 2);
    strcpy(value, "alpha");
    assert_ptr_equal(pdgw_metric_family_series1(fam, value), alpha);
    pdgw_counter_add(alpha, 5);
    assert_int_equal(pdgw_metric_family_size(fam), 2);
    assert_true(exposition_has(reg, "memo_total{model=\"alpha\"} 5\n"));
    assert_true(exposition_has(reg, "memo_total{model=\"beta\"} 2\n"));
    pdgw_metrics_destroy(reg);

    for (int round = 0; round < 4; round++) { /* allocations often land where the last were */
        assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
        assert_int_equal(pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "memo_total", "h", lbl,
                                                 1, NULL, 0, &fam),
                         PDGW_OK);
        pdgw_counter_inc(pdgw_metric_family_series1(fam, value));
        assert_true(exposition_has(reg, "memo_total{model=\"alpha\"} 1\n"));
        pdgw_metrics_destroy(reg);
    }
}

/* Forwarder counters find their family by short name in a table of their own: counts land in
 * the registry set now, never in a destroyed one whose families the table knew (ASan would
 * see the freed memory), and each name keeps its own family. */
static void test_forwarder_counters(void **state)
{
    (void)state;
    for (int round = 0; round < 4; round++) { /* allocations often land where the last were */
        pdgw_metrics_t *reg;
        pdgw_gateway_metrics_t gm;
        assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
        assert_int_equal(pdgw_gateway_metrics_init(reg, "0.1.0", &gm), PDGW_OK);
        pdgw_fwd_api_set_services(&gm, NULL);
        pdgw_fwd_counter_inc("p", "tokenize_calls", "Calls.");
        pdgw_fwd_counter_inc("p", "tokenize_calls", "Calls.");
        pdgw_fwd_counter_inc("q", "tokenize_calls", "Calls.");
        pdgw_fwd_counter_inc("p", "proxy_notifs", "Notices.");
        pdgw_fwd_counter_inc_reason("p", "notifs_rejected", "Rejected.", "peer");
        assert_true(exposition_has(reg, "pdgw_fwd_tokenize_calls_total{protocol=\"p\"} 2\n"));
        assert_true(exposition_has(reg, "pdgw_fwd_tokenize_calls_total{protocol=\"q\"} 1\n"));
        assert_true(exposition_has(reg, "pdgw_fwd_proxy_notifs_total{protocol=\"p\"} 1\n"));
        assert_true(exposition_has(
            reg, "pdgw_fwd_notifs_rejected_total{protocol=\"p\",reason=\"peer\"} 1\n"));
        pdgw_fwd_api_set_services(NULL, NULL);
        pdgw_fwd_counter_inc("p", "tokenize_calls", "Calls."); /* no registry: dropped */
        pdgw_metrics_destroy(reg);
    }
}

static void test_promtool_rejects_garbage(void **state)
{
    (void)state;
    /* The promtool check itself can fail: a bad exposition must be flagged. */
    char msg[4096];
    int rc = promtool_check("# TYPE x counter\nx{a=\"1\" 1\n", msg, sizeof(msg));
    assert_int_not_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_invalid_and_null),
        cmocka_unit_test(test_cardinality_cap),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_gateway_metrics_and_collector),
        cmocka_unit_test(test_usage_matches_full_parse),
        cmocka_unit_test(test_series_lookup_memo),
        cmocka_unit_test(test_forwarder_counters),
        cmocka_unit_test(test_promtool_rejects_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
