/*
 * test_timer.c - the per-worker timer heap (pdgw_timer.h over pdb_timer.c) and free lists
 * (pdgw_freelist.c): expiry order, ties in arm order, cancel and re-arm (also from inside a
 * callback), a heap that cannot grow, a randomised run against a sorted model; free-list reuse,
 * bound, zeroing and (under AddressSanitizer) poisoning of listed objects.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdgw_alloc.h"
#include "pdgw_freelist.h"
#include "pdgw_timer.h"

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif
#ifdef T_ASAN
#include <sanitizer/asan_interface.h>
#endif

typedef struct item {
    pdgw_timer_t t;
    int id;
} item_t;

static int fired[1024];
static uint64_t fired_at[1024];
static int n_fired;

static void on_fire(pdgw_timer_t *t, uint64_t now)
{
    item_t *it = (item_t *)((char *)t - offsetof(item_t, t));
    fired_at[n_fired] = now;
    fired[n_fired++] = it->id;
}

static void reset_fired(void)
{
    n_fired = 0;
    memset(fired, 0, sizeof(fired));
}

static void test_expiry_order(void **s)
{
    pdgw_timers_t h;
    item_t it[6];
    const uint64_t due[6] = {50, 10, 30, 10, 70, 20};
    int i;
    (void)s;
    pdgw_timers_init(&h);
    reset_fired();
    for (i = 0; i < 6; i++) {
        pdgw_timer_init(&it[i].t, on_fire);
        it[i].id = i;
        assert_int_equal(pdgw_timer_arm(&h, &it[i].t, due[i]), PDGW_OK);
    }
    assert_int_equal(pdgw_timers_count(&h), 6);
    assert_int_equal(pdgw_timers_next(&h), 10);
    /* Nothing is due before the earliest deadline. */
    assert_int_equal(pdgw_timers_run(&h, 9), 0);
    /* Ties (1 and 3 at 10) run in arm order. */
    assert_int_equal(pdgw_timers_run(&h, 30), 4);
    assert_int_equal(fired[0], 1);
    assert_int_equal(fired[1], 3);
    assert_int_equal(fired[2], 5);
    assert_int_equal(fired[3], 2);
    assert_false(pdgw_timer_armed(&it[1].t));
    assert_true(pdgw_timer_armed(&it[0].t));
    assert_int_equal(pdgw_timers_next(&h), 50);
    assert_int_equal(pdgw_timers_run(&h, 1000), 2);
    assert_int_equal(fired[4], 0);
    assert_int_equal(fired[5], 4);
    assert_int_equal(pdgw_timers_next(&h), -1);
    pdgw_timers_free(&h);
}

static void test_cancel_and_rearm(void **s)
{
    pdgw_timers_t h;
    item_t it[4];
    int i;
    (void)s;
    pdgw_timers_init(&h);
    reset_fired();
    for (i = 0; i < 4; i++) {
        pdgw_timer_init(&it[i].t, on_fire);
        it[i].id = i;
        pdgw_timer_arm(&h, &it[i].t, 100 + (uint64_t)i * 10);
    }
    pdgw_timer_cancel(&h, &it[0].t); /* the root */
    pdgw_timer_cancel(&h, &it[2].t); /* an inner one */
    pdgw_timer_cancel(&h, &it[2].t); /* twice: no effect */
    assert_int_equal(pdgw_timers_count(&h), 2);
    /* Re-arm moves: later, then earlier than everything. */
    pdgw_timer_arm(&h, &it[1].t, 500);
    pdgw_timer_arm(&h, &it[3].t, 5);
    assert_int_equal(pdgw_timers_count(&h), 2);
    assert_int_equal(pdgw_timers_next(&h), 5);
    /* arm_earlier never moves a timer later. */
    pdgw_timer_arm_earlier(&h, &it[1].t, 600);
    assert_int_equal(it[1].t.due, 500);
    pdgw_timer_arm_earlier(&h, &it[1].t, 200);
    assert_int_equal(it[1].t.due, 200);
    assert_int_equal(pdgw_timers_run(&h, 1000), 2);
    assert_int_equal(n_fired, 2);
    assert_int_equal(fired[0], 3);
    assert_int_equal(fired[1], 1);
    pdgw_timers_free(&h);
}

/* A callback that re-arms itself (a periodic check) and cancels another timer. */
static pdgw_timers_t *g_heap;
static item_t *g_victim;
static int g_periodic_runs;

static void on_periodic(pdgw_timer_t *t, uint64_t now)
{
    (void)now;
    g_periodic_runs++;
    if (g_victim) {
        pdgw_timer_cancel(g_heap, &g_victim->t);
        g_victim = NULL;
    }
    if (g_periodic_runs < 3)
        pdgw_timer_arm(g_heap, t, t->due + 10); /* periodic: from its own due time */
}

static void test_rearm_from_callback(void **s)
{
    pdgw_timers_t h;
    item_t per, victim, late;
    (void)s;
    pdgw_timers_init(&h);
    reset_fired();
    g_heap = &h;
    g_periodic_runs = 0;
    pdgw_timer_init(&per.t, on_periodic);
    pdgw_timer_init(&victim.t, on_fire);
    pdgw_timer_init(&late.t, on_fire);
    victim.id = 7;
    late.id = 8;
    g_victim = &victim;
    pdgw_timer_arm(&h, &per.t, 10);
    pdgw_timer_arm(&h, &victim.t, 15);
    pdgw_timer_arm(&h, &late.t, 100);
    /* At 30 the periodic timer runs at 10 (cancelling the victim), is re-armed for 20 and 30
     * and runs again both times within the same call; it stops after three runs. */
    assert_int_equal(pdgw_timers_run(&h, 30), 3);
    assert_int_equal(g_periodic_runs, 3);
    assert_int_equal(n_fired, 0);
    assert_false(pdgw_timer_armed(&per.t));
    assert_int_equal(pdgw_timers_count(&h), 1);
    assert_int_equal(pdgw_timers_run(&h, 100), 1);
    assert_int_equal(fired[0], 8);
    assert_int_equal(fired_at[0], 100);
    pdgw_timers_free(&h);
}

static void test_arm_without_memory(void **s)
{
    pdgw_timers_t h;
    item_t it;
    (void)s;
    pdgw_timers_init(&h);
    pdgw_timer_init(&it.t, on_fire);
    pdgw_alloc_fail_at(1, 0);
    assert_int_equal(pdgw_timer_arm(&h, &it.t, 10), PDGW_ERR_NOMEM);
    pdgw_alloc_fail_at(0, 0);
    assert_false(pdgw_timer_armed(&it.t));
    assert_int_equal(pdgw_timers_next(&h), -1);
    assert_int_equal(pdgw_timer_arm(&h, &it.t, 10), PDGW_OK);
    pdgw_timers_free(&h);
}

/* Random arms, re-arms and cancels against a model: every run returns exactly the timers
 * the model says are due, in (due, arm order). */
static void test_random_against_model(void **s)
{
    enum { N = 500 };
    static item_t it[N];
    static uint64_t model_due[N], model_seq[N];
    static int armed[N];
    pdgw_timers_t h;
    uint64_t now = 0, seq = 0;
    int round, i;
    (void)s;
    srand(12345);
    pdgw_timers_init(&h);
    for (i = 0; i < N; i++) {
        pdgw_timer_init(&it[i].t, on_fire);
        it[i].id = i;
        armed[i] = 0;
    }
    for (round = 0; round < 200; round++) {
        int ops = rand() % 40, k;
        for (k = 0; k < ops; k++) {
            int j = rand() % N;
            if (rand() % 4 == 0) {
                pdgw_timer_cancel(&h, &it[j].t);
                armed[j] = 0;
            } else {
                uint64_t due = now + (uint64_t)(rand() % 50);
                pdgw_timer_arm(&h, &it[j].t, due);
                armed[j] = 1;
                model_due[j] = due;
                model_seq[j] = ++seq;
            }
        }
        now += (uint64_t)(rand() % 20);
        n_fired = 0;
        {
            static int expect[N];
            int ne = 0, a, b;
            for (i = 0; i < N; i++)
                if (armed[i] && model_due[i] <= now)
                    expect[ne++] = i;
            for (a = 1; a < ne; a++) /* insertion sort by (due, seq) */
                for (b = a; b > 0 && (model_due[expect[b]] < model_due[expect[b - 1]] ||
                                      (model_due[expect[b]] == model_due[expect[b - 1]] &&
                                       model_seq[expect[b]] < model_seq[expect[b - 1]]));
                     b--) {
                    int tmp = expect[b];
                    expect[b] = expect[b - 1];
                    expect[b - 1] = tmp;
                }
            assert_int_equal(pdgw_timers_run(&h, now), (size_t)ne);
            for (a = 0; a < ne; a++) {
                assert_int_equal(fired[a], expect[a]);
                armed[expect[a]] = 0;
            }
            assert_int_equal(pdgw_timers_run(&h, now), 0);
        }
        assert_true(pdgw_timers_next(&h) == -1 || pdgw_timers_next(&h) > (int64_t)now);
    }
    pdgw_timers_free(&h);
}

/* ---------------------------------------------------------------- free lists */

typedef struct obj {
    char bytes[200];
    int tag;
} obj_t;

static void test_freelist_reuse(void **s)
{
    pdgw_freelist_t fl;
    obj_t *a, *b, *c;
    (void)s;
    pdgw_freelist_init(&fl, sizeof(obj_t), 2);
    a = pdgw_freelist_get(&fl);
    b = pdgw_freelist_get(&fl);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(fl.n_alloc, 2);
    a->tag = 41;
    memset(a->bytes, 0x5a, sizeof(a->bytes));
    pdgw_freelist_put(&fl, a);
    assert_int_equal(fl.n_free, 1);
    /* The freed object comes back, zeroed. */
    c = pdgw_freelist_get(&fl);
    assert_ptr_equal(c, a);
    assert_int_equal(c->tag, 0);
    assert_int_equal(c->bytes[0], 0);
    assert_int_equal(c->bytes[199], 0);
    assert_int_equal(fl.n_reuse, 1);
    assert_int_equal(((uintptr_t)c) % _Alignof(max_align_t), 0);
    /* LIFO, and the bound: a third put frees instead of listing. */
    {
        obj_t *d = pdgw_freelist_get(&fl);
        pdgw_freelist_put(&fl, b);
        pdgw_freelist_put(&fl, c);
        pdgw_freelist_put(&fl, d);
        assert_int_equal(fl.n_free, 2);
        assert_ptr_equal(pdgw_freelist_get(&fl), c);
        assert_ptr_equal(pdgw_freelist_get(&fl), b);
        pdgw_freelist_put(&fl, b);
        pdgw_freelist_put(&fl, c);
    }
    pdgw_freelist_put(&fl, NULL);
    pdgw_freelist_drain(&fl);
    assert_int_equal(fl.n_free, 0);
}

/* The dirty get: a new object is zeroed like any, a listed one comes back as its last user
 * left it (the caller sets every byte); the count and order are those of the zeroing get. */
static void test_freelist_dirty(void **s)
{
    pdgw_freelist_t fl;
    obj_t *a, *b;
    (void)s;
    pdgw_freelist_init(&fl, sizeof(obj_t), 2);
    a = pdgw_freelist_get_dirty(&fl);
    assert_non_null(a);
    assert_int_equal(a->tag, 0);
    assert_int_equal(a->bytes[199], 0);
    a->tag = 7;
    memset(a->bytes, 0x5a, sizeof(a->bytes));
    pdgw_freelist_put(&fl, a);
    b = pdgw_freelist_get_dirty(&fl);
    assert_ptr_equal(b, a);
    assert_int_equal(b->tag, 7);
    assert_int_equal(b->bytes[0], 0x5a);
    assert_int_equal(fl.n_reuse, 1);
    assert_int_equal(fl.n_alloc, 1);
    /* the zeroing get still zeroes what the dirty one left */
    pdgw_freelist_put(&fl, b);
    b = pdgw_freelist_get(&fl);
    assert_ptr_equal(b, a);
    assert_int_equal(b->tag, 0);
    pdgw_freelist_put(&fl, b);
    pdgw_freelist_drain(&fl);
}

/* The torture hook: while bypassed, a list neither hands out nor keeps objects (each one is
 * a fresh allocation, freed when given back); what it listed before is there afterwards. */
static void test_freelist_bypass(void **s)
{
    pdgw_freelist_t fl;
    obj_t *a, *b;
    (void)s;
    pdgw_freelist_init(&fl, sizeof(obj_t), 4);
    a = pdgw_freelist_get(&fl);
    assert_non_null(a);
    pdgw_freelist_put(&fl, a);
    assert_int_equal(fl.n_free, 1);
    pdgw_freelist_test_bypass(true);
    b = pdgw_freelist_get(&fl);
    assert_non_null(b);
    assert_ptr_not_equal(b, a);
    assert_int_equal(fl.n_alloc, 2);
    assert_int_equal(fl.n_reuse, 0);
    b->tag = 7;
    pdgw_freelist_put(&fl, b); /* freed, not listed */
    assert_int_equal(fl.n_free, 1);
    pdgw_freelist_test_bypass(false);
    assert_ptr_equal(pdgw_freelist_get(&fl), a);
    assert_int_equal(fl.n_reuse, 1);
    pdgw_freelist_put(&fl, a);
    pdgw_freelist_drain(&fl);
}

static void test_freelist_out_of_memory(void **s)
{
    pdgw_freelist_t fl;
    obj_t *a;
    (void)s;
    pdgw_freelist_init(&fl, sizeof(obj_t), 4);
    pdgw_alloc_fail_at(1, 0);
    assert_null(pdgw_freelist_get(&fl));
    pdgw_alloc_fail_at(0, 0);
    a = pdgw_freelist_get(&fl);
    assert_non_null(a);
    pdgw_freelist_put(&fl, a);
    /* A listed object needs no allocation: a failing allocator does not matter. */
    pdgw_alloc_fail_at(1, 1);
    assert_ptr_equal(pdgw_freelist_get(&fl), a);
    pdgw_alloc_fail_at(0, 0);
    pdgw_freelist_put(&fl, a);
    pdgw_freelist_drain(&fl);
}

static void test_freelist_poisoned_under_asan(void **s)
{
#ifdef T_ASAN
    pdgw_freelist_t fl;
    obj_t *a;
    (void)s;
    pdgw_freelist_init(&fl, sizeof(obj_t), 4);
    a = pdgw_freelist_get(&fl);
    assert_false(__asan_address_is_poisoned(&a->tag));
    pdgw_freelist_put(&fl, a);
    /* Every byte of a listed object is off limits: a use after put is reported. */
    assert_true(__asan_address_is_poisoned(&a->bytes[0]));
    assert_true(__asan_address_is_poisoned(&a->tag));
    assert_ptr_equal(pdgw_freelist_get(&fl), a);
    assert_false(__asan_address_is_poisoned(&a->bytes[0]));
    pdgw_freelist_put(&fl, a);
    pdgw_freelist_drain(&fl);
#else
    (void)s;
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expiry_order),
        cmocka_unit_test(test_cancel_and_rearm),
        cmocka_unit_test(test_rearm_from_callback),
        cmocka_unit_test(test_arm_without_memory),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_freelist_reuse),
        cmocka_unit_test(test_freelist_dirty),
        cmocka_unit_test(test_freelist_bypass),
        cmocka_unit_test(test_freelist_out_of_memory),
        cmocka_unit_test(test_freelist_poisoned_under_asan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
