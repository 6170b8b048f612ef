/*
 * The verbs handshake blob (libkvt TransportInit with transport "verbs"): round
 * trip of QP and port data and multi-MR regions, and rejection of everything
 * malformed a peer could send.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kvt/kvt_msg.h"
#include "kvt_verbs_int.h"

#define GIB (1ull << 30)
static const char *UA = "aaaaaaaa-0000-4000-8000-000000000001";
static const char *UB = "bbbbbbbb-0000-4000-8000-000000000002";

static void make_hs(kvt_verbs_hs_t *hs)
{
    memset(hs, 0, sizeof(*hs));
    strcpy(hs->id, "decode-0");
    hs->epoch = 0x123456789abcdefull;
    hs->port.lid = 0;
    hs->port.mtu = IBV_MTU_4096;
    for (int i = 0; i < 16; i++)
        hs->port.gid[i] = (uint8_t)(i * 17);
    hs->nqps = 3;
    for (uint32_t i = 0; i < 3; i++) {
        hs->qps[i].qpn = 0x100 + i;
        hs->qps[i].psn = 0xabc000 + i;
    }
    hs->regions = calloc(2, sizeof(*hs->regions));
    assert_non_null(hs->regions);
    hs->nregions = 2;
    assert_int_equal(
        kvt_verbs_mr_map_init(&hs->regions[0], UA, 0x7f0000000000ull, 5 * GIB + 12, 2 * GIB),
        KVT_OK);
    for (uint32_t k = 0; k < hs->regions[0].nkeys; k++)
        hs->regions[0].keys[k] = 0x1000 + k;
    assert_int_equal(kvt_verbs_mr_map_init(&hs->regions[1], UB, 0x10000, 4096, 0), KVT_OK);
    hs->regions[1].keys[0] = 0xffffffffu;
}

static void free_hs(kvt_verbs_hs_t *hs)
{
    for (uint32_t i = 0; i < hs->nregions; i++)
        kvt_verbs_mr_map_clear(&hs->regions[i]);
    free(hs->regions);
}

static void test_round_trip(void **state)
{
    kvt_verbs_hs_t in, out;
    void *buf = NULL;
    size_t len = 0;
    const kvt_verbs_mr_map_t *a, *b;

    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    assert_true(len > 0 && len < KVT_VERBS_MAX_QPS * 4096);
    assert_int_equal(kvt_verbs_hs_decode(buf, len, &out), KVT_OK);
    assert_string_equal(out.id, "decode-0");
    assert_int_equal(out.epoch, 0x123456789abcdefull);
    assert_int_equal(out.nqps, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(out.qps[i].qpn, 0x100 + i);
        assert_int_equal(out.qps[i].psn, 0xabc000 + i);
    }
    assert_int_equal(out.port.mtu, IBV_MTU_4096);
    assert_memory_equal(out.port.gid, in.port.gid, 16);
    assert_int_equal(out.nregions, 2);
    a = kvt_verbs_hs_region(&out, UA);
    b = kvt_verbs_hs_region(&out, UB);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(kvt_verbs_hs_region(&out, "cccccccc-0000-4000-8000-000000000003"));
    assert_int_equal(a->base, 0x7f0000000000ull);
    assert_int_equal(a->len, 5 * GIB + 12);
    assert_int_equal(a->chunk_size, 2 * GIB);
    assert_int_equal(a->nkeys, 3);
    assert_int_equal(a->keys[0], 0x1000);
    assert_int_equal(a->keys[2], 0x1002);
    assert_int_equal(b->len, 4096);
    assert_int_equal(b->nkeys, 1);
    assert_int_equal(b->keys[0], 0xffffffffu);
    kvt_verbs_hs_clear(&out);
    kvt_free(buf);
    free_hs(&in);
}

/* The blob really is a TransportInit others can read: one lane per QP, one
 * region per MR. */
static void test_blob_is_transport_init(void **state)
{
    kvt_verbs_hs_t in;
    kvt_msg_t m;
    void *buf = NULL;
    size_t len = 0;
    char gid[40];

    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    assert_int_equal(kvt_msg_decode(buf, len, &m, NULL), KVT_OK);
    assert_int_equal(m.type, KVT_MSG_TRANSPORT_INIT);
    assert_string_equal(m.u.tinit.transport, "verbs");
    assert_string_equal(m.u.tinit.node_id, "decode-0");
    assert_int_equal(m.u.tinit.nlanes, 3);
    assert_int_equal(m.u.tinit.lanes[1].qp_num, 0x101);
    assert_int_equal(m.u.tinit.lanes[1].mtu, 4096);
    kvt_verbs_gid_format(in.port.gid, gid);
    assert_string_equal(m.u.tinit.lanes[2].gid, gid);
    assert_string_equal(gid, "0011:2233:4455:6677:8899:aabb:ccdd:eeff");
    assert_int_equal(m.u.tinit.nregions, 4); /* 3 MRs + 1 MR */
    assert_int_equal(m.u.tinit.regions[1].addr, 0x7f0000000000ull + 2 * GIB);
    assert_int_equal(m.u.tinit.regions[2].length, GIB + 12);
    kvt_msg_clear(&m);
    kvt_free(buf);
    free_hs(&in);
}

typedef void (*mutate_fn)(kvt_msg_t *m);

/* Encode a good handshake, decode it generically, break one thing, re-encode,
 * expect the verbs decoder to refuse it without leaking. */
static void expect_rejected(mutate_fn fn)
{
    kvt_verbs_hs_t in, out;
    kvt_msg_t m;
    void *buf = NULL, *bad = NULL;
    size_t len = 0, blen = 0;

    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    assert_int_equal(kvt_msg_decode(buf, len, &m, NULL), KVT_OK);
    fn(&m);
    assert_int_equal(kvt_msg_encode(&m, &bad, &blen), KVT_OK);
    memset(&out, 0x5a, sizeof(out));
    assert_true(kvt_verbs_hs_decode(bad, blen, &out) < 0);
    kvt_msg_clear(&m);
    kvt_free(bad);
    kvt_free(buf);
    free_hs(&in);
}

static void m_transport(kvt_msg_t *m)
{
    kvt_msg_set_str(&m->u.tinit.transport, "tcp");
}
static void m_no_lanes(kvt_msg_t *m)
{
    m->u.tinit.nlanes = 0;
}
static void m_bad_gid(kvt_msg_t *m)
{
    kvt_msg_set_str(&m->u.tinit.lanes[0].gid, "0011:2233:4455:6677:8899:aabb:ccdd:eefg");
}
static void m_short_gid(kvt_msg_t *m)
{
    kvt_msg_set_str(&m->u.tinit.lanes[1].gid, "fe80::1");
}
static void m_qpn_range(kvt_msg_t *m)
{
    m->u.tinit.lanes[0].qp_num = 0x1000000;
}
static void m_psn_negative(kvt_msg_t *m)
{
    m->u.tinit.lanes[2].psn = -1;
}
static void m_bad_mtu(kvt_msg_t *m)
{
    m->u.tinit.lanes[0].mtu = 1500;
}
static void m_lanes_disagree(kvt_msg_t *m)
{
    m->u.tinit.lanes[2].mtu = 1024; /* QPs of one port share the MTU */
}
static void m_gap_between_mrs(kvt_msg_t *m)
{
    m->u.tinit.regions[1].addr += 4096;
}
static void m_short_middle_mr(kvt_msg_t *m)
{
    m->u.tinit.regions[1].length -= 1;
}
static void m_rkey_range(kvt_msg_t *m)
{
    m->u.tinit.regions[3].rkey = 0x100000000LL;
}
static void m_bad_uuid(kvt_msg_t *m)
{
    kvt_msg_set_str(&m->u.tinit.regions[3].uuid, "not-a-uuid");
}
static void m_dup_region(kvt_msg_t *m)
{
    /* the same uuid again after another region: not one run */
    kvt_msg_set_str(&m->u.tinit.regions[3].uuid, UA);
}
static void m_zero_length(kvt_msg_t *m)
{
    m->u.tinit.regions[3].length = 0;
}
static void m_empty_node(kvt_msg_t *m)
{
    kvt_msg_set_str(&m->u.tinit.node_id, "");
}
static void m_too_many_lanes(kvt_msg_t *m)
{
    kvt_msg_transport_lane_t *l = kvt_calloc(KVT_VERBS_MAX_QPS + 1, sizeof(*l));

    assert_non_null(l);
    for (uint32_t i = 0; i < KVT_VERBS_MAX_QPS + 1; i++) {
        l[i] = m->u.tinit.lanes[0];
        l[i].host = NULL;
        l[i].gid = NULL;
        kvt_msg_set_str(&l[i].gid, m->u.tinit.lanes[0].gid);
    }
    for (uint32_t i = 0; i < m->u.tinit.nlanes; i++) {
        kvt_free(m->u.tinit.lanes[i].gid);
        kvt_free(m->u.tinit.lanes[i].host);
    }
    kvt_free(m->u.tinit.lanes);
    m->u.tinit.lanes = l;
    m->u.tinit.nlanes = KVT_VERBS_MAX_QPS + 1;
}

static void test_rejects_bad_fields(void **state)
{
    expect_rejected(m_transport);
    expect_rejected(m_bad_gid);
    expect_rejected(m_short_gid);
    expect_rejected(m_qpn_range);
    expect_rejected(m_psn_negative);
    expect_rejected(m_bad_mtu);
    expect_rejected(m_lanes_disagree);
    expect_rejected(m_gap_between_mrs);
    expect_rejected(m_short_middle_mr);
    expect_rejected(m_rkey_range);
    expect_rejected(m_bad_uuid);
    expect_rejected(m_dup_region);
    expect_rejected(m_zero_length);
    expect_rejected(m_empty_node);
    expect_rejected(m_too_many_lanes);
}

static void test_rejects_no_lanes(void **state)
{
    /* nlanes = 0 with the array still allocated: kvt_msg_clear frees by count, so
     * free here */
    kvt_verbs_hs_t in, out;
    kvt_msg_t m;
    void *buf = NULL, *bad = NULL;
    size_t len = 0, blen = 0;
    kvt_msg_transport_lane_t *keep;
    uint32_t n;

    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    assert_int_equal(kvt_msg_decode(buf, len, &m, NULL), KVT_OK);
    keep = m.u.tinit.lanes;
    n = m.u.tinit.nlanes;
    m_no_lanes(&m);
    assert_int_equal(kvt_msg_encode(&m, &bad, &blen), KVT_OK);
    assert_int_equal(kvt_verbs_hs_decode(bad, blen, &out), KVT_ERR_MSG_FIELD);
    m.u.tinit.lanes = keep;
    m.u.tinit.nlanes = n;
    kvt_msg_clear(&m);
    kvt_free(bad);
    kvt_free(buf);
    free_hs(&in);
}

static void test_rejects_garbage_and_truncation(void **state)
{
    kvt_verbs_hs_t in, out;
    void *buf = NULL;
    size_t len = 0;
    static const unsigned char junk[] = {0xc1, 0xff, 0x00, 0x93, 0x01};
    kvt_msg_t other;
    void *obuf = NULL;
    size_t olen = 0;

    assert_true(kvt_verbs_hs_decode(junk, sizeof(junk), &out) < 0);
    assert_true(kvt_verbs_hs_decode(junk, 0, &out) < 0);
    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    for (size_t cut = 0; cut < len; cut += 7)
        assert_true(kvt_verbs_hs_decode(buf, cut, &out) < 0);
    /* another message type */
    kvt_msg_init(&other, KVT_MSG_PROXY_NOTIF);
    kvt_msg_set_str(&other.u.proxy_notif.req_id, "r1");
    assert_int_equal(kvt_msg_encode(&other, &obuf, &olen), KVT_OK);
    assert_int_equal(kvt_verbs_hs_decode(obuf, olen, &out), KVT_ERR_MSG_TYPE);
    kvt_msg_clear(&other);
    kvt_free(obuf);
    kvt_free(buf);
    free_hs(&in);
}

static void test_gid_and_mtu_helpers(void **state)
{
    uint8_t g[16], back[16];
    char s[40];

    for (int i = 0; i < 16; i++)
        g[i] = (uint8_t)(255 - i);
    kvt_verbs_gid_format(g, s);
    assert_int_equal(strlen(s), 39);
    assert_int_equal(kvt_verbs_gid_parse(s, back), KVT_OK);
    assert_memory_equal(g, back, 16);
    assert_int_equal(kvt_verbs_gid_parse("FE80:0000:0000:0000:0202:c9ff:fe00:0001", back), KVT_OK);
    assert_int_equal(back[0], 0xfe);
    assert_int_equal(back[15], 0x01);
    assert_int_equal(kvt_verbs_gid_parse("fe80:0000:0000:0000:0202:c9ff:fe00-0001", back),
                     KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_gid_parse(NULL, back), KVT_ERR_INVALID);
    assert_int_equal(kvt_verbs_mtu_bytes(IBV_MTU_256), 256);
    assert_int_equal(kvt_verbs_mtu_bytes(IBV_MTU_4096), 4096);
    assert_int_equal(kvt_verbs_mtu_bytes(0), 0);
    assert_int_equal(kvt_verbs_mtu_enum(2048), IBV_MTU_2048);
    assert_int_equal(kvt_verbs_mtu_enum(9000), 0);
}

/* Random corruption of a valid blob: the decoder answers with a status, never reads out of
 * bounds or leaks (checked under the sanitizers), and what it accepts is self-consistent. */
static void test_random_corruption(void **state)
{
    kvt_verbs_hs_t in, out;
    void *buf = NULL;
    size_t len = 0;
    unsigned seed = 42, accepted = 0;

    make_hs(&in);
    assert_int_equal(kvt_verbs_hs_encode(&in, &buf, &len), KVT_OK);
    for (int round = 0; round < 3000; round++) {
        uint8_t *m = malloc(len);
        int flips = 1 + rand_r(&seed) % 4;

        assert_non_null(m);
        memcpy(m, buf, len);
        for (int f = 0; f < flips; f++)
            m[(size_t)rand_r(&seed) % len] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
        if (kvt_verbs_hs_decode(m, len, &out) == KVT_OK) {
            accepted++;
            assert_true(out.nqps >= 1 && out.nqps <= KVT_VERBS_MAX_QPS);
            for (uint32_t r = 0; r < out.nregions; r++) {
                const kvt_verbs_mr_map_t *map = &out.regions[r];

                assert_int_equal(map->nkeys, kvt_verbs_mr_plan_count(map->len, map->chunk_size));
                assert_true(map->base + map->len >= map->base);
            }
            kvt_verbs_hs_clear(&out);
        }
        free(m);
    }
    assert_true(accepted < 3000); /* most corruptions are caught */
    kvt_free(buf);
    free_hs(&in);
}

/* Every allocation of encode and decode may fail: a clean KVT_ERR_NOMEM (or a decoder status),
 * never a crash or a leak (the sanitizer build checks leaks). */
static void test_allocation_failures(void **state)
{
    kvt_verbs_hs_t in, out;
    void *buf = NULL;
    size_t len = 0;
    int ok_enc = 0, ok_dec = 0;

    make_hs(&in);
    for (uint64_t n = 1; n < 200 && !ok_enc; n++) {
        kvt_status_t st;

        kvt_alloc_fail_at(n, 0);
        st = kvt_verbs_hs_encode(&in, &buf, &len);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK)
            ok_enc = 1;
        else
            assert_int_equal(st, KVT_ERR_NOMEM);
    }
    assert_true(ok_enc);
    for (uint64_t n = 1; n < 400 && !ok_dec; n++) {
        kvt_status_t st;

        kvt_alloc_fail_at(n, 0);
        st = kvt_verbs_hs_decode(buf, len, &out);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK)
            ok_dec = 1;
        else
            assert_true(st < 0);
    }
    assert_true(ok_dec);
    assert_int_equal(out.nregions, 2);
    kvt_verbs_hs_clear(&out);
    kvt_free(buf);
    free_hs(&in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_blob_is_transport_init),
        cmocka_unit_test(test_rejects_bad_fields),
        cmocka_unit_test(test_rejects_no_lanes),
        cmocka_unit_test(test_rejects_garbage_and_truncation),
        cmocka_unit_test(test_gid_and_mtu_helpers),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
