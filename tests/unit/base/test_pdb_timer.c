/*
 * test_pdb_timer.c - the base timer heap (pdb_timer.c): expiry order, equal deadlines in arm
 * order, cancel (of the top, a middle one, an idle one), re-arm earlier and later, a callback
 * re-arming itself and cancelling another, reserved room that makes arming allocation-free,
 * and a randomised run against a sorted model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_timer.h"

typedef struct item {
    pdb_timer_t t;
    int id;
} item_t;

static int fired[4096];
static uint64_t fired_at[4096];
static int n_fired;

static void on_fire(pdb_timer_t *t, uint64_t now)
{
    item_t *it = t->arg;
    fired_at[n_fired] = now;
    fired[n_fired++] = it->id;
}

static void items_init(item_t *it, int n)
{
    n_fired = 0;
    for (int i = 0; i < n; i++) {
        pdb_timer_init(&it[i].t, on_fire, &it[i]);
        it[i].id = i;
    }
}

static void test_order_and_ties(void **s)
{
    pdb_timers_t h;
    item_t it[6];
    const uint64_t due[6] = {50, 10, 30, 10, 70, 10};
    const int want[6] = {1, 3, 5, 2, 0, 4}; /* the three 10s in arm order */
    (void)s;

    pdb_timers_init(&h);
    items_init(it, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(pdb_timer_arm(&h, &it[i].t, due[i]), PDB_OK);
    assert_int_equal(pdb_timers_next(&h), 10);
    assert_int_equal(pdb_timers_run(&h, 9), 0); /* nothing due a tick early */
    assert_int_equal(pdb_timers_run(&h, 30), 4);
    assert_int_equal(pdb_timers_next(&h), 50);
    assert_int_equal(pdb_timers_run(&h, 1000), 2);
    assert_int_equal(n_fired, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(fired[i], want[i]);
    assert_int_equal(fired_at[0], 30); /* callbacks see the time of the run */
    assert_int_equal(pdb_timers_next(&h), -1);
    for (int i = 0; i < 6; i++)
        assert_false(pdb_timer_armed(&it[i].t));
    pdb_timers_free(&h);
}

static void test_cancel_and_rearm(void **s)
{
    pdb_timers_t h;
    item_t it[5];
    (void)s;

    pdb_timers_init(&h);
    items_init(it, 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(pdb_timer_arm(&h, &it[i].t, 100 + 10 * (uint64_t)i), PDB_OK);
    pdb_timer_cancel(&h, &it[0].t); /* the top */
    pdb_timer_cancel(&h, &it[2].t); /* a middle one */
    pdb_timer_cancel(&h, &it[2].t); /* twice: harmless */
    assert_int_equal(pdb_timers_count(&h), 3);
    assert_int_equal(pdb_timers_next(&h), 110);
    assert_int_equal(pdb_timer_arm(&h, &it[4].t, 5), PDB_OK);   /* re-arm earlier: moves */
    assert_int_equal(pdb_timer_arm(&h, &it[1].t, 500), PDB_OK); /* re-arm later: moves */
    assert_int_equal(pdb_timers_count(&h), 3);
    /* arm_earlier keeps an earlier deadline, takes an earlier one */
    assert_int_equal(pdb_timer_arm_earlier(&h, &it[4].t, 50), PDB_OK);
    assert_int_equal(it[4].t.due, 5);
    assert_int_equal(pdb_timer_arm_earlier(&h, &it[3].t, 7), PDB_OK);
    assert_int_equal(it[3].t.due, 7);
    assert_int_equal(pdb_timers_run(&h, 1000), 3);
    assert_int_equal(fired[0], 4);
    assert_int_equal(fired[1], 3);
    assert_int_equal(fired[2], 1);
    pdb_timers_free(&h);
}

static pdb_timers_t *g_heap;
static item_t *g_victim;

/* Periodic from its own due time; cancels the victim the first time. */
static void on_periodic(pdb_timer_t *t, uint64_t now)
{
    on_fire(t, now);
    if (g_victim != NULL) {
        pdb_timer_cancel(g_heap, &g_victim->t);
        g_victim = NULL;
    }
    if (n_fired < 3)
        assert_int_equal(pdb_timer_arm(g_heap, t, t->due + 10), PDB_OK);
}

static void test_callback_rearms_and_cancels(void **s)
{
    pdb_timers_t h;
    item_t it[2];
    (void)s;

    pdb_timers_init(&h);
    items_init(it, 2);
    pdb_timer_init(&it[0].t, on_periodic, &it[0]);
    g_heap = &h;
    g_victim = &it[1];
    assert_int_equal(pdb_timer_arm(&h, &it[0].t, 10), PDB_OK);
    assert_int_equal(pdb_timer_arm(&h, &it[1].t, 15), PDB_OK);
    /* at 30: 10, then 20 and 30 armed by the callback run in the same call; 15 was cancelled */
    assert_int_equal(pdb_timers_run(&h, 30), 3);
    assert_int_equal(n_fired, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(fired[i], 0);
    assert_false(pdb_timer_armed(&it[1].t));
    assert_int_equal(pdb_timers_next(&h), -1);
    pdb_timers_free(&h);
}

static void test_reserved_room_needs_no_allocation(void **s)
{
    pdb_timers_t h;
    item_t it[40];
    (void)s;

    pdb_timers_init(&h);
    items_init(it, 40);
    pdb_alloc_fail_at(1, 1);
    assert_int_equal(pdb_timers_reserve(&h, 40), PDB_ERR_NOMEM);
    assert_int_equal(pdb_timer_arm(&h, &it[0].t, 1), PDB_ERR_NOMEM);
    assert_false(pdb_timer_armed(&it[0].t));
    pdb_alloc_fail_at(0, 0);
    assert_int_equal(pdb_timers_reserve(&h, 40), PDB_OK);
    pdb_alloc_fail_at(1, 1); /* every allocation fails from here: arming must not allocate */
    for (int i = 0; i < 40; i++)
        assert_int_equal(pdb_timer_arm(&h, &it[i].t, (uint64_t)(40 - i)), PDB_OK);
    pdb_alloc_fail_at(0, 0);
    assert_int_equal(pdb_timers_run(&h, 100), 40);
    assert_int_equal(fired[0], 39);
    pdb_timers_free(&h);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every armed timer knows its heap position and its slot holds its key, and no position is
 * due before its parent. */
static void check_heap(const pdb_timers_t *h)
{
    for (size_t i = 0; i < pdb_timers_count(h); i++) {
        const pdb_timer_slot_t *s = &h->v[i];
        assert_int_equal(s->t->idx, i);
        assert_true(s->due == s->t->due && s->seq == s->t->seq);
        if (i > 0) {
            const pdb_timer_slot_t *p = &h->v[(i - 1) / 2];
            assert_true(p->due < s->due || (p->due == s->due && p->seq < s->seq));
        }
    }
}

/* Random arms, re-arms and cancels; what runs must be the model's deadlines, sorted. */
static void test_random_against_model(void **s)
{
    enum { N = 1000 };
    static item_t it[N];
    static uint64_t model[N], got[N];
    pdb_timers_t h;
    int live = 0, k = 0;
    (void)s;

    srand(7);
    pdb_timers_init(&h);
    items_init(it, N);
    for (int round = 0; round < 5 * N; round++) {
        item_t *x = &it[rand() % N];
        if (rand() % 4 == 0)
            pdb_timer_cancel(&h, &x->t);
        else
            assert_int_equal(pdb_timer_arm(&h, &x->t, (uint64_t)(rand() % 10000)), PDB_OK);
        if (round % 97 == 0)
            check_heap(&h);
    }
    check_heap(&h);
    for (int i = 0; i < N; i++)
        if (pdb_timer_armed(&it[i].t))
            model[live++] = it[i].t.due;
    qsort(model, (size_t)live, sizeof(model[0]), cmp_u64);
    assert_int_equal(pdb_timers_count(&h), live);
    while (pdb_timers_next(&h) >= 0) {
        uint64_t due = (uint64_t)pdb_timers_next(&h);
        int before = n_fired;
        pdb_timers_run(&h, due);
        for (int i = before; i < n_fired; i++)
            got[k++] = it[fired[i]].t.due;
    }
    assert_int_equal(k, live);
    for (int i = 0; i < live; i++)
        assert_int_equal(got[i], model[i]);
    pdb_timers_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_ties),
        cmocka_unit_test(test_cancel_and_rearm),
        cmocka_unit_test(test_callback_rearms_and_cancels),
        cmocka_unit_test(test_reserved_room_needs_no_allocation),
        cmocka_unit_test(test_random_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
