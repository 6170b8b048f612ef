/*
 * pdgw_upstream_h1_parse.c - incremental HTTP/1.1 response parser (RFC 9112) for the native
 * upstream client.
 *
 * The caller owns the bytes: the parser consumes whole lines and body spans from the front of
 * the caller's buffer and leaves an incomplete line there, so nothing is copied and a response
 * cut at any byte parses the same as one read whole. Lines may end in CRLF or a bare LF
 * (RFC 9112 2.2 lets a recipient accept the latter). Body length (RFC 9112 6.3): no body for
 * HEAD, 1xx, 204 and 304; else chunked when Transfer-Encoding ends in chunked; else the
 * body runs to close when Transfer-Encoding is present otherwise; else Content-Length; else
 * to close. Anything ambiguous (conflicting lengths, obs-fold, a bad chunk size) is refused:
 * a gateway must not guess where a response ends.
 */
#include "pdgw_upstream_h1.h"

#include <string.h>
#include <strings.h>

#include "pdb/pdb_swar.h"

#define MAX_CHUNK_LINE 4096u /* chunk size plus extensions */

void pdgw_h1p_init(pdgw_h1p_t *p, bool head_request)
{
    memset(p, 0, sizeof(*p));
    p->no_body = head_request;
    p->content_length = -1;
}

void pdgw_h1p_init_body(pdgw_h1p_t *p, bool chunked, uint64_t length)
{
    pdgw_h1p_init(p, false);
    p->chunked = chunked;
    if (chunked) {
        p->state = PDGW_H1P_CHUNK_SIZE;
    } else {
        p->content_length = (int64_t)length;
        p->remaining = length;
        p->state = length > 0 ? PDGW_H1P_BODY_LENGTH : PDGW_H1P_DONE;
    }
}

static long fail(pdgw_h1p_t *p, const char *why)
{
    p->state = PDGW_H1P_ERROR;
    p->err = why;
    return -1;
}

/* The next line in <buf, len>: its length with the line end, and without it in *text_len.
 * 0 when no line end is there yet. */
static size_t next_line(const char *buf, size_t len, size_t *text_len)
{
    const char *nl = memchr(buf, '\n', len);
    size_t n;
    if (nl == NULL)
        return 0;
    n = (size_t)(nl - buf);
    *text_len = n > 0 && buf[n - 1] == '\r' ? n - 1 : n;
    return n + 1;
}

/* RFC 9110 5.6.2 tchar: letters, digits and !#$%&'*+-.^_`|~ (a table: every byte of every
 * header name is looked up). */
const unsigned char pdgw_h1_tchar[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

/* Does the comma-separated header value hold <token> (any case)? */
bool pdgw_h1_list_has(const char *v, size_t n, const char *token)
{
    size_t tl = strlen(token), i = 0;
    while (i < n) {
        size_t s, e;
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        s = i;
        while (i < n && v[i] != ',')
            i++;
        e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - s == tl && strncasecmp(v + s, token, tl) == 0)
            return true;
    }
    return false;
}

/* Is the last element of a Transfer-Encoding list "chunked"? */
bool pdgw_h1_list_last_is(const char *v, size_t n, const char *token)
{
    size_t tl = strlen(token), e = n, s;
    while (e > 0 && (v[e - 1] == ' ' || v[e - 1] == '\t' || v[e - 1] == ','))
        e--;
    s = e;
    while (s > 0 && v[s - 1] != ',')
        s--;
    while (s < e && (v[s] == ' ' || v[s] == '\t'))
        s++;
    return e - s == tl && strncasecmp(v + s, token, tl) == 0;
}

/* Content-Length: digits, or a list of equal values (RFC 9110 8.6). */
bool pdgw_h1_parse_length(const char *v, size_t n, int64_t *out)
{
    int64_t first = -1;
    size_t i = 0;
    while (i < n) {
        uint64_t x = 0;
        size_t d = 0;
        while (i < n && (v[i] == ' ' || v[i] == '\t'))
            i++;
        while (i < n && v[i] >= '0' && v[i] <= '9') {
            if (x > (uint64_t)INT64_MAX / 10 - 1)
                return false;
            x = x * 10 + (uint64_t)(v[i] - '0');
            i++;
            d++;
        }
        while (i < n && (v[i] == ' ' || v[i] == '\t'))
            i++;
        if (d == 0 || (i < n && v[i] != ','))
            return false;
        if (first >= 0 && (int64_t)x != first)
            return false;
        first = (int64_t)x;
        if (i < n)
            i++; /* the comma */
    }
    if (first < 0)
        return false;
    *out = first;
    return true;
}

static long status_line(pdgw_h1p_t *p, const char *s, size_t n)
{
    int code;
    if (n < 12 || memcmp(s, "HTTP/1.", 7) != 0 || s[7] < '0' || s[7] > '9' || s[8] != ' ')
        return fail(p, "malformed status line");
    if (s[9] < '1' || s[9] > '9' || s[10] < '0' || s[10] > '9' || s[11] < '0' || s[11] > '9')
        return fail(p, "malformed status code");
    if (n > 12 && s[12] != ' ')
        return fail(p, "malformed status line");
    code = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    p->version_minor = s[7] - '0';
    p->status = code;
    p->keep_alive = p->version_minor >= 1;
    p->chunked = p->has_te = false;
    p->content_length = -1;
    return 0;
}

/* A NUL or CR in the <n> bytes at <v> (eight at a time: every header value is scanned). */
static bool has_nul_or_cr(const char *v, size_t n)
{
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        uint64_t x = pdb_swar_load(v + i);
        if ((pdb_swar_eq(x, '\0') | pdb_swar_eq(x, '\r')) != 0)
            return true;
    }
    for (; i < n; i++)
        if (v[i] == '\0' || v[i] == '\r')
            return true;
    return false;
}

static long header_line(pdgw_h1p_t *p, const char *s, size_t n)
{
    const char *colon = memchr(s, ':', n), *v;
    size_t name_len, vn, i;
    if (s[0] == ' ' || s[0] == '\t')
        return fail(p, "obsolete line folding in a header");
    if (colon == NULL || colon == s)
        return fail(p, "malformed header line");
    name_len = (size_t)(colon - s);
    for (i = 0; i < name_len; i++)
        if (!pdgw_h1_is_tchar((unsigned char)s[i]))
            return fail(p, "malformed header name");
    v = colon + 1;
    vn = n - name_len - 1;
    while (vn > 0 && (*v == ' ' || *v == '\t'))
        v++, vn--;
    while (vn > 0 && (v[vn - 1] == ' ' || v[vn - 1] == '\t'))
        vn--;
    if (has_nul_or_cr(v, vn))
        return fail(p, "control character in a header value");
    if (name_len == 14 && strncasecmp(s, "content-length", 14) == 0) {
        int64_t cl;
        if (!pdgw_h1_parse_length(v, vn, &cl))
            return fail(p, "invalid Content-Length");
        if (p->content_length >= 0 && p->content_length != cl)
            return fail(p, "conflicting Content-Length headers");
        p->content_length = cl;
    } else if (name_len == 17 && strncasecmp(s, "transfer-encoding", 17) == 0) {
        /* Several fields form one list: the last coding of the last field decides. */
        p->has_te = true;
        p->chunked = pdgw_h1_list_last_is(v, vn, "chunked");
    } else if (name_len == 10 && strncasecmp(s, "connection", 10) == 0) {
        if (pdgw_h1_list_has(v, vn, "close"))
            p->keep_alive = false;
        else if (pdgw_h1_list_has(v, vn, "keep-alive") && p->version_minor == 0)
            p->keep_alive = true;
    }
    return 0;
}

/* The head is complete: decide how the body is delimited. */
static long headers_done(pdgw_h1p_t *p)
{
    int s = p->status;
    if (p->no_body || s == 204 || s == 304 || (s >= 100 && s < 200)) {
        p->state = PDGW_H1P_DONE;
    } else if (p->has_te) {
        /* Transfer-Encoding overrides Content-Length; such a response is a smuggling risk,
         * the connection is not used again (RFC 9112 6.3 item 3). */
        if (p->content_length >= 0)
            p->keep_alive = false;
        if (p->chunked) {
            p->state = PDGW_H1P_CHUNK_SIZE;
        } else {
            p->state = PDGW_H1P_BODY_CLOSE;
            p->keep_alive = false;
        }
    } else if (p->content_length >= 0) {
        p->remaining = (uint64_t)p->content_length;
        p->state = p->remaining > 0 ? PDGW_H1P_BODY_LENGTH : PDGW_H1P_DONE;
    } else {
        p->state = PDGW_H1P_BODY_CLOSE;
        p->keep_alive = false;
    }
    return 0;
}

static long chunk_size_line(pdgw_h1p_t *p, const char *s, size_t n)
{
    uint64_t x = 0;
    size_t i = 0, digits = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            break;
        if (x >> 59)
            return fail(p, "chunk size too large");
        x = x * 16 + d;
        digits++;
        i++;
    }
    if (digits == 0)
        return fail(p, "malformed chunk size");
    /* Chunk extensions (";name=value") carry nothing for us; only their shape is checked. */
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (i < n && s[i] != ';')
        return fail(p, "malformed chunk size");
    for (; i < n; i++)
        if (s[i] == '\0' || s[i] == '\r')
            return fail(p, "control character in a chunk extension");
    p->remaining = x;
    p->state = x > 0 ? PDGW_H1P_CHUNK_DATA : PDGW_H1P_TRAILERS;
    return 0;
}

long pdgw_h1p_feed(pdgw_h1p_t *p, const char *buf, size_t len, const pdgw_h1p_cb_t *cb, void *arg)
{
    size_t off = 0;
    while (off < len) {
        const char *s = buf + off;
        size_t avail = len - off, ll, tl;
        switch (p->state) {
        case PDGW_H1P_STATUS:
        case PDGW_H1P_HEADERS:
        case PDGW_H1P_TRAILERS:
            ll = next_line(s, avail, &tl);
            if (ll == 0) {
                if (p->header_bytes + avail > PDGW_H1P_MAX_HEAD)
                    return fail(p, "response head too large");
                return (long)off;
            }
            p->header_bytes += ll;
            if (p->header_bytes > PDGW_H1P_MAX_HEAD)
                return fail(p, "response head too large");
            if (p->state == PDGW_H1P_TRAILERS) {
                off += ll;
                if (tl == 0) {
                    p->state = PDGW_H1P_DONE;
                    return (long)off;
                }
                /* Trailer fields are checked for shape and dropped (nothing uses them). */
                if (memchr(s, ':', tl) == NULL || s[0] == ' ' || s[0] == '\t')
                    return fail(p, "malformed trailer line");
                continue;
            }
            if (p->state == PDGW_H1P_STATUS) {
                if (tl == 0) {
                    /* Empty lines before the status line (RFC 9112 2.2: ignore them). */
                    off += ll;
                    continue;
                }
                if (status_line(p, s, tl) < 0)
                    return -1;
                p->state = PDGW_H1P_HEADERS;
            } else if (tl == 0) {
                off += ll;
                p->header_bytes = 0;
                if (p->status >= 100 && p->status < 200) {
                    if (p->status == 101)
                        return fail(p, "unexpected protocol switch");
                    p->state = PDGW_H1P_STATUS; /* informational: the real one follows */
                    continue;
                }
                if (headers_done(p) < 0)
                    return -1;
                if (cb->on_headers_done && cb->on_headers_done(arg, p->status) != 0)
                    return fail(p, "aborted");
                if (p->state == PDGW_H1P_DONE)
                    return (long)off;
                continue;
            } else if (header_line(p, s, tl) < 0) {
                return -1;
            }
            if (cb->on_header && cb->on_header(arg, s, ll) != 0)
                return fail(p, "aborted");
            off += ll;
            break;
        case PDGW_H1P_CHUNK_SIZE:
            ll = next_line(s, avail, &tl);
            if (ll == 0) {
                if (avail > MAX_CHUNK_LINE)
                    return fail(p, "chunk size line too long");
                return (long)off;
            }
            if (ll > MAX_CHUNK_LINE)
                return fail(p, "chunk size line too long");
            if (chunk_size_line(p, s, tl) < 0)
                return -1;
            off += ll;
            break;
        case PDGW_H1P_CHUNK_CRLF:
            if (s[0] == '\n') {
                off += 1;
            } else if (s[0] == '\r') {
                if (avail < 2)
                    return (long)off;
                if (s[1] != '\n')
                    return fail(p, "chunk data not followed by a line end");
                off += 2;
            } else {
                return fail(p, "chunk data longer than its size");
            }
            p->state = PDGW_H1P_CHUNK_SIZE;
            break;
        case PDGW_H1P_BODY_LENGTH:
        case PDGW_H1P_CHUNK_DATA:
        case PDGW_H1P_BODY_CLOSE: {
            size_t n = avail;
            int rc;
            if (p->state != PDGW_H1P_BODY_CLOSE && (uint64_t)n > p->remaining)
                n = (size_t)p->remaining;
            rc = cb->on_body ? cb->on_body(arg, s, n) : PDGW_H1_BODY_OK;
            if (rc == PDGW_H1_BODY_PAUSE)
                return (long)off;
            if (rc != PDGW_H1_BODY_OK)
                return fail(p, "aborted");
            off += n;
            if (p->state == PDGW_H1P_BODY_CLOSE)
                break;
            p->remaining -= n;
            if (p->remaining == 0) {
                if (p->state == PDGW_H1P_BODY_LENGTH) {
                    p->state = PDGW_H1P_DONE;
                    return (long)off;
                }
                p->state = PDGW_H1P_CHUNK_CRLF;
            }
            break;
        }
        case PDGW_H1P_DONE:
            return (long)off;
        default:
            return -1;
        }
    }
    return (long)off;
}

bool pdgw_h1p_eof(pdgw_h1p_t *p)
{
    switch (p->state) {
    case PDGW_H1P_BODY_CLOSE:
        p->state = PDGW_H1P_DONE;
        return true;
    case PDGW_H1P_DONE:
        return true;
    case PDGW_H1P_STATUS:
    case PDGW_H1P_HEADERS:
        p->err = "connection closed before the response head was complete";
        break;
    case PDGW_H1P_ERROR:
        break;
    default:
        p->err = "connection closed inside the response body";
        break;
    }
    return false;
}
