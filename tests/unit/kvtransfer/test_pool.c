/*
 * test_pool.c -- kvt_pool: geometry, alloc/free/ref/pin, double free and
 * underflow detection, partial allocation bitmap, fail-fast on oversize
 * requests, bounds-checked refs, registration hooks, copies and CPU offload,
 * allocation failure injection, thread safety.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "kvt/kvt_pool.h"

static kvt_pool_t *make_pool(size_t page, uint32_t npages, uint32_t nregions, kvt_mem_class_t cls)
{
    kvt_pool_params_t p = {0};
    kvt_pool_t *pool = NULL;

    p.name = "test";
    p.mem_class = cls;
    p.page_size = page;
    p.buffer_size = page * npages;
    p.nregions = nregions;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_OK);
    return pool;
}

static void test_geometry(void **state)
{
    kvt_chunk_geom_t g;
    int64_t shape_2ltd[] = {2, 32, 256, 1024};
    int64_t shape_t2d[] = {256, 2, 512};
    int64_t bad[] = {2, 0, 4};

    assert_int_equal(kvt_dtype_size("bfloat16"), 2);
    assert_int_equal(kvt_dtype_size("half"), 2);
    assert_int_equal(kvt_dtype_size("torch.float32"), 4);
    assert_int_equal(kvt_dtype_size("float8_e4m3fn"), 1);
    assert_int_equal(kvt_dtype_size("complex128"), 0);
    /* LMCache's names for FP8 KV (lmcache/utils.py TORCH_DTYPE_TO_STR_DTYPE) */
    assert_int_equal(kvt_dtype_size("fp8_e4m3fn"), 1);
    assert_int_equal(kvt_dtype_size("fp8_e5m2"), 1);
    assert_int_equal(kvt_dtype_size("fp8"), 1);

    /* one LMCache chunk, every layer: Llama-3-8B (32 layers, 8 kv heads x
     * 128) at chunk_size 256 in bfloat16 = 32 MiB per page */
    assert_int_equal(kvt_chunk_geom_lmcache(&g, 32, 256, 1024, "bfloat16", 0), KVT_OK);
    assert_int_equal(g.fmt, KVT_FMT_KV_2LTD);
    assert_int_equal(kvt_chunk_bytes(&g), 2u * 32 * 256 * 1024 * 2);
    assert_int_equal(kvt_chunk_bytes_toks(&g, 37), 2u * 32 * 37 * 1024 * 2);
    assert_int_equal(kvt_chunk_geom_lmcache(&g, 61, 256, 576, "bfloat16", 1), KVT_OK);
    assert_int_equal(kvt_chunk_bytes(&g), 1u * 61 * 256 * 576 * 2); /* MLA: one plane */
    assert_int_equal(kvt_chunk_geom_lmcache(&g, 0, 256, 576, "bfloat16", 0), KVT_ERR_INVALID);

    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_2LTD, shape_2ltd, 4, "bfloat16"), KVT_OK);
    assert_int_equal(g.token_dim, 2);
    assert_int_equal(kvt_chunk_full_tokens(&g), 256);
    assert_int_equal(kvt_chunk_bytes(&g), 2u * 32 * 256 * 1024 * 2);
    /* a short last chunk of 100 tokens */
    assert_int_equal(kvt_chunk_bytes_toks(&g, 100), 2u * 32 * 100 * 1024 * 2);
    assert_int_equal(kvt_chunk_bytes_toks(&g, 0), kvt_chunk_bytes(&g));
    assert_int_equal(kvt_chunk_bytes_toks(&g, 256), kvt_chunk_bytes(&g));
    assert_int_equal(kvt_chunk_bytes_toks(&g, 999), kvt_chunk_bytes(&g));

    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_T2D, shape_t2d, 3, "half"), KVT_OK);
    assert_int_equal(g.token_dim, 0);
    assert_int_equal(kvt_chunk_bytes_toks(&g, 1), 2u * 512 * 2);

    /* opaque format: last_chunk_toks ignored */
    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_BINARY, shape_t2d, 3, "uint8"), KVT_OK);
    assert_int_equal(g.token_dim, -1);
    assert_int_equal(kvt_chunk_bytes_toks(&g, 5), 256u * 2 * 512);

    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_2LTD, bad, 3, "half"), KVT_ERR_INVALID);
    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_2LTD, shape_2ltd, 4, "nope"),
                     KVT_ERR_INVALID);
    /* 2LTD needs at least 3 dims for its token dim */
    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_2LTD, shape_2ltd, 2, "half"),
                     KVT_ERR_INVALID);
    assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_2LTD, shape_2ltd, 9, "half"),
                     KVT_ERR_INVALID);
    {
        int64_t huge[] = {INT64_MAX, INT64_MAX, 4};
        assert_int_equal(kvt_chunk_geom_init(&g, KVT_FMT_KV_T2D, huge, 3, "half"), KVT_ERR_INVALID);
    }
}

static void test_uuid(void **state)
{
    kvt_uuid_t a, b;
    char s[KVT_UUID_STR_LEN + 1];

    assert_int_equal(kvt_uuid_generate(&a), KVT_OK);
    kvt_uuid_to_str(&a, s);
    assert_int_equal(strlen(s), 36);
    assert_int_equal(s[8], '-');
    assert_int_equal(s[14], '4'); /* version 4 */
    assert_int_equal(kvt_uuid_parse(s, 36, &b), KVT_OK);
    assert_true(kvt_uuid_equal(&a, &b));
    assert_int_equal(kvt_uuid_parse("3F2B6C1E-0D4A-4E8B-9C1F-5A6B7C8D9E0F", 36, &b), KVT_OK);
    kvt_uuid_to_str(&b, s);
    assert_string_equal(s, "3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f");
    assert_int_equal(kvt_uuid_parse("3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0", 35, &b),
                     KVT_ERR_INVALID);
    assert_int_equal(kvt_uuid_parse("3f2b6c1e00d4a-4e8b-9c1f-5a6b7c8d9e0f", 36, &b),
                     KVT_ERR_INVALID);
    assert_int_equal(kvt_uuid_parse("3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0g", 36, &b),
                     KVT_ERR_INVALID);
    memset(&b, 0, sizeof(b));
    assert_true(kvt_uuid_is_nil(&b));
    assert_false(kvt_uuid_is_nil(&a));
}

static void test_alloc_free_ref_pin(void **state)
{
    kvt_pool_t *pool = make_pool(4096, 8, 1, KVT_MEM_HOST);
    kvt_page_t pages[8];
    kvt_pool_stats_t st;
    uint32_t ref, pin, n;

    assert_int_equal(kvt_pool_total_pages(pool), 8);
    assert_int_equal(kvt_pool_alloc(pool, 3, 0, pages, NULL, &n), KVT_OK);
    assert_int_equal(n, 3);
    /* deterministic: page 0 first */
    assert_int_equal(pages[0], 0);
    assert_int_equal(pages[1], 1);
    assert_int_equal(pages[2], 2);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 5);
    assert_int_equal(st.used_pages, 3);
    assert_int_equal(st.pinned_pages, 0);

    assert_int_equal(kvt_pool_page_counts(pool, pages[0], &ref, &pin), KVT_OK);
    assert_int_equal(ref, 1);
    assert_int_equal(pin, 0);

    /* a second owner keeps the page alive after the first frees it */
    assert_int_equal(kvt_pool_ref(pool, &pages[0], 1), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, &pages[0], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 5);
    assert_int_equal(kvt_pool_unref(pool, &pages[0], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 6);

    /* pin holds a ref: owner frees, page stays until unpinned */
    assert_int_equal(kvt_pool_pin(pool, &pages[1], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.pinned_pages, 1);
    assert_int_equal(kvt_pool_free(pool, &pages[1], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 6);
    assert_int_equal(kvt_pool_page_counts(pool, pages[1], &ref, &pin), KVT_OK);
    assert_int_equal(ref, 1);
    assert_int_equal(pin, 1);
    assert_int_equal(kvt_pool_unpin(pool, &pages[1], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 7);
    assert_int_equal(st.pinned_pages, 0);

    /* ref/pin of a free page is refused */
    assert_int_equal(kvt_pool_ref(pool, &pages[1], 1), KVT_ERR_STATE);
    assert_int_equal(kvt_pool_pin(pool, &pages[1], 1), KVT_ERR_STATE);

    assert_int_equal(kvt_pool_free(pool, &pages[2], 1), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 8);
    assert_int_equal(st.alloc_total, 3);
    assert_int_equal(st.double_free_total, 0);
    kvt_pool_destroy(pool);
}

static void test_double_free_detected(void **state)
{
    kvt_pool_t *pool = make_pool(64, 4, 1, KVT_MEM_HOST);
    kvt_page_t pages[2];
    kvt_page_t batch[3];
    kvt_pool_stats_t st;

    assert_int_equal(kvt_pool_alloc(pool, 2, 0, pages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, &pages[0], 1), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, &pages[0], 1), KVT_ERR_DOUBLE_FREE);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.double_free_total, 1);
    assert_int_equal(st.free_pages, 3); /* the free list was not corrupted */

    /* a batch with a bad entry: the good ones still apply, first error returned */
    batch[0] = pages[0];      /* already free */
    batch[1] = pages[1];      /* valid */
    batch[2] = KVT_PAGE_NONE; /* skipped */
    assert_int_equal(kvt_pool_free(pool, batch, 3), KVT_ERR_DOUBLE_FREE);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.double_free_total, 2);
    assert_int_equal(st.free_pages, 4);

    /* owner ref gone, only the pin's ref remains: freeing again is a double free */
    assert_int_equal(kvt_pool_alloc(pool, 1, 0, pages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_pin(pool, pages, 1), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, pages, 1), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, pages, 1), KVT_ERR_DOUBLE_FREE);
    assert_int_equal(kvt_pool_unpin(pool, pages, 1), KVT_OK);
    assert_int_equal(kvt_pool_unpin(pool, pages, 1), KVT_ERR_UNDERFLOW);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.double_free_total, 3);
    assert_int_equal(st.underflow_total, 1);
    assert_int_equal(st.free_pages, 4);
    assert_int_equal(st.pinned_pages, 0);

    /* out of range */
    batch[0] = 4;
    assert_int_equal(kvt_pool_free(pool, batch, 1), KVT_ERR_BOUNDS);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.bounds_error_total, 1);
    kvt_pool_destroy(pool);
}

static void test_partial_alloc_bitmap(void **state)
{
    kvt_pool_t *pool = make_pool(128, 5, 1, KVT_MEM_HOST);
    kvt_page_t pages[8];
    uint8_t bm[1];
    uint32_t n = 99;
    kvt_pool_stats_t st;

    /* all-or-nothing fails and takes nothing */
    assert_int_equal(kvt_pool_alloc(pool, 3, 0, pages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_alloc(pool, 3, 0, pages + 3, bm, &n), KVT_ERR_NOSPACE);
    assert_int_equal(n, 99); /* outputs untouched on error */
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 2);

    /* partial: 2 of 3 given, slot 2 marked */
    memset(bm, 0xff, sizeof(bm));
    assert_int_equal(kvt_pool_alloc(pool, 3, KVT_ALLOC_PARTIAL, pages + 3, bm, &n), KVT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(bm[0], 0x04);
    assert_false(kvt_bitmap_test(bm, 0));
    assert_false(kvt_bitmap_test(bm, 1));
    assert_true(kvt_bitmap_test(bm, 2));
    assert_int_equal(pages[5], KVT_PAGE_NONE);
    assert_true(pages[3] < 5 && pages[4] < 5);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 0);
    assert_int_equal(st.alloc_fail_total, 3 + 1);

    /* freeing with KVT_PAGE_NONE in the batch is fine */
    assert_int_equal(kvt_pool_free(pool, pages, 6), KVT_OK);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 5);
    kvt_pool_destroy(pool);
}

static void test_too_large_fails_fast(void **state)
{
    kvt_pool_t *pool = make_pool(256, 4, 1, KVT_MEM_HOST);
    kvt_page_t pages[5];
    kvt_pool_stats_t st;

    assert_int_equal(kvt_pool_alloc(pool, 5, 0, pages, NULL, NULL), KVT_ERR_TOO_LARGE);
    assert_int_equal(kvt_pool_alloc(pool, 5, KVT_ALLOC_PARTIAL, pages, NULL, NULL),
                     KVT_ERR_TOO_LARGE);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.too_large_total, 2);
    assert_int_equal(st.free_pages, 4);
    /* exactly the whole buffer is fine */
    assert_int_equal(kvt_pool_alloc(pool, 4, 0, pages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_free(pool, pages, 4), KVT_OK);
    kvt_pool_destroy(pool);
}

static void test_keep_free(void **state)
{
    kvt_pool_t *pool = make_pool(64, 10, 1, KVT_MEM_HOST);
    kvt_page_t pages[10];
    uint32_t n;

    assert_int_equal(kvt_pool_alloc_keep(pool, 5, 6, 0, pages, NULL, NULL), KVT_ERR_NOSPACE);
    assert_int_equal(kvt_pool_alloc_keep(pool, 5, 6, KVT_ALLOC_PARTIAL, pages, NULL, &n), KVT_OK);
    assert_int_equal(n, 4);
    assert_int_equal(kvt_pool_alloc_keep(pool, 1, 6, KVT_ALLOC_PARTIAL, pages + 5, NULL, &n),
                     KVT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvt_pool_free(pool, pages, 4), KVT_OK);
    kvt_pool_destroy(pool);
}

static void test_bounds_checked_refs(void **state)
{
    kvt_pool_t *pool = make_pool(1024, 10, 3, KVT_MEM_HOST);
    kvt_region_info_t r0, r1, r2, found;
    kvt_buf_ref_t ref;
    kvt_page_t pg;
    void *addr, *addr2;
    size_t len;
    kvt_pool_stats_t st;

    assert_int_equal(kvt_pool_nregions(pool), 3);
    assert_int_equal(kvt_pool_region(pool, 0, &r0), KVT_OK);
    assert_int_equal(kvt_pool_region(pool, 1, &r1), KVT_OK);
    assert_int_equal(kvt_pool_region(pool, 2, &r2), KVT_OK);
    assert_int_equal(kvt_pool_region(pool, 3, &found), KVT_ERR_BOUNDS);
    assert_int_equal(r0.npages + r1.npages + r2.npages, 10);
    assert_int_equal(r0.npages, 4);
    assert_int_equal(r1.first_page, 4);
    assert_int_equal(r2.first_page, 7);
    assert_int_equal(r1.length, 3 * 1024);
    assert_false(kvt_uuid_equal(&r0.uuid, &r1.uuid));
    assert_int_equal(kvt_pool_region_find(pool, &r2.uuid, &found), KVT_OK);
    assert_int_equal(found.first_page, 7);

    /* page 5 = region 1, page 1 */
    assert_int_equal(kvt_pool_page_to_ref(pool, 5, &ref), KVT_OK);
    assert_true(kvt_uuid_equal(&ref.region, &r1.uuid));
    assert_int_equal(ref.page, 1);
    assert_int_equal(kvt_pool_ref_to_page(pool, &ref, &pg), KVT_OK);
    assert_int_equal(pg, 5);
    assert_int_equal(kvt_pool_ref_resolve(pool, &ref, &addr, &len), KVT_OK);
    assert_int_equal(kvt_pool_page_addr(pool, 5, &addr2), KVT_OK);
    assert_ptr_equal(addr, addr2);
    assert_ptr_equal(addr, (char *)r1.base + 1024);
    assert_int_equal(len, 1024);

    /* past the region's last page */
    ref.page = 3;
    assert_int_equal(kvt_pool_ref_resolve(pool, &ref, &addr, &len), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_ref_to_page(pool, &ref, &pg), KVT_ERR_BOUNDS);
    ref.page = UINT32_MAX;
    assert_int_equal(kvt_pool_ref_resolve(pool, &ref, &addr, &len), KVT_ERR_BOUNDS);
    /* unknown region */
    memset(&ref.region, 0xab, sizeof(ref.region));
    ref.page = 0;
    assert_int_equal(kvt_pool_ref_resolve(pool, &ref, &addr, &len), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_pool_page_addr(pool, 10, &addr), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_page_to_ref(pool, 10, &ref), KVT_ERR_BOUNDS);

    /* byte ranges as the TCP transport asks */
    assert_int_equal(kvt_pool_range_check(pool, &r1.uuid, 1024, 2048, &addr, &pg), KVT_OK);
    assert_ptr_equal(addr, (char *)r1.base + 1024);
    assert_int_equal(pg, 5);
    assert_int_equal(kvt_pool_range_check(pool, &r1.uuid, 1024, 2049, &addr, NULL), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_range_check(pool, &r1.uuid, 3 * 1024, 0, &addr, NULL),
                     KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_range_check(pool, &r1.uuid, UINT64_MAX, 2, &addr, NULL),
                     KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_range_check(pool, &r1.uuid, 8, UINT64_MAX - 4, &addr, NULL),
                     KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_range_check(pool, &ref.region, 0, 1, &addr, NULL), KVT_ERR_NOT_FOUND);
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.bounds_error_total, 8);
    kvt_pool_destroy(pool);
}

/* ---- registration hooks ---------------------------------------------------- */

struct hook_rec {
    int registered;
    int deregistered;
    int fail_at; /* fail the Nth registration (1-based), 0 = never */
    size_t bytes;
};

static kvt_status_t on_reg(void *arg, const kvt_region_info_t *r, void **handle)
{
    struct hook_rec *h = arg;
    if (h->fail_at != 0 && h->registered + 1 == h->fail_at)
        return KVT_ERR_IO;
    h->registered++;
    h->bytes += r->length;
    *handle = (void *)(uintptr_t)(0x1000 + r->first_page);
    return KVT_OK;
}

static void on_dereg(void *arg, const kvt_region_info_t *r, void *handle)
{
    struct hook_rec *h = arg;
    assert_ptr_equal(handle, (void *)(uintptr_t)(0x1000 + r->first_page));
    h->deregistered++;
}

static void test_registration_hooks(void **state)
{
    struct hook_rec a = {0}, b = {0}, c = {0, 0, 2, 0};
    kvt_region_hook_t ha = {on_reg, on_dereg, &a};
    kvt_region_hook_t hb = {on_reg, on_dereg, &b};
    kvt_region_hook_t hc = {on_reg, on_dereg, &c};
    kvt_pool_params_t p = {0};
    kvt_pool_t *pool = NULL;

    p.page_size = 4096;
    p.buffer_size = 4096 * 6;
    p.nregions = 2;
    p.hooks = &ha;
    p.nhooks = 1;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_OK);
    /* once per region, never per page */
    assert_int_equal(a.registered, 2);
    assert_int_equal(a.bytes, 4096 * 6);
    assert_ptr_equal(kvt_pool_region_handle(pool, 1, 0), (void *)(uintptr_t)(0x1000 + 3));

    assert_int_equal(kvt_pool_add_hook(pool, &hb), KVT_OK);
    assert_int_equal(b.registered, 2);
    /* a failing hook is undone and not added */
    assert_int_equal(kvt_pool_add_hook(pool, &hc), KVT_ERR_IO);
    assert_int_equal(c.registered, 1);
    assert_int_equal(c.deregistered, 1);

    assert_int_equal(kvt_pool_remove_hook(pool, &ha), KVT_OK);
    assert_int_equal(a.deregistered, 2);
    assert_int_equal(kvt_pool_remove_hook(pool, &ha), KVT_ERR_NOT_FOUND);
    /* hb moved to index 0 */
    assert_ptr_equal(kvt_pool_region_handle(pool, 0, 0), (void *)(uintptr_t)0x1000);
    kvt_pool_destroy(pool);
    assert_int_equal(b.deregistered, 2);

    /* a failing hook at creation fails the creation cleanly */
    memset(&c, 0, sizeof(c));
    c.fail_at = 2;
    p.hooks = &hc;
    pool = NULL;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_IO);
    assert_null(pool);
    assert_int_equal(c.deregistered, 1);
}

static void test_external_memory_and_fixed_uuid(void **state)
{
    static uint8_t mem[4 * 512];
    kvt_uuid_t u;
    kvt_pool_params_t p = {0};
    kvt_pool_t *pool = NULL;
    kvt_region_info_t r;
    kvt_page_t pg;
    uint8_t out[4];

    assert_int_equal(kvt_uuid_parse("00000000-0000-4000-8000-000000000001", 36, &u), KVT_OK);
    p.page_size = 512;
    p.buffer_size = sizeof(mem);
    p.external_base = mem;
    p.region_uuids = &u;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_OK);
    assert_int_equal(kvt_pool_region(pool, 0, &r), KVT_OK);
    assert_ptr_equal(r.base, mem);
    assert_true(kvt_uuid_equal(&r.uuid, &u));
    assert_int_equal(kvt_pool_alloc(pool, 1, 0, &pg, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_write(pool, pg, 510, "xy", 2), KVT_OK);
    assert_memory_equal(mem + 510, "xy", 2);
    assert_int_equal(kvt_pool_write(pool, pg, 511, "xy", 2), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_pool_read(pool, pg, 509, out, 3), KVT_OK);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 'x');
    assert_int_equal(kvt_pool_read(pool, pg, 0, out, 513), KVT_ERR_BOUNDS);
    kvt_pool_destroy(pool); /* must not free caller memory */
    mem[0] = 1;

    /* external memory with several regions is refused */
    p.nregions = 2;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_INVALID);
}

static void test_create_invalid(void **state)
{
    kvt_pool_params_t p = {0};
    kvt_pool_t *pool = NULL;

    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_INVALID); /* page_size 0 */
    p.page_size = 4096;
    p.buffer_size = 100; /* less than a page */
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_INVALID);
    p.buffer_size = 4096 * 2;
    p.nregions = 3; /* more regions than pages */
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_INVALID);
    p.nregions = 1;
    p.mem_class = (kvt_mem_class_t)7;
    assert_int_equal(kvt_pool_create(&p, &pool), KVT_ERR_INVALID);
    assert_null(pool);
}

/* ---- device class and copies ------------------------------------------------ */

static int dev_to_host_calls, host_to_dev_calls;

static kvt_status_t counting_to_host(void *ctx, void *dst, const void *src, size_t len)
{
    dev_to_host_calls++;
    return kvt_mem_device_emul_ops.copy_to_host(ctx, dst, src, len);
}

static kvt_status_t counting_from_host(void *ctx, void *dst, const void *src, size_t len)
{
    host_to_dev_calls++;
    return kvt_mem_device_emul_ops.copy_from_host(ctx, dst, src, len);
}

static void test_cpu_offload_copy(void **state)
{
    kvt_mem_ops_t ops = kvt_mem_device_emul_ops;
    kvt_pool_params_t p = {0};
    kvt_pool_t *dev = NULL, *cpu, *dev2 = NULL;
    kvt_page_t dpages[3], cpages[3], d2;
    uint8_t buf[1024], out[1024];
    kvt_pool_stats_t st;

    ops.copy_to_host = counting_to_host;
    ops.copy_from_host = counting_from_host;
    p.name = "npu";
    p.mem_class = KVT_MEM_DEVICE;
    p.ops = &ops;
    p.page_size = 1024;
    p.buffer_size = 1024 * 4;
    assert_int_equal(kvt_pool_create(&p, &dev), KVT_OK);
    assert_int_equal(kvt_pool_mem_class(dev), KVT_MEM_DEVICE);
    cpu = make_pool(1024, 3, 1, KVT_MEM_HOST);

    assert_int_equal(kvt_pool_alloc(dev, 3, 0, dpages, NULL, NULL), KVT_OK);
    for (int i = 0; i < 3; i++) {
        memset(buf, 0x10 + i, sizeof(buf));
        buf[0] = (uint8_t)i;
        assert_int_equal(kvt_pool_write(dev, dpages[i], 0, buf, sizeof(buf)), KVT_OK);
    }
    assert_int_equal(host_to_dev_calls, 3);

    assert_int_equal(kvt_pool_offload(cpu, dev, dpages, 3, cpages), KVT_OK);
    assert_int_equal(dev_to_host_calls, 3); /* device -> host through the device ops */
    /* the device pages can go now: the data lives in the CPU pool */
    assert_int_equal(kvt_pool_free(dev, dpages, 3), KVT_OK);
    for (int i = 0; i < 3; i++) {
        memset(buf, 0x10 + i, sizeof(buf));
        buf[0] = (uint8_t)i;
        assert_int_equal(kvt_pool_read(cpu, cpages[i], 0, out, sizeof(out)), KVT_OK);
        assert_memory_equal(out, buf, sizeof(buf));
    }
    /* CPU pool full: offload of one more is all-or-nothing */
    assert_int_equal(kvt_pool_alloc(dev, 1, 0, dpages, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_offload(cpu, dev, dpages, 1, cpages), KVT_ERR_NOSPACE);

    /* device -> device goes through host staging */
    p.ops = NULL;
    assert_int_equal(kvt_pool_create(&p, &dev2), KVT_OK);
    assert_int_equal(kvt_pool_alloc(dev2, 1, 0, &d2, NULL, NULL), KVT_OK);
    memset(buf, 0x5a, sizeof(buf));
    assert_int_equal(kvt_pool_write(dev, dpages[0], 0, buf, sizeof(buf)), KVT_OK);
    dev_to_host_calls = 0;
    assert_int_equal(kvt_pool_copy_page(dev2, d2, dev, dpages[0], 0), KVT_OK);
    assert_int_equal(dev_to_host_calls, 1);
    assert_int_equal(kvt_pool_read(dev2, d2, 0, out, sizeof(out)), KVT_OK);
    assert_memory_equal(out, buf, sizeof(buf));
    /* short copy (last chunk) and an oversize one */
    assert_int_equal(kvt_pool_copy_page(dev2, d2, dev, dpages[0], 100), KVT_OK);
    assert_int_equal(kvt_pool_copy_page(dev2, d2, dev, dpages[0], 1025), KVT_ERR_BOUNDS);

    kvt_pool_stats(cpu, &st);
    assert_int_equal(st.free_pages, 0);
    assert_int_equal(kvt_pool_free(cpu, cpages, 3), KVT_OK);
    kvt_pool_destroy(dev2);
    kvt_pool_destroy(cpu);
    kvt_pool_destroy(dev);
}

static void test_offload_page_size_mismatch(void **state)
{
    kvt_pool_t *a = make_pool(1024, 2, 1, KVT_MEM_DEVICE);
    kvt_pool_t *b = make_pool(512, 2, 1, KVT_MEM_HOST);
    kvt_page_t pg, out;

    assert_int_equal(kvt_pool_alloc(a, 1, 0, &pg, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_pool_offload(b, a, &pg, 1, &out), KVT_ERR_INVALID);
    pg = 9;
    assert_int_equal(kvt_pool_offload(a, a, &pg, 1, &out), KVT_ERR_BOUNDS);
    kvt_pool_destroy(a);
    kvt_pool_destroy(b);
}

static void test_alloc_failure_injection(void **state)
{
    kvt_pool_params_t p = {0};
    int failures = 0;

    p.page_size = 256;
    p.buffer_size = 256 * 8;
    p.nregions = 2;
    /* fail each allocation of pool creation in turn: clean error, no leak (ASan) */
    for (uint64_t n = 1; n < 64; n++) {
        kvt_pool_t *pool = NULL;
        kvt_status_t st;
        kvt_alloc_fail_at(n, 0);
        st = kvt_pool_create(&p, &pool);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK) {
            kvt_pool_destroy(pool);
            break;
        }
        assert_int_equal(st, KVT_ERR_NOMEM);
        assert_null(pool);
        failures++;
    }
    assert_true(failures >= 5);
}

/* ---- threads ----------------------------------------------------------------- */

struct thr_arg {
    kvt_pool_t *pool;
    int iters;
    int errors;
};

static void *thr_body(void *a)
{
    struct thr_arg *t = a;
    kvt_page_t pages[4];
    for (int i = 0; i < t->iters; i++) {
        uint32_t n = 0;
        if (kvt_pool_alloc(t->pool, 4, KVT_ALLOC_PARTIAL, pages, NULL, &n) != KVT_OK) {
            t->errors++;
            continue;
        }
        if (kvt_pool_pin(t->pool, pages, n) != KVT_OK)
            t->errors++;
        if (kvt_pool_free(t->pool, pages, n) != KVT_OK)
            t->errors++;
        if (kvt_pool_unpin(t->pool, pages, n) != KVT_OK)
            t->errors++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    kvt_pool_t *pool = make_pool(64, 32, 2, KVT_MEM_HOST);
    pthread_t th[4];
    struct thr_arg args[4];
    kvt_pool_stats_t st;

    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){pool, 20000, 0};
        pthread_create(&th[i], NULL, thr_body, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    kvt_pool_stats(pool, &st);
    assert_int_equal(st.free_pages, 32);
    assert_int_equal(st.pinned_pages, 0);
    assert_int_equal(st.double_free_total, 0);
    kvt_pool_destroy(pool);
}

static void test_status_strings(void **state)
{
    assert_string_equal(kvt_strerror(KVT_OK), "success");
    assert_string_equal(kvt_status_name(KVT_ERR_NOSPACE), "KVT_ERR_NOSPACE");
    assert_string_equal(kvt_status_name(KVT_INPROGRESS), "KVT_INPROGRESS");
    assert_string_equal(kvt_strerror((kvt_status_t)-999), "unknown status");
    assert_string_equal(kvt_strerror((kvt_status_t)5), "unknown status");
    for (int s = 0; s > KVT_ERR_LAST; s--) {
        assert_non_null(kvt_strerror((kvt_status_t)s));
        assert_string_not_equal(kvt_status_name((kvt_status_t)s), "KVT_UNKNOWN");
    }
    /* the wrapper's fault injection */
    kvt_alloc_fail_at(2, 0);
    {
        void *a = kvt_malloc(8), *b = kvt_malloc(8), *c = kvt_malloc(8);
        assert_non_null(a);
        assert_null(b);
        assert_non_null(c);
        kvt_free(a);
        kvt_free(c);
    }
    kvt_alloc_fail_at(1, 1);
    assert_null(kvt_strdup("x"));
    assert_null(kvt_calloc(1, 1));
    kvt_alloc_fail_at(0, 0);
    {
        char *s = kvt_strndup("abcdef", 3);
        assert_string_equal(s, "abc");
        kvt_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_uuid),
        cmocka_unit_test(test_alloc_free_ref_pin),
        cmocka_unit_test(test_double_free_detected),
        cmocka_unit_test(test_partial_alloc_bitmap),
        cmocka_unit_test(test_too_large_fails_fast),
        cmocka_unit_test(test_keep_free),
        cmocka_unit_test(test_bounds_checked_refs),
        cmocka_unit_test(test_registration_hooks),
        cmocka_unit_test(test_external_memory_and_fixed_uuid),
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_cpu_offload_copy),
        cmocka_unit_test(test_offload_page_size_mismatch),
        cmocka_unit_test(test_alloc_failure_injection),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_status_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
