/*
 * test_prefix_cache.c -- chained block hashing, hash -> page map, LRU
 * eviction order, pinned / locked pages never evicted, lookup locks until
 * release, double release detected, speed of a 4096-token match.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "kvt/kvt_prefix_cache.h"

static kvt_prefix_cache_t *make_cache(uint32_t npages, uint32_t bs)
{
    kvt_prefix_cache_params_t p = {npages, bs, 0x1234};
    kvt_prefix_cache_t *pc = NULL;
    assert_int_equal(kvt_prefix_cache_create(&p, &pc), KVT_OK);
    return pc;
}

static void fill_tokens(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i * 7u;
}

static void test_chain_hashing(void **state)
{
    uint32_t a[64], b[64];
    kvt_block_hash_t ha[4], hb[4];
    size_t na, nb;

    fill_tokens(a, 64, 100);
    memcpy(b, a, sizeof(a));
    b[40] ^= 1; /* differs in block 2 (block size 16) */

    assert_int_equal(kvt_prefix_hash_blocks(a, 64, 16, 7, ha, 4, &na), KVT_OK);
    assert_int_equal(kvt_prefix_hash_blocks(b, 64, 16, 7, hb, 4, &nb), KVT_OK);
    assert_int_equal(na, 4);
    assert_true(ha[0] == hb[0]);
    assert_true(ha[1] == hb[1]);
    assert_true(ha[2] != hb[2]);
    /* chaining: block 3 is identical but its hash differs because block 2 did */
    assert_true(ha[3] != hb[3]);

    /* the definition: xxh3(prev_le64 || tokens_le32) */
    {
        uint8_t buf[8 + 16 * 4];
        uint64_t prev = 7;
        for (int i = 0; i < 8; i++)
            buf[i] = (uint8_t)(prev >> (8 * i));
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 4; k++)
                buf[8 + 4 * i + k] = (uint8_t)(a[i] >> (8 * k));
        assert_true(XXH3_64bits(buf, sizeof(buf)) == ha[0]);
        prev = ha[0];
        for (int i = 0; i < 8; i++)
            buf[i] = (uint8_t)(prev >> (8 * i));
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 4; k++)
                buf[8 + 4 * i + k] = (uint8_t)(a[16 + i] >> (8 * k));
        assert_true(XXH3_64bits(buf, sizeof(buf)) == ha[1]);
    }
    /* seed matters; partial tail blocks are not hashed; max_out bounds */
    assert_int_equal(kvt_prefix_hash_blocks(a, 64, 16, 8, hb, 4, &nb), KVT_OK);
    assert_true(ha[0] != hb[0]);
    assert_int_equal(kvt_prefix_hash_blocks(a, 63, 16, 7, hb, 4, &nb), KVT_OK);
    assert_int_equal(nb, 3);
    assert_int_equal(kvt_prefix_hash_blocks(a, 64, 16, 7, hb, 2, &nb), KVT_OK);
    assert_int_equal(nb, 2);
    assert_int_equal(kvt_prefix_hash_blocks(a, 64, 0, 7, hb, 2, &nb), KVT_ERR_INVALID);
    assert_int_equal(kvt_prefix_hash_blocks(a, 64, KVT_PREFIX_MAX_BLOCK + 1, 7, hb, 2, &nb),
                     KVT_ERR_INVALID);
}

static void test_large_block_streamed_equals_definition(void **state)
{
    static uint32_t t[1000];
    static uint8_t buf[8 + 1000 * 4];
    kvt_block_hash_t h;

    fill_tokens(t, 1000, 3);
    h = kvt_prefix_hash_next(99, t, 1000);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(99ull >> (8 * i));
    memcpy(buf + 8, t, sizeof(t)); /* little-endian host */
    assert_true(XXH3_64bits(buf, sizeof(buf)) == h);
}

/* Store n blocks of <tokens> as a request would, then release them. */
static void store_prefix(kvt_prefix_cache_t *pc, const uint32_t *tokens, size_t ntok,
                         uint32_t *pages_out)
{
    kvt_block_hash_t h[64];
    size_t nh;
    uint32_t bs = kvt_prefix_cache_block_size(pc);

    assert_int_equal(kvt_prefix_hash_blocks(tokens, ntok, bs, 0x1234, h, 64, &nh), KVT_OK);
    assert_int_equal(kvt_prefix_cache_alloc(pc, (uint32_t)nh, pages_out), KVT_OK);
    for (size_t i = 0; i < nh; i++)
        assert_int_equal(kvt_prefix_cache_insert(pc, pages_out[i], h[i], NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_release(pc, pages_out, (uint32_t)nh), KVT_OK);
}

static void test_lookup_locks_until_release(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(8, 4);
    uint32_t toks[16], pages[4], got[4];
    size_t nm, mt;
    uint32_t ref;
    kvt_prefix_cache_stats_t st;

    fill_tokens(toks, 16, 1);
    store_prefix(pc, toks, 12, pages); /* 3 blocks cached */
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.cached_pages, 3);
    assert_int_equal(st.free_pages, 8);

    /* a longer prompt sharing the 12-token prefix matches 3 blocks */
    assert_int_equal(kvt_prefix_cache_match(pc, toks, 16, got, &nm, &mt), KVT_OK);
    assert_int_equal(nm, 3);
    assert_int_equal(mt, 12);
    assert_memory_equal(got, pages, 3 * sizeof(uint32_t));
    kvt_prefix_cache_page_info(pc, got[0], &ref, NULL, NULL);
    assert_int_equal(ref, 1);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.free_pages, 5);
    assert_int_equal(st.queries, 4);
    assert_int_equal(st.hits, 3);

    /* while locked, allocating everything else cannot evict them */
    {
        uint32_t more[6];
        assert_int_equal(kvt_prefix_cache_alloc(pc, 6, more), KVT_ERR_NOSPACE);
        assert_int_equal(kvt_prefix_cache_alloc(pc, 5, more), KVT_OK);
        assert_int_equal(kvt_prefix_cache_match(pc, toks, 12, got + 0, &nm, NULL), KVT_OK);
        assert_int_equal(nm, 3); /* still cached */
        assert_int_equal(kvt_prefix_cache_release(pc, got, 3), KVT_OK);
        assert_int_equal(kvt_prefix_cache_release(pc, more, 5), KVT_OK);
    }
    assert_int_equal(kvt_prefix_cache_release(pc, pages, 3), KVT_OK);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.free_pages, 8);

    /* a prompt diverging in block 1 matches only block 0 */
    toks[5] += 1;
    assert_int_equal(kvt_prefix_cache_match(pc, toks, 16, got, &nm, &mt), KVT_OK);
    assert_int_equal(nm, 1);
    assert_int_equal(mt, 4);
    assert_int_equal(kvt_prefix_cache_release(pc, got, 1), KVT_OK);
    /* double release is detected */
    assert_int_equal(kvt_prefix_cache_release(pc, got, 1), KVT_ERR_DOUBLE_FREE);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.double_free_total, 1);
    assert_int_equal(st.free_pages, 8);
    kvt_prefix_cache_destroy(pc);
}

static void test_lru_eviction_order(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(4, 2);
    uint32_t p[4], q[2], got[4];
    kvt_block_hash_t h[4] = {11, 22, 33, 44};
    size_t nm;
    kvt_prefix_cache_stats_t st;
    int has;

    /* pages 0..3 each cache one hash; released in order 2, 0, 3, 1 */
    assert_int_equal(kvt_prefix_cache_alloc(pc, 4, p), KVT_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvt_prefix_cache_insert(pc, p[i], h[i], NULL), KVT_OK);
    {
        uint32_t order[4] = {p[2], p[0], p[3], p[1]};
        assert_int_equal(kvt_prefix_cache_release(pc, order, 4), KVT_OK);
    }
    /* touching page 2 (a hit) moves it out of the queue; releasing it makes it newest */
    assert_int_equal(kvt_prefix_cache_lookup(pc, &h[2], 1, got, &nm), KVT_OK);
    assert_int_equal(nm, 1);
    assert_int_equal(got[0], p[2]);
    assert_int_equal(kvt_prefix_cache_release(pc, got, 1), KVT_OK);
    /* queue now: 0, 3, 1, 2 -> two allocations evict 0 then 3 */
    assert_int_equal(kvt_prefix_cache_alloc(pc, 2, q), KVT_OK);
    assert_int_equal(q[0], p[0]);
    assert_int_equal(q[1], p[3]);
    kvt_prefix_cache_page_info(pc, p[0], NULL, &has, NULL);
    assert_false(has);
    assert_int_equal(kvt_prefix_cache_lookup(pc, &h[0], 1, got, &nm), KVT_OK);
    assert_int_equal(nm, 0);
    assert_int_equal(kvt_prefix_cache_lookup(pc, &h[1], 1, got, &nm), KVT_OK);
    assert_int_equal(nm, 1);
    assert_int_equal(kvt_prefix_cache_release(pc, got, 1), KVT_OK);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.cached_pages, 2);
    assert_int_equal(kvt_prefix_cache_release(pc, q, 2), KVT_OK);
    kvt_prefix_cache_destroy(pc);
}

/* peek finds a cached page without a reference and without refreshing its
 * place in the LRU queue (a lookup would make it the newest) */
static void test_peek_leaves_lru_order(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(2, 2);
    uint32_t p[2], q, page = 99, ref = 7;
    kvt_block_hash_t h[2] = {5, 6};

    assert_int_equal(kvt_prefix_cache_alloc(pc, 2, p), KVT_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvt_prefix_cache_insert(pc, p[i], h[i], NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_release(pc, p, 2), KVT_OK); /* queue: p0, p1 */
    assert_int_equal(kvt_prefix_cache_peek(pc, h[0], &page), KVT_OK);
    assert_int_equal(page, p[0]);
    kvt_prefix_cache_page_info(pc, p[0], &ref, NULL, NULL);
    assert_int_equal(ref, 0);
    assert_int_equal(kvt_prefix_cache_peek(pc, 77, &page), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_prefix_cache_peek(NULL, 5, &page), KVT_ERR_INVALID);
    /* p0 is still the oldest: the next allocation evicts it */
    assert_int_equal(kvt_prefix_cache_alloc(pc, 1, &q), KVT_OK);
    assert_int_equal(q, p[0]);
    assert_int_equal(kvt_prefix_cache_peek(pc, h[0], NULL), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_prefix_cache_peek(pc, h[1], NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_release(pc, &q, 1), KVT_OK);
    kvt_prefix_cache_destroy(pc);
}

/* forget drops a page's hash, not its references; the hash may be cached again */
static void test_forget(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(2, 2);
    uint32_t p, got, ref = 0;
    kvt_block_hash_t h = 42;
    size_t nm = 9;
    kvt_prefix_cache_stats_t st;

    assert_int_equal(kvt_prefix_cache_alloc(pc, 1, &p), KVT_OK);
    assert_int_equal(kvt_prefix_cache_insert(pc, p, h, NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_forget(pc, p), KVT_OK);
    assert_int_equal(kvt_prefix_cache_peek(pc, h, NULL), KVT_ERR_NOT_FOUND);
    kvt_prefix_cache_page_info(pc, p, &ref, NULL, NULL);
    assert_int_equal(ref, 1);
    assert_int_equal(kvt_prefix_cache_lookup(pc, &h, 1, &got, &nm), KVT_OK);
    assert_int_equal(nm, 0);
    assert_int_equal(kvt_prefix_cache_forget(pc, p), KVT_OK); /* nothing left to drop */
    assert_int_equal(kvt_prefix_cache_forget(pc, 2), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_prefix_cache_forget(NULL, 0), KVT_ERR_INVALID);
    assert_int_equal(kvt_prefix_cache_insert(pc, p, h, NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_peek(pc, h, &got), KVT_OK);
    assert_int_equal(got, p);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.cached_pages, 1);
    assert_int_equal(kvt_prefix_cache_release(pc, &p, 1), KVT_OK);
    kvt_prefix_cache_destroy(pc);
}

static void test_pinned_never_evicted(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(3, 1);
    uint32_t p[3], q[3], got[1];
    kvt_block_hash_t h = 777;
    size_t nm;
    kvt_prefix_cache_stats_t st;

    assert_int_equal(kvt_prefix_cache_alloc(pc, 1, p), KVT_OK);
    assert_int_equal(kvt_prefix_cache_insert(pc, p[0], h, NULL), KVT_OK);
    /* pinned for a transfer, then its owner lets go: it stays out of the LRU */
    assert_int_equal(kvt_prefix_cache_pin(pc, p, 1), KVT_OK);
    assert_int_equal(kvt_prefix_cache_release(pc, p, 1), KVT_OK);
    /* releasing again would steal the pin's ref: refused */
    assert_int_equal(kvt_prefix_cache_release(pc, p, 1), KVT_ERR_DOUBLE_FREE);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.pinned_pages, 1);
    assert_int_equal(st.free_pages, 2);
    /* churn through every other page many times */
    for (int i = 0; i < 50; i++) {
        assert_int_equal(kvt_prefix_cache_alloc(pc, 2, q), KVT_OK);
        assert_true(q[0] != p[0] && q[1] != p[0]);
        assert_int_equal(kvt_prefix_cache_alloc(pc, 1, q + 2), KVT_ERR_NOSPACE);
        assert_int_equal(kvt_prefix_cache_release(pc, q, 2), KVT_OK);
    }
    assert_int_equal(kvt_prefix_cache_lookup(pc, &h, 1, got, &nm), KVT_OK);
    assert_int_equal(nm, 1);
    assert_int_equal(kvt_prefix_cache_release(pc, got, 1), KVT_OK);
    assert_int_equal(kvt_prefix_cache_unpin(pc, p, 1), KVT_OK);
    assert_int_equal(kvt_prefix_cache_unpin(pc, p, 1), KVT_ERR_UNDERFLOW);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.pinned_pages, 0);
    assert_int_equal(st.free_pages, 3);
    /* now it is the newest free page: evicted last */
    assert_int_equal(kvt_prefix_cache_alloc(pc, 3, q), KVT_OK);
    assert_int_equal(q[2], p[0]);
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.cached_pages, 0);
    kvt_prefix_cache_destroy(pc);
}

static void test_insert_rules(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(4, 1);
    uint32_t p[2], existing = 99;
    uint32_t one = 3;
    kvt_block_hash_t hh;
    int has;

    assert_int_equal(kvt_prefix_cache_alloc(pc, 2, p), KVT_OK);
    assert_int_equal(kvt_prefix_cache_insert(pc, p[0], 5, NULL), KVT_OK);
    assert_int_equal(kvt_prefix_cache_insert(pc, p[0], 5, NULL), KVT_OK); /* same page: no-op */
    assert_int_equal(kvt_prefix_cache_insert(pc, p[1], 5, &existing), KVT_ERR_EXISTS);
    assert_int_equal(existing, p[0]);
    /* re-stamp a page with another hash: the old mapping disappears */
    assert_int_equal(kvt_prefix_cache_insert(pc, p[0], 6, NULL), KVT_OK);
    kvt_prefix_cache_page_info(pc, p[0], NULL, &has, &hh);
    assert_true(has && hh == 6);
    assert_int_equal(kvt_prefix_cache_insert(pc, p[1], 5, NULL), KVT_OK);
    /* a free page cannot be stamped; out of range is refused */
    assert_int_equal(kvt_prefix_cache_insert(pc, one, 9, NULL), KVT_ERR_STATE);
    assert_int_equal(kvt_prefix_cache_insert(pc, 4, 9, NULL), KVT_ERR_BOUNDS);
    assert_int_equal(kvt_prefix_cache_alloc(pc, 5, p), KVT_ERR_TOO_LARGE);
    assert_int_equal(kvt_prefix_cache_release(pc, p, 2), KVT_OK);
    kvt_prefix_cache_destroy(pc);
}

/* Many inserts/evictions through the open-addressing map stay consistent. */
static void test_map_churn(void **state)
{
    enum { N = 64 };
    kvt_prefix_cache_t *pc = make_cache(N, 1);
    uint64_t x = 88172645463325252ull;
    kvt_block_hash_t held[N];
    int valid[N] = {0};

    for (int it = 0; it < 20000; it++) {
        uint32_t p;
        kvt_block_hash_t h;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        h = x & 0x3ff; /* small hash space: collisions and clustering */
        assert_int_equal(kvt_prefix_cache_alloc(pc, 1, &p), KVT_OK);
        if (kvt_prefix_cache_insert(pc, p, h, NULL) == KVT_OK) {
            held[p] = h;
            valid[p] = 1;
        } else {
            valid[p] = 0;
        }
        assert_int_equal(kvt_prefix_cache_release(pc, &p, 1), KVT_OK);
        /* alloc evicts whatever the page held before: rebuild expectations */
        for (uint32_t q = 0; q < N; q++) {
            int has;
            kvt_block_hash_t hh;
            kvt_prefix_cache_page_info(pc, q, NULL, &has, &hh);
            if (q == p)
                assert_int_equal(has, valid[p]);
            valid[q] = has;
            if (has) {
                uint32_t got;
                size_t nm;
                held[q] = hh;
                assert_int_equal(kvt_prefix_cache_lookup(pc, &hh, 1, &got, &nm), KVT_OK);
                assert_int_equal(nm, 1);
                assert_int_equal(got, q);
                kvt_prefix_cache_release(pc, &got, 1);
            }
        }
    }
    (void)held;
    kvt_prefix_cache_destroy(pc);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_match_4096_tokens(void **state)
{
    enum { NT = 4096, BS = 16, ITERS = 2000 };
    kvt_prefix_cache_t *pc = make_cache(1024, BS);
    static uint32_t toks[NT], pages[NT / BS], got[NT / BS];
    size_t nm, mt;
    double t0, per_us;

    fill_tokens(toks, NT, 5);

    {
        kvt_block_hash_t h[NT / BS];
        size_t nh;
        assert_int_equal(kvt_prefix_hash_blocks(toks, NT, BS, 0x1234, h, NT / BS, &nh), KVT_OK);
        assert_int_equal(kvt_prefix_cache_alloc(pc, (uint32_t)nh, pages), KVT_OK);
        for (size_t i = 0; i < nh; i++)
            kvt_prefix_cache_insert(pc, pages[i], h[i], NULL);
        kvt_prefix_cache_release(pc, pages, (uint32_t)nh);
    }
    t0 = now_s();
    for (int i = 0; i < ITERS; i++) {
        kvt_prefix_cache_match(pc, toks, NT, got, &nm, &mt);
        kvt_prefix_cache_release(pc, got, (uint32_t)nm);
    }
    per_us = (now_s() - t0) / ITERS * 1e6;
    assert_int_equal(mt, NT);
    /* Informational only: speed is a benchmark's business (sched-pick), not a test's. */
    printf("prefix cache: 4096-token prompt hashed+matched+released in %.2f us (block %d)\n",
           per_us, BS);
    kvt_prefix_cache_destroy(pc);
}

struct pc_thr {
    kvt_prefix_cache_t *pc;
    uint32_t base;
    int errors;
};

static void *pc_thr_body(void *arg)
{
    struct pc_thr *t = arg;
    uint32_t toks[64], pages[16], got[16];
    kvt_block_hash_t h[16];
    size_t nh, nm;

    for (int it = 0; it < 3000; it++) {
        /* a few distinct prompts per thread, shared prefixes across threads */
        fill_tokens(toks, 64, (uint32_t)(it % 5) + (t->base & 1));
        if (kvt_prefix_cache_match(t->pc, toks, 64, got, &nm, NULL) != KVT_OK)
            t->errors++;
        if (nm < 16) {
            kvt_prefix_hash_blocks(toks, 64, 4, 0x1234, h, 16, &nh);
            if (kvt_prefix_cache_alloc(t->pc, (uint32_t)(nh - nm), pages) == KVT_OK) {
                for (size_t i = nm; i < nh; i++)
                    kvt_prefix_cache_insert(t->pc, pages[i - nm], h[i], NULL);
                if (kvt_prefix_cache_pin(t->pc, pages, (uint32_t)(nh - nm)) != KVT_OK ||
                    kvt_prefix_cache_release(t->pc, pages, (uint32_t)(nh - nm)) != KVT_OK ||
                    kvt_prefix_cache_unpin(t->pc, pages, (uint32_t)(nh - nm)) != KVT_OK)
                    t->errors++;
            }
        }
        if (kvt_prefix_cache_release(t->pc, got, (uint32_t)nm) != KVT_OK)
            t->errors++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    kvt_prefix_cache_t *pc = make_cache(48, 4);
    pthread_t th[4];
    struct pc_thr a[4];
    kvt_prefix_cache_stats_t st;

    for (int i = 0; i < 4; i++) {
        a[i] = (struct pc_thr){pc, (uint32_t)i, 0};
        pthread_create(&th[i], NULL, pc_thr_body, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].errors, 0);
    }
    kvt_prefix_cache_stats(pc, &st);
    assert_int_equal(st.free_pages, 48);
    assert_int_equal(st.pinned_pages, 0);
    assert_int_equal(st.double_free_total, 0);
    assert_true(st.hits > 0);
    kvt_prefix_cache_destroy(pc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_hashing),
        cmocka_unit_test(test_large_block_streamed_equals_definition),
        cmocka_unit_test(test_lookup_locks_until_release),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_peek_leaves_lru_order),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_pinned_never_evicted),
        cmocka_unit_test(test_insert_rules),
        cmocka_unit_test(test_map_churn),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_match_4096_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
