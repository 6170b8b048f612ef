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
    cfg->prefix_max_blocks = 65536;
    cfg->prefix_load_slack = 4.0;
    cfg->zone_load_slack = 1.0;
    cfg->default_max_tokens = 512;
    cfg->kv_events_prefix_weight = 2.0;
    cfg->kv_events_load_weight = 1.0;
    cfg->kv_events_other_tier_weight = 0.5;
    cfg->kv_events_max_blocks = 1u << 20;
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

sched_status_t sched_config_validate(const sched_config_t *cfg, char *err, size_t err_len)
{
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
    for (size_t i = 0; i < cfg->n_instances; i++) {
        char sub[200];
        if (sched_instance_desc_validate(&cfg->instances[i], sub, sizeof(sub)) != SCHED_OK) {
            sched_set_err(err, err_len, "instances[%zu].%s", i, sub);
            return SCHED_ERR_INVALID;
        }
        for (size_t j = 0; j < i; j++) {
            const char *a = cfg->instances[i].id, *b = cfg->instances[j].id;
            const char *ua = cfg->instances[i].url, *ub = cfg->instances[j].url;
            bool same = (a && *a && b && *b) ? strcmp(a, b) == 0
                                             : (!(a && *a) && !(b && *b) && strcmp(ua, ub) == 0);
            if (same) {
                sched_set_err(err, err_len, "instances[%zu].id: duplicate of instances[%zu]", i, j);
                return SCHED_ERR_INVALID;
            }
        }
    }
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
