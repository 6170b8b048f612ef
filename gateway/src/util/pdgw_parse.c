/*
 * pdgw_parse.c - parsing and formatting of configuration values: durations, sizes, integers,
 * booleans, host:port and URLs.
 * Declared in pdgw_util.h.
 */
#include "pdgw_util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
