/*
 * pdgw_json_load.c - a JSON body parsed in one pass into jansson's tree (see the header).
 *
 * A recursive descent over the text as RFC 8259 writes it, with jansson's choices where the
 * RFC leaves one: the root is an object or an array, a later duplicate member replaces an
 * earlier one in its place, integers are json_int_t (strtoll) and other numbers doubles
 * (strtod), \u0000 and lone surrogates are refused. Whatever this parser is not sure of it
 * declines (NULL): a syntax error, a number out of range (jansson refuses overflow but keeps
 * underflow: both are declined), nesting deeper than FAST_DEPTH_MAX, no memory. jansson then
 * parses the text alone, so every refusal and its message are jansson's own.
 */
#include "pdgw_json_load.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdb/pdb_hex.h"
#include "pdb/pdb_swar.h"
#include "pdgw_alloc.h"

/* jansson itself allows 2,048 levels; deeper bodies are left to it */
#define FAST_DEPTH_MAX 256
/* longer number tokens are left to jansson (they are out of range or absurd) */
#define NUMBER_TOKEN_MAX 64

typedef struct {
    const char *p, *end;
    int depth;
    /* Only check: no value is made; every value that would have been reads as json_null()
     * (jansson's static null, never freed). */
    bool check_only;
    /* check_only: each member of the root object, once its value was checked */
    pdgw_json_member_fn on_member;
    void *member_arg;
    bool string_escaped; /* the last string token had escapes */
    char *scratch;       /* decoded strings that had escapes */
    size_t scratch_cap;
} parser_t;

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

/* Decode the string's content [p, end) into w (room for end - p bytes): the end of what was
 * written, or NULL at an escape jansson would refuse. Its other bytes were checked by the
 * caller (no raw control character, well-formed UTF-8), so the runs between escapes are
 * copied whole. */
static char *decode_escapes(const char *p, const char *end, char *w)
{
    while (p < end) {
        const char *bs = memchr(p, '\\', (size_t)(end - p));
        size_t run = (size_t)((bs != NULL ? bs : end) - p);
        memcpy(w, p, run);
        w += run;
        p += run;
        if (bs == NULL)
            break;
        if (end - p < 2)
            return NULL;
        char e = p[1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e != 'u') {
            if (simple == NULL || e == '\0')
                return NULL;
            *w++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            p += 2;
            continue;
        }
        if (end - p < 6)
            return NULL;
        long cp = hex4(p + 2);
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
    }
    return w;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end && is_ws(*ps->p))
        ps->p++;
}

static bool scratch_room(parser_t *ps, size_t n)
{
    char *b;
    if (n <= ps->scratch_cap)
        return true;
    b = pdgw_realloc(ps->scratch, n);
    if (b == NULL)
        return false;
    ps->scratch = b;
    ps->scratch_cap = n;
    return true;
}

/* Past the bytes from <p> that need no look: none is a quote, a backslash, below 0x20 or from
 * 0x80. Eight at a time (pdb_swar.h): prompts are mostly such bytes. */
static const unsigned char *plain_run(const unsigned char *p, const unsigned char *end)
{
    while (end - p >= 8) {
        uint64_t x = pdb_swar_load(p);
        uint64_t hits =
            pdb_swar_eq(x, '"') | pdb_swar_eq(x, '\\') | pdb_swar_below(x, 0x20) | pdb_swar_high(x);
        if (hits != 0)
            return p + pdb_swar_first(hits);
        p += 8;
    }
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
        p++;
    return p;
}

/* The string token at ps->p (a quote): its content, decoded, in *s / *n. A string without
 * escapes is the text itself; one with escapes is decoded into the scratch buffer, valid until
 * the next string. */
static bool string_token(parser_t *ps, const char **s, size_t *n)
{
    const unsigned char *start = (const unsigned char *)ps->p + 1, *p = start;
    const unsigned char *end = (const unsigned char *)ps->end;
    bool escaped = false;
    char *w;

    while ((p = plain_run(p, end)) < end && *p != '"') {
        if (*p == '\\') {
            if (end - p < 2)
                return false;
            escaped = true;
            p += 2; /* the escaped byte cannot close the string; decode_escapes() reads it */
        } else if (*p >= 0x80) {
            size_t k = pdgw_json_utf8_char(p, end);
            if (k == 0)
                return false;
            p += k;
        } else {
            return false; /* a raw control character */
        }
    }
    if (p >= end)
        return false;
    ps->p = (const char *)p + 1;
    ps->string_escaped = escaped;
    if (!escaped) {
        *s = (const char *)start;
        *n = (size_t)(p - start);
        return true;
    }
    if (!scratch_room(ps, (size_t)(p - start)))
        return false;
    w = decode_escapes((const char *)start, (const char *)p, ps->scratch);
    if (w == NULL)
        return false;
    *s = ps->scratch;
    *n = (size_t)(w - ps->scratch);
    return true;
}

static bool is_digit(const char *p, const char *end)
{
    return p < end && *p >= '0' && *p <= '9';
}

static const char *digits(const char *p, const char *end)
{
    while (is_digit(p, end))
        p++;
    return p;
}

static json_t *number_token(parser_t *ps)
{
    const char *p = ps->p, *end = ps->end;
    char tok[NUMBER_TOKEN_MAX];
    bool real = false;
    size_t len;
    json_t *v;

    if (*p == '-')
        p++;
    if (p < end && *p == '0')
        p++;
    else if (is_digit(p, end))
        p = digits(p, end);
    else
        return NULL;
    if (p < end && *p == '.') {
        if (!is_digit(++p, end))
            return NULL;
        p = digits(p, end);
        real = true;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (++p < end && (*p == '+' || *p == '-'))
            p++;
        if (!is_digit(p, end))
            return NULL;
        p = digits(p, end);
        real = true;
    }
    len = (size_t)(p - ps->p);
    if (ps->check_only && !real && len <= 18) { /* 18 characters cannot leave the range */
        ps->p = p;
        return json_null();
    }
    if (len >= sizeof(tok))
        return NULL;
    memcpy(tok, ps->p, len);
    tok[len] = '\0';
    errno = 0;
    if (ps->check_only) {
        if (real)
            (void)strtod(tok, NULL);
        else
            (void)strtoll(tok, NULL, 10);
        ps->p = p;
        return errno == ERANGE ? NULL : json_null();
    }
    if (real) {
        double d = strtod(tok, NULL);
        v = errno == ERANGE ? NULL : json_real(d);
    } else {
        long long i = strtoll(tok, NULL, 10);
        v = errno == ERANGE ? NULL : json_integer((json_int_t)i);
    }
    ps->p = p;
    return v;
}

static json_t *value(parser_t *ps);

static json_t *literal(parser_t *ps, const char *word, json_t *v)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return NULL;
    ps->p += n;
    return v;
}

/* After a member or an element: true at its container's close (consumed), false after a
 * comma (consumed) or at anything else (*bad set). */
static bool container_ends(parser_t *ps, char close, bool *bad)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        skip_ws(ps);
        return false;
    }
    *bad = true;
    return true;
}

/* The root object's member just checked (name from <key_at>, value from <val_at>) to the
 * walk's callback. */
static bool member_checked(parser_t *ps, const char *key_at, bool key_escaped, const char *key_end,
                           const char *val_at)
{
    pdgw_json_member_t m = {.key = key_at,
                            .key_len = (size_t)(key_end - key_at),
                            .key_escaped = key_escaped,
                            .val = val_at,
                            .val_len = (size_t)(ps->p - val_at)};
    return ps->on_member(ps->member_arg, &m, ps->string_escaped);
}

static bool member(parser_t *ps, json_t *obj)
{
    const char *key, *key_at, *key_end, *val_at;
    char *key_copy = NULL;
    size_t key_len;
    bool key_escaped;
    json_t *v;
    bool ok;

    if (ps->p >= ps->end || *ps->p != '"')
        return false;
    key_at = ps->p + 1;
    if (!string_token(ps, &key, &key_len))
        return false;
    key_end = ps->p - 1; /* its closing quote */
    key_escaped = ps->string_escaped;
    if (key == ps->scratch && !ps->check_only) { /* the value's strings reuse the scratch */
        if ((key_copy = pdgw_malloc(key_len ? key_len : 1)) == NULL)
            return false;
        key = memcpy(key_copy, key, key_len);
    }
    skip_ws(ps);
    ok = ps->p < ps->end && *ps->p++ == ':';
    if (ok) {
        skip_ws(ps);
        val_at = ps->p;
        v = value(ps);
        ok = v != NULL &&
             (ps->check_only || json_object_setn_new_nocheck(obj, key, key_len, v) == 0);
        if (ok && ps->on_member != NULL && ps->depth == 1)
            ok = member_checked(ps, key_at, key_escaped, key_end, val_at);
    }
    pdgw_free(key_copy);
    return ok;
}

static bool element(parser_t *ps, json_t *arr)
{
    json_t *v = value(ps);
    return v != NULL && (ps->check_only || json_array_append_new(arr, v) == 0);
}

/* The object or array opening at ps->p. */
static json_t *container(parser_t *ps)
{
    bool is_object = *ps->p == '{', bad = false;
    char close = is_object ? '}' : ']';
    json_t *c = ps->check_only ? json_null() : is_object ? json_object() : json_array();

    ps->p++;
    skip_ws(ps);
    if (c == NULL)
        return NULL;
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return c;
    }
    do {
        if (!(is_object ? member(ps, c) : element(ps, c)))
            bad = true;
    } while (!bad && !container_ends(ps, close, &bad));
    if (bad) {
        if (!ps->check_only)
            json_decref(c);
        return NULL;
    }
    return c;
}

static json_t *value(parser_t *ps)
{
    const char *s;
    size_t n;
    json_t *v = NULL;

    if (ps->p >= ps->end)
        return NULL;
    if ((*ps->p == '{' || *ps->p == '[') && ps->depth >= FAST_DEPTH_MAX)
        return NULL;
    switch (*ps->p) {
    case '{':
    case '[':
        ps->depth++;
        v = container(ps);
        ps->depth--;
        return v;
    case '"':
        if (!string_token(ps, &s, &n))
            return NULL;
        return ps->check_only ? json_null() : json_stringn_nocheck(s, n);
    case 't':
        return literal(ps, "true", json_true());
    case 'f':
        return literal(ps, "false", json_false());
    case 'n':
        return literal(ps, "null", json_null());
    default:
        return *ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9') ? number_token(ps) : NULL;
    }
}

/* The one value of <text>; only an object or an array unless <any> (JSON_DECODE_ANY). With
 * <check_only>, json_null() for a text it would load, nothing made. */
static json_t *parse_root(const char *text, size_t len, bool any, bool check_only,
                          pdgw_json_member_fn on_member, void *member_arg)
{
    parser_t ps = {.p = text,
                   .end = text + len,
                   .check_only = check_only,
                   .on_member = on_member,
                   .member_arg = member_arg};
    json_t *root = NULL;

    if (text == NULL)
        return NULL;
    skip_ws(&ps);
    if (ps.p < ps.end && (any || *ps.p == '{' || *ps.p == '['))
        root = value(&ps);
    skip_ws(&ps);
    if (root != NULL && ps.p != ps.end) { /* something after the root */
        if (!check_only)
            json_decref(root);
        root = NULL;
    }
    pdgw_free(ps.scratch);
    return root;
}

static json_t *load_fast(const char *text, size_t len, bool any)
{
    return parse_root(text, len, any, false, NULL, NULL);
}

bool pdgw_json_check_members(const char *text, size_t len, pdgw_json_member_fn fn, void *arg)
{
    const char *p = text, *end = text + len;
    while (p < end && is_ws(*p))
        p++;
    return p < end && *p == '{' && parse_root(text, len, false, true, fn, arg) != NULL;
}

json_t *pdgw_json_load_fast(const char *text, size_t len)
{
    return load_fast(text, len, false);
}

json_t *pdgw_json_loadb(const char *text, size_t len, json_error_t *err)
{
    json_t *j = pdgw_json_load_fast(text, len);
    /* declined: jansson on the same text, for its result and its error */
    return j != NULL ? j : json_loadb(text ? text : "", len, 0, err);
}

/* Is the member name <key> (as written, no escapes) one of <names>? */
static bool name_listed(const char *key, size_t len, const char *const *names)
{
    for (size_t i = 0; names[i] != NULL; i++)
        if (strlen(names[i]) == len && memcmp(names[i], key, len) == 0)
            return true;
    return false;
}

json_t *pdgw_json_load_members(const char *text, size_t len, const char *const *names)
{
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    json_t *obj, *v;
    int got;

    if (text == NULL || !pdgw_json_members_begin(&it, text, len))
        return NULL;
    obj = json_object();
    if (obj == NULL)
        return NULL;
    while ((got = pdgw_json_members_next(&it, &m)) == 0) {
        if (m.key_escaped) { /* the name as written is not the name: read it all */
            json_decref(obj);
            return pdgw_json_loadb(text, len, NULL);
        }
        if (!name_listed(m.key, m.key_len, names))
            continue;
        /* a name given twice: the last value counts, as in jansson's tree */
        v = load_fast(m.val, m.val_len, true);
        if (v == NULL) /* declined: jansson decides */
            v = json_loadb(m.val, m.val_len, JSON_DECODE_ANY, NULL);
        if (v == NULL || json_object_setn_new(obj, m.key, m.key_len, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    if (got != 1 || !pdgw_json_only_ws(it.p, it.end)) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}
