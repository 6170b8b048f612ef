/*
 * kvt_transport.h - the data transport ops table of libkvt.
 *
 * A transport moves bytes between registered memory regions of two
 * engines with one-sided WRITE (local -> remote) and READ (remote -> local)
 * operations. The engine drives it through the const ops table below; a
 * transport file ends with KVT_TRANSPORT_REGISTER() so the engine can find
 * it by name ("tcp", "verbs", ...).
 *
 * Life cycle (all calls are thread-safe unless noted):
 *
 *   create      -> listener/devices ready, nothing connected yet
 *   reg_region  -> each large region registered once (never per page)
 *   peer_prepare/peer_connect
 *               -> handshake run by the engine over the init port. A blob
 *                  is the transport's address (as UCX worker addresses): it
 *                  packs and unpacks its own bytes; the engine carries them
 *                  unread in TransportInit.addr next to the node ids, which
 *                  come from the control plane (kvt_handshake.c):
 *                    initiator: blob_a = peer_prepare(target_id)
 *                               send blob_a ----------------------------->
 *                    target:    blob_b = peer_prepare(initiator_id)
 *                               peer_connect(initiator_id, blob_a)
 *                               <----------------------------- reply blob_b
 *                    initiator: peer_connect(target_id, blob_b)
 *                  After that either side may post operations to the other
 *                  (the target of a push is the initiator of a pull).
 *   grant/revoke-> the target side lists the pages a peer may touch for a
 *                  transfer; every incoming access outside the granted pages
 *                  of that peer is refused (KVT_ERR_ACCESS).
 *   post        -> a batch of page-sized transfers against remote (uuid,
 *                  offset) refs; exactly one completion per post.
 *   destroy     -> every outstanding post completes with an error first.
 *
 * Completions and peer failures are reported through callbacks that may run
 * on any transport thread; they must not block and must not call back into
 * the transport.
 */
#ifndef KVT_TRANSPORT_H
#define KVT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Region UUIDs are canonical 36-character strings ("8-4-4-4-12" hex). */
#define KVT_TL_UUID_LEN      36
#define KVT_TL_PEER_ID_MAX   255
#define KVT_TL_BLOB_MAX      4096
#define KVT_TL_DEFAULT_LANES 4

typedef struct kvt_tl kvt_tl_t;               /* one transport instance */
typedef struct kvt_tl_region kvt_tl_region_t; /* a registered region */

typedef enum kvt_tl_op {
    KVT_TL_OP_WRITE = 1, /* local bytes -> remote region */
    KVT_TL_OP_READ = 2,  /* remote region -> local bytes */
} kvt_tl_op_t;

/* Access bits for grants. */
#define KVT_TL_ACCESS_WRITE 0x1u /* the peer may WRITE into the pages */
#define KVT_TL_ACCESS_READ  0x2u /* the peer may READ the pages */

/* Byte/frame counters of one transport instance (monotonic). */
typedef struct kvt_tl_stats {
    uint64_t bytes_written;  /* payload bytes of completed local WRITEs */
    uint64_t bytes_read;     /* payload bytes of completed local READs */
    uint64_t bytes_served;   /* payload bytes served to peers (both ops) */
    uint64_t ops_completed;  /* completed transfer entries */
    uint64_t ops_failed;     /* failed transfer entries */
    uint64_t access_denied;  /* incoming accesses refused by the grant table */
    uint64_t bad_frames;     /* malformed input from the network */
    uint64_t peer_failures;  /* peers declared dead */
    uint64_t conns_refused;  /* lanes refused by a connection cap */
    uint64_t hello_refused;  /* lanes refused at HELLO (no/forged token, deadline) */
    uint64_t idle_closed;    /* served lanes closed after the idle timeout */
    uint64_t stall_closed;   /* served lanes closed mid-frame by the stall timeout */
    uint64_t byes_received;  /* our lanes the target closed as idle (BYE) */
    uint64_t lanes_reopened; /* of which reopened to send frames that crossed the BYE */
} kvt_tl_stats_t;

typedef struct kvt_tl_callbacks {
    /* One call per post(): status KVT_OK or the first error of the batch. */
    void (*on_complete)(void *arg, uint64_t cookie, kvt_status_t status);
    /* A peer's connection died (or its handshake/lanes failed). Every post
     * to it completes with an error as well. May be NULL. */
    void (*on_peer_failed)(void *arg, const char *peer_id, kvt_status_t status);
    void *arg;
} kvt_tl_callbacks_t;

typedef struct kvt_tl_config {
    const char *local_id;       /* this engine's id, sent in the handshake */
    const char *listen_host;    /* data-plane bind address ("127.0.0.1", "0.0.0.0") */
    uint16_t listen_port;       /* 0 = ephemeral */
    const char *advertise_host; /* host peers should dial; NULL = listen_host */
    unsigned lanes;             /* connections / QPs per peer; 0 = default (4) */
    unsigned timeout_ms;        /* per-operation timeout; 0 = 30000 */
    const char *device;         /* transport specific (verbs device name), may be NULL */
    /* Data listener limits (tcp); 0 = the transport's default. */
    unsigned max_conns;            /* lanes served at once */
    unsigned max_conns_per_peer;   /* lanes of one peer id */
    unsigned max_pending;          /* accepted lanes still before their HELLO */
    unsigned hello_timeout_ms;     /* accept -> HELLO complete */
    unsigned idle_timeout_ms;      /* a served lane with no frame for this long is closed */
    unsigned max_conns_per_addr;   /* lanes from one source address (IPv6: one prefix) */
    unsigned max_pending_per_addr; /* of those, lanes still before their HELLO */
    unsigned addr_prefix_v6;       /* IPv6 source addresses are grouped by this prefix (bits) */
} kvt_tl_config_t;

/* One page-sized (or shorter) transfer of a post. */
typedef struct kvt_tl_xfer {
    kvt_tl_region_t *local;                /* local registered region */
    uint64_t local_offset;                 /* byte offset in the local region */
    char remote_uuid[KVT_TL_UUID_LEN + 1]; /* NUL-terminated region uuid of the peer */
    uint64_t remote_offset;                /* byte offset in the remote region */
    uint64_t length;                       /* bytes */
} kvt_tl_xfer_t;

typedef struct kvt_tl_region_params {
    const char *uuid;   /* 36-char uuid string, unique per engine */
    void *base;         /* start of the memory */
    uint64_t length;    /* bytes */
    uint64_t page_size; /* granularity of grants; must divide length */
} kvt_tl_region_params_t;

typedef struct kvt_tl_ops {
    /* Create an instance; <cb> is copied. Output set only on success. */
    kvt_status_t (*create)(const kvt_tl_config_t *cfg, const kvt_tl_callbacks_t *cb,
                           kvt_tl_t **out);
    /* Fail every outstanding post, close everything, free. */
    void (*destroy)(kvt_tl_t *tl);

    /* Register a region once; the memory stays owned by the caller and must
     * outlive the registration. */
    kvt_status_t (*reg_region)(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                               kvt_tl_region_t **out);
    void (*dereg_region)(kvt_tl_t *tl, kvt_tl_region_t *region);

    /* Handshake (see top of file). peer_prepare writes at most *len bytes of
     * this side's blob for <peer_id> (addresses, QP numbers, region
     * rkeys/addrs of every registered region: whatever the transport needs,
     * in its own format; no node id, the engine sends that) and sets *len.
     * peer_connect consumes the peer's blob; connections are established
     * lazily or eagerly as the transport prefers. Calling them again for a
     * known peer replaces the old connection (peer restarted). */
    kvt_status_t (*peer_prepare)(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len);
    kvt_status_t (*peer_connect)(kvt_tl_t *tl, const char *peer_id, const void *blob, size_t len);
    /* Rename a peer prepared (or connected) as <old_id> to <new_id>; the
     * engine calls it when the handshake reply reveals the peer's node id
     * (the initiator prepares under the address it dialled). May be NULL
     * (ids are not bound at prepare time). KVT_ERR_NOT_FOUND if <old_id> is
     * unknown; replaces an existing <new_id>. */
    kvt_status_t (*peer_rename)(kvt_tl_t *tl, const char *old_id, const char *new_id);
    /* Forget a peer: outstanding posts to it fail, grants are dropped. */
    void (*peer_remove)(kvt_tl_t *tl, const char *peer_id);

    /* Target side: allow/disallow <peer_id> to access pages of <region>.
     * Counted: two grants need two revokes. May be NULL if the transport
     * cannot check accesses (then the engine skips the calls). */
    kvt_status_t (*grant)(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                          const uint32_t *pages, size_t n, unsigned access);
    void (*revoke)(kvt_tl_t *tl, const char *peer_id, kvt_tl_region_t *region,
                   const uint32_t *pages, size_t n, unsigned access);

    /* Post <n> transfers of one op to <peer_id> (connected first if needed).
     * The array is copied; on KVT_OK exactly one on_complete(<cookie>)
     * follows, on error none. */
    kvt_status_t (*post)(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
                         const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie);

    /* The data port this side listens on (what its blob advertises), 0 if
     * it has none. May be NULL. The blob itself stays the transport's. */
    uint16_t (*listen_port)(kvt_tl_t *tl);

    /* Snapshot of the counters. */
    void (*stats)(kvt_tl_t *tl, kvt_tl_stats_t *out);
} kvt_tl_ops_t;

/* Descriptor: name + ops, kept separate so a disabled transport still gives
 * a clear error by name. */
typedef struct kvt_transport_desc {
    const char *name; /* "tcp", "verbs", ... */
    const kvt_tl_ops_t *ops;
} kvt_transport_desc_t;

/* Registry (kvt_transport.c). Registration does no I/O; duplicates are
 * refused. */
kvt_status_t kvt_transport_register(const kvt_transport_desc_t *desc);
const kvt_transport_desc_t *kvt_transport_find(const char *name);
/* Registered transports in registration order; returns the count and
 * fills at most <max> entries. Used by the conformance suite. */
size_t kvt_transport_list(const kvt_transport_desc_t **out, size_t max);

/* Put at the bottom of the transport's .c file:
 *   KVT_TRANSPORT_REGISTER(tcp, &kvt_tl_tcp_desc);
 * A static library may drop an object nobody references, so each transport
 * also exports `void kvt_tl_<name>_link(void)` which kvt_transport.c calls. */
#define KVT_TRANSPORT_REGISTER(name_, desc_)                                                       \
    __attribute__((constructor)) static void kvt_tl_register_##name_(void)                         \
    {                                                                                              \
        (void)kvt_transport_register(desc_);                                                       \
    }                                                                                              \
    void kvt_tl_##name_##_link(void) {}

#ifdef __cplusplus
}
#endif
#endif /* KVT_TRANSPORT_H */
