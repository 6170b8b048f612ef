/*
 * test_affinity.c - session affinity by rendezvous hashing: the same key books the same
 * instance whatever the policy says; draining that instance moves its keys only (each to
 * one stable other instance), counted as moved; undraining brings them home; a booking
 * without a key follows the policy. An instance's max_concurrent caps its open legs: a full
 * instance is skipped (by affinity too) until a leg finishes.
 */
#include "sched_test_util.h"

#define N_INST 4

static uint32_t inflight_of(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);
    uint32_t n = sched_instance_inflight(inst);
    sched_instance_unref(inst);
    return n;
}
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

static void add_capped(sched_pool_t *pool, const char *id, int port, unsigned cap)
{
    sched_instance_desc_t d;
    char url[64], err[256];
    sched_instance_desc_init(&d);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    d.id = id;
    d.url = url;
    d.role = SCHED_ROLE_DECODE;
    d.max_concurrent = cap;
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
}

static void test_capacity(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_request_t req = {0};
    sched_booking_t *b[4] = {NULL};
    const char *first;
    (void)state;
    add_capped(pool, "c0", 9100, 2);
    add_capped(pool, "c1", 9101, 1);
    req.affinity_key = "one-session";
    for (int i = 0; i < 3; i++)
        assert_int_equal(sched_book_decode(pool, &req, &b[i]), SCHED_OK);
    /* 2 + 1 legs: both full now, whatever the key prefers */
    assert_int_equal(sched_book_decode(pool, &req, &b[3]), SCHED_ERR_NO_INSTANCE);
    req.affinity_key = NULL;
    assert_int_equal(sched_book_decode(pool, &req, &b[3]), SCHED_ERR_NO_INSTANCE);
    assert_int_equal(sched_pool_usable_count(pool, SCHED_ROLE_DECODE), 2); /* up, just full */
    first = sched_instance_id(sched_booking_instance(b[0], SCHED_LEG_DECODE));
    assert_int_equal(sched_booking_finish(b[0], SCHED_LEG_DECODE, NULL), SCHED_OK);
    assert_int_equal(sched_book_decode(pool, &req, &b[3]), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b[3], SCHED_LEG_DECODE)), first);
    for (int i = 0; i < 4; i++)
        sched_booking_destroy(&b[i]);
    assert_int_equal(inflight_of(pool, "c0") + inflight_of(pool, "c1"), 0);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_key_same_instance),
        cmocka_unit_test(test_no_key_follows_policy),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
