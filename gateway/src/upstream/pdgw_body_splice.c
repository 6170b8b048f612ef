/*
 * pdgw_body_splice.c - a leg body written by splicing the client's own bytes (see the header).
 *
 * The client's text is walked once at its top level (pdgw_json_text.h): each member gives its
 * key and the byte range of its value. The text parsed without error into <client> moments
 * ago, so the walk only has to find boundaries; anything unexpected makes the splice give up.
 */
#include "pdgw_body_splice.h"

#include "pdgw_json_dump.h"
#include "pdgw_json_raw.h"
#include "pdgw_json_text.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int append_cb(const char *chunk, size_t n, void *arg)
{
    return pdgw_buf_append(arg, chunk, n) == PDGW_OK ? 0 : -1;
}

/* An array of integers (a prompt of token ids, rebuilt for every leg of some protocols)
 * written here: jansson formats each integer through snprintf, which costs more than the
 * rest of the body. 0 = written, 1 = not such an array, -1 = no memory. */
static int put_int_array(pdgw_buf_t *out, const json_t *v)
{
    char num[24];
    size_t n = json_array_size(v), i;
    char *w;

    if (!json_is_array(v) || n == 0)
        return 1;
    for (i = 0; i < n; i++)
        if (!json_is_integer(json_array_get(v, i)))
            return 1;
    /* room for the longest text: 20 characters and a comma per integer, the brackets */
    if (n > (SIZE_MAX - 2) / 21 || pdgw_buf_reserve(out, n * 21 + 2) != PDGW_OK)
        return -1;
    w = out->data + out->len;
    *w++ = '[';
    for (i = 0; i < n; i++) {
        char *d = pdgw_json_int_text(json_integer_value(json_array_get(v, i)), num + sizeof(num));
        size_t k = (size_t)(num + sizeof(num) - d);
        if (i > 0)
            *w++ = ',';
        memcpy(w, d, k);
        w += k;
    }
    *w++ = ']';
    out->len = (size_t)(w - out->data);
    return 0;
}

/* ,"key": then <v> serialised (a raw value: its text). */
static pdgw_status_t put_dumped(pdgw_buf_t *out, bool *first, const char *key, size_t key_len,
                                const json_t *v)
{
    const char *text;
    size_t text_len;
    int ints;
    if ((!*first && pdgw_buf_append(out, ",", 1) != PDGW_OK) ||
        pdgw_json_dump_string(out, key, key_len) != PDGW_OK ||
        pdgw_buf_append(out, ":", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    if (pdgw_json_raw_text(v, &text, &text_len)) {
        if (pdgw_buf_append(out, text, text_len) != PDGW_OK)
            return PDGW_ERR_NOMEM;
        *first = false;
        return PDGW_OK;
    }
    ints = put_int_array(out, v);
    if (ints < 0 || (ints > 0 && pdgw_json_dump(out, v) != PDGW_OK))
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
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    const char *lkey;
    size_t members = 0, n;
    bool first_out = true;
    json_t *lv;
    int got;

    if (raw == NULL || !json_is_object(client) || !json_is_object(leg) ||
        !pdgw_json_members_begin(&it, raw, raw_len))
        return PDGW_ERR_INVALID;
    if (pdgw_buf_append(out, "{", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    while ((got = pdgw_json_members_next(&it, &m)) == 0) {
        json_t *cv;
        pdgw_status_t st = PDGW_OK;
        if (m.key_escaped)
            return PDGW_ERR_INVALID; /* the name as written is not the name as parsed */
        cv = json_object_getn(client, m.key, m.key_len);
        members++;
        if (cv == NULL)
            return PDGW_ERR_INVALID; /* the text and its parse disagree */
        lv = json_object_getn(leg, m.key, m.key_len);
        if (lv == cv)
            st = put_raw(out, &first_out, m.key, m.key_len, m.val, m.val_len);
        else if (lv != NULL)
            st = put_dumped(out, &first_out, m.key, m.key_len, lv);
        if (st != PDGW_OK)
            return st;
    }
    /* A name given twice parses to one member: the bytes would then say more than the parse. */
    if (got < 0 || members != json_object_size(client))
        return PDGW_ERR_INVALID;
    json_object_keylen_foreach((json_t *)leg, lkey, n, lv)
    {
        if (json_object_getn(client, lkey, n) == NULL &&
            put_dumped(out, &first_out, lkey, n, lv) != PDGW_OK)
            return PDGW_ERR_NOMEM;
    }
    return pdgw_buf_append(out, "}", 1);
}

/* <body> serialised whole: an object member by member, so that raw values are written as
 * their text here too. */
static pdgw_status_t put_members(pdgw_buf_t *out, const json_t *body)
{
    const char *key;
    size_t key_len;
    json_t *v;
    bool first = true;

    if (!json_is_object(body))
        return json_dump_callback(body, append_cb, out, JSON_COMPACT) == 0 ? PDGW_OK
                                                                           : PDGW_ERR_NOMEM;
    if (pdgw_buf_append(out, "{", 1) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    json_object_keylen_foreach((json_t *)body, key, key_len, v)
    {
        if (put_dumped(out, &first, key, key_len, v) != PDGW_OK)
            return PDGW_ERR_NOMEM;
    }
    return pdgw_buf_append(out, "}", 1);
}

char *pdgw_body_text(const char *raw, size_t raw_len, const json_t *client, const json_t *body,
                     size_t *len)
{
    pdgw_buf_t b;
    pdgw_status_t st;

    pdgw_buf_init(&b);
    if (pdgw_buf_reserve_exact(&b, raw_len + 256) != PDGW_OK)
        return NULL;
    st = pdgw_body_splice(raw, raw_len, client, body, &b);
    if (st == PDGW_ERR_INVALID) {
        b.len = 0;
        st = put_members(&b, body);
    }
    if (st != PDGW_OK) {
        pdgw_buf_free(&b);
        return NULL;
    }
    return pdgw_buf_steal(&b, len);
}
