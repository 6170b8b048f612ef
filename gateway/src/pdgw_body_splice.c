/*
 * pdgw_body_splice.c - a leg body written by splicing the client's own bytes (see the header).
 *
 * The client's text is walked once at its top level (pdgw_json_text.h): each member gives its
 * key and the byte range of its value. The text parsed without error into <client> moments
 * ago, so the walk only has to find boundaries; anything unexpected makes the splice give up.
 */
#include "pdgw_body_splice.h"

#include "pdgw_json_text.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    const char *lkey;
    size_t members = 0;
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
    json_object_foreach((json_t *)leg, lkey, lv)
    {
        size_t n = strlen(lkey);
        if (json_object_getn(client, lkey, n) == NULL &&
            put_dumped(out, &first_out, lkey, n, lv) != PDGW_OK)
            return PDGW_ERR_NOMEM;
    }
    return pdgw_buf_append(out, "}", 1);
}
