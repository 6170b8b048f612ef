/*
 * The verbs transport behind libkvt's transport ops table. This file is glue:
 * it keeps the registered regions (one MR per region, split only above the
 * device's max MR size), the peer table (one active connection per peer, a
 * pending one during a handshake) and the counters, and hands completions from
 * the completion thread back to the engine. Posting, paths and retries live in
 * kvt_verbs_conn.c / kvt_verbs_path.c.
 *
 * The device is opened when it is first needed: at create when a device is
 * configured (so a wrong name fails early), otherwise at the first region
 * registration, choosing the NIC nearest to that region's NUMA node.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

static void stat_add(uint64_t *v, uint64_t n)
{
    __atomic_fetch_add(v, n, __ATOMIC_RELAXED);
}

/* ---- reporting
 * -------------------------------------------------------------------------- */

static void report_xfer(kvt_tl_t *tl, kvt_verbs_xfer_t *x)
{
    if (x->status == KVT_OK) {
        stat_add(x->op == KVT_TL_OP_WRITE ? &tl->stats.bytes_written : &tl->stats.bytes_read,
                 x->bytes_done);
        stat_add(&tl->stats.ops_completed, x->nentries);
    } else {
        stat_add(&tl->stats.ops_failed, x->nentries);
    }
    if (tl->cb.on_complete != NULL)
        tl->cb.on_complete(tl->cb.arg, x->cookie, x->status);
    kvt_verbs_xfer_free(x);
}

static void report_peer_failed(kvt_tl_t *tl, const char *peer_id)
{
    stat_add(&tl->stats.peer_failures, 1);
    kvt_verbs_log("peer %s: every QP failed; the connection is down until the "
                  "next handshake",
                  peer_id);
    if (tl->cb.on_peer_failed != NULL)
        tl->cb.on_peer_failed(tl->cb.arg, peer_id, KVT_ERR_PEER);
}

/* Deliver a report now (completion thread, or destroy). */
static void deliver(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r)
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
static void defer(kvt_tl_t *tl, const char *peer_id, kvt_verbs_report_t *r)
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
    deliver(tl, c->peer_id, &r);
    kvt_verbs_conn_put(c);
}

/* ---- device
 * -----------------------------------------------------------------------------
 */

/* Open the device (once) and start the completion thread. tl->lock held. */
static kvt_status_t ensure_dev(kvt_tl_t *tl, int numa)
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

static uint64_t mr_limit(const kvt_tl_t *tl)
{
    uint64_t dev = tl->dev->max_mr_size;

    if (tl->cfg.max_mr_size != 0 && (dev == 0 || tl->cfg.max_mr_size < dev))
        return tl->cfg.max_mr_size;
    return dev;
}

/* ---- ops
 * --------------------------------------------------------------------------------
 */

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
        st = ensure_dev(tl, -1);
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

static void region_free(kvt_tl_region_t *r)
{
    for (uint32_t i = 0; i < r->nmrs; i++)
        if (r->mrs[i] != NULL && ibv_dereg_mr(r->mrs[i]) != 0)
            kvt_verbs_log("ibv_dereg_mr of region %s failed", r->uuid);
    kvt_free(r->mrs);
    kvt_verbs_mr_map_clear(&r->lmap);
    kvt_verbs_mr_map_clear(&r->rmap);
    kvt_free(r);
}

static kvt_status_t verbs_reg_region(kvt_tl_t *tl, const kvt_tl_region_params_t *p,
                                     kvt_tl_region_t **out)
{
    kvt_tl_region_t *r, *it;
    kvt_status_t st;
    uint64_t base;

    if (p == NULL || p->uuid == NULL || strlen(p->uuid) != KVT_TL_UUID_LEN || p->base == NULL ||
        p->length == 0 || (p->page_size != 0 && p->length % p->page_size != 0))
        return KVT_ERR_INVALID;
    base = (uint64_t)(uintptr_t)p->base;
    r = kvt_calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NOMEM;
    snprintf(r->uuid, sizeof(r->uuid), "%s", p->uuid);
    r->base = p->base;
    r->length = p->length;
    pthread_mutex_lock(&tl->lock);
    for (it = tl->regions; it != NULL; it = it->next) {
        if (strcmp(it->uuid, r->uuid) == 0) {
            st = KVT_ERR_EXISTS;
            goto err_unlock;
        }
    }
    st = ensure_dev(tl, kvt_verbs_numa_of(p->base));
    if (st != KVT_OK)
        goto err_unlock;
    st = kvt_verbs_mr_map_init(&r->lmap, r->uuid, base, p->length, mr_limit(tl));
    if (st == KVT_OK)
        st = kvt_verbs_mr_map_init(&r->rmap, r->uuid, base, p->length, mr_limit(tl));
    if (st != KVT_OK)
        goto err_unlock;
    r->mrs = kvt_calloc(r->lmap.nkeys, sizeof(*r->mrs));
    if (r->mrs == NULL) {
        st = KVT_ERR_NOMEM;
        goto err_unlock;
    }
    for (uint32_t i = 0; i < r->lmap.nkeys; i++) {
        uint64_t off = (uint64_t)i * r->lmap.chunk_size;
        uint64_t len = p->length - off < r->lmap.chunk_size ? p->length - off : r->lmap.chunk_size;

        r->mrs[i] =
            ibv_reg_mr(tl->dev->pd, (uint8_t *)p->base + off, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        if (r->mrs[i] == NULL) {
            kvt_verbs_log("ibv_reg_mr of region %s (%" PRIu64 " bytes at +%" PRIu64 ") failed: %s",
                          r->uuid, len, off, strerror(errno));
            st = KVT_ERR_IO;
            goto err_unlock;
        }
        r->nmrs++;
        r->lmap.keys[i] = r->mrs[i]->lkey;
        r->rmap.keys[i] = r->mrs[i]->rkey;
    }
    r->next = tl->regions;
    tl->regions = r;
    tl->nregions++;
    pthread_mutex_unlock(&tl->lock);
    *out = r;
    return KVT_OK;

err_unlock:
    pthread_mutex_unlock(&tl->lock);
    region_free(r);
    return st;
}

static void verbs_dereg_region(kvt_tl_t *tl, kvt_tl_region_t *region)
{
    kvt_tl_region_t **pp;

    if (region == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    for (pp = &tl->regions; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == region) {
            *pp = region->next;
            tl->nregions--;
            break;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    region_free(region);
}

/* tl->lock held. */
static verbs_peer_t *peer_find(kvt_tl_t *tl, const char *id)
{
    for (verbs_peer_t *p = tl->peers; p != NULL; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

static uint32_t peer_count(const kvt_tl_t *tl)
{
    uint32_t n = 0;

    for (verbs_peer_t *p = tl->peers; p != NULL; p = p->next)
        n += (p->active != NULL) + (p->pending != NULL);
    return n;
}

static kvt_status_t verbs_peer_prepare(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len)
{
    kvt_verbs_conn_t *c = NULL, *old_pending = NULL;
    kvt_verbs_mr_map_t *maps = NULL;
    kvt_verbs_hs_t hs;
    verbs_peer_t *p;
    kvt_status_t st;
    void *buf = NULL;
    size_t n = 0;
    uint32_t i = 0;

    if (peer_id == NULL || peer_id[0] == '\0' || strlen(peer_id) > KVT_TL_PEER_ID_MAX ||
        blob == NULL || len == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&tl->lock);
    st = ensure_dev(tl, tl->regions != NULL ? kvt_verbs_numa_of(tl->regions->base) : -1);
    if (st != KVT_OK)
        goto err_unlock;
    /* Every QP may have max_wr completions pending on the one CQ. */
    if ((uint64_t)(peer_count(tl) + 1) * tl->cfg.qps_per_peer * tl->cfg.max_wr > tl->dev->cq_size) {
        kvt_verbs_log("peer %s: too many peers for one completion queue", peer_id);
        st = KVT_ERR_LIMIT;
        goto err_unlock;
    }
    p = peer_find(tl, peer_id);
    if (p == NULL) {
        p = kvt_calloc(1, sizeof(*p));
        if (p == NULL) {
            st = KVT_ERR_NOMEM;
            goto err_unlock;
        }
        snprintf(p->id, sizeof(p->id), "%s", peer_id);
        p->next = tl->peers;
        tl->peers = p;
    }
    st = kvt_verbs_conn_create(tl->dev, peer_id, &tl->cfg, &c);
    if (st != KVT_OK)
        goto err_unlock;
    memset(&hs, 0, sizeof(hs));
    snprintf(hs.id, sizeof(hs.id), "%s", tl->local_id);
    hs.epoch = tl->epoch;
    hs.port = tl->dev->port;
    hs.nqps = c->nqps;
    memcpy(hs.qps, c->local_qp, sizeof(hs.qps));
    if (tl->nregions > 0) {
        maps = kvt_calloc(tl->nregions, sizeof(*maps));
        if (maps == NULL) {
            st = KVT_ERR_NOMEM;
            goto err_conn;
        }
        for (kvt_tl_region_t *r = tl->regions; r != NULL; r = r->next)
            maps[i++] = r->rmap; /* shallow: the keys stay the region's */
    }
    hs.regions = maps;
    hs.nregions = i;
    st = kvt_verbs_hs_encode(&hs, &buf, &n);
    kvt_free(maps);
    if (st != KVT_OK)
        goto err_conn;
    if (n > *len) {
        kvt_verbs_log("peer %s: handshake of %zu bytes exceeds %zu (too many regions)", peer_id, n,
                      *len);
        st = KVT_ERR_LIMIT;
        goto err_buf;
    }
    memcpy(blob, buf, n);
    *len = n;
    kvt_free(buf);
    old_pending = p->pending;
    p->pending = c;
    pthread_mutex_unlock(&tl->lock);
    if (old_pending != NULL)
        kvt_verbs_conn_put(old_pending);
    return KVT_OK;

err_buf:
    kvt_free(buf);
err_conn:
    pthread_mutex_unlock(&tl->lock);
    kvt_verbs_conn_put(c);
    return st;
err_unlock:
    pthread_mutex_unlock(&tl->lock);
    return st;
}

static kvt_status_t verbs_peer_connect(kvt_tl_t *tl, const char *peer_id, const void *blob,
                                       size_t len)
{
    kvt_verbs_report_t r = {0};
    kvt_verbs_conn_t *c, *old;
    kvt_verbs_hs_t hs;
    verbs_peer_t *p;
    kvt_status_t st;
    uint32_t nqps;
    char rid[KVT_VERBS_ID_MAX + 1];

    if (peer_id == NULL || blob == NULL)
        return KVT_ERR_INVALID;
    st = kvt_verbs_hs_decode(blob, len, &hs);
    if (st != KVT_OK) {
        stat_add(&tl->stats.bad_frames, 1);
        kvt_verbs_log("peer %s: bad handshake (%s)", peer_id, kvt_strerror(st));
        return st;
    }
    pthread_mutex_lock(&tl->lock);
    p = peer_find(tl, peer_id);
    if (p == NULL || p->pending == NULL) {
        pthread_mutex_unlock(&tl->lock);
        kvt_verbs_hs_clear(&hs);
        return KVT_ERR_STATE;
    }
    c = p->pending;
    p->pending = NULL;
    pthread_mutex_unlock(&tl->lock);

    st = kvt_verbs_conn_connect(c, &hs);
    if (st != KVT_OK) {
        kvt_verbs_hs_clear(&hs);
        kvt_verbs_conn_put(c);
        return st;
    }
    nqps = c->nqps;
    snprintf(rid, sizeof(rid), "%s", c->remote.id);
    pthread_mutex_lock(&tl->lock);
    p = peer_find(tl, peer_id); /* the entry may have been removed meanwhile */
    if (p == NULL) {
        pthread_mutex_unlock(&tl->lock);
        kvt_verbs_conn_put(c);
        return KVT_ERR_STATE;
    }
    old = p->active;
    p->active = c;
    if (old != NULL && p->remote_epoch != 0 && p->remote_epoch != c->remote.epoch)
        kvt_verbs_log("peer %s restarted: rebuilding its connection", peer_id);
    p->remote_epoch = c->remote.epoch;
    pthread_mutex_unlock(&tl->lock);
    kvt_verbs_log("peer %s (%s) connected over %u QP(s)%s", peer_id, rid, nqps,
                  old != NULL ? ", replacing the previous connection" : "");
    if (old != NULL) {
        kvt_verbs_conn_retire(old, &r);
        defer(tl, peer_id, &r);
        kvt_verbs_conn_put(old);
    }
    return KVT_OK;
}

static void verbs_peer_remove(kvt_tl_t *tl, const char *peer_id)
{
    kvt_verbs_report_t r = {0};
    verbs_peer_t **pp, *p = NULL;

    if (peer_id == NULL)
        return;
    pthread_mutex_lock(&tl->lock);
    for (pp = &tl->peers; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, peer_id) == 0) {
            p = *pp;
            *pp = p->next;
            break;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    if (p == NULL)
        return;
    if (p->active != NULL) {
        kvt_verbs_conn_retire(p->active, &r);
        defer(tl, peer_id, &r);
        kvt_verbs_conn_put(p->active);
    }
    if (p->pending != NULL)
        kvt_verbs_conn_put(p->pending);
    kvt_free(p);
}

static kvt_status_t verbs_post(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
                               const kvt_tl_xfer_t *xfers, size_t n, uint64_t cookie)
{
    kvt_verbs_report_t r = {0};
    kvt_verbs_conn_t *c = NULL;
    kvt_verbs_seg_t *segs;
    verbs_peer_t *p;
    kvt_status_t st = KVT_OK;

    if (peer_id == NULL || xfers == NULL || n == 0 ||
        (op != KVT_TL_OP_WRITE && op != KVT_TL_OP_READ))
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&tl->lock);
    p = peer_find(tl, peer_id);
    if (p != NULL && p->active != NULL) {
        c = p->active;
        kvt_verbs_conn_get(c);
    }
    pthread_mutex_unlock(&tl->lock);
    if (c == NULL)
        return KVT_ERR_NOT_FOUND; /* no handshake yet: the engine runs it first */
    segs = kvt_calloc(n, sizeof(*segs));
    if (segs == NULL) {
        kvt_verbs_conn_put(c);
        return KVT_ERR_NOMEM;
    }
    for (size_t i = 0; i < n && st == KVT_OK; i++) {
        const kvt_tl_xfer_t *x = &xfers[i];
        const kvt_verbs_mr_map_t *rm;

        if (x->local == NULL || x->length == 0) {
            st = KVT_ERR_INVALID;
            break;
        }
        rm = kvt_verbs_hs_region(&c->remote, x->remote_uuid);
        if (rm == NULL) {
            st = KVT_ERR_NOT_FOUND; /* region unknown to the last handshake */
            break;
        }
        if (x->local_offset > x->local->length || x->length > x->local->length - x->local_offset ||
            x->remote_offset > rm->len || x->length > rm->len - x->remote_offset) {
            st = KVT_ERR_BOUNDS;
            break;
        }
        segs[i].laddr = x->local->lmap.base + x->local_offset;
        segs[i].raddr = rm->base + x->remote_offset;
        segs[i].len = x->length;
        segs[i].lmap = &x->local->lmap;
        segs[i].rmap = rm;
    }
    if (st == KVT_OK)
        st = kvt_verbs_conn_post(c, segs, n, op, cookie, n, &r);
    kvt_free(segs);
    defer(tl, peer_id, &r);
    kvt_verbs_conn_put(c);
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
            deliver(tl, p->id, &r);
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
            deliver(tl, p->id, &r);
            kvt_verbs_conn_put(p->active);
        }
        if (p->pending != NULL)
            kvt_verbs_conn_put(p->pending);
        kvt_free(p);
    }
    while (tl->regions != NULL) {
        kvt_tl_region_t *r = tl->regions;

        tl->regions = r->next;
        region_free(r);
    }
    kvt_verbs_dev_close(tl->dev);
    pthread_mutex_destroy(&tl->lock);
    kvt_free(tl);
}

static const kvt_tl_ops_t kvt_tl_verbs_ops = {
    .create = verbs_create,
    .destroy = verbs_destroy,
    .reg_region = verbs_reg_region,
    .dereg_region = verbs_dereg_region,
    .peer_prepare = verbs_peer_prepare,
    .peer_connect = verbs_peer_connect,
    .peer_remove = verbs_peer_remove,
    /* One-sided RDMA: the target's CPU never sees an access, so there is
     * nothing to check per page; the NIC enforces region bounds through the MR
     * keys. */
    .grant = NULL,
    .revoke = NULL,
    .post = verbs_post,
    .stats = verbs_stats,
};

const kvt_transport_desc_t kvt_tl_verbs_desc = {
    .name = "verbs",
    .ops = &kvt_tl_verbs_ops,
};

KVT_TRANSPORT_REGISTER(verbs, &kvt_tl_verbs_desc)
