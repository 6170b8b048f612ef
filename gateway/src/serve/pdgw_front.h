/*
 * pdgw_front.h - the native front end (frontend: native): plain HTTP/1.0 and 1.1 client
 * connections on the worker's own epoll loop, without libmicrohttpd.
 *
 * Two parts, each in its own file:
 *   pdgw_front_parse.c  the request head: found in the read buffer, copied once, split in
 *                       place into method, target, version and header fields (RFC 9112);
 *                       strict, since a gateway must not read a request differently from
 *                       whoever is in front of it;
 *   pdgw_front.c        connections: accept with the connection guard's limits, reads,
 *                       bodies (Content-Length or chunked, through the upstream parser's
 *                       body states), 100-continue, replies written with one writev,
 *                       streams handed to the sink's direct writer, keep-alive and pipelined
 *                       requests answered in order.
 * A connection stays in the worker's epoll set from accept to close, edge-triggered for
 * input, output and hang-up: waiting for an answer costs no system call.
 */
#ifndef PDGW_FRONT_H
#define PDGW_FRONT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- request head */

/* Most header fields a request may carry (more: 431). */
#define PDGW_FRONT_MAX_HEADERS 100

typedef struct pdgw_front_pair {
    const char *name, *value; /* NUL-terminated, inside the head's copy */
    size_t name_len;
} pdgw_front_pair_t;

typedef struct pdgw_front_head {
    const char *method;
    const char *path;  /* the target's path as it came (no control byte, space or escape of one) */
    const char *query; /* the raw query after '?', NULL when none */
    int version_minor; /* HTTP/1.<n>: 0 or 1 */
    bool keep_alive;   /* the client allows another request on this connection */
    bool expect_continue;
    bool chunked;            /* Transfer-Encoding: chunked */
    bool has_length;         /* a Content-Length */
    uint64_t content_length; /* when has_length */
    unsigned n_headers;
    uint64_t name_lens; /* bit (length % 64) of every name: most lookups miss at once */
    pdgw_front_pair_t headers[PDGW_FRONT_MAX_HEADERS];
} pdgw_front_head_t;

/* Where the head in <buf, len> ends (just past its empty line); 0 when it is not complete.
 * <from> is where the previous search stopped (a resumed search skips what it saw). */
size_t pdgw_front_head_end(const char *buf, size_t len, size_t from);
/*
 * Split the head <text, len> (a copy the caller keeps for the request's life; NULs are
 * written into it) into <h>. 0 = a request; otherwise the status to refuse it with (400,
 * 431, 501, 505) and *why a short reason.
 */
int pdgw_front_head_parse(char *text, size_t len, pdgw_front_head_t *h, const char **why);
/* The first value of header <name> (<n> bytes, any case), NULL when absent. */
const char *pdgw_front_head_get(const pdgw_front_head_t *h, const char *name, size_t n);
/* Decode one query component <s, n> ('+' is a space, "%hh" a byte) into <out> (at least n + 1
 * bytes, NUL ended); the end of what was written. */
char *pdgw_front_query_decode(const char *s, size_t n, char *out);

/* Decode the query's arguments one by one into <scratch> (at least strlen(query) + 2 bytes)
 * and hand each to <fn> (a NULL value when the argument has no '='); false from <fn> stops. */
void pdgw_front_query_each(const char *query, char *scratch,
                           bool (*fn)(void *arg, const char *name, const char *value), void *arg);

#endif /* PDGW_FRONT_H */
