/*
 * Reloading the tenants of a running quota object (pdq_update_*): budgets keep what was spent
 * up to their new size, a budget switched on starts full, keys move between tenants, raised
 * limits let waiters in, weights change the shares of what waits from then on, tenants are
 * added and removed by name, and the changes a running object cannot take are refused with
 * nothing changed.
 */
#include "pdq_int.h"
#include "pdq_test_util.h"

static pdq_status_t admit(pdq_t *q, size_t tenant, uint64_t p, uint64_t c, pdq_ticket_t **t)
{
    return pdq_admit(q, tenant, NULL, p, c, NULL, NULL, t, NULL);
}

static void update_ok(pdq_t *q, const pdq_config_t *cfg)
{
    pdq_update_t *u = NULL;
    char err[256] = "";
    pdq_status_t st = pdq_update_prepare(q, cfg, &u, err, sizeof(err));
    if (st != PDQ_OK)
        print_error("pdq_update_prepare: %s\n", err);
    assert_int_equal(st, PDQ_OK);
    pdq_update_commit(q, u);
}

static void update_refused(pdq_t *q, const pdq_config_t *cfg, pdq_status_t st, const char *why)
{
    pdq_update_t *u = NULL;
    char err[256] = "";
    assert_int_equal(pdq_update_prepare(q, cfg, &u, err, sizeof(err)), st);
    assert_null(u);
    if (strstr(err, why) == NULL)
        print_error("error \"%s\" lacks \"%s\"\n", err, why);
    assert_non_null(strstr(err, why));
}

static int admitted_in_a_row(pdq_t *q, size_t tenant, uint64_t p)
{
    int n = 0;
    pdq_ticket_t *t;
    while (n < 10000 && admit(q, tenant, p, 0, &t) == PDQ_OK) {
        pdq_release(t);
        n++;
    }
    return n;
}

static void test_budget_keeps_what_was_spent(void **state)
{
    (void)state;
    fake_clock_t fc = {1000 * PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc = {.name = "acme", .budget = {.rpm = 10}};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(admit(q, 0, 0, 0, &t), PDQ_OK);
        pdq_release(t);
    }
    /* raised to 20: the 8 spent stay spent, 12 are left (not a fresh 20) */
    tc.budget.rpm = 20;
    update_ok(q, &cfg);
    assert_int_equal(admitted_in_a_row(q, 0, 0), 12);
    /* lowered to 5 after a minute of refill: at most the new size */
    advance_ms(&fc, 60000);
    tc.budget.rpm = 5;
    update_ok(q, &cfg);
    assert_int_equal(admitted_in_a_row(q, 0, 0), 5);
    /* lowered below what was spent: in debt until the new rate paid it back */
    advance_ms(&fc, 60000);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(admit(q, 0, 0, 0, &t), PDQ_OK);
        pdq_release(t);
    }
    tc.budget.rpm = 2; /* 4 spent of 2: 2 in debt */
    update_ok(q, &cfg);
    assert_int_equal(admitted_in_a_row(q, 0, 0), 0);
    advance_ms(&fc, 60000); /* the debt and one request back (a minute of 2 requests) */
    assert_int_equal(admitted_in_a_row(q, 0, 0), 0);
    advance_ms(&fc, 30000);
    assert_int_equal(admitted_in_a_row(q, 0, 0), 1);
    /* a token budget switched on starts full; rpm switched off admits freely */
    tc.budget.rpm = 0;
    tc.budget.tpm = 100;
    update_ok(q, &cfg);
    assert_int_equal(admitted_in_a_row(q, 0, 10), 10);
    pdq_headers_t h;
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-limit-tokens"), "100");
    assert_null(header(&h, "x-ratelimit-limit-requests"));
    pdq_free(q);
}

static void test_keys_move_between_tenants(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    const char *ka[] = {"key-1"}, *kb[] = {"key-2"}, *kb2[] = {"key-2", "key-1"};
    pdq_tenant_config_t tc[2] = {{.name = "a", .api_keys = ka, .n_api_keys = 1},
                                 {.name = "b", .api_keys = kb, .n_api_keys = 1}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2};
    pdq_t *q = new_quota(&cfg, &fc);
    assert_int_equal(pdq_tenant_by_key(q, "key-1"), 0);
    assert_int_equal(pdq_tenant_by_key(q, "key-3"), 2); /* other */
    tc[0].n_api_keys = 0;
    tc[1].api_keys = kb2;
    tc[1].n_api_keys = 2;
    update_ok(q, &cfg);
    assert_int_equal(pdq_tenant_by_key(q, "key-1"), 1);
    assert_int_equal(pdq_tenant_by_key(q, "key-2"), 1);
    /* a key given to two tenants is refused and the running keys stay */
    tc[0].api_keys = ka;
    tc[0].n_api_keys = 1;
    update_refused(q, &cfg, PDQ_ERR_INVALID, "two tenants");
    assert_int_equal(pdq_tenant_by_key(q, "key-1"), 1);
    pdq_free(q);
}

static void on_ready(pdq_ticket_t *t, void *arg)
{
    (void)t;
    (*(int *)arg)++;
}

static void test_raised_limit_lets_waiters_in(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdq_tenant_config_t tc = {.name = "a", .max_concurrent = 1};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *run, *w1, *w2;
    int ready = 0;
    assert_int_equal(admit(q, 0, 1, 1, &run), PDQ_OK);
    assert_int_equal(pdq_admit(q, 0, NULL, 1, 1, on_ready, &ready, &w1, NULL), PDQ_WAIT);
    assert_int_equal(pdq_admit(q, 0, NULL, 1, 1, on_ready, &ready, &w2, NULL), PDQ_WAIT);
    tc.max_concurrent = 2;
    update_ok(q, &cfg);
    assert_int_equal(ready, 1); /* one more slot: the oldest waiter has it */
    tc.max_concurrent = 0;
    update_ok(q, &cfg);
    assert_int_equal(ready, 2);
    pdq_release(w1);
    pdq_release(w2);
    pdq_release(run);
    pdq_free(q);
}

/* Under backlog with a global limit of one slot, who is served next, for <n> grants. */
static void serve_order(pdq_t *q, int n, int per_tenant[2])
{
    pdq_ticket_t *run, *w[2][64];
    int ready = 0, nw[2] = {0, 0};
    assert_int_equal(admit(q, 0, 1, 0, &run), PDQ_OK);
    for (int i = 0; i < 32; i++)
        for (int k = 0; k < 2; k++)
            assert_int_equal(
                pdq_admit(q, (size_t)k, NULL, 100, 0, on_ready, &ready, &w[k][nw[k]++], NULL),
                PDQ_WAIT);
    per_tenant[0] = per_tenant[1] = 0;
    for (int i = 0; i < n; i++) {
        pdq_release(run);
        run = NULL;
        for (int k = 0; k < 2 && run == NULL; k++)
            for (int j = 0; j < nw[k]; j++)
                if (w[k][j] != NULL && w[k][j]->state == PDQ_T_GRANTED) {
                    run = w[k][j];
                    w[k][j] = NULL;
                    per_tenant[k]++;
                    break;
                }
        assert_non_null(run);
    }
    pdq_release(run);
    /* the rest: a waiter granted meanwhile is released by its cancel (and grants the next) */
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < nw[k]; j++)
            if (w[k][j] != NULL)
                (void)pdq_cancel(w[k][j]);
}

static void test_global_limit_moves(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdq_tenant_config_t tc = {.name = "a"};
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1, .max_concurrent = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *run, *w;
    int ready = 0;
    assert_int_equal(admit(q, 0, 1, 1, &run), PDQ_OK);
    assert_int_equal(pdq_admit(q, 0, NULL, 1, 1, on_ready, &ready, &w, NULL), PDQ_WAIT);
    cfg.max_concurrent = 2;
    update_ok(q, &cfg);
    assert_int_equal(ready, 1);
    pdq_release(w);
    pdq_release(run);
    pdq_free(q);
}

static void test_weights_change_shares(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdq_tenant_config_t tc[2] = {{.name = "a", .weight = 1}, {.name = "b", .weight = 1}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    int got[2];
    tc[1].weight = 3;
    update_ok(q, &cfg);
    serve_order(q, 40, got);
    /* 1:3 of the turns (each costs the same), within one turn */
    assert_in_range(got[1], 29, 31);
    assert_int_equal(got[0] + got[1], 40);
    pdq_free(q);
}

static void test_shape_changes_refused(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdq_model_budget_t mb = {.model = "m1", .budget = {.rpm = 5}};
    pdq_tenant_config_t tc[2] = {{.name = "a", .models = &mb, .n_models = 1, .budget = {.rpm = 7}},
                                 {.name = "b"}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 4};
    pdq_t *q = new_quota(&cfg, &fc);
    cfg.max_concurrent = 0;
    update_refused(q, &cfg, PDQ_ERR_STATE, "max_concurrent");
    cfg.max_concurrent = 4;
    mb.model = "m2";
    update_refused(q, &cfg, PDQ_ERR_STATE, "\"m2\"");
    mb.model = "m1";
    tc[0].reserved = 5; /* more than max_concurrent: the constructor's own check */
    update_refused(q, &cfg, PDQ_ERR_INVALID, "reserved");
    /* nothing changed: the budget is the one of the start */
    assert_int_equal(admitted_in_a_row(q, 0, 0), 7);
    pdq_free(q);
}

/* Tenants are matched by name: a new one is served on its own limits at once, a removed one
 * loses its keys while what it runs and queues drains, and it gets its slot back later. */
static void test_tenants_added_and_removed(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    const char *ka[] = {"key-a"}, *kb[] = {"key-b"}, *kc[] = {"key-c"};
    pdq_tenant_config_t tc[3] = {
        {.name = "a", .api_keys = ka, .n_api_keys = 1},
        {.name = "b", .api_keys = kb, .n_api_keys = 1, .max_concurrent = 1},
        {.name = "c", .api_keys = kc, .n_api_keys = 1, .budget = {.rpm = 3}}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *run, *waiter;
    int ready = 0;
    assert_int_equal(pdq_tenant_by_key(q, "key-b"), 1);
    assert_int_equal(admit(q, 1, 1, 1, &run), PDQ_OK);
    assert_int_equal(pdq_admit(q, 1, NULL, 1, 1, on_ready, &ready, &waiter, NULL), PDQ_WAIT);

    /* drop b, add c */
    pdq_tenant_config_t next[2] = {tc[0], tc[2]};
    pdq_config_t cfg2 = {.tenants = next, .n_tenants = 2};
    pdq_update_t *u = NULL;
    char err[256] = "";
    assert_int_equal(pdq_update_prepare(q, &cfg2, &u, err, sizeof(err)), PDQ_OK);
    assert_string_equal(pdq_update_summary(u), "added \"c\", removed \"b\"");
    assert_int_equal(pdq_tenant_count(q), 3); /* not before the commit */
    assert_int_equal(pdq_tenant_by_key(q, "key-c"), 2);
    pdq_update_commit(q, u);
    assert_int_equal(pdq_tenant_count(q), 4);
    size_t c = pdq_tenant_by_name(q, "c");
    assert_int_equal(c, 3);
    assert_int_equal(pdq_tenant_by_key(q, "key-c"), c);
    assert_int_equal(pdq_tenant_by_key(q, "key-b"), 2); /* "other" now */
    assert_int_equal(admitted_in_a_row(q, c, 0), 3);
    /* b's running request ends and its waiter is served under b's old limit */
    pdq_release(run);
    assert_int_equal(ready, 1);
    pdq_release(waiter);
    json_t *usage = pdq_usage_json(q, 0, NULL, NULL);
    assert_non_null(usage);
    json_t *b = json_object_get(json_object_get(usage, "tenants"), "b");
    assert_true(json_is_true(json_object_get(b, "removed")));
    assert_null(
        json_object_get(json_object_get(json_object_get(usage, "tenants"), "c"), "removed"));
    json_decref(usage);

    /* b comes back to its slot; c becomes the default tenant */
    cfg.tenants = tc;
    cfg.n_tenants = 3;
    cfg.default_tenant = "c";
    assert_int_equal(pdq_update_prepare(q, &cfg, &u, err, sizeof(err)), PDQ_OK);
    assert_string_equal(pdq_update_summary(u), "back \"b\"");
    pdq_update_commit(q, u);
    assert_int_equal(pdq_tenant_count(q), 4);
    assert_int_equal(pdq_tenant_by_key(q, "key-b"), 1);
    assert_int_equal(pdq_tenant_by_key(q, NULL), c);
    pdq_free(q);
}

/* A prepared update that adds a tenant and is dropped leaves nothing behind. */
static void test_dropped_update_adds_nothing(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    const char *kc[] = {"key-c"};
    pdq_model_budget_t mb = {.model = "m1", .budget = {.rpm = 5}};
    pdq_tenant_config_t tc[2] = {{.name = "a", .models = &mb, .n_models = 1},
                                 {.name = "c", .api_keys = kc, .n_api_keys = 1}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_update_t *u = NULL;
    char err[256] = "";
    cfg.n_tenants = 2;
    assert_int_equal(pdq_update_prepare(q, &cfg, &u, err, sizeof(err)), PDQ_OK);
    pdq_update_free(u);
    assert_int_equal(pdq_tenant_count(q), 2);
    assert_int_equal(pdq_tenant_by_key(q, "key-c"), 1); /* other */
    /* refused after its slot was set up (a budget for a model nobody had): nothing either */
    pdq_model_budget_t mb2 = {.model = "m2", .budget = {.rpm = 5}};
    tc[1].models = &mb2;
    tc[1].n_models = 1;
    update_refused(q, &cfg, PDQ_ERR_STATE, "\"m2\"");
    assert_int_equal(pdq_tenant_count(q), 2);
    tc[1].n_models = 0;
    update_ok(q, &cfg);
    assert_int_equal(pdq_tenant_by_key(q, "key-c"), 2);
    pdq_free(q);
}

/* A removed tenant's reserved slots go to the shared count: the others may use them. */
static void test_removed_reservation_is_shared(void **state)
{
    (void)state;
    fake_clock_t fc = {0};
    pdq_tenant_config_t tc[2] = {{.name = "a"}, {.name = "b", .reserved = 1}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 2};
    pdq_t *q = new_quota(&cfg, &fc);
    pdq_ticket_t *t1, *t2;
    int ready = 0;
    assert_int_equal(admit(q, 0, 1, 1, &t1), PDQ_OK);
    /* b's slot is b's: a's second request waits */
    assert_int_equal(pdq_admit(q, 0, NULL, 1, 1, on_ready, &ready, &t2, NULL), PDQ_WAIT);
    cfg.n_tenants = 1;
    update_ok(q, &cfg);
    assert_int_equal(ready, 1);
    pdq_release(t2);
    pdq_release(t1);
    pdq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_keeps_what_was_spent),
        cmocka_unit_test(test_keys_move_between_tenants),
        cmocka_unit_test(test_raised_limit_lets_waiters_in),
        cmocka_unit_test(test_global_limit_moves),
        cmocka_unit_test(test_weights_change_shares),
        cmocka_unit_test(test_shape_changes_refused),
        cmocka_unit_test(test_tenants_added_and_removed),
        cmocka_unit_test(test_dropped_update_adds_nothing),
        cmocka_unit_test(test_removed_reservation_is_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
