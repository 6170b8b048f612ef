/*
 * pdgw_sse.h - incremental Server-Sent Events parser for the upstream relay.
 *
 * Bytes arrive in arbitrary chunks (an event, a line, even a CRLF pair may be split);
 * the parser hands out whole events, each with its raw bytes (so the relay can pass it
 * through unchanged) and its joined `data` payload. Lines end with LF, CRLF or CR; lines
 * starting with ':' are comments; several `data:` lines join with '\n' (SSE spec).
 */
#ifndef PDGW_SSE_H
#define PDGW_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "pdgw_util.h"

typedef struct pdgw_sse_event {
    const char *raw; /* the event's bytes as received, terminating blank line included */
    size_t raw_len;
    const char *data; /* joined data lines, NUL-terminated ("" when none) */
    size_t data_len;
    bool has_data;     /* at least one data field */
    bool is_done;      /* data is exactly "[DONE]" */
    const char *event; /* value of the `event:` field ("" when absent) */
} pdgw_sse_event_t;

/* Called once per complete event; return non-zero to stop feeding (the rest stays queued). */
typedef int (*pdgw_sse_on_event_t)(void *arg, const pdgw_sse_event_t *ev);

typedef struct pdgw_sse {
    pdgw_buf_t buf;    /* unparsed bytes */
    size_t ev_start;   /* start of the current event in buf */
    size_t line_start; /* start of the line being parsed */
    size_t scan_pos;   /* bytes before this hold no line end (a long line is scanned once) */
    pdgw_buf_t data;   /* data lines of the current event */
    char event[64];    /* event field of the current event */
    bool has_data;
    bool has_field;   /* any non-comment line seen in the current event */
    size_t max_event; /* an event larger than this is an error (0 = 1 MiB) */
} pdgw_sse_t;

void pdgw_sse_init(pdgw_sse_t *p);
void pdgw_sse_free(pdgw_sse_t *p);

/*
 * Feed <len> bytes. Complete events go to <cb>. Returns PDGW_OK, PDGW_ERR_TOO_LARGE when an
 * event exceeds max_event, PDGW_ERR_NOMEM, or PDGW_ERR_CANCELLED when <cb> asked to stop.
 */
pdgw_status_t pdgw_sse_feed(pdgw_sse_t *p, const char *bytes, size_t len, pdgw_sse_on_event_t cb,
                            void *arg);

/*
 * End of stream: a trailing CR completes its line; an event without its terminating blank
 * line is dropped (as the SSE spec says). Returns true when such a partial event (with at
 * least one field) was dropped, i.e. the stream was cut in the middle of an event.
 */
bool pdgw_sse_finish(pdgw_sse_t *p, pdgw_sse_on_event_t cb, void *arg);

/* Bytes buffered and not yet part of a complete event. */
static inline size_t pdgw_sse_pending(const pdgw_sse_t *p)
{
    return p->buf.len;
}

#endif /* PDGW_SSE_H */
