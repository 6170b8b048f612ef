/*
 * pdgw_fwd_sdk.c - what the forwarder SDK (forwarder.h, ABI 4) gives a plugin beyond the
 * request path: option tables, the PD body helpers, the per-attempt arena, and the
 * defaults that stand in for configure/destroy/attempt_init when a descriptor declares
 * an option table or a state size.
 */
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_fwd_sdk.h"
#include "pdgw_json_raw.h"
#include "pdgw_json_text.h"
#include "pdgw_registry.h"
#include "pdgw_tokenize_body.h"
#include "pdgw_util.h"

/* ---------------------------------------------------------------- bodies */

json_t *pdgw_fwd_answer_ids(const char *answer, size_t len, const char *name)
{
    return answer && name ? pdgw_json_member_id_list(answer, len, name) : NULL;
}

json_t *pdgw_fwd_answer_ids_text(const char *answer, size_t len, const char *name, size_t *count)
{
    const char *val;
    size_t val_len;

    *count = 0;
    if (answer == NULL || name == NULL ||
        !pdgw_json_member_value(answer, len, name, &val, &val_len) ||
        !pdgw_json_id_list_count(val, val_len, count))
        return NULL;
    return pdgw_json_raw(val, val_len); /* checked: copied as the engine wrote it */
}

json_t *pdgw_fwd_tokenize_body(const pdgw_fwd_request_t *req, const json_t *prompt)
{
    return req ? pdgw_tokenize_body(req->body, req->is_chat, prompt, req->model) : NULL;
}

/* <sep> (when not NUL) and the digits of <id> (thousands per prompt). */
static pdgw_status_t append_id(pdgw_buf_t *b, char sep, json_int_t id)
{
    char num[PDGW_JSON_INT_TEXT_MAX + 2], *d = pdgw_json_int_text(id, num + sizeof(num));
    if (sep != '\0')
        *--d = sep;
    return pdgw_buf_append(b, d, (size_t)(num + sizeof(num) - d));
}

json_t *pdgw_fwd_ids_text_from(const json_t *array, size_t *count)
{
    pdgw_buf_t b;
    size_t i;
    json_t *v, *raw = NULL;

    *count = 0;
    if (!json_is_array(array))
        return NULL;
    pdgw_buf_init(&b);
    if (pdgw_buf_reserve(&b, json_array_size(array) * 8 + 2) != PDGW_OK ||
        pdgw_buf_append(&b, "[", 1) != PDGW_OK)
        return NULL;
    json_array_foreach(array, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            append_id(&b, i > 0 ? ',' : '\0', json_integer_value(v)) != PDGW_OK)
            goto out;
    }
    if (pdgw_buf_append(&b, "]", 1) == PDGW_OK) {
        raw = pdgw_json_raw(b.data, b.len);
        *count = raw != NULL ? json_array_size(array) : 0;
    }
out:
    pdgw_buf_free(&b);
    return raw;
}

json_t *pdgw_fwd_ids_text_u32(const uint32_t *ids, size_t n)
{
    pdgw_buf_t b;
    json_t *raw = NULL;

    pdgw_buf_init(&b);
    if (pdgw_buf_reserve(&b, n * 8 + 2) != PDGW_OK || pdgw_buf_append(&b, "[", 1) != PDGW_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (append_id(&b, i > 0 ? ',' : '\0', (json_int_t)ids[i]) != PDGW_OK)
            goto out;
    if (pdgw_buf_append(&b, "]", 1) == PDGW_OK)
        raw = pdgw_json_raw(b.data, b.len);
out:
    pdgw_buf_free(&b);
    return raw;
}

/* <n> less the whitespace <t> ends with. */
static size_t trim_end(const char *t, size_t n)
{
    while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\t' || t[n - 1] == '\n' || t[n - 1] == '\r'))
        n--;
    return n;
}

json_t *pdgw_fwd_ids_text_append(const json_t *ids, json_int_t id)
{
    const char *text;
    size_t len, close, last;
    pdgw_buf_t b;
    json_t *raw = NULL;

    if (id < 0 || !pdgw_json_raw_text(ids, &text, &len))
        return NULL;
    close = trim_end(text, len); /* just past the list's ']' */
    if (close == 0 || text[close - 1] != ']')
        return NULL;
    close--;
    last = trim_end(text, close); /* just past the last id, or the '[' of an empty list */
    if (last == 0)
        return NULL;
    pdgw_buf_init(&b);
    if (pdgw_buf_append(&b, text, close) == PDGW_OK &&
        append_id(&b, text[last - 1] == '[' ? '\0' : ',', id) == PDGW_OK &&
        pdgw_buf_append(&b, "]", 1) == PDGW_OK)
        raw = pdgw_json_raw(b.data, b.len);
    pdgw_buf_free(&b);
    return raw;
}

json_t *pdgw_fwd_body_prefill_kvp(const pdgw_fwd_request_t *req, json_t *kvp)
{
    json_t *b = pdgw_fwd_body_harden_prefill(pdgw_fwd_body_shared(req));

    if (b == NULL) {
        json_decref(kvp);
        return NULL;
    }
    if (kvp != NULL && json_object_set_new(b, "kv_transfer_params", kvp) != 0) {
        json_decref(b);
        return NULL;
    }
    return b;
}

json_t *pdgw_fwd_body_decode_kvp(const pdgw_fwd_request_t *req, json_t *kvp)
{
    json_t *b = pdgw_fwd_body_shared(req);

    if (b == NULL || !json_is_object(b)) {
        json_decref(b);
        json_decref(kvp);
        return NULL;
    }
    if (kvp != NULL && json_object_set_new(b, "kv_transfer_params", kvp) != 0) {
        json_decref(b);
        return NULL;
    }
    return b;
}

json_t *pdgw_fwd_resp_kvp(const json_t *resp)
{
    json_t *kvp = resp ? json_object_get(resp, "kv_transfer_params") : NULL;
    return json_is_object(kvp) && json_object_size(kvp) > 0 ? kvp : NULL;
}

/* ---------------------------------------------------------------- single options */

pdgw_fwd_status_t pdgw_fwd_opts_check(const json_t *options, const char *const *known, char *err,
                                      size_t errlen)
{
    const char *key;
    json_t *v;

    json_object_foreach((json_t *)options, key, v)
    {
        size_t i = 0;
        while (known[i] != NULL && strcmp(known[i], key) != 0)
            i++;
        if (known[i] == NULL) {
            snprintf(err, errlen, "unknown protocol option '%s'", key);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t pdgw_fwd_opt_int(const json_t *options, const char *key, int64_t def, int64_t min,
                                   int64_t max, int64_t *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);

    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        snprintf(err, errlen, "protocol option '%s' must be an integer in [%lld, %lld]", key,
                 (long long)min, (long long)max);
        return PDGW_FWD_ERR_CONFIG;
    }
    *out = json_integer_value(v);
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t pdgw_fwd_opt_bool(const json_t *options, const char *key, int def, int *out,
                                    char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);

    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "protocol option '%s' must be true or false", key);
        return PDGW_FWD_ERR_CONFIG;
    }
    *out = json_is_true(v);
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t pdgw_fwd_opt_enum(const json_t *options, const char *key,
                                    const char *const *choices, int def, int *out, char *err,
                                    size_t errlen)
{
    json_t *v = json_object_get(options, key);
    const char *s;
    size_t n = 0;

    if (v == NULL) {
        *out = def;
        return PDGW_FWD_OK;
    }
    s = json_string_value(v);
    for (int i = 0; s != NULL && choices[i] != NULL; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return PDGW_FWD_OK;
        }
    }
    n += (size_t)snprintf(err, errlen, "protocol option '%s' must be one of", key);
    for (int i = 0; choices[i] != NULL && n < errlen; i++)
        n += (size_t)snprintf(err + n, errlen - n, "%s %s", i ? "," : "", choices[i]);
    return PDGW_FWD_ERR_CONFIG;
}

pdgw_fwd_status_t pdgw_fwd_opt_str(const json_t *options, const char *key, const char *def,
                                   char *out, size_t cap, char *err, size_t errlen)
{
    json_t *v = json_object_get(options, key);
    const char *s = def != NULL ? def : "";

    if (v != NULL) {
        s = json_string_value(v);
        if (s == NULL || s[0] == '\0' || strlen(s) >= cap) {
            snprintf(err, errlen, "protocol option '%s' must be a non-empty string (< %zu bytes)",
                     key, cap);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    snprintf(out, cap, "%s", s);
    return PDGW_FWD_OK;
}

/* ---------------------------------------------------------------- option tables */

static pdgw_fwd_status_t parse_one(const pdgw_fwd_option_t *o, const json_t *options, char *base,
                                   char *err, size_t errlen)
{
    void *field = base + o->offset;
    int64_t i64;
    int i;
    pdgw_fwd_status_t st;

    switch (o->type) {
    case PDGW_FWD_OPT_INT:
        if (o->size != sizeof(int64_t))
            break;
        st = pdgw_fwd_opt_int(options, o->name, o->def, o->min, o->max, &i64, err, errlen);
        if (st == PDGW_FWD_OK)
            memcpy(field, &i64, sizeof(i64));
        return st;
    case PDGW_FWD_OPT_BOOL:
    case PDGW_FWD_OPT_ENUM:
        if (o->size != sizeof(int))
            break;
        st = o->type == PDGW_FWD_OPT_BOOL
                 ? pdgw_fwd_opt_bool(options, o->name, (int)o->def, &i, err, errlen)
                 : pdgw_fwd_opt_enum(options, o->name, o->choices, (int)o->def, &i, err, errlen);
        if (st == PDGW_FWD_OK)
            memcpy(field, &i, sizeof(i));
        return st;
    case PDGW_FWD_OPT_STR:
        if (o->size == 0)
            break;
        return pdgw_fwd_opt_str(options, o->name, o->def_str, field, o->size, err, errlen);
    }
    snprintf(err, errlen, "option table: '%s' has a type or field size the gateway cannot fill",
             o->name);
    return PDGW_FWD_ERR_CONFIG;
}

pdgw_fwd_status_t pdgw_fwd_options_parse(const pdgw_fwd_option_t *table, const json_t *options,
                                         void *ctx, char *err, size_t errlen)
{
    const char *key;
    json_t *v;

    json_object_foreach((json_t *)options, key, v)
    {
        const pdgw_fwd_option_t *o = table;
        while (o->name != NULL && strcmp(o->name, key) != 0)
            o++;
        if (o->name == NULL) {
            snprintf(err, errlen, "unknown protocol option '%s'", key);
            return PDGW_FWD_ERR_CONFIG;
        }
    }
    for (const pdgw_fwd_option_t *o = table; o->name != NULL; o++) {
        pdgw_fwd_status_t st = parse_one(o, options, ctx, err, errlen);
        if (st != PDGW_FWD_OK)
            return st;
    }
    return PDGW_FWD_OK;
}

/* Default configure of a descriptor with an option table: a context of ctx_size bytes. */
static pdgw_fwd_status_t table_configure(const json_t *options, const pdgw_fwd_env_t *env,
                                         void **ctx, char *err, size_t errlen)
{
    const pdgw_fwd_desc_t *d = pdgw_registry_find(env->protocol);
    void *c;

    if (d == NULL || d->options == NULL)
        return PDGW_FWD_ERR_CONFIG;
    c = pdgw_calloc(1, d->ctx_size);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR;
    }
    if (pdgw_fwd_options_parse(d->options, options, c, err, errlen) != PDGW_FWD_OK) {
        pdgw_free(c);
        return PDGW_FWD_ERR_CONFIG;
    }
    *ctx = c;
    return PDGW_FWD_OK;
}

static void table_destroy(void *ctx)
{
    pdgw_free(ctx);
}

void pdgw_fwd_sdk_complete_ops(const pdgw_fwd_desc_t *desc, pdgw_fwd_ops_t *ops)
{
    if (desc->options != NULL && ops->configure == NULL) {
        ops->configure = table_configure;
        if (ops->destroy == NULL)
            ops->destroy = table_destroy;
    }
}

/* ---------------------------------------------------------------- attempt arena */

#define ARENA_CHUNK 4096
#define ARENA_ALIGN alignof(max_align_t)

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    alignas(max_align_t) unsigned char data[];
} arena_chunk_t;

struct pdgw_fwd_arena {
    arena_chunk_t *chunks;
    json_t **kept;
    size_t n_kept, cap_kept;
};

void *pdgw_fwd_alloc(const pdgw_fwd_request_t *req, size_t size)
{
    struct pdgw_fwd_arena *a = req != NULL ? req->arena : NULL;
    arena_chunk_t *c;
    size_t need = (size + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
    void *p;

    if (a == NULL || size > SIZE_MAX / 2)
        return NULL;
    if (need == 0)
        need = ARENA_ALIGN;
    c = a->chunks;
    if (c == NULL || c->cap - c->used < need) {
        size_t cap = need > ARENA_CHUNK ? need : ARENA_CHUNK;
        c = pdgw_malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->chunks;
        a->chunks = c;
    }
    p = c->data + c->used;
    c->used += need;
    memset(p, 0, size);
    return p;
}

char *pdgw_fwd_strdup(const pdgw_fwd_request_t *req, const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;
    char *p = s != NULL ? pdgw_fwd_alloc(req, n + 1) : NULL;

    if (p != NULL)
        memcpy(p, s, n + 1);
    return p;
}

json_t *pdgw_fwd_keep(const pdgw_fwd_request_t *req, json_t *v)
{
    struct pdgw_fwd_arena *a = req != NULL ? req->arena : NULL;

    if (v == NULL)
        return NULL;
    if (a == NULL)
        goto err_release;
    if (a->n_kept == a->cap_kept) {
        size_t cap = a->cap_kept ? a->cap_kept * 2 : 8;
        json_t **k = pdgw_realloc(a->kept, cap * sizeof(*k));
        if (k == NULL)
            goto err_release;
        a->kept = k;
        a->cap_kept = cap;
    }
    a->kept[a->n_kept++] = v;
    return v;
err_release:
    json_decref(v);
    return NULL;
}

pdgw_status_t pdgw_fwd_attempt_begin(const pdgw_fwd_desc_t *desc, pdgw_fwd_request_t *req,
                                     void **state)
{
    req->arena = pdgw_calloc(1, sizeof(*req->arena));
    if (req->arena == NULL)
        return PDGW_ERR_NOMEM;
    if (desc->state_size > 0 && desc->ops->attempt_init == NULL) {
        *state = pdgw_fwd_alloc(req, desc->state_size);
        if (*state == NULL) {
            pdgw_fwd_attempt_end(req);
            return PDGW_ERR_NOMEM;
        }
    }
    return PDGW_OK;
}

void pdgw_fwd_attempt_end(pdgw_fwd_request_t *req)
{
    struct pdgw_fwd_arena *a = req->arena;

    if (a == NULL)
        return;
    for (size_t i = 0; i < a->n_kept; i++)
        json_decref(a->kept[i]);
    pdgw_free(a->kept);
    while (a->chunks != NULL) {
        arena_chunk_t *next = a->chunks->next;
        pdgw_free(a->chunks);
        a->chunks = next;
    }
    pdgw_free(a);
    req->arena = NULL;
}

/* ---------------------------------------------------------------- instance attributes */

static int attr_from_text(const char *text, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);

    for (const char *p = text; p != NULL && *p != '\0';) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && p[nl] == '=' && memcmp(p, name, nl) == 0) {
            snprintf(out, cap, "%.*s", (int)(len - nl - 1), p + nl + 1);
            return 1;
        }
        p = eol ? eol + 1 : NULL;
    }
    return 0;
}

static void ports_text(const int *ports, size_t n, char *out, size_t cap)
{
    size_t used = 0;

    if (cap > 0)
        out[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++) {
        int k = snprintf(out + used, cap - used, "%s%d", i ? "," : "", ports[i]);
        if (k < 0)
            break;
        used += (size_t)k;
    }
}

/* The built-in fields by their config names; 0 when <name> is none of them (or unset). */
static int attr_builtin(const pdgw_instance_t *inst, const char *name, char *out, size_t cap)
{
    const struct {
        const char *name;
        int value;
    } ints[] = {{"kv_port", inst->kv_port},
                {"bootstrap_port", inst->bootstrap_port},
                {"tp_size", inst->tp_size},
                {"dp_rank", inst->dp_rank},
                {"dp_size", inst->dp_size}};

    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (strcmp(name, ints[i].name) == 0) {
            snprintf(out, cap, "%d", ints[i].value);
            return 1;
        }
    }
    if (strcmp(name, "kv_host") == 0 || strcmp(name, "engine_id") == 0 ||
        strcmp(name, "zone") == 0) {
        const char *v = name[0] == 'k'   ? inst->kv_host
                        : name[0] == 'e' ? inst->engine_id
                                         : inst->zone;
        if (v == NULL || v[0] == '\0')
            return 0;
        snprintf(out, cap, "%s", v);
        return 1;
    }
    if (strcmp(name, "alloc_ports") == 0 && inst->n_alloc_ports > 0) {
        ports_text(inst->alloc_ports, inst->n_alloc_ports, out, cap);
        return 1;
    }
    if (strcmp(name, "init_ports") == 0 && inst->n_init_ports > 0) {
        ports_text(inst->init_ports, inst->n_init_ports, out, cap);
        return 1;
    }
    return 0;
}

int pdgw_fwd_instance_attr(const pdgw_instance_t *inst, const char *name, char *out, size_t cap)
{
    if (inst == NULL || name == NULL || out == NULL || cap == 0)
        return 0;
    out[0] = '\0';
    if (inst->attrs != NULL && attr_from_text(inst->attrs, name, out, cap))
        return 1;
    return attr_builtin(inst, name, out, cap);
}

int64_t pdgw_fwd_instance_attr_int(const pdgw_instance_t *inst, const char *name, int64_t def)
{
    char buf[32], *end;
    long long v;

    if (!pdgw_fwd_instance_attr(inst, name, buf, sizeof(buf)) || buf[0] == '\0')
        return def;
    v = strtoll(buf, &end, 10);
    return *end == '\0' ? (int64_t)v : def;
}
