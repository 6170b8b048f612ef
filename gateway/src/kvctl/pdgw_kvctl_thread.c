/*
 * pdgw_kvctl_thread.c - the KV control service's thread: it takes the notices and answers
 * that arrived, runs the timers that came due, sends the jobs queued for it, and sleeps until
 * its earliest timer or a kick (a job queued, a deadline sooner than its sleep, a reservation
 * it must poll for). With nothing armed it sleeps without a timeout: there is no period on
 * which it wakes to look.
 */
#include "pdgw_kvctl.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "pdgw_alloc.h"

/* The descriptors the thread waits on: its kick, the notice listener and relay, and the
 * sockets reservations nobody else watches wait for answers on. */
#define KVCTL_POLL_FDS (4 + 64)

static void run_cancel(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j)
{
    pthread_mutex_lock(&kv->client_lock);
    for (int i = 0; i < j->dest.nports; i++) {
        char why[128];
        if (pdgw_fwd_kv_cancel(kv->proxy, j->dest.host, j->dest.ports[i], j->id, why,
                               sizeof(why)) != PDGW_FWD_OK)
            pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: CancelNotif %s to %s:%d: %s", kv->protocol, j->id,
                         j->dest.host, j->dest.ports[i], why);
    }
    pthread_mutex_unlock(&kv->client_lock);
}

/* The first queued job (lock held), NULL when none is. */
static kvctl_job_t *job_take_locked(pdgw_fwd_kv_svc_t *kv)
{
    kvctl_job_t *j = kv->jobs;
    if (j == NULL)
        return NULL;
    kv->jobs = j->next;
    if (kv->jobs == NULL)
        kv->jobs_tail = NULL;
    j->skip = j->q != NULL && j->q->ended; /* ended attempts never reserve */
    return j;
}

static void job_run(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j)
{
    if (j->cancel || j->skip) {
        if (j->cancel)
            run_cancel(kv, j);
        pdgw_kvctl_req_unref(j->q);
        pdgw_free(j);
        return;
    }
    (void)pdgw_kvctl_reserve_start(kv, j, NULL); /* owns it from here on */
}

/* The listener's and the relay's descriptors into <pf> from <n>; the new count. */
static int notif_fds(pdgw_fwd_kv_svc_t *kv, struct pollfd *pf, int n)
{
    int fds[2];
    if (kv->notif) {
        size_t nf = pdgw_notif_fds(kv->notif, fds);
        for (size_t i = 0; i < nf; i++) {
            pf[n].fd = fds[i];
            pf[n++].events = POLLIN;
        }
    }
    if (kv->relay && (pf[n].fd = pdgw_notif_relay_fd(kv->relay)) >= 0)
        pf[n++].events = POLLIN;
    return n;
}

/* The client's descriptors, when a reservation nobody watches waits on them (client_lock
 * held). Listed after the reservations' timers ran: expiring ones closed their sockets. */
static int client_fds_locked(pdgw_fwd_kv_svc_t *kv, struct pollfd *pf, int n)
{
    int fds[KVCTL_POLL_FDS];
    if (kv->asking_unwatched <= 0)
        return n;
    size_t nr = pdgw_kvctl_client_fds(kv->proxy, fds, (size_t)(KVCTL_POLL_FDS - n));
    for (size_t i = 0; i < nr; i++) {
        pf[n].fd = fds[i];
        pf[n++].events = POLLIN;
    }
    return n;
}

static int64_t earliest(int64_t a, int64_t b)
{
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

void *pdgw_kvctl_thread_main(void *arg)
{
    pdgw_fwd_kv_svc_t *kv = arg;
    for (;;) {
        struct pollfd pf[KVCTL_POLL_FDS];
        int npf = 1, timeout, stopping, idle;
        int64_t next, res_next, now;
        kvctl_job_t *j;
        uint64_t v;

        pf[0].fd = kv->efd;
        pf[0].events = POLLIN;
        npf = notif_fds(kv, pf, npf);
        /* ZMQ_FD is edge-style: always drain before waiting */
        pdgw_kvctl_drain_notifs(kv);
        pdgw_kvctl_reserve_drain(kv);
        idle = pdgw_kvctl_reserve_idle(kv);
        now = pdgw_kvctl_now_ms(kv);
        pthread_mutex_lock(&kv->lock);
        kv->turns++;
        kv->turn_ms = now;
        (void)pdb_timers_run(&kv->timers, (uint64_t)now); /* deadlines, retries, tombstones */
        stopping = kv->stop;
        if (stopping && kv->jobs == NULL && kv->n_delayed == 0 && idle) {
            pthread_mutex_unlock(&kv->lock);
            break;
        }
        j = job_take_locked(kv);
        next = pdb_timers_next(&kv->timers);
        /* Read under the lock arming takes: a timer armed after this and due sooner kicks. */
        kv->sleep_until = next >= 0 ? next : KVCTL_NEVER;
        pdgw_kvctl_unlock(kv); /* wakes the waits that timed out */
        res_next = pdgw_kvctl_reserve_expire(kv, now, stopping);
        if (j != NULL) {
            job_run(kv, j);
            continue;
        }
        pthread_mutex_lock(&kv->client_lock);
        npf = client_fds_locked(kv, pf, npf);
        pthread_mutex_unlock(&kv->client_lock);
        next = earliest(next, res_next);
        timeout = next < 0                 ? -1
                  : next <= now            ? 0
                  : next - now > INT32_MAX ? INT32_MAX
                                           : (int)(next - now);
        if (poll(pf, (nfds_t)npf, timeout) > 0 && (pf[0].revents & POLLIN))
            (void)!read(kv->efd, &v, sizeof(v));
    }
    return NULL;
}
