/* Scheduler configuration: schema defaults and validation. */
#include <string.h>

#include "sched_int.h"

void sched_config_init(sched_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->prefill_policy = SCHED_POLICY_LEAST_LOAD;
    cfg->decode_policy = SCHED_POLICY_LEAST_LOAD;
    cfg->health_interval_ms = 2000;
    cfg->health_timeout_ms = 1000;
    cfg->healthy_threshold = 1;
    cfg->unhealthy_threshold = 2;
    cfg->metrics_scrape_interval_ms = 2000;
    cfg->health_path = "/health";
    cfg->metrics_path = "/metrics";
    cfg->breaker_failures = 5;
    cfg->breaker_open_ms = 10000;
    cfg->overload_penalty_ms = 5000;
    cfg->prefix_block_tokens = 16;
    cfg->prefill_step_tokens = 2048;
    cfg->prefix_max_blocks = 65536;
    cfg->prefix_load_slack = 4.0;
    cfg->zone_load_slack = 1.0;
    cfg->default_max_tokens = 512;
    cfg->kv_events_prefix_weight = 2.0;
    cfg->kv_events_load_weight = 1.0;
    cfg->kv_events_other_tier_weight = 0.5;
    cfg->kv_events_max_blocks = 1u << 20;
    cfg->kv_events_max_message_bytes = (size_t)16 << 20;
    cfg->kv_events_silence_ms = 30000;
    cfg->autoscale_ttft_ms = 1000;
    cfg->autoscale_tpot_ms = 50;
    cfg->autoscale_tau_ms = 30000;
    cfg->autoscale_window_ms = 120000;
    cfg->dns.interval_ms = 5000;
    cfg->kubernetes.port_name = "http";
    cfg->kubernetes.token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    cfg->kubernetes.ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
}

static sched_status_t check_dns_name(const char *key, const char *v, char *err, size_t err_len)
{
    char host[256];
    int port;

    if (!v || !*v)
        return SCHED_OK;
    if (sched_split_hostport(v, host, sizeof(host), &port) != SCHED_OK) {
        sched_set_err(err, err_len, "discovery.dns.%s: expected host:port, got \"%s\"", key, v);
        return SCHED_ERR_INVALID;
    }
    return SCHED_OK;
}

/* Each static instance valid, and no two alike: the same id, or no ids and the same URL. One
 * map of ids and one of URLs (value: index + 1), so a fleet of 20,000 is one pass. */
static sched_status_t check_instances(const sched_config_t *cfg, char *err, size_t err_len)
{
    pdb_map_t ids, urls;
    sched_status_t status = SCHED_OK;

    if (pdb_map_init(&ids, cfg->n_instances) != PDB_OK)
        goto err_nomem;
    if (pdb_map_init(&urls, 0) != PDB_OK) {
        pdb_map_fini(&ids, NULL);
        goto err_nomem;
    }
    for (size_t i = 0; i < cfg->n_instances && status == SCHED_OK; i++) {
        const sched_instance_desc_t *d = &cfg->instances[i];
        bool by_id = d->id && *d->id;
        pdb_map_t *m = by_id ? &ids : &urls;
        const char *key = by_id ? d->id : d->url;
        char sub[200];
        void *first;
        if (sched_instance_desc_validate(d, sub, sizeof(sub)) != SCHED_OK) {
            sched_set_err(err, err_len, "instances[%zu].%s", i, sub);
            status = SCHED_ERR_INVALID;
        } else if ((first = pdb_map_get(m, key)) != NULL) {
            sched_set_err(err, err_len, "instances[%zu].id: duplicate of instances[%zu]", i,
                          (size_t)(uintptr_t)first - 1);
            status = SCHED_ERR_INVALID;
        } else if (pdb_map_put(m, key, (void *)(uintptr_t)(i + 1)) != PDB_OK) {
            sched_set_err(err, err_len, "out of memory");
            status = SCHED_ERR_NO_MEMORY;
        }
    }
    pdb_map_fini(&ids, NULL);
    pdb_map_fini(&urls, NULL);
    return status;

err_nomem:
    sched_set_err(err, err_len, "out of memory");
    return SCHED_ERR_NO_MEMORY;
}

sched_status_t sched_config_validate(const sched_config_t *cfg, char *err, size_t err_len)
{
    sched_status_t status;

    if ((unsigned)cfg->prefill_policy >= SCHED_POLICY_COUNT) {
        sched_set_err(err, err_len, "prefill_policy: unknown policy");
        return SCHED_ERR_INVALID;
    }
    if ((unsigned)cfg->decode_policy >= SCHED_POLICY_COUNT) {
        sched_set_err(err, err_len, "decode_policy: unknown policy");
        return SCHED_ERR_INVALID;
    }
    if (cfg->health_interval_ms && cfg->health_timeout_ms == 0) {
        sched_set_err(err, err_len, "health_timeout: must be > 0");
        return SCHED_ERR_INVALID;
    }
    if (cfg->healthy_threshold == 0) {
        sched_set_err(err, err_len, "healthy_threshold: must be >= 1");
        return SCHED_ERR_INVALID;
    }
    if (cfg->unhealthy_threshold == 0) {
        sched_set_err(err, err_len, "unhealthy_threshold: must be >= 1");
        return SCHED_ERR_INVALID;
    }
    if (cfg->breaker_failures == 0) {
        sched_set_err(err, err_len, "breaker_failures: must be >= 1");
        return SCHED_ERR_INVALID;
    }
    if (cfg->health_path && cfg->health_path[0] != '/') {
        sched_set_err(err, err_len, "health_path: must start with /");
        return SCHED_ERR_INVALID;
    }
    if (cfg->metrics_path && cfg->metrics_path[0] != '/') {
        sched_set_err(err, err_len, "metrics_path: must start with /");
        return SCHED_ERR_INVALID;
    }
    if (cfg->prefix_load_slack < 0 || cfg->zone_load_slack < 0) {
        sched_set_err(err, err_len, "prefix_load_slack/zone_load_slack: must be >= 0");
        return SCHED_ERR_INVALID;
    }
    if (cfg->n_instances && !cfg->instances) {
        sched_set_err(err, err_len, "instances: missing array");
        return SCHED_ERR_INVALID;
    }
    if (cfg->kv_events_max_message_bytes != 0 &&
        (cfg->kv_events_max_message_bytes < ((size_t)64 << 10) ||
         cfg->kv_events_max_message_bytes > ((size_t)1 << 30))) {
        sched_set_err(err, err_len, "kv_events_max_message_bytes: must be 64KiB..1GiB");
        return SCHED_ERR_INVALID;
    }
    if (cfg->kv_events_silence_ms > 3600000) {
        sched_set_err(err, err_len, "kv_events_silence: must be at most 1h");
        return SCHED_ERR_INVALID;
    }
    status = check_instances(cfg, err, err_len);
    if (status != SCHED_OK)
        return status;
    if (check_dns_name("prefill", cfg->dns.prefill, err, err_len) ||
        check_dns_name("decode", cfg->dns.decode, err, err_len) ||
        check_dns_name("both", cfg->dns.both, err, err_len))
        return SCHED_ERR_INVALID;
    if (((cfg->dns.prefill && *cfg->dns.prefill) || (cfg->dns.decode && *cfg->dns.decode) ||
         (cfg->dns.both && *cfg->dns.both)) &&
        cfg->dns.interval_ms == 0) {
        sched_set_err(err, err_len, "discovery.dns.interval: must be > 0");
        return SCHED_ERR_INVALID;
    }
    return SCHED_OK;
}
