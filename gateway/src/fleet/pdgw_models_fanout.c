/*
 * pdgw_models_fanout.c - GET /v1/models: the configured model names, or (none configured) the union
 * of what every usable instance lists, asked all at once (up to 16) on legs of the request.
 */

#include "pdgw_server_int.h"
#include "pdgw_wf.h"
#include "pdgw_fleet.h"

#include <string.h>

#include "pdgw_alloc.h"

#define MODELS_MAX_INSTANCES 16
#define MODELS_TIMEOUT_MS    5000

void pdgw_models_serve_local(pdgw_req_t *r)
{
    const pdgw_server_opts_t *o = &r->w->srv->opts;
    json_t *data = json_array();
    size_t i;
    for (i = 0; i < o->n_models; i++)
        json_array_append_new(data,
                              json_pack("{s:s,s:s,s:I,s:s}", "id", o->models[i], "object", "model",
                                        "created", (json_int_t)0, "owned_by", "pdgw"));
    pdgw_req_reply_json(r, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

#define MODELS_MAX_INSTANCES 16
#define MODELS_TIMEOUT_MS    5000

static void wf_models_reply(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    json_t *data = json_array();
    json_t *seen = json_object();
    size_t i, ok = 0;
    for (i = 0; i < wf->n_mlegs; i++) {
        pdgw_leg_t *leg = &wf->mlegs[i];
        json_t *resp, *arr, *m;
        size_t j;
        if (leg->err != PDGW_LEGERR_NONE || leg->status != 200)
            continue;
        resp = json_loadb(leg->resp.data ? leg->resp.data : "", leg->resp.len, 0, NULL);
        arr = json_object_get(resp, "data");
        if (json_is_array(arr)) {
            ok++;
            json_array_foreach(arr, j, m)
            {
                const char *id = json_string_value(json_object_get(m, "id"));
                if (id == NULL || json_object_get(seen, id))
                    continue;
                json_object_set_new(seen, id, json_true());
                json_array_append(data, m);
            }
        }
        json_decref(resp);
    }
    json_decref(seen);
    pdgw_wf_set_finished(wf);
    if (ok == 0) {
        json_decref(data);
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_GATEWAY, "upstream_error",
                              "no instance answered GET /v1/models");
        return;
    }
    {
        json_t *out = json_pack("{s:s,s:o}", "object", "list", "data", data);
        char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
        json_decref(out);
        if (text == NULL) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
            return;
        }
        pdgw_req_reply(r, 200, text, strlen(text), "application/json");
    }
}

void pdgw_models_leg_done(pdgw_wf_t *wf)
{
    if (++wf->n_mdone == wf->n_mlegs && wf->stage != PDGW_WF_FINISHED)
        wf_models_reply(wf);
}

static char *wf_models_keep(pdgw_wf_t *wf, size_t slot, const char *s)
{
    char *c = pdgw_strdup(s ? s : "");
    size_t n = c ? strlen(c) : 0;
    while (n > 0 && c[n - 1] == '/')
        c[--n] = '\0'; /* base URL without a trailing slash */
    wf->mstr[slot] = c;
    return c;
}

static void models_on_leg_done(pdgw_leg_t *leg)
{
    pdgw_models_leg_done(leg->wf);
}

static const pdgw_leg_owner_t models_leg_owner = {.on_done = models_on_leg_done,
                                                  .moved = pdgw_wf_leg_moved};

void pdgw_models_start(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    pdgw_server_t *srv = wf->w->srv;
    sched_instance_t **usable = NULL;
    size_t i, n = 0, n_usable = 0;

    wf->passthrough = true;
    wf->stage = PDGW_WF_DECODE;
    pdgw_worker_active_add(wf->w, r);
    wf->mlegs = pdgw_calloc(MODELS_MAX_INSTANCES, sizeof(*wf->mlegs));
    wf->minst = pdgw_calloc(MODELS_MAX_INSTANCES, sizeof(*wf->minst));
    wf->mstr = pdgw_calloc(2 * MODELS_MAX_INSTANCES, sizeof(*wf->mstr));
    if (wf->mlegs == NULL || wf->minst == NULL || wf->mstr == NULL ||
        sched_pool_usable(srv->opts.pool, &usable, &n_usable) != SCHED_OK) {
        pdgw_wf_set_finished(wf);
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    /* The instances that could take a request now (up, not draining, breaker not open). */
    for (i = 0; i < n_usable && n < MODELS_MAX_INSTANCES; i++) {
        pdgw_instance_t *v = &wf->minst[n];
        v->id = wf_models_keep(wf, 2 * n, sched_instance_id(usable[i]));
        v->url = wf_models_keep(wf, 2 * n + 1, sched_instance_url(usable[i]));
        if (v->id == NULL || v->url == NULL)
            break;
        pdgw_leg_init(&wf->mlegs[n], &wf->origin, wf, PDGW_LEG_DECODE, &models_leg_owner);
        n++;
    }
    sched_pool_release_usable(usable, n_usable);
    if (n == 0) {
        pdgw_wf_set_finished(wf);
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, "no_instance",
                              "no usable instance to list models from");
        return;
    }
    wf->n_mlegs = n;
    for (i = 0; i < n; i++) {
        if (pdgw_leg_start(&wf->mlegs[i], &wf->minst[i], "/v1/models", "GET", NULL, 0, NULL) !=
            PDGW_OK) {
            wf->mlegs[i].err = PDGW_LEGERR_PROTOCOL;
            wf->mlegs[i].state = PDGW_LEG_DONE;
            pdgw_models_leg_done(wf);
        }
    }
}

void pdgw_models_release(pdgw_wf_t *wf)
{
    size_t i;
    for (i = 0; i < wf->n_mlegs; i++)
        pdgw_leg_release(&wf->mlegs[i]);
    if (wf->mstr)
        for (i = 0; i < 2 * MODELS_MAX_INSTANCES; i++)
            pdgw_free(wf->mstr[i]);
    pdgw_free(wf->mstr);
    pdgw_free(wf->minst);
    pdgw_free(wf->mlegs);
    wf->mstr = NULL;
    wf->minst = NULL;
    wf->mlegs = NULL;
    wf->n_mlegs = 0;
}

void pdgw_models_check_deadlines(pdgw_wf_t *wf, uint64_t now)
{
    size_t i;
    for (i = 0; i < wf->n_mlegs; i++) {
        pdgw_leg_t *leg = &wf->mlegs[i];
        if (leg->state == PDGW_LEG_RUNNING && now >= leg->t_start_ms + MODELS_TIMEOUT_MS) {
            pdgw_leg_abort(leg);
            leg->err = PDGW_LEGERR_TIMEOUT;
            pdgw_models_leg_done(wf);
        }
    }
}

uint64_t pdgw_models_next_deadline(const pdgw_wf_t *wf)
{
    uint64_t due = UINT64_MAX;
    size_t i;
    for (i = 0; i < wf->n_mlegs; i++)
        if (wf->mlegs[i].state == PDGW_LEG_RUNNING &&
            wf->mlegs[i].t_start_ms + MODELS_TIMEOUT_MS < due)
            due = wf->mlegs[i].t_start_ms + MODELS_TIMEOUT_MS;
    return due;
}

/* GET /v1/models from what pdgw knows; false = the engines must be asked (the job). */
static bool models_local(pdgw_req_t *r)
{
    if (r->w->srv->opts.n_models > 0) {
        pdgw_models_serve_local(r);
        return true;
    }
    return pdgw_models_serve_list(r);
}

/* Admission's wait as any job's; the fan-out's legs have deadlines of their own. */
static uint64_t models_next_deadline(const pdgw_wf_t *wf)
{
    if (wf->stage != PDGW_WF_WAIT && wf->stage != PDGW_WF_FINISHED && wf->n_mlegs)
        return pdgw_models_next_deadline(wf);
    return pdgw_wf_next_deadline(wf);
}

static void models_check_deadlines(pdgw_wf_t *wf, uint64_t now_ms)
{
    if (wf->stage != PDGW_WF_FINISHED && wf->n_mlegs)
        pdgw_models_check_deadlines(wf, now_ms);
    else
        pdgw_wf_check_deadlines(wf, now_ms);
}

static void models_job_release(pdgw_wf_t *wf)
{
    pdgw_models_release(wf);
    pdgw_wf_release(wf);
}

const pdgw_job_ops_t pdgw_models_job = {
    .name = "models fan-out",
    .start = pdgw_models_start,
    .wake = pdgw_wf_on_wake,
    .next_deadline = models_next_deadline,
    .check_deadlines = models_check_deadlines,
    .running = pdgw_wf_running,
    .stop = pdgw_wf_stop,
    .release = models_job_release,
};

const pdgw_route_ops_t pdgw_models_route = {
    .local = models_local,
    .job = &pdgw_models_job,
    .job_create = pdgw_wf_create,
};
