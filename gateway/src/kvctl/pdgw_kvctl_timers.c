/*
 * pdgw_kvctl_timers.c - the deadlines of the KV control service, each a timer on the
 * service's heap (pdb_timer.h) under kv->lock, run by the service thread, which sleeps until
 * the earliest one or a kick: a ProxyNotif wait's deadline (embedded in its attempt), a
 * reservation retry's start (embedded in its job) and the oldest tombstone's expiry. Nothing
 * walks the waiters to find what expired, and nothing wakes on a period to look. (The
 * reservations' own deadlines are timers under client_lock: pdgw_kvctl_reserve.c.)
 *
 * Why the ProxyNotif deadline is the attempt's timer here and not the request's worker timer
 * (serve's r->timer): the worker's timer is one per request whose due time the job computes
 * from its own state (pdgw_wf_next_deadline); a forwarder's gate can reach it only through a
 * plan-wide gate_timeout_ms, whose expiry fails the request, not a per-attempt deadline that
 * may go on with notif_fallback: decode. Arming it would take a new forwarder call and a
 * gate stage in the workflow, and the gate's callers without a worker (plugins polling, the
 * unit tests) would still need this heap. Here the deadline sits beside the notices that race
 * it, under the same lock, on one clock the tests drive; its expiry, the rare path, costs the
 * one wake a notice costs too, and an arm kicks the thread only when it sleeps past the new
 * deadline (with one notif_timeout_ms for all, almost never).
 */
#include "pdgw_kvctl.h"

#include "pdgw_alloc.h"

static void on_notif_deadline(pdb_timer_t *t, uint64_t now)
{
    pdgw_fwd_kv_req_t *q = t->arg;
    (void)now;
    q->kv->timers_fired++;
    if (q->notif_got >= q->notif_need || q->notif_timed_out)
        return;
    q->notif_timed_out = 1;
    pdgw_kvctl_wake_locked(q);
}

int pdgw_kvctl_notif_deadline_arm_locked(pdgw_fwd_kv_req_t *q, int64_t timeout_ms)
{
    pdgw_fwd_kv_svc_t *kv = q->kv;
    int64_t due = pdgw_kvctl_now_ms(kv) + (timeout_ms > 0 ? timeout_ms : 0);
    pdb_timer_init(&q->notif_timer, on_notif_deadline, q);
    if (pdb_timer_arm(&kv->timers, &q->notif_timer, (uint64_t)due) != PDB_OK) {
        /* No memory for the deadline: time out now rather than wait unbounded. */
        q->notif_timer.due = (uint64_t)due;
        q->notif_timed_out = 1;
        return 0;
    }
    return pdgw_kvctl_sooner_locked(kv, due);
}

void pdgw_kvctl_notif_deadline_cancel_locked(pdgw_fwd_kv_req_t *q)
{
    if (q->notif_waiting)
        pdb_timer_cancel(&q->kv->timers, &q->notif_timer);
}

/* A retry came due: the thread starts it at its next turn. */
static void on_job_due(pdb_timer_t *t, uint64_t now)
{
    kvctl_job_t *j = t->arg;
    pdgw_fwd_kv_svc_t *kv = j->q->kv;
    (void)now;
    kv->timers_fired++;
    j->q->delayed = NULL;
    kv->n_delayed--;
    pdgw_kvctl_job_queue_locked(kv, j, 0);
}

int pdgw_kvctl_job_delay_locked(pdgw_fwd_kv_svc_t *kv, kvctl_job_t *j, int64_t due_ms)
{
    pdb_timer_init(&j->delay, on_job_due, j);
    if (pdb_timer_arm(&kv->timers, &j->delay, (uint64_t)due_ms) != PDB_OK) {
        pdgw_kvctl_job_queue_locked(kv, j, 0); /* no memory to wait: ask again now */
        return 1;
    }
    j->q->delayed = j;
    kv->n_delayed++;
    return pdgw_kvctl_sooner_locked(kv, due_ms);
}

void pdgw_kvctl_job_delay_drop_locked(pdgw_fwd_kv_req_t *q)
{
    kvctl_job_t *j = q->delayed;
    if (j == NULL)
        return;
    pdb_timer_cancel(&q->kv->timers, &j->delay);
    q->delayed = NULL;
    q->kv->n_delayed--;
    atomic_fetch_sub(&q->refs, 1); /* the job's; the attempt still holds its own */
    pdgw_free(j);
}

static void on_tombs_due(pdb_timer_t *t, uint64_t now)
{
    pdgw_fwd_kv_svc_t *kv = t->arg;
    kv->timers_fired++;
    pdgw_kvctl_tombs_expire_locked(kv, (int64_t)now, KVCTL_TOMB_TTL_MS);
}

void pdgw_kvctl_tomb_timer_update_locked(pdgw_fwd_kv_svc_t *kv)
{
    if (kv->tomb_timer.fn == NULL)
        pdb_timer_init(&kv->tomb_timer, on_tombs_due, kv);
    if (kv->tombs == NULL) {
        pdb_timer_cancel(&kv->timers, &kv->tomb_timer);
        return;
    }
    /* A tombstone goes once it is older than the TTL (pdgw_kvctl_tombs_expire_locked). With
     * no memory to arm it, the next tombstone added tries again; the cap bounds them anyway. */
    (void)pdb_timer_arm(&kv->timers, &kv->tomb_timer,
                        (uint64_t)(kv->tombs->t_ms + KVCTL_TOMB_TTL_MS + 1));
}
