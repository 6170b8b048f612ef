/*
 * kvt_tl_tcp_serve.c - target side of the TCP transport: the data listener
 * and the lanes it serves.
 *
 * Resources are bounded: at most lim.max_conns lanes are served at once
 * (one thread each, small stacks), at most lim.max_pending of them before
 * their HELLO, at most lim.max_conns_per_peer per peer id, at most
 * lim.max_conns_per_addr from one source address (IPv6: from one
 * lim.addr_prefix_v6 prefix, a /64 by default), of which at most
 * lim.max_pending_per_addr before their HELLO. A lane must
 * complete its HELLO within lim.hello_timeout_ms of being accepted, and the
 * HELLO must carry the token this side issued to that peer id over the
 * control plane (peer_prepare), so a lane acts only for the peer that was
 * granted pages. A lane that starts no frame for lim.idle_timeout_ms gets a
 * BYE reply and is closed; a frame that stops half-way for timeout_ms is a
 * stalled lane and is closed. Every refusal is counted and logged
 * (rate-limited).
 *
 * Waits are deadlines handed to poll(); the listener sleeps until a lane
 * arrives or a lane thread finishes (eventfd), nothing wakes up to look.
 */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvt/kvt_clock.h"
#include "kvt_tl_tcp_int.h"
#include "kvt_tsan.h"

#define CONN_STACK_SIZE (256u << 10)

/* ---------------------------------------------------------------- refusals */

/* The first few refusals, then one in a thousand: a flood cannot fill the log. */
static void refusal_log(kvt_tl_t *tl, const char *fmt, ...)
{
    uint64_t n = atomic_fetch_add(&tl->refusals_logged, 1) + 1;
    char msg[256];
    va_list ap;

    if (n > 10 && n % 1000 != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvt tcp %s: refused data lane (#%llu): %s\n", tl->local_id,
            (unsigned long long)n, msg);
}

/* ---------------------------------------------------------------- socket I/O */

typedef struct sock_io {
    kvt_tl_t *tl;
    int fd;
    uint64_t hello_deadline_ns;
} sock_io_t;

static int ms_to_poll(unsigned ms)
{
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static kvt_status_t sock_recv(void *ctx, void *buf, size_t len, kvt_tcp_phase_t phase)
{
    sock_io_t *s = ctx;
    uint8_t *p = buf;
    size_t got = 0;

    while (got < len) {
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        int wait_ms, r;
        ssize_t n;

        if (phase == KVT_TCP_PH_HELLO) {
            uint64_t now = kvt_clock_monotonic_ns();
            if (now >= s->hello_deadline_ns)
                return KVT_ERR_TIMEOUT;
            wait_ms =
                (int)((s->hello_deadline_ns - now + KVT_NSEC_PER_MSEC - 1) / KVT_NSEC_PER_MSEC);
        } else if (phase == KVT_TCP_PH_IDLE && got == 0) {
            wait_ms = ms_to_poll(s->tl->lim.idle_timeout_ms);
        } else {
            wait_ms = ms_to_poll(s->tl->timeout_ms);
        }
        r = poll(&pfd, 1, wait_ms);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return KVT_ERR_IO;
        }
        if (r == 0) {
            if (phase == KVT_TCP_PH_HELLO)
                continue; /* the deadline check above decides */
            return KVT_ERR_TIMEOUT;
        }
        n = recv(s->fd, p + got, len - got, MSG_DONTWAIT);
        if (n == 0)
            return KVT_ERR_PEER;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return KVT_ERR_PEER;
        }
        got += (size_t)n;
    }
    return KVT_OK;
}

static kvt_status_t sock_send(void *ctx, struct iovec *iov, int iovcnt)
{
    sock_io_t *s = ctx;
    return kvt_tcp_send_iov(s->fd, iov, iovcnt);
}

/* ---------------------------------------------------------------- serving one lane */

static kvt_status_t send_reply(const kvt_tcp_io_t *io, kvt_status_t status, uint32_t seq,
                               uint32_t flags, const void *payload, uint64_t len)
{
    uint8_t rb[KVT_TCP_REPLY_LEN];
    kvt_tcp_reply_t r = {.status = status, .seq = seq, .flags = flags};
    struct iovec iov[2];

    kvt_tcp_reply_encode(&r, rb);
    iov[0].iov_base = rb;
    iov[0].iov_len = sizeof(rb);
    iov[1].iov_base = (void *)payload;
    iov[1].iov_len = (size_t)len;
    return io->send(io->ctx, iov, payload != NULL && len > 0 ? 2 : 1);
}

static kvt_status_t drain(const kvt_tcp_io_t *io, uint64_t len)
{
    uint8_t scratch[16384];
    while (len > 0) {
        size_t n = len > sizeof(scratch) ? sizeof(scratch) : (size_t)len;
        kvt_status_t st = io->recv(io->ctx, scratch, n, KVT_TCP_PH_FRAME);
        if (st != KVT_OK)
            return st;
        len -= n;
    }
    return KVT_OK;
}

/* Constant time in the token bytes: the comparison leaks no prefix length. */
static int token_equal(const char *a, const char *b)
{
    unsigned diff = 0;
    for (int i = 0; i < KVT_TCP_TOKEN_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0 && a[0] != '\0';
}

/* Leave the "before HELLO" count (listener lanes only). Lock held. */
static void pending_done_locked(kvt_tl_t *tl, tcp_conn_t *c)
{
    if (c->pending) {
        c->pending = 0;
        tl->npending--;
    }
}

static void pending_done(kvt_tl_t *tl, tcp_conn_t *c)
{
    pthread_mutex_lock(&tl->lock);
    pending_done_locked(tl, c);
    pthread_mutex_unlock(&tl->lock);
}

/* Admit the lane of <peer> presenting <token>: the token must be one this
 * side issued to that id, and the peer must be under its lane cap. */
static kvt_status_t hello_admit(kvt_tl_t *tl, tcp_conn_t *c, const char *peer, const char *token)
{
    kvt_status_t st = KVT_OK;
    unsigned n = 0;
    tcp_peer_t *p;

    pthread_mutex_lock(&tl->lock);
    p = kvt_tl_tcp_peer_find_locked(tl, peer);
    if (p == NULL || !(token_equal(p->token, token) || token_equal(p->prev_token, token))) {
        st = KVT_ERR_ACCESS;
        goto out;
    }
    for (tcp_conn_t *o = tl->conns; o != NULL; o = o->next) {
        if (o != c && o->hello_ok && strcmp(o->peer, peer) == 0)
            n++;
    }
    if (n >= tl->lim.max_conns_per_peer) {
        st = KVT_ERR_LIMIT;
        goto out;
    }
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    c->hello_ok = 1;
out:
    /* Decided: the lane stops counting as "before HELLO" before the initiator hears the
     * answer, so a lane it opens next is never refused for this one. */
    pending_done_locked(tl, c);
    pthread_mutex_unlock(&tl->lock);
    return st;
}

static kvt_status_t serve_hello(kvt_tl_t *tl, tcp_conn_t *c, const kvt_tcp_io_t *io)
{
    uint8_t hb[KVT_TCP_HDR_LEN];
    char peer[KVT_TL_PEER_ID_MAX + 1];
    kvt_tcp_hdr_t h;
    kvt_status_t st;

    st = io->recv(io->ctx, hb, sizeof(hb), KVT_TCP_PH_HELLO);
    if (st == KVT_OK &&
        (kvt_tcp_hdr_decode(hb, sizeof(hb), &h) != KVT_OK || h.op != KVT_TCP_OP_HELLO)) {
        atomic_fetch_add(&tl->st.bad_frames, 1);
        return KVT_ERR_PROTO;
    }
    if (st == KVT_OK)
        st = io->recv(io->ctx, peer, (size_t)h.length, KVT_TCP_PH_HELLO);
    if (st == KVT_ERR_TIMEOUT) {
        atomic_fetch_add(&tl->st.hello_refused, 1);
        refusal_log(tl, "no HELLO within %u ms", tl->lim.hello_timeout_ms);
    }
    if (st != KVT_OK)
        return st;
    peer[h.length] = '\0';
    if (strlen(peer) != h.length) {
        atomic_fetch_add(&tl->st.bad_frames, 1);
        return KVT_ERR_PROTO;
    }
    st = hello_admit(tl, c, peer, h.uuid);
    if (st == KVT_ERR_ACCESS) {
        atomic_fetch_add(&tl->st.hello_refused, 1);
        refusal_log(tl, "HELLO as \"%s\" without the token issued to that peer", peer);
    } else if (st == KVT_ERR_LIMIT) {
        atomic_fetch_add(&tl->st.conns_refused, 1);
        refusal_log(tl, "peer \"%s\" already has %u lanes", peer, tl->lim.max_conns_per_peer);
    }
    /* a refused initiator learns why, then the lane closes */
    (void)send_reply(io, st, h.seq, 0, NULL, 0);
    return st;
}

static kvt_status_t serve_frames(kvt_tl_t *tl, tcp_conn_t *c, const kvt_tcp_io_t *io)
{
    uint8_t hb[KVT_TCP_HDR_LEN];
    kvt_tcp_hdr_t h;
    kvt_status_t st;

    for (;;) {
        uint8_t *addr = NULL;
        kvt_status_t ast;

        st = io->recv(io->ctx, hb, 1, KVT_TCP_PH_IDLE);
        if (st == KVT_ERR_TIMEOUT) {
            atomic_fetch_add(&tl->st.idle_closed, 1);
            (void)send_reply(io, KVT_ERR_CLOSED, 0, KVT_TCP_REPLY_BYE, NULL, 0);
            return KVT_ERR_CLOSED; /* BYE said: nothing is started on this lane any more */
        }
        if (st != KVT_OK)
            return st == KVT_ERR_PEER ? KVT_OK : st; /* EOF between frames = clean close */
        st = io->recv(io->ctx, hb + 1, sizeof(hb) - 1, KVT_TCP_PH_FRAME);
        if (st != KVT_OK)
            goto out;
        if (kvt_tcp_hdr_decode(hb, sizeof(hb), &h) != KVT_OK || h.op == KVT_TCP_OP_HELLO) {
            atomic_fetch_add(&tl->st.bad_frames, 1);
            return KVT_ERR_PROTO;
        }
        if (h.op == KVT_TCP_OP_WRITE) {
            ast = kvt_tl_tcp_access_check(tl, c->peer, &h, KVT_TL_ACCESS_WRITE, &addr);
            st = (ast == KVT_OK) ? io->recv(io->ctx, addr, (size_t)h.length, KVT_TCP_PH_FRAME)
                                 : drain(io, h.length);
            if (st != KVT_OK)
                goto out;
            if (ast == KVT_OK)
                atomic_fetch_add(&tl->st.bytes_served, h.length);
            KVT_TSAN_WIRE_RELEASE();
            /* the bytes are in the region now: only then acknowledge */
            st = send_reply(io, ast, h.seq, 0, NULL, 0);
        } else {
            ast = kvt_tl_tcp_access_check(tl, c->peer, &h, KVT_TL_ACCESS_READ, &addr);
            if (ast == KVT_OK)
                atomic_fetch_add(&tl->st.bytes_served, h.length);
            st = send_reply(io, ast, h.seq, 0, ast == KVT_OK ? addr : NULL,
                            ast == KVT_OK ? h.length : 0);
            KVT_TSAN_WIRE_RELEASE();
        }
        if (st != KVT_OK)
            goto out;
    }
out:
    if (st == KVT_ERR_TIMEOUT)
        atomic_fetch_add(&tl->st.stall_closed, 1);
    return st;
}

kvt_status_t kvt_tl_tcp_serve(kvt_tl_t *tl, tcp_conn_t *c, const kvt_tcp_io_t *io)
{
    kvt_status_t st = serve_hello(tl, c, io);

    pending_done(tl, c);
    if (st == KVT_OK)
        st = serve_frames(tl, c, io);
    pthread_mutex_lock(&tl->lock);
    c->hello_ok = 0;
    pthread_mutex_unlock(&tl->lock);
    return st;
}

/* ---------------------------------------------------------------- listener */

static void wake(kvt_tl_t *tl)
{
    uint64_t one = 1;
    if (write(tl->wake_fd, &one, sizeof(one)) < 0) {
        /* the counter is saturated: the listener is awake anyway */
    }
}

/* After a BYE: frames the initiator sent before it read the BYE are read
 * and dropped unanswered (the BYE told it they were not started) until it
 * closes, at most timeout_ms. Closing at once would make the kernel answer
 * them with a reset, which can destroy the BYE before the initiator read it
 * and turn a quiet reconnect into a peer failure. */
static void linger_after_bye(kvt_tl_t *tl, int fd)
{
    uint64_t deadline = kvt_clock_monotonic_ns() + (uint64_t)tl->timeout_ms * KVT_NSEC_PER_MSEC;
    uint8_t scratch[4096];

    shutdown(fd, SHUT_WR);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        uint64_t now = kvt_clock_monotonic_ns();
        ssize_t n;

        if (now >= deadline || atomic_load(&tl->stopping))
            return;
        if (poll(&pfd, 1, (int)((deadline - now) / KVT_NSEC_PER_MSEC) + 1) <= 0)
            return;
        n = recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return;
    }
}

static void *conn_main(void *arg)
{
    tcp_conn_t *c = arg;
    kvt_tl_t *tl = c->tl;
    sock_io_t s = {.tl = tl, .fd = c->fd};
    kvt_tcp_io_t io = {.recv = sock_recv, .send = sock_send, .ctx = &s};

    s.hello_deadline_ns = c->accepted_ns + (uint64_t)tl->lim.hello_timeout_ms * KVT_NSEC_PER_MSEC;
    if (kvt_tl_tcp_serve(tl, c, &io) == KVT_ERR_CLOSED)
        linger_after_bye(tl, c->fd);
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&tl->lock);
    tl->nconns--;
    atomic_store(&c->done, 1);
    pthread_mutex_unlock(&tl->lock);
    wake(tl); /* the listener joins us */
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

static void set_sockopts(int fd, unsigned ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    int one = 1;
    /* sends block: a peer that stops reading a READ reply is a stalled lane */
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void kvt_tcp_addr_key(const struct sockaddr *sa, unsigned v6_prefix, uint8_t key[16])
{
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)sa)->sin6_addr))
            v6_prefix = 128; /* an IPv4 peer on a dual-stack socket: one address */
        for (unsigned i = 0; i < 16 && v6_prefix > 0; i++) {
            unsigned bits = v6_prefix >= 8 ? 8 : v6_prefix;
            key[i] = a[i] & (uint8_t)(0xff00u >> bits);
            v6_prefix -= bits;
        }
    }
}

/* Lanes (served or before HELLO) from the address prefix <key>, and of those the ones
 * before their HELLO (<pending>). Lock held. */
static unsigned addr_lanes_locked(kvt_tl_t *tl, const uint8_t key[16], unsigned *pending)
{
    unsigned n = 0;
    *pending = 0;
    for (tcp_conn_t *o = tl->conns; o != NULL; o = o->next) {
        if (!atomic_load(&o->done) && memcmp(o->addr_key, key, 16) == 0) {
            n++;
            *pending += o->pending != 0;
        }
    }
    return n;
}

static void accept_one(kvt_tl_t *tl, pthread_attr_t *attr)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    uint8_t key[16];
    tcp_conn_t *c;
    int fd = accept4(tl->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    unsigned nconns, npending, naddr = 0, naddr_pending = 0;

    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
            /* the listen socket stays readable: wait a little instead of spinning */
            struct pollfd pfd = {.fd = tl->wake_fd, .events = POLLIN};
            atomic_fetch_add(&tl->st.conns_refused, 1);
            refusal_log(tl, "out of file descriptors");
            (void)poll(&pfd, 1, 100);
        }
        return;
    }
    kvt_tcp_addr_key((struct sockaddr *)&ss, tl->lim.addr_prefix_v6, key);
    c = kvt_calloc(1, sizeof(*c));
    pthread_mutex_lock(&tl->lock);
    nconns = tl->nconns;
    npending = tl->npending;
    if (c != NULL && nconns < tl->lim.max_conns && npending < tl->lim.max_pending &&
        (naddr = addr_lanes_locked(tl, key, &naddr_pending)) < tl->lim.max_conns_per_addr &&
        naddr_pending < tl->lim.max_pending_per_addr) {
        c->tl = tl;
        c->fd = fd;
        c->pending = 1;
        c->accepted_ns = kvt_clock_monotonic_ns();
        memcpy(c->addr_key, key, sizeof(key));
        tl->nconns++;
        tl->npending++;
        set_sockopts(fd, tl->timeout_ms);
        if (pthread_create(&c->th, attr, conn_main, c) == 0) {
            c->next = tl->conns;
            tl->conns = c;
            pthread_mutex_unlock(&tl->lock);
            return;
        }
        tl->nconns--;
        tl->npending--;
    }
    pthread_mutex_unlock(&tl->lock);
    atomic_fetch_add(&tl->st.conns_refused, 1); /* counted before the peer can see the close */
    close(fd);
    kvt_free(c);
    refusal_log(tl,
                "%u lanes served (max %u), %u before HELLO (max %u), %u from that address (max "
                "%u), %u of them before HELLO (max %u)",
                nconns, tl->lim.max_conns, npending, tl->lim.max_pending, naddr,
                tl->lim.max_conns_per_addr, naddr_pending, tl->lim.max_pending_per_addr);
}

static void *listener_main(void *arg)
{
    kvt_tl_t *tl = arg;
    pthread_attr_t attr;

    pthread_attr_init(&attr);
    (void)pthread_attr_setstacksize(&attr, CONN_STACK_SIZE);
    while (!atomic_load(&tl->stopping)) {
        struct pollfd pfd[2] = {{.fd = tl->listen_fd, .events = POLLIN},
                                {.fd = tl->wake_fd, .events = POLLIN}};

        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pfd[1].revents & POLLIN) {
            uint64_t v;
            if (read(tl->wake_fd, &v, sizeof(v)) < 0) {
                /* EAGAIN: someone else drained it */
            }
            reap_conns(tl, 0);
        }
        if ((pfd[0].revents & POLLIN) && !atomic_load(&tl->stopping))
            accept_one(tl, &attr);
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

kvt_status_t kvt_tl_tcp_listener_start(kvt_tl_t *tl)
{
    if (pthread_create(&tl->listener, NULL, listener_main, tl) != 0)
        return KVT_ERR_NOMEM;
    return KVT_OK;
}

void kvt_tl_tcp_listener_stop(kvt_tl_t *tl)
{
    atomic_store(&tl->stopping, 1);
    wake(tl);
    pthread_join(tl->listener, NULL);
    reap_conns(tl, 1);
}

void kvt_tl_tcp_conns_drop_peer(kvt_tl_t *tl, const char *peer_id)
{
    pthread_mutex_lock(&tl->lock);
    for (tcp_conn_t *c = tl->conns; c != NULL; c = c->next) {
        if (c->hello_ok && strcmp(c->peer, peer_id) == 0)
            shutdown(c->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&tl->lock);
}
