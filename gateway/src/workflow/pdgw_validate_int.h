/*
 * pdgw_validate_int.h - what the two request validators share: the tree's
 * (pdgw_validate.c) and the text walk's (pdgw_validate_flat.c). Internal to them.
 */
#ifndef PDGW_VALIDATE_INT_H
#define PDGW_VALIDATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_validate.h"

#define API_CMPL (1u << PDGW_API_COMPLETIONS)
#define API_CHAT (1u << PDGW_API_CHAT_COMPLETIONS)
#define API_ANY  (API_CMPL | API_CHAT)

typedef enum rule {
    R_BOOL,
    R_INT, /* integer within [imin, imax] */
    R_NUM, /* number within [dmin, dmax]; open bounds via flags */
    R_STRING,
    R_STOP,      /* string | array of strings */
    R_INT_ARRAY, /* array of integers */
    R_OBJECT,
    R_NUM_MAP,   /* object whose values are numbers */
    R_ARRAY_OBJ, /* array of objects */
    R_STR_OBJ,   /* string | object */
} rule_t;

typedef struct field_rule {
    const char *name;
    unsigned apis;
    rule_t rule;
    int64_t imin, imax;
    double dmin, dmax;
    bool min_open; /* dmin excluded */
} field_rule_t;

#define BIG INT64_MAX

/* The rule for body member <key> under API bit <api>; NULL when none checks it. */
const field_rule_t *pdgw_validate_rule_for(const char *key, unsigned api);
/* The prompt tokens a text of <bytes> is taken for when it is not tokenized. */
int64_t pdgw_validate_est_tokens(size_t bytes);

#endif /* PDGW_VALIDATE_INT_H */
