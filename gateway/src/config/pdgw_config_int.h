/*
 * pdgw_config_int.h - internals shared by the config loaders (table, YAML, env/CLI).
 */
#ifndef PDGW_CONFIG_INT_H
#define PDGW_CONFIG_INT_H

#include "pdgw_config.h"

/* Where a value comes from, for error messages. */
typedef struct pdgw_cfg_src {
    pdgw_config_error_t *err; /* may be NULL */
    const char *file;         /* YAML file name or NULL */
    int line;                 /* YAML line or 0 */
    const char *label;        /* what to name in messages instead of the key ("--retries",
                                 "PDGW_RETRIES"); NULL = the key path */
} pdgw_cfg_src_t;

pdgw_status_t pdgw_cfg_fail(pdgw_cfg_src_t *src, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Row of <tab> whose key equals <key>; NULL if none. */
const pdgw_config_option_t *pdgw_cfg_find_key(const pdgw_config_option_t *tab, size_t n,
                                              const char *key);
/* Closest of <n> candidate words to <word> (edit distance <= 3), or NULL. */
const char *pdgw_cfg_suggest(const char *word, const char *const *cands, size_t n);
/* " (did you mean 'x'?)" for <word> among the keys of <tab> that share <prefix>; "" if none. */
void pdgw_cfg_suggest_key(const pdgw_config_option_t *tab, size_t n, const char *prefix,
                          const char *word, char *out, size_t out_len);

/* Set a scalar-typed row from text; for LIST appends one item, for MAP takes "k=v". */
pdgw_status_t pdgw_cfg_opt_set_text(const pdgw_config_option_t *o, void *base, const char *text,
                                    const char *key, pdgw_cfg_src_t *src);
/* Empty a LIST / MAP / INT_LIST row. */
void pdgw_cfg_opt_clear(const pdgw_config_option_t *o, void *base);

pdgw_status_t pdgw_cfg_list_append(pdgw_str_list_t *l, const char *s);
void pdgw_cfg_list_free(pdgw_str_list_t *l);
pdgw_status_t pdgw_cfg_map_set(pdgw_kv_list_t *m, const char *k, const char *v);
void pdgw_cfg_map_free(pdgw_kv_list_t *m);
pdgw_status_t pdgw_cfg_int_list_append(pdgw_int_list_t *l, int v);

/* Instances: defaults, release, append (moves *inst into cfg), derive fields. */
pdgw_status_t pdgw_cfg_instance_init(pdgw_instance_config_t *inst);
void pdgw_cfg_instance_free(pdgw_instance_config_t *inst);
pdgw_status_t pdgw_cfg_instance_add(pdgw_config_t *cfg, pdgw_instance_config_t *inst);
pdgw_status_t pdgw_cfg_instance_finalize(pdgw_instance_config_t *inst, size_t index,
                                         pdgw_cfg_src_t *src);
/* Quick start: add an instance of <role> for <url>. */
pdgw_status_t pdgw_cfg_instance_quick(pdgw_config_t *cfg, pdgw_role_t role, const char *url,
                                      pdgw_cfg_src_t *src);

/* Derived fields of the whole config (listen host/port, discovery flags). */
pdgw_status_t pdgw_cfg_finalize(pdgw_config_t *cfg, pdgw_cfg_src_t *src);

/* The YAML `tenants:` list <v> of <doc> into cfg->tenants_json, each item checked
 * (pdgw_config_tenants.c). */
struct yaml_document_s;
struct yaml_node_s;
pdgw_status_t pdgw_cfg_walk_tenants(pdgw_config_t *cfg, struct yaml_document_s *doc,
                                    struct yaml_node_s *v, pdgw_cfg_src_t *src);

/* Replace a string field (copy of <s>). */
pdgw_status_t pdgw_cfg_str_set(char **field, const char *s);

#endif /* PDGW_CONFIG_INT_H */
