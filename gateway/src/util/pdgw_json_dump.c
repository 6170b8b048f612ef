/*
 * pdgw_json_dump.c - a jansson tree written as compact JSON text (see the header).
 */
#include "pdgw_json_dump.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_json_text.h"

/* The escape jansson writes for byte <c> of a string, NULL for a byte written as it is:
 * the quote, the backslash and control characters (five by name, the rest as \u00XX in
 * capitals); '/', DEL and well-formed UTF-8 stay as they are. */
static const char *escape_of(unsigned char c, char u[7])
{
    static const char hex[] = "0123456789ABCDEF";
    switch (c) {
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    case '\b':
        return "\\b";
    case '\f':
        return "\\f";
    case '\n':
        return "\\n";
    case '\r':
        return "\\r";
    case '\t':
        return "\\t";
    default:
        if (c >= 0x20)
            return NULL;
        memcpy(u, "\\u00", 4);
        u[4] = hex[c >> 4];
        u[5] = hex[c & 15];
        u[6] = '\0';
        return u;
    }
}

/* A JSON text is written a token at a time: a token that fits in the room already there is
 * copied here, without the buffer's calls. */
static inline pdgw_status_t put(pdgw_buf_t *out, const char *s, size_t n)
{
    if (n < out->cap - out->len && (out->limit == 0 || out->len + n <= out->limit)) {
        if (n > 8)
            memcpy(out->data + out->len, s, n);
        else
            for (size_t i = 0; i < n; i++)
                out->data[out->len + i] = s[i];
        out->len += n;
        out->data[out->len] = '\0';
        return PDGW_OK;
    }
    return pdgw_buf_append(out, s, n);
}

/* Bytes a string's writer must look at: control characters, the quote, the backslash and the
 * start of every multi-byte UTF-8 character; the rest are copied in runs. */
static bool needs_look(unsigned char c)
{
    return c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
}

pdgw_status_t pdgw_json_dump_string(pdgw_buf_t *out, const char *s, size_t len)
{
    size_t run = 0;
    char u[7];

    /* room for the string as it is and its quotes: most need no escapes */
    if (pdgw_buf_reserve(out, len + 2) != PDGW_OK || put(out, "\"", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    for (size_t i = 0; i < len; i++) {
        const char *esc;
        if (!needs_look((unsigned char)s[i]))
            continue;
        if ((unsigned char)s[i] >= 0x80) { /* jansson refuses to write malformed UTF-8 */
            size_t n =
                pdgw_json_utf8_char((const unsigned char *)s + i, (const unsigned char *)s + len);
            if (n == 0)
                return PDGW_ERR_INVALID;
            i += n - 1;
            continue;
        }
        esc = escape_of((unsigned char)s[i], u);
        if (esc == NULL)
            continue;
        if (put(out, s + run, i - run) != PDGW_OK || put(out, esc, strlen(esc)) != PDGW_OK)
            return PDGW_ERR_NOMEM;
        run = i + 1;
    }
    if (put(out, s + run, len - run) != PDGW_OK || put(out, "\"", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    return PDGW_OK;
}

static pdgw_status_t put_real(pdgw_buf_t *out, const json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    pdgw_status_t st = text != NULL ? pdgw_buf_append_str(out, text) : PDGW_ERR_NOMEM;
    free(text); /* jansson's allocator */
    return st;
}

static pdgw_status_t put_value(pdgw_buf_t *out, const json_t *v, int depth)
{
    char num[PDGW_JSON_INT_TEXT_MAX], *d;
    pdgw_status_t st = PDGW_OK;
    const char *key;
    const json_t *x;
    size_t i, key_len;

    if (depth > PDGW_JSON_DUMP_DEPTH_MAX)
        return PDGW_ERR_INVALID;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        st = put(out, "{", 1);
        i = 0;
        json_object_keylen_foreach((json_t *)v, key, key_len, x)
        {
            if (st != PDGW_OK)
                break;
            if (i++ > 0)
                st = put(out, ",", 1);
            if (st == PDGW_OK)
                st = pdgw_json_dump_string(out, key, key_len);
            if (st == PDGW_OK)
                st = put(out, ":", 1);
            if (st == PDGW_OK)
                st = put_value(out, x, depth + 1);
        }
        return st == PDGW_OK ? put(out, "}", 1) : st;
    case JSON_ARRAY:
        st = put(out, "[", 1);
        for (i = 0; i < json_array_size(v) && st == PDGW_OK; i++) {
            if (i > 0)
                st = put(out, ",", 1);
            if (st == PDGW_OK)
                st = put_value(out, json_array_get(v, i), depth + 1);
        }
        return st == PDGW_OK ? put(out, "]", 1) : st;
    case JSON_STRING:
        return pdgw_json_dump_string(out, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        d = pdgw_json_int_text(json_integer_value(v), num + sizeof(num));
        return put(out, d, (size_t)(num + sizeof(num) - d));
    case JSON_REAL:
        return put_real(out, v);
    case JSON_TRUE:
        return put(out, "true", 4);
    case JSON_FALSE:
        return put(out, "false", 5);
    case JSON_NULL:
    default:
        return put(out, "null", 4);
    }
}

pdgw_status_t pdgw_json_dump(pdgw_buf_t *out, const json_t *v)
{
    return v != NULL ? put_value(out, v, 0) : PDGW_ERR_INVALID;
}

char *pdgw_json_dumps(const json_t *v, size_t *len)
{
    pdgw_buf_t b = PDGW_BUF_INIT;
    if (pdgw_json_dump(&b, v) != PDGW_OK || b.data == NULL) {
        pdgw_buf_free(&b);
        return NULL;
    }
    return pdgw_buf_steal(&b, len);
}
