/*
 * pdq_usage.c - usage by phase per (tenant, model): totals since start, a ring of per-minute
 * buckets for the last hour, the fleet totals the store reported; Prometheus and JSON views.
 *
 * Labels are bounded by construction: tenants are the configured ones plus "other", models
 * the configured ones plus "other" (requests for any other model count there).
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdq_int.h"

static const char *const phase_names[PDQ_PHASE_COUNT] = {"queue", "prefill", "transfer", "decode"};

void pdq_usage_add(pdq_usage_t *dst, const pdq_usage_t *src)
{
    dst->requests += src->requests;
    dst->prompt_tokens += src->prompt_tokens;
    dst->cached_prompt_tokens += src->cached_prompt_tokens;
    dst->completion_tokens += src->completion_tokens;
    dst->kv_bytes += src->kv_bytes;
    for (int p = 0; p < PDQ_PHASE_COUNT; p++)
        dst->phase_ns[p] += src->phase_ns[p];
}

static uint64_t minute_of(uint64_t now)
{
    return now / (60 * PDB_NSEC_PER_SEC) + 1; /* + 1: id 0 marks an unused slot */
}

void pdq_usage_record(pdq_t *q, pdq_tenant_t *t, uint32_t model, const pdq_usage_t *u, uint64_t now)
{
    pdq_usage_slot_t *s = &t->usage[model];
    uint64_t id = minute_of(now);
    size_t i = id % PDQ_HISTORY_MINUTES;
    if (s->minute_id[i] != id) {
        memset(&s->minute[i], 0, sizeof(s->minute[i]));
        s->minute_id[i] = id;
    }
    pdq_usage_add(&s->minute[i], u);
    pdq_usage_add(&s->total, u);
    if (q->store)
        pdq_usage_add(&s->unpushed, u);
}

/* One tenant's view (copied under its lock so writers are not held up by formatting). */
typedef struct usage_view {
    pdq_usage_t *u; /* [n_models] */
    uint64_t refused[PDQ_CODE_COUNT];
    uint32_t inflight, waiting;
    bool fleet;
} usage_view_t;

static pdq_status_t view_of(pdq_t *q, size_t ti, uint32_t window_s, bool prefer_fleet,
                            usage_view_t *v)
{
    pdq_tenant_t *t = &q->tenants[ti];
    v->u = pdb_calloc(q->n_models, sizeof(pdq_usage_t));
    if (v->u == NULL)
        return PDQ_ERR_NOMEM;
    uint64_t id = minute_of(pdq_now(q));
    uint64_t minutes = window_s ? (window_s + 59) / 60 : 0;
    if (minutes > PDQ_HISTORY_MINUTES)
        minutes = PDQ_HISTORY_MINUTES;
    v->fleet = prefer_fleet && window_s == 0;
    pthread_mutex_lock(&t->lock);
    for (size_t m = 0; m < q->n_models; m++) {
        pdq_usage_slot_t *s = &t->usage[m];
        if (window_s == 0) {
            if (v->fleet && s->fleet_valid) {
                v->u[m] = s->fleet;
                pdq_usage_add(&v->u[m], &s->unpushed); /* ours, not yet pushed */
            } else {
                v->u[m] = s->total;
            }
            continue;
        }
        for (uint64_t back = 0; back < minutes && back < id; back++) {
            size_t i = (id - back) % PDQ_HISTORY_MINUTES;
            if (s->minute_id[i] == id - back)
                pdq_usage_add(&v->u[m], &s->minute[i]);
        }
    }
    memcpy(v->refused, t->refused, sizeof(v->refused));
    v->inflight = t->inflight;
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_lock(&q->fq_lock);
    v->waiting = t->waiting;
    pthread_mutex_unlock(&q->fq_lock);
    return PDQ_OK;
}

static bool any_use(const pdq_usage_t *u)
{
    return u->requests || u->prompt_tokens || u->cached_prompt_tokens || u->completion_tokens;
}

void pdq_usage_prometheus(pdq_t *q, pdb_prom_t *p)
{
    size_t nt = q->n_tenants;
    usage_view_t *views = pdb_calloc(nt, sizeof(*views));
    if (views == NULL) {
        p->status = p->status ? p->status : PDB_ERR_NOMEM;
        return;
    }
    for (size_t i = 0; i < nt; i++)
        if (view_of(q, i, 0, false, &views[i]) != PDQ_OK) {
            p->status = p->status ? p->status : PDB_ERR_NOMEM;
            goto out;
        }
    static const struct {
        const char *name, *help;
        size_t off;
    } counters[] = {
        {"pdgw_quota_requests_total", "Requests ended, by tenant and model.",
         offsetof(pdq_usage_t, requests)},
        {"pdgw_quota_prompt_tokens_total", "Prompt tokens computed on a prefill.",
         offsetof(pdq_usage_t, prompt_tokens)},
        {"pdgw_quota_cached_prompt_tokens_total", "Prompt tokens served from cache.",
         offsetof(pdq_usage_t, cached_prompt_tokens)},
        {"pdgw_quota_completion_tokens_total", "Completion (decode) tokens.",
         offsetof(pdq_usage_t, completion_tokens)},
        {"pdgw_quota_kv_bytes_total", "KV cache bytes moved between instances.",
         offsetof(pdq_usage_t, kv_bytes)},
    };
    for (size_t c = 0; c < sizeof(counters) / sizeof(counters[0]); c++) {
        pdb_prom_family(p, counters[c].name, "counter", counters[c].help);
        for (size_t i = 0; i < nt; i++)
            for (size_t m = 0; m < q->n_models; m++) {
                const pdq_usage_t *u = &views[i].u[m];
                if (!any_use(u))
                    continue;
                const char *pairs[] = {"tenant", q->tenants[i].name, "model", q->model_names[m],
                                       NULL};
                uint64_t v;
                memcpy(&v, (const char *)u + counters[c].off, sizeof(v));
                pdb_prom_sample_u64(p, counters[c].name, NULL, pairs, v);
            }
    }
    pdb_prom_family(p, "pdgw_quota_phase_seconds_total", "counter",
                    "Time spent per phase, summed over requests.");
    for (size_t i = 0; i < nt; i++)
        for (size_t m = 0; m < q->n_models; m++) {
            const pdq_usage_t *u = &views[i].u[m];
            if (!any_use(u))
                continue;
            for (int ph = 0; ph < PDQ_PHASE_COUNT; ph++) {
                const char *pairs[] = {"tenant", q->tenants[i].name, "model", q->model_names[m],
                                       "phase",  phase_names[ph],    NULL};
                pdb_prom_sample(p, "pdgw_quota_phase_seconds_total", NULL, pairs,
                                (double)u->phase_ns[ph] / 1e9);
            }
        }
    pdb_prom_family(p, "pdgw_quota_refused_total", "counter", "Requests refused, by reason.");
    for (size_t i = 0; i < nt; i++)
        for (int c = 1; c < PDQ_CODE_COUNT; c++) {
            const char *pairs[] = {"tenant", q->tenants[i].name, "reason",
                                   pdq_code_name((pdq_code_t)c), NULL};
            pdb_prom_sample_u64(p, "pdgw_quota_refused_total", NULL, pairs, views[i].refused[c]);
        }
    pdb_prom_family(p, "pdgw_quota_inflight", "gauge", "Admitted requests in flight.");
    for (size_t i = 0; i < nt; i++) {
        const char *pairs[] = {"tenant", q->tenants[i].name, NULL};
        pdb_prom_sample_u64(p, "pdgw_quota_inflight", NULL, pairs, views[i].inflight);
    }
    pdb_prom_family(p, "pdgw_quota_waiting", "gauge", "Requests waiting for a slot.");
    for (size_t i = 0; i < nt; i++) {
        const char *pairs[] = {"tenant", q->tenants[i].name, NULL};
        pdb_prom_sample_u64(p, "pdgw_quota_waiting", NULL, pairs, views[i].waiting);
    }
    if (q->store) {
        pdq_store_stats_t ss;
        pdq_store_get_stats(q->store, &ss);
        pdb_prom_family(p, "pdgw_quota_store_connected", "gauge",
                        "1 while the quota store answers.");
        pdb_prom_sample_u64(p, "pdgw_quota_store_connected", NULL, NULL, ss.connected);
        pdb_prom_family(p, "pdgw_quota_store_errors_total", "counter",
                        "Failed store round trips and connection attempts.");
        pdb_prom_sample_u64(p, "pdgw_quota_store_errors_total", NULL, NULL, ss.errors);
        pdb_prom_family(p, "pdgw_quota_store_reconnects_total", "counter",
                        "Connections to the store made after the first.");
        pdb_prom_sample_u64(p, "pdgw_quota_store_reconnects_total", NULL, NULL, ss.reconnects);
    }
out:
    for (size_t i = 0; i < nt; i++)
        pdb_free(views[i].u);
    pdb_free(views);
}

static json_t *usage_obj(const pdq_usage_t *u)
{
    json_t *o = json_object();
    json_t *ph = json_object();
    if (o == NULL || ph == NULL) {
        json_decref(o);
        json_decref(ph);
        return NULL;
    }
    int bad = 0;
    bad |= json_object_set_new(o, "requests", json_integer((json_int_t)u->requests));
    bad |= json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)u->prompt_tokens));
    bad |= json_object_set_new(o, "cached_prompt_tokens",
                               json_integer((json_int_t)u->cached_prompt_tokens));
    bad |=
        json_object_set_new(o, "completion_tokens", json_integer((json_int_t)u->completion_tokens));
    bad |= json_object_set_new(o, "kv_bytes", json_integer((json_int_t)u->kv_bytes));
    for (int p = 0; p < PDQ_PHASE_COUNT; p++)
        bad |= json_object_set_new(ph, phase_names[p], json_real((double)u->phase_ns[p] / 1e9));
    bad |= json_object_set_new(o, "phase_seconds", ph);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *pdq_usage_json(pdq_t *q, uint32_t window_s, const char *tenant_filter,
                       const char *model_filter)
{
    if (window_s > PDQ_HISTORY_MINUTES * 60)
        window_s = PDQ_HISTORY_MINUTES * 60;
    pdq_store_stats_t ss = {0};
    if (q->store)
        pdq_store_get_stats(q->store, &ss);
    bool fleet = q->store != NULL && window_s == 0;
    json_t *root = json_object();
    json_t *tenants = json_object();
    if (root == NULL || tenants == NULL)
        goto err;
    if (json_object_set_new(root, "window_s", json_integer(window_s)) ||
        json_object_set_new(root, "scope", json_string(fleet ? "fleet" : "replica")) ||
        json_object_set_new(root, "store_connected", json_boolean(ss.connected)))
        goto err;
    for (size_t i = 0; i < q->n_tenants; i++) {
        if (tenant_filter && strcmp(tenant_filter, q->tenants[i].name) != 0)
            continue;
        usage_view_t v = {0};
        if (view_of(q, i, window_s, fleet, &v) != PDQ_OK)
            goto err;
        json_t *to = json_object(), *models = json_object();
        pdq_usage_t sum = {0};
        int bad = to == NULL || models == NULL;
        for (size_t m = 0; !bad && m < q->n_models; m++) {
            if (model_filter && strcmp(model_filter, q->model_names[m]) != 0)
                continue;
            if (!any_use(&v.u[m]))
                continue;
            pdq_usage_add(&sum, &v.u[m]);
            json_t *mo = usage_obj(&v.u[m]);
            bad |= mo == NULL || json_object_set_new(models, q->model_names[m], mo);
        }
        pdb_free(v.u);
        json_t *tot = bad ? NULL : usage_obj(&sum);
        if (tot == NULL) {
            json_decref(models);
            json_decref(to);
            goto err;
        }
        /* set_new takes the value even when it fails: all of them run, one check */
        int e = json_object_set_new(to, "total", tot);
        e |= json_object_set_new(to, "models", models);
        if (atomic_load(&q->tenants[i].removed)) /* by a reload; its usage stays readable */
            e |= json_object_set_new(to, "removed", json_true());
        e |= json_object_set_new(tenants, q->tenants[i].name, to);
        if (e)
            goto err;
    }
    if (json_object_set_new(root, "tenants", tenants)) {
        tenants = NULL;
        goto err;
    }
    return root;
err:
    json_decref(tenants);
    json_decref(root);
    return NULL;
}
