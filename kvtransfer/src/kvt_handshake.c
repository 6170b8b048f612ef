/*
 * kvt_handshake.c - the engine's side of the init-port handshake.
 *
 * Each side sends a TransportInit (a libkvt-only message, kvt_msg.h) naming itself and its
 * transport, with the transport's address blob in "addr": the engine carries those bytes
 * without looking inside (each transport packs and unpacks its own, as UCX does with worker
 * addresses). Node identity is the envelope's node_id, set by the engine, never read out of
 * the blob. The receiver's answer also lists its KV pool's regions in order (uuid, length):
 * a sender that only gets LMCache's remote_indexes (one index over the whole buffer) finds
 * the region and offset of index i from them.
 *
 * Anyone who reaches the init port can run the handshake under any node id, and every peer
 * costs the receiver something for good: verbs QPs (a completion queue has room for so
 * many peers, then every new handshake fails), a slot among the 64 peers upstream senders'
 * pages are granted to (hs_peers), a TCP peer with its lane token. So one source address
 * (kvt_guard_src_key: what the peer cannot choose) keeps at most transfer_max_peers_per_addr
 * node ids handshaken; past that its least recently handshaken one is forgotten (removed
 * from the transport, off hs_peers) -- a restarted engine's old id goes first, and a source
 * can only ever push out its own.
 */
#include <stdio.h>
#include <string.h>

#include "kvt/kvt_uuid.h"
#include "kvt_engine_int.h"

kvt_status_t kvt_hs_encode(kvt_engine_t *e, const void *blob, size_t len, int with_regions,
                           void **out, size_t *out_len)
{
    kvt_msg_t m;
    kvt_msg_transport_region_t regs[KVT_POOL_MAX_REGIONS];
    char uuids[KVT_POOL_MAX_REGIONS][KVT_UUID_STR_LEN + 1];
    uint32_t nr = with_regions && e->pool != NULL ? kvt_pool_nregions(e->pool) : 0;
    kvt_status_t st;

    if (nr > KVT_POOL_MAX_REGIONS)
        return KVT_ERR_LIMIT;
    memset(regs, 0, sizeof(regs));
    for (uint32_t i = 0; i < nr; i++) {
        kvt_region_info_t info;
        if (kvt_pool_region(e->pool, i, &info) != KVT_OK)
            return KVT_ERR_INVALID;
        kvt_uuid_to_str(&info.uuid, uuids[i]);
        regs[i].uuid = uuids[i];
        regs[i].length = (uint64_t)info.npages * info.page_size;
    }
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    m.u.tinit.node_id = e->id;
    m.u.tinit.transport = (char *)e->tdesc->name;
    m.u.tinit.regions = nr > 0 ? regs : NULL;
    m.u.tinit.nregions = nr;
    m.u.tinit.version = 1;
    m.u.tinit.addr.p = (uint8_t *)blob;
    m.u.tinit.addr.n = (uint32_t)len;
    st = kvt_msg_encode(&m, out, out_len);
    /* every field points at storage of ours or the caller's: nothing to clear */
    return st;
}

kvt_status_t kvt_hs_decode(kvt_engine_t *e, const void *data, size_t len, kvt_msg_t *m,
                           kvt_msg_err_t *err)
{
    kvt_status_t st = kvt_msg_decode(data, len, m, err);
    const kvt_msg_transport_init_t *t = &m->u.tinit;

    if (st != KVT_OK)
        return st;
    if (m->type != KVT_MSG_TRANSPORT_INIT)
        st = KVT_ERR_MSG_TYPE;
    else if (t->node_id[0] == '\0' || strlen(t->node_id) > KVT_TL_PEER_ID_MAX ||
             strchr(t->node_id, '\n') != NULL)
        st = KVT_ERR_MSG_FIELD; /* ids are joined with '\n' in grants */
    else if (strcmp(t->transport, e->tdesc->name) != 0 || t->addr.n == 0)
        st = KVT_ERR_PROTO; /* another transport, or an old peer without an address blob */
    if (st != KVT_OK) {
        if (err != NULL && err->field == NULL && st != KVT_ERR_MSG_TYPE)
            err->field = st == KVT_ERR_PROTO ? "addr" : "node_id";
        kvt_msg_clear(m);
    }
    return st;
}

/* ---- node ids per source address ------------------------------------------------------- */

#define KVT_HS_DEF_PEERS_PER_ADDR 16

/* One source's handshaken node ids, least recent first. */
typedef struct hs_src {
    uint32_t n;
    char *ids[]; /* transfer_max_peers_per_addr of them */
} hs_src_t;

static uint32_t peers_per_addr(const kvt_engine_t *e)
{
    uint32_t n = e->cfg.transfer_max_peers_per_addr;
    return n != 0 ? n : KVT_HS_DEF_PEERS_PER_ADDR;
}

/* Forget <id>: the transport drops it (its connection, grants, lanes) and upstream senders'
 * pages are no longer granted to it. */
static void forget_peer(kvt_engine_t *e, const char *src, const char *id)
{
    if (e->tl != NULL)
        e->tdesc->ops->peer_remove(e->tl, id);
    pthread_mutex_lock(&e->rx_lock);
    kvt_map_del(&e->hs_peers, id);
    pthread_mutex_unlock(&e->rx_lock);
    kvt_engine_refuse(e,
                      "init port: source %s keeps %u node ids handshaken "
                      "(transfer_max_peers_per_addr): forgetting its oldest, %.64s",
                      src, peers_per_addr(e), id);
}

void kvt_hs_note_peer(kvt_engine_t *e, const char *src, const char *peer)
{
    uint32_t cap = peers_per_addr(e);
    hs_src_t *h = kvt_map_get(&e->hs_srcs, src);
    char *id;

    if (h == NULL) {
        h = kvt_calloc(1, sizeof(*h) + cap * sizeof(h->ids[0]));
        if (h == NULL)
            return;
        if (kvt_map_put(&e->hs_srcs, src, h) != KVT_OK) {
            kvt_free(h);
            return;
        }
    }
    for (uint32_t i = 0; i < h->n; i++) {
        if (strcmp(h->ids[i], peer) != 0)
            continue;
        id = h->ids[i]; /* known: now the most recent */
        memmove(&h->ids[i], &h->ids[i + 1], (h->n - i - 1) * sizeof(h->ids[0]));
        h->ids[h->n - 1] = id;
        return;
    }
    if ((id = kvt_strdup(peer)) == NULL)
        return;
    if (h->n == cap) {
        char *old = h->ids[0];
        memmove(&h->ids[0], &h->ids[1], (h->n - 1) * sizeof(h->ids[0]));
        h->n--;
        forget_peer(e, src, old);
        kvt_free(old);
    }
    h->ids[h->n++] = id;
}

static void free_src(void *arg, const char *key, void *val)
{
    hs_src_t *h = val;
    (void)arg;
    (void)key;
    for (uint32_t i = 0; i < h->n; i++)
        kvt_free(h->ids[i]);
    kvt_free(h);
}

void kvt_hs_fini(kvt_engine_t *e)
{
    if (e->hs_srcs.buckets == NULL)
        return;
    kvt_map_each(&e->hs_srcs, free_src, NULL);
    kvt_map_fini(&e->hs_srcs);
}
