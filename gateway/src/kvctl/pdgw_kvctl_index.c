/*
 * pdgw_kvctl_index.c - the ids the KV control service looks up: the attempts in flight for
 * ProxyNotif (waiters) and the attempts that ended (tombstones, kept KVCTL_TOMB_TTL_MS for
 * late notices), each hashed by request id.
 *
 * Every ProxyNotif looks its id up, every attempt registers and ends once, and at a steady
 * 1,000 requests/s the tombstones number in the thousands: a list walk per notice (and per
 * loop of the service thread) under the lock the workers take too would make the cost of one
 * request grow with the request rate. Here lookups are by hash, tombstones expire from the
 * oldest end (they are kept in the order they were made; one timer, armed for the oldest,
 * says when: pdgw_kvctl_timers.c), and at the cap the oldest one makes
 * room for the newest: a late landing after a recent failure matters more than one after a
 * failure two minutes ago.
 * All functions run with kv->lock held.
 */
#include "pdgw_kvctl.h"

#include <string.h>

#include "pdgw_alloc.h"

static size_t id_bucket(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p != '\0'; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h % KVCTL_HASH);
}

void pdgw_kvctl_waiter_add_locked(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q)
{
    size_t b = id_bucket(q->id);
    q->hnext = kv->waiter_hash[b];
    kv->waiter_hash[b] = q;
}

int pdgw_kvctl_waiter_remove_locked(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q)
{
    pdgw_fwd_kv_req_t **pp;
    for (pp = &kv->waiter_hash[id_bucket(q->id)]; *pp != NULL && *pp != q; pp = &(*pp)->hnext)
        ;
    if (*pp == NULL)
        return 0;
    *pp = q->hnext;
    q->hnext = NULL;
    return 1;
}

pdgw_fwd_kv_req_t *pdgw_kvctl_waiter_find_locked(pdgw_fwd_kv_svc_t *kv, const char *id)
{
    for (pdgw_fwd_kv_req_t *q = kv->waiter_hash[id_bucket(id)]; q != NULL; q = q->hnext)
        if (strcmp(q->id, id) == 0)
            return q;
    return NULL;
}

kvctl_tomb_t *pdgw_kvctl_tomb_find_locked(pdgw_fwd_kv_svc_t *kv, const char *id)
{
    for (kvctl_tomb_t *t = kv->tomb_hash[id_bucket(id)]; t != NULL; t = t->hnext)
        if (strcmp(t->id, id) == 0)
            return t;
    return NULL;
}

/* Unlink the oldest tombstone and free it. */
static void tomb_drop_oldest(pdgw_fwd_kv_svc_t *kv)
{
    kvctl_tomb_t *t = kv->tombs, **pp;
    for (pp = &kv->tomb_hash[id_bucket(t->id)]; *pp != NULL && *pp != t; pp = &(*pp)->hnext)
        ;
    if (*pp != NULL)
        *pp = t->hnext;
    kv->tombs = t->next;
    if (kv->tombs == NULL)
        kv->tomb_tail = NULL;
    kv->n_tombs--;
    pdgw_free(t);
}

void pdgw_kvctl_tomb_add_locked(pdgw_fwd_kv_svc_t *kv, kvctl_tomb_t *t)
{
    size_t b = id_bucket(t->id);
    int oldest_changes = kv->tombs == NULL;
    if (kv->n_tombs >= KVCTL_TOMB_MAX) {
        tomb_drop_oldest(kv);
        oldest_changes = 1;
    }
    t->next = NULL;
    if (kv->tomb_tail != NULL)
        kv->tomb_tail->next = t;
    else
        kv->tombs = t;
    kv->tomb_tail = t;
    t->hnext = kv->tomb_hash[b];
    kv->tomb_hash[b] = t;
    kv->n_tombs++;
    if (oldest_changes)
        pdgw_kvctl_tomb_timer_update_locked(kv);
}

void pdgw_kvctl_tombs_expire_locked(pdgw_fwd_kv_svc_t *kv, int64_t now_ms, int64_t ttl_ms)
{
    while (kv->tombs != NULL && now_ms - kv->tombs->t_ms > ttl_ms)
        tomb_drop_oldest(kv);
    pdgw_kvctl_tomb_timer_update_locked(kv); /* for the new oldest one */
}
