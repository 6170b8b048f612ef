/*
 * pdgw_path.h - the request path as the gateway routes it and as it goes upstream.
 *
 * A client's path arrives percent-encoded. Routing wants it decoded, but a decoded path
 * copied into an upstream request line can carry a CR LF, a space or a second request, so
 * the two are kept apart: the routing path is decoded except for the escapes that change its
 * meaning (%2F, %3F, %25 stay as they came), and the upstream target is re-encoded from it.
 */
#ifndef PDGW_PATH_H
#define PDGW_PATH_H

#include <stddef.h>

#include "pdgw_util.h"

/* The routing path of the raw request path <raw> (no query) into <out> (<cap> bytes, NUL
 * ended). 0 on success; else the HTTP status to answer and <why>: 400 for a decoded NUL,
 * control character or space, or a ".." segment (also between %2F escapes); 414 when the
 * path does not fit. "*" (OPTIONS *) is kept as it is. */
int pdgw_path_clean(const char *raw, char *out, size_t cap, const char **why);

/* Append <path> (a routing path) to <out> as an upstream target: every byte that is not an
 * RFC 3986 pchar or '/' is percent-encoded; the kept escapes pass as they are. Never emits
 * a control byte or a space. */
pdgw_status_t pdgw_path_encode(pdgw_buf_t *out, const char *path);

#endif
