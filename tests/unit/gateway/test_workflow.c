/*
 * test_workflow.c - the workflow engine with test forwarders against in-process fake
 * engines (libmicrohttpd on ephemeral ports): every dispatch pattern (single, serial,
 * parallel) x mode (batch, staged) x stream/non-stream, a gate released from another
 * thread, a gate timeout, and a retry after a refused connection. Each case checks the
 * relayed bytes, what each fake engine received, and that attempt_cleanup ran exactly once.
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
#include <pthread.h>
#include <unistd.h>

#include "pdgw_log.h"
#include "pdgw_registry.h"
#include "pdgw_server.h"
#include "pdgw_wiring.h"

/* ---------------------------------------------------------------- fake engines */

typedef struct fake_engine {
    struct MHD_Daemon *d;
    int port;
    const char *name;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* signalled under lock when n_requests grows */
    int n_requests;
    char last_body[4096];
    char last_request_id[128];
    char last_traceparent[128];
    char last_custom[64];
    char last_leg_header[64];
    char last_connection[64];
} fake_engine_t;

typedef struct fake_conn {
    char *body;
    size_t len;
} fake_conn_t;

static const char *const TOKENS[] = {"Hel", "lo ", "wor", "ld"};

static enum MHD_Result fake_access(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls)
{
    fake_engine_t *fe = cls;
    fake_conn_t *fc = *con_cls;
    struct MHD_Response *resp;
    json_t *body;
    char out[4096];
    size_t off = 0;
    int is_prefill, stream;
    enum MHD_Result ret;
    const char *rid;
    (void)url;
    (void)method;
    (void)version;

    if (fc == NULL) {
        fc = calloc(1, sizeof(*fc));
        *con_cls = fc;
        return MHD_YES;
    }
    if (*upload_size) {
        fc->body = realloc(fc->body, fc->len + *upload_size + 1);
        memcpy(fc->body + fc->len, upload, *upload_size);
        fc->len += *upload_size;
        fc->body[fc->len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    rid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    pthread_mutex_lock(&fe->lock);
    {
        const char *tp = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent");
        const char *cu = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Custom");
        const char *lh = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Test-Leg");
        const char *co = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Hop");
        snprintf(fe->last_traceparent, sizeof(fe->last_traceparent), "%s", tp ? tp : "");
        snprintf(fe->last_custom, sizeof(fe->last_custom), "%s", cu ? cu : "");
        snprintf(fe->last_leg_header, sizeof(fe->last_leg_header), "%s", lh ? lh : "");
        snprintf(fe->last_connection, sizeof(fe->last_connection), "%s", co ? co : "");
    }
    fe->n_requests++;
    pthread_cond_broadcast(&fe->changed);
    snprintf(fe->last_body, sizeof(fe->last_body), "%s", fc->body ? fc->body : "");
    snprintf(fe->last_request_id, sizeof(fe->last_request_id), "%s", rid ? rid : "");
    pthread_mutex_unlock(&fe->lock);

    body = json_loads(fc->body ? fc->body : "{}", 0, NULL);
    is_prefill = json_integer_value(json_object_get(body, "max_tokens")) == 1;
    stream = json_is_true(json_object_get(body, "stream"));
    if (is_prefill) {
        off = (size_t)snprintf(out, sizeof(out),
                               "{\"id\":\"p\",\"choices\":[{\"text\":\"H\"}],"
                               "\"kv_transfer_params\":{\"remote_block_ids\":[1,2],"
                               "\"from\":\"%s\"}}",
                               fe->name);
    } else if (stream) {
        size_t i;
        for (i = 0; i < 4; i++)
            off += (size_t)snprintf(out + off, sizeof(out) - off,
                                    "data: {\"choices\":[{\"text\":\"%s\"}]}\n\n", TOKENS[i]);
        off += (size_t)snprintf(out + off, sizeof(out) - off, "data: [DONE]\n\n");
    } else {
        off = (size_t)snprintf(out, sizeof(out),
                               "{\"id\":\"d\",\"choices\":[{\"text\":\"Hello world\"}]}");
    }
    json_decref(body);
    resp = MHD_create_response_from_buffer(off, out, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, "Content-Type",
                            stream && !is_prefill ? "text/event-stream" : "application/json");
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

static void fake_start(fake_engine_t *fe, const char *name)
{
    const union MHD_DaemonInfo *di;
    memset(fe, 0, sizeof(*fe));
    fe->name = name;
    pthread_mutex_init(&fe->lock, NULL);
    pthread_cond_init(&fe->changed, NULL);
    fe->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL, NULL,
                             fake_access, fe, MHD_OPTION_NOTIFY_COMPLETED, fake_completed, NULL,
                             MHD_OPTION_END);
    assert_non_null(fe->d);
    di = MHD_get_daemon_info(fe->d, MHD_DAEMON_INFO_BIND_PORT);
    fe->port = di->port;
}

static void fake_stop(fake_engine_t *fe)
{
    MHD_stop_daemon(fe->d);
    pthread_cond_destroy(&fe->changed);
    pthread_mutex_destroy(&fe->lock);
}

/* The deadline of every wait for something a server thread does: generous, as a
 * sanitizer build is slow; a wait that succeeds returns as soon as it can. */
#define WAIT_MS 5000

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Requests the engine has received, read under its lock (its MHD thread writes). */
static int fake_requests(fake_engine_t *fe)
{
    int n;
    pthread_mutex_lock(&fe->lock);
    n = fe->n_requests;
    pthread_mutex_unlock(&fe->lock);
    return n;
}

/* Waits until the engine has received at least n requests (or WAIT_MS passed). */
static int fake_wait_requests(fake_engine_t *fe, int n)
{
    struct timespec dl;
    int got;
    deadline_in(&dl, WAIT_MS);
    pthread_mutex_lock(&fe->lock);
    while (fe->n_requests < n && pthread_cond_timedwait(&fe->changed, &fe->lock, &dl) == 0)
        ;
    got = fe->n_requests;
    pthread_mutex_unlock(&fe->lock);
    return got;
}

/* ---------------------------------------------------------------- test forwarders */

typedef struct t_state {
    json_t *kv; /* copied from the prefill response */
    int gate_calls;
} t_state_t;

/* What the test forwarder's callbacks saw. They run on the server's worker threads
 * while the test thread reads them: every access holds count_lock, and a callback
 * that changes one signals count_changed. */
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t count_changed = PTHREAD_COND_INITIALIZER;
static int cleanups, inits, prefill_responses;
static pdgw_end_reason_t last_reason;

static void count_bump(int *counter)
{
    pthread_mutex_lock(&count_lock);
    (*counter)++;
    pthread_cond_broadcast(&count_changed);
    pthread_mutex_unlock(&count_lock);
}

static int count_get(const int *counter)
{
    int v;
    pthread_mutex_lock(&count_lock);
    v = *counter;
    pthread_mutex_unlock(&count_lock);
    return v;
}
static pdgw_fwd_waker_t *held_waker;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_set = PTHREAD_COND_INITIALIZER; /* held_waker became non-NULL */
static int gate_mode; /* 0 = open, 1 = pending until woken, 2 = never opens */
static int gate_opened;

static pdgw_fwd_status_t t_init(void *ctx, const pdgw_fwd_request_t *req,
                                const pdgw_fwd_peers_t *peers, void **state, pdgw_fwd_error_t *err)
{
    (void)ctx;
    (void)req;
    (void)peers;
    (void)err;
    count_bump(&inits);
    *state = calloc(1, sizeof(t_state_t));
    return PDGW_FWD_OK;
}

static void t_cleanup(void *ctx, void *state, const pdgw_fwd_request_t *req,
                      pdgw_end_reason_t reason)
{
    t_state_t *s = state;
    (void)ctx;
    (void)req;
    pthread_mutex_lock(&count_lock);
    cleanups++;
    last_reason = reason;
    pthread_cond_broadcast(&count_changed);
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
    (void)err;
    if (kind == PDGW_LEG_PREFILL) {
        leg->body = pdgw_fwd_body_prefill(req);
        json_object_set_new(leg->body, "kv_transfer_params",
                            json_pack("{s:b}", "do_remote_decode", 1));
    } else {
        leg->body = pdgw_fwd_body_copy(req);
        if (s->kv)
            json_object_set(leg->body, "kv_transfer_params", s->kv);
        else if (peers->prefill)
            json_object_set_new(leg->body, "kv_transfer_params",
                                json_pack("{s:s,s:i}", "remote_host", peers->prefill->kv_host,
                                          "remote_port", peers->prefill->port));
    }
    snprintf(leg->headers[0], sizeof(leg->headers[0]), "X-Test-Leg: %s",
             kind == PDGW_LEG_PREFILL ? "prefill" : "decode");
    leg->n_headers = 1;
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
    count_bump(&prefill_responses);
    if (kv == NULL) {
        pdgw_fwd_error_set(err, PDGW_PHASE_KV_TRANSFER, 0, 502, "no kv_transfer_params");
        return PDGW_FWD_ERR;
    }
    if (req->dispatch == PDGW_DISPATCH_SERIAL)
        s->kv = json_deep_copy(kv);
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t t_gate(void *ctx, void *state, const pdgw_fwd_request_t *req,
                                pdgw_gate_point_t point, pdgw_fwd_error_t *err)
{
    t_state_t *s = state;
    (void)ctx;
    (void)err;
    if (point != PDGW_GATE_BEFORE_DECODE || gate_mode == 0)
        return PDGW_FWD_OK;
    s->gate_calls++;
    pthread_mutex_lock(&held_lock);
    if (gate_opened) {
        pthread_mutex_unlock(&held_lock);
        return PDGW_FWD_OK;
    }
    if (held_waker == NULL) {
        held_waker = pdgw_fwd_waker_ref(req->waker);
        pthread_cond_broadcast(&held_set);
    }
    pthread_mutex_unlock(&held_lock);
    return PDGW_FWD_PENDING;
}

static pdgw_fwd_status_t t_plan_single(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan,
                                       char *err, size_t errlen)
{
    (void)ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = PDGW_DISPATCH_SINGLE;
    plan->single_role = PDGW_FWD_ROLE_DECODE;
    plan->single_needs_prefill = 1;
    return PDGW_FWD_OK;
}

static pdgw_fwd_status_t t_plan_gated(void *ctx, pdgw_mode_t mode, pdgw_fwd_plan_t *plan, char *err,
                                      size_t errlen)
{
    (void)ctx;
    (void)mode;
    (void)err;
    (void)errlen;
    plan->dispatch = PDGW_DISPATCH_SERIAL;
    plan->gate_timeout_ms = 400;
    return PDGW_FWD_OK;
}

static const pdgw_fwd_ops_t t_ops = {
    .attempt_init = t_init,
    .build_leg = t_build,
    .on_prefill_response = t_prefill_resp,
    .gate = t_gate,
    .attempt_cleanup = t_cleanup,
};
static const pdgw_fwd_ops_t t_ops_single = {
    .plan = t_plan_single,
    .attempt_init = t_init,
    .build_leg = t_build,
    .attempt_cleanup = t_cleanup,
};
static const pdgw_fwd_ops_t t_ops_gated = {
    .plan = t_plan_gated,
    .attempt_init = t_init,
    .build_leg = t_build,
    .on_prefill_response = t_prefill_resp,
    .gate = t_gate,
    .attempt_cleanup = t_cleanup,
};

static const pdgw_fwd_desc_t t_serial = {.abi_version = 3,
                                         .name = "t-serial",
                                         .summary = "test serial",
                                         .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
                                         .dispatch = PDGW_DISPATCH_SERIAL,
                                         .ops = &t_ops};
static const pdgw_fwd_desc_t t_parallel = {.abi_version = 3,
                                           .name = "t-parallel",
                                           .summary = "test parallel",
                                           .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
                                           .dispatch = PDGW_DISPATCH_PARALLEL,
                                           .ops = &t_ops};
static const pdgw_fwd_desc_t t_single = {.abi_version = 3,
                                         .name = "t-single",
                                         .summary = "test single",
                                         .modes = PDGW_MODE_BATCH | PDGW_MODE_STAGED,
                                         .dispatch = PDGW_DISPATCH_SINGLE,
                                         .ops = &t_ops_single};
static const pdgw_fwd_desc_t t_gated = {.abi_version = 3,
                                        .name = "t-gated",
                                        .summary = "test gated",
                                        .modes = PDGW_MODE_BATCH,
                                        .dispatch = PDGW_DISPATCH_SERIAL,
                                        .ops = &t_ops_gated};

/* ---------------------------------------------------------------- gateway fixture */

typedef struct fixture {
    fake_engine_t p, d;
    pdgw_metrics_t *reg;
    pdgw_gateway_metrics_t gm;
    sched_pool_t *pool;
    pdgw_server_t *srv;
} fixture_t;

static void fixture_start(fixture_t *f, const char *protocol, pdgw_mode_t mode, int dead_prefill)
{
    sched_config_t sc;
    sched_instance_desc_t inst[3];
    char purl[64], durl[64];
    pdgw_server_opts_t so;
    char err[512];
    size_t n = 0;

    memset(f, 0, sizeof(*f));
    fake_start(&f->p, "P");
    fake_start(&f->d, "D");
    assert_int_equal(pdgw_metrics_create(0, &f->reg), PDGW_OK);
    assert_int_equal(pdgw_gateway_metrics_init(f->reg, "test", &f->gm), PDGW_OK);
    sched_config_init(&sc);
    sc.health_interval_ms = 0;
    sc.metrics_scrape_interval_ms = 0;
    sc.prefill_policy = SCHED_POLICY_ROUND_ROBIN;
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", f->p.port);
    snprintf(durl, sizeof(durl), "http://127.0.0.1:%d", f->d.port);
    if (dead_prefill) {
        /* Port 1 on loopback refuses connections. */
        sched_instance_desc_init(&inst[n]);
        inst[n].id = "dead";
        inst[n].url = "http://127.0.0.1:1";
        inst[n].role = SCHED_ROLE_PREFILL;
        n++;
    }
    sched_instance_desc_init(&inst[n]);
    inst[n].id = "p0";
    inst[n].url = purl;
    inst[n].role = SCHED_ROLE_PREFILL;
    n++;
    sched_instance_desc_init(&inst[n]);
    inst[n].id = "d0";
    inst[n].url = durl;
    inst[n].role = SCHED_ROLE_DECODE;
    n++;
    sc.instances = inst;
    sc.n_instances = n;
    assert_int_equal(sched_pool_create(&sc, &f->pool), SCHED_OK);
    assert_int_equal(sched_pool_start(f->pool), SCHED_OK);

    pdgw_server_opts_init(&so);
    so.listen_host = "127.0.0.1";
    so.listen_port = 0;
    so.workers = 2;
    so.protocol = protocol;
    so.mode = mode;
    so.pool = f->pool;
    so.metrics = &f->gm;
    so.retries = 1;
    so.request_timeout_ms = 5000;
    assert_int_equal(pdgw_gateway_wire(), PDGW_OK);
    assert_int_equal(pdgw_server_create(&so, &f->srv, err, sizeof(err)), PDGW_OK);
    assert_int_equal(pdgw_server_start(f->srv), PDGW_OK);
    pthread_mutex_lock(&count_lock);
    cleanups = inits = prefill_responses = 0;
    pthread_mutex_unlock(&count_lock);
}

static void fixture_stop(fixture_t *f)
{
    pdgw_server_destroy(f->srv);
    sched_pool_destroy(f->pool);
    pdgw_metrics_destroy(f->reg);
    fake_stop(&f->p);
    fake_stop(&f->d);
}

typedef struct client_resp {
    long status;
    char body[8192];
    size_t len;
    char headers[2048];
    size_t hlen;
} client_resp_t;

static size_t on_header(char *p, size_t s, size_t n, void *u)
{
    client_resp_t *r = u;
    size_t len = s * n;
    if (r->hlen + len < sizeof(r->headers)) {
        memcpy(r->headers + r->hlen, p, len);
        r->hlen += len;
        r->headers[r->hlen] = '\0';
    }
    return len;
}

static size_t on_body(char *p, size_t s, size_t n, void *u)
{
    client_resp_t *r = u;
    size_t len = s * n;
    if (r->len + len < sizeof(r->body)) {
        memcpy(r->body + r->len, p, len);
        r->len += len;
        r->body[r->len] = '\0';
    }
    return len;
}

static void post(const fixture_t *f, const char *body, client_resp_t *out)
{
    CURL *c = curl_easy_init();
    char url[128];
    struct curl_slist *h = NULL;
    memset(out, 0, sizeof(*out));
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", pdgw_server_port(f->srv));
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "X-Request-Id: wf-test-1");
    h = curl_slist_append(h, "X-Custom: kept");
    /* A header named in Connection is hop-by-hop: not forwarded. */
    h = curl_slist_append(h, "Connection: keep-alive, X-Hop");
    h = curl_slist_append(h, "X-Hop: dropped");
    h = curl_slist_append(h,
                          "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

static const char STREAM_BODY[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":4,"
                                  "\"stream\":true,\"stop\":[\"x\"]}";
static const char PLAIN_BODY[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":4}";
static const char EXPECT_STREAM[] = "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\n"
                                    "data: {\"choices\":[{\"text\":\"lo \"}]}\n\n"
                                    "data: {\"choices\":[{\"text\":\"wor\"}]}\n\n"
                                    "data: {\"choices\":[{\"text\":\"ld\"}]}\n\n"
                                    "data: [DONE]\n\n";
static const char EXPECT_PLAIN[] = "{\"id\":\"d\",\"choices\":[{\"text\":\"Hello world\"}]}";

/* Cleanup runs on a worker after the client got its response: wait for it. With
 * n < 0, waits until every attempt begun so far has been cleaned up. */
static int wait_cleanups_until(int n)
{
    struct timespec dl;
    int got;
    deadline_in(&dl, WAIT_MS);
    pthread_mutex_lock(&count_lock);
    while ((n < 0 ? cleanups < inits : cleanups < n) &&
           pthread_cond_timedwait(&count_changed, &count_lock, &dl) == 0)
        ;
    got = cleanups;
    pthread_mutex_unlock(&count_lock);
    return got;
}

static void wait_cleanups(int n)
{
    assert_int_equal(wait_cleanups_until(n), n);
}

static pdgw_end_reason_t get_last_reason(void)
{
    pdgw_end_reason_t r;
    pthread_mutex_lock(&count_lock);
    r = last_reason;
    pthread_mutex_unlock(&count_lock);
    return r;
}

static void run_case(const char *protocol, pdgw_mode_t mode, int stream)
{
    fixture_t f;
    client_resp_t r;
    json_t *pb, *db;
    int want_prefill = strcmp(protocol, "t-single") != 0;

    fixture_start(&f, protocol, mode, 0);
    post(&f, stream ? STREAM_BODY : PLAIN_BODY, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, stream ? EXPECT_STREAM : EXPECT_PLAIN);
    wait_cleanups(1);
    assert_int_equal(count_get(&inits), 1);
    assert_int_equal(get_last_reason(), PDGW_END_OK);

    /* What each engine received. */
    assert_int_equal(fake_requests(&f.d), 1);
    /* Engines see a gateway-minted uuid4, never the client's id (a transfer name). */
    assert_int_equal(strlen(f.d.last_request_id), 36);
    assert_string_not_equal(f.d.last_request_id, "wf-test-1");
    /* Client headers forwarded (hop-by-hop ones not), the forwarder's leg header added,
     * the trace continued with a new span id. */
    assert_string_equal(f.d.last_custom, "kept");
    assert_string_equal(f.d.last_connection, "");
    assert_string_equal(f.d.last_leg_header, "decode");
    assert_int_equal(strlen(f.d.last_traceparent), 55);
    assert_memory_equal(f.d.last_traceparent, "00-0af7651916cd43dd8448eb211c80319c-", 36);
    assert_string_not_equal(f.d.last_traceparent + 36, "b7ad6b7169203331-01");
    db = json_loads(f.d.last_body, 0, NULL);
    assert_non_null(db);
    assert_int_equal(json_integer_value(json_object_get(db, "max_tokens")), 4);
    assert_true(json_is_true(json_object_get(db, "stream")) == (stream != 0));
    if (want_prefill) {
        /* Parallel: prefill is drained on the side and may still be on its way. */
        assert_int_equal(fake_wait_requests(&f.p, 1), 1);
        /* Both legs of one attempt carry the same minted id. */
        assert_string_equal(f.p.last_request_id, f.d.last_request_id);
        assert_string_equal(f.p.last_leg_header, "prefill");
        assert_string_equal(f.p.last_traceparent, f.d.last_traceparent);
        pb = json_loads(f.p.last_body, 0, NULL);
        assert_non_null(pb);
        assert_int_equal(json_integer_value(json_object_get(pb, "max_tokens")), 1);
        assert_true(json_is_false(json_object_get(pb, "stream")));
        assert_null(json_object_get(pb, "stop"));
        assert_true(json_is_true(json_object_get(pb, "ignore_eos")));
        json_decref(pb);
        /* Serial always reads the prefill response; parallel only if prefill ended
         * before decode did (it is aborted otherwise). */
        if (strcmp(protocol, "t-serial") == 0)
            assert_int_equal(count_get(&prefill_responses), 1);
        else
            assert_true(count_get(&prefill_responses) <= 1);
        if (strcmp(protocol, "t-serial") == 0) {
            /* Serial: decode got the prefill's kv_transfer_params. */
            json_t *kv = json_object_get(db, "kv_transfer_params");
            assert_string_equal(json_string_value(json_object_get(kv, "from")), "P");
        }
    } else {
        /* Single-stage: prefill booked (its endpoint in the body) but never called. */
        json_t *kv = json_object_get(db, "kv_transfer_params");
        assert_int_equal(fake_requests(&f.p), 0);
        assert_int_equal(json_integer_value(json_object_get(kv, "remote_port")), f.p.port);
    }
    json_decref(db);
    fixture_stop(&f);
}

static void test_serial_batch_stream(void **s)
{
    (void)s;
    run_case("t-serial", PDGW_MODE_BATCH, 1);
}
static void test_serial_batch_plain(void **s)
{
    (void)s;
    run_case("t-serial", PDGW_MODE_BATCH, 0);
}
static void test_serial_staged_stream(void **s)
{
    (void)s;
    run_case("t-serial", PDGW_MODE_STAGED, 1);
}
static void test_serial_staged_plain(void **s)
{
    (void)s;
    run_case("t-serial", PDGW_MODE_STAGED, 0);
}
static void test_parallel_batch_stream(void **s)
{
    (void)s;
    run_case("t-parallel", PDGW_MODE_BATCH, 1);
}
static void test_parallel_batch_plain(void **s)
{
    (void)s;
    run_case("t-parallel", PDGW_MODE_BATCH, 0);
}
static void test_parallel_staged_stream(void **s)
{
    (void)s;
    run_case("t-parallel", PDGW_MODE_STAGED, 1);
}
static void test_single_batch_stream(void **s)
{
    (void)s;
    run_case("t-single", PDGW_MODE_BATCH, 1);
}
static void test_single_staged_plain(void **s)
{
    (void)s;
    run_case("t-single", PDGW_MODE_STAGED, 0);
}

/* The built-in neutral forwarder passes the client's bytes through unchanged. */
static void test_neutral_passes_client_bytes(void **s)
{
    fixture_t f;
    client_resp_t r;
    static const char odd[] = "{ \"model\" : \"m\", \"prompt\":\"hi\" ,\"max_tokens\": 4,"
                              "\"stream\":true }";
    (void)s;
    fixture_start(&f, "neutral", PDGW_MODE_BATCH, 0);
    post(&f, odd, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, EXPECT_STREAM);
    assert_int_equal(fake_requests(&f.p), 0);
    assert_int_equal(fake_requests(&f.d), 1);
    assert_string_equal(f.d.last_body, odd);
    fixture_stop(&f);
}

static void *wake_later(void *arg)
{
    struct timespec dl;
    pdgw_fwd_waker_t *w;
    (void)arg;
    deadline_in(&dl, WAIT_MS);
    pthread_mutex_lock(&held_lock);
    while (held_waker == NULL && pthread_cond_timedwait(&held_set, &held_lock, &dl) == 0)
        ;
    w = held_waker;
    pthread_mutex_unlock(&held_lock);
    if (w == NULL)
        return NULL; /* the gate never ran: the client's request fails the test */
    /* The gate has returned PENDING or is about to: a short pause lets the worker park
     * the request first, so the wake takes the parked path (a wake that comes earlier
     * must work too; it only takes another path). */
    usleep(50 * 1000);
    pthread_mutex_lock(&held_lock);
    gate_opened = 1;
    pthread_mutex_unlock(&held_lock);
    pdgw_fwd_waker_wake(w);
    return NULL;
}

static void test_gate_woken_from_thread(void **s)
{
    fixture_t f;
    client_resp_t r;
    pthread_t th;
    (void)s;
    gate_mode = 1;
    gate_opened = 0;
    held_waker = NULL;
    fixture_start(&f, "t-gated", PDGW_MODE_BATCH, 0);
    /* The waker is only known once the gate ran: a thread waits for it, then wakes. */
    pthread_create(&th, NULL, wake_later, NULL);
    post(&f, STREAM_BODY, &r);
    pthread_join(th, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, EXPECT_STREAM);
    assert_int_equal(fake_requests(&f.d), 1);
    wait_cleanups(1);
    /* A wake after the request ended is harmless. */
    pdgw_fwd_waker_wake(held_waker);
    pdgw_fwd_waker_unref(held_waker);
    held_waker = NULL;
    gate_mode = 0;
    fixture_stop(&f);
}

static void test_gate_timeout(void **s)
{
    fixture_t f;
    client_resp_t r;
    json_t *err;
    (void)s;
    gate_mode = 2;
    gate_opened = 0;
    held_waker = NULL;
    fixture_start(&f, "t-gated", PDGW_MODE_BATCH, 0);
    post(&f, STREAM_BODY, &r);
    assert_int_equal(r.status, 504);
    err = json_loads(r.body, 0, NULL);
    assert_non_null(json_object_get(err, "error"));
    /* A PD failure names its phase and whether a retry could help. */
    assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "type")),
                        "pd_kv_transfer_error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "code")),
                        "not_retryable");
    json_decref(err);
    assert_non_null(strstr(r.headers, "X-PD-Failure-Phase: kv_transfer\r\n"));
    assert_non_null(strstr(r.headers, "X-PD-Retryable: false\r\n"));
    assert_non_null(strstr(r.headers, "X-Request-Id: wf-test-1\r\n"));
    assert_int_equal(fake_requests(&f.d), 0);
    wait_cleanups(1);
    assert_int_equal(get_last_reason(), PDGW_END_TIMEOUT);
    pdgw_fwd_waker_unref(held_waker);
    held_waker = NULL;
    gate_mode = 0;
    fixture_stop(&f);
}

static void test_retry_after_refused_prefill(void **s)
{
    fixture_t f;
    client_resp_t r;
    (void)s;
    /* Round robin over "dead" and p0: one of two requests first lands on "dead", fails
     * to connect, and its retry excludes it and lands on p0. */
    fixture_start(&f, "t-serial", PDGW_MODE_BATCH, 1);
    post(&f, STREAM_BODY, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, EXPECT_STREAM);
    post(&f, STREAM_BODY, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, EXPECT_STREAM);
    wait_cleanups_until(-1);
    /* At least one attempt hit "dead"; every attempt was cleaned up exactly once. */
    assert_true(count_get(&inits) >= 3);
    assert_int_equal(count_get(&cleanups), count_get(&inits));
    assert_int_equal(fake_requests(&f.p), 2);
    assert_int_equal(fake_requests(&f.d), 2);
    {
        pdgw_metric_t *m = pdgw_metric_family_series1(f.gm.retries, "t-serial");
        assert_int_equal((int)pdgw_metric_value(m), count_get(&inits) - 2);
    }
    fixture_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serial_batch_stream),
        cmocka_unit_test(test_serial_batch_plain),
        cmocka_unit_test(test_serial_staged_stream),
        cmocka_unit_test(test_serial_staged_plain),
        cmocka_unit_test(test_parallel_batch_stream),
        cmocka_unit_test(test_parallel_batch_plain),
        cmocka_unit_test(test_parallel_staged_stream),
        cmocka_unit_test(test_single_batch_stream),
        cmocka_unit_test(test_single_staged_plain),
        cmocka_unit_test(test_neutral_passes_client_bytes),
        cmocka_unit_test(test_gate_woken_from_thread),
        cmocka_unit_test(test_gate_timeout),
        cmocka_unit_test(test_retry_after_refused_prefill),
    };
    int rc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pdgw_log_set_level(PDGW_LOG_LEVEL_WARN);
    pdgw_log_set_access(getenv("WF_ACCESS_LOG") != NULL);
    pdgw_log_set_level(getenv("WF_ACCESS_LOG") ? PDGW_LOG_LEVEL_INFO : PDGW_LOG_LEVEL_WARN);
    assert_int_equal(pdgw_fwd_register(&t_serial), 0);
    assert_int_equal(pdgw_fwd_register(&t_parallel), 0);
    assert_int_equal(pdgw_fwd_register(&t_single), 0);
    assert_int_equal(pdgw_fwd_register(&t_gated), 0);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
