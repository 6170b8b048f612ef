/*
 * kvt_task.c - the async task API: ids, completion through the eventfd,
 * harvesting (poll / wait) and result bitmaps.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvt_engine_int.h"

static void id_key(kvt_task_id_t id, char out[24])
{
    snprintf(out, 24, "%llu", (unsigned long long)id);
}

kvt_task_t *kvt_task_new(kvt_engine_t *e, kvt_task_kind_t kind, uint32_t nkeys, void *user)
{
    kvt_task_t *t = kvt_calloc(1, sizeof(*t));
    char k[24];

    if (t == NULL)
        return NULL;
    t->bitmap = kvt_calloc(kvt_bitmap_bytes(nkeys) + 1, 1);
    if (t->bitmap == NULL) {
        kvt_free(t);
        return NULL;
    }
    t->kind = kind;
    t->nkeys = nkeys;
    t->user = user;
    t->start_ns = kvt_engine_now(e);
    pthread_mutex_lock(&e->lock);
    t->id = ++e->next_id;
    id_key(t->id, k);
    if (kvt_map_put(&e->tasks, k, t) != KVT_OK) {
        pthread_mutex_unlock(&e->lock);
        kvt_free(t->bitmap);
        kvt_free(t);
        return NULL;
    }
    pthread_mutex_unlock(&e->lock);
    return t;
}

static void signal_event(kvt_engine_t *e)
{
    uint64_t one = 1;
    if (write(e->event_fd, &one, sizeof(one)) < 0) {
        /* eventfd counter saturated: it is readable anyway */
    }
}

void kvt_task_complete(kvt_engine_t *e, kvt_task_t *t, kvt_status_t st)
{
    pthread_mutex_lock(&e->lock);
    if (t->done) {
        pthread_mutex_unlock(&e->lock);
        return;
    }
    t->done = 1;
    t->status = st;
    t->next = NULL;
    t->prev = e->done_tail;
    if (e->done_tail != NULL)
        e->done_tail->next = t;
    else
        e->done_head = t;
    e->done_tail = t;
    pthread_cond_broadcast(&e->task_cond);
    pthread_mutex_unlock(&e->lock);
    signal_event(e);
}

static void harvest_locked(kvt_engine_t *e, kvt_task_t *t, kvt_task_result_t *out)
{
    char k[24];

    /* t is done, so it is on the done list */
    if (t->prev != NULL)
        t->prev->next = t->next;
    else
        e->done_head = t->next;
    if (t->next != NULL)
        t->next->prev = t->prev;
    else
        e->done_tail = t->prev;
    id_key(t->id, k);
    kvt_map_del(&e->tasks, k);
    out->id = t->id;
    out->kind = t->kind;
    out->status = t->status;
    out->nkeys = t->nkeys;
    out->bitmap = t->bitmap;
    out->user = t->user;
    kvt_free(t);
}

int kvt_engine_event_fd(const kvt_engine_t *e)
{
    return e != NULL ? e->event_fd : -1;
}

size_t kvt_task_poll(kvt_engine_t *e, kvt_task_result_t *out, size_t max)
{
    uint64_t v;
    size_t n = 0;
    int more;

    if (e == NULL || out == NULL)
        return 0;
    if (read(e->event_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing signalled, results may still be queued */
    }
    pthread_mutex_lock(&e->lock);
    while (n < max && e->done_head != NULL) {
        kvt_task_t *t = e->done_head;
        harvest_locked(e, t, &out[n++]);
    }
    more = e->done_head != NULL;
    pthread_mutex_unlock(&e->lock);
    if (more)
        signal_event(e);
    return n;
}

kvt_status_t kvt_task_wait(kvt_engine_t *e, kvt_task_id_t id, int timeout_ms,
                           kvt_task_result_t *out)
{
    struct timespec ts;
    char k[24];
    kvt_task_t *t;

    if (e == NULL || out == NULL || id == 0)
        return KVT_ERR_INVALID;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_ms >= 0) {
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    id_key(id, k);
    pthread_mutex_lock(&e->lock);
    for (;;) {
        t = kvt_map_get(&e->tasks, k);
        if (t == NULL) {
            pthread_mutex_unlock(&e->lock);
            return KVT_ERR_NOT_FOUND;
        }
        if (t->done)
            break;
        if (timeout_ms < 0) {
            pthread_cond_wait(&e->task_cond, &e->lock);
        } else if (pthread_cond_timedwait(&e->task_cond, &e->lock, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&e->lock);
            return KVT_ERR_TIMEOUT;
        }
    }
    harvest_locked(e, t, out);
    pthread_mutex_unlock(&e->lock);
    return KVT_OK;
}

void kvt_task_result_clear(kvt_task_result_t *r)
{
    if (r == NULL)
        return;
    kvt_free(r->bitmap);
    memset(r, 0, sizeof(*r));
}

static void free_task(void *arg, const char *key, void *val)
{
    kvt_task_t *t = val;
    (void)arg;
    (void)key;
    kvt_free(t->bitmap);
    kvt_free(t);
}

void kvt_task_fini(kvt_engine_t *e)
{
    kvt_map_each(&e->tasks, free_task, NULL);
    kvt_map_fini(&e->tasks);
    e->done_head = e->done_tail = NULL;
}
