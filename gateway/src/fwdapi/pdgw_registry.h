/*
 * pdgw_registry.h - the forwarder registry and the plugin loader.
 *
 * Forwarders register from constructors (PDGW_FORWARDER_REGISTER) before main() runs, or
 * from a plugin's constructors during pdgw_registry_load_plugin(). Registration does no I/O:
 * accepted and refused registrations are recorded and logged by pdgw_registry_log().
 */
#ifndef PDGW_REGISTRY_H
#define PDGW_REGISTRY_H

#include <stddef.h>

#include "pdgw/forwarder.h"
#include "pdgw_errors.h"

#define PDGW_REGISTRY_MAX 64

/* The forwarder registered under <name>, or NULL. */
const pdgw_fwd_desc_t *pdgw_registry_find(const char *name);

/* Up to <max> registered descriptors in registration order; returns how many exist. */
size_t pdgw_registry_list(const pdgw_fwd_desc_t **out, size_t max);

/* "a, b, c": names of every registered forwarder (for errors and --help). */
void pdgw_registry_names(char *out, size_t len);

/*
 * dlopen <path> (RTLD_NOW) and accept the forwarders it registers. Fails with a message in
 * <err> when the file cannot be loaded, when a registration is refused (ABI version
 * mismatch, duplicate name, missing build_leg) or when it registers nothing.
 * PDGW_ERR_ABI for an ABI mismatch, PDGW_ERR_EXISTS for a duplicate, PDGW_ERR_IO when
 * dlopen failed, PDGW_ERR_INVALID otherwise.
 */
pdgw_status_t pdgw_registry_load_plugin(const char *path, char *err, size_t errlen);

/* Log every registration (info) and every refusal (error) recorded so far, once each.
 * Returns the number of refusals logged. */
size_t pdgw_registry_log(void);

#endif /* PDGW_REGISTRY_H */
