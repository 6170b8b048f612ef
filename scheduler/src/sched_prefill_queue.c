/*
 * sched_prefill_queue.c - the prefill work on an instance, replayed as the engine schedules it.
 *
 * Why a replay and not a fluid queue: engines compute prompts in steps (vLLM's V1 scheduler,
 * vllm/v1/core/sched/scheduler.py; SGLang's chunked prefill): a step takes the waiting
 * prompts first come first served up to a token budget, lasts a fixed cost plus a cost per
 * token it computes, and a prompt's first token comes at the end of the step that computes
 * its last prompt token. A prompt that arrives while a step runs waits for that step, then
 * shares the next one with everything that arrived meanwhile - also what arrived after it.
 * A fluid queue (work ahead / rate) misses both effects and under load predicts too little;
 * replaying the steps from the legs' booking times with the learnt step cost gets them.
 *
 * What the replay knows: the open prefill legs in booking order (tokens to compute, booked
 * when) and an anchor - a time at which a step is known to have ended (a prefill leg answered
 * then) or the engine started from idle. From the anchor on, steps are laid out with the
 * instance's learnt cost (prefill model: seconds per step and per kToken); a leg's predicted
 * answer is the end of the step that computes its last token. When a leg answers, the replay
 * up to that leg's step says how far the others got (the chunks of long prompts), the anchor
 * moves to that moment, and the answer itself is learnt against the replay's steps and tokens
 * since the old anchor (both linear in the step cost: an ordinary least-squares observation).
 *
 * The legs of one instance sit in a small array under a mutex; a prediction copies nothing and
 * walks at most SCHED_PQ_MAX legs for at most PQ_MAX_STEPS steps.
 */
#include <math.h>
#include <string.h>
#include <sys/types.h>

#include "sched_int.h"

/* Steps one replay lays out at most (a prompt of 100k tokens at a budget of 2,048 is 49). */
#define PQ_MAX_STEPS 512
/* The step cost the replay assumes, bounded: a model that learnt nonsense (negative, or
 * absurdly slow) must neither freeze the replay nor make every step free. */
#define PQ_MIN_STEP_S     1e-4
#define PQ_MAX_STEP_S     10.0
#define PQ_MIN_S_PER_KTOK 1e-5
#define PQ_MAX_S_PER_KTOK 10.0

static inline double clampd(double v, double lo, double hi)
{
    return !(v >= lo) ? lo : v > hi ? hi : v;
}

void sched_pq_init(sched_prefill_queue_t *q, uint32_t step_tokens)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    q->step_tokens = step_tokens ? step_tokens : SCHED_PQ_DEFAULT_STEP_TOKENS;
}

void sched_pq_fini(sched_prefill_queue_t *q)
{
    pthread_mutex_destroy(&q->mu);
}

/* The step cost as the instance's prefill model has it now (lock-free read). */
static void step_cost(const sched_instance_t *inst, double *per_step_s, double *per_ktok_s)
{
    const sched_latency_model_t *m = &inst->lat_prefill;
    *per_step_s = clampd(atomic_load_explicit(&m->coef[0], memory_order_relaxed), PQ_MIN_STEP_S,
                         PQ_MAX_STEP_S);
    *per_ktok_s = clampd(atomic_load_explicit(&m->coef[1], memory_order_relaxed), PQ_MIN_S_PER_KTOK,
                         PQ_MAX_S_PER_KTOK);
}

/* The replay's work list: the queue's legs (tokens left, booked when), and for a prediction
 * the leg being predicted, booked now. On the stack: a replay changes no queue. */
typedef struct pq_replay {
    uint32_t left[SCHED_PQ_MAX + 1];
    uint64_t booked[SCHED_PQ_MAX + 1];
    size_t n;
} pq_replay_t;

/* Prompts not booked yet that a prediction expects: arriving at the instance's recent rate
 * from <now_ms> on. */
typedef struct pq_later {
    double now_ms, tokens_per_ms;
} pq_later_t;

/* Time constant of the arrival rate's average. */
#define PQ_RATE_TAU_MS 3000.0

/* The tokens per millisecond booked here lately, at <now_ms> (under q->mu). */
static double arrival_rate(const sched_prefill_queue_t *q, uint64_t now_ms)
{
    double age = now_ms > q->rate_at_ms ? (double)(now_ms - q->rate_at_ms) : 0.0;
    return q->rate_acc * exp(-age / PQ_RATE_TAU_MS) / PQ_RATE_TAU_MS;
}

/*
 * Lay out steps from <start_ms> until leg <target> has no token left. Steps are in
 * milliseconds of the pool's clock (fractional). Fills the steps and tokens laid out since the
 * engine last left idle (out->start_ms) up to and including the target's last one and the
 * time that step ends; the work list is left as it stands after that step (what the other
 * legs still have). False if the target never ends within PQ_MAX_STEPS.
 */
static bool replay_until(pq_replay_t *r, size_t target, double start_ms, uint32_t budget,
                         double per_step_s, double per_ktok_s, const pq_later_t *later,
                         sched_pq_steps_t *out)
{
    double t = start_ms;
    uint64_t tokens = 0;
    uint32_t steps = 0;
    size_t first = 0; /* legs before it have nothing left */

    out->later_tokens = 0;
    while (steps < PQ_MAX_STEPS) {
        uint32_t room = budget, step_tokens = 0;
        size_t i;
        while (first < r->n && r->left[first] == 0)
            first++;
        if (first >= r->n)
            return false;
        /* Idle until the earliest leg with work arrives: the steps are counted from there
         * (an idle gap is no step's cost; learning it as one would inflate the step). */
        if ((double)r->booked[first] > t) {
            double next = (double)r->booked[first];
            for (i = first; i < r->n; i++)
                if (r->left[i] > 0 && (double)r->booked[i] < next)
                    next = (double)r->booked[i];
            if (next > t) {
                t = start_ms = next;
                steps = 0;
                tokens = 0;
            }
        }
        for (i = first; i < r->n && room > 0; i++) {
            uint32_t take;
            if (r->left[i] == 0 || (double)r->booked[i] > t)
                continue;
            take = r->left[i] < room ? r->left[i] : room;
            r->left[i] -= take;
            room -= take;
            step_tokens += take;
        }
        /* The target's last step also takes what arrives until it starts, where the budget
         * leaves room (they queue behind the target, so only its last step has room). */
        if (later && r->left[target] == 0 && room > 0 && t > later->now_ms) {
            double expect = later->tokens_per_ms * (t - later->now_ms);
            uint32_t add = expect < (double)room ? (uint32_t)expect : room;
            step_tokens += add;
            out->later_tokens = add;
        }
        steps++;
        tokens += step_tokens;
        t += (per_step_s + per_ktok_s * (double)step_tokens * 1e-3) * 1e3;
        if (r->left[target] == 0) {
            out->steps = steps;
            out->tokens = tokens;
            out->start_ms = start_ms;
            out->end_ms = t;
            return true;
        }
    }
    return false;
}

static void load_replay(const sched_prefill_queue_t *q, pq_replay_t *r)
{
    r->n = q->n;
    for (size_t i = 0; i < q->n; i++) {
        r->left[i] = q->legs[i].tokens > q->legs[i].done ? q->legs[i].tokens - q->legs[i].done : 0;
        r->booked[i] = q->legs[i].booked_ms;
    }
}

/* The anchor a replay starts from: the queue's, or now when nothing is open (an idle engine
 * starts a step for the leg at once). */
static double anchor_of(const sched_prefill_queue_t *q, uint64_t now_ms)
{
    return q->n > 0 && q->anchor_ms <= now_ms ? (double)q->anchor_ms : (double)now_ms;
}

void sched_pq_predict(const sched_instance_t *inst, uint64_t now_ms, uint64_t tokens,
                      sched_pq_steps_t *out)
{
    sched_prefill_queue_t *q = (sched_prefill_queue_t *)&inst->pq;
    double per_step_s, per_ktok_s;
    pq_replay_t r;
    pq_later_t later;
    uint32_t budget;

    step_cost(inst, &per_step_s, &per_ktok_s);
    pthread_mutex_lock(&q->mu);
    load_replay(q, &r);
    budget = q->step_tokens;
    r.left[r.n] = tokens == 0 ? 1 : tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens;
    r.booked[r.n] = now_ms;
    r.n++;
    later.now_ms = (double)now_ms;
    later.tokens_per_ms = arrival_rate(q, now_ms);
    if (!replay_until(&r, r.n - 1, anchor_of(q, now_ms), budget, per_step_s, per_ktok_s, &later,
                      out)) {
        /* more work than the replay lays out: the whole of it, in budget-sized steps */
        uint64_t all = 0;
        for (size_t i = 0; i < r.n; i++)
            all += r.left[i];
        out->steps = (uint32_t)((all + budget - 1) / budget);
        out->tokens = all;
        out->start_ms = (double)now_ms;
        out->end_ms = (double)now_ms;
        out->later_tokens = 0;
    }
    pthread_mutex_unlock(&q->mu);
    /* the legs queued in the replay ran from the anchor: only what is left of it from now on
     * is this leg's wait */
    out->elapsed_s = ((double)now_ms - out->start_ms) * 1e-3;
    if (out->elapsed_s < 0.0)
        out->elapsed_s = 0.0;
}

uint64_t sched_pq_add(sched_instance_t *inst, uint64_t now_ms, uint64_t tokens)
{
    sched_prefill_queue_t *q = &inst->pq;
    uint32_t t = tokens == 0 ? 1 : tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens;
    uint64_t id;

    pthread_mutex_lock(&q->mu);
    if (++q->next_id == 0) /* never 0: 0 is "not queued" */
        q->next_id = 1;
    id = q->next_id;
    if (q->n == 0)
        q->anchor_ms = now_ms; /* from idle: the engine starts a step for it at once */
    q->rate_acc = arrival_rate(q, now_ms) * PQ_RATE_TAU_MS + t;
    q->rate_at_ms = now_ms;
    if (q->n == SCHED_PQ_MAX) /* full (an overloaded engine): this one is not replayed */
        id = 0;
    else
        q->legs[q->n++] = (sched_pq_leg_t){.id = (uint32_t)id, .booked_ms = now_ms, .tokens = t};
    pthread_mutex_unlock(&q->mu);
    return id;
}

static ssize_t find_leg(const sched_prefill_queue_t *q, uint64_t id)
{
    for (size_t i = 0; i < q->n; i++)
        if (q->legs[i].id == id)
            return (ssize_t)i;
    return -1;
}

static void remove_at(sched_prefill_queue_t *q, size_t i)
{
    memmove(&q->legs[i], &q->legs[i + 1], (q->n - i - 1) * sizeof(q->legs[0]));
    q->n--;
}

sched_pq_answer_t sched_pq_answered(sched_instance_t *inst, uint64_t id, uint64_t now_ms,
                                    uint64_t computed, sched_pq_steps_t *learn)
{
    sched_prefill_queue_t *q = &inst->pq;
    double per_step_s, per_ktok_s;
    pq_replay_t r;
    ssize_t at;
    sched_pq_answer_t ok = SCHED_PQ_SEEN;

    step_cost(inst, &per_step_s, &per_ktok_s);
    pthread_mutex_lock(&q->mu);
    at = find_leg(q, id);
    if (at < 0) {
        pthread_mutex_unlock(&q->mu);
        return SCHED_PQ_ABSENT;
    }
    if (computed > 0) /* the engine said what it computed */
        q->legs[at].tokens = computed > UINT32_MAX ? UINT32_MAX : (uint32_t)computed;
    if (q->legs[at].done > q->legs[at].tokens)
        q->legs[at].done = q->legs[at].tokens;
    load_replay(q, &r);
    if (r.left[at] > 0 && q->anchor_ms <= now_ms &&
        replay_until(&r, (size_t)at, (double)q->anchor_ms, q->step_tokens, per_step_s, per_ktok_s,
                     NULL, learn)) {
        /* the others got as far as the replay says by the end of this leg's step */
        for (size_t i = 0; i < q->n; i++)
            q->legs[i].done = q->legs[i].tokens - r.left[i];
        ok = SCHED_PQ_LEARNT;
    }
    /* A step ended now: the next one starts from here. */
    q->anchor_ms = now_ms;
    remove_at(q, (size_t)at);
    pthread_mutex_unlock(&q->mu);
    return ok;
}

void sched_pq_drop(sched_instance_t *inst, uint64_t id)
{
    sched_prefill_queue_t *q = &inst->pq;
    ssize_t at;

    pthread_mutex_lock(&q->mu);
    at = find_leg(q, id);
    if (at >= 0)
        remove_at(q, (size_t)at);
    pthread_mutex_unlock(&q->mu);
}

uint64_t sched_pq_tokens(const sched_instance_t *inst)
{
    sched_prefill_queue_t *q = (sched_prefill_queue_t *)&inst->pq;
    uint64_t sum = 0;

    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->n; i++)
        sum += q->legs[i].tokens - (q->legs[i].done < q->legs[i].tokens ? q->legs[i].done : 0);
    pthread_mutex_unlock(&q->mu);
    return sum;
}
