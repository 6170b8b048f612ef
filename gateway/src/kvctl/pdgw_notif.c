/*
 * pdgw_notif.c - the gateway's ProxyNotif listener (LMCache's proxy side channel).
 *
 * A ZeroMQ PULL that LMCache senders (PUSH, one per TP rank of a prefill) connect to and
 * send msgpack ProxyNotif{req_id} on when a request's KV has been written to its decode
 * (LMCache lmcache/v1/storage_backend/pd_backend.py, _init_sender / batched_submit_put_task;
 * the reference proxy examples/disagg_prefill/disagg_proxy_server.py binds the PULL).
 *
 * Unlike the reference proxy this listener does not trust the network: every message comes
 * back with the TCP peer's address (zmq "Peer-Address" metadata) so the caller can accept it
 * only from the prefill instances of the request, and it can run as a CURVE server (secret
 * key file) that only admits the client public keys listed in a file (a ZAP handler on the
 * listener's own ZeroMQ context). Garbage never reaches the caller: it is counted by reason.
 */
#include "pdgw_notif.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "pdgw_alloc.h"

#define NOTIF_MAX_MSG   4096 /* a ProxyNotif is a few dozen bytes */
#define NOTIF_MAX_KEYS  256
#define NOTIF_ZAP_EP    "inproc://zeromq.zap.01"
#define NOTIF_Z85_KEY   40
#define NOTIF_KEY_BYTES 32

struct pdgw_notif {
    char protocol[64];
    void *ctx;
    void *pull;
    void *zap; /* REP on the ZAP endpoint, NULL without a client key list */
    int port;
    uint8_t (*keys)[NOTIF_KEY_BYTES];
    size_t n_keys;
};

static void notif_reject(const pdgw_notif_t *n, const char *reason)
{
    pdgw_notif_count_rejected(n->protocol, reason);
}

void pdgw_notif_count_rejected(const char *protocol, const char *reason)
{
    pdgw_fwd_counter_inc_reason(protocol, "proxy_notifs_rejected",
                                "ProxyNotifs ignored, by reason (malformed, unknown request, "
                                "not from the request's prefill, late, surplus, refused peer).",
                                reason);
}

/* Read every Z85 key (40 characters between whitespace or quotes) of <path>; lines starting
 * with '#' are comments. Works for bare key files and for ZeroMQ certificate files. */
static int read_keys(const char *path, uint8_t (**out)[NOTIF_KEY_BYTES], size_t *n_out, char *err,
                     size_t errlen)
{
    FILE *f = fopen(path, "r");
    char line[512];
    uint8_t(*keys)[NOTIF_KEY_BYTES] = NULL;
    size_t n = 0;
    if (f == NULL) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '#')
            continue;
        while (*p != '\0') {
            char tok[NOTIF_Z85_KEY + 1];
            size_t len = strcspn(p, " \t\r\n\"");
            if (len == NOTIF_Z85_KEY && n < NOTIF_MAX_KEYS) {
                void *grown = pdgw_realloc(keys, (n + 1) * sizeof(*keys));
                if (grown == NULL)
                    break;
                keys = grown;
                memcpy(tok, p, NOTIF_Z85_KEY);
                tok[NOTIF_Z85_KEY] = '\0';
                if (zmq_z85_decode(keys[n], tok) != NULL)
                    n++;
            }
            p += len;
            p += strspn(p, " \t\r\n\"");
        }
    }
    fclose(f);
    if (n == 0) {
        pdgw_free(keys);
        snprintf(err, errlen, "%s holds no Z85 CURVE key (40 characters)", path);
        return -1;
    }
    *out = keys;
    *n_out = n;
    return 0;
}

static int zap_bind(pdgw_notif_t *n, char *err, size_t errlen)
{
    int zero = 0;
    n->zap = zmq_socket(n->ctx, ZMQ_REP);
    if (n->zap == NULL || zmq_setsockopt(n->zap, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_bind(n->zap, NOTIF_ZAP_EP) != 0) {
        snprintf(err, errlen, "cannot start the CURVE authenticator: %s", zmq_strerror(errno));
        return -1;
    }
    return 0;
}

pdgw_fwd_status_t pdgw_notif_create(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                    pdgw_notif_t **out, char *err, size_t errlen)
{
    pdgw_notif_t *n = pdgw_calloc(1, sizeof(*n));
    char ep[300], last[300];
    size_t ll = sizeof(last);
    int zero = 0;
    int64_t maxmsg = NOTIF_MAX_MSG;
    const char *colon;
    int v6 = strchr(o->proxy_host, ':') != NULL;
    if (n == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    snprintf(n->protocol, sizeof(n->protocol), "%s", protocol);
    n->ctx = zmq_ctx_new();
    if (n->ctx == NULL) {
        snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto err_free;
    }
    if (o->curve_client_keys_file[0] != '\0') {
        if (read_keys(o->curve_client_keys_file, &n->keys, &n->n_keys, err, errlen) != 0 ||
            zap_bind(n, err, errlen) != 0)
            goto err_ctx;
    }
    n->pull = zmq_socket(n->ctx, ZMQ_PULL);
    if (n->pull == NULL) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
        goto err_ctx;
    }
    zmq_setsockopt(n->pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(n->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (v6) {
        int one = 1;
        zmq_setsockopt(n->pull, ZMQ_IPV6, &one, sizeof(one));
    }
    if (o->curve_secret_key_file[0] != '\0') {
        uint8_t(*sk)[NOTIF_KEY_BYTES] = NULL;
        size_t nsk = 0;
        int one = 1;
        if (read_keys(o->curve_secret_key_file, &sk, &nsk, err, errlen) != 0)
            goto err_ctx;
        if (zmq_setsockopt(n->pull, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
            zmq_setsockopt(n->pull, ZMQ_CURVE_SECRETKEY, sk[0], NOTIF_KEY_BYTES) != 0) {
            snprintf(err, errlen, "CURVE is not available in this libzmq: %s", zmq_strerror(errno));
            pdgw_free(sk);
            goto err_ctx;
        }
        pdgw_free(sk);
    }
    snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:%lld" : "tcp://%s:%lld", o->proxy_host,
             (long long)o->proxy_port);
    if (zmq_bind(n->pull, ep) != 0) {
        snprintf(err, errlen, "protocol option proxy_host/proxy_port: cannot bind %s: %s", ep,
                 zmq_strerror(errno));
        goto err_ctx;
    }
    if (zmq_getsockopt(n->pull, ZMQ_LAST_ENDPOINT, last, &ll) != 0 ||
        (colon = strrchr(last, ':')) == NULL) {
        snprintf(err, errlen, "cannot read back the ProxyNotif endpoint");
        goto err_ctx;
    }
    n->port = atoi(colon + 1);
    *out = n;
    return PDGW_FWD_OK;

err_ctx:
    if (n->pull)
        zmq_close(n->pull);
    if (n->zap)
        zmq_close(n->zap);
    zmq_ctx_term(n->ctx);
err_free:
    pdgw_free(n->keys);
    pdgw_free(n);
    return PDGW_FWD_ERR_CONFIG;
}

void pdgw_notif_destroy(pdgw_notif_t *n)
{
    if (n == NULL)
        return;
    zmq_close(n->pull);
    if (n->zap)
        zmq_close(n->zap);
    zmq_ctx_term(n->ctx);
    pdgw_free(n->keys);
    pdgw_free(n);
}

int pdgw_notif_port(const pdgw_notif_t *n)
{
    return n ? n->port : 0;
}

size_t pdgw_notif_fds(const pdgw_notif_t *n, int fds[2])
{
    size_t k = 0;
    size_t fl = sizeof(int);
    if (zmq_getsockopt(n->pull, ZMQ_FD, &fds[k], &fl) == 0)
        k++;
    fl = sizeof(int);
    if (n->zap && zmq_getsockopt(n->zap, ZMQ_FD, &fds[k], &fl) == 0)
        k++;
    return k;
}

/* Receive all parts of one message into <parts> (at most <max>); returns the count, 0 when
 * nothing is queued, -1 when the message had more parts than <max> (all dropped). */
static int recv_parts(void *sock, zmq_msg_t *parts, int max)
{
    int k = 0, more = 1, over = 0;
    while (more) {
        size_t ml = sizeof(more);
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        if (k < max)
            parts[k++] = f;
        else {
            zmq_msg_close(&f);
            over = 1;
        }
        if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) != 0)
            more = 0;
    }
    if (over) {
        while (k > 0)
            zmq_msg_close(&parts[--k]);
        return -1;
    }
    return k;
}

static int key_allowed(const pdgw_notif_t *n, const zmq_msg_t *key)
{
    if (zmq_msg_size((zmq_msg_t *)key) != NOTIF_KEY_BYTES)
        return 0;
    for (size_t i = 0; i < n->n_keys; i++)
        if (memcmp(n->keys[i], zmq_msg_data((zmq_msg_t *)key), NOTIF_KEY_BYTES) == 0)
            return 1;
    return 0;
}

/* Answer every queued ZAP request (RFC 27): version, request id, domain, address, identity,
 * mechanism, credentials -> version, request id, status code, text, user id, metadata. */
static void zap_serve(pdgw_notif_t *n)
{
    zmq_msg_t p[8];
    int k;
    while (n->zap && (k = recv_parts(n->zap, p, 8)) != 0) {
        const char *code = "400", *text = "unknown client key";
        char reqid[256] = "";
        if (k < 0)
            continue; /* REP socket: nothing to answer without a request id */
        if (k >= 7 && zmq_msg_size(&p[5]) == 5 && memcmp(zmq_msg_data(&p[5]), "CURVE", 5) == 0 &&
            key_allowed(n, &p[6])) {
            code = "200";
            text = "OK";
        }
        if (k >= 2) {
            size_t l = zmq_msg_size(&p[1]) < sizeof(reqid) ? zmq_msg_size(&p[1]) : 0;
            memcpy(reqid, zmq_msg_data(&p[1]), l);
            zmq_send(n->zap, "1.0", 3, ZMQ_SNDMORE);
            zmq_send(n->zap, reqid, l, ZMQ_SNDMORE);
            zmq_send(n->zap, code, 3, ZMQ_SNDMORE);
            zmq_send(n->zap, text, strlen(text), ZMQ_SNDMORE);
            zmq_send(n->zap, "", 0, ZMQ_SNDMORE);
            zmq_send(n->zap, "", 0, 0);
        }
        if (code[0] != '2')
            notif_reject(n, "refused_peer");
        while (k > 0)
            zmq_msg_close(&p[--k]);
    }
}

int pdgw_notif_recv(pdgw_notif_t *n, char *id, size_t cap, char *peer, size_t peercap)
{
    zap_serve(n);
    for (;;) {
        zmq_msg_t p[1];
        const char *addr;
        int k = recv_parts(n->pull, p, 1);
        if (k == 0)
            return 0;
        if (k < 0) {
            notif_reject(n, "malformed"); /* multipart: never a ProxyNotif */
            continue;
        }
        if (!pdgw_fwd_kv_proxy_notif_decode(zmq_msg_data(&p[0]), zmq_msg_size(&p[0]), id, cap)) {
            zmq_msg_close(&p[0]);
            notif_reject(n, "malformed");
            continue;
        }
        addr = zmq_msg_gets(&p[0], "Peer-Address");
        snprintf(peer, peercap, "%s", addr ? addr : "");
        zmq_msg_close(&p[0]);
        return 1;
    }
}
