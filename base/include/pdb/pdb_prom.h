/*
 * pdb_prom.h - the one Prometheus text-format (0.0.4) writer.
 *
 * A writer appends to a pdb_buf_t and remembers the first failure, so a long run of writes
 * needs one check at the end (pdb_prom_status). Names are the caller's (trusted); label
 * values and HELP text are escaped here.
 */
#ifndef PDB_PROM_H
#define PDB_PROM_H

#include <stdint.h>

#include "pdb/pdb_buf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdb_prom {
    pdb_buf_t *out;
    pdb_status_t status; /* first failure; later writes do nothing */
} pdb_prom_t;

static inline void pdb_prom_init(pdb_prom_t *p, pdb_buf_t *out)
{
    p->out = out;
    p->status = PDB_OK;
}

static inline pdb_status_t pdb_prom_status(const pdb_prom_t *p)
{
    return p->status;
}

/* "# HELP <name> <help>\n# TYPE <name> <type>\n"; <type>: counter, gauge, histogram. */
void pdb_prom_family(pdb_prom_t *p, const char *name, const char *type, const char *help);

/*
 * One sample line. Labels: <raw> is pre-rendered label text the caller vouches for
 * ('a="x",b="y"', may be NULL or ""), then <pairs> = {key, value, ..., NULL} (may be NULL)
 * whose values are escaped. A value is written as the shortest text that reads back exactly.
 */
void pdb_prom_sample(pdb_prom_t *p, const char *name, const char *raw, const char *const *pairs,
                     double v);
/* The same for integer counters, written exactly. */
void pdb_prom_sample_u64(pdb_prom_t *p, const char *name, const char *raw, const char *const *pairs,
                         uint64_t v);
/* Copy of pre-rendered text (a collector's output); a missing final newline is added. */
void pdb_prom_text(pdb_prom_t *p, const char *text);

/* The building blocks, for writers with their own label layout. */
pdb_status_t pdb_prom_put_double(pdb_buf_t *out, double v);
pdb_status_t pdb_prom_put_label_value(pdb_buf_t *out, const char *s); /* \\ \" \n escaped */
pdb_status_t pdb_prom_put_help(pdb_buf_t *out, const char *s);        /* \\ \n escaped */

#ifdef __cplusplus
}
#endif
#endif /* PDB_PROM_H */
