/*
 * pdb_buf.c - growable byte buffer (see pdb_buf.h).
 */
#include "pdb/pdb_buf.h"

#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"

const char *pdb_strerror(pdb_status_t st)
{
    switch (st) {
    case PDB_OK:
        return "success";
    case PDB_ERR_NOMEM:
        return "out of memory";
    case PDB_ERR_INVALID:
        return "invalid argument";
    case PDB_ERR_EXISTS:
        return "already exists";
    case PDB_ERR_NOT_FOUND:
        return "not found";
    case PDB_ERR_TOO_LARGE:
        return "too large";
    }
    return "unknown status";
}

void pdb_buf_init(pdb_buf_t *buf)
{
    memset(buf, 0, sizeof(*buf));
}

static pdb_status_t grow_to(pdb_buf_t *buf, size_t cap)
{
    char *p = pdb_realloc(buf->data, cap);

    if (p == NULL)
        return PDB_ERR_NOMEM;
    if (buf->data == NULL)
        p[0] = '\0';
    buf->data = p;
    buf->cap = cap;
    return PDB_OK;
}

static pdb_status_t room_check(const pdb_buf_t *buf, size_t extra)
{
    if (extra > SIZE_MAX / 2 - buf->len)
        return PDB_ERR_TOO_LARGE;
    if (buf->limit != 0 && buf->len + extra > buf->limit)
        return PDB_ERR_TOO_LARGE;
    return PDB_OK;
}

pdb_status_t pdb_buf_reserve(pdb_buf_t *buf, size_t extra)
{
    size_t need = buf->len + extra + 1;
    size_t cap;
    pdb_status_t st = room_check(buf, extra);

    if (st != PDB_OK)
        return st;
    if (need <= buf->cap)
        return PDB_OK;
    cap = buf->cap != 0 ? buf->cap : 64;
    while (cap < need)
        cap *= 2;
    return grow_to(buf, cap);
}

pdb_status_t pdb_buf_reserve_exact(pdb_buf_t *buf, size_t extra)
{
    pdb_status_t st = room_check(buf, extra);

    if (st != PDB_OK)
        return st;
    return buf->len + extra + 1 <= buf->cap ? PDB_OK : grow_to(buf, buf->len + extra + 1);
}

pdb_status_t pdb_buf_append(pdb_buf_t *buf, const void *data, size_t len)
{
    pdb_status_t st;

    /* Most appends are a few bytes into room already there (a JSON writer calls this per
     * token): those skip the reserve. */
    if (len < buf->cap - buf->len && (buf->limit == 0 || buf->len + len <= buf->limit)) {
        if (len > 0)
            memcpy(buf->data + buf->len, data, len);
        buf->len += len;
        buf->data[buf->len] = '\0';
        return PDB_OK;
    }
    st = pdb_buf_reserve(buf, len);
    if (st != PDB_OK)
        return st;
    if (len > 0)
        memcpy(buf->data + buf->len, data, len);
    buf->len += len;
    buf->data[buf->len] = '\0';
    return PDB_OK;
}

pdb_status_t pdb_buf_append_str(pdb_buf_t *buf, const char *s)
{
    return pdb_buf_append(buf, s, strlen(s));
}

pdb_status_t pdb_buf_append_char(pdb_buf_t *buf, char c)
{
    return pdb_buf_append(buf, &c, 1);
}

pdb_status_t pdb_buf_vappendf(pdb_buf_t *buf, const char *fmt, va_list ap)
{
    char small[256];
    va_list ap2;
    pdb_status_t st;
    int n;

    va_copy(ap2, ap);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return PDB_ERR_INVALID;
    }
    if ((size_t)n < sizeof(small)) {
        va_end(ap2);
        return pdb_buf_append(buf, small, (size_t)n);
    }
    st = pdb_buf_reserve(buf, (size_t)n);
    if (st == PDB_OK) {
        vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap2);
        buf->len += (size_t)n;
    }
    va_end(ap2);
    return st;
}

pdb_status_t pdb_buf_appendf(pdb_buf_t *buf, const char *fmt, ...)
{
    va_list ap;
    pdb_status_t st;

    va_start(ap, fmt);
    st = pdb_buf_vappendf(buf, fmt, ap);
    va_end(ap);
    return st;
}

void pdb_buf_consume(pdb_buf_t *buf, size_t n)
{
    if (n >= buf->len) {
        pdb_buf_reset(buf);
        return;
    }
    memmove(buf->data, buf->data + n, buf->len - n);
    buf->len -= n;
    buf->data[buf->len] = '\0';
}

void pdb_buf_reset(pdb_buf_t *buf)
{
    buf->len = 0;
    if (buf->data != NULL)
        buf->data[0] = '\0';
}

void pdb_buf_free(pdb_buf_t *buf)
{
    pdb_free(buf->data);
    buf->data = NULL;
    buf->len = buf->cap = 0;
}

char *pdb_buf_steal(pdb_buf_t *buf, size_t *len_out)
{
    char *p;

    if (buf->data == NULL && pdb_buf_reserve(buf, 0) != PDB_OK)
        return NULL;
    p = buf->data;
    if (len_out != NULL)
        *len_out = buf->len;
    buf->data = NULL;
    buf->len = buf->cap = 0;
    return p;
}
