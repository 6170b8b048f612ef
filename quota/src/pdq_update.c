/*
 * pdq_update.c - reloading the tenants of a running quota object (pdquota.h pdq_update_*).
 *
 * The tenant array, the model index and the fair queue are sized at start and read without a
 * lock by every admission, so a reload changes values inside them, never their shape: limits
 * under each tenant's lock (and the queue lock, which orders before it), the key map swapped
 * under its reader-writer lock. Everything that can fail (checks, the new key map, budget sets
 * for models that had none) happens in prepare.
 */
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdq_int.h"

typedef struct upd_tenant {
    pdq_tenant_config_t cfg; /* limits only: pointers into the caller's config are not kept */
    pdq_budget_t *model;     /* [n_models] */
    bool *has_model;         /* [n_models] */
    pdq_bset_t **fresh;      /* [n_models]: sets for models that had no budget */
} upd_tenant_t;

struct pdq_update {
    size_t n_tenants, n_models;
    upd_tenant_t *t;
    pdb_map_t keys; /* buckets NULL until initialised */
    uint32_t shared_cap;
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
    for (size_t i = 0; u->t && i < u->n_tenants; i++) {
        upd_tenant_t *ut = &u->t[i];
        for (size_t m = 0; ut->fresh && m < u->n_models; m++)
            pdb_free(ut->fresh[m]);
        pdb_free(ut->fresh);
        pdb_free(ut->model);
        pdb_free(ut->has_model);
    }
    pdb_free(u->t);
    if (u->keys.buckets != NULL)
        pdb_map_fini(&u->keys, NULL);
    pdb_free(u);
}

/* The configuration that tenant <i> of <q> takes from <cfg> (as pdq_new picks it). */
static const pdq_tenant_config_t *config_of(const pdq_t *q, const pdq_config_t *cfg, size_t i,
                                            bool *other_borrows)
{
    *other_borrows = false;
    if (i < cfg->n_tenants)
        return &cfg->tenants[i];
    if (cfg->other != NULL)
        return cfg->other;
    *other_borrows = true;
    return &cfg->tenants[q->default_tenant];
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
        if (q->tenants[i].model_budget[mi] == NULL) {
            ut->fresh[mi] = pdb_calloc(1, sizeof(pdq_bset_t));
            if (ut->fresh[mi] == NULL)
                return PDQ_ERR_NOMEM;
        }
    }
    return PDQ_OK;
}

pdq_status_t pdq_update_prepare(pdq_t *q, const pdq_config_t *cfg, pdq_update_t **out, char *err,
                                size_t errlen)
{
    pdq_update_t *u;
    pdq_status_t st;
    uint32_t reserved = 0;
    *out = NULL;
    if ((st = pdq_config_check(cfg, err, errlen)) != PDQ_OK)
        return st;
    if (cfg->n_tenants + 1 != q->n_tenants) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen,
                     "quota: %zu tenant(s) instead of %zu: adding or removing tenants needs a "
                     "restart",
                     cfg->n_tenants, q->n_tenants - 1);
        return PDQ_ERR_STATE;
    }
    for (size_t i = 0; i < cfg->n_tenants; i++)
        if (strcmp(cfg->tenants[i].name, q->tenants[i].name) != 0) {
            set_err(err, errlen,
                    "quota: tenant \"%s\" is new, renamed or moved: changing the tenants' names "
                    "or order needs a restart",
                    cfg->tenants[i].name);
            return PDQ_ERR_STATE;
        }
    if (strcmp(cfg->default_tenant ? cfg->default_tenant : cfg->tenants[0].name,
               q->tenants[q->default_tenant].name) != 0) {
        set_err(err, errlen, "quota: the default tenant changed (to \"%s\"): restart to apply it",
                cfg->default_tenant ? cfg->default_tenant : cfg->tenants[0].name);
        return PDQ_ERR_STATE;
    }
    if ((cfg->max_concurrent == 0) != (q->max_concurrent == 0)) {
        set_err(err, errlen, "quota: max_concurrent turned %s: restart to apply it",
                cfg->max_concurrent ? "on" : "off");
        return PDQ_ERR_STATE;
    }
    u = pdb_calloc(1, sizeof(*u));
    if (u == NULL)
        goto nomem;
    u->n_tenants = q->n_tenants;
    u->n_models = q->n_models;
    u->t = pdb_calloc(q->n_tenants, sizeof(*u->t));
    if (u->t == NULL)
        goto nomem;
    for (size_t i = 0; i < q->n_tenants; i++) {
        bool borrows;
        const pdq_tenant_config_t *tc = config_of(q, cfg, i, &borrows);
        st = prepare_tenant(q, tc, borrows, i, &u->t[i], err, errlen);
        if (st == PDQ_ERR_NOMEM)
            goto nomem;
        if (st != PDQ_OK) {
            pdq_update_free(u);
            return st;
        }
        reserved += u->t[i].cfg.reserved;
    }
    /* checked: reserved <= max_concurrent; q->max_concurrent only says whether there is one */
    u->shared_cap = cfg->max_concurrent - reserved;
    st = pdq_index_keys(&u->keys, cfg, err, errlen);
    if (st == PDQ_ERR_NOMEM)
        goto nomem;
    if (st != PDQ_OK) {
        pdq_update_free(u);
        return st;
    }
    *out = u;
    return PDQ_OK;
nomem:
    pdq_update_free(u);
    set_err(err, errlen, "quota: out of memory%s", "");
    return PDQ_ERR_NOMEM;
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
    for (size_t i = 0; i < q->n_tenants; i++) {
        pdq_tenant_t *t = &q->tenants[i];
        upd_tenant_t *ut = &u->t[i];
        pthread_mutex_lock(&t->lock);
        t->max_concurrent = ut->cfg.max_concurrent;
        t->reserved = ut->cfg.reserved;
        t->max_waiting = ut->cfg.max_waiting ? ut->cfg.max_waiting : PDQ_DEFAULT_MAX_WAITING;
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
        pthread_mutex_unlock(&t->lock);
        pdq_fairq_set_share(&q->fq, (uint32_t)i, ut->cfg.weight, ut->cfg.priority);
    }
    atomic_store(&q->shared_cap, u->shared_cap);
    pdq_dispatch_locked(q); /* limits that grew let waiters in */
    pthread_mutex_unlock(&q->fq_lock);

    pthread_rwlock_wrlock(&q->keys_lock);
    old = q->keys;
    q->keys = u->keys;
    pthread_rwlock_unlock(&q->keys_lock);
    u->keys = old; /* freed with the update */
    pdq_update_free(u);
}
