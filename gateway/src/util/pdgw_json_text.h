/*
 * pdgw_json_text.h - walking the top level of a JSON object's text without parsing it.
 *
 * Where pdgw needs one or two members of a body it relays or splices (an answer's usage, the
 * members a leg shares with the client body), building a tree of the whole text costs more
 * than the work itself. The walker finds member boundaries only: strings with their escapes,
 * nesting. It checks every bound but does not validate what lies between them; callers use it
 * on text a parser has accepted, or where a wrong guess costs only a figure.
 */
#ifndef PDGW_JSON_TEXT_H
#define PDGW_JSON_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pdgw_json_members {
    const char *p, *end;
    bool first;
} pdgw_json_members_t;

/* One member: its name as written (between the quotes) and its value's bytes. */
typedef struct pdgw_json_member {
    const char *key;
    size_t key_len;
    bool key_escaped; /* the name contains escapes: as written it is not the parsed name */
    const char *val;
    size_t val_len;
} pdgw_json_member_t;

/* Start at the object opening at <text> (leading whitespace allowed); false if none does. */
bool pdgw_json_members_begin(pdgw_json_members_t *it, const char *text, size_t len);
/* 0 = *m is the next member, 1 = the object closed (it->p is just past its '}'), -1 = the
 * text ends early or is not an object's members. */
int pdgw_json_members_next(pdgw_json_members_t *it, pdgw_json_member_t *m);
/* Only whitespace from <p> to <end>. */
bool pdgw_json_only_ws(const char *p, const char *end);

/* The value at <text> when it is an array of non-negative integers, as JSON writes them
 * ("[1, 22, 333]": no sign, no leading zero, no fraction or exponent, at most INT64_MAX):
 * a new jansson array of them. NULL when it is anything else (the caller parses the text for
 * a precise error) or on no memory. Reading a /tokenize answer of thousands of ids this way
 * costs a fraction of a general parse. */
json_t *pdgw_json_id_list(const char *text, size_t len);

/* Is <text> such an id list? *count gets the number of ids (nothing is allocated). */
bool pdgw_json_id_list_count(const char *text, size_t len, size_t *count);

/* A member name's bit in a 64-bit set of names (a one-hash Bloom filter): a name whose bit
 * is clear is not in the set; a set bit only says it may be. */
static inline uint64_t pdgw_json_name_bit(const char *name, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 16777619u;
    return (uint64_t)1 << (h & 63);
}

/* The bytes of the top-level member <name> of the object <text>; the last one when the name
 * repeats, as a parser keeps it. false when there is none or the text is not one object. */
bool pdgw_json_member_value(const char *text, size_t len, const char *name, const char **val,
                            size_t *val_len);

/* The last top-level member <name> of the object that <text> ends with, found walking back
 * from the end: only the members after it are read. An answer's usage comes last or nearly
 * so; reading it this way costs a few of its members instead of all of its text. The text
 * before the member is not looked at, so text that only ends like an object also answers;
 * use it where a wrong guess costs only a figure. Names are compared as written. */
bool pdgw_json_last_member(const char *text, size_t len, const char *name, const char **val,
                           size_t *val_len);

/* The same with every name checked: 1 found, 0 no such member, -1 when the text is not one
 * object or a member's name is written with escapes (as written it may not be the name a
 * parser reads). For rewriting an answer on its text, where a missed member would change it. */
int pdgw_json_member_find(const char *text, size_t len, const char *name, const char **val,
                          size_t *val_len);
/* Several members in one walk: for each name of the NULL-terminated <names>, vals[i] /
 * val_lens[i] its value's bytes (vals[i] NULL when there is none). 0, or -1 as above. */
int pdgw_json_members_find(const char *text, size_t len, const char *const *names,
                           const char **vals, size_t *val_lens);

/* The first element of the array at <text> (leading whitespace allowed): 1 found, 0 the array
 * is empty, -1 it is not an array. Only the element's bounds are checked. */
int pdgw_json_array_first(const char *text, size_t len, const char **val, size_t *val_len);

/* The id list (as above) under the top-level member <name> of the object <text>; NULL when
 * there is none. */
json_t *pdgw_json_member_id_list(const char *text, size_t len, const char *name);

/* The decimal text of <v>, written backwards so that it ends just before <end> (room for 20
 * characters): returns where it starts. Without printf: token-id lists have thousands. */
#define PDGW_JSON_INT_TEXT_MAX 20
char *pdgw_json_int_text(json_int_t v, char *end);

/* Length of the well-formed UTF-8 character at p (p < end, *p >= 0x80) as jansson checks it
 * (no overlong form, no surrogate, nothing above U+10FFFF), 0 if it is not one. */
size_t pdgw_json_utf8_char(const unsigned char *p, const unsigned char *end);

#endif /* PDGW_JSON_TEXT_H */
