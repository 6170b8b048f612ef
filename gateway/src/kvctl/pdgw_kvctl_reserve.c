/*
 * pdgw_kvctl_reserve.c - ReserveRequests of the KV control service, any number in flight at
 * once.
 *
 * A reservation asks every alloc port (TP rank) of the chosen decode at once and waits for
 * their answers among the thread's other work: the answers arrive on the client's sockets,
 * which the thread polls beside its notices. Waiting for each answer in turn would hold every
 * other reservation, ProxyNotif and deadline of the protocol behind the slowest receiver, and
 * one that does not answer would stop them all for reserve_timeout_ms.
 *
 * The worker whose request needs the reservation sends it and is woken by its answer
 * (kv->client_lock guards the client, the reservations in flight and the muted ports): the
 * worker's loop watches the socket and collects what arrived (pdgw_kvctl_svcs_worker_ready), so
 * the decode leg waits for no hand-over between threads. Each reservation's deadline is a
 * timer on kv->res_timers (under client_lock) that the service thread runs; the thread polls
 * the sockets itself only for reservations no worker watches (those it sent, retries after a
 * refusal; or a watch that failed), and drains them at every turn anyway.
 *
 * The sockets' descriptors are edge-style (ZMQ_FD): any call on a socket, a send too, may
 * take the readiness of an answer that is waiting. So every send is followed by a drain
 * under the same lock, and a drain always reads to the end, stray answers included.
 *
 * Outcome per request, as before: granted by every port, refused by one, or failed (a port did
 * not answer in time, could not be asked, or was muted: it did not answer lately and is not
 * asked again for KVCTL_MUTE_MS); the request goes on unreserved after a failure.
 *
 * Going ahead: the answer costs a round trip through both sides' ZeroMQ threads and the
 * receiver's, on the path of every request, while a decode with room grants nearly every
 * reservation. So each port's free_chunks from its last answer is remembered, and a request
 * whose decode's ports all answered within KVCTL_ROOM_MS with room for it twice over, after
 * the chunks of every reservation still unanswered by that port, goes on without waiting.
 * Its ReserveRequest is still sent first (the receiver meets it before the transfer it
 * covers), and its answer only counts. Room this gateway does not know of (another
 * gateway's reservations since the last answer) can still refuse it: the transfer then runs
 * unreserved, as after a reservation that failed, and reserve_ahead_refused counts it. A
 * decode short of room, or not heard from lately, is waited for as before.
 */
#include "pdgw_kvctl.h"

#include <errno.h>
#include <sys/epoll.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_server_int.h" /* the worker whose loop watches a socket */

/* Wake the calling worker's loop when <fd> (a KV control socket) is readable; the loop then
 * collects what arrived (pdgw_kvctl_svcs_worker_ready). Level-triggered: every wake drains. The
 * watch ends with the socket, whose close drops it from the set. Watching twice is harmless.
 * 0, or -1 when the caller is not a worker thread or <fd> cannot be watched. */
static int watch_on_this_worker(int fd)
{
    pdgw_worker_t *w = pdgw_this_worker;
    struct epoll_event ev = {.events = EPOLLIN};
    if (w == NULL || fd < 0)
        return -1;
    ev.data.u64 = ((uint64_t)PDGW_EV_KVCTL << 32) | (uint32_t)fd;
    return epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST ? 0 : -1;
}

static int port_muted(pdgw_fwd_kv_svc_t *kv, const char *host, int port, int64_t now)
{
    for (int i = 0; i < KVCTL_MUTE_MAX; i++)
        if (kv->mute[i].port == port && kv->mute[i].until_ms > now &&
            strcmp(kv->mute[i].host, host) == 0)
            return 1;
    return 0;
}

static void port_mute(pdgw_fwd_kv_svc_t *kv, const char *host, int port, int64_t now)
{
    int slot = 0;
    for (int i = 0; i < KVCTL_MUTE_MAX; i++)
        if (kv->mute[i].until_ms < kv->mute[slot].until_ms)
            slot = i; /* the oldest (or an unused) entry */
    snprintf(kv->mute[slot].host, sizeof(kv->mute[slot].host), "%s", host);
    kv->mute[slot].port = port;
    kv->mute[slot].until_ms = now + KVCTL_MUTE_MS;
}

/* Hand the outcome to the request, free the job. */
static void finish(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j)
{
    int failed = j->res_failed, granted_all = j->res_waiting == 0 && j->res_granted_all;
    pthread_mutex_lock(&kv->lock);
    if (!j->q->ended) {
        j->q->free_chunks = j->res_min_free;
        j->q->res = failed ? RES_FAILED : granted_all ? RES_GRANTED : RES_REFUSED;
        if (!j->res_ahead) /* a request that went ahead waits for nothing here */
            pdgw_kvctl_wake_locked(j->q);
    } else if (!failed && !j->q->end_ok) {
        /* The attempt ended unfinished while we asked: give the pages back at once. (A
         * completed one, gone ahead of its answer, had its transfer draw from them.) */
        (void)pdgw_kvctl_push_cancel_locked(kv, &j->dest, j->id, 1);
    }
    pdgw_kvctl_unlock(kv);
    if (j->res_ahead && !failed && !granted_all)
        pdgw_kvctl_count(kv, "reserve_ahead_refused",
                         "ReserveRequests refused after their request went on without waiting "
                         "(the decode had less room than its last answers said).");
    pdgw_kvctl_count(kv,
                     failed        ? "reserve_errors"
                     : granted_all ? "reserve_granted"
                                   : "reserve_refused",
                     failed        ? "ReserveRequests without an answer."
                     : granted_all ? "ReserveRequests granted."
                                   : "ReserveRequests refused.");
    pdgw_kvctl_req_unref(j->q);
    pdgw_free(j);
}

/* finish() each job of the list <done> (taken off kv->asking; client_lock not held: each
 * takes kv->lock). */
static void finish_all(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *done)
{
    while (done != NULL) {
        kvctl_job_t *j = done;
        done = j->next;
        finish(kv, j);
    }
}

/* Remember <port>'s room from its answer (client_lock held): its own entry, else an unused or
 * the oldest one. */
static void room_note(pdgw_fwd_kv_svc_t *kv, const char *host, int port, int64_t free_chunks,
                      int64_t now)
{
    int slot = 0;
    for (int i = 0; i < KVCTL_ROOM_MAX; i++) {
        if (kv->room[i].t_ms != 0 && kv->room[i].port == port &&
            strcmp(kv->room[i].host, host) == 0) {
            slot = i;
            break;
        }
        if (kv->room[i].t_ms < kv->room[slot].t_ms)
            slot = i;
    }
    snprintf(kv->room[slot].host, sizeof(kv->room[slot].host), "%s", host);
    kv->room[slot].port = port;
    kv->room[slot].free_chunks = free_chunks;
    kv->room[slot].t_ms = now;
}

/* The room <port> has left by this gateway's count (client_lock held): its last answer's
 * free_chunks less the chunks of the reservations it has not answered yet; -1 when it did not
 * answer within KVCTL_ROOM_MS. */
static int64_t room_left(pdgw_fwd_kv_svc_t *kv, const char *host, int port, int64_t now)
{
    int64_t left = -1;
    for (int i = 0; i < KVCTL_ROOM_MAX; i++) {
        if (kv->room[i].t_ms != 0 && kv->room[i].port == port &&
            strcmp(kv->room[i].host, host) == 0) {
            if (now - kv->room[i].t_ms <= KVCTL_ROOM_MS)
                left = kv->room[i].free_chunks;
            break;
        }
    }
    for (kvctl_job_t *a = kv->asking; a != NULL && left >= 0; a = a->next)
        for (int k = 0; k < a->dest.nports; k++)
            if (a->res_asked[k] && a->dest.ports[k] == port && strcmp(a->dest.host, host) == 0)
                left -= a->chunks;
    return left;
}

/* Whether <j>'s request may go on before its answers (client_lock held; j not asking yet):
 * every port has room for it twice over. *least gets the least room left after it. */
static int room_for_ahead(pdgw_fwd_kv_svc_t *kv, const kvctl_job_t *j, int64_t now, int64_t *least)
{
    *least = -1;
    if (j->dest.nports == 0)
        return 0;
    for (int i = 0; i < j->dest.nports; i++) {
        int64_t left = room_left(kv, j->dest.host, j->dest.ports[i], now);
        if (left < 2 * j->chunks)
            return 0;
        if (*least < 0 || left - j->chunks < *least)
            *least = left - j->chunks;
    }
    return 1;
}

/* Unlink <j> from the reservations in flight and disarm its deadline (client_lock held). */
static void unlink_asking(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j)
{
    if (j->prev != NULL)
        j->prev->next = j->next;
    else
        kv->asking = j->next;
    if (j->next != NULL)
        j->next->prev = j->prev;
    j->next = j->prev = NULL;
    pdb_timer_cancel(&kv->res_timers, &j->res_timer);
    if (!j->res_watched)
        kv->asking_unwatched--;
}

/* <j>'s time ran out (client_lock held): its silent ports are muted, unless <stopping>; it
 * goes onto kv->res_expired to be finished once the lock is dropped. */
static void expire_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int64_t now, int stopping)
{
    for (int i = 0; i < j->dest.nports && !stopping; i++) {
        if (!j->res_asked[i])
            continue;
        pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                     "%s: ReserveRequest %s to %s:%d: no answer within %lld ms; not asking "
                     "it again for %d ms",
                     kv->protocol, j->id, j->dest.host, j->dest.ports[i], (long long)j->timeout_ms,
                     KVCTL_MUTE_MS);
        port_mute(kv, j->dest.host, j->dest.ports[i], now);
        /* its answer may still come: on a socket of its own, never taken for another */
        pdgw_kvctl_client_forget(kv->proxy, j->dest.host, j->dest.ports[i]);
    }
    unlink_asking(kv, j);
    j->res_failed = 1;
    j->next = kv->res_expired;
    kv->res_expired = j;
}

static void on_reserve_deadline(pdb_timer_t *t, uint64_t now)
{
    kvctl_job_t *j = t->arg;
    expire_locked(j->q->kv, j, (int64_t)now, 0);
}

/* The job asking <ep> about <id>, and which of its ports <ep> is (NULL when none: a late or
 * stray answer). */
static kvctl_job_t *asking_find(pdgw_fwd_kv_svc_t *kv, const char *ep, const char *id, int *port)
{
    for (kvctl_job_t *j = kv->asking; j != NULL; j = j->next) {
        if (strcmp(j->id, id) != 0)
            continue;
        for (int i = 0; i < j->dest.nports; i++) {
            char mine[300];
            if (!j->res_asked[i])
                continue;
            pdgw_kvctl_client_endpoint(j->dest.host, j->dest.ports[i], mine, sizeof(mine));
            if (strcmp(mine, ep) == 0) {
                *port = i;
                return j;
            }
        }
    }
    return NULL;
}

/* Take every answer that arrived (client_lock held): reservations with all of theirs go onto
 * *done. Reads to the end even with nothing asking, so the sockets' descriptors are ready
 * again for the next answer. */
static void drain_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t **done)
{
    pdgw_kvctl_answer_t a;
    while (pdgw_kvctl_client_reserve_recv(kv->proxy, &a)) {
        int i;
        kvctl_job_t *j = asking_find(kv, a.ep, a.req_id, &i);
        if (j == NULL)
            continue; /* its request gave up on it already */
        j->res_asked[i] = 0;
        j->res_waiting--;
        if (a.free_chunks >= 0)
            room_note(kv, j->dest.host, j->dest.ports[i], a.free_chunks, pdgw_kvctl_now_ms(kv));
        if (!a.granted)
            j->res_granted_all = 0;
        if (a.free_chunks >= 0 && (j->res_min_free < 0 || a.free_chunks < j->res_min_free))
            j->res_min_free = a.free_chunks;
        if (j->res_waiting == 0) {
            unlink_asking(kv, j);
            j->next = *done;
            *done = j;
        }
    }
}

int pdgw_kvctl_reserve_start(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int64_t *ahead_room)
{
    int64_t now = pdgw_kvctl_now_ms(kv), least = -1;
    kvctl_job_t *done = NULL;
    int kick;
    j->res_granted_all = 1;
    j->res_min_free = -1;
    j->res_waiting = 0;
    j->res_watched = 1;
    pthread_mutex_lock(&kv->client_lock);
    /* decided before this job counts among those asking */
    j->res_ahead = j->res_may_go_ahead && room_for_ahead(kv, j, now, &least);
    if (ahead_room != NULL)
        *ahead_room = j->res_ahead ? least : -1;
    for (int i = 0; i < j->dest.nports && !j->res_failed; i++) {
        char why[128];
        if (port_muted(kv, j->dest.host, j->dest.ports[i], now)) {
            j->res_failed = 1; /* did not answer lately: go on unreserved without waiting */
            break;
        }
        if (pdgw_kvctl_client_reserve_send(kv->proxy, j->dest.host, j->dest.ports[i], j->id,
                                           j->chunks, j->ttl_ms, why, sizeof(why)) != 0) {
            pdgw_fwd_log(PDGW_FWD_LOG_WARN,
                         "%s: ReserveRequest %s to %s:%d: %s; not asking it again for %d ms",
                         kv->protocol, j->id, j->dest.host, j->dest.ports[i], why, KVCTL_MUTE_MS);
            port_mute(kv, j->dest.host, j->dest.ports[i], now);
            j->res_failed = 1;
            break;
        }
        j->res_asked[i] = 1;
        j->res_waiting++;
        /* the calling worker is woken by the answer; any other thread leaves it to the
         * service thread's poll */
        if (watch_on_this_worker(pdgw_kvctl_client_fd(kv->proxy, j->dest.host, j->dest.ports[i])) !=
            0)
            j->res_watched = 0;
    }
    if (j->res_failed || j->res_waiting == 0) {
        drain_locked(kv, &done);
        pthread_mutex_unlock(&kv->client_lock);
        finish(kv, j);
        finish_all(kv, done);
        return 0;
    }
    j->res_deadline_ms = now + (j->timeout_ms > 0 ? j->timeout_ms : 0);
    pdb_timer_init(&j->res_timer, on_reserve_deadline, j);
    if (pdb_timer_arm(&kv->res_timers, &j->res_timer, (uint64_t)j->res_deadline_ms) != PDB_OK) {
        j->res_failed = 1; /* no memory for its deadline: go on unreserved, as after a failure */
        drain_locked(kv, &done);
        pthread_mutex_unlock(&kv->client_lock);
        finish(kv, j);
        finish_all(kv, done);
        return 0;
    }
    j->prev = NULL;
    j->next = kv->asking;
    if (kv->asking != NULL)
        kv->asking->prev = j;
    kv->asking = j;
    if (!j->res_watched)
        kv->asking_unwatched++;
    /* The service thread must look now when it does not poll for this answer yet, or sleeps
     * past its deadline. */
    kick = !j->res_watched || j->res_deadline_ms < kv->res_sleep_until;
    drain_locked(kv, &done); /* the send may have taken an answer's readiness */
    pthread_mutex_unlock(&kv->client_lock);
    finish_all(kv, done);
    return kick;
}

bool pdgw_kvctl_reserve_idle(pdgw_fwd_kv_svc_t *kv)
{
    bool idle;
    pthread_mutex_lock(&kv->client_lock);
    idle = kv->asking == NULL;
    pthread_mutex_unlock(&kv->client_lock);
    return idle;
}

void pdgw_kvctl_reserve_drain(pdgw_fwd_kv_svc_t *kv)
{
    kvctl_job_t *done = NULL;
    pthread_mutex_lock(&kv->client_lock);
    drain_locked(kv, &done);
    pthread_mutex_unlock(&kv->client_lock);
    finish_all(kv, done);
}

int64_t pdgw_kvctl_reserve_expire(pdgw_fwd_kv_svc_t *kv, int64_t now, int stopping)
{
    kvctl_job_t *done;
    int64_t next;
    pthread_mutex_lock(&kv->client_lock);
    if (stopping) /* the server stops: nobody waits for the answers any more */
        while (kv->asking != NULL)
            expire_locked(kv, kv->asking, now, 1);
    else
        (void)pdb_timers_run(&kv->res_timers, (uint64_t)now);
    next = pdb_timers_next(&kv->res_timers);
    /* Read under the lock reservations start under: one due sooner kicks the thread. */
    kv->res_sleep_until = next >= 0 ? next : KVCTL_NEVER;
    done = kv->res_expired;
    kv->res_expired = NULL;
    pthread_mutex_unlock(&kv->client_lock);
    finish_all(kv, done);
    return next;
}
