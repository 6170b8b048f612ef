/*
 * pdgw_tls.c - HTTPS front end material (see pdgw_tls.h).
 */
#include "pdgw_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PDGW_HAVE_GNUTLS
#include <gnutls/gnutls.h>
#endif

#include "pdgw_alloc.h"
#include "pdgw_util.h"

#define PEM_MAX (1u << 20)

struct pdgw_tls {
    char *cert;
    char *key;
    size_t key_len;
    char *ca; /* NULL = no client certificates */
    struct MHD_OptionItem opts[4];
};

static const struct MHD_OptionItem no_options[] = {{MHD_OPTION_END, 0, NULL}};

static char *read_pem(const char *what, const char *path, size_t *len, char *err, size_t errlen)
{
    char *text = pdgw_file_read_all(path, PEM_MAX, len);
    if (text == NULL) {
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    if (strstr(text, "-----BEGIN ") == NULL) {
        snprintf(err, errlen, "%s %s: not a PEM file", what, path);
        free(text);
        return NULL;
    }
    return text;
}

/* The pair must load as GnuTLS credentials (it is what the daemon will do). */
static pdgw_status_t check_pair(const pdgw_tls_t *t, size_t cert_len, const char *cert_path,
                                const char *key_path, char *err, size_t errlen)
{
#ifdef PDGW_HAVE_GNUTLS
    gnutls_certificate_credentials_t cred;
    gnutls_datum_t c = {(unsigned char *)t->cert, (unsigned)cert_len};
    gnutls_datum_t k = {(unsigned char *)t->key, (unsigned)t->key_len};
    int rc;
    if (gnutls_certificate_allocate_credentials(&cred) != GNUTLS_E_SUCCESS) {
        snprintf(err, errlen, "tls: out of memory");
        return PDGW_ERR_NOMEM;
    }
    rc = gnutls_certificate_set_x509_key_mem(cred, &c, &k, GNUTLS_X509_FMT_PEM);
    gnutls_certificate_free_credentials(cred);
    if (rc < 0) {
        snprintf(err, errlen, "tls_cert %s / tls_key %s: %s", cert_path, key_path,
                 gnutls_strerror(rc));
        return PDGW_ERR_INVALID;
    }
#else
    (void)t;
    (void)cert_len;
    (void)cert_path;
    (void)key_path;
    (void)err;
    (void)errlen;
#endif
    return PDGW_OK;
}

pdgw_status_t pdgw_tls_create(const char *cert_path, const char *key_path, const char *ca_path,
                              pdgw_tls_t **out, char *err, size_t errlen)
{
    pdgw_tls_t *t;
    size_t cert_len = 0;
    pdgw_status_t st;

    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "tls_cert: this libmicrohttpd was built without TLS");
        return PDGW_ERR_UNSUPPORTED;
    }
    t = pdgw_calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    t->cert = read_pem("tls_cert", cert_path, &cert_len, err, errlen);
    if (t->cert == NULL) {
        st = PDGW_ERR_IO;
        goto err_free;
    }
    t->key = read_pem("tls_key", key_path, &t->key_len, err, errlen);
    if (t->key == NULL) {
        st = PDGW_ERR_IO;
        goto err_free;
    }
    st = check_pair(t, cert_len, cert_path, key_path, err, errlen);
    if (st != PDGW_OK)
        goto err_free;
    if (ca_path != NULL && ca_path[0] != '\0') {
        size_t ca_len = 0;
        t->ca = read_pem("tls_ca", ca_path, &ca_len, err, errlen);
        if (t->ca == NULL) {
            st = PDGW_ERR_IO;
            goto err_free;
        }
    }
    {
        int n = 0;
        t->opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, t->cert};
        t->opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, t->key};
        if (t->ca != NULL)
            t->opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, t->ca};
        t->opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    }
    *out = t;
    return PDGW_OK;

err_free:
    pdgw_tls_destroy(t);
    return st;
}

void pdgw_tls_destroy(pdgw_tls_t *t)
{
    if (t == NULL)
        return;
    if (t->key != NULL) {
        volatile char *p = t->key;
        for (size_t i = 0; i < t->key_len; i++)
            p[i] = 0;
    }
    free(t->key);
    free(t->cert);
    free(t->ca);
    pdgw_free(t);
}

unsigned pdgw_tls_mhd_flags(const pdgw_tls_t *t)
{
    return t != NULL ? (unsigned)MHD_USE_TLS : 0u;
}

const struct MHD_OptionItem *pdgw_tls_mhd_options(const pdgw_tls_t *t)
{
    return t != NULL ? t->opts : no_options;
}

bool pdgw_tls_wants_client_cert(const pdgw_tls_t *t)
{
    return t != NULL && t->ca != NULL;
}

pdgw_status_t pdgw_tls_verify_client(void *session, char *why, size_t whylen)
{
#ifdef PDGW_HAVE_GNUTLS
    gnutls_session_t s = session;
    unsigned int status = 0;
    int rc;
    if (s == NULL || gnutls_certificate_get_peers(s, NULL) == NULL) {
        snprintf(why, whylen, "no client certificate");
        return PDGW_ERR_AUTH;
    }
    rc = gnutls_certificate_verify_peers2(s, &status);
    if (rc < 0) {
        snprintf(why, whylen, "client certificate: %s", gnutls_strerror(rc));
        return PDGW_ERR_AUTH;
    }
    if (status != 0) {
        gnutls_datum_t txt = {NULL, 0};
        if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &txt, 0) ==
                GNUTLS_E_SUCCESS &&
            txt.data != NULL)
            snprintf(why, whylen, "client certificate: %s", (const char *)txt.data);
        else
            snprintf(why, whylen, "client certificate not trusted");
        gnutls_free(txt.data);
        return PDGW_ERR_AUTH;
    }
    return PDGW_OK;
#else
    (void)session;
    snprintf(why, whylen, "built without GnuTLS: client certificates cannot be checked");
    return PDGW_ERR_AUTH;
#endif
}
