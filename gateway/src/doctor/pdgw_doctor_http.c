/*
 * pdgw_doctor_http.c - the doctor's HTTP probes of an engine: GET /health, GET /v1/models
 * against the names the config gives, GET /metrics for the load gauges the scheduler scrapes.
 *
 * The gauge names are the scheduler's own table (pdsched/engine_metrics.h): for each gauge
 * its main name or an older fallback must be there. An engine without them is balanced by
 * pdgw's own in-flight counts only.
 */
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>
#include <pdsched/engine_metrics.h>

#include "pdgw_alloc.h"
#include "pdgw_doctor_int.h"

#define BODY_MAX (8u << 20)

typedef struct body {
    char *p;
    size_t len, max;
    bool truncated;
} body_t;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    size_t n = size * nmemb, take = n;
    char *np;
    if (b->len + take > b->max) {
        take = b->max - b->len;
        b->truncated = true;
    }
    if (take > 0) {
        np = pdgw_realloc(b->p, b->len + take + 1);
        if (np == NULL)
            return 0;
        b->p = np;
        memcpy(b->p + b->len, ptr, take);
        b->len += take;
        b->p[b->len] = '\0';
    }
    return b->truncated ? 0 : n; /* 0 ends the transfer: enough was read */
}

void doc_http_base(const char *host, int port, char *out, size_t cap)
{
    snprintf(out, cap, strchr(host, ':') != NULL ? "http://[%s]:%d" : "http://%s:%d", host, port);
}

pdgw_status_t doc_http_get(const char *url, uint64_t timeout_ms, size_t max_bytes, long *status,
                           char **body, bool *truncated, char *err, size_t errlen)
{
    CURL *h = curl_easy_init();
    body_t b = {NULL, 0, max_bytes, false};
    char ebuf[CURL_ERROR_SIZE] = "";
    CURLcode rc;

    *status = 0;
    *body = NULL;
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* engines are reached directly, as pdgw does */
    rc = curl_easy_perform(h);
    if (rc == CURLE_WRITE_ERROR && b.truncated)
        rc = CURLE_OK;
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "GET %s: %s", url, ebuf[0] ? ebuf : curl_easy_strerror(rc));
        pdgw_free(b.p);
        return rc == CURLE_OPERATION_TIMEDOUT ? PDGW_ERR_TIMEOUT : PDGW_ERR_CONNECT;
    }
    *body = b.p != NULL ? b.p : pdgw_strdup("");
    if (truncated != NULL)
        *truncated = b.truncated;
    return *body != NULL ? PDGW_OK : PDGW_ERR_NOMEM;
}

/* GET <t's url><path>: the answer, or NULL after a row saying why (as <check>, <r>). */
static char *get(doc_run_t *run, doc_target_t *t, const char *path, const char *check,
                 pdgw_doctor_result_t r, const char *fix, long *status)
{
    char url[1024], err[512];
    char *body = NULL;
    bool trunc = false;
    snprintf(url, sizeof(url), "%s%s", t->view.url, path);
    if (doc_http_get(url, run->opts->timeout_ms, BODY_MAX, status, &body, &trunc, err,
                     sizeof(err)) != PDGW_OK) {
        doc_row(run, t, check, r, fix, "%s", err);
        return NULL;
    }
    return body;
}

static void probe_health(doc_run_t *run, doc_target_t *t)
{
    long status = 0;
    char *body = get(run, t, "/health", "health", PDGW_DOCTOR_ERROR,
                     "start the engine, or fix the instance's url (host, port)", &status);
    if (body == NULL)
        return;
    t->reachable = true;
    if (status == 200)
        doc_row(run, t, "health", PDGW_DOCTOR_OK, NULL, "GET /health: 200");
    else
        doc_row(run, t, "health", PDGW_DOCTOR_ERROR,
                "look at the engine's log; pdgw takes it out of rotation until /health is 200",
                "GET /health answered %ld", status);
    pdgw_free(body);
}

static void probe_models(doc_run_t *run, doc_target_t *t)
{
    long status = 0;
    char *body = get(run, t, "/v1/models", "models", PDGW_DOCTOR_ERROR, NULL, &status);
    if (body == NULL)
        return;
    doc_models_verdict(run, t, status, body);
    pdgw_free(body);
}

void doc_models_verdict(doc_run_t *run, doc_target_t *t, long status, const char *body)
{
    json_t *root, *data, *e;
    char list[512] = "";
    size_t i, used = 0;
    bool bad = false;

    root = status == 200 ? json_loads(body, 0, NULL) : NULL;
    data = json_object_get(root, "data");
    if (!json_is_array(data)) {
        doc_row(run, t, "models", PDGW_DOCTOR_ERROR,
                "point the instance's url at the engine's OpenAI server (vLLM/SGLang serve "
                "GET /v1/models)",
                "GET /v1/models answered %ld without a model list", status);
        json_decref(root);
        return;
    }
    t->models_known = true;
    json_array_foreach(data, i, e)
    {
        const char *id = json_string_value(json_object_get(e, "id"));
        if (id == NULL || t->n_served == DOC_MAX_SERVED)
            continue;
        t->served[t->n_served] = pdgw_strdup(id);
        if (t->served[t->n_served] == NULL)
            continue;
        t->n_served++;
        if (used < sizeof(list)) {
            int n = snprintf(list + used, sizeof(list) - used, "%s%s", used ? ", " : "", id);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    for (i = 0; i < t->desc->n_models; i++) {
        size_t j;
        for (j = 0; j < t->n_served && strcmp(t->served[j], t->desc->models[i]) != 0; j++)
            ;
        if (j == t->n_served) {
            doc_row(run, t, "models", PDGW_DOCTOR_ERROR,
                    "make the instance's `models:` match the engine's --served-model-name (or "
                    "drop `models:` to learn them from the engine)",
                    "the config says the instance serves \"%s\", the engine serves: %s",
                    t->desc->models[i], t->n_served ? list : "(none)");
            bad = true;
        }
    }
    if (!bad)
        doc_row(run, t, "models", t->n_served ? PDGW_DOCTOR_OK : PDGW_DOCTOR_WARN,
                t->n_served ? NULL : "start the engine with a model", "engine serves: %s%s",
                t->n_served ? list : "(none)",
                t->desc->n_models ? " (as configured)" : " (learnt; no `models:` configured)");
    json_decref(root);
}

/* Is a sample of <name> (exact) in the exposition text? */
static bool has_sample(const char *text, const char *name, size_t nlen)
{
    const char *p = text;
    while (p != NULL && *p != '\0') {
        const char *eol = strchr(p, '\n');
        if (*p != '#' && strncmp(p, name, nlen) == 0 &&
            (p[nlen] == '{' || p[nlen] == ' ' || p[nlen] == '\t'))
            return true;
        p = eol != NULL ? eol + 1 : NULL;
    }
    return false;
}

/* Has <text> a name of <gauge> of <engine> that the scrape reads (main or fallback)? The
 * alternatives are listed in <alts>; a name found with ':' turned into '_' (some exporters
 * relabel) in <underscored>. */
static bool has_gauge(const char *text, sched_engine_kind_t engine, sched_engine_gauge_t gauge,
                      char *alts, size_t alts_cap, char *underscored, size_t cap)
{
    size_t n, i, used = 0;
    const sched_engine_metric_t *m = sched_engine_metric_names(&n);
    bool found = false;
    alts[0] = '\0';
    for (i = 0; i < n; i++) {
        char u[128];
        size_t j;
        int w;
        if (m[i].engine != engine || m[i].gauge != gauge || m[i].use == SCHED_METRIC_ADDS)
            continue;
        w = snprintf(alts + used, alts_cap - used, "%s%s", used ? "|" : "", m[i].name);
        used += w > 0 && (size_t)w < alts_cap - used ? (size_t)w : 0;
        if (has_sample(text, m[i].name, strlen(m[i].name)))
            found = true;
        snprintf(u, sizeof(u), "%s", m[i].name);
        for (j = 0; u[j] != '\0'; j++)
            u[j] = u[j] == ':' ? '_' : u[j];
        if (!found && underscored[0] == '\0' && has_sample(text, u, strlen(u)))
            snprintf(underscored, cap, "%s", u);
    }
    return found;
}

static void probe_metrics(doc_run_t *run, doc_target_t *t)
{
    long status = 0;
    char *body;

    if (run->opts->cfg->metrics_scrape_interval_ms == 0) {
        doc_row(run, t, "metrics", PDGW_DOCTOR_INFO, NULL,
                "metrics_scrape_interval is 0: engine gauges are not scraped");
        return;
    }
    body = get(run, t, "/metrics", "metrics", PDGW_DOCTOR_WARN,
               "serve Prometheus metrics on the engine's HTTP port (vLLM and SGLang do; "
               "SGLang needs --enable-metrics)",
               &status);
    if (body == NULL)
        return;
    if (status != 200)
        doc_row(run, t, "metrics", PDGW_DOCTOR_WARN,
                "start SGLang with --enable-metrics; vLLM serves /metrics by default",
                "GET /metrics answered %ld: load is pdgw's own count only", status);
    else
        doc_metrics_verdict(run, t, body);
    pdgw_free(body);
}

void doc_metrics_verdict(doc_run_t *run, doc_target_t *t, const char *body)
{
    sched_engine_kind_t kind =
        strstr(body, "sglang:") != NULL ? SCHED_ENGINE_SGLANG : SCHED_ENGINE_VLLM;
    char missing[512] = "", underscored[128] = "", alts[256];
    size_t used = 0, n_missing = 0;
    int g;

    for (g = 0; g < SCHED_GAUGE_COUNT_; g++) {
        if (!has_gauge(body, kind, (sched_engine_gauge_t)g, alts, sizeof(alts), underscored,
                       sizeof(underscored))) {
            int n = snprintf(missing + used, sizeof(missing) - used, "%s%s (%s)", used ? ", " : "",
                             sched_engine_gauge_name((sched_engine_gauge_t)g), alts);
            used += n > 0 && (size_t)n < sizeof(missing) - used ? (size_t)n : 0;
            n_missing++;
        }
    }
    if (n_missing == 0)
        doc_row(run, t, "metrics", PDGW_DOCTOR_OK, NULL, "%s load gauges present",
                sched_engine_kind_name(kind));
    else
        doc_row(run, t, "metrics",
                n_missing == SCHED_GAUGE_COUNT_ ? PDGW_DOCTOR_ERROR : PDGW_DOCTOR_WARN,
                underscored[0] ? "export the names with ':' as vLLM/SGLang do (a relabelling "
                                 "exporter in between renames them)"
                               : "run a vLLM or SGLang version that exports these gauges",
                "missing %s%s%s: load is pdgw's own count for those", missing,
                underscored[0] ? "; found " : "", underscored);
}

void doc_probe_http(doc_run_t *run, doc_target_t *t)
{
    probe_health(run, t);
    if (!t->reachable)
        return;
    probe_models(run, t);
    probe_metrics(run, t);
}
