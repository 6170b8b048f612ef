/*
 * Allocation failures from the base layer's wrapper: fail the Nth allocation for every N of
 * a whole scenario (build from JSON, admit, wait, reload, usage JSON and Prometheus, free). Each
 * run must end cleanly - an error or a degraded answer, never a crash - and under ASan/LSan nothing
 * may leak.
 */
#include <stdlib.h>

#include "pdb/pdb_alloc.h"
#include "pdq_test_util.h"
#include "pdquota/pdq_config_json.h"

static const char CONFIG[] =
    "{\"max_concurrent\": 2, \"tenants\": [{\"name\": \"a\", \"requests_per_minute\": 100, "
    "\"api_keys\": "
    "[\"k\"], \"models\": [{\"model\": \"m\", \"tokens_per_minute\": 1000}]}, {\"name\": \"b\", "
    "\"weight\": 2}], \"other\": {\"requests_per_minute\": 10}}";

static void on_ready(pdq_ticket_t *t, void *arg)
{
    *(pdq_ticket_t **)arg = t;
}

static json_t *config; /* parsed once: jansson's own lexer is not what is tested here */

/* One pass; returns true when it ran to the end without any failure showing. */
static bool scenario(void)
{
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdb_clock_t clk = fake_clock_of(&fc);
    pdq_config_json_t *c = NULL;
    char err[256];
    bool clean = true;
    if (pdq_config_from_json(config, &c, err, sizeof(err)) != PDQ_OK)
        return false;
    pdq_t *q = NULL;
    if (pdq_new(pdq_config_json_get(c), &clk, &q, err, sizeof(err)) != PDQ_OK) {
        pdq_config_json_free(c);
        return false;
    }
    pdq_config_json_free(c);
    pdq_ticket_t *t[3] = {NULL, NULL, NULL}, *ready = NULL;
    pdq_status_t st[3];
    for (int i = 0; i < 3; i++) {
        st[i] = pdq_admit(q, pdq_tenant_by_key(q, i ? NULL : "k"), "m", 10, 10, on_ready, &ready,
                          &t[i], NULL);
        if (st[i] == PDQ_ERR_NOMEM)
            clean = false;
    }
    for (int i = 0; i < 3; i++)
        if (st[i] == PDQ_OK) {
            pdq_reconcile(t[i], 10, 5, 10);
            pdq_release(t[i]);
        }
    /* a reload to the same tenants while one may wait: prepare fails cleanly or applies */
    if (pdq_config_from_json(config, &c, err, sizeof(err)) == PDQ_OK) {
        pdq_update_t *upd = NULL;
        if (pdq_update_prepare(q, pdq_config_json_get(c), &upd, err, sizeof(err)) == PDQ_OK)
            pdq_update_commit(q, upd);
        else
            clean = false;
        pdq_config_json_free(c);
    } else {
        clean = false;
    }
    if (ready)
        pdq_release(ready);
    else if (st[2] == PDQ_WAIT)
        pdq_cancel(t[2]);
    json_t *u = pdq_usage_json(q, 0, NULL, NULL);
    clean = clean && u != NULL;
    json_decref(u);
    pdb_buf_t out = PDB_BUF_INIT;
    pdb_prom_t p;
    pdb_prom_init(&p, &out);
    pdq_usage_prometheus(q, &p);
    clean = clean && pdb_prom_status(&p) == PDB_OK;
    pdb_buf_free(&out);
    pdq_free(q);
    return clean;
}

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    json_error_t je;
    config = json_loads(CONFIG, 0, &je);
    assert_non_null(config);
    (void)pdb_alloc_count();
    uint64_t before = pdb_alloc_count();
    assert_true(scenario());
    uint64_t total = pdb_alloc_count() - before;
    assert_true(total > 20);
    int degraded = 0;
    for (uint64_t n = 1; n <= total; n++) {
        pdb_alloc_fail_at(n, 0);
        if (!scenario())
            degraded++;
        pdb_alloc_fail_at(0, 0);
    }
    /* most failures must show (an allocation nobody checks would let it pass silently) */
    assert_true(degraded > 0);
    assert_true(scenario()); /* and everything works again afterwards */
}

static void test_sticky_failure(void **state)
{
    (void)state;
    for (uint64_t n = 1; n < 40; n += 3) {
        pdb_alloc_fail_at(n, 1);
        (void)scenario();
        pdb_alloc_fail_at(0, 0);
    }
    json_decref(config);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
        cmocka_unit_test(test_sticky_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
