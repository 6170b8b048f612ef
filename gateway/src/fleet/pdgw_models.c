/*
 * pdgw_models.c - models across the fleet: the 404 for a model no instance serves, the
 * union on GET /v1/models, and the metrics a user filters by model.
 *
 * Which instance serves which model is the scheduler's knowledge (configured `models:` or
 * learnt from each engine's /v1/models, sched_models.c); every pick is filtered by the
 * request's model there, so this file only answers what the pool cannot route at all.
 */
#include "pdgw_server_int.h"
#include "pdgw_wf.h"
#include "pdgw_fleet.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_slo.h"

bool pdgw_models_admit(pdgw_req_t *r, const char *model)
{
    pdgw_api_error_t e;
    size_t len = 0;
    char *body;

    if (model == NULL || model[0] == '\0' || sched_pool_has_model(r->w->srv->opts.pool, model))
        return true;
    pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "model_not_found");
    /* vLLM's words (vllm/entrypoints/openai/serving_models.py, _check_model in
     * serving_engine.py); OpenAI's code for the same case is "model_not_found". */
    pdgw_api_error_set(&e, PDGW_API_ERR_NOT_FOUND, "model", "The model `%s` does not exist.",
                       model);
    pdgw_api_error_set_code(&e, "model_not_found");
    pdgw_req_error_set(r, "model not served: %.200s", model);
    body = pdgw_api_error_body(&e, &len);
    pdgw_req_reply(r, 404, body, body ? len : 0, "application/json");
    return false;
}

/* One OpenAI list entry per model: a name learnt from an engine as the engine listed it (its
 * own fields, e.g. vLLM's root and max_model_len, kept), a configured one with the fields
 * every OpenAI client reads. */
static bool list_entry(const sched_model_info_t *m, void *arg)
{
    json_t *data = arg;
    json_t *e = m->entry ? json_loads(m->entry, 0, NULL) : NULL;

    if (e == NULL)
        e = json_pack("{s:s,s:s,s:I,s:s}", "id", m->name, "object", "model", "created",
                      (json_int_t)m->created, "owned_by", m->owned_by ? m->owned_by : "pdgw");
    return e != NULL && json_array_append_new(data, e) == 0;
}

bool pdgw_models_serve_list(pdgw_req_t *r)
{
    bool all_known = false;
    json_t *data = json_array();
    json_t *out;
    char *text;

    if (data == NULL ||
        sched_pool_models_each(r->w->srv->opts.pool, list_entry, data, &all_known) != SCHED_OK ||
        !all_known || json_array_size(data) == 0) {
        json_decref(data);
        return false;
    }
    out = json_pack("{s:s,s:o}", "object", "list", "data", data);
    text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if (text == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return true;
    }
    /* json_dumps allocates with malloc, which pdgw_free releases too */
    pdgw_req_reply(r, 200, text, strlen(text), "application/json");
    return true;
}

/* ---------------------------------------------------------------- metrics */

typedef struct pdgw_model_families model_families_t;

static pthread_mutex_t families_mu = PTHREAD_MUTEX_INITIALIZER;

/* Find or register one family of <reg> (under families_mu). */
static pdgw_metric_family_t *family(pdgw_metrics_t *reg, pdgw_metric_type_t type, const char *name,
                                    const char *help, const char *const *labels, size_t n_labels,
                                    const double *buckets, size_t n_buckets)
{
    pdgw_metric_family_t *f = pdgw_metrics_family_find(reg, name);
    if (f == NULL && pdgw_metrics_family_add(reg, type, name, help, labels, n_labels, buckets,
                                             n_buckets, &f) != PDGW_OK)
        return NULL;
    return f;
}

/* Fill <mf> once (a worker keeps it: the registry outlives the server). */
static bool families(pdgw_metrics_t *reg, model_families_t *mf)
{
    static const char *const l_code[] = {"model", "code"};
    static const char *const l_model[] = {"model"};
    static const char *const l_kind[] = {"model", "kind"};
    static const char *const l_result[] = {"model", "result"};

    if (mf->requests != NULL && mf->duration != NULL && mf->ttft != NULL && mf->tokens != NULL &&
        mf->slo != NULL)
        return true;
    pthread_mutex_lock(&families_mu);
    mf->requests = family(reg, PDGW_METRIC_COUNTER, "pdgw_model_requests_total",
                          "Requests by the model they named and HTTP status.", l_code, 2, NULL, 0);
    mf->duration = family(reg, PDGW_METRIC_HISTOGRAM, "pdgw_model_request_duration_seconds",
                          "Whole request duration by model.", l_model, 1,
                          pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n);
    mf->ttft = family(reg, PDGW_METRIC_HISTOGRAM, "pdgw_model_time_to_first_token_seconds",
                      "Time to the first relayed token by model.", l_model, 1,
                      pdgw_metrics_ttft_buckets, pdgw_metrics_ttft_buckets_n);
    mf->tokens = family(reg, PDGW_METRIC_COUNTER, "pdgw_model_tokens_total",
                        "Tokens the engines reported (usage) by model; kind prompt or completion.",
                        l_kind, 2, NULL, 0);
    mf->slo = family(reg, PDGW_METRIC_COUNTER, "pdgw_model_slo_requests_total",
                     "Successful requests with a latency target by model and attainment: met, "
                     "missed_ttft, missed_tpot, missed_both.",
                     l_result, 2, NULL, 0);
    pthread_mutex_unlock(&families_mu);
    return mf->requests != NULL;
}

/* <model> as a label value at an address that stays the same while requests name the same
 * model, with the series found for it so far: most workers serve one model, and each request
 * brings its model name in a body of its own. A model too long for the copy is looked up
 * each time (NULL). */
static const char *steady_label(model_families_t *mf, const char *model)
{
    size_t len;
    if (strcmp(model, mf->last_model) == 0)
        return mf->last_model;
    mf->ok = mf->duration_of = mf->ttft_of = mf->prompt_tokens = mf->completion_tokens = NULL;
    len = strlen(model);
    if (len >= sizeof(mf->last_model)) {
        mf->last_model[0] = '\0';
        return NULL;
    }
    memcpy(mf->last_model, model, len + 1);
    return mf->last_model;
}

/* The series of <fam> for (<model>, <v2>) (<v2> NULL: a family of the model alone), from
 * <slot> when the model is the steady one (<steady>) and it was looked up before (<slot> is
 * not used otherwise). */
static pdgw_metric_t *model_series(pdgw_metric_t **slot, bool steady, pdgw_metric_family_t *fam,
                                   const char *model, const char *v2)
{
    if (steady && *slot != NULL)
        return *slot;
    pdgw_metric_t *m = v2 != NULL ? pdgw_metric_family_series2(fam, model, v2)
                                  : pdgw_metric_family_series1(fam, model);
    if (steady)
        *slot = m;
    return m;
}

void pdgw_models_request_done(pdgw_req_t *r, const char *model, int status, double dur_s)
{
    pdgw_metrics_t *reg = r->w->srv->opts.metrics ? r->w->srv->opts.metrics->reg : NULL;
    const pdgw_wf_t *wf = r->wf; /* what the workflow measured, NULL = none */
    model_families_t *mf = &r->w->model_families;
    char code[PDGW_STATUS_LABEL_SIZE];
    const char *steady;

    /* A model nobody serves was answered 404 and has no series: clients cannot grow the
     * label set with names of their own. */
    if (reg == NULL || model == NULL || model[0] == '\0' ||
        strncmp(pdgw_req_error(r), "model not served: ", 18) == 0 || !families(reg, mf))
        return;
    steady = steady_label(mf, model);
    if (steady != NULL)
        model = steady;
    pdgw_counter_inc(status == 200
                         ? model_series(&mf->ok, steady != NULL, mf->requests, model, "200")
                         : model_series(NULL, false, mf->requests, model,
                                        pdgw_metric_status_label(status, code)));
    pdgw_histogram_observe(
        model_series(&mf->duration_of, steady != NULL, mf->duration, model, NULL), dur_s);
    if (wf == NULL)
        return;
    {
        const char *slo = pdgw_slo_result(wf, r, status);
        if (slo != NULL && mf->slo != NULL)
            pdgw_counter_inc(pdgw_metric_family_series2(mf->slo, model, slo));
    }
    if (wf->t_first_token_ns > r->t_start_ns)
        pdgw_histogram_observe(model_series(&mf->ttft_of, steady != NULL, mf->ttft, model, NULL),
                               (double)(wf->t_first_token_ns - r->t_start_ns) / 1e9);
    if (wf->usage_seen) {
        if (wf->usage_prompt > 0)
            pdgw_counter_add(
                model_series(&mf->prompt_tokens, steady != NULL, mf->tokens, model, "prompt"),
                (uint64_t)wf->usage_prompt);
        if (wf->usage_completion > 0)
            pdgw_counter_add(model_series(&mf->completion_tokens, steady != NULL, mf->tokens, model,
                                          "completion"),
                             (uint64_t)wf->usage_completion);
    }
}

bool pdgw_models_body(pdgw_req_t *r)
{
    return pdgw_models_admit(r, r->info.model);
}

void pdgw_models_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected, uint64_t now_ns)
{
    const pdgw_wf_t *wf = r->wf;
    (void)disconnected;
    (void)now_ns;
    pdgw_models_request_done(r,
                             wf != NULL && wf->pt ? wf->pt_model
                             : r->info_valid      ? r->info.model
                                                  : NULL,
                             status, dur_s);
}
