/*
 * kvt_config.c -- kvt_config_t defaults, the key table, typed value parsing
 * (sizes, durations, booleans, port lists), key=value setting, validation
 * and JSON dump.
 */
#include "kvt_config_int.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum key_kind {
    K_ROLE,
    K_CHANNEL,
    K_STR,
    K_SIZE,
    K_PORTS,
    K_PORT,
    K_BOOL,
    K_SECONDS,
    K_FLOAT,
    K_U32,
    K_I32,
    K_DEVICE,
} key_kind_t;

typedef struct key_desc {
    const char *name;
    key_kind_t kind;
    size_t off;
} key_desc_t;

#define KEY(name, kind)                                                                            \
    {                                                                                              \
#name, kind, offsetof(kvt_config_t, name)                                                  \
    }

static const key_desc_t keys[] = {
    KEY(pd_role, K_ROLE),
    KEY(pd_buffer_size, K_SIZE),
    KEY(pd_buffer_device, K_DEVICE),
    KEY(pd_peer_host, K_STR),
    KEY(pd_peer_init_port, K_PORTS),
    KEY(pd_peer_alloc_port, K_PORTS),
    KEY(pd_proxy_host, K_STR),
    KEY(pd_proxy_port, K_PORT),
    KEY(pd_pull_mode, K_BOOL),
    KEY(pd_delay_pull, K_BOOL),
    KEY(pd_pull_done_port, K_PORTS),
    KEY(pd_use_cpu_offload, K_BOOL),
    KEY(pd_cpu_buffer_size, K_SIZE),
    KEY(pd_alloc_fail_backoff_ttl, K_SECONDS),
    KEY(pd_pull_pending_ttl, K_SECONDS),
    KEY(pd_pull_backpressure_reserve_pct, K_FLOAT),
    KEY(pd_allocation_timeout_sec, K_SECONDS),
    KEY(pd_shutdown_timeout_sec, K_SECONDS),
    KEY(pd_alloc_ttl, K_SECONDS),
    KEY(pd_alloc_quota, K_FLOAT),
    KEY(pd_node_id, K_STR),
    KEY(pd_tp_rank, K_U32),
    KEY(transfer_channel, K_CHANNEL),
    KEY(transfer_lanes, K_U32),
    KEY(transfer_max_conns, K_U32),
    KEY(transfer_max_conns_per_peer, K_U32),
    KEY(transfer_max_pending, K_U32),
    KEY(transfer_max_conns_per_addr, K_U32),
    KEY(transfer_max_pending_per_addr, K_U32),
    KEY(transfer_addr_prefix_v6, K_U32),
    KEY(transfer_max_peers_per_addr, K_U32),
    KEY(transfer_hello_timeout, K_SECONDS),
    KEY(transfer_idle_timeout, K_SECONDS),
    KEY(verbs_device, K_STR),
    KEY(verbs_gid_index, K_I32),
    KEY(chunk_size, K_U32),
    KEY(enable_pd, K_BOOL),
    KEY(local_cpu, K_BOOL),
    KEY(pd_peer_flavour, K_STR),
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

void kvt_config_defaults(kvt_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->pd_role = KVT_ROLE_BOTH;
    cfg->pd_buffer_size = 1ull << 30;
    strcpy(cfg->pd_buffer_device, "cpu");
    cfg->pd_buffer_is_device = 0;
    strcpy(cfg->pd_peer_host, "127.0.0.1");
    cfg->pd_alloc_fail_backoff_ttl = 2.0;
    cfg->pd_pull_pending_ttl = 360.0;
    cfg->pd_pull_backpressure_reserve_pct = 2.0;
    cfg->pd_allocation_timeout_sec = 5.0;
    cfg->pd_shutdown_timeout_sec = 5.0;
    cfg->pd_alloc_ttl = 30.0;
    cfg->pd_alloc_quota = 0.5;
    cfg->transfer_channel = KVT_CHANNEL_TCP;
    cfg->transfer_lanes = 0;
    cfg->verbs_gid_index = -1;
    cfg->chunk_size = 256;
    cfg->enable_pd = 1;
    cfg->local_cpu = 0;
    strcpy(cfg->pd_peer_flavour, "auto");
}

kvt_status_t kvt_flavour_parse(const char *s, kvt_flavour_t *out)
{
    static const char *names[] = {"auto", "async", "sync", "ascend", "libkvt"};

    for (int i = 0; s != NULL && i < 5; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (kvt_flavour_t)i;
            return KVT_OK;
        }
    }
    return KVT_ERR_CONFIG;
}

const char *kvt_flavour_name(kvt_flavour_t f)
{
    switch (f) {
    case KVT_FLAVOUR_AUTO:
        return "auto";
    case KVT_FLAVOUR_ASYNC:
        return "async";
    case KVT_FLAVOUR_SYNC:
        return "sync";
    case KVT_FLAVOUR_ASCEND:
        return "ascend";
    case KVT_FLAVOUR_LIBKVT:
        return "libkvt";
    }
    return "?";
}

kvt_status_t kvt_config_fail(kvt_config_err_t *err, const char *key, int line, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        snprintf(err->key, sizeof(err->key), "%s", key != NULL ? key : "");
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->line = line;
    }
    return KVT_ERR_CONFIG;
}

const char *kvt_role_name(kvt_role_t r)
{
    switch (r) {
    case KVT_ROLE_SENDER:
        return "sender";
    case KVT_ROLE_RECEIVER:
        return "receiver";
    case KVT_ROLE_BOTH:
        return "both";
    }
    return "unknown";
}

const char *kvt_channel_name(kvt_channel_t c)
{
    switch (c) {
    case KVT_CHANNEL_TCP:
        return "tcp";
    case KVT_CHANNEL_VERBS:
        return "verbs";
    case KVT_CHANNEL_SHM:
        return "shm";
    }
    return "unknown";
}

kvt_status_t kvt_role_parse(const char *s, kvt_role_t *out)
{
    if (s == NULL || out == NULL)
        return KVT_ERR_INVALID;
    if (strcasecmp(s, "sender") == 0)
        *out = KVT_ROLE_SENDER;
    else if (strcasecmp(s, "receiver") == 0)
        *out = KVT_ROLE_RECEIVER;
    else if (strcasecmp(s, "both") == 0)
        *out = KVT_ROLE_BOTH;
    else
        return KVT_ERR_INVALID;
    return KVT_OK;
}

kvt_status_t kvt_channel_parse(const char *s, kvt_channel_t *out)
{
    if (s == NULL || out == NULL)
        return KVT_ERR_INVALID;
    if (strcasecmp(s, "tcp") == 0)
        *out = KVT_CHANNEL_TCP;
    else if (strcasecmp(s, "verbs") == 0 || strcasecmp(s, "rdma") == 0)
        *out = KVT_CHANNEL_VERBS;
    else if (strcasecmp(s, "shm") == 0)
        *out = KVT_CHANNEL_SHM;
    else
        return KVT_ERR_INVALID;
    return KVT_OK;
}

/* ---- scalar parsers (whole string must be consumed) --------------------------- */

static int parse_i64(const char *s, long long *out)
{
    char *end;
    long long v;

    if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    double v;

    if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v))
        return -1;
    *out = v;
    return (int)(end - s);
}

static int parse_bool(const char *s, int *out)
{
    static const char *const t[] = {"true", "yes", "on", "1"};
    static const char *const f[] = {"false", "no", "off", "0"};

    if (s == NULL)
        return -1;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, t[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, f[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ull << 10},
        {"kb", 1000ull},
        {"kib", 1ull << 10},
        {"m", 1ull << 20},
        {"mb", 1000000ull},
        {"mib", 1ull << 20},
        {"g", 1ull << 30},
        {"gb", 1000000000ull},
        {"gib", 1ull << 30},
        {"t", 1ull << 40},
        {"tb", 1000000000000ull},
        {"tib", 1ull << 40},
    };
    double v;
    int n = parse_double(s, &v);
    const char *suf;

    if (n < 0 || v < 0)
        return -1;
    suf = s + n;
    while (*suf == ' ')
        suf++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(suf, units[i].suffix) == 0) {
            double bytes = v * (double)units[i].mult;
            if (bytes >= 18446744073709551615.0 || bytes != (double)(uint64_t)bytes)
                return -1;
            *out = (uint64_t)bytes;
            return 0;
        }
    }
    return -1;
}

static int parse_seconds(const char *s, double *out)
{
    double v;
    int n = parse_double(s, &v);
    const char *suf;

    if (n < 0 || v < 0)
        return -1;
    suf = s + n;
    if (*suf == '\0' || strcmp(suf, "s") == 0)
        *out = v;
    else if (strcmp(suf, "ms") == 0)
        *out = v / 1000.0;
    else if (strcmp(suf, "m") == 0)
        *out = v * 60.0;
    else if (strcmp(suf, "h") == 0)
        *out = v * 3600.0;
    else
        return -1;
    return 0;
}

static int parse_port(const char *s, uint16_t *out)
{
    long long v;
    if (parse_i64(s, &v) != 0 || v < 1 || v > 65535)
        return -1;
    *out = (uint16_t)v;
    return 0;
}

static int is_null(const kvt_cfg_val_t *v)
{
    return !v->is_list && v->scalar == NULL;
}

static const key_desc_t *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

kvt_status_t kvt_config_apply(kvt_config_t *cfg, const char *key, const kvt_cfg_val_t *v,
                              kvt_config_err_t *err)
{
    const key_desc_t *k = find_key(key);
    char *field;
    const char *s = v->scalar;
    int line = v->line;

    if (k == NULL)
        return kvt_config_fail(err, key, line, "unknown key '%s'", key);
    field = (char *)cfg + k->off;

    if (is_null(v)) {
        /* null / None: back to the default */
        kvt_config_t d;
        kvt_config_defaults(&d);
        memcpy(field, (char *)&d + k->off,
               k->kind == K_STR || k->kind == K_DEVICE      ? (size_t)KVT_CONFIG_STR_MAX
               : k->kind == K_PORTS                         ? sizeof(kvt_port_list_t)
               : k->kind == K_SIZE                          ? sizeof(uint64_t)
               : k->kind == K_SECONDS || k->kind == K_FLOAT ? sizeof(double)
               : k->kind == K_PORT                          ? sizeof(uint16_t)
                                                            : sizeof(int32_t));
        if (k->kind == K_DEVICE)
            cfg->pd_buffer_is_device = d.pd_buffer_is_device;
        return KVT_OK;
    }
    if (v->is_list && k->kind != K_PORTS)
        return kvt_config_fail(err, key, line, "'%s' takes a single value, not a list", key);

    switch (k->kind) {
    case K_ROLE:
        if (kvt_role_parse(s, (kvt_role_t *)field) != KVT_OK)
            return kvt_config_fail(err, key, line,
                                   "'%s' must be sender, receiver or both (got '%s')", key, s);
        return KVT_OK;
    case K_CHANNEL:
        if (kvt_channel_parse(s, (kvt_channel_t *)field) != KVT_OK)
            return kvt_config_fail(err, key, line, "'%s' must be tcp, verbs or shm (got '%s')", key,
                                   s);
        return KVT_OK;
    case K_STR:
    case K_DEVICE:
        if (strlen(s) >= KVT_CONFIG_STR_MAX)
            return kvt_config_fail(err, key, line, "'%s' is too long (max %d bytes)", key,
                                   KVT_CONFIG_STR_MAX - 1);
        if (k->kind == K_DEVICE && s[0] == '\0')
            return kvt_config_fail(err, key, line, "'%s' must not be empty", key);
        strcpy(field, s);
        if (k->kind == K_DEVICE)
            cfg->pd_buffer_is_device = strcasecmp(s, "cpu") != 0;
        return KVT_OK;
    case K_SIZE:
        if (parse_size(s, (uint64_t *)field) != 0)
            return kvt_config_fail(err, key, line,
                                   "'%s' must be a byte size such as 134217728 or \"128MiB\" "
                                   "(got '%s')",
                                   key, s);
        return KVT_OK;
    case K_PORT:
        if (parse_port(s, (uint16_t *)field) != 0)
            return kvt_config_fail(err, key, line, "'%s' must be a port 1..65535 (got '%s')", key,
                                   s);
        return KVT_OK;
    case K_BOOL:
        if (parse_bool(s, (int *)field) != 0)
            return kvt_config_fail(err, key, line, "'%s' must be true or false (got '%s')", key, s);
        return KVT_OK;
    case K_SECONDS:
        if (parse_seconds(s, (double *)field) != 0)
            return kvt_config_fail(err, key, line,
                                   "'%s' must be seconds >= 0 such as 2.0 or \"500ms\" (got '%s')",
                                   key, s);
        return KVT_OK;
    case K_FLOAT: {
        double d = 0.0;
        if (parse_double(s, &d) != (int)strlen(s))
            return kvt_config_fail(err, key, line, "'%s' must be a number (got '%s')", key, s);
        *(double *)field = d;
        return KVT_OK;
    }
    case K_U32:
    case K_I32: {
        long long x;
        if (parse_i64(s, &x) != 0 || (k->kind == K_U32 && (x < 0 || x > UINT32_MAX)) ||
            (k->kind == K_I32 && (x < INT32_MIN || x > INT32_MAX)))
            return kvt_config_fail(err, key, line, "'%s' must be an integer%s (got '%s')", key,
                                   k->kind == K_U32 ? " >= 0" : "", s);
        if (k->kind == K_U32)
            *(uint32_t *)field = (uint32_t)x;
        else
            *(int32_t *)field = (int32_t)x;
        return KVT_OK;
    }
    case K_PORTS: {
        kvt_port_list_t l = {{0}, 0};
        size_t n = v->is_list ? v->nitems : 1;
        if (n > KVT_CONFIG_MAX_PORTS)
            return kvt_config_fail(err, key, line, "'%s' has more than %d ports", key,
                                   KVT_CONFIG_MAX_PORTS);
        for (size_t i = 0; i < n; i++) {
            const char *item = v->is_list ? v->items[i] : s;
            if (parse_port(item, &l.v[i]) != 0)
                return kvt_config_fail(err, key, line,
                                       "'%s' must be a list of ports 1..65535 (bad item '%s')", key,
                                       item != NULL ? item : "null");
        }
        l.n = (uint32_t)n;
        *(kvt_port_list_t *)field = l;
        return KVT_OK;
    }
    }
    return kvt_config_fail(err, key, line, "unsupported key kind");
}

/* Split "a,b" / "[a, b]" into items (in place in <buf>). */
static size_t split_list(char *buf, char **items, size_t max)
{
    size_t n = 0;
    char *p = buf, *end;

    while (isspace((unsigned char)*p))
        p++;
    end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1]))
        *--end = '\0';
    if (*p == '[' && end > p && end[-1] == ']') {
        p++;
        *--end = '\0';
    }
    while (*p != '\0' && n <= max) {
        char *comma = strchr(p, ',');
        char *e;
        if (comma != NULL)
            *comma = '\0';
        while (isspace((unsigned char)*p))
            p++;
        e = p + strlen(p);
        while (e > p && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (n < max)
            items[n] = p;
        n++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return n;
}

kvt_status_t kvt_config_set(kvt_config_t *cfg, const char *key, const char *value,
                            kvt_config_err_t *err)
{
    const key_desc_t *k;
    kvt_cfg_val_t v = {0};
    kvt_config_t tmp;
    kvt_status_t status;

    if (cfg == NULL || key == NULL || value == NULL)
        return KVT_ERR_INVALID;
    k = find_key(key);
    if (k == NULL)
        return kvt_config_fail(err, key, 0, "unknown key '%s'", key);
    tmp = *cfg;
    if (k->kind == K_PORTS) {
        char *buf = kvt_strdup(value);
        char *items[KVT_CONFIG_MAX_PORTS];
        size_t n;
        if (buf == NULL)
            return KVT_ERR_NOMEM;
        n = split_list(buf, items, KVT_CONFIG_MAX_PORTS);
        if (n > KVT_CONFIG_MAX_PORTS) {
            kvt_free(buf);
            return kvt_config_fail(err, key, 0, "'%s' has more than %d ports", key,
                                   KVT_CONFIG_MAX_PORTS);
        }
        v.is_list = 1;
        v.items = (const char *const *)items;
        v.nitems = n;
        status = kvt_config_apply(&tmp, key, &v, err);
        kvt_free(buf);
    } else {
        /* "null" / "None" on a command line resets the key to its default */
        v.scalar = strcmp(value, "null") == 0 || strcmp(value, "None") == 0 ? NULL : value;
        status = kvt_config_apply(&tmp, key, &v, err);
    }
    if (status == KVT_OK)
        *cfg = tmp;
    return status;
}

kvt_status_t kvt_config_load_env(kvt_config_t *cfg, const char *prefix, kvt_config_err_t *err)
{
    kvt_config_t tmp;
    char name[128];

    if (cfg == NULL || prefix == NULL || strlen(prefix) > 64)
        return KVT_ERR_INVALID;
    tmp = *cfg;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *v;
        size_t o = (size_t)snprintf(name, sizeof(name), "%s", prefix);
        for (const char *k = keys[i].name; *k != '\0' && o + 1 < sizeof(name); k++)
            name[o++] = (char)toupper((unsigned char)*k);
        name[o] = '\0';
        v = getenv(name);
        if (v == NULL)
            continue;
        if (kvt_config_set(&tmp, keys[i].name, v, err) != KVT_OK)
            return KVT_ERR_CONFIG;
    }
    *cfg = tmp;
    return KVT_OK;
}

kvt_status_t kvt_config_validate(const kvt_config_t *c, kvt_config_err_t *err)
{
    if (c->pd_role != KVT_ROLE_SENDER && c->pd_role != KVT_ROLE_RECEIVER &&
        c->pd_role != KVT_ROLE_BOTH)
        return kvt_config_fail(err, "pd_role", 0, "invalid role");
    if (c->pd_buffer_size == 0)
        return kvt_config_fail(err, "pd_buffer_size", 0, "pd_buffer_size must be > 0");
    if (c->pd_delay_pull && !c->pd_pull_mode)
        return kvt_config_fail(err, "pd_delay_pull", 0, "pd_delay_pull requires pd_pull_mode");
    if (c->pd_use_cpu_offload && !(c->pd_role & KVT_ROLE_SENDER))
        return kvt_config_fail(err, "pd_use_cpu_offload", 0,
                               "pd_use_cpu_offload requires a sender role (sender or both)");
    if (!(c->pd_pull_backpressure_reserve_pct >= 0.0 &&
          c->pd_pull_backpressure_reserve_pct < 100.0))
        return kvt_config_fail(err, "pd_pull_backpressure_reserve_pct", 0,
                               "pd_pull_backpressure_reserve_pct must be in [0, 100)");
    if (c->pd_alloc_fail_backoff_ttl < 0.0)
        return kvt_config_fail(err, "pd_alloc_fail_backoff_ttl", 0, "must be >= 0");
    if (c->pd_pull_pending_ttl < 0.0)
        return kvt_config_fail(err, "pd_pull_pending_ttl", 0, "must be >= 0");
    if (c->pd_allocation_timeout_sec < 0.0)
        return kvt_config_fail(err, "pd_allocation_timeout_sec", 0, "must be >= 0");
    if (c->pd_shutdown_timeout_sec < 0.0)
        return kvt_config_fail(err, "pd_shutdown_timeout_sec", 0, "must be >= 0");
    if (!(c->pd_alloc_ttl >= 0.0))
        return kvt_config_fail(err, "pd_alloc_ttl", 0, "must be >= 0 (0 = no expiry)");
    if (!(c->pd_alloc_quota > 0.0 && c->pd_alloc_quota <= 1.0))
        return kvt_config_fail(err, "pd_alloc_quota", 0,
                               "pd_alloc_quota must be in (0, 1] (a share of the pool)");
    if (c->transfer_lanes > 64)
        return kvt_config_fail(err, "transfer_lanes", 0, "transfer_lanes must be in 0..64");
    if (c->chunk_size == 0)
        return kvt_config_fail(err, "chunk_size", 0, "chunk_size must be > 0");
    {
        kvt_flavour_t fl;
        if (kvt_flavour_parse(c->pd_peer_flavour, &fl) != KVT_OK || fl == KVT_FLAVOUR_LIBKVT)
            return kvt_config_fail(err, "pd_peer_flavour", 0,
                                   "pd_peer_flavour must be auto, async, sync or ascend");
    }
    if ((c->pd_role & KVT_ROLE_RECEIVER) && c->pd_peer_alloc_port.n == 0)
        return kvt_config_fail(err, "pd_peer_alloc_port", 0,
                               "a receiver needs pd_peer_alloc_port (one port per TP rank)");
    if (c->pd_peer_alloc_port.n > 0 && c->pd_tp_rank >= c->pd_peer_alloc_port.n)
        return kvt_config_fail(err, "pd_peer_alloc_port", 0,
                               "pd_peer_alloc_port has no entry for pd_tp_rank %u", c->pd_tp_rank);
    if (c->pd_peer_init_port.n > 0 && c->pd_tp_rank >= c->pd_peer_init_port.n)
        return kvt_config_fail(err, "pd_peer_init_port", 0,
                               "pd_peer_init_port has no entry for pd_tp_rank %u", c->pd_tp_rank);
    if (c->pd_pull_done_port.n > 0 && c->pd_tp_rank >= c->pd_pull_done_port.n)
        return kvt_config_fail(err, "pd_pull_done_port", 0,
                               "pd_pull_done_port has no entry for pd_tp_rank %u", c->pd_tp_rank);
    return KVT_OK;
}

uint64_t kvt_config_cpu_buffer_size(const kvt_config_t *cfg)
{
    return cfg->pd_cpu_buffer_size != 0 ? cfg->pd_cpu_buffer_size : cfg->pd_buffer_size;
}

uint16_t kvt_config_port(const kvt_config_t *cfg, const kvt_port_list_t *list)
{
    return cfg->pd_tp_rank < list->n ? list->v[cfg->pd_tp_rank] : 0;
}

uint16_t kvt_config_pull_done_port(const kvt_config_t *cfg)
{
    uint16_t p = kvt_config_port(cfg, &cfg->pd_pull_done_port);
    uint16_t a;

    if (p != 0)
        return p;
    a = kvt_config_port(cfg, &cfg->pd_peer_alloc_port);
    return a != 0 && a <= 65535 - 100 ? (uint16_t)(a + 100) : 0;
}

static json_t *ports_json(const kvt_port_list_t *l)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a != NULL && i < l->n; i++)
        json_array_append_new(a, json_integer(l->v[i]));
    return a;
}

size_t kvt_config_to_json(const kvt_config_t *c, char *buf, size_t size)
{
    json_t *o = json_object();
    char *s;
    size_t len;

    if (o == NULL)
        return 0;
    json_object_set_new(o, "pd_role", json_string(kvt_role_name(c->pd_role)));
    json_object_set_new(o, "pd_buffer_size", json_integer((json_int_t)c->pd_buffer_size));
    json_object_set_new(o, "pd_buffer_device", json_string(c->pd_buffer_device));
    json_object_set_new(o, "pd_peer_host", json_string(c->pd_peer_host));
    json_object_set_new(o, "pd_peer_init_port", ports_json(&c->pd_peer_init_port));
    json_object_set_new(o, "pd_peer_alloc_port", ports_json(&c->pd_peer_alloc_port));
    json_object_set_new(o, "pd_proxy_host", json_string(c->pd_proxy_host));
    json_object_set_new(o, "pd_proxy_port", json_integer(c->pd_proxy_port));
    json_object_set_new(o, "pd_pull_mode", json_boolean(c->pd_pull_mode));
    json_object_set_new(o, "pd_delay_pull", json_boolean(c->pd_delay_pull));
    json_object_set_new(o, "pd_pull_done_port", ports_json(&c->pd_pull_done_port));
    json_object_set_new(o, "pd_use_cpu_offload", json_boolean(c->pd_use_cpu_offload));
    json_object_set_new(o, "pd_cpu_buffer_size", json_integer((json_int_t)c->pd_cpu_buffer_size));
    json_object_set_new(o, "pd_alloc_fail_backoff_ttl", json_real(c->pd_alloc_fail_backoff_ttl));
    json_object_set_new(o, "pd_pull_pending_ttl", json_real(c->pd_pull_pending_ttl));
    json_object_set_new(o, "pd_pull_backpressure_reserve_pct",
                        json_real(c->pd_pull_backpressure_reserve_pct));
    json_object_set_new(o, "pd_allocation_timeout_sec", json_real(c->pd_allocation_timeout_sec));
    json_object_set_new(o, "pd_shutdown_timeout_sec", json_real(c->pd_shutdown_timeout_sec));
    json_object_set_new(o, "pd_alloc_ttl", json_real(c->pd_alloc_ttl));
    json_object_set_new(o, "pd_alloc_quota", json_real(c->pd_alloc_quota));
    json_object_set_new(o, "pd_node_id", json_string(c->pd_node_id));
    json_object_set_new(o, "pd_tp_rank", json_integer(c->pd_tp_rank));
    json_object_set_new(o, "transfer_channel", json_string(kvt_channel_name(c->transfer_channel)));
    json_object_set_new(o, "transfer_lanes", json_integer(c->transfer_lanes));
    json_object_set_new(o, "transfer_max_conns", json_integer(c->transfer_max_conns));
    json_object_set_new(o, "transfer_max_conns_per_peer",
                        json_integer(c->transfer_max_conns_per_peer));
    json_object_set_new(o, "transfer_max_pending", json_integer(c->transfer_max_pending));
    json_object_set_new(o, "transfer_max_conns_per_addr",
                        json_integer(c->transfer_max_conns_per_addr));
    json_object_set_new(o, "transfer_max_pending_per_addr",
                        json_integer(c->transfer_max_pending_per_addr));
    json_object_set_new(o, "transfer_addr_prefix_v6", json_integer(c->transfer_addr_prefix_v6));
    json_object_set_new(o, "transfer_max_peers_per_addr",
                        json_integer(c->transfer_max_peers_per_addr));
    json_object_set_new(o, "transfer_hello_timeout", json_real(c->transfer_hello_timeout));
    json_object_set_new(o, "transfer_idle_timeout", json_real(c->transfer_idle_timeout));
    json_object_set_new(o, "verbs_device", json_string(c->verbs_device));
    json_object_set_new(o, "verbs_gid_index", json_integer(c->verbs_gid_index));
    json_object_set_new(o, "chunk_size", json_integer(c->chunk_size));
    json_object_set_new(o, "enable_pd", json_boolean(c->enable_pd));
    json_object_set_new(o, "local_cpu", json_boolean(c->local_cpu));
    json_object_set_new(o, "pd_peer_flavour", json_string(c->pd_peer_flavour));
    s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(o);
    if (s == NULL)
        return 0;
    len = strlen(s);
    if (buf != NULL && size > 0)
        snprintf(buf, size, "%s", s);
    free(s);
    return len;
}
