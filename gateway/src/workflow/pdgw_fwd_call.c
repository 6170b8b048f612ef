/*
 * pdgw_fwd_call.c - calls of a forwarder's own (forwarder.h pdgw_fwd_call_*): one upstream leg
 * owned by the call instead of the workflow, on the request's worker.
 *
 * LMCache's proxy asks an engine's POST /tokenize before every prefill. Run on a thread of the
 * forwarder's, that call costs two hand-overs between threads per request (worker -> thread,
 * thread -> worker) and a second HTTP client; here it is an ordinary leg of the worker's
 * upstream client (kept-alive connections, the native client when the URL allows it). The
 * leg reports to this file (its owner), which wakes the request so its pending gate runs
 * again; a timer on the worker's heap bounds the call. A Mooncake prefill's bootstrap GET
 * /query is one too, to another port of the instance's host (pdgw_fwd_call_get_port): the
 * host and port come from the configuration, never from a client.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdb/pdb_str.h"
#include "pdgw_alloc.h"
#include "pdgw_body_splice.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

struct pdgw_fwd_call {
    pdgw_leg_t leg;
    pdgw_fwd_waker_t *waker; /* the request's (referenced) */
    pdgw_worker_t *w;
    pdgw_timer_t timer; /* the call's deadline on w->timers */
    int64_t timeout_ms;
    int state; /* 0 running, 1 answered, -1 failed */
    char msg[200];
};

static void call_on_done(pdgw_leg_t *leg)
{
    pdgw_fwd_call_t *c = (pdgw_fwd_call_t *)(void *)((char *)leg - offsetof(pdgw_fwd_call_t, leg));
    pdgw_timer_cancel(&c->w->timers, &c->timer);
    /* An answer with an error status is an answer: the forwarder judges the status. */
    if (leg->err == PDGW_LEGERR_NONE || (leg->err == PDGW_LEGERR_STATUS && leg->got_status)) {
        c->state = 1;
    } else {
        c->state = -1;
        snprintf(c->msg, sizeof(c->msg), "%s",
                 leg->errmsg[0] ? leg->errmsg : pdgw_leg_err_name(leg->err));
    }
    pdgw_fwd_waker_wake(c->waker); /* the gate runs from the worker loop, not from here */
}

static const pdgw_leg_owner_t call_owner = {.on_done = call_on_done, .moved = pdgw_wf_leg_moved};

static void call_on_timer(pdgw_timer_t *t, uint64_t now)
{
    pdgw_fwd_call_t *c = t->arg;
    (void)now;
    if (c->state != 0)
        return;
    pdgw_leg_abort(&c->leg);
    c->state = -1;
    snprintf(c->msg, sizeof(c->msg), "%s: no answer within %lld ms",
             c->leg.inst ? c->leg.inst->id : "?", (long long)c->timeout_ms);
    pdgw_fwd_waker_wake(c->waker);
}

/* A call on the workflow of <wk>: <method> to <url> with <text> (taken; NULL for none). */
static pdgw_fwd_call_t *call_start(pdgw_fwd_waker_t *wk, const pdgw_instance_t *inst,
                                   const char *url, const char *method, char *text, size_t len,
                                   int64_t timeout_ms)
{
    pdgw_wf_t *wf = wk->wf;
    pdgw_fwd_call_t *c = pdgw_calloc(1, sizeof(*c));
    if (c == NULL) {
        pdgw_free(text);
        return NULL;
    }
    c->w = wf->w;
    c->timeout_ms = timeout_ms;
    c->waker = pdgw_fwd_waker_ref(wk);
    pdgw_timer_init(&c->timer, call_on_timer);
    c->timer.arg = c;
    pdgw_leg_init(&c->leg, &wf->origin, wf, PDGW_LEG_PREFILL, &call_owner);
    /* The leg takes the text. */
    if (pdgw_leg_start_url(&c->leg, inst, url, method, text, len, NULL) != PDGW_OK) {
        pdgw_free(text);
        pdgw_leg_release(&c->leg);
        pdgw_fwd_waker_unref(c->waker);
        pdgw_free(c);
        return NULL;
    }
    if (timeout_ms > 0 && pdgw_timer_arm(&c->w->timers, &c->timer,
                                         c->leg.t_start_ms + (uint64_t)timeout_ms) != PDGW_OK) {
        pdgw_fwd_call_release(c);
        return NULL;
    }
    return c;
}

pdgw_fwd_call_t *pdgw_fwd_call_post(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                    const char *path, json_t *body, int64_t timeout_ms)
{
    pdgw_fwd_waker_t *wk = req != NULL ? req->waker : NULL;
    pdgw_wf_t *wf;
    char url[1024];
    char *text;
    size_t len = 0;

    /* The waker names the workflow and its worker; ops run on that worker, so the workflow is
     * alive while we are called. */
    if (wk == NULL || wk->wf == NULL || inst == NULL || body == NULL || path == NULL) {
        json_decref(body);
        return NULL;
    }
    wf = wk->wf;
    /* A call's body often carries the client's prompt (/tokenize): its bytes are copied, not
     * escaped again. */
    text =
        pdgw_body_text(wf->req->body.data, wf->req->body.len, pdgw_req_json(wf->req), body, &len);
    json_decref(body);
    if (text == NULL)
        return NULL;
    pdb_str_join(url, sizeof(url), inst->url, path);
    return call_start(wk, inst, url, "POST", text, len, timeout_ms);
}

pdgw_fwd_call_t *pdgw_fwd_call_get_port(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                        int port, const char *path, int64_t timeout_ms)
{
    pdgw_fwd_waker_t *wk = req != NULL ? req->waker : NULL;
    char url[512];
    int n;
    /* Only the configured instance's host, over plain HTTP: nothing a client sent can point
     * the gateway elsewhere. */
    if (wk == NULL || wk->wf == NULL || inst == NULL || inst->host[0] == '\0' || port <= 0 ||
        port > 65535 || path == NULL || path[0] != '/')
        return NULL;
    n = snprintf(url, sizeof(url), strchr(inst->host, ':') ? "http://[%s]:%d%s" : "http://%s:%d%s",
                 inst->host, port, path);
    if (n < 0 || (size_t)n >= sizeof(url))
        return NULL;
    return call_start(wk, inst, url, "GET", NULL, 0, timeout_ms);
}

int pdgw_fwd_call_result(const pdgw_fwd_call_t *c, long *status, const char **data, size_t *len,
                         char *msg, size_t cap)
{
    if (c->state == 1) {
        *status = c->leg.status;
        *data = c->leg.resp.data ? c->leg.resp.data : "";
        *len = c->leg.resp.len;
    } else if (c->state < 0 && msg != NULL) {
        snprintf(msg, cap, "%s", c->msg);
    }
    return c->state;
}

void pdgw_fwd_call_release(pdgw_fwd_call_t *c)
{
    if (c == NULL)
        return;
    pdgw_timer_cancel(&c->w->timers, &c->timer);
    pdgw_leg_release(&c->leg);
    pdgw_fwd_waker_unref(c->waker);
    pdgw_free(c);
}
