/*
 * kvt_tl_tcp_addr.c - the TCP transport's address blob: its own bytes, opaque to the engine
 * (which carries them in the init-port handshake next to the node id).
 *
 *   magic u32 "KVTA" | version u8 (1) | host_len u8 | port u16 | token[36] | host[host_len]
 *
 * Little-endian; host is where the data listener can be reached, token the lane token this
 * side hands to the peer the blob is for (docs/protocols/kvt-tcp.md). Nothing else: node
 * identity is the control plane's.
 */
#include <string.h>

#include "kvt/kvt_uuid.h"
#include "kvt_tl_tcp_int.h"

#define ADDR_MAGIC   0x4154564bu /* "KVTA" */
#define ADDR_VERSION 1u
#define ADDR_FIXED   (4 + 1 + 1 + 2 + KVT_TCP_TOKEN_LEN)

kvt_status_t kvt_tcp_addr_pack(const char *host, uint16_t port, const char *token, void *out,
                               size_t *len)
{
    size_t hl = host != NULL ? strlen(host) : 0;
    uint8_t *p = out;

    if (hl == 0 || hl > 255 || port == 0 || token == NULL || strlen(token) != KVT_TCP_TOKEN_LEN ||
        out == NULL || len == NULL)
        return KVT_ERR_INVALID;
    if (*len < ADDR_FIXED + hl)
        return KVT_ERR_LIMIT;
    p[0] = (uint8_t)ADDR_MAGIC;
    p[1] = (uint8_t)(ADDR_MAGIC >> 8);
    p[2] = (uint8_t)(ADDR_MAGIC >> 16);
    p[3] = (uint8_t)(ADDR_MAGIC >> 24);
    p[4] = ADDR_VERSION;
    p[5] = (uint8_t)hl;
    p[6] = (uint8_t)port;
    p[7] = (uint8_t)(port >> 8);
    memcpy(p + 8, token, KVT_TCP_TOKEN_LEN);
    memcpy(p + ADDR_FIXED, host, hl);
    *len = ADDR_FIXED + hl;
    return KVT_OK;
}

kvt_status_t kvt_tcp_addr_unpack(const void *blob, size_t len, char host[256], uint16_t *port,
                                 char token[KVT_TCP_TOKEN_LEN + 1])
{
    const uint8_t *p = blob;
    kvt_uuid_t tu;
    size_t hl;

    if (blob == NULL || len < ADDR_FIXED + 1)
        return KVT_ERR_PROTO;
    if ((p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) != ADDR_MAGIC ||
        p[4] != ADDR_VERSION)
        return KVT_ERR_PROTO;
    hl = p[5];
    *port = (uint16_t)(p[6] | p[7] << 8);
    if (hl == 0 || len != ADDR_FIXED + hl || *port == 0 || memchr(p + ADDR_FIXED, '\0', hl) != NULL)
        return KVT_ERR_PROTO;
    /* the token goes into HELLO headers: a canonical uuid, nothing else */
    if (memchr(p + 8, '\0', KVT_TCP_TOKEN_LEN) != NULL ||
        kvt_uuid_parse((const char *)p + 8, KVT_TCP_TOKEN_LEN, &tu) != KVT_OK)
        return KVT_ERR_PROTO;
    memcpy(token, p + 8, KVT_TCP_TOKEN_LEN);
    token[KVT_TCP_TOKEN_LEN] = '\0';
    memcpy(host, p + ADDR_FIXED, hl);
    host[hl] = '\0';
    return KVT_OK;
}
