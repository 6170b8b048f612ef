/*
 * pdgw_kvctl_req.c - the per-attempt side of the KV control service (forwarder.h
 * pdgw_fwd_kv_req_*), called from request ops on worker threads; never blocks. The weighted
 * admission semaphore lives here: ceil(prompt_tokens / chunk_tokens) slots per request,
 * granted strictly FIFO so a large request is never starved (docs/protocols/lmcache.md).
 */
#include "pdgw_kvctl.h"

#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"

pdgw_fwd_kv_req_t *pdgw_fwd_kv_req_new(pdgw_fwd_kv_svc_t *kv, const pdgw_fwd_request_t *req,
                                       const char *kv_req_id)
{
    pdgw_fwd_kv_req_t *q = pdgw_calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->kv = kv;
    atomic_init(&q->refs, 1);
    q->waker = req->waker ? pdgw_fwd_waker_ref(req->waker) : NULL;
    snprintf(q->id, sizeof(q->id), "%s", kv_req_id);
    q->free_chunks = -1;
    pdb_timer_init(&q->notif_timer, NULL, q); /* armed once its gate waits */
    return q;
}

const char *pdgw_fwd_kv_req_id(const pdgw_fwd_kv_req_t *q)
{
    return q->id;
}

void pdgw_fwd_kv_req_set_decode(pdgw_fwd_kv_req_t *q, const pdgw_instance_t *decode)
{
    size_t i;
    if (q == NULL || decode == NULL || q->have_dest)
        return;
    snprintf(q->dest.host, sizeof(q->dest.host), "%s",
             decode->kv_host && decode->kv_host[0] ? decode->kv_host : decode->host);
    for (i = 0; i < decode->n_alloc_ports && i < KVCTL_MAX_PORTS; i++)
        if (decode->alloc_ports[i] > 0 && decode->alloc_ports[i] < 65536)
            q->dest.ports[q->dest.nports++] = decode->alloc_ports[i];
    q->have_dest = 1;
}

int pdgw_fwd_kv_req_refused(const pdgw_fwd_kv_req_t *q)
{
    return q != NULL && q->refused;
}

/* Take <q> out of the admission queue (lock held). */
static void adm_unlink_locked(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q)
{
    if (q->adm_prev != NULL)
        q->adm_prev->adm_next = q->adm_next;
    else
        kv->adm_head = q->adm_next;
    if (q->adm_next != NULL)
        q->adm_next->adm_prev = q->adm_prev;
    else
        kv->adm_tail = q->adm_prev;
    q->adm_next = q->adm_prev = NULL;
}

void pdgw_kvctl_adm_grant_locked(pdgw_fwd_kv_svc_t *kv)
{
    while (kv->adm_head != NULL &&
           (kv->o.admission_chunks <= 0 ||
            kv->adm_used + kv->adm_head->weight <= kv->o.admission_chunks)) {
        pdgw_fwd_kv_req_t *q = kv->adm_head;
        adm_unlink_locked(kv, q);
        q->adm = ADM_HELD;
        kv->adm_used += q->weight;
        pdgw_kvctl_wake_locked(q);
    }
}

static pdgw_fwd_status_t admit(pdgw_fwd_kv_req_t *q, const pdgw_fwd_request_t *req,
                               pdgw_fwd_error_t *err)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    pdgw_fwd_status_t rc = PDGW_FWD_OK;
    if (!kv->o.proxy)
        return PDGW_FWD_OK;
    pthread_mutex_lock(&kv->lock); /* admission_chunks changes on reload (pdgw_kvctl_apply) */
    if (q->adm == ADM_NONE && kv->o.admission_chunks <= 0) {
        pthread_mutex_unlock(&kv->lock);
        return PDGW_FWD_OK;
    }
    if (q->adm == ADM_NONE) {
        int64_t pt = req->prompt_tokens > 0 ? req->prompt_tokens : 1;
        q->weight = (pt + kv->o.chunk_tokens - 1) / kv->o.chunk_tokens;
        if (q->weight > kv->o.admission_chunks) {
            int64_t cap = kv->o.admission_chunks;
            pthread_mutex_unlock(&kv->lock);
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 400,
                               "prompt needs %lld KV chunks of %lld tokens, more than the "
                               "admission capacity (admission_chunks %lld)",
                               (long long)q->weight, (long long)kv->o.chunk_tokens, (long long)cap);
            return PDGW_FWD_ERR;
        }
        if (kv->adm_head == NULL && kv->adm_used + q->weight <= kv->o.admission_chunks) {
            q->adm = ADM_HELD;
            kv->adm_used += q->weight;
        } else {
            q->adm = ADM_WAITING;
            q->adm_prev = kv->adm_tail;
            if (kv->adm_tail)
                kv->adm_tail->adm_next = q;
            else
                kv->adm_head = q;
            kv->adm_tail = q;
            pthread_mutex_unlock(&kv->lock);
            pdgw_kvctl_count(kv, "admission_waits", "Requests that waited for weighted admission.");
            return PDGW_FWD_PENDING;
        }
    }
    if (q->adm == ADM_WAITING)
        rc = PDGW_FWD_PENDING;
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

/* A reservation job for <q> (lock held): not queued yet; NULL on no memory (q->res is then
 * RES_FAILED: the request goes on unreserved). <not_before> 0: the gate's first ask. */
static kvctl_job_t *reserve_job_locked(pdgw_fwd_kv_req_t *q, int64_t not_before)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    kvctl_job_t *j = pdgw_calloc(1, sizeof(*j));
    if (j == NULL) {
        q->res = RES_FAILED;
        return NULL;
    }
    atomic_fetch_add(&q->refs, 1);
    j->q = q;
    pdb_timer_init(&j->delay, NULL, j);
    pdb_timer_init(&j->res_timer, NULL, j);
    j->dest = q->dest;
    snprintf(j->id, sizeof(j->id), "%s", q->id);
    j->chunks = q->res_chunks;
    j->ttl_ms = kv->o.reserve_ttl_ms;
    j->timeout_ms = kv->o.reserve_timeout_ms;
    j->res_may_go_ahead = not_before == 0; /* the gate's first ask, not a queued retry */
    q->res = RES_ASKING;
    return j;
}

/* A reservation for the service thread to start at <not_before> (lock held): a timer until
 * then. 1 when the thread must be kicked. */
static int delay_reserve_locked(pdgw_fwd_kv_req_t *q, int64_t not_before)
{
    kvctl_job_t *j = reserve_job_locked(q, not_before);
    return j != NULL && pdgw_kvctl_job_delay_locked(q->kv, j, not_before);
}

pdgw_fwd_status_t pdgw_fwd_kv_req_before_prefill(pdgw_fwd_kv_req_t *q,
                                                 const pdgw_fwd_request_t *req,
                                                 const pdgw_instance_t *decode,
                                                 pdgw_fwd_error_t *err)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    pdgw_fwd_status_t rc = admit(q, req, err);
    res_state_t res;
    int64_t free_chunks;
    int kick = 0;

    if (rc != PDGW_FWD_OK)
        return rc;
    if (!kv->o.reserve || req->mode != PDGW_MODE_BATCH || decode == NULL)
        return PDGW_FWD_OK;
    pdgw_fwd_kv_req_set_decode(q, decode);
    if (q->dest.nports == 0)
        return PDGW_FWD_OK; /* an engine without libkvt: nothing to reserve */
    pthread_mutex_lock(&kv->lock);
    if (q->ahead) {
        pthread_mutex_unlock(&kv->lock);
        return PDGW_FWD_OK; /* went on before its answer: asked again only by mistake */
    }
    if (q->res == RES_NONE) {
        int64_t pt = req->prompt_tokens > 0 ? req->prompt_tokens : 1, room;
        kvctl_job_t *j;
        q->res_chunks = (pt + kv->o.chunk_tokens - 1) / kv->o.chunk_tokens;
        j = reserve_job_locked(q, 0);
        pthread_mutex_unlock(&kv->lock);
        if (j == NULL)
            return PDGW_FWD_OK; /* no memory for it: unreserved, as when it fails */
        /* Sent from here, not by the service thread, and this worker is woken by the answer
         * (pdgw_kvctl_reserve.c): the decode leg waits for no hand-over between threads, and
         * for no answer at all while the decode's last answers leave room for it. */
        if (pdgw_kvctl_reserve_start(kv, j, &room))
            pdgw_kvctl_kick(kv);
        if (room < 0)
            return PDGW_FWD_PENDING;
        pthread_mutex_lock(&kv->lock);
        q->ahead = 1;
        pthread_mutex_unlock(&kv->lock);
        pdgw_fwd_instance_set_kv_free_chunks(decode, room); /* scheduler hint */
        pdgw_kvctl_count(kv, "reserve_ahead",
                         "Legs sent before their ReserveRequest's answer: the decode's last "
                         "answers left room for the request twice over.");
        return PDGW_FWD_OK;
    }
    res = q->res;
    free_chunks = q->free_chunks;
    if (res == RES_REFUSED && kv->o.on_refusal == PDGW_FWD_KV_REFUSAL_QUEUE) {
        /* Queue: ask again shortly, up to the request deadline (the engine's gate timeout). */
        kick = delay_reserve_locked(q, pdgw_kvctl_now_ms(kv) + kv->o.reserve_retry_ms);
        res = q->res;
    }
    pthread_mutex_unlock(&kv->lock);
    if (free_chunks >= 0)
        pdgw_fwd_instance_set_kv_free_chunks(decode, free_chunks); /* scheduler hint */
    if (kick)
        pdgw_kvctl_kick(kv);
    switch (res) {
    case RES_ASKING:
        return PDGW_FWD_PENDING;
    case RES_GRANTED:
        return PDGW_FWD_OK;
    case RES_REFUSED:
        q->refused = 1;
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 1, 503,
                           "decode %s refused a KV reservation of %lld chunks (%lld free)",
                           decode->id, (long long)q->res_chunks, (long long)free_chunks);
        return PDGW_FWD_ERR;
    default:
        /* No answer from the receiver: go on unreserved (the transfer itself still fails
         * over cleanly); counted as reserve_errors. */
        return PDGW_FWD_OK;
    }
}

/* Register q for ProxyNotif (lock held): from now on its notices count. */
static void notif_register_locked(pdgw_fwd_kv_req_t *q, int need)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    if (q->notif_need > 0)
        return;
    q->notif_need = need;
    pdgw_kvctl_waiter_add_locked(kv, q);
    atomic_fetch_add(&q->refs, 1);
}

void pdgw_fwd_kv_req_expect_notifs(pdgw_fwd_kv_req_t *q, int need, const pdgw_instance_t *prefill)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    if (need <= 0 || kv->notif == NULL)
        return;
    pthread_mutex_lock(&kv->lock);
    if (prefill != NULL && q->notif_need == 0) {
        snprintf(q->phost[0], sizeof(q->phost[0]), "%s", prefill->host ? prefill->host : "");
        snprintf(q->phost[1], sizeof(q->phost[1]), "%s", prefill->kv_host ? prefill->kv_host : "");
    }
    notif_register_locked(q, need);
    pthread_mutex_unlock(&kv->lock);
}

pdgw_fwd_status_t pdgw_fwd_kv_req_wait_notifs(pdgw_fwd_kv_req_t *q, const pdgw_fwd_request_t *req,
                                              int need, pdgw_fwd_error_t *err)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    int got, timed_out, fallback, kick = 0;
    int64_t timeout_ms;
    (void)req;
    if (need <= 0 || kv->o.skip_proxy_notification)
        return PDGW_FWD_OK; /* engines that send no ProxyNotif: the decode goes at once */
    pthread_mutex_lock(&kv->lock);
    notif_register_locked(q, need);
    if (!q->notif_waiting && q->notif_got < q->notif_need) {
        /* Only a deadline sooner than the thread's sleep needs it woken now (a wake per
         * request would put a hand-over between threads on the path of every notice). */
        kick = pdgw_kvctl_notif_deadline_arm_locked(q, kv->o.notif_timeout_ms);
        q->notif_waiting = 1;
    }
    got = q->notif_got;
    timed_out = q->notif_timed_out;
    need = q->notif_need;
    fallback = kv->o.notif_fallback_decode; /* live options: read under the lock */
    timeout_ms = kv->o.notif_timeout_ms;
    pthread_mutex_unlock(&kv->lock);
    if (got >= need)
        return PDGW_FWD_OK;
    if (timed_out) {
        pdgw_kvctl_count(kv, "notif_timeouts",
                         "Requests whose ProxyNotifs did not all arrive in time.");
        if (fallback) {
            /* notif_fallback: decode. The decode finds what landed and recomputes the rest. */
            pdgw_kvctl_count(
                kv, "notif_fallback_decodes",
                "Decodes sent without every ProxyNotif after the deadline (they recompute).");
            return PDGW_FWD_OK;
        }
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 504,
                           "KV transfer not confirmed: ProxyNotif{req_id=%s} arrived from %d of "
                           "%d TP ranks within %lld ms",
                           q->id, got, need, (long long)timeout_ms);
        return PDGW_FWD_ERR;
    }
    if (kick)
        pdgw_kvctl_kick(kv); /* it would sleep past the new deadline */
    return PDGW_FWD_PENDING;
}

void pdgw_fwd_kv_req_end(pdgw_fwd_kv_req_t *q, pdgw_end_reason_t reason)
{
    pdgw_fwd_kv_svc_t *kv;
    int send_cancel, drop_notif_ref = 0;
    if (q == NULL)
        return;
    kv = q->kv;
    pthread_mutex_lock(&kv->lock);
    q->ended = 1;
    q->end_ok = reason == PDGW_END_OK;
    /* admission */
    if (q->adm == ADM_HELD) {
        kv->adm_used -= q->weight;
    } else if (q->adm == ADM_WAITING) {
        adm_unlink_locked(kv, q);
    }
    q->adm = ADM_NONE;
    pdgw_kvctl_adm_grant_locked(kv);
    pdgw_kvctl_job_delay_drop_locked(q); /* a retry not due yet is never sent */
    /* notif waiter: its deadline goes with it */
    pdgw_kvctl_notif_deadline_cancel_locked(q);
    if (q->notif_need > 0)
        drop_notif_ref = pdgw_kvctl_waiter_remove_locked(kv, q);
    /* release on the decode */
    /* A completed transfer releases its reservation on the receiver (all chunks landed), and a
     * CancelNotif would leave a tombstone for the id there: cancel only attempts that did not
     * complete. A reservation that is never drawn ends with its TTL. */
    send_cancel = q->have_dest && q->dest.nports > 0 && reason != PDGW_END_OK;
    /* Remember the ended attempt for a while: its late ProxyNotifs are told apart from unknown
     * ones, and a transfer that lands after a failure is released (bounded: past the cap late
     * notices of the oldest ones just count as unknown). */
    if (q->notif_need > 0) {
        kvctl_tomb_t *t = pdgw_calloc(1, sizeof(*t));
        if (t != NULL) {
            snprintf(t->id, sizeof(t->id), "%s", q->id);
            t->dest = q->dest;
            t->has_dest = send_cancel;
            memcpy(t->phost, q->phost, sizeof(t->phost));
            t->t_ms = pdgw_kvctl_now_ms(kv);
            pdgw_kvctl_tomb_add_locked(kv, t);
        }
    }
    if (send_cancel)
        (void)pdgw_kvctl_push_cancel_locked(kv, &q->dest, q->id, 1); /* releases go first */
    pdgw_kvctl_unlock(kv); /* wakes the admissions granted above */
    if (send_cancel) {
        pdgw_kvctl_kick(kv);
        if (reason != PDGW_END_OK)
            pdgw_fwd_cancel_notif_sent(kv->protocol); /* pdgw_pd_cancel_notifs_total */
    }
    if (drop_notif_ref)
        pdgw_kvctl_req_unref(q);
    pdgw_kvctl_req_unref(q);
}
