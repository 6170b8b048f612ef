/*
 * pdgw_kv_release.c - no stranded KV: the prefill answered, its KV is held for a decode that
 * will not come, so a decode engine is asked to take it now.
 *
 * vLLM's prefill (NixlConnector, MooncakeConnector) keeps the blocks of a request it computed
 * for a remote decode until a decode engine reads them or tells it to free them; otherwise
 * only its lease or abort timeout frees them (kv_lease_duration / VLLM_NIXL_ABORT_REQUEST_
 * TIMEOUT, VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT). The decode side always releases them: in
 * vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py and
 * mooncake/mooncake_connector.py, request_finished() of a request that still carries
 * do_remote_prefill (it ended before it was scheduled: aborted, or rejected by the serving
 * layer) queues an empty read, and the worker notifies the prefill to free the blocks;
 * a request that is scheduled reads them, which frees them too. So a gateway releases held
 * KV by sending a decode engine the decode request the prefill's answer made, cut to one
 * output token and not streamed: the engine takes (or drops) the blocks and the prefill frees
 * them at once. (The same rule decides whether a retry may keep the prefill and re-pick only
 * the decode: pdgw_kv_still_held.) pdgw does that when an attempt of vllm-nixl / vllm-mooncake ends
 * after its prefill answered while its decode leg never reached an engine (the client left before
 * it went, no decode instance could be booked, the decode's gate refused, the decode could not be
 * connected to or refused it with 429/503), and counts it. A decode leg that reached the engine
 * needs nothing: the engine aborts it when pdgw closes it, and frees the blocks itself.
 *
 * The release leg outlives the client request: it runs under a small owner request of its
 * own on the same worker (never answered to anyone), bounded by KV_RELEASE_TIMEOUT_MS.
 */
#include <string.h>

#include "pdgw_route.h"
#include "pdgw_alloc.h"
#include "pdgw_log.h"

#include "pdgw_route_int.h"
#include "pdgw_server_int.h"
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */
#include "pdgw_wf.h"

static const pdgw_job_ops_t release_job;

#define KV_RELEASE_TIMEOUT_MS 30000

static void rel_count(pdgw_routing_t *rt, const char *reason, const char *result)
{
    if (rt && rt->kv_release)
        pdgw_counter_inc(pdgw_metric_family_series2(rt->kv_release, reason, result));
}

static bool protocol_holds_kv(const char *name)
{
    return strcmp(name, "vllm-nixl") == 0 || strcmp(name, "vllm-mooncake") == 0;
}

/* Did the decode leg never reach an engine that would take the blocks? */
static bool decode_never_reached(const pdgw_leg_t *d)
{
    if (d->state == PDGW_LEG_IDLE)
        return true;
    if (d->state != PDGW_LEG_DONE)
        return false; /* still running: aborting it makes the engine free them */
    if (d->err == PDGW_LEGERR_CONNECT || d->err == PDGW_LEGERR_LOCAL)
        return true;
    return d->err == PDGW_LEGERR_STATUS && (d->status == 429 || d->status == 503);
}

bool pdgw_kv_still_held(const pdgw_wf_t *wf, const pdgw_leg_t *d)
{
    return !protocol_holds_kv(wf->w->srv->desc->name) || decode_never_reached(d);
}

static const char *reason_name(pdgw_wf_t *wf, pdgw_end_reason_t reason)
{
    if (reason == PDGW_END_CANCELLED)
        return "client_gone";
    if (reason == PDGW_END_TIMEOUT)
        return "timeout";
    if (reason == PDGW_END_RETRY)
        return "retry";
    return wf->legs[PDGW_LEG_DECODE].state == PDGW_LEG_IDLE ? "no_decode" : "decode_refused";
}

/* A usable decode instance other than <avoid> (NULL = any); new reference or NULL. */
static sched_instance_t *pick_decode(pdgw_wf_t *wf, const char *avoid)
{
    pdgw_routing_t *rt = wf->w->srv->routing;
    size_t n = sched_pool_usable_count(wf->w->srv->opts.pool, SCHED_ROLE_DECODE);
    for (size_t i = 0; i < n; i++) {
        sched_instance_t *si = sched_pool_pick_usable(wf->w->srv->opts.pool, SCHED_ROLE_DECODE,
                                                      atomic_fetch_add(&rt->turn, 1));
        if (si == NULL)
            return NULL;
        if (avoid == NULL || strcmp(sched_instance_desc(si)->id, avoid) != 0)
            return si;
        sched_instance_unref(si);
    }
    return NULL;
}

/* The decode body the forwarder builds for <target>, cut to one token, not streamed. */
static char *release_body(pdgw_wf_t *wf, const pdgw_instance_t *target, size_t *len)
{
    const pdgw_fwd_ops_t *ops = wf->w->srv->desc->ops;
    pdgw_fwd_peers_t peers = wf->peers;
    pdgw_fwd_leg_t fl;
    pdgw_fwd_error_t e;
    json_t *b;
    char *text;

    memset(&fl, 0, sizeof(fl));
    memset(&e, 0, sizeof(e));
    peers.decode = target;
    if (ops->build_leg(wf->fwd_ctx, wf->fwd_state, &wf->freq, PDGW_LEG_DECODE, &peers, &fl, &e) !=
            PDGW_FWD_OK ||
        fl.body == NULL) {
        json_decref(fl.body);
        return NULL;
    }
    b = fl.body;
    json_object_set_new(b, "max_tokens", json_integer(1));
    if (json_object_get(b, "max_completion_tokens"))
        json_object_set_new(b, "max_completion_tokens", json_integer(1));
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
    json_object_del(b, "min_tokens");
    json_object_del(b, "n");
    text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (text)
        *len = strlen(text);
    return text;
}

/* The release leg reports here (its owner), not to the workflow. */
static void release_on_leg_done(pdgw_leg_t *leg)
{
    (void)pdgw_kv_release_leg_done(leg->wf, leg);
}

static const pdgw_leg_owner_t release_leg_owner = {.on_done = release_on_leg_done};

void pdgw_kv_release_attempt_end(pdgw_wf_t *wf, pdgw_end_reason_t reason)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    pdgw_routing_t *rt = srv->routing;
    const pdgw_leg_t *p = &wf->legs[PDGW_LEG_PREFILL], *d = &wf->legs[PDGW_LEG_DECODE];
    const char *why, *avoid = NULL;
    sched_instance_t *si = NULL;
    pdgw_req_t *o = NULL;
    pdgw_wf_t *ow = NULL;
    pdgw_req_route_t *q;
    char *body;
    size_t len = 0;

    if (reason == PDGW_END_OK || !wf->attempt_live || !protocol_holds_kv(srv->desc->name) ||
        p->state != PDGW_LEG_DONE || p->err != PDGW_LEGERR_NONE || p->status < 200 ||
        p->status >= 300 || !decode_never_reached(d))
        return;
    why = reason_name(wf, reason);
    /* The booked decode when the leg never went; another one when it refused. */
    if (d->state == PDGW_LEG_IDLE && wf->sched_inst[PDGW_LEG_DECODE] != NULL)
        si = sched_instance_ref(wf->sched_inst[PDGW_LEG_DECODE]);
    else
        avoid = wf->inst_set[PDGW_LEG_DECODE] ? wf->inst_view[PDGW_LEG_DECODE].id : NULL;
    if (si == NULL)
        si = pick_decode(wf, avoid);
    if (si == NULL) {
        rel_count(rt, why, "no_instance");
        return;
    }
    /* A bare request (for its timer) and a workflow object of its own (the leg, the route
     * state); not from the worker's free lists, like the route state. */
    o = pdgw_calloc(1, sizeof(*o));
    ow = o ? pdgw_calloc(1, sizeof(*ow)) : NULL;
    q = ow ? pdgw_calloc(1, sizeof(*q)) : NULL;
    if (q == NULL) {
        pdgw_free(ow);
        pdgw_free(o);
        sched_instance_unref(si);
        rel_count(rt, why, "error");
        return;
    }
    o->w = wf->w;
    o->route = PDGW_ROUTE_NONE;
    o->wf = ow;
    o->job = &release_job;
    ow->req = o;
    ow->w = wf->w;
    ow->stage = PDGW_WF_DECODE;
    memcpy(ow->leg_id, wf->leg_id, sizeof(ow->leg_id));
    ow->origin = (pdgw_leg_origin_t){
        .w = wf->w, .id = ow->leg_id, .traceparent = "", .headers = &o->fwd_headers};
    ow->rt = q;
    q->release = true;
    q->release_reason = why;
    q->si = si;
    pdgw_instance_view_from_sched(&q->inst, si);
    body = release_body(wf, &q->inst, &len);
    q->leg = body ? pdgw_calloc(1, sizeof(*q->leg)) : NULL;
    if (q->leg == NULL) {
        free(body);
        goto err;
    }
    pdgw_leg_init(q->leg, &ow->origin, ow, PDGW_LEG_DECODE, &release_leg_owner);
    if (pdgw_leg_start(q->leg, &q->inst, r->path, "POST", body, len, NULL) != PDGW_OK) {
        free(body);
        goto err;
    }
    q->t_deadline_ms = q->leg->t_start_ms + KV_RELEASE_TIMEOUT_MS;
    pdgw_worker_active_add(o->w, o); /* its deadline timer; freed with the worker */
    return;
err:
    rel_count(rt, why, "error");
    pdgw_route_req_release(ow);
    pdgw_free(ow);
    pdgw_free(o);
}

/* The owner <o> and its bare request go. */
static void release_free(pdgw_wf_t *o)
{
    pdgw_req_t *req = o->req;
    pdgw_worker_active_remove(req->w, req);
    pdgw_route_req_release(o);
    pdgw_free(o);
    pdgw_free(req);
}

static bool is_release_owner(const pdgw_req_t *o)
{
    return o->wf != NULL && o->wf->rt != NULL && o->wf->rt->release;
}

bool pdgw_kv_release_leg_done(pdgw_wf_t *o, pdgw_leg_t *leg)
{
    pdgw_req_route_t *q = o->rt;
    bool ok;
    if (q == NULL || !q->release || leg != q->leg)
        return false;
    ok = leg->err == PDGW_LEGERR_NONE && leg->status >= 200 && leg->status < 300;
    rel_count(o->w->srv->routing, q->release_reason, ok ? "ok" : "failed");
    if (!ok) {
        static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
        uint64_t skipped = 0;
        if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
            pdgw_log_warn("kv-release",
                          "request %s: releasing the prefill's KV through %s failed (%s); the "
                          "prefill frees it at its lease (%llu similar suppressed)",
                          o->leg_id, q->inst.id, leg->errmsg[0] ? leg->errmsg : "error",
                          (unsigned long long)skipped);
    }
    release_free(o);
    return true;
}

bool pdgw_kv_release_check_deadline(pdgw_wf_t *o, uint64_t now_ms)
{
    pdgw_req_route_t *q = o->rt;
    if (q == NULL || !q->release)
        return false;
    if (q->leg && q->leg->state == PDGW_LEG_RUNNING && now_ms >= q->t_deadline_ms) {
        rel_count(o->w->srv->routing, q->release_reason, "failed");
        release_free(o);
    }
    return true;
}

/* The owner's job: one leg, one deadline, whose check frees it (pdgw_phases.h may_free). */
static uint64_t release_next_deadline(const pdgw_wf_t *o)
{
    const pdgw_req_route_t *q = o->rt;
    return q->leg && q->leg->state == PDGW_LEG_RUNNING ? q->t_deadline_ms : UINT64_MAX;
}

static void release_check_deadlines(pdgw_wf_t *o, uint64_t now_ms)
{
    (void)pdgw_kv_release_check_deadline(o, now_ms);
}

static const pdgw_job_ops_t release_job = {
    .name = "kv release",
    .next_deadline = release_next_deadline,
    .check_deadlines = release_check_deadlines,
    .may_free = true,
};

void pdgw_kv_release_drop_all(pdgw_worker_t *w)
{
    pdgw_req_t *o;
    while ((o = pdgw_worker_find_active(w, is_release_owner)) != NULL)
        release_free(o->wf);
}
