/*
 * The verbs transport end to end over the in-process fake RDMA device of
 * test_verbs_fake_nic.h. Everything but the hardware runs: device choice, MR registration, the
 * handshake blobs, RTR/RTS, slicing, chained posts, credits, the completion thread, path failure
 * and retry, peer failure, rebuild after a peer restart, and flushing at shutdown. What it cannot
 * show is real NIC behaviour (timing, PSN handling, retransmission, ordering); that is what
 * test_verbs_conformance covers on a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvt_tl_verbs.h"
#include "kvt_verbs_dev.h"

#include "test_verbs_fake_nic.h"

/* ================================ the tests ============================================== */

#define PAGE   (40u * 1024u) /* slices cut pages that are not 64 KiB multiples */
#define NPAGES 128u
#define REGION ((uint64_t)PAGE * NPAGES) /* 5 MiB: several 1 MiB MRs */
#define MAX_MR (1u << 20)

#include "verbs_side.h"

static unsigned side_completions(side_t *s)
{
    unsigned n;

    pthread_mutex_lock(&s->lock);
    n = s->completions;
    pthread_mutex_unlock(&s->lock);
    return n;
}

static void fk_set_hold(bool on)
{
    pthread_mutex_lock(&fk.lock);
    fk.hold = on;
    pthread_mutex_unlock(&fk.lock);
}

static kvt_tl_xfer_t ref(side_t *local, uint32_t lpage, const char *ruuid, uint32_t rpage,
                         uint32_t npages)
{
    kvt_tl_xfer_t x;

    memset(&x, 0, sizeof(x));
    x.local = local->region;
    x.local_offset = (uint64_t)lpage * PAGE;
    snprintf(x.remote_uuid, sizeof(x.remote_uuid), "%s", ruuid);
    x.remote_offset = (uint64_t)rpage * PAGE;
    x.length = (uint64_t)npages * PAGE;
    return x;
}

/* Every connected QP pair agrees on numbers and PSNs (what RTR/RTS exchanged). */
static void assert_pairs_consistent(void)
{
    unsigned pairs = 0;

    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_QPS; i++) {
        fk_qp_t *q = fk.qps[i], *p;

        if (q == NULL || q->qp.state != IBV_QPS_RTS)
            continue;
        p = fk_qp_by_num(q->dest_qpn);
        assert_non_null(p);
        assert_int_equal(p->dest_qpn, q->qp.qp_num);
        assert_int_equal(q->rq_psn, p->sq_psn);
        pairs++;
    }
    pthread_mutex_unlock(&fk.lock);
    assert_true(pairs >= 4); /* 2 QPs per peer, both sides */
}

static int setup(void **state)
{
    fk.max_mr_size = MAX_MR;
    fk.max_qp_wr = 1024;
    fk.hold = false;
    fk.violations = 0;
    fk.bad_transitions = 0;
    fk.max_chain = 0;
    fk.max_wr_len = 0;
    fk.post_calls = 0;
    return 0;
}

static void assert_clean_fake(void)
{
    if (fk.violations != 0)
        fail_msg("fake NIC violation: %s", fk.last_violation);
    assert_int_equal(fk.bad_transitions, 0);
}

static void test_push_pull_data(void **state)
{
    static const uint32_t src[] = {0, 1, 2, 7, 50, 127}, dst[] = {3, 4, 5, 9, 100, 0};
    kvt_tl_xfer_t x[6];
    kvt_tl_stats_t st;
    side_t a, b;
    unsigned regs_before = fk.mr_regs;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    /* one MR per region, cut at 1 MiB: 5 per 5 MiB region, never one per 40 KiB page */
    assert_int_equal(fk.mr_regs - regs_before, 2 * 5);
    handshake(&a, "prefill-0", &b, "decode-0");
    assert_pairs_consistent();
    fill(a.mem, REGION, 1);
    fill(b.mem, REGION, 2);

    /* push: 6 page refs, some consecutive on both sides */
    for (int i = 0; i < 6; i++)
        x[i] = ref(&a, src[i], UB, dst[i], 1);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, x, 6, 101), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 101), KVT_OK);
    for (int i = 0; i < 6; i++)
        assert_memory_equal(b.mem + (uint64_t)dst[i] * PAGE, a.mem + (uint64_t)src[i] * PAGE, PAGE);
    /* a large pull over many slices and MR boundaries, B reading from A */
    x[0] = ref(&b, 10, UA, 20, 100);
    assert_int_equal(ops->post(b.tl, "prefill-0", KVT_TL_OP_READ, x, 1, 102), KVT_OK);
    assert_int_equal(wait_done(&b, 1, 102), KVT_OK);
    assert_memory_equal(b.mem + 10ull * PAGE, a.mem + 20ull * PAGE, 100ull * PAGE);

    assert_true(fk.max_wr_len <= 64 * 1024); /* 64 KiB slices */
    assert_true(fk.max_chain > 1);           /* chained posts */
    assert_true(fk.max_chain <= KVT_VERBS_DEFAULT_BATCH);
    ops->stats(a.tl, &st);
    assert_int_equal(st.bytes_written, 6ull * PAGE);
    assert_int_equal(st.ops_completed, 6);
    assert_int_equal(st.ops_failed, 0);
    ops->stats(b.tl, &st);
    assert_int_equal(st.bytes_read, 100ull * PAGE);
    assert_int_equal(st.ops_completed, 1);
    /* both QPs of the connection carried traffic */
    pthread_mutex_lock(&fk.lock);
    {
        unsigned busy = 0;

        for (int i = 0; i < FK_MAX_QPS; i++)
            busy += fk.qps[i] != NULL && fk.qps[i]->posted > 0;
        assert_true(busy >= 3);
    }
    pthread_mutex_unlock(&fk.lock);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static void test_refused_refs(void **state)
{
    kvt_tl_xfer_t x;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    x = ref(&a, 0, UB, 0, 1);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 1), KVT_ERR_NOT_FOUND);
    handshake(&a, "prefill-0", &b, "decode-0");
    x = ref(&a, 0, "cccccccc-3333-4333-8333-000000000003", 0, 1);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 2), KVT_ERR_NOT_FOUND);
    x = ref(&a, 0, UB, NPAGES - 1, 2);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 3), KVT_ERR_BOUNDS);
    x = ref(&a, NPAGES, UB, 0, 1);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_READ, &x, 1, 4), KVT_ERR_BOUNDS);
    x = ref(&a, 0, UB, 0, 1);
    assert_int_equal(ops->post(a.tl, "decode-0", (kvt_tl_op_t)7, &x, 1, 5), KVT_ERR_INVALID);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 0, 6), KVT_ERR_INVALID);
    /* a blob that is not a verbs handshake */
    assert_int_equal(ops->peer_connect(a.tl, "decode-0", "\x81\xa1x\x01", 4) < 0, 1);
    {
        kvt_tl_stats_t st;

        ops->stats(a.tl, &st);
        assert_int_equal(st.bad_frames, 1);
        assert_int_equal(st.ops_completed + st.ops_failed, 0);
    }
    assert_int_equal(a.completions, 0);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

/* QP number <qpn> fails after <n> good WRs. */
static void fk_fail_qp(uint32_t qpn, int n)
{
    pthread_mutex_lock(&fk.lock);
    fk_qp_by_num(qpn)->fail_after = n;
    pthread_mutex_unlock(&fk.lock);
}

/* Numbers of the connected QPs in creation order: after handshake(a, b) the first two are a's
 * (a prepares first). */
static void fk_rts_qps(uint32_t *out, int *n)
{
    fk_qp_t *q[FK_MAX_QPS];

    *n = 0;
    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_QPS; i++)
        if (fk.qps[i] != NULL && fk.qps[i]->qp.state == IBV_QPS_RTS)
            q[(*n)++] = fk.qps[i];
    for (int i = 1; i < *n; i++) /* insertion sort by creation order */
        for (int j = i; j > 0 && q[j - 1]->seq > q[j]->seq; j--) {
            fk_qp_t *t = q[j];

            q[j] = q[j - 1];
            q[j - 1] = t;
        }
    for (int i = 0; i < *n; i++)
        out[i] = q[i]->qp.qp_num;
    pthread_mutex_unlock(&fk.lock);
}

static void test_path_failure_retries_on_other_qp(void **state)
{
    uint32_t qpns[16];
    int n;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    fill(a.mem, REGION, 3);
    fk_rts_qps(qpns, &n);
    assert_int_equal(n, 4);
    /* a's QPs were created first (prepare on a ran first): fail a's first QP mid-transfer */
    fk_fail_qp(qpns[0], 5);
    x = ref(&a, 0, UB, 0, 120);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 77), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 77), KVT_OK); /* retried on the other QP */
    pthread_mutex_lock(&fk.lock);
    assert_int_equal(fk_qp_by_num(qpns[0])->qp.state, IBV_QPS_ERR); /* the error did happen */
    pthread_mutex_unlock(&fk.lock);
    assert_memory_equal(b.mem, a.mem, 120ull * PAGE);
    ops->stats(a.tl, &st);
    assert_int_equal(st.ops_completed, 1);
    assert_int_equal(st.peer_failures, 0);
    assert_int_equal(a.peer_failures, 0);
    /* the failed QP takes no more work: a second transfer lands entirely on the other one */
    pthread_mutex_lock(&fk.lock);
    {
        uint64_t before = fk_qp_by_num(qpns[0])->posted;

        pthread_mutex_unlock(&fk.lock);
        fill(a.mem, REGION, 4);
        x = ref(&a, 0, UB, 0, 30);
        assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 78), KVT_OK);
        assert_int_equal(wait_done(&a, 2, 78), KVT_OK);
        assert_memory_equal(b.mem, a.mem, 30ull * PAGE);
        pthread_mutex_lock(&fk.lock);
        assert_int_equal(fk_qp_by_num(qpns[0])->posted, before);
    }
    pthread_mutex_unlock(&fk.lock);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static void test_all_paths_fail_then_rebuild(void **state)
{
    uint32_t qpns[16];
    int n;
    kvt_tl_xfer_t x;
    kvt_tl_stats_t st;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    fk_rts_qps(qpns, &n);
    fk_fail_qp(qpns[0], 0);
    fk_fail_qp(qpns[1], 2);
    x = ref(&a, 0, UB, 0, 60);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 90), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 90), KVT_ERR_PEER);
    ops->stats(a.tl, &st);
    assert_int_equal(st.ops_failed, 1);
    assert_int_equal(st.peer_failures, 1);
    assert_int_equal(a.peer_failures, 1); /* reported once */
    /* the connection is down until the next handshake */
    x = ref(&a, 0, UB, 0, 1);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 91), KVT_ERR_PEER);
    handshake(&a, "prefill-0", &b, "decode-0");
    fill(a.mem, REGION, 5);
    x = ref(&a, 0, UB, 0, 60);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 92), KVT_OK);
    assert_int_equal(wait_done(&a, 2, 92), KVT_OK);
    assert_memory_equal(b.mem, a.mem, 60ull * PAGE);
    assert_int_equal(a.peer_failures, 1);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static void test_remote_access_error_fails_transfer(void **state)
{
    kvt_tl_xfer_t x;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    /* B drops its region: A's rkeys are stale, the NIC refuses every access */
    ops->dereg_region(b.tl, b.region);
    b.region = NULL;
    x = ref(&a, 0, UB, 0, 4);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 5), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 5), KVT_ERR_ACCESS);
    ops->destroy(b.tl);
    free(b.mem);
    side_close(&a);
    assert_clean_fake();
}

static void test_peer_restart_rebuilds(void **state)
{
    kvt_tl_xfer_t x;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    fill(a.mem, REGION, 6);
    x = ref(&a, 1, UB, 1, 3);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 1), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 1), KVT_OK);
    /* decode restarts: new process, new memory, new keys, same region uuid */
    side_close(&b);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    x = ref(&a, 2, UB, 5, 3);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 2), KVT_OK);
    assert_int_equal(wait_done(&a, 2, 2), KVT_OK);
    assert_memory_equal(b.mem + 5ull * PAGE, a.mem + 2ull * PAGE, 3ull * PAGE);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static void test_outstanding_bound_per_qp(void **state)
{
    kvt_tl_xfer_t x;
    side_t a, b;
    unsigned max_inflight = 0;

    fk.max_qp_wr = 16; /* the transport clamps its per-QP bound to the device */
    fk_set_hold(true);
    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    fill(a.mem, REGION, 7);
    x = ref(&a, 0, UB, 0, NPAGES); /* 5 MiB = 80+ slices */
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 55), KVT_OK);
    assert_int_equal(fk_held_count(), 32); /* 16 per QP, the rest waits in the queues */
    for (int round = 0; round < 100 && side_completions(&a) == 0; round++) {
        fk_release();
        usleep(2000);
    }
    fk_set_hold(false);
    fk_release();
    assert_int_equal(wait_done(&a, 1, 55), KVT_OK);
    assert_memory_equal(b.mem, a.mem, REGION);
    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_QPS; i++)
        if (fk.qps[i] != NULL && fk.qps[i]->max_inflight > max_inflight)
            max_inflight = fk.qps[i]->max_inflight;
    pthread_mutex_unlock(&fk.lock);
    assert_int_equal(max_inflight, 16);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static void test_destroy_flushes_outstanding(void **state)
{
    kvt_tl_xfer_t x;
    side_t a, b;

    fk_set_hold(true);
    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    handshake(&a, "prefill-0", &b, "decode-0");
    x = ref(&a, 0, UB, 0, 20);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 9), KVT_OK);
    assert_true(fk_held_count() > 0);
    ops->destroy(a.tl); /* the post completes with an error before destroy returns */
    assert_int_equal(a.completions, 1);
    assert_int_equal(a.last_cookie, 9);
    assert_true(a.last_status < 0);
    fk_set_hold(false);
    ops->dereg_region(b.tl, b.region);
    ops->destroy(b.tl);
    free(a.mem);
    free(b.mem);
    assert_clean_fake();
}

/* The initiator prepares under the address it dialled and learns the node id from the reply. */
static void test_rename_after_reply(void **state)
{
    char blob_a[KVT_TL_BLOB_MAX], blob_b[KVT_TL_BLOB_MAX];
    size_t la = sizeof(blob_a), lb = sizeof(blob_b);
    kvt_tl_xfer_t x;
    side_t a, b;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    fill(a.mem, REGION, 8);
    assert_int_equal(ops->peer_prepare(a.tl, "127.0.0.1:7001", blob_a, &la), KVT_OK);
    assert_int_equal(ops->peer_prepare(b.tl, "prefill-0", blob_b, &lb), KVT_OK);
    assert_int_equal(ops->peer_connect(b.tl, "prefill-0", blob_a, la), KVT_OK);
    /* without the rename the reply names a peer nothing was prepared for */
    assert_int_equal(ops->peer_connect(a.tl, "decode-0", blob_b, lb), KVT_ERR_STATE);
    assert_int_equal(ops->peer_rename(a.tl, "nobody", "decode-0"), KVT_ERR_NOT_FOUND);
    la = sizeof(blob_a);
    assert_int_equal(ops->peer_prepare(a.tl, "127.0.0.1:7001", blob_a, &la), KVT_OK);
    lb = sizeof(blob_b);
    assert_int_equal(ops->peer_prepare(b.tl, "prefill-0", blob_b, &lb), KVT_OK);
    assert_int_equal(ops->peer_connect(b.tl, "prefill-0", blob_a, la), KVT_OK);
    assert_int_equal(ops->peer_rename(a.tl, "127.0.0.1:7001", "decode-0"), KVT_OK);
    assert_int_equal(ops->peer_connect(a.tl, "decode-0", blob_b, lb), KVT_OK);
    x = ref(&a, 3, UB, 4, 5);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 31), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 31), KVT_OK);
    assert_memory_equal(b.mem + 4ull * PAGE, a.mem + 3ull * PAGE, 5ull * PAGE);
    assert_int_equal(ops->post(a.tl, "127.0.0.1:7001", KVT_TL_OP_WRITE, &x, 1, 32),
                     KVT_ERR_NOT_FOUND);
    /* renaming onto a connected peer replaces its pending half, the live connection stays */
    la = sizeof(blob_a);
    assert_int_equal(ops->peer_prepare(a.tl, "127.0.0.1:7001", blob_a, &la), KVT_OK);
    assert_int_equal(ops->peer_rename(a.tl, "127.0.0.1:7001", "decode-0"), KVT_OK);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 33), KVT_OK);
    assert_int_equal(wait_done(&a, 2, 33), KVT_OK);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

static unsigned fk_live_qps(void)
{
    unsigned n = 0;

    pthread_mutex_lock(&fk.lock);
    for (int i = 0; i < FK_MAX_QPS; i++)
        n += fk.qps[i] != NULL;
    pthread_mutex_unlock(&fk.lock);
    return n;
}

/* A handshake whose peer blob is garbage takes the QPs prepared for it along: strangers
 * sending bad handshakes under ever new node ids (what the init port lets anyone do) leave no
 * QPs and no completion-queue room behind, and a real peer still connects. */
static void test_bad_handshake_leaves_no_qps(void **state)
{
    char blob_a[KVT_TL_BLOB_MAX], blob_b[KVT_TL_BLOB_MAX], id[32];
    const char junk[] = "not a verbs handshake";
    size_t la = sizeof(blob_a), lb;
    kvt_tl_xfer_t x;
    side_t a, b;
    unsigned base;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    assert_int_equal(ops->peer_prepare(a.tl, "decode-0", blob_a, &la), KVT_OK);
    base = fk_live_qps();
    for (int i = 0; i < 50; i++) {
        snprintf(id, sizeof(id), "stranger-%d", i);
        lb = sizeof(blob_b);
        assert_int_equal(ops->peer_prepare(b.tl, id, blob_b, &lb), KVT_OK);
        assert_true(fk_live_qps() > base);
        assert_int_not_equal(ops->peer_connect(b.tl, id, junk, sizeof(junk)), KVT_OK);
        assert_int_equal(fk_live_qps(), base);
    }
    lb = sizeof(blob_b);
    assert_int_equal(ops->peer_prepare(b.tl, "prefill-0", blob_b, &lb), KVT_OK);
    assert_int_equal(ops->peer_connect(b.tl, "prefill-0", blob_a, la), KVT_OK);
    assert_int_equal(ops->peer_connect(a.tl, "decode-0", blob_b, lb), KVT_OK);
    x = ref(&a, 0, UB, 0, 2);
    assert_int_equal(ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 41), KVT_OK);
    assert_int_equal(wait_done(&a, 1, 41), KVT_OK);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

/* Every allocation on the handshake and post paths may fail: clean statuses, no leak, and the
 * transport still works afterwards. */
static void test_allocation_failures(void **state)
{
    char blob_a[KVT_TL_BLOB_MAX], blob_b[KVT_TL_BLOB_MAX];
    size_t la, lb;
    kvt_tl_xfer_t x;
    side_t a, b;
    unsigned expect = 0;
    bool done = false;

    side_open(&a, "prefill-0", UA);
    side_open(&b, "decode-0", UB);
    for (uint64_t n = 1; n < 300 && !done; n++) {
        kvt_status_t st;

        la = sizeof(blob_a);
        lb = sizeof(blob_b);
        kvt_alloc_fail_at(n, 0);
        st = ops->peer_prepare(a.tl, "decode-0", blob_a, &la);
        if (st == KVT_OK)
            st = ops->peer_prepare(b.tl, "prefill-0", blob_b, &lb);
        if (st == KVT_OK)
            st = ops->peer_connect(b.tl, "prefill-0", blob_a, la);
        if (st == KVT_OK)
            st = ops->peer_connect(a.tl, "decode-0", blob_b, lb);
        if (st == KVT_OK) {
            x = ref(&a, 0, UB, 0, 3);
            st = ops->post(a.tl, "decode-0", KVT_TL_OP_WRITE, &x, 1, 500 + n);
            if (st == KVT_OK) {
                expect++;
                kvt_alloc_fail_at(0, 0);
                assert_int_equal(wait_done(&a, expect, 500 + n), KVT_OK);
                done = true;
            }
        }
        kvt_alloc_fail_at(0, 0);
        if (!done)
            assert_true(st == KVT_ERR_NOMEM || st == KVT_ERR_STATE || st == KVT_ERR_PEER);
    }
    assert_true(done);
    side_close(&b);
    side_close(&a);
    assert_clean_fake();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_push_pull_data, setup),
        cmocka_unit_test_setup(test_refused_refs, setup),
        cmocka_unit_test_setup(test_path_failure_retries_on_other_qp, setup),
        cmocka_unit_test_setup(test_all_paths_fail_then_rebuild, setup),
        cmocka_unit_test_setup(test_remote_access_error_fails_transfer, setup),
        cmocka_unit_test_setup(test_peer_restart_rebuilds, setup),
        cmocka_unit_test_setup(test_outstanding_bound_per_qp, setup),
        cmocka_unit_test_setup(test_destroy_flushes_outstanding, setup),
        cmocka_unit_test_setup(test_rename_after_reply, setup),
        cmocka_unit_test_setup(test_allocation_failures, setup),
        cmocka_unit_test_setup(test_bad_handshake_leaves_no_qps, setup),
    };

    ops = kvt_tl_verbs_desc.ops;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
