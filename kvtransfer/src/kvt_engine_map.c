/*
 * kvt_engine_map.c - a small chained hash map from strings to pointers,
 * used for the engine's keys, requests, pulls and tasks.
 */
#include <string.h>

#include "kvt_engine_int.h"

static size_t hash_str(const char *s)
{
    size_t h = 1469598103934665603ull;
    while (*s != '\0') {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return h;
}

kvt_status_t kvt_map_init(kvt_map_t *m, size_t nb)
{
    m->nb = nb ? nb : 64;
    m->n = 0;
    m->b = kvt_calloc(m->nb, sizeof(*m->b));
    return m->b != NULL ? KVT_OK : KVT_ERR_NOMEM;
}

void kvt_map_fini(kvt_map_t *m)
{
    if (m->b == NULL)
        return;
    for (size_t i = 0; i < m->nb; i++) {
        kvt_map_ent_t *x = m->b[i];
        while (x != NULL) {
            kvt_map_ent_t *nx = x->next;
            kvt_free(x->key);
            kvt_free(x);
            x = nx;
        }
    }
    kvt_free(m->b);
    m->b = NULL;
    m->n = 0;
}

static void grow(kvt_map_t *m)
{
    size_t nb = m->nb * 2;
    kvt_map_ent_t **b = kvt_calloc(nb, sizeof(*b));

    if (b == NULL)
        return; /* keep working with longer chains */
    for (size_t i = 0; i < m->nb; i++) {
        kvt_map_ent_t *x = m->b[i];
        while (x != NULL) {
            kvt_map_ent_t *nx = x->next;
            size_t h = hash_str(x->key) % nb;
            x->next = b[h];
            b[h] = x;
            x = nx;
        }
    }
    kvt_free(m->b);
    m->b = b;
    m->nb = nb;
}

void *kvt_map_get(const kvt_map_t *m, const char *key)
{
    for (kvt_map_ent_t *x = m->b[hash_str(key) % m->nb]; x != NULL; x = x->next) {
        if (strcmp(x->key, key) == 0)
            return x->val;
    }
    return NULL;
}

kvt_status_t kvt_map_put(kvt_map_t *m, const char *key, void *val)
{
    size_t h;
    kvt_map_ent_t *x;

    if (kvt_map_get(m, key) != NULL)
        return KVT_ERR_EXISTS;
    if (m->n >= m->nb * 2)
        grow(m);
    h = hash_str(key) % m->nb;
    x = kvt_malloc(sizeof(*x));
    if (x == NULL)
        return KVT_ERR_NOMEM;
    x->key = kvt_strdup(key);
    if (x->key == NULL) {
        kvt_free(x);
        return KVT_ERR_NOMEM;
    }
    x->val = val;
    x->next = m->b[h];
    m->b[h] = x;
    m->n++;
    return KVT_OK;
}

void *kvt_map_del(kvt_map_t *m, const char *key)
{
    kvt_map_ent_t **pp = &m->b[hash_str(key) % m->nb];

    for (; *pp != NULL; pp = &(*pp)->next) {
        kvt_map_ent_t *x = *pp;
        if (strcmp(x->key, key) == 0) {
            void *v = x->val;
            *pp = x->next;
            kvt_free(x->key);
            kvt_free(x);
            m->n--;
            return v;
        }
    }
    return NULL;
}

void kvt_map_each(const kvt_map_t *m, void (*fn)(void *arg, const char *key, void *val), void *arg)
{
    for (size_t i = 0; i < m->nb; i++) {
        for (kvt_map_ent_t *x = m->b[i]; x != NULL; x = x->next)
            fn(arg, x->key, x->val);
    }
}
