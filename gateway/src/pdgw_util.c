/*
 * pdgw_util.c - buffer, ids, trace context, clocks and value parsing.
 */
#include "pdgw_util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "pdb/pdb_clock.h"
#include "pdgw_alloc.h"

/* ---------------------------------------------------------------- buffer */

/* The buffer is the base layer's (pdb_buf.h); these give its failures the gateway's codes. */
static pdgw_status_t buf_status(pdb_status_t st)
{
    switch (st) {
    case PDB_OK:
        return PDGW_OK;
    case PDB_ERR_NOMEM:
        return PDGW_ERR_NOMEM;
    case PDB_ERR_TOO_LARGE:
        return PDGW_ERR_TOO_LARGE;
    default:
        return PDGW_ERR_INVALID;
    }
}

void pdgw_buf_init(pdgw_buf_t *buf)
{
    pdb_buf_init(buf);
}

pdgw_status_t pdgw_buf_reserve(pdgw_buf_t *buf, size_t extra)
{
    return buf_status(pdb_buf_reserve(buf, extra));
}

pdgw_status_t pdgw_buf_append(pdgw_buf_t *buf, const void *data, size_t len)
{
    return buf_status(pdb_buf_append(buf, data, len));
}

pdgw_status_t pdgw_buf_append_str(pdgw_buf_t *buf, const char *s)
{
    return buf_status(pdb_buf_append_str(buf, s));
}

pdgw_status_t pdgw_buf_append_char(pdgw_buf_t *buf, char c)
{
    return buf_status(pdb_buf_append_char(buf, c));
}

pdgw_status_t pdgw_buf_vappendf(pdgw_buf_t *buf, const char *fmt, va_list ap)
{
    return buf_status(pdb_buf_vappendf(buf, fmt, ap));
}

pdgw_status_t pdgw_buf_appendf(pdgw_buf_t *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pdgw_status_t st = pdgw_buf_vappendf(buf, fmt, ap);
    va_end(ap);
    return st;
}

pdgw_status_t pdgw_buf_append_json_escaped(pdgw_buf_t *buf, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t start = 0;
    pdgw_status_t st = PDGW_OK;
    for (size_t i = 0; i < len && st == PDGW_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = NULL;
        char u[7];
        switch (c) {
        case '"':
            rep = "\\\"";
            break;
        case '\\':
            rep = "\\\\";
            break;
        case '\n':
            rep = "\\n";
            break;
        case '\r':
            rep = "\\r";
            break;
        case '\t':
            rep = "\\t";
            break;
        default:
            if (c < 0x20 || c == 0x7f) {
                u[0] = '\\';
                u[1] = 'u';
                u[2] = '0';
                u[3] = '0';
                u[4] = hex[c >> 4];
                u[5] = hex[c & 15];
                u[6] = '\0';
                rep = u;
            }
        }
        if (rep == NULL)
            continue;
        st = pdgw_buf_append(buf, s + start, i - start);
        if (st == PDGW_OK)
            st = pdgw_buf_append_str(buf, rep);
        start = i + 1;
    }
    if (st == PDGW_OK)
        st = pdgw_buf_append(buf, s + start, len - start);
    return st;
}

void pdgw_buf_consume(pdgw_buf_t *buf, size_t n)
{
    pdb_buf_consume(buf, n);
}

void pdgw_buf_reset(pdgw_buf_t *buf)
{
    pdb_buf_reset(buf);
}

void pdgw_buf_free(pdgw_buf_t *buf)
{
    pdb_buf_free(buf);
}

char *pdgw_buf_steal(pdgw_buf_t *buf, size_t *len_out)
{
    return pdb_buf_steal(buf, len_out);
}

/* ---------------------------------------------------------------- random, ids */

static pdgw_status_t getrandom_full(void *out, size_t len)
{
    unsigned char *p = out;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return PDGW_ERR_SYSTEM;
        }
        p += n;
        len -= (size_t)n;
    }
    return PDGW_OK;
}

/*
 * Small draws (ids, span ids: several per request) come from a per-thread pool refilled by
 * one getrandom(2), so the hot path does one syscall per ~20 requests instead of three per
 * request. Bytes handed out are wiped from the pool. A forked child must not replay its
 * parent's pool: a fork generation counter (bumped by a pthread_atfork child handler)
 * invalidates every pool in the child.
 */
#define RAND_POOL_BYTES 1024
#define RAND_POOL_MAX   64 /* larger draws go straight to the kernel */

static _Thread_local struct {
    unsigned char buf[RAND_POOL_BYTES];
    size_t pos;
    unsigned gen;
    bool valid;
} rand_pool;

static atomic_uint rand_fork_gen;
static pthread_once_t rand_once = PTHREAD_ONCE_INIT;

static void rand_on_fork_child(void)
{
    atomic_fetch_add(&rand_fork_gen, 1);
}

static void rand_register_atfork(void)
{
    pthread_atfork(NULL, NULL, rand_on_fork_child);
}

pdgw_status_t pdgw_random_bytes(void *out, size_t len)
{
    if (len > RAND_POOL_MAX)
        return getrandom_full(out, len);
    pthread_once(&rand_once, rand_register_atfork);
    unsigned gen = atomic_load_explicit(&rand_fork_gen, memory_order_relaxed);
    if (!rand_pool.valid || rand_pool.gen != gen || RAND_POOL_BYTES - rand_pool.pos < len) {
        pdgw_status_t st = getrandom_full(rand_pool.buf, RAND_POOL_BYTES);
        if (st != PDGW_OK)
            return st;
        rand_pool.pos = 0;
        rand_pool.gen = gen;
        rand_pool.valid = true;
    }
    memcpy(out, rand_pool.buf + rand_pool.pos, len);
    memset(rand_pool.buf + rand_pool.pos, 0, len);
    rand_pool.pos += len;
    return PDGW_OK;
}

static const char hexdig[] = "0123456789abcdef";

static void hex_encode(const uint8_t *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexdig[in[i] >> 4];
        out[2 * i + 1] = hexdig[in[i] & 15];
    }
}

pdgw_status_t pdgw_uuid4(char out[PDGW_UUID_STR_LEN + 1])
{
    uint8_t b[16];
    pdgw_status_t st = pdgw_random_bytes(b, sizeof(b));
    if (st != PDGW_OK)
        return st;
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    char *p = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hexdig[b[i] >> 4];
        *p++ = hexdig[b[i] & 15];
    }
    *p = '\0';
    return PDGW_OK;
}

bool pdgw_uuid_is_valid(const char *s, size_t len)
{
    if (len != PDGW_UUID_STR_LEN)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return false;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

bool pdgw_request_id_is_valid(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > 128)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && strchr("._:/+=@-", c) == NULL)
            return false;
        if (c == '\0')
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- traceparent */

static int lhex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* uppercase is invalid per the spec */
}

static int hex_decode(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = lhex_val(s[2 * i]), lo = lhex_val(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

pdgw_status_t pdgw_traceparent_parse(const char *s, size_t len, pdgw_traceparent_t *out)
{
    while (len > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    if (len < PDGW_TRACEPARENT_LEN)
        return PDGW_ERR_PARSE;
    pdgw_traceparent_t tp;
    if (hex_decode(s, 1, &tp.version) != 0 || tp.version == 0xff)
        return PDGW_ERR_PARSE;
    if (tp.version == 0 && len != PDGW_TRACEPARENT_LEN)
        return PDGW_ERR_PARSE;
    if (len > PDGW_TRACEPARENT_LEN && s[PDGW_TRACEPARENT_LEN] != '-')
        return PDGW_ERR_PARSE;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return PDGW_ERR_PARSE;
    if (hex_decode(s + 3, 16, tp.trace_id) != 0 || hex_decode(s + 36, 8, tp.parent_id) != 0 ||
        hex_decode(s + 53, 1, &tp.flags) != 0)
        return PDGW_ERR_PARSE;
    if (all_zero(tp.trace_id, 16) || all_zero(tp.parent_id, 8))
        return PDGW_ERR_PARSE;
    *out = tp;
    return PDGW_OK;
}

static pdgw_status_t new_span_id(uint8_t id[8])
{
    do {
        pdgw_status_t st = pdgw_random_bytes(id, 8);
        if (st != PDGW_OK)
            return st;
    } while (all_zero(id, 8));
    return PDGW_OK;
}

pdgw_status_t pdgw_traceparent_new(pdgw_traceparent_t *out)
{
    pdgw_traceparent_t tp = {.version = 0, .flags = 0x01};
    do {
        pdgw_status_t st = pdgw_random_bytes(tp.trace_id, sizeof(tp.trace_id));
        if (st != PDGW_OK)
            return st;
    } while (all_zero(tp.trace_id, 16));
    pdgw_status_t st = new_span_id(tp.parent_id);
    if (st != PDGW_OK)
        return st;
    *out = tp;
    return PDGW_OK;
}

pdgw_status_t pdgw_traceparent_child(const pdgw_traceparent_t *parent, pdgw_traceparent_t *out)
{
    pdgw_traceparent_t tp = *parent;
    tp.version = 0;
    pdgw_status_t st = new_span_id(tp.parent_id);
    if (st != PDGW_OK)
        return st;
    *out = tp;
    return PDGW_OK;
}

void pdgw_traceparent_format(const pdgw_traceparent_t *tp, char out[PDGW_TRACEPARENT_LEN + 1])
{
    out[0] = '0';
    out[1] = '0';
    out[2] = '-';
    hex_encode(tp->trace_id, 16, out + 3);
    out[35] = '-';
    hex_encode(tp->parent_id, 8, out + 36);
    out[52] = '-';
    hex_encode(&tp->flags, 1, out + 53);
    out[55] = '\0';
}

/* ---------------------------------------------------------------- time */

uint64_t pdgw_time_mono_ns(void)
{
    return pdb_clock_mono_ns();
}

uint64_t pdgw_time_mono_us(void)
{
    return pdgw_time_mono_ns() / 1000u;
}

uint64_t pdgw_time_mono_ms(void)
{
    return pdgw_time_mono_ns() / 1000000u;
}

double pdgw_time_mono_sec(void)
{
    return (double)pdgw_time_mono_ns() / 1e9;
}

uint64_t pdgw_time_real_ns(void)
{
    return pdb_clock_real_ns();
}

size_t pdgw_time_format_rfc3339(uint64_t real_ns, char *out, size_t out_len)
{
    if (real_ns == 0)
        real_ns = pdgw_time_real_ns();
    time_t sec = (time_t)(real_ns / 1000000000u);
    unsigned ms = (unsigned)((real_ns / 1000000u) % 1000u);
    struct tm tm;
    gmtime_r(&sec, &tm);
    int n = snprintf(out, out_len, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
    if (n < 0)
        return 0;
    return (size_t)n < out_len ? (size_t)n : (out_len > 0 ? out_len - 1 : 0);
}

/* ---------------------------------------------------------------- parsing */

/* Skip blanks. */
static const char *skip_ws(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/*
 * Parse an unsigned decimal number with an optional fraction ("12", "1.5", ".5" refused)
 * into *v. Returns a pointer after it, NULL if there is no number.
 */
static const char *parse_unsigned_decimal(const char *s, double *v)
{
    if (!isdigit((unsigned char)*s))
        return NULL;
    double x = 0;
    while (isdigit((unsigned char)*s)) {
        x = x * 10 + (*s - '0');
        s++;
    }
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return NULL;
        double scale = 0.1;
        while (isdigit((unsigned char)*s)) {
            x += (*s - '0') * scale;
            scale /= 10;
            s++;
        }
    }
    *v = x;
    return s;
}

pdgw_status_t pdgw_duration_parse(const char *s, uint64_t *ms_out)
{
    if (s == NULL)
        return PDGW_ERR_PARSE;
    double v;
    const char *p = parse_unsigned_decimal(skip_ws(s), &v);
    if (p == NULL)
        return PDGW_ERR_PARSE;
    p = skip_ws(p);
    double mult;
    size_t ulen;
    if (strncmp(p, "ms", 2) == 0) {
        mult = 1;
        ulen = 2;
    } else if (*p == 's') {
        mult = 1000;
        ulen = 1;
    } else if (*p == 'm') {
        mult = 60000;
        ulen = 1;
    } else if (*p == 'h') {
        mult = 3600000;
        ulen = 1;
    } else {
        mult = 1000; /* plain seconds */
        ulen = 0;
    }
    p = skip_ws(p + ulen);
    if (*p != '\0')
        return PDGW_ERR_PARSE;
    double ms = v * mult;
    if (!(ms < 9.2e18)) /* llround's long long ends at 2^63 */
        return PDGW_ERR_PARSE;
    *ms_out = (uint64_t)llround(ms);
    return PDGW_OK;
}

size_t pdgw_duration_format(uint64_t ms, char *out, size_t out_len)
{
    int n;
    if (ms != 0 && ms % 3600000u == 0)
        n = snprintf(out, out_len, "%" PRIu64 "h", ms / 3600000u);
    else if (ms != 0 && ms % 60000u == 0)
        n = snprintf(out, out_len, "%" PRIu64 "m", ms / 60000u);
    else if (ms % 1000u == 0)
        n = snprintf(out, out_len, "%" PRIu64 "s", ms / 1000u);
    else
        n = snprintf(out, out_len, "%" PRIu64 "ms", ms);
    return n < 0 ? 0 : (size_t)n;
}

pdgw_status_t pdgw_size_parse(const char *s, uint64_t *bytes_out)
{
    if (s == NULL)
        return PDGW_ERR_PARSE;
    s = skip_ws(s);
    const char *p = s;
    while (isdigit((unsigned char)*p))
        p++;
    if (p == s)
        return PDGW_ERR_PARSE;
    bool has_frac = (*p == '.');
    double v;
    const char *after = parse_unsigned_decimal(s, &v);
    if (after == NULL)
        return PDGW_ERR_PARSE;
    p = skip_ws(after);
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"b", 1},
        {"k", 1e3},
        {"kb", 1e3},
        {"kib", 1024.0},
        {"m", 1e6},
        {"mb", 1e6},
        {"mib", 1048576.0},
        {"g", 1e9},
        {"gb", 1e9},
        {"gib", 1073741824.0},
        {"t", 1e12},
        {"tb", 1e12},
        {"tib", 1099511627776.0},
    };
    size_t ulen = 0;
    while (isalpha((unsigned char)p[ulen]))
        ulen++;
    const char *end = skip_ws(p + ulen);
    if (*end != '\0')
        return PDGW_ERR_PARSE;
    if (ulen == 0) {
        if (has_frac)
            return PDGW_ERR_PARSE;
        /* Exact integer path, no double rounding for large byte counts. */
        errno = 0;
        char *e;
        unsigned long long x = strtoull(s, &e, 10);
        if (errno == ERANGE)
            return PDGW_ERR_TOO_LARGE;
        *bytes_out = x;
        return PDGW_OK;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strlen(units[i].unit) == ulen && strncasecmp(p, units[i].unit, ulen) == 0) {
            double b = v * units[i].mult;
            if (!(b < 1.8e19))
                return PDGW_ERR_TOO_LARGE;
            *bytes_out = (uint64_t)llround(b);
            return PDGW_OK;
        }
    }
    return PDGW_ERR_PARSE;
}

size_t pdgw_size_format(uint64_t bytes, char *out, size_t out_len)
{
    static const char *const names[] = {"TiB", "GiB", "MiB", "KiB"};
    static const uint64_t mults[] = {1ull << 40, 1ull << 30, 1ull << 20, 1ull << 10};
    int n = -1;
    for (int i = 0; i < 4 && bytes != 0; i++) {
        if (bytes % mults[i] == 0) {
            n = snprintf(out, out_len, "%" PRIu64 "%s", bytes / mults[i], names[i]);
            break;
        }
    }
    if (n < 0)
        n = snprintf(out, out_len, "%" PRIu64, bytes);
    return n < 0 ? 0 : (size_t)n;
}

pdgw_status_t pdgw_int_parse(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (s == NULL)
        return PDGW_ERR_PARSE;
    s = skip_ws(s);
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (!isdigit((unsigned char)*p))
        return PDGW_ERR_PARSE;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*skip_ws(end) != '\0')
        return PDGW_ERR_PARSE;
    if (errno == ERANGE || v < min || v > max)
        return PDGW_ERR_INVALID;
    *out = v;
    return PDGW_OK;
}

pdgw_status_t pdgw_bool_parse(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    if (s == NULL)
        return PDGW_ERR_PARSE;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return PDGW_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return PDGW_OK;
        }
    }
    return PDGW_ERR_PARSE;
}

pdgw_status_t pdgw_hostport_parse(const char *s, bool allow_port0, char *host_out, size_t host_len,
                                  int *port_out)
{
    if (s == NULL || host_len == 0)
        return PDGW_ERR_PARSE;
    const char *host, *host_end, *colon;
    if (s[0] == '[') {
        host = s + 1;
        host_end = strchr(host, ']');
        if (host_end == NULL || host_end == host || host_end[1] != ':')
            return PDGW_ERR_PARSE;
        colon = host_end + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL)
            return PDGW_ERR_PARSE;
        host = s;
        host_end = colon;
        if (memchr(host, ':', (size_t)(host_end - host)) != NULL)
            return PDGW_ERR_PARSE; /* bare IPv6 needs brackets */
    }
    for (const char *c = host; c < host_end; c++) {
        if (isspace((unsigned char)*c) || *c == '/' || *c == '@')
            return PDGW_ERR_PARSE;
    }
    const char *ps = colon + 1;
    size_t plen = strlen(ps);
    if (plen == 0 || plen > 5 || strspn(ps, "0123456789") != plen)
        return PDGW_ERR_PARSE;
    long port = strtol(ps, NULL, 10);
    if (port > 65535 || port < (allow_port0 ? 0 : 1))
        return PDGW_ERR_INVALID;
    size_t hl = (size_t)(host_end - host);
    if (hl >= host_len)
        return PDGW_ERR_PARSE;
    memcpy(host_out, host, hl);
    host_out[hl] = '\0';
    *port_out = (int)port;
    return PDGW_OK;
}

pdgw_status_t pdgw_url_parse(const char *s, pdgw_url_t *out)
{
    pdgw_url_t u;
    memset(&u, 0, sizeof(u));
    const char *rest;
    if (s == NULL)
        return PDGW_ERR_PARSE;
    if (strncasecmp(s, "http://", 7) == 0) {
        strcpy(u.scheme, "http");
        u.port = 80;
        rest = s + 7;
    } else if (strncasecmp(s, "https://", 8) == 0) {
        strcpy(u.scheme, "https");
        u.port = 443;
        rest = s + 8;
    } else {
        return PDGW_ERR_PARSE;
    }
    size_t auth_len = strcspn(rest, "/?#");
    const char *path = rest + auth_len;
    if (auth_len == 0 || memchr(rest, '@', auth_len) != NULL)
        return PDGW_ERR_PARSE;
    char authority[300];
    if (auth_len >= sizeof(authority))
        return PDGW_ERR_PARSE;
    memcpy(authority, rest, auth_len);
    authority[auth_len] = '\0';
    const char *close = strchr(authority, ']');
    const char *last_colon = strrchr(authority, ':');
    bool has_port = last_colon != NULL && (authority[0] != '[' || (close && last_colon > close));
    if (has_port) {
        int port;
        if (pdgw_hostport_parse(authority, false, u.host, sizeof(u.host), &port) != PDGW_OK)
            return PDGW_ERR_PARSE;
        u.port = port;
    } else {
        const char *h = authority;
        size_t hl = auth_len;
        if (authority[0] == '[') {
            if (close == NULL || close[1] != '\0')
                return PDGW_ERR_PARSE;
            h = authority + 1;
            hl = (size_t)(close - h);
        }
        if (hl == 0 || hl >= sizeof(u.host))
            return PDGW_ERR_PARSE;
        memcpy(u.host, h, hl);
        u.host[hl] = '\0';
    }
    if (u.host[0] == '\0')
        return PDGW_ERR_PARSE;
    for (const char *c = u.host; *c; c++) {
        if (isspace((unsigned char)*c))
            return PDGW_ERR_PARSE;
    }
    size_t pl = strcspn(path, "?#");
    if (pl >= sizeof(u.path))
        return PDGW_ERR_PARSE;
    memcpy(u.path, path, pl);
    u.path[pl] = '\0';
    *out = u;
    return PDGW_OK;
}

char *pdgw_file_read_all(const char *path, size_t max, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (f == NULL)
        return NULL;
    for (;;) {
        size_t n;
        if (cap - len < 4096) {
            char *nb;
            cap = cap ? cap * 2 : 8192;
            nb = realloc(buf, cap + 1);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len > max) {
            free(buf);
            fclose(f);
            errno = EFBIG;
            return NULL;
        }
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        errno = EIO;
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    *len_out = len;
    return buf;
}
