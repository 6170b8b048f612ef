/*
 * Device-side objects of the verbs transport: an opened device (context, PD,
 * completion channel and the one CQ all QPs share) and the completion thread
 * that drains it.
 */
#ifndef KVT_VERBS_DEV_H
#define KVT_VERBS_DEV_H

#include <pthread.h>

#include "kvt_verbs_int.h"

typedef struct kvt_verbs_dev {
    char name[IBV_SYSFS_NAME_MAX];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq;
    uint32_t cq_size;
    kvt_verbs_port_info_t port;
    uint64_t max_mr_size;
    uint32_t max_qp_wr;
    uint8_t max_rd_atom;
    int numa;
} kvt_verbs_dev_t;

/* Log one line to stderr with the transport's prefix. */
void kvt_verbs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Number of RDMA devices on this host through ibv_get_device_list(); 0 when
 * there is none (or the kernel has no RDMA support). */
int kvt_verbs_dev_available(void);

/* Choose (kvt_verbs_dev_pick with the buffer's NUMA node <numa>) and open a
 * device: context, active port, GID, PD, completion channel and a CQ of
 * <cq_size> entries. KVT_ERR_UNSUPPORTED with one log line when the host has no
 * RDMA device; KVT_ERR_NOT_FOUND when the configured one is absent or has no
 * active port. */
kvt_status_t kvt_verbs_dev_open(const kvt_verbs_cfg_t *cfg, int numa, uint32_t cq_size,
                                kvt_verbs_dev_t **out);
void kvt_verbs_dev_close(kvt_verbs_dev_t *dev);

/* QPs (kvt_verbs_qp.c): create an RC QP in INIT; move it to RTR and RTS for a
 * remote QP. */
kvt_status_t kvt_verbs_qp_create(kvt_verbs_dev_t *dev, uint32_t max_wr, struct ibv_qp **out);
kvt_status_t kvt_verbs_qp_connect(kvt_verbs_dev_t *dev, struct ibv_qp *qp,
                                  const kvt_verbs_qp_info_t *local_qp,
                                  const kvt_verbs_port_info_t *remote,
                                  const kvt_verbs_qp_info_t *remote_qp);

/* Completion thread (kvt_verbs_cq.c): one per transport instance; calls on_wc
 * for every work completion of dev->cq and on_kick after every
 * kvt_verbs_cq_kick (and once more when stopping) until stopped. */
typedef void (*kvt_verbs_on_wc_cb)(void *arg, const struct ibv_wc *wc);

typedef struct kvt_verbs_cq_thread {
    kvt_verbs_dev_t *dev;
    kvt_verbs_on_wc_cb on_wc;
    void (*on_kick)(void *arg);
    void *arg;
    int stop_fd; /* eventfd */
    int kick_fd; /* eventfd */
    pthread_t thread;
    bool running;
} kvt_verbs_cq_thread_t;

kvt_status_t kvt_verbs_cq_start(kvt_verbs_cq_thread_t *t, kvt_verbs_dev_t *dev,
                                kvt_verbs_on_wc_cb on_wc, void (*on_kick)(void *arg), void *arg);
void kvt_verbs_cq_kick(kvt_verbs_cq_thread_t *t);
void kvt_verbs_cq_stop(kvt_verbs_cq_thread_t *t);

#endif
