/*
 * pdgw_config_tenants.c - the YAML `tenants:` list: kept as JSON text for the quota layer
 * (libpdquota reads it), each item checked here so that a mistake is reported with its file
 * and line like every other key.
 *
 * YAML scalars become JSON by the YAML 1.2 core schema: plain true/false are booleans, plain
 * integers and decimals numbers, plain null/~ and empty values null, everything else (and
 * every quoted scalar) a string. `api_key_file` is the gateway's own key (its file is read
 * when the tenants are built); the rest is the library's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <yaml.h>

#include "pdgw_config_int.h"
#include "pdquota/pdq_config_json.h"

#define TENANTS_MAX_DEPTH 8

static bool plain(const yaml_node_t *n)
{
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static json_t *scalar_json(const yaml_node_t *n)
{
    const char *v = (const char *)n->data.scalar.value;
    char *end;
    if (plain(n)) {
        if (v[0] == '\0' || strcmp(v, "~") == 0 || strcmp(v, "null") == 0)
            return json_null();
        if (strcmp(v, "true") == 0)
            return json_true();
        if (strcmp(v, "false") == 0)
            return json_false();
        errno = 0;
        long long i = strtoll(v, &end, 10);
        if (end != v && *end == '\0' && errno == 0)
            return json_integer(i);
        double d = strtod(v, &end);
        if (end != v && *end == '\0' && errno == 0 && strspn(v, "+-0123456789.eE") == strlen(v))
            return json_real(d);
    }
    return json_stringn(v, n->data.scalar.length);
}

/* <n> as JSON; NULL on a node too deep, a non-scalar key or no memory. */
static json_t *node_json(yaml_document_t *doc, yaml_node_t *n, int depth)
{
    if (n == NULL || depth > TENANTS_MAX_DEPTH)
        return NULL;
    if (n->type == YAML_SCALAR_NODE)
        return scalar_json(n);
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             a != NULL && it < n->data.sequence.items.top; it++) {
            json_t *v = node_json(doc, yaml_document_get_node(doc, *it), depth + 1);
            if (v == NULL || json_array_append_new(a, v) != 0) {
                json_decref(a);
                a = NULL;
            }
        }
        return a;
    }
    json_t *o = json_object();
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
         o != NULL && p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        json_t *v;
        if (kn == NULL || kn->type != YAML_SCALAR_NODE ||
            json_object_get(o, (const char *)kn->data.scalar.value) != NULL ||
            (v = node_json(doc, yaml_document_get_node(doc, p->value), depth + 1)) == NULL) {
            json_decref(o);
            return NULL;
        }
        if (json_object_set_new(o, (const char *)kn->data.scalar.value, v) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

/* One item: the gateway's key checked and set aside, the rest checked by the library. */
static pdgw_status_t check_item(json_t *item, size_t index, int line, pdgw_cfg_src_t *src)
{
    char where[48], why[512];
    snprintf(where, sizeof(where), "tenants[%zu]", index);
    src->line = line;
    if (!json_is_object(item))
        return pdgw_cfg_fail(src, where, "expected a mapping (name, api_keys, budgets, ...)%s", "");
    json_t *file = json_object_get(item, "api_key_file");
    if (file != NULL && (!json_is_string(file) || json_string_length(file) == 0))
        return pdgw_cfg_fail(src, where, "api_key_file: expected a file name%s", "");
    json_t *lib = json_copy(item);
    if (lib == NULL)
        return PDGW_ERR_NOMEM;
    json_object_del(lib, "api_key_file");
    pdq_status_t st = pdq_tenant_json_check(lib, where, why, sizeof(why));
    json_decref(lib);
    if (st == PDQ_ERR_NOMEM)
        return PDGW_ERR_NOMEM;
    if (st != PDQ_OK) {
        /* the library's message names the item and the key ("quota: tenants[1].weight: ..") */
        const char *msg = strncmp(why, "quota: ", 7) == 0 ? why + 7 : why;
        return pdgw_cfg_fail(src, NULL, "%s", msg);
    }
    return PDGW_OK;
}

pdgw_status_t pdgw_cfg_walk_tenants(pdgw_config_t *cfg, yaml_document_t *doc, yaml_node_t *v,
                                    pdgw_cfg_src_t *src)
{
    src->line = (int)v->start_mark.line + 1;
    if (v->type == YAML_SCALAR_NODE && plain(v) &&
        (v->data.scalar.length == 0 || strcmp((const char *)v->data.scalar.value, "~") == 0 ||
         strcmp((const char *)v->data.scalar.value, "null") == 0))
        return pdgw_cfg_str_set(&cfg->tenants_json, "");
    if (v->type != YAML_SEQUENCE_NODE)
        return pdgw_cfg_fail(src, "tenants", "expected a list of tenants%s", "");
    json_t *arr = node_json(doc, v, 0);
    if (arr == NULL)
        return pdgw_cfg_fail(src, "tenants",
                             "cannot be read (nested deeper than %d, or a key given twice)",
                             TENANTS_MAX_DEPTH);
    pdgw_status_t st = PDGW_OK;
    size_t i = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start;
         st == PDGW_OK && it < v->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = yaml_document_get_node(doc, *it);
        st = check_item(json_array_get(arr, i), i, (int)item->start_mark.line + 1, src);
    }
    if (st == PDGW_OK && json_array_size(arr) == 0)
        st = pdgw_cfg_str_set(&cfg->tenants_json, "");
    else if (st == PDGW_OK) {
        char *text = json_dumps(arr, JSON_COMPACT);
        st = text != NULL ? pdgw_cfg_str_set(&cfg->tenants_json, text) : PDGW_ERR_NOMEM;
        free(text);
    }
    json_decref(arr);
    return st;
}
