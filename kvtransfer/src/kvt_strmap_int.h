/*
 * kvt_strmap_int.h -- libkvt's names for the base string map (pdb/pdb_map.h):
 * keys copied, values borrowed. Not thread-safe: the owning table holds its
 * own lock.
 */
#ifndef KVT_STRMAP_INT_H
#define KVT_STRMAP_INT_H

#include "kvt/kvt_status.h"
#include "pdb/pdb_map.h"

typedef pdb_map_t kvt_strmap_t;

/* PDB status to kvt status (the map fails only these ways). */
static inline kvt_status_t kvt_status_of_pdb(pdb_status_t st)
{
    switch (st) {
    case PDB_OK:
        return KVT_OK;
    case PDB_ERR_NOMEM:
        return KVT_ERR_NOMEM;
    case PDB_ERR_EXISTS:
        return KVT_ERR_EXISTS;
    case PDB_ERR_NOT_FOUND:
        return KVT_ERR_NOT_FOUND;
    default:
        return KVT_ERR_INVALID;
    }
}

static inline kvt_status_t kvt_strmap_init(kvt_strmap_t *m)
{
    return kvt_status_of_pdb(pdb_map_init(m, 0));
}

/* Frees the nodes; <free_val> (may be NULL) is called on every value. */
static inline void kvt_strmap_fini(kvt_strmap_t *m, void (*free_val)(void *val))
{
    pdb_map_fini(m, free_val);
}

static inline void *kvt_strmap_get(const kvt_strmap_t *m, const char *key)
{
    return pdb_map_get(m, key);
}

/* KVT_ERR_EXISTS if <key> is present (nothing changed). */
static inline kvt_status_t kvt_strmap_put(kvt_strmap_t *m, const char *key, void *val)
{
    return kvt_status_of_pdb(pdb_map_put(m, key, val));
}

/* Removes <key> and returns its value (NULL if absent). */
static inline void *kvt_strmap_remove(kvt_strmap_t *m, const char *key)
{
    return pdb_map_remove(m, key);
}

/* Visit every entry; when <cb> returns non-zero the entry is removed (after
 * the callback, which may keep the value). */
static inline void kvt_strmap_filter(kvt_strmap_t *m,
                                     int (*cb)(void *arg, const char *key, void *val), void *arg)
{
    pdb_map_filter(m, cb, arg);
}

#endif /* KVT_STRMAP_INT_H */
