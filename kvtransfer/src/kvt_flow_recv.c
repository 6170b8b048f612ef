/*
 * kvt_flow_recv.c - the receiver side: the alloc ROUTER (AllocRequest,
 * PullReadyNotif, ProxyNotif from the sender, CancelNotif, ReserveRequest),
 * the transport handshake ROUTER, pull-eager reads, and the user calls on
 * the landed data (load / lookup / release / wait for a request).
 *
 * Every request on the ROUTER gets a reply, even on error. When the pool
 * is full the request is parked (no busy loop) and retried until the
 * backoff TTL passes; then the receiver gives what it has (partial) or
 * answers alloc_failed.
 *
 * A chunk becomes visible (LANDED) only when its bytes are here: after the
 * sender's ProxyNotif for push (sent once every batch's writes completed),
 * after our own read for pull-eager.
 */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "kvt/kvt_uuid.h"
#include "kvt_engine_int.h"

/* ---- entries ------------------------------------------------------------ */

static void grant_writers(kvt_engine_t *e, const char *writers, kvt_page_t page, int revoke);

static void rpull_put(kvt_rpull_t *pl)
{
    if (pl == NULL || pl->refs > 0 || pl->remaining > 0)
        return;
    kvt_free(pl->pull_id);
    kvt_free(pl->req_id);
    kvt_free(pl->sender_id);
    kvt_free(pl->done_url);
    kvt_free(pl);
}

static void send_done_signal(kvt_engine_t *e, kvt_rpull_t *pl)
{
    kvt_msg_t m;

    if (pl->done_sent)
        return;
    pl->done_sent = 1;
    kvt_msg_init(&m, KVT_MSG_PULL_DONE_SIGNAL);
    m.u.pull_done.pull_id = pl->pull_id;
    kvt_engine_send_done(e, pl->done_url, &m); /* any thread: a release may finish a pull */
}

/* One key of <pl> will not be read (any more): done signal after the last. */
static void rpull_key_done(kvt_engine_t *e, kvt_rpull_t *pl)
{
    if (pl->remaining > 0 && --pl->remaining == 0)
        send_done_signal(e, pl);
}

/* Detach <r> from its pull. <consumed>: its key counts as done. */
static void rent_drop_pull(kvt_engine_t *e, kvt_rent_t *r)
{
    kvt_rpull_t *pl = r->pull;

    if (pl == NULL)
        return;
    r->pull = NULL;
    if (r->state == RENT_PROXY || r->state == RENT_READING || r->state == RENT_CONSUMED)
        rpull_key_done(e, pl);
    pl->refs--;
    rpull_put(pl);
}

static void rent_link(kvt_rreq_t *q, kvt_rent_t *r)
{
    r->rq = q;
    r->rq_prev = NULL;
    r->rq_next = q->ents;
    if (q->ents != NULL)
        q->ents->rq_prev = r;
    q->ents = r;
    q->nents++;
}

static void rent_unlink(kvt_rent_t *r)
{
    kvt_rreq_t *q = r->rq;

    if (q == NULL)
        return;
    if (r->rq_prev != NULL)
        r->rq_prev->rq_next = r->rq_next;
    else
        q->ents = r->rq_next;
    if (r->rq_next != NULL)
        r->rq_next->rq_prev = r->rq_prev;
    q->nents--;
    r->rq = NULL;
    r->rq_next = r->rq_prev = NULL;
}

void kvt_rent_free_locked(kvt_engine_t *e, kvt_rent_t *r)
{
    kvt_guard_claim_locked(e, r); /* off its sender's quota and the expiry queue */
    rent_unlink(r);
    kvt_map_del(&e->rents, r->key);
    if (r->granted && r->page != KVT_PAGE_NONE)
        grant_writers(e, r->writer, r->page, 1);
    if (r->page != KVT_PAGE_NONE) {
        kvt_pool_free(e->pool, &r->page, 1);
        kvt_engine_wake(e); /* a request parked for space retries now, not at a poll */
    }
    rent_drop_pull(e, r);
    kvt_free(r->key);
    kvt_free(r->req_id);
    kvt_free(r->writer);
    kvt_free(r);
}

/* Free <r> now, or when its lock/read ends. */
static void rent_release_locked(kvt_engine_t *e, kvt_rent_t *r)
{
    if (r->locks > 0 || r->busy || r->state == RENT_READING)
        r->release_pending = 1;
    else
        kvt_rent_free_locked(e, r);
}

static kvt_rreq_t *rreq_get(kvt_engine_t *e, const char *req_id, int create)
{
    kvt_rreq_t *q;

    if (req_id == NULL || req_id[0] == '\0')
        return NULL;
    q = kvt_map_get(&e->rreqs, req_id);
    if (q != NULL || !create)
        return q;
    q = kvt_calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->req_id = kvt_strdup(req_id);
    if (q->req_id == NULL || kvt_map_put(&e->rreqs, req_id, q) != KVT_OK) {
        kvt_free(q->req_id);
        kvt_free(q);
        return NULL;
    }
    q->touched_ns = kvt_engine_now(e);
    /* forgotten a TTL after its last use if nothing holds it (sweep timer) */
    kvt_engine_due_lower(e, &e->sweep_due,
                         q->touched_ns + kvt_sec_to_ns(e->cfg.pd_pull_pending_ttl));
    return q;
}

/* Answer the sender's "landed?" (ProxyNotif echo). */
static void rreq_ack(kvt_engine_t *e, kvt_rreq_t *q)
{
    kvt_msg_t m;

    if (q->ack_ident == NULL)
        return;
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    m.u.proxy_notif.req_id = q->req_id;
    kvt_engine_router_reply(e, q->ack_ident, q->ack_ident_len, q->ack_delim, &m);
    kvt_free(q->ack_ident);
    q->ack_ident = NULL;
}

static void rreq_free(kvt_engine_t *e, kvt_rreq_t *q, kvt_status_t waiters_st)
{
    rreq_ack(e, q);         /* nobody waits forever, whatever happened to the request */
    while (q->ents != NULL) /* entries still being released outlive the record */
        rent_unlink(q->ents);
    kvt_map_del(&e->rreqs, q->req_id);
    for (uint32_t i = 0; i < q->nwaiters; i++)
        kvt_task_complete(e, q->waiters[i], waiters_st);
    kvt_free(q->waiters);
    kvt_free(q->waiter_deadline);
    kvt_free(q->req_id);
    kvt_free(q);
}

/* Complete the waiters of <q> if all its chunks landed. */
static void rreq_check(kvt_engine_t *e, kvt_rreq_t *q)
{
    if (q == NULL || !q->notified || q->reading > 0)
        return;
    for (uint32_t i = 0; i < q->nwaiters; i++)
        kvt_task_complete(e, q->waiters[i], KVT_OK);
    q->nwaiters = 0;
    (void)kvt_reserve_release(e->reserve, q->req_id);
    rreq_ack(e, q);
}

/* ---- replies ------------------------------------------------------------ */

typedef struct rctx {
    void *sock;
    const void *ident;
    size_t ident_len;
    int delim;
    kvt_flavour_t flv; /* how this sender wants its answers */
    const char *src;   /* who it counts as for pd_alloc_quota (kvt_alloc_guard.c) */
} rctx_t;

static void reply(kvt_engine_t *e, const rctx_t *c, const kvt_msg_t *m)
{
    if (kvt_ctrl_reply(c->sock, c->ident, c->ident_len, c->delim, m) != KVT_OK)
        kvt_engine_count(e, &e->m.bad_messages_total, 1);
}

/* Which LMCache flavour sent <m> (docs/protocols/lmcache-wire.md). A libkvt sender
 * says so (kvt_ext); pd_peer_flavour pins the rest; otherwise the async
 * backend is told by the fields only it encodes (msgspec writes defaults
 * too, so its AllocRequest always carries req_id / is_last_batch /
 * total_chunks), and a plain AllocRequest is the sync backend's. Pull
 * messages exist only in LMCache-Ascend. */
static kvt_flavour_t flavour_of(const kvt_engine_t *e, const kvt_msg_t *m)
{
    if (m->type == KVT_MSG_PULL_READY_NOTIF)
        return m->u.pull_ready.kvt_ext >= 1 ? KVT_FLAVOUR_LIBKVT : KVT_FLAVOUR_ASCEND;
    if (m->u.alloc_req.kvt_ext >= 1)
        return KVT_FLAVOUR_LIBKVT;
    if (e->flavour != KVT_FLAVOUR_AUTO)
        return e->flavour;
    if (kvt_msg_has_field(m, "req_id") || kvt_msg_has_field(m, "is_last_batch") ||
        kvt_msg_has_field(m, "total_chunks"))
        return KVT_FLAVOUR_ASYNC;
    return KVT_FLAVOUR_SYNC;
}

/* The reply skeleton for a push answer in <flv>'s terms. */
static void alloc_reply_init(kvt_msg_t *m, kvt_flavour_t flv)
{
    switch (flv) {
    case KVT_FLAVOUR_ASYNC:
        kvt_msg_init(m, KVT_MSG_ALLOC_RESPONSE_ASYNC);
        break;
    case KVT_FLAVOUR_ASCEND:
        kvt_msg_init(m, KVT_MSG_ASCEND_ALLOC_RESPONSE);
        break;
    case KVT_FLAVOUR_LIBKVT:
        kvt_msg_init(m, KVT_MSG_ASCEND_ALLOC_RESPONSE);
        m->u.alloc_resp.kvt_ext = KVT_MSG_EXT_VERSION;
        break;
    default:
        kvt_msg_init(m, KVT_MSG_ALLOC_RESPONSE);
        break;
    }
}

/* Nothing allocated: answer so the sender neither waits nor writes.
 *   pull             PullReadyDoneAck{alloc_failed}
 *   Ascend / libkvt  AscendAllocResponse{alloc_failed, empty lists} (the
 *                    LMCache-Ascend receiver's own failure answer)
 *   async            AllocResponse{remote_indexes: -1 per key} (what
 *                    PDBackendAsync answers on any error; one -1 aborts)
 *   sync             AllocResponse{remote_indexes: -1 per key} (upstream has
 *                    no failure answer; the sender's write of -1 fails) */
static void reply_alloc_failed(kvt_engine_t *e, const rctx_t *c, kvt_msg_type_t req, uint32_t n)
{
    kvt_msg_t m;

    if (req == KVT_MSG_PULL_READY_NOTIF) {
        kvt_msg_init(&m, KVT_MSG_PULL_READY_DONE_ACK);
        m.u.pull_ack.alloc_failed = 1;
        if (c->flv == KVT_FLAVOUR_LIBKVT)
            m.u.pull_ack.kvt_ext = KVT_MSG_EXT_VERSION;
    } else {
        alloc_reply_init(&m, c->flv);
        if (m.type == KVT_MSG_ASCEND_ALLOC_RESPONSE) {
            m.u.alloc_resp.alloc_failed = 1;
        } else {
            for (uint32_t i = 0; i < (n > 0 ? n : 1); i++)
                if (kvt_int_list_push(&m.u.alloc_resp.remote_indexes, -1) != KVT_OK)
                    break;
        }
    }
    reply(e, c, &m);
    kvt_msg_clear(&m);
    kvt_engine_count(e, &e->m.alloc_failures_total, n);
}

/* "<sender>-to-<receiver>" -> sender. */
static void ident_sender(const void *ident, size_t len, char *out, size_t cap)
{
    char buf[KVT_TL_PEER_ID_MAX + 320];
    char *cut = NULL, *p;

    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, ident, len);
    buf[len] = '\0';
    for (p = strstr(buf, "-to-"); p != NULL; p = strstr(p + 1, "-to-"))
        cut = p;
    if (cut != NULL)
        *cut = '\0';
    len = strnlen(buf, cap - 1);
    memcpy(out, buf, len);
    out[len] = '\0';
}

/* ---- WRITE grants ----------------------------------------------------------- */

/* Grant (or revoke) WRITE on <page> to every id of the '\n'-separated
 * <writers>. */
static void grant_writers(kvt_engine_t *e, const char *writers, kvt_page_t page, int revoke)
{
    const char *p = writers;

    while (p != NULL && *p != '\0') {
        const char *nl = strchr(p, '\n');
        size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
        char id[KVT_TL_PEER_ID_MAX + 1];
        if (n > 0 && n <= KVT_TL_PEER_ID_MAX) {
            memcpy(id, p, n);
            id[n] = '\0';
            (void)kvt_engine_grant(e, id, e->pool, &page, 1, KVT_TL_ACCESS_WRITE, revoke);
        }
        p = nl != NULL ? nl + 1 : NULL;
    }
}

typedef struct join_ctx {
    char *s;
    size_t len, cap;
} join_ctx_t;

static void join_peer(void *arg, const char *key, void *val)
{
    join_ctx_t *j = arg;
    size_t n = strlen(key);
    (void)val;
    if (j->s == NULL || j->len + n + 2 > j->cap)
        return; /* bounded: KVT_HS_PEERS_MAX ids */
    if (j->len > 0)
        j->s[j->len++] = '\n';
    memcpy(j->s + j->len, key, n);
    j->len += n;
    j->s[j->len] = '\0';
}

#define KVT_HS_PEERS_MAX 64u

/* Who may write the pages of a request from <c>: a libkvt sender is named
 * by its DEALER identity (and ran our handshake under that id). An upstream
 * sender's control identity names nothing on the data plane (a REQ socket
 * has a random one), so every peer that ran the transport handshake here
 * may write them, as with NIXL, where any connected agent can. Returns a
 * kvt_malloc'd string, "" when nobody. */
static char *writers_for(kvt_engine_t *e, const rctx_t *c, const char *sender)
{
    join_ctx_t j = {0};

    if (c->flv == KVT_FLAVOUR_LIBKVT)
        return kvt_strdup(sender);
    j.cap = KVT_HS_PEERS_MAX * (KVT_TL_PEER_ID_MAX + 1) + 1;
    j.s = kvt_malloc(j.cap);
    if (j.s == NULL)
        return NULL;
    j.s[0] = '\0';
    kvt_map_each(&e->hs_peers, join_peer, &j);
    return j.s;
}

/* ---- tombstones of cancelled requests ------------------------------------ */

#define KVT_TOMBS_MAX 65536u

/* Remember that <req_id> was cancelled (rx_lock held): a prefill that kept
 * computing must not allocate pages for it afterwards. */
static void tomb_add(kvt_engine_t *e, const char *req_id)
{
    uint64_t *exp = kvt_map_get(&e->tombs, req_id);
    uint64_t until = kvt_engine_now(e) + kvt_sec_to_ns(e->cfg.pd_pull_pending_ttl);

    if (exp != NULL) {
        *exp = until;
        return;
    }
    if (e->tombs.count >= KVT_TOMBS_MAX || (exp = kvt_malloc(sizeof(*exp))) == NULL)
        return;
    *exp = until;
    if (kvt_map_put(&e->tombs, req_id, exp) != KVT_OK)
        kvt_free(exp);
    else
        kvt_engine_due_lower(e, &e->sweep_due, until);
}

static int tomb_has(kvt_engine_t *e, const char *req_id)
{
    uint64_t *exp;

    if (req_id == NULL || req_id[0] == '\0')
        return 0;
    exp = kvt_map_get(&e->tombs, req_id);
    return exp != NULL && kvt_engine_now(e) < *exp;
}

typedef struct tomb_sweep {
    uint64_t now, next; /* next: the earliest expiry of those that stay */
    char **v;
    uint32_t n, cap;
} tomb_sweep_t;

static void collect_tomb(void *arg, const char *key, void *val)
{
    tomb_sweep_t *ts = arg;
    if (ts->now < *(uint64_t *)val) {
        if (*(uint64_t *)val < ts->next)
            ts->next = *(uint64_t *)val;
        return;
    }
    if (ts->n == ts->cap) {
        uint32_t nc = ts->cap ? ts->cap * 2 : 64;
        char **nv = kvt_realloc(ts->v, nc * sizeof(*nv));
        if (nv == NULL)
            return;
        ts->v = nv;
        ts->cap = nc;
    }
    ts->v[ts->n++] = (char *)key;
}

/* Returns the earliest expiry of the tombstones left (UINT64_MAX: none). */
static uint64_t tomb_sweep_locked(kvt_engine_t *e, uint64_t now)
{
    tomb_sweep_t ts = {.now = now, .next = UINT64_MAX};

    kvt_map_each(&e->tombs, collect_tomb, &ts);
    for (uint32_t i = 0; i < ts.n; i++) {
        char *key = kvt_strdup(ts.v[i]); /* the map owns ts.v[i] */
        if (key != NULL)
            kvt_free(kvt_map_del(&e->tombs, key));
        kvt_free(key);
    }
    kvt_free(ts.v);
    return ts.next;
}

/* A late AllocRequest / PullReadyNotif of a cancelled request: nothing is
 * allocated and the sender is told without tripping its breaker (pull and
 * dedup flavours: every key "already sent", so it unpins at once and writes
 * nothing; async and libkvt push: every slot -1, the sender drops the
 * batch). */
static void reply_cancelled(kvt_engine_t *e, const rctx_t *c, const kvt_msg_t *msg)
{
    kvt_msg_t m;
    uint32_t n =
        msg->type == KVT_MSG_PULL_READY_NOTIF ? msg->u.pull_ready.keys.n : msg->u.alloc_req.keys.n;

    if (msg->type == KVT_MSG_PULL_READY_NOTIF) {
        kvt_msg_init(&m, KVT_MSG_PULL_READY_DONE_ACK);
        if (c->flv == KVT_FLAVOUR_LIBKVT)
            m.u.pull_ack.kvt_ext = KVT_MSG_EXT_VERSION;
        for (uint32_t i = 0; i < n; i++)
            if (kvt_int_list_push(&m.u.pull_ack.already_sent_indexes, i) != KVT_OK)
                break;
    } else {
        alloc_reply_init(&m, c->flv);
        for (uint32_t i = 0; i < n; i++) {
            kvt_status_t st;
            if (c->flv == KVT_FLAVOUR_SYNC || c->flv == KVT_FLAVOUR_ASCEND) {
                st = kvt_int_list_push(&m.u.alloc_resp.already_sent_indexes, i);
            } else {
                st = kvt_int_list_push(&m.u.alloc_resp.remote_indexes, -1);
                if (st == KVT_OK && c->flv == KVT_FLAVOUR_LIBKVT)
                    st = kvt_str_list_push(&m.u.alloc_resp.remote_buffer_uuids, "");
            }
            if (st != KVT_OK)
                break;
        }
    }
    reply(e, c, &m);
    kvt_msg_clear(&m);
}

/* LMCache-Ascend's sender_done_url is "host:port" (its receiver adds the
 * scheme); older libkvt senders wrote "tcp://host:port". Both are taken. */
static int done_url_ok(const char *url)
{
    const char *hp = strncmp(url, "tcp://", 6) == 0 ? url + 6 : url;
    const char *colon = strrchr(hp, ':');

    return colon != NULL && colon > hp && colon[1] != '\0' && strlen(url) <= 280 &&
           strstr(hp, "://") == NULL;
}

/* ---- AllocRequest / PullReadyNotif -------------------------------------- */

/* One AllocRequest / PullReadyNotif on its way through the stages
 * validate -> dedup -> reserve/allocate -> entries -> reply -> post. */
typedef struct alloc_job {
    kvt_msg_t *msg;
    rctx_t c;
    int pull, delay, dedup, all_or_nothing;
    const kvt_str_list_t *keys;
    const char *req_id;
    char sender[KVT_TL_PEER_ID_MAX + 1];
    kvt_chunk_geom_t g;
    uint32_t n, nnew, nalloc, nmade, nfailed;
    uint32_t *newidx; /* [nnew] key index of each new chunk */
    uint32_t *first;  /* [n] first index of the same key in this request */
    uint32_t *slot;   /* [n] position in newidx/pages, UINT32_MAX if none */
    kvt_page_t *pages;
    kvt_rent_t **made;
    uint8_t *already; /* bitmap: held here already / repeated key */
    kvt_rpull_t *pl;
    char *writers;
} alloc_job_t;

enum { ALLOC_DONE = 0, ALLOC_PARK, ALLOC_REFUSE, ALLOC_PARK_QUOTA };

/* What handle_alloc says of a request: answered, or to park (for space, for its quota). */
enum { PARK_NONE = 0, PARK_SPACE, PARK_QUOTA };

/* Requests of one sender waiting for its quota at once (park): a legit sender has one in
 * flight per channel (REQ, or a DEALER awaiting its answer), a flood gets answered. */
#define KVT_QUOTA_PARKED_MAX 8u

static void alloc_job_free(alloc_job_t *j)
{
    kvt_free(j->writers);
    kvt_free(j->newidx);
    kvt_free(j->first);
    kvt_free(j->slot);
    kvt_free(j->pages);
    kvt_free(j->made);
    kvt_free(j->already);
}

/* Validate: the fields the sender controls, the chunk geometry against our
 * pages. KVT_OK, or the refusal was logged (the caller answers). */
static kvt_status_t alloc_validate(kvt_engine_t *e, alloc_job_t *j)
{
    kvt_msg_t *msg = j->msg;
    kvt_status_t st;

    if (j->pull) {
        kvt_msg_pull_ready_notif_t *pr = &msg->u.pull_ready;
        const char *bar = strchr(pr->pull_id, '|');
        j->req_id = bar != NULL ? bar + 1 : "";
        snprintf(j->sender, sizeof(j->sender), "%s", pr->sender_id);
        st = kvt_chunk_geom_init(&j->g, (int32_t)pr->fmt, pr->shape.v, pr->shape.n, pr->dtype);
        if (st == KVT_OK &&
            (pr->sender_buffer_uuids.n != j->n || pr->sender_mem_indexes.n != j->n ||
             j->sender[0] == '\0' || pr->pull_id[0] == '\0' || !done_url_ok(pr->sender_done_url))) {
            kvt_engine_refuse(e,
                              "PullReadyNotif from %s: inconsistent lists or bad done url '%.64s'",
                              j->sender, pr->sender_done_url);
            st = KVT_ERR_MSG_FIELD;
        }
    } else {
        j->req_id = msg->u.alloc_req.req_id;
        ident_sender(j->c.ident, j->c.ident_len, j->sender, sizeof(j->sender));
        st = kvt_chunk_geom_init(&j->g, (int32_t)msg->u.alloc_req.fmt, msg->u.alloc_req.shape.v,
                                 msg->u.alloc_req.shape.n, msg->u.alloc_req.dtype);
    }
    if (st != KVT_OK) {
        kvt_engine_refuse(e, "%s (%s sender %s): bad chunk geometry (%s)",
                          kvt_msg_type_name(msg->type), kvt_flavour_name(j->c.flv), j->sender,
                          kvt_status_name(st));
        return st;
    }
    if (kvt_chunk_bytes(&j->g) > e->page_size) {
        /* pages are sized for a whole LMCache chunk (all layers x chunk tokens) */
        kvt_engine_refuse(e,
                          "%s (%s sender %s, req %.64s): a chunk of %zu bytes does not fit a "
                          "%zu-byte page (size pages from chunk_size x layers x hidden x dtype)",
                          kvt_msg_type_name(msg->type), kvt_flavour_name(j->c.flv), j->sender,
                          j->req_id, kvt_chunk_bytes(&j->g), e->page_size);
        return KVT_ERR_LIMIT;
    }
    return KVT_OK;
}

static kvt_status_t alloc_bufs(alloc_job_t *j)
{
    uint32_t n = j->n;

    j->newidx = kvt_calloc(n + 1, sizeof(*j->newidx));
    j->first = kvt_calloc(n + 1, sizeof(*j->first));
    j->slot = kvt_calloc(n + 1, sizeof(*j->slot));
    j->pages = kvt_calloc(n + 1, sizeof(*j->pages));
    j->made = kvt_calloc(n + 1, sizeof(*j->made));
    j->already = kvt_calloc(kvt_bitmap_bytes(n) + 1, 1);
    if (j->newidx == NULL || j->first == NULL || j->slot == NULL || j->pages == NULL ||
        j->made == NULL || j->already == NULL)
        return KVT_ERR_NOMEM;
    return KVT_OK;
}

/* Dedup (rx_lock held): which keys need a new chunk. A key twice in one
 * request gets one page; a key held here is "already sent" (dedup
 * flavours) or replaced (async, as PDBackendAsync.put() does) unless the
 * held one is in use. */
static kvt_status_t alloc_dedup_locked(kvt_engine_t *e, alloc_job_t *j)
{
    kvt_map_t seen;

    if (kvt_map_init(&seen, j->n / 2 + 16) != KVT_OK)
        return KVT_ERR_NOMEM;
    for (uint32_t i = 0; i < j->n; i++) {
        const char *key = j->keys->v[i];
        kvt_rent_t *r = kvt_map_get(&e->rents, key);
        uintptr_t prev = (uintptr_t)kvt_map_get(&seen, key);

        j->first[i] = i;
        j->slot[i] = UINT32_MAX;
        if (prev != 0) { /* async answers the first index twice */
            j->first[i] = (uint32_t)(prev - 1);
            kvt_bitmap_set(j->already, i);
            continue;
        }
        (void)kvt_map_put(&seen, key, (void *)(uintptr_t)(i + 1));
        if (r != NULL && j->dedup && r->state != RENT_CONSUMED) {
            kvt_bitmap_set(j->already, i);
            continue;
        }
        if (r != NULL) {
            if (r->locks > 0 || r->busy || r->state == RENT_READING) {
                kvt_engine_refuse(e, "AllocRequest (%s sender %s): key %.128s is in use here",
                                  kvt_flavour_name(j->c.flv), j->sender, key);
                j->nfailed++;
                continue;
            }
            kvt_rent_free_locked(e, r);
        }
        j->slot[i] = j->nnew;
        j->newidx[j->nnew++] = i;
    }
    kvt_map_fini(&seen);
    return j->nfailed > 0 && j->all_or_nothing ? KVT_ERR_BUSY : KVT_OK;
}

static void rpull_free_fields(kvt_rpull_t *pl)
{
    kvt_free(pl->pull_id);
    kvt_free(pl->req_id);
    kvt_free(pl->sender_id);
    kvt_free(pl->done_url);
    kvt_free(pl);
}

static kvt_rpull_t *rpull_new(const kvt_msg_pull_ready_notif_t *pr, const char *req_id,
                              const char *sender)
{
    kvt_rpull_t *pl = kvt_calloc(1, sizeof(*pl));

    if (pl == NULL)
        return NULL;
    pl->pull_id = kvt_strdup(pr->pull_id);
    pl->req_id = kvt_strdup(req_id);
    pl->sender_id = kvt_strdup(sender);
    pl->done_url = kvt_strdup(pr->sender_done_url);
    if (pl->pull_id == NULL || pl->req_id == NULL || pl->sender_id == NULL ||
        pl->done_url == NULL) {
        rpull_free_fields(pl);
        return NULL;
    }
    return pl;
}

/* Reserve/allocate (rx_lock held): pages for the new chunks (none in
 * pull-delay: reads happen at load), the writers to grant (push) or the
 * pull record. ALLOC_PARK when the pool is full and the request may wait. */
static int alloc_reserve_locked(kvt_engine_t *e, alloc_job_t *j, int final)
{
    const char *what = kvt_msg_type_name(j->msg->type), *flv = kvt_flavour_name(j->c.flv);
    kvt_status_t st = KVT_OK;

    if (!j->delay && j->nnew > kvt_pool_total_pages(e->pool)) {
        /* larger than the whole buffer: fail fast, no waiting */
        kvt_engine_refuse(e,
                          "%s (%s sender %s, req %.64s): %u chunks > the whole buffer (%u pages)",
                          what, flv, j->sender, j->req_id, j->nnew, kvt_pool_total_pages(e->pool));
        return ALLOC_REFUSE;
    }
    for (uint32_t k = 0; k < j->nnew; k++)
        j->pages[k] = KVT_PAGE_NONE;
    if (!j->delay && j->nnew > 0) {
        uint32_t want = j->nnew, room = kvt_guard_room_locked(e, j->c.src);

        if (want > room && !final)
            return ALLOC_PARK_QUOTA; /* until its own entries are claimed (or the TTL) */
        if (want > room) {
            /* The sender holds its share of the pool unclaimed: refused as a full pool refuses;
             * a libkvt sender takes a partial grant of what is left. */
            uint32_t cut = j->all_or_nothing || room == 0 ? want : want - room;
            kvt_engine_count(e, &e->m.alloc_quota_refused_total, cut);
            kvt_engine_refuse(e,
                              "%s (%s sender %s, req %.64s): %u chunks over the sender's quota "
                              "(%u of its unclaimed pages left; pd_alloc_quota %.3g)",
                              what, flv, j->c.src, j->req_id, cut, room, e->cfg.pd_alloc_quota);
            if (cut == want)
                return ALLOC_REFUSE;
            want = room;
        }
        st = kvt_reserve_alloc(e->reserve, j->req_id, want,
                               final && !j->all_or_nothing ? KVT_ALLOC_PARTIAL : 0, j->pages, NULL,
                               &j->nalloc);
        if (st == KVT_ERR_NOSPACE && !final)
            return ALLOC_PARK;
        if (st != KVT_OK || j->nalloc == 0) {
            kvt_engine_refuse(
                e, "%s (%s sender %s, req %.64s): no space for %u chunks after %.1fs (%s)", what,
                flv, j->sender, j->req_id, j->nnew, e->cfg.pd_alloc_fail_backoff_ttl,
                kvt_status_name(st));
            return ALLOC_REFUSE;
        }
        if (j->nalloc < want) { /* the pool's shortfall (a quota cut was counted above) */
            kvt_engine_count(e, &e->m.alloc_failures_total, want - j->nalloc);
            kvt_engine_refuse(e, "%s (libkvt sender %s, req %.64s): %u of %u chunks granted", what,
                              j->sender, j->req_id, j->nalloc, j->nnew);
        }
    }
    if (!j->pull && j->nnew > 0)
        j->writers = writers_for(e, &j->c, j->sender);
    if (j->pull)
        j->pl = rpull_new(&j->msg->u.pull_ready, j->req_id, j->sender);
    if ((!j->pull && j->nnew > 0 && j->writers == NULL) || (j->pull && j->pl == NULL)) {
        if (j->nalloc > 0)
            kvt_pool_free(e->pool, j->pages, j->nnew);
        return ALLOC_REFUSE;
    }
    return ALLOC_DONE;
}

static void rent_free_fields(kvt_rent_t *r)
{
    kvt_free(r->key);
    kvt_free(r->req_id);
    kvt_free(r->writer);
    kvt_free(r);
}

/* A new entry for <key> in the rents map (rx_lock held), NULL on no memory. */
static kvt_rent_t *rent_new_locked(kvt_engine_t *e, const char *key, const char *req_id,
                                   const char *writer)
{
    kvt_rent_t *r = kvt_calloc(1, sizeof(*r));

    if (r == NULL)
        return NULL;
    r->key = kvt_strdup(key);
    r->req_id = kvt_strdup(req_id);
    r->writer = kvt_strdup(writer);
    if (r->key == NULL || r->req_id == NULL || r->writer == NULL ||
        kvt_map_put(&e->rents, key, r) != KVT_OK) {
        rent_free_fields(r);
        return NULL;
    }
    return r;
}

/* Pull: where the sender holds key <i>, and the entry joins the pull. */
static kvt_status_t rent_set_pull_ref(kvt_engine_t *e, alloc_job_t *j, kvt_rent_t *r, uint32_t i)
{
    const kvt_msg_pull_ready_notif_t *pr = &j->msg->u.pull_ready;
    kvt_uuid_t u;

    if (kvt_uuid_parse(pr->sender_buffer_uuids.v[i], strlen(pr->sender_buffer_uuids.v[i]), &u) !=
            KVT_OK ||
        pr->sender_mem_indexes.v[i] < 0) {
        kvt_engine_refuse(e, "PullReadyNotif from %s: bad buffer ref for key %.128s", j->sender,
                          j->keys->v[i]);
        return KVT_ERR_MSG_FIELD;
    }
    snprintf(r->ruuid, sizeof(r->ruuid), "%s", pr->sender_buffer_uuids.v[i]);
    r->roff = (uint64_t)pr->sender_mem_indexes.v[i] * e->page_size;
    r->pull = j->pl;
    j->pl->refs++;
    j->pl->remaining++;
    r->state = j->delay ? RENT_PROXY : RENT_READING;
    return KVT_OK;
}

/* Undo the entries of a refused all-or-nothing request (rx_lock held); no
 * PullDoneSignal: the alloc_failed answer releases the sender. */
static void alloc_rollback_locked(kvt_engine_t *e, alloc_job_t *j)
{
    if (j->pl != NULL) {
        j->pl->done_sent = 1;
        j->pl->refs++;
    }
    for (uint32_t k = 0; k < j->nmade; k++)
        kvt_rent_free_locked(e, j->made[k]);
    if (j->pl != NULL) {
        j->pl->refs--;
        j->pl->remaining = 0;
        rpull_put(j->pl);
        j->pl = NULL;
    }
}

/* Entries (rx_lock held): one per new chunk that got a page (or a proxy in
 * pull-delay). KVT_ERR_BUSY when an upstream sender must get nothing. */
static kvt_status_t alloc_entries_locked(kvt_engine_t *e, alloc_job_t *j)
{
    int32_t last_toks =
        j->pull ? j->msg->u.pull_ready.last_chunk_toks : j->msg->u.alloc_req.last_chunk_toks;

    kvt_rreq_t *q = rreq_get(e, j->req_id, 1);

    if (q == NULL && j->req_id[0] != '\0' && j->nnew > 0) {
        for (uint32_t k = 0; k < j->nnew && !j->delay; k++)
            if (j->pages[k] != KVT_PAGE_NONE)
                kvt_pool_free(e->pool, &j->pages[k], 1);
        if (j->pl != NULL)
            rpull_free_fields(j->pl);
        j->pl = NULL;
        j->nfailed = j->nnew; /* entries nobody could find by request: none */
        return KVT_ERR_NOMEM;
    }
    for (uint32_t k = 0; k < j->nnew; k++) {
        uint32_t i = j->newidx[k];
        kvt_rent_t *r = NULL;

        if (j->delay || j->pages[k] != KVT_PAGE_NONE)
            r = rent_new_locked(e, j->keys->v[i], j->req_id, j->pull ? j->sender : j->writers);
        if (r == NULL) {
            if (j->pages[k] != KVT_PAGE_NONE)
                kvt_pool_free(e->pool, &j->pages[k], 1);
            j->pages[k] = KVT_PAGE_NONE;
            j->nfailed++;
            continue;
        }
        if (q != NULL)
            rent_link(q, r);
        r->page = j->delay ? KVT_PAGE_NONE : j->pages[k];
        r->len = (i + 1 == j->n) ? kvt_chunk_bytes_toks(&j->g, last_toks) : kvt_chunk_bytes(&j->g);
        if (j->pull) {
            if (rent_set_pull_ref(e, j, r, i) != KVT_OK) {
                kvt_rent_free_locked(e, r); /* frees its page */
                j->pages[k] = KVT_PAGE_NONE;
                j->nfailed++;
                continue;
            }
        } else {
            /* A libkvt sender confirms the landing (ProxyNotif echo). An
             * upstream sender never tells the receiver: as in LMCache, the
             * chunk is visible at once and the proxy holds the decode back
             * until the sender's ProxyNotif reached it. */
            r->state = j->c.flv == KVT_FLAVOUR_LIBKVT && j->req_id[0] != '\0' ? RENT_ALLOCATED
                                                                              : RENT_LANDED;
            if (r->writer[0] != '\0') {
                grant_writers(e, r->writer, r->page, 0);
                r->granted = 1;
            }
        }
        /* the sender's until the consumer claims it, and only for pd_alloc_ttl */
        kvt_guard_track_locked(e, r, j->c.src);
        j->made[j->nmade++] = r;
    }
    if (j->nfailed > 0 && j->all_or_nothing) {
        alloc_rollback_locked(e, j);
        return KVT_ERR_BUSY;
    }
    return KVT_OK;
}

/* Reply (rx_lock held while building): in the sender's terms. */
static void alloc_reply_build_locked(kvt_engine_t *e, const alloc_job_t *j, kvt_msg_t *m)
{
    if (j->pull) {
        kvt_msg_init(m, KVT_MSG_PULL_READY_DONE_ACK);
        if (j->c.flv == KVT_FLAVOUR_LIBKVT)
            m->u.pull_ack.kvt_ext = KVT_MSG_EXT_VERSION;
        for (uint32_t i = 0; i < j->n; i++)
            if (kvt_bitmap_test(j->already, i))
                kvt_int_list_push(&m->u.pull_ack.already_sent_indexes, i);
        return;
    }
    alloc_reply_init(m, j->c.flv);
    for (uint32_t i = 0; i < j->n; i++) {
        uint32_t k = j->slot[j->first[i]];
        kvt_page_t pg = k != UINT32_MAX ? j->pages[k] : KVT_PAGE_NONE;
        char uuid[KVT_UUID_STR_LEN + 1] = "";
        kvt_tl_region_t *reg;
        uint64_t off = 0;
        int64_t idx = -1;

        if (j->dedup && kvt_bitmap_test(j->already, i)) {
            kvt_int_list_push(&m->u.alloc_resp.already_sent_indexes, i);
            continue;
        }
        if (pg != KVT_PAGE_NONE) {
            if (j->c.flv == KVT_FLAVOUR_ASCEND || j->c.flv == KVT_FLAVOUR_LIBKVT) {
                /* (region uuid, page in that region) */
                if (kvt_engine_region_of(e, e->pool, pg, &reg, &off, uuid) == KVT_OK)
                    idx = (int64_t)(off / e->page_size);
            } else {
                idx = (int64_t)pg; /* one index over the whole buffer, as LMCache's */
            }
        }
        kvt_int_list_push(&m->u.alloc_resp.remote_indexes, idx);
        if (m->type == KVT_MSG_ASCEND_ALLOC_RESPONSE)
            kvt_str_list_push(&m->u.alloc_resp.remote_buffer_uuids, uuid);
    }
}

/* Post (pull-eager): read every chunk of the pull now. */
static void alloc_post_reads(kvt_engine_t *e, alloc_job_t *j)
{
    kvt_rpull_t *pl = j->pl;
    kvt_rread_t *rd = kvt_calloc(1, sizeof(*rd));
    kvt_tl_xfer_t *x = kvt_calloc(pl->remaining, sizeof(*x));
    kvt_status_t pst = KVT_ERR_NOMEM;
    kvt_rreq_t *q;

    pthread_mutex_lock(&e->rx_lock);
    if (rd != NULL && x != NULL)
        rd->ents = kvt_calloc(pl->remaining, sizeof(kvt_rent_t *));
    if (rd != NULL && rd->ents != NULL) {
        for (uint32_t i = 0; i < j->n; i++) {
            kvt_rent_t *r = kvt_map_get(&e->rents, j->keys->v[i]);
            uint64_t off;
            if (r == NULL || r->pull != pl || r->state != RENT_READING)
                continue;
            if (kvt_engine_region_of(e, e->pool, r->page, &x[rd->n].local, &off, NULL) != KVT_OK)
                continue;
            x[rd->n].local_offset = off;
            memcpy(x[rd->n].remote_uuid, r->ruuid, KVT_UUID_STR_LEN + 1);
            x[rd->n].remote_offset = r->roff;
            x[rd->n].length = r->len;
            rd->ents[rd->n++] = r;
        }
        rd->pull = pl;
        pl->refs++; /* the read context holds the pull until it is done */
        rd->start_ns = kvt_clock_monotonic_ns();
        q = rreq_get(e, pl->req_id, 1);
        if (q != NULL)
            q->reading++;
        pst = rd->n > 0 ? kvt_engine_post(e, pl->sender_id, KVT_TL_OP_READ, x, rd->n,
                                          kvt_cookie(CK_PULL_READ, rd))
                        : KVT_ERR_INVALID;
    }
    pthread_mutex_unlock(&e->rx_lock);
    kvt_free(x);
    if (pst != KVT_OK && rd != NULL)
        kvt_flow_recv_on_read_done(e, rd, pst == KVT_ERR_INVALID ? KVT_OK : pst);
    else if (rd == NULL)
        kvt_engine_count(e, &e->m.transfer_errors_total, 1);
}

/* Post: pull-eager reads now, pull-delay reads at load; a pull with nothing
 * to read releases the sender at once. */
static void alloc_post(kvt_engine_t *e, alloc_job_t *j)
{
    kvt_rpull_t *pl = j->pl;
    int read_now, nothing_left;

    if (pl == NULL)
        return;
    /* alloc_run's reference keeps <pl> alive: once rx_lock was let go, a user thread may
     * release or cancel every entry of the pull, which frees an unreferenced pull */
    pthread_mutex_lock(&e->rx_lock);
    read_now = !j->delay && pl->remaining > 0;
    nothing_left = pl->remaining == 0;
    pthread_mutex_unlock(&e->rx_lock);
    if (read_now)
        alloc_post_reads(e, j);
    else if (nothing_left)
        send_done_signal(e, pl);
    pthread_mutex_lock(&e->rx_lock);
    pl->refs--;
    rpull_put(pl);
    pthread_mutex_unlock(&e->rx_lock);
}

static int alloc_run(kvt_engine_t *e, alloc_job_t *j, int final)
{
    kvt_rreq_t *q;
    kvt_msg_t m;
    int rc;

    if (alloc_bufs(j) != KVT_OK)
        return ALLOC_REFUSE;
    pthread_mutex_lock(&e->rx_lock);
    if (tomb_has(e, j->req_id)) {
        pthread_mutex_unlock(&e->rx_lock);
        reply_cancelled(e, &j->c, j->msg);
        return ALLOC_DONE;
    }
    rc = alloc_dedup_locked(e, j) != KVT_OK ? ALLOC_REFUSE : alloc_reserve_locked(e, j, final);
    if (rc == ALLOC_DONE && alloc_entries_locked(e, j) != KVT_OK)
        rc = ALLOC_REFUSE;
    if (rc != ALLOC_DONE) {
        pthread_mutex_unlock(&e->rx_lock);
        return rc;
    }
    alloc_reply_build_locked(e, j, &m);
    kvt_engine_count(e, &e->m.already_sent_total, j->n - j->nnew);
    q = rreq_get(e, j->req_id, 0);
    if (q != NULL)
        q->touched_ns = kvt_engine_now(e);
    if (j->pl != NULL)
        j->pl->refs++; /* alloc_post's: released there */
    pthread_mutex_unlock(&e->rx_lock);
    reply(e, &j->c, &m);
    kvt_msg_clear(&m);
    alloc_post(e, j);
    return ALLOC_DONE;
}

/* Returns PARK_SPACE / PARK_QUOTA when the request must be parked (no space, or its sender
 * over its quota, yet; not final), PARK_NONE when it was answered. */
static int handle_alloc(kvt_engine_t *e, const rctx_t *c0, kvt_msg_t *msg, int final)
{
    alloc_job_t j;
    int rc;

    memset(&j, 0, sizeof(j));
    j.msg = msg;
    j.c = *c0;
    j.c.flv = flavour_of(e, msg);
    j.pull = msg->type == KVT_MSG_PULL_READY_NOTIF;
    j.keys = j.pull ? &msg->u.pull_ready.keys : &msg->u.alloc_req.keys;
    j.n = j.keys->n;
    j.req_id = "";
    j.delay = j.pull && e->cfg.pd_delay_pull;
    /* PDBackendAsync answers one index per key and never dedups; the others
     * report keys they hold in already_sent_indexes. Only a libkvt sender
     * copes with a partial grant (-1 slots); upstream senders get all or
     * nothing. */
    j.dedup = j.c.flv != KVT_FLAVOUR_ASYNC;
    j.all_or_nothing = j.c.flv != KVT_FLAVOUR_LIBKVT;
    rc = alloc_validate(e, &j) == KVT_OK ? alloc_run(e, &j, final) : ALLOC_REFUSE;
    if (rc == ALLOC_REFUSE)
        reply_alloc_failed(e, &j.c, msg->type, j.n);
    alloc_job_free(&j);
    return rc == ALLOC_PARK ? PARK_SPACE : rc == ALLOC_PARK_QUOTA ? PARK_QUOTA : PARK_NONE;
}

void kvt_flow_recv_on_read_done(kvt_engine_t *e, kvt_rread_t *rd, kvt_status_t st)
{
    kvt_rreq_t *q;
    uint64_t bytes = 0;

    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t i = 0; i < rd->n; i++) {
        kvt_rent_t *r = rd->ents[i];
        bytes += r->len;
        rent_drop_pull(e, r); /* the key is read (or failed): done-signal bookkeeping */
        if (st == KVT_OK && !r->release_pending) {
            r->state = RENT_LANDED;
            kvt_guard_renew_locked(e, r); /* here now: the consumer has a TTL to claim it */
        } else {
            r->state = RENT_LANDED;
            kvt_rent_free_locked(e, r);
        }
    }
    q = rreq_get(e, rd->pull != NULL ? rd->pull->req_id : NULL, 0);
    if (q != NULL && q->reading > 0)
        q->reading--;
    rreq_check(e, q);
    if (rd->pull != NULL) {
        rd->pull->refs--;
        rpull_put(rd->pull);
    }
    pthread_mutex_unlock(&e->rx_lock);
    if (st == KVT_OK) {
        kvt_engine_count(e, &e->m.bytes_read, bytes);
        kvt_engine_observe(e, rd->start_ns);
    } else {
        kvt_engine_count(e, &e->m.transfer_errors_total, 1);
    }
    kvt_free(rd->ents);
    kvt_free(rd);
}

/* ---- other messages ----------------------------------------------------- */

/* Every chunk of <q> whose bytes the sender wrote is here: visible now, and
 * its writers lose WRITE. */
static void land_req_locked(kvt_engine_t *e, kvt_rreq_t *q)
{
    for (kvt_rent_t *r = q->ents; r != NULL; r = r->rq_next) {
        if (r->state != RENT_ALLOCATED)
            continue;
        r->state = RENT_LANDED;
        kvt_guard_renew_locked(e, r); /* written: the consumer has a TTL to claim it */
        if (r->granted) {
            grant_writers(e, r->writer, r->page, 1);
            r->granted = 0;
        }
    }
}

/* The sender's ProxyNotif: every batch of <req_id> completed. It waits for
 * the echo, which goes out once the bytes are all here (pull-eager reads
 * may still run). */
static void handle_landed(kvt_engine_t *e, const rctx_t *c, const char *req_id)
{
    kvt_rreq_t *q = NULL;
    kvt_msg_t m;

    pthread_mutex_lock(&e->rx_lock);
    if (req_id[0] != '\0')
        q = rreq_get(e, req_id, 1);
    if (q != NULL) {
        land_req_locked(e, q);
        q->notified = 1;
        q->touched_ns = kvt_engine_now(e);
        kvt_free(q->ack_ident);
        q->ack_ident = kvt_malloc(c->ident_len ? c->ident_len : 1);
        if (q->ack_ident != NULL) {
            memcpy(q->ack_ident, c->ident, c->ident_len);
            q->ack_ident_len = c->ident_len;
            q->ack_delim = c->delim;
        }
        rreq_check(e, q); /* acks now, or when the last read ends */
    }
    pthread_mutex_unlock(&e->rx_lock);
    if (q == NULL) {
        kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
        m.u.proxy_notif.req_id = (char *)req_id;
        reply(e, c, &m);
    }
}

/* Release every entry of <req_id>; returns how many. rx_lock held. */
static uint32_t release_req_locked(kvt_engine_t *e, const char *req_id, int forward)
{
    kvt_rreq_t *q = rreq_get(e, req_id, 0);
    uint32_t n = 0;
    char *urls[16];
    uint32_t nurls = 0;

    /* a deferred release stays on the list: take the next entry first */
    for (kvt_rent_t *r = q != NULL ? q->ents : NULL, *next; r != NULL; r = next) {
        next = r->rq_next;
        n++;
        if (forward && r->pull != NULL && nurls < 16) {
            int seen = 0;
            for (uint32_t k = 0; k < nurls; k++)
                seen |= strcmp(urls[k], r->pull->done_url) == 0;
            if (!seen && (urls[nurls] = kvt_strdup(r->pull->done_url)) != NULL)
                nurls++;
        }
        rent_release_locked(e, r);
    }
    /* tell the senders of pulls of this request: they unpin everything */
    for (uint32_t k = 0; k < nurls; k++) {
        kvt_msg_t m;
        kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
        m.u.cancel.req_id = (char *)req_id;
        kvt_engine_send_done(e, urls[k], &m);
        kvt_free(urls[k]);
    }
    return n;
}

void kvt_flow_recv_cancel(kvt_engine_t *e, const char *req_id, int forward)
{
    kvt_rreq_t *q;

    if (!(e->role & KVT_ROLE_RECEIVER) || req_id == NULL || req_id[0] == '\0')
        return;
    pthread_mutex_lock(&e->rx_lock);
    tomb_add(e, req_id);
    release_req_locked(e, req_id, forward);
    q = rreq_get(e, req_id, 0);
    if (q != NULL)
        rreq_free(e, q, KVT_ERR_CANCELLED);
    (void)kvt_reserve_release(e->reserve, req_id);
    pthread_mutex_unlock(&e->rx_lock);
    kvt_engine_wake(e); /* its reservation freed space a parked request may take */
    /* parked requests of that req_id are answered by their deadline */
    kvt_engine_count(e, &e->m.cancels_total, 1);
}

static void handle_reserve(kvt_engine_t *e, const rctx_t *c, kvt_msg_t *msg)
{
    kvt_msg_t m;
    int granted = 0;
    int64_t free_chunks = 0;
    kvt_status_t st;
    kvt_rreq_t *q;

    pthread_mutex_lock(&e->rx_lock);
    q = rreq_get(e, msg->u.reserve_req.req_id, 0);
    if (q != NULL && q->notified && q->reading == 0 && q->ents != NULL &&
        !tomb_has(e, msg->u.reserve_req.req_id)) {
        /* Its transfer landed already (a proxy that sent the request's leg before this
         * answer came): the room was drawn and given back; holding it again would keep it
         * from every other request until the TTL. Granted, nothing held. (A cancelled id's
         * reservation is a new attempt: below, and it lifts the tombstone.) */
        granted = 1;
        free_chunks = kvt_reserve_free_chunks(e->reserve);
        pthread_mutex_unlock(&e->rx_lock);
    } else {
        /* held pages nobody claims last pd_alloc_ttl at most: a ReserveRequest (anyone may
         * send one) cannot ask for longer */
        int64_t ttl_ms = msg->u.reserve_req.ttl_ms > 0 ? msg->u.reserve_req.ttl_ms : 30000;
        int64_t cap_ms = (int64_t)(e->alloc_ttl_ns / KVT_NSEC_PER_MSEC);
        if (e->alloc_ttl_ns > 0 && ttl_ms > cap_ms)
            ttl_ms = cap_ms > 0 ? cap_ms : 1;
        st = kvt_reserve_request(e->reserve, msg->u.reserve_req.req_id,
                                 msg->u.reserve_req.total_chunks, ttl_ms, &granted, &free_chunks);
        if (st != KVT_OK) {
            granted = 0;
            free_chunks = kvt_reserve_free_chunks(e->reserve);
        }
        if (granted) {
            /* A proxy reserving again for a cancelled id starts a new attempt of that request
             * (a proxy whose retries keep the request's id): its transfer must not meet the
             * old tombstone. */
            kvt_free(kvt_map_del(&e->tombs, msg->u.reserve_req.req_id));
            /* its expiry shows in the metrics when due, not at the next reservation */
            kvt_engine_due_lower(e, &e->sweep_due, kvt_reserve_next_deadline(e->reserve));
        }
        pthread_mutex_unlock(&e->rx_lock);
    }
    kvt_engine_count(e, granted ? &e->m.reserve_granted_total : &e->m.reserve_refused_total, 1);
    kvt_msg_init(&m, KVT_MSG_RESERVE_RESPONSE);
    m.u.reserve_resp.req_id = msg->u.reserve_req.req_id;
    m.u.reserve_resp.granted = granted;
    m.u.reserve_resp.free_chunks = free_chunks;
    reply(e, c, &m); /* borrowed strings: nothing to clear */
}

/* Wait for space (<quota> 0: behind every request waiting for it) or for the sender's quota
 * (1); takes <msg>. */
static void park(kvt_engine_t *e, const rctx_t *c, kvt_msg_t *msg, int quota)
{
    kvt_parked_t *pk, **tail;
    uint32_t same = 0;

    for (kvt_parked_t *o = e->parked; quota && o != NULL; o = o->next)
        same += o->quota && strcmp(o->src, c->src != NULL ? c->src : "") == 0;
    if (same >= KVT_QUOTA_PARKED_MAX) {
        (void)handle_alloc(e, c, msg, 1); /* its final answer, now */
        kvt_msg_clear(msg);
        return;
    }
    pk = kvt_calloc(1, sizeof(*pk));
    if (pk == NULL || (pk->ident = kvt_malloc(c->ident_len ? c->ident_len : 1)) == NULL) {
        kvt_free(pk);
        reply_alloc_failed(e, c, msg->type,
                           msg->type == KVT_MSG_PULL_READY_NOTIF ? msg->u.pull_ready.keys.n
                                                                 : msg->u.alloc_req.keys.n);
        kvt_msg_clear(msg);
        return;
    }
    memcpy(pk->ident, c->ident, c->ident_len);
    pk->ident_len = c->ident_len;
    pk->delim = c->delim;
    pk->sock = c->sock;
    snprintf(pk->src, sizeof(pk->src), "%s", c->src != NULL ? c->src : "");
    pk->quota = quota;
    if (quota)
        atomic_fetch_add(&e->parked_quota, 1);
    else
        e->nparked_space++;
    pk->msg = *msg; /* takes ownership */
    kvt_msg_init(msg, KVT_MSG_NONE);
    pk->deadline_ns = kvt_engine_now(e) + kvt_sec_to_ns(e->cfg.pd_alloc_fail_backoff_ttl);
    for (tail = &e->parked; *tail != NULL; tail = &(*tail)->next)
        ;
    *tail = pk;
    atomic_fetch_add(&e->parked_total, 1);
    if (e->parked == pk) /* the first: its deadline is the earliest (one TTL for all) */
        kvt_engine_arm(e, &e->parked_timer, pk->deadline_ns);
}

/* CancelNotif (PDBackendAsync's abort, or a proxy / libkvt peer): release the
 * listed keys and everything of req_id, then answer AllocResponse{
 * remote_indexes: []} -- the async sender awaits that reply while it holds
 * its per-receiver lock. */
static void handle_cancel(kvt_engine_t *e, const rctx_t *c, kvt_msg_t *msg)
{
    kvt_msg_t m;
    kvt_msg_cancel_notif_t *cn = &msg->u.cancel;

    kvt_flow_sender_cancel(e, cn->req_id);
    kvt_flow_recv_cancel(e, cn->req_id, 1);
    if (cn->keys.n > 0)
        (void)kvt_release(e, (const char *const *)cn->keys.v, cn->keys.n);
    kvt_msg_init(&m, KVT_MSG_ALLOC_RESPONSE_ASYNC);
    reply(e, c, &m);
}

void kvt_flow_recv_on_router(kvt_engine_t *e, void *ident, size_t ident_len, int delim,
                             const void *data, size_t len, const char *peer_addr)
{
    rctx_t c = {.sock = e->router, .ident = ident, .ident_len = ident_len, .delim = delim};
    char name[KVT_TL_PEER_ID_MAX + 1], src[KVT_SRC_KEY_MAX];
    kvt_msg_type_t type = KVT_MSG_NONE;
    kvt_msg_t m;
    kvt_msg_err_t err = {0};
    kvt_status_t st = kvt_msg_decode(data, len, &m, &err);

    if (st != KVT_OK) {
        kvt_engine_bad_msg(e, "alloc port", st, &err);
        /* a request we can name still gets its (failure) reply; a sender we
         * cannot name is answered in the configured flavour, or with the
         * async AllocResponse, which sync senders decode as well */
        c.flv = e->flavour != KVT_FLAVOUR_AUTO ? e->flavour : KVT_FLAVOUR_ASYNC;
        if (kvt_msg_peek_type(data, len, &type) == KVT_OK &&
            (type == KVT_MSG_ALLOC_REQUEST || type == KVT_MSG_PULL_READY_NOTIF)) {
            if (type == KVT_MSG_PULL_READY_NOTIF)
                c.flv = KVT_FLAVOUR_ASCEND;
            reply_alloc_failed(e, &c, type, 0);
        } else if (type == KVT_MSG_RESERVE_REQUEST) {
            kvt_msg_t r;
            kvt_msg_init(&r, KVT_MSG_RESERVE_RESPONSE);
            r.u.reserve_resp.req_id = "";
            r.u.reserve_resp.free_chunks = kvt_reserve_free_chunks(e->reserve);
            reply(e, &c, &r); /* not granted */
        } else if (type == KVT_MSG_CANCEL_NOTIF) {
            kvt_msg_init(&m, KVT_MSG_ALLOC_RESPONSE_ASYNC);
            reply(e, &c, &m);
        } else {
            /* an empty frame keeps a REQ peer's socket usable (what
             * LMCache-Ascend's receiver answers to what it cannot handle) */
            (void)kvt_ctrl_reply_raw(e->router, ident, ident_len, delim, "", 0);
        }
        return;
    }
    switch (m.type) {
    case KVT_MSG_ALLOC_REQUEST:
    case KVT_MSG_PULL_READY_NOTIF:
        c.flv = flavour_of(e, &m);
        ident_sender(ident, ident_len, name, sizeof(name));
        kvt_guard_src_key(e, peer_addr, name, src, sizeof(src));
        c.src = src;
        if (e->nparked_space > 0) {
            park(e, &c, &m, 0); /* keep arrival order behind those waiting for space */
            return;
        }
        switch (handle_alloc(e, &c, &m, 0)) {
        case PARK_SPACE:
            park(e, &c, &m, 0);
            return;
        case PARK_QUOTA:
            park(e, &c, &m, 1);
            return;
        default:
            break;
        }
        break;
    case KVT_MSG_PROXY_NOTIF:
        /* pdgw extension: a libkvt sender asks whether its request landed */
        handle_landed(e, &c, m.u.proxy_notif.req_id);
        break;
    case KVT_MSG_CANCEL_NOTIF:
        handle_cancel(e, &c, &m);
        break;
    case KVT_MSG_RESERVE_REQUEST:
        handle_reserve(e, &c, &m);
        break;
    default:
        kvt_engine_refuse(e, "%s on the alloc port: not a request", kvt_msg_type_name(m.type));
        (void)kvt_ctrl_reply_raw(e->router, ident, ident_len, delim, "", 0);
        break;
    }
    kvt_msg_clear(&m);
}

void kvt_flow_recv_on_init(kvt_engine_t *e, void *ident, size_t ident_len, int delim,
                           const void *data, size_t len, const char *peer_addr)
{
    char src[KVT_SRC_KEY_MAX];
    kvt_msg_t m;
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob), rlen = 0;
    void *reply = NULL;
    char peer[KVT_TL_PEER_ID_MAX + 1];
    kvt_msg_err_t err = {0};
    kvt_status_t st = kvt_hs_decode(e, data, len, &m, &err);

    if (st != KVT_OK) {
        kvt_engine_bad_msg(e, "init port", st, &err);
        (void)kvt_ctrl_reply_raw(e->init_rt, ident, ident_len, delim, "", 0);
        return;
    }
    /* the peer's name comes from the envelope; its transport's bytes go to the transport */
    snprintf(peer, sizeof(peer), "%s", m.u.tinit.node_id);
    /* before the transport makes room for it (verbs: QPs) */
    kvt_guard_src_key(e, peer_addr, "", src, sizeof(src));
    kvt_hs_note_peer(e, src, peer);
    st = e->tl != NULL ? e->tdesc->ops->peer_prepare(e->tl, peer, blob, &bl) : KVT_ERR_CLOSED;
    if (st == KVT_OK)
        st = e->tdesc->ops->peer_connect(e->tl, peer, m.u.tinit.addr.p, m.u.tinit.addr.n);
    kvt_msg_clear(&m);
    if (st == KVT_OK)
        st = kvt_hs_encode(e, blob, bl, 1, &reply, &rlen);
    if (st != KVT_OK) {
        kvt_engine_count(e, &e->m.bad_messages_total, 1);
        (void)kvt_ctrl_reply_raw(e->init_rt, ident, ident_len, delim, "", 0);
        return;
    }
    pthread_mutex_lock(&e->rx_lock);
    if (kvt_map_get(&e->hs_peers, peer) == NULL && e->hs_peers.count < KVT_HS_PEERS_MAX)
        (void)kvt_map_put(&e->hs_peers, peer, e);
    pthread_mutex_unlock(&e->rx_lock);
    (void)kvt_ctrl_reply_raw(e->init_rt, ident, ident_len, delim, reply, rlen);
    kvt_free(reply);
}

/* ---- timers ---------------------------------------------------------------- */

typedef struct waiter_ctx {
    kvt_engine_t *e;
    uint64_t now, next; /* next: the earliest deadline of the waiters left */
} waiter_ctx_t;

static void expire_waiters(void *arg, const char *key, void *val)
{
    waiter_ctx_t *wc = arg;
    kvt_rreq_t *q = val;
    uint32_t k = 0;

    (void)key;
    for (uint32_t i = 0; i < q->nwaiters; i++) {
        uint64_t dl = q->waiter_deadline[i];
        if (dl != 0 && wc->now >= dl) {
            kvt_task_complete(wc->e, q->waiters[i], KVT_ERR_TIMEOUT);
            continue;
        }
        if (dl != 0 && dl < wc->next)
            wc->next = dl;
        q->waiters[k] = q->waiters[i];
        q->waiter_deadline[k++] = dl;
    }
    q->nwaiters = k;
}

/* A kvt_submit_wait_req deadline is due: time out those waits. Every thread lowers
 * waiter_due under rx_lock, so setting it here loses nothing. */
static void on_waiter_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_engine_t *e = t->arg;
    waiter_ctx_t wc = {.e = e, .now = now, .next = UINT64_MAX};

    pthread_mutex_lock(&e->rx_lock);
    kvt_map_each(&e->rreqs, expire_waiters, &wc);
    atomic_store(&e->waiter_due, wc.next);
    pthread_mutex_unlock(&e->rx_lock);
}

typedef struct stale_ctx {
    uint64_t now, ttl, next; /* next: when a record left may go stale */
    kvt_rreq_t **v;
    uint32_t n, cap;
} stale_ctx_t;

static void collect_stale(void *arg, const char *key, void *val)
{
    stale_ctx_t *sc = arg;
    kvt_rreq_t *q = val;
    uint64_t exp = q->touched_ns + sc->ttl;
    (void)key;
    /* a record with entries stays: release by request id walks its list; one busy past its
     * TTL is looked at again a TTL later */
    if (q->nwaiters > 0 || q->reading > 0 || q->ack_ident != NULL || q->nents > 0 ||
        sc->now < exp) {
        exp = exp > sc->now ? exp : sc->now + sc->ttl;
        if (exp < sc->next)
            sc->next = exp;
        return;
    }
    if (sc->n == sc->cap) {
        uint32_t nc = sc->cap ? sc->cap * 2 : 64;
        kvt_rreq_t **nv = kvt_realloc(sc->v, nc * sizeof(*nv));
        if (nv == NULL) {
            sc->next = sc->now; /* try again at the next sweep */
            return;
        }
        sc->v = nv;
        sc->cap = nc;
    }
    sc->v[sc->n++] = q;
}

/* Forget request records nobody asked about for a TTL (their chunks stay until released),
 * drop expired tombstones and reservations: keeps the tables bounded. */
static void on_sweep_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_engine_t *e = t->arg;
    stale_ctx_t sc = {
        .now = now, .ttl = kvt_sec_to_ns(e->cfg.pd_pull_pending_ttl), .next = UINT64_MAX};
    uint64_t next;

    e->sweep_last_ns = now;
    pthread_mutex_lock(&e->rx_lock);
    kvt_map_each(&e->rreqs, collect_stale, &sc);
    for (uint32_t i = 0; i < sc.n; i++)
        rreq_free(e, sc.v[i], KVT_OK);
    kvt_free(sc.v);
    next = tomb_sweep_locked(e, now);
    (void)kvt_reserve_sweep(e->reserve, NULL);
    if (kvt_reserve_next_deadline(e->reserve) < next)
        next = kvt_reserve_next_deadline(e->reserve);
    atomic_store(&e->sweep_due, sc.next < next ? sc.next : next);
    pthread_mutex_unlock(&e->rx_lock);
}

/* Parked requests, in order; the ones behind the first that still waits for space wait too
 * (arrival order), one that waits for its sender's quota holds up nobody. The first one's
 * deadline (the earliest: one TTL for all) is armed for its final answer. */
static void retry_parked(kvt_engine_t *e)
{
    kvt_parked_t *list = e->parked, **tail = &e->parked;
    uint64_t now = kvt_engine_now(e);
    int blocked = 0;

    e->parked = NULL;
    e->nparked_space = 0;
    atomic_store(&e->parked_quota, 0);
    while (list != NULL) {
        kvt_parked_t *pk = list;
        rctx_t c = {.sock = pk->sock,
                    .ident = pk->ident,
                    .ident_len = pk->ident_len,
                    .delim = pk->delim,
                    .src = pk->src};
        int kind = pk->quota ? PARK_QUOTA : PARK_SPACE;

        list = pk->next;
        pk->next = NULL;
        if (!blocked)
            kind = handle_alloc(e, &c, &pk->msg, now >= pk->deadline_ns);
        if (kind == PARK_NONE) {
            kvt_msg_clear(&pk->msg);
            kvt_free(pk->ident);
            kvt_free(pk);
            continue;
        }
        blocked |= kind == PARK_SPACE;
        pk->quota = kind == PARK_QUOTA;
        if (pk->quota)
            atomic_fetch_add(&e->parked_quota, 1);
        else
            e->nparked_space++;
        *tail = pk;
        tail = &pk->next;
    }
    if (e->parked != NULL)
        kvt_engine_arm(e, &e->parked_timer, e->parked->deadline_ns);
    else
        pdb_timer_cancel(&e->timers, &e->parked_timer);
}

static void on_parked_timer(pdb_timer_t *t, uint64_t now)
{
    (void)now;
    retry_parked(t->arg);
}

/* Arm <t> for <due> unless it is armed for it already (UINT64_MAX: nothing to do; a timer
 * armed for an earlier time fires for nothing and re-reads the due time). */
static void sync_timer(kvt_engine_t *e, pdb_timer_t *t, uint64_t due)
{
    if (due != UINT64_MAX && (!pdb_timer_armed(t) || t->due != due))
        kvt_engine_arm(e, t, due);
}

void kvt_flow_recv_init(kvt_engine_t *e)
{
    pdb_timer_init(&e->parked_timer, on_parked_timer, e);
    pdb_timer_init(&e->waiter_timer, on_waiter_timer, e);
    pdb_timer_init(&e->sweep_timer, on_sweep_timer, e);
    pdb_timer_init(&e->expire_timer, kvt_guard_on_timer, e);
}

void kvt_flow_recv_turn(kvt_engine_t *e)
{
    uint64_t sweep;

    if (!(e->role & KVT_ROLE_RECEIVER))
        return;
    if (e->parked != NULL)
        retry_parked(e); /* pages freed since wake us */
    sync_timer(e, &e->waiter_timer, atomic_load(&e->waiter_due));
    /* sweeps walk whole tables: at most one a second, however many records go stale */
    sweep = atomic_load(&e->sweep_due);
    if (sweep != UINT64_MAX && sweep < e->sweep_last_ns + KVT_NSEC_PER_SEC)
        sweep = e->sweep_last_ns + KVT_NSEC_PER_SEC;
    sync_timer(e, &e->sweep_timer, sweep);
    sync_timer(e, &e->expire_timer, kvt_guard_due(e));
}

/* ---- user calls ------------------------------------------------------------ */

kvt_status_t kvt_submit_wait_req(kvt_engine_t *e, const char *req_id, int timeout_ms, void *user,
                                 kvt_task_id_t *id_out)
{
    kvt_task_t *t;
    kvt_rreq_t *q;

    if (e == NULL || req_id == NULL || req_id[0] == '\0' || id_out == NULL ||
        !(e->role & KVT_ROLE_RECEIVER))
        return KVT_ERR_INVALID;
    t = kvt_task_new(e, KVT_TASK_WAIT_REQ, 0, user);
    if (t == NULL)
        return KVT_ERR_NOMEM;
    *id_out = t->id;
    pthread_mutex_lock(&e->rx_lock);
    q = rreq_get(e, req_id, 1);
    if (q == NULL) {
        pthread_mutex_unlock(&e->rx_lock);
        kvt_task_complete(e, t, KVT_ERR_NOMEM);
        return KVT_OK;
    }
    if (q->notified && q->reading == 0) {
        pthread_mutex_unlock(&e->rx_lock);
        kvt_task_complete(e, t, KVT_OK);
        return KVT_OK;
    }
    {
        kvt_task_t **nw = kvt_realloc(q->waiters, (q->nwaiters + 1) * sizeof(*nw));
        uint64_t *nd =
            nw != NULL ? kvt_realloc(q->waiter_deadline, (q->nwaiters + 1) * sizeof(*nd)) : NULL;
        if (nw != NULL)
            q->waiters = nw;
        if (nd == NULL) {
            pthread_mutex_unlock(&e->rx_lock);
            kvt_task_complete(e, t, KVT_ERR_NOMEM);
            return KVT_OK;
        }
        q->waiter_deadline = nd;
        q->waiters[q->nwaiters] = t;
        q->waiter_deadline[q->nwaiters] =
            timeout_ms < 0 ? 0 : kvt_engine_now(e) + (uint64_t)timeout_ms * KVT_NSEC_PER_MSEC + 1;
        if (q->waiter_deadline[q->nwaiters] != 0)
            kvt_engine_due_lower(e, &e->waiter_due, q->waiter_deadline[q->nwaiters]);
        q->nwaiters++;
    }
    pthread_mutex_unlock(&e->rx_lock);
    return KVT_OK;
}

kvt_status_t kvt_submit_load(kvt_engine_t *e, const char *const *keys, void *const *bufs,
                             const size_t *caps, size_t *lens_out, uint32_t n, void *user,
                             kvt_task_id_t *id_out)
{
    kvt_task_t *t;
    kvt_rent_t **copy = NULL, **prox = NULL;
    uint32_t *cidx = NULL, *pidx = NULL, nc = 0, np = 0;
    kvt_load_job_t *job = NULL;

    if (e == NULL || id_out == NULL || (n > 0 && (keys == NULL || bufs == NULL || caps == NULL)))
        return KVT_ERR_INVALID;
    t = kvt_task_new(e, KVT_TASK_LOAD, n, user);
    copy = kvt_calloc(n + 1, sizeof(*copy));
    prox = kvt_calloc(n + 1, sizeof(*prox));
    cidx = kvt_calloc(n + 1, sizeof(*cidx));
    pidx = kvt_calloc(n + 1, sizeof(*pidx));
    if (t == NULL || copy == NULL || prox == NULL || cidx == NULL || pidx == NULL) {
        kvt_free(copy);
        kvt_free(prox);
        kvt_free(cidx);
        kvt_free(pidx);
        if (t != NULL)
            kvt_task_complete(e, t, KVT_ERR_NOMEM);
        return t != NULL ? (*id_out = t->id, KVT_OK) : KVT_ERR_NOMEM;
    }
    *id_out = t->id;
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_rent_t *r = keys[i] != NULL ? kvt_map_get(&e->rents, keys[i]) : NULL;
        if (r == NULL || bufs[i] == NULL || caps[i] < r->len || r->busy)
            continue;
        if (r->state == RENT_LANDED) {
            r->locks++;                   /* hold it while copying outside the lock */
            kvt_guard_claim_locked(e, r); /* the consumer's now: it releases it */
            copy[nc] = r;
            cidx[nc++] = i;
        } else if (r->state == RENT_PROXY && e->pp_pool != NULL) {
            r->busy = 1;
            kvt_guard_claim_locked(e, r);
            prox[np] = r;
            pidx[np++] = i;
        }
    }
    pthread_mutex_unlock(&e->rx_lock);
    for (uint32_t k = 0; k < nc; k++) {
        kvt_rent_t *r = copy[k];
        if (kvt_pool_read(e->pool, r->page, 0, bufs[cidx[k]], r->len) == KVT_OK) {
            kvt_bitmap_set(t->bitmap, cidx[k]);
            if (lens_out != NULL)
                lens_out[cidx[k]] = r->len;
        }
    }
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t k = 0; k < nc; k++) {
        kvt_rent_t *r = copy[k];
        if (--r->locks == 0 && r->release_pending)
            kvt_rent_free_locked(e, r);
    }
    pthread_mutex_unlock(&e->rx_lock);
    kvt_free(copy);
    kvt_free(cidx);
    if (np == 0) {
        kvt_free(prox);
        kvt_free(pidx);
        kvt_task_complete(e, t, KVT_OK);
        return KVT_OK;
    }
    /* pull-delay chunks: the progress thread reads them, ping-pong */
    job = kvt_calloc(1, sizeof(*job));
    kvt_cmd_t *c = kvt_calloc(1, sizeof(*c));
    if (job != NULL) {
        job->bufs = kvt_calloc(n + 1, sizeof(void *));
        job->caps = kvt_calloc(n + 1, sizeof(size_t));
    }
    if (job == NULL || c == NULL || job->bufs == NULL || job->caps == NULL) {
        pthread_mutex_lock(&e->rx_lock);
        for (uint32_t k = 0; k < np; k++)
            prox[k]->busy = 0;
        pthread_mutex_unlock(&e->rx_lock);
        if (job != NULL) {
            kvt_free(job->bufs);
            kvt_free(job->caps);
        }
        kvt_free(job);
        kvt_free(c);
        kvt_free(prox);
        kvt_free(pidx);
        kvt_task_complete(e, t, KVT_ERR_NOMEM);
        return KVT_OK;
    }
    memcpy(job->bufs, bufs, n * sizeof(void *));
    memcpy(job->caps, caps, n * sizeof(size_t));
    job->task = t;
    job->ents = prox;
    job->slot = pidx;
    job->n = np;
    job->lens_out = lens_out;
    c->kind = CMD_LOAD_DELAY;
    c->job = job;
    return kvt_engine_post_cmd(e, c);
}

kvt_status_t kvt_submit_lookup(kvt_engine_t *e, const char *const *keys, uint32_t n, void *user,
                               kvt_task_id_t *id_out)
{
    kvt_task_t *t;

    if (e == NULL || id_out == NULL || (n > 0 && keys == NULL))
        return KVT_ERR_INVALID;
    t = kvt_task_new(e, KVT_TASK_LOOKUP, n, user);
    if (t == NULL)
        return KVT_ERR_NOMEM;
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_rent_t *r = keys[i] != NULL ? kvt_map_get(&e->rents, keys[i]) : NULL;
        if (r != NULL && !r->release_pending &&
            (r->state == RENT_LANDED || r->state == RENT_PROXY)) {
            r->locks++;
            kvt_guard_claim_locked(e, r); /* the consumer's now: it unlocks and releases */
            kvt_bitmap_set(t->bitmap, i);
        }
    }
    pthread_mutex_unlock(&e->rx_lock);
    *id_out = t->id;
    kvt_task_complete(e, t, KVT_OK);
    return KVT_OK;
}

void kvt_unlock(kvt_engine_t *e, const char *const *keys, uint32_t n)
{
    if (e == NULL || keys == NULL)
        return;
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_rent_t *r = keys[i] != NULL ? kvt_map_get(&e->rents, keys[i]) : NULL;
        if (r == NULL || r->locks == 0)
            continue;
        if (--r->locks == 0 && r->release_pending && !r->busy && r->state != RENT_READING)
            kvt_rent_free_locked(e, r);
    }
    pthread_mutex_unlock(&e->rx_lock);
}

uint32_t kvt_release(kvt_engine_t *e, const char *const *keys, uint32_t n)
{
    uint32_t known = 0;

    if (e == NULL || keys == NULL)
        return 0;
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t i = 0; i < n; i++) {
        kvt_rent_t *r = keys[i] != NULL ? kvt_map_get(&e->rents, keys[i]) : NULL;
        if (r == NULL || r->release_pending)
            continue;
        known++;
        rent_release_locked(e, r);
    }
    pthread_mutex_unlock(&e->rx_lock);
    return known;
}

uint32_t kvt_release_req(kvt_engine_t *e, const char *req_id)
{
    uint32_t n;
    kvt_rreq_t *q;

    if (e == NULL || req_id == NULL || req_id[0] == '\0')
        return 0;
    pthread_mutex_lock(&e->rx_lock);
    n = release_req_locked(e, req_id, 0);
    q = rreq_get(e, req_id, 0);
    if (q != NULL)
        rreq_free(e, q, KVT_ERR_CANCELLED);
    (void)kvt_reserve_release(e->reserve, req_id);
    pthread_mutex_unlock(&e->rx_lock);
    kvt_engine_wake(e); /* its reservation freed space a parked request may take */
    return n;
}

static void unbusy_cb(void *arg, const char *key, void *val)
{
    kvt_rent_t *r = val;
    (void)arg;
    (void)key;
    r->busy = 0;
    r->locks = 0;
}

typedef struct collect_all {
    kvt_rent_t **v;
    uint32_t n, cap;
} collect_all_t;

static void collect_any(void *arg, const char *key, void *val)
{
    collect_all_t *ca = arg;
    (void)key;
    if (ca->n == ca->cap) {
        uint32_t nc = ca->cap ? ca->cap * 2 : 256;
        kvt_rent_t **nv = kvt_realloc(ca->v, nc * sizeof(*nv));
        if (nv == NULL)
            return;
        ca->v = nv;
        ca->cap = nc;
    }
    ca->v[ca->n++] = val;
}

void kvt_flow_recv_fini(kvt_engine_t *e)
{
    collect_all_t ca = {0};

    while (e->parked != NULL) {
        kvt_parked_t *pk = e->parked;
        e->parked = pk->next;
        kvt_msg_clear(&pk->msg);
        kvt_free(pk->ident);
        kvt_free(pk);
    }
    if (e->rents.buckets == NULL)
        return;
    pthread_mutex_lock(&e->rx_lock);
    kvt_map_each(&e->rents, unbusy_cb, NULL);
    kvt_map_each(&e->rents, collect_any, &ca);
    for (uint32_t i = 0; i < ca.n; i++)
        kvt_rent_free_locked(e, ca.v[i]);
    ca.n = 0;
    kvt_map_each(&e->rreqs, collect_any, &ca);
    for (uint32_t i = 0; i < ca.n; i++)
        rreq_free(e, (kvt_rreq_t *)ca.v[i], KVT_ERR_CLOSED);
    pthread_mutex_unlock(&e->rx_lock);
    kvt_free(ca.v);
}
