/*
 * pdgw_fwd_api.c - the services the gateway exports to forwarders (forwarder.h): body
 * helpers, errors, the cross-thread waker, logging and counters.
 */
#include "pdgw_server_int.h"
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"
#include "pdb/pdb_clock.h"
#include "pdb/pdb_map.h"

/* ---------------------------------------------------------------- names */

int64_t pdgw_fwd_now_ms(void)
{
    return (int64_t)pdb_clock_mono_ms();
}

int64_t pdgw_fwd_wall_ms(void)
{
    return (int64_t)(pdb_clock_real_ns() / PDB_NSEC_PER_MSEC);
}

const char *pdgw_fwd_role_name(pdgw_fwd_role_t role)
{
    switch (role) {
    case PDGW_FWD_ROLE_PREFILL:
        return "prefill";
    case PDGW_FWD_ROLE_DECODE:
        return "decode";
    default:
        return "both";
    }
}

const char *pdgw_fwd_strerror(pdgw_fwd_status_t status)
{
    switch (status) {
    case PDGW_FWD_OK:
        return "ok";
    case PDGW_FWD_PENDING:
        return "pending";
    case PDGW_FWD_ERR:
        return "forwarder error";
    case PDGW_FWD_ERR_CONFIG:
        return "bad forwarder configuration";
    default:
        return "unknown forwarder status";
    }
}

/* ---------------------------------------------------------------- bodies */

json_t *pdgw_fwd_body_copy(const pdgw_fwd_request_t *req)
{
    return req->body ? json_deep_copy(req->body) : json_object();
}

/* A new top-level object over the client body's member values: a leg body that only sets
 * or deletes members costs the members table, not a copy of the prompt. */
json_t *pdgw_fwd_body_shared(const pdgw_fwd_request_t *req)
{
    if (req->body == NULL)
        return json_object();
    return json_is_object(req->body) ? json_copy((json_t *)req->body) : NULL;
}

json_t *pdgw_fwd_body_harden_prefill(json_t *b)
{
    if (b == NULL || !json_is_object(b)) {
        json_decref(b);
        return NULL;
    }
    json_object_set_new(b, "max_tokens", json_integer(1));
    if (json_object_get(b, "max_completion_tokens"))
        json_object_set_new(b, "max_completion_tokens", json_integer(1));
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
    json_object_del(b, "min_tokens");
    json_object_del(b, "min_completion_tokens");
    /* A single prefill token that is EOS or a stop string would end the request as
     * "stopped" and engines then return no kv_transfer_params. */
    json_object_set_new(b, "ignore_eos", json_true());
    json_object_del(b, "stop");
    json_object_del(b, "stop_token_ids");
    return b;
}

json_t *pdgw_fwd_body_prefill(const pdgw_fwd_request_t *req)
{
    return pdgw_fwd_body_harden_prefill(pdgw_fwd_body_copy(req));
}

void pdgw_fwd_error_set(pdgw_fwd_error_t *err, pdgw_phase_t phase, int retryable, int http_status,
                        const char *fmt, ...)
{
    va_list ap;
    if (err == NULL)
        return;
    err->phase = phase;
    err->retryable = retryable;
    err->http_status = http_status;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

json_t *pdgw_fwd_option_value(const char *text)
{
    char *end = NULL;
    long long v;
    if (text == NULL)
        return json_null();
    if (strcmp(text, "true") == 0)
        return json_true();
    if (strcmp(text, "false") == 0)
        return json_false();
    if (text[0] != '\0') {
        errno = 0;
        v = strtoll(text, &end, 10);
        if (errno == 0 && end && *end == '\0')
            return json_integer((json_int_t)v);
    }
    return json_string(text);
}

/* ---------------------------------------------------------------- waker */

pdgw_fwd_waker_t *pdgw_waker_create(pdgw_worker_t *w, pdgw_wf_t *wf, void (*on_wake)(pdgw_wf_t *wf))
{
    pdgw_fwd_waker_t *wk = pdgw_calloc(1, sizeof(*wk));
    if (wk == NULL)
        return NULL;
    atomic_init(&wk->refs, 1);
    pthread_mutex_init(&wk->lock, NULL);
    wk->worker = w;
    wk->wf = wf;
    wk->on_wake = on_wake;
    return wk;
}

pdgw_fwd_waker_t *pdgw_fwd_waker_ref(pdgw_fwd_waker_t *w)
{
    if (w)
        atomic_fetch_add(&w->refs, 1);
    return w;
}

void pdgw_fwd_waker_unref(pdgw_fwd_waker_t *w)
{
    if (w == NULL)
        return;
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        pthread_mutex_destroy(&w->lock);
        pdgw_free(w);
    }
}

void pdgw_fwd_waker_wake(pdgw_fwd_waker_t *wk)
{
    pdgw_worker_t *write_to = NULL; /* another thread's worker: its eventfd */
    uint64_t one = 1;
    if (wk == NULL)
        return;
    /* Queued under wk->lock: the worker detaches every waker (taking this lock) before it
     * closes its eventfd. The eventfd is written after the lock is dropped, so a worker that
     * wakes at once does not block on it; wake_writers keeps the descriptor open meanwhile. */
    pthread_mutex_lock(&wk->lock);
    if (wk->wf != NULL && !wk->queued) {
        pdgw_worker_t *w = wk->worker;
        wk->queued = true;
        atomic_fetch_add(&wk->refs, 1); /* the queue's reference */
        pthread_mutex_lock(&w->wake_lock);
        wk->next = w->wake_queue;
        w->wake_queue = wk;
        pthread_mutex_unlock(&w->wake_lock);
        if (pdgw_this_worker == w) { /* its loop runs the queue before it waits again */
            w->wake_local = true;
        } else {
            write_to = w;
            atomic_fetch_add(&w->wake_writers, 1);
        }
    }
    pthread_mutex_unlock(&wk->lock);
    if (write_to == NULL)
        return;
    if (write(write_to->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        pdgw_log_warn("waker", "eventfd write: %s", strerror(errno));
    atomic_fetch_sub(&write_to->wake_writers, 1);
}

void pdgw_waker_detach(pdgw_fwd_waker_t *wk)
{
    pthread_mutex_lock(&wk->lock);
    wk->wf = NULL;
    pthread_mutex_unlock(&wk->lock);
    pdgw_fwd_waker_unref(wk);
}

void pdgw_waker_run_queue(pdgw_worker_t *w)
{
    pdgw_fwd_waker_t *list;
    pthread_mutex_lock(&w->wake_lock);
    list = w->wake_queue;
    w->wake_queue = NULL;
    pthread_mutex_unlock(&w->wake_lock);
    while (list) {
        pdgw_fwd_waker_t *wk = list;
        pdgw_wf_t *wf;
        list = wk->next;
        pthread_mutex_lock(&wk->lock);
        wk->queued = false;
        wk->next = NULL;
        wf = wk->wf;
        pthread_mutex_unlock(&wk->lock);
        /* The workflow can only end on this thread, so wf stays valid during the call. */
        if (wf)
            wk->on_wake(wf);
        pdgw_fwd_waker_unref(wk);
    }
}

void pdgw_waker_drop_queue(pdgw_worker_t *w)
{
    pdgw_fwd_waker_t *list;
    pthread_mutex_lock(&w->wake_lock);
    list = w->wake_queue;
    w->wake_queue = NULL;
    pthread_mutex_unlock(&w->wake_lock);
    while (list) {
        pdgw_fwd_waker_t *wk = list;
        list = wk->next;
        pthread_mutex_lock(&wk->lock);
        wk->queued = false;
        wk->next = NULL;
        pthread_mutex_unlock(&wk->lock);
        pdgw_fwd_waker_unref(wk);
    }
}

/* ---------------------------------------------------------------- log, counters */

void pdgw_fwd_log(pdgw_fwd_log_level_t level, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    pdgw_log_level_t l = level == PDGW_FWD_LOG_DEBUG  ? PDGW_LOG_LEVEL_DEBUG
                         : level == PDGW_FWD_LOG_INFO ? PDGW_LOG_LEVEL_INFO
                         : level == PDGW_FWD_LOG_WARN ? PDGW_LOG_LEVEL_WARN
                                                      : PDGW_LOG_LEVEL_ERROR;
    if (!pdgw_log_enabled(l))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pdgw_log_write(l, "forwarder", "%s", msg);
}

/* Forwarder counters live in the registry of the running server (set by its creator). */
static pdgw_metrics_t *fwd_metrics_reg;
static pdgw_gateway_metrics_t *fwd_gm;
static sched_pool_t *fwd_pool;
static pthread_mutex_t fwd_metrics_lock = PTHREAD_MUTEX_INITIALIZER;
/* The families of forwarder counters by short name (fwd_metrics_lock held): a counter is
 * bumped on every request of some flows, and finding its family by full name in the registry
 * walks every family. Emptied whenever the registry is set. */
static pdb_map_t fwd_fams;

void pdgw_fwd_api_set_services(pdgw_gateway_metrics_t *gm, sched_pool_t *pool)
{
    pthread_mutex_lock(&fwd_metrics_lock);
    pdb_map_fini(&fwd_fams, NULL); /* a new registry may sit at the old address */
    fwd_gm = gm;
    fwd_metrics_reg = gm ? gm->reg : NULL;
    fwd_pool = pool;
    pthread_mutex_unlock(&fwd_metrics_lock);
}

void pdgw_fwd_prefill_missing_kv_params(const char *protocol)
{
    pthread_mutex_lock(&fwd_metrics_lock);
    if (fwd_gm && protocol)
        pdgw_gateway_metrics_prefill_missing_kv_params(fwd_gm, protocol);
    pthread_mutex_unlock(&fwd_metrics_lock);
}

void pdgw_fwd_cancel_notif_sent(const char *protocol)
{
    pthread_mutex_lock(&fwd_metrics_lock);
    if (fwd_gm && protocol)
        pdgw_gateway_metrics_cancel_notif(fwd_gm, protocol);
    pthread_mutex_unlock(&fwd_metrics_lock);
}

void pdgw_fwd_instance_set_kv_free_chunks(const pdgw_instance_t *inst, int64_t free_chunks)
{
    sched_instance_t *si = NULL;
    if (inst == NULL || inst->id == NULL || free_chunks < 0)
        return;
    pthread_mutex_lock(&fwd_metrics_lock);
    if (fwd_pool)
        si = sched_pool_get(fwd_pool, inst->id); /* new reference */
    pthread_mutex_unlock(&fwd_metrics_lock);
    if (si) {
        sched_instance_set_kv_free_chunks(si, (uint64_t)free_chunks);
        sched_instance_unref(si);
    }
}

static pdgw_metric_family_t *fwd_family_locked(const char *name, const char *help,
                                               const char *const *labels, size_t n_labels)
{
    char full[160];
    pdgw_metric_family_t *fam = pdb_map_get(&fwd_fams, name);
    if (fam != NULL)
        return fam;
    snprintf(full, sizeof(full), "pdgw_fwd_%s_total", name);
    fam = pdgw_metrics_family_find(fwd_metrics_reg, full);
    if (fam == NULL && pdgw_metrics_family_add(fwd_metrics_reg, PDGW_METRIC_COUNTER, full,
                                               help ? help : "Forwarder event count.", labels,
                                               n_labels, NULL, 0, &fam) != PDGW_OK)
        fam = pdgw_metrics_family_find(fwd_metrics_reg, full);
    /* Without memory for the map the family is just looked up again next time. */
    if (fam != NULL && (fwd_fams.buckets != NULL || pdb_map_init(&fwd_fams, 16) == PDB_OK))
        (void)pdb_map_put(&fwd_fams, name, fam);
    return fam;
}

void pdgw_fwd_counter_inc_reason(const char *protocol, const char *name, const char *help,
                                 const char *reason)
{
    pdgw_metric_family_t *fam;
    static const char *const labels[] = {"protocol", "reason"};
    pthread_mutex_lock(&fwd_metrics_lock);
    if (fwd_metrics_reg == NULL || name == NULL || protocol == NULL || reason == NULL) {
        pthread_mutex_unlock(&fwd_metrics_lock);
        return;
    }
    fam = fwd_family_locked(name, help, labels, 2);
    pthread_mutex_unlock(&fwd_metrics_lock);
    if (fam)
        pdgw_counter_inc(pdgw_metric_family_series2(fam, protocol, reason));
}

void pdgw_fwd_counter_inc(const char *protocol, const char *name, const char *help)
{
    pdgw_metric_family_t *fam;
    static const char *const labels[] = {"protocol"};
    pthread_mutex_lock(&fwd_metrics_lock);
    if (fwd_metrics_reg == NULL || name == NULL || protocol == NULL) {
        pthread_mutex_unlock(&fwd_metrics_lock);
        return;
    }
    fam = fwd_family_locked(name, help, labels, 1);
    pthread_mutex_unlock(&fwd_metrics_lock);
    if (fam)
        pdgw_counter_inc(pdgw_metric_family_series1(fam, protocol));
}

void pdgw_instance_view_from_sched(pdgw_instance_t *v, sched_instance_t *si)
{
    const sched_instance_desc_t *d = sched_instance_desc(si);
    memset(v, 0, sizeof(*v));
    v->id = d->id ? d->id : "";
    v->url = sched_instance_url(si);
    v->host = d->host ? d->host : "";
    v->port = d->port;
    v->role = d->role == SCHED_ROLE_PREFILL  ? PDGW_FWD_ROLE_PREFILL
              : d->role == SCHED_ROLE_DECODE ? PDGW_FWD_ROLE_DECODE
                                             : PDGW_FWD_ROLE_BOTH;
    v->zone = d->zone ? d->zone : "";
    v->kv_host = d->kv_host && d->kv_host[0] ? d->kv_host : v->host;
    v->kv_port = d->kv_port;
    v->bootstrap_port = d->bootstrap_port;
    v->engine_id = d->engine_id ? d->engine_id : "";
    v->alloc_ports = d->alloc_ports;
    v->n_alloc_ports = d->n_alloc_ports;
    v->init_ports = d->init_ports;
    v->n_init_ports = d->n_init_ports;
    v->tp_size = d->tp_size > 0 ? d->tp_size : 1;
    v->dp_rank = d->dp_rank;
    v->dp_size = d->dp_size > 0 ? d->dp_size : 1;
    v->weight = (int)d->weight;
    v->kv_engine =
        d->kv_engine == SCHED_KV_ENGINE_LIBKVT ? PDGW_KV_ENGINE_LIBKVT : PDGW_KV_ENGINE_UPSTREAM;
    v->attrs = d->attrs ? d->attrs : "";
}
