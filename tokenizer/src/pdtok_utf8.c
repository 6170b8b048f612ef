/*
 * pdtok_utf8.c - UTF-8 decoding, WHATWG-style repair of invalid input, and JavaScript's
 * notion of white space (the reference's trim() and \s).
 */
#include <string.h>

#include "pdtok_int.h"

size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

size_t tok_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/*
 * Length of the valid sequence at <u> (1..4), or 0 with *bad set to the length of the
 * maximal invalid subsequence: the lead byte plus the continuation bytes that were still
 * acceptable (WHATWG "UTF-8 decode", one U+FFFD per such subsequence).
 */
static size_t seq_len(const unsigned char *u, size_t n, size_t *bad)
{
    unsigned char c = u[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n || u[i] < lo || u[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

size_t tok_utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = seq_len(u + i, n - i, &bad);
        if (!l)
            return i;
        i += l;
    }
    return n;
}

pdtok_status_t tok_utf8_repair(const char *s, size_t n, pdb_buf_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, bad = 0;
    while (i < n) {
        size_t run = tok_utf8_valid_prefix(s + i, n - i);
        if (run && pdb_buf_append(out, s + i, run) != PDB_OK)
            return PDTOK_ERR_NOMEM;
        i += run;
        if (i >= n)
            break;
        seq_len(u + i, n - i, &bad);
        if (pdb_buf_append(out, "\xEF\xBF\xBD", 3) != PDB_OK)
            return PDTOK_ERR_NOMEM;
        i += bad;
    }
    if (pdb_buf_reserve(out, 1) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    return PDTOK_OK;
}

bool tok_js_space(uint32_t cp)
{
    /* ECMAScript WhiteSpace + LineTerminator: note U+FEFF is in, U+0085 is not. */
    if (cp <= 0x20)
        return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0xA0)
        return false;
    return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

size_t tok_js_trim_start(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        if (!tok_js_space(cp))
            break;
        i += l;
    }
    return i;
}

size_t tok_js_trim_end(const char *s, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
            b--;
        uint32_t cp;
        tok_utf8_next(s + b, end - b, &cp);
        if (!tok_js_space(cp))
            break;
        end = b;
    }
    return n - end;
}
