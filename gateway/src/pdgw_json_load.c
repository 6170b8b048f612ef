/*
 * pdgw_json_load.c - a JSON body parsed with its long strings decoded here (see the header).
 *
 * 1. One pass over the text finds every string token (a quote not escaped by an odd run of
 *    backslashes ends it, as in jansson's lexer). A value string of PDGW_JSON_LONG_STRING
 *    bytes or more is checked and decoded as jansson would: no raw control character, only
 *    JSON's escapes, surrogates paired, no \u0000, well-formed UTF-8 (no overlong form, no
 *    surrogate, nothing above U+10FFFF). Anything else gives up: jansson then parses the text.
 * 2. jansson parses a copy of the text in which each such string is a placeholder holding a
 *    nonce of this call and the string's index: a client cannot name one by accident.
 * 3. The tree's placeholders become the decoded strings.
 */
#include "pdgw_json_load.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdb/pdb_hex.h"
#include "pdgw_alloc.h"

typedef struct long_str {
    size_t start, end; /* the token in the text, quotes included */
    char *val;         /* decoded; NULL once it went into the tree */
    size_t val_len;
} long_str_t;

typedef struct {
    long_str_t *v;
    size_t n, cap;
    char tag[32]; /* "\x01pdgw" + nonce: the decoded placeholder's prefix */
    size_t tag_len;
} long_strs_t;

static long hex4(const char *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int d = pdb_hex_val(p[i]);
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

static char *put_utf8(char *w, long cp)
{
    if (cp < 0x80) {
        *w++ = (char)cp;
    } else if (cp < 0x800) {
        *w++ = (char)(0xC0 | cp >> 6);
        *w++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *w++ = (char)(0xE0 | cp >> 12);
        *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *w++ = (char)(0xF0 | cp >> 18);
        *w++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    }
    return w;
}

/* Length of the well-formed UTF-8 character at p (p < end, *p >= 0x80), 0 if it is not. */
static size_t utf8_char(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = *p;
    size_t n;
    long v;

    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (n == 3 && v < 0x800) ||
        (n == 4 && v < 0x10000))
        return 0;
    return n;
}

/* Decode the string's content [p, end) into w (room for end - p bytes); the end of what was
 * written, or NULL when jansson would refuse it. */
static char *decode(const char *p, const char *end, char *w)
{
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c >= 0x20 && c < 0x80 && c != '\\') {
            *w++ = (char)c;
            p++;
        } else if (c >= 0x80) {
            size_t n = utf8_char((const unsigned char *)p, (const unsigned char *)end);
            if (n == 0)
                return NULL;
            memcpy(w, p, n);
            w += n;
            p += n;
        } else if (c == '\\' && end - p >= 2) {
            char e = p[1];
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e != 'u') {
                if (simple == NULL || e == '\0')
                    return NULL;
                *w++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
                p += 2;
                continue;
            }
            long cp = end - p >= 6 ? hex4(p + 2) : -1;
            p += 6;
            if (cp <= 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return NULL; /* \u0000, a bad digit, a low surrogate first */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                long lo = end - p >= 6 && p[0] == '\\' && p[1] == 'u' ? hex4(p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return NULL;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            w = put_utf8(w, cp);
        } else {
            return NULL; /* a raw control character, or a backslash at the end */
        }
    }
    return w;
}

/* Just past the string token opening at text[i] (a quote), or 0 if it does not close. */
static size_t string_end(const char *text, size_t len, size_t i)
{
    size_t j = i + 1;
    for (;;) {
        const char *q = memchr(text + j, '"', len - j);
        size_t k, bs = 0;
        if (q == NULL)
            return 0;
        k = (size_t)(q - text);
        while (k - bs > i + 1 && text[k - bs - 1] == '\\')
            bs++;
        if (bs % 2 == 0)
            return k + 1;
        j = k + 1;
    }
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void strs_free(long_strs_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        pdgw_free(s->v[i].val);
    pdgw_free(s->v);
}

/* Every long value string of the text, decoded. -1 when one is not what jansson accepts (or
 * no memory): the caller lets jansson parse the text. */
static int find_long_strings(const char *text, size_t len, long_strs_t *s)
{
    size_t i = 0;
    for (;;) {
        const char *q = memchr(text + i, '"', len - i);
        size_t start, end, k;
        if (q == NULL)
            return 0;
        start = (size_t)(q - text);
        end = string_end(text, len, start);
        if (end == 0)
            return -1;
        i = end;
        if (end - start < PDGW_JSON_LONG_STRING)
            continue;
        for (k = end; k < len && is_ws(text[k]); k++)
            ;
        if (k < len && text[k] == ':')
            continue; /* a member name: names are few and short, jansson reads them */
        if (s->n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 8;
            long_str_t *v = pdgw_realloc(s->v, cap * sizeof(*v));
            if (v == NULL)
                return -1;
            s->v = v;
            s->cap = cap;
        }
        long_str_t *ls = &s->v[s->n];
        char *w;
        ls->start = start;
        ls->end = end;
        ls->val = pdgw_malloc(end - start);
        if (ls->val == NULL)
            return -1;
        s->n++;
        w = decode(text + start + 1, text + end - 1, ls->val);
        if (w == NULL)
            return -1;
        ls->val_len = (size_t)(w - ls->val);
    }
}

/* The text with each long string replaced by "\u0001pdgw<nonce>:<index>". */
static char *with_placeholders(const char *text, size_t len, const long_strs_t *s, size_t *out_len)
{
    char *out = pdgw_malloc(len + 1), *w = out;
    size_t at = 0;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < s->n; i++) {
        memcpy(w, text + at, s->v[i].start - at);
        w += s->v[i].start - at;
        /* the tag's first byte is written as the escape \u0001 */
        w += sprintf(w, "\"\\u0001%s:%zu\"", s->tag + 1, i);
        at = s->v[i].end;
    }
    memcpy(w, text + at, len - at);
    w += len - at;
    *out_len = (size_t)(w - out);
    return out;
}

/* The decoded string a placeholder names, moved into a jansson string; NULL if <v> is not one
 * of this call's placeholders. */
static json_t *take_placeholder(long_strs_t *s, const json_t *v)
{
    const char *t = json_string_value(v);
    size_t n = json_string_length(v), idx = 0, i;
    json_t *str;

    if (t == NULL || n <= s->tag_len + 1 || t[0] != '\x01' || memcmp(t, s->tag, s->tag_len) != 0 ||
        t[s->tag_len] != ':')
        return NULL;
    for (i = s->tag_len + 1; i < n; i++) {
        if (t[i] < '0' || t[i] > '9')
            return NULL;
        idx = idx * 10 + (size_t)(t[i] - '0');
        if (idx >= s->n)
            return NULL;
    }
    if (s->v[idx].val == NULL)
        return NULL;
    str = json_stringn_nocheck(s->v[idx].val, s->v[idx].val_len);
    pdgw_free(s->v[idx].val);
    s->v[idx].val = NULL;
    return str;
}

static int restore(long_strs_t *s, json_t *v, int depth);

/* <x>, a member or an element: *repl the decoded string it stands for (new reference, NULL if
 * it is no placeholder), or its own placeholders put back. -1 on no memory. */
static int restore_child(long_strs_t *s, json_t *x, int depth, json_t **repl)
{
    *repl = json_is_string(x) ? take_placeholder(s, x) : NULL;
    return json_is_string(x) ? 0 : restore(s, x, depth + 1);
}

/* Put the decoded strings back; -1 on no memory. */
static int restore(long_strs_t *s, json_t *v, int depth)
{
    size_t i;
    const char *key;
    json_t *x, *str;

    if (depth > 4096)
        return -1;
    if (json_is_object(v)) {
        json_object_foreach(v, key, x)
        {
            if (restore_child(s, x, depth, &str) != 0 ||
                (str != NULL && json_object_set_new(v, key, str) != 0))
                return -1;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            if (restore_child(s, x, depth, &str) != 0 ||
                (str != NULL && json_array_set_new(v, i, str) != 0))
                return -1;
        }
    }
    return 0;
}

static uint64_t nonce(void)
{
    static _Thread_local uint64_t x;
    if (x == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&x;
        x |= 1;
    }
    x ^= x << 13; /* xorshift64: placeholders only need to differ from what clients write */
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

json_t *pdgw_json_loadb(const char *text, size_t len, json_error_t *err)
{
    long_strs_t s = {0};
    json_t *j = NULL;
    char *alt;
    size_t alt_len;

    if (text == NULL || len < PDGW_JSON_LONG_STRING || find_long_strings(text, len, &s) != 0 ||
        s.n == 0) {
        strs_free(&s);
        return json_loadb(text ? text : "", len, 0, err);
    }
    s.tag_len =
        (size_t)snprintf(s.tag, sizeof(s.tag), "\x01pdgw%016llx", (unsigned long long)nonce());
    alt = with_placeholders(text, len, &s, &alt_len);
    if (alt != NULL)
        j = json_loadb(alt, alt_len, 0, NULL);
    pdgw_free(alt);
    if (j != NULL && restore(&s, j, 0) != 0) {
        json_decref(j);
        j = NULL;
    }
    strs_free(&s);
    /* anything unexpected: jansson on the client's own text, for its result and its error */
    return j != NULL ? j : json_loadb(text, len, 0, err);
}

size_t pdgw_json_long_strings(const char *text, size_t len)
{
    long_strs_t s = {0};
    size_t n = text != NULL && find_long_strings(text, len, &s) == 0 ? s.n : 0;
    strs_free(&s);
    return n;
}
