/*
 * The peer table of a verbs transport instance: the two halves of the handshake (prepare creates
 * the peer's QPs and the blob, connect pairs them with the peer's QPs), renaming a peer prepared
 * under its address once its node id is known, removing a peer, and posting transfers to it.
 * One active connection per peer; a new handshake replaces it (peer restart, rebuild after the
 * connection failed).
 */
#include <stdio.h>
#include <string.h>

#include "kvt_verbs_tl_int.h"

verbs_peer_t *kvt_verbs_peer_find(kvt_tl_t *tl, const char *id)
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

kvt_status_t kvt_verbs_peer_prepare(kvt_tl_t *tl, const char *peer_id, void *blob, size_t *len)
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
    st = kvt_verbs_tl_ensure_dev(tl,
                                 tl->regions != NULL ? kvt_verbs_numa_of(tl->regions->base) : -1);
    if (st != KVT_OK)
        goto err_unlock;
    /* Every QP may have max_wr completions pending on the one CQ. */
    if ((uint64_t)(peer_count(tl) + 1) * tl->cfg.qps_per_peer * tl->cfg.max_wr > tl->dev->cq_size) {
        kvt_verbs_log("peer %s: too many peers for one completion queue", peer_id);
        st = KVT_ERR_LIMIT;
        goto err_unlock;
    }
    p = kvt_verbs_peer_find(tl, peer_id);
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

kvt_status_t kvt_verbs_peer_connect(kvt_tl_t *tl, const char *peer_id, const void *blob, size_t len)
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
    if (st == KVT_ERR_NOMEM)
        return st;
    if (st != KVT_OK) {
        kvt_verbs_conn_t *half = NULL;

        kvt_verbs_tl_stat_add(&tl->stats.bad_frames, 1);
        kvt_verbs_log("peer %s: bad handshake (%s)", peer_id, kvt_strerror(st));
        /* The QPs prepared for this handshake go with it: kept, every bad handshake under a
         * new node id would hold QPs and completion-queue room for good (the verbs side of
         * a lane that never sends its HELLO), until no peer could connect any more. */
        pthread_mutex_lock(&tl->lock);
        p = kvt_verbs_peer_find(tl, peer_id);
        if (p != NULL) {
            half = p->pending;
            p->pending = NULL;
        }
        pthread_mutex_unlock(&tl->lock);
        if (half != NULL)
            kvt_verbs_conn_put(half);
        return st;
    }
    pthread_mutex_lock(&tl->lock);
    p = kvt_verbs_peer_find(tl, peer_id);
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
    p = kvt_verbs_peer_find(tl, peer_id); /* the entry may have been removed meanwhile */
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
        kvt_verbs_tl_defer(tl, peer_id, &r);
        kvt_verbs_conn_put(old);
    }
    return KVT_OK;
}

/* The peer prepared as <old_id> turns out to be <new_id> (its node id, learnt from the
 * handshake reply): move the prepared QPs there so peer_connect(<new_id>) pairs them. */
kvt_status_t kvt_verbs_peer_rename(kvt_tl_t *tl, const char *old_id, const char *new_id)
{
    kvt_verbs_conn_t *drop_pending = NULL, *drop_active = NULL;
    kvt_verbs_report_t r = {0};
    verbs_peer_t **pp, *old = NULL, *dst;

    if (old_id == NULL || new_id == NULL || new_id[0] == '\0' ||
        strlen(new_id) > KVT_TL_PEER_ID_MAX)
        return KVT_ERR_INVALID;
    if (strcmp(old_id, new_id) == 0)
        return KVT_OK;
    pthread_mutex_lock(&tl->lock);
    for (pp = &tl->peers; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, old_id) == 0) {
            old = *pp;
            *pp = old->next;
            break;
        }
    }
    if (old == NULL) {
        pthread_mutex_unlock(&tl->lock);
        return KVT_ERR_NOT_FOUND;
    }
    dst = kvt_verbs_peer_find(tl, new_id);
    if (dst == NULL) {
        /* reuse the entry; a connection it may hold keeps running under the old name */
        snprintf(old->id, sizeof(old->id), "%s", new_id);
        old->next = tl->peers;
        tl->peers = old;
        if (old->pending != NULL)
            snprintf(old->pending->peer_id, sizeof(old->pending->peer_id), "%s", new_id);
        pthread_mutex_unlock(&tl->lock);
        return KVT_OK;
    }
    drop_pending = dst->pending;
    dst->pending = old->pending;
    if (dst->pending != NULL)
        snprintf(dst->pending->peer_id, sizeof(dst->pending->peer_id), "%s", new_id);
    drop_active = old->active;
    pthread_mutex_unlock(&tl->lock);
    if (drop_pending != NULL)
        kvt_verbs_conn_put(drop_pending);
    if (drop_active != NULL) {
        kvt_verbs_conn_retire(drop_active, &r);
        kvt_verbs_tl_defer(tl, old_id, &r);
        kvt_verbs_conn_put(drop_active);
    }
    kvt_free(old);
    return KVT_OK;
}

void kvt_verbs_peer_remove(kvt_tl_t *tl, const char *peer_id)
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
        kvt_verbs_tl_defer(tl, peer_id, &r);
        kvt_verbs_conn_put(p->active);
    }
    if (p->pending != NULL)
        kvt_verbs_conn_put(p->pending);
    kvt_free(p);
}

kvt_status_t kvt_verbs_post(kvt_tl_t *tl, const char *peer_id, kvt_tl_op_t op,
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
    p = kvt_verbs_peer_find(tl, peer_id);
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
    kvt_verbs_tl_defer(tl, peer_id, &r);
    kvt_verbs_conn_put(c);
    return st;
}
