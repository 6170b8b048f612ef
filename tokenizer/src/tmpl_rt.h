/*
 * tmpl_rt.h - the renderer's runtime: one rendering's context, scopes and value helpers
 * (tmpl_value.c), built-in filters/tests/methods (tmpl_builtins.c), the interpreter
 * (tmpl_eval.c).
 *
 * Semantics follow the Hugging Face Jinja runtime the models' templates are written against:
 * undefined renders empty, attribute access on anything missing is undefined, tojson uses
 * ", " and ": " separators and leaves non-ASCII as is.
 */
#ifndef TMPL_RT_H
#define TMPL_RT_H

#include <jansson.h>

#include "pdb/pdb_clock.h"
#include "tmpl_int.h"

typedef struct tmpl_scope tmpl_scope_t;
struct tmpl_scope {
    tmpl_scope_t *parent;
    size_t n, cap;
    const char **names;
    size_t *nlens;
    tmpl_val_t *vals;
};

typedef struct tmpl_rctx {
    tmpl_arena_t a;
    tmpl_fail_t fail;
    uint64_t steps, max_steps;
    int depth;
    int line;    /* of the node being evaluated, for messages */
    int control; /* 1 break, 2 continue, pending */
    const pdb_clock_t *wall;
    size_t out_limit;
} tmpl_rctx_t;

_Noreturn void tmpl_rt_fail(tmpl_rctx_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- values (tmpl_value.c) ---- */
static inline tmpl_val_t tv_undef(void)
{
    return (tmpl_val_t){.k = V_UNDEF};
}
static inline tmpl_val_t tv_none(void)
{
    return (tmpl_val_t){.k = V_NONE};
}
static inline tmpl_val_t tv_bool(int b)
{
    return (tmpl_val_t){.k = V_BOOL, .u.b = !!b};
}
static inline tmpl_val_t tv_int(int64_t i)
{
    return (tmpl_val_t){.k = V_INT, .u.i = i};
}
static inline tmpl_val_t tv_float(double f)
{
    return (tmpl_val_t){.k = V_FLOAT, .u.f = f};
}
/* A string of <n> bytes copied from <s>, or zeroed when <s> is NULL (for the caller to fill). */
tmpl_val_t tv_str(tmpl_rctx_t *r, const char *s, size_t n);
tmpl_val_t tv_list(tmpl_rctx_t *r, size_t cap);
tmpl_val_t tv_dict(tmpl_rctx_t *r, tmpl_vkind_t kind);
void tv_list_push(tmpl_rctx_t *r, tmpl_val_t list, tmpl_val_t v);
/* Sets <key> (replacing); dicts keep insertion order. */
void tv_dict_set(tmpl_rctx_t *r, tmpl_val_t dict, const char *key, size_t klen, tmpl_val_t v);
/* NULL when absent. */
tmpl_val_t *tv_dict_get(tmpl_val_t dict, const char *key, size_t klen);
tmpl_val_t tv_from_json(tmpl_rctx_t *r, const json_t *j);

const char *tv_type_name(tmpl_val_t v);
int tv_truthy(tmpl_val_t v);
/* The reference's loose ==. */
int tv_equal(tmpl_val_t a, tmpl_val_t b);
/* Strict equality (list membership, equalto). */
int tv_same(tmpl_val_t a, tmpl_val_t b);
/* How a value prints in output or concatenation. */
void tv_print(tmpl_rctx_t *r, tmpl_sb_t *sb, tmpl_val_t v);
tmpl_str_t *tv_to_str(tmpl_rctx_t *r, tmpl_val_t v);
/* JSON text: <indent> < 0 = one line; separators NULL = the defaults. */
typedef struct tmpl_json_opts {
    int indent;
    int ensure_ascii;
    int sort_keys;
    const tmpl_str_t *item_sep, *key_sep;
    int undef_as_null;
} tmpl_json_opts_t;
void tv_json(tmpl_rctx_t *r, tmpl_sb_t *sb, tmpl_val_t v, const tmpl_json_opts_t *o, int depth);
void tv_num(tmpl_sb_t *sb, tmpl_rctx_t *r, double f); /* a JavaScript number */

/* ---- built-ins (tmpl_builtins.c) ---- */
typedef struct tmpl_args {
    tmpl_val_t *pos;
    size_t npos;
    const char **kwn;
    size_t *kwl;
    tmpl_val_t *kwv;
    size_t nkw;
} tmpl_args_t;
/* Positional <i>, else keyword <name>, else NULL. */
tmpl_val_t *tmpl_arg(tmpl_args_t *a, size_t i, const char *name);

tmpl_val_t tmpl_filter(tmpl_rctx_t *r, int id, tmpl_val_t v, tmpl_args_t *args, int called);
int tmpl_test(tmpl_rctx_t *r, int id, tmpl_val_t v, tmpl_args_t *args);
/* A string/dict/list attribute that is a method or property; undefined when none. */
tmpl_val_t tmpl_attr_builtin(tmpl_rctx_t *r, tmpl_val_t obj, const char *name, size_t len);
tmpl_val_t tmpl_call_method(tmpl_rctx_t *r, tmpl_func_t *fn, tmpl_args_t *args);
tmpl_val_t tmpl_call_global(tmpl_rctx_t *r, int which, tmpl_args_t *args);

/* ---- interpreter (tmpl_eval.c) ---- */
void tmpl_exec(tmpl_rctx_t *r, tmpl_node_t **body, size_t n, tmpl_scope_t *scope, tmpl_sb_t *out);
void tmpl_scope_set(tmpl_rctx_t *r, tmpl_scope_t *s, const char *name, size_t len, tmpl_val_t v);
#endif /* TMPL_RT_H */
