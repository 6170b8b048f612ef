/*
 * pdq_update.c - reloading the tenants of a running quota object (pdquota.h pdq_update_*).
 *
 * The tenant slots, the model index and the fair queue are sized at start and read without a
 * lock by every admission, so a reload changes values inside them, never their shape: limits
 * under each tenant's lock (and the queue lock, which orders before it), the key map swapped
 * under its reader-writer lock. A tenant is matched to its slot by name; a new one takes the
 * next free slot (set up in prepare, published by commit); a removed one keeps its slot, its
 * limits and its usage, loses its keys and drains. Everything that can fail (checks, the new
 * key map, new slots, budget sets for models that had none) happens in prepare; one update is
 * prepared at a time.
 */
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdq_int.h"

typedef enum { UPD_RETUNE, UPD_REMOVE, UPD_ADD } upd_kind_t;

typedef struct upd_tenant {
    upd_kind_t kind;
    bool set_up;             /* UPD_ADD: its slot was initialised by this update */
    pdq_tenant_config_t cfg; /* limits only: pointers into the caller's config are not kept */
    pdq_budget_t *model;     /* [n_models] */
    bool *has_model;         /* [n_models] */
    pdq_bset_t **fresh;      /* [n_models]: sets for models that had no budget */
} upd_tenant_t;

struct pdq_update {
    pdq_t *q;
    size_t n_old, n_slots; /* published slots now, and after commit */
    size_t n_models;
    size_t default_tenant;
    upd_tenant_t *t; /* [n_slots] */
    pdb_map_t keys;  /* buckets NULL until initialised */
    uint32_t shared_cap;
    char summary[256];
};

static void set_err(char *err, size_t errlen, const char *msg, const char *name)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, msg, name);
}

void pdq_update_free(pdq_update_t *u)
{
    if (u == NULL)
        return;
    for (size_t i = 0; u->t && i < u->n_slots; i++) {
        upd_tenant_t *ut = &u->t[i];
        for (size_t m = 0; ut->fresh && m < u->n_models; m++)
            pdb_free(ut->fresh[m]);
        pdb_free(ut->fresh);
        pdb_free(ut->model);
        pdb_free(ut->has_model);
        /* a slot set up for a tenant this update would have added, never published */
        if (i >= u->n_old && ut->set_up) {
            pdq_tenant_fini(u->q, &u->q->tenants[i]);
            memset(&u->q->tenants[i], 0, sizeof(u->q->tenants[i]));
        }
    }
    pdb_free(u->t);
    if (u->keys.buckets != NULL)
        pdb_map_fini(&u->keys, NULL);
    pdb_free(u);
}

static pdq_status_t prepare_tenant(pdq_t *q, const pdq_tenant_config_t *tc, bool other_borrows,
                                   size_t i, upd_tenant_t *ut, char *err, size_t errlen)
{
    ut->cfg = *tc;
    ut->cfg.name = NULL;
    ut->cfg.api_keys = NULL;
    ut->cfg.models = NULL;
    if (other_borrows)
        ut->cfg.reserved = 0; /* "other" borrows the default's limits, not its reservation */
    ut->model = pdb_calloc(q->n_models, sizeof(*ut->model));
    ut->has_model = pdb_calloc(q->n_models, sizeof(*ut->has_model));
    ut->fresh = pdb_calloc(q->n_models, sizeof(*ut->fresh));
    if (ut->model == NULL || ut->has_model == NULL || ut->fresh == NULL)
        return PDQ_ERR_NOMEM;
    for (size_t m = 0; m < tc->n_models; m++) {
        if (!pdq_budget_any(&tc->models[m].budget))
            continue;
        void *v = pdb_map_get(&q->models, tc->models[m].model);
        if (v == NULL) {
            set_err(err, errlen,
                    "quota: a budget for model \"%s\", which no tenant had one for: restart to "
                    "apply it",
                    tc->models[m].model);
            return PDQ_ERR_STATE;
        }
        size_t mi = (size_t)(uintptr_t)v - 1;
        if (ut->has_model[mi])
            continue; /* the first entry for a model wins, as at start */
        ut->has_model[mi] = true;
        ut->model[mi] = tc->models[m].budget;
        if (ut->kind == UPD_RETUNE && q->tenants[i].model_budget[mi] == NULL) {
            ut->fresh[mi] = pdb_calloc(1, sizeof(pdq_bset_t));
            if (ut->fresh[mi] == NULL)
                return PDQ_ERR_NOMEM;
        }
    }
    return PDQ_OK;
}

/* The running slot of configured tenant <name> (removed ones included: a tenant that comes
 * back gets its slot, its usage and its keys' history again), or (size_t)-1. */
static size_t slot_named(const pdq_t *q, size_t n_old, const char *name)
{
    for (size_t i = 0; i < n_old; i++)
        if (i != q->other_tenant && strcmp(q->tenants[i].name, name) == 0)
            return i;
    return (size_t)-1;
}

static void summary_add(pdq_update_t *u, const char *what, const char *name)
{
    size_t len = strlen(u->summary);
    if (len + 1 < sizeof(u->summary))
        snprintf(u->summary + len, sizeof(u->summary) - len, "%s%s \"%s\"", len ? ", " : "", what,
                 name);
}

/* Map each tenant of <cfg> to a slot: its running one, else the next free slot (set up here,
 * published by commit). Running tenants that <cfg> lacks are removed. */
static pdq_status_t assign_slots(pdq_t *q, const pdq_config_t *cfg, pdq_update_t *u,
                                 size_t *slot_of, char *err, size_t errlen)
{
    uint64_t now = pdq_now(q);
    u->n_slots = u->n_old;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        slot_of[i] = slot_named(q, u->n_old, cfg->tenants[i].name);
        if (slot_of[i] != (size_t)-1)
            continue;
        if (u->n_slots >= PDQ_TENANT_SLOTS) {
            set_err(err, errlen,
                    "quota: no room for tenant \"%s\": reloads have added as many tenants as "
                    "a gateway holds; restart to compact them",
                    cfg->tenants[i].name);
            return PDQ_ERR_STATE;
        }
        slot_of[i] = u->n_slots++;
    }
    u->t = pdb_calloc(u->n_slots, sizeof(*u->t));
    if (u->t == NULL)
        return PDQ_ERR_NOMEM;
    for (size_t s = 0; s < u->n_slots; s++)
        u->t[s].kind = s < u->n_old ? UPD_REMOVE : UPD_ADD;
    u->t[q->other_tenant].kind = UPD_RETUNE;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        size_t s = slot_of[i];
        if (s >= u->n_old) {
            u->t[s].set_up = true;
            pdq_status_t st = pdq_tenant_init(q, &q->tenants[s], (uint32_t)s, &cfg->tenants[i],
                                              cfg->tenants[i].name, now);
            if (st != PDQ_OK)
                return st;
            if (q->store != NULL)
                pdq_store_tune_tenant(q->store, &q->tenants[s]);
            summary_add(u, "added", cfg->tenants[i].name);
        } else {
            u->t[s].kind = UPD_RETUNE;
            if (atomic_load(&q->tenants[s].removed))
                summary_add(u, "back", cfg->tenants[i].name);
        }
    }
    for (size_t s = 0; s < u->n_old; s++)
        if (u->t[s].kind == UPD_REMOVE && !atomic_load(&q->tenants[s].removed))
            summary_add(u, "removed", q->tenants[s].name);
    return PDQ_OK;
}

pdq_status_t pdq_update_prepare(pdq_t *q, const pdq_config_t *cfg, pdq_update_t **out, char *err,
                                size_t errlen)
{
    pdq_update_t *u;
    pdq_status_t st;
    uint32_t reserved = 0;
    size_t *slot_of = NULL;
    *out = NULL;
    if ((st = pdq_config_check(cfg, err, errlen)) != PDQ_OK)
        return st;
    if ((cfg->max_concurrent == 0) != (q->max_concurrent == 0)) {
        set_err(err, errlen, "quota: max_concurrent turned %s: restart to apply it",
                cfg->max_concurrent ? "on" : "off");
        return PDQ_ERR_STATE;
    }
    u = pdb_calloc(1, sizeof(*u));
    slot_of = pdb_calloc(cfg->n_tenants, sizeof(*slot_of));
    if (u == NULL || slot_of == NULL) {
        st = PDQ_ERR_NOMEM;
        goto fail;
    }
    u->q = q;
    u->n_old = atomic_load(&q->n_tenants);
    u->n_models = q->n_models;
    st = assign_slots(q, cfg, u, slot_of, err, errlen);
    if (st != PDQ_OK)
        goto fail;
    size_t def = 0; /* checked: a configured default tenant is one of cfg's */
    while (cfg->default_tenant && strcmp(cfg->tenants[def].name, cfg->default_tenant) != 0)
        def++;
    u->default_tenant = slot_of[def];
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        upd_tenant_t *ut = &u->t[slot_of[i]];
        st = prepare_tenant(q, &cfg->tenants[i], false, slot_of[i], ut, err, errlen);
        if (st != PDQ_OK)
            goto fail;
        reserved += ut->cfg.reserved;
    }
    {
        /* "other": its own settings, else the default tenant's limits */
        bool borrows = cfg->other == NULL;
        const pdq_tenant_config_t *oc = borrows ? &cfg->tenants[def] : cfg->other;
        upd_tenant_t *ut = &u->t[q->other_tenant];
        st = prepare_tenant(q, oc, borrows, q->other_tenant, ut, err, errlen);
        if (st != PDQ_OK)
            goto fail;
        reserved += ut->cfg.reserved;
    }
    /* checked: reserved <= max_concurrent; q->max_concurrent only says whether there is one.
     * A removed tenant's reservation is free for the others (no request can reach it). */
    u->shared_cap = cfg->max_concurrent - reserved;
    st = pdq_index_keys(&u->keys, cfg, slot_of, err, errlen);
    if (st != PDQ_OK)
        goto fail;
    pdb_free(slot_of);
    *out = u;
    return PDQ_OK;
fail:
    pdb_free(slot_of);
    pdq_update_free(u);
    if (st == PDQ_ERR_NOMEM)
        set_err(err, errlen, "quota: out of memory%s", "");
    return st;
}

const char *pdq_update_summary(const pdq_update_t *u)
{
    return u ? u->summary : "";
}

/* One bucket to a new budget: what was spent in the period counts against the new size (a
 * smaller budget may start in debt); a bucket that was off starts full. */
static void bucket_retune(pdq_t *q, pdq_bucket_t *b, uint64_t budget, bool leased, uint64_t now)
{
    if (!pdq_bucket_on(b)) {
        pdq_bucket_init(b, budget, b->period_ns > 0 ? b->period_ns / 1e9 : 60.0, q->local_share,
                        now);
        if (leased)
            pdq_bucket_set_leased(b, true, now);
    } else {
        pdq_bucket_refill(b, now);
        double was = b->leased ? b->cap : b->local_cap;
        b->cap = (double)budget;
        b->local_cap = b->cap * q->local_share;
        double size = b->leased ? b->cap : b->local_cap;
        b->level += size - was; /* the same spent, against the new size (may leave debt) */
        if (b->level > size)
            b->level = size;
    }
    if (q->store != NULL)
        pdq_store_tune_bucket(q->store, b);
}

static const double periods_s[PDQ_B_COUNT] = {1.0, 60.0, 60.0, 60.0, 60.0};

static void bset_retune(pdq_t *q, pdq_bset_t *s, const pdq_budget_t *b, bool leased, uint64_t now)
{
    const uint64_t v[PDQ_B_COUNT] = {b->rps, b->rpm, b->tpm, b->prompt_tpm, b->completion_tpm};
    for (int k = 0; k < PDQ_B_COUNT; k++) {
        if (s->b[k].period_ns <= 0)
            s->b[k].period_ns = periods_s[k] * 1e9;
        bucket_retune(q, &s->b[k], v[k], leased, now);
    }
}

void pdq_update_commit(pdq_t *q, pdq_update_t *u)
{
    uint64_t now = pdq_now(q);
    pdb_map_t old;
    pthread_mutex_lock(&q->fq_lock);
    for (size_t i = 0; i < u->n_slots; i++) {
        pdq_tenant_t *t = &q->tenants[i];
        upd_tenant_t *ut = &u->t[i];
        if (ut->kind == UPD_REMOVE) {
            /* its limits stay, so what it runs and queues drains under them; its reservation
             * is in the shared count now, so its waiters take shared slots */
            pthread_mutex_lock(&t->lock);
            t->reserved = 0;
            pthread_mutex_unlock(&t->lock);
            atomic_store(&t->removed, true);
            continue;
        }
        pthread_mutex_lock(&t->lock);
        t->max_concurrent = ut->cfg.max_concurrent;
        t->reserved = ut->cfg.reserved;
        t->max_waiting = ut->cfg.max_waiting ? ut->cfg.max_waiting : PDQ_DEFAULT_MAX_WAITING;
        if (ut->kind == UPD_RETUNE) {
            bset_retune(q, &t->budget, &ut->cfg.budget, t->leased, now);
            for (size_t m = 0; m < q->n_models; m++) {
                static const pdq_budget_t none;
                if (t->model_budget[m] == NULL && ut->fresh[m] != NULL) {
                    t->model_budget[m] = ut->fresh[m];
                    ut->fresh[m] = NULL;
                }
                if (t->model_budget[m] != NULL)
                    bset_retune(q, t->model_budget[m], ut->has_model[m] ? &ut->model[m] : &none,
                                t->leased, now);
            }
        }
        pthread_mutex_unlock(&t->lock);
        atomic_store(&t->removed, false);
        pdq_fairq_set_share(&q->fq, (uint32_t)i, ut->cfg.weight, ut->cfg.priority);
    }
    atomic_store(&q->n_tenants, u->n_slots); /* the added slots are set up: publish them */
    u->n_old = u->n_slots;                   /* they are the quota's now, not the update's */
    atomic_store(&q->shared_cap, u->shared_cap);
    pdq_dispatch_locked(q); /* limits that grew let waiters in */
    pthread_mutex_unlock(&q->fq_lock);

    pthread_rwlock_wrlock(&q->keys_lock);
    old = q->keys;
    q->keys = u->keys;
    atomic_store(&q->default_tenant, u->default_tenant);
    pthread_rwlock_unlock(&q->keys_lock);
    u->keys = old; /* freed with the update */
    pdq_update_free(u);
}
