/*
 * test_conformance.c - every registered transport x {push, pull-eager,
 * pull-delay} through the whole engine: random request sizes split into
 * layer-wise batches, short last chunks, every byte verified on the
 * receiver, both pools back to zero used/pinned pages at the end.
 * A transport whose create says KVT_ERR_UNSUPPORTED (e.g. no RDMA device)
 * is skipped with one line.
 */
#include "test_engine_common.h"
#include "kvt_transport.h"

typedef struct conf_case {
    const char *transport;
    t_mode_t mode;
    char name[96];
} conf_case_t;

static const char *mode_name(t_mode_t m)
{
    return m == MODE_PUSH ? "push" : m == MODE_PULL_EAGER ? "pull-eager" : "pull-delay";
}

static void run_round(t_pair_t *p, t_mode_t mode, unsigned *seed, int round)
{
    char req[64];
    uint32_t n = 1 + (uint32_t)(rand_r(seed) % 24);
    uint32_t nb = 1 + (uint32_t)(rand_r(seed) % 3);
    int64_t last_toks = 1 + rand_r(seed) % T_TOKS;
    kvt_task_id_t ids[4];
    uint32_t first = 0;
    char **keys;
    kvt_task_result_t res;
    kvt_task_id_t wid, lid;
    uint8_t **bufs;
    size_t *caps, *lens;

    snprintf(req, sizeof(req), "conf-%s-%d", mode_name(mode), round);
    keys = t_keys(req, n);
    if (nb > n)
        nb = n;
    /* layer-wise: parts go out as they are submitted; the last one closes */
    for (uint32_t b = 0; b < nb; b++) {
        uint32_t cnt = (b + 1 == nb) ? n - first : n / nb;
        kvt_status_t st;
        ids[b] =
            t_store(p->s, req, keys, first, cnt, b + 1 == nb ? last_toks : 0, b + 1 == nb, n, &st);
        assert_int_equal(st, KVT_OK);
        first += cnt;
    }
    for (uint32_t b = 0; b < nb; b++) {
        assert_int_equal(t_wait(p->s, ids[b], 10000, &res), KVT_OK);
        assert_int_equal(res.status, KVT_OK);
        assert_int_equal(t_bits(&res), (int)res.nkeys);
        kvt_task_result_clear(&res);
    }
    assert_int_equal(kvt_submit_wait_req(p->r, req, 10000, NULL, &wid), KVT_OK);
    assert_int_equal(t_wait(p->r, wid, 11000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    kvt_task_result_clear(&res);

    bufs = calloc(n, sizeof(*bufs));
    caps = calloc(n, sizeof(*caps));
    lens = calloc(n, sizeof(*lens));
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = calloc(1, T_PAGE);
        caps[i] = T_PAGE;
    }
    assert_int_equal(kvt_submit_load(p->r, (const char *const *)keys, (void *const *)bufs, caps,
                                     lens, n, NULL, &lid),
                     KVT_OK);
    assert_int_equal(t_wait(p->r, lid, 10000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(t_bits(&res), (int)n);
    for (uint32_t i = 0; i < n; i++) {
        size_t want = i + 1 == n ? t_chunk_len(last_toks) : T_PAGE;
        assert_int_equal(lens[i], want);
        assert_true(t_check(keys[i], bufs[i], want));
        free(bufs[i]);
    }
    kvt_task_result_clear(&res);
    free(bufs);
    free(caps);
    free(lens);
    kvt_release_req(p->r, req);
    t_keys_free(keys, n);
}

static void test_case(void **state)
{
    conf_case_t *c = *state;
    t_pair_t p;
    kvt_status_t st;
    unsigned seed = 1234u + (unsigned)c->mode * 7u;
    kvt_metrics_t sm, rm;

    st = t_pair_open(&p, c->mode, 64 * T_PAGE, 64 * T_PAGE, c->transport);
    if (st == KVT_ERR_UNSUPPORTED) {
        /* one line per transport, not per case */
        static const char *reported[8];
        int seen = 0;
        for (int i = 0; i < 8 && reported[i] != NULL; i++)
            seen |= strcmp(reported[i], c->transport) == 0;
        for (int i = 0; i < 8 && !seen; i++) {
            if (reported[i] == NULL) {
                reported[i] = c->transport;
                printf("SKIP %s: not available on this host (create returned %s)\n",
                       c->transport, kvt_status_name(st));
                break;
            }
        }
        skip();
    }
    assert_int_equal(st, KVT_OK);
    for (int round = 0; round < 6; round++)
        run_round(&p, c->mode, &seed, round);
    assert_true(t_pool_drained(p.s, 5000));
    assert_true(t_pool_drained(p.r, 5000));
    kvt_engine_metrics(p.s, &sm);
    kvt_engine_metrics(p.r, &rm);
    if (c->mode == MODE_PUSH) {
        assert_true(sm.bytes_write > 0);
        assert_int_equal(rm.bytes_read, 0);
    } else {
        assert_int_equal(sm.bytes_write, 0);
        assert_true(rm.bytes_read > 0);
    }
    assert_true(sm.proxy_notifs_total == 0); /* no proxy configured */
    assert_int_equal(sm.transfer_errors_total, 0);
    assert_int_equal(rm.transfer_errors_total, 0);
    t_pair_close(&p);
}

int main(void)
{
    const kvt_transport_desc_t *tl[8];
    size_t nt = kvt_transport_list(tl, 8);
    struct CMUnitTest tests[8 * 3];
    conf_case_t cases[8 * 3];
    size_t n = 0;

    for (size_t i = 0; i < nt && i < 8; i++) {
        for (int m = 0; m < 3; m++) {
            conf_case_t *c = &cases[n];
            c->transport = tl[i]->name;
            c->mode = (t_mode_t)m;
            snprintf(c->name, sizeof(c->name), "%s x %s", c->transport, mode_name(c->mode));
            tests[n] =
                (struct CMUnitTest){.name = c->name, .test_func = test_case, .initial_state = c};
            n++;
        }
    }
    return _cmocka_run_group_tests("conformance", tests, n, NULL, NULL);
}
