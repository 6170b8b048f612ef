/*
 * test_conn.c - the client connection guard without sockets: the deadline heap keeps the
 * earliest deadline on top through arms, re-arms and disarms; expiry closes exactly the
 * connections whose time passed (and marks a late body 408); the connection limit derived
 * from RLIMIT_NOFILE; the per-address table (cap, release, IPv4-mapped IPv6 counted as
 * IPv4); the accept policy refusing above the worker limit and the address cap, and
 * giving back a reservation MHD never used.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "pdgw_conn.c"

typedef struct {
    pdgw_server_t srv;
    pdgw_worker_t w;
} fixture_t;

static void fixture_init(fixture_t *f)
{
    memset(f, 0, sizeof(*f));
    pdgw_server_opts_init(&f->srv.opts);
    f->srv.opts.metrics = NULL; /* counting is NULL-safe */
    f->srv.conn_limit = 1000;
    f->srv.addrs = pdgw_addr_table_create();
    assert_non_null(f->srv.addrs);
    f->w.srv = &f->srv;
    pdgw_timers_init(&f->w.timers);
}

static void fixture_fini(fixture_t *f)
{
    pdgw_timers_free(&f->w.timers);
    pdgw_addr_table_destroy(f->srv.addrs);
}

static pdgw_conn_t *conn_new(fixture_t *f)
{
    pdgw_conn_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->w = &f->w;
    c->fd = -1;
    pdgw_timer_init(&c->timer, conn_on_deadline);
    c->phase = CONN_HEADERS;
    return c;
}

static void check_heap(const pdgw_worker_t *w)
{
    size_t i;
    for (i = 0; i < w->timers.n; i++) {
        assert_int_equal(w->timers.v[i].t->idx, i);
        if (i > 0)
            assert_true(w->timers.v[(i - 1) / 2].due <= w->timers.v[i].due);
    }
}

static pdgw_conn_t *conn_of_timer(pdgw_timer_t *t)
{
    return (pdgw_conn_t *)(void *)((char *)t - offsetof(pdgw_conn_t, timer));
}

static void test_heap_order_through_arm_and_disarm(void **state)
{
    fixture_t f;
    pdgw_conn_t *c[200];
    uint64_t last = 0;
    size_t i, left = 0;
    (void)state;
    fixture_init(&f);
    srand(7);
    for (i = 0; i < 200; i++) {
        c[i] = conn_new(&f);
        conn_arm(c[i], 1000 + (uint64_t)(rand() % 5000));
        check_heap(&f.w);
    }
    /* Move some, disarm others. */
    for (i = 0; i < 200; i += 3)
        conn_arm(c[i], 1000 + (uint64_t)(rand() % 5000));
    for (i = 1; i < 200; i += 4)
        conn_disarm(c[i]);
    conn_disarm(c[1]); /* twice is harmless */
    check_heap(&f.w);
    for (i = 0; i < 200; i++)
        if (pdgw_timer_armed(&c[i]->timer))
            left++;
    assert_int_equal(f.w.timers.n, left);
    /* Popping through expiry gives non-decreasing deadlines and empties the heap. */
    while (f.w.timers.n > 0) {
        pdgw_conn_t *top = conn_of_timer(f.w.timers.v[0].t);
        uint64_t due = top->timer.due;
        assert_int_equal(pdgw_timers_next(&f.w.timers), (int64_t)due);
        assert_true(due >= last);
        last = due;
        f.w.mhd_kick = false;
        /* with a daemon, MHD runs to see the shut socket; without one (the native front
         * end's worker) nothing would clear the kick, and the worker would poll for good */
        f.w.mhd = (f.w.timers.n % 2) ? (struct MHD_Daemon *)(void *)&f : NULL; /* never used */
        assert_true(pdgw_timers_run(&f.w.timers, due) > 0);
        assert_int_equal(f.w.mhd_kick, f.w.mhd != NULL);
        f.w.mhd = NULL;
        assert_int_equal(top->phase, CONN_CLOSING);
        assert_false(pdgw_timer_armed(&top->timer));
        check_heap(&f.w);
    }
    assert_int_equal(pdgw_timers_next(&f.w.timers), -1);
    for (i = 0; i < 200; i++)
        free(c[i]);
    fixture_fini(&f);
}

static void test_expire_only_due_and_body_is_408(void **state)
{
    fixture_t f;
    pdgw_conn_t *a, *b;
    pdgw_req_t *r = calloc(1, sizeof(*r));
    (void)state;
    fixture_init(&f);
    a = conn_new(&f);
    b = conn_new(&f);
    r->deadline_ms = 500;
    pdgw_conn_headers_done(a, r); /* body phase, deadline 500 */
    conn_arm(b, 900);             /* headers phase */
    assert_int_equal(pdgw_timers_run(&f.w.timers, 499), 0);
    assert_int_equal(pdgw_timers_run(&f.w.timers, 500), 1);
    assert_int_equal(r->final_status, 408);
    assert_non_null(strstr(pdgw_req_error(r), "request body"));
    assert_int_equal(a->phase, CONN_CLOSING);
    assert_int_equal(b->phase, CONN_HEADERS);
    /* A closing connection is not re-armed by the request's end. */
    pdgw_conn_request_done(a);
    assert_false(pdgw_timer_armed(&a->timer));
    /* The body arriving in time disarms. */
    pdgw_conn_body_done(b);
    assert_int_equal(pdgw_timers_next(&f.w.timers), -1);
    /* The next request on a kept-alive connection gets the header deadline again. */
    pdgw_conn_request_done(b);
    assert_int_equal(b->phase, CONN_HEADERS);
    assert_true(pdgw_timers_next(&f.w.timers) >= (int64_t)pdgw_now_ms() + 29000);
    free(a);
    free(b);
    pdgw_free(r->error_text); /* allocated on demand (pdgw_req.c) */
    free(r);
    fixture_fini(&f);
}

static void test_limit_derived_from_nofile(void **state)
{
    (void)state;
    /* (nofile - 64 - 4 x workers) / descriptors per connection, for all workers. */
    assert_int_equal(pdgw_conn_limit_derive(20000, 2, 3), (20000 - 72) / 3);
    /* One leg at a time: the client's socket and one upstream (about 9,950 of 20,000). */
    assert_int_equal(pdgw_conn_limit_derive(20000, 2, 2), (20000 - 72) / 2);
    assert_int_equal(pdgw_conn_limit_derive(256, 1, 3), 62);
    assert_int_equal(pdgw_conn_limit_derive(1024, 4, 3), (1024 - 80) / 3);
    /* A budget too small for the reserve still serves a few clients. */
    assert_int_equal(pdgw_conn_limit_derive(40, 1, 3), 4);
    assert_int_equal(pdgw_conn_limit_derive(0, 0, 0), 4);
}

static void test_address_table_cap_and_mapped_v4(void **state)
{
    pdgw_addr_table_t *t = pdgw_addr_table_create();
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    unsigned char k4[16], k6[16];
    unsigned l4, l6;

    assert_non_null(t); /* the torture run fails this allocation too */
    (void)state;
    memset(&v4, 0, sizeof(v4));
    v4.sin_family = AF_INET;
    v4.sin_addr.s_addr = htonl(0x0a000001); /* 10.0.0.1 */
    memset(&v6, 0, sizeof(v6));
    v6.sin6_family = AF_INET6;
    v6.sin6_addr.s6_addr[10] = 0xff;
    v6.sin6_addr.s6_addr[11] = 0xff;
    memcpy(v6.sin6_addr.s6_addr + 12, &v4.sin_addr, 4); /* ::ffff:10.0.0.1 */
    l4 = addr_key((struct sockaddr *)&v4, sizeof(v4), k4);
    l6 = addr_key((struct sockaddr *)&v6, sizeof(v6), k6);
    assert_int_equal(l4, 4);
    assert_int_equal(l6, 4);
    assert_memory_equal(k4, k6, 4);
    assert_int_equal(addr_key(NULL, 0, k4), 0);
    assert_true(addr_acquire(t, k4, l4, 2));
    assert_true(addr_acquire(t, k6, l6, 2));
    assert_false(addr_acquire(t, k4, l4, 2));
    addr_release(t, k4, l4);
    assert_true(addr_acquire(t, k4, l4, 2));
    addr_release(t, k4, l4);
    addr_release(t, k4, l4);
    addr_release(t, k4, l4); /* below zero is ignored */
    assert_true(addr_acquire(t, k4, l4, 1));
    pdgw_addr_table_destroy(t);
}

static void test_accept_policy(void **state)
{
    fixture_t f;
    struct sockaddr_in a;
    (void)state;
    fixture_init(&f);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000002);
    f.srv.opts.max_connections_per_client = 1;
    assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_YES);
    assert_int_equal(f.w.pending_addr_len, 4);
    /* MHD never announced it (setup failed): the next accept gives the slot back first. */
    assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_YES);
    /* This one was announced: the guard took the address over. */
    {
        pdgw_conn_t *c = conn_new(&f);
        memcpy(c->addr, f.w.pending_addr, f.w.pending_addr_len);
        c->addr_len = f.w.pending_addr_len;
        f.w.pending_addr_len = 0;
        assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_NO);
        addr_release(f.srv.addrs, c->addr, c->addr_len);
        free(c);
    }
    assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_YES);
    pdgw_conn_after_run(&f.w);
    assert_int_equal(f.w.pending_addr_len, 0);
    /* The connection limit counts every worker's connections. */
    f.srv.conn_limit = 2;
    atomic_store(&f.srv.conns_open, 2);
    assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_NO);
    atomic_store(&f.srv.conns_open, 1);
    assert_int_equal(pdgw_conn_accept(&f.w, (struct sockaddr *)&a, sizeof(a)), MHD_YES);
    pdgw_conn_after_run(&f.w);
    fixture_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heap_order_through_arm_and_disarm),
        cmocka_unit_test(test_expire_only_due_and_body_is_408),
        cmocka_unit_test(test_limit_derived_from_nofile),
        cmocka_unit_test(test_address_table_cap_and_mapped_v4),
        cmocka_unit_test(test_accept_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
