/*
 * pdgw_sse.c - incremental SSE parser (see pdgw_sse.h).
 */
#include "pdgw_sse.h"

#include <string.h>

#define PDGW_SSE_DEFAULT_MAX (1u << 20)

void pdgw_sse_init(pdgw_sse_t *p)
{
    memset(p, 0, sizeof(*p));
}

void pdgw_sse_free(pdgw_sse_t *p)
{
    pdgw_buf_free(&p->buf);
    pdgw_buf_free(&p->data);
    memset(p, 0, sizeof(*p));
}

static void sse_event_reset(pdgw_sse_t *p)
{
    /* Released, not kept: a parked stream holds no buffer between events. */
    pdgw_buf_free(&p->data);
    p->event[0] = '\0';
    p->has_data = false;
    p->has_field = false;
}

/* One non-empty line of the current event. */
static pdgw_status_t sse_line(pdgw_sse_t *p, const char *line, size_t len)
{
    const char *colon;
    size_t name_len;
    const char *value;
    size_t value_len;

    if (line[0] == ':')
        return PDGW_OK; /* comment */
    p->has_field = true;
    colon = memchr(line, ':', len);
    if (colon) {
        name_len = (size_t)(colon - line);
        value = colon + 1;
        value_len = len - name_len - 1;
        if (value_len > 0 && value[0] == ' ') {
            value++;
            value_len--;
        }
    } else {
        name_len = len;
        value = line + len;
        value_len = 0;
    }
    if (name_len == 4 && memcmp(line, "data", 4) == 0) {
        pdgw_status_t st;
        if (p->has_data) {
            st = pdgw_buf_append_char(&p->data, '\n');
            if (st != PDGW_OK)
                return st;
        }
        st = pdgw_buf_append(&p->data, value, value_len);
        if (st != PDGW_OK)
            return st;
        p->has_data = true;
    } else if (name_len == 5 && memcmp(line, "event", 5) == 0) {
        size_t n = value_len < sizeof(p->event) - 1 ? value_len : sizeof(p->event) - 1;
        memcpy(p->event, value, n);
        p->event[n] = '\0';
    }
    return PDGW_OK;
}

/* Hand out the event that ends at base[end]; returns non-zero if the callback asked to stop. */
static int sse_dispatch(pdgw_sse_t *p, const char *base, size_t end, pdgw_sse_on_event_t cb,
                        void *arg)
{
    int stop = 0;
    if (p->has_field) {
        pdgw_sse_event_t ev;
        ev.raw = base + p->ev_start;
        ev.raw_len = end - p->ev_start;
        ev.data = p->data.data ? p->data.data : "";
        ev.data_len = p->data.len;
        ev.has_data = p->has_data;
        ev.is_done = p->has_data && ev.data_len == 6 && memcmp(ev.data, "[DONE]", 6) == 0;
        ev.event = p->event;
        stop = cb(arg, &ev);
    }
    p->ev_start = end;
    p->line_start = end;
    sse_event_reset(p);
    return stop;
}

/* Parse every complete line of base[0, len); <eof> makes a trailing CR a line end. Offsets
 * (ev_start, line_start, scan_pos) are relative to base. */
static pdgw_status_t sse_parse(pdgw_sse_t *p, const char *base, size_t len, bool eof,
                               pdgw_sse_on_event_t cb, void *arg)
{
    for (;;) {
        size_t i = p->scan_pos > p->line_start ? p->scan_pos : p->line_start;
        size_t eol_len;
        size_t line_len;

        while (i < len && base[i] != '\n' && base[i] != '\r')
            i++;
        p->scan_pos = i;
        if (i == len)
            return PDGW_OK; /* no line end yet */
        if (base[i] == '\r') {
            if (i + 1 == len && !eof)
                return PDGW_OK; /* CR at the end: an LF may follow in the next chunk */
            eol_len = (i + 1 < len && base[i + 1] == '\n') ? 2 : 1;
        } else {
            eol_len = 1;
        }
        line_len = i - p->line_start;
        if (line_len == 0) {
            if (sse_dispatch(p, base, i + eol_len, cb, arg))
                return PDGW_ERR_CANCELLED;
            continue;
        }
        {
            pdgw_status_t st = sse_line(p, base + p->line_start, line_len);
            if (st != PDGW_OK)
                return st;
        }
        p->line_start = i + eol_len;
    }
}

/* Make offsets relative to the start of the event not handed out yet. */
static void sse_rebase(pdgw_sse_t *p)
{
    p->line_start -= p->ev_start;
    p->scan_pos = p->scan_pos > p->ev_start ? p->scan_pos - p->ev_start : 0;
    p->ev_start = 0;
}

pdgw_status_t pdgw_sse_feed(pdgw_sse_t *p, const char *bytes, size_t len, pdgw_sse_on_event_t cb,
                            void *arg)
{
    size_t max = p->max_event ? p->max_event : PDGW_SSE_DEFAULT_MAX;
    pdgw_status_t st;

    if (p->buf.len == 0 && len > 0) {
        /* Nothing buffered: the chunk is parsed where it lies, and only the part of an event
         * still incomplete (or not yet handed out) is copied. Whole events cost no copy. */
        size_t keep;
        st = sse_parse(p, bytes, len, false, cb, arg);
        keep = len - p->ev_start;
        if (keep > 0) {
            pdgw_status_t ast = pdgw_buf_append(&p->buf, bytes + p->ev_start, keep);
            if (ast != PDGW_OK) {
                p->ev_start = p->line_start = p->scan_pos = 0;
                return ast; /* the stream cannot go on intact */
            }
        }
        sse_rebase(p);
    } else {
        if (len > 0) {
            st = pdgw_buf_append(&p->buf, bytes, len);
            if (st != PDGW_OK)
                return st;
        }
        st = sse_parse(p, p->buf.data, p->buf.len, false, cb, arg);
        if (p->ev_start > 0) {
            pdgw_buf_consume(&p->buf, p->ev_start);
            sse_rebase(p);
        }
        if (p->buf.len == 0)
            pdgw_buf_free(&p->buf);
    }
    if (st != PDGW_OK)
        return st;
    if (p->buf.len > max)
        return PDGW_ERR_TOO_LARGE;
    return PDGW_OK;
}

bool pdgw_sse_finish(pdgw_sse_t *p, pdgw_sse_on_event_t cb, void *arg)
{
    bool cut;
    (void)sse_parse(p, p->buf.data, p->buf.len, true, cb, arg);
    /* What is left is an event without its blank line (or an unterminated line). */
    cut = p->has_field || p->line_start < p->buf.len;
    if (p->line_start < p->buf.len) {
        const char *l = p->buf.data + p->line_start;
        if (l[0] == ':' && !p->has_field)
            cut = false; /* only a comment was cut */
    }
    pdgw_buf_free(&p->buf);
    p->line_start = 0;
    p->scan_pos = 0;
    p->ev_start = 0;
    sse_event_reset(p);
    return cut;
}
