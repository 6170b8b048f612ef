/*
 * pdgw_fwd_text.c - the forwarder SDK's answers rewritten on their text (forwarder.h
 * rewrite_decode_text, pdgw_fwd_text_* and pdgw_fwd_json_*): an output buffer, and the
 * bounds of the values a rewrite changes, found without building a tree.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_fwd_text.h"
#include "pdgw_json_dump.h"
#include "pdgw_json_text.h"

int pdgw_fwd_text_append(pdgw_fwd_text_t *t, const char *s, size_t n)
{
    return pdgw_buf_append(&t->buf, s, n) == PDGW_OK ? 0 : -1;
}

int pdgw_fwd_text_append_escaped(pdgw_fwd_text_t *t, const char *s, size_t n)
{
    size_t at = t->buf.len;
    if (pdgw_json_dump_string(&t->buf, s, n) != PDGW_OK) {
        t->buf.len = at;
        return -1;
    }
    /* drop the quotes the string was written with */
    memmove(t->buf.data + at, t->buf.data + at + 1, t->buf.len - at - 2);
    t->buf.len -= 2;
    return 0;
}

int pdgw_fwd_text_append_json(pdgw_fwd_text_t *t, const json_t *v)
{
    return v != NULL && pdgw_json_dump(&t->buf, v) == PDGW_OK ? 0 : -1;
}

int pdgw_fwd_json_member(const char *text, size_t len, const char *name, const char **val,
                         size_t *val_len)
{
    if (text == NULL || name == NULL)
        return -1;
    return pdgw_json_member_find(text, len, name, val, val_len);
}

int pdgw_fwd_json_members(const char *text, size_t len, const char *const *names, const char **vals,
                          size_t *val_lens)
{
    if (text == NULL || names == NULL)
        return -1;
    return pdgw_json_members_find(text, len, names, vals, val_lens);
}

int pdgw_fwd_json_first(const char *text, size_t len, const char **val, size_t *val_len)
{
    if (text == NULL)
        return -1;
    return pdgw_json_array_first(text, len, val, val_len);
}

int pdgw_fwd_json_int(const char *text, size_t len, int64_t *v)
{
    char num[24], *end;
    size_t i = 0;
    long long x;
    if (text == NULL || len == 0 || len >= sizeof(num))
        return 0;
    if (text[0] == '-')
        i = 1;
    if (i == len || (text[i] == '0' && len > i + 1))
        return 0; /* no digits, or a leading zero JSON does not allow */
    for (; i < len; i++)
        if (text[i] < '0' || text[i] > '9')
            return 0;
    memcpy(num, text, len);
    num[len] = '\0';
    errno = 0;
    x = strtoll(num, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *v = (int64_t)x;
    return 1;
}
