/*
 * pdtok_pretok.c - pre-tokenizers: split a normalized section into the words BPE sees.
 *
 * Split follows tokenizer.json's behaviors (Isolated, Removed, MergedWithPrevious,
 * MergedWithNext, Contiguous; invert swaps delimiters and the rest). ByteLevel optionally
 * splits with the GPT-2 pattern and maps every byte to its printable stand-in. Digits,
 * Punctuation, Whitespace, WhitespaceSplit and Metaspace split as the reference does.
 */
#include <string.h>

#include "pdtok_int.h"

typedef struct seg {
    size_t s, e;
    bool delim;
} seg_t;

/* Calls add() for each segment of <t> (matches of <re> and the gaps between them). */
static pdtok_status_t each_segment(const tok_regex_t *re, const char *t, size_t n, bool invert,
                                   pdtok_status_t (*add)(void *, seg_t), void *arg)
{
    size_t pos = 0, gap = 0;
    while (pos <= n) {
        size_t ms, me;
        int rc = tok_regex_find(re, t, n, pos, &ms, &me);
        if (rc < 0)
            return (pdtok_status_t)rc;
        if (rc == 0)
            break;
        if (me == ms) { /* empty matches delimit nothing; step one code point */
            if (ms >= n)
                break;
            uint32_t cp;
            pos = ms + tok_utf8_next(t + ms, n - ms, &cp);
            continue;
        }
        pdtok_status_t st;
        if (ms > gap && (st = add(arg, (seg_t){gap, ms, invert})) != PDTOK_OK)
            return st;
        if ((st = add(arg, (seg_t){ms, me, !invert})) != PDTOK_OK)
            return st;
        gap = pos = me;
    }
    if (gap < n)
        return add(arg, (seg_t){gap, n, invert});
    return PDTOK_OK;
}

typedef struct split_ctx {
    const char *t;
    tok_pieces_t *out;
    tok_split_behavior_t behavior;
    bool glue_next;  /* MergedWithNext: the next segment joins the last piece */
    bool last_delim; /* Contiguous: the last piece is a run of delimiters */
    size_t first;    /* pieces of <out> before this input piece: never merged into */
} split_ctx_t;

static pdtok_status_t split_add(void *arg, seg_t g)
{
    split_ctx_t *c = arg;
    const char *s = c->t + g.s;
    size_t l = g.e - g.s;
    bool has_last = c->out->n > c->first;
    switch (c->behavior) {
    case TOK_SPLIT_REMOVED:
        return g.delim ? PDTOK_OK : tok_pieces_add(c->out, s, l);
    case TOK_SPLIT_ISOLATED:
        return tok_pieces_add(c->out, s, l);
    case TOK_SPLIT_MERGED_PREV:
        if (g.delim && has_last && !c->last_delim)
            return c->last_delim = true, tok_pieces_extend_last(c->out, s, l);
        c->last_delim = false;
        return tok_pieces_add(c->out, s, l);
    case TOK_SPLIT_MERGED_NEXT: {
        bool glue = c->glue_next && has_last;
        c->glue_next = g.delim;
        return glue ? tok_pieces_extend_last(c->out, s, l) : tok_pieces_add(c->out, s, l);
    }
    case TOK_SPLIT_CONTIGUOUS: {
        bool glue = g.delim && c->last_delim && has_last;
        c->last_delim = g.delim;
        return glue ? tok_pieces_extend_last(c->out, s, l) : tok_pieces_add(c->out, s, l);
    }
    }
    return PDTOK_ERR_INVALID;
}

/* Only the matches of <re> (the reference's String.prototype.match with a global RegExp). */
static pdtok_status_t matches_only(const tok_regex_t *re, const char *t, size_t n,
                                   tok_pieces_t *out)
{
    size_t pos = 0;
    while (pos <= n) {
        size_t ms, me;
        int rc = tok_regex_find(re, t, n, pos, &ms, &me);
        if (rc < 0)
            return (pdtok_status_t)rc;
        if (rc == 0)
            break;
        if (me == ms) {
            if (ms >= n)
                break;
            uint32_t cp;
            pos = ms + tok_utf8_next(t + ms, n - ms, &cp);
            continue;
        }
        pdtok_status_t st = tok_pieces_add(out, t + ms, me - ms);
        if (st != PDTOK_OK)
            return st;
        pos = me;
    }
    return PDTOK_OK;
}

static pdtok_status_t byte_map(const pdtok_t *tok, const char *t, size_t n, tok_pieces_t *out)
{
    pdtok_status_t st = tok_pieces_add(out, "", 0);
    for (size_t i = 0; i < n && st == PDTOK_OK; i++) {
        unsigned char b = (unsigned char)t[i];
        st = tok_pieces_extend_last(out, tok->bl_char[b], tok->bl_len[b]);
    }
    return st;
}

static pdtok_status_t bytelevel(const pdtok_t *tok, const tok_pre_t *pre, const char *t, size_t n,
                                tok_pieces_t *out)
{
    pdb_buf_t tmp = PDB_BUF_INIT;
    pdtok_status_t st = PDTOK_OK;
    if (pre->add_prefix_space && (n == 0 || t[0] != ' ')) {
        if (pdb_buf_append_char(&tmp, ' ') != PDB_OK || pdb_buf_append(&tmp, t, n) != PDB_OK) {
            pdb_buf_free(&tmp);
            return PDTOK_ERR_NOMEM;
        }
        t = tmp.data;
        n = tmp.len;
    }
    if (!pre->use_regex) {
        st = byte_map(tok, t, n, out);
    } else {
        tok_pieces_t words = {0};
        st = matches_only(&tok->gpt2_re, t, n, &words);
        for (size_t i = 0; i < words.n && st == PDTOK_OK; i++)
            st = byte_map(tok, tok_piece(&words, i), words.sp[i].len, out);
        tok_pieces_free(&words);
    }
    pdb_buf_free(&tmp);
    return st;
}

static pdtok_status_t metaspace(const tok_pre_t *pre, const char *t, size_t n, size_t section,
                                tok_pieces_t *out)
{
    pdtok_status_t st = tok_pieces_add(out, "", 0);
    bool starts = n >= pre->meta_len && memcmp(t, pre->meta, pre->meta_len) == 0;
    bool want = pre->prepend == 1 || (pre->prepend == 2 && section == 0);
    if (st == PDTOK_OK && pre->add_prefix_space && !starts && want && !(n > 0 && t[0] == ' '))
        st = tok_pieces_extend_last(out, pre->meta, pre->meta_len);
    for (size_t i = 0; i < n && st == PDTOK_OK; i++)
        st = t[i] == ' ' ? tok_pieces_extend_last(out, pre->meta, pre->meta_len)
                         : tok_pieces_extend_last(out, t + i, 1);
    return st;
}

pdtok_status_t tok_pre_apply(const pdtok_t *tok, const tok_pre_t *pre, const tok_pieces_t *in,
                             size_t section, tok_pieces_t *out)
{
    tok_pieces_reset(out);
    pdtok_status_t st = PDTOK_OK;
    for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
        const char *t = tok_piece(in, i);
        size_t n = in->sp[i].len;
        switch (pre->kind) {
        case TOK_PRE_SPLIT: {
            split_ctx_t c = {t, out, pre->behavior, false, false, out->n};
            st = each_segment(&pre->re, t, n, pre->invert, split_add, &c);
            break;
        }
        case TOK_PRE_BYTELEVEL:
            st = bytelevel(tok, pre, t, n, out);
            break;
        case TOK_PRE_DIGITS:
        case TOK_PRE_PUNCT:
        case TOK_PRE_WHITESPACE:
        case TOK_PRE_WSSPLIT:
            st = matches_only(&pre->re, t, n, out);
            break;
        case TOK_PRE_METASPACE:
            st = metaspace(pre, t, n, section, out);
            break;
        }
    }
    return st;
}
