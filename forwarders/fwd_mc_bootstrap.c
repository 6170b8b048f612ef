/*
 * fwd_mc_bootstrap.c - the engine id cache of vllm-mooncake (see fwd_mc_bootstrap.h).
 *
 * One entry per bootstrap server (host:port). One thread does every GET /query with libcurl;
 * worker threads only read the cache under the lock and queue fetches. The thread sleeps on a
 * condition variable until a fetch is queued or the oldest answer's refresh is due (a timer,
 * not a poll).
 */
#include "fwd_mc_bootstrap.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MC_PROTO      "vllm-mooncake"
#define MC_RETRY_MS   500 /* a failed fetch is repeated for a request after this */
#define MC_ANSWER_MAX (256 * 1024)

typedef struct mc_entry {
    struct mc_entry *next;
    char host[128];
    int port;
    json_t *answer;      /* last good /query answer (owned) or NULL */
    uint64_t fetched_ms; /* when answer (or the last failure) came */
    int want;            /* a fetch is queued */
    int fetching;        /* the thread is fetching it now */
    int stale;           /* answer must not be used until the next fetch */
    int failed;          /* the last fetch failed */
    char error[320];
    pdgw_fwd_waker_t **waiters; /* referenced */
    size_t n_waiters, cap_waiters;
} mc_entry_t;

struct fwd_mc_boot {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int stop;
    int64_t ttl_ms, timeout_ms;
    mc_entry_t *entries;
};

static uint64_t now_ms(void)
{
    return (uint64_t)pdgw_fwd_now_ms();
}

const char *fwd_mc_boot_engine_of(const json_t *answer, int rank)
{
    char key[16];
    json_t *e;
    snprintf(key, sizeof(key), "%d", rank);
    e = json_object_get(answer, key);
    return json_string_value(json_object_get(e, "engine_id"));
}

/* Whether <eid> is one of the engine ids of <answer>. */
static int answer_has(const json_t *answer, const char *eid)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)answer, k, v)
    {
        const char *s = json_string_value(json_object_get(v, "engine_id"));
        if (s && strcmp(s, eid) == 0)
            return 1;
    }
    return 0;
}

/* ---- the fetch ---- */

typedef struct mc_buf {
    char *data;
    size_t len;
    int too_big;
} mc_buf_t;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    mc_buf_t *b = ud;
    size_t add = sz * n;
    char *d;
    if (b->len + add > MC_ANSWER_MAX) {
        b->too_big = 1;
        return 0;
    }
    d = realloc(b->data, b->len + add + 1);
    if (d == NULL)
        return 0;
    memcpy(d + b->len, p, add);
    b->data = d;
    b->len += add;
    d[b->len] = '\0';
    return add;
}

/* A valid answer maps DP ranks ("0", "1", ...) to objects with a string engine_id. */
static int answer_valid(const json_t *a)
{
    const char *k;
    json_t *v;
    if (!json_is_object(a) || json_object_size(a) == 0)
        return 0;
    json_object_foreach((json_t *)a, k, v)
    {
        char *end;
        long r = strtol(k, &end, 10);
        if (*k == '\0' || *end != '\0' || r < 0 || r > 65535 || !json_is_object(v) ||
            !json_is_string(json_object_get(v, "engine_id")) ||
            json_string_length(json_object_get(v, "engine_id")) == 0)
            return 0;
    }
    return 1;
}

/* GET http://host:port/query. Returns the answer (new reference) or NULL with err set. */
static json_t *fetch_query(const char *host, int port, int64_t timeout_ms, char *err, size_t errlen)
{
    char url[176];
    mc_buf_t b = {0};
    long status = 0;
    json_t *a = NULL;
    CURLcode rc;
    CURL *c = curl_easy_init();
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(url, sizeof(url), strchr(host, ':') ? "http://[%s]:%d/query" : "http://%s:%d/query",
             host, port);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "GET %s: %s", url,
                 b.too_big ? "answer larger than 256 KiB" : curl_easy_strerror(rc));
    } else if (status != 200) {
        snprintf(err, errlen, "GET %s: HTTP %ld", url, status);
    } else {
        a = json_loadb(b.data ? b.data : "", b.len, 0, NULL);
        if (!answer_valid(a)) {
            json_decref(a);
            a = NULL;
            snprintf(err, errlen, "GET %s: not a Mooncake bootstrap answer", url);
        }
    }
    free(b.data);
    return a;
}

/* ---- the thread ---- */

static void wake_all_locked(mc_entry_t *e)
{
    for (size_t i = 0; i < e->n_waiters; i++) {
        pdgw_fwd_waker_wake(e->waiters[i]);
        pdgw_fwd_waker_unref(e->waiters[i]);
    }
    e->n_waiters = 0;
}

static void fetch_one_locked(fwd_mc_boot_t *b, mc_entry_t *e)
{
    char host[128], err[320] = "";
    int port = e->port;
    json_t *a;
    e->want = 0;
    e->fetching = 1;
    memcpy(host, e->host, sizeof(host));
    pthread_mutex_unlock(&b->lock);
    pdgw_fwd_counter_inc(MC_PROTO, "mooncake_bootstrap_queries",
                         "GET /query asked of Mooncake prefill bootstrap servers");
    a = fetch_query(host, port, b->timeout_ms, err, sizeof(err));
    if (a == NULL) {
        pdgw_fwd_counter_inc(MC_PROTO, "mooncake_bootstrap_query_failures",
                             "GET /query of a Mooncake bootstrap server that failed");
        pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: engine ids of %s:%d: %s", MC_PROTO, host, port, err);
    }
    pthread_mutex_lock(&b->lock);
    e->fetching = 0;
    e->fetched_ms = now_ms();
    if (a != NULL) {
        if (e->answer != NULL && !json_equal(e->answer, a)) {
            pdgw_fwd_counter_inc(MC_PROTO, "mooncake_engine_id_changes",
                                 "Mooncake prefills whose engine ids changed (restarts)");
            pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: engine ids of %s:%d changed", MC_PROTO, host,
                         port);
        }
        json_decref(e->answer);
        e->answer = a;
        e->failed = 0;
        e->stale = 0;
    } else {
        json_decref(e->answer);
        e->answer = NULL;
        e->failed = 1;
        snprintf(e->error, sizeof(e->error), "%s", err);
    }
    wake_all_locked(e);
}

static void *boot_thread(void *arg)
{
    fwd_mc_boot_t *b = arg;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        mc_entry_t *e, *due = NULL;
        uint64_t now = now_ms(), next = UINT64_MAX;
        for (e = b->entries; e != NULL; e = e->next) {
            if (e->fetching)
                continue;
            if (!e->want && e->answer != NULL && e->fetched_ms + (uint64_t)b->ttl_ms <= now)
                e->want = 1; /* background refresh; the old answer serves meanwhile */
            if (e->want) {
                due = e;
                break;
            }
            if (e->answer != NULL && e->fetched_ms + (uint64_t)b->ttl_ms < next)
                next = e->fetched_ms + (uint64_t)b->ttl_ms;
        }
        if (due != NULL) {
            fetch_one_locked(b, due);
            continue;
        }
        if (next == UINT64_MAX) {
            pthread_cond_wait(&b->cond, &b->lock);
        } else {
            struct timespec ts;
            uint64_t wait = next - now;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            (void)pthread_cond_timedwait(&b->cond, &b->lock, &ts);
        }
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

/* ---- API ---- */

pdgw_fwd_status_t fwd_mc_boot_create(int64_t ttl_ms, int64_t timeout_ms, fwd_mc_boot_t **out,
                                     char *err, size_t errlen)
{
    fwd_mc_boot_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_FWD_ERR_CONFIG;
    }
    b->ttl_ms = ttl_ms;
    b->timeout_ms = timeout_ms;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    if (pthread_create(&b->thread, NULL, boot_thread, b) != 0) {
        snprintf(err, errlen, "cannot start the Mooncake bootstrap thread: %s", strerror(errno));
        pthread_cond_destroy(&b->cond);
        pthread_mutex_destroy(&b->lock);
        free(b);
        return PDGW_FWD_ERR_CONFIG;
    }
    *out = b;
    return PDGW_FWD_OK;
}

void fwd_mc_boot_destroy(fwd_mc_boot_t *b)
{
    mc_entry_t *e, *n;
    if (b == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    for (e = b->entries; e != NULL; e = n) {
        n = e->next;
        wake_all_locked(e);
        free(e->waiters);
        json_decref(e->answer);
        free(e);
    }
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

static mc_entry_t *entry_get_locked(fwd_mc_boot_t *b, const char *host, int port, int create)
{
    mc_entry_t *e;
    for (e = b->entries; e != NULL; e = e->next)
        if (e->port == port && strcmp(e->host, host) == 0)
            return e;
    if (!create || strlen(host) >= sizeof(e->host))
        return NULL;
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    snprintf(e->host, sizeof(e->host), "%s", host);
    e->port = port;
    e->next = b->entries;
    b->entries = e;
    return e;
}

static int add_waiter_locked(mc_entry_t *e, pdgw_fwd_waker_t *w)
{
    if (e->n_waiters == e->cap_waiters) {
        size_t cap = e->cap_waiters ? e->cap_waiters * 2 : 8;
        pdgw_fwd_waker_t **ws = realloc(e->waiters, cap * sizeof(*ws));
        if (ws == NULL)
            return -1;
        e->waiters = ws;
        e->cap_waiters = cap;
    }
    e->waiters[e->n_waiters++] = pdgw_fwd_waker_ref(w);
    return 0;
}

pdgw_fwd_status_t fwd_mc_boot_lookup(fwd_mc_boot_t *b, const char *host, int port, int rank,
                                     pdgw_fwd_waker_t *waker, char *out, size_t cap, char *err,
                                     size_t errlen)
{
    pdgw_fwd_status_t st = PDGW_FWD_PENDING;
    uint64_t now = now_ms();
    mc_entry_t *e;
    pthread_mutex_lock(&b->lock);
    e = entry_get_locked(b, host, port, 1);
    if (e == NULL) {
        snprintf(err, errlen, "out of memory (or host name too long)");
        st = PDGW_FWD_ERR;
        goto out;
    }
    if (e->answer != NULL && !e->stale) {
        const char *eid = fwd_mc_boot_engine_of(e->answer, rank);
        if (eid != NULL && strlen(eid) < cap) {
            snprintf(out, cap, "%s", eid);
            st = PDGW_FWD_OK;
            goto out;
        }
        if (e->fetched_ms + MC_RETRY_MS > now) {
            snprintf(err, errlen, "bootstrap server %s:%d lists no DP rank %d", host, port, rank);
            st = PDGW_FWD_ERR;
            goto out;
        }
        e->stale = 1; /* the DP layout may have changed: ask again */
    } else if (e->failed && !e->fetching && !e->want && e->fetched_ms + MC_RETRY_MS > now) {
        snprintf(err, errlen, "%s", e->error);
        st = PDGW_FWD_ERR;
        goto out;
    }
    if (waker == NULL || add_waiter_locked(e, waker) != 0) {
        snprintf(err, errlen, "cannot wait for the engine ids of %s:%d", host, port);
        st = PDGW_FWD_ERR;
        goto out;
    }
    if (!e->fetching && !e->want) {
        e->want = 1;
        pthread_cond_signal(&b->cond);
    }
out:
    pthread_mutex_unlock(&b->lock);
    return st;
}

void fwd_mc_boot_invalidate(fwd_mc_boot_t *b, const char *host, int port, const char *engine_id)
{
    mc_entry_t *e;
    pthread_mutex_lock(&b->lock);
    e = entry_get_locked(b, host, port, 0);
    if (e != NULL && e->answer != NULL && !e->stale &&
        (engine_id == NULL || answer_has(e->answer, engine_id))) {
        e->stale = 1;
        e->want = 1; /* fetch now (again, if one is under way), before the retry asks */
        pthread_cond_signal(&b->cond);
    }
    pthread_mutex_unlock(&b->lock);
}
