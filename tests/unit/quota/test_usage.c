/*
 * Usage accounting by phase per (tenant, model): totals, per-minute windows on a driven
 * clock, the JSON for GET /admin/usage with filters, and Prometheus text whose labels stay
 * within configured tenants + "other" and configured models + "other".
 */
#include <stdlib.h>

#include "pdq_test_util.h"

static pdq_t *two_tenants(fake_clock_t *fc)
{
    static pdq_model_budget_t mb[] = {{.model = "llama", .budget = {0}}};
    static pdq_tenant_config_t tc[] = {{.name = "acme", .models = mb, .n_models = 1},
                                       {.name = "beta"}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2};
    return new_quota(&cfg, fc);
}

static void one_request(pdq_t *q, size_t tenant, const char *model, uint64_t prompt,
                        uint64_t cached, uint64_t completion)
{
    pdq_ticket_t *t;
    assert_int_equal(pdq_admit(q, tenant, model, prompt, completion, NULL, NULL, &t, NULL), PDQ_OK);
    pdq_ticket_phase(t, PDQ_PHASE_PREFILL, 20 * PDB_NSEC_PER_MSEC);
    pdq_ticket_phase(t, PDQ_PHASE_TRANSFER, 5 * PDB_NSEC_PER_MSEC);
    pdq_ticket_phase(t, PDQ_PHASE_DECODE, 100 * PDB_NSEC_PER_MSEC);
    pdq_ticket_kv_bytes(t, 1 << 20);
    pdq_reconcile(t, prompt, cached, completion);
    pdq_release(t);
}

static json_int_t get_int(json_t *root, const char *tenant, const char *model, const char *key)
{
    json_t *t = json_object_get(json_object_get(root, "tenants"), tenant);
    json_t *o =
        model ? json_object_get(json_object_get(t, "models"), model) : json_object_get(t, "total");
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static void test_totals_and_windows(void **state)
{
    (void)state;
    fake_clock_t fc = {3600 * PDB_NSEC_PER_SEC};
    pdq_t *q = two_tenants(&fc);
    one_request(q, 0, "llama", 1000, 600, 50);
    one_request(q, 0, "mystery-model", 10, 0, 5); /* unconfigured model: "other" */
    advance_ms(&fc, 5 * 60 * 1000);
    one_request(q, 0, "llama", 100, 0, 10);
    one_request(q, 1, NULL, 7, 0, 3);

    json_t *all = pdq_usage_json(q, 0, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(all, "scope")), "replica");
    assert_int_equal(get_int(all, "acme", "llama", "requests"), 2);
    /* computed on a prefill = prompt - cached */
    assert_int_equal(get_int(all, "acme", "llama", "prompt_tokens"), 400 + 100);
    assert_int_equal(get_int(all, "acme", "llama", "cached_prompt_tokens"), 600);
    assert_int_equal(get_int(all, "acme", "llama", "completion_tokens"), 60);
    assert_int_equal(get_int(all, "acme", "llama", "kv_bytes"), 2 << 20);
    assert_int_equal(get_int(all, "acme", "other", "requests"), 1);
    assert_int_equal(get_int(all, "acme", "mystery-model", "requests"), -1);
    assert_int_equal(get_int(all, "acme", NULL, "requests"), 3);
    assert_int_equal(get_int(all, "beta", NULL, "completion_tokens"), 3);
    json_t *ph = json_object_get(
        json_object_get(
            json_object_get(json_object_get(json_object_get(all, "tenants"), "acme"), "models"),
            "llama"),
        "phase_seconds");
    assert_true(json_real_value(json_object_get(ph, "decode")) > 0.1999 &&
                json_real_value(json_object_get(ph, "decode")) < 0.2001);
    json_decref(all);

    /* the last 2 minutes hold only what happened after the clock moved */
    json_t *recent = pdq_usage_json(q, 120, NULL, NULL);
    assert_int_equal(get_int(recent, "acme", "llama", "requests"), 1);
    assert_int_equal(get_int(recent, "acme", "other", "requests"), -1);
    json_decref(recent);
    json_t *hour = pdq_usage_json(q, 3600, NULL, NULL);
    assert_int_equal(get_int(hour, "acme", NULL, "requests"), 3);
    json_decref(hour);
    /* an hour and more later, the windows are empty, the totals are not */
    advance_ms(&fc, 61 * 60 * 1000);
    hour = pdq_usage_json(q, 3600, NULL, NULL);
    assert_int_equal(get_int(hour, "acme", NULL, "requests"), 0);
    json_decref(hour);
    /* a slot reused an hour later starts from zero */
    one_request(q, 0, "llama", 1, 0, 1);
    hour = pdq_usage_json(q, 60, NULL, NULL);
    assert_int_equal(get_int(hour, "acme", "llama", "requests"), 1);
    json_decref(hour);

    /* filters */
    json_t *f = pdq_usage_json(q, 0, "beta", NULL);
    assert_null(json_object_get(json_object_get(f, "tenants"), "acme"));
    assert_int_equal(get_int(f, "beta", NULL, "requests"), 1);
    json_decref(f);
    f = pdq_usage_json(q, 0, NULL, "llama");
    assert_int_equal(get_int(f, "acme", NULL, "requests"), 3); /* the total of the filter */
    json_decref(f);
    pdq_free(q);
}

static void test_prometheus_bounded_labels(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_t *q = two_tenants(&fc);
    char model[32];
    for (int i = 0; i < 200; i++) {
        snprintf(model, sizeof(model), "random-%d", i);
        one_request(q, 1, model, 2, 1, 1);
    }
    one_request(q, pdq_tenant_by_key(q, "unknown-key"), "llama", 5, 0, 5);
    pdb_buf_t out = PDB_BUF_INIT;
    pdb_prom_t p;
    pdb_prom_init(&p, &out);
    pdq_usage_prometheus(q, &p);
    assert_int_equal(pdb_prom_status(&p), PDB_OK);
    const char *text = out.data;
    assert_non_null(strstr(text, "pdgw_quota_requests_total{tenant=\"beta\",model=\"other\"} 200"));
    assert_non_null(strstr(text, "pdgw_quota_cached_prompt_tokens_total{tenant=\"beta\","
                                 "model=\"other\"} 200"));
    assert_non_null(strstr(text, "pdgw_quota_requests_total{tenant=\"other\",model=\"llama\"} 1"));
    assert_non_null(strstr(text, "pdgw_quota_phase_seconds_total{tenant=\"beta\",model=\"other\","
                                 "phase=\"decode\"} 20"));
    assert_non_null(strstr(text, "pdgw_quota_refused_total{tenant=\"acme\",reason=\"rate_limited\"}"
                                 " 0"));
    assert_null(strstr(text, "random-"));
    assert_null(strstr(text, "unknown-key"));
    assert_null(strstr(text, "pdgw_quota_store_connected")); /* no store configured */
    pdb_buf_free(&out);
    pdq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_totals_and_windows),
        cmocka_unit_test(test_prometheus_bounded_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
