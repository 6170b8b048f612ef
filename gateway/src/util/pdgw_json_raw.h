/*
 * pdgw_json_raw.h - a JSON value carried as its text through a jansson tree.
 *
 * A leg body is a jansson object the body writer turns into text (pdgw_body_splice.h). A
 * prompt of thousands of token ids would be thousands of jansson integers, each allocated,
 * written and freed once per leg, where its text, read from an engine's answer, is all the
 * legs need. A raw value is a jansson string holding a marker and that text; the body writer
 * writes the text in place of a top-level member's value. The marker carries 128 random bits
 * drawn once per process, so no string a client sends can pass for one.
 */
#ifndef PDGW_JSON_RAW_H
#define PDGW_JSON_RAW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A new raw value holding <text> (which must be one valid JSON value: not checked here);
 * NULL on no memory. */
json_t *pdgw_json_raw(const char *text, size_t len);

/* Is <v> a raw value? Then *text / *len give its JSON text (owned by <v>). */
bool pdgw_json_raw_text(const json_t *v, const char **text, size_t *len);

#endif /* PDGW_JSON_RAW_H */
