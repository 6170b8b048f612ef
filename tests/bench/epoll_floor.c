/*
 * epoll_floor.c - the least CPU an HTTP/1.1 front end of its own would spend on a request in
 * pdgw's mode, next to mhd-floor (libmicrohttpd in that mode). One edge-triggered epoll loop
 * per worker thread, each with its own SO_REUSEPORT listener; keep-alive requests with a
 * Content-Length body are read and answered with a fixed completion (no parsing beyond the
 * framing, no upstream, no metrics).
 *
 *   --mode direct  answer as soon as the request is read;
 *   --mode later   park the request and answer it on the next turn of the loop (woken by an
 *                  eventfd), as a gateway answers when its upstream does. The socket stays in
 *                  the epoll set the whole time: no per-request epoll_ctl, no read that can
 *                  only say EAGAIN.
 *
 * Usage: epoll-floor --port P [--workers N] [--mode direct|later]
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "floor_common.h"

#define IN_CAP     8192
#define TAG_LISTEN ((void *)1)
#define TAG_WAKE   ((void *)2)

typedef struct conn {
    int fd;
    char in[IN_CAP];
    size_t in_len;
    bool parked;     /* a request read, its answer due on the next turn */
    const char *out; /* what is left of the answer to send */
    size_t out_len;
    struct conn *next_due; /* the worker's list of parked requests */
} conn_t;

typedef struct worker {
    int epfd, wakefd, lfd;
    conn_t *due;
    char reply[512];
    size_t reply_len;
    time_t reply_sec;
    pthread_t thread;
} worker_t;

static bool g_later;

/* The whole answer with a Date header, written again once a second as servers do. */
static void reply_refresh(worker_t *w)
{
    time_t now = time(NULL);
    struct tm tm;
    char date[64];
    if (now == w->reply_sec)
        return;
    w->reply_sec = now;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    w->reply_len = (size_t)snprintf(w->reply, sizeof(w->reply),
                                    "HTTP/1.1 200 OK\r\nDate: %s\r\nContent-Type: "
                                    "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                    date, sizeof(FLOOR_REPLY) - 1, FLOOR_REPLY);
}

static void conn_close(worker_t *w, conn_t *c)
{
    (void)w;
    close(c->fd); /* closing takes it out of the epoll set */
    c->fd = -1;
    if (!c->parked)
        free(c);
    /* a parked one is freed when its turn comes (the due list still holds it) */
}

/* Send what is left of the answer; false when the connection broke. */
static bool conn_flush(conn_t *c)
{
    while (c->out_len > 0) {
        ssize_t n = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN; /* the rest goes on EPOLLOUT */
        c->out += n;
        c->out_len -= (size_t)n;
    }
    return true;
}

/* The length of the first complete request in the buffer, 0 when it is not all there, -1 when
 * it cannot be framed. */
static long request_len(const conn_t *c)
{
    const char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4), *p;
    long body = 0;
    if (end == NULL)
        return c->in_len >= IN_CAP ? -1 : 0;
    for (p = c->in; p < end; p++) {
        if ((p == c->in || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) {
            body = strtol(p + 15, NULL, 10);
            break;
        }
    }
    if (body < 0 || (size_t)(end + 4 - c->in) + (size_t)body > IN_CAP)
        return -1;
    return (size_t)(end + 4 - c->in) + (size_t)body <= c->in_len ? (end + 4 - c->in) + body : 0;
}

/* false when the connection broke (it is closed and freed then) */
static bool answer(worker_t *w, conn_t *c)
{
    reply_refresh(w);
    c->out = w->reply;
    c->out_len = w->reply_len;
    if (conn_flush(c))
        return true;
    conn_close(w, c);
    return false;
}

/* Read what arrived and answer (or park) each whole request, in order. */
static void conn_read(worker_t *w, conn_t *c)
{
    for (;;) {
        long n;
        while (!c->parked && c->out_len == 0 && (n = request_len(c)) != 0) {
            if (n < 0) {
                conn_close(w, c);
                return;
            }
            memmove(c->in, c->in + n, c->in_len - (size_t)n);
            c->in_len -= (size_t)n;
            if (!g_later) {
                if (!answer(w, c))
                    return;
                continue;
            }
            uint64_t one = 1;
            if (w->due == NULL && write(w->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
                perror("eventfd");
            c->parked = true;
            c->next_due = w->due;
            w->due = c;
        }
        if (c->in_len == IN_CAP)
            return; /* full while parked: the rest is read after the answer */
        ssize_t got = recv(c->fd, c->in + c->in_len, IN_CAP - c->in_len, 0);
        if (got > 0) {
            c->in_len += (size_t)got;
            continue;
        }
        if (got < 0 && errno == EAGAIN)
            return;
        conn_close(w, c);
        return;
    }
}

static void answer_due(worker_t *w)
{
    conn_t *c = w->due;
    w->due = NULL;
    while (c != NULL) {
        conn_t *next = c->next_due;
        c->parked = false;
        if (c->fd < 0)
            free(c);
        else if (answer(w, c))
            conn_read(w, c); /* the next request may be waiting in the buffer */
        c = next;
    }
}

static void accept_all(worker_t *w)
{
    for (;;) {
        int fd = accept4(w->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), one = 1;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET};
        conn_t *c;
        if (fd < 0)
            return;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        ev.data.ptr = c;
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
        }
    }
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    struct epoll_event evs[128];
    while (!floor_stop) {
        int n = epoll_wait(w->epfd, evs, 128, 1000);
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == TAG_LISTEN) {
                accept_all(w);
            } else if (tag == TAG_WAKE) {
                uint64_t v;
                if (read(w->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                    perror("eventfd");
            } else {
                conn_t *c = tag;
                if (c->fd < 0)
                    continue;
                if (c->out_len > 0 && !conn_flush(c)) {
                    conn_close(w, c);
                    continue;
                }
                conn_read(w, c);
            }
        }
        answer_due(w); /* the requests parked during this turn: their "upstream" answered */
    }
    return NULL;
}

static int worker_start(worker_t *w, uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    int one = 1;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    w->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->lfd < 0 || w->epfd < 0 || w->wakefd < 0 ||
        setsockopt(w->lfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
        setsockopt(w->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(w->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(w->lfd, 4096) != 0)
        return -1;
    ev.data.ptr = TAG_LISTEN;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->lfd, &ev) != 0)
        return -1;
    ev.events = EPOLLIN;
    ev.data.ptr = TAG_WAKE;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &ev) != 0)
        return -1;
    return pthread_create(&w->thread, NULL, worker_main, w) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    static worker_t workers[FLOOR_MAX_WORKERS];
    floor_args_t a;
    if (!floor_parse(argc, argv, "epoll-floor", "later", &a))
        return 2;
    g_later = a.later;
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < a.workers; i++) {
        if (worker_start(&workers[i], (uint16_t)a.port) != 0) {
            fprintf(stderr, "epoll-floor: cannot start worker %d on port %d\n", i, a.port);
            return 1;
        }
    }
    for (int i = 0; i < a.workers; i++)
        pthread_join(workers[i].thread, NULL);
    return 0;
}
