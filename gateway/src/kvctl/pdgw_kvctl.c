/*
 * pdgw_kvctl.c - the gateway's side of libkvt's control plane for the PD forwarders whose
 * decode runs libkvt (vllm-kvt, lmcache; pdgw-sim or any engine embedding libkvt).
 *
 * One service thread per forwarder that opened the service owns the checked ProxyNotif PULL
 * (pdgw_notif.c, pdgw_kvctl_notif.c) and, with the workers under client_lock, the gateway's KV
 * control client (forwarder.h pdgw_fwd_kv_*: one DEALER per receiver alloc port). It does
 * everything that may block or wait:
 *   - ReserveRequest{req_id, total_chunks, ttl_ms} to every alloc port (TP rank) of the
 *     chosen decode (sent by the request's worker when it can go at once, which also takes
 *     the answers (granted, free_chunks) off the socket; by this thread when it waits for a
 *     retry; pdgw_kvctl_reserve.c): this thread runs their deadlines,
 *   - CancelNotif{req_id} at the end of an attempt (release of the reservation / pinned pages),
 *   - ProxyNotif{req_id} counting (one per TP rank of the prefill), with per-request deadlines.
 *     A ProxyNotif counts only for a request in flight (registered before its prefill leg),
 *     only from that request's prefill addresses (zmq Peer-Address against the prefill's host
 *     and kv_host) and at most once per TP rank; anything else (unknown, wrong peer, late,
 *     surplus, malformed) is counted by reason and ignored, so a forged message never releases
 *     a decode early.
 * Requests talk to the thread through pdgw_fwd_kv_req_t objects (reference counted: the attempt
 * and the thread each hold one) and are woken through their pdgw waker. The weighted
 * admission semaphore (docs/protocols/lmcache.md) lives here too: ceil(prompt_tokens /
 * chunk_tokens) slots per request, granted strictly FIFO so a large request is never starved.
 */
#include "pdgw_kvctl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "pdgw_alloc.h"

/* Every open service, so the server stops them at shutdown (pdgw_kvctl_shutdown). */
static pthread_mutex_t g_svcs_lock = PTHREAD_MUTEX_INITIALIZER;
static pdgw_fwd_kv_svc_t *g_svcs;

void pdgw_kvctl_kick(pdgw_fwd_kv_svc_t *kv)
{
    uint64_t one = 1;
    if (write(kv->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: control thread kick: %s", kv->protocol,
                     strerror(errno));
}

void pdgw_kvctl_unlock(pdgw_fwd_kv_svc_t *kv)
{
    pdgw_fwd_kv_req_t *q = kv->wakes;
    kv->wakes = NULL;
    for (pdgw_fwd_kv_req_t *n = q; n != NULL; n = n->wake_next)
        n->wake_listed = 0;
    pthread_mutex_unlock(&kv->lock);
    while (q != NULL) {
        pdgw_fwd_kv_req_t *next = q->wake_next;
        pdgw_fwd_waker_wake(q->waker);
        pdgw_kvctl_req_unref(q);
        q = next;
    }
}

void pdgw_kvctl_req_unref(pdgw_fwd_kv_req_t *q)
{
    if (q == NULL || atomic_fetch_sub(&q->refs, 1) != 1)
        return;
    if (q->waker)
        pdgw_fwd_waker_unref(q->waker);
    pdgw_free(q);
}

int pdgw_kvctl_push_cancel_locked(pdgw_fwd_kv_svc_t *kv, const kvctl_dest_t *dest, const char *id,
                                  int urgent)
{
    kvctl_job_t *j = pdgw_calloc(1, sizeof(*j)), **pp;
    if (j == NULL)
        return 0;
    j->cancel = 1;
    j->dest = *dest;
    snprintf(j->id, sizeof(j->id), "%s", id);
    for (pp = &kv->jobs; !urgent && *pp != NULL; pp = &(*pp)->next)
        ;
    j->next = *pp;
    *pp = j;
    return 1;
}

static void run_cancel(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j)
{
    int i;
    pthread_mutex_lock(&kv->client_lock);
    for (i = 0; i < j->dest.nports; i++) {
        char why[128];
        if (pdgw_fwd_kv_cancel(kv->proxy, j->dest.host, j->dest.ports[i], j->id, why,
                               sizeof(why)) != PDGW_FWD_OK)
            pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: CancelNotif %s to %s:%d: %s", kv->protocol, j->id,
                         j->dest.host, j->dest.ports[i], why);
    }
    pthread_mutex_unlock(&kv->client_lock);
}

/* Take the first due job (lock held); *next_ms = earliest not-yet-due time. */
static kvctl_job_t *take_job_locked(pdgw_fwd_kv_svc_t *kv, int64_t now, int64_t *next_ms)
{
    kvctl_job_t **pp;
    for (pp = &kv->jobs; *pp != NULL; pp = &(*pp)->next) {
        kvctl_job_t *j = *pp;
        if (j->not_before_ms <= now || (j->q != NULL && j->q->ended)) {
            *pp = j->next;
            j->skip = j->q != NULL && j->q->ended;
            return j;
        }
        if (*next_ms < 0 || j->not_before_ms < *next_ms)
            *next_ms = j->not_before_ms;
    }
    return NULL;
}

/* The waiters are walked only when the earliest deadline armed may have come (the loop runs
 * once per batch of notices; a walk each time would cost O(requests in flight) per notice). */
static void check_deadlines_locked(pdgw_fwd_kv_svc_t *kv, int64_t now, int64_t *next_ms)
{
    pdgw_fwd_kv_req_t *q;
    int64_t earliest = -1;
    if (kv->next_deadline_ms >= 0 && now < kv->next_deadline_ms) {
        if (*next_ms < 0 || kv->next_deadline_ms < *next_ms)
            *next_ms = kv->next_deadline_ms;
    } else if (kv->next_deadline_ms >= 0) {
        for (q = kv->notif_waiters; q != NULL; q = q->notif_next) {
            if (!q->notif_waiting || q->notif_got >= q->notif_need || q->notif_timed_out)
                continue;
            if (now >= q->notif_deadline_ms) {
                q->notif_timed_out = 1;
                pdgw_kvctl_wake_locked(q);
            } else if (earliest < 0 || q->notif_deadline_ms < earliest) {
                earliest = q->notif_deadline_ms;
            }
        }
        kv->next_deadline_ms = earliest;
        if (earliest >= 0 && (*next_ms < 0 || earliest < *next_ms))
            *next_ms = earliest;
    }
    pdgw_kvctl_tombs_expire_locked(kv, now, KVCTL_TOMB_TTL_MS);
}

/* The descriptors the thread waits on: its kick, the notice listener and relay, and the
 * sockets reservations wait for answers on. */
#define KVCTL_POLL_FDS (4 + 64)

static void *kvctl_main(void *arg)
{
    pdgw_fwd_kv_svc_t *kv = arg;
    for (;;) {
        struct pollfd pf[KVCTL_POLL_FDS];
        int fds[KVCTL_POLL_FDS];
        int npf = 1, timeout = KVCTL_POLL_MS, stopping, idle;
        int64_t next = -1, now;
        kvctl_job_t *j;
        uint64_t v;

        pf[0].fd = kv->efd;
        pf[0].events = POLLIN;
        if (kv->notif) {
            size_t nf = pdgw_notif_fds(kv->notif, fds);
            for (size_t i = 0; i < nf; i++) {
                pf[npf].fd = fds[i];
                pf[npf++].events = POLLIN;
            }
        }
        if (kv->relay && (pf[npf].fd = pdgw_notif_relay_fd(kv->relay)) >= 0)
            pf[npf++].events = POLLIN;
        /* ZMQ_FD is edge-style: always drain before waiting */
        pdgw_kvctl_drain_notifs(kv);
        pdgw_kvctl_reserve_drain(kv);
        idle = pdgw_kvctl_reserve_idle(kv);
        pthread_mutex_lock(&kv->lock);
        stopping = kv->stop;
        if (stopping && kv->jobs == NULL && idle) {
            pthread_mutex_unlock(&kv->lock);
            break;
        }
        now = pdgw_fwd_now_ms();
        j = take_job_locked(kv, now, &next);
        check_deadlines_locked(kv, now, &next);
        pdgw_kvctl_unlock(kv);
        pdgw_kvctl_reserve_expire(kv, now, stopping, &next);
        if (j != NULL) {
            if (j->cancel || j->skip) { /* ended attempts never reserve */
                if (j->cancel)
                    run_cancel(kv, j);
                pdgw_kvctl_req_unref(j->q);
                pdgw_free(j);
            } else {
                (void)pdgw_kvctl_reserve_start(kv, j, NULL); /* owns it from here on */
            }
            continue;
        }
        pthread_mutex_lock(&kv->client_lock);
        /* Answers a worker watches wake that worker; the thread polls for the others. Listed
         * last: expiring ones closed their sockets. */
        if (kv->asking_unwatched > 0) {
            size_t nr = pdgw_kvctl_client_fds(kv->proxy, fds, (size_t)(KVCTL_POLL_FDS - npf));
            for (size_t i = 0; i < nr; i++) {
                pf[npf].fd = fds[i];
                pf[npf++].events = POLLIN;
            }
        }
        {
            /* read under the lock that guards ctl_wake_ms: a reservation started after this
             * and due sooner kicks the thread */
            int64_t res_next = pdgw_kvctl_reserve_next_locked(kv);
            if (res_next >= 0 && (next < 0 || res_next < next))
                next = res_next;
        }
        if (next >= 0 && next - now < timeout)
            timeout = next > now ? (int)(next - now) : 0;
        kv->ctl_wake_ms = now + timeout;
        pthread_mutex_unlock(&kv->client_lock);
        if (poll(pf, (nfds_t)npf, timeout) > 0 && (pf[0].revents & POLLIN))
            (void)!read(kv->efd, &v, sizeof(v));
    }
    return NULL;
}

/* ---------------------------------------------------------------- life */

void pdgw_kvctl_apply_all(const pdgw_fwd_kv_opts_t *o)
{
    pthread_mutex_lock(&g_svcs_lock);
    for (pdgw_fwd_kv_svc_t *kv = g_svcs; kv != NULL; kv = kv->next_svc) {
        pdgw_kvctl_apply(kv, o);
        pdgw_kvctl_kick(kv);
    }
    pthread_mutex_unlock(&g_svcs_lock);
}

void pdgw_kvctl_worker_ready(void)
{
    /* under the list's lock: a service closed meanwhile is no longer on it */
    pthread_mutex_lock(&g_svcs_lock);
    for (pdgw_fwd_kv_svc_t *kv = g_svcs; kv != NULL; kv = kv->next_svc)
        pdgw_kvctl_reserve_drain(kv);
    pthread_mutex_unlock(&g_svcs_lock);
}

bool pdgw_kvctl_any_open(void)
{
    bool any;
    pthread_mutex_lock(&g_svcs_lock);
    any = g_svcs != NULL;
    pthread_mutex_unlock(&g_svcs_lock);
    return any;
}

/* Stop the thread after its queued jobs (main thread; idempotent). */
static void svc_stop(pdgw_fwd_kv_svc_t *kv)
{
    pthread_mutex_lock(&kv->lock);
    kv->stop = 1;
    pthread_mutex_unlock(&kv->lock);
    pdgw_kvctl_kick(kv);
    if (kv->started)
        pthread_join(kv->th, NULL);
    kv->started = 0;
}

void pdgw_kvctl_shutdown(void)
{
    pthread_mutex_lock(&g_svcs_lock);
    for (pdgw_fwd_kv_svc_t *kv = g_svcs; kv != NULL; kv = kv->next_svc)
        svc_stop(kv);
    pthread_mutex_unlock(&g_svcs_lock);
}

pdgw_fwd_status_t pdgw_fwd_kv_svc_open(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                       pdgw_fwd_kv_svc_t **out, char *err, size_t errlen)
{
    pdgw_fwd_kv_svc_t *kv = pdgw_calloc(1, sizeof(*kv));
    if (kv == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    snprintf(kv->protocol, sizeof(kv->protocol), "%s", protocol);
    kv->o = *o;
    pthread_mutex_init(&kv->lock, NULL);
    pthread_mutex_init(&kv->client_lock, NULL);
    kv->next_deadline_ms = -1;
    kv->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (kv->efd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto err_lock;
    }
    /* ProxyNotifs go to the checked listener below, not the client's own. */
    if (pdgw_fwd_kv_client_create(&kv->proxy, err, errlen) != PDGW_FWD_OK)
        goto err_efd;
    if (o->proxy && pdgw_notif_create(protocol, o, &kv->notif, err, errlen) != PDGW_FWD_OK)
        goto err_proxy;
    if (o->proxy && o->notif_relay_peers[0] != '\0' &&
        pdgw_notif_relay_create(protocol, o, &kv->relay, err, errlen) != PDGW_FWD_OK)
        goto err_notif;
    if (pthread_create(&kv->th, NULL, kvctl_main, kv) != 0) {
        snprintf(err, errlen, "cannot start the KV control thread");
        goto err_notif;
    }
    kv->started = 1;
    if (o->proxy) {
        int wide = strcmp(o->proxy_host, "0.0.0.0") == 0 || strcmp(o->proxy_host, "::") == 0;
        pdgw_fwd_log(wide ? PDGW_FWD_LOG_WARN : PDGW_FWD_LOG_INFO,
                     "%s: ProxyNotif PULL bound on %s:%d%s%s", protocol, o->proxy_host,
                     pdgw_notif_port(kv->notif), o->curve_secret_key_file[0] ? " (CURVE)" : "",
                     wide ? " on every interface (proxy_host)" : "");
        if (kv->relay)
            pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: ProxyNotif relay on %s:%d, peers %s", protocol,
                         o->proxy_host, pdgw_notif_relay_port(kv->relay), o->notif_relay_peers);
    }
    pthread_mutex_lock(&g_svcs_lock);
    kv->next_svc = g_svcs;
    g_svcs = kv;
    pthread_mutex_unlock(&g_svcs_lock);
    *out = kv;
    return PDGW_FWD_OK;

err_notif:
    pdgw_notif_relay_destroy(kv->relay);
    pdgw_notif_destroy(kv->notif);
err_proxy:
    pdgw_fwd_kv_client_destroy(kv->proxy);
err_efd:
    close(kv->efd);
err_lock:
    pthread_mutex_destroy(&kv->client_lock);
    pthread_mutex_destroy(&kv->lock);
    pdgw_free(kv);
    return PDGW_FWD_ERR_CONFIG;
}

void pdgw_fwd_kv_svc_close(pdgw_fwd_kv_svc_t *kv)
{
    if (kv == NULL)
        return;
    pthread_mutex_lock(&g_svcs_lock);
    for (pdgw_fwd_kv_svc_t **pp = &g_svcs; *pp != NULL; pp = &(*pp)->next_svc) {
        if (*pp == kv) {
            *pp = kv->next_svc;
            break;
        }
    }
    pthread_mutex_unlock(&g_svcs_lock);
    svc_stop(kv);
    while (kv->jobs) { /* queued after the thread stopped: nobody sends them any more */
        kvctl_job_t *j = kv->jobs;
        kv->jobs = j->next;
        pdgw_kvctl_req_unref(j->q);
        pdgw_free(j);
    }
    pdgw_kvctl_tombs_expire_locked(kv, INT64_MAX, -1); /* all of them */
    pdgw_notif_relay_destroy(kv->relay);
    pdgw_notif_destroy(kv->notif);
    pdgw_fwd_kv_client_destroy(kv->proxy);
    close(kv->efd);
    pthread_mutex_destroy(&kv->client_lock);
    pthread_mutex_destroy(&kv->lock);
    pdgw_free(kv);
}

int pdgw_fwd_kv_svc_notif_port(const pdgw_fwd_kv_svc_t *kv)
{
    return kv && kv->notif ? pdgw_notif_port(kv->notif) : 0;
}
