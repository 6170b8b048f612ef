/*
 * Internal state of one verbs transport instance, shared by the ops glue (kvt_tl_verbs.c), the
 * region registry (kvt_verbs_region.c) and the peer table (kvt_verbs_peer.c).
 */
#ifndef KVT_VERBS_TL_INT_H
#define KVT_VERBS_TL_INT_H

#include "kvt_tl_verbs.h"
#include "kvt_verbs_conn.h"

#define KVT_VERBS_CQ_SIZE       65536u
#define KVT_VERBS_CLOSE_WAIT_MS 5000

struct kvt_tl_region {
    struct kvt_tl_region *next;
    char uuid[KVT_TL_UUID_LEN + 1];
    void *base;
    uint64_t length;
    kvt_verbs_mr_map_t lmap; /* lkeys */
    kvt_verbs_mr_map_t rmap; /* rkeys, sent to peers */
    struct ibv_mr **mrs;
    uint32_t nmrs;
};

typedef struct verbs_peer {
    struct verbs_peer *next;
    char id[KVT_TL_PEER_ID_MAX + 1];
    kvt_verbs_conn_t *active;  /* table reference */
    kvt_verbs_conn_t *pending; /* prepared, waiting for the peer's blob */
    uint64_t remote_epoch;
} verbs_peer_t;

/* A connection whose peer failure is to be reported by the completion thread.
 */
typedef struct verbs_deferred_fail {
    struct verbs_deferred_fail *next;
    char id[KVT_TL_PEER_ID_MAX + 1];
} verbs_deferred_fail_t;

struct kvt_tl {
    kvt_verbs_cfg_t cfg;
    kvt_tl_callbacks_t cb;
    char local_id[KVT_TL_PEER_ID_MAX + 1];
    uint64_t epoch;
    pthread_mutex_t lock; /* dev, regions, peers, deferred */
    kvt_verbs_dev_t *dev;
    kvt_verbs_cq_thread_t cq;
    kvt_tl_region_t *regions;
    uint32_t nregions;
    verbs_peer_t *peers;
    kvt_verbs_xfer_t *deferred; /* finished outside the completion thread */
    verbs_deferred_fail_t *deferred_fail;
    kvt_tl_stats_t stats; /* __atomic */
};

/* ---- kvt_tl_verbs.c -------------------------------------------------------------------------- */

void kvt_verbs_tl_stat_add(uint64_t *v, uint64_t n);
/* Open the device (once) and start the completion thread. tl->lock held. */
kvt_status_t kvt_verbs_tl_ensure_dev(kvt_tl_t *tl, int numa);
/* Report finished transfers / a failed peer now (completion thread or destroy). */
void kvt_verbs_tl_deliver(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r);
/* Hand a report made on an engine thread to the completion thread. */
void kvt_verbs_tl_defer(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r);

/* ---- kvt_verbs_region.c: registered regions (one MR each, split above max_mr_size) ----------- */

kvt_status_t kvt_verbs_reg_region(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                                  kvt_tl_region_t **out);
void kvt_verbs_dereg_region(kvt_tl_t *tl, kvt_tl_region_t *region);
void kvt_verbs_region_free(kvt_tl_region_t *r);

/* ---- kvt_verbs_peer.c: the peer table, the handshake halves and posting ---------------------- */

/* tl->lock held. */
verbs_peer_t *kvt_verbs_peer_find(kvt_tl_t *tl, const char *id);
kvt_status_t kvt_verbs_peer_prepare(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len);
kvt_status_t kvt_verbs_peer_connect(kvt_tl_t *tl, const char *peer_id, const void *blob,
                                    size_t len);
kvt_status_t kvt_verbs_peer_rename(kvt_tl_t *tl, const char *old_id, const char *new_id);
void kvt_verbs_peer_remove(kvt_tl_t *tl, const char *peer_id);
kvt_status_t kvt_verbs_post(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
                            const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie);

#endif
