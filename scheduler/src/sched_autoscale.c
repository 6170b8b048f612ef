/*
 * Autoscaling signals: how many prefill and decode replicas each model needs, from the
 * demand pdgw sees and the capacity its latency models learnt, exported for an external
 * scaler (KEDA, an HPA through prometheus-adapter; deploy/k8s/components/autoscale).
 *
 * Two modes, after Dynamo's planner (components/src/dynamo/planner/utils/prefill_planner.py,
 * decode_planner.py, load_based_regression.py):
 *  - throughput: demand over what one replica sustains within the targets.
 *    prefill: arrivals/s x mean prompt tokens against each instance's prefill rate (the slope
 *    of its TTFT model) times the utilisation at which the queue that builds (taken as an
 *    M/M/1 queue of prompts, ahead = rho / (1 - rho) prompts) still leaves the predicted p90
 *    TTFT of a mean prompt within target. decode: arrivals/s x mean output tokens against
 *    each instance's tokens/s at the largest batch whose predicted p90 TPOT at the context
 *    isl + osl/2 meets the target (capped by its KV capacity). Replicas = ceil(need), need
 *    counted in mean replicas of the current fleet.
 *  - latency: the load on each instance against the load its model says meets the target
 *    (prefill: prompt tokens queued; decode: KV tokens); +1 when every instance is over,
 *    -1 when every one is under (n - 1) / n x 80% of it, else as many as now.
 * utilisation = throughput need / current replicas (> 1: under-provisioned).
 *
 * Smoothing, so that the signals do not flap: the arrival rate and the mean prompt/output
 * lengths are exponential averages with time constant autoscale_tau_ms (30 s), advanced by
 * the time elapsed (at most one step a second, when the metrics are read); desired replicas
 * rise at once and fall only to the highest raw value of the last autoscale_window_ms
 * (120 s; the HPA's scale-down stabilisation, in eight slots).
 */
#include <math.h>
#include <string.h>

#include "pdb/pdb_prom.h"
#include "sched_int.h"

#define RELAXED          memory_order_relaxed
#define AS_MAX_MODELS    32 /* models tracked; later names share the last slot */
#define AS_SLOTS         8  /* of the stabilisation window */
#define AS_MIN_STEP_MS   1000
#define AS_DOWN_FRACTION 0.8 /* Dynamo's load-based scale-down sensitivity, as a fraction */
#define AS_RHO_MIN       0.05
#define AS_RHO_MAX       0.95
#define AS_OTHER         "_other"

enum { MODE_THROUGHPUT = 0, MODE_LATENCY = 1, N_MODES = 2 };

typedef struct as_window {
    double slot_max[AS_SLOTS];
    uint64_t slot_epoch[AS_SLOTS]; /* now / slot_ms of the slot's values, +1 (0 = empty) */
} as_window_t;

typedef struct as_model {
    char name[SCHED_MODEL_NAME_MAX + 1];
    /* counters, from any thread */
    _Atomic uint64_t requests, prompt_tokens, max_tokens, outputs, output_tokens;
    _Atomic uint64_t targeted, ttft_ms_sum, tpot_ms_sum;
    /* smoothed, under the module's mutex */
    uint64_t last[8];
    bool warm;
    double rate, isl, osl, ttft_s, tpot_s;
    double need[2], util[2], desired[2][N_MODES];
    as_window_t win[2][N_MODES];
} as_model_t;

struct sched_autoscale {
    pthread_mutex_t mu; /* inserts and updates */
    _Atomic size_t n;
    as_model_t models[AS_MAX_MODELS];
    double def_ttft_s, def_tpot_s, tau_ms;
    uint64_t window_ms, last_ms;
    sched_latency_model_t prior_prefill, prior_tpot; /* a role without instances */
};

sched_status_t sched_autoscale_create(sched_pool_t *pool, const sched_config_t *cfg)
{
    struct sched_autoscale *a = sched_calloc(1, sizeof(*a));

    if (!a)
        return SCHED_ERR_NO_MEMORY;
    pthread_mutex_init(&a->mu, NULL);
    a->def_ttft_s = (cfg->autoscale_ttft_ms ? cfg->autoscale_ttft_ms : 1000) / 1000.0;
    a->def_tpot_s = (cfg->autoscale_tpot_ms ? cfg->autoscale_tpot_ms : 50) / 1000.0;
    a->tau_ms = (double)(cfg->autoscale_tau_ms ? cfg->autoscale_tau_ms : 30000);
    a->window_ms = cfg->autoscale_window_ms ? cfg->autoscale_window_ms : 120000;
    sched_latency_model_init(&a->prior_prefill, SCHED_PHASE_PREFILL, NULL);
    sched_latency_model_init(&a->prior_tpot, SCHED_PHASE_TPOT, NULL);
    pool->autoscale = a;
    return SCHED_OK;
}

void sched_autoscale_destroy(sched_pool_t *pool)
{
    struct sched_autoscale *a = pool->autoscale;

    if (!a)
        return;
    sched_latency_model_fini(&a->prior_prefill);
    sched_latency_model_fini(&a->prior_tpot);
    pthread_mutex_destroy(&a->mu);
    sched_free(a);
    pool->autoscale = NULL;
}

/* The slot of <model> ("" for requests without one), made on first sight; past
 * AS_MAX_MODELS names, the shared last slot. Lock-free when it exists. */
static as_model_t *model_slot(struct sched_autoscale *a, const char *model)
{
    size_t n = atomic_load_explicit(&a->n, memory_order_acquire);
    as_model_t *m = NULL;

    if (!model)
        model = "";
    if (strlen(model) > SCHED_MODEL_NAME_MAX)
        model = AS_OTHER;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(a->models[i].name, model) == 0)
            return &a->models[i];
    }
    pthread_mutex_lock(&a->mu);
    n = atomic_load_explicit(&a->n, RELAXED);
    for (size_t i = 0; i < n && !m; i++) {
        if (strcmp(a->models[i].name, model) == 0)
            m = &a->models[i];
    }
    if (!m && n < AS_MAX_MODELS) {
        m = &a->models[n];
        strcpy(m->name, n + 1 == AS_MAX_MODELS ? AS_OTHER : model);
        atomic_store_explicit(&a->n, n + 1, memory_order_release);
    }
    if (!m)
        m = &a->models[AS_MAX_MODELS - 1];
    pthread_mutex_unlock(&a->mu);
    return m;
}

void sched_autoscale_note_request(sched_pool_t *pool, const sched_request_t *req)
{
    as_model_t *m;

    if (!pool->autoscale)
        return;
    m = model_slot(pool->autoscale, req->model);
    atomic_fetch_add_explicit(&m->requests, 1, RELAXED);
    atomic_fetch_add_explicit(&m->prompt_tokens, req->prompt_tokens, RELAXED);
    atomic_fetch_add_explicit(&m->max_tokens, req->max_tokens, RELAXED);
    if (req->slo_ttft_ms || req->slo_tpot_ms) {
        atomic_fetch_add_explicit(&m->targeted, 1, RELAXED);
        atomic_fetch_add_explicit(&m->ttft_ms_sum, req->slo_ttft_ms, RELAXED);
        atomic_fetch_add_explicit(&m->tpot_ms_sum, req->slo_tpot_ms, RELAXED);
    }
}

void sched_autoscale_note_output(sched_pool_t *pool, const char *model, uint32_t output_tokens)
{
    as_model_t *m;

    if (!pool->autoscale || output_tokens == 0)
        return;
    m = model_slot(pool->autoscale, model);
    atomic_fetch_add_explicit(&m->outputs, 1, RELAXED);
    atomic_fetch_add_explicit(&m->output_tokens, output_tokens, RELAXED);
}

/* ---------------------------------------------------------------- capacity per instance */

static double coef(const sched_latency_model_t *m, unsigned i)
{
    return atomic_load_explicit(&m->coef[i], RELAXED);
}

static double spread(const sched_latency_model_t *m)
{
    double s = atomic_load_explicit(&m->spread, RELAXED);
    return s > 0.0 && isfinite(s) ? s : 1.0;
}

/* Prefill: tokens/s sustained within <ttft_s> for prompts of <isl> (the rate times the
 * usable utilisation), and the queued tokens at which a mean prompt just meets it. The model is
 * per engine step (a fixed cost) and per kToken; a loaded engine runs full steps of <budget>
 * tokens, so a queued kToken costs the per-kToken cost plus its share of a step's. */
static void prefill_capacity(const sched_latency_model_t *m, double isl, double ttft_s,
                             uint32_t budget, double *tokens_s, double *queue_sla)
{
    double k = spread(m), n = isl * 1e-3, b = budget ? budget * 1e-3 : 2.048;
    double step = coef(m, 0) > 0.0 ? coef(m, 0) : 0.0;
    double per_ktok = coef(m, 1) + step / b;
    double idle = k * (step * ceil(n / b > 1.0 ? n / b : 1.0) + coef(m, 1) * n);
    double q, rho;

    if (!(per_ktok > 1e-6))
        per_ktok = 1e-6;
    q = (ttft_s - idle) / (k * per_ktok) * 1e3; /* tokens ahead that still meet the target */
    if (!(q > 0.0))
        q = 0.0;
    rho = isl > 0.0 ? q / (q + isl) : AS_RHO_MAX;
    rho = rho < AS_RHO_MIN ? AS_RHO_MIN : rho > AS_RHO_MAX ? AS_RHO_MAX : rho;
    *tokens_s = rho * 1e3 / per_ktok;
    *queue_sla = q;
}

/* Decode: output tokens/s at the largest batch meeting <tpot_s> at context <ctx>, capped by
 * <kv_cap> tokens of KV (0 = unknown) for requests that each end up holding <hold> tokens,
 * and the KV tokens that batch holds. */
static void decode_capacity(const sched_latency_model_t *m, double ctx, double hold, double tpot_s,
                            uint64_t kv_cap, double *tokens_s, double *kv_sla)
{
    double k = spread(m);
    double per_seq = k * (coef(m, 1) / 16.0 + coef(m, 2) * ctx * 1e-4);
    double base = k * coef(m, 0);
    double b;

    b = per_seq > 1e-9 ? (tpot_s - base) / per_seq : 1024.0;
    if (kv_cap && hold > 0.0 && b > (double)kv_cap / hold)
        b = (double)kv_cap / hold; /* no preemption: room for each to reach its end */
    if (!(b >= 1.0))
        b = 1.0; /* the target is out of reach: one at a time */
    *tokens_s = b / (base + per_seq * b > 1e-6 ? base + per_seq * b : 1e-6);
    *kv_sla = b * ctx;
}

/* ---------------------------------------------------------------- the update */

static double ewma(double old, double sample, double alpha, bool warm)
{
    return warm ? old + alpha * (sample - old) : sample;
}

/* Desired replicas after smoothing: up at once, down to the window's highest raw value. */
static double stabilise(as_window_t *w, double raw, uint64_t now, uint64_t window_ms)
{
    uint64_t slot_ms = window_ms / AS_SLOTS ? window_ms / AS_SLOTS : 1;
    uint64_t epoch = now / slot_ms + 1;
    size_t s = (size_t)(epoch % AS_SLOTS);
    double best = raw;

    if (w->slot_epoch[s] != epoch) {
        w->slot_epoch[s] = epoch;
        w->slot_max[s] = raw;
    } else if (raw > w->slot_max[s]) {
        w->slot_max[s] = raw;
    }
    for (size_t i = 0; i < AS_SLOTS; i++) {
        if (w->slot_epoch[i] && w->slot_epoch[i] + AS_SLOTS > epoch && w->slot_max[i] > best)
            best = w->slot_max[i];
    }
    return best;
}

static void update_demand(struct sched_autoscale *a, as_model_t *m, double dt_s, double alpha)
{
    uint64_t c[8] = {
        atomic_load(&m->requests),    atomic_load(&m->prompt_tokens), atomic_load(&m->max_tokens),
        atomic_load(&m->outputs),     atomic_load(&m->output_tokens), atomic_load(&m->targeted),
        atomic_load(&m->ttft_ms_sum), atomic_load(&m->tpot_ms_sum),
    };
    double d[8];

    for (int i = 0; i < 8; i++)
        d[i] = (double)(c[i] - m->last[i]);
    memcpy(m->last, c, sizeof(c));
    m->rate = ewma(m->rate, d[0] / dt_s, alpha, m->warm);
    if (d[0] > 0) {
        m->isl = ewma(m->isl, d[1] / d[0], alpha, m->warm && m->isl > 0);
        if (d[3] == 0 && !(m->osl > 0)) /* no output seen yet: half the tokens asked for */
            m->osl = d[2] / d[0] / 2.0;
    }
    if (d[3] > 0)
        m->osl = ewma(m->osl, d[4] / d[3], alpha, m->warm && m->osl > 0);
    if (d[5] > 0) {
        double t = d[6] / d[5] / 1000.0, p = d[7] / d[5] / 1000.0;
        m->ttft_s = t > 0 ? ewma(m->ttft_s, t, alpha, m->ttft_s > 0) : m->ttft_s;
        m->tpot_s = p > 0 ? ewma(m->tpot_s, p, alpha, m->tpot_s > 0) : m->tpot_s;
    }
    if (!(m->ttft_s > 0))
        m->ttft_s = a->def_ttft_s;
    if (!(m->tpot_s > 0))
        m->tpot_s = a->def_tpot_s;
    m->warm = true;
}

/* One role of one model over the usable instances serving it. */
static void update_role(struct sched_autoscale *a, as_model_t *m, int ridx,
                        sched_instance_t *const *arr, size_t n, uint64_t now, uint64_t now_ms)
{
    double cap_sum = 0.0, over_min = INFINITY, over_max = 0.0, demand, need, lat, thr;
    size_t count = 0;
    const char *model = m->name[0] && strcmp(m->name, AS_OTHER) != 0 ? m->name : NULL;
    double ctx = m->isl + m->osl / 2.0;

    for (size_t i = 0; i < n; i++) {
        sched_instance_t *c = arr[i];
        double tokens_s, sla, load;
        if (!sched_instance_selectable(c, now_ms) || (model && !sched_models_allow(c, model)))
            continue;
        if (ridx == SCHED_RIDX_PREFILL) {
            prefill_capacity(&c->lat_prefill, m->isl, m->ttft_s, c->pq.step_tokens, &tokens_s,
                             &sla);
            load = (double)atomic_load_explicit(&c->prompt_tokens, RELAXED);
        } else {
            decode_capacity(&c->lat_tpot, ctx, m->isl + m->osl, m->tpot_s,
                            atomic_load_explicit(&c->kv_capacity, RELAXED), &tokens_s, &sla);
            load = (double)sched_kv_projected(c);
        }
        cap_sum += tokens_s;
        load = sla > 0.0 ? load / sla : INFINITY;
        over_min = load < over_min ? load : over_min;
        over_max = load > over_max ? load : over_max;
        count++;
    }
    demand = ridx == SCHED_RIDX_PREFILL ? m->rate * m->isl : m->rate * m->osl;
    if (count == 0) { /* nothing to learn from: a replica with the cold priors */
        double sla;
        if (ridx == SCHED_RIDX_PREFILL)
            prefill_capacity(&a->prior_prefill, m->isl, m->ttft_s, 0, &cap_sum, &sla);
        else
            decode_capacity(&a->prior_tpot, ctx, m->isl + m->osl, m->tpot_s, 0, &cap_sum, &sla);
        need = demand / cap_sum;
        lat = demand > 0.0 ? 1.0 : 0.0;
    } else {
        need = demand / (cap_sum / (double)count);
        lat = (double)count;
        if (over_min > 1.0)
            lat = (double)count + 1.0;
        else if (count > 1 && over_max < (double)(count - 1) / (double)count * AS_DOWN_FRACTION)
            lat = (double)count - 1.0;
    }
    if (!isfinite(need) || need < 0.0)
        need = 0.0;
    m->need[ridx] = need;
    m->util[ridx] = count ? need / (double)count : 0.0;
    thr = ceil(need - 1e-9);
    if (thr < 1.0 && demand > 0.0)
        thr = 1.0;
    m->desired[ridx][MODE_THROUGHPUT] =
        stabilise(&m->win[ridx][MODE_THROUGHPUT], thr, now, a->window_ms);
    m->desired[ridx][MODE_LATENCY] = stabilise(&m->win[ridx][MODE_LATENCY], lat, now, a->window_ms);
}

static void update(sched_pool_t *pool, struct sched_autoscale *a)
{
    uint64_t now = sched_pool_now(pool);
    double dt_s, alpha;
    size_t n = atomic_load_explicit(&a->n, memory_order_acquire);

    if (a->last_ms && now < a->last_ms + AS_MIN_STEP_MS)
        return;
    dt_s = a->last_ms ? (double)(now - a->last_ms) / 1000.0 : 1.0;
    alpha = 1.0 - exp(-(dt_s * 1000.0) / a->tau_ms);
    a->last_ms = now;
    pthread_rwlock_rdlock(&pool->lock);
    for (size_t i = 0; i < n; i++) {
        as_model_t *m = &a->models[i];
        update_demand(a, m, dt_s, alpha);
        for (int r = 0; r < 2; r++)
            update_role(a, m, r, pool->snap->role[r], pool->snap->n_role[r], now, now);
    }
    pthread_rwlock_unlock(&pool->lock);
}

void sched_autoscale_emit(struct pdb_prom *p, sched_pool_t *pool)
{
    static const char *const role[2] = {"prefill", "decode"};
    static const char *const mode[N_MODES] = {"throughput", "latency"};
    struct sched_autoscale *a = pool->autoscale;
    size_t n;

    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    update(pool, a);
    n = atomic_load_explicit(&a->n, RELAXED);
    pdb_prom_family(p, "pdgw_autoscale_desired_replicas", "gauge",
                    "Replicas a role of a model needs to meet its latency targets (throughput: "
                    "demand over learnt capacity; latency: load against the load meeting the "
                    "target), smoothed: up at once, down after the stabilisation window.");
    for (size_t i = 0; i < n; i++) {
        for (int r = 0; r < 2; r++) {
            for (int k = 0; k < N_MODES; k++) {
                const char *const labels[] = {"model", a->models[i].name, "role", role[r],
                                              "mode",  mode[k],           NULL};
                pdb_prom_sample(p, "pdgw_autoscale_desired_replicas", NULL, labels,
                                a->models[i].desired[r][k]);
            }
        }
    }
    pdb_prom_family(p, "pdgw_autoscale_utilization_ratio", "gauge",
                    "Demand over what the current replicas of a role sustain within the targets "
                    "(1 = exactly enough; smoothed demand).");
    for (size_t i = 0; i < n; i++) {
        for (int r = 0; r < 2; r++) {
            const char *const labels[] = {"model", a->models[i].name, "role", role[r], NULL};
            pdb_prom_sample(p, "pdgw_autoscale_utilization_ratio", NULL, labels,
                            a->models[i].util[r]);
        }
    }
    pdb_prom_family(p, "pdgw_autoscale_demand", "gauge",
                    "Smoothed demand of a model: arrivals per second, mean prompt and output "
                    "tokens.");
    for (size_t i = 0; i < n; i++) {
        static const char *const what[3] = {"requests_per_second", "prompt_tokens",
                                            "output_tokens"};
        double v[3] = {a->models[i].rate, a->models[i].isl, a->models[i].osl};
        for (int k = 0; k < 3; k++) {
            const char *const labels[] = {"model", a->models[i].name, "what", what[k], NULL};
            pdb_prom_sample(p, "pdgw_autoscale_demand", NULL, labels, v[k]);
        }
    }
    pthread_mutex_unlock(&a->mu);
}
