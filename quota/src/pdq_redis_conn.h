/*
 * pdq_redis_conn.h - one blocking connection to Redis, plain TCP or TLS, with deadlines.
 *
 * The store's thread owns it. Commands are formatted and replies parsed by hiredis (its
 * command formatter and reply reader); the bytes move over our own socket so the same code
 * speaks TLS (GnuTLS) where Debian's hiredis has none. Every connect, handshake, write and
 * read is bounded by a deadline: a server that stops answering costs at most the timeout.
 */
#ifndef PDQ_REDIS_CONN_H
#define PDQ_REDIS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "pdquota/pdq_types.h"

typedef struct pdq_rconn pdq_rconn_t;
typedef struct pdq_rtls pdq_rtls_t; /* TLS credentials, loaded once, shared by connections */

typedef struct pdq_rtls_config {
    const char *ca_file;     /* NULL/"" = the system's trust store */
    const char *cert_file;   /* client certificate (Redis asks for one by default) */
    const char *key_file;    /* its key; both or neither */
    const char *server_name; /* name the certificate must carry; NULL/"" = the URL's host */
} pdq_rtls_config_t;

/* Load the credentials now, so a missing or unreadable file is a configuration error. */
pdq_status_t pdq_rtls_new(const pdq_rtls_config_t *cfg, pdq_rtls_t **out, char *err, size_t errlen);
void pdq_rtls_free(pdq_rtls_t *t);
/* False when this build has no TLS library. */
bool pdq_rtls_available(void);

/* Connect to host:port (tls NULL = plain), within connect_ms; commands get command_ms each.
 * NULL with the reason in <err>. */
pdq_rconn_t *pdq_rconn_open(const char *host, uint16_t port, const pdq_rtls_t *tls,
                            uint32_t connect_ms, uint32_t command_ms, char *err, size_t errlen);
/* Send one command and wait for its reply (freeReplyObject it). NULL: the connection is
 * broken (timeout, closed, garbage); pdq_rconn_error says why. */
redisReply *pdq_rconn_command(pdq_rconn_t *c, int argc, const char **argv, const size_t *lens);
const char *pdq_rconn_error(const pdq_rconn_t *c);
void pdq_rconn_close(pdq_rconn_t *c);

#endif /* PDQ_REDIS_CONN_H */
