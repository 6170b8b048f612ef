/*
 * pdgw_json_dump.h - a jansson tree written as compact JSON text, byte for byte what
 * json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) writes.
 *
 * jansson's dumper hands every token to a callback and, for every object and array, prints
 * the container's address with snprintf("%p") into a hashtable to detect cycles: a leg body's
 * kv_transfer_params cost more to write than the rest of the leg. Here the text goes straight
 * into a buffer. Numbers with a fraction or an exponent are few and jansson's formatting of
 * them is particular (17 significant digits, no '+' or leading zeros in the exponent, ".0"
 * appended to integral values): those are written by jansson itself.
 */
#ifndef PDGW_JSON_DUMP_H
#define PDGW_JSON_DUMP_H

#include <jansson.h>

#include "pdgw_util.h"

/* Nesting deeper than this is refused (jansson refuses a cycle; this refuses it too). */
#define PDGW_JSON_DUMP_DEPTH_MAX 4096

/* Append <v> to <out>. PDGW_ERR_NOMEM, or PDGW_ERR_INVALID for nesting beyond the limit (what
 * was appended so far stays). */
pdgw_status_t pdgw_json_dump(pdgw_buf_t *out, const json_t *v);

/* Append <s> (<len> bytes) as a JSON string, quotes included, escaped as jansson escapes it.
 * PDGW_ERR_NOMEM, or PDGW_ERR_INVALID for text that is not UTF-8. */
pdgw_status_t pdgw_json_dump_string(pdgw_buf_t *out, const char *s, size_t len);

/* <v> as a NUL-terminated text of pdgw_malloc's (pdgw_free it), its length in *len; NULL on
 * failure. */
char *pdgw_json_dumps(const json_t *v, size_t *len);

#endif /* PDGW_JSON_DUMP_H */
