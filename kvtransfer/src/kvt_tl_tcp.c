/*
 * kvt_tl_tcp.c - TCP transport: one-sided WRITE/READ emulation against
 * registered regions over persistent lanes (TCP connections) per peer.
 *
 * Initiator side: a post is cut into frames (<= KVT_TCP_FRAME_SPLIT bytes)
 * spread round-robin over the peer's lanes. Each lane has a tx thread that
 * streams header+payload with one sendmsg and an rx thread that matches the
 * in-order replies (and receives READ payloads straight into the local
 * region). Target side: a listener thread accepts lanes; one thread per
 * lane receives WRITE payloads straight into the region and replies only
 * after the bytes landed. Every access is checked against the region bounds
 * and the grant table (pages granted to that peer).
 *
 * A lane error (EOF, reset, timeout, bad reply) stops both threads of the
 * lane; the last one out fails every queued and in-flight frame and reports
 * the peer as failed. A later post reconnects.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <fcntl.h>

#include "kvt/kvt_msg.h"
#include "kvt_tl_tcp_int.h"
#include "kvt_tsan.h"

struct kvt_tl_region {
    struct kvt_tl_region *next;
    char uuid[KVT_TL_UUID_LEN + 1];
    uint8_t *base;
    uint64_t length;
    uint64_t page_size;
    uint32_t npages;
};

typedef struct tcp_grant {
    struct tcp_grant *next;
    char peer_id[KVT_TL_PEER_ID_MAX + 1];
    kvt_tl_region_t *region;
    uint16_t *wcnt; /* per page */
    uint16_t *rcnt;
} tcp_grant_t;

typedef struct tcp_post tcp_post_t;

typedef struct tcp_frame {
    struct tcp_frame *next;
    tcp_post_t *post;
    uint8_t op;
    uint32_t seq;
    uint8_t *local;
    uint64_t length;
    uint64_t remote_offset;
    int sent; /* the tx thread is done with <local> (under the lane lock) */
    char uuid[KVT_TL_UUID_LEN + 1];
} tcp_frame_t;

struct tcp_post {
    kvt_tl_t *tl;
    uint64_t cookie;
    atomic_size_t remaining;
    atomic_int status;
    size_t nframes;
    tcp_frame_t frames[];
};

typedef struct tcp_peer tcp_peer_t;

typedef struct tcp_lane {
    tcp_peer_t *peer;
    int fd;
    pthread_t tx, rx;
    int threads; /* started threads */
    int alive;   /* threads still running (under lock) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    tcp_frame_t *txq_head, *txq_tail;
    tcp_frame_t *inf_head, *inf_tail;
    int dead;
    kvt_status_t why;
    uint32_t next_seq;
} tcp_lane_t;

struct tcp_peer {
    struct tcp_peer *next;
    kvt_tl_t *tl;
    char id[KVT_TL_PEER_ID_MAX + 1];
    char host[256];
    uint16_t port;
    pthread_mutex_t lock; /* connect / teardown / post */
    int have_addr;
    int connected;
    atomic_int stopping; /* teardown in progress: lane deaths are not failures */
    atomic_int failed;
    unsigned nlanes;
    tcp_lane_t *lanes;
    unsigned rr;
};

typedef struct tcp_conn {
    struct tcp_conn *next;
    kvt_tl_t *tl;
    int fd;
    pthread_t th;
    atomic_int done;
} tcp_conn_t;

struct kvt_tl {
    kvt_tl_callbacks_t cb;
    char local_id[KVT_TL_PEER_ID_MAX + 1];
    char advertise[256];
    uint16_t port;
    unsigned lanes;
    unsigned timeout_ms;
    int listen_fd;
    int wake_fd;
    pthread_t listener;
    pthread_mutex_t lock; /* regions, grants, peers list, conns list */
    kvt_tl_region_t *regions;
    tcp_grant_t *grants;
    tcp_peer_t *peers;
    tcp_conn_t *conns;
    atomic_int stopping;
    struct {
        atomic_uint_fast64_t bytes_written, bytes_read, bytes_served, ops_completed, ops_failed,
            access_denied, bad_frames, peer_failures;
    } st;
};

/* ---------------------------------------------------------------- I/O helpers */

static kvt_status_t io_status(ssize_t r)
{
    if (r == 0)
        return KVT_ERR_PEER;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return KVT_ERR_TIMEOUT;
    return KVT_ERR_PEER;
}

static kvt_status_t recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, MSG_WAITALL);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return io_status(r);
        }
        p += r;
        len -= (size_t)r;
    }
    return KVT_OK;
}

/* Like recv_all for the first bytes of a frame: while none of it has arrived, a receive
 * timeout only means the lane is idle, so keep waiting; once it started, the frame must
 * complete within the timeout. */
static kvt_status_t recv_frame_start(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, p + got, len - got, MSG_WAITALL);
        if (r <= 0) {
            if (r < 0 &&
                (errno == EINTR || (got == 0 && (errno == EAGAIN || errno == EWOULDBLOCK))))
                continue;
            return io_status(r);
        }
        got += (size_t)r;
    }
    return KVT_OK;
}

static kvt_status_t send_iov(int fd, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return io_status(r);
        }
        while (iovcnt > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return KVT_OK;
}

static kvt_status_t send_all(int fd, const void *buf, size_t len)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return send_iov(fd, &iov, 1);
}

static void set_timeouts(int fd, unsigned ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ---------------------------------------------------------------- regions, grants */

static kvt_tl_region_t *region_find_locked(kvt_tl_t *tl, const char *uuid)
{
    for (kvt_tl_region_t *r = tl->regions; r != NULL; r = r->next) {
        if (strcmp(r->uuid, uuid) == 0)
            return r;
    }
    return NULL;
}

static tcp_grant_t *grant_find_locked(kvt_tl_t *tl, const char *peer, kvt_tl_region_t *r)
{
    for (tcp_grant_t *g = tl->grants; g != NULL; g = g->next) {
        if (g->region == r && strcmp(g->peer_id, peer) == 0)
            return g;
    }
    return NULL;
}

/* Check an incoming access of <peer>; returns the target address. */
static kvt_status_t access_check(kvt_tl_t *tl, const char *peer, const kvt_tcp_hdr_t *h,
                                 unsigned access, uint8_t **addr)
{
    kvt_status_t status = KVT_ERR_ACCESS;
    kvt_tl_region_t *r;
    tcp_grant_t *g;

    pthread_mutex_lock(&tl->lock);
    r = region_find_locked(tl, h->uuid);
    if (r == NULL || !kvt_tcp_range_ok(h->offset, h->length, r->length))
        goto out;
    g = grant_find_locked(tl, peer, r);
    if (g == NULL)
        goto out;
    if (h->length > 0) {
        uint64_t first = h->offset / r->page_size;
        uint64_t last = (h->offset + h->length - 1) / r->page_size;
        uint16_t *cnt = (access == KVT_TL_ACCESS_WRITE) ? g->wcnt : g->rcnt;
        for (uint64_t p = first; p <= last; p++) {
            if (cnt[p] == 0)
                goto out;
        }
    }
    *addr = r->base + h->offset;
    status = KVT_OK;
out:
    pthread_mutex_unlock(&tl->lock);
    if (status != KVT_OK)
        atomic_fetch_add(&tl->st.access_denied, 1);
    return status;
}

static kvt_status_t tcp_reg_region(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                                   kvt_tl_region_t **out)
{
    kvt_tl_region_t *r;

    if (tl == NULL || p == NULL || p->uuid == NULL || strlen(p->uuid) != KVT_TL_UUID_LEN ||
        p->base == NULL || p->length == 0 || p->page_size == 0 || p->length % p->page_size ||
        p->length / p->page_size > UINT32_MAX)
        return KVT_ERR_INVALID;
    r = kvt_calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NOMEM;
    memcpy(r->uuid, p->uuid, KVT_TL_UUID_LEN + 1);
    r->base = p->base;
    r->length = p->length;
    r->page_size = p->page_size;
    r->npages = (uint32_t)(p->length / p->page_size);
    pthread_mutex_lock(&tl->lock);
    if (region_find_locked(tl, p->uuid) != NULL) {
        pthread_mutex_unlock(&tl->lock);
        kvt_free(r);
        return KVT_ERR_EXISTS;
    }
    r->next = tl->regions;
    tl->regions = r;
    pthread_mutex_unlock(&tl->lock);
    *out = r;
    return KVT_OK;
}

static void grant_free(tcp_grant_t *g)
{
    kvt_free(g->wcnt);
    kvt_free(g->rcnt);
    kvt_free(g);
}

static void tcp_dereg_region(kvt_tl_t *tl, kvt_tl_region_t *region)
{
    if (tl == NULL || region == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    for (kvt_tl_region_t **pp = &tl->regions; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == region) {
            *pp = region->next;
            break;
        }
    }
    for (tcp_grant_t **gp = &tl->grants; *gp != NULL;) {
        tcp_grant_t *g = *gp;
        if (g->region == region) {
            *gp = g->next;
            grant_free(g);
        } else {
            gp = &g->next;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    kvt_free(region);
}

static kvt_status_t tcp_grant(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                              const uint32_t *pages, size_t n, unsigned access)
{
    tcp_grant_t *g;
    kvt_status_t status = KVT_OK;

    if (tl == NULL || peer_id == NULL || region == NULL || (n > 0 && pages == NULL) ||
        strlen(peer_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (pages[i] >= region->npages)
            return KVT_ERR_INVALID;
    }
    pthread_mutex_lock(&tl->lock);
    g = grant_find_locked(tl, peer_id, region);
    if (g == NULL) {
        g = kvt_calloc(1, sizeof(*g));
        if (g != NULL) {
            g->wcnt = kvt_calloc(region->npages, sizeof(uint16_t));
            g->rcnt = kvt_calloc(region->npages, sizeof(uint16_t));
        }
        if (g == NULL || g->wcnt == NULL || g->rcnt == NULL) {
            if (g != NULL)
                grant_free(g);
            status = KVT_ERR_NOMEM;
            goto out;
        }
        snprintf(g->peer_id, sizeof(g->peer_id), "%s", peer_id);
        g->region = region;
        g->next = tl->grants;
        tl->grants = g;
    }
    for (size_t i = 0; i < n; i++) {
        if ((access & KVT_TL_ACCESS_WRITE) && g->wcnt[pages[i]] < UINT16_MAX)
            g->wcnt[pages[i]]++;
        if ((access & KVT_TL_ACCESS_READ) && g->rcnt[pages[i]] < UINT16_MAX)
            g->rcnt[pages[i]]++;
    }
out:
    pthread_mutex_unlock(&tl->lock);
    return status;
}

static void tcp_revoke(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                       const uint32_t *pages, size_t n, unsigned access)
{
    tcp_grant_t *g;

    if (tl == NULL || peer_id == NULL || region == NULL || pages == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    g = grant_find_locked(tl, peer_id, region);
    if (g != NULL) {
        for (size_t i = 0; i < n; i++) {
            if (pages[i] >= region->npages)
                continue;
            if ((access & KVT_TL_ACCESS_WRITE) && g->wcnt[pages[i]] > 0)
                g->wcnt[pages[i]]--;
            if ((access & KVT_TL_ACCESS_READ) && g->rcnt[pages[i]] > 0)
                g->rcnt[pages[i]]--;
        }
    }
    pthread_mutex_unlock(&tl->lock);
}

/* ---------------------------------------------------------------- target side */

static kvt_status_t drain(int fd, uint64_t len)
{
    uint8_t scratch[16384];
    while (len > 0) {
        size_t n = len > sizeof(scratch) ? sizeof(scratch) : (size_t)len;
        kvt_status_t st = recv_all(fd, scratch, n);
        if (st != KVT_OK)
            return st;
        len -= n;
    }
    return KVT_OK;
}

static kvt_status_t send_reply(int fd, kvt_status_t status, uint32_t seq, const void *payload,
                               uint64_t len)
{
    uint8_t rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t r = {.status = status, .seq = seq};
    struct iovec iov[2];

    kvt_tcp_reply_encode(&r, rb);
    iov[0].iov_base = rb;
    iov[0].iov_len = sizeof(rb);
    iov[1].iov_base = (void *)payload;
    iov[1].iov_len = (size_t)len;
    return send_iov(fd, iov, payload != NULL && len > 0 ? 2 : 1);
}

kvt_status_t kvt_tl_tcp_serve_fd(kvt_tl_t *tl, int fd)
{
    uint8_t hb[KVT_TCP_HDR_LEN];
    char peer[KVT_TL_PEER_ID_MAX + 1];
    kvt_tcp_hdr_t h;
    kvt_status_t st;

    st = recv_all(fd, hb, sizeof(hb));
    if (st != KVT_OK)
        return st;
    if (kvt_tcp_hdr_decode(hb, sizeof(hb), &h) != KVT_OK || h.op != KVT_TCP_OP_HELLO) {
        atomic_fetch_add(&tl->st.bad_frames, 1);
        return KVT_ERR_PROTO;
    }
    st = recv_all(fd, peer, (size_t)h.length);
    if (st != KVT_OK)
        return st;
    peer[h.length] = '\0';
    if (strlen(peer) != h.length) {
        atomic_fetch_add(&tl->st.bad_frames, 1);
        return KVT_ERR_PROTO;
    }
    st = send_reply(fd, KVT_OK, h.seq, NULL, 0);
    if (st != KVT_OK)
        return st;

    for (;;) {
        uint8_t *addr = NULL;
        kvt_status_t ast;

        st = recv_frame_start(fd, hb, sizeof(hb));
        if (st != KVT_OK)
            return st == KVT_ERR_PEER ? KVT_OK : st; /* EOF between frames = clean close */
        if (kvt_tcp_hdr_decode(hb, sizeof(hb), &h) != KVT_OK || h.op == KVT_TCP_OP_HELLO) {
            atomic_fetch_add(&tl->st.bad_frames, 1);
            return KVT_ERR_PROTO;
        }
        if (h.op == KVT_TCP_OP_WRITE) {
            ast = access_check(tl, peer, &h, KVT_TL_ACCESS_WRITE, &addr);
            st = (ast == KVT_OK) ? recv_all(fd, addr, (size_t)h.length) : drain(fd, h.length);
            if (st != KVT_OK)
                return st;
            if (ast == KVT_OK)
                atomic_fetch_add(&tl->st.bytes_served, h.length);
            KVT_TSAN_WIRE_RELEASE();
            /* the bytes are in the region now: only then acknowledge */
            st = send_reply(fd, ast, h.seq, NULL, 0);
        } else {
            ast = access_check(tl, peer, &h, KVT_TL_ACCESS_READ, &addr);
            if (ast == KVT_OK)
                atomic_fetch_add(&tl->st.bytes_served, h.length);
            st = send_reply(fd, ast, h.seq, ast == KVT_OK ? addr : NULL,
                            ast == KVT_OK ? h.length : 0);
            KVT_TSAN_WIRE_RELEASE();
        }
        if (st != KVT_OK)
            return st;
    }
}

static void *conn_main(void *arg)
{
    tcp_conn_t *c = arg;
    (void)kvt_tl_tcp_serve_fd(c->tl, c->fd);
    shutdown(c->fd, SHUT_RDWR);
    atomic_store(&c->done, 1);
    return NULL;
}

static void reap_conns(kvt_tl_t *tl, int all)
{
    tcp_conn_t *dead = NULL;

    pthread_mutex_lock(&tl->lock);
    for (tcp_conn_t **cp = &tl->conns; *cp != NULL;) {
        tcp_conn_t *c = *cp;
        if (all || atomic_load(&c->done)) {
            *cp = c->next;
            c->next = dead;
            dead = c;
        } else {
            cp = &c->next;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    while (dead != NULL) {
        tcp_conn_t *c = dead;
        dead = c->next;
        shutdown(c->fd, SHUT_RDWR);
        pthread_join(c->th, NULL);
        close(c->fd);
        kvt_free(c);
    }
}

static void *listener_main(void *arg)
{
    kvt_tl_t *tl = arg;

    while (!atomic_load(&tl->stopping)) {
        struct pollfd pfd[2] = {{.fd = tl->listen_fd, .events = POLLIN},
                                {.fd = tl->wake_fd, .events = POLLIN}};
        int fd;
        tcp_conn_t *c;

        if (poll(pfd, 2, 1000) < 0 && errno != EINTR)
            break;
        reap_conns(tl, 0);
        if (!(pfd[0].revents & POLLIN))
            continue;
        fd = accept4(tl->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        /* a frame in progress (and the HELLO) must arrive within the timeout, so a peer
         * that hangs mid-frame cannot hold this thread; an idle lane between frames may
         * sit forever (recv_frame_start) */
        set_timeouts(fd, tl->timeout_ms);
        c = kvt_calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->tl = tl;
        c->fd = fd;
        if (pthread_create(&c->th, NULL, conn_main, c) != 0) {
            close(fd);
            kvt_free(c);
            continue;
        }
        pthread_mutex_lock(&tl->lock);
        c->next = tl->conns;
        tl->conns = c;
        pthread_mutex_unlock(&tl->lock);
    }
    return NULL;
}

/* ---------------------------------------------------------------- initiator side */

static void frame_done(tcp_frame_t *f, kvt_status_t st)
{
    tcp_post_t *p = f->post;
    kvt_tl_t *tl = p->tl;

    if (st != KVT_OK) {
        int expect = KVT_OK;
        atomic_compare_exchange_strong(&p->status, &expect, (int)st);
        atomic_fetch_add(&tl->st.ops_failed, 1);
    } else {
        atomic_fetch_add(&tl->st.ops_completed, 1);
        if (f->op == KVT_TCP_OP_WRITE)
            atomic_fetch_add(&tl->st.bytes_written, f->length);
        else
            atomic_fetch_add(&tl->st.bytes_read, f->length);
    }
    if (atomic_fetch_sub(&p->remaining, 1) == 1) {
        if (tl->cb.on_complete != NULL)
            tl->cb.on_complete(tl->cb.arg, p->cookie, (kvt_status_t)atomic_load(&p->status));
        kvt_free(p);
    }
}

/* Called by a lane thread on its way out. The last one fails what is left. */
static void lane_exit(tcp_lane_t *l, kvt_status_t why)
{
    tcp_frame_t *left = NULL, *tail = NULL;
    tcp_peer_t *peer = l->peer;
    kvt_tl_t *tl = peer->tl;
    int last, report = 0;

    pthread_mutex_lock(&l->lock);
    if (!l->dead) {
        l->dead = 1;
        l->why = why;
    }
    shutdown(l->fd, SHUT_RDWR);
    pthread_cond_broadcast(&l->cond);
    last = (--l->alive == 0);
    if (last) {
        /* in-flight frames first, they were posted earlier */
        left = l->inf_head;
        tail = l->inf_tail;
        if (left == NULL) {
            left = l->txq_head;
        } else {
            tail->next = l->txq_head;
        }
        l->inf_head = l->inf_tail = l->txq_head = l->txq_tail = NULL;
        why = l->why;
    }
    pthread_mutex_unlock(&l->lock);
    if (!last)
        return;
    if (!peer->stopping) {
        int expect = 0;
        report = atomic_compare_exchange_strong(&peer->failed, &expect, 1);
    }
    while (left != NULL) {
        tcp_frame_t *f = left;
        left = f->next;
        frame_done(f, why == KVT_OK ? KVT_ERR_PEER : why);
    }
    if (report) {
        atomic_fetch_add(&tl->st.peer_failures, 1);
        if (tl->cb.on_peer_failed != NULL)
            tl->cb.on_peer_failed(tl->cb.arg, peer->id, why == KVT_OK ? KVT_ERR_PEER : why);
    }
}

static void *lane_tx_main(void *arg)
{
    tcp_lane_t *l = arg;
    kvt_status_t why = KVT_OK;

    for (;;) {
        tcp_frame_t *f;
        kvt_tcp_hdr_t h;
        uint8_t hb[KVT_TCP_HDR_LEN];
        struct iovec iov[2];

        pthread_mutex_lock(&l->lock);
        while (!l->dead && l->txq_head == NULL)
            pthread_cond_wait(&l->cond, &l->lock);
        if (l->dead) {
            pthread_mutex_unlock(&l->lock);
            break;
        }
        f = l->txq_head;
        l->txq_head = f->next;
        if (l->txq_head == NULL)
            l->txq_tail = NULL;
        f->seq = l->next_seq++;
        /* in flight before the bytes go out: the reply may race the append */
        f->next = NULL;
        if (l->inf_tail != NULL)
            l->inf_tail->next = f;
        else
            l->inf_head = f;
        l->inf_tail = f;
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);

        memset(&h, 0, sizeof(h));
        h.op = f->op;
        h.seq = f->seq;
        memcpy(h.uuid, f->uuid, sizeof(h.uuid));
        h.offset = f->remote_offset;
        h.length = f->length;
        kvt_tcp_hdr_encode(&h, hb);
        iov[0].iov_base = hb;
        iov[0].iov_len = sizeof(hb);
        iov[1].iov_base = f->local;
        iov[1].iov_len = (size_t)f->length;
        why = send_iov(l->fd, iov, (f->op == KVT_TCP_OP_WRITE && f->length > 0) ? 2 : 1);
        if (why != KVT_OK)
            break;
        /* the reply cannot come before the bytes left, but say so explicitly:
         * the frame may complete (and its memory be reused) only after this */
        pthread_mutex_lock(&l->lock);
        f->sent = 1;
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
    }
    lane_exit(l, why);
    return NULL;
}

static void *lane_rx_main(void *arg)
{
    tcp_lane_t *l = arg;
    kvt_status_t why = KVT_OK;

    for (;;) {
        uint8_t rb[KVT_TCP_REPLY_LEN];
        kvt_tcp_reply_t r;
        tcp_frame_t *f;

        pthread_mutex_lock(&l->lock);
        if (!l->dead && l->inf_head == NULL) {
            /* idle: watch the socket so a dead peer is noticed at once */
            struct pollfd pfd = {.fd = l->fd, .events = POLLIN | POLLRDHUP};
            int pr;
            pthread_mutex_unlock(&l->lock);
            pr = poll(&pfd, 1, 100);
            pthread_mutex_lock(&l->lock);
            if (pr > 0 && l->inf_head == NULL && !l->dead) {
                char c;
                ssize_t pk = recv(l->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
                if (pk == 0 || (pk < 0 && errno != EAGAIN && errno != EINTR) ||
                    (pfd.revents & (POLLERR | POLLHUP))) {
                    why = KVT_ERR_PEER;
                } else if (pk > 0) {
                    why = KVT_ERR_PROTO; /* bytes nobody asked for */
                }
                if (why != KVT_OK) {
                    pthread_mutex_unlock(&l->lock);
                    break;
                }
            }
            pthread_mutex_unlock(&l->lock);
            continue;
        }
        if (l->dead) {
            pthread_mutex_unlock(&l->lock);
            break;
        }
        f = l->inf_head; /* stays queued until its reply is complete */
        pthread_mutex_unlock(&l->lock);

        why = recv_all(l->fd, rb, sizeof(rb));
        if (why != KVT_OK)
            break;
        if (kvt_tcp_reply_decode(rb, sizeof(rb), &r) != KVT_OK || r.seq != f->seq) {
            atomic_fetch_add(&l->peer->tl->st.bad_frames, 1);
            why = KVT_ERR_PROTO;
            break;
        }
        if (r.status == KVT_OK && f->op == KVT_TCP_OP_READ && f->length > 0) {
            why = recv_all(l->fd, f->local, (size_t)f->length);
            if (why != KVT_OK)
                break;
        }
        pthread_mutex_lock(&l->lock);
        while (!f->sent && !l->dead)
            pthread_cond_wait(&l->cond, &l->lock);
        if (!f->sent) {
            pthread_mutex_unlock(&l->lock);
            break; /* the lane died: lane_exit fails the frame */
        }
        l->inf_head = f->next;
        if (l->inf_head == NULL)
            l->inf_tail = NULL;
        pthread_mutex_unlock(&l->lock);
        frame_done(f, (kvt_status_t)r.status);
    }
    lane_exit(l, why);
    return NULL;
}

static kvt_status_t dial(const char *host, uint16_t port, unsigned timeout_ms, int *out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    char ps[16];
    kvt_status_t status = KVT_ERR_PEER;

    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return KVT_ERR_PEER;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct pollfd pfd;
        int err = 0;
        socklen_t elen = sizeof(err);

        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            close(fd);
            continue;
        }
        pfd.fd = fd;
        pfd.events = POLLOUT;
        if (poll(&pfd, 1, (int)timeout_ms) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
            close(fd);
            status = KVT_ERR_PEER;
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        *out = fd;
        status = KVT_OK;
        break;
    }
    freeaddrinfo(res);
    return status;
}

/* Stop every lane of <p> (peer lock held): join threads, fail frames. */
static void peer_teardown_locked(tcp_peer_t *p)
{
    if (p->lanes == NULL) {
        p->stopping = 0;
        return;
    }
    p->stopping = 1;
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        pthread_mutex_lock(&l->lock);
        if (!l->dead) {
            l->dead = 1;
            l->why = KVT_ERR_CLOSED;
        }
        if (l->fd >= 0)
            shutdown(l->fd, SHUT_RDWR);
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
    }
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        if (l->threads >= 1)
            pthread_join(l->tx, NULL);
        if (l->threads >= 2)
            pthread_join(l->rx, NULL);
        if (l->fd >= 0)
            close(l->fd);
        pthread_mutex_destroy(&l->lock);
        pthread_cond_destroy(&l->cond);
    }
    kvt_free(p->lanes);
    p->lanes = NULL;
    p->nlanes = 0;
    p->connected = 0;
    p->stopping = 0;
}

static kvt_status_t lane_open(kvt_tl_t *tl, tcp_peer_t *p, tcp_lane_t *l)
{
    uint8_t hb[KVT_TCP_HDR_LEN], rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;
    size_t idlen = strlen(tl->local_id);
    kvt_status_t st;

    st = dial(p->host, p->port, tl->timeout_ms, &l->fd);
    if (st != KVT_OK)
        return st;
    set_timeouts(l->fd, tl->timeout_ms);
    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_HELLO;
    h.length = idlen;
    kvt_tcp_hdr_encode(&h, hb);
    st = send_all(l->fd, hb, sizeof(hb));
    if (st == KVT_OK)
        st = send_all(l->fd, tl->local_id, idlen);
    if (st == KVT_OK)
        st = recv_all(l->fd, rb, sizeof(rb));
    if (st == KVT_OK && (kvt_tcp_reply_decode(rb, sizeof(rb), &r) != KVT_OK || r.status != 0))
        st = KVT_ERR_PROTO;
    return st;
}

static kvt_status_t peer_connect_locked(kvt_tl_t *tl, tcp_peer_t *p)
{
    kvt_status_t st = KVT_OK;

    peer_teardown_locked(p);
    if (!p->have_addr)
        return KVT_ERR_NOT_FOUND;
    p->lanes = kvt_calloc(tl->lanes, sizeof(tcp_lane_t));
    if (p->lanes == NULL)
        return KVT_ERR_NOMEM;
    p->nlanes = tl->lanes;
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        l->peer = p;
        l->fd = -1;
        pthread_mutex_init(&l->lock, NULL);
        pthread_cond_init(&l->cond, NULL);
    }
    for (unsigned i = 0; i < p->nlanes && st == KVT_OK; i++) {
        tcp_lane_t *l = &p->lanes[i];
        st = lane_open(tl, p, l);
        if (st != KVT_OK)
            break;
        l->alive = 2;
        if (pthread_create(&l->tx, NULL, lane_tx_main, l) != 0) {
            l->alive = 0;
            st = KVT_ERR_NOMEM;
            break;
        }
        l->threads = 1;
        if (pthread_create(&l->rx, NULL, lane_rx_main, l) != 0) {
            pthread_mutex_lock(&l->lock);
            l->alive--;
            l->dead = 1;
            l->why = KVT_ERR_NOMEM;
            pthread_cond_broadcast(&l->cond);
            pthread_mutex_unlock(&l->lock);
            st = KVT_ERR_NOMEM;
            break;
        }
        l->threads = 2;
    }
    if (st != KVT_OK) {
        p->stopping = 1; /* a failed dial is reported by post's status */
        peer_teardown_locked(p);
        return st;
    }
    atomic_store(&p->failed, 0);
    p->connected = 1;
    return KVT_OK;
}

static tcp_peer_t *peer_get(kvt_tl_t *tl, const char *id, int create)
{
    tcp_peer_t *p;

    pthread_mutex_lock(&tl->lock);
    for (p = tl->peers; p != NULL; p = p->next) {
        if (strcmp(p->id, id) == 0)
            break;
    }
    if (p == NULL && create) {
        p = kvt_calloc(1, sizeof(*p));
        if (p != NULL) {
            p->tl = tl;
            snprintf(p->id, sizeof(p->id), "%s", id);
            pthread_mutex_init(&p->lock, NULL);
            p->next = tl->peers;
            tl->peers = p;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    return p;
}

static kvt_status_t tcp_peer_prepare(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len)
{
    kvt_msg_t m;
    kvt_msg_transport_lane_t lane;
    void *data = NULL;
    size_t dlen = 0;
    kvt_status_t st;

    if (tl == NULL || peer_id == NULL || blob == NULL || len == NULL)
        return KVT_ERR_INVALID;
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    memset(&lane, 0, sizeof(lane));
    lane.host = tl->advertise;
    lane.port = tl->port;
    m.u.tinit.node_id = tl->local_id;
    m.u.tinit.transport = "tcp";
    m.u.tinit.lanes = &lane;
    m.u.tinit.nlanes = 1;
    m.u.tinit.version = 1;
    st = kvt_msg_encode(&m, &data, &dlen);
    /* the fields point at our own storage: nothing to clear */
    if (st != KVT_OK)
        return st;
    if (dlen > *len) {
        kvt_free(data);
        return KVT_ERR_LIMIT;
    }
    memcpy(blob, data, dlen);
    *len = dlen;
    kvt_free(data);
    return KVT_OK;
}

static kvt_status_t tcp_peer_connect(kvt_tl_t *tl, const char *peer_id, const void *blob,
                                     size_t len)
{
    kvt_msg_t m;
    char host[256];
    int64_t port;
    tcp_peer_t *p;
    kvt_status_t st;

    if (tl == NULL || peer_id == NULL || blob == NULL || len == 0 ||
        strlen(peer_id) > KVT_TL_PEER_ID_MAX || peer_id[0] == '\0')
        return KVT_ERR_INVALID;
    st = kvt_msg_decode(blob, len, &m, NULL);
    if (st != KVT_OK)
        return st;
    if (m.type != KVT_MSG_TRANSPORT_INIT || strcmp(m.u.tinit.transport, "tcp") != 0 ||
        m.u.tinit.nlanes < 1 || m.u.tinit.lanes[0].host == NULL ||
        m.u.tinit.lanes[0].host[0] == '\0' || strlen(m.u.tinit.lanes[0].host) >= sizeof(host) ||
        m.u.tinit.lanes[0].port <= 0 || m.u.tinit.lanes[0].port > 65535) {
        kvt_msg_clear(&m);
        return KVT_ERR_PROTO;
    }
    snprintf(host, sizeof(host), "%s", m.u.tinit.lanes[0].host);
    port = m.u.tinit.lanes[0].port;
    kvt_msg_clear(&m);
    p = peer_get(tl, peer_id, 1);
    if (p == NULL)
        return KVT_ERR_NOMEM;
    pthread_mutex_lock(&p->lock);
    if (!p->have_addr || strcmp(p->host, host) != 0 || p->port != port || atomic_load(&p->failed)) {
        p->stopping = 1;
        peer_teardown_locked(p);
        snprintf(p->host, sizeof(p->host), "%s", host);
        p->port = (uint16_t)port;
        p->have_addr = 1;
        atomic_store(&p->failed, 0);
    }
    pthread_mutex_unlock(&p->lock);
    return KVT_OK;
}

static void tcp_peer_remove(kvt_tl_t *tl, const char *peer_id)
{
    tcp_peer_t *p;

    if (tl == NULL || peer_id == NULL)
        return;
    p = peer_get(tl, peer_id, 0);
    if (p != NULL) {
        pthread_mutex_lock(&p->lock);
        p->stopping = 1;
        peer_teardown_locked(p);
        p->have_addr = 0;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&tl->lock);
    for (tcp_grant_t **gp = &tl->grants; *gp != NULL;) {
        tcp_grant_t *g = *gp;
        if (strcmp(g->peer_id, peer_id) == 0) {
            *gp = g->next;
            grant_free(g);
        } else {
            gp = &g->next;
        }
    }
    pthread_mutex_unlock(&tl->lock);
}

static kvt_status_t tcp_post(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
                             const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie)
{
    tcp_peer_t *p;
    tcp_post_t *post;
    size_t nframes = 0, k = 0;
    kvt_status_t st;

    if (tl == NULL || peer_id == NULL || xfers == NULL || n == 0 ||
        (op != KVT_TL_OP_WRITE && op != KVT_TL_OP_READ))
        return KVT_ERR_INVALID;
    if (atomic_load(&tl->stopping))
        return KVT_ERR_CLOSED;
    for (size_t i = 0; i < n; i++) {
        const kvt_tl_xfer_t *x = &xfers[i];
        if (x->local == NULL || !kvt_tcp_range_ok(x->local_offset, x->length, x->local->length) ||
            strlen(x->remote_uuid) != KVT_TL_UUID_LEN)
            return KVT_ERR_INVALID;
        nframes += x->length == 0 ? 1 : (x->length + KVT_TCP_FRAME_SPLIT - 1) / KVT_TCP_FRAME_SPLIT;
    }
    post = kvt_calloc(1, sizeof(*post) + nframes * sizeof(tcp_frame_t));
    if (post == NULL)
        return KVT_ERR_NOMEM;
    post->tl = tl;
    post->cookie = cookie;
    post->nframes = nframes;
    atomic_init(&post->remaining, nframes);
    atomic_init(&post->status, KVT_OK);
    for (size_t i = 0; i < n; i++) {
        const kvt_tl_xfer_t *x = &xfers[i];
        uint64_t off = 0;
        do {
            tcp_frame_t *f = &post->frames[k++];
            uint64_t chunk = x->length - off;
            if (chunk > KVT_TCP_FRAME_SPLIT)
                chunk = KVT_TCP_FRAME_SPLIT;
            f->post = post;
            f->op = op == KVT_TL_OP_WRITE ? KVT_TCP_OP_WRITE : KVT_TCP_OP_READ;
            f->local = x->local->base + x->local_offset + off;
            f->length = chunk;
            f->remote_offset = x->remote_offset + off;
            memcpy(f->uuid, x->remote_uuid, sizeof(f->uuid));
            off += chunk;
        } while (off < x->length);
    }

    p = peer_get(tl, peer_id, 0);
    if (p == NULL) {
        kvt_free(post);
        return KVT_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&p->lock);
    if (!p->connected || atomic_load(&p->failed)) {
        st = peer_connect_locked(tl, p);
        if (st != KVT_OK) {
            pthread_mutex_unlock(&p->lock);
            kvt_free(post);
            return st;
        }
    }
    for (size_t i = 0; i < nframes; i++) {
        tcp_frame_t *f = &post->frames[i];
        tcp_lane_t *l = &p->lanes[p->rr++ % p->nlanes];
        int dead;
        pthread_mutex_lock(&l->lock);
        dead = l->dead;
        if (!dead) {
            f->next = NULL;
            if (l->txq_tail != NULL)
                l->txq_tail->next = f;
            else
                l->txq_head = f;
            l->txq_tail = f;
            pthread_cond_broadcast(&l->cond);
        }
        pthread_mutex_unlock(&l->lock);
        if (dead)
            frame_done(f, KVT_ERR_PEER);
    }
    pthread_mutex_unlock(&p->lock);
    return KVT_OK;
}

static void tcp_stats(kvt_tl_t *tl, kvt_tl_stats_t *out)
{
    if (tl == NULL || out == NULL)
        return;
    out->bytes_written = atomic_load(&tl->st.bytes_written);
    out->bytes_read = atomic_load(&tl->st.bytes_read);
    out->bytes_served = atomic_load(&tl->st.bytes_served);
    out->ops_completed = atomic_load(&tl->st.ops_completed);
    out->ops_failed = atomic_load(&tl->st.ops_failed);
    out->access_denied = atomic_load(&tl->st.access_denied);
    out->bad_frames = atomic_load(&tl->st.bad_frames);
    out->peer_failures = atomic_load(&tl->st.peer_failures);
}

/* ---------------------------------------------------------------- create/destroy */

static kvt_status_t listen_on(const char *host, uint16_t port, int *fd_out, uint16_t *port_out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res, *ai;
    char ps[16];
    kvt_status_t status = KVT_ERR_IO;

    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return KVT_ERR_INVALID;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int one = 1;
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);

        if (fd < 0)
            continue;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            close(fd);
            continue;
        }
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
        *fd_out = fd;
        status = KVT_OK;
        break;
    }
    freeaddrinfo(res);
    return status;
}

static kvt_status_t tcp_create(const kvt_tl_config_t *cfg, const kvt_tl_callbacks_t *cb,
                               kvt_tl_t **out)
{
    kvt_tl_t *tl;
    const char *host;
    kvt_status_t st;

    if (cfg == NULL || out == NULL || cfg->local_id == NULL || cfg->local_id[0] == '\0' ||
        strlen(cfg->local_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    tl = kvt_calloc(1, sizeof(*tl));
    if (tl == NULL)
        return KVT_ERR_NOMEM;
    if (cb != NULL)
        tl->cb = *cb;
    snprintf(tl->local_id, sizeof(tl->local_id), "%s", cfg->local_id);
    host = cfg->listen_host != NULL ? cfg->listen_host : "127.0.0.1";
    snprintf(tl->advertise, sizeof(tl->advertise), "%s",
             cfg->advertise_host != NULL                                 ? cfg->advertise_host
             : (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) ? "127.0.0.1"
                                                                         : host);
    tl->lanes = cfg->lanes ? cfg->lanes : KVT_TL_DEFAULT_LANES;
    if (tl->lanes > 64)
        tl->lanes = 64;
    tl->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 30000;
    pthread_mutex_init(&tl->lock, NULL);
    st = listen_on(host, cfg->listen_port, &tl->listen_fd, &tl->port);
    if (st != KVT_OK)
        goto err_lock;
    tl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (tl->wake_fd < 0) {
        st = KVT_ERR_IO;
        goto err_listen;
    }
    if (pthread_create(&tl->listener, NULL, listener_main, tl) != 0) {
        st = KVT_ERR_NOMEM;
        goto err_wake;
    }
    *out = tl;
    return KVT_OK;

err_wake:
    close(tl->wake_fd);
err_listen:
    close(tl->listen_fd);
err_lock:
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
    return st;
}

static void tcp_destroy(kvt_tl_t *tl)
{
    uint64_t one = 1;

    if (tl == NULL)
        return;
    atomic_store(&tl->stopping, 1);
    if (write(tl->wake_fd, &one, sizeof(one)) < 0) {
        /* the listener also wakes up by its poll timeout */
    }
    pthread_join(tl->listener, NULL);
    close(tl->listen_fd);
    close(tl->wake_fd);
    while (tl->peers != NULL) {
        tcp_peer_t *p = tl->peers;
        tl->peers = p->next;
        pthread_mutex_lock(&p->lock);
        p->stopping = 1;
        peer_teardown_locked(p);
        pthread_mutex_unlock(&p->lock);
        pthread_mutex_destroy(&p->lock);
        kvt_free(p);
    }
    reap_conns(tl, 1);
    while (tl->grants != NULL) {
        tcp_grant_t *g = tl->grants;
        tl->grants = g->next;
        grant_free(g);
    }
    while (tl->regions != NULL) {
        kvt_tl_region_t *r = tl->regions;
        tl->regions = r->next;
        kvt_free(r);
    }
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
}

static const kvt_tl_ops_t tcp_ops = {
    .create = tcp_create,
    .destroy = tcp_destroy,
    .reg_region = tcp_reg_region,
    .dereg_region = tcp_dereg_region,
    .peer_prepare = tcp_peer_prepare,
    .peer_connect = tcp_peer_connect,
    .peer_rename = NULL, /* the TCP blob binds nothing to the id */
    .peer_remove = tcp_peer_remove,
    .grant = tcp_grant,
    .revoke = tcp_revoke,
    .post = tcp_post,
    .stats = tcp_stats,
};

const kvt_transport_desc_t kvt_tl_tcp_desc = {.name = "tcp", .ops = &tcp_ops};

KVT_TRANSPORT_REGISTER(tcp, &kvt_tl_tcp_desc)
