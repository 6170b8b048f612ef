/*
 * pdgw_otel.c - OTLP/HTTP JSON trace export (see pdgw_otel.h).
 *
 * Wire format: the OTLP protobuf messages in their JSON mapping (opentelemetry-proto,
 * opentelemetry/proto/collector/trace/v1/trace_service.proto, ExportTraceServiceRequest;
 * the OTLP specification's JSON rules: trace and span ids as lowercase hex, 64-bit integers
 * as decimal strings, enums as integers). Spans are plain structs copied into a ring under
 * one mutex; the exporter thread takes up to a batch, builds the JSON and POSTs it with a
 * blocking libcurl easy handle, so no worker ever waits on the collector.
 */
#include "pdgw_otel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

#define OTEL_MAX_ATTRS          17
#define OTEL_SPAN_KIND_INTERNAL 1
#define OTEL_SPAN_KIND_SERVER   2
#define OTEL_STATUS_ERROR       2

typedef struct otel_attr {
    const char *key; /* static string */
    bool is_int;
    int64_t i;
    char s[160];
} otel_attr_t;

typedef struct otel_span {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t parent_id[8];
    bool has_parent;
    int kind;
    char name[96];
    uint64_t start_unix_ns, end_unix_ns;
    bool error;
    char status_message[160];
    int n_attrs;
    otel_attr_t attrs[OTEL_MAX_ATTRS];
} otel_span_t;

struct pdgw_otel {
    pdgw_otel_config_t cfg;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    otel_span_t *ring;  /* max_queue_spans slots */
    otel_span_t *batch; /* max_batch_spans slots, the exporter thread's */
    size_t head, count;
    bool stop;
    atomic_uint_fast64_t exported, dropped, failed;
};

/* ---------------------------------------------------------------- configuration */

static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

static bool set(const char *s)
{
    return s != NULL && s[0] != '\0';
}

pdgw_status_t pdgw_otel_config_load(const char *endpoint, const char *service_name,
                                    const char *sample_ratio, char *const *envp,
                                    pdgw_otel_config_t *cfg, char *err, size_t errlen)
{
    const char *traces = env_get(envp, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    const char *base = set(endpoint) ? endpoint : env_get(envp, "OTEL_EXPORTER_OTLP_ENDPOINT");
    const char *svc = set(service_name) ? service_name : env_get(envp, "OTEL_SERVICE_NAME");
    const char *sampler = env_get(envp, "OTEL_TRACES_SAMPLER");
    const char *arg = set(sample_ratio) ? sample_ratio : env_get(envp, "OTEL_TRACES_SAMPLER_ARG");
    const char *delay = env_get(envp, "OTEL_BSP_SCHEDULE_DELAY");
    char *end;

    memset(cfg, 0, sizeof(*cfg));
    cfg->sample_ratio = 1.0;
    cfg->parent_based = true;
    cfg->schedule_delay_ms = 5000;
    cfg->max_queue_spans = 2048;
    cfg->max_batch_spans = 512;
    snprintf(cfg->service_name, sizeof(cfg->service_name), "%s", set(svc) ? svc : "pdgw");
    /* The config key names the collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT does;
     * the traces-specific variable is the full URL and wins over the base variable only. */
    if (set(endpoint) || !set(traces)) {
        if (set(base)) {
            size_t n = strlen(base);
            snprintf(cfg->traces_url, sizeof(cfg->traces_url), "%.*s/v1/traces",
                     (int)(n > 0 && base[n - 1] == '/' ? n - 1 : n), base);
        }
    } else {
        snprintf(cfg->traces_url, sizeof(cfg->traces_url), "%s", traces);
    }
    if (cfg->traces_url[0] && strncmp(cfg->traces_url, "http://", 7) != 0 &&
        strncmp(cfg->traces_url, "https://", 8) != 0) {
        snprintf(err, errlen,
                 "tracing.otlp_endpoint: expected an http:// or https:// URL, got "
                 "\"%s\"",
                 cfg->traces_url);
        return PDGW_ERR_INVALID;
    }
    if (set(sampler)) {
        if (strcmp(sampler, "always_off") == 0 || strcmp(sampler, "parentbased_always_off") == 0)
            cfg->sample_ratio = 0;
        else if (strcmp(sampler, "always_on") == 0 || strcmp(sampler, "parentbased_always_on") == 0)
            cfg->sample_ratio = 1;
        else if (strcmp(sampler, "traceidratio") != 0 &&
                 strcmp(sampler, "parentbased_traceidratio") != 0) {
            snprintf(err, errlen, "OTEL_TRACES_SAMPLER: unsupported sampler \"%s\"", sampler);
            return PDGW_ERR_INVALID;
        }
        cfg->parent_based = strncmp(sampler, "parentbased_", 12) == 0;
    }
    if (set(arg) && (!set(sampler) || strstr(sampler, "traceidratio") != NULL)) {
        double v = strtod(arg, &end);
        if (*end != '\0' || !(v >= 0.0 && v <= 1.0)) {
            snprintf(err, errlen, "tracing.sample_ratio: expected a number in 0..1, got \"%s\"",
                     arg);
            return PDGW_ERR_INVALID;
        }
        cfg->sample_ratio = v;
    }
    if (set(delay)) {
        long v = strtol(delay, &end, 10);
        if (*end != '\0' || v < 1 || v > 600000) {
            snprintf(err, errlen, "OTEL_BSP_SCHEDULE_DELAY: expected milliseconds, got \"%s\"",
                     delay);
            return PDGW_ERR_INVALID;
        }
        cfg->schedule_delay_ms = (uint64_t)v;
    }
    return PDGW_OK;
}

/* ---------------------------------------------------------------- JSON */

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static json_t *u64_string(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    return json_string(buf);
}

static json_t *attr_json(const char *key, json_t *value)
{
    return json_pack("{s:s,s:o}", "key", key, "value", value);
}

static json_t *span_json(const otel_span_t *s)
{
    char tid[33], sid[17], pid[17];
    json_t *attrs = json_array(), *o;
    hex(s->trace_id, 16, tid);
    hex(s->span_id, 8, sid);
    for (int i = 0; i < s->n_attrs; i++) {
        const otel_attr_t *a = &s->attrs[i];
        char num[24];
        snprintf(num, sizeof(num), "%lld", (long long)a->i);
        json_array_append_new(
            attrs, attr_json(a->key, a->is_int ? json_pack("{s:s}", "intValue", num)
                                               : json_pack("{s:s}", "stringValue", a->s)));
    }
    o = json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:o}", "traceId", tid, "spanId", sid, "name", s->name,
                  "kind", s->kind, "startTimeUnixNano", u64_string(s->start_unix_ns),
                  "endTimeUnixNano", u64_string(s->end_unix_ns), "attributes", attrs);
    if (o == NULL)
        return NULL;
    if (s->has_parent) {
        hex(s->parent_id, 8, pid);
        json_object_set_new(o, "parentSpanId", json_string(pid));
    }
    if (s->error)
        json_object_set_new(
            o, "status",
            json_pack("{s:i,s:s}", "code", OTEL_STATUS_ERROR, "message", s->status_message));
    return o;
}

static char *batch_json(const pdgw_otel_t *otel, const otel_span_t *spans, size_t n)
{
    json_t *arr = json_array(), *root;
    char *text;
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, span_json(&spans[i]));
    root = json_pack("{s:[{s:{s:[{s:s,s:{s:s}}]},s:[{s:{s:s,s:s},s:o}]}]}", "resourceSpans",
                     "resource", "attributes", "key", "service.name", "value", "stringValue",
                     otel->cfg.service_name, "scopeSpans", "scope", "name", "pdgw", "version",
                     PDGW_VERSION_STRING, "spans", arr);
    if (root == NULL)
        return NULL;
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

/* ---------------------------------------------------------------- exporter thread */

static size_t discard_body(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

/* POST one batch; false when the collector did not take it. */
static bool export_batch(pdgw_otel_t *otel, CURL *easy, const otel_span_t *spans, size_t n)
{
    struct curl_slist *h = NULL;
    long code = 0;
    CURLcode rc;
    bool ok;
    char *body = batch_json(otel, spans, n);
    if (body == NULL) {
        atomic_fetch_add(&otel->failed, n);
        return false;
    }
    h = curl_slist_append(h, "Content-Type: application/json");
    curl_easy_reset(easy);
    curl_easy_setopt(easy, CURLOPT_URL, otel->cfg.traces_url);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, discard_body);
    rc = curl_easy_perform(easy);
    if (rc == CURLE_OK)
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
    ok = rc == CURLE_OK && code >= 200 && code < 300;
    if (ok) {
        atomic_fetch_add(&otel->exported, n);
    } else {
        atomic_fetch_add(&otel->failed, n);
        pdgw_log_warn("otel", "exporting %zu span(s) to %s failed: %s", n, otel->cfg.traces_url,
                      rc != CURLE_OK ? curl_easy_strerror(rc) : "HTTP error status");
    }
    curl_slist_free_all(h);
    free(body);
    return ok;
}

static void *otel_main(void *arg)
{
    pdgw_otel_t *otel = arg;
    CURL *easy = curl_easy_init();
    otel_span_t *batch = otel->batch;
    for (;;) {
        size_t n = 0;
        bool stop;
        pthread_mutex_lock(&otel->lock);
        if (!otel->stop && otel->count < otel->cfg.max_batch_spans) {
            /* Wake when a batch is full or the schedule delay passed, whichever is first. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(otel->cfg.schedule_delay_ms / 1000);
            ts.tv_nsec += (long)(otel->cfg.schedule_delay_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (!otel->stop && otel->count < otel->cfg.max_batch_spans &&
                   pthread_cond_timedwait(&otel->cond, &otel->lock, &ts) == 0)
                ;
        }
        while (n < otel->cfg.max_batch_spans && otel->count > 0) {
            batch[n++] = otel->ring[otel->head];
            otel->head = (otel->head + 1) % otel->cfg.max_queue_spans;
            otel->count--;
        }
        stop = otel->stop && otel->count == 0;
        pthread_mutex_unlock(&otel->lock);
        if (n > 0 && (easy == NULL || !export_batch(otel, easy, batch, n))) {
            if (easy == NULL)
                atomic_fetch_add(&otel->failed, n);
            pthread_mutex_lock(&otel->lock);
            if (otel->stop) {
                /* Shutting down and the collector is not answering: do not hold the drain
                 * up one timeout per remaining batch. */
                atomic_fetch_add(&otel->failed, otel->count);
                otel->count = 0;
                stop = true;
            }
            pthread_mutex_unlock(&otel->lock);
        }
        if (stop)
            break;
    }
    if (easy)
        curl_easy_cleanup(easy);
    return NULL;
}

pdgw_status_t pdgw_otel_create(const pdgw_otel_config_t *cfg, pdgw_otel_t **out, char *err,
                               size_t errlen)
{
    pdgw_otel_t *otel;
    *out = NULL;
    if (cfg->traces_url[0] == '\0')
        return PDGW_OK;
    otel = pdgw_calloc(1, sizeof(*otel));
    if (otel == NULL ||
        (otel->ring = pdgw_calloc(cfg->max_queue_spans, sizeof(otel_span_t))) == NULL ||
        (otel->batch = pdgw_calloc(cfg->max_batch_spans, sizeof(otel_span_t))) == NULL) {
        if (otel != NULL)
            pdgw_free(otel->ring);
        pdgw_free(otel);
        snprintf(err, errlen, "tracing: out of memory");
        return PDGW_ERR_NOMEM;
    }
    otel->cfg = *cfg;
    pthread_mutex_init(&otel->lock, NULL);
    pthread_cond_init(&otel->cond, NULL);
    if (pthread_create(&otel->thread, NULL, otel_main, otel) != 0) {
        pthread_cond_destroy(&otel->cond);
        pthread_mutex_destroy(&otel->lock);
        pdgw_free(otel->batch);
        pdgw_free(otel->ring);
        pdgw_free(otel);
        snprintf(err, errlen, "tracing: cannot start the exporter thread");
        return PDGW_ERR_SYSTEM;
    }
    pdgw_log_info("otel", "exporting traces to %s as %s (sample ratio %g%s)", cfg->traces_url,
                  cfg->service_name, cfg->sample_ratio, cfg->parent_based ? ", parent-based" : "");
    *out = otel;
    return PDGW_OK;
}

void pdgw_otel_destroy(pdgw_otel_t *otel)
{
    if (otel == NULL)
        return;
    pthread_mutex_lock(&otel->lock);
    otel->stop = true;
    pthread_cond_signal(&otel->cond);
    pthread_mutex_unlock(&otel->lock);
    pthread_join(otel->thread, NULL);
    pthread_cond_destroy(&otel->cond);
    pthread_mutex_destroy(&otel->lock);
    pdgw_free(otel->batch);
    pdgw_free(otel->ring);
    pdgw_free(otel);
}

/* ---------------------------------------------------------------- recording */

static void attr_str(otel_span_t *s, const char *key, const char *v)
{
    if (v == NULL || v[0] == '\0' || s->n_attrs >= OTEL_MAX_ATTRS)
        return;
    s->attrs[s->n_attrs].key = key;
    s->attrs[s->n_attrs].is_int = false;
    snprintf(s->attrs[s->n_attrs].s, sizeof(s->attrs[0].s), "%s", v);
    s->n_attrs++;
}

static void attr_int(otel_span_t *s, const char *key, int64_t v)
{
    if (s->n_attrs >= OTEL_MAX_ATTRS)
        return;
    s->attrs[s->n_attrs].key = key;
    s->attrs[s->n_attrs].is_int = true;
    s->attrs[s->n_attrs].i = v;
    s->n_attrs++;
}

/* Trace-id ratio sampling as the OpenTelemetry SDKs do it: the low 8 bytes of the trace id
 * as an integer, below ratio * 2^63 (the id's random part decides, the same way everywhere). */
static bool ratio_sampled(const uint8_t trace_id[16], double ratio)
{
    uint64_t v = 0;
    if (ratio >= 1.0)
        return true;
    if (ratio <= 0.0)
        return false;
    for (int i = 8; i < 16; i++)
        v = v << 8 | trace_id[i];
    v >>= 1;
    return (double)v < ratio * 9223372036854775808.0;
}

bool pdgw_otel_sampled(const pdgw_otel_t *otel, const pdgw_traceparent_t *span,
                       const pdgw_traceparent_t *parent)
{
    if (otel == NULL || span == NULL)
        return false;
    if (otel->cfg.parent_based && parent != NULL)
        return (parent->flags & 1) != 0;
    return ratio_sampled(span->trace_id, otel->cfg.sample_ratio);
}

void pdgw_otel_record(pdgw_otel_t *otel, const pdgw_otel_request_t *req)
{
    otel_span_t spans[5];
    size_t n = 0;
    uint64_t off, mono_now, real_now;
    const pdgw_traceparent_t *tp = req->span;
    if (otel == NULL || tp == NULL || req->start_ns == 0 || req->end_ns < req->start_ns)
        return;
    if (!pdgw_otel_sampled(otel, tp, req->parent))
        return;
    mono_now = pdgw_time_mono_ns();
    real_now = pdgw_time_real_ns();
    off = real_now > mono_now ? real_now - mono_now : 0;

    memset(spans, 0, sizeof(spans));
    /* The request span: its id is the one forwarded to the engines. */
    otel_span_t *root = &spans[n++];
    memcpy(root->trace_id, tp->trace_id, 16);
    memcpy(root->span_id, tp->parent_id, 8);
    if (req->parent != NULL) {
        memcpy(root->parent_id, req->parent->parent_id, 8);
        root->has_parent = true;
    }
    root->kind = OTEL_SPAN_KIND_SERVER;
    snprintf(root->name, sizeof(root->name), "%s %s", req->method ? req->method : "POST",
             req->path ? req->path : "");
    root->start_unix_ns = req->start_ns + off;
    root->end_unix_ns = req->end_ns + off;
    attr_str(root, "http.request.method", req->method);
    attr_str(root, "url.path", req->path);
    attr_int(root, "http.response.status_code", req->status);
    attr_str(root, "gen_ai.request.model", req->model);
    attr_str(root, "pdgw.protocol", req->protocol);
    attr_str(root, "pdgw.prefill_instance", req->prefill_instance);
    attr_str(root, "pdgw.decode_instance", req->decode_instance);
    attr_str(root, "pdgw.request_id", req->request_id);
    attr_int(root, "pdgw.retries", req->retries);
    attr_int(root, "pdgw.stream", req->stream);
    if (req->prompt_tokens >= 0)
        attr_int(root, "gen_ai.usage.input_tokens", req->prompt_tokens);
    if (req->completion_tokens >= 0)
        attr_int(root, "gen_ai.usage.output_tokens", req->completion_tokens);
    attr_str(root, "pdgw.failure_phase", req->failure_phase);
    if (req->slo_ttft_ms > 0)
        attr_int(root, "pdgw.slo.ttft_ms", req->slo_ttft_ms);
    if (req->slo_tpot_ms > 0)
        attr_int(root, "pdgw.slo.tpot_ms", req->slo_tpot_ms);
    attr_str(root, "pdgw.slo.result", req->slo_result);
    attr_str(root, "pdgw.tenant", req->tenant);
    if (req->cached_prompt_tokens >= 0)
        attr_int(root, "pdgw.usage.cached_prompt_tokens", req->cached_prompt_tokens);
    if (req->status >= 400 || req->failure_phase != NULL) {
        root->error = true;
        snprintf(root->status_message, sizeof(root->status_message), "%s",
                 req->error ? req->error : "request failed");
    }

    /* Phase spans, children of the request span. */
    struct {
        const char *name;
        uint64_t a, b;
    } ph[4] = {
        {"queue", req->start_ns, req->first_leg_ns},
        {"prefill", req->prefill_start_ns, req->prefill_end_ns},
        {"kv_transfer", req->prefill_end_ns, req->decode_first_ns},
        {"decode", req->decode_start_ns, req->decode_end_ns},
    };
    for (int i = 0; i < 4; i++) {
        otel_span_t *s;
        if (ph[i].a == 0 || ph[i].b == 0)
            continue;
        /* A leg's times are its loop turn's, in milliseconds, read before the turn's events:
         * a leg started in the turn that read its request can seem to start before the
         * request did, by the turn's work before it. Keep every phase inside the request. */
        for (int k = 0; k < 2; k++) {
            uint64_t *t = k == 0 ? &ph[i].a : &ph[i].b;
            if (*t < req->start_ns)
                *t = req->start_ns;
            if (*t > req->end_ns)
                *t = req->end_ns;
        }
        if (ph[i].b + 1000000u < ph[i].a)
            continue; /* ends before it starts: not a phase of this request */
        if (ph[i].b < ph[i].a)
            ph[i].b = ph[i].a; /* shorter than the clock's resolution */
        s = &spans[n++];
        memcpy(s->trace_id, tp->trace_id, 16);
        if (pdgw_random_bytes(s->span_id, 8) != PDGW_OK)
            s->span_id[0] = (uint8_t)(i + 1);
        memcpy(s->parent_id, tp->parent_id, 8);
        s->has_parent = true;
        s->kind = OTEL_SPAN_KIND_INTERNAL;
        snprintf(s->name, sizeof(s->name), "%s", ph[i].name);
        s->start_unix_ns = ph[i].a + off;
        s->end_unix_ns = ph[i].b + off;
        attr_str(s, "pdgw.protocol", req->protocol);
        if (i == 1)
            attr_str(s, "pdgw.instance", req->prefill_instance);
        if (i == 3)
            attr_str(s, "pdgw.instance", req->decode_instance);
    }

    pthread_mutex_lock(&otel->lock);
    if (otel->count + n > otel->cfg.max_queue_spans) {
        pthread_mutex_unlock(&otel->lock);
        atomic_fetch_add(&otel->dropped, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        otel->ring[(otel->head + otel->count) % otel->cfg.max_queue_spans] = spans[i];
        otel->count++;
    }
    if (otel->count >= otel->cfg.max_batch_spans)
        pthread_cond_signal(&otel->cond);
    pthread_mutex_unlock(&otel->lock);
}

pdgw_status_t pdgw_otel_metrics(void *arg, pdgw_buf_t *out)
{
    pdgw_otel_t *otel = arg;
    return pdgw_buf_appendf(out,
                            "# HELP pdgw_otel_spans_total Trace spans by export result "
                            "(exported, failed to reach the collector, dropped on a full queue).\n"
                            "# TYPE pdgw_otel_spans_total counter\n"
                            "pdgw_otel_spans_total{result=\"exported\"} %llu\n"
                            "pdgw_otel_spans_total{result=\"failed\"} %llu\n"
                            "pdgw_otel_spans_total{result=\"dropped\"} %llu\n",
                            (unsigned long long)atomic_load(&otel->exported),
                            (unsigned long long)atomic_load(&otel->failed),
                            (unsigned long long)atomic_load(&otel->dropped));
}
