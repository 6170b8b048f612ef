/*
 * sched_models_iter.c - the pool's models as typed records (sched_pool_models_each): for each
 * model name the usable instances serve, which instances serve it, their roles, and the
 * engine's own `created` / `owned_by` / list entry when the name was learnt. GET /v1/models
 * (gateway) and anything else that lists models build on it; nothing here writes JSON.
 */
#include <string.h>
#include <time.h>

#include "sched_int.h"

typedef struct model_acc {
    sched_model_info_t info;
    char *name, *entry, *owned_by; /* owned copies behind info's pointers */
    sched_instance_t **inst;       /* borrowed from the usable array */
    size_t cap;
} model_acc_t;

typedef struct models_set {
    model_acc_t *m;
    size_t n, cap;
} models_set_t;

sched_status_t sched_pool_usable(sched_pool_t *pool, sched_instance_t ***out, size_t *n_out)
{
    sched_instance_t **arr;
    size_t n = 0;
    uint64_t now = sched_pool_now(pool);

    pthread_rwlock_rdlock(&pool->lock);
    arr = sched_malloc((pool->snap->n_all ? pool->snap->n_all : 1) * sizeof(*arr));
    for (size_t i = 0; arr != NULL && i < pool->snap->n_all; i++)
        if (sched_instance_selectable(pool->snap->all[i], now))
            arr[n++] = sched_instance_ref(pool->snap->all[i]);
    pthread_rwlock_unlock(&pool->lock);
    if (arr == NULL)
        return SCHED_ERR_NO_MEMORY;
    *out = arr;
    *n_out = n;
    return SCHED_OK;
}

void sched_pool_release_usable(sched_instance_t **arr, size_t n)
{
    sched_pool_release_collected(arr, n);
}

static void set_free(models_set_t *set)
{
    for (size_t i = 0; i < set->n; i++) {
        sched_free(set->m[i].name);
        sched_free(set->m[i].entry);
        sched_free(set->m[i].owned_by);
        sched_free(set->m[i].inst);
    }
    sched_free(set->m);
}

/* The engine's created and owned_by out of its list entry (absent: now, NULL). */
static bool entry_fields(model_acc_t *a, const char *entry, int64_t now_s)
{
    json_t *e = json_loads(entry, 0, NULL);
    json_t *created = json_object_get(e, "created");
    const char *owned = json_string_value(json_object_get(e, "owned_by"));
    bool ok = true;

    a->info.created = json_is_integer(created) ? (int64_t)json_integer_value(created) : now_s;
    if (owned != NULL)
        ok = (a->owned_by = sched_strdup(owned)) != NULL;
    a->entry = sched_strdup(entry);
    json_decref(e);
    return ok && a->entry != NULL;
}

/* Add <inst> to the record of <name> (created on first sight). false on no memory. */
static bool set_add(models_set_t *set, const char *name, const char *entry, sched_instance_t *inst,
                    int64_t now_s)
{
    model_acc_t *a = NULL;

    for (size_t i = 0; i < set->n && a == NULL; i++)
        if (strcmp(set->m[i].name, name) == 0)
            a = &set->m[i];
    if (a == NULL) {
        if (set->n == set->cap) {
            size_t cap = set->cap ? 2 * set->cap : 8;
            model_acc_t *grown = sched_realloc(set->m, cap * sizeof(*grown));
            if (grown == NULL)
                return false;
            set->m = grown;
            set->cap = cap;
        }
        a = &set->m[set->n++];
        memset(a, 0, sizeof(*a));
        a->info.configured = entry == NULL;
        a->info.created = now_s;
        if ((a->name = sched_strdup(name)) == NULL || (entry && !entry_fields(a, entry, now_s)))
            return false;
    }
    if (a->info.n_instances == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4;
        sched_instance_t **grown = sched_realloc(a->inst, cap * sizeof(*grown));
        if (grown == NULL)
            return false;
        a->inst = grown;
        a->cap = cap;
    }
    a->inst[a->info.n_instances++] = inst;
    a->info.roles |= (unsigned)inst->desc.role;
    return true;
}

/* The names of one instance into <set>; *known false when its engine was not asked yet. */
static bool add_instance(models_set_t *set, sched_instance_t *inst, int64_t now_s, bool *known)
{
    const sched_instance_desc_t *d = &inst->desc;
    bool ok = true;

    for (size_t k = 0; k < d->n_models && ok; k++)
        ok = set_add(set, d->models[k], NULL, inst, now_s);
    if (d->n_models)
        return ok;
    pthread_mutex_lock(&inst->mu);
    if (!inst->learnt)
        *known = false;
    for (size_t k = 0; ok && inst->learnt && k < inst->learnt->n; k++)
        ok = set_add(set, inst->learnt->names[k], inst->learnt->entries[k], inst, now_s);
    pthread_mutex_unlock(&inst->mu);
    return ok;
}

sched_status_t sched_pool_models_each(sched_pool_t *pool, sched_model_fn_t fn, void *arg,
                                      bool *all_known_out)
{
    sched_instance_t **usable = NULL;
    size_t n_usable = 0;
    models_set_t set = {NULL, 0, 0};
    int64_t now_s = (int64_t)time(NULL);
    bool known = true, ok = true;

    if (sched_pool_usable(pool, &usable, &n_usable) != SCHED_OK)
        return SCHED_ERR_NO_MEMORY;
    for (size_t i = 0; i < n_usable && ok; i++)
        ok = add_instance(&set, usable[i], now_s, &known);
    for (size_t i = 0; ok && i < set.n; i++) {
        model_acc_t *a = &set.m[i];
        a->info.name = a->name;
        a->info.entry = a->entry;
        a->info.owned_by = a->owned_by;
        a->info.instances = a->inst;
        if (!fn(&a->info, arg))
            break;
    }
    set_free(&set);
    sched_pool_release_usable(usable, n_usable);
    if (all_known_out)
        *all_known_out = known;
    return ok ? SCHED_OK : SCHED_ERR_NO_MEMORY;
}
