/*
 * Path failure and retry bookkeeping: a completion error disables its QP, the
 * slice is retried on another QP up to the retry limit, flushed WRs do not use
 * up retries, and every slice of a transfer ends DONE or ABANDONED exactly
 * once. Driven by a simulated device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvt_verbs_int.h"

#define NSL 64

typedef struct sim {
    kvt_verbs_paths_t paths;
    kvt_verbs_xfer_t x;
    kvt_verbs_slice_t sl[NSL];
    unsigned accounted[NSL]; /* times each slice reached a final state */
    bool finished;
    unsigned finish_calls;
} sim_t;

static void sim_init(sim_t *s, uint32_t nqp, uint32_t max_out, uint32_t retries, size_t nsl)
{
    memset(s, 0, sizeof(*s));
    kvt_verbs_paths_init(&s->paths, nqp, max_out, retries);
    s->x.slices = s->sl;
    s->x.nslices = nsl;
    for (size_t i = 0; i < nsl; i++) {
        s->sl[i].len = 1000;
        s->sl[i].xfer = &s->x;
        assert_int_equal(kvt_verbs_paths_enqueue(&s->paths, &s->sl[i]), KVT_OK);
    }
}

static void sim_settle(sim_t *s, kvt_verbs_slice_t *list, kvt_status_t err)
{
    while (list != NULL) {
        kvt_verbs_slice_t *n = list->next;

        assert_int_equal(list->state, KVT_VERBS_SLICE_ABANDONED);
        s->accounted[list - s->sl]++;
        if (kvt_verbs_xfer_account(&s->x, list, err)) {
            s->finished = true;
            s->finish_calls++;
        }
        list = n;
    }
}

/* Post everything possible, then complete each posted slice: <fail(qp, slice)>
 * decides the status. Returns how many completions were processed. */
typedef int (*verdict_fn)(int qp, size_t idx, unsigned round); /* 0 ok, 1 error, 2 flush */

static unsigned sim_run(sim_t *s, verdict_fn verdict)
{
    unsigned completions = 0;

    for (unsigned round = 0; round < 1000 && !s->finished; round++) {
        kvt_verbs_slice_t *posted[NSL * 2];
        size_t np = 0;

        for (uint32_t q = 0; q < s->paths.npaths; q++)
            np += kvt_verbs_paths_take(&s->paths, q, 8, posted + np);
        if (np == 0)
            break;
        for (size_t i = 0; i < np; i++) {
            kvt_verbs_slice_t *sl = posted[i], *ab = NULL;
            size_t idx = (size_t)(sl - s->sl);
            int v = verdict(sl->qp, idx, round);
            kvt_verbs_wc_action_t a;

            assert_int_equal(sl->state, KVT_VERBS_SLICE_POSTED);
            a = kvt_verbs_paths_complete(&s->paths, sl, v == 0, v == 2, &ab);
            completions++;
            if (a == KVT_VERBS_WC_DONE) {
                s->accounted[idx]++;
                if (kvt_verbs_xfer_account(&s->x, sl, KVT_OK)) {
                    s->finished = true;
                    s->finish_calls++;
                }
            }
            sim_settle(s, ab, KVT_ERR_PEER);
        }
    }
    return completions;
}

static void assert_each_once(const sim_t *s)
{
    for (size_t i = 0; i < s->x.nslices; i++)
        assert_int_equal(s->accounted[i], 1);
    assert_int_equal(s->x.done + s->x.abandoned, s->x.nslices);
    assert_true(s->finished);
    assert_int_equal(s->finish_calls, 1);
}

static int all_ok(int qp, size_t idx, unsigned round)
{
    return 0;
}

static void test_all_ok(void **state)
{
    sim_t s;

    sim_init(&s, 2, 4, 3, 40);
    assert_int_equal(sim_run(&s, all_ok), 40);
    assert_each_once(&s);
    assert_int_equal(s.x.status, KVT_OK);
    assert_int_equal(s.x.bytes_done, 40000);
    assert_int_equal(s.paths.path[0].posted_total, 20);
    assert_int_equal(s.paths.path[1].posted_total, 20);
}

/* QP 1 fails on its first completion; what was posted behind it is flushed. */
static int qp1_breaks(int qp, size_t idx, unsigned round)
{
    static size_t first = (size_t)-1;

    if (qp != 1)
        return 0;
    if (first == (size_t)-1 || first == idx) {
        first = idx;
        return 1;
    }
    return 2;
}

static void test_failed_qp_is_excluded_and_slices_move(void **state)
{
    sim_t s;

    sim_init(&s, 3, 4, 3, 48);
    sim_run(&s, qp1_breaks);
    assert_each_once(&s);
    assert_int_equal(s.x.status, KVT_OK); /* everything landed through QPs 0 and 2 */
    assert_true(s.paths.path[1].failed);
    assert_false(s.paths.path[0].failed);
    assert_int_equal(kvt_verbs_paths_healthy(&s.paths), 2);
    assert_int_equal(s.paths.path[1].posted_total, 4); /* only the first batch ever hit it */
    for (size_t i = 0; i < 48; i++) {
        assert_int_equal(s.sl[i].state, KVT_VERBS_SLICE_DONE);
        assert_int_not_equal(s.sl[i].qp, 1);
    }
    /* the failing slice used one retry, flushed ones none */
    for (size_t i = 0, errs = 0; i < 48; i++) {
        errs += s.sl[i].attempts;
        if (i == 47)
            assert_int_equal(errs, 1);
    }
    /* picking skips the failed path */
    for (int i = 0; i < 6; i++)
        assert_int_not_equal(kvt_verbs_paths_pick(&s.paths), 1);
}

/* Slice 5 fails wherever it goes. */
static int slice5_poisoned(int qp, size_t idx, unsigned round)
{
    return idx == 5 ? 1 : 0;
}

static void test_retry_limit_fails_the_transfer(void **state)
{
    sim_t s;

    sim_init(&s, 4, 64, 2, 16); /* retry limit 2: 3 attempts in all */
    sim_run(&s, slice5_poisoned);
    assert_each_once(&s);
    assert_int_equal(s.sl[5].state, KVT_VERBS_SLICE_ABANDONED);
    assert_int_equal(s.sl[5].attempts, 3);
    assert_int_equal(s.x.abandoned, 1);
    assert_int_equal(s.x.done, 15);
    assert_int_not_equal(s.x.status, KVT_OK);
    assert_int_equal(kvt_verbs_paths_healthy(&s.paths), 1); /* 3 paths burnt by 3 attempts */
}

static int everything_fails(int qp, size_t idx, unsigned round)
{
    return 1;
}

static void test_no_path_left_abandons_everything_once(void **state)
{
    sim_t s;

    sim_init(&s, 2, 3, 10, 30);
    sim_run(&s, everything_fails);
    assert_each_once(&s);
    assert_int_equal(kvt_verbs_paths_healthy(&s.paths), 0);
    assert_int_equal(s.x.done, 0);
    assert_int_equal(s.x.abandoned, 30);
    assert_int_equal(s.x.status, KVT_ERR_PEER);
    assert_int_equal(kvt_verbs_paths_pick(&s.paths), -1);
    {
        kvt_verbs_slice_t extra = {0};

        assert_int_equal(kvt_verbs_paths_enqueue(&s.paths, &extra), KVT_ERR_IO);
    }
}

static void test_post_refused_requeues_on_other_path(void **state)
{
    sim_t s;
    kvt_verbs_slice_t *out[8], *ab = NULL;
    size_t n;

    sim_init(&s, 2, 8, 3, 8); /* 4 per path */
    n = kvt_verbs_paths_take(&s.paths, 0, 8, out);
    assert_int_equal(n, 4);
    /* ibv_post_send took the first one, refused from the second on */
    kvt_verbs_paths_unpost(&s.paths, 0, out + 1, 3, &ab);
    assert_null(ab);
    assert_true(s.paths.path[0].failed);
    assert_int_equal(s.paths.path[0].outstanding, 1);
    assert_int_equal(s.paths.path[1].queued, 7);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(out[i]->qp, 1);
        assert_int_equal(out[i]->state, KVT_VERBS_SLICE_QUEUED);
        assert_int_equal(out[i]->attempts, 0);
    }
    /* the one accepted completes with a flush: it moves too */
    assert_int_equal(kvt_verbs_paths_complete(&s.paths, out[0], false, true, &ab),
                     KVT_VERBS_WC_RETRY);
    assert_int_equal(s.paths.path[0].outstanding, 0);
    assert_int_equal(s.paths.path[1].queued, 8);
    sim_run(&s, all_ok);
    assert_each_once(&s);
    assert_int_equal(s.x.status, KVT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_ok),
        cmocka_unit_test(test_failed_qp_is_excluded_and_slices_move),
        cmocka_unit_test(test_retry_limit_fails_the_transfer),
        cmocka_unit_test(test_no_path_left_abandons_everything_once),
        cmocka_unit_test(test_post_refused_requeues_on_other_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
