/*
 * pdtok_normalize.c - the normalizers a section of text goes through before it is split:
 * Unicode forms (utf8proc), Replace, Prepend, Lowercase, Strip. Each reads <s> and writes a
 * new string into <out> (reset first).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "pdtok_int.h"

static pdtok_status_t unicode_form(const char *s, size_t len, utf8proc_option_t opts,
                                   pdb_buf_t *out)
{
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0x80)
        i++;
    if (i == len) /* ASCII is the same in every normalization form */
        return pdb_buf_append(out, s, len) == PDB_OK ? PDTOK_OK : PDTOK_ERR_NOMEM;
    utf8proc_uint8_t *res = NULL;
    /* Input was repaired to valid UTF-8, so utf8proc only fails when out of memory. */
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &res,
                                      opts | UTF8PROC_STABLE);
    if (n < 0)
        return n == UTF8PROC_ERROR_NOMEM ? PDTOK_ERR_NOMEM : PDTOK_ERR_INVALID;
    pdb_status_t st = pdb_buf_append(out, res, (size_t)n);
    free(res);
    return st == PDB_OK ? PDTOK_OK : PDTOK_ERR_NOMEM;
}

static pdtok_status_t replace_str(const tok_norm_t *nm, const char *s, size_t len, pdb_buf_t *out)
{
    size_t i = 0;
    if (nm->alen == 0)
        return pdb_buf_append(out, s, len) == PDB_OK ? PDTOK_OK : PDTOK_ERR_NOMEM;
    while (i < len) {
        const char *hit = memmem(s + i, len - i, nm->a, nm->alen);
        size_t upto = hit ? (size_t)(hit - s) : len;
        if (pdb_buf_append(out, s + i, upto - i) != PDB_OK)
            return PDTOK_ERR_NOMEM;
        if (!hit)
            break;
        if (pdb_buf_append(out, nm->b, nm->blen) != PDB_OK)
            return PDTOK_ERR_NOMEM;
        i = upto + nm->alen;
    }
    return PDTOK_OK;
}

static pdtok_status_t replace_re(const tok_norm_t *nm, const char *s, size_t len, pdb_buf_t *out)
{
    size_t pos = 0, copied = 0;
    while (pos <= len) {
        size_t ms, me;
        int rc = tok_regex_find(&nm->re, s, len, pos, &ms, &me);
        if (rc < 0)
            return (pdtok_status_t)rc;
        if (rc == 0)
            break;
        if (pdb_buf_append(out, s + copied, ms - copied) != PDB_OK ||
            pdb_buf_append(out, nm->b, nm->blen) != PDB_OK)
            return PDTOK_ERR_NOMEM;
        copied = me;
        if (me == ms) { /* an empty match: step one code point, as the reference does */
            if (ms >= len)
                break;
            uint32_t cp;
            size_t l = tok_utf8_next(s + ms, len - ms, &cp);
            if (pdb_buf_append(out, s + ms, l) != PDB_OK)
                return PDTOK_ERR_NOMEM;
            copied = ms + l;
            pos = ms + l;
        } else {
            pos = me;
        }
    }
    return pdb_buf_append(out, s + copied, len - copied) == PDB_OK ? PDTOK_OK : PDTOK_ERR_NOMEM;
}

static pdtok_status_t lowercase(const char *s, size_t len, pdb_buf_t *out)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += tok_utf8_next(s + i, len - i, &cp);
        char enc[8];
        size_t l;
        if (cp == 0x130) { /* İ lowercases to i + combining dot (full case mapping) */
            l = tok_utf8_put('i', enc);
            l += tok_utf8_put(0x307, enc + l);
        } else {
            l = tok_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        if (pdb_buf_append(out, enc, l) != PDB_OK)
            return PDTOK_ERR_NOMEM;
    }
    return PDTOK_OK;
}

pdtok_status_t tok_norm_apply(const tok_norm_t *nm, const char *s, size_t len, pdb_buf_t *out)
{
    pdb_buf_reset(out);
    pdtok_status_t st = PDTOK_OK;
    switch (nm->kind) {
    case TOK_NORM_NFC:
        st = unicode_form(s, len, UTF8PROC_COMPOSE, out);
        break;
    case TOK_NORM_NFD:
        st = unicode_form(s, len, UTF8PROC_DECOMPOSE, out);
        break;
    case TOK_NORM_NFKC:
        st = unicode_form(s, len, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
        break;
    case TOK_NORM_NFKD:
        st = unicode_form(s, len, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
        break;
    case TOK_NORM_REPLACE_STR:
        st = replace_str(nm, s, len, out);
        break;
    case TOK_NORM_REPLACE_RE:
        st = replace_re(nm, s, len, out);
        break;
    case TOK_NORM_PREPEND:
        if (pdb_buf_append(out, nm->a, nm->alen) != PDB_OK || pdb_buf_append(out, s, len) != PDB_OK)
            st = PDTOK_ERR_NOMEM;
        break;
    case TOK_NORM_LOWERCASE:
        st = lowercase(s, len, out);
        break;
    case TOK_NORM_STRIP: {
        size_t a = nm->left ? tok_js_trim_start(s, len) : 0;
        size_t b = nm->right && a < len ? tok_js_trim_end(s + a, len - a) : 0;
        if (pdb_buf_append(out, s + a, len - a - b) != PDB_OK)
            st = PDTOK_ERR_NOMEM;
        break;
    }
    }
    if (st == PDTOK_OK && pdb_buf_reserve(out, 1) != PDB_OK)
        st = PDTOK_ERR_NOMEM;
    return st;
}
