/*
 * pdtok_decode.c - ids -> text: the decoder chain of tokenizer.json (ByteLevel, Replace,
 * ByteFallback, Fuse, Strip, Metaspace) over the tokens' texts, then the optional clean-up
 * of spaces before punctuation (tokenizer_config.json's clean_up_tokenization_spaces).
 * Bytes that do not form UTF-8 come out as U+FFFD, as a WHATWG TextDecoder gives them.
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"

static bool is_added_text(const pdtok_t *tok, const char *s, size_t n)
{
    size_t mlen = 0;
    return n && tok->nadded && tok_trie_longest(&tok->trie, s, n, &mlen) >= 0 && mlen == n;
}

/* Appends the bytes a byte-level token group stands for, repaired, as one piece. */
static pdtok_status_t flush_bytes(pdb_buf_t *bytes, tok_pieces_t *out)
{
    pdb_buf_t fixed = PDB_BUF_INIT;
    pdtok_status_t st = tok_utf8_repair(bytes->data ? bytes->data : "", bytes->len, &fixed);
    if (st == PDTOK_OK)
        st = tok_pieces_add(out, fixed.data ? fixed.data : "", fixed.len);
    pdb_buf_free(&fixed);
    pdb_buf_reset(bytes);
    return st;
}

static pdtok_status_t dec_bytelevel(const pdtok_t *tok, const tok_pieces_t *in, tok_pieces_t *out)
{
    pdb_buf_t bytes = PDB_BUF_INIT;
    bool open = false;
    pdtok_status_t st = PDTOK_OK;
    for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
        const char *t = tok_piece(in, i);
        size_t n = in->sp[i].len;
        if (is_added_text(tok, t, n)) {
            if (open)
                st = flush_bytes(&bytes, out);
            open = false;
            if (st == PDTOK_OK)
                st = tok_pieces_add(out, t, n);
            continue;
        }
        open = true;
        for (size_t k = 0; k < n && st == PDTOK_OK;) {
            uint32_t cp;
            k += tok_utf8_next(t + k, n - k, &cp);
            /* A character outside the byte map becomes 0, as the reference's typed array
             * turns its undefined entry into. */
            int b = cp < 512 && tok->bl_byte[cp] >= 0 ? tok->bl_byte[cp] : 0;
            if (pdb_buf_append_char(&bytes, (char)b) != PDB_OK)
                st = PDTOK_ERR_NOMEM;
        }
    }
    if (open && st == PDTOK_OK)
        st = flush_bytes(&bytes, out);
    pdb_buf_free(&bytes);
    return st;
}

static int fallback_byte(const char *t, size_t n)
{
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>')
        return -1;
    int hi = -1, lo = -1;
    char c = t[3], d = t[4];
    hi = (c >= '0' && c <= '9')   ? c - '0'
         : (c >= 'a' && c <= 'f') ? c - 'a' + 10
         : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                  : -1;
    lo = (d >= '0' && d <= '9')   ? d - '0'
         : (d >= 'a' && d <= 'f') ? d - 'a' + 10
         : (d >= 'A' && d <= 'F') ? d - 'A' + 10
                                  : -1;
    if (hi < 0 || lo < 0)
        return -1;
    return hi * 16 + lo;
}

static pdtok_status_t dec_bytefallback(const tok_pieces_t *in, tok_pieces_t *out)
{
    pdb_buf_t bytes = PDB_BUF_INIT;
    pdtok_status_t st = PDTOK_OK;
    for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
        int b = fallback_byte(tok_piece(in, i), in->sp[i].len);
        if (b >= 0) {
            if (pdb_buf_append_char(&bytes, (char)b) != PDB_OK)
                st = PDTOK_ERR_NOMEM;
            continue;
        }
        if (bytes.len)
            st = flush_bytes(&bytes, out);
        if (st == PDTOK_OK)
            st = tok_pieces_add(out, tok_piece(in, i), in->sp[i].len);
    }
    if (bytes.len && st == PDTOK_OK)
        st = flush_bytes(&bytes, out);
    pdb_buf_free(&bytes);
    return st;
}

static pdtok_status_t replace_into(const char *t, size_t n, const char *a, size_t alen,
                                   const char *b, size_t blen, tok_pieces_t *out)
{
    pdtok_status_t st = tok_pieces_add(out, "", 0);
    size_t i = 0;
    while (st == PDTOK_OK && i < n) {
        const char *hit = alen ? memmem(t + i, n - i, a, alen) : NULL;
        size_t upto = hit ? (size_t)(hit - t) : n;
        st = tok_pieces_extend_last(out, t + i, upto - i);
        if (!hit || st != PDTOK_OK)
            break;
        st = tok_pieces_extend_last(out, b, blen);
        i = upto + alen;
    }
    return st;
}

static pdtok_status_t dec_step(const pdtok_t *tok, const tok_dec_t *d, const tok_pieces_t *in,
                               tok_pieces_t *out)
{
    tok_pieces_reset(out);
    pdtok_status_t st = PDTOK_OK;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
        return dec_bytelevel(tok, in, out);
    case TOK_DEC_BYTEFALLBACK:
        return dec_bytefallback(in, out);
    case TOK_DEC_FUSE:
        st = tok_pieces_add(out, "", 0);
        for (size_t i = 0; i < in->n && st == PDTOK_OK; i++)
            st = tok_pieces_extend_last(out, tok_piece(in, i), in->sp[i].len);
        return st;
    case TOK_DEC_REPLACE:
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
            st = replace_into(tok_piece(in, i), in->sp[i].len, d->a, d->alen, d->b, d->blen, out);
            if (st == PDTOK_OK && d->kind == TOK_DEC_METASPACE && d->add_prefix_space && i == 0 &&
                out->sp[out->n - 1].len && tok_piece(out, out->n - 1)[0] == ' ') {
                out->sp[out->n - 1].off++;
                out->sp[out->n - 1].len--;
            }
        }
        return st;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
            const char *t = tok_piece(in, i);
            size_t n = in->sp[i].len, a = 0, b = n;
            for (int k = 0; k < d->start && a < n && t[a] == d->strip_char; k++)
                a++;
            for (int k = 0; k < d->stop && b > a && t[b - 1] == d->strip_char; k++)
                b--;
            st = tok_pieces_add(out, t + a, b - a);
        }
        return st;
    }
    return PDTOK_ERR_INVALID;
}

/* The reference's clean-up: drops the space before . ? ! , and English contractions. */
static pdtok_status_t clean_up(pdb_buf_t *text)
{
    static const char *const pairs[][2] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
        size_t alen = strlen(pairs[p][0]);
        if (!text->len || !memmem(text->data, text->len, pairs[p][0], alen))
            continue;
        tok_pieces_t one = {0};
        pdtok_status_t st = replace_into(text->data, text->len, pairs[p][0], alen, pairs[p][1],
                                         strlen(pairs[p][1]), &one);
        if (st == PDTOK_OK) {
            pdb_buf_reset(text);
            if (pdb_buf_append(text, tok_piece(&one, 0), one.sp[0].len) != PDB_OK)
                st = PDTOK_ERR_NOMEM;
        }
        tok_pieces_free(&one);
        if (st != PDTOK_OK)
            return st;
    }
    return PDTOK_OK;
}

pdtok_status_t pdtok_decode(const pdtok_t *tok, const int32_t *ids, size_t n, bool skip_special,
                            char **out_text, size_t *out_len)
{
    if (!tok || !out_text || (!ids && n))
        return PDTOK_ERR_INVALID;
    tok_pieces_t a = {0}, b = {0};
    pdb_buf_t text = PDB_BUF_INIT;
    pdtok_status_t st = PDTOK_OK;
    for (size_t i = 0; i < n && st == PDTOK_OK; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= tok->nids || tok->id_sym[id] < 0) {
            st = PDTOK_ERR_RANGE;
            break;
        }
        if (skip_special && tok->id_special[id])
            continue;
        int32_t sym = tok->id_sym[id];
        st = tok_pieces_add(&a, tok_sym_text(&tok->syms, sym), tok->syms.len[sym]);
    }
    tok_pieces_t *in = &a, *res = &b;
    for (size_t i = 0; i < tok->ndec && st == PDTOK_OK; i++) {
        st = dec_step(tok, &tok->dec[i], in, res);
        tok_pieces_t *t = in;
        in = res;
        res = t;
    }
    for (size_t i = 0; i < in->n && st == PDTOK_OK; i++) {
        if ((!tok->has_decoder && i > 0 && pdb_buf_append_char(&text, ' ') != PDB_OK) ||
            pdb_buf_append(&text, tok_piece(in, i), in->sp[i].len) != PDB_OK)
            st = PDTOK_ERR_NOMEM;
    }
    if (st == PDTOK_OK && tok->clean_up_spaces)
        st = clean_up(&text);
    if (st == PDTOK_OK && pdb_buf_reserve(&text, 1) != PDB_OK)
        st = PDTOK_ERR_NOMEM;
    tok_pieces_free(&a);
    tok_pieces_free(&b);
    if (st != PDTOK_OK) {
        pdb_buf_free(&text);
        return st;
    }
    if (out_len)
        *out_len = text.len;
    *out_text = pdb_buf_steal(&text, NULL);
    if (!*out_text)
        return PDTOK_ERR_NOMEM;
    return PDTOK_OK;
}
