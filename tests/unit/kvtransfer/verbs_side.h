/*
 * One side of a verbs transport test: a transport instance with one registered
 * region, completion bookkeeping and the handshake with another side. Shared by
 * the fake-device test and the device loopback test, which differ only in what
 * sits under libibverbs. The includer defines PAGE and REGION (bytes) first.
 */
#ifndef KVT_TEST_VERBS_SIDE_H
#define KVT_TEST_VERBS_SIDE_H

static const kvt_tl_ops_t *ops;

static const char *UA = "aaaaaaaa-1111-4111-8111-000000000001";
static const char *UB = "bbbbbbbb-2222-4222-8222-000000000002";

typedef struct side {
    kvt_tl_t *tl;
    kvt_tl_region_t *region;
    uint8_t *mem;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t last_cookie;
    kvt_status_t last_status;
    unsigned completions;
    unsigned peer_failures;
} side_t;

static void on_complete(void *arg, uint64_t cookie, kvt_status_t status)
{
    side_t *s = arg;

    pthread_mutex_lock(&s->lock);
    s->last_cookie = cookie;
    s->last_status = status;
    s->completions++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void on_peer_failed(void *arg, const char *peer, kvt_status_t status)
{
    side_t *s = arg;

    pthread_mutex_lock(&s->lock);
    s->peer_failures++;
    pthread_mutex_unlock(&s->lock);
}

static void side_open(side_t *s, const char *id, const char *uuid)
{
    kvt_tl_config_t cfg = {.local_id = id, .lanes = 0 /* transport default: 2 QPs */};
    kvt_tl_callbacks_t cb = {
        .on_complete = on_complete, .on_peer_failed = on_peer_failed, .arg = s};
    kvt_tl_region_params_t rp;

    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->mem = aligned_alloc(4096, REGION);
    assert_non_null(s->mem);
    memset(s->mem, 0, REGION);
    assert_int_equal(ops->create(&cfg, &cb, &s->tl), KVT_OK);
    rp =
        (kvt_tl_region_params_t){.uuid = uuid, .base = s->mem, .length = REGION, .page_size = PAGE};
    assert_int_equal(ops->reg_region(s->tl, &rp, &s->region), KVT_OK);
}

static void side_close(side_t *s)
{
    ops->dereg_region(s->tl, s->region);
    ops->destroy(s->tl);
    free(s->mem);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
}

static void handshake(side_t *a, const char *a_id, side_t *b, const char *b_id)
{
    char blob_a[KVT_TL_BLOB_MAX], blob_b[KVT_TL_BLOB_MAX];
    size_t la = sizeof(blob_a), lb = sizeof(blob_b);

    assert_int_equal(ops->peer_prepare(a->tl, b_id, blob_a, &la), KVT_OK);
    assert_int_equal(ops->peer_prepare(b->tl, a_id, blob_b, &lb), KVT_OK);
    assert_int_equal(ops->peer_connect(b->tl, a_id, blob_a, la), KVT_OK);
    assert_int_equal(ops->peer_connect(a->tl, b_id, blob_b, lb), KVT_OK);
}

/* Wait for completion number <n> on <s>; returns its status. */
static kvt_status_t wait_done(side_t *s, unsigned n, uint64_t cookie)
{
    struct timespec dl;
    kvt_status_t st;

    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 20;
    pthread_mutex_lock(&s->lock);
    while (s->completions < n)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &dl) != 0)
            break;
    assert_int_equal(s->completions, n);
    assert_int_equal(s->last_cookie, cookie);
    st = s->last_status;
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed) >> 9);
}

#endif /* KVT_TEST_VERBS_SIDE_H */
