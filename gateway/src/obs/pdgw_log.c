/*
 * pdgw_log.c - leveled text/JSON logging and the access log.
 *
 * Lines are built in a fixed stack buffer (no allocation, so logging works while memory is
 * short and never disturbs allocation-failure tests) and written with one write(2) under a
 * mutex.
 */
#include "pdgw_log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "pdgw_util.h"

#define LINE_MAX_BYTES 16384
#define MSG_MAX_BYTES  8192

static atomic_int log_level = PDGW_LOG_LEVEL_INFO;
static atomic_int log_format = PDGW_LOG_FORMAT_TEXT;
static atomic_int log_fd = 2;
static atomic_bool access_enabled = true;
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static pdgw_log_sink_fn log_sink;
static void *log_sink_ctx;

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void pdgw_log_init(pdgw_log_level_t level, pdgw_log_format_t format, int fd)
{
    pdgw_log_set_level(level);
    pdgw_log_set_format(format);
    if (fd >= 0)
        atomic_store(&log_fd, fd);
}

void pdgw_log_set_level(pdgw_log_level_t level)
{
    if (level >= PDGW_LOG_LEVEL_DEBUG && level <= PDGW_LOG_LEVEL_ERROR)
        atomic_store(&log_level, (int)level);
}

void pdgw_log_set_format(pdgw_log_format_t format)
{
    atomic_store(&log_format,
                 format == PDGW_LOG_FORMAT_JSON ? PDGW_LOG_FORMAT_JSON : PDGW_LOG_FORMAT_TEXT);
}

void pdgw_log_set_access(bool enabled)
{
    atomic_store(&access_enabled, enabled);
}

bool pdgw_log_access_enabled(void)
{
    return atomic_load(&access_enabled);
}

void pdgw_log_set_sink(pdgw_log_sink_fn fn, void *ctx)
{
    pthread_mutex_lock(&log_mutex);
    log_sink = fn;
    log_sink_ctx = ctx;
    pthread_mutex_unlock(&log_mutex);
}

const char *pdgw_log_level_name(pdgw_log_level_t level)
{
    if (level < PDGW_LOG_LEVEL_DEBUG || level > PDGW_LOG_LEVEL_ERROR)
        return "unknown";
    return level_names[level];
}

pdgw_status_t pdgw_log_level_parse(const char *s, pdgw_log_level_t *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (pdgw_log_level_t)i;
            return PDGW_OK;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = PDGW_LOG_LEVEL_WARN;
        return PDGW_OK;
    }
    return PDGW_ERR_PARSE;
}

bool pdgw_log_enabled(pdgw_log_level_t level)
{
    return (int)level >= atomic_load_explicit(&log_level, memory_order_relaxed);
}

/* ---------------------------------------------------------------- fixed line buffer */

typedef struct line {
    char data[LINE_MAX_BYTES];
    size_t len;
    bool truncated;
} line_t;

static void line_put(line_t *l, const char *s, size_t n)
{
    size_t room = sizeof(l->data) - 2 - l->len; /* keep space for '\n' and NUL */
    if (n > room) {
        n = room;
        l->truncated = true;
    }
    memcpy(l->data + l->len, s, n);
    l->len += n;
}

static void line_puts(line_t *l, const char *s)
{
    line_put(l, s, strlen(s));
}

static void line_printf(line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line_printf(line_t *l, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        line_put(l, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* Length of the well-formed UTF-8 sequence at <p> (<avail> bytes), 0 if malformed. */
static size_t utf8_seq_len(const unsigned char *p, size_t avail)
{
    size_t len;
    uint32_t cp;
    if (p[0] < 0x80)
        return 1;
    if ((p[0] & 0xE0) == 0xC0) {
        len = 2;
        cp = p[0] & 0x1F;
    } else if ((p[0] & 0xF0) == 0xE0) {
        len = 3;
        cp = p[0] & 0x0F;
    } else if ((p[0] & 0xF8) == 0xF0) {
        len = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (len > avail)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/*
 * Escaped copy of <s>. JSON: a JSON string body. Text: control characters as \n, \r, \t,
 * \xNN so one record is always one line; with <quote_text> also '"' and '\\' escaped.
 */
static void line_put_escaped(line_t *l, const char *s, size_t n, bool json, bool quote_text)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n && !l->truncated; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[7];
        const char *rep = NULL;
        if (c == '\n')
            rep = "\\n";
        else if (c == '\r')
            rep = "\\r";
        else if (c == '\t')
            rep = "\\t";
        else if ((c == '"' || c == '\\') && (json || quote_text))
            rep = c == '"' ? "\\\"" : "\\\\";
        else if (c < 0x20 || c == 0x7f) {
            if (json) {
                memcpy(e, "\\u00", 4);
                e[4] = hex[c >> 4];
                e[5] = hex[c & 15];
                e[6] = '\0';
            } else {
                e[0] = '\\';
                e[1] = 'x';
                e[2] = hex[c >> 4];
                e[3] = hex[c & 15];
                e[4] = '\0';
            }
            rep = e;
        }
        if (rep != NULL) {
            line_puts(l, rep);
        } else if (c < 0x80 || !json) {
            line_put(l, (const char *)&s[i], 1);
        } else {
            /* JSON must be valid UTF-8: copy whole sequences, replace broken bytes. */
            size_t sl = utf8_seq_len((const unsigned char *)s + i, n - i);
            if (sl == 0) {
                line_puts(l, "\\ufffd");
            } else {
                line_put(l, s + i, sl);
                i += sl - 1;
            }
        }
    }
}

static void line_json_str(line_t *l, const char *key, const char *value)
{
    line_puts(l, ",\"");
    line_puts(l, key);
    line_puts(l, "\":\"");
    line_put_escaped(l, value, strlen(value), true, false);
    line_puts(l, "\"");
}

/* Text "key=value", quoted when the value has blanks, quotes or is empty. */
static void line_text_kv(line_t *l, const char *key, const char *value)
{
    bool quote = value[0] == '\0' || strpbrk(value, " \t\"=\\") != NULL;
    line_puts(l, " ");
    line_puts(l, key);
    line_puts(l, quote ? "=\"" : "=");
    line_put_escaped(l, value, strlen(value), false, true);
    if (quote)
        line_puts(l, "\"");
}

/*
 * After a cut: drop an incomplete escape sequence ("\\", "\\u00") and a split UTF-8
 * sequence at the end, so the truncated JSON line stays valid.
 */
static void trim_partial_tail(line_t *l)
{
    for (size_t back = 1; back <= 6 && back <= l->len; back++) {
        size_t pos = l->len - back;
        if (l->data[pos] != '\\')
            continue;
        size_t run = 0; /* backslashes before pos */
        while (run < pos && l->data[pos - 1 - run] == '\\')
            run++;
        if (run % 2 == 1)
            continue; /* this one is escaped itself */
        size_t need = (back >= 2 && l->data[pos + 1] == 'u') ? 6 : 2;
        if (back < need)
            l->len = pos;
        break;
    }
    /* UTF-8: drop continuation bytes and the lead byte of a cut sequence. */
    size_t k = l->len;
    while (k > 0 && ((unsigned char)l->data[k - 1] & 0xC0) == 0x80)
        k--;
    if (k > 0 && ((unsigned char)l->data[k - 1] & 0xC0) == 0xC0) {
        unsigned char lead = (unsigned char)l->data[k - 1];
        size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
        if (l->len - (k - 1) < want)
            l->len = k - 1;
    }
}

static void line_emit(line_t *l, pdgw_log_level_t level)
{
    if (l->truncated) {
        /* Overwrite the tail with a marker; in JSON also close the string and object. */
        bool json = atomic_load(&log_format) == PDGW_LOG_FORMAT_JSON;
        const char *mark = json ? "...\"}" : "...";
        size_t ml = strlen(mark);
        l->len = sizeof(l->data) - 2 - ml;
        trim_partial_tail(l);
        memcpy(l->data + l->len, mark, ml);
        l->len += ml;
    }
    l->data[l->len++] = '\n';
    l->data[l->len] = '\0';

    pthread_mutex_lock(&log_mutex);
    if (log_sink != NULL) {
        log_sink(log_sink_ctx, level, l->data, l->len);
    } else {
        int fd = atomic_load(&log_fd);
        size_t off = 0;
        while (off < l->len) {
            ssize_t n = write(fd, l->data + off, l->len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            off += (size_t)n;
        }
    }
    pthread_mutex_unlock(&log_mutex);
}

static void line_begin(line_t *l, pdgw_log_level_t level, bool json)
{
    char ts[40];
    pdgw_time_format_rfc3339(0, ts, sizeof(ts));
    l->len = 0;
    l->truncated = false;
    if (json) {
        line_puts(l, "{\"ts\":\"");
        line_puts(l, ts);
        line_puts(l, "\",\"level\":\"");
        line_puts(l, pdgw_log_level_name(level));
        line_puts(l, "\"");
    } else {
        line_puts(l, ts);
        line_puts(l, " ");
        line_puts(l, level_tags[level]);
    }
}

static void log_vwrite(pdgw_log_level_t level, const char *component, const char *request_id,
                       const char *fmt, va_list ap)
{
    if (level < PDGW_LOG_LEVEL_DEBUG || level > PDGW_LOG_LEVEL_ERROR)
        level = PDGW_LOG_LEVEL_ERROR;
    if (!pdgw_log_enabled(level))
        return;
    char msg[MSG_MAX_BYTES];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t ml = n < 0 ? 0 : ((size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
    while (ml > 0 && (msg[ml - 1] == '\n' || msg[ml - 1] == '\r'))
        ml--;

    bool json = atomic_load(&log_format) == PDGW_LOG_FORMAT_JSON;
    static _Thread_local line_t l; /* 16 KiB: keep it off small worker stacks */
    line_begin(&l, level, json);
    if (json) {
        if (component != NULL)
            line_json_str(&l, "component", component);
        if (request_id != NULL)
            line_json_str(&l, "request_id", request_id);
        line_puts(&l, ",\"msg\":\"");
        line_put_escaped(&l, msg, ml, true, false);
        line_puts(&l, "\"}");
    } else {
        if (component != NULL) {
            line_puts(&l, " [");
            line_put_escaped(&l, component, strlen(component), false, false);
            line_puts(&l, "]");
        }
        if (request_id != NULL)
            line_text_kv(&l, "req", request_id);
        line_puts(&l, " ");
        line_put_escaped(&l, msg, ml, false, false);
    }
    line_emit(&l, level);
}

void pdgw_log_write(pdgw_log_level_t level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, component, NULL, fmt, ap);
    va_end(ap);
}

void pdgw_log_vwrite(pdgw_log_level_t level, const char *component, const char *fmt, va_list ap)
{
    log_vwrite(level, component, NULL, fmt, ap);
}

void pdgw_log_write_req(pdgw_log_level_t level, const char *component, const char *request_id,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, component, request_id, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- access log */

void pdgw_access_entry_init(pdgw_access_entry_t *e)
{
    memset(e, 0, sizeof(*e));
    e->total_us = -1;
    e->queue_us = -1;
    e->ttft_us = -1;
    e->prefill_us = -1;
    e->kv_us = -1;
    e->decode_us = -1;
    e->pred_prefill_us = -1;
    e->pred_tpot_us = -1;
    e->prompt_tokens = -1;
    e->completion_tokens = -1;
    e->pd_retryable = -1;
}

static void access_str(line_t *l, bool json, const char *key, const char *value, bool always)
{
    if (value == NULL || value[0] == '\0') {
        if (!always)
            return;
        value = "-";
    }
    if (json)
        line_json_str(l, key, value);
    else
        line_text_kv(l, key, value);
}

static void access_num(line_t *l, bool json, const char *key, int64_t v)
{
    line_printf(l, json ? ",\"%s\":%" PRId64 : " %s=%" PRId64, key, v);
}

static void access_dur(line_t *l, bool json, const char *key, int64_t us)
{
    if (us < 0)
        return;
    line_printf(l, json ? ",\"%s\":%.3f" : " %s=%.3f", key, (double)us / 1000.0);
}

void pdgw_access_log(const pdgw_access_entry_t *e)
{
    if (!pdgw_log_access_enabled() || e == NULL)
        return;
    bool json = atomic_load(&log_format) == PDGW_LOG_FORMAT_JSON;
    static _Thread_local line_t l;
    line_begin(&l, PDGW_LOG_LEVEL_INFO, json);
    if (json)
        line_puts(&l, ",\"type\":\"access\"");
    else
        line_puts(&l, " access");
    access_str(&l, json, json ? "request_id" : "id", e->request_id, true);
    access_str(&l, json, "method", e->method, true);
    access_str(&l, json, "path", e->path, true);
    access_str(&l, json, "protocol", e->protocol, true);
    access_str(&l, json, "model", e->model, false);
    access_str(&l, json, "prefill", e->prefill_instance, true);
    access_str(&l, json, "decode", e->decode_instance, true);
    access_num(&l, json, "status", e->status);
    access_num(&l, json, "retries", e->retries);
    if (json)
        line_printf(&l, ",\"stream\":%s", e->stream ? "true" : "false");
    else
        line_printf(&l, " stream=%d", e->stream ? 1 : 0);
    access_dur(&l, json, "total_ms", e->total_us);
    access_dur(&l, json, "queue_ms", e->queue_us);
    access_dur(&l, json, "ttft_ms", e->ttft_us);
    access_dur(&l, json, "prefill_ms", e->prefill_us);
    access_dur(&l, json, "kv_ms", e->kv_us);
    access_dur(&l, json, "decode_ms", e->decode_us);
    access_dur(&l, json, "pred_prefill_ms", e->pred_prefill_us);
    access_dur(&l, json, "pred_tpot_ms", e->pred_tpot_us);
    access_num(&l, json, "bytes_in", (int64_t)e->bytes_in);
    access_num(&l, json, "bytes_out", (int64_t)e->bytes_out);
    if (e->prompt_tokens >= 0)
        access_num(&l, json, "prompt_tokens", e->prompt_tokens);
    if (e->completion_tokens >= 0)
        access_num(&l, json, "completion_tokens", e->completion_tokens);
    access_str(&l, json, "client", e->client_addr, false);
    access_str(&l, json, "error", e->error, false);
    if (e->slo_ttft_ms > 0)
        access_num(&l, json, "slo_ttft_ms", e->slo_ttft_ms);
    if (e->slo_tpot_ms > 0)
        access_num(&l, json, "slo_tpot_ms", e->slo_tpot_ms);
    access_str(&l, json, "slo", e->slo_result, false);
    access_str(&l, json, "tenant", e->tenant, false);
    access_str(&l, json, "pd_phase", e->pd_phase, false);
    if (e->pd_phase != NULL && e->pd_retryable >= 0) {
        if (json)
            line_printf(&l, ",\"pd_retryable\":%s", e->pd_retryable ? "true" : "false");
        else
            line_printf(&l, " pd_retryable=%d", e->pd_retryable ? 1 : 0);
    }
    if (e->client_disconnected) {
        if (json)
            line_puts(&l, ",\"disconnected\":true");
        else
            line_puts(&l, " disconnected=1");
    }
    if (json)
        line_puts(&l, "}");
    line_emit(&l, PDGW_LOG_LEVEL_INFO);
}

/* ---------------------------------------------------------------- rate limiting */

bool pdgw_log_ratelimit_allow(pdgw_log_ratelimit_t *rl, uint64_t interval_ms,
                              uint64_t *suppressed_out)
{
    uint64_t now = pdgw_time_mono_ms();
    uint64_t next = atomic_load_explicit(&rl->next_ms, memory_order_relaxed);
    if (now >= next && atomic_compare_exchange_strong(&rl->next_ms, &next, now + interval_ms)) {
        uint64_t skipped = atomic_exchange(&rl->suppressed, 0);
        if (suppressed_out != NULL)
            *suppressed_out = skipped;
        return true;
    }
    atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
    return false;
}
