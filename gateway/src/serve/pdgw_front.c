/*
 * pdgw_front.c - the native front end: client connections on the worker's own epoll loop.
 *
 * Each worker listens on its own SO_REUSEPORT socket. A connection is added to the worker's
 * epoll set once, edge-triggered for input, output and hang-up, and stays there until it
 * closes: a request waiting for its answer costs no system call (libmicrohttpd takes the
 * socket out of its set at every suspension and puts it back after).
 *
 * One request at a time per connection (RFC 9112 9.3.2: pipelined requests are answered in
 * order): its head is found in the bytes read, copied once and split in place
 * (pdgw_front_parse.c); its body (Content-Length or chunked) goes through the upstream
 * parser's body states into the request; then the request path decides (pdgw_http.c). The
 * sink wakes the connection when the answer is known (pdgw_front_wake): a reply is written
 * with one writev of head and body; a stream's head is handed to the sink's direct writer,
 * which frames and sends the events (pdgw_sink_direct.c). Bytes that arrive behind a request
 * wait in the connection's buffer until it is answered.
 *
 * Deadlines are the connection guard's (pdgw_conn.c): header and body deadlines shut the
 * socket, and the end of the stream closes the connection here.
 */
#include "pdgw_server_int.h"
#include "pdgw_front.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

/* Read in steps of this much (a per-worker buffer; a connection keeps only what is left). */
#define READ_STEP (64u * 1024u)
/* Bytes kept behind an unanswered request before reading stops until it is answered. */
#define MAX_PIPELINED (64u * 1024u)
/* Connections accepted per readiness event (the rest on the next turn: fairness). */
#define ACCEPT_BURST 64
/* How long a closing connection reads on, so that what the client is still sending (the body
 * of a refused request) does not turn the close into a reset that destroys the answer. */
#define LINGER_MS 2000u
/* How long accepting pauses when the process is out of descriptors. */
#define ACCEPT_PAUSE_MS 100u
/* A client must take a written answer within this (libmicrohttpd's idle timeout in pdgw). */
#define WRITE_TIMEOUT_MS 300000u

typedef enum {
    FC_HEAD = 0, /* waiting for a request head */
    FC_BODY,     /* reading its body */
    FC_WAIT,     /* the request path decides; the sink wakes the connection */
    FC_WRITE,    /* a reply is being written */
    FC_STREAM,   /* the sink's direct writer owns the output */
    FC_FINISH,   /* a stream's last chunk is being written */
    FC_LINGER,   /* answered and half-closed: the rest of the client's bytes are dropped */
} fc_state_t;

struct pdgw_front_conn {
    pdgw_worker_t *w;
    int fd;
    fc_state_t state;
    pdgw_conn_t *cx; /* the guard (may be NULL) */
    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } addr;
    pdgw_buf_t in;    /* bytes read and not consumed */
    size_t head_scan; /* how far the search for the head's end got */
    char *head;       /* the current request's head, split in place */
    size_t head_cap;
    pdgw_front_head_t h;
    pdgw_h1p_t body;
    pdgw_req_t *r;
    bool close_after; /* close once the response is out */
    bool read_held;   /* reading stopped (bytes behind a request); read again after it */
    bool eof;         /* the client finished sending */
    bool consuming;   /* inside consume(): a request answered at once lets it go on (no
                       * recursion per pipelined request) */
    /* a reply being written: head in out, then the body */
    pdgw_buf_t out;
    size_t out_off;
    const char *body_ptr;
    size_t body_left;
    pdb_dlink_t ready_link; /* on w->front_ready */
};

static uint64_t tag(int kind, int fd)
{
    return ((uint64_t)(unsigned)kind << 32) | (uint32_t)fd;
}

/* ---------------------------------------------------------------- listening */

pdgw_status_t pdgw_front_listen(pdgw_worker_t *w, const struct sockaddr *addr, char *err,
                                size_t errlen)
{
    socklen_t len =
        addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    struct epoll_event ev;
    int one = 1;
    int fd;
    w->front_scratch = pdgw_malloc(READ_STEP);
    if (w->front_scratch == NULL) {
        snprintf(err, errlen, "worker %u: out of memory", w->index);
        return PDGW_ERR_NOMEM;
    }
    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "worker %u: socket: %s", w->index, strerror(errno));
        return PDGW_ERR_SYSTEM;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
        bind(fd, addr, len) != 0 || listen(fd, 4096) != 0) {
        snprintf(err, errlen, "cannot listen on port %d (worker %u): %s",
                 ntohs(((const struct sockaddr_in *)addr)->sin_port), w->index, strerror(errno));
        close(fd);
        return PDGW_ERR_SYSTEM;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = tag(PDGW_EV_FRONT_LISTEN, fd);
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        snprintf(err, errlen, "worker %u: epoll_ctl: %s", w->index, strerror(errno));
        close(fd);
        return PDGW_ERR_SYSTEM;
    }
    w->front_fd = fd;
    return PDGW_OK;
}

int pdgw_front_port(const pdgw_worker_t *w)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (w->front_fd < 0 || getsockname(w->front_fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    return ntohs(((struct sockaddr_in *)&ss)->sin_port); /* same offset in sockaddr_in6 */
}

void pdgw_front_quiesce(pdgw_worker_t *w)
{
    if (w->front_fd < 0)
        return;
    close(w->front_fd); /* leaves the epoll set with it */
    w->front_fd = -1;
}

/* ---------------------------------------------------------------- connection table */

static bool table_put(pdgw_worker_t *w, int fd, pdgw_front_conn_t *fc)
{
    if (fd >= w->front_cap) {
        int cap = w->front_cap > 0 ? w->front_cap : 256;
        pdgw_front_conn_t **t;
        while (cap <= fd)
            cap *= 2;
        t = pdgw_realloc(w->front_conns, (size_t)cap * sizeof(*t));
        if (t == NULL)
            return false;
        memset(t + w->front_cap, 0, (size_t)(cap - w->front_cap) * sizeof(*t));
        w->front_conns = t;
        w->front_cap = cap;
    }
    w->front_conns[fd] = fc;
    return true;
}

void pdgw_front_wake(pdgw_front_conn_t *fc)
{
    pdb_dlist_push(&fc->w->front_ready, &fc->ready_link);
}

const pdgw_front_head_t *pdgw_front_conn_head(const pdgw_front_conn_t *fc)
{
    return &fc->h;
}

/* ---------------------------------------------------------------- the end of a request */

static void end_request(pdgw_front_conn_t *fc, bool ok)
{
    pdgw_req_t *r = fc->r;
    if (r == NULL)
        return;
    fc->r = NULL;
    pdgw_http_end(r, ok);
    /* A small head buffer is kept for the next answer (one allocation less per request). */
    if (fc->out.cap > 4096)
        pdgw_buf_free(&fc->out);
    else
        pdgw_buf_reset(&fc->out);
    fc->out_off = 0;
    fc->body_ptr = NULL;
    fc->body_left = 0;
}

static void conn_close(pdgw_front_conn_t *fc)
{
    pdgw_worker_t *w = fc->w;
    end_request(fc, false);
    pdb_dlist_remove(&w->front_ready, &fc->ready_link);
    if (fc->fd >= 0) {
        if (fc->fd < w->front_cap)
            w->front_conns[fc->fd] = NULL;
        close(fc->fd);
    }
    pdgw_conn_close(w, fc->cx);
    pdgw_buf_free(&fc->in);
    pdgw_buf_free(&fc->out);
    pdgw_free(fc->head);
    pdgw_free(fc);
}

void pdgw_front_close_all(pdgw_worker_t *w)
{
    int fd;
    for (fd = 0; fd < w->front_cap; fd++)
        if (w->front_conns[fd] != NULL)
            conn_close(w->front_conns[fd]);
    pdgw_free(w->front_conns);
    w->front_conns = NULL;
    w->front_cap = 0;
    pdgw_front_quiesce(w);
}

/* ---------------------------------------------------------------- writing */

/* The Date header's value, formatted once a second per worker (RFC 9110 5.6.7). */
static const char *http_date(pdgw_worker_t *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    if (ts.tv_sec != w->front_date_sec) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(w->front_date, sizeof(w->front_date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        w->front_date_sec = ts.tv_sec;
    }
    return w->front_date;
}

typedef struct {
    pdgw_hdr_out_t out;
    pdgw_buf_t *head;
    bool ok;
} head_out_t;

static void head_add(pdgw_hdr_out_t *o, const char *name, const char *value)
{
    head_out_t *h = (head_out_t *)(void *)o;
    size_t nl = strlen(name), vl = strlen(value);
    /* A line break in a value would start a header of its own: drop such a value. */
    if (strpbrk(value, "\r\n") != NULL)
        return;
    if (pdgw_buf_reserve(h->head, nl + vl + 4) != PDGW_OK) {
        h->ok = false;
        return;
    }
    memcpy(h->head->data + h->head->len, name, nl);
    memcpy(h->head->data + h->head->len + nl, ": ", 2);
    memcpy(h->head->data + h->head->len + nl + 2, value, vl);
    memcpy(h->head->data + h->head->len + nl + 2 + vl, "\r\n", 2);
    h->head->len += nl + vl + 4;
}

/* Append the decimal text of <v>. */
static bool append_uint(pdgw_buf_t *b, uint64_t v)
{
    char tmp[24];
    size_t n = 0;
    do
        tmp[sizeof(tmp) - ++n] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    return pdgw_buf_append(b, tmp + sizeof(tmp) - n, n) == PDGW_OK;
}

/* Status line and Date into <b> (formatted by hand: this runs for every answer). */
static bool status_line(pdgw_buf_t *b, pdgw_worker_t *w, int status)
{
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    const char *date = http_date(w);
    if (reason == NULL || reason[0] == '\0')
        reason = "Unknown";
    return pdgw_buf_append(b, "HTTP/1.1 ", 9) == PDGW_OK &&
           append_uint(b, (uint64_t)(status > 0 ? status : 500)) &&
           pdgw_buf_append(b, " ", 1) == PDGW_OK &&
           pdgw_buf_append(b, reason, strlen(reason)) == PDGW_OK &&
           pdgw_buf_append(b, "\r\nDate: ", 8) == PDGW_OK &&
           pdgw_buf_append(b, date, strlen(date)) == PDGW_OK &&
           pdgw_buf_append(b, "\r\n", 2) == PDGW_OK;
}

/* Status line and Date into fc->out; false without memory. */
static bool head_begin(pdgw_front_conn_t *fc, int status)
{
    pdgw_buf_reset(&fc->out);
    fc->out_off = 0;
    return status_line(&fc->out, fc->w, status);
}

/* Send what is left of the head and body. true = all of it is out; false = wait for the
 * socket (or it broke: fc->r->client_gone / fc->eof). */
static bool send_pending(pdgw_front_conn_t *fc)
{
    for (;;) {
        struct iovec iov[2];
        int n = 0;
        ssize_t sent;
        size_t head_left = fc->out.len - fc->out_off;
        if (head_left > 0)
            iov[n++] = (struct iovec){fc->out.data + fc->out_off, head_left};
        if (fc->body_left > 0)
            iov[n++] = (struct iovec){(void *)fc->body_ptr, fc->body_left};
        if (n == 0)
            return true;
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        sent = sendmsg(fc->fd, &msg, MSG_NOSIGNAL); /* no SIGPIPE inside a library user */
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fc->eof = true; /* broken: the request ends as a disconnect */
            return false;
        }
        if ((size_t)sent >= head_left) {
            fc->out_off = fc->out.len;
            sent -= (ssize_t)head_left;
            fc->body_ptr += sent;
            fc->body_left -= (size_t)sent;
        } else {
            fc->out_off += (size_t)sent;
        }
    }
}

static void after_response(pdgw_front_conn_t *fc);

/* Send what is left of the answer: the request ends once all of it is out; a full socket
 * waits for its EPOLLOUT edge, under the write deadline; a broken one closes. */
static void write_rest(pdgw_front_conn_t *fc)
{
    if (send_pending(fc)) {
        end_request(fc, true);
        after_response(fc);
    } else if (fc->eof) {
        conn_close(fc);
    } else {
        pdgw_conn_write_wait(fc->cx, WRITE_TIMEOUT_MS);
    }
}

/* Write r's filled reply. */
static void start_reply(pdgw_front_conn_t *fc)
{
    pdgw_req_t *r = fc->r;
    head_out_t ho = {{head_add}, &fc->out, true};
    int st = r->reply_status;
    bool bodiless = st == 204 || st == 304 || (st >= 100 && st < 200);
    bool head_only = strcmp(r->method, "HEAD") == 0;

    r->queued = true;
    if (pdgw_sink_reply_closes(r) || !fc->h.keep_alive)
        fc->close_after = true;
    ho.ok = head_begin(fc, st);
    pdgw_sink_reply_headers(r, &ho.out);
    if (!bodiless)
        ho.ok &= pdgw_buf_append(&fc->out, "Content-Length: ", 16) == PDGW_OK &&
                 append_uint(&fc->out, r->reply_body ? r->reply_len : 0) &&
                 pdgw_buf_append(&fc->out, "\r\n", 2) == PDGW_OK;
    if (fc->close_after)
        ho.ok &= pdgw_buf_append(&fc->out, "Connection: close\r\n", 19) == PDGW_OK;
    else if (fc->h.version_minor == 0)
        ho.ok &= pdgw_buf_append(&fc->out, "Connection: keep-alive\r\n", 24) == PDGW_OK;
    ho.ok &= pdgw_buf_append(&fc->out, "\r\n", 2) == PDGW_OK;
    if (!ho.ok) {
        pdgw_gateway_metrics_local_resource_error(fc->w->srv->opts.metrics, "memory");
        fc->eof = true;
        conn_close(fc);
        return;
    }
    fc->body_ptr = r->reply_body;
    fc->body_left = bodiless || head_only || r->reply_body == NULL ? 0 : r->reply_len;
    r->bytes_out = fc->body_left;
    fc->state = FC_WRITE;
    write_rest(fc);
}

/* Hand r's committed stream to the sink's direct writer, its head first. */
static void start_stream(pdgw_front_conn_t *fc)
{
    pdgw_req_t *r = fc->r;
    head_out_t ho = {{head_add}, &r->wire, true};
    int st;

    r->queued = true;
    r->stream_counted = true;
    /* An HTTP/1.0 body ends with the connection; HTTP/1.1 frames it in chunks. */
    r->direct_raw = fc->h.version_minor == 0;
    if (r->direct_raw || pdgw_sink_reply_closes(r) || !fc->h.keep_alive)
        fc->close_after = true;
    pdgw_buf_reset(&r->wire);
    r->wire_off = 0;
    st = pdgw_sink_stream_status(r);
    ho.ok = status_line(&r->wire, fc->w, st);
    pdgw_sink_stream_headers(r, &ho.out);
    if (!r->direct_raw)
        ho.ok &= pdgw_buf_append(&r->wire, "Transfer-Encoding: chunked\r\n", 28) == PDGW_OK;
    if (fc->close_after)
        ho.ok &= pdgw_buf_append(&r->wire, "Connection: close\r\n", 19) == PDGW_OK;
    ho.ok &= pdgw_buf_append(&r->wire, "\r\n", 2) == PDGW_OK;
    if (!ho.ok) {
        pdgw_gateway_metrics_local_resource_error(fc->w->srv->opts.metrics, "memory");
        conn_close(fc);
        return;
    }
    pdgw_gateway_metrics_client_stream(fc->w->srv->opts.metrics, "direct");
    r->direct = true;
    fc->state = FC_STREAM;
    pdgw_req_suspend(r);  /* the stream's deadlines are watched */
    pdgw_direct_queue(r); /* the head (and any bytes already written) leave this turn */
}

/* A stream's bytes are all out: its last chunk, then the request is over. */
static void finish_stream(pdgw_front_conn_t *fc)
{
    pdgw_req_t *r = fc->r;
    if (fc->state == FC_STREAM) {
        fc->state = FC_FINISH;
        r->direct = false;
        pdgw_buf_reset(&fc->out);
        fc->out_off = 0;
        if (!r->direct_raw && pdgw_buf_append(&fc->out, "0\r\n\r\n", 5) != PDGW_OK) {
            conn_close(fc);
            return;
        }
    }
    write_rest(fc);
}

/* ---------------------------------------------------------------- reading */

/* Refuse a head that cannot be parsed: an error reply, then close. */
static void refuse_head(pdgw_front_conn_t *fc, int status, const char *why)
{
    pdgw_api_error_t e;
    char *body;
    size_t len = 0;
    pdgw_api_error_set(&e, status == 431 ? PDGW_API_ERR_TOO_LARGE : PDGW_API_ERR_BAD_REQUEST, NULL,
                       "%s", why);
    pdgw_api_error_set_code(&e, status == 431   ? "request_header_too_large"
                                : status == 505 ? "http_version_not_supported"
                                : status == 501 ? "not_implemented"
                                                : "malformed_request");
    body = pdgw_api_error_body(&e, &len);
    pdgw_gateway_metrics_conn_closed(fc->w->srv->opts.metrics,
                                     status == 431 ? "head_too_large" : "malformed_request");
    pdgw_log_debug("http", "refusing a request head: %s", why);
    fc->close_after = true;
    fc->state = FC_WRITE;
    if (!head_begin(fc, status) ||
        pdgw_buf_appendf(&fc->out,
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n%.*s",
                         body ? len : 0, body ? (int)len : 0, body ? body : "") != PDGW_OK) {
        pdgw_free(body);
        conn_close(fc);
        return;
    }
    pdgw_free(body);
    fc->body_left = 0;
    write_rest(fc); /* then closes, after reading what the client still sends */
}

static size_t head_limit(const pdgw_worker_t *w)
{
    uint64_t b = w->srv->opts.client_buffer_size;
    return b < 2048 ? 2048 : b > (1u << 20) ? (1u << 20) : (size_t)b;
}

/* A complete head at the front of <data, len> (its length <n>): start its request. */
static void begin_request(pdgw_front_conn_t *fc, const char *data, size_t n)
{
    pdgw_http_origin_t o;
    const char *why = NULL;
    int st;
    if (n > fc->head_cap) {
        char *p = pdgw_realloc(fc->head, n);
        if (p == NULL) {
            conn_close(fc);
            return;
        }
        fc->head = p;
        fc->head_cap = n;
    }
    memcpy(fc->head, data, n);
    st = pdgw_front_head_parse(fc->head, n, &fc->h, &why);
    if (st != 0) {
        refuse_head(fc, st, why);
        return;
    }
    o = (pdgw_http_origin_t){
        .fc = fc,
        .cx = fc->cx,
        .fd = fc->fd,
        .addr = &fc->addr.sa,
        .url = fc->h.path,
        .method = fc->h.method,
        .http11 = fc->h.version_minor == 1,
    };
    fc->r = pdgw_http_begin(fc->w, &o);
    if (fc->r == NULL) {
        pdgw_gateway_metrics_local_resource_error(fc->w->srv->opts.metrics, "memory");
        conn_close(fc);
        return;
    }
    if (fc->r->reply_ready) {
        /* Refused before its body: answered (no 100 Continue), then closed if a body was on
         * its way (reply_close); a request without one keeps its connection. */
        fc->state = FC_WAIT;
        start_reply(fc);
        return;
    }
    pdgw_h1p_init_body(&fc->body, fc->h.chunked, fc->h.has_length ? fc->h.content_length : 0);
    fc->state = FC_BODY;
}

static int on_body(void *arg, const char *data, size_t len)
{
    pdgw_front_conn_t *fc = arg;
    return pdgw_http_body(fc->r, data, len) ? PDGW_H1_BODY_OK : PDGW_H1_BODY_ABORT;
}

static const pdgw_h1p_cb_t body_cb = {NULL, NULL, on_body};

/* The request is read: decide, and answer now if the answer is known. */
static void request_read(pdgw_front_conn_t *fc)
{
    pdgw_req_t *r = fc->r;
    fc->state = FC_WAIT;
    pdgw_http_body_done(r);
    if (fc->r != r)
        return;
    if (r->client_gone)
        pdgw_front_wake(fc);
    else if (r->reply_ready)
        start_reply(fc);
    else if (r->committed)
        start_stream(fc);
    else
        pdgw_req_suspend(r); /* the answer comes later: its deadlines are watched */
}

/* 100 Continue (RFC 9110 10.1.1) for a client that waits for it before its body. */
static void send_continue(pdgw_front_conn_t *fc)
{
    static const char line[] = "HTTP/1.1 100 Continue\r\n\r\n";
    (void)send(fc->fd, line, sizeof(line) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Consume what <data, len> holds for the current state; the bytes used. Stops when the
 * connection waits for something other than input (or closed: fc->fd < 0 is never seen,
 * the caller checks the table). */
static size_t consume(pdgw_front_conn_t *fc, const char *data, size_t len, bool *closed)
{
    size_t used = 0;
    int fd = fc->fd;
    pdgw_worker_t *w = fc->w;
    fc->consuming = true;
    while (used < len && w->front_conns[fd] == fc) {
        if (fc->state == FC_HEAD) {
            size_t n;
            /* Empty lines before a request line are ignored (RFC 9112 2.2). */
            while (used < len && (data[used] == '\r' || data[used] == '\n'))
                used++;
            if (used == len)
                break;
            n = pdgw_front_head_end(data + used, len - used, fc->head_scan);
            if (n == 0) {
                fc->head_scan = len - used;
                if (len - used > head_limit(w))
                    refuse_head(fc, 431, "request head too large");
                break;
            }
            fc->head_scan = 0;
            if (n > head_limit(w)) {
                refuse_head(fc, 431, "request head too large");
                break;
            }
            begin_request(fc, data + used, n);
            used += n;
            if (w->front_conns[fd] == fc && fc->state == FC_BODY && fc->h.expect_continue &&
                used == len && fc->body.state != PDGW_H1P_DONE)
                send_continue(fc);
        } else if (fc->state == FC_BODY) {
            long k = fc->body.state == PDGW_H1P_DONE
                         ? 0
                         : pdgw_h1p_feed(&fc->body, data + used, len - used, &body_cb, fc);
            if (k < 0) {
                /* A body that cannot be read to its end leaves no trustworthy next request. */
                pdgw_req_t *r = fc->r;
                r->reply_close = true;
                if (!r->reply_ready)
                    pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "malformed_body",
                                          "the request body is malformed (%s)",
                                          fc->body.err ? fc->body.err : "chunked framing");
                pdgw_conn_body_done(r->cx);
                fc->state = FC_WAIT;
                start_reply(fc);
                break;
            }
            used += (size_t)k;
            if (fc->body.state == PDGW_H1P_DONE)
                request_read(fc);
            else if (k == 0)
                break;
        } else if (fc->state == FC_LINGER) {
            used = len; /* dropped */
        } else {
            break; /* bytes behind a request wait until it is answered */
        }
    }
    *closed = w->front_conns[fd] != fc;
    if (!*closed)
        fc->consuming = false;
    return used;
}

/* A request with an empty body is complete as soon as its head is. */
static void settle(pdgw_front_conn_t *fc)
{
    if (fc->state == FC_BODY && fc->body.state == PDGW_H1P_DONE)
        request_read(fc);
}

/* Process what is buffered (after a read, or after a request ended). */
static void process(pdgw_front_conn_t *fc, const char *fresh, size_t fresh_len)
{
    int fd = fc->fd;
    pdgw_worker_t *w = fc->w;
    bool closed = false;
    size_t used;
    if (fc->in.len > 0 || fresh == NULL) {
        if (fresh != NULL && pdgw_buf_append(&fc->in, fresh, fresh_len) != PDGW_OK) {
            conn_close(fc);
            return;
        }
        used = consume(fc, fc->in.data, fc->in.len, &closed);
        if (closed)
            return;
        if (fc->state == FC_LINGER) {
            pdgw_buf_free(&fc->in); /* the rest is dropped */
            return;
        }
        if (used > 0) {
            memmove(fc->in.data, fc->in.data + used, fc->in.len - used);
            fc->in.len -= used;
        }
    } else {
        used = consume(fc, fresh, fresh_len, &closed);
        if (closed)
            return;
        if (used < fresh_len &&
            pdgw_buf_append(&fc->in, fresh + used, fresh_len - used) != PDGW_OK) {
            conn_close(fc);
            return;
        }
    }
    if (w->front_conns[fd] != fc)
        return;
    settle(fc);
    if (w->front_conns[fd] != fc)
        return;
    if (fc->in.len == 0)
        pdgw_buf_free(&fc->in); /* an idle connection keeps no buffer */
}

/* Read until the socket is empty (edge-triggered), processing as bytes come. */
static void read_some(pdgw_front_conn_t *fc)
{
    pdgw_worker_t *w = fc->w;
    int fd = fc->fd;
    for (;;) {
        ssize_t n;
        if (fc->state >= FC_WAIT && fc->in.len >= MAX_PIPELINED) {
            fc->read_held = true; /* read again once the request is answered */
            return;
        }
        n = recv(fd, w->front_scratch, READ_STEP, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fc->eof = true;
            break;
        }
        if (n == 0) {
            fc->eof = true;
            break;
        }
        process(fc, w->front_scratch, (size_t)n);
        if (w->front_conns[fd] != fc)
            return;
        if ((size_t)n < READ_STEP)
            break; /* a short read: the socket is most likely empty (no EAGAIN round trip) */
    }
    if (fc->eof) {
        /* The client is gone or finished sending: a request in progress ends as a
         * disconnect (as with libmicrohttpd); an idle connection just closes. */
        if (fc->r != NULL)
            pdgw_req_client_hup(fc->r);
        else
            conn_close(fc);
    }
}

/* The response is out: close, or go on with the next request. */
static void after_response(pdgw_front_conn_t *fc)
{
    pdgw_worker_t *w = fc->w;
    int fd = fc->fd;
    if (fc->close_after || fc->eof || (w->front_fd < 0 && atomic_load(&w->srv->draining))) {
        if (fc->eof || fc->cx == NULL || shutdown(fd, SHUT_WR) != 0) {
            conn_close(fc);
            return;
        }
        /* Half-closed: the client reads the whole answer and then its end; what it still
         * sends is read and dropped until it closes (or the linger deadline passes). */
        fc->state = FC_LINGER;
        fc->read_held = false;
        pdgw_conn_linger(fc->cx, LINGER_MS);
        if (!fc->consuming) { /* else consume() drops the rest, and process() the buffer */
            pdgw_buf_free(&fc->in);
            read_some(fc);
        }
        return;
    }
    fc->state = FC_HEAD;
    fc->close_after = false;
    if (fc->consuming)
        return; /* consume() goes on with the bytes behind this request */
    if (fc->in.len > 0)
        process(fc, NULL, 0);
    if (w->front_conns[fd] == fc && fc->read_held && fc->state == FC_HEAD) {
        fc->read_held = false;
        read_some(fc);
    }
}

/* ---------------------------------------------------------------- events */

static void accept_resume(pdgw_timer_t *t, uint64_t now_ms)
{
    pdgw_worker_t *w =
        (pdgw_worker_t *)(void *)((char *)t - offsetof(pdgw_worker_t, front_accept_timer));
    struct epoll_event ev;
    (void)now_ms;
    if (w->front_fd < 0)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = tag(PDGW_EV_FRONT_LISTEN, w->front_fd);
    (void)epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->front_fd, &ev);
}

/* Out of descriptors: the pending connection stays queued, and the listening socket would
 * report it again at once, every loop turn. Stop watching it for a moment instead. */
static void accept_pause(pdgw_worker_t *w)
{
    pdgw_gateway_metrics_conn_closed(w->srv->opts.metrics, "descriptor_limit");
    if (epoll_ctl(w->epfd, EPOLL_CTL_DEL, w->front_fd, NULL) != 0)
        return;
    pdgw_timer_init(&w->front_accept_timer, accept_resume);
    if (pdgw_timer_arm(&w->timers, &w->front_accept_timer, pdgw_now_ms() + ACCEPT_PAUSE_MS) !=
        PDGW_OK)
        accept_resume(&w->front_accept_timer, 0);
}

void pdgw_front_on_accept(pdgw_worker_t *w)
{
    int i;
    for (i = 0; i < ACCEPT_BURST && w->front_fd >= 0; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        struct epoll_event ev;
        pdgw_front_conn_t *fc;
        int one = 1;
        int fd = accept4(w->front_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE)
                accept_pause(w);
            return;
        }
        if (pdgw_conn_accept(w, (struct sockaddr *)&ss, len) != MHD_YES) {
            close(fd);
            continue;
        }
        fc = pdgw_calloc(1, sizeof(*fc));
        if (fc == NULL || !table_put(w, fd, fc)) {
            pdgw_free(fc);
            pdgw_conn_after_run(w); /* the address the policy reserved */
            close(fd);
            continue;
        }
        fc->w = w;
        fc->fd = fd;
        memcpy(&fc->addr, &ss, len < sizeof(fc->addr) ? len : sizeof(fc->addr));
        fc->cx = pdgw_conn_open(w, fd);
        pdgw_conn_after_run(w);
        /* Replies and events are small and must not wait behind Nagle. */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
        ev.data.u64 = tag(PDGW_EV_FRONT, fd);
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
            conn_close(fc);
    }
}

void pdgw_front_on_event(pdgw_worker_t *w, int fd, uint32_t events)
{
    pdgw_front_conn_t *fc = fd >= 0 && fd < w->front_cap ? w->front_conns[fd] : NULL;
    if (fc == NULL)
        return;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        read_some(fc);
        if (w->front_conns[fd] != fc)
            return;
    }
    if (events & EPOLLOUT) {
        if (fc->state == FC_WRITE) {
            write_rest(fc);
        } else if (fc->state == FC_STREAM && fc->r != NULL) {
            pdgw_direct_writable(fc->r);
        } else if (fc->state == FC_FINISH) {
            finish_stream(fc);
        }
    }
}

/* What the sink said while the loop turned: answers to write, streams that ended, clients
 * that left. */
void pdgw_front_run_ready(pdgw_worker_t *w)
{
    while (!pdb_dlist_empty(&w->front_ready)) {
        pdgw_front_conn_t *fc = PDB_DLIST_ENTRY(w->front_ready.head, pdgw_front_conn_t, ready_link);
        pdgw_req_t *r = fc->r;
        pdb_dlist_remove(&w->front_ready, &fc->ready_link);
        if (r == NULL)
            continue;
        if (r->client_gone) {
            conn_close(fc);
        } else if (fc->state == FC_WAIT) {
            if (r->reply_ready)
                start_reply(fc);
            else if (r->committed)
                start_stream(fc);
        } else if (fc->state == FC_STREAM && r->direct_ended) {
            finish_stream(fc);
        }
    }
}
