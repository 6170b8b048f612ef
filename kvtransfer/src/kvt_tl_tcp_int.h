/*
 * kvt_tl_tcp_int.h - wire format and shared state of the TCP transport
 * (internal; docs/protocols/kvt-tcp.md describes the protocol).
 *
 * Every lane is one TCP connection from an initiator to a target's data
 * listener. The first frame is HELLO: the header's uuid field carries the
 * lane token the target handed to this initiator over the control plane
 * (in its address blob, kvt_tl_tcp_addr.c), the payload is the initiator's
 * node id.
 * The target accepts the lane only if the token is the one it issued to
 * that id, so a lane can only ever act for the peer that was granted pages.
 * Then:
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
 *   reply:  magic u32 "KVTR" | status i32 | seq u32 | flags u32
 *
 * A reply with flags & KVT_TCP_REPLY_BYE is not an answer: the target closes
 * an idle lane and says so first, so the initiator reconnects quietly
 * instead of declaring the peer dead.
 */
#ifndef KVT_TL_TCP_INT_H
#define KVT_TL_TCP_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvt_transport.h"

#define KVT_TCP_MAGIC       0x3154564bu /* "KVT1" */
#define KVT_TCP_REPLY_MAGIC 0x5254564bu /* "KVTR" */
#define KVT_TCP_HDR_LEN     72
#define KVT_TCP_REPLY_LEN   16
#define KVT_TCP_MAX_FRAME   (64ull << 20)   /* largest payload of one frame */
#define KVT_TCP_FRAME_SPLIT (1ull << 20)    /* initiators cut transfers into frames of this size */
#define KVT_TCP_TOKEN_LEN   KVT_TL_UUID_LEN /* lane token: a random uuid4 string */
#define KVT_TCP_REPLY_BYE   0x1u            /* reply flag: idle lane closed by the target */

/* Target-side limits (kvt_tl_config_t overrides each; 0 = these defaults). */
#define KVT_TCP_DEF_MAX_CONNS          1024   /* lanes served at once, all peers */
#define KVT_TCP_DEF_MAX_CONNS_PER_PEER 64     /* lanes of one peer id (>= max lanes) */
#define KVT_TCP_DEF_MAX_PENDING        64     /* accepted lanes still before their HELLO */
#define KVT_TCP_DEF_HELLO_TIMEOUT_MS   5000   /* accept -> HELLO complete */
#define KVT_TCP_DEF_IDLE_TIMEOUT_MS    300000 /* no frame started for this long -> BYE */
#define KVT_TCP_DEF_MAX_CONNS_PER_ADDR 128    /* lanes from one source address / IPv6 prefix */
/* Lanes from one source before their HELLO: a peer opens its lanes (2 to 4) at once, so 8
 * leaves room for a restart; one source can no longer fill the global max_pending and keep
 * every other peer's lanes out. */
#define KVT_TCP_DEF_MAX_PENDING_PER_ADDR 8
#define KVT_TCP_DEF_ADDR_PREFIX_V6       64 /* one IPv6 host holds a whole /64 */

enum {
    KVT_TCP_OP_HELLO = 1,
    KVT_TCP_OP_WRITE = 2,
    KVT_TCP_OP_READ = 3,
};

typedef struct kvt_tcp_hdr {
    uint8_t op;
    uint8_t flags;
    uint32_t seq;
    char uuid[KVT_TL_UUID_LEN + 1]; /* NUL-terminated; HELLO: the lane token */
    uint64_t offset;
    uint64_t length;
} kvt_tcp_hdr_t;

typedef struct kvt_tcp_reply {
    int32_t status;
    uint32_t seq;
    uint32_t flags; /* KVT_TCP_REPLY_BYE */
} kvt_tcp_reply_t;

/* Encode/decode. Decoders validate everything a peer controls: magic, op,
 * uuid length and characters, payload length bounds. */
void kvt_tcp_hdr_encode(const kvt_tcp_hdr_t *h, uint8_t out[KVT_TCP_HDR_LEN]);
kvt_status_t kvt_tcp_hdr_decode(const uint8_t *buf, size_t len, kvt_tcp_hdr_t *out);
void kvt_tcp_reply_encode(const kvt_tcp_reply_t *r, uint8_t out[KVT_TCP_REPLY_LEN]);
kvt_status_t kvt_tcp_reply_decode(const uint8_t *buf, size_t len, kvt_tcp_reply_t *out);

/* The key the per-address lane cap counts a source address under: an IPv4
 * address (or an IPv4-mapped IPv6 one) as ::ffff:a.b.c.d, an IPv6 address
 * cut to its first <v6_prefix> bits (one host commonly holds a whole /64, so
 * counting per /128 would let it open lanes without bound). */
struct sockaddr;
void kvt_tcp_addr_key(const struct sockaddr *sa, unsigned v6_prefix, uint8_t key[16]);

/* Range check without overflow: [off, off+len) inside [0, size). */
int kvt_tcp_range_ok(uint64_t off, uint64_t len, uint64_t size);

/* ---- shared state (kvt_tl_tcp.c: initiator + control; kvt_tl_tcp_serve.c:
 * listener + target side) ---- */

struct kvt_tl_region {
    struct kvt_tl_region *next;
    char uuid[KVT_TL_UUID_LEN + 1];
    uint8_t *base;
    uint64_t length;
    uint64_t page_size;
    uint32_t npages;
};

typedef struct tcp_grant {
    struct tcp_grant *next;
    char peer_id[KVT_TL_PEER_ID_MAX + 1];
    kvt_tl_region_t *region;
    uint16_t *wcnt; /* per page */
    uint16_t *rcnt;
} tcp_grant_t;

typedef struct tcp_lane tcp_lane_t;

/* One peer as seen from this side. <token>/<prev_token> are what we handed
 * the peer (it must present one in its HELLO; prev_token keeps a lane that
 * was opened with the token before a re-handshake valid); <send_token> is
 * what the peer handed us for our lanes to it. Under tl->lock. */
typedef struct tcp_peer {
    struct tcp_peer *next;
    struct kvt_tl *tl;
    char id[KVT_TL_PEER_ID_MAX + 1];
    char token[KVT_TCP_TOKEN_LEN + 1];
    char prev_token[KVT_TCP_TOKEN_LEN + 1];
    char send_token[KVT_TCP_TOKEN_LEN + 1];
    char host[256];
    uint16_t port;
    pthread_mutex_t lock; /* connect / teardown / post */
    int have_addr;
    int connected;
    atomic_int stopping; /* teardown in progress: lane deaths are not failures */
    atomic_int failed;
    unsigned nlanes;
    tcp_lane_t *lanes;
    unsigned rr;
} tcp_peer_t;

/* One accepted lane on the target side. <peer> is set once its HELLO was
 * accepted (under tl->lock). */
typedef struct tcp_conn {
    struct tcp_conn *next;
    struct kvt_tl *tl;
    int fd;
    pthread_t th;
    uint64_t accepted_ns;
    atomic_int done;
    int pending;          /* counted in tl->npending (listener lanes before HELLO) */
    int hello_ok;         /* HELLO accepted: counted for <peer> */
    uint8_t addr_key[16]; /* source address (prefix) the per-address cap counts */
    char peer[KVT_TL_PEER_ID_MAX + 1];
} tcp_conn_t;

typedef struct tcp_limits {
    unsigned max_conns;
    unsigned max_conns_per_peer;
    unsigned max_pending;
    unsigned hello_timeout_ms;
    unsigned idle_timeout_ms;
    unsigned max_conns_per_addr;
    unsigned max_pending_per_addr;
    unsigned addr_prefix_v6;
} tcp_limits_t;

struct kvt_tl {
    kvt_tl_callbacks_t cb;
    char local_id[KVT_TL_PEER_ID_MAX + 1];
    char advertise[256];
    uint16_t port;
    unsigned lanes;
    unsigned timeout_ms; /* a started frame (or a reply) must progress within this */
    tcp_limits_t lim;
    int listen_fd;
    int wake_fd;
    pthread_t listener;
    pthread_mutex_t lock; /* regions, grants, peers list, conns list and counts */
    kvt_tl_region_t *regions;
    tcp_grant_t *grants;
    tcp_peer_t *peers;
    tcp_conn_t *conns;
    unsigned nconns;   /* accepted lanes being served */
    unsigned npending; /* of which still before their HELLO */
    atomic_int stopping;
    atomic_uint_fast64_t refusals_logged;
    struct {
        atomic_uint_fast64_t bytes_written, bytes_read, bytes_served, ops_completed, ops_failed,
            access_denied, bad_frames, peer_failures, conns_refused, hello_refused, idle_closed,
            stall_closed, byes_received, lanes_reopened;
    } st;
};

/* How the target side reads and writes one lane. The socket version waits
 * with deadlines; the fuzz target plays a byte string. <phase> tells the
 * reader which wait applies. */
typedef enum kvt_tcp_phase {
    KVT_TCP_PH_HELLO = 0, /* before and during HELLO: the hello deadline */
    KVT_TCP_PH_IDLE,      /* first bytes of a frame: the idle timeout */
    KVT_TCP_PH_FRAME,     /* rest of a frame: the stall timeout */
} kvt_tcp_phase_t;

typedef struct kvt_tcp_io {
    /* Read exactly <len> bytes. KVT_ERR_PEER on EOF/reset, KVT_ERR_TIMEOUT
     * when the phase's wait ran out. */
    kvt_status_t (*recv)(void *ctx, void *buf, size_t len, kvt_tcp_phase_t phase);
    kvt_status_t (*send)(void *ctx, struct iovec *iov, int iovcnt);
    void *ctx;
} kvt_tcp_io_t;

/* Serve one accepted lane (HELLO first) until EOF, error, idle timeout or
 * shutdown. <c> is the lane's bookkeeping (peer counts); the caller owns it
 * and the transport. Exposed for the fuzz target. */
kvt_status_t kvt_tl_tcp_serve(kvt_tl_t *tl, tcp_conn_t *c, const kvt_tcp_io_t *io);

/* Target side life cycle (kvt_tl_tcp_serve.c). */
kvt_status_t kvt_tl_tcp_listener_start(kvt_tl_t *tl);
void kvt_tl_tcp_listener_stop(kvt_tl_t *tl); /* joins every lane thread */
/* Close the served lanes of <peer_id> (peer removed). */
void kvt_tl_tcp_conns_drop_peer(kvt_tl_t *tl, const char *peer_id);

/* Peer lookup under tl->lock (kvt_tl_tcp.c). */
tcp_peer_t *kvt_tl_tcp_peer_find_locked(kvt_tl_t *tl, const char *id);

/* Check an incoming access of <peer>; sets *addr to the target bytes.
 * KVT_ERR_ACCESS (counted) when the region, bounds or grant say no. */
kvt_status_t kvt_tl_tcp_access_check(kvt_tl_t *tl, const char *peer, const kvt_tcp_hdr_t *h,
                                     unsigned access, uint8_t **addr);

/* Blocking socket helper shared by both sides (kvt_tl_tcp_lane.c). */
kvt_status_t kvt_tcp_send_iov(int fd, struct iovec *iov, int iovcnt);

/* Initiator side (kvt_tl_tcp_lane.c). Post frames of <xfers> to <p>,
 * connecting or reviving its lanes first (takes p->lock). */
kvt_status_t kvt_tl_tcp_lanes_post(kvt_tl_t *tl, tcp_peer_t *p, kvt_tl_op_t op,
                                   const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie);
/* Stop every lane of <p> (p->lock held): join threads, fail frames. */
void kvt_tl_tcp_peer_teardown_locked(tcp_peer_t *p);

/* The address blob (kvt_tl_tcp_addr.c): listener host and port and the lane token handed to
 * the peer. pack: *len is the room in, the size out. unpack: KVT_ERR_PROTO on anything
 * malformed (it comes from the network). */
kvt_status_t kvt_tcp_addr_pack(const char *host, uint16_t port, const char *token, void *out,
                               size_t *len);
kvt_status_t kvt_tcp_addr_unpack(const void *blob, size_t len, char host[256], uint16_t *port,
                                 char token[KVT_TCP_TOKEN_LEN + 1]);

extern const kvt_transport_desc_t kvt_tl_tcp_desc;

#endif /* KVT_TL_TCP_INT_H */
