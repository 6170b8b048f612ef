/*
 * pdgw_sink_direct.c - a committed stream written to the client socket by the gateway itself.
 *
 * Through libmicrohttpd every relayed event costs a resume (a walk over all suspended
 * connections on the next MHD_run, the socket put back into MHD's epoll set), a copy into
 * MHD's buffer, a send, and a suspend (the socket taken out again): with thousands of
 * streams the walk dominates. So once the 200's headers are on the wire, the sink takes the
 * socket over: MHD keeps the connection suspended and the gateway writes the body itself, in
 * the framing MHD chose (chunked, which MHD uses for every body of unknown length to an
 * HTTP/1.1 client). When the stream ends and every byte is out, the connection is resumed
 * and MHD writes the last chunk and carries on with keep-alive as usual.
 *
 * Only plain-HTTP/1.1 streams are taken over (TLS records belong to MHD's session; an
 * HTTP/1.0 body ends with the connection and stays with MHD). Bytes appended during one
 * turn of the worker's loop leave in one send at the end of that turn (tokens that arrive
 * together are coalesced); what the socket does not take waits for its EPOLLOUT edge, and
 * flow control (pdgw_req_out_writable, on-drain) counts it like MHD's backlog.
 */
#include "pdgw_server_int.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

bool pdgw_direct_eligible(const pdgw_req_t *r)
{
    return r->w->srv->opts.stream_output == PDGW_STREAM_OUT_DIRECT && r->http11 &&
           r->w->srv->opts.tls == NULL && r->fd >= 0;
}

size_t pdgw_direct_pending(const pdgw_req_t *r)
{
    return r->wire.len - r->wire_off;
}

/* ---------------------------------------------------------------- flush queue */

void pdgw_direct_queue(pdgw_req_t *r)
{
    pdb_dlist_push(&r->w->flush_queue, &r->flush_link);
}

/* ---------------------------------------------------------------- writing */

/* The client is gone (or its socket broke): hand the connection back to MHD, which closes
 * it and reports the request as terminated. */
static void direct_broken(pdgw_req_t *r)
{
    pdgw_buf_free(&r->wire);
    r->wire_off = 0;
    pdgw_req_client_hup(r);
}

/* Send the framed bytes left over from an earlier flush. false: stop here (the socket is
 * full, or it broke). */
static bool send_wire(pdgw_req_t *r)
{
    while (r->wire_off < r->wire.len) {
        ssize_t n = send(r->fd, r->wire.data + r->wire_off, r->wire.len - r->wire_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                direct_broken(r);
            return false;
        }
        r->wire_off += (size_t)n;
    }
    pdgw_buf_reset(&r->wire);
    r->wire_off = 0;
    if (r->wire.cap > 64 * 1024)
        pdgw_buf_free(&r->wire);
    return true;
}

/* "<len in hex>\r\n" into <head> (at least 20 bytes); its length. */
static int chunk_head(char *head, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    int n = 0, hl = 0;
    do
        tmp[n++] = hex[len & 15u];
    while ((len >>= 4) != 0);
    while (n > 0)
        head[hl++] = tmp[--n];
    head[hl++] = '\r';
    head[hl++] = '\n';
    return hl;
}

/* Frame everything in r->out as one chunk and send it; whatever the socket does not take is
 * kept, framed, in r->wire. */
static void send_out(pdgw_req_t *r)
{
    size_t len = r->out.len - r->out_off;
    char head[24];
    struct iovec iov[3];
    struct msghdr msg;
    size_t total, sent = 0;
    ssize_t n;
    int hl;

    if (len == 0)
        return;
    hl = r->direct_raw ? 0 : chunk_head(head, len); /* HTTP/1.0: the bytes alone */
    iov[0] = (struct iovec){head, (size_t)hl};
    iov[1] = (struct iovec){r->out.data + r->out_off, len};
    iov[2] = (struct iovec){(void *)"\r\n", r->direct_raw ? 0 : 2};
    total = (size_t)hl + len + iov[2].iov_len;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = 3;
    do
        n = sendmsg(r->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        direct_broken(r);
        return;
    }
    if (n > 0)
        sent = (size_t)n;
    r->bytes_out += len;
    if (sent < total) {
        /* The rest of the frame waits for the socket's EPOLLOUT (rare: the client is slow). */
        for (int i = 0; i < 3; i++) {
            size_t skip = sent < iov[i].iov_len ? sent : iov[i].iov_len;
            sent -= skip;
            if (iov[i].iov_len > skip && pdgw_buf_append(&r->wire, (char *)iov[i].iov_base + skip,
                                                         iov[i].iov_len - skip) != PDGW_OK) {
                /* Out of memory with the stream half-framed: it cannot continue intact. */
                direct_broken(r);
                return;
            }
        }
    }
    /* Given back, not kept: a parked stream holds no output buffer between events. */
    pdgw_buf_free(&r->out);
    r->out_off = 0;
}

static void flush_one(pdgw_req_t *r)
{
    if (!r->direct || r->client_gone)
        return;
    if (!send_wire(r))
        return;
    send_out(r);
    if (r->client_gone)
        return;
    if (r->on_drain != NULL && pdgw_req_out_pending(r) < PDGW_OUT_HIGH_WATER / 2) {
        void (*fn)(void *) = r->on_drain;
        r->on_drain = NULL;
        fn(r->on_drain_arg); /* may append (and queue r again) */
    }
    if (r->out_done && pdgw_req_out_pending(r) == 0 && !r->direct_ended) {
        /* Every byte is out: MHD writes the last chunk and takes the connection back. */
        r->direct_ended = true;
        pdgw_req_resume(r);
    }
}

void pdgw_direct_flush_all(pdgw_worker_t *w)
{
    while (!pdb_dlist_empty(&w->flush_queue)) {
        pdgw_req_t *r = PDB_DLIST_ENTRY(w->flush_queue.head, pdgw_req_t, flush_link);
        pdb_dlist_remove(&w->flush_queue, &r->flush_link);
        flush_one(r);
    }
}

void pdgw_direct_writable(pdgw_req_t *r)
{
    if (pdgw_direct_pending(r) > 0 || r->out.len > r->out_off || r->out_done)
        pdgw_direct_queue(r);
}

/* ---------------------------------------------------------------- take over, hand back */

bool pdgw_direct_take(pdgw_req_t *r)
{
    int one = 1;
    if (!pdgw_worker_client_watch(r->w, r, true))
        return false; /* no EPOLLOUT watch: stay with MHD */
    /* Events are small and must not wait for Nagle behind an unacknowledged one. */
    (void)setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    r->direct = true;
    if (r->out.len > r->out_off || r->out_done)
        pdgw_direct_queue(r);
    return true;
}

void pdgw_direct_forget(pdgw_req_t *r)
{
    pdb_dlist_remove(&r->w->flush_queue, &r->flush_link);
    pdgw_buf_free(&r->wire);
    r->wire_off = 0;
}
