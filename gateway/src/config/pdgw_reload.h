/*
 * pdgw_reload.h - re-reading the configuration while serving (SIGHUP, POST /admin/reload).
 *
 * A reload parses the same layers as start-up (defaults < file < PDGW_* env < CLI flags,
 * with the arguments and environment of start-up), runs the same checks, including the
 * forwarder's check-only configure (the --check-config depth), then compares the new
 * config with the running one key by key, using the option table:
 *   - a changed key that a registered hook applies live is handed to that hook;
 *   - any other changed key "needs restart": it is logged as such and the running value is
 *     kept (copied into the new config, so the running config stays consistent).
 * Hooks run in two phases: every hook prepares (and may refuse), then every hook commits;
 * a refusal aborts the prepared ones and the running config stays as it was. The whole
 * reload is one transaction under one lock: two reloads never interleave.
 *
 * Subsystems join by registering a hook (pdgw_reload_register), e.g. API keys, the instance
 * set, log level, scheduling policies, admission limits. The table key "instances" stands
 * for the whole `instances:` list.
 *
 * Metrics (Prometheus, as Alertmanager names its own):
 *   pdgw_config_reloads_total{result="ok|error"}           counter
 *   pdgw_config_last_reload_successful                      gauge 0/1
 *   pdgw_config_last_reload_success_timestamp_seconds       gauge, unix time
 *   pdgw_config_hash                                        gauge, 48-bit FNV-1a of the file
 */
#ifndef PDGW_RELOAD_H
#define PDGW_RELOAD_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "pdgw_config.h"
#include "pdgw_errors.h"
#include "pdgw_metrics.h"

typedef struct pdgw_reload pdgw_reload_t;
/* One reload in progress, handed to the hooks. */
typedef struct pdgw_reload_txn pdgw_reload_txn_t;

/* The running config and the candidate (borrowed for the length of the call). */
const pdgw_config_t *pdgw_reload_txn_cur(const pdgw_reload_txn_t *txn);
const pdgw_config_t *pdgw_reload_txn_next(const pdgw_reload_txn_t *txn);
/* Did table key <key> ("instances" for the list) change in this reload? */
bool pdgw_reload_txn_changed(const pdgw_reload_txn_t *txn, const char *key);
/*
 * From a hook's prepare: this change of <key> cannot be applied live after all (<why>); the
 * running value is kept and reported as "needs restart", the rest of the reload goes on.
 */
void pdgw_reload_txn_keep(pdgw_reload_txn_t *txn, const char *key, const char *why);

/* A subsystem that applies part of the config live. The struct is copied. */
typedef struct pdgw_reload_hook {
    const char *name;        /* for logs */
    const char *const *keys; /* NULL-terminated table keys applied live */
    /*
     * Check the candidate and allocate what commit needs; nothing visible changes yet.
     * PDGW_OK with *state set (may be NULL), or an error with a message in <err> (the
     * reload is refused). NULL = nothing to prepare.
     */
    pdgw_status_t (*prepare)(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                             size_t errlen);
    /* Apply; cannot fail. Called only when every hook prepared. */
    void (*commit)(void *ctx, pdgw_reload_txn_t *txn, void *state);
    /* Release a prepared state that will not be committed. NULL = nothing to release. */
    void (*abort)(void *ctx, void *state);
    void *ctx;
} pdgw_reload_hook_t;

/*
 * Take over <cfg> (moved: the caller's struct is zeroed and must not be freed) together
 * with what is needed to parse it again: <argv> and <envp> are borrowed for the life of the
 * reloader (main's), <hooks> is copied. <reg> receives the metrics (may be NULL).
 */
pdgw_status_t pdgw_reload_create(pdgw_config_t *cfg, int argc, char **argv, char **envp,
                                 const pdgw_config_hooks_t *hooks, pdgw_metrics_t *reg,
                                 pdgw_reload_t **out);
/* Frees the running config. NULL-safe. */
void pdgw_reload_destroy(pdgw_reload_t *rl);

/* Add a hook (before or after start; hooks run in registration order). */
pdgw_status_t pdgw_reload_register(pdgw_reload_t *rl, const pdgw_reload_hook_t *hook);

/*
 * Reload now. <trigger> names the cause in the log ("SIGHUP", "POST /admin/reload").
 * Logs one line for the outcome (plus one warning per key that needs a restart) and counts
 * it. Returns a new JSON object (caller owns): {"result":"ok"|"error","message":...,
 * "applied":[keys],"needs_restart":[keys],"config_hash":"<hex>"}; NULL only on OOM.
 */
json_t *pdgw_reload_run(pdgw_reload_t *rl, const char *trigger);

/* The running config. Only for the thread that created the reloader, before any reload can
 * run (start-up); later readers use the accessors below. */
const pdgw_config_t *pdgw_reload_config(const pdgw_reload_t *rl);
/* drain_timeout of the running config (any thread). */
uint64_t pdgw_reload_drain_timeout_ms(pdgw_reload_t *rl);

/* 48-bit FNV-1a of <len> bytes (exact in a double, for the gauge). */
uint64_t pdgw_reload_hash(const void *data, size_t len);

/* ---- pdgw_reload_hooks.c: the gateway's own live keys */

struct pdgw_auth;
struct sched_pool;
struct sched_instance_desc;

/* main's mapping of a config instance to the scheduler's descriptor (strings borrowed). */
typedef void (*pdgw_reload_map_instance_fn)(const pdgw_instance_config_t *ic,
                                            struct sched_instance_desc *d);

/*
 * Register the hooks of main's subsystems, all borrowed for the reloader's life:
 *   auth       api_keys, api_key_file (the file is read again on every reload, so keys
 *              rotated in place take effect), admin_api_key
 *   tenants    `tenants:` and the tenants' key files, into the running quota layer <quota>
 *              (NULL without tenants): limits, weights, keys; a change that needs a restart
 *              keeps the running tenants and says so
 *   log        log_level, access_log
 *   instances  the `instances:` list: added ones join the pool, removed ones leave it (no
 *              new bookings; requests holding them finish), changed ones are replaced
 *   policies   prefill_policy, decode_policy (to or from prefix-aware / precise-prefix only
 *              when the pool was started with it: their indexes are built at start-up)
 * <cfg> is the start-up config (its policies decide what the pool built); <map> turns a
 * config instance into the pool's descriptor, as at start-up.
 */
struct pdq;
pdgw_status_t pdgw_reload_hooks_register(pdgw_reload_t *rl, const pdgw_config_t *cfg,
                                         struct pdgw_auth *auth, struct sched_pool *pool,
                                         struct pdq *quota, pdgw_reload_map_instance_fn map);

#endif /* PDGW_RELOAD_H */
