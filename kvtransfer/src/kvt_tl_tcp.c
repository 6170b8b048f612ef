/*
 * kvt_tl_tcp.c - TCP transport: one-sided WRITE/READ emulation against
 * registered regions over persistent lanes (TCP connections) per peer.
 *
 * This file keeps the regions, the grant table (pages granted to each
 * peer), the peer records with the per-peer HELLO tokens handed out in the
 * handshake blob, and the ops table. The initiator's lanes are in
 * kvt_tl_tcp_lane.c, the target side (listener, HELLO check, caps,
 * timeouts) in kvt_tl_tcp_serve.c.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <fcntl.h>

#include "kvt/kvt_uuid.h"
#include "kvt_tl_tcp_int.h"

/* ---------------------------------------------------------------- regions, grants */

static kvt_tl_region_t *region_find_locked(kvt_tl_t *tl, const char *uuid)
{
    for (kvt_tl_region_t *r = tl->regions; r != NULL; r = r->next) {
        if (strcmp(r->uuid, uuid) == 0)
            return r;
    }
    return NULL;
}

static tcp_grant_t *grant_find_locked(kvt_tl_t *tl, const char *peer, kvt_tl_region_t *r)
{
    for (tcp_grant_t *g = tl->grants; g != NULL; g = g->next) {
        if (g->region == r && strcmp(g->peer_id, peer) == 0)
            return g;
    }
    return NULL;
}

kvt_status_t kvt_tl_tcp_access_check(kvt_tl_t *tl, const char *peer, const kvt_tcp_hdr_t *h,
                                     unsigned access, uint8_t **addr)
{
    kvt_status_t status = KVT_ERR_ACCESS;
    kvt_tl_region_t *r;
    tcp_grant_t *g;

    pthread_mutex_lock(&tl->lock);
    r = region_find_locked(tl, h->uuid);
    if (r == NULL || !kvt_tcp_range_ok(h->offset, h->length, r->length))
        goto out;
    g = grant_find_locked(tl, peer, r);
    if (g == NULL)
        goto out;
    if (h->length > 0) {
        uint64_t first = h->offset / r->page_size;
        uint64_t last = (h->offset + h->length - 1) / r->page_size;
        uint16_t *cnt = (access == KVT_TL_ACCESS_WRITE) ? g->wcnt : g->rcnt;
        for (uint64_t p = first; p <= last; p++) {
            if (cnt[p] == 0)
                goto out;
        }
    }
    *addr = r->base + h->offset;
    status = KVT_OK;
out:
    pthread_mutex_unlock(&tl->lock);
    if (status != KVT_OK)
        atomic_fetch_add(&tl->st.access_denied, 1);
    return status;
}

static kvt_status_t tcp_reg_region(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                                   kvt_tl_region_t **out)
{
    kvt_tl_region_t *r;

    if (tl == NULL || p == NULL || p->uuid == NULL || strlen(p->uuid) != KVT_TL_UUID_LEN ||
        p->base == NULL || p->length == 0 || p->page_size == 0 || p->length % p->page_size ||
        p->length / p->page_size > UINT32_MAX)
        return KVT_ERR_INVALID;
    r = kvt_calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NOMEM;
    memcpy(r->uuid, p->uuid, KVT_TL_UUID_LEN + 1);
    r->base = p->base;
    r->length = p->length;
    r->page_size = p->page_size;
    r->npages = (uint32_t)(p->length / p->page_size);
    pthread_mutex_lock(&tl->lock);
    if (region_find_locked(tl, p->uuid) != NULL) {
        pthread_mutex_unlock(&tl->lock);
        kvt_free(r);
        return KVT_ERR_EXISTS;
    }
    r->next = tl->regions;
    tl->regions = r;
    pthread_mutex_unlock(&tl->lock);
    *out = r;
    return KVT_OK;
}

static void grant_free(tcp_grant_t *g)
{
    kvt_free(g->wcnt);
    kvt_free(g->rcnt);
    kvt_free(g);
}

static void tcp_dereg_region(kvt_tl_t *tl, kvt_tl_region_t *region)
{
    if (tl == NULL || region == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    for (kvt_tl_region_t **pp = &tl->regions; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == region) {
            *pp = region->next;
            break;
        }
    }
    for (tcp_grant_t **gp = &tl->grants; *gp != NULL;) {
        tcp_grant_t *g = *gp;
        if (g->region == region) {
            *gp = g->next;
            grant_free(g);
        } else {
            gp = &g->next;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    kvt_free(region);
}

static kvt_status_t tcp_grant(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                              const uint32_t *pages, size_t n, unsigned access)
{
    tcp_grant_t *g;
    kvt_status_t status = KVT_OK;

    if (tl == NULL || peer_id == NULL || region == NULL || (n > 0 && pages == NULL) ||
        strlen(peer_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (pages[i] >= region->npages)
            return KVT_ERR_INVALID;
    }
    pthread_mutex_lock(&tl->lock);
    g = grant_find_locked(tl, peer_id, region);
    if (g == NULL) {
        g = kvt_calloc(1, sizeof(*g));
        if (g != NULL) {
            g->wcnt = kvt_calloc(region->npages, sizeof(uint16_t));
            g->rcnt = kvt_calloc(region->npages, sizeof(uint16_t));
        }
        if (g == NULL || g->wcnt == NULL || g->rcnt == NULL) {
            if (g != NULL)
                grant_free(g);
            status = KVT_ERR_NOMEM;
            goto out;
        }
        snprintf(g->peer_id, sizeof(g->peer_id), "%s", peer_id);
        g->region = region;
        g->next = tl->grants;
        tl->grants = g;
    }
    for (size_t i = 0; i < n; i++) {
        if ((access & KVT_TL_ACCESS_WRITE) && g->wcnt[pages[i]] < UINT16_MAX)
            g->wcnt[pages[i]]++;
        if ((access & KVT_TL_ACCESS_READ) && g->rcnt[pages[i]] < UINT16_MAX)
            g->rcnt[pages[i]]++;
    }
out:
    pthread_mutex_unlock(&tl->lock);
    return status;
}

static void tcp_revoke(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                       const uint32_t *pages, size_t n, unsigned access)
{
    tcp_grant_t *g;

    if (tl == NULL || peer_id == NULL || region == NULL || pages == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    g = grant_find_locked(tl, peer_id, region);
    if (g != NULL) {
        for (size_t i = 0; i < n; i++) {
            if (pages[i] >= region->npages)
                continue;
            if ((access & KVT_TL_ACCESS_WRITE) && g->wcnt[pages[i]] > 0)
                g->wcnt[pages[i]]--;
            if ((access & KVT_TL_ACCESS_READ) && g->rcnt[pages[i]] > 0)
                g->rcnt[pages[i]]--;
        }
    }
    pthread_mutex_unlock(&tl->lock);
}

/* ---------------------------------------------------------------- peers */

tcp_peer_t *kvt_tl_tcp_peer_find_locked(kvt_tl_t *tl, const char *id)
{
    for (tcp_peer_t *p = tl->peers; p != NULL; p = p->next) {
        if (strcmp(p->id, id) == 0)
            return p;
    }
    return NULL;
}

static tcp_peer_t *peer_get(kvt_tl_t *tl, const char *id, int create)
{
    tcp_peer_t *p;

    pthread_mutex_lock(&tl->lock);
    p = kvt_tl_tcp_peer_find_locked(tl, id);
    if (p == NULL && create) {
        p = kvt_calloc(1, sizeof(*p));
        if (p != NULL) {
            p->tl = tl;
            snprintf(p->id, sizeof(p->id), "%s", id);
            pthread_mutex_init(&p->lock, NULL);
            p->next = tl->peers;
            tl->peers = p;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    return p;
}

/* The token <p> must present in its HELLO: made once per peer record and
 * kept, so handshakes that cross each other all hand out the same one. */
static kvt_status_t peer_token_locked(tcp_peer_t *p, char out[KVT_TCP_TOKEN_LEN + 1])
{
    if (p->token[0] == '\0') {
        kvt_uuid_t u;
        kvt_status_t st = kvt_uuid_generate(&u);
        if (st != KVT_OK)
            return st;
        kvt_uuid_to_str(&u, p->token);
    }
    memcpy(out, p->token, KVT_TCP_TOKEN_LEN + 1);
    return KVT_OK;
}

static kvt_status_t tcp_peer_prepare(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len)
{
    char token[KVT_TCP_TOKEN_LEN + 1];
    tcp_peer_t *p;
    kvt_status_t st;

    if (tl == NULL || peer_id == NULL || blob == NULL || len == NULL || peer_id[0] == '\0' ||
        strlen(peer_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    p = peer_get(tl, peer_id, 1);
    if (p == NULL)
        return KVT_ERR_NOMEM;
    pthread_mutex_lock(&tl->lock);
    st = peer_token_locked(p, token);
    pthread_mutex_unlock(&tl->lock);
    if (st != KVT_OK)
        return st;
    return kvt_tcp_addr_pack(tl->advertise, tl->port, token, blob, len);
}

static kvt_status_t tcp_peer_connect(kvt_tl_t *tl, const char *peer_id, const void *blob,
                                     size_t len)
{
    char host[256];
    char token[KVT_TCP_TOKEN_LEN + 1];
    uint16_t port;
    tcp_peer_t *p;
    kvt_status_t st;

    if (tl == NULL || peer_id == NULL || blob == NULL || len == 0 ||
        strlen(peer_id) > KVT_TL_PEER_ID_MAX || peer_id[0] == '\0')
        return KVT_ERR_INVALID;
    st = kvt_tcp_addr_unpack(blob, len, host, &port, token);
    if (st != KVT_OK)
        return st;
    p = peer_get(tl, peer_id, 1);
    if (p == NULL)
        return KVT_ERR_NOMEM;
    pthread_mutex_lock(&p->lock);
    pthread_mutex_lock(&tl->lock);
    memcpy(p->send_token, token, sizeof(token));
    pthread_mutex_unlock(&tl->lock);
    if (!p->have_addr || strcmp(p->host, host) != 0 || p->port != port || atomic_load(&p->failed)) {
        p->stopping = 1;
        kvt_tl_tcp_peer_teardown_locked(p);
        snprintf(p->host, sizeof(p->host), "%s", host);
        p->port = (uint16_t)port;
        p->have_addr = 1;
        atomic_store(&p->failed, 0);
    }
    pthread_mutex_unlock(&p->lock);
    return KVT_OK;
}

/* The initiator prepared under the address it dialled; the token it handed
 * out belongs to the node id the reply revealed. The old record keeps no
 * token (a later prepare under that address makes a fresh one). */
static kvt_status_t tcp_peer_rename(kvt_tl_t *tl, const char *old_id, const char *new_id)
{
    tcp_peer_t *o, *n;

    if (tl == NULL || old_id == NULL || new_id == NULL || new_id[0] == '\0' ||
        strlen(new_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    if (strcmp(old_id, new_id) == 0)
        return KVT_OK;
    n = peer_get(tl, new_id, 1);
    if (n == NULL)
        return KVT_ERR_NOMEM;
    pthread_mutex_lock(&tl->lock);
    o = kvt_tl_tcp_peer_find_locked(tl, old_id);
    if (o == NULL) {
        pthread_mutex_unlock(&tl->lock);
        return KVT_ERR_NOT_FOUND;
    }
    if (o->token[0] != '\0' && strcmp(o->token, n->token) != 0) {
        /* lanes opened with the token handed out before stay acceptable */
        memcpy(n->prev_token, n->token, sizeof(n->prev_token));
        memcpy(n->token, o->token, sizeof(n->token));
    }
    memset(o->token, 0, sizeof(o->token));
    memset(o->prev_token, 0, sizeof(o->prev_token));
    pthread_mutex_unlock(&tl->lock);
    return KVT_OK;
}

static void tcp_peer_remove(kvt_tl_t *tl, const char *peer_id)
{
    tcp_peer_t *p;

    if (tl == NULL || peer_id == NULL)
        return;
    p = peer_get(tl, peer_id, 0);
    if (p != NULL) {
        pthread_mutex_lock(&p->lock);
        p->stopping = 1;
        kvt_tl_tcp_peer_teardown_locked(p);
        p->have_addr = 0;
        pthread_mutex_lock(&tl->lock);
        /* its tokens die with it: a new handshake hands out new ones */
        memset(p->token, 0, sizeof(p->token));
        memset(p->prev_token, 0, sizeof(p->prev_token));
        memset(p->send_token, 0, sizeof(p->send_token));
        pthread_mutex_unlock(&tl->lock);
        pthread_mutex_unlock(&p->lock);
    }
    kvt_tl_tcp_conns_drop_peer(tl, peer_id);
    pthread_mutex_lock(&tl->lock);
    for (tcp_grant_t **gp = &tl->grants; *gp != NULL;) {
        tcp_grant_t *g = *gp;
        if (strcmp(g->peer_id, peer_id) == 0) {
            *gp = g->next;
            grant_free(g);
        } else {
            gp = &g->next;
        }
    }
    pthread_mutex_unlock(&tl->lock);
}

static kvt_status_t tcp_post(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
                             const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie)
{
    tcp_peer_t *p;

    if (tl == NULL || peer_id == NULL || xfers == NULL || n == 0 ||
        (op != KVT_TL_OP_WRITE && op != KVT_TL_OP_READ))
        return KVT_ERR_INVALID;
    if (atomic_load(&tl->stopping))
        return KVT_ERR_CLOSED;
    for (size_t i = 0; i < n; i++) {
        const kvt_tl_xfer_t *x = &xfers[i];
        if (x->local == NULL || !kvt_tcp_range_ok(x->local_offset, x->length, x->local->length) ||
            strlen(x->remote_uuid) != KVT_TL_UUID_LEN)
            return KVT_ERR_INVALID;
    }
    p = peer_get(tl, peer_id, 0);
    if (p == NULL)
        return KVT_ERR_NOT_FOUND;
    return kvt_tl_tcp_lanes_post(tl, p, op, xfers, n, cookie);
}

static void tcp_stats(kvt_tl_t *tl, kvt_tl_stats_t *out)
{
    if (tl == NULL || out == NULL)
        return;
    out->bytes_written = atomic_load(&tl->st.bytes_written);
    out->bytes_read = atomic_load(&tl->st.bytes_read);
    out->bytes_served = atomic_load(&tl->st.bytes_served);
    out->ops_completed = atomic_load(&tl->st.ops_completed);
    out->ops_failed = atomic_load(&tl->st.ops_failed);
    out->access_denied = atomic_load(&tl->st.access_denied);
    out->bad_frames = atomic_load(&tl->st.bad_frames);
    out->peer_failures = atomic_load(&tl->st.peer_failures);
    out->conns_refused = atomic_load(&tl->st.conns_refused);
    out->hello_refused = atomic_load(&tl->st.hello_refused);
    out->idle_closed = atomic_load(&tl->st.idle_closed);
    out->stall_closed = atomic_load(&tl->st.stall_closed);
    out->byes_received = atomic_load(&tl->st.byes_received);
    out->lanes_reopened = atomic_load(&tl->st.lanes_reopened);
}

/* ---------------------------------------------------------------- create/destroy */

static kvt_status_t listen_on(const char *host, uint16_t port, int *fd_out, uint16_t *port_out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res, *ai;
    char ps[16];
    kvt_status_t status = KVT_ERR_IO;

    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return KVT_ERR_INVALID;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int one = 1;
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);

        if (fd < 0)
            continue;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            close(fd);
            continue;
        }
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
        *fd_out = fd;
        status = KVT_OK;
        break;
    }
    freeaddrinfo(res);
    return status;
}

static kvt_status_t tcp_create(const kvt_tl_config_t *cfg, const kvt_tl_callbacks_t *cb,
                               kvt_tl_t **out)
{
    kvt_tl_t *tl;
    const char *host;
    kvt_status_t st;

    if (cfg == NULL || out == NULL || cfg->local_id == NULL || cfg->local_id[0] == '\0' ||
        strlen(cfg->local_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    tl = kvt_calloc(1, sizeof(*tl));
    if (tl == NULL)
        return KVT_ERR_NOMEM;
    if (cb != NULL)
        tl->cb = *cb;
    snprintf(tl->local_id, sizeof(tl->local_id), "%s", cfg->local_id);
    host = cfg->listen_host != NULL ? cfg->listen_host : "127.0.0.1";
    snprintf(tl->advertise, sizeof(tl->advertise), "%s",
             cfg->advertise_host != NULL                                 ? cfg->advertise_host
             : (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) ? "127.0.0.1"
                                                                         : host);
    tl->lanes = cfg->lanes ? cfg->lanes : KVT_TL_DEFAULT_LANES;
    if (tl->lanes > 64)
        tl->lanes = 64;
    tl->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 30000;
    tl->lim.max_conns = cfg->max_conns ? cfg->max_conns : KVT_TCP_DEF_MAX_CONNS;
    tl->lim.max_conns_per_peer =
        cfg->max_conns_per_peer ? cfg->max_conns_per_peer : KVT_TCP_DEF_MAX_CONNS_PER_PEER;
    tl->lim.max_pending = cfg->max_pending ? cfg->max_pending : KVT_TCP_DEF_MAX_PENDING;
    tl->lim.hello_timeout_ms =
        cfg->hello_timeout_ms ? cfg->hello_timeout_ms : KVT_TCP_DEF_HELLO_TIMEOUT_MS;
    tl->lim.idle_timeout_ms =
        cfg->idle_timeout_ms ? cfg->idle_timeout_ms : KVT_TCP_DEF_IDLE_TIMEOUT_MS;
    tl->lim.max_conns_per_addr =
        cfg->max_conns_per_addr ? cfg->max_conns_per_addr : KVT_TCP_DEF_MAX_CONNS_PER_ADDR;
    tl->lim.max_pending_per_addr =
        cfg->max_pending_per_addr ? cfg->max_pending_per_addr : KVT_TCP_DEF_MAX_PENDING_PER_ADDR;
    tl->lim.addr_prefix_v6 = cfg->addr_prefix_v6 ? cfg->addr_prefix_v6 : KVT_TCP_DEF_ADDR_PREFIX_V6;
    if (tl->lim.addr_prefix_v6 > 128)
        tl->lim.addr_prefix_v6 = 128;
    pthread_mutex_init(&tl->lock, NULL);
    st = listen_on(host, cfg->listen_port, &tl->listen_fd, &tl->port);
    if (st != KVT_OK)
        goto err_lock;
    tl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (tl->wake_fd < 0) {
        st = KVT_ERR_IO;
        goto err_listen;
    }
    st = kvt_tl_tcp_listener_start(tl);
    if (st != KVT_OK)
        goto err_wake;
    *out = tl;
    return KVT_OK;

err_wake:
    close(tl->wake_fd);
err_listen:
    close(tl->listen_fd);
err_lock:
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
    return st;
}

static void tcp_destroy(kvt_tl_t *tl)
{
    if (tl == NULL)
        return;
    kvt_tl_tcp_listener_stop(tl); /* no lane is served after this */
    close(tl->listen_fd);
    close(tl->wake_fd);
    while (tl->peers != NULL) {
        tcp_peer_t *p = tl->peers;
        tl->peers = p->next;
        pthread_mutex_lock(&p->lock);
        p->stopping = 1;
        kvt_tl_tcp_peer_teardown_locked(p);
        pthread_mutex_unlock(&p->lock);
        pthread_mutex_destroy(&p->lock);
        kvt_free(p);
    }
    while (tl->grants != NULL) {
        tcp_grant_t *g = tl->grants;
        tl->grants = g->next;
        grant_free(g);
    }
    while (tl->regions != NULL) {
        kvt_tl_region_t *r = tl->regions;
        tl->regions = r->next;
        kvt_free(r);
    }
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
}

static uint16_t tcp_listen_port(kvt_tl_t *tl)
{
    return tl != NULL ? tl->port : 0;
}

static const kvt_tl_ops_t tcp_ops = {
    .create = tcp_create,
    .destroy = tcp_destroy,
    .reg_region = tcp_reg_region,
    .dereg_region = tcp_dereg_region,
    .peer_prepare = tcp_peer_prepare,
    .peer_connect = tcp_peer_connect,
    .peer_rename = tcp_peer_rename,
    .peer_remove = tcp_peer_remove,
    .grant = tcp_grant,
    .revoke = tcp_revoke,
    .post = tcp_post,
    .listen_port = tcp_listen_port,
    .stats = tcp_stats,
};

const kvt_transport_desc_t kvt_tl_tcp_desc = {.name = "tcp", .ops = &tcp_ops};

KVT_TRANSPORT_REGISTER(tcp, &kvt_tl_tcp_desc)
