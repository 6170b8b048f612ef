/*
 * test_reserve.c -- ReserveRequest table with a fake clock: grant against
 * unreserved free pages, allocations draw from the reservation, others
 * cannot eat reserved pages, release on completion / cancel / TTL,
 * free_chunks = free - reserved.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>

#include "kvt/kvt_reserve.h"

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
    p.page_size = 128;
    p.buffer_size = 128 * (size_t)npages;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_OK);
    return pool;
}

static void test_grant_draw_release(void **state)
{
    kvt_pool_t *pool = make_pool(10);
    kvt_reserve_t *t;
    kvt_page_t a[10], b[10];
    int granted;
    int64_t fc;
    uint32_t n, rem;
    kvt_reserve_stats_t st;

    fake_now = 0;
    assert_int_equal(kvt_reserve_create(pool, 30000, &clk, &t), KVT_OK);
    assert_int_equal(kvt_reserve_free_chunks(t), 10);

    assert_int_equal(kvt_reserve_request(t, "A", 6, 5000, &granted, &fc), KVT_OK);
    assert_true(granted);
    assert_int_equal(fc, 4);
    /* B wants 5 but only 4 are unreserved */
    assert_int_equal(kvt_reserve_request(t, "B", 5, 5000, &granted, &fc), KVT_OK);
    assert_false(granted);
    assert_int_equal(fc, 4);

    /* an unreserved request cannot take A's pages */
    assert_int_equal(kvt_reserve_alloc(t, NULL, 5, 0, b, NULL, NULL), KVT_ERR_NOSPACE);
    assert_int_equal(kvt_reserve_alloc(t, "other", 5, KVT_ALLOC_PARTIAL, b, NULL, &n), KVT_OK);
    assert_int_equal(n, 4);
    assert_int_equal(kvt_reserve_free_chunks(t), 0);

    /* A draws its 6 even though the pool has only 6 free pages left */
    assert_int_equal(kvt_reserve_alloc(t, "A", 4, 0, a, NULL, &n), KVT_OK);
    assert_int_equal(n, 4);
    assert_int_equal(kvt_reserve_remaining(t, "A", &rem), KVT_OK);
    assert_int_equal(rem, 2);
    assert_int_equal(kvt_reserve_alloc(t, "A", 2, 0, a + 4, NULL, &n), KVT_OK);
    assert_int_equal(kvt_reserve_remaining(t, "A", &rem), KVT_OK);
    assert_int_equal(rem, 0);
    /* beyond its reservation A competes for unreserved pages like anyone */
    assert_int_equal(kvt_reserve_alloc(t, "A", 1, 0, a + 6, NULL, NULL), KVT_ERR_NOSPACE);

    /* completion: release ends the reservation */
    assert_int_equal(kvt_reserve_release(t, "A"), KVT_OK);
    assert_int_equal(kvt_reserve_release(t, "A"), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_pool_free(pool, a, 6), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, b, 4), KVT_OK);
    assert_int_equal(kvt_reserve_free_chunks(t), 10);
    kvt_reserve_stats(t, &st);
    assert_int_equal(st.granted_total, 1);
    assert_int_equal(st.refused_total, 1);
    assert_int_equal(st.released_total, 1);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.reserved_pages, 0);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_cancel_returns_unused(void **state)
{
    kvt_pool_t *pool = make_pool(8);
    kvt_reserve_t *t;
    kvt_page_t p[8];
    int granted;
    int64_t fc;

    fake_now = 0;
    assert_int_equal(kvt_reserve_create(pool, 30000, &clk, &t), KVT_OK);
    assert_int_equal(kvt_reserve_request(t, "A", 5, 0, &granted, &fc), KVT_OK);
    assert_true(granted);
    assert_int_equal(kvt_reserve_alloc(t, "A", 2, 0, p, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_reserve_free_chunks(t), 3); /* 6 free - 3 reserved */
    /* CancelNotif: the 3 undrawn pages are free for everybody again */
    assert_int_equal(kvt_reserve_release(t, "A"), KVT_OK);
    assert_int_equal(kvt_reserve_free_chunks(t), 6);
    assert_int_equal(kvt_reserve_alloc(t, NULL, 6, 0, p + 2, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, p, 8), KVT_OK);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_ttl_expiry_and_renewal(void **state)
{
    kvt_pool_t *pool = make_pool(8);
    kvt_reserve_t *t;
    kvt_page_t p[8];
    int granted;
    int64_t fc;
    uint32_t n;
    kvt_reserve_stats_t st;

    fake_now = 0;
    assert_int_equal(kvt_reserve_create(pool, 1000, &clk, &t), KVT_OK);
    assert_int_equal(kvt_reserve_request(t, "A", 4, 2000, &granted, &fc), KVT_OK);
    assert_int_equal(kvt_reserve_request(t, "B", 4, 0, &granted, &fc), KVT_OK); /* default 1 s */
    assert_true(granted);
    assert_int_equal(fc, 0);

    fake_now = 1500 * KVT_NSEC_PER_MSEC; /* B expired, A not */
    assert_int_equal(kvt_reserve_sweep(t, &n), KVT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(kvt_reserve_free_chunks(t), 4);

    /* a draw renews A's TTL */
    assert_int_equal(kvt_reserve_alloc(t, "A", 1, 0, p, NULL, NULL), KVT_OK);
    fake_now = 3000 * KVT_NSEC_PER_MSEC; /* 2 s after creation, 1.5 s after the draw */
    assert_int_equal(kvt_reserve_sweep(t, &n), KVT_OK);
    assert_int_equal(n, 0);
    fake_now = 3600 * KVT_NSEC_PER_MSEC;
    /* lazily swept by the next call */
    assert_int_equal(kvt_reserve_free_chunks(t), 7);
    assert_int_equal(kvt_reserve_remaining(t, "A", &n), KVT_ERR_NOT_FOUND);
    kvt_reserve_stats(t, &st);
    assert_int_equal(st.expired_total, 2);
    kvt_pool_free(pool, p, 1);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_resize_and_limits(void **state)
{
    kvt_pool_t *pool = make_pool(10);
    kvt_reserve_t *t;
    int granted;
    int64_t fc;
    uint32_t rem;

    fake_now = 0;
    assert_int_equal(kvt_reserve_create(pool, 1000, &clk, &t), KVT_OK);
    /* larger than the whole pool: refused at once */
    assert_int_equal(kvt_reserve_request(t, "huge", 11, 0, &granted, &fc), KVT_OK);
    assert_false(granted);
    assert_int_equal(fc, 10);
    assert_int_equal(kvt_reserve_request(t, "A", 3, 0, &granted, &fc), KVT_OK);
    assert_true(granted);
    /* re-request grows to the larger size if it fits */
    assert_int_equal(kvt_reserve_request(t, "A", 8, 0, &granted, &fc), KVT_OK);
    assert_true(granted);
    assert_int_equal(kvt_reserve_remaining(t, "A", &rem), KVT_OK);
    assert_int_equal(rem, 8);
    assert_int_equal(fc, 2);
    /* growing beyond what is free is refused, the old reservation stays */
    assert_int_equal(kvt_reserve_request(t, "A", 11, 0, &granted, &fc), KVT_OK);
    assert_false(granted);
    assert_int_equal(kvt_reserve_request(t, "A", 10, 0, &granted, &fc), KVT_OK);
    assert_true(granted);
    assert_int_equal(kvt_reserve_request(t, "B", 1, 0, &granted, &fc), KVT_OK);
    assert_false(granted);
    /* smaller re-request keeps what is held */
    assert_int_equal(kvt_reserve_request(t, "A", 2, 0, &granted, &fc), KVT_OK);
    assert_true(granted);
    assert_int_equal(kvt_reserve_remaining(t, "A", &rem), KVT_OK);
    assert_int_equal(rem, 10);
    /* invalid */
    assert_int_equal(kvt_reserve_request(t, "", 1, 0, &granted, &fc), KVT_ERR_INVALID);
    assert_int_equal(kvt_reserve_request(t, "C", -1, 0, &granted, &fc), KVT_ERR_INVALID);
    assert_int_equal(kvt_reserve_create(pool, 0, &clk, &t), KVT_ERR_INVALID);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

static void test_transparent_without_reservations(void **state)
{
    kvt_pool_t *pool = make_pool(4);
    kvt_reserve_t *t;
    kvt_page_t p[5];
    uint8_t bm[1];
    uint32_t n;

    assert_int_equal(kvt_reserve_create(pool, 1000, NULL, &t), KVT_OK);
    assert_int_equal(kvt_reserve_alloc(t, "x", 5, 0, p, NULL, NULL), KVT_ERR_TOO_LARGE);
    assert_int_equal(kvt_reserve_alloc(t, "", 3, 0, p, NULL, &n), KVT_OK);
    assert_int_equal(kvt_reserve_alloc(t, NULL, 2, KVT_ALLOC_PARTIAL, p + 3, bm, &n), KVT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(bm[0], 0x2);
    assert_int_equal(kvt_pool_free(pool, p, 4), KVT_OK);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

struct res_thr {
    kvt_reserve_t *t;
    kvt_pool_t *pool;
    int id;
    int errors;
};

/* Each thread: reserve 4, allocate 4 (must never fail once granted), free, release. */
static void *res_thr_body(void *arg)
{
    struct res_thr *a = arg;
    char id[32];
    kvt_page_t p[4];
    int granted;
    int64_t fc;

    for (int i = 0; i < 3000; i++) {
        snprintf(id, sizeof(id), "r%d-%d", a->id, i);
        if (kvt_reserve_request(a->t, id, 4, 60000, &granted, &fc) != KVT_OK) {
            a->errors++;
            continue;
        }
        if (granted) {
            if (kvt_reserve_alloc(a->t, id, 4, 0, p, NULL, NULL) != KVT_OK)
                a->errors++; /* a granted reservation must be honoured */
            else
                kvt_pool_free(a->pool, p, 4);
        } else {
            /* unreserved traffic competes for the rest */
            if (kvt_reserve_alloc(a->t, NULL, 1, 0, p, NULL, NULL) == KVT_OK)
                kvt_pool_free(a->pool, p, 1);
        }
        kvt_reserve_release(a->t, id);
    }
    return NULL;
}

static void test_threads(void **state)
{
    kvt_pool_t *pool = make_pool(10);
    kvt_reserve_t *t;
    pthread_t th[4];
    struct res_thr a[4];
    kvt_reserve_stats_t st;

    assert_int_equal(kvt_reserve_create(pool, 1000, NULL, &t), KVT_OK);
    for (int i = 0; i < 4; i++) {
        a[i] = (struct res_thr){t, pool, i, 0};
        pthread_create(&th[i], NULL, res_thr_body, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].errors, 0);
    }
    kvt_reserve_stats(t, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.reserved_pages, 0);
    assert_int_equal(kvt_reserve_free_chunks(t), 10);
    kvt_reserve_destroy(t);
    kvt_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_draw_release),
        cmocka_unit_test(test_cancel_returns_unused),
        cmocka_unit_test(test_ttl_expiry_and_renewal),
        cmocka_unit_test(test_resize_and_limits),
        cmocka_unit_test(test_transparent_without_reservations),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
