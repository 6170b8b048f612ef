/* Prefix-aware policy: affinity, partial matches, overload fallback, bounded LRU memory. */
#include "sched_test_util.h"

static char prompt_a[4096], prompt_b[4096];

static void make_prompts(void)
{
    for (size_t i = 0; i < sizeof(prompt_a); i++) {
        prompt_a[i] = (char)('a' + (i * 7) % 26);
        prompt_b[i] = (char)('A' + (i * 11) % 26);
    }
}

static const char *book_text(sched_pool_t *pool, const char *text, size_t len, sched_booking_t **b)
{
    sched_request_t req = {.text = text, .text_len = len, .max_tokens = 16};

    assert_int_equal(sched_book_decode(pool, &req, b), SCHED_OK);
    return sched_instance_id(sched_booking_instance(*b, SCHED_LEG_DECODE));
}

static void test_affinity_and_fallback(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_PREFIX_AWARE);
    sched_booking_t *held[3], *b = NULL;
    const char *home;
    char id[16];
    char mixed[4096];

    (void)state;
    make_prompts();
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof(id), "d%d", i);
        test_add(pool, id, 9000 + i, SCHED_ROLE_DECODE, "", 1);
    }
    home = book_text(pool, prompt_a, sizeof(prompt_a), &held[0]);
    /* the same prompt follows its prefix although home is now the busiest */
    for (int i = 1; i < 3; i++)
        assert_string_equal(book_text(pool, prompt_a, sizeof(prompt_a), &held[i]), home);
    assert_int_equal(sched_instance_inflight(test_inst(pool, home)), 3);

    /* shared first half, different second half: still home */
    memcpy(mixed, prompt_a, 2048);
    memcpy(mixed + 2048, prompt_b, 2048);
    assert_string_equal(book_text(pool, mixed, sizeof(mixed), &b), home);
    sched_booking_destroy(&b);

    /* unrelated prompt: least loaded, i.e. not home */
    assert_string_not_equal(book_text(pool, prompt_b, sizeof(prompt_b), &b), home);
    sched_booking_destroy(&b);

    /* home overloaded (beyond prefix_load_slack = 4 requests): fall back */
    test_set_inflight(pool, home, 3 + 5);
    assert_string_not_equal(book_text(pool, prompt_a, sizeof(prompt_a), &b), home);
    sched_booking_destroy(&b);
    test_set_inflight(pool, home, 3);

    /* drained home: never picked despite the match */
    assert_int_equal(sched_pool_drain(pool, home), SCHED_OK);
    assert_string_not_equal(book_text(pool, prompt_a, sizeof(prompt_a), &b), home);
    sched_booking_destroy(&b);
    for (int i = 0; i < 3; i++)
        sched_booking_destroy(&held[i]);
    sched_pool_destroy(pool);
}

static void test_token_ids(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_PREFIX_AWARE, SCHED_POLICY_LEAST_LOAD);
    uint32_t tokens[512];
    sched_request_t req = {.tokens = tokens, .n_tokens = 512};
    sched_booking_t *b1 = NULL, *b2 = NULL;

    (void)state;
    for (int i = 0; i < 512; i++)
        tokens[i] = (uint32_t)(i * 31 + 7);
    test_add(pool, "p0", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "p1", 9001, SCHED_ROLE_PREFILL, "", 1);
    assert_int_equal(sched_book_prefill(pool, &req, &b1), SCHED_OK);
    assert_int_equal(sched_book_prefill(pool, &req, &b2), SCHED_OK);
    assert_ptr_equal(sched_booking_instance(b1, SCHED_LEG_PREFILL),
                     sched_booking_instance(b2, SCHED_LEG_PREFILL));
    sched_booking_destroy(&b1);
    sched_booking_destroy(&b2);
    sched_pool_destroy(pool);
}

static void test_match_lengths(void **state)
{
    sched_prefix_index_t *idx;
    uint64_t h1[64], h2[64], uids[2];
    uint32_t toks[64 * 16];
    sched_request_t req = {.tokens = toks, .n_tokens = 64 * 16};
    size_t n;

    (void)state;
    for (size_t i = 0; i < 64 * 16; i++)
        toks[i] = (uint32_t)i;
    assert_int_equal(sched_prefix_create(1024, &idx), SCHED_OK);
    n = sched_prefix_hash_request(&req, 16, h1, 64);
    assert_int_equal(n, 64);
    /* a partial trailing block is not hashed */
    req.n_tokens = 64 * 16 - 1;
    assert_int_equal(sched_prefix_hash_request(&req, 16, h2, 64), 63);
    assert_memory_equal(h1, h2, 63 * sizeof(uint64_t));

    assert_int_equal(sched_prefix_match(idx, h1, 64, uids), 0);
    sched_prefix_record(idx, h1, 40, 7);
    assert_int_equal(sched_prefix_match(idx, h1, 64, uids), 40);
    assert_int_equal(uids[0], 7);
    assert_int_equal(uids[1], 0);
    assert_int_equal(sched_prefix_match(idx, h1, 10, uids), 10);
    sched_prefix_record(idx, h1, 64, 9);
    assert_int_equal(sched_prefix_match(idx, h1, 64, uids), 64);
    assert_int_equal(uids[0], 9);
    assert_int_equal(sched_prefix_match(idx, h1, 30, uids), 30);
    assert_int_equal(uids[0], 9);
    assert_int_equal(uids[1], 7); /* second most recent server kept */
    /* a different first token changes every chained hash */
    toks[0] = 999999;
    req.n_tokens = 64 * 16;
    sched_prefix_hash_request(&req, 16, h2, 64);
    for (int i = 0; i < 64; i++)
        assert_true(h1[i] != h2[i]);
    assert_int_equal(sched_prefix_match(idx, h2, 64, uids), 0);
    assert_int_equal(sched_prefix_size(idx), 64);
    sched_prefix_destroy(idx);
}

static void test_bounded_lru(void **state)
{
    sched_prefix_index_t *idx;
    uint64_t hashes[20000], uids[2];

    (void)state;
    assert_int_equal(sched_prefix_create(128, &idx), SCHED_OK);
    assert_int_equal(sched_prefix_capacity(idx), 128);
    for (size_t i = 0; i < 20000; i++) {
        hashes[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
        sched_prefix_record(idx, &hashes[i], 1, i + 1);
        /* the newest 128 are present, the one just evicted is gone */
        if (i % 97 == 0 || i > 19900) {
            size_t lo = i >= 127 ? i - 127 : 0;
            for (size_t k = lo; k <= i; k++) {
                assert_int_equal(sched_prefix_match(idx, &hashes[k], 1, uids), 1);
                assert_int_equal(uids[0], k + 1);
            }
            if (i >= 128)
                assert_int_equal(sched_prefix_match(idx, &hashes[i - 128], 1, uids), 0);
        }
    }
    assert_int_equal(sched_prefix_size(idx), 128);

    /* deepest blocks are evicted first: a long prompt keeps its shallow prefix */
    {
        uint64_t chain[200];
        for (int i = 0; i < 200; i++)
            chain[i] = 0xABCDEF0000ull + (uint64_t)i * 0x100000001ull;
        sched_prefix_record(idx, chain, 100, 5);
        sched_prefix_record(idx, chain + 100, 60, 6); /* unrelated, evicts 60 LRU entries */
        assert_int_equal(sched_prefix_match(idx, chain, 100, uids), 68);
        assert_int_equal(uids[0], 5);
    }
    sched_prefix_destroy(idx);
}

static void test_policy_memory_bound(void **state)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;
    sched_booking_t *b = NULL;
    char text[640];

    (void)state;
    test_config(&cfg, SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_PREFIX_AWARE);
    cfg.prefix_max_blocks = 100;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    test_add(pool, "d0", 9000, SCHED_ROLE_DECODE, "", 1);
    for (int i = 0; i < 500; i++) {
        snprintf(text, sizeof(text), "%08d", i);
        memset(text + 8, 'x', sizeof(text) - 8); /* 10 blocks of 64 bytes */
        book_text(pool, text, sizeof(text), &b);
        sched_booking_destroy(&b);
        assert_true(sched_prefix_size(pool->prefix[SCHED_RIDX_DECODE]) <= 100);
    }
    assert_int_equal(sched_prefix_size(pool->prefix[SCHED_RIDX_DECODE]), 100);
    assert_null(pool->prefix[SCHED_RIDX_PREFILL]); /* least-load keeps no index */
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affinity_and_fallback), cmocka_unit_test(test_token_ids),
        cmocka_unit_test(test_match_lengths),         cmocka_unit_test(test_bounded_lru),
        cmocka_unit_test(test_policy_memory_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
