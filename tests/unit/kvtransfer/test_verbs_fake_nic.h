/*
 * An in-process fake RDMA device for the verbs transport tests.
 *
 * Included by exactly one .c file per test executable: it defines the libibverbs entry points
 * the transport calls (device list, open, PD, MR, CQ, completion channel, QP) and the provider
 * ops behind the inline ibv_post_send / ibv_poll_cq / ibv_req_notify_cq; the executable's
 * definitions take precedence over libibverbs.so. The fake NIC refuses what a real one would
 * (QP state machine and attribute masks, lkeys, rkeys and bounds, send queue depth), counts
 * contract violations in fk.violations, and moves bytes with memcpy. It cannot show real NIC
 * behaviour (timing, PSNs on the wire, retransmission).
 */
#ifndef TEST_VERBS_FAKE_NIC_H
#define TEST_VERBS_FAKE_NIC_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "kvt_tsan.h"

#define FK_MAX_QPS  256
#define FK_MAX_MRS  1024
#define FK_QPN_BASE 0x100

typedef struct fk_cq {
    struct ibv_cq cq;
    struct ibv_wc *ring;
    int cap, head, count;
    bool armed;
} fk_cq_t;

typedef struct fk_channel {
    struct ibv_comp_channel ch;
    fk_cq_t *cq; /* the transport has one CQ per device context */
} fk_channel_t;

typedef struct fk_held {
    struct ibv_wc wc;
    struct ibv_send_wr wr; /* copy, sg_list points at sge */
    struct ibv_sge sge;
} fk_held_t;

typedef struct fk_qp {
    struct ibv_qp qp;
    uint32_t max_send_wr;
    uint32_t inflight; /* posted, completion not polled yet */
    uint32_t max_inflight;
    uint32_t dest_qpn, rq_psn, sq_psn;
    int fail_after; /* complete this many WRs, then fail with RETRY_EXC_ERR; -1 never */
    uint64_t posted;
    uint64_t seq; /* creation order */
    fk_held_t *held;
    int nheld;
} fk_qp_t;

typedef struct fk_mr {
    struct ibv_mr mr;
    int access;
} fk_mr_t;

static struct {
    pthread_mutex_t lock;
    uint64_t max_mr_size;
    uint32_t max_qp_wr;
    bool hold;      /* keep completions until fk_release() */
    bool skip_data; /* check keys and bounds but copy nothing (measures the software path) */
    fk_qp_t *qps[FK_MAX_QPS];
    fk_mr_t *mrs[FK_MAX_MRS];
    uint32_t next_qpn;
    uint64_t qp_seq;
    uint32_t next_key;
    unsigned mr_regs;
    unsigned violations; /* things a real NIC would refuse or that break the contract */
    char last_violation[200];
    unsigned max_chain;
    unsigned post_calls;
    uint32_t max_wr_len;
    unsigned bad_transitions;
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static struct ibv_device fk_dev = {.name = "fake0"};

static void fk_violation(const char *what)
{
    fk.violations++;
    snprintf(fk.last_violation, sizeof(fk.last_violation), "%s", what);
}

static fk_qp_t *fk_qp_by_num(uint32_t qpn)
{
    if (qpn < FK_QPN_BASE || qpn >= FK_QPN_BASE + FK_MAX_QPS)
        return NULL;
    return fk.qps[qpn - FK_QPN_BASE];
}

static fk_mr_t *fk_mr_by_key(uint32_t key, bool remote)
{
    for (int i = 0; i < FK_MAX_MRS; i++)
        if (fk.mrs[i] != NULL && (remote ? fk.mrs[i]->mr.rkey : fk.mrs[i]->mr.lkey) == key)
            return fk.mrs[i];
    return NULL;
}

static bool fk_in_mr(const fk_mr_t *m, uint64_t addr, uint64_t len)
{
    uint64_t b;

    if (m == NULL)
        return false;
    b = (uint64_t)(uintptr_t)m->mr.addr;
    return addr >= b && addr + len >= addr && addr + len <= b + m->mr.length;
}

/* Push a completion to the QP's CQ; fk.lock held. */
static void fk_push(fk_qp_t *q, const struct ibv_wc *wc)
{
    fk_cq_t *cq = (fk_cq_t *)q->qp.send_cq;
    uint64_t one = 1;

    if (cq->count == cq->cap) {
        fk_violation("CQ overflow");
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
    cq->count++;
    if (cq->armed) {
        cq->armed = false;
        if (write(cq->cq.channel->fd, &one, sizeof(one)) != sizeof(one))
            fk_violation("eventfd write");
    }
}

/* Execute one WR against memory; returns the completion status. fk.lock held. */
static enum ibv_wc_status fk_execute(const struct ibv_send_wr *wr)
{
    fk_mr_t *l = fk_mr_by_key(wr->sg_list[0].lkey, false);
    fk_mr_t *r = fk_mr_by_key(wr->wr.rdma.rkey, true);
    uint64_t la = wr->sg_list[0].addr, ra = wr->wr.rdma.remote_addr;
    uint32_t len = wr->sg_list[0].length;

    if (!fk_in_mr(l, la, len))
        return IBV_WC_LOC_PROT_ERR;
    if (!fk_in_mr(r, ra, len))
        return IBV_WC_REM_ACCESS_ERR;
    if (fk.skip_data)
        return IBV_WC_SUCCESS;
    /* The "DMA" touches the other engine's pages, which that engine reuses only after a
     * message over ZeroMQ that TSan cannot see through: order it as the TCP serve thread
     * does (kvt_tsan.h). */
    KVT_TSAN_WIRE_ACQUIRE();
    if (wr->opcode == IBV_WR_RDMA_WRITE)
        memcpy((void *)(uintptr_t)ra, (void *)(uintptr_t)la, len);
    else
        memcpy((void *)(uintptr_t)la, (void *)(uintptr_t)ra, len);
    KVT_TSAN_WIRE_RELEASE();
    return IBV_WC_SUCCESS;
}

static void fk_complete(fk_qp_t *q, const struct ibv_send_wr *wr, struct ibv_wc *wc)
{
    if (q->qp.state != IBV_QPS_RTS) {
        wc->status = IBV_WC_WR_FLUSH_ERR;
    } else if (q->fail_after == 0) {
        wc->status = IBV_WC_RETRY_EXC_ERR;
        q->qp.state = IBV_QPS_ERR; /* a real QP goes to ERR on a completion error */
    } else {
        if (q->fail_after > 0)
            q->fail_after--;
        wc->status = fk_execute(wr);
        if (wc->status != IBV_WC_SUCCESS)
            q->qp.state = IBV_QPS_ERR;
    }
}

static int fk_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    fk_qp_t *q = (fk_qp_t *)ibqp;
    unsigned chain = 0;

    pthread_mutex_lock(&fk.lock);
    fk.post_calls++;
    for (; wr != NULL; wr = wr->next) {
        struct ibv_wc wc;

        chain++;
        if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) {
            fk_violation("post on a QP that is not RTS");
            *bad = wr;
            pthread_mutex_unlock(&fk.lock);
            return EINVAL;
        }
        if (q->inflight >= q->max_send_wr) {
            fk_violation("send queue overrun");
            *bad = wr;
            pthread_mutex_unlock(&fk.lock);
            return ENOMEM;
        }
        if (wr->num_sge != 1 || !(wr->send_flags & IBV_SEND_SIGNALED) ||
            (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ))
            fk_violation("unexpected WR shape");
        if (wr->sg_list[0].length > fk.max_wr_len)
            fk.max_wr_len = wr->sg_list[0].length;
        q->inflight++;
        if (q->inflight > q->max_inflight)
            q->max_inflight = q->inflight;
        q->posted++;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr->wr_id;
        wc.qp_num = q->qp.qp_num;
        wc.opcode = wr->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ;
        wc.byte_len = wr->sg_list[0].length;
        if (fk.hold && q->qp.state == IBV_QPS_RTS) {
            fk_held_t *h;

            q->held = realloc(q->held, (size_t)(q->nheld + 1) * sizeof(*q->held));
            h = &q->held[q->nheld++];
            h->wc = wc;
            h->wr = *wr;
            h->sge = wr->sg_list[0];
            h->wr.sg_list = NULL; /* set at release: realloc moves the array */
            h->wr.next = NULL;
            continue;
        }
        fk_complete(q, wr, &wc);
        fk_push(q, &wc);
    }
    if (chain > fk.max_chain)
        fk.max_chain = chain;
    pthread_mutex_unlock(&fk.lock);
    return 0;
}

/* Complete every held WR (in order, per QP). fk.lock held. */
static void fk_release_locked(void)
{
    for (int i = 0; i < FK_MAX_QPS; i++) {
        fk_qp_t *q = fk.qps[i];

        if (q == NULL)
            continue;
        for (int k = 0; k < q->nheld; k++) {
            q->held[k].wr.sg_list = &q->held[k].sge; /* the array may have moved */
            fk_complete(q, &q->held[k].wr, &q->held[k].wc);
            fk_push(q, &q->held[k].wc);
        }
        free(q->held);
        q->held = NULL;
        q->nheld = 0;
    }
}

static inline unsigned fk_held_count(void)
{
    unsigned n = 0;

    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_QPS; i++)
        n += fk.qps[i] != NULL ? (unsigned)fk.qps[i]->nheld : 0;
    pthread_mutex_unlock(&fk.lock);
    return n;
}

static inline void fk_release(void)
{
    pthread_mutex_lock(&fk.lock);
    fk_release_locked();
    pthread_mutex_unlock(&fk.lock);
}

static int fk_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    fk_cq_t *cq = (fk_cq_t *)ibcq;
    int got = 0;

    pthread_mutex_lock(&fk.lock);
    while (got < n && cq->count > 0) {
        fk_qp_t *q;

        wc[got] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
        q = fk_qp_by_num(wc[got].qp_num);
        if (q != NULL && q->inflight > 0)
            q->inflight--;
        got++;
    }
    pthread_mutex_unlock(&fk.lock);
    return got;
}

static int fk_req_notify(struct ibv_cq *ibcq, int solicited)
{
    fk_cq_t *cq = (fk_cq_t *)ibcq;
    uint64_t one = 1;

    pthread_mutex_lock(&fk.lock);
    if (cq->count > 0) {
        if (write(cq->cq.channel->fd, &one, sizeof(one)) != sizeof(one))
            fk_violation("eventfd write");
    } else {
        cq->armed = true;
    }
    pthread_mutex_unlock(&fk.lock);
    return 0;
}

struct ibv_device **ibv_get_device_list(int *num)
{
    struct ibv_device **l = calloc(2, sizeof(*l));

    if (l == NULL)
        return NULL;
    l[0] = &fk_dev;
    if (num != NULL)
        *num = 1;
    return l;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct ibv_context *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->device = device;
    c->ops.poll_cq = fk_poll_cq;
    c->ops.req_notify_cq = fk_req_notify;
    c->ops.post_send = fk_post_send;
    c->abi_compat = NULL; /* not an extended context: inline helpers use the plain calls */
    return c;
}

int ibv_close_device(struct ibv_context *context)
{
    free(context);
    return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    memset(a, 0, sizeof(*a));
    a->max_mr_size = fk.max_mr_size;
    a->max_qp_wr = (int)fk.max_qp_wr;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->max_cqe = 65536;
    a->phys_port_cnt = 1;
    return 0;
}

#undef ibv_query_port
int ibv_query_port(struct ibv_context *context, uint8_t port, struct _compat_ibv_port_attr *pa)
{
    struct ibv_port_attr *a = (struct ibv_port_attr *)pa;

    if (port != 1)
        return EINVAL;
    a->state = IBV_PORT_ACTIVE;
    a->lid = 0;
    a->active_mtu = IBV_MTU_1024;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    a->gid_tbl_len = 16;
    return 0;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid)
{
    memset(gid, 0, sizeof(*gid));
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    gid->raw[12] = 10;
    gid->raw[15] = (uint8_t)(1 + index);
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));

    if (pd != NULL)
        pd->context = context;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    fk_channel_t *ch = calloc(1, sizeof(*ch));

    if (ch == NULL)
        return NULL;
    ch->ch.context = context;
    ch->ch.fd = eventfd(0, EFD_CLOEXEC);
    return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    close(channel->fd);
    free(channel);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    fk_cq_t *cq = calloc(1, sizeof(*cq));

    if (cq == NULL)
        return NULL;
    cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
    cq->cap = cqe;
    cq->cq.context = context;
    cq->cq.channel = channel;
    cq->cq.cq_context = cq_context;
    cq->cq.cqe = cqe;
    ((fk_channel_t *)channel)->cq = cq;
    return &cq->cq;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    fk_cq_t *cq = (fk_cq_t *)ibcq;

    pthread_mutex_lock(&fk.lock);
    if (cq->count != 0)
        fk_violation("CQ destroyed with unpolled completions");
    pthread_mutex_unlock(&fk.lock);
    free(cq->ring);
    free(cq);
    return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
    uint64_t v;

    if (read(channel->fd, &v, sizeof(v)) != sizeof(v))
        return -1;
    *cq = &((fk_channel_t *)channel)->cq->cq;
    *cq_context = (*cq)->cq_context;
    return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    fk_qp_t *q = calloc(1, sizeof(*q));

    if (q == NULL)
        return NULL;
    pthread_mutex_lock(&fk.lock);
    for (int k = 0; k < FK_MAX_QPS && fk.qps[fk.next_qpn % FK_MAX_QPS] != NULL; k++)
        fk.next_qpn++;
    fk.next_qpn %= FK_MAX_QPS;
    if (fk.qps[fk.next_qpn] != NULL) { /* every QP number in use */
        pthread_mutex_unlock(&fk.lock);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.qp_type = ia->qp_type;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_num = FK_QPN_BASE + fk.next_qpn;
    q->max_send_wr = ia->cap.max_send_wr;
    q->fail_after = -1;
    q->seq = ++fk.qp_seq;
    fk.qps[fk.next_qpn++] = q;
    if (ia->qp_type != IBV_QPT_RC || ia->cap.max_send_sge < 1)
        fk_violation("QP not RC");
    pthread_mutex_unlock(&fk.lock);
    return &q->qp;
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    fk_qp_t *q = (fk_qp_t *)ibqp;
    int need = 0;
    bool ok;

    pthread_mutex_lock(&fk.lock);
    switch (a->qp_state) {
    case IBV_QPS_INIT:
        ok = q->qp.state == IBV_QPS_RESET;
        need = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        break;
    case IBV_QPS_RTR:
        ok = q->qp.state == IBV_QPS_INIT && fk_qp_by_num(a->dest_qp_num) != NULL &&
             a->ah_attr.is_global == 1; /* the fake port is RoCE */
        need = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        q->dest_qpn = a->dest_qp_num;
        q->rq_psn = a->rq_psn;
        break;
    case IBV_QPS_RTS:
        ok = q->qp.state == IBV_QPS_RTR;
        need = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
               IBV_QP_MAX_QP_RD_ATOMIC;
        q->sq_psn = a->sq_psn;
        break;
    case IBV_QPS_ERR:
    case IBV_QPS_RESET:
        ok = true;
        need = IBV_QP_STATE;
        break;
    default:
        ok = false;
    }
    if (!ok || (mask & need) != need) {
        fk.bad_transitions++;
        pthread_mutex_unlock(&fk.lock);
        return EINVAL;
    }
    q->qp.state = a->qp_state;
    if (a->qp_state == IBV_QPS_ERR) {
        /* everything still held is flushed */
        for (int k = 0; k < q->nheld; k++) {
            q->held[k].wc.status = IBV_WC_WR_FLUSH_ERR;
            fk_push(q, &q->held[k].wc);
        }
        free(q->held);
        q->held = NULL;
        q->nheld = 0;
    }
    pthread_mutex_unlock(&fk.lock);
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    fk_qp_t *q = (fk_qp_t *)ibqp;

    pthread_mutex_lock(&fk.lock);
    if (q->inflight != 0 || q->nheld != 0)
        fk_violation("QP destroyed with work in flight");
    fk.qps[q->qp.qp_num - FK_QPN_BASE] = NULL;
    pthread_mutex_unlock(&fk.lock);
    free(q->held);
    free(q);
    return 0;
}

static struct ibv_mr *fk_reg(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    fk_mr_t *m = calloc(1, sizeof(*m));

    if (m == NULL)
        return NULL;
    pthread_mutex_lock(&fk.lock);
    if (fk.max_mr_size != 0 && length > fk.max_mr_size)
        fk_violation("MR larger than max_mr_size");
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.lkey = 0x1000 + fk.next_key;
    m->mr.rkey = 0x8000 + fk.next_key++;
    m->access = access;
    fk.mr_regs++;
    for (int i = 0; i < FK_MAX_MRS; i++) {
        if (fk.mrs[i] == NULL) {
            fk.mrs[i] = m;
            break;
        }
    }
    pthread_mutex_unlock(&fk.lock);
    return &m->mr;
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return fk_reg(pd, addr, length, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access)
{
    return fk_reg(pd, addr, length, (int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_MRS; i++)
        if (fk.mrs[i] == (fk_mr_t *)mr)
            fk.mrs[i] = NULL;
    pthread_mutex_unlock(&fk.lock);
    free(mr);
    return 0;
}

#endif
