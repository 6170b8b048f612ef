/*
 * Which models an instance serves: the names configured for it (descriptor `models`), else
 * the names its engine lists on GET /v1/models (the OpenAI list shape vLLM and SGLang
 * serve: {"object":"list","data":[{"id":...,"object":"model",...}]}), learnt with each
 * health probe. Every pick filters on them (sched_policy.c `allowed`), so a request only
 * reaches instances of its model, whatever the policy.
 *
 * The learnt set of an instance is replaced as a whole under inst->mu; readers take inst->mu
 * too (a pick only for instances without configured names).
 */
#include <stdio.h>
#include <string.h>

#include "sched_int.h"

#define LEARN_MAX_MODELS 256

void sched_models_free(sched_models_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++) {
        sched_free(m->names[i]);
        sched_free(m->entries[i]);
    }
    sched_free(m->names);
    sched_free(m->entries);
    sched_free(m->adapter);
    sched_free(m);
}

static bool configured_serves(const sched_instance_desc_t *d, const char *model)
{
    for (size_t i = 0; i < d->n_models; i++) {
        if (strcmp(d->models[i], model) == 0)
            return true;
    }
    return false;
}

bool sched_models_allow(sched_instance_t *inst, const char *model)
{
    bool ok = true;

    if (!model || !*model)
        return true;
    if (inst->desc.n_models)
        return configured_serves(&inst->desc, model);
    pthread_mutex_lock(&inst->mu);
    if (inst->learnt) {
        ok = false;
        for (size_t i = 0; i < inst->learnt->n && !ok; i++)
            ok = strcmp(inst->learnt->names[i], model) == 0;
    }
    pthread_mutex_unlock(&inst->mu);
    return ok;
}

bool sched_instance_serves(sched_instance_t *inst, const char *model)
{
    return sched_models_allow(inst, model);
}

static sched_models_t *models_parse(const char *body, size_t len)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *data = json_object_get(root, "data");
    sched_models_t *m = NULL;
    size_t i, n;
    json_t *e;

    if (!json_is_array(data) || json_array_size(data) == 0)
        goto out;
    n = json_array_size(data);
    if (n > LEARN_MAX_MODELS)
        n = LEARN_MAX_MODELS;
    m = sched_calloc(1, sizeof(*m));
    if (!m)
        goto out;
    m->names = sched_calloc(n, sizeof(char *));
    m->entries = sched_calloc(n, sizeof(char *));
    m->adapter = sched_calloc(n, sizeof(bool));
    if (!m->names || !m->entries || !m->adapter)
        goto err;
    json_array_foreach(data, i, e)
    {
        const char *id = json_string_value(json_object_get(e, "id"));
        char *text;
        if (i == n)
            break;
        if (!json_is_object(e) || !id || !*id || strlen(id) > SCHED_MODEL_NAME_MAX)
            continue; /* a malformed entry names nothing */
        text = json_dumps(e, JSON_COMPACT);
        /* vLLM lists a base model with parent null and each LoRA adapter with parent = its base
         * model's name (vllm/entrypoints/openai/models/serving.py show_available_models) */
        m->adapter[m->n] = json_is_string(json_object_get(e, "parent"));
        m->names[m->n] = sched_strdup(id);
        m->entries[m->n] = text ? sched_strdup(text) : NULL;
        free(text);
        if (!m->names[m->n] || !m->entries[m->n]) {
            sched_free(m->names[m->n]);
            sched_free(m->entries[m->n]);
            goto err;
        }
        m->n++;
    }
    if (m->n == 0)
        goto err;
out:
    json_decref(root);
    return m;
err:
    sched_models_free(m);
    json_decref(root);
    return NULL;
}

static bool models_same(const sched_models_t *a, const sched_models_t *b)
{
    if (!a || !b || a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->names[i], b->names[i]) != 0 || a->adapter[i] != b->adapter[i])
            return false;
    }
    return true;
}

void sched_models_learn(sched_pool_t *pool, sched_instance_t *inst, const char *body, size_t len)
{
    sched_models_t *m = body ? models_parse(body, len) : NULL;
    sched_models_t *old;
    bool changed;

    if (!m)
        return;
    pthread_mutex_lock(&inst->mu);
    old = inst->learnt;
    changed = !models_same(old, m);
    inst->learnt = m;
    pthread_mutex_unlock(&inst->mu);
    sched_models_free(old);
    if (changed)
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s serves %zu model(s), first '%s'",
                        inst->desc.id, m->n, m->names[0]);
}

bool sched_pool_has_model(sched_pool_t *pool, const char *model)
{
    bool found = false;

    if (!model || !*model)
        return true;
    pthread_rwlock_rdlock(&pool->lock);
    found = pool->snap->n_all == 0; /* an empty pool is "no instance" (503), not "no model" */
    for (size_t i = 0; i < pool->snap->n_all && !found; i++)
        found = sched_models_allow(pool->snap->all[i], model);
    pthread_rwlock_unlock(&pool->lock);
    return found;
}

static bool learnt_adapter(sched_instance_t *inst, const char *model)
{
    bool yes = false;

    pthread_mutex_lock(&inst->mu);
    for (size_t i = 0; inst->learnt && i < inst->learnt->n && !yes; i++)
        yes = inst->learnt->adapter[i] && strcmp(inst->learnt->names[i], model) == 0;
    pthread_mutex_unlock(&inst->mu);
    return yes;
}

bool sched_pool_model_is_adapter(sched_pool_t *pool, const char *model)
{
    bool yes = false;

    if (!model || !*model)
        return false;
    pthread_rwlock_rdlock(&pool->lock);
    for (size_t i = 0; i < pool->snap->n_all && !yes; i++)
        yes = learnt_adapter(pool->snap->all[i], model);
    pthread_rwlock_unlock(&pool->lock);
    return yes;
}

sched_instance_t *sched_pool_pick_usable_model(sched_pool_t *pool, sched_role_t role, uint64_t turn,
                                               const char *model)
{
    int ridx = role == SCHED_ROLE_PREFILL ? SCHED_RIDX_PREFILL : SCHED_RIDX_DECODE;
    uint64_t now = sched_pool_now(pool);
    const sched_snapshot_t *snap;
    sched_instance_t *found = NULL;
    size_t n, usable = 0;

    if (!model || !*model)
        return sched_pool_pick_usable(pool, role, turn);
    pthread_rwlock_rdlock(&pool->lock);
    snap = pool->snap;
    n = snap->n_role[ridx];
    for (size_t i = 0; i < n; i++)
        usable += sched_instance_selectable(snap->role[ridx][i], now) &&
                  sched_models_allow(snap->role[ridx][i], model);
    if (usable > 0) {
        size_t want = (size_t)(turn % usable);
        for (size_t i = 0; i < n && !found; i++) {
            sched_instance_t *inst = snap->role[ridx][i];
            if (sched_instance_selectable(inst, now) && sched_models_allow(inst, model) &&
                want-- == 0)
                found = sched_instance_ref(inst);
        }
    }
    pthread_rwlock_unlock(&pool->lock);
    return found;
}
