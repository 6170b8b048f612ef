/*
 * Many threads admitting and releasing at once: the concurrency limits are never exceeded,
 * every queued request is called back exactly once, the budget is charged exactly, and at the
 * end nothing is left in flight or waiting - while another thread reloads the tenants (weights,
 * a key moving between them) over and over.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "pdq_int.h"
#include "pdq_test_util.h"

#define THREADS 4
#define ROUNDS  20000

static pdq_t *q;
static atomic_int inflight[2], max_seen[2], total_inflight, max_total;
static atomic_uint admitted, refused;
static atomic_bool stop_reloads;
static atomic_uint reloads;

typedef struct waiter {
    atomic_int done;
} waiter_t;

static void on_ready(pdq_ticket_t *t, void *arg)
{
    (void)t;
    atomic_store((atomic_int *)arg, 1);
}

static void track(int tenant, int d)
{
    int now = atomic_fetch_add(&inflight[tenant], d) + d;
    int tot = atomic_fetch_add(&total_inflight, d) + d;
    if (d > 0) {
        int m = atomic_load(&max_seen[tenant]);
        while (now > m && !atomic_compare_exchange_weak(&max_seen[tenant], &m, now))
            ;
        m = atomic_load(&max_total);
        while (tot > m && !atomic_compare_exchange_weak(&max_total, &m, tot))
            ;
    }
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        int tenant = (id + i) % 2;
        pdq_ticket_t *t;
        if (pdq_tenant_by_key(q, "k") > 1)
            fail_msg("key k of neither tenant");
        atomic_int ready = 0;
        pdq_status_t st = pdq_admit(q, (size_t)tenant, NULL, 5, 5, on_ready, &ready, &t, NULL);
        if (st == PDQ_REFUSED) {
            atomic_fetch_add(&refused, 1);
            continue;
        }
        assert_true(st == PDQ_OK || st == PDQ_WAIT);
        if (st == PDQ_WAIT) {
            if (i % 7 == 0) {
                if (!pdq_cancel(t))
                    atomic_fetch_add(&admitted, 1); /* it had its slot: cancel released it */
                continue;
            }
            while (!atomic_load(&ready))
                sched_yield(); /* the slot comes from another thread's release */
        }
        track(tenant, 1);
        atomic_fetch_add(&admitted, 1);
        track(tenant, -1);
        pdq_release(t);
    }
    return NULL;
}

static const char *const key_k[] = {"k"};

/* The limits stay the same (the test's bounds hold throughout); weights and the key move. */
static void tenants_config(pdq_tenant_config_t tc[2], int round)
{
    tc[0] = (pdq_tenant_config_t){
        .name = "a", .max_concurrent = 1, .max_waiting = 100000, .weight = round % 2 ? 3 : 1};
    tc[1] = (pdq_tenant_config_t){.name = "b", .reserved = 1, .max_waiting = 100000};
    tc[round % 2].api_keys = key_k;
    tc[round % 2].n_api_keys = 1;
}

static void *reloader(void *arg)
{
    (void)arg;
    for (int r = 1; !atomic_load(&stop_reloads); r++) {
        pdq_tenant_config_t tc[2];
        pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 2};
        pdq_update_t *u = NULL;
        char err[256];
        tenants_config(tc, r);
        assert_int_equal(pdq_update_prepare(q, &cfg, &u, err, sizeof(err)), PDQ_OK);
        pdq_update_commit(q, u);
        atomic_fetch_add(&reloads, 1);
        sched_yield();
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pdq_tenant_config_t tc[2];
    tenants_config(tc, 0);
    pdq_config_t cfg = {.tenants = tc, .n_tenants = 2, .max_concurrent = 2};
    char err[256];
    assert_int_equal(pdq_new(&cfg, NULL, &q, err, sizeof(err)), PDQ_OK);
    pthread_t th[THREADS], rl;
    pthread_create(&rl, NULL, reloader, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop_reloads, true);
    pthread_join(rl, NULL);
    assert_true(atomic_load(&reloads) > 0);
    assert_true(atomic_load(&max_seen[0]) <= 1);
    assert_true(atomic_load(&max_total) <= 2);
    assert_int_equal(atomic_load(&refused), 0);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(q->tenants[i].inflight, 0);
        assert_int_equal(q->tenants[i].waiting, 0);
    }
    assert_int_equal(atomic_load(&q->waiting), 0);
    assert_int_equal(atomic_load(&q->shared_used), 0);
    json_t *u = pdq_usage_json(q, 0, NULL, NULL);
    json_int_t a = json_integer_value(json_object_get(
        json_object_get(json_object_get(json_object_get(u, "tenants"), "a"), "total"), "requests"));
    json_int_t b = json_integer_value(json_object_get(
        json_object_get(json_object_get(json_object_get(u, "tenants"), "b"), "total"), "requests"));
    assert_int_equal(a + b, atomic_load(&admitted));
    json_decref(u);
    pdq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
