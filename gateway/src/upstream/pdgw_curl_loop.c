/*
 * pdgw_curl_loop.c - libcurl's multi handle on a worker's epoll loop (upstream_client: curl):
 * the sockets curl asks to watch, its timer, finished transfers handed to their legs.
 */
#include "pdgw_server_int.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "pdgw_alloc.h"

/* What the worker's epoll set holds for each upstream socket (w->curl_fds[fd]). A socket curl
 * stops watching (CURL_POLL_REMOVE: its transfer ended and the connection went back to
 * curl's cache) stays registered and is only marked idle: when the next transfer reuses the
 * connection it usually wants the same events again, so a kept-alive upstream connection
 * costs no epoll_ctl per request (instead of a DEL and an ADD). An idle socket that reports
 * an event (the engine closed it) is disarmed then; one curl closes leaves the set with its
 * descriptor (on_curl_close). */
enum { CFD_REG = 1, CFD_IN = 2, CFD_OUT = 4, CFD_IDLE = 8 };

static bool curl_fd_room(pdgw_worker_t *w, curl_socket_t s)
{
    size_t cap;
    uint8_t *n;
    if (s < 0)
        return false;
    if ((size_t)s < w->curl_fd_cap)
        return true;
    cap = w->curl_fd_cap ? w->curl_fd_cap : 1024;
    while (cap <= (size_t)s)
        cap *= 2;
    n = pdgw_realloc(w->curl_fds, cap);
    if (n == NULL)
        return false;
    memset(n + w->curl_fd_cap, 0, cap - w->curl_fd_cap);
    w->curl_fds = n;
    w->curl_fd_cap = cap;
    return true;
}

static int epoll_set(pdgw_worker_t *w, curl_socket_t s, uint32_t events, bool registered)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.u64 = pdgw_ev_tag(PDGW_EV_CURL, s);
    if (registered) {
        if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, s, &ev) == 0)
            return 0;
        if (errno != ENOENT)
            return -1;
        return epoll_ctl(w->epfd, EPOLL_CTL_ADD, s, &ev);
    }
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, s, &ev) == 0)
        return 0;
    if (errno != EEXIST)
        return -1;
    return epoll_ctl(w->epfd, EPOLL_CTL_MOD, s, &ev);
}

int pdgw_curl_loop_on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    pdgw_worker_t *w = userp;
    uint8_t want = CFD_REG, have;
    uint32_t events = 0;
    (void)easy;
    (void)socketp;
    if (!curl_fd_room(w, s)) {
        /* No memory for the table: plain registrations, a syscall each time. */
        if (what == CURL_POLL_REMOVE)
            (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, s, NULL);
        else
            (void)epoll_set(w, s,
                            (what == CURL_POLL_OUT ? 0u : (uint32_t)EPOLLIN) |
                                (what == CURL_POLL_IN ? 0u : (uint32_t)EPOLLOUT),
                            false);
        return 0;
    }
    have = w->curl_fds[s];
    if (what == CURL_POLL_REMOVE) {
        if (have & CFD_REG)
            w->curl_fds[s] = (uint8_t)(have | CFD_IDLE);
        return 0;
    }
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) {
        want |= CFD_IN;
        events |= EPOLLIN;
    }
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) {
        want |= CFD_OUT;
        events |= EPOLLOUT;
    }
    if ((have & ~CFD_IDLE) == want) {
        w->curl_fds[s] = want; /* registered for exactly this already */
        return 0;
    }
    w->curl_fds[s] = epoll_set(w, s, events, (have & CFD_REG) != 0) == 0 ? want : 0;
    return 0;
}

/* An event on a socket curl does not watch (idle in its cache): the engine closed it or sent
 * something unasked. Stop reporting it; curl finds out when it next picks the connection. */
bool pdgw_curl_loop_idle_event(pdgw_worker_t *w, int fd)
{
    if (fd < 0 || (size_t)fd >= w->curl_fd_cap || !(w->curl_fds[fd] & CFD_IDLE))
        return false;
    if ((w->curl_fds[fd] & (CFD_IN | CFD_OUT)) != 0)
        w->curl_fds[fd] = epoll_set(w, fd, EPOLLET, true) == 0 ? (uint8_t)(CFD_REG | CFD_IDLE) : 0;
    return true;
}

/* curl closes one of its sockets: the kernel drops it from the epoll set with the descriptor. */
static int on_curl_close(void *clientp, curl_socket_t s)
{
    pdgw_worker_t *w = clientp;
    if (s >= 0 && (size_t)s < w->curl_fd_cap)
        w->curl_fds[s] = 0;
    return close(s);
}

void pdgw_curl_loop_socket_opened(pdgw_worker_t *w, curl_socket_t s)
{
    /* A new socket is never in the set, whatever an earlier one with its number left. */
    if (s >= 0 && (size_t)s < w->curl_fd_cap)
        w->curl_fds[s] = 0;
}

void pdgw_curl_loop_prepare(pdgw_worker_t *w, CURL *easy)
{
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, on_curl_close);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, w);
}

int pdgw_curl_loop_on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    pdgw_worker_t *w = userp;
    (void)multi;
    w->curl_timer_ms = timeout_ms < 0 ? -1 : (int64_t)(pdgw_now_ms() + (uint64_t)timeout_ms);
    return 0;
}

void pdgw_curl_loop_done(pdgw_worker_t *w)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(w->multi, &left)) != NULL) {
        pdgw_leg_t *leg = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&leg);
        if (leg)
            pdgw_leg_on_done(leg, msg->data.result);
    }
}
