/*
 * test_timers.c - libkvt's progress thread runs on timers, not on a poll tick.
 *
 * An idle engine does not wake at all (it used to every 20 ms); each deadline (handshake
 * timeout, a wait's timeout, a parked request's final answer, a stale record's TTL) is armed
 * as a timer and fires when a test clock reaches it, not a tick before, with the engine
 * asleep in between. The clock is the injectable one (kvt_engine_params_t.clock); tests tell
 * the engine it moved (kvt_engine_clock_moved).
 */
#include <stdatomic.h>
#include <zmq.h>

#include "test_engine_common.h"
#include "test_fake_clock.h"
#include "kvt_engine_int.h" /* the progress thread's turn counter, the request records */

static uint64_t turns(kvt_engine_t *e)
{
    return atomic_load(&e->wakeups);
}

/* Move the clock by <ns> and wait (on the turn counter, up to 5 s) until <e> has run a turn
 * that saw it. */
static void advance(kvt_engine_t *e, uint64_t ns)
{
    uint64_t t0 = turns(e), until = t_now_ms() + 5000;

    atomic_fetch_add(&fake_ns, ns);
    kvt_engine_clock_moved(e);
    while (turns(e) < t0 + 1 && t_now_ms() < until)
        usleep(1000);
    assert_true(turns(e) >= t0 + 1);
}

static kvt_engine_t *receiver(const kvt_clock_t *clock, double pending_ttl)
{
    kvt_config_t c;
    kvt_engine_t *e;
    kvt_engine_params_t ep = {.page_size = T_PAGE, .bind_host = "127.0.0.1", .clock = clock};

    t_cfg(&c, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    c.pd_pull_pending_ttl = pending_ttl;
    ep.cfg = &c;
    assert_int_equal(kvt_engine_create(&ep, &e), KVT_OK);
    return e;
}

static uint32_t records(kvt_engine_t *e)
{
    uint32_t n;
    pthread_mutex_lock(&e->rx_lock);
    n = (uint32_t)e->rreqs.count;
    pthread_mutex_unlock(&e->rx_lock);
    return n;
}

/* Wait (up to 5 s) until <e> holds <n> request records. The turn advance() waited for may
 * have read the clock just before it moved, so the sweep can come one turn later. */
static uint32_t records_reach(kvt_engine_t *e, uint32_t n)
{
    uint64_t until = t_now_ms() + 5000;

    while (records(e) != n && t_now_ms() < until)
        usleep(1000);
    return records(e);
}

/* A pair that moved data, then sits idle for a second of wall time: its progress threads
 * do not run (a 20 ms tick made about 50 turns each). */
static void test_idle_engines_sleep(void **state)
{
    t_pair_t p;
    char **keys = t_keys("idle", 2);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    uint64_t s0, r0;
    (void)state;

    assert_int_equal(t_pair_open(&p, MODE_PUSH, 8 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    id = t_store(p.s, "idle-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(t_wait(p.s, id, 10000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_submit_wait_req(p.r, "idle-1", 5000, NULL, &id), KVT_OK);
    assert_int_equal(t_wait(p.r, id, 6000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    usleep(100 * 1000); /* let the last messages settle */
    s0 = turns(p.s);
    r0 = turns(p.r);
    usleep(1000 * 1000); /* the measured idle second */
    print_message("idle second: sender %llu turns, receiver %llu turns\n",
                  (unsigned long long)(turns(p.s) - s0), (unsigned long long)(turns(p.r) - r0));
    assert_true(turns(p.s) - s0 <= 2);
    assert_true(turns(p.r) - r0 <= 2);
    kvt_release_req(p.r, "idle-1");
    t_pair_close(&p);
    t_keys_free(keys, 2);
}

/* kvt_submit_wait_req's timeout fires when the clock reaches it, not 1 ms before; until
 * then the engine sleeps (with a test clock that stands still it wakes when the time it
 * computed has passed in wall time, so "asleep" is checked with the deadline far away). */
static void test_wait_timeout_at_deadline(void **state)
{
    kvt_engine_t *r = receiver(fake_clock_start(), 360.0);
    kvt_task_result_t res;
    kvt_task_id_t id;
    uint64_t t0;
    (void)state;

    assert_int_equal(kvt_submit_wait_req(r, "never", 10000, NULL, &id), KVT_OK);
    advance(r, 5000ull * KVT_NSEC_PER_MSEC);
    /* asleep until the deadline (5 s on this clock): a quarter second of wall time without
     * a turn */
    t0 = turns(r);
    assert_int_equal(kvt_task_wait(r, id, 250, &res), KVT_ERR_TIMEOUT);
    assert_true(turns(r) - t0 <= 1);
    advance(r, 4999ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(kvt_task_wait(r, id, 100, &res), KVT_ERR_TIMEOUT); /* 1 ms early */
    advance(r, 2ull * KVT_NSEC_PER_MSEC); /* the deadline is 10 000 ms + 1 ns after submit */
    assert_int_equal(t_wait(r, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT);
    kvt_task_result_clear(&res);
    kvt_engine_destroy(r);
}

/* A request record nobody uses is forgotten a TTL (pd_pull_pending_ttl) after its last use,
 * by the sweep timer. */
static void test_stale_record_ttl(void **state)
{
    kvt_engine_t *r = receiver(fake_clock_start(), 30.0);
    kvt_task_result_t res;
    kvt_task_id_t id;
    (void)state;

    /* a wait with no timeout of its own creates the record; cancelling the wait is not
     * possible, so it times out at once and leaves the record idle */
    assert_int_equal(kvt_submit_wait_req(r, "stale", 0, NULL, &id), KVT_OK);
    advance(r, 1ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(t_wait(r, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT);
    kvt_task_result_clear(&res);
    assert_int_equal(records(r), 1);
    advance(r, 29998ull * KVT_NSEC_PER_MSEC); /* a TTL after creation, less 1 ms */
    assert_int_equal(records(r), 1);
    advance(r, 2ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(records_reach(r, 0), 0);
    kvt_engine_destroy(r);
}

/* The handshake with a receiver that never answers times out at the control timeout, not
 * before; the sender sleeps meanwhile. */
static void test_handshake_timeout_at_deadline(void **state)
{
    kvt_config_t sc;
    kvt_engine_t *s;
    kvt_engine_params_t ep = {.page_size = T_PAGE,
                              .bind_host = "127.0.0.1",
                              .ctrl_timeout_ms = 60000,
                              .clock = fake_clock_start()};
    void *ctx = zmq_ctx_new(), *mute_a = zmq_socket(ctx, ZMQ_ROUTER);
    void *mute_i = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_pollitem_t hs = {.socket = mute_i, .events = ZMQ_POLLIN};
    char ep_s[64], **keys = t_keys("mute", 2);
    size_t l;
    int zero = 0;
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    kvt_metrics_t m;
    uint64_t t0;
    (void)state;

    zmq_setsockopt(mute_a, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(mute_i, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(mute_a, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_bind(mute_i, "tcp://127.0.0.1:*"), 0);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 8 * T_PAGE, "tcp");
    l = sizeof(ep_s);
    zmq_getsockopt(mute_a, ZMQ_LAST_ENDPOINT, ep_s, &l);
    sc.pd_peer_alloc_port.v[0] = (uint16_t)atoi(strrchr(ep_s, ':') + 1);
    l = sizeof(ep_s);
    zmq_getsockopt(mute_i, ZMQ_LAST_ENDPOINT, ep_s, &l);
    sc.pd_peer_init_port.v[0] = (uint16_t)atoi(strrchr(ep_s, ':') + 1);
    ep.cfg = &sc;
    assert_int_equal(kvt_engine_create(&ep, &s), KVT_OK);
    id = t_store(s, "mute-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(zmq_poll(&hs, 1, 5000), 1); /* the handshake went out ... */
    advance(s, 0); /* ... and the turn that sent it (and armed its deadline) is over */
    advance(s, 30000ull * KVT_NSEC_PER_MSEC);
    t0 = turns(s); /* asleep: the deadline is 30 s away on this clock */
    assert_int_equal(kvt_task_wait(s, id, 250, &res), KVT_ERR_TIMEOUT);
    assert_true(turns(s) - t0 <= 1);
    advance(s, 29999ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(kvt_task_wait(s, id, 100, &res), KVT_ERR_TIMEOUT); /* 1 ms early */
    advance(s, 1ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT);
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &m);
    assert_int_equal(m.ctrl_timeouts_total, 1);
    kvt_engine_destroy(s);
    zmq_close(mute_a);
    zmq_close(mute_i);
    zmq_ctx_term(ctx);
    t_keys_free(keys, 2);
}

/* A request parked for space gets its final answer when the backoff TTL is reached (the
 * parked timer), not before. */
static void test_parked_answer_at_deadline(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("prk", 12);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    rc.pd_alloc_fail_backoff_ttl = 2.0;
    sc.pd_alloc_fail_backoff_ttl = 2.0;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    id = t_store(p.s, "prk-a", keys, 0, 8, 0, 1, 8, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(t_wait(p.s, id, 10000, &res), KVT_OK);
    assert_int_equal(t_bits(&res), 8);
    kvt_task_result_clear(&res);
    id = t_store(p.s, "prk-b", keys, 8, 4, 0, 1, 4, &st);
    assert_int_equal(st, KVT_OK);
    /* parked (its deadline armed in the same turn) */
    for (uint64_t until = t_now_ms() + 5000;
         atomic_load(&p.r->parked_total) == 0 && t_now_ms() < until;)
        usleep(1000);
    assert_int_equal(atomic_load(&p.r->parked_total), 1);
    advance(p.r, 0);
    advance(p.r, 1999ull * KVT_NSEC_PER_MSEC);
    assert_int_equal(kvt_task_wait(p.s, id, 250, &res), KVT_ERR_TIMEOUT); /* still */
    advance(p.r, 1ull * KVT_NSEC_PER_MSEC);
    kvt_engine_clock_moved(p.s);
    assert_int_equal(t_wait(p.s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_ALLOC_FAILED);
    kvt_task_result_clear(&res);
    kvt_release_req(p.r, "prk-a");
    assert_true(t_pool_drained(p.r, 1000));
    assert_true(t_pool_drained(p.s, 1000));
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_engines_sleep),
        cmocka_unit_test(test_wait_timeout_at_deadline),
        cmocka_unit_test(test_stale_record_ttl),
        cmocka_unit_test(test_handshake_timeout_at_deadline),
        cmocka_unit_test(test_parked_answer_at_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
