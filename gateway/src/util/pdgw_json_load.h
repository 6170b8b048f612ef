/*
 * pdgw_json_load.h - parsing a JSON body (a client's request, an engine's answer) into
 * jansson's tree in one pass over the text.
 *
 * jansson's own loader reads one byte at a time through its stream layer (a callback, a UTF-8
 * check and a line and column count per byte) and decodes each string in a second pass: about
 * 190 instructions a byte, so a 90-byte completion request costs 17,000 instructions before
 * any routing, and a 100 KiB prompt two milliseconds of a worker. The parser here walks the
 * text once, copies the runs of a string between escapes whole, and builds the same tree with
 * jansson's own constructors. It takes only what it is sure jansson takes the same way; for
 * everything else (a syntax error, a number out of range, very deep nesting) jansson parses
 * the text, so errors and their positions are jansson's own.
 */
#ifndef PDGW_JSON_LOAD_H
#define PDGW_JSON_LOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "pdgw_json_text.h"

/* json_loadb(text, len, 0, err), faster. */
json_t *pdgw_json_loadb(const char *text, size_t len, json_error_t *err);

/* The one-pass parser alone: the tree jansson would build from <text>, or NULL when it
 * declines (jansson would refuse the text, or may take it in a way this parser does not
 * model). */
json_t *pdgw_json_load_fast(const char *text, size_t len);
/* A member of the checked object to <fn>, in order, once its value was checked: its name and
 * value as written (pdgw_json_text.h), and whether the value, when it is a string, has
 * escapes. false stops the walk. */
typedef bool (*pdgw_json_member_fn)(void *arg, const pdgw_json_member_t *m, bool val_escaped);
/* Would pdgw_json_load_fast load <text> as one object? The same walk and the same checks with
 * nothing made, each top-level member handed to <fn> (NULL: none) on the way: true when it
 * would and <fn> took every member; false also for a text it declines that jansson may
 * still accept. */
bool pdgw_json_check_members(const char *text, size_t len, pdgw_json_member_fn fn, void *arg);

/* Of the JSON object <text>, a tree of only the top-level members named in <names>
 * (NULL-terminated): the others are walked past, not built. The values built are checked as
 * pdgw_json_loadb checks them; of the rest only the structure (strings closed, brackets
 * matched) is. NULL when <text> is not one object or a wanted value does not parse. A text
 * whose member names contain escapes is parsed whole. */
json_t *pdgw_json_load_members(const char *text, size_t len, const char *const *names);

#endif /* PDGW_JSON_LOAD_H */
