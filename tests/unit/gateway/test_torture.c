/*
 * test_torture.c - the request path under failure: a serial PD workflow (prefill leg, decode
 * leg) through an in-process gateway to in-process fake engines, run once for every N with
 * the gateway's Nth allocation failing (pdgw_alloc_fail_at), stream and non-stream; then
 * clients that give up at every stage of a request (before the prefill answers, between the
 * legs, mid-stream). After each request the gateway must be idle again (no request in
 * flight), every forwarder attempt cleaned up exactly once, and a normal request must still
 * succeed; leaks and uses after free are the sanitizer build's to report (the request objects
 * are recycled through free lists that poison listed objects).
 *
 * The gateway's own allocations and its JSON trees' (jansson) go through the failing wrapper.
 * The client uses plain sockets and the fake engine no JSON library, so the Nth allocation is
 * always one of the gateway's.
 * A failed allocation may show as any error status or as a closed connection; what is checked
 * is that the request ends and leaves nothing behind. The runs are made once with the worker's
 * free lists warm and once with them bypassed, so the request and workflow objects' own
 * allocations fail in turn too (a workflow object that cannot be had is a clean 503).
 * Everything runs once through each front end (libmicrohttpd, and pdgw's own).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "pdgw_alloc.h"
#include "pdgw_freelist.h"
#include "pdgw_log.h"
#include "pdgw_registry.h"
#include "pdgw_server.h"
#include "pdgw_wiring.h"
#include "pdgw_server_int.h" /* the worker's free lists (counters) */

/* ---------------------------------------------------------------- fake engine */

/* One engine plays prefill and decode. Its answers wait <engine_delay_ms> so clients can give
 * up while a leg runs; a stream sends its events one by one with the same pause. */
static int engine_delay_ms;

typedef struct fake_conn {
    char *body;
    size_t len;
    int stream_pos; /* events sent (stream) */
} fake_conn_t;

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    if (ms > 0)
        nanosleep(&ts, NULL);
}

/* A long stream for the slow-client test: BIG_EVENTS events of BIG_EVENT_BYTES each, then
 * [DONE]; big_produced counts the events the engine got to write. */
#define BIG_EVENTS      8192
#define BIG_EVENT_BYTES 8192
static atomic_int big_produced;

static ssize_t big_stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    fake_conn_t *fc = cls;
    int n;
    (void)pos;
    if (fc->stream_pos > BIG_EVENTS)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (fc->stream_pos == BIG_EVENTS) {
        fc->stream_pos++;
        memcpy(buf, "data: [DONE]\n\n", 14);
        return 14;
    }
    if (max < BIG_EVENT_BYTES)
        return 0; /* MHD calls again with room */
    /* data: {"i":<n>,"pad":"xxx..."}\n\n, exactly BIG_EVENT_BYTES long */
    n = snprintf(buf, max, "data: {\"i\":%06d,\"pad\":\"", fc->stream_pos);
    memset(buf + n, 'x', (size_t)(BIG_EVENT_BYTES - n - 4));
    memcpy(buf + BIG_EVENT_BYTES - 4, "\"}\n\n", 4);
    fc->stream_pos++;
    atomic_fetch_add(&big_produced, 1);
    return BIG_EVENT_BYTES;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    fake_conn_t *fc = cls;
    static const char *const ev[] = {"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
                                     "data: {\"choices\":[{\"text\":\"b\"}]}\n\n",
                                     "data: [DONE]\n\n"};
    size_t n;
    (void)pos;
    if (fc->stream_pos >= 3)
        return MHD_CONTENT_READER_END_OF_STREAM;
    pause_ms(engine_delay_ms / 2);
    n = strlen(ev[fc->stream_pos]);
    if (n > max)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    memcpy(buf, ev[fc->stream_pos++], n);
    return (ssize_t)n;
}

static enum MHD_Result fake_access(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls)
{
    fake_conn_t *fc = *con_cls;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    int prefill, stream;
    (void)cls;
    (void)url;
    (void)method;
    (void)version;
    if (fc == NULL) {
        *con_cls = calloc(1, sizeof(*fc));
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*upload_size) {
        char *nb = realloc(fc->body, fc->len + *upload_size + 1);
        if (nb == NULL)
            return MHD_NO;
        fc->body = nb;
        memcpy(fc->body + fc->len, upload, *upload_size);
        fc->len += *upload_size;
        fc->body[fc->len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    /* No JSON library here: the gateway's jansson allocations are the ones being failed. */
    prefill = fc->body && strstr(fc->body, "\"max_tokens\":1") != NULL;
    stream = fc->body && strstr(fc->body, "\"stream\":true") != NULL;
    pause_ms(engine_delay_ms);
    if (stream && !prefill && fc->body && strstr(fc->body, "\"max_tokens\":9999") != NULL) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 2 * BIG_EVENT_BYTES,
                                                 big_stream_cb, fc, NULL);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    } else if (stream && !prefill) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 256, stream_cb, fc, NULL);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    } else {
        static const char pre[] = "{\"id\":\"p\",\"choices\":[{\"text\":\"H\"}],"
                                  "\"kv_transfer_params\":{\"remote_block_ids\":[1,2]}}";
        static const char dec[] = "{\"id\":\"d\",\"choices\":[{\"text\":\"Hello\"}]}";
        const char *t = prefill ? pre : dec;
        resp = MHD_create_response_from_buffer(strlen(t), (void *)t, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Type", "application/json");
    }
    ret = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void fake_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    fake_conn_t *fc = *con_cls;
    (void)cls;
    (void)c;
    (void)toe;
    if (fc) {
        free(fc->body);
        free(fc);
    }
    *con_cls = NULL;
}

/* ---------------------------------------------------------------- test forwarder */

static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static int inits, cleanups;

typedef struct t_state {
    json_t *kv;
} t_state_t;

static pdgw_fwd_status_t t_init(void *ctx, const pdgw_fwd_request_t *req,
                                const pdgw_fwd_peers_t *peers, void **state, pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)req;
    (void)peers;
    *state = calloc(1, sizeof(t_state_t));
    if (*state == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    pthread_mutex_lock(&count_lock);
    inits++;
    pthread_mutex_unlock(&count_lock);
    return PDGW_FWD_OK;
}

static void t_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                      pdgw_end_reason_t reason)
{
    t_state_t *s = state;
    (void)ctx;
    (void)req;
    (void)reason;
    pthread_mutex_lock(&count_lock);
    cleanups++;
    pthread_mutex_unlock(&count_lock);
    json_decref(s->kv);
    free(s);
}

static pdgw_fwd_status_t t_build(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                 pdgw_leg_kind_t kind, const pdgw_fwd_peers_t *peers,
                                 pdgw_fwd_leg_t *leg, pdgw_fwd_error_t *err)
{
    t_state_t *s = state;
    (void)ctx;
    (void)peers;
    if (kind == PDGW_LEG_PREFILL) {
        leg->body = pdgw_fwd_body_prefill(req);
    } else {
        leg->body = pdgw_fwd_body_copy(req);
        if (leg->body && s->kv)
            json_object_set(leg->body, "kv_transfer_params", s->kv);
    }
    if (leg->body == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_NONE, 0, 500, "out of memory");
        return PDGW_FWD_ERR;
    }
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t t_prefill_resp(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                        long status, const json_t *resp, pdgw_fwd_error_t *err)
{
    t_state_t *s = state;
    json_t *kv = json_object_get(resp, "kv_transfer_params");
    (void)ctx;
    (void)req;
    (void)status;
    if (kv == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 502, "no kv_transfer_params");
        return PDGW_FWD_ERR;
    }
    s->kv = json_deep_copy(kv);
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t t_ops = {
    .attempt_init = t_init,
    .build_leg = t_build,
    .on_prefill_response = t_prefill_resp,
    .attempt_cleanup = t_cleanup,
};
static const pdgw_fwd_desc_t t_serial = {.abi_version = 3,
                                         .name = "t-torture",
                                         .summary = "torture serial",
                                         .modes = PDGW_MODE_BATCH,
                                         .dispatch = PDGW_DISPATCH_SERIAL,
                                         .ops = &t_ops};

/* ---------------------------------------------------------------- fixture */

typedef struct fixture {
    struct MHD_Daemon *engine;
    int engine_port;
    pdgw_metrics_t *reg;
    pdgw_gateway_metrics_t gm;
    sched_pool_t *pool;
    pdgw_server_t *srv;
} fixture_t;

static fixture_t F;

/* The front end the group runs through (the whole group runs once for each). */
static pdgw_frontend_t torture_frontend = PDGW_FRONTEND_MHD;

static int fixture_setup(void **s)
{
    sched_config_t sc;
    sched_instance_desc_t inst[2];
    char url[64];
    pdgw_server_opts_t so;
    char err[512];
    const union MHD_DaemonInfo *di;
    (void)s;
    memset(&F, 0, sizeof(F));
    F.engine = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0,
                                NULL, NULL, fake_access, NULL, MHD_OPTION_NOTIFY_COMPLETED,
                                fake_completed, NULL, MHD_OPTION_END);
    assert_non_null(F.engine);
    di = MHD_get_daemon_info(F.engine, MHD_DAEMON_INFO_BIND_PORT);
    F.engine_port = di->port;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", F.engine_port);
    assert_int_equal(pdgw_metrics_create(0, &F.reg), PDGW_OK);
    assert_int_equal(pdgw_gateway_metrics_init(F.reg, "test", &F.gm), PDGW_OK);
    sched_config_init(&sc);
    sc.health_interval_ms = 0;
    sc.metrics_scrape_interval_ms = 0;
    /* The failures are injected back to back, and five that land in the decode's transfer
     * in a row would open its breaker and refuse every request after them (503): what is
     * tested here is that each request ends cleanly, not the breaker. */
    sc.breaker_failures = 1000000;
    sched_instance_desc_init(&inst[0]);
    inst[0].id = "p0";
    inst[0].url = url;
    inst[0].role = SCHED_ROLE_PREFILL;
    sched_instance_desc_init(&inst[1]);
    inst[1].id = "d0";
    inst[1].url = url;
    inst[1].role = SCHED_ROLE_DECODE;
    sc.instances = inst;
    sc.n_instances = 2;
    assert_int_equal(sched_pool_create(&sc, &F.pool), SCHED_OK);
    assert_int_equal(sched_pool_start(F.pool), SCHED_OK);
    pdgw_server_opts_init(&so);
    so.listen_host = "127.0.0.1";
    so.listen_port = 0;
    so.workers = 1;
    so.protocol = "t-torture";
    so.pool = F.pool;
    so.metrics = &F.gm;
    so.retries = 0; /* one attempt per request: the counts below stay simple */
    /* An allocation failing inside libcurl can leave a transfer that never reports back; the
     * request deadline must still end the request. Short, so such cases stay quick. */
    so.request_timeout_ms = 3000;
    /* The slow-client case asks for more with X-Request-Timeout. */
    so.max_request_timeout_ms = 120000;
    so.frontend = torture_frontend;
    assert_int_equal(pdgw_gateway_wire(), PDGW_OK);
    assert_int_equal(pdgw_server_create(&so, &F.srv, err, sizeof(err)), PDGW_OK);
    assert_int_equal(pdgw_server_start(F.srv), PDGW_OK);
    return 0;
}

static int fixture_teardown(void **s)
{
    (void)s;
    pdgw_alloc_fail_at(0, 0);
    pdgw_server_destroy(F.srv);
    sched_pool_destroy(F.pool);
    pdgw_metrics_destroy(F.reg);
    MHD_stop_daemon(F.engine);
    return 0;
}

/* ---------------------------------------------------------------- client */

/* Longest wait for an answer: generous for a sanitizer build on a loaded machine. */
#define TORTURE_WAIT_MS 10000

/* A plain-socket client: the process's libcurl allocations are the gateway's, and fail. */
typedef struct resp {
    int status; /* 0 = no status line */
    char body[4096];
    size_t len;
} resp_t;

typedef enum { CLIENT_DONE = 0, CLIENT_CLOSED, CLIENT_GAVE_UP } client_rc_t;

static const char PLAIN[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":4}";
static const char STREAM[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":4,\"stream\":true}";

static client_rc_t request(const char *method, const char *path, const char *body, long timeout_ms,
                           resp_t *out);

/* POST one request with "Connection: close" and read until the gateway closes; the client
 * gives up (closes) after <timeout_ms> (0 = 20 s). */
static client_rc_t post(const char *body, long timeout_ms, resp_t *out)
{
    return request("POST", "/v1/completions", body, timeout_ms, out);
}

/* <method> <path> with <body> (NULL = none), as post(). */
static client_rc_t request(const char *method, const char *path, const char *body, long timeout_ms,
                           resp_t *out)
{
    struct sockaddr_in a;
    char req[1024];
    int fd, n;
    uint64_t end;
    struct timespec ts;
    client_rc_t rc = CLIENT_CLOSED;
    memset(out, 0, sizeof(*out));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)pdgw_server_port(F.srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    n = snprintf(req, sizeof(req),
                 "%s %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                 method, path, body ? strlen(body) : 0, body ? body : "");
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    end = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u +
          (uint64_t)(timeout_ms > 0 ? timeout_ms : TORTURE_WAIT_MS);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        uint64_t now;
        ssize_t got;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
        if (now >= end) {
            rc = CLIENT_GAVE_UP;
            break;
        }
        if (poll(&p, 1, (int)(end - now)) <= 0)
            continue;
        got = recv(fd, out->body + out->len, sizeof(out->body) - 1 - out->len, 0);
        if (got <= 0) {
            rc = got == 0 ? CLIENT_DONE : CLIENT_CLOSED;
            break;
        }
        out->len += (size_t)got;
        out->body[out->len] = '\0';
        if (out->len >= sizeof(out->body) - 1)
            break;
    }
    close(fd);
    if (strncmp(out->body, "HTTP/1.1 ", 9) == 0)
        out->status = atoi(out->body + 9);
    return rc;
}

/* The gateway has finished with every request and every attempt was cleaned up once. */
static void assert_settled(void)
{
    int i, ok = 0;
    assert_true(pdgw_server_wait_idle(F.srv, 20000));
    /* The attempt cleanup runs on the worker right before the request is counted out. */
    for (i = 0; i < 2000 && !ok; i++) {
        pthread_mutex_lock(&count_lock);
        ok = cleanups == inits;
        pthread_mutex_unlock(&count_lock);
        if (!ok)
            pause_ms(10);
    }
    assert_true(ok);
}

static void assert_serves(const char *body, const char *expect)
{
    resp_t r;
    assert_int_equal(post(body, 0, &r), CLIENT_DONE);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, expect));
    assert_settled();
}

/* Allocations one successful request makes (measured, so the loop covers every one). */
static long allocs_of(const char *body, const char *expect)
{
    long before, after;
    assert_serves(body, expect); /* warm: pools, connections, handles */
    before = pdgw_alloc_count();
    assert_serves(body, expect);
    after = pdgw_alloc_count();
    return after - before;
}

/* With <cold>, the worker's free lists are bypassed: the request and workflow objects are
 * allocated afresh for every request, so their allocations fail in turn too (a warm list
 * hands out recycled ones). Returns how many requests got the 503 of a workflow object that
 * could not be allocated. */
static int torture_run(const char *body, const char *expect, bool cold)
{
    long n, total;
    int failed_requests = 0, wf_refused = 0;
    engine_delay_ms = 0;
    pdgw_freelist_test_bypass(cold);
    total = allocs_of(body, expect);
    assert_true(total > 0);
    /* A few past the count: allocations that vary from run to run (buffers growing). */
    for (n = 1; n <= total + 4; n++) {
        resp_t r;
        client_rc_t rc;
        pdgw_alloc_fail_at(n, 0);
        rc = post(body, 0, &r);
        pdgw_alloc_fail_at(0, 0);
        /* Ended: an answer (any status) or a closed connection, never a hang. */
        if (rc == CLIENT_GAVE_UP)
            print_message("allocation %ld of %ld failed: the request hung (%zu bytes: %.200s)\n", n,
                          total, r.len, r.body);
        assert_int_not_equal(rc, CLIENT_GAVE_UP);
        if (r.status != 200 || strstr(r.body, expect) == NULL)
            failed_requests++;
        if (r.status == 503 && strstr(r.body, "out of memory; retry later") != NULL &&
            strstr(r.body, "Retry-After: 1\r\n") != NULL)
            wf_refused++;
        assert_settled();
    }
    /* Failures were injected and seen (the loop did reach the request path). */
    print_message("%ld allocations per request%s; %d of %ld requests failed\n", total,
                  cold ? " (free lists bypassed)" : "", failed_requests, total + 4);
    assert_true(failed_requests > 0);
    assert_serves(body, expect);
    pdgw_freelist_test_bypass(false);
    return wf_refused;
}

static void torture(const char *body, const char *expect)
{
    (void)torture_run(body, expect, false);
}

static void test_every_allocation_fails_plain(void **s)
{
    (void)s;
    torture(PLAIN, "Hello");
}

static void test_every_allocation_fails_stream(void **s)
{
    (void)s;
    torture(STREAM, "[DONE]");
}

/* Every allocation of a request whose objects are not recycled: the request object's, the
 * workflow object's (taken only at dispatch: its failure is a clean 503 with Retry-After,
 * then the connection closes) and all the others. */
static void test_every_allocation_fails_cold(void **s)
{
    static const char *const body[][2] = {{PLAIN, "Hello"}, {STREAM, "[DONE]"}};
    (void)s;
    for (size_t b = 0; b < 2; b++) {
        int refused = 0;
        /* How many allocations come before dispatch varies from run to run (buffers grow as
         * the bytes arrive): a sweep can step over the workflow object's allocation when the
         * count shifts between two of its runs (seen once in a sanitizer run). Three sweeps
         * that all miss it mean it is never refused cleanly. */
        for (int sweep = 0; sweep < 3 && refused == 0; sweep++)
            refused = torture_run(body[b][0], body[b][1], true);
        assert_true(refused > 0);
    }
}

/* Free-list use of the two objects (one worker): local replies never take a workflow object;
 * an inference request takes one at dispatch and gives it back at completion, and the next
 * one reuses it. Counters are read once the gateway is idle: the worker released the object
 * before counting the request out. */
static void test_workflow_object_only_for_upstream_work(void **s)
{
    pdgw_freelist_t *wl = &F.srv->workers[0].wf_pool;
    static const char *const local[][3] = {
        {"GET", "/health", NULL},
        {"GET", "/ready", NULL},
        {"GET", "/metrics", NULL},
        {"GET", "/nowhere", NULL},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":0}"},
        {"POST", "/v1/completions", "{not json"},
    };
    unsigned long taken, allocs;
    unsigned free_before;
    size_t i;
    (void)s;
    engine_delay_ms = 0;
    assert_serves(PLAIN, "Hello"); /* one is listed now */
    taken = wl->n_alloc + wl->n_reuse;
    allocs = wl->n_alloc;
    free_before = wl->n_free;
    assert_true(free_before >= 1);
    for (i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
        resp_t r;
        /* (the metrics outgrow the client's buffer: it stops reading early) */
        assert_int_not_equal(request(local[i][0], local[i][1], local[i][2], 0, &r), CLIENT_GAVE_UP);
        assert_true(r.status >= 200);
    }
    assert_settled();
    assert_int_equal(wl->n_alloc + wl->n_reuse, taken);
    assert_serves(PLAIN, "Hello");
    assert_serves(STREAM, "[DONE]");
    /* Two more taken, both recycled, both back. */
    assert_int_equal(wl->n_alloc + wl->n_reuse, taken + 2);
    assert_int_equal(wl->n_alloc, allocs);
    assert_int_equal(wl->n_free, free_before);
}

/* Clients that give up at every stage: the engine takes 60 ms per answer (and 30 ms per
 * event), so 10 ms is in the prefill, 90 ms in the decode's wait, 160+ ms mid-stream. Once
 * with recycled request and workflow objects (poisoned while listed), once with every one
 * freed for real, so a late use of either is caught even after it was reused. */
static void test_client_gives_up_at_every_stage(void **s)
{
    static const long after_ms[] = {1, 10, 40, 70, 90, 120, 150, 170, 190, 220};
    size_t i;
    int k;
    (void)s;
    engine_delay_ms = 60;
    for (k = 0; k < 4; k++) {
        pdgw_freelist_test_bypass(k >= 2);
        for (i = 0; i < sizeof(after_ms) / sizeof(after_ms[0]); i++) {
            resp_t r;
            (void)post(k % 2 ? STREAM : PLAIN, after_ms[i], &r);
            assert_settled();
        }
    }
    pdgw_freelist_test_bypass(false);
    engine_delay_ms = 0;
    assert_serves(STREAM, "[DONE]");
    assert_serves(PLAIN, "Hello");
}

/* Flow control (pdgw_sink.c): a client that does not read makes the gateway pause the
 * upstream leg once its backlog passes the high water, instead of buffering the whole
 * answer; when the client reads again the leg resumes and every byte arrives, in order. The
 * engine offers 64 MiB; a gateway that buffered it all would let the engine write every
 * event while the client sleeps. */
static void test_slow_client_pauses_the_upstream(void **s)
{
    static const char BIG[] =
        "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":9999,\"stream\":true}";
    struct sockaddr_in a;
    char req[512], buf[65536];
    int fd, n, rcv = 4096, last = -1, stable = 0, i;
    size_t total = 0, carry = 0;
    long next_i = 0;
    char tail[32] = "";
    (void)s;
    engine_delay_ms = 0;
    atomic_store(&big_produced, 0);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)pdgw_server_port(F.srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    /* HTTP/1.0: the answer is delimited by the close, not chunked, so the events can be
     * checked in the raw bytes. Its own deadline: 64 MiB through a sanitizer build on a busy
     * machine takes longer than the fixture's 3 s. */
    n = snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.0\r\nHost: gw\r\nContent-Type: application/json\r\n"
                 "X-Request-Timeout: 120\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(BIG), BIG);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    /* Not reading: wait until the engine stops getting anywhere (or has written it all). */
    for (i = 0; i < 1000 && stable < 20; i++) {
        int now = atomic_load(&big_produced);
        stable = now == last && now > 0 ? stable + 1 : 0;
        last = now;
        if (now >= BIG_EVENTS)
            break;
        pause_ms(10);
    }
    print_message("the engine wrote %d of %d events while the client slept\n", last, BIG_EVENTS);
    assert_true(last < BIG_EVENTS / 2);
    /* Now read everything: the events arrive whole and in order, then [DONE]. The last bytes
     * of each read are kept in front of the next, so an index cut between reads is seen whole
     * once (scanning resumes after the last complete one). */
    for (;;) {
        ssize_t got = recv(fd, buf + carry, sizeof(buf) - 1 - carry, 0);
        char *p, *end, *resume;
        if (got <= 0)
            break;
        total += (size_t)got;
        end = buf + carry + got;
        *end = '\0';
        resume = buf;
        for (p = buf; (p = strstr(p, "\"i\":")) != NULL; p += 4) {
            if (p + 4 + 6 > end)
                break;
            assert_int_equal(strtol(p + 4, NULL, 10), next_i);
            next_i++;
            resume = p + 10;
        }
        carry = (size_t)(end - resume) < 16 ? (size_t)(end - resume) : 16;
        memmove(buf, end - carry, carry);
        memcpy(tail, end - (end - buf > 20 ? 20 : end - buf), 20);
        tail[20] = '\0';
    }
    assert_int_equal(next_i, BIG_EVENTS);
    close(fd);
    assert_true(total > (size_t)BIG_EVENTS * BIG_EVENT_BYTES);
    assert_non_null(strstr(tail, "[DONE]"));
    assert_settled();
}

/* jansson's allocator, through the failure-injecting wrapper (pdgw_malloc is a macro). */
static void *json_malloc(size_t size)
{
    return pdgw_malloc(size);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_plain),
        cmocka_unit_test(test_every_allocation_fails_stream),
        cmocka_unit_test(test_every_allocation_fails_cold),
        cmocka_unit_test(test_workflow_object_only_for_upstream_work),
        cmocka_unit_test(test_client_gives_up_at_every_stage),
        cmocka_unit_test(test_slow_client_pauses_the_upstream),
    };
    int rc;
    /* The gateway's own allocations and its JSON trees go through the failure-injecting
     * wrapper. libcurl's do not: libcurl 7.88 itself dies of SIGFPE inside
     * curl_multi_socket_action when some of its internal allocations fail (seen with
     * curl_global_init_mem routed here), which no caller can handle. */
    json_set_alloc_funcs(json_malloc, pdb_free);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pdgw_log_set_level(getenv("TORTURE_LOG") ? PDGW_LOG_LEVEL_DEBUG : PDGW_LOG_LEVEL_ERROR);
    pdgw_log_set_access(false);
    assert_int_equal(pdgw_fwd_register(&t_serial), 0);
    rc = cmocka_run_group_tests_name("libmicrohttpd front end", tests, fixture_setup,
                                     fixture_teardown);
    torture_frontend = PDGW_FRONTEND_NATIVE;
    rc |= cmocka_run_group_tests_name("native front end", tests, fixture_setup, fixture_teardown);
    curl_global_cleanup();
    return rc;
}
