/*
 * pdtok_pieces.c - the status names, the caller's id arrays and the piece lists that carry
 * text from one stage of the pipeline to the next.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"

const char *pdtok_strerror(pdtok_status_t st)
{
    switch (st) {
    case PDTOK_OK:
        return "ok";
    case PDTOK_ERR_NOMEM:
        return "out of memory";
    case PDTOK_ERR_INVALID:
        return "invalid argument or malformed tokenizer";
    case PDTOK_ERR_UNSUPPORTED:
        return "unsupported tokenizer component";
    case PDTOK_ERR_IO:
        return "file could not be read";
    case PDTOK_ERR_RANGE:
        return "token id out of range";
    case PDTOK_ERR_REGEX:
        return "pattern match failed";
    }
    return "unknown status";
}

void tok_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void pdtok_ids_free(pdtok_ids_t *ids)
{
    pdb_free(ids->ids);
    ids->ids = NULL;
    ids->len = ids->cap = 0;
}

pdtok_status_t tok_ids_push(pdtok_ids_t *ids, int32_t id)
{
    if (ids->len == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *n = pdb_realloc(ids->ids, cap * sizeof(*n));
        if (!n)
            return PDTOK_ERR_NOMEM;
        ids->ids = n;
        ids->cap = cap;
    }
    ids->ids[ids->len++] = id;
    return PDTOK_OK;
}

pdtok_status_t tok_pieces_add(tok_pieces_t *p, const char *s, size_t len)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        tok_span_t *n = pdb_realloc(p->sp, cap * sizeof(*n));
        if (!n)
            return PDTOK_ERR_NOMEM;
        p->sp = n;
        p->cap = cap;
    }
    size_t off = p->text.len;
    if (pdb_buf_append(&p->text, s, len) != PDB_OK || pdb_buf_reserve(&p->text, 1) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    p->sp[p->n].off = off;
    p->sp[p->n].len = len;
    p->n++;
    return PDTOK_OK;
}

pdtok_status_t tok_pieces_extend_last(tok_pieces_t *p, const char *s, size_t len)
{
    if (p->n == 0)
        return tok_pieces_add(p, s, len);
    /* The last piece ends the arena, so appending extends it. */
    if (pdb_buf_append(&p->text, s, len) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    p->sp[p->n - 1].len += len;
    return PDTOK_OK;
}

void tok_pieces_reset(tok_pieces_t *p)
{
    pdb_buf_reset(&p->text);
    p->n = 0;
}

void tok_pieces_free(tok_pieces_t *p)
{
    pdb_buf_free(&p->text);
    pdb_free(p->sp);
    p->sp = NULL;
    p->n = p->cap = 0;
}
