/*
 * pdgw_server.c - server life cycle and the per-worker epoll loop.
 *
 * One loop per worker serves three kinds of file descriptors: the libmicrohttpd daemon's
 * own epoll fd (client side), the sockets libcurl asks for through CURLMOPT_SOCKETFUNCTION
 * (upstream side), and an eventfd for wake-ups from other threads. Suspended client
 * connections are watched for hang-up (EPOLLRDHUP) so a client that leaves while its
 * request waits upstream is noticed at once.
 */
#include "pdgw_server_int.h"

#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>

#include "pdgw_alloc.h"
#include "pdgw_fwd_setup.h"
#include "pdgw_kvctl.h"
#include "pdgw_log.h"

#include "pdgw_tls.h"

/* A suspension that lasts this long gets a hang-up watch on the client socket: short waits
 * cost no epoll_ctl at all. */
#define HUP_WATCH_AFTER_MS 50
#define MAX_EVENTS         128
/* Idle upstream connections of the native client close after this: below the engines' 5 s
 * keep-alive timeout (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default "5" in vllm/envs.py, given to
 * uvicorn in vllm/entrypoints/openai/api_server.py; SGLang: timeout_keep_alive=5 in
 * python/sglang/srt/entrypoints/http_server.py), so pdgw usually closes first and seldom picks
 * a connection the engine is closing (that race costs one silent retry). */
#define PDGW_H1_IDLE_TIMEOUT_MS 4000
/* Request objects kept for reuse per worker. */
#define REQ_POOL_MAX 1024

void pdgw_server_opts_init(pdgw_server_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->listen_host = "127.0.0.1";
    o->listen_port = 8000;
    o->workers = 1;
    o->protocol = "neutral";
    o->mode = PDGW_MODE_BATCH;
    o->max_body_bytes = 16u << 20;
    o->client_buffer_size = 5u << 10;
    o->request_timeout_ms = 600000;
    o->max_buffered_body_bytes = 256u << 20;
    o->connect_timeout_ms = 3000;
    o->first_byte_timeout_ms = 300000;
    o->idle_timeout_ms = 60000;
    o->retries = 1;
    o->client_header_timeout_ms = 30000;
    o->upstream_client = PDGW_UPSTREAM_NATIVE;
    o->stream_output = PDGW_STREAM_OUT_DIRECT;
    o->frontend = PDGW_FRONTEND_AUTO;
    o->max_connections = 0;
    o->max_connections_per_client = 1024;
    /* tokenize before routing (pdgw_route.h): a quarter second, 4096 prompts remembered */
    o->route.tokenize_timeout_ms = 250;
    o->route.tokenize_cache_entries = 4096;
}

/* libmicrohttpd's messages are per-connection events (client went away, malformed
 * request): debug level. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    (void)cls;
    if (!pdgw_log_enabled(PDGW_LOG_LEVEL_DEBUG))
        return;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    pdgw_log_write(PDGW_LOG_LEVEL_DEBUG, "http", "%s", msg);
}

static uint64_t tag(int kind, int fd)
{
    return pdgw_ev_tag(kind, fd);
}

/* ---------------------------------------------------------------- request objects */

pdgw_req_t *pdgw_req_alloc(pdgw_worker_t *w)
{
    return pdgw_freelist_get(&w->req_pool);
}

void pdgw_req_release(pdgw_req_t *r)
{
    pdgw_direct_forget(r);
    pdgw_req_live_release(r); /* the forwarder context it started with */
    pdgw_freelist_put(&r->w->req_pool, r);
}

/* ---------------------------------------------------------------- request deadlines */

static uint64_t req_next_due(const pdgw_req_t *r)
{
    /* Only requests whose job runs are timed: r->wf and r->job are set. */
    uint64_t due = r->wf != NULL ? r->job->next_deadline(r->wf) : UINT64_MAX;
    if (r->suspended && !r->hup_watched && r->suspended_at_ms + HUP_WATCH_AFTER_MS < due)
        due = r->suspended_at_ms + HUP_WATCH_AFTER_MS;
    return due;
}

static void req_on_timer(pdgw_timer_t *t, uint64_t now)
{
    pdgw_req_t *r = (pdgw_req_t *)(void *)((char *)t - offsetof(pdgw_req_t, timer));
    uint64_t due;
    if (r->job->may_free) {
        /* Its deadline's check may free the request (a KV release's owner). */
        r->job->check_deadlines(r->wf, now);
        return;
    }
    if (r->suspended && !r->hup_watched && now >= r->suspended_at_ms + HUP_WATCH_AFTER_MS)
        pdgw_worker_hup_watch(r->w, r);
    r->job->check_deadlines(r->wf, now); /* may end the job (and leave in_active) */
    if (!r->in_active)
        return;
    due = req_next_due(r);
    if (due != UINT64_MAX)
        /* A watch that could not be added is tried again a little later, not at once. */
        (void)pdgw_timer_arm(&r->w->timers, &r->timer, due > now ? due : now + HUP_WATCH_AFTER_MS);
}

void pdgw_req_timer_update(pdgw_req_t *r)
{
    uint64_t due;
    if (!r->in_active)
        return;
    due = req_next_due(r);
    if (due != UINT64_MAX)
        (void)pdgw_timer_arm_earlier(&r->w->timers, &r->timer, due);
}

pdgw_req_t *pdgw_worker_find_active(pdgw_worker_t *w, bool (*pred)(const pdgw_req_t *r))
{
    size_t i;
    for (i = 0; i < w->timers.n; i++) {
        pdgw_timer_t *t = w->timers.v[i].t;
        pdgw_req_t *r;
        if (t->fn != req_on_timer)
            continue;
        r = (pdgw_req_t *)(void *)((char *)t - offsetof(pdgw_req_t, timer));
        if (pred(r))
            return r;
    }
    return NULL;
}

void pdgw_worker_active_add(pdgw_worker_t *w, pdgw_req_t *r)
{
    (void)w;
    if (r->in_active)
        return;
    r->in_active = true;
    pdgw_timer_init(&r->timer, req_on_timer);
    pdgw_req_timer_update(r);
}

void pdgw_worker_active_remove(pdgw_worker_t *w, pdgw_req_t *r)
{
    if (!r->in_active)
        return;
    pdgw_timer_cancel(&w->timers, &r->timer);
    r->in_active = false;
}

/* ---------------------------------------------------------------- hang-up watches */

bool pdgw_worker_client_watch(pdgw_worker_t *w, pdgw_req_t *r, bool writable)
{
    struct epoll_event ev;
    if (r->fd < 0)
        return false;
    if (r->fd >= w->hup_cap) {
        int cap = w->hup_cap ? w->hup_cap : 1024;
        pdgw_req_t **n;
        while (cap <= r->fd)
            cap *= 2;
        n = pdgw_realloc(w->hup_reqs, (size_t)cap * sizeof(*n));
        if (n == NULL)
            return false; /* disconnects are then seen when the stream resumes */
        memset(n + w->hup_cap, 0, (size_t)(cap - w->hup_cap) * sizeof(*n));
        w->hup_reqs = n;
        w->hup_cap = cap;
    }
    memset(&ev, 0, sizeof(ev));
    /* Writable: edge-triggered, so a socket with room reports once, when room comes back. */
    ev.events = writable ? EPOLLRDHUP | EPOLLOUT | EPOLLET : EPOLLRDHUP;
    ev.data.u64 = tag(PDGW_EV_HUP, r->fd);
    if (epoll_ctl(w->epfd, r->hup_watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, r->fd, &ev) != 0)
        return false;
    w->hup_reqs[r->fd] = r;
    r->hup_watched = true;
    return true;
}

void pdgw_worker_hup_watch(pdgw_worker_t *w, pdgw_req_t *r)
{
    if (!r->hup_watched)
        (void)pdgw_worker_client_watch(w, r, false);
}

void pdgw_worker_hup_unwatch(pdgw_worker_t *w, pdgw_req_t *r)
{
    if (!r->hup_watched)
        return;
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, r->fd, NULL);
    if (r->fd < w->hup_cap && w->hup_reqs[r->fd] == r)
        w->hup_reqs[r->fd] = NULL;
    r->hup_watched = false;
}

/* ---------------------------------------------------------------- the loop */

static int worker_timeout(pdgw_worker_t *w)
{
    /* The time read after this turn's events serves: what ran since took microseconds, and
     * deadlines are in milliseconds. */
    uint64_t now = w->now_ms != 0 ? w->now_ms : (w->now_ms = pdgw_time_mono_ms());
    int64_t t = 1000;
    MHD_UNSIGNED_LONG_LONG mhd_to;
    if (w->curl_timer_ms >= 0) {
        int64_t d = w->curl_timer_ms - (int64_t)now;
        if (d < t)
            t = d;
    }
    {
        int64_t d = pdgw_timers_next(&w->timers);
        if (d >= 0 && d - (int64_t)now < t)
            t = d - (int64_t)now;
    }
    if (w->mhd_kick || w->wake_local || !pdb_dlist_empty(&w->flush_queue) ||
        !pdb_dlist_empty(&w->front_ready) || (w->h1 != NULL && pdgw_h1_has_posted(w->h1)))
        t = 0;
    if (w->mhd != NULL && MHD_get_timeout(w->mhd, &mhd_to) == MHD_YES && (int64_t)mhd_to < t)
        t = (int64_t)mhd_to;
    return t < 0 ? 0 : (int)t;
}

static void *worker_main(void *arg)
{
    pdgw_worker_t *w = arg;
    struct epoll_event evs[MAX_EVENTS];

    pdgw_this_worker = w;
    pdgw_loop_clock = &w->now_ms;

    while (!atomic_load(&w->stop)) {
        int n = epoll_wait(w->epfd, evs, MAX_EVENTS, worker_timeout(w));
        w->now_ms = pdgw_time_mono_ms();
        bool run_mhd = false;
        int running;
        uint64_t now;
        int i;

        if (n < 0 && errno != EINTR) {
            pdgw_log_error("worker", "epoll_wait: %s", strerror(errno));
            break;
        }
        for (i = 0; i < n; i++) {
            int kind = (int)((evs[i].data.u64 >> 32) & 0xffu);
            int fd = (int)(uint32_t)evs[i].data.u64;
            switch (kind) {
            case PDGW_EV_MHD:
                run_mhd = true;
                break;
            case PDGW_EV_WAKE: {
                uint64_t v;
                if (read(w->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                    pdgw_log_warn("worker", "eventfd read: %s", strerror(errno));
                pdgw_waker_run_queue(w);
                break;
            }
            case PDGW_EV_CURL: {
                int flags = 0;
                if (pdgw_curl_loop_idle_event(w, fd))
                    break;
                if (evs[i].events & EPOLLIN)
                    flags |= CURL_CSELECT_IN;
                if (evs[i].events & EPOLLOUT)
                    flags |= CURL_CSELECT_OUT;
                if (evs[i].events & (EPOLLERR | EPOLLHUP))
                    flags |= CURL_CSELECT_ERR;
                curl_multi_socket_action(w->multi, fd, flags, &running);
                pdgw_curl_loop_done(w);
                break;
            }
            case PDGW_EV_H1:
                pdgw_h1_on_event(w->h1, evs[i].data.u64, evs[i].events);
                break;
            case PDGW_EV_FRONT:
                pdgw_front_on_event(w, fd, evs[i].events);
                break;
            case PDGW_EV_FRONT_LISTEN:
                pdgw_front_on_accept(w);
                break;
            case PDGW_EV_KVCTL:
                pdgw_kvctl_svcs_worker_ready(w->srv->kv_svcs);
                break;
            case PDGW_EV_HUP:
                if (fd < w->hup_cap && w->hup_reqs[fd] != NULL) {
                    pdgw_req_t *r = w->hup_reqs[fd];
                    if (r->direct && !(evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
                        pdgw_direct_writable(r);
                        break;
                    }
                    pdgw_worker_hup_unwatch(w, r);
                    pdgw_req_client_hup(r);
                    run_mhd = true;
                }
                break;
            default:
                break;
            }
        }
        if (w->wake_local) { /* wakers queued by this turn's events */
            w->wake_local = false;
            pdgw_waker_run_queue(w);
        }
        now = w->now_ms = pdgw_time_mono_ms(); /* the events may have taken a while */
        if (w->curl_timer_ms >= 0 && (int64_t)now >= w->curl_timer_ms) {
            w->curl_timer_ms = -1;
            curl_multi_socket_action(w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
            pdgw_curl_loop_done(w);
        }
        /* Deadlines: connection timers shut sockets and set mhd_kick. */
        (void)pdgw_timers_run(&w->timers, now);
        if (w->h1 != NULL)
            pdgw_h1_run_posted(w->h1); /* native legs: resumes, failures found at start */
        /* Streams the sink writes itself: what this turn relayed leaves in one send each. */
        pdgw_direct_flush_all(w);
        /* Native connections the sink woke: replies written, streams started or ended (an
         * ended stream wakes its connection again from the flush). */
        while (!pdb_dlist_empty(&w->front_ready)) {
            pdgw_front_run_ready(w);
            pdgw_direct_flush_all(w);
        }
        if (atomic_load(&w->srv->draining) && !w->quiesced) {
            if (w->mhd != NULL) {
                MHD_socket s = MHD_quiesce_daemon(w->mhd);
                if (s != MHD_INVALID_SOCKET)
                    close(s);
            }
            pdgw_front_quiesce(w);
            w->quiesced = true;
        }
        if (w->mhd == NULL)
            continue;
        /* MHD has its own epoll set (edge-triggered inside); running it when its fd is
         * ready or its timeout says so is enough. */
        {
            MHD_UNSIGNED_LONG_LONG to;
            if (!run_mhd && MHD_get_timeout(w->mhd, &to) == MHD_YES && to == 0)
                run_mhd = true;
        }
        if (run_mhd || n == 0 || w->mhd_kick) {
            /* One MHD_run per iteration: with many suspended streams each run walks them
             * all, so resumes are batched per iteration. Resumes made during this run keep
             * mhd_kick set and make the next epoll_wait return at once. */
            w->mhd_kick = false;
            MHD_run(w->mhd);
            pdgw_conn_after_run(w);
            pdgw_direct_flush_all(w); /* streams taken over during this run */
        }
    }
    return NULL;
}

/* libmicrohttpd's memory per connection (its pool): held by every open connection, streams
 * included, so it is most of what a parked stream costs. */
static size_t client_buffer(const pdgw_server_t *srv)
{
    uint64_t b = srv->opts.client_buffer_size;
    if (b < 2048)
        b = 2048; /* room for a request line and a few headers */
    if (b > (1u << 20))
        b = 1u << 20;
    return (size_t)b;
}

/* ---------------------------------------------------------------- create / destroy */

static void worker_close(pdgw_worker_t *w)
{
    if (w->mhd) {
        MHD_stop_daemon(w->mhd);
        w->mhd = NULL;
    }
    pdgw_front_close_all(w);
    pdgw_free(w->front_scratch);
    w->front_scratch = NULL;
    pdgw_phases_worker_stop(w);    /* what runs on the worker still needs the multi handle */
    pdgw_h1_client_destroy(w->h1); /* every leg has ended: only idle connections are left */
    w->h1 = NULL;
    while (w->n_easy_pool > 0)
        curl_easy_cleanup(w->easy_pool[--w->n_easy_pool]);
    if (w->multi) {
        curl_multi_cleanup(w->multi);
        w->multi = NULL;
    }
    /* Wakes that arrived after the loop stopped still hold a queue reference. */
    pdgw_waker_drop_queue(w);
    while (atomic_load(&w->wake_writers) > 0)
        sched_yield(); /* a wake queued before the detach is still writing the eventfd */
    if (w->wakefd >= 0)
        close(w->wakefd);
    if (w->epfd >= 0)
        close(w->epfd);
    w->wakefd = w->epfd = -1;
    pdgw_free(w->hup_reqs);
    w->hup_reqs = NULL;
    pdgw_free(w->curl_fds);
    w->curl_fds = NULL;
    w->curl_fd_cap = 0;
    /* Every guard and request was freed when the daemon closed its connections. */
    pdgw_timers_free(&w->timers);
    pdgw_freelist_drain(&w->req_pool);
    pdgw_freelist_drain(&w->wf_pool);
    pthread_mutex_destroy(&w->wake_lock);
}

/* libmicrohttpd leaves the path and the query's arguments as they came: the request path
 * decodes them itself (pdgw_path.c, pdgw_req_query_each), alike for both front ends. */
static size_t mhd_keep_escapes(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    return strlen(s);
}

/* frontend: mhd. A libmicrohttpd daemon on its own epoll set, which the worker's set watches. */
static pdgw_status_t mhd_open(pdgw_server_t *srv, pdgw_worker_t *w, const struct sockaddr *addr,
                              char *err, size_t errlen)
{
    struct epoll_event ev;
    const union MHD_DaemonInfo *info;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO;
    unsigned index = w->index;
    if (addr->sa_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    flags |= pdgw_tls_mhd_flags(srv->opts.tls);
    /* The connection limit is enforced (and counted) by the accept policy; MHD's own limit
     * sits above it so that it never refuses first. Its idle timeout stays for connections
     * between deadlines (a reader that stops reading a response). */
    w->mhd = MHD_start_daemon(
        flags, 0, pdgw_conn_accept, w, pdgw_http_access, w, MHD_OPTION_SOCK_ADDR, addr,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
        NULL, MHD_OPTION_NOTIFY_COMPLETED, pdgw_http_completed, w, MHD_OPTION_NOTIFY_CONNECTION,
        pdgw_conn_notify, w, MHD_OPTION_UNESCAPE_CALLBACK, mhd_keep_escapes, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_CONNECTION_LIMIT,
        srv->conn_limit + 16u, MHD_OPTION_LISTEN_BACKLOG_SIZE,
        /* client_buffer_size per connection: request headers, upload chunks and the
         * write buffer of a stream MHD writes itself. Small pools keep 10,000 open
         * streams in a few hundred MiB. */
        (unsigned)4096, MHD_OPTION_CONNECTION_MEMORY_LIMIT, client_buffer(srv), MHD_OPTION_ARRAY,
        pdgw_tls_mhd_options(srv->opts.tls), MHD_OPTION_END);
    if (w->mhd == NULL) {
        snprintf(err, errlen, "cannot listen on port %d (worker %u): address in use or invalid",
                 ntohs(((const struct sockaddr_in *)addr)->sin_port), index);
        return PDGW_ERR_SYSTEM;
    }
    info = MHD_get_daemon_info(w->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    w->mhd_epfd = info ? info->epoll_fd : -1;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = tag(PDGW_EV_MHD, w->mhd_epfd);
    if (w->mhd_epfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->mhd_epfd, &ev) != 0) {
        snprintf(err, errlen, "worker %u: cannot watch the HTTP daemon", index);
        return PDGW_ERR_SYSTEM;
    }
    return PDGW_OK;
}

static pdgw_status_t worker_open(pdgw_server_t *srv, pdgw_worker_t *w, unsigned index,
                                 const struct sockaddr *addr, char *err, size_t errlen)
{
    struct epoll_event ev;

    memset(w, 0, sizeof(*w));
    w->srv = srv;
    w->index = index;
    w->epfd = -1;
    w->wakefd = -1;
    w->front_fd = -1;
    w->curl_timer_ms = -1;
    pdgw_timers_init(&w->timers);
    pdgw_freelist_init(&w->req_pool, sizeof(pdgw_req_t), REQ_POOL_MAX);
    pthread_mutex_init(&w->wake_lock, NULL);
    atomic_init(&w->wake_writers, 0);

    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->epfd < 0 || w->wakefd < 0) {
        snprintf(err, errlen, "worker %u: epoll/eventfd: %s", index, strerror(errno));
        goto err_close;
    }
    if (srv->opts.frontend == PDGW_FRONTEND_NATIVE) {
        if (pdgw_front_listen(w, addr, err, errlen) != PDGW_OK)
            goto err_close;
    } else if (mhd_open(srv, w, addr, err, errlen) != PDGW_OK) {
        goto err_close;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = tag(PDGW_EV_WAKE, w->wakefd);
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &ev) != 0) {
        snprintf(err, errlen, "worker %u: epoll_ctl: %s", index, strerror(errno));
        goto err_close;
    }
    w->multi = curl_multi_init();
    if (w->multi == NULL) {
        snprintf(err, errlen, "worker %u: curl_multi_init failed", index);
        goto err_close;
    }
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETFUNCTION, pdgw_curl_loop_on_socket);
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETDATA, w);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERFUNCTION, pdgw_curl_loop_on_timer);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERDATA, w);
    /* Keep idle upstream connections for reuse (one cache per worker). */
    curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS,
                      srv->conn_limit_per_worker < 1024u ? (long)srv->conn_limit_per_worker
                                                         : 1024L);
    curl_multi_setopt(w->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    if (srv->opts.upstream_client == PDGW_UPSTREAM_NATIVE) {
        pdgw_h1_client_opts_t ho = {
            .epfd = w->epfd,
            .timers = &w->timers,
            .ev_kind = PDGW_EV_H1,
            .connect_timeout_ms = srv->opts.connect_timeout_ms,
            .idle_timeout_ms = PDGW_H1_IDLE_TIMEOUT_MS,
            /* As many kept connections as curl's cache holds. */
            .max_idle = srv->conn_limit_per_worker < 1024u ? srv->conn_limit_per_worker : 1024u,
        };
        if (pdgw_h1_client_create(&ho, &w->h1) != PDGW_OK) {
            snprintf(err, errlen, "worker %u: out of memory", index);
            goto err_close;
        }
    }
    return PDGW_OK;

err_close:
    worker_close(w);
    return PDGW_ERR_SYSTEM;
}

static pdgw_status_t resolve_listen(const char *host, int port, struct sockaddr_storage *ss,
                                    char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portbuf[16];
    int rc;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    rc = getaddrinfo(host && host[0] ? host : NULL, portbuf, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errlen, "listen: cannot resolve '%s': %s", host ? host : "",
                 gai_strerror(rc));
        return PDGW_ERR_INVALID;
    }
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return PDGW_OK;
}

/* The descriptor budget: the soft RLIMIT_NOFILE is raised to the hard one (as nginx's
 * worker_rlimit_nofile or Go's runtime do), then client connections get their share. */
static void conn_budget(pdgw_server_t *srv)
{
    struct rlimit rl;
    uint64_t nofile = 1024;
    unsigned workers = srv->opts.workers;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            struct rlimit want = rl;
            want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
            if (want.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &want) == 0)
                rl.rlim_cur = want.rlim_cur;
        }
        nofile = rl.rlim_cur == RLIM_INFINITY ? (uint64_t)1 << 20 : (uint64_t)rl.rlim_cur;
    }
    if (workers == 0)
        workers = 1;
    if (srv->opts.max_connections > 0)
        srv->conn_limit = srv->opts.max_connections;
    else /* one leg at a time needs 2 descriptors per connection, prefill beside decode 3 */
        srv->conn_limit = pdgw_conn_limit_derive(
            nofile, workers, srv->plan.dispatch == PDGW_DISPATCH_SINGLE ? 2u : 3u);
    srv->conn_limit_per_worker = (srv->conn_limit + workers - 1) / workers;
    pdgw_log_info("server",
                  "client connections: up to %u in all workers (%s, RLIMIT_NOFILE %llu), %u per "
                  "client address, request headers within %llu ms",
                  srv->conn_limit, srv->opts.max_connections > 0 ? "configured" : "derived",
                  (unsigned long long)nofile, srv->opts.max_connections_per_client,
                  (unsigned long long)srv->opts.client_header_timeout_ms);
}

static void set_port(struct sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
}

pdgw_status_t pdgw_server_create(const pdgw_server_opts_t *opts, pdgw_server_t **out, char *err,
                                 size_t errlen)
{
    pdgw_server_t *srv;
    struct sockaddr_storage ss;
    pdgw_status_t status;
    unsigned i;

    if (opts->pool == NULL || opts->metrics == NULL || opts->workers == 0) {
        snprintf(err, errlen, "server: pool, metrics and workers >= 1 are required");
        return PDGW_ERR_INVALID;
    }
    if (opts->frontend == PDGW_FRONTEND_NATIVE && opts->tls != NULL) {
        snprintf(err, errlen, "the native front end serves plain HTTP; TLS needs frontend: mhd");
        return PDGW_ERR_INVALID;
    }
    srv = pdgw_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    srv->opts = *opts;
    /* auto: pdgw's own server for plain HTTP; TLS sessions are libmicrohttpd's. */
    if (srv->opts.frontend == PDGW_FRONTEND_AUTO)
        srv->opts.frontend = srv->opts.tls != NULL ? PDGW_FRONTEND_MHD : PDGW_FRONTEND_NATIVE;
    pdgw_fwd_api_set_services(opts->metrics, opts->pool);
    atomic_init(&srv->draining, false);
    atomic_init(&srv->inflight, 0);

    /* The forwarder: descriptor, configure, plan; the KV control services it opens are kept
     * here. */
    srv->kv_svcs = pdgw_kvctl_svcs_create();
    if (srv->kv_svcs == NULL) {
        snprintf(err, errlen, "out of memory");
        status = PDGW_ERR_NOMEM;
        goto err_free;
    }
    {
        pdgw_fwd_setup_t fs;
        status = pdgw_fwd_setup(opts->protocol, opts->mode, opts->protocol_options, opts->workers,
                                false, srv->kv_svcs, &fs, err, errlen);
        if (status != PDGW_OK)
            goto err_free;
        srv->desc = fs.desc;
        srv->fwd_ctx = fs.ctx;
        srv->plan = fs.plan;
        pdgw_proto_metrics_init(&srv->proto_metrics, opts->metrics, srv->desc->name);
    }
    {
        pdgw_fwd_setup_t fs = {.desc = srv->desc, .ctx = srv->fwd_ctx, .plan = srv->plan};
        status = pdgw_fwd_check_client_pd_fields(&fs, opts->client_pd_fields, err, errlen);
        if (status != PDGW_OK)
            goto err_ctx;
    }
    if (pdgw_server_live_init(srv) != PDGW_OK) {
        snprintf(err, errlen, "out of memory");
        status = PDGW_ERR_NOMEM;
        goto err_ctx;
    }
    if (srv->plan.dispatch == PDGW_DISPATCH_SINGLE && !srv->plan.single_needs_prefill)
        srv->ready_roles = SCHED_ROLE_DECODE;
    else
        srv->ready_roles = SCHED_ROLE_BOTH;

    /* Workers: the first binds (maybe an ephemeral port), the others join its port. */
    status = resolve_listen(opts->listen_host, opts->listen_port, &ss, err, errlen);
    if (status != PDGW_OK)
        goto err_ctx;
    conn_budget(srv);
    srv->addrs = pdgw_addr_table_create();
    if (srv->addrs == NULL) {
        snprintf(err, errlen, "out of memory");
        status = PDGW_ERR_NOMEM;
        goto err_ctx;
    }
    /* What the rooms above keep per server (tokenize cache, selective PD: pdgw_route.h). */
    status = pdgw_phases_server_start(srv, err, errlen);
    if (status != PDGW_OK)
        goto err_ctx;
    srv->phases_started = true;
    srv->workers = pdgw_calloc(opts->workers, sizeof(*srv->workers));
    if (srv->workers == NULL) {
        snprintf(err, errlen, "out of memory");
        status = PDGW_ERR_NOMEM;
        goto err_ctx;
    }
    for (i = 0; i < opts->workers; i++) {
        status = worker_open(srv, &srv->workers[i], i, (struct sockaddr *)&ss, err, errlen);
        if (status != PDGW_OK)
            goto err_workers;
        srv->n_workers = i + 1;
        if (i == 0) {
            const union MHD_DaemonInfo *di =
                srv->workers[0].mhd != NULL
                    ? MHD_get_daemon_info(srv->workers[0].mhd, MHD_DAEMON_INFO_BIND_PORT)
                    : NULL;
            int native = pdgw_front_port(&srv->workers[0]);
            srv->port = di ? di->port : native > 0 ? native : opts->listen_port;
            set_port(&ss, srv->port);
        }
    }
    *out = srv;
    return PDGW_OK;

err_workers:
    for (i = 0; i < srv->n_workers; i++)
        worker_close(&srv->workers[i]);
    pdgw_free(srv->workers);
err_ctx:
    pdgw_addr_table_destroy(srv->addrs);
    if (srv->phases_started)
        pdgw_phases_server_stop(srv);
    if (srv->fwd_gen != NULL)
        pdgw_server_live_fini(srv); /* destroys the context */
    else if (srv->desc->ops->destroy && srv->fwd_ctx)
        srv->desc->ops->destroy(srv->fwd_ctx);
err_free:
    pdgw_kvctl_svcs_destroy(srv->kv_svcs);
    pdgw_fwd_api_set_services(NULL, NULL);
    pdgw_free(srv);
    return status;
}

pdgw_status_t pdgw_server_start(pdgw_server_t *srv)
{
    unsigned i;
    for (i = 0; i < srv->n_workers; i++) {
        if (pthread_create(&srv->workers[i].thread, NULL, worker_main, &srv->workers[i]) != 0) {
            pdgw_log_error("server", "cannot start worker %u: %s", i, strerror(errno));
            return PDGW_ERR_SYSTEM;
        }
        srv->workers[i].thread_started = true;
    }
    srv->started = true;
    pdgw_log_info("server", "listening on %s%s:%d with %u worker(s)%s, protocol %s (%s, %s)",
                  srv->opts.tls ? "https://" : "",
                  srv->opts.listen_host && srv->opts.listen_host[0] ? srv->opts.listen_host : "*",
                  srv->port, srv->n_workers,
                  srv->opts.frontend == PDGW_FRONTEND_NATIVE ? " on the native front end" : "",
                  srv->desc->name, srv->opts.mode == PDGW_MODE_BATCH ? "batch" : "staged",
                  srv->plan.dispatch == PDGW_DISPATCH_SINGLE   ? "single-stage"
                  : srv->plan.dispatch == PDGW_DISPATCH_SERIAL ? "two-stage serial"
                                                               : "two-stage parallel");
    if (srv->plan.dispatch == PDGW_DISPATCH_SINGLE &&
        (srv->opts.route.pd_min_prompt_tokens > 0 || srv->opts.route.pd_skip_cached_percent > 0 ||
         srv->opts.route.pd_skip_predicted))
        pdgw_log_warn("server",
                      "selective PD (pd_min_prompt_tokens, pd_skip_cached_percent, "
                      "pd_skip_predicted) has no effect: protocol %s sends one leg per request",
                      srv->desc->name);
    return PDGW_OK;
}

int pdgw_server_port(const pdgw_server_t *srv)
{
    return srv->port;
}

static void worker_kick(pdgw_worker_t *w)
{
    uint64_t one = 1;
    if (write(w->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        pdgw_log_warn("worker", "eventfd write: %s", strerror(errno));
}

void pdgw_server_drain(pdgw_server_t *srv)
{
    unsigned i;
    if (atomic_exchange(&srv->draining, true))
        return;
    for (i = 0; i < srv->n_workers; i++)
        worker_kick(&srv->workers[i]);
}

uint64_t pdgw_server_inflight(const pdgw_server_t *srv)
{
    return atomic_load(&((pdgw_server_t *)srv)->inflight);
}

bool pdgw_server_wait_idle(pdgw_server_t *srv, uint64_t timeout_ms)
{
    uint64_t end = pdgw_now_ms() + timeout_ms;
    while (atomic_load(&srv->inflight) > 0) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        if (pdgw_now_ms() >= end)
            return false;
        nanosleep(&ts, NULL);
    }
    return true;
}

void pdgw_server_destroy(pdgw_server_t *srv)
{
    unsigned i;
    if (srv == NULL)
        return;
    for (i = 0; i < srv->n_workers; i++) {
        atomic_store(&srv->workers[i].stop, true);
        worker_kick(&srv->workers[i]);
    }
    for (i = 0; i < srv->n_workers; i++) {
        if (srv->workers[i].thread_started)
            pthread_join(srv->workers[i].thread, NULL);
    }
    /* Closing a daemon completes (and so cancels) every connection it still holds, on
     * this thread; the worker threads are gone, so nothing races. */
    for (i = 0; i < srv->n_workers; i++)
        worker_close(&srv->workers[i]);
    pdgw_free(srv->workers);
    pdgw_addr_table_destroy(srv->addrs);
    pdgw_phases_server_stop(srv);
    /* Every attempt has ended: the KV control services send their last CancelNotifs and stop
     * before the forwarder closes them. */
    pdgw_kvctl_svcs_stop(srv->kv_svcs);
    pdgw_server_live_fini(srv);            /* the forwarder's current context */
    pdgw_kvctl_svcs_destroy(srv->kv_svcs); /* after the forwarder closed its services */
    pdgw_fwd_api_set_services(NULL, NULL); /* metrics and pool may go away after the server */
    pdgw_free(srv);
}
