/*
 * pdtok_encode.c - text -> ids: UTF-8 repair, added-token split (longest match at each
 * position, lstrip/rstrip trimming the neighbours), then per section the normalizers, the
 * pre-tokenizers and BPE, and last the post-processor's template ids.
 */
#include <pthread.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"

typedef struct section {
    size_t s, e;
    int32_t added; /* index into tok->added, or -1 for text */
} section_t;

typedef struct scratch {
    pdb_buf_t a, b;
    tok_pieces_t p, q;
} scratch_t;

static void scratch_free(scratch_t *w)
{
    pdb_buf_free(&w->a);
    pdb_buf_free(&w->b);
    tok_pieces_free(&w->p);
    tok_pieces_free(&w->q);
}

/* Each thread keeps its scratch buffers between calls (freed when the thread ends), so a
 * warm encode allocates nothing but its output; one that grew past SCRATCH_KEEP bytes gives
 * the memory back. */
#define SCRATCH_KEEP (1u << 20)

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local scratch_t *tls_scratch;

static void scratch_destroy(void *p)
{
    if (p) {
        scratch_free(p);
        pdb_free(p);
    }
}

static void scratch_key_create(void)
{
    pthread_key_create(&scratch_key, scratch_destroy);
}

static scratch_t *scratch_get(void)
{
    if (tls_scratch)
        return tls_scratch;
    pthread_once(&scratch_once, scratch_key_create);
    scratch_t *w = pdb_calloc(1, sizeof(*w));
    if (w) {
        pthread_setspecific(scratch_key, w);
        tls_scratch = w;
    }
    return w;
}

static void scratch_release(scratch_t *w)
{
    if (w->a.cap + w->b.cap + w->p.text.cap + w->q.text.cap > SCRATCH_KEEP)
        scratch_free(w);
}

/* Collapses runs of unk ids the model produced for one section (fuse_unk). */
static void fuse_unk(const pdtok_t *tok, pdtok_ids_t *out, size_t from)
{
    size_t w = from;
    for (size_t r = from; r < out->len; r++) {
        if (out->ids[r] == tok->unk_id && w > from && out->ids[w - 1] == tok->unk_id)
            continue;
        out->ids[w++] = out->ids[r];
    }
    out->len = w;
}

static pdtok_status_t encode_section(const pdtok_t *tok, const char *s, size_t n, size_t index,
                                     scratch_t *w, pdtok_ids_t *out)
{
    const char *cur = s;
    size_t len = n;
    pdb_buf_t *bufs[2] = {&w->a, &w->b};
    for (size_t i = 0; i < tok->nnorm; i++) {
        pdb_buf_t *dst = bufs[i & 1];
        pdtok_status_t st = tok_norm_apply(&tok->norm[i], cur, len, dst);
        if (st != PDTOK_OK)
            return st;
        cur = dst->data ? dst->data : "";
        len = dst->len;
    }
    if (len == 0)
        return PDTOK_OK;
    tok_pieces_reset(&w->p);
    pdtok_status_t st = tok_pieces_add(&w->p, cur, len);
    tok_pieces_t *in = &w->p, *res = &w->q;
    for (size_t i = 0; i < tok->npre && st == PDTOK_OK; i++) {
        st = tok_pre_apply(tok, &tok->pre[i], in, index, res);
        tok_pieces_t *t = in;
        in = res;
        res = t;
    }
    size_t from = out->len;
    for (size_t i = 0; i < in->n && st == PDTOK_OK; i++)
        st = tok_bpe_word(tok, tok_piece(in, i), in->sp[i].len, out);
    if (st == PDTOK_OK && tok->fuse_unk && tok->unk_id >= 0)
        fuse_unk(tok, out, from);
    return st;
}

/* Splits <t> at added tokens into <*secs>; lstrip/rstrip trim the neighbouring text. */
static pdtok_status_t split_added(const pdtok_t *tok, const char *t, size_t n, section_t **secs,
                                  size_t *nsec)
{
    size_t cap = 16, k = 0, start = 0, i = 0;
    section_t *v = pdb_malloc(cap * sizeof(*v));
    if (!v)
        return PDTOK_ERR_NOMEM;
    while (i <= n) {
        size_t mlen = 0;
        int32_t a = i < n && tok->trie.first[(unsigned char)t[i]]
                        ? tok_trie_longest(&tok->trie, t + i, n - i, &mlen)
                        : -1;
        if (a < 0 && i < n) {
            i++;
            continue;
        }
        if (k + 2 > cap) {
            cap *= 2;
            section_t *nv = pdb_realloc(v, cap * sizeof(*nv));
            if (!nv) {
                pdb_free(v);
                return PDTOK_ERR_NOMEM;
            }
            v = nv;
        }
        if (i > start)
            v[k++] = (section_t){start, i, -1};
        if (a < 0)
            break; /* i == n */
        v[k++] = (section_t){i, i + mlen, a};
        i += mlen;
        start = i;
    }
    for (size_t j = 0; j < k; j++) {
        if (v[j].added < 0)
            continue;
        const tok_added_t *at = &tok->added[v[j].added];
        if (at->lstrip && j > 0 && v[j - 1].added < 0)
            v[j - 1].e -= tok_js_trim_end(t + v[j - 1].s, v[j - 1].e - v[j - 1].s);
        if (at->rstrip && j + 1 < k && v[j + 1].added < 0)
            v[j + 1].s += tok_js_trim_start(t + v[j + 1].s, v[j + 1].e - v[j + 1].s);
    }
    *secs = v;
    *nsec = k;
    return PDTOK_OK;
}

pdtok_status_t pdtok_encode(const pdtok_t *tok, const char *text, size_t len, bool add_special,
                            pdtok_ids_t *out)
{
    if (!tok || !out || (!text && len) || len > PDTOK_MAX_TEXT)
        return PDTOK_ERR_INVALID;
    pdb_buf_t fixed = PDB_BUF_INIT;
    const char *t = text ? text : "";
    if (tok_utf8_valid_prefix(t, len) != len) {
        if (tok_utf8_repair(t, len, &fixed) != PDTOK_OK) {
            pdb_buf_free(&fixed);
            return PDTOK_ERR_NOMEM;
        }
        t = fixed.data;
        len = fixed.len;
    }
    size_t before = out->len;
    section_t *secs = NULL;
    size_t nsec = 0;
    scratch_t *w = scratch_get();
    pdtok_status_t st = w ? PDTOK_OK : PDTOK_ERR_NOMEM;
    for (size_t i = 0; add_special && i < tok->nbos_pre && st == PDTOK_OK; i++)
        st = tok_ids_push(out, tok->bos_template[i]);
    if (st == PDTOK_OK)
        st = split_added(tok, t, len, &secs, &nsec);
    for (size_t i = 0; i < nsec && st == PDTOK_OK; i++) {
        if (secs[i].added >= 0)
            st = tok_ids_push(out, tok->added[secs[i].added].id);
        else if (secs[i].e > secs[i].s)
            st = encode_section(tok, t + secs[i].s, secs[i].e - secs[i].s, i, w, out);
    }
    for (size_t i = 0; add_special && i < tok->npost && st == PDTOK_OK; i++)
        st = tok_ids_push(out, tok->post_ids[i]);
    if (st != PDTOK_OK)
        out->len = before;
    pdb_free(secs);
    if (w)
        scratch_release(w);
    pdb_buf_free(&fixed);
    return st;
}
