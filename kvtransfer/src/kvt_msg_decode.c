/*
 * kvt_msg_decode.c -- msgpack decoder for libkvt messages.
 *
 * Untrusted bytes are first checked by kvt_msg_scan() (bounded structure),
 * then msgpack-c builds an object tree over them and the descriptor tables
 * drive a type-checked copy into the C structs. Field order is free, unknown
 * keys are skipped, defaults are applied, duplicates of a known field and
 * missing required fields are errors.
 */
#include "kvt_msg_int.h"

#include <msgpack.h>
#include <string.h>

static kvt_status_t fail(kvt_msg_err_t *err, kvt_status_t status, const char *field,
                         const char *reason)
{
    if (err != NULL) {
        err->field = field;
        err->reason = reason;
    }
    return status;
}

static int obj_is_str(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static kvt_status_t get_str(const msgpack_object *o, char **out, const char **why)
{
    if (o->type != MSGPACK_OBJECT_STR) {
        *why = "expected str";
        return KVT_ERR_MSG_FIELD;
    }
    if (o->via.str.size > KVT_MSG_MAX_STR) {
        *why = "string too long";
        return KVT_ERR_LIMIT;
    }
    if (o->via.str.size > 0 && memchr(o->via.str.ptr, '\0', o->via.str.size) != NULL) {
        *why = "string contains NUL";
        return KVT_ERR_MSG_FIELD;
    }
    *out = kvt_strndup(o->via.str.size ? o->via.str.ptr : "", o->via.str.size);
    if (*out == NULL) {
        *why = "out of memory";
        return KVT_ERR_NOMEM;
    }
    return KVT_OK;
}

static kvt_status_t get_int(const msgpack_object *o, int64_t *out, const char **why)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) {
            *why = "integer out of range";
            return KVT_ERR_MSG_FIELD;
        }
        *out = (int64_t)o->via.u64;
        return KVT_OK;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return KVT_OK;
    }
    *why = "expected int";
    return KVT_ERR_MSG_FIELD;
}

static kvt_status_t decode_struct(const kvt_msg_desc_t *d, const msgpack_object *map, void *base,
                                  unsigned depth, kvt_msg_err_t *err, uint64_t *seen_out);

static kvt_status_t decode_field(const kvt_msg_field_t *f, const msgpack_object *v, void *base,
                                 unsigned depth, kvt_msg_err_t *err)
{
    uint32_t maxn = f->max_items ? f->max_items : KVT_MSG_MAX_ITEMS;
    const char *why = NULL;
    kvt_status_t status = KVT_OK;

    switch (f->kind) {
    case KVT_F_STR:
        status = get_str(v, KVT_FIELD_PTR(base, f, char *), &why);
        break;
    case KVT_F_BIN:
        if (v->type != MSGPACK_OBJECT_BIN) {
            status = KVT_ERR_MSG_FIELD;
            why = "expected bin";
            break;
        }
        status =
            kvt_bytes_set(KVT_FIELD_PTR(base, f, kvt_bytes_t), v->via.bin.ptr, v->via.bin.size);
        if (status == KVT_ERR_LIMIT)
            why = "bin too long";
        else if (status != KVT_OK)
            why = "out of memory";
        break;
    case KVT_F_INT:
        status = get_int(v, KVT_FIELD_PTR(base, f, int64_t), &why);
        break;
    case KVT_F_U64:
        if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            status = KVT_ERR_MSG_FIELD;
            why = "expected non-negative int";
        } else {
            *KVT_FIELD_PTR(base, f, uint64_t) = v->via.u64;
        }
        break;
    case KVT_F_BOOL:
        if (v->type != MSGPACK_OBJECT_BOOLEAN) {
            status = KVT_ERR_MSG_FIELD;
            why = "expected bool";
        } else {
            *KVT_FIELD_PTR(base, f, int) = v->via.boolean ? 1 : 0;
        }
        break;
    case KVT_F_STR_LIST:
    case KVT_F_INT_LIST:
    case KVT_F_STRUCT_LIST: {
        uint32_t n;
        if (v->type != MSGPACK_OBJECT_ARRAY) {
            status = KVT_ERR_MSG_FIELD;
            why = "expected array";
            break;
        }
        n = v->via.array.size;
        if (n > maxn) {
            status = KVT_ERR_LIMIT;
            why = "too many elements";
            break;
        }
        if (f->kind == KVT_F_STR_LIST) {
            kvt_str_list_t *l = KVT_FIELD_PTR(base, f, kvt_str_list_t);
            if (n > 0 && (l->v = kvt_calloc(n, sizeof(*l->v))) == NULL) {
                status = KVT_ERR_NOMEM;
                why = "out of memory";
                break;
            }
            for (uint32_t i = 0; i < n && status == KVT_OK; i++) {
                status = get_str(&v->via.array.ptr[i], &l->v[i], &why);
                if (status == KVT_OK)
                    l->n = i + 1;
                else if (status == KVT_ERR_MSG_FIELD)
                    why = "expected array of str";
            }
        } else if (f->kind == KVT_F_INT_LIST) {
            kvt_int_list_t *l = KVT_FIELD_PTR(base, f, kvt_int_list_t);
            if (n > 0 && (l->v = kvt_malloc((size_t)n * sizeof(*l->v))) == NULL) {
                status = KVT_ERR_NOMEM;
                why = "out of memory";
                break;
            }
            for (uint32_t i = 0; i < n && status == KVT_OK; i++) {
                status = get_int(&v->via.array.ptr[i], &l->v[i], &why);
                if (status == KVT_OK)
                    l->n = i + 1;
                else
                    why = "expected array of int";
            }
        } else {
            char **arr = KVT_FIELD_PTR(base, f, char *);
            uint32_t *cnt = (uint32_t *)((char *)base + f->count_off);
            if (n > 0 && (*arr = kvt_calloc(n, f->elem->size)) == NULL) {
                status = KVT_ERR_NOMEM;
                why = "out of memory";
                break;
            }
            for (uint32_t i = 0; i < n && status == KVT_OK; i++) {
                const msgpack_object *e = &v->via.array.ptr[i];
                if (e->type != MSGPACK_OBJECT_MAP) {
                    status = KVT_ERR_MSG_FIELD;
                    why = "expected array of maps";
                    break;
                }
                /* count first: a failed element clears itself, the rest stay zero */
                *cnt = i + 1;
                status = decode_struct(f->elem, e, *arr + (size_t)i * f->elem->size, depth + 1, err,
                                       NULL);
                if (status != KVT_OK)
                    return status; /* err already names the inner field */
            }
        }
        break;
    }
    }
    if (status != KVT_OK)
        return fail(err, status, f->name, why);
    return KVT_OK;
}

static kvt_status_t decode_struct(const kvt_msg_desc_t *d, const msgpack_object *map, void *base,
                                  unsigned depth, kvt_msg_err_t *err, uint64_t *seen_out)
{
    uint64_t seen = 0;
    kvt_status_t status = KVT_OK;

    if (depth > 3)
        return fail(err, KVT_ERR_LIMIT, NULL, "nesting too deep");
    for (uint32_t k = 0; k < map->via.map.size && status == KVT_OK; k++) {
        const msgpack_object *key = &map->via.map.ptr[k].key;
        const msgpack_object *val = &map->via.map.ptr[k].val;
        uint32_t i;

        if (key->type != MSGPACK_OBJECT_STR || obj_is_str(key, "type"))
            continue; /* tag checked by the caller; non-str keys are unknown keys */
        for (i = 0; i < d->nfields; i++)
            if (obj_is_str(key, d->fields[i].name))
                break;
        if (i == d->nfields)
            continue; /* unknown key: ignored whatever its value */
        if (seen & (1ull << i)) {
            status = fail(err, KVT_ERR_MSG_FIELD, d->fields[i].name, "duplicate field");
            break;
        }
        seen |= 1ull << i;
        status = decode_field(&d->fields[i], val, base, depth, err);
    }
    for (uint32_t i = 0; i < d->nfields && status == KVT_OK; i++) {
        if (d->fields[i].required && !(seen & (1ull << i)))
            status = fail(err, KVT_ERR_MSG_FIELD, d->fields[i].name, "missing required field");
    }
    if (status == KVT_OK) {
        /* defaults only for absent optional fields */
        for (uint32_t i = 0; i < d->nfields && status == KVT_OK; i++) {
            const kvt_msg_field_t *f = &d->fields[i];
            kvt_msg_desc_t one = {d->name, f, 1, d->size};
            if (!f->required && !(seen & (1ull << i)))
                status = kvt_msg_struct_defaults(&one, base);
        }
        if (status != KVT_OK)
            status = fail(err, status, NULL, "out of memory");
    }
    if (status != KVT_OK)
        kvt_msg_struct_clear(d, base);
    else if (seen_out != NULL)
        *seen_out = seen;
    return status;
}

/* Find the "type" entry of a top-level map. */
static kvt_status_t find_type(const msgpack_object *map, kvt_msg_type_t *out, kvt_msg_err_t *err)
{
    for (uint32_t k = 0; k < map->via.map.size; k++) {
        const msgpack_object *key = &map->via.map.ptr[k].key;
        const msgpack_object *val = &map->via.map.ptr[k].val;
        kvt_msg_type_t t;
        if (!obj_is_str(key, "type"))
            continue;
        if (val->type != MSGPACK_OBJECT_STR)
            return fail(err, KVT_ERR_MSG_TYPE, "type", "type tag is not a str");
        t = kvt_msg_type_from_name(val->via.str.ptr, val->via.str.size);
        if (t == KVT_MSG_NONE)
            return fail(err, KVT_ERR_MSG_TYPE, "type", "unknown message type");
        *out = t;
        return KVT_OK;
    }
    return fail(err, KVT_ERR_MSG_TYPE, "type", "missing type tag");
}

/* Scan + unpack into <up>; the top object must be a map. */
static kvt_status_t unpack_top(const void *data, size_t len, msgpack_unpacked *up,
                               kvt_msg_err_t *err)
{
    size_t off = 0;
    kvt_status_t status;

    status = kvt_msg_scan(data, len, &off);
    if (status != KVT_OK) {
        if (err != NULL)
            err->offset = off;
        return fail(err, status, NULL,
                    status == KVT_ERR_LIMIT ? "msgpack exceeds a size bound" : "malformed msgpack");
    }
    off = 0;
    msgpack_unpacked_init(up);
    if (msgpack_unpack_next(up, data, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(up);
        if (err != NULL)
            err->offset = off;
        return fail(err, KVT_ERR_PROTO, NULL, "malformed msgpack");
    }
    if (up->data.type != MSGPACK_OBJECT_MAP) {
        msgpack_unpacked_destroy(up);
        return fail(err, KVT_ERR_PROTO, NULL, "message is not a map");
    }
    return KVT_OK;
}

kvt_status_t kvt_msg_decode(const void *data, size_t len, kvt_msg_t *out, kvt_msg_err_t *err)
{
    msgpack_unpacked up;
    kvt_msg_type_t type = KVT_MSG_NONE;
    kvt_msg_t m;
    kvt_status_t status;

    if (err != NULL)
        memset(err, 0, sizeof(*err));
    if (out == NULL || (data == NULL && len > 0))
        return fail(err, KVT_ERR_INVALID, NULL, "bad arguments");
    kvt_msg_init(out, KVT_MSG_NONE);

    status = unpack_top(data, len, &up, err);
    if (status != KVT_OK)
        return status;
    status = find_type(&up.data, &type, err);
    if (status == KVT_OK) {
        kvt_msg_init(&m, type);
        status = decode_struct(kvt_msg_desc(type), &up.data, &m.u, 1, err, &m.present);
    }
    msgpack_unpacked_destroy(&up);
    if (status != KVT_OK)
        return status;
    *out = m;
    return KVT_OK;
}

kvt_status_t kvt_msg_peek_type(const void *data, size_t len, kvt_msg_type_t *type_out)
{
    msgpack_unpacked up;
    kvt_msg_type_t type = KVT_MSG_NONE;
    kvt_status_t status;

    if (type_out == NULL)
        return KVT_ERR_INVALID;
    status = unpack_top(data, len, &up, NULL);
    if (status != KVT_OK)
        return status;
    status = find_type(&up.data, &type, NULL);
    msgpack_unpacked_destroy(&up);
    if (status == KVT_OK)
        *type_out = type;
    return status;
}
