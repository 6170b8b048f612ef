/*
 * MR planning for large regions: one MR per region, split exactly at the
 * device's max MR size, covering the region without gaps, never per page; and
 * key lookup by address.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvt_verbs_int.h"

#define GIB (1ull << 30)
static const char *U = "33333333-3333-3333-3333-333333333333";

static void check_plan(uint64_t base, uint64_t len, uint64_t max, uint32_t expect)
{
    kvt_verbs_mr_chunk_t c[64];
    uint32_t n = 0;
    uint64_t next = base;

    assert_int_equal(kvt_verbs_mr_plan_count(len, max), expect);
    assert_int_equal(kvt_verbs_mr_plan(base, len, max, c, 64, &n), KVT_OK);
    assert_int_equal(n, expect);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(c[i].addr, next); /* no gap, no overlap */
        if (i + 1 < n)
            assert_int_equal(c[i].len, max); /* cut exactly at max_mr_size */
        assert_true(c[i].len > 0);
        assert_true(max == 0 || c[i].len <= max);
        next += c[i].len;
    }
    assert_int_equal(next, base + len); /* covers the region */
}

static void test_small_region_is_one_mr(void **state)
{
    /* 1 GiB of 4 KiB pages: one MR, not 262144 */
    check_plan(0x7f0000000000ull, GIB, 256 * GIB, 1);
    check_plan(0x1000, GIB, 0, 1);   /* device without a limit */
    check_plan(0x1000, GIB, GIB, 1); /* exactly the limit: still one */
}

static void test_large_region_splits_at_max(void **state)
{
    check_plan(0x10000000ull, 3 * GIB, GIB, 3);
    check_plan(0x10000000ull, 3 * GIB + 4096, GIB, 4); /* last one holds 4 KiB */
    check_plan(0x10000000ull, 1000 * GIB, 256 * GIB, 4);
    {
        kvt_verbs_mr_chunk_t c[8];
        uint32_t n;

        assert_int_equal(kvt_verbs_mr_plan(0, 3 * GIB + 4096, GIB, c, 8, &n), KVT_OK);
        assert_int_equal(c[3].addr, 3 * GIB);
        assert_int_equal(c[3].len, 4096);
    }
}

static void test_bad_plans(void **state)
{
    kvt_verbs_mr_chunk_t c[2];
    uint32_t n = 77;

    assert_int_equal(kvt_verbs_mr_plan(0x1000, 0, GIB, c, 2, &n), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_plan(UINT64_MAX - 100, 4096, GIB, c, 2, &n), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_plan(0, 3 * GIB, GIB, c, 2, &n), KVT_ERR_INVALID); /* cap */
    assert_int_equal(n, 77);
}

static void test_map_lookup(void **state)
{
    kvt_verbs_mr_map_t m, copy;
    uint32_t key = 0;
    uint64_t left = 0;

    assert_int_equal(kvt_verbs_mr_map_init(&m, U, 0x100000, 10 * GIB + 100, 4 * GIB), KVT_OK);
    assert_int_equal(m.nkeys, 3);
    assert_int_equal(m.chunk_size, 4 * GIB);
    for (uint32_t i = 0; i < m.nkeys; i++)
        m.keys[i] = 1000 + i;
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0x100000, 1, &key, &left), KVT_OK);
    assert_int_equal(key, 1000);
    assert_int_equal(left, 4 * GIB);
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0x100000 + 4 * GIB - 1, 2, &key, &left), KVT_OK);
    assert_int_equal(key, 1000);
    assert_int_equal(left, 1); /* the caller must cut here */
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0x100000 + 8 * GIB + 50, 50, &key, &left), KVT_OK);
    assert_int_equal(key, 1002);
    assert_int_equal(left, 2 * GIB + 50);
    /* outside */
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0x100000 + 10 * GIB + 50, 50, &key, &left),
                     KVT_OK);
    assert_int_equal(left, 50);
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0x100000 + 10 * GIB + 50, 51, &key, &left),
                     KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, 0xfffff, 1, &key, &left), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_map_lookup(&m, UINT64_MAX, 2, &key, &left), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_map_copy(&copy, &m), KVT_OK);
    assert_ptr_not_equal(copy.keys, m.keys);
    assert_memory_equal(copy.keys, m.keys, 3 * sizeof(uint32_t));
    kvt_verbs_mr_map_clear(&copy);
    kvt_verbs_mr_map_clear(&m);
    /* bad uuid, empty region */
    assert_int_equal(kvt_verbs_mr_map_init(&m, "x", 0, 0, 0), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mr_map_init(&m, "333333333-3333-3333-3333-333333333333", 0, 10, 0),
                     KVT_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_region_is_one_mr),
        cmocka_unit_test(test_large_region_splits_at_max),
        cmocka_unit_test(test_bad_plans),
        cmocka_unit_test(test_map_lookup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
