/*
 * test_task.c - the async task API against seed 001's list: the AllocRequest
 * a store builds from keys + chunk metadata; the receiver's alloc response
 * indexes; store end to end with eventfd completion; load copies the bytes
 * into the caller's buffer; lookup bitmap (and its lock); already-sent
 * chunks skip the transfer; partial allocation failure -> partial bitmap.
 * A fake receiver (raw ZeroMQ ROUTER sockets) plays the peer where the test
 * needs to see or shape the wire.
 */
#include <poll.h>
#include <stdatomic.h>
#include <zmq.h>

#include "test_engine_common.h"
#include "kvt/kvt_msg.h"
#include "kvt_tl_tcp_int.h" /* a TCP address blob for the fake receiver */

/* A test clock that moves only when told: time-outs fire because the test says so, not
 * because a loaded machine was slow. */
static atomic_ullong fake_ns = 1000ull * KVT_NSEC_PER_SEC;

static uint64_t fake_now(void *arg)
{
    (void)arg;
    return atomic_load(&fake_ns);
}

static const kvt_clock_t fake_clock = {.now = fake_now, .arg = NULL};

typedef struct fake_rx {
    void *ctx, *alloc, *init;
    uint16_t alloc_port, init_port;
} fake_rx_t;

static uint16_t bind_eph(void *s)
{
    char ep[128];
    size_t l = sizeof(ep);
    assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &l), 0);
    return (uint16_t)atoi(strrchr(ep, ':') + 1);
}

static void fake_open(fake_rx_t *f)
{
    int zero = 0;
    f->ctx = zmq_ctx_new();
    f->alloc = zmq_socket(f->ctx, ZMQ_ROUTER);
    f->init = zmq_socket(f->ctx, ZMQ_ROUTER);
    zmq_setsockopt(f->alloc, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(f->init, ZMQ_LINGER, &zero, sizeof(zero));
    f->alloc_port = bind_eph(f->alloc);
    f->init_port = bind_eph(f->init);
}

static void fake_close(fake_rx_t *f)
{
    zmq_close(f->alloc);
    zmq_close(f->init);
    zmq_ctx_term(f->ctx);
}

/* Receive [ident, payload] on a ROUTER within 5 s; decode the payload. */
static void router_recv(void *s, char *ident, size_t *ilen, kvt_msg_t *m)
{
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    zmq_msg_t f;
    assert_int_equal(zmq_poll(&it, 1, 5000), 1);
    zmq_msg_init(&f);
    assert_true(zmq_msg_recv(&f, s, 0) >= 0);
    *ilen = zmq_msg_size(&f);
    memcpy(ident, zmq_msg_data(&f), *ilen);
    zmq_msg_close(&f);
    zmq_msg_init(&f);
    assert_true(zmq_msg_recv(&f, s, 0) >= 0);
    if (zmq_msg_size(&f) == 0) {
        /* libkvt's DEALER sends [b"", payload], as a REQ would */
        zmq_msg_close(&f);
        zmq_msg_init(&f);
        assert_true(zmq_msg_recv(&f, s, 0) >= 0);
    }
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), m, NULL), KVT_OK);
    zmq_msg_close(&f);
}

static void router_send(void *s, const char *ident, size_t ilen, const kvt_msg_t *m)
{
    void *data;
    size_t len;
    assert_int_equal(kvt_msg_encode(m, &data, &len), KVT_OK);
    zmq_send(s, ident, ilen, ZMQ_SNDMORE);
    zmq_send(s, data, len, 0);
    kvt_free(data);
}

/* Answer the sender's transport handshake: the envelope names us, "addr" carries a TCP
 * address blob (never dialled: these tests end before any byte moves). */
static void fake_handshake(fake_rx_t *f)
{
    char ident[512];
    size_t il, bl = 128;
    uint8_t blob[128];
    kvt_msg_t m, r;

    router_recv(f->init, ident, &il, &m);
    assert_int_equal(m.type, KVT_MSG_TRANSPORT_INIT);
    assert_string_equal(m.u.tinit.transport, "tcp");
    assert_true(m.u.tinit.addr.n > 0); /* the sender's own address blob */
    kvt_msg_clear(&m);
    assert_int_equal(
        kvt_tcp_addr_pack("127.0.0.1", 9, "6f1c2a3b-4d5e-4f60-8172-839405a6b7c8", blob, &bl),
        KVT_OK);
    kvt_msg_init(&r, KVT_MSG_TRANSPORT_INIT);
    r.u.tinit.node_id = "fake-receiver";
    r.u.tinit.transport = "tcp";
    r.u.tinit.version = 1;
    r.u.tinit.addr.p = blob;
    r.u.tinit.addr.n = (uint32_t)bl;
    router_send(f->init, ident, il, &r);
}

static kvt_engine_t *sender_to(uint16_t aport, uint16_t iport, t_mode_t mode)
{
    kvt_config_t c;
    kvt_engine_t *e;
    kvt_engine_params_t ep = {
        .page_size = T_PAGE, .bind_host = "127.0.0.1", .ctrl_timeout_ms = 3000};
    t_cfg(&c, KVT_ROLE_SENDER, mode, 32 * T_PAGE, "tcp");
    c.pd_peer_alloc_port.v[0] = aport;
    c.pd_peer_init_port.v[0] = iport;
    ep.cfg = &c;
    assert_int_equal(kvt_engine_create(&ep, &e), KVT_OK);
    return e;
}

static void test_sender_store_builds_alloc_request(void **state)
{
    fake_rx_t f;
    kvt_engine_t *s;
    char **keys = t_keys("req-build", 3);
    kvt_status_t st;
    kvt_task_id_t id;
    char ident[512];
    size_t il;
    kvt_msg_t m, r;
    kvt_task_result_t res;
    kvt_metrics_t mt;
    (void)state;

    fake_open(&f);
    s = sender_to(f.alloc_port, f.init_port, MODE_PUSH);
    id = t_store(s, "req-build", keys, 0, 3, 5, 1, 3, &st);
    assert_int_equal(st, KVT_OK);
    fake_handshake(&f);
    router_recv(f.alloc, ident, &il, &m);
    assert_int_equal(m.type, KVT_MSG_ALLOC_REQUEST);
    assert_int_equal(m.u.alloc_req.keys.n, 3);
    for (int i = 0; i < 3; i++)
        assert_string_equal(m.u.alloc_req.keys.v[i], keys[i]);
    assert_int_equal(m.u.alloc_req.fmt, KVT_FMT_KV_2LTD);
    assert_int_equal(m.u.alloc_req.shape.n, 4);
    assert_int_equal(m.u.alloc_req.shape.v[2], T_TOKS);
    assert_string_equal(m.u.alloc_req.dtype, "half");
    assert_int_equal(m.u.alloc_req.last_chunk_toks, 5);
    assert_string_equal(m.u.alloc_req.req_id, "req-build");
    assert_true(m.u.alloc_req.is_last_batch);
    assert_int_equal(m.u.alloc_req.total_chunks, 3);
    /* DEALER identity "<local>-to-<peer>" */
    assert_true(il > strlen(kvt_engine_id(s)));
    assert_memory_equal(ident, kvt_engine_id(s), strlen(kvt_engine_id(s)));
    assert_memory_equal(ident + strlen(kvt_engine_id(s)), "-to-", 4);
    kvt_msg_clear(&m);

    /* already_sent for all three: no transfer at all, nothing stays pinned */
    kvt_msg_init(&r, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    for (int i = 0; i < 3; i++)
        kvt_int_list_push(&r.u.alloc_resp.already_sent_indexes, i);
    router_send(f.alloc, ident, il, &r);
    kvt_msg_clear(&r);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 3);
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &mt);
    assert_int_equal(mt.bytes_write, 0);
    assert_int_equal(mt.already_sent_total, 3);
    assert_true(t_pool_drained(s, 2000));
    kvt_engine_destroy(s);
    fake_close(&f);
    t_keys_free(keys, 3);
}

/* A REP receiver (LMCache's sync backend, LMCache-Ascend: pd_backend.py /
 * pd/receiver_mixin.py bind a REP on the alloc port) only takes requests
 * framed [b"", payload] -- what libkvt's DEALER sends. Its answer has no
 * kvt_ext, so the sender uses no pdgw extension with it. */
static void test_rep_receiver_framing(void **state)
{
    fake_rx_t f;
    kvt_engine_t *s;
    char **keys = t_keys("rep", 2);
    kvt_status_t st;
    kvt_task_id_t id;
    kvt_msg_t m, r;
    kvt_task_result_t res;
    zmq_msg_t fr;
    zmq_pollitem_t it;
    void *data;
    size_t len;
    int zero = 0;
    (void)state;

    fake_open(&f);
    zmq_close(f.alloc); /* a REP on the alloc port instead of the ROUTER */
    f.alloc = zmq_socket(f.ctx, ZMQ_REP);
    zmq_setsockopt(f.alloc, ZMQ_LINGER, &zero, sizeof(zero));
    f.alloc_port = bind_eph(f.alloc);
    s = sender_to(f.alloc_port, f.init_port, MODE_PUSH);
    id = t_store(s, "rep-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    fake_handshake(&f);
    it.socket = f.alloc;
    it.events = ZMQ_POLLIN;
    assert_int_equal(zmq_poll(&it, 1, 5000), 1);
    zmq_msg_init(&fr);
    assert_true(zmq_msg_recv(&fr, f.alloc, 0) >= 0); /* the REP stripped the delimiter */
    assert_false(zmq_msg_more(&fr));
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&fr), zmq_msg_size(&fr), &m, NULL), KVT_OK);
    zmq_msg_close(&fr);
    assert_int_equal(m.type, KVT_MSG_ALLOC_REQUEST);
    assert_int_equal(m.u.alloc_req.kvt_ext, KVT_MSG_EXT_VERSION);
    kvt_msg_clear(&m);
    /* LMCache-Ascend's failure answer: empty lists, alloc_failed */
    kvt_msg_init(&r, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    r.u.alloc_resp.alloc_failed = 1;
    assert_int_equal(kvt_msg_encode(&r, &data, &len), KVT_OK);
    assert_true(zmq_send(f.alloc, data, len, 0) >= 0);
    kvt_free(data);
    kvt_msg_clear(&r);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_ALLOC_FAILED);
    kvt_task_result_clear(&res);
    assert_true(t_pool_drained(s, 2000));
    kvt_engine_destroy(s);
    fake_close(&f);
    t_keys_free(keys, 2);
}

static void test_partial_alloc_failure(void **state)
{
    fake_rx_t f;
    kvt_engine_t *s;
    char **keys = t_keys("req-partial", 4);
    kvt_status_t st;
    kvt_task_id_t id;
    char ident[512];
    size_t il;
    kvt_msg_t m, r;
    kvt_task_result_t res;
    kvt_metrics_t mt;
    (void)state;

    fake_open(&f);
    s = sender_to(f.alloc_port, f.init_port, MODE_PUSH);
    id = t_store(s, "req-partial", keys, 0, 4, 0, 1, 4, &st);
    assert_int_equal(st, KVT_OK);
    fake_handshake(&f);
    router_recv(f.alloc, ident, &il, &m);
    kvt_msg_clear(&m);
    /* key 1 already there; keys 0, 2, 3 -> every slot failed (-1) */
    kvt_msg_init(&r, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    kvt_int_list_push(&r.u.alloc_resp.already_sent_indexes, 1);
    for (int i = 0; i < 3; i++) {
        kvt_int_list_push(&r.u.alloc_resp.remote_indexes, -1);
        kvt_str_list_push(&r.u.alloc_resp.remote_buffer_uuids, "");
    }
    router_send(f.alloc, ident, il, &r);
    kvt_msg_clear(&r);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 1);
    assert_true(kvt_bitmap_test(res.bitmap, 1));
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &mt);
    assert_int_equal(mt.alloc_failures_total, 3);
    assert_true(t_pool_drained(s, 2000));
    kvt_engine_destroy(s);
    fake_close(&f);
    t_keys_free(keys, 4);
}

static void test_receiver_alloc_response(void **state)
{
    t_pair_t p;
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    char ep[64];
    kvt_msg_t m, r;
    void *data;
    size_t len;
    zmq_pollitem_t it = {.socket = d, .events = ZMQ_POLLIN};
    zmq_msg_t f;
    int zero = 0;
    const char *ids[4] = {"k0", "k1", "k2", "k3"};
    kvt_pool_stats_t ps;
    (void)state;

    assert_int_equal(t_pair_open(&p, MODE_PUSH, 16 * T_PAGE, 16 * T_PAGE, "tcp"), KVT_OK);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(d, ZMQ_ROUTING_ID, "fake-sender-to-x", 16);
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", p.rp.alloc_port);
    assert_int_equal(zmq_connect(d, ep), 0);
    for (int round = 0; round < 2; round++) {
        kvt_msg_init(&m, KVT_MSG_ALLOC_REQUEST);
        kvt_str_list_set(&m.u.alloc_req.keys, ids, 4);
        m.u.alloc_req.fmt = KVT_FMT_KV_2LTD;
        int64_t shape[4] = {2, T_LAYERS, T_TOKS, T_HIDDEN};
        kvt_int_list_set(&m.u.alloc_req.shape, shape, 4);
        kvt_msg_set_str(&m.u.alloc_req.dtype, "half");
        m.u.alloc_req.last_chunk_toks = 3;
        kvt_msg_set_str(&m.u.alloc_req.req_id, "");
        m.u.alloc_req.kvt_ext = KVT_MSG_EXT_VERSION; /* a libkvt sender: Ascend layout */
        assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
        zmq_send(d, data, len, 0);
        kvt_free(data);
        kvt_msg_clear(&m);
        assert_int_equal(zmq_poll(&it, 1, 5000), 1);
        zmq_msg_init(&f);
        assert_true(zmq_msg_recv(&f, d, 0) >= 0);
        assert_int_equal(kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &r, NULL), KVT_OK);
        zmq_msg_close(&f);
        assert_int_equal(r.type, KVT_MSG_ASCEND_ALLOC_RESPONSE);
        assert_false(r.u.alloc_resp.alloc_failed);
        if (round == 0) {
            assert_int_equal(r.u.alloc_resp.already_sent_indexes.n, 0);
            assert_int_equal(r.u.alloc_resp.remote_indexes.n, 4);
            assert_int_equal(r.u.alloc_resp.remote_buffer_uuids.n, 4);
            for (int i = 0; i < 4; i++) {
                assert_in_range(r.u.alloc_resp.remote_indexes.v[i], 0, 15);
                assert_int_equal(strlen(r.u.alloc_resp.remote_buffer_uuids.v[i]), 36);
                for (int k = 0; k < i; k++)
                    assert_int_not_equal(r.u.alloc_resp.remote_indexes.v[i],
                                         r.u.alloc_resp.remote_indexes.v[k]);
            }
        } else {
            /* the same keys again: all already sent, nothing allocated */
            assert_int_equal(r.u.alloc_resp.already_sent_indexes.n, 4);
            assert_int_equal(r.u.alloc_resp.remote_indexes.n, 0);
        }
        kvt_msg_clear(&r);
    }
    kvt_engine_pool_stats(p.r, &ps);
    assert_int_equal(ps.used_pages, 4);
    assert_int_equal(kvt_release(p.r, ids, 4), 4);
    assert_true(t_pool_drained(p.r, 1000));
    zmq_close(d);
    zmq_ctx_term(ctx);
    t_pair_close(&p);
}

/* store end to end, eventfd completion, load copies bytes, lookup bitmap */
static void test_store_load_lookup(void **state)
{
    t_pair_t p;
    char **keys = t_keys("req-e2e", 5);
    kvt_status_t st;
    kvt_task_id_t id, wid, lid, kid;
    kvt_task_result_t res[4];
    struct pollfd pfd;
    size_t got = 0;
    uint8_t *bufs[6];
    size_t caps[6], lens[6];
    const char *look[3];
    kvt_pool_stats_t ps;
    (void)state;

    assert_int_equal(t_pair_open(&p, MODE_PUSH, 32 * T_PAGE, 32 * T_PAGE, "tcp"), KVT_OK);
    id = t_store(p.s, "req-e2e", keys, 0, 5, 7, 1, 5, &st);
    assert_int_equal(st, KVT_OK);
    pfd.fd = kvt_engine_event_fd(p.s);
    pfd.events = POLLIN;
    for (uint64_t end = t_now_ms() + 5000; got == 0 && t_now_ms() < end;) {
        if (poll(&pfd, 1, 100) == 1)
            got = kvt_task_poll(p.s, res, 4);
    }
    assert_int_equal(got, 1);
    assert_int_equal(res[0].id, id);
    assert_int_equal(res[0].kind, KVT_TASK_STORE);
    assert_int_equal(res[0].status, KVT_OK);
    assert_int_equal(t_bits(&res[0]), 5);
    kvt_task_result_clear(&res[0]);
    assert_int_equal(kvt_task_poll(p.s, res, 4), 0);

    assert_int_equal(kvt_submit_wait_req(p.r, "req-e2e", 5000, NULL, &wid), KVT_OK);
    assert_int_equal(t_wait(p.r, wid, 6000, &res[0]), KVT_OK);
    assert_int_equal(res[0].status, KVT_OK);
    kvt_task_result_clear(&res[0]);

    /* load into caller buffers: bytes copied; an unknown key stays clear */
    const char *lk[6] = {keys[0], keys[1], keys[2], keys[3], keys[4], "nope"};
    for (int i = 0; i < 6; i++) {
        bufs[i] = calloc(1, T_PAGE);
        caps[i] = T_PAGE;
        lens[i] = 0;
    }
    assert_int_equal(kvt_submit_load(p.r, lk, (void *const *)bufs, caps, lens, 6, NULL, &lid),
                     KVT_OK);
    assert_int_equal(t_wait(p.r, lid, 5000, &res[0]), KVT_OK);
    assert_int_equal(t_bits(&res[0]), 5);
    assert_false(kvt_bitmap_test(res[0].bitmap, 5));
    for (int i = 0; i < 5; i++) {
        assert_int_equal(lens[i], i == 4 ? t_chunk_len(7) : T_PAGE);
        assert_true(t_check(keys[i], bufs[i], lens[i]));
    }
    kvt_task_result_clear(&res[0]);

    /* lookup: present -> bit set and locked until kvt_unlock */
    look[0] = keys[1];
    look[1] = "absent";
    look[2] = keys[3];
    assert_int_equal(kvt_submit_lookup(p.r, look, 3, NULL, &kid), KVT_OK);
    assert_int_equal(t_wait(p.r, kid, 1000, &res[0]), KVT_OK);
    assert_int_equal(res[0].kind, KVT_TASK_LOOKUP);
    assert_true(kvt_bitmap_test(res[0].bitmap, 0));
    assert_false(kvt_bitmap_test(res[0].bitmap, 1));
    assert_true(kvt_bitmap_test(res[0].bitmap, 2));
    kvt_task_result_clear(&res[0]);
    assert_int_equal(kvt_release_req(p.r, "req-e2e"), 5);
    kvt_engine_pool_stats(p.r, &ps);
    assert_int_equal(ps.used_pages, 2); /* the two locked pages survive the release */
    kvt_unlock(p.r, look, 3);
    assert_true(t_pool_drained(p.r, 1000));
    assert_true(t_pool_drained(p.s, 1000));
    for (int i = 0; i < 6; i++)
        free(bufs[i]);
    t_keys_free(keys, 5);
    t_pair_close(&p);
}

static void test_task_wait_unknown_and_timeout(void **state)
{
    t_pair_t p;
    kvt_task_result_t res;
    kvt_task_id_t wid;
    (void)state;
    assert_int_equal(t_pair_open(&p, MODE_PUSH, 8 * T_PAGE, 8 * T_PAGE, "tcp"), KVT_OK);
    assert_int_equal(kvt_task_wait(p.r, 999999, 10, &res), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_submit_wait_req(p.r, "never", 100, NULL, &wid), KVT_OK);
    assert_int_equal(kvt_task_wait(p.r, wid, 0, &res), KVT_ERR_TIMEOUT);
    assert_int_equal(t_wait(p.r, wid, 3000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT);
    kvt_task_result_clear(&res);
    t_pair_close(&p);
}

/* A reply that comes after the timeout must never be taken as the answer to
 * the next request: the DEALER that missed it is closed and replaced. */
static void test_missed_reply_replaces_dealer(void **state)
{
    fake_rx_t f;
    kvt_engine_t *s;
    kvt_config_t c;
    kvt_engine_params_t ep = {.page_size = T_PAGE,
                              .bind_host = "127.0.0.1",
                              .ctrl_timeout_ms = 300,
                              .clock = &fake_clock};
    char **keys = t_keys("late", 4);
    kvt_status_t st;
    kvt_task_id_t id;
    char ident[512], old_ident[512];
    size_t il, old_il;
    kvt_msg_t m, r;
    kvt_task_result_t res;
    kvt_metrics_t mt;
    (void)state;

    fake_open(&f);
    t_cfg(&c, KVT_ROLE_SENDER, MODE_PUSH, 32 * T_PAGE, "tcp");
    c.pd_peer_alloc_port.v[0] = f.alloc_port;
    c.pd_peer_init_port.v[0] = f.init_port;
    c.pd_alloc_fail_backoff_ttl = 0.1;
    ep.cfg = &c;
    assert_int_equal(kvt_engine_create(&ep, &s), KVT_OK);
    id = t_store(s, "late-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    fake_handshake(&f);
    router_recv(f.alloc, ident, &il, &m); /* ... and no answer in time */
    kvt_msg_clear(&m);
    /* the sender's deadline: the control timeout plus the receiver's backoff TTL */
    atomic_fetch_add(&fake_ns, 401ull * KVT_NSEC_PER_MSEC);
    kvt_engine_clock_moved(s);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_TIMEOUT);
    kvt_task_result_clear(&res);
    atomic_fetch_add(&fake_ns, 200ull * KVT_NSEC_PER_MSEC); /* past any backoff of that peer */
    kvt_engine_clock_moved(s);
    memcpy(old_ident, ident, il);
    old_il = il;
    /* the next request arrives first; then the late answer of the first ("everything already
     * there") goes out before the second's own answer: a DEALER still answering to the old
     * identity would take it for the second request, deterministically */
    id = t_store(s, "late-2", keys, 2, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    router_recv(f.alloc, ident, &il, &m);
    assert_string_equal(m.u.alloc_req.req_id, "late-2");
    kvt_msg_clear(&m);
    assert_false(il == old_il && memcmp(ident, old_ident, il) == 0); /* a new DEALER */
    kvt_msg_init(&r, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    kvt_int_list_push(&r.u.alloc_resp.already_sent_indexes, 0);
    kvt_int_list_push(&r.u.alloc_resp.already_sent_indexes, 1);
    router_send(f.alloc, old_ident, old_il, &r);
    kvt_msg_clear(&r);
    kvt_msg_init(&r, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    for (int i = 0; i < 2; i++) {
        kvt_int_list_push(&r.u.alloc_resp.remote_indexes, -1);
        kvt_str_list_push(&r.u.alloc_resp.remote_buffer_uuids, "");
    }
    router_send(f.alloc, ident, il, &r);
    kvt_msg_clear(&r);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 0); /* not the stale "already sent" */
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &mt);
    assert_int_equal(mt.ctrl_timeouts_total, 1);
    assert_int_equal(mt.already_sent_total, 0);
    assert_true(t_pool_drained(s, 1000));
    kvt_engine_destroy(s);
    fake_close(&f);
    t_keys_free(keys, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sender_store_builds_alloc_request),
        cmocka_unit_test(test_rep_receiver_framing),
        cmocka_unit_test(test_partial_alloc_failure),
        cmocka_unit_test(test_receiver_alloc_response),
        cmocka_unit_test(test_store_load_lookup),
        cmocka_unit_test(test_task_wait_unknown_and_timeout),
        cmocka_unit_test(test_missed_reply_replaces_dealer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
