/*
 * RC queue pairs: the attribute sets of RESET -> INIT -> RTR -> RTS are built
 * by pure functions (so every field and mask bit is unit-tested without a
 * device), and applied to real QPs by kvt_verbs_qp_create/kvt_verbs_qp_connect.
 */
#include <errno.h>
#include <string.h>

#include "kvt_verbs_dev.h"

void kvt_verbs_qp_tun_defaults(kvt_verbs_qp_tun_t *t)
{
    memset(t, 0, sizeof(*t));
    t->max_rd_atomic = 16; /* clamped to the device's max_qp_rd_atom / max_qp_init_rd_atom */
    t->timeout = 14;       /* 4.096 us * 2^14 = 67 ms per try */
    t->retry_cnt = 7;
    t->rnr_retry = 7;
    t->min_rnr_timer = 12; /* 0.64 ms */
    t->hop_limit = 64;
    t->sl = 0;
    t->traffic_class = 0;
}

void kvt_verbs_qp_attr_reset(struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof(*a));
    a->qp_state = IBV_QPS_RESET;
    *mask = IBV_QP_STATE;
}

void kvt_verbs_qp_attr_init(uint8_t port_num, struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof(*a));
    a->qp_state = IBV_QPS_INIT;
    a->pkey_index = 0;
    a->port_num = port_num;
    /* The peer WRITEs into (push) and READs from (pull) our regions. */
    a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

void kvt_verbs_qp_attr_rtr(const kvt_verbs_port_info_t *local, const kvt_verbs_port_info_t *remote,
                           const kvt_verbs_qp_info_t *remote_qp, const kvt_verbs_qp_tun_t *t,
                           struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof(*a));
    a->qp_state = IBV_QPS_RTR;
    /* Both ends must agree on the path MTU: the smaller active MTU wins. */
    a->path_mtu = (enum ibv_mtu)(local->mtu < remote->mtu ? local->mtu : remote->mtu);
    a->dest_qp_num = remote_qp->qpn & 0xffffffu;
    a->rq_psn = remote_qp->psn & 0xffffffu;
    a->max_dest_rd_atomic = t->max_rd_atomic;
    a->min_rnr_timer = t->min_rnr_timer;
    a->ah_attr.dlid = remote->lid;
    a->ah_attr.sl = t->sl;
    a->ah_attr.src_path_bits = 0;
    a->ah_attr.port_num = local->port_num;
    if (local->global) {
        /* RoCE routes by GID: every packet needs a GRH. */
        a->ah_attr.is_global = 1;
        memcpy(a->ah_attr.grh.dgid.raw, remote->gid, sizeof(remote->gid));
        a->ah_attr.grh.sgid_index = local->gid_index;
        a->ah_attr.grh.hop_limit = t->hop_limit;
        a->ah_attr.grh.traffic_class = t->traffic_class;
        a->ah_attr.grh.flow_label = 0;
    }
    *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

void kvt_verbs_qp_attr_rts(const kvt_verbs_qp_info_t *local_qp, const kvt_verbs_qp_tun_t *t,
                           struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof(*a));
    a->qp_state = IBV_QPS_RTS;
    a->sq_psn = local_qp->psn & 0xffffffu;
    a->timeout = t->timeout;
    a->retry_cnt = t->retry_cnt;
    a->rnr_retry = t->rnr_retry;
    a->max_rd_atomic = t->max_rd_atomic;
    *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_MAX_QP_RD_ATOMIC;
}

/* ---- device side ----------------------------------------------------------------------------- */

kvt_status_t kvt_verbs_qp_create(kvt_verbs_dev_t *dev, uint32_t max_wr, struct ibv_qp **out)
{
    struct ibv_qp_init_attr ia;
    struct ibv_qp_attr a;
    struct ibv_qp *qp;
    int mask, rc;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = dev->cq;
    ia.recv_cq = dev->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = max_wr;
    ia.cap.max_recv_wr = 1; /* one-sided only: nothing is ever received */
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    qp = ibv_create_qp(dev->pd, &ia);
    if (qp == NULL) {
        kvt_verbs_log("ibv_create_qp on %s failed: %s", dev->name, strerror(errno));
        return KVT_ERR_IO;
    }
    kvt_verbs_qp_attr_init(dev->port.port_num, &a, &mask);
    rc = ibv_modify_qp(qp, &a, mask);
    if (rc != 0) {
        kvt_verbs_log("QP %u RESET->INIT failed: %s", qp->qp_num, strerror(rc));
        ibv_destroy_qp(qp);
        return KVT_ERR_IO;
    }
    *out = qp;
    return KVT_OK;
}

kvt_status_t kvt_verbs_qp_connect(kvt_verbs_dev_t *dev, struct ibv_qp *qp,
                                  const kvt_verbs_qp_info_t *local_qp,
                                  const kvt_verbs_port_info_t *remote,
                                  const kvt_verbs_qp_info_t *remote_qp)
{
    kvt_verbs_qp_tun_t t;
    struct ibv_qp_attr a;
    int mask, rc;

    kvt_verbs_qp_tun_defaults(&t);
    if (t.max_rd_atomic > dev->max_rd_atom)
        t.max_rd_atomic = dev->max_rd_atom;
    kvt_verbs_qp_attr_rtr(&dev->port, remote, remote_qp, &t, &a, &mask);
    rc = ibv_modify_qp(qp, &a, mask);
    if (rc != 0) {
        kvt_verbs_log("QP %u INIT->RTR (dest qpn %u) failed: %s", qp->qp_num, remote_qp->qpn,
                      strerror(rc));
        return KVT_ERR_IO;
    }
    kvt_verbs_qp_attr_rts(local_qp, &t, &a, &mask);
    rc = ibv_modify_qp(qp, &a, mask);
    if (rc != 0) {
        kvt_verbs_log("QP %u RTR->RTS failed: %s", qp->qp_num, strerror(rc));
        return KVT_ERR_IO;
    }
    return KVT_OK;
}
