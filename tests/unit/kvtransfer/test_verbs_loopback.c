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

#include "verbs_side.h"

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
