/*
 * pdgw_admit_config.c - admission limits from the loaded configuration (start-up, reload and
 * --check-config use the same parse).
 */
#include "pdgw_admit.h"

#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

#include "pdgw_rate_limit.h"
#include "pdgw_reload.h"

pdgw_status_t pdgw_admit_reload(pdgw_admit_t *a, const pdgw_config_t *cfg, uint64_t now_ms,
                                char *err, size_t errlen)
{
    pdgw_admit_limits_t l;
    pdgw_status_t st = pdgw_admit_limits_from_config(cfg, &l, err, errlen);
    if (st != PDGW_OK)
        return st;
    st = pdgw_admit_set_limits(a, &l, now_ms);
    pdgw_admit_limits_free(&l);
    return st;
}

pdgw_status_t pdgw_admit_limits_from_config(const pdgw_config_t *cfg, pdgw_admit_limits_t *out,
                                            char *err, size_t errlen)
{
    pdgw_admit_limits_t l;
    size_t i;

    pdgw_admit_limits_init(&l);
    l.max_concurrent =
        cfg->max_concurrent_requests > 0 ? (unsigned)cfg->max_concurrent_requests : 0;
    /* With tenants their fair queue holds the slots (pdgw_quota_req.c): not twice. */
    if (cfg->tenants_json != NULL && cfg->tenants_json[0] != '\0') {
        l.max_concurrent = 0; /* admission_order: slo_deadline orders each tenant's waiters */
    }
    l.queue_size = cfg->queue_size > 0 ? (unsigned)cfg->queue_size : 0;
    l.queue_timeout_ms = cfg->queue_timeout_ms;
    l.by_slo_deadline = cfg->admission_order == 1;
    l.retry_backoff_base_ms = cfg->retry_backoff_base_ms;
    l.retry_backoff_max_ms = cfg->retry_backoff_max_ms;
    if (l.retry_backoff_max_ms < l.retry_backoff_base_ms) {
        snprintf(err, errlen, "retry_backoff_max: must not be below retry_backoff_base");
        return PDGW_ERR_INVALID;
    }
    if (cfg->rate_limit != NULL && cfg->rate_limit[0] != '\0' &&
        pdgw_rate_parse(cfg->rate_limit, &l.rate, &l.burst) != PDGW_OK) {
        snprintf(err, errlen,
                 "rate_limit: expected RPS or RPS:BURST (RPS > 0, BURST >= 1), got \"%s\"",
                 cfg->rate_limit);
        return PDGW_ERR_INVALID;
    }
    if (pdgw_affinity_parse(cfg->session_affinity, &l.affinity, l.affinity_header,
                            sizeof(l.affinity_header)) != PDGW_OK) {
        snprintf(err, errlen, "session_affinity: expected \"header:NAME\" or \"user\", got \"%s\"",
                 cfg->session_affinity);
        return PDGW_ERR_INVALID;
    }
    if (cfg->rate_limits.count > 0) {
        l.keys = pdgw_calloc(cfg->rate_limits.count, sizeof(*l.keys));
        if (l.keys == NULL) {
            snprintf(err, errlen, "rate_limits: out of memory");
            return PDGW_ERR_NOMEM;
        }
        for (i = 0; i < cfg->rate_limits.count; i++) {
            const pdgw_kv_t *kv = &cfg->rate_limits.items[i];
            pdgw_admit_key_limit_t *k = &l.keys[i];
            if (pdgw_rate_parse(kv->value, &k->rate, &k->burst) != PDGW_OK) {
                /* The key is a secret: the message names the entry, not the key. */
                snprintf(err, errlen,
                         "rate_limits: entry %zu: expected RPS or RPS:BURST (RPS > 0, BURST >= 1), "
                         "got \"%s\"",
                         i, kv->value ? kv->value : "");
                pdgw_admit_limits_free(&l);
                return PDGW_ERR_INVALID;
            }
            k->key = pdgw_strdup(kv->key);
            if (k->key == NULL) {
                pdgw_admit_limits_free(&l);
                snprintf(err, errlen, "rate_limits: out of memory");
                return PDGW_ERR_NOMEM;
            }
            l.n_keys = i + 1;
        }
    }
    *out = l;
    return PDGW_OK;
}

/* ---- reload hook: admission limits change live (SIGHUP, POST /admin/reload) ---- */

static const char *const admit_reload_keys[] = {"max_concurrent_requests",
                                                "queue_size",
                                                "queue_timeout",
                                                "rate_limit",
                                                "rate_limits",
                                                "retry_backoff_base",
                                                "retry_backoff_max",
                                                "session_affinity",
                                                "admission_order",
                                                NULL};

static pdgw_status_t admit_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                   size_t errlen)
{
    pdgw_admit_limits_t *l = pdgw_calloc(1, sizeof(*l));
    pdgw_status_t st;
    (void)ctx;
    if (l == NULL) {
        snprintf(err, errlen, "admission limits: out of memory");
        return PDGW_ERR_NOMEM;
    }
    st = pdgw_admit_limits_from_config(pdgw_reload_txn_next(txn), l, err, errlen);
    if (st != PDGW_OK) {
        pdgw_free(l);
        return st;
    }
    *state = l;
    return PDGW_OK;
}

static void admit_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    pdgw_admit_limits_t *l = state;
    (void)txn;
    /* Validated in prepare; a failure here can only be memory, and then the old limits stay. */
    (void)pdgw_admit_set_limits(ctx, l, pdgw_time_mono_ms());
    pdgw_admit_limits_free(l);
    pdgw_free(l);
}

static void admit_abort(void *ctx, void *state)
{
    (void)ctx;
    pdgw_admit_limits_free(state);
    pdgw_free(state);
}

pdgw_status_t pdgw_admit_reload_register(pdgw_admit_t *a, pdgw_reload_t *rl)
{
    pdgw_reload_hook_t hook = {.name = "admission",
                               .keys = admit_reload_keys,
                               .prepare = admit_prepare,
                               .commit = admit_commit,
                               .abort = admit_abort,
                               .ctx = a};
    return pdgw_reload_register(rl, &hook);
}
