/*
 * Tenants' budgets on a hand-driven clock: token buckets per second and per minute, the
 * Retry-After they give, the OpenAI rate-limit headers, reconcile in both directions, the
 * per-model budget, and which tenant a key belongs to.
 *
 * Header names and value shapes: OpenAI's rate-limits guide, section "Rate limits in headers"
 * (platform.openai.com/docs/guides/rate-limits): x-ratelimit-limit-requests,
 * x-ratelimit-limit-tokens, x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens,
 * x-ratelimit-reset-requests ("1s"), x-ratelimit-reset-tokens ("6m0s"); the reset is the time
 * until the budget is back at its initial state. retry-after-ms: openai-python's
 * src/openai/_base_client.py (_parse_retry_after_header) reads it before retry-after.
 */
#include "pdq_int.h"
#include "pdq_test_util.h"

static void test_duration_format(void **state)
{
    (void)state;
    char b[32];
    pdq_duration_format(0, b, sizeof(b));
    assert_string_equal(b, "0s");
    pdq_duration_format(1, b, sizeof(b)); /* rounded up: a reset is never announced early */
    assert_string_equal(b, "1ms");
    pdq_duration_format(12 * PDB_NSEC_PER_MSEC, b, sizeof(b));
    assert_string_equal(b, "12ms");
    pdq_duration_format(PDB_NSEC_PER_SEC, b, sizeof(b));
    assert_string_equal(b, "1s");
    pdq_duration_format(1500 * PDB_NSEC_PER_MSEC, b, sizeof(b));
    assert_string_equal(b, "1.5s");
    pdq_duration_format(360 * PDB_NSEC_PER_SEC, b, sizeof(b));
    assert_string_equal(b, "6m0s");
    pdq_duration_format(3723500 * PDB_NSEC_PER_MSEC, b, sizeof(b));
    assert_string_equal(b, "1h2m3.5s");
}

static pdq_status_t admit(pdq_t *q, size_t tenant, const char *model, uint64_t p, uint64_t c,
                          pdq_ticket_t **t, pdq_verdict_t *v)
{
    return pdq_admit(q, tenant, model, p, c, NULL, NULL, t, v);
}

static void test_rpm_window_and_retry_after(void **state)
{
    (void)state;
    fake_clock_t fc = {1000 * PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc = {.name = "acme", .budget = {.rpm = 60}};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t;
    pdq_verdict_t v;
    for (int i = 0; i < 60; i++) {
        assert_int_equal(admit(q, 0, NULL, 0, 0, &t, &v), PDQ_OK);
        pdq_release(t);
    }
    /* the 61st in the same instant: refused, and one request comes back every second */
    assert_int_equal(admit(q, 0, NULL, 0, 0, &t, &v), PDQ_REFUSED);
    assert_null(t);
    assert_int_equal(v.code, PDQ_CODE_RATE_LIMITED);
    assert_int_equal(v.http_status, 429);
    assert_int_equal(v.retry_after_ms, 1000);
    assert_string_equal(header(&v.headers, "retry-after"), "1");
    assert_string_equal(header(&v.headers, "retry-after-ms"), "1000");
    assert_string_equal(header(&v.headers, "x-ratelimit-limit-requests"), "60");
    assert_string_equal(header(&v.headers, "x-ratelimit-remaining-requests"), "0");
    assert_string_equal(header(&v.headers, "x-ratelimit-reset-requests"), "1m0s");
    assert_string_equal(pdq_code_name(v.code), "rate_limited");
    /* 999 ms later still refused with 1 ms to go; at 1000 ms admitted */
    advance_ms(&fc, 999);
    assert_int_equal(admit(q, 0, NULL, 0, 0, &t, &v), PDQ_REFUSED);
    assert_int_equal(v.retry_after_ms, 1);
    advance_ms(&fc, 1);
    assert_int_equal(admit(q, 0, NULL, 0, 0, &t, &v), PDQ_OK);
    assert_string_equal(header(&v.headers, "x-ratelimit-remaining-requests"), "0");
    pdq_release(t);
    /* after 30 s half the budget is back; reset says when all of it is */
    advance_ms(&fc, 30000);
    pdq_headers_t h;
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-remaining-requests"), "30");
    assert_string_equal(header(&h, "x-ratelimit-reset-requests"), "30s");
    assert_null(header(&h, "x-ratelimit-limit-tokens")); /* no token budget, no token headers */
    pdq_free(q);
}

static void test_rps_and_tokens(void **state)
{
    (void)state;
    fake_clock_t fc = {5 * PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc = {.name = "acme", .budget = {.rps = 2, .tpm = 6000}};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t1, *t2, *t3;
    pdq_verdict_t v;
    assert_int_equal(admit(q, 0, NULL, 1000, 1000, &t1, &v), PDQ_OK);
    /* only rps is set: the requests headers describe it */
    assert_string_equal(header(&v.headers, "x-ratelimit-limit-requests"), "2");
    assert_string_equal(header(&v.headers, "x-ratelimit-limit-tokens"), "6000");
    assert_string_equal(header(&v.headers, "x-ratelimit-remaining-tokens"), "4000");
    /* 2000 of 6000 per minute used: 20 s until full */
    assert_string_equal(header(&v.headers, "x-ratelimit-reset-tokens"), "20s");
    assert_int_equal(admit(q, 0, NULL, 1000, 1000, &t2, &v), PDQ_OK);
    assert_int_equal(admit(q, 0, NULL, 1, 1, &t3, &v), PDQ_REFUSED);
    assert_int_equal(v.code, PDQ_CODE_RATE_LIMITED);
    assert_int_equal(v.retry_after_ms, 500); /* 2 per second: one back every 500 ms */
    advance_ms(&fc, 1000);
    /* 2000 tokens left (plus 100 refilled in that second): 3000 do not fit */
    assert_int_equal(admit(q, 0, NULL, 2000, 1000, &t3, &v), PDQ_REFUSED);
    assert_int_equal(v.code, PDQ_CODE_TOKENS_EXHAUSTED);
    assert_string_equal(pdq_code_name(v.code), "tokens_exhausted");
    /* 900 tokens short at 100 per second */
    assert_int_equal(v.retry_after_ms, 9000);
    assert_string_equal(header(&v.headers, "retry-after"), "9");
    pdq_release(t1);
    pdq_release(t2);
    pdq_free(q);
}

static void test_reconcile_up_and_down(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc = {.name = "acme",
                              .budget = {.tpm = 10000, .prompt_tpm = 8000, .completion_tpm = 5000}};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t;
    pdq_verdict_t v;
    pdq_headers_t h;
    assert_int_equal(admit(q, 0, NULL, 1000, 4000, &t, &v), PDQ_OK);
    assert_string_equal(header(&v.headers, "x-ratelimit-remaining-tokens"), "5000");
    /* the answer was shorter than estimated: 3000 completion tokens come back */
    pdq_reconcile(t, 1000, 200, 1000);
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-remaining-tokens"), "8000");
    pdq_reconcile(t, 99999, 0, 99999); /* only once */
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-remaining-tokens"), "8000");
    pdq_release(t);

    /* longer than estimated: charged after the fact, into debt */
    assert_int_equal(admit(q, 0, NULL, 1000, 1000, &t, &v), PDQ_OK);
    pdq_reconcile(t, 3000, 0, 6000); /* 9000 real against 2000 estimated, 6000 left */
    pdq_release(t);
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-remaining-tokens"), "0");
    /* tpm is 1000 in debt: a 600-token request fits after 1600 came back at 10000/min =
     * 9.6 s; completion is 2000 in debt (3000 left - 5000 more than estimated): 300 more
     * fit after 2300 came back at 5000/min = 27.6 s. The longer wait wins. */
    assert_int_equal(admit(q, 0, NULL, 300, 300, &t, &v), PDQ_REFUSED);
    assert_int_equal(v.code, PDQ_CODE_TOKENS_EXHAUSTED);
    assert_int_equal(v.retry_after_ms, 27600);
    advance_ms(&fc, 27599);
    assert_int_equal(admit(q, 0, NULL, 300, 300, &t, &v), PDQ_REFUSED);
    advance_ms(&fc, 1);
    assert_int_equal(admit(q, 0, NULL, 300, 300, &t, &v), PDQ_OK);
    pdq_release(t);
    pdq_free(q);
}

static void test_request_larger_than_budget(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc = {.name = "acme", .budget = {.tpm = 1000}};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t;
    pdq_verdict_t v;
    /* a full bucket lets one oversized request through (never waits forever) */
    assert_int_equal(admit(q, 0, NULL, 1500, 0, &t, &v), PDQ_OK);
    pdq_release(t);
    assert_int_equal(admit(q, 0, NULL, 1500, 0, &t, &v), PDQ_REFUSED);
    /* 500 in debt: the bucket is full again after 1500 tokens at 1000/min = 90 s */
    assert_int_equal(v.retry_after_ms, 90000);
    assert_string_equal(header(&v.headers, "x-ratelimit-reset-tokens"), "1m30s");
    /* absurd estimates from a client: refused with a bounded Retry-After, never a wrap */
    assert_int_equal(admit(q, 0, NULL, UINT64_MAX, UINT64_MAX, &t, &v), PDQ_REFUSED);
    assert_true(v.retry_after_ms > 0 && v.retry_after_ms <= 86400000);
    pdq_free(q);
}

static void test_model_budget_and_keys(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    const char *keys_a[] = {"key-a1", "key-a2"};
    pdq_model_budget_t mb[] = {{.model = "big", .budget = {.rpm = 2}}};
    pdq_tenant_config_t tc[] = {
        {.name = "free", .budget = {.rpm = 5}},
        {.name = "acme",
         .api_keys = keys_a,
         .n_api_keys = 2,
         .budget = {.rpm = 100},
         .models = mb,
         .n_models = 1},
    };
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .default_tenant = "free"};
    pdq_t *q = new_quota(&cfg, &fc);
    assert_int_equal(pdq_tenant_count(q), 3);
    assert_int_equal(pdq_tenant_by_key(q, NULL), 0);
    assert_int_equal(pdq_tenant_by_key(q, ""), 0);
    assert_int_equal(pdq_tenant_by_key(q, "key-a2"), 1);
    size_t other = pdq_tenant_by_key(q, "who-is-this");
    assert_int_equal(other, 2);
    assert_string_equal(pdq_tenant_name(q, other), "other");
    assert_int_equal(pdq_tenant_by_name(q, "acme"), 1);
    assert_int_equal(pdq_tenant_by_name(q, "nobody"), (size_t)-1);

    pdq_ticket_t *t;
    pdq_verdict_t v;
    /* the model's budget binds before the tenant's, and the headers show the tighter one */
    assert_int_equal(admit(q, 1, "big", 0, 0, &t, &v), PDQ_OK);
    assert_string_equal(header(&v.headers, "x-ratelimit-limit-requests"), "2");
    pdq_release(t);
    assert_int_equal(admit(q, 1, "big", 0, 0, &t, &v), PDQ_OK);
    pdq_release(t);
    assert_int_equal(admit(q, 1, "big", 0, 0, &t, &v), PDQ_REFUSED);
    assert_int_equal(v.retry_after_ms, 30000);
    /* other models of the same tenant are not held up */
    assert_int_equal(admit(q, 1, "small", 0, 0, &t, &v), PDQ_OK);
    assert_string_equal(header(&v.headers, "x-ratelimit-limit-requests"), "100");
    pdq_release(t);
    /* "other" has the default tenant's limits, in its own bucket */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(admit(q, other, NULL, 0, 0, &t, &v), PDQ_OK);
        pdq_release(t);
    }
    assert_int_equal(admit(q, other, NULL, 0, 0, &t, &v), PDQ_REFUSED);
    assert_int_equal(admit(q, 0, NULL, 0, 0, &t, &v), PDQ_OK);
    pdq_release(t);
    assert_int_equal(admit(q, 99, NULL, 0, 0, &t, &v), PDQ_ERR_INVALID);
    pdq_free(q);
}

static void test_bad_configs(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdb_clock_t c = fake_clock_of(&fc);
    pdq_t *q = NULL;
    char err[256];
    pdq_config_t empty = {0};
    assert_int_equal(pdq_new(&empty, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    pdq_tenant_config_t dup[] = {{.name = "a"}, {.name = "a"}};
    pdq_config_t cfg = {.tenants = dup, .n_tenants = 2};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "twice"));
    pdq_tenant_config_t other[] = {{.name = "other"}};
    cfg = (pdq_config_t){.tenants = other, .n_tenants = 1};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    pdq_tenant_config_t bad_name[] = {{.name = "a b"}};
    cfg = (pdq_config_t){.tenants = bad_name, .n_tenants = 1};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    pdq_tenant_config_t res[] = {{.name = "a", .reserved = 5}, {.name = "b", .reserved = 6}};
    cfg = (pdq_config_t){.tenants = res, .n_tenants = 2, .max_concurrent = 10};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "reserved"));
    const char *k[] = {"same"};
    pdq_tenant_config_t keys[] = {{.name = "a", .api_keys = k, .n_api_keys = 1},
                                  {.name = "b", .api_keys = k, .n_api_keys = 1}};
    cfg = (pdq_config_t){.tenants = keys, .n_tenants = 2};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    pdq_tenant_config_t one[] = {{.name = "a", .priority = 8}};
    cfg = (pdq_config_t){.tenants = one, .n_tenants = 1};
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    one[0].priority = 0;
    one[0].weight = 0.001; /* below the smallest share the fair queue's tags allow for */
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "weight"));
    one[0].weight = 0;
    cfg.default_tenant = "nobody";
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    cfg.default_tenant = NULL;
    /* TLS files are read at start-up: a missing one is named there, not at the first sync */
    cfg.store.url = "rediss://cache:6380/0";
    cfg.store.tls_ca_file = "/nonexistent/ca.pem";
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "/nonexistent/ca.pem"));
    cfg.store.tls_ca_file = NULL;
    cfg.store.tls_cert_file = "client.pem"; /* a certificate without its key */
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "tls_key_file"));
    cfg.store.url = "redis://cache:6380/0"; /* TLS settings on a plain URL would do nothing */
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_non_null(strstr(err, "rediss://"));
    cfg.store.tls_cert_file = NULL;
    cfg.store.url = "http://cache";
    assert_int_equal(pdq_new(&cfg, &c, &q, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_null(q);
}

/* Leased mode (a store is up) and the fall back to local limits, on the bucket itself. */
static void test_leased_bucket(void **state)
{
    (void)state;
    uint64_t now = PDB_NSEC_PER_SEC;
    pdq_bucket_t b;
    pdq_bucket_init(&b, 600, 60.0, 0.5, now); /* 600/min fleet-wide, 2 expected replicas */
    assert_true(b.level == 300);              /* local limits until the store answers */
    b.slice = 60;
    b.sync_ns = 100 * PDB_NSEC_PER_MSEC;
    pdq_bucket_set_leased(&b, true, now);
    assert_true(b.level == 0); /* nothing leased yet */
    /* it may run ahead of its lease by half a slice */
    for (int i = 0; i < 30; i++) {
        assert_int_equal(pdq_bucket_wait_ns(&b, 1, now), 0);
        pdq_bucket_spend(&b, 1, now);
    }
    /* then waits at least until the next sync */
    assert_int_equal(pdq_bucket_wait_ns(&b, 1, now), 100 * PDB_NSEC_PER_MSEC);
    /* a sync pays the debt and leases +slice/2: the store thread adds what was granted */
    b.level += 60;
    b.fleet_level = 510;
    b.fleet_stamp = now;
    b.fleet_known = true;
    assert_true(b.level == 30);
    assert_true(pdq_bucket_remaining(&b, now) == 540); /* the fleet's level plus the lease */
    /* the store goes away: this replica's half of what the fleet had, plus its lease */
    pdq_bucket_set_leased(&b, false, now);
    assert_true(b.level == 30 + 255);
    /* local refill at 300/min up to 300 */
    pdq_bucket_refill(&b, now + 3 * PDB_NSEC_PER_SEC);
    assert_true(b.level == 300);
    /* back to leased: locally refilled tokens were never the fleet's */
    pdq_bucket_set_leased(&b, true, now + 3 * PDB_NSEC_PER_SEC);
    assert_true(b.level == 0);
    assert_false(b.fleet_known);
    /* never synced in this leased spell: the fall back starts from a full local share */
    pdq_bucket_set_leased(&b, false, now + 3 * PDB_NSEC_PER_SEC);
    assert_true(b.level == 300);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_format),
        cmocka_unit_test(test_rpm_window_and_retry_after),
        cmocka_unit_test(test_rps_and_tokens),
        cmocka_unit_test(test_reconcile_up_and_down),
        cmocka_unit_test(test_request_larger_than_budget),
        cmocka_unit_test(test_model_budget_and_keys),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_leased_bucket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
