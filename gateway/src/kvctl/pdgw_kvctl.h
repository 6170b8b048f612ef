/*
 * pdgw_kvctl.h - the KV control service behind forwarder.h (pdgw_fwd_kv_svc_*,
 * pdgw_fwd_kv_req_*): its objects, shared by
 *   pdgw_kvctl.c       life and the service thread (its jobs, deadlines),
 *   pdgw_kvctl_reserve.c ReserveRequests in flight (sent and collected by workers; the service
 *                      thread runs their deadlines and retries),
 *   pdgw_kvctl_notif.c ProxyNotif counting and sender checks (on the service thread),
 *   pdgw_kvctl_req.c   the per-attempt calls forwarders make from their request ops,
 *   pdgw_kvctl_index.c waiters and tombstones by request id.
 * Everything that may block (ZeroMQ round trips, name resolution) runs on the service thread.
 */
#ifndef PDGW_KVCTL_H
#define PDGW_KVCTL_H

#include <pdgw/forwarder.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pdgw_errors.h"
#include "pdgw_notif.h"

#define KVCTL_MAX_PORTS   16
#define KVCTL_ID_MAX      160
#define KVCTL_POLL_MS     20
#define KVCTL_TOMB_TTL_MS 120000
#define KVCTL_TOMB_MAX    16384 /* ended attempts remembered for late ProxyNotifs (bounded) */
#define KVCTL_HASH        4096  /* buckets of the waiter and tombstone indexes */
#define KVCTL_HOST_MAX    256
#define KVCTL_ADDRS       8
#define KVCTL_DNS_SLOTS   32
#define KVCTL_DNS_TTL_MS  30000
#define KVCTL_MUTE_MAX    64
#define KVCTL_MUTE_MS     5000 /* an alloc port that did not answer is not asked again for this */
#define KVCTL_ROOM_MAX    256  /* alloc ports whose last answered free_chunks is remembered */
#define KVCTL_ROOM_MS     1000 /* a decode leg goes ahead only on answers younger than this */

typedef enum { RES_NONE = 0, RES_ASKING, RES_GRANTED, RES_REFUSED, RES_FAILED } res_state_t;
typedef enum { ADM_NONE = 0, ADM_WAITING, ADM_HELD } adm_state_t;

typedef struct kvctl_dest {
    char host[256];
    int ports[KVCTL_MAX_PORTS];
    int nports;
} kvctl_dest_t;

struct pdgw_fwd_kv_req {
    pdgw_fwd_kv_svc_t *kv;
    atomic_int refs;
    pdgw_fwd_waker_t *waker;
    char id[KVCTL_ID_MAX];
    kvctl_dest_t dest;
    int have_dest;
    /* all below under kv->lock */
    int ended;
    adm_state_t adm;
    int64_t weight;
    struct pdgw_fwd_kv_req *adm_next;
    res_state_t res;
    int64_t res_chunks;
    int64_t free_chunks;
    int refused;    /* the last failure was a refused reservation */
    int ahead;      /* the leg went on before the reservation's answer (pdgw_kvctl_reserve.c) */
    int end_ok;     /* ended with the attempt complete (valid once ended) */
    int notif_need; /* > 0 once registered (in flight for ProxyNotif) */
    int notif_got;
    int notif_timed_out;
    int notif_waiting;             /* the decode gate is waiting: the deadline runs */
    int64_t notif_deadline_ms;     /* valid while notif_waiting */
    char phost[2][KVCTL_HOST_MAX]; /* the prefill's host and kv_host ("" = unknown) */
    struct pdgw_fwd_kv_req *notif_next, *notif_prev; /* kv->notif_waiters */
    struct pdgw_fwd_kv_req *hnext;                   /* kv->waiter_hash bucket */
    struct pdgw_fwd_kv_req *wake_next;               /* kv->wakes */
    int wake_listed;                                 /* in kv->wakes (holds a reference) */
};

typedef struct kvctl_job {
    struct kvctl_job *next;
    int cancel; /* 0 reserve, 1 cancel */
    int skip;   /* reserve of an attempt that already ended */
    int64_t not_before_ms;
    pdgw_fwd_kv_req_t *q; /* reserve: referenced */
    kvctl_dest_t dest;
    char id[KVCTL_ID_MAX];
    int64_t chunks, ttl_ms, timeout_ms;
    /* a reservation in flight (pdgw_kvctl_reserve.c; under client_lock) */
    unsigned char res_asked[KVCTL_MAX_PORTS]; /* asked, no answer yet */
    int res_waiting;                          /* how many of them */
    int res_granted_all, res_failed;
    int res_watched;      /* the worker that sent it is woken by its answers */
    int res_may_go_ahead; /* sent from the gate: its request may go on before the answers */
    int res_ahead;        /* ... and does: the answers only update the ports' room */
    int64_t res_min_free, res_deadline_ms;
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
    struct kvctl_tomb *next;  /* kv->tombs, oldest first */
    struct kvctl_tomb *hnext; /* kv->tomb_hash bucket */
    char id[KVCTL_ID_MAX];
    kvctl_dest_t dest;
    int has_dest; /* the decode runs libkvt: a late landing is released with CancelNotif */
    char phost[2][KVCTL_HOST_MAX];
    int64_t t_ms;
} kvctl_tomb_t;

struct pdgw_fwd_kv_svc {
    char protocol[64];
    pdgw_fwd_kv_opts_t o;
    pdgw_fwd_kv_client_t *proxy; /* the gateway's KV control client (Reserve, Cancel) */
    pdgw_notif_t *notif;         /* the ProxyNotif PULL (o.proxy) */
    pdgw_notif_relay_t *relay;   /* notices for requests other replicas own (notif_relay_peers) */
    int efd;
    pthread_t th;
    int started;
    pthread_mutex_t lock;
    int stop;
    kvctl_job_t *jobs;
    /* The KV control client (proxy), the reservations waiting for their answers (asking) and
     * the muted ports: a worker sends its own ReserveRequest and is woken by the answer, with
     * no hand-off between threads before the decode leg (pdgw_kvctl_reserve.c). Never held
     * with kv->lock. */
    pthread_mutex_t client_lock;
    kvctl_job_t *asking;
    int asking_unwatched; /* of them, those no worker watches: the thread polls for them */
    int64_t ctl_wake_ms;  /* the thread sleeps until then at the latest */
    kvctl_tomb_t *tombs, *tomb_tail; /* oldest first */
    size_t n_tombs;
    kvctl_tomb_t *tomb_hash[KVCTL_HASH];
    kvctl_dns_t dns[KVCTL_DNS_SLOTS]; /* control thread only */
    struct {
        char host[256];
        int port;
        int64_t until_ms;
    } mute[KVCTL_MUTE_MAX]; /* under client_lock */
    struct {
        char host[256];
        int port;
        int64_t free_chunks; /* in its last answer to this gateway */
        int64_t t_ms;        /* when that answer arrived (0: unused entry) */
    } room[KVCTL_ROOM_MAX];  /* under client_lock */
    pdgw_fwd_kv_req_t *notif_waiters;
    pdgw_fwd_kv_req_t *waiter_hash[KVCTL_HASH];
    int64_t next_deadline_ms; /* no notif deadline falls before this (-1: none armed) */
    pdgw_fwd_kv_req_t *adm_head, *adm_tail;
    int64_t adm_used;
    pdgw_fwd_kv_req_t *wakes;         /* to wake once the lock is dropped (pdgw_kvctl_unlock) */
    struct pdgw_fwd_kv_svc *next_svc; /* the gateway's list of open services */
};

/* Stop the thread of every open service once its queued jobs (CancelNotifs of the attempts
 * that just ended) went out: the server calls it at shutdown, after its workers stopped and
 * before the forwarder's destroy closes the services. Idempotent. */
void pdgw_kvctl_shutdown(void);

/* ---- reload (pdgw_kvctl_reload.c) ---- */
struct pdgw_reload;
/* Apply the live protocol options of a reload to every open service. */
pdgw_status_t pdgw_kvctl_reload_register(struct pdgw_reload *rl);
/* The live fields of <o> (timeouts, refusal mode, admission capacity) into <kv> / every open
 * service (pdgw_kvctl.c walks them); waiters that now fit are admitted. */
void pdgw_kvctl_apply(pdgw_fwd_kv_svc_t *kv, const pdgw_fwd_kv_opts_t *o);
void pdgw_kvctl_apply_all(const pdgw_fwd_kv_opts_t *o);
/* Whether any service is open (a reload has something to apply the options to). */
bool pdgw_kvctl_any_open(void);

/* Wake the service thread (after queueing a job or arming a deadline). */
void pdgw_kvctl_kick(pdgw_fwd_kv_svc_t *kv);
/* Drop one reference of <q> (the attempt and the thread each hold one). */
void pdgw_kvctl_req_unref(pdgw_fwd_kv_req_t *q);
/* Queue CancelNotif{id} to every port of <dest> (lock held): first with <urgent> (releases
 * go before reservations), else last. 0 on no memory. */
int pdgw_kvctl_push_cancel_locked(pdgw_fwd_kv_svc_t *kv, const kvctl_dest_t *dest, const char *id,
                                  int urgent);
/* Grant queued admissions that fit, in order; all of them when admission is off (lock held). */
void pdgw_kvctl_adm_grant_locked(pdgw_fwd_kv_svc_t *kv);
/* ---- waiters and tombstones by request id (pdgw_kvctl_index.c; kv->lock held) ---- */
void pdgw_kvctl_waiter_add_locked(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q);
/* 1 when <q> was a waiter (and is no more), else 0. */
int pdgw_kvctl_waiter_remove_locked(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q);
pdgw_fwd_kv_req_t *pdgw_kvctl_waiter_find_locked(pdgw_fwd_kv_svc_t *kv, const char *id);
/* Takes <t> (allocated with pdgw_alloc); at KVCTL_TOMB_MAX the oldest one is dropped. */
void pdgw_kvctl_tomb_add_locked(pdgw_fwd_kv_svc_t *kv, kvctl_tomb_t *t);
kvctl_tomb_t *pdgw_kvctl_tomb_find_locked(pdgw_fwd_kv_svc_t *kv, const char *id);
/* Drop the tombstones older than <ttl_ms>. */
void pdgw_kvctl_tombs_expire_locked(pdgw_fwd_kv_svc_t *kv, int64_t now_ms, int64_t ttl_ms);

/* A worker's loop saw a KV control socket it watches (pdgw_worker_watch_kvctl) ready: take
 * what arrived on every open service's sockets. */
void pdgw_kvctl_worker_ready(void);

/* Read every queued notice of the listener and the relay (service thread). */
void pdgw_kvctl_drain_notifs(pdgw_fwd_kv_svc_t *kv);

/* ---- reservations in flight (pdgw_kvctl_reserve.c; workers and the service thread) ---- */
/* Ask every port of <j> (owned from here on; any thread, neither lock held): it waits on
 * kv->asking for its answers, or ends at once (a port muted or not reachable). A worker
 * calling it is woken by the answers (pdgw_worker_watch_kvctl). With j->res_may_go_ahead,
 * *ahead_room (may be NULL) is -1 unless the request goes on now, without the answers: every
 * port's last answer (at most KVCTL_ROOM_MS old), less the chunks still asked of that port,
 * leaves room for this request twice over; it is then the least room left after this request
 * by that count, and the answers only count and update the ports' room. 1 when the service
 * thread must be kicked to look after it (it would not poll for its answers, or it sleeps
 * past its deadline), else 0. */
int pdgw_kvctl_reserve_start(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int64_t *ahead_room);
/* No reservation waits for an answer. */
bool pdgw_kvctl_reserve_idle(pdgw_fwd_kv_svc_t *kv);
/* Take every answer that arrived (any thread); a reservation with all of them ends. */
void pdgw_kvctl_reserve_drain(pdgw_fwd_kv_svc_t *kv);
/* The earliest deadline of the reservations in flight (-1: none; client_lock held). */
int64_t pdgw_kvctl_reserve_next_locked(pdgw_fwd_kv_svc_t *kv);
/* End the reservations whose time ran out (all of them when <stopping>): their silent ports
 * are muted; *next_ms gets the earliest deadline still armed. */
void pdgw_kvctl_reserve_expire(pdgw_fwd_kv_svc_t *kv, int64_t now, int stopping, int64_t *next_ms);

/* ---- the KV control client's asynchronous reservations (pdgw_fwd_kv.c) ---- */
typedef struct pdgw_kvctl_answer {
    char ep[300]; /* the port's endpoint, as pdgw_kvctl_client_endpoint writes it */
    char req_id[256];
    int granted;
    int64_t free_chunks;
} pdgw_kvctl_answer_t;
/* Send ReserveRequest{id, chunks, ttl_ms} to host:port; 0, or -1 with <why>. */
int pdgw_kvctl_client_reserve_send(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                   const char *id, int64_t chunks, int64_t ttl_ms, char *why,
                                   size_t cap);
/* 1 with the next ReserveResponse that arrived, 0 when none waits. */
int pdgw_kvctl_client_reserve_recv(pdgw_fwd_kv_client_t *c, pdgw_kvctl_answer_t *a);
/* The descriptors to poll for answers (edge-style: drain before waiting). */
size_t pdgw_kvctl_client_fds(pdgw_fwd_kv_client_t *c, int *fds, size_t max);
/* The descriptor of host:port's socket (-1: none is open). */
int pdgw_kvctl_client_fd(pdgw_fwd_kv_client_t *c, const char *host, int port);
/* Close host:port's socket (its answer came too late to be used). */
void pdgw_kvctl_client_forget(pdgw_fwd_kv_client_t *c, const char *host, int port);
void pdgw_kvctl_client_endpoint(const char *host, int port, char *ep, size_t cap);

/* Wake <q>'s request once the lock is dropped (lock held): a worker woken while the lock is
 * still held would block on it at once. */
static inline void pdgw_kvctl_wake_locked(pdgw_fwd_kv_req_t *q)
{
    if (q->waker == NULL || q->wake_listed)
        return;
    q->wake_listed = 1;
    atomic_fetch_add(&q->refs, 1);
    q->wake_next = q->kv->wakes;
    q->kv->wakes = q;
}
/* Drop kv->lock, then wake the requests pdgw_kvctl_wake_locked listed. */
void pdgw_kvctl_unlock(pdgw_fwd_kv_svc_t *kv);

static inline void pdgw_kvctl_count(pdgw_fwd_kv_svc_t *kv, const char *name, const char *help)
{
    pdgw_fwd_counter_inc(kv->protocol, name, help);
}

#endif /* PDGW_KVCTL_H */
