/*
 * pdgw_config_cli.c - PDGW_* environment, getopt_long flags generated from the option
 * table, --help / --print-config output and the start-up sequence.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_config_int.h"

extern char **environ;

#define VAL_FLAG 0x1000 /* getopt val = VAL_FLAG + row index */
#define VAL_NEG  0x4000 /* --no-<flag> for booleans */

static bool is_action(const pdgw_config_option_t *o, const char *flag)
{
    return o->type == PDGW_OPT_ACTION && strcmp(o->flag, flag) == 0;
}

static pdgw_role_t quick_role(const pdgw_config_option_t *o)
{
    return strcmp(o->flag, "prefill") == 0  ? PDGW_ROLE_PREFILL
           : strcmp(o->flag, "decode") == 0 ? PDGW_ROLE_DECODE
                                            : PDGW_ROLE_BOTH;
}

static bool is_quick(const pdgw_config_option_t *o)
{
    return is_action(o, "both") || is_action(o, "prefill") || is_action(o, "decode");
}

/* ---------------------------------------------------------------- environment */

/* Variables of the prefix that belong to other tools of the project. */
static bool env_foreign(const char *name, size_t len)
{
    static const char *const exact[] = {"PDGW_CONFIG", "PDGW_BIN_DIR", "PDGW_SOURCE_DIR",
                                        "PDGW_BUILD_DIR"};
    static const char *const prefixes[] = {"PDGW_TEST_", "PDGW_SIM_", "PDGW_DEPS_", "PDGW_BENCH_",
                                           "PDGW_DEMO_", "PDGW_KVT_", "PDGW_SCHED_"};
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) {
        if (strlen(exact[i]) == len && strncmp(name, exact[i], len) == 0)
            return true;
    }
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        if (len >= strlen(prefixes[i]) && strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    }
    return false;
}

/* Apply comma-separated items of <value> one by one (lists, maps, instance URLs). */
static pdgw_status_t env_items(pdgw_config_t *cfg, const pdgw_config_option_t *o, const char *value,
                               const char *key, pdgw_cfg_src_t *src)
{
    char *copy = pdgw_strdup(value);
    if (copy == NULL)
        return PDGW_ERR_NOMEM;
    pdgw_status_t st = PDGW_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL && st == PDGW_OK;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        size_t l = strlen(tok);
        while (l > 0 && (tok[l - 1] == ' ' || tok[l - 1] == '\t'))
            tok[--l] = '\0';
        if (l == 0)
            continue;
        if (is_quick(o))
            st = pdgw_cfg_instance_quick(cfg, quick_role(o), tok, src);
        else
            st = pdgw_cfg_opt_set_text(o, cfg, tok, key, src);
    }
    pdgw_free(copy);
    return st;
}

pdgw_status_t pdgw_config_load_env(pdgw_config_t *cfg, char *const *envp, pdgw_config_error_t *err)
{
    if (envp == NULL)
        envp = environ;
    size_t n_tab;
    const pdgw_config_option_t *tab = pdgw_config_options(&n_tab);
    for (char *const *e = envp; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "PDGW_", 5) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        if (eq == NULL)
            continue;
        size_t nl = (size_t)(eq - *e);
        const char *value = eq + 1;
        const pdgw_config_option_t *o = NULL;
        for (size_t i = 0; i < n_tab; i++) {
            if (tab[i].env != NULL && strlen(tab[i].env) == nl &&
                strncmp(tab[i].env, *e, nl) == 0) {
                o = &tab[i];
                break;
            }
        }
        if (o == NULL || is_action(o, "config")) {
            if (o == NULL && !env_foreign(*e, nl)) {
                char name[128];
                snprintf(name, sizeof(name), "%.*s", (int)(nl < 127 ? nl : 127), *e);
                const char *cands[64];
                size_t nc = 0;
                for (size_t i = 0; i < n_tab && nc < 64; i++) {
                    if (tab[i].env != NULL)
                        cands[nc++] = tab[i].env;
                }
                const char *s = pdgw_cfg_suggest(name, cands, nc);
                pdgw_log_warn("config", "unknown environment variable %s ignored%s%s%s", name,
                              s ? " (did you mean " : "", s ? s : "", s ? "?)" : "");
            }
            continue;
        }
        pdgw_cfg_src_t src = {.err = err, .label = o->env};
        const char *key = o->key != NULL ? o->key : o->flag;
        pdgw_status_t st;
        if (o->type == PDGW_OPT_LIST || o->type == PDGW_OPT_MAP) {
            pdgw_cfg_opt_clear(o, cfg);
            st = env_items(cfg, o, value, key, &src);
        } else if (is_quick(o)) {
            st = env_items(cfg, o, value, key, &src);
        } else {
            st = pdgw_cfg_opt_set_text(o, cfg, value, key, &src);
        }
        if (st != PDGW_OK)
            return st;
    }
    pdgw_cfg_src_t src = {.err = err};
    return pdgw_cfg_finalize(cfg, &src);
}

/* ---------------------------------------------------------------- help, print */

static void print_default(FILE *out, const pdgw_config_option_t *o)
{
    if (o->type == PDGW_OPT_ACTION)
        return;
    if (o->def == NULL)
        fprintf(out, ", default none");
    else if (o->def[0] == '\0')
        fprintf(out, ", default \"\"");
    else
        fprintf(out, ", default %s", o->def);
}

void pdgw_config_print_help(FILE *out, const char *progname)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    if (progname == NULL)
        progname = "pdgw";
    fprintf(out,
            "Usage: %s [OPTIONS]\n"
            "       %s tokenize --tokenizer PATH [--chat]   (token ids of JSON lines on stdin)\n"
            "OpenAI-compatible gateway for prefill/decode disaggregated LLM serving.\n\n"
            "Every option is also a YAML key (--config FILE) and an environment variable.\n"
            "Precedence: command line > environment > config file > default.\n"
            "Durations: 500ms, 30s, 2m, 1h or plain seconds. Sizes: 16MiB, 512KiB, bytes.\n"
            "Booleans: --flag, --no-flag or --flag=true|false.\n\n"
            "Quick start: %s --listen 127.0.0.1:8000 --protocol neutral --both "
            "http://127.0.0.1:8100\n\nOptions:\n",
            progname, progname, progname);
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        fprintf(out, "  --%s", o->flag);
        if (o->type == PDGW_OPT_BOOL)
            fprintf(out, ", --no-%s", o->flag);
        else if (o->metavar != NULL)
            fprintf(out, " %s", o->metavar);
        fprintf(out, "\n      %s\n      [", o->help);
        if (o->key != NULL)
            fprintf(out, "key %s", o->key);
        else
            fprintf(out, "command line");
        if (o->env != NULL)
            fprintf(out, ", env %s", o->env);
        if (o->type == PDGW_OPT_ENUM) {
            fprintf(out, ", one of");
            for (size_t k = 0; o->enum_names[k] != NULL; k++)
                fprintf(out, "%s%s", k ? "|" : " ", o->enum_names[k]);
        } else if (o->type == PDGW_OPT_INT) {
            fprintf(out, ", %ld..%ld", o->min, o->max);
        }
        print_default(out, o);
        fprintf(out, "]\n");
    }
    const pdgw_config_option_t *itab = pdgw_config_instance_options(&n);
    fprintf(out, "\nPer-instance fields (YAML only, items of `instances:`):\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "  %-16s %s [", itab[i].key, itab[i].help);
        if (itab[i].type == PDGW_OPT_ENUM) {
            for (size_t k = 0; itab[i].enum_names[k] != NULL; k++)
                fprintf(out, "%s%s", k ? "|" : "", itab[i].enum_names[k]);
            fprintf(out, ", ");
        }
        fprintf(out, "default %s]\n",
                itab[i].def == NULL ? "none"
                : itab[i].def[0]    ? itab[i].def
                                    : "\"\"");
    }
}

static void yaml_quoted(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

static void print_value(FILE *out, const pdgw_config_option_t *o, const void *base, bool mask)
{
    const void *f = (const char *)base + o->offset;
    char tmp[64];
    switch (o->type) {
    case PDGW_OPT_STRING:
    case PDGW_OPT_HOSTPORT: {
        const char *v = *(char *const *)f != NULL ? *(char *const *)f : "";
        yaml_quoted(out, mask && v[0] ? "***" : v);
        break;
    }
    case PDGW_OPT_INT:
        fprintf(out, "%d", *(const int *)f);
        break;
    case PDGW_OPT_BOOL:
        fputs(*(const bool *)f ? "true" : "false", out);
        break;
    case PDGW_OPT_DURATION:
        pdgw_duration_format(*(const uint64_t *)f, tmp, sizeof(tmp));
        fputs(tmp, out);
        break;
    case PDGW_OPT_SIZE:
        pdgw_size_format(*(const uint64_t *)f, tmp, sizeof(tmp));
        fputs(tmp, out);
        break;
    case PDGW_OPT_ENUM:
        fputs(o->enum_names[*(const int *)f], out);
        break;
    case PDGW_OPT_LIST: {
        const pdgw_str_list_t *l = f;
        fputc('[', out);
        for (size_t i = 0; i < l->count; i++) {
            fputs(i ? ", " : "", out);
            yaml_quoted(out, mask ? "***" : l->items[i]);
        }
        fputc(']', out);
        break;
    }
    case PDGW_OPT_MAP: {
        const pdgw_kv_list_t *m = f;
        fputc('{', out);
        for (size_t i = 0; i < m->count; i++) {
            fputs(i ? ", " : "", out);
            yaml_quoted(out, mask ? "***" : m->items[i].key);
            fputs(": ", out);
            yaml_quoted(out, m->items[i].value);
        }
        fputc('}', out);
        break;
    }
    case PDGW_OPT_INT_LIST: {
        const pdgw_int_list_t *l = f;
        fputc('[', out);
        for (size_t i = 0; i < l->count; i++)
            fprintf(out, "%s%d", i ? ", " : "", l->items[i]);
        fputc(']', out);
        break;
    }
    case PDGW_OPT_ACTION:
        break;
    }
}

static void print_instances(const pdgw_config_t *cfg, FILE *out)
{
    size_t n;
    const pdgw_config_option_t *itab = pdgw_config_instance_options(&n);
    if (cfg->n_instances == 0) {
        fputs("instances: []\n", out);
        return;
    }
    fputs("instances:\n", out);
    for (size_t i = 0; i < cfg->n_instances; i++) {
        for (size_t k = 0; k < n; k++) {
            fputs(k == 0 ? "  - " : "    ", out);
            fprintf(out, "%s: ", itab[k].key);
            print_value(out, &itab[k], &cfg->instances[i], false);
            fputc('\n', out);
        }
    }
}

void pdgw_config_print(const pdgw_config_t *cfg, FILE *out)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    bool instances_done = false;
    const char *prev = "";
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = &tab[i];
        if (o->key == NULL)
            continue;
        if (strchr(o->key, '.') != NULL && !instances_done) {
            print_instances(cfg, out);
            instances_done = true;
        }
        /* Open the sections that differ from the previous key's path. */
        const char *k = o->key;
        size_t common = 0; /* bytes of shared leading components, incl. the dot */
        for (size_t j = 0; k[j] && prev[j] == k[j]; j++) {
            if (k[j] == '.')
                common = j + 1;
        }
        int depth = 0;
        for (size_t j = 0; j < common; j++)
            depth += k[j] == '.';
        const char *rest = k + common;
        const char *dot;
        while ((dot = strchr(rest, '.')) != NULL) {
            fprintf(out, "%*s%.*s:\n", depth * 2, "", (int)(dot - rest), rest);
            depth++;
            rest = dot + 1;
        }
        fprintf(out, "%*s%s: ", depth * 2, "", rest);
        print_value(out, o, cfg,
                    strcmp(o->key, "api_keys") == 0 || strcmp(o->key, "admin_api_key") == 0 ||
                        strcmp(o->key, "rate_limits") == 0 || strcmp(o->key, "slo_keys") == 0);
        fputc('\n', out);
        prev = k;
    }
    if (!instances_done)
        print_instances(cfg, out);
}

/* ---------------------------------------------------------------- start-up sequence */

typedef struct cli_item {
    const pdgw_config_option_t *opt;
    bool negated;
    const char *arg;
} cli_item_t;

static pdgw_status_t report(const pdgw_config_hooks_t *h, pdgw_config_error_t *err,
                            pdgw_status_t st)
{
    FILE *e = h != NULL && h->err != NULL ? h->err : stderr;
    if (st == PDGW_ERR_NOMEM && err->message[0] == '\0')
        snprintf(err->message, sizeof(err->message), "out of memory");
    fprintf(e, "%s: %s\n", h != NULL && h->progname != NULL ? h->progname : "pdgw", err->message);
    fflush(e);
    return st;
}

/* Parse argv into <items> (no side effects on cfg). */
static pdgw_status_t scan_args(int argc, char **argv, cli_item_t *items, size_t *n_items,
                               pdgw_config_error_t *err)
{
    size_t n_tab;
    const pdgw_config_option_t *tab = pdgw_config_options(&n_tab);
    struct option *lo = pdgw_calloc(2 * n_tab + 1, sizeof(*lo));
    if (lo == NULL)
        return PDGW_ERR_NOMEM;
    size_t nl = 0;
    char **neg_names = pdgw_calloc(n_tab, sizeof(char *));
    pdgw_status_t st = PDGW_OK;
    if (neg_names == NULL) {
        st = PDGW_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n_tab; i++) {
        const pdgw_config_option_t *o = &tab[i];
        int has_arg = required_argument;
        if (o->type == PDGW_OPT_BOOL)
            has_arg = optional_argument;
        else if (o->type == PDGW_OPT_ACTION && o->metavar == NULL)
            has_arg = no_argument;
        lo[nl++] = (struct option){o->flag, has_arg, NULL, VAL_FLAG + (int)i};
        if (o->type == PDGW_OPT_BOOL) {
            size_t len = strlen(o->flag) + 4;
            neg_names[i] = pdgw_malloc(len);
            if (neg_names[i] == NULL) {
                st = PDGW_ERR_NOMEM;
                goto out;
            }
            snprintf(neg_names[i], len, "no-%s", o->flag);
            lo[nl++] = (struct option){neg_names[i], no_argument, NULL, VAL_NEG + (int)i};
        }
    }
    lo[nl] = (struct option){NULL, 0, NULL, 0};

    pdgw_cfg_src_t src = {.err = err};
    optind = 0; /* full re-initialisation of getopt (glibc) */
    opterr = 0;
    int c;
    *n_items = 0;
    while ((c = getopt_long(argc, argv, ":hVc:", lo, NULL)) != -1) {
        const char *bad = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        if (c == '?') {
            char word[128];
            snprintf(word, sizeof(word), "%s", bad);
            char *eqs = strchr(word, '=');
            if (eqs != NULL)
                *eqs = '\0';
            const char *w = word;
            while (*w == '-')
                w++;
            const char *cands[128];
            size_t nc = 0;
            for (size_t i = 0; i < n_tab && nc < 128; i++)
                cands[nc++] = tab[i].flag;
            const char *s = pdgw_cfg_suggest(w, cands, nc);
            if (optopt != 0 && strncmp(bad, "--", 2) != 0)
                st = pdgw_cfg_fail(&src, NULL, "unknown option '-%c' (see --help)", optopt);
            else
                st = pdgw_cfg_fail(&src, NULL, "unknown option '%s'%s%s%s (see --help)", word,
                                   s ? " (did you mean '--" : "", s ? s : "", s ? "'?)" : "");
            goto out;
        }
        if (c == ':') {
            st = pdgw_cfg_fail(&src, NULL, "option '%s' needs a value", bad);
            goto out;
        }
        cli_item_t it = {NULL, false, optarg};
        if (c == 'h' || c == 'V' || c == 'c') {
            const char *name = c == 'h' ? "help" : c == 'V' ? "version" : "config";
            for (size_t i = 0; i < n_tab; i++) {
                if (is_action(&tab[i], name))
                    it.opt = &tab[i];
            }
        } else if (c >= VAL_NEG) {
            it.opt = &tab[c - VAL_NEG];
            it.negated = true;
        } else {
            it.opt = &tab[c - VAL_FLAG];
        }
        items[(*n_items)++] = it;
    }
    if (optind < argc)
        st = pdgw_cfg_fail(&src, NULL, "unexpected argument '%s' (options start with --)",
                           argv[optind]);
out:
    for (size_t i = 0; neg_names != NULL && i < n_tab; i++)
        pdgw_free(neg_names[i]);
    pdgw_free(neg_names);
    pdgw_free(lo);
    return st;
}

static pdgw_status_t apply_cli(pdgw_config_t *cfg, const cli_item_t *items, size_t n,
                               pdgw_config_error_t *err)
{
    size_t n_tab;
    const pdgw_config_option_t *tab = pdgw_config_options(&n_tab);
    bool cleared[128] = {false};
    for (size_t i = 0; i < n; i++) {
        const pdgw_config_option_t *o = items[i].opt;
        size_t idx = (size_t)(o - tab);
        char label[128];
        snprintf(label, sizeof(label), "--%s%s", items[i].negated ? "no-" : "", o->flag);
        pdgw_cfg_src_t src = {.err = err, .label = label};
        pdgw_status_t st = PDGW_OK;
        if (is_quick(o)) {
            st = pdgw_cfg_instance_quick(cfg, quick_role(o), items[i].arg, &src);
        } else if (o->type == PDGW_OPT_ACTION) {
            continue;
        } else if (o->type == PDGW_OPT_BOOL) {
            const char *v = items[i].negated ? "false" : items[i].arg ? items[i].arg : "true";
            st = pdgw_cfg_opt_set_text(o, cfg, v, o->key, &src);
        } else {
            if ((o->type == PDGW_OPT_LIST || o->type == PDGW_OPT_MAP) && idx < 128 &&
                !cleared[idx]) {
                pdgw_cfg_opt_clear(o, cfg); /* the command line replaces lower layers' list */
                cleared[idx] = true;
            }
            st = pdgw_cfg_opt_set_text(o, cfg, items[i].arg, o->key, &src);
        }
        if (st != PDGW_OK)
            return st;
    }
    pdgw_cfg_src_t src = {.err = err};
    return pdgw_cfg_finalize(cfg, &src);
}

static const cli_item_t *last_action(const cli_item_t *items, size_t n, const char *flag)
{
    const cli_item_t *r = NULL;
    for (size_t i = 0; i < n; i++) {
        if (is_action(items[i].opt, flag))
            r = &items[i];
    }
    return r;
}

static const char *env_lookup(char **envp, const char *name)
{
    size_t nl = strlen(name);
    for (char **e = envp; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, name, nl) == 0 && (*e)[nl] == '=')
            return *e + nl + 1;
    }
    return NULL;
}

pdgw_status_t pdgw_config_from_args(pdgw_config_t *cfg, int argc, char **argv, char **envp,
                                    const pdgw_config_hooks_t *hooks, pdgw_config_action_t *action,
                                    pdgw_config_error_t *err)
{
    pdgw_config_error_t local;
    if (err == NULL)
        err = &local;
    memset(err, 0, sizeof(*err));
    if (envp == NULL)
        envp = environ;
    FILE *out = hooks != NULL && hooks->out != NULL ? hooks->out : stdout;
    *action = PDGW_CONFIG_RUN;

    pdgw_status_t st = pdgw_config_init(cfg);
    if (st != PDGW_OK)
        return report(hooks, err, st);
    /* one argument may hold several short options ("-hV"): room for one per character */
    size_t cap = 1;
    for (int i = 0; i < argc; i++)
        cap += argv[i] != NULL ? strlen(argv[i]) + 1 : 1;
    cli_item_t *items = pdgw_calloc(cap, sizeof(*items));
    if (items == NULL)
        return report(hooks, err, PDGW_ERR_NOMEM);
    size_t n_items = 0;
    st = scan_args(argc, argv, items, &n_items, err);
    if (st != PDGW_OK)
        goto err_report;

    if (last_action(items, n_items, "help") != NULL) {
        pdgw_config_print_help(out, hooks != NULL ? hooks->progname : NULL);
        *action = PDGW_CONFIG_EXIT;
        goto done;
    }
    if (last_action(items, n_items, "version") != NULL) {
        fprintf(out, "%s %s\n", hooks != NULL && hooks->progname ? hooks->progname : "pdgw",
                hooks != NULL && hooks->version ? hooks->version : PDGW_VERSION_STRING);
        *action = PDGW_CONFIG_EXIT;
        goto done;
    }
    const cli_item_t *check = last_action(items, n_items, "check-config");
    if (check != NULL) {
        st = pdgw_config_load_file(cfg, check->arg, err);
        if (st == PDGW_OK)
            st = pdgw_config_check(cfg, hooks, err);
        if (st == PDGW_OK && hooks != NULL && hooks->deep_check != NULL) {
            char msg[sizeof(err->message) - 64] = "";
            st = hooks->deep_check(hooks->ctx, cfg, msg, sizeof(msg));
            if (st != PDGW_OK) {
                snprintf(err->file, sizeof(err->file), "%s", check->arg);
                snprintf(err->message, sizeof(err->message), "%.60s: %s", check->arg, msg);
            }
        }
        if (st != PDGW_OK)
            goto err_report;
        fprintf(out, "config OK\n");
        *action = PDGW_CONFIG_EXIT;
        goto done;
    }

    const cli_item_t *file = last_action(items, n_items, "config");
    const char *path = file != NULL ? file->arg : env_lookup(envp, "PDGW_CONFIG");
    if (path != NULL && path[0] != '\0') {
        st = pdgw_config_load_file(cfg, path, err);
        if (st != PDGW_OK)
            goto err_report;
    }
    st = pdgw_config_load_env(cfg, envp, err);
    if (st == PDGW_OK)
        st = apply_cli(cfg, items, n_items, err);
    if (st == PDGW_OK)
        st = pdgw_config_check(cfg, hooks, err);
    if (st != PDGW_OK)
        goto err_report;
    if (last_action(items, n_items, "print-config") != NULL) {
        pdgw_config_print(cfg, out);
        *action = PDGW_CONFIG_EXIT;
    } else if (last_action(items, n_items, "check-engines") != NULL) {
        *action = last_action(items, n_items, "json") != NULL ? PDGW_CONFIG_CHECK_ENGINES_JSON
                                                              : PDGW_CONFIG_CHECK_ENGINES;
    } else if (last_action(items, n_items, "json") != NULL) {
        pdgw_cfg_src_t src = {.err = err};
        st = pdgw_cfg_fail(&src, NULL, "--json goes with --check-engines");
        goto err_report;
    }
done:
    fflush(out);
    pdgw_free(items);
    return PDGW_OK;

err_report:
    pdgw_free(items);
    return report(hooks, err, st);
}
