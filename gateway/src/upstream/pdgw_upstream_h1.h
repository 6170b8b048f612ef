/*
 * pdgw_upstream_h1.h - the native HTTP/1.1 upstream client (upstream_client: native).
 *
 * Two parts, each in its own file:
 *   pdgw_upstream_h1_parse.c  an incremental response parser (status line, headers,
 *                             Content-Length / chunked / close-delimited bodies) that
 *                             consumes whole lines from the caller's buffer and never copies;
 *   pdgw_upstream_h1.c        one client per worker: non-blocking connects, the request
 *                             written with one writev, edge-triggered reads into a per-
 *                             connection buffer, keep-alive pools per upstream address,
 *                             deadlines on the worker's timer heap.
 *
 * A transfer (pdgw_h1_xfer_t) is embedded in its owner (a leg) and reports through
 * callbacks: header lines (the status line too, as libcurl hands them out), body bytes
 * (which the owner may refuse for now: the transfer pauses, keeps them and stops reading),
 * and the end. No callback ever runs inside pdgw_h1_start, _abort or _unpause: work those
 * calls cause runs from the worker loop (pdgw_h1_run_posted).
 */
#ifndef PDGW_UPSTREAM_H1_H
#define PDGW_UPSTREAM_H1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"
#include "pdgw_timer.h"
#include "pdgw_util.h"

/* ---------------------------------------------------------------- response parser */

typedef enum {
    PDGW_H1P_STATUS = 0, /* waiting for the status line */
    PDGW_H1P_HEADERS,
    PDGW_H1P_BODY_LENGTH, /* Content-Length body, `remaining` bytes left */
    PDGW_H1P_CHUNK_SIZE,
    PDGW_H1P_CHUNK_DATA,
    PDGW_H1P_CHUNK_CRLF, /* the line end after a chunk's data */
    PDGW_H1P_TRAILERS,
    PDGW_H1P_BODY_CLOSE, /* body runs until the peer closes */
    PDGW_H1P_DONE,
    PDGW_H1P_ERROR,
} pdgw_h1p_state_t;

/* What the body callback answers. */
enum { PDGW_H1_BODY_OK = 0, PDGW_H1_BODY_PAUSE = 1, PDGW_H1_BODY_ABORT = -1 };

typedef struct pdgw_h1p_cb {
    /* A header line as received with its line end (the status line and those of 1xx
     * responses too; trailers are not reported). Non-zero aborts. */
    int (*on_header)(void *arg, const char *line, size_t len);
    /* The final (non-1xx) status line and its headers are complete. Non-zero aborts. */
    int (*on_headers_done)(void *arg, int status);
    /* Body bytes: PDGW_H1_BODY_OK (all taken), _PAUSE (none taken: the same bytes come again
     * on the next call) or _ABORT. */
    int (*on_body)(void *arg, const char *data, size_t len);
} pdgw_h1p_cb_t;

typedef struct pdgw_h1p {
    pdgw_h1p_state_t state;
    int status;             /* the final status, 0 until its line was read */
    int version_minor;      /* HTTP/1.<n> */
    bool no_body;           /* the request was HEAD: a response has no body */
    bool keep_alive;        /* the connection may carry another request afterwards */
    bool chunked;           /* Transfer-Encoding ends in chunked */
    bool has_te;            /* any Transfer-Encoding */
    int64_t content_length; /* -1 = none */
    uint64_t remaining;     /* bytes of the current Content-Length body or chunk */
    size_t header_bytes;    /* of this response's head, against PDGW_H1P_MAX_HEAD */
    const char *err;        /* why the response was refused (state ERROR) */
} pdgw_h1p_t;

/* Largest response head (status line, headers, also trailers) accepted. */
#define PDGW_H1P_MAX_HEAD (64u * 1024u)

void pdgw_h1p_init(pdgw_h1p_t *p, bool head_request);
/*
 * Parse what <buf, len> holds. Whole lines are consumed, a line that is not complete yet is
 * left for the next call (the caller keeps unconsumed bytes in front of what it reads next).
 * Returns the bytes consumed, or -1 when the response is malformed or a callback aborted
 * (p->err says why; "aborted" for a callback). Stops at the end of the response
 * (state DONE) and when the body callback pauses (call again with the same bytes).
 */
long pdgw_h1p_feed(pdgw_h1p_t *p, const char *buf, size_t len, const pdgw_h1p_cb_t *cb, void *arg);
/* A parser for a body alone (a request's, whose head the front end read): chunked, or
 * <length> bytes. Feed it the bytes after the head; it reports them through on_body. */
void pdgw_h1p_init_body(pdgw_h1p_t *p, bool chunked, uint64_t length);
/* HTTP/1 grammar shared with the front end's request parser (RFC 9110 5.6.2, 8.6). */
extern const unsigned char pdgw_h1_tchar[256];
static inline bool pdgw_h1_is_tchar(unsigned char c)
{
    return pdgw_h1_tchar[c] != 0;
}
/* Does the comma-separated list <v, n> hold <token> (any case)? */
bool pdgw_h1_list_has(const char *v, size_t n, const char *token);
/* Is the last element of the comma-separated list <v, n> <token> (any case)? */
bool pdgw_h1_list_last_is(const char *v, size_t n, const char *token);
/* Content-Length: digits, or a list of equal values. */
bool pdgw_h1_parse_length(const char *v, size_t n, int64_t *out);
/* The peer closed the connection: true when that completes the response (a body that runs
 * until close), false when the response was cut short (p->err says where). */
bool pdgw_h1p_eof(pdgw_h1p_t *p);
/* Is the parser inside the body (status and headers delivered)? */
static inline bool pdgw_h1p_in_body(const pdgw_h1p_t *p)
{
    return p->state >= PDGW_H1P_BODY_LENGTH && p->state <= PDGW_H1P_BODY_CLOSE;
}

/* ---------------------------------------------------------------- client */

typedef struct pdgw_h1_client pdgw_h1_client_t;
typedef struct pdgw_h1_conn pdgw_h1_conn_t;

/* How a transfer ended. */
typedef enum {
    PDGW_H1_OK = 0,
    PDGW_H1_E_CONNECT,         /* refused, unreachable, cannot resolve */
    PDGW_H1_E_CONNECT_TIMEOUT, /* connect_timeout passed before the connection was up */
    PDGW_H1_E_RESET,           /* the connection broke before the response was complete */
    PDGW_H1_E_PARTIAL,         /* closed inside the body (Content-Length or chunked) */
    PDGW_H1_E_PROTOCOL,        /* malformed response */
    PDGW_H1_E_ABORTED,         /* the owner's callback refused the bytes */
    PDGW_H1_E_LOCAL,           /* no descriptor or memory on this side (os_errno says) */
} pdgw_h1_result_t;

const char *pdgw_h1_result_name(pdgw_h1_result_t r);

typedef struct pdgw_h1_xfer_cb {
    int (*on_header)(void *arg, const char *line, size_t len);
    int (*on_headers_done)(void *arg, int status);
    int (*on_body)(void *arg, const char *data, size_t len);
    /* The transfer ended; <msg> says why when it failed. The transfer is idle again. */
    void (*on_done)(void *arg, pdgw_h1_result_t res, int os_errno, const char *msg);
} pdgw_h1_xfer_cb_t;

/* One request/response exchange; embed it in its owner, zero it once (pdgw_h1_xfer_init). */
typedef struct pdgw_h1_xfer {
    pdgw_h1_client_t *client;
    pdgw_h1_conn_t *conn; /* while running */
    const pdgw_h1_xfer_cb_t *cb;
    void *arg;
    pdgw_buf_t head; /* request line and headers */
    const char *body;
    size_t body_len;
    size_t sent;      /* of head + body */
    size_t rbuf_size; /* read buffer this transfer wants (grows for long header lines) */
    bool head_request;
    /* What the owner's header lines said (pdgw_h1_xfer_header): its own Host or Accept, or a
     * removal of one; removal marker lines to cut before sending. */
    bool named_host, named_accept, has_markers;
    bool running;
    bool paused;
    bool got_bytes; /* a response byte arrived (no silent retry after that) */
    bool retried;   /* one retry on a fresh connection was spent */
    bool connected; /* the connection was up (for a timeout's verdict) */
    int addr_tries; /* addresses of the name tried after the first (connect refused) */
    /* A result waiting to be reported from the loop (failures found inside _start). */
    pdgw_h1_result_t pending;
    int pending_errno;
    struct pdgw_h1_xfer *post_prev, *post_next;
    bool posted;
    struct pdgw_h1_upstream *up;
    char errmsg[128];
} pdgw_h1_xfer_t;

typedef struct pdgw_h1_client_opts {
    int epfd;                    /* the worker's epoll set */
    pdgw_timers_t *timers;       /* the worker's timer heap */
    uint32_t ev_kind;            /* epoll tag kind of this client's sockets (bits 32..39) */
    uint64_t connect_timeout_ms; /* 0 = none */
    uint64_t idle_timeout_ms;    /* idle kept connections close after this */
    unsigned max_idle;           /* idle connections kept, all addresses together */
} pdgw_h1_client_opts_t;

pdgw_status_t pdgw_h1_client_create(const pdgw_h1_client_opts_t *o, pdgw_h1_client_t **out);
/* Close every connection. Transfers still running are dropped without a report. */
void pdgw_h1_client_destroy(pdgw_h1_client_t *c);

/* Does <url> name an origin this client serves (http://, not https://)? */
bool pdgw_h1_url_supported(const char *url);

/* Free what the transfer holds (aborting it if it runs). */
void pdgw_h1_xfer_release(pdgw_h1_xfer_t *x);

/*
 * Begin building a request to <url> (origin plus path, e.g. http://10.0.0.1:8000/v1/x):
 * writes the request line and Host. Add headers with pdgw_h1_xfer_header, then start.
 */
pdgw_status_t pdgw_h1_xfer_begin(pdgw_h1_xfer_t *x, pdgw_h1_client_t *c, const char *method,
                                 const char *url);
/*
 * Add one header line given libcurl's way ("Name: value"; "Name:" with no value removes a
 * header the client would send by itself; "Name;" sends it empty). Framing headers
 * (Content-Length, Transfer-Encoding, Connection) are the client's and are skipped.
 */
pdgw_status_t pdgw_h1_xfer_header(pdgw_h1_xfer_t *x, const char *line);
/*
 * The same from its parts, nothing to parse: <name> (<n> bytes, a token) and <value> (<vn>
 * bytes, no CR or LF; none removes the header, as "Name:" does).
 */
pdgw_status_t pdgw_h1_xfer_field(pdgw_h1_xfer_t *x, const char *name, size_t n, const char *value,
                                 size_t vn);
/*
 * Finish the head (Accept, Content-Length unless GET/HEAD) and send: the request goes on a
 * kept connection to the same address when one is idle, else on a new one. <body> is
 * borrowed until on_done. Failures are reported through on_done from the loop.
 */
pdgw_status_t pdgw_h1_xfer_start(pdgw_h1_xfer_t *x, const char *body, size_t body_len,
                                 size_t rbuf_size, const pdgw_h1_xfer_cb_t *cb, void *arg);
/* Stop a running transfer: its connection is closed, nothing more is reported. */
void pdgw_h1_xfer_abort(pdgw_h1_xfer_t *x);
/* Let a transfer whose body callback paused continue (from the loop). */
void pdgw_h1_xfer_unpause(pdgw_h1_xfer_t *x);

/* An epoll event for one of the client's sockets (<tag> as registered). */
void pdgw_h1_on_event(pdgw_h1_client_t *c, uint64_t tag, uint32_t events);
/* Run work posted by start / unpause; true when some is waiting (poll without sleeping). */
void pdgw_h1_run_posted(pdgw_h1_client_t *c);
bool pdgw_h1_has_posted(const pdgw_h1_client_t *c);

/* Counters (tests, /metrics): connections opened, requests sent on a reused connection,
 * silent retries, idle connections now. */
typedef struct pdgw_h1_stats {
    uint64_t connects;
    uint64_t reused;
    uint64_t retries;
    uint64_t idle_closed; /* idle connections closed: timeout, peer close, pool full */
    unsigned idle;
    unsigned open;
} pdgw_h1_stats_t;
void pdgw_h1_client_stats(const pdgw_h1_client_t *c, pdgw_h1_stats_t *out);

#endif /* PDGW_UPSTREAM_H1_H */
