/*
 * kvt_pending.c -- sender-side pull-pending table: done signals (also early
 * ones), TTL sweep of dead receivers' pulls, cancel by request, and the
 * pinned-page backpressure check.
 */
#include "kvt/kvt_pending.h"
#include "kvt_strmap_int.h"

#include <pthread.h>
#include <string.h>

/* Early done records, also kept in arrival order: deadlines grow with
 * arrival, so the head is always the oldest (O(1) expiry and eviction). */
typedef struct early_rec {
    uint64_t deadline_ns;
    struct early_rec *prev, *next;
    char key[]; /* pull_id */
} early_rec_t;

/* A pending pull: the entry handed out (first member, so a node pointer is an
 * entry pointer) plus arrival-order links. Deadlines grow with arrival, so
 * the list head is always the next to expire. */
typedef struct pend_node {
    kvt_pending_entry_t e;
    struct pend_node *prev, *next;
} pend_node_t;

struct kvt_pending {
    pthread_mutex_t lock;
    kvt_clock_t clock;
    uint64_t ttl_ns;
    kvt_strmap_t entries; /* pull_id -> pend_node_t* */
    pend_node_t *head, *tail;
    kvt_strmap_t early; /* pull_id -> early_rec_t* */
    early_rec_t *early_head, *early_tail;
    uint64_t pages;
    uint64_t done_total;
    uint64_t expired_total;
    uint64_t cancelled_total;
    uint64_t early_total;
    uint64_t early_dropped_total;
};

static void early_link(kvt_pending_t *t, early_rec_t *r)
{
    r->next = NULL;
    r->prev = t->early_tail;
    if (t->early_tail != NULL)
        t->early_tail->next = r;
    else
        t->early_head = r;
    t->early_tail = r;
}

static void early_unlink(kvt_pending_t *t, early_rec_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        t->early_head = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        t->early_tail = r->prev;
}

/* Remove and free record <r> (lock held). */
static void early_drop(kvt_pending_t *t, early_rec_t *r)
{
    early_unlink(t, r);
    kvt_strmap_remove(&t->early, r->key);
    kvt_free(r);
}

/* Drop expired records from the head (lock held); returns how many. */
static uint64_t early_expire(kvt_pending_t *t, uint64_t now)
{
    uint64_t n = 0;
    while (t->early_head != NULL && t->early_head->deadline_ns <= now) {
        early_drop(t, t->early_head);
        n++;
    }
    return n;
}

kvt_status_t kvt_pending_create(double ttl_s, const kvt_clock_t *clock, kvt_pending_t **out)
{
    kvt_pending_t *t;

    if (out == NULL || ttl_s < 0.0 || ttl_s != ttl_s)
        return KVT_ERR_INVALID;
    t = kvt_calloc(1, sizeof(*t));
    if (t == NULL)
        return KVT_ERR_NOMEM;
    if (kvt_strmap_init(&t->entries) != KVT_OK)
        goto err_t;
    if (kvt_strmap_init(&t->early) != KVT_OK)
        goto err_entries;
    if (clock != NULL)
        t->clock = *clock;
    t->ttl_ns = kvt_sec_to_ns(ttl_s);
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return KVT_OK;

err_entries:
    kvt_strmap_fini(&t->entries, NULL);
err_t:
    kvt_free(t);
    return KVT_ERR_NOMEM;
}

void kvt_pending_entry_clear(kvt_pending_entry_t *e)
{
    if (e == NULL)
        return;
    kvt_free(e->pull_id);
    kvt_free(e->req_id);
    kvt_free(e->pages);
    memset(e, 0, sizeof(*e));
}

static void entry_free(void *val)
{
    kvt_pending_entry_clear(val);
    kvt_free(val); /* the whole pend_node_t */
}

static void node_link(kvt_pending_t *t, pend_node_t *n)
{
    n->next = NULL;
    n->prev = t->tail;
    if (t->tail != NULL)
        t->tail->next = n;
    else
        t->head = n;
    t->tail = n;
}

static void node_unlink(kvt_pending_t *t, pend_node_t *n)
{
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        t->head = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        t->tail = n->prev;
    n->prev = n->next = NULL;
}

void kvt_pending_destroy(kvt_pending_t *t)
{
    if (t == NULL)
        return;
    kvt_strmap_fini(&t->entries, entry_free);
    kvt_strmap_fini(&t->early, kvt_free); /* frees every record once */
    pthread_mutex_destroy(&t->lock);
    kvt_free(t);
}

kvt_status_t kvt_pending_entry_release(kvt_pending_entry_t *e)
{
    if (e == NULL)
        return KVT_ERR_INVALID;
    if (e->pool == NULL || e->npages == 0)
        return KVT_OK;
    return kvt_pool_unpin(e->pool, e->pages, e->npages);
}

kvt_status_t kvt_pending_add(kvt_pending_t *t, const char *pull_id, const char *req_id,
                             kvt_pool_t *pool, const kvt_page_t *pages, uint32_t npages, void *user,
                             int *already_done_out)
{
    pend_node_t *node;
    kvt_pending_entry_t *e;
    early_rec_t *early;
    uint64_t now;
    kvt_status_t status;

    if (t == NULL || pull_id == NULL || already_done_out == NULL || (npages > 0 && pages == NULL))
        return KVT_ERR_INVALID;

    node = kvt_calloc(1, sizeof(*node));
    if (node == NULL)
        return KVT_ERR_NOMEM;
    e = &node->e;
    e->pull_id = kvt_strdup(pull_id);
    e->req_id = kvt_strdup(req_id != NULL ? req_id : "");
    e->pages = npages > 0 ? kvt_malloc((size_t)npages * sizeof(*pages)) : NULL;
    if (e->pull_id == NULL || e->req_id == NULL || (npages > 0 && e->pages == NULL)) {
        entry_free(e);
        return KVT_ERR_NOMEM;
    }
    if (npages > 0)
        memcpy(e->pages, pages, (size_t)npages * sizeof(*pages));
    e->npages = npages;
    e->pool = pool;
    e->user = user;

    pthread_mutex_lock(&t->lock);
    /* time read under the lock keeps deadlines in list order */
    now = kvt_clock_now(&t->clock);
    e->added_ns = now;
    e->deadline_ns = now + t->ttl_ns;
    early = kvt_strmap_get(&t->early, pull_id);
    if (early != NULL) {
        /* the receiver finished before we registered: release right away */
        early_drop(t, early);
        t->done_total++;
        pthread_mutex_unlock(&t->lock);
        entry_free(e);
        *already_done_out = 1;
        return KVT_OK;
    }
    status = kvt_strmap_put(&t->entries, pull_id, node);
    if (status == KVT_OK) {
        node_link(t, node);
        t->pages += npages;
    }
    pthread_mutex_unlock(&t->lock);
    if (status != KVT_OK) {
        entry_free(e);
        return status;
    }
    *already_done_out = 0;
    return KVT_OK;
}

/* Remember an early done signal (lock held). Bounded: expired records go
 * first, then the oldest ones. */
static void early_remember(kvt_pending_t *t, const char *pull_id, uint64_t now)
{
    early_rec_t *r = kvt_strmap_get(&t->early, pull_id);
    size_t len;

    if (r != NULL) {
        /* repeated signal: renew and move to the tail to keep arrival order */
        early_unlink(t, r);
        r->deadline_ns = now + t->ttl_ns;
        early_link(t, r);
        return;
    }
    if (t->early.count >= KVT_PENDING_MAX_EARLY) {
        t->early_dropped_total += early_expire(t, now);
        while (t->early.count >= KVT_PENDING_MAX_EARLY && t->early_head != NULL) {
            early_drop(t, t->early_head);
            t->early_dropped_total++;
        }
    }
    len = strlen(pull_id);
    r = kvt_malloc(sizeof(*r) + len + 1);
    if (r == NULL) {
        t->early_dropped_total++;
        return;
    }
    memcpy(r->key, pull_id, len + 1);
    r->deadline_ns = now + t->ttl_ns;
    if (kvt_strmap_put(&t->early, pull_id, r) != KVT_OK) {
        kvt_free(r);
        t->early_dropped_total++;
        return;
    }
    early_link(t, r);
    t->early_total++;
}

kvt_status_t kvt_pending_done(kvt_pending_t *t, const char *pull_id, kvt_pending_entry_t *out)
{
    pend_node_t *n;

    if (t == NULL || pull_id == NULL || out == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&t->lock);
    n = kvt_strmap_remove(&t->entries, pull_id);
    if (n == NULL) {
        early_remember(t, pull_id, kvt_clock_now(&t->clock));
        pthread_mutex_unlock(&t->lock);
        return KVT_ERR_NOT_FOUND;
    }
    node_unlink(t, n);
    t->pages -= n->e.npages;
    t->done_total++;
    pthread_mutex_unlock(&t->lock);
    *out = n->e;
    kvt_free(n);
    return KVT_OK;
}

/* Collected entries, handed to the callback after the lock is dropped. */
struct collect {
    kvt_pending_t *t;
    uint64_t now;
    const char *req_id; /* cancel: match; sweep: NULL */
    int all;            /* drain */
    kvt_pending_entry_t **v;
    uint32_t n, cap;
    int nomem;
};

/* Append <e> to the collection; 0 on no memory (entry stays in the table). */
static int collect_push(struct collect *c, kvt_pending_entry_t *e)
{
    if (c->n == c->cap) {
        uint32_t ncap = c->cap ? c->cap * 2 : 16;
        kvt_pending_entry_t **nv = kvt_realloc(c->v, (size_t)ncap * sizeof(*nv));
        if (nv == NULL) {
            c->nomem = 1; /* leave it in the table; the next call gets it */
            return 0;
        }
        c->v = nv;
        c->cap = ncap;
    }
    c->v[c->n++] = e;
    return 1;
}

/* strmap filter for cancel (req_id match) and drain (all); lock held. */
static int collect_cb(void *arg, const char *key, void *val)
{
    struct collect *c = arg;
    pend_node_t *n = val;

    if (!c->all && strcmp(n->e.req_id, c->req_id) != 0)
        return 0;
    if (!collect_push(c, &n->e))
        return 0;
    node_unlink(c->t, n);
    return 1;
}

static void deliver(struct collect *c, kvt_pending_cb cb, void *arg)
{
    for (uint32_t i = 0; i < c->n; i++) {
        if (cb != NULL)
            cb(arg, c->v[i]);
        else
            kvt_pending_entry_release(c->v[i]);
        entry_free(c->v[i]);
    }
    kvt_free(c->v);
}

static uint64_t collected_pages(const struct collect *c)
{
    uint64_t p = 0;
    for (uint32_t i = 0; i < c->n; i++)
        p += c->v[i]->npages;
    return p;
}

kvt_status_t kvt_pending_sweep(kvt_pending_t *t, kvt_pending_cb cb, void *arg,
                               uint32_t *nexpired_out)
{
    struct collect c = {0};

    if (t == NULL)
        return KVT_ERR_INVALID;
    c.t = t;
    pthread_mutex_lock(&t->lock);
    c.now = kvt_clock_now(&t->clock);
    /* expired pulls are at the head of the arrival list */
    while (t->head != NULL && t->head->e.deadline_ns <= c.now) {
        pend_node_t *n = t->head;
        if (!collect_push(&c, &n->e))
            break;
        node_unlink(t, n);
        kvt_strmap_remove(&t->entries, n->e.pull_id);
    }
    t->early_dropped_total += early_expire(t, c.now);
    t->expired_total += c.n;
    t->pages -= collected_pages(&c);
    pthread_mutex_unlock(&t->lock);
    if (nexpired_out != NULL)
        *nexpired_out = c.n;
    deliver(&c, cb, arg);
    return c.nomem ? KVT_ERR_NOMEM : KVT_OK;
}

kvt_status_t kvt_pending_cancel(kvt_pending_t *t, const char *req_id, kvt_pending_cb cb, void *arg,
                                uint32_t *ncancelled_out)
{
    struct collect c = {0};

    if (t == NULL || req_id == NULL)
        return KVT_ERR_INVALID;
    c.t = t;
    c.req_id = req_id;
    pthread_mutex_lock(&t->lock);
    kvt_strmap_filter(&t->entries, collect_cb, &c);
    t->cancelled_total += c.n;
    t->pages -= collected_pages(&c);
    pthread_mutex_unlock(&t->lock);
    if (ncancelled_out != NULL)
        *ncancelled_out = c.n;
    deliver(&c, cb, arg);
    return c.nomem ? KVT_ERR_NOMEM : KVT_OK;
}

void kvt_pending_drain(kvt_pending_t *t, kvt_pending_cb cb, void *arg)
{
    struct collect c = {0};

    if (t == NULL)
        return;
    c.t = t;
    c.all = 1;
    pthread_mutex_lock(&t->lock);
    kvt_strmap_filter(&t->entries, collect_cb, &c);
    t->pages -= collected_pages(&c);
    pthread_mutex_unlock(&t->lock);
    deliver(&c, cb, arg);
}

uint64_t kvt_pending_next_deadline(kvt_pending_t *t)
{
    uint64_t m;

    pthread_mutex_lock(&t->lock);
    m = t->head != NULL ? t->head->e.deadline_ns : UINT64_MAX;
    pthread_mutex_unlock(&t->lock);
    return m;
}

void kvt_pending_stats(kvt_pending_t *t, kvt_pending_stats_t *out)
{
    pthread_mutex_lock(&t->lock);
    out->entries = (uint32_t)t->entries.count;
    out->pages = t->pages;
    out->early = (uint32_t)t->early.count;
    out->done_total = t->done_total;
    out->expired_total = t->expired_total;
    out->cancelled_total = t->cancelled_total;
    out->early_total = t->early_total;
    out->early_dropped_total = t->early_dropped_total;
    pthread_mutex_unlock(&t->lock);
}

/* ---- backpressure ----------------------------------------------------------- */

uint32_t kvt_backpressure_hwm(uint32_t total_pages, double reserve_pct)
{
    double frac;

    if (!(reserve_pct > 0.0)) /* also NaN */
        return total_pages;
    if (reserve_pct >= 100.0)
        return 0;
    frac = 1.0 - reserve_pct / 100.0;
    return (uint32_t)((double)total_pages * frac);
}

kvt_status_t kvt_backpressure_check(uint32_t pinned_pages, uint32_t total_pages, double reserve_pct,
                                    uint32_t n_new)
{
    uint32_t hwm = kvt_backpressure_hwm(total_pages, reserve_pct);

    if ((uint64_t)pinned_pages + n_new <= hwm)
        return KVT_OK;
    if (pinned_pages == 0)
        return KVT_OK; /* alone above the mark: admit, or it could never run */
    return KVT_ERR_BACKPRESSURE;
}

kvt_status_t kvt_backpressure_check_pool(kvt_pool_t *pool, double reserve_pct, uint32_t n_new)
{
    kvt_pool_stats_t st;

    if (pool == NULL)
        return KVT_ERR_INVALID;
    kvt_pool_stats(pool, &st);
    return kvt_backpressure_check(st.pinned_pages, st.total_pages, reserve_pct, n_new);
}
