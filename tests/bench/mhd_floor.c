/*
 * mhd_floor.c - the least CPU a gateway on libmicrohttpd can spend on a request, run the way
 * pdgw runs it: one daemon per worker thread in MHD_USE_EPOLL (pdgw's own epoll loop around
 * MHD's), TURBO, suspend and resume. It reads a POST body and answers a fixed completion: no
 * parsing, no upstream, no metrics. mhd_floor.sh compares its CPU per request with nginx
 * proxying the same requests.
 *
 *   --mode direct   answer from the access handler at once (no suspend);
 *   --mode suspend  suspend at the end of the body and resume from the worker's loop on the
 *                   next turn, as pdgw does when an upstream answer arrives.
 *
 * Usage: mhd-floor --port P [--workers N] [--mode direct|suspend]
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <microhttpd.h>

#include "floor_common.h"

#define MAX_PENDING 4096
#define EV_MHD      1
#define EV_WAKE     2

typedef struct worker {
    struct MHD_Daemon *mhd;
    int epfd, wakefd;
    struct MHD_Connection *pending[MAX_PENDING];
    size_t n_pending;
    pthread_t thread;
} worker_t;

typedef struct request {
    bool resumed;
} request_t;

static bool g_suspend;
static struct MHD_Response *g_reply;

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *data,
                              size_t *size, void **state)
{
    worker_t *w = cls;
    request_t *r = *state;
    (void)url, (void)method, (void)version, (void)data;
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL)
            return MHD_NO;
        *state = r;
        return MHD_YES;
    }
    if (*size != 0) {
        *size = 0; /* the body is read and dropped */
        return MHD_YES;
    }
    if (g_suspend && !r->resumed && w->n_pending < MAX_PENDING) {
        r->resumed = true;
        w->pending[w->n_pending++] = c;
        MHD_suspend_connection(c);
        uint64_t one = 1;
        if (write(w->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            return MHD_NO;
        return MHD_YES;
    }
    return MHD_queue_response(c, 200, g_reply);
}

static void completed(void *cls, struct MHD_Connection *c, void **state,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    free(*state);
    *state = NULL;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    struct epoll_event evs[64];
    while (!floor_stop) {
        /* MHD's timeout is 0 while it has work left from the last run (resumed connections,
         * a reply not all sent): block only when it has none, as pdgw's loop does. */
        MHD_UNSIGNED_LONG_LONG to = 1000;
        if (MHD_get_timeout(w->mhd, &to) != MHD_YES || to > 1000)
            to = 1000;
        int n = epoll_wait(w->epfd, evs, 64, (int)to);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == EV_WAKE) {
                uint64_t v;
                if (read(w->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                    perror("eventfd");
                for (size_t k = 0; k < w->n_pending; k++)
                    MHD_resume_connection(w->pending[k]);
                w->n_pending = 0;
            }
        }
        MHD_run(w->mhd);
    }
    return NULL;
}

static int worker_start(worker_t *w, uint16_t port)
{
    const union MHD_DaemonInfo *info;
    struct epoll_event ev = {.events = EPOLLIN};
    w->mhd = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO | MHD_USE_ERROR_LOG, port, NULL,
        NULL, answer, w, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)10000, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)4096, MHD_OPTION_END);
    info = w->mhd ? MHD_get_daemon_info(w->mhd, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (info == NULL || w->epfd < 0 || w->wakefd < 0)
        return -1;
    ev.data.u32 = EV_MHD;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, info->epoll_fd, &ev) != 0)
        return -1;
    ev.data.u32 = EV_WAKE;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &ev) != 0)
        return -1;
    return pthread_create(&w->thread, NULL, worker_main, w) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    static worker_t workers[FLOOR_MAX_WORKERS];
    floor_args_t a;
    if (!floor_parse(argc, argv, "mhd-floor", "suspend", &a))
        return 2;
    g_suspend = a.later;
    g_reply = MHD_create_response_from_buffer(sizeof(FLOOR_REPLY) - 1, (void *)FLOOR_REPLY,
                                              MHD_RESPMEM_PERSISTENT);
    if (g_reply == NULL ||
        MHD_add_response_header(g_reply, "Content-Type", "application/json") != MHD_YES)
        return 1;
    for (int i = 0; i < a.workers; i++) {
        if (worker_start(&workers[i], (uint16_t)a.port) != 0) {
            fprintf(stderr, "mhd-floor: cannot start worker %d on port %d\n", i, a.port);
            return 1;
        }
    }
    for (int i = 0; i < a.workers; i++)
        pthread_join(workers[i].thread, NULL);
    for (int i = 0; i < a.workers; i++)
        MHD_stop_daemon(workers[i].mhd);
    MHD_destroy_response(g_reply);
    return 0;
}
