/*
 * pdgw_tls.h - HTTPS on the client side: the certificate and key (PEM files named by
 * tls_cert / tls_key) read once at start-up, checked with GnuTLS (the library libmicrohttpd
 * uses in Debian) so that a bad pair is a start-up error naming the file, then handed to
 * every worker's daemon as in-memory PEM (MHD_OPTION_HTTPS_MEM_CERT / _KEY).
 *
 * A plain-HTTP client on the TLS port fails its handshake and is closed; no HTTP answer is
 * sent. The files are restart-only (a reload logs "needs restart").
 */
#ifndef PDGW_TLS_H
#define PDGW_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "pdgw_errors.h"

typedef struct pdgw_tls pdgw_tls_t;

/* Read and check <cert_path> and <key_path>. Error message in <err>. */
pdgw_status_t pdgw_tls_create(const char *cert_path, const char *key_path, pdgw_tls_t **out,
                              char *err, size_t errlen);
/* NULL-safe; the key's bytes are wiped. */
void pdgw_tls_destroy(pdgw_tls_t *tls);

/* MHD_USE_TLS for a TLS front end (<tls> non-NULL), else 0. */
unsigned pdgw_tls_mhd_flags(const pdgw_tls_t *tls);
/* Options for MHD_OPTION_ARRAY (ends with MHD_OPTION_END; just that for NULL <tls>). Points
 * into <tls>, which must outlive the daemons. */
const struct MHD_OptionItem *pdgw_tls_mhd_options(const pdgw_tls_t *tls);

#endif /* PDGW_TLS_H */
