/*
 * pdq_core.c - building and freeing the quota object; tenant and model lookup.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdq_int.h"

#define OTHER "other"

const char *pdq_strerror(pdq_status_t st)
{
    switch (st) {
    case PDQ_OK:
        return "ok";
    case PDQ_WAIT:
        return "waiting for a concurrency slot";
    case PDQ_REFUSED:
        return "refused";
    case PDQ_ERR_NOMEM:
        return "out of memory";
    case PDQ_ERR_INVALID:
        return "invalid argument";
    case PDQ_ERR_UNSUPPORTED:
        return "not supported by this build";
    case PDQ_ERR_STATE:
        return "invalid state";
    }
    return "unknown status";
}

const char *pdq_code_name(pdq_code_t code)
{
    static const char *const names[PDQ_CODE_COUNT] = {
        [PDQ_CODE_NONE] = "",
        [PDQ_CODE_RATE_LIMITED] = "rate_limited",
        [PDQ_CODE_TOKENS_EXHAUSTED] = "tokens_exhausted",
        [PDQ_CODE_QUEUE_FULL] = "queue_full",
        [PDQ_CODE_STORE_UNAVAILABLE] = "quota_store_unavailable",
    };
    return (unsigned)code < PDQ_CODE_COUNT ? names[code] : "";
}

void pdq_logf(pdq_t *q, int level, const char *fmt, ...)
{
    if (q->log == NULL)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    q->log(q->log_arg, level, msg);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Label values stay short and plain: they end up in metrics and JSON keys. */
static bool valid_name(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == '/' || c == ':'))
            return false;
    }
    return true;
}

bool pdq_budget_any(const pdq_budget_t *b)
{
    return b->rps || b->rpm || b->tpm || b->prompt_tpm || b->completion_tpm;
}

void pdq_bset_init(pdq_bset_t *s, const pdq_budget_t *b, double share, uint64_t now)
{
    pdq_bucket_init(&s->b[PDQ_B_RPS], b->rps, 1.0, share, now);
    pdq_bucket_init(&s->b[PDQ_B_RPM], b->rpm, 60.0, share, now);
    pdq_bucket_init(&s->b[PDQ_B_TPM], b->tpm, 60.0, share, now);
    pdq_bucket_init(&s->b[PDQ_B_PTPM], b->prompt_tpm, 60.0, share, now);
    pdq_bucket_init(&s->b[PDQ_B_CTPM], b->completion_tpm, 60.0, share, now);
}

size_t pdq_model_index(const pdq_t *q, const char *model)
{
    if (model == NULL || q->n_models == 1)
        return q->n_models - 1;
    void *v = pdb_map_get(&q->models, model);
    return v ? (size_t)(uintptr_t)v - 1 : q->n_models - 1;
}

size_t pdq_tenant_by_key(const pdq_t *q, const char *api_key)
{
    if (api_key == NULL || api_key[0] == '\0')
        return q->default_tenant;
    pthread_rwlock_rdlock((pthread_rwlock_t *)&q->keys_lock); /* a reload swaps the map */
    void *v = pdb_map_get(&q->keys, api_key);
    pthread_rwlock_unlock((pthread_rwlock_t *)&q->keys_lock);
    return v ? (size_t)(uintptr_t)v - 1 : q->other_tenant;
}

size_t pdq_tenant_by_name(const pdq_t *q, const char *name)
{
    for (size_t i = 0; name && i < q->n_tenants; i++)
        if (strcmp(q->tenants[i].name, name) == 0)
            return i;
    return (size_t)-1;
}

size_t pdq_tenant_count(const pdq_t *q)
{
    return q->n_tenants;
}

const char *pdq_tenant_name(const pdq_t *q, size_t tenant)
{
    return tenant < q->n_tenants ? q->tenants[tenant].name : NULL;
}

pdq_status_t pdq_config_check(const pdq_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->n_tenants == 0 || cfg->tenants == NULL) {
        set_err(err, errlen, "quota: at least one tenant is needed");
        return PDQ_ERR_INVALID;
    }
    if (cfg->n_tenants > PDQ_MAX_TENANTS) {
        set_err(err, errlen, "quota: %zu tenants, at most %u", cfg->n_tenants, PDQ_MAX_TENANTS);
        return PDQ_ERR_INVALID;
    }
    uint64_t reserved = 0;
    for (size_t i = 0; i < cfg->n_tenants + 1; i++) {
        const pdq_tenant_config_t *tc = i < cfg->n_tenants ? &cfg->tenants[i] : cfg->other;
        if (tc == NULL)
            continue;
        const char *name = i < cfg->n_tenants ? tc->name : OTHER;
        if (!valid_name(name, 64) || (i < cfg->n_tenants && strcmp(name, OTHER) == 0)) {
            set_err(err, errlen,
                    "quota: tenant %zu: name must be 1-64 of [A-Za-z0-9_.-/:], not "
                    "\"other\"",
                    i);
            return PDQ_ERR_INVALID;
        }
        for (size_t j = 0; j < i && i < cfg->n_tenants; j++)
            if (strcmp(cfg->tenants[j].name, name) == 0) {
                set_err(err, errlen, "quota: tenant \"%s\" is defined twice", name);
                return PDQ_ERR_INVALID;
            }
        if (!(tc->weight >= 0) || !isfinite(tc->weight) || tc->weight > 1e6 ||
            (tc->weight > 0 && tc->weight < 0.01)) {
            set_err(err, errlen, "quota: tenant \"%s\": weight must be 0 (= 1) or in [0.01, 1e6]",
                    name);
            return PDQ_ERR_INVALID;
        }
        if (tc->priority > PDQ_MAX_PRIORITY) {
            set_err(err, errlen, "quota: tenant \"%s\": priority must be 0..%u", name,
                    PDQ_MAX_PRIORITY);
            return PDQ_ERR_INVALID;
        }
        reserved += tc->reserved;
        if (tc->n_models > PDQ_MAX_MODELS) {
            set_err(err, errlen, "quota: tenant \"%s\": at most %u models", name, PDQ_MAX_MODELS);
            return PDQ_ERR_INVALID;
        }
        for (size_t m = 0; m < tc->n_models; m++)
            if (!valid_name(tc->models[m].model, 256) || strcmp(tc->models[m].model, OTHER) == 0) {
                set_err(err, errlen, "quota: tenant \"%s\": model %zu: bad name", name, m);
                return PDQ_ERR_INVALID;
            }
        for (size_t k = 0; k < tc->n_api_keys; k++)
            if (tc->api_keys[k] == NULL || tc->api_keys[k][0] == '\0' ||
                strlen(tc->api_keys[k]) > 256) {
                set_err(err, errlen, "quota: tenant \"%s\": api key %zu is empty or too long", name,
                        k);
                return PDQ_ERR_INVALID;
            }
    }
    if (cfg->max_concurrent && reserved > cfg->max_concurrent) {
        set_err(err, errlen, "quota: reserved slots (%llu) exceed max_concurrent (%u)",
                (unsigned long long)reserved, cfg->max_concurrent);
        return PDQ_ERR_INVALID;
    }
    if (!cfg->max_concurrent && reserved) {
        set_err(err, errlen, "quota: reserved slots need a max_concurrent");
        return PDQ_ERR_INVALID;
    }
    if (cfg->default_tenant) {
        size_t i = 0;
        while (i < cfg->n_tenants && strcmp(cfg->tenants[i].name, cfg->default_tenant) != 0)
            i++;
        if (i == cfg->n_tenants) {
            set_err(err, errlen, "quota: default tenant \"%s\" is not defined",
                    cfg->default_tenant);
            return PDQ_ERR_INVALID;
        }
    }
    return PDQ_OK;
}

/* Every model any tenant names gets an index (labels stay bounded); "other" is the last. */
static pdq_status_t collect_models(pdq_t *q, const pdq_config_t *cfg)
{
    if (pdb_map_init(&q->models, 16) != PDB_OK)
        return PDQ_ERR_NOMEM;
    size_t cap = 1 + cfg->n_models;
    for (size_t i = 0; i < cfg->n_tenants; i++)
        cap += cfg->tenants[i].n_models;
    if (cfg->other)
        cap += cfg->other->n_models;
    q->model_names = pdb_calloc(cap, sizeof(char *));
    if (q->model_names == NULL)
        return PDQ_ERR_NOMEM;
    for (size_t i = 0; i < cfg->n_tenants + 2; i++) {
        const pdq_tenant_config_t *tc = i < cfg->n_tenants ? &cfg->tenants[i] : cfg->other;
        size_t n = i <= cfg->n_tenants ? (tc ? tc->n_models : 0) : cfg->n_models;
        for (size_t m = 0; m < n; m++) {
            const char *name = i <= cfg->n_tenants ? tc->models[m].model : cfg->models[m];
            if (!valid_name(name, 256) || strcmp(name, OTHER) == 0)
                continue; /* a budget's name was checked; a label that cannot be one is not */
            if (pdb_map_get(&q->models, name))
                continue;
            char *copy = pdb_strdup(name);
            if (copy == NULL)
                return PDQ_ERR_NOMEM;
            q->model_names[q->n_models] = copy;
            if (pdb_map_put(&q->models, copy, (void *)(uintptr_t)(q->n_models + 1)) != PDB_OK) {
                pdb_free(copy);
                q->model_names[q->n_models] = NULL;
                return PDQ_ERR_NOMEM;
            }
            q->n_models++;
        }
    }
    q->model_names[q->n_models] = pdb_strdup(OTHER);
    if (q->model_names[q->n_models] == NULL)
        return PDQ_ERR_NOMEM;
    q->n_models++;
    return PDQ_OK;
}

void pdq_tenant_fini(pdq_t *q, pdq_tenant_t *t)
{
    if (t->model_budget)
        for (size_t m = 0; m < q->n_models; m++)
            pdb_free(t->model_budget[m]);
    pdb_free(t->model_budget);
    pdb_free(t->usage);
    while (t->free_tickets) {
        pdq_ticket_t *next = t->free_tickets->next_free;
        pdb_free(t->free_tickets);
        t->free_tickets = next;
    }
    pdb_free(t->name);
    pthread_mutex_destroy(&t->lock);
}

pdq_status_t pdq_tenant_init(pdq_t *q, pdq_tenant_t *t, uint32_t idx, const pdq_tenant_config_t *tc,
                             const char *name, uint64_t now)
{
    double share = q->local_share;
    pthread_mutex_init(&t->lock, NULL);
    t->idx = idx;
    t->name = pdb_strdup(name);
    t->model_budget = pdb_calloc(q->n_models, sizeof(*t->model_budget));
    t->usage = pdb_calloc(q->n_models, sizeof(*t->usage));
    if (t->name == NULL || t->model_budget == NULL || t->usage == NULL)
        return PDQ_ERR_NOMEM;
    t->max_concurrent = tc->max_concurrent;
    t->reserved = tc->reserved;
    t->max_waiting = tc->max_waiting ? tc->max_waiting : PDQ_DEFAULT_MAX_WAITING;
    pdq_bset_init(&t->budget, &tc->budget, share, now);
    for (size_t m = 0; m < tc->n_models; m++) {
        if (!pdq_budget_any(&tc->models[m].budget))
            continue;
        size_t mi = pdq_model_index(q, tc->models[m].model);
        if (t->model_budget[mi] != NULL)
            continue; /* the first entry for a model wins */
        t->model_budget[mi] = pdb_calloc(1, sizeof(pdq_bset_t));
        if (t->model_budget[mi] == NULL)
            return PDQ_ERR_NOMEM;
        pdq_bset_init(t->model_budget[mi], &tc->models[m].budget, share, now);
    }
    return PDQ_OK;
}

pdq_status_t pdq_index_keys(pdb_map_t *keys, const pdq_config_t *cfg, const size_t *slot_of,
                            char *err, size_t errlen)
{
    if (pdb_map_init(keys, 16) != PDB_OK)
        return PDQ_ERR_NOMEM;
    for (size_t i = 0; i < cfg->n_tenants; i++)
        for (size_t k = 0; k < cfg->tenants[i].n_api_keys; k++) {
            size_t slot = slot_of ? slot_of[i] : i;
            pdb_status_t st =
                pdb_map_put(keys, cfg->tenants[i].api_keys[k], (void *)(uintptr_t)(slot + 1));
            if (st == PDB_ERR_EXISTS) {
                set_err(err, errlen, "quota: an api key is given to two tenants (tenant \"%s\")",
                        cfg->tenants[i].name);
                return PDQ_ERR_INVALID;
            }
            if (st != PDB_OK)
                return PDQ_ERR_NOMEM;
        }
    return PDQ_OK;
}

pdq_status_t pdq_new(const pdq_config_t *cfg, const pdb_clock_t *clock, pdq_t **out, char *err,
                     size_t errlen)
{
    if (cfg == NULL || out == NULL)
        return PDQ_ERR_INVALID;
    pdq_status_t st = pdq_config_check(cfg, err, errlen);
    if (st != PDQ_OK)
        return st;
    pdq_t *q = pdb_calloc(1, sizeof(*q));
    if (q == NULL)
        goto err_nomem;
    if (clock)
        q->clock = *clock;
    q->log = cfg->log;
    q->log_arg = cfg->log_arg;
    pthread_mutex_init(&q->fq_lock, NULL);
    pthread_rwlock_init(&q->keys_lock, NULL);
    q->max_concurrent = cfg->max_concurrent;
    size_t n_tenants = cfg->n_tenants + 1;
    q->other_tenant = cfg->n_tenants;
    uint32_t reserved = 0;
    atomic_init(&q->n_tenants, 0);
    atomic_init(&q->default_tenant, 0);
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        reserved += cfg->tenants[i].reserved;
        if (cfg->default_tenant && strcmp(cfg->tenants[i].name, cfg->default_tenant) == 0)
            atomic_init(&q->default_tenant, i);
    }
    if (cfg->other)
        reserved += cfg->other->reserved;
    atomic_init(&q->shared_cap, q->max_concurrent - reserved);
    if ((st = collect_models(q, cfg)) != PDQ_OK)
        goto err_free;
    if ((st = pdq_index_keys(&q->keys, cfg, NULL, err, errlen)) != PDQ_OK)
        goto err_free;

    double share = 1.0;
    if (cfg->store.url && cfg->store.fail_mode == PDQ_FAIL_OPEN && cfg->store.expected_replicas > 1)
        share = 1.0 / cfg->store.expected_replicas;
    q->local_share = share;
    uint64_t now = pdq_now(q);
    q->tenants = pdb_calloc(PDQ_TENANT_SLOTS, sizeof(*q->tenants));
    double *weights = pdb_calloc(PDQ_TENANT_SLOTS, sizeof(double));
    unsigned *prios = pdb_calloc(PDQ_TENANT_SLOTS, sizeof(unsigned));
    if (q->tenants == NULL || weights == NULL || prios == NULL) {
        pdb_free(weights);
        pdb_free(prios);
        st = PDQ_ERR_NOMEM;
        goto err_free;
    }
    for (size_t i = 0; i < n_tenants; i++) {
        const pdq_tenant_config_t *tc = &cfg->tenants[i < cfg->n_tenants ? i : q->default_tenant];
        if (i == q->other_tenant && cfg->other)
            tc = cfg->other;
        /* "other" borrows the default tenant's limits, not its reserved slots */
        pdq_tenant_config_t copy = *tc;
        if (i == q->other_tenant && !cfg->other)
            copy.reserved = 0;
        weights[i] = copy.weight;
        prios[i] = copy.priority;
        st = pdq_tenant_init(q, &q->tenants[i], (uint32_t)i, &copy,
                             i == q->other_tenant ? OTHER : tc->name, now);
        q->n_tenants = i + 1; /* pdq_free finishes what was set up */
        if (st != PDQ_OK)
            break;
    }
    if (st == PDQ_OK)
        st = pdq_fairq_init(&q->fq, PDQ_TENANT_SLOTS, weights, prios);
    pdb_free(weights);
    pdb_free(prios);
    if (st != PDQ_OK)
        goto err_free;
    if (cfg->store.url != NULL &&
        (st = pdq_store_new(q, &cfg->store, &q->store, err, errlen)) != PDQ_OK)
        goto err_free;
    *out = q;
    return PDQ_OK;

err_free:
    pdq_free(q);
    if (st == PDQ_ERR_NOMEM)
        set_err(err, errlen, "quota: out of memory");
    return st;
err_nomem:
    set_err(err, errlen, "quota: out of memory");
    return PDQ_ERR_NOMEM;
}

pdq_status_t pdq_start(pdq_t *q)
{
    return q->store ? pdq_store_start(q->store) : PDQ_OK;
}

void pdq_free(pdq_t *q)
{
    if (q == NULL)
        return;
    pdq_store_free(q->store);
    for (size_t i = 0; q->tenants && i < q->n_tenants; i++)
        pdq_tenant_fini(q, &q->tenants[i]);
    pdb_free(q->tenants);
    pdq_fairq_fini(&q->fq);
    for (size_t m = 0; q->model_names && m < q->n_models; m++)
        pdb_free(q->model_names[m]);
    pdb_free(q->model_names);
    pdb_map_fini(&q->models, NULL);
    pdb_map_fini(&q->keys, NULL);
    pthread_mutex_destroy(&q->fq_lock);
    pthread_rwlock_destroy(&q->keys_lock);
    pdb_free(q);
}

void pdq_tenant_sync_mode(pdq_t *q, pdq_tenant_t *t, uint64_t now)
{
    bool leased = atomic_load_explicit(&q->store_up, memory_order_acquire);
    if (t->leased == leased)
        return;
    for (int k = 0; k < PDQ_B_COUNT; k++)
        pdq_bucket_set_leased(&t->budget.b[k], leased, now);
    for (size_t m = 0; m < q->n_models; m++)
        for (int k = 0; t->model_budget[m] && k < PDQ_B_COUNT; k++)
            pdq_bucket_set_leased(&t->model_budget[m]->b[k], leased, now);
    t->leased = leased;
}
