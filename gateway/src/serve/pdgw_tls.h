/*
 * pdgw_tls.h - HTTPS on the client side: the certificate and key (PEM files named by
 * tls_cert / tls_key) read once at start-up, checked with GnuTLS (the library libmicrohttpd
 * uses in Debian) so that a bad pair is a start-up error naming the file, then handed to
 * every worker's daemon as in-memory PEM (MHD_OPTION_HTTPS_MEM_CERT / _KEY).
 *
 * A plain-HTTP client on the TLS port fails its handshake and is closed; no HTTP answer is
 * sent. The files are restart-only (a reload logs "needs restart").
 *
 * Client certificates (tls_ca): the daemons get the CA as their trust list
 * (MHD_OPTION_HTTPS_MEM_TRUST), with which libmicrohttpd asks every client for a certificate
 * (GNUTLS_CERT_REQUEST) and leaves the verdict to the application
 * (libmicrohttpd src/microhttpd/daemon.c). pdgw_tls_authorize gives it: a request without a
 * certificate the CA signed gets 403, except /health and /ready (probes carry no data and
 * kubelets present no certificate).
 */
#ifndef PDGW_TLS_H
#define PDGW_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "pdgw_errors.h"

typedef struct pdgw_tls pdgw_tls_t;

/* Read and check <cert_path> and <key_path>, and <ca_path> (NULL or "" = no client
 * certificates). Error message in <err>. */
pdgw_status_t pdgw_tls_create(const char *cert_path, const char *key_path, const char *ca_path,
                              pdgw_tls_t **out, char *err, size_t errlen);
/* NULL-safe; the key's bytes are wiped. */
void pdgw_tls_destroy(pdgw_tls_t *tls);

/* MHD_USE_TLS for a TLS front end (<tls> non-NULL), else 0. */
unsigned pdgw_tls_mhd_flags(const pdgw_tls_t *tls);
/* Options for MHD_OPTION_ARRAY (ends with MHD_OPTION_END; just that for NULL <tls>). Points
 * into <tls>, which must outlive the daemons. */
const struct MHD_OptionItem *pdgw_tls_mhd_options(const pdgw_tls_t *tls);

/* Does <tls> ask clients for certificates? */
bool pdgw_tls_wants_client_cert(const pdgw_tls_t *tls);
/*
 * The client certificate of the TLS session <gnutls_session> (a gnutls_session_t) checked
 * against the CA: PDGW_OK, PDGW_ERR_AUTH when none was sent or it does not verify (reason in
 * <why>).
 */
pdgw_status_t pdgw_tls_verify_client(void *gnutls_session, char *why, size_t whylen);

#endif /* PDGW_TLS_H */
