/*
 * fwd_lmcache_tok.c - the tokenize calls of the lmcache forwarder's first_tok flow.
 *
 * LMCache's disagg proxy (examples/disagg_prefill/disagg_proxy_server.py) asks an engine's
 * vLLM POST /tokenize ({"prompt": ...} or {"messages": ...}; answer {"tokens": [...]}) before
 * the prefill leg, and sends the token ids as the prompt of both legs. Request ops never
 * block, so the calls run here: one thread with a libcurl multi handle, jobs handed in
 * through a queue, each job reference counted (the attempt and the thread) and finished by
 * waking the request's waker.
 */
#include "fwd_lmcache_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#define TOK_MAX_ANSWER (16u << 20) /* a tokenize answer larger than this is refused */

struct lmc_tok_job {
    atomic_int refs;
    struct lmc_tok_job *next; /* queue, then the thread's list of running calls */
    CURL *easy;
    char url[512];
    char *body;
    int64_t timeout_ms;
    pdgw_fwd_waker_t *waker;
    /* the answer: buffer filled by the thread, result under the worker lock */
    char *resp;
    size_t resp_len;
    int too_big;
    int state; /* 0 pending, 1 ok, -1 failed */
    json_t *tokens;
    char msg[200];
};

struct lmc_tok {
    pthread_t th;
    pthread_mutex_t lock;
    CURLM *multi;
    lmc_tok_job_t *queue;
    lmc_tok_job_t *running; /* thread only */
    int stop;
    int started;
};

static void job_unref(lmc_tok_job_t *j)
{
    if (j == NULL || atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    if (j->waker)
        pdgw_fwd_waker_unref(j->waker);
    json_decref(j->tokens);
    free(j->body);
    free(j->resp);
    free(j);
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    lmc_tok_job_t *j = arg;
    size_t len = size * n;
    char *grown;
    if (j->too_big || j->resp_len + len > TOK_MAX_ANSWER) {
        j->too_big = 1;
        return 0; /* aborts the transfer */
    }
    grown = realloc(j->resp, j->resp_len + len + 1);
    if (grown == NULL)
        return 0;
    j->resp = grown;
    memcpy(j->resp + j->resp_len, p, len);
    j->resp_len += len;
    j->resp[j->resp_len] = '\0';
    return len;
}

/* The thread finished a call: judge the answer, publish it and wake the request. */
static void job_finish(lmc_tok_t *t, lmc_tok_job_t *j, CURLcode rc, long status)
{
    json_t *doc = NULL, *toks = NULL;
    char msg[200] = "";
    if (rc != CURLE_OK) {
        snprintf(msg, sizeof(msg), "tokenize call failed: %s",
                 j->too_big ? "answer too large" : curl_easy_strerror(rc));
    } else if (status != 200) {
        snprintf(msg, sizeof(msg), "tokenize answered HTTP %ld", status);
    } else {
        size_t i;
        json_t *v;
        doc = json_loadb(j->resp ? j->resp : "", j->resp_len, 0, NULL);
        toks = doc ? json_object_get(doc, "tokens") : NULL;
        if (!json_is_array(toks) || json_array_size(toks) == 0)
            snprintf(msg, sizeof(msg), "tokenize answer has no tokens list");
        json_array_foreach(toks, i, v) if (!json_is_integer(v) || json_integer_value(v) < 0)
        {
            snprintf(msg, sizeof(msg), "tokenize answer has a token that is not an id");
            break;
        }
    }
    pthread_mutex_lock(&t->lock);
    if (msg[0] != '\0') {
        j->state = -1;
        snprintf(j->msg, sizeof(j->msg), "%s", msg);
    } else {
        j->state = 1;
        j->tokens = json_incref(toks);
    }
    pthread_mutex_unlock(&t->lock);
    json_decref(doc);
    if (j->waker)
        pdgw_fwd_waker_wake(j->waker);
}

static void start_transfer(lmc_tok_t *t, lmc_tok_job_t *j, struct curl_slist *hdrs)
{
    CURL *e = curl_easy_init();
    if (e == NULL) {
        job_finish(t, j, CURLE_OUT_OF_MEMORY, 0);
        job_unref(j);
        return;
    }
    curl_easy_setopt(e, CURLOPT_URL, j->url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, j->body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(e, CURLOPT_PRIVATE, j);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)j->timeout_ms);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (curl_multi_add_handle(t->multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        job_finish(t, j, CURLE_FAILED_INIT, 0);
        job_unref(j);
        return;
    }
    j->easy = e;
    j->next = t->running;
    t->running = j;
}

/* The call of <j> ended: off the running list, handle freed, result published. */
static void end_transfer(lmc_tok_t *t, lmc_tok_job_t *j, CURLcode rc, long status)
{
    for (lmc_tok_job_t **pp = &t->running; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    }
    curl_multi_remove_handle(t->multi, j->easy);
    curl_easy_cleanup(j->easy);
    j->easy = NULL;
    job_finish(t, j, rc, status);
    job_unref(j);
}

static void *tok_main(void *arg)
{
    lmc_tok_t *t = arg;
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    for (;;) {
        lmc_tok_job_t *q;
        CURLMsg *m;
        int running = 0, left = 0, stop;
        pthread_mutex_lock(&t->lock);
        q = t->queue;
        t->queue = NULL;
        stop = t->stop;
        pthread_mutex_unlock(&t->lock);
        while (q != NULL) {
            lmc_tok_job_t *next = q->next;
            start_transfer(t, q, hdrs);
            q = next;
        }
        curl_multi_perform(t->multi, &running);
        while ((m = curl_multi_info_read(t->multi, &left)) != NULL) {
            lmc_tok_job_t *j = NULL;
            long status = 0;
            if (m->msg != CURLMSG_DONE)
                continue;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &status);
            end_transfer(t, j, m->data.result, status);
        }
        if (stop)
            break;
        curl_multi_poll(t->multi, NULL, 0, 1000, NULL);
    }
    /* Shutting down: every call still running fails (its attempt already ended). */
    while (t->running != NULL)
        end_transfer(t, t->running, CURLE_ABORTED_BY_CALLBACK, 0);
    curl_slist_free_all(hdrs);
    return NULL;
}

lmc_tok_t *lmc_tok_create(char *err, size_t errlen)
{
    lmc_tok_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->multi = curl_multi_init();
    if (t->multi == NULL || pthread_create(&t->th, NULL, tok_main, t) != 0) {
        snprintf(err, errlen, "cannot start the tokenize thread");
        if (t->multi)
            curl_multi_cleanup(t->multi);
        pthread_mutex_destroy(&t->lock);
        free(t);
        return NULL;
    }
    t->started = 1;
    return t;
}

void lmc_tok_destroy(lmc_tok_t *t)
{
    lmc_tok_job_t *q;
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_mutex_unlock(&t->lock);
    curl_multi_wakeup(t->multi);
    pthread_join(t->th, NULL);
    q = t->queue; /* queued after the thread's last look: never started */
    while (q != NULL) {
        lmc_tok_job_t *next = q->next;
        job_unref(q);
        q = next;
    }
    curl_multi_cleanup(t->multi);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

lmc_tok_job_t *lmc_tok_start(lmc_tok_t *t, const char *base_url, json_t *body, int64_t timeout_ms,
                             pdgw_fwd_waker_t *waker)
{
    lmc_tok_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        json_decref(body);
        return NULL;
    }
    atomic_init(&j->refs, 2); /* the attempt's and the thread's */
    snprintf(j->url, sizeof(j->url), "%s/tokenize", base_url);
    j->body = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    j->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    j->waker = waker ? pdgw_fwd_waker_ref(waker) : NULL;
    if (j->body == NULL) {
        job_unref(j);
        job_unref(j);
        return NULL;
    }
    pthread_mutex_lock(&t->lock);
    j->next = t->queue;
    t->queue = j;
    pthread_mutex_unlock(&t->lock);
    curl_multi_wakeup(t->multi);
    return j;
}

int lmc_tok_result(lmc_tok_t *t, lmc_tok_job_t *j, json_t **tokens, char *msg, size_t cap)
{
    int st;
    pthread_mutex_lock(&t->lock);
    st = j->state;
    if (st == 1 && tokens)
        *tokens = json_incref(j->tokens);
    if (st < 0 && msg)
        snprintf(msg, cap, "%s", j->msg);
    pthread_mutex_unlock(&t->lock);
    return st;
}

void lmc_tok_release(lmc_tok_job_t *j)
{
    job_unref(j);
}
