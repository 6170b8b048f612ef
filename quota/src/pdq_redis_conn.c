/*
 * pdq_redis_conn.c - a deadline-bounded connection to Redis over TCP or TLS.
 *
 * The socket is non-blocking and every wait is a poll() on what remains of the current
 * deadline, so connect, handshake and each command end by their timeout whatever the peer
 * does. Bytes read go into hiredis's reply reader; a reader error (the peer sent something
 * that is not RESP) breaks the connection like a timeout does.
 *
 * TLS (GnuTLS): the server's certificate is verified against the CA file (or the system's
 * trust store) and the expected name (an IP literal is matched against the certificate's IP
 * addresses); SNI is sent for names, never for IP literals.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#ifdef PDQ_HAVE_GNUTLS
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#endif

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_clock.h"
#include "pdq_redis_conn.h"

struct pdq_rtls {
#ifdef PDQ_HAVE_GNUTLS
    gnutls_certificate_credentials_t cred;
#endif
    char server_name[256];
};

struct pdq_rconn {
    int fd;
    uint32_t command_ms;
    redisReader *reader;
#ifdef PDQ_HAVE_GNUTLS
    gnutls_session_t tls;
    bool tls_ready; /* handshake done: a close may say goodbye */
#endif
    char error[256];
};

bool pdq_rtls_available(void)
{
#ifdef PDQ_HAVE_GNUTLS
    return true;
#else
    return false;
#endif
}

static bool set_str(const char *s)
{
    return s != NULL && s[0] != '\0';
}

pdq_status_t pdq_rtls_new(const pdq_rtls_config_t *cfg, pdq_rtls_t **out, char *err, size_t errlen)
{
#ifdef PDQ_HAVE_GNUTLS
    if (set_str(cfg->cert_file) != set_str(cfg->key_file)) {
        snprintf(err, errlen, "quota_store: tls_cert_file and tls_key_file go together");
        return PDQ_ERR_INVALID;
    }
    pdq_rtls_t *t = pdb_calloc(1, sizeof(*t));
    if (t == NULL)
        return PDQ_ERR_NOMEM;
    if (set_str(cfg->server_name))
        snprintf(t->server_name, sizeof(t->server_name), "%s", cfg->server_name);
    if (gnutls_certificate_allocate_credentials(&t->cred) != GNUTLS_E_SUCCESS) {
        pdb_free(t);
        return PDQ_ERR_NOMEM;
    }
    int rc = set_str(cfg->ca_file) ? gnutls_certificate_set_x509_trust_file(t->cred, cfg->ca_file,
                                                                            GNUTLS_X509_FMT_PEM)
                                   : gnutls_certificate_set_x509_system_trust(t->cred);
    if (rc <= 0) {
        /* the count of CAs loaded; none is as useless as an error */
        snprintf(err, errlen, "quota_store: %s: %s",
                 set_str(cfg->ca_file) ? cfg->ca_file : "the system's trust store",
                 rc < 0 ? gnutls_strerror(rc) : "no CA certificate in it");
        pdq_rtls_free(t);
        return PDQ_ERR_INVALID;
    }
    if (set_str(cfg->cert_file)) {
        rc = gnutls_certificate_set_x509_key_file(t->cred, cfg->cert_file, cfg->key_file,
                                                  GNUTLS_X509_FMT_PEM);
        if (rc < 0) {
            snprintf(err, errlen, "quota_store: client certificate %s / key %s: %s", cfg->cert_file,
                     cfg->key_file, gnutls_strerror(rc));
            pdq_rtls_free(t);
            return PDQ_ERR_INVALID;
        }
    }
    *out = t;
    return PDQ_OK;
#else
    (void)cfg;
    (void)out;
    snprintf(err, errlen, "quota_store: rediss:// needs GnuTLS, which this build lacks");
    return PDQ_ERR_UNSUPPORTED;
#endif
}

void pdq_rtls_free(pdq_rtls_t *t)
{
    if (t == NULL)
        return;
#ifdef PDQ_HAVE_GNUTLS
    gnutls_certificate_free_credentials(t->cred);
#endif
    pdb_free(t);
}

static uint64_t now_ms(void)
{
    return pdb_clock_mono_ns() / PDB_NSEC_PER_MSEC;
}

/* Wait until <fd> is ready for <events> or <deadline> passes; false on timeout or error. */
static bool wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return false;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(deadline - now));
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
}

static int connect_one(const struct addrinfo *ai, uint64_t deadline, char *why, size_t whylen)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        snprintf(why, whylen, "connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!wait_fd(fd, POLLOUT, deadline)) {
        snprintf(why, whylen, "connect: timed out");
        close(fd);
        return -1;
    }
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
        snprintf(why, whylen, "connect: %s", strerror(soerr ? soerr : errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int tcp_connect(const char *host, uint16_t port, uint64_t deadline, char *why, size_t whylen)
{
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(why, whylen, "resolving %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (const struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next)
        fd = connect_one(ai, deadline, why, whylen);
    freeaddrinfo(res);
    return fd;
}

static bool broken(pdq_rconn_t *c, const char *what, const char *detail)
{
    snprintf(c->error, sizeof(c->error), "%s: %s", what, detail);
    return false;
}

#ifdef PDQ_HAVE_GNUTLS
/* A TLS error, with the alert the server sent (TLS 1.3 servers refuse a missing client
 * certificate only after the handshake, as an alert on the first read). */
static bool tls_broken(pdq_rconn_t *c, const char *what, int rc)
{
    if (rc == GNUTLS_E_FATAL_ALERT_RECEIVED || rc == GNUTLS_E_WARNING_ALERT_RECEIVED) {
        const char *alert = gnutls_alert_get_name(gnutls_alert_get(c->tls));
        snprintf(c->error, sizeof(c->error), "%s: TLS alert from the server: %s", what,
                 alert ? alert : "unknown");
        return false;
    }
    return broken(c, what, gnutls_strerror(rc));
}
#endif

#ifdef PDQ_HAVE_GNUTLS
/* A write that failed: a server that refused us after the handshake (TLS 1.3: a missing client
 * certificate) sent its alert and hung up, and our write met the reset. The alert is likely
 * still in the socket: read it (briefly) so the log says why rather than "push error". */
static bool tls_write_broken(pdq_rconn_t *c, int rc, uint64_t deadline)
{
    uint64_t until = now_ms() + 200;
    char buf[512];
    if (until > deadline)
        until = deadline;
    while (now_ms() < until) {
        ssize_t n = gnutls_record_recv(c->tls, buf, sizeof(buf));
        if (n == GNUTLS_E_FATAL_ALERT_RECEIVED || n == GNUTLS_E_WARNING_ALERT_RECEIVED)
            return tls_broken(c, "write", (int)n);
        if (n > 0)
            continue; /* a reply to an earlier command: the alert may follow */
        if ((n != GNUTLS_E_AGAIN && n != GNUTLS_E_INTERRUPTED) || !wait_fd(c->fd, POLLIN, until))
            break;
    }
    return tls_broken(c, "write", rc);
}

/* Our own push and pull so a peer that went away is EPIPE, never SIGPIPE. */
static ssize_t tls_push(gnutls_transport_ptr_t p, const void *buf, size_t n)
{
    return send((int)(intptr_t)p, buf, n, MSG_NOSIGNAL);
}

static ssize_t tls_pull(gnutls_transport_ptr_t p, void *buf, size_t n)
{
    return recv((int)(intptr_t)p, buf, n, 0);
}

static bool is_ip_literal(const char *host)
{
    unsigned char a[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

static bool tls_start(pdq_rconn_t *c, const pdq_rtls_t *t, const char *host, uint64_t deadline)
{
    const char *name = t->server_name[0] ? t->server_name : host;
    if (gnutls_init(&c->tls, GNUTLS_CLIENT | GNUTLS_NONBLOCK) != GNUTLS_E_SUCCESS) {
        c->tls = NULL;
        snprintf(c->error, sizeof(c->error), "TLS: out of memory");
        return false;
    }
    int rc = gnutls_set_default_priority(c->tls);
    if (rc == GNUTLS_E_SUCCESS)
        rc = gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, t->cred);
    if (rc == GNUTLS_E_SUCCESS && !is_ip_literal(name))
        rc = gnutls_server_name_set(c->tls, GNUTLS_NAME_DNS, name, strlen(name));
    if (rc != GNUTLS_E_SUCCESS) {
        snprintf(c->error, sizeof(c->error), "TLS: %s", gnutls_strerror(rc));
        return false;
    }
    gnutls_session_set_verify_cert(c->tls, name, 0);
    gnutls_transport_set_ptr(c->tls, (gnutls_transport_ptr_t)(intptr_t)c->fd);
    gnutls_transport_set_push_function(c->tls, tls_push);
    gnutls_transport_set_pull_function(c->tls, tls_pull);
    for (;;) {
        rc = gnutls_handshake(c->tls);
        if (rc == GNUTLS_E_SUCCESS) {
            c->tls_ready = true;
            return true;
        }
        if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
            short ev = gnutls_record_get_direction(c->tls) ? POLLOUT : POLLIN;
            if (!wait_fd(c->fd, ev, deadline)) {
                snprintf(c->error, sizeof(c->error), "TLS handshake: timed out");
                return false;
            }
            continue;
        }
        if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
            gnutls_datum_t out = {0};
            unsigned status = gnutls_session_get_verify_cert_status(c->tls);
            gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0);
            size_t n = out.data ? strlen((const char *)out.data) : 0;
            while (n > 0 && out.data[n - 1] == ' ')
                out.data[--n] = '\0'; /* the printed status ends in a blank */
            snprintf(c->error, sizeof(c->error), "TLS: the server's certificate for %.64s: %s", name,
                     n ? (const char *)out.data : "not trusted");
            gnutls_free(out.data);
            return false;
        }
        if (gnutls_error_is_fatal(rc))
            return tls_broken(c, "TLS handshake", rc);
    }
}
#endif

pdq_rconn_t *pdq_rconn_open(const char *host, uint16_t port, const pdq_rtls_t *tls,
                            uint32_t connect_ms, uint32_t command_ms, char *err, size_t errlen)
{
    pdq_rconn_t *c = pdb_calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->command_ms = command_ms;
    c->reader = redisReaderCreate();
    uint64_t deadline = now_ms() + connect_ms;
    c->fd = c->reader ? tcp_connect(host, port, deadline, c->error, sizeof(c->error)) : -1;
    if (c->reader == NULL)
        snprintf(c->error, sizeof(c->error), "out of memory");
    bool ok = c->fd >= 0;
#ifdef PDQ_HAVE_GNUTLS
    if (ok && tls != NULL)
        ok = tls_start(c, tls, host, deadline);
#else
    (void)tls;
#endif
    if (!ok) {
        snprintf(err, errlen, "%s", c->error);
        pdq_rconn_close(c);
        return NULL;
    }
    return c;
}

/* Write all of <buf> before <deadline>. */
static bool write_all(pdq_rconn_t *c, const char *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n;
        short ev = POLLOUT;
#ifdef PDQ_HAVE_GNUTLS
        if (c->tls) {
            n = gnutls_record_send(c->tls, buf + off, len - off);
            if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
                ev = gnutls_record_get_direction(c->tls) ? POLLOUT : POLLIN;
                n = -1;
                errno = EAGAIN;
            } else if (n < 0) {
                return tls_write_broken(c, (int)n, deadline);
            }
        } else
#endif
            n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n >= 0) {
            off += (size_t)n;
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return broken(c, "write", strerror(errno));
        if (!wait_fd(c->fd, ev, deadline))
            return broken(c, "write", "timed out");
    }
    return true;
}

/* Read what is there into the reader, waiting until <deadline> for something. */
static bool read_some(pdq_rconn_t *c, uint64_t deadline)
{
    char buf[16384];
    for (;;) {
        ssize_t n;
        short ev = POLLIN;
#ifdef PDQ_HAVE_GNUTLS
        if (c->tls) {
            n = gnutls_record_recv(c->tls, buf, sizeof(buf));
            if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
                ev = gnutls_record_get_direction(c->tls) ? POLLOUT : POLLIN;
                n = -1;
                errno = EAGAIN;
            } else if (n < 0) {
                return tls_broken(c, "read", (int)n);
            }
        } else
#endif
            n = recv(c->fd, buf, sizeof(buf), 0);
        if (n == 0)
            return broken(c, "read", "the server closed the connection");
        if (n > 0) {
            if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK)
                return broken(c, "read", "out of memory");
            return true;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return broken(c, "read", strerror(errno));
        if (!wait_fd(c->fd, ev, deadline))
            return broken(c, "read", "timed out");
    }
}

redisReply *pdq_rconn_command(pdq_rconn_t *c, int argc, const char **argv, const size_t *lens)
{
    if (c->fd < 0)
        return NULL;
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        broken(c, argv[0], "out of memory");
        return NULL;
    }
    uint64_t deadline = now_ms() + c->command_ms;
    bool ok = write_all(c, cmd, (size_t)len, deadline);
    redisFreeCommand(cmd);
    void *reply = NULL;
    while (ok) {
        if (redisReaderGetReply(c->reader, &reply) != REDIS_OK) {
            ok = broken(c, "protocol error", c->reader->errstr);
            break;
        }
        if (reply != NULL)
            break;
        ok = read_some(c, deadline);
    }
    if (!ok) {
        /* what is left on the wire belongs to a command given up on: never read it */
        close(c->fd);
        c->fd = -1;
        return NULL;
    }
    return reply;
}

const char *pdq_rconn_error(const pdq_rconn_t *c)
{
    return c->error[0] ? c->error : "no reply";
}

void pdq_rconn_close(pdq_rconn_t *c)
{
    if (c == NULL)
        return;
#ifdef PDQ_HAVE_GNUTLS
    if (c->tls) {
        if (c->fd >= 0 && c->tls_ready)
            (void)gnutls_bye(c->tls, GNUTLS_SHUT_WR); /* non-blocking: best effort */
        gnutls_deinit(c->tls);
    }
#endif
    if (c->fd >= 0)
        close(c->fd);
    if (c->reader)
        redisReaderFree(c->reader);
    pdb_free(c);
}
