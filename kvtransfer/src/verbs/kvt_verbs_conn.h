/*
 * One verbs connection to a peer: its RC QPs (one path each), the peer's
 * handshake (QP numbers and region rkeys), the path bookkeeping and the
 * transfers running on it. A connection is reference-counted: the transport's
 * peer table holds one reference, every live transfer one more; the QPs are
 * destroyed with the last reference, so no completion can arrive for freed
 * memory.
 */
#ifndef KVT_VERBS_CONN_H
#define KVT_VERBS_CONN_H

#include "kvt_transport.h"
#include "kvt_verbs_dev.h"

typedef struct kvt_verbs_report kvt_verbs_report_t;

#define KVT_VERBS_MAX_BATCH 64u

/* What a post, a completion or a retirement produced for the caller to report
 * outside all locks: transfers that finished and whether the peer just lost its
 * last path. */
struct kvt_verbs_report {
    struct kvt_verbs_xfer *finished; /* linked through ->next; free with kvt_verbs_xfer_free */
    bool peer_failed;
};

typedef struct kvt_verbs_conn {
    char peer_id[KVT_TL_PEER_ID_MAX + 1];
    kvt_verbs_dev_t *dev;
    pthread_mutex_t lock;
    unsigned refs;
    uint32_t nqps;
    struct ibv_qp *qp[KVT_VERBS_MAX_QPS];
    kvt_verbs_qp_info_t local_qp[KVT_VERBS_MAX_QPS];
    bool connected;        /* RTS on every QP */
    bool retired;          /* replaced or removed: takes no new transfers */
    bool failure_reported; /* every path failed and on_peer_failed was raised */
    kvt_verbs_hs_t remote; /* immutable once connected */
    kvt_verbs_paths_t paths;
    uint32_t batch;
    uint32_t slice_size;
    kvt_verbs_xfer_t *live; /* transfers not finished yet */
} kvt_verbs_conn_t;

/* Create a connection to <peer_id> with cfg->qps_per_peer RC QPs in INIT and
 * random PSNs. */
kvt_status_t kvt_verbs_conn_create(kvt_verbs_dev_t *dev, const char *peer_id,
                                   const kvt_verbs_cfg_t *cfg, kvt_verbs_conn_t **out);

/* Bring the QPs to RTS against the peer's handshake <remote> (moved into the
 * connection on success). Uses min(local, remote) QPs; both ends compute the
 * same pairing (QP i <-> QP i). */
kvt_status_t kvt_verbs_conn_connect(kvt_verbs_conn_t *c, kvt_verbs_hs_t *remote);

/* Take a reference (caller holds a reference already or the table lock). */
void kvt_verbs_conn_get(kvt_verbs_conn_t *c);
/* Drop a reference; the last one destroys the QPs and frees the connection. */
void kvt_verbs_conn_put(kvt_verbs_conn_t *c);

/* Start a transfer of <segs> (op WRITE or READ) on <c>. On KVT_OK the transfer
 * holds a reference and is reported through the finished list of a later
 * kvt_verbs_conn_on_wc or kvt_verbs_conn_retire. KVT_ERR_PEER when the
 * connection is retired or every path failed. */
kvt_status_t kvt_verbs_conn_post(kvt_verbs_conn_t *c, kvt_verbs_seg_t *segs, size_t nsegs,
                                 kvt_tl_op_t op, uint64_t cookie, size_t nentries,
                                 kvt_verbs_report_t *r);

/* Handle one work completion of a QP of <c> (called by the completion thread).
 */
void kvt_verbs_conn_on_wc(kvt_verbs_conn_t *c, const struct ibv_wc *wc, kvt_verbs_report_t *r);

/* Stop taking transfers, move every QP to ERR (the device flushes what is
 * posted, which then completes with an error through on_wc) and abandon what is
 * queued. */
void kvt_verbs_conn_retire(kvt_verbs_conn_t *c, kvt_verbs_report_t *r);

/* Fail every live transfer at once (only once no completion can arrive any
 * more: the completion thread is stopped). */
void kvt_verbs_conn_fail_all(kvt_verbs_conn_t *c, kvt_status_t status, kvt_verbs_report_t *r);

/* Free a finished transfer and drop its connection reference. */
void kvt_verbs_xfer_free(kvt_verbs_xfer_t *x);

/* Map a completion status to a libkvt status. */
kvt_status_t kvt_verbs_wc_status(enum ibv_wc_status s);

#endif
