/*
 * pdgw_json_text.c - walking the top level of a JSON object's text (see the header).
 */
#include "pdgw_json_text.h"

#include <limits.h>
#include <string.h>

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p))
        p++;
    return p;
}

bool pdgw_json_only_ws(const char *p, const char *end)
{
    return skip_ws(p, end) == end;
}

/* The closing quote of the string opening at <p>: the next quote not escaped by an odd run of
 * backslashes (memchr does the scanning). NULL when there is none. */
static const char *string_close(const char *p, const char *end)
{
    const char *q = p + 1;
    while (q < end && (q = memchr(q, '"', (size_t)(end - q))) != NULL) {
        const char *b = q;
        while (b > p + 1 && b[-1] == '\\')
            b--;
        if (((q - b) & 1) == 0)
            return q;
        q++;
    }
    return NULL;
}

/* The bytes that end a run of nothing to track inside a nested value. */
static const bool tracked[256] = {
    ['"'] = true, ['{'] = true, ['['] = true, ['}'] = true, [']'] = true};

/* Past the value starting at <p>; NULL on text that ends early. */
static const char *value_end(const char *p, const char *end)
{
    int depth = 0;
    do {
        const char *q;
        if (p >= end)
            return NULL;
        switch (*p) {
        case '"':
            if ((q = string_close(p, end)) == NULL)
                return NULL;
            p = q + 1;
            break;
        case '{':
        case '[':
            depth++;
            p++;
            break;
        case '}':
        case ']':
            if (--depth < 0)
                return NULL;
            p++;
            break;
        default:
            if (depth == 0) { /* number or literal: up to the next delimiter */
                while (p < end && *p != ',' && *p != '}' && *p != ']' && !is_ws(*p))
                    p++;
                return p;
            }
            p++;
            while (p < end && !tracked[(unsigned char)*p])
                p++;
            break;
        }
    } while (depth > 0);
    return p;
}

/* Walking back from the end. At a quote outside any string, the quote closes a string; the
 * string opens at the nearest quote before it that an even run of backslashes precedes (a
 * quote inside a string is always escaped, the opening one never is). */
static const char *skip_ws_back(const char *start, const char *p)
{
    while (p > start && is_ws(p[-1]))
        p--;
    return p;
}

/* The opening quote of the string whose closing quote is at <q>; NULL when there is none. */
static const char *string_open(const char *start, const char *q)
{
    const char *p = q;
    while (p > start && (p = memrchr(start, '"', (size_t)(p - start))) != NULL) {
        const char *b = p;
        while (b > start && b[-1] == '\\')
            b--;
        if (((p - b) & 1) == 0)
            return p;
    }
    return NULL;
}

/* Where the value that ends just before <e> starts; NULL on text that is not one. */
static const char *value_start(const char *start, const char *e)
{
    const char *p = e;
    int depth = 0;
    do {
        if (p <= start)
            return NULL;
        switch (p[-1]) {
        case '"':
            if ((p = string_open(start, p - 1)) == NULL)
                return NULL;
            break;
        case '}':
        case ']':
            depth++;
            p--;
            break;
        case '{':
        case '[':
            if (--depth < 0)
                return NULL;
            p--;
            break;
        default:
            if (depth == 0) { /* number or literal: back to the colon or whitespace */
                while (p > start && p[-1] != ':' && p[-1] != ',' && !is_ws(p[-1]) &&
                       !tracked[(unsigned char)p[-1]])
                    p--;
                return p < e ? p : NULL;
            }
            p--;
            while (p > start && !tracked[(unsigned char)p[-1]])
                p--;
            break;
        }
    } while (depth > 0);
    return p;
}

bool pdgw_json_last_member(const char *text, size_t len, const char *name, const char **val,
                           size_t *val_len)
{
    const char *start = text, *p = skip_ws_back(start, text + len);
    size_t n = strlen(name);
    if (p == start || p[-1] != '}')
        return false;
    p = skip_ws_back(start, p - 1);
    while (p > start && p[-1] != '{') {
        const char *ve = p, *vs = value_start(start, ve), *key;
        if (vs == NULL)
            return false;
        p = skip_ws_back(start, vs);
        if (p == start || p[-1] != ':')
            return false;
        p = skip_ws_back(start, p - 1);
        if (p == start || p[-1] != '"' || (key = string_open(start, p - 1)) == NULL)
            return false;
        bool named = (size_t)(p - key - 2) == n && memcmp(key + 1, name, n) == 0;
        p = skip_ws_back(start, key);
        if (p == start || (p[-1] != ',' && p[-1] != '{'))
            return false;
        if (named) {
            *val = vs;
            *val_len = (size_t)(ve - vs);
            return true;
        }
        if (p[-1] == ',')
            p = skip_ws_back(start, p - 1);
    }
    return false;
}

bool pdgw_json_members_begin(pdgw_json_members_t *it, const char *text, size_t len)
{
    const char *end = text + len, *p = skip_ws(text, end);
    if (p >= end || *p != '{')
        return false;
    it->p = p + 1;
    it->end = end;
    it->first = true;
    return true;
}

int pdgw_json_members_next(pdgw_json_members_t *it, pdgw_json_member_t *m)
{
    const char *p = skip_ws(it->p, it->end), *end = it->end, *q;
    if (p < end && *p == '}') {
        it->p = p + 1;
        return 1;
    }
    if (!it->first) {
        if (p >= end || *p != ',')
            return -1;
        p = skip_ws(p + 1, end);
    }
    if (p >= end || *p != '"' || (q = string_close(p, end)) == NULL)
        return -1;
    m->key = p + 1;
    m->key_len = (size_t)(q - p - 1);
    m->key_escaped = memchr(m->key, '\\', m->key_len) != NULL;
    p = skip_ws(q + 1, end);
    if (p >= end || *p != ':')
        return -1;
    m->val = skip_ws(p + 1, end);
    if ((q = value_end(m->val, end)) == NULL)
        return -1;
    m->val_len = (size_t)(q - m->val);
    it->p = q;
    it->first = false;
    return 0;
}

/* Walk the id list at <text> (see pdgw_json_id_list), handing each id to <put> (false stops
 * the walk: a failure); true when the whole text is such a list. */
static bool scan_id_list(const char *text, size_t len, bool (*put)(void *arg, json_int_t v),
                         void *arg)
{
    const char *p = text, *end = text + len;

    p = skip_ws(p, end);
    if (p >= end || *p != '[')
        return false;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']')
        return pdgw_json_only_ws(p + 1, end);
    for (;;) {
        json_int_t v = 0;
        const char *digits = p;
        while (p < end && *p >= '0' && *p <= '9') {
            int d = *p - '0';
            if (v > (LLONG_MAX - d) / 10)
                return false; /* beyond int64: the parser's error says so */
            v = v * 10 + d;
            p++;
        }
        if (p == digits || (*digits == '0' && p - digits > 1))
            return false;
        if (!put(arg, v))
            return false;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        return p < end && *p == ']' && pdgw_json_only_ws(p + 1, end);
    }
}

static bool put_json_int(void *arg, json_int_t v)
{
    return json_array_append_new(arg, json_integer(v)) == 0;
}

static bool count_id(void *arg, json_int_t v)
{
    (void)v;
    (*(size_t *)arg)++;
    return true;
}

json_t *pdgw_json_id_list(const char *text, size_t len)
{
    json_t *arr = json_array();
    if (arr != NULL && !scan_id_list(text, len, put_json_int, arr)) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

bool pdgw_json_id_list_count(const char *text, size_t len, size_t *count)
{
    *count = 0;
    return scan_id_list(text, len, count_id, count);
}

bool pdgw_json_member_value(const char *text, size_t len, const char *name, const char **val,
                            size_t *val_len)
{
    pdgw_json_members_t it;
    pdgw_json_member_t m, last = {0};
    size_t n = strlen(name);
    int got;

    if (!pdgw_json_members_begin(&it, text, len))
        return false;
    while ((got = pdgw_json_members_next(&it, &m)) == 0)
        if (!m.key_escaped && m.key_len == n && memcmp(m.key, name, n) == 0)
            last = m;
    if (got != 1 || !pdgw_json_only_ws(it.p, it.end) || last.val == NULL)
        return false;
    *val = last.val;
    *val_len = last.val_len;
    return true;
}

int pdgw_json_members_find(const char *text, size_t len, const char *const *names,
                           const char **vals, size_t *val_lens)
{
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    int got;

    for (size_t i = 0; names[i] != NULL; i++)
        vals[i] = NULL;
    if (!pdgw_json_members_begin(&it, text, len))
        return -1;
    while ((got = pdgw_json_members_next(&it, &m)) == 0) {
        if (m.key_escaped)
            return -1;
        for (size_t i = 0; names[i] != NULL; i++) {
            if (strlen(names[i]) == m.key_len && memcmp(m.key, names[i], m.key_len) == 0) {
                vals[i] = m.val; /* a later one replaces it, as a parser keeps the last */
                val_lens[i] = m.val_len;
            }
        }
    }
    if (got != 1 || !pdgw_json_only_ws(it.p, it.end))
        return -1;
    return 0;
}

int pdgw_json_member_find(const char *text, size_t len, const char *name, const char **val,
                          size_t *val_len)
{
    const char *names[] = {name, NULL};
    if (pdgw_json_members_find(text, len, names, val, val_len) != 0)
        return -1;
    return *val != NULL;
}

int pdgw_json_array_first(const char *text, size_t len, const char **val, size_t *val_len)
{
    const char *end = text + len, *p = skip_ws(text, end), *q;
    if (p >= end || *p != '[')
        return -1;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']')
        return 0;
    if ((q = value_end(p, end)) == NULL || q == p)
        return -1;
    *val = p;
    *val_len = (size_t)(q - p);
    return 1;
}

json_t *pdgw_json_member_id_list(const char *text, size_t len, const char *name)
{
    const char *val;
    size_t val_len;
    return pdgw_json_member_value(text, len, name, &val, &val_len) ? pdgw_json_id_list(val, val_len)
                                                                   : NULL;
}

char *pdgw_json_int_text(json_int_t v, char *end)
{
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--end = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--end = '-';
    return end;
}

size_t pdgw_json_utf8_char(const unsigned char *p, const unsigned char *end)
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
