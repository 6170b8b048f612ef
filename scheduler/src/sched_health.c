/*
 * Background work of the pool: active health probes (GET health_path),
 * engine metric scrapes (GET metrics_path), staleness of scraped values,
 * discovery ticks and removal of idle retired instances. All HTTP runs on
 * one libcurl multi handle owned by the pool thread, so nothing blocks on
 * a slow engine.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <curl/curl.h>

#include "sched_int.h"

#define RELAXED              memory_order_relaxed
#define MAX_ACTIVE_TRANSFERS 256
#define PROBE_BODY_MAX       (64u * 1024u)
#define METRICS_BODY_MAX     (8u * 1024u * 1024u)
#define MODELS_BODY_MAX      (1024u * 1024u)
/* The engines' model list (vLLM and SGLang serve it at this path). */
#define MODELS_PATH "/v1/models"

typedef enum { XFER_PROBE, XFER_SCRAPE, XFER_MODELS } xfer_kind_t;

typedef struct transfer {
    CURL *easy;
    sched_instance_t *inst; /* reference */
    xfer_kind_t kind;
    char *buf;
    size_t len, cap, max;
    bool overflow;
    char errbuf[CURL_ERROR_SIZE];
    int os_errno;                 /* errno when this process could not get a socket */
    struct transfer *prev, *next; /* in-flight list */
} transfer_t;

struct sched_health {
    CURLM *multi;
    size_t active;
    transfer_t *inflight;
};

static void list_add(sched_health_t *h, transfer_t *t)
{
    t->prev = NULL;
    t->next = h->inflight;
    if (h->inflight)
        h->inflight->prev = t;
    h->inflight = t;
}

static void list_del(sched_health_t *h, transfer_t *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        h->inflight = t->next;
    if (t->next)
        t->next->prev = t->prev;
}

sched_status_t sched_health_create(sched_pool_t *pool, sched_health_t **out)
{
    sched_health_t *h = sched_calloc(1, sizeof(*h));

    (void)pool;
    if (!h)
        return SCHED_ERR_NO_MEMORY;
    h->multi = curl_multi_init();
    if (!h->multi) {
        sched_free(h);
        return SCHED_ERR_NO_MEMORY;
    }
    *out = h;
    return SCHED_OK;
}

static void transfer_free(transfer_t *t)
{
    if (t->easy)
        curl_easy_cleanup(t->easy);
    sched_instance_unref(t->inst);
    sched_free(t->buf);
    sched_free(t);
}

void sched_health_destroy(sched_health_t *h)
{
    if (!h)
        return;
    /* Abandon transfers still in flight. */
    while (h->inflight) {
        transfer_t *t = h->inflight;
        list_del(h, t);
        curl_multi_remove_handle(h->multi, t->easy);
        transfer_free(t);
    }
    curl_multi_cleanup(h->multi);
    sched_free(h);
}

void sched_health_wakeup(sched_health_t *h)
{
    if (h)
        curl_multi_wakeup(h->multi);
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    transfer_t *t = arg;
    size_t n = size * nmemb;

    if (t->len + n + 1 > t->max) {
        t->overflow = true;
        return 0; /* abort the transfer */
    }
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        char *nb;
        while (cap < t->len + n + 1)
            cap *= 2;
        nb = sched_realloc(t->buf, cap);
        if (!nb)
            return 0;
        t->buf = nb;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, data, n);
    t->len += n;
    t->buf[t->len] = '\0';
    return n;
}

/* curl's socket opener, so "could not connect" caused by this process running out of
 * descriptors is told apart from an instance that refuses. */
static curl_socket_t open_socket(void *cls, curlsocktype purpose, struct curl_sockaddr *a)
{
    transfer_t *t = cls;
    curl_socket_t fd = socket(a->family, a->socktype, a->protocol);
    (void)purpose;
    t->os_errno = fd == CURL_SOCKET_BAD ? errno : 0;
    return fd;
}

static bool local_shortage(int os_errno)
{
    return os_errno == EMFILE || os_errno == ENFILE || os_errno == ENOBUFS || os_errno == ENOMEM;
}

static bool start_transfer(sched_pool_t *pool, sched_instance_t *inst, xfer_kind_t kind)
{
    sched_health_t *h = pool->health;
    const char *path = kind == XFER_PROBE    ? pool->health_path
                       : kind == XFER_MODELS ? MODELS_PATH
                                             : pool->metrics_path;
    size_t url_len = strlen(inst->desc.url) + strlen(path) + 1;
    char *url;
    transfer_t *t;

    t = sched_calloc(1, sizeof(*t));
    url = sched_malloc(url_len);
    if (!t || !url)
        goto err_free;
    snprintf(url, url_len, "%s%s", inst->desc.url, path);
    t->easy = curl_easy_init();
    if (!t->easy)
        goto err_free;
    t->inst = sched_instance_ref(inst);
    t->kind = kind;
    t->max = kind == XFER_PROBE    ? PROBE_BODY_MAX
             : kind == XFER_MODELS ? MODELS_BODY_MAX
                                   : METRICS_BODY_MAX;
    curl_easy_setopt(t->easy, CURLOPT_URL, url);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
    curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->errbuf);
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)pool->health_timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)pool->health_timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_USERAGENT, "pdgw-scheduler");
    curl_easy_setopt(t->easy, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(t->easy, CURLOPT_OPENSOCKETDATA, t);
    if (curl_multi_add_handle(h->multi, t->easy) != CURLM_OK)
        goto err_free;
    sched_free(url);
    list_add(h, t);
    h->active++;
    if (kind == XFER_PROBE)
        inst->probe_busy = true;
    else if (kind == XFER_MODELS)
        inst->models_busy = true;
    else
        inst->scrape_busy = true;
    return true;

err_free:
    sched_free(url);
    if (t)
        transfer_free(t);
    return false;
}

static void probe_done(sched_pool_t *pool, transfer_t *t, CURLcode rc, long code, uint64_t now)
{
    sched_instance_t *inst = t->inst;
    bool ok = rc == CURLE_OK && code >= 200 && code < 300;
    bool went_down = false, came_up = false;
    char why[sizeof(inst->last_error)];

    if (rc != CURLE_OK && local_shortage(t->os_errno)) {
        /* Says nothing about the instance: this process ran out of descriptors. */
        pthread_mutex_lock(&inst->mu);
        snprintf(inst->last_error, sizeof(inst->last_error),
                 "health probe skipped: gateway has no socket (%s)", strerror(t->os_errno));
        inst->last_error_ms = now;
        pthread_mutex_unlock(&inst->mu);
        return;
    }
    pthread_mutex_lock(&inst->mu);
    inst->last_probe_ms = now;
    inst->last_probe_status = rc == CURLE_OK ? (int)code : 0;
    if (ok) {
        inst->health_ok++;
        inst->health_fail = 0;
        if (sched_gate_down(inst) && inst->health_ok >= pool->healthy_threshold) {
            atomic_fetch_and(&inst->gate, ~SCHED_GATE_DOWN);
            /* A fresh healthy signal after being down (typically a restart)
             * clears the breaker's memory of the old failures. */
            inst->breaker_failures = 0;
            sched_gate_set_breaker(inst, UINT32_MAX, SCHED_BREAKER_CLOSED);
            came_up = true;
        }
    } else {
        inst->health_fail++;
        inst->health_ok = 0;
        if (rc != CURLE_OK)
            snprintf(inst->last_error, sizeof(inst->last_error), "health probe: %.170s",
                     t->errbuf[0] ? t->errbuf : curl_easy_strerror(rc));
        else
            snprintf(inst->last_error, sizeof(inst->last_error), "health probe: HTTP %ld", code);
        inst->last_error_ms = now;
        if (!sched_gate_down(inst) && inst->health_fail >= pool->unhealthy_threshold) {
            atomic_fetch_or(&inst->gate, SCHED_GATE_DOWN);
            went_down = true;
            memcpy(why, inst->last_error, sizeof(why)); /* logged after the unlock */
        }
    }
    pthread_mutex_unlock(&inst->mu);
    if (went_down)
        sched_pool_logf(pool, SCHED_LOG_WARN, "instance %s down: %s", inst->desc.id, why);
    if (came_up)
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s up", inst->desc.id);
}

/* Milli-units of <v>, clamped to 32 bits (engines may report anything). */
static uint64_t to_milli(double v)
{
    v *= (double)SCHED_LOAD_UNIT;
    if (!(v > 0))
        return 0;
    return v >= (double)UINT32_MAX ? UINT32_MAX : (uint64_t)v;
}

static void publish_scrape(sched_instance_t *inst, const sched_engine_metrics_t *m)
{
    uint64_t reqs = to_milli(m->running + m->waiting);
    uint64_t extra = to_milli(m->waiting + m->kv_usage * 4.0);

    atomic_store_explicit(&inst->scraped, reqs << 32 | extra, RELAXED);
}

static void scrape_done(sched_pool_t *pool, transfer_t *t, CURLcode rc, long code, uint64_t now)
{
    sched_instance_t *inst = t->inst;
    sched_engine_metrics_t m;

    if (rc != CURLE_OK || code < 200 || code >= 300 || !t->buf)
        return; /* keeps the previous values until they go stale */
    if (sched_prom_parse(t->buf, t->len, &m) != SCHED_OK)
        return;
    pthread_mutex_lock(&inst->mu);
    inst->scraped_running = m.running;
    inst->scraped_waiting = m.waiting;
    inst->scraped_kv_usage = m.kv_usage;
    inst->scraped_at_ms = now ? now : 1;
    publish_scrape(inst, &m);
    pthread_mutex_unlock(&inst->mu);
    sched_kv_on_scrape(pool, inst, &m);
}

static void drain_completions(sched_pool_t *pool)
{
    sched_health_t *h = pool->health;
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(h->multi, &left))) {
        transfer_t *t = NULL;
        long code = 0;
        uint64_t now;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
        now = sched_pool_now(pool);
        if (t->kind == XFER_PROBE) {
            probe_done(pool, t, msg->data.result, code, now);
            t->inst->probe_busy = false;
        } else if (t->kind == XFER_MODELS) {
            if (msg->data.result == CURLE_OK && code == 200)
                sched_models_learn(pool, t->inst, t->buf, t->len);
            t->inst->models_busy = false;
        } else {
            scrape_done(pool, t, msg->data.result, code, now);
            t->inst->scrape_busy = false;
        }
        curl_multi_remove_handle(h->multi, msg->easy_handle);
        list_del(h, t);
        h->active--;
        transfer_free(t);
    }
}

static void expire_scrape(sched_pool_t *pool, sched_instance_t *inst, uint64_t now)
{
    pthread_mutex_lock(&inst->mu);
    if (inst->scraped_at_ms && now > inst->scraped_at_ms + pool->stale_ms &&
        atomic_load_explicit(&inst->scraped, RELAXED)) {
        atomic_store_explicit(&inst->scraped, 0, RELAXED); /* stale: local accounting only */
        sched_kv_on_stale(inst);
    }
    pthread_mutex_unlock(&inst->mu);
}

static uint64_t jitter(uint64_t interval)
{
    return interval ? sched_rng_next(sched_thread_rng()) % (interval / 4 + 1) : 0;
}

void sched_health_run_once(sched_pool_t *pool, int timeout_ms)
{
    sched_health_t *h = pool->health;
    uint64_t now = sched_pool_now(pool);
    sched_instance_t **arr;
    size_t n;
    int running;

    if (!atomic_load(&pool->stopping) && sched_pool_collect(pool, &arr, &n) == SCHED_OK) {
        for (size_t i = 0; i < n; i++) {
            sched_instance_t *inst = arr[i];
            if (pool->health_interval_ms && !inst->probe_busy && now >= inst->next_probe_ms &&
                h->active < MAX_ACTIVE_TRANSFERS && start_transfer(pool, inst, XFER_PROBE)) {
                inst->next_probe_ms =
                    now + pool->health_interval_ms - jitter(pool->health_interval_ms);
                /* Names not configured: learn (and refresh) them with every probe. */
                if (inst->desc.n_models == 0 && !inst->models_busy &&
                    h->active < MAX_ACTIVE_TRANSFERS)
                    (void)start_transfer(pool, inst, XFER_MODELS);
            }
            if (pool->scrape_interval_ms && !inst->scrape_busy && now >= inst->next_scrape_ms &&
                h->active < MAX_ACTIVE_TRANSFERS && start_transfer(pool, inst, XFER_SCRAPE))
                inst->next_scrape_ms =
                    now + pool->scrape_interval_ms - jitter(pool->scrape_interval_ms);
            expire_scrape(pool, inst, now);
        }
        sched_pool_release_collected(arr, n);
        sched_discovery_tick_all(pool, now);
        sched_pool_reap_retired(pool);
    }
    curl_multi_perform(h->multi, &running);
    drain_completions(pool);
    curl_multi_poll(h->multi, NULL, 0, timeout_ms, NULL);
    curl_multi_perform(h->multi, &running);
    drain_completions(pool);
}
