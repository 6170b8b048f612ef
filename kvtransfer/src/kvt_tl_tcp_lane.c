/*
 * kvt_tl_tcp_lane.c - initiator side of the TCP transport: a peer's lanes.
 *
 * A post is cut into frames (<= KVT_TCP_FRAME_SPLIT bytes) spread
 * round-robin over the peer's lanes. Each lane has a tx thread that streams
 * header+payload with one sendmsg and an rx thread that matches the
 * in-order replies (and receives READ payloads straight into the local
 * region).
 *
 * A target closes a lane that was idle with a BYE reply. A BYE means the
 * target started no frame after its last answer, so the frames still
 * unanswered on that lane were not executed: the rx thread dials a fresh
 * lane and sends them again (the target keeps reading until we close, so
 * a frame crossing the BYE never turns into a reset that could destroy the
 * BYE). A lane that ends by BYE with nothing to send dies quietly; the next
 * post revives it. Any other lane error (EOF, reset, timeout, bad reply)
 * stops both threads; the last one out fails every queued and in-flight
 * frame and reports the peer as failed. A later post reconnects.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvt_tl_tcp_int.h"

/* A target that answers BYE to every fresh lane: give up after this many in a row. */
#define MAX_BYE_REOPENS 2

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

struct tcp_lane {
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
    int tx_busy;   /* the tx thread is writing a frame to <fd> */
    int reopening; /* rx is replacing <fd> after a BYE: tx holds back */
    unsigned byes; /* BYEs since the last answered frame */
    kvt_status_t why;
    uint32_t next_seq;
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

kvt_status_t kvt_tcp_send_iov(int fd, struct iovec *iov, int iovcnt)
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
    return kvt_tcp_send_iov(fd, &iov, 1);
}

static void set_timeouts(int fd, unsigned ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
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

/* Dial <p> and say HELLO with the token it handed us. On KVT_OK *out is the
 * lane's socket. Reads the peer's address without its lock: it only changes
 * after every lane thread was joined. */
static kvt_status_t lane_dial(kvt_tl_t *tl, tcp_peer_t *p, int *out)
{
    uint8_t hb[KVT_TCP_HDR_LEN], rb[KVT_TCP_REPLY_LEN];
    char token[KVT_TCP_TOKEN_LEN + 1];
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;
    size_t idlen = strlen(tl->local_id);
    kvt_status_t st;
    int fd = -1;

    pthread_mutex_lock(&tl->lock);
    memcpy(token, p->send_token, sizeof(token));
    pthread_mutex_unlock(&tl->lock);
    if (token[0] == '\0')
        return KVT_ERR_NOT_FOUND; /* no handshake blob from that peer yet */
    st = dial(p->host, p->port, tl->timeout_ms, &fd);
    if (st != KVT_OK)
        return st;
    set_timeouts(fd, tl->timeout_ms);
    memset(&h, 0, sizeof(h));
    h.op = KVT_TCP_OP_HELLO;
    h.length = idlen;
    memcpy(h.uuid, token, sizeof(h.uuid));
    kvt_tcp_hdr_encode(&h, hb);
    st = send_all(fd, hb, sizeof(hb));
    if (st == KVT_OK)
        st = send_all(fd, tl->local_id, idlen);
    if (st == KVT_OK)
        st = recv_all(fd, rb, sizeof(rb));
    if (st == KVT_OK && kvt_tcp_reply_decode(rb, sizeof(rb), &r) != KVT_OK)
        st = KVT_ERR_PROTO;
    if (st == KVT_OK && r.status != KVT_OK)
        st = (kvt_status_t)r.status; /* refused: ACCESS (token) or LIMIT (lane cap) */
    if (st != KVT_OK) {
        close(fd);
        return st;
    }
    *out = fd;
    return KVT_OK;
}

/* ---------------------------------------------------------------- frames */

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

static void txq_push_locked(tcp_lane_t *l, tcp_frame_t *f)
{
    f->next = NULL;
    if (l->txq_tail != NULL)
        l->txq_tail->next = f;
    else
        l->txq_head = f;
    l->txq_tail = f;
}

/* Mark the lane dead (lock held); the first reason sticks. */
static void lane_kill_locked(tcp_lane_t *l, kvt_status_t why)
{
    if (!l->dead) {
        l->dead = 1;
        l->why = why;
    }
    if (l->fd >= 0)
        shutdown(l->fd, SHUT_RDWR);
    pthread_cond_broadcast(&l->cond);
}

/* Called by a lane thread on its way out. The last one fails what is left;
 * a lane closed by the target's BYE is not a peer failure. */
static void lane_exit(tcp_lane_t *l, kvt_status_t why)
{
    tcp_frame_t *left = NULL;
    tcp_peer_t *peer = l->peer;
    kvt_tl_t *tl = peer->tl;
    int last, report = 0;

    pthread_mutex_lock(&l->lock);
    lane_kill_locked(l, why);
    last = (--l->alive == 0);
    if (last) {
        /* in-flight frames first, they were posted earlier */
        left = l->inf_head;
        if (left == NULL)
            left = l->txq_head;
        else
            l->inf_tail->next = l->txq_head;
        l->inf_head = l->inf_tail = l->txq_head = l->txq_tail = NULL;
        why = l->why;
    }
    pthread_mutex_unlock(&l->lock);
    if (!last)
        return;
    if (!peer->stopping && why != KVT_ERR_CLOSED) {
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

/* ---------------------------------------------------------------- tx thread */

static void send_frame_hdr(const tcp_frame_t *f, uint8_t hb[KVT_TCP_HDR_LEN])
{
    kvt_tcp_hdr_t h;

    memset(&h, 0, sizeof(h));
    h.op = f->op;
    h.seq = f->seq;
    memcpy(h.uuid, f->uuid, sizeof(h.uuid));
    h.offset = f->remote_offset;
    h.length = f->length;
    kvt_tcp_hdr_encode(&h, hb);
}

static void *lane_tx_main(void *arg)
{
    tcp_lane_t *l = arg;
    kvt_status_t why = KVT_OK;

    for (;;) {
        tcp_frame_t *f;
        uint8_t hb[KVT_TCP_HDR_LEN];
        struct iovec iov[2];
        int fd;

        pthread_mutex_lock(&l->lock);
        while (!l->dead && (l->txq_head == NULL || l->reopening))
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
        l->tx_busy = 1;
        fd = l->fd;
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);

        send_frame_hdr(f, hb);
        iov[0].iov_base = hb;
        iov[0].iov_len = sizeof(hb);
        iov[1].iov_base = f->local;
        iov[1].iov_len = (size_t)f->length;
        why = kvt_tcp_send_iov(fd, iov, (f->op == KVT_TCP_OP_WRITE && f->length > 0) ? 2 : 1);
        /* the reply cannot come before the bytes left, but say so explicitly:
         * the frame may complete (and its memory be reused) only after this */
        pthread_mutex_lock(&l->lock);
        l->tx_busy = 0;
        if (why == KVT_OK)
            f->sent = 1;
        else if (l->reopening && !l->dead)
            why = KVT_OK; /* the target's BYE explains it: the frame goes out again */
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
        if (why != KVT_OK)
            break;
    }
    lane_exit(l, why);
    return NULL;
}

/* ---------------------------------------------------------------- rx thread */

/* The target said BYE (lock held). Nothing to send: the lane ends quietly
 * (KVT_ERR_CLOSED, a later post revives it). Otherwise the unanswered
 * frames were never started: dial a fresh lane and send them again. */
static kvt_status_t lane_on_bye_locked(tcp_lane_t *l)
{
    kvt_tl_t *tl = l->peer->tl;
    kvt_status_t st;
    int oldfd, nfd = -1;

    atomic_fetch_add(&tl->st.byes_received, 1);
    if ((l->inf_head == NULL && l->txq_head == NULL) || ++l->byes > MAX_BYE_REOPENS)
        return KVT_ERR_CLOSED;
    l->reopening = 1;
    while (l->tx_busy && !l->dead)
        pthread_cond_wait(&l->cond, &l->lock);
    if (l->dead)
        return l->why;
    if (l->inf_head != NULL) { /* unanswered frames go first again, in order */
        for (tcp_frame_t *f = l->inf_head; f != NULL; f = f->next)
            f->sent = 0;
        l->inf_tail->next = l->txq_head;
        if (l->txq_head == NULL)
            l->txq_tail = l->inf_tail;
        l->txq_head = l->inf_head;
        l->inf_head = l->inf_tail = NULL;
    }
    oldfd = l->fd;
    pthread_mutex_unlock(&l->lock);
    shutdown(oldfd, SHUT_RDWR); /* ends the target's wait for our close */
    st = lane_dial(tl, l->peer, &nfd);
    pthread_mutex_lock(&l->lock);
    if (st == KVT_OK && l->dead)
        st = l->why;
    if (st != KVT_OK) {
        if (nfd >= 0)
            close(nfd);
        return st;
    }
    l->fd = nfd;
    close(oldfd); /* under the lock: nobody shuts down a number that was reused */
    l->reopening = 0;
    atomic_fetch_add(&tl->st.lanes_reopened, 1);
    pthread_cond_broadcast(&l->cond);
    return KVT_OK;
}

/* Bytes arrived while nothing is in flight (lock held): only a BYE is fine. */
static kvt_status_t lane_unasked_locked(tcp_lane_t *l)
{
    uint8_t bb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t bye;

    if (recv_all(l->fd, bb, sizeof(bb)) != KVT_OK ||
        kvt_tcp_reply_decode(bb, sizeof(bb), &bye) != KVT_OK || !(bye.flags & KVT_TCP_REPLY_BYE))
        return KVT_ERR_PROTO;
    return lane_on_bye_locked(l);
}

/* Nothing in flight: watch the socket so a dead peer or a BYE is noticed at
 * once, and wake up for new frames. Lock held; KVT_OK = go on. */
static kvt_status_t lane_idle_locked(tcp_lane_t *l)
{
    struct pollfd pfd = {.fd = l->fd, .events = POLLIN | POLLRDHUP};
    kvt_status_t why = KVT_OK;
    ssize_t pk;
    int pr;
    char c;

    pthread_mutex_unlock(&l->lock);
    pr = poll(&pfd, 1, 100);
    pthread_mutex_lock(&l->lock);
    if (pr <= 0 || l->inf_head != NULL || l->dead)
        return KVT_OK;
    pk = recv(l->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (pk > 0)
        why = lane_unasked_locked(l);
    else if (pk == 0 || (pk < 0 && errno != EAGAIN && errno != EINTR) ||
             (pfd.revents & (POLLERR | POLLHUP)))
        why = KVT_ERR_PEER;
    if (why != KVT_OK)
        lane_kill_locked(l, why); /* under this lock: a post sees it dead, never half-dead */
    return why;
}

/* Receive the reply of the oldest in-flight frame <f> and complete it. */
static kvt_status_t lane_reply(tcp_lane_t *l, tcp_frame_t *f)
{
    uint8_t rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t r;
    kvt_status_t why = recv_all(l->fd, rb, sizeof(rb));

    if (why != KVT_OK)
        return why;
    if (kvt_tcp_reply_decode(rb, sizeof(rb), &r) != KVT_OK ||
        (!(r.flags & KVT_TCP_REPLY_BYE) && r.seq != f->seq)) {
        atomic_fetch_add(&l->peer->tl->st.bad_frames, 1);
        return KVT_ERR_PROTO;
    }
    pthread_mutex_lock(&l->lock);
    if (r.flags & KVT_TCP_REPLY_BYE) { /* idle-closed as we sent: send again on a new lane */
        why = lane_on_bye_locked(l);
        if (why != KVT_OK)
            lane_kill_locked(l, why);
        pthread_mutex_unlock(&l->lock);
        return why;
    }
    pthread_mutex_unlock(&l->lock);
    if (r.status == KVT_OK && f->op == KVT_TCP_OP_READ && f->length > 0) {
        why = recv_all(l->fd, f->local, (size_t)f->length);
        if (why != KVT_OK)
            return why;
    }
    pthread_mutex_lock(&l->lock);
    while (!f->sent && !l->dead)
        pthread_cond_wait(&l->cond, &l->lock);
    if (!f->sent) {
        pthread_mutex_unlock(&l->lock);
        return l->why; /* the lane died: lane_exit fails the frame */
    }
    l->inf_head = f->next;
    if (l->inf_head == NULL)
        l->inf_tail = NULL;
    l->byes = 0;
    pthread_mutex_unlock(&l->lock);
    frame_done(f, (kvt_status_t)r.status);
    return KVT_OK;
}

static void *lane_rx_main(void *arg)
{
    tcp_lane_t *l = arg;
    kvt_status_t why = KVT_OK;

    for (;;) {
        tcp_frame_t *f;

        pthread_mutex_lock(&l->lock);
        if (!l->dead && l->inf_head == NULL) {
            why = lane_idle_locked(l);
            pthread_mutex_unlock(&l->lock);
            if (why != KVT_OK)
                break;
            continue;
        }
        if (l->dead) {
            why = l->why;
            pthread_mutex_unlock(&l->lock);
            break;
        }
        f = l->inf_head; /* stays queued until its reply is complete */
        pthread_mutex_unlock(&l->lock);
        why = lane_reply(l, f);
        if (why != KVT_OK)
            break;
    }
    lane_exit(l, why);
    return NULL;
}

/* ---------------------------------------------------------------- lanes of a peer */

static void lane_join(tcp_lane_t *l)
{
    if (l->threads >= 1)
        pthread_join(l->tx, NULL);
    if (l->threads >= 2)
        pthread_join(l->rx, NULL);
    l->threads = 0;
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

/* Open lane <l> (fresh or joined) and start its threads. */
static kvt_status_t lane_start(kvt_tl_t *tl, tcp_peer_t *p, tcp_lane_t *l)
{
    kvt_status_t st = lane_dial(tl, p, &l->fd);

    l->dead = 0;
    l->why = KVT_OK;
    l->byes = 0;
    l->reopening = 0;
    l->tx_busy = 0;
    if (st != KVT_OK) {
        l->fd = -1;
        l->dead = 1;
        l->why = st;
        return st;
    }
    l->alive = 2;
    if (pthread_create(&l->tx, NULL, lane_tx_main, l) != 0) {
        l->alive = 0;
        l->dead = 1;
        return KVT_ERR_NOMEM;
    }
    l->threads = 1;
    if (pthread_create(&l->rx, NULL, lane_rx_main, l) != 0) {
        pthread_mutex_lock(&l->lock);
        l->alive--;
        lane_kill_locked(l, KVT_ERR_NOMEM);
        pthread_mutex_unlock(&l->lock);
        return KVT_ERR_NOMEM;
    }
    l->threads = 2;
    return KVT_OK;
}

void kvt_tl_tcp_peer_teardown_locked(tcp_peer_t *p)
{
    if (p->lanes == NULL) {
        p->stopping = 0;
        return;
    }
    p->stopping = 1;
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        pthread_mutex_lock(&l->lock);
        lane_kill_locked(l, KVT_ERR_CLOSED);
        pthread_mutex_unlock(&l->lock);
    }
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        lane_join(l);
        pthread_mutex_destroy(&l->lock);
        pthread_cond_destroy(&l->cond);
    }
    kvt_free(p->lanes);
    p->lanes = NULL;
    p->nlanes = 0;
    p->connected = 0;
    p->stopping = 0;
}

static kvt_status_t peer_connect_locked(kvt_tl_t *tl, tcp_peer_t *p)
{
    kvt_status_t st = KVT_OK;

    kvt_tl_tcp_peer_teardown_locked(p);
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
    for (unsigned i = 0; i < p->nlanes && st == KVT_OK; i++)
        st = lane_start(tl, p, &p->lanes[i]);
    if (st != KVT_OK) {
        p->stopping = 1; /* a failed dial is reported by post's status */
        kvt_tl_tcp_peer_teardown_locked(p);
        return st;
    }
    atomic_store(&p->failed, 0);
    p->connected = 1;
    return KVT_OK;
}

/* Restart the lanes that ended quietly (BYE with nothing to send). */
static kvt_status_t lanes_revive_locked(kvt_tl_t *tl, tcp_peer_t *p)
{
    for (unsigned i = 0; i < p->nlanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        kvt_status_t st;
        int dead;

        pthread_mutex_lock(&l->lock);
        dead = l->dead;
        pthread_mutex_unlock(&l->lock);
        if (!dead)
            continue;
        lane_join(l); /* a dead lane's threads are on their way out */
        st = lane_start(tl, p, l);
        if (st != KVT_OK)
            return st;
    }
    return KVT_OK;
}

/* Queue frames [from, to) round-robin on live lanes; frames that met a lane
 * that just died are kept in <left> (in order) for one more round. */
static size_t frames_queue_locked(tcp_peer_t *p, tcp_frame_t **frames, size_t n)
{
    size_t nleft = 0;

    for (size_t i = 0; i < n; i++) {
        tcp_frame_t *f = frames[i];
        tcp_lane_t *l = &p->lanes[p->rr++ % p->nlanes];
        int dead;

        pthread_mutex_lock(&l->lock);
        dead = l->dead;
        if (!dead) {
            txq_push_locked(l, f);
            pthread_cond_broadcast(&l->cond);
        }
        pthread_mutex_unlock(&l->lock);
        if (dead)
            frames[nleft++] = f;
    }
    return nleft;
}

static tcp_post_t *post_build(kvt_tl_t *tl, kvt_tl_op_t op, const kvt_tl_xfer_t *xfers, size_t n,
                              uint64_t cookie)
{
    size_t nframes = 0, k = 0;
    tcp_post_t *post;

    for (size_t i = 0; i < n; i++)
        nframes += xfers[i].length == 0
                       ? 1
                       : (xfers[i].length + KVT_TCP_FRAME_SPLIT - 1) / KVT_TCP_FRAME_SPLIT;
    post = kvt_calloc(1, sizeof(*post) + nframes * sizeof(tcp_frame_t));
    if (post == NULL)
        return NULL;
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
    return post;
}

kvt_status_t kvt_tl_tcp_lanes_post(kvt_tl_t *tl, tcp_peer_t *p, kvt_tl_op_t op,
                                   const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie)
{
    tcp_post_t *post = post_build(tl, op, xfers, n, cookie);
    tcp_frame_t **todo;
    size_t left;
    kvt_status_t st;

    if (post == NULL)
        return KVT_ERR_NOMEM;
    todo = kvt_calloc(post->nframes, sizeof(*todo));
    if (todo == NULL) {
        kvt_free(post);
        return KVT_ERR_NOMEM;
    }
    for (size_t i = 0; i < post->nframes; i++)
        todo[i] = &post->frames[i];
    left = post->nframes;
    pthread_mutex_lock(&p->lock);
    if (!p->connected || atomic_load(&p->failed))
        st = peer_connect_locked(tl, p);
    else
        st = lanes_revive_locked(tl, p);
    /* a lane can still end by BYE between the revive and the queueing: revive once more */
    for (int round = 0; st == KVT_OK && left > 0 && round < 2; round++) {
        left = frames_queue_locked(p, todo, left);
        if (left > 0)
            st = lanes_revive_locked(tl, p);
    }
    pthread_mutex_unlock(&p->lock);
    if (st != KVT_OK && left == post->nframes) {
        kvt_free(todo);
        kvt_free(post);
        return st;
    }
    for (size_t i = 0; i < left; i++)
        frame_done(todo[i], st != KVT_OK ? st : KVT_ERR_PEER);
    kvt_free(todo);
    return KVT_OK;
}
