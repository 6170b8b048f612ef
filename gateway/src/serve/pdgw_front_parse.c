/*
 * pdgw_front_parse.c - the native front end's request head (RFC 9112 sections 2 to 7).
 *
 * The head is parsed only once it is complete, from a copy the request keeps: names and
 * values become NUL-terminated strings in place, so a lookup is a compare and nothing else
 * is allocated. What a proxy in front of pdgw could read differently is refused rather than
 * guessed: obs-fold, whitespace before a colon, control characters, a bare CR, a Transfer-
 * Encoding other than chunked alone, a missing or repeated Host on HTTP/1.1. A repeated
 * Content-Length, or one with Transfer-Encoding, is left to the request path, which refuses
 * it the same way for either front end (pdgw_http.c).
 */
#include "pdgw_front.h"

#include <string.h>
#include <strings.h>

#include "pdb/pdb_hex.h"
#include "pdb/pdb_swar.h"
#include "pdgw_upstream_h1.h"

size_t pdgw_front_head_end(const char *buf, size_t len, size_t from)
{
    size_t i = from >= 3 ? from - 3 : 0; /* an end may straddle the previous search */
    while (i < len) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t at;
        if (nl == NULL)
            return 0;
        at = (size_t)(nl - buf) + 1; /* just past this line's end */
        if (at < len && buf[at] == '\n')
            return at + 1;
        if (at + 1 < len && buf[at] == '\r' && buf[at + 1] == '\n')
            return at + 2;
        i = at;
    }
    return 0;
}

static int refuse(const char **why, const char *reason, int status)
{
    *why = reason;
    return status;
}

/* The line at <*pos>: its start, with the line end cut (NUL written where it began); NULL at
 * the end of <len>. A CR anywhere but before the LF fails (*bad). */
static char *take_line(char *t, size_t len, size_t *pos, size_t *line_len, bool *bad)
{
    char *s = t + *pos, *nl;
    size_t n;
    if (*pos >= len)
        return NULL;
    nl = memchr(s, '\n', len - *pos);
    if (nl == NULL)
        return NULL;
    n = (size_t)(nl - s);
    *pos += n + 1;
    if (n > 0 && s[n - 1] == '\r')
        n--;
    if (memchr(s, '\r', n) != NULL)
        *bad = true;
    s[n] = '\0';
    *line_len = n;
    return s;
}

/* A control byte other than tab, or DEL, in the <n> bytes at <v>. Every header value is
 * scanned: eight bytes at a time, a word with a byte below 0x20 (a tab, most likely) looked
 * at byte by byte. */
static bool has_control(const char *v, size_t n)
{
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        uint64_t x = pdb_swar_load(v + i);
        if ((pdb_swar_below(x, 0x20) | pdb_swar_eq(x, 0x7f)) != 0)
            break;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return true;
    }
    return false;
}

/* Does <s> hold an escape of a control byte or a space? The path stays encoded (the request
 * path decodes it, pdgw_path.c); such a path is refused here already, before anything reads
 * it. */
static bool escapes_control(const char *s)
{
    for (s = strchr(s, '%'); s != NULL; s = strchr(s + 1, '%')) {
        int hi = pdb_hex_val(s[1]), lo = hi >= 0 ? pdb_hex_val(s[2]) : -1;
        if (lo >= 0 && (hi * 16 + lo <= 0x20 || hi * 16 + lo == 0x7f))
            return true;
    }
    return false;
}

/* Method, target and version of the request line <s, n>. */
static int request_line(char *s, size_t n, pdgw_front_head_t *h, const char **why)
{
    char *sp1, *sp2, *target, *q;
    size_t i;
    sp1 = memchr(s, ' ', n);
    if (sp1 == NULL || sp1 == s)
        return refuse(why, "malformed request line", 400);
    for (i = 0; s + i < sp1; i++)
        if (!pdgw_h1_is_tchar((unsigned char)s[i]))
            return refuse(why, "malformed method", 400);
    target = sp1 + 1;
    sp2 = memchr(target, ' ', n - (size_t)(target - s));
    if (sp2 == NULL || sp2 == target)
        return refuse(why, "malformed request line", 400);
    for (i = 0; target + i < sp2; i++) {
        unsigned char c = (unsigned char)target[i];
        if (c <= 0x20 || c == 0x7f)
            return refuse(why, "malformed request target", 400);
    }
    {
        const char *v = sp2 + 1;
        if ((size_t)(s + n - v) != 8 || strncmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' ||
            v[6] != '.' || v[7] < '0' || v[7] > '9')
            return refuse(why, "malformed HTTP version", 400);
        if (v[5] != '1' || v[7] > '1')
            return refuse(why, "HTTP version not supported", 505);
    }
    h->version_minor = sp2[8] - '0';
    *sp1 = '\0';
    *sp2 = '\0';
    h->method = s;
    /* absolute-form (RFC 9112 3.2.2): the path after the authority */
    if (target[0] != '/' && /* origin-form, the usual one, is not tested further */
        (strncasecmp(target, "http://", 7) == 0 || strncasecmp(target, "https://", 8) == 0)) {
        char *slash = strchr(strchr(target, '/') + 2, '/');
        if (slash == NULL) {
            /* no path: the scheme's "//" is no longer needed, reuse its second slash */
            target = strchr(target, '/') + 1;
            target[1] = '\0';
        } else {
            target = slash;
        }
    } else if (target[0] != '/' && strcmp(target, "*") != 0) {
        return refuse(why, "malformed request target", 400);
    }
    q = strchr(target, '?');
    if (q != NULL) {
        *q = '\0';
        h->query = q + 1;
    }
    if (escapes_control(target))
        return refuse(why, "control character or space in the request path", 400);
    h->path = target;
    return 0;
}

/* One header field line <s, n>: name and value split in place. */
static int field_line(char *s, size_t n, pdgw_front_head_t *h, const char **why)
{
    char *colon, *v, *end;
    size_t i;
    if (s[0] == ' ' || s[0] == '\t')
        return refuse(why, "obsolete line folding", 400);
    colon = memchr(s, ':', n);
    if (colon == NULL || colon == s)
        return refuse(why, "malformed header line", 400);
    for (i = 0; s + i < colon; i++)
        if (!pdgw_h1_is_tchar((unsigned char)s[i]))
            return refuse(why, "malformed header name", 400);
    v = colon + 1;
    end = s + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (has_control(v, (size_t)(end - v)))
        return refuse(why, "control character in a header value", 400);
    if (h->n_headers == PDGW_FRONT_MAX_HEADERS)
        return refuse(why, "too many header fields", 431);
    *colon = '\0';
    *end = '\0';
    h->headers[h->n_headers].name = s;
    h->headers[h->n_headers].value = v;
    h->headers[h->n_headers].name_len = (size_t)(colon - s);
    h->name_lens |= 1ull << ((size_t)(colon - s) % 64);
    h->n_headers++;
    return 0;
}

/* What the framing and connection fields say, once all fields are in. */
static int head_semantics(pdgw_front_head_t *h, const char **why)
{
    unsigned hosts = 0, i;
    bool close = false, keep = false, te = false;
    for (i = 0; i < h->n_headers; i++) {
        const char *name = h->headers[i].name, *v = h->headers[i].value;
        size_t vn = strlen(v), nn = h->headers[i].name_len;
        switch (name[0] | 0x20) {
        case 'h':
            hosts += nn == 4 && strcasecmp(name, "Host") == 0;
            break;
        case 'c':
            if (nn == 10 && strcasecmp(name, "Connection") == 0) {
                close |= pdgw_h1_list_has(v, vn, "close");
                keep |= pdgw_h1_list_has(v, vn, "keep-alive");
            } else if (nn == 14 && strcasecmp(name, "Content-Length") == 0 && !h->has_length) {
                int64_t n;
                if (!pdgw_h1_parse_length(v, vn, &n))
                    return refuse(why, "malformed Content-Length", 400);
                h->has_length = true;
                h->content_length = (uint64_t)n;
            }
            break;
        case 't':
            if (nn == 17 && strcasecmp(name, "Transfer-Encoding") == 0) {
                if (te || !pdgw_h1_list_last_is(v, vn, "chunked"))
                    return refuse(why, "Transfer-Encoding does not end in chunked", 400);
                if (strcasecmp(v, "chunked") != 0)
                    return refuse(why, "transfer coding not implemented", 501);
                te = true;
            }
            break;
        case 'e':
            if (nn == 6 && strcasecmp(name, "Expect") == 0 && strcasecmp(v, "100-continue") == 0)
                h->expect_continue = h->version_minor == 1;
            break;
        default:
            break;
        }
    }
    if (h->version_minor == 1 ? hosts != 1 : hosts > 1)
        return refuse(why, hosts == 0 ? "missing Host" : "more than one Host", 400);
    if (te && h->version_minor == 0)
        return refuse(why, "Transfer-Encoding in an HTTP/1.0 request", 400);
    h->chunked = te;
    h->keep_alive = h->version_minor == 1 ? !close : keep && !close;
    return 0;
}

int pdgw_front_head_parse(char *text, size_t len, pdgw_front_head_t *h, const char **why)
{
    size_t pos = 0, n = 0;
    bool bad = false;
    char *line;
    int st;

    h->method = h->path = h->query = NULL;
    h->version_minor = 1;
    h->keep_alive = h->expect_continue = h->chunked = h->has_length = false;
    h->content_length = 0;
    h->n_headers = 0;
    h->name_lens = 0;
    *why = NULL;
    line = take_line(text, len, &pos, &n, &bad);
    if (line == NULL || bad)
        return refuse(why, "malformed request line", 400);
    if ((st = request_line(line, n, h, why)) != 0)
        return st;
    for (;;) {
        line = take_line(text, len, &pos, &n, &bad);
        if (line == NULL || bad)
            return refuse(why, "malformed header line", 400);
        if (n == 0)
            break;
        if ((st = field_line(line, n, h, why)) != 0)
            return st;
    }
    return head_semantics(h, why);
}

const char *pdgw_front_head_get(const pdgw_front_head_t *h, const char *name, size_t n)
{
    unsigned i;
    if ((h->name_lens & 1ull << (n % 64)) == 0)
        return NULL;
    for (i = 0; i < h->n_headers; i++)
        if (h->headers[i].name_len == n && strncasecmp(h->headers[i].name, name, n) == 0)
            return h->headers[i].value;
    return NULL;
}

char *pdgw_front_query_decode(const char *s, size_t n, char *out)
{
    size_t i;
    for (i = 0; i < n; i++) {
        int hi, lo;
        if (s[i] == '+') {
            *out++ = ' ';
        } else if (s[i] == '%' && i + 2 < n && (hi = pdb_hex_val(s[i + 1])) >= 0 &&
                   (lo = pdb_hex_val(s[i + 2])) >= 0) {
            *out++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *out++ = s[i];
        }
    }
    *out = '\0';
    return out;
}

void pdgw_front_query_each(const char *query, char *scratch,
                           bool (*fn)(void *arg, const char *name, const char *value), void *arg)
{
    const char *p = query;
    while (p != NULL && *p != '\0') {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        if (n > 0) {
            char *name = scratch, *value = NULL;
            if (eq != NULL) {
                value = pdgw_front_query_decode(p, (size_t)(eq - p), name) + 1;
                pdgw_front_query_decode(eq + 1, n - (size_t)(eq - p) - 1, value);
            } else {
                pdgw_front_query_decode(p, n, name);
            }
            if (!fn(arg, name, value))
                return;
        }
        p = amp ? amp + 1 : NULL;
    }
}
