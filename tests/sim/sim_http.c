/*
 * HTTP front end on libmicrohttpd (one internal epoll thread).
 *
 * POST bodies are buffered, recorded for /sim/requests, validated, planned
 * and handed to the engine; the connection is then suspended until the
 * engine has something to send (first token for a stream, the whole answer
 * otherwise). A stream's content reader formats the chunks that are ready
 * and suspends itself again when it runs dry, so an open stream costs no
 * thread and no polling.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "sim_int.h"

#define SIM_MAX_BODY (64u << 20)

typedef struct sim_conn {
    char *body;
    size_t len, cap;
    int too_big;
    sim_req_t *req;
    uint64_t rec_seq;
    uint64_t t_read_ns; /* when the whole request had been read: the record's t_recv_us */
    int is_inference;
} sim_conn_t;

static struct MHD_Daemon *daemon_;
static atomic_int shutting_down;

void sim_http_resume(struct MHD_Connection *conn)
{
    MHD_resume_connection(conn);
}

static enum MHD_Result send_buf(struct MHD_Connection *conn, int status, const char *ctype,
                                char *body, const char *request_id, long long engine_us)
{
    struct MHD_Response *r;
    if (!body)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (request_id)
        MHD_add_response_header(r, "X-Request-Id", request_id);
    if (engine_us >= 0) {
        char v[32];
        snprintf(v, sizeof(v), "%lld", engine_us);
        MHD_add_response_header(r, "X-Sim-Engine-Time-Us", v);
    }
    if (status >= 500)
        atomic_fetch_add(&sim_ctr.http_5xx, 1);
    else if (status >= 400)
        atomic_fetch_add(&sim_ctr.http_4xx, 1);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, sim_conn_t *sc, int status,
                                  const char *msg, const char *type, const char *param,
                                  const char *request_id)
{
    if (sc && sc->rec_seq)
        sim_record_set(sc->rec_seq, "status", json_integer(status));
    return send_buf(conn, status, "application/json",
                    sim_openai_error_json(status, msg, type, param), request_id, -1);
}

/* An injected fault, with the Retry-After a load balancer in front of an overloaded engine
 * sends (vLLM itself sends none) when --fail-retry-after is set. */
static enum MHD_Result send_fault(struct MHD_Connection *conn, sim_conn_t *sc, int status,
                                  const char *msg, const char *type, const char *request_id)
{
    char *body = sim_openai_error_json(status, msg, type, NULL);
    struct MHD_Response *r;
    enum MHD_Result ret;
    char v[16];
    if (sim_cfg.fail_retry_after_s <= 0)
        return send_error(conn, sc, status, msg, type, NULL, request_id);
    if (!body)
        return MHD_NO;
    if (sc && sc->rec_seq)
        sim_record_set(sc->rec_seq, "status", json_integer(status));
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (request_id)
        MHD_add_response_header(r, "X-Request-Id", request_id);
    snprintf(v, sizeof(v), "%d", sim_cfg.fail_retry_after_s);
    MHD_add_response_header(r, "Retry-After", v);
    atomic_fetch_add(status >= 500 ? &sim_ctr.http_5xx : &sim_ctr.http_4xx, 1);
    ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static const char *status_type(int status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 404:
        return "NotFoundError";
    case 405:
        return "MethodNotAllowed";
    case 413:
        return "RequestEntityTooLarge";
    case 429:
        return "RateLimitError";
    case 503:
        return "ServiceUnavailableError";
    default:
        return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

/* ---- streaming content reader ---- */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    sim_req_t *req = cls;
    size_t copied = 0;
    ssize_t ret;
    sim_engine_lock();
    for (;;) {
        if (req->pend_off < req->pend_len) {
            size_t n = req->pend_len - req->pend_off;
            if (n > max - copied)
                n = max - copied;
            memcpy(buf + copied, req->pend + req->pend_off, n);
            copied += n;
            req->pend_off += n;
            if (req->pend_off == req->pend_len)
                req->pend_off = req->pend_len = 0;
            if (copied == max)
                break;
        }
        int r = req->generate ? sim_generate_stream_next(req) : sim_openai_stream_next(req);
        if (r == 1)
            continue;
        if (r == 0 && copied == 0 && req->conn) {
            req->suspended = 1;
            MHD_suspend_connection(req->conn);
        }
        break;
    }
    if (copied)
        ret = (ssize_t)copied;
    else if (req->tail_sent)
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    else
        ret = 0;
    sim_engine_unlock();
    return ret;
}

static void stream_free(void *cls)
{
    sim_req_t *req = cls;
    atomic_fetch_sub(&sim_ctr.open_streams, 1);
    sim_engine_lock();
    sim_req_unref_locked(req);
    sim_engine_unlock();
}

/* The engine said the response may start (under no lock). */
static enum MHD_Result respond(struct MHD_Connection *conn, sim_conn_t *sc)
{
    sim_req_t *req = sc->req;
    char us[32];
    sim_engine_lock();
    if (req->client_gone) {
        /* seen by the disconnect watcher: nobody to answer */
        sim_engine_unlock();
        return MHD_NO;
    }
    if (req->http_status && req->http_status != 200) {
        int status = req->http_status;
        char *body =
            sim_openai_error_json(status, req->error_msg ? req->error_msg : "failed",
                                  req->error_type ? req->error_type : status_type(status), NULL);
        long long eus = (long long)((sim_now_ns() - req->t_arrive) / 1000);
        sim_engine_unlock();
        sim_record_set(sc->rec_seq, "status", json_integer(status));
        sim_record_set(sc->rec_seq, "engine_time_us", json_integer(eus));
        return send_buf(conn, status, "application/json", body, req->request_id, eus);
    }
    if (req->stream) {
        req->refs++;
        long long eus =
            (long long)(((req->t_first ? req->t_first : sim_now_ns()) - req->t_arrive) / 1000);
        sim_engine_unlock();
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                   stream_reader, req, stream_free);
        if (!r) {
            sim_engine_lock();
            sim_req_unref_locked(req);
            sim_engine_unlock();
            return MHD_NO;
        }
        atomic_fetch_add(&sim_ctr.open_streams, 1);
        snprintf(us, sizeof(us), "%lld", eus);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Request-Id", req->request_id);
        MHD_add_response_header(r, "X-Sim-Engine-Time-Us", us);
        sim_record_set(sc->rec_seq, "status", json_integer(200));
        sim_record_set(sc->rec_seq, "engine_time_us", json_integer(eus));
        enum MHD_Result ret = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    char *body = req->generate ? sim_generate_full_response(req) : sim_openai_full_response(req);
    long long eus = (long long)((req->t_done - req->t_arrive) / 1000);
    json_int_t model_us = (json_int_t)(req->prefill_ns / 1000);
    json_int_t cached = (json_int_t)req->cached_tokens, cpu_hit = (json_int_t)req->cpu_hit_tokens;
    sim_engine_unlock();
    sim_record_set(sc->rec_seq, "prefill_model_us", json_integer(model_us));
    /* prompt tokens not computed: prefix-cache hits of both tiers, of which the CPU tier's */
    sim_record_set(sc->rec_seq, "cached_tokens", json_integer(cached));
    sim_record_set(sc->rec_seq, "cpu_hit_tokens", json_integer(cpu_hit));
    sim_record_set(sc->rec_seq, "status", json_integer(200));
    sim_record_set(sc->rec_seq, "engine_time_us", json_integer(eus));
    return send_buf(conn, 200, "application/json", body, req->request_id, eus);
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    json_t *hdrs = cls;
    char lower[128];
    size_t i;
    for (i = 0; key[i] && i + 1 < sizeof(lower); i++)
        lower[i] = (char)((key[i] >= 'A' && key[i] <= 'Z') ? key[i] + 32 : key[i]);
    lower[i] = 0;
    if (!strcmp(lower, "authorization"))
        return MHD_YES; /* recorded as presence only */
    json_object_set_new(hdrs, lower, json_string(value ? value : ""));
    return MHD_YES;
}

static char *make_request_id(struct MHD_Connection *conn)
{
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (h && *h && strlen(h) <= 256)
        return strdup(h);
    unsigned char rnd[16];
    char *s = malloc(33);
    if (!s)
        return NULL;
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        uint64_t t = sim_wall_ns();
        memcpy(rnd, &t, 8);
        memcpy(rnd + 8, &t, 8);
    }
    for (int i = 0; i < 16; i++)
        snprintf(s + 2 * i, 3, "%02x", rnd[i]);
    return s;
}

/* is_chat: 0 completions, 1 chat completions, SIM_API_GENERATE SGLang's /generate */
#define SIM_API_GENERATE 2

/* Record what arrived, before any validation; the body parsed as JSON (NULL
 * when it is too big or not JSON, <jerr> then says why). */
static json_t *record_entry(struct MHD_Connection *conn, sim_conn_t *sc, const char *url,
                            json_error_t *jerr)
{
    json_t *body = NULL;
    json_t *entry = json_object();
    json_t *hdrs = json_object();
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, hdrs);
    const char *xrid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    const char *tp = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent");
    int auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization") != NULL;
    if (!sc->too_big)
        body = json_loadb(sc->body ? sc->body : "", sc->len, JSON_REJECT_DUPLICATES, jerr);
    json_object_set_new(entry, "time_ns", json_integer((json_int_t)sim_wall_ns()));
    json_object_set_new(entry, "method", json_string("POST"));
    json_object_set_new(entry, "path", json_string(url));
    json_object_set_new(entry, "role", json_string(sim_role_name(sim_cfg.role)));
    json_object_set_new(entry, "request_id", xrid ? json_string(xrid) : json_null());
    json_object_set_new(entry, "traceparent", tp ? json_string(tp) : json_null());
    json_object_set_new(entry, "authorization", json_boolean(auth));
    json_object_set_new(entry, "headers", hdrs);
    json_object_set_new(entry, "body_bytes", json_integer((json_int_t)sc->len));
    if (body) {
        json_object_set(entry, "body", body);
    } else {
        json_object_set_new(entry, "body", json_null());
        if (!sc->too_big)
            json_object_set_new(
                entry, "body_raw",
                json_stringn_nocheck(sc->body ? sc->body : "", sc->len > 4096 ? 4096 : sc->len));
    }
    json_object_set_new(entry, "status", json_null());
    /* Stamped when the request had been read, not here: parsing and recording it is the
     * engine's own work, inside the [t_recv_us, t_done_us] window a benchmark charges to it. */
    json_object_set_new(entry, "t_recv_us", json_integer((json_int_t)(sc->t_read_ns / 1000)));
    sc->rec_seq = sim_record_add(entry);
    return body;
}

/* An inference request's arrival: recorded, and the crash fault's clock starts. */
static json_t *record_arrival(struct MHD_Connection *conn, sim_conn_t *sc, const char *url,
                              json_error_t *jerr)
{
    json_t *body = record_entry(conn, sc, url, jerr);
    sim_fault_arm_crash();
    return body;
}

/* X-data-parallel-rank: -1 none (or DP not modelled), -2 out of range. */
static int request_dp_rank(struct MHD_Connection *conn)
{
    int rank = -1;
    const char *dph = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-data-parallel-rank");
    if (dph && sim_cfg.dp_size_set) { /* without --dp-size the sim does not model DP ranks */
        char *end;
        long r = strtol(dph, &end, 10);
        if (*dph == '\0' || *end != '\0' || r < 0 || r >= sim_cfg.dp_size) {
            /* vLLM refuses a rank outside its data-parallel size */
            rank = -2;
        } else {
            rank = (int)r;
        }
    }
    return rank;
}

/* Parse <body> into <req>: 0, or an HTTP status with <msg>/<param>;
 * <injected> set when that is a fault of --fail-rate. */
static int parse_request(sim_req_t *req, json_t *body, int is_chat, char **msg, const char **param,
                         int *injected)
{
    const char *rid = req->request_id;
    int rc;

    if (asprintf(&req->resp_id, "%s%s", is_chat == 1 ? "chatcmpl-" : "cmpl-", rid) < 0)
        req->resp_id = NULL;
    if (!req->resp_id)
        rc = 500;
    else if (is_chat == SIM_API_GENERATE)
        rc = sim_generate_parse(body, req, msg, param);
    else
        rc = sim_openai_parse(body, is_chat, req, msg, param);
    if (!rc && req->dp_rank == -2) {
        rc = 400;
        if (asprintf(msg, "X-data-parallel-rank must be in [0, %d)", sim_cfg.dp_size) < 0)
            *msg = NULL;
    }
    if (!rc)
        rc = sim_kv_prepare(req, body, msg);
    if (!rc && sim_fault_roll(sim_cfg.fail_rate)) {
        atomic_fetch_add(&sim_ctr.faults_injected, 1);
        *injected = 1;
        rc = sim_cfg.fail_status;
        *msg = strdup("injected fault (--fail-rate)");
        *param = NULL;
    }
    return rc;
}

/* Hand a parsed request to the engine; respond now if it is already done,
 * else suspend the connection until it is. */
static enum MHD_Result start_request(struct MHD_Connection *conn, sim_conn_t *sc, sim_req_t *req)
{
    sc->req = req;
    req->conn = conn;
    req->http = 1;
    atomic_fetch_add(&sim_ctr.inflight, 1);
    sim_engine_submit(req);
    sim_engine_lock();
    if (req->response_ready) {
        sim_engine_unlock();
        return respond(conn, sc);
    }
    req->suspended = 1;
    MHD_suspend_connection(conn);
    /* held before its response started: notice a client that goes away */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        sim_watch_add_locked(req, ci->connect_fd);
    sim_engine_unlock();
    return MHD_YES;
}

static enum MHD_Result handle_inference(struct MHD_Connection *conn, sim_conn_t *sc,
                                        const char *url, int is_chat)
{
    json_error_t jerr;
    char *msg = NULL;
    const char *param = NULL;
    int rc, injected = 0;
    json_t *body = NULL;
    char *rid = make_request_id(conn);
    if (!rid)
        return MHD_NO;

    body = record_arrival(conn, sc, url, &jerr);

    if (sc->too_big) {
        char m[96];
        snprintf(m, sizeof(m), "request body exceeds %u bytes", SIM_MAX_BODY);
        enum MHD_Result r = send_error(conn, sc, 413, m, status_type(413), NULL, rid);
        free(rid);
        return r;
    }
    if (!body || !json_is_object(body)) {
        char m[256];
        if (!body)
            snprintf(m, sizeof(m), "Invalid JSON body: %s (line %d, column %d)", jerr.text,
                     jerr.line, jerr.column);
        else
            snprintf(m, sizeof(m), "request body must be a JSON object");
        json_decref(body);
        enum MHD_Result r = send_error(conn, sc, 400, m, status_type(400), NULL, rid);
        free(rid);
        return r;
    }
    if (atomic_load(&shutting_down)) {
        json_decref(body);
        enum MHD_Result r =
            send_error(conn, sc, 503, "engine shutting down", status_type(503), NULL, rid);
        free(rid);
        return r;
    }

    sim_req_t *req = calloc(1, sizeof(*req));
    if (!req) {
        json_decref(body);
        free(rid);
        return MHD_NO;
    }
    req->refs = 1; /* the connection's */
    req->request_id = rid;
    req->dp_rank = request_dp_rank(conn);
    req->rec_seq = sc->rec_seq;
    req->created = (int64_t)time(NULL);
    rc = parse_request(req, body, is_chat, &msg, &param, &injected);
    /* vLLM's serving layer (vllm/entrypoints/openai/engine/serving.py,
     * _with_kv_transfer_rejection_cleanup): an error answer to a request whose
     * kv_transfer_params ask for a remote prefill has the engine free the prefill's
     * blocks at once. A proxy in front of the engine (--fail-in-front) does not. */
    if (rc && body && sim_cfg.role == SIM_ROLE_DECODE && !(injected && sim_cfg.fail_in_front))
        sim_kv_reject(body);
    json_decref(body);
    if (rc) {
        enum MHD_Result r =
            injected ? send_fault(conn, sc, rc, msg ? msg : "injected fault", status_type(rc), rid)
                     : send_error(conn, sc, rc, msg ? msg : "invalid request", status_type(rc),
                                  param, rid);
        free(msg);
        sim_engine_lock();
        sim_req_unref_locked(req);
        sim_engine_unlock();
        return r;
    }
    return start_request(conn, sc, req);
}

/* vLLM's model list (vllm/entrypoints/openai/serving_models.py show_available_models, the
 * ModelCard of protocol.py): one card per served name, root the model path, owned_by "vllm",
 * created the time of the answer. */
static enum MHD_Result handle_models(struct MHD_Connection *conn)
{
    json_t *data = json_array();
    int n = sim_cfg.n_served ? sim_cfg.n_served : 1;
    for (int i = 0; data && i < n; i++)
        json_array_append_new(data,
                              json_pack("{s:s,s:s,s:I,s:s,s:s,s:n,s:i,s:[]}", "id",
                                        sim_cfg.n_served ? sim_cfg.served[i] : sim_cfg.model,
                                        "object", "model", "created", (json_int_t)time(NULL),
                                        "owned_by", "vllm", "root", sim_cfg.model, "parent",
                                        "max_model_len", sim_cfg.max_model_len, "permission"));
    json_t *m = data ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL;
    char *s = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    return send_buf(conn, 200, "application/json", s, NULL, -1);
}

static enum MHD_Result handle_info(struct MHD_Connection *conn)
{
    json_t *alloc = json_array(), *init = json_array();
    for (int i = 0; i < sim_cfg.n_alloc_ports; i++)
        json_array_append_new(alloc, json_integer(sim_cfg.alloc_ports[i]));
    for (int i = 0; i < sim_cfg.n_init_ports; i++)
        json_array_append_new(init, json_integer(sim_cfg.init_ports[i]));
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:i,s:i,s:o,s:o,s:s,s:i,s:i,s:i,s:i,s:b}", "role",
                          sim_role_name(sim_cfg.role), "model", sim_cfg.model, "engine_id",
                          sim_cfg.engine_id, "kv_host", sim_cfg.kv_host, "kv_port", sim_cfg.kv_port,
                          "bootstrap_port", sim_cfg.bootstrap_port, "alloc_ports", alloc,
                          "init_ports", init, "kv_mode", sim_kv_mode_name(sim_cfg.kv_mode),
                          "layers", sim_cfg.layers, "block_size", sim_cfg.block_size,
                          "kv_bytes_per_token", sim_cfg.kv_bytes_per_token, "kv_capacity_tokens",
                          sim_cfg.kv_capacity_tokens, "layerwise", sim_cfg.layerwise);
    char *s = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    return send_buf(conn, 200, "application/json", s, NULL, -1);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    sim_conn_t *sc = *con_cls;
    if (!sc) {
        sc = calloc(1, sizeof(*sc));
        if (!sc)
            return MHD_NO;
        *con_cls = sc;
        atomic_fetch_add(&sim_ctr.http_requests, 1);
        atomic_fetch_add(&sim_ctr.active_connections, 1);
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (sc->too_big || sc->len + n > SIM_MAX_BODY) {
            sc->too_big = 1;
            free(sc->body);
            sc->body = NULL;
            sc->len = sc->cap = 0;
            return MHD_YES;
        }
        if (sc->len + n + 1 > sc->cap) {
            size_t cap = sc->cap ? sc->cap : 4096;
            while (cap < sc->len + n + 1)
                cap *= 2;
            char *b = realloc(sc->body, cap);
            if (!b)
                return MHD_NO;
            sc->body = b;
            sc->cap = cap;
        }
        memcpy(sc->body + sc->len, upload_data, n);
        sc->len += n;
        return MHD_YES;
    }
    if (sc->req)
        return respond(conn, sc); /* resumed by the engine */
    if (sc->t_read_ns == 0)
        sc->t_read_ns = sim_now_ns();

    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int is_post = !strcmp(method, "POST");
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        if (!is_post)
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        sc->is_inference = 1;
        return handle_inference(conn, sc, url, !strcmp(url, "/v1/chat/completions"));
    }
    if (!strcmp(url, "/generate")) {
        if (!is_post && strcmp(method, "PUT"))
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        sc->is_inference = 1;
        return handle_inference(conn, sc, url, SIM_API_GENERATE);
    }
    if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
        int st;
        char *m = NULL, *out;
        if (!is_post)
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        if (sim_cfg.record_tokenize) {
            json_error_t jerr;
            json_decref(record_entry(conn, sc, url, &jerr));
        }
        out = sim_tokenize_handle(url, sc->body, sc->too_big ? 0 : sc->len, &st, &m);
        if (out) {
            if (sc->rec_seq)
                sim_record_set(sc->rec_seq, "status", json_integer(200));
            return send_buf(conn, 200, "application/json", out, NULL, -1);
        }
        enum MHD_Result r = send_error(conn, sc, st, m ? m : "error", status_type(st), NULL, NULL);
        free(m);
        return r;
    }
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/models") || !strcmp(url, "/metrics") ||
        !strcmp(url, "/sim/info")) {
        if (!is_get)
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        if (!strcmp(url, "/health"))
            return send_buf(conn, 200, "text/plain", strdup(""), NULL, -1);
        if (!strcmp(url, "/v1/models"))
            return handle_models(conn);
        if (!strcmp(url, "/sim/info"))
            return handle_info(conn);
        return send_buf(conn, 200, "text/plain; version=0.0.4; charset=utf-8", sim_metrics_render(),
                        NULL, -1);
    }
    if (!strcmp(url, "/sim/restart")) {
        /* a simulated restart: vLLM mints new engine ids at every start */
        char out[160];
        if (!is_post)
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        snprintf(out, sizeof(out), "{\"generation\":%d}", sim_restart_bump());
        return send_buf(conn, 200, "application/json", strdup(out), NULL, -1);
    }
    if (!strcmp(url, "/sim/speed")) {
        /* the engine slows down (or recovers) while serving: a test's own knob */
        const char *f = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "factor");
        char *end = NULL, out[64];
        double v = f ? strtod(f, &end) : 0.0;
        if (!is_post)
            return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
        if (!f || end == f || *end || !(v >= 0.01 && v <= 100.0))
            return send_error(conn, NULL, 400, "factor: a number in 0.01..100", status_type(400),
                              NULL, NULL);
        sim_engine_set_live_speed(v);
        snprintf(out, sizeof(out), "{\"factor\":%g}", v);
        return send_buf(conn, 200, "application/json", strdup(out), NULL, -1);
    }
    if (!strcmp(url, "/sim/requests")) {
        if (is_get) {
            const char *rid =
                MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "request_id");
            return send_buf(conn, 200, "application/json", sim_record_dump(rid), NULL, -1);
        }
        if (!strcmp(method, "DELETE")) {
            sim_record_clear();
            return send_buf(conn, 200, "application/json", strdup("{\"cleared\":true}"), NULL, -1);
        }
        return send_error(conn, NULL, 405, "Method Not Allowed", status_type(405), NULL, NULL);
    }
    return send_error(conn, NULL, 404, "Not Found", status_type(404), NULL, NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    sim_conn_t *sc = *con_cls;
    if (!sc)
        return;
    *con_cls = NULL;
    atomic_fetch_sub(&sim_ctr.active_connections, 1);
    if (sc->req) {
        sim_req_t *req = sc->req;
        atomic_fetch_sub(&sim_ctr.inflight, 1);
        sim_engine_lock();
        sim_watch_remove_locked(req);
        req->conn = NULL;
        req->conn_gone = 1;
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
            if (!req->client_gone) {
                req->client_gone = 1;
                atomic_fetch_add(&sim_ctr.client_disconnects, 1);
            }
            sim_engine_cancel_locked(req);
            sim_kv_on_client_gone_locked(req); /* e.g. KV held for an answer never delivered */
        }
        sim_req_unref_locked(req);
        sim_engine_unlock();
    }
    free(sc->body);
    free(sc);
}

int sim_http_start(void)
{
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof(a4));
    memset(&a6, 0, sizeof(a6));
    if (inet_pton(AF_INET, sim_cfg.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)sim_cfg.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, sim_cfg.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)sim_cfg.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "pdgw-sim: --host: '%s' is not an IPv4/IPv6 address\n", sim_cfg.host);
        return -1;
    }
    /* The watcher first: the daemon's thread serves requests as soon as it starts, and
     * they register with the watcher (its epoll fd must be set before that thread runs). */
    if (sim_watch_start())
        return -1;
    daemon_ = MHD_start_daemon(
        flags, (uint16_t)sim_cfg.port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)60000, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096, MHD_OPTION_LISTENING_ADDRESS_REUSE,
        (unsigned)1, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(16 * 1024), MHD_OPTION_END);
    if (!daemon_) {
        fprintf(stderr, "pdgw-sim: cannot listen on %s:%d\n", sim_cfg.host, sim_cfg.port);
        sim_watch_stop();
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port)
        sim_cfg.port = di->port;
    return 0;
}

/* Refuse new work; the caller then drains the engine (which resumes every
 * suspended connection) before sim_http_stop(). */
void sim_http_quiesce(void);
void sim_http_quiesce(void)
{
    atomic_store(&shutting_down, 1);
}

void sim_http_stop(void)
{
    /* the engine has answered everything: let those answers reach the wire */
    uint64_t deadline = sim_now_ns() + 3000000000ull;
    while (daemon_ && atomic_load(&sim_ctr.inflight) > 0 && sim_now_ns() < deadline) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (daemon_) {
        MHD_stop_daemon(daemon_);
        sim_watch_stop(); /* after the daemon: every connection has ended */
    }
    daemon_ = NULL;
}
