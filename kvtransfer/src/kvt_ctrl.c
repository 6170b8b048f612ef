/*
 * kvt_ctrl.c - ZeroMQ helpers of the control plane: sockets with safe
 * options, bind with ephemeral ports, multipart receive that never trusts
 * the peer (bounded sizes, unexpected frame layouts dropped), ROUTER
 * replies that mirror the request's envelope.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvt_engine_int.h"
#include "kvt_tsan.h"

void *kvt_ctrl_socket(kvt_engine_t *e, int type)
{
    void *s = zmq_socket(e->zctx, type);
    int zero = 0, one = 1;
    int64_t maxmsg = KVT_MSG_MAX_BYTES;

    if (s == NULL)
        return NULL;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (type == ZMQ_ROUTER)
        zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof(one));
    return s;
}

void kvt_ctrl_close(void *sock)
{
    if (sock != NULL)
        zmq_close(sock);
}

kvt_status_t kvt_ctrl_bind(void *sock, const char *host, uint16_t port, uint16_t *bound_out)
{
    char ep[300], last[300];
    size_t ll = sizeof(last);
    const char *colon;

    if (port == 0)
        snprintf(ep, sizeof(ep), "tcp://%s:*", host);
    else
        snprintf(ep, sizeof(ep), "tcp://%s:%u", host, (unsigned)port);
    if (zmq_bind(sock, ep) != 0)
        return KVT_ERR_IO;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &ll) != 0)
        return KVT_ERR_IO;
    colon = strrchr(last, ':');
    if (colon == NULL)
        return KVT_ERR_IO;
    if (bound_out != NULL)
        *bound_out = (uint16_t)atoi(colon + 1);
    return KVT_OK;
}

kvt_status_t kvt_ctrl_send_msg(void *sock, const kvt_msg_t *m, int flags)
{
    void *data = NULL;
    size_t len = 0;
    kvt_status_t st = kvt_msg_encode(m, &data, &len);

    if (st != KVT_OK)
        return st;
    if (kvt_zmq_send(sock, data, len, flags) < 0)
        st = (errno == EAGAIN) ? KVT_ERR_TIMEOUT : KVT_ERR_IO;
    kvt_free(data);
    return st;
}

kvt_status_t kvt_ctrl_send_req(void *dealer, const kvt_msg_t *m)
{
    void *data = NULL;
    size_t len = 0;
    kvt_status_t st = kvt_msg_encode(m, &data, &len);

    if (st != KVT_OK)
        return st;
    st = kvt_ctrl_send_req_raw(dealer, data, len);
    kvt_free(data);
    return st;
}

kvt_status_t kvt_ctrl_send_req_raw(void *dealer, const void *data, size_t len)
{
    /* [b"", payload]: the envelope a REQ socket would write, so a REP peer
     * (LMCache's sync backend, LMCache-Ascend) accepts it and a ROUTER sees
     * the same frames from us as from an LMCache DEALER */
    if (kvt_zmq_send(dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno == EAGAIN ? KVT_ERR_TIMEOUT : KVT_ERR_IO;
    if (kvt_zmq_send(dealer, data, len, ZMQ_DONTWAIT) < 0)
        return errno == EAGAIN ? KVT_ERR_TIMEOUT : KVT_ERR_IO;
    return KVT_OK;
}

kvt_status_t kvt_ctrl_reply_raw(void *router, const void *ident, size_t ident_len, int delim,
                                const void *data, size_t len)
{
    if (kvt_zmq_send(router, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return KVT_ERR_IO;
    if (delim && kvt_zmq_send(router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return KVT_ERR_IO;
    if (kvt_zmq_send(router, data, len, ZMQ_DONTWAIT) < 0)
        return KVT_ERR_IO;
    return KVT_OK;
}

kvt_status_t kvt_ctrl_reply(void *router, const void *ident, size_t ident_len, int delim,
                            const kvt_msg_t *m)
{
    void *data = NULL;
    size_t len = 0;
    kvt_status_t st = kvt_msg_encode(m, &data, &len);

    if (st != KVT_OK)
        return st;
    st = kvt_ctrl_reply_raw(router, ident, ident_len, delim, data, len);
    kvt_free(data);
    return st;
}

/* Read the remaining frames of a message and throw them away. */
static void drop_rest(void *sock)
{
    int more = 1;
    size_t ml = sizeof(more);

    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) == 0 && more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (kvt_zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        zmq_msg_close(&f);
        ml = sizeof(more);
    }
}

static void *copy_frame(zmq_msg_t *f, size_t *len)
{
    size_t n = zmq_msg_size(f);
    void *p = kvt_malloc(n ? n : 1);

    if (p != NULL) {
        memcpy(p, zmq_msg_data(f), n);
        *len = n;
    }
    return p;
}

kvt_status_t kvt_ctrl_recv(void *sock, int router, void **ident, size_t *ident_len, int *delim,
                           void **data, size_t *len)
{
    return kvt_ctrl_recv_from(sock, router, ident, ident_len, delim, data, len, NULL, 0);
}

kvt_status_t kvt_ctrl_recv_from(void *sock, int router, void **ident, size_t *ident_len, int *delim,
                                void **data, size_t *len, char *peer, size_t peer_cap)
{
    zmq_msg_t f[4];
    int nf = 0, more = 1;
    kvt_status_t st = KVT_OK;

    while (more) {
        size_t ml = sizeof(more);
        if (nf == 4) {
            drop_rest(sock);
            st = KVT_ERR_PROTO;
            break;
        }
        zmq_msg_init(&f[nf]);
        if (kvt_zmq_msg_recv(&f[nf], sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[nf]);
            st = (errno == EAGAIN) ? KVT_ERR_TIMEOUT : KVT_ERR_IO;
            break;
        }
        nf++;
        if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) != 0)
            more = 0;
    }
    if (st == KVT_OK) {
        /* ROUTER: ident [empty] payload; others: [empty] payload */
        int first = 0;
        int d = 0;
        if (router) {
            if (nf < 2) {
                st = KVT_ERR_PROTO;
                goto out;
            }
            first = 1;
        }
        if (nf - first == 2 && zmq_msg_size(&f[first]) == 0) {
            d = 1;
        } else if (nf - first != 1) {
            st = KVT_ERR_PROTO;
            goto out;
        }
        *data = copy_frame(&f[nf - 1], len);
        if (*data == NULL) {
            st = KVT_ERR_NOMEM;
            goto out;
        }
        if (router) {
            *ident = copy_frame(&f[0], ident_len);
            if (*ident == NULL) {
                kvt_free(*data);
                *data = NULL;
                st = KVT_ERR_NOMEM;
                goto out;
            }
        }
        if (delim != NULL)
            *delim = d;
        if (peer != NULL && peer_cap > 0) {
            /* the TCP peer's IP address (libzmq metadata; absent for ipc/inproc) */
            const char *pa = zmq_msg_gets(&f[nf - 1], "Peer-Address");
            snprintf(peer, peer_cap, "%s", pa != NULL ? pa : "");
        }
    }
out:
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    return st;
}

void *kvt_ctrl_done_push(kvt_engine_t *e, const char *url)
{
    void *s = kvt_map_get(&e->done_pushes, url);
    int hwm = 10000;

    char ep[300];

    if (s != NULL)
        return s;
    /* LMCache-Ascend sends "host:port" and adds the scheme itself */
    if (strlen(url) > 280 || strstr(strncmp(url, "tcp://", 6) == 0 ? url + 6 : url, "://"))
        return NULL;
    snprintf(ep, sizeof(ep), "%s%s", strncmp(url, "tcp://", 6) == 0 ? "" : "tcp://", url);
    s = kvt_ctrl_socket(e, ZMQ_PUSH);
    if (s == NULL)
        return NULL;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (zmq_connect(s, ep) != 0 || kvt_map_put(&e->done_pushes, url, s) != KVT_OK) {
        zmq_close(s);
        return NULL;
    }
    return s;
}
