/*
 * pdb_prom.c - Prometheus text-format writer (see pdb_prom.h).
 */
#include "pdb/pdb_prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pdb_status_t pdb_prom_put_double(pdb_buf_t *out, double v)
{
    char tmp[40];

    if (isnan(v))
        return pdb_buf_append_str(out, "NaN");
    if (isinf(v))
        return pdb_buf_append_str(out, v > 0 ? "+Inf" : "-Inf");
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    return pdb_buf_append_str(out, tmp);
}

/* <s> with backslash, newline and (when <quote>) the double quote escaped. */
static pdb_status_t put_escaped(pdb_buf_t *out, const char *s, int quote)
{
    pdb_status_t st = PDB_OK;

    for (; *s != '\0' && st == PDB_OK; s++) {
        if (*s == '\\')
            st = pdb_buf_append_str(out, "\\\\");
        else if (*s == '\n')
            st = pdb_buf_append_str(out, "\\n");
        else if (*s == '"' && quote)
            st = pdb_buf_append_str(out, "\\\"");
        else
            st = pdb_buf_append_char(out, *s);
    }
    return st;
}

pdb_status_t pdb_prom_put_label_value(pdb_buf_t *out, const char *s)
{
    return put_escaped(out, s, 1);
}

pdb_status_t pdb_prom_put_help(pdb_buf_t *out, const char *s)
{
    return put_escaped(out, s, 0);
}

static void keep(pdb_prom_t *p, pdb_status_t st)
{
    if (p->status == PDB_OK)
        p->status = st;
}

void pdb_prom_family(pdb_prom_t *p, const char *name, const char *type, const char *help)
{
    if (p->status != PDB_OK)
        return;
    keep(p, pdb_buf_appendf(p->out, "# HELP %s ", name));
    if (p->status == PDB_OK)
        keep(p, pdb_prom_put_help(p->out, help != NULL ? help : ""));
    if (p->status == PDB_OK)
        keep(p, pdb_buf_appendf(p->out, "\n# TYPE %s %s\n", name, type));
}

/* "name{raw,k="v",...} " */
static void put_head(pdb_prom_t *p, const char *name, const char *raw, const char *const *pairs)
{
    int has_raw = raw != NULL && raw[0] != '\0';
    int has_pairs = pairs != NULL && pairs[0] != NULL;

    keep(p, pdb_buf_append_str(p->out, name));
    if (!has_raw && !has_pairs) {
        keep(p, pdb_buf_append_char(p->out, ' '));
        return;
    }
    keep(p, pdb_buf_append_char(p->out, '{'));
    if (has_raw)
        keep(p, pdb_buf_append_str(p->out, raw));
    for (size_t i = 0; has_pairs && pairs[i] != NULL && pairs[i + 1] != NULL; i += 2) {
        if (i > 0 || has_raw)
            keep(p, pdb_buf_append_char(p->out, ','));
        keep(p, pdb_buf_appendf(p->out, "%s=\"", pairs[i]));
        keep(p, pdb_prom_put_label_value(p->out, pairs[i + 1]));
        keep(p, pdb_buf_append_char(p->out, '"'));
    }
    keep(p, pdb_buf_append_str(p->out, "} "));
}

void pdb_prom_sample(pdb_prom_t *p, const char *name, const char *raw, const char *const *pairs,
                     double v)
{
    if (p->status != PDB_OK)
        return;
    put_head(p, name, raw, pairs);
    keep(p, pdb_prom_put_double(p->out, v));
    keep(p, pdb_buf_append_char(p->out, '\n'));
}

void pdb_prom_sample_u64(pdb_prom_t *p, const char *name, const char *raw, const char *const *pairs,
                         uint64_t v)
{
    if (p->status != PDB_OK)
        return;
    put_head(p, name, raw, pairs);
    keep(p, pdb_buf_appendf(p->out, "%llu\n", (unsigned long long)v));
}

void pdb_prom_text(pdb_prom_t *p, const char *text)
{
    size_t n = strlen(text);

    if (p->status != PDB_OK || n == 0)
        return;
    keep(p, pdb_buf_append(p->out, text, n));
    if (text[n - 1] != '\n')
        keep(p, pdb_buf_append_char(p->out, '\n'));
}
