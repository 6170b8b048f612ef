/*
 * kvt_flow_send.c - the sender side of push and pull.
 *
 * kvt_submit_store (user thread) stages the chunks in pinned pages and
 * queues a batch; the progress thread then, per receiver endpoint:
 *   handshake (TransportInit over the init port, once)
 *   -> AllocRequest (push) / PullReadyNotif (pull), one outstanding at a
 *      time on the peer's DEALER (the replies carry no id), with a timeout
 *      after which the DEALER is closed and replaced
 *   -> push: WRITE the pages not already there; pull: keep them pinned in
 *      the pull-pending table until PullDoneSignal / TTL sweep / cancel
 *   -> ProxyNotif to the proxy (and to the receiver, which marks the
 *      request landed) once every batch of the request has finished.
 * Already-sent chunks are unpinned at once; a backed-off peer is skipped
 * but its request still gets its ProxyNotif so the decoder recomputes.
 */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "kvt_engine_int.h"

/* ---- helpers ------------------------------------------------------------ */

void kvt_sreq_free(kvt_sreq_t *r)
{
    if (r == NULL)
        return;
    for (uint32_t i = 0; i < r->n && r->keys != NULL; i++)
        kvt_free(r->keys[i]);
    kvt_free(r->keys);
    kvt_free(r->lens);
    kvt_free(r->pages);
    kvt_free(r->req_id);
    kvt_free(r->sent_bm);
    kvt_free(r->retry_x);
    kvt_free(r);
}

/* Unpin (and so free) the staging pages of <r> whose bit is clear in
 * <keep> (NULL = all), revoking READ grants for pull batches. */
static void release_pages(kvt_engine_t *e, kvt_sreq_t *r, const uint8_t *keep)
{
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->pages[i] == KVT_PAGE_NONE || (keep != NULL && kvt_bitmap_test(keep, i)))
            continue;
        if (r->pull && r->peer != NULL)
            kvt_engine_grant(e, r->peer->peer_id, r->pool, &r->pages[i], 1, KVT_TL_ACCESS_READ, 1);
        kvt_pool_unpin(r->pool, &r->pages[i], 1);
        r->pages[i] = KVT_PAGE_NONE;
    }
}

/* ProxyNotif to the proxy (the gateway): the request may be decoded now. */
static void proxy_notify(kvt_engine_t *e, const char *req_id)
{
    kvt_msg_t m;

    if (e->proxy_push == NULL)
        return;
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    m.u.proxy_notif.req_id = (char *)req_id;
    /* counted first: whoever receives it may read the metric at once */
    kvt_engine_count(e, &e->m.proxy_notifs_total, 1);
    if (kvt_ctrl_send_msg(e->proxy_push, &m, ZMQ_DONTWAIT) != KVT_OK) {
        pthread_mutex_lock(&e->mlock);
        e->m.proxy_notifs_total--;
        pthread_mutex_unlock(&e->mlock);
        return;
    }
    if (e->on_proxy_notif != NULL)
        e->on_proxy_notif(e->on_proxy_notif_arg, req_id);
}

static void enqueue(kvt_speer_t *p, kvt_sreq_t *r)
{
    r->next = NULL;
    if (p->q_tail != NULL)
        p->q_tail->next = r;
    else
        p->q_head = r;
    p->q_tail = r;
}

/* CancelNotif{req_id} to <p>, as a request in line on its DEALER: the
 * receiver answers it (AllocResponse{remote_indexes: []}), and an answer
 * must never be taken for the reply to another request. */
static const kvt_sop_t sop_cancel, sop_landed, sop_batch;
static void proxy_notify(kvt_engine_t *e, const char *req_id);

static void sreq_finish(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    r->op->finish(e, r, st);
}

static void enqueue_cancel(kvt_speer_t *p, const char *req_id)
{
    kvt_sreq_t *c = kvt_calloc(1, sizeof(*c));

    if (c == NULL || (c->req_id = kvt_strdup(req_id)) == NULL) {
        kvt_free(c);
        return;
    }
    c->op = &sop_cancel;
    c->peer = p;
    enqueue(p, c);
}

/* Every batch of <g> finished. If something reached the receiver, ask it
 * (ProxyNotif on the DEALER) to confirm the request landed -- its answer
 * comes once the bytes are there (push writes done, pull reads done) --
 * and only then tell the proxy; otherwise tell the proxy now so the
 * decoder recomputes instead of waiting. */
static void group_done(kvt_engine_t *e, kvt_sgroup_t *g)
{
    kvt_sreq_t *l = NULL;

    /* the echo is a pdgw extension: only a receiver that answered with
     * kvt_ext knows it (an LMCache receiver would answer garbage) */
    if (g->any_ok && g->peer != NULL && g->peer->ext >= 1 &&
        (l = kvt_calloc(1, sizeof(*l))) != NULL && (l->req_id = kvt_strdup(g->req_id)) != NULL) {
        l->op = &sop_landed;
        l->peer = g->peer;
        enqueue(g->peer, l); /* the next kick sends it */
        return;
    }
    kvt_free(l);
    proxy_notify(e, g->req_id);
}

/* Writes of a push batch failed: the receiver must not present those pages
 * as landed, so the request is cancelled there (the decoder recomputes).
 * A transport that lost the peer or its regions needs a new handshake. */
static void enqueue_cancel(kvt_speer_t *p, const char *req_id);

static void push_failed(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    (void)e;
    if (st == KVT_ERR_PEER || st == KVT_ERR_NOT_FOUND)
        r->peer->hs_state = 0;
    if (r->req_id[0] == '\0')
        return;
    enqueue_cancel(r->peer, r->req_id);
}

/* A batch finished (any outcome): complete its task, then the request-level
 * ProxyNotif once the last batch was seen and none is outstanding. */
static void batch_finish(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    kvt_sgroup_t *g = NULL;

    if (r->req_id[0] != '\0')
        g = kvt_map_get(&e->sgroups, r->req_id);
    if (st != KVT_OK && st != KVT_ERR_BACKOFF && st != KVT_ERR_CANCELLED)
        kvt_engine_count(e, &e->m.transfer_errors_total, 1);
    kvt_task_complete(e, r->task, st);
    if (g != NULL) {
        if (g->outstanding > 0)
            g->outstanding--;
        if (st == KVT_OK)
            g->any_ok = 1;
        if ((g->last_seen || g->cancelled) && g->outstanding == 0) {
            if (!r->cancelled && !g->cancelled)
                group_done(e, g);
            kvt_map_del(&e->sgroups, g->req_id);
            kvt_free(g->req_id);
            kvt_free(g);
        }
    }
    kvt_sreq_free(r);
}

static void on_hs_timer(pdb_timer_t *t, uint64_t now);
static void on_reply_timer(pdb_timer_t *t, uint64_t now);
static void pending_arm(kvt_engine_t *e);

static kvt_speer_t *speer_get(kvt_engine_t *e, const char *host, uint16_t alloc_port,
                              uint16_t init_port)
{
    kvt_speer_t *p;
    char addr[300];

    snprintf(addr, sizeof(addr), "%s:%u", host, (unsigned)alloc_port);
    for (p = e->speers; p != NULL; p = p->next) {
        if (strcmp(p->addr, addr) == 0) {
            if (init_port != 0)
                p->init_port = init_port;
            return p;
        }
    }
    if (kvt_engine_timer_room(e, 1) != KVT_OK)
        return NULL; /* its two timers could not be armed */
    p = kvt_calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->eng = e;
    pdb_timer_init(&p->hs_timer, on_hs_timer, p);
    pdb_timer_init(&p->reply_timer, on_reply_timer, p);
    e->nspeers++;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->alloc_port = alloc_port;
    p->init_port = init_port;
    p->next = e->speers;
    e->speers = p;
    return p;
}

static void *open_dealer(kvt_engine_t *e, kvt_speer_t *p, uint16_t port)
{
    char ep[300], ident[KVT_TL_PEER_ID_MAX + 320];
    void *s = kvt_ctrl_socket(e, ZMQ_DEALER);

    if (s == NULL)
        return NULL;
    /* "<local>-to-<peer>"; a replacement socket gets a new suffix: a ROUTER
     * without ZMQ_ROUTER_HANDOVER refuses an identity it still has (the old
     * connection may not be gone yet), and the suffix keeps the prefix a
     * receiver reads the sender from */
    if (p->dealer_gen == 0 || port != p->alloc_port)
        snprintf(ident, sizeof(ident), "%s-to-%s", e->id, p->addr);
    else
        snprintf(ident, sizeof(ident), "%s-to-%s#%u", e->id, p->addr, p->dealer_gen);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, ident, strlen(ident));
    snprintf(ep, sizeof(ep), "tcp://%s:%u", p->host, (unsigned)port);
    if (zmq_connect(s, ep) != 0) {
        kvt_ctrl_close(s);
        return NULL;
    }
    return s;
}

static int speer_dealer_ok(kvt_engine_t *e, kvt_speer_t *p)
{
    if (p->dealer == NULL)
        p->dealer = open_dealer(e, p, p->alloc_port);
    return p->dealer != NULL;
}

/* Fail (and release) every queued batch of <p>. */
static void fail_queue(kvt_engine_t *e, kvt_speer_t *p, kvt_status_t st)
{
    while (p->q_head != NULL) {
        kvt_sreq_t *r = p->q_head;
        p->q_head = r->next;
        release_pages(e, r, NULL);
        sreq_finish(e, r, st);
    }
    p->q_tail = NULL;
}

static kvt_status_t start_handshake(kvt_engine_t *e, kvt_speer_t *p)
{
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t len = sizeof(blob), mlen = 0;
    void *msg = NULL;
    uint64_t sent_ns;
    kvt_status_t st;

    if (e->tl == NULL)
        return KVT_ERR_CLOSED;
    if (p->init_port == 0)
        return KVT_ERR_CONFIG;
    kvt_ctrl_close(p->init_dealer);
    p->init_dealer = open_dealer(e, p, p->init_port);
    if (p->init_dealer == NULL)
        return KVT_ERR_IO;
    st = e->tdesc->ops->peer_prepare(e->tl, p->addr, blob, &len);
    if (st == KVT_OK)
        st = kvt_hs_encode(e, blob, len, 0, &msg, &mlen);
    if (st != KVT_OK)
        return st;
    /* the deadline runs from the send: a reply (or a clock moved by a test that saw the
     * request) can come before this thread is back from it */
    sent_ns = kvt_engine_now(e);
    st = kvt_ctrl_send_req_raw(p->init_dealer, msg, mlen);
    kvt_free(msg);
    if (st != KVT_OK)
        return KVT_ERR_IO;
    p->hs_state = 1;
    p->hs_deadline_ns = sent_ns + (uint64_t)e->ctrl_timeout_ms * KVT_NSEC_PER_MSEC;
    kvt_engine_arm(e, &p->hs_timer, p->hs_deadline_ns);
    return KVT_OK;
}

/* ---- the cancel and the landed query ---------------------------------------- */

/* CancelNotif; the receiver answers AllocResponse{remote_indexes: []}. */
static kvt_status_t cancel_send(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r)
{
    kvt_msg_t m;
    (void)e;
    kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
    m.u.cancel.req_id = r->req_id;
    return kvt_ctrl_send_req(p->dealer, &m);
}

static int cancel_accepts(const kvt_sreq_t *r, const kvt_msg_t *m)
{
    (void)r;
    return m->type == KVT_MSG_ALLOC_RESPONSE;
}

/* The landed query (a pdgw extension): ProxyNotif{req_id} on the DEALER,
 * echoed by the receiver once every chunk of req_id is there. */
static kvt_status_t landed_send(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r)
{
    kvt_msg_t m;
    (void)e;
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    m.u.proxy_notif.req_id = r->req_id;
    return kvt_ctrl_send_req(p->dealer, &m);
}

static int landed_accepts(const kvt_sreq_t *r, const kvt_msg_t *m)
{
    return m->type == KVT_MSG_PROXY_NOTIF && strcmp(m->u.proxy_notif.req_id, r->req_id) == 0;
}

/* Either answer just ends the operation. */
static void ctl_on_reply(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r, kvt_msg_t *m)
{
    (void)p;
    (void)m;
    sreq_finish(e, r, KVT_OK);
}

static void cancel_finish(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    (void)e;
    (void)st;
    kvt_sreq_free(r); /* the receiver answered the cancel (or we gave up) */
}

static void landed_finish(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    (void)st;
    /* confirmed (or given up waiting): the proxy may go ahead */
    if (!r->cancelled)
        proxy_notify(e, r->req_id);
    kvt_sreq_free(r);
}

static const kvt_sop_t sop_cancel = {.name = "cancel",
                                     .before_handshake = 1,
                                     .send = cancel_send,
                                     .accepts = cancel_accepts,
                                     .on_reply = ctl_on_reply,
                                     .finish = cancel_finish};
static const kvt_sop_t sop_landed = {.name = "landed",
                                     .send = landed_send,
                                     .accepts = landed_accepts,
                                     .on_reply = ctl_on_reply,
                                     .finish = landed_finish};

/* ---- a batch ---------------------------------------------------------------- */

/* AllocRequest (push) or PullReadyNotif (pull) of batch <r>. */
static kvt_status_t batch_send(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r)
{
    kvt_msg_t m;
    kvt_status_t st = KVT_OK;

    if (r->pull) {
        kvt_msg_init(&m, KVT_MSG_PULL_READY_NOTIF);
        kvt_msg_pull_ready_notif_t *q = &m.u.pull_ready;
        char done_url[300];
        /* "host:port" like LMCache-Ascend's sender: its receiver adds the scheme */
        snprintf(done_url, sizeof(done_url), "%s:%u", e->advertise, (unsigned)e->ports.done_port);
        snprintf(r->pull_id, sizeof(r->pull_id), "p%llu-%s|%s", (unsigned long long)++e->pull_seq,
                 e->id, r->req_id);
        st = kvt_msg_set_str(&q->pull_id, r->pull_id);
        if (st == KVT_OK)
            st = kvt_str_list_set(&q->keys, (const char *const *)r->keys, r->n);
        for (uint32_t i = 0; i < r->n && st == KVT_OK; i++) {
            char uuid[KVT_UUID_STR_LEN + 1];
            kvt_tl_region_t *reg;
            uint64_t off;
            st = kvt_engine_region_of(e, r->pool, r->pages[i], &reg, &off, uuid);
            if (st == KVT_OK)
                st = kvt_str_list_push(&q->sender_buffer_uuids, uuid);
            if (st == KVT_OK)
                st = kvt_int_list_push(&q->sender_mem_indexes,
                                       (int64_t)(off / kvt_pool_page_size(r->pool)));
        }
        if (st == KVT_OK)
            st = kvt_msg_set_str(&q->sender_id, e->id);
        if (st == KVT_OK)
            st = kvt_msg_set_str(&q->sender_done_url, done_url);
        if (st == KVT_OK)
            st = kvt_int_list_set(&q->shape, r->shape, r->ndim);
        if (st == KVT_OK)
            st = kvt_msg_set_str(&q->dtype, r->dtype);
        q->fmt = r->fmt;
        q->last_chunk_toks = r->last_chunk_toks;
        q->kvt_ext = KVT_MSG_EXT_VERSION;
        /* the receiver may read these pages from now on */
        if (st == KVT_OK)
            st = kvt_engine_grant(e, p->peer_id, r->pool, r->pages, r->n, KVT_TL_ACCESS_READ, 0);
    } else {
        kvt_msg_init(&m, KVT_MSG_ALLOC_REQUEST);
        kvt_msg_alloc_request_t *q = &m.u.alloc_req;
        st = kvt_str_list_set(&q->keys, (const char *const *)r->keys, r->n);
        if (st == KVT_OK)
            st = kvt_int_list_set(&q->shape, r->shape, r->ndim);
        if (st == KVT_OK)
            st = kvt_msg_set_str(&q->dtype, r->dtype);
        if (st == KVT_OK)
            st = kvt_msg_set_str(&q->req_id, r->req_id);
        q->fmt = r->fmt;
        q->last_chunk_toks = r->last_chunk_toks;
        q->is_last_batch = r->is_last;
        q->total_chunks = r->total_chunks;
        q->kvt_ext = KVT_MSG_EXT_VERSION;
    }
    if (st == KVT_OK)
        st = kvt_ctrl_send_req(p->dealer, &m);
    kvt_msg_clear(&m);
    return st;
}

/* Move the peer's queue forward: handshake first, then one request. */
static void speer_kick(kvt_engine_t *e, kvt_speer_t *p)
{
    while (p->active == NULL && p->q_head != NULL) {
        kvt_sreq_t *r;
        uint64_t sent_ns;
        kvt_status_t st;

        if (p->hs_state == 1 && !p->q_head->op->before_handshake)
            return;
        if (p->hs_state != 2 && !p->q_head->op->before_handshake) {
            st = start_handshake(e, p);
            if (st != KVT_OK) {
                p->hs_state = 0;
                fail_queue(e, p, st);
            }
            return;
        }
        r = p->q_head;
        p->q_head = r->next;
        if (p->q_head == NULL)
            p->q_tail = NULL;
        r->next = NULL;
        if (r->retry_x != NULL) {
            /* writes of a batch whose receiver needed a new handshake */
            st = kvt_engine_post(e, p->peer_id, KVT_TL_OP_WRITE, r->retry_x, r->retry_n,
                                 kvt_cookie(CK_PUSH_WRITE, r));
            kvt_free(r->retry_x);
            r->retry_x = NULL;
            if (st != KVT_OK) {
                memset(r->sent_bm, 0, kvt_bitmap_bytes(r->n));
                release_pages(e, r, NULL);
                memset(r->task->bitmap, 0, kvt_bitmap_bytes(r->n));
                push_failed(e, r, st);
                sreq_finish(e, r, st);
                continue;
            }
            r->state = SREQ_WRITING;
            r->deadline_ns = kvt_clock_monotonic_ns();
            continue;
        }
        if (!speer_dealer_ok(e, p)) {
            release_pages(e, r, NULL);
            sreq_finish(e, r, KVT_ERR_IO);
            continue;
        }
        sent_ns = kvt_engine_now(e); /* the deadline runs from the send, as above */
        st = r->op->send(e, p, r);
        if (st != KVT_OK) {
            release_pages(e, r, NULL);
            sreq_finish(e, r, st);
            continue;
        }
        r->state = SREQ_WAIT_REPLY;
        /* the receiver may wait up to the backoff TTL for space first */
        r->deadline_ns = sent_ns + (uint64_t)e->ctrl_timeout_ms * KVT_NSEC_PER_MSEC +
                         kvt_sec_to_ns(e->cfg.pd_alloc_fail_backoff_ttl);
        p->active = r;
        kvt_engine_arm(e, &p->reply_timer, r->deadline_ns);
    }
}

/* ---- submission (user thread) --------------------------------------------- */

kvt_status_t kvt_submit_store(kvt_engine_t *e, const kvt_store_desc_t *d, const char *const *keys,
                              const void *const *bufs, const size_t *lens, uint32_t n,
                              kvt_task_id_t *id_out)
{
    kvt_chunk_geom_t g;
    kvt_sreq_t *r;
    kvt_cmd_t *c;
    kvt_status_t st;
    uint16_t aport, iport;
    const char *host;

    if (e == NULL || d == NULL || id_out == NULL ||
        (n > 0 && (keys == NULL || bufs == NULL || lens == NULL)) || !(e->role & KVT_ROLE_SENDER) ||
        d->dtype == NULL || n > KVT_MSG_MAX_ITEMS)
        return KVT_ERR_INVALID;
    st = kvt_chunk_geom_init(&g, d->fmt, d->shape, d->ndim, d->dtype);
    if (st != KVT_OK)
        return st;
    if (kvt_chunk_bytes(&g) > e->page_size)
        return KVT_ERR_INVALID;
    for (uint32_t i = 0; i < n; i++) {
        size_t want =
            (i + 1 == n) ? kvt_chunk_bytes_toks(&g, d->last_chunk_toks) : kvt_chunk_bytes(&g);
        if (keys[i] == NULL || keys[i][0] == '\0' || strlen(keys[i]) > KVT_MSG_MAX_STR ||
            bufs[i] == NULL || lens[i] != want)
            return KVT_ERR_INVALID;
    }
    host = d->peer_host != NULL ? d->peer_host : e->cfg.pd_peer_host;
    aport = d->peer_alloc_port ? d->peer_alloc_port
                               : kvt_config_port(&e->cfg, &e->cfg.pd_peer_alloc_port);
    iport =
        d->peer_init_port ? d->peer_init_port : kvt_config_port(&e->cfg, &e->cfg.pd_peer_init_port);
    if (host == NULL || host[0] == '\0' || aport == 0)
        return KVT_ERR_INVALID;
    if (n > kvt_pool_total_pages(e->stage))
        return KVT_ERR_TOO_LARGE; /* fail fast: it could never fit */
    if (e->cfg.pd_pull_mode && n > 0) {
        st = kvt_backpressure_check_pool(e->stage, e->cfg.pd_pull_backpressure_reserve_pct, n);
        if (st != KVT_OK) {
            kvt_engine_count(e, &e->m.backpressure_total, 1);
            return st;
        }
    }

    st = KVT_ERR_NOMEM;
    r = kvt_calloc(1, sizeof(*r));
    if (r == NULL)
        return st;
    r->op = &sop_batch;
    r->n = n;
    r->pool = e->stage;
    r->keys = kvt_calloc(n + 1, sizeof(char *));
    r->lens = kvt_calloc(n + 1, sizeof(size_t));
    r->pages = kvt_calloc(n + 1, sizeof(kvt_page_t));
    r->req_id = kvt_strdup(d->req_id != NULL ? d->req_id : "");
    r->sent_bm = kvt_calloc(kvt_bitmap_bytes(n) + 1, 1);
    c = kvt_calloc(1, sizeof(*c));
    if (r->keys == NULL || r->lens == NULL || r->pages == NULL || r->req_id == NULL ||
        r->sent_bm == NULL || c == NULL)
        goto err_free;
    for (uint32_t i = 0; i < n; i++) {
        r->pages[i] = KVT_PAGE_NONE;
        r->lens[i] = lens[i];
        r->keys[i] = kvt_strdup(keys[i]);
        if (r->keys[i] == NULL)
            goto err_free;
    }
    r->fmt = d->fmt;
    r->ndim = d->ndim;
    memcpy(r->shape, d->shape, sizeof(r->shape));
    snprintf(r->dtype, sizeof(r->dtype), "%s", d->dtype);
    r->last_chunk_toks = d->last_chunk_toks;
    r->is_last = d->is_last_batch;
    r->total_chunks = d->total_chunks;
    r->pull = e->cfg.pd_pull_mode;
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = aport;
    c->timeout_ms = iport; /* carries the init port to the progress thread */

    if (n > 0) {
        st = kvt_pool_alloc(r->pool, n, 0, r->pages, NULL, NULL);
        if (st != KVT_OK)
            goto err_free;
        /* stage the bytes, then let a pin hold each page: whatever path the
         * batch takes, one unpin per page releases it */
        for (uint32_t i = 0; i < n && st == KVT_OK; i++)
            st = kvt_pool_write(r->pool, r->pages[i], 0, bufs[i], lens[i]);
        if (st == KVT_OK)
            st = kvt_pool_pin(r->pool, r->pages, n);
        if (st != KVT_OK) {
            kvt_pool_free(r->pool, r->pages, n);
            goto err_free;
        }
        kvt_pool_unref(r->pool, r->pages, n);
    }
    r->task = kvt_task_new(e, KVT_TASK_STORE, n, d->user);
    if (r->task == NULL) {
        st = KVT_ERR_NOMEM;
        if (n > 0)
            kvt_pool_unpin(r->pool, r->pages, n);
        goto err_free;
    }
    c->kind = CMD_STORE;
    c->sreq = r;
    *id_out = r->task->id;
    return kvt_engine_post_cmd(e, c);

err_free:
    kvt_free(c);
    kvt_sreq_free(r);
    return st;
}

/* ---- progress thread --------------------------------------------------------- */

void kvt_flow_sender_submit(kvt_engine_t *e, kvt_sreq_t *r)
{
    kvt_speer_t *p = r->peer;
    kvt_sgroup_t *g;

    if (r->req_id[0] != '\0') {
        g = kvt_map_get(&e->sgroups, r->req_id);
        if (g == NULL) {
            g = kvt_calloc(1, sizeof(*g));
            if (g != NULL && (g->req_id = kvt_strdup(r->req_id)) != NULL &&
                kvt_map_put(&e->sgroups, r->req_id, g) == KVT_OK) {
                g->peer = p;
            } else if (g != NULL) {
                kvt_free(g->req_id);
                kvt_free(g);
                g = NULL;
            }
        }
        if (g != NULL) {
            g->outstanding++;
            if (r->is_last)
                g->last_seen = 1;
            g->peer = p;
        }
    }
    if (kvt_breaker_check(e->breaker, p->addr, NULL) != KVT_OK) {
        /* backed off: skip the transfer, the ProxyNotif still goes out */
        release_pages(e, r, NULL);
        sreq_finish(e, r, KVT_ERR_BACKOFF);
        return;
    }
    if (r->n == 0 && !r->pull) {
        sreq_finish(e, r, KVT_OK);
        return;
    }
    r->state = SREQ_QUEUED;
    enqueue(p, r);
    speer_kick(e, p);
}

/* Called from run_commands with the command's routing fields. */
void kvt_flow_sender_route(kvt_engine_t *e, kvt_sreq_t *r, const char *host, uint16_t port,
                           uint16_t init_port)
{
    r->peer = speer_get(e, host, port, init_port);
    if (r->peer == NULL) {
        release_pages(e, r, NULL);
        sreq_finish(e, r, KVT_ERR_NOMEM);
        return;
    }
    kvt_flow_sender_submit(e, r);
}

void kvt_flow_sender_on_hs_reply(kvt_engine_t *e, kvt_speer_t *p, const void *data, size_t len)
{
    kvt_msg_t m;
    kvt_msg_err_t err = {0};
    kvt_status_t st;

    if (p->hs_state != 1)
        return; /* stale */
    st = kvt_hs_decode(e, data, len, &m, &err);
    if (st != KVT_OK) {
        kvt_engine_bad_msg(e, "handshake reply", st, &err);
        p->hs_state = 0;
        fail_queue(e, p, KVT_ERR_PROTO);
        return;
    }
    /* who answered: the control plane says so, not the transport's blob */
    snprintf(p->peer_id, sizeof(p->peer_id), "%s", m.u.tinit.node_id);
    st = e->tl != NULL ? KVT_OK : KVT_ERR_CLOSED;
    /* prepared under the address we dialled; the transport may have bound
     * state to that name */
    if (st == KVT_OK && strcmp(p->addr, p->peer_id) != 0 && e->tdesc->ops->peer_rename != NULL)
        st = e->tdesc->ops->peer_rename(e->tl, p->addr, p->peer_id);
    if (st == KVT_OK)
        st = e->tdesc->ops->peer_connect(e->tl, p->peer_id, m.u.tinit.addr.p, m.u.tinit.addr.n);
    kvt_msg_clear(&m);
    kvt_ctrl_close(p->init_dealer);
    p->init_dealer = NULL;
    if (st != KVT_OK) {
        p->hs_state = 0;
        fail_queue(e, p, st);
        return;
    }
    p->hs_state = 2;
    speer_kick(e, p);
}

static kvt_status_t post_writes(kvt_engine_t *e, kvt_sreq_t *r, const kvt_msg_alloc_response_t *a,
                                const uint8_t *already, uint32_t *nposted)
{
    kvt_tl_xfer_t *x = kvt_calloc(r->n + 1, sizeof(*x));
    uint32_t j = 0, nx = 0;
    kvt_status_t st = KVT_OK;

    if (x == NULL)
        return KVT_ERR_NOMEM;
    for (uint32_t i = 0; i < r->n; i++) {
        int64_t idx;
        const char *uuid;
        uint64_t off;

        if (kvt_bitmap_test(already, i))
            continue;
        if (j >= a->remote_indexes.n)
            break;
        idx = a->remote_indexes.v[j];
        uuid = j < a->remote_buffer_uuids.n ? a->remote_buffer_uuids.v[j] : "";
        j++;
        if (idx < 0 || strlen(uuid) != KVT_UUID_STR_LEN)
            continue; /* that slot failed on the receiver */
        if (kvt_engine_region_of(e, r->pool, r->pages[i], &x[nx].local, &off, NULL) != KVT_OK)
            continue;
        x[nx].local_offset = off;
        memcpy(x[nx].remote_uuid, uuid, KVT_UUID_STR_LEN + 1);
        x[nx].remote_offset = (uint64_t)idx * e->page_size;
        x[nx].length = r->lens[i];
        kvt_bitmap_set(r->sent_bm, i); /* in flight: keep until the write completes */
        nx++;
    }
    if (nx > 0)
        st = kvt_engine_post(e, r->peer->peer_id, KVT_TL_OP_WRITE, x, nx,
                             kvt_cookie(CK_PUSH_WRITE, r));
    if ((st == KVT_ERR_NOT_FOUND || st == KVT_ERR_PEER) && !r->retried) {
        /* the transport lost the peer or does not know its regions (it
         * restarted): keep the writes, handshake again, post once more */
        r->retry_x = x;
        r->retry_n = nx;
    } else {
        kvt_free(x);
    }
    *nposted = nx;
    return st;
}

static void on_push_reply(kvt_engine_t *e, kvt_sreq_t *r, kvt_msg_t *m)
{
    kvt_msg_alloc_response_t *a = &m->u.alloc_resp;
    uint8_t *already = kvt_calloc(kvt_bitmap_bytes(r->n) + 1, 1);
    uint32_t nposted = 0, nfail = 0;
    kvt_status_t st;

    if (already == NULL) {
        release_pages(e, r, NULL);
        sreq_finish(e, r, KVT_ERR_NOMEM);
        return;
    }
    if (a->alloc_failed) {
        kvt_breaker_trip(e->breaker, r->peer->addr);
        kvt_engine_count(e, &e->m.alloc_failures_total, r->n);
        release_pages(e, r, NULL);
        kvt_free(already);
        sreq_finish(e, r, KVT_ERR_ALLOC_FAILED);
        return;
    }
    for (uint32_t i = 0; i < a->already_sent_indexes.n; i++) {
        int64_t k = a->already_sent_indexes.v[i];
        if (k >= 0 && k < r->n) {
            kvt_bitmap_set(already, (uint32_t)k);
            kvt_bitmap_set(r->task->bitmap, (uint32_t)k);
        }
    }
    kvt_engine_count(e, &e->m.already_sent_total, a->already_sent_indexes.n);
    for (uint32_t i = 0; i < a->remote_indexes.n; i++)
        nfail += a->remote_indexes.v[i] < 0;
    if (nfail > 0)
        kvt_engine_count(e, &e->m.alloc_failures_total, nfail);
    st = post_writes(e, r, a, already, &nposted);
    kvt_free(already);
    /* pages not being written (already there, failed slots) go now */
    release_pages(e, r, r->sent_bm);
    if (st != KVT_OK && r->retry_x != NULL) {
        kvt_speer_t *p = r->peer;
        r->retried = 1;
        p->hs_state = 0;
        r->next = p->q_head; /* first in line once the handshake is done */
        p->q_head = r;
        if (p->q_tail == NULL)
            p->q_tail = r;
        return;
    }
    if (st != KVT_OK) {
        memset(r->sent_bm, 0, kvt_bitmap_bytes(r->n));
        release_pages(e, r, NULL);
        memset(r->task->bitmap, 0, kvt_bitmap_bytes(r->n));
        push_failed(e, r, st);
        sreq_finish(e, r, st);
        return;
    }
    if (nposted == 0) {
        sreq_finish(e, r, KVT_OK);
        return;
    }
    r->state = SREQ_WRITING;
    r->deadline_ns = kvt_clock_monotonic_ns(); /* start of the transfer (metrics) */
}

void kvt_flow_sender_on_write_done(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st)
{
    uint64_t bytes = 0;
    kvt_speer_t *p;

    for (uint32_t i = 0; i < r->n; i++) {
        if (!kvt_bitmap_test(r->sent_bm, i))
            continue;
        bytes += r->lens[i];
        if (st == KVT_OK)
            kvt_bitmap_set(r->task->bitmap, i);
    }
    if (st == KVT_OK) {
        kvt_engine_count(e, &e->m.bytes_write, bytes);
        kvt_engine_observe(e, r->deadline_ns);
    } else {
        push_failed(e, r, st);
    }
    memset(r->sent_bm, 0, kvt_bitmap_bytes(r->n));
    release_pages(e, r, NULL);
    p = r->peer;
    sreq_finish(e, r, r->cancelled ? KVT_ERR_CANCELLED : st);
    speer_kick(e, p);
}

static void release_pending_entry(void *arg, kvt_pending_entry_t *pe)
{
    kvt_engine_t *e = arg;
    kvt_speer_t *p = pe->user;

    if (p != NULL)
        kvt_engine_grant(e, p->peer_id, pe->pool, pe->pages, pe->npages, KVT_TL_ACCESS_READ, 1);
    kvt_pending_entry_release(pe);
}

static void on_pull_ack(kvt_engine_t *e, kvt_sreq_t *r, kvt_msg_t *m)
{
    kvt_msg_pull_ready_done_ack_t *a = &m->u.pull_ack;
    kvt_page_t *rest;
    uint32_t nrest = 0;
    int already_done = 0;
    kvt_status_t st;

    if (a->alloc_failed) {
        kvt_breaker_trip(e->breaker, r->peer->addr);
        kvt_engine_count(e, &e->m.alloc_failures_total, r->n);
        release_pages(e, r, NULL);
        sreq_finish(e, r, KVT_ERR_ALLOC_FAILED);
        return;
    }
    for (uint32_t i = 0; i < a->already_sent_indexes.n; i++) {
        int64_t k = a->already_sent_indexes.v[i];
        if (k >= 0 && k < r->n)
            kvt_bitmap_set(r->task->bitmap, (uint32_t)k);
    }
    kvt_engine_count(e, &e->m.already_sent_total, a->already_sent_indexes.n);
    /* already there: unpin now (nothing stays pinned on the dedup path) */
    memset(r->sent_bm, 0xff, kvt_bitmap_bytes(r->n));
    for (uint32_t i = 0; i < r->n; i++) {
        if (kvt_bitmap_test(r->task->bitmap, i))
            kvt_bitmap_clear(r->sent_bm, i);
    }
    release_pages(e, r, r->sent_bm);
    rest = kvt_calloc(r->n + 1, sizeof(*rest));
    if (rest == NULL) {
        release_pages(e, r, NULL);
        sreq_finish(e, r, KVT_ERR_NOMEM);
        return;
    }
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->pages[i] != KVT_PAGE_NONE) {
            rest[nrest++] = r->pages[i];
            kvt_bitmap_set(r->task->bitmap, i);
        }
    }
    st = KVT_OK;
    if (nrest > 0) {
        st = kvt_pending_add(e->pending, r->pull_id, r->req_id, r->pool, rest, nrest, r->peer,
                             &already_done);
        if (st == KVT_OK)
            pending_arm(e);
        if (st == KVT_OK && already_done) {
            /* its PullDoneSignal came before this ack */
            kvt_engine_count(e, &e->m.pull_early_done_total, 1);
            release_pages(e, r, NULL);
        }
    }
    if (st != KVT_OK) {
        release_pages(e, r, NULL);
        memset(r->task->bitmap, 0, kvt_bitmap_bytes(r->n));
    } else {
        /* the pending table owns the pins now */
        for (uint32_t i = 0; i < r->n; i++)
            r->pages[i] = KVT_PAGE_NONE;
    }
    kvt_free(rest);
    sreq_finish(e, r, r->cancelled ? KVT_ERR_CANCELLED : st);
}

static int batch_accepts(const kvt_sreq_t *r, const kvt_msg_t *m)
{
    return r->pull
               ? m->type == KVT_MSG_PULL_READY_DONE_ACK
               : (m->type == KVT_MSG_ASCEND_ALLOC_RESPONSE || m->type == KVT_MSG_ALLOC_RESPONSE);
}

static void batch_on_reply(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r, kvt_msg_t *m)
{
    /* does this receiver speak the pdgw extensions (landed query)? */
    p->ext = r->pull ? m->u.pull_ack.kvt_ext
                     : (m->type == KVT_MSG_ASCEND_ALLOC_RESPONSE ? m->u.alloc_resp.kvt_ext : 0);
    if (r->pull)
        on_pull_ack(e, r, m);
    else
        on_push_reply(e, r, m);
}

static const kvt_sop_t sop_batch = {.name = "batch",
                                    .send = batch_send,
                                    .accepts = batch_accepts,
                                    .on_reply = batch_on_reply,
                                    .finish = batch_finish};

/* An answer on a receiver's channel: to the operation waiting for it. */
void kvt_flow_sender_on_reply(kvt_engine_t *e, kvt_speer_t *p, const void *data, size_t len)
{
    kvt_sreq_t *r = p->active;
    kvt_msg_t m;
    kvt_msg_err_t err = {0};
    kvt_status_t st = kvt_msg_decode(data, len, &m, &err);

    if (st != KVT_OK) {
        kvt_engine_bad_msg(e, "alloc reply", st, &err);
        return;
    }
    if (r == NULL) {
        kvt_msg_clear(&m); /* a reply nobody waits for */
        return;
    }
    if (!r->op->accepts(r, &m)) {
        kvt_engine_count(e, &e->m.bad_messages_total, 1);
        kvt_msg_clear(&m);
        return;
    }
    p->active = NULL;
    r->op->on_reply(e, p, r, &m);
    kvt_msg_clear(&m);
    speer_kick(e, p);
}

void kvt_flow_sender_poll(kvt_engine_t *e)
{
    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next) {
        for (int budget = 0; budget < 256; budget++) {
            void *data = NULL;
            size_t len = 0;
            int delim = 0;
            int hs = p->init_dealer != NULL;
            void *sock = hs ? p->init_dealer : p->dealer;
            kvt_status_t st;

            if (sock == NULL)
                break;
            st = kvt_ctrl_recv(sock, 0, NULL, NULL, &delim, &data, &len);
            if (st == KVT_ERR_TIMEOUT || st == KVT_ERR_IO) {
                if (hs && p->dealer != NULL) {
                    st = kvt_ctrl_recv(p->dealer, 0, NULL, NULL, &delim, &data, &len);
                    if (st == KVT_OK) {
                        kvt_flow_sender_on_reply(e, p, data, len);
                        kvt_free(data);
                        continue;
                    }
                }
                break;
            }
            if (st != KVT_OK) {
                kvt_engine_count(e, &e->m.bad_messages_total, 1);
                continue;
            }
            if (hs)
                kvt_flow_sender_on_hs_reply(e, p, data, len);
            else
                kvt_flow_sender_on_reply(e, p, data, len);
            kvt_free(data);
        }
    }
}

static void sweep_cb(void *arg, kvt_pending_entry_t *pe)
{
    kvt_engine_t *e = arg;
    release_pending_entry(e, pe);
    kvt_engine_count(e, &e->m.pull_expired_total, 1);
}

/* The handshake went unanswered: drop the socket, fail what waits. A timer left over from an
 * earlier handshake finds it done, or re-arms for the current one's deadline. */
static void on_hs_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_speer_t *p = t->arg;
    kvt_engine_t *e = p->eng;

    if (p->hs_state != 1)
        return;
    if (now < p->hs_deadline_ns) {
        kvt_engine_arm(e, t, p->hs_deadline_ns);
        return;
    }
    kvt_engine_count(e, &e->m.ctrl_timeouts_total, 1);
    kvt_ctrl_close(p->init_dealer);
    p->init_dealer = NULL;
    p->hs_state = 0;
    fail_queue(e, p, KVT_ERR_TIMEOUT);
}

/* The active request missed its reply. Answered ones leave the timer to fire for nothing
 * (cheaper than cancelling on every path that ends a request). */
static void on_reply_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_speer_t *p = t->arg;
    kvt_engine_t *e = p->eng;
    kvt_sreq_t *r = p->active;

    if (r == NULL)
        return;
    if (now < r->deadline_ns) {
        kvt_engine_arm(e, t, r->deadline_ns);
        return;
    }
    /* a DEALER that missed its reply is never reused */
    kvt_engine_count(e, &e->m.ctrl_timeouts_total, 1);
    kvt_ctrl_close(p->dealer);
    p->dealer = NULL;
    p->dealer_gen++;
    p->active = NULL;
    release_pages(e, r, NULL);
    sreq_finish(e, r, KVT_ERR_TIMEOUT);
    speer_kick(e, p);
}

/* Arm the pull-pending table's timer for its first TTL (entries are added with the same TTL,
 * so the head expires first). */
static void pending_arm(kvt_engine_t *e)
{
    uint64_t next = e->pending != NULL ? kvt_pending_next_deadline(e->pending) : UINT64_MAX;

    if (next != UINT64_MAX)
        kvt_engine_arm(e, &e->pending_timer, next);
    else
        pdb_timer_cancel(&e->timers, &e->pending_timer);
}

static void on_pending_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_engine_t *e = t->arg;

    if (kvt_pending_next_deadline(e->pending) <= now)
        kvt_pending_sweep(e->pending, sweep_cb, e, NULL);
    pending_arm(e);
}

void kvt_flow_sender_init(kvt_engine_t *e)
{
    pdb_timer_init(&e->pending_timer, on_pending_timer, e);
}

void kvt_flow_sender_kick_all(kvt_engine_t *e)
{
    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next)
        speer_kick(e, p); /* landing confirmations queued by completions */
}

void kvt_flow_sender_on_done_sock(kvt_engine_t *e, const void *data, size_t len)
{
    kvt_msg_t m;
    kvt_msg_err_t err = {0};
    kvt_pending_entry_t pe;
    kvt_status_t st = kvt_msg_decode(data, len, &m, &err);

    if (st != KVT_OK) {
        kvt_engine_bad_msg(e, "done socket", st, &err);
        return;
    }
    if (m.type == KVT_MSG_PULL_DONE_SIGNAL) {
        memset(&pe, 0, sizeof(pe));
        if (kvt_pending_done(e->pending, m.u.pull_done.pull_id, &pe) == KVT_OK) {
            release_pending_entry(e, &pe);
            kvt_pending_entry_clear(&pe);
        }
    } else if (m.type == KVT_MSG_CANCEL_NOTIF) {
        kvt_flow_sender_cancel(e, m.u.cancel.req_id);
    } else {
        kvt_engine_count(e, &e->m.bad_messages_total, 1);
    }
    kvt_msg_clear(&m);
}

void kvt_flow_sender_cancel(kvt_engine_t *e, const char *req_id)
{
    kvt_sgroup_t *g;
    uint32_t n = 0;

    if (!(e->role & KVT_ROLE_SENDER) || req_id == NULL || req_id[0] == '\0')
        return;
    kvt_pending_cancel(e->pending, req_id, release_pending_entry, e, &n);
    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next) {
        kvt_sreq_t **pp = &p->q_head, *last = NULL;
        while (*pp != NULL) {
            kvt_sreq_t *r = *pp;
            if (r->op != &sop_cancel && strcmp(r->req_id, req_id) == 0) {
                *pp = r->next;
                r->cancelled = 1;
                release_pages(e, r, NULL);
                sreq_finish(e, r, KVT_ERR_CANCELLED);
            } else {
                last = r;
                pp = &r->next;
            }
        }
        p->q_tail = last;
        if (p->active != NULL && p->active->op != &sop_cancel &&
            strcmp(p->active->req_id, req_id) == 0)
            p->active->cancelled = 1;
    }
    g = kvt_map_get(&e->sgroups, req_id);
    if (g != NULL) {
        g->cancelled = 1; /* no ProxyNotif for a cancelled request */
        if (g->outstanding == 0) {
            kvt_map_del(&e->sgroups, g->req_id);
            kvt_free(g->req_id);
            kvt_free(g);
        }
    }
    kvt_engine_count(e, &e->m.cancels_total, 1);
}

void kvt_flow_sender_peer_failed(kvt_engine_t *e, const char *peer_id)
{
    /* next batch to that peer runs the handshake again (peer restarted) */
    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next) {
        if (strcmp(p->peer_id, peer_id) == 0 && p->hs_state == 2)
            p->hs_state = 0;
    }
}

void kvt_flow_sender_notify(kvt_engine_t *e, const char *host, uint16_t port, const kvt_msg_t *m)
{
    kvt_speer_t *p;

    if (host == NULL || host[0] == '\0' || port == 0)
        return;
    p = speer_get(e, host, port, 0);
    if (p == NULL)
        return;
    if (m->type == KVT_MSG_CANCEL_NOTIF) {
        enqueue_cancel(p, m->u.cancel.req_id); /* answered: waits its turn */
        speer_kick(e, p);
    } else if (speer_dealer_ok(e, p)) {
        (void)kvt_ctrl_send_req(p->dealer, m);
    }
}

static void drain_cb(void *arg, kvt_pending_entry_t *pe)
{
    release_pending_entry(arg, pe);
}

static void free_group(void *arg, const char *key, void *val)
{
    kvt_sgroup_t *g = val;
    (void)arg;
    (void)key;
    kvt_free(g->req_id);
    kvt_free(g);
}

void kvt_flow_sender_fini(kvt_engine_t *e)
{
    /* pending entries point at their peer: drain them first */
    if (e->pending != NULL)
        kvt_pending_drain(e->pending, drain_cb, e);
    while (e->speers != NULL) {
        kvt_speer_t *p = e->speers;
        e->speers = p->next;
        fail_queue(e, p, KVT_ERR_CLOSED);
        if (p->active != NULL) {
            release_pages(e, p->active, NULL);
            sreq_finish(e, p->active, KVT_ERR_CLOSED);
        }
        kvt_ctrl_close(p->dealer);
        kvt_ctrl_close(p->init_dealer);
        kvt_free(p);
    }
    if (e->sgroups.buckets != NULL)
        kvt_map_each(&e->sgroups, free_group, NULL);
}
