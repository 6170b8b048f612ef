/*
 * pdgw_buf.c - the growable byte buffer (pdgw_buf_t).
 * Declared in pdgw_util.h.
 */
#include "pdgw_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- buffer */

/* The buffer is the base layer's (pdb_buf.h); these give its failures the gateway's codes. */
static pdgw_status_t buf_status(pdb_status_t st)
{
    switch (st) {
    case PDB_OK:
        return PDGW_OK;
    case PDB_ERR_NOMEM:
        return PDGW_ERR_NOMEM;
    case PDB_ERR_TOO_LARGE:
        return PDGW_ERR_TOO_LARGE;
    default:
        return PDGW_ERR_INVALID;
    }
}

void pdgw_buf_init(pdgw_buf_t *buf)
{
    pdb_buf_init(buf);
}

pdgw_status_t pdgw_buf_reserve(pdgw_buf_t *buf, size_t extra)
{
    return buf_status(pdb_buf_reserve(buf, extra));
}

pdgw_status_t pdgw_buf_reserve_exact(pdgw_buf_t *buf, size_t extra)
{
    return buf_status(pdb_buf_reserve_exact(buf, extra));
}

pdgw_status_t pdgw_buf_append(pdgw_buf_t *buf, const void *data, size_t len)
{
    return buf_status(pdb_buf_append(buf, data, len));
}

pdgw_status_t pdgw_buf_append_str(pdgw_buf_t *buf, const char *s)
{
    return buf_status(pdb_buf_append_str(buf, s));
}

pdgw_status_t pdgw_buf_append_char(pdgw_buf_t *buf, char c)
{
    return buf_status(pdb_buf_append_char(buf, c));
}

pdgw_status_t pdgw_buf_vappendf(pdgw_buf_t *buf, const char *fmt, va_list ap)
{
    return buf_status(pdb_buf_vappendf(buf, fmt, ap));
}

pdgw_status_t pdgw_buf_appendf(pdgw_buf_t *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pdgw_status_t st = pdgw_buf_vappendf(buf, fmt, ap);
    va_end(ap);
    return st;
}

void pdgw_buf_consume(pdgw_buf_t *buf, size_t n)
{
    pdb_buf_consume(buf, n);
}

void pdgw_buf_reset(pdgw_buf_t *buf)
{
    pdb_buf_reset(buf);
}

void pdgw_buf_free(pdgw_buf_t *buf)
{
    pdb_buf_free(buf);
}

char *pdgw_buf_steal(pdgw_buf_t *buf, size_t *len_out)
{
    return pdb_buf_steal(buf, len_out);
}
