/*
 * Slicing of page lists into 64 KiB work requests, MR-boundary cuts, WR chains
 * and the per-QP round-robin/credit bounds of posting -- all without a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvt_verbs_int.h"

#define KIB 1024ull

static const char *U1 = "11111111-1111-1111-1111-111111111111";
static const char *U2 = "22222222-2222-2222-2222-222222222222";

/* A map whose chunk i has key base_key + i. */
static void map_make(kvt_verbs_mr_map_t *m, const char *uuid, uint64_t base, uint64_t len,
                     uint64_t max_mr, uint32_t base_key)
{
    assert_int_equal(kvt_verbs_mr_map_init(m, uuid, base, len, max_mr), KVT_OK);
    for (uint32_t i = 0; i < m->nkeys; i++)
        m->keys[i] = base_key + i;
}

static void test_contiguous_pages_coalesce_then_slice(void **state)
{
    kvt_verbs_mr_map_t l, r;
    kvt_verbs_seg_t segs[10];
    kvt_verbs_slice_t out[8];
    size_t n = 0, nseg;

    map_make(&l, U1, 0x100000, 1024 * KIB, 0, 7);
    map_make(&r, U2, 0x900000, 1024 * KIB, 0, 9);
    for (int i = 0; i < 10; i++) { /* ten 16 KiB pages, consecutive on both sides */
        segs[i].laddr = 0x100000 + i * 16 * KIB;
        segs[i].raddr = 0x900000 + (i + 2) * 16 * KIB;
        segs[i].len = 16 * KIB;
        segs[i].lmap = &l;
        segs[i].rmap = &r;
    }
    nseg = kvt_verbs_seg_coalesce(segs, 10);
    assert_int_equal(nseg, 1);
    assert_int_equal(segs[0].len, 160 * KIB);
    assert_int_equal(kvt_verbs_slice_count(segs, nseg, KVT_VERBS_SLICE_SIZE, &n), KVT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(
        kvt_verbs_slice_build(segs, nseg, KVT_VERBS_SLICE_SIZE, IBV_WR_RDMA_WRITE, out, 8, &n),
        KVT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(out[0].len, 64 * KIB);
    assert_int_equal(out[1].len, 64 * KIB);
    assert_int_equal(out[2].len, 32 * KIB);
    assert_int_equal(out[1].laddr, 0x100000 + 64 * KIB);
    assert_int_equal(out[1].raddr, 0x900000 + 32 * KIB + 64 * KIB);
    assert_int_equal(out[2].lkey, 7);
    assert_int_equal(out[2].rkey, 9);
    assert_int_equal(out[0].opcode, IBV_WR_RDMA_WRITE);
    assert_int_equal(out[0].qp, -1);
    kvt_verbs_mr_map_clear(&l);
    kvt_verbs_mr_map_clear(&r);
}

static void test_scattered_pages_stay_separate(void **state)
{
    kvt_verbs_mr_map_t l, r;
    kvt_verbs_seg_t segs[4];
    kvt_verbs_slice_t out[8];
    size_t n = 0, nseg;
    uint64_t total = 0;

    map_make(&l, U1, 0, 1024 * KIB, 0, 1);
    map_make(&r, U2, 0, 1024 * KIB, 0, 2);
    /* local consecutive but remote scattered: no merge */
    for (int i = 0; i < 4; i++) {
        segs[i] = (kvt_verbs_seg_t){.laddr = i * 100 * KIB,
                                    .raddr = (3 - i) * 100 * KIB,
                                    .len = 100 * KIB,
                                    .lmap = &l,
                                    .rmap = &r};
    }
    segs[1].laddr = segs[0].laddr + segs[0].len; /* consecutive locally only */
    nseg = kvt_verbs_seg_coalesce(segs, 4);
    assert_int_equal(nseg, 4);
    assert_int_equal(
        kvt_verbs_slice_build(segs, nseg, KVT_VERBS_SLICE_SIZE, IBV_WR_RDMA_READ, out, 8, &n),
        KVT_OK);
    assert_int_equal(n, 8); /* each 100 KiB page -> 64 + 36 */
    for (size_t i = 0; i < n; i++) {
        assert_true(out[i].len <= KVT_VERBS_SLICE_SIZE);
        assert_int_equal(out[i].opcode, IBV_WR_RDMA_READ);
        total += out[i].len;
    }
    assert_int_equal(total, 400 * KIB);
    assert_int_equal(out[1].len, 36 * KIB);
    assert_int_equal(out[2].raddr, 200 * KIB);
    kvt_verbs_mr_map_clear(&l);
    kvt_verbs_mr_map_clear(&r);
}

static void test_slices_never_cross_mr_boundaries(void **state)
{
    kvt_verbs_mr_map_t l, r;
    kvt_verbs_seg_t seg;
    kvt_verbs_slice_t out[16];
    size_t n = 0;
    uint64_t off = 0;

    /* local MRs every 100 KiB, remote MRs every 96 KiB */
    map_make(&l, U1, 0x10000, 400 * KIB, 100 * KIB, 100);
    map_make(&r, U2, 0x80000, 384 * KIB, 96 * KIB, 200);
    assert_int_equal(l.nkeys, 4);
    assert_int_equal(r.nkeys, 4);
    seg = (kvt_verbs_seg_t){.laddr = 0x10000 + 40 * KIB,
                            .raddr = 0x80000 + 40 * KIB,
                            .len = 300 * KIB,
                            .lmap = &l,
                            .rmap = &r};
    assert_int_equal(
        kvt_verbs_slice_build(&seg, 1, KVT_VERBS_SLICE_SIZE, IBV_WR_RDMA_WRITE, out, 16, &n),
        KVT_OK);
    for (size_t i = 0; i < n; i++) {
        uint64_t lo = out[i].laddr - 0x10000, ro = out[i].raddr - 0x80000;

        assert_int_equal(lo, 40 * KIB + off);
        assert_int_equal(ro, 40 * KIB + off);
        /* the whole slice sits inside one local and one remote MR, with that MR's
         * key */
        assert_int_equal(lo / (100 * KIB), (lo + out[i].len - 1) / (100 * KIB));
        assert_int_equal(ro / (96 * KIB), (ro + out[i].len - 1) / (96 * KIB));
        assert_int_equal(out[i].lkey, 100 + lo / (100 * KIB));
        assert_int_equal(out[i].rkey, 200 + ro / (96 * KIB));
        off += out[i].len;
    }
    assert_int_equal(off, 300 * KIB);
    /* cuts at 56 KiB (remote 96), 60 (local 100), 64-slice limits ... */
    assert_int_equal(out[0].len, 56 * KIB);
    assert_int_equal(out[1].len, 4 * KIB);
    kvt_verbs_mr_map_clear(&l);
    kvt_verbs_mr_map_clear(&r);
}

static void test_out_of_region_is_refused(void **state)
{
    kvt_verbs_mr_map_t l, r;
    kvt_verbs_seg_t seg;
    kvt_verbs_slice_t out[4];
    size_t n = 99;

    map_make(&l, U1, 0x1000, 64 * KIB, 0, 1);
    map_make(&r, U2, 0x1000, 64 * KIB, 0, 2);
    seg = (kvt_verbs_seg_t){
        .laddr = 0x1000, .raddr = 0x1000 + 4096, .len = 64 * KIB, .lmap = &l, .rmap = &r};
    assert_int_equal(kvt_verbs_slice_count(&seg, 1, KVT_VERBS_SLICE_SIZE, &n), KVT_ERR_BOUNDS);
    seg.raddr = 0x1000;
    seg.laddr = 0x0fff;
    assert_int_equal(kvt_verbs_slice_build(&seg, 1, KVT_VERBS_SLICE_SIZE, 0, out, 4, &n),
                     KVT_ERR_BOUNDS);
    seg.laddr = UINT64_MAX - 10; /* wraps */
    assert_int_equal(kvt_verbs_slice_count(&seg, 1, KVT_VERBS_SLICE_SIZE, &n), KVT_ERR_BOUNDS);
    seg.laddr = 0x1000;
    assert_int_equal(kvt_verbs_slice_build(&seg, 1, KVT_VERBS_SLICE_SIZE, 0, out, 0, &n),
                     KVT_ERR_INVALID); /* too small output */
    assert_int_equal(n, 99);
    kvt_verbs_mr_map_clear(&l);
    kvt_verbs_mr_map_clear(&r);
}

static void test_chain_build(void **state)
{
    kvt_verbs_slice_t sl[3];
    kvt_verbs_slice_t *p[3] = {&sl[0], &sl[1], &sl[2]};
    struct ibv_send_wr wrs[3];
    struct ibv_sge sges[3];

    for (int i = 0; i < 3; i++) {
        memset(&sl[i], 0, sizeof(sl[i]));
        sl[i].laddr = 0x1000 * (i + 1);
        sl[i].raddr = 0x9000 * (i + 1);
        sl[i].lkey = 10 + i;
        sl[i].rkey = 20 + i;
        sl[i].len = 4096 * (i + 1);
        sl[i].opcode = IBV_WR_RDMA_READ;
    }
    kvt_verbs_chain_build(p, 3, wrs, sges);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(wrs[i].next, i < 2 ? &wrs[i + 1] : NULL);
        assert_int_equal(wrs[i].wr_id, (uint64_t)(uintptr_t)&sl[i]);
        assert_int_equal(wrs[i].opcode, IBV_WR_RDMA_READ);
        assert_int_equal(wrs[i].send_flags, IBV_SEND_SIGNALED);
        assert_int_equal(wrs[i].num_sge, 1);
        assert_ptr_equal(wrs[i].sg_list, &sges[i]);
        assert_int_equal(sges[i].addr, 0x1000 * (i + 1));
        assert_int_equal(sges[i].length, 4096 * (i + 1));
        assert_int_equal(sges[i].lkey, 10 + i);
        assert_int_equal(wrs[i].wr.rdma.remote_addr, 0x9000 * (i + 1));
        assert_int_equal(wrs[i].wr.rdma.rkey, 20 + i);
    }
}

static void test_round_robin_and_credit_bounds(void **state)
{
    kvt_verbs_paths_t p;
    kvt_verbs_slice_t sl[20];
    kvt_verbs_slice_t *out[16];
    kvt_verbs_slice_t *ab = NULL;
    size_t n;

    memset(sl, 0, sizeof(sl));
    kvt_verbs_paths_init(&p, 3, 4, 2); /* 3 QPs, 4 outstanding WRs each */
    for (int i = 0; i < 20; i++)
        assert_int_equal(kvt_verbs_paths_enqueue(&p, &sl[i]), KVT_OK);
    for (int i = 0; i < 20; i++)
        assert_int_equal(sl[i].qp, i % 3); /* slice-level round-robin */
    assert_int_equal(p.path[0].queued, 7);
    assert_int_equal(p.path[1].queued, 7);
    assert_int_equal(p.path[2].queued, 6);

    /* batch of 3 (chain length), then only 1 more credit */
    n = kvt_verbs_paths_take(&p, 0, 3, out);
    assert_int_equal(n, 3);
    assert_ptr_equal(out[0], &sl[0]);
    assert_ptr_equal(out[1], &sl[3]);
    assert_ptr_equal(out[2], &sl[6]);
    assert_int_equal(out[0]->state, KVT_VERBS_SLICE_POSTED);
    n = kvt_verbs_paths_take(&p, 0, 3, out);
    assert_int_equal(n, 1);
    assert_int_equal(p.path[0].outstanding, 4);
    assert_int_equal(kvt_verbs_paths_take(&p, 0, 3, out), 0); /* bounded */
    /* one completion frees one credit */
    assert_int_equal(kvt_verbs_paths_complete(&p, &sl[0], true, false, &ab), KVT_VERBS_WC_DONE);
    assert_null(ab);
    assert_int_equal(sl[0].state, KVT_VERBS_SLICE_DONE);
    n = kvt_verbs_paths_take(&p, 0, 16, out);
    assert_int_equal(n, 1);
    assert_ptr_equal(out[0], &sl[12]);
    /* other paths are independent */
    assert_int_equal(kvt_verbs_paths_take(&p, 2, 16, out), 4);
    assert_int_equal(p.path[2].queued, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous_pages_coalesce_then_slice),
        cmocka_unit_test(test_scattered_pages_stay_separate),
        cmocka_unit_test(test_slices_never_cross_mr_boundaries),
        cmocka_unit_test(test_out_of_region_is_refused),
        cmocka_unit_test(test_chain_build),
        cmocka_unit_test(test_round_robin_and_credit_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
