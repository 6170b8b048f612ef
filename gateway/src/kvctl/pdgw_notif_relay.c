/*
 * pdgw_notif_relay.c - ProxyNotif relay between the replicas of one gateway.
 *
 * An LMCache prefill sends its ProxyNotif to one configured address (pd_proxy_host /
 * pd_proxy_port), so behind a Service with several pdgw replicas it reaches one replica,
 * chosen per connection, not the replica that owns the request. A replica that receives a
 * notice for a request it does not have in flight hands it to its peers (option
 * notif_relay_peers: host:port entries; a name such as a headless Service may resolve to
 * every replica) on their relay port (notif_relay_port), with the address of the engine that
 * sent it. The owner then checks that address against the request's prefill as for a direct
 * notice. A relayed notice is never relayed again, and a relay port takes messages only from
 * the peers' addresses (and, with CURVE configured, only from listed keys).
 *
 * Wire (pdgw's own, between pdgw replicas): three frames [RELAY_TAG, req_id, sender address].
 */
#include "pdgw_notif.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <zmq.h>

#include "pdgw_alloc.h"

#define RELAY_TAG        "pdgw-notif-relay/1"
#define RELAY_MAX_PEERS  64
#define RELAY_MAX_MSG    1024
#define RELAY_RESOLVE_MS 10000 /* peers are looked up again this often (replicas come and go) */
#define RELAY_ADDR_LEN   INET6_ADDRSTRLEN

typedef struct relay_peer {
    char addr[RELAY_ADDR_LEN]; /* numeric address */
    int port;
    void *push;
    int seen; /* still in the latest resolution */
} relay_peer_t;

struct pdgw_notif_relay {
    char protocol[64];
    void *ctx;
    void *pull;
    int port;
    char self[RELAY_ADDR_LEN]; /* our own bind address, left out of the peers */
    char spec[512];            /* notif_relay_peers as configured */
    relay_peer_t peers[RELAY_MAX_PEERS];
    size_t n_peers;
    int64_t resolved_ms;
};

static void relay_count(const pdgw_notif_relay_t *r, const char *name, const char *help)
{
    pdgw_fwd_counter_inc(r->protocol, name, help);
}

/* The canonical text of an address (IPv4-mapped IPv6 as plain IPv4), "" when not one. */
static void canon_addr(const char *in, char *out, size_t cap)
{
    unsigned char b[16];
    out[0] = '\0';
    if (inet_pton(AF_INET, in, b) == 1) {
        inet_ntop(AF_INET, b, out, (socklen_t)cap);
    } else if (inet_pton(AF_INET6, in, b) == 1) {
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(b, mapped, 12) == 0)
            inet_ntop(AF_INET, b + 12, out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, b, out, (socklen_t)cap);
    }
}

static relay_peer_t *find_peer(pdgw_notif_relay_t *r, const char *addr, int port)
{
    for (size_t i = 0; i < r->n_peers; i++)
        if (strcmp(r->peers[i].addr, addr) == 0 && (port < 0 || r->peers[i].port == port))
            return &r->peers[i];
    return NULL;
}

static void add_peer(pdgw_notif_relay_t *r, const char *addr, int port)
{
    relay_peer_t *p = find_peer(r, addr, port);
    char ep[RELAY_ADDR_LEN + 32];
    int zero = 0, hwm = 1000;
    if (p != NULL) {
        p->seen = 1;
        return;
    }
    if ((strcmp(addr, r->self) == 0 && port == r->port) || r->n_peers == RELAY_MAX_PEERS)
        return;
    p = &r->peers[r->n_peers];
    memset(p, 0, sizeof(*p));
    p->push = zmq_socket(r->ctx, ZMQ_PUSH);
    if (p->push == NULL)
        return;
    zmq_setsockopt(p->push, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->push, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (strchr(addr, ':') != NULL) {
        int one = 1;
        zmq_setsockopt(p->push, ZMQ_IPV6, &one, sizeof(one));
    }
    snprintf(ep, sizeof(ep), strchr(addr, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", addr, port);
    if (zmq_connect(p->push, ep) != 0) {
        zmq_close(p->push);
        return;
    }
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    p->port = port;
    p->seen = 1;
    r->n_peers++;
}

/* Look every entry of notif_relay_peers up again; peers that are gone are closed. May block
 * on DNS: runs on the KV control thread, at most once per RELAY_RESOLVE_MS. */
static void resolve_peers(pdgw_notif_relay_t *r)
{
    char spec[sizeof(r->spec)], *save = NULL;
    for (size_t i = 0; i < r->n_peers; i++)
        r->peers[i].seen = 0;
    snprintf(spec, sizeof(spec), "%s", r->spec);
    for (char *tok = strtok_r(spec, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        char host[256], portstr[16], addr[RELAY_ADDR_LEN];
        const char *colon = strrchr(tok, ':');
        struct addrinfo hints, *res = NULL;
        size_t hl;
        if (colon == NULL || colon == tok)
            continue;
        hl = (size_t)(colon - tok);
        if (tok[0] == '[' && hl > 2 && tok[hl - 1] == ']') { /* [v6]:port */
            snprintf(host, sizeof(host), "%.*s", (int)(hl - 2), tok + 1);
        } else {
            snprintf(host, sizeof(host), "%.*s", (int)hl, tok);
        }
        snprintf(portstr, sizeof(portstr), "%s", colon + 1);
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(host, portstr, &hints, &res) != 0)
            continue;
        for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            char text[RELAY_ADDR_LEN] = "";
            int port;
            if (ai->ai_family == AF_INET) {
                const struct sockaddr_in *s = (const struct sockaddr_in *)ai->ai_addr;
                inet_ntop(AF_INET, &s->sin_addr, text, sizeof(text));
                port = ntohs(s->sin_port);
            } else if (ai->ai_family == AF_INET6) {
                const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ai->ai_addr;
                inet_ntop(AF_INET6, &s->sin6_addr, text, sizeof(text));
                port = ntohs(s->sin6_port);
            } else {
                continue;
            }
            canon_addr(text, addr, sizeof(addr));
            add_peer(r, addr, port);
        }
        freeaddrinfo(res);
    }
    for (size_t i = 0; i < r->n_peers;) {
        if (!r->peers[i].seen) {
            zmq_close(r->peers[i].push);
            r->peers[i] = r->peers[--r->n_peers];
        } else {
            i++;
        }
    }
    r->resolved_ms = pdgw_fwd_now_ms();
}

pdgw_fwd_status_t pdgw_notif_relay_create(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                          pdgw_notif_relay_t **out, char *err, size_t errlen)
{
    pdgw_notif_relay_t *r = pdgw_calloc(1, sizeof(*r));
    char ep[300], last[300];
    size_t ll = sizeof(last);
    int zero = 0, v6 = strchr(o->proxy_host, ':') != NULL;
    int64_t maxmsg = RELAY_MAX_MSG;
    const char *colon;
    *out = NULL;
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    snprintf(r->protocol, sizeof(r->protocol), "%s", protocol);
    snprintf(r->spec, sizeof(r->spec), "%s", o->notif_relay_peers);
    canon_addr(o->proxy_host, r->self, sizeof(r->self));
    r->ctx = zmq_ctx_new();
    r->pull = r->ctx ? zmq_socket(r->ctx, ZMQ_PULL) : NULL;
    if (r->pull == NULL) {
        snprintf(err, errlen, "ProxyNotif relay: %s", zmq_strerror(errno));
        goto fail;
    }
    zmq_setsockopt(r->pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (v6) {
        int one = 1;
        zmq_setsockopt(r->pull, ZMQ_IPV6, &one, sizeof(one));
    }
    snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:%lld" : "tcp://%s:%lld", o->proxy_host,
             (long long)o->notif_relay_port);
    if (zmq_bind(r->pull, ep) != 0) {
        snprintf(err, errlen, "protocol option notif_relay_port: cannot bind %s: %s", ep,
                 zmq_strerror(errno));
        goto fail;
    }
    if (zmq_getsockopt(r->pull, ZMQ_LAST_ENDPOINT, last, &ll) != 0 ||
        (colon = strrchr(last, ':')) == NULL) {
        snprintf(err, errlen, "cannot read back the ProxyNotif relay endpoint");
        goto fail;
    }
    r->port = atoi(colon + 1);
    resolve_peers(r);
    *out = r;
    return PDGW_FWD_OK;

fail:
    pdgw_notif_relay_destroy(r);
    return PDGW_FWD_ERR_CONFIG;
}

void pdgw_notif_relay_destroy(pdgw_notif_relay_t *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_peers; i++)
        zmq_close(r->peers[i].push);
    if (r->pull)
        zmq_close(r->pull);
    if (r->ctx)
        zmq_ctx_term(r->ctx);
    pdgw_free(r);
}

int pdgw_notif_relay_port(const pdgw_notif_relay_t *r)
{
    return r ? r->port : 0;
}

int pdgw_notif_relay_fd(const pdgw_notif_relay_t *r)
{
    int fd = -1;
    size_t fl = sizeof(fd);
    if (zmq_getsockopt(r->pull, ZMQ_FD, &fd, &fl) != 0)
        return -1;
    return fd;
}

void pdgw_notif_relay_forward(pdgw_notif_relay_t *r, const char *id, const char *sender)
{
    size_t sent = 0;
    if (pdgw_fwd_now_ms() - r->resolved_ms >= RELAY_RESOLVE_MS)
        resolve_peers(r);
    for (size_t i = 0; i < r->n_peers; i++) {
        void *s = r->peers[i].push;
        if (zmq_send(s, RELAY_TAG, strlen(RELAY_TAG), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
            continue; /* not connected yet or full: that replica misses this one */
        zmq_send(s, id, strlen(id), ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(s, sender, strlen(sender), ZMQ_DONTWAIT);
        sent++;
    }
    if (sent > 0)
        relay_count(r, "proxy_notifs_relayed_out",
                    "ProxyNotifs for requests another replica owns, handed to the peers.");
}

/* Whether <addr> (a message's Peer-Address) is one of the peers; looks them up again (at most
 * once a second) before saying no, since a new replica may have joined. */
static int from_peer(pdgw_notif_relay_t *r, const char *addr)
{
    char canon[RELAY_ADDR_LEN];
    canon_addr(addr ? addr : "", canon, sizeof(canon));
    if (canon[0] == '\0')
        return 0;
    if (find_peer(r, canon, -1) != NULL)
        return 1;
    if (pdgw_fwd_now_ms() - r->resolved_ms >= 1000) {
        resolve_peers(r);
        return find_peer(r, canon, -1) != NULL;
    }
    return 0;
}

int pdgw_notif_relay_recv(pdgw_notif_relay_t *r, char *id, size_t cap, char *sender,
                          size_t sendercap)
{
    for (;;) {
        zmq_msg_t f[3];
        int k = 0, more = 1, over = 0, ok;
        while (more) {
            size_t ml = sizeof(more);
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, r->pull, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            if (k < 3)
                f[k++] = m;
            else {
                zmq_msg_close(&m);
                over = 1;
            }
            if (zmq_getsockopt(r->pull, ZMQ_RCVMORE, &more, &ml) != 0)
                more = 0;
        }
        if (k == 0)
            return 0;
        ok = !over && k == 3 && zmq_msg_size(&f[0]) == strlen(RELAY_TAG) &&
             memcmp(zmq_msg_data(&f[0]), RELAY_TAG, strlen(RELAY_TAG)) == 0 &&
             zmq_msg_size(&f[1]) > 0 && zmq_msg_size(&f[1]) < cap &&
             zmq_msg_size(&f[2]) < sendercap;
        if (ok && !from_peer(r, zmq_msg_gets(&f[0], "Peer-Address"))) {
            pdgw_notif_count_rejected(r->protocol, "relay_not_peer");
            ok = -1;
        }
        if (ok == 1) {
            memcpy(id, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]));
            id[zmq_msg_size(&f[1])] = '\0';
            memcpy(sender, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            sender[zmq_msg_size(&f[2])] = '\0';
        } else if (ok == 0) {
            pdgw_notif_count_rejected(r->protocol, "malformed");
        }
        while (k > 0)
            zmq_msg_close(&f[--k]);
        if (ok == 1) {
            relay_count(r, "proxy_notifs_relayed_in", "ProxyNotifs handed over by a peer replica.");
            return 1;
        }
    }
}
