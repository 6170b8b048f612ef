/*
 * kvt_ctrl_proxy.c - the proxy side of the control plane (used by the
 * gateway): a PULL for ProxyNotif, ReserveRequest/ReserveResponse with a
 * timeout, CancelNotif. A DEALER that missed a reply is closed and replaced.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvt/kvt_engine.h"
#include "kvt_tsan.h"
#include "kvt/kvt_msg.h"
#include "pdb/pdb_clock.h"

#define PROXY_MAX_DEALERS 64

typedef struct proxy_dealer {
    char ep[300];
    void *sock;
} proxy_dealer_t;

struct kvt_proxy {
    void *zctx;
    void *pull;
    int fd;
    uint16_t port;
    uint64_t bad;
    uint64_t gen;
    proxy_dealer_t dealers[PROXY_MAX_DEALERS];
};

static uint64_t now_ms(void)
{
    return pdb_clock_mono_ms();
}

kvt_status_t kvt_proxy_create(const char *host, uint16_t port, kvt_proxy_t **out)
{
    kvt_proxy_t *p;
    char ep[300], last[300];
    size_t ll = sizeof(last), fl = sizeof(int);
    int zero = 0;
    int64_t maxmsg = KVT_MSG_MAX_BYTES;
    kvt_status_t st = KVT_ERR_IO;
    const char *colon;

    if (host == NULL || out == NULL)
        return KVT_ERR_INVALID;
    p = kvt_calloc(1, sizeof(*p));
    if (p == NULL)
        return KVT_ERR_NOMEM;
    p->zctx = zmq_ctx_new();
    if (p->zctx == NULL)
        goto err_free;
    p->pull = zmq_socket(p->zctx, ZMQ_PULL);
    if (p->pull == NULL)
        goto err_ctx;
    zmq_setsockopt(p->pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (port)
        snprintf(ep, sizeof(ep), "tcp://%s:%u", host, (unsigned)port);
    else
        snprintf(ep, sizeof(ep), "tcp://%s:*", host);
    if (zmq_bind(p->pull, ep) != 0 || zmq_getsockopt(p->pull, ZMQ_LAST_ENDPOINT, last, &ll) != 0 ||
        (colon = strrchr(last, ':')) == NULL || zmq_getsockopt(p->pull, ZMQ_FD, &p->fd, &fl) != 0)
        goto err_sock;
    p->port = (uint16_t)atoi(colon + 1);
    *out = p;
    return KVT_OK;

err_sock:
    zmq_close(p->pull);
err_ctx:
    zmq_ctx_term(p->zctx);
err_free:
    kvt_free(p);
    return st;
}

void kvt_proxy_destroy(kvt_proxy_t *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < PROXY_MAX_DEALERS; i++) {
        if (p->dealers[i].sock != NULL)
            zmq_close(p->dealers[i].sock);
    }
    zmq_close(p->pull);
    zmq_ctx_term(p->zctx);
    kvt_free(p);
}

uint16_t kvt_proxy_port(const kvt_proxy_t *p)
{
    return p != NULL ? p->port : 0;
}

int kvt_proxy_fd(const kvt_proxy_t *p)
{
    return p != NULL ? p->fd : -1;
}

uint64_t kvt_proxy_bad_messages(const kvt_proxy_t *p)
{
    return p != NULL ? p->bad : 0;
}

kvt_status_t kvt_proxy_recv(kvt_proxy_t *p, char *req_id, size_t cap, int timeout_ms)
{
    uint64_t deadline;

    if (p == NULL || req_id == NULL || cap == 0)
        return KVT_ERR_INVALID;
    deadline = now_ms() + (timeout_ms > 0 ? (uint64_t)timeout_ms : 0);
    for (;;) {
        zmq_msg_t f;
        int more = 0;
        size_t ml = sizeof(more);
        kvt_msg_t m;

        zmq_msg_init(&f);
        if (kvt_zmq_msg_recv(&f, p->pull, ZMQ_DONTWAIT) < 0) {
            zmq_pollitem_t it = {.socket = p->pull, .events = ZMQ_POLLIN};
            long wait;
            zmq_msg_close(&f);
            if (errno != EAGAIN)
                return KVT_ERR_IO;
            if (timeout_ms == 0)
                return KVT_ERR_TIMEOUT;
            wait = timeout_ms < 0 ? -1 : (long)(deadline > now_ms() ? deadline - now_ms() : 0);
            if (timeout_ms > 0 && wait == 0)
                return KVT_ERR_TIMEOUT;
            if (zmq_poll(&it, 1, wait) < 0 && errno != EINTR)
                return KVT_ERR_IO;
            continue;
        }
        zmq_getsockopt(p->pull, ZMQ_RCVMORE, &more, &ml);
        if (more) {
            /* multipart is not ours: drop every part */
            zmq_msg_close(&f);
            do {
                zmq_msg_init(&f);
                if (kvt_zmq_msg_recv(&f, p->pull, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&f);
                    break;
                }
                zmq_msg_close(&f);
                ml = sizeof(more);
                zmq_getsockopt(p->pull, ZMQ_RCVMORE, &more, &ml);
            } while (more);
            p->bad++;
            continue;
        }
        if (kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &m, NULL) != KVT_OK ||
            m.type != KVT_MSG_PROXY_NOTIF) {
            if (m.type != KVT_MSG_NONE)
                kvt_msg_clear(&m);
            zmq_msg_close(&f);
            p->bad++;
            continue;
        }
        zmq_msg_close(&f);
        snprintf(req_id, cap, "%s", m.u.proxy_notif.req_id);
        kvt_msg_clear(&m);
        return KVT_OK;
    }
}

/* host:port's open socket, or NULL. */
static proxy_dealer_t *dealer_find(kvt_proxy_t *p, const char *host, uint16_t port)
{
    char ep[300];
    kvt_proxy_reserve_endpoint(host, port, ep, sizeof(ep));
    for (int i = 0; i < PROXY_MAX_DEALERS; i++)
        if (p->dealers[i].sock != NULL && strcmp(p->dealers[i].ep, ep) == 0)
            return &p->dealers[i];
    return NULL;
}

/* host:port's socket, opened when there is none. */
static proxy_dealer_t *dealer_get(kvt_proxy_t *p, const char *host, uint16_t port)
{
    char ep[300], ident[64];
    proxy_dealer_t *have = dealer_find(p, host, port), *free_slot = NULL;
    int zero = 0;
    int64_t maxmsg = KVT_MSG_MAX_BYTES;

    if (have != NULL)
        return have;
    kvt_proxy_reserve_endpoint(host, port, ep, sizeof(ep));
    for (int i = 0; i < PROXY_MAX_DEALERS && free_slot == NULL; i++)
        if (p->dealers[i].sock == NULL)
            free_slot = &p->dealers[i];
    if (free_slot == NULL) {
        free_slot = &p->dealers[p->gen % PROXY_MAX_DEALERS];
        zmq_close(free_slot->sock);
        free_slot->sock = NULL;
    }
    free_slot->sock = zmq_socket(p->zctx, ZMQ_DEALER);
    if (free_slot->sock == NULL)
        return NULL;
    snprintf(ident, sizeof(ident), "proxy-%d-%llu", (int)getpid(), (unsigned long long)++p->gen);
    zmq_setsockopt(free_slot->sock, ZMQ_ROUTING_ID, ident, strlen(ident));
    zmq_setsockopt(free_slot->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(free_slot->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (zmq_connect(free_slot->sock, ep) != 0) {
        zmq_close(free_slot->sock);
        free_slot->sock = NULL;
        return NULL;
    }
    snprintf(free_slot->ep, sizeof(free_slot->ep), "%s", ep);
    return free_slot;
}

static void dealer_drop(proxy_dealer_t *d)
{
    zmq_close(d->sock);
    d->sock = NULL;
    d->ep[0] = '\0';
}

static kvt_status_t send_msg(void *sock, const kvt_msg_t *m)
{
    void *data = NULL;
    size_t len = 0;
    kvt_status_t st = kvt_msg_encode(m, &data, &len);

    if (st != KVT_OK)
        return st;
    /* [b"", payload]: what a REP-style receiver expects from a DEALER */
    if (kvt_zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        kvt_zmq_send(sock, data, len, ZMQ_DONTWAIT) < 0)
        st = KVT_ERR_IO;
    kvt_free(data);
    return st;
}

kvt_status_t kvt_proxy_reserve(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                               const char *req_id, int64_t total_chunks, int64_t ttl_ms,
                               int timeout_ms, int *granted_out, int64_t *free_chunks_out)
{
    proxy_dealer_t *d;
    kvt_status_t st;
    uint64_t deadline;

    if (granted_out == NULL)
        return KVT_ERR_INVALID;
    st = kvt_proxy_reserve_send(p, host, alloc_port, req_id, total_chunks, ttl_ms);
    if (st != KVT_OK)
        return st;
    d = dealer_find(p, host, alloc_port); /* the one it was sent on */
    if (d == NULL)
        return KVT_ERR_IO;
    deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        zmq_pollitem_t it = {.socket = d->sock, .events = ZMQ_POLLIN};
        uint64_t now = now_ms();
        zmq_msg_t f;
        int more = 0;
        size_t ml = sizeof(more);
        kvt_msg_t r;

        if (now >= deadline || zmq_poll(&it, 1, (long)(deadline - now)) <= 0 ||
            !(it.revents & ZMQ_POLLIN)) {
            if (now_ms() < deadline)
                continue;
            dealer_drop(d); /* missed its reply: never reuse it */
            return KVT_ERR_TIMEOUT;
        }
        zmq_msg_init(&f);
        if (kvt_zmq_msg_recv(&f, d->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            continue;
        }
        zmq_getsockopt(d->sock, ZMQ_RCVMORE, &more, &ml);
        if (zmq_msg_size(&f) == 0 && more) { /* REP-style delimiter */
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (kvt_zmq_msg_recv(&f, d->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&f);
                continue;
            }
        }
        st = kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &r, NULL);
        zmq_msg_close(&f);
        if (st != KVT_OK) {
            p->bad++;
            continue;
        }
        if (r.type == KVT_MSG_RESERVE_RESPONSE && strcmp(r.u.reserve_resp.req_id, req_id) == 0) {
            *granted_out = r.u.reserve_resp.granted;
            if (free_chunks_out != NULL)
                *free_chunks_out = r.u.reserve_resp.free_chunks;
            kvt_msg_clear(&r);
            return KVT_OK;
        }
        kvt_msg_clear(&r); /* a stale answer of an earlier request */
    }
}

kvt_status_t kvt_proxy_reserve_send(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                                    const char *req_id, int64_t total_chunks, int64_t ttl_ms)
{
    proxy_dealer_t *d;
    kvt_msg_t m;
    kvt_status_t st;

    if (p == NULL || host == NULL || alloc_port == 0 || req_id == NULL || req_id[0] == '\0' ||
        total_chunks < 0)
        return KVT_ERR_INVALID;
    d = dealer_get(p, host, alloc_port);
    if (d == NULL)
        return KVT_ERR_IO;
    kvt_msg_init(&m, KVT_MSG_RESERVE_REQUEST);
    m.u.reserve_req.req_id = (char *)req_id;
    m.u.reserve_req.total_chunks = total_chunks;
    m.u.reserve_req.ttl_ms = ttl_ms;
    st = send_msg(d->sock, &m);
    if (st != KVT_OK)
        dealer_drop(d);
    return st;
}

/* The payload of the next message on <sock> (a REP-style empty delimiter skipped); false when
 * none is waiting. */
static bool dealer_next(void *sock, zmq_msg_t *f)
{
    int more = 0;
    size_t ml = sizeof(more);
    zmq_msg_init(f);
    if (kvt_zmq_msg_recv(f, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(f);
        return false;
    }
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    while (more) { /* the payload is the last frame */
        zmq_msg_close(f);
        zmq_msg_init(f);
        if (kvt_zmq_msg_recv(f, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(f);
            return false;
        }
        ml = sizeof(more);
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    }
    return true;
}

kvt_status_t kvt_proxy_reserve_recv(kvt_proxy_t *p, kvt_proxy_reply_t *out)
{
    if (p == NULL || out == NULL)
        return KVT_ERR_INVALID;
    for (int i = 0; i < PROXY_MAX_DEALERS; i++) {
        proxy_dealer_t *d = &p->dealers[i];
        zmq_msg_t f;
        while (d->sock != NULL && dealer_next(d->sock, &f)) {
            kvt_msg_t r;
            kvt_status_t st = kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &r, NULL);
            zmq_msg_close(&f);
            if (st != KVT_OK) {
                p->bad++;
                continue;
            }
            if (r.type != KVT_MSG_RESERVE_RESPONSE || r.u.reserve_resp.req_id == NULL ||
                strlen(r.u.reserve_resp.req_id) >= sizeof(out->req_id)) {
                p->bad++;
                kvt_msg_clear(&r);
                continue;
            }
            snprintf(out->ep, sizeof(out->ep), "%s", d->ep);
            snprintf(out->req_id, sizeof(out->req_id), "%s", r.u.reserve_resp.req_id);
            out->granted = r.u.reserve_resp.granted;
            out->free_chunks = r.u.reserve_resp.free_chunks;
            kvt_msg_clear(&r);
            return KVT_OK;
        }
    }
    return KVT_ERR_TIMEOUT;
}

size_t kvt_proxy_reserve_fds(kvt_proxy_t *p, int *fds, size_t max)
{
    size_t n = 0;
    for (int i = 0; p != NULL && i < PROXY_MAX_DEALERS && n < max; i++) {
        int fd;
        size_t fl = sizeof(fd);
        if (p->dealers[i].sock != NULL && zmq_getsockopt(p->dealers[i].sock, ZMQ_FD, &fd, &fl) == 0)
            fds[n++] = fd;
    }
    return n;
}

int kvt_proxy_reserve_fd(kvt_proxy_t *p, const char *host, uint16_t alloc_port)
{
    proxy_dealer_t *d = p != NULL && host != NULL ? dealer_find(p, host, alloc_port) : NULL;
    int fd;
    size_t fl = sizeof(fd);
    return d != NULL && zmq_getsockopt(d->sock, ZMQ_FD, &fd, &fl) == 0 ? fd : -1;
}

void kvt_proxy_reserve_drop(kvt_proxy_t *p, const char *host, uint16_t alloc_port)
{
    proxy_dealer_t *d = p != NULL && host != NULL ? dealer_find(p, host, alloc_port) : NULL;
    if (d != NULL) /* one socket per endpoint: dealer_get never opens a second */
        dealer_drop(d);
}

void kvt_proxy_reserve_endpoint(const char *host, uint16_t alloc_port, char *ep, size_t cap)
{
    snprintf(ep, cap, "tcp://%s:%u", host, (unsigned)alloc_port);
}

kvt_status_t kvt_proxy_cancel(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                              const char *req_id, const char *const *keys, uint32_t nkeys)
{
    proxy_dealer_t *d;
    kvt_msg_t m;
    kvt_status_t st;

    if (p == NULL || host == NULL || alloc_port == 0 || req_id == NULL ||
        (nkeys > 0 && keys == NULL))
        return KVT_ERR_INVALID;
    d = dealer_get(p, host, alloc_port);
    if (d == NULL)
        return KVT_ERR_IO;
    kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
    st = kvt_msg_set_str(&m.u.cancel.req_id, req_id);
    if (st == KVT_OK)
        st = kvt_str_list_set(&m.u.cancel.keys, keys, nkeys);
    if (st == KVT_OK)
        st = send_msg(d->sock, &m);
    kvt_msg_clear(&m);
    if (st != KVT_OK)
        dealer_drop(d);
    return st;
}
