/*
 * pdgw_tenants.c - the quota layer and the API key set from the configuration
 * (pdgw_tenants.h).
 */
#include "pdgw_tenants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"
#include "pdquota/pdq_config_json.h"

bool pdgw_tenants_configured(const pdgw_config_t *c)
{
    return c->tenants_json != NULL && c->tenants_json[0] != '\0';
}

static json_t *tenant_named(json_t *tenants, const char *name, size_t len)
{
    size_t i;
    json_t *t;
    json_array_foreach(tenants, i, t)
    {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (n != NULL && strlen(n) == len && memcmp(n, name, len) == 0)
            return t;
    }
    return NULL;
}

static pdgw_status_t add_tenant_key(json_t *tenant, const char *key, size_t len)
{
    json_t *keys = json_object_get(tenant, "api_keys");
    if (keys == NULL) {
        keys = json_array();
        if (keys == NULL || json_object_set_new(tenant, "api_keys", keys) != 0)
            return PDGW_ERR_NOMEM;
    }
    return json_array_append_new(keys, json_stringn(key, len)) == 0 ? PDGW_OK : PDGW_ERR_NOMEM;
}

typedef struct file_ctx {
    json_t *tenants;
    json_t *own; /* reading a tenant's own file: that tenant; NULL for the global file */
} file_ctx_t;

static pdgw_status_t file_line(void *arg, const char *key, size_t key_len, const char *tenant,
                               size_t tenant_len, const char *where, char *err, size_t errlen)
{
    file_ctx_t *f = arg;
    json_t *t = f->own;
    if (tenant == NULL)
        return t != NULL ? add_tenant_key(t, key, key_len) : PDGW_OK; /* a plain API key */
    if (t != NULL) {
        const char *name = json_string_value(json_object_get(t, "name"));
        if (strlen(name) != tenant_len || memcmp(name, tenant, tenant_len) != 0) {
            snprintf(err, errlen, "%s: the key names tenant '%.*s' in the file of tenant '%s'",
                     where, (int)tenant_len, tenant, name);
            return PDGW_ERR_INVALID;
        }
    } else if (f->tenants == NULL || (t = tenant_named(f->tenants, tenant, tenant_len)) == NULL) {
        snprintf(err, errlen, "%s: tenant '%.*s' is not configured (see `tenants:`)", where,
                 (int)tenant_len, tenant);
        return PDGW_ERR_INVALID;
    }
    return add_tenant_key(t, key, key_len);
}

pdgw_status_t pdgw_tenants_json(const pdgw_config_t *c, json_t **out, char *err, size_t errlen)
{
    json_t *arr = NULL, *t;
    pdgw_status_t st = PDGW_OK;
    size_t i;
    *out = NULL;
    if (pdgw_tenants_configured(c)) {
        arr = json_loads(c->tenants_json, 0, NULL);
        if (!json_is_array(arr)) {
            json_decref(arr);
            return PDGW_ERR_NOMEM; /* the config wrote it: only memory can spoil it */
        }
    }
    json_array_foreach(arr, i, t)
    {
        const char *path = json_string_value(json_object_get(t, "api_key_file"));
        if (path != NULL) {
            file_ctx_t f = {.tenants = arr, .own = t};
            st = pdgw_key_file_each(path, file_line, &f, err, errlen);
            if (st != PDGW_OK)
                break;
            json_object_del(t, "api_key_file");
        }
    }
    if (st == PDGW_OK && c->api_key_file != NULL && c->api_key_file[0] != '\0') {
        file_ctx_t f = {.tenants = arr};
        st = pdgw_key_file_each(c->api_key_file, file_line, &f, err, errlen);
    }
    if (st != PDGW_OK) {
        json_decref(arr);
        return st;
    }
    *out = arr;
    return PDGW_OK;
}

static void quota_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level > 0)
        pdgw_log_warn("quota", "%s", msg);
    else
        pdgw_log_info("quota", "%s", msg);
}

static uint32_t ms32(uint64_t ms)
{
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/* `quota_store` and `quota.*` as the library's store object. */
static json_t *store_json(const pdgw_config_t *c)
{
    json_t *s = json_pack("{s:s,s:s,s:i,s:I,s:I,s:I,s:I,s:s}", "url", c->quota_store, "fail_mode",
                          c->quota.fail_mode == PDQ_FAIL_CLOSED ? "closed" : "open",
                          "expected_replicas", c->quota.expected_replicas, "sync_interval_ms",
                          (json_int_t)ms32(c->quota.sync_interval_ms), "usage_interval_ms",
                          (json_int_t)ms32(c->quota.usage_interval_ms), "command_timeout_ms",
                          (json_int_t)ms32(c->quota.timeout_ms), "connect_timeout_ms",
                          (json_int_t)ms32(c->quota.timeout_ms), "key_prefix",
                          c->quota.key_prefix[0] ? c->quota.key_prefix : "pdq:");
    if (s != NULL && c->quota.lease_fraction[0] != '\0') {
        char *end;
        double f = strtod(c->quota.lease_fraction, &end);
        /* out of range or not a number: the library names the key */
        json_object_set_new(s, "lease_fraction",
                            *end == '\0' && f > 0 && f <= 1 ? json_real(f) : json_string("bad"));
    }
    if (s != NULL && c->quota.password[0] != '\0')
        json_object_set_new(s, "password", json_string(c->quota.password));
    const struct {
        const char *key, *value;
    } tls[] = {{"tls_ca_file", c->quota.tls_ca_file},
               {"tls_cert_file", c->quota.tls_cert_file},
               {"tls_key_file", c->quota.tls_key_file},
               {"tls_server_name", c->quota.tls_server_name}};
    for (size_t i = 0; s != NULL && i < sizeof(tls) / sizeof(tls[0]); i++)
        if (tls[i].value[0] != '\0')
            json_object_set_new(s, tls[i].key, json_string(tls[i].value));
    return s;
}

static json_t *quota_json(const pdgw_config_t *c, json_t *tenants)
{
    json_t *root = json_object(), *t;
    size_t i;
    if (root == NULL)
        return NULL;
    json_array_foreach(tenants, i, t)
    {
        /* the gateway's queue_size bounds each tenant's waiters unless it says otherwise */
        if (json_object_get(t, "max_waiting") == NULL && c->queue_size > 0)
            json_object_set_new(t, "max_waiting", json_integer(c->queue_size));
    }
    json_object_set(root, "tenants", tenants);
    if (c->models.count > 0) {
        /* usage is labelled by the served names; other names count as "other" */
        json_t *m = json_array();
        for (size_t k = 0; m != NULL && k < c->models.count && k < PDQ_MAX_MODELS; k++)
            json_array_append_new(m, json_string(c->models.items[k]));
        json_object_set_new(root, "models", m);
    }
    if (c->max_concurrent_requests > 0)
        json_object_set_new(root, "max_concurrent", json_integer(c->max_concurrent_requests));
    if (c->quota.default_tenant[0] != '\0')
        json_object_set_new(root, "default_tenant", json_string(c->quota.default_tenant));
    if (c->quota_store[0] != '\0')
        json_object_set_new(root, "store", store_json(c));
    return root;
}

/* The quota layer's configuration of <c> (tenants configured). */
static pdgw_status_t tenants_config(const pdgw_config_t *c, pdq_config_json_t **out, char *err,
                                    size_t errlen)
{
    json_t *tenants = NULL, *root;
    pdgw_status_t st;
    pdq_status_t qs;
    *out = NULL;
    st = pdgw_tenants_json(c, &tenants, err, errlen);
    if (st != PDGW_OK)
        return st;
    root = quota_json(c, tenants);
    json_decref(tenants);
    if (root == NULL)
        return PDGW_ERR_NOMEM;
    qs = pdq_config_from_json(root, out, err, errlen);
    json_decref(root);
    if (qs == PDQ_OK)
        pdq_config_json_set_log(*out, quota_log, NULL);
    return qs == PDQ_OK ? PDGW_OK : qs == PDQ_ERR_NOMEM ? PDGW_ERR_NOMEM : PDGW_ERR_INVALID;
}

pdgw_status_t pdgw_tenants_update_prepare(const pdgw_config_t *c, pdq_t *q, pdq_update_t **out,
                                          bool *needs_restart, char *err, size_t errlen)
{
    pdq_config_json_t *qc = NULL;
    pdgw_status_t st;
    pdq_status_t qs;
    *out = NULL;
    *needs_restart = false;
    if (!pdgw_tenants_configured(c)) {
        *needs_restart = true;
        snprintf(err, errlen, "turning tenants off needs a restart");
        return PDGW_OK;
    }
    st = tenants_config(c, &qc, err, errlen);
    if (st != PDGW_OK)
        return st;
    qs = pdq_update_prepare(q, pdq_config_json_get(qc), out, err, errlen);
    pdq_config_json_free(qc);
    if (qs == PDQ_ERR_STATE) {
        *needs_restart = true;
        return PDGW_OK;
    }
    return qs == PDQ_OK ? PDGW_OK : qs == PDQ_ERR_NOMEM ? PDGW_ERR_NOMEM : PDGW_ERR_INVALID;
}

pdgw_status_t pdgw_tenants_create(const pdgw_config_t *c, pdq_t **out, char *err, size_t errlen)
{
    pdq_config_json_t *qc = NULL;
    pdgw_status_t st;
    pdq_status_t qs;
    *out = NULL;
    const char *tls_set = c->quota.tls_ca_file[0]       ? "quota.tls_ca_file"
                          : c->quota.tls_cert_file[0]   ? "quota.tls_cert_file"
                          : c->quota.tls_key_file[0]    ? "quota.tls_key_file"
                          : c->quota.tls_server_name[0] ? "quota.tls_server_name"
                                                        : NULL;
    if (tls_set != NULL && c->quota_store[0] == '\0') {
        snprintf(err, errlen, "%s is set but quota_store is not: it applies to a rediss:// store",
                 tls_set);
        return PDGW_ERR_INVALID;
    }
    if (!pdgw_tenants_configured(c)) {
        if (c->kv_bytes_per_token.count > 0)
            pdgw_log_warn("quota", "kv_bytes_per_token counts the KV of tenants' requests: "
                                   "without `tenants:` it has no effect");
        if (c->quota_store[0] != '\0') {
            snprintf(err, errlen,
                     "quota_store is set but no tenants are configured: budgets "
                     "are per tenant (add `tenants:` or drop quota_store)");
            return PDGW_ERR_INVALID;
        }
        return PDGW_OK;
    }
    st = tenants_config(c, &qc, err, errlen);
    if (st != PDGW_OK)
        return st;
    qs = pdq_new(pdq_config_json_get(qc), NULL, out, err, errlen);
    pdq_config_json_free(qc);
    if (qs == PDQ_ERR_NOMEM)
        return PDGW_ERR_NOMEM;
    return qs == PDQ_OK ? PDGW_OK : PDGW_ERR_INVALID;
}

pdgw_status_t pdgw_auth_from_config(const pdgw_config_t *c, pdgw_auth_t **out, char *err,
                                    size_t errlen)
{
    json_t *tenants = NULL, *t, *k;
    const char **keys;
    size_t n = c->api_keys.count, i, j;
    char why[640];
    pdgw_status_t st = pdgw_tenants_json(c, &tenants, why, sizeof(why));
    if (st != PDGW_OK) {
        snprintf(err, errlen, "api keys: %s", why);
        return st;
    }
    json_array_foreach(tenants, i, t) n += json_array_size(json_object_get(t, "api_keys"));
    keys = pdgw_calloc(n + 1, sizeof(*keys));
    if (keys == NULL) {
        json_decref(tenants);
        return PDGW_ERR_NOMEM;
    }
    n = 0;
    for (i = 0; i < c->api_keys.count; i++)
        keys[n++] = c->api_keys.items[i];
    json_array_foreach(tenants, i, t)
    {
        json_array_foreach(json_object_get(t, "api_keys"), j, k)
        {
            if (json_is_string(k))
                keys[n++] = json_string_value(k);
        }
    }
    st = pdgw_auth_create(keys, n, c->api_key_file, why, sizeof(why), out);
    pdgw_free(keys);
    json_decref(tenants);
    if (st != PDGW_OK) {
        snprintf(err, errlen, "api keys: %s", why);
        return st;
    }
    return pdgw_auth_set_admin_key(*out, c->admin_api_key, err, errlen);
}
