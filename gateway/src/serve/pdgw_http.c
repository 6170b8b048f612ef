/*
 * pdgw_http.c - the request path's entry: routing, request body, local replies, dispatch to
 * the workflow. Either front end calls it (begin / body / body done / end): libmicrohttpd's
 * access handler at the end of this file, or the native one (pdgw_front.c).
 *
 * A request that needs upstream work waits (under libmicrohttpd its connection is suspended);
 * the answer comes back through the sink (pdgw_sink.c), which wakes the front end, and the
 * front end writes it then.
 */
#include "pdgw_server_int.h"

#include "pdgw_otel.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "pdgw_alloc.h"

#include "pdgw_path.h"

/* ---------------------------------------------------------------- headers */

static bool header_is_hop_or_own(const pdgw_req_t *r, const char *name)
{
    static const struct {
        const char *name;
        size_t len;
    } drop[] = {{"connection", 10},
                {"keep-alive", 10},
                {"proxy-connection", 16},
                {"proxy-authenticate", 18},
                {"proxy-authorization", 19},
                {"te", 2},
                {"trailer", 7},
                {"trailers", 8},
                {"transfer-encoding", 17},
                {"upgrade", 7},
                {"host", 4},
                {"content-length", 14},
                {"content-type", 12},
                {"expect", 6},
                {"accept-encoding", 15},
                {"x-request-id", 12},
                {"traceparent", 11},
                {"x-request-timeout", 17},
                /* the gateway's latency targets (llm-d strips them as its own control
                 * headers too: they are not the engine's) */
                {"x-llm-d-slo-ttft-ms", 19},
                {"x-llm-d-slo-tpot-ms", 19},
                {"x-slo-ttft-ms", 13},
                {"x-slo-tpot-ms", 13},
                /* vLLM's DP routing header: the gateway picks the rank (and names its engine
                 * to the decode) */
                {"x-data-parallel-rank", 20}};
    size_t i, n = strlen(name);
    for (i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) /* the length first: most differ */
        if (n == drop[i].len && strcasecmp(name, drop[i].name) == 0)
            return true;
    /* Headers named in Connection are hop-by-hop too (RFC 9110 7.6.1). */
    if (r->conn_tokens) {
        const char *p = r->conn_tokens;
        while (*p) {
            size_t len;
            while (*p == ' ' || *p == '\t' || *p == ',')
                p++;
            len = strcspn(p, " \t,");
            if (len == n && len > 0 && strncasecmp(p, name, n) == 0)
                return true;
            p += len;
        }
    }
    /* The gateway's own key is not the engine's business. */
    if (n == 13 && r->own_authorization && strcasecmp(name, "authorization") == 0)
        return true;
    return false;
}

static bool collect_header(void *cls, const char *key, const char *value)
{
    pdgw_req_t *r = cls;
    if (key == NULL || value == NULL || header_is_hop_or_own(r, key))
        return true;
    if (strchr(value, '\r') || strchr(value, '\n'))
        return true;
    if (pdgw_buf_append(&r->fwd_headers, key, strlen(key)) != PDGW_OK ||
        pdgw_buf_append(&r->fwd_headers, ": ", 2) != PDGW_OK ||
        pdgw_buf_append(&r->fwd_headers, value, strlen(value) + 1) != PDGW_OK) /* with its NUL */
        return false;
    return true;
}

static void req_identity(pdgw_req_t *r)
{
    const char *id = pdgw_req_header(r, "X-Request-Id");
    const char *tp = pdgw_req_header(r, "traceparent");
    pdgw_traceparent_t parent, child;

    if (id && pdgw_request_id_is_valid(id, strlen(id)))
        snprintf(r->id, sizeof(r->id), "%s", id);
    else if (pdgw_uuid4(r->id) != PDGW_OK)
        snprintf(r->id, sizeof(r->id), "req-%llu", (unsigned long long)r->t_start_ns);
    if (tp && pdgw_traceparent_parse(tp, strlen(tp), &parent) == PDGW_OK &&
        pdgw_traceparent_child(&parent, &child) == PDGW_OK) {
        pdgw_traceparent_format(&child, r->traceparent);
        r->client_tp = parent;
        r->has_client_tp = true;
    } else if (pdgw_traceparent_new(&child) == PDGW_OK) {
        /* A new trace the exporter will not sample is forwarded unsampled, so the engines
         * do not record halves of traces nobody will see. */
        if (r->w->srv->opts.otel != NULL && !pdgw_otel_sampled(r->w->srv->opts.otel, &child, NULL))
            child.flags &= (uint8_t)~1u;
        pdgw_traceparent_format(&child, r->traceparent);
    }
}

/* The request's deadline: request_timeout, or the client's X-Request-Timeout up to
 * max_request_timeout (request_timeout when unset), so that a client cannot keep a trickled
 * body or an unread stream open past the operator's limit. */
static void req_deadline(pdgw_req_t *r)
{
    const char *h = pdgw_req_header(r, "X-Request-Timeout");
    uint64_t ms = r->request_timeout_ms;
    uint64_t cap = r->w->srv->opts.max_request_timeout_ms;
    if (h) {
        uint64_t v;
        if (cap == 0)
            cap = r->request_timeout_ms;
        if (pdgw_duration_parse(h, &v) == PDGW_OK && v > 0)
            ms = v < cap ? v : cap;
    }
    r->deadline_ms = r->t_start_ms + ms;
}

/* ---------------------------------------------------------------- local endpoints */

void pdgw_req_reply_json(pdgw_req_t *r, int status, json_t *obj)
{
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (text == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    /* json_dumps uses jansson's allocator (malloc by default): free() is right. */
    pdgw_req_reply(r, status, text, strlen(text), "application/json");
}

static void serve_ready(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    json_t *o;
    bool ready;
    if (srv->draining) {
        o = json_pack("{s:s}", "status", "draining");
        pdgw_req_reply_json(r, 503, o);
        return;
    }
    ready = sched_pool_ready(srv->opts.pool, srv->ready_roles);
    o = json_pack("{s:s,s:I,s:I}", "status", ready ? "ready" : "no usable instance", "prefill",
                  (json_int_t)sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_PREFILL), "decode",
                  (json_int_t)sched_pool_usable_count(srv->opts.pool, SCHED_ROLE_DECODE));
    pdgw_req_reply_json(r, ready ? 200 : 503, o);
}

static void serve_metrics(pdgw_req_t *r)
{
    pdgw_buf_t out = PDGW_BUF_INIT;
    char *text;
    size_t len;
    if (pdgw_metrics_render(r->w->srv->opts.metrics->reg, &out) != PDGW_OK) {
        pdgw_buf_free(&out);
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "cannot render metrics");
        return;
    }
    text = pdgw_buf_steal(&out, &len);
    pdgw_req_reply(r, 200, text, len, PDGW_METRICS_CONTENT_TYPE);
}

/* ---------------------------------------------------------------- routing */

/* Does the configured protocol serve this engine-native path (descriptor native_paths)? */
static bool native_path_served(const pdgw_req_t *r)
{
    const char *const *p = r->w->srv->desc ? r->w->srv->desc->native_paths : NULL;
    for (; p != NULL && *p != NULL; p++)
        if (strcmp(*p, r->path) == 0)
            return true;
    return false;
}

static void route(pdgw_req_t *r, const char *url)
{
    r->path_refused = pdgw_path_clean(url, r->path, sizeof(r->path), &r->path_why);
    if (r->path_refused != 0) {
        r->path[0] = '\0';
        r->route = PDGW_ROUTE_NONE;
        return;
    }
    if (strcmp(r->path, "/v1/completions") == 0) {
        r->route = PDGW_ROUTE_INFER;
        r->kind = PDGW_API_COMPLETIONS;
    } else if (strcmp(r->path, "/v1/chat/completions") == 0) {
        r->route = PDGW_ROUTE_INFER;
        r->kind = PDGW_API_CHAT_COMPLETIONS;
    } else if (strcmp(r->path, "/generate") == 0 && native_path_served(r)) {
        r->route = PDGW_ROUTE_INFER;
        r->kind = PDGW_API_GENERATE;
    } else if (strcmp(r->path, "/v1/models") == 0) {
        r->route = PDGW_ROUTE_MODELS;
    } else if (strcmp(r->path, "/health") == 0) {
        r->route = PDGW_ROUTE_HEALTH;
    } else if (strcmp(r->path, "/ready") == 0) {
        r->route = PDGW_ROUTE_READY;
    } else if (strcmp(r->path, "/metrics") == 0) {
        r->route = PDGW_ROUTE_METRICS;
    } else if (strcmp(r->path, "/admin/reload") == 0 || strcmp(r->path, "/admin/usage") == 0) {
        r->route = PDGW_ROUTE_ADMIN; /* pdgw_admin_serve, pdgw_admin_usage_serve */
    } else if (strncmp(r->path, "/admin/instances", 16) == 0 &&
               (r->path[16] == '\0' || r->path[16] == '/')) {
        /* The sub-path, kept only for this route. */
        r->route = PDGW_ROUTE_ADMIN;
        r->admin_path = pdgw_strdup(r->path + 16);
        if (r->admin_path == NULL) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
            return;
        }
    } else if (pdgw_phases_claim_route(r)) { /* pass-through */
        r->route = PDGW_ROUTE_PASSTHROUGH;
    } else {
        r->route = PDGW_ROUTE_NONE;
    }
}

/* The Allow header of a 405 (RFC 9110 15.5.6): the methods the target answers. */
const char *pdgw_http_allowed_methods(const pdgw_req_t *r)
{
    const char *sub = r->admin_path ? r->admin_path : "", *slash;
    switch (r->route) {
    case PDGW_ROUTE_INFER:
        return "POST";
    case PDGW_ROUTE_MODELS:
    case PDGW_ROUTE_HEALTH:
    case PDGW_ROUTE_READY:
    case PDGW_ROUTE_METRICS:
        return "GET, HEAD";
    case PDGW_ROUTE_ADMIN:
        if (strcmp(r->path, "/admin/reload") == 0)
            return "POST";
        if (sub[0] == '\0' || strcmp(sub, "/") == 0)
            return "GET, POST";
        slash = strchr(sub + 1, '/');
        return slash == NULL ? "GET, DELETE" : "POST"; /* /<id> or /<id>/(un)drain */
    default:
        return NULL;
    }
}

static bool method_ok(const pdgw_req_t *r)
{
    switch (r->route) {
    case PDGW_ROUTE_INFER:
        return strcmp(r->method, "POST") == 0;
    case PDGW_ROUTE_MODELS:
    case PDGW_ROUTE_HEALTH:
    case PDGW_ROUTE_READY:
    case PDGW_ROUTE_METRICS:
        return strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
    case PDGW_ROUTE_ADMIN:
        return strcmp(r->method, "GET") == 0 || strcmp(r->method, "POST") == 0 ||
               strcmp(r->method, "DELETE") == 0;
    default:
        return true;
    }
}

/* The checks every route passes as soon as its headers are in, before a 100 Continue and
 * before any body byte is held (client certificate, CORS preflight, route, method,
 * credentials); false = answered. */
static bool admit_head(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_gateway_metrics_t *gm = srv->opts.metrics;

    if (!pdgw_phases_head(r)) /* client certificate, CORS preflight: before routing and auth */
        return false;
    if (r->route == PDGW_ROUTE_NONE) {
        pdgw_gateway_metrics_rejected(gm, "not_found");
        pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, "unknown_url", "no route for %s %s",
                              r->method, r->path);
        return false;
    }
    if (!method_ok(r)) {
        pdgw_gateway_metrics_rejected(gm, "method");
        pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, "method_not_allowed",
                              "method %s not allowed on %s", r->method, r->path);
        return false;
    }
    return pdgw_phases_access(r); /* the admin rule, API keys */
}

/* The check of the body once it is read; false = answered. */
static bool dispatch_admit(pdgw_req_t *r)
{
    if (r->too_large) {
        pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "body_too_large");
        pdgw_req_reply_errorf(r, PDGW_API_ERR_TOO_LARGE, "request_too_large",
                              "request body exceeds the limit of %llu bytes",
                              (unsigned long long)r->max_body_bytes);
        return false;
    }
    return true;
}

/* Routes the gateway answers itself; true = answered. */
static bool dispatch_local(pdgw_req_t *r)
{
    const pdgw_route_ops_t *ops;
    switch (r->route) {
    case PDGW_ROUTE_HEALTH: {
        char *ok = pdgw_strdup("{\"status\":\"ok\"}");
        pdgw_req_reply(r, 200, ok, ok ? strlen(ok) : 0, "application/json");
        return true;
    }
    case PDGW_ROUTE_READY:
        serve_ready(r);
        return true;
    case PDGW_ROUTE_METRICS:
        serve_metrics(r);
        return true;
    default:
        ops = pdgw_phases_route_ops(r->route);
        return ops != NULL && ops->local != NULL && ops->local(r);
    }
}

static void dispatch(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    const pdgw_route_ops_t *ops;
    pdgw_wf_t *wf;

    if (!dispatch_admit(r) || dispatch_local(r))
        return;
    if (!pdgw_phases_body(r)) /* the body for its route: validation, the model served */
        return;
    ops = pdgw_phases_route_ops(r->route);
    if (ops == NULL || ops->job == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, "unknown_url", "no route for %s %s",
                              r->method, r->path);
        return;
    }
    if (srv->draining) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, "shutting_down",
                              "the gateway is shutting down");
        return;
    }
    /* Upstream work: its object, the headers to forward, the enter hooks, then the job. */
    wf = ops->job_create(r);
    if (wf == NULL) {
        pdgw_gateway_metrics_local_resource_error(srv->opts.metrics, "memory");
        r->reply_retry_after_s = 1;
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, NULL,
                              "the gateway is out of memory; retry later");
        return;
    }
    r->job = ops->job;
    r->conn_tokens = pdgw_req_header(r, MHD_HTTP_HEADER_CONNECTION);
    pdgw_req_headers_each(r, collect_header, r);
    /* Latency targets, pass-through's model, admission: refused, queued (the job starts when
     * admitted) or on. */
    if (!pdgw_phases_enter(wf, r->route))
        return;
    r->job->start(wf);
}

/* ---------------------------------------------------------------- the handler */

/* The peer's address, kept as it is (its text is written by the access log, if any). */
static void keep_client_addr(pdgw_req_t *r, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        memcpy(&r->client_addr.in, sa, sizeof(r->client_addr.in));
    else if (sa->sa_family == AF_INET6)
        memcpy(&r->client_addr.in6, sa, sizeof(r->client_addr.in6));
    else
        r->client_addr.sa.sa_family = AF_UNSPEC;
}

static pdgw_req_t *req_new(pdgw_worker_t *w, const pdgw_http_origin_t *o)
{
    pdgw_req_t *r = pdgw_req_alloc(w);
    if (r == NULL)
        return NULL;
    r->w = w;
    r->conn = o->conn;
    r->fc = o->fc;
    r->t_start_ns = pdgw_time_mono_ns();
    r->t_start_ms = r->t_start_ns / 1000000u;
    r->method = o->method;
    r->http11 = o->http11;
    pdgw_req_live_acquire(r); /* limits and forwarder context of this moment (reloads) */
    r->fd = o->fd;
    if (o->addr != NULL)
        keep_client_addr(r, o->addr);
    else
        r->client_addr.sa.sa_family = AF_UNSPEC;
    r->body.limit = 0;
    route(r, o->url);
    req_identity(r);
    req_deadline(r);
    pdgw_phases_arrive(r); /* the head is read: what the rooms above note (CORS origin) */
    r->cx = o->cx;
    pdgw_conn_headers_done(r->cx, r);
    if (r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
        r->route == PDGW_ROUTE_PASSTHROUGH) {
        atomic_fetch_add(&w->srv->inflight, 1);
        r->counted = true;
        pdgw_gauge_inc(w->srv->opts.metrics->inflight);
    }
    return r;
}

/* The header fields that must have one reading, counted in one walk of the head:
 * - Content-Length with Transfer-Encoding, or Content-Length twice, leaves no single agreed
 *   length (RFC 9112 6.1 and 6.3); a proxy in front of pdgw may have framed it differently,
 *   which is how requests are smuggled;
 * - a repeated Authorization (which key?) or a Host with white space (which authority?). */
typedef struct {
    unsigned content_length;
    unsigned transfer_encoding;
    unsigned authorization;
    unsigned host;
    bool host_space;
} head_fields_t;

static bool count_fields(void *cls, const char *key, const char *value)
{
    head_fields_t *f = cls;
    char first = key != NULL ? (char)(key[0] | 0x20) : '\0'; /* most names start otherwise */
    if (first == 'c' && strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        f->content_length++;
    } else if (first == 't' && strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->transfer_encoding++;
    } else if (first == 'a' && strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0) {
        f->authorization++;
    } else if (first == 'h' && strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        f->host++;
        f->host_space |= value != NULL && strpbrk(value, " \t") != NULL;
    }
    return true;
}

/* Room for <more> body bytes. With a Content-Length the buffer still grows only as bytes
 * arrive (a client cannot make us allocate what it never sends), but its last step lands
 * on the declared length exactly rather than on the next power of two. */
static pdgw_status_t body_room(pdgw_req_t *r, size_t more)
{
    size_t need = r->body.len + more;
    size_t want;

    if (r->declared_len == 0 || need < r->body.cap)
        return PDGW_OK;
    want = r->body.cap > need / 2 ? 2 * r->body.cap : need;
    if (want > r->declared_len)
        want = need > r->declared_len ? need : (size_t)r->declared_len;
    return pdgw_buf_reserve_exact(&r->body, want - r->body.len);
}

/* Refuse before reading the body. A body on its way is not read: the connection is closed
 * after the reply. */
static void refuse_early(pdgw_req_t *r)
{
    if (r->declared_len > 0 || pdgw_req_header(r, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL)
        r->reply_close = true;
    pdgw_conn_body_done(r->cx);
}

/* Take <n> bytes of the gateway's body budget for <r>; false = over it. */
static bool body_budget_take(pdgw_req_t *r, uint64_t n)
{
    pdgw_server_t *srv = r->w->srv;
    uint64_t cap = srv->opts.max_buffered_body_bytes;
    uint64_t held = atomic_fetch_add(&srv->body_bytes_held, n) + n;
    r->body_held += n;
    return cap == 0 || held <= cap;
}

static void refuse_body_budget(pdgw_req_t *r)
{
    pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "body_budget");
    r->reply_retry_after_s = 1;
    pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, "body_budget_exhausted",
                          "the gateway holds as many request bodies as it may "
                          "(max_buffered_body_bytes); retry later");
}

/* The head is in: refuse now what the body cannot change; false = answered. */
static bool admit_early(pdgw_req_t *r)
{
    pdgw_gateway_metrics_t *gm = r->w->srv->opts.metrics;
    const char *cl = pdgw_req_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    head_fields_t f = {0};
    /* First the length: a refusal below must know whether a body is on its way. */
    if (cl != NULL)
        r->declared_len = strtoull(cl, NULL, 10);
    pdgw_req_headers_each(r, count_fields, &f);
    if (f.content_length > 1 || (f.content_length > 0 && f.transfer_encoding > 0)) {
        pdgw_gateway_metrics_rejected(gm, "ambiguous_length");
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "ambiguous_request_length",
                              "a request may not carry both Content-Length and "
                              "Transfer-Encoding, nor Content-Length twice");
        return false;
    }
    if (r->path_refused != 0) {
        pdgw_gateway_metrics_rejected(gm, r->path_refused == 414 ? "uri_too_long" : "bad_path");
        if (r->path_refused == 414)
            pdgw_req_reply_errorf(r, PDGW_API_ERR_URI_TOO_LONG, "uri_too_long",
                                  "%s (at most %zu bytes)", r->path_why, sizeof(r->path) - 1);
        else
            pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "invalid_url", "%s", r->path_why);
        return false;
    }
    if (f.authorization > 1 || f.host > 1 || f.host_space) {
        pdgw_gateway_metrics_rejected(gm, "ambiguous_header");
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "ambiguous_header", "%s",
                              f.authorization > 1
                                  ? "a request may carry one Authorization header"
                                  : "a request carries one Host header, without white space");
        return false;
    }
    if (!admit_head(r))
        return false;
    if (r->declared_len > r->max_body_bytes) {
        r->too_large = true;
        dispatch_admit(r);
        return false;
    }
    if (r->declared_len > 0 && !body_budget_take(r, r->declared_len)) {
        refuse_body_budget(r);
        return false;
    }
    return true;
}

pdgw_req_t *pdgw_http_begin(pdgw_worker_t *w, const pdgw_http_origin_t *o)
{
    pdgw_req_t *r = req_new(w, o);
    if (r == NULL)
        return NULL;
    if (r->reply_ready || !admit_early(r))
        refuse_early(r);
    return r;
}

bool pdgw_http_body(pdgw_req_t *r, const char *data, size_t len)
{
    if (r->too_large || r->reply_ready)
        return true; /* read and dropped */
    if (r->body.len + len > r->max_body_bytes) {
        r->too_large = true;
        pdgw_buf_free(&r->body);
        return true;
    }
    /* A body of unknown length takes its budget as it comes. */
    if (r->body.len + len > r->body_held &&
        !body_budget_take(r, r->body.len + len - r->body_held)) {
        refuse_body_budget(r);
        pdgw_buf_free(&r->body);
        return true;
    }
    return body_room(r, len) == PDGW_OK && pdgw_buf_append(&r->body, data, len) == PDGW_OK;
}

void pdgw_http_body_done(pdgw_req_t *r)
{
    /* The whole request is in: its receive deadline is over. */
    pdgw_conn_body_done(r->cx);
    if (r->reply_ready || r->committed || r->dispatched)
        return;
    r->dispatched = true;
    dispatch(r);
}

void pdgw_http_end(pdgw_req_t *r, bool ok)
{
    pdgw_worker_hup_unwatch(r->w, r);
    /* The socket is the front end's again (or closed; its number may be reused at once). */
    pdgw_direct_forget(r);
    r->direct = false;
    /* A kept-alive connection must send its next request headers in time. */
    pdgw_conn_request_done(r->cx);
    pdgw_req_finalize(r, r->client_gone || !ok);
}

/* ---------------------------------------------------------------- libmicrohttpd glue */

enum MHD_Result pdgw_http_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    pdgw_worker_t *w = cls;
    pdgw_req_t *r = *con_cls;

    if (r == NULL) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ad =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        pdgw_http_origin_t o = {
            .conn = conn,
            .cx = pdgw_conn_of(conn),
            .fd = fd ? fd->connect_fd : -1,
            .addr = ad ? ad->client_addr : NULL,
            .url = url,
            .method = method,
            .http11 = version != NULL && strcmp(version, MHD_HTTP_VERSION_1_1) == 0,
        };
        r = pdgw_http_begin(w, &o);
        if (r == NULL)
            return MHD_NO;
        *con_cls = r;
        /* Refused before a body: MHD closes after a reply queued now. A request without
         * a body is answered on the next call instead, which keeps its connection. */
        if (r->reply_ready && r->reply_close)
            return pdgw_sink_queue_reply(r);
        return MHD_YES;
    }
    if (r->client_gone)
        return MHD_NO;
    if (*upload_data_size > 0) {
        bool ok = pdgw_http_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return ok ? MHD_YES : MHD_NO;
    }
    if (r->queued)
        return MHD_YES;
    if (!r->suspended)
        pdgw_http_body_done(r);
    if (r->reply_ready)
        return pdgw_sink_queue_reply(r);
    if (r->committed)
        return pdgw_sink_queue_stream(r);
    /* The answer is not known yet: wait for the workflow. */
    pdgw_req_suspend(r);
    return MHD_YES;
}

void pdgw_http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    pdgw_req_t *r = *con_cls;
    (void)cls;
    (void)conn;
    if (r == NULL)
        return;
    *con_cls = NULL;
    pdgw_http_end(r, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
}
