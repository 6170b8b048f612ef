/*
 * pdgw_admit.c - the admission controller (see pdgw_admit.h): slots, the wait queue, the
 * per-key token buckets and their metrics, under one mutex.
 */
#include "pdgw_admit.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_auth.h"

#include "pdgw_rate_limit.h"

#define RATE_TABLE_KEYS 4096

enum { CLASS_HIGH = 0, CLASS_NORMAL, CLASS_LOW, N_CLASSES };
static const char *const class_names[N_CLASSES] = {"high", "normal", "low"};

struct pdgw_admit {
    pthread_mutex_t lock;
    pdgw_admit_limits_t limits;
    unsigned inflight;
    pdgw_admit_queue_t queue;
    size_t depth[N_CLASSES];
    pdgw_rate_table_t *rates;
    pdgw_admit_stats_t stats;
    /* metrics (NULL without a registry) */
    pdgw_metric_t *m_depth[N_CLASSES];
    pdgw_metric_t *m_inflight;
    pdgw_metric_family_t *f_wait;
    pdgw_metric_family_t *f_refused;
    pdgw_metric_t *m_cancelled;
    pdgw_metric_family_t *f_admitted;
};

static int class_of(int64_t priority)
{
    return priority < 0 ? CLASS_HIGH : priority == 0 ? CLASS_NORMAL : CLASS_LOW;
}

/* ---------------------------------------------------------------- limits */

void pdgw_admit_limits_init(pdgw_admit_limits_t *l)
{
    memset(l, 0, sizeof(*l));
    l->queue_size = 100;
    l->queue_timeout_ms = 60000;
    l->retry_backoff_base_ms = 100;
    l->retry_backoff_max_ms = 5000;
}

void pdgw_admit_limits_free(pdgw_admit_limits_t *l)
{
    size_t i;
    for (i = 0; i < l->n_keys; i++)
        pdgw_free(l->keys[i].key);
    pdgw_free(l->keys);
    l->keys = NULL;
    l->n_keys = 0;
}

static pdgw_status_t limits_copy(pdgw_admit_limits_t *dst, const pdgw_admit_limits_t *src)
{
    size_t i;
    *dst = *src;
    dst->keys = NULL;
    dst->n_keys = 0;
    if (src->n_keys == 0)
        return PDGW_OK;
    dst->keys = pdgw_calloc(src->n_keys, sizeof(*dst->keys));
    if (dst->keys == NULL)
        return PDGW_ERR_NOMEM;
    for (i = 0; i < src->n_keys; i++) {
        dst->keys[i] = src->keys[i];
        dst->keys[i].key = pdgw_strdup(src->keys[i].key);
        if (dst->keys[i].key == NULL) {
            dst->n_keys = i;
            pdgw_admit_limits_free(dst);
            return PDGW_ERR_NOMEM;
        }
        dst->n_keys = i + 1;
    }
    return PDGW_OK;
}

pdgw_status_t pdgw_affinity_parse(const char *text, pdgw_affinity_mode_t *mode, char *header,
                                  size_t header_len)
{
    size_t i, n;
    if (text == NULL || text[0] == '\0' || strcmp(text, "none") == 0) {
        *mode = PDGW_AFFINITY_NONE;
        return PDGW_OK;
    }
    if (strcmp(text, "user") == 0) {
        *mode = PDGW_AFFINITY_USER;
        return PDGW_OK;
    }
    if (strncmp(text, "header:", 7) != 0)
        return PDGW_ERR_PARSE;
    n = strlen(text + 7);
    if (n == 0 || n >= header_len)
        return PDGW_ERR_PARSE;
    for (i = 0; i < n; i++) {
        char c = text[7 + i];
        /* an HTTP token (RFC 9110 5.6.2), letters, digits and - _ . being what names use */
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return PDGW_ERR_PARSE;
    }
    memcpy(header, text + 7, n + 1);
    *mode = PDGW_AFFINITY_HEADER;
    return PDGW_OK;
}

/* ---------------------------------------------------------------- create / destroy */

static void metrics_init(pdgw_admit_t *a, pdgw_metrics_t *reg)
{
    static const double wait_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60,   120};
    const char *prio[] = {"priority"}, *outcome[] = {"outcome"}, *reason[] = {"reason"},
               *path[] = {"path"};
    pdgw_metric_family_t *f = NULL;
    int c;
    if (reg == NULL)
        return;
    if (pdgw_metrics_family_add(reg, PDGW_METRIC_GAUGE, "pdgw_admission_queue_depth",
                                "Requests waiting for admission, by priority class (high < 0, "
                                "normal = 0, low > 0)",
                                prio, 1, NULL, 0, &f) == PDGW_OK)
        for (c = 0; c < N_CLASSES; c++)
            a->m_depth[c] = pdgw_metric_family_series1(f, class_names[c]);
    a->m_inflight = pdgw_metrics_gauge_new(reg, "pdgw_admission_inflight",
                                           "Requests holding an admission slot");
    (void)pdgw_metrics_family_add(reg, PDGW_METRIC_HISTOGRAM, "pdgw_admission_wait_seconds",
                                  "Time spent in the admission queue, by how the wait ended "
                                  "(admitted, timeout, cancelled)",
                                  outcome, 1, wait_buckets,
                                  sizeof(wait_buckets) / sizeof(wait_buckets[0]), &a->f_wait);
    (void)pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_admission_refused_total",
                                  "Requests refused with 429 by admission control, by reason "
                                  "(queue_full, rate_limited, queue_timeout)",
                                  reason, 1, NULL, 0, &a->f_refused);
    a->m_cancelled = pdgw_metrics_counter_new(
        reg, "pdgw_admission_cancelled_total",
        "Queued requests whose client left before admission (their place freed at once)");
    (void)pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_admission_admitted_total",
                                  "Requests admitted, directly or after queueing", path, 1, NULL, 0,
                                  &a->f_admitted);
    /* Series up front so rate() and dashboards see zeros from the first scrape. */
    pdgw_metric_family_series1(a->f_refused, "queue_full");
    pdgw_metric_family_series1(a->f_refused, "rate_limited");
    pdgw_metric_family_series1(a->f_refused, "queue_timeout");
    pdgw_metric_family_series1(a->f_admitted, "direct");
    pdgw_metric_family_series1(a->f_admitted, "queued");
}

pdgw_status_t pdgw_admit_create(const pdgw_admit_limits_t *limits, pdgw_metrics_t *reg,
                                pdgw_admit_t **out)
{
    pdgw_admit_t *a = pdgw_calloc(1, sizeof(*a));
    if (a == NULL)
        return PDGW_ERR_NOMEM;
    if (limits_copy(&a->limits, limits) != PDGW_OK)
        goto err_free;
    if (pdgw_rate_table_create(RATE_TABLE_KEYS, &a->rates) != PDGW_OK)
        goto err_limits;
    pthread_mutex_init(&a->lock, NULL);
    pdgw_admit_queue_init(&a->queue);
    metrics_init(a, reg);
    *out = a;
    return PDGW_OK;

err_limits:
    pdgw_admit_limits_free(&a->limits);
err_free:
    pdgw_free(a);
    return PDGW_ERR_NOMEM;
}

void pdgw_admit_destroy(pdgw_admit_t *a)
{
    if (a == NULL)
        return;
    pdgw_admit_queue_fini(&a->queue);
    pdgw_rate_table_destroy(a->rates);
    pdgw_admit_limits_free(&a->limits);
    pthread_mutex_destroy(&a->lock);
    pdgw_free(a);
}

void pdgw_admit_ticket_init(pdgw_admit_ticket_t *t)
{
    memset(t, 0, sizeof(*t));
    t->waiter.idx = PDGW_ADMIT_NOT_QUEUED;
    t->waiter.deadline_ms = UINT64_MAX;
    t->state = PDGW_TICKET_IDLE;
}

/* ---------------------------------------------------------------- internals (locked) */

static void note_depth(pdgw_admit_t *a, int64_t priority, int delta)
{
    int c = class_of(priority);
    a->depth[c] = (size_t)((long)a->depth[c] + delta);
    pdgw_gauge_set(a->m_depth[c], (double)a->depth[c]);
    a->stats.queued = pdgw_admit_queue_len(&a->queue);
}

static void observe_wait(pdgw_admit_t *a, const pdgw_admit_ticket_t *t, const char *outcome,
                         uint64_t now_ms)
{
    double s = now_ms > t->t_queued_ms ? (double)(now_ms - t->t_queued_ms) / 1e3 : 0.0;
    pdgw_histogram_observe(pdgw_metric_family_series1(a->f_wait, outcome), s);
}

static bool slot_free(const pdgw_admit_t *a)
{
    return a->limits.max_concurrent == 0 || a->inflight < a->limits.max_concurrent;
}

static void take_slot(pdgw_admit_t *a)
{
    a->inflight++;
    a->stats.inflight = a->inflight;
    pdgw_gauge_set(a->m_inflight, (double)a->inflight);
}

/* Hand free slots to the most urgent waiters. */
static void grant_waiters(pdgw_admit_t *a, uint64_t now_ms)
{
    while (slot_free(a) && pdgw_admit_queue_len(&a->queue) > 0) {
        pdgw_admit_ticket_t *t = (pdgw_admit_ticket_t *)pdgw_admit_queue_pop(&a->queue);
        note_depth(a, t->waiter.priority, -1);
        take_slot(a);
        t->state = PDGW_TICKET_HELD;
        a->stats.granted++;
        pdgw_counter_inc(pdgw_metric_family_series1(a->f_admitted, "queued"));
        observe_wait(a, t, "admitted", now_ms);
        if (t->on_grant)
            t->on_grant(t->grant_arg);
    }
}

static void refuse(pdgw_admit_t *a, const char *reason)
{
    pdgw_counter_inc(pdgw_metric_family_series1(a->f_refused, reason));
}

/* Rate and burst for <key>: its override, else the default. */
static void key_rate(const pdgw_admit_t *a, const char *key, size_t key_len, double *rate,
                     double *burst)
{
    size_t i;
    *rate = a->limits.rate;
    *burst = a->limits.burst;
    if (key == NULL)
        return;
    for (i = 0; i < a->limits.n_keys; i++) {
        const pdgw_admit_key_limit_t *k = &a->limits.keys[i];
        if (strlen(k->key) == key_len && pdgw_ct_memeq(k->key, key, key_len)) {
            *rate = k->rate;
            *burst = k->burst;
            return;
        }
    }
}

/* ---------------------------------------------------------------- API */

pdgw_status_t pdgw_admit_set_limits(pdgw_admit_t *a, const pdgw_admit_limits_t *limits,
                                    uint64_t now_ms)
{
    pdgw_admit_limits_t copy;
    if (limits_copy(&copy, limits) != PDGW_OK)
        return PDGW_ERR_NOMEM;
    pthread_mutex_lock(&a->lock);
    pdgw_admit_limits_free(&a->limits);
    a->limits = copy;
    grant_waiters(a, now_ms);
    pthread_mutex_unlock(&a->lock);
    return PDGW_OK;
}

void pdgw_admit_get_path_limits(pdgw_admit_t *a, pdgw_admit_limits_t *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->limits;
    out->keys = NULL;
    out->n_keys = 0;
    pthread_mutex_unlock(&a->lock);
}

pdgw_admit_result_t pdgw_admit_enter(pdgw_admit_t *a, pdgw_admit_ticket_t *t, const char *key,
                                     size_t key_len, uint64_t now_ms, uint64_t deadline_cap_ms,
                                     void (*on_grant)(void *arg), void *arg,
                                     uint64_t *retry_after_ms)
{
    pdgw_admit_result_t res;
    double rate, burst;
    uint64_t wait = 0;

    pthread_mutex_lock(&a->lock);
    key_rate(a, key, key_len, &rate, &burst);
    if (rate > 0 &&
        !pdgw_rate_table_take(a->rates, pdgw_rate_key_hash(key ? key : "", key ? key_len : 0), rate,
                              burst, now_ms, &wait)) {
        a->stats.rate_limited++;
        refuse(a, "rate_limited");
        *retry_after_ms = wait;
        res = PDGW_ADMIT_RATE_LIMITED;
        goto out;
    }
    /* A free slot goes to a newcomer only when nobody waits for it (FIFO). */
    if (slot_free(a) && pdgw_admit_queue_len(&a->queue) == 0) {
        take_slot(a);
        t->state = PDGW_TICKET_HELD;
        a->stats.admitted++;
        pdgw_counter_inc(pdgw_metric_family_series1(a->f_admitted, "direct"));
        res = PDGW_ADMIT_ADMITTED;
        goto out;
    }
    if (pdgw_admit_queue_len(&a->queue) >= a->limits.queue_size) {
        a->stats.queue_full++;
        refuse(a, "queue_full");
        /* Nothing says when a place frees: a second, as SGLang's clients back off. */
        *retry_after_ms = 1000;
        res = PDGW_ADMIT_QUEUE_FULL;
        goto out;
    }
    t->on_grant = on_grant;
    t->grant_arg = arg;
    t->t_queued_ms = now_ms;
    t->was_queued = true;
    t->deadline_ms = now_ms + a->limits.queue_timeout_ms;
    if (deadline_cap_ms != 0 && deadline_cap_ms < t->deadline_ms)
        t->deadline_ms = deadline_cap_ms;
    if (pdgw_admit_queue_push(&a->queue, &t->waiter) != PDGW_OK) {
        res = PDGW_ADMIT_NOMEM;
        goto out;
    }
    t->state = PDGW_TICKET_QUEUED;
    note_depth(a, t->waiter.priority, +1);
    res = PDGW_ADMIT_QUEUED;
out:
    pthread_mutex_unlock(&a->lock);
    return res;
}

bool pdgw_admit_expire(pdgw_admit_t *a, pdgw_admit_ticket_t *t, uint64_t now_ms)
{
    bool expired = false;
    pthread_mutex_lock(&a->lock);
    if (t->state == PDGW_TICKET_QUEUED && now_ms >= t->deadline_ms &&
        pdgw_admit_queue_remove(&a->queue, &t->waiter)) {
        note_depth(a, t->waiter.priority, -1);
        t->state = PDGW_TICKET_DONE;
        a->stats.timed_out++;
        refuse(a, "queue_timeout");
        observe_wait(a, t, "timeout", now_ms);
        expired = true;
    }
    pthread_mutex_unlock(&a->lock);
    return expired;
}

pdgw_ticket_state_t pdgw_admit_leave(pdgw_admit_t *a, pdgw_admit_ticket_t *t, uint64_t now_ms)
{
    pdgw_ticket_state_t was;
    pthread_mutex_lock(&a->lock);
    was = t->state;
    switch (t->state) {
    case PDGW_TICKET_QUEUED:
        if (pdgw_admit_queue_remove(&a->queue, &t->waiter))
            note_depth(a, t->waiter.priority, -1);
        a->stats.cancelled++;
        pdgw_counter_inc(a->m_cancelled);
        observe_wait(a, t, "cancelled", now_ms);
        break;
    case PDGW_TICKET_HELD:
        a->inflight--;
        a->stats.inflight = a->inflight;
        pdgw_gauge_set(a->m_inflight, (double)a->inflight);
        grant_waiters(a, now_ms);
        break;
    default:
        break;
    }
    t->state = PDGW_TICKET_DONE;
    pthread_mutex_unlock(&a->lock);
    return was;
}

pdgw_ticket_state_t pdgw_admit_ticket_state(pdgw_admit_t *a, const pdgw_admit_ticket_t *t)
{
    pdgw_ticket_state_t s;
    pthread_mutex_lock(&a->lock);
    s = t->state;
    pthread_mutex_unlock(&a->lock);
    return s;
}

void pdgw_admit_stats(pdgw_admit_t *a, pdgw_admit_stats_t *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->stats;
    out->inflight = a->inflight;
    out->queued = pdgw_admit_queue_len(&a->queue);
    pthread_mutex_unlock(&a->lock);
}
