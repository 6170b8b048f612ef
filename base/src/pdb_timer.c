/*
 * pdb_timer.c - the timer heap (pdb_timer.h).
 */
#include "pdb/pdb_timer.h"

#include <string.h>

#include "pdb/pdb_alloc.h"

void pdb_timers_init(pdb_timers_t *h)
{
    memset(h, 0, sizeof(*h));
}

void pdb_timers_free(pdb_timers_t *h)
{
    /* The timers themselves are not touched: their owners may be gone already. */
    pdb_free(h->v);
    memset(h, 0, sizeof(*h));
}

pdb_status_t pdb_timers_reserve(pdb_timers_t *h, size_t n)
{
    size_t cap = h->cap ? h->cap : 16;
    pdb_timer_t **v;

    if (n <= h->cap)
        return PDB_OK;
    while (cap < n)
        cap *= 2;
    v = pdb_realloc(h->v, cap * sizeof(*v));
    if (v == NULL)
        return PDB_ERR_NOMEM;
    h->v = v;
    h->cap = cap;
    return PDB_OK;
}

void pdb_timer_init(pdb_timer_t *t, pdb_timer_fn fn, void *arg)
{
    memset(t, 0, sizeof(*t));
    t->idx = PDB_TIMER_IDLE;
    t->fn = fn;
    t->arg = arg;
}

static bool before(const pdb_timer_t *a, const pdb_timer_t *b)
{
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void put(pdb_timers_t *h, size_t i, pdb_timer_t *t)
{
    h->v[i] = t;
    t->idx = i;
}

static void sift_up(pdb_timers_t *h, size_t i)
{
    pdb_timer_t *t = h->v[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(t, h->v[p]))
            break;
        put(h, i, h->v[p]);
        i = p;
    }
    put(h, i, t);
}

static void sift_down(pdb_timers_t *h, size_t i)
{
    pdb_timer_t *t = h->v[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const pdb_timer_t *best = t;
        if (l < h->n && before(h->v[l], best)) {
            m = l;
            best = h->v[l];
        }
        if (l + 1 < h->n && before(h->v[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        put(h, i, h->v[m]);
        i = m;
    }
    put(h, i, t);
}

void pdb_timer_cancel(pdb_timers_t *h, pdb_timer_t *t)
{
    size_t i = t->idx;
    pdb_timer_t *last;
    if (i == PDB_TIMER_IDLE)
        return;
    t->idx = PDB_TIMER_IDLE;
    last = h->v[--h->n];
    if (last == t)
        return;
    put(h, i, last);
    if (i > 0 && before(last, h->v[(i - 1) / 2]))
        sift_up(h, i);
    else
        sift_down(h, i);
}

pdb_status_t pdb_timer_arm(pdb_timers_t *h, pdb_timer_t *t, uint64_t due)
{
    pdb_timer_cancel(h, t);
    if (h->n == h->cap && pdb_timers_reserve(h, h->cap ? 2 * h->cap : 256) != PDB_OK)
        return PDB_ERR_NOMEM;
    t->due = due;
    t->seq = ++h->seq;
    put(h, h->n++, t);
    sift_up(h, t->idx);
    return PDB_OK;
}

pdb_status_t pdb_timer_arm_earlier(pdb_timers_t *h, pdb_timer_t *t, uint64_t due)
{
    if (pdb_timer_armed(t) && t->due <= due)
        return PDB_OK;
    return pdb_timer_arm(h, t, due);
}

int64_t pdb_timers_next(const pdb_timers_t *h)
{
    if (h->n == 0)
        return -1;
    return h->v[0]->due > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)h->v[0]->due;
}

size_t pdb_timers_run(pdb_timers_t *h, uint64_t now)
{
    size_t ran = 0;
    while (h->n > 0 && h->v[0]->due <= now) {
        pdb_timer_t *t = h->v[0];
        pdb_timer_cancel(h, t);
        ran++;
        if (t->fn)
            t->fn(t, now);
    }
    return ran;
}
