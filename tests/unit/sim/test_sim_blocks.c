/* pdgw-sim KV capacity model and prefix cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static int setup(void **state)
{
    char *argv[] = {"pdgw-sim", "--block-size", "4", "--kv-capacity-tokens", "32", NULL};
    if (sim_config_parse(5, argv, &sim_cfg))
        return -1;
    return sim_blocks_init(sim_cfg.kv_capacity_tokens / sim_cfg.block_size);
}

static int teardown(void **state)
{
    sim_blocks_fini();
    return 0;
}

static sim_tokens_t toks(uint32_t start, size_t n)
{
    sim_tokens_t t = {0};
    for (size_t i = 0; i < n; i++)
        sim_tokens_push(&t, start + (uint32_t)i);
    return t;
}

static void test_capacity(void **state)
{
    sim_tokens_t p = toks(1, 10);
    int *b1, *b2, *b3;
    size_t n1, n2, n3, c;
    assert_int_equal(sim_blocks_total(), 8);
    assert_int_equal(sim_blocks_needed(10), 3);
    assert_int_equal(sim_blocks_alloc(&p, 14, &b1, &n1, &c), 0); /* 4 blocks */
    assert_int_equal(n1, 4);
    assert_int_equal(c, 0);
    assert_int_equal(sim_blocks_used(), 4);
    sim_tokens_t q = toks(100, 10);
    assert_int_equal(sim_blocks_alloc(&q, 16, &b2, &n2, &c), 0);
    assert_int_equal(sim_blocks_used(), 8);
    sim_tokens_t r = toks(200, 2);
    assert_int_equal(sim_blocks_alloc(&r, 2, &b3, &n3, &c), -1); /* full */
    sim_blocks_release(b1, n1);
    sim_blocks_release(b2, n2);
    free(b1);
    free(b2);
    assert_int_equal(sim_blocks_used(), 0);
    sim_tokens_free(&p);
    sim_tokens_free(&q);
    sim_tokens_free(&r);
}

static void test_prefix_hits(void **state)
{
    sim_tokens_t a = toks(1, 13); /* 3 full blocks + 1 token */
    sim_tokens_t b = toks(1, 13);
    b.ids[9] = 999; /* differs inside the third block */
    int *ba, *bb, *bc;
    size_t na, nb, nc, c;
    assert_int_equal(sim_blocks_alloc(&a, 14, &ba, &na, &c), 0);
    assert_int_equal(c, 0);
    sim_blocks_commit(&a, ba, na);
    /* the same prompt while the first one still runs: shares 3 blocks */
    assert_int_equal(sim_blocks_alloc(&a, 14, &bc, &nc, &c), 0);
    assert_int_equal(c, 12);
    assert_memory_equal(ba, bc, 3 * sizeof(int));
    assert_int_equal(sim_blocks_used(), 4 + 1);
    sim_blocks_release(bc, nc);
    free(bc);
    sim_blocks_release(ba, na);
    free(ba);
    assert_int_equal(sim_blocks_used(), 0);
    /* freed blocks keep their hashes: two blocks of b's prefix still hit */
    assert_int_equal(sim_blocks_alloc(&b, 14, &bb, &nb, &c), 0);
    assert_int_equal(c, 8);
    sim_blocks_release(bb, nb);
    free(bb);
    /* a prompt of exactly 2 blocks recomputes its last token: only 1 block hits */
    sim_tokens_t e = toks(1, 8);
    assert_int_equal(sim_blocks_alloc(&e, 9, &bb, &nb, &c), 0);
    assert_int_equal(c, 4);
    sim_blocks_release(bb, nb);
    free(bb);
    /* a full cache evicts cached blocks for new allocations */
    sim_tokens_t big = toks(5000, 32);
    assert_int_equal(sim_blocks_alloc(&big, 32, &bb, &nb, &c), 0);
    assert_int_equal(c, 0);
    sim_blocks_release(bb, nb);
    free(bb);
    assert_int_equal(sim_blocks_alloc(&a, 14, &ba, &na, &c), 0);
    assert_int_equal(c, 0); /* evicted */
    sim_blocks_release(ba, na);
    free(ba);
    sim_tokens_free(&a);
    sim_tokens_free(&b);
    sim_tokens_free(&e);
    sim_tokens_free(&big);
}

static void test_release_is_safe(void **state)
{
    sim_tokens_t a = toks(7, 3);
    int *ba;
    size_t na, c;
    assert_int_equal(sim_blocks_alloc(&a, 4, &ba, &na, &c), 0);
    sim_blocks_release(ba, na);
    sim_blocks_release(ba, na); /* double release is ignored */
    int bogus[] = {-1, 99};
    sim_blocks_release(bogus, 2);
    assert_int_equal(sim_blocks_used(), 0);
    free(ba);
    sim_tokens_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_hits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_is_safe, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
