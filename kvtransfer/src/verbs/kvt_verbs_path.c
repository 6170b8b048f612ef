/*
 * Paths: the QPs of one peer connection. Slices are queued on healthy paths in
 * round-robin order, leave the queue only while the path has credits (bounded
 * outstanding WRs), and come back here on completion. A completion error marks
 * the path failed: its queue moves to the other paths and the failed slice is
 * retried elsewhere until it used up retry_limit attempts or no path is left,
 * then it is abandoned and its transfer fails. Callers hold the connection's
 * lock.
 */
#include <string.h>

#include "kvt_verbs_int.h"

void kvt_verbs_paths_init(kvt_verbs_paths_t *p, uint32_t npaths, uint32_t max_outstanding,
                          uint32_t retry_limit)
{
    memset(p, 0, sizeof(*p));
    if (npaths == 0)
        npaths = 1;
    if (npaths > KVT_VERBS_MAX_QPS)
        npaths = KVT_VERBS_MAX_QPS;
    p->npaths = npaths;
    p->max_outstanding = max_outstanding == 0 ? 1 : max_outstanding;
    p->retry_limit = retry_limit;
}

uint32_t kvt_verbs_paths_healthy(const kvt_verbs_paths_t *p)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < p->npaths; i++)
        n += !p->path[i].failed;
    return n;
}

int kvt_verbs_paths_pick(kvt_verbs_paths_t *p)
{
    for (uint32_t k = 0; k < p->npaths; k++) {
        uint32_t i = (p->rr + k) % p->npaths;

        if (!p->path[i].failed) {
            p->rr = (i + 1) % p->npaths;
            return (int)i;
        }
    }
    return -1;
}

static void path_push(kvt_verbs_path_t *q, kvt_verbs_slice_t *s)
{
    s->next = NULL;
    if (q->tail != NULL)
        q->tail->next = s;
    else
        q->head = s;
    q->tail = s;
    q->queued++;
}

kvt_status_t kvt_verbs_paths_enqueue(kvt_verbs_paths_t *p, kvt_verbs_slice_t *s)
{
    int i = kvt_verbs_paths_pick(p);

    if (i < 0)
        return KVT_ERR_IO;
    s->qp = (int8_t)i;
    s->state = KVT_VERBS_SLICE_QUEUED;
    path_push(&p->path[i], s);
    return KVT_OK;
}

size_t kvt_verbs_paths_take(kvt_verbs_paths_t *p, uint32_t path, size_t max,
                            kvt_verbs_slice_t **out)
{
    kvt_verbs_path_t *q;
    size_t n = 0;

    if (path >= p->npaths)
        return 0;
    q = &p->path[path];
    if (q->failed)
        return 0;
    while (n < max && q->head != NULL && q->outstanding < p->max_outstanding) {
        kvt_verbs_slice_t *s = q->head;

        q->head = s->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->queued--;
        s->next = NULL;
        s->state = KVT_VERBS_SLICE_POSTED;
        q->outstanding++;
        q->posted_total++;
        out[n++] = s;
    }
    return n;
}

/* Re-queue one slice elsewhere or abandon it. */
static void abandon(kvt_verbs_slice_t *s, kvt_verbs_slice_t **abandoned)
{
    s->state = KVT_VERBS_SLICE_ABANDONED;
    s->qp = -1;
    s->next = *abandoned;
    *abandoned = s;
}

/* Re-queue one slice elsewhere or abandon it; true when re-queued. */
static bool requeue_or_abandon(kvt_verbs_paths_t *p, kvt_verbs_slice_t *s,
                               kvt_verbs_slice_t **abandoned)
{
    if (kvt_verbs_paths_enqueue(p, s) == KVT_OK)
        return true;
    abandon(s, abandoned);
    return false;
}

void kvt_verbs_paths_fail(kvt_verbs_paths_t *p, uint32_t path, kvt_verbs_slice_t **abandoned)
{
    kvt_verbs_path_t *q;
    kvt_verbs_slice_t *s;

    if (path >= p->npaths)
        return;
    q = &p->path[path];
    q->failed = true;
    s = q->head;
    q->head = q->tail = NULL;
    q->queued = 0;
    while (s != NULL) {
        kvt_verbs_slice_t *next = s->next;

        requeue_or_abandon(p, s, abandoned);
        s = next;
    }
}

void kvt_verbs_paths_unpost(kvt_verbs_paths_t *p, uint32_t path, kvt_verbs_slice_t *const *s,
                            size_t n, kvt_verbs_slice_t **abandoned)
{
    kvt_verbs_path_t *q;

    if (path >= p->npaths)
        return;
    q = &p->path[path];
    q->outstanding -= (n > q->outstanding) ? q->outstanding : (uint32_t)n;
    kvt_verbs_paths_fail(p, path, abandoned);
    for (size_t i = 0; i < n; i++)
        requeue_or_abandon(p, s[i], abandoned);
}

kvt_verbs_wc_action_t kvt_verbs_paths_complete(kvt_verbs_paths_t *p, kvt_verbs_slice_t *s, bool ok,
                                               bool flushed, kvt_verbs_slice_t **abandoned)
{
    if (s->qp >= 0 && (uint32_t)s->qp < p->npaths && p->path[s->qp].outstanding > 0)
        p->path[s->qp].outstanding--;
    if (ok) {
        s->state = KVT_VERBS_SLICE_DONE;
        return KVT_VERBS_WC_DONE;
    }
    if (s->qp >= 0 && !p->path[s->qp].failed)
        kvt_verbs_paths_fail(p, (uint32_t)s->qp, abandoned);
    if (!flushed)
        s->attempts++;
    if (s->attempts > p->retry_limit) {
        abandon(s, abandoned);
        return KVT_VERBS_WC_ABANDONED;
    }
    return requeue_or_abandon(p, s, abandoned) ? KVT_VERBS_WC_RETRY : KVT_VERBS_WC_ABANDONED;
}

bool kvt_verbs_xfer_account(kvt_verbs_xfer_t *x, kvt_verbs_slice_t *s, kvt_status_t err)
{
    if (s->state == KVT_VERBS_SLICE_DONE) {
        x->done++;
        x->bytes_done += s->len;
    } else {
        x->abandoned++;
        if (x->status == KVT_OK)
            x->status = err;
    }
    return x->done + x->abandoned == x->nslices;
}
