/*
 * kvt_config_load.c -- YAML (libyaml events) and JSON (jansson) front ends of
 * kvt_config: a flat mapping of key -> scalar | list of scalars, applied to a
 * copy of the config so a failed load leaves the caller's config unchanged.
 */
#include "kvt_config_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#define MAX_LIST_ITEMS (KVT_CONFIG_MAX_PORTS + 1)
#define MAX_KEYS       256

/* ---- YAML -------------------------------------------------------------------- */

typedef struct yaml_list {
    char *items[MAX_LIST_ITEMS];
    size_t n;
} yaml_list_t;

static void yaml_list_free(yaml_list_t *l)
{
    for (size_t i = 0; i < l->n && i < MAX_LIST_ITEMS; i++)
        kvt_free(l->items[i]);
    l->n = 0;
}

static int seen_key(char **seen, size_t nseen, const char *key)
{
    for (size_t i = 0; i < nseen; i++)
        if (strcmp(seen[i], key) == 0)
            return 1;
    return 0;
}

/* Plain (unquoted) YAML null spellings, plus Python's None (LMCache configs
 * are written by Python users). */
static int yaml_plain_null(const yaml_event_t *ev)
{
    const char *s = (const char *)ev->data.scalar.value;
    return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (ev->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
            strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0 || strcmp(s, "None") == 0);
}

static kvt_status_t yaml_next(yaml_parser_t *p, yaml_event_t *ev, kvt_config_err_t *err)
{
    if (!yaml_parser_parse(p, ev))
        return kvt_config_fail(err, "", (int)p->problem_mark.line + 1, "YAML syntax error: %s",
                               p->problem != NULL ? p->problem : "unknown");
    return KVT_OK;
}

/* A flat list value: the events after <ev> (a SEQUENCE_START) up to its end,
 * applied to <tmp> as one list. On a parse error <ev> is left zeroed so the
 * caller's yaml_event_delete is a no-op. */
static kvt_status_t yaml_load_list(yaml_parser_t *p, yaml_event_t *ev, kvt_config_t *tmp,
                                   const char *key, kvt_config_err_t *err)
{
    yaml_list_t l = {{0}, 0};
    kvt_cfg_val_t v = {0};
    kvt_status_t status = KVT_OK;

    v.line = (int)ev->start_mark.line + 1;
    for (;;) {
        yaml_event_delete(ev);
        status = yaml_next(p, ev, err);
        if (status != KVT_OK) {
            memset(ev, 0, sizeof(*ev));
            yaml_list_free(&l);
            return status;
        }
        if (ev->type == YAML_SEQUENCE_END_EVENT)
            break;
        if (ev->type != YAML_SCALAR_EVENT) {
            status = kvt_config_fail(err, key, (int)ev->start_mark.line + 1,
                                     "'%s' must be a flat list of scalars", key);
            break;
        }
        if (l.n >= MAX_LIST_ITEMS) {
            status = kvt_config_fail(err, key, v.line, "'%s' has too many items", key);
            break;
        }
        l.items[l.n] = kvt_strndup((const char *)ev->data.scalar.value, ev->data.scalar.length);
        if (l.items[l.n] == NULL) {
            status = KVT_ERR_NOMEM;
            break;
        }
        l.n++;
    }
    if (status == KVT_OK) {
        v.is_list = 1;
        v.items = (const char *const *)l.items;
        v.nitems = l.n;
        status = kvt_config_apply(tmp, key, &v, err);
    }
    yaml_list_free(&l);
    return status;
}

/* The value event <ev> of <key>: a scalar (or null) or a flat list. */
static kvt_status_t yaml_load_value(yaml_parser_t *p, yaml_event_t *ev, kvt_config_t *tmp,
                                    const char *key, kvt_config_err_t *err)
{
    if (ev->type == YAML_SCALAR_EVENT) {
        kvt_cfg_val_t v = {0};
        v.scalar = yaml_plain_null(ev) ? NULL : (const char *)ev->data.scalar.value;
        v.line = (int)ev->start_mark.line + 1;
        if (ev->data.scalar.length != strlen((const char *)ev->data.scalar.value))
            return kvt_config_fail(err, key, v.line, "'%s' contains a NUL byte", key);
        return kvt_config_apply(tmp, key, &v, err);
    }
    if (ev->type == YAML_SEQUENCE_START_EVENT)
        return yaml_load_list(p, ev, tmp, key, err);
    return kvt_config_fail(err, key, (int)ev->start_mark.line + 1,
                           "'%s' must be a scalar or a list", key);
}

/* One "key: value" entry; <ev> holds the key scalar on entry and, on return,
 * the last event read (zeroed when there is none to delete). The key is kept
 * in <seen> (freed by the caller) to reject duplicates. */
static kvt_status_t yaml_load_entry(yaml_parser_t *p, yaml_event_t *ev, kvt_config_t *tmp,
                                    char **seen, size_t *nseen, kvt_config_err_t *err)
{
    int line = (int)ev->start_mark.line + 1;
    char *key = kvt_strndup((const char *)ev->data.scalar.value, ev->data.scalar.length);
    kvt_status_t status;

    yaml_event_delete(ev);
    if (key == NULL)
        return KVT_ERR_NOMEM;
    if (seen_key(seen, *nseen, key) || *nseen == MAX_KEYS) {
        status = kvt_config_fail(err, key, line,
                                 *nseen == MAX_KEYS ? "too many keys" : "duplicate key '%s'", key);
        kvt_free(key);
        return status;
    }
    seen[(*nseen)++] = key;
    status = yaml_next(p, ev, err);
    if (status != KVT_OK) {
        memset(ev, 0, sizeof(*ev));
        return status;
    }
    return yaml_load_value(p, ev, tmp, key, err);
}

kvt_status_t kvt_config_load_yaml_string(kvt_config_t *cfg, const char *text, size_t len,
                                         kvt_config_err_t *err)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    kvt_config_t tmp;
    char *seen[MAX_KEYS];
    size_t nseen = 0;
    int in_map = 0, done = 0;
    kvt_status_t status = KVT_OK;

    if (cfg == NULL || (text == NULL && len > 0))
        return KVT_ERR_INVALID;
    if (err != NULL)
        memset(err, 0, sizeof(*err));
    tmp = *cfg;
    if (!yaml_parser_initialize(&parser))
        return KVT_ERR_NOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)(text ? text : ""), len);

    while (status == KVT_OK && !done) {
        status = yaml_next(&parser, &ev, err);
        if (status != KVT_OK)
            break;
        switch (ev.type) {
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_MAPPING_START_EVENT:
            if (in_map)
                status = kvt_config_fail(err, "", (int)ev.start_mark.line + 1,
                                         "nested mapping without a key");
            in_map = 1;
            break;
        case YAML_MAPPING_END_EVENT:
            in_map = 0;
            break;
        case YAML_SCALAR_EVENT:
            if (!in_map) {
                /* an empty document is a plain null scalar: nothing to load */
                if (!yaml_plain_null(&ev))
                    status = kvt_config_fail(err, "", (int)ev.start_mark.line + 1,
                                             "the configuration must be a mapping of keys");
                break;
            }
            status = yaml_load_entry(&parser, &ev, &tmp, seen, &nseen, err);
            break;
        default:
            status = kvt_config_fail(err, "", (int)ev.start_mark.line + 1,
                                     "the configuration must be a flat mapping of keys");
            break;
        }
        yaml_event_delete(&ev);
    }
    for (size_t i = 0; i < nseen; i++)
        kvt_free(seen[i]);
    yaml_parser_delete(&parser);
    if (status == KVT_OK)
        *cfg = tmp;
    return status;
}

/* ---- JSON -------------------------------------------------------------------- */

/* Text form of a JSON scalar into <buf>; -1 for non-scalars. */
static int json_scalar_text(json_t *v, char *buf, size_t size, const char **out)
{
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v))
            return -1;
        *out = json_string_value(v);
    } else if (json_is_integer(v)) {
        snprintf(buf, size, "%lld", (long long)json_integer_value(v));
        *out = buf;
    } else if (json_is_real(v)) {
        snprintf(buf, size, "%.17g", json_real_value(v));
        *out = buf;
    } else if (json_is_boolean(v)) {
        *out = json_is_true(v) ? "true" : "false";
    } else if (json_is_null(v)) {
        *out = NULL;
    } else {
        return -1;
    }
    return 0;
}

kvt_status_t kvt_config_load_json_string(kvt_config_t *cfg, const char *text, size_t len,
                                         kvt_config_err_t *err)
{
    json_error_t jerr;
    json_t *root, *val;
    const char *key;
    kvt_config_t tmp;
    kvt_status_t status = KVT_OK;

    if (cfg == NULL || (text == NULL && len > 0))
        return KVT_ERR_INVALID;
    if (err != NULL)
        memset(err, 0, sizeof(*err));
    root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return kvt_config_fail(err, "", jerr.line, "JSON error: %s", jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return kvt_config_fail(err, "", 1, "the configuration must be a JSON object");
    }
    tmp = *cfg;
    json_object_foreach(root, key, val)
    {
        kvt_cfg_val_t v = {0};
        char num[64];
        if (json_is_array(val)) {
            const char *items[MAX_LIST_ITEMS];
            char nums[MAX_LIST_ITEMS][32];
            size_t n = json_array_size(val);
            if (n > MAX_LIST_ITEMS) {
                status = kvt_config_fail(err, key, 0, "'%s' has too many items", key);
                break;
            }
            for (size_t i = 0; i < n && status == KVT_OK; i++)
                if (json_scalar_text(json_array_get(val, i), nums[i], sizeof(nums[i]), &items[i]) !=
                    0)
                    status =
                        kvt_config_fail(err, key, 0, "'%s' must be a flat list of scalars", key);
            if (status != KVT_OK)
                break;
            v.is_list = 1;
            v.items = items;
            v.nitems = n;
            status = kvt_config_apply(&tmp, key, &v, err);
        } else if (json_scalar_text(val, num, sizeof(num), &v.scalar) == 0) {
            status = kvt_config_apply(&tmp, key, &v, err);
        } else {
            status = kvt_config_fail(err, key, 0, "'%s' must be a scalar or a list", key);
        }
        if (status != KVT_OK)
            break;
    }
    json_decref(root);
    if (status == KVT_OK)
        *cfg = tmp;
    return status;
}

/* ---- files ------------------------------------------------------------------- */

#define MAX_CONFIG_FILE (4u << 20)

static kvt_status_t read_file(const char *path, char **out, size_t *len_out, kvt_config_err_t *err)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t len;

    if (f == NULL)
        return kvt_config_fail(err, "", 0, "cannot open %s", path);
    buf = kvt_malloc(MAX_CONFIG_FILE + 1);
    if (buf == NULL) {
        fclose(f);
        return KVT_ERR_NOMEM;
    }
    len = fread(buf, 1, MAX_CONFIG_FILE + 1, f);
    if (ferror(f) || len > MAX_CONFIG_FILE) {
        fclose(f);
        kvt_free(buf);
        return kvt_config_fail(err, "", 0, "cannot read %s (error or larger than %u bytes)", path,
                               MAX_CONFIG_FILE);
    }
    fclose(f);
    buf[len] = '\0';
    *out = buf;
    *len_out = len;
    return KVT_OK;
}

kvt_status_t kvt_config_load_yaml_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err)
{
    char *buf;
    size_t len;
    kvt_status_t status;

    if (cfg == NULL || path == NULL)
        return KVT_ERR_INVALID;
    status = read_file(path, &buf, &len, err);
    if (status != KVT_OK)
        return status;
    status = kvt_config_load_yaml_string(cfg, buf, len, err);
    kvt_free(buf);
    return status;
}

kvt_status_t kvt_config_load_json_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err)
{
    char *buf;
    size_t len;
    kvt_status_t status;

    if (cfg == NULL || path == NULL)
        return KVT_ERR_INVALID;
    status = read_file(path, &buf, &len, err);
    if (status != KVT_OK)
        return status;
    status = kvt_config_load_json_string(cfg, buf, len, err);
    kvt_free(buf);
    return status;
}

kvt_status_t kvt_config_load_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err)
{
    size_t n;

    if (path == NULL)
        return KVT_ERR_INVALID;
    n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
        return kvt_config_load_json_file(cfg, path, err);
    return kvt_config_load_yaml_file(cfg, path, err);
}
