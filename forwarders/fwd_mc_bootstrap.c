/*
 * fwd_mc_bootstrap.c - the engine id cache of vllm-mooncake (see fwd_mc_bootstrap.h).
 *
 * One entry per bootstrap server (host:port), shared by every worker under one lock. A GET
 * /query is a call of the gateway's upstream client on the worker of the request that found
 * the entry missing, stale or due (forwarder.h pdgw_fwd_call_get_port): no thread and no HTTP
 * client of ours. Requests that find a fetch under way wait on the entry; its owner settles it
 * when its gate runs again (or, for a background refresh, in a later op) and wakes them. A
 * fetch lives as long as the request that asked: one still unanswered when that request ends
 * is dropped and asked again later.
 */
#include "fwd_mc_bootstrap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_PROTO      "vllm-mooncake"
#define MC_RETRY_MS   500 /* a failed fetch is repeated for a request after this */
#define MC_ANSWER_MAX (256 * 1024)

typedef struct mc_entry {
    struct mc_entry *next;
    char host[128];
    int port;
    json_t *answer;      /* last good /query answer (owned) or NULL */
    uint64_t fetched_ms; /* when answer (or the last failure) came */
    uint64_t refresh_ms; /* when answer is due for a background refresh */
    int fetching;        /* a request's call is under way */
    int stale;           /* answer must not be used until the next fetch */
    int failed;          /* the last fetch failed */
    char error[320];
    pdgw_fwd_waker_t **waiters; /* referenced */
    size_t n_waiters, cap_waiters;
} mc_entry_t;

struct fwd_mc_boot {
    pthread_mutex_t lock;
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

/* The answer of a finished call (new reference), or NULL with err set. */
static json_t *call_answer(const fwd_mc_fetch_t *f, char *err, size_t errlen)
{
    long status = 0;
    const char *data = NULL;
    size_t len = 0;
    char msg[200] = "";
    json_t *a;
    if (pdgw_fwd_call_result(f->call, &status, &data, &len, msg, sizeof(msg)) != 1) {
        snprintf(err, errlen, "GET /query of %s:%d: %s", f->host, f->port, msg);
        return NULL;
    }
    if (status != 200) {
        snprintf(err, errlen, "GET /query of %s:%d: HTTP %ld", f->host, f->port, status);
        return NULL;
    }
    if (len > MC_ANSWER_MAX) {
        snprintf(err, errlen, "GET /query of %s:%d: answer larger than 256 KiB", f->host, f->port);
        return NULL;
    }
    a = json_loadb(data, len, 0, NULL);
    if (!answer_valid(a)) {
        json_decref(a);
        snprintf(err, errlen, "GET /query of %s:%d: not a Mooncake bootstrap answer", f->host,
                 f->port);
        return NULL;
    }
    return a;
}

static void wake_all_locked(mc_entry_t *e)
{
    for (size_t i = 0; i < e->n_waiters; i++) {
        pdgw_fwd_waker_wake(e->waiters[i]);
        pdgw_fwd_waker_unref(e->waiters[i]);
    }
    e->n_waiters = 0;
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

/* Record what the request's finished call brought (or, abandoned, that nothing is under way
 * any more) and wake the entry's waiters. */
static void fetch_end(fwd_mc_boot_t *b, fwd_mc_fetch_t *f, int abandoned)
{
    char err[320] = "";
    json_t *a = NULL;
    mc_entry_t *e;
    if (!abandoned) {
        a = call_answer(f, err, sizeof(err));
        if (a == NULL) {
            pdgw_fwd_counter_inc(MC_PROTO, "mooncake_bootstrap_query_failures",
                                 "GET /query of a Mooncake bootstrap server that failed");
            pdgw_fwd_log(PDGW_FWD_LOG_WARN, "%s: engine ids: %s", MC_PROTO, err);
        }
    }
    pdgw_fwd_call_release(f->call);
    f->call = NULL;
    pthread_mutex_lock(&b->lock);
    e = entry_get_locked(b, f->host, f->port, 0);
    if (e != NULL) {
        e->fetching = 0;
        if (a != NULL) {
            if (e->answer != NULL && !json_equal(e->answer, a)) {
                pdgw_fwd_counter_inc(MC_PROTO, "mooncake_engine_id_changes",
                                     "Mooncake prefills whose engine ids changed (restarts)");
                pdgw_fwd_log(PDGW_FWD_LOG_INFO, "%s: engine ids of %s:%d changed", MC_PROTO,
                             e->host, e->port);
            }
            json_decref(e->answer);
            e->answer = a;
            a = NULL;
            e->fetched_ms = now_ms();
            e->refresh_ms = e->fetched_ms + (uint64_t)b->ttl_ms;
            e->failed = 0;
            e->stale = 0;
        } else if (!abandoned) {
            json_decref(e->answer);
            e->answer = NULL;
            e->fetched_ms = now_ms();
            e->failed = 1;
            snprintf(e->error, sizeof(e->error), "%s", err);
        }
        /* Abandoned (its request ended first): a waiter that runs again starts the next fetch;
         * a background refresh is tried again a little later, not by every next request. */
        if (abandoned && e->answer != NULL)
            e->refresh_ms = now_ms() + MC_RETRY_MS;
        wake_all_locked(e);
    }
    pthread_mutex_unlock(&b->lock);
    json_decref(a);
}

/* Whether the request's call has ended (answered or failed). */
static int fetch_finished(const fwd_mc_fetch_t *f)
{
    long status;
    const char *data;
    size_t len;
    return pdgw_fwd_call_result(f->call, &status, &data, &len, NULL, 0) != 0;
}

/* Start the request's call for entry <e> (fetching set by the caller, lock not held). */
static int fetch_start(fwd_mc_boot_t *b, fwd_mc_fetch_t *f, const pdgw_fwd_request_t *req,
                       const pdgw_instance_t *inst, const mc_entry_t *e)
{
    snprintf(f->host, sizeof(f->host), "%s", e->host);
    f->port = e->port;
    pdgw_fwd_counter_inc(MC_PROTO, "mooncake_bootstrap_queries",
                         "GET /query asked of Mooncake prefill bootstrap servers");
    f->call = pdgw_fwd_call_get_port(req, inst, e->port, "/query", b->timeout_ms);
    return f->call != NULL ? 0 : -1;
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
    *out = b;
    return PDGW_FWD_OK;
}

void fwd_mc_boot_destroy(fwd_mc_boot_t *b)
{
    mc_entry_t *e, *n;
    if (b == NULL)
        return;
    for (e = b->entries; e != NULL; e = n) {
        n = e->next;
        wake_all_locked(e);
        free(e->waiters);
        json_decref(e->answer);
        free(e);
    }
    pthread_mutex_destroy(&b->lock);
    free(b);
}

pdgw_fwd_status_t fwd_mc_boot_lookup(fwd_mc_boot_t *b, fwd_mc_fetch_t *f,
                                     const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                     int port, int rank, char *out, size_t cap, char *err,
                                     size_t errlen)
{
    pdgw_fwd_status_t st = PDGW_FWD_PENDING;
    int start = 0;
    uint64_t now;
    mc_entry_t *e;

    if (f->call != NULL) { /* this request's own fetch */
        if (!fetch_finished(f))
            return PDGW_FWD_PENDING; /* woken by something else: its end wakes us again */
        fetch_end(b, f, 0);
    }
    now = now_ms();
    pthread_mutex_lock(&b->lock);
    e = entry_get_locked(b, inst->host, port, 1);
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
            /* Due for a refresh: this request asks in the background; the answer in hand
             * serves it and everyone meanwhile. */
            if (!e->fetching && f->call == NULL && e->refresh_ms <= now)
                start = e->fetching = 1;
            goto out;
        }
        if (e->fetched_ms + MC_RETRY_MS > now) {
            snprintf(err, errlen, "bootstrap server %s:%d lists no DP rank %d", e->host, port,
                     rank);
            st = PDGW_FWD_ERR;
            goto out;
        }
        e->stale = 1; /* the DP layout may have changed: ask again */
    } else if (e->failed && !e->fetching && e->fetched_ms + MC_RETRY_MS > now) {
        snprintf(err, errlen, "%s", e->error);
        st = PDGW_FWD_ERR;
        goto out;
    }
    if (e->fetching) {
        if (req->waker == NULL || add_waiter_locked(e, req->waker) != 0) {
            snprintf(err, errlen, "cannot wait for the engine ids of %s:%d", e->host, port);
            st = PDGW_FWD_ERR;
        }
        goto out;
    }
    start = e->fetching = 1;
out:
    pthread_mutex_unlock(&b->lock);
    if (start && fetch_start(b, f, req, inst, e) != 0) {
        fetch_end(b, f, 1);
        if (st != PDGW_FWD_OK) {
            snprintf(err, errlen, "cannot ask %s:%d for its engine ids", inst->host, port);
            st = PDGW_FWD_ERR;
        }
    }
    return st;
}

void fwd_mc_boot_settle(fwd_mc_boot_t *b, fwd_mc_fetch_t *f, int ending)
{
    if (b == NULL || f == NULL || f->call == NULL)
        return;
    if (fetch_finished(f))
        fetch_end(b, f, 0);
    else if (ending)
        fetch_end(b, f, 1);
}

void fwd_mc_boot_invalidate(fwd_mc_boot_t *b, const char *host, int port, const char *engine_id)
{
    mc_entry_t *e;
    pthread_mutex_lock(&b->lock);
    e = entry_get_locked(b, host, port, 0);
    if (e != NULL && e->answer != NULL && !e->stale &&
        (engine_id == NULL || answer_has(e->answer, engine_id)))
        e->stale = 1; /* the next lookup fetches, before it would use the id again */
    pthread_mutex_unlock(&b->lock);
}
