/*
 * kvt_msg_encode.c -- msgpack encoder for libkvt messages: a map with
 * "type" first, then every field of the descriptor in wire order (msgspec
 * tagged struct layout). Nested structs (TransportLane, TransportRegion) use
 * the same layout.
 */
#include "kvt_msg_int.h"

#include <msgpack.h>
#include <string.h>

/* Output buffer grown with kvt_realloc so fault injection reaches it. */
typedef struct enc_buf {
    char *data;
    size_t len;
    size_t cap;
    int failed; /* 1 = no memory, 2 = over KVT_MSG_MAX_BYTES */
} enc_buf_t;

static int enc_write(void *arg, const char *buf, size_t len)
{
    enc_buf_t *b = arg;

    if (b->failed)
        return -1;
    if (len > KVT_MSG_MAX_BYTES - b->len) {
        b->failed = 2;
        return -1;
    }
    if (b->len + len > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        char *nd;
        while (ncap < b->len + len)
            ncap *= 2;
        nd = kvt_realloc(b->data, ncap);
        if (nd == NULL) {
            b->failed = 1;
            return -1;
        }
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
}

static kvt_status_t pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n;

    if (s == NULL)
        s = "";
    n = strlen(s);
    if (n > KVT_MSG_MAX_STR)
        return KVT_ERR_LIMIT;
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
    return KVT_OK;
}

static kvt_status_t pack_struct(msgpack_packer *pk, const kvt_msg_desc_t *d, const void *base,
                                unsigned depth);

/* An extension field holding its default is left out (msgspec omit_defaults
 * style), so a peer that does not know it sees upstream's exact bytes. */
static int field_omitted(const kvt_msg_field_t *f, const void *base)
{
    if (!f->omit_default)
        return 0;
    switch (f->kind) {
    case KVT_F_INT:
        return *KVT_FIELD_CPTR(base, f, int64_t) == f->def;
    case KVT_F_BOOL:
        return *KVT_FIELD_CPTR(base, f, int) == (int)f->def;
    case KVT_F_STR: {
        const char *v = *KVT_FIELD_CPTR(base, f, char *);
        return v == NULL || v[0] == '\0';
    }
    case KVT_F_STR_LIST:
        return KVT_FIELD_CPTR(base, f, kvt_str_list_t)->n == 0;
    case KVT_F_INT_LIST:
        return KVT_FIELD_CPTR(base, f, kvt_int_list_t)->n == 0;
    case KVT_F_BIN:
        return KVT_FIELD_CPTR(base, f, kvt_bytes_t)->n == 0;
    default:
        return 0;
    }
}

static kvt_status_t pack_field(msgpack_packer *pk, const kvt_msg_field_t *f, const void *base,
                               unsigned depth)
{
    uint32_t maxn = f->max_items ? f->max_items : KVT_MSG_MAX_ITEMS;
    kvt_status_t status;

    switch (f->kind) {
    case KVT_F_STR:
        return pack_cstr(pk, *KVT_FIELD_CPTR(base, f, char *));
    case KVT_F_BIN: {
        const kvt_bytes_t *b = KVT_FIELD_CPTR(base, f, kvt_bytes_t);
        if (b->n > KVT_MSG_MAX_STR)
            return KVT_ERR_LIMIT;
        msgpack_pack_bin(pk, b->n);
        if (b->n > 0)
            msgpack_pack_bin_body(pk, b->p, b->n);
        return KVT_OK;
    }
    case KVT_F_INT:
        msgpack_pack_int64(pk, *KVT_FIELD_CPTR(base, f, int64_t));
        return KVT_OK;
    case KVT_F_U64:
        msgpack_pack_uint64(pk, *KVT_FIELD_CPTR(base, f, uint64_t));
        return KVT_OK;
    case KVT_F_BOOL:
        if (*KVT_FIELD_CPTR(base, f, int))
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
        return KVT_OK;
    case KVT_F_STR_LIST: {
        const kvt_str_list_t *l = KVT_FIELD_CPTR(base, f, kvt_str_list_t);
        if (l->n > maxn)
            return KVT_ERR_LIMIT;
        msgpack_pack_array(pk, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            status = pack_cstr(pk, l->v[i]);
            if (status != KVT_OK)
                return status;
        }
        return KVT_OK;
    }
    case KVT_F_INT_LIST: {
        const kvt_int_list_t *l = KVT_FIELD_CPTR(base, f, kvt_int_list_t);
        if (l->n > maxn)
            return KVT_ERR_LIMIT;
        msgpack_pack_array(pk, l->n);
        for (uint32_t i = 0; i < l->n; i++)
            msgpack_pack_int64(pk, l->v[i]);
        return KVT_OK;
    }
    case KVT_F_STRUCT_LIST: {
        const char *arr = *KVT_FIELD_CPTR(base, f, char *);
        uint32_t n = *(const uint32_t *)((const char *)base + f->count_off);
        if (n > maxn)
            return KVT_ERR_LIMIT;
        if (n > 0 && arr == NULL)
            return KVT_ERR_INVALID;
        msgpack_pack_array(pk, n);
        for (uint32_t i = 0; i < n; i++) {
            status = pack_struct(pk, f->elem, arr + (size_t)i * f->elem->size, depth + 1);
            if (status != KVT_OK)
                return status;
        }
        return KVT_OK;
    }
    }
    return KVT_ERR_INVALID;
}

static kvt_status_t pack_struct(msgpack_packer *pk, const kvt_msg_desc_t *d, const void *base,
                                unsigned depth)
{
    kvt_status_t status;

    size_t nout = 1;

    if (depth > 2)
        return KVT_ERR_LIMIT;
    for (uint32_t i = 0; i < d->nfields; i++)
        nout += !field_omitted(&d->fields[i], base);
    msgpack_pack_map(pk, nout);
    msgpack_pack_str(pk, 4);
    msgpack_pack_str_body(pk, "type", 4);
    status = pack_cstr(pk, d->name);
    for (uint32_t i = 0; i < d->nfields && status == KVT_OK; i++) {
        const kvt_msg_field_t *f = &d->fields[i];
        size_t nlen = strlen(f->name);
        if (field_omitted(f, base))
            continue;
        msgpack_pack_str(pk, nlen);
        msgpack_pack_str_body(pk, f->name, nlen);
        status = pack_field(pk, f, base, depth);
    }
    return status;
}

kvt_status_t kvt_msg_encode(const kvt_msg_t *m, void **data_out, size_t *len_out)
{
    const kvt_msg_desc_t *d;
    enc_buf_t buf = {NULL, 0, 0, 0};
    msgpack_packer pk;
    kvt_status_t status;

    if (m == NULL || data_out == NULL || len_out == NULL)
        return KVT_ERR_INVALID;
    d = kvt_msg_desc(m->type);
    if (d == NULL)
        return KVT_ERR_INVALID;

    msgpack_packer_init(&pk, &buf, enc_write);
    status = pack_struct(&pk, d, &m->u, 1);
    if (status == KVT_OK && buf.failed)
        status = buf.failed == 1 ? KVT_ERR_NOMEM : KVT_ERR_LIMIT;
    if (status != KVT_OK) {
        kvt_free(buf.data);
        return status;
    }
    *data_out = buf.data;
    *len_out = buf.len;
    return KVT_OK;
}
