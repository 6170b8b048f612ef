/* Policies: choice and distribution on crafted loads, filters, zone pairing. */
#include "sched_test_util.h"

#define N_PICKS 3000

/* Book decode <n> times (released at once) and count picks per id. */
static void count_decode_picks(sched_pool_t *pool, const sched_request_t *req, int n,
                               const char *const *ids, int *counts, size_t n_ids)
{
    memset(counts, 0, n_ids * sizeof(int));
    for (int i = 0; i < n; i++) {
        sched_booking_t *b = NULL;
        const char *got;
        size_t k;
        assert_int_equal(sched_book_decode(pool, req, &b), SCHED_OK);
        got = sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE));
        for (k = 0; k < n_ids; k++) {
            if (strcmp(got, ids[k]) == 0) {
                counts[k]++;
                break;
            }
        }
        assert_true(k < n_ids);
        sched_booking_destroy(&b);
        assert_null(b);
    }
}

static void test_round_robin_even(void **state)
{
    const char *ids[] = {"d0", "d1", "d2"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    sched_request_t req = {.prompt_tokens = 10, .max_tokens = 10};
    int counts[3];

    (void)state;
    for (int i = 0; i < 3; i++)
        test_add(pool, ids[i], 9000 + i, SCHED_ROLE_DECODE, "", 1);
    test_set_inflight(pool, "d0", 50); /* round-robin ignores load */
    count_decode_picks(pool, &req, 30, ids, counts, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(counts[i], 10);
    sched_pool_destroy(pool);
}

static void test_random_spread(void **state)
{
    const char *ids[] = {"d0", "d1", "d2", "d3"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_RANDOM, SCHED_POLICY_RANDOM);
    sched_request_t req = {0};
    int counts[4];

    (void)state;
    for (int i = 0; i < 4; i++)
        test_add(pool, ids[i], 9000 + i, SCHED_ROLE_DECODE, "", 1);
    count_decode_picks(pool, &req, 4000, ids, counts, 4);
    for (int i = 0; i < 4; i++) {
        assert_in_range(counts[i], 850, 1150);
    }
    sched_pool_destroy(pool);
}

static void test_least_load_choice_and_balance(void **state)
{
    const char *ids[] = {"d0", "d1", "d2"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {.prompt_tokens = 100, .max_tokens = 100};
    sched_booking_t *held[30];
    int counts[3] = {0};
    int picks[3];

    (void)state;
    for (int i = 0; i < 3; i++)
        test_add(pool, ids[i], 9000 + i, SCHED_ROLE_DECODE, "", 1);
    test_set_inflight(pool, "d0", 5);
    test_set_inflight(pool, "d1", 2);
    test_set_inflight(pool, "d2", 7);
    count_decode_picks(pool, &req, 50, ids, picks, 3);
    assert_int_equal(picks[1], 50); /* always the least loaded */

    /* Held bookings balance equal instances exactly. */
    for (int i = 0; i < 3; i++)
        test_set_inflight(pool, ids[i], 0);
    for (int i = 0; i < 30; i++) {
        assert_int_equal(sched_book_decode(pool, &req, &held[i]), SCHED_OK);
        for (int k = 0; k < 3; k++) {
            if (strcmp(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_DECODE)),
                       ids[k]) == 0)
                counts[k]++;
        }
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(counts[k], 10);
        assert_int_equal(sched_instance_inflight(test_inst(pool, ids[k])), 10);
    }
    for (int i = 0; i < 30; i++)
        sched_booking_destroy(&held[i]);
    for (int k = 0; k < 3; k++)
        assert_int_equal(sched_instance_inflight(test_inst(pool, ids[k])), 0);
    sched_pool_destroy(pool);
}

static void test_power_of_two(void **state)
{
    const char *ids[] = {"idle", "busy1", "busy2"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_POWER_OF_TWO, SCHED_POLICY_POWER_OF_TWO);
    sched_request_t req = {0};
    int counts[3];

    (void)state;
    for (int i = 0; i < 3; i++)
        test_add(pool, ids[i], 9000 + i, SCHED_ROLE_DECODE, "", 1);
    test_set_inflight(pool, "busy1", 100);
    test_set_inflight(pool, "busy2", 100);
    count_decode_picks(pool, &req, N_PICKS, ids, counts, 3);
    /* two distinct random candidates: the idle one is among them 2/3 of the time */
    assert_in_range(counts[0], N_PICKS * 2 / 3 - 200, N_PICKS * 2 / 3 + 200);
    assert_in_range(counts[1], 300, 700);
    assert_in_range(counts[2], 300, 700);
    sched_pool_destroy(pool);

    /* With two instances it always sees both: never the busy one. */
    pool = test_pool(SCHED_POLICY_POWER_OF_TWO, SCHED_POLICY_POWER_OF_TWO);
    test_add(pool, "idle", 9000, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "busy1", 9001, SCHED_ROLE_DECODE, "", 1);
    test_set_inflight(pool, "busy1", 3);
    count_decode_picks(pool, &req, 500, ids, counts, 2);
    assert_int_equal(counts[0], 500);
    sched_pool_destroy(pool);
}

static void test_weighted(void **state)
{
    const char *ids[] = {"w1", "w3"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_WEIGHTED, SCHED_POLICY_WEIGHTED);
    sched_request_t req = {0};
    int counts[2];
    sched_result_t overloaded = {.outcome = SCHED_OUTCOME_OVERLOADED, .http_status = 429};
    sched_booking_t *b = NULL;

    (void)state;
    test_add(pool, "w1", 9000, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "w3", 9001, SCHED_ROLE_DECODE, "", 3);
    count_decode_picks(pool, &req, 4000, ids, counts, 2);
    assert_in_range(counts[0], 850, 1150);
    assert_in_range(counts[1], 2850, 3150);

    /* An overload answer halves w3's effective weight: 1 : 1.5 */
    do {
        sched_booking_destroy(&b);
        assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    } while (strcmp(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "w3") != 0);
    assert_int_equal(sched_booking_finish(b, SCHED_LEG_DECODE, &overloaded), SCHED_OK);
    sched_booking_destroy(&b);
    count_decode_picks(pool, &req, 5000, ids, counts, 2);
    assert_in_range(counts[0], 1800, 2200);
    assert_in_range(counts[1], 2800, 3200);
    sched_pool_destroy(pool);
}

/* Every policy skips draining, down, open-breaker and excluded instances. */
static void test_filters_all_policies(void **state)
{
    (void)state;
    for (int p = 0; p < SCHED_POLICY_COUNT; p++) {
        const char *ids[] = {"ok", "drained", "down", "open", "excluded"};
        const char *excl[] = {"excluded"};
        sched_pool_t *pool = test_pool((sched_policy_t)p, (sched_policy_t)p);
        sched_request_t req = {.exclude_ids = excl, .n_exclude_ids = 1};
        int counts[5];

        for (int i = 0; i < 5; i++)
            test_add(pool, ids[i], 9000 + i, SCHED_ROLE_DECODE, "", 1);
        test_set_inflight(pool, "ok", 20); /* least loaded would be any other */
        assert_int_equal(sched_pool_drain(pool, "drained"), SCHED_OK);
        atomic_fetch_or(&test_inst(pool, "down")->gate, SCHED_GATE_DOWN);
        sched_gate_set_breaker(test_inst(pool, "open"), UINT32_MAX, SCHED_BREAKER_OPEN);
        atomic_store(&test_inst(pool, "open")->breaker_until_ms, test_now_ms + 60000);
        count_decode_picks(pool, &req, 200, ids, counts, 5);
        assert_int_equal(counts[0], 200);
        assert_int_equal(sched_instance_state(test_inst(pool, "drained")), SCHED_STATE_DRAINING);
        assert_int_equal(sched_instance_state(test_inst(pool, "down")), SCHED_STATE_DOWN);
        assert_int_equal(sched_pool_usable_count(pool, SCHED_ROLE_DECODE), 2);

        /* undrain brings it back */
        assert_int_equal(sched_pool_undrain(pool, "drained"), SCHED_OK);
        test_set_inflight(pool, "ok", 0);
        assert_int_equal(sched_pool_usable_count(pool, SCHED_ROLE_DECODE), 3);
        sched_pool_destroy(pool);
    }
}

static void test_no_instance(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    char *text;

    (void)state;
    test_add(pool, "p0", 9000, SCHED_ROLE_PREFILL, "", 1);
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_ERR_NO_INSTANCE);
    assert_null(b);
    assert_int_equal(sched_instance_inflight(test_inst(pool, "p0")), 0); /* reverted */
    assert_false(sched_pool_ready(pool, SCHED_ROLE_BOTH));
    assert_true(sched_pool_ready(pool, SCHED_ROLE_PREFILL));
    text = sched_metrics_text(pool);
    assert_non_null(strstr(text, "pdgw_no_instance_total{role=\"decode\"} 1\n"));
    assert_non_null(strstr(text, "pdgw_no_instance_total{role=\"prefill\"} 0\n"));
    free(text);
    sched_pool_destroy(pool);
}

static void test_zone_pairing(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {.prompt_tokens = 1, .max_tokens = 1};
    sched_booking_t *b = NULL;

    (void)state;
    test_add(pool, "p-a", 9000, SCHED_ROLE_PREFILL, "a", 1);
    test_add(pool, "d-a", 9001, SCHED_ROLE_DECODE, "a", 1);
    test_add(pool, "d-b", 9002, SCHED_ROLE_DECODE, "b", 1);
    /* close loads (one request apart): same zone wins */
    test_set_inflight(pool, "d-a", 1);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
        assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_PREFILL)), "p-a");
        assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d-a");
        assert_string_equal(
            sched_instance_label(sched_booking_instance(b, SCHED_LEG_DECODE), "zone"), "a");
        sched_booking_destroy(&b);
    }
    /* far apart: the less loaded other zone wins */
    test_set_inflight(pool, "d-a", 3);
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d-b");
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

static void test_token_accounting(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t big = {.prompt_tokens = 8192, .max_tokens = 64};
    sched_request_t small = {.prompt_tokens = 10, .max_tokens = 8000};
    sched_booking_t *b1 = NULL, *b2 = NULL, *b3 = NULL, *b4 = NULL;
    sched_instance_t *p1, *d1;

    (void)state;
    test_add(pool, "p1", 9000, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "p2", 9001, SCHED_ROLE_PREFILL, "", 1);
    test_add(pool, "d1", 9002, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "d2", 9003, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_pd(pool, &big, &b1), SCHED_OK);
    p1 = sched_booking_instance(b1, SCHED_LEG_PREFILL);
    d1 = sched_booking_instance(b1, SCHED_LEG_DECODE);
    assert_int_equal(atomic_load(&p1->prompt_tokens), 8192);
    assert_int_equal(atomic_load(&d1->kv_tokens), 8192 + 64);
    /* two small requests go to the other prefill (8k tokens in flight weigh 4 requests) */
    assert_int_equal(sched_book_prefill(pool, &small, &b2), SCHED_OK);
    assert_int_equal(sched_book_prefill(pool, &small, &b3), SCHED_OK);
    assert_ptr_not_equal(sched_booking_instance(b2, SCHED_LEG_PREFILL), p1);
    assert_ptr_not_equal(sched_booking_instance(b3, SCHED_LEG_PREFILL), p1);
    /* staged decode: d1 carries 8k projected tokens, the other is chosen */
    assert_int_equal(sched_booking_book_decode(b2), SCHED_OK);
    assert_ptr_not_equal(sched_booking_instance(b2, SCHED_LEG_DECODE), d1);
    assert_int_equal(sched_booking_book_decode(b2), SCHED_ERR_STATE); /* already booked */

    /* KV-full hint makes an idle decode unattractive */
    sched_booking_destroy(&b1);
    sched_instance_set_kv_free_chunks(d1, 0);
    assert_int_equal(sched_book_decode(pool, &small, &b4), SCHED_OK);
    assert_ptr_not_equal(sched_booking_instance(b4, SCHED_LEG_DECODE), d1);
    sched_booking_destroy(&b4);
    sched_booking_destroy(&b2);
    sched_booking_destroy(&b3);
    assert_int_equal(atomic_load(&p1->prompt_tokens), 0);
    assert_int_equal(atomic_load(&d1->kv_tokens), 0);
    sched_pool_destroy(pool);
}

static void test_both_role_serves_both_legs(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;

    (void)state;
    test_add(pool, "both", 9000, SCHED_ROLE_BOTH, "", 1);
    assert_true(sched_pool_ready(pool, SCHED_ROLE_BOTH));
    assert_int_equal(sched_book_pd(pool, &req, &b), SCHED_OK);
    assert_ptr_equal(sched_booking_instance(b, SCHED_LEG_PREFILL),
                     sched_booking_instance(b, SCHED_LEG_DECODE));
    assert_int_equal(sched_instance_inflight(test_inst(pool, "both")), 2);
    sched_booking_destroy(&b);
    assert_int_equal(sched_instance_inflight(test_inst(pool, "both")), 0);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_robin_even),
        cmocka_unit_test(test_random_spread),
        cmocka_unit_test(test_least_load_choice_and_balance),
        cmocka_unit_test(test_power_of_two),
        cmocka_unit_test(test_weighted),
        cmocka_unit_test(test_filters_all_policies),
        cmocka_unit_test(test_no_instance),
        cmocka_unit_test(test_zone_pairing),
        cmocka_unit_test(test_token_accounting),
        cmocka_unit_test(test_both_role_serves_both_legs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
