/*
 * Discovery registry and the "static" back-end (instances from the
 * gateway config, added when the pool starts).
 */
#include <string.h>

#include "sched_int.h"

extern const sched_discovery_ops_t sched_discovery_dns_ops;
static const sched_discovery_ops_t sched_discovery_static_ops;

static const sched_discovery_ops_t *const builtin[] = {
    &sched_discovery_static_ops,
    &sched_discovery_dns_ops,
#ifdef SCHED_HAVE_K8S
    &sched_discovery_k8s_ops,
#endif
};
#define N_BUILTIN (sizeof(builtin) / sizeof(builtin[0]))
#define MAX_EXTRA (SCHED_MAX_DISCOVERY - N_BUILTIN)

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static const sched_discovery_ops_t *extra[SCHED_MAX_DISCOVERY];
static size_t n_extra;

const sched_discovery_ops_t *sched_discovery_find(const char *name)
{
    const sched_discovery_ops_t *found = NULL;

    if (!name)
        return NULL;
    for (size_t i = 0; i < N_BUILTIN; i++) {
        if (strcmp(builtin[i]->name, name) == 0)
            return builtin[i];
    }
    pthread_mutex_lock(&registry_mu);
    for (size_t i = 0; i < n_extra && !found; i++) {
        if (strcmp(extra[i]->name, name) == 0)
            found = extra[i];
    }
    pthread_mutex_unlock(&registry_mu);
    return found;
}

sched_status_t sched_discovery_register(const sched_discovery_ops_t *ops)
{
    sched_status_t status = SCHED_OK;

    if (!ops || !ops->name || !ops->configured || !ops->create || !ops->destroy)
        return SCHED_ERR_INVALID;
    if (sched_discovery_find(ops->name))
        return SCHED_ERR_EXISTS;
    pthread_mutex_lock(&registry_mu);
    if (n_extra >= MAX_EXTRA)
        status = SCHED_ERR_NO_MEMORY;
    else
        extra[n_extra++] = ops;
    pthread_mutex_unlock(&registry_mu);
    return status;
}

static sched_status_t create_one(sched_pool_t *pool, const sched_config_t *cfg,
                                 const sched_discovery_ops_t *ops)
{
    void *state = NULL;
    sched_status_t status;

    if (!ops->configured(cfg))
        return SCHED_OK;
    if (pool->n_discovery >= SCHED_MAX_DISCOVERY)
        return SCHED_ERR_NO_MEMORY;
    status = ops->create(cfg, pool, &state);
    if (status != SCHED_OK) {
        sched_pool_logf(pool, SCHED_LOG_ERROR, "discovery %s: %s", ops->name,
                        sched_strerror(status));
        return status;
    }
    pool->discovery[pool->n_discovery].ops = ops;
    pool->discovery[pool->n_discovery].state = state;
    pool->n_discovery++;
    sched_pool_logf(pool, SCHED_LOG_INFO, "discovery %s configured", ops->name);
    return SCHED_OK;
}

sched_status_t sched_discovery_create_all(sched_pool_t *pool, const sched_config_t *cfg)
{
    sched_status_t status = SCHED_OK;
    const sched_discovery_ops_t *list[SCHED_MAX_DISCOVERY];
    size_t n = 0;

    for (size_t i = 0; i < N_BUILTIN; i++)
        list[n++] = builtin[i];
    pthread_mutex_lock(&registry_mu);
    for (size_t i = 0; i < n_extra; i++)
        list[n++] = extra[i];
    pthread_mutex_unlock(&registry_mu);
    for (size_t i = 0; i < n && status == SCHED_OK; i++)
        status = create_one(pool, cfg, list[i]);
    if (status != SCHED_OK)
        sched_discovery_destroy_all(pool);
    return status;
}

sched_status_t sched_discovery_start_all(sched_pool_t *pool)
{
    for (size_t i = 0; i < pool->n_discovery; i++) {
        const sched_discovery_slot_t *s = &pool->discovery[i];
        sched_status_t status;
        if (!s->ops->start)
            continue;
        status = s->ops->start(s->state);
        if (status != SCHED_OK) {
            sched_pool_logf(pool, SCHED_LOG_ERROR, "discovery %s: start failed: %s", s->ops->name,
                            sched_strerror(status));
            return status;
        }
    }
    return SCHED_OK;
}

void sched_discovery_tick_all(sched_pool_t *pool, uint64_t now_ms)
{
    for (size_t i = 0; i < pool->n_discovery; i++) {
        const sched_discovery_slot_t *s = &pool->discovery[i];
        if (s->ops->tick)
            s->ops->tick(s->state, now_ms);
    }
}

void sched_discovery_destroy_all(sched_pool_t *pool)
{
    while (pool->n_discovery > 0) {
        sched_discovery_slot_t *s = &pool->discovery[--pool->n_discovery];
        s->ops->destroy(s->state);
        s->ops = NULL;
        s->state = NULL;
    }
}

/* ---- static back-end ---------------------------------------------- */

typedef struct static_state {
    sched_pool_t *pool;
    size_t n;
    sched_instance_desc_t *descs; /* normalised owned copies */
} static_state_t;

static bool static_configured(const sched_config_t *cfg)
{
    return cfg->n_instances > 0;
}

static void static_destroy(void *arg)
{
    static_state_t *st = arg;

    for (size_t i = 0; i < st->n; i++)
        sched_desc_free(&st->descs[i]);
    sched_free(st->descs);
    sched_free(st);
}

static sched_status_t static_create(const sched_config_t *cfg, sched_pool_t *pool, void **state_out)
{
    static_state_t *st = sched_calloc(1, sizeof(*st));
    char err[200];

    if (!st)
        return SCHED_ERR_NO_MEMORY;
    st->pool = pool;
    st->descs = sched_calloc(cfg->n_instances, sizeof(*st->descs));
    if (!st->descs) {
        sched_free(st);
        return SCHED_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < cfg->n_instances; i++) {
        sched_status_t status =
            sched_desc_copy(&cfg->instances[i], &st->descs[i], err, sizeof(err));
        if (status != SCHED_OK) {
            sched_pool_logf(pool, SCHED_LOG_ERROR, "instances[%zu].%s", i, err);
            static_destroy(st);
            return status;
        }
        st->n = i + 1;
        st->descs[i].source = SCHED_SOURCE_STATIC;
    }
    *state_out = st;
    return SCHED_OK;
}

/* All of them in one snapshot: one add at a time copies the set once per instance. */
static sched_status_t static_start(void *arg)
{
    static_state_t *st = arg;
    char err[200] = "";
    sched_status_t status = sched_pool_add_many(st->pool, st->descs, st->n, err, sizeof(err));

    if (status != SCHED_OK)
        sched_pool_logf(st->pool, SCHED_LOG_ERROR, "instances: %s", err);
    return status;
}

static const sched_discovery_ops_t sched_discovery_static_ops = {
    .name = "static",
    .source = SCHED_SOURCE_STATIC,
    .configured = static_configured,
    .create = static_create,
    .start = static_start,
    .tick = NULL,
    .destroy = static_destroy,
};
