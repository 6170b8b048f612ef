/*
 * kvt_msg_json.c -- JSON view of libkvt messages (logs, kvt-msgtool),
 * driven by the same descriptor tables as the msgpack codec.
 */
#include "kvt_msg_int.h"
#include "pdb/pdb_hex.h"

#include <jansson.h>
#include <string.h>

static json_t *struct_to_json(const kvt_msg_desc_t *d, const void *base);

/* bin fields show as lowercase hex */
static json_t *bytes_to_json(const kvt_bytes_t *b)
{
    static const char hex[] = "0123456789abcdef";
    char *s = kvt_malloc((size_t)b->n * 2 + 1);
    json_t *j;

    if (s == NULL)
        return NULL;
    for (uint32_t i = 0; i < b->n; i++) {
        s[2 * i] = hex[b->p[i] >> 4];
        s[2 * i + 1] = hex[b->p[i] & 15];
    }
    s[(size_t)b->n * 2] = '\0';
    j = json_string(s);
    kvt_free(s);
    return j;
}

static kvt_status_t bytes_from_json(json_t *v, kvt_bytes_t *b)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    size_t n = s != NULL ? json_string_length(v) : 0;
    uint8_t *p;
    kvt_status_t st;

    if (s == NULL || n % 2 != 0)
        return KVT_ERR_MSG_FIELD;
    if (n / 2 > KVT_MSG_MAX_STR)
        return KVT_ERR_LIMIT;
    p = kvt_malloc(n / 2 + 1);
    if (p == NULL)
        return KVT_ERR_NOMEM;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = pdb_hex_val(s[2 * i]), lo = pdb_hex_val(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            kvt_free(p);
            return KVT_ERR_MSG_FIELD;
        }
        p[i] = (uint8_t)(hi << 4 | lo);
    }
    st = kvt_bytes_set(b, p, n / 2);
    kvt_free(p);
    return st;
}

static json_t *field_to_json(const kvt_msg_field_t *f, const void *base)
{
    switch (f->kind) {
    case KVT_F_STR: {
        const char *s = *KVT_FIELD_CPTR(base, f, char *);
        return json_string(s != NULL ? s : "");
    }
    case KVT_F_BIN:
        return bytes_to_json(KVT_FIELD_CPTR(base, f, kvt_bytes_t));
    case KVT_F_INT:
        return json_integer((json_int_t)*KVT_FIELD_CPTR(base, f, int64_t));
    case KVT_F_U64: {
        uint64_t v = *KVT_FIELD_CPTR(base, f, uint64_t);
        return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
    }
    case KVT_F_BOOL:
        return json_boolean(*KVT_FIELD_CPTR(base, f, int));
    case KVT_F_STR_LIST: {
        const kvt_str_list_t *l = KVT_FIELD_CPTR(base, f, kvt_str_list_t);
        json_t *a = json_array();
        for (uint32_t i = 0; a != NULL && i < l->n; i++)
            if (json_array_append_new(a, json_string(l->v[i] ? l->v[i] : "")) != 0) {
                json_decref(a);
                a = NULL;
            }
        return a;
    }
    case KVT_F_INT_LIST: {
        const kvt_int_list_t *l = KVT_FIELD_CPTR(base, f, kvt_int_list_t);
        json_t *a = json_array();
        for (uint32_t i = 0; a != NULL && i < l->n; i++)
            if (json_array_append_new(a, json_integer((json_int_t)l->v[i])) != 0) {
                json_decref(a);
                a = NULL;
            }
        return a;
    }
    case KVT_F_STRUCT_LIST: {
        const char *arr = *KVT_FIELD_CPTR(base, f, char *);
        uint32_t n = *(const uint32_t *)((const char *)base + f->count_off);
        json_t *a = json_array();
        for (uint32_t i = 0; a != NULL && arr != NULL && i < n; i++)
            if (json_array_append_new(
                    a, struct_to_json(f->elem, arr + (size_t)i * f->elem->size)) != 0) {
                json_decref(a);
                a = NULL;
            }
        return a;
    }
    }
    return NULL;
}

static json_t *struct_to_json(const kvt_msg_desc_t *d, const void *base)
{
    json_t *o = json_object();

    if (o == NULL || json_object_set_new(o, "type", json_string(d->name)) != 0)
        goto err;
    for (uint32_t i = 0; i < d->nfields; i++) {
        /* like the wire: a pdgw extension at its default is not shown */
        if (d->fields[i].omit_default && d->fields[i].kind == KVT_F_INT &&
            *KVT_FIELD_CPTR(base, &d->fields[i], int64_t) == d->fields[i].def)
            continue;
        if (d->fields[i].omit_default && d->fields[i].kind == KVT_F_BIN &&
            KVT_FIELD_CPTR(base, &d->fields[i], kvt_bytes_t)->n == 0)
            continue;
        if (json_object_set_new(o, d->fields[i].name, field_to_json(&d->fields[i], base)) != 0)
            goto err;
    }
    return o;
err:
    json_decref(o);
    return NULL;
}

char *kvt_msg_to_json(const kvt_msg_t *m)
{
    const kvt_msg_desc_t *d;
    json_t *o;
    char *s, *copy;

    if (m == NULL || (d = kvt_msg_desc(m->type)) == NULL)
        return NULL;
    o = struct_to_json(d, &m->u);
    if (o == NULL)
        return NULL;
    s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(o);
    if (s == NULL)
        return NULL;
    copy = kvt_strdup(s); /* hand out memory the caller frees with kvt_free */
    free(s);
    return copy;
}

/* ---- JSON -> message --------------------------------------------------------- */

static kvt_status_t jfail(kvt_msg_err_t *err, kvt_status_t st, const char *field, const char *why)
{
    if (err != NULL) {
        err->field = field;
        err->reason = why;
    }
    return st;
}

static kvt_status_t json_str(json_t *v, char **out)
{
    if (!json_is_string(v))
        return KVT_ERR_MSG_FIELD;
    if (json_string_length(v) > KVT_MSG_MAX_STR)
        return KVT_ERR_LIMIT;
    if (strlen(json_string_value(v)) != json_string_length(v))
        return KVT_ERR_MSG_FIELD; /* embedded NUL */
    *out = kvt_strdup(json_string_value(v));
    return *out != NULL ? KVT_OK : KVT_ERR_NOMEM;
}

static kvt_status_t struct_from_json(const kvt_msg_desc_t *d, json_t *obj, void *base,
                                     kvt_msg_err_t *err);

static kvt_status_t field_from_json(const kvt_msg_field_t *f, json_t *v, void *base,
                                    kvt_msg_err_t *err)
{
    uint32_t maxn = f->max_items ? f->max_items : KVT_MSG_MAX_ITEMS;
    kvt_status_t st = KVT_OK;
    size_t n;

    switch (f->kind) {
    case KVT_F_STR:
        st = json_str(v, KVT_FIELD_PTR(base, f, char *));
        break;
    case KVT_F_BIN:
        st = bytes_from_json(v, KVT_FIELD_PTR(base, f, kvt_bytes_t));
        break;
    case KVT_F_INT:
        if (!json_is_integer(v))
            st = KVT_ERR_MSG_FIELD;
        else
            *KVT_FIELD_PTR(base, f, int64_t) = (int64_t)json_integer_value(v);
        break;
    case KVT_F_U64:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            st = KVT_ERR_MSG_FIELD;
        else
            *KVT_FIELD_PTR(base, f, uint64_t) = (uint64_t)json_integer_value(v);
        break;
    case KVT_F_BOOL:
        if (!json_is_boolean(v))
            st = KVT_ERR_MSG_FIELD;
        else
            *KVT_FIELD_PTR(base, f, int) = json_is_true(v);
        break;
    case KVT_F_STR_LIST:
    case KVT_F_INT_LIST:
    case KVT_F_STRUCT_LIST:
        if (!json_is_array(v)) {
            st = KVT_ERR_MSG_FIELD;
            break;
        }
        n = json_array_size(v);
        if (n > maxn) {
            st = KVT_ERR_LIMIT;
            break;
        }
        for (size_t i = 0; i < n && st == KVT_OK; i++) {
            json_t *e = json_array_get(v, i);
            if (f->kind == KVT_F_STR_LIST) {
                char *s = NULL;
                st = json_str(e, &s);
                if (st == KVT_OK) {
                    st = kvt_str_list_push(KVT_FIELD_PTR(base, f, kvt_str_list_t), s);
                    kvt_free(s);
                }
            } else if (f->kind == KVT_F_INT_LIST) {
                if (!json_is_integer(e))
                    st = KVT_ERR_MSG_FIELD;
                else
                    st = kvt_int_list_push(KVT_FIELD_PTR(base, f, kvt_int_list_t),
                                           (int64_t)json_integer_value(e));
            } else {
                char **arr = KVT_FIELD_PTR(base, f, char *);
                uint32_t *cnt = (uint32_t *)((char *)base + f->count_off);
                if (i == 0 && (*arr = kvt_calloc(n, f->elem->size)) == NULL) {
                    st = KVT_ERR_NOMEM;
                    break;
                }
                if (!json_is_object(e)) {
                    st = KVT_ERR_MSG_FIELD;
                    break;
                }
                *cnt = (uint32_t)i + 1;
                st = struct_from_json(f->elem, e, *arr + i * f->elem->size, err);
                if (st != KVT_OK)
                    return st;
            }
        }
        break;
    }
    if (st != KVT_OK)
        return jfail(err, st, f->name, st == KVT_ERR_LIMIT ? "too large" : "wrong type");
    return KVT_OK;
}

static kvt_status_t struct_from_json(const kvt_msg_desc_t *d, json_t *obj, void *base,
                                     kvt_msg_err_t *err)
{
    kvt_status_t st = KVT_OK;

    for (uint32_t i = 0; i < d->nfields && st == KVT_OK; i++) {
        const kvt_msg_field_t *f = &d->fields[i];
        json_t *v = json_object_get(obj, f->name);
        if (v == NULL) {
            if (f->required) {
                st = jfail(err, KVT_ERR_MSG_FIELD, f->name, "missing required field");
            } else {
                kvt_msg_desc_t one = {d->name, f, 1, d->size};
                st = kvt_msg_struct_defaults(&one, base);
            }
            continue;
        }
        st = field_from_json(f, v, base, err);
    }
    if (st != KVT_OK)
        kvt_msg_struct_clear(d, base);
    return st;
}

kvt_status_t kvt_msg_from_json(const char *json, size_t len, kvt_msg_t *out, kvt_msg_err_t *err)
{
    json_error_t jerr;
    json_t *root, *tv;
    kvt_msg_type_t type;
    kvt_msg_t m;
    kvt_status_t st;

    if (err != NULL)
        memset(err, 0, sizeof(*err));
    if (json == NULL || out == NULL)
        return KVT_ERR_INVALID;
    root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return jfail(err, KVT_ERR_PROTO, NULL, "invalid JSON");
    if (!json_is_object(root)) {
        json_decref(root);
        return jfail(err, KVT_ERR_PROTO, NULL, "message is not an object");
    }
    tv = json_object_get(root, "type");
    if (!json_is_string(tv)) {
        json_decref(root);
        return jfail(err, KVT_ERR_MSG_TYPE, "type", "missing type tag");
    }
    type = kvt_msg_type_from_name(json_string_value(tv), json_string_length(tv));
    if (type == KVT_MSG_NONE) {
        json_decref(root);
        return jfail(err, KVT_ERR_MSG_TYPE, "type", "unknown message type");
    }
    kvt_msg_init(&m, type);
    st = struct_from_json(kvt_msg_desc(type), root, &m.u, err);
    json_decref(root);
    if (st != KVT_OK)
        return st;
    *out = m;
    return KVT_OK;
}
