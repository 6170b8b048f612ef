/*
 * pdgw_passthrough.c - every engine endpoint that is not a PD workflow, proxied unchanged.
 *
 * Any other path under /v1/ (embeddings, rerank, score, responses, audio, ...) and the
 * engines' utility endpoints (/tokenize, /detokenize, /pooling, /classify, /score, /rerank,
 * ...) go to one instance serving the body's `model` (decode or both role; a `both` instance
 * is preferred since it serves whole requests), or to any healthy one when the request names
 * no model. Method, query, body and the client's headers go as they came; the engine's
 * status, end-to-end headers and body come back as they come, byte by byte, so streams (SSE) are
 * relayed live with the same back-pressure as chat streams. Auth, body limits, the request
 * deadline, first-byte and idle timeouts, retries before the first byte and metrics apply
 * as for chat.
 */
#include "pdgw_server_int.h"
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */
#include "pdgw_wf.h"
#include "pdgw_fleet.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "pdgw_alloc.h"
#include "pdgw_json_load.h"

#include "pdgw_path.h"

/* The owner of a raw leg: the engine's headers and bytes go to the client as they come. */
static const pdgw_leg_owner_t pt_leg_owner;

#define PT_PROTOCOL "passthrough" /* protocol label of its upstream-error metrics */

/* Utility endpoints outside /v1/ of vLLM (vllm/entrypoints/openai/api_server.py and
 * vllm/entrypoints/pooling) and SGLang (python/sglang/srt/entrypoints/http_server.py). */
static const char *const pt_paths[] = {
    "/tokenize",  "/detokenize", "/pooling", "/classify",       "/score",           "/rerank",
    "/v2/rerank", "/encode",     "/version", "/get_model_info", "/get_server_info", NULL,
};

/* /v1/ families a metric names; anything else under /v1/ is "/v1/other". */
static const char *const pt_v1_families[] = {
    "/v1/embeddings",  "/v1/rerank",   "/v1/score",      "/v1/responses", "/v1/audio",
    "/v1/moderations", "/v1/files",    "/v1/batches",    "/v1/images",    "/v1/classify",
    "/v1/pooling",     "/v1/tokenize", "/v1/detokenize", "/v1/models",    NULL,
};

bool pdgw_pt_route(pdgw_req_t *r)
{
    const pdgw_server_t *srv = r->w->srv;
    size_t i;
    if (srv->opts.no_passthrough)
        return false;
    if (strncmp(r->path, "/v1/", 4) == 0 && r->path[4] != '\0')
        return true;
    /* SGLang's native generation endpoint, when the protocol does not serve it itself: only
     * a plain proxy (no prefill leg) passes it on; a PD protocol would skip its prefill. */
    if (strcmp(r->path, "/generate") == 0)
        return srv->plan.dispatch == PDGW_DISPATCH_SINGLE && !srv->plan.single_needs_prefill;
    for (i = 0; pt_paths[i]; i++)
        if (strcmp(r->path, pt_paths[i]) == 0)
            return true;
    return false;
}

/* The endpoint label of the metrics (bounded set). */
static const char *pt_endpoint(const pdgw_req_t *r)
{
    size_t i;
    for (i = 0; pt_paths[i]; i++)
        if (strcmp(r->path, pt_paths[i]) == 0)
            return pt_paths[i];
    if (strcmp(r->path, "/generate") == 0)
        return "/generate";
    for (i = 0; pt_v1_families[i]; i++) {
        size_t n = strlen(pt_v1_families[i]);
        if (strncmp(r->path, pt_v1_families[i], n) == 0 &&
            (r->path[n] == '\0' || r->path[n] == '/'))
            return pt_v1_families[i];
    }
    return "/v1/other";
}

/* ---------------------------------------------------------------- request */

typedef struct {
    pdgw_buf_t *out;
    bool first;
    bool ok;
} query_ctx_t;

static void pct_encode(pdgw_buf_t *out, const char *s, bool *ok)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_' || c == '.' || c == '~';
        if (plain)
            *ok &= pdgw_buf_append_char(out, (char)c) == PDGW_OK;
        else
            *ok &= pdgw_buf_appendf(out, "%%%c%c", hex[c >> 4], hex[c & 15]) == PDGW_OK;
    }
}

static bool add_query_arg(void *cls, const char *key, const char *value)
{
    query_ctx_t *q = cls;
    if (key == NULL)
        return true;
    q->ok &= pdgw_buf_append_char(q->out, q->first ? '?' : '&') == PDGW_OK;
    q->first = false;
    pct_encode(q->out, key, &q->ok);
    if (value != NULL) {
        q->ok &= pdgw_buf_append_char(q->out, '=') == PDGW_OK;
        pct_encode(q->out, value, &q->ok);
    }
    return true;
}

/* r->path re-encoded (pdgw_path.c: no byte of it can end the request line) plus the
 * client's query (re-encoded from its decoded arguments). */
static char *pt_target(pdgw_req_t *r)
{
    pdgw_buf_t out = PDGW_BUF_INIT;
    query_ctx_t q = {&out, true, true};
    size_t len;
    q.ok = pdgw_path_encode(&out, r->path) == PDGW_OK;
    pdgw_req_query_each(r, add_query_arg, &q);
    if (!q.ok || out.len >= 1000) { /* the leg's URL buffer holds about 1 KiB */
        pdgw_buf_free(&out);
        return NULL;
    }
    return pdgw_buf_steal(&out, &len);
}

/* The body's "model" when the body is a JSON object naming one (owned copy) or NULL. The
 * parsed object stays in r->json for admission (the body's `priority` and `user`, read as
 * for chat); the bytes go to the engine unchanged. */
static char *pt_body_model(pdgw_req_t *r)
{
    json_t *j, *m;
    char *model = NULL;
    if (r->json != NULL || r->body.len == 0 || r->body.data == NULL || r->body.data[0] != '{')
        return NULL;
    j = pdgw_json_loadb(r->body.data, r->body.len, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    m = json_object_get(j, "model");
    if (json_is_string(m) && json_string_length(m) > 0 &&
        strlen(json_string_value(m)) == json_string_length(m))
        model = pdgw_strdup(json_string_value(m));
    r->json = j;
    return model;
}

static void pt_finish(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    wf->stage = PDGW_WF_FINISHED;
    pdgw_worker_active_remove(wf->w, r);
}

/* Book a decode-capable instance of the request's model, a `both` one first. */
static sched_status_t pt_book(pdgw_wf_t *wf)
{
    sched_pool_t *pool = wf->w->srv->opts.pool;
    sched_request_t sr;
    sched_status_t st;
    memset(&sr, 0, sizeof(sr));
    sr.model = wf->pt_model;
    sr.only_role = SCHED_ROLE_BOTH;
    st = sched_book_decode(pool, &sr, &wf->booking);
    if (st == SCHED_ERR_NO_INSTANCE) {
        sr.only_role = 0;
        st = sched_book_decode(pool, &sr, &wf->booking);
    }
    return st;
}

static bool pt_start_leg(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_leg_t *leg = &wf->legs[PDGW_LEG_DECODE];
    sched_instance_t *si = sched_booking_instance(wf->booking, SCHED_LEG_DECODE);
    const char *ctype = pdgw_req_header(r, "Content-Type");
    pdgw_fwd_leg_t fl;
    char *target;
    pdgw_status_t st;

    memset(&fl, 0, sizeof(fl));
    if (ctype && !strpbrk(ctype, "\r\n") && strlen(ctype) < sizeof(fl.headers[0]) - 16)
        snprintf(fl.headers[fl.n_headers++], sizeof(fl.headers[0]), "Content-Type: %s", ctype);
    pdgw_instance_view_from_sched(&wf->inst_view[PDGW_LEG_DECODE], si);
    snprintf(wf->decode_id, sizeof(wf->decode_id), "%s", sched_instance_id(si));
    pdgw_leg_init(leg, &wf->origin, wf, PDGW_LEG_DECODE, &pt_leg_owner);
    leg->raw = true;
    leg->relay = true;
    leg->body_borrowed = true;
    target = pt_target(r);
    if (target == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "invalid_url",
                              "request target too long to forward");
        return false;
    }
    st = pdgw_leg_start(leg, &wf->inst_view[PDGW_LEG_DECODE], target, r->method, r->body.data,
                        r->body.len, &fl);
    pdgw_free(target);
    if (st != PDGW_OK) {
        leg->body_borrowed = false;
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "cannot start the upstream leg");
        return false;
    }
    return true;
}

bool pdgw_pt_prepare(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    wf->passthrough = true;
    if (wf->pt_model == NULL)
        wf->pt_model = pt_body_model(r);
    return pdgw_models_admit(r, wf->pt_model);
}

void pdgw_pt_start(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    sched_pool_t *pool = wf->w->srv->opts.pool;
    sched_status_t st;

    wf->pt = true;
    wf->req->stream_raw = true;
    if (pdgw_uuid4(wf->leg_id) != PDGW_OK) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, NULL, "no randomness for a request id");
        return;
    }
    st = pt_book(wf);
    if (st != SCHED_OK) {
        wf->booking = NULL;
        if (st == SCHED_ERR_NO_INSTANCE && sched_pool_usable_count(pool, SCHED_ROLE_DECODE) > 0) {
            /* Instances are up but each is at its max_concurrent: overload, 429 as for
             * chat (pdgw_workflow.c), not an outage. */
            r->reply_retry_after_s = 1;
            pdgw_req_reply_errorf(r, PDGW_API_ERR_RATE_LIMITED, "no_capacity",
                                  "every usable instance%s%s%s is at its max_concurrent; retry "
                                  "later",
                                  wf->pt_model ? " of model '" : "",
                                  wf->pt_model ? wf->pt_model : "", wf->pt_model ? "'" : "");
            return;
        }
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, "no_instance",
                              "no usable instance%s%s%s: %s", wf->pt_model ? " of model '" : "",
                              wf->pt_model ? wf->pt_model : "", wf->pt_model ? "'" : "",
                              sched_strerror(st));
        return;
    }
    wf->stage = PDGW_WF_DECODE;
    pdgw_worker_active_add(wf->w, r);
    if (!pt_start_leg(wf))
        pt_finish(wf);
}

/* ---------------------------------------------------------------- response */

/* Headers the gateway sets itself or that belong to one hop (RFC 9110 7.6.1). Connection
 * is kept until the headers go out: the fields it names are dropped with it. */
static bool pt_header_own(const char *name, size_t n)
{
    static const char *const own[] = {"keep-alive",
                                      "proxy-connection",
                                      "transfer-encoding",
                                      "te",
                                      "trailer",
                                      "upgrade",
                                      "content-length",
                                      "content-type",
                                      "date",
                                      "x-request-id",
                                      "vary",
                                      NULL};
    size_t i;
    if (n > 15 && strncasecmp(name, "access-control-", 15) == 0)
        return true; /* CORS is pdgw's decision (cors_allowed_origins) */
    for (i = 0; own[i]; i++)
        if (strlen(own[i]) == n && strncasecmp(name, own[i], n) == 0)
            return true;
    return false;
}

static void pt_on_header(pdgw_leg_t *leg, const char *line, size_t len)
{
    pdgw_wf_t *wf = leg->wf;
    const char *colon;
    size_t n, vlen, mark;

    if (len >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        pdgw_buf_reset(&wf->pt_headers); /* a new status line (after 100 Continue) */
        return;
    }
    colon = memchr(line, ':', len);
    if (colon == NULL || colon == line || wf->pt_relayed)
        return;
    n = (size_t)(colon - line);
    if (pt_header_own(line, n) || wf->pt_headers.len > 16 * 1024)
        return;
    colon++;
    while (colon < line + len && (*colon == ' ' || *colon == '\t'))
        colon++;
    vlen = len - (size_t)(colon - line);
    while (vlen > 0 &&
           (colon[vlen - 1] == '\r' || colon[vlen - 1] == '\n' || colon[vlen - 1] == ' '))
        vlen--;
    if (memchr(colon, '\0', vlen) != NULL || memchr(line, '\0', n) != NULL)
        return;
    mark = wf->pt_headers.len;
    if (pdgw_buf_append(&wf->pt_headers, line, n) != PDGW_OK ||
        pdgw_buf_append_char(&wf->pt_headers, '\0') != PDGW_OK ||
        pdgw_buf_append(&wf->pt_headers, colon, vlen) != PDGW_OK ||
        pdgw_buf_append_char(&wf->pt_headers, '\0') != PDGW_OK)
        wf->pt_headers.len = mark; /* out of memory: only whole pairs stay */
}

/* Does a Connection field among the engine's headers <h> name <name> (RFC 9110 7.6.1)? */
static bool pt_connection_names(const pdgw_buf_t *h, const char *name)
{
    size_t off = 0;
    while (off < h->len) {
        const char *n = h->data + off, *v = n + strlen(n) + 1;
        if (strcasecmp(n, "connection") == 0 && pdgw_h1_list_has(v, strlen(v), name))
            return true;
        off = (size_t)(v - h->data) + strlen(v) + 1;
    }
    return false;
}

void pdgw_pt_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *out)
{
    const pdgw_buf_t *h;
    size_t off = 0;
    if (kind != PDGW_HEADERS_STREAM || !r->stream_raw || r->wf == NULL)
        return;
    h = &r->wf->pt_headers; /* only a pass-through (with a workflow) */
    while (off < h->len) {
        const char *name = h->data + off;
        const char *value = name + strlen(name) + 1;
        if (strcasecmp(name, "connection") != 0 && !pt_connection_names(h, name))
            pdgw_hdr_add(out, name, value);
        off = (size_t)(value - h->data) + strlen(value) + 1;
    }
}

/* The engine's status, type and headers go out with its first bytes (pdgw_http.c
 * queue_stream reads them for a pass-through). */
static void pt_commit(pdgw_wf_t *wf, const pdgw_leg_t *leg)
{
    pdgw_req_t *r = wf->req;
    wf->pt_relayed = true;
    r->reply_status = (int)leg->status;
    snprintf(r->reply_ctype, sizeof(r->reply_ctype), "%s",
             leg->content_type[0] ? leg->content_type : "application/octet-stream");
    r->committed = true;
    r->final_status = (int)leg->status;
    wf->t_first_token_ns = pdgw_time_mono_ns();
    pdgw_req_resume(r);
}

static void pt_on_drain(void *leg)
{
    pdgw_leg_unpause(leg);
}

static size_t pt_on_write(pdgw_leg_t *leg, const char *data, size_t len)
{
    pdgw_wf_t *wf = leg->wf;
    pdgw_req_t *r = wf->req;
    if (r->client_gone || wf->stage == PDGW_WF_FINISHED)
        return 0;
    if (!wf->pt_relayed)
        pt_commit(wf, leg);
    if (pdgw_req_out_pending(r) > PDGW_OUT_HIGH_WATER) {
        leg->paused = true; /* the sink resumes it once the client caught up */
        pdgw_req_on_drain(r, pt_on_drain, leg);
        return CURL_WRITEFUNC_PAUSE;
    }
    leg->bytes_in += len;
    pdgw_req_out_append(r, data, len);
    return len;
}

static void pt_book_finish(pdgw_wf_t *wf, const pdgw_leg_t *leg)
{
    sched_result_t res;
    if (wf->booking == NULL || !sched_booking_leg_open(wf->booking, SCHED_LEG_DECODE))
        return;
    memset(&res, 0, sizeof(res));
    res.outcome = pdgw_leg_outcome(leg);
    res.http_status = (int)leg->status;
    res.retry_after_ms = leg->retry_after_ms;
    res.detail = leg->errmsg[0] ? leg->errmsg : NULL;
    (void)sched_booking_finish(wf->booking, SCHED_LEG_DECODE, &res);
}

/* Before anything reached the client, a connect failure may go to another instance. */
static bool pt_retry(pdgw_wf_t *wf, const pdgw_leg_t *leg)
{
    pdgw_req_t *r = wf->req;
    if (wf->pt_relayed || leg->err != PDGW_LEGERR_CONNECT || wf->attempt >= r->max_retries ||
        pdgw_now_ms() >= r->deadline_ms)
        return false;
    pdgw_leg_release(&wf->legs[PDGW_LEG_DECODE]);
    if (sched_booking_rebook(wf->booking, SCHED_LEG_DECODE) != SCHED_OK)
        return false;
    wf->attempt++;
    pdgw_gateway_metrics_retry(wf->w->srv->opts.metrics, PT_PROTOCOL);
    return pt_start_leg(wf);
}

static void pt_leg_done(pdgw_leg_t *leg)
{
    pdgw_wf_t *wf = leg->wf;
    pdgw_req_t *r = wf->req;
    pdgw_gateway_metrics_t *gm = wf->w->srv->opts.metrics;
    if (wf->stage == PDGW_WF_FINISHED)
        return;
    pt_book_finish(wf, leg);
    if (leg->err != PDGW_LEGERR_NONE && leg->err != PDGW_LEGERR_STATUS) {
        if (leg->err != PDGW_LEGERR_LOCAL)
            pdgw_gateway_metrics_upstream_error(gm, PT_PROTOCOL, leg->inst->id,
                                                pdgw_leg_err_name(leg->err));
        pdgw_req_error_set(r, "%s", leg->errmsg);
        if (pt_retry(wf, leg))
            return;
    }
    pt_finish(wf);
    if (wf->pt_relayed) {
        /* A cut stream ends here; the client sees the bytes the engine sent. */
        pdgw_req_out_end(r);
        return;
    }
    if (leg->err == PDGW_LEGERR_NONE || leg->err == PDGW_LEGERR_STATUS) {
        /* The engine answered without a body: its status and headers all the same. */
        pt_commit(wf, leg);
        pdgw_req_out_end(r);
        return;
    }
    pdgw_req_reply_errorf(
        r, leg->err == PDGW_LEGERR_TIMEOUT ? PDGW_API_ERR_TIMEOUT : PDGW_API_ERR_BAD_GATEWAY, NULL,
        "%s", leg->errmsg[0] ? leg->errmsg : "upstream failed");
}

void pdgw_pt_check_deadlines(pdgw_wf_t *wf, uint64_t now)
{
    pdgw_req_t *r = wf->req;
    const pdgw_server_opts_t *o = &wf->w->srv->opts;
    pdgw_leg_t *leg = &wf->legs[PDGW_LEG_DECODE];
    const char *why = NULL;

    if (wf->stage == PDGW_WF_FINISHED || leg->state != PDGW_LEG_RUNNING)
        return;
    if (now >= r->deadline_ms)
        why = "request deadline passed";
    else if (!leg->paused && leg->t_first_ms == 0 && o->first_byte_timeout_ms &&
             now >= leg->t_start_ms + o->first_byte_timeout_ms)
        why = "no response within first_byte_timeout";
    else if (!leg->paused && leg->t_first_ms != 0 && o->idle_timeout_ms &&
             now >= leg->t_last_ms + o->idle_timeout_ms)
        why = "upstream idle for idle_timeout";
    if (why == NULL)
        return;
    pdgw_leg_abort(leg);
    leg->err = PDGW_LEGERR_TIMEOUT;
    snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: %s", leg->inst->id, why);
    pt_leg_done(leg);
}

void pdgw_pt_finalize(pdgw_req_t *r, int status, double dur_s)
{
    pdgw_metrics_t *reg = r->w->srv->opts.metrics ? r->w->srv->opts.metrics->reg : NULL;
    static const char *const labels[] = {"endpoint", "code"};
    pdgw_metric_family_t *f = NULL;
    char code[8];

    (void)dur_s;
    if (r->wf == NULL || !r->wf->pt)
        return;
    if (reg != NULL) {
        f = pdgw_metrics_family_find(reg, "pdgw_passthrough_requests_total");
        if (f == NULL)
            (void)pdgw_metrics_family_add(
                reg, PDGW_METRIC_COUNTER, "pdgw_passthrough_requests_total",
                "Requests proxied unchanged to an engine, by endpoint and HTTP status.", labels, 2,
                NULL, 0, &f);
        snprintf(code, sizeof(code), "%d", status);
        if (f == NULL)
            f = pdgw_metrics_family_find(reg, "pdgw_passthrough_requests_total");
        pdgw_counter_inc(pdgw_metric_family_series2(f, pt_endpoint(r), code));
    }
}

static const pdgw_leg_owner_t pt_leg_owner = {.on_done = pt_leg_done,
                                              .on_head = pt_on_header,
                                              .on_data = pt_on_write,
                                              .moved = pdgw_wf_leg_moved};

void pdgw_pt_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected, uint64_t now_ns)
{
    (void)disconnected;
    (void)now_ns;
    pdgw_pt_finalize(r, status, dur_s);
}

/* Deadlines: admission's wait as any job's, then the raw leg's own timeouts. */
static void pt_job_check_deadlines(pdgw_wf_t *wf, uint64_t now_ms)
{
    if (wf->stage == PDGW_WF_WAIT || wf->stage == PDGW_WF_FINISHED)
        pdgw_wf_check_deadlines(wf, now_ms);
    else
        pdgw_pt_check_deadlines(wf, now_ms);
}

const pdgw_job_ops_t pdgw_pt_job = {
    .name = "pass-through",
    .start = pdgw_pt_start,
    .wake = pdgw_wf_on_wake,
    .next_deadline = pdgw_wf_next_deadline,
    .check_deadlines = pt_job_check_deadlines,
    .running = pdgw_wf_running,
    .stop = pdgw_wf_stop,
    .release = pdgw_wf_release,
};
