/*
 * kvt_reserve.c -- receiver capacity reservations (ReserveRequest): grant
 * against unreserved free pages, draw on allocation, release on completion /
 * cancel / TTL.
 */
#include "kvt/kvt_reserve.h"
#include "kvt_strmap_int.h"

#include <pthread.h>
#include <string.h>

typedef struct reservation {
    uint32_t remaining;
    uint64_t ttl_ns;
    uint64_t deadline_ns;
} reservation_t;

struct kvt_reserve {
    pthread_mutex_t lock;
    kvt_pool_t *pool;
    kvt_clock_t clock;
    uint64_t default_ttl_ns;
    kvt_strmap_t map; /* req_id -> reservation_t* */
    uint64_t reserved;
    uint64_t granted_total;
    uint64_t refused_total;
    uint64_t expired_total;
    uint64_t released_total;
};

kvt_status_t kvt_reserve_create(kvt_pool_t *pool, uint64_t default_ttl_ms, const kvt_clock_t *clock,
                                kvt_reserve_t **out)
{
    kvt_reserve_t *t;

    if (pool == NULL || out == NULL || default_ttl_ms == 0)
        return KVT_ERR_INVALID;
    t = kvt_calloc(1, sizeof(*t));
    if (t == NULL)
        return KVT_ERR_NOMEM;
    if (kvt_strmap_init(&t->map) != KVT_OK) {
        kvt_free(t);
        return KVT_ERR_NOMEM;
    }
    t->pool = pool;
    if (clock != NULL)
        t->clock = *clock;
    t->default_ttl_ns = default_ttl_ms * KVT_NSEC_PER_MSEC;
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return KVT_OK;
}

void kvt_reserve_destroy(kvt_reserve_t *t)
{
    if (t == NULL)
        return;
    kvt_strmap_fini(&t->map, kvt_free);
    pthread_mutex_destroy(&t->lock);
    kvt_free(t);
}

struct sweep_ctx {
    kvt_reserve_t *t;
    uint64_t now;
    uint32_t n;
};

static int sweep_cb(void *arg, const char *key, void *val)
{
    struct sweep_ctx *c = arg;
    reservation_t *r = val;

    if (r->deadline_ns > c->now)
        return 0;
    c->t->reserved -= r->remaining;
    kvt_free(r);
    c->n++;
    return 1;
}

/* Lock held. */
static uint32_t sweep_locked(kvt_reserve_t *t, uint64_t now)
{
    struct sweep_ctx c = {t, now, 0};
    kvt_strmap_filter(&t->map, sweep_cb, &c);
    t->expired_total += c.n;
    return c.n;
}

static uint32_t pool_free_pages(kvt_pool_t *pool)
{
    kvt_pool_stats_t st;
    kvt_pool_stats(pool, &st);
    return st.free_pages;
}

static int64_t free_chunks_locked(kvt_reserve_t *t)
{
    uint64_t f = pool_free_pages(t->pool);
    return f > t->reserved ? (int64_t)(f - t->reserved) : 0;
}

kvt_status_t kvt_reserve_request(kvt_reserve_t *t, const char *req_id, int64_t total_chunks,
                                 int64_t ttl_ms, int *granted_out, int64_t *free_chunks_out)
{
    reservation_t *r;
    uint64_t now, ttl_ns, extra;
    int64_t unreserved;
    int granted = 0;

    if (t == NULL || req_id == NULL || req_id[0] == '\0' || total_chunks < 0 || granted_out == NULL)
        return KVT_ERR_INVALID;
    now = kvt_clock_now(&t->clock);
    ttl_ns = ttl_ms > 0 ? (uint64_t)ttl_ms * KVT_NSEC_PER_MSEC : t->default_ttl_ns;

    pthread_mutex_lock(&t->lock);
    sweep_locked(t, now);
    unreserved = free_chunks_locked(t);
    r = kvt_strmap_get(&t->map, req_id);
    if ((uint64_t)total_chunks > kvt_pool_total_pages(t->pool)) {
        granted = 0; /* can never fit: refuse at once */
    } else if (r != NULL) {
        extra = (uint64_t)total_chunks > r->remaining ? (uint64_t)total_chunks - r->remaining : 0;
        if (extra <= (uint64_t)unreserved) {
            r->remaining += (uint32_t)extra;
            t->reserved += extra;
            r->ttl_ns = ttl_ns;
            r->deadline_ns = now + ttl_ns;
            granted = 1;
        }
    } else if ((uint64_t)total_chunks <= (uint64_t)unreserved &&
               t->map.count < KVT_RESERVE_MAX_ENTRIES) {
        r = kvt_malloc(sizeof(*r));
        if (r != NULL) {
            r->remaining = (uint32_t)total_chunks;
            r->ttl_ns = ttl_ns;
            r->deadline_ns = now + ttl_ns;
            if (kvt_strmap_put(&t->map, req_id, r) == KVT_OK) {
                t->reserved += r->remaining;
                granted = 1;
            } else {
                kvt_free(r);
            }
        }
    }
    if (granted)
        t->granted_total++;
    else
        t->refused_total++;
    if (free_chunks_out != NULL)
        *free_chunks_out = free_chunks_locked(t);
    pthread_mutex_unlock(&t->lock);
    *granted_out = granted;
    return KVT_OK;
}

kvt_status_t kvt_reserve_alloc(kvt_reserve_t *t, const char *req_id, uint32_t n, unsigned flags,
                               kvt_page_t *pages_out, uint8_t *failed_bitmap, uint32_t *nalloc_out)
{
    reservation_t *r = NULL;
    uint32_t own, got = 0, drawn;
    uint64_t keep, now;
    kvt_status_t status;

    if (t == NULL)
        return KVT_ERR_INVALID;
    now = kvt_clock_now(&t->clock);
    pthread_mutex_lock(&t->lock);
    sweep_locked(t, now);
    if (req_id != NULL && req_id[0] != '\0')
        r = kvt_strmap_get(&t->map, req_id);
    own = r != NULL ? r->remaining : 0;
    keep = t->reserved - own;
    if (keep > UINT32_MAX)
        keep = UINT32_MAX;
    status = kvt_pool_alloc_keep(t->pool, n, (uint32_t)keep, flags, pages_out, failed_bitmap, &got);
    if (status == KVT_OK && r != NULL) {
        drawn = got < own ? got : own;
        r->remaining -= drawn;
        t->reserved -= drawn;
        r->deadline_ns = now + r->ttl_ns;
    }
    pthread_mutex_unlock(&t->lock);
    if (status == KVT_OK && nalloc_out != NULL)
        *nalloc_out = got;
    return status;
}

kvt_status_t kvt_reserve_release(kvt_reserve_t *t, const char *req_id)
{
    reservation_t *r;

    if (t == NULL || req_id == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&t->lock);
    r = kvt_strmap_remove(&t->map, req_id);
    if (r != NULL) {
        t->reserved -= r->remaining;
        t->released_total++;
    }
    pthread_mutex_unlock(&t->lock);
    if (r == NULL)
        return KVT_ERR_NOT_FOUND;
    kvt_free(r);
    return KVT_OK;
}

kvt_status_t kvt_reserve_sweep(kvt_reserve_t *t, uint32_t *nexpired_out)
{
    uint32_t n;

    if (t == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&t->lock);
    n = sweep_locked(t, kvt_clock_now(&t->clock));
    pthread_mutex_unlock(&t->lock);
    if (nexpired_out != NULL)
        *nexpired_out = n;
    return KVT_OK;
}

static int min_deadline_cb(void *arg, const char *key, void *val)
{
    uint64_t *next = arg;
    const reservation_t *r = val;

    (void)key;
    if (r->deadline_ns < *next)
        *next = r->deadline_ns;
    return 0; /* keep */
}

uint64_t kvt_reserve_next_deadline(kvt_reserve_t *t)
{
    uint64_t next = UINT64_MAX;

    if (t == NULL)
        return next;
    pthread_mutex_lock(&t->lock);
    kvt_strmap_filter(&t->map, min_deadline_cb, &next);
    pthread_mutex_unlock(&t->lock);
    return next;
}

int64_t kvt_reserve_free_chunks(kvt_reserve_t *t)
{
    int64_t f;

    pthread_mutex_lock(&t->lock);
    sweep_locked(t, kvt_clock_now(&t->clock));
    f = free_chunks_locked(t);
    pthread_mutex_unlock(&t->lock);
    return f;
}

kvt_status_t kvt_reserve_remaining(kvt_reserve_t *t, const char *req_id, uint32_t *remaining_out)
{
    reservation_t *r;
    kvt_status_t status = KVT_ERR_NOT_FOUND;

    if (t == NULL || req_id == NULL || remaining_out == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&t->lock);
    r = kvt_strmap_get(&t->map, req_id);
    if (r != NULL) {
        *remaining_out = r->remaining;
        status = KVT_OK;
    }
    pthread_mutex_unlock(&t->lock);
    return status;
}

void kvt_reserve_stats(kvt_reserve_t *t, kvt_reserve_stats_t *out)
{
    pthread_mutex_lock(&t->lock);
    out->entries = (uint32_t)t->map.count;
    out->reserved_pages = t->reserved;
    out->granted_total = t->granted_total;
    out->refused_total = t->refused_total;
    out->expired_total = t->expired_total;
    out->released_total = t->released_total;
    pthread_mutex_unlock(&t->lock);
}
