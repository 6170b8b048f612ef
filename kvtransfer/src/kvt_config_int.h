/*
 * kvt_config_int.h -- the key table and value setters shared by the YAML,
 * JSON and key=value front ends of kvt_config.
 */
#ifndef KVT_CONFIG_INT_H
#define KVT_CONFIG_INT_H

#include "kvt/kvt_config.h"

/* One parsed value: a scalar, or a flat list of scalars. NULL scalar = null. */
typedef struct kvt_cfg_val {
    const char *scalar;
    const char *const *items;
    size_t nitems;
    int is_list;
    int line;
} kvt_cfg_val_t;

/* Apply <v> to key <key> of <cfg>. KVT_ERR_CONFIG with <err> filled. */
kvt_status_t kvt_config_apply(kvt_config_t *cfg, const char *key, const kvt_cfg_val_t *v,
                              kvt_config_err_t *err);

/* Fill <err> (may be NULL) and return KVT_ERR_CONFIG. */
kvt_status_t kvt_config_fail(kvt_config_err_t *err, const char *key, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* KVT_CONFIG_INT_H */
