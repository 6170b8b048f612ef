/*
 * kvt_strmap.c -- string-keyed hash map for the bookkeeping tables
 * (breaker, pull-pending, reservations).
 */
#include "kvt_strmap_int.h"

#include <string.h>
#include <xxhash.h>

#define STRMAP_MIN_BUCKETS 16

static uint64_t key_hash(const char *key, size_t len)
{
    return XXH3_64bits(key, len);
}

kvt_status_t kvt_strmap_init(kvt_strmap_t *m)
{
    m->buckets = kvt_calloc(STRMAP_MIN_BUCKETS, sizeof(*m->buckets));
    if (m->buckets == NULL)
        return KVT_ERR_NOMEM;
    m->nbuckets = STRMAP_MIN_BUCKETS;
    m->count = 0;
    return KVT_OK;
}

void kvt_strmap_fini(kvt_strmap_t *m, void (*free_val)(void *val))
{
    if (m->buckets == NULL)
        return;
    for (size_t b = 0; b < m->nbuckets; b++) {
        kvt_strmap_node_t *n = m->buckets[b];
        while (n != NULL) {
            kvt_strmap_node_t *next = n->next;
            if (free_val != NULL)
                free_val(n->val);
            kvt_free(n);
            n = next;
        }
    }
    kvt_free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = 0;
    m->count = 0;
}

static kvt_strmap_node_t **find_slot(const kvt_strmap_t *m, const char *key, uint64_t h)
{
    kvt_strmap_node_t **pp = &m->buckets[h & (m->nbuckets - 1)];
    while (*pp != NULL && ((*pp)->hash != h || strcmp((*pp)->key, key) != 0))
        pp = &(*pp)->next;
    return pp;
}

void *kvt_strmap_get(const kvt_strmap_t *m, const char *key)
{
    kvt_strmap_node_t **pp = find_slot(m, key, key_hash(key, strlen(key)));
    return *pp != NULL ? (*pp)->val : NULL;
}

static void grow(kvt_strmap_t *m)
{
    size_t nb = m->nbuckets * 2;
    kvt_strmap_node_t **nbk = kvt_calloc(nb, sizeof(*nbk));

    if (nbk == NULL)
        return; /* keep working with longer chains */
    for (size_t b = 0; b < m->nbuckets; b++) {
        kvt_strmap_node_t *n = m->buckets[b];
        while (n != NULL) {
            kvt_strmap_node_t *next = n->next;
            n->next = nbk[n->hash & (nb - 1)];
            nbk[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    kvt_free(m->buckets);
    m->buckets = nbk;
    m->nbuckets = nb;
}

kvt_status_t kvt_strmap_put(kvt_strmap_t *m, const char *key, void *val)
{
    size_t len = strlen(key);
    uint64_t h = key_hash(key, len);
    kvt_strmap_node_t **pp = find_slot(m, key, h);
    kvt_strmap_node_t *n;

    if (*pp != NULL)
        return KVT_ERR_EXISTS;
    n = kvt_malloc(sizeof(*n) + len + 1);
    if (n == NULL)
        return KVT_ERR_NOMEM;
    n->hash = h;
    n->val = val;
    memcpy(n->key, key, len + 1);
    n->next = NULL;
    *pp = n;
    m->count++;
    if (m->count > m->nbuckets)
        grow(m);
    return KVT_OK;
}

void *kvt_strmap_remove(kvt_strmap_t *m, const char *key)
{
    kvt_strmap_node_t **pp = find_slot(m, key, key_hash(key, strlen(key)));
    kvt_strmap_node_t *n = *pp;
    void *val;

    if (n == NULL)
        return NULL;
    *pp = n->next;
    val = n->val;
    kvt_free(n);
    m->count--;
    return val;
}

void kvt_strmap_filter(kvt_strmap_t *m, int (*cb)(void *arg, const char *key, void *val), void *arg)
{
    for (size_t b = 0; b < m->nbuckets; b++) {
        kvt_strmap_node_t **pp = &m->buckets[b];
        while (*pp != NULL) {
            kvt_strmap_node_t *n = *pp;
            if (cb(arg, n->key, n->val)) {
                *pp = n->next;
                kvt_free(n);
                m->count--;
            } else {
                pp = &n->next;
            }
        }
    }
}
