/*
 * pdgw_fwd_kv.c - the KV control client of the forwarder API (forwarder.h): libkvt's
 * ReserveRequest / CancelNotif client and ProxyNotif decoder behind the gateway, so the
 * forwarders include and link no KV library.
 */
#include <stdio.h>
#include <string.h>

#include <kvt/kvt_engine.h>
#include <kvt/kvt_msg.h>
#include <pdgw/forwarder.h>

#include "pdgw_alloc.h"
#include "pdgw_kvctl.h"

struct pdgw_fwd_kv_client {
    kvt_proxy_t *proxy;
};

pdgw_fwd_status_t pdgw_fwd_kv_client_create(pdgw_fwd_kv_client_t **out, char *err, size_t errlen)
{
    pdgw_fwd_kv_client_t *c = pdgw_calloc(1, sizeof(*c));
    kvt_status_t st;

    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR;
    }
    /* libkvt's proxy client also binds a PULL of its own: keep it on an ephemeral loopback
     * port (never read); the forwarder reads ProxyNotifs on its own checked listener. */
    st = kvt_proxy_create("127.0.0.1", 0, &c->proxy);
    if (st != KVT_OK) {
        snprintf(err, errlen, "cannot start the libkvt proxy client: %s", kvt_strerror(st));
        pdgw_free(c);
        return PDGW_FWD_ERR;
    }
    *out = c;
    return PDGW_FWD_OK;
}

void pdgw_fwd_kv_client_destroy(pdgw_fwd_kv_client_t *c)
{
    if (c == NULL)
        return;
    kvt_proxy_destroy(c->proxy);
    pdgw_free(c);
}

pdgw_fwd_status_t pdgw_fwd_kv_reserve(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                      const char *req_id, int64_t chunks, int64_t ttl_ms,
                                      int timeout_ms, int *granted, int64_t *free_chunks, char *err,
                                      size_t errlen)
{
    kvt_status_t st;

    if (port <= 0 || port > 65535) {
        snprintf(err, errlen, "bad port %d", port);
        return PDGW_FWD_ERR;
    }
    *free_chunks = -1;
    st = kvt_proxy_reserve(c->proxy, host, (uint16_t)port, req_id, chunks, ttl_ms, timeout_ms,
                           granted, free_chunks);
    if (st != KVT_OK) {
        snprintf(err, errlen, "%s", kvt_strerror(st));
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t pdgw_fwd_kv_cancel(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                     const char *req_id, char *err, size_t errlen)
{
    kvt_status_t st;

    if (port <= 0 || port > 65535) {
        snprintf(err, errlen, "bad port %d", port);
        return PDGW_FWD_ERR;
    }
    st = kvt_proxy_cancel(c->proxy, host, (uint16_t)port, req_id, NULL, 0);
    if (st != KVT_OK) {
        snprintf(err, errlen, "%s", kvt_strerror(st));
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

int pdgw_kvctl_client_reserve_send(pdgw_fwd_kv_client_t *c, const char *host, int port,
                                   const char *id, int64_t chunks, int64_t ttl_ms, char *why,
                                   size_t cap)
{
    kvt_status_t st;
    if (port <= 0 || port > 65535) {
        snprintf(why, cap, "bad port %d", port);
        return -1;
    }
    st = kvt_proxy_reserve_send(c->proxy, host, (uint16_t)port, id, chunks, ttl_ms);
    if (st != KVT_OK) {
        snprintf(why, cap, "%s", kvt_strerror(st));
        return -1;
    }
    return 0;
}

int pdgw_kvctl_client_reserve_recv(pdgw_fwd_kv_client_t *c, pdgw_kvctl_answer_t *a)
{
    kvt_proxy_reply_t r;
    if (kvt_proxy_reserve_recv(c->proxy, &r) != KVT_OK)
        return 0;
    snprintf(a->ep, sizeof(a->ep), "%s", r.ep);
    snprintf(a->req_id, sizeof(a->req_id), "%s", r.req_id);
    a->granted = r.granted;
    a->free_chunks = r.free_chunks;
    return 1;
}

size_t pdgw_kvctl_client_fds(pdgw_fwd_kv_client_t *c, int *fds, size_t max)
{
    return kvt_proxy_reserve_fds(c->proxy, fds, max);
}

int pdgw_kvctl_client_fd(pdgw_fwd_kv_client_t *c, const char *host, int port)
{
    return port > 0 && port <= 65535 ? kvt_proxy_reserve_fd(c->proxy, host, (uint16_t)port) : -1;
}

void pdgw_kvctl_client_forget(pdgw_fwd_kv_client_t *c, const char *host, int port)
{
    if (port > 0 && port <= 65535)
        kvt_proxy_reserve_drop(c->proxy, host, (uint16_t)port);
}

void pdgw_kvctl_client_endpoint(const char *host, int port, char *ep, size_t cap)
{
    kvt_proxy_reserve_endpoint(host, (uint16_t)(port > 0 && port <= 65535 ? port : 0), ep, cap);
}

int pdgw_fwd_kv_proxy_notif_decode(const void *data, size_t len, char *req_id, size_t cap)
{
    kvt_msg_t m;
    int ok;

    memset(&m, 0, sizeof(m));
    if (kvt_msg_decode(data, len, &m, NULL) != KVT_OK) {
        if (m.type != KVT_MSG_NONE)
            kvt_msg_clear(&m);
        return 0;
    }
    ok = m.type == KVT_MSG_PROXY_NOTIF && m.u.proxy_notif.req_id != NULL &&
         m.u.proxy_notif.req_id[0] != '\0' && strlen(m.u.proxy_notif.req_id) < cap;
    if (ok)
        snprintf(req_id, cap, "%s", m.u.proxy_notif.req_id);
    kvt_msg_clear(&m);
    return ok;
}
