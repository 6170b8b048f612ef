/*
 * pdgw_upstream_h1.c - the native HTTP/1.1 upstream client: connections, keep-alive pools,
 * requests, responses, for one worker.
 *
 * Every socket is registered once, edge-triggered, for input and output (as nginx does), so
 * neither a request nor a reused connection costs an epoll_ctl. A read shorter than the
 * buffer means the socket is drained (the next arrival raises a new edge); a transfer that
 * pauses just stops reading and remembers that input is waiting. A request is one sendmsg of
 * head and body. A finished response hands its connection back to its address's idle list
 * before the owner hears of the end, so the owner's next leg to the same engine reuses it.
 *
 * Idle connections stay registered: any input on one (the engine closed it, or sent bytes
 * nobody asked for) closes it; a timer closes those idle longer than idle_timeout_ms. A
 * request that fails on a reused connection before any response byte arrived (the engine
 * closed it just as it was picked) is sent again once on a new connection, as libcurl and
 * nginx do.
 *
 * Failures found where no callback may run (inside start) are posted and reported from the
 * loop (pdgw_h1_run_posted); a callback may abort its own transfer or any other one.
 */
#include "pdgw_upstream_h1.h"

#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "pdgw_alloc.h"

#define RBUF_MAX        (PDGW_H1P_MAX_HEAD + 4096u) /* a head line may need the whole head */
#define RBUF_STREAM_MAX 4096u /* read buffers up to this size are released between reads */

typedef enum { CONN_CONNECTING = 0, CONN_ACTIVE, CONN_IDLE } conn_state_t;

typedef struct pdgw_h1_upstream {
    struct pdgw_h1_upstream *next;
    char *origin; /* "http://host:port" as the URLs spell it */
    size_t origin_len;
    char *authority; /* host:port, the Host header */
    char *host;      /* for the resolver, without brackets */
    char *port;
    /* The name's addresses (a few: "localhost" gives ::1 and 127.0.0.1); connects go to
     * addrs[cur], the next one is tried when that is refused. n_addrs 0 = resolve first. */
    struct sockaddr_storage addrs[4];
    socklen_t addr_lens[4];
    int n_addrs, cur;
    pdgw_h1_conn_t *idle; /* most recently used first */
} pdgw_h1_upstream_t;

struct pdgw_h1_conn {
    int fd;
    uint32_t gen; /* tells this connection's events from a predecessor's on the same fd */
    conn_state_t state;
    pdgw_h1_client_t *client;
    pdgw_h1_upstream_t *up;
    pdgw_h1_xfer_t *x;
    pdgw_h1p_t parser;
    char *rbuf;
    size_t rlen, rcap;
    pdgw_timer_t timer;                  /* connect deadline, or idle expiry */
    pdgw_h1_conn_t *up_prev, *up_next;   /* the address's idle list */
    pdgw_h1_conn_t *lru_prev, *lru_next; /* the client's idle list, most recent first */
    bool reused;
    bool rd_ready;  /* an input edge was seen and the socket not drained since */
    bool wr_ready;  /* output possible as far as we know */
    bool wr_dead;   /* sending failed: only the response (if any) can still arrive */
    bool peer_shut; /* the engine's FIN was announced (EPOLLRDHUP): do not keep it */
    int in_cb;      /* inside the owner's callbacks (an abort then only marks it) */
    bool doomed;    /* aborted from a callback: close once the callbacks returned */
};

struct pdgw_h1_client {
    pdgw_h1_client_opts_t o;
    pdgw_h1_upstream_t *ups;
    pdgw_h1_conn_t **by_fd;
    size_t fd_cap;
    pdgw_h1_conn_t *lru_head, *lru_tail;
    pdgw_h1_xfer_t *post_head, *post_tail;
    uint32_t gen;
    pdgw_h1_stats_t st;
};

const char *pdgw_h1_result_name(pdgw_h1_result_t r)
{
    static const char *const names[] = {"ok",      "connect",  "connect timeout", "reset",
                                        "partial", "protocol", "aborted",         "local"};
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "?";
}

/* ---------------------------------------------------------------- posted work */

static void post(pdgw_h1_client_t *c, pdgw_h1_xfer_t *x)
{
    if (x->posted)
        return;
    x->posted = true;
    x->post_next = NULL;
    x->post_prev = c->post_tail;
    if (c->post_tail)
        c->post_tail->post_next = x;
    else
        c->post_head = x;
    c->post_tail = x;
}

static void unpost(pdgw_h1_client_t *c, pdgw_h1_xfer_t *x)
{
    if (!x->posted)
        return;
    if (x->post_prev)
        x->post_prev->post_next = x->post_next;
    else
        c->post_head = x->post_next;
    if (x->post_next)
        x->post_next->post_prev = x->post_prev;
    else
        c->post_tail = x->post_prev;
    x->posted = false;
    x->post_prev = x->post_next = NULL;
}

/* The transfer failed: detached from any connection, reported from the loop. */
static void xfer_fail(pdgw_h1_xfer_t *x, pdgw_h1_result_t res, int err, const char *fmt,
                      const char *arg)
{
    x->conn = NULL;
    x->pending = res;
    x->pending_errno = err;
    snprintf(x->errmsg, sizeof(x->errmsg), fmt, arg);
    post(x->client, x);
}

static void xfer_report(pdgw_h1_xfer_t *x, pdgw_h1_result_t res, int err)
{
    x->running = false;
    x->paused = false;
    x->cb->on_done(x->arg, res, err, res == PDGW_H1_OK ? NULL : x->errmsg);
}

/* ---------------------------------------------------------------- connections */

static void lru_unlink(pdgw_h1_client_t *c, pdgw_h1_conn_t *k)
{
    pdgw_h1_upstream_t *up = k->up;
    if (k->lru_prev)
        k->lru_prev->lru_next = k->lru_next;
    else
        c->lru_head = k->lru_next;
    if (k->lru_next)
        k->lru_next->lru_prev = k->lru_prev;
    else
        c->lru_tail = k->lru_prev;
    if (k->up_prev)
        k->up_prev->up_next = k->up_next;
    else
        up->idle = k->up_next;
    if (k->up_next)
        k->up_next->up_prev = k->up_prev;
    k->lru_prev = k->lru_next = k->up_prev = k->up_next = NULL;
    c->st.idle--;
}

static void conn_close(pdgw_h1_conn_t *k)
{
    pdgw_h1_client_t *c = k->client;
    if (k->state == CONN_IDLE)
        lru_unlink(c, k);
    pdgw_timer_cancel(c->o.timers, &k->timer);
    if (k->fd >= 0) {
        if ((size_t)k->fd < c->fd_cap && c->by_fd[k->fd] == k)
            c->by_fd[k->fd] = NULL;
        close(k->fd); /* leaves the epoll set with the descriptor */
    }
    if (k->x != NULL)
        k->x->conn = NULL;
    c->st.open--;
    pdgw_free(k->rbuf);
    pdgw_free(k);
}

static void on_conn_timer(pdgw_timer_t *t, uint64_t now);

static void conn_make_idle(pdgw_h1_conn_t *k)
{
    pdgw_h1_client_t *c = k->client;
    if (c->o.max_idle == 0) {
        conn_close(k);
        return;
    }
    if (c->st.idle >= c->o.max_idle) {
        c->st.idle_closed++;
        conn_close(c->lru_tail); /* the least recently used one makes room */
    }
    k->x = NULL;
    k->state = CONN_IDLE;
    k->rlen = 0;
    k->lru_prev = NULL;
    k->lru_next = c->lru_head;
    if (c->lru_head)
        c->lru_head->lru_prev = k;
    else
        c->lru_tail = k;
    c->lru_head = k;
    k->up_prev = NULL;
    k->up_next = k->up->idle;
    if (k->up->idle)
        k->up->idle->up_prev = k;
    k->up->idle = k;
    c->st.idle++;
    if (c->o.idle_timeout_ms > 0 &&
        pdgw_timer_arm(c->o.timers, &k->timer, pdgw_now_ms() + c->o.idle_timeout_ms) != PDGW_OK)
        conn_close(k); /* no room to time it out: do not keep it */
}

static bool fd_room(pdgw_h1_client_t *c, int fd)
{
    size_t cap;
    pdgw_h1_conn_t **n;
    if ((size_t)fd < c->fd_cap)
        return true;
    cap = c->fd_cap ? c->fd_cap : 1024;
    while (cap <= (size_t)fd)
        cap *= 2;
    n = pdgw_realloc(c->by_fd, cap * sizeof(*n));
    if (n == NULL)
        return false;
    memset(n + c->fd_cap, 0, (cap - c->fd_cap) * sizeof(*n));
    c->by_fd = n;
    c->fd_cap = cap;
    return true;
}

static bool local_errno(int e)
{
    return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

static bool up_resolve(pdgw_h1_upstream_t *up, int *err)
{
    struct addrinfo hints, *res = NULL, *ai;
    int rc;
    if (up->n_addrs > 0)
        return true;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    /* A name (not an address literal) is looked up here, on the worker, once per address
     * and again after a failed connect. */
    rc = getaddrinfo(up->host, up->port, &hints, &res);
    if (rc != 0) {
        *err = rc == EAI_SYSTEM ? errno : 0;
        return false;
    }
    for (ai = res; ai != NULL && up->n_addrs < 4; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof(up->addrs[0]))
            continue;
        memcpy(&up->addrs[up->n_addrs], ai->ai_addr, ai->ai_addrlen);
        up->addr_lens[up->n_addrs++] = (socklen_t)ai->ai_addrlen;
    }
    freeaddrinfo(res);
    up->cur = 0;
    return up->n_addrs > 0;
}

static uint64_t conn_tag(const pdgw_h1_client_t *c, const pdgw_h1_conn_t *k)
{
    return ((uint64_t)(k->gen & 0xffffffu) << 40) | ((uint64_t)(c->o.ev_kind & 0xffu) << 32) |
           (uint32_t)k->fd;
}

static void conn_send(pdgw_h1_conn_t *k);

/* A connect to the current address failed: move <x> to the name's next address (as libcurl
 * does), unless it has tried them all. */
static bool up_next_addr(pdgw_h1_xfer_t *x)
{
    pdgw_h1_upstream_t *up = x->up;
    if (x->addr_tries + 1 >= up->n_addrs)
        return false;
    x->addr_tries++;
    up->cur = (up->cur + 1) % up->n_addrs;
    return true;
}

/* Open a new connection for <x> to its address; false when that failed (x is then posted). */
static bool conn_open(pdgw_h1_client_t *c, pdgw_h1_xfer_t *x)
{
    pdgw_h1_upstream_t *up = x->up;
    struct epoll_event ev;
    pdgw_h1_conn_t *k;
    int fd, one = 1, err = 0;

    if (!up_resolve(up, &err)) {
        xfer_fail(x, PDGW_H1_E_CONNECT, err, "cannot resolve %s", up->host);
        return false;
    }
    fd = socket(up->addrs[up->cur].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        err = errno;
        xfer_fail(x, local_errno(err) ? PDGW_H1_E_LOCAL : PDGW_H1_E_CONNECT, err, "no socket: %s",
                  strerror(err));
        return false;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    k = fd_room(c, fd) ? pdgw_calloc(1, sizeof(*k)) : NULL;
    if (k == NULL) {
        close(fd);
        xfer_fail(x, PDGW_H1_E_LOCAL, ENOMEM, "%s", "gateway out of memory");
        return false;
    }
    k->fd = fd;
    k->gen = ++c->gen;
    k->client = c;
    k->up = up;
    k->x = x;
    pdgw_timer_init(&k->timer, on_conn_timer);
    c->st.open++;
    c->st.connects++;
    x->conn = k;
    x->connected = false;
    if (connect(fd, (const struct sockaddr *)&up->addrs[up->cur], up->addr_lens[up->cur]) == 0) {
        k->state = CONN_ACTIVE;
        k->wr_ready = true;
        x->connected = true;
    } else if (errno == EINPROGRESS) {
        k->state = CONN_CONNECTING;
    } else {
        err = errno;
        conn_close(k);
        if (!local_errno(err) && up_next_addr(x))
            return conn_open(c, x);
        up->n_addrs = 0; /* look the name up again next time */
        xfer_fail(x, local_errno(err) ? PDGW_H1_E_LOCAL : PDGW_H1_E_CONNECT, err, "connect: %s",
                  strerror(err));
        return false;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = conn_tag(c, k);
    if (epoll_ctl(c->o.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        err = errno;
        conn_close(k);
        xfer_fail(x, PDGW_H1_E_LOCAL, err, "epoll_ctl: %s", strerror(err));
        return false;
    }
    c->by_fd[fd] = k;
    if (k->state == CONN_CONNECTING && c->o.connect_timeout_ms > 0 &&
        pdgw_timer_arm(c->o.timers, &k->timer, pdgw_time_mono_ms() + c->o.connect_timeout_ms) !=
            PDGW_OK) {
        conn_close(k);
        xfer_fail(x, PDGW_H1_E_LOCAL, ENOMEM, "%s", "gateway out of memory");
        return false;
    }
    return true;
}

/* <x> failed on its connection before any response byte: may it go again on a new one? */
static bool conn_retry(pdgw_h1_conn_t *k)
{
    pdgw_h1_xfer_t *x = k->x;
    pdgw_h1_client_t *c = k->client;
    if (!k->reused || x->got_bytes || x->retried || k->in_cb)
        return false;
    x->retried = true;
    x->sent = 0;
    c->st.retries++;
    k->x = NULL;
    conn_close(k);
    if (conn_open(c, x) && x->conn->state == CONN_ACTIVE)
        conn_send(x->conn);
    return true;
}

/* <k>'s transfer failed: close the connection, report from the loop. */
static void conn_fail(pdgw_h1_conn_t *k, pdgw_h1_result_t res, int err, const char *fmt,
                      const char *arg)
{
    pdgw_h1_xfer_t *x = k->x;
    k->x = NULL;
    conn_close(k);
    if (x != NULL)
        xfer_fail(x, res, err, fmt, arg);
}

static void on_conn_timer(pdgw_timer_t *t, uint64_t now)
{
    pdgw_h1_conn_t *k = (pdgw_h1_conn_t *)(void *)((char *)t - offsetof(pdgw_h1_conn_t, timer));
    (void)now;
    if (k->state == CONN_IDLE) {
        k->client->st.idle_closed++;
        conn_close(k);
    } else if (k->state == CONN_CONNECTING) {
        k->up->n_addrs = 0;
        conn_fail(k, PDGW_H1_E_CONNECT_TIMEOUT, ETIMEDOUT, "%s", "connection timed out");
    }
}

/* ---------------------------------------------------------------- request */

static size_t xfer_total(const pdgw_h1_xfer_t *x)
{
    return x->head.len + x->body_len;
}

/* Write what is left of the request; the connection stays usable, or failed (x posted, or
 * retried). */
static void conn_send(pdgw_h1_conn_t *k)
{
    pdgw_h1_xfer_t *x = k->x;
    size_t total = xfer_total(x);
    while (x->sent < total && k->wr_ready && !k->wr_dead) {
        struct iovec iov[2];
        struct msghdr mh;
        int n = 0;
        ssize_t w;
        size_t want = total - x->sent;
        if (x->sent < x->head.len) {
            iov[n].iov_base = x->head.data + x->sent;
            iov[n++].iov_len = x->head.len - x->sent;
            if (x->body_len > 0) {
                iov[n].iov_base = (void *)x->body;
                iov[n++].iov_len = x->body_len;
            }
        } else {
            iov[n].iov_base = (void *)(x->body + (x->sent - x->head.len));
            iov[n++].iov_len = total - x->sent;
        }
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
        if (w >= 0) {
            x->sent += (size_t)w;
            if ((size_t)w < want)
                k->wr_ready = false; /* the socket buffer is full: wait for an edge */
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            k->wr_ready = false;
            return;
        }
        if (conn_retry(k))
            return;
        /* The engine may have answered (an early error) and closed: read what is there. */
        k->wr_dead = true;
        k->rd_ready = true;
        snprintf(x->errmsg, sizeof(x->errmsg), "send: %s", strerror(errno));
        return;
    }
}

/* ---------------------------------------------------------------- response */

static int cb_header(void *arg, const char *line, size_t len)
{
    pdgw_h1_conn_t *k = arg;
    return k->x->cb->on_header ? k->x->cb->on_header(k->x->arg, line, len) : 0;
}

static int cb_headers_done(void *arg, int status)
{
    pdgw_h1_conn_t *k = arg;
    pdgw_h1_xfer_t *x = k->x;
    if (x->sent == xfer_total(x) && x->head.cap > 0) {
        /* All sent and answered: no retry will send the head again, so a stream does not
         * keep it for its whole life (sent still equals the total without it). */
        x->sent -= x->head.len;
        pdgw_buf_free(&x->head);
    }
    return x->cb->on_headers_done ? x->cb->on_headers_done(x->arg, status) : 0;
}

static int cb_body(void *arg, const char *data, size_t len)
{
    pdgw_h1_conn_t *k = arg;
    int rc = k->x->cb->on_body(k->x->arg, data, len);
    if (rc == PDGW_H1_BODY_PAUSE && k->x != NULL)
        k->x->paused = true;
    return rc;
}

static const pdgw_h1p_cb_t parse_cb = {cb_header, cb_headers_done, cb_body};

/* The response is complete: keep the connection when HTTP lets us, then tell the owner. */
static void conn_done(pdgw_h1_conn_t *k)
{
    pdgw_h1_xfer_t *x = k->x;
    bool keep = k->parser.keep_alive && k->rlen == 0 && !k->wr_dead && !k->peer_shut &&
                x->sent == xfer_total(x);
    k->x = NULL;
    x->conn = NULL;
    if (keep)
        conn_make_idle(k);
    else
        conn_close(k);
    xfer_report(x, PDGW_H1_OK, 0);
}

static void conn_eof(pdgw_h1_conn_t *k, int err)
{
    pdgw_h1_xfer_t *x = k->x;
    bool in_body = pdgw_h1p_in_body(&k->parser);
    if (err == 0 && k->rlen == 0 && pdgw_h1p_eof(&k->parser)) {
        conn_done(k);
        return;
    }
    if (conn_retry(k))
        return;
    if (err != 0)
        conn_fail(k, in_body ? PDGW_H1_E_PARTIAL : PDGW_H1_E_RESET, err, "recv: %s", strerror(err));
    else if (k->wr_dead && !x->got_bytes)
        conn_fail(k, PDGW_H1_E_RESET, EPIPE, "%s", x->errmsg);
    else
        conn_fail(k, in_body ? PDGW_H1_E_PARTIAL : PDGW_H1_E_RESET, 0, "%s",
                  k->parser.err ? k->parser.err : "connection closed");
}

/* A stream's connection waits long between reads: its read buffer, empty then, is given
 * back, so parked streams hold none (a buffered body's reads follow each other: kept). */
static void conn_rest(pdgw_h1_conn_t *k)
{
    if (k->rlen == 0 && k->rcap > 0 && k->rcap <= RBUF_STREAM_MAX) {
        pdgw_free(k->rbuf);
        k->rbuf = NULL;
        k->rcap = 0;
    }
}

/* Parse what is buffered and read more while the owner takes it. */
static void conn_read(pdgw_h1_conn_t *k)
{
    for (;;) {
        pdgw_h1_xfer_t *x = k->x;
        ssize_t n;
        if (k->rlen > 0) {
            long used;
            k->in_cb++;
            used = pdgw_h1p_feed(&k->parser, k->rbuf, k->rlen, &parse_cb, k);
            k->in_cb--;
            if (k->doomed) {
                conn_close(k);
                return;
            }
            if (used < 0) {
                bool aborted = k->parser.err && strcmp(k->parser.err, "aborted") == 0;
                conn_fail(k, aborted ? PDGW_H1_E_ABORTED : PDGW_H1_E_PROTOCOL, 0,
                          "malformed response: %s", k->parser.err);
                return;
            }
            if (used > 0) {
                k->rlen -= (size_t)used;
                memmove(k->rbuf, k->rbuf + used, k->rlen);
            }
            if (k->parser.state == PDGW_H1P_DONE) {
                conn_done(k);
                return;
            }
            if (x->paused)
                return;
        }
        if (!k->rd_ready) {
            conn_rest(k);
            return;
        }
        if (k->rlen == k->rcap) {
            size_t cap = k->rcap ? k->rcap * 2 : x->rbuf_size;
            char *nb;
            if (k->rcap >= RBUF_MAX) {
                /* A body span is always taken whole, so a full buffer means a line longer
                 * than any the parser accepts. */
                conn_fail(k, PDGW_H1_E_PROTOCOL, 0, "%s", "malformed response: line too long");
                return;
            }
            nb = pdgw_realloc(k->rbuf, cap > RBUF_MAX ? RBUF_MAX : cap);
            if (nb == NULL) {
                conn_fail(k, PDGW_H1_E_LOCAL, ENOMEM, "%s", "gateway out of memory");
                return;
            }
            k->rbuf = nb;
            k->rcap = cap > RBUF_MAX ? RBUF_MAX : cap;
        }
        n = recv(k->fd, k->rbuf + k->rlen, k->rcap - k->rlen, 0);
        if (n > 0) {
            x->got_bytes = true;
            /* A short read drained the socket, unless the engine's FIN was announced: that
             * raises no further edge, so read on until recv says end of stream. */
            if ((size_t)n < k->rcap - k->rlen && !k->peer_shut)
                k->rd_ready = false;
            k->rlen += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            k->rd_ready = false;
            conn_rest(k);
            return;
        }
        conn_eof(k, n < 0 ? errno : 0);
        return;
    }
}

/* Take the connection's transfer as far as it goes: send, then read. */
static void conn_run(pdgw_h1_conn_t *k)
{
    pdgw_h1_xfer_t *x = k->x;
    if (x->sent < xfer_total(x)) {
        conn_send(k);
        if (x->conn != k)
            return; /* failed or retried on another connection */
    }
    if (!x->paused)
        conn_read(k);
}

void pdgw_h1_on_event(pdgw_h1_client_t *c, uint64_t tag, uint32_t events)
{
    int fd = (int)(uint32_t)tag;
    uint32_t gen = (uint32_t)(tag >> 40);
    pdgw_h1_conn_t *k;
    if (fd < 0 || (size_t)fd >= c->fd_cap || (k = c->by_fd[fd]) == NULL ||
        (k->gen & 0xffffffu) != gen)
        return; /* a connection closed earlier in this round */
    if (k->state == CONN_IDLE) {
        if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            c->st.idle_closed++;
            conn_close(k); /* the engine closed it or spoke out of turn */
        }
        return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        k->rd_ready = true;
    /* A FIN that came with the response's last bytes raises no edge once the connection is
     * idle: remember it now. */
    if (events & (EPOLLRDHUP | EPOLLHUP))
        k->peer_shut = true;
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        k->wr_ready = true;
    if (k->state == CONN_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err != 0) {
            pdgw_h1_xfer_t *x = k->x;
            if (!local_errno(err) && up_next_addr(x)) {
                k->x = NULL;
                conn_close(k);
                if (conn_open(c, x) && x->conn->state == CONN_ACTIVE)
                    conn_send(x->conn);
                return;
            }
            k->up->n_addrs = 0;
            conn_fail(k, local_errno(err) ? PDGW_H1_E_LOCAL : PDGW_H1_E_CONNECT, err, "connect: %s",
                      strerror(err));
            return;
        }
        if (!(events & EPOLLOUT))
            return;
        k->state = CONN_ACTIVE;
        k->x->connected = true;
        pdgw_timer_cancel(c->o.timers, &k->timer);
    }
    conn_run(k);
}

void pdgw_h1_run_posted(pdgw_h1_client_t *c)
{
    pdgw_h1_xfer_t *x;
    while ((x = c->post_head) != NULL) {
        unpost(c, x);
        if (x->pending != PDGW_H1_OK) {
            pdgw_h1_result_t res = x->pending;
            x->pending = PDGW_H1_OK;
            xfer_report(x, res, x->pending_errno);
        } else if (x->conn != NULL && x->conn->state == CONN_ACTIVE && !x->paused) {
            conn_run(x->conn);
        }
    }
}

bool pdgw_h1_has_posted(const pdgw_h1_client_t *c)
{
    return c->post_head != NULL;
}

/* ---------------------------------------------------------------- transfers */

bool pdgw_h1_url_supported(const char *url)
{
    return url != NULL && strncasecmp(url, "http://", 7) == 0 && url[7] != '\0';
}

static pdgw_h1_upstream_t *up_find(pdgw_h1_client_t *c, const char *url)
{
    const char *auth = url + 7, *end = auth + strcspn(auth, "/?#");
    size_t olen = (size_t)(end - url), alen = (size_t)(end - auth);
    pdgw_h1_upstream_t *up;
    const char *colon;

    for (up = c->ups; up != NULL; up = up->next)
        if (up->origin_len == olen && strncmp(up->origin, url, olen) == 0)
            return up;
    if (alen == 0 || memchr(auth, '@', alen) != NULL)
        return NULL; /* no host, or credentials in the URL: not ours to handle */
    up = pdgw_calloc(1, sizeof(*up));
    if (up == NULL)
        return NULL;
    up->origin = pdgw_strndup(url, olen);
    up->origin_len = olen;
    up->authority = pdgw_strndup(auth, alen);
    if (auth[0] == '[') { /* an IPv6 literal */
        const char *rb = memchr(auth, ']', alen);
        colon = rb && rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
        up->host = rb ? pdgw_strndup(auth + 1, (size_t)(rb - auth - 1)) : NULL;
    } else {
        colon = memchr(auth, ':', alen);
        up->host = pdgw_strndup(auth, colon ? (size_t)(colon - auth) : alen);
    }
    up->port = colon ? pdgw_strndup(colon + 1, (size_t)(end - colon - 1)) : pdgw_strdup("80");
    if (up->origin == NULL || up->authority == NULL || up->host == NULL || up->port == NULL) {
        pdgw_free(up->origin);
        pdgw_free(up->authority);
        pdgw_free(up->host);
        pdgw_free(up->port);
        pdgw_free(up);
        return NULL;
    }
    up->next = c->ups;
    c->ups = up;
    return up;
}

/* Append <name> (<n> bytes), <sep> (<sn>), <value> (<vn>) and CRLF: one reserve, the head
 * is built from pieces without printf (every leg adds a few lines). */
static pdgw_status_t head_put(pdgw_buf_t *b, const char *name, size_t n, const char *sep, size_t sn,
                              const char *value, size_t vn)
{
    char *p;
    if (pdgw_buf_reserve(b, n + sn + vn + 2) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    p = b->data + b->len;
    memcpy(p, name, n);
    memcpy(p + n, sep, sn);
    memcpy(p + n + sn, value, vn);
    memcpy(p + n + sn + vn, "\r\n", 3); /* with the terminating NUL the buffer keeps */
    b->len += n + sn + vn + 2;
    return PDGW_OK;
}

/* <v> in decimal, in <buf> (24 bytes). */
static const char *size_text(char *buf, size_t v)
{
    char *p = buf + 23;
    *p = '\0';
    do
        *--p = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    return p;
}

/* Could <s> end the request line early or start a header (a control byte or a space)?
 * Callers encode their targets; this is the last line of defence, as libcurl has one. */
static bool breaks_request_line(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f)
            return true;
    return false;
}

pdgw_status_t pdgw_h1_xfer_begin(pdgw_h1_xfer_t *x, pdgw_h1_client_t *c, const char *method,
                                 const char *url)
{
    const char *target;
    size_t mn, sn, tn;
    char *p;
    if (x->running)
        return PDGW_ERR_INVALID;
    if (!pdgw_h1_url_supported(url) || breaks_request_line(url) || breaks_request_line(method))
        return PDGW_ERR_INVALID;
    x->up = up_find(c, url);
    if (x->up == NULL)
        return PDGW_ERR_NOMEM;
    x->client = c;
    target = url + x->up->origin_len;
    pdgw_buf_reset(&x->head);
    x->head_request = strcmp(method, "HEAD") == 0;
    x->named_host = x->named_accept = x->has_markers = false;
    x->errmsg[0] = '\0';
    x->rbuf_size = 0;
    /* "METHOD /target HTTP/1.1": a slash goes before a target without one. A proxied head is
     * a few hundred bytes: one allocation instead of growing from 64. */
    mn = strlen(method);
    sn = target[0] == '/' ? 1 : 2;
    tn = strlen(target);
    if (pdgw_buf_reserve(&x->head, 512 + mn + tn) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    p = x->head.data;
    memcpy(p, method, mn);
    memcpy(p + mn, " /", sn);
    memcpy(p + mn + sn, target, tn);
    memcpy(p + mn + sn + tn, " HTTP/1.1\r\n", 12); /* with the NUL the buffer keeps */
    x->head.len = mn + sn + tn + 11;
    return PDGW_OK;
}

/* Framing is the client's own business; an owner's line for these is dropped. */
static bool header_is_framing(const char *name, size_t n)
{
    return (n == 14 && strncasecmp(name, "content-length", 14) == 0) ||
           (n == 17 && strncasecmp(name, "transfer-encoding", 17) == 0) ||
           (n == 10 && strncasecmp(name, "connection", 10) == 0) ||
           (n == 6 && strncasecmp(name, "expect", 6) == 0);
}

/* Host and Accept are added at the start unless the owner set (or removed) its own. */
static void note_named(pdgw_h1_xfer_t *x, const char *name, size_t n)
{
    if (n == 4 && strncasecmp(name, "host", 4) == 0)
        x->named_host = true;
    else if (n == 6 && strncasecmp(name, "accept", 6) == 0)
        x->named_accept = true;
}

pdgw_status_t pdgw_h1_xfer_field(pdgw_h1_xfer_t *x, const char *name, size_t n, const char *value,
                                 size_t vn)
{
    size_t i;
    if (n == 0 || memchr(value, '\r', vn) != NULL || memchr(value, '\n', vn) != NULL)
        return PDGW_ERR_INVALID;
    for (i = 0; i < n; i++)
        if (!pdgw_h1_is_tchar((unsigned char)name[i]))
            return PDGW_ERR_INVALID;
    if (header_is_framing(name, n))
        return PDGW_OK;
    note_named(x, name, n);
    if (vn == 0) { /* do not send the client's own (a marker line, cut at start) */
        x->has_markers = true;
        return head_put(&x->head, name, n, "\x01", 1, "", 0);
    }
    return head_put(&x->head, name, n, ": ", 2, value, vn);
}

pdgw_status_t pdgw_h1_xfer_header(pdgw_h1_xfer_t *x, const char *line)
{
    const char *sep = line + strcspn(line, ":;");
    size_t n = (size_t)(sep - line);
    const char *v;
    if (*sep == '\0' || n == 0 || strpbrk(line, "\r\n") != NULL)
        return PDGW_ERR_INVALID;
    if (header_is_framing(line, n))
        return PDGW_OK;
    note_named(x, line, n);
    v = sep + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (*sep == ';') {
        if (*v != '\0')
            return PDGW_ERR_INVALID;
        /* "Name;" = the header with an empty value. */
        return head_put(&x->head, line, n, ":", 1, "", 0);
    }
    if (*v == '\0') { /* "Name:" = do not send the client's own (a marker line, cut at start) */
        x->has_markers = true;
        return head_put(&x->head, line, n, "\x01", 1, "", 0);
    }
    return head_put(&x->head, line, n, ": ", 2, v, strlen(v));
}

/* Remove the marker lines "Name\x01\r\n" left by header removals. */
static void head_drop_markers(pdgw_h1_xfer_t *x)
{
    char *p = memchr(x->head.data, '\n', x->head.len), *end = x->head.data + x->head.len;
    char *out;
    if (p == NULL)
        return;
    out = ++p;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
        if (!(ll >= 3 && p[ll - 3] == '\x01')) {
            memmove(out, p, ll);
            out += ll;
        }
        p += ll;
    }
    x->head.len = (size_t)(out - x->head.data);
}

pdgw_status_t pdgw_h1_xfer_start(pdgw_h1_xfer_t *x, const char *body, size_t body_len,
                                 size_t rbuf_size, const pdgw_h1_xfer_cb_t *cb, void *arg)
{
    pdgw_h1_client_t *c = x->client;
    pdgw_h1_upstream_t *up = x->up;
    bool has_body;
    pdgw_h1_conn_t *k;
    char len_text[24];
    const char *len;

    if (x->running || c == NULL || up == NULL || x->head.len == 0)
        return PDGW_ERR_INVALID;
    has_body = !x->head_request && strncmp(x->head.data, "GET ", 4) != 0;
    len = size_text(len_text, body_len); /* its digits end at len_text[23] */
    if ((!x->named_host &&
         head_put(&x->head, "Host", 4, ": ", 2, up->authority, strlen(up->authority)) != PDGW_OK) ||
        (!x->named_accept && head_put(&x->head, "Accept", 6, ": ", 2, "*/*", 3) != PDGW_OK) ||
        (has_body && head_put(&x->head, "Content-Length", 14, ": ", 2, len,
                              (size_t)(len_text + 23 - len)) != PDGW_OK) ||
        pdgw_buf_append(&x->head, "\r\n", 2) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    if (x->has_markers)
        head_drop_markers(x);
    x->body = has_body ? body : NULL;
    x->body_len = has_body ? body_len : 0;
    x->sent = 0;
    x->rbuf_size = rbuf_size < 1024 ? 1024 : rbuf_size;
    x->cb = cb;
    x->arg = arg;
    x->paused = x->got_bytes = x->retried = x->connected = false;
    x->addr_tries = 0;
    x->pending = PDGW_H1_OK;
    x->running = true;

    k = up->idle;
    if (k != NULL) {
        lru_unlink(c, k);
        pdgw_timer_cancel(c->o.timers, &k->timer);
        k->state = CONN_ACTIVE;
        k->reused = true;
        k->rd_ready = false; /* input on an idle connection closes it */
        k->wr_ready = true;  /* edges while idle were not recorded: try, EAGAIN tells */
        k->x = x;
        x->conn = k;
        x->connected = true;
        c->st.reused++;
    } else if (!conn_open(c, x)) {
        return PDGW_OK; /* reported from the loop */
    } else {
        k = x->conn;
    }
    k->rlen = 0;
    k->wr_dead = false;
    k->doomed = false;
    pdgw_h1p_init(&k->parser, x->head_request);
    if (k->rcap != x->rbuf_size && !(k->rcap == 0 && x->rbuf_size <= RBUF_STREAM_MAX)) {
        /* Sized for this transfer: small for streams (thousands at once), larger for
         * buffered bodies. */
        char *nb = pdgw_realloc(k->rbuf, x->rbuf_size);
        if (nb == NULL) {
            conn_fail(k, PDGW_H1_E_LOCAL, ENOMEM, "%s", "gateway out of memory");
            return PDGW_OK;
        }
        k->rbuf = nb;
        k->rcap = x->rbuf_size;
    }
    if (k->state == CONN_ACTIVE) {
        conn_send(k);
        /* Input already waiting (an early answer) is read from the loop. */
        if (x->conn == k && k->rd_ready)
            post(c, x);
    }
    return PDGW_OK;
}

void pdgw_h1_xfer_abort(pdgw_h1_xfer_t *x)
{
    pdgw_h1_conn_t *k = x->conn;
    if (!x->running)
        return;
    if (x->client)
        unpost(x->client, x);
    x->running = false;
    x->paused = false;
    x->conn = NULL;
    if (k != NULL) {
        k->x = NULL;
        if (k->in_cb)
            k->doomed = true; /* its reader closes it when the callback returns */
        else
            conn_close(k);
    }
}

void pdgw_h1_xfer_unpause(pdgw_h1_xfer_t *x)
{
    if (!x->running || !x->paused)
        return;
    x->paused = false;
    post(x->client, x);
}

void pdgw_h1_xfer_release(pdgw_h1_xfer_t *x)
{
    pdgw_h1_xfer_abort(x);
    pdgw_buf_free(&x->head);
}

/* ---------------------------------------------------------------- client */

pdgw_status_t pdgw_h1_client_create(const pdgw_h1_client_opts_t *o, pdgw_h1_client_t **out)
{
    pdgw_h1_client_t *c = pdgw_calloc(1, sizeof(*c));
    if (c == NULL)
        return PDGW_ERR_NOMEM;
    c->o = *o;
    *out = c;
    return PDGW_OK;
}

void pdgw_h1_client_destroy(pdgw_h1_client_t *c)
{
    size_t i;
    if (c == NULL)
        return;
    while (c->lru_head)
        conn_close(c->lru_head);
    for (i = 0; i < c->fd_cap; i++)
        if (c->by_fd[i] != NULL) {
            /* A transfer's owner forgot it: drop it unreported, without touching the
             * owner (it may be gone). */
            c->by_fd[i]->x = NULL;
            conn_close(c->by_fd[i]);
        }
    while (c->ups) {
        pdgw_h1_upstream_t *up = c->ups;
        c->ups = up->next;
        pdgw_free(up->origin);
        pdgw_free(up->authority);
        pdgw_free(up->host);
        pdgw_free(up->port);
        pdgw_free(up);
    }
    pdgw_free(c->by_fd);
    pdgw_free(c);
}

void pdgw_h1_client_stats(const pdgw_h1_client_t *c, pdgw_h1_stats_t *out)
{
    *out = c->st;
}
