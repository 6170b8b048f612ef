/*
 * test_affinity.c - session affinity by rendezvous hashing: the same key books the same
 * instance whatever the policy says; draining that instance moves its keys only (each to
 * one stable other instance), counted as moved; undraining brings them home; a booking
 * without a key follows the policy.
 */
#include "sched_test_util.h"

#define N_INST 4
#define N_KEYS 64

static const char *book_key(sched_pool_t *pool, const char *key)
{
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    const char *id;
    req.affinity_key = key;
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    id = sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE));
    /* ids are owned by the pool's instances, which outlive the booking here */
    sched_booking_destroy(&b);
    return id;
}

static void test_same_key_same_instance(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    const char *home[N_KEYS];
    int per[N_INST] = {0};
    char key[32];
    (void)state;
    for (int i = 0; i < N_INST; i++) {
        char id[8];
        snprintf(id, sizeof(id), "d%d", i);
        test_add(pool, id, 9000 + i, SCHED_ROLE_DECODE, "", 1);
    }
    for (int k = 0; k < N_KEYS; k++) {
        snprintf(key, sizeof(key), "session-%d", k);
        home[k] = book_key(pool, key);
        per[home[k][1] - '0']++;
        /* round-robin would rotate; the key does not */
        for (int r = 0; r < 5; r++)
            assert_string_equal(book_key(pool, key), home[k]);
    }
    for (int i = 0; i < N_INST; i++)
        assert_true(per[i] > 0); /* keys spread over every instance */
    assert_int_equal(atomic_load(&pool->affinity_moved[SCHED_RIDX_DECODE]), 0);

    /* d1 leaves: only its keys move, each to one stable other instance. */
    assert_int_equal(sched_pool_drain(pool, "d1"), SCHED_OK);
    for (int k = 0; k < N_KEYS; k++) {
        const char *now;
        snprintf(key, sizeof(key), "session-%d", k);
        now = book_key(pool, key);
        if (strcmp(home[k], "d1") == 0) {
            assert_string_not_equal(now, "d1");
            assert_string_equal(book_key(pool, key), now);
        } else {
            assert_string_equal(now, home[k]);
        }
    }
    assert_int_equal(atomic_load(&pool->affinity_moved[SCHED_RIDX_DECODE]), 2 * per[1]);
    /* d1 is back: its keys go home. */
    assert_int_equal(sched_pool_undrain(pool, "d1"), SCHED_OK);
    for (int k = 0; k < N_KEYS; k++) {
        snprintf(key, sizeof(key), "session-%d", k);
        assert_string_equal(book_key(pool, key), home[k]);
    }
    sched_pool_destroy(pool);
}

static void test_no_key_follows_policy(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    sched_request_t req = {0};
    sched_booking_t *b = NULL;
    const char *first;
    (void)state;
    test_add(pool, "d0", 9000, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "d1", 9001, SCHED_ROLE_DECODE, "", 1);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    first = sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE));
    sched_booking_destroy(&b);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_string_not_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), first);
    sched_booking_destroy(&b);
    assert_int_equal(atomic_load(&pool->affinity_home[SCHED_RIDX_DECODE]), 0);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_key_same_instance),
        cmocka_unit_test(test_no_key_follows_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
