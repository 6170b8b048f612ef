/*
 * pdgw-sim's CPU offload tier on libkvt's prefix cache, after vLLM's
 * SimpleCPUOffloadConnector scheduler (vllm-project/vllm
 * vllm/v1/simple_kv_offload/manager.py): a finished prefill's blocks are
 * stored, a later prompt loads the consecutive blocks after its GPU hits
 * (the last prompt token is never a hit), pages a load holds are never
 * evicted, unreferenced pages leave in LRU order, and a load returns the
 * bytes stored (a page that does not hold them ends the hit and leaves the
 * tier until stored again).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_int.h"

sim_counters_t sim_ctr; /* sim_metrics.c is not linked here */

#define LD(x) ((unsigned long long)atomic_load(&(x)))

static int start(int argc, char **argv)
{
    memset(&sim_ctr, 0, sizeof(sim_ctr));
    if (sim_config_parse(argc, argv, &sim_cfg))
        return -1;
    return sim_cpu_tier_init();
}

/* 4-token blocks of 8 bytes a token (32-byte pages), a tier of 4 blocks */
static int setup(void **state)
{
    char *argv[] = {"pdgw-sim", "--block-size",
                    "4",        "--kv-bytes-per-token",
                    "8",        "--layers",
                    "1",        "--kv-offloading-blocks",
                    "4",        NULL};
    (void)state;
    return start(9, argv);
}

static int teardown(void **state)
{
    (void)state;
    sim_cpu_tier_fini();
    return 0;
}

static sim_tokens_t toks(uint32_t start_id, size_t n)
{
    sim_tokens_t t = {0};
    for (size_t i = 0; i < n; i++)
        sim_tokens_push(&t, start_id + (uint32_t)i);
    return t;
}

static sim_req_t req_of(const sim_tokens_t *p, size_t gpu_hit_tokens)
{
    sim_req_t r;
    memset(&r, 0, sizeof(r));
    r.prompt = *p;
    r.cached_tokens = gpu_hit_tokens;
    return r;
}

static uint32_t in_use(void)
{
    sim_cpu_tier_stats_t st;
    sim_cpu_tier_stats(&st);
    return st.blocks - st.free_blocks;
}

/* What a block holds, by the tier's definition: word at byte offset off is
 * XXH64(off, seed = block hash). */
static void expected(uint64_t hash, uint8_t *out, size_t n)
{
    for (size_t off = 0; off < n; off += 8) {
        uint64_t w = XXH64(&off, sizeof(off), hash);
        memcpy(out + off, &w, n - off < 8 ? n - off : 8);
    }
}

static void test_store_then_load_bytes(void **state)
{
    sim_tokens_t a = toks(1, 13); /* 3 full blocks + 1 token */
    uint64_t h[3];
    uint8_t want[32];
    (void)state;
    assert_true(sim_cpu_tier_enabled());
    assert_int_equal(sim_cpu_tier_page_bytes(), 32);
    sim_cpu_tier_store_locked(&a);
    assert_int_equal(LD(sim_ctr.offload_stored), 3);
    assert_int_equal(in_use(), 0); /* stored pages wait unreferenced */

    sim_req_t r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 12);
    assert_int_equal(r.cpu_hit_tokens, 12);
    assert_int_equal(r.n_cpu_pages, 3);
    assert_int_equal(in_use(), 3); /* held while the load runs */
    assert_int_equal(sim_blocks_hashes(&a, 3, h), 3);
    for (int i = 0; i < 3; i++) {
        expected(h[i], want, sizeof(want));
        assert_memory_equal(sim_cpu_tier_page(r.cpu_pages[i]), want, sizeof(want));
    }
    sim_cpu_tier_release_locked(&r);
    assert_null(r.cpu_pages);
    assert_int_equal(in_use(), 0);
    assert_int_equal(LD(sim_ctr.external_queries), 13);
    assert_int_equal(LD(sim_ctr.external_hits), 12);
    assert_int_equal(LD(sim_ctr.offload_loaded), 3);

    /* storing the same prompt again copies nothing */
    sim_cpu_tier_store_locked(&a);
    assert_int_equal(LD(sim_ctr.offload_stored), 3);
    sim_tokens_free(&a);
}

static void test_after_gpu_hits_and_last_token(void **state)
{
    sim_tokens_t a = toks(1, 12); /* exactly 3 blocks: the last one holds the last token */
    (void)state;
    sim_cpu_tier_store_locked(&a);
    sim_req_t r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 8); /* blocks 0-1: token 12 is computed */
    sim_cpu_tier_release_locked(&r);
    /* one GPU hit: the tier supplies what follows it */
    r = req_of(&a, 4);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 4);
    assert_int_equal(r.n_cpu_pages, 1);
    sim_cpu_tier_release_locked(&r);
    /* a different first block: nothing, even though later tokens match */
    a.ids[0] = 999;
    r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 0);
    assert_null(r.cpu_pages);
    sim_tokens_free(&a);
}

static void test_lru_of_unreferenced(void **state)
{
    sim_tokens_t a = toks(1, 13), c = toks(100, 5), b = toks(200, 9), c2 = toks(100, 9);
    (void)state;
    sim_cpu_tier_store_locked(&a); /* a0 a1 a2 */
    sim_cpu_tier_store_locked(&c); /* c0: the tier is full */
    assert_int_equal(LD(sim_ctr.offload_evicted), 0);
    /* A is used again: its pages become the most recent, c0 the oldest */
    sim_req_t r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 12);
    sim_cpu_tier_release_locked(&r);
    sim_cpu_tier_store_locked(&b); /* b0 b1 evict c0, then a0 */
    assert_int_equal(LD(sim_ctr.offload_evicted), 2);
    r = req_of(&c2, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 0);
    r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 0); /* its first block is gone */
    r = req_of(&b, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 8);
    sim_cpu_tier_release_locked(&r);
    sim_tokens_free(&a);
    sim_tokens_free(&b);
    sim_tokens_free(&c);
    sim_tokens_free(&c2);
}

static void test_in_use_not_evicted(void **state)
{
    sim_tokens_t a = toks(1, 13), b = toks(200, 13);
    (void)state;
    sim_cpu_tier_store_locked(&a);
    sim_req_t ra = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&ra), 12); /* A's load in flight */
    /* B needs 3 pages; only 1 is free and A's are held: b0 only */
    sim_cpu_tier_store_locked(&b);
    assert_int_equal(LD(sim_ctr.offload_stored), 4);
    assert_int_equal(LD(sim_ctr.offload_no_space), 2);
    assert_int_equal(LD(sim_ctr.offload_evicted), 0);
    sim_cpu_tier_release_locked(&ra);
    ra = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&ra), 12); /* A survived */
    sim_cpu_tier_release_locked(&ra);
    sim_req_t rb = req_of(&b, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&rb), 4);
    sim_cpu_tier_release_locked(&rb);
    sim_tokens_free(&a);
    sim_tokens_free(&b);
}

static void test_wrong_bytes_end_the_hit(void **state)
{
    sim_tokens_t a = toks(1, 13);
    (void)state;
    sim_cpu_tier_store_locked(&a);
    sim_req_t r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 12);
    uint8_t *p1 = sim_cpu_tier_page(r.cpu_pages[1]);
    sim_cpu_tier_release_locked(&r);
    p1[5] ^= 0x40;
    r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 4); /* block 0 only */
    assert_int_equal(LD(sim_ctr.offload_verify_failures), 1);
    assert_int_equal(in_use(), 1); /* the pages not used were let go */
    sim_cpu_tier_release_locked(&r);
    assert_int_equal(in_use(), 0);
    /* the bad block left the tier: the prefill's store puts it back, whole again */
    sim_cpu_tier_store_locked(&a);
    assert_int_equal(LD(sim_ctr.offload_stored), 4);
    r = req_of(&a, 0);
    assert_int_equal(sim_cpu_tier_load_locked(&r), 12);
    assert_int_equal(LD(sim_ctr.offload_verify_failures), 1);
    sim_cpu_tier_release_locked(&r);
    sim_tokens_free(&a);
}

static void test_config(void **state)
{
    (void)state;
    sim_cpu_tier_fini();
    {
        char *argv[] = {"pdgw-sim", NULL};
        assert_int_equal(start(1, argv), 0);
        assert_false(sim_cpu_tier_enabled());
        sim_tokens_t a = toks(1, 13);
        sim_req_t r = req_of(&a, 0);
        assert_int_equal(sim_cpu_tier_load_locked(&r), 0);
        sim_cpu_tier_store_locked(&a);
        assert_int_equal(LD(sim_ctr.external_queries), 0);
        sim_tokens_free(&a);
    }
    {
        /* vLLM's option: GiB over block bytes (16 tokens x 1024 bytes) */
        char *argv[] = {
            "pdgw-sim", "--kv-offloading-size", "0.001", "--kv-offloading-backend", "native", NULL};
        sim_cpu_tier_stats_t st;
        assert_int_equal(start(5, argv), 0);
        sim_cpu_tier_stats(&st);
        assert_int_equal(st.blocks, 65);
        sim_cpu_tier_fini();
    }
    {
        /* more blocks than the tier's bound: refused at start, not half built */
        char *argv[] = {"pdgw-sim", "--kv-offloading-size", "65536", NULL};
        assert_int_equal(start(3, argv), -1);
        assert_false(sim_cpu_tier_enabled());
    }
    {
        char *argv[] = {"pdgw-sim", "--kv-offloading-blocks", "8", "--no-prefix-cache", NULL};
        assert_int_equal(start(4, argv), 0);
        assert_false(sim_cpu_tier_enabled()); /* as vLLM: needs prefix caching */
    }
    {
        char *argv[] = {"pdgw-sim", "--kv-offloading-backend", "lmcache", NULL};
        assert_int_equal(sim_config_parse(3, argv, &sim_cfg), -1);
    }
    {
        char *argv[] = {"pdgw-sim", "--kv-offloading-load-cost", "1.5", NULL};
        assert_int_equal(sim_config_parse(3, argv, &sim_cfg), -1);
    }
    {
        char *argv[] = {"pdgw-sim", "--kv-offloading-blocks", "-1", NULL};
        assert_int_equal(sim_config_parse(3, argv, &sim_cfg), -1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_store_then_load_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_after_gpu_hits_and_last_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lru_of_unreferenced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_use_not_evicted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_bytes_end_the_hit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
