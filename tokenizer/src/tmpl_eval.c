/*
 * tmpl_eval.c - the interpreter: statements write into a string builder, expressions yield
 * values. Scoping follows the reference runtime: a for loop and a macro call open a scope,
 * "set" binds in the innermost one, if-blocks share their parent's.
 */
#include <string.h>

#include "pdtok/template.h"

#include "tmpl_rt.h"

#define TMPL_MAX_DEPTH PDTOK_TMPL_MAX_DEPTH

static tmpl_val_t eval(tmpl_rctx_t *r, const tmpl_node_t *n, tmpl_scope_t *s);

void tmpl_scope_set(tmpl_rctx_t *r, tmpl_scope_t *s, const char *name, size_t len, tmpl_val_t v)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->nlens[i] == len && memcmp(s->names[i], name, len) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nn = tmpl_alloc(&r->a, cap * sizeof(*nn));
        size_t *nl = tmpl_alloc(&r->a, cap * sizeof(*nl));
        tmpl_val_t *nv = tmpl_alloc(&r->a, cap * sizeof(*nv));
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof(*nn));
            memcpy(nl, s->nlens, s->n * sizeof(*nl));
            memcpy(nv, s->vals, s->n * sizeof(*nv));
        }
        s->names = nn;
        s->nlens = nl;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->nlens[s->n] = len;
    s->vals[s->n++] = v;
}

static tmpl_val_t lookup(tmpl_scope_t *s, const char *name, size_t len)
{
    for (; s != NULL; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (s->nlens[i] == len && memcmp(s->names[i], name, len) == 0)
                return s->vals[i];
    return tv_undef();
}

static tmpl_scope_t *child(tmpl_rctx_t *r, tmpl_scope_t *parent)
{
    tmpl_scope_t *s = tmpl_alloc(&r->a, sizeof(*s));
    s->parent = parent;
    return s;
}

static void step(tmpl_rctx_t *r, const tmpl_node_t *n)
{
    r->line = n->line;
    if (++r->steps > r->max_steps)
        tmpl_rt_fail(r, "template exceeded %llu evaluation steps",
                     (unsigned long long)r->max_steps);
}

static void eval_args(tmpl_rctx_t *r, tmpl_node_t **kids, size_t n, tmpl_scope_t *s,
                      tmpl_args_t *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    out->pos = tmpl_alloc(&r->a, n * sizeof(tmpl_val_t));
    out->kwv = tmpl_alloc(&r->a, n * sizeof(tmpl_val_t));
    out->kwn = tmpl_alloc(&r->a, n * sizeof(char *));
    out->kwl = tmpl_alloc(&r->a, n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        if (kids[i]->kind == E_KWARG) {
            out->kwn[out->nkw] = kids[i]->s;
            out->kwl[out->nkw] = kids[i]->slen;
            out->kwv[out->nkw++] = eval(r, kids[i]->a, s);
        } else {
            out->pos[out->npos++] = eval(r, kids[i], s);
        }
    }
}

/* Code-point offsets of a UTF-8 string, for indexing and slicing by character. */
static size_t *cp_offsets(tmpl_rctx_t *r, const tmpl_str_t *str, size_t *count)
{
    size_t *off = tmpl_alloc(&r->a, (str->len + 2) * sizeof(size_t));
    size_t n = 0;
    for (size_t i = 0; i < str->len; i++)
        if (((unsigned char)str->s[i] & 0xc0) != 0x80)
            off[n++] = i;
    off[n] = str->len;
    *count = n;
    return off;
}

static int64_t slice_bound(tmpl_rctx_t *r, const tmpl_node_t *n, tmpl_scope_t *s, int64_t dflt,
                           int64_t len, int64_t step_v, int is_start)
{
    if (n == NULL)
        return dflt;
    tmpl_val_t v = eval(r, n, s);
    if (v.k == V_UNDEF || v.k == V_NONE)
        return dflt;
    if (v.k != V_INT)
        tmpl_rt_fail(r, "slice bounds must be integers");
    int64_t x = v.u.i;
    if (x < 0)
        x += len;
    (void)is_start;
    if (step_v > 0)
        return x < 0 ? 0 : x > len ? len : x;
    return x < -1 ? -1 : x >= len ? len - 1 : x;
}

static tmpl_val_t eval_slice(tmpl_rctx_t *r, const tmpl_node_t *n, tmpl_scope_t *s)
{
    tmpl_val_t obj = eval(r, n->a, s);
    if (obj.k != V_LIST && obj.k != V_STR)
        tmpl_rt_fail(r, "only lists and strings can be sliced, not %s", tv_type_name(obj));
    size_t cnt = 0, *off = NULL;
    if (obj.k == V_STR)
        off = cp_offsets(r, obj.u.s, &cnt);
    else
        cnt = obj.u.l->n;
    int64_t len = (int64_t)cnt, st = 1;
    if (n->kids[2] != NULL) {
        tmpl_val_t sv = eval(r, n->kids[2], s);
        if (sv.k == V_INT)
            st = sv.u.i;
        else if (sv.k != V_UNDEF && sv.k != V_NONE)
            tmpl_rt_fail(r, "slice step must be an integer");
        if (st == 0)
            tmpl_rt_fail(r, "slice step cannot be zero");
    }
    int64_t b = slice_bound(r, n->kids[0], s, st > 0 ? 0 : len - 1, len, st, 1);
    int64_t e = slice_bound(r, n->kids[1], s, st > 0 ? len : -1, len, st, 0);
    if (obj.k == V_LIST) {
        tmpl_val_t out = tv_list(r, 0);
        for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
            tv_list_push(r, out, obj.u.l->v[i]);
        return out;
    }
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
        tmpl_sb_add(&r->a, &sb, obj.u.s->s + off[i], off[i + 1] - off[i]);
    return tv_str(r, sb.d, sb.len);
}

static tmpl_val_t get_item(tmpl_rctx_t *r, tmpl_val_t obj, tmpl_val_t key)
{
    if (obj.k == V_DICT || obj.k == V_NS) {
        if (key.k != V_STR)
            return tv_undef();
        tmpl_val_t *got = tv_dict_get(obj, key.u.s->s, key.u.s->len);
        if (got != NULL)
            return *got;
        return obj.k == V_DICT ? tmpl_attr_builtin(r, obj, key.u.s->s, key.u.s->len) : tv_undef();
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && key.k == V_INT) {
        size_t cnt = 0, *off = NULL;
        if (obj.k == V_STR)
            off = cp_offsets(r, obj.u.s, &cnt);
        else
            cnt = obj.u.l->n;
        int64_t i = key.u.i < 0 ? key.u.i + (int64_t)cnt : key.u.i;
        if (i < 0 || i >= (int64_t)cnt)
            return tv_undef();
        if (obj.k == V_LIST)
            return obj.u.l->v[i];
        return tv_str(r, obj.u.s->s + off[i], off[i + 1] - off[i]);
    }
    if (key.k == V_STR)
        return tmpl_attr_builtin(r, obj, key.u.s->s, key.u.s->len);
    return tv_undef();
}

static void exec_body(tmpl_rctx_t *r, tmpl_node_t **body, size_t n, tmpl_scope_t *s,
                      tmpl_sb_t *out);

static tmpl_val_t call_macro(tmpl_rctx_t *r, const tmpl_node_t *m, tmpl_args_t *args,
                             tmpl_scope_t *caller)
{
    if (++r->depth > TMPL_MAX_DEPTH)
        tmpl_rt_fail(r, "macro calls nested deeper than %d", TMPL_MAX_DEPTH);
    tmpl_scope_t *s = child(r, caller);
    if (args->npos > m->nkids)
        tmpl_rt_fail(r, "macro '%.*s' takes at most %zu arguments", (int)m->slen, m->s, m->nkids);
    for (size_t k = 0; k < args->nkw; k++) {
        size_t p;
        for (p = 0; p < m->nkids; p++)
            if (m->kids[p]->slen == args->kwl[k] &&
                memcmp(m->kids[p]->s, args->kwn[k], args->kwl[k]) == 0)
                break;
        if (p == m->nkids)
            tmpl_rt_fail(r, "macro '%.*s' has no argument '%.*s'", (int)m->slen, m->s,
                         (int)args->kwl[k], args->kwn[k]);
    }
    for (size_t p = 0; p < m->nkids; p++) /* every name first: defaults cannot see outside */
        tmpl_scope_set(r, s, m->kids[p]->s, m->kids[p]->slen, tv_undef());
    for (size_t p = 0; p < m->nkids; p++) {
        const tmpl_node_t *prm = m->kids[p];
        tmpl_val_t *v = p < args->npos ? &args->pos[p] : NULL;
        for (size_t k = 0; v == NULL && k < args->nkw; k++)
            if (prm->slen == args->kwl[k] && memcmp(prm->s, args->kwn[k], prm->slen) == 0)
                v = &args->kwv[k];
        if (v != NULL)
            tmpl_scope_set(r, s, prm->s, prm->slen, *v);
    }
    for (size_t p = 0; p < m->nkids; p++) {
        const tmpl_node_t *prm = m->kids[p];
        if (prm->a != NULL && lookup(s, prm->s, prm->slen).k == V_UNDEF) {
            int given = p < args->npos;
            for (size_t k = 0; !given && k < args->nkw; k++)
                given = prm->slen == args->kwl[k] && memcmp(prm->s, args->kwn[k], prm->slen) == 0;
            if (!given)
                tmpl_scope_set(r, s, prm->s, prm->slen, eval(r, prm->a, s));
        }
    }
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    exec_body(r, m->kids2, m->nkids2, s, &sb);
    r->control = 0;
    r->depth--;
    return tv_str(r, sb.d, sb.len);
}

static tmpl_val_t binop(tmpl_rctx_t *r, int op, tmpl_val_t a, tmpl_val_t b)
{
    if (op == OP_EQ)
        return tv_bool(tv_equal(a, b));
    if (op == OP_NE)
        return tv_bool(!tv_equal(a, b));
    if (op == OP_IN || op == OP_NOTIN) {
        int in;
        if (b.k == V_UNDEF)
            in = 0;
        else if (a.k == V_UNDEF || a.k == V_NONE || b.k == V_NONE)
            tmpl_rt_fail(r, "'in' on %s and %s", tv_type_name(a), tv_type_name(b));
        else if (b.k == V_LIST) {
            in = 0;
            for (size_t i = 0; i < b.u.l->n && !in; i++)
                in = tv_same(a, b.u.l->v[i]);
        } else if (b.k == V_STR && a.k == V_STR) {
            in = 0;
            for (size_t i = 0; !in && i + a.u.s->len <= b.u.s->len; i++)
                in = memcmp(b.u.s->s + i, a.u.s->s, a.u.s->len) == 0;
        } else if ((b.k == V_DICT || b.k == V_NS) && a.k == V_STR) {
            in = tv_dict_get(b, a.u.s->s, a.u.s->len) != NULL;
        } else {
            tmpl_rt_fail(r, "'in' on %s and %s", tv_type_name(a), tv_type_name(b));
        }
        return tv_bool(op == OP_IN ? in : !in);
    }
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        tmpl_rt_fail(r, "arithmetic or comparison on an undefined value");
    if (a.k == V_NONE || b.k == V_NONE)
        tmpl_rt_fail(r, "arithmetic or comparison on none");
    if ((op == OP_CONCAT || op == OP_ADD) && a.k == V_STR && b.k == V_STR) {
        tmpl_val_t v = tv_str(r, NULL, a.u.s->len + b.u.s->len); /* exact size */
        memcpy(v.u.s->s, a.u.s->s, a.u.s->len);
        memcpy(v.u.s->s + a.u.s->len, b.u.s->s, b.u.s->len);
        return v;
    }
    if (op == OP_CONCAT) {
        tmpl_sb_t sb = {0};
        tmpl_sb_add(&r->a, &sb, "", 0);
        tv_print(r, &sb, a);
        tv_print(r, &sb, b);
        return tv_str(r, sb.d, sb.len);
    }
    int an = a.k == V_INT || a.k == V_FLOAT || (op == OP_POW && a.k == V_BOOL);
    int bn = b.k == V_INT || b.k == V_FLOAT || (op == OP_POW && b.k == V_BOOL);
    if (an && bn) {
        int isf = a.k == V_FLOAT || b.k == V_FLOAT;
        double x = a.k == V_FLOAT ? a.u.f : a.k == V_INT ? (double)a.u.i : a.u.b;
        double y = b.k == V_FLOAT ? b.u.f : b.k == V_INT ? (double)b.u.i : b.u.b;
        int64_t i = a.k == V_INT ? a.u.i : 0, j = b.k == V_INT ? b.u.i : 0;
        switch (op) {
        case OP_ADD:
            return isf ? tv_float(x + y) : tv_int((int64_t)((uint64_t)i + (uint64_t)j));
        case OP_SUB:
            return isf ? tv_float(x - y) : tv_int((int64_t)((uint64_t)i - (uint64_t)j));
        case OP_MUL:
            return isf ? tv_float(x * y) : tv_int((int64_t)((uint64_t)i * (uint64_t)j));
        case OP_DIV:
            return tv_float(x / y);
        case OP_FLOORDIV:
            if (!isf) {
                if (j == 0)
                    tmpl_rt_fail(r, "integer division by zero");
                int64_t q = i / j;
                return tv_int(q - ((i % j != 0) && ((i < 0) != (j < 0))));
            }
            return tv_float(__builtin_floor(x / y));
        case OP_MOD:
            if (!isf) {
                if (j == 0)
                    tmpl_rt_fail(r, "integer modulo by zero");
                return tv_int(i % j); /* the sign of the dividend, as the reference */
            }
            return tv_float(__builtin_fmod(x, y));
        case OP_POW:
            return isf || y < 0 ? tv_float(__builtin_pow(x, y))
                                : tv_int((int64_t)__builtin_pow(x, y));
        case OP_LT:
            return tv_bool(x < y);
        case OP_GT:
            return tv_bool(x > y);
        case OP_LE:
            return tv_bool(x <= y);
        case OP_GE:
            return tv_bool(x >= y);
        }
    }
    if (op == OP_ADD && a.k == V_LIST && b.k == V_LIST) {
        tmpl_val_t out = tv_list(r, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++)
            tv_list_push(r, out, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            tv_list_push(r, out, b.u.l->v[i]);
        return out;
    }
    if (op == OP_ADD && (a.k == V_STR || b.k == V_STR) && a.k != V_FUNC && b.k != V_FUNC &&
        (a.k == V_STR || a.k == V_INT || a.k == V_FLOAT || a.k == V_BOOL) &&
        (b.k == V_STR || b.k == V_INT || b.k == V_FLOAT || b.k == V_BOOL)) {
        tmpl_sb_t sb = {0};
        tmpl_sb_add(&r->a, &sb, "", 0);
        tv_print(r, &sb, a);
        tv_print(r, &sb, b);
        return tv_str(r, sb.d, sb.len);
    }
    tmpl_rt_fail(r, "unsupported operand types %s and %s", tv_type_name(a), tv_type_name(b));
}

static tmpl_val_t eval(tmpl_rctx_t *r, const tmpl_node_t *n, tmpl_scope_t *s)
{
    step(r, n);
    if (++r->depth > TMPL_MAX_DEPTH * 4)
        tmpl_rt_fail(r, "expression nested too deeply");
    tmpl_val_t v;
    switch (n->kind) {
    case E_STR:
        v = tv_str(r, n->s, n->slen);
        break;
    case E_INT:
        v = tv_int(n->i);
        break;
    case E_FLOAT:
        v = tv_float(n->f);
        break;
    case E_BOOL:
        v = tv_bool(n->op);
        break;
    case E_NONE:
        v = tv_none();
        break;
    case E_NAME:
        v = lookup(s, n->s, n->slen);
        break;
    case E_LIST:
    case E_TUPLE:
        v = tv_list(r, n->nkids);
        for (size_t i = 0; i < n->nkids; i++)
            tv_list_push(r, v, eval(r, n->kids[i], s));
        break;
    case E_DICT:
        v = tv_dict(r, V_DICT);
        for (size_t i = 0; i < n->nkids; i++) {
            tmpl_val_t k = eval(r, n->kids[i], s);
            if (k.k != V_STR)
                tmpl_rt_fail(r, "mapping keys must be strings");
            tv_dict_set(r, v, k.u.s->s, k.u.s->len, eval(r, n->kids2[i], s));
        }
        break;
    case E_ATTR: {
        tmpl_val_t obj = eval(r, n->a, s);
        v = get_item(r, obj, tv_str(r, n->s, n->slen));
        break;
    }
    case E_INDEX: {
        tmpl_val_t obj = eval(r, n->a, s);
        v = get_item(r, obj, eval(r, n->b, s));
        break;
    }
    case E_SLICE:
        v = eval_slice(r, n, s);
        break;
    case E_CALL: {
        tmpl_val_t fn = eval(r, n->a, s);
        tmpl_args_t args;
        eval_args(r, n->kids, n->nkids, s, &args);
        r->line = n->line;
        if (fn.k != V_FUNC)
            tmpl_rt_fail(r, "%s is not callable", tv_type_name(fn));
        if (fn.u.fn->kind == F_MACRO)
            v = call_macro(r, fn.u.fn->macro, &args, s);
        else if (fn.u.fn->kind == F_GLOBAL)
            v = tmpl_call_global(r, fn.u.fn->global, &args);
        else
            v = tmpl_call_method(r, fn.u.fn, &args);
        break;
    }
    case E_FILTER: {
        tmpl_val_t x = eval(r, n->a, s);
        tmpl_args_t args;
        eval_args(r, n->kids, n->nkids, s, &args);
        r->line = n->line;
        v = tmpl_filter(r, n->op, x, &args, (int)n->i);
        break;
    }
    case E_TEST: {
        tmpl_val_t x = eval(r, n->a, s);
        tmpl_args_t args;
        eval_args(r, n->kids, n->nkids, s, &args);
        r->line = n->line;
        int t = tmpl_test(r, (int)n->i, x, &args);
        v = tv_bool(n->op ? !t : t);
        break;
    }
    case E_NEG:
    case E_POS: {
        tmpl_val_t x = eval(r, n->a, s);
        int neg = n->kind == E_NEG;
        if (x.k == V_INT || x.k == V_BOOL)
            v = tv_int(neg ? -(x.k == V_INT ? x.u.i : x.u.b) : (x.k == V_INT ? x.u.i : x.u.b));
        else if (x.k == V_FLOAT)
            v = tv_float(neg ? -x.u.f : x.u.f);
        else
            tmpl_rt_fail(r, "unary minus/plus on %s", tv_type_name(x));
        break;
    }
    case E_NOT:
        v = tv_bool(!tv_truthy(eval(r, n->a, s)));
        break;
    case E_AND:
        v = eval(r, n->a, s);
        if (tv_truthy(v))
            v = eval(r, n->b, s);
        break;
    case E_OR:
        v = eval(r, n->a, s);
        if (!tv_truthy(v))
            v = eval(r, n->b, s);
        break;
    case E_TERNARY:
        if (tv_truthy(eval(r, n->a, s)))
            v = eval(r, n->b, s);
        else
            v = n->c ? eval(r, n->c, s) : tv_undef();
        break;
    case E_BIN: {
        tmpl_val_t a = eval(r, n->a, s);
        tmpl_val_t b = eval(r, n->b, s);
        r->line = n->line;
        v = binop(r, n->op, a, b);
        break;
    }
    default:
        tmpl_rt_fail(r, "not an expression");
    }
    r->depth--;
    return v;
}

static void assign(tmpl_rctx_t *r, const tmpl_node_t *tgt, tmpl_val_t v, tmpl_scope_t *s)
{
    if (tgt->kind == E_NAME) {
        tmpl_scope_set(r, s, tgt->s, tgt->slen, v);
    } else if (tgt->kind == E_TUPLE) {
        if (v.k != V_LIST)
            tmpl_rt_fail(r, "cannot unpack %s", tv_type_name(v));
        if (v.u.l->n != tgt->nkids)
            tmpl_rt_fail(r, "expected %zu values to unpack, got %zu", tgt->nkids, v.u.l->n);
        for (size_t i = 0; i < tgt->nkids; i++)
            tmpl_scope_set(r, s, tgt->kids[i]->s, tgt->kids[i]->slen, v.u.l->v[i]);
    } else { /* ns.attr */
        tmpl_val_t ns = eval(r, tgt->a, s);
        if (ns.k != V_NS)
            tmpl_rt_fail(r, "cannot assign an attribute of %s (only of a namespace)",
                         tv_type_name(ns));
        tv_dict_set(r, ns, tgt->s, tgt->slen, v);
    }
}

static const char *const LOOP_FIELDS[9] = {"index", "index0", "revindex", "revindex0", "first",
                                           "last",  "length", "previtem", "nextitem"};

static void exec_for(tmpl_rctx_t *r, const tmpl_node_t *n, tmpl_scope_t *parent, tmpl_sb_t *out)
{
    tmpl_scope_t *s = child(r, parent);
    tmpl_val_t it = eval(r, n->b, s);
    r->line = n->line;
    if (it.k == V_DICT)
        it = tmpl_filter(r, tmpl_filter_id("list", 4), it, NULL, 0);
    else if (it.k != V_LIST)
        tmpl_rt_fail(r, "cannot loop over %s", tv_type_name(it));
    tmpl_list_t *items = it.u.l;
    if (n->c != NULL) { /* {% for x in xs if cond %}: filter first, so loop.* count the kept */
        tmpl_val_t kept = tv_list(r, items->n);
        for (size_t i = 0; i < items->n; i++) {
            tmpl_scope_t *ls = child(r, s);
            assign(r, n->a, items->v[i], ls);
            if (tv_truthy(eval(r, n->c, ls)))
                tv_list_push(r, kept, items->v[i]);
        }
        items = kept.u.l;
    }
    int ran = 0;
    /* One loop object updated in place: a long loop does not allocate per iteration. */
    tmpl_val_t loop = tv_dict(r, V_DICT);
    for (size_t i = 0; i < items->n; i++) {
        int64_t len = (int64_t)items->n, k = (int64_t)i;
        step(r, n);
        tmpl_val_t lv[9] = {tv_int(k + 1),
                            tv_int(k),
                            tv_int(len - k),
                            tv_int(len - k - 1),
                            tv_bool(i == 0),
                            tv_bool(k == len - 1),
                            tv_int(len),
                            i > 0 ? items->v[i - 1] : tv_undef(),
                            k < len - 1 ? items->v[i + 1] : tv_undef()};
        if (i == 0)
            for (size_t f = 0; f < 9; f++)
                tv_dict_set(r, loop, LOOP_FIELDS[f], strlen(LOOP_FIELDS[f]), lv[f]);
        else
            memcpy(loop.u.d->v, lv, sizeof(lv)); /* same keys, same order */
        tmpl_scope_set(r, s, "loop", 4, loop);
        assign(r, n->a, items->v[i], s);
        exec_body(r, n->kids, n->nkids, s, out);
        int c = r->control;
        r->control = 0;
        if (c == 2)
            continue;
        ran = 1;
        if (c == 1)
            break;
    }
    if (!ran)
        exec_body(r, n->kids2, n->nkids2, s, out);
}

static void exec_body(tmpl_rctx_t *r, tmpl_node_t **body, size_t count, tmpl_scope_t *s,
                      tmpl_sb_t *out)
{
    for (size_t i = 0; i < count && r->control == 0; i++) {
        const tmpl_node_t *n = body[i];
        step(r, n);
        switch (n->kind) {
        case N_TEXT:
            tmpl_sb_add(&r->a, out, n->s, n->slen);
            break;
        case N_OUTPUT: {
            tmpl_val_t v = eval(r, n->a, s);
            r->line = n->line;
            tv_print(r, out, v);
            break;
        }
        case N_IF:
            if (tv_truthy(eval(r, n->a, s)))
                exec_body(r, n->kids, n->nkids, s, out);
            else
                exec_body(r, n->kids2, n->nkids2, s, out);
            break;
        case N_FOR:
            if (++r->depth > TMPL_MAX_DEPTH)
                tmpl_rt_fail(r, "loops nested too deeply");
            exec_for(r, n, s, out);
            r->depth--;
            break;
        case N_SET:
            assign(r, n->a, eval(r, n->b, s), s);
            break;
        case N_SETBLOCK: {
            tmpl_sb_t sb = {0};
            tmpl_sb_add(&r->a, &sb, "", 0);
            exec_body(r, n->kids, n->nkids, s, &sb);
            assign(r, n->a, tv_str(r, sb.d, sb.len), s);
            break;
        }
        case N_MACRO: {
            tmpl_func_t *fn = tmpl_alloc(&r->a, sizeof(*fn));
            fn->kind = F_MACRO;
            fn->macro = n;
            tmpl_scope_set(r, s, n->s, n->slen, (tmpl_val_t){.k = V_FUNC, .u.fn = fn});
            break;
        }
        case N_BREAK:
            r->control = 1;
            break;
        case N_CONTINUE:
            r->control = 2;
            break;
        default:
            tmpl_rt_fail(r, "not a statement");
        }
    }
}

void tmpl_exec(tmpl_rctx_t *r, tmpl_node_t **body, size_t n, tmpl_scope_t *scope, tmpl_sb_t *out)
{
    exec_body(r, body, n, scope, out);
    r->control = 0;
}
