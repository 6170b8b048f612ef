/*
 * pdgw_leg.h - one upstream HTTP leg (pdgw_leg.c): what it sends, what came back, and the
 * owner it reports to (pdgw_leg_owner_t). A leg names no owner; it runs on its worker's
 * native client or curl multi handle.
 */
#ifndef PDGW_LEG_H
#define PDGW_LEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <pdsched/sched.h>

#include "pdgw/forwarder.h"
#include "pdgw_sse.h"
#include "pdgw_upstream_h1.h"
#include "pdgw_util.h"

typedef struct pdgw_leg pdgw_leg_t;
typedef struct pdgw_wf pdgw_wf_t;
typedef struct pdgw_worker pdgw_worker_t;

/* Who a leg runs for: the worker whose loop carries it and what every leg of that request
 * sends. Owned by the leg's owner, which outlives its legs. */
typedef struct pdgw_leg_origin {
    pdgw_worker_t *w;
    const char *id;            /* X-Request-Id */
    const char *traceparent;   /* "" = none */
    const pdgw_buf_t *headers; /* the client's headers to forward ("Name: value\0"...) */
} pdgw_leg_origin_t;

typedef enum { PDGW_LEG_IDLE = 0, PDGW_LEG_RUNNING, PDGW_LEG_DONE } pdgw_leg_state_t;

/* Why a leg failed (also the metric's kind label). */
typedef enum {
    PDGW_LEGERR_NONE = 0,
    PDGW_LEGERR_CONNECT,  /* could not connect (retryable) */
    PDGW_LEGERR_TIMEOUT,  /* connect / first byte / idle deadline */
    PDGW_LEGERR_STATUS,   /* HTTP status >= 400 */
    PDGW_LEGERR_RESET,    /* connection broke mid-response */
    PDGW_LEGERR_PROTOCOL, /* malformed response (SSE too large, body too large) */
    PDGW_LEGERR_LOCAL,    /* the gateway itself ran short (fds, memory): not the instance's fault */
} pdgw_leg_err_t;

/* Whoever owns a leg hears from it through these (the workflow, GET /v1/models, pass-through):
 * the leg knows no owner by name. */
typedef struct pdgw_leg_owner {
    /* One SSE event of a relayed stream; non-zero stops the leg (the owner answered). */
    int (*on_event)(pdgw_leg_t *leg, const pdgw_sse_event_t *ev);
    /* The leg ended: success, or leg->err says why not. */
    void (*on_done)(pdgw_leg_t *leg);
    /* A raw leg (leg->raw): each response header line as received, and the body's bytes;
     * on_data answers how many it took (fewer stops the leg, CURL_WRITEFUNC_PAUSE pauses it
     * until pdgw_leg_unpause). NULL for owners without raw legs. */
    void (*on_head)(pdgw_leg_t *leg, const char *line, size_t len);
    size_t (*on_data)(pdgw_leg_t *leg, const char *data, size_t len);
    /* Flow control of a relayed stream: true = the client is behind, the leg pauses and the
     * owner calls pdgw_leg_unpause once it drained (NULL: never held). */
    bool (*hold)(pdgw_leg_t *leg);
    /* The leg started or resumed: deadlines of the owner moved (NULL: none to move). */
    void (*moved)(pdgw_leg_t *leg);
} pdgw_leg_owner_t;

struct pdgw_leg {
    pdgw_wf_t *wf; /* its owner's object: for the owner's callbacks, never read by the leg */
    const pdgw_leg_origin_t *origin;
    const pdgw_leg_owner_t *owner;
    pdgw_leg_kind_t kind;
    pdgw_leg_state_t state;
    const pdgw_instance_t *inst;
    bool relay; /* this leg's response goes to the client */
    bool raw;   /* pass-through: bytes go to the client unchanged (pdgw_passthrough.c) */
    bool sse;   /* relay as SSE (client asked for stream) */
    CURL *easy;
    struct curl_slist *headers;
    bool native;        /* this leg runs on the native client (h1), not curl */
    pdgw_h1_xfer_t h1;  /* its transfer there */
    char *body;         /* request body text */
    bool body_borrowed; /* body points into the client request (not freed here) */
    size_t body_len;
    long status;
    bool got_status;
    char content_type[96];
    uint64_t retry_after_ms;
    pdgw_buf_t resp; /* buffered response (not relayed as SSE) */
    pdgw_sse_t parser;
    bool saw_done;
    bool paused;
    uint64_t t_start_ms;
    uint64_t t_first_ms; /* first response byte, 0 = none */
    uint64_t t_last_ms;  /* last progress */
    uint64_t t_end_ms;
    uint64_t bytes_in; /* response body bytes received */
    pdgw_leg_err_t err;
    int os_errno; /* errno of a failed connect, when curl reports one */
    char errmsg[160];
};

/* ---- pdgw_leg.c */
void pdgw_leg_init(pdgw_leg_t *leg, const pdgw_leg_origin_t *origin, pdgw_wf_t *wf,
                   pdgw_leg_kind_t kind, const pdgw_leg_owner_t *owner);
/* Start <leg> to <inst> with <body> (taken) and the forwarder's extra headers. */
pdgw_status_t pdgw_leg_start(pdgw_leg_t *leg, const pdgw_instance_t *inst, const char *path,
                             const char *method, char *body, size_t body_len,
                             const pdgw_fwd_leg_t *fl);
/* The same to a whole URL (a service of the instance's beside its API, e.g. a bootstrap
 * server); <inst> still names the leg in metrics and messages. */
pdgw_status_t pdgw_leg_start_url(pdgw_leg_t *leg, const pdgw_instance_t *inst, const char *url,
                                 const char *method, char *body, size_t body_len,
                                 const pdgw_fwd_leg_t *fl);
/* Stop a running leg now (connection closed), free its transfer state. */
void pdgw_leg_abort(pdgw_leg_t *leg);
/* Free everything (aborts if running). */
void pdgw_leg_release(pdgw_leg_t *leg);
/* Called by the worker loop for each finished transfer. */
void pdgw_leg_on_done(pdgw_leg_t *leg, CURLcode rc);
/* Let a paused leg continue (client drained). */
void pdgw_leg_unpause(pdgw_leg_t *leg);
/* Metric kind label of an error. */
const char *pdgw_leg_err_name(pdgw_leg_err_t e);
/* What a finished leg says about its instance (for the booking's outcome). */
sched_outcome_t pdgw_leg_outcome(const pdgw_leg_t *leg);

#endif /* PDGW_LEG_H */
