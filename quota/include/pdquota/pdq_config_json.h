/*
 * pdq_config_json.h - the quota section of a configuration, as a jansson object.
 *
 *   {"max_concurrent": 64, "default_tenant": "free",
 *    "tenants": [{"name": "acme", "weight": 3, "priority": 0, "max_concurrent": 16,
 *                 "reserved": 4, "max_waiting": 256, "api_keys": ["k1"],
 *                 "requests_per_second": 0, "requests_per_minute": 600,
 *                 "tokens_per_minute": 100000, "prompt_tokens_per_minute": 0,
 *                 "completion_tokens_per_minute": 0,
 *                 "models": [{"model": "llama-3-8b", "tokens_per_minute": 50000}]}],
 *    "other": {"requests_per_minute": 60},
 *    "store": "redis://host:6379/0"   or   {"url": "...", "fail_mode": "open", ...}}
 *
 * Store keys: url, connect_timeout_ms, command_timeout_ms, sync_interval_ms,
 * usage_interval_ms, backoff_max_ms, lease_idle_ms, expected_replicas, lease_fraction,
 * fail_mode ("open" | "closed"), key_prefix, password (overrides the URL's), and for
 * rediss:// tls_ca_file, tls_cert_file, tls_key_file, tls_server_name. Unknown keys, wrong
 * types and out-of-range numbers are errors naming the key.
 */
#ifndef PDQ_CONFIG_JSON_H
#define PDQ_CONFIG_JSON_H

#include <jansson.h>

#include "pdquota/pdq_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdq_config_json pdq_config_json_t;

/* Parse <obj> (borrowed; a reference is kept while the result lives). <out> owns the config
 * that pdq_config_json_get returns; free it with pdq_config_json_free. */
pdq_status_t pdq_config_from_json(json_t *obj, pdq_config_json_t **out, char *err, size_t errlen);
/* Check one tenant object alone (the keys, types and ranges pdq_config_from_json checks;
 * names and keys across tenants are checked by pdq_new). <where> names it in messages. */
pdq_status_t pdq_tenant_json_check(json_t *item, const char *where, char *err, size_t errlen);
const pdq_config_t *pdq_config_json_get(const pdq_config_json_t *c);
/* The gateway's log callback goes into the parsed config before pdq_new. */
void pdq_config_json_set_log(pdq_config_json_t *c, pdq_log_fn log, void *arg);
void pdq_config_json_free(pdq_config_json_t *c);

#ifdef __cplusplus
}
#endif
#endif /* PDQ_CONFIG_JSON_H */
