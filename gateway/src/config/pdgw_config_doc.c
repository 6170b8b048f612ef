/*
 * pdgw_config_doc.c - the reference tables of gateway/CONFIG.md, printed from the option
 * table itself (pdgw_config.c), so that the documentation cannot drift from what pdgw
 * parses: gateway/tools/config_docs.py splices them between the file's markers, and a test
 * fails when the committed file differs from what this prints.
 */
#include <string.h>

#include "pdgw_config.h"

/* A table cell: '|' escaped for Markdown. */
static void cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', out);
        fputc(*s, out);
    }
}

static const char *default_text(const pdgw_config_option_t *o)
{
    if (o->def != NULL && o->def[0] != '\0')
        return o->def;
    switch (o->type) {
    case PDGW_OPT_LIST:
    case PDGW_OPT_INT_LIST:
        return "[]";
    case PDGW_OPT_MAP:
        return "{}";
    default:
        return "\"\"";
    }
}

/* A size as its config spelling: the largest binary unit that divides it. */
static void size_text(FILE *out, long v)
{
    static const char *const unit[] = {"GiB", "MiB", "KiB"};
    for (int i = 0; i < 3; i++) {
        long u = 1L << (10 * (3 - i));
        if (v >= u && v % u == 0) {
            fprintf(out, "%ld%s", v / u, unit[i]);
            return;
        }
    }
    fprintf(out, "%ld", v);
}

/* What the value may be, after the meaning ("Allowed: ..."), for the types that say. */
static void allowed(FILE *out, const pdgw_config_option_t *o)
{
    switch (o->type) {
    case PDGW_OPT_INT:
        fprintf(out, " Allowed: %ld..%ld.", o->min, o->max);
        break;
    case PDGW_OPT_INT_LIST:
        fprintf(out, " Allowed: items %ld..%ld.", o->min, o->max);
        break;
    case PDGW_OPT_SIZE:
        if (o->max > 0) {
            fputs(" Allowed: ", out);
            size_text(out, o->min);
            fputs("..", out);
            size_text(out, o->max);
            fputc('.', out);
        } else if (o->min > 1) {
            fputs(" At least ", out);
            size_text(out, o->min);
            fputc('.', out);
        }
        break;
    case PDGW_OPT_ENUM:
        fprintf(out, " Allowed: ");
        for (size_t k = 0; o->enum_names[k] != NULL; k++)
            fprintf(out, "%s%s", k ? " \\| " : "", o->enum_names[k]);
        fputc('.', out);
        break;
    default:
        break;
    }
}

static void flag_cell(FILE *out, const pdgw_config_option_t *o)
{
    fprintf(out, "`--%s", o->flag);
    if (o->type == PDGW_OPT_BOOL)
        fprintf(out, ", --no-%s", o->flag);
    else if (o->metavar != NULL) {
        fputc(' ', out);
        cell(out, o->metavar);
    }
    fputc('`', out);
}

static void env_cell(FILE *out, const pdgw_config_option_t *o)
{
    if (o->env != NULL)
        fprintf(out, "`%s`", o->env);
    else
        fputs("—", out);
}

static void print_keys(FILE *out)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);

    fprintf(out, "| key | flag | env | default | meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        if (o->key == NULL)
            continue;
        fprintf(out, "| `%s` | ", o->key);
        if (o->flag != NULL)
            flag_cell(out, o);
        else
            fputs("—", out);
        fputs(" | ", out);
        env_cell(out, o);
        fputs(" | `", out);
        cell(out, default_text(o));
        fputs("` | ", out);
        cell(out, o->help);
        allowed(out, o);
        fputs(" |\n", out);
    }
}

static void print_cli(FILE *out)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);

    fprintf(out, "| flag | env | meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        if (o->key != NULL)
            continue;
        fputs("| ", out);
        flag_cell(out, o);
        fputs(" | ", out);
        env_cell(out, o);
        fputs(" | ", out);
        cell(out, o->help);
        fputs(" |\n", out);
    }
}

static void print_instances(FILE *out)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_instance_options(&n);

    fprintf(out, "| field | default | meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        fprintf(out, "| `%s` | `", o->key);
        cell(out, default_text(o));
        fputs("` | ", out);
        cell(out, o->help);
        allowed(out, o);
        fputs(" |\n", out);
    }
}

pdgw_status_t pdgw_config_print_doc(FILE *out, const char *table)
{
    if (strcmp(table, "keys") == 0)
        print_keys(out);
    else if (strcmp(table, "cli") == 0)
        print_cli(out);
    else if (strcmp(table, "instances") == 0)
        print_instances(out);
    else
        return PDGW_ERR_INVALID;
    return PDGW_OK;
}
