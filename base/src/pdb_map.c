/*
 * pdb_map.c - string-keyed hash map (see pdb_map.h).
 */
#include "pdb/pdb_map.h"

#include <string.h>

#include "pdb/pdb_alloc.h"

#define MAP_MIN_BUCKETS 16

/* FNV-1a, 64 bits. */
static uint64_t hash_key(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s != '\0') {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return h;
}

pdb_status_t pdb_map_init(pdb_map_t *m, size_t hint)
{
    size_t nb = MAP_MIN_BUCKETS;

    while (nb < hint && nb < ((size_t)1 << 30))
        nb *= 2;
    memset(m, 0, sizeof(*m));
    m->buckets = pdb_calloc(nb, sizeof(*m->buckets));
    if (m->buckets == NULL)
        return PDB_ERR_NOMEM;
    m->nbuckets = nb;
    return PDB_OK;
}

void pdb_map_fini(pdb_map_t *m, void (*free_val)(void *val))
{
    for (size_t b = 0; b < m->nbuckets; b++) {
        pdb_map_node_t *n = m->buckets[b];
        while (n != NULL) {
            pdb_map_node_t *next = n->next;
            if (free_val != NULL)
                free_val(n->val);
            pdb_free(n);
            n = next;
        }
    }
    pdb_free(m->buckets);
    memset(m, 0, sizeof(*m));
}

/* The link that points at <key>'s node, or at the NULL ending its chain. */
static pdb_map_node_t **find(const pdb_map_t *m, const char *key, uint64_t h)
{
    pdb_map_node_t **pp = &m->buckets[h & (m->nbuckets - 1)];

    while (*pp != NULL && ((*pp)->hash != h || strcmp((*pp)->key, key) != 0))
        pp = &(*pp)->next;
    return pp;
}

static void grow(pdb_map_t *m)
{
    size_t nb = m->nbuckets * 2;
    pdb_map_node_t **b = pdb_calloc(nb, sizeof(*b));

    if (b == NULL)
        return;
    for (size_t i = 0; i < m->nbuckets; i++) {
        pdb_map_node_t *n = m->buckets[i];
        while (n != NULL) {
            pdb_map_node_t *next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    pdb_free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
}

void *pdb_map_get(const pdb_map_t *m, const char *key)
{
    pdb_map_node_t *n;

    if (m->buckets == NULL || key == NULL)
        return NULL;
    n = *find(m, key, hash_key(key));
    return n != NULL ? n->val : NULL;
}

pdb_status_t pdb_map_put(pdb_map_t *m, const char *key, void *val)
{
    uint64_t h;
    size_t klen;
    pdb_map_node_t **pp, *n;

    if (m->buckets == NULL || key == NULL)
        return PDB_ERR_INVALID;
    h = hash_key(key);
    pp = find(m, key, h);
    if (*pp != NULL)
        return PDB_ERR_EXISTS;
    klen = strlen(key);
    n = pdb_malloc(sizeof(*n) + klen + 1);
    if (n == NULL)
        return PDB_ERR_NOMEM;
    n->next = NULL;
    n->hash = h;
    n->val = val;
    memcpy(n->key, key, klen + 1);
    *pp = n;
    if (++m->count > m->nbuckets)
        grow(m);
    return PDB_OK;
}

void *pdb_map_remove(pdb_map_t *m, const char *key)
{
    pdb_map_node_t **pp, *n;
    void *val;

    if (m->buckets == NULL || key == NULL)
        return NULL;
    pp = find(m, key, hash_key(key));
    n = *pp;
    if (n == NULL)
        return NULL;
    *pp = n->next;
    val = n->val;
    pdb_free(n);
    m->count--;
    return val;
}

void pdb_map_each(const pdb_map_t *m, void (*fn)(void *arg, const char *key, void *val), void *arg)
{
    for (size_t b = 0; b < m->nbuckets; b++) {
        for (pdb_map_node_t *n = m->buckets[b]; n != NULL; n = n->next)
            fn(arg, n->key, n->val);
    }
}

void pdb_map_filter(pdb_map_t *m, int (*cb)(void *arg, const char *key, void *val), void *arg)
{
    for (size_t b = 0; b < m->nbuckets; b++) {
        pdb_map_node_t **pp = &m->buckets[b];
        while (*pp != NULL) {
            pdb_map_node_t *n = *pp;
            if (cb(arg, n->key, n->val)) {
                *pp = n->next;
                pdb_free(n);
                m->count--;
            } else {
                pp = &n->next;
            }
        }
    }
}
