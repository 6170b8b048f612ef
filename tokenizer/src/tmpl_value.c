/*
 * tmpl_value.c - runtime values of the template renderer: construction, conversion from the
 * request's JSON, truthiness, equality, printing and tojson.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl_rt.h"

void tmpl_rt_fail(tmpl_rctx_t *r, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tmpl_failf(&r->fail, "line %d: %s", r->line, msg);
}

tmpl_val_t tv_str(tmpl_rctx_t *r, const char *s, size_t n)
{
    tmpl_str_t *str = tmpl_alloc(&r->a, sizeof(*str) + n + 1);
    str->len = n;
    if (n && s != NULL)
        memcpy(str->s, s, n);
    return (tmpl_val_t){.k = V_STR, .u.s = str};
}

tmpl_val_t tv_list(tmpl_rctx_t *r, size_t cap)
{
    tmpl_list_t *l = tmpl_alloc(&r->a, sizeof(*l));
    l->cap = cap;
    l->v = cap ? tmpl_alloc(&r->a, cap * sizeof(tmpl_val_t)) : NULL;
    return (tmpl_val_t){.k = V_LIST, .u.l = l};
}

tmpl_val_t tv_dict(tmpl_rctx_t *r, tmpl_vkind_t kind)
{
    tmpl_dict_t *d = tmpl_alloc(&r->a, sizeof(*d));
    return (tmpl_val_t){.k = kind, .u.d = d};
}

void tv_list_push(tmpl_rctx_t *r, tmpl_val_t list, tmpl_val_t v)
{
    tmpl_list_t *l = list.u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tmpl_val_t *nv = tmpl_alloc(&r->a, cap * sizeof(*nv));
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

tmpl_val_t *tv_dict_get(tmpl_val_t dict, const char *key, size_t klen)
{
    tmpl_dict_t *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i]->len == klen && memcmp(d->k[i]->s, key, klen) == 0)
            return &d->v[i];
    return NULL;
}

void tv_dict_set(tmpl_rctx_t *r, tmpl_val_t dict, const char *key, size_t klen, tmpl_val_t v)
{
    tmpl_val_t *old = tv_dict_get(dict, key, klen);
    if (old != NULL) {
        *old = v;
        return;
    }
    tmpl_dict_t *d = dict.u.d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        tmpl_str_t **nk = tmpl_alloc(&r->a, cap * sizeof(*nk));
        tmpl_val_t *nv = tmpl_alloc(&r->a, cap * sizeof(*nv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(*nk));
            memcpy(nv, d->v, d->n * sizeof(*nv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = tv_str(r, key, klen).u.s;
    d->v[d->n++] = v;
}

tmpl_val_t tv_from_json(tmpl_rctx_t *r, const json_t *j)
{
    if (++r->depth > 1000)
        tmpl_rt_fail(r, "request nested too deeply");
    tmpl_val_t v = tv_undef();
    switch (json_typeof(j)) {
    case JSON_NULL:
        v = tv_none();
        break;
    case JSON_TRUE:
        v = tv_bool(1);
        break;
    case JSON_FALSE:
        v = tv_bool(0);
        break;
    case JSON_INTEGER:
        v = tv_int(json_integer_value(j));
        break;
    case JSON_REAL:
        v = tv_float(json_real_value(j));
        break;
    case JSON_STRING:
        v = tv_str(r, json_string_value(j), json_string_length(j));
        break;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        v = tv_list(r, n);
        for (size_t i = 0; i < n; i++)
            tv_list_push(r, v, tv_from_json(r, json_array_get(j, i)));
        break;
    }
    case JSON_OBJECT: {
        v = tv_dict(r, V_DICT);
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val)
        {
            tv_dict_set(r, v, key, strlen(key), tv_from_json(r, val));
        }
        break;
    }
    }
    r->depth--;
    return v;
}

const char *tv_type_name(tmpl_val_t v)
{
    static const char *const names[] = {"undefined", "none", "boolean", "integer",   "float",
                                        "string",    "list", "mapping", "namespace", "callable"};
    return names[v.k];
}

int tv_truthy(tmpl_val_t v)
{
    switch (v.k) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
        return v.u.b;
    case V_INT:
        return v.u.i != 0;
    case V_FLOAT:
        return v.u.f != 0 && !isnan(v.u.f);
    case V_STR:
        return v.u.s->len > 0;
    case V_LIST:
        return v.u.l->n > 0;
    case V_DICT:
        return v.u.d->n > 0;
    case V_NS:
    case V_FUNC:
        return 1;
    }
    return 0;
}

static int numeric(tmpl_val_t v, double *out)
{
    if (v.k == V_INT)
        *out = (double)v.u.i;
    else if (v.k == V_FLOAT)
        *out = v.u.f;
    else if (v.k == V_BOOL)
        *out = v.u.b;
    else
        return 0;
    return 1;
}

int tv_same(tmpl_val_t a, tmpl_val_t b)
{
    if ((a.k == V_INT || a.k == V_FLOAT) && (b.k == V_INT || b.k == V_FLOAT)) {
        double x, y;
        numeric(a, &x);
        numeric(b, &y);
        return x == y;
    }
    if (a.k != b.k)
        return 0;
    switch (a.k) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_BOOL:
        return a.u.b == b.u.b;
    case V_STR:
        return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case V_LIST:
        return a.u.l == b.u.l;
    case V_DICT:
    case V_NS:
        return a.u.d == b.u.d;
    case V_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return 0;
    }
}

int tv_equal(tmpl_val_t a, tmpl_val_t b)
{
    int a_nil = a.k == V_UNDEF || a.k == V_NONE, b_nil = b.k == V_UNDEF || b.k == V_NONE;
    if (a_nil || b_nil)
        return a_nil && b_nil;
    double x, y;
    if (numeric(a, &x) && numeric(b, &y))
        return x == y;
    return tv_same(a, b);
}

/* ECMAScript Number::toString: the shortest digits that read back as <f>. */
void tv_num(tmpl_sb_t *sb, tmpl_rctx_t *r, double f)
{
    char buf[64];
    if (isnan(f)) {
        tmpl_sb_add(&r->a, sb, "NaN", 3);
        return;
    }
    if (isinf(f)) {
        tmpl_sb_add(&r->a, sb, f < 0 ? "-Infinity" : "Infinity", f < 0 ? 9 : 8);
        return;
    }
    if (f == 0) {
        tmpl_sb_add(&r->a, sb, "0", 1);
        return;
    }
    if (f < 0) {
        tmpl_sb_add(&r->a, sb, "-", 1);
        f = -f;
    }
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    char digits[32];
    size_t k = 0;
    for (char *c = buf; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9')
            digits[k++] = *c;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    int n = atoi(strchr(buf, 'e') + 1) + 1;
    char out[64];
    size_t o = 0;
    if ((int)k <= n && n <= 21) {
        memcpy(out, digits, k);
        o = k;
        for (int z = 0; z < n - (int)k; z++)
            out[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(out, digits, (size_t)n);
        o = (size_t)n;
        out[o++] = '.';
        memcpy(out + o, digits + n, k - (size_t)n);
        o += k - (size_t)n;
    } else if (-6 < n && n <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int z = 0; z < -n; z++)
            out[o++] = '0';
        memcpy(out + o, digits, k);
        o += k;
    } else {
        out[o++] = digits[0];
        if (k > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, k - 1);
            o += k - 1;
        }
        o += (size_t)snprintf(out + o, sizeof(out) - o, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    }
    tmpl_sb_add(&r->a, sb, out, o);
}

static void print_float(tmpl_rctx_t *r, tmpl_sb_t *sb, double f)
{
    if (f == 0 && signbit(f)) {
        tmpl_sb_add(&r->a, sb, "-0.0", 4);
        return;
    }
    tv_num(sb, r, f);
    if (isfinite(f) && f == floor(f) && fabs(f) < 1e21)
        tmpl_sb_add(&r->a, sb, ".0", 2);
}

void tv_print(tmpl_rctx_t *r, tmpl_sb_t *sb, tmpl_val_t v)
{
    char buf[32];
    switch (v.k) {
    case V_UNDEF:
    case V_NONE:
        return;
    case V_BOOL:
        tmpl_sb_add(&r->a, sb, v.u.b ? "true" : "false", v.u.b ? 4 : 5);
        return;
    case V_INT:
        tmpl_sb_add(&r->a, sb, buf, (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i));
        return;
    case V_FLOAT:
        print_float(r, sb, v.u.f);
        return;
    case V_STR:
        tmpl_sb_add(&r->a, sb, v.u.s->s, v.u.s->len);
        return;
    case V_LIST:
    case V_DICT:
    case V_NS: {
        tmpl_json_opts_t o = {.indent = -1};
        tv_json(r, sb, v, &o, 0);
        return;
    }
    case V_FUNC:
        tmpl_rt_fail(r, "cannot print a callable");
    }
}

tmpl_str_t *tv_to_str(tmpl_rctx_t *r, tmpl_val_t v)
{
    if (v.k == V_STR)
        return v.u.s;
    tmpl_sb_t sb = {0};
    tmpl_sb_add(&r->a, &sb, "", 0);
    tv_print(r, &sb, v);
    return tv_str(r, sb.d, sb.len).u.s;
}

static void json_str_out(tmpl_rctx_t *r, tmpl_sb_t *sb, const char *s, size_t n, int ascii)
{
    static const char hex[] = "0123456789abcdef";
    tmpl_sb_add(&r->a, sb, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[16];
        size_t adv = 1;
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20 || (ascii && c == 0x7f)) {
            snprintf(u, sizeof(u), "\\u00%c%c", hex[c >> 4], hex[c & 15]);
            esc = u;
        } else if (ascii && c >= 0x80) {
            unsigned cp = 0;
            size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            if (i + len > n)
                len = n - i;
            cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f);
            for (size_t k = 1; k < len; k++)
                cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3f);
            adv = len;
            if (cp >= 0x10000) {
                unsigned v = cp - 0x10000;
                snprintf(u, sizeof(u), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                snprintf(u, sizeof(u), "\\u%04x", cp);
            }
            esc = u;
        }
        if (esc == NULL) {
            run++;
            i++;
            continue;
        }
        if (run)
            tmpl_sb_add(&r->a, sb, s + i - run, run);
        run = 0;
        tmpl_sb_add(&r->a, sb, esc, strlen(esc));
        i += adv;
    }
    if (run)
        tmpl_sb_add(&r->a, sb, s + n - run, run);
    tmpl_sb_add(&r->a, sb, "\"", 1);
}

static void newline_pad(tmpl_rctx_t *r, tmpl_sb_t *sb, int indent, int depth)
{
    tmpl_sb_add(&r->a, sb, "\n", 1);
    for (int k = 0; k < indent * depth; k++)
        tmpl_sb_add(&r->a, sb, " ", 1);
}

static int key_cmp(const void *x, const void *y)
{
    const tmpl_str_t *a = *(tmpl_str_t *const *)x, *b = *(tmpl_str_t *const *)y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

void tv_json(tmpl_rctx_t *r, tmpl_sb_t *sb, tmpl_val_t v, const tmpl_json_opts_t *o, int depth)
{
    if (depth > 500)
        tmpl_rt_fail(r, "value nested too deeply for tojson");
    int ind = o->indent > 0 ? o->indent : 0;
    const char *isep = o->item_sep ? o->item_sep->s : (ind ? "," : ", ");
    size_t isl = o->item_sep ? o->item_sep->len : strlen(isep);
    const char *ksep = o->key_sep ? o->key_sep->s : ": ";
    size_t ksl = o->key_sep ? o->key_sep->len : 2;
    char buf[32];
    switch (v.k) {
    case V_UNDEF:
        if (o->undef_as_null)
            tmpl_sb_add(&r->a, sb, "null", 4);
        else
            tmpl_sb_add(&r->a, sb, "undefined", 9);
        return;
    case V_NONE:
        tmpl_sb_add(&r->a, sb, "null", 4);
        return;
    case V_BOOL:
        tmpl_sb_add(&r->a, sb, v.u.b ? "true" : "false", v.u.b ? 4 : 5);
        return;
    case V_INT:
        tmpl_sb_add(&r->a, sb, buf, (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i));
        return;
    case V_FLOAT:
        if (!isfinite(v.u.f))
            tmpl_sb_add(&r->a, sb, "null", 4);
        else
            print_float(r, sb, v.u.f); /* keeps ".0" as Python's json does */
        return;
    case V_STR:
        json_str_out(r, sb, v.u.s->s, v.u.s->len, o->ensure_ascii);
        return;
    case V_LIST: {
        tmpl_list_t *l = v.u.l;
        tmpl_sb_add(&r->a, sb, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                tmpl_sb_add(&r->a, sb, isep, isl);
            if (ind)
                newline_pad(r, sb, ind, depth + 1);
            tv_json(r, sb, l->v[i], o, depth + 1);
        }
        if (ind && l->n)
            newline_pad(r, sb, ind, depth);
        tmpl_sb_add(&r->a, sb, "]", 1);
        return;
    }
    case V_DICT:
    case V_NS: {
        tmpl_dict_t *d = v.u.d;
        size_t *order = tmpl_alloc(&r->a, (d->n + 1) * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys && d->n > 1) {
            tmpl_str_t **keys = tmpl_alloc(&r->a, d->n * sizeof(*keys));
            memcpy(keys, d->k, d->n * sizeof(*keys));
            qsort(keys, d->n, sizeof(*keys), key_cmp);
            for (size_t i = 0; i < d->n; i++)
                for (size_t j = 0; j < d->n; j++)
                    if (d->k[j] == keys[i])
                        order[i] = j;
        }
        tmpl_sb_add(&r->a, sb, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            size_t j = order[i];
            if (i)
                tmpl_sb_add(&r->a, sb, isep, isl);
            if (ind)
                newline_pad(r, sb, ind, depth + 1);
            json_str_out(r, sb, d->k[j]->s, d->k[j]->len, o->ensure_ascii);
            tmpl_sb_add(&r->a, sb, ksep, ksl);
            tv_json(r, sb, d->v[j], o, depth + 1);
        }
        if (ind && d->n)
            newline_pad(r, sb, ind, depth);
        tmpl_sb_add(&r->a, sb, "}", 1);
        return;
    }
    case V_FUNC:
        tmpl_rt_fail(r, "cannot convert a callable to JSON");
    }
}
