/*
 * tmpl_parse.c - tokens to the syntax tree (recursive descent, Jinja's precedence).
 *
 * Everything the renderer cannot do is refused here, with its line: unknown statements,
 * filters, tests and methods. A template that loads therefore fails at render time only on
 * its data (raise_exception, type errors), never on its shape.
 */
#include <stdio.h>
#include <string.h>

#include "tmpl_lex.h"

typedef struct parser {
    tmpl_arena_t *a;
    tmpl_tok_t *t;
    size_t n, pos;
    int depth;
} parser_t;

#define MAX_PARSE_DEPTH 200

static tmpl_tok_t *cur(parser_t *p)
{
    return &p->t[p->pos];
}

static _Noreturn void perr(parser_t *p, const char *what, const tmpl_tok_t *t)
{
    if (t->kind == T_EOF)
        tmpl_failf(p->a->fail, "line %d: %s (at end of template)", t->line, what);
    tmpl_failf(p->a->fail, "line %d: %s (at '%.*s')", t->line, what,
               (int)(t->len > 40 ? 40 : t->len), t->s);
}

static int is_op(const tmpl_tok_t *t, const char *op)
{
    return t->kind == T_OP && t->len == strlen(op) && memcmp(t->s, op, t->len) == 0;
}

static int is_name(const tmpl_tok_t *t, const char *name)
{
    return t->kind == T_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

static void expect_op(parser_t *p, const char *op)
{
    if (!is_op(cur(p), op)) {
        char msg[64];
        snprintf(msg, sizeof(msg), "expected '%s'", op);
        perr(p, msg, cur(p));
    }
    p->pos++;
}

static tmpl_node_t *node(parser_t *p, tmpl_kind_t kind, int line)
{
    tmpl_node_t *n = tmpl_alloc(p->a, sizeof(*n));
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable node list in the arena. */
typedef struct nlist {
    tmpl_node_t **v;
    size_t n, cap;
} nlist_t;

static void nl_add(parser_t *p, nlist_t *l, tmpl_node_t *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tmpl_node_t **v = tmpl_alloc(p->a, cap * sizeof(*v));
        if (l->n)
            memcpy(v, l->v, l->n * sizeof(*v));
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static tmpl_node_t *expr(parser_t *p);
static tmpl_node_t *or_expr(parser_t *p);

static void enter(parser_t *p)
{
    if (++p->depth > MAX_PARSE_DEPTH)
        perr(p, "expression nested too deeply", cur(p));
}

/* (args) of a call or filter: positional and name=value. */
static void call_args(parser_t *p, tmpl_node_t *n)
{
    nlist_t l = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        tmpl_tok_t *t = cur(p);
        if (t->kind == T_NAME && is_op(&p->t[p->pos + 1], "=")) {
            tmpl_node_t *kw = node(p, E_KWARG, t->line);
            kw->s = t->s;
            kw->slen = t->len;
            p->pos += 2;
            kw->a = expr(p);
            nl_add(p, &l, kw);
        } else {
            if (is_op(t, "*"))
                perr(p, "argument unpacking is not supported", t);
            nl_add(p, &l, expr(p));
        }
        if (!is_op(cur(p), ","))
            break;
        p->pos++;
    }
    expect_op(p, ")");
    n->kids = l.v;
    n->nkids = l.n;
}

static tmpl_node_t *primary(parser_t *p)
{
    tmpl_tok_t *t = cur(p);
    tmpl_node_t *n;
    switch (t->kind) {
    case T_STR: {
        n = node(p, E_STR, t->line);
        tmpl_sb_t sb = {0};
        tmpl_sb_add(p->a, &sb, "", 0);
        while (cur(p)->kind == T_STR) { /* adjacent literals join */
            tmpl_sb_add(p->a, &sb, cur(p)->s, cur(p)->len);
            p->pos++;
        }
        n->s = sb.d;
        n->slen = sb.len;
        return n;
    }
    case T_INT:
        n = node(p, E_INT, t->line);
        n->i = t->i;
        p->pos++;
        return n;
    case T_FLOAT:
        n = node(p, E_FLOAT, t->line);
        n->f = t->f;
        p->pos++;
        return n;
    case T_NAME:
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
            is_name(t, "False")) {
            n = node(p, E_BOOL, t->line);
            n->op = t->s[0] == 't' || t->s[0] == 'T';
            return n;
        }
        if (is_name(t, "none") || is_name(t, "None"))
            return node(p, E_NONE, t->line);
        n = node(p, E_NAME, t->line);
        n->s = t->s;
        n->slen = t->len;
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            p->pos++;
            tmpl_node_t *first = expr(p);
            if (!is_op(cur(p), ",")) {
                expect_op(p, ")");
                return first;
            }
            nlist_t l = {0};
            nl_add(p, &l, first);
            while (is_op(cur(p), ",")) {
                p->pos++;
                if (is_op(cur(p), ")"))
                    break;
                nl_add(p, &l, expr(p));
            }
            expect_op(p, ")");
            n = node(p, E_TUPLE, t->line);
            n->kids = l.v;
            n->nkids = l.n;
            return n;
        }
        if (is_op(t, "[")) {
            p->pos++;
            nlist_t l = {0};
            while (!is_op(cur(p), "]")) {
                nl_add(p, &l, expr(p));
                if (!is_op(cur(p), ","))
                    break;
                p->pos++;
            }
            expect_op(p, "]");
            n = node(p, E_LIST, t->line);
            n->kids = l.v;
            n->nkids = l.n;
            return n;
        }
        if (is_op(t, "{")) {
            p->pos++;
            nlist_t k = {0}, v = {0};
            while (!is_op(cur(p), "}")) {
                nl_add(p, &k, expr(p));
                expect_op(p, ":");
                nl_add(p, &v, expr(p));
                if (!is_op(cur(p), ","))
                    break;
                p->pos++;
            }
            expect_op(p, "}");
            n = node(p, E_DICT, t->line);
            n->kids = k.v;
            n->nkids = k.n;
            n->kids2 = v.v;
            n->nkids2 = v.n;
            return n;
        }
        break;
    default:
        break;
    }
    perr(p, "expected an expression", t);
}

static tmpl_node_t *slice_part(parser_t *p)
{
    if (is_op(cur(p), ":") || is_op(cur(p), "]"))
        return NULL;
    return expr(p);
}

static tmpl_node_t *postfix(parser_t *p, tmpl_node_t *n)
{
    for (;;) {
        tmpl_tok_t *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            tmpl_tok_t *name = cur(p);
            if (name->kind == T_INT) {
                tmpl_node_t *idx = node(p, E_INT, name->line);
                idx->i = name->i;
                tmpl_node_t *m = node(p, E_INDEX, t->line);
                m->a = n;
                m->b = idx;
                n = m;
                p->pos++;
                continue;
            }
            if (name->kind != T_NAME)
                perr(p, "expected an attribute name", name);
            p->pos++;
            tmpl_node_t *m = node(p, E_ATTR, name->line);
            m->a = n;
            m->s = name->s;
            m->slen = name->len;
            n = m;
        } else if (is_op(t, "[")) {
            p->pos++;
            tmpl_node_t *start = slice_part(p);
            if (is_op(cur(p), ":")) {
                tmpl_node_t *m = node(p, E_SLICE, t->line);
                m->a = n;
                m->kids = tmpl_alloc(p->a, 3 * sizeof(tmpl_node_t *));
                m->nkids = 3;
                m->kids[0] = start;
                p->pos++;
                m->kids[1] = slice_part(p);
                if (is_op(cur(p), ":")) {
                    p->pos++;
                    m->kids[2] = slice_part(p);
                }
                n = m;
            } else {
                if (start == NULL)
                    perr(p, "expected an index", cur(p));
                tmpl_node_t *m = node(p, E_INDEX, t->line);
                m->a = n;
                m->b = start;
                n = m;
            }
            expect_op(p, "]");
        } else if (is_op(t, "(")) {
            if (n->kind == E_ATTR && !tmpl_method_known(n->s, n->slen))
                tmpl_failf(p->a->fail, "line %d: unsupported method '%.*s()'", n->line,
                           (int)n->slen, n->s);
            tmpl_node_t *m = node(p, E_CALL, t->line);
            m->a = n;
            call_args(p, m);
            n = m;
        } else {
            return n;
        }
    }
}

/* x | filter(args) and x is [not] test(args), binding tighter than arithmetic. */
static tmpl_node_t *filtered(parser_t *p, tmpl_node_t *n)
{
    for (;;) {
        tmpl_tok_t *t = cur(p);
        if (is_op(t, "|")) {
            p->pos++;
            tmpl_tok_t *name = cur(p);
            if (name->kind != T_NAME)
                perr(p, "expected a filter name", name);
            int id = tmpl_filter_id(name->s, name->len);
            if (id < 0)
                tmpl_failf(p->a->fail, "line %d: unsupported filter '%.*s'", name->line,
                           (int)name->len, name->s);
            p->pos++;
            tmpl_node_t *f = node(p, E_FILTER, name->line);
            f->a = n;
            f->op = id;
            f->s = name->s;
            f->slen = name->len;
            if (is_op(cur(p), "(")) {
                call_args(p, f);
                f->i = 1;
            }
            n = f;
        } else if (is_name(t, "is")) {
            p->pos++;
            tmpl_node_t *f = node(p, E_TEST, t->line);
            if (is_name(cur(p), "not")) {
                f->op = 1;
                p->pos++;
            }
            tmpl_tok_t *name = cur(p);
            if (name->kind != T_NAME)
                perr(p, "expected a test name", name);
            int id = tmpl_test_id(name->s, name->len);
            if (id < 0)
                tmpl_failf(p->a->fail, "line %d: unsupported test '%.*s'", name->line,
                           (int)name->len, name->s);
            p->pos++;
            f->a = n;
            f->i = id;
            f->s = name->s;
            f->slen = name->len;
            if (is_op(cur(p), "("))
                call_args(p, f);
            else if (cur(p)->kind == T_STR || cur(p)->kind == T_INT || cur(p)->kind == T_NAME) {
                /* "is equalto 3" / "is sameas none": one bare argument */
                if (!(is_name(cur(p), "and") || is_name(cur(p), "or") || is_name(cur(p), "else") ||
                      is_name(cur(p), "if") || is_name(cur(p), "in") || is_name(cur(p), "not") ||
                      is_name(cur(p), "is"))) {
                    f->kids = tmpl_alloc(p->a, sizeof(tmpl_node_t *));
                    f->kids[0] = postfix(p, primary(p));
                    f->nkids = 1;
                }
            }
            n = f;
        } else {
            return n;
        }
    }
}

static tmpl_node_t *unary(parser_t *p)
{
    tmpl_tok_t *t = cur(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        enter(p);
        p->pos++;
        tmpl_node_t *n = node(p, t->s[0] == '-' ? E_NEG : E_POS, t->line);
        n->a = unary(p);
        p->depth--;
        return n;
    }
    return filtered(p, postfix(p, primary(p)));
}

static tmpl_node_t *binary(parser_t *p, tmpl_node_t *l, tmpl_binop_t op, tmpl_node_t *r, int line)
{
    tmpl_node_t *n = node(p, E_BIN, line);
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static tmpl_node_t *power(parser_t *p)
{
    tmpl_node_t *l = unary(p);
    while (is_op(cur(p), "**")) {
        int line = cur(p)->line;
        p->pos++;
        l = binary(p, l, OP_POW, unary(p), line);
    }
    return l;
}

static tmpl_node_t *mult(parser_t *p)
{
    tmpl_node_t *l = power(p);
    for (;;) {
        tmpl_tok_t *t = cur(p);
        tmpl_binop_t op;
        if (is_op(t, "*"))
            op = OP_MUL;
        else if (is_op(t, "/"))
            op = OP_DIV;
        else if (is_op(t, "//"))
            op = OP_FLOORDIV;
        else if (is_op(t, "%"))
            op = OP_MOD;
        else
            return l;
        p->pos++;
        l = binary(p, l, op, power(p), t->line);
    }
}

static tmpl_node_t *additive(parser_t *p)
{
    tmpl_node_t *l = mult(p);
    for (;;) {
        tmpl_tok_t *t = cur(p);
        tmpl_binop_t op;
        if (is_op(t, "+"))
            op = OP_ADD;
        else if (is_op(t, "-"))
            op = OP_SUB;
        else if (is_op(t, "~"))
            op = OP_CONCAT;
        else
            return l;
        p->pos++;
        l = binary(p, l, op, mult(p), t->line);
    }
}

static tmpl_node_t *compare(parser_t *p)
{
    tmpl_node_t *l = additive(p);
    for (;;) {
        tmpl_tok_t *t = cur(p);
        tmpl_binop_t op;
        if (is_op(t, "=="))
            op = OP_EQ;
        else if (is_op(t, "!="))
            op = OP_NE;
        else if (is_op(t, "<"))
            op = OP_LT;
        else if (is_op(t, ">"))
            op = OP_GT;
        else if (is_op(t, "<="))
            op = OP_LE;
        else if (is_op(t, ">="))
            op = OP_GE;
        else if (is_name(t, "in"))
            op = OP_IN;
        else if (is_name(t, "not") && is_name(&p->t[p->pos + 1], "in")) {
            op = OP_NOTIN;
            p->pos++;
        } else
            return l;
        p->pos++;
        l = binary(p, l, op, additive(p), t->line);
    }
}

static tmpl_node_t *not_expr(parser_t *p)
{
    tmpl_tok_t *t = cur(p);
    if (is_name(t, "not")) {
        enter(p);
        p->pos++;
        tmpl_node_t *n = node(p, E_NOT, t->line);
        n->a = not_expr(p);
        p->depth--;
        return n;
    }
    return compare(p);
}

static tmpl_node_t *and_expr(parser_t *p)
{
    tmpl_node_t *l = not_expr(p);
    while (is_name(cur(p), "and")) {
        tmpl_node_t *n = node(p, E_AND, cur(p)->line);
        p->pos++;
        n->a = l;
        n->b = not_expr(p);
        l = n;
    }
    return l;
}

static tmpl_node_t *or_expr(parser_t *p)
{
    tmpl_node_t *l = and_expr(p);
    while (is_name(cur(p), "or")) {
        tmpl_node_t *n = node(p, E_OR, cur(p)->line);
        p->pos++;
        n->a = l;
        n->b = and_expr(p);
        l = n;
    }
    return l;
}

/* a if cond [else b]; without else the value is undefined when cond is false. */
static tmpl_node_t *expr(parser_t *p)
{
    enter(p);
    tmpl_node_t *n = or_expr(p);
    while (is_name(cur(p), "if")) {
        tmpl_node_t *t = node(p, E_TERNARY, cur(p)->line);
        p->pos++;
        t->a = or_expr(p);
        t->b = n;
        if (is_name(cur(p), "else")) {
            p->pos++;
            t->c = expr(p);
        }
        n = t;
    }
    p->depth--;
    return n;
}

/* ---- statements ---- */

static void close_stmt(parser_t *p)
{
    if (cur(p)->kind != T_CLOSE_STMT)
        perr(p, "expected '%}'", cur(p));
    p->pos++;
}

/* Target of set / for: a name, a tuple of names, or (set only) ns.attr. */
static tmpl_node_t *target(parser_t *p, int allow_attr)
{
    tmpl_tok_t *t = cur(p);
    if (t->kind != T_NAME)
        perr(p, "expected a variable name", t);
    p->pos++;
    tmpl_node_t *n = node(p, E_NAME, t->line);
    n->s = t->s;
    n->slen = t->len;
    if (allow_attr && is_op(cur(p), ".")) {
        p->pos++;
        tmpl_tok_t *attr = cur(p);
        if (attr->kind != T_NAME)
            perr(p, "expected an attribute name", attr);
        p->pos++;
        tmpl_node_t *m = node(p, E_ATTR, attr->line);
        m->a = n;
        m->s = attr->s;
        m->slen = attr->len;
        return m;
    }
    if (!is_op(cur(p), ","))
        return n;
    nlist_t l = {0};
    nl_add(p, &l, n);
    while (is_op(cur(p), ",")) {
        p->pos++;
        tmpl_tok_t *e = cur(p);
        if (e->kind != T_NAME)
            perr(p, "expected a variable name", e);
        p->pos++;
        tmpl_node_t *m = node(p, E_NAME, e->line);
        m->s = e->s;
        m->slen = e->len;
        nl_add(p, &l, m);
    }
    tmpl_node_t *tup = node(p, E_TUPLE, t->line);
    tup->kids = l.v;
    tup->nkids = l.n;
    return tup;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_FORELSE[] = {"endfor", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_NONE[] = {NULL};

static void body(parser_t *p, const char *const *ends, nlist_t *out, const char **which);

static tmpl_node_t *stmt_if(parser_t *p, int line)
{
    tmpl_node_t *n = node(p, N_IF, line);
    n->a = expr(p);
    close_stmt(p);
    nlist_t b = {0};
    const char *which;
    body(p, END_IF, &b, &which);
    n->kids = b.v;
    n->nkids = b.n;
    if (strcmp(which, "elif") == 0) {
        nlist_t e = {0};
        nl_add(p, &e, stmt_if(p, cur(p)->line));
        n->kids2 = e.v;
        n->nkids2 = e.n;
        return n; /* the nested if consumed endif */
    }
    if (strcmp(which, "else") == 0) {
        close_stmt(p);
        nlist_t e = {0};
        const char *const end[] = {"endif", NULL};
        body(p, end, &e, &which);
        n->kids2 = e.v;
        n->nkids2 = e.n;
    }
    close_stmt(p);
    return n;
}

static tmpl_node_t *stmt_for(parser_t *p, int line)
{
    tmpl_node_t *n = node(p, N_FOR, line);
    n->a = target(p, 0);
    if (!is_name(cur(p), "in"))
        perr(p, "expected 'in'", cur(p));
    p->pos++;
    n->b = or_expr(p); /* "if" here filters the loop */
    if (is_name(cur(p), "if")) {
        p->pos++;
        n->c = expr(p);
    }
    if (is_name(cur(p), "recursive"))
        perr(p, "recursive loops are not supported", cur(p));
    close_stmt(p);
    nlist_t b = {0};
    const char *which;
    body(p, END_FOR, &b, &which);
    n->kids = b.v;
    n->nkids = b.n;
    if (strcmp(which, "else") == 0) {
        close_stmt(p);
        nlist_t e = {0};
        body(p, END_FORELSE, &e, &which);
        n->kids2 = e.v;
        n->nkids2 = e.n;
    }
    close_stmt(p);
    return n;
}

static tmpl_node_t *stmt_set(parser_t *p, int line)
{
    tmpl_node_t *tgt = target(p, 1);
    if (is_op(cur(p), "=")) {
        p->pos++;
        tmpl_node_t *n = node(p, N_SET, line);
        n->a = tgt;
        n->b = expr(p);
        if (is_op(cur(p), ",")) { /* set a = 1, 2 */
            nlist_t l = {0};
            nl_add(p, &l, n->b);
            while (is_op(cur(p), ",")) {
                p->pos++;
                nl_add(p, &l, expr(p));
            }
            tmpl_node_t *tup = node(p, E_TUPLE, line);
            tup->kids = l.v;
            tup->nkids = l.n;
            n->b = tup;
        }
        close_stmt(p);
        return n;
    }
    if (tgt->kind != E_NAME)
        perr(p, "a block set assigns one plain name", cur(p));
    if (is_op(cur(p), "|"))
        perr(p, "filtered block set is not supported", cur(p));
    close_stmt(p);
    tmpl_node_t *n = node(p, N_SETBLOCK, line);
    n->a = tgt;
    nlist_t b = {0};
    const char *which;
    body(p, END_SET, &b, &which);
    n->kids = b.v;
    n->nkids = b.n;
    close_stmt(p);
    return n;
}

static tmpl_node_t *stmt_macro(parser_t *p, int line)
{
    tmpl_tok_t *name = cur(p);
    if (name->kind != T_NAME)
        perr(p, "expected a macro name", name);
    p->pos++;
    tmpl_node_t *n = node(p, N_MACRO, line);
    n->s = name->s;
    n->slen = name->len;
    expect_op(p, "(");
    nlist_t params = {0};
    while (!is_op(cur(p), ")")) {
        tmpl_tok_t *t = cur(p);
        if (t->kind != T_NAME)
            perr(p, "expected a parameter name", t);
        p->pos++;
        tmpl_node_t *prm = node(p, E_KWARG, t->line);
        prm->s = t->s;
        prm->slen = t->len;
        if (is_op(cur(p), "=")) {
            p->pos++;
            prm->a = expr(p);
        }
        nl_add(p, &params, prm);
        if (!is_op(cur(p), ","))
            break;
        p->pos++;
    }
    expect_op(p, ")");
    close_stmt(p);
    n->kids = params.v;
    n->nkids = params.n;
    nlist_t b = {0};
    const char *which;
    body(p, END_MACRO, &b, &which);
    n->kids2 = b.v;
    n->nkids2 = b.n;
    close_stmt(p);
    return n;
}

static int in_list(const tmpl_tok_t *t, const char *const *names, const char **which)
{
    for (size_t k = 0; names[k] != NULL; k++)
        if (is_name(t, names[k])) {
            *which = names[k];
            return 1;
        }
    return 0;
}

/*
 * Statements up to one of <ends> ({% end... %}), whose name is put in <which> with the
 * tokens after it left for the caller; NULL <ends> list = up to the end of the template.
 */
static void body(parser_t *p, const char *const *ends, nlist_t *out, const char **which)
{
    static const char *const closers[] = {"elif",   "else",     "endif", "endfor",
                                          "endset", "endmacro", NULL};
    int start_line = p->pos > 0 ? p->t[p->pos - 1].line : 1; /* the opening tag's */
    size_t nends = 0;
    while (ends[nends] != NULL)
        nends++;
    enter(p);
    for (;;) {
        tmpl_tok_t *t = cur(p);
        if (t->kind == T_EOF) {
            if (ends[0] == NULL)
                break;
            tmpl_failf(p->a->fail, "line %d: missing '{%% %s %%}' for the block opened there",
                       start_line, ends[nends - 1]);
        }
        if (t->kind == T_TEXT) {
            tmpl_node_t *n = node(p, N_TEXT, t->line);
            n->s = t->s;
            n->slen = t->len;
            nl_add(p, out, n);
            p->pos++;
            continue;
        }
        if (t->kind == T_OPEN_EXPR) {
            p->pos++;
            tmpl_node_t *n = node(p, N_OUTPUT, t->line);
            n->a = expr(p);
            if (cur(p)->kind != T_CLOSE_EXPR)
                perr(p, "expected '}}'", cur(p));
            p->pos++;
            nl_add(p, out, n);
            continue;
        }
        if (t->kind != T_OPEN_STMT)
            perr(p, "unexpected token", t);
        tmpl_tok_t *kw = &p->t[p->pos + 1];
        if (kw->kind != T_NAME)
            perr(p, "expected a statement name", kw);
        if (in_list(kw, ends, which)) {
            p->pos += 2;
            p->depth--;
            return;
        }
        const char *dummy;
        if (in_list(kw, closers, &dummy))
            perr(p, "unexpected end of block", kw);
        p->pos += 2;
        int line = kw->line;
        if (is_name(kw, "if"))
            nl_add(p, out, stmt_if(p, line));
        else if (is_name(kw, "for"))
            nl_add(p, out, stmt_for(p, line));
        else if (is_name(kw, "set"))
            nl_add(p, out, stmt_set(p, line));
        else if (is_name(kw, "macro"))
            nl_add(p, out, stmt_macro(p, line));
        else if (is_name(kw, "break") || is_name(kw, "continue")) {
            nl_add(p, out, node(p, is_name(kw, "break") ? N_BREAK : N_CONTINUE, line));
            close_stmt(p);
        } else if (is_name(kw, "generation") || is_name(kw, "endgeneration")) {
            close_stmt(p); /* assistant-mask markers: no output of their own */
        } else {
            tmpl_failf(p->a->fail, "line %d: unsupported statement '{%% %.*s %%}'", line,
                       (int)kw->len, kw->s);
        }
    }
    p->depth--;
    *which = NULL;
}

tmpl_node_t **tmpl_parse(tmpl_arena_t *a, const char *src, size_t len, size_t *count)
{
    size_t ntok;
    tmpl_tok_t *toks = tmpl_lex(a, src, len, &ntok);
    parser_t p = {.a = a, .t = toks, .n = ntok};
    nlist_t out = {0};
    const char *which;
    body(&p, END_NONE, &out, &which);
    *count = out.n;
    return out.v;
}
