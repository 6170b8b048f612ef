/*
 * Internal types of the RDMA verbs transport of libkvt.
 *
 * The transport is split into small parts that each do one thing:
 *   kvt_verbs_mr.c        MR planning (one MR per region, split above
 * max_mr_size) kvt_verbs_slice.c     page lists -> 64 KiB slices -> chained
 * work requests kvt_verbs_path.c      per-peer QP paths: round-robin, credits,
 * failure, retry kvt_verbs_qp.c        QP attribute sets for
 * RESET->INIT->RTR->RTS and the QPs kvt_verbs_handshake.c the verbs handshake
 * payload (msgpack) exchanged on the init port kvt_verbs_device.c
 * device/port/GID choice (NUMA-nearest) and opening kvt_verbs_cq.c        the
 * single completion thread kvt_tl_verbs.c        glue to libkvt's transport ops
 * table Everything but the device, QP and CQ handling is pure and tested
 * without a device.
 */
#ifndef KVT_VERBS_INT_H
#define KVT_VERBS_INT_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt/kvt_status.h"

#define KVT_VERBS_SLICE_SIZE      (64u * 1024u)
#define KVT_VERBS_DEFAULT_QPS     2u
#define KVT_VERBS_MAX_QPS         16u
#define KVT_VERBS_DEFAULT_MAX_WR  256u /* outstanding WRs per QP */
#define KVT_VERBS_DEFAULT_BATCH   32u  /* WRs per chained post */
#define KVT_VERBS_DEFAULT_RETRIES 3u   /* re-posts of one slice after errors */
#define KVT_VERBS_MAX_MR_CHUNKS   4096u
#define KVT_VERBS_UUID_LEN        36u
#define KVT_VERBS_ID_MAX          255u

/* ---- MR planning ----------------------------------------------------------------------------- */

/* One memory region of a registered area: [addr, addr + len) with its key. */
typedef struct kvt_verbs_mr_chunk {
    uint64_t addr;
    uint64_t len;
} kvt_verbs_mr_chunk_t;

/* Keys of one registered area, cut into chunks of exactly chunk_size bytes (the
 * last one shorter). Used for local areas (lkeys) and remote areas (rkeys)
 * alike. */
typedef struct kvt_verbs_mr_map {
    char uuid[KVT_VERBS_UUID_LEN + 1];
    uint64_t base;
    uint64_t len;
    uint64_t chunk_size;
    uint32_t nkeys;
    uint32_t *keys; /* owned */
} kvt_verbs_mr_map_t;

/* ---- slices ---------------------------------------------------------------------------------- */

/* A contiguous piece of a transfer: local [laddr, +len) in the area of <lmap>
 * <-> remote [raddr, +len) in the area of <rmap>. */
typedef struct kvt_verbs_seg {
    uint64_t laddr;
    uint64_t raddr;
    uint64_t len;
    const struct kvt_verbs_mr_map *lmap; /* lkeys */
    const struct kvt_verbs_mr_map *rmap; /* rkeys */
} kvt_verbs_seg_t;

typedef enum kvt_verbs_slice_state {
    KVT_VERBS_SLICE_QUEUED = 0,
    KVT_VERBS_SLICE_POSTED,
    KVT_VERBS_SLICE_DONE,
    KVT_VERBS_SLICE_ABANDONED,
} kvt_verbs_slice_state_t;

struct kvt_verbs_xfer;

/* One work request: at most slice_size bytes, never across an MR boundary on
 * either side. */
typedef struct kvt_verbs_slice {
    uint64_t laddr;
    uint64_t raddr;
    uint32_t lkey;
    uint32_t rkey;
    uint32_t len;
    uint8_t opcode; /* IBV_WR_RDMA_WRITE (push) or IBV_WR_RDMA_READ (pull) */
    uint8_t state;  /* kvt_verbs_slice_state_t */
    uint8_t attempts;
    int8_t qp;                    /* path the slice is queued on or posted to; -1 none */
    struct kvt_verbs_slice *next; /* link in a path's queue */
    struct kvt_verbs_xfer *xfer;  /* owner */
} kvt_verbs_slice_t;

/* ---- transfers ------------------------------------------------------------------------------- */

typedef void (*kvt_verbs_xfer_done_cb)(struct kvt_verbs_xfer *xfer, kvt_status_t status, void *arg);

/* Bookkeeping of one transfer (one page list). Every slice ends DONE or
 * ABANDONED exactly once; the transfer finishes when done + abandoned ==
 * nslices. */
typedef struct kvt_verbs_xfer {
    struct kvt_verbs_xfer *prev, *next; /* in the connection's list of live transfers */
    void *conn;                         /* the connection it runs on (holds a reference) */
    uint64_t cookie;                    /* the engine's post cookie */
    size_t nentries;                    /* engine transfer entries in the post */
    uint8_t op;                         /* kvt_tl_op_t */
    kvt_verbs_slice_t *slices;          /* owned */
    size_t nslices;
    size_t done;
    size_t abandoned;
    uint64_t bytes_done;
    kvt_status_t status; /* first error seen, KVT_OK otherwise */
    kvt_verbs_xfer_done_cb on_done;
    void *arg;
} kvt_verbs_xfer_t;

/* ---- paths (QPs of one peer connection) ------------------------------------------------------ */

typedef struct kvt_verbs_path {
    uint32_t outstanding; /* posted, not completed */
    bool failed;
    kvt_verbs_slice_t *head; /* queued, not posted */
    kvt_verbs_slice_t *tail;
    uint32_t queued;
    uint64_t posted_total;
} kvt_verbs_path_t;

typedef struct kvt_verbs_paths {
    uint32_t npaths;
    uint32_t max_outstanding;
    uint32_t retry_limit;
    uint32_t rr; /* next path for round-robin */
    kvt_verbs_path_t path[KVT_VERBS_MAX_QPS];
} kvt_verbs_paths_t;

/* What the completion of one slice leads to. */
typedef enum kvt_verbs_wc_action {
    KVT_VERBS_WC_DONE = 0,  /* slice landed */
    KVT_VERBS_WC_RETRY,     /* slice re-queued on another path */
    KVT_VERBS_WC_ABANDONED, /* slice given up: transfer fails */
} kvt_verbs_wc_action_t;

/* ---- QP parameters --------------------------------------------------------------------------- */

/* What one side tells the other about one of its QPs and its port. */
typedef struct kvt_verbs_qp_info {
    uint32_t qpn;
    uint32_t psn; /* 24 bits */
} kvt_verbs_qp_info_t;

typedef struct kvt_verbs_port_info {
    uint16_t lid;
    uint8_t gid[16];
    uint8_t mtu;       /* enum ibv_mtu */
    uint8_t port_num;  /* local only */
    uint8_t gid_index; /* local only */
    bool global;       /* route with a GRH (RoCE, or IB across subnets) */
} kvt_verbs_port_info_t;

/* Tunables of the RTR/RTS transitions. */
typedef struct kvt_verbs_qp_tun {
    uint8_t max_rd_atomic; /* outstanding RDMA READs as initiator and responder */
    uint8_t timeout;       /* 4.096us * 2^timeout */
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t min_rnr_timer;
    uint8_t hop_limit;
    uint8_t sl;
    uint8_t traffic_class;
} kvt_verbs_qp_tun_t;

/* ---- handshake payload ----------------------------------------------------------------------- */

typedef struct kvt_verbs_hs {
    char id[KVT_VERBS_ID_MAX + 1]; /* the sender's transport identity */
    uint64_t epoch;                /* changes every time the sender's transport starts */
    kvt_verbs_port_info_t port;
    uint32_t nqps;
    kvt_verbs_qp_info_t qps[KVT_VERBS_MAX_QPS];
    uint32_t nregions;
    kvt_verbs_mr_map_t *regions; /* owned */
} kvt_verbs_hs_t;

/* ---- config ---------------------------------------------------------------------------------- */

typedef struct kvt_verbs_cfg {
    char device[64];        /* "" = automatic (NUMA-nearest) */
    int port;               /* 0 = first active port */
    int gid_index;          /* -1 = automatic */
    uint32_t qps_per_peer;  /* default 2 */
    uint32_t slice_size;    /* default 64 KiB */
    uint32_t max_wr;        /* outstanding WRs per QP */
    uint32_t batch;         /* WRs per chained post */
    uint32_t retry_limit;   /* re-posts per slice */
    uint64_t max_mr_size;   /* 0 = the device's limit; tests set it lower */
    const char *sysfs_root; /* NULL = "/sys" */
} kvt_verbs_cfg_t;

void kvt_verbs_cfg_defaults(kvt_verbs_cfg_t *cfg);

/* Parse the device string "[name][:port[:gid_index]]" (empty part = automatic).
 */
kvt_status_t kvt_verbs_cfg_parse_device(const char *s, kvt_verbs_cfg_t *cfg);

/* ---- kvt_verbs_mr.c -------------------------------------------------------------------------- */

/* Number of MRs a region of <len> bytes needs when one MR may cover at most
 * <max_mr_size> bytes (0 = unlimited). */
uint32_t kvt_verbs_mr_plan_count(uint64_t len, uint64_t max_mr_size);

/* Cut [base, base + len) into chunks of exactly max_mr_size bytes (the last
 * shorter) into <out> (capacity <cap>). Fails with KVT_ERR_INVALID on len == 0,
 * overflow or too small cap. */
kvt_status_t kvt_verbs_mr_plan(uint64_t base, uint64_t len, uint64_t max_mr_size,
                               kvt_verbs_mr_chunk_t *out, uint32_t cap, uint32_t *nout);

/* Set up <map> for an area cut by kvt_verbs_mr_plan; keys are filled by the
 * caller. */
kvt_status_t kvt_verbs_mr_map_init(kvt_verbs_mr_map_t *map, const char *uuid, uint64_t base,
                                   uint64_t len, uint64_t max_mr_size);
void kvt_verbs_mr_map_clear(kvt_verbs_mr_map_t *map);
kvt_status_t kvt_verbs_mr_map_copy(kvt_verbs_mr_map_t *dst, const kvt_verbs_mr_map_t *src);

/* Key and bytes left in that chunk for [addr, addr + len); KVT_ERR_INVALID when
 * the range leaves the area. */
kvt_status_t kvt_verbs_mr_map_lookup(const kvt_verbs_mr_map_t *map, uint64_t addr, uint64_t len,
                                     uint32_t *key, uint64_t *chunk_left);

/* ---- kvt_verbs_slice.c ----------------------------------------------------------------------- */

/* Merge segments that continue each other on both sides. Returns the new count.
 */
size_t kvt_verbs_seg_coalesce(kvt_verbs_seg_t *segs, size_t nsegs);

/* Count the slices kvt_verbs_slice_build makes. */
kvt_status_t kvt_verbs_slice_count(const kvt_verbs_seg_t *segs, size_t nsegs, uint32_t slice_size,
                                   size_t *count);

/* Cut segments into slices of at most slice_size bytes that never cross an MR
 * boundary (local or remote). <out> must hold kvt_verbs_slice_count() entries.
 * KVT_ERR_BOUNDS when a segment leaves its area. */
kvt_status_t kvt_verbs_slice_build(const kvt_verbs_seg_t *segs, size_t nsegs, uint32_t slice_size,
                                   uint8_t opcode, kvt_verbs_slice_t *out, size_t cap,
                                   size_t *nout);

/* Fill wrs[0..n) and sges[0..n) for slices s[0..n) as one chain (wrs[i].next =
 * &wrs[i+1]), every WR signalled, wr_id = the slice. */
void kvt_verbs_chain_build(kvt_verbs_slice_t *const *s, size_t n, struct ibv_send_wr *wrs,
                           struct ibv_sge *sges);

/* ---- kvt_verbs_path.c ------------------------------------------------------------------------ */

void kvt_verbs_paths_init(kvt_verbs_paths_t *p, uint32_t npaths, uint32_t max_outstanding,
                          uint32_t retry_limit);
uint32_t kvt_verbs_paths_healthy(const kvt_verbs_paths_t *p);

/* Next healthy path in round-robin order, -1 when every path failed. */
int kvt_verbs_paths_pick(kvt_verbs_paths_t *p);

/* Queue a slice on the next healthy path. KVT_ERR_IO when none is left. */
kvt_status_t kvt_verbs_paths_enqueue(kvt_verbs_paths_t *p, kvt_verbs_slice_t *s);

/* Pop up to min(max, free credits) queued slices of <path> into out[]; they
 * count as outstanding from now on. Returns how many. */
size_t kvt_verbs_paths_take(kvt_verbs_paths_t *p, uint32_t path, size_t max,
                            kvt_verbs_slice_t **out);

/* Slices taken but not accepted by the device (ibv_post_send bad_wr onwards):
 * no longer outstanding; the path is marked failed and they are re-queued
 * elsewhere. In all three functions below, slices with nowhere left to go are
 * marked ABANDONED and pushed on the list *abandoned (linked through
 * slice->next) for the caller to account. */
void kvt_verbs_paths_unpost(kvt_verbs_paths_t *p, uint32_t path, kvt_verbs_slice_t *const *s,
                            size_t n, kvt_verbs_slice_t **abandoned);

/* Mark a path failed and move its queued slices to healthy paths. */
void kvt_verbs_paths_fail(kvt_verbs_paths_t *p, uint32_t path, kvt_verbs_slice_t **abandoned);

/* Account the completion of a posted slice. <ok> false with <flushed> true
 * means the WR was flushed because its path failed earlier: it is re-queued
 * without using up a retry. */
kvt_verbs_wc_action_t kvt_verbs_paths_complete(kvt_verbs_paths_t *p, kvt_verbs_slice_t *s, bool ok,
                                               bool flushed, kvt_verbs_slice_t **abandoned);

/* Transfer bookkeeping: a slice reached its final state. Returns true when the
 * transfer just finished (the caller then reports xfer->status). */
bool kvt_verbs_xfer_account(kvt_verbs_xfer_t *x, kvt_verbs_slice_t *s, kvt_status_t err);

/* ---- kvt_verbs_qp.c (pure part) -------------------------------------------------------------- */

void kvt_verbs_qp_tun_defaults(kvt_verbs_qp_tun_t *t);
void kvt_verbs_qp_attr_reset(struct ibv_qp_attr *a, int *mask);
void kvt_verbs_qp_attr_init(uint8_t port_num, struct ibv_qp_attr *a, int *mask);
void kvt_verbs_qp_attr_rtr(const kvt_verbs_port_info_t *local, const kvt_verbs_port_info_t *remote,
                           const kvt_verbs_qp_info_t *remote_qp, const kvt_verbs_qp_tun_t *t,
                           struct ibv_qp_attr *a, int *mask);
void kvt_verbs_qp_attr_rts(const kvt_verbs_qp_info_t *local_qp, const kvt_verbs_qp_tun_t *t,
                           struct ibv_qp_attr *a, int *mask);

/* ---- kvt_verbs_handshake.c ------------------------------------------------------------------- */

/* The handshake blob is libkvt's TransportInit message (kvt_msg.h) with
 * transport "verbs": one lane per QP (qp_num, psn, lid, gid, mtu in bytes) and
 * one region entry per MR (a region cut into several MRs appears as consecutive
 * entries with the same uuid). Encode <hs> into a kvt_malloc'ed buffer the
 * caller kvt_free's. */
kvt_status_t kvt_verbs_hs_encode(const kvt_verbs_hs_t *hs, void **buf, size_t *len);

/* Decode and validate everything a peer controls; on success <hs> owns its
 * regions (kvt_verbs_hs_clear). */
kvt_status_t kvt_verbs_hs_decode(const void *buf, size_t len, kvt_verbs_hs_t *hs);
void kvt_verbs_hs_clear(kvt_verbs_hs_t *hs);
const kvt_verbs_mr_map_t *kvt_verbs_hs_region(const kvt_verbs_hs_t *hs, const char *uuid);

/* "xxxx:...:xxxx" (39 chars + NUL) <-> 16 raw bytes. */
void kvt_verbs_gid_format(const uint8_t gid[16], char out[40]);
kvt_status_t kvt_verbs_gid_parse(const char *s, uint8_t gid[16]);

/* enum ibv_mtu <-> bytes; 0 for anything else. */
uint32_t kvt_verbs_mtu_bytes(uint8_t mtu);
uint8_t kvt_verbs_mtu_enum(uint64_t bytes);

/* ---- kvt_verbs_device.c (pure part) ---------------------------------------------------------- */

/* NUMA node of a device from <root>/class/infiniband/<dev>/device/numa_node, -1
 * unknown. */
int kvt_verbs_dev_numa(const char *root, const char *dev);

/* Index of the device to use among names[0..n): the configured name if <want>
 * is set (KVT_ERR_NOT_FOUND if absent), else the one nearest to NUMA node
 * <numa> (same node first, then the smallest distance from
 * <root>/devices/system/node/node<numa>/distance, unknown last; ties keep list
 * order). */
kvt_status_t kvt_verbs_dev_pick(const char *root, const char *const *names, size_t n,
                                const char *want, int numa, size_t *idx);

/* GID index to use on <dev>/<port>: <want> if >= 0, else the first RoCE v2 GID
 * holding an IPv4-mapped address, else the first RoCE v2 GID, else the first
 * non-zero GID, else 0. */
int kvt_verbs_gid_pick(const char *root, const char *dev, int port, int want);

/* NUMA node of the page holding <addr>, -1 when unknown. */
int kvt_verbs_numa_of(const void *addr);

#endif
