/*
 * sched_backlog.c - the prefill work still ahead on an instance, as a fluid queue.
 *
 * Why not the prompt tokens of the open legs: an engine computes prompts first come first
 * served in steps of a token budget (vLLM's chunked prefill), so what delays a new prompt is
 * the part of the earlier ones not yet computed. A leg that has almost finished still counts
 * whole among the open legs, and how much of the open work is done depends on when each
 * leg came: the same count means a short wait or a long one. The fluid queue tracks the
 * remainder instead: each booking adds its tokens, and the queue drains at the instance's
 * learnt rate (its prefill model's seconds per token). Two facts anchor the estimate: it
 * never exceeds the open legs' tokens, and when a leg ends, the work ahead of it is done and
 * what was booked after it remains (first come first served): the queue restarts from there.
 *
 * The state is one atomic word (tokens << 32 | the clock's milliseconds, wrapping), updated
 * by compare-and-swap: predictions read it without a lock.
 */
#include "sched_int.h"

#define BACKLOG_MAX_TOKENS 0xffffffffu
/* Seconds per thousand tokens the drain assumes, bounded: a model that learnt nonsense
 * (negative, or absurdly slow) must not freeze or empty the queue. */
#define DRAIN_MIN_S_PER_KTOKEN 1e-4
#define DRAIN_MAX_S_PER_KTOKEN 10.0

static inline uint64_t pack(uint64_t tokens, uint64_t now_ms)
{
    if (tokens > BACKLOG_MAX_TOKENS)
        tokens = BACKLOG_MAX_TOKENS;
    return tokens << 32 | (now_ms & 0xffffffffu);
}

/* Seconds the instance takes per thousand prompt tokens, as its model has it: the slope of
 * the tokens it computes (its own and the ones ahead). Not the queue's own correction term:
 * that one is learnt against this very estimate, and draining by it would let a queue the
 * estimate missed teach the drain to be faster still. */
static double drain_s_per_ktoken(const sched_instance_t *inst)
{
    const sched_latency_model_t *m = &inst->lat_prefill;
    double s = atomic_load_explicit(&m->coef[1], memory_order_relaxed);

    if (!(s >= DRAIN_MIN_S_PER_KTOKEN))
        s = s > 0.0 ? DRAIN_MIN_S_PER_KTOKEN : sched_phase_prior(SCHED_PHASE_PREFILL)[1];
    return s > DRAIN_MAX_S_PER_KTOKEN ? DRAIN_MAX_S_PER_KTOKEN : s;
}

/* The fluid remainder of <state> at <now_ms>. */
static uint64_t drained(const sched_instance_t *inst, uint64_t state, uint64_t now_ms)
{
    uint64_t tokens = state >> 32;
    uint32_t elapsed_ms = (uint32_t)now_ms - (uint32_t)state; /* modulo 2^32 */
    double done;

    if (tokens == 0 || elapsed_ms == 0)
        return tokens;
    done = (double)elapsed_ms / drain_s_per_ktoken(inst); /* ms / (s per ktoken) = tokens */
    return done >= (double)tokens ? 0 : tokens - (uint64_t)done;
}

uint64_t sched_backlog_tokens(const sched_instance_t *inst, uint64_t now_ms)
{
    uint64_t left =
        drained(inst, atomic_load_explicit(&inst->backlog, memory_order_relaxed), now_ms);
    uint64_t open = atomic_load_explicit(&inst->prompt_tokens, memory_order_relaxed);

    return left < open ? left : open;
}

uint64_t sched_backlog_add(sched_instance_t *inst, uint64_t now_ms, uint64_t tokens)
{
    uint64_t cur = atomic_load_explicit(&inst->backlog, memory_order_relaxed);

    while (!atomic_compare_exchange_weak_explicit(&inst->backlog, &cur,
                                                  pack(drained(inst, cur, now_ms) + tokens, now_ms),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    return atomic_fetch_add_explicit(&inst->backlog_booked, tokens, memory_order_relaxed) + tokens;
}

void sched_backlog_leg_done(sched_instance_t *inst, uint64_t now_ms, uint64_t booked_through)
{
    /* First come first served: what was booked before this leg is computed, and what was
     * booked after it is what is left (less what finished out of order or was given up:
     * the open legs bound it when read). Set, not only bounded: a drain that ran too fast
     * is corrected here too. */
    uint64_t after =
        atomic_load_explicit(&inst->backlog_booked, memory_order_relaxed) - booked_through;

    atomic_store_explicit(&inst->backlog, pack(after, now_ms), memory_order_relaxed);
}
