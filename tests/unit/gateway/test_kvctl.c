/*
 * test_kvctl.c - the gateway's KV control service as a forwarder sees it (forwarder.h
 * pdgw_fwd_kv_opts_parse, pdgw_fwd_kv_svc_*, pdgw_fwd_kv_req_*), driven over real loopback
 * ZeroMQ sockets: which ProxyNotifs count, the notif deadline and its fallbacks, the
 * CancelNotif of an attempt that did not complete, and the stop at server shutdown.
 *
 * Wire facts: LMCache's sender PUSHes one msgpack ProxyNotif{req_id} per TP rank to the
 * proxy's PULL (LMCache lmcache/v1/storage_backend/pd_backend.py, _init_sender and
 * batched_submit_put_task); the receiver's alloc socket takes [b"", payload] from a DEALER
 * (our libkvt, kvtransfer/src/kvt_ctrl_proxy.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>

#include <cmocka.h>
#include <zmq.h>

#include <kvt/kvt_msg.h>
#include <kvt/kvt_status.h>
#include <pdgw/forwarder.h>

#include "pdgw_kvctl.h"
#include "pdgw_server_int.h" /* a worker's loop: its epoll set and the tag of its events */

#include <sys/epoll.h>
#include <unistd.h>

#define WAIT_MS 20000 /* generous: only a broken service ever waits this long */

static const pdgw_instance_t p_local = {.id = "p-local", .host = "127.0.0.1", .kv_host = ""};
static const pdgw_instance_t p_far = {.id = "p-far", .host = "10.9.9.9", .kv_host = "10.9.9.10"};

/* The services this test owns, as a server owns its forwarder's (pdgw_kvctl_svcs.c). */
static pdgw_fwd_kv_svcs_t *owned;

static pdgw_fwd_kv_svc_t *svc_open(const char *opts_json)
{
    json_t *opts = json_loads(opts_json, 0, NULL);
    pdgw_fwd_kv_opts_t o;
    pdgw_fwd_kv_svc_t *svc = NULL;
    pdgw_fwd_env_t env = {.protocol = "test-kv", .kv_svcs = owned};
    char err[256] = "";
    assert_non_null(opts);
    assert_int_equal(pdgw_fwd_kv_opts_parse(opts, 0, 1, &o, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    assert_int_equal(pdgw_fwd_kv_svc_open_env(&env, &o, &svc, err, sizeof(err)), PDGW_FWD_OK);
    return svc;
}

static pdgw_fwd_request_t request(const char *id)
{
    pdgw_fwd_request_t r;
    memset(&r, 0, sizeof(r));
    r.request_id = id;
    r.mode = PDGW_MODE_BATCH;
    r.prompt_tokens = 10;
    return r;
}

/* The gate as the engine runs it without a waker: ask again until it is no longer PENDING. */
static pdgw_fwd_status_t wait_gate(pdgw_fwd_kv_req_t *q, const pdgw_fwd_request_t *r, int need,
                                   pdgw_fwd_error_t *e)
{
    int64_t end = pdgw_fwd_now_ms() + WAIT_MS;
    pdgw_fwd_status_t st;
    while ((st = pdgw_fwd_kv_req_wait_notifs(q, r, need, e)) == PDGW_FWD_PENDING &&
           pdgw_fwd_now_ms() < end) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return st;
}

static void push_notif(void *push, const char *req_id)
{
    kvt_msg_t m;
    void *data = NULL;
    size_t len = 0;
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    assert_int_equal(kvt_msg_set_str(&m.u.proxy_notif.req_id, req_id), KVT_OK);
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    assert_int_equal(zmq_send(push, data, len, 0), (int)len);
    kvt_free(data);
    kvt_msg_clear(&m);
}

/* A notice counts only for an attempt in flight, from its prefill's address, once per TP
 * rank: garbage, unknown ids and a notice from the wrong host never release a decode. */
static void test_notifs_checked(void **state)
{
    pdgw_fwd_kv_svc_t *svc = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                      "\"notif_timeout_ms\":600000}");
    pdgw_fwd_request_t r1 = request("req-1"), r2 = request("req-2");
    pdgw_fwd_kv_req_t *q1 = pdgw_fwd_kv_req_new(svc, &r1, r1.request_id);
    pdgw_fwd_kv_req_t *q2 = pdgw_fwd_kv_req_new(svc, &r2, r2.request_id);
    pdgw_fwd_error_t e;
    void *zctx = zmq_ctx_new(), *push = zmq_socket(zctx, ZMQ_PUSH);
    char ep[64];
    (void)state;
    assert_non_null(q1);
    assert_non_null(q2);
    assert_string_equal(pdgw_fwd_kv_req_id(q1), "req-1");
    assert_true(pdgw_fwd_kv_svc_notif_port(svc) > 0);
    pdgw_fwd_kv_req_expect_notifs(q1, 2, &p_local);
    pdgw_fwd_kv_req_expect_notifs(q2, 1, &p_far);
    memset(&e, 0, sizeof(e));
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q1, &r1, 2, &e), PDGW_FWD_PENDING);

    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", pdgw_fwd_kv_svc_notif_port(svc));
    assert_int_equal(zmq_connect(push, ep), 0);
    assert_int_equal(zmq_send(push, "garbage", 7, 0), 7);
    push_notif(push, "req-unknown");
    push_notif(push, "req-2"); /* from 127.0.0.1, but req-2's prefill is 10.9.9.9 */
    push_notif(push, "req-1");
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q1, &r1, 2, &e), PDGW_FWD_PENDING);
    push_notif(push, "req-1");
    push_notif(push, "req-1"); /* surplus: ignored */
    assert_int_equal(wait_gate(q1, &r1, 2, &e), PDGW_FWD_OK);
    /* One PUSH, one PULL: the notices are taken in order, so req-2's was seen before req-1
     * completed, and did not count. */
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q2, &r2, 1, &e), PDGW_FWD_PENDING);

    pdgw_fwd_kv_req_end(q1, PDGW_END_OK);
    pdgw_fwd_kv_req_end(q2, PDGW_END_CANCELLED);
    zmq_close(push);
    zmq_ctx_term(zctx);
    pdgw_fwd_kv_svc_close(svc);
}

/* At notif_timeout_ms the decode gate fails with 504 kv_transfer, or goes on with
 * notif_fallback: decode; skip_proxy_notification never waits. */
static void test_notif_deadline(void **state)
{
    static const char *const cfg[] = {
        "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"notif_timeout_ms\":1}",
        "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"notif_timeout_ms\":1,"
        "\"notif_fallback\":\"decode\"}",
        "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"skip_proxy_notification\":true}",
    };
    (void)state;
    for (int i = 0; i < 3; i++) {
        pdgw_fwd_kv_svc_t *svc = svc_open(cfg[i]);
        pdgw_fwd_request_t r = request("req-late");
        pdgw_fwd_kv_req_t *q = pdgw_fwd_kv_req_new(svc, &r, r.request_id);
        pdgw_fwd_error_t e;
        memset(&e, 0, sizeof(e));
        pdgw_fwd_kv_req_expect_notifs(q, 1, &p_local);
        if (i == 0) {
            assert_int_equal(wait_gate(q, &r, 1, &e), PDGW_FWD_ERR);
            assert_int_equal(e.http_status, 504);
            assert_int_equal(e.phase, PDGW_PHASE_KV_TRANSFER);
            assert_non_null(strstr(e.message, "req-late"));
        } else {
            assert_int_equal(wait_gate(q, &r, 1, &e), PDGW_FWD_OK);
        }
        pdgw_fwd_kv_req_end(q, PDGW_END_FAILED);
        pdgw_fwd_kv_svc_close(svc);
    }
}

/* An attempt that did not complete sends CancelNotif{req_id} to every alloc port of its
 * decode, and the service's stop at server shutdown sends it before the thread exits. */
static void test_cancel_and_shutdown(void **state)
{
    void *zctx = zmq_ctx_new(), *router = zmq_socket(zctx, ZMQ_ROUTER);
    char last[128];
    size_t ll = sizeof(last);
    int alloc_port[1];
    pdgw_instance_t dec = {.id = "d", .host = "127.0.0.1", .kv_host = "127.0.0.1"};
    pdgw_fwd_kv_svc_t *svc = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0}");
    pdgw_fwd_request_t r = request("req-cancel");
    pdgw_fwd_kv_req_t *q = pdgw_fwd_kv_req_new(svc, &r, r.request_id);
    zmq_pollitem_t pi = {router, 0, ZMQ_POLLIN, 0};
    zmq_msg_t part;
    kvt_msg_t m;
    int more = 1;
    (void)state;
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, last, &ll), 0);
    alloc_port[0] = atoi(strrchr(last, ':') + 1);
    dec.alloc_ports = alloc_port;
    dec.n_alloc_ports = 1;
    pdgw_fwd_kv_req_set_decode(q, &dec);
    pdgw_fwd_kv_req_end(q, PDGW_END_FAILED);
    pdgw_kvctl_svcs_stop(owned);
    pdgw_kvctl_svcs_stop(owned); /* idempotent */

    assert_int_equal(zmq_poll(&pi, 1, WAIT_MS), 1);
    zmq_msg_init(&part);
    while (more) { /* [identity, "", payload]: keep the last frame */
        size_t ml = sizeof(more);
        zmq_msg_close(&part);
        zmq_msg_init(&part);
        assert_true(zmq_msg_recv(&part, router, 0) >= 0);
        assert_int_equal(zmq_getsockopt(router, ZMQ_RCVMORE, &more, &ml), 0);
    }
    memset(&m, 0, sizeof(m));
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), &m, NULL), KVT_OK);
    assert_int_equal(m.type, KVT_MSG_CANCEL_NOTIF);
    assert_string_equal(m.u.cancel.req_id, "req-cancel");
    kvt_msg_clear(&m);
    zmq_msg_close(&part);
    pdgw_fwd_kv_svc_close(svc); /* after the stop: frees without waiting */
    zmq_close(router);
    zmq_ctx_term(zctx);
}

/* Wait for one message on <router> (a decode's alloc port) and return its CancelNotif req_id. */
static void recv_cancel(void *router, char *id, size_t cap)
{
    zmq_pollitem_t pi = {router, 0, ZMQ_POLLIN, 0};
    zmq_msg_t part;
    kvt_msg_t m;
    int more = 1;
    assert_int_equal(zmq_poll(&pi, 1, WAIT_MS), 1);
    zmq_msg_init(&part);
    while (more) { /* [identity, "", payload]: keep the last frame */
        size_t ml = sizeof(more);
        zmq_msg_close(&part);
        zmq_msg_init(&part);
        assert_true(zmq_msg_recv(&part, router, 0) >= 0);
        assert_int_equal(zmq_getsockopt(router, ZMQ_RCVMORE, &more, &ml), 0);
    }
    memset(&m, 0, sizeof(m));
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), &m, NULL), KVT_OK);
    assert_int_equal(m.type, KVT_MSG_CANCEL_NOTIF);
    snprintf(id, cap, "%s", m.u.cancel.req_id);
    kvt_msg_clear(&m);
    zmq_msg_close(&part);
}

/* Ended attempts are remembered (bounded) so a transfer that lands after its attempt failed is
 * released: past KVCTL_TOMB_MAX ended attempts the oldest make room, so the newest failure is
 * still known when its late ProxyNotif comes (a full table that refused new entries would
 * leave that transfer pinned on the decode). A live attempt's notices still count. */
static void test_tombs_keep_newest(void **state)
{
    void *zctx = zmq_ctx_new(), *router = zmq_socket(zctx, ZMQ_ROUTER),
         *push = zmq_socket(zctx, ZMQ_PUSH);
    char last[128], ep[64], id[64];
    size_t ll = sizeof(last);
    int alloc_port[1];
    pdgw_instance_t dec = {.id = "d", .host = "127.0.0.1", .kv_host = "127.0.0.1"};
    pdgw_fwd_kv_svc_t *svc = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                      "\"notif_timeout_ms\":600000}");
    pdgw_fwd_request_t rf = request("req-failed"), rl = request("req-live");
    pdgw_fwd_kv_req_t *qf, *ql;
    pdgw_fwd_error_t e;
    (void)state;
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, last, &ll), 0);
    alloc_port[0] = atoi(strrchr(last, ':') + 1);
    dec.alloc_ports = alloc_port;
    dec.n_alloc_ports = 1;

    for (int i = 0; i < KVCTL_TOMB_MAX + 100; i++) {
        pdgw_fwd_request_t r;
        pdgw_fwd_kv_req_t *q;
        snprintf(id, sizeof(id), "req-done-%d", i);
        r = request(id);
        q = pdgw_fwd_kv_req_new(svc, &r, r.request_id);
        assert_non_null(q);
        pdgw_fwd_kv_req_expect_notifs(q, 1, &p_local);
        pdgw_fwd_kv_req_end(q, PDGW_END_OK);
    }
    pthread_mutex_lock(&svc->lock);
    assert_int_equal(svc->n_tombs, KVCTL_TOMB_MAX);
    assert_null(pdgw_kvctl_tomb_find_locked(svc, "req-done-0"));
    assert_non_null(pdgw_kvctl_tomb_find_locked(svc, "req-done-100"));
    pthread_mutex_unlock(&svc->lock);

    qf = pdgw_fwd_kv_req_new(svc, &rf, rf.request_id);
    ql = pdgw_fwd_kv_req_new(svc, &rl, rl.request_id);
    pdgw_fwd_kv_req_set_decode(qf, &dec);
    pdgw_fwd_kv_req_expect_notifs(qf, 1, &p_local);
    pdgw_fwd_kv_req_expect_notifs(ql, 1, &p_local);
    pdgw_fwd_kv_req_end(qf, PDGW_END_FAILED);
    recv_cancel(router, id, sizeof(id)); /* the failed attempt's own release */
    assert_string_equal(id, "req-failed");

    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", pdgw_fwd_kv_svc_notif_port(svc));
    assert_int_equal(zmq_connect(push, ep), 0);
    push_notif(push, "req-failed"); /* its transfer landed after all */
    push_notif(push, "req-live");
    memset(&e, 0, sizeof(e));
    assert_int_equal(wait_gate(ql, &rl, 1, &e), PDGW_FWD_OK);
    recv_cancel(router, id, sizeof(id)); /* released again */
    assert_string_equal(id, "req-failed");

    pdgw_fwd_kv_req_end(ql, PDGW_END_OK);
    zmq_close(push);
    pdgw_fwd_kv_svc_close(svc);
    zmq_close(router);
    zmq_ctx_term(zctx);
}

/* A reload's live options (pdgw_kvctl_apply): a larger admission capacity admits the
 * waiter that now fits; a shorter notif deadline holds for attempts that wait from now on. */
static void test_apply_live(void **state)
{
    pdgw_fwd_kv_svc_t *svc = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                      "\"chunk_tokens\":10,\"admission_chunks\":1,"
                                      "\"notif_timeout_ms\":600000}");
    json_t *opts = json_loads("{\"chunk_tokens\":10,\"admission_chunks\":2,"
                              "\"notif_timeout_ms\":1}",
                              0, NULL);
    pdgw_fwd_request_t ra = request("req-a"), rb = request("req-b");
    pdgw_fwd_kv_req_t *qa = pdgw_fwd_kv_req_new(svc, &ra, ra.request_id);
    pdgw_fwd_kv_req_t *qb = pdgw_fwd_kv_req_new(svc, &rb, rb.request_id);
    pdgw_fwd_kv_opts_t o;
    pdgw_fwd_error_t e;
    char err[256];
    (void)state;
    memset(&e, 0, sizeof(e));
    assert_int_equal(pdgw_fwd_kv_req_before_prefill(qa, &ra, NULL, &e), PDGW_FWD_OK);
    assert_int_equal(pdgw_fwd_kv_req_before_prefill(qb, &rb, NULL, &e), PDGW_FWD_PENDING);
    assert_int_equal(pdgw_fwd_kv_opts_parse(opts, 0, 1, &o, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    pdgw_kvctl_svcs_apply(owned, &o);
    assert_int_equal(pdgw_fwd_kv_req_before_prefill(qb, &rb, NULL, &e), PDGW_FWD_OK);
    pdgw_fwd_kv_req_expect_notifs(qb, 1, &p_local);
    assert_int_equal(wait_gate(qb, &rb, 1, &e), PDGW_FWD_ERR);
    assert_int_equal(e.http_status, 504);
    assert_non_null(strstr(e.message, "within 1 ms"));
    pdgw_fwd_kv_req_end(qa, PDGW_END_OK);
    pdgw_fwd_kv_req_end(qb, PDGW_END_FAILED);
    pdgw_fwd_kv_svc_close(svc);
}

/* A libkvt receiver's alloc port (ROUTER) that grants every ReserveRequest, or refuses them
 * (refuse), answering free_chunks = free; while hold is set it leaves them queued (a receiver
 * slow to answer); until told to stop (tests/integration's fake answers the same way). */
typedef struct granter {
    void *router;
    int port;
    int64_t free;
    atomic_int stop, answered, hold, refuse;
    atomic_int holding; /* the thread saw hold set: nothing more is taken off the socket */
    pthread_t th;
} granter_t;

static void *grant_main(void *arg)
{
    granter_t *g = arg;
    while (!atomic_load(&g->stop)) {
        zmq_pollitem_t it = {.socket = g->router, .events = ZMQ_POLLIN};
        if (atomic_load(&g->hold)) {
            struct timespec ts = {0, 1000 * 1000};
            atomic_store(&g->holding, 1);
            nanosleep(&ts, NULL);
            continue;
        }
        atomic_store(&g->holding, 0);
        zmq_msg_t ident, delim, body;
        kvt_msg_t m, r;
        void *data = NULL;
        size_t len = 0;
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_init(&ident);
        zmq_msg_init(&delim);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&ident, g->router, 0) >= 0 && zmq_msg_recv(&delim, g->router, 0) >= 0 &&
            zmq_msg_recv(&body, g->router, 0) >= 0 &&
            kvt_msg_decode(zmq_msg_data(&body), zmq_msg_size(&body), &m, NULL) == KVT_OK) {
            if (m.type == KVT_MSG_RESERVE_REQUEST) {
                kvt_msg_init(&r, KVT_MSG_RESERVE_RESPONSE);
                r.u.reserve_resp.req_id = m.u.reserve_req.req_id;
                r.u.reserve_resp.granted = !atomic_load(&g->refuse);
                r.u.reserve_resp.free_chunks = g->free;
                if (kvt_msg_encode(&r, &data, &len) == KVT_OK) {
                    zmq_send(g->router, zmq_msg_data(&ident), zmq_msg_size(&ident), ZMQ_SNDMORE);
                    zmq_send(g->router, "", 0, ZMQ_SNDMORE);
                    /* counted before the answer leaves: a test that saw it sees the count */
                    atomic_fetch_add(&g->answered, 1);
                    zmq_send(g->router, data, len, 0);
                }
                free(data);
            }
            kvt_msg_clear(&m);
        }
        zmq_msg_close(&ident);
        zmq_msg_close(&delim);
        zmq_msg_close(&body);
    }
    return NULL;
}

/* Open a granting receiver answering free_chunks = <free>, and a decode that names it. */
static void granter_start(void *zctx, granter_t *g, int64_t free, pdgw_instance_t *dec,
                          int *alloc_port)
{
    char last[64];
    size_t ll = sizeof(last);
    int zero = 0;
    g->free = free;
    g->router = zmq_socket(zctx, ZMQ_ROUTER);
    zmq_setsockopt(g->router, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(g->router, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(g->router, ZMQ_LAST_ENDPOINT, last, &ll), 0);
    *alloc_port = atoi(strrchr(last, ':') + 1);
    dec->alloc_ports = alloc_port;
    dec->n_alloc_ports = 1;
    assert_int_equal(pthread_create(&g->th, NULL, grant_main, g), 0);
}

/* A KV control service and a decode whose one alloc port is a granter answering free_chunks
 * = <free>: the reservation tests' stage. */
typedef struct res_stage {
    void *zctx;
    granter_t g;
    int alloc_port[1];
    pdgw_instance_t dec;
    pdgw_fwd_kv_svc_t *svc;
} res_stage_t;

static void res_stage_open(res_stage_t *t, int64_t free)
{
    memset(t, 0, sizeof(*t));
    t->zctx = zmq_ctx_new();
    t->dec = (pdgw_instance_t){.id = "d", .host = "127.0.0.1", .kv_host = "127.0.0.1"};
    t->svc = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,\"reserve\":true,"
                      "\"reserve_timeout_ms\":10000}");
    granter_start(t->zctx, &t->g, free, &t->dec, t->alloc_port);
}

static void res_stage_close(res_stage_t *t)
{
    pdgw_fwd_kv_svc_close(t->svc);
    atomic_store(&t->g.stop, 1);
    pthread_join(t->g.th, NULL);
    zmq_close(t->g.router);
    zmq_ctx_term(t->zctx);
}

typedef struct asker {
    pdgw_fwd_kv_svc_t *svc;
    const pdgw_instance_t *dec;
    int n, granted;
    char prefix[16];
    pthread_t th;
} asker_t;

/* A worker: each of its requests reserves (sent from this thread), waits for the service
 * thread to collect the answer, and ends. */
static void *ask_main(void *arg)
{
    asker_t *a = arg;
    for (int i = 0; i < a->n; i++) {
        char id[32];
        pdgw_fwd_request_t r;
        pdgw_fwd_kv_req_t *q;
        pdgw_fwd_error_t e;
        pdgw_fwd_status_t st;
        int64_t end = pdgw_fwd_now_ms() + WAIT_MS;
        snprintf(id, sizeof(id), "%s-%d", a->prefix, i);
        r = request(id);
        q = pdgw_fwd_kv_req_new(a->svc, &r, r.request_id);
        memset(&e, 0, sizeof(e));
        while ((st = pdgw_fwd_kv_req_before_prefill(q, &r, a->dec, &e)) == PDGW_FWD_PENDING &&
               pdgw_fwd_now_ms() < end) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
        if (st == PDGW_FWD_OK) {
            pthread_mutex_lock(&a->svc->lock);
            a->granted += q->res == RES_GRANTED;
            pthread_mutex_unlock(&a->svc->lock);
        }
        pdgw_fwd_kv_req_end(q, PDGW_END_OK);
    }
    return NULL;
}

/* Reservations sent from two worker threads at once, their answers collected by the service
 * thread (the client, the reservations in flight and the muted ports are shared under
 * client_lock): every one is granted, none is lost. */
static void test_reservations_from_workers(void **state)
{
    res_stage_t t;
    asker_t a[2];
    (void)state;
    res_stage_open(&t, 1); /* room for one: every request waits */
    a[0] = (asker_t){.svc = t.svc, .dec = &t.dec, .n = 50, .prefix = "wa"};
    a[1] = (asker_t){.svc = t.svc, .dec = &t.dec, .n = 50, .prefix = "wb"};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&a[i].th, NULL, ask_main, &a[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(a[i].th, NULL);
    assert_int_equal(a[0].granted + a[1].granted, 100);
    assert_int_equal(atomic_load(&t.g.answered), 100);
    res_stage_close(&t);
}

/* A worker that sends a reservation is woken by its answer itself: the socket joins the
 * worker loop's epoll set, tagged as a KV control socket, and the answer makes it ready; the
 * worker's drain grants the request, with no hand-over from the service thread. (The service
 * thread drains at every turn it takes, so now and then it takes an answer first. It has no period: like the worker's loop, the test waits on the socket again
 * when a readiness came before the answer, from the connection.) */
static void test_reservation_wakes_its_worker(void **state)
{
    res_stage_t t;
    int woken = 0, granted = 0;
    pdgw_worker_t w;
    (void)state;
    memset(&w, 0, sizeof(w));
    w.epfd = epoll_create1(EPOLL_CLOEXEC);
    assert_true(w.epfd >= 0);
    res_stage_open(&t, 1); /* room for one: every request waits */
    pdgw_this_worker = &w;
    for (int i = 0; i < 20; i++) {
        char id[32];
        pdgw_fwd_request_t r;
        pdgw_fwd_kv_req_t *q;
        pdgw_fwd_error_t e;
        pdgw_fwd_status_t st;
        struct epoll_event ev;
        int64_t end = pdgw_fwd_now_ms() + WAIT_MS;
        snprintf(id, sizeof(id), "ww-%d", i);
        r = request(id);
        q = pdgw_fwd_kv_req_new(t.svc, &r, r.request_id);
        memset(&e, 0, sizeof(e));
        int was_woken = 0;
        assert_int_equal(pdgw_fwd_kv_req_before_prefill(q, &r, &t.dec, &e), PDGW_FWD_PENDING);
        while ((st = pdgw_fwd_kv_req_before_prefill(q, &r, &t.dec, &e)) == PDGW_FWD_PENDING &&
               pdgw_fwd_now_ms() < end) {
            if (epoll_wait(w.epfd, &ev, 1, 50) == 1) {
                assert_int_equal((int)((ev.data.u64 >> 32) & 0xffu), PDGW_EV_KVCTL);
                was_woken = 1;
                pdgw_kvctl_svcs_worker_ready(owned);
            }
        }
        woken += was_woken;
        assert_int_equal(st, PDGW_FWD_OK);
        pthread_mutex_lock(&t.svc->lock);
        granted += q->res == RES_GRANTED;
        pthread_mutex_unlock(&t.svc->lock);
        pdgw_fwd_kv_req_end(q, PDGW_END_OK);
    }
    pdgw_this_worker = NULL;
    print_message("reservations: 20 granted %d, woke their worker %d\n", granted, woken);
    assert_int_equal(granted, 20);
    /* how many the worker takes before the service thread depends on scheduling (a quarter
     * under ThreadSanitizer, most in a plain build): that some do proves the path */
    assert_true(woken >= 1);
    res_stage_close(&t);
    close(w.epfd);
}

/* Ask for <id> at the gate once: its status. */
static pdgw_fwd_status_t gate_once(pdgw_fwd_kv_svc_t *svc, const pdgw_instance_t *dec,
                                   const char *id, pdgw_fwd_kv_req_t **out)
{
    pdgw_fwd_request_t r = request(id);
    pdgw_fwd_error_t e;
    memset(&e, 0, sizeof(e));
    *out = pdgw_fwd_kv_req_new(svc, &r, r.request_id);
    return pdgw_fwd_kv_req_before_prefill(*out, &r, dec, &e);
}

/* Wait until <q>'s reservation has its answer (RES_ASKING no more): that state. */
static res_state_t answered(pdgw_fwd_kv_svc_t *svc, pdgw_fwd_kv_req_t *q)
{
    int64_t end = pdgw_fwd_now_ms() + WAIT_MS;
    res_state_t res;
    for (;;) {
        struct timespec ts = {0, 200 * 1000};
        pthread_mutex_lock(&svc->lock);
        res = q->res;
        pthread_mutex_unlock(&svc->lock);
        if (res != RES_ASKING || pdgw_fwd_now_ms() >= end)
            return res;
        nanosleep(&ts, NULL);
    }
}

/* A request goes on before its reservation's answer only while the decode's last answer
 * (younger than KVCTL_ROOM_MS), less the chunks asked of it and not answered yet, leaves room
 * for it twice over; otherwise it waits. Its ReserveRequest is sent all the same, and a late
 * refusal leaves it going (unreserved), counted. */
static void test_reservation_goes_ahead_with_room(void **state)
{
    res_stage_t t;
    pdgw_fwd_kv_req_t *q[5];
    (void)state;
    res_stage_open(&t, 3); /* each request: one chunk; 3 free */
    /* nothing known of the decode yet: the first one waits for its answer */
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-0", &q[0]), PDGW_FWD_PENDING);
    assert_int_equal(answered(t.svc, q[0]), RES_GRANTED);
    assert_int_equal(q[0]->ahead, 0);
    /* 3 free, nothing unanswered: room for 1 twice over; the receiver holds its answers (once
     * its thread is out of the poll it may be in) */
    atomic_store(&t.g.hold, 1);
    for (int64_t end = pdgw_fwd_now_ms() + WAIT_MS;
         !atomic_load(&t.g.holding) && pdgw_fwd_now_ms() < end;) {
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&t.g.holding));
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-1", &q[1]), PDGW_FWD_OK);
    assert_int_equal(q[1]->ahead, 1);
    /* 3 free less 1 unanswered: still twice over */
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-2", &q[2]), PDGW_FWD_OK);
    /* 3 free less 2 unanswered: room for one, not two: this one waits */
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-3", &q[3]), PDGW_FWD_PENDING);
    assert_int_equal(q[3]->ahead, 0);
    assert_int_equal(atomic_load(&t.g.answered), 1);
    /* every ReserveRequest was sent: the held ones are answered once the receiver goes on */
    atomic_store(&t.g.hold, 0);
    assert_int_equal(answered(t.svc, q[1]), RES_GRANTED);
    assert_int_equal(answered(t.svc, q[2]), RES_GRANTED);
    assert_int_equal(answered(t.svc, q[3]), RES_GRANTED);
    assert_int_equal(atomic_load(&t.g.answered), 4);
    /* the gate asked again after going ahead does not ask twice */
    {
        pdgw_fwd_request_t r = request("ga-1");
        pdgw_fwd_error_t e;
        memset(&e, 0, sizeof(e));
        assert_int_equal(pdgw_fwd_kv_req_before_prefill(q[1], &r, &t.dec, &e), PDGW_FWD_OK);
    }
    /* a late refusal: the request has gone on, nothing waits; the answer is counted */
    atomic_store(&t.g.refuse, 1);
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-4", &q[4]), PDGW_FWD_OK);
    assert_int_equal(answered(t.svc, q[4]), RES_REFUSED);
    assert_false(pdgw_fwd_kv_req_refused(q[4])); /* not a refusal its retry would re-pick on */
    pdgw_fwd_kv_req_end(q[4], PDGW_END_OK);
    atomic_store(&t.g.refuse, 0);
    /* an answer older than KVCTL_ROOM_MS says nothing: the next request waits again */
    pthread_mutex_lock(&t.svc->client_lock);
    for (int i = 0; i < KVCTL_ROOM_MAX; i++)
        if (t.svc->room[i].t_ms != 0)
            t.svc->room[i].t_ms -= KVCTL_ROOM_MS + 1;
    pthread_mutex_unlock(&t.svc->client_lock);
    for (int i = 0; i < 4; i++)
        pdgw_fwd_kv_req_end(q[i], PDGW_END_OK);
    assert_int_equal(gate_once(t.svc, &t.dec, "ga-5", &q[0]), PDGW_FWD_PENDING);
    assert_int_equal(answered(t.svc, q[0]), RES_GRANTED);
    pdgw_fwd_kv_req_end(q[0], PDGW_END_OK);
    res_stage_close(&t);
}

static void test_opts(void **state)
{
    static const struct {
        const char *json;
        const char *err; /* NULL = accepted */
    } cases[] = {
        {"{\"notif_relay_peers\":\"gw:9000\"}", "notif_relay_port"},
        {"{\"notif_curve_client_keys_file\":\"/k\"}", "notif_curve_secret_key_file"},
        {"{\"reserve_on_refusal\":\"maybe\"}", "reserve_on_refusal"},
        {"{\"chunk_tokens\":0}", "chunk_tokens"},
        {"{\"proxy_host\":\"*\"}", NULL},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *opts = json_loads(cases[i].json, 0, NULL);
        pdgw_fwd_kv_opts_t o;
        char err[256] = "";
        pdgw_fwd_status_t st = pdgw_fwd_kv_opts_parse(opts, 1, 1, &o, err, sizeof(err));
        json_decref(opts);
        if (cases[i].err == NULL) {
            assert_int_equal(st, PDGW_FWD_OK);
            assert_string_equal(o.proxy_host, "0.0.0.0");
            assert_int_equal(o.reserve, 1);
            assert_int_equal(o.chunk_tokens, 256);
            assert_int_equal(o.notif_check_peer, 1);
            /* no admission limit unless configured, as LMCache's current proxy
             * (LMCache examples/disagg_prefill/disagg_proxy_server.py) */
            assert_int_equal(o.admission_chunks, 0);
        } else {
            assert_int_equal(st, PDGW_FWD_ERR_CONFIG);
            assert_non_null(strstr(err, cases[i].err));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts),
        cmocka_unit_test(test_notifs_checked),
        cmocka_unit_test(test_notif_deadline),
        cmocka_unit_test(test_apply_live),
        cmocka_unit_test(test_tombs_keep_newest),
        cmocka_unit_test(test_cancel_and_shutdown),
        cmocka_unit_test(test_reservations_from_workers),
        cmocka_unit_test(test_reservation_wakes_its_worker),
        cmocka_unit_test(test_reservation_goes_ahead_with_room),
    };
    int failed;
    owned = pdgw_kvctl_svcs_create();
    failed = cmocka_run_group_tests(tests, NULL, NULL);
    pdgw_kvctl_svcs_destroy(owned);
    return failed;
}
