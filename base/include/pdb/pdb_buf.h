/*
 * pdb_buf.h - a growable byte buffer.
 *
 * data is NUL-terminated after len bytes once anything was appended (NULL while cap == 0).
 * Zero-initialise (PDB_BUF_INIT) or pdb_buf_init() before use. The buffer owns data;
 * pdb_buf_free() releases it, pdb_buf_steal() hands it over. An append that fails
 * (PDB_ERR_NOMEM, or PDB_ERR_TOO_LARGE past the optional <limit>) leaves it unchanged.
 */
#ifndef PDB_BUF_H
#define PDB_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "pdb/pdb_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdb_buf {
    char *data;
    size_t len;
    size_t cap;
    size_t limit; /* max len, 0 = unlimited */
} pdb_buf_t;

#define PDB_BUF_INIT                                                                               \
    {                                                                                              \
        NULL, 0, 0, 0                                                                              \
    }

void pdb_buf_init(pdb_buf_t *buf);
/* Room for at least <extra> more bytes (+1 for the NUL). */
pdb_status_t pdb_buf_reserve(pdb_buf_t *buf, size_t extra);
/* Room for exactly <extra> more bytes (+1) when the final size is known, instead of the next
 * power of two: a 9 MiB body then takes 9 MiB, not 16. */
pdb_status_t pdb_buf_reserve_exact(pdb_buf_t *buf, size_t extra);
pdb_status_t pdb_buf_append(pdb_buf_t *buf, const void *data, size_t len);
pdb_status_t pdb_buf_append_str(pdb_buf_t *buf, const char *s);
pdb_status_t pdb_buf_append_char(pdb_buf_t *buf, char c);
pdb_status_t pdb_buf_appendf(pdb_buf_t *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
pdb_status_t pdb_buf_vappendf(pdb_buf_t *buf, const char *fmt, va_list ap);
/* Drop the first <n> bytes (n > len drops all); keeps capacity. */
void pdb_buf_consume(pdb_buf_t *buf, size_t n);
/* len = 0, keeps capacity. */
void pdb_buf_reset(pdb_buf_t *buf);
/* Release the memory; the buffer is empty and reusable. */
void pdb_buf_free(pdb_buf_t *buf);
/* Hand the data (free() it) to the caller, never NULL unless out of memory; buf is empty. */
char *pdb_buf_steal(pdb_buf_t *buf, size_t *len_out);

#ifdef __cplusplus
}
#endif
#endif /* PDB_BUF_H */
