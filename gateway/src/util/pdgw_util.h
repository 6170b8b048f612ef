/*
 * pdgw_util.h - small helpers shared by the gateway: growable byte buffer, UUID v4,
 * W3C traceparent, monotonic clock, duration/size/number/host:port/URL parsing.
 * Everything here is thread-safe (no shared state) unless said otherwise.
 */
#ifndef PDGW_UTIL_H
#define PDGW_UTIL_H

/* The version pdgw reports (--version, traces' service.version). */
#ifndef PDGW_VERSION_STRING
#define PDGW_VERSION_STRING "0.1.0"
#endif

#include "pdb/pdb_buf.h"
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"

/* ---------------------------------------------------------------- growable buffer */

/*
 * A growable byte buffer; data is always NUL-terminated after len bytes once anything was
 * appended (data may be NULL while cap == 0). Zero-initialise or pdgw_buf_init() before use.
 * The buffer owns data; pdgw_buf_free() releases it, pdgw_buf_steal() hands it over.
 * Appends fail with PDGW_ERR_NOMEM (buffer unchanged) or PDGW_ERR_TOO_LARGE when the
 * optional <limit> (0 = none) would be exceeded.
 */
typedef pdb_buf_t pdgw_buf_t; /* data, len, cap, limit (max len, 0 = unlimited) */

#define PDGW_BUF_INIT PDB_BUF_INIT

void pdgw_buf_init(pdgw_buf_t *buf);
/* Make room for at least <extra> more bytes (+1 for the NUL). */
pdgw_status_t pdgw_buf_reserve(pdgw_buf_t *buf, size_t extra);
pdgw_status_t pdgw_buf_reserve_exact(pdgw_buf_t *buf, size_t extra);
pdgw_status_t pdgw_buf_append(pdgw_buf_t *buf, const void *data, size_t len);
pdgw_status_t pdgw_buf_append_str(pdgw_buf_t *buf, const char *s);
pdgw_status_t pdgw_buf_append_char(pdgw_buf_t *buf, char c);
pdgw_status_t pdgw_buf_appendf(pdgw_buf_t *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
pdgw_status_t pdgw_buf_vappendf(pdgw_buf_t *buf, const char *fmt, va_list ap);
/* Drop the first <n> bytes (n > len drops all); keeps capacity. */
void pdgw_buf_consume(pdgw_buf_t *buf, size_t n);
/* len = 0, keeps capacity. */
void pdgw_buf_reset(pdgw_buf_t *buf);
/* Release the memory; the buffer is empty and reusable afterwards. */
void pdgw_buf_free(pdgw_buf_t *buf);
/* Hand the data to the caller (free() it; never NULL unless OOM), buffer becomes empty. */
char *pdgw_buf_steal(pdgw_buf_t *buf, size_t *len_out);

/* ---------------------------------------------------------------- randomness, ids */

/*
 * Fill <out> with <len> bytes from getrandom(2). Draws up to 64 bytes are served from a
 * per-thread pool refilled 1 KiB at a time (fork-safe). PDGW_ERR_SYSTEM if the kernel
 * refuses.
 */
pdgw_status_t pdgw_random_bytes(void *out, size_t len);

#define PDGW_UUID_STR_LEN 36 /* without the NUL */

/* A random RFC 4122 version-4 UUID, lowercase "xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx". */
pdgw_status_t pdgw_uuid4(char out[PDGW_UUID_STR_LEN + 1]);
/* Non-zero if <s> (<len> bytes) is a canonical UUID string of any version. */
bool pdgw_uuid_is_valid(const char *s, size_t len);

/*
 * Client request ids (X-Request-Id) are echoed into headers and logs, so only a safe
 * charset is accepted: 1..128 bytes of [A-Za-z0-9._:/+=@-]. Non-zero if <s> qualifies.
 */
bool pdgw_request_id_is_valid(const char *s, size_t len);

/* ---------------------------------------------------------------- W3C trace context */

#define PDGW_TRACEPARENT_LEN 55 /* "00-<32 hex>-<16 hex>-<2 hex>" without the NUL */

typedef struct pdgw_traceparent {
    uint8_t version;
    uint8_t trace_id[16];
    uint8_t parent_id[8]; /* span id of the sender */
    uint8_t flags;        /* bit 0 = sampled */
} pdgw_traceparent_t;

/*
 * Parse a traceparent header value (<len> bytes, surrounding blanks ignored) following
 * W3C Trace Context level 1: version 00 must be exactly 55 chars; higher versions (not ff)
 * may carry more fields after a '-'; hex must be lowercase; all-zero trace/parent ids and
 * version ff are invalid. PDGW_ERR_PARSE when invalid (*out untouched).
 */
pdgw_status_t pdgw_traceparent_parse(const char *s, size_t len, pdgw_traceparent_t *out);
/* A new root context: random trace id and span id, version 00, flags 01 (sampled). */
pdgw_status_t pdgw_traceparent_new(pdgw_traceparent_t *out);
/* Child of <parent>: same trace id and flags, new random span id, version 00. */
pdgw_status_t pdgw_traceparent_child(const pdgw_traceparent_t *parent, pdgw_traceparent_t *out);
/* Lowercase header text (55 chars + NUL) of <tp>, always version "00". */
void pdgw_traceparent_format(const pdgw_traceparent_t *tp, char out[PDGW_TRACEPARENT_LEN + 1]);

/* ---------------------------------------------------------------- time */

/* CLOCK_MONOTONIC in nanoseconds / microseconds / milliseconds / seconds. */
uint64_t pdgw_time_mono_ns(void);
uint64_t pdgw_time_mono_ms(void);
/* On a worker thread, the time of this turn of its loop (no clock read); elsewhere the clock
 * (pdgw_loop_clock). For deadlines, not for durations. */
uint64_t pdgw_now_ms(void);
/* The loop turn's time pdgw_now_ms reads on this thread (a worker points it at its own), NULL
 * elsewhere. */
extern _Thread_local const uint64_t *pdgw_loop_clock;
/* The worker whose loop runs on the calling thread (NULL elsewhere). */
struct pdgw_worker;
extern _Thread_local struct pdgw_worker *pdgw_this_worker;
/* CLOCK_REALTIME in nanoseconds (for log timestamps). */
uint64_t pdgw_time_real_ns(void);
/* Nanoseconds to seconds as double (metrics). */
static inline double pdgw_time_ns_to_sec(uint64_t ns)
{
    return (double)ns / 1e9;
}
/*
 * RFC 3339 UTC timestamp with milliseconds, "2026-11-21T10:00:00.123Z", of <real_ns>
 * (0 = now). <out> needs at least 25 bytes. Returns the length written.
 */
size_t pdgw_time_format_rfc3339(uint64_t real_ns, char *out, size_t out_len);

/* ---------------------------------------------------------------- value parsing */

/*
 * Durations: a number with a unit "ms", "s", "m", "h" ("500ms", "30s", "2m", "1.5s") or a
 * plain number of seconds ("5", "0.25"). Blanks around are ignored. Result in milliseconds,
 * rounded to the nearest ms. PDGW_ERR_PARSE on anything else (negative included).
 */
pdgw_status_t pdgw_duration_parse(const char *s, uint64_t *ms_out);
/* Shortest exact text for <ms>: "500ms", "30s", "2m", "1h", "1500ms". Returns length. */
size_t pdgw_duration_format(uint64_t ms, char *out, size_t out_len);

/*
 * Sizes: plain bytes "16777216", or a number with a unit: B, K/KB (1000), KiB (1024),
 * M/MB, MiB, G/GB, GiB, T/TB, TiB (case-insensitive, optional blank before the unit).
 * Fractions allowed with a unit ("1.5MiB"). PDGW_ERR_PARSE on garbage, PDGW_ERR_TOO_LARGE
 * on overflow.
 */
pdgw_status_t pdgw_size_parse(const char *s, uint64_t *bytes_out);
/* "16MiB", "1KiB", "100" (exact binary units when divisible, else bytes). Returns length. */
size_t pdgw_size_format(uint64_t bytes, char *out, size_t out_len);

/* Whole decimal integer in [min, max] (blanks around ignored). PDGW_ERR_PARSE / _INVALID. */
pdgw_status_t pdgw_int_parse(const char *s, int64_t min, int64_t max, int64_t *out);
/* true/false, yes/no, on/off, 1/0 (case-insensitive). PDGW_ERR_PARSE otherwise. */
pdgw_status_t pdgw_bool_parse(const char *s, bool *out);

/*
 * "host:port", "[v6addr]:port" or ":port" (host "" = any). <host_out> gets the host
 * without brackets. PDGW_ERR_PARSE when malformed, PDGW_ERR_INVALID when the port is not in
 * 1..65535 (0 allowed when <allow_port0>).
 */
pdgw_status_t pdgw_hostport_parse(const char *s, bool allow_port0, char *host_out, size_t host_len,
                                  int *port_out);

/* Parts of an http(s) URL. */
typedef struct pdgw_url {
    char scheme[8]; /* "http" or "https" */
    char host[256]; /* without brackets for IPv6 */
    int port;       /* explicit or 80/443 */
    char path[512]; /* "" when absent, else starts with '/' */
} pdgw_url_t;

/* Split an http:// or https:// URL (no userinfo, no query needed). PDGW_ERR_PARSE otherwise. */
pdgw_status_t pdgw_url_parse(const char *s, pdgw_url_t *out);

/*
 * The whole of file <path> (at most <max> bytes), NUL-terminated, malloc'd (caller frees with
 * free()); length in *len_out. NULL with errno set when unreadable or larger than <max>.
 */
char *pdgw_file_read_all(const char *path, size_t max, size_t *len_out);

#endif /* PDGW_UTIL_H */
