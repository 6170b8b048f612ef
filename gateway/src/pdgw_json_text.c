/*
 * pdgw_json_text.c - walking the top level of a JSON object's text (see the header).
 */
#include "pdgw_json_text.h"

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
                while (p < end && *p != ',' && *p != '}' && !is_ws(*p))
                    p++;
                return p;
            }
            p++;
            break;
        }
    } while (depth > 0);
    return p;
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
