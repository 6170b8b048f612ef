/*
 * pdq_store_url.c - parse redis://[user:password@]HOST:PORT/DB (and rediss://).
 *
 * The URL comes from configuration: every malformed part gets its own message and nothing
 * is read past the string. Percent-escapes are not decoded (a password with '@' or '/' does
 * not fit this form; the error says where parsing stopped).
 */
#include <stdio.h>
#include <string.h>

#include "pdq_redis_conn.h"
#include "pdquota/pdq_store_url.h"

#define DEFAULT_PORT 6379

static pdq_status_t fail(char *err, size_t errlen, const char *url, const char *why)
{
    if (err && errlen)
        snprintf(err, errlen,
                 "quota_store: %s in \"%.80s\" (want redis://[user:password@]"
                 "HOST:PORT/DB)",
                 why, url);
    return PDQ_ERR_INVALID;
}

static bool copy_part(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

static bool parse_uint(const char *s, size_t n, unsigned long max, unsigned long *out)
{
    if (n == 0 || n > 10)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

pdq_status_t pdq_store_url_parse(const char *url, pdq_store_url_t *out, char *err, size_t errlen)
{
    if (url == NULL)
        return fail(err, errlen, "", "no URL");
    pdq_store_url_t u = {.port = DEFAULT_PORT};
    const char *p;
    if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    } else if (strncmp(url, "rediss://", 9) == 0) {
        p = url + 9;
        u.tls = true;
    } else {
        return fail(err, errlen, url, "scheme must be redis:// or rediss://");
    }
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f)
            return fail(err, errlen, url, "blank or control character");
    size_t auth_end = strcspn(p, "/@");
    if (p[auth_end] == '@') {
        size_t colon = strcspn(p, ":@");
        if (p[colon] == ':') {
            if (!copy_part(u.user, sizeof(u.user), p, colon) ||
                !copy_part(u.password, sizeof(u.password), p + colon + 1, auth_end - colon - 1))
                return fail(err, errlen, url, "user or password too long");
        } else if (!copy_part(u.password, sizeof(u.password), p, auth_end)) {
            return fail(err, errlen, url, "password too long"); /* redis://secret@host */
        }
        p += auth_end + 1;
    }
    size_t host_end;
    const char *host = p;
    size_t host_len;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (close == NULL)
            return fail(err, errlen, url, "unclosed '[' in the host");
        host = p + 1;
        host_len = (size_t)(close - host);
        host_end = (size_t)(close - p) + 1;
    } else {
        host_end = strcspn(p, ":/");
        host_len = host_end;
    }
    if (host_len == 0)
        return fail(err, errlen, url, "no host");
    if (!copy_part(u.host, sizeof(u.host), host, host_len))
        return fail(err, errlen, url, "host too long");
    p += host_end;
    if (*p == ':') {
        p++;
        size_t n = strcspn(p, "/");
        unsigned long port;
        if (!parse_uint(p, n, 65535, &port) || port == 0)
            return fail(err, errlen, url, "port must be 1-65535");
        u.port = (uint16_t)port;
        p += n;
    }
    if (*p == '/') {
        p++;
        if (*p != '\0') {
            unsigned long db;
            if (!parse_uint(p, strlen(p), 1000000, &db))
                return fail(err, errlen, url, "database must be a number");
            u.db = (unsigned)db;
            p += strlen(p);
        }
    }
    if (*p != '\0')
        return fail(err, errlen, url, "unexpected text after the host");
    *out = u;
    return PDQ_OK;
}

bool pdq_store_tls_supported(void)
{
    return pdq_rtls_available();
}
