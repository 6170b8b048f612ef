/*
 * Concurrency admission through pdq_admit: requests wait when the gateway or their tenant is
 * full and are handed slots in weighted fair order (1:3), priority classes first, reserved
 * slots kept for their tenant, a tenant at its own limit does not hold others up, cancel
 * refunds and never calls back, the wait queue is bounded, and steady traffic allocates
 * nothing (tickets are reused).
 */
#include <stdlib.h>

#include "pdb/pdb_alloc.h"
#include "pdq_test_util.h"

#define MAX_READY 4096

typedef struct ready {
    pdq_ticket_t *t[MAX_READY];
    size_t n, head;
} ready_t;

static void on_ready(pdq_ticket_t *t, void *arg)
{
    ready_t *r = arg;
    assert_true(r->n < MAX_READY);
    r->t[r->n++] = t;
}

static pdq_ticket_t *next_ready(ready_t *r)
{
    return r->head < r->n ? r->t[r->head++] : NULL;
}

static pdq_status_t admit(pdq_t *q, size_t tenant, uint64_t tokens, ready_t *r, pdq_ticket_t **t)
{
    pdq_verdict_t v;
    return pdq_admit(q, tenant, NULL, tokens, 0, on_ready, r, t, &v);
}

static void test_fair_shares_when_full(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {{.name = "a", .weight = 1}, {.name = "b", .weight = 3}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 4};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t *r = calloc(1, sizeof(*r));
    pdq_ticket_t *running[4], *t;
    for (int i = 0; i < 4; i++)
        assert_int_equal(admit(q, 0, 100, r, &running[i]), PDQ_OK);
    for (int i = 0; i < 400; i++) {
        assert_int_equal(admit(q, 0, 100, r, &t), PDQ_WAIT);
        assert_int_equal(admit(q, 1, 100, r, &t), PDQ_WAIT);
    }
    /* as each running request ends, the freed slot goes to the next in fair order */
    int served[2] = {0, 0};
    for (int i = 0; i < 4; i++)
        pdq_release(running[i]);
    for (int i = 0; i < 400; i++) {
        t = next_ready(r);
        assert_non_null(t);
        served[pdq_ticket_tenant(t)]++;
        pdq_release(t);
    }
    assert_in_range(served[1], 299, 301);
    assert_in_range(served[0], 99, 101);
    while ((t = next_ready(r)) != NULL)
        pdq_release(t);
    assert_int_equal(r->n, 800);
    pdq_free(q);
    free(r);
}

static void test_priority_and_reserved(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {
        {.name = "bulk", .priority = 1},
        {.name = "urgent", .priority = 0},
        {.name = "vip", .priority = 1, .reserved = 2},
    };
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 3, .max_concurrent = 4};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t r = {0};
    pdq_ticket_t *b[2], *t, *w1, *w2;
    /* the shared part is 4 - 2 reserved = 2 slots */
    assert_int_equal(admit(q, 0, 10, &r, &b[0]), PDQ_OK);
    assert_int_equal(admit(q, 0, 10, &r, &b[1]), PDQ_OK);
    assert_int_equal(admit(q, 0, 10, &r, &w1), PDQ_WAIT);
    assert_int_equal(admit(q, 1, 10, &r, &w2), PDQ_WAIT);
    /* vip's reserved slots are there although the shared ones are taken and others wait */
    pdq_ticket_t *v1, *v2, *v3;
    assert_int_equal(admit(q, 2, 10, &r, &v1), PDQ_OK);
    assert_int_equal(admit(q, 2, 10, &r, &v2), PDQ_OK);
    assert_int_equal(admit(q, 2, 10, &r, &v3), PDQ_WAIT); /* beyond its reservation: shared */
    /* a shared slot frees: urgent (class 0) first though bulk waited longer */
    pdq_release(b[0]);
    assert_ptr_equal(next_ready(&r), w2);
    /* a vip reserved slot frees: vip's own waiter gets it, not bulk */
    pdq_release(v1);
    assert_ptr_equal(next_ready(&r), v3);
    assert_null(next_ready(&r));
    pdq_release(b[1]);
    assert_ptr_equal(next_ready(&r), w1);
    pdq_release(w1);
    pdq_release(w2);
    pdq_release(v2);
    pdq_release(v3);
    /* all slots free again: 2 shared + 2 reserved */
    pdq_ticket_t *all[4];
    assert_int_equal(admit(q, 0, 1, &r, &all[0]), PDQ_OK);
    assert_int_equal(admit(q, 1, 1, &r, &all[1]), PDQ_OK);
    assert_int_equal(admit(q, 2, 1, &r, &all[2]), PDQ_OK);
    assert_int_equal(admit(q, 2, 1, &r, &all[3]), PDQ_OK);
    assert_int_equal(admit(q, 0, 1, &r, &t), PDQ_WAIT);
    assert_true(pdq_cancel(t));
    for (int i = 0; i < 4; i++)
        pdq_release(all[i]);
    assert_null(next_ready(&r));
    pdq_free(q);
}

static void test_tenant_limit_does_not_block_others(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {{.name = "one", .max_concurrent = 1}, {.name = "two"}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 3};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t r = {0};
    pdq_ticket_t *a, *a2, *x, *y, *z;
    assert_int_equal(admit(q, 0, 1, &r, &a), PDQ_OK);
    assert_int_equal(admit(q, 0, 1, &r, &a2), PDQ_WAIT); /* its own limit */
    assert_int_equal(admit(q, 1, 1, &r, &x), PDQ_OK);    /* others are not held up */
    assert_int_equal(admit(q, 1, 1, &r, &y), PDQ_OK);
    assert_int_equal(admit(q, 1, 1, &r, &z), PDQ_WAIT); /* now the gateway is full */
    pdq_release(x);
    assert_ptr_equal(next_ready(&r), z); /* "one" is blocked by its own limit: skipped */
    /* time passes while a2 waits: it is recorded as queue time */
    advance_ms(&fc, 250);
    pdq_release(a);
    pdq_release(y);
    assert_ptr_equal(next_ready(&r), a2);
    pdq_release(a2);
    pdq_release(z);
    json_t *u = pdq_usage_json(q, 0, "one", NULL);
    json_t *qs = json_object_get(
        json_object_get(
            json_object_get(json_object_get(json_object_get(u, "tenants"), "one"), "total"),
            "phase_seconds"),
        "queue");
    assert_true(json_real_value(qs) >= 0.25 && json_real_value(qs) < 0.2501);
    json_decref(u);
    pdq_free(q);
}

static void test_cancel_refunds_and_queue_bound(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {
        {.name = "a", .max_concurrent = 1, .max_waiting = 3, .budget = {.rpm = 10, .tpm = 1000}}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 1};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t r = {0};
    pdq_ticket_t *run, *w[3], *t;
    pdq_verdict_t v;
    assert_int_equal(admit(q, 0, 100, &r, &run), PDQ_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(admit(q, 0, 100, &r, &w[i]), PDQ_WAIT);
    assert_int_equal(pdq_admit(q, 0, NULL, 100, 0, on_ready, &r, &t, &v), PDQ_REFUSED);
    assert_int_equal(v.code, PDQ_CODE_QUEUE_FULL);
    assert_int_equal(v.http_status, 429);
    assert_string_equal(pdq_code_name(v.code), "queue_full");
    pdq_headers_t h;
    pdq_ratelimit_headers(q, 0, NULL, &h);
    /* the refused one was refunded; the three waiting ones are charged */
    assert_string_equal(header(&h, "x-ratelimit-remaining-requests"), "6");
    assert_string_equal(header(&h, "x-ratelimit-remaining-tokens"), "600");
    /* a client that went away: refunded, never called back */
    assert_true(pdq_cancel(w[1]));
    pdq_ratelimit_headers(q, 0, NULL, &h);
    assert_string_equal(header(&h, "x-ratelimit-remaining-requests"), "7");
    assert_string_equal(header(&h, "x-ratelimit-remaining-tokens"), "700");
    pdq_release(run);
    assert_ptr_equal(next_ready(&r), w[0]);
    assert_null(next_ready(&r));
    /* cancelling a ticket that already has its slot releases it */
    assert_false(pdq_cancel(w[0]));
    assert_ptr_equal(next_ready(&r), w[2]);
    pdq_release(w[2]);
    pdq_free(q);
}

/* A tenant skipped for being at its limit, whose waiters all gave up, must be served again
 * once it is below the limit (it was once stranded: blocked with nobody left to unblock it). */
static void test_blocked_tenant_is_not_stranded(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {{.name = "one", .max_concurrent = 1}, {.name = "two"}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 2};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t r = {0};
    pdq_ticket_t *a, *a2, *b, *b2, *a3, *b3;
    assert_int_equal(admit(q, 0, 1, &r, &a), PDQ_OK);
    assert_int_equal(admit(q, 0, 1, &r, &a2), PDQ_WAIT);
    assert_int_equal(admit(q, 1, 1, &r, &b), PDQ_OK);
    assert_int_equal(admit(q, 1, 1, &r, &b2), PDQ_WAIT);
    pdq_release(b); /* dispatch skips "one" (at its limit) and serves b2 */
    assert_ptr_equal(next_ready(&r), b2);
    assert_true(pdq_cancel(a2));
    pdq_release(a); /* nobody waits now */
    assert_int_equal(admit(q, 1, 1, &r, &b3), PDQ_OK);
    assert_int_equal(admit(q, 0, 1, &r, &a3), PDQ_WAIT); /* the gateway is full */
    pdq_release(b3);
    assert_ptr_equal(next_ready(&r), a3);
    pdq_release(a3);
    pdq_release(b2);
    pdq_free(q);
}

static void test_steady_traffic_allocates_nothing(void **state)
{
    (void)state;
    fake_clock_t fc = {PDB_NSEC_PER_SEC};
    pdq_tenant_config_t tc[] = {{.name = "a", .max_concurrent = 2}, {.name = "b"}};
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 4};
    pdq_t *q = new_quota(&cfg, &fc);
    ready_t *r = calloc(1, sizeof(*r));
    pdq_ticket_t *t[8];
    for (int round = 0; round < 2000; round++) {
        if (round == 10)
            (void)pdb_alloc_count(); /* start counting once the free lists are warm */
        uint64_t before = pdb_alloc_count();
        r->n = r->head = 0;
        pdq_status_t st[8];
        for (int i = 0; i < 8; i++)
            st[i] = admit(q, (size_t)(i % 2), 10, r, &t[i]);
        assert_int_equal(st[4], PDQ_WAIT); /* a's own limit */
        assert_int_equal(st[5], PDQ_WAIT); /* the gateway's */
        for (int i = 0; i < 8; i++)
            if (st[i] == PDQ_OK)
                pdq_release(t[i]); /* waiting ones are released once called back */
        pdq_ticket_t *x;
        while ((x = next_ready(r)) != NULL)
            pdq_release(x);
        if (round >= 10)
            assert_int_equal(pdb_alloc_count() - before, 0);
    }
    pdq_free(q);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fair_shares_when_full),
        cmocka_unit_test(test_priority_and_reserved),
        cmocka_unit_test(test_tenant_limit_does_not_block_others),
        cmocka_unit_test(test_cancel_refunds_and_queue_bound),
        cmocka_unit_test(test_blocked_tenant_is_not_stranded),
        cmocka_unit_test(test_steady_traffic_allocates_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
