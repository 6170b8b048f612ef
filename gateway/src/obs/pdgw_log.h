/*
 * pdgw_log.h - leveled, thread-safe logging as text or JSON lines, plus the access log.
 *
 * Every record is one line written with one write(2) under a mutex, so lines from different
 * workers never interleave. Text form:
 *   2026-11-21T10:00:00.123Z INFO  [worker] message
 * JSON form (one object per line, strings escaped):
 *   {"ts":"2026-11-21T10:00:00.123Z","level":"info","component":"worker","msg":"message"}
 * Until pdgw_log_init() is called the defaults are: level info, text, stderr.
 */
#ifndef PDGW_LOG_H
#define PDGW_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"

typedef enum pdgw_log_level {
    PDGW_LOG_LEVEL_DEBUG = 0,
    PDGW_LOG_LEVEL_INFO = 1,
    PDGW_LOG_LEVEL_WARN = 2,
    PDGW_LOG_LEVEL_ERROR = 3,
} pdgw_log_level_t;

typedef enum pdgw_log_format {
    PDGW_LOG_FORMAT_TEXT = 0,
    PDGW_LOG_FORMAT_JSON = 1,
} pdgw_log_format_t;

/*
 * Optional sink that receives every finished line (with its trailing '\n') instead of the
 * file descriptor; for tests. Called under the log mutex: must not log itself.
 */
typedef void (*pdgw_log_sink_fn)(void *ctx, pdgw_log_level_t level, const char *line, size_t len);

/* Configure the logger. <fd> < 0 keeps the current descriptor (default 2). */
void pdgw_log_init(pdgw_log_level_t level, pdgw_log_format_t format, int fd);
void pdgw_log_set_level(pdgw_log_level_t level);
void pdgw_log_set_format(pdgw_log_format_t format);
/* Turn the access log on/off (default on). */
void pdgw_log_set_access(bool enabled);
bool pdgw_log_access_enabled(void);
/* Install (or with fn = NULL remove) a sink; see pdgw_log_sink_fn. */
void pdgw_log_set_sink(pdgw_log_sink_fn fn, void *ctx);

/* Names: "debug", "info", "warn", "error" / "text", "json". Parse returns PDGW_ERR_PARSE. */
const char *pdgw_log_level_name(pdgw_log_level_t level);
pdgw_status_t pdgw_log_level_parse(const char *s, pdgw_log_level_t *out);

/* Non-zero when records of <level> are written (cheap, lock-free). */
bool pdgw_log_enabled(pdgw_log_level_t level);

/*
 * Write one record. <component> is a short tag ("config", "worker", "upstream"), may be
 * NULL. The formatted message is truncated at 8 KiB. A trailing newline in the message
 * is dropped.
 */
void pdgw_log_write(pdgw_log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* va_list form of pdgw_log_write (adapters for other libraries' log callbacks). */
void pdgw_log_vwrite(pdgw_log_level_t level, const char *component, const char *fmt, va_list ap);

/* Like pdgw_log_write, with a request id added ("req=<id>" / "request_id":"<id>"). */
void pdgw_log_write_req(pdgw_log_level_t level, const char *component, const char *request_id,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define pdgw_log_debug(component, ...)                                                             \
    do {                                                                                           \
        if (pdgw_log_enabled(PDGW_LOG_LEVEL_DEBUG))                                                \
            pdgw_log_write(PDGW_LOG_LEVEL_DEBUG, component, __VA_ARGS__);                          \
    } while (0)
#define pdgw_log_info(component, ...)                                                              \
    do {                                                                                           \
        if (pdgw_log_enabled(PDGW_LOG_LEVEL_INFO))                                                 \
            pdgw_log_write(PDGW_LOG_LEVEL_INFO, component, __VA_ARGS__);                           \
    } while (0)
#define pdgw_log_warn(component, ...)                                                              \
    do {                                                                                           \
        if (pdgw_log_enabled(PDGW_LOG_LEVEL_WARN))                                                 \
            pdgw_log_write(PDGW_LOG_LEVEL_WARN, component, __VA_ARGS__);                           \
    } while (0)
#define pdgw_log_error(component, ...) pdgw_log_write(PDGW_LOG_LEVEL_ERROR, component, __VA_ARGS__)

/*
 * Rate limiter for records that can repeat at high rate (EMFILE storms, refused upstreams):
 * at most one record per interval; the skipped ones are counted. Lock-free; one static
 * instance per call site, e.g.
 *     static pdgw_log_ratelimit_t rl = PDGW_LOG_RATELIMIT_INIT;
 *     uint64_t skipped;
 *     if (pdgw_log_ratelimit_allow(&rl, 1000, &skipped))
 *         pdgw_log_warn("upstream", "out of descriptors (%llu similar suppressed)", skipped);
 */
typedef struct pdgw_log_ratelimit {
    _Atomic uint64_t next_ms;
    _Atomic uint64_t suppressed;
} pdgw_log_ratelimit_t;

#define PDGW_LOG_RATELIMIT_INIT                                                                    \
    {                                                                                              \
        0, 0                                                                                       \
    }

/* True when a record may be written now; *suppressed_out (may be NULL) = skipped since last. */
bool pdgw_log_ratelimit_allow(pdgw_log_ratelimit_t *rl, uint64_t interval_ms,
                              uint64_t *suppressed_out);

/*
 * One access-log record per request. Strings may be NULL (omitted / "-"). Durations are in
 * microseconds, < 0 = not measured (omitted). Written at level info regardless of the
 * configured level, but only while the access log is enabled.
 *
 * Text:  access id=<id> method=POST path=/v1/chat/completions protocol=neutral model=m
 *        prefill=<inst> decode=<inst> status=200 retries=0 stream=1 total_ms=12.345
 *        ttft_ms=.. prefill_ms=.. kv_ms=.. decode_ms=.. bytes_in=.. bytes_out=.. [client=..]
 *        [error="..."] [disconnected=1] [pd_phase=.. pd_retryable=0|1]
 * JSON:  {"ts":..,"level":"info","type":"access","request_id":..,"method":..,...}
 * Values with blanks or quotes are quoted and escaped in the text form.
 */
typedef struct pdgw_access_entry {
    const char *request_id;
    const char *method;
    const char *path;
    const char *protocol;
    const char *model;
    const char *prefill_instance;
    const char *decode_instance;
    const char *client_addr;
    const char *error; /* short reason for non-2xx, NULL otherwise */
    int status;        /* HTTP status sent to the client */
    unsigned retries;
    bool stream;
    bool client_disconnected;
    int64_t total_us;
    int64_t queue_us;          /* waiting for an instance */
    int64_t ttft_us;           /* first content byte relayed */
    int64_t prefill_us;        /* prefill leg */
    int64_t kv_us;             /* KV transfer, when reported */
    int64_t decode_us;         /* decode leg */
    int64_t pred_prefill_us;   /* the latency models' prediction of the prefill leg, */
    int64_t pred_tpot_us;      /* and of the decode's time per token (< 0 = cold, omitted) */
    uint64_t bytes_in;         /* request body */
    uint64_t bytes_out;        /* response body bytes sent */
    int64_t prompt_tokens;     /* < 0 unknown */
    int64_t completion_tokens; /* < 0 unknown */
    const char *pd_phase;      /* failed PD phase (prefill, kv_transfer, decode), NULL = none */
    int pd_retryable;          /* with pd_phase: 1/0; < 0 = unknown (omitted) */
    uint32_t slo_ttft_ms;      /* the request's latency targets, 0 = none (omitted) */
    uint32_t slo_tpot_ms;
    const char *slo_result; /* met, missed_ttft, ... (pdgw_slo_result), NULL = omitted */
    const char *tenant;     /* the request's tenant, NULL = no tenants configured */
} pdgw_access_entry_t;

/* Sets every duration/token field and pd_retryable to -1, everything else to zero/NULL. */
void pdgw_access_entry_init(pdgw_access_entry_t *e);
void pdgw_access_log(const pdgw_access_entry_t *e);

#endif /* PDGW_LOG_H */
