/*
 * pdgw_body_splice.c - a leg body written by splicing the client's own bytes (see the header).
 *
 * The client's text is walked once at its top level: each member gives its key and the byte
 * range of its value. The text parsed without error into <client> moments ago, so the walk
 * only has to find boundaries (strings with their escapes, nesting), not validate; it still
 * checks every bound and gives up on anything unexpected.
 */
#include "pdgw_body_splice.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p, *end;
} cursor_t;

static void skip_ws(cursor_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* The closing quote of the string opening at <p>: the next quote not escaped by an odd run
 * of backslashes. NULL when there is none. */
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

/* Past the value that starts at c->p; false on text that ends early. */
static bool skip_value(cursor_t *c)
{
    int depth = 0;
    do {
        const char *q;
        if (c->p >= c->end)
            return false;
        switch (*c->p) {
        case '"':
            if ((q = string_close(c->p, c->end)) == NULL)
                return false;
            c->p = q + 1;
            break;
        case '{':
        case '[':
            depth++;
            c->p++;
            break;
        case '}':
        case ']':
            if (--depth < 0)
                return false;
            c->p++;
            break;
        default:
            if (depth == 0) { /* number or literal: up to the next delimiter */
                while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ' ' &&
                       *c->p != '\t' && *c->p != '\n' && *c->p != '\r')
                    c->p++;
                return true;
            }
            c->p++;
            break;
        }
    } while (depth > 0);
    return true;
}

/* One member: key and value ranges. 0 = got one, 1 = end of the object, -1 = cannot splice. */
static int next_member(cursor_t *c, bool first, const char **key, size_t *key_len, const char **val,
                       size_t *val_len)
{
    const char *q;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}')
        return 1;
    if (!first) {
        if (c->p >= c->end || *c->p != ',')
            return -1;
        c->p++;
        skip_ws(c);
    }
    if (c->p >= c->end || *c->p != '"' || (q = string_close(c->p, c->end)) == NULL)
        return -1;
    *key = c->p + 1;
    *key_len = (size_t)(q - c->p - 1);
    if (memchr(*key, '\\', *key_len) != NULL)
        return -1; /* the name as written is not the name as parsed */
    c->p = q + 1;
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':')
        return -1;
    c->p++;
    skip_ws(c);
    *val = c->p;
    if (!skip_value(c))
        return -1;
    *val_len = (size_t)(c->p - *val);
    return 0;
}

static int append_cb(const char *chunk, size_t n, void *arg)
{
    return pdgw_buf_append(arg, chunk, n) == PDGW_OK ? 0 : -1;
}

/* ,"key": then <v> serialised. */
static pdgw_status_t put_dumped(pdgw_buf_t *out, bool *first, const char *key, size_t key_len,
                                const json_t *v)
{
    if ((!*first && pdgw_buf_append(out, ",", 1) != PDGW_OK) ||
        pdgw_buf_append(out, "\"", 1) != PDGW_OK ||
        pdgw_buf_append_json_escaped(out, key, key_len) != PDGW_OK ||
        pdgw_buf_append(out, "\":", 2) != PDGW_OK ||
        json_dump_callback(v, append_cb, out, JSON_COMPACT | JSON_ENCODE_ANY) != 0)
        return PDGW_ERR_NOMEM;
    *first = false;
    return PDGW_OK;
}

/* ,"key": then the client's own bytes of the value. */
static pdgw_status_t put_raw(pdgw_buf_t *out, bool *first, const char *key, size_t key_len,
                             const char *val, size_t val_len)
{
    if ((!*first && pdgw_buf_append(out, ",", 1) != PDGW_OK) ||
        pdgw_buf_append(out, "\"", 1) != PDGW_OK || pdgw_buf_append(out, key, key_len) != PDGW_OK ||
        pdgw_buf_append(out, "\":", 2) != PDGW_OK || pdgw_buf_append(out, val, val_len) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    *first = false;
    return PDGW_OK;
}

pdgw_status_t pdgw_body_splice(const char *raw, size_t raw_len, const json_t *client,
                               const json_t *leg, pdgw_buf_t *out)
{
    cursor_t c = {raw, raw + raw_len};
    const char *key, *val, *lkey;
    size_t key_len, val_len, members = 0;
    bool first_raw = true, first_out = true;
    json_t *lv;
    int got;

    if (raw == NULL || !json_is_object(client) || !json_is_object(leg))
        return PDGW_ERR_INVALID;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{')
        return PDGW_ERR_INVALID;
    c.p++;
    if (pdgw_buf_append(out, "{", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    while ((got = next_member(&c, first_raw, &key, &key_len, &val, &val_len)) == 0) {
        json_t *cv = json_object_getn(client, key, key_len);
        pdgw_status_t st = PDGW_OK;
        first_raw = false;
        members++;
        if (cv == NULL)
            return PDGW_ERR_INVALID; /* the text and its parse disagree */
        lv = json_object_getn(leg, key, key_len);
        if (lv == cv)
            st = put_raw(out, &first_out, key, key_len, val, val_len);
        else if (lv != NULL)
            st = put_dumped(out, &first_out, key, key_len, lv);
        if (st != PDGW_OK)
            return st;
    }
    /* A name given twice parses to one member: the bytes would then say more than the parse. */
    if (got < 0 || members != json_object_size(client))
        return PDGW_ERR_INVALID;
    json_object_foreach((json_t *)leg, lkey, lv)
    {
        size_t n = strlen(lkey);
        if (json_object_getn(client, lkey, n) == NULL &&
            put_dumped(out, &first_out, lkey, n, lv) != PDGW_OK)
            return PDGW_ERR_NOMEM;
    }
    return pdgw_buf_append(out, "}", 1);
}
