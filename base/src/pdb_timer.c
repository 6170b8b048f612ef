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
    pdb_timer_slot_t *v;

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

static bool before(const pdb_timer_slot_t *a, const pdb_timer_slot_t *b)
{
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void put(pdb_timers_t *h, size_t i, const pdb_timer_slot_t *s)
{
    h->v[i] = *s;
    s->t->idx = i;
}

static void sift_up(pdb_timers_t *h, size_t i, pdb_timer_slot_t s)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&s, &h->v[p]))
            break;
        put(h, i, &h->v[p]);
        i = p;
    }
    put(h, i, &s);
}

static void sift_down(pdb_timers_t *h, size_t i, pdb_timer_slot_t s)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const pdb_timer_slot_t *best = &s;
        if (l < h->n && before(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (l + 1 < h->n && before(&h->v[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        put(h, i, &h->v[m]);
        i = m;
    }
    put(h, i, &s);
}

/* Put <s> at slot <i> (whose old entry is gone) and move it to where it belongs. */
static void settle(pdb_timers_t *h, size_t i, pdb_timer_slot_t s)
{
    if (i > 0 && before(&s, &h->v[(i - 1) / 2]))
        sift_up(h, i, s);
    else
        sift_down(h, i, s);
}

void pdb_timer_cancel(pdb_timers_t *h, pdb_timer_t *t)
{
    size_t i = t->idx;
    if (i == PDB_TIMER_IDLE)
        return;
    t->idx = PDB_TIMER_IDLE;
    if (i == --h->n)
        return;
    settle(h, i, h->v[h->n]);
}

pdb_status_t pdb_timer_arm(pdb_timers_t *h, pdb_timer_t *t, uint64_t due)
{
    pdb_timer_slot_t s;
    s.due = due;
    s.seq = ++h->seq;
    s.t = t;
    if (t->idx != PDB_TIMER_IDLE) {
        /* armed already: its slot takes the new key (a re-arm is one sift, not two) */
        t->due = due;
        t->seq = s.seq;
        settle(h, t->idx, s);
        return PDB_OK;
    }
    if (h->n == h->cap && pdb_timers_reserve(h, h->cap ? 2 * h->cap : 256) != PDB_OK)
        return PDB_ERR_NOMEM;
    t->due = due;
    t->seq = s.seq;
    sift_up(h, h->n++, s);
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
    return h->v[0].due > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)h->v[0].due;
}

size_t pdb_timers_run(pdb_timers_t *h, uint64_t now)
{
    size_t ran = 0;
    while (h->n > 0 && h->v[0].due <= now) {
        pdb_timer_t *t = h->v[0].t;
        pdb_timer_cancel(h, t);
        ran++;
        if (t->fn)
            t->fn(t, now);
    }
    return ran;
}
