/*
 * kvt_flow_delay.c - pull-delay loads: chunks still at the sender are read
 * on demand into a ping-pong of two chunk pools (halves of the pp pool).
 * While group N is being read into one half, group N-1 is copied from the
 * other half into the caller's buffers, so reads overlap the consumer's
 * copy. Each key read counts towards its pull; PullDoneSignal goes out
 * after the last one. One load job runs at a time; others queue.
 */
#include <string.h>

#include "kvt_engine_int.h"

/* Entries [first, first+n) of <job> failed before reaching the wire. */
static void fail_entries(kvt_engine_t *e, kvt_load_job_t *job, uint32_t first, uint32_t n)
{
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t k = 0; k < n; k++) {
        kvt_rent_t *r = job->ents[first + k];
        r->busy = 0;
        r->state = RENT_CONSUMED; /* the key will not be read: counts for the pull */
        kvt_rent_free_locked(e, r);
    }
    pthread_mutex_unlock(&e->rx_lock);
    kvt_engine_count(e, &e->m.transfer_errors_total, 1);
}

/* Post the next group (same sender, at most delay_chunks entries) into
 * <half>. Returns 1 when a group is on the wire, 0 when nothing is left. */
static int post_group(kvt_engine_t *e, kvt_load_job_t *job, uint32_t half)
{
    kvt_tl_xfer_t *x = kvt_calloc(e->delay_chunks, sizeof(*x));

    while (job->next_post < job->n) {
        uint32_t first = job->next_post, n = 0;
        const char *sender;
        kvt_status_t st;

        if (x == NULL) {
            fail_entries(e, job, first, job->n - first);
            job->next_post = job->n;
            break;
        }
        sender = job->ents[first]->pull != NULL ? job->ents[first]->pull->sender_id : NULL;
        while (sender != NULL && first + n < job->n && n < e->delay_chunks) {
            kvt_rent_t *r = job->ents[first + n];
            kvt_page_t pg = half * e->delay_chunks + n;
            uint64_t off;
            if (r->pull == NULL || strcmp(r->pull->sender_id, sender) != 0)
                break;
            if (kvt_engine_region_of(e, e->pp_pool, pg, &x[n].local, &off, NULL) != KVT_OK)
                break;
            x[n].local_offset = off;
            memcpy(x[n].remote_uuid, r->ruuid, KVT_UUID_STR_LEN + 1);
            x[n].remote_offset = r->roff;
            x[n].length = r->len;
            n++;
        }
        if (n == 0) {
            fail_entries(e, job, first, 1);
            job->next_post = first + 1;
            continue;
        }
        job->next_post = first + n;
        st = kvt_engine_post(e, sender, KVT_TL_OP_READ, x, n, kvt_cookie(CK_DELAY_READ, job));
        if (st != KVT_OK) {
            fail_entries(e, job, first, n);
            continue;
        }
        job->inflight_first = first;
        job->inflight_n = n;
        job->inflight_half = half;
        kvt_free(x);
        return 1;
    }
    kvt_free(x);
    return 0;
}

static void job_free(kvt_load_job_t *job)
{
    kvt_free(job->ents);
    kvt_free(job->slot);
    kvt_free(job->bufs);
    kvt_free(job->caps);
    kvt_free(job);
}

static void job_next(kvt_engine_t *e)
{
    while (e->jobs_head != NULL) {
        kvt_load_job_t *job = e->jobs_head;
        job->start_ns = kvt_clock_monotonic_ns();
        job->status = KVT_OK;
        if (post_group(e, job, 0))
            return;
        /* nothing to post at all */
        e->jobs_head = job->next;
        if (e->jobs_head == NULL)
            e->jobs_tail = NULL;
        kvt_task_complete(e, job->task, job->status);
        job_free(job);
    }
}

void kvt_flow_delay_start(kvt_engine_t *e, kvt_load_job_t *job)
{
    int idle = e->jobs_head == NULL;

    job->next = NULL;
    if (e->jobs_tail != NULL)
        e->jobs_tail->next = job;
    else
        e->jobs_head = job;
    e->jobs_tail = job;
    if (idle)
        job_next(e);
}

void kvt_flow_delay_on_read_done(kvt_engine_t *e, kvt_load_job_t *job, kvt_status_t st)
{
    uint32_t first = job->inflight_first, n = job->inflight_n, half = job->inflight_half;
    uint64_t bytes = 0;
    int posted;

    if (st != KVT_OK) {
        kvt_engine_count(e, &e->m.transfer_errors_total, 1);
        if (job->status == KVT_OK)
            job->status = st; /* the bitmap says which chunks arrived; the status says not all */
    }
    /* 1. keep the wire busy: the next group goes into the other half */
    job->inflight_n = 0;
    posted = post_group(e, job, 1 - half);
    /* 2. meanwhile the consumer's copy of the group that landed */
    pthread_mutex_lock(&e->rx_lock);
    for (uint32_t k = 0; k < n; k++) {
        kvt_rent_t *r = job->ents[first + k];
        uint32_t slot = job->slot[first + k];
        if (st == KVT_OK && kvt_pool_read(e->pp_pool, half * e->delay_chunks + k, 0,
                                          job->bufs[slot], r->len) == KVT_OK) {
            kvt_bitmap_set(job->task->bitmap, slot);
            if (job->lens_out != NULL)
                job->lens_out[slot] = r->len;
            bytes += r->len;
        }
        /* read once: the proxy is consumed, its pull counts the key */
        r->busy = 0;
        r->state = RENT_CONSUMED;
        kvt_rent_free_locked(e, r);
    }
    pthread_mutex_unlock(&e->rx_lock);
    if (bytes > 0)
        kvt_engine_count(e, &e->m.bytes_read, bytes);
    if (posted)
        return;
    kvt_engine_observe(e, job->start_ns);
    if (e->jobs_head == job) {
        e->jobs_head = job->next;
        if (e->jobs_head == NULL)
            e->jobs_tail = NULL;
    }
    kvt_task_complete(e, job->task, job->status);
    job_free(job);
    job_next(e);
}

void kvt_flow_delay_fini(kvt_engine_t *e)
{
    while (e->jobs_head != NULL) {
        kvt_load_job_t *job = e->jobs_head;
        e->jobs_head = job->next;
        pthread_mutex_lock(&e->rx_lock);
        for (uint32_t k = 0; k < job->n; k++)
            job->ents[k]->busy = 0;
        pthread_mutex_unlock(&e->rx_lock);
        kvt_task_complete(e, job->task, KVT_ERR_CLOSED);
        job_free(job);
    }
    e->jobs_tail = NULL;
}
