/*
 * Attribute sets and masks of the RC QP transitions RESET -> INIT -> RTR ->
 * RTS, checked field by field (they are what ibv_modify_qp receives on a
 * device).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvt_verbs_int.h"

static void test_reset(void **state)
{
    struct ibv_qp_attr a;
    int mask = 0;

    memset(&a, 0xff, sizeof(a));
    kvt_verbs_qp_attr_reset(&a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_RESET);
    assert_int_equal(mask, IBV_QP_STATE);
}

static void test_init(void **state)
{
    struct ibv_qp_attr a;
    int mask = 0;

    memset(&a, 0xff, sizeof(a));
    kvt_verbs_qp_attr_init(2, &a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_INIT);
    assert_int_equal(a.port_num, 2);
    assert_int_equal(a.pkey_index, 0);
    assert_int_equal(a.qp_access_flags,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    assert_int_equal(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static void fill_ports(kvt_verbs_port_info_t *local, kvt_verbs_port_info_t *remote, bool roce)
{
    memset(local, 0, sizeof(*local));
    memset(remote, 0, sizeof(*remote));
    local->port_num = 1;
    local->gid_index = 3;
    local->lid = roce ? 0 : 5;
    local->mtu = IBV_MTU_4096;
    local->global = roce;
    remote->lid = roce ? 0 : 9;
    remote->mtu = IBV_MTU_1024;
    for (int i = 0; i < 16; i++)
        remote->gid[i] = (uint8_t)(0xa0 + i);
}

static void test_rtr_roce_uses_grh_and_smaller_mtu(void **state)
{
    kvt_verbs_port_info_t l, r;
    kvt_verbs_qp_info_t rq = {.qpn = 0x1234567, .psn = 0xabcdef1};
    kvt_verbs_qp_tun_t t;
    struct ibv_qp_attr a;
    int mask = 0;

    fill_ports(&l, &r, true);
    kvt_verbs_qp_tun_defaults(&t);
    kvt_verbs_qp_attr_rtr(&l, &r, &rq, &t, &a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_RTR);
    assert_int_equal(a.path_mtu, IBV_MTU_1024);
    assert_int_equal(a.dest_qp_num, 0x234567); /* 24 bits */
    assert_int_equal(a.rq_psn, 0xbcdef1);
    assert_int_equal(a.max_dest_rd_atomic, 16);
    assert_int_equal(a.min_rnr_timer, 12);
    assert_int_equal(a.ah_attr.is_global, 1);
    assert_memory_equal(a.ah_attr.grh.dgid.raw, r.gid, 16);
    assert_int_equal(a.ah_attr.grh.sgid_index, 3);
    assert_int_equal(a.ah_attr.grh.hop_limit, 64);
    assert_int_equal(a.ah_attr.port_num, 1);
    assert_int_equal(a.ah_attr.dlid, 0);
    assert_int_equal(mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    /* nothing of RTS leaks into RTR */
    assert_int_equal(mask & (IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT), 0);
}

static void test_rtr_ib_routes_by_lid(void **state)
{
    kvt_verbs_port_info_t l, r;
    kvt_verbs_qp_info_t rq = {.qpn = 77, .psn = 88};
    kvt_verbs_qp_tun_t t;
    struct ibv_qp_attr a;
    int mask = 0;

    fill_ports(&l, &r, false);
    r.mtu = IBV_MTU_4096;
    l.mtu = IBV_MTU_2048;
    kvt_verbs_qp_tun_defaults(&t);
    t.max_rd_atomic = 4;
    kvt_verbs_qp_attr_rtr(&l, &r, &rq, &t, &a, &mask);
    assert_int_equal(a.ah_attr.is_global, 0);
    assert_int_equal(a.ah_attr.dlid, 9);
    assert_int_equal(a.path_mtu, IBV_MTU_2048);
    assert_int_equal(a.dest_qp_num, 77);
    assert_int_equal(a.rq_psn, 88);
    assert_int_equal(a.max_dest_rd_atomic, 4);
}

static void test_rts(void **state)
{
    kvt_verbs_qp_info_t lq = {.qpn = 5, .psn = 0x1fffffe};
    kvt_verbs_qp_tun_t t;
    struct ibv_qp_attr a;
    int mask = 0;

    kvt_verbs_qp_tun_defaults(&t);
    kvt_verbs_qp_attr_rts(&lq, &t, &a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_RTS);
    assert_int_equal(a.sq_psn, 0xfffffe);
    assert_int_equal(a.timeout, 14);
    assert_int_equal(a.retry_cnt, 7);
    assert_int_equal(a.rnr_retry, 7);
    assert_int_equal(a.max_rd_atomic, 16);
    assert_int_equal(mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    assert_int_equal(mask & (IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN), 0);
}

/* The PSN one side sends in RTS is the one the other side expects in RTR. */
static void test_psn_pairing(void **state)
{
    kvt_verbs_port_info_t l, r;
    kvt_verbs_qp_info_t a_qp = {.qpn = 100, .psn = 0x123456}, b_qp = {.qpn = 200, .psn = 0x654321};
    kvt_verbs_qp_tun_t t;
    struct ibv_qp_attr a_rts, b_rtr;
    int m1, m2;

    fill_ports(&l, &r, true);
    kvt_verbs_qp_tun_defaults(&t);
    kvt_verbs_qp_attr_rts(&a_qp, &t, &a_rts, &m1);
    kvt_verbs_qp_attr_rtr(&l, &r, &a_qp, &t, &b_rtr, &m2); /* B's RTR toward A */
    assert_int_equal(a_rts.sq_psn, b_rtr.rq_psn);
    assert_int_equal(b_rtr.dest_qp_num, 100);
    (void)b_qp;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_rtr_roce_uses_grh_and_smaller_mtu),
        cmocka_unit_test(test_rtr_ib_routes_by_lid),
        cmocka_unit_test(test_rts),
        cmocka_unit_test(test_psn_pairing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
