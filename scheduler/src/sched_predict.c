/*
 * sched_predict.c - recursive least squares with forgetting, and the per-phase latency
 * models built on it (pdsched/predict.h says why this model family).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include <pdsched/predict.h>

/* Residuals past this many running-mean residuals count less (Huber weight). */
#define FIT_HUBER_K 3.0
/* Observations before the robust weight applies: the scale is not known yet. */
#define FIT_WARMUP 4
/* Step of the running means (absolute error of the fit, relative error of the model). */
#define MEAN_STEP 0.05
/* Step of the running bias, and the bias that says the law changed. */
#define BIAS_STEP  0.2
#define BIAS_RESET 0.25
#define ERR_WARMUP SCHED_PREDICT_SCORED_AFTER
/* Step of the quantile tracker, in ln(actual / predicted). */
#define QUANTILE_STEP 0.05
/* A cold model's spread: ln(1.5), until observations say otherwise. */
#define COLD_SPREAD_LOG 0.405
/* Shortest prediction scored (a 0 prediction cannot be divided by). */
#define PREDICT_FLOOR_S 1e-4
/* The prefill's prior variance: RLS weighs the prior against each observation as if the
 * observations' noise had variance 1, and a prefill's noise is some 20 ms, its cost per
 * kToken anywhere from 0.05 to 2 s: (1 s / 20 ms)^2 lets the first few legs set it (with a
 * variance of 1, a slow engine took some 20 legs to be believed slow). */
#define PREFILL_PRIOR_VAR 2500.0

void sched_fit_init(sched_fit_t *f, unsigned dim, const double *prior, double prior_var,
                    double forget)
{
    memset(f, 0, sizeof(*f));
    f->dim = dim < 1 ? 1 : dim > SCHED_FIT_MAX_DIM ? SCHED_FIT_MAX_DIM : dim;
    f->forget = forget > 0.0 && forget <= 1.0 ? forget : 1.0;
    f->prior_var = prior_var > 0.0 ? prior_var : 1.0;
    for (unsigned i = 0; i < f->dim; i++) {
        f->theta[i] = prior != NULL ? prior[i] : 0.0;
        f->p[i][i] = f->prior_diag[i] = f->prior_var;
    }
}

void sched_fit_set_prior_var(sched_fit_t *f, unsigned i, double var)
{
    if (i < f->dim && var > 0.0)
        f->p[i][i] = f->prior_diag[i] = var;
}

static double prior_trace(const sched_fit_t *f)
{
    double t = 0.0;
    for (unsigned i = 0; i < f->dim; i++)
        t += f->prior_diag[i];
    return t;
}

double sched_fit_predict(const sched_fit_t *f, const double *x)
{
    double y = 0.0;
    for (unsigned i = 0; i < f->dim; i++)
        y += f->theta[i] * x[i];
    return y;
}

static int all_finite(const double *x, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return 0;
    }
    return 1;
}

/* The law changed: forget how sure the fit was, so that what comes next decides. */
static void reopen(sched_fit_t *f)
{
    memset(f->p, 0, sizeof(f->p));
    for (unsigned i = 0; i < f->dim; i++)
        f->p[i][i] = f->prior_diag[i];
    f->bias = 0.0;
    f->since_reset = 0;
}

/* After an observation: the covariance's trace bound, the running error (<ae> = |e| when
 * the residual <e> is this fit's alone; < 0 when it is of a sum, not its scale), the bias
 * that reopens a changed law. */
static void observe_after(sched_fit_t *f, double y, double e, double ae)
{
    unsigned d = f->dim;
    double trace = 0.0;

    for (unsigned i = 0; i < d; i++)
        trace += f->p[i][i];
    /* Directions the data never excites grow by 1/forget per step: bound them (windup). */
    if (trace > prior_trace(f)) {
        double s = prior_trace(f) / trace;
        for (unsigned i = 0; i < d; i++) {
            for (unsigned j = 0; j < d; j++)
                f->p[i][j] *= s;
        }
    }
    if (ae >= 0.0)
        f->abs_err = f->n == 0 ? ae : f->abs_err + MEAN_STEP * (ae - f->abs_err);
    f->n++;
    f->since_reset++;
    if (y != 0.0) {
        double rel = e / fabs(y);
        rel = rel > 1.0 ? 1.0 : rel < -1.0 ? -1.0 : rel;
        f->bias += BIAS_STEP * (rel - f->bias);
    }
    if (f->since_reset >= FIT_WARMUP && fabs(f->bias) > BIAS_RESET)
        reopen(f);
}

void sched_fit_observe(sched_fit_t *f, const double *x, double y)
{
    unsigned d = f->dim;
    double px[SCHED_FIT_MAX_DIM], k[SCHED_FIT_MAX_DIM];
    double e, ae, w = 1.0, xpx = 0.0, denom;

    if (!isfinite(y) || !all_finite(x, d))
        return;
    e = y - sched_fit_predict(f, x);
    ae = fabs(e);
    if (f->since_reset >= FIT_WARMUP && f->abs_err > 0.0 && ae > FIT_HUBER_K * f->abs_err)
        w = FIT_HUBER_K * f->abs_err / ae;
    for (unsigned i = 0; i < d; i++) {
        px[i] = 0.0;
        for (unsigned j = 0; j < d; j++)
            px[i] += f->p[i][j] * x[j];
        xpx += x[i] * px[i];
    }
    /* Weighted RLS: minimises sum forget^(n-i) w_i e_i^2. */
    denom = f->forget + w * xpx;
    if (!(denom > 0.0))
        return;
    for (unsigned i = 0; i < d; i++) {
        k[i] = w * px[i] / denom;
        f->theta[i] += k[i] * e;
    }
    for (unsigned i = 0; i < d; i++) {
        for (unsigned j = i; j < d; j++) {
            double v = (f->p[i][j] - k[i] * px[j]) / f->forget;
            f->p[i][j] = f->p[j][i] = v; /* kept symmetric against rounding */
        }
    }
    observe_after(f, y, e, ae);
}

void sched_fit_observe_sum(sched_fit_t *a, const double *xa, sched_fit_t *b, const double *xb,
                           double y)
{
    sched_fit_t *f[2] = {a, b};
    const double *x[2] = {xa, xb};
    double px[2][SCHED_FIT_MAX_DIM], xpx = 0.0, e, denom;

    if (!isfinite(y) || !all_finite(xa, a->dim) || !all_finite(xb, b->dim))
        return;
    /* No robust weight: neither fit's error scale is that of a sum (the later tokens' part
     * grows with their count). */
    e = y - sched_fit_predict(a, xa) - sched_fit_predict(b, xb);
    for (int m = 0; m < 2; m++) {
        for (unsigned i = 0; i < f[m]->dim; i++) {
            px[m][i] = 0.0;
            for (unsigned j = 0; j < f[m]->dim; j++)
                px[m][i] += f[m]->p[i][j] * x[m][j];
            xpx += x[m][i] * px[m][i];
        }
    }
    /* The joint least-squares step over both coefficient vectors, their covariance taken as
     * block diagonal (the two fits stay apart): each moves by its share of the uncertainty. */
    denom = (a->forget + b->forget) * 0.5 + xpx;
    if (!(denom > 0.0))
        return;
    for (int m = 0; m < 2; m++) {
        sched_fit_t *fm = f[m];
        for (unsigned i = 0; i < fm->dim; i++)
            fm->theta[i] += px[m][i] / denom * e;
        for (unsigned i = 0; i < fm->dim; i++) {
            for (unsigned j = i; j < fm->dim; j++) {
                double v = (fm->p[i][j] - px[m][i] * px[m][j] / denom) / fm->forget;
                fm->p[i][j] = fm->p[j][i] = v;
            }
        }
        observe_after(fm, y, e, -1.0);
    }
}

/* ---------------------------------------------------------------- features, priors */

void sched_prefill_features(double x[SCHED_PREFILL_DIM], uint32_t steps, uint64_t tokens)
{
    x[0] = (double)steps;
    x[1] = (double)tokens * 1e-3;
}

void sched_tpot_features(double x[SCHED_TPOT_DIM], uint32_t running, uint64_t kv_tokens)
{
    x[0] = 1.0;
    x[1] = (double)running * (1.0 / 16.0);
    x[2] = (double)kv_tokens * 1e-4;
}

void sched_transfer_features(double x[SCHED_TRANSFER_DIM], uint64_t prompt_tokens, uint32_t running)
{
    /* The KV an engine hands over grows with the prompt: its tokens stand for its bytes (the
     * bytes per token are a property of the model, the same for every pair). */
    x[0] = 1.0;
    x[1] = (double)prompt_tokens * 1e-3;
    x[2] = (double)running * (1.0 / 16.0);
}

static const double prefill_prior[SCHED_PREFILL_DIM] = {0.020, 0.100};
static const double tpot_prior[SCHED_TPOT_DIM] = {0.012, 0.002, 0.002};
static const double transfer_prior[SCHED_TRANSFER_DIM] = {0.005, 0.010, 0.003};

const double *sched_phase_prior(sched_phase_t phase)
{
    switch (phase) {
    case SCHED_PHASE_PREFILL:
        return prefill_prior;
    case SCHED_PHASE_TPOT:
        return tpot_prior;
    default:
        return transfer_prior;
    }
}

unsigned sched_phase_dim(sched_phase_t phase)
{
    switch (phase) {
    case SCHED_PHASE_PREFILL:
        return SCHED_PREFILL_DIM;
    case SCHED_PHASE_TPOT:
        return SCHED_TPOT_DIM;
    default:
        return SCHED_TRANSFER_DIM;
    }
}

/* ---------------------------------------------------------------- latency models */

/* The fit's coefficients, spread and error for lock-free readers (seqlock; one writer at a
 * time: the caller holds m->mu). */
static void publish(sched_latency_model_t *m)
{
    uint32_t s = atomic_load_explicit(&m->seq, memory_order_relaxed);
    atomic_store_explicit(&m->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (unsigned i = 0; i < m->dim; i++)
        atomic_store_explicit(&m->coef[i], m->fit.theta[i], memory_order_relaxed);
    atomic_store_explicit(&m->spread, exp(m->q_log), memory_order_relaxed);
    /* NaN until a prediction was scored (a model taught only by sums has no error yet) */
    atomic_store_explicit(&m->err, m->scored > 0 ? m->rel_err : NAN, memory_order_relaxed);
    atomic_store_explicit(&m->observed, m->fit.n, memory_order_relaxed);
    atomic_store_explicit(&m->seq, s + 2, memory_order_release);
}

void sched_latency_model_init(sched_latency_model_t *m, sched_phase_t phase, const double *prior)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    m->dim = sched_phase_dim(phase);
    /* Forgetting 0.98: about the last 50 observations decide; an instance that slows down
     * is followed within tens of requests. */
    sched_fit_init(&m->fit, m->dim, prior != NULL ? prior : sched_phase_prior(phase),
                   phase == SCHED_PHASE_PREFILL ? PREFILL_PRIOR_VAR : 1.0, 0.98);
    if (phase == SCHED_PHASE_PREFILL) {
        /* A step's fixed cost is tens of milliseconds; the tokens are most of a prefill (sd
         * 50 ms against 1 s per kToken, relative to the noise as PREFILL_PRIOR_VAR says). With
         * one step per leg on a quiet engine the two are told apart only by the prompts'
         * lengths, and an equal prior variance would let the first few legs' error go to
         * the step cost (its feature, 1 step, outweighs a few hundred tokens' 0.2 kTokens). */
        sched_fit_set_prior_var(&m->fit, 0, PREFILL_PRIOR_VAR * 0.0025);
    }
    m->quantile = 0.9;
    m->q_log = COLD_SPREAD_LOG;
    atomic_init(&m->seq, 0);
    publish(m);
}

void sched_latency_model_fini(sched_latency_model_t *m)
{
    pthread_mutex_destroy(&m->mu);
}

void sched_latency_model_seed(sched_latency_model_t *m, const sched_latency_model_t *from)
{
    double coef[SCHED_FIT_MAX_DIM] = {0};
    uint32_t s0, s1;

    do {
        s0 = atomic_load_explicit(&from->seq, memory_order_acquire);
        for (unsigned i = 0; i < from->dim && i < SCHED_FIT_MAX_DIM; i++)
            coef[i] = atomic_load_explicit(&from->coef[i], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        s1 = atomic_load_explicit(&from->seq, memory_order_relaxed);
    } while ((s0 & 1u) != 0 || s0 != s1);
    pthread_mutex_lock(&m->mu);
    if (m->fit.n == 0 && from->dim == m->dim) {
        memcpy(m->fit.theta, coef, sizeof(double) * m->dim);
        publish(m);
    }
    pthread_mutex_unlock(&m->mu);
}

/* Score a prediction against what happened (under m->mu). Quantile by stochastic
 * approximation: it settles where a share <quantile> of ln(actual / predicted) lies below it. */
static void score_locked(sched_latency_model_t *m, double pred, double actual)
{
    double r;

    if (pred < PREDICT_FLOOR_S)
        pred = PREDICT_FLOOR_S;
    r = log(actual / pred);
    m->q_log += QUANTILE_STEP * (m->quantile - (r <= m->q_log ? 1.0 : 0.0));
    /* The error of a warm model only: a cold one predicts from the priors, and counting
     * that would say more about the priors than about the model for a long while. */
    if (m->fit.n >= ERR_WARMUP) {
        uint64_t k = m->scored; /* earlier scored predictions */
        double step = k < (uint64_t)(1.0 / MEAN_STEP) ? 1.0 / (double)(k + 1) : MEAN_STEP;
        r = fabs(actual - pred) / actual;
        m->rel_err += step * (r - m->rel_err);
        m->scored++;
    }
}

void sched_latency_model_observe(sched_latency_model_t *m, const double *x, double seconds)
{
    if (!(seconds > 0.0) || !isfinite(seconds) || !all_finite(x, m->dim))
        return; /* nothing to learn from a non-positive or unknown duration */
    pthread_mutex_lock(&m->mu);
    score_locked(m, sched_fit_predict(&m->fit, x), seconds); /* the prediction it had, then learn */
    sched_fit_observe(&m->fit, x, seconds);
    publish(m);
    pthread_mutex_unlock(&m->mu);
}

void sched_latency_model_observe_scored(sched_latency_model_t *m, const double *x, double y,
                                        double predicted, double actual)
{
    bool learn = y > 0.0 && isfinite(y) && all_finite(x, m->dim);
    bool score = predicted > 0.0 && isfinite(predicted) && actual > 0.0 && isfinite(actual);

    if (!learn && !score)
        return;
    pthread_mutex_lock(&m->mu);
    if (score)
        score_locked(m, predicted, actual);
    if (learn)
        sched_fit_observe(&m->fit, x, y);
    publish(m);
    pthread_mutex_unlock(&m->mu);
}

void sched_latency_model_observe_sum(sched_latency_model_t *a, const double *xa,
                                     sched_latency_model_t *b, const double *xb, double seconds)
{
    if (a == b || !(seconds > 0.0) || !isfinite(seconds) || !all_finite(xa, a->dim) ||
        !all_finite(xb, b->dim))
        return;
    /* lock order: a before b (the callers pass the handoff or prefill model first, the TPOT
     * model second; nothing locks them the other way) */
    pthread_mutex_lock(&a->mu);
    pthread_mutex_lock(&b->mu);
    sched_fit_observe_sum(&a->fit, xa, &b->fit, xb, seconds);
    publish(a);
    publish(b);
    pthread_mutex_unlock(&b->mu);
    pthread_mutex_unlock(&a->mu);
}
