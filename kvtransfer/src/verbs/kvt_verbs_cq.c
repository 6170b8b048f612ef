/*
 * The completion thread: one per transport instance, sleeping on the device's
 * completion channel (and an eventfd that stops it), draining the shared CQ in
 * batches and handing every work completion to the transport. Posting threads
 * never poll.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvt_verbs_dev.h"

#define CQ_POLL_BATCH 32

/* Poll until the CQ is empty; false on a CQ error. */
static bool drain(kvt_verbs_cq_thread_t *t)
{
    struct ibv_wc wc[CQ_POLL_BATCH];
    int n;

    do {
        n = ibv_poll_cq(t->dev->cq, CQ_POLL_BATCH, wc);
        if (n < 0) {
            kvt_verbs_log("ibv_poll_cq(%s) failed", t->dev->name);
            return false;
        }
        for (int i = 0; i < n; i++)
            t->on_wc(t->arg, &wc[i]);
    } while (n == CQ_POLL_BATCH);
    return true;
}

static void *cq_main(void *arg)
{
    kvt_verbs_cq_thread_t *t = arg;
    struct pollfd pfd[3];

    pfd[0].fd = t->dev->channel->fd;
    pfd[0].events = POLLIN;
    pfd[1].fd = t->stop_fd;
    pfd[1].events = POLLIN;
    pfd[2].fd = t->kick_fd;
    pfd[2].events = POLLIN;
    for (;;) {
        struct ibv_cq *cq;
        void *ctx;
        int rc;

        /* Completions may have arrived before the notification was armed. */
        if (!drain(t))
            break;
        rc = poll(pfd, 3, 1000);
        if (rc < 0 && errno != EINTR) {
            kvt_verbs_log("completion thread poll failed: %s", strerror(errno));
            break;
        }
        if (pfd[1].revents != 0)
            break;
        if (rc > 0 && pfd[2].revents != 0) {
            uint64_t v;

            if (read(t->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                kvt_verbs_log("completion thread: kick read failed: %s", strerror(errno));
            t->on_kick(t->arg);
        }
        if (rc <= 0 || (pfd[0].revents & POLLIN) == 0)
            continue;
        if (ibv_get_cq_event(t->dev->channel, &cq, &ctx) != 0)
            continue; /* non-blocking channel: nothing pending */
        ibv_ack_cq_events(cq, 1);
        rc = ibv_req_notify_cq(cq, 0);
        if (rc != 0) {
            kvt_verbs_log("ibv_req_notify_cq(%s) failed: %s", t->dev->name, strerror(rc));
            break;
        }
    }
    /* Last pass so nothing that completed or was handed over before the stop is
     * lost. */
    (void)drain(t);
    t->on_kick(t->arg);
    return NULL;
}

kvt_status_t kvt_verbs_cq_start(kvt_verbs_cq_thread_t *t, kvt_verbs_dev_t *dev,
                                kvt_verbs_on_wc_cb on_wc, void (*on_kick)(void *arg), void *arg)
{
    int flags, rc;

    memset(t, 0, sizeof(*t));
    t->dev = dev;
    t->on_wc = on_wc;
    t->on_kick = on_kick;
    t->arg = arg;
    t->stop_fd = t->kick_fd = -1;
    flags = fcntl(dev->channel->fd, F_GETFL);
    if (flags < 0 || fcntl(dev->channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        kvt_verbs_log("completion channel of %s: fcntl failed: %s", dev->name, strerror(errno));
        return KVT_ERR_IO;
    }
    t->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    t->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->stop_fd < 0 || t->kick_fd < 0) {
        kvt_verbs_log("eventfd failed: %s", strerror(errno));
        goto err_fds;
    }
    rc = pthread_create(&t->thread, NULL, cq_main, t);
    if (rc != 0) {
        kvt_verbs_log("cannot start the completion thread: %s", strerror(rc));
        goto err_fds;
    }
    t->running = true;
    return KVT_OK;

err_fds:
    if (t->stop_fd >= 0)
        close(t->stop_fd);
    if (t->kick_fd >= 0)
        close(t->kick_fd);
    t->stop_fd = t->kick_fd = -1;
    return KVT_ERR_IO;
}

void kvt_verbs_cq_kick(kvt_verbs_cq_thread_t *t)
{
    uint64_t one = 1;

    if (t->running && write(t->kick_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        kvt_verbs_log("cannot wake the completion thread: %s", strerror(errno));
}

void kvt_verbs_cq_stop(kvt_verbs_cq_thread_t *t)
{
    uint64_t one = 1;

    if (!t->running)
        return;
    if (write(t->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        kvt_verbs_log("cannot wake the completion thread: %s", strerror(errno));
    pthread_join(t->thread, NULL);
    close(t->stop_fd);
    close(t->kick_fd);
    t->stop_fd = t->kick_fd = -1;
    t->running = false;
}
