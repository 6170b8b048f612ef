/*
 * pdtok_tables.c - the compact tables a loaded tokenizer reads: the symbol table (every
 * string BPE can hold, in one arena with an open-addressing index), the merge ranks keyed
 * by a pair of symbols, and the byte trie of added-token contents.
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- symbols ---- */

pdtok_status_t tok_syms_init(tok_syms_t *t, size_t hint)
{
    memset(t, 0, sizeof(*t));
    size_t nslots = pow2_at_least(hint * 2 + 16);
    t->slots = pdb_malloc(nslots * sizeof(*t->slots));
    if (!t->slots)
        return PDTOK_ERR_NOMEM;
    memset(t->slots, 0xff, nslots * sizeof(*t->slots));
    t->mask = nslots - 1;
    return PDTOK_OK;
}

void tok_syms_free(tok_syms_t *t)
{
    pdb_buf_free(&t->arena);
    pdb_free(t->off);
    pdb_free(t->len);
    pdb_free(t->tok_id);
    pdb_free(t->slots);
    memset(t, 0, sizeof(*t));
}

int32_t tok_syms_find(const tok_syms_t *t, const char *s, size_t len)
{
    size_t i = hash_bytes(s, len) & t->mask;
    for (;;) {
        int32_t sym = t->slots[i];
        if (sym < 0)
            return -1;
        if (t->len[sym] == len && memcmp(t->arena.data + t->off[sym], s, len) == 0)
            return sym;
        i = (i + 1) & t->mask;
    }
}

static pdtok_status_t syms_grow_index(tok_syms_t *t)
{
    size_t nslots = (t->mask + 1) * 2;
    int32_t *slots = pdb_malloc(nslots * sizeof(*slots));
    if (!slots)
        return PDTOK_ERR_NOMEM;
    memset(slots, 0xff, nslots * sizeof(*slots));
    for (size_t s = 0; s < t->n; s++) {
        size_t i = hash_bytes(t->arena.data + t->off[s], t->len[s]) & (nslots - 1);
        while (slots[i] >= 0)
            i = (i + 1) & (nslots - 1);
        slots[i] = (int32_t)s;
    }
    pdb_free(t->slots);
    t->slots = slots;
    t->mask = nslots - 1;
    return PDTOK_OK;
}

pdtok_status_t tok_syms_intern(tok_syms_t *t, const char *s, size_t len, int32_t *sym)
{
    int32_t found = tok_syms_find(t, s, len);
    if (found >= 0) {
        *sym = found;
        return PDTOK_OK;
    }
    if (t->n >= INT32_MAX - 1 || t->arena.len + len >= UINT32_MAX)
        return PDTOK_ERR_INVALID;
    if ((t->n + 1) * 2 > t->mask + 1 && syms_grow_index(t) != PDTOK_OK)
        return PDTOK_ERR_NOMEM;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        uint32_t *off = pdb_realloc(t->off, cap * sizeof(*off));
        if (!off)
            return PDTOK_ERR_NOMEM;
        t->off = off;
        uint32_t *ln = pdb_realloc(t->len, cap * sizeof(*ln));
        if (!ln)
            return PDTOK_ERR_NOMEM;
        t->len = ln;
        int32_t *id = pdb_realloc(t->tok_id, cap * sizeof(*id));
        if (!id)
            return PDTOK_ERR_NOMEM;
        t->tok_id = id;
        t->cap = cap;
    }
    size_t off = t->arena.len;
    /* Each string is NUL-terminated in the arena so it can be handed out as a C string. */
    if (pdb_buf_append(&t->arena, s, len) != PDB_OK || pdb_buf_append_char(&t->arena, 0) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    int32_t n = (int32_t)t->n++;
    t->off[n] = (uint32_t)off;
    t->len[n] = (uint32_t)len;
    t->tok_id[n] = -1;
    size_t i = hash_bytes(s, len) & t->mask;
    while (t->slots[i] >= 0)
        i = (i + 1) & t->mask;
    t->slots[i] = n;
    *sym = n;
    return PDTOK_OK;
}

/* ---- merges ---- */

pdtok_status_t tok_merges_init(tok_merges_t *m, size_t n)
{
    size_t nslots = pow2_at_least(n * 2 + 16);
    m->slots = pdb_malloc(nslots * sizeof(*m->slots));
    if (!m->slots)
        return PDTOK_ERR_NOMEM;
    memset(m->slots, 0xff, nslots * sizeof(*m->slots));
    m->mask = nslots - 1;
    m->n = 0;
    return PDTOK_OK;
}

void tok_merges_free(tok_merges_t *m)
{
    pdb_free(m->slots);
    memset(m, 0, sizeof(*m));
}

void tok_merges_put(tok_merges_t *m, int32_t left, int32_t right, uint32_t rank, int32_t merged)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = mix64(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX) {
        if (m->slots[i].key == key) {
            /* A pair listed twice: the later rank wins, as a map filled in list order keeps. */
            m->slots[i].rank = rank;
            m->slots[i].merged = merged;
            return;
        }
        i = (i + 1) & m->mask;
    }
    m->slots[i].key = key;
    m->slots[i].rank = rank;
    m->slots[i].merged = merged;
    m->n++;
}

const tok_merge_t *tok_merges_get(const tok_merges_t *m, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = mix64(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX) {
        if (m->slots[i].key == key)
            return &m->slots[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* ---- trie ---- */

pdtok_status_t tok_trie_init(tok_trie_t *t, size_t hint)
{
    memset(t, 0, sizeof(*t));
    size_t nslots = pow2_at_least(hint * 2 + 64);
    t->edges = pdb_malloc(nslots * sizeof(*t->edges));
    t->node_end = pdb_malloc(64 * sizeof(*t->node_end));
    if (!t->edges || !t->node_end) {
        tok_trie_free(t);
        return PDTOK_ERR_NOMEM;
    }
    memset(t->edges, 0xff, nslots * sizeof(*t->edges));
    t->mask = nslots - 1;
    t->capnodes = 64;
    t->nnodes = 1;
    t->node_end[0] = -1;
    return PDTOK_OK;
}

void tok_trie_free(tok_trie_t *t)
{
    pdb_free(t->edges);
    pdb_free(t->node_end);
    memset(t, 0, sizeof(*t));
}

static size_t edge_slot(const tok_trie_t *t, uint32_t key)
{
    size_t i = mix64(key) & t->mask;
    while (t->edges[i].key != UINT32_MAX && t->edges[i].key != key)
        i = (i + 1) & t->mask;
    return i;
}

static pdtok_status_t trie_grow_edges(tok_trie_t *t)
{
    tok_trie_t bigger = *t;
    size_t nslots = (t->mask + 1) * 2;
    bigger.edges = pdb_malloc(nslots * sizeof(*bigger.edges));
    if (!bigger.edges)
        return PDTOK_ERR_NOMEM;
    memset(bigger.edges, 0xff, nslots * sizeof(*bigger.edges));
    bigger.mask = nslots - 1;
    for (size_t i = 0; i <= t->mask; i++)
        if (t->edges[i].key != UINT32_MAX)
            bigger.edges[edge_slot(&bigger, t->edges[i].key)] = t->edges[i];
    pdb_free(t->edges);
    t->edges = bigger.edges;
    t->mask = bigger.mask;
    return PDTOK_OK;
}

pdtok_status_t tok_trie_add(tok_trie_t *t, const char *s, size_t len, int32_t value)
{
    uint32_t node = 0;
    if (len)
        t->first[(unsigned char)s[0]] = 1;
    for (size_t k = 0; k < len; k++) {
        if (t->nnodes >= (1u << 23))
            return PDTOK_ERR_INVALID; /* node << 8 must fit the key */
        uint32_t key = (node << 8) | (unsigned char)s[k];
        size_t i = edge_slot(t, key);
        if (t->edges[i].key == key) {
            node = t->edges[i].child;
            continue;
        }
        if ((t->nedges + 1) * 2 > t->mask + 1) {
            if (trie_grow_edges(t) != PDTOK_OK)
                return PDTOK_ERR_NOMEM;
            i = edge_slot(t, key);
        }
        if (t->nnodes == t->capnodes) {
            int32_t *ne = pdb_realloc(t->node_end, t->capnodes * 2 * sizeof(*ne));
            if (!ne)
                return PDTOK_ERR_NOMEM;
            t->node_end = ne;
            t->capnodes *= 2;
        }
        t->node_end[t->nnodes] = -1;
        t->edges[i].key = key;
        t->edges[i].child = (uint32_t)t->nnodes;
        t->nedges++;
        node = (uint32_t)t->nnodes++;
    }
    t->node_end[node] = value; /* a content listed twice: the later entry wins */
    return PDTOK_OK;
}

int32_t tok_trie_longest(const tok_trie_t *t, const char *s, size_t n, size_t *mlen)
{
    uint32_t node = 0;
    int32_t best = -1;
    if (n == 0 || !t->first[(unsigned char)s[0]])
        return -1;
    for (size_t k = 0; k < n; k++) {
        uint32_t key = (node << 8) | (unsigned char)s[k];
        size_t i = edge_slot(t, key);
        if (t->edges[i].key != key)
            break;
        node = t->edges[i].child;
        if (t->node_end[node] >= 0) {
            best = t->node_end[node];
            *mlen = k + 1;
        }
    }
    return best;
}
