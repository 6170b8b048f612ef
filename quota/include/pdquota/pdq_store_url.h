/*
 * pdq_store_url.h - the quota store's address: redis://[user:password@]HOST:PORT/DB.
 *
 * rediss:// parses (tls = true) but pdq_new refuses it unless hiredis was built with TLS
 * (hiredis_ssl); this build says so in the error.
 */
#ifndef PDQ_STORE_URL_H
#define PDQ_STORE_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdquota/pdq_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdq_store_url {
    bool tls;
    char user[128];
    char password[256];
    char host[256]; /* a name, an IPv4 address or an IPv6 address without brackets */
    uint16_t port;  /* default 6379 */
    unsigned db;    /* default 0 */
} pdq_store_url_t;

/* Parse <url>; PDQ_ERR_INVALID with a message in <err> for anything malformed. */
pdq_status_t pdq_store_url_parse(const char *url, pdq_store_url_t *out, char *err, size_t errlen);
/* True when this build can speak TLS to the store. */
bool pdq_store_tls_supported(void);

#ifdef __cplusplus
}
#endif
#endif /* PDQ_STORE_URL_H */
