/*
 * pdgw_kvctl.c - the gateway's side of libkvt's control plane for the PD forwarders whose
 * decode runs libkvt (vllm-kvt, lmcache; pdgw-sim or any engine embedding libkvt): the
 * service's life (open, stop, close), its job queue and the wakes it hands to requests.
 *
 * One service thread per forwarder that opened the service (pdgw_kvctl_thread.c) owns the
 * checked ProxyNotif PULL (pdgw_notif.c, pdgw_kvctl_notif.c) and, with the workers under
 * client_lock, the gateway's KV control client (forwarder.h pdgw_fwd_kv_*: one DEALER per
 * receiver alloc port). It does everything that may block or wait:
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
 * Every deadline is a timer on the service's heaps (pdgw_kvctl_timers.c). Requests talk to
 * the thread through pdgw_fwd_kv_req_t objects (reference counted: the attempt and the thread
 * each hold one) and are woken through their pdgw waker. The weighted admission semaphore
 * (docs/protocols/lmcache.md) lives in pdgw_kvctl_req.c. The server that configured the
 * forwarder keeps the service in its set (pdgw_kvctl_svcs.c); there is no list of all
 * services.
 */
#include "pdgw_kvctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "pdgw_alloc.h"

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

void pdgw_kvctl_job_queue_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int urgent)
{
    if (urgent || kv->jobs == NULL) {
        j->next = kv->jobs;
        kv->jobs = j;
        if (kv->jobs_tail == NULL)
            kv->jobs_tail = j;
        return;
    }
    j->next = NULL;
    kv->jobs_tail->next = j;
    kv->jobs_tail = j;
}

int pdgw_kvctl_push_cancel_locked(pdgw_fwd_kv_svc_t *kv, const kvctl_dest_t *dest, const char *id,
                                  int urgent)
{
    kvctl_job_t *j = pdgw_calloc(1, sizeof(*j));
    if (j == NULL)
        return 0;
    j->cancel = 1;
    j->dest = *dest;
    snprintf(j->id, sizeof(j->id), "%s", id);
    pdgw_kvctl_job_queue_locked(kv, j, urgent);
    return 1;
}

/* ---------------------------------------------------------------- life */

void pdgw_kvctl_stop(pdgw_fwd_kv_svc_t *kv)
{
    pthread_mutex_lock(&kv->lock);
    kv->stop = 1;
    pthread_mutex_unlock(&kv->lock);
    pdgw_kvctl_kick(kv);
    if (kv->started)
        pthread_join(kv->th, NULL);
    kv->started = 0;
}

static void log_listener(const pdgw_fwd_kv_svc_t *kv, const pdgw_fwd_kv_opts_t *o)
{
    int wide = strcmp(o->proxy_host, "0.0.0.0") == 0 || strcmp(o->proxy_host, "::") == 0;
    pdgw_fwd_log(wide ? PDGW_FWD_LOG_WARN : PDGW_FWD_LOG_INFO,
                 "%s: ProxyNotif PULL bound on %s:%d%s%s", kv->protocol, o->proxy_host,
                 pdgw_notif_port(kv->notif), o->curve_secret_key_file[0] ? " (CURVE)" : "",
                 wide ? " on every interface (proxy_host)" : "");
    if (kv->relay)
        pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: ProxyNotif relay on %s:%d, peers %s", kv->protocol,
                     o->proxy_host, pdgw_notif_relay_port(kv->relay), o->notif_relay_peers);
}

pdgw_fwd_status_t pdgw_kvctl_open(const pdgw_fwd_env_t *env, const pdgw_fwd_kv_opts_t *o,
                                  const pdb_clock_t *clock, pdgw_fwd_kv_svc_t **out, char *err,
                                  size_t errlen)
{
    const char *protocol = env->protocol ? env->protocol : "";
    pdgw_fwd_kv_svc_t *kv = pdgw_calloc(1, sizeof(*kv));
    if (kv == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    snprintf(kv->protocol, sizeof(kv->protocol), "%s", protocol);
    kv->o = *o;
    if (clock != NULL)
        kv->clock = *clock;
    pthread_mutex_init(&kv->lock, NULL);
    pthread_mutex_init(&kv->client_lock, NULL);
    pdb_timers_init(&kv->timers);
    pdb_timers_init(&kv->res_timers);
    pdgw_kvctl_tomb_timer_update_locked(kv); /* not armed: no tombstone yet */
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
    if (pthread_create(&kv->th, NULL, pdgw_kvctl_thread_main, kv) != 0) {
        snprintf(err, errlen, "cannot start the KV control thread");
        goto err_notif;
    }
    kv->started = 1;
    if (o->proxy)
        log_listener(kv, o);
    if (env->kv_svcs != NULL)
        pdgw_kvctl_svcs_add(env->kv_svcs, kv);
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
    pdb_timers_free(&kv->res_timers);
    pdb_timers_free(&kv->timers);
    pthread_mutex_destroy(&kv->client_lock);
    pthread_mutex_destroy(&kv->lock);
    pdgw_free(kv);
    return PDGW_FWD_ERR_CONFIG;
}

pdgw_fwd_status_t pdgw_fwd_kv_svc_open_env(const pdgw_fwd_env_t *env, const pdgw_fwd_kv_opts_t *o,
                                           pdgw_fwd_kv_svc_t **out, char *err, size_t errlen)
{
    return pdgw_kvctl_open(env, o, NULL, out, err, errlen);
}

pdgw_fwd_status_t pdgw_fwd_kv_svc_open(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                       pdgw_fwd_kv_svc_t **out, char *err, size_t errlen)
{
    pdgw_fwd_env_t env = {.protocol = protocol};
    return pdgw_kvctl_open(&env, o, NULL, out, err, errlen);
}

/* Free a job nobody sends any more, with the reference it holds. */
static void job_drop(kvctl_job_t *j)
{
    pdgw_kvctl_req_unref(j->q);
    pdgw_free(j);
}

void pdgw_fwd_kv_svc_close(pdgw_fwd_kv_svc_t *kv)
{
    if (kv == NULL)
        return;
    pdgw_kvctl_svcs_remove(kv); /* first: its owner's events no longer reach it */
    pdgw_kvctl_stop(kv);
    while (kv->jobs) { /* queued after the thread stopped: nobody sends them any more */
        kvctl_job_t *j = kv->jobs;
        kv->jobs = j->next;
        job_drop(j);
    }
    /* The stopped thread left no delayed job (it waits for them) and the attempts that ended
     * cancelled their waits: timers still armed are those of attempts a forwarder never
     * ended, which keep their objects; the heaps are freed without touching them. */
    pdgw_kvctl_tombs_expire_locked(kv, INT64_MAX, -1); /* all of them */
    pdgw_notif_relay_destroy(kv->relay);
    pdgw_notif_destroy(kv->notif);
    pdgw_fwd_kv_client_destroy(kv->proxy);
    close(kv->efd);
    pdb_timers_free(&kv->res_timers);
    pdb_timers_free(&kv->timers);
    pthread_mutex_destroy(&kv->client_lock);
    pthread_mutex_destroy(&kv->lock);
    pdgw_free(kv);
}

int pdgw_fwd_kv_svc_notif_port(const pdgw_fwd_kv_svc_t *kv)
{
    return kv && kv->notif ? pdgw_notif_port(kv->notif) : 0;
}
