/*
 * fwd_pd_kvctl.c - the gateway's side of libkvt's control plane for the PD forwarders whose
 * decode runs libkvt (vllm-kvt, lmcache; pdgw-sim or any engine embedding libkvt).
 *
 * One control thread per forwarder owns the gateway's KV control client (forwarder.h
 * pdgw_fwd_kv_*: one DEALER per receiver alloc port) and the checked ProxyNotif PULL
 * (fwd_pd_notif.c), and does everything that may block:
 *   - ReserveRequest{req_id, total_chunks, ttl_ms} to every alloc port (TP rank) of the
 *     chosen decode; the answer (granted, free_chunks) is handed back to the request,
 *   - CancelNotif{req_id} at the end of an attempt (release of the reservation / pinned pages),
 *   - ProxyNotif{req_id} counting (one per TP rank of the prefill), with per-request deadlines.
 *     A ProxyNotif counts only for a request in flight (registered before its prefill leg),
 *     only from that request's prefill addresses (zmq Peer-Address against the prefill's host
 *     and kv_host) and at most once per TP rank; anything else (unknown, wrong peer, late,
 *     surplus, malformed) is counted by reason and ignored, so a forged message never releases
 *     a decode early.
 * Requests talk to the thread through fwd_pd_kvreq_t objects (reference counted: the attempt
 * and the thread each hold one) and are woken through their pdgw waker. The weighted
 * admission semaphore (docs/protocols/lmcache.md) lives here too: ceil(prompt_tokens /
 * chunk_tokens) slots per request, granted strictly FIFO so a large request is never starved.
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

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#define KVCTL_MAX_PORTS   16
#define KVCTL_ID_MAX      160
#define KVCTL_POLL_MS     20
#define KVCTL_TOMB_TTL_MS 120000
#define KVCTL_TOMB_MAX    16384 /* ended attempts remembered for late ProxyNotifs (bounded) */
#define KVCTL_HOST_MAX    256
#define KVCTL_ADDRS       8
#define KVCTL_DNS_SLOTS   32
#define KVCTL_DNS_TTL_MS  30000
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
    int notif_need; /* > 0 once registered (in flight for ProxyNotif) */
    int notif_got;
    int notif_timed_out;
    int notif_waiting;             /* the decode gate is waiting: the deadline runs */
    int64_t notif_deadline_ms;     /* valid while notif_waiting */
    char phost[2][KVCTL_HOST_MAX]; /* the prefill's host and kv_host ("" = unknown) */
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

/* A resolved host name (control thread only): a prefill named by DNS name is compared by the
 * addresses the name had at most KVCTL_DNS_TTL_MS ago. */
typedef struct kvctl_dns {
    char host[KVCTL_HOST_MAX];
    unsigned char addr[KVCTL_ADDRS][16];
    int n;
    int64_t t_ms;
} kvctl_dns_t;

/* An attempt that ended without completing: a transfer that still lands afterwards (its
 * ProxyNotif arrives late) is released with another CancelNotif. */
typedef struct kvctl_tomb {
    struct kvctl_tomb *next;
    char id[KVCTL_ID_MAX];
    kvctl_dest_t dest;
    int has_dest; /* the decode runs libkvt: a late landing is released with CancelNotif */
    char phost[2][KVCTL_HOST_MAX];
    int64_t t_ms;
} kvctl_tomb_t;

struct fwd_pd_kv {
    char protocol[64];
    fwd_pd_kv_opts_t o;
    pdgw_fwd_kv_client_t *proxy; /* the gateway's KV control client (Reserve, Cancel) */
    fwd_pd_notif_t *notif;       /* the ProxyNotif PULL (o.proxy) */
    fwd_pd_relay_t *relay;       /* notices for requests other replicas own (notif_relay_peers) */
    int efd;
    pthread_t th;
    int started;
    pthread_mutex_t lock;
    int stop;
    kvctl_job_t *jobs;
    kvctl_tomb_t *tombs;
    size_t n_tombs;
    kvctl_dns_t dns[KVCTL_DNS_SLOTS]; /* control thread only */
    struct {
        char host[256];
        int port;
        int64_t until_ms;
    } mute[KVCTL_MUTE_MAX]; /* control thread only */
    fwd_pd_kvreq_t *notif_waiters;
    fwd_pd_kvreq_t *adm_head, *adm_tail;
    int64_t adm_used;
};

static int64_t now_ms(void)
{
    return pdgw_fwd_now_ms();
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

/* Binary form of an IP address text (16 bytes; IPv4 and IPv4-mapped IPv6 as ::ffff:a.b.c.d),
 * 0 when it is not an address. */
static int addr_parse(const char *s, unsigned char out[16])
{
    struct in_addr a4;
    memset(out, 0, 16);
    if (inet_pton(AF_INET, s, &a4) == 1) {
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return 1;
    }
    return inet_pton(AF_INET6, s, out) == 1;
}

/* The addresses of <host> (an IP literal, or a name resolved on this thread and cached). */
static int host_addrs(fwd_pd_kv_t *kv, const char *host, unsigned char (*out)[16], int max)
{
    struct addrinfo hints, *res = NULL, *ai;
    kvctl_dns_t *slot = &kv->dns[0];
    int64_t now = now_ms();
    int n = 0;
    if (host[0] == '\0')
        return 0;
    if (addr_parse(host, out[0]))
        return 1;
    for (int i = 0; i < KVCTL_DNS_SLOTS; i++) {
        kvctl_dns_t *d = &kv->dns[i];
        if (d->host[0] != '\0' && strcmp(d->host, host) == 0 && now - d->t_ms < KVCTL_DNS_TTL_MS) {
            memcpy(out, d->addr, sizeof(d->addr[0]) * (size_t)(d->n < max ? d->n : max));
            return d->n < max ? d->n : max;
        }
        if (d->t_ms < slot->t_ms)
            slot = d; /* the oldest entry is replaced */
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) == 0) {
        for (ai = res; ai != NULL && n < KVCTL_ADDRS; ai = ai->ai_next) {
            char txt[INET6_ADDRSTRLEN];
            const void *a = ai->ai_family == AF_INET
                                ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                                : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
            if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
                inet_ntop(ai->ai_family, a, txt, sizeof(txt)) && addr_parse(txt, slot->addr[n]))
                n++;
        }
        freeaddrinfo(res);
    }
    snprintf(slot->host, sizeof(slot->host), "%.*s", KVCTL_HOST_MAX - 1, host);
    slot->n = n;
    slot->t_ms = now;
    memcpy(out, slot->addr, sizeof(slot->addr[0]) * (size_t)(n < max ? n : max));
    return n < max ? n : max;
}

/* Whether <peer> (the sender's address) is one of the prefill's addresses. With no address
 * known on either side the sender cannot be told: accepted. */
static int peer_is_prefill(fwd_pd_kv_t *kv, const char phost[2][KVCTL_HOST_MAX], const char *peer)
{
    unsigned char p[16], a[KVCTL_ADDRS][16];
    int known = 0;
    if (!kv->o.notif_check_peer)
        return 1;
    if (peer[0] == '\0' || !addr_parse(peer, p))
        return phost[0][0] == '\0' && phost[1][0] == '\0';
    for (int h = 0; h < 2; h++) {
        int n = host_addrs(kv, phost[h], a, KVCTL_ADDRS);
        known += phost[h][0] != '\0';
        for (int i = 0; i < n; i++)
            if (memcmp(a[i], p, 16) == 0)
                return 1;
    }
    return !known;
}

static fwd_pd_kvreq_t *find_waiter_locked(fwd_pd_kv_t *kv, const char *id)
{
    for (fwd_pd_kvreq_t *q = kv->notif_waiters; q != NULL; q = q->notif_next)
        if (strcmp(q->id, id) == 0)
            return q;
    return NULL;
}

static kvctl_tomb_t *find_tomb_locked(fwd_pd_kv_t *kv, const char *id)
{
    for (kvctl_tomb_t *t = kv->tombs; t != NULL; t = t->next)
        if (strcmp(t->id, id) == 0)
            return t;
    return NULL;
}

/* One ProxyNotif from <peer>: returns NULL when it counted, else the reason it was ignored.
 * The sender check may resolve a host name, so it runs without the lock. */
static const char *on_notif(fwd_pd_kv_t *kv, const char *id, const char *peer, int *late_release)
{
    char phost[2][KVCTL_HOST_MAX];
    fwd_pd_kvreq_t *q;
    kvctl_tomb_t *t;
    int ok;
    pthread_mutex_lock(&kv->lock);
    q = find_waiter_locked(kv, id);
    t = q ? NULL : find_tomb_locked(kv, id);
    if (q == NULL && t == NULL) {
        pthread_mutex_unlock(&kv->lock);
        return "unknown"; /* no such request in flight: forged, guessed, or another gateway's */
    }
    memcpy(phost, q ? q->phost : t->phost, sizeof(phost));
    pthread_mutex_unlock(&kv->lock);

    ok = peer_is_prefill(kv, (const char(*)[KVCTL_HOST_MAX])phost, peer);
    pthread_mutex_lock(&kv->lock);
    if (!ok) {
        pthread_mutex_unlock(&kv->lock);
        return "peer";
    }
    if ((q = find_waiter_locked(kv, id)) != NULL) {
        const char *why = NULL;
        if (q->notif_got >= q->notif_need)
            why = "surplus"; /* more than one per TP rank: a replay */
        else if (++q->notif_got >= q->notif_need)
            wake(q);
        pthread_mutex_unlock(&kv->lock);
        return why;
    }
    if ((t = find_tomb_locked(kv, id)) != NULL && t->has_dest) {
        /* The transfer of an attempt that already ended landed after all: release it. */
        kvctl_job_t *j = calloc(1, sizeof(*j));
        if (j != NULL) {
            j->cancel = 1;
            j->dest = t->dest;
            snprintf(j->id, sizeof(j->id), "%s", id);
            j->next = kv->jobs;
            kv->jobs = j;
            *late_release = 1;
        }
    }
    pthread_mutex_unlock(&kv->lock);
    return "late";
}

/* One notice, direct from an engine or <relayed> by a peer replica. */
static void take_notif(fwd_pd_kv_t *kv, const char *id, const char *peer, int relayed)
{
    int late_release = 0;
    const char *why = on_notif(kv, id, peer, &late_release);
    if (why == NULL) {
        count(kv, "proxy_notifs", "ProxyNotif messages accepted.");
        return;
    }
    if (kv->relay != NULL && !relayed && strcmp(why, "unknown") == 0) {
        /* Another replica's request, most likely: never relayed twice. */
        fwd_pd_relay_forward(kv->relay, id, peer);
        return;
    }
    fwd_pd_notif_count_rejected(kv->protocol, why);
    pdgw_fwd_log(PDGW_FWD_LOG_DEBUG, "%s: ProxyNotif{req_id=%.64s} from %s%s ignored: %s",
                 kv->protocol, id, peer[0] ? peer : "?", relayed ? " (relayed)" : "", why);
    if (late_release)
        count(kv, "late_kv_releases",
              "CancelNotifs re-sent for transfers that landed after their request ended.");
}

static void drain_notifs(fwd_pd_kv_t *kv)
{
    char id[KVCTL_ID_MAX], peer[INET6_ADDRSTRLEN + 8];
    while (kv->notif && fwd_pd_notif_recv(kv->notif, id, sizeof(id), peer, sizeof(peer)) == 1)
        take_notif(kv, id, peer, 0);
    while (kv->relay && fwd_pd_relay_recv(kv->relay, id, sizeof(id), peer, sizeof(peer)) == 1)
        take_notif(kv, id, peer, 1);
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
        char why[128];
        pdgw_fwd_status_t st;
        if (port_muted(kv, j->dest.host, j->dest.ports[i])) {
            failed = 1; /* did not answer lately: go on unreserved without waiting again */
            break;
        }
        st = pdgw_fwd_kv_reserve(kv->proxy, j->dest.host, j->dest.ports[i], j->id, j->chunks,
                                 j->ttl_ms, (int)kv->o.reserve_timeout_ms, &granted, &free_chunks,
                                 why, sizeof(why));
        if (st != PDGW_FWD_OK) {
            pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                         "%s: ReserveRequest %s to %s:%d: %s; not asking it again for %d ms",
                         kv->protocol, j->id, j->dest.host, j->dest.ports[i], why, KVCTL_MUTE_MS);
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
        char why[128];
        if (pdgw_fwd_kv_cancel(kv->proxy, j->dest.host, j->dest.ports[i], j->id, why,
                               sizeof(why)) != PDGW_FWD_OK)
            pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: CancelNotif %s to %s:%d: %s", kv->protocol, j->id,
                         j->dest.host, j->dest.ports[i], why);
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
    for (q = kv->notif_waiters; q != NULL; q = q->notif_next) {
        if (!q->notif_waiting || q->notif_got >= q->notif_need || q->notif_timed_out)
            continue;
        if (now >= q->notif_deadline_ms) {
            q->notif_timed_out = 1;
            wake(q);
        } else if (*next_ms < 0 || q->notif_deadline_ms < *next_ms) {
            *next_ms = q->notif_deadline_ms;
        }
    }
    for (kvctl_tomb_t **tp = &kv->tombs; *tp != NULL;) {
        kvctl_tomb_t *t = *tp;
        if (now - t->t_ms > KVCTL_TOMB_TTL_MS) {
            *tp = t->next;
            kv->n_tombs--;
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
        struct pollfd pf[4];
        int fds[2];
        int npf = 1, timeout = KVCTL_POLL_MS;
        int64_t next = -1, now;
        kvctl_job_t *j;
        uint64_t v;

        pf[0].fd = kv->efd;
        pf[0].events = POLLIN;
        if (kv->notif) {
            size_t nf = fwd_pd_notif_fds(kv->notif, fds);
            for (size_t i = 0; i < nf; i++) {
                pf[npf].fd = fds[i];
                pf[npf++].events = POLLIN;
            }
        }
        if (kv->relay && (pf[npf].fd = fwd_pd_relay_fd(kv->relay)) >= 0)
            pf[npf++].events = POLLIN;
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
    /* ProxyNotifs go to the checked listener below, not the client's own. */
    if (pdgw_fwd_kv_client_create(&kv->proxy, err, errlen) != PDGW_FWD_OK)
        goto err_efd;
    if (o->proxy && fwd_pd_notif_create(protocol, o, &kv->notif, err, errlen) != PDGW_FWD_OK)
        goto err_proxy;
    if (o->proxy && o->notif_relay_peers[0] != '\0' &&
        fwd_pd_relay_create(protocol, o, &kv->relay, err, errlen) != PDGW_FWD_OK)
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
                     fwd_pd_notif_port(kv->notif), o->curve_secret_key_file[0] ? " (CURVE)" : "",
                     wide ? " on every interface (proxy_host)" : "");
        if (kv->relay)
            pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: ProxyNotif relay on %s:%d, peers %s", protocol,
                         o->proxy_host, fwd_pd_relay_port(kv->relay), o->notif_relay_peers);
    }
    /* Show the counters at 0 from the start. */
    *out = kv;
    return PDGW_FWD_OK;

err_notif:
    fwd_pd_relay_destroy(kv->relay);
    fwd_pd_notif_destroy(kv->notif);
err_proxy:
    pdgw_fwd_kv_client_destroy(kv->proxy);
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
    while (kv->tombs) {
        kvctl_tomb_t *t = kv->tombs;
        kv->tombs = t->next;
        free(t);
    }
    fwd_pd_relay_destroy(kv->relay);
    fwd_pd_notif_destroy(kv->notif);
    pdgw_fwd_kv_client_destroy(kv->proxy);
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
    return kv && kv->notif ? fwd_pd_notif_port(kv->notif) : 0;
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

/* Register q for ProxyNotif (lock held): from now on its notices count. */
static void notif_register_locked(fwd_pd_kvreq_t *q, int need)
{
    fwd_pd_kv_t *kv = q->kv;
    if (q->notif_need > 0)
        return;
    q->notif_need = need;
    q->notif_next = kv->notif_waiters;
    kv->notif_waiters = q;
    atomic_fetch_add(&q->refs, 1);
}

void fwd_pd_kvreq_expect_notifs(fwd_pd_kvreq_t *q, int need, const pdgw_instance_t *prefill)
{
    fwd_pd_kv_t *kv = q->kv;
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

pdgw_fwd_status_t fwd_pd_kvreq_wait_notifs(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                                           int need, pdgw_fwd_error_t *err)
{
    fwd_pd_kv_t *kv = q->kv;
    int got, timed_out;
    (void)req;
    if (need <= 0 || kv->o.skip_proxy_notification)
        return PDGW_FWD_OK; /* engines that send no ProxyNotif: the decode goes at once */
    pthread_mutex_lock(&kv->lock);
    notif_register_locked(q, need);
    if (!q->notif_waiting) {
        q->notif_waiting = 1;
        q->notif_deadline_ms = now_ms() + kv->o.notif_timeout_ms;
    }
    got = q->notif_got;
    timed_out = q->notif_timed_out;
    need = q->notif_need;
    pthread_mutex_unlock(&kv->lock);
    if (got >= need)
        return PDGW_FWD_OK;
    if (timed_out) {
        count(kv, "notif_timeouts", "Requests whose ProxyNotifs did not all arrive in time.");
        if (kv->o.notif_fallback_decode) {
            /* notif_fallback: decode. The decode finds what landed and recomputes the rest. */
            count(kv, "notif_fallback_decodes",
                  "Decodes sent without every ProxyNotif after the deadline (they recompute).");
            return PDGW_FWD_OK;
        }
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
    /* Remember the ended attempt for a while: its late ProxyNotifs are told apart from unknown
     * ones, and a transfer that lands after a failure is released (bounded: past the cap late
     * notices just count as unknown). */
    if (q->notif_need > 0 && kv->n_tombs < KVCTL_TOMB_MAX) {
        kvctl_tomb_t *t = calloc(1, sizeof(*t));
        if (t != NULL) {
            snprintf(t->id, sizeof(t->id), "%s", q->id);
            t->dest = q->dest;
            t->has_dest = send_cancel;
            memcpy(t->phost, q->phost, sizeof(t->phost));
            t->t_ms = now_ms();
            t->next = kv->tombs;
            kv->tombs = t;
            kv->n_tombs++;
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
