/*
 * Configuration input: the quota section as JSON and the store URL. Good input gives the
 * structs pdq_new takes; every kind of bad input gives an error naming the key, never a crash.
 */
#include "pdq_test_util.h"
#include "pdquota/pdq_config_json.h"
#include "pdquota/pdq_store_url.h"

static void test_store_url(void **state)
{
    (void)state;
    pdq_store_url_t u;
    char err[256];
    assert_int_equal(pdq_store_url_parse("redis://cache:6380/2", &u, err, sizeof(err)), PDQ_OK);
    assert_string_equal(u.host, "cache");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 2);
    assert_false(u.tls);
    assert_string_equal(u.user, "");
    assert_int_equal(
        pdq_store_url_parse("redis://bob:s3cret@10.0.0.5:7000/0", &u, err, sizeof(err)), PDQ_OK);
    assert_string_equal(u.user, "bob");
    assert_string_equal(u.password, "s3cret");
    assert_string_equal(u.host, "10.0.0.5");
    assert_int_equal(pdq_store_url_parse("redis://:pw@h", &u, err, sizeof(err)), PDQ_OK);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "pw");
    assert_int_equal(u.port, 6379);
    assert_int_equal(pdq_store_url_parse("rediss://[::1]:6390/", &u, err, sizeof(err)), PDQ_OK);
    assert_true(u.tls);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 6390);
    assert_true(pdq_store_tls_supported()); /* GnuTLS is a build dependency */

    const char *bad[] = {
        "",
        "http://h",
        "redis://",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:12ab",
        "redis://h/x",
        "redis://h:1/2/3",
        "redis://[::1",
        "redis://h :1",
        "redis://h:1/99999999999",
        "redis:/h",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(pdq_store_url_parse(bad[i], &u, err, sizeof(err)), PDQ_ERR_INVALID);
        assert_non_null(strstr(err, "quota_store"));
    }
    char huge[2000];
    memset(huge, 'a', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    memcpy(huge, "redis://", 8);
    assert_int_equal(pdq_store_url_parse(huge, &u, err, sizeof(err)), PDQ_ERR_INVALID);
    assert_int_equal(pdq_store_url_parse(NULL, &u, err, sizeof(err)), PDQ_ERR_INVALID);
}

static const char GOOD[] =
    "{\"max_concurrent\": 8, \"default_tenant\": \"free\","
    " \"tenants\": [{\"name\": \"free\", \"requests_per_minute\": 60},"
    "  {\"name\": \"acme\", \"weight\": 3, \"priority\": 0, \"max_concurrent\": 4, \"reserved\": 2,"
    "   \"max_waiting\": 10, \"api_keys\": [\"k1\", \"k2\"], \"tokens_per_minute\": 1000,"
    "   \"models\": [{\"model\": \"llama\", \"requests_per_minute\": 5}]}],"
    " \"other\": {\"requests_per_minute\": 1},"
    " \"store\": {\"url\": \"redis://127.0.0.1:1/0\", \"fail_mode\": \"closed\","
    "   \"expected_replicas\": 3, \"lease_fraction\": 0.1}}";

static void test_json_good(void **state)
{
    (void)state;
    json_error_t je;
    json_t *o = json_loads(GOOD, 0, &je);
    assert_non_null(o);
    pdq_config_json_t *c = NULL;
    char err[256] = "";
    assert_int_equal(pdq_config_from_json(o, &c, err, sizeof(err)), PDQ_OK);
    json_decref(o); /* the parsed config keeps its own reference */
    const pdq_config_t *cfg = pdq_config_json_get(c);
    assert_int_equal(cfg->n_tenants, 2);
    assert_int_equal(cfg->max_concurrent, 8);
    assert_string_equal(cfg->default_tenant, "free");
    assert_string_equal(cfg->tenants[1].name, "acme");
    assert_true(cfg->tenants[1].weight == 3);
    assert_int_equal(cfg->tenants[1].reserved, 2);
    assert_int_equal(cfg->tenants[1].n_api_keys, 2);
    assert_string_equal(cfg->tenants[1].api_keys[1], "k2");
    assert_int_equal(cfg->tenants[1].budget.tpm, 1000);
    assert_int_equal(cfg->tenants[1].n_models, 1);
    assert_int_equal(cfg->tenants[1].models[0].budget.rpm, 5);
    assert_int_equal(cfg->other->budget.rpm, 1);
    assert_int_equal(cfg->store.fail_mode, PDQ_FAIL_CLOSED);
    assert_int_equal(cfg->store.expected_replicas, 3);
    /* and it builds (no store thread until pdq_start: nothing connects) */
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_t *q = new_quota(cfg, &fc);
    assert_int_equal(pdq_tenant_by_key(q, "k1"), 1);
    /* fail_closed before the store was ever reached: refused as unavailable (503) */
    pdq_ticket_t *t;
    pdq_verdict_t v;
    assert_int_equal(pdq_admit(q, 0, NULL, 1, 1, NULL, NULL, &t, &v), PDQ_REFUSED);
    assert_int_equal(v.code, PDQ_CODE_STORE_UNAVAILABLE);
    assert_int_equal(v.http_status, 503);
    assert_string_equal(pdq_code_name(v.code), "quota_store_unavailable");
    pdq_free(q);
    pdq_config_json_free(c);

    /* the short store form */
    o = json_loads("{\"tenants\": [{\"name\": \"a\"}], \"store\": \"redis://h/1\"}", 0, &je);
    assert_int_equal(pdq_config_from_json(o, &c, err, sizeof(err)), PDQ_OK);
    assert_string_equal(pdq_config_json_get(c)->store.url, "redis://h/1");
    pdq_config_json_free(c);
    json_decref(o);
}

static void test_json_bad(void **state)
{
    (void)state;
    static const struct {
        const char *json, *says;
    } cases[] = {
        {"[]", "must be an object"},
        {"{}", "tenants"},
        {"{\"tenants\": []}", "tenants"},
        {"{\"tenants\": [{\"requests_per_minute\": 1}]}", "name"},
        {"{\"tenants\": [{\"name\": \"a\", \"requests_per_minute\": -1}]}", "requests_per_minute"},
        {"{\"tenants\": [{\"name\": \"a\", \"requests_per_minute\": 1.5}]}", "requests_per_minute"},
        {"{\"tenants\": [{\"name\": \"a\", \"rpn\": 1}]}", "unknown key"},
        {"{\"tenants\": [{\"name\": \"a\", \"weight\": \"x\"}]}", "weight"},
        {"{\"tenants\": [{\"name\": \"a\", \"priority\": 9}]}", "priority"},
        {"{\"tenants\": [{\"name\": \"a\", \"api_keys\": [1]}]}", "api_keys"},
        {"{\"tenants\": [{\"name\": \"a\", \"api_keys\": \"k\"}]}", "api_keys"},
        {"{\"tenants\": [{\"name\": \"a\", \"models\": [{\"requests_per_minute\": 1}]}]}", "model"},
        {"{\"tenants\": [{\"name\": \"a\", \"models\": {}}]}", "models"},
        {"{\"tenants\": [{\"name\": \"\"}]}", "name"},
        {"{\"tenants\": [{\"name\": \"a\"}], \"store\": {\"fail_mode\": \"maybe\", \"url\": "
         "\"redis://h\"}}",
         "fail_mode"},
        {"{\"tenants\": [{\"name\": \"a\"}], \"store\": {}}", "url"},
        {"{\"tenants\": [{\"name\": \"a\"}], \"store\": 5}", "store"},
        {"{\"tenants\": [{\"name\": \"a\"}], \"other\": {\"name\": \"x\"}}", "other"},
        {"{\"tenants\": [{\"name\": \"a\"}], \"max_concurrent\": 99999999999}", "max_concurrent"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t je;
        json_t *o = json_loads(cases[i].json, JSON_DECODE_ANY, &je);
        assert_non_null(o);
        pdq_config_json_t *c = NULL;
        char err[256] = "";
        assert_int_equal(pdq_config_from_json(o, &c, err, sizeof(err)), PDQ_ERR_INVALID);
        if (strstr(err, cases[i].says) == NULL)
            fail_msg("case %zu: \"%s\" does not name %s", i, err, cases[i].says);
        assert_null(c);
        json_decref(o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_url),
        cmocka_unit_test(test_json_good),
        cmocka_unit_test(test_json_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
