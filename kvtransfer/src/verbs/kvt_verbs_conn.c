/*
 * Connection to one peer: QPs, posting and completion handling. Slices of a
 * transfer are queued round-robin on the healthy paths (kvt_verbs_path.c) and
 * posted as chains of at most <batch> WRs while the path has credits; every
 * completion frees a credit and pumps again, so the number of outstanding WRs
 * per QP stays bounded without any thread waiting.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "kvt_verbs_conn.h"

kvt_status_t kvt_verbs_wc_status(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_SUCCESS:
        return KVT_OK;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
        return KVT_ERR_ACCESS;
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return KVT_ERR_PEER;
    default:
        return KVT_ERR_IO;
    }
}

static uint32_t random_psn(void)
{
    uint32_t v = 0;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (uint32_t)(uintptr_t)&v ^ 0x5a5a5au;
    return v & 0xffffffu;
}

kvt_status_t kvt_verbs_conn_create(kvt_verbs_dev_t *dev, const char *peer_id,
                                   const kvt_verbs_cfg_t *cfg, kvt_verbs_conn_t **out)
{
    kvt_verbs_conn_t *c;
    kvt_status_t st;
    uint32_t nqps = cfg->qps_per_peer, max_wr = cfg->max_wr;

    if (peer_id == NULL || strlen(peer_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    if (nqps == 0)
        nqps = KVT_VERBS_DEFAULT_QPS;
    if (nqps > KVT_VERBS_MAX_QPS)
        nqps = KVT_VERBS_MAX_QPS;
    if (dev->max_qp_wr > 0 && max_wr > dev->max_qp_wr)
        max_wr = dev->max_qp_wr;
    c = kvt_calloc(1, sizeof(*c));
    if (c == NULL)
        return KVT_ERR_NOMEM;
    snprintf(c->peer_id, sizeof(c->peer_id), "%s", peer_id);
    c->dev = dev;
    c->refs = 1;
    c->batch = cfg->batch == 0                    ? 1
               : cfg->batch > KVT_VERBS_MAX_BATCH ? KVT_VERBS_MAX_BATCH
                                                  : cfg->batch;
    c->slice_size = cfg->slice_size == 0 ? KVT_VERBS_SLICE_SIZE : cfg->slice_size;
    kvt_verbs_paths_init(&c->paths, nqps, max_wr, cfg->retry_limit);
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        kvt_free(c);
        return KVT_ERR_IO;
    }
    for (uint32_t i = 0; i < nqps; i++) {
        st = kvt_verbs_qp_create(dev, max_wr, &c->qp[i]);
        if (st != KVT_OK)
            goto err_qps;
        c->nqps++;
        c->local_qp[i].qpn = c->qp[i]->qp_num;
        c->local_qp[i].psn = random_psn();
    }
    *out = c;
    return KVT_OK;

err_qps:
    for (uint32_t i = 0; i < c->nqps; i++)
        ibv_destroy_qp(c->qp[i]);
    pthread_mutex_destroy(&c->lock);
    kvt_free(c);
    return st;
}

kvt_status_t kvt_verbs_conn_connect(kvt_verbs_conn_t *c, kvt_verbs_hs_t *remote)
{
    uint32_t n = remote->nqps < c->nqps ? remote->nqps : c->nqps;
    kvt_status_t st;

    for (uint32_t i = 0; i < n; i++) {
        st =
            kvt_verbs_qp_connect(c->dev, c->qp[i], &c->local_qp[i], &remote->port, &remote->qps[i]);
        if (st != KVT_OK)
            return st;
    }
    /* QPs the peer has no partner for are never used. */
    for (uint32_t i = n; i < c->nqps; i++) {
        ibv_destroy_qp(c->qp[i]);
        c->qp[i] = NULL;
    }
    pthread_mutex_lock(&c->lock);
    c->nqps = n;
    kvt_verbs_paths_init(&c->paths, n, c->paths.max_outstanding, c->paths.retry_limit);
    c->remote = *remote;
    memset(remote, 0, sizeof(*remote));
    c->connected = true;
    pthread_mutex_unlock(&c->lock);
    return KVT_OK;
}

void kvt_verbs_conn_get(kvt_verbs_conn_t *c)
{
    pthread_mutex_lock(&c->lock);
    c->refs++;
    pthread_mutex_unlock(&c->lock);
}

void kvt_verbs_conn_put(kvt_verbs_conn_t *c)
{
    unsigned left;

    pthread_mutex_lock(&c->lock);
    left = --c->refs;
    pthread_mutex_unlock(&c->lock);
    if (left > 0)
        return;
    for (uint32_t i = 0; i < KVT_VERBS_MAX_QPS; i++)
        if (c->qp[i] != NULL)
            ibv_destroy_qp(c->qp[i]);
    kvt_verbs_hs_clear(&c->remote);
    pthread_mutex_destroy(&c->lock);
    kvt_free(c);
}

/* Account every abandoned slice; finished transfers move to r->finished. Lock
 * held. */
static void settle(kvt_verbs_conn_t *c, kvt_verbs_slice_t *abandoned, kvt_status_t err,
                   kvt_verbs_report_t *r)
{
    while (abandoned != NULL) {
        kvt_verbs_slice_t *s = abandoned;
        kvt_verbs_xfer_t *x = s->xfer;

        abandoned = s->next;
        s->next = NULL;
        if (kvt_verbs_xfer_account(x, s, err)) {
            if (x->prev != NULL)
                x->prev->next = x->next;
            else
                c->live = x->next;
            if (x->next != NULL)
                x->next->prev = x->prev;
            x->prev = NULL;
            x->next = r->finished;
            r->finished = x;
        }
    }
}

/* Post what the paths let through. Lock held. */
static void pump(kvt_verbs_conn_t *c, kvt_verbs_report_t *r)
{
    struct ibv_send_wr wrs[KVT_VERBS_MAX_BATCH];
    struct ibv_sge sges[KVT_VERBS_MAX_BATCH];
    kvt_verbs_slice_t *s[KVT_VERBS_MAX_BATCH];
    kvt_verbs_slice_t *abandoned = NULL;
    bool again = true;

    while (again) {
        again = false;
        for (uint32_t p = 0; p < c->paths.npaths; p++) {
            size_t n;

            while ((n = kvt_verbs_paths_take(&c->paths, p, c->batch, s)) > 0) {
                struct ibv_send_wr *bad = NULL;
                size_t first_bad;
                int rc;

                kvt_verbs_chain_build(s, n, wrs, sges);
                rc = ibv_post_send(c->qp[p], wrs, &bad);
                if (rc == 0)
                    continue;
                first_bad = bad != NULL ? (size_t)(bad - wrs) : 0;
                if (first_bad > n)
                    first_bad = 0;
                kvt_verbs_log("peer %s: ibv_post_send on QP %u failed: %s; path disabled",
                              c->peer_id, c->qp[p]->qp_num, strerror(rc));
                kvt_verbs_paths_unpost(&c->paths, p, s + first_bad, n - first_bad, &abandoned);
                again = true;
                break;
            }
        }
    }
    settle(c, abandoned, KVT_ERR_PEER, r);
    if (kvt_verbs_paths_healthy(&c->paths) == 0 && !c->failure_reported) {
        c->failure_reported = true;
        r->peer_failed = true;
    }
}

kvt_status_t kvt_verbs_conn_post(kvt_verbs_conn_t *c, kvt_verbs_seg_t *segs, size_t nsegs,
                                 kvt_tl_op_t op, uint64_t cookie, size_t nentries,
                                 kvt_verbs_report_t *r)
{
    kvt_verbs_xfer_t *x;
    kvt_status_t st;
    size_t nslices = 0, built = 0;
    uint8_t opcode = op == KVT_TL_OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;

    nsegs = kvt_verbs_seg_coalesce(segs, nsegs);
    st = kvt_verbs_slice_count(segs, nsegs, c->slice_size, &nslices);
    if (st != KVT_OK)
        return st;
    if (nslices == 0)
        return KVT_ERR_INVALID;
    x = kvt_calloc(1, sizeof(*x) + nslices * sizeof(kvt_verbs_slice_t));
    if (x == NULL)
        return KVT_ERR_NOMEM;
    x->slices = (kvt_verbs_slice_t *)(x + 1);
    st = kvt_verbs_slice_build(segs, nsegs, c->slice_size, opcode, x->slices, nslices, &built);
    if (st != KVT_OK) {
        kvt_free(x);
        return st;
    }
    x->nslices = built;
    x->conn = c;
    x->cookie = cookie;
    x->nentries = nentries;
    x->op = (uint8_t)op;
    x->status = KVT_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->connected || c->retired || kvt_verbs_paths_healthy(&c->paths) == 0) {
        pthread_mutex_unlock(&c->lock);
        kvt_free(x);
        return KVT_ERR_PEER;
    }
    c->refs++;
    x->next = c->live;
    if (c->live != NULL)
        c->live->prev = x;
    c->live = x;
    for (size_t i = 0; i < x->nslices; i++) {
        x->slices[i].xfer = x;
        /* There is a healthy path (checked above), so enqueue cannot fail. */
        (void)kvt_verbs_paths_enqueue(&c->paths, &x->slices[i]);
    }
    pump(c, r);
    pthread_mutex_unlock(&c->lock);
    return KVT_OK;
}

void kvt_verbs_conn_on_wc(kvt_verbs_conn_t *c, const struct ibv_wc *wc, kvt_verbs_report_t *r)
{
    kvt_verbs_slice_t *s = (kvt_verbs_slice_t *)(uintptr_t)wc->wr_id;
    kvt_verbs_slice_t *abandoned = NULL;
    kvt_verbs_wc_action_t act;
    bool ok = wc->status == IBV_WC_SUCCESS;
    bool flushed = wc->status == IBV_WC_WR_FLUSH_ERR;
    kvt_status_t err = kvt_verbs_wc_status(wc->status);

    pthread_mutex_lock(&c->lock);
    if (!ok && !flushed && s->qp >= 0 && !c->paths.path[s->qp].failed)
        kvt_verbs_log("peer %s: QP %u completion error: %s (vendor 0x%x); path failed, "
                      "slice retried on another QP",
                      c->peer_id, wc->qp_num, ibv_wc_status_str(wc->status), wc->vendor_err);
    act = kvt_verbs_paths_complete(&c->paths, s, ok, flushed, &abandoned);
    if (act == KVT_VERBS_WC_DONE) {
        s->next = abandoned; /* account it together with the abandoned ones */
        abandoned = s;
    } else if (act == KVT_VERBS_WC_ABANDONED && abandoned == s) {
        /* the slice itself gave up: its own error decides the transfer status */
        abandoned = s->next;
        s->next = NULL;
        settle(c, s, flushed ? KVT_ERR_PEER : err, r);
    }
    settle(c, abandoned, KVT_ERR_PEER, r);
    if (!c->retired)
        pump(c, r);
    else if (kvt_verbs_paths_healthy(&c->paths) == 0 && !c->failure_reported)
        c->failure_reported = true; /* a retired connection is not a peer failure */
    pthread_mutex_unlock(&c->lock);
}

void kvt_verbs_conn_retire(kvt_verbs_conn_t *c, kvt_verbs_report_t *r)
{
    kvt_verbs_slice_t *abandoned = NULL;
    struct ibv_qp_attr a;

    pthread_mutex_lock(&c->lock);
    c->retired = true;
    c->failure_reported = true;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_ERR;
    for (uint32_t p = 0; p < c->nqps; p++) {
        if (c->qp[p] != NULL)
            (void)ibv_modify_qp(c->qp[p], &a, IBV_QP_STATE);
        if (!c->paths.path[p].failed)
            kvt_verbs_paths_fail(&c->paths, p, &abandoned);
    }
    settle(c, abandoned, KVT_ERR_PEER, r);
    pthread_mutex_unlock(&c->lock);
}

void kvt_verbs_conn_fail_all(kvt_verbs_conn_t *c, kvt_status_t status, kvt_verbs_report_t *r)
{
    pthread_mutex_lock(&c->lock);
    while (c->live != NULL) {
        kvt_verbs_xfer_t *x = c->live;

        c->live = x->next;
        if (x->status == KVT_OK)
            x->status = status;
        x->prev = NULL;
        x->next = r->finished;
        r->finished = x;
    }
    pthread_mutex_unlock(&c->lock);
}

void kvt_verbs_xfer_free(kvt_verbs_xfer_t *x)
{
    kvt_verbs_conn_t *c = x->conn;

    kvt_free(x);
    if (c != NULL)
        kvt_verbs_conn_put(c);
}
