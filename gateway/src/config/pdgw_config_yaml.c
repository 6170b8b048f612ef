/*
 * pdgw_config_yaml.c - merge a YAML document into pdgw_config_t.
 *
 * The document is composed with libyaml's document API (node tree with line marks), then
 * walked against the option table: mappings descend along dotted key paths
 * ("discovery" -> "discovery.dns" -> "discovery.dns.interval"), `instances` is a sequence
 * of mappings checked against the instance table. Unknown or duplicate keys, wrong node
 * kinds and bad values are errors naming "file:line: key".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <yaml.h>

#include "pdgw_alloc.h"
#include "pdgw_config_int.h"

#define MAX_CONFIG_BYTES (4u << 20)

typedef struct walk {
    pdgw_config_t *cfg;
    yaml_document_t *doc;
    pdgw_cfg_src_t src;
} walk_t;

static int node_line(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

static pdgw_status_t fail_at(walk_t *w, const yaml_node_t *n, const char *key, const char *fmt,
                             const char *arg)
{
    w->src.line = n != NULL ? node_line(n) : 0;
    return pdgw_cfg_fail(&w->src, key, fmt, arg);
}

static bool is_null_scalar(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return v[0] == '\0' || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
           strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

static const char *kind_name(const yaml_node_t *n)
{
    return n->type == YAML_MAPPING_NODE    ? "a mapping"
           : n->type == YAML_SEQUENCE_NODE ? "a list"
                                           : "a scalar";
}

/* A scalar's text, or an error naming what was expected. */
static pdgw_status_t scalar_text(walk_t *w, const yaml_node_t *n, const char *key,
                                 const char *expected, const char **out)
{
    if (n->type != YAML_SCALAR_NODE) {
        char msg[160];
        snprintf(msg, sizeof(msg), "expected %s, got %%s", expected);
        return fail_at(w, n, key, msg, kind_name(n));
    }
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
        return fail_at(w, n, key, "%s contains a NUL byte", "value");
    *out = (const char *)n->data.scalar.value;
    return PDGW_OK;
}

/* Duplicate key check among the pairs before <upto> in a mapping. */
static bool key_seen(yaml_document_t *doc, yaml_node_t *map, yaml_node_pair_t *upto, const char *k)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < upto; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        if (kn != NULL && kn->type == YAML_SCALAR_NODE &&
            strcmp((const char *)kn->data.scalar.value, k) == 0)
            return true;
    }
    return false;
}

/* Set one table row from a value node. */
static pdgw_status_t set_value(walk_t *w, const pdgw_config_option_t *o, void *base, yaml_node_t *v,
                               const char *key)
{
    pdgw_status_t st;
    w->src.line = node_line(v);
    const char *text = "";
    switch (o->type) {
    case PDGW_OPT_LIST:
    case PDGW_OPT_INT_LIST: {
        pdgw_cfg_opt_clear(o, base);
        if (is_null_scalar(v))
            return PDGW_OK;
        if (v->type != YAML_SEQUENCE_NODE)
            return fail_at(w, v, key, "expected a list, got %s", kind_name(v));
        size_t i = 0;
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
             it++, i++) {
            yaml_node_t *item = yaml_document_get_node(w->doc, *it);
            char ik[160];
            snprintf(ik, sizeof(ik), "%s[%zu]", key, i);
            st = scalar_text(w, item, ik, "a scalar", &text);
            if (st != PDGW_OK)
                return st;
            w->src.line = node_line(item);
            st = pdgw_cfg_opt_set_text(o, base, text, ik, &w->src);
            if (st != PDGW_OK)
                return st;
        }
        /* An empty list said in so many words: the only way a reload may turn auth off
         * (pdgw_reload_hooks.c). */
        if (i == 0 && strcmp(o->key, "api_keys") == 0)
            ((pdgw_config_t *)base)->api_keys_cleared = true;
        return PDGW_OK;
    }
    case PDGW_OPT_MAP: {
        if (is_null_scalar(v))
            return PDGW_OK;
        if (v->type != YAML_MAPPING_NODE)
            return fail_at(w, v, key, "expected a mapping of key: value, got %s", kind_name(v));
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top;
             p++) {
            yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
            yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
            const char *k = "";
            st = scalar_text(w, kn, key, "scalar keys", &k);
            if (st != PDGW_OK)
                return st;
            char sub[300];
            snprintf(sub, sizeof(sub), "%s.%s", key, k);
            if (k[0] == '\0')
                return fail_at(w, kn, key, "%s has an empty key", "mapping");
            if (key_seen(w->doc, v, p, k))
                return fail_at(w, kn, sub, "duplicate key%s", "");
            const char *val = "";
            if (!is_null_scalar(vn)) {
                st = scalar_text(w, vn, sub, "a scalar value", &val);
                if (st != PDGW_OK)
                    return st;
            }
            st = pdgw_cfg_map_set((pdgw_kv_list_t *)((char *)base + o->offset), k, val);
            if (st != PDGW_OK)
                return st;
        }
        return PDGW_OK;
    }
    case PDGW_OPT_STRING:
    case PDGW_OPT_HOSTPORT:
        if (is_null_scalar(v))
            return pdgw_cfg_opt_set_text(o, base, "", key, &w->src);
        /* fall through */
    default:
        st = scalar_text(w, v, key, "a scalar value", &text);
        if (st != PDGW_OK)
            return st;
        return pdgw_cfg_opt_set_text(o, base, text, key, &w->src);
    }
}

static pdgw_status_t walk_instances(walk_t *w, yaml_node_t *v)
{
    if (is_null_scalar(v))
        return PDGW_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return fail_at(w, v, "instances", "expected a list of instances, got %s", kind_name(v));
    size_t n_tab;
    const pdgw_config_option_t *tab = pdgw_config_instance_options(&n_tab);
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(w->doc, *it);
        size_t index = w->cfg->n_instances;
        char ik[64];
        snprintf(ik, sizeof(ik), "instances[%zu]", index);
        if (item->type != YAML_MAPPING_NODE)
            return fail_at(w, item, ik, "expected a mapping (id, url, role, ...), got %s",
                           kind_name(item));
        pdgw_instance_config_t inst;
        pdgw_status_t st = pdgw_cfg_instance_init(&inst);
        if (st != PDGW_OK)
            return st;
        for (yaml_node_pair_t *p = item->data.mapping.pairs.start;
             p < item->data.mapping.pairs.top && st == PDGW_OK; p++) {
            yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
            yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
            const char *k = "";
            st = scalar_text(w, kn, ik, "scalar keys", &k);
            if (st != PDGW_OK)
                break;
            char fk[200];
            snprintf(fk, sizeof(fk), "%s.%s", ik, k);
            if (key_seen(w->doc, item, p, k)) {
                st = fail_at(w, kn, fk, "duplicate key%s", "");
                break;
            }
            const pdgw_config_option_t *o = pdgw_cfg_find_key(tab, n_tab, k);
            if (o == NULL) {
                char hint[96];
                pdgw_cfg_suggest_key(tab, n_tab, "", k, hint, sizeof(hint));
                st = fail_at(w, kn, fk, "unknown key%s", hint);
                break;
            }
            st = set_value(w, o, &inst, vn, fk);
        }
        if (st == PDGW_OK) {
            w->src.line = node_line(item);
            st = pdgw_cfg_instance_finalize(&inst, index, &w->src);
        }
        if (st == PDGW_OK)
            st = pdgw_cfg_instance_add(w->cfg, &inst);
        if (st != PDGW_OK) {
            pdgw_cfg_instance_free(&inst);
            return st;
        }
    }
    return PDGW_OK;
}

/* True when some table key starts with "<prefix>.". */
static bool is_section(const pdgw_config_option_t *tab, size_t n, const char *prefix)
{
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < n; i++) {
        if (tab[i].key != NULL && strncmp(tab[i].key, prefix, pl) == 0 && tab[i].key[pl] == '.')
            return true;
    }
    return false;
}

static pdgw_status_t walk_mapping(walk_t *w, yaml_node_t *map, const char *prefix)
{
    size_t n_tab;
    const pdgw_config_option_t *tab = pdgw_config_options(&n_tab);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        const char *k = "";
        pdgw_status_t st =
            scalar_text(w, kn, prefix[0] ? prefix : "(top level)", "scalar keys", &k);
        if (st != PDGW_OK)
            return st;
        char path[256];
        snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "", k);
        if (key_seen(w->doc, map, p, k))
            return fail_at(w, kn, path, "duplicate key%s", "");
        if (prefix[0] == '\0' && strcmp(k, "instances") == 0) {
            st = walk_instances(w, vn);
        } else if (prefix[0] == '\0' && strcmp(k, "tenants") == 0) {
            st = pdgw_cfg_walk_tenants(w->cfg, w->doc, vn, &w->src);
        } else {
            const pdgw_config_option_t *o = pdgw_cfg_find_key(tab, n_tab, path);
            if (o != NULL) {
                st = set_value(w, o, w->cfg, vn, path);
            } else if (is_section(tab, n_tab, path)) {
                if (is_null_scalar(vn))
                    continue;
                if (vn->type != YAML_MAPPING_NODE)
                    return fail_at(w, vn, path, "expected a mapping, got %s", kind_name(vn));
                st = walk_mapping(w, vn, path);
            } else {
                char hint[96], pre[200];
                snprintf(pre, sizeof(pre), "%s%s", prefix, prefix[0] ? "." : "");
                pdgw_cfg_suggest_key(tab, n_tab, pre, k, hint, sizeof(hint));
                if (hint[0] == '\0' && prefix[0] == '\0' &&
                    pdgw_cfg_suggest(k, (const char *[]){"instances"}, 1))
                    snprintf(hint, sizeof(hint), " (did you mean 'instances'?)");
                else if (hint[0] == '\0' && prefix[0] == '\0' &&
                         pdgw_cfg_suggest(k, (const char *[]){"tenants"}, 1))
                    snprintf(hint, sizeof(hint), " (did you mean 'tenants'?)");
                return fail_at(w, kn, path, "unknown key%s", hint);
            }
        }
        if (st != PDGW_OK)
            return st;
    }
    return PDGW_OK;
}

pdgw_status_t pdgw_config_load_yaml(pdgw_config_t *cfg, const char *text, size_t len,
                                    const char *name, pdgw_config_error_t *err)
{
    walk_t w = {.cfg = cfg, .src = {.err = err, .file = name != NULL ? name : "<yaml>"}};
    yaml_parser_t parser;
    yaml_document_t doc;
    pdgw_status_t st;
    if (!yaml_parser_initialize(&parser))
        return PDGW_ERR_NOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        w.src.line = (int)parser.problem_mark.line + 1;
        st = pdgw_cfg_fail(&w.src, NULL, "YAML syntax error: %s%s%s",
                           parser.problem != NULL ? parser.problem : "unknown problem",
                           parser.context != NULL ? " " : "",
                           parser.context != NULL ? parser.context : "");
        if (st == PDGW_ERR_INVALID)
            st = PDGW_ERR_PARSE;
        goto err_parser;
    }
    w.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root == NULL || is_null_scalar(root)) {
        st = PDGW_OK; /* empty file: nothing to merge */
    } else if (root->type != YAML_MAPPING_NODE) {
        st = fail_at(&w, root, NULL, "the top level must be a mapping of keys, got %s",
                     kind_name(root));
    } else {
        st = walk_mapping(&w, root, "");
    }
    /* A second document in the same file is a mistake worth reporting. */
    if (st == PDGW_OK) {
        yaml_document_t extra;
        if (yaml_parser_load(&parser, &extra)) {
            if (yaml_document_get_root_node(&extra) != NULL) {
                w.src.line = (int)yaml_document_get_root_node(&extra)->start_mark.line + 1;
                st = pdgw_cfg_fail(&w.src, NULL, "more than one YAML document%s", "");
            }
            yaml_document_delete(&extra);
        }
    }
    w.src.line = 0;
    if (st == PDGW_OK)
        st = pdgw_cfg_finalize(cfg, &w.src);
    yaml_document_delete(&doc);
err_parser:
    yaml_parser_delete(&parser);
    return st;
}

pdgw_status_t pdgw_config_load_file(pdgw_config_t *cfg, const char *path, pdgw_config_error_t *err)
{
    pdgw_cfg_src_t src = {.err = err, .file = path};
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        pdgw_cfg_fail(&src, NULL, "cannot open config file: %s", strerror(errno));
        return PDGW_ERR_IO;
    }
    pdgw_status_t st;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        pdgw_cfg_fail(&src, NULL, "not a regular file%s", "");
        st = PDGW_ERR_IO;
        goto err_file;
    }
    if ((uint64_t)sb.st_size > MAX_CONFIG_BYTES) {
        pdgw_cfg_fail(&src, NULL, "config file larger than %u bytes", MAX_CONFIG_BYTES);
        st = PDGW_ERR_TOO_LARGE;
        goto err_file;
    }
    size_t size = (size_t)sb.st_size;
    char *text = pdgw_malloc(size + 1);
    if (text == NULL) {
        st = PDGW_ERR_NOMEM;
        goto err_file;
    }
    size_t got = fread(text, 1, size, f);
    if (got != size) {
        pdgw_cfg_fail(&src, NULL, "read error%s", "");
        st = PDGW_ERR_IO;
        goto err_text;
    }
    text[size] = '\0';
    st = pdgw_config_load_yaml(cfg, text, size, path, err);
    if (st == PDGW_OK)
        st = pdgw_cfg_str_set(&cfg->config_file, path);
err_text:
    pdgw_free(text);
err_file:
    fclose(f);
    return st;
}
