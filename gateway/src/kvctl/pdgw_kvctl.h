/*
 * pdgw_kvctl.h - the KV control service behind forwarder.h (pdgw_fwd_kv_svc_*,
 * pdgw_fwd_kv_req_*): its objects, shared by
 *   pdgw_kvctl.c         life: open, stop, close, the job queue, wakes
 *   pdgw_kvctl_thread.c  the service thread: sleeps until its earliest timer or a kick
 *   pdgw_kvctl_timers.c  the deadlines on the service's timer heaps (ProxyNotif waits,
 *                        delayed reservations, tombstone expiry)
 *   pdgw_kvctl_svcs.c    the services one server owns (stop, reload, worker wakes)
 *   pdgw_kvctl_reserve.c ReserveRequests in flight (sent and collected by workers; their
 *                        deadlines are timers the service thread runs),
 *   pdgw_kvctl_notif.c   ProxyNotif counting and sender checks (on the service thread),
 *   pdgw_kvctl_req.c     the per-attempt calls forwarders make from their request ops,
 *   pdgw_kvctl_index.c   waiters and tombstones by request id.
 * Everything that may block (ZeroMQ round trips, name resolution) runs on the service thread.
 */
#ifndef PDGW_KVCTL_H
#define PDGW_KVCTL_H

#include <pdgw/forwarder.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pdb/pdb_clock.h"
#include "pdb/pdb_timer.h"
#include "pdgw_errors.h"
#include "pdgw_notif.h"

#define KVCTL_MAX_PORTS   16
#define KVCTL_ID_MAX      160
#define KVCTL_NEVER       INT64_MAX /* a sleep with no timer armed */
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
    int notif_waiting; /* the decode gate is waiting: the deadline runs */
    /* The wait's deadline, on kv->timers while it runs (its .due stays readable). The wait
     * holds the waiter's reference, and pdgw_fwd_kv_req_end cancels it, so it never fires for
     * an attempt that is gone (pdgw_kvctl_timers.c says why not the request's worker timer). */
    pdb_timer_t notif_timer;
    char phost[2][KVCTL_HOST_MAX];     /* the prefill's host and kv_host ("" = unknown) */
    struct kvctl_job *delayed;         /* its reservation retry waiting on kv->timers */
    struct pdgw_fwd_kv_req *adm_prev;  /* kv->adm_head queue */
    struct pdgw_fwd_kv_req *hnext;     /* kv->waiter_hash bucket */
    struct pdgw_fwd_kv_req *wake_next; /* kv->wakes */
    int wake_listed;                   /* in kv->wakes (holds a reference) */
};

typedef struct kvctl_job {
    struct kvctl_job *next; /* kv->jobs, or kv->asking */
    struct kvctl_job *prev; /* kv->asking */
    int cancel;             /* 0 reserve, 1 cancel */
    int skip;               /* reserve of an attempt that already ended */
    pdb_timer_t delay;      /* a retry until it is due (kv->timers, under kv->lock) */
    pdb_timer_t res_timer;  /* a reservation's deadline (kv->res_timers, under client_lock) */
    pdgw_fwd_kv_req_t *q;   /* reserve: referenced */
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

/* An attempt that ended: its late ProxyNotifs are told apart from unknown ones, and a transfer
 * that lands after an attempt that did not complete is released with another CancelNotif. */
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
    pdb_clock_t clock;         /* every time the service reads (tests drive it by hand) */
    pdgw_fwd_kv_svcs_t *owner; /* the server's set it is in (NULL: its forwarder alone) */
    pdgw_fwd_kv_svc_t *owner_next, *owner_prev;
    pdgw_fwd_kv_client_t *proxy; /* the gateway's KV control client (Reserve, Cancel) */
    pdgw_notif_t *notif;         /* the ProxyNotif PULL (o.proxy) */
    pdgw_notif_relay_t *relay;   /* notices for requests other replicas own (notif_relay_peers) */
    int efd;
    pthread_t th;
    int started;
    pthread_mutex_t lock;
    int stop;
    kvctl_job_t *jobs, *jobs_tail; /* due now, in order (urgent releases at the head) */
    size_t n_delayed;              /* reservation retries not due yet (on kv->timers) */
    /* Under kv->lock: ProxyNotif deadlines, delayed jobs and the tombstones' expiry. The
     * thread looks at this heap again by sleep_until at the latest, so an arm sooner than that
     * kicks it and any later one does not (pdgw_kvctl_timers.c). */
    pdb_timers_t timers;
    int64_t sleep_until;
    pdb_timer_t tomb_timer; /* the oldest tombstone's expiry */
    uint64_t timers_fired;  /* callbacks run from kv->timers (tests: expiry is not a walk) */
    uint64_t turns;         /* turns of the service thread's loop */
    int64_t turn_ms;        /* the clock its last turn ran the timers at */
    /* The KV control client (proxy), the reservations waiting for their answers (asking) and
     * the muted ports: a worker sends its own ReserveRequest and is woken by the answer, with
     * no hand-off between threads before the decode leg (pdgw_kvctl_reserve.c). Never held
     * with kv->lock. */
    pthread_mutex_t client_lock;
    kvctl_job_t *asking;
    int asking_unwatched; /* of them, those no worker watches: the thread polls for them */
    /* Under client_lock: the reservations' deadlines, and when the thread looks at them again
     * at the latest (a reservation due sooner kicks it). */
    pdb_timers_t res_timers;
    int64_t res_sleep_until;
    kvctl_job_t *res_expired; /* ended by their timers, finished once client_lock is dropped */
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
    pdgw_fwd_kv_req_t *waiter_hash[KVCTL_HASH];
    pdgw_fwd_kv_req_t *adm_head, *adm_tail;
    int64_t adm_used;
    pdgw_fwd_kv_req_t *wakes; /* to wake once the lock is dropped (pdgw_kvctl_unlock) */
};

/* pdgw_fwd_kv_svc_open on <clock> (NULL: CLOCK_MONOTONIC); tests drive time with it. */
pdgw_fwd_status_t pdgw_kvctl_open(const pdgw_fwd_env_t *env, const pdgw_fwd_kv_opts_t *o,
                                  const pdb_clock_t *clock, pdgw_fwd_kv_svc_t **out, char *err,
                                  size_t errlen);
/* Stop <kv>'s thread once its queued jobs (CancelNotifs of the attempts that just ended) went
 * out. Idempotent; the owner calls it at shutdown, close calls it too. */
void pdgw_kvctl_stop(pdgw_fwd_kv_svc_t *kv);
/* The service thread (pdgw_kvctl_thread.c). */
void *pdgw_kvctl_thread_main(void *arg);
/* Now on the service's clock, in milliseconds. */
static inline int64_t pdgw_kvctl_now_ms(const pdgw_fwd_kv_svc_t *kv)
{
    return (int64_t)(pdb_clock_now(&kv->clock) / PDB_NSEC_PER_MSEC);
}

/* ---- the services a server owns (pdgw_kvctl_svcs.c) ----
 * The server makes the set, hands it to the forwarder's configure (pdgw_fwd_env_t.kv_svcs),
 * where pdgw_fwd_kv_svc_open puts the service it opens; shutdown, reload and its workers'
 * socket events reach the services through it. A service leaves it when it closes. */
pdgw_fwd_kv_svcs_t *pdgw_kvctl_svcs_create(void);
/* Free the set; services still in it (not closed yet) are left alone, owned by nobody. */
void pdgw_kvctl_svcs_destroy(pdgw_fwd_kv_svcs_t *set);
void pdgw_kvctl_svcs_add(pdgw_fwd_kv_svcs_t *set, pdgw_fwd_kv_svc_t *kv);
void pdgw_kvctl_svcs_remove(pdgw_fwd_kv_svc_t *kv);
/* Stop every service's thread once its queued jobs went out: the server calls it at shutdown,
 * after its workers stopped and before the forwarder's destroy closes the services.
 * Idempotent. */
void pdgw_kvctl_svcs_stop(pdgw_fwd_kv_svcs_t *set);
/* A worker's loop saw a KV control socket it watches (pdgw_worker_watch_kvctl) ready: take
 * what arrived on every service's sockets. */
void pdgw_kvctl_svcs_worker_ready(pdgw_fwd_kv_svcs_t *set);
/* The live fields of <o> into every service of <set> (pdgw_kvctl_apply). */
void pdgw_kvctl_svcs_apply(pdgw_fwd_kv_svcs_t *set, const pdgw_fwd_kv_opts_t *o);
/* Whether the set holds a service (a reload has something to apply the options to). */
bool pdgw_kvctl_svcs_any(pdgw_fwd_kv_svcs_t *set);

/* ---- reload (pdgw_kvctl_reload.c) ---- */
struct pdgw_reload;
/* Apply the live protocol options of a reload to every service of <set>. */
pdgw_status_t pdgw_kvctl_reload_register(struct pdgw_reload *rl, pdgw_fwd_kv_svcs_t *set);
/* The live fields of <o> (timeouts, refusal mode, admission capacity) into <kv>; waiters that
 * now fit are admitted. */
void pdgw_kvctl_apply(pdgw_fwd_kv_svc_t *kv, const pdgw_fwd_kv_opts_t *o);

/* ---- timers (pdgw_kvctl_timers.c; kv->lock held) ---- */
/* Arm <q>'s ProxyNotif deadline <timeout_ms> from now; 1 when the thread must be kicked (it
 * sleeps past it), 0 else. With no memory for the timer the wait times out at once. */
int pdgw_kvctl_notif_deadline_arm_locked(pdgw_fwd_kv_req_t *q, int64_t timeout_ms);
void pdgw_kvctl_notif_deadline_cancel_locked(pdgw_fwd_kv_req_t *q);
/* Queue <j> for the thread at <due_ms> (on kv->timers until then); 1 when the thread must be
 * kicked. */
int pdgw_kvctl_job_delay_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int64_t due_ms);
/* Drop <q>'s delayed reservation (its attempt ended): the job and its reference. */
void pdgw_kvctl_job_delay_drop_locked(pdgw_fwd_kv_req_t *q);
/* Arm the tombstones' expiry for the oldest one (none: disarm). */
void pdgw_kvctl_tomb_timer_update_locked(pdgw_fwd_kv_svc_t *kv);
/* Whether a timer due at <due_ms> needs the thread kicked: it sleeps past it. */
static inline int pdgw_kvctl_sooner_locked(const pdgw_fwd_kv_svc_t *kv, int64_t due_ms)
{
    return due_ms < kv->sleep_until;
}

/* Wake the service thread (after queueing a job or arming a deadline it would sleep past). */
void pdgw_kvctl_kick(pdgw_fwd_kv_svc_t *kv);
/* Drop one reference of <q> (the attempt and the thread each hold one). */
void pdgw_kvctl_req_unref(pdgw_fwd_kv_req_t *q);
/* Queue <j> for the thread now (lock held): first with <urgent>, else last. */
void pdgw_kvctl_job_queue_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int urgent);
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

/* Read every queued notice of the listener and the relay (service thread). */
void pdgw_kvctl_drain_notifs(pdgw_fwd_kv_svc_t *kv);

/* ---- reservations in flight (pdgw_kvctl_reserve.c; workers and the service thread) ---- */
/* Ask every port of <j> (owned from here on; any thread, neither lock held): it waits on
 * kv->asking for its answers until its deadline (a timer on kv->res_timers), or ends at once
 * (a port muted or not reachable, or no memory for its timer). A worker
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
/* Run the reservations' timers due at <now> (their silent ports are muted), or with
 * <stopping> end every reservation in flight; the earliest deadline still armed (-1: none).
 * Neither lock held. */
int64_t pdgw_kvctl_reserve_expire(pdgw_fwd_kv_svc_t *kv, int64_t now, int stopping);

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
