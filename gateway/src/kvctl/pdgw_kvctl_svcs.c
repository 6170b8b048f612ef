/*
 * pdgw_kvctl_svcs.c - the KV control services one server owns: the server makes the set and
 * hands it to the forwarder's configure (pdgw_fwd_env_t.kv_svcs), where pdgw_fwd_kv_svc_open
 * puts the service; the server's shutdown, its reload hook and its workers' socket events
 * reach the services through it. There is no list of every service in the process: two
 * servers in one process (tests) never see each other's.
 *
 * The set's lock is taken by workers (a socket event), the main thread (reload, shutdown)
 * and whoever closes a service (a forwarder's destroy): a service leaves the set before it
 * stops, so an event never reaches one being freed. It is never held with a service's locks
 * taken first.
 */
#include "pdgw_kvctl.h"

#include "pdgw_alloc.h"

struct pdgw_fwd_kv_svcs {
    pthread_mutex_t lock;
    pdgw_fwd_kv_svc_t *head;
};

pdgw_fwd_kv_svcs_t *pdgw_kvctl_svcs_create(void)
{
    pdgw_fwd_kv_svcs_t *set = pdgw_calloc(1, sizeof(*set));
    if (set != NULL)
        pthread_mutex_init(&set->lock, NULL);
    return set;
}

void pdgw_kvctl_svcs_destroy(pdgw_fwd_kv_svcs_t *set)
{
    if (set == NULL)
        return;
    pthread_mutex_lock(&set->lock);
    for (pdgw_fwd_kv_svc_t *kv = set->head; kv != NULL; kv = kv->owner_next)
        kv->owner = NULL; /* not closed yet: its close must not touch the set */
    pthread_mutex_unlock(&set->lock);
    pthread_mutex_destroy(&set->lock);
    pdgw_free(set);
}

void pdgw_kvctl_svcs_add(pdgw_fwd_kv_svcs_t *set, pdgw_fwd_kv_svc_t *kv)
{
    pthread_mutex_lock(&set->lock);
    kv->owner = set;
    kv->owner_prev = NULL;
    kv->owner_next = set->head;
    if (set->head != NULL)
        set->head->owner_prev = kv;
    set->head = kv;
    pthread_mutex_unlock(&set->lock);
}

void pdgw_kvctl_svcs_remove(pdgw_fwd_kv_svc_t *kv)
{
    pdgw_fwd_kv_svcs_t *set = kv->owner;
    if (set == NULL)
        return;
    pthread_mutex_lock(&set->lock);
    if (kv->owner_prev != NULL)
        kv->owner_prev->owner_next = kv->owner_next;
    else
        set->head = kv->owner_next;
    if (kv->owner_next != NULL)
        kv->owner_next->owner_prev = kv->owner_prev;
    kv->owner = NULL;
    kv->owner_next = kv->owner_prev = NULL;
    pthread_mutex_unlock(&set->lock);
}

void pdgw_kvctl_svcs_stop(pdgw_fwd_kv_svcs_t *set)
{
    if (set == NULL)
        return;
    pthread_mutex_lock(&set->lock);
    for (pdgw_fwd_kv_svc_t *kv = set->head; kv != NULL; kv = kv->owner_next)
        pdgw_kvctl_stop(kv);
    pthread_mutex_unlock(&set->lock);
}

void pdgw_kvctl_svcs_worker_ready(pdgw_fwd_kv_svcs_t *set)
{
    if (set == NULL)
        return;
    /* under the set's lock: a service closed meanwhile has left it */
    pthread_mutex_lock(&set->lock);
    for (pdgw_fwd_kv_svc_t *kv = set->head; kv != NULL; kv = kv->owner_next)
        pdgw_kvctl_reserve_drain(kv);
    pthread_mutex_unlock(&set->lock);
}

void pdgw_kvctl_svcs_apply(pdgw_fwd_kv_svcs_t *set, const pdgw_fwd_kv_opts_t *o)
{
    if (set == NULL)
        return;
    pthread_mutex_lock(&set->lock);
    for (pdgw_fwd_kv_svc_t *kv = set->head; kv != NULL; kv = kv->owner_next)
        pdgw_kvctl_apply(kv, o);
    pthread_mutex_unlock(&set->lock);
}

bool pdgw_kvctl_svcs_any(pdgw_fwd_kv_svcs_t *set)
{
    bool any;
    if (set == NULL)
        return false;
    pthread_mutex_lock(&set->lock);
    any = set->head != NULL;
    pthread_mutex_unlock(&set->lock);
    return any;
}
