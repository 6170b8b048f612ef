/*
 * test_flow.c - the safety nets, through real engines on loopback:
 * already-sent dedup leaves nothing pinned (push and pull); a request
 * larger than the receiver's whole buffer fails fast; the circuit breaker
 * skips a backed-off peer (ProxyNotif still sent) and resumes after its TTL;
 * partial allocation after the receiver waited the backoff TTL for space;
 * the TTL sweep releases pulls of a receiver that never answers; backpressure
 * refuses pulls above the high-water mark; an early PullDoneSignal still
 * releases; CancelNotif releases everything of a request on both sides;
 * decode admission reservations (one that comes after its request landed
 * holds nothing); garbage on the control sockets.
 *
 * Time-driven nets (backoff TTL, pull-pending TTL) run on a test clock both
 * engines share: the test moves it by hand, so a loaded machine can neither
 * make a TTL expire early nor late. Waits are on conditions, never on a
 * sleep that hopes something happened meanwhile.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <zmq.h>

#include "test_engine_common.h"
#include "test_fake_clock.h"
#include "kvt/kvt_msg.h"
#include "kvt_engine_int.h" /* the sender's pull-pending table (early done signals) */

/* Move the clock and tell both engines (they sleep until their next deadline as they saw
 * the clock). */
static void fake_advance_ms(t_pair_t *p, uint64_t ms)
{
    atomic_fetch_add(&fake_ns, ms * KVT_NSEC_PER_MSEC);
    kvt_engine_clock_moved(p->s);
    kvt_engine_clock_moved(p->r);
}

/* Still running after the engines had time to act (frozen clock: it waits
 * for space, it has not failed). */
static int still_pending(kvt_engine_t *e, kvt_task_id_t id)
{
    kvt_task_result_t res;
    if (kvt_task_wait(e, id, 200, &res) == KVT_ERR_TIMEOUT)
        return 1;
    kvt_task_result_clear(&res);
    return 0;
}

static kvt_task_result_t store_wait(kvt_engine_t *s, const char *req, char **keys, uint32_t first,
                                    uint32_t n, int64_t toks)
{
    kvt_status_t st;
    kvt_task_result_t res;
    kvt_task_id_t id = t_store(s, req, keys, first, n, toks, 1, n, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(t_wait(s, id, 10000, &res), KVT_OK);
    return res;
}

static void wait_landed(kvt_engine_t *r, const char *req)
{
    kvt_task_id_t wid;
    kvt_task_result_t res;
    assert_int_equal(kvt_submit_wait_req(r, req, 5000, NULL, &wid), KVT_OK);
    assert_int_equal(t_wait(r, wid, 6000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
}

/* ReserveRequest{<id>, <chunks>} to <p>'s receiver through <px>: whether it was granted;
 * *free_chunks gets the answer's. */
static int reserve_on(kvt_proxy_t *px, const t_pair_t *p, const char *id, int64_t chunks,
                      int64_t *free_chunks)
{
    int granted = -1;
    assert_int_equal(kvt_proxy_reserve(px, "127.0.0.1", p->rp.alloc_port, id, chunks, 5000, 3000,
                                       &granted, free_chunks),
                     KVT_OK);
    return granted;
}

static void dedup_case(t_mode_t mode)
{
    t_pair_t p;
    char **keys = t_keys("dup", 12);
    kvt_task_result_t res;
    kvt_metrics_t m;
    kvt_pool_stats_t ps;

    assert_int_equal(t_pair_open(&p, mode, 32 * T_PAGE, 32 * T_PAGE, "tcp"), KVT_OK);
    res = store_wait(p.s, "dup-a", keys, 0, 10, 0);
    assert_int_equal(t_bits(&res), 10);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "dup-a");
    /* keys 0..9 again plus two new ones */
    res = store_wait(p.s, "dup-b", keys, 0, 12, 0);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 12);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "dup-b");
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.already_sent_total, 10);
    if (mode == MODE_PUSH) {
        assert_int_equal(m.bytes_write, 12 * T_PAGE); /* the duplicates never moved */
        assert_true(t_pool_drained(p.s, 2000));
    } else {
        /* pulls pin until the receiver reads; duplicates are unpinned at once */
        kvt_engine_pool_stats(p.s, &ps);
        assert_true(ps.pinned_pages <= 12);
        kvt_release_req(p.r, "dup-a");
        kvt_release_req(p.r, "dup-b");
        assert_true(t_pool_drained(p.s, 3000));
    }
    kvt_release_req(p.r, "dup-a");
    kvt_release_req(p.r, "dup-b");
    assert_true(t_pool_drained(p.r, 2000));
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

static void test_dedup_push(void **state)
{
    (void)state;
    dedup_case(MODE_PUSH);
}

static void test_dedup_pull(void **state)
{
    (void)state;
    dedup_case(MODE_PULL_EAGER);
}

/* Larger than the receiver's buffer: alloc_failed at once, breaker trips,
 * the next batch is skipped (with its ProxyNotif), and after the TTL the
 * peer is used again. */
static void test_too_large_breaker(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    kvt_proxy_t *px;
    char **keys = t_keys("big", 40);
    kvt_task_result_t res;
    kvt_metrics_t m;
    char rid[64];
    kvt_status_t st;
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 64 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    snprintf(sc.pd_proxy_host, sizeof(sc.pd_proxy_host), "127.0.0.1");
    sc.pd_proxy_port = kvt_proxy_port(px);
    sc.pd_alloc_fail_backoff_ttl = 0.5;
    rc.pd_alloc_fail_backoff_ttl = 0.5;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);

    /* the sender's own buffer: refused before anything is sent */
    {
        char **k2 = t_keys("huge", 65);
        kvt_task_id_t id = t_store(p.s, "huge", k2, 0, 65, 0, 1, 65, &st);
        assert_int_equal(st, KVT_ERR_TOO_LARGE);
        (void)id;
        t_keys_free(k2, 65);
    }
    /* 12 > 8 pages on the receiver: answered while the clock stands still,
     * so nobody waited out a TTL or a timeout */
    res = store_wait(p.s, "big-1", keys, 0, 12, 0);
    assert_int_equal(res.status, KVT_ERR_ALLOC_FAILED);
    assert_int_equal(t_bits(&res), 0);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 3000), KVT_OK);
    /* ProxyNotif of a failed request still goes out: the decoder recomputes */
    assert_string_equal(rid, "big-1");
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.breaker_open, 1);

    /* backed off: skipped at once, still a ProxyNotif */
    res = store_wait(p.s, "skip-1", keys, 20, 2, 0);
    assert_int_equal(res.status, KVT_ERR_BACKOFF);
    assert_int_equal(t_bits(&res), 0);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 3000), KVT_OK);
    assert_string_equal(rid, "skip-1");
    kvt_engine_metrics(p.s, &m);
    assert_true(m.breaker_skips_total >= 1);
    assert_true(t_pool_drained(p.s, 1000));

    /* after the TTL the peer is used again */
    fake_advance_ms(&p, 600);
    res = store_wait(p.s, "after", keys, 30, 2, 0);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 2);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 3000), KVT_OK);
    assert_string_equal(rid, "after");
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.breaker_open, 0);
    assert_int_equal(m.proxy_notifs_total, 3);
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 40);
}

/* What the sender's on_proxy_notif hook saw. */
typedef struct notif_seen {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
    char last[64];
} notif_seen_t;

static void on_notif(void *arg, const char *req_id)
{
    notif_seen_t *ns = arg;
    pthread_mutex_lock(&ns->lock);
    ns->n++;
    snprintf(ns->last, sizeof(ns->last), "%s", req_id);
    pthread_cond_broadcast(&ns->cond);
    pthread_mutex_unlock(&ns->lock);
}

/* Wait until the hook has been called <n> times (3 s at most); returns the count. */
static int notif_wait(notif_seen_t *ns, int n)
{
    struct timespec until;
    int got;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 3;
    pthread_mutex_lock(&ns->lock);
    while (ns->n < n && pthread_cond_timedwait(&ns->cond, &ns->lock, &until) == 0)
        ;
    got = ns->n;
    pthread_mutex_unlock(&ns->lock);
    return got;
}

/* The sender reports every ProxyNotif it sent (kvt_engine_params_t.on_proxy_notif), after
 * the receiver confirmed the request landed: the moment a proxy may start the decode, which an
 * engine (or a simulator timing itself) can only learn this way. */
static void test_proxy_notif_hook(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    kvt_proxy_t *px;
    char **keys = t_keys("hook", 8);
    kvt_task_result_t res;
    notif_seen_t ns = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    char rid[64];
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 16 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 16 * T_PAGE, "tcp");
    snprintf(sc.pd_proxy_host, sizeof(sc.pd_proxy_host), "127.0.0.1");
    sc.pd_proxy_port = kvt_proxy_port(px);
    assert_int_equal(t_pair_open_notif(&p, &sc, &rc, NULL, on_notif, &ns), KVT_OK);
    res = store_wait(p.s, "hook-1", keys, 0, 4, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 3000), KVT_OK);
    assert_string_equal(rid, "hook-1");
    assert_int_equal(notif_wait(&ns, 1), 1);
    assert_string_equal(ns.last, "hook-1");
    /* one report per request */
    res = store_wait(p.s, "hook-2", keys, 4, 4, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 3000), KVT_OK);
    assert_string_equal(rid, "hook-2");
    assert_int_equal(notif_wait(&ns, 2), 2);
    assert_string_equal(ns.last, "hook-2");
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 8);
}

/* The receiver has 8 pages, 6 taken: a batch of 6 waits the backoff TTL for
 * space, then gets the 2 pages there are. */
static void test_partial_after_wait(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("part", 12);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    rc.pd_alloc_fail_backoff_ttl = 0.3;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    res = store_wait(p.s, "part-a", keys, 0, 6, 0);
    assert_int_equal(t_bits(&res), 6);
    kvt_task_result_clear(&res);
    id = t_store(p.s, "part-b", keys, 6, 6, 0, 1, 6, &st);
    assert_int_equal(st, KVT_OK);
    assert_true(still_pending(p.s, id)); /* waits the backoff TTL (0.3 s) for space ... */
    fake_advance_ms(&p, 350);
    assert_int_equal(t_wait(p.s, id, 5000, &res), KVT_OK); /* ... not the whole timeout */
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 2);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "part-b");
    kvt_release_req(p.r, "part-a");
    kvt_release_req(p.r, "part-b");
    assert_true(t_pool_drained(p.r, 1000));
    assert_true(t_pool_drained(p.s, 1000));
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The receiver is full: it waits the backoff TTL for space without
 * spinning, then answers alloc_failed. */
static void test_full_waits_then_fails(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("full", 12);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    double c0, cpu;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    rc.pd_alloc_fail_backoff_ttl = 0.8;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    res = store_wait(p.s, "full-a", keys, 0, 8, 0);
    assert_int_equal(t_bits(&res), 8);
    kvt_task_result_clear(&res);
    id = t_store(p.s, "full-b", keys, 8, 4, 0, 1, 4, &st);
    assert_int_equal(st, KVT_OK);
    /* parked while the clock stands still; the CPU two parked engines burn
     * over the next 0.8 s of wall time is far from a busy loop's */
    c0 = cpu_seconds();
    for (int i = 0; i < 4; i++)
        assert_true(still_pending(p.s, id));
    cpu = cpu_seconds() - c0;
    assert_true(cpu < 0.4);
    fake_advance_ms(&p, 850); /* past the backoff TTL: alloc_failed */
    assert_int_equal(t_wait(p.s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_ALLOC_FAILED);
    assert_int_equal(t_bits(&res), 0);
    kvt_task_result_clear(&res);
    kvt_release_req(p.r, "full-a");
    assert_true(t_pool_drained(p.r, 1000));
    assert_true(t_pool_drained(p.s, 1000));
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

/* Space freed while a request is parked: it proceeds in full. */
static void test_parked_gets_space(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("park", 12);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    rc.pd_alloc_fail_backoff_ttl = 2.0;
    /* frozen clock: the parked request cannot reach its deadline however
     * slow the machine is */
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    res = store_wait(p.s, "park-a", keys, 0, 6, 0);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "park-a");
    id = t_store(p.s, "park-b", keys, 6, 6, 0, 1, 6, &st);
    assert_int_equal(st, KVT_OK);
    assert_true(still_pending(p.s, id)); /* parked */
    kvt_release_req(p.r, "park-a");
    assert_int_equal(t_wait(p.s, id, 3000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 6);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "park-b");
    kvt_release_req(p.r, "park-b");
    assert_true(t_pool_drained(p.r, 1000));
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

/* pull-delay receiver that never loads: the sender's pins go by the TTL. */
static void test_sweep_releases(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("sweep", 6);
    kvt_task_result_t res;
    kvt_pool_stats_t ps;
    kvt_metrics_t m;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PULL_DELAY, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PULL_DELAY, 32 * T_PAGE, "tcp");
    sc.pd_pull_pending_ttl = 0.3;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    res = store_wait(p.s, "sweep-a", keys, 0, 6, 0);
    assert_int_equal(t_bits(&res), 6);
    kvt_task_result_clear(&res);
    kvt_engine_pool_stats(p.s, &ps);
    assert_int_equal(ps.pinned_pages, 6);
    fake_advance_ms(&p, 400);
    assert_true(t_pool_drained(p.s, 3000));
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.pull_expired_total, 1);
    t_pair_close(&p);
    t_keys_free(keys, 6);
}

static void test_backpressure(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("bp", 12);
    kvt_task_result_t res;
    kvt_status_t st;
    kvt_metrics_t m;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PULL_DELAY, 20 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PULL_DELAY, 20 * T_PAGE, "tcp");
    sc.pd_pull_backpressure_reserve_pct = 50.0; /* high-water mark: 10 pinned pages */
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, NULL), KVT_OK);
    res = store_wait(p.s, "bp-a", keys, 0, 8, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    t_store(p.s, "bp-b", keys, 8, 4, 0, 1, 4, &st);
    assert_int_equal(st, KVT_ERR_BACKPRESSURE);
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.backpressure_total, 1);
    /* the receiver consumes (releases) bp-a: pins drop, the store goes */
    kvt_release_req(p.r, "bp-a");
    assert_true(t_pool_drained(p.s, 3000));
    res = store_wait(p.s, "bp-b", keys, 8, 4, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    t_pair_close(&p);
    t_keys_free(keys, 12);
}

/* A PullDoneSignal that arrives before the sender registered its pull. */
static void test_early_done(void **state)
{
    t_pair_t p;
    char **keys = t_keys("early", 3);
    kvt_task_result_t res;
    kvt_metrics_t m;
    void *ctx = zmq_ctx_new(), *push = zmq_socket(ctx, ZMQ_PUSH);
    kvt_engine_ports_t sp;
    char ep[64], pull_id[400];
    kvt_msg_t msg;
    void *data;
    size_t len;
    int zero = 0;
    (void)state;

    assert_int_equal(t_pair_open(&p, MODE_PULL_DELAY, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    kvt_engine_ports(p.s, &sp);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof(zero));
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", sp.done_port);
    assert_int_equal(zmq_connect(push, ep), 0);
    /* the first pull of this sender will be called p1-<id>|early-req */
    snprintf(pull_id, sizeof(pull_id), "p1-%s|early-req", kvt_engine_id(p.s));
    kvt_msg_init(&msg, KVT_MSG_PULL_DONE_SIGNAL);
    msg.u.pull_done.pull_id = pull_id;
    assert_int_equal(kvt_msg_encode(&msg, &data, &len), KVT_OK);
    zmq_send(push, data, len, 0);
    kvt_free(data);
    /* the sender remembered it before the pull exists */
    {
        kvt_pending_stats_t pst = {0};
        for (uint64_t end = t_now_ms() + 5000; t_now_ms() < end; usleep(2000)) {
            kvt_pending_stats(p.s->pending, &pst);
            if (pst.early >= 1)
                break;
        }
        assert_int_equal(pst.early, 1);
    }
    res = store_wait(p.s, "early-req", keys, 0, 3, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    /* pull-delay receiver never loaded, yet the pins are gone */
    assert_true(t_pool_drained(p.s, 1000));
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.pull_early_done_total, 1);
    zmq_close(push);
    zmq_ctx_term(ctx);
    t_pair_close(&p);
    t_keys_free(keys, 3);
}

/* CancelNotif from the proxy: the receiver drops the request's proxies and
 * forwards the cancel; the sender unpins. */
static void test_cancel_both_sides(void **state)
{
    t_pair_t p;
    kvt_proxy_t *px;
    char **keys = t_keys("cxl", 5);
    kvt_task_result_t res;
    kvt_task_id_t wid;
    kvt_pool_stats_t ps;
    kvt_metrics_t m;
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(t_pair_open(&p, MODE_PULL_DELAY, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    res = store_wait(p.s, "cxl-1", keys, 0, 5, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    kvt_engine_pool_stats(p.s, &ps);
    assert_int_equal(ps.pinned_pages, 5);
    /* a waiter on another request that never comes is cancelled too */
    assert_int_equal(kvt_submit_wait_req(p.r, "cxl-2", -1, NULL, &wid), KVT_OK);
    assert_int_equal(kvt_proxy_cancel(px, "127.0.0.1", p.rp.alloc_port, "cxl-1", NULL, 0), KVT_OK);
    assert_int_equal(kvt_proxy_cancel(px, "127.0.0.1", p.rp.alloc_port, "cxl-2", NULL, 0), KVT_OK);
    assert_int_equal(t_wait(p.r, wid, 3000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_CANCELLED);
    kvt_task_result_clear(&res);
    assert_true(t_pool_drained(p.s, 3000));
    assert_true(t_pool_drained(p.r, 3000));
    /* The receiver counts a cancel after acting on it: poll, a loaded machine may lag. */
    for (int i = 0; i < 300; i++) {
        kvt_engine_metrics(p.r, &m);
        if (m.cancels_total >= 2)
            break;
        usleep(10 * 1000);
    }
    assert_int_equal(m.cancels_total, 2);
    for (int i = 0; i < 300; i++) { /* the sender counts after unpinning */
        kvt_engine_metrics(p.s, &m);
        if (m.cancels_total >= 1)
            break;
        usleep(10 * 1000);
    }
    assert_true(m.cancels_total >= 1);
    /* push: cancel through the engine API after landing frees the pages */
    t_pair_close(&p);
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    res = store_wait(p.s, "cxl-3", keys, 0, 5, 0);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "cxl-3");
    kvt_engine_pool_stats(p.r, &ps);
    assert_int_equal(ps.used_pages, 5);
    assert_int_equal(kvt_engine_cancel(p.s, "cxl-3", 1, NULL, 0), KVT_OK);
    assert_true(t_pool_drained(p.r, 3000));
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 5);
}

/* After CancelNotif a late batch of the same request (a prefill that kept
 * computing) allocates nothing on the receiver, and the sender holds
 * nothing either -- without tripping the breaker. */
static void tombstone_case(t_mode_t mode)
{
    t_pair_t p;
    kvt_proxy_t *px;
    char **keys = t_keys("tomb", 8);
    kvt_task_result_t res;
    kvt_metrics_t m;
    kvt_pool_stats_t ps;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(t_pair_open(&p, mode, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    assert_int_equal(kvt_proxy_cancel(px, "127.0.0.1", p.rp.alloc_port, "tomb-1", NULL, 0), KVT_OK);
    for (uint64_t end = t_now_ms() + 3000; t_now_ms() < end; usleep(2000)) {
        kvt_engine_metrics(p.r, &m);
        if (m.cancels_total == 1)
            break;
    }
    assert_int_equal(m.cancels_total, 1);
    res = store_wait(p.s, "tomb-1", keys, 0, 4, 0);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    kvt_engine_pool_stats(p.r, &ps);
    assert_int_equal(ps.used_pages, 0);
    assert_true(t_pool_drained(p.s, 2000));
    kvt_engine_metrics(p.s, &m);
    assert_int_equal(m.breaker_open, 0);
    /* a proxy that reserves again for the id (a retry of the request) lifts the tombstone */
    {
        int64_t free_chunks = 0;
        assert_true(reserve_on(px, &p, "tomb-1", 4, &free_chunks));
        res = store_wait(p.s, "tomb-1", keys, 0, 4, 0);
        assert_int_equal(res.status, KVT_OK);
        assert_int_equal(t_bits(&res), 4);
        kvt_task_result_clear(&res);
        wait_landed(p.r, "tomb-1");
        kvt_release_req(p.r, "tomb-1");
        assert_true(t_pool_drained(p.r, 2000));
        assert_true(t_pool_drained(p.s, 3000));
    }
    /* other requests are untouched */
    res = store_wait(p.s, "tomb-2", keys, 4, 4, 0);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 4);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "tomb-2");
    kvt_engine_pool_stats(p.r, &ps);
    assert_int_equal(ps.used_pages, mode == MODE_PUSH || mode == MODE_PULL_EAGER ? 4 : 0);
    kvt_release_req(p.r, "tomb-2");
    assert_true(t_pool_drained(p.r, 2000));
    assert_true(t_pool_drained(p.s, 3000));
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 8);
}

static void test_tombstone_push(void **state)
{
    (void)state;
    tombstone_case(MODE_PUSH);
}

static void test_tombstone_pull(void **state)
{
    (void)state;
    tombstone_case(MODE_PULL_EAGER);
}

static void test_reserve(void **state)
{
    t_pair_t p;
    kvt_proxy_t *px;
    char **keys = t_keys("rsv", 8);
    kvt_task_result_t res;
    int64_t free_chunks = -1;
    kvt_metrics_t m;
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 16 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    assert_int_equal(reserve_on(px, &p, "rsv-a", 6, &free_chunks), 1);
    assert_int_equal(free_chunks, 2);
    assert_int_equal(reserve_on(px, &p, "rsv-b", 4, &free_chunks), 0);
    /* another request cannot eat the reserved pages: it gets 2 after waiting */
    res = store_wait(p.s, "rsv-c", keys, 0, 4, 0);
    assert_int_equal(t_bits(&res), 2);
    kvt_task_result_clear(&res);
    /* the reserved request gets all six */
    res = store_wait(p.s, "rsv-a", keys, 2, 6, 0);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 6);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "rsv-a");
    kvt_engine_metrics(p.r, &m);
    assert_int_equal(m.reserve_granted_total, 1);
    assert_int_equal(m.reserve_refused_total, 1);
    kvt_release_req(p.r, "rsv-a");
    kvt_release_req(p.r, "rsv-c");
    assert_true(t_pool_drained(p.r, 1000));
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 8);
}

/* A ReserveRequest (libkvt's own message, kvtransfer/src/kvt_ctrl_proxy.c; no upstream engine
 * sends it) that comes after its request's transfer landed (a proxy that sent the
 * request on before the answer) is granted without holding anything: the room was drawn and
 * given back already, and held again it would be kept from every other request until its TTL. */
static void test_reserve_after_landing(void **state)
{
    t_pair_t p;
    kvt_proxy_t *px;
    char **keys = t_keys("late", 4);
    kvt_task_result_t res;
    int64_t free_chunks = -1;
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 16 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    res = store_wait(p.s, "late-a", keys, 0, 4, 0);
    assert_int_equal(t_bits(&res), 4);
    kvt_task_result_clear(&res);
    wait_landed(p.r, "late-a");
    /* 8 pages, 4 of them hold late-a's landed chunks */
    assert_int_equal(reserve_on(px, &p, "late-a", 4, &free_chunks), 1);
    assert_int_equal(free_chunks, 4); /* nothing more held */
    /* the four free pages are still anyone's */
    assert_int_equal(reserve_on(px, &p, "late-b", 4, &free_chunks), 1);
    assert_int_equal(free_chunks, 0);
    assert_int_equal(kvt_proxy_cancel(px, "127.0.0.1", p.rp.alloc_port, "late-b", NULL, 0), KVT_OK);
    kvt_release_req(p.r, "late-a");
    assert_true(t_pool_drained(p.r, 2000));
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 4);
}

static void test_control_garbage(void **state)
{
    t_pair_t p;
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER), *d2 = zmq_socket(ctx, ZMQ_DEALER);
    char ep[64];
    kvt_metrics_t m;
    zmq_pollitem_t it = {.socket = d2, .events = ZMQ_POLLIN};
    zmq_msg_t f;
    kvt_msg_t r;
    char **keys = t_keys("gb", 2);
    kvt_task_result_t res;
    int zero = 0;
    /* AllocRequest with an unknown dtype: must still be answered */
    static const uint8_t bad_alloc[] = {
        0x86, 0xa4, 't', 'y',  'p',  'e',  0xac, 'A', 'l',  'l', 'o',  'c',  'R',  'e',
        'q',  'u',  'e', 's',  't',  0xa4, 'k',  'e', 'y',  's', 0x91, 0xa1, 'k',  0xa3,
        'f',  'm',  't', 0x01, 0xa5, 's',  'h',  'a', 'p',  'e', 0x91, 0x04, 0xa5, 'd',
        't',  'y',  'p', 'e',  0xa3, 'x',  'y',  'z', 0xaf, 'l', 'a',  's',  't',  '_',
        'c',  'h',  'u', 'n',  'k',  '_',  't',  'o', 'k',  's', 0x00};
    (void)state;

    assert_int_equal(t_pair_open(&p, MODE_PUSH, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(d2, ZMQ_LINGER, &zero, sizeof(zero));
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", p.rp.alloc_port);
    zmq_connect(d, ep);
    zmq_connect(d2, ep);
    zmq_send(d, "\xc1\xff garbage", 10, 0);
    zmq_send(d, "a", 1, ZMQ_SNDMORE);
    zmq_send(d, "b", 1, ZMQ_SNDMORE);
    zmq_send(d, "c", 1, ZMQ_SNDMORE);
    zmq_send(d, "d", 1, 0);
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", p.rp.init_port);
    {
        void *di = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(di, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_connect(di, ep);
        zmq_pollitem_t ii = {.socket = di, .events = ZMQ_POLLIN};
        zmq_send(di, "not a blob", 10, 0);
        /* the init port answers every request, garbage too (an empty reply): wait for it */
        assert_int_equal(zmq_poll(&ii, 1, 5000), 1);
        zmq_close(di);
    }
    zmq_send(d2, bad_alloc, sizeof(bad_alloc), 0);
    assert_int_equal(zmq_poll(&it, 1, 3000), 1);
    zmq_msg_init(&f);
    assert_true(zmq_msg_recv(&f, d2, 0) >= 0);
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &r, NULL), KVT_OK);
    zmq_msg_close(&f);
    /* no async fields, no kvt_ext: a sync-backend sender, answered in its
     * terms (LMCache pd_backend.py AllocResponse; -1 = nothing to write to) */
    assert_int_equal(r.type, KVT_MSG_ALLOC_RESPONSE);
    assert_int_equal(r.u.alloc_resp.remote_indexes.n, 1);
    assert_int_equal(r.u.alloc_resp.remote_indexes.v[0], -1);
    kvt_msg_clear(&r);
    /* the garbage came over other connections: nothing orders it before this reply */
    for (uint64_t end = t_now_ms() + 5000;;) {
        kvt_engine_metrics(p.r, &m);
        if (m.bad_messages_total >= 3 || t_now_ms() >= end)
            break;
        usleep(10 * 1000);
    }
    assert_true(m.bad_messages_total >= 3);
    assert_true(m.refusals_total >= 1);
    /* and the engine still works */
    res = store_wait(p.s, "gb-1", keys, 0, 2, 0);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 2);
    kvt_task_result_clear(&res);
    zmq_close(d);
    zmq_close(d2);
    zmq_ctx_term(ctx);
    t_pair_close(&p);
    t_keys_free(keys, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dedup_push),         cmocka_unit_test(test_dedup_pull),
        cmocka_unit_test(test_too_large_breaker),  cmocka_unit_test(test_proxy_notif_hook),
        cmocka_unit_test(test_partial_after_wait), cmocka_unit_test(test_full_waits_then_fails),
        cmocka_unit_test(test_parked_gets_space),  cmocka_unit_test(test_sweep_releases),
        cmocka_unit_test(test_backpressure),       cmocka_unit_test(test_early_done),
        cmocka_unit_test(test_cancel_both_sides),  cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_tombstone_push),     cmocka_unit_test(test_tombstone_pull),
        cmocka_unit_test(test_control_garbage),    cmocka_unit_test(test_reserve_after_landing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
