/*
 * test_alloc_guard.c - receiver pages cannot be pinned by strangers (kvt_alloc_guard.c).
 *
 * The strangers here speak the alloc port's wire themselves (a ZeroMQ DEALER sending
 * [b"", AllocRequest], what LMCache's PDBackendAsync sends, lmcache/v1/storage_backend/
 * pd_backend_async.py; libkvt's encoder writes its req_id / is_last_batch / total_chunks, so
 * the receiver answers them as that async backend: one remote index per key, -1 = refused):
 *   - a flood of AllocRequests nobody writes or claims holds the whole pool until
 *     pd_alloc_ttl, not a nanosecond less, then every page is free again (counted), while
 *     what the consumer claimed stays; a real libkvt transfer then gets the pages;
 *   - a late write into an allocation that expired is refused by the data port (the writer
 *     gets KVT_ERR_ACCESS, kvt_data_access_denied_total counts it) and holds no page;
 *   - one source address holds at most pd_alloc_quota of the pool unclaimed: a request
 *     beyond it waits for its sender's entries to be claimed, at most the backoff TTL, then an
 *     async sender gets -1 for every key, a libkvt sender a partial grant; another address
 *     (127.0.0.2) is answered meanwhile, and what the consumer claimed no longer counts;
 *   - a ReserveRequest cannot hold pages longer than pd_alloc_ttl, whatever ttl_ms it asks.
 *
 * Time is the engine's injectable clock: the test moves it, nothing sleeps for a TTL.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "test_engine_common.h"
#include "test_fake_clock.h"
#include "kvt/kvt_msg.h"
#include "kvt_engine_int.h" /* the progress thread's turn counter */
#include "kvt_tl_tcp_int.h" /* the late writer's TCP transport */

/* Move the clock by <ms> and wait until <e> ran a turn that saw it. */
static void advance_ms(kvt_engine_t *e, uint64_t ms)
{
    uint64_t t0 = atomic_load(&e->wakeups), until = t_now_ms() + 5000;

    atomic_fetch_add(&fake_ns, ms * KVT_NSEC_PER_MSEC);
    kvt_engine_clock_moved(e);
    while (atomic_load(&e->wakeups) < t0 + 1 && t_now_ms() < until)
        usleep(1000);
    assert_true(atomic_load(&e->wakeups) >= t0 + 1);
}

static uint32_t used_pages(kvt_engine_t *e)
{
    kvt_pool_stats_t ps;
    kvt_engine_pool_stats(e, &ps);
    return ps.used_pages;
}

/* Wait (up to 5 s of wall time) until <e> uses <n> pages. */
static uint32_t used_reach(kvt_engine_t *e, uint32_t n)
{
    uint64_t until = t_now_ms() + 5000;
    while (used_pages(e) != n && t_now_ms() < until)
        usleep(1000);
    return used_pages(e);
}

static kvt_metrics_t metrics(kvt_engine_t *e)
{
    kvt_metrics_t m;
    kvt_engine_metrics(e, &m);
    return m;
}

/* A receiver of <pages> pages with <ttl> s and <quota>, on the test clock. */
static kvt_engine_t *receiver(uint32_t pages, double ttl, double quota)
{
    kvt_config_t c;
    kvt_engine_t *e;
    kvt_engine_params_t ep = {.page_size = T_PAGE, .bind_host = "127.0.0.1"};

    t_cfg(&c, KVT_ROLE_RECEIVER, MODE_PUSH, (uint64_t)pages * T_PAGE, "tcp");
    c.pd_alloc_ttl = ttl;
    c.pd_alloc_quota = quota;
    ep.cfg = &c;
    ep.clock = fake_clock_start();
    assert_int_equal(kvt_engine_create(&ep, &e), KVT_OK);
    return e;
}

/* ---- a stranger on the alloc port ---------------------------------------------------- */

typedef struct stranger {
    void *ctx, *d;
} stranger_t;

/* A DEALER to <port>, from <src> (NULL: the kernel's choice) with routing id <ident> (NULL:
 * libzmq's random one). */
static void stranger_open(stranger_t *s, uint16_t port, const char *src, const char *ident)
{
    char ep[128];
    int zero = 0, tmo = 5000;

    s->ctx = zmq_ctx_new();
    s->d = zmq_socket(s->ctx, ZMQ_DEALER);
    zmq_setsockopt(s->d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->d, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    if (ident != NULL)
        zmq_setsockopt(s->d, ZMQ_ROUTING_ID, ident, strlen(ident));
    if (src != NULL) /* libzmq's "source;destination" form binds the local address */
        snprintf(ep, sizeof(ep), "tcp://%s:0;127.0.0.1:%u", src, (unsigned)port);
    else
        snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", (unsigned)port);
    assert_int_equal(zmq_connect(s->d, ep), 0);
}

static void stranger_close(stranger_t *s)
{
    zmq_close(s->d);
    zmq_ctx_term(s->ctx);
}

static void stranger_send(stranger_t *s, const kvt_msg_t *m)
{
    void *data = NULL;
    size_t len = 0;

    assert_int_equal(kvt_msg_encode(m, &data, &len), KVT_OK);
    assert_true(zmq_send(s->d, "", 0, ZMQ_SNDMORE) >= 0);
    assert_true(zmq_send(s->d, data, len, 0) >= 0);
    kvt_free(data);
}

/* Whether an answer is waiting (within <ms> of wall time). */
static int stranger_answered(stranger_t *s, int ms)
{
    zmq_pollitem_t it = {.socket = s->d, .events = ZMQ_POLLIN};
    return zmq_poll(&it, 1, ms) == 1;
}

/* Decode the next answer's last frame into <out>. */
static void stranger_recv(stranger_t *s, kvt_msg_t *out)
{
    zmq_msg_t f;

    zmq_msg_init(&f);
    do {
        assert_true(zmq_msg_recv(&f, s->d, 0) >= 0);
    } while (zmq_msg_more(&f));
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), out, NULL), KVT_OK);
    zmq_msg_close(&f);
}

/* Send [b"", <m>] and decode the answer's last frame into <out>. */
static void stranger_ask(stranger_t *s, const kvt_msg_t *m, kvt_msg_t *out)
{
    stranger_send(s, m);
    stranger_recv(s, out);
}

/* AllocRequest for keys "<prefix>-<i>", i < n, of req <req>; kvt_ext: a libkvt sender. */
static void alloc_msg(kvt_msg_t *m, const char *prefix, uint32_t n, const char *req, int kvt_ext)
{
    char key[128];

    kvt_msg_init(m, KVT_MSG_ALLOC_REQUEST);
    for (uint32_t i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s-%u", prefix, i);
        assert_int_equal(kvt_str_list_push(&m->u.alloc_req.keys, key), KVT_OK);
    }
    m->u.alloc_req.fmt = KVT_FMT_KV_2LTD;
    kvt_int_list_push(&m->u.alloc_req.shape, 2);
    kvt_int_list_push(&m->u.alloc_req.shape, T_LAYERS);
    kvt_int_list_push(&m->u.alloc_req.shape, T_TOKS);
    kvt_int_list_push(&m->u.alloc_req.shape, T_HIDDEN);
    kvt_msg_set_str(&m->u.alloc_req.dtype, "half");
    kvt_msg_set_str(&m->u.alloc_req.req_id, req);
    m->u.alloc_req.kvt_ext = kvt_ext ? KVT_MSG_EXT_VERSION : 0;
}

static void stranger_send_alloc(stranger_t *s, const char *prefix, uint32_t n, const char *req,
                                int kvt_ext)
{
    kvt_msg_t m;

    alloc_msg(&m, prefix, n, req, kvt_ext);
    stranger_send(s, &m);
    kvt_msg_clear(&m);
}

/* The answer to an AllocRequest: how many slots were granted (index >= 0). <resp> (may be
 * NULL) gets the answer (the caller clears it). */
static uint32_t stranger_recv_alloc(stranger_t *s, kvt_msg_t *resp)
{
    kvt_msg_t r;
    uint32_t ok = 0;

    stranger_recv(s, &r);
    assert_true(r.type == KVT_MSG_ALLOC_RESPONSE || r.type == KVT_MSG_ALLOC_RESPONSE_ASYNC ||
                r.type == KVT_MSG_ASCEND_ALLOC_RESPONSE);
    for (uint32_t i = 0; i < r.u.alloc_resp.remote_indexes.n; i++)
        ok += r.u.alloc_resp.remote_indexes.v[i] >= 0;
    if (resp != NULL)
        *resp = r;
    else
        kvt_msg_clear(&r);
    return ok;
}

/* Ask for <n> chunks and wait for the answer (see stranger_recv_alloc). */
static uint32_t stranger_alloc(stranger_t *s, const char *prefix, uint32_t n, const char *req,
                               int kvt_ext, kvt_msg_t *resp)
{
    stranger_send_alloc(s, prefix, n, req, kvt_ext);
    return stranger_recv_alloc(s, resp);
}

static char **keys_of(const char *prefix, uint32_t n)
{
    char **k = calloc(n + 1, sizeof(char *));
    for (uint32_t i = 0; i < n; i++) {
        k[i] = malloc(strlen(prefix) + 16);
        sprintf(k[i], "%s-%u", prefix, i);
    }
    return k;
}

/* kvt_submit_lookup of <keys>: how many are here (and locked: claimed). */
static int lookup(kvt_engine_t *e, char **keys, uint32_t n)
{
    kvt_task_id_t id;
    kvt_task_result_t res;
    int bits;

    assert_int_equal(kvt_submit_lookup(e, (const char *const *)keys, n, NULL, &id), KVT_OK);
    assert_int_equal(t_wait(e, id, 5000, &res), KVT_OK);
    bits = t_bits(&res);
    kvt_task_result_clear(&res);
    return bits;
}

/* ---- tests --------------------------------------------------------------------------- */

/* 4 AllocRequests of 4 keys take all 16 pages and nobody writes or claims them (but two
 * keys, which the consumer looks up): held for pd_alloc_ttl (2 s) and not 1 ms less, then
 * freed in one batch and counted; the claimed two stay; a libkvt transfer gets the space. */
static void test_flood_expires_after_ttl(void **state)
{
    t_pair_t p;
    kvt_config_t sc, rc;
    stranger_t s;
    char prefix[32], **claimed = keys_of("flood0", 2), **keys = t_keys("real", 8);
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    kvt_metrics_t m;
    (void)state;

    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 16 * T_PAGE, "tcp");
    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 16 * T_PAGE, "tcp");
    rc.pd_alloc_ttl = 2.0;
    assert_int_equal(t_pair_open_ex(&p, &sc, &rc, fake_clock_start()), KVT_OK);
    stranger_open(&s, p.rp.alloc_port, NULL, NULL);
    for (int i = 0; i < 4; i++) {
        snprintf(prefix, sizeof(prefix), "flood%d", i);
        assert_int_equal(stranger_alloc(&s, prefix, 4, "", 0, NULL), 4);
    }
    assert_int_equal(used_pages(p.r), 16);
    /* the async backend's chunks are visible at once (as in LMCache): the consumer claims two */
    assert_int_equal(lookup(p.r, claimed, 2), 2);
    kvt_unlock(p.r, (const char *const *)claimed, 2);

    advance_ms(p.r, 1999);
    assert_int_equal(used_pages(p.r), 16);
    assert_int_equal(metrics(p.r).alloc_expired_total, 0);
    advance_ms(p.r, 1);
    assert_int_equal(used_reach(p.r, 2), 2); /* the claimed ones stay the consumer's */
    m = metrics(p.r);
    assert_int_equal(m.alloc_expired_total, 14);
    assert_int_equal(m.free_pages, 14);

    /* a real transfer gets the pages back, every byte verified */
    id = t_store(p.s, "real-1", keys, 0, 8, 0, 1, 8, &st);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(t_wait(p.s, id, 10000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), 8);
    kvt_task_result_clear(&res);
    assert_int_equal(kvt_submit_wait_req(p.r, "real-1", 5000, NULL, &id), KVT_OK);
    assert_int_equal(t_wait(p.r, id, 6000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);
    {
        uint8_t *bufs[8];
        size_t caps[8], lens[8];
        for (int i = 0; i < 8; i++) {
            bufs[i] = malloc(T_PAGE);
            caps[i] = T_PAGE;
        }
        assert_int_equal(kvt_submit_load(p.r, (const char *const *)keys, (void *const *)bufs, caps,
                                         lens, 8, NULL, &id),
                         KVT_OK);
        assert_int_equal(t_wait(p.r, id, 5000, &res), KVT_OK);
        assert_int_equal(t_bits(&res), 8);
        kvt_task_result_clear(&res);
        for (int i = 0; i < 8; i++) {
            assert_true(t_check(keys[i], bufs[i], lens[i]));
            free(bufs[i]);
        }
    }
    /* claimed by the load: a TTL later they are still the consumer's */
    advance_ms(p.r, 2500);
    assert_int_equal(used_pages(p.r), 10);
    assert_int_equal(metrics(p.r).alloc_expired_total, 14);
    kvt_release(p.r, (const char *const *)keys, 8);
    kvt_release(p.r, (const char *const *)claimed, 2);
    assert_true(t_pool_drained(p.r, 2000));
    stranger_close(&s);
    t_pair_close(&p);
    t_keys_free(keys, 8);
    t_keys_free(claimed, 2);
}

/* ---- a late writer: a libkvt sender's control plane and TCP transport, by hand --------- */

typedef struct writer {
    const kvt_tl_ops_t *ops;
    kvt_tl_t *tl;
    kvt_tl_region_t *reg;
    uint8_t *mem;
    char uuid[KVT_TL_UUID_LEN + 1];
    char rid[KVT_TL_PEER_ID_MAX + 1];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    kvt_status_t status;
} writer_t;

static void w_on_complete(void *arg, uint64_t cookie, kvt_status_t st)
{
    writer_t *w = arg;
    (void)cookie;
    pthread_mutex_lock(&w->mu);
    w->done++;
    w->status = st;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* The transport handshake with <r> (TransportInit on its init port) as node <id>. */
static void writer_open(writer_t *w, kvt_engine_t *r, const char *id)
{
    kvt_tl_config_t c = {.local_id = id, .listen_host = "127.0.0.1", .lanes = 1};
    kvt_tl_callbacks_t cb = {.on_complete = w_on_complete, .arg = w};
    kvt_tl_region_params_t rp;
    kvt_engine_ports_t ports;
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    stranger_t s;
    kvt_msg_t m, a;

    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->ops = kvt_transport_find("tcp")->ops;
    assert_int_equal(w->ops->create(&c, &cb, &w->tl), KVT_OK);
    w->mem = calloc(1, T_PAGE);
    t_fill("late", w->mem, T_PAGE);
    snprintf(w->uuid, sizeof(w->uuid), "0b5e4d3c-2a19-4f08-8e7d-6c5b4a392817");
    rp = (kvt_tl_region_params_t){
        .uuid = w->uuid, .base = w->mem, .length = T_PAGE, .page_size = T_PAGE};
    assert_int_equal(w->ops->reg_region(w->tl, &rp, &w->reg), KVT_OK);
    snprintf(w->rid, sizeof(w->rid), "%s", kvt_engine_id(r));
    assert_int_equal(w->ops->peer_prepare(w->tl, w->rid, blob, &bl), KVT_OK);
    kvt_engine_ports(r, &ports);
    stranger_open(&s, ports.init_port, NULL, NULL);
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    m.u.tinit.node_id = (char *)id;
    m.u.tinit.transport = "tcp";
    m.u.tinit.version = 1;
    m.u.tinit.addr.p = blob;
    m.u.tinit.addr.n = (uint32_t)bl;
    stranger_ask(&s, &m, &a); /* borrowed strings in <m>: nothing to clear */
    assert_int_equal(a.type, KVT_MSG_TRANSPORT_INIT);
    assert_int_equal(w->ops->peer_connect(w->tl, w->rid, a.u.tinit.addr.p, a.u.tinit.addr.n),
                     KVT_OK);
    kvt_msg_clear(&a);
    stranger_close(&s);
}

/* WRITE our page into (<uuid>, page <index>) of the receiver; the transport's answer. */
static kvt_status_t writer_write(writer_t *w, const char *uuid, int64_t index)
{
    kvt_tl_xfer_t x = {.local = w->reg, .local_offset = 0, .length = T_PAGE};
    struct timespec ts;
    int before;
    kvt_status_t st;

    snprintf(x.remote_uuid, sizeof(x.remote_uuid), "%s", uuid);
    x.remote_offset = (uint64_t)index * T_PAGE;
    pthread_mutex_lock(&w->mu);
    before = w->done;
    pthread_mutex_unlock(&w->mu);
    st = w->ops->post(w->tl, w->rid, KVT_TL_OP_WRITE, &x, 1, 1);
    if (st != KVT_OK)
        return st;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&w->mu);
    while (w->done == before)
        assert_int_equal(pthread_cond_timedwait(&w->cv, &w->mu, &ts), 0);
    st = w->status;
    pthread_mutex_unlock(&w->mu);
    return st;
}

static void writer_close(writer_t *w)
{
    w->ops->destroy(w->tl);
    free(w->mem);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* A libkvt sender that allocated, then went quiet past pd_alloc_ttl: its page is freed and
 * its WRITE grant revoked, so the late write is refused (KVT_ERR_ACCESS to the writer,
 * counted here), lands nowhere and leaves nothing held. The same write before the TTL went
 * through. */
static void test_write_after_expiry_refused(void **state)
{
    kvt_engine_t *r = receiver(8, 2.0, 1.0);
    char ident[512], **keys = keys_of("late", 1);
    writer_t w;
    stranger_t s;
    kvt_msg_t resp;
    char uuid[KVT_TL_UUID_LEN + 1];
    int64_t index;
    kvt_metrics_t m;
    (void)state;

    writer_open(&w, r, "late-writer");
    /* a libkvt sender's alloc channel: DEALER "<node>-to-<host:port>", kvt_ext set */
    {
        kvt_engine_ports_t ports;
        kvt_engine_ports(r, &ports);
        snprintf(ident, sizeof(ident), "late-writer-to-127.0.0.1:%u", (unsigned)ports.alloc_port);
        stranger_open(&s, ports.alloc_port, NULL, ident);
    }
    assert_int_equal(stranger_alloc(&s, "late", 1, "late-req", 1, &resp), 1);
    assert_int_equal(resp.type, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    snprintf(uuid, sizeof(uuid), "%s", resp.u.alloc_resp.remote_buffer_uuids.v[0]);
    index = resp.u.alloc_resp.remote_indexes.v[0];
    kvt_msg_clear(&resp);
    assert_int_equal(used_pages(r), 1);
    assert_int_equal(writer_write(&w, uuid, index), KVT_OK); /* in time: it lands */

    /* it never sends its ProxyNotif (landed) and nobody claims the chunk */
    advance_ms(r, 2000);
    assert_int_equal(used_reach(r, 0), 0);
    assert_int_equal(metrics(r).alloc_expired_total, 1);
    assert_int_equal(lookup(r, keys, 1), 0); /* gone for the consumer too */

    m = metrics(r);
    assert_int_equal(writer_write(&w, uuid, index), KVT_ERR_ACCESS);
    assert_int_equal(metrics(r).data_access_denied, m.data_access_denied + 1);
    assert_int_equal(used_pages(r), 0);
    stranger_close(&s);
    writer_close(&w);
    kvt_engine_destroy(r);
    t_keys_free(keys, 1);
}

/* 16 pages, pd_alloc_quota 0.5: one source address holds at most 8 unclaimed. A request
 * beyond that waits -- as for a full pool -- until its sender's entries are claimed or the
 * backoff TTL (0.3 s here) passed, then the async sender gets -1 for every key, a libkvt
 * sender the rest of its share; meanwhile it holds up nobody: another address (127.0.0.2)
 * is answered at once. */
static void test_quota_per_source(void **state)
{
    kvt_engine_t *r = receiver(16, 30.0, 0.5);
    kvt_engine_ports_t ports;
    stranger_t a, b, c;
    char ident[512], **qa = keys_of("qa", 6), **qb = keys_of("qb", 4);
    kvt_msg_t resp;
    kvt_metrics_t m;
    (void)state;

    kvt_engine_ports(r, &ports);
    stranger_open(&a, ports.alloc_port, "127.0.0.1", NULL);
    stranger_open(&b, ports.alloc_port, "127.0.0.2", NULL);
    /* a libkvt sender from the same address as <a>, under another routing id: same sender */
    snprintf(ident, sizeof(ident), "other-to-127.0.0.1:%u", (unsigned)ports.alloc_port);
    stranger_open(&c, ports.alloc_port, "127.0.0.1", ident);

    assert_int_equal(stranger_alloc(&a, "qa", 6, "", 0, NULL), 6);
    /* 4 more would make 10 > 8: it waits (the test clock stands still) ... */
    stranger_send_alloc(&a, "qa-more", 4, "", 0);
    assert_false(stranger_answered(&a, 200));
    /* ... holding up nobody: another address has its own share, answered at once */
    assert_int_equal(stranger_alloc(&b, "qb", 4, "", 0, NULL), 4);
    /* the backoff TTL: the async sender gets -1 for every key, nothing is held */
    advance_ms(r, 300);
    assert_int_equal(stranger_recv_alloc(&a, &resp), 0);
    assert_int_equal(resp.u.alloc_resp.remote_indexes.n, 4);
    kvt_msg_clear(&resp);
    m = metrics(r);
    assert_int_equal(m.alloc_quota_refused_total, 4);
    assert_int_equal(m.used_pages, 10);
    /* a libkvt sender copes with a partial grant: the 2 pages left of the address's 8 */
    stranger_send_alloc(&c, "qc", 4, "qc-req", 1);
    assert_false(stranger_answered(&c, 100));
    advance_ms(r, 300);
    assert_int_equal(stranger_recv_alloc(&c, &resp), 2);
    assert_int_equal(resp.type, KVT_MSG_ASCEND_ALLOC_RESPONSE);
    assert_int_equal(resp.u.alloc_resp.remote_indexes.n, 4);
    kvt_msg_clear(&resp);
    m = metrics(r);
    assert_int_equal(m.alloc_quota_refused_total, 6);
    assert_int_equal(m.used_pages, 12);
    /* over again; then the consumer claims <a>'s six: the waiting request goes on at once */
    stranger_send_alloc(&a, "qa-wait", 2, "", 0);
    assert_false(stranger_answered(&a, 200));
    assert_int_equal(lookup(r, qa, 6), 6);
    assert_int_equal(stranger_recv_alloc(&a, NULL), 2);
    kvt_unlock(r, (const char *const *)qa, 6);
    assert_int_equal(metrics(r).alloc_quota_refused_total, 6);
    assert_int_equal(used_pages(r), 14);
    assert_int_equal(kvt_release(r, (const char *const *)qb, 4), 4);

    stranger_close(&a);
    stranger_close(&b);
    stranger_close(&c);
    kvt_engine_destroy(r); /* frees every page */
    t_keys_free(qa, 6);
    t_keys_free(qb, 4);
}

/* A ReserveRequest asking for an hour holds the pool for pd_alloc_ttl at most. */
static void test_reserve_ttl_capped(void **state)
{
    kvt_engine_t *r = receiver(8, 2.0, 1.0);
    kvt_engine_ports_t ports;
    kvt_proxy_t *px;
    int granted = -1;
    int64_t free_chunks = -1;
    (void)state;

    kvt_engine_ports(r, &ports);
    assert_int_equal(kvt_proxy_create("127.0.0.1", 0, &px), KVT_OK);
    assert_int_equal(kvt_proxy_reserve(px, "127.0.0.1", ports.alloc_port, "hog", 8, 3600000, 3000,
                                       &granted, &free_chunks),
                     KVT_OK);
    assert_int_equal(granted, 1);
    assert_int_equal(free_chunks, 0);
    advance_ms(r, 1999);
    assert_int_equal(kvt_proxy_reserve(px, "127.0.0.1", ports.alloc_port, "probe", 1, 0, 3000,
                                       &granted, &free_chunks),
                     KVT_OK);
    assert_int_equal(granted, 0); /* still held */
    advance_ms(r, 2);
    assert_int_equal(kvt_proxy_reserve(px, "127.0.0.1", ports.alloc_port, "probe", 0, 0, 3000,
                                       &granted, &free_chunks),
                     KVT_OK);
    assert_int_equal(granted, 1);
    assert_int_equal(free_chunks, 8);
    kvt_proxy_destroy(px);
    kvt_engine_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_expires_after_ttl),
        cmocka_unit_test(test_write_after_expiry_refused),
        cmocka_unit_test(test_quota_per_source),
        cmocka_unit_test(test_reserve_ttl_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
