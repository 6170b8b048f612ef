/*
 * pdgw_slo.c - a request's latency targets and early refusal (pdgw_slo.h).
 *
 * The headers are llm-d's, milliseconds: x-llm-d-slo-ttft-ms and x-llm-d-slo-tpot-ms, or
 * their older names x-slo-ttft-ms and x-slo-tpot-ms, which llm-d still reads after the
 * current ones (the current name wins when both are sent). A refusal is
 * decided on the scheduler's predictions (sched_slo_estimate: the best mean over the usable
 * instances, learnt from pdgw's own leg timings) and never while the models are cold: a
 * prior is no evidence that nobody can serve a request.
 */
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_admit_req.h"
#include "pdgw_alloc.h"

#include "pdgw_slo.h"

#define TTFT_HEADER     "x-llm-d-slo-ttft-ms"
#define TTFT_HEADER_OLD "x-slo-ttft-ms"
#define TPOT_HEADER     "x-llm-d-slo-tpot-ms"
#define TPOT_HEADER_OLD "x-slo-tpot-ms"
/* Largest targets taken: an hour to the first token, a minute per token. */
#define TTFT_MAX_MS 3600000u
#define TPOT_MAX_MS 60000u

typedef struct slo_model {
    char *name;
    pdgw_slo_target_t t;
} slo_model_t;

struct pdgw_slo_config {
    pdgw_slo_target_t global;
    slo_model_t *models;
    size_t n_models;
    slo_model_t *keys; /* per API key, sorted by key (bsearch) */
    size_t n_keys;
    bool reject;
    unsigned margin_percent;
};

static pdgw_status_t ms_of(const char *text, uint32_t max, uint32_t *out)
{
    uint64_t ms;
    if (pdgw_duration_parse(text, &ms) != PDGW_OK || ms > max)
        return PDGW_ERR_INVALID;
    *out = (uint32_t)ms;
    return PDGW_OK;
}

pdgw_status_t pdgw_slo_parse_target(const char *text, pdgw_slo_target_t *out)
{
    char buf[64];
    const char *colon = strchr(text, ':');
    pdgw_slo_target_t t = {0, 0};
    size_t n = colon ? (size_t)(colon - text) : strlen(text);

    if (n == 0 || n >= sizeof(buf))
        return PDGW_ERR_INVALID;
    memcpy(buf, text, n);
    buf[n] = '\0';
    if (ms_of(buf, TTFT_MAX_MS, &t.ttft_ms) != PDGW_OK ||
        (colon != NULL && ms_of(colon + 1, TPOT_MAX_MS, &t.tpot_ms) != PDGW_OK))
        return PDGW_ERR_INVALID;
    *out = t;
    return PDGW_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const slo_model_t *)a)->name, ((const slo_model_t *)b)->name);
}

pdgw_status_t pdgw_slo_config_create(const pdgw_config_t *cfg, pdgw_slo_config_t **out, char *err,
                                     size_t errlen)
{
    pdgw_slo_config_t *c;

    *out = NULL;
    if (cfg->slo_ttft_ms == 0 && cfg->slo_tpot_ms == 0 && cfg->slo_models.count == 0 &&
        cfg->slo_keys.count == 0 && cfg->slo_policy == PDGW_SLO_BEST_EFFORT)
        return PDGW_OK;
    c = pdgw_calloc(1, sizeof(*c));
    if (c == NULL ||
        (cfg->slo_models.count > 0 &&
         (c->models = pdgw_calloc(cfg->slo_models.count, sizeof(*c->models))) == NULL) ||
        (cfg->slo_keys.count > 0 &&
         (c->keys = pdgw_calloc(cfg->slo_keys.count, sizeof(*c->keys))) == NULL)) {
        pdgw_slo_config_destroy(c);
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    c->global.ttft_ms = (uint32_t)(cfg->slo_ttft_ms < TTFT_MAX_MS ? cfg->slo_ttft_ms : TTFT_MAX_MS);
    c->global.tpot_ms = (uint32_t)(cfg->slo_tpot_ms < TPOT_MAX_MS ? cfg->slo_tpot_ms : TPOT_MAX_MS);
    c->reject = cfg->slo_policy == PDGW_SLO_REJECT;
    c->margin_percent = (unsigned)cfg->slo_reject_margin_percent;
    for (size_t i = 0; i < cfg->slo_models.count; i++) {
        const pdgw_kv_t *kv = &cfg->slo_models.items[i];
        slo_model_t *m = &c->models[c->n_models];
        if (pdgw_slo_parse_target(kv->value, &m->t) != PDGW_OK) {
            snprintf(err, errlen, "slo_models: %s: expected TTFT[:TPOT] durations, got \"%s\"",
                     kv->key, kv->value);
            pdgw_slo_config_destroy(c);
            return PDGW_ERR_INVALID;
        }
        if ((m->name = pdgw_strdup(kv->key)) == NULL) {
            pdgw_slo_config_destroy(c);
            snprintf(err, errlen, "out of memory");
            return PDGW_ERR_NOMEM;
        }
        c->n_models++;
    }
    for (size_t i = 0; i < cfg->slo_keys.count; i++) {
        const pdgw_kv_t *kv = &cfg->slo_keys.items[i];
        slo_model_t *k = &c->keys[c->n_keys];
        if (pdgw_slo_parse_target(kv->value, &k->t) != PDGW_OK) {
            snprintf(err, errlen, "slo_keys: entry %zu: expected TTFT[:TPOT] durations, got \"%s\"",
                     i + 1, kv->value);
            pdgw_slo_config_destroy(c);
            return PDGW_ERR_INVALID;
        }
        if ((k->name = pdgw_strdup(kv->key)) == NULL) {
            pdgw_slo_config_destroy(c);
            snprintf(err, errlen, "out of memory");
            return PDGW_ERR_NOMEM;
        }
        c->n_keys++;
    }
    if (c->n_keys > 1)
        qsort(c->keys, c->n_keys, sizeof(*c->keys), by_name);
    if (c->reject && c->global.ttft_ms == 0 && c->global.tpot_ms == 0 && c->n_models == 0 &&
        c->n_keys == 0)
        pdgw_log_warn("slo", "slo_policy: reject without slo_ttft, slo_tpot or slo_models: only "
                             "requests that send x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms (or "
                             "x-slo-ttft-ms / x-slo-tpot-ms) can be refused");
    *out = c;
    return PDGW_OK;
}

void pdgw_slo_config_destroy(pdgw_slo_config_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_models; i++)
        pdgw_free(c->models[i].name);
    for (size_t i = 0; i < c->n_keys; i++)
        pdgw_free(c->keys[i].name);
    pdgw_free(c->models);
    pdgw_free(c->keys);
    pdgw_free(c);
}

/* A header's milliseconds, under its current <name> or else its older one (*name is set to
 * the one read): absent (true, *out untouched), valid (true), else false. 0 is valid and
 * means no target (llm-d treats a missing SLO as 0). */
static bool header_ms(pdgw_req_t *r, const char **name, const char *old, uint32_t max,
                      uint32_t *out)
{
    const char *h = pdgw_req_header(r, *name);
    char *end;
    unsigned long long v;

    if (h == NULL && (h = pdgw_req_header(r, old)) != NULL)
        *name = old;
    if (h == NULL)
        return true;
    while (*h == ' ' || *h == '\t')
        h++;
    if (*h < '0' || *h > '9')
        return false; /* no sign, no blank value */
    errno = 0;
    v = strtoull(h, &end, 10);
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end != '\0' || errno == ERANGE || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

static void bad_header(pdgw_req_t *r, const char *name, uint32_t max)
{
    pdgw_api_error_t e;
    pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "invalid");
    pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, NULL,
                       "header %s must be a whole number of milliseconds, 0..%u (0 = none)", name,
                       max);
    pdgw_api_error_set_code(&e, "invalid_slo_header");
    pdgw_req_reply_error(r, &e);
}

/* The targets slo_keys gives <key> (<len> bytes, not terminated); NULL when none. */
static const pdgw_slo_target_t *key_default(const pdgw_slo_config_t *c, const char *key, size_t len)
{
    size_t lo = 0, hi = c->n_keys;
    while (key != NULL && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *name = c->keys[mid].name;
        int d = strncmp(name, key, len);
        if (d == 0 && name[len] != '\0')
            d = 1; /* longer than the key: after it */
        if (d == 0)
            return &c->keys[mid].t;
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* A request's targets without headers: its API key's (slo_keys), else its model's
 * (slo_models), else the global ones. */
static pdgw_slo_target_t defaults_of(const pdgw_slo_config_t *c, pdgw_req_t *r, const char *model)
{
    pdgw_slo_target_t none = {0, 0};
    const pdgw_slo_target_t *k;
    size_t len = 0;
    const char *key;
    if (c == NULL)
        return none;
    if (c->n_keys > 0 && (key = pdgw_req_bearer(r, &len)) != NULL &&
        (k = key_default(c, key, len)) != NULL)
        return *k;
    for (size_t i = 0; model != NULL && i < c->n_models; i++) {
        if (strcmp(c->models[i].name, model) == 0)
            return c->models[i].t;
    }
    return c->global;
}

/* 429 slo_unattainable: the fleet's best predicted <what> misses the target by more than the
 * margin. Retry-After: the predicted excess, at least 1 s (the queue has to drain by that). */
static void refuse(pdgw_req_t *r, const char *what, double best_s, uint32_t target_ms)
{
    pdgw_api_error_t e;
    double excess = best_s - target_ms / 1000.0;
    unsigned s = (unsigned)ceil(excess > 1.0 ? excess : 1.0);
    r->reply_retry_after_s = s > 60 ? 60 : s;
    pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "slo_unattainable");
    pdgw_api_error_set(&e, PDGW_API_ERR_RATE_LIMITED, NULL,
                       "no instance is predicted to meet the request's %s target of %u ms (best "
                       "%.0f ms); retry later or relax the target",
                       what, target_ms, best_s * 1000.0);
    pdgw_api_error_set_code(&e, "slo_unattainable");
    pdgw_req_reply_error(r, &e);
}

bool pdgw_slo_req_enter(pdgw_wf_t *wf)
{
    pdgw_req_t *r = wf->req;
    const pdgw_slo_config_t *c = wf->w->srv->opts.slo;
    const char *model = r->info_valid ? r->info.model : NULL;
    pdgw_slo_target_t t = defaults_of(c, r, model);
    sched_request_t sr;
    sched_slo_estimate_t est;
    pdgw_api_error_t perr;
    int64_t prio = 0;
    double margin;

    const char *ttft_name = TTFT_HEADER, *tpot_name = TPOT_HEADER;

    if (!header_ms(r, &ttft_name, TTFT_HEADER_OLD, TTFT_MAX_MS, &t.ttft_ms)) {
        bad_header(r, ttft_name, TTFT_MAX_MS);
        return false;
    }
    if (!header_ms(r, &tpot_name, TPOT_HEADER_OLD, TPOT_MAX_MS, &t.tpot_ms)) {
        bad_header(r, tpot_name, TPOT_MAX_MS);
        return false;
    }
    wf->slo_ttft_ms = t.ttft_ms;
    wf->slo_tpot_ms = t.tpot_ms;
    if (c == NULL || !c->reject || (t.ttft_ms == 0 && t.tpot_ms == 0))
        return true;
    memset(&sr, 0, sizeof(sr));
    sr.model = model;
    if (r->info_valid) {
        sr.prompt_tokens = r->info.est_prompt_tokens > 0 && r->info.est_prompt_tokens < UINT32_MAX
                               ? (uint32_t)r->info.est_prompt_tokens
                               : 0;
        sr.max_tokens = r->info.max_tokens > 0 && r->info.max_tokens < UINT32_MAX
                            ? (uint32_t)r->info.max_tokens
                            : 0;
        sr.text = r->info.prompt_text;
        sr.text_len = r->info.prompt_text_len;
        if (r->info.prompt_tokens && r->info.n_prompt_tokens) { /* what each prefill has cached */
            sr.tokens = (const uint32_t *)r->info.prompt_tokens;
            sr.n_tokens = r->info.n_prompt_tokens;
            sr.cache_salt = json_string_value(pdgw_req_json_member(r, "cache_salt"));
        }
    }
    if (sched_slo_estimate(wf->w->srv->opts.pool, &sr, &est) != SCHED_OK || est.cold)
        return true; /* no instance (answered later as usual) or nothing learnt yet */
    /* Sheddable (priority above 0, served after the rest): refused on any predicted miss,
     * so that under load the less important requests go first and the others keep their
     * margin. An invalid priority is admission's to answer. */
    margin = pdgw_req_priority(r, &prio, &perr) && prio > 0 ? 1.0 : 1.0 + c->margin_percent / 100.0;
    if (t.ttft_ms > 0 && est.ttft_s * 1000.0 > t.ttft_ms * margin) {
        refuse(r, "time-to-first-token", est.ttft_s, t.ttft_ms);
        return false;
    }
    if (t.tpot_ms > 0 && est.tpot_s > 0.0 && est.tpot_s * 1000.0 > t.tpot_ms * margin) {
        refuse(r, "time-per-output-token", est.tpot_s, t.tpot_ms);
        return false;
    }
    return true;
}

const char *pdgw_slo_result(const pdgw_wf_t *wf, const pdgw_req_t *r, int status)
{
    bool ttft_miss = false, tpot_miss = false;

    if (wf == NULL || status != 200 || (wf->slo_ttft_ms == 0 && wf->slo_tpot_ms == 0))
        return NULL;
    if (wf->slo_ttft_ms > 0) {
        /* A whole (non-stream) answer has no first-token time: the end of its answering leg
         * bounds it (the same for every caller: no clock read here). */
        const pdgw_leg_t *leg = &wf->legs[PDGW_LEG_DECODE];
        uint64_t first_ms = wf->t_first_token_ns ? wf->t_first_token_ns / 1000000u : leg->t_end_ms;
        ttft_miss = first_ms < r->t_start_ms || first_ms - r->t_start_ms > wf->slo_ttft_ms;
    }
    if (wf->slo_tpot_ms > 0 && wf->n_later_events > 0 && wf->t_last_token_ns > wf->t_first_token_ns)
        tpot_miss = (wf->t_last_token_ns - wf->t_first_token_ns) / 1000000.0 / wf->n_later_events >
                    wf->slo_tpot_ms;
    return ttft_miss && tpot_miss ? "missed_both"
           : ttft_miss            ? "missed_ttft"
           : tpot_miss            ? "missed_tpot"
                                  : "met";
}
