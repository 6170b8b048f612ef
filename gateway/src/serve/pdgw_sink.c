/*
 * pdgw_sink.c - the client response: the only code that touches it.
 *
 * Whoever decides the answer (workflow, /v1/models, admin, local endpoints; all on the
 * request's worker) uses this small API: reply with a buffer (or an OpenAI error), or commit
 * a 200 SSE stream and then write / end it. Filling the reply or writing wakes the front end:
 * under libmicrohttpd the waiting connection is suspended and resumed, and MHD calls the
 * handler (which queues the reply) or the stream reader (which takes the written bytes) again;
 * the native front end is told directly (pdgw_front_wake) and writes at the end of the loop
 * turn. The headers of either come from here. Flow control lives here too: a writer asks
 * pdgw_req_out_writable() and, when the client is behind, registers an on-drain callback that
 * the reader (or the direct writer) runs once the backlog has halved.
 */

#include "pdgw_server_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"

/* ---------------------------------------------------------------- reply, stream, write */

void pdgw_req_resume(pdgw_req_t *r)
{
    if (r->fc != NULL) { /* the native front end never suspends: it is told */
        pdgw_front_wake(r->fc);
        return;
    }
    if (!r->suspended)
        return;
    /* The hang-up watch stays until the connection completes: one epoll_ctl per request
     * instead of two per streamed event. */
    r->suspended = false;
    MHD_resume_connection(r->conn);
    r->w->mhd_kick = true;
}

void pdgw_req_suspend(pdgw_req_t *r)
{
    if (r->fc != NULL) {
        /* Nothing to do on the socket; the request's deadlines are watched from now on. */
        pdgw_req_timer_update(r);
        return;
    }
    if (r->suspended)
        return;
    MHD_suspend_connection(r->conn);
    r->suspended = true;
    /* The hang-up watch is added by the request's timer once a suspension lasts
     * (HUP_WATCH_AFTER_MS): short waits cost no epoll_ctl at all. */
    r->suspended_at_ms = pdgw_now_ms();
    pdgw_req_timer_update(r);
}

static void copy_ctype(pdgw_req_t *r, const char *ctype)
{
    size_t n = strnlen(ctype, sizeof(r->reply_ctype) - 1);
    memcpy(r->reply_ctype, ctype, n);
    r->reply_ctype[n] = '\0';
}

void pdgw_req_reply(pdgw_req_t *r, int status, char *body, size_t len, const char *ctype)
{
    if (r->reply_ready || r->queued || r->committed) {
        pdgw_free(body);
        return;
    }
    r->reply_status = status;
    r->reply_body = body;
    r->reply_len = len;
    copy_ctype(r, ctype != NULL ? ctype : "application/json");
    r->reply_ready = true;
    r->final_status = status;
    pdgw_req_resume(r);
}

void pdgw_req_reply_error(pdgw_req_t *r, const pdgw_api_error_t *err)
{
    size_t len = 0;
    char *body = pdgw_api_error_body(err, &len);
    pdgw_req_error_first(r, "%s", err->message);
    if (err->kind == PDGW_API_ERR_UNAUTHORIZED)
        r->reply_www_auth = true;
    pdgw_req_reply(r, pdgw_api_error_http_status(err), body, body ? len : 0, "application/json");
}

void pdgw_req_reply_errorf(pdgw_req_t *r, pdgw_api_err_kind_t kind, const char *code,
                           const char *fmt, ...)
{
    pdgw_api_error_t err;
    va_list ap;
    char msg[PDGW_API_ERR_MESSAGE_MAX];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pdgw_api_error_set(&err, kind, NULL, "%s", msg);
    if (code)
        pdgw_api_error_set_code(&err, code);
    pdgw_req_reply_error(r, &err);
}

void pdgw_req_commit_stream(pdgw_req_t *r)
{
    if (r->committed || r->reply_ready || r->queued)
        return;
    r->committed = true;
    r->final_status = 200;
    pdgw_req_resume(r);
}

size_t pdgw_req_out_pending(const pdgw_req_t *r)
{
    return r->out.len - r->out_off + pdgw_direct_pending(r);
}

bool pdgw_req_out_writable(const pdgw_req_t *r)
{
    return !r->committed || pdgw_req_out_pending(r) <= PDGW_OUT_HIGH_WATER;
}

void pdgw_req_on_drain(pdgw_req_t *r, void (*fn)(void *arg), void *arg)
{
    r->on_drain = fn;
    r->on_drain_arg = arg;
}

/* New bytes (or the end) for the client: a stream the sink writes itself sends them at the
 * end of this loop turn (pdgw_sink_direct.c); otherwise MHD's reader takes them. */
static void out_wake(pdgw_req_t *r)
{
    if (r->direct)
        pdgw_direct_queue(r);
    else
        pdgw_req_resume(r);
}

void pdgw_req_out_append(pdgw_req_t *r, const char *data, size_t len)
{
    if (r->out_done || r->client_gone)
        return;
    if (pdgw_buf_append(&r->out, data, len) != PDGW_OK) {
        /* Out of memory: the stream cannot continue intact; end it. */
        r->out_done = true;
    }
    out_wake(r);
}

void pdgw_req_out_end(pdgw_req_t *r)
{
    r->out_done = true;
    out_wake(r);
}

void pdgw_req_client_hup(pdgw_req_t *r)
{
    r->client_gone = true;
    pdgw_req_resume(r);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    pdgw_req_t *r = cls;
    size_t avail;
    (void)pos;
    if (r->client_gone)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (r->direct) {
        /* The sink writes this stream itself; MHD runs it again only for the last chunk. */
        if (r->direct_ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        pdgw_req_suspend(r);
        return 0;
    }
    if (!r->stream_counted) {
        r->stream_counted = true;
        if (pdgw_direct_eligible(r) && pdgw_direct_take(r)) {
            /* The headers are on the wire and MHD's buffer is empty: the socket is ours. */
            pdgw_gateway_metrics_client_stream(r->w->srv->opts.metrics, "direct");
            pdgw_req_suspend(r);
            return 0;
        }
        pdgw_gateway_metrics_client_stream(r->w->srv->opts.metrics, "library");
    }
    avail = r->out.len - r->out_off;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, r->out.data + r->out_off, n);
        r->out_off += n;
        r->bytes_out += n;
        if (r->out_off == r->out.len) {
            pdgw_buf_reset(&r->out);
            r->out_off = 0;
            /* A long stream keeps a small buffer only. */
            if (r->out.cap > 64 * 1024)
                pdgw_buf_free(&r->out);
        }
        if (r->on_drain != NULL && pdgw_req_out_pending(r) < PDGW_OUT_HIGH_WATER / 2) {
            void (*fn)(void *) = r->on_drain;
            r->on_drain = NULL;
            fn(r->on_drain_arg);
        }
        return (ssize_t)n;
    }
    if (r->out_done)
        return MHD_CONTENT_READER_END_OF_STREAM;
    pdgw_req_suspend(r);
    return 0;
}

/* ---------------------------------------------------------------- response headers */

static void add_common_headers(pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o)
{
    if (r->id[0])
        pdgw_hdr_add(o, "X-Request-Id", r->id);
    if (r->pd_phase != PDGW_PHASE_NONE) {
        pdgw_hdr_add(o, "X-PD-Failure-Phase", pdgw_phase_name(r->pd_phase));
        pdgw_hdr_add(o, "X-PD-Retryable", r->pd_retryable ? "true" : "false");
    }
    pdgw_phases_headers(r, kind, o); /* the rooms above: CORS, pass-through's kept headers */
}

bool pdgw_sink_reply_closes(const pdgw_req_t *r)
{
    return r->w->srv->draining || r->reply_close;
}

void pdgw_sink_reply_headers(pdgw_req_t *r, pdgw_hdr_out_t *o)
{
    pdgw_hdr_add(o, MHD_HTTP_HEADER_CONTENT_TYPE, r->reply_ctype);
    if (r->reply_www_auth)
        pdgw_hdr_add(o, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->reply_status == 405 && pdgw_http_allowed_methods(r) != NULL)
        pdgw_hdr_add(o, MHD_HTTP_HEADER_ALLOW, pdgw_http_allowed_methods(r));
    if (r->reply_retry_after_s > 0) {
        char secs[16];
        snprintf(secs, sizeof(secs), "%u", r->reply_retry_after_s);
        pdgw_hdr_add(o, MHD_HTTP_HEADER_RETRY_AFTER, secs);
    }
    add_common_headers(r, PDGW_HEADERS_REPLY, o);
}

int pdgw_sink_stream_status(const pdgw_req_t *r)
{
    /* a raw stream (pass-through) relays the engine's status */
    return r->stream_raw ? r->reply_status : MHD_HTTP_OK;
}

void pdgw_sink_stream_headers(pdgw_req_t *r, pdgw_hdr_out_t *o)
{
    if (r->stream_raw) { /* the engine's type; its other headers come from a headers hook */
        pdgw_hdr_add(o, MHD_HTTP_HEADER_CONTENT_TYPE, r->reply_ctype);
    } else {
        pdgw_hdr_add(o, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        pdgw_hdr_add(o, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    }
    add_common_headers(r, PDGW_HEADERS_STREAM, o);
}

/* ---------------------------------------------------------------- libmicrohttpd responses */

typedef struct {
    pdgw_hdr_out_t out;
    struct MHD_Response *resp;
} mhd_hdr_out_t;

static void mhd_add(pdgw_hdr_out_t *o, const char *name, const char *value)
{
    MHD_add_response_header(((mhd_hdr_out_t *)(void *)o)->resp, name, value);
}

enum MHD_Result pdgw_sink_queue_reply(pdgw_req_t *r)
{
    mhd_hdr_out_t ho = {{mhd_add}, NULL};
    enum MHD_Result ret;
    if (r->reply_body != NULL)
        ho.resp =
            MHD_create_response_from_buffer(r->reply_len, r->reply_body, MHD_RESPMEM_MUST_FREE);
    else /* out of memory while building the body: an empty answer, never a freed literal */
        ho.resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (ho.resp == NULL)
        return MHD_NO;
    r->reply_body = NULL; /* owned by MHD now */
    pdgw_sink_reply_headers(r, &ho.out);
    if (pdgw_sink_reply_closes(r))
        MHD_add_response_header(ho.resp, MHD_HTTP_HEADER_CONNECTION, "close");
    r->bytes_out = r->reply_len;
    ret = MHD_queue_response(r->conn, (unsigned)r->reply_status, ho.resp);
    MHD_destroy_response(ho.resp);
    r->queued = true;
    return ret;
}

enum MHD_Result pdgw_sink_queue_stream(pdgw_req_t *r)
{
    mhd_hdr_out_t ho = {{mhd_add}, NULL};
    enum MHD_Result ret;
    /* The block is MHD's buffer for a body it does not frame in chunks (HTTP/1.0); a chunked
     * body is read straight into the connection's own buffer, and one the sink writes itself
     * needs none: thousands of open streams should not each keep a 1 KiB block. */
    ho.resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, pdgw_direct_eligible(r) ? 64 : 1024, stream_reader, r, NULL);
    if (ho.resp == NULL)
        return MHD_NO;
    pdgw_sink_stream_headers(r, &ho.out);
    ret = MHD_queue_response(r->conn, (unsigned)pdgw_sink_stream_status(r), ho.resp);
    MHD_destroy_response(ho.resp);
    r->queued = true;
    return ret;
}
