/*
 * pdgw_buf.c - the growable byte buffer (pdgw_buf_t).
 * Declared in pdgw_util.h.
 */
#include "pdgw_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"

/* ---------------------------------------------------------------- buffer */

void pdgw_buf_init(pdgw_buf_t *buf)
{
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
    buf->limit = 0;
}

pdgw_status_t pdgw_buf_reserve(pdgw_buf_t *buf, size_t extra)
{
    if (extra > SIZE_MAX / 2 - buf->len)
        return PDGW_ERR_TOO_LARGE;
    size_t need = buf->len + extra + 1;
    if (buf->limit != 0 && buf->len + extra > buf->limit)
        return PDGW_ERR_TOO_LARGE;
    if (need <= buf->cap)
        return PDGW_OK;
    size_t cap = buf->cap != 0 ? buf->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = pdgw_realloc(buf->data, cap);
    if (p == NULL)
        return PDGW_ERR_NOMEM;
    if (buf->data == NULL)
        p[0] = '\0';
    buf->data = p;
    buf->cap = cap;
    return PDGW_OK;
}

pdgw_status_t pdgw_buf_append(pdgw_buf_t *buf, const void *data, size_t len)
{
    pdgw_status_t st = pdgw_buf_reserve(buf, len);
    if (st != PDGW_OK)
        return st;
    if (len != 0)
        memcpy(buf->data + buf->len, data, len);
    buf->len += len;
    buf->data[buf->len] = '\0';
    return PDGW_OK;
}

pdgw_status_t pdgw_buf_append_str(pdgw_buf_t *buf, const char *s)
{
    return pdgw_buf_append(buf, s, strlen(s));
}

pdgw_status_t pdgw_buf_append_char(pdgw_buf_t *buf, char c)
{
    return pdgw_buf_append(buf, &c, 1);
}

pdgw_status_t pdgw_buf_vappendf(pdgw_buf_t *buf, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return PDGW_ERR_INVALID;
    if ((size_t)n < sizeof(small))
        return pdgw_buf_append(buf, small, (size_t)n);
    pdgw_status_t st = pdgw_buf_reserve(buf, (size_t)n);
    if (st != PDGW_OK)
        return st;
    vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap);
    buf->len += (size_t)n;
    return PDGW_OK;
}

pdgw_status_t pdgw_buf_appendf(pdgw_buf_t *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pdgw_status_t st = pdgw_buf_vappendf(buf, fmt, ap);
    va_end(ap);
    return st;
}

pdgw_status_t pdgw_buf_append_json_escaped(pdgw_buf_t *buf, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t start = 0;
    pdgw_status_t st = PDGW_OK;
    for (size_t i = 0; i < len && st == PDGW_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = NULL;
        char u[7];
        switch (c) {
        case '"':
            rep = "\\\"";
            break;
        case '\\':
            rep = "\\\\";
            break;
        case '\n':
            rep = "\\n";
            break;
        case '\r':
            rep = "\\r";
            break;
        case '\t':
            rep = "\\t";
            break;
        default:
            if (c < 0x20 || c == 0x7f) {
                u[0] = '\\';
                u[1] = 'u';
                u[2] = '0';
                u[3] = '0';
                u[4] = hex[c >> 4];
                u[5] = hex[c & 15];
                u[6] = '\0';
                rep = u;
            }
        }
        if (rep == NULL)
            continue;
        st = pdgw_buf_append(buf, s + start, i - start);
        if (st == PDGW_OK)
            st = pdgw_buf_append_str(buf, rep);
        start = i + 1;
    }
    if (st == PDGW_OK)
        st = pdgw_buf_append(buf, s + start, len - start);
    return st;
}

void pdgw_buf_consume(pdgw_buf_t *buf, size_t n)
{
    if (n >= buf->len) {
        buf->len = 0;
    } else {
        memmove(buf->data, buf->data + n, buf->len - n);
        buf->len -= n;
    }
    if (buf->data != NULL)
        buf->data[buf->len] = '\0';
}

void pdgw_buf_reset(pdgw_buf_t *buf)
{
    buf->len = 0;
    if (buf->data != NULL)
        buf->data[0] = '\0';
}

void pdgw_buf_free(pdgw_buf_t *buf)
{
    pdgw_free(buf->data);
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
}

char *pdgw_buf_steal(pdgw_buf_t *buf, size_t *len_out)
{
    if (buf->data == NULL && pdgw_buf_reserve(buf, 0) != PDGW_OK)
        return NULL;
    char *p = buf->data;
    if (len_out != NULL)
        *len_out = buf->len;
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
    return p;
}
