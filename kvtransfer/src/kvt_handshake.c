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
 */
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
