/*
 * kvt_alloc_guard.c - what keeps a receiver's pages from being pinned by strangers: the
 * expiry of allocations nobody wrote or claimed (pd_alloc_ttl) and the per-sender quota of
 * unclaimed pages (pd_alloc_quota).
 *
 * The alloc port takes AllocRequest / PullReadyNotif from anyone who can reach it (LMCache's
 * wire has no authentication), and every answered request holds pages until the consumer
 * releases them. A flood of requests whose pages are never written, or a sender that dies
 * between its AllocRequest and its writes, held them for good. Now an entry is *unclaimed*
 * from its allocation until the consumer takes it (kvt_submit_lookup / kvt_submit_load);
 * while unclaimed it
 *   - counts against its sender's quota: one sender holds at most pd_alloc_quota of the pool
 *     unclaimed. A request beyond it waits, as one waits for a full pool, until its sender's
 *     entries are claimed or pd_alloc_fail_backoff_ttl passed, then it is answered the way a
 *     full pool answers (alloc_failed / -1 slots; a libkvt sender gets what is left of its
 *     quota, -1 for the rest). Unlike a request waiting for space it holds up nobody else's,
 *     and one sender has at most KVT_QUOTA_PARKED_MAX of them waiting;
 *   - sits on the expiry queue: pd_alloc_ttl after its allocation (or after its bytes
 *     landed: the consumer then gets a whole TTL) it is freed, its WRITE grants revoked, so a
 *     late write is refused by the transport (tcp: KVT_ERR_ACCESS to the writer,
 *     kvt_data_access_denied_total here; a verbs NIC checks only the region's bounds).
 *
 * One TTL for every entry makes the queue ordered by deadline if entries join at its tail,
 * so the expiry timer is armed for the head alone: no scan, and claims unlink in O(1). The
 * timer runs at most once a second (once a TTL when that is shorter), so a flood expires in
 * a few batches, each counted (kvt_alloc_expired_total) and logged in one line.
 *
 * Who is "a sender": the IP address the request came from (ZeroMQ's Peer-Address of its TCP
 * connection; IPv6 cut to transfer_addr_prefix_v6 bits, /64 by default, as the data port's
 * per-address caps count it). Nothing the messages name can be used: LMCache's AllocRequest
 * names no sender at all (keys, fmt, shape, dtype, last_chunk_toks, and the async backend's
 * req_id / is_last_batch / total_chunks), and what does name one -- a DEALER's routing id, a
 * REQ socket's (random) one, PullReadyNotif.sender_id, TransportInit.node_id -- the peer
 * picks, so a flood would pick a new one per request. The source address of a TCP
 * connection is what it cannot pick. The price: senders behind one address (several
 * prefill engines on one host, a NAT) share one quota; pd_alloc_quota: 1 turns it off.
 * Without an address (ipc / inproc peers, on this host) the routing id's sender part names
 * the sender.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "kvt_engine_int.h"

kvt_status_t kvt_guard_init(kvt_engine_t *e)
{
    double ttl = e->cfg.pd_alloc_ttl;

    e->alloc_ttl_ns = ttl > 0.0 ? kvt_sec_to_ns(ttl) : 0;
    if (e->alloc_ttl_ns == 0 && ttl > 0.0)
        e->alloc_ttl_ns = 1; /* below a nanosecond: as short as it gets, not "off" */
    e->ex_head = e->ex_tail = NULL;
    atomic_init(&e->expire_due, UINT64_MAX);
    return kvt_map_init(&e->rsrcs, 16);
}

static void free_src(void *arg, const char *key, void *val)
{
    (void)arg;
    (void)key;
    kvt_free(val);
}

void kvt_guard_fini(kvt_engine_t *e)
{
    if (e->rsrcs.buckets == NULL)
        return;
    kvt_map_each(&e->rsrcs, free_src, NULL); /* none left once every entry was freed */
    kvt_map_fini(&e->rsrcs);
}

void kvt_guard_src_key(const kvt_engine_t *e, const char *peer_addr, const char *name, char *out,
                       size_t cap)
{
    struct in_addr a4;
    struct in6_addr a6;
    char txt[INET6_ADDRSTRLEN];
    unsigned bits;

    if (peer_addr == NULL || peer_addr[0] == '\0') {
        snprintf(out, cap, "id:%s", name != NULL ? name : "");
        return;
    }
    if (inet_pton(AF_INET, peer_addr, &a4) == 1 || inet_pton(AF_INET6, peer_addr, &a6) != 1) {
        snprintf(out, cap, "%s", peer_addr); /* IPv4, or not an address we can cut */
        return;
    }
    if (IN6_IS_ADDR_V4MAPPED(&a6)) { /* an IPv4 peer of a dual-stack socket: one address */
        memcpy(&a4, a6.s6_addr + 12, 4);
        snprintf(out, cap, "%s", inet_ntop(AF_INET, &a4, txt, sizeof(txt)) ? txt : peer_addr);
        return;
    }
    bits = e->cfg.transfer_addr_prefix_v6 ? e->cfg.transfer_addr_prefix_v6 : 64;
    if (bits > 128)
        bits = 128;
    for (unsigned i = 0; i < 16; i++) {
        unsigned keep = bits >= 8 * (i + 1) ? 8 : bits > 8 * i ? bits - 8 * i : 0;
        a6.s6_addr[i] &= (uint8_t)(0xff00u >> keep);
    }
    if (inet_ntop(AF_INET6, &a6, txt, sizeof(txt)) == NULL)
        snprintf(out, cap, "%s", peer_addr);
    else
        snprintf(out, cap, "%s/%u", txt, bits);
}

/* Pages one sender may hold unclaimed: pd_alloc_quota of the pool, at least one. */
static uint32_t quota_pages(const kvt_engine_t *e)
{
    uint32_t total = kvt_pool_total_pages(e->pool);
    double q = (double)total * e->cfg.pd_alloc_quota;
    uint32_t n = q >= (double)total ? total : (uint32_t)q;

    return n > 0 ? n : 1;
}

uint32_t kvt_guard_room_locked(kvt_engine_t *e, const char *src)
{
    const kvt_rsrc_t *s;
    uint32_t quota, held;

    if (e->cfg.pd_alloc_quota >= 1.0)
        return UINT32_MAX; /* no quota: a full pool parks the request, as it always did */
    s = src != NULL ? kvt_map_get(&e->rsrcs, src) : NULL;
    quota = quota_pages(e);
    held = s != NULL ? s->pages : 0;
    return held >= quota ? 0 : quota - held;
}

static void queue_unlink(kvt_engine_t *e, kvt_rent_t *r)
{
    if (!r->queued)
        return;
    if (r->ex_prev != NULL)
        r->ex_prev->ex_next = r->ex_next;
    else
        e->ex_head = r->ex_next;
    if (r->ex_next != NULL)
        r->ex_next->ex_prev = r->ex_prev;
    else
        e->ex_tail = r->ex_prev;
    r->ex_next = r->ex_prev = NULL;
    r->queued = 0;
}

/* At the tail, due a TTL from now: the latest deadline of all (one TTL, a clock that never
 * goes back), so the queue stays in deadline order. */
static void queue_append(kvt_engine_t *e, kvt_rent_t *r, uint64_t now)
{
    r->expire_ns = now + e->alloc_ttl_ns;
    r->ex_next = NULL;
    r->ex_prev = e->ex_tail;
    if (e->ex_tail != NULL)
        e->ex_tail->ex_next = r;
    else
        e->ex_head = r;
    e->ex_tail = r;
    r->queued = 1;
    /* the head's deadline is the timer's; any thread (the progress thread arms it) */
    if (e->ex_head == r)
        kvt_engine_due_lower(e, &e->expire_due, r->expire_ns);
}

void kvt_guard_track_locked(kvt_engine_t *e, kvt_rent_t *r, const char *src)
{
    kvt_rsrc_t *s = kvt_map_get(&e->rsrcs, src);

    if (s == NULL && (s = kvt_calloc(1, sizeof(*s))) != NULL) {
        snprintf(s->key, sizeof(s->key), "%s", src);
        if (kvt_map_put(&e->rsrcs, s->key, s) != KVT_OK) {
            kvt_free(s);
            s = NULL;
        }
    }
    if (s != NULL) { /* no memory for the record: the entry still expires */
        s->nents++;
        s->pages += r->page != KVT_PAGE_NONE;
        r->src = s;
    }
    if (e->alloc_ttl_ns > 0)
        queue_append(e, r, kvt_engine_now(e));
}

void kvt_guard_renew_locked(kvt_engine_t *e, kvt_rent_t *r)
{
    if (!r->queued)
        return; /* claimed already, or no TTL */
    queue_unlink(e, r);
    queue_append(e, r, kvt_engine_now(e));
}

void kvt_guard_claim_locked(kvt_engine_t *e, kvt_rent_t *r)
{
    kvt_rsrc_t *s = r->src;

    queue_unlink(e, r);
    if (s == NULL)
        return;
    r->src = NULL;
    if (r->page != KVT_PAGE_NONE && s->pages > 0) {
        s->pages--;
        if (atomic_load(&e->parked_quota) > 0)
            kvt_engine_wake(e); /* a request waiting for this sender's quota goes on */
    }
    if (--s->nents == 0) {
        kvt_map_del(&e->rsrcs, s->key);
        kvt_free(s);
    }
}

uint64_t kvt_guard_due(const kvt_engine_t *e)
{
    uint64_t due = atomic_load(&e->expire_due);
    uint64_t gap = e->alloc_ttl_ns < KVT_NSEC_PER_SEC ? e->alloc_ttl_ns : KVT_NSEC_PER_SEC;

    if (due != UINT64_MAX && e->expire_last_ns != 0 && due < e->expire_last_ns + gap)
        due = e->expire_last_ns + gap;
    return due;
}

/* Busy, or what the consumer waits for: not abandoned. Looked at again a TTL later. */
static int in_use(const kvt_rent_t *r)
{
    return r->locks > 0 || r->busy || r->state == RENT_READING || r->release_pending ||
           (r->rq != NULL && r->rq->nwaiters > 0);
}

void kvt_guard_on_timer(pdb_timer_t *t, uint64_t now)
{
    kvt_engine_t *e = t->arg;
    uint32_t n = 0, pages = 0;
    char src[KVT_SRC_KEY_MAX] = "", req[72] = "";

    e->expire_last_ns = now;
    pthread_mutex_lock(&e->rx_lock);
    while (e->ex_head != NULL && e->ex_head->expire_ns <= now) {
        kvt_rent_t *r = e->ex_head;

        if (in_use(r)) {
            queue_unlink(e, r);
            queue_append(e, r, now); /* a later deadline than now: the loop ends */
            continue;
        }
        if (n++ == 0) {
            snprintf(src, sizeof(src), "%s", r->src != NULL ? r->src->key : "?");
            snprintf(req, sizeof(req), "%.64s", r->req_id);
        }
        pages += r->page != KVT_PAGE_NONE;
        kvt_rent_free_locked(e, r); /* unqueues it, revokes its grants, frees its page */
    }
    atomic_store(&e->expire_due, e->ex_head != NULL ? e->ex_head->expire_ns : UINT64_MAX);
    pthread_mutex_unlock(&e->rx_lock);
    if (n == 0)
        return;
    kvt_engine_count(e, &e->m.alloc_expired_total, n);
    fprintf(stderr,
            "kvt %s: %u allocation(s) (%u page(s)) nobody wrote or claimed within %.3gs "
            "(pd_alloc_ttl) freed; the first from sender %s, req '%s'\n",
            e->id, n, pages, e->cfg.pd_alloc_ttl, src, req);
}
