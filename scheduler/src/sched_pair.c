/*
 * sched_pair.c - the KV handoff of each (prefill, decode) pair.
 *
 * A decode's handoff model (lat_handoff: fixed cost, KV tokens, its running batch) carries
 * the law every pair shares; what differs between pairs is the path the KV takes (a slower
 * link or NIC on one prefill, another rack), and that is a factor on the decode's
 * prediction, learnt per pair. Why a factor and not a model per pair: pairs are many (P x D)
 * and each is seen a fraction of the decode's legs, so a pair fit would stay cold; one
 * number per pair is learnt from a handful of legs. The decode's model learns each leg
 * divided by its pair's factor, so it describes the decode's typical path and the factors
 * the deviations from it (their product is what a pick predicts).
 *
 * Memory is bounded: SCHED_PAIR_SLOTS prefills per decode, the least recently seen one
 * replaced. Readers (every pick) take no lock: a slot's prefill uid is its sequence word
 * (0 while the slot is rewritten).
 */
#include <math.h>

#include "sched_int.h"

/* Legs a pair's factor needs before it applies in full (it is shrunk toward 1 before). */
#define PAIR_SHRINK 1.0
/* Step of the factor's running mean of ln(actual / the decode's prediction), after the
 * first few legs (which average). */
#define PAIR_STEP      0.25
#define PAIR_LOG_BOUND 2.08 /* ln 8: a factor stays within [1/8, 8] */

void sched_pair_table_init(sched_pair_table_t *t)
{
    pthread_mutex_init(&t->mu, NULL);
    for (unsigned i = 0; i < SCHED_PAIR_SLOTS; i++) {
        atomic_init(&t->slot[i].prefill_uid, 0);
        atomic_init(&t->slot[i].factor, 1.0);
        t->slot[i].log_factor = 0.0;
        t->slot[i].n = 0;
        t->slot[i].seen_ms = 0;
    }
}

void sched_pair_table_fini(sched_pair_table_t *t)
{
    pthread_mutex_destroy(&t->mu);
}

/* The factor as applied: shrunk toward 1 while few legs said it. */
static double applied(double log_factor, uint32_t n)
{
    return exp(log_factor * (double)n / ((double)n + PAIR_SHRINK));
}

/* The factor in slot <s> if it still holds <uid> (read after its uid matched), else 1. */
static double slot_factor(const sched_pair_slot_t *s, uint64_t uid)
{
    double f = atomic_load_explicit(&s->factor, memory_order_relaxed);

    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->prefill_uid, memory_order_relaxed) != uid)
        return 1.0; /* rewritten meanwhile: another prefill's now */
    return f;
}

double sched_pair_factor(const sched_pair_table_t *t, uint64_t prefill_uid)
{
    double f = 1.0;

    sched_pair_factors(t, &prefill_uid, 1, &f);
    return f;
}

void sched_pair_factors(const sched_pair_table_t *t, const uint64_t *prefill_uids, size_t n,
                        double *out)
{
    for (size_t k = 0; k < n; k++)
        out[k] = 1.0;
    /* one pass over the slots for all of them: a pick asks a decode of its few best prefills */
    for (unsigned i = 0; i < SCHED_PAIR_SLOTS; i++) {
        const sched_pair_slot_t *s = &t->slot[i];
        uint64_t u = atomic_load_explicit(&s->prefill_uid, memory_order_acquire);
        if (u == 0)
            continue;
        for (size_t k = 0; k < n; k++) {
            if (prefill_uids[k] == u)
                out[k] = slot_factor(s, u);
        }
    }
}

/* The slot of <uid>, or the one to give it: an empty one, else the least recently seen
 * (under t->mu). */
static sched_pair_slot_t *slot_for(sched_pair_table_t *t, uint64_t uid, bool *fresh)
{
    sched_pair_slot_t *empty = NULL, *oldest = NULL;

    for (unsigned i = 0; i < SCHED_PAIR_SLOTS; i++) {
        sched_pair_slot_t *s = &t->slot[i];
        uint64_t u = atomic_load_explicit(&s->prefill_uid, memory_order_relaxed);
        if (u == uid) {
            *fresh = false;
            return s;
        }
        if (u == 0 && empty == NULL)
            empty = s;
        else if (u != 0 && (oldest == NULL || s->seen_ms < oldest->seen_ms))
            oldest = s;
    }
    *fresh = true;
    return empty ? empty : oldest;
}

void sched_handoff_predict(const sched_instance_t *decode, uint64_t prefill_uid, const double *x,
                           sched_prediction_t *out)
{
    double f;

    sched_latency_model_predict(&decode->lat_handoff, x, out);
    f = sched_pair_factor(&decode->pairs, prefill_uid);
    out->mean *= f;
    out->upper *= f;
}

void sched_handoff_observe(sched_instance_t *decode, uint64_t prefill_uid, const double *x,
                           double seconds, uint64_t now_ms)
{
    sched_pair_table_t *t = &decode->pairs;
    sched_prediction_t d;
    sched_pair_slot_t *s;
    double f, r;
    bool fresh;

    if (!(seconds > 0.0) || !isfinite(seconds))
        return;
    if (prefill_uid == 0) { /* no pair known: the decode's model alone */
        sched_latency_model_observe(&decode->lat_handoff, x, seconds);
        return;
    }
    pthread_mutex_lock(&t->mu);
    sched_latency_model_predict(&decode->lat_handoff, x, &d);
    f = sched_pair_factor(t, prefill_uid);
    /* scored as the pair was predicted; learnt as if over the decode's typical path */
    sched_latency_model_observe_scored(&decode->lat_handoff, x, seconds / f, d.mean * f, seconds);
    /* A factor says how this pair differs from a model that has learnt: while the decode's
     * model is cold, its error is its priors', not the pair's. */
    if (d.observed >= SCHED_PREDICT_SCORED_AFTER && d.mean > 1e-4) {
        r = log(seconds / d.mean);
        r = r > PAIR_LOG_BOUND ? PAIR_LOG_BOUND : r < -PAIR_LOG_BOUND ? -PAIR_LOG_BOUND : r;
        s = slot_for(t, prefill_uid, &fresh);
        if (fresh) {
            atomic_store_explicit(&s->prefill_uid, 0, memory_order_relaxed);
            atomic_thread_fence(memory_order_release);
            s->log_factor = r;
            s->n = 1;
            atomic_store_explicit(&s->factor, applied(r, 1), memory_order_relaxed);
            atomic_store_explicit(&s->prefill_uid, prefill_uid, memory_order_release);
        } else {
            double step = s->n < 4 ? 1.0 / (double)(s->n + 1) : PAIR_STEP;
            s->log_factor += step * (r - s->log_factor);
            s->n += s->n < UINT32_MAX;
            atomic_store_explicit(&s->factor, applied(s->log_factor, s->n), memory_order_relaxed);
        }
        s->seen_ms = now_ms;
    }
    pthread_mutex_unlock(&t->mu);
}
