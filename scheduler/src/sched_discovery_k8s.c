/*
 * Kubernetes discovery back-end: list + watch discovery.k8s.io/v1
 * EndpointSlices selected by one label selector per role, with the pod's
 * service-account credentials, and keep the pool's K8S instances equal to
 * the ready endpoints.
 *
 * One thread drives every HTTP transfer through a libcurl multi handle
 * (non-blocking; woken with curl_multi_wakeup() for shutdown):
 *   per role  LIST → WATCH (from the list's resourceVersion) → WATCH ...
 *             410 Gone (status or ERROR event) → LIST at once;
 *             dropped watch / failed list → LIST after exponential backoff;
 *             a watch the server ended cleanly → WATCH again from the last
 *             resourceVersion.
 *   per pod   one GET for the pdgw.io/... and sglang.ai/bootstrap-port
 *             annotations, before the pod's endpoint joins the pool.
 * After every change the desired set is reconciled: ready endpoints are
 * upserted, not-ready/terminating ones drained, vanished ones retired.
 * Malformed input keeps the last good state: a bad slice keeps its previous
 * version, a corrupt watch stream or list is thrown away and re-listed.
 */
#include "sched_discovery_k8s_int.h"
#include "sched_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "pdb/pdb_clock.h"
#include "pdb/pdb_map.h"

#define K8S_LIST_MAX_BYTES  (64u << 20) /* whole list body */
#define K8S_EVENT_MAX_BYTES (16u << 20) /* one watch line */
#define K8S_POD_MAX_BYTES   (4u << 20)
#define K8S_BACKOFF_MIN_MS  250
#define K8S_BACKOFF_MAX_MS  30000
#define K8S_WATCH_TIMEOUT_S 300 /* server-side timeoutSeconds of a watch */
#define K8S_MAX_POD_FETCHES 8   /* concurrent pod GETs */
#define K8S_NS_FILE_NAME    "namespace"
#define K8S_DEFAULT_TOKEN   "/var/run/secrets/kubernetes.io/serviceaccount/token"
#define K8S_DEFAULT_CA      "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
#define K8S_N_ROLES         3

/* Counters exposed through k8s_metrics_text(). */
enum k8s_err_reason {
    K8S_ERR_LIST,       /* list request failed (transport or HTTP status) */
    K8S_ERR_WATCH,      /* watch dropped or refused */
    K8S_ERR_BAD_JSON,   /* a body or watch line that is not JSON */
    K8S_ERR_BAD_OBJECT, /* JSON that is not a valid slice / event */
    K8S_ERR_ANNOTATION, /* invalid pdgw.io/... annotation */
    K8S_ERR_POD,        /* pod GET failed */
    K8S_ERR_UPSERT,     /* the pool refused an instance */
    K8S_ERR_COUNT
};
static const char *const k8s_err_names[K8S_ERR_COUNT] = {
    "list", "watch", "bad_json", "bad_object", "annotation", "pod", "upsert",
};
enum k8s_relist_cause {
    K8S_RELIST_INITIAL,
    K8S_RELIST_GONE,
    K8S_RELIST_DROPPED,
    K8S_RELIST_ERROR,
    K8S_RELIST_COUNT
};
static const char *const k8s_relist_names[K8S_RELIST_COUNT] = {"initial", "gone", "dropped",
                                                               "error"};

typedef enum k8s_xfer_kind {
    K8S_XFER_LIST,
    K8S_XFER_WATCH,
    K8S_XFER_POD,
} k8s_xfer_kind_t;

struct k8s_watcher;
struct k8s_pod;

/* One HTTP transfer and its response body. */
typedef struct k8s_xfer {
    k8s_xfer_kind_t kind;
    CURL *easy;
    struct curl_slist *headers;
    char *buf;
    size_t len, cap, max;
    struct k8s_state *st;
    struct k8s_watcher *w; /* LIST / WATCH */
    struct k8s_pod *pod;   /* POD */
    bool overflow;
    bool gone;       /* a watch saw ERROR 410 */
    bool corrupt;    /* a watch line that is not JSON / not an event */
    unsigned events; /* watch events handled */
} k8s_xfer_t;

typedef enum k8s_wstate {
    K8S_W_IDLE,
    K8S_W_LISTING,
    K8S_W_WATCHING,
} k8s_wstate_t;

typedef struct k8s_watcher {
    sched_role_t role;
    const char *role_name;
    char *selector; /* URL-escaped label selector */
    sched_k8s_slice_t *slices;
    size_t n_slices, cap_slices;
    char rv[128];
    k8s_wstate_t wstate;
    bool need_list;
    int list_cause;
    uint64_t next_ms; /* idle: when to start the next request */
    uint64_t backoff_ms;
    uint64_t watch_start_ms;
    k8s_xfer_t *xfer;
} k8s_watcher_t;

typedef enum k8s_pod_state {
    K8S_POD_WANTED, /* fetch when a slot is free */
    K8S_POD_FETCHING,
    K8S_POD_RETRY, /* transient failure; fetch again at retry_ms */
    K8S_POD_DONE,  /* annotations known (or definitively none) */
} k8s_pod_state_t;

typedef struct k8s_pod {
    char name[K8S_NAME_MAX];
    k8s_pod_state_t pstate;
    bool have_kv;
    sched_k8s_kv_t kv;
    uint64_t retry_ms, backoff_ms;
    bool referenced;
    k8s_xfer_t *xfer;
} k8s_pod_t;

typedef struct k8s_reported {
    char id[SCHED_ID_MAX];
    bool drained;
} k8s_reported_t;

typedef struct k8s_state {
    sched_pool_t *pool;
    char *api_server; /* no trailing slash */
    char *ns;
    char *port_name;
    char *token_file;
    char *ca_file;
    k8s_watcher_t w[K8S_N_ROLES];
    size_t n_w;
    k8s_pod_t **pods;
    size_t n_pods, cap_pods;
    pdb_map_t pod_by_name; /* name → pods[] entry */
    size_t pod_fetches;
    k8s_reported_t **reported; /* what this back-end upserted (owned) */
    size_t n_reported, cap_reported;
    pdb_map_t reported_by_id; /* id → reported[] entry */
    bool dirty;
    bool token_warned;
    CURLM *multi;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    unsigned rand_state;
    atomic_uint_fast64_t errors[K8S_ERR_COUNT];
    atomic_uint_fast64_t relists[K8S_N_ROLES][K8S_RELIST_COUNT];
    atomic_uint_fast64_t ep_ready[K8S_N_ROLES];
    atomic_uint_fast64_t ep_not_ready[K8S_N_ROLES];
} k8s_state_t;

/* Every message names the back-end; the pool's logger decides where it goes. */
#define K8S_LOG(st, level, ...) sched_pool_logf((st)->pool, (level), "kubernetes: " __VA_ARGS__)

static uint64_t k8s_now_ms(void)
{
    return pdb_clock_mono_ms();
}

static void count_err(k8s_state_t *st, enum k8s_err_reason r)
{
    atomic_fetch_add(&st->errors[r], 1);
}

static char *dup_or(const char *s, const char *dflt)
{
    return sched_strdup(s != NULL && s[0] != '\0' ? s : dflt);
}

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */

static bool k8s_configured(const sched_config_t *cfg)
{
    const sched_k8s_config_t *k = &cfg->kubernetes;
    return (k->prefill_selector != NULL && k->prefill_selector[0] != '\0') ||
           (k->decode_selector != NULL && k->decode_selector[0] != '\0') ||
           (k->both_selector != NULL && k->both_selector[0] != '\0');
}

/* Namespace file beside the token file (the service-account directory). */
static char *read_namespace(const char *token_file)
{
    char path[4096];
    char buf[256];
    const char *slash = strrchr(token_file, '/');
    size_t dir_len = slash != NULL ? (size_t)(slash - token_file) : 0;
    FILE *f;
    size_t n;

    if (dir_len + sizeof(K8S_NS_FILE_NAME) + 1 > sizeof(path)) {
        return NULL;
    }
    snprintf(path, sizeof(path), "%.*s/%s", (int)dir_len, token_file, K8S_NS_FILE_NAME);
    f = fopen(path, "r");
    if (f == NULL) {
        return NULL;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r')) {
        n--;
    }
    buf[n] = '\0';
    return n > 0 ? sched_strdup(buf) : NULL;
}

static char *default_api_server(void)
{
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    char buf[512];

    if (host == NULL || host[0] == '\0') {
        return NULL;
    }
    if (port == NULL || port[0] == '\0') {
        port = "443";
    }
    if (strchr(host, ':') != NULL) {
        snprintf(buf, sizeof(buf), "https://[%s]:%s", host, port);
    } else {
        snprintf(buf, sizeof(buf), "https://%s:%s", host, port);
    }
    return sched_strdup(buf);
}

static void k8s_destroy(void *state);

static sched_status_t k8s_create(const sched_config_t *cfg, sched_pool_t *pool, void **state_out)
{
    const sched_k8s_config_t *k = &cfg->kubernetes;
    const char *selectors[K8S_N_ROLES] = {k->prefill_selector, k->decode_selector,
                                          k->both_selector};
    static const sched_role_t roles[K8S_N_ROLES] = {SCHED_ROLE_PREFILL, SCHED_ROLE_DECODE,
                                                    SCHED_ROLE_BOTH};
    static const char *const role_names[K8S_N_ROLES] = {"prefill", "decode", "both"};
    k8s_state_t *st;
    sched_status_t status = SCHED_ERR_NO_MEMORY;
    size_t i, len;
    CURL *esc;

    st = sched_calloc(1, sizeof(*st));
    if (st == NULL) {
        return SCHED_ERR_NO_MEMORY;
    }
    st->pool = pool;
    st->rand_state = (unsigned)k8s_now_ms();
    atomic_init(&st->stop, false);
    st->port_name = dup_or(k->port_name, "http");
    st->token_file = dup_or(k->token_file, K8S_DEFAULT_TOKEN);
    st->ca_file = dup_or(k->ca_file, K8S_DEFAULT_CA);
    if (st->port_name == NULL || st->token_file == NULL || st->ca_file == NULL) {
        goto err_free;
    }
    if (k->api_server != NULL && k->api_server[0] != '\0') {
        st->api_server = sched_strdup(k->api_server);
    } else {
        st->api_server = default_api_server();
        if (st->api_server == NULL) {
            K8S_LOG(st, SCHED_LOG_WARN,
                    "discovery.kubernetes.api_server is empty and KUBERNETES_SERVICE_HOST "
                    "is not set (not running in a pod?)");
            status = SCHED_ERR_INVALID;
            goto err_free;
        }
    }
    if (st->api_server == NULL) {
        goto err_free;
    }
    len = strlen(st->api_server);
    while (len > 0 && st->api_server[len - 1] == '/') {
        st->api_server[--len] = '\0';
    }
    if (strncmp(st->api_server, "http://", 7) != 0 && strncmp(st->api_server, "https://", 8) != 0) {
        K8S_LOG(st, SCHED_LOG_WARN, "discovery.kubernetes.api_server: not an http(s) URL: %s",
                st->api_server);
        status = SCHED_ERR_INVALID;
        goto err_free;
    }
    if (k->namespace_ != NULL && k->namespace_[0] != '\0') {
        st->ns = sched_strdup(k->namespace_);
    } else {
        st->ns = read_namespace(st->token_file);
        if (st->ns == NULL) {
            K8S_LOG(st, SCHED_LOG_WARN,
                    "discovery.kubernetes.namespace is empty and the service-account "
                    "namespace file beside %s is not readable",
                    st->token_file);
            status = SCHED_ERR_INVALID;
            goto err_free;
        }
    }
    if (st->ns == NULL) {
        goto err_free;
    }
    if (strpbrk(st->ns, "/?#&% ") != NULL) {
        K8S_LOG(st, SCHED_LOG_WARN, "discovery.kubernetes.namespace: invalid name %s", st->ns);
        status = SCHED_ERR_INVALID;
        goto err_free;
    }

    esc = curl_easy_init();
    if (esc == NULL) {
        goto err_free;
    }
    for (i = 0; i < K8S_N_ROLES; i++) {
        k8s_watcher_t *w;
        char *e;
        if (selectors[i] == NULL || selectors[i][0] == '\0') {
            continue;
        }
        w = &st->w[st->n_w++];
        w->role = roles[i];
        w->role_name = role_names[i];
        w->need_list = true;
        w->list_cause = K8S_RELIST_INITIAL;
        w->backoff_ms = K8S_BACKOFF_MIN_MS;
        e = curl_easy_escape(esc, selectors[i], 0);
        if (e == NULL) {
            curl_easy_cleanup(esc);
            goto err_free;
        }
        w->selector = sched_strdup(e);
        curl_free(e);
        if (w->selector == NULL) {
            curl_easy_cleanup(esc);
            goto err_free;
        }
    }
    curl_easy_cleanup(esc);
    if (st->n_w == 0) {
        status = SCHED_ERR_INVALID;
        goto err_free;
    }
    st->multi = curl_multi_init();
    if (st->multi == NULL) {
        goto err_free;
    }
    if (pdb_map_init(&st->pod_by_name, 0) != PDB_OK ||
        pdb_map_init(&st->reported_by_id, 0) != PDB_OK) {
        goto err_free;
    }
    *state_out = st;
    return SCHED_OK;

err_free:
    k8s_destroy(st);
    return status;
}

/* ------------------------------------------------------------------ */
/* Transfers                                                           */
/* ------------------------------------------------------------------ */

static void xfer_free(k8s_state_t *st, k8s_xfer_t *x)
{
    if (x == NULL) {
        return;
    }
    if (x->easy != NULL) {
        curl_multi_remove_handle(st->multi, x->easy);
        curl_easy_cleanup(x->easy);
    }
    curl_slist_free_all(x->headers);
    sched_free(x->buf);
    sched_free(x);
}

static bool buf_append(k8s_xfer_t *x, const char *data, size_t n)
{
    if (x->len + n + 1 > x->max) {
        x->overflow = true;
        return false;
    }
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap != 0 ? x->cap : 4096;
        char *nb;
        while (cap < x->len + n + 1) {
            cap *= 2;
        }
        nb = sched_realloc(x->buf, cap);
        if (nb == NULL) {
            return false;
        }
        x->buf = nb;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, data, n);
    x->len += n;
    x->buf[x->len] = '\0';
    return true;
}

static long xfer_http_status(const k8s_xfer_t *x)
{
    long code = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

static void watch_handle_line(k8s_xfer_t *x, const char *line, size_t n);

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    k8s_xfer_t *x = arg;
    size_t n = size * nmemb;

    if (atomic_load(&x->st->stop)) {
        return 0;
    }
    if (x->kind == K8S_XFER_WATCH && xfer_http_status(x) == 200) {
        /* Event stream: one JSON object per line; handle complete lines now. */
        size_t start = 0, i;
        if (!buf_append(x, data, n)) {
            return 0;
        }
        for (i = 0; i < x->len; i++) {
            if (x->buf[i] == '\n') {
                watch_handle_line(x, x->buf + start, i - start);
                start = i + 1;
                if (x->gone || x->corrupt) {
                    return 0; /* stop this watch; the caller re-lists */
                }
            }
        }
        memmove(x->buf, x->buf + start, x->len - start);
        x->len -= start;
        return n;
    }
    return buf_append(x, data, n) ? n : 0;
}

/* Bearer token, re-read for every request: projected tokens rotate. */
static bool add_auth_header(k8s_state_t *st, k8s_xfer_t *x)
{
    char tok[8192];
    char hdr[8300];
    FILE *f = fopen(st->token_file, "r");
    size_t n;
    struct curl_slist *h;

    if (f == NULL) {
        if (!st->token_warned) {
            K8S_LOG(st, SCHED_LOG_WARN,
                    "token file %s not readable (%s); requests go without credentials",
                    st->token_file, strerror(errno));
            st->token_warned = true;
        }
        return true;
    }
    n = fread(tok, 1, sizeof(tok) - 1, f);
    fclose(f);
    while (n > 0 && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) {
        n--;
    }
    tok[n] = '\0';
    if (n == 0 || strpbrk(tok, "\r\n") != NULL) {
        return true;
    }
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", tok);
    h = curl_slist_append(x->headers, hdr);
    if (h == NULL) {
        return false;
    }
    x->headers = h;
    return true;
}

static k8s_xfer_t *xfer_start(k8s_state_t *st, k8s_xfer_kind_t kind, const char *url,
                              long timeout_ms, size_t max_bytes)
{
    k8s_xfer_t *x = sched_calloc(1, sizeof(*x));
    struct curl_slist *h;

    if (x == NULL) {
        return NULL;
    }
    x->kind = kind;
    x->st = st;
    x->max = max_bytes;
    x->easy = curl_easy_init();
    if (x->easy == NULL) {
        goto err_free;
    }
    h = curl_slist_append(NULL, "Accept: application/json");
    if (h == NULL) {
        goto err_free;
    }
    x->headers = h;
    if (!add_auth_header(st, x)) {
        goto err_free;
    }
    curl_easy_setopt(x->easy, CURLOPT_URL, url);
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, x);
    curl_easy_setopt(x->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->easy, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(x->easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(x->easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(x->easy, CURLOPT_USERAGENT, "pdgw-discovery/1");
    if (strncmp(url, "https://", 8) == 0 && access(st->ca_file, R_OK) == 0) {
        curl_easy_setopt(x->easy, CURLOPT_CAINFO, st->ca_file);
    }
    if (curl_multi_add_handle(st->multi, x->easy) != CURLM_OK) {
        goto err_free;
    }
    return x;

err_free:
    if (x->easy != NULL) {
        curl_easy_cleanup(x->easy);
        x->easy = NULL;
    }
    xfer_free(st, x);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Slices of one role                                                  */
/* ------------------------------------------------------------------ */

static sched_k8s_slice_t *slice_find(k8s_watcher_t *w, const char *name)
{
    size_t i;
    for (i = 0; i < w->n_slices; i++) {
        if (strcmp(w->slices[i].name, name) == 0) {
            return &w->slices[i];
        }
    }
    return NULL;
}

/* Insert or replace (takes ownership of *s). */
static bool slice_put(k8s_watcher_t *w, sched_k8s_slice_t *s)
{
    sched_k8s_slice_t *old = slice_find(w, s->name);
    if (old != NULL) {
        sched_k8s_slice_clear(old);
        *old = *s;
        return true;
    }
    if (w->n_slices == w->cap_slices) {
        size_t cap = w->cap_slices != 0 ? w->cap_slices * 2 : 8;
        sched_k8s_slice_t *ns = sched_realloc(w->slices, cap * sizeof(*ns));
        if (ns == NULL) {
            return false;
        }
        w->slices = ns;
        w->cap_slices = cap;
    }
    w->slices[w->n_slices++] = *s;
    return true;
}

static void slice_del(k8s_watcher_t *w, const char *name)
{
    sched_k8s_slice_t *s = slice_find(w, name);
    if (s != NULL) {
        sched_k8s_slice_clear(s);
        *s = w->slices[--w->n_slices];
    }
}

static void slices_clear(k8s_watcher_t *w)
{
    size_t i;
    for (i = 0; i < w->n_slices; i++) {
        sched_k8s_slice_clear(&w->slices[i]);
    }
    w->n_slices = 0;
}

static void set_rv(k8s_watcher_t *w, const json_t *obj)
{
    const char *rv = sched_k8s_resource_version(obj);
    if (rv != NULL && strlen(rv) < sizeof(w->rv) &&
        strspn(rv, "0123456789abcdefABCDEF-") == strlen(rv)) {
        strcpy(w->rv, rv);
    }
}

/* Parse and store one slice object; a bad one keeps the previous version. */
static void slice_apply(k8s_state_t *st, k8s_watcher_t *w, const json_t *obj)
{
    sched_k8s_slice_t s;
    char err[256];
    sched_status_t status = sched_k8s_slice_parse(obj, st->port_name, &s, err, sizeof(err));

    if (status != SCHED_OK) {
        count_err(st, K8S_ERR_BAD_OBJECT);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: ignoring EndpointSlice: %s", w->role_name, err);
        return;
    }
    if (s.port_missing) {
        K8S_LOG(st, SCHED_LOG_WARN,
                "%s: EndpointSlice %s has no port named \"%s\"; its endpoints are skipped",
                w->role_name, s.name, st->port_name);
    }
    if (!slice_put(w, &s)) {
        sched_k8s_slice_clear(&s);
        count_err(st, K8S_ERR_BAD_OBJECT);
        return;
    }
    st->dirty = true;
}

static void watch_handle_line(k8s_xfer_t *x, const char *line, size_t n)
{
    k8s_state_t *st = x->st;
    k8s_watcher_t *w = x->w;
    json_error_t jerr;
    json_t *ev;
    sched_k8s_event_type_t type;
    const json_t *obj;
    char err[256];

    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ')) {
        n--;
    }
    if (n == 0) {
        return;
    }
    ev = json_loadb(line, n, 0, &jerr);
    if (ev == NULL) {
        count_err(st, K8S_ERR_BAD_JSON);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: watch stream is not JSON (%s); re-listing", w->role_name,
                jerr.text);
        x->corrupt = true;
        return;
    }
    if (sched_k8s_event_parse(ev, &type, &obj, err, sizeof(err)) != SCHED_OK) {
        count_err(st, K8S_ERR_BAD_OBJECT);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: %s; re-listing", w->role_name, err);
        x->corrupt = true;
        json_decref(ev);
        return;
    }
    x->events++;
    switch (type) {
    case K8S_EVENT_ADDED:
    case K8S_EVENT_MODIFIED:
        slice_apply(st, w, obj);
        set_rv(w, obj);
        break;
    case K8S_EVENT_DELETED: {
        const json_t *name = json_object_get(json_object_get(obj, "metadata"), "name");
        if (json_is_string(name)) {
            slice_del(w, json_string_value(name));
            st->dirty = true;
        } else {
            count_err(st, K8S_ERR_BAD_OBJECT);
        }
        set_rv(w, obj);
        break;
    }
    case K8S_EVENT_BOOKMARK:
        set_rv(w, obj);
        break;
    case K8S_EVENT_ERROR:
        if (sched_k8s_status_code(obj) == 410) {
            x->gone = true;
        } else {
            const json_t *msg = json_object_get(obj, "message");
            count_err(st, K8S_ERR_WATCH);
            K8S_LOG(st, SCHED_LOG_WARN, "%s: watch error %d: %s; re-listing", w->role_name,
                    sched_k8s_status_code(obj), json_is_string(msg) ? json_string_value(msg) : "");
            x->corrupt = true;
        }
        break;
    }
    json_decref(ev);
}

static void watcher_backoff(k8s_state_t *st, k8s_watcher_t *w, uint64_t now)
{
    uint64_t jitter =
        w->backoff_ms / 10 > 0 ? (uint64_t)rand_r(&st->rand_state) % (w->backoff_ms / 10) : 0;
    w->next_ms = now + w->backoff_ms + jitter;
    w->backoff_ms = w->backoff_ms * 2 > K8S_BACKOFF_MAX_MS ? K8S_BACKOFF_MAX_MS : w->backoff_ms * 2;
}

static void watcher_start(k8s_state_t *st, k8s_watcher_t *w, uint64_t now)
{
    char url[4096];

    if (w->need_list) {
        snprintf(url, sizeof(url),
                 "%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector=%s",
                 st->api_server, st->ns, w->selector);
        w->xfer = xfer_start(st, K8S_XFER_LIST, url, 30000, K8S_LIST_MAX_BYTES);
        w->wstate = K8S_W_LISTING;
        atomic_fetch_add(&st->relists[w - st->w][w->list_cause], 1);
    } else {
        snprintf(url, sizeof(url),
                 "%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector=%s"
                 "&watch=1&allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=%d",
                 st->api_server, st->ns, w->selector, w->rv, K8S_WATCH_TIMEOUT_S);
        w->xfer = xfer_start(st, K8S_XFER_WATCH, url, (K8S_WATCH_TIMEOUT_S + 30) * 1000L,
                             K8S_EVENT_MAX_BYTES);
        w->wstate = K8S_W_WATCHING;
        w->watch_start_ms = now;
    }
    if (w->xfer == NULL) {
        K8S_LOG(st, SCHED_LOG_WARN, "%s: cannot start a request (out of memory)", w->role_name);
        w->wstate = K8S_W_IDLE;
        watcher_backoff(st, w, now);
        return;
    }
    w->xfer->w = w;
}

static void list_done(k8s_state_t *st, k8s_watcher_t *w, k8s_xfer_t *x, CURLcode rc, uint64_t now)
{
    long code = xfer_http_status(x);
    json_error_t jerr;
    json_t *doc = NULL;
    const json_t *items;
    k8s_watcher_t fresh;
    size_t i;
    const json_t *it;

    if (rc != CURLE_OK || code != 200) {
        count_err(st, K8S_ERR_LIST);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: listing EndpointSlices failed: %s (HTTP %ld)",
                w->role_name, rc != CURLE_OK ? curl_easy_strerror(rc) : "status", code);
        goto err_retry;
    }
    doc = json_loadb(x->buf != NULL ? x->buf : "", x->len, 0, &jerr);
    if (doc == NULL) {
        count_err(st, K8S_ERR_BAD_JSON);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: EndpointSlice list is not JSON: %s", w->role_name,
                jerr.text);
        goto err_retry;
    }
    items = json_object_get(doc, "items");
    if (!json_is_array(items) && !json_is_null(items)) {
        count_err(st, K8S_ERR_BAD_OBJECT);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: EndpointSlice list without items", w->role_name);
        goto err_retry;
    }
    /* Build the new set aside; a bad item keeps its previous version. */
    memset(&fresh, 0, sizeof(fresh));
    json_array_foreach(items, i, it)
    {
        sched_k8s_slice_t s;
        char err[256];
        if (sched_k8s_slice_parse(it, st->port_name, &s, err, sizeof(err)) != SCHED_OK) {
            const json_t *nm = json_object_get(json_object_get(it, "metadata"), "name");
            sched_k8s_slice_t *prev =
                json_is_string(nm) ? slice_find(w, json_string_value(nm)) : NULL;
            count_err(st, K8S_ERR_BAD_OBJECT);
            K8S_LOG(st, SCHED_LOG_WARN, "%s: ignoring EndpointSlice in list: %s", w->role_name,
                    err);
            if (prev == NULL) {
                continue;
            }
            s = *prev; /* move the previous version over */
            memset(prev, 0, sizeof(*prev));
        } else if (s.port_missing) {
            K8S_LOG(st, SCHED_LOG_WARN,
                    "%s: EndpointSlice %s has no port named \"%s\"; its endpoints are skipped",
                    w->role_name, s.name, st->port_name);
        }
        if (!slice_put(&fresh, &s)) {
            sched_k8s_slice_clear(&s);
            slices_clear(&fresh);
            sched_free(fresh.slices);
            count_err(st, K8S_ERR_LIST);
            goto err_retry;
        }
    }
    slices_clear(w);
    sched_free(w->slices);
    w->slices = fresh.slices;
    w->n_slices = fresh.n_slices;
    w->cap_slices = fresh.cap_slices;
    w->rv[0] = '\0';
    set_rv(w, doc);
    json_decref(doc);
    st->dirty = true;
    w->backoff_ms = K8S_BACKOFF_MIN_MS;
    w->need_list = w->rv[0] == '\0'; /* no resourceVersion: cannot watch, poll instead */
    w->wstate = K8S_W_IDLE;
    w->next_ms = w->need_list ? now + 5000 : now;
    w->list_cause = K8S_RELIST_ERROR;
    return;

err_retry:
    json_decref(doc);
    w->need_list = true;
    w->list_cause = K8S_RELIST_ERROR;
    w->wstate = K8S_W_IDLE;
    watcher_backoff(st, w, now);
}

static void watch_done(k8s_state_t *st, k8s_watcher_t *w, k8s_xfer_t *x, CURLcode rc, uint64_t now)
{
    long code = xfer_http_status(x);

    w->wstate = K8S_W_IDLE;
    if (x->gone || code == 410) {
        /* resourceVersion too old: list again at once, unless the watch
         * that followed a fresh list was refused straight away too. */
        w->need_list = true;
        w->list_cause = K8S_RELIST_GONE;
        if (x->events <= 1 && now - w->watch_start_ms < 1000) {
            watcher_backoff(st, w, now);
        } else {
            w->next_ms = now;
        }
        return;
    }
    if (x->corrupt || x->overflow) {
        if (x->overflow) {
            count_err(st, K8S_ERR_BAD_OBJECT);
            K8S_LOG(st, SCHED_LOG_WARN, "%s: watch event larger than %u bytes; re-listing",
                    w->role_name, K8S_EVENT_MAX_BYTES);
        }
        w->need_list = true;
        w->list_cause = K8S_RELIST_ERROR;
        watcher_backoff(st, w, now);
        return;
    }
    if (rc == CURLE_OK && code == 200) {
        /* The server ended the watch (timeoutSeconds): watch again from the
         * last resourceVersion; only a suspiciously quick empty end backs off. */
        w->need_list = false;
        if (x->events == 0 && now - w->watch_start_ms < 1000) {
            watcher_backoff(st, w, now);
        } else {
            w->backoff_ms = K8S_BACKOFF_MIN_MS;
            w->next_ms = now;
        }
        return;
    }
    count_err(st, K8S_ERR_WATCH);
    K8S_LOG(st, SCHED_LOG_WARN, "%s: watch dropped: %s (HTTP %ld); re-listing", w->role_name,
            rc != CURLE_OK ? curl_easy_strerror(rc) : "status", code);
    w->need_list = true;
    w->list_cause = K8S_RELIST_DROPPED;
    watcher_backoff(st, w, now);
}

/* ------------------------------------------------------------------ */
/* Pods (annotations)                                                  */
/* ------------------------------------------------------------------ */

static k8s_pod_t *pod_get(k8s_state_t *st, const char *name, bool create)
{
    k8s_pod_t *p = pdb_map_get(&st->pod_by_name, name);

    if (p != NULL || !create) {
        return p;
    }
    if (st->n_pods == st->cap_pods) {
        size_t cap = st->cap_pods != 0 ? st->cap_pods * 2 : 16;
        k8s_pod_t **np = sched_realloc(st->pods, cap * sizeof(*np));
        if (np == NULL) {
            return NULL;
        }
        st->pods = np;
        st->cap_pods = cap;
    }
    p = sched_calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->pstate = K8S_POD_WANTED;
    p->backoff_ms = K8S_BACKOFF_MIN_MS;
    if (pdb_map_put(&st->pod_by_name, p->name, p) != PDB_OK) {
        sched_free(p);
        return NULL;
    }
    st->pods[st->n_pods++] = p;
    return p;
}

static void pod_free(k8s_state_t *st, k8s_pod_t *p)
{
    pdb_map_remove(&st->pod_by_name, p->name);
    if (p->xfer != NULL) {
        xfer_free(st, p->xfer);
        st->pod_fetches--;
    }
    sched_free(p);
}

static void pod_start(k8s_state_t *st, k8s_pod_t *p)
{
    char url[4096];

    snprintf(url, sizeof(url), "%s/api/v1/namespaces/%s/pods/%s", st->api_server, st->ns, p->name);
    p->xfer = xfer_start(st, K8S_XFER_POD, url, 10000, K8S_POD_MAX_BYTES);
    if (p->xfer == NULL) {
        p->pstate = K8S_POD_RETRY;
        p->retry_ms = k8s_now_ms() + p->backoff_ms;
        return;
    }
    p->xfer->pod = p;
    p->pstate = K8S_POD_FETCHING;
    st->pod_fetches++;
}

static void pod_done(k8s_state_t *st, k8s_pod_t *p, k8s_xfer_t *x, CURLcode rc, uint64_t now)
{
    long code = xfer_http_status(x);
    json_error_t jerr;
    json_t *doc;
    char err[256];
    int bad;

    p->xfer = NULL;
    st->pod_fetches--;
    st->dirty = true;
    if (rc == CURLE_OK && (code == 404 || code == 403)) {
        /* Definitive: join with what the slice says (named ports). */
        count_err(st, K8S_ERR_POD);
        K8S_LOG(st, SCHED_LOG_WARN,
                "pod %s: GET answered HTTP %ld; using the EndpointSlice's named ports only%s",
                p->name, code, code == 403 ? " (RBAC: grant get on pods)" : "");
        p->pstate = K8S_POD_DONE;
        p->have_kv = false;
        return;
    }
    if (rc != CURLE_OK || code != 200) {
        count_err(st, K8S_ERR_POD);
        K8S_LOG(st, SCHED_LOG_WARN, "pod %s: GET failed: %s (HTTP %ld); retrying", p->name,
                rc != CURLE_OK ? curl_easy_strerror(rc) : "status", code);
        goto err_retry;
    }
    doc = json_loadb(x->buf != NULL ? x->buf : "", x->len, 0, &jerr);
    if (doc == NULL || !json_is_object(doc)) {
        count_err(st, K8S_ERR_BAD_JSON);
        K8S_LOG(st, SCHED_LOG_WARN, "pod %s: body is not a JSON object; retrying", p->name);
        json_decref(doc);
        goto err_retry;
    }
    bad = sched_k8s_kv_from_annotations(
        json_object_get(json_object_get(doc, "metadata"), "annotations"), &p->kv, err, sizeof(err));
    if (bad > 0) {
        atomic_fetch_add(&st->errors[K8S_ERR_ANNOTATION], (uint_fast64_t)bad);
        K8S_LOG(st, SCHED_LOG_WARN, "pod %s: %s (ignored)", p->name, err);
    }
    json_decref(doc);
    p->have_kv = true;
    p->pstate = K8S_POD_DONE;
    return;

err_retry:
    p->pstate = K8S_POD_RETRY;
    p->retry_ms = now + p->backoff_ms;
    p->backoff_ms = p->backoff_ms * 2 > K8S_BACKOFF_MAX_MS ? K8S_BACKOFF_MAX_MS : p->backoff_ms * 2;
}

/* ------------------------------------------------------------------ */
/* Reconciliation                                                      */
/* ------------------------------------------------------------------ */

static k8s_reported_t *reported_find(k8s_state_t *st, const char *id)
{
    return pdb_map_get(&st->reported_by_id, id);
}

static k8s_reported_t *reported_add(k8s_state_t *st, const char *id)
{
    k8s_reported_t *r;
    if (st->n_reported == st->cap_reported) {
        size_t cap = st->cap_reported != 0 ? st->cap_reported * 2 : 16;
        k8s_reported_t **nr = sched_realloc(st->reported, cap * sizeof(*nr));
        if (nr == NULL) {
            return NULL;
        }
        st->reported = nr;
        st->cap_reported = cap;
    }
    r = sched_calloc(1, sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    snprintf(r->id, sizeof(r->id), "%s", id);
    if (pdb_map_put(&st->reported_by_id, r->id, r) != PDB_OK) {
        sched_free(r);
        return NULL;
    }
    st->reported[st->n_reported++] = r;
    return r;
}

/* Forget reported[i] (swapped with the last). */
static void reported_drop(k8s_state_t *st, size_t i)
{
    k8s_reported_t *r = st->reported[i];
    pdb_map_remove(&st->reported_by_id, r->id);
    sched_free(r);
    st->reported[i] = st->reported[--st->n_reported];
}

static void reconcile_endpoint(k8s_state_t *st, k8s_watcher_t *w, const sched_k8s_slice_t *sl,
                               const sched_k8s_endpoint_t *ep, k8s_pod_t *pod)
{
    k8s_reported_t *r = reported_find(st, ep->id);
    sched_instance_desc_t desc;
    char url[K8S_HOST_MAX + 32];
    char err[256];
    sched_status_t status;

    if (!ep->ready) {
        if (r != NULL && !r->drained) {
            status = sched_pool_discovery_drain(st->pool, ep->id);
            if (status != SCHED_OK && status != SCHED_ERR_NOT_FOUND) {
                K8S_LOG(st, SCHED_LOG_WARN, "%s: drain %s: %s", w->role_name, ep->id,
                        sched_strerror(status));
            }
            r->drained = true;
        }
        return;
    }
    if (pod != NULL && pod->pstate != K8S_POD_DONE) {
        return; /* joins once its annotations are known */
    }
    sched_k8s_endpoint_desc(ep, pod != NULL && pod->have_kv ? &pod->kv : NULL, w->role, sl->service,
                            url, sizeof(url), &desc);
    status = sched_pool_upsert(st->pool, &desc, err, sizeof(err));
    if (status != SCHED_OK) {
        count_err(st, K8S_ERR_UPSERT);
        K8S_LOG(st, SCHED_LOG_WARN, "%s: endpoint %s (%s) refused: %s", w->role_name, ep->id, url,
                err[0] != '\0' ? err : sched_strerror(status));
        return;
    }
    if (r == NULL) {
        r = reported_add(st, ep->id);
        if (r == NULL) {
            count_err(st, K8S_ERR_UPSERT);
            return;
        }
        K8S_LOG(st, SCHED_LOG_INFO, "%s: %s joined at %s", w->role_name, ep->id, url);
    }
    r->drained = false;
}

static void reconcile(k8s_state_t *st)
{
    pdb_map_t seen; /* ids met in this pass (an endpoint in several slices counts once) */
    size_t wi, si, ei, i;

    if (pdb_map_init(&seen, st->n_reported) != PDB_OK) {
        return; /* out of memory: try again on the next change */
    }
    for (i = 0; i < st->n_pods; i++) {
        st->pods[i]->referenced = false;
    }
    for (wi = 0; wi < st->n_w; wi++) {
        k8s_watcher_t *w = &st->w[wi];
        uint64_t ready = 0, not_ready = 0;
        for (si = 0; si < w->n_slices; si++) {
            const sched_k8s_slice_t *sl = &w->slices[si];
            for (ei = 0; ei < sl->n_eps; ei++) {
                const sched_k8s_endpoint_t *ep = &sl->eps[ei];
                k8s_pod_t *pod = NULL;
                pdb_status_t ps = pdb_map_put(&seen, ep->id, (void *)ep);
                if (ps == PDB_ERR_EXISTS) {
                    continue;
                }
                if (ps != PDB_OK) {
                    goto out; /* out of memory: try again on the next change */
                }
                if (ep->pod[0] != '\0') {
                    pod = pod_get(st, ep->pod, true);
                    if (pod == NULL) {
                        goto out;
                    }
                    pod->referenced = true;
                }
                if (ep->ready) {
                    ready++;
                } else {
                    not_ready++;
                }
                reconcile_endpoint(st, w, sl, ep, pod);
            }
        }
        atomic_store(&st->ep_ready[wi], ready);
        atomic_store(&st->ep_not_ready[wi], not_ready);
    }
    /* Gone from every slice: retire (drain, removed once idle). */
    for (i = 0; i < st->n_reported;) {
        const char *id = st->reported[i]->id;
        if (pdb_map_get(&seen, id) == NULL) {
            sched_status_t status = sched_pool_retire(st->pool, id);
            if (status != SCHED_OK && status != SCHED_ERR_NOT_FOUND) {
                K8S_LOG(st, SCHED_LOG_WARN, "retire %s: %s", id, sched_strerror(status));
            } else {
                K8S_LOG(st, SCHED_LOG_INFO, "%s left", id);
            }
            reported_drop(st, i);
        } else {
            i++;
        }
    }
    /* Forget pods no endpoint refers to. */
    for (i = 0; i < st->n_pods;) {
        if (!st->pods[i]->referenced) {
            pod_free(st, st->pods[i]);
            st->pods[i] = st->pods[--st->n_pods];
        } else {
            i++;
        }
    }
    st->dirty = false;
out:
    pdb_map_fini(&seen, NULL);
}

/* ------------------------------------------------------------------ */
/* Thread                                                              */
/* ------------------------------------------------------------------ */

static void handle_done(k8s_state_t *st, CURL *easy, CURLcode rc, uint64_t now)
{
    k8s_xfer_t *x = NULL;

    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (x == NULL) {
        return;
    }
    switch (x->kind) {
    case K8S_XFER_LIST:
        x->w->xfer = NULL;
        list_done(st, x->w, x, rc, now);
        break;
    case K8S_XFER_WATCH:
        x->w->xfer = NULL;
        watch_done(st, x->w, x, rc, now);
        break;
    case K8S_XFER_POD:
        pod_done(st, x->pod, x, rc, now);
        break;
    }
    xfer_free(st, x);
}

static void *k8s_thread(void *arg)
{
    k8s_state_t *st = arg;

    while (!atomic_load(&st->stop)) {
        uint64_t now = k8s_now_ms();
        uint64_t wake = now + 1000;
        int running = 0, left = 0;
        size_t i;
        CURLMsg *msg;

        for (i = 0; i < st->n_w; i++) {
            k8s_watcher_t *w = &st->w[i];
            if (w->wstate == K8S_W_IDLE) {
                if (now >= w->next_ms) {
                    watcher_start(st, w, now);
                } else if (w->next_ms < wake) {
                    wake = w->next_ms;
                }
            }
        }
        for (i = 0; i < st->n_pods && st->pod_fetches < K8S_MAX_POD_FETCHES; i++) {
            k8s_pod_t *p = st->pods[i];
            if (p->pstate == K8S_POD_WANTED || (p->pstate == K8S_POD_RETRY && now >= p->retry_ms)) {
                pod_start(st, p);
            } else if (p->pstate == K8S_POD_RETRY && p->retry_ms < wake) {
                wake = p->retry_ms;
            }
        }
        curl_multi_perform(st->multi, &running);
        while ((msg = curl_multi_info_read(st->multi, &left)) != NULL) {
            if (msg->msg == CURLMSG_DONE) {
                handle_done(st, msg->easy_handle, msg->data.result, k8s_now_ms());
            }
        }
        if (st->dirty) {
            reconcile(st);
            /* New pods want fetching: go round at once if a slot is free
             * (otherwise a finishing fetch wakes the poll). */
            for (i = 0; i < st->n_pods && st->pod_fetches < K8S_MAX_POD_FETCHES; i++) {
                if (st->pods[i]->pstate == K8S_POD_WANTED) {
                    wake = now;
                }
            }
        }
        now = k8s_now_ms();
        for (i = 0; i < st->n_w; i++) {
            if (st->w[i].wstate == K8S_W_IDLE && st->w[i].next_ms <= now) {
                wake = now;
            }
        }
        if (wake > now) {
            curl_multi_poll(st->multi, NULL, 0, (int)(wake - now), NULL);
        }
    }
    return NULL;
}

static sched_status_t k8s_start(void *state)
{
    k8s_state_t *st = state;
    int rc = pthread_create(&st->thread, NULL, k8s_thread, st);

    if (rc != 0) {
        K8S_LOG(st, SCHED_LOG_WARN, "cannot start the discovery thread: %s", strerror(rc));
        return SCHED_ERR_IO;
    }
    st->thread_started = true;
    K8S_LOG(st, SCHED_LOG_INFO, "watching EndpointSlices in namespace %s at %s", st->ns,
            st->api_server);
    return SCHED_OK;
}

static void k8s_destroy(void *state)
{
    k8s_state_t *st = state;
    size_t i;

    if (st == NULL) {
        return;
    }
    if (st->thread_started) {
        atomic_store(&st->stop, true);
        curl_multi_wakeup(st->multi);
        pthread_join(st->thread, NULL);
    }
    for (i = 0; i < st->n_w; i++) {
        xfer_free(st, st->w[i].xfer);
        slices_clear(&st->w[i]);
        sched_free(st->w[i].slices);
        sched_free(st->w[i].selector);
    }
    for (i = 0; i < st->n_pods; i++) {
        pod_free(st, st->pods[i]);
    }
    sched_free(st->pods);
    pdb_map_fini(&st->pod_by_name, NULL);
    for (i = 0; i < st->n_reported; i++) {
        sched_free(st->reported[i]);
    }
    sched_free(st->reported);
    pdb_map_fini(&st->reported_by_id, NULL);
    if (st->multi != NULL) {
        curl_multi_cleanup(st->multi);
    }
    sched_free(st->api_server);
    sched_free(st->ns);
    sched_free(st->port_name);
    sched_free(st->token_file);
    sched_free(st->ca_file);
    sched_free(st);
}

/* Prometheus text of the back-end's counters (malloc'd; the pool frees it).
 * Reads only atomics and what create() fixed, so any thread may call it. */
static char *k8s_metrics_text(void *state)
{
    k8s_state_t *st = state;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    size_t i, j;

    if (f == NULL) {
        return NULL;
    }
    fputs("# HELP pdgw_discovery_k8s_errors_total Kubernetes discovery errors by reason.\n"
          "# TYPE pdgw_discovery_k8s_errors_total counter\n",
          f);
    for (i = 0; i < K8S_ERR_COUNT; i++) {
        fprintf(f, "pdgw_discovery_k8s_errors_total{reason=\"%s\"} %llu\n", k8s_err_names[i],
                (unsigned long long)atomic_load(&st->errors[i]));
    }
    fputs("# HELP pdgw_discovery_k8s_lists_total EndpointSlice list requests by role and "
          "cause.\n# TYPE pdgw_discovery_k8s_lists_total counter\n",
          f);
    for (i = 0; i < st->n_w; i++) {
        for (j = 0; j < K8S_RELIST_COUNT; j++) {
            fprintf(f, "pdgw_discovery_k8s_lists_total{role=\"%s\",cause=\"%s\"} %llu\n",
                    st->w[i].role_name, k8s_relist_names[j],
                    (unsigned long long)atomic_load(&st->relists[i][j]));
        }
    }
    fputs("# HELP pdgw_discovery_k8s_endpoints Endpoints in the selected EndpointSlices.\n"
          "# TYPE pdgw_discovery_k8s_endpoints gauge\n",
          f);
    for (i = 0; i < st->n_w; i++) {
        fprintf(f, "pdgw_discovery_k8s_endpoints{role=\"%s\",state=\"ready\"} %llu\n",
                st->w[i].role_name, (unsigned long long)atomic_load(&st->ep_ready[i]));
        fprintf(f, "pdgw_discovery_k8s_endpoints{role=\"%s\",state=\"not_ready\"} %llu\n",
                st->w[i].role_name, (unsigned long long)atomic_load(&st->ep_not_ready[i]));
    }
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

const sched_discovery_ops_t sched_discovery_k8s_ops = {
    .name = "kubernetes",
    .source = SCHED_SOURCE_K8S,
    .configured = k8s_configured,
    .create = k8s_create,
    .start = k8s_start,
    .tick = NULL,
    .destroy = k8s_destroy,
    .metrics_text = k8s_metrics_text,
};
