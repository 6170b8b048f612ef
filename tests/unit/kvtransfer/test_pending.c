/*
 * test_pending.c -- sender pull bookkeeping with a fake clock: done signal
 * releases pinned pages, the TTL sweep releases a dead receiver's pages, an
 * early done signal still releases, cancel by request, backpressure above
 * the high-water mark.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvt/kvt_pending.h"

static uint64_t fake_now;

static uint64_t fake_clock(void *arg)
{
    return fake_now;
}

static const kvt_clock_t clk = {fake_clock, NULL};

static kvt_pool_t *make_pool(uint32_t npages)
{
    kvt_pool_params_t p = {0};
    kvt_pool_t *pool = NULL;
    p.page_size = 256;
    p.buffer_size = 256 * (size_t)npages;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_OK);
    return pool;
}

/* Allocate n pages, pin them, drop the owner ref: as the sender does for a pull. */
static void pin_pages(kvt_pool_t *pool, uint32_t n, kvt_page_t *pages)
{
    assert_int_equal(kvt_pool_alloc(pool, n, 0, pages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_pin(pool, pages, n), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, pages, n), KVT_OK);
}

static uint32_t pinned(kvt_pool_t *pool)
{
    kvt_pool_stats_t st;
    kvt_pool_stats(pool, &st);
    return st.pinned_pages;
}

static uint32_t free_pages(kvt_pool_t *pool)
{
    kvt_pool_stats_t st;
    kvt_pool_stats(pool, &st);
    return st.free_pages;
}

static void test_done_releases(void **state)
{
    kvt_pool_t *pool = make_pool(8);
    kvt_pending_t *t;
    kvt_page_t pages[3];
    kvt_pending_entry_t e;
    kvt_pending_stats_t st;
    int done;
    int user = 5;

    fake_now = 100;
    assert_int_equal(kvt_pending_create(360.0, &clk, &t), KVT_OK);
    pin_pages(pool, 3, pages);
    assert_int_equal(kvt_pending_add(t, "pull-1", "req-1", pool, pages, 3, &user, &done), KVT_OK);
    assert_int_equal(done, 0);
    assert_int_equal(kvt_pending_add(t, "pull-1", "req-1", pool, pages, 3, NULL, &done),
                     KVT_ERR_EXISTS);
    kvt_pending_stats(t, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.pages, 3);
    assert_true(kvt_pending_next_deadline(t) == 100 + 360 * KVT_NSEC_PER_SEC);

    assert_int_equal(kvt_pending_done(t, "pull-1", &e), KVT_OK);
    assert_string_equal(e.pull_id, "pull-1");
    assert_string_equal(e.req_id, "req-1");
    assert_ptr_equal(e.user, &user);
    assert_int_equal(e.npages, 3);
    assert_int_equal(pinned(pool), 3);
    assert_int_equal(kvt_pending_entry_release(&e), KVT_OK);
    kvt_pending_entry_clear(&e);
    assert_int_equal(pinned(pool), 0);
    assert_int_equal(free_pages(pool), 8);
    kvt_pending_stats(t, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.pages, 0);
    assert_int_equal(st.done_total, 1);
    assert_true(kvt_pending_next_deadline(t) == UINT64_MAX);
    kvt_pending_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_early_done(void **state)
{
    kvt_pool_t *pool = make_pool(4);
    kvt_pending_t *t;
    kvt_page_t pages[2];
    kvt_pending_entry_t e;
    kvt_pending_stats_t st;
    int done = -1;

    fake_now = 0;
    assert_int_equal(kvt_pending_create(10.0, &clk, &t), KVT_OK);
    /* the receiver is faster than our bookkeeping */
    assert_int_equal(kvt_pending_done(t, "pull-9", &e), KVT_ERR_NOT_FOUND);
    kvt_pending_stats(t, &st);
    assert_int_equal(st.early, 1);
    assert_int_equal(st.early_total, 1);

    pin_pages(pool, 2, pages);
    assert_int_equal(kvt_pending_add(t, "pull-9", "r", pool, pages, 2, NULL, &done), KVT_OK);
    assert_int_equal(done, 1); /* nothing registered: release now */
    kvt_pending_stats(t, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.early, 0);
    assert_int_equal(kvt_pool_unpin(pool, pages, 2), KVT_OK);
    assert_int_equal(free_pages(pool), 4);

    /* an early record expires with the TTL, so it cannot release a much later pull */
    assert_int_equal(kvt_pending_done(t, "pull-10", &e), KVT_ERR_NOT_FOUND);
    fake_now += 11 * KVT_NSEC_PER_SEC;
    assert_int_equal(kvt_pending_sweep(t, NULL, NULL, NULL), KVT_OK);
    kvt_pending_stats(t, &st);
    assert_int_equal(st.early, 0);
    assert_int_equal(st.early_dropped_total, 1);
    pin_pages(pool, 1, pages);
    assert_int_equal(kvt_pending_add(t, "pull-10", "r", pool, pages, 1, NULL, &done), KVT_OK);
    assert_int_equal(done, 0);
    kvt_pending_drain(t, NULL, NULL); /* NULL callback: pages unpinned by the table */
    assert_int_equal(pinned(pool), 0);
    kvt_pending_destroy(t);
    kvt_pool_destroy(pool);
}

struct sweep_rec {
    int calls;
    char ids[8][16];
};

static void on_expired(void *arg, kvt_pending_entry_t *e)
{
    struct sweep_rec *r = arg;
    snprintf(r->ids[r->calls++], sizeof(r->ids[0]), "%s", e->pull_id);
    kvt_pending_entry_release(e);
}

static void test_sweep_releases(void **state)
{
    kvt_pool_t *pool = make_pool(8);
    kvt_pending_t *t;
    kvt_page_t a[2], b[3];
    struct sweep_rec rec = {0};
    uint32_t n;
    int done;
    kvt_pending_stats_t st;

    fake_now = 0;
    assert_int_equal(kvt_pending_create(5.0, &clk, &t), KVT_OK);
    pin_pages(pool, 2, a);
    assert_int_equal(kvt_pending_add(t, "old", "r1", pool, a, 2, NULL, &done), KVT_OK);
    fake_now = 3 * KVT_NSEC_PER_SEC;
    pin_pages(pool, 3, b);
    assert_int_equal(kvt_pending_add(t, "new", "r2", pool, b, 3, NULL, &done), KVT_OK);
    assert_int_equal(pinned(pool), 5);
    assert_true(kvt_pending_next_deadline(t) == 5 * KVT_NSEC_PER_SEC);

    fake_now = 4 * KVT_NSEC_PER_SEC; /* nothing expired yet */
    assert_int_equal(kvt_pending_sweep(t, on_expired, &rec, &n), KVT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(rec.calls, 0);

    fake_now = 5 * KVT_NSEC_PER_SEC; /* "old" reaches its deadline: the receiver is dead */
    assert_int_equal(kvt_pending_sweep(t, on_expired, &rec, &n), KVT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(rec.ids[0], "old");
    assert_true(kvt_pending_next_deadline(t) == 8 * KVT_NSEC_PER_SEC);
    assert_int_equal(pinned(pool), 3);
    assert_int_equal(free_pages(pool), 5);

    /* a late done signal for the swept pull is only an early-record, no double unpin */
    {
        kvt_pending_entry_t e;
        assert_int_equal(kvt_pending_done(t, "old", &e), KVT_ERR_NOT_FOUND);
    }
    fake_now = 9 * KVT_NSEC_PER_SEC;
    assert_int_equal(kvt_pending_sweep(t, on_expired, &rec, &n), KVT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(rec.ids[1], "new");
    assert_int_equal(pinned(pool), 0);
    assert_int_equal(free_pages(pool), 8);
    kvt_pending_stats(t, &st);
    assert_int_equal(st.expired_total, 2);
    assert_int_equal(st.pages, 0);
    kvt_pending_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_cancel_by_request(void **state)
{
    kvt_pool_t *pool = make_pool(8);
    kvt_pending_t *t;
    kvt_page_t a[1], b[2], c[1];
    struct sweep_rec rec = {0};
    uint32_t n;
    int done;

    fake_now = 0;
    assert_int_equal(kvt_pending_create(360.0, &clk, &t), KVT_OK);
    pin_pages(pool, 1, a);
    pin_pages(pool, 2, b);
    pin_pages(pool, 1, c);
    kvt_pending_add(t, "p1", "req-A", pool, a, 1, NULL, &done);
    kvt_pending_add(t, "p2", "req-A", pool, b, 2, NULL, &done);
    kvt_pending_add(t, "p3", "req-B", pool, c, 1, NULL, &done);
    assert_int_equal(kvt_pending_cancel(t, "req-A", on_expired, &rec, &n), KVT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(pinned(pool), 1);
    assert_int_equal(kvt_pending_cancel(t, "req-Z", on_expired, &rec, &n), KVT_OK);
    assert_int_equal(n, 0);
    kvt_pending_drain(t, on_expired, &rec);
    assert_int_equal(rec.calls, 3);
    assert_int_equal(pinned(pool), 0);
    assert_int_equal(free_pages(pool), 8);
    kvt_pending_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_early_records_bounded(void **state)
{
    kvt_pending_t *t;
    kvt_pending_entry_t e;
    kvt_pending_stats_t st;
    char id[32];

    fake_now = 0;
    assert_int_equal(kvt_pending_create(1000.0, &clk, &t), KVT_OK);
    /* a peer spraying bogus done signals cannot grow the table without bound */
    for (uint32_t i = 0; i < KVT_PENDING_MAX_EARLY + 100; i++) {
        snprintf(id, sizeof(id), "bogus-%u", i);
        fake_now++;
        kvt_pending_done(t, id, &e);
    }
    kvt_pending_stats(t, &st);
    assert_int_equal(st.early, KVT_PENDING_MAX_EARLY);
    assert_int_equal(st.early_dropped_total, 100);
    kvt_pending_destroy(t);
}

static void test_backpressure(void **state)
{
    kvt_pool_t *pool = make_pool(100);
    kvt_page_t pages[100];

    /* 2 % reserve of 100 pages: high-water mark 98 */
    assert_int_equal(kvt_backpressure_hwm(100, 2.0), 98);
    assert_int_equal(kvt_backpressure_hwm(100, 0.0), 100);
    assert_int_equal(kvt_backpressure_hwm(100, 50.0), 50);
    assert_int_equal(kvt_backpressure_check(90, 100, 2.0, 8), KVT_OK);
    assert_int_equal(kvt_backpressure_check(90, 100, 2.0, 9), KVT_ERR_BACKPRESSURE);
    assert_int_equal(kvt_backpressure_check(98, 100, 2.0, 1), KVT_ERR_BACKPRESSURE);
    /* nothing pinned: a request bigger than the mark is still admitted */
    assert_int_equal(kvt_backpressure_check(0, 100, 50.0, 80), KVT_OK);

    pin_pages(pool, 97, pages);
    assert_int_equal(kvt_backpressure_check_pool(pool, 2.0, 1), KVT_OK);
    assert_int_equal(kvt_backpressure_check_pool(pool, 2.0, 2), KVT_ERR_BACKPRESSURE);
    assert_int_equal(kvt_pool_unpin(pool, pages, 10), KVT_OK);
    assert_int_equal(kvt_backpressure_check_pool(pool, 2.0, 2), KVT_OK);
    assert_int_equal(kvt_pool_unpin(pool, pages + 10, 87), KVT_OK);
    kvt_pool_destroy(pool);
}

static void test_alloc_failures(void **state)
{
    kvt_pending_t *t;
    kvt_page_t pages[2] = {0, 1};
    int done;

    fake_now = 0;
    assert_int_equal(kvt_pending_create(1.0, &clk, &t), KVT_OK);
    for (uint64_t n = 1; n < 20; n++) {
        kvt_status_t st;
        kvt_alloc_fail_at(n, 0);
        st = kvt_pending_add(t, "x", "r", NULL, pages, 2, NULL, &done);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK)
            break;
        assert_int_equal(st, KVT_ERR_NOMEM);
    }
    kvt_pending_drain(t, NULL, NULL);
    kvt_pending_destroy(t);
}

struct pend_thr {
    kvt_pending_t *t;
    kvt_pool_t *pool;
    int id;
    int errors;
};

/* Each thread registers pulls and answers them, sometimes done-before-add. */
static void *pend_thr_body(void *arg)
{
    struct pend_thr *a = arg;
    char id[32];
    kvt_page_t pages[2];
    kvt_pending_entry_t e;
    int done;

    for (int i = 0; i < 3000; i++) {
        snprintf(id, sizeof(id), "t%d-%d", a->id, i);
        if (kvt_pool_alloc(a->pool, 2, 0, pages, NULL, NULL) != KVT_OK)
            continue; /* pool momentarily full */
        kvt_pool_pin(a->pool, pages, 2);
        kvt_pool_free(a->pool, pages, 2);
        if (i % 3 == 0) {
            kvt_pending_done(a->t, id, &e); /* early */
            if (kvt_pending_add(a->t, id, "r", a->pool, pages, 2, NULL, &done) != KVT_OK || !done) {
                a->errors++;
                continue;
            }
            kvt_pool_unpin(a->pool, pages, 2);
        } else {
            if (kvt_pending_add(a->t, id, "r", a->pool, pages, 2, NULL, &done) != KVT_OK || done) {
                a->errors++;
                continue;
            }
            if (kvt_pending_done(a->t, id, &e) == KVT_OK) {
                kvt_pending_entry_release(&e);
                kvt_pending_entry_clear(&e);
            } /* else: swept concurrently (pages already released) */
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    kvt_pool_t *pool = make_pool(64);
    kvt_pending_t *t;
    pthread_t th[3];
    struct pend_thr a[3];
    kvt_pending_stats_t st;

    assert_int_equal(kvt_pending_create(360.0, NULL, &t), KVT_OK);
    for (int i = 0; i < 3; i++) {
        a[i] = (struct pend_thr){t, pool, i, 0};
        pthread_create(&th[i], NULL, pend_thr_body, &a[i]);
    }
    for (int k = 0; k < 200; k++)
        kvt_pending_sweep(t, NULL, NULL, NULL); /* nothing is due; must not disturb */
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].errors, 0);
    }
    kvt_pending_stats(t, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.pages, 0);
    assert_int_equal(st.early, 0);
    assert_int_equal(st.expired_total, 0);
    assert_int_equal(pinned(pool), 0);
    assert_int_equal(free_pages(pool), 64);
    kvt_pending_destroy(t);
    kvt_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_done_releases),         cmocka_unit_test(test_early_done),
        cmocka_unit_test(test_sweep_releases),        cmocka_unit_test(test_cancel_by_request),
        cmocka_unit_test(test_early_records_bounded), cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_alloc_failures),        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
