/*
 * pdgw_path.c - the routing path of a request and the upstream target built from it
 * (pdgw_path.h). Both front ends hand the raw path here, so both decode alike.
 */
#include "pdgw_path.h"

#include <stdbool.h>
#include <string.h>

#include "pdb/pdb_hex.h"

/* Escapes kept as they came: decoding them would move a segment boundary (%2F), start a
 * query (%3F) or make a later decoder see an escape that the client did not send (%25). */
static bool escape_kept(int c)
{
    return c == '/' || c == '?' || c == '%';
}

/* The escape at <s> ("%hh"), or -1. */
static int escape_at(const char *s)
{
    int hi, lo;
    if (s[0] != '%' || (hi = pdb_hex_val(s[1])) < 0 || (lo = pdb_hex_val(s[2])) < 0)
        return -1;
    return hi * 16 + lo;
}

/* Is the segment <s, n> ".."? */
static bool dot_dot(const char *s, size_t n)
{
    return n == 2 && s[0] == '.' && s[1] == '.';
}

/* Refuse a ".." segment of the decoded <p>: segments end at '/' and at a kept "%2F". */
static bool has_dot_dot(const char *p)
{
    const char *seg = p;
    for (;;) {
        int e = *p == '%' ? escape_at(p) : -1;
        if (*p == '\0' || *p == '/' || e == '/') {
            if (dot_dot(seg, (size_t)(p - seg)))
                return true;
            if (*p == '\0')
                return false;
            p += *p == '/' ? 1 : 3;
            seg = p;
        } else {
            p++;
        }
    }
}

static int refuse(const char **why, const char *text, int status)
{
    *why = text;
    return status;
}

int pdgw_path_clean(const char *raw, char *out, size_t cap, const char **why)
{
    size_t n = 0;
    const char *s;
    if (cap == 0)
        return refuse(why, "request path too long", 414);
    for (s = raw; *s; s++) {
        int c = escape_at(s);
        if (c >= 0 && !escape_kept(c)) {
            s += 2;
        } else if (c >= 0) {
            if (n + 3 >= cap)
                return refuse(why, "request path too long", 414);
            memcpy(out + n, s, 3);
            n += 3;
            s += 2;
            continue;
        } else if (*s == '%' || *s == '?') {
            /* A '%' that starts no escape is kept as one, so that the routing path holds a
             * '%' only as the start of an escape; a '?' (the front ends split the query off
             * before, so only a caller's own) as the escape it would go upstream as. */
            if (n + 3 >= cap)
                return refuse(why, "request path too long", 414);
            memcpy(out + n, *s == '%' ? "%25" : "%3F", 3);
            n += 3;
            continue;
        } else {
            c = (unsigned char)*s;
        }
        if (c <= 0x20 || c == 0x7f)
            return refuse(why, "control character or space in the request path", 400);
        if (n + 1 >= cap)
            return refuse(why, "request path too long", 414);
        out[n++] = (char)c;
    }
    out[n] = '\0';
    if (has_dot_dot(out))
        return refuse(why, "'..' segment in the request path", 400);
    return 0;
}

/* RFC 3986 3.3: pchar = unreserved / pct-encoded / sub-delims / ":" / "@". */
static bool pchar_plain(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("-._~!$&'()*+,;=:@/", c) != NULL;
}

pdgw_status_t pdgw_path_encode(pdgw_buf_t *out, const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    const char *s;
    for (s = path; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[3];
        pdgw_status_t st;
        if (c == '%' && escape_at(s) >= 0) {
            st = pdgw_buf_append(out, s, 3);
            s += 2;
        } else if (c != '\0' && pchar_plain(c)) {
            st = pdgw_buf_append_char(out, (char)c);
        } else {
            esc[0] = '%';
            esc[1] = hex[c >> 4];
            esc[2] = hex[c & 15];
            st = pdgw_buf_append(out, esc, 3);
        }
        if (st != PDGW_OK)
            return st;
    }
    return PDGW_OK;
}
