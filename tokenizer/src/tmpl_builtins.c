/*
 * tmpl_builtins.c - filters, tests, string/dict methods and globals (raise_exception, range,
 * strftime_now, namespace) of the template renderer.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "tmpl_lex.h"
#include "tmpl_rt.h"

enum {
    FL_SAFE,
    FL_TOJSON,
    FL_LIST,
    FL_FIRST,
    FL_LAST,
    FL_LENGTH,
    FL_COUNT,
    FL_REVERSE,
    FL_JOIN,
    FL_STRING,
    FL_UPPER,
    FL_LOWER,
    FL_TITLE,
    FL_CAPITALIZE,
    FL_TRIM,
    FL_INDENT,
    FL_INT,
    FL_FLOAT,
    FL_ABS,
    FL_ITEMS,
    FL_DEFAULT,
    FL_D,
    FL_SELECTATTR,
    FL_REJECTATTR,
    FL_MAP,
    FL_REPLACE,
    FL_E,
    FL_ESCAPE,
    FL_BOOL,
    FL_UNIQUE,
};
static const char *const FILTERS[] = {
    "safe", "tojson",  "list",  "first",  "last",    "length",     "count",      "reverse",
    "join", "string",  "upper", "lower",  "title",   "capitalize", "trim",       "indent",
    "int",  "float",   "abs",   "items",  "default", "d",          "selectattr", "rejectattr",
    "map",  "replace", "e",     "escape", "bool",    "unique",     NULL};

enum {
    TS_BOOLEAN,
    TS_CALLABLE,
    TS_ODD,
    TS_EVEN,
    TS_FALSE,
    TS_TRUE,
    TS_NONE,
    TS_STRING,
    TS_NUMBER,
    TS_INTEGER,
    TS_ITERABLE,
    TS_MAPPING,
    TS_SEQUENCE,
    TS_LOWER,
    TS_UPPER,
    TS_DEFINED,
    TS_UNDEFINED,
    TS_EQUALTO,
    TS_EQ,
    TS_FLOAT,
};
static const char *const TESTS[] = {
    "boolean", "callable", "odd",       "even",     "false",   "true",     "none",
    "string",  "number",   "integer",   "iterable", "mapping", "sequence", "lower",
    "upper",   "defined",  "undefined", "equalto",  "eq",      "float",    NULL};

static const char *const METHODS[] = {
    "upper",    "lower", "strip",   "lstrip", "rstrip", "title", "capitalize", "startswith",
    "endswith", "split", "replace", "get",    "items",  "keys",  "values",     NULL};

static int lookup(const char *const *table, const char *name, size_t len)
{
    for (int k = 0; table[k] != NULL; k++)
        if (strlen(table[k]) == len && memcmp(table[k], name, len) == 0)
            return k;
    return -1;
}

int tmpl_filter_id(const char *name, size_t len)
{
    return lookup(FILTERS, name, len);
}

int tmpl_test_id(const char *name, size_t len)
{
    return lookup(TESTS, name, len);
}

int tmpl_method_known(const char *name, size_t len)
{
    return lookup(METHODS, name, len) >= 0;
}

tmpl_val_t *tmpl_arg(tmpl_args_t *a, size_t i, const char *name)
{
    if (a == NULL)
        return NULL;
    if (i < a->npos)
        return &a->pos[i];
    if (name != NULL)
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kwl[k] == strlen(name) && memcmp(a->kwn[k], name, a->kwl[k]) == 0)
                return &a->kwv[k];
    return NULL;
}

/* ---- strings ---- */

static tmpl_str_t *want_str(tmpl_rctx_t *r, tmpl_val_t *v, const char *what)
{
    if (v == NULL || v->k != V_STR)
        tmpl_rt_fail(r, "%s must be a string", what);
    return v->u.s;
}

static tmpl_val_t str_case(tmpl_rctx_t *r, const tmpl_str_t *s,
                           int mode /* 0 lo 1 up 2 cap 3 title */)
{
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    int at_word = 1;
    for (size_t i = 0; i < s->len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s->s + i,
                                              (utf8proc_ssize_t)(s->len - i), &cp);
        if (n <= 0) { /* invalid UTF-8 passes through */
            tmpl_sb_add(&r->a, &sb, s->s + i, 1);
            i++;
            continue;
        }
        utf8proc_int32_t out = cp;
        if (mode == 0)
            out = utf8proc_tolower(cp);
        else if (mode == 1)
            out = utf8proc_toupper(cp);
        else if (mode == 2)
            out = i == 0 ? utf8proc_toupper(cp) : cp;
        else {
            out = at_word ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            at_word = tmpl_space_at(s->s + i, s->len - i) > 0;
        }
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t en = utf8proc_encode_char(out, enc);
        tmpl_sb_add(&r->a, &sb, (const char *)enc, (size_t)en);
        i += (size_t)n;
    }
    return tv_str(r, sb.d, sb.len);
}

/* strip(): white space, or with an argument the characters it lists (Python's semantics). */
static tmpl_val_t str_strip(tmpl_rctx_t *r, const tmpl_str_t *s, int left, int right,
                            tmpl_val_t *chars)
{
    size_t b = 0, e = s->len, k;
    if (chars != NULL && chars->k == V_STR) {
        const tmpl_str_t *c = chars->u.s;
        while (left && b < e && memchr(c->s, s->s[b], c->len))
            b++;
        while (right && e > b && memchr(c->s, s->s[e - 1], c->len))
            e--;
    } else {
        while (left && b < e && (k = tmpl_space_at(s->s + b, e - b)) > 0)
            b += k;
        while (right && e > b && (k = tmpl_space_before(s->s + b, e - b)) > 0)
            e -= k;
    }
    return tv_str(r, s->s + b, e - b);
}

static const char *find(const char *h, size_t hl, const char *n, size_t nl)
{
    if (nl == 0)
        return h;
    for (size_t i = 0; i + nl <= hl; i++)
        if (h[i] == n[0] && memcmp(h + i, n, nl) == 0)
            return h + i;
    return NULL;
}

static tmpl_val_t str_replace(tmpl_rctx_t *r, const tmpl_str_t *s, const tmpl_str_t *old,
                              const tmpl_str_t *new, int64_t count)
{
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    if (old->len == 0) { /* between every character, as Python and JavaScript do */
        for (size_t i = 0; i <= s->len; i++) {
            if (count != 0) {
                tmpl_sb_add(&r->a, &sb, new->s, new->len);
                if (count > 0)
                    count--;
            }
            if (i < s->len)
                tmpl_sb_add(&r->a, &sb, s->s + i, 1);
        }
        return tv_str(r, sb.d, sb.len);
    }
    const char *p = s->s, *end = s->s + s->len, *hit;
    while (count != 0 && (hit = find(p, (size_t)(end - p), old->s, old->len)) != NULL) {
        tmpl_sb_add(&r->a, &sb, p, (size_t)(hit - p));
        tmpl_sb_add(&r->a, &sb, new->s, new->len);
        p = hit + old->len;
        if (count > 0)
            count--;
    }
    tmpl_sb_add(&r->a, &sb, p, (size_t)(end - p));
    return tv_str(r, sb.d, sb.len);
}

static tmpl_val_t str_split(tmpl_rctx_t *r, const tmpl_str_t *s, tmpl_val_t *sep, int64_t max)
{
    tmpl_val_t out = tv_list(r, 4);
    const char *p = s->s, *end = s->s + s->len;
    if (sep == NULL || sep->k == V_NONE) {
        size_t k;
        for (;;) {
            while (p < end && (k = tmpl_space_at(p, (size_t)(end - p))) > 0)
                p += k;
            if (p == end)
                break;
            if (max >= 0 && (int64_t)out.u.l->n >= max) {
                tv_list_push(r, out, tv_str(r, p, (size_t)(end - p)));
                break;
            }
            const char *w = p;
            while (p < end && tmpl_space_at(p, (size_t)(end - p)) == 0)
                p++;
            tv_list_push(r, out, tv_str(r, w, (size_t)(p - w)));
        }
        return out;
    }
    const tmpl_str_t *sp = want_str(r, sep, "split() separator");
    if (sp->len == 0)
        tmpl_rt_fail(r, "empty separator");
    const char *hit;
    while ((max < 0 || (int64_t)out.u.l->n < max) &&
           (hit = find(p, (size_t)(end - p), sp->s, sp->len)) != NULL) {
        tv_list_push(r, out, tv_str(r, p, (size_t)(hit - p)));
        p = hit + sp->len;
    }
    tv_list_push(r, out, tv_str(r, p, (size_t)(end - p)));
    return out;
}

static int str_affix(tmpl_rctx_t *r, const tmpl_str_t *s, tmpl_val_t *arg, int end)
{
    if (arg == NULL)
        tmpl_rt_fail(r, "%s() requires an argument", end ? "endswith" : "startswith");
    size_t n = arg->k == V_LIST ? arg->u.l->n : 1;
    for (size_t i = 0; i < n; i++) {
        const tmpl_str_t *a = want_str(r, arg->k == V_LIST ? &arg->u.l->v[i] : arg, "affix");
        if (a->len <= s->len && memcmp(end ? s->s + s->len - a->len : s->s, a->s, a->len) == 0)
            return 1;
    }
    return 0;
}

static tmpl_val_t html_escape(tmpl_rctx_t *r, const tmpl_str_t *s)
{
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    for (size_t i = 0; i < s->len; i++) {
        const char *e = NULL;
        switch (s->s[i]) {
        case '&':
            e = "&amp;";
            break;
        case '<':
            e = "&lt;";
            break;
        case '>':
            e = "&gt;";
            break;
        case '"':
            e = "&#34;";
            break;
        case '\'':
            e = "&#39;";
            break;
        }
        if (e)
            tmpl_sb_add(&r->a, &sb, e, strlen(e));
        else
            tmpl_sb_add(&r->a, &sb, s->s + i, 1);
    }
    return tv_str(r, sb.d, sb.len);
}

static size_t utf8_count(const tmpl_str_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->len; i++)
        n += ((unsigned char)s->s[i] & 0xc0) != 0x80;
    return n;
}

/* ---- dicts ---- */

static tmpl_val_t dict_items(tmpl_rctx_t *r, tmpl_val_t d, int what /* 0 items 1 keys 2 vals */)
{
    tmpl_val_t out = tv_list(r, d.u.d->n);
    for (size_t i = 0; i < d.u.d->n; i++) {
        tmpl_val_t key = {.k = V_STR, .u.s = d.u.d->k[i]};
        if (what == 1) {
            tv_list_push(r, out, key);
        } else if (what == 2) {
            tv_list_push(r, out, d.u.d->v[i]);
        } else {
            tmpl_val_t pair = tv_list(r, 2);
            tv_list_push(r, pair, key);
            tv_list_push(r, pair, d.u.d->v[i]);
            tv_list_push(r, out, pair);
        }
    }
    return out;
}

/* item.a.b for map/selectattr */
static tmpl_val_t attr_path(tmpl_val_t v, const tmpl_str_t *path)
{
    const char *p = path->s, *end = path->s + path->len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        if (v.k != V_DICT && v.k != V_NS)
            return tv_undef();
        tmpl_val_t *got = tv_dict_get(v, p, (size_t)(e - p));
        if (got == NULL)
            return tv_undef();
        v = *got;
        if (!dot)
            break;
        p = dot + 1;
    }
    return v;
}

/* ---- filters ---- */

static tmpl_val_t f_tojson(tmpl_rctx_t *r, tmpl_val_t v, tmpl_args_t *args)
{
    tmpl_json_opts_t o = {.indent = -1, .undef_as_null = 1};
    tmpl_val_t *a;
    if ((a = tmpl_arg(args, 99, "indent")) != NULL && a->k != V_NONE) {
        if (a->k != V_INT)
            tmpl_rt_fail(r, "tojson indent must be a number");
        o.indent = (int)(a->u.i > 100 ? 100 : a->u.i);
    }
    if ((a = tmpl_arg(args, 99, "ensure_ascii")) != NULL)
        o.ensure_ascii = tv_truthy(*a);
    if ((a = tmpl_arg(args, 99, "sort_keys")) != NULL)
        o.sort_keys = tv_truthy(*a);
    if ((a = tmpl_arg(args, 99, "separators")) != NULL && a->k != V_NONE) {
        if (a->k != V_LIST || a->u.l->n != 2 || a->u.l->v[0].k != V_STR || a->u.l->v[1].k != V_STR)
            tmpl_rt_fail(r, "separators must be a tuple of two strings");
        o.item_sep = a->u.l->v[0].u.s;
        o.key_sep = a->u.l->v[1].u.s;
    }
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    tv_json(r, &sb, v, &o, 0);
    return tv_str(r, sb.d, sb.len);
}

static tmpl_val_t f_select(tmpl_rctx_t *r, tmpl_val_t v, tmpl_args_t *args, int select)
{
    if (v.k != V_LIST)
        tmpl_rt_fail(r, "selectattr/rejectattr need a list");
    const tmpl_str_t *attr = want_str(r, tmpl_arg(args, 0, NULL), "attribute name");
    tmpl_val_t *tname = tmpl_arg(args, 1, NULL);
    int test = -1;
    if (tname != NULL) {
        const tmpl_str_t *t = want_str(r, tname, "test name");
        if ((test = tmpl_test_id(t->s, t->len)) < 0)
            tmpl_rt_fail(r, "unknown test '%.*s'", (int)t->len, t->s);
    }
    tmpl_args_t targs = {0};
    if (args->npos > 2) {
        targs.pos = &args->pos[2];
        targs.npos = args->npos - 2;
    }
    tmpl_val_t out = tv_list(r, v.u.l->n);
    for (size_t i = 0; i < v.u.l->n; i++) {
        tmpl_val_t item = v.u.l->v[i];
        if (item.k != V_DICT && item.k != V_NS)
            tmpl_rt_fail(r, "selectattr/rejectattr need a list of mappings");
        tmpl_val_t a = attr_path(item, attr);
        int ok = tv_truthy(a) && (test < 0 ? 1 : tmpl_test(r, test, a, &targs));
        if (ok == select)
            tv_list_push(r, out, item);
    }
    return out;
}

tmpl_val_t tmpl_filter(tmpl_rctx_t *r, int id, tmpl_val_t v, tmpl_args_t *args, int called)
{
    tmpl_val_t *a0 = tmpl_arg(args, 0, NULL);
    (void)called;
    switch (id) {
    case FL_SAFE:
        return v;
    case FL_TOJSON:
        return f_tojson(r, v, args);
    case FL_DEFAULT:
    case FL_D: {
        tmpl_val_t *dflt = tmpl_arg(args, 0, "default_value");
        tmpl_val_t *boolean = tmpl_arg(args, 1, "boolean");
        if (v.k == V_UNDEF || (boolean && tv_truthy(*boolean) && !tv_truthy(v)))
            return dflt ? *dflt : tv_str(r, "", 0);
        return v;
    }
    case FL_LENGTH:
    case FL_COUNT:
        if (v.k == V_LIST)
            return tv_int((int64_t)v.u.l->n);
        if (v.k == V_DICT)
            return tv_int((int64_t)v.u.d->n);
        if (v.k == V_STR)
            return tv_int((int64_t)utf8_count(v.u.s));
        break;
    case FL_ITEMS:
        if (v.k == V_DICT)
            return dict_items(r, v, 0);
        break;
    case FL_LIST:
        if (v.k == V_LIST)
            return v;
        if (v.k == V_DICT)
            return dict_items(r, v, 1);
        break;
    case FL_FIRST:
    case FL_LAST:
        if (v.k == V_LIST)
            return v.u.l->n == 0 ? tv_undef() : v.u.l->v[id == FL_FIRST ? 0 : v.u.l->n - 1];
        break;
    case FL_REVERSE:
        if (v.k == V_LIST) {
            tmpl_val_t out = tv_list(r, v.u.l->n);
            for (size_t i = v.u.l->n; i-- > 0;)
                tv_list_push(r, out, v.u.l->v[i]);
            return out;
        }
        break;
    case FL_UNIQUE:
        if (v.k == V_LIST) {
            tmpl_val_t out = tv_list(r, v.u.l->n);
            for (size_t i = 0; i < v.u.l->n; i++) {
                int seen = 0;
                for (size_t j = 0; j < out.u.l->n && !seen; j++)
                    seen = tv_same(out.u.l->v[j], v.u.l->v[i]);
                if (!seen)
                    tv_list_push(r, out, v.u.l->v[i]);
            }
            return out;
        }
        break;
    case FL_JOIN: {
        tmpl_val_t *sepv = tmpl_arg(args, 0, "d");
        if (sepv == NULL)
            sepv = tmpl_arg(args, 99, "separator");
        const tmpl_str_t *sep = sepv ? want_str(r, sepv, "join separator") : NULL;
        if (v.k != V_LIST && v.k != V_STR)
            break;
        if (v.k == V_STR && sep == NULL)
            return v;
        tmpl_sb_t sb = {0};
        tmpl_sb_add(&r->a, &sb, "", 0);
        if (v.k == V_STR) {
            for (size_t i = 0; i < v.u.s->len;) {
                size_t n = 1;
                while (i + n < v.u.s->len && ((unsigned char)v.u.s->s[i + n] & 0xc0) == 0x80)
                    n++;
                if (i && sep)
                    tmpl_sb_add(&r->a, &sb, sep->s, sep->len);
                tmpl_sb_add(&r->a, &sb, v.u.s->s + i, n);
                i += n;
            }
        } else {
            for (size_t i = 0; i < v.u.l->n; i++) {
                if (i && sep)
                    tmpl_sb_add(&r->a, &sb, sep->s, sep->len);
                tv_print(r, &sb, v.u.l->v[i]);
            }
        }
        return tv_str(r, sb.d, sb.len);
    }
    case FL_STRING:
        if (v.k == V_UNDEF || v.k == V_NONE || v.k == V_FUNC)
            break;
        return (tmpl_val_t){.k = V_STR, .u.s = tv_to_str(r, v)};
    case FL_UPPER:
    case FL_LOWER:
    case FL_TITLE:
    case FL_CAPITALIZE:
        if (v.k == V_STR)
            return str_case(r, v.u.s,
                            id == FL_LOWER        ? 0
                            : id == FL_UPPER      ? 1
                            : id == FL_CAPITALIZE ? 2
                                                  : 3);
        break;
    case FL_TRIM:
        if (v.k == V_STR)
            return str_strip(r, v.u.s, 1, 1, a0);
        break;
    case FL_E:
    case FL_ESCAPE:
        if (v.k == V_STR)
            return html_escape(r, v.u.s);
        break;
    case FL_INDENT:
        if (v.k == V_STR) {
            tmpl_val_t *w = tmpl_arg(args, 0, "width");
            tmpl_val_t *first = tmpl_arg(args, 1, "first");
            tmpl_val_t *blank = tmpl_arg(args, 2, "blank");
            int64_t width = 4;
            tmpl_str_t *pad = NULL;
            if (w != NULL && w->k == V_INT)
                width = w->u.i < 0 ? 0 : w->u.i > 1000 ? 1000 : w->u.i;
            else if (w != NULL && w->k == V_STR)
                pad = w->u.s;
            else if (w != NULL)
                tmpl_rt_fail(r, "indent width must be a number");
            tmpl_sb_t sb = {0};
            tmpl_sb_add(&r->a, &sb, "", 0);
            const char *p = v.u.s->s, *end = p + v.u.s->len;
            for (int line = 0;; line++) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *e = nl ? nl : end;
                int skip = (line == 0 && !(first && tv_truthy(*first))) ||
                           (e == p && !(blank && tv_truthy(*blank)));
                if (!skip) {
                    if (pad)
                        tmpl_sb_add(&r->a, &sb, pad->s, pad->len);
                    else
                        for (int64_t k = 0; k < width; k++)
                            tmpl_sb_add(&r->a, &sb, " ", 1);
                }
                tmpl_sb_add(&r->a, &sb, p, (size_t)(e - p));
                if (!nl)
                    break;
                tmpl_sb_add(&r->a, &sb, "\n", 1);
                p = nl + 1;
            }
            return tv_str(r, sb.d, sb.len);
        }
        break;
    case FL_REPLACE:
        if (v.k == V_STR) {
            tmpl_val_t *cnt = tmpl_arg(args, 2, "count");
            return str_replace(r, v.u.s, want_str(r, a0, "replace() argument"),
                               want_str(r, tmpl_arg(args, 1, NULL), "replace() argument"),
                               cnt && cnt->k == V_INT ? cnt->u.i : -1);
        }
        break;
    case FL_INT:
    case FL_FLOAT: {
        tmpl_val_t *dflt = tmpl_arg(args, 0, "default");
        if (v.k == V_INT || v.k == V_FLOAT)
            return id == FL_INT ? tv_int(v.k == V_INT ? v.u.i : (int64_t)v.u.f)
                                : tv_float(v.k == V_INT ? (double)v.u.i : v.u.f);
        if (v.k == V_BOOL)
            return id == FL_INT ? tv_int(v.u.b) : tv_float(v.u.b);
        if (v.k == V_STR) {
            char *end;
            const char *s = tmpl_strndup(&r->a, v.u.s->s, v.u.s->len);
            if (id == FL_INT) {
                long long x = strtoll(s, &end, 10);
                if (end != s)
                    return tv_int(x);
                return dflt ? *dflt : tv_int(0);
            }
            double x = strtod(s, &end);
            if (end != s)
                return tv_float(x);
            return dflt ? *dflt : tv_float(0);
        }
        break;
    }
    case FL_ABS:
        if (v.k == V_INT)
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.k == V_FLOAT)
            return tv_float(v.u.f < 0 ? -v.u.f : v.u.f);
        break;
    case FL_BOOL:
        return tv_bool(tv_truthy(v));
    case FL_SELECTATTR:
    case FL_REJECTATTR:
        return f_select(r, v, args, id == FL_SELECTATTR);
    case FL_MAP: {
        tmpl_val_t *attr = tmpl_arg(args, 99, "attribute");
        if (v.k != V_LIST || attr == NULL)
            tmpl_rt_fail(r, "map needs a list and attribute=");
        const tmpl_str_t *path = want_str(r, attr, "map attribute");
        tmpl_val_t *dflt = tmpl_arg(args, 99, "default");
        tmpl_val_t out = tv_list(r, v.u.l->n);
        for (size_t i = 0; i < v.u.l->n; i++) {
            tmpl_val_t got = attr_path(v.u.l->v[i], path);
            tv_list_push(r, out, got.k == V_UNDEF && dflt ? *dflt : got);
        }
        return out;
    }
    }
    tmpl_rt_fail(r, "filter '%s' cannot be applied to %s", FILTERS[id], tv_type_name(v));
}

int tmpl_test(tmpl_rctx_t *r, int id, tmpl_val_t v, tmpl_args_t *args)
{
    switch (id) {
    case TS_BOOLEAN:
        return v.k == V_BOOL;
    case TS_CALLABLE:
        return v.k == V_FUNC;
    case TS_ODD:
    case TS_EVEN:
        if (v.k != V_INT)
            tmpl_rt_fail(r, "odd/even need an integer, got %s", tv_type_name(v));
        return (v.u.i % 2 != 0) == (id == TS_ODD);
    case TS_FALSE:
        return v.k == V_BOOL && !v.u.b;
    case TS_TRUE:
        return v.k == V_BOOL && v.u.b;
    case TS_NONE:
        return v.k == V_NONE;
    case TS_STRING:
        return v.k == V_STR;
    case TS_NUMBER:
        return v.k == V_INT || v.k == V_FLOAT;
    case TS_INTEGER:
        return v.k == V_INT;
    case TS_FLOAT:
        return v.k == V_FLOAT;
    case TS_ITERABLE:
        return v.k == V_LIST || v.k == V_STR;
    case TS_MAPPING:
        return v.k == V_DICT;
    case TS_SEQUENCE:
        return v.k == V_LIST || v.k == V_DICT || v.k == V_STR;
    case TS_LOWER:
    case TS_UPPER: {
        if (v.k != V_STR)
            return 0;
        tmpl_val_t c = str_case(r, v.u.s, id == TS_LOWER ? 0 : 1);
        return c.u.s->len == v.u.s->len && memcmp(c.u.s->s, v.u.s->s, c.u.s->len) == 0;
    }
    case TS_DEFINED:
        return v.k != V_UNDEF;
    case TS_UNDEFINED:
        return v.k == V_UNDEF;
    case TS_EQUALTO:
    case TS_EQ: {
        tmpl_val_t *other = tmpl_arg(args, 0, NULL);
        return tv_same(v, other ? *other : tv_undef());
    }
    }
    return 0;
}

tmpl_val_t tmpl_attr_builtin(tmpl_rctx_t *r, tmpl_val_t obj, const char *name, size_t len)
{
    int k = lookup(METHODS, name, len);
    if (obj.k == V_STR && len == 6 && memcmp(name, "length", 6) == 0)
        return tv_int((int64_t)utf8_count(obj.u.s));
    if (obj.k == V_LIST && len == 6 && memcmp(name, "length", 6) == 0)
        return tv_int((int64_t)obj.u.l->n);
    if (k < 0 || (obj.k == V_STR && k > 10) || (obj.k == V_DICT && k <= 10) ||
        (obj.k != V_STR && obj.k != V_DICT))
        return tv_undef();
    tmpl_func_t *fn = tmpl_alloc(&r->a, sizeof(*fn));
    fn->kind = F_METHOD;
    fn->name = METHODS[k];
    fn->namelen = len;
    fn->self = obj;
    return (tmpl_val_t){.k = V_FUNC, .u.fn = fn};
}

tmpl_val_t tmpl_call_method(tmpl_rctx_t *r, tmpl_func_t *fn, tmpl_args_t *args)
{
    const char *m = fn->name;
    tmpl_val_t self = fn->self;
    tmpl_val_t *a0 = tmpl_arg(args, 0, NULL), *a1 = tmpl_arg(args, 1, NULL);
    if (self.k == V_DICT) {
        if (strcmp(m, "get") == 0) {
            const tmpl_str_t *key = want_str(r, a0, "mapping key");
            tmpl_val_t *got = tv_dict_get(self, key->s, key->len);
            return got ? *got : a1 ? *a1 : tv_none();
        }
        return dict_items(r, self, strcmp(m, "items") == 0 ? 0 : strcmp(m, "keys") == 0 ? 1 : 2);
    }
    const tmpl_str_t *s = self.u.s;
    if (strcmp(m, "upper") == 0)
        return str_case(r, s, 1);
    if (strcmp(m, "lower") == 0)
        return str_case(r, s, 0);
    if (strcmp(m, "capitalize") == 0)
        return str_case(r, s, 2);
    if (strcmp(m, "title") == 0)
        return str_case(r, s, 3);
    if (strcmp(m, "strip") == 0)
        return str_strip(r, s, 1, 1, a0);
    if (strcmp(m, "lstrip") == 0)
        return str_strip(r, s, 1, 0, a0);
    if (strcmp(m, "rstrip") == 0)
        return str_strip(r, s, 0, 1, a0);
    if (strcmp(m, "startswith") == 0)
        return tv_bool(str_affix(r, s, a0, 0));
    if (strcmp(m, "endswith") == 0)
        return tv_bool(str_affix(r, s, a0, 1));
    if (strcmp(m, "split") == 0) {
        tmpl_val_t *mx = tmpl_arg(args, 1, "maxsplit");
        return str_split(r, s, tmpl_arg(args, 0, "sep"), mx && mx->k == V_INT ? mx->u.i : -1);
    }
    /* replace */
    tmpl_val_t *cnt = tmpl_arg(args, 2, "count");
    return str_replace(r, s, want_str(r, a0, "replace() argument"),
                       want_str(r, a1, "replace() argument"),
                       cnt && cnt->k == V_INT ? cnt->u.i : -1);
}

static tmpl_val_t g_range(tmpl_rctx_t *r, tmpl_args_t *args)
{
    int64_t v[3] = {0, 0, 1};
    if (args->npos < 1 || args->npos > 3)
        tmpl_rt_fail(r, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < args->npos; i++) {
        if (args->pos[i].k != V_INT)
            tmpl_rt_fail(r, "range() arguments must be integers");
    }
    if (args->npos == 1) {
        v[1] = args->pos[0].u.i;
    } else {
        v[0] = args->pos[0].u.i;
        v[1] = args->pos[1].u.i;
        if (args->npos == 3)
            v[2] = args->pos[2].u.i;
    }
    if (v[2] == 0)
        tmpl_rt_fail(r, "range() step must not be zero");
    tmpl_val_t out = tv_list(r, 0);
    for (int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2]) {
        if (++r->steps > r->max_steps)
            tmpl_rt_fail(r, "template exceeded %llu evaluation steps",
                         (unsigned long long)r->max_steps);
        tv_list_push(r, out, tv_int(x));
    }
    return out;
}

tmpl_val_t tmpl_call_global(tmpl_rctx_t *r, int which, tmpl_args_t *args)
{
    switch (which) {
    case G_RAISE: {
        tmpl_val_t *msg = tmpl_arg(args, 0, NULL);
        tmpl_str_t *s = msg ? tv_to_str(r, *msg) : tv_str(r, "", 0).u.s;
        tmpl_failf(&r->fail, "%.*s", (int)s->len, s->s);
    }
    case G_RANGE:
        return g_range(r, args);
    case G_STRFTIME: {
        const tmpl_str_t *fmt = want_str(r, tmpl_arg(args, 0, NULL), "strftime_now format");
        uint64_t ns = r->wall && r->wall->now ? r->wall->now(r->wall->arg) : pdb_clock_real_ns();
        time_t t = (time_t)(ns / PDB_NSEC_PER_SEC);
        struct tm tm;
        localtime_r(&t, &tm);
        char buf[256];
        const char *f = tmpl_strndup(&r->a, fmt->s, fmt->len);
        size_t n = strftime(buf, sizeof(buf), f, &tm);
        return tv_str(r, buf, n);
    }
    case G_NAMESPACE: {
        tmpl_val_t ns = tv_dict(r, V_NS);
        tmpl_val_t *src = tmpl_arg(args, 0, NULL);
        if (src != NULL && src->k == V_DICT)
            for (size_t i = 0; i < src->u.d->n; i++)
                tv_dict_set(r, ns, src->u.d->k[i]->s, src->u.d->k[i]->len, src->u.d->v[i]);
        else if (src != NULL)
            tmpl_rt_fail(r, "namespace() takes a mapping or keyword arguments");
        for (size_t k = 0; k < args->nkw; k++)
            tv_dict_set(r, ns, args->kwn[k], args->kwl[k], args->kwv[k]);
        return ns;
    }
    }
    tmpl_rt_fail(r, "unknown global");
}
