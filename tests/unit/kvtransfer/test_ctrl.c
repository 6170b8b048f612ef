/*
 * test_ctrl.c - the control plane seen from the proxy (the gateway):
 * ProxyNotif through the PULL and its fd in an epoll loop (edge-style
 * ZMQ_FD handled by draining until KVT_ERR_TIMEOUT), garbage on the PULL
 * counted and skipped, ReserveRequest with a timeout against a peer that
 * never answers (the socket is replaced, the next reserve works), reservations
 * in flight side by side without waiting, garbage and stray messages among
 * the answers counted and skipped, and the
 * sender's ProxyNotif only after the LAST batch of a request completed.
 * ReserveRequest / ReserveResponse are libkvt's own messages (no upstream
 * engine sends them), framed [b"", payload] as libkvt's DEALER sends them
 * (kvtransfer/src/kvt_ctrl_proxy.c send_msg); no upstream fact is encoded.
 */
#include <poll.h>
#include <sys/epoll.h>
#include <stdatomic.h>
#include <zmq.h>

#include "test_engine_common.h"
#include "kvt/kvt_msg.h"

/* A ROUTER bound to an ephemeral loopback port (linger 0): a receiver's alloc or init port
 * whose answers the test writes itself, or that never answers. */
static void *router_open(void *ctx, uint16_t *port)
{
    void *rt = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[64];
    size_t l = sizeof(ep);
    int zero = 0;
    assert_non_null(rt);
    zmq_setsockopt(rt, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(rt, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(rt, ZMQ_LAST_ENDPOINT, ep, &l), 0);
    *port = (uint16_t)atoi(strrchr(ep, ':') + 1);
    return rt;
}

static void push_raw(uint16_t port, const void *data, size_t len)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PUSH);
    char ep[64];
    int linger = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
    zmq_connect(s, ep);
    zmq_send(s, data, len, 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

static void push_notif(uint16_t port, const char *req)
{
    kvt_msg_t m;
    void *data;
    size_t len;
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    m.u.proxy_notif.req_id = (char *)req;
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    push_raw(port, data, len);
    kvt_free(data);
}

static void test_proxy_notif_epoll(void **state)
{
    kvt_proxy_t *px;
    int ep = epoll_create1(0), got = 0;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    char rid[32];
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_true(kvt_proxy_port(px) > 0);
    assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, kvt_proxy_fd(px), &ev), 0);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 0), KVT_ERR_TIMEOUT); /* arms */
    push_raw(kvt_proxy_port(px), "\xc1garbage", 8);
    push_notif(kvt_proxy_port(px), "r-1");
    push_notif(kvt_proxy_port(px), "r-2");
    push_notif(kvt_proxy_port(px), "r-3-with-a-long-request-id-truncated");
    for (uint64_t end = t_now_ms() + 5000; got < 3 && t_now_ms() < end;) {
        struct epoll_event out;
        if (epoll_wait(ep, &out, 1, 100) <= 0)
            continue;
        /* edge-style: drain everything that is there */
        while (kvt_proxy_recv(px, rid, sizeof(rid), 0) == KVT_OK) {
            got++;
            if (got == 1)
                assert_string_equal(rid, "r-1");
            if (got == 3)
                assert_int_equal(strlen(rid), sizeof(rid) - 1);
        }
    }
    assert_int_equal(got, 3);
    assert_int_equal(kvt_proxy_bad_messages(px), 1);
    close(ep);
    kvt_proxy_destroy(px);
}

static void test_reserve_timeout_replaces_socket(void **state)
{
    kvt_proxy_t *px;
    void *ctx = zmq_ctx_new(), *mute;
    uint16_t port;
    int granted = -1;
    int64_t free_chunks = -1;
    uint64_t t0;
    t_pair_t p;
    (void)state;

    mute = router_open(ctx, &port); /* reads and never answers */
    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    t0 = t_now_ms();
    assert_int_equal(
        kvt_proxy_reserve(px, "127.0.0.1", port, "q", 1, 1000, 200, &granted, &free_chunks),
        KVT_ERR_TIMEOUT);
    assert_true(t_now_ms() - t0 >= 190 && t_now_ms() - t0 < 2000);
    assert_int_equal(granted, -1); /* outputs untouched on error */
    /* a real receiver answers on a fresh socket */
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 8 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    assert_int_equal(kvt_proxy_reserve(px, "127.0.0.1", p.rp.alloc_port, "q", 3, 1000, 3000,
                                       &granted, &free_chunks),
                     KVT_OK);
    assert_int_equal(granted, 1);
    assert_int_equal(free_chunks, 5);
    /* and the muted one times out again, not hanging on its old socket */
    assert_int_equal(
        kvt_proxy_reserve(px, "127.0.0.1", port, "q2", 1, 1000, 100, &granted, &free_chunks),
        KVT_ERR_TIMEOUT);
    assert_int_equal(kvt_proxy_reserve(px, NULL, port, "q", 1, 1, 1, &granted, NULL),
                     KVT_ERR_INVALID);
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    zmq_close(mute);
    zmq_ctx_term(ctx);
}

/* Reservations without waiting: one to a receiver that never answers and one to a real one
 * are in flight at once; the real one's answer comes back with its endpoint while the other is
 * still unanswered, and a dropped socket never hands a late answer to anyone. */
static void test_reserve_in_flight_side_by_side(void **state)
{
    kvt_proxy_t *px;
    void *ctx = zmq_ctx_new(), *mute;
    char want[300];
    uint16_t port;
    int fds[8];
    kvt_proxy_reply_t r;
    kvt_status_t st = KVT_ERR_TIMEOUT;
    t_pair_t p;
    (void)state;

    mute = router_open(ctx, &port);
    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 8 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    assert_int_equal(kvt_proxy_reserve_recv(px, &r), KVT_ERR_TIMEOUT); /* nothing asked */
    assert_int_equal(kvt_proxy_reserve_send(px, "127.0.0.1", port, "slow", 1, 1000), KVT_OK);
    assert_int_equal(kvt_proxy_reserve_send(px, "127.0.0.1", p.rp.alloc_port, "fast", 3, 1000),
                     KVT_OK);
    assert_int_equal(kvt_proxy_reserve_fds(px, fds, 8), 2);
    /* each endpoint's own descriptor, for a loop that waits on that one alone */
    assert_int_equal(kvt_proxy_reserve_fd(px, "127.0.0.1", port), fds[0]);
    assert_int_equal(kvt_proxy_reserve_fd(px, "127.0.0.1", p.rp.alloc_port), fds[1]);
    for (uint64_t end = t_now_ms() + 5000; st != KVT_OK && t_now_ms() < end;) {
        struct pollfd pf[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = fds[1], .events = POLLIN}};
        st = kvt_proxy_reserve_recv(px, &r); /* edge-style: drain before waiting */
        if (st != KVT_OK)
            (void)poll(pf, 2, 50);
    }
    assert_int_equal(st, KVT_OK);
    kvt_proxy_reserve_endpoint("127.0.0.1", p.rp.alloc_port, want, sizeof(want));
    assert_string_equal(r.ep, want);
    assert_string_equal(r.req_id, "fast");
    assert_int_equal(r.granted, 1);
    assert_int_equal(r.free_chunks, 5);
    assert_int_equal(kvt_proxy_reserve_recv(px, &r), KVT_ERR_TIMEOUT);
    /* the silent one is given up: its socket is gone, the next ask makes a new one */
    kvt_proxy_reserve_drop(px, "127.0.0.1", port);
    assert_int_equal(kvt_proxy_reserve_fds(px, fds, 8), 1);
    assert_int_equal(kvt_proxy_reserve_fd(px, "127.0.0.1", port), -1);
    assert_int_equal(kvt_proxy_reserve_fd(px, NULL, port), -1);
    assert_int_equal(kvt_proxy_reserve_send(px, NULL, port, "x", 1, 1), KVT_ERR_INVALID);
    assert_int_equal(kvt_proxy_reserve_send(px, "127.0.0.1", port, "", 1, 1), KVT_ERR_INVALID);
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    zmq_close(mute);
    zmq_ctx_term(ctx);
}

/* A receiver that answers a ReserveRequest with garbage and with a message of another type
 * before its real answer: both are counted and skipped, the real answer is given, and after
 * the drain to the end the socket's descriptor is no longer ready (a loop that waits on it
 * level-triggered does not spin on what it skipped). */
static void test_reserve_answers_garbage_skipped(void **state)
{
    kvt_proxy_t *px;
    void *ctx = zmq_ctx_new(), *rt;
    char ep[64], ident[64];
    int fd, il;
    uint16_t port;
    kvt_proxy_reply_t r;
    kvt_msg_t m;
    void *data = NULL;
    size_t len = 0;
    struct pollfd pf;
    (void)state;

    rt = router_open(ctx, &port);
    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(kvt_proxy_reserve_send(px, "127.0.0.1", port, "g", 2, 1000), KVT_OK);
    /* [ident, "", payload] */
    il = zmq_recv(rt, ident, sizeof(ident), 0);
    assert_true(il > 0);
    assert_int_equal(zmq_recv(rt, ep, sizeof(ep), 0), 0);
    assert_true(zmq_recv(rt, ep, sizeof(ep), 0) > 0);
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF); /* a valid message, not an answer */
    assert_int_equal(kvt_msg_set_str(&m.u.proxy_notif.req_id, "g"), KVT_OK);
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    kvt_msg_clear(&m);
    zmq_send(rt, ident, (size_t)il, ZMQ_SNDMORE);
    zmq_send(rt, "", 0, ZMQ_SNDMORE);
    zmq_send(rt, "\xc1garbage", 8, 0);
    zmq_send(rt, ident, (size_t)il, ZMQ_SNDMORE);
    zmq_send(rt, "", 0, ZMQ_SNDMORE);
    zmq_send(rt, data, len, 0);
    kvt_free(data);
    kvt_msg_init(&m, KVT_MSG_RESERVE_RESPONSE);
    m.u.reserve_resp.req_id = "g";
    m.u.reserve_resp.granted = 1;
    m.u.reserve_resp.free_chunks = 7;
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    zmq_send(rt, ident, (size_t)il, ZMQ_SNDMORE);
    zmq_send(rt, "", 0, ZMQ_SNDMORE);
    zmq_send(rt, data, len, 0);
    kvt_free(data);

    fd = kvt_proxy_reserve_fd(px, "127.0.0.1", port);
    assert_true(fd >= 0);
    pf = (struct pollfd){.fd = fd, .events = POLLIN};
    for (uint64_t end = t_now_ms() + 5000;
         kvt_proxy_reserve_recv(px, &r) != KVT_OK && t_now_ms() < end;)
        (void)poll(&pf, 1, 50);
    assert_string_equal(r.req_id, "g");
    assert_int_equal(r.granted, 1);
    assert_int_equal(r.free_chunks, 7);
    assert_int_equal(kvt_proxy_bad_messages(px), 2);
    assert_int_equal(kvt_proxy_reserve_recv(px, &r), KVT_ERR_TIMEOUT); /* drained to the end */
    pf.revents = 0;
    assert_int_equal(poll(&pf, 1, 0), 0); /* not ready: nothing left to wake a loop */
    kvt_proxy_destroy(px);
    zmq_close(rt);
    zmq_ctx_term(ctx);
}

/* Layer-wise: three parts; the ProxyNotif comes once, after the last. */
static void test_proxy_notif_after_last_batch(void **state)
{
    kvt_proxy_t *px;
    t_pair_t p;
    kvt_config_t sc, rc;
    char **keys = t_keys("lw", 9);
    kvt_task_id_t ids[3], wid;
    kvt_task_result_t res;
    kvt_status_t st;
    char rid[64];
    (void)state;

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 32 * T_PAGE, "tcp");
    snprintf(sc.pd_proxy_host, sizeof(sc.pd_proxy_host), "127.0.0.1");
    sc.pd_proxy_port = kvt_proxy_port(px);
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, NULL), KVT_OK);
    assert_int_equal(kvt_submit_wait_req(p.r, "lw", 10000, NULL, &wid), KVT_OK);
    ids[0] = t_store(p.s, "lw", keys, 0, 3, 0, 0, 9, &st);
    assert_int_equal(st, KVT_OK);
    ids[1] = t_store(p.s, "lw", keys, 3, 3, 0, 0, 9, &st);
    assert_int_equal(st, KVT_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(t_wait(p.s, ids[i], 5000, &res), KVT_OK);
        assert_int_equal(res.status, KVT_OK);
        kvt_task_result_clear(&res);
    }
    /* two parts done, the request is not: no ProxyNotif, receiver waits */
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 200), KVT_ERR_TIMEOUT);
    assert_int_equal(kvt_task_wait(p.r, wid, 0, &res), KVT_ERR_TIMEOUT);
    ids[2] = t_store(p.s, "lw", keys, 6, 3, 9, 1, 9, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 5000), KVT_OK);
    assert_string_equal(rid, "lw");
    assert_int_equal(t_wait(p.s, ids[2], 5000, &res), KVT_OK);
    kvt_task_result_clear(&res);
    assert_int_equal(t_wait(p.r, wid, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 200), KVT_ERR_TIMEOUT); /* just one */
    kvt_release_req(p.r, "lw");
    t_pair_close(&p);
    kvt_proxy_destroy(px);
    t_keys_free(keys, 9);
}

static atomic_ullong fake_ns = 1000ull * KVT_NSEC_PER_SEC;

static uint64_t fake_now(void *arg)
{
    (void)arg;
    return atomic_load(&fake_ns);
}

/* The receiver is gone: the sender's request times out, the DEALER is
 * replaced, and a new receiver on the same port is served. The time-out is
 * driven by a test clock (it fires when the test moves the clock past it). */
static void test_dead_receiver_timeout(void **state)
{
    static const kvt_clock_t fake_clock = {.now = fake_now, .arg = NULL};
    kvt_config_t sc;
    kvt_engine_t *s;
    kvt_engine_params_t ep = {.page_size = T_PAGE,
                              .bind_host = "127.0.0.1",
                              .ctrl_timeout_ms = 300,
                              .clock = &fake_clock};
    zmq_pollitem_t hs;
    void *ctx = zmq_ctx_new(), *mute, *mute_i;
    uint16_t port, iport;
    char **keys = t_keys("dead", 2);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    kvt_metrics_t m;
    (void)state;

    mute = router_open(ctx, &port);
    mute_i = router_open(ctx, &iport);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 8 * T_PAGE, "tcp");
    sc.pd_peer_alloc_port.v[0] = port;
    sc.pd_peer_init_port.v[0] = iport;
    sc.pd_alloc_fail_backoff_ttl = 0.1;
    ep.cfg = &sc;
    assert_int_equal(kvt_engine_create(&ep, &s), KVT_OK);
    id = t_store(s, "dead-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    hs = (zmq_pollitem_t){.socket = mute_i, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&hs, 1, 5000), 1); /* the handshake went out ... */
    assert_int_equal(kvt_task_wait(s, id, 100, &res), KVT_ERR_TIMEOUT); /* ... and waits */
    atomic_fetch_add(&fake_ns, 301ull * KVT_NSEC_PER_MSEC);
    kvt_engine_clock_moved(s);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT); /* the handshake was never answered */
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &m);
    assert_true(m.ctrl_timeouts_total >= 1);
    assert_true(t_pool_drained(s, 1000));
    kvt_engine_destroy(s);
    zmq_close(mute);
    zmq_close(mute_i);
    zmq_ctx_term(ctx);
    t_keys_free(keys, 2);
}

/* When the proxy sees ProxyNotif the receiver already holds every chunk:
 * a lookup right then finds them all (push and pull-eager). */
static void notif_means_landed(t_mode_t mode)
{
    kvt_proxy_t *px;
    t_pair_t p;
    kvt_config_t sc, rc;
    char rid[64], req[32];

    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    t_cfg(&sc, KVT_ROLE_SENDER, mode, 64 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, mode, 64 * T_PAGE, "tcp");
    snprintf(sc.pd_proxy_host, sizeof(sc.pd_proxy_host), "127.0.0.1");
    sc.pd_proxy_port = kvt_proxy_port(px);
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, NULL), KVT_OK);
    for (int round = 0; round < 8; round++) {
        char **keys;
        kvt_task_id_t id;
        kvt_task_result_t res;
        kvt_status_t st;
        snprintf(req, sizeof(req), "nl-%d", round);
        keys = t_keys(req, 24);
        id = t_store(p.s, req, keys, 0, 24, 0, 1, 24, &st);
        assert_int_equal(st, KVT_OK);
        assert_int_equal(kvt_proxy_recv(px, rid, sizeof(rid), 5000), KVT_OK);
        assert_string_equal(rid, req);
        assert_int_equal(kvt_submit_lookup(p.r, (const char *const *)keys, 24, NULL, &id), KVT_OK);
        assert_int_equal(t_wait(p.r, id, 1000, &res), KVT_OK);
        assert_int_equal(t_bits(&res), 24);
        kvt_task_result_clear(&res);
        kvt_unlock(p.r, (const char *const *)keys, 24);
        kvt_release_req(p.r, req);
        t_keys_free(keys, 24);
    }
    t_pair_close(&p);
    kvt_proxy_destroy(px);
}

static void test_notif_means_landed_push(void **state)
{
    (void)state;
    notif_means_landed(MODE_PUSH);
}

static void test_notif_means_landed_pull(void **state)
{
    (void)state;
    notif_means_landed(MODE_PULL_EAGER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proxy_notif_epoll),
        cmocka_unit_test(test_reserve_timeout_replaces_socket),
        cmocka_unit_test(test_reserve_in_flight_side_by_side),
        cmocka_unit_test(test_reserve_answers_garbage_skipped),
        cmocka_unit_test(test_proxy_notif_after_last_batch),
        cmocka_unit_test(test_dead_receiver_timeout),
        cmocka_unit_test(test_notif_means_landed_push),
        cmocka_unit_test(test_notif_means_landed_pull),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
