/*
 * The verbs transport behind libkvt's transport ops table. This file is the glue: create and
 * destroy, the counters, and handing completions from the completion thread back to the engine.
 * Regions live in kvt_verbs_region.c, the peer table and posting in kvt_verbs_peer.c, a peer's
 * QPs in kvt_verbs_conn.c, paths and retries in kvt_verbs_path.c.
 *
 * The device is opened when it is first needed: at create when a device is configured (so a
 * wrong name fails early), otherwise at the first region registration, choosing the NIC nearest
 * to that region's NUMA node.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kvt_verbs_tl_int.h"

void kvt_verbs_tl_stat_add(uint64_t *v, uint64_t n)
{
    __atomic_fetch_add(v, n, __ATOMIC_RELAXED);
}

/* ---- reporting ------------------------------------------------------------------------------- */

static void report_xfer(kvt_tl_t *tl, kvt_verbs_xfer_t *x)
{
    if (x->status == KVT_OK) {
        kvt_verbs_tl_stat_add(x->op == KVT_TL_OP_WRITE ? &tl->stats.bytes_written
                                                       : &tl->stats.bytes_read,
                              x->bytes_done);
        kvt_verbs_tl_stat_add(&tl->stats.ops_completed, x->nentries);
    } else {
        kvt_verbs_tl_stat_add(&tl->stats.ops_failed, x->nentries);
    }
    if (tl->cb.on_complete != NULL)
        tl->cb.on_complete(tl->cb.arg, x->cookie, x->status);
    kvt_verbs_xfer_free(x);
}

static void report_peer_failed(kvt_tl_t *tl, const char *peer_id)
{
    kvt_verbs_tl_stat_add(&tl->stats.peer_failures, 1);
    kvt_verbs_log("peer %s: every QP failed; the connection is down until the "
                  "next handshake",
                  peer_id);
    if (tl->cb.on_peer_failed != NULL)
        tl->cb.on_peer_failed(tl->cb.arg, peer_id, KVT_ERR_PEER);
}

/* Deliver a report now (completion thread, or destroy). */
void kvt_verbs_tl_deliver(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r)
{
    if (r->peer_failed)
        report_peer_failed(tl, peer_id);
    while (r->finished != NULL) {
        kvt_verbs_xfer_t *x = r->finished;

        r->finished = x->next;
        report_xfer(tl, x);
    }
}

/* Hand a report made on an engine thread (post, handshake) to the completion
 * thread. */
void kvt_verbs_tl_defer(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r)
{
    verbs_deferred_fail_t *f = NULL;

    if (r->finished == NULL && !r->peer_failed)
        return;
    if (r->peer_failed) {
        f = kvt_calloc(1, sizeof(*f));
        if (f != NULL)
            snprintf(f->id, sizeof(f->id), "%s", peer_id);
        else
            kvt_verbs_log("peer %s failed (no memory to queue the notification)", peer_id);
    }
    pthread_mutex_lock(&tl->lock);
    while (r->finished != NULL) {
        kvt_verbs_xfer_t *x = r->finished;

        r->finished = x->next;
        x->next = tl->deferred;
        tl->deferred = x;
    }
    if (f != NULL) {
        f->next = tl->deferred_fail;
        tl->deferred_fail = f;
    }
    pthread_mutex_unlock(&tl->lock);
    kvt_verbs_cq_kick(&tl->cq);
}

static void on_kick(void *arg)
{
    kvt_tl_t *tl = arg;
    kvt_verbs_xfer_t *xs;
    verbs_deferred_fail_t *fs;

    pthread_mutex_lock(&tl->lock);
    xs = tl->deferred;
    fs = tl->deferred_fail;
    tl->deferred = NULL;
    tl->deferred_fail = NULL;
    pthread_mutex_unlock(&tl->lock);
    while (fs != NULL) {
        verbs_deferred_fail_t *f = fs;

        fs = f->next;
        report_peer_failed(tl, f->id);
        kvt_free(f);
    }
    while (xs != NULL) {
        kvt_verbs_xfer_t *x = xs;

        xs = x->next;
        report_xfer(tl, x);
    }
}

static void on_wc(void *arg, const struct ibv_wc *wc)
{
    kvt_tl_t *tl = arg;
    kvt_verbs_slice_t *s = (kvt_verbs_slice_t *)(uintptr_t)wc->wr_id;
    kvt_verbs_conn_t *c;
    kvt_verbs_report_t r = {0};

    if (s == NULL || s->xfer == NULL)
        return;
    c = s->xfer->conn;
    kvt_verbs_conn_get(c); /* the transfer may finish and drop its reference below */
    kvt_verbs_conn_on_wc(c, wc, &r);
    kvt_verbs_tl_deliver(tl, c->peer_id, &r);
    kvt_verbs_conn_put(c);
}

/* ---- device ---------------------------------------------------------------------------------- */

/* Open the device (once) and start the completion thread. tl->lock held. */
kvt_status_t kvt_verbs_tl_ensure_dev(kvt_tl_t *tl, int numa)
{
    kvt_status_t st;

    if (tl->dev != NULL)
        return KVT_OK;
    st = kvt_verbs_dev_open(&tl->cfg, numa, KVT_VERBS_CQ_SIZE, &tl->dev);
    if (st != KVT_OK)
        return st;
    st = kvt_verbs_cq_start(&tl->cq, tl->dev, on_wc, on_kick, tl);
    if (st != KVT_OK) {
        kvt_verbs_dev_close(tl->dev);
        tl->dev = NULL;
    }
    return st;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static kvt_status_t verbs_create(const kvt_tl_config_t *cfg, const kvt_tl_callbacks_t *cb,
                                 kvt_tl_t **out)
{
    kvt_tl_t *tl;
    kvt_status_t st;
    const char *env;

    if (cfg == NULL || cb == NULL || out == NULL)
        return KVT_ERR_INVALID;
    if (kvt_verbs_dev_available() == 0) {
        static int logged;

        /* One line per process: callers retrying creation do not flood the log. */
        if (__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED) == 0)
            kvt_verbs_log("transfer_channel verbs: no RDMA device on this host "
                          "(ibv_get_device_list found none)");
        return KVT_ERR_UNSUPPORTED;
    }
    tl = kvt_calloc(1, sizeof(*tl));
    if (tl == NULL)
        return KVT_ERR_NOMEM;
    kvt_verbs_cfg_defaults(&tl->cfg);
    st = kvt_verbs_cfg_parse_device(cfg->device, &tl->cfg);
    if (st != KVT_OK) {
        kvt_verbs_log("bad verbs device setting '%s' (expected [name][:port[:gid_index]])",
                      cfg->device);
        goto err_tl;
    }
    tl->cfg.qps_per_peer = cfg->lanes == 0 ? KVT_VERBS_DEFAULT_QPS : cfg->lanes;
    if (tl->cfg.qps_per_peer > KVT_VERBS_MAX_QPS)
        tl->cfg.qps_per_peer = KVT_VERBS_MAX_QPS;
    env = getenv("KVT_VERBS_MAX_MR_SIZE"); /* lets a device run exercise MR splitting */
    if (env != NULL && env[0] != '\0')
        tl->cfg.max_mr_size = strtoull(env, NULL, 0);
    if (cfg->local_id != NULL && cfg->local_id[0] != '\0')
        snprintf(tl->local_id, sizeof(tl->local_id), "%s", cfg->local_id);
    else
        snprintf(tl->local_id, sizeof(tl->local_id), "verbs-%ld", (long)getpid());
    if (getrandom(&tl->epoch, sizeof(tl->epoch), GRND_NONBLOCK) != (ssize_t)sizeof(tl->epoch))
        tl->epoch = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    tl->epoch = (tl->epoch & INT64_MAX) | 1; /* non-zero, fits the int field */
    tl->cb = *cb;
    if (pthread_mutex_init(&tl->lock, NULL) != 0) {
        st = KVT_ERR_IO;
        goto err_tl;
    }
    if (tl->cfg.device[0] != '\0') {
        st = kvt_verbs_tl_ensure_dev(tl, -1);
        if (st != KVT_OK)
            goto err_lock;
    }
    *out = tl;
    return KVT_OK;

err_lock:
    pthread_mutex_destroy(&tl->lock);
err_tl:
    kvt_free(tl);
    return st;
}

static void verbs_stats(kvt_tl_t *tl, kvt_tl_stats_t *out)
{
    out->bytes_written = __atomic_load_n(&tl->stats.bytes_written, __ATOMIC_RELAXED);
    out->bytes_read = __atomic_load_n(&tl->stats.bytes_read, __ATOMIC_RELAXED);
    out->bytes_served = __atomic_load_n(&tl->stats.bytes_served, __ATOMIC_RELAXED);
    out->ops_completed = __atomic_load_n(&tl->stats.ops_completed, __ATOMIC_RELAXED);
    out->ops_failed = __atomic_load_n(&tl->stats.ops_failed, __ATOMIC_RELAXED);
    out->access_denied = __atomic_load_n(&tl->stats.access_denied, __ATOMIC_RELAXED);
    out->bad_frames = __atomic_load_n(&tl->stats.bad_frames, __ATOMIC_RELAXED);
    out->peer_failures = __atomic_load_n(&tl->stats.peer_failures, __ATOMIC_RELAXED);
}

static bool conns_idle(kvt_tl_t *tl, verbs_peer_t *peers)
{
    for (verbs_peer_t *p = peers; p != NULL; p = p->next) {
        bool busy;

        if (p->active == NULL)
            continue;
        pthread_mutex_lock(&p->active->lock);
        busy = p->active->live != NULL;
        pthread_mutex_unlock(&p->active->lock);
        if (busy)
            return false;
    }
    return true;
}

static void verbs_destroy(kvt_tl_t *tl)
{
    verbs_peer_t *peers;

    if (tl == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    peers = tl->peers;
    tl->peers = NULL;
    pthread_mutex_unlock(&tl->lock);
    /* Flush everything posted: the completion thread reports the errors. */
    for (verbs_peer_t *p = peers; p != NULL; p = p->next) {
        kvt_verbs_report_t r = {0};

        if (p->active != NULL) {
            kvt_verbs_conn_retire(p->active, &r);
            kvt_verbs_tl_deliver(tl, p->id, &r);
        }
    }
    for (int waited = 0; waited < KVT_VERBS_CLOSE_WAIT_MS && !conns_idle(tl, peers); waited += 5)
        usleep(5000);
    if (tl->dev != NULL)
        kvt_verbs_cq_stop(&tl->cq); /* also delivers what was deferred */
    while (peers != NULL) {
        verbs_peer_t *p = peers;
        kvt_verbs_report_t r = {0};

        peers = p->next;
        if (p->active != NULL) {
            kvt_verbs_conn_fail_all(p->active, KVT_ERR_CLOSED, &r);
            kvt_verbs_tl_deliver(tl, p->id, &r);
            kvt_verbs_conn_put(p->active);
        }
        if (p->pending != NULL)
            kvt_verbs_conn_put(p->pending);
        kvt_free(p);
    }
    while (tl->regions != NULL) {
        kvt_tl_region_t *r = tl->regions;

        tl->regions = r->next;
        kvt_verbs_region_free(r);
    }
    kvt_verbs_dev_close(tl->dev);
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
}

static const kvt_tl_ops_t kvt_tl_verbs_ops = {
    .create = verbs_create,
    .destroy = verbs_destroy,
    .reg_region = kvt_verbs_reg_region,
    .dereg_region = kvt_verbs_dereg_region,
    .peer_prepare = kvt_verbs_peer_prepare,
    .peer_connect = kvt_verbs_peer_connect,
    .peer_rename = kvt_verbs_peer_rename,
    .peer_remove = kvt_verbs_peer_remove,
    /* One-sided RDMA: the target's CPU never sees an access, so there is
     * nothing to check per page; the NIC enforces region bounds through the MR
     * keys. */
    .grant = NULL,
    .revoke = NULL,
    .post = kvt_verbs_post,
    .stats = verbs_stats,
};

const kvt_transport_desc_t kvt_tl_verbs_desc = {
    .name = "verbs",
    .ops = &kvt_tl_verbs_ops,
};

KVT_TRANSPORT_REGISTER(verbs, &kvt_tl_verbs_desc)
