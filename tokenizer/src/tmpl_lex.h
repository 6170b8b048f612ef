/*
 * tmpl_lex.h - template source to tokens: text runs, tag delimiters and expression tokens,
 * with whitespace control ({%- -%}, trim_blocks, lstrip_blocks) already applied to the text.
 */
#ifndef TMPL_LEX_H
#define TMPL_LEX_H

#include "tmpl_int.h"

typedef enum tmpl_tok_kind {
    T_EOF,
    T_TEXT,
    T_OPEN_STMT,
    T_CLOSE_STMT,
    T_OPEN_EXPR,
    T_CLOSE_EXPR,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP,
} tmpl_tok_kind_t;

typedef struct tmpl_tok {
    tmpl_tok_kind_t kind;
    int line;
    const char *s; /* text, name, decoded string literal, operator */
    size_t len;
    int64_t i;
    double f;
} tmpl_tok_t;

/* Tokens of <src> in <a>, ending with T_EOF; fails through a->fail with the line. */
tmpl_tok_t *tmpl_lex(tmpl_arena_t *a, const char *src, size_t len, size_t *count);

/* Byte length of the JavaScript/Unicode white space character at s[0] (0 if none). */
size_t tmpl_space_at(const char *s, size_t n);
/* Byte length of the white space character ending at s[n-1] (0 if none). */
size_t tmpl_space_before(const char *s, size_t n);
#endif /* TMPL_LEX_H */
