/*
 * A small Prometheus text-format reader for the engine metrics the
 * scheduler uses (docs/protocols/README.md, engine metrics): vLLM's vllm:num_requests_running /
 * vllm:num_requests_waiting / vllm:kv_cache_usage_perc (vllm/v1/metrics/
 * loggers.py) and SGLang's sglang:num_running_reqs / sglang:num_queue_reqs
 * (+ its PD queues) / sglang:token_usage (python/sglang/srt/metrics/
 * collector.py). Counts are summed over their label sets (several models or
 * DP ranks behind one endpoint); the usage fraction takes the largest.
 * Malformed lines are skipped; nothing in the input can make it read
 * outside [text, text + len). The names are one table (engine_names), which
 * the engine doctor lists too (pdsched/engine_metrics.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <pdsched/engine_metrics.h>

#include "sched_int.h"

/* SGLang's PD queues of requests not yet running (a prefill's bootstrap queue waiting for its
 * decode, a decode's pre-allocation and KV-transfer queues) add to its waiting count. Names
 * from upstream python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector). */
static const sched_engine_metric_t engine_names[] = {
    {SCHED_ENGINE_VLLM, SCHED_GAUGE_RUNNING, SCHED_METRIC_MAIN, "vllm:num_requests_running"},
    {SCHED_ENGINE_VLLM, SCHED_GAUGE_WAITING, SCHED_METRIC_MAIN, "vllm:num_requests_waiting"},
    {SCHED_ENGINE_VLLM, SCHED_GAUGE_KV_USAGE, SCHED_METRIC_MAIN, "vllm:kv_cache_usage_perc"},
    {SCHED_ENGINE_VLLM, SCHED_GAUGE_KV_USAGE, SCHED_METRIC_FALLBACK, "vllm:gpu_cache_usage_perc"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_RUNNING, SCHED_METRIC_MAIN, "sglang:num_running_reqs"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_WAITING, SCHED_METRIC_MAIN, "sglang:num_queue_reqs"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_WAITING, SCHED_METRIC_ADDS,
     "sglang:num_prefill_prealloc_queue_reqs"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_WAITING, SCHED_METRIC_ADDS,
     "sglang:num_decode_prealloc_queue_reqs"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_WAITING, SCHED_METRIC_ADDS,
     "sglang:num_decode_transfer_queue_reqs"},
    {SCHED_ENGINE_SGLANG, SCHED_GAUGE_KV_USAGE, SCHED_METRIC_MAIN, "sglang:token_usage"},
};

#define N_ENGINE_NAMES (sizeof(engine_names) / sizeof(engine_names[0]))

/* vLLM's info gauge of its CacheConfig (vllm/v1/metrics/loggers.py, log_metrics_info: one
 * sample of value 1 per engine, every CacheConfig field a label, values as Python str() -
 * vllm/config/cache.py metrics_info - so num_gpu_blocks reads "None" until the KV cache is
 * sized). Its labels, not its value, carry the KV capacity; a name apart from the gauge
 * table, which holds values. */
#define CACHE_CONFIG_INFO "vllm:cache_config_info"

const sched_engine_metric_t *sched_engine_metric_names(size_t *n_out)
{
    *n_out = N_ENGINE_NAMES;
    return engine_names;
}

const char *sched_engine_gauge_name(sched_engine_gauge_t g)
{
    static const char *const names[SCHED_GAUGE_COUNT_] = {"running requests", "waiting requests",
                                                          "KV cache usage"};
    return (unsigned)g < SCHED_GAUGE_COUNT_ ? names[g] : "?";
}

const char *sched_engine_kind_name(sched_engine_kind_t k)
{
    return k == SCHED_ENGINE_SGLANG ? "SGLang" : "vLLM";
}

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* Parse one sample line [p, end); false when malformed. */
static bool parse_line(const char *p, const char *end, const char **name, size_t *name_len,
                       double *value)
{
    const char *n0 = p;
    char num[64];
    size_t nl;
    char *stop;

    if (p >= end || !name_char(*p, true))
        return false;
    while (p < end && name_char(*p, false))
        p++;
    *name = n0;
    *name_len = (size_t)(p - n0);
    if (p < end && *p == '{') {
        bool in_str = false;
        p++;
        while (p < end) {
            if (in_str) {
                if (*p == '\\')
                    p++;
                else if (*p == '"')
                    in_str = false;
            } else if (*p == '"') {
                in_str = true;
            } else if (*p == '}') {
                break;
            }
            p++;
        }
        if (p >= end)
            return false;
        p++;
    }
    if (p >= end || (*p != ' ' && *p != '\t'))
        return false;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    nl = 0;
    while (p < end && *p != ' ' && *p != '\t' && nl < sizeof(num) - 1)
        num[nl++] = *p++;
    num[nl] = '\0';
    if (nl == 0)
        return false;
    *value = strtod(num, &stop);
    return *stop == '\0' && isfinite(*value);
}

/* The value of label <key> in the label set of the sample line [p, end) into <out> (NUL-
 * terminated, truncated to out_len - 1); false when absent or malformed. Escapes are kept
 * as they are: the values read here are digits. */
static bool label_value(const char *p, const char *end, const char *key, char *out, size_t out_len)
{
    size_t klen = strlen(key);

    while (p < end && *p != '{')
        p++;
    if (p >= end)
        return false;
    p++;
    while (p < end && *p != '}') {
        const char *k0;
        size_t n = 0;
        bool match;
        while (p < end && (*p == ' ' || *p == ','))
            p++;
        k0 = p;
        while (p < end && *p != '=' && *p != '}')
            p++;
        if (p >= end || *p != '=' || p + 1 >= end || p[1] != '"')
            return false;
        match = (size_t)(p - k0) == klen && memcmp(k0, key, klen) == 0;
        p += 2;
        while (p < end && *p != '"') {
            if (*p == '\\' && p + 1 < end)
                p++;
            if (match && n + 1 < out_len)
                out[n++] = *p;
            p++;
        }
        if (p >= end)
            return false;
        p++; /* closing quote */
        if (match) {
            out[n] = '\0';
            return true;
        }
    }
    return false;
}

/* num_gpu_blocks x block_size of one vllm:cache_config_info line; false when either is
 * absent or not a positive number (e.g. "None" before the cache is sized). */
static bool cache_config_tokens(const char *p, const char *end, double *tokens)
{
    char blocks[32], bs[32];
    char *stop;
    double b, s;

    if (!label_value(p, end, "num_gpu_blocks", blocks, sizeof(blocks)) ||
        !label_value(p, end, "block_size", bs, sizeof(bs)))
        return false;
    b = strtod(blocks, &stop);
    if (stop == blocks || *stop != '\0' || !(b > 0) || !isfinite(b))
        return false;
    s = strtod(bs, &stop);
    if (stop == bs || *stop != '\0' || !(s > 0) || !isfinite(s))
        return false;
    *tokens = b * s;
    return isfinite(*tokens);
}

static bool is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && memcmp(name, want, len) == 0;
}

/* The table's entry for <name>, or NULL. */
static const sched_engine_metric_t *lookup(const char *name, size_t len)
{
    size_t i;
    for (i = 0; i < N_ENGINE_NAMES; i++) {
        if (is(name, len, engine_names[i].name))
            return &engine_names[i];
    }
    return NULL;
}

sched_status_t sched_prom_parse(const char *text, size_t len, sched_engine_metrics_t *out)
{
    const char *p = text, *end = text + len;
    double gpu_usage = 0;
    bool have_gpu = false;

    memset(out, 0, sizeof(*out));
    if (!text)
        return SCHED_ERR_INVALID;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        const char *name;
        size_t nlen;
        double v;

        while (p < line_end && (*p == ' ' || *p == '\t'))
            p++;
        if (p < line_end && *p != '#' && parse_line(p, line_end, &name, &nlen, &v)) {
            const sched_engine_metric_t *m = lookup(name, nlen);
            double tokens;
            if (m == NULL && is(name, nlen, CACHE_CONFIG_INFO)) {
                if (cache_config_tokens(p, line_end, &tokens)) {
                    out->kv_capacity_tokens += tokens;
                    out->have_kv_capacity = true;
                }
            } else if (m == NULL) {
                /* not one of ours */
            } else if (m->gauge == SCHED_GAUGE_RUNNING) {
                out->running += v;
                out->have_running = true;
            } else if (m->gauge == SCHED_GAUGE_WAITING) {
                out->waiting += v;
                out->have_waiting = true;
            } else if (m->use == SCHED_METRIC_MAIN) {
                out->kv_usage = out->have_kv_usage && out->kv_usage > v ? out->kv_usage : v;
                out->have_kv_usage = true;
            } else {
                gpu_usage = have_gpu && gpu_usage > v ? gpu_usage : v;
                have_gpu = true;
            }
        }
        p = eol ? eol + 1 : end;
    }
    if (!out->have_kv_usage && have_gpu) {
        out->kv_usage = gpu_usage;
        out->have_kv_usage = true;
    }
    /* The *_perc gauges are fractions; accept percents from odd exporters. */
    if (out->kv_usage > 1.0)
        out->kv_usage /= 100.0;
    if (out->kv_usage < 0)
        out->kv_usage = 0;
    if (out->kv_usage > 1.0)
        out->kv_usage = 1.0;
    if (out->running < 0)
        out->running = 0;
    if (out->waiting < 0)
        out->waiting = 0;
    return (out->have_running || out->have_waiting || out->have_kv_usage) ? SCHED_OK
                                                                          : SCHED_ERR_NOT_FOUND;
}
