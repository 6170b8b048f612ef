/*
 * pdgw_tenants.h - tenants from the configuration: the quota layer (libpdquota) built from
 * `tenants:`, `quota_store` and `quota.*`, and the API key set that includes every tenant's
 * keys.
 *
 * A tenant's keys are its `api_keys`, the lines of its own `api_key_file`, and the lines of
 * the global `api_key_file` that name it ("KEY TENANT"). Every one of them is also an API key
 * of the gateway (auth), so that configuring tenants with keys turns authentication on.
 * Tenants are built at start; a reload applies their limits, weights and keys to the running
 * quota layer (pdq_update_*) and keeps them whole, saying why, where only a restart can apply
 * a change (tenants added or removed, ...).
 */
#ifndef PDGW_TENANTS_H
#define PDGW_TENANTS_H

#include <stddef.h>

#include <jansson.h>

#include "pdgw_auth.h"
#include "pdgw_config.h"
#include "pdgw_errors.h"
#include "pdquota/pdquota.h"

/* Is any tenant configured? */
bool pdgw_tenants_configured(const pdgw_config_t *c);

/*
 * The tenants of <c> as the quota layer's list, every tenant's keys resolved (its files read,
 * the global key file's "KEY TENANT" lines added). *out NULL when none is configured.
 * PDGW_ERR_INVALID / PDGW_ERR_IO with a message naming the file, line or tenant.
 */
pdgw_status_t pdgw_tenants_json(const pdgw_config_t *c, json_t **out, char *err, size_t errlen);

/*
 * The quota layer of <c>, not started (pdq_start after the server is up); *out NULL when no
 * tenant is configured. A `quota_store` without tenants is an error (it would share nothing).
 */
pdgw_status_t pdgw_tenants_create(const pdgw_config_t *c, pdq_t **out, char *err, size_t errlen);

/*
 * A reload of the running quota layer <q> to <c>'s tenants, prepared (pdq_update_commit
 * applies it). *needs_restart with *out NULL and the reason in <err>: the change needs a new
 * quota layer (tenants turned off, added, removed, ...): the running tenants stay. Errors: a
 * configuration that would be refused at start, with its message.
 */
pdgw_status_t pdgw_tenants_update_prepare(const pdgw_config_t *c, pdq_t *q, pdq_update_t **out,
                                          bool *needs_restart, char *err, size_t errlen);

/* The gateway's API keys (api_keys, api_key_file, every tenant's) and the admin key. */
pdgw_status_t pdgw_auth_from_config(const pdgw_config_t *c, pdgw_auth_t **out, char *err,
                                    size_t errlen);

#endif /* PDGW_TENANTS_H */
