/*
 * fwd_pd_kvctl.c - the gateway's side of libkvt's control plane for the PD forwarders whose
 * decode runs libkvt (vllm-kvt, lmcache; pdgw-sim or any engine embedding libkvt).
 *
 * One control thread per forwarder owns a kvt_proxy_t (the ZMQ PULL for ProxyNotif plus one
 * DEALER per receiver alloc port) and does everything that may block:
 *   - ReserveRequest{req_id, total_chunks, ttl_ms} to every alloc port (TP rank) of the
 *     chosen decode; the answer (granted, free_chunks) is handed back to the request,
 *   - CancelNotif{req_id} at the end of an attempt (release of the reservation / pinned pages),
 *   - ProxyNotif{req_id} counting (one per TP rank of the prefill), with per-request deadlines.
 * Requests talk to the thread through fwd_pd_kvreq_t objects (reference counted: the attempt
 * and the thread each hold one) and are woken through their pdgw waker. The weighted
 * admission semaphore (PROTOCOLS.md A.6) lives here too: ceil(prompt_tokens / chunk_tokens)
 * slots per request, granted strictly FIFO so a large request is never starved.
 */
#include "fwd_pd.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <kvt/kvt_engine.h>

#define KVCTL_MAX_PORTS   16
#define KVCTL_ID_MAX      160
#define KVCTL_POLL_MS     20
#define KVCTL_SEEN_TTL_MS 120000
#define KVCTL_SEEN_MAX    16384 /* ProxyNotifs of unknown requests kept (bounded: network input) */
#define KVCTL_MUTE_MAX    64
#define KVCTL_MUTE_MS     5000 /* an alloc port that did not answer is not asked again for this */

typedef enum { RES_NONE = 0, RES_ASKING, RES_GRANTED, RES_REFUSED, RES_FAILED } res_state_t;
typedef enum { ADM_NONE = 0, ADM_WAITING, ADM_HELD } adm_state_t;

typedef struct kvctl_dest {
    char host[256];
    int ports[KVCTL_MAX_PORTS];
    int nports;
} kvctl_dest_t;

struct fwd_pd_kvreq {
    fwd_pd_kv_t *kv;
    atomic_int refs;
    pdgw_fwd_waker_t *waker;
    char id[KVCTL_ID_MAX];
    kvctl_dest_t dest;
    int have_dest;
    /* all below under kv->lock */
    int ended;
    adm_state_t adm;
    int64_t weight;
    struct fwd_pd_kvreq *adm_next;
    res_state_t res;
    int64_t res_chunks;
    int64_t free_chunks;
    int refused;    /* the last failure was a refused reservation */
    int notif_need; /* > 0 while waiting */
    int notif_got;
    int notif_timed_out;
    int64_t notif_deadline_ms;
    struct fwd_pd_kvreq *notif_next;
};

typedef struct kvctl_job {
    struct kvctl_job *next;
    int cancel; /* 0 reserve, 1 cancel */
    int skip;   /* reserve of an attempt that already ended */
    int64_t not_before_ms;
    fwd_pd_kvreq_t *q; /* reserve: referenced */
    kvctl_dest_t dest;
    char id[KVCTL_ID_MAX];
    int64_t chunks, ttl_ms;
} kvctl_job_t;

typedef struct kvctl_seen {
    struct kvctl_seen *next;
    char id[KVCTL_ID_MAX];
    int count;
    int64_t t_ms;
} kvctl_seen_t;

/* An attempt that ended without completing: a transfer that still lands afterwards (its
 * ProxyNotif arrives late) is released with another CancelNotif. */
typedef struct kvctl_tomb {
    struct kvctl_tomb *next;
    char id[KVCTL_ID_MAX];
    kvctl_dest_t dest;
    int64_t t_ms;
} kvctl_tomb_t;

struct fwd_pd_kv {
    char protocol[64];
    fwd_pd_kv_opts_t o;
    kvt_proxy_t *proxy;
    int proxy_port;
    int efd;
    pthread_t th;
    int started;
    pthread_mutex_t lock;
    int stop;
    kvctl_job_t *jobs;
    kvctl_seen_t *seen;
    size_t n_seen;
    uint64_t dropped; /* ProxyNotifs dropped because the table was full */
    kvctl_tomb_t *tombs;
    struct {
        char host[256];
        int port;
        int64_t until_ms;
    } mute[KVCTL_MUTE_MAX]; /* control thread only */
    uint64_t late_releases; /* counted outside the lock */
    fwd_pd_kvreq_t *notif_waiters;
    fwd_pd_kvreq_t *adm_head, *adm_tail;
    int64_t adm_used;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void kick(fwd_pd_kv_t *kv)
{
    uint64_t one = 1;
    if (write(kv->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: control thread kick: %s", kv->protocol,
                     strerror(errno));
}

static void kvreq_unref(fwd_pd_kvreq_t *q)
{
    if (q == NULL || atomic_fetch_sub(&q->refs, 1) != 1)
        return;
    if (q->waker)
        pdgw_fwd_waker_unref(q->waker);
    free(q);
}

static void wake(fwd_pd_kvreq_t *q)
{
    if (q->waker)
        pdgw_fwd_waker_wake(q->waker);
}

static void count(fwd_pd_kv_t *kv, const char *name, const char *help)
{
    pdgw_fwd_counter_inc(kv->protocol, name, help);
}

/* ---------------------------------------------------------------- control thread */

/* One ProxyNotif arrived (lock held). */
static void on_notif_locked(fwd_pd_kv_t *kv, const char *id)
{
    fwd_pd_kvreq_t *q;
    kvctl_seen_t *s;
    for (q = kv->notif_waiters; q != NULL; q = q->notif_next) {
        if (strcmp(q->id, id) == 0) {
            if (++q->notif_got >= q->notif_need)
                wake(q);
            return;
        }
    }
    for (kvctl_tomb_t *t = kv->tombs; t != NULL; t = t->next) {
        if (strcmp(t->id, id) == 0) {
            kvctl_job_t *j = calloc(1, sizeof(*j));
            if (j != NULL) {
                j->cancel = 1;
                j->dest = t->dest;
                snprintf(j->id, sizeof(j->id), "%s", id);
                j->next = kv->jobs;
                kv->jobs = j;
                kv->late_releases++;
            }
            return;
        }
    }
    for (s = kv->seen; s != NULL; s = s->next) {
        if (strcmp(s->id, id) == 0) {
            s->count++;
            s->t_ms = now_ms();
            return;
        }
    }
    if (kv->n_seen >= KVCTL_SEEN_MAX || (s = calloc(1, sizeof(*s))) == NULL) {
        kv->dropped++;
        return;
    }
    kv->n_seen++;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->count = 1;
    s->t_ms = now_ms();
    s->next = kv->seen;
    kv->seen = s;
}

static void drain_notifs(fwd_pd_kv_t *kv)
{
    char id[KVCTL_ID_MAX];
    int n = 0, dropped;
    while (kv->o.proxy && kvt_proxy_recv(kv->proxy, id, sizeof(id), 0) == KVT_OK) {
        pthread_mutex_lock(&kv->lock);
        on_notif_locked(kv, id);
        pthread_mutex_unlock(&kv->lock);
        n++;
    }
    while (n-- > 0)
        count(kv, "proxy_notifs", "ProxyNotif messages received.");
    pthread_mutex_lock(&kv->lock);
    n = (int)kv->late_releases;
    kv->late_releases = 0;
    dropped = (int)kv->dropped;
    kv->dropped = 0;
    pthread_mutex_unlock(&kv->lock);
    while (n-- > 0)
        count(kv, "late_kv_releases",
              "CancelNotifs re-sent for transfers that landed after their request ended.");
    while (dropped-- > 0)
        count(kv, "proxy_notifs_dropped",
              "ProxyNotifs for unknown requests dropped (table of early notices full).");
}

static int port_muted(fwd_pd_kv_t *kv, const char *host, int port)
{
    int64_t now = now_ms();
    for (int i = 0; i < KVCTL_MUTE_MAX; i++)
        if (kv->mute[i].port == port && kv->mute[i].until_ms > now &&
            strcmp(kv->mute[i].host, host) == 0)
            return 1;
    return 0;
}

static void port_mute(fwd_pd_kv_t *kv, const char *host, int port)
{
    int slot = 0;
    for (int i = 0; i < KVCTL_MUTE_MAX; i++)
        if (kv->mute[i].until_ms < kv->mute[slot].until_ms)
            slot = i; /* the oldest (or an unused) entry */
    snprintf(kv->mute[slot].host, sizeof(kv->mute[slot].host), "%s", host);
    kv->mute[slot].port = port;
    kv->mute[slot].until_ms = now_ms() + KVCTL_MUTE_MS;
}

static void run_reserve(fwd_pd_kv_t *kv, kvctl_job_t *j)
{
    int granted_all = 1, failed = 0, i;
    int64_t min_free = -1;
    for (i = 0; i < j->dest.nports; i++) {
        int granted = 0;
        int64_t free_chunks = -1;
        kvt_status_t st;
        if (port_muted(kv, j->dest.host, j->dest.ports[i])) {
            failed = 1; /* did not answer lately: go on unreserved without waiting again */
            break;
        }
        st =
            kvt_proxy_reserve(kv->proxy, j->dest.host, (uint16_t)j->dest.ports[i], j->id, j->chunks,
                              j->ttl_ms, (int)kv->o.reserve_timeout_ms, &granted, &free_chunks);
        if (st != KVT_OK) {
            pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                         "%s: ReserveRequest %s to %s:%d: %s; not asking it again for %d ms",
                         kv->protocol, j->id, j->dest.host, j->dest.ports[i], kvt_strerror(st),
                         KVCTL_MUTE_MS);
            port_mute(kv, j->dest.host, j->dest.ports[i]);
            failed = 1;
            break;
        }
        if (!granted)
            granted_all = 0;
        if (free_chunks >= 0 && (min_free < 0 || free_chunks < min_free))
            min_free = free_chunks;
    }
    pthread_mutex_lock(&kv->lock);
    if (!j->q->ended) {
        j->q->free_chunks = min_free;
        j->q->res = failed ? RES_FAILED : granted_all ? RES_GRANTED : RES_REFUSED;
        wake(j->q);
    } else if (!failed) {
        /* The attempt ended while we asked: give the pages back at once. */
        kvctl_job_t *c = calloc(1, sizeof(*c));
        if (c) {
            c->cancel = 1;
            c->dest = j->dest;
            snprintf(c->id, sizeof(c->id), "%s", j->id);
            c->next = kv->jobs;
            kv->jobs = c;
        }
    }
    pthread_mutex_unlock(&kv->lock);
    count(kv,
          failed        ? "reserve_errors"
          : granted_all ? "reserve_granted"
                        : "reserve_refused",
          failed        ? "ReserveRequests without an answer."
          : granted_all ? "ReserveRequests granted."
                        : "ReserveRequests refused.");
}

static void run_cancel(fwd_pd_kv_t *kv, kvctl_job_t *j)
{
    int i;
    for (i = 0; i < j->dest.nports; i++) {
        kvt_status_t st =
            kvt_proxy_cancel(kv->proxy, j->dest.host, (uint16_t)j->dest.ports[i], j->id, NULL, 0);
        if (st != KVT_OK)
            pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: CancelNotif %s to %s:%d: %s", kv->protocol, j->id,
                         j->dest.host, j->dest.ports[i], kvt_strerror(st));
    }
}

/* Take the first due job (lock held); *next_ms = earliest not-yet-due time. */
static kvctl_job_t *take_job_locked(fwd_pd_kv_t *kv, int64_t now, int64_t *next_ms)
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

static void check_deadlines_locked(fwd_pd_kv_t *kv, int64_t now, int64_t *next_ms)
{
    fwd_pd_kvreq_t *q;
    kvctl_seen_t **sp;
    for (q = kv->notif_waiters; q != NULL; q = q->notif_next) {
        if (q->notif_got >= q->notif_need || q->notif_timed_out)
            continue;
        if (now >= q->notif_deadline_ms) {
            q->notif_timed_out = 1;
            wake(q);
        } else if (*next_ms < 0 || q->notif_deadline_ms < *next_ms) {
            *next_ms = q->notif_deadline_ms;
        }
    }
    for (sp = &kv->seen; *sp != NULL;) {
        kvctl_seen_t *s = *sp;
        if (now - s->t_ms > KVCTL_SEEN_TTL_MS) {
            *sp = s->next;
            kv->n_seen--;
            free(s);
        } else {
            sp = &s->next;
        }
    }
    for (kvctl_tomb_t **tp = &kv->tombs; *tp != NULL;) {
        kvctl_tomb_t *t = *tp;
        if (now - t->t_ms > KVCTL_SEEN_TTL_MS) {
            *tp = t->next;
            free(t);
        } else {
            tp = &t->next;
        }
    }
}

static void *kvctl_main(void *arg)
{
    fwd_pd_kv_t *kv = arg;
    for (;;) {
        struct pollfd pf[2];
        int npf = 1, timeout = KVCTL_POLL_MS;
        int64_t next = -1, now;
        kvctl_job_t *j;
        uint64_t v;

        pf[0].fd = kv->efd;
        pf[0].events = POLLIN;
        if (kv->o.proxy) {
            pf[1].fd = kvt_proxy_fd(kv->proxy);
            pf[1].events = POLLIN;
            npf = 2;
        }
        drain_notifs(kv); /* ZMQ_FD is edge-style: always drain before waiting */
        pthread_mutex_lock(&kv->lock);
        if (kv->stop && kv->jobs == NULL) {
            pthread_mutex_unlock(&kv->lock);
            break;
        }
        now = now_ms();
        j = take_job_locked(kv, now, &next);
        check_deadlines_locked(kv, now, &next);
        pthread_mutex_unlock(&kv->lock);
        if (j != NULL) {
            if (j->cancel)
                run_cancel(kv, j);
            else if (!j->skip) /* ended attempts never reserve */
                run_reserve(kv, j);
            kvreq_unref(j->q);
            free(j);
            continue;
        }
        if (next >= 0 && next - now < timeout)
            timeout = next > now ? (int)(next - now) : 0;
        if (poll(pf, (nfds_t)npf, timeout) > 0 && (pf[0].revents & POLLIN))
            (void)!read(kv->efd, &v, sizeof(v));
    }
    return NULL;
}

/* ---------------------------------------------------------------- life */

pdgw_fwd_status_t fwd_pd_kv_create(const char *protocol, const fwd_pd_kv_opts_t *o,
                                   fwd_pd_kv_t **out, char *err, size_t errlen)
{
    fwd_pd_kv_t *kv = calloc(1, sizeof(*kv));
    kvt_status_t st;
    if (kv == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    snprintf(kv->protocol, sizeof(kv->protocol), "%s", protocol);
    kv->o = *o;
    pthread_mutex_init(&kv->lock, NULL);
    kv->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (kv->efd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto err_lock;
    }
    st = o->proxy ? kvt_proxy_create(o->proxy_host, (uint16_t)o->proxy_port, &kv->proxy)
                  : kvt_proxy_create("127.0.0.1", 0, &kv->proxy);
    if (st != KVT_OK) {
        snprintf(err, errlen, "protocol option proxy_host/proxy_port: cannot bind %s:%lld: %s",
                 o->proxy ? o->proxy_host : "127.0.0.1", (long long)(o->proxy ? o->proxy_port : 0),
                 kvt_strerror(st));
        goto err_efd;
    }
    kv->proxy_port = kvt_proxy_port(kv->proxy);
    if (pthread_create(&kv->th, NULL, kvctl_main, kv) != 0) {
        snprintf(err, errlen, "cannot start the KV control thread");
        goto err_proxy;
    }
    kv->started = 1;
    if (o->proxy)
        pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: ProxyNotif PULL bound on %s:%d", protocol,
                     o->proxy_host, kv->proxy_port);
    /* Show the counters at 0 from the start. */
    *out = kv;
    return PDGW_FWD_OK;

err_proxy:
    kvt_proxy_destroy(kv->proxy);
err_efd:
    close(kv->efd);
err_lock:
    pthread_mutex_destroy(&kv->lock);
    free(kv);
    return PDGW_FWD_ERR_CONFIG;
}

void fwd_pd_kv_destroy(fwd_pd_kv_t *kv)
{
    if (kv == NULL)
        return;
    pthread_mutex_lock(&kv->lock);
    kv->stop = 1;
    pthread_mutex_unlock(&kv->lock);
    kick(kv);
    if (kv->started)
        pthread_join(kv->th, NULL);
    while (kv->seen) {
        kvctl_seen_t *s = kv->seen;
        kv->seen = s->next;
        free(s);
    }
    while (kv->tombs) {
        kvctl_tomb_t *t = kv->tombs;
        kv->tombs = t->next;
        free(t);
    }
    kvt_proxy_destroy(kv->proxy);
    close(kv->efd);
    pthread_mutex_destroy(&kv->lock);
    free(kv);
}

const fwd_pd_kv_opts_t *fwd_pd_kv_opts(const fwd_pd_kv_t *kv)
{
    return &kv->o;
}

int fwd_pd_kv_proxy_port(const fwd_pd_kv_t *kv)
{
    return kv && kv->o.proxy ? kv->proxy_port : 0;
}

/* ---------------------------------------------------------------- per attempt */

fwd_pd_kvreq_t *fwd_pd_kvreq_new(fwd_pd_kv_t *kv, const pdgw_fwd_request_t *req,
                                 const char *kv_req_id)
{
    fwd_pd_kvreq_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->kv = kv;
    atomic_init(&q->refs, 1);
    q->waker = req->waker ? pdgw_fwd_waker_ref(req->waker) : NULL;
    snprintf(q->id, sizeof(q->id), "%s", kv_req_id);
    q->free_chunks = -1;
    return q;
}

const char *fwd_pd_kvreq_id(const fwd_pd_kvreq_t *q)
{
    return q->id;
}

void fwd_pd_kvreq_set_decode(fwd_pd_kvreq_t *q, const pdgw_instance_t *decode)
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

int fwd_pd_kvreq_refused(const fwd_pd_kvreq_t *q)
{
    return q != NULL && q->refused;
}

/* Grant queued admissions that fit, in order (lock held). */
static void adm_grant_locked(fwd_pd_kv_t *kv)
{
    while (kv->adm_head != NULL && kv->adm_used + kv->adm_head->weight <= kv->o.admission_chunks) {
        fwd_pd_kvreq_t *q = kv->adm_head;
        kv->adm_head = q->adm_next;
        if (kv->adm_head == NULL)
            kv->adm_tail = NULL;
        q->adm_next = NULL;
        q->adm = ADM_HELD;
        kv->adm_used += q->weight;
        wake(q);
    }
}

static pdgw_fwd_status_t admit(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                               pdgw_fwd_error_t *err)
{
    fwd_pd_kv_t *kv = q->kv;
    pdgw_fwd_status_t rc = PDGW_FWD_OK;
    if (!kv->o.proxy || kv->o.admission_chunks <= 0)
        return PDGW_FWD_OK;
    pthread_mutex_lock(&kv->lock);
    if (q->adm == ADM_NONE) {
        int64_t pt = req->prompt_tokens > 0 ? req->prompt_tokens : 1;
        q->weight = (pt + kv->o.chunk_tokens - 1) / kv->o.chunk_tokens;
        if (q->weight > kv->o.admission_chunks) {
            pthread_mutex_unlock(&kv->lock);
            pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 400,
                               "prompt needs %lld KV chunks of %lld tokens, more than the "
                               "admission capacity (admission_chunks %lld)",
                               (long long)q->weight, (long long)kv->o.chunk_tokens,
                               (long long)kv->o.admission_chunks);
            return PDGW_FWD_ERR;
        }
        if (kv->adm_head == NULL && kv->adm_used + q->weight <= kv->o.admission_chunks) {
            q->adm = ADM_HELD;
            kv->adm_used += q->weight;
        } else {
            q->adm = ADM_WAITING;
            if (kv->adm_tail)
                kv->adm_tail->adm_next = q;
            else
                kv->adm_head = q;
            kv->adm_tail = q;
            pthread_mutex_unlock(&kv->lock);
            count(kv, "admission_waits", "Requests that waited for weighted admission.");
            return PDGW_FWD_PENDING;
        }
    }
    if (q->adm == ADM_WAITING)
        rc = PDGW_FWD_PENDING;
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

static void enqueue_reserve_locked(fwd_pd_kvreq_t *q, int64_t not_before)
{
    fwd_pd_kv_t *kv = q->kv;
    kvctl_job_t *j = calloc(1, sizeof(*j)), **pp;
    if (j == NULL) {
        q->res = RES_FAILED;
        return;
    }
    atomic_fetch_add(&q->refs, 1);
    j->q = q;
    j->dest = q->dest;
    snprintf(j->id, sizeof(j->id), "%s", q->id);
    j->chunks = q->res_chunks;
    j->ttl_ms = kv->o.reserve_ttl_ms;
    j->not_before_ms = not_before;
    for (pp = &kv->jobs; *pp != NULL; pp = &(*pp)->next)
        ;
    *pp = j;
    q->res = RES_ASKING;
}

pdgw_fwd_status_t fwd_pd_kvreq_before_prefill(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                                              const pdgw_instance_t *decode, pdgw_fwd_error_t *err)
{
    fwd_pd_kv_t *kv = q->kv;
    pdgw_fwd_status_t rc = admit(q, req, err);
    res_state_t res;
    int64_t free_chunks;

    if (rc != PDGW_FWD_OK)
        return rc;
    if (!kv->o.reserve || req->mode != PDGW_MODE_BATCH || decode == NULL)
        return PDGW_FWD_OK;
    fwd_pd_kvreq_set_decode(q, decode);
    if (q->dest.nports == 0)
        return PDGW_FWD_OK; /* an engine without libkvt: nothing to reserve */
    pthread_mutex_lock(&kv->lock);
    if (q->res == RES_NONE) {
        int64_t pt = req->prompt_tokens > 0 ? req->prompt_tokens : 1;
        q->res_chunks = (pt + kv->o.chunk_tokens - 1) / kv->o.chunk_tokens;
        enqueue_reserve_locked(q, 0);
        pthread_mutex_unlock(&kv->lock);
        kick(kv);
        return PDGW_FWD_PENDING;
    }
    res = q->res;
    free_chunks = q->free_chunks;
    if (res == RES_REFUSED && kv->o.on_refusal == FWD_PD_REFUSAL_QUEUE) {
        /* Queue: ask again shortly, up to the request deadline (the engine's gate timeout). */
        enqueue_reserve_locked(q, now_ms() + kv->o.reserve_retry_ms);
        res = RES_ASKING;
    }
    pthread_mutex_unlock(&kv->lock);
    if (free_chunks >= 0)
        pdgw_fwd_instance_set_kv_free_chunks(decode, free_chunks); /* scheduler hint */
    switch (res) {
    case RES_ASKING:
        kick(kv);
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

pdgw_fwd_status_t fwd_pd_kvreq_wait_notifs(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                                           int need, pdgw_fwd_error_t *err)
{
    fwd_pd_kv_t *kv = q->kv;
    int got, timed_out;
    (void)req;
    if (need <= 0)
        return PDGW_FWD_OK;
    pthread_mutex_lock(&kv->lock);
    if (q->notif_need == 0) {
        kvctl_seen_t **sp;
        q->notif_need = need;
        q->notif_deadline_ms = now_ms() + kv->o.notif_timeout_ms;
        for (sp = &kv->seen; *sp != NULL; sp = &(*sp)->next) {
            if (strcmp((*sp)->id, q->id) == 0) {
                kvctl_seen_t *s = *sp;
                q->notif_got = s->count;
                *sp = s->next;
                kv->n_seen--;
                free(s);
                break;
            }
        }
        q->notif_next = kv->notif_waiters;
        kv->notif_waiters = q;
        atomic_fetch_add(&q->refs, 1);
    }
    got = q->notif_got;
    timed_out = q->notif_timed_out;
    pthread_mutex_unlock(&kv->lock);
    if (got >= need)
        return PDGW_FWD_OK;
    if (timed_out) {
        count(kv, "notif_timeouts", "Requests whose ProxyNotifs did not all arrive in time.");
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 504,
                           "KV transfer not confirmed: ProxyNotif{req_id=%s} arrived from %d of "
                           "%d TP ranks within %lld ms",
                           q->id, got, need, (long long)kv->o.notif_timeout_ms);
        return PDGW_FWD_ERR;
    }
    kick(kv); /* the thread re-arms its deadline timer */
    return PDGW_FWD_PENDING;
}

void fwd_pd_kvreq_end(fwd_pd_kvreq_t *q, pdgw_end_reason_t reason)
{
    fwd_pd_kv_t *kv;
    int send_cancel, drop_notif_ref = 0;
    if (q == NULL)
        return;
    kv = q->kv;
    pthread_mutex_lock(&kv->lock);
    q->ended = 1;
    /* admission */
    if (q->adm == ADM_HELD) {
        kv->adm_used -= q->weight;
    } else if (q->adm == ADM_WAITING) {
        fwd_pd_kvreq_t **pp, *prev = NULL;
        for (pp = &kv->adm_head; *pp != NULL; prev = *pp, pp = &(*pp)->adm_next) {
            if (*pp == q) {
                *pp = q->adm_next;
                if (kv->adm_tail == q)
                    kv->adm_tail = prev;
                break;
            }
        }
    }
    q->adm = ADM_NONE;
    adm_grant_locked(kv);
    /* notif waiter */
    if (q->notif_need > 0) {
        fwd_pd_kvreq_t **pp;
        for (pp = &kv->notif_waiters; *pp != NULL; pp = &(*pp)->notif_next) {
            if (*pp == q) {
                *pp = q->notif_next;
                drop_notif_ref = 1;
                break;
            }
        }
    }
    /* release on the decode */
    /* A completed transfer releases its reservation on the receiver (all chunks landed), and a
     * CancelNotif would leave a tombstone for the id there: cancel only attempts that did not
     * complete. A reservation that is never drawn ends with its TTL. */
    send_cancel = q->have_dest && q->dest.nports > 0 && reason != PDGW_END_OK;
    if (send_cancel && reason != PDGW_END_OK && kv->o.proxy) {
        kvctl_tomb_t *t = calloc(1, sizeof(*t));
        if (t != NULL) {
            snprintf(t->id, sizeof(t->id), "%s", q->id);
            t->dest = q->dest;
            t->t_ms = now_ms();
            t->next = kv->tombs;
            kv->tombs = t;
        }
    }
    if (send_cancel) {
        kvctl_job_t *j = calloc(1, sizeof(*j));
        if (j != NULL) {
            j->cancel = 1;
            j->dest = q->dest;
            snprintf(j->id, sizeof(j->id), "%s", q->id);
            j->next = kv->jobs; /* releases go first */
            kv->jobs = j;
        }
    }
    pthread_mutex_unlock(&kv->lock);
    if (send_cancel) {
        kick(kv);
        if (reason != PDGW_END_OK)
            pdgw_fwd_cancel_notif_sent(kv->protocol); /* pdgw_pd_cancel_notifs_total */
    }
    if (drop_notif_ref)
        kvreq_unref(q);
    kvreq_unref(q);
}
