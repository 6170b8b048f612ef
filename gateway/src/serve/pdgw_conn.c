/*
 * pdgw_conn.c - the client connection guard: who may connect, and how long a peer may take
 * to send a request.
 *
 * libmicrohttpd's own connection timeout is an idle timeout: every byte restarts it, so a
 * peer trickling one header byte a second holds its connection (and its memory pool)
 * forever. Each connection therefore carries a deadline of its own, armed when it opens
 * (and again when a kept-alive request ends): the request headers must be complete by
 * then, and once they are, the body must be complete by the request's deadline. The deadline
 * is a timer on the worker's heap (pdgw_timer.h); when it fires the socket is shut (MHD then
 * sees the end of the stream and closes the connection the ordinary way). Nothing scans all
 * connections.
 *
 * At accept, the policy callback refuses a connection above the worker's share of the
 * descriptor budget or above the per-client-address cap; the address counts are shared by
 * all workers (SO_REUSEPORT spreads one client over several).
 */
#include "pdgw_server_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

typedef enum {
    CONN_HEADERS = 0, /* waiting for complete request headers */
    CONN_BODY,        /* headers done, body being received */
    CONN_BUSY,        /* request read: the workflow and the response own the time */
    CONN_WRITE,       /* an answer waits for the client to read it (native front end) */
    CONN_LINGER,      /* answered and half-closed: what the client still sends is dropped */
    CONN_CLOSING,     /* the guard shut the socket */
} conn_phase_t;

struct pdgw_conn {
    pdgw_worker_t *w;
    int fd;
    conn_phase_t phase;
    pdgw_req_t *req;    /* request whose body is being received (CONN_BODY) */
    pdgw_timer_t timer; /* header / body deadline on w->timers */
    unsigned char addr[16];
    unsigned addr_len; /* 0 = not counted in the address table */
};

/* ---------------------------------------------------------------- address table */

#define ADDR_BUCKETS 4096

typedef struct addr_entry {
    unsigned char key[16];
    unsigned len;
    unsigned count;
    struct addr_entry *next;
} addr_entry_t;

struct pdgw_addr_table {
    pthread_mutex_t lock;
    addr_entry_t *buckets[ADDR_BUCKETS];
};

pdgw_addr_table_t *pdgw_addr_table_create(void)
{
    pdgw_addr_table_t *t = pdgw_calloc(1, sizeof(*t));
    if (t)
        pthread_mutex_init(&t->lock, NULL);
    return t;
}

void pdgw_addr_table_destroy(pdgw_addr_table_t *t)
{
    size_t i;
    if (t == NULL)
        return;
    for (i = 0; i < ADDR_BUCKETS; i++) {
        while (t->buckets[i]) {
            addr_entry_t *e = t->buckets[i];
            t->buckets[i] = e->next;
            pdgw_free(e);
        }
    }
    pthread_mutex_destroy(&t->lock);
    pdgw_free(t);
}

static unsigned addr_hash(const unsigned char *k, unsigned len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    unsigned i;
    for (i = 0; i < len; i++)
        h = (h ^ k[i]) * 16777619u;
    return h % ADDR_BUCKETS;
}

/* Count one more connection from <k> unless <cap> are open already; true when counted. */
static bool addr_acquire(pdgw_addr_table_t *t, const unsigned char *k, unsigned len, unsigned cap)
{
    unsigned b = addr_hash(k, len);
    addr_entry_t *e;
    bool ok = true;
    pthread_mutex_lock(&t->lock);
    for (e = t->buckets[b]; e; e = e->next)
        if (e->len == len && memcmp(e->key, k, len) == 0)
            break;
    if (e == NULL) {
        e = pdgw_calloc(1, sizeof(*e));
        if (e == NULL) {
            ok = false; /* out of memory: refusing is the safe side */
        } else {
            memcpy(e->key, k, len);
            e->len = len;
            e->next = t->buckets[b];
            t->buckets[b] = e;
        }
    }
    if (ok && e->count >= cap)
        ok = false;
    if (ok)
        e->count++;
    pthread_mutex_unlock(&t->lock);
    return ok;
}

static void addr_release(pdgw_addr_table_t *t, const unsigned char *k, unsigned len)
{
    unsigned b = addr_hash(k, len);
    addr_entry_t **pp, *e;
    pthread_mutex_lock(&t->lock);
    for (pp = &t->buckets[b]; (e = *pp) != NULL; pp = &e->next) {
        if (e->len == len && memcmp(e->key, k, len) == 0) {
            if (e->count > 0)
                e->count--;
            if (e->count == 0) {
                *pp = e->next;
                pdgw_free(e);
            }
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
}

/* The address bytes a client is counted under; an IPv4-mapped IPv6 address counts as the
 * IPv4 one. 0 when the family is not IP. */
static unsigned addr_key(const struct sockaddr *a, socklen_t alen, unsigned char out[16])
{
    if (a == NULL)
        return 0;
    if (a->sa_family == AF_INET && alen >= (socklen_t)sizeof(struct sockaddr_in)) {
        memcpy(out, &((const struct sockaddr_in *)a)->sin_addr, 4);
        return 4;
    }
    if (a->sa_family == AF_INET6 && alen >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *in6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(in6)) {
            memcpy(out, in6->s6_addr + 12, 4);
            return 4;
        }
        memcpy(out, in6->s6_addr, 16);
        return 16;
    }
    return 0;
}

/* ---------------------------------------------------------------- the deadline */

static void conn_disarm(pdgw_conn_t *c)
{
    pdgw_timer_cancel(&c->w->timers, &c->timer);
}

/* Arm (or move) <c>'s deadline. Without room in the heap the connection keeps only MHD's
 * idle timeout; the next arm tries again. */
static void conn_arm(pdgw_conn_t *c, uint64_t deadline_ms)
{
    (void)pdgw_timer_arm(&c->w->timers, &c->timer, deadline_ms);
}

static void conn_on_deadline(pdgw_timer_t *t, uint64_t now_ms);

static void conn_arm_headers(pdgw_conn_t *c)
{
    uint64_t t = c->w->srv->opts.client_header_timeout_ms;
    c->phase = CONN_HEADERS;
    c->req = NULL;
    if (t > 0)
        conn_arm(c, pdgw_now_ms() + t);
    else
        conn_disarm(c);
}

/* ---------------------------------------------------------------- MHD callbacks */

unsigned pdgw_conn_limit_derive(uint64_t nofile, unsigned workers, unsigned fds_per_conn)
{
    /* Reserve: listening sockets, epoll and event fds, logs, discovery and scrape
     * connections, libkvt and plugin sockets. The rest is shared by client connections and
     * their upstream legs. */
    const uint64_t reserve = 64 + 4 * (uint64_t)workers;
    uint64_t total;
    if (fds_per_conn < 2)
        fds_per_conn = 2;
    total = nofile > reserve ? (nofile - reserve) / fds_per_conn : 0;
    if (total < 4)
        total = 4; /* a tiny budget still serves a few clients */
    if (total > 10000000)
        total = 10000000;
    return (unsigned)total;
}

/* Refusals come in storms: one warning a second at most, with the count skipped. */
static void conn_refused(pdgw_worker_t *w, const char *reason)
{
    static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
    uint64_t skipped = 0;
    pdgw_gateway_metrics_conn_closed(w->srv->opts.metrics, reason);
    if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
        pdgw_log_warn("http",
                      "refusing a client connection: %s (%u open on worker %u; %llu "
                      "similar suppressed)",
                      reason, w->n_conns, w->index, (unsigned long long)skipped);
}

enum MHD_Result pdgw_conn_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    pdgw_worker_t *w = cls;
    pdgw_server_t *srv = w->srv;
    unsigned char key[16];
    unsigned len;

    /* A connection let in earlier that MHD did not announce (it failed to set it up). */
    pdgw_conn_after_run(w);
    if (atomic_load(&srv->conns_open) >= srv->conn_limit) {
        conn_refused(w, "connection_limit");
        return MHD_NO;
    }
    if (srv->opts.max_connections_per_client == 0 || srv->addrs == NULL)
        return MHD_YES;
    len = addr_key(addr, addrlen, key);
    if (len == 0)
        return MHD_YES;
    if (!addr_acquire(srv->addrs, key, len, srv->opts.max_connections_per_client)) {
        conn_refused(w, "per_client_limit");
        return MHD_NO;
    }
    memcpy(w->pending_addr, key, len);
    w->pending_addr_len = len;
    return MHD_YES;
}

void pdgw_conn_after_run(pdgw_worker_t *w)
{
    if (w->pending_addr_len == 0)
        return;
    addr_release(w->srv->addrs, w->pending_addr, w->pending_addr_len);
    w->pending_addr_len = 0;
}

pdgw_conn_t *pdgw_conn_open(pdgw_worker_t *w, int fd)
{
    pdgw_conn_t *c = pdgw_calloc(1, sizeof(*c));
    w->n_conns++;
    atomic_fetch_add(&w->srv->conns_open, 1);
    if (c == NULL)
        return NULL; /* served without a guard; its address reservation is released by
                      * pdgw_conn_after_run */
    c->w = w;
    c->fd = fd;
    pdgw_timer_init(&c->timer, conn_on_deadline);
    /* The accept policy has just let this connection in: take over its address. */
    if (w->pending_addr_len > 0) {
        memcpy(c->addr, w->pending_addr, w->pending_addr_len);
        c->addr_len = w->pending_addr_len;
        w->pending_addr_len = 0;
    }
    conn_arm_headers(c);
    return c;
}

void pdgw_conn_close(pdgw_worker_t *w, pdgw_conn_t *c)
{
    if (w->n_conns > 0) {
        w->n_conns--;
        atomic_fetch_sub(&w->srv->conns_open, 1);
    }
    if (c == NULL)
        return;
    conn_disarm(c);
    if (c->addr_len > 0)
        addr_release(w->srv->addrs, c->addr, c->addr_len);
    pdgw_free(c);
}

void pdgw_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    pdgw_worker_t *w = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = pdgw_conn_open(w, ci ? ci->connect_fd : -1);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        pdgw_conn_close(w, *socket_context);
        *socket_context = NULL;
    }
}

pdgw_conn_t *pdgw_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (pdgw_conn_t *)ci->socket_context : NULL;
}

void pdgw_conn_headers_done(pdgw_conn_t *c, pdgw_req_t *r)
{
    if (c == NULL || c->phase == CONN_CLOSING)
        return;
    c->phase = CONN_BODY;
    c->req = r;
    conn_arm(c, r->deadline_ms);
}

void pdgw_conn_body_done(pdgw_conn_t *c)
{
    if (c == NULL || c->phase == CONN_CLOSING)
        return;
    c->phase = CONN_BUSY;
    c->req = NULL;
    conn_disarm(c);
}

void pdgw_conn_request_done(pdgw_conn_t *c)
{
    if (c == NULL || c->phase == CONN_CLOSING)
        return;
    conn_arm_headers(c);
}

void pdgw_conn_write_wait(pdgw_conn_t *c, uint64_t ms)
{
    if (c == NULL || c->phase == CONN_CLOSING || c->phase == CONN_WRITE)
        return;
    c->phase = CONN_WRITE;
    c->req = NULL;
    conn_arm(c, pdgw_now_ms() + ms);
}

void pdgw_conn_linger(pdgw_conn_t *c, uint64_t ms)
{
    if (c == NULL || c->phase == CONN_CLOSING)
        return;
    c->phase = CONN_LINGER;
    c->req = NULL;
    conn_arm(c, pdgw_now_ms() + ms);
}

/* The deadline passed: shut the socket (its front end reads the end of the stream and closes
 * the connection). */
static void conn_on_deadline(pdgw_timer_t *t, uint64_t now_ms)
{
    pdgw_conn_t *c = (pdgw_conn_t *)(void *)((char *)t - offsetof(pdgw_conn_t, timer));
    pdgw_worker_t *w = c->w;
    pdgw_gateway_metrics_t *gm = w->srv->opts.metrics;
    (void)now_ms;
    if (c->phase == CONN_LINGER) {
        /* Not an error: the answer went out; the rest of the request is not waited for. */
        c->phase = CONN_CLOSING;
        if (c->fd >= 0)
            (void)shutdown(c->fd, SHUT_RDWR);
        return;
    }
    if (c->phase == CONN_BODY && c->req != NULL) {
        pdgw_req_t *r = c->req;
        /* Logged and counted as 408 when MHD completes the request. */
        r->final_status = 408;
        pdgw_req_error_set(
            r, "request body not received within the request deadline (%llu bytes read)",
            (unsigned long long)r->body.len);
        pdgw_gateway_metrics_conn_closed(gm, "body_timeout");
    } else {
        pdgw_gateway_metrics_conn_closed(gm, c->phase == CONN_WRITE ? "write_timeout"
                                                                    : "header_timeout");
    }
    pdgw_log_debug("http", "closing a client connection: %s not complete in time",
                   c->phase == CONN_BODY    ? "request body"
                   : c->phase == CONN_WRITE ? "reading of the answer"
                                            : "request headers");
    c->phase = CONN_CLOSING;
    c->req = NULL;
    /* The front end reads the end of the stream (MHD on its next run) and closes the
     * connection (and completes its request) itself; the descriptor stays its to close. */
    if (c->fd >= 0 && shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
        pdgw_log_debug("http", "shutdown: %s", strerror(errno));
    /* Only MHD needs the kick (the native front end's socket reports the shutdown itself):
     * without a daemon nothing clears it and every epoll_wait would return at once. */
    if (w->mhd != NULL)
        w->mhd_kick = true;
}
