/*
 * pdgw_body_splice.h - a leg body written by splicing the client's own bytes.
 *
 * A PD leg body is the client body with a few top-level members set or removed (max_tokens,
 * stream, kv_transfer_params, ...); the forwarder builds it as an object whose other members
 * are the client body's very values (pdgw_fwd_body_shared). Serialising that object again
 * re-escapes the whole prompt for every leg. Splicing copies each untouched member's bytes
 * from the client's text instead, and serialises only the members that changed.
 */
#ifndef PDGW_BODY_SPLICE_H
#define PDGW_BODY_SPLICE_H

#include <jansson.h>
#include <stddef.h>

#include "pdgw_util.h"

/*
 * The text of <leg> (a JSON object) into <out> (appended): top-level members whose value is
 * the same json_t as <client>'s member of that name (<client> being the parse of <raw>) are
 * copied from <raw>, in the client's order; members the leg dropped are left out; members
 * whose value changed are written where the client had them; new members follow, in the
 * leg's order. The result parses to an object equal to <leg>.
 * PDGW_ERR_INVALID when <raw> cannot be spliced safely (not a single object, a key written
 * with escapes, a key given twice): the caller then serialises <leg> whole. PDGW_ERR_NOMEM
 * on no memory. <out> may hold a partial text on error.
 */
pdgw_status_t pdgw_body_splice(const char *raw, size_t raw_len, const json_t *client,
                               const json_t *leg, pdgw_buf_t *out);

/*
 * Both write a top-level member whose value is a raw value (pdgw_json_raw.h) as its text.
 *
 * <body>'s text in a buffer of its own (released with pdgw_free), spliced from <raw> where it
 * can be, else serialised whole; *len its length. A body is about the client body's size: one
 * exact buffer instead of jansson's doubling buffer plus its final copy. NULL on no memory.
 */
char *pdgw_body_text(const char *raw, size_t raw_len, const json_t *client, const json_t *body,
                     size_t *len);

#endif /* PDGW_BODY_SPLICE_H */
