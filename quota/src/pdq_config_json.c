/*
 * pdq_config_json.c - pdq_config_t from a jansson object (see pdq_config_json.h).
 *
 * Each object's keys are declared in one table beside the code that reads them: the table
 * is the only list of what is accepted, and a key not in it is an error.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdquota/pdq_config_json.h"

struct pdq_config_json {
    pdq_config_t cfg;
    json_t *root;
    pdq_tenant_config_t *tenants;
    pdq_tenant_config_t other;
    /* per tenant (and "other" last): models and key arrays */
    pdq_model_budget_t **models;
    const char ***keys;
    size_t n_slots;
    const char **model_labels;
};

typedef enum { OPT_U64, OPT_U32, OPT_DOUBLE, OPT_STR, OPT_SPECIAL } opt_type_t;

typedef struct opt {
    const char *name;
    opt_type_t type;
    size_t off;
    double max;
} opt_t;

#define BUDGET_OPTS(base)                                                                          \
    {"requests_per_second", OPT_U64, base + offsetof(pdq_budget_t, rps), 1e12},                    \
        {"requests_per_minute", OPT_U64, base + offsetof(pdq_budget_t, rpm), 1e12},                \
        {"tokens_per_minute", OPT_U64, base + offsetof(pdq_budget_t, tpm), 1e15},                  \
        {"prompt_tokens_per_minute", OPT_U64, base + offsetof(pdq_budget_t, prompt_tpm), 1e15},    \
    {                                                                                              \
        "completion_tokens_per_minute", OPT_U64, base + offsetof(pdq_budget_t, completion_tpm),    \
            1e15                                                                                   \
    }

static const opt_t tenant_opts[] = {
    {"name", OPT_STR, offsetof(pdq_tenant_config_t, name), 0},
    {"weight", OPT_DOUBLE, offsetof(pdq_tenant_config_t, weight), 1e6},
    {"priority", OPT_U32, offsetof(pdq_tenant_config_t, priority), PDQ_MAX_PRIORITY},
    {"max_concurrent", OPT_U32, offsetof(pdq_tenant_config_t, max_concurrent), 1e7},
    {"reserved", OPT_U32, offsetof(pdq_tenant_config_t, reserved), 1e7},
    {"max_waiting", OPT_U32, offsetof(pdq_tenant_config_t, max_waiting), 1e7},
    {"api_keys", OPT_SPECIAL, 0, 0},
    {"models", OPT_SPECIAL, 0, 0},
    BUDGET_OPTS(offsetof(pdq_tenant_config_t, budget)),
    {NULL, 0, 0, 0},
};

static const opt_t model_opts[] = {
    {"model", OPT_STR, offsetof(pdq_model_budget_t, model), 0},
    BUDGET_OPTS(offsetof(pdq_model_budget_t, budget)),
    {NULL, 0, 0, 0},
};

static const opt_t store_opts[] = {
    {"url", OPT_STR, offsetof(pdq_store_config_t, url), 0},
    {"connect_timeout_ms", OPT_U32, offsetof(pdq_store_config_t, connect_timeout_ms), 60000},
    {"command_timeout_ms", OPT_U32, offsetof(pdq_store_config_t, command_timeout_ms), 60000},
    {"sync_interval_ms", OPT_U32, offsetof(pdq_store_config_t, sync_interval_ms), 60000},
    {"usage_interval_ms", OPT_U32, offsetof(pdq_store_config_t, usage_interval_ms), 3600000},
    {"backoff_max_ms", OPT_U32, offsetof(pdq_store_config_t, backoff_max_ms), 3600000},
    {"lease_idle_ms", OPT_U32, offsetof(pdq_store_config_t, lease_idle_ms), 3600000},
    {"expected_replicas", OPT_U32, offsetof(pdq_store_config_t, expected_replicas), 10000},
    {"lease_fraction", OPT_DOUBLE, offsetof(pdq_store_config_t, lease_fraction), 1},
    {"key_prefix", OPT_STR, offsetof(pdq_store_config_t, key_prefix), 0},
    {"password", OPT_STR, offsetof(pdq_store_config_t, password), 0},
    {"tls_ca_file", OPT_STR, offsetof(pdq_store_config_t, tls_ca_file), 0},
    {"tls_cert_file", OPT_STR, offsetof(pdq_store_config_t, tls_cert_file), 0},
    {"tls_key_file", OPT_STR, offsetof(pdq_store_config_t, tls_key_file), 0},
    {"tls_server_name", OPT_STR, offsetof(pdq_store_config_t, tls_server_name), 0},
    {"fail_mode", OPT_SPECIAL, 0, 0},
    {NULL, 0, 0, 0},
};

static const opt_t top_opts[] = {
    {"max_concurrent", OPT_U32, offsetof(pdq_config_t, max_concurrent), 1e7},
    {"default_tenant", OPT_STR, offsetof(pdq_config_t, default_tenant), 0},
    {"tenants", OPT_SPECIAL, 0, 0},
    {"models", OPT_SPECIAL, 0, 0},
    {"other", OPT_SPECIAL, 0, 0},
    {"store", OPT_SPECIAL, 0, 0},
    {NULL, 0, 0, 0},
};

static pdq_status_t bad(char *err, size_t errlen, const char *where, const char *key,
                        const char *why)
{
    if (err && errlen)
        snprintf(err, errlen, "quota: %s%s%s: %s", where, key ? "." : "", key ? key : "", why);
    return PDQ_ERR_INVALID;
}

/* Set the plain options of <o> into <dst>; special keys are left to the caller. */
static pdq_status_t read_opts(json_t *o, const opt_t *opts, void *dst, const char *where, char *err,
                              size_t errlen)
{
    if (!json_is_object(o))
        return bad(err, errlen, where, NULL, "must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        const opt_t *op = opts;
        while (op->name && strcmp(op->name, key) != 0)
            op++;
        if (op->name == NULL)
            return bad(err, errlen, where, key, "unknown key");
        char *p = (char *)dst + op->off;
        switch (op->type) {
        case OPT_U64:
        case OPT_U32: {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                (double)json_integer_value(v) > op->max)
                return bad(err, errlen, where, key, "must be a whole number in range");
            if (op->type == OPT_U64)
                *(uint64_t *)(void *)p = (uint64_t)json_integer_value(v);
            else
                *(uint32_t *)(void *)p = (uint32_t)json_integer_value(v);
            break;
        }
        case OPT_DOUBLE: {
            double d = json_number_value(v);
            if (!json_is_number(v) || !isfinite(d) || d < 0 || d > op->max)
                return bad(err, errlen, where, key, "must be a number in range");
            *(double *)(void *)p = d;
            break;
        }
        case OPT_STR:
            if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 1024)
                return bad(err, errlen, where, key, "must be a non-empty string");
            *(const char **)(void *)p = json_string_value(v);
            break;
        case OPT_SPECIAL:
            break;
        }
    }
    return PDQ_OK;
}

static pdq_status_t read_tenant(pdq_config_json_t *c, size_t slot, json_t *o,
                                pdq_tenant_config_t *tc, const char *where, char *err,
                                size_t errlen)
{
    pdq_status_t st = read_opts(o, tenant_opts, tc, where, err, errlen);
    if (st != PDQ_OK)
        return st;
    json_t *keys = json_object_get(o, "api_keys");
    if (keys) {
        if (!json_is_array(keys))
            return bad(err, errlen, where, "api_keys", "must be a list of strings");
        c->keys[slot] = pdb_calloc(json_array_size(keys) + 1, sizeof(char *));
        if (c->keys[slot] == NULL)
            return PDQ_ERR_NOMEM;
        for (size_t i = 0; i < json_array_size(keys); i++) {
            json_t *k = json_array_get(keys, i);
            if (!json_is_string(k))
                return bad(err, errlen, where, "api_keys", "must be a list of strings");
            c->keys[slot][i] = json_string_value(k);
        }
        tc->api_keys = c->keys[slot];
        tc->n_api_keys = json_array_size(keys);
    }
    json_t *models = json_object_get(o, "models");
    if (models) {
        if (!json_is_array(models) || json_array_size(models) > PDQ_MAX_MODELS)
            return bad(err, errlen, where, "models", "must be a list of at most 256 objects");
        c->models[slot] = pdb_calloc(json_array_size(models) + 1, sizeof(pdq_model_budget_t));
        if (c->models[slot] == NULL)
            return PDQ_ERR_NOMEM;
        for (size_t i = 0; i < json_array_size(models); i++) {
            char w[96];
            snprintf(w, sizeof(w), "%s.models[%zu]", where, i);
            st = read_opts(json_array_get(models, i), model_opts, &c->models[slot][i], w, err,
                           errlen);
            if (st != PDQ_OK)
                return st;
            if (c->models[slot][i].model == NULL)
                return bad(err, errlen, w, "model", "is required");
        }
        tc->models = c->models[slot];
        tc->n_models = json_array_size(models);
    }
    return PDQ_OK;
}

static pdq_status_t read_store(json_t *v, pdq_store_config_t *sc, char *err, size_t errlen)
{
    if (json_is_string(v)) {
        sc->url = json_string_value(v);
        return PDQ_OK;
    }
    pdq_status_t st = read_opts(v, store_opts, sc, "store", err, errlen);
    if (st != PDQ_OK)
        return st;
    json_t *fm = json_object_get(v, "fail_mode");
    if (fm) {
        const char *s = json_string_value(fm);
        if (s && strcmp(s, "open") == 0)
            sc->fail_mode = PDQ_FAIL_OPEN;
        else if (s && strcmp(s, "closed") == 0)
            sc->fail_mode = PDQ_FAIL_CLOSED;
        else
            return bad(err, errlen, "store", "fail_mode", "must be \"open\" or \"closed\"");
    }
    if (sc->url == NULL)
        return bad(err, errlen, "store", "url", "is required");
    return PDQ_OK;
}

pdq_status_t pdq_config_from_json(json_t *obj, pdq_config_json_t **out, char *err, size_t errlen)
{
    if (out == NULL)
        return PDQ_ERR_INVALID;
    pdq_config_json_t *c = pdb_calloc(1, sizeof(*c));
    if (c == NULL)
        return PDQ_ERR_NOMEM;
    c->root = json_incref(obj);
    pdq_status_t st = read_opts(obj, top_opts, &c->cfg, "quota", err, errlen);
    if (st != PDQ_OK)
        goto err_free;
    json_t *tenants = json_object_get(obj, "tenants");
    if (!json_is_array(tenants) || json_array_size(tenants) == 0 ||
        json_array_size(tenants) > PDQ_MAX_TENANTS) {
        st = bad(err, errlen, "quota", "tenants", "must be a list of 1-1024 tenants");
        goto err_free;
    }
    size_t n = json_array_size(tenants);
    c->n_slots = n + 1;
    c->tenants = pdb_calloc(n, sizeof(*c->tenants));
    c->models = pdb_calloc(c->n_slots, sizeof(*c->models));
    c->keys = pdb_calloc(c->n_slots, sizeof(*c->keys));
    if (c->tenants == NULL || c->models == NULL || c->keys == NULL) {
        st = PDQ_ERR_NOMEM;
        goto err_free;
    }
    for (size_t i = 0; i < n; i++) {
        char w[64];
        snprintf(w, sizeof(w), "tenants[%zu]", i);
        st = read_tenant(c, i, json_array_get(tenants, i), &c->tenants[i], w, err, errlen);
        if (st != PDQ_OK)
            goto err_free;
        if (c->tenants[i].name == NULL) {
            st = bad(err, errlen, w, "name", "is required");
            goto err_free;
        }
    }
    c->cfg.tenants = c->tenants;
    c->cfg.n_tenants = n;
    json_t *other = json_object_get(obj, "other");
    if (other) {
        st = read_tenant(c, n, other, &c->other, "other", err, errlen);
        if (st != PDQ_OK)
            goto err_free;
        if (c->other.name || c->other.n_api_keys) {
            st = bad(err, errlen, "other", NULL, "takes no name or api_keys");
            goto err_free;
        }
        c->cfg.other = &c->other;
    }
    json_t *labels = json_object_get(obj, "models");
    if (labels) {
        if (!json_is_array(labels) || json_array_size(labels) > PDQ_MAX_MODELS) {
            st = bad(err, errlen, "quota", "models", "must be a list of at most 256 names");
            goto err_free;
        }
        c->model_labels = pdb_calloc(json_array_size(labels) + 1, sizeof(char *));
        if (c->model_labels == NULL) {
            st = PDQ_ERR_NOMEM;
            goto err_free;
        }
        for (size_t i = 0; i < json_array_size(labels); i++) {
            c->model_labels[i] = json_string_value(json_array_get(labels, i));
            if (c->model_labels[i] == NULL) {
                st = bad(err, errlen, "quota", "models", "must be a list of names");
                goto err_free;
            }
        }
        c->cfg.models = c->model_labels;
        c->cfg.n_models = json_array_size(labels);
    }
    json_t *store = json_object_get(obj, "store");
    if (store && (st = read_store(store, &c->cfg.store, err, errlen)) != PDQ_OK)
        goto err_free;
    *out = c;
    return PDQ_OK;
err_free:
    pdq_config_json_free(c);
    return st;
}

pdq_status_t pdq_tenant_json_check(json_t *item, const char *where, char *err, size_t errlen)
{
    pdq_config_json_t c = {.n_slots = 1};
    pdq_model_budget_t *models = NULL;
    const char **keys = NULL;
    pdq_tenant_config_t tc = {0};
    c.models = &models;
    c.keys = &keys;
    pdq_status_t st = read_tenant(&c, 0, item, &tc, where, err, errlen);
    if (st == PDQ_OK && tc.name == NULL)
        st = bad(err, errlen, where, "name", "is required");
    pdb_free(models);
    pdb_free((void *)keys);
    return st;
}

const pdq_config_t *pdq_config_json_get(const pdq_config_json_t *c)
{
    return &c->cfg;
}

void pdq_config_json_set_log(pdq_config_json_t *c, pdq_log_fn log, void *arg)
{
    c->cfg.log = log;
    c->cfg.log_arg = arg;
}

void pdq_config_json_free(pdq_config_json_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_slots; i++) {
        if (c->models)
            pdb_free(c->models[i]);
        if (c->keys)
            pdb_free((void *)c->keys[i]);
    }
    pdb_free(c->models);
    pdb_free(c->keys);
    pdb_free((void *)c->model_labels);
    pdb_free(c->tenants);
    json_decref(c->root);
    pdb_free(c);
}
