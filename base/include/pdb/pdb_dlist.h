/*
 * pdb_dlist.h - an intrusive doubly linked list: an object holds a pdb_dlink_t and is on the
 * list at most once, so adding is idempotent and taking out of the middle costs nothing.
 * Whether a link is on the list follows from the links themselves (no flag to keep in step).
 * Links start zeroed (calloc, memset) and are zeroed again when taken out.
 */
#ifndef PDB_DLIST_H
#define PDB_DLIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pdb_dlink {
    struct pdb_dlink *prev, *next;
} pdb_dlink_t;

typedef struct pdb_dlist {
    pdb_dlink_t *head;
} pdb_dlist_t;

/* The object of type <type> whose member <member> is the link <l>. */
#define PDB_DLIST_ENTRY(l, type, member) ((type *)(void *)((char *)(l)-offsetof(type, member)))

static inline bool pdb_dlist_empty(const pdb_dlist_t *list)
{
    return list->head == NULL;
}

static inline bool pdb_dlist_linked(const pdb_dlist_t *list, const pdb_dlink_t *l)
{
    return l->prev != NULL || list->head == l;
}

/* Put <l> first, unless it is on the list already. */
static inline void pdb_dlist_push(pdb_dlist_t *list, pdb_dlink_t *l)
{
    if (pdb_dlist_linked(list, l))
        return;
    l->prev = NULL;
    l->next = list->head;
    if (list->head != NULL)
        list->head->prev = l;
    list->head = l;
}

/* Take <l> out, if it is on the list. */
static inline void pdb_dlist_remove(pdb_dlist_t *list, pdb_dlink_t *l)
{
    if (!pdb_dlist_linked(list, l))
        return;
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        list->head = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

#endif /* PDB_DLIST_H */
