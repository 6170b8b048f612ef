/*
 * The fair queue alone: token shares follow the weights over many pops, priority classes
 * come strictly first, a flooding tenant cannot starve a newcomer, remove works anywhere,
 * blocked tenants are skipped, token costs (not request counts) are what is shared; with
 * deadlines, a tenant's turns go to its earliest deadline without changing the shares.
 */
#include <stdlib.h>

#include "pdq_test_util.h"
#include "pdb/pdb_alloc.h"
#include "pdquota/pdq_fairq.h"

#define N_ITEMS 4000

typedef struct item {
    pdq_fairq_item_t fq;
    int id;
} item_t;

static item_t *pop(pdq_fairq_t *fq)
{
    pdq_fairq_item_t *it = pdq_fairq_pop(fq);
    return it ? PDB_DLIST_ENTRY(it, item_t, fq) : NULL;
}

static void test_weights_one_to_three(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    double w[] = {1, 3};
    assert_int_equal(pdq_fairq_init(&fq, 2, w, NULL), PDQ_OK);
    item_t *items = calloc(2 * N_ITEMS, sizeof(*items));
    /* both tenants backlogged with equal costs */
    for (int i = 0; i < N_ITEMS; i++) {
        pdq_fairq_push(&fq, 0, 100, &items[2 * i].fq);
        pdq_fairq_push(&fq, 1, 100, &items[2 * i + 1].fq);
    }
    int served[2] = {0, 0};
    for (int i = 0; i < 2000; i++)
        served[pop(&fq)->fq.tenant]++;
    /* 1:3 within one item either way */
    assert_in_range(served[1], 1499, 1501);
    assert_in_range(served[0], 499, 501);
    assert_int_equal(pdq_fairq_count(&fq), 2 * N_ITEMS - 2000);
    pdq_fairq_fini(&fq);
    free(items);
}

static void test_shares_are_tokens_not_requests(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    assert_int_equal(pdq_fairq_init(&fq, 2, NULL, NULL), PDQ_OK);
    item_t *items = calloc(2 * N_ITEMS, sizeof(*items));
    /* equal weights; tenant 0 sends 4x longer requests: it gets 1/4 of the requests */
    for (int i = 0; i < N_ITEMS; i++) {
        pdq_fairq_push(&fq, 0, 400, &items[2 * i].fq);
        pdq_fairq_push(&fq, 1, 100, &items[2 * i + 1].fq);
    }
    uint64_t tokens[2] = {0, 0};
    for (int i = 0; i < 2500; i++) {
        item_t *it = pop(&fq);
        tokens[it->fq.tenant] += it->fq.tenant == 0 ? 400 : 100;
    }
    assert_true(tokens[0] <= tokens[1] + 400 && tokens[1] <= tokens[0] + 400);
    pdq_fairq_fini(&fq);
    free(items);
}

static void test_priority_first(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    double w[] = {100, 1};
    unsigned prio[] = {1, 0}; /* tenant 1 is more urgent despite its weight */
    assert_int_equal(pdq_fairq_init(&fq, 2, w, prio), PDQ_OK);
    item_t items[20];
    for (int i = 0; i < 10; i++)
        pdq_fairq_push(&fq, 0, 1, &items[i].fq);
    for (int i = 10; i < 20; i++)
        pdq_fairq_push(&fq, 1, 1000, &items[i].fq);
    for (int i = 0; i < 10; i++)
        assert_int_equal(pop(&fq)->fq.tenant, 1);
    for (int i = 0; i < 10; i++)
        assert_int_equal(pop(&fq)->fq.tenant, 0);
    assert_null(pop(&fq));
    pdq_fairq_fini(&fq);
}

static void test_flood_cannot_starve(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    assert_int_equal(pdq_fairq_init(&fq, 3, NULL, NULL), PDQ_OK);
    item_t *flood = calloc(N_ITEMS, sizeof(*flood));
    for (int i = 0; i < N_ITEMS; i++)
        pdq_fairq_push(&fq, 0, 100, &flood[i].fq);
    for (int i = 0; i < 100; i++)
        pop(&fq);
    /* a newcomer arriving behind 3900 queued items is served next or after one more */
    item_t late;
    pdq_fairq_push(&fq, 1, 100, &late.fq);
    int pos = 0;
    while (pop(&fq) != &late)
        pos++;
    assert_in_range(pos, 0, 1);
    /* and a newcomer that waits does not get credit for its idle time either way: after it,
     * service alternates */
    item_t more[10];
    for (int i = 0; i < 10; i++)
        pdq_fairq_push(&fq, 2, 100, &more[i].fq);
    int of2 = 0;
    for (int i = 0; i < 20; i++)
        of2 += pop(&fq)->fq.tenant == 2;
    assert_in_range(of2, 9, 10);
    pdq_fairq_fini(&fq);
    free(flood);
}

static void test_remove_and_block(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    assert_int_equal(pdq_fairq_init(&fq, 2, NULL, NULL), PDQ_OK);
    item_t a[3], b[2];
    for (int i = 0; i < 3; i++) {
        a[i].id = i;
        pdq_fairq_push(&fq, 0, 10, &a[i].fq);
    }
    for (int i = 0; i < 2; i++) {
        b[i].id = 10 + i;
        pdq_fairq_push(&fq, 1, 10, &b[i].fq);
    }
    pdq_fairq_remove(&fq, &a[1].fq); /* the middle */
    pdq_fairq_remove(&fq, &a[1].fq); /* twice is a no-op */
    pdq_fairq_remove(&fq, &b[0].fq); /* a head */
    assert_int_equal(pdq_fairq_count(&fq), 3);
    assert_int_equal(pdq_fairq_tenant_count(&fq, 0), 2);
    pdq_fairq_block(&fq, 0);
    assert_ptr_equal(pop(&fq), &b[1]);
    assert_null(pdq_fairq_peek(&fq)); /* only blocked items left */
    /* a blocked tenant can still be served explicitly (its own reserved slot) */
    assert_ptr_equal(PDB_DLIST_ENTRY(pdq_fairq_pop_tenant(&fq, 0), item_t, fq), &a[0]);
    pdq_fairq_unblock(&fq, 0);
    assert_ptr_equal(pop(&fq), &a[2]);
    assert_null(pop(&fq));
    assert_int_equal(pdq_fairq_count(&fq), 0);
    /* reusable after emptying */
    pdq_fairq_push(&fq, 1, 1, &b[0].fq);
    assert_ptr_equal(pop(&fq), &b[0]);
    pdq_fairq_fini(&fq);
}

static void test_bad_init(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    assert_int_equal(pdq_fairq_init(&fq, 0, NULL, NULL), PDQ_ERR_INVALID);
    pdq_fairq_fini(&fq);
    pdb_alloc_fail_at(1, 0);
    assert_int_equal(pdq_fairq_init(&fq, 4, NULL, NULL), PDQ_ERR_NOMEM);
    pdq_fairq_fini(&fq);
    pdb_alloc_fail_at(2, 0);
    assert_int_equal(pdq_fairq_init(&fq, 4, NULL, NULL), PDQ_ERR_NOMEM);
    pdq_fairq_fini(&fq);
    pdb_alloc_fail_at(0, 0);
}

static void test_deadline_order_within_a_tenant(void **state)
{
    (void)state;
    pdq_fairq_t fq;
    double w[] = {1, 3};
    assert_int_equal(pdq_fairq_init(&fq, 2, w, NULL), PDQ_OK);
    fq.by_deadline = true;
    item_t *items = calloc(2 * N_ITEMS, sizeof(*items));
    /* tenant 0: deadlines falling as they arrive (the newest is the most urgent); every tenth
     * without one. Tenant 1: none. */
    for (int i = 0; i < N_ITEMS; i++) {
        items[2 * i].id = i;
        items[2 * i].fq.deadline = i % 10 == 9 ? 0 : (uint64_t)(10 * N_ITEMS - i);
        pdq_fairq_push(&fq, 0, 100, &items[2 * i].fq);
        items[2 * i + 1].id = i;
        pdq_fairq_push(&fq, 1, 100, &items[2 * i + 1].fq);
    }
    int served[2] = {0, 0}, last1 = -1;
    bool *gone = calloc(N_ITEMS, sizeof(*gone)); /* tenant 0's, by id: served */
    for (int i = 0; i < 2000; i++) {
        item_t *it = pop(&fq);
        served[it->fq.tenant]++;
        if (it->fq.tenant == 1) { /* no deadlines: oldest first, as without the order */
            assert_true(it->id > last1);
            last1 = it->id;
            continue;
        }
        /* the earliest deadline among its PDQ_FAIRQ_DEADLINE_SCAN oldest waiters */
        int want = -1, seen = 0;
        for (int k = 0; k < N_ITEMS && seen < PDQ_FAIRQ_DEADLINE_SCAN; k++) {
            if (gone[k])
                continue;
            uint64_t d = items[2 * k].fq.deadline;
            if (want < 0 ||
                (d != 0 && (items[2 * want].fq.deadline == 0 || d < items[2 * want].fq.deadline)))
                want = k;
            seen++;
        }
        assert_int_equal(it->id, want);
        gone[it->id] = true;
    }
    free(gone);
    /* the shares are the weights' as without deadlines (test_weights_one_to_three) */
    assert_in_range(served[1], 1499, 1501);
    assert_in_range(served[0], 499, 501);
    /* the tags stayed a sequence: each tenant's next turn is its oldest waiter's tag */
    for (int i = 0; i < 500; i++) {
        item_t *it = pop(&fq);
        served[it->fq.tenant]++;
    }
    assert_in_range(served[1], 1874, 1876);
    pdq_fairq_fini(&fq);
    free(items);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weights_one_to_three),
        cmocka_unit_test(test_shares_are_tokens_not_requests),
        cmocka_unit_test(test_priority_first),
        cmocka_unit_test(test_flood_cannot_starve),
        cmocka_unit_test(test_remove_and_block),
        cmocka_unit_test(test_bad_init),
        cmocka_unit_test(test_deadline_order_within_a_tenant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
