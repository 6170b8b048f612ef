/*
 * kvt_msg.c -- message descriptor tables (docs/protocols/lmcache-wire.md, in wire
 * order) and the generic init / clear / copy / list helpers.
 */
#include "kvt_msg_int.h"

#include <string.h>

#define FLD(st, member, kind, req, def)                                                            \
    {                                                                                              \
#member, kind, offsetof(st, member), req, def, 0, 0, NULL, 0                               \
    }
#define FLDN(st, member, kind, req, def, maxn)                                                     \
    {                                                                                              \
#member, kind, offsetof(st, member), req, def, maxn, 0, NULL, 0                            \
    }
/* pdgw extension field: optional, never encoded while it holds its default */
#define FLDX(st, member, kind)                                                                     \
    {                                                                                              \
#member, kind, offsetof(st, member), 0, 0, 0, 0, NULL, 1                                   \
    }
#define FLDS(st, member, count, elemdesc, req)                                                     \
    {                                                                                              \
#member, KVT_F_STRUCT_LIST, offsetof(st, member), req, 0, 0, offsetof(st, count),          \
            elemdesc, 0                                                                            \
    }
#define DESC(wname, st, table)                                                                     \
    {                                                                                              \
        wname, table, sizeof(table) / sizeof(table[0]), sizeof(st)                                 \
    }

typedef kvt_msg_alloc_request_t areq_t;
static const kvt_msg_field_t alloc_request_fields[] = {
    FLD(areq_t, keys, KVT_F_STR_LIST, 1, 0),
    FLD(areq_t, fmt, KVT_F_INT, 1, 0),
    FLDN(areq_t, shape, KVT_F_INT_LIST, 1, 0, KVT_MSG_MAX_DIMS),
    FLD(areq_t, dtype, KVT_F_STR, 1, 0),
    FLD(areq_t, last_chunk_toks, KVT_F_INT, 1, 0),
    FLD(areq_t, req_id, KVT_F_STR, 0, 0),
    FLD(areq_t, is_last_batch, KVT_F_BOOL, 0, 0),
    FLD(areq_t, total_chunks, KVT_F_INT, 0, 0),
    FLDX(areq_t, kvt_ext, KVT_F_INT),
};

typedef kvt_msg_alloc_response_t aresp_t;
/* Sync PDBackend order; both fields always encoded. Decoding accepts a
 * missing already_sent_indexes (the async backend declares it with a
 * default). */
static const kvt_msg_field_t alloc_response_fields[] = {
    FLD(aresp_t, already_sent_indexes, KVT_F_INT_LIST, 0, 0),
    FLD(aresp_t, remote_indexes, KVT_F_INT_LIST, 1, 0),
};
/* PDBackendAsync order: remote_indexes first. */
static const kvt_msg_field_t alloc_response_async_fields[] = {
    FLD(aresp_t, remote_indexes, KVT_F_INT_LIST, 1, 0),
    FLD(aresp_t, already_sent_indexes, KVT_F_INT_LIST, 0, 0),
};
static const kvt_msg_field_t ascend_alloc_response_fields[] = {
    FLD(aresp_t, already_sent_indexes, KVT_F_INT_LIST, 1, 0),
    FLD(aresp_t, remote_indexes, KVT_F_INT_LIST, 1, 0),
    FLD(aresp_t, remote_buffer_uuids, KVT_F_STR_LIST, 1, 0),
    FLD(aresp_t, alloc_failed, KVT_F_BOOL, 0, 0),
    FLDX(aresp_t, kvt_ext, KVT_F_INT),
};

static const kvt_msg_field_t proxy_notif_fields[] = {
    FLD(kvt_msg_proxy_notif_t, req_id, KVT_F_STR, 1, 0),
};

typedef kvt_msg_pull_ready_notif_t prn_t;
static const kvt_msg_field_t pull_ready_notif_fields[] = {
    FLD(prn_t, pull_id, KVT_F_STR, 1, 0),
    FLD(prn_t, keys, KVT_F_STR_LIST, 1, 0),
    FLD(prn_t, sender_buffer_uuids, KVT_F_STR_LIST, 1, 0),
    FLD(prn_t, sender_mem_indexes, KVT_F_INT_LIST, 1, 0),
    FLD(prn_t, sender_id, KVT_F_STR, 1, 0),
    FLD(prn_t, sender_done_url, KVT_F_STR, 1, 0),
    FLD(prn_t, fmt, KVT_F_INT, 1, 0),
    FLDN(prn_t, shape, KVT_F_INT_LIST, 1, 0, KVT_MSG_MAX_DIMS),
    FLD(prn_t, dtype, KVT_F_STR, 1, 0),
    FLD(prn_t, last_chunk_toks, KVT_F_INT, 1, 0),
    FLDX(prn_t, kvt_ext, KVT_F_INT),
};

static const kvt_msg_field_t pull_ready_done_ack_fields[] = {
    FLD(kvt_msg_pull_ready_done_ack_t, already_sent_indexes, KVT_F_INT_LIST, 1, 0),
    FLD(kvt_msg_pull_ready_done_ack_t, alloc_failed, KVT_F_BOOL, 0, 0),
    FLDX(kvt_msg_pull_ready_done_ack_t, kvt_ext, KVT_F_INT),
};

static const kvt_msg_field_t pull_done_signal_fields[] = {
    FLD(kvt_msg_pull_done_signal_t, pull_id, KVT_F_STR, 1, 0),
};

static const kvt_msg_field_t cancel_notif_fields[] = {
    FLD(kvt_msg_cancel_notif_t, req_id, KVT_F_STR, 1, 0),
    FLD(kvt_msg_cancel_notif_t, keys, KVT_F_STR_LIST, 1, 0),
};

static const kvt_msg_field_t reserve_request_fields[] = {
    FLD(kvt_msg_reserve_request_t, req_id, KVT_F_STR, 1, 0),
    FLD(kvt_msg_reserve_request_t, total_chunks, KVT_F_INT, 1, 0),
    FLD(kvt_msg_reserve_request_t, ttl_ms, KVT_F_INT, 1, 0),
};

static const kvt_msg_field_t reserve_response_fields[] = {
    FLD(kvt_msg_reserve_response_t, req_id, KVT_F_STR, 1, 0),
    FLD(kvt_msg_reserve_response_t, granted, KVT_F_BOOL, 1, 0),
    FLD(kvt_msg_reserve_response_t, free_chunks, KVT_F_INT, 1, 0),
};

typedef kvt_msg_transport_lane_t lane_t;
static const kvt_msg_field_t transport_lane_fields[] = {
    FLD(lane_t, host, KVT_F_STR, 0, 0),   FLD(lane_t, port, KVT_F_INT, 0, 0),
    FLD(lane_t, qp_num, KVT_F_INT, 0, 0), FLD(lane_t, lid, KVT_F_INT, 0, 0),
    FLD(lane_t, gid, KVT_F_STR, 0, 0),    FLD(lane_t, psn, KVT_F_INT, 0, 0),
    FLD(lane_t, mtu, KVT_F_INT, 0, 0),
};
static const kvt_msg_desc_t transport_lane_desc =
    DESC("TransportLane", lane_t, transport_lane_fields);

typedef kvt_msg_transport_region_t treg_t;
static const kvt_msg_field_t transport_region_fields[] = {
    FLD(treg_t, uuid, KVT_F_STR, 1, 0),
    FLD(treg_t, addr, KVT_F_U64, 1, 0),
    FLD(treg_t, length, KVT_F_U64, 1, 0),
    FLD(treg_t, rkey, KVT_F_INT, 0, 0),
};
static const kvt_msg_desc_t transport_region_desc =
    DESC("TransportRegion", treg_t, transport_region_fields);

typedef kvt_msg_transport_init_t tinit_t;
static const kvt_msg_field_t transport_init_fields[] = {
    FLD(tinit_t, node_id, KVT_F_STR, 1, 0),
    FLD(tinit_t, transport, KVT_F_STR, 1, 0),
    FLDS(tinit_t, lanes, nlanes, &transport_lane_desc, 1),
    FLDS(tinit_t, regions, nregions, &transport_region_desc, 0),
    FLD(tinit_t, version, KVT_F_INT, 0, 1),
    FLD(tinit_t, epoch, KVT_F_INT, 0, 0),
    FLDX(tinit_t, addr, KVT_F_BIN),
};

static const kvt_msg_desc_t msg_descs[KVT_MSG_TYPE_COUNT] = {
    [KVT_MSG_ALLOC_REQUEST] = DESC("AllocRequest", areq_t, alloc_request_fields),
    [KVT_MSG_ALLOC_RESPONSE] = DESC("AllocResponse", aresp_t, alloc_response_fields),
    [KVT_MSG_ASCEND_ALLOC_RESPONSE] =
        DESC("AscendAllocResponse", aresp_t, ascend_alloc_response_fields),
    [KVT_MSG_PROXY_NOTIF] = DESC("ProxyNotif", kvt_msg_proxy_notif_t, proxy_notif_fields),
    [KVT_MSG_PULL_READY_NOTIF] = DESC("PullReadyNotif", prn_t, pull_ready_notif_fields),
    [KVT_MSG_PULL_READY_DONE_ACK] =
        DESC("PullReadyDoneAck", kvt_msg_pull_ready_done_ack_t, pull_ready_done_ack_fields),
    [KVT_MSG_PULL_DONE_SIGNAL] =
        DESC("PullDoneSignal", kvt_msg_pull_done_signal_t, pull_done_signal_fields),
    [KVT_MSG_CANCEL_NOTIF] = DESC("CancelNotif", kvt_msg_cancel_notif_t, cancel_notif_fields),
    [KVT_MSG_RESERVE_REQUEST] =
        DESC("ReserveRequest", kvt_msg_reserve_request_t, reserve_request_fields),
    [KVT_MSG_RESERVE_RESPONSE] =
        DESC("ReserveResponse", kvt_msg_reserve_response_t, reserve_response_fields),
    [KVT_MSG_TRANSPORT_INIT] = DESC("TransportInit", tinit_t, transport_init_fields),
    /* same wire name as ALLOC_RESPONSE, which comes first and so is what
     * "AllocResponse" decodes to */
    [KVT_MSG_ALLOC_RESPONSE_ASYNC] = DESC("AllocResponse", aresp_t, alloc_response_async_fields),
};

const kvt_msg_desc_t *kvt_msg_desc(kvt_msg_type_t t)
{
    if (t <= KVT_MSG_NONE || t >= KVT_MSG_TYPE_COUNT)
        return NULL;
    return &msg_descs[t];
}

const char *kvt_msg_type_name(kvt_msg_type_t t)
{
    const kvt_msg_desc_t *d = kvt_msg_desc(t);
    return d != NULL ? d->name : NULL;
}

kvt_msg_type_t kvt_msg_type_from_name(const char *name, size_t len)
{
    if (name == NULL)
        return KVT_MSG_NONE;
    for (int t = KVT_MSG_NONE + 1; t < KVT_MSG_TYPE_COUNT; t++) {
        const char *n = msg_descs[t].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return (kvt_msg_type_t)t;
    }
    return KVT_MSG_NONE;
}

int kvt_msg_has_field(const kvt_msg_t *m, const char *name)
{
    const kvt_msg_desc_t *d = m != NULL ? kvt_msg_desc(m->type) : NULL;

    for (uint32_t i = 0; d != NULL && name != NULL && i < d->nfields && i < 64; i++)
        if (strcmp(d->fields[i].name, name) == 0)
            return (m->present >> i) & 1u;
    return 0;
}

/* ---- lists ----------------------------------------------------------------- */

void kvt_str_list_clear(kvt_str_list_t *l)
{
    if (l->v != NULL) {
        for (uint32_t i = 0; i < l->n; i++)
            kvt_free(l->v[i]);
        kvt_free(l->v);
    }
    l->v = NULL;
    l->n = 0;
}

void kvt_int_list_clear(kvt_int_list_t *l)
{
    kvt_free(l->v);
    l->v = NULL;
    l->n = 0;
}

kvt_status_t kvt_str_list_set(kvt_str_list_t *l, const char *const *v, uint32_t n)
{
    kvt_str_list_t nl = {NULL, 0};

    if (n > 0) {
        nl.v = kvt_calloc(n, sizeof(*nl.v));
        if (nl.v == NULL)
            return KVT_ERR_NOMEM;
        for (; nl.n < n; nl.n++) {
            nl.v[nl.n] = kvt_strdup(v[nl.n] != NULL ? v[nl.n] : "");
            if (nl.v[nl.n] == NULL) {
                kvt_str_list_clear(&nl);
                return KVT_ERR_NOMEM;
            }
        }
    }
    kvt_str_list_clear(l);
    *l = nl;
    return KVT_OK;
}

kvt_status_t kvt_str_list_push(kvt_str_list_t *l, const char *s)
{
    char *copy = kvt_strdup(s != NULL ? s : "");
    char **nv;

    if (copy == NULL)
        return KVT_ERR_NOMEM;
    nv = kvt_realloc(l->v, ((size_t)l->n + 1) * sizeof(*nv));
    if (nv == NULL) {
        kvt_free(copy);
        return KVT_ERR_NOMEM;
    }
    nv[l->n] = copy;
    l->v = nv;
    l->n++;
    return KVT_OK;
}

kvt_status_t kvt_int_list_set(kvt_int_list_t *l, const int64_t *v, uint32_t n)
{
    int64_t *nv = NULL;

    if (n > 0) {
        nv = kvt_malloc((size_t)n * sizeof(*nv));
        if (nv == NULL)
            return KVT_ERR_NOMEM;
        memcpy(nv, v, (size_t)n * sizeof(*nv));
    }
    kvt_int_list_clear(l);
    l->v = nv;
    l->n = n;
    return KVT_OK;
}

kvt_status_t kvt_int_list_push(kvt_int_list_t *l, int64_t v)
{
    int64_t *nv = kvt_realloc(l->v, ((size_t)l->n + 1) * sizeof(*nv));

    if (nv == NULL)
        return KVT_ERR_NOMEM;
    nv[l->n] = v;
    l->v = nv;
    l->n++;
    return KVT_OK;
}

kvt_status_t kvt_msg_set_str(char **dst, const char *s)
{
    char *copy = kvt_strdup(s != NULL ? s : "");

    if (copy == NULL)
        return KVT_ERR_NOMEM;
    kvt_free(*dst);
    *dst = copy;
    return KVT_OK;
}

kvt_status_t kvt_bytes_set(kvt_bytes_t *b, const void *p, size_t n)
{
    uint8_t *copy = NULL;

    if (n > KVT_MSG_MAX_STR)
        return KVT_ERR_LIMIT;
    if (n > 0) {
        copy = kvt_malloc(n);
        if (copy == NULL)
            return KVT_ERR_NOMEM;
        memcpy(copy, p, n);
    }
    kvt_free(b->p);
    b->p = copy;
    b->n = (uint32_t)n;
    return KVT_OK;
}

/* ---- generic struct walkers ---------------------------------------------- */

void kvt_msg_struct_clear(const kvt_msg_desc_t *d, void *base)
{
    for (uint32_t i = 0; i < d->nfields; i++) {
        const kvt_msg_field_t *f = &d->fields[i];
        switch (f->kind) {
        case KVT_F_STR: {
            char **s = KVT_FIELD_PTR(base, f, char *);
            kvt_free(*s);
            *s = NULL;
            break;
        }
        case KVT_F_STR_LIST:
            kvt_str_list_clear(KVT_FIELD_PTR(base, f, kvt_str_list_t));
            break;
        case KVT_F_INT_LIST:
            kvt_int_list_clear(KVT_FIELD_PTR(base, f, kvt_int_list_t));
            break;
        case KVT_F_STRUCT_LIST: {
            char **arr = KVT_FIELD_PTR(base, f, char *);
            uint32_t *cnt = (uint32_t *)((char *)base + f->count_off);
            if (*arr != NULL) {
                for (uint32_t k = 0; k < *cnt; k++)
                    kvt_msg_struct_clear(f->elem, *arr + (size_t)k * f->elem->size);
                kvt_free(*arr);
            }
            *arr = NULL;
            *cnt = 0;
            break;
        }
        case KVT_F_BIN: {
            kvt_bytes_t *b = KVT_FIELD_PTR(base, f, kvt_bytes_t);
            kvt_free(b->p);
            b->p = NULL;
            b->n = 0;
            break;
        }
        case KVT_F_INT:
        case KVT_F_U64:
        case KVT_F_BOOL:
            break;
        }
    }
}

kvt_status_t kvt_msg_struct_defaults(const kvt_msg_desc_t *d, void *base)
{
    for (uint32_t i = 0; i < d->nfields; i++) {
        const kvt_msg_field_t *f = &d->fields[i];
        if (f->required)
            continue;
        switch (f->kind) {
        case KVT_F_STR: {
            char **s = KVT_FIELD_PTR(base, f, char *);
            if (*s == NULL && kvt_msg_set_str(s, "") != KVT_OK)
                return KVT_ERR_NOMEM;
            break;
        }
        case KVT_F_INT:
            *KVT_FIELD_PTR(base, f, int64_t) = f->def;
            break;
        case KVT_F_U64:
            *KVT_FIELD_PTR(base, f, uint64_t) = (uint64_t)f->def;
            break;
        case KVT_F_BOOL:
            *KVT_FIELD_PTR(base, f, int) = f->def != 0;
            break;
        default:
            break;
        }
    }
    return KVT_OK;
}

kvt_status_t kvt_msg_struct_copy(const kvt_msg_desc_t *d, void *dst, const void *src)
{
    kvt_status_t status = KVT_OK;

    memset(dst, 0, d->size);
    for (uint32_t i = 0; i < d->nfields && status == KVT_OK; i++) {
        const kvt_msg_field_t *f = &d->fields[i];
        switch (f->kind) {
        case KVT_F_STR: {
            const char *s = *KVT_FIELD_CPTR(src, f, char *);
            if (s != NULL)
                status = kvt_msg_set_str(KVT_FIELD_PTR(dst, f, char *), s);
            break;
        }
        case KVT_F_INT:
            *KVT_FIELD_PTR(dst, f, int64_t) = *KVT_FIELD_CPTR(src, f, int64_t);
            break;
        case KVT_F_U64:
            *KVT_FIELD_PTR(dst, f, uint64_t) = *KVT_FIELD_CPTR(src, f, uint64_t);
            break;
        case KVT_F_BOOL:
            *KVT_FIELD_PTR(dst, f, int) = *KVT_FIELD_CPTR(src, f, int);
            break;
        case KVT_F_STR_LIST: {
            const kvt_str_list_t *l = KVT_FIELD_CPTR(src, f, kvt_str_list_t);
            status = kvt_str_list_set(KVT_FIELD_PTR(dst, f, kvt_str_list_t),
                                      (const char *const *)l->v, l->n);
            break;
        }
        case KVT_F_INT_LIST: {
            const kvt_int_list_t *l = KVT_FIELD_CPTR(src, f, kvt_int_list_t);
            status = kvt_int_list_set(KVT_FIELD_PTR(dst, f, kvt_int_list_t), l->v, l->n);
            break;
        }
        case KVT_F_BIN: {
            const kvt_bytes_t *b = KVT_FIELD_CPTR(src, f, kvt_bytes_t);
            status = kvt_bytes_set(KVT_FIELD_PTR(dst, f, kvt_bytes_t), b->p, b->n);
            break;
        }
        case KVT_F_STRUCT_LIST: {
            const char *sarr = *KVT_FIELD_CPTR(src, f, char *);
            uint32_t n = *(const uint32_t *)((const char *)src + f->count_off);
            char *darr;
            if (n == 0 || sarr == NULL)
                break;
            darr = kvt_calloc(n, f->elem->size);
            if (darr == NULL) {
                status = KVT_ERR_NOMEM;
                break;
            }
            *KVT_FIELD_PTR(dst, f, char *) = darr;
            for (uint32_t k = 0; k < n && status == KVT_OK; k++) {
                status = kvt_msg_struct_copy(f->elem, darr + (size_t)k * f->elem->size,
                                             sarr + (size_t)k * f->elem->size);
                /* count only fully copied elements so clear() frees exactly them */
                if (status == KVT_OK)
                    *(uint32_t *)((char *)dst + f->count_off) = k + 1;
                else
                    kvt_msg_struct_clear(f->elem, darr + (size_t)k * f->elem->size);
            }
            break;
        }
        }
    }
    if (status != KVT_OK)
        kvt_msg_struct_clear(d, dst);
    return status;
}

/* ---- whole messages ------------------------------------------------------- */

void kvt_msg_init(kvt_msg_t *m, kvt_msg_type_t type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
}

void kvt_msg_clear(kvt_msg_t *m)
{
    const kvt_msg_desc_t *d;

    if (m == NULL)
        return;
    d = kvt_msg_desc(m->type);
    if (d != NULL)
        kvt_msg_struct_clear(d, &m->u);
    memset(m, 0, sizeof(*m));
}

kvt_status_t kvt_msg_copy(kvt_msg_t *dst, const kvt_msg_t *src)
{
    const kvt_msg_desc_t *d;
    kvt_msg_t tmp;
    kvt_status_t status;

    if (dst == NULL || src == NULL)
        return KVT_ERR_INVALID;
    d = kvt_msg_desc(src->type);
    if (d == NULL)
        return KVT_ERR_INVALID;
    kvt_msg_init(&tmp, src->type);
    status = kvt_msg_struct_copy(d, &tmp.u, &src->u);
    tmp.present = src->present;
    if (status != KVT_OK)
        return status;
    *dst = tmp;
    return KVT_OK;
}
