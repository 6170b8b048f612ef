/*
 * pdgw_admit_req.c - admission control, retry backoff and session affinity in the request
 * path. The hooks (see pdgw_server_int.h) are called from dispatch (enter), the waker (a
 * grant), the deadline scan (queue timeout, backoff) and finalize (done).
 *
 * A request is admitted after it was validated and before any instance is booked. A queued
 * request is suspended in stage WAIT and sits in its worker's active list, so its client's
 * hang-up is noticed while it waits (the place is then freed at once by finalize) and the
 * scan enforces its queue deadline. The slot is released in finalize only, the one place
 * every request passes exactly once (success, error, retry, disconnect, a cut stream).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pdgw_auth.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"
#include "pdgw_log.h"

/* The header for clients that cannot change bodies; same meaning as the body's field. */
#define PRIORITY_HEADER "X-Priority"

static void on_grant(void *arg)
{
    /* Under the controller's lock, from any thread: only wake the owner's worker. */
    pdgw_fwd_waker_wake(arg);
}

/* The request's priority: the body's `priority` (vLLM's field, an integer, lower = sooner),
 * else the X-Priority header, else 0. false = malformed (<e> filled). */
bool pdgw_req_priority(pdgw_req_t *r, int64_t *out, pdgw_api_error_t *e)
{
    json_t *p = pdgw_req_json_member(r, "priority");
    const char *h;
    *out = 0;
    if (p != NULL && !json_is_null(p)) {
        if (!json_is_integer(p)) {
            pdgw_api_error_set(e, PDGW_API_ERR_BAD_REQUEST, "priority",
                               "priority must be an integer (lower is served earlier)");
            return false;
        }
        *out = (int64_t)json_integer_value(p);
        return true;
    }
    h = pdgw_req_header(r, PRIORITY_HEADER);
    if (h != NULL) {
        char *end;
        long long v;
        errno = 0;
        v = strtoll(h, &end, 10);
        while (*end == ' ' || *end == '\t')
            end++;
        if (end == h || *end != '\0' || errno == ERANGE) {
            pdgw_api_error_set(e, PDGW_API_ERR_BAD_REQUEST, NULL,
                               "header " PRIORITY_HEADER " must be an integer (lower is served "
                               "earlier)");
            return false;
        }
        *out = (int64_t)v;
    }
    return true;
}

const char *pdgw_req_bearer(pdgw_req_t *r, size_t *len)
{
    const char *h = pdgw_req_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *end;
    *len = 0;
    if (h == NULL || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t'))
        return NULL;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    end = h + strlen(h);
    while (end > h && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *len = (size_t)(end - h);
    return h;
}

/* The affinity key of the request (header value or body `user`), borrowed. */
static void req_affinity(pdgw_wf_t *wf, const pdgw_admit_limits_t *l)
{
    pdgw_req_t *r = wf->req;
    const char *v = NULL;
    if (l->affinity == PDGW_AFFINITY_HEADER)
        v = pdgw_req_header(r, l->affinity_header);
    else if (l->affinity == PDGW_AFFINITY_USER)
        v = json_string_value(pdgw_req_json_member(r, "user"));
    wf->affinity_key = v != NULL && v[0] != '\0' ? v : NULL;
}

static void refuse(pdgw_req_t *r, uint64_t retry_after_ms, const char *code, const char *msg)
{
    pdgw_api_error_t e;
    uint64_t s = (retry_after_ms + 999) / 1000;
    r->reply_retry_after_s = (unsigned)(s < 1 ? 1 : s > 3600 ? 3600 : s);
    pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL, "%s", msg);
    pdgw_api_error_set_code(&e, code);
    pdgw_req_reply_error(r, &e);
}

/* The admission controller's part: priority, affinity, a slot or a place in its queue. */
static bool controller_enter(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_admit_t *a = wf->w->srv->opts.admit;
    pdgw_admit_limits_t l;
    pdgw_api_error_t e;
    const char *key;
    size_t key_len;
    uint64_t retry_ms = 0, now = pdgw_now_ms();
    int64_t prio;

    if (a == NULL || (r->route != PDGW_ROUTE_INFER && r->route != PDGW_ROUTE_PASSTHROUGH))
        return true;
    pdgw_admit_get_path_limits(a, &l);
    req_affinity(wf, &l);
    if (!pdgw_req_priority(r, &prio, &e)) {
        pdgw_gateway_metrics_rejected(wf->w->srv->opts.metrics, "invalid");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    wf->admit.waiter.priority = prio;
    /* llm-d's SLO deadline ordering: arrival + TTFT target; no target sorts after all */
    wf->admit.waiter.deadline_ms =
        l.by_slo_deadline && wf->slo_ttft_ms > 0 ? r->t_start_ms + wf->slo_ttft_ms : UINT64_MAX;
    if (wf->waker == NULL)
        wf->waker = pdgw_waker_create(wf->w, wf, r->job->wake);
    if (wf->waker == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return false;
    }
    key = pdgw_req_bearer(r, &key_len);
    switch (pdgw_admit_enter(a, &wf->admit, key, key_len, now, r->deadline_ms, on_grant, wf->waker,
                             &retry_ms)) {
    case PDGW_ADMIT_ADMITTED:
        return true;
    case PDGW_ADMIT_QUEUED:
        wf->admit_waiting = true;
        wf->stage = PDGW_WF_WAIT;
        pdgw_worker_active_add(wf->w, r);
        pdgw_req_timer_update(r); /* fires at the queue deadline (pdgw_wf_next_deadline) */
        return false;
    case PDGW_ADMIT_RATE_LIMITED:
        refuse(r, retry_ms, "rate_limited", "Rate limit of this API key exceeded; retry later.");
        return false;
    case PDGW_ADMIT_QUEUE_FULL:
        refuse(r, retry_ms, "queue_full",
               "Too many requests: the gateway's admission queue is full; retry later.");
        return false;
    default:
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return false;
    }
}

bool pdgw_admit_req_enter(pdgw_wf_t *wf)
{
    pdgw_admit_ticket_init(&wf->admit);
    /* the tenant's budgets and fair share first: the controller's slots are the tenants' */
    return pdgw_quota_req_enter(wf) && controller_enter(wf);
}

bool pdgw_admit_req_on_wake(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    switch (pdgw_quota_req_on_wake(wf)) {
    case 0:
        return true; /* still waiting for the tenant's share */
    case 1:
        if (controller_enter(wf))
            r->job->start(wf);
        return true;
    default:
        break;
    }
    if (!wf->admit_waiting)
        return false;
    if (pdgw_admit_ticket_state(wf->w->srv->opts.admit, &wf->admit) != PDGW_TICKET_HELD)
        return true; /* not granted (yet): a stale wake */
    wf->admit_waiting = false;
    pdgw_worker_active_remove(wf->w, r);
    wf->stage = PDGW_WF_NONE;
    r->job->start(wf);
    return true;
}

bool pdgw_admit_req_check(pdgw_wf_t *wf, uint64_t now)
{
    pdgw_req_t *r = wf->req;
    pdgw_admit_t *a = wf->w->srv->opts.admit;
    if (pdgw_quota_req_check(wf, now))
        return true;
    if (!wf->admit_waiting)
        return false;
    if (a != NULL && pdgw_admit_expire(a, &wf->admit, now)) {
        wf->admit_waiting = false;
        wf->stage = PDGW_WF_FINISHED;
        pdgw_worker_active_remove(wf->w, r);
        pdgw_log_debug("admit", "req=%s waited %llu ms for admission: 429", r->id,
                       (unsigned long long)(now - wf->admit.t_queued_ms));
        refuse(r, 1000, "queue_timeout",
               "Too many requests: timed out waiting for admission; retry later.");
    }
    return true;
}

void pdgw_admit_req_done(pdgw_wf_t *wf)
{
    pdgw_admit_t *a = wf->w->srv->opts.admit;
    pdgw_quota_req_done(wf);
    if (a == NULL)
        return;
    wf->admit_waiting = false;
    (void)pdgw_admit_leave(a, &wf->admit, pdgw_now_ms());
}

/* ---------------------------------------------------------------- retry backoff */

static uint64_t rng_next(void)
{
    static _Thread_local uint64_t s;
    if (s == 0 && (pdgw_random_bytes(&s, sizeof(s)) != PDGW_OK || s == 0))
        s = pdgw_time_mono_ns() | 1;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
}

uint64_t pdgw_retry_backoff_ms(uint64_t base_ms, uint64_t max_ms, unsigned attempt,
                               uint64_t retry_after_ms, uint64_t rnd)
{
    uint64_t d = base_ms;
    unsigned i;
    for (i = 0; i < attempt && d < max_ms; i++)
        d *= 2;
    if (d > max_ms)
        d = max_ms;
    /* "Equal jitter": half fixed, half random, so retries of many clients spread out but
     * none comes back sooner than half the backoff. */
    if (d > 1)
        d = d / 2 + rnd % (d / 2 + 1);
    /* The engine said when to come back: never sooner. */
    if (retry_after_ms > d)
        d = retry_after_ms;
    return d;
}

bool pdgw_admit_retry_delay(pdgw_wf_t *wf, const pdgw_leg_t *failed_leg, uint64_t *delay_ms)
{
    pdgw_req_t *r = wf->req;
    pdgw_admit_limits_t l;
    uint64_t now = pdgw_now_ms(), d;
    *delay_ms = 0;
    if (failed_leg == NULL || failed_leg->err != PDGW_LEGERR_STATUS ||
        (failed_leg->status != 429 && failed_leg->status != 503))
        return true;
    if (wf->w->srv->opts.admit != NULL) {
        pdgw_admit_get_path_limits(wf->w->srv->opts.admit, &l);
    } else {
        pdgw_admit_limits_init(&l);
    }
    d = pdgw_retry_backoff_ms(l.retry_backoff_base_ms, l.retry_backoff_max_ms, wf->attempt,
                              failed_leg->retry_after_ms, rng_next());
    if (now + d >= r->deadline_ms)
        return false;
    *delay_ms = d;
    return true;
}

/* Routes a client must show a key for (when keys are configured): everything upstream, the
 * unknown, and /metrics with metrics_need_key. The admin API has a rule of its own. */
static bool route_needs_key(const pdgw_req_t *r)
{
    return r->route == PDGW_ROUTE_INFER || r->route == PDGW_ROUTE_MODELS ||
           r->route == PDGW_ROUTE_NONE || r->route == PDGW_ROUTE_PASSTHROUGH ||
           (r->route == PDGW_ROUTE_METRICS && r->w->srv->opts.metrics_need_key);
}

bool pdgw_auth_access(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    pdgw_auth_result_t ar;
    if (r->route == PDGW_ROUTE_ADMIN || !route_needs_key(r))
        return true;
    ar = pdgw_auth_check(srv->opts.auth, pdgw_req_header(r, MHD_HTTP_HEADER_AUTHORIZATION));
    if (!pdgw_auth_allowed(ar)) {
        pdgw_api_error_t e;
        pdgw_auth_result_to_error(ar, &e);
        pdgw_gateway_metrics_rejected(srv->opts.metrics, "auth");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    r->own_authorization = pdgw_auth_key_count(srv->opts.auth) > 0;
    return true;
}
