/*
 * test_tcp.c - the TCP transport on its own: WRITE/READ land the exact
 * bytes (multi-frame transfers included), the grant table refuses pages not
 * granted to that peer (and out-of-bounds / unknown regions), a dead peer
 * is reported and fails later posts, garbage on the data port is counted
 * and does not disturb other lanes, the frame codec rejects bad input, and
 * the data listener cannot be pinned or abused: a HELLO needs the token the
 * target issued to that peer id, lanes are capped (pending, per peer,
 * total), a lane that never says HELLO or goes idle is closed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvt/kvt_msg.h"
#include "kvt_tl_tcp_int.h"

#define PAGE   (1u << 20) /* > frame split: every page is several frames */
#define NPAGES 8

typedef struct ep {
    kvt_tl_t *tl;
    uint8_t *mem;
    kvt_tl_region_t *reg;
    char uuid[KVT_TL_UUID_LEN + 1];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ncompl;
    kvt_status_t last;
    int peer_failed;
    uint16_t port;
} ep_t;

static const kvt_tl_ops_t *ops(void)
{
    return kvt_tl_tcp_desc.ops;
}

static void on_complete(void *arg, uint64_t cookie, kvt_status_t st)
{
    ep_t *e = arg;
    (void)cookie;
    pthread_mutex_lock(&e->mu);
    e->ncompl++;
    e->last = st;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void on_peer_failed(void *arg, const char *peer, kvt_status_t st)
{
    ep_t *e = arg;
    (void)peer;
    (void)st;
    pthread_mutex_lock(&e->mu);
    e->peer_failed++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Open an endpoint; <lim> (may be NULL) supplies the listener limits and timeout. */
static void ep_open_lim(ep_t *e, const char *id, const char *uuid, const kvt_tl_config_t *lim)
{
    kvt_tl_config_t c = {
        .local_id = id, .listen_host = "127.0.0.1", .lanes = 2, .timeout_ms = 3000};
    kvt_tl_callbacks_t cb = {
        .on_complete = on_complete, .on_peer_failed = on_peer_failed, .arg = e};
    kvt_tl_region_params_t rp;
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    char host[256], token[KVT_TCP_TOKEN_LEN + 1];

    if (lim != NULL) {
        c.timeout_ms = lim->timeout_ms ? lim->timeout_ms : c.timeout_ms;
        c.max_conns = lim->max_conns;
        c.max_conns_per_peer = lim->max_conns_per_peer;
        c.max_pending = lim->max_pending;
        c.hello_timeout_ms = lim->hello_timeout_ms;
        c.idle_timeout_ms = lim->idle_timeout_ms;
        c.max_conns_per_addr = lim->max_conns_per_addr;
        c.max_pending_per_addr = lim->max_pending_per_addr;
        c.addr_prefix_v6 = lim->addr_prefix_v6;
        if (lim->listen_host != NULL)
            c.listen_host = lim->listen_host;
    }
    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    assert_int_equal(ops()->create(&c, &cb, &e->tl), KVT_OK);
    e->mem = calloc(NPAGES, PAGE);
    snprintf(e->uuid, sizeof(e->uuid), "%s", uuid);
    rp = (kvt_tl_region_params_t){
        .uuid = e->uuid, .base = e->mem, .length = NPAGES * PAGE, .page_size = PAGE};
    assert_int_equal(ops()->reg_region(e->tl, &rp, &e->reg), KVT_OK);
    assert_int_equal(ops()->peer_prepare(e->tl, "x", blob, &bl), KVT_OK);
    /* the transport's own address blob: host, port, token and nothing else */
    assert_int_equal(kvt_tcp_addr_unpack(blob, bl, host, &e->port, token), KVT_OK);
}

static void ep_open(ep_t *e, const char *id, const char *uuid)
{
    ep_open_lim(e, id, uuid, NULL);
}

/* The HELLO token <e> issues to <peer_id> (what the handshake blob hands that peer). */
static void issued_token(ep_t *e, const char *peer_id, char out[KVT_TL_UUID_LEN + 1])
{
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    char host[256];
    uint16_t port;

    assert_int_equal(ops()->peer_prepare(e->tl, peer_id, blob, &bl), KVT_OK);
    assert_int_equal(kvt_tcp_addr_unpack(blob, bl, host, &port, out), KVT_OK);
    assert_int_equal(strlen(out), KVT_TL_UUID_LEN);
}

/* Lanes <e> is serving right now. */
static unsigned served_lanes(ep_t *e)
{
    unsigned n;
    pthread_mutex_lock(&e->tl->lock);
    n = e->tl->nconns;
    pthread_mutex_unlock(&e->tl->lock);
    return n;
}

/* Lanes accepted whose HELLO is not decided yet. */
static unsigned lanes_before_hello(ep_t *e)
{
    unsigned n;
    pthread_mutex_lock(&e->tl->lock);
    n = e->tl->npending;
    pthread_mutex_unlock(&e->tl->lock);
    return n;
}

static void ep_close(ep_t *e)
{
    if (e->tl != NULL)
        ops()->destroy(e->tl);
    e->tl = NULL;
    free(e->mem);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
}

static void handshake(ep_t *a, const char *aid, ep_t *b, const char *bid)
{
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    assert_int_equal(ops()->peer_prepare(a->tl, bid, blob, &bl), KVT_OK);
    assert_int_equal(ops()->peer_connect(b->tl, aid, blob, bl), KVT_OK);
    bl = sizeof(blob);
    assert_int_equal(ops()->peer_prepare(b->tl, aid, blob, &bl), KVT_OK);
    assert_int_equal(ops()->peer_connect(a->tl, bid, blob, bl), KVT_OK);
}

/* Wait until <e> has seen <n> completions in total; returns the last status. */
static kvt_status_t wait_compl(ep_t *e, int n)
{
    struct timespec ts;
    kvt_status_t st;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&e->mu);
    while (e->ncompl < n) {
        if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) != 0)
            break;
    }
    assert_int_equal(e->ncompl, n);
    st = e->last;
    pthread_mutex_unlock(&e->mu);
    return st;
}

static kvt_tl_xfer_t xfer(ep_t *local, uint64_t loff, const ep_t *remote, uint64_t roff,
                          uint64_t len)
{
    kvt_tl_xfer_t x = {
        .local = local->reg, .local_offset = loff, .remote_offset = roff, .length = len};
    memcpy(x.remote_uuid, remote->uuid, sizeof(x.remote_uuid));
    return x;
}

#define UA "11111111-2222-4333-8444-555555555555"
#define UB "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"

static void test_write_read_verified(void **state)
{
    ep_t a, b;
    uint32_t pages[3] = {1, 2, 5};
    kvt_tl_xfer_t x[3];
    kvt_tl_stats_t st;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    handshake(&a, "A", &b, "B");
    for (size_t i = 0; i < NPAGES * PAGE; i++)
        a.mem[i] = (uint8_t)(i * 7 + (i >> 12));
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, pages, 3, KVT_TL_ACCESS_WRITE), KVT_OK);
    /* A's pages 0,1,2 -> B's pages 1,2,5; the last one short */
    x[0] = xfer(&a, 0, &b, 1 * PAGE, PAGE);
    x[1] = xfer(&a, PAGE, &b, 2 * PAGE, PAGE);
    x[2] = xfer(&a, 2 * PAGE, &b, 5 * PAGE, PAGE / 3);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, x, 3, 42), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    assert_memory_equal(b.mem + PAGE, a.mem, 2 * PAGE);
    assert_memory_equal(b.mem + 5 * PAGE, a.mem + 2 * PAGE, PAGE / 3);
    assert_int_equal(b.mem[5 * PAGE + PAGE / 3], 0); /* nothing beyond the length */

    /* READ back from B (granted for reading) into A's page 6 */
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, pages, 3, KVT_TL_ACCESS_READ), KVT_OK);
    x[0] = xfer(&a, 6 * PAGE, &b, 2 * PAGE, PAGE);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_READ, x, 1, 43), KVT_OK);
    assert_int_equal(wait_compl(&a, 2), KVT_OK);
    assert_memory_equal(a.mem + 6 * PAGE, a.mem + PAGE, PAGE);

    ops()->stats(a.tl, &st);
    assert_int_equal(st.bytes_written, 2 * PAGE + PAGE / 3);
    assert_int_equal(st.bytes_read, PAGE);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.bytes_served, 3 * PAGE + PAGE / 3);
    assert_int_equal(st.access_denied, 0);
    ep_close(&a);
    ep_close(&b);
}

static void test_access_denied(void **state)
{
    ep_t a, b;
    uint32_t p1 = 1, p3 = 3;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    uint8_t zero[64] = {0};
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    handshake(&a, "A", &b, "B");
    memset(a.mem, 0xab, PAGE);
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, &p1, 1, KVT_TL_ACCESS_WRITE), KVT_OK);
    /* page 3 was never granted */
    x = xfer(&a, 0, &b, 3 * PAGE, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_ERR_ACCESS);
    assert_memory_equal(b.mem + 3 * PAGE, zero, sizeof(zero));
    /* spans page 1 (granted) into page 2 (not) */
    x = xfer(&a, 0, &b, 2 * PAGE - 100, 200);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 2), KVT_OK);
    assert_int_equal(wait_compl(&a, 2), KVT_ERR_ACCESS);
    /* granted for WRITE is not granted for READ */
    x = xfer(&a, 0, &b, PAGE, 100);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_READ, &x, 1, 3), KVT_OK);
    assert_int_equal(wait_compl(&a, 3), KVT_ERR_ACCESS);
    /* beyond the region */
    x = xfer(&a, 0, &b, NPAGES * PAGE - 10, 100);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 4), KVT_OK);
    assert_int_equal(wait_compl(&a, 4), KVT_ERR_ACCESS);
    /* unknown region */
    x = xfer(&a, 0, &b, PAGE, 100);
    memcpy(x.remote_uuid, UA, sizeof(x.remote_uuid));
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 5), KVT_OK);
    assert_int_equal(wait_compl(&a, 5), KVT_ERR_ACCESS);
    /* the lane is still fine: a granted write lands */
    x = xfer(&a, 0, &b, PAGE, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 6), KVT_OK);
    assert_int_equal(wait_compl(&a, 6), KVT_OK);
    assert_memory_equal(b.mem + PAGE, a.mem, 4096);
    /* revoked -> refused again */
    ops()->revoke(b.tl, "A", b.reg, &p1, 1, KVT_TL_ACCESS_WRITE);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 7), KVT_OK);
    assert_int_equal(wait_compl(&a, 7), KVT_ERR_ACCESS);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.access_denied, 6);
    /* local arguments are checked at post time */
    x = xfer(&a, NPAGES * PAGE, &b, PAGE, 1);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 8), KVT_ERR_INVALID);
    assert_int_equal(ops()->post(a.tl, "nobody", KVT_TL_OP_WRITE, &x, 0, 8), KVT_ERR_INVALID);
    (void)p3;
    ep_close(&a);
    ep_close(&b);
}

static void test_peer_death(void **state)
{
    ep_t a, b;
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    struct timespec ts;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    handshake(&a, "A", &b, "B");
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, &p0, 1, KVT_TL_ACCESS_WRITE), KVT_OK);
    x = xfer(&a, 0, &b, 0, PAGE);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    ep_close(&b); /* the peer dies */
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&a.mu);
    while (a.peer_failed == 0 && pthread_cond_timedwait(&a.cv, &a.mu, &ts) == 0)
        ;
    assert_int_equal(a.peer_failed, 1);
    pthread_mutex_unlock(&a.mu);
    /* a later post cannot reach it: refused or completed with an error */
    {
        kvt_status_t st = ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 2);
        if (st == KVT_OK)
            assert_int_not_equal(wait_compl(&a, 2), KVT_OK);
        else
            assert_int_equal(st, KVT_ERR_PEER);
    }
    ep_close(&a);
}

static int dial(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Read until EOF (the target closed on us); bounded wait. */
static int closed_by_peer(int fd)
{
    char buf[256];
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r == 0)
            return 1;
        if (r < 0)
            return 0;
    }
}

/* HELLO as peer <id> with <token> on a fresh lane to <port>; returns the fd once the reply
 * arrived and sets *status to the reply's status. */
static int hello_lane_st(uint16_t port, const char *id, const char *token, kvt_status_t *status)
{
    uint8_t hb[KVT_TCP_HDR_LEN];
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;
    int fd = dial(port);

    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_HELLO;
    h.length = (uint32_t)strlen(id);
    snprintf(h.uuid, sizeof(h.uuid), "%s", token);
    kvt_tcp_hdr_encode(&h, hb);
    assert_int_equal(send(fd, hb, sizeof(hb), 0), (ssize_t)sizeof(hb));
    assert_int_equal(send(fd, id, strlen(id), 0), (ssize_t)strlen(id));
    assert_int_equal(recv(fd, hb, KVT_TCP_REPLY_LEN, MSG_WAITALL), KVT_TCP_REPLY_LEN);
    assert_int_equal(kvt_tcp_reply_decode(hb, KVT_TCP_REPLY_LEN, &r), KVT_OK);
    *status = (kvt_status_t)r.status;
    return fd;
}

/* An accepted HELLO as <id>, with the token <target> issued to <id>. */
static int hello_lane(ep_t *target, const char *id)
{
    char tok[KVT_TL_UUID_LEN + 1];
    kvt_status_t st;
    int fd;

    issued_token(target, id, tok);
    fd = hello_lane_st(target->port, id, tok, &st);
    assert_int_equal(st, KVT_OK);
    return fd;
}

/* One request frame on a raw lane; returns the reply status (READ payloads are skipped). */
static kvt_status_t raw_request(int fd, uint8_t op, const char *uuid, uint64_t off, uint64_t len,
                                const void *payload)
{
    uint8_t hb[KVT_TCP_HDR_LEN], rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;

    memset(&h, 0, sizeof(h));
    h.op = op;
    h.seq = 7;
    memcpy(h.uuid, uuid, KVT_TL_UUID_LEN);
    h.offset = off;
    h.length = len;
    kvt_tcp_hdr_encode(&h, hb);
    assert_int_equal(send(fd, hb, sizeof(hb), 0), (ssize_t)sizeof(hb));
    if (op == KVT_TCP_OP_WRITE)
        assert_int_equal(send(fd, payload, len, 0), (ssize_t)len);
    assert_int_equal(recv(fd, rb, sizeof(rb), MSG_WAITALL), (ssize_t)sizeof(rb));
    assert_int_equal(kvt_tcp_reply_decode(rb, sizeof(rb), &r), KVT_OK);
    assert_int_equal(r.seq, 7);
    if (r.status == KVT_OK && op == KVT_TCP_OP_READ) {
        uint8_t *sink = malloc(len);
        assert_int_equal(recv(fd, sink, len, MSG_WAITALL), (ssize_t)len);
        free(sink);
    }
    return (kvt_status_t)r.status;
}

static void test_garbage_frames(void **state)
{
    ep_t a, b;
    uint8_t junk[200], hb[KVT_TCP_HDR_LEN];
    kvt_tcp_hdr_t h;
    kvt_tl_stats_t st;
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    int fd;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 37 + 1);
    /* 1. plain garbage */
    fd = dial(b.port);
    assert_int_equal(send(fd, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
    assert_true(closed_by_peer(fd));
    close(fd);
    /* 2. a valid HELLO, then a WRITE with an absurd length */
    fd = hello_lane(&b, "evil!");
    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_WRITE;
    memcpy(h.uuid, UB, KVT_TL_UUID_LEN);
    h.length = KVT_TCP_MAX_FRAME + 1;
    kvt_tcp_hdr_encode(&h, hb);
    send(fd, hb, sizeof(hb), 0);
    assert_true(closed_by_peer(fd));
    close(fd);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.bad_frames, 2);
    /* 3. the target still serves a real peer */
    handshake(&a, "A", &b, "B");
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, &p0, 1, KVT_TL_ACCESS_WRITE), KVT_OK);
    memset(a.mem, 0x5a, 1000);
    x = xfer(&a, 0, &b, 0, 1000);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    assert_memory_equal(b.mem, a.mem, 1000);
    /* 4. handshake blobs that are not ours are refused */
    assert_int_equal(ops()->peer_connect(a.tl, "C", junk, sizeof(junk)) == KVT_OK, 0);
    ep_close(&a);
    ep_close(&b);
}

/* A peer that stops in the middle of a frame (or of its HELLO) loses the lane after the
 * transport's timeouts (1 s here) instead of holding a server thread forever; a lane that
 * is merely idle between frames (shorter than the idle timeout) stays open. */
static void test_stalled_frames(void **state)
{
    ep_t b;
    kvt_tl_config_t lim = {.timeout_ms = 1000, .hello_timeout_ms = 1000};
    uint8_t hb[KVT_TCP_HDR_LEN];
    kvt_tcp_hdr_t h;
    kvt_tl_stats_t st;
    char c;
    int half_hello, half_write, idle;
    (void)state;

    ep_open_lim(&b, "B", UB, &lim);
    half_hello = dial(b.port);
    memset(hb, 0, sizeof(hb));
    assert_int_equal(send(half_hello, hb, 4, 0), 4);
    half_write = hello_lane(&b, "A");
    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_WRITE;
    memcpy(h.uuid, UB, KVT_TL_UUID_LEN);
    h.length = 1000;
    kvt_tcp_hdr_encode(&h, hb);
    assert_int_equal(send(half_write, hb, sizeof(hb), 0), (ssize_t)sizeof(hb));
    assert_int_equal(send(half_write, "0123456789", 10, 0), 10); /* then nothing */
    idle = hello_lane(&b, "A2");
    assert_true(closed_by_peer(half_hello)); /* bounded waits for the closes */
    assert_true(closed_by_peer(half_write));
    assert_int_equal(recv(idle, &c, 1, MSG_DONTWAIT), -1); /* still open, nothing to read */
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.stall_closed, 1);
    assert_int_equal(st.hello_refused, 1); /* the half HELLO ran out of its deadline */
    assert_int_equal(st.idle_closed, 0);
    close(half_hello);
    close(half_write);
    close(idle);
    ep_close(&b);
}

/* Poll <cond> until it holds, at most 5 s: a wait on a condition, not a fixed sleep. */
#define WAIT_UNTIL(cond)                                                                           \
    do {                                                                                           \
        for (int w_ = 0; w_ < 500 && !(cond); w_++)                                                \
            usleep(10 * 1000);                                                                     \
        assert_true(cond);                                                                         \
    } while (0)

/* A HELLO claiming another peer's id gets nothing: only the token the target issued to an id
 * over the control plane opens a lane as that id, and a lane only reaches the pages granted
 * to its own id. */
static void test_forged_hello(void **state)
{
    ep_t a, b;
    char tok_c[KVT_TL_UUID_LEN + 1];
    uint8_t payload[100];
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    kvt_status_t hs;
    int fd;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    handshake(&a, "A", &b, "B");
    assert_int_equal(
        ops()->grant(b.tl, "A", b.reg, &p0, 1, KVT_TL_ACCESS_WRITE | KVT_TL_ACCESS_READ), KVT_OK);
    memset(b.mem, 0x11, 4096);
    memset(payload, 0xee, sizeof(payload));
    /* C did its own control-plane handshake with B and holds C's token */
    issued_token(&b, "C", tok_c);
    /* 1. C's token presented as "A": refused at HELLO, lane closed */
    fd = hello_lane_st(b.port, "A", tok_c, &hs);
    assert_int_equal(hs, KVT_ERR_ACCESS);
    assert_true(closed_by_peer(fd));
    close(fd);
    /* 2. a made-up token as "A" */
    fd = hello_lane_st(b.port, "A", "00000000-0000-4000-8000-000000000000", &hs);
    assert_int_equal(hs, KVT_ERR_ACCESS);
    assert_true(closed_by_peer(fd));
    close(fd);
    /* 3. an id B never issued a token to */
    fd = hello_lane_st(b.port, "Z", tok_c, &hs);
    assert_int_equal(hs, KVT_ERR_ACCESS);
    close(fd);
    /* 4. C as itself is let in, but A's page is not C's */
    fd = hello_lane_st(b.port, "C", tok_c, &hs);
    assert_int_equal(hs, KVT_OK);
    assert_int_equal(raw_request(fd, KVT_TCP_OP_WRITE, UB, 0, sizeof(payload), payload),
                     KVT_ERR_ACCESS);
    assert_int_equal(raw_request(fd, KVT_TCP_OP_READ, UB, 0, 64, NULL), KVT_ERR_ACCESS);
    close(fd);
    assert_int_equal(b.mem[0], 0x11); /* untouched */
    ops()->stats(b.tl, &st);
    assert_int_equal(st.hello_refused, 3);
    assert_int_equal(st.access_denied, 2);
    /* A itself still writes its page */
    memset(a.mem, 0x5a, 4096);
    x = xfer(&a, 0, &b, 0, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    assert_memory_equal(b.mem, a.mem, 4096);
    /* a removed peer's token is void: its old token opens nothing */
    issued_token(&b, "C", tok_c);
    ops()->peer_remove(b.tl, "C");
    fd = hello_lane_st(b.port, "C", tok_c, &hs);
    assert_int_equal(hs, KVT_ERR_ACCESS);
    close(fd);
    ep_close(&a);
    ep_close(&b);
}

/* The initiator prepares under the address it dialled and learns the node id from the reply
 * (peer_rename): the token it handed out then belongs to the node id. */
static void test_rename_moves_token(void **state)
{
    ep_t a, b;
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open(&b, "B", UB);
    /* A dials B as "127.0.0.1:1234" */
    assert_int_equal(ops()->peer_prepare(a.tl, "127.0.0.1:1234", blob, &bl), KVT_OK);
    assert_int_equal(ops()->peer_connect(b.tl, "A", blob, bl), KVT_OK);
    bl = sizeof(blob);
    assert_int_equal(ops()->peer_prepare(b.tl, "A", blob, &bl), KVT_OK);
    assert_int_equal(ops()->peer_rename(a.tl, "127.0.0.1:1234", "B"), KVT_OK);
    assert_int_equal(ops()->peer_connect(a.tl, "B", blob, bl), KVT_OK);
    assert_int_equal(ops()->peer_rename(a.tl, "nobody", "B2"), KVT_ERR_NOT_FOUND);
    /* B -> A (a pull's READ direction): B's lanes carry A's token for "B" */
    assert_int_equal(ops()->grant(a.tl, "B", a.reg, &p0, 1, KVT_TL_ACCESS_READ), KVT_OK);
    memset(a.mem, 0x77, 4096);
    x = xfer(&b, PAGE, &a, 0, 4096);
    assert_int_equal(ops()->post(b.tl, "A", KVT_TL_OP_READ, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&b, 1), KVT_OK);
    assert_memory_equal(b.mem + PAGE, a.mem, 4096);
    ep_close(&a);
    ep_close(&b);
}

/* Caps: lanes before HELLO, lanes per peer, lanes in total; refused lanes are counted, a lane
 * that never completes its HELLO is closed at the deadline, and once the abusers are gone a
 * legit transfer works again. */
static void test_conn_caps(void **state)
{
    ep_t a, b;
    kvt_tl_config_t lim = {
        .max_conns = 3, .max_conns_per_peer = 2, .max_pending = 2, .hello_timeout_ms = 1500};
    char tok_c[KVT_TL_UUID_LEN + 1];
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    kvt_status_t hs;
    int silent[2], extra, a1, a2, a3, c1, over;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open_lim(&b, "B", UB, &lim);
    handshake(&a, "A", &b, "B");
    /* 1. two silent lanes fill the pre-HELLO cap: the third is closed at accept */
    silent[0] = dial(b.port);
    silent[1] = dial(b.port);
    WAIT_UNTIL(served_lanes(&b) == 2);
    extra = dial(b.port);
    assert_true(closed_by_peer(extra));
    close(extra);
    /* 2. the silent ones are closed at the HELLO deadline */
    assert_true(closed_by_peer(silent[0]));
    assert_true(closed_by_peer(silent[1]));
    close(silent[0]);
    close(silent[1]);
    WAIT_UNTIL(served_lanes(&b) == 0);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    assert_int_equal(st.hello_refused, 2);
    /* 3. per peer: the third lane of "A" is refused with LIMIT */
    a1 = hello_lane(&b, "A");
    a2 = hello_lane(&b, "A");
    /* an answered HELLO no longer counts against the pre-HELLO cap */
    assert_int_equal(lanes_before_hello(&b), 0);
    {
        char tok_a[KVT_TL_UUID_LEN + 1];
        issued_token(&b, "A", tok_a);
        a3 = hello_lane_st(b.port, "A", tok_a, &hs);
        assert_int_equal(hs, KVT_ERR_LIMIT);
        assert_true(closed_by_peer(a3));
        close(a3);
    }
    WAIT_UNTIL(served_lanes(&b) == 2); /* the refused lane's thread has let go of its slot */
    /* 4. in total: C's lane makes 3, a 4th connection is closed at accept */
    issued_token(&b, "C", tok_c);
    c1 = hello_lane_st(b.port, "C", tok_c, &hs);
    assert_int_equal(hs, KVT_OK);
    over = dial(b.port);
    assert_true(closed_by_peer(over));
    close(over);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 3); /* pending cap, A's lane cap, total cap */
    /* 5. abusers gone: A's own lanes (2) get in and the write lands */
    close(a1);
    close(a2);
    close(c1);
    WAIT_UNTIL(served_lanes(&b) == 0);
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, &p0, 1, KVT_TL_ACCESS_WRITE), KVT_OK);
    memset(a.mem, 0x3c, 4096);
    x = xfer(&a, 0, &b, 0, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    assert_memory_equal(b.mem, a.mem, 4096);
    ep_close(&a);
    ep_close(&b);
}

/* A lane with no frame for the idle timeout gets a BYE and is closed; the initiator takes that
 * quietly (no peer failure) and its next post reconnects. */
static void test_idle_lane_closed(void **state)
{
    ep_t a, b;
    kvt_tl_config_t lim = {.idle_timeout_ms = 3000}; /* >> lane set-up on a loaded machine */
    uint8_t rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t r;
    uint32_t p0 = 0;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    int fd;
    (void)state;

    ep_open(&a, "A", UA);
    ep_open_lim(&b, "B", UB, &lim);
    handshake(&a, "A", &b, "B");
    /* a raw lane that goes quiet after its HELLO */
    fd = hello_lane(&b, "A");
    assert_int_equal(recv(fd, rb, sizeof(rb), MSG_WAITALL), (ssize_t)sizeof(rb));
    assert_int_equal(kvt_tcp_reply_decode(rb, sizeof(rb), &r), KVT_OK);
    assert_true(r.flags & KVT_TCP_REPLY_BYE);
    assert_true(closed_by_peer(fd));
    close(fd);
    /* the transport's own lanes: a write, then quiet until B closes both lanes */
    assert_int_equal(ops()->grant(b.tl, "A", b.reg, &p0, 1, KVT_TL_ACCESS_WRITE), KVT_OK);
    memset(a.mem, 0x42, 4096);
    x = xfer(&a, 0, &b, 0, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    WAIT_UNTIL(served_lanes(&b) == 0);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.idle_closed, 3);
    /* the state that used to fail the next transfer with KVT_ERR_PEER: A read both BYEs, its
     * lanes are dead, but the peer is not failed (nothing to reconnect for) */
    WAIT_UNTIL((ops()->stats(a.tl, &st), st.byes_received == 2));
    pthread_mutex_lock(&a.mu);
    assert_int_equal(a.peer_failed, 0);
    pthread_mutex_unlock(&a.mu);
    memset(a.mem, 0x43, 4096);
    assert_int_equal(ops()->post(a.tl, "B", KVT_TL_OP_WRITE, &x, 1, 2), KVT_OK);
    assert_int_equal(wait_compl(&a, 2), KVT_OK);
    assert_memory_equal(b.mem, a.mem, 4096);
    ops()->stats(a.tl, &st);
    assert_int_equal(st.peer_failures, 0);
    assert_int_equal(st.lanes_reopened, 0); /* revived by the post, nothing had to go again */
    ep_close(&a);
    ep_close(&b);
}

/* A fake target that closes the lane carrying the first frame with a BYE after the frame
 * arrived (its idle timer fired as the frame crossed it), then serves the frame on the fresh
 * lane the initiator opens. */
typedef struct bye_target {
    int lfd;
    uint16_t port;
    uint8_t mem[4096];
    int frames_seen;
} bye_target_t;

static int accept_hello(bye_target_t *t)
{
    uint8_t hb[KVT_TCP_HDR_LEN], rb[KVT_TCP_REPLY_LEN];
    char id[KVT_TL_PEER_ID_MAX + 1];
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r = {.status = KVT_OK};
    int fd = accept(t->lfd, NULL, NULL);

    assert_true(fd >= 0);
    assert_int_equal(recv(fd, hb, sizeof(hb), MSG_WAITALL), (ssize_t)sizeof(hb));
    assert_int_equal(kvt_tcp_hdr_decode(hb, sizeof(hb), &h), KVT_OK);
    assert_int_equal(h.op, KVT_TCP_OP_HELLO);
    assert_int_equal(recv(fd, id, (size_t)h.length, MSG_WAITALL), (ssize_t)h.length);
    kvt_tcp_reply_encode(&r, rb);
    assert_int_equal(send(fd, rb, sizeof(rb), 0), (ssize_t)sizeof(rb));
    return fd;
}

/* Read one WRITE frame of 4096 bytes from <fd> into the target's memory; returns its seq. */
static uint32_t read_write_frame(bye_target_t *t, int fd)
{
    uint8_t hb[KVT_TCP_HDR_LEN];
    kvt_tcp_hdr_t h;

    assert_int_equal(recv(fd, hb, sizeof(hb), MSG_WAITALL), (ssize_t)sizeof(hb));
    assert_int_equal(kvt_tcp_hdr_decode(hb, sizeof(hb), &h), KVT_OK);
    assert_int_equal(h.op, KVT_TCP_OP_WRITE);
    assert_int_equal(h.length, sizeof(t->mem));
    assert_int_equal(recv(fd, t->mem, sizeof(t->mem), MSG_WAITALL), (ssize_t)sizeof(t->mem));
    t->frames_seen++;
    return h.seq;
}

static void *bye_target_main(void *arg)
{
    bye_target_t *t = arg;
    uint8_t rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t r = {.status = KVT_ERR_CLOSED, .flags = KVT_TCP_REPLY_BYE};
    int lane[2], busy, fresh;
    char c;

    lane[0] = accept_hello(t);
    lane[1] = accept_hello(t);
    busy = lane[0]; /* the first frame of a post goes to the first lane */
    (void)read_write_frame(t, busy);
    kvt_tcp_reply_encode(&r, rb);
    assert_int_equal(send(busy, rb, sizeof(rb), 0), (ssize_t)sizeof(rb));
    shutdown(busy, SHUT_WR);
    assert_int_equal(recv(busy, &c, 1, 0), 0); /* the initiator closes this lane */
    fresh = accept_hello(t);
    r = (kvt_tcp_reply_t){.status = KVT_OK, .seq = read_write_frame(t, fresh)};
    kvt_tcp_reply_encode(&r, rb);
    assert_int_equal(send(fresh, rb, sizeof(rb), 0), (ssize_t)sizeof(rb));
    assert_int_equal(recv(fresh, &c, 1, 0), 0); /* until the initiator goes away */
    close(fresh);
    close(lane[0]);
    close(lane[1]);
    return NULL;
}

static void test_bye_crosses_frame(void **state)
{
    ep_t a;
    bye_target_t t = {0};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    pthread_t th;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    (void)state;

    t.lfd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(bind(t.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(t.lfd, 8), 0);
    assert_int_equal(getsockname(t.lfd, (struct sockaddr *)&sa, &sl), 0);
    /* the fake checks no token */
    assert_int_equal(kvt_tcp_addr_pack("127.0.0.1", ntohs(sa.sin_port), UB, blob, &bl), KVT_OK);
    ep_open(&a, "A", UA);
    assert_int_equal(ops()->peer_connect(a.tl, "F", blob, bl), KVT_OK);
    assert_int_equal(pthread_create(&th, NULL, bye_target_main, &t), 0);
    memset(a.mem, 0x5a, 4096);
    x = (kvt_tl_xfer_t){.local = a.reg, .length = 4096};
    memcpy(x.remote_uuid, UB, sizeof(x.remote_uuid));
    assert_int_equal(ops()->post(a.tl, "F", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_compl(&a, 1), KVT_OK);
    ops()->stats(a.tl, &st);
    assert_int_equal(st.byes_received, 1);
    assert_int_equal(st.lanes_reopened, 1);
    assert_int_equal(st.peer_failures, 0);
    pthread_mutex_lock(&a.mu);
    assert_int_equal(a.peer_failed, 0);
    pthread_mutex_unlock(&a.mu);
    ep_close(&a); /* closes the fresh lane: the fake target ends */
    pthread_join(th, NULL);
    close(t.lfd);
    assert_int_equal(t.frames_seen, 2); /* once into the BYE, once on the fresh lane */
    for (size_t i = 0; i < sizeof(t.mem); i++)
        assert_int_equal(t.mem[i], 0x5a);
}

/* The per-address cap groups IPv6 sources by prefix (a /64 by default, one host commonly holds
 * a whole /64), IPv4 and IPv4-mapped sources by address. */
static void test_addr_key(void **state)
{
    struct sockaddr_in6 a = {.sin6_family = AF_INET6}, b = a;
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    uint8_t ka[16], kb[16], k4[16];
    (void)state;

    inet_pton(AF_INET6, "2001:db8:1:2::1", &a.sin6_addr);
    inet_pton(AF_INET6, "2001:db8:1:2:ffff:eeee:dddd:cccc", &b.sin6_addr);
    kvt_tcp_addr_key((struct sockaddr *)&a, 64, ka);
    kvt_tcp_addr_key((struct sockaddr *)&b, 64, kb);
    assert_memory_equal(ka, kb, 16); /* same /64: one source */
    kvt_tcp_addr_key((struct sockaddr *)&a, 128, ka);
    kvt_tcp_addr_key((struct sockaddr *)&b, 128, kb);
    assert_memory_not_equal(ka, kb, 16);
    inet_pton(AF_INET6, "2001:db8:1:3::1", &b.sin6_addr); /* next /64, same /48 */
    kvt_tcp_addr_key((struct sockaddr *)&a, 64, ka);
    kvt_tcp_addr_key((struct sockaddr *)&b, 64, kb);
    assert_memory_not_equal(ka, kb, 16);
    kvt_tcp_addr_key((struct sockaddr *)&a, 48, ka);
    kvt_tcp_addr_key((struct sockaddr *)&b, 48, kb);
    assert_memory_equal(ka, kb, 16);
    kvt_tcp_addr_key((struct sockaddr *)&a, 60, ka); /* a prefix off the byte boundary */
    kvt_tcp_addr_key((struct sockaddr *)&b, 60, kb);
    assert_memory_equal(ka, kb, 16);
    /* IPv4 and IPv4-mapped: per address, never grouped by the IPv6 prefix */
    inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
    inet_pton(AF_INET6, "::ffff:10.1.2.3", &a.sin6_addr);
    inet_pton(AF_INET6, "::ffff:10.1.2.4", &b.sin6_addr);
    kvt_tcp_addr_key((struct sockaddr *)&v4, 64, k4);
    kvt_tcp_addr_key((struct sockaddr *)&a, 64, ka);
    kvt_tcp_addr_key((struct sockaddr *)&b, 64, kb);
    assert_memory_equal(k4, ka, 16);
    assert_memory_not_equal(ka, kb, 16);
}

/* Lanes from one source address are capped whether or not they said HELLO; the lane over the
 * cap is closed at accept and counted, and a freed slot is usable again. */
static void test_addr_cap(void **state)
{
    ep_t b;
    kvt_tl_config_t lim = {.max_conns_per_addr = 2};
    kvt_tl_stats_t st;
    int l1, l2, over, again;
    (void)state;

    ep_open_lim(&b, "B", UB, &lim);
    l1 = hello_lane(&b, "A"); /* one with HELLO, one still silent */
    l2 = dial(b.port);
    WAIT_UNTIL(served_lanes(&b) == 2);
    over = dial(b.port);
    assert_true(closed_by_peer(over));
    close(over);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    close(l2);
    WAIT_UNTIL(served_lanes(&b) == 1);
    again = hello_lane(&b, "A2");
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    close(l1);
    close(again);
    ep_close(&b);
}

/* A lane from 127.0.0.2 (another source address on loopback). */
static int dial_from_other(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct sockaddr_in src = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Silent lanes from one source are capped below the global max_pending: the one over the cap
 * is closed at accept and counted, while another source's lanes still get in and a peer's
 * HELLO still works. */
static void test_pending_addr_cap(void **state)
{
    ep_t b;
    kvt_tl_config_t lim = {.max_pending_per_addr = 2, .hello_timeout_ms = 60000};
    kvt_tl_stats_t st;
    int s1, s2, over, other, again, ok;
    (void)state;

    ep_open_lim(&b, "B", UB, &lim);
    s1 = dial(b.port);
    s2 = dial(b.port);
    WAIT_UNTIL(lanes_before_hello(&b) == 2);
    over = dial(b.port);
    assert_true(closed_by_peer(over));
    close(over);
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    other = dial_from_other(b.port); /* another source is not held up */
    WAIT_UNTIL(lanes_before_hello(&b) == 3);
    close(s1); /* a silent lane gone frees its slot for that source */
    WAIT_UNTIL(lanes_before_hello(&b) == 2);
    again = dial(b.port);
    WAIT_UNTIL(lanes_before_hello(&b) == 3);
    close(again);
    close(s2);
    WAIT_UNTIL(lanes_before_hello(&b) == 1);
    ok = hello_lane(&b, "A"); /* HELLO done: the lane no longer counts as silent */
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    close(ok);
    close(other);
    ep_close(&b);
}

/* The same over IPv6 (skipped where the machine has no ::1): lanes from ::1 are counted under
 * its /64 and the one over the cap is closed at accept. */
static void test_addr_cap_v6(void **state)
{
    ep_t b;
    kvt_tl_config_t lim = {.max_conns_per_addr = 1, .listen_host = "::1"};
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6};
    kvt_tl_stats_t st;
    int probe = socket(AF_INET6, SOCK_STREAM, 0), l1, over;
    (void)state;

    if (probe < 0 || bind(probe,
                          (struct sockaddr *)&(struct sockaddr_in6){.sin6_family = AF_INET6,
                                                                    .sin6_addr = in6addr_loopback},
                          sizeof(sa)) != 0) {
        if (probe >= 0)
            close(probe);
        skip();
    }
    close(probe);
    ep_open_lim(&b, "B", UB, &lim);
    sa.sin6_addr = in6addr_loopback;
    sa.sin6_port = htons(b.port);
    l1 = socket(AF_INET6, SOCK_STREAM, 0);
    assert_int_equal(connect(l1, (struct sockaddr *)&sa, sizeof(sa)), 0);
    WAIT_UNTIL(served_lanes(&b) == 1);
    over = socket(AF_INET6, SOCK_STREAM, 0);
    assert_int_equal(connect(over, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_true(closed_by_peer(over));
    ops()->stats(b.tl, &st);
    assert_int_equal(st.conns_refused, 1);
    close(over);
    close(l1);
    ep_close(&b);
}

static void test_frame_codec(void **state)
{
    kvt_tcp_hdr_t h, d;
    kvt_tcp_reply_t r = {.status = KVT_ERR_ACCESS, .seq = 77}, rd;
    uint8_t b[KVT_TCP_HDR_LEN], rb[KVT_TCP_REPLY_LEN];
    (void)state;

    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_READ;
    h.seq = 9;
    memcpy(h.uuid, UA, KVT_TL_UUID_LEN);
    h.offset = 1ull << 40;
    h.length = 12345;
    kvt_tcp_hdr_encode(&h, b);
    assert_int_equal(kvt_tcp_hdr_decode(b, sizeof(b), &d), KVT_OK);
    assert_int_equal(d.op, KVT_TCP_OP_READ);
    assert_int_equal(d.seq, 9);
    assert_string_equal(d.uuid, UA);
    assert_int_equal(d.offset, 1ull << 40);
    assert_int_equal(d.length, 12345);
    assert_int_equal(kvt_tcp_hdr_decode(b, sizeof(b) - 1, &d), KVT_ERR_PROTO); /* short */
    b[20] = 'z';                                                               /* bad uuid char */
    assert_int_equal(kvt_tcp_hdr_decode(b, sizeof(b), &d), KVT_ERR_PROTO);
    kvt_tcp_hdr_encode(&h, b);
    b[4] = 99; /* unknown op */
    assert_int_equal(kvt_tcp_hdr_decode(b, sizeof(b), &d), KVT_ERR_PROTO);
    kvt_tcp_hdr_encode(&h, b);
    b[0] ^= 1; /* magic */
    assert_int_equal(kvt_tcp_hdr_decode(b, sizeof(b), &d), KVT_ERR_PROTO);
    kvt_tcp_reply_encode(&r, rb);
    assert_int_equal(kvt_tcp_reply_decode(rb, sizeof(rb), &rd), KVT_OK);
    assert_int_equal(rd.status, KVT_ERR_ACCESS);
    assert_int_equal(rd.seq, 77);
    assert_true(kvt_tcp_range_ok(10, 0, 10));
    assert_false(kvt_tcp_range_ok(11, 0, 10));
    assert_false(kvt_tcp_range_ok(5, UINT64_MAX, 10));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_codec),       cmocka_unit_test(test_write_read_verified),
        cmocka_unit_test(test_access_denied),     cmocka_unit_test(test_peer_death),
        cmocka_unit_test(test_garbage_frames),    cmocka_unit_test(test_stalled_frames),
        cmocka_unit_test(test_forged_hello),      cmocka_unit_test(test_rename_moves_token),
        cmocka_unit_test(test_conn_caps),         cmocka_unit_test(test_idle_lane_closed),
        cmocka_unit_test(test_bye_crosses_frame), cmocka_unit_test(test_addr_key),
        cmocka_unit_test(test_addr_cap),          cmocka_unit_test(test_addr_cap_v6),
        cmocka_unit_test(test_pending_addr_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
