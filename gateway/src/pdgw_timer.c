/*
 * pdgw_timer.c - the per-worker timer heap (pdgw_timer.h).
 */
#include "pdgw_timer.h"

#include <string.h>

#include "pdgw_alloc.h"

void pdgw_timers_init(pdgw_timers_t *h)
{
    memset(h, 0, sizeof(*h));
}

void pdgw_timers_free(pdgw_timers_t *h)
{
    /* The timers themselves are not touched: their owners may be gone already. */
    pdgw_free(h->v);
    memset(h, 0, sizeof(*h));
}

void pdgw_timer_init(pdgw_timer_t *t, pdgw_timer_fn fn)
{
    memset(t, 0, sizeof(*t));
    t->idx = PDGW_TIMER_IDLE;
    t->fn = fn;
}

static bool before(const pdgw_timer_t *a, const pdgw_timer_t *b)
{
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
}

static void put(pdgw_timers_t *h, size_t i, pdgw_timer_t *t)
{
    h->v[i] = t;
    t->idx = i;
}

static void sift_up(pdgw_timers_t *h, size_t i)
{
    pdgw_timer_t *t = h->v[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(t, h->v[p]))
            break;
        put(h, i, h->v[p]);
        i = p;
    }
    put(h, i, t);
}

static void sift_down(pdgw_timers_t *h, size_t i)
{
    pdgw_timer_t *t = h->v[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const pdgw_timer_t *best = t;
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

void pdgw_timer_cancel(pdgw_timers_t *h, pdgw_timer_t *t)
{
    size_t i = t->idx;
    pdgw_timer_t *last;
    if (i == PDGW_TIMER_IDLE)
        return;
    t->idx = PDGW_TIMER_IDLE;
    last = h->v[--h->n];
    if (last == t)
        return;
    put(h, i, last);
    if (i > 0 && before(last, h->v[(i - 1) / 2]))
        sift_up(h, i);
    else
        sift_down(h, i);
}

pdgw_status_t pdgw_timer_arm(pdgw_timers_t *h, pdgw_timer_t *t, uint64_t due_ms)
{
    pdgw_timer_cancel(h, t);
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 256;
        pdgw_timer_t **n = pdgw_realloc(h->v, cap * sizeof(*n));
        if (n == NULL)
            return PDGW_ERR_NOMEM;
        h->v = n;
        h->cap = cap;
    }
    t->due_ms = due_ms;
    t->seq = ++h->seq;
    put(h, h->n++, t);
    sift_up(h, t->idx);
    return PDGW_OK;
}

pdgw_status_t pdgw_timer_arm_earlier(pdgw_timers_t *h, pdgw_timer_t *t, uint64_t due_ms)
{
    if (pdgw_timer_armed(t) && t->due_ms <= due_ms)
        return PDGW_OK;
    return pdgw_timer_arm(h, t, due_ms);
}

int64_t pdgw_timers_next(const pdgw_timers_t *h)
{
    return h->n > 0 ? (int64_t)h->v[0]->due_ms : -1;
}

size_t pdgw_timers_run(pdgw_timers_t *h, uint64_t now_ms)
{
    size_t ran = 0;
    while (h->n > 0 && h->v[0]->due_ms <= now_ms) {
        pdgw_timer_t *t = h->v[0];
        pdgw_timer_cancel(h, t);
        ran++;
        if (t->fn)
            t->fn(t, now_ms);
    }
    return ran;
}
