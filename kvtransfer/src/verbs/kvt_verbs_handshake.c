/*
 * The verbs handshake payload. It is libkvt's TransportInit message
 * (kvt_msg.h), so the bytes on the init port are the same msgpack map for every
 * transport: one lane per QP carries qp_num/psn/lid/gid/mtu, one region entry
 * per MR carries uuid/addr/length/rkey. A region cut into several MRs (larger
 * than the device's max MR size) is sent as consecutive entries with the same
 * uuid; the decoder rebuilds the chunk map and rejects anything that is not
 * exactly that shape, so a bad peer cannot make a slice use a wrong key.
 */
#include <stdio.h>
#include <string.h>

#include "kvt/kvt_msg.h"
#include "kvt_verbs_int.h"
#include "pdb/pdb_hex.h"

#define KVT_VERBS_TRANSPORT_NAME "verbs"

uint32_t kvt_verbs_mtu_bytes(uint8_t mtu)
{
    switch (mtu) {
    case IBV_MTU_256:
        return 256;
    case IBV_MTU_512:
        return 512;
    case IBV_MTU_1024:
        return 1024;
    case IBV_MTU_2048:
        return 2048;
    case IBV_MTU_4096:
        return 4096;
    default:
        return 0;
    }
}

uint8_t kvt_verbs_mtu_enum(uint64_t bytes)
{
    for (uint8_t m = IBV_MTU_256; m <= IBV_MTU_4096; m++)
        if (kvt_verbs_mtu_bytes(m) == bytes)
            return m;
    return 0;
}

void kvt_verbs_gid_format(const uint8_t gid[16], char out[40])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + i * 5, 6, "%02x%02x%s", gid[2 * i], gid[2 * i + 1], i < 7 ? ":" : "");
}

kvt_status_t kvt_verbs_gid_parse(const char *s, uint8_t gid[16])
{
    uint8_t g[16];

    if (s == NULL || strlen(s) != 39)
        return KVT_ERR_INVALID;
    for (int i = 0; i < 8; i++) {
        const char *p = s + i * 5;
        int v[4];

        for (int k = 0; k < 4; k++) {
            v[k] = pdb_hex_val(p[k]);
            if (v[k] < 0)
                return KVT_ERR_INVALID;
        }
        if (i < 7 && p[4] != ':')
            return KVT_ERR_INVALID;
        g[2 * i] = (uint8_t)(v[0] << 4 | v[1]);
        g[2 * i + 1] = (uint8_t)(v[2] << 4 | v[3]);
    }
    memcpy(gid, g, sizeof(g));
    return KVT_OK;
}

void kvt_verbs_hs_clear(kvt_verbs_hs_t *hs)
{
    for (uint32_t i = 0; i < hs->nregions; i++)
        kvt_verbs_mr_map_clear(&hs->regions[i]);
    kvt_free(hs->regions);
    memset(hs, 0, sizeof(*hs));
}

const kvt_verbs_mr_map_t *kvt_verbs_hs_region(const kvt_verbs_hs_t *hs, const char *uuid)
{
    for (uint32_t i = 0; i < hs->nregions; i++)
        if (strcmp(hs->regions[i].uuid, uuid) == 0)
            return &hs->regions[i];
    return NULL;
}

kvt_status_t kvt_verbs_hs_encode(const kvt_verbs_hs_t *hs, void **buf, size_t *len)
{
    kvt_msg_transport_init_t *t;
    kvt_status_t st;
    kvt_msg_t m;
    char gid[40];
    uint32_t nentries = 0, e = 0;

    if (hs->nqps == 0 || hs->nqps > KVT_VERBS_MAX_QPS)
        return KVT_ERR_INVALID;
    for (uint32_t r = 0; r < hs->nregions; r++)
        nentries += hs->regions[r].nkeys;
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    t = &m.u.tinit;
    t->version = 1;
    t->epoch = (int64_t)(hs->epoch & INT64_MAX);
    kvt_verbs_gid_format(hs->port.gid, gid);
    st = kvt_msg_set_str(&t->node_id, hs->id);
    if (st == KVT_OK)
        st = kvt_msg_set_str(&t->transport, KVT_VERBS_TRANSPORT_NAME);
    if (st != KVT_OK)
        goto err_msg;
    t->lanes = kvt_calloc(hs->nqps, sizeof(*t->lanes));
    if (t->lanes == NULL) {
        st = KVT_ERR_NOMEM;
        goto err_msg;
    }
    t->nlanes = hs->nqps;
    for (uint32_t i = 0; i < hs->nqps; i++) {
        kvt_msg_transport_lane_t *l = &t->lanes[i];

        l->qp_num = hs->qps[i].qpn;
        l->psn = hs->qps[i].psn;
        l->lid = hs->port.lid;
        l->mtu = kvt_verbs_mtu_bytes(hs->port.mtu);
        st = kvt_msg_set_str(&l->gid, gid);
        if (st == KVT_OK)
            st = kvt_msg_set_str(&l->host, "");
        if (st != KVT_OK)
            goto err_msg;
    }
    if (nentries > 0) {
        t->regions = kvt_calloc(nentries, sizeof(*t->regions));
        if (t->regions == NULL) {
            st = KVT_ERR_NOMEM;
            goto err_msg;
        }
        t->nregions = nentries;
    }
    for (uint32_t r = 0; r < hs->nregions; r++) {
        const kvt_verbs_mr_map_t *map = &hs->regions[r];

        for (uint32_t k = 0; k < map->nkeys; k++, e++) {
            uint64_t off = (uint64_t)k * map->chunk_size;
            uint64_t l = map->len - off < map->chunk_size ? map->len - off : map->chunk_size;

            t->regions[e].addr = map->base + off;
            t->regions[e].length = l;
            t->regions[e].rkey = map->keys[k];
            st = kvt_msg_set_str(&t->regions[e].uuid, map->uuid);
            if (st != KVT_OK)
                goto err_msg;
        }
    }
    st = kvt_msg_encode(&m, buf, len);
err_msg:
    kvt_msg_clear(&m);
    return st;
}

/* Lanes: all share the port's lid/gid/mtu (they are QPs of one port). */
static kvt_status_t decode_lanes(const kvt_msg_transport_init_t *t, kvt_verbs_hs_t *hs)
{
    if (t->nlanes == 0 || t->nlanes > KVT_VERBS_MAX_QPS)
        return KVT_ERR_MSG_FIELD;
    for (uint32_t i = 0; i < t->nlanes; i++) {
        const kvt_msg_transport_lane_t *l = &t->lanes[i];
        uint8_t gid[16];

        if (l->qp_num <= 0 || l->qp_num > 0xffffff || l->psn < 0 || l->psn > 0xffffff ||
            l->lid < 0 || l->lid > 0xffff || kvt_verbs_mtu_enum((uint64_t)l->mtu) == 0 ||
            l->mtu < 0 || kvt_verbs_gid_parse(l->gid, gid) != KVT_OK)
            return KVT_ERR_MSG_FIELD;
        if (i == 0) {
            hs->port.lid = (uint16_t)l->lid;
            memcpy(hs->port.gid, gid, 16);
            hs->port.mtu = kvt_verbs_mtu_enum((uint64_t)l->mtu);
        } else if (hs->port.lid != l->lid || memcmp(hs->port.gid, gid, 16) != 0 ||
                   hs->port.mtu != kvt_verbs_mtu_enum((uint64_t)l->mtu)) {
            return KVT_ERR_MSG_FIELD;
        }
        hs->qps[i].qpn = (uint32_t)l->qp_num;
        hs->qps[i].psn = (uint32_t)l->psn;
    }
    hs->nqps = t->nlanes;
    return KVT_OK;
}

/* Region entries: runs of equal uuid become one chunk map. Inside a run,
 * entries must be contiguous, all but the last exactly chunk-sized, and the
 * last no larger. */
static kvt_status_t decode_regions(const kvt_msg_transport_init_t *t, kvt_verbs_hs_t *hs)
{
    uint32_t i = 0;
    kvt_status_t st;

    if (t->nregions == 0)
        return KVT_OK;
    hs->regions = kvt_calloc(t->nregions, sizeof(*hs->regions));
    if (hs->regions == NULL)
        return KVT_ERR_NOMEM;
    while (i < t->nregions) {
        const kvt_msg_transport_region_t *first = &t->regions[i];
        kvt_verbs_mr_map_t *map;
        uint32_t j = i;
        uint64_t total = 0, chunk = first->length;

        if (first->uuid == NULL || strlen(first->uuid) != KVT_VERBS_UUID_LEN ||
            kvt_verbs_hs_region(hs, first->uuid) != NULL)
            return KVT_ERR_MSG_FIELD;
        while (j < t->nregions && t->regions[j].uuid != NULL &&
               strcmp(t->regions[j].uuid, first->uuid) == 0) {
            const kvt_msg_transport_region_t *r = &t->regions[j];

            if (r->length == 0 || r->rkey < 0 || r->rkey > 0xffffffffLL ||
                r->addr != first->addr + total || r->addr + r->length < r->addr ||
                r->length > chunk ||
                (r->length != chunk && j + 1 < t->nregions && t->regions[j + 1].uuid != NULL &&
                 strcmp(t->regions[j + 1].uuid, first->uuid) == 0))
                return KVT_ERR_MSG_FIELD;
            total += r->length;
            j++;
        }
        if (j - i > KVT_VERBS_MAX_MR_CHUNKS)
            return KVT_ERR_LIMIT;
        map = &hs->regions[hs->nregions];
        st = kvt_verbs_mr_map_init(map, first->uuid, first->addr, total, j - i > 1 ? chunk : 0);
        if (st != KVT_OK)
            return st == KVT_ERR_NOMEM ? st : KVT_ERR_MSG_FIELD;
        hs->nregions++;
        if (map->nkeys != j - i)
            return KVT_ERR_MSG_FIELD;
        for (uint32_t k = 0; k < map->nkeys; k++)
            map->keys[k] = (uint32_t)t->regions[i + k].rkey;
        i = j;
    }
    return KVT_OK;
}

kvt_status_t kvt_verbs_hs_decode(const void *buf, size_t len, kvt_verbs_hs_t *hs)
{
    const kvt_msg_transport_init_t *t;
    kvt_verbs_hs_t tmp;
    kvt_status_t st;
    kvt_msg_t m;

    st = kvt_msg_decode(buf, len, &m, NULL);
    if (st != KVT_OK)
        return st;
    memset(&tmp, 0, sizeof(tmp));
    st = KVT_ERR_MSG_TYPE;
    if (m.type != KVT_MSG_TRANSPORT_INIT)
        goto err_msg;
    t = &m.u.tinit;
    st = KVT_ERR_MSG_FIELD;
    if (t->transport == NULL || strcmp(t->transport, KVT_VERBS_TRANSPORT_NAME) != 0 ||
        t->node_id == NULL || t->node_id[0] == '\0' || strlen(t->node_id) > KVT_VERBS_ID_MAX)
        goto err_msg;
    strcpy(tmp.id, t->node_id);
    tmp.epoch = t->epoch > 0 ? (uint64_t)t->epoch : 0;
    st = decode_lanes(t, &tmp);
    if (st == KVT_OK)
        st = decode_regions(t, &tmp);
    if (st != KVT_OK)
        goto err_hs;
    kvt_msg_clear(&m);
    *hs = tmp;
    return KVT_OK;

err_hs:
    kvt_verbs_hs_clear(&tmp);
err_msg:
    kvt_msg_clear(&m);
    return st;
}
