/*
 * pdgw_json_load.h - parsing a JSON body whose long strings are most of its bytes: a client's
 * prompt or message contents, an engine's long answer.
 *
 * jansson reads a string one byte at a time through its stream layer (UTF-8 check, line and
 * column count) and then decodes it in a second pass: about 20 ns a byte, so a 100 KiB prompt
 * costs two milliseconds of a worker before any routing. Here every long string is checked
 * and decoded by a loop that copies the runs between escapes whole; jansson parses the rest of
 * the body, in which each long string stands as a short placeholder, and the decoded strings
 * are put back in the tree. The result is the tree jansson would build from the whole text:
 * anything the fast path is not sure of (invalid UTF-8, a bad escape, a parse error anywhere)
 * is parsed again by jansson alone, so errors and their positions are jansson's own.
 */
#ifndef PDGW_JSON_LOAD_H
#define PDGW_JSON_LOAD_H

#include <jansson.h>
#include <stddef.h>

/* Strings at least this long (bytes as written) are decoded outside jansson. */
#define PDGW_JSON_LONG_STRING 256

/* json_loadb(text, len, 0, err), faster for long strings. */
json_t *pdgw_json_loadb(const char *text, size_t len, json_error_t *err);

/* How many long value strings of <text> the fast path decodes itself: 0 when there are none
 * or when one is not what jansson accepts (then jansson parses the whole text). */
size_t pdgw_json_long_strings(const char *text, size_t len);

#endif /* PDGW_JSON_LOAD_H */
