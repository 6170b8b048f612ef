/*
 * test_kvctl_timers.c - the KV control service runs on timers, not on a poll tick: an idle
 * service sleeps with no timeout; a ProxyNotif wait's deadline is a timer of its own that
 * fires when a test clock reaches it, not a tick before, with the thread asleep until then;
 * an attempt that ends takes its timer out of the heap; expiring one wait among thousands
 * runs one timer, not a walk; tombstones expire on the clock; and a server's services are
 * its own (no list of every service).
 *
 * The clock is the injectable one (pdgw_kvctl_open); it stands still until a test moves it,
 * then kicks the thread, the way a clock that moved would have woken it. Every wait is on a
 * condition (the thread's last turn, its planned sleep), bounded by WAIT_MS of wall time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>

#include <cmocka.h>

#include <pdgw/forwarder.h>

#include "pdgw_kvctl.h"

#define WAIT_MS 20000 /* generous: only a broken service ever waits this long */
#define T0_MS   1000000

static atomic_ullong fake_ns;

static uint64_t fake_now(void *arg)
{
    (void)arg;
    return atomic_load(&fake_ns);
}

static const pdb_clock_t fake_clock = {.now = fake_now, .arg = NULL};

static const pdgw_instance_t p_local = {.id = "p-local", .host = "127.0.0.1", .kv_host = ""};

static int64_t fake_ms(void)
{
    return (int64_t)(atomic_load(&fake_ns) / PDB_NSEC_PER_MSEC);
}

static pdgw_fwd_kv_svc_t *open_in(pdgw_fwd_kv_svcs_t *set, const char *opts_json)
{
    json_t *opts = json_loads(opts_json, 0, NULL);
    pdgw_fwd_env_t env = {.protocol = "test-kv", .kv_svcs = set};
    pdgw_fwd_kv_opts_t o;
    pdgw_fwd_kv_svc_t *kv = NULL;
    char err[256] = "";
    assert_non_null(opts);
    assert_int_equal(pdgw_fwd_kv_opts_parse(opts, 0, 1, &o, err, sizeof(err)), PDGW_FWD_OK);
    json_decref(opts);
    assert_int_equal(pdgw_kvctl_open(&env, &o, &fake_clock, &kv, err, sizeof(err)), PDGW_FWD_OK);
    return kv;
}

/* A service on the fake clock, set back to T0_MS. */
static pdgw_fwd_kv_svc_t *svc_open(const char *opts_json)
{
    atomic_store(&fake_ns, (unsigned long long)T0_MS * PDB_NSEC_PER_MSEC);
    return open_in(NULL, opts_json);
}

static pdgw_fwd_request_t request(const char *id)
{
    pdgw_fwd_request_t r;
    memset(&r, 0, sizeof(r));
    r.request_id = id;
    r.mode = PDGW_MODE_BATCH;
    r.prompt_tokens = 10;
    return r;
}

static void pause_1ms(void)
{
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Wait until the thread has run its timers at the fake clock's time and gone back to sleep
 * planning to look again at <sleep_until> (KVCTL_NEVER: no timeout). */
static void settled(pdgw_fwd_kv_svc_t *kv, int64_t sleep_until)
{
    int64_t end = pdgw_fwd_now_ms() + WAIT_MS, now = fake_ms();
    int ok = 0;
    while (!ok && pdgw_fwd_now_ms() < end) {
        pthread_mutex_lock(&kv->lock);
        ok = kv->turn_ms >= now && kv->jobs == NULL && kv->sleep_until == sleep_until;
        pthread_mutex_unlock(&kv->lock);
        if (!ok)
            pause_1ms();
    }
    pthread_mutex_lock(&kv->lock);
    if (!ok)
        print_message("turn at %lld (clock %lld), sleeps until %lld, wanted %lld\n",
                      (long long)kv->turn_ms, (long long)now, (long long)kv->sleep_until,
                      (long long)sleep_until);
    pthread_mutex_unlock(&kv->lock);
    assert_true(ok);
}

/* Move the fake clock by <ms> and tell the thread. */
static void advance(pdgw_fwd_kv_svc_t *kv, int64_t ms)
{
    atomic_fetch_add(&fake_ns, (unsigned long long)ms * PDB_NSEC_PER_MSEC);
    pdgw_kvctl_kick(kv);
}

static int timed_out(pdgw_fwd_kv_svc_t *kv, pdgw_fwd_kv_req_t *q)
{
    int t;
    pthread_mutex_lock(&kv->lock);
    t = q->notif_timed_out;
    pthread_mutex_unlock(&kv->lock);
    return t;
}

static uint64_t fired(pdgw_fwd_kv_svc_t *kv)
{
    uint64_t n;
    pthread_mutex_lock(&kv->lock);
    n = kv->timers_fired;
    pthread_mutex_unlock(&kv->lock);
    return n;
}

/* With nothing armed the thread sleeps with no timeout at all (a poll floor would have it
 * wake every few milliseconds to look). */
static void test_idle_sleeps_without_timeout(void **state)
{
    pdgw_fwd_kv_svc_t *kv = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0}");
    (void)state;
    pdgw_kvctl_kick(kv);
    settled(kv, KVCTL_NEVER);
    pthread_mutex_lock(&kv->client_lock);
    assert_true(kv->res_sleep_until == KVCTL_NEVER);
    pthread_mutex_unlock(&kv->client_lock);
    pdgw_fwd_kv_svc_close(kv);
}

/* A wait's deadline is its own timer: the thread sleeps exactly until it, it does not fire a
 * millisecond early, and it fires (the thread, not the gate, marks it) when the clock gets
 * there; the gate then answers 504. */
static void test_notif_deadline_fires_on_clock(void **state)
{
    pdgw_fwd_kv_svc_t *kv = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                     "\"notif_timeout_ms\":1000}");
    pdgw_fwd_request_t r = request("req-deadline");
    pdgw_fwd_kv_req_t *q = pdgw_fwd_kv_req_new(kv, &r, r.request_id);
    pdgw_fwd_error_t e;
    (void)state;
    memset(&e, 0, sizeof(e));
    pdgw_fwd_kv_req_expect_notifs(q, 1, &p_local);
    assert_false(pdb_timer_armed(&q->notif_timer)); /* armed by the gate's wait, not before */
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q, &r, 1, &e), PDGW_FWD_PENDING);
    pthread_mutex_lock(&kv->lock);
    assert_true(pdb_timer_armed(&q->notif_timer));
    assert_int_equal((int64_t)q->notif_timer.due, T0_MS + 1000);
    pthread_mutex_unlock(&kv->lock);
    settled(kv, T0_MS + 1000); /* the arm kicked it: it sleeps until the deadline */

    advance(kv, 999);
    settled(kv, T0_MS + 1000);
    assert_false(timed_out(kv, q));
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q, &r, 1, &e), PDGW_FWD_PENDING);

    advance(kv, 1);
    settled(kv, KVCTL_NEVER);
    assert_true(timed_out(kv, q));
    assert_int_equal(fired(kv), 1);
    assert_false(pdb_timer_armed(&q->notif_timer));
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q, &r, 1, &e), PDGW_FWD_ERR);
    assert_int_equal(e.http_status, 504);
    pdgw_fwd_kv_req_end(q, PDGW_END_FAILED);
    pdgw_fwd_kv_svc_close(kv);
}

/* An attempt that ends while its gate waits takes its deadline out of the heap: nothing fires
 * for it later, and only the tombstones' timer stays armed. */
static void test_ended_wait_removes_its_timer(void **state)
{
    pdgw_fwd_kv_svc_t *kv = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                     "\"notif_timeout_ms\":1000}");
    pdgw_fwd_request_t r = request("req-ended");
    pdgw_fwd_kv_req_t *q = pdgw_fwd_kv_req_new(kv, &r, r.request_id);
    pdgw_fwd_error_t e;
    (void)state;
    memset(&e, 0, sizeof(e));
    pdgw_fwd_kv_req_expect_notifs(q, 1, &p_local);
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(q, &r, 1, &e), PDGW_FWD_PENDING);
    atomic_fetch_add(&q->refs, 1); /* keep it readable after its end */
    pdgw_fwd_kv_req_end(q, PDGW_END_CANCELLED);
    pthread_mutex_lock(&kv->lock);
    assert_false(pdb_timer_armed(&q->notif_timer));
    assert_int_equal(pdb_timers_count(&kv->timers), 1);
    assert_true(pdb_timer_armed(&kv->tomb_timer));
    pthread_mutex_unlock(&kv->lock);
    advance(kv, 5000);
    settled(kv, T0_MS + KVCTL_TOMB_TTL_MS + 1);
    assert_int_equal(fired(kv), 0);
    pdgw_kvctl_req_unref(q);
    pdgw_fwd_kv_svc_close(kv);
}

/* Thousands of waiters: each is one timer, and the one whose deadline comes is the only one
 * run (a walk of the waiters would visit them all); the others stay armed. */
static void test_one_expiry_among_many(void **state)
{
    enum { N = 5000 };
    pdgw_fwd_kv_svc_t *kv = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0,"
                                     "\"notif_timeout_ms\":600000}");
    static pdgw_fwd_kv_req_t *qs[N];
    pdgw_fwd_kv_opts_t o;
    pdgw_fwd_request_t r = request("req-soon");
    pdgw_fwd_kv_req_t *soon;
    pdgw_fwd_error_t e;
    (void)state;
    memset(&e, 0, sizeof(e));
    for (int i = 0; i < N; i++) {
        char id[32];
        pdgw_fwd_request_t ri;
        snprintf(id, sizeof(id), "req-late-%d", i);
        ri = request(id);
        qs[i] = pdgw_fwd_kv_req_new(kv, &ri, ri.request_id);
        assert_non_null(qs[i]);
        pdgw_fwd_kv_req_expect_notifs(qs[i], 1, &p_local);
        assert_int_equal(pdgw_fwd_kv_req_wait_notifs(qs[i], &ri, 1, &e), PDGW_FWD_PENDING);
    }
    o = kv->o; /* a shorter deadline for the next wait (a reload's live option) */
    o.notif_timeout_ms = 10;
    pdgw_kvctl_apply(kv, &o);
    soon = pdgw_fwd_kv_req_new(kv, &r, r.request_id);
    pdgw_fwd_kv_req_expect_notifs(soon, 1, &p_local);
    assert_int_equal(pdgw_fwd_kv_req_wait_notifs(soon, &r, 1, &e), PDGW_FWD_PENDING);
    settled(kv, T0_MS + 10); /* sooner than its sleep: the arm kicked it */

    advance(kv, 10);
    settled(kv, T0_MS + 600000);
    assert_true(timed_out(kv, soon));
    assert_int_equal(fired(kv), 1);
    pthread_mutex_lock(&kv->lock);
    assert_int_equal(pdb_timers_count(&kv->timers), N);
    for (int i = 0; i < N; i++)
        assert_false(qs[i]->notif_timed_out);
    pthread_mutex_unlock(&kv->lock);
    for (int i = 0; i < N; i++)
        pdgw_fwd_kv_req_end(qs[i], PDGW_END_OK);
    pdgw_fwd_kv_req_end(soon, PDGW_END_FAILED);
    pdgw_fwd_kv_svc_close(kv);
}

/* A tombstone goes when it is older than KVCTL_TOMB_TTL_MS on the clock, by its timer. */
static void test_tombs_expire_on_clock(void **state)
{
    pdgw_fwd_kv_svc_t *kv = svc_open("{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0}");
    pdgw_fwd_request_t r = request("req-tomb");
    pdgw_fwd_kv_req_t *q = pdgw_fwd_kv_req_new(kv, &r, r.request_id);
    (void)state;
    pdgw_fwd_kv_req_expect_notifs(q, 1, &p_local);
    pdgw_fwd_kv_req_end(q, PDGW_END_OK);
    pdgw_kvctl_kick(kv);
    settled(kv, T0_MS + KVCTL_TOMB_TTL_MS + 1);
    advance(kv, KVCTL_TOMB_TTL_MS);
    settled(kv, T0_MS + KVCTL_TOMB_TTL_MS + 1);
    pthread_mutex_lock(&kv->lock);
    assert_non_null(pdgw_kvctl_tomb_find_locked(kv, "req-tomb"));
    pthread_mutex_unlock(&kv->lock);
    advance(kv, 1);
    settled(kv, KVCTL_NEVER);
    pthread_mutex_lock(&kv->lock);
    assert_null(pdgw_kvctl_tomb_find_locked(kv, "req-tomb"));
    assert_int_equal(kv->n_tombs, 0);
    assert_false(pdb_timer_armed(&kv->tomb_timer));
    pthread_mutex_unlock(&kv->lock);
    pdgw_fwd_kv_svc_close(kv);
}

/* Each server's services are its own: stopping one set leaves another's running, and a
 * service that closes leaves its set. */
static void test_sets_are_separate(void **state)
{
    pdgw_fwd_kv_svcs_t *a = pdgw_kvctl_svcs_create(), *b = pdgw_kvctl_svcs_create();
    pdgw_fwd_kv_svc_t *ka, *kb;
    (void)state;
    assert_non_null(a);
    assert_non_null(b);
    ka = open_in(a, "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0}");
    kb = open_in(b, "{\"proxy_host\":\"127.0.0.1\",\"proxy_port\":0}");
    assert_true(pdgw_kvctl_svcs_any(a));
    pdgw_kvctl_svcs_stop(a);
    assert_int_equal(ka->started, 0);
    assert_int_equal(kb->started, 1);
    pdgw_fwd_kv_svc_close(ka);
    assert_false(pdgw_kvctl_svcs_any(a));
    assert_true(pdgw_kvctl_svcs_any(b));
    pdgw_kvctl_svcs_destroy(b); /* before its service closes: that close leaves it alone */
    pdgw_fwd_kv_svc_close(kb);
    pdgw_kvctl_svcs_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_sleeps_without_timeout),
        cmocka_unit_test(test_notif_deadline_fires_on_clock),
        cmocka_unit_test(test_ended_wait_removes_its_timer),
        cmocka_unit_test(test_one_expiry_among_many),
        cmocka_unit_test(test_tombs_expire_on_clock),
        cmocka_unit_test(test_sets_are_separate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
