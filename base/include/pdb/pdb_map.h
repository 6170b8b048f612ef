/*
 * pdb_map.h - a string-keyed hash map (chained buckets; keys copied, values borrowed).
 *
 * Not thread-safe: the owner holds its own lock. The map grows as it fills; when growing
 * fails it keeps working with longer chains.
 */
#ifndef PDB_MAP_H
#define PDB_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdb_map_node {
    struct pdb_map_node *next;
    uint64_t hash;
    void *val;
    char key[]; /* NUL-terminated copy */
} pdb_map_node_t;

typedef struct pdb_map {
    pdb_map_node_t **buckets; /* NULL until pdb_map_init succeeded */
    size_t nbuckets;          /* a power of two */
    size_t count;
} pdb_map_t;

/* <hint>: expected entries (0 = small). PDB_ERR_NOMEM leaves <m> zeroed. */
pdb_status_t pdb_map_init(pdb_map_t *m, size_t hint);
/* Frees the nodes; <free_val> (may be NULL) is called on every value. Safe on a zeroed map. */
void pdb_map_fini(pdb_map_t *m, void (*free_val)(void *val));
void *pdb_map_get(const pdb_map_t *m, const char *key);
/* PDB_ERR_EXISTS if <key> is present (nothing changed), PDB_ERR_NOMEM. */
pdb_status_t pdb_map_put(pdb_map_t *m, const char *key, void *val);
/* Removes <key> and returns its value (NULL if absent). */
void *pdb_map_remove(pdb_map_t *m, const char *key);
/* Calls <fn> on every entry; <fn> must not change the map. */
void pdb_map_each(const pdb_map_t *m, void (*fn)(void *arg, const char *key, void *val), void *arg);
/* Calls <cb> on every entry and removes those it returns non-zero for (after the call, which
 * may keep or free the value). */
void pdb_map_filter(pdb_map_t *m, int (*cb)(void *arg, const char *key, void *val), void *arg);

static inline size_t pdb_map_count(const pdb_map_t *m)
{
    return m->count;
}

#ifdef __cplusplus
}
#endif
#endif /* PDB_MAP_H */
