/*
 * pdgw_leg.c - one upstream HTTP leg: a curl easy handle on the worker's multi handle.
 *
 * Response bytes either feed the SSE parser (the relayed decode leg of a stream; events go
 * to the leg's owner one by one) or are buffered (prefill legs, non-stream replies); the end
 * of the leg is reported to its owner too (pdgw_leg_owner_t: the workflow, /v1/models).
 * Connections stay in the worker's multi connection cache for reuse.
 */
#include "pdgw_server_int.h"

#include <stdio.h>
#include <errno.h>
#include <sys/socket.h>
#include <string.h>
#include <strings.h>

#include "pdb/pdb_str.h"
#include "pdgw_alloc.h"

#define LEG_MAX_BUFFERED (64u << 20) /* largest non-streamed upstream body */

const char *pdgw_leg_err_name(pdgw_leg_err_t e)
{
    switch (e) {
    case PDGW_LEGERR_CONNECT:
        return "connect";
    case PDGW_LEGERR_TIMEOUT:
        return "timeout";
    case PDGW_LEGERR_STATUS:
        return "status";
    case PDGW_LEGERR_RESET:
        return "reset";
    case PDGW_LEGERR_PROTOCOL:
        return "protocol";
    case PDGW_LEGERR_LOCAL:
        return "local";
    default:
        return "none";
    }
}

/* curl's socket opener, so a failure to get a descriptor is told apart from a peer that
 * refuses: curl reports both as "could not connect". */
static curl_socket_t leg_open_socket(void *cls, curlsocktype purpose, struct curl_sockaddr *a)
{
    pdgw_leg_t *leg = cls;
    curl_socket_t fd = socket(a->family, a->socktype, a->protocol);
    (void)purpose;
    leg->os_errno = fd == CURL_SOCKET_BAD ? errno : 0;
    if (fd != CURL_SOCKET_BAD)
        pdgw_curl_loop_socket_opened(leg->origin->w, fd);
    return fd;
}

void pdgw_leg_init(pdgw_leg_t *leg, const pdgw_leg_origin_t *origin, pdgw_wf_t *wf,
                   pdgw_leg_kind_t kind, const pdgw_leg_owner_t *owner)
{
    memset(leg, 0, sizeof(*leg));
    leg->origin = origin;
    leg->wf = wf;
    leg->owner = owner;
    leg->kind = kind;
    pdgw_sse_init(&leg->parser);
}

/* The leg started or resumed: its owner's deadlines moved. */
static void leg_moved(pdgw_leg_t *leg)
{
    if (leg->owner->moved != NULL)
        leg->owner->moved(leg);
}

static int leg_on_event(void *arg, const pdgw_sse_event_t *ev)
{
    pdgw_leg_t *leg = arg;
    return leg->owner->on_event ? leg->owner->on_event(leg, ev) : 0;
}

static void leg_capture_status(pdgw_leg_t *leg)
{
    if (!leg->got_status && leg->easy != NULL) {
        curl_easy_getinfo(leg->easy, CURLINFO_RESPONSE_CODE, &leg->status);
        leg->got_status = true;
    }
}

static size_t leg_on_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    pdgw_leg_t *leg = userdata;
    size_t len = size * nmemb;
    uint64_t now = pdgw_now_ms();

    leg_capture_status(leg);
    if (leg->t_first_ms == 0)
        leg->t_first_ms = now;
    leg->t_last_ms = now;
    if (leg->raw) /* the owner takes the bytes unchanged (pass-through) */
        return leg->owner->on_data(leg, ptr, len);
    if (leg->relay && leg->sse && leg->status == 200) {
        pdgw_status_t st;
        /* Slow client: stop reading upstream until it catches up. */
        if (leg->owner->hold != NULL && leg->owner->hold(leg)) {
            leg->paused = true; /* the owner unpauses it once the client drained */
            return CURL_WRITEFUNC_PAUSE;
        }
        leg->bytes_in += len;
        st = pdgw_sse_feed(&leg->parser, ptr, len, leg_on_event, leg);
        if (st == PDGW_ERR_CANCELLED)
            return 0; /* the engine stopped this leg (error event sent) */
        if (st != PDGW_OK) {
            leg->err = PDGW_LEGERR_PROTOCOL;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "upstream SSE stream: %s",
                     pdgw_strerror(st));
            return 0;
        }
        return len;
    }
    if (leg->resp.len + len > LEG_MAX_BUFFERED) {
        leg->err = PDGW_LEGERR_PROTOCOL;
        snprintf(leg->errmsg, sizeof(leg->errmsg), "upstream body larger than %u bytes",
                 LEG_MAX_BUFFERED);
        return 0;
    }
    if (pdgw_buf_append(&leg->resp, ptr, len) != PDGW_OK)
        return 0;
    leg->bytes_in += len;
    return len;
}

static size_t leg_on_header(char *buf, size_t size, size_t nitems, void *userdata)
{
    pdgw_leg_t *leg = userdata;
    size_t len = size * nitems;
    char first = len > 0 ? (char)(buf[0] | 0x20) : '\0'; /* most lines are none of these */
    if (leg->raw) /* the owner keeps the engine's headers (pass-through) */
        leg->owner->on_head(leg, buf, len);
    if (first == 'c' && len > 13 && strncasecmp(buf, "content-type:", 13) == 0) {
        const char *v = buf + 13;
        size_t n;
        while (*v == ' ' || *v == '\t')
            v++;
        n = len - (size_t)(v - buf);
        while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
            n--;
        if (n >= sizeof(leg->content_type))
            n = sizeof(leg->content_type) - 1;
        memcpy(leg->content_type, v, n);
        leg->content_type[n] = '\0';
    } else if (first == 'r' && len > 12 && strncasecmp(buf, "retry-after:", 12) == 0) {
        long s = strtol(buf + 12, NULL, 10);
        if (s > 0 && s < 3600)
            leg->retry_after_ms = (uint64_t)s * 1000u;
    } else if (first == 'h' && len >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        /* A new status line (e.g. after 100 Continue): forget earlier headers. */
        leg->content_type[0] = '\0';
        leg->got_status = false;
    }
    return len;
}

/* Append one header line; false when out of memory (the list built so far stays valid). */
static bool hdr_add(struct curl_slist **list, const char *line)
{
    struct curl_slist *n = curl_slist_append(*list, line);
    if (n == NULL)
        return false;
    *list = n;
    return true;
}

static bool hdr_add_curl(void *ctx, const char *line)
{
    return hdr_add(ctx, line);
}

static bool hdr_field_curl(void *ctx, const char *name, size_t n, const char *value, size_t vn)
{
    char line[320];
    if (n + 2 + vn >= sizeof(line))
        return true; /* none of pdgw's own is this long: left out, as a malformed line */
    memcpy(line, name, n);
    memcpy(line + n, ": ", 2);
    memcpy(line + n + 2, value, vn);
    line[n + 2 + vn] = '\0';
    return hdr_add(ctx, line);
}

static bool hdr_add_native(void *ctx, const char *line)
{
    pdgw_status_t st = pdgw_h1_xfer_header(ctx, line);
    return st == PDGW_OK || st == PDGW_ERR_INVALID; /* a malformed line is left out */
}

static bool hdr_field_native(void *ctx, const char *name, size_t n, const char *value, size_t vn)
{
    pdgw_status_t st = pdgw_h1_xfer_field(ctx, name, n, value, vn);
    return st == PDGW_OK || st == PDGW_ERR_INVALID;
}

/* How a leg's headers reach its client: pdgw's own from their parts (nothing to parse on the
 * native client), the client's and the forwarder's as "Name: value" lines. */
typedef struct leg_head_sink {
    bool (*field)(void *ctx, const char *name, size_t n, const char *value, size_t vn);
    bool (*line)(void *ctx, const char *line);
} leg_head_sink_t;

static const leg_head_sink_t head_to_curl = {hdr_field_curl, hdr_add_curl};
static const leg_head_sink_t head_to_native = {hdr_field_native, hdr_add_native};

/* The headers pdgw sends on every leg, whichever client carries it: false when one could
 * not be added (out of memory). */
static bool leg_headers(pdgw_leg_t *leg, const char *method, const pdgw_fwd_leg_t *fl,
                        const leg_head_sink_t *to, void *ctx)
{
    const pdgw_leg_origin_t *o = leg->origin;
    size_t off;
    bool ok = true;

    /* a pass-through sends the client's own Content-Type */
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 && !leg->raw)
        ok &= to->field(ctx, "Content-Type", 12, "application/json", 16);
    ok &= to->field(ctx, "X-Request-Id", 12, o->id, strlen(o->id));
    if (o->traceparent[0])
        ok &= to->field(ctx, "traceparent", 11, o->traceparent, strlen(o->traceparent));
    if (leg->relay && leg->sse)
        ok &= to->field(ctx, "Accept", 6, "text/event-stream", 17);
    for (off = 0; off < o->headers->len;) {
        const char *line = o->headers->data + off;
        if (!(leg->relay && leg->sse && strncasecmp(line, "accept:", 7) == 0))
            ok &= to->line(ctx, line);
        off += strlen(line) + 1;
    }
    if (fl) {
        size_t i;
        for (i = 0; i < fl->n_headers && i < PDGW_FWD_LEG_MAX_HEADERS; i++)
            if (fl->headers[i][0] && !strchr(fl->headers[i], '\n'))
                ok &= to->line(ctx, fl->headers[i]);
    }
    return ok;
}

/* The instance's role, the label of pdgw_instance_inflight_requests. */
static const char *leg_role_name(const pdgw_instance_t *inst)
{
    return inst->role == PDGW_FWD_ROLE_PREFILL  ? "prefill"
           : inst->role == PDGW_FWD_ROLE_DECODE ? "decode"
                                                : "both";
}

/* ---------------------------------------------------------------- native client glue */

static int leg_h1_header(void *arg, const char *line, size_t len)
{
    pdgw_leg_t *leg = arg;
    leg_on_header((char *)line, 1, len, leg);
    if (len >= 12 && line[0] == 'H' && strncmp(line, "HTTP/", 5) == 0) {
        /* The parser checked the status line's shape: three digits at 9..11. */
        leg->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
        leg->got_status = true;
    }
    return 0;
}

static int leg_h1_body(void *arg, const char *data, size_t len)
{
    size_t rc = leg_on_write((char *)data, 1, len, arg);
    if (rc == len)
        return PDGW_H1_BODY_OK;
    return rc == CURL_WRITEFUNC_PAUSE ? PDGW_H1_BODY_PAUSE : PDGW_H1_BODY_ABORT;
}

static void leg_finish(pdgw_leg_t *leg);

/* A transfer that ended well: is its status an answer? 4xx and 5xx are errors; so is a
 * bodiless 2xx (204, 205) to a stream request, which carries no events: relaying it as 200
 * and [DONE] would tell the client that an empty answer came. */
static void leg_status_verdict(pdgw_leg_t *leg)
{
    if (leg->status >= 400) {
        leg->err = PDGW_LEGERR_STATUS;
        snprintf(leg->errmsg, sizeof(leg->errmsg), "upstream %s answered HTTP %ld", leg->inst->id,
                 leg->status);
    } else if (leg->sse && !leg->raw && (leg->status == 204 || leg->status == 205)) {
        leg->err = PDGW_LEGERR_PROTOCOL;
        snprintf(leg->errmsg, sizeof(leg->errmsg),
                 "upstream %s answered HTTP %ld (no content) to a stream request", leg->inst->id,
                 leg->status);
    }
}

/* A native transfer ended: the same verdicts as libcurl's codes give (pdgw_leg_on_done). */
static void leg_h1_done(void *arg, pdgw_h1_result_t res, int os_errno, const char *msg)
{
    pdgw_leg_t *leg = arg;
    leg->t_end_ms = pdgw_now_ms();
    leg->os_errno = os_errno;
    if (leg->err == PDGW_LEGERR_NONE) {
        switch (res) {
        case PDGW_H1_OK:
            leg_status_verdict(leg);
            break;
        case PDGW_H1_E_LOCAL:
            leg->err = PDGW_LEGERR_LOCAL;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "gateway has no socket for %s: %s",
                     leg->inst->id, msg ? msg : "out of resources");
            break;
        case PDGW_H1_E_CONNECT:
        case PDGW_H1_E_CONNECT_TIMEOUT: /* curl: a timeout before connecting is a connect error */
            leg->err = PDGW_LEGERR_CONNECT;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "cannot connect to %s: %s", leg->inst->id,
                     msg ? msg : "failed");
            break;
        default: /* reset, partial body, malformed response, refused bytes */
            leg->err = PDGW_LEGERR_RESET;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: %s", leg->inst->id,
                     msg ? msg : pdgw_h1_result_name(res));
            break;
        }
    }
    leg_finish(leg);
}

static const pdgw_h1_xfer_cb_t leg_h1_cb = {
    .on_header = leg_h1_header,
    .on_body = leg_h1_body,
    .on_done = leg_h1_done,
};

static pdgw_status_t leg_start_native(pdgw_leg_t *leg, const char *url, const char *method,
                                      const pdgw_fwd_leg_t *fl)
{
    pdgw_worker_t *w = leg->origin->w;
    pdgw_h1_xfer_t *x = &leg->h1;
    pdgw_status_t st = pdgw_h1_xfer_begin(x, w->h1, method, url);
    if (st == PDGW_OK && !leg_headers(leg, method, fl, &head_to_native, x))
        st = PDGW_ERR_NOMEM;
    if (st == PDGW_OK)
        /* Small read buffers for streams (thousands are open at once, events are small),
         * larger ones for buffered bodies, as with curl. */
        st = pdgw_h1_xfer_start(x, leg->body ? leg->body : "", leg->body_len,
                                leg->relay && leg->sse ? 1024u : 16384u, &leg_h1_cb, leg);
    if (st != PDGW_OK) {
        pdgw_buf_free(&x->head);
        leg->body = NULL; /* still the caller's on failure */
        return st;
    }
    leg->native = true;
    leg->state = PDGW_LEG_RUNNING;
    pdgw_gateway_metrics_instance_leg(w->srv->opts.metrics, leg->inst->id, leg_role_name(leg->inst),
                                      1);
    leg_moved(leg);
    return PDGW_OK;
}

pdgw_status_t pdgw_leg_start(pdgw_leg_t *leg, const pdgw_instance_t *inst, const char *path,
                             const char *method, char *body, size_t body_len,
                             const pdgw_fwd_leg_t *fl)
{
    char url[1024];
    pdb_str_join(url, sizeof(url), inst->url, path);
    return pdgw_leg_start_url(leg, inst, url, method, body, body_len, fl);
}

pdgw_status_t pdgw_leg_start_url(pdgw_leg_t *leg, const pdgw_instance_t *inst, const char *url,
                                 const char *method, char *body, size_t body_len,
                                 const pdgw_fwd_leg_t *fl)
{
    pdgw_worker_t *w = leg->origin->w;
    pdgw_server_t *srv = w->srv;
    struct curl_slist *h = NULL;
    bool hdr_ok = true;
    CURL *easy;

    leg->inst = inst;
    leg->body = body;
    leg->body_len = body_len;
    leg->status = 0;
    leg->got_status = false;
    leg->saw_done = false;
    leg->paused = false;
    leg->err = PDGW_LEGERR_NONE;
    leg->errmsg[0] = '\0';
    leg->content_type[0] = '\0';
    leg->retry_after_ms = 0;
    leg->t_start_ms = pdgw_now_ms();
    leg->t_first_ms = leg->t_end_ms = 0;
    leg->t_last_ms = leg->t_start_ms;
    leg->bytes_in = 0;
    pdgw_buf_reset(&leg->resp);

    if (w->h1 != NULL && pdgw_h1_url_supported(url))
        return leg_start_native(leg, url, method, fl);
    easy = w->n_easy_pool > 0 ? w->easy_pool[--w->n_easy_pool] : curl_easy_init();
    if (easy == NULL) {
        leg->body = NULL; /* still the caller's on failure */
        return PDGW_ERR_NOMEM;
    }
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, leg);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)srv->opts.connect_timeout_ms);
    /* Small receive buffers for streams (thousands are open at once, events are small);
     * larger ones for buffered bodies. */
    curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, leg->relay && leg->sse ? 2048L : 16384L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, leg_on_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, leg);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, leg_on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, leg);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, leg_open_socket);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, leg);
    pdgw_curl_loop_prepare(w, easy);
    if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
    } else if (strcmp(method, "HEAD") == 0) { /* pass-through: no body either way */
        curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
    } else {
        curl_easy_setopt(easy, CURLOPT_POST, 1L);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        if (strcmp(method, "POST") != 0) /* pass-through PUT, DELETE, ... */
            curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method);
    }
    /* No "Expect: 100-continue" round trip on large bodies. */
    hdr_ok &= hdr_add(&h, "Expect:");
    hdr_ok &= leg_headers(leg, method, fl, &head_to_curl, &h);
    if (h == NULL || !hdr_ok) {
        curl_slist_free_all(h);
        curl_easy_cleanup(easy);
        leg->body = NULL; /* still the caller's on failure */
        return PDGW_ERR_NOMEM;
    }
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    leg->headers = h;
    leg->easy = easy;
    if (curl_multi_add_handle(w->multi, easy) != CURLM_OK) {
        curl_slist_free_all(h);
        curl_easy_cleanup(easy);
        leg->headers = NULL;
        leg->easy = NULL;
        leg->body = NULL; /* still the caller's on failure */
        return PDGW_ERR_SYSTEM;
    }
    leg->state = PDGW_LEG_RUNNING;
    pdgw_gateway_metrics_instance_leg(srv->opts.metrics, inst->id, leg_role_name(inst), 1);
    leg_moved(leg);
    return PDGW_OK;
}

static void leg_free_transfer(pdgw_leg_t *leg)
{
    if (leg->native) {
        pdgw_worker_t *w = leg->origin->w;
        pdgw_gateway_metrics_instance_leg(w->srv->opts.metrics, leg->inst->id,
                                          leg_role_name(leg->inst), -1);
        pdgw_h1_xfer_release(&leg->h1); /* a running transfer's connection is closed */
        leg->native = false;
    }
    if (leg->easy) {
        pdgw_worker_t *w = leg->origin->w;
        pdgw_gateway_metrics_instance_leg(w->srv->opts.metrics, leg->inst->id,
                                          leg_role_name(leg->inst), -1);
        curl_multi_remove_handle(w->multi, leg->easy);
        if (w->n_easy_pool < (int)(sizeof(w->easy_pool) / sizeof(w->easy_pool[0]))) {
            curl_easy_reset(leg->easy); /* options back to defaults; connections stay */
            w->easy_pool[w->n_easy_pool++] = leg->easy;
        } else {
            curl_easy_cleanup(leg->easy);
        }
        leg->easy = NULL;
    }
    if (leg->headers) {
        curl_slist_free_all(leg->headers);
        leg->headers = NULL;
    }
    if (!leg->body_borrowed)
        pdgw_free(leg->body);
    leg->body = NULL;
    leg->body_borrowed = false;
}

void pdgw_leg_abort(pdgw_leg_t *leg)
{
    if (leg->state != PDGW_LEG_RUNNING)
        return;
    /* Removing the handle mid-transfer closes its connection right away. */
    leg_free_transfer(leg);
    leg->state = PDGW_LEG_DONE;
    leg->t_end_ms = pdgw_now_ms();
}

void pdgw_leg_release(pdgw_leg_t *leg)
{
    pdgw_leg_abort(leg);
    leg_free_transfer(leg);
    pdgw_buf_free(&leg->resp);
    pdgw_sse_free(&leg->parser);
}

void pdgw_leg_unpause(pdgw_leg_t *leg)
{
    if (!leg->paused || (leg->easy == NULL && !leg->native))
        return;
    leg->paused = false;
    /* Idle time counts again from now, not from before the pause. */
    leg->t_last_ms = pdgw_now_ms();
    if (leg->native)
        pdgw_h1_xfer_unpause(&leg->h1); /* reads again from the worker loop */
    else
        curl_easy_pause(leg->easy, CURLPAUSE_CONT);
    leg_moved(leg);
}

/* Did the connect fail because this process ran out of descriptors or buffers? Then the
 * instance is healthy and must not be blamed (breaker, passive health). */
static bool leg_local_shortage(const pdgw_leg_t *leg)
{
    int e = leg->os_errno;
    return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

void pdgw_leg_on_done(pdgw_leg_t *leg, CURLcode rc)
{
    leg_capture_status(leg);
    leg->t_end_ms = pdgw_now_ms();
    if (leg->err == PDGW_LEGERR_NONE) {
        switch (rc) {
        case CURLE_OK:
            leg_status_verdict(leg);
            break;
        case CURLE_OUT_OF_MEMORY:
            leg->err = PDGW_LEGERR_LOCAL;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "gateway out of memory");
            break;
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            if (leg_local_shortage(leg)) {
                leg->err = PDGW_LEGERR_LOCAL;
                snprintf(leg->errmsg, sizeof(leg->errmsg), "gateway has no socket for %s: %s",
                         leg->inst->id, strerror(leg->os_errno));
                break;
            }
            leg->err = PDGW_LEGERR_CONNECT;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "cannot connect to %s: %s", leg->inst->id,
                     curl_easy_strerror(rc));
            break;
        case CURLE_OPERATION_TIMEDOUT: {
            long connected = 0;
            curl_easy_getinfo(leg->easy, CURLINFO_PRIMARY_PORT, &connected);
            leg->err =
                leg->t_first_ms == 0 && connected == 0 ? PDGW_LEGERR_CONNECT : PDGW_LEGERR_TIMEOUT;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: %s", leg->inst->id,
                     curl_easy_strerror(rc));
            break;
        }
        default:
            leg->err = PDGW_LEGERR_RESET;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: %s", leg->inst->id,
                     curl_easy_strerror(rc));
            break;
        }
    }
    leg_finish(leg);
}

/* The end of a leg, whichever client carried it. */
static void leg_finish(pdgw_leg_t *leg)
{
    if (leg->relay && leg->sse && leg->err == PDGW_LEGERR_NONE && leg->status == 200) {
        if (pdgw_sse_finish(&leg->parser, leg_on_event, leg) && !leg->saw_done) {
            leg->err = PDGW_LEGERR_RESET;
            snprintf(leg->errmsg, sizeof(leg->errmsg), "%s: stream cut in the middle of an event",
                     leg->inst->id);
        }
    }
    leg_free_transfer(leg);
    leg->state = PDGW_LEG_DONE;
    leg->owner->on_done(leg);
}

sched_outcome_t pdgw_leg_outcome(const pdgw_leg_t *leg)
{
    switch (leg->err) {
    case PDGW_LEGERR_NONE:
        return SCHED_OUTCOME_SUCCESS;
    case PDGW_LEGERR_CONNECT:
        return SCHED_OUTCOME_CONNECT_ERROR;
    case PDGW_LEGERR_TIMEOUT:
        return SCHED_OUTCOME_TIMEOUT;
    case PDGW_LEGERR_STATUS:
        return sched_outcome_from_http((int)leg->status);
    case PDGW_LEGERR_LOCAL:
        return SCHED_OUTCOME_CANCELLED; /* no judgement on the instance */
    default:
        return SCHED_OUTCOME_TRANSFER_ERROR;
    }
}
