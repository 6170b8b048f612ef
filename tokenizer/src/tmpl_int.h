/*
 * tmpl_int.h - internals of the chat-template renderer shared by its files: the error jump,
 * the arena every tree node and value lives in, tokens, the syntax tree and runtime values.
 *
 * Errors anywhere (parse or render, including out of memory) longjmp to the entry point,
 * which frees the arena: nothing between needs cleanup paths, and nothing leaks.
 */
#ifndef TMPL_INT_H
#define TMPL_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tmpl_fail {
    jmp_buf jb;
    char *msg;
    size_t msglen;
} tmpl_fail_t;

/* Formats the message and jumps to <f>'s entry point. */
_Noreturn void tmpl_failf(tmpl_fail_t *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- arena ---- */
typedef struct tmpl_chunk tmpl_chunk_t;
typedef struct tmpl_arena {
    tmpl_chunk_t *head;
    size_t total, limit; /* bytes taken from the system, and the bound (0 = none) */
    tmpl_fail_t *fail;
} tmpl_arena_t;

void *tmpl_alloc(tmpl_arena_t *a, size_t n); /* zeroed; fails through a->fail */
char *tmpl_strndup(tmpl_arena_t *a, const char *s, size_t n);
void tmpl_arena_free(tmpl_arena_t *a);

/* A growable byte string in an arena. */
typedef struct tmpl_sb {
    char *d;
    size_t len, cap, limit; /* limit 0 = none */
} tmpl_sb_t;
void tmpl_sb_add(tmpl_arena_t *a, tmpl_sb_t *sb, const char *s, size_t n);

/* ---- syntax tree ---- */
typedef enum tmpl_kind {
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    E_STR,
    E_INT,
    E_FLOAT,
    E_BOOL,
    E_NONE,
    E_NAME,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_ATTR,
    E_INDEX,
    E_SLICE,
    E_CALL,
    E_KWARG,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_BIN,
    E_AND,
    E_OR,
    E_TERNARY,
} tmpl_kind_t;

typedef enum tmpl_binop {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN,
} tmpl_binop_t;

typedef struct tmpl_node tmpl_node_t;
struct tmpl_node {
    tmpl_kind_t kind;
    int line;
    int op;        /* binop, filter/test id, negation of a test, bool literal */
    const char *s; /* text, string literal, name, attribute, filter/test/kwarg name */
    size_t slen;
    int64_t i;
    double f;
    tmpl_node_t *a, *b, *c;
    tmpl_node_t **kids; /* body, items, args, params */
    size_t nkids;
    tmpl_node_t **kids2; /* else body, dict values, macro body */
    size_t nkids2;
};

/* Parses <src> into a list of statements allocated in <a>. */
tmpl_node_t **tmpl_parse(tmpl_arena_t *a, const char *src, size_t len, size_t *count);

/* Filters, tests and methods the parser accepts; the renderer dispatches on these ids. */
int tmpl_filter_id(const char *name, size_t len); /* <0 unknown */
int tmpl_test_id(const char *name, size_t len);
int tmpl_method_known(const char *name, size_t len);

/* ---- values ---- */
typedef enum tmpl_vkind {
    V_UNDEF,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_NS,
    V_FUNC,
} tmpl_vkind_t;

typedef struct tmpl_str {
    size_t len;
    char s[];
} tmpl_str_t;
typedef struct tmpl_val tmpl_val_t;
typedef struct tmpl_list tmpl_list_t;
typedef struct tmpl_dict tmpl_dict_t;
typedef struct tmpl_func tmpl_func_t;

struct tmpl_val {
    tmpl_vkind_t k;
    union {
        int b;
        int64_t i;
        double f;
        tmpl_str_t *s;
        tmpl_list_t *l;
        tmpl_dict_t *d; /* V_DICT and V_NS */
        tmpl_func_t *fn;
    } u;
};

struct tmpl_list {
    size_t n, cap;
    tmpl_val_t *v;
};
struct tmpl_dict {
    size_t n, cap;
    tmpl_str_t **k;
    tmpl_val_t *v;
};

typedef enum tmpl_fkind { F_MACRO, F_GLOBAL, F_METHOD } tmpl_fkind_t;
struct tmpl_func {
    tmpl_fkind_t kind;
    const tmpl_node_t *macro;
    int global;       /* F_GLOBAL: which */
    const char *name; /* F_METHOD: which */
    size_t namelen;
    tmpl_val_t self;
};

enum { G_RAISE, G_RANGE, G_STRFTIME, G_NAMESPACE };
#endif /* TMPL_INT_H */
