/*
 * kvt_tl_tcp_frame.c - encode/decode of the TCP transport's frame headers.
 * Pure functions; every field a peer controls is validated here.
 */
#include <string.h>

#include "kvt_tl_tcp_int.h"

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void kvt_tcp_hdr_encode(const kvt_tcp_hdr_t *h, uint8_t out[KVT_TCP_HDR_LEN])
{
    size_t ulen = strnlen(h->uuid, KVT_TL_UUID_LEN);

    memset(out, 0, KVT_TCP_HDR_LEN);
    put_u32(out, KVT_TCP_MAGIC);
    out[4] = h->op;
    out[5] = h->flags;
    put_u16(out + 6, (uint16_t)ulen);
    put_u32(out + 8, h->seq);
    memcpy(out + 16, h->uuid, ulen);
    put_u64(out + 56, h->offset);
    put_u64(out + 64, h->length);
}

static int uuid_char_ok(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
}

kvt_status_t kvt_tcp_hdr_decode(const uint8_t *buf, size_t len, kvt_tcp_hdr_t *out)
{
    kvt_tcp_hdr_t h;
    uint16_t ulen;

    if (buf == NULL || len < KVT_TCP_HDR_LEN || get_u32(buf) != KVT_TCP_MAGIC)
        return KVT_ERR_PROTO;
    memset(&h, 0, sizeof(h));
    h.op = buf[4];
    h.flags = buf[5];
    ulen = get_u16(buf + 6);
    h.seq = get_u32(buf + 8);
    h.offset = get_u64(buf + 56);
    h.length = get_u64(buf + 64);
    switch (h.op) {
    case KVT_TCP_OP_HELLO:
        /* uuid field = lane token, payload = node id */
        if (h.length == 0 || h.length > KVT_TL_PEER_ID_MAX)
            return KVT_ERR_PROTO;
        break;
    case KVT_TCP_OP_WRITE:
    case KVT_TCP_OP_READ:
        if (h.length > KVT_TCP_MAX_FRAME)
            return KVT_ERR_PROTO;
        break;
    default:
        return KVT_ERR_PROTO;
    }
    if (ulen != KVT_TL_UUID_LEN)
        return KVT_ERR_PROTO;
    for (int i = 0; i < KVT_TL_UUID_LEN; i++) {
        if (!uuid_char_ok((char)buf[16 + i]))
            return KVT_ERR_PROTO;
    }
    memcpy(h.uuid, buf + 16, KVT_TL_UUID_LEN);
    h.uuid[KVT_TL_UUID_LEN] = '\0';
    *out = h;
    return KVT_OK;
}

void kvt_tcp_reply_encode(const kvt_tcp_reply_t *r, uint8_t out[KVT_TCP_REPLY_LEN])
{
    memset(out, 0, KVT_TCP_REPLY_LEN);
    put_u32(out, KVT_TCP_REPLY_MAGIC);
    put_u32(out + 4, (uint32_t)r->status);
    put_u32(out + 8, r->seq);
    put_u32(out + 12, r->flags);
}

kvt_status_t kvt_tcp_reply_decode(const uint8_t *buf, size_t len, kvt_tcp_reply_t *out)
{
    kvt_tcp_reply_t r;

    if (buf == NULL || len < KVT_TCP_REPLY_LEN || get_u32(buf) != KVT_TCP_REPLY_MAGIC)
        return KVT_ERR_PROTO;
    r.status = (int32_t)get_u32(buf + 4);
    r.seq = get_u32(buf + 8);
    r.flags = get_u32(buf + 12);
    if (r.status > 0 || (r.flags & ~KVT_TCP_REPLY_BYE) != 0)
        return KVT_ERR_PROTO;
    *out = r;
    return KVT_OK;
}

int kvt_tcp_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}
