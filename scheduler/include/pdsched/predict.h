/*
 * predict.h - online latency models, learned from what the gateway itself observes.
 *
 * Model family: a linear model y = theta . x over a few scaled features, fitted by recursive
 * least squares with exponential forgetting. Why this one: an engine computes prompts in
 * steps, each a fixed cost plus a cost per token it computes, so the time from a known step
 * boundary to a prompt's first token is linear in the steps and the tokens laid out until
 * then (the replay of the engine's first-come-first-served steps,
 * scheduler/src/sched_prefill_queue.c, says how many); the time per output token grows with
 * the running batch and its KV tokens. Those are linear in a handful of features, so a
 * few-coefficient fit captures them; RLS updates in O(d^2) (16 multiply-adds) without storing
 * samples, and forgetting makes it follow an instance that slows down. Forgetting alone is slow on
 * a step (after 50 requests of a 2.5x slower instance the fit is still a fifth off), so a
 * persistent bias of the residuals (a quarter of the actual, on average over the last few) reopens
 * the covariance and the fit relearns in a dozen observations. A robust weight keeps one outlier (a
 * request that sat in a retry) from dragging the fit, and a bound on the covariance's trace keeps a
 * fit fed the same feature values over and over from winding up.
 *
 * On top of the mean the model tracks its spread: an online estimate of a quantile (p90 by
 * default) of actual / predicted, so a caller can ask "how long, at the 90th percentile",
 * and the mean relative error of its predictions, exported as the prediction error.
 *
 * Threads: observations (request ends) serialise on the model's mutex; predictions (every
 * pick, over every candidate) read coefficients published through a sequence counter, with
 * no lock and no write.
 */
#ifndef PDSCHED_PREDICT_H
#define PDSCHED_PREDICT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SCHED_FIT_MAX_DIM 4
/* Observations a model takes before its predictions are scored for its error (a cold
 * model predicts from its priors). */
#define SCHED_PREDICT_SCORED_AFTER 8

/* A recursive-least-squares fit. Not thread-safe on its own (sched_latency_model_t is). */
typedef struct sched_fit {
    unsigned dim;
    double forget;    /* per observation, (0, 1]: 0.98 remembers ~50 observations */
    double prior_var; /* the covariance's starting diagonal; also the bound on its trace */
    double theta[SCHED_FIT_MAX_DIM];
    double p[SCHED_FIT_MAX_DIM][SCHED_FIT_MAX_DIM];
    double prior_diag[SCHED_FIT_MAX_DIM]; /* each coefficient's starting variance */
    double abs_err;       /* running mean |residual|: the scale of the robust weight */
    double bias;          /* running mean of residual / actual: a persistent one is a change */
    uint64_t n;           /* observations taken */
    uint64_t since_reset; /* observations since the covariance was last reopened */
} sched_fit_t;

/* Start at <prior> (dim coefficients) with variance <prior_var> on each (larger = the first
 * observations move it more). <dim> in 1..SCHED_FIT_MAX_DIM; <forget> in (0, 1]. */
void sched_fit_init(sched_fit_t *f, unsigned dim, const double *prior, double prior_var,
                    double forget);
/* Take one observation: features <x> (dim values), outcome <y>. */
/* How far coefficient <i> may move from its prior: its own starting variance instead of
 * prior_var (small = it stays near the prior until much evidence says otherwise). */
void sched_fit_set_prior_var(sched_fit_t *f, unsigned i, double var);
void sched_fit_observe(sched_fit_t *f, const double *x, double y);
double sched_fit_predict(const sched_fit_t *f, const double *x);
/* One observation of a sum, y = a.xa + b.xb, where only the sum was seen (a whole answer: its
 * first token's time and its later tokens' together): one least-squares step of both fits,
 * each by its share of their joint uncertainty. */
void sched_fit_observe_sum(sched_fit_t *a, const double *xa, sched_fit_t *b, const double *xb,
                           double y);

/* The phases pdgw predicts. */
typedef enum sched_phase {
    SCHED_PHASE_PREFILL = 0,  /* a prefill leg: send -> its answer (queue + compute) */
    SCHED_PHASE_TPOT = 1,     /* a decode's mean time between output tokens */
    SCHED_PHASE_TRANSFER = 2, /* a PD decode leg to its first token: the KV handoff */
    SCHED_PHASE_COUNT
} sched_phase_t;

/* Features of each phase, scaled so that typical values are of order 1 (a well-conditioned
 * fit with one prior variance for all). */
#define SCHED_PREFILL_DIM 2 /* engine steps, kTokens they compute (the replay's) */
#define SCHED_TPOT_DIM    3 /* 1, running requests / 16, KV kTokens running / 10 */
/* 1, kTokens of the prompt (the KV handed over), requests running on the decode / 16 (its
 * first step after the KV lands is a step of that batch) */
#define SCHED_TRANSFER_DIM 3
void sched_prefill_features(double x[SCHED_PREFILL_DIM], uint32_t steps, uint64_t tokens);
void sched_tpot_features(double x[SCHED_TPOT_DIM], uint32_t running, uint64_t kv_tokens);
void sched_transfer_features(double x[SCHED_TRANSFER_DIM], uint64_t prompt_tokens,
                             uint32_t running);

/* The priors a cold instance starts from (seconds), before it has been observed: a prefill
 * step of 20 ms + 0.1 ms per token it computes, 12 ms per output token
 * at an empty batch, a KV handoff (transfer and the decode's first step) of 5 ms + 10 ms per
 * kToken + 3 ms per 16 running requests. Deliberately rough: with the prior
 * variance the first few observations replace them. */
const double *sched_phase_prior(sched_phase_t phase);
unsigned sched_phase_dim(sched_phase_t phase);

/* One instance's (or pair's) model of one phase. */
typedef struct sched_latency_model {
    /* Published after every observation, read without the lock: one cache line, the only
     * one a prediction touches. */
    _Alignas(64) _Atomic uint32_t seq; /* odd while a write is in progress */
    unsigned dim;
    _Atomic double coef[SCHED_FIT_MAX_DIM];
    _Atomic double spread; /* exp(q_log): multiply a mean prediction by it */
    _Atomic double err;    /* rel_err */
    _Atomic uint64_t observed;
    /* The writers' side. */
    pthread_mutex_t mu;
    sched_fit_t fit; /* under mu */
    double q_log;    /* under mu: the tracked quantile of ln(actual / predicted) */
    double quantile; /* which: 0.9 */
    double rel_err;  /* under mu: mean |actual - predicted| / actual (exponential) */
    uint64_t scored; /* under mu: predictions scored into rel_err */
} sched_latency_model_t;

/* <prior>: dim coefficients (NULL = the phase's own, sched_phase_prior). */
void sched_latency_model_init(sched_latency_model_t *m, sched_phase_t phase, const double *prior);
void sched_latency_model_fini(sched_latency_model_t *m);
/* Start a cold model from another's coefficients (a new instance of a model starts where
 * its peers are), keeping its own prior variance. */
void sched_latency_model_seed(sched_latency_model_t *m, const sched_latency_model_t *from);
/* One observation: the prediction it had is scored (error, spread), then the fit learns. */
void sched_latency_model_observe(sched_latency_model_t *m, const double *x, double seconds);
/* The same where what was predicted and what is learnt differ: the prediction made before
 * (<predicted> for what took <actual> seconds; <predicted> <= 0: not scored) is scored, and
 * the fit learns <x> -> <y> (the prefill: scored on the leg's wait as booked, learnt on the
 * replay's steps in hindsight). */
void sched_latency_model_observe_scored(sched_latency_model_t *m, const double *x, double y,
                                        double predicted, double actual);

/* The same on two models of one instance (<a> the first token's, <b> the TPOT model with its
 * features times the later tokens): learnt, not scored (neither phase was seen alone). */
void sched_latency_model_observe_sum(sched_latency_model_t *a, const double *xa,
                                     sched_latency_model_t *b, const double *xb, double seconds);

typedef struct sched_prediction {
    double mean;  /* seconds; never below 0 */
    double upper; /* mean x spread: the tracked quantile */
    double err;   /* the model's mean relative error (NaN until a warm prediction was scored) */
    uint64_t observed;
} sched_prediction_t;

/* Lock-free; a few nanoseconds (inline: the slo policy asks it of every candidate). */
static inline void sched_latency_model_predict(const sched_latency_model_t *m, const double *x,
                                               sched_prediction_t *out)
{
    double mean, spread, err;
    uint64_t n;
    uint32_t s0, s1;

    do {
        s0 = atomic_load_explicit(&m->seq, memory_order_acquire);
        mean = 0.0;
        for (unsigned i = 0; i < m->dim; i++)
            mean += atomic_load_explicit(&m->coef[i], memory_order_relaxed) * x[i];
        spread = atomic_load_explicit(&m->spread, memory_order_relaxed);
        err = atomic_load_explicit(&m->err, memory_order_relaxed);
        n = atomic_load_explicit(&m->observed, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        s1 = atomic_load_explicit(&m->seq, memory_order_relaxed);
    } while ((s0 & 1u) != 0 || s0 != s1);
    if (!(mean > 0.0))
        mean = 0.0;
    out->mean = mean;
    out->upper = mean * spread;
    out->err = err;
    out->observed = n;
}

/* Move a prediction by <by_s> seconds (the part of a replay already run), never below
 * <floor_s>; the spread scales the result. */
static inline void sched_prediction_shift(sched_prediction_t *p, double by_s, double floor_s)
{
    double spread = p->mean > 0.0 ? p->upper / p->mean : 1.0;
    double mean = p->mean + by_s;

    if (!(mean > floor_s))
        mean = floor_s > 0.0 ? floor_s : 0.0;
    p->mean = mean;
    p->upper = mean * spread;
}

#ifdef __cplusplus
}
#endif

#endif /* PDSCHED_PREDICT_H */
