/* pdgw-sim KV page naming and content, in LMCache's terms: a page is one
 * KV_2LTD chunk [2, layers, tokens, hidden] (LMCache lmcache/v1/
 * gpu_connector.py get_shape) and keys are CacheEngineKey strings
 * model@world_size@worker_id@chunk_hash_hex@dtype[@layer] (lmcache/utils.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "sim_pd_int.h"

static int setup(void **state)
{
    char *argv[] = {"pdgw-sim", "--block-size",         "4",  "--layers",
                    "2",        "--kv-bytes-per-token", "64", NULL};
    return sim_config_parse(7, argv, &sim_cfg);
}

static void test_geometry(void **state)
{
    sim_kv_geom_t g;
    assert_int_equal(sim_kv_geom_init(&g, 1), 0);
    assert_int_equal(g.tok_bytes, 32);
    assert_int_equal(g.hidden, 8);
    assert_int_equal(g.page_bytes, 256); /* 2 x 2 layers x 4 tokens x 8 x bf16 */
    assert_int_equal(sim_kv_geom_init(&g, 2), 0);
    assert_int_equal(g.tok_bytes, 16);
    assert_int_equal(sim_kv_geom_init(&g, 3), -1); /* 32 bytes do not split in 3 */
    assert_int_equal(sim_kv_nchunks(&g, 9), 3);
    assert_int_equal(sim_kv_chunk_tokens(&g, 9, 2), 1);
    assert_int_equal(sim_kv_chunk_tokens(&g, 9, 0), 4);
}

static void test_fill_verify(void **state)
{
    sim_kv_geom_t g;
    sim_tokens_t p = {0};
    for (uint32_t i = 0; i < 9; i++)
        sim_tokens_push(&p, 1000 + i);
    sim_kv_geom_init(&g, 1);
    uint8_t a[256], b[256], scratch[256];
    size_t la = sim_kv_fill(&p, &g, 0, 1, 2, a); /* layer 1 of the short last chunk */
    assert_int_equal(la, 32);
    assert_true(sim_kv_verify(&p, &g, 0, 1, 2, a, la, scratch));
    a[7] ^= 1;
    assert_false(sim_kv_verify(&p, &g, 0, 1, 2, a, la, scratch));
    assert_false(sim_kv_verify(&p, &g, 0, 1, 2, a, la - 1, scratch));
    /* content depends on layer, rank and the tokens */
    size_t l0 = sim_kv_fill(&p, &g, 0, 0, 0, a);
    sim_kv_fill(&p, &g, 0, 1, 0, b);
    assert_memory_not_equal(a, b, l0);
    sim_kv_fill(&p, &g, 1, 0, 0, b);
    assert_memory_not_equal(a, b, l0);
    p.ids[1] = 5;
    sim_kv_fill(&p, &g, 0, 0, 0, b);
    assert_memory_not_equal(a, b, l0);
    /* a whole chunk: K of both layers, then V of both; each layer's rows
     * are that layer's own K/V rows */
    size_t lw = sim_kv_fill(&p, &g, 0, -1, 2, a);
    assert_int_equal(lw, 64);
    assert_true(sim_kv_verify(&p, &g, 0, -1, 2, a, lw, scratch));
    sim_kv_fill(&p, &g, 0, 1, 2, b);         /* [K1 row, V1 row] of the last (1-token) chunk */
    assert_memory_equal(a + 16, b, 16);      /* K of layer 1 follows K of layer 0 */
    assert_memory_equal(a + 48, b + 16, 16); /* V of layer 1 last */
    size_t lf = sim_kv_fill(&p, &g, 0, -1, 0, a);
    assert_int_equal(lf, g.page_bytes); /* a full chunk fills a page */
    sim_tokens_free(&p);
}

static void test_keys(void **state)
{
    sim_kv_geom_t g;
    sim_tokens_t p = {0}, q = {0};
    for (uint32_t i = 0; i < 9; i++) {
        sim_tokens_push(&p, i);
        sim_tokens_push(&q, i);
    }
    q.ids[5] = 77;
    sim_kv_geom_init(&g, 1);
    uint64_t hp[3], hq[3];
    sim_kv_chunk_hashes(&p, &g, hp);
    sim_kv_chunk_hashes(&q, &g, hq);
    assert_true(hp[0] == hq[0]);                   /* same first chunk */
    assert_true(hp[1] != hq[1] && hp[2] != hq[2]); /* chained */
    char k[256];
    sim_kv_key(k, sizeof(k), NULL, 2, 1, -1, 0xabcull);
    assert_string_equal(k, "sim-model@2@1@abc@bfloat16");
    sim_kv_key(k, sizeof(k), NULL, 2, 1, 3, 0xabcull); /* LayerCacheEngineKey */
    assert_string_equal(k, "sim-model@2@1@abc@bfloat16@3");
    /* a transfer-scoped key: same form, another hash per transfer */
    char k2[256];
    sim_kv_key(k, sizeof(k), "prefill-1#7", 2, 1, -1, 0xabcull);
    sim_kv_key(k2, sizeof(k2), "prefill-1#8", 2, 1, -1, 0xabcull);
    assert_string_not_equal(k, k2);
    assert_int_equal(strncmp(k, "sim-model@2@1@", 14), 0);
    sim_tokens_free(&p);
    sim_tokens_free(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_fill_verify),
        cmocka_unit_test(test_keys),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
