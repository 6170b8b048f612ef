/*
 * kvt_breaker.c -- per-peer circuit breaker: a peer that failed an
 * allocation is skipped until its backoff TTL passes.
 */
#include "kvt/kvt_breaker.h"
#include "kvt_strmap_int.h"

#include <pthread.h>

typedef struct breaker_entry {
    uint64_t until_ns;
} breaker_entry_t;

struct kvt_breaker {
    pthread_mutex_t lock;
    kvt_clock_t clock;
    uint64_t ttl_ns;
    kvt_strmap_t peers; /* peer -> breaker_entry_t */
    uint64_t trips_total;
    uint64_t skips_total;
    uint64_t resumes_total;
};

kvt_status_t kvt_breaker_create(double ttl_s, const kvt_clock_t *clock, kvt_breaker_t **out)
{
    kvt_breaker_t *b;

    if (out == NULL || ttl_s < 0.0 || ttl_s != ttl_s)
        return KVT_ERR_INVALID;
    b = kvt_calloc(1, sizeof(*b));
    if (b == NULL)
        return KVT_ERR_NOMEM;
    if (kvt_strmap_init(&b->peers) != KVT_OK) {
        kvt_free(b);
        return KVT_ERR_NOMEM;
    }
    if (clock != NULL)
        b->clock = *clock;
    b->ttl_ns = kvt_sec_to_ns(ttl_s);
    pthread_mutex_init(&b->lock, NULL);
    *out = b;
    return KVT_OK;
}

void kvt_breaker_destroy(kvt_breaker_t *b)
{
    if (b == NULL)
        return;
    kvt_strmap_fini(&b->peers, kvt_free);
    pthread_mutex_destroy(&b->lock);
    kvt_free(b);
}

kvt_status_t kvt_breaker_trip(kvt_breaker_t *b, const char *peer)
{
    breaker_entry_t *e;
    uint64_t until;
    kvt_status_t status = KVT_OK;

    if (b == NULL || peer == NULL)
        return KVT_ERR_INVALID;
    if (b->ttl_ns == 0)
        return KVT_OK; /* breaker disabled */
    until = kvt_clock_now(&b->clock) + b->ttl_ns;
    pthread_mutex_lock(&b->lock);
    b->trips_total++;
    e = kvt_strmap_get(&b->peers, peer);
    if (e != NULL) {
        e->until_ns = until;
    } else if ((e = kvt_malloc(sizeof(*e))) == NULL) {
        status = KVT_ERR_NOMEM;
    } else {
        e->until_ns = until;
        status = kvt_strmap_put(&b->peers, peer, e);
        if (status != KVT_OK)
            kvt_free(e);
    }
    pthread_mutex_unlock(&b->lock);
    return status;
}

kvt_status_t kvt_breaker_check(kvt_breaker_t *b, const char *peer, uint64_t *remaining_ns_out)
{
    breaker_entry_t *e;
    uint64_t now, remaining = 0;
    kvt_status_t status = KVT_OK;

    if (b == NULL || peer == NULL)
        return KVT_ERR_INVALID;
    now = kvt_clock_now(&b->clock);
    pthread_mutex_lock(&b->lock);
    e = kvt_strmap_get(&b->peers, peer);
    if (e != NULL) {
        if (now < e->until_ns) {
            remaining = e->until_ns - now;
            b->skips_total++;
            status = KVT_ERR_BACKOFF;
        } else {
            kvt_free(kvt_strmap_remove(&b->peers, peer));
            b->resumes_total++;
        }
    }
    pthread_mutex_unlock(&b->lock);
    if (remaining_ns_out != NULL)
        *remaining_ns_out = remaining;
    return status;
}

void kvt_breaker_reset(kvt_breaker_t *b, const char *peer)
{
    if (b == NULL || peer == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    kvt_free(kvt_strmap_remove(&b->peers, peer));
    pthread_mutex_unlock(&b->lock);
}

struct prune_ctx {
    uint64_t now;
    uint64_t pruned;
};

static int prune_expired(void *arg, const char *key, void *val)
{
    struct prune_ctx *c = arg;
    breaker_entry_t *e = val;

    if (c->now < e->until_ns)
        return 0;
    kvt_free(e);
    c->pruned++;
    return 1;
}

void kvt_breaker_stats(kvt_breaker_t *b, kvt_breaker_stats_t *out)
{
    struct prune_ctx c = {kvt_clock_now(&b->clock), 0};

    pthread_mutex_lock(&b->lock);
    kvt_strmap_filter(&b->peers, prune_expired, &c);
    b->resumes_total += c.pruned;
    out->open_peers = (uint32_t)b->peers.count;
    out->trips_total = b->trips_total;
    out->skips_total = b->skips_total;
    out->resumes_total = b->resumes_total;
    pthread_mutex_unlock(&b->lock);
}
