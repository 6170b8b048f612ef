/*
 * pdtok_bpe.c - byte-pair encoding of one pre-tokenized word, and the bounded per-thread
 * cache of recent words -> ids in front of it.
 *
 * Merges are applied lowest rank first; among equal ranks the leftmost pair goes first (the
 * reference breaks ties by the left symbol's original position, which a merged symbol
 * keeps). A heap of candidate pairs, each checked against the symbols' generation counters
 * when it is popped, makes a long word (a whole SentencePiece section) O(n log n).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"

/* ---- per-thread cache: direct-mapped, short words only ---- */
#define CACHE_SLOTS    2048
#define CACHE_WORD_MAX 46
#define CACHE_IDS_MAX  14

typedef struct cache_entry {
    uint64_t instance; /* 0 = empty */
    uint64_t hash;
    uint8_t wlen, nids;
    char word[CACHE_WORD_MAX];
    int32_t ids[CACHE_IDS_MAX];
} cache_entry_t;

typedef struct word_cache {
    cache_entry_t e[CACHE_SLOTS];
} word_cache_t;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static _Thread_local word_cache_t *tls_cache;
static _Thread_local bool tls_cache_failed;

static void cache_destroy(void *p)
{
    pdb_free(p);
}

static void cache_key_create(void)
{
    pthread_key_create(&cache_key, cache_destroy);
}

static word_cache_t *thread_cache(void)
{
    if (tls_cache || tls_cache_failed)
        return tls_cache;
    pthread_once(&cache_once, cache_key_create);
    tls_cache = pdb_calloc(1, sizeof(word_cache_t));
    if (!tls_cache) {
        tls_cache_failed = true; /* run uncached rather than fail the encode */
        return NULL;
    }
    pthread_setspecific(cache_key, tls_cache);
    return tls_cache;
}

static uint64_t word_hash(const char *s, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 31);
}

/* ---- the merge loop ---- */
typedef struct bsym {
    int32_t sym; /* symbol index, -1 = not in the table (never merges) */
    uint32_t start, len;
    int32_t prev, next; /* -1 at the ends */
    uint32_t gen;       /* bumped whenever this slot changes or dies */
} bsym_t;

typedef struct bcand {
    uint32_t rank;
    int32_t left, right, merged;
    uint32_t gen_left, gen_right;
} bcand_t;

static bool cand_less(const bcand_t *a, const bcand_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bcand_t *h, size_t *n, bcand_t c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bcand_t heap_pop(bcand_t *h, size_t *n)
{
    bcand_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bcand_t *mv = &last;
        if (l < *n && cand_less(&h[l], mv)) {
            m = l;
            mv = &h[l];
        }
        if (r < *n && cand_less(&h[r], mv))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void try_pair(const pdtok_t *tok, bsym_t *s, int32_t left, bcand_t *h, size_t *nh)
{
    int32_t right = s[left].next;
    if (right < 0 || s[left].sym < 0 || s[right].sym < 0)
        return;
    const tok_merge_t *m = tok_merges_get(&tok->merges, s[left].sym, s[right].sym);
    if (!m)
        return;
    bcand_t c = {m->rank, left, right, m->merged, s[left].gen, s[right].gen};
    heap_push(h, nh, c);
}

/* The ids of a final symbol whose text is not a token: byte fallback or unk. */
static pdtok_status_t emit_unknown(const pdtok_t *tok, const char *t, size_t n, pdtok_ids_t *out)
{
    if (tok->byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < n; i++)
            all = all && tok->byte_tok[(unsigned char)t[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++)
                if (tok_ids_push(out, tok->byte_tok[(unsigned char)t[i]]) != PDTOK_OK)
                    return PDTOK_ERR_NOMEM;
            return PDTOK_OK;
        }
    }
    if (tok->unk_id < 0)
        return PDTOK_ERR_INVALID; /* no unk token: the reference would yield no id either */
    return tok_ids_push(out, tok->unk_id);
}

static pdtok_status_t bpe_uncached(const pdtok_t *tok, const char *w, size_t n, pdtok_ids_t *out)
{
    bsym_t small_s[64];
    bcand_t small_h[192];
    bsym_t *s = small_s;
    bcand_t *h = small_h;
    size_t ncp = 0;
    for (size_t i = 0; i < n; ncp++) {
        uint32_t cp;
        i += tok_utf8_next(w + i, n - i, &cp);
    }
    if (ncp > 64) {
        s = pdb_malloc(ncp * sizeof(*s));
        h = pdb_malloc(3 * ncp * sizeof(*h));
        if (!s || !h) {
            pdb_free(s == small_s ? NULL : s);
            pdb_free(h == small_h ? NULL : h);
            return PDTOK_ERR_NOMEM;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        uint32_t cp;
        size_t l = tok_utf8_next(w + i, n - i, &cp);
        s[k] = (bsym_t){tok_syms_find(&tok->syms, w + i, l),
                        (uint32_t)i,
                        (uint32_t)l,
                        (int32_t)k - 1,
                        k + 1 < ncp ? (int32_t)k + 1 : -1,
                        0};
        i += l;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ncp; i++)
        try_pair(tok, s, (int32_t)i, h, &nh);
    while (nh) {
        bcand_t c = heap_pop(h, &nh);
        bsym_t *L = &s[c.left], *R = &s[c.right];
        if (L->gen != c.gen_left || R->gen != c.gen_right || L->next != c.right)
            continue; /* stale: one side merged since */
        L->sym = c.merged;
        L->len += R->len;
        L->next = R->next;
        L->gen++;
        R->gen++;
        R->len = 0;
        if (L->next >= 0)
            s[L->next].prev = c.left;
        if (L->prev >= 0) /* (prev, old left) went stale with L's generation */
            try_pair(tok, s, L->prev, h, &nh);
        try_pair(tok, s, c.left, h, &nh);
    }
    pdtok_status_t st = PDTOK_OK;
    for (int32_t i = 0; i >= 0 && st == PDTOK_OK; i = s[i].next) {
        int32_t id = s[i].sym >= 0 ? tok->syms.tok_id[s[i].sym] : -1;
        st = id >= 0 ? tok_ids_push(out, id) : emit_unknown(tok, w + s[i].start, s[i].len, out);
    }
    if (s != small_s)
        pdb_free(s);
    if (h != small_h)
        pdb_free(h);
    return st;
}

pdtok_status_t tok_bpe_word(const pdtok_t *tok, const char *w, size_t n, pdtok_ids_t *out)
{
    if (n == 0)
        return PDTOK_OK;
    if (tok->ignore_merges) {
        int32_t sym = tok_syms_find(&tok->syms, w, n);
        if (sym >= 0 && tok->syms.tok_id[sym] >= 0)
            return tok_ids_push(out, tok->syms.tok_id[sym]);
    }
    word_cache_t *c = n <= CACHE_WORD_MAX ? thread_cache() : NULL;
    cache_entry_t *e = NULL;
    uint64_t hv = 0;
    if (c) {
        hv = word_hash(w, n);
        e = &c->e[hv & (CACHE_SLOTS - 1)];
        if (e->instance == tok->instance && e->hash == hv && e->wlen == n &&
            memcmp(e->word, w, n) == 0) {
            for (size_t i = 0; i < e->nids; i++)
                if (tok_ids_push(out, e->ids[i]) != PDTOK_OK)
                    return PDTOK_ERR_NOMEM;
            return PDTOK_OK;
        }
    }
    size_t before = out->len;
    pdtok_status_t st = bpe_uncached(tok, w, n, out);
    if (st != PDTOK_OK) {
        out->len = before;
        return st;
    }
    size_t got = out->len - before;
    if (e && got <= CACHE_IDS_MAX) {
        e->instance = tok->instance;
        e->hash = hv;
        e->wlen = (uint8_t)n;
        e->nids = (uint8_t)got;
        memcpy(e->word, w, n);
        memcpy(e->ids, out->ids + before, got * sizeof(int32_t));
    }
    return PDTOK_OK;
}
