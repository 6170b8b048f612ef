/*
 * The libkvt transport conformance suite (test_conformance.c: every registered transport x
 * {push, pull-eager, pull-delay} through the whole engine, every byte verified) run with the
 * fake RDMA device of test_verbs_fake_nic.h, so the verbs transport goes through the same suite
 * as TCP -- engine handshake on the init port included -- on hosts without RDMA.
 */
#define main kvt_conformance_main
#include "test_conformance.c"
#undef main

#include "test_verbs_fake_nic.h"

int main(void)
{
    fk.max_mr_size = 1u << 20; /* pools span several MRs */
    fk.max_qp_wr = 1024;
    int rc = kvt_conformance_main();

    if (fk.violations != 0) {
        fprintf(stderr, "fake NIC violations: %u (last: %s)\n", fk.violations, fk.last_violation);
        return 1;
    }
    if (fk.bad_transitions != 0) {
        fprintf(stderr, "bad QP transitions: %u\n", fk.bad_transitions);
        return 1;
    }
    return rc;
}
