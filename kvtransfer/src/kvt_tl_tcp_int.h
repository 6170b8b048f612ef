/*
 * kvt_tl_tcp_int.h - wire format of the TCP transport (internal).
 *
 * Every lane is one TCP connection from an initiator to a target's data
 * listener. The first frame is HELLO (payload = initiator id). Then:
 *
 *   request  = header (72 bytes) [+ payload of <length> bytes for WRITE]
 *   reply    = reply header (16 bytes) [+ payload of <length> bytes for a
 *              successful READ]
 *
 * Replies come back in request order. A WRITE reply is sent only after the
 * payload landed in the region. All integers are little-endian.
 *
 *   header: magic u32 "KVT1" | op u8 | flags u8 | uuid_len u16 | seq u32 |
 *           reserved u32 | uuid[36] | reserved u32 | offset u64 | length u64
 *   reply:  magic u32 "KVTR" | status i32 | seq u32 | reserved u32
 */
#ifndef KVT_TL_TCP_INT_H
#define KVT_TL_TCP_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvt_transport.h"

#define KVT_TCP_MAGIC       0x3154564bu /* "KVT1" */
#define KVT_TCP_REPLY_MAGIC 0x5254564bu /* "KVTR" */
#define KVT_TCP_HDR_LEN     72
#define KVT_TCP_REPLY_LEN   16
#define KVT_TCP_MAX_FRAME   (64ull << 20) /* largest payload of one frame */
#define KVT_TCP_FRAME_SPLIT (1ull << 20)  /* initiators cut transfers into frames of this size */

enum {
    KVT_TCP_OP_HELLO = 1,
    KVT_TCP_OP_WRITE = 2,
    KVT_TCP_OP_READ = 3,
};

typedef struct kvt_tcp_hdr {
    uint8_t op;
    uint8_t flags;
    uint32_t seq;
    char uuid[KVT_TL_UUID_LEN + 1]; /* NUL-terminated; empty for HELLO */
    uint64_t offset;
    uint64_t length;
} kvt_tcp_hdr_t;

typedef struct kvt_tcp_reply {
    int32_t status;
    uint32_t seq;
} kvt_tcp_reply_t;

/* Encode/decode. Decoders validate everything a peer controls: magic, op,
 * uuid length and characters, payload length bounds. */
void kvt_tcp_hdr_encode(const kvt_tcp_hdr_t *h, uint8_t out[KVT_TCP_HDR_LEN]);
kvt_status_t kvt_tcp_hdr_decode(const uint8_t *buf, size_t len, kvt_tcp_hdr_t *out);
void kvt_tcp_reply_encode(const kvt_tcp_reply_t *r, uint8_t out[KVT_TCP_REPLY_LEN]);
kvt_status_t kvt_tcp_reply_decode(const uint8_t *buf, size_t len, kvt_tcp_reply_t *out);

/* Range check without overflow: [off, off+len) inside [0, size). */
int kvt_tcp_range_ok(uint64_t off, uint64_t len, uint64_t size);

/* Serve one already-accepted connection (HELLO first) until EOF or error.
 * Exposed for the fuzz target; normally run by the listener's threads. */
kvt_status_t kvt_tl_tcp_serve_fd(kvt_tl_t *tl, int fd);

extern const kvt_transport_desc_t kvt_tl_tcp_desc;

#endif /* KVT_TL_TCP_INT_H */
