/*
 * fwd_pd_body.c - leg bodies and option parsing shared by the PD forwarders.
 *
 * Bodies start from the gateway's helpers (pdgw_fwd_body_prefill = the hardened prefill of
 * docs/protocols/README.md, hardened prefill leg, pdgw_fwd_body_copy) and only add or replace
 * `kv_transfer_params`.
 */
#include "fwd_pd.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

json_t *fwd_pd_kvp_remote_decode(void)
{
    return json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                     "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
}

json_t *fwd_pd_body_prefill(const pdgw_fwd_request_t *req, json_t *kvp)
{
    json_t *b = pdgw_fwd_body_prefill(req);
    if (b == NULL) {
        json_decref(kvp);
        return NULL;
    }
    if (kvp != NULL && json_object_set_new(b, "kv_transfer_params", kvp) != 0) {
        json_decref(b);
        return NULL;
    }
    return b;
}

json_t *fwd_pd_body_decode(const pdgw_fwd_request_t *req, json_t *kvp)
{
    json_t *b = pdgw_fwd_body_copy(req);
    if (b == NULL || !json_is_object(b)) {
        json_decref(b);
        json_decref(kvp);
        return NULL;
    }
    if (kvp != NULL && json_object_set_new(b, "kv_transfer_params", kvp) != 0) {
        json_decref(b);
        return NULL;
    }
    return b;
}

json_t *fwd_pd_resp_kvp(const json_t *resp)
{
    json_t *kvp = resp ? json_object_get(resp, "kv_transfer_params") : NULL;
    return json_is_object(kvp) && json_object_size(kvp) > 0 ? kvp : NULL;
}

void fwd_pd_count_missing_kv_params(const char *protocol)
{
    pdgw_fwd_prefill_missing_kv_params(protocol);
}

/* ---------------------------------------------------------------- options */

pdgw_fwd_status_t fwd_pd_opts_check(const json_t *options, const char *const *known, char *err,
                                    size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)options, key, v)
    {
        size_t i;
        int ok = 0;
        for (i = 0; known[i] != NULL; i++)
            if (strcmp(known[i], key) == 0)
                ok = 1;
        if (!ok) {
            snprintf(err, errlen, "unknown protocol option '%s'", key);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t fwd_pd_opt_int(const json_t *options, const char *key, int64_t def, int64_t min,
                                 int64_t max, int64_t *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);
    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        snprintf(err, errlen, "protocol option '%s' must be an integer in [%lld, %lld]", key,
                 (long long)min, (long long)max);
        return PDGW_FWD_ERR_CONFIG;
    }
    *out = json_integer_value(v);
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t fwd_pd_opt_bool(const json_t *options, const char *key, int def, int *out,
                                  char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);
    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "protocol option '%s' must be true or false", key);
        return PDGW_FWD_ERR_CONFIG;
    }
    *out = json_is_true(v);
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t fwd_pd_opt_enum(const json_t *options, const char *key,
                                  const char *const *choices, int def, int *out, char *err,
                                  size_t errlen)
{
    json_t *v = json_object_get(options, key);
    const char *s;
    int i;
    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    s = json_string_value(v);
    for (i = 0; s != NULL && choices[i] != NULL; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return PDGW_FWD_OK;
        }
    }
    {
        size_t n = 0;
        n += (size_t)snprintf(err, errlen, "protocol option '%s' must be one of", key);
        for (i = 0; choices[i] != NULL && n < errlen; i++)
            n += (size_t)snprintf(err + n, errlen - n, "%s %s", i ? "," : "", choices[i]);
    }
    return PDGW_FWD_ERR_CONFIG;
}

pdgw_fwd_status_t fwd_pd_opt_str(const json_t *options, const char *key, const char *def, char *out,
                                 size_t cap, char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);
    const char *s = def;
    if (v != NULL) {
        s = json_string_value(v);
        if (s == NULL || s[0] == '\0' || strlen(s) >= cap) {
            snprintf(err, errlen, "protocol option '%s' must be a non-empty string (< %zu bytes)",
                     key, cap);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    snprintf(out, cap, "%s", s);
    return PDGW_FWD_OK;
}

int64_t fwd_pd_random63(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        v = ((uint64_t)pdgw_fwd_now_ms() << 20) ^ (uint64_t)(uintptr_t)&v;
        v *= 0x9E3779B97F4A7C15ull;
    }
    return (int64_t)(v >> 1);
}

pdgw_fwd_status_t fwd_pd_kv_opts_parse(const json_t *options, int reserve_default, int proxy,
                                       fwd_pd_kv_opts_t *o, char *err, size_t errlen)
{
    static const char *const refusal[] = {"queue", "repick", NULL};
    int mode = 0;
    memset(o, 0, sizeof(*o));
    o->proxy = proxy;
    if (fwd_pd_opt_bool(options, "reserve", reserve_default, &o->reserve, err, errlen) ||
        fwd_pd_opt_int(options, "chunk_tokens", 256, 1, 1 << 20, &o->chunk_tokens, err, errlen) ||
        fwd_pd_opt_int(options, "reserve_ttl_ms", 30000, 1, 3600000, &o->reserve_ttl_ms, err,
                       errlen) ||
        fwd_pd_opt_int(options, "reserve_timeout_ms", 1000, 1, 60000, &o->reserve_timeout_ms, err,
                       errlen) ||
        fwd_pd_opt_int(options, "reserve_retry_ms", 50, 1, 60000, &o->reserve_retry_ms, err,
                       errlen) ||
        fwd_pd_opt_enum(options, "reserve_on_refusal", refusal, 0, &mode, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    o->on_refusal = (fwd_pd_refusal_t)mode;
    if (!proxy)
        return PDGW_FWD_OK;
    return fwd_pd_notif_opts_parse(options, o, err, errlen);
}
