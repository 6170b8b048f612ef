/* Instance descriptors: defaults, JSON mapping, validation, URL parsing, copies. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

#define SCHED_MAX_WEIGHT 1000000u

void sched_instance_desc_init(sched_instance_desc_t *desc)
{
    memset(desc, 0, sizeof(*desc));
    desc->role = SCHED_ROLE_BOTH;
    desc->weight = 1;
    desc->dp_size = 1;
    desc->source = SCHED_SOURCE_STATIC;
}

static bool str_empty(const char *s)
{
    return !s || !*s;
}

static char *dup_n(const char *s, size_t n)
{
    char *copy = sched_malloc(n + 1);

    if (copy) {
        memcpy(copy, s, n);
        copy[n] = '\0';
    }
    return copy;
}

sched_status_t sched_split_hostport(const char *in, char *host, size_t host_len, int *port_out)
{
    const char *colon;
    size_t hlen;
    char *end;
    long port;

    if (!in || !*in)
        return SCHED_ERR_INVALID;
    if (in[0] == '[') {
        const char *close = strchr(in, ']');
        if (!close || close[1] != ':')
            return SCHED_ERR_INVALID;
        hlen = (size_t)(close - in - 1);
        in++;
        colon = close + 1;
    } else {
        colon = strrchr(in, ':');
        if (!colon || memchr(in, ':', (size_t)(colon - in)))
            return SCHED_ERR_INVALID;
        hlen = (size_t)(colon - in);
    }
    if (hlen == 0 || hlen >= host_len)
        return SCHED_ERR_INVALID;
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
        return SCHED_ERR_INVALID;
    memcpy(host, in, hlen);
    host[hlen] = '\0';
    *port_out = (int)port;
    return SCHED_OK;
}

/* Parse scheme://host[:port][/base]; outputs are malloc'd on success. */
static sched_status_t parse_url(const char *url, char **scheme_out, char **host_out, int *port_out,
                                char **base_out, char *err, size_t err_len)
{
    const char *p, *host_start, *host_end, *rest;
    char *scheme = NULL, *host = NULL, *base = NULL;
    int port;
    size_t blen;

    if (strncmp(url, "http://", 7) == 0) {
        scheme = sched_strdup("http");
        port = 80;
        p = url + 7;
    } else if (strncmp(url, "https://", 8) == 0) {
        scheme = sched_strdup("https");
        port = 443;
        p = url + 8;
    } else {
        sched_set_err(err, err_len, "url: must start with http:// or https://");
        return SCHED_ERR_INVALID;
    }
    if (!scheme)
        goto err_nomem;

    if (*p == '[') {
        host_start = p + 1;
        host_end = strchr(host_start, ']');
        if (!host_end) {
            sched_set_err(err, err_len, "url: unterminated IPv6 address");
            goto err_invalid;
        }
        rest = host_end + 1;
    } else {
        host_start = p;
        host_end = p + strcspn(p, ":/?#@");
        rest = host_end;
    }
    if (host_end == host_start) {
        sched_set_err(err, err_len, "url: missing host");
        goto err_invalid;
    }
    for (const char *c = host_start; c < host_end; c++) {
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_' && *c != ':' &&
            *c != '%') {
            sched_set_err(err, err_len, "url: bad character in host");
            goto err_invalid;
        }
    }
    if (*rest == ':') {
        char *end;
        long v;
        errno = 0;
        v = strtol(rest + 1, &end, 10);
        if (errno || end == rest + 1 || v < 1 || v > 65535 || (*end && *end != '/')) {
            sched_set_err(err, err_len, "url: bad port");
            goto err_invalid;
        }
        port = (int)v;
        rest = end;
    }
    if (*rest && *rest != '/') {
        sched_set_err(err, err_len, "url: unexpected '%c' (no userinfo, query or fragment)", *rest);
        goto err_invalid;
    }
    if (strpbrk(rest, "?# \t\r\n")) {
        sched_set_err(err, err_len, "url: query, fragment or whitespace not allowed");
        goto err_invalid;
    }
    blen = strlen(rest);
    while (blen > 0 && rest[blen - 1] == '/')
        blen--;
    host = dup_n(host_start, (size_t)(host_end - host_start));
    base = dup_n(rest, blen);
    if (!host || !base)
        goto err_nomem;
    *scheme_out = scheme;
    *host_out = host;
    *port_out = port;
    *base_out = base;
    return SCHED_OK;

err_nomem:
    sched_set_err(err, err_len, "out of memory");
    sched_free(host);
    sched_free(base);
    sched_free(scheme);
    return SCHED_ERR_NO_MEMORY;
err_invalid:
    sched_free(scheme);
    return SCHED_ERR_INVALID;
}

static bool id_valid(const char *id)
{
    size_t len = strlen(id);

    if (len == 0 || len >= SCHED_ID_MAX)
        return false;
    for (const char *c = id; *c; c++) {
        if (!isalnum((unsigned char)*c) && !strchr("._-:[]@", *c))
            return false;
    }
    return true;
}

static bool port_ok(int port)
{
    return port >= 0 && port <= 65535;
}

sched_status_t sched_instance_desc_validate(const sched_instance_desc_t *desc, char *err,
                                            size_t err_len)
{
    char *scheme, *host, *base;
    int port;
    sched_status_t status;

    if (!desc) {
        sched_set_err(err, err_len, "missing descriptor");
        return SCHED_ERR_INVALID;
    }
    if (str_empty(desc->url)) {
        sched_set_err(err, err_len, "url: required");
        return SCHED_ERR_INVALID;
    }
    status = parse_url(desc->url, &scheme, &host, &port, &base, err, err_len);
    if (status != SCHED_OK)
        return status;
    sched_free(host);
    sched_free(base);
    sched_free(scheme);
    if (!str_empty(desc->id) && !id_valid(desc->id)) {
        sched_set_err(err, err_len, "id: 1-%d characters of letters, digits and ._-:[]@ required",
                      SCHED_ID_MAX - 1);
        return SCHED_ERR_INVALID;
    }
    if (desc->role != SCHED_ROLE_PREFILL && desc->role != SCHED_ROLE_DECODE &&
        desc->role != SCHED_ROLE_BOTH) {
        sched_set_err(err, err_len, "role: must be prefill, decode or both");
        return SCHED_ERR_INVALID;
    }
    if (desc->weight > SCHED_MAX_WEIGHT) {
        sched_set_err(err, err_len, "weight: at most %u", SCHED_MAX_WEIGHT);
        return SCHED_ERR_INVALID;
    }
    if (!port_ok(desc->kv_port)) {
        sched_set_err(err, err_len, "kv_port: must be 0-65535");
        return SCHED_ERR_INVALID;
    }
    if (!port_ok(desc->bootstrap_port)) {
        sched_set_err(err, err_len, "bootstrap_port: must be 0-65535");
        return SCHED_ERR_INVALID;
    }
    if (desc->n_alloc_ports > SCHED_MAX_TP || desc->n_init_ports > SCHED_MAX_TP) {
        sched_set_err(err, err_len, "alloc_ports/init_ports: at most %d entries", SCHED_MAX_TP);
        return SCHED_ERR_INVALID;
    }
    for (size_t i = 0; i < desc->n_alloc_ports; i++) {
        if (desc->alloc_ports[i] < 1 || desc->alloc_ports[i] > 65535) {
            sched_set_err(err, err_len, "alloc_ports[%zu]: must be 1-65535", i);
            return SCHED_ERR_INVALID;
        }
    }
    for (size_t i = 0; i < desc->n_init_ports; i++) {
        if (desc->init_ports[i] < 1 || desc->init_ports[i] > 65535) {
            sched_set_err(err, err_len, "init_ports[%zu]: must be 1-65535", i);
            return SCHED_ERR_INVALID;
        }
    }
    if (desc->tp_size < 0 || desc->tp_size > SCHED_MAX_TP) {
        sched_set_err(err, err_len, "tp_size: must be 1-%d", SCHED_MAX_TP);
        return SCHED_ERR_INVALID;
    }
    {
        size_t tp = desc->tp_size > 0 ? (size_t)desc->tp_size : 1;
        if (desc->tp_size == 0 && desc->n_alloc_ports > 0)
            tp = desc->n_alloc_ports;
        if (desc->n_alloc_ports && desc->n_alloc_ports != tp) {
            sched_set_err(err, err_len, "alloc_ports: %zu entries for tp_size %zu",
                          desc->n_alloc_ports, tp);
            return SCHED_ERR_INVALID;
        }
        if (desc->n_init_ports && desc->n_init_ports != tp) {
            sched_set_err(err, err_len, "init_ports: %zu entries for tp_size %zu",
                          desc->n_init_ports, tp);
            return SCHED_ERR_INVALID;
        }
    }
    if (desc->dp_size < 0 || desc->dp_rank < 0 ||
        desc->dp_rank >= (desc->dp_size > 0 ? desc->dp_size : 1)) {
        sched_set_err(err, err_len, "dp_rank/dp_size: need 0 <= dp_rank < dp_size");
        return SCHED_ERR_INVALID;
    }
    if (desc->n_labels > SCHED_MAX_LABELS) {
        sched_set_err(err, err_len, "labels: at most %d", SCHED_MAX_LABELS);
        return SCHED_ERR_INVALID;
    }
    for (size_t i = 0; i < desc->n_labels; i++) {
        if (str_empty(desc->labels[i].key) || !desc->labels[i].value) {
            sched_set_err(err, err_len, "labels: empty key or missing value");
            return SCHED_ERR_INVALID;
        }
    }
    if (desc->n_models > SCHED_MAX_MODELS) {
        sched_set_err(err, err_len, "models: at most %d", SCHED_MAX_MODELS);
        return SCHED_ERR_INVALID;
    }
    for (size_t i = 0; i < desc->n_models; i++) {
        if (str_empty(desc->models[i]) || strlen(desc->models[i]) > SCHED_MODEL_NAME_MAX) {
            sched_set_err(err, err_len, "models[%zu]: must be a name of 1-%d bytes", i,
                          SCHED_MODEL_NAME_MAX);
            return SCHED_ERR_INVALID;
        }
    }
    if (desc->source > SCHED_SOURCE_ADMIN) {
        sched_set_err(err, err_len, "source: unknown");
        return SCHED_ERR_INVALID;
    }
    return SCHED_OK;
}

void sched_desc_free(sched_instance_desc_t *d)
{
    sched_free((char *)d->id);
    sched_free((char *)d->url);
    sched_free((char *)d->kv_host);
    sched_free((char *)d->engine_id);
    sched_free((char *)d->kv_events_endpoint);
    sched_free((char *)d->kv_events_replay_endpoint);
    sched_free((char *)d->zone);
    sched_free((char *)d->attrs);
    for (size_t i = 0; i < d->n_labels; i++) {
        sched_free((char *)d->labels[i].key);
        sched_free((char *)d->labels[i].value);
    }
    for (size_t i = 0; i < d->n_models; i++)
        sched_free((char *)d->models[i]);
    sched_free((char *)d->scheme);
    sched_free((char *)d->host);
    sched_free((char *)d->base_path);
    memset(d, 0, sizeof(*d));
}

static const char *label_lookup(const sched_instance_desc_t *d, const char *key)
{
    for (size_t i = 0; i < d->n_labels; i++) {
        if (strcmp(d->labels[i].key, key) == 0)
            return d->labels[i].value;
    }
    return NULL;
}

sched_status_t sched_desc_copy(const sched_instance_desc_t *src, sched_instance_desc_t *dst,
                               char *err, size_t err_len)
{
    sched_instance_desc_t d;
    char *scheme = NULL, *host = NULL, *base = NULL, *url = NULL;
    int port = 0;
    bool v6;
    size_t url_len;
    sched_status_t status;
    const char *zone;

    status = sched_instance_desc_validate(src, err, err_len);
    if (status != SCHED_OK)
        return status;
    status = parse_url(src->url, &scheme, &host, &port, &base, err, err_len);
    if (status != SCHED_OK)
        return status;

    memset(&d, 0, sizeof(d));
    d.scheme = scheme;
    d.host = host;
    d.port = port;
    d.base_path = base;
    v6 = strchr(host, ':') != NULL;
    url_len = strlen(scheme) + strlen(host) + strlen(base) + 32;
    url = sched_malloc(url_len);
    if (!url)
        goto err_nomem;
    snprintf(url, url_len, "%s://%s%s%s:%d%s", scheme, v6 ? "[" : "", host, v6 ? "]" : "", port,
             base);
    d.url = url;
    url = NULL;
    if (str_empty(src->id)) {
        char idbuf[SCHED_ID_MAX + 16];
        snprintf(idbuf, sizeof(idbuf), "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
        if (!id_valid(idbuf)) {
            sched_set_err(err, err_len, "id: cannot derive a valid id from url; give one");
            status = SCHED_ERR_INVALID;
            goto err_free;
        }
        d.id = sched_strdup(idbuf);
    } else {
        d.id = sched_strdup(src->id);
    }
    d.role = src->role;
    d.weight = src->weight ? src->weight : 1;
    d.kv_host = sched_strdup(str_empty(src->kv_host) ? host : src->kv_host);
    d.kv_port = src->kv_port;
    d.bootstrap_port = src->bootstrap_port;
    d.engine_id = sched_strdup(src->engine_id ? src->engine_id : "");
    d.kv_events_endpoint = sched_strdup(src->kv_events_endpoint ? src->kv_events_endpoint : "");
    d.kv_events_replay_endpoint =
        sched_strdup(src->kv_events_replay_endpoint ? src->kv_events_replay_endpoint : "");
    memcpy(d.alloc_ports, src->alloc_ports, sizeof(int) * src->n_alloc_ports);
    d.n_alloc_ports = src->n_alloc_ports;
    memcpy(d.init_ports, src->init_ports, sizeof(int) * src->n_init_ports);
    d.n_init_ports = src->n_init_ports;
    d.tp_size =
        src->tp_size > 0 ? src->tp_size : (src->n_alloc_ports ? (int)src->n_alloc_ports : 1);
    d.dp_rank = src->dp_rank;
    d.dp_size = src->dp_size > 0 ? src->dp_size : 1;
    zone = !str_empty(src->zone) ? src->zone : label_lookup(src, "zone");
    d.zone = sched_strdup(zone ? zone : "");
    d.source = src->source;
    d.kv_engine = src->kv_engine;
    d.max_concurrent = src->max_concurrent;
    d.kv_capacity_tokens = src->kv_capacity_tokens;
    d.attrs = sched_strdup(src->attrs ? src->attrs : "");
    if (!d.url || !d.id || !d.kv_host || !d.engine_id || !d.zone || !d.kv_events_endpoint ||
        !d.kv_events_replay_endpoint || !d.attrs)
        goto err_nomem;
    for (size_t i = 0; i < src->n_labels; i++) {
        d.labels[i].key = sched_strdup(src->labels[i].key);
        d.labels[i].value = sched_strdup(src->labels[i].value);
        d.n_labels = i + 1;
        if (!d.labels[i].key || !d.labels[i].value)
            goto err_nomem;
    }
    for (size_t i = 0; i < src->n_models; i++) {
        d.models[i] = sched_strdup(src->models[i]);
        d.n_models = i + 1;
        if (!d.models[i])
            goto err_nomem;
    }
    *dst = d;
    return SCHED_OK;

err_nomem:
    sched_set_err(err, err_len, "out of memory");
    status = SCHED_ERR_NO_MEMORY;
err_free:
    sched_free(url);
    sched_desc_free(&d);
    return status;
}

static bool str_eq(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

bool sched_desc_equal(const sched_instance_desc_t *a, const sched_instance_desc_t *b)
{
    if (!str_eq(a->id, b->id) || !str_eq(a->url, b->url) || a->role != b->role ||
        a->weight != b->weight || !str_eq(a->kv_host, b->kv_host) || a->kv_port != b->kv_port ||
        a->bootstrap_port != b->bootstrap_port || !str_eq(a->engine_id, b->engine_id) ||
        !str_eq(a->kv_events_endpoint, b->kv_events_endpoint) ||
        !str_eq(a->kv_events_replay_endpoint, b->kv_events_replay_endpoint) ||
        a->n_alloc_ports != b->n_alloc_ports || a->n_init_ports != b->n_init_ports ||
        a->tp_size != b->tp_size || a->dp_rank != b->dp_rank || a->dp_size != b->dp_size ||
        !str_eq(a->zone, b->zone) || a->n_labels != b->n_labels || a->source != b->source ||
        a->n_models != b->n_models || a->kv_engine != b->kv_engine || !str_eq(a->attrs, b->attrs) ||
        a->max_concurrent != b->max_concurrent || a->kv_capacity_tokens != b->kv_capacity_tokens)
        return false;
    if (memcmp(a->alloc_ports, b->alloc_ports, sizeof(int) * a->n_alloc_ports) ||
        memcmp(a->init_ports, b->init_ports, sizeof(int) * a->n_init_ports))
        return false;
    for (size_t i = 0; i < a->n_labels; i++) {
        if (!str_eq(a->labels[i].key, b->labels[i].key) ||
            !str_eq(a->labels[i].value, b->labels[i].value))
            return false;
    }
    for (size_t i = 0; i < a->n_models; i++) {
        if (!str_eq(a->models[i], b->models[i]))
            return false;
    }
    return true;
}

/* ---- JSON --------------------------------------------------------- */

static sched_status_t json_port(const json_t *v, const char *key, int min, int *out, char *err,
                                size_t err_len)
{
    json_int_t n;

    if (!json_is_integer(v)) {
        sched_set_err(err, err_len, "%s: must be an integer", key);
        return SCHED_ERR_INVALID;
    }
    n = json_integer_value(v);
    if (n < min || n > 65535) {
        sched_set_err(err, err_len, "%s: must be %d-65535", key, min);
        return SCHED_ERR_INVALID;
    }
    *out = (int)n;
    return SCHED_OK;
}

static sched_status_t json_small_int(const json_t *v, const char *key, int min, int max, int *out,
                                     char *err, size_t err_len)
{
    json_int_t n;

    if (!json_is_integer(v)) {
        sched_set_err(err, err_len, "%s: must be an integer", key);
        return SCHED_ERR_INVALID;
    }
    n = json_integer_value(v);
    if (n < min || n > max) {
        sched_set_err(err, err_len, "%s: must be %d-%d", key, min, max);
        return SCHED_ERR_INVALID;
    }
    *out = (int)n;
    return SCHED_OK;
}

static sched_status_t json_str(const json_t *v, const char *key, const char **out, char *err,
                               size_t err_len)
{
    if (json_is_null(v)) {
        *out = NULL;
        return SCHED_OK;
    }
    if (!json_is_string(v)) {
        sched_set_err(err, err_len, "%s: must be a string", key);
        return SCHED_ERR_INVALID;
    }
    if (strlen(json_string_value(v)) != json_string_length(v)) {
        sched_set_err(err, err_len, "%s: embedded NUL", key);
        return SCHED_ERR_INVALID;
    }
    *out = json_string_value(v);
    return SCHED_OK;
}

static sched_status_t json_ports(const json_t *v, const char *key, int *ports, size_t *n_out,
                                 char *err, size_t err_len)
{
    size_t i;
    json_t *e;

    if (!json_is_array(v)) {
        sched_set_err(err, err_len, "%s: must be an array of ports", key);
        return SCHED_ERR_INVALID;
    }
    if (json_array_size(v) > SCHED_MAX_TP) {
        sched_set_err(err, err_len, "%s: at most %d entries", key, SCHED_MAX_TP);
        return SCHED_ERR_INVALID;
    }
    json_array_foreach(v, i, e)
    {
        char name[48];
        snprintf(name, sizeof(name), "%s[%zu]", key, i);
        if (json_port(e, name, 1, &ports[i], err, err_len) != SCHED_OK)
            return SCHED_ERR_INVALID;
    }
    *n_out = json_array_size(v);
    return SCHED_OK;
}

sched_status_t sched_instance_desc_from_json(const json_t *obj, sched_instance_desc_t *desc,
                                             char *err, size_t err_len)
{
    sched_instance_desc_t d;
    const char *key;
    json_t *v;
    sched_status_t st = SCHED_OK;

    if (!json_is_object(obj)) {
        sched_set_err(err, err_len, "instance: must be a JSON object");
        return SCHED_ERR_INVALID;
    }
    sched_instance_desc_init(&d);
    json_object_foreach((json_t *)obj, key, v)
    {
        if (strcmp(key, "id") == 0) {
            st = json_str(v, key, &d.id, err, err_len);
        } else if (strcmp(key, "url") == 0) {
            st = json_str(v, key, &d.url, err, err_len);
        } else if (strcmp(key, "role") == 0) {
            if (!json_is_string(v) || sched_role_parse(json_string_value(v), &d.role)) {
                sched_set_err(err, err_len, "role: must be prefill, decode or both");
                st = SCHED_ERR_INVALID;
            }
        } else if (strcmp(key, "zone") == 0) {
            st = json_str(v, key, &d.zone, err, err_len);
        } else if (strcmp(key, "weight") == 0) {
            int w = 0;
            st = json_small_int(v, key, 0, (int)SCHED_MAX_WEIGHT, &w, err, err_len);
            d.weight = (unsigned)w;
        } else if (strcmp(key, "kv_host") == 0) {
            st = json_str(v, key, &d.kv_host, err, err_len);
        } else if (strcmp(key, "kv_port") == 0) {
            st = json_port(v, key, 0, &d.kv_port, err, err_len);
        } else if (strcmp(key, "bootstrap_port") == 0) {
            st = json_port(v, key, 0, &d.bootstrap_port, err, err_len);
        } else if (strcmp(key, "engine_id") == 0) {
            st = json_str(v, key, &d.engine_id, err, err_len);
        } else if (strcmp(key, "kv_events_endpoint") == 0) {
            st = json_str(v, key, &d.kv_events_endpoint, err, err_len);
        } else if (strcmp(key, "kv_events_replay_endpoint") == 0) {
            st = json_str(v, key, &d.kv_events_replay_endpoint, err, err_len);
        } else if (strcmp(key, "kv_engine") == 0) {
            const char *e = json_string_value(v);
            if (e != NULL && strcmp(e, "libkvt") == 0) {
                d.kv_engine = SCHED_KV_ENGINE_LIBKVT;
            } else if (e != NULL && strcmp(e, "lmcache") == 0) {
                d.kv_engine = SCHED_KV_ENGINE_UPSTREAM;
            } else {
                sched_set_err(err, err_len, "kv_engine: must be \"lmcache\" or \"libkvt\"");
                st = SCHED_ERR_INVALID;
            }
        } else if (strcmp(key, "alloc_ports") == 0) {
            st = json_ports(v, key, d.alloc_ports, &d.n_alloc_ports, err, err_len);
        } else if (strcmp(key, "init_ports") == 0) {
            st = json_ports(v, key, d.init_ports, &d.n_init_ports, err, err_len);
        } else if (strcmp(key, "max_concurrent") == 0) {
            int mc = 0;
            st = json_small_int(v, key, 0, 1000000, &mc, err, err_len);
            d.max_concurrent = (unsigned)mc;
        } else if (strcmp(key, "kv_capacity_tokens") == 0) {
            /* an integer of tokens, at most 2^40 (a trillion: no engine holds more) */
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > ((json_int_t)1 << 40)) {
                sched_set_err(err, err_len, "kv_capacity_tokens: must be an integer 0..2^40");
                st = SCHED_ERR_INVALID;
            } else {
                d.kv_capacity_tokens = (uint64_t)json_integer_value(v);
            }
        } else if (strcmp(key, "tp_size") == 0) {
            st = json_small_int(v, key, 1, SCHED_MAX_TP, &d.tp_size, err, err_len);
        } else if (strcmp(key, "dp_rank") == 0) {
            st = json_small_int(v, key, 0, 65535, &d.dp_rank, err, err_len);
        } else if (strcmp(key, "dp_size") == 0) {
            st = json_small_int(v, key, 1, 65536, &d.dp_size, err, err_len);
        } else if (strcmp(key, "models") == 0) {
            size_t mi;
            json_t *mv;
            if (!json_is_array(v) || json_array_size(v) > SCHED_MAX_MODELS) {
                sched_set_err(err, err_len, "models: must be an array of at most %d names",
                              SCHED_MAX_MODELS);
                st = SCHED_ERR_INVALID;
            } else {
                json_array_foreach(v, mi, mv)
                {
                    char name[32];
                    snprintf(name, sizeof(name), "models[%zu]", mi);
                    st = json_str(mv, name, &d.models[mi], err, err_len);
                    if (st != SCHED_OK)
                        break;
                    d.n_models = mi + 1;
                }
            }
        } else if (strcmp(key, "labels") == 0) {
            const char *lk;
            json_t *lv;
            if (!json_is_object(v)) {
                sched_set_err(err, err_len, "labels: must be an object of strings");
                st = SCHED_ERR_INVALID;
            } else if (json_object_size(v) > SCHED_MAX_LABELS) {
                sched_set_err(err, err_len, "labels: at most %d", SCHED_MAX_LABELS);
                st = SCHED_ERR_INVALID;
            } else {
                json_object_foreach(v, lk, lv)
                {
                    if (!json_is_string(lv) || !*lk) {
                        sched_set_err(err, err_len, "labels.%s: must be a string", lk);
                        st = SCHED_ERR_INVALID;
                        break;
                    }
                    d.labels[d.n_labels].key = lk;
                    d.labels[d.n_labels].value = json_string_value(lv);
                    d.n_labels++;
                }
            }
        } else {
            sched_set_err(err, err_len, "%s: unknown key", key);
            st = SCHED_ERR_INVALID;
        }
        if (st != SCHED_OK)
            return st;
    }
    st = sched_instance_desc_validate(&d, err, err_len);
    if (st != SCHED_OK)
        return st;
    *desc = d;
    return SCHED_OK;
}
