/*
 * kvt_strmap_int.h -- small string-keyed hash map (chained buckets, keys
 * copied, values borrowed) used by libkvt's bookkeeping tables. Not
 * thread-safe: the owning table holds its own lock.
 */
#ifndef KVT_STRMAP_INT_H
#define KVT_STRMAP_INT_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_status.h"

typedef struct kvt_strmap_node {
    struct kvt_strmap_node *next;
    uint64_t hash;
    void *val;
    char key[]; /* NUL-terminated copy */
} kvt_strmap_node_t;

typedef struct kvt_strmap {
    kvt_strmap_node_t **buckets;
    size_t nbuckets; /* power of two */
    size_t count;
} kvt_strmap_t;

kvt_status_t kvt_strmap_init(kvt_strmap_t *m);
/* Frees the nodes; <free_val> (may be NULL) is called on every value. */
void kvt_strmap_fini(kvt_strmap_t *m, void (*free_val)(void *val));
void *kvt_strmap_get(const kvt_strmap_t *m, const char *key);
/* KVT_ERR_EXISTS if <key> is present (nothing changed). */
kvt_status_t kvt_strmap_put(kvt_strmap_t *m, const char *key, void *val);
/* Removes <key> and returns its value (NULL if absent). */
void *kvt_strmap_remove(kvt_strmap_t *m, const char *key);
/* Visit every entry; when <cb> returns non-zero the entry is removed (after
 * the callback, which may keep the value). */
void kvt_strmap_filter(kvt_strmap_t *m, int (*cb)(void *arg, const char *key, void *val),
                       void *arg);

#endif /* KVT_STRMAP_INT_H */
