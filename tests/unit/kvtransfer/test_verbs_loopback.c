/*
 * Data movement over the verbs transport, which needs an RDMA device (a NIC, or
 * soft-RoCE: `rdma link add rxe0 type rxe netdev <if>`). Two transport
 * instances in this process talk over the device: handshake, push (WRITE) and
 * pull (READ) of page lists, regions split into several MRs, bad refs,
 * counters, and a peer restart. Without a device the whole suite is skipped
 * with one line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvt_tl_verbs.h"
#include "kvt_verbs_dev.h"

#define PAGE   (48u * 1024u) /* not a multiple of the 64 KiB slice */
#define NPAGES 64u
#define REGION ((uint64_t)PAGE * NPAGES)

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

static const kvt_tl_ops_t *ops;

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
    kvt_tl_config_t cfg = {.local_id = id, .lanes = 2};
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
        p[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
}

static kvt_tl_xfer_t page_ref(side_t *local, uint32_t lpage, const char *ruuid, uint32_t rpage)
{
    kvt_tl_xfer_t x;

    memset(&x, 0, sizeof(x));
    x.local = local->region;
    x.local_offset = (uint64_t)lpage * PAGE;
    snprintf(x.remote_uuid, sizeof(x.remote_uuid), "%s", ruuid);
    x.remote_offset = (uint64_t)rpage * PAGE;
    x.length = PAGE;
    return x;
}

static void run_push_and_pull(void)
{
    static const uint32_t src[] = {0, 3, 4, 5, 9, 63}, dst[] = {1, 2, 3, 40, 41, 7};
    kvt_tl_xfer_t x[6];
    kvt_tl_stats_t st;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    fill(a.mem, REGION, 1);
    fill(b.mem, REGION, 2);

    /* push: A's pages -> B's pages */
    for (int i = 0; i < 6; i++)
        x[i] = page_ref(&a, src[i], UB, dst[i]);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, x, 6, 11), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 11), KVT_OK);
    for (int i = 0; i < 6; i++)
        assert_memory_equal(b.mem + (uint64_t)dst[i] * PAGE, a.mem + (uint64_t)src[i] * PAGE, PAGE);
    /* pull: B reads A's pages over the same connection, other direction */
    for (int i = 0; i < 6; i++)
        x[i] = page_ref(&b, 50 + i, UA, 10 + i);
    assert_int_equal(ops->post(b.tl, "prefill-0", KVT_TL_OP_READ, x, 6, 12), KVT_OK);
    assert_int_equal(wait_done(&b, 1, 12), KVT_OK);
    assert_memory_equal(b.mem + 50ull * PAGE, a.mem + 10ull * PAGE, 6ull * PAGE);

    /* refs a transport must refuse up front */
    x[0] = page_ref(&a, 0, "cccccccc-3333-4333-8333-000000000003", 0);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, x, 1, 13), KVT_ERR_NOT_FOUND);
    x[0] = page_ref(&a, 0, UB, NPAGES); /* one past the end */
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, x, 1, 14), KVT_ERR_BOUNDS);
    assert_int_equal(ops->post(a.tl, "nobody", KVT_TL_OP_WRITE, x, 1, 15), KVT_ERR_NOT_FOUND);

    ops->stats(a.tl, &st);
    assert_int_equal(st.bytes_written, 6ull * PAGE);
    assert_int_equal(st.ops_completed, 6);
    assert_int_equal(st.ops_failed, 0);
    ops->stats(b.tl, &st);
    assert_int_equal(st.bytes_read, 6ull * PAGE);

    /* B restarts: a new instance, a new handshake replaces A's old connection */
    side_close(&b);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    x[0] = page_ref(&a, 9, UB, 0);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, x, 1, 16), KVT_OK);
    assert_int_equal(wait_done(&a, 2, 16), KVT_OK);
    assert_memory_equal(b.mem, a.mem + 9ull * PAGE, PAGE);

    side_close(&b);
    side_close(&a);
}

static void test_push_pull(void **state)
{
    run_push_and_pull();
}

/* The same with every region cut into 1 MiB MRs: slices must never cross an MR.
 */
static void test_push_pull_split_mrs(void **state)
{
    setenv("KVT_VERBS_MAX_MR_SIZE", "1048576", 1);
    run_push_and_pull();
    unsetenv("KVT_VERBS_MAX_MR_SIZE");
}

static void test_needs_rdma_device(void **state)
{
    print_message("SKIP verbs loopback: no RDMA device on this host "
                  "(ibv_get_device_list "
                  "found none); see kvtransfer/src/verbs/README.md to run it "
                  "with soft-RoCE\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_pull),
        cmocka_unit_test(test_push_pull_split_mrs),
    };
    const struct CMUnitTest no_device[] = {
        cmocka_unit_test(test_needs_rdma_device),
    };

    ops = kvt_tl_verbs_desc.ops;
    if (kvt_verbs_dev_available() == 0)
        return cmocka_run_group_tests(no_device, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
