/*
 * Kubernetes discovery: JSON of EndpointSlices, watch events and pod
 * annotations → plain structs. No I/O here; everything is checked because
 * it comes from the network.
 */
#include "sched_discovery_k8s_int.h"
#include "sched_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K8S_SERVICE_NAME_LABEL "kubernetes.io/service-name"

static void set_err(char *err, size_t err_len, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && err_len > 0) {
        snprintf(err, err_len, fmt, a != NULL ? a : "", b != NULL ? b : "");
    }
}

static bool copy_str(char *dst, size_t dst_len, const char *src)
{
    size_t n = strlen(src);
    if (n >= dst_len) {
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

/* Optional boolean condition: absent or null → <dflt>; other non-bool → error. */
static bool cond_bool(const json_t *conds, const char *key, bool dflt, bool *ok)
{
    const json_t *v = conds != NULL ? json_object_get(conds, key) : NULL;
    if (v == NULL || json_is_null(v)) {
        return dflt;
    }
    if (!json_is_boolean(v)) {
        *ok = false;
        return dflt;
    }
    return json_is_true(v);
}

static bool port_valid(json_int_t p)
{
    return p > 0 && p <= 65535;
}

/* Ports of a slice: the one named <port_name> and the KV ones. */
static sched_status_t parse_ports(const json_t *ports, const char *port_name, int *port,
                                  int *kv_port, int *bootstrap_port, char *err, size_t err_len)
{
    size_t i;
    const json_t *p;

    *port = 0;
    *kv_port = 0;
    *bootstrap_port = 0;
    if (ports == NULL || json_is_null(ports)) {
        return SCHED_OK;
    }
    if (!json_is_array(ports)) {
        set_err(err, err_len, "EndpointSlice ports is not an array%s%s", NULL, NULL);
        return SCHED_ERR_INVALID;
    }
    json_array_foreach(ports, i, p)
    {
        const json_t *name = json_object_get(p, "name");
        const json_t *num = json_object_get(p, "port");
        const char *n;
        json_int_t v;

        if (!json_is_object(p)) {
            set_err(err, err_len, "EndpointSlice port is not an object%s%s", NULL, NULL);
            return SCHED_ERR_INVALID;
        }
        if (num == NULL || json_is_null(num)) {
            continue; /* "all ports" slices carry a null port */
        }
        if (!json_is_integer(num) || !port_valid(json_integer_value(num))) {
            set_err(err, err_len, "EndpointSlice port number out of range%s%s", NULL, NULL);
            return SCHED_ERR_INVALID;
        }
        v = json_integer_value(num);
        n = json_is_string(name) ? json_string_value(name) : "";
        if (strcmp(n, port_name) == 0) {
            *port = (int)v;
        } else if (strcmp(n, K8S_PORT_KV) == 0) {
            *kv_port = (int)v;
        } else if (strcmp(n, K8S_PORT_BOOTSTRAP) == 0) {
            *bootstrap_port = (int)v;
        }
    }
    return SCHED_OK;
}

/* A pod name as Kubernetes allows it (DNS-1123 subdomain: lowercase letters, digits, '-' and
 * '.'). It goes into the API URL of the pod lookup and into /admin/instances/<id> paths, so
 * anything else from the API server is not trusted as a name. */
static bool dns1123_name(const char *name)
{
    const char *c;
    if (*name == '\0' || *name == '.' || *name == '-' || strstr(name, "..") != NULL)
        return false;
    for (c = name; *c != '\0'; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '.'))
            return false;
    }
    return true;
}

static sched_status_t parse_endpoint(const json_t *e, const sched_k8s_slice_t *slice, bool ipv6,
                                     int port, int kv_port, int bootstrap_port,
                                     sched_k8s_endpoint_t *ep, bool *skip, char *err,
                                     size_t err_len)
{
    const json_t *addrs = json_object_get(e, "addresses");
    const json_t *addr0;
    const json_t *conds = json_object_get(e, "conditions");
    const json_t *ref = json_object_get(e, "targetRef");
    const json_t *zone = json_object_get(e, "zone");
    const json_t *node = json_object_get(e, "nodeName");
    bool ok = true;

    memset(ep, 0, sizeof(*ep));
    *skip = false;
    if (!json_is_object(e)) {
        set_err(err, err_len, "EndpointSlice %s: endpoint is not an object%s", slice->name, NULL);
        return SCHED_ERR_INVALID;
    }
    if (conds != NULL && !json_is_null(conds) && !json_is_object(conds)) {
        set_err(err, err_len, "EndpointSlice %s: endpoint conditions is not an object%s",
                slice->name, NULL);
        return SCHED_ERR_INVALID;
    }
    if (addrs == NULL || json_is_null(addrs) ||
        (json_is_array(addrs) && json_array_size(addrs) == 0)) {
        *skip = true;
        return SCHED_OK;
    }
    addr0 = json_array_get(addrs, 0);
    if (!json_is_array(addrs) || !json_is_string(addr0) || json_string_length(addr0) == 0 ||
        !copy_str(ep->host, sizeof(ep->host), json_string_value(addr0))) {
        set_err(err, err_len, "EndpointSlice %s: bad endpoint address%s", slice->name, NULL);
        return SCHED_ERR_INVALID;
    }
    /* An address goes into a URL: refuse anything that is not a plain host. */
    if (strpbrk(ep->host, "/?#@ \t\r\n[]") != NULL) {
        set_err(err, err_len, "EndpointSlice %s: invalid endpoint address %s", slice->name,
                ep->host);
        return SCHED_ERR_INVALID;
    }
    ep->ipv6 = ipv6;
    ep->port = port;
    ep->kv_port = kv_port;
    ep->bootstrap_port = bootstrap_port;
    ep->ready = cond_bool(conds, "ready", true, &ok);
    ep->terminating = cond_bool(conds, "terminating", false, &ok);
    if (!ok) {
        set_err(err, err_len, "EndpointSlice %s: endpoint condition is not a boolean%s",
                slice->name, NULL);
        return SCHED_ERR_INVALID;
    }
    if (ep->terminating) {
        ep->ready = false;
    }
    if (json_is_string(zone)) {
        copy_str(ep->zone, sizeof(ep->zone), json_string_value(zone));
    }
    if (json_is_string(node)) {
        copy_str(ep->node, sizeof(ep->node), json_string_value(node));
    }
    if (json_is_object(ref)) {
        const json_t *kind = json_object_get(ref, "kind");
        const json_t *name = json_object_get(ref, "name");
        if (json_is_string(kind) && strcmp(json_string_value(kind), "Pod") == 0 &&
            json_is_string(name) && json_string_length(name) > 0 &&
            json_string_length(name) < SCHED_ID_MAX && dns1123_name(json_string_value(name))) {
            copy_str(ep->pod, sizeof(ep->pod), json_string_value(name));
        }
    }
    if (ep->pod[0] != '\0') {
        copy_str(ep->id, sizeof(ep->id), ep->pod);
    } else {
        /* Ids end up in /admin/instances/<id> paths: keep them path-safe. */
        char *c;
        snprintf(ep->id, sizeof(ep->id), "%.100s-%d", ep->host, port);
        for (c = ep->id; *c != '\0'; c++) {
            if (*c == ':') {
                *c = '.';
            }
        }
    }
    return SCHED_OK;
}

sched_status_t sched_k8s_slice_parse(const json_t *obj, const char *port_name,
                                     sched_k8s_slice_t *out, char *err, size_t err_len)
{
    const json_t *meta = json_object_get(obj, "metadata");
    const json_t *name = json_object_get(meta, "name");
    const json_t *labels = json_object_get(meta, "labels");
    const json_t *svc = json_object_get(labels, K8S_SERVICE_NAME_LABEL);
    const json_t *atype = json_object_get(obj, "addressType");
    const json_t *eps = json_object_get(obj, "endpoints");
    sched_k8s_slice_t s;
    int port, kv_port, bootstrap_port;
    bool ipv6 = false;
    sched_status_t status;
    size_t i;
    const json_t *e;

    memset(&s, 0, sizeof(s));
    if (!json_is_object(obj)) {
        set_err(err, err_len, "EndpointSlice is not an object%s%s", NULL, NULL);
        return SCHED_ERR_INVALID;
    }
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        !copy_str(s.name, sizeof(s.name), json_string_value(name))) {
        set_err(err, err_len, "EndpointSlice without a valid metadata.name%s%s", NULL, NULL);
        return SCHED_ERR_INVALID;
    }
    if (json_is_string(svc)) {
        copy_str(s.service, sizeof(s.service), json_string_value(svc));
    }
    if (atype != NULL && !json_is_null(atype)) {
        const char *t = json_is_string(atype) ? json_string_value(atype) : "";
        if (strcmp(t, "IPv6") == 0) {
            ipv6 = true;
        } else if (strcmp(t, "IPv4") != 0 && strcmp(t, "FQDN") != 0) {
            set_err(err, err_len, "EndpointSlice %s: unknown addressType %s", s.name, t);
            return SCHED_ERR_INVALID;
        }
    }
    status = parse_ports(json_object_get(obj, "ports"), port_name, &port, &kv_port, &bootstrap_port,
                         err, err_len);
    if (status != SCHED_OK) {
        return status;
    }
    if (eps != NULL && !json_is_null(eps) && !json_is_array(eps)) {
        set_err(err, err_len, "EndpointSlice %s: endpoints is not an array%s", s.name, NULL);
        return SCHED_ERR_INVALID;
    }
    if (port == 0) {
        s.port_missing = true;
        *out = s;
        return SCHED_OK;
    }
    if (json_array_size(eps) > 0) {
        s.eps = sched_calloc(json_array_size(eps), sizeof(*s.eps));
        if (s.eps == NULL) {
            set_err(err, err_len, "out of memory%s%s", NULL, NULL);
            return SCHED_ERR_NO_MEMORY;
        }
    }
    json_array_foreach(eps, i, e)
    {
        bool skip;
        status = parse_endpoint(e, &s, ipv6, port, kv_port, bootstrap_port, &s.eps[s.n_eps], &skip,
                                err, err_len);
        if (status != SCHED_OK) {
            goto err_free;
        }
        if (!skip) {
            s.n_eps++;
        }
    }
    *out = s;
    return SCHED_OK;

err_free:
    sched_free(s.eps);
    return status;
}

void sched_k8s_slice_clear(sched_k8s_slice_t *slice)
{
    sched_free(slice->eps);
    memset(slice, 0, sizeof(*slice));
}

/* Strict decimal integer in [lo, hi]. */
static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    while (*end == ' ') {
        end++;
    }
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/* "7300,7301" or "7300 7301" → ports; false on any bad entry. */
static bool parse_port_list(const char *s, int *ports, size_t *n_out)
{
    char buf[SCHED_MAX_TP * 8];
    char *save = NULL;
    char *tok;
    size_t n = 0;

    if (!copy_str(buf, sizeof(buf), s)) {
        return false;
    }
    for (tok = strtok_r(buf, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        long v;
        if (n == SCHED_MAX_TP || !parse_int(tok, 1, 65535, &v)) {
            return false;
        }
        ports[n++] = (int)v;
    }
    if (n == 0) {
        return false;
    }
    *n_out = n;
    return true;
}

/* "a, b,c" → up to SCHED_MAX_MODELS names; false for an empty name, a name too long or
 * too many names. */
static bool parse_models(const char *s, sched_k8s_kv_t *kv)
{
    kv->n_models = 0;
    while (*s) {
        size_t n;
        while (*s == ' ' || *s == '\t')
            s++;
        n = strcspn(s, ",");
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (n == 0 || n > SCHED_MODEL_NAME_MAX || kv->n_models == SCHED_MAX_MODELS) {
            kv->n_models = 0;
            return false;
        }
        memcpy(kv->models[kv->n_models], s, n);
        kv->models[kv->n_models++][n] = '\0';
        s += strcspn(s, ",");
        if (*s == ',')
            s++;
    }
    return kv->n_models > 0;
}

/* "tcp://HOST:PORT" with a port in 1..65535 and no blanks; HOST may be a
 * wildcard (*, 0.0.0.0, ::, [::]) or empty. Port 0 / ipc:// make no sense for a
 * subscriber in another pod. */
static bool kv_events_ok(const char *s)
{
    const char *colon;
    long v;
    if (strncmp(s, "tcp://", 6) != 0 || strpbrk(s + 6, " \t\r\n/?#@") != NULL ||
        strlen(s) >= K8S_KV_EVENTS_MAX) {
        return false;
    }
    colon = strrchr(s + 6, ':');
    return colon != NULL && parse_int(colon + 1, 1, 65535, &v);
}

/* <ann> with a wildcard host replaced by <host> (bracketed when <ipv6>). */
static void kv_events_resolve(const char *ann, const char *host, bool ipv6, char *out,
                              size_t out_len)
{
    const char *h = ann + 6, *colon = strrchr(h, ':');
    size_t hl = (size_t)(colon - h);
    bool wild = hl == 0 || (hl == 1 && h[0] == '*') || (hl == 7 && !strncmp(h, "0.0.0.0", 7)) ||
                (hl == 2 && !strncmp(h, "::", 2)) || (hl == 4 && !strncmp(h, "[::]", 4));
    if (!wild) {
        snprintf(out, out_len, "%s", ann);
    } else if (ipv6) {
        snprintf(out, out_len, "tcp://[%s]%s", host, colon);
    } else {
        snprintf(out, out_len, "tcp://%s%s", host, colon);
    }
}

int sched_k8s_kv_from_annotations(const json_t *annotations, sched_k8s_kv_t *kv, char *err,
                                  size_t err_len)
{
    const char *key;
    const json_t *val;
    int bad = 0;
    bool sgl_bootstrap = false;

    memset(kv, 0, sizeof(*kv));
    if (err != NULL && err_len > 0) {
        err[0] = '\0';
    }
    if (!json_is_object(annotations)) {
        return 0;
    }
    json_object_foreach((json_t *)annotations, key, val)
    {
        const char *s = json_is_string(val) ? json_string_value(val) : NULL;
        long v;
        bool ok = true;

        if (strncmp(key, "pdgw.io/", 8) != 0 && strcmp(key, K8S_ANN_SGL_BOOTSTRAP) != 0) {
            continue;
        }
        if (s == NULL) {
            ok = false;
        } else if (strcmp(key, K8S_ANN_KV_PORT) == 0) {
            ok = parse_int(s, 1, 65535, &v);
            kv->kv_port = ok ? (int)v : 0;
            kv->has_kv_port = ok;
        } else if (strcmp(key, K8S_ANN_BOOTSTRAP_PORT) == 0 ||
                   strcmp(key, K8S_ANN_SGL_BOOTSTRAP) == 0) {
            /* pdgw.io/bootstrap-port wins over SGLang's own annotation. */
            bool ours = strcmp(key, K8S_ANN_BOOTSTRAP_PORT) == 0;
            ok = parse_int(s, 1, 65535, &v);
            if (ok && (ours || !kv->has_bootstrap_port || sgl_bootstrap)) {
                kv->bootstrap_port = (int)v;
                kv->has_bootstrap_port = true;
                sgl_bootstrap = !ours;
            }
        } else if (strcmp(key, K8S_ANN_KV_HOST) == 0) {
            ok = *s != '\0' && strpbrk(s, "/?#@ \t\r\n") == NULL &&
                 copy_str(kv->kv_host, sizeof(kv->kv_host), s);
            kv->has_kv_host = ok;
        } else if (strcmp(key, K8S_ANN_ENGINE_ID) == 0) {
            ok = *s != '\0' && copy_str(kv->engine_id, sizeof(kv->engine_id), s);
            kv->has_engine_id = ok;
        } else if (strcmp(key, K8S_ANN_ALLOC_PORTS) == 0) {
            ok = parse_port_list(s, kv->alloc_ports, &kv->n_alloc_ports);
            if (!ok) {
                kv->n_alloc_ports = 0;
            }
        } else if (strcmp(key, K8S_ANN_INIT_PORTS) == 0) {
            ok = parse_port_list(s, kv->init_ports, &kv->n_init_ports);
            if (!ok) {
                kv->n_init_ports = 0;
            }
        } else if (strcmp(key, K8S_ANN_TP_SIZE) == 0) {
            ok = parse_int(s, 1, SCHED_MAX_TP, &v);
            kv->tp_size = ok ? (int)v : 0;
            kv->has_tp_size = ok;
        } else if (strcmp(key, K8S_ANN_DP_RANK) == 0) {
            ok = parse_int(s, 0, 65535, &v);
            kv->dp_rank = ok ? (int)v : 0;
            kv->has_dp_rank = ok;
        } else if (strcmp(key, K8S_ANN_DP_SIZE) == 0) {
            ok = parse_int(s, 1, 65536, &v);
            kv->dp_size = ok ? (int)v : 0;
            kv->has_dp_size = ok;
        } else if (strcmp(key, K8S_ANN_KV_ENGINE) == 0) {
            /* libkvt: the engine takes pdgw's extensions of LMCache's messages */
            ok = strcmp(s, "libkvt") == 0 || strcmp(s, "lmcache") == 0;
            kv->kv_engine =
                strcmp(s, "libkvt") == 0 ? SCHED_KV_ENGINE_LIBKVT : SCHED_KV_ENGINE_UPSTREAM;
        } else if (strcmp(key, K8S_ANN_MODELS) == 0) {
            ok = parse_models(s, kv);
        } else if (strcmp(key, K8S_ANN_KV_EVENTS) == 0) {
            ok = kv_events_ok(s) && copy_str(kv->kv_events, sizeof(kv->kv_events), s);
            if (!ok) {
                kv->kv_events[0] = '\0';
            }
        } else if (strcmp(key, K8S_ANN_KV_EVENTS_REPLAY) == 0) {
            ok = kv_events_ok(s) && copy_str(kv->kv_events_replay, sizeof(kv->kv_events_replay), s);
            if (!ok) {
                kv->kv_events_replay[0] = '\0';
            }
        } else if (strcmp(key, K8S_ANN_WEIGHT) == 0) {
            ok = parse_int(s, 1, 1000000, &v);
            kv->weight = ok ? (unsigned)v : 0;
            kv->has_weight = ok;
        } else {
            continue; /* other pdgw.io/ annotations are not ours to judge */
        }
        if (!ok) {
            if (bad == 0) {
                set_err(err, err_len, "invalid annotation %s=%s", key, s != NULL ? s : "?");
            }
            bad++;
        }
    }
    if (kv->has_dp_rank && kv->has_dp_size && kv->dp_rank >= kv->dp_size) {
        set_err(err, err_len, "invalid annotation %s: not below %s", K8S_ANN_DP_RANK,
                K8S_ANN_DP_SIZE);
        kv->has_dp_rank = false;
        kv->dp_rank = 0;
        bad++;
    }
    return bad;
}

void sched_k8s_endpoint_desc(const sched_k8s_endpoint_t *ep, const sched_k8s_kv_t *kv,
                             sched_role_t role, const char *service, char *url_buf, size_t url_len,
                             sched_instance_desc_t *desc)
{
    sched_instance_desc_init(desc);
    if (ep->ipv6) {
        snprintf(url_buf, url_len, "http://[%s]:%d", ep->host, ep->port);
    } else {
        snprintf(url_buf, url_len, "http://%s:%d", ep->host, ep->port);
    }
    desc->id = ep->id;
    desc->url = url_buf;
    desc->role = role;
    desc->source = SCHED_SOURCE_K8S;
    desc->kv_port = ep->kv_port;
    desc->bootstrap_port = ep->bootstrap_port;
    if (ep->zone[0] != '\0') {
        desc->zone = ep->zone;
    }
    if (ep->node[0] != '\0') {
        desc->labels[desc->n_labels].key = "node";
        desc->labels[desc->n_labels++].value = ep->node;
    }
    if (service != NULL && service[0] != '\0') {
        desc->labels[desc->n_labels].key = "service";
        desc->labels[desc->n_labels++].value = service;
    }
    if (kv == NULL) {
        return;
    }
    /* Annotations win over named ports: they are the engine's own word. */
    if (kv->has_kv_port) {
        desc->kv_port = kv->kv_port;
    }
    if (kv->has_bootstrap_port) {
        desc->bootstrap_port = kv->bootstrap_port;
    }
    if (kv->has_kv_host) {
        desc->kv_host = kv->kv_host;
    }
    if (kv->has_engine_id) {
        desc->engine_id = kv->engine_id;
    }
    desc->kv_engine = kv->kv_engine;
    memcpy(desc->alloc_ports, kv->alloc_ports, kv->n_alloc_ports * sizeof(int));
    desc->n_alloc_ports = kv->n_alloc_ports;
    memcpy(desc->init_ports, kv->init_ports, kv->n_init_ports * sizeof(int));
    desc->n_init_ports = kv->n_init_ports;
    if (kv->has_tp_size) {
        desc->tp_size = kv->tp_size;
    }
    if (kv->has_dp_rank) {
        desc->dp_rank = kv->dp_rank;
    }
    if (kv->has_dp_size) {
        desc->dp_size = kv->dp_size;
    }
    if (kv->has_weight) {
        desc->weight = kv->weight;
    }
    for (size_t i = 0; i < kv->n_models; i++)
        desc->models[i] = kv->models[i];
    desc->n_models = kv->n_models;
    /* The resolved endpoints live in this thread's buffers until the next call;
     * sched_pool_upsert copies the descriptor's strings. */
    if (kv->kv_events[0] != '\0') {
        static _Thread_local char ev[K8S_KV_EVENTS_MAX + K8S_HOST_MAX];
        kv_events_resolve(kv->kv_events, ep->host, ep->ipv6, ev, sizeof(ev));
        desc->kv_events_endpoint = ev;
    }
    if (kv->kv_events_replay[0] != '\0') {
        static _Thread_local char rp[K8S_KV_EVENTS_MAX + K8S_HOST_MAX];
        kv_events_resolve(kv->kv_events_replay, ep->host, ep->ipv6, rp, sizeof(rp));
        desc->kv_events_replay_endpoint = rp;
    }
}

sched_status_t sched_k8s_event_parse(const json_t *event, sched_k8s_event_type_t *type_out,
                                     const json_t **object_out, char *err, size_t err_len)
{
    static const struct {
        const char *name;
        sched_k8s_event_type_t type;
    } types[] = {
        {"ADDED", K8S_EVENT_ADDED},     {"MODIFIED", K8S_EVENT_MODIFIED},
        {"DELETED", K8S_EVENT_DELETED}, {"BOOKMARK", K8S_EVENT_BOOKMARK},
        {"ERROR", K8S_EVENT_ERROR},
    };
    const json_t *type = json_object_get(event, "type");
    const json_t *obj = json_object_get(event, "object");
    size_t i;

    if (!json_is_object(event) || !json_is_string(type) || !json_is_object(obj)) {
        set_err(err, err_len, "watch event without type/object%s%s", NULL, NULL);
        return SCHED_ERR_INVALID;
    }
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (strcmp(json_string_value(type), types[i].name) == 0) {
            *type_out = types[i].type;
            *object_out = obj;
            return SCHED_OK;
        }
    }
    set_err(err, err_len, "unknown watch event type %s%s", json_string_value(type), NULL);
    return SCHED_ERR_INVALID;
}

const char *sched_k8s_resource_version(const json_t *obj)
{
    const json_t *rv = json_object_get(json_object_get(obj, "metadata"), "resourceVersion");
    return json_is_string(rv) && json_string_length(rv) > 0 ? json_string_value(rv) : NULL;
}

int sched_k8s_status_code(const json_t *obj)
{
    const json_t *code = json_object_get(obj, "code");
    return json_is_integer(code) ? (int)json_integer_value(code) : 0;
}
