/*
 * pdgw_server_int.h - internals shared by the serving core's files:
 *   pdgw_server.c    life cycle, worker threads, the epoll loop
 *   pdgw_http.c      the request path's entry: routing, body, dispatch (and libmicrohttpd's
 *                    handler on top of it)
 *   pdgw_front.c     the native front end (frontend: native): connections on the worker loop
 *   pdgw_req_headers.c  the request head as read by either front end
 *   pdgw_sink.c      the client response: reply, stream, write, end, flow control
 *   pdgw_leg.c       one upstream HTTP leg on the worker's curl multi handle
 *   pdgw_workflow.c  the workflow engine (booking, stages, retries, relay decisions)
 *   pdgw_wf.c        the workflow object's life (pdgw_wf.h); pdgw_req.c the request's end
 *   pdgw_fwd_api.c   helpers and the waker offered to forwarders
 *   pdgw_conn.c      client connections: limits at accept, header and body deadlines
 *   pdgw_models_fanout.c  GET /v1/models (configured names, or the instances' union)
 *   pdgw_admin.c     who may use /admin/..., POST /admin/reload, client certificates
 *   pdgw_admin_instances.c  the instance admin API (/admin/instances)
 *   pdgw_access.c    the access log line of a finished request
 *   pdgw_timer.c     per-worker timers (every deadline above); pdgw_freelist.c object reuse
 * Everything of one request runs on the worker thread that accepted its connection.
 */
#ifndef PDGW_SERVER_INT_H
#define PDGW_SERVER_INT_H

#include <curl/curl.h>
#include <netinet/in.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "pdb/pdb_dlist.h"
#include "pdgw_freelist.h"
#include "pdgw_metrics.h"
#include "pdgw_phases.h"
#include "pdgw_server.h"
#include "pdgw_sse.h"
#include "pdgw_timer.h"
#include "pdgw_util.h"
#include "pdgw_leg.h"
#include "pdgw_upstream_h1.h"
#include "pdgw_req_info.h"

typedef struct pdgw_worker pdgw_worker_t;
typedef struct pdgw_req pdgw_req_t;
typedef struct pdgw_leg pdgw_leg_t;
typedef struct pdgw_wf pdgw_wf_t;
typedef struct pdgw_conn pdgw_conn_t;
typedef struct pdgw_front_conn pdgw_front_conn_t; /* a connection of the native front end */
typedef struct pdgw_addr_table pdgw_addr_table_t;
typedef struct pdgw_fwd_gen pdgw_fwd_gen_t; /* a forwarder context, refcounted */

/* epoll tags: kind in the high 32 bits of epoll_data.u64, fd in the low ones. Pointers are
 * never stored in epoll, so an event for a socket closed earlier in the same batch is
 * harmless. */
/* Kinds of epoll tags (bits 32..39; the native client keeps a generation above them). */
enum {
    PDGW_EV_MHD = 1,
    PDGW_EV_WAKE = 2,
    PDGW_EV_CURL = 3,
    PDGW_EV_HUP = 4,
    PDGW_EV_H1 = 5,
    PDGW_EV_FRONT_LISTEN = 6, /* the native front end's listening socket */
    PDGW_EV_FRONT = 7,        /* one of its connections */
    PDGW_EV_KVCTL = 8,        /* a KV control socket (pdgw_worker_watch_kvctl) */
};

/* The epoll tag of a descriptor <fd> of <kind>. */
static inline uint64_t pdgw_ev_tag(int kind, int fd)
{
    return ((uint64_t)(unsigned)kind << 32) | (uint32_t)fd;
}

/* ---------------------------------------------------------------- server */

struct pdgw_server {
    pdgw_server_opts_t opts;
    const pdgw_fwd_desc_t *desc;
    pdgw_proto_metrics_t proto_metrics; /* opts.metrics as seen by desc's requests */
    void *fwd_ctx;
    pdgw_fwd_plan_t plan;
    sched_role_t ready_roles;
    int port;
    unsigned n_workers;
    pdgw_worker_t *workers;
    atomic_bool draining;
    atomic_uint_fast64_t inflight;
    bool started;
    /* Client connections: the limit of all workers together (derived from RLIMIT_NOFILE
     * unless configured) and how many are open (descriptors are the process's, so one worker
     * may hold more than its share when SO_REUSEPORT spreads clients unevenly); a worker's
     * share (sizes its upstream connection caches); open connections per client address. */
    unsigned conn_limit;
    atomic_uint conns_open;
    unsigned conn_limit_per_worker;
    pdgw_addr_table_t *addrs;
    struct pdgw_routing *routing; /* tokenize cache, selective PD counters (pdgw_route.h) */
    bool phases_started;          /* the server hooks ran (pdgw_phases.h) */
    /* Reloadable (pdgw_server_reload.c): request limits a request copies when it arrives,
     * and the forwarder context new requests take a reference to. */
    atomic_uint_fast64_t body_bytes_held; /* request bodies of all requests (budget) */
    atomic_uint_fast64_t live_max_body_bytes;
    atomic_uint_fast64_t live_request_timeout_ms;
    atomic_uint live_retries;
    pthread_mutex_t fwd_gen_lock;
    pdgw_fwd_gen_t *fwd_gen;
    /* The KV control services its forwarder opened (pdgw_kvctl_svcs.c): shutdown, reload
     * and the workers' KV control socket events reach them through it. */
    pdgw_fwd_kv_svcs_t *kv_svcs;
};

/* ---------------------------------------------------------------- worker */

struct pdgw_fwd_waker {
    atomic_int refs;
    pthread_mutex_t lock;
    pdgw_worker_t *worker;
    pdgw_wf_t *wf;                  /* NULL once the workflow ended */
    void (*on_wake)(pdgw_wf_t *wf); /* what a wake runs on the worker (its owner's) */
    bool queued;
    struct pdgw_fwd_waker *next; /* in worker->wake_queue */
};

struct pdgw_worker {
    pdgw_server_t *srv;
    unsigned index;
    pthread_t thread;
    bool thread_started;
    int epfd;
    int wakefd;             /* eventfd: wakers, drain, stop */
    struct MHD_Daemon *mhd; /* frontend: mhd */
    int mhd_epfd;
    /* frontend: native (pdgw_front.c): the listening socket (-1 = none), connections by
     * descriptor, those the sink woke this loop turn, the cached Date and a read buffer. */
    int front_fd;
    pdgw_front_conn_t **front_conns;
    int front_cap;
    pdb_dlist_t front_ready;
    char front_date[40];
    long long front_date_sec;
    char *front_scratch;
    pdgw_timer_t front_accept_timer; /* accepting paused: out of descriptors */
    CURLM *multi;
    /* The native HTTP/1.1 client (upstream_client: native); NULL with curl. */
    pdgw_h1_client_t *h1;
    /* Idle easy handles, reset and reused (saves allocating one per leg). */
    CURL *easy_pool[64];
    int n_easy_pool;
    int64_t curl_timer_ms; /* absolute mono ms, -1 = none */
    /* Upstream sockets in the epoll set, by descriptor (pdgw_server.c). */
    uint8_t *curl_fds;
    size_t curl_fd_cap;
    atomic_bool stop;
    bool quiesced;
    bool mhd_kick;   /* a connection was resumed: run MHD this iteration */
    uint64_t now_ms; /* this loop turn's time (pdgw_now_ms), 0 before the loop runs */
    /* Every deadline of this worker's connections and requests (pdgw_timer.h). */
    pdgw_timers_t timers;
    /* Recycled request and workflow objects (pdgw_freelist.h). */
    pdgw_freelist_t req_pool;
    pdgw_freelist_t wf_pool;
    /* The per-model metric families (pdgw_models.c), looked up once per worker. */
    struct pdgw_model_families {
        pdgw_metric_family_t *requests, *duration, *ttft, *tokens, *slo;
        char last_model[128]; /* the last model label, at a fixed address (pdgw_models.c) */
        /* its series as looked up so far (status 200 for requests), NULL = not yet */
        pdgw_metric_t *ok, *duration_of, *ttft_of, *prompt_tokens, *completion_tokens;
    } model_families;
    /* Streams the sink writes itself with bytes to send this loop turn. */
    pdb_dlist_t flush_queue;
    /* Client sockets watched for hang-up while their connection is suspended. */
    pdgw_req_t **hup_reqs;
    int hup_cap;
    /* Wakers queued from any thread. */
    pthread_mutex_t wake_lock;
    struct pdgw_fwd_waker *wake_queue;
    /* Threads between queueing a waker and writing wakefd (pdgw_fwd_waker_wake): the
     * descriptor is closed only once none is left. */
    atomic_int wake_writers;
    /* A waker was queued from this worker's own thread: the queue runs later in this loop turn
     * without the eventfd round trip (worker thread only). */
    bool wake_local;
    /* Client connections of this worker (pdgw_conn.c): count, and the address let in by the
     * accept policy that MHD has not announced yet. */
    unsigned n_conns;
    unsigned char pending_addr[16];
    unsigned pending_addr_len; /* 0 = none */
};

/* The worker whose loop runs on the calling thread (NULL elsewhere). */
/* (pdgw_this_worker: pdgw_util.h) */

/* ---------------------------------------------------------------- legs */

/* Relayed bytes the client has not taken yet above which the upstream leg is paused (and
 * resumed below half of it). */
#define PDGW_OUT_HIGH_WATER (256u * 1024u)

/* Longest model name (and its NUL) a body validated on its text holds; a longer one is
 * validated on the tree. */
#define PDGW_MODEL_COPY_MAX 128

/* ---------------------------------------------------------------- requests */

struct pdgw_req {
    pdgw_worker_t *w;
    /* The connection it arrived on: libmicrohttpd's, or the native front end's (exactly one
     * is set). Read the request through pdgw_req_header() and its kin, never through these. */
    struct MHD_Connection *conn;
    pdgw_front_conn_t *fc;
    pdgw_conn_t *cx; /* the connection's guard (NULL if MHD gave none) */
    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } client_addr; /* the peer's address (sa_family AF_UNSPEC = unknown): written as text
                    * only for the access log that asks for it */
    int fd;
    uint64_t t_start_ns;
    uint64_t t_start_ms;
    pdgw_route_t route;
    const char *method;
    char path[256];       /* the routing path (pdgw_path.c): decoded but %2F, %3F, %25 */
    int path_refused;     /* 0, or the status refusing the path (400, 414) */
    const char *path_why; /* what path_refused says (static text) */
    char *admin_path;     /* /admin/instances only: the part after the prefix (owned) */
    /* body */
    pdgw_buf_t body;
    uint64_t declared_len; /* Content-Length, 0 when absent: the body buffer grows to it exactly */
    uint64_t body_held;    /* bytes this request holds of srv->body_bytes_held */
    bool too_large;
    bool counted;    /* counted in server->inflight */
    bool dispatched; /* the whole request was in and was decided on (dispatch ran) */
    /* identity */
    char id[132]; /* the client's X-Request-Id (or one minted for it): echoed and logged only */
    char traceparent[PDGW_TRACEPARENT_LEN + 1];
    pdgw_traceparent_t client_tp; /* the client's context (tracing), when has_client_tp */
    bool has_client_tp;
    pdgw_buf_t fwd_headers;  /* "Name: value\0" client headers to forward */
    bool own_authorization;  /* Authorization carried the gateway's key: not forwarded */
    const char *conn_tokens; /* the client's Connection header (MHD-owned), while collecting */
    /* The body as a tree. NULL also while json_deferred: the body was validated on its text
     * (pdgw_request_validate_flat) and the tree is built when something reads it
     * (pdgw_req_json). */
    json_t *json;
    bool json_deferred;
    char model_copy[PDGW_MODEL_COPY_MAX]; /* info.model of a body validated on its text */
    pdgw_request_info_t info;
    bool info_valid;
    pdgw_api_kind_t kind;
    uint64_t deadline_ms;
    /* client side */
    bool suspended;
    uint64_t suspended_at_ms;
    bool hup_watched;
    bool client_gone;
    bool reply_ready; /* reply_* filled, queue on the next handler call */
    bool queued;      /* a response was queued */
    bool committed;   /* the client got (or will get) the 200 stream */
    bool stream_raw;  /* the stream is an engine's answer relayed as it is (pass-through):
                       * its status and type are reply_status and reply_ctype */
    int reply_status;
    char *reply_body;
    size_t reply_len;
    char reply_ctype[96];
    bool reply_www_auth;
    bool reply_close; /* "Connection: close" (the request's framing cannot be trusted) */
    unsigned reply_retry_after_s; /* Retry-After on the reply when > 0 */
    pdgw_buf_t out;               /* streamed bytes not yet taken by MHD */
    void (*on_drain)(void *arg);  /* flow control: run once the client caught up */
    void *on_drain_arg;
    size_t out_off;
    bool out_done;
    uint64_t bytes_out;
    /* A stream the sink writes to the socket itself (pdgw_sink_direct.c). */
    bool http11;            /* the client spoke HTTP/1.1: MHD frames a stream in chunks */
    bool direct;            /* the socket is the sink's until the stream ends */
    bool direct_ended;      /* every byte is out; MHD writes the last chunk */
    bool direct_raw;        /* HTTP/1.0 on the native front end: no chunks, the close ends it */
    bool stream_counted;    /* the reader ran once: taken over or not, and counted */
    pdb_dlink_t flush_link; /* on w->flush_queue */
    pdgw_buf_t wire;        /* framed bytes the socket has not taken */
    size_t wire_off;
    /* The outcome the client saw, whoever decided it (a local reply, the connection guard, the
     * workflow); read at completion by the access log and the metrics. What the workflow
     * measured (instances, retries, leg times, tokens) stays in r->wf, which is released only
     * after they were read (pdgw_req_finalize). */
    int final_status;
    char *error_text;      /* PDGW_REQ_ERROR_MAX bytes, allocated by the first error; NULL = none */
    pdgw_phase_t pd_phase; /* failed PD phase of the final failure (NONE = none) */
    int pd_retryable;
    bool finalized;
    /* The workflow of a request that needs upstream work (inference, pass-through, GET
     * /v1/models fan-out); NULL = none (local replies never have one). Allocated at dispatch
     * from the worker's free list, released by pdgw_req_finalize. */
    pdgw_wf_t *wf;
    const pdgw_job_ops_t *job; /* what <wf> is (set with it) */
    /* What the request started with, whatever a reload changes meanwhile
     * (pdgw_server_reload.c): the forwarder context (referenced for the request's whole life;
     * its workflow borrows it) and the limits. */
    pdgw_fwd_gen_t *fwd_gen;
    void *fwd_ctx;
    uint64_t max_body_bytes;
    uint64_t request_timeout_ms;
    unsigned max_retries;
    uint8_t cors; /* pdgw_cors_t: what the request's Origin is allowed (pdgw_cors.c) */
    /* The request's next deadline (its workflow's deadlines, hang-up watch) while its
     * workflow runs (in_active). */
    pdgw_timer_t timer;
    bool in_active;
};

/* Longest error text kept for the access log and traces. */
#define PDGW_REQ_ERROR_MAX 640

/* ---- pdgw_server.c */
/* The request's workflow runs / ended: its deadlines are watched (a timer) / no longer. */
void pdgw_worker_active_add(pdgw_worker_t *w, pdgw_req_t *r);
void pdgw_worker_active_remove(pdgw_worker_t *w, pdgw_req_t *r);
/* A request of <w> whose deadlines are watched and for which <pred> holds (NULL: none); only
 * armed ones are found. */
pdgw_req_t *pdgw_worker_find_active(pdgw_worker_t *w, bool (*pred)(const pdgw_req_t *r));
/* Something moved one of <r>'s deadlines earlier (a leg started, a gate, a suspension):
 * bring its timer forward. Later deadlines are found when the timer fires. */
void pdgw_req_timer_update(pdgw_req_t *r);
/* Request objects of worker <w>: zeroed, recycled. */
pdgw_req_t *pdgw_req_alloc(pdgw_worker_t *w);
void pdgw_req_release(pdgw_req_t *r);
/* Watch / unwatch the client socket for hang-up while the connection is suspended. */
void pdgw_worker_hup_watch(pdgw_worker_t *w, pdgw_req_t *r);
/* Watch <r>'s client socket for hang-up, and with <writable> also for EPOLLOUT edges (a
 * stream the sink writes itself); false when the watch could not be set. */
bool pdgw_worker_client_watch(pdgw_worker_t *w, pdgw_req_t *r, bool writable);
void pdgw_worker_hup_unwatch(pdgw_worker_t *w, pdgw_req_t *r);

/* ---- pdgw_req_headers.c: the client's request head, whichever front end read it */
/* A header or query argument; false stops the walk. */
typedef bool (*pdgw_pair_fn)(void *arg, const char *name, const char *value);
/* The first value of request header <name> (<n> bytes, case-insensitive), NULL when absent. */
const char *pdgw_req_header_n(const pdgw_req_t *r, const char *name, size_t n);
/* The same for a NUL-terminated name (the literal names most callers pass are measured at
 * compile time). */
static inline const char *pdgw_req_header(const pdgw_req_t *r, const char *name)
{
    return pdgw_req_header_n(r, name, strlen(name));
}
/* Every request header, in the order received. */
void pdgw_req_headers_each(const pdgw_req_t *r, pdgw_pair_fn fn, void *arg);
/* Every query argument, decoded (a NULL value: the argument had no '='). */
void pdgw_req_query_each(const pdgw_req_t *r, pdgw_pair_fn fn, void *arg);

/* Where response headers go: a libmicrohttpd response, or the native front end's head. */
typedef struct pdgw_hdr_out {
    void (*add)(struct pdgw_hdr_out *o, const char *name, const char *value);
} pdgw_hdr_out_t;
static inline void pdgw_hdr_add(pdgw_hdr_out_t *o, const char *name, const char *value)
{
    o->add(o, name, value);
}

/* ---- pdgw_conn.c */
/* MHD accept policy: per-worker connection limit and per-client-address cap. */
enum MHD_Result pdgw_conn_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* MHD connection notifications: guard created (header deadline armed) / freed. */
void pdgw_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* A connection the accept policy let in opened / closed (either front end): its guard, with
 * the header deadline armed (NULL without memory; the connection is served unguarded). */
pdgw_conn_t *pdgw_conn_open(pdgw_worker_t *w, int fd);
void pdgw_conn_close(pdgw_worker_t *w, pdgw_conn_t *c);
/* The guard of <conn> (NULL if none). */
pdgw_conn_t *pdgw_conn_of(struct MHD_Connection *conn);
/* Request headers complete: the body must arrive by <r>'s deadline. */
void pdgw_conn_headers_done(pdgw_conn_t *cx, pdgw_req_t *r);
/* The body is complete (or a reply is queued): no receive deadline any more. */
void pdgw_conn_body_done(pdgw_conn_t *cx);
/* An answer is written and the client's socket is full: it must be read within <ms>. */
void pdgw_conn_write_wait(pdgw_conn_t *cx, uint64_t ms);
/* The connection is half-closed after its last answer: it closes when the client does, or
 * after <ms>. */
void pdgw_conn_linger(pdgw_conn_t *cx, uint64_t ms);
/* The request ended; a kept-alive connection gets the header deadline again. */
void pdgw_conn_request_done(pdgw_conn_t *cx);
/* After MHD_run: a connection the policy let in but MHD never announced is forgotten. */
void pdgw_conn_after_run(pdgw_worker_t *w);
/* Per-address table shared by the workers. */
pdgw_addr_table_t *pdgw_addr_table_create(void);
void pdgw_addr_table_destroy(pdgw_addr_table_t *t);
/* Client connections all workers may hold from the descriptor limit: (RLIMIT_NOFILE -
 * reserve) / <fds_per_conn>, the client's socket and the upstream legs it may hold at once
 * (2 with one leg, 3 when prefill and decode run together). */
unsigned pdgw_conn_limit_derive(uint64_t nofile, unsigned workers, unsigned fds_per_conn);

/* ---- pdgw_http.c: the request path's entry points, for either front end */
/* Where a request arrived: one of <conn> (libmicrohttpd) and <fc> (native) is set. */
typedef struct pdgw_http_origin {
    struct MHD_Connection *conn;
    pdgw_front_conn_t *fc;
    pdgw_conn_t *cx; /* the connection's guard (may be NULL) */
    int fd;
    const struct sockaddr *addr; /* NULL = unknown */
    const char *url, *method;    /* kept by the front end for the request's life */
    bool http11;
} pdgw_http_origin_t;
/* The request's headers are in: a new request (NULL = out of memory). It may already hold a
 * reply: refused before its body (r->reply_close set; the connection closes after it). */
pdgw_req_t *pdgw_http_begin(pdgw_worker_t *w, const pdgw_http_origin_t *o);
/* Body bytes (dropped once the body is refused); false = out of memory: close. */
bool pdgw_http_body(pdgw_req_t *r, const char *data, size_t len);
/* The whole request is in: decide. Then r->reply_ready, r->committed, or neither (the
 * answer comes later, through the sink). */
void pdgw_http_body_done(pdgw_req_t *r);
/* The exchange is over; <ok> = the whole answer was handed to the client's socket. Frees r. */
void pdgw_http_end(pdgw_req_t *r, bool ok);
/* libmicrohttpd's handler and completion callback. */
enum MHD_Result pdgw_http_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls);
void pdgw_http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe);
/* The Allow header of a 405 for <r>'s route (NULL when none applies). */
const char *pdgw_http_allowed_methods(const pdgw_req_t *r);

/* ---- pdgw_sink.c: the client response (the only code that touches it) */
/* Reply (before commit) with a buffer; takes ownership of <body> (malloc'd). */
void pdgw_req_reply(pdgw_req_t *r, int status, char *body, size_t len, const char *ctype);
/* Reply with an OpenAI error. */
void pdgw_req_reply_error(pdgw_req_t *r, const pdgw_api_error_t *err);
void pdgw_req_reply_errorf(pdgw_req_t *r, pdgw_api_err_kind_t kind, const char *code,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Streaming: commit the 200 SSE response; append bytes; end the stream. */
void pdgw_req_commit_stream(pdgw_req_t *r);
void pdgw_req_out_append(pdgw_req_t *r, const char *data, size_t len);
void pdgw_req_out_end(pdgw_req_t *r);
/* Resume the connection if suspended (the handler or reader then runs again). */
void pdgw_req_resume(pdgw_req_t *r);
/* Bytes queued for the client not yet taken. */
size_t pdgw_req_out_pending(const pdgw_req_t *r);
/* May a writer add more (false once the client is PDGW_OUT_HIGH_WATER behind)? */
bool pdgw_req_out_writable(const pdgw_req_t *r);
/* Run <fn>(<arg>) once, when the client has taken the backlog down to half the high water
 * (replaces an earlier registration). */
void pdgw_req_on_drain(pdgw_req_t *r, void (*fn)(void *arg), void *arg);
/* The answer is not known yet: suspend the connection until the sink resumes it. */
void pdgw_req_suspend(pdgw_req_t *r);
/* The headers of a filled reply (Content-Type first), whichever front end writes them; does
 * the reply close the connection (draining, or framing that cannot be trusted)? */
void pdgw_sink_reply_headers(pdgw_req_t *r, pdgw_hdr_out_t *o);
bool pdgw_sink_reply_closes(const pdgw_req_t *r);
/* The status and headers of a committed stream. */
int pdgw_sink_stream_status(const pdgw_req_t *r);
void pdgw_sink_stream_headers(pdgw_req_t *r, pdgw_hdr_out_t *o);
/* MHD side: queue the filled reply / the committed stream on the connection. */
enum MHD_Result pdgw_sink_queue_reply(pdgw_req_t *r);
enum MHD_Result pdgw_sink_queue_stream(pdgw_req_t *r);
/* The client went away (hang-up while suspended). */
void pdgw_req_client_hup(pdgw_req_t *r);

/* ---- pdgw_front.c: the native front end (pdgw_front.h) */
/* Listen on <addr> (SO_REUSEPORT, one socket per worker; the worker's read buffer with it);
 * its port once bound. */
pdgw_status_t pdgw_front_listen(pdgw_worker_t *w, const struct sockaddr *addr, char *err,
                                size_t errlen);
int pdgw_front_port(const pdgw_worker_t *w);
/* Events: the listening socket is readable / a connection's socket reported <events>. */
void pdgw_front_on_accept(pdgw_worker_t *w);
void pdgw_front_on_event(pdgw_worker_t *w, int fd, uint32_t events);
/* The sink has news for <fc>'s request (an answer, the end of a stream, a hang-up); acted
 * on by pdgw_front_run_ready at the end of the loop turn. */
void pdgw_front_wake(pdgw_front_conn_t *fc);
void pdgw_front_run_ready(pdgw_worker_t *w);
/* Stop accepting (draining) / close every connection, ending their requests (shutdown). */
void pdgw_front_quiesce(pdgw_worker_t *w);
void pdgw_front_close_all(pdgw_worker_t *w);
/* The head of <fc>'s current request (pdgw_req_headers.c). */
const struct pdgw_front_head *pdgw_front_conn_head(const pdgw_front_conn_t *fc);

/* ---- pdgw_sink_direct.c: a committed stream written to the socket by the sink */
/* May <r>'s stream be taken over (plain HTTP/1.1, the option on)? */
bool pdgw_direct_eligible(const pdgw_req_t *r);
/* Take the socket over (MHD's reader, with the headers sent); false = stay with MHD. */
bool pdgw_direct_take(pdgw_req_t *r);
/* Framed bytes the socket has not taken. */
size_t pdgw_direct_pending(const pdgw_req_t *r);
/* Send <r>'s new bytes at the end of this loop turn. */
void pdgw_direct_queue(pdgw_req_t *r);
/* The socket can take more (its EPOLLOUT edge). */
void pdgw_direct_writable(pdgw_req_t *r);
/* Send what every queued stream of <w> has (once per loop turn). */
void pdgw_direct_flush_all(pdgw_worker_t *w);
/* The connection is over: drop <r> from the queue and its unsent bytes. */
void pdgw_direct_forget(pdgw_req_t *r);

/* Reply with the compact text of <obj> (taken); 500 when it cannot be rendered. */
void pdgw_req_reply_json(pdgw_req_t *r, int status, json_t *obj);

/* ---- pdgw_curl_loop.c: curl's multi handle on the worker loop */
int pdgw_curl_loop_on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp);
int pdgw_curl_loop_on_timer(CURLM *multi, long timeout_ms, void *userp);
/* An event on an upstream socket curl does not watch (idle in its cache): handled, true. */
bool pdgw_curl_loop_idle_event(pdgw_worker_t *w, int fd);
/* Finished transfers handed to their legs. */
void pdgw_curl_loop_done(pdgw_worker_t *w);
/* Options every easy handle of worker <w> needs (how its sockets are closed). */
void pdgw_curl_loop_prepare(pdgw_worker_t *w, CURL *easy);
/* curl opened socket <s> (a new descriptor: not in the epoll set). */
void pdgw_curl_loop_socket_opened(pdgw_worker_t *w, curl_socket_t s);

/* ---- pdgw_req.c */
/* The request's end at its connection's completion: metrics, access log, its workflow
 * stopped and released, everything freed. <client_disconnected>: it went away first. */
void pdgw_req_finalize(pdgw_req_t *r, bool client_disconnected);
/* The error text of the access log and trace (kept to PDGW_REQ_ERROR_MAX bytes): set
 * (replacing) / set only if none yet. Without memory for it the log goes without. */
void pdgw_req_error_set(pdgw_req_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pdgw_req_error_first(pdgw_req_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The error text, "" when none. */
const char *pdgw_req_error(const pdgw_req_t *r);
/* The request body as a tree (borrowed: the request holds it), built at the first call when
 * the body was validated on its text; NULL when the route has no body tree or out of memory
 * (a later call tries again). */
json_t *pdgw_req_json(pdgw_req_t *r);
/* The body's top-level member <name> (borrowed), NULL when absent; a body validated on its
 * text is not built into a tree for a member it does not have. */
json_t *pdgw_req_json_member(pdgw_req_t *r, const char *name);

/* ---- pdgw_fwd_api.c */
/* A waker of <wf> on worker <w>: a wake runs <on_wake>(wf) on that worker. */
struct pdgw_fwd_waker *pdgw_waker_create(pdgw_worker_t *w, pdgw_wf_t *wf,
                                         void (*on_wake)(pdgw_wf_t *wf));
/* Detach from the workflow (wake becomes a no-op) and drop the workflow's reference. */
void pdgw_waker_detach(struct pdgw_fwd_waker *wk);
/* Worker: run every queued waker. */
void pdgw_waker_run_queue(pdgw_worker_t *w);
/* Worker shutdown: drop queued wakers without running them. */
void pdgw_waker_drop_queue(pdgw_worker_t *w);
/* Metrics and pool behind the forwarder helpers (counters, KV hints); NULLs detach. */
void pdgw_fwd_api_set_services(pdgw_gateway_metrics_t *gm, sched_pool_t *pool);
/* pdgw_server_reload.c: the reloadable limits and forwarder context. init after the
 * forwarder is set up, fini once every request is gone; a request acquires in req_new and
 * releases when it is freed. */
pdgw_status_t pdgw_server_live_init(pdgw_server_t *srv);
void pdgw_server_live_fini(pdgw_server_t *srv);
void pdgw_req_live_acquire(pdgw_req_t *r);
void pdgw_req_live_release(pdgw_req_t *r);
/* protocol_options kv pairs are converted by main; this converts one text value. */
json_t *pdgw_fwd_option_value(const char *text);

#endif /* PDGW_SERVER_INT_H */
