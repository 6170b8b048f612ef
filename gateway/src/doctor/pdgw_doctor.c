/*
 * pdgw_doctor.c - the engine doctor's runner and its table (see pdgw_doctor.h): one target per
 * pool instance, probed by up to PDGW_DOCTOR_THREADS threads, then the checks that compare
 * instances (model names, KV block sizes), the text/JSON table and the start-up run.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <pdsched/discovery.h>

#include "pdgw_alloc.h"
#include "pdgw_doctor_int.h"

#include "pdgw_server_int.h"
#include "pdgw_fwd_setup.h" /* pdgw_instance_view_from_sched */ /* pdgw_instance_view_from_sched */

static const char *const result_names[] = {"ok", "info", "warn", "error"};

const char *pdgw_doctor_result_name(pdgw_doctor_result_t r)
{
    return (unsigned)r < 4 ? result_names[r] : "unknown";
}

static char *dup_or_empty(const char *s)
{
    return pdgw_strdup(s != NULL ? s : "");
}

static void row_add(pdgw_doctor_report_t *rep, size_t index, const char *instance,
                    const char *check, pdgw_doctor_result_t r, const char *fix, const char *detail)
{
    pdgw_doctor_row_t *row;
    pthread_mutex_lock(&rep->mu);
    if (rep->n == rep->cap) {
        size_t cap = rep->cap ? rep->cap * 2 : 32;
        pdgw_doctor_row_t *nr = pdgw_realloc(rep->rows, cap * sizeof(*nr));
        if (nr == NULL) {
            pthread_mutex_unlock(&rep->mu);
            pdgw_log_error("doctor", "out of memory: %s %s lost", instance, check);
            return;
        }
        rep->rows = nr;
        rep->cap = cap;
    }
    row = &rep->rows[rep->n];
    row->instance = dup_or_empty(instance);
    row->check = dup_or_empty(check);
    row->detail = dup_or_empty(detail);
    row->fix = dup_or_empty(fix);
    row->result = r;
    /* fleet rows (index SIZE_MAX) last; within an instance, the order of the probes */
    row->order = (index == SIZE_MAX ? (size_t)1 << 40 : index << 20) + rep->seq++;
    if (row->instance && row->check && row->detail && row->fix)
        rep->n++;
    else {
        pdgw_free(row->instance);
        pdgw_free(row->check);
        pdgw_free(row->detail);
        pdgw_free(row->fix);
    }
    pthread_mutex_unlock(&rep->mu);
}

void doc_row(doc_run_t *run, const doc_target_t *t, const char *check, pdgw_doctor_result_t r,
             const char *fix, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    row_add(run->rep, t != NULL ? t->index : SIZE_MAX, t != NULL ? t->view.id : "*", check, r, fix,
            detail);
}

void pdgw_doctor_report_free(pdgw_doctor_report_t *rep)
{
    size_t i;
    if (rep == NULL)
        return;
    for (i = 0; i < rep->n; i++) {
        pdgw_free(rep->rows[i].instance);
        pdgw_free(rep->rows[i].check);
        pdgw_free(rep->rows[i].detail);
        pdgw_free(rep->rows[i].fix);
    }
    pdgw_free(rep->rows);
    pthread_mutex_destroy(&rep->mu);
    pdgw_free(rep);
}

pdgw_doctor_report_t *doc_report_new(size_t instances)
{
    pdgw_doctor_report_t *rep = pdgw_calloc(1, sizeof(*rep));
    if (rep == NULL)
        return NULL;
    pthread_mutex_init(&rep->mu, NULL);
    rep->instances = instances;
    return rep;
}

const pdgw_doctor_row_t *pdgw_doctor_rows(const pdgw_doctor_report_t *rep, size_t *n_out)
{
    *n_out = rep->n;
    return rep->rows;
}

size_t pdgw_doctor_count(const pdgw_doctor_report_t *rep, pdgw_doctor_result_t r)
{
    size_t i, n = 0;
    for (i = 0; i < rep->n; i++)
        n += rep->rows[i].result == r;
    return n;
}

static int row_cmp(const void *a, const void *b)
{
    const pdgw_doctor_row_t *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

void doc_report_sort(pdgw_doctor_report_t *rep)
{
    if (rep->n > 1)
        qsort(rep->rows, rep->n, sizeof(*rep->rows), row_cmp);
}

/* ---------------------------------------------------------------- targets */

typedef struct collect {
    doc_target_t *t;
    size_t n, cap;
    bool nomem;
} collect_t;

static bool collect_one(void *arg, sched_instance_t *inst)
{
    collect_t *c = arg;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        doc_target_t *nt = pdgw_realloc(c->t, cap * sizeof(*nt));
        if (nt == NULL) {
            c->nomem = true;
            return false;
        }
        c->t = nt;
        c->cap = cap;
    }
    memset(&c->t[c->n], 0, sizeof(c->t[c->n]));
    c->t[c->n].index = c->n;
    c->t[c->n].inst = sched_instance_ref(inst);
    c->t[c->n].desc = sched_instance_desc(inst);
    pdgw_instance_view_from_sched(&c->t[c->n].view, inst);
    c->n++;
    return true;
}

static void targets_free(collect_t *c)
{
    size_t i, j;
    for (i = 0; i < c->n; i++) {
        for (j = 0; j < c->t[i].n_served; j++)
            pdgw_free(c->t[i].served[j]);
        sched_instance_unref(c->t[i].inst);
    }
    pdgw_free(c->t);
}

typedef struct workers {
    doc_run_t *run;
    collect_t *targets;
    atomic_size_t next;
} workers_t;

static bool stopped(const doc_run_t *run)
{
    struct pollfd p = {.fd = run->opts->stop_fd, .events = POLLIN};
    return run->opts->stop_fd >= 0 && poll(&p, 1, 0) > 0;
}

static void *worker_main(void *arg)
{
    workers_t *w = arg;
    size_t i;
    while ((i = atomic_fetch_add(&w->next, 1)) < w->targets->n) {
        doc_target_t *t = &w->targets->t[i];
        if (stopped(w->run))
            break;
        doc_probe_http(w->run, t);
        doc_probe_proto(w->run, t);
        doc_probe_kvev(w->run, t);
    }
    return NULL;
}

/* ---------------------------------------------------------------- fleet checks */

static bool served_by(const doc_target_t *t, const char *model)
{
    size_t i;
    for (i = 0; i < t->n_served; i++) {
        if (strcmp(t->served[i], model) == 0)
            return true;
    }
    return false;
}

/* The top-level `models:` list: each name must be served somewhere. */
void doc_check_fleet_models(doc_run_t *run, const doc_target_t *t, size_t n)
{
    const pdgw_str_list_t *m = &run->opts->cfg->models;
    size_t i, j;
    for (i = 0; i < m->count; i++) {
        bool known = false, served = false;
        for (j = 0; j < n; j++) {
            known |= t[j].models_known;
            served |= served_by(&t[j], m->items[i]);
        }
        if (known && !served)
            doc_row(run, NULL, "models", PDGW_DOCTOR_ERROR,
                    "name a model the engines serve in `models:` (or start an engine with "
                    "--served-model-name for it)",
                    "`models:` lists \"%s\" but no instance's GET /v1/models has it", m->items[i]);
    }
}

/* KV events of instances serving the same model should carry one block size: the index
 * hashes blocks of that size, and a PD pair moves KV in blocks. */
void doc_check_block_sizes(doc_run_t *run, const doc_target_t *t, size_t n)
{
    size_t i, j, k;
    for (i = 0; i < n; i++) {
        const doc_target_t *a = &t[i];
        if (a->block_size <= 0)
            continue;
        for (j = 0; j < n; j++) {
            const doc_target_t *b = &t[j];
            if (j == i || b->block_size <= 0 || b->block_size == a->block_size)
                continue;
            for (k = 0; k < a->n_served; k++) {
                if (served_by(b, a->served[k]))
                    break;
            }
            if (k == a->n_served && (a->n_served > 0 || b->n_served > 0))
                continue;
            doc_row(run, a, "kv-events block size", PDGW_DOCTOR_WARN,
                    "start every engine of the model with the same --block-size",
                    "events carry block size %d, instance %s of the same model %d", a->block_size,
                    b->view.id, b->block_size);
            break;
        }
    }
}

/* ---------------------------------------------------------------- run */

pdgw_status_t pdgw_doctor_run(const pdgw_doctor_opts_t *opts_in, sched_pool_t *pool,
                              pdgw_doctor_report_t **out)
{
    pdgw_doctor_opts_t opts = *opts_in;
    pdgw_doctor_report_t *rep;
    collect_t c = {0};
    doc_run_t run;
    workers_t w;
    pthread_t th[PDGW_DOCTOR_THREADS];
    size_t n_th, i, started = 0;

    if (opts.timeout_ms == 0)
        opts.timeout_ms = opts.cfg->check_engines_timeout_ms;
    rep = doc_report_new(0);
    if (rep == NULL)
        return PDGW_ERR_NOMEM;
    run.opts = &opts;
    run.rep = rep;
    run.protocol = opts.cfg->protocol;

    sched_pool_foreach(pool, collect_one, &c);
    if (c.nomem) {
        targets_free(&c);
        pdgw_doctor_report_free(rep);
        return PDGW_ERR_NOMEM;
    }
    rep->instances = c.n;
    if (c.n == 0)
        doc_row(&run, NULL, "instances", PDGW_DOCTOR_ERROR,
                "add `instances:` or check the discovery settings (names, selectors)",
                "no instance is configured or was discovered");

    w.run = &run;
    w.targets = &c;
    atomic_init(&w.next, 0);
    n_th = c.n < PDGW_DOCTOR_THREADS ? c.n : PDGW_DOCTOR_THREADS;
    for (i = 0; i < n_th; i++) {
        if (pthread_create(&th[i], NULL, worker_main, &w) != 0)
            break;
        started++;
    }
    if (started == 0 && c.n > 0)
        worker_main(&w); /* no thread: probe here, one by one */
    for (i = 0; i < started; i++)
        pthread_join(th[i], NULL);

    doc_check_fleet_models(&run, c.t, c.n);
    doc_check_block_sizes(&run, c.t, c.n);
    targets_free(&c);
    doc_report_sort(rep);
    *out = rep;
    return PDGW_OK;
}

/* ---------------------------------------------------------------- output */

static int width(const pdgw_doctor_report_t *rep, size_t field, int min)
{
    size_t i;
    int w = min;
    for (i = 0; i < rep->n; i++) {
        const char *s = field == 0 ? rep->rows[i].instance : rep->rows[i].check;
        int l = (int)strlen(s);
        w = l > w ? l : w;
    }
    return w > 40 ? 40 : w;
}

static void print_json(const pdgw_doctor_report_t *rep, FILE *out)
{
    json_t *o = json_object(), *a = json_array();
    size_t i;
    char *s;
    if (o == NULL || a == NULL) {
        json_decref(o);
        json_decref(a);
        fprintf(out, "{\"ok\":false,\"error\":\"out of memory\"}\n");
        return;
    }
    for (i = 0; i < rep->n; i++) {
        const pdgw_doctor_row_t *r = &rep->rows[i];
        json_array_append_new(a,
                              json_pack("{s:s,s:s,s:s,s:s,s:s}", "instance", r->instance, "check",
                                        r->check, "result", pdgw_doctor_result_name(r->result),
                                        "detail", r->detail, "fix", r->fix));
    }
    json_object_set_new(o, "ok", json_boolean(pdgw_doctor_count(rep, PDGW_DOCTOR_ERROR) == 0));
    json_object_set_new(o, "errors",
                        json_integer((json_int_t)pdgw_doctor_count(rep, PDGW_DOCTOR_ERROR)));
    json_object_set_new(o, "warnings",
                        json_integer((json_int_t)pdgw_doctor_count(rep, PDGW_DOCTOR_WARN)));
    json_object_set_new(o, "instances", json_integer((json_int_t)rep->instances));
    json_object_set_new(o, "checks", a);
    s = json_dumps(o, JSON_INDENT(2));
    fprintf(out, "%s\n", s != NULL ? s : "{\"ok\":false,\"error\":\"out of memory\"}");
    free(s);
    json_decref(o);
}

void pdgw_doctor_print(const pdgw_doctor_report_t *rep, bool json, FILE *out)
{
    int wi = width(rep, 0, 8), wc = width(rep, 1, 5);
    size_t i;
    if (json) {
        print_json(rep, out);
        return;
    }
    fprintf(out, "%-*s  %-*s  %-6s  %s\n", wi, "INSTANCE", wc, "CHECK", "RESULT",
            "FINDING / WHAT TO CHANGE");
    for (i = 0; i < rep->n; i++) {
        const pdgw_doctor_row_t *r = &rep->rows[i];
        fprintf(out, "%-*s  %-*s  %-6s  %s\n", wi, r->instance, wc, r->check,
                pdgw_doctor_result_name(r->result), r->detail);
        if (r->fix[0] != '\0')
            fprintf(out, "%-*s  %-*s  %-6s  -> %s\n", wi, "", wc, "", "", r->fix);
    }
    fprintf(out, "%zu instance(s), %zu check(s): %zu error(s), %zu warning(s)\n", rep->instances,
            rep->n, pdgw_doctor_count(rep, PDGW_DOCTOR_ERROR),
            pdgw_doctor_count(rep, PDGW_DOCTOR_WARN));
}

/* ---------------------------------------------------------------- --check-engines */

static bool count_discovered(void *arg, sched_instance_t *inst)
{
    size_t *n = arg;
    *n += sched_instance_desc(inst)->source != SCHED_SOURCE_STATIC;
    return true;
}

/* Discovery reports from its own threads and says nothing when its first round is done:
 * look every 50 ms until an instance came or the bound passed. */
static size_t wait_discovery(sched_pool_t *pool, uint64_t bound_ms)
{
    uint64_t end = pdgw_time_mono_ms() + bound_ms;
    struct timespec ts = {0, 50 * 1000 * 1000};
    size_t n;
    for (;;) {
        n = 0;
        sched_pool_foreach(pool, count_discovered, &n);
        if (n > 0 || pdgw_time_mono_ms() >= end)
            return n;
        nanosleep(&ts, NULL);
    }
}

int pdgw_doctor_main(const pdgw_config_t *cfg, sched_pool_t *pool, bool json, FILE *out)
{
    pdgw_doctor_opts_t opts = {.cfg = cfg,
                               .timeout_ms = cfg->check_engines_timeout_ms,
                               .events_wait_ms = cfg->check_engines_events_wait_ms,
                               .stop_fd = -1};
    pdgw_doctor_report_t *rep = NULL;
    size_t discovered = 0;
    int rc;

    if (cfg->dns_enabled || cfg->k8s_enabled)
        discovered = wait_discovery(pool, 2 * opts.timeout_ms);
    if (pdgw_doctor_run(&opts, pool, &rep) != PDGW_OK) {
        fprintf(stderr, "pdgw: --check-engines: out of memory\n");
        return 1;
    }
    if (cfg->dns_enabled || cfg->k8s_enabled) {
        doc_run_t run = {.opts = &opts, .rep = rep, .protocol = cfg->protocol};
        if (discovered == 0)
            doc_row(&run, NULL, "discovery", PDGW_DOCTOR_ERROR,
                    "check the discovery names / selectors and that the engines are up",
                    "%s discovery found no instance within %llu ms",
                    cfg->dns_enabled ? "DNS" : "Kubernetes",
                    (unsigned long long)(2 * opts.timeout_ms));
        else
            doc_row(&run, NULL, "discovery", PDGW_DOCTOR_OK, NULL, "%zu instance(s) discovered",
                    discovered);
        doc_report_sort(rep);
    }
    pdgw_doctor_print(rep, json, out);
    fflush(out);
    rc = pdgw_doctor_count(rep, PDGW_DOCTOR_ERROR) > 0 ? 1 : 0;
    pdgw_doctor_report_free(rep);
    return rc;
}

/* ---------------------------------------------------------------- start-up run */

struct pdgw_doctor_bg {
    pdgw_config_t cfg; /* the fields the probes read, owned */
    sched_pool_t *pool;
    pdgw_metrics_t *reg;
    int stop_pipe[2];
    pthread_t thread;
    bool started;
    _Atomic size_t counts[4];
    _Atomic bool done;
};

static pdgw_status_t bg_metrics(void *ctx, pdgw_buf_t *out)
{
    pdgw_doctor_bg_t *bg = ctx;
    pdgw_status_t st;
    size_t r;
    if (!atomic_load(&bg->done))
        return PDGW_OK;
    st = pdgw_buf_append_str(out, "# HELP pdgw_engine_checks Findings of the start-up engine "
                                  "checks (check_engines_at_start), by result.\n"
                                  "# TYPE pdgw_engine_checks gauge\n");
    for (r = 0; st == PDGW_OK && r < 4; r++)
        st = pdgw_buf_appendf(out, "pdgw_engine_checks{result=\"%s\"} %zu\n", result_names[r],
                              atomic_load(&bg->counts[r]));
    return st;
}

static void *bg_main(void *arg)
{
    pdgw_doctor_bg_t *bg = arg;
    pdgw_doctor_opts_t opts = {.cfg = &bg->cfg,
                               .timeout_ms = bg->cfg.check_engines_timeout_ms,
                               .events_wait_ms = bg->cfg.check_engines_events_wait_ms,
                               .stop_fd = bg->stop_pipe[0]};
    pdgw_doctor_report_t *rep = NULL;
    const pdgw_doctor_row_t *rows;
    size_t n, i;

    if (bg->cfg.dns_enabled || bg->cfg.k8s_enabled)
        (void)wait_discovery(bg->pool, 2 * opts.timeout_ms);
    if (pdgw_doctor_run(&opts, bg->pool, &rep) != PDGW_OK) {
        pdgw_log_warn("doctor", "engine checks: out of memory");
        return NULL;
    }
    if (stopped(&(doc_run_t){.opts = &opts})) {
        /* cut short at shutdown: what was not probed to the end would read as findings */
        pdgw_log_info("doctor", "engine checks stopped at shutdown");
        pdgw_doctor_report_free(rep);
        return NULL;
    }
    rows = pdgw_doctor_rows(rep, &n);
    for (i = 0; i < n; i++) {
        atomic_fetch_add(&bg->counts[rows[i].result], 1);
        if (rows[i].result >= PDGW_DOCTOR_WARN)
            pdgw_log_warn("doctor", "engine check %s %s: %s: %s%s%s", rows[i].instance,
                          rows[i].check, pdgw_doctor_result_name(rows[i].result), rows[i].detail,
                          rows[i].fix[0] ? "; change: " : "", rows[i].fix);
    }
    pdgw_log_info("doctor", "engine checks done: %zu instance(s), %zu error(s), %zu warning(s)",
                  rep->instances, pdgw_doctor_count(rep, PDGW_DOCTOR_ERROR),
                  pdgw_doctor_count(rep, PDGW_DOCTOR_WARN));
    atomic_store(&bg->done, true);
    pdgw_doctor_report_free(rep);
    return NULL;
}

static void bg_cfg_free(pdgw_config_t *c)
{
    size_t i;
    pdgw_free(c->protocol);
    for (i = 0; i < c->models.count; i++)
        pdgw_free(c->models.items[i]);
    pdgw_free(c->models.items);
    for (i = 0; i < c->protocol_options.count; i++) {
        pdgw_free(c->protocol_options.items[i].key);
        pdgw_free(c->protocol_options.items[i].value);
    }
    pdgw_free(c->protocol_options.items);
}

/* What the probes read: the protocol and its options, the models, the policies, the bounds. */
static pdgw_status_t bg_cfg_copy(pdgw_config_t *d, const pdgw_config_t *s)
{
    size_t i;
    memset(d, 0, sizeof(*d));
    d->prefill_policy = s->prefill_policy;
    d->decode_policy = s->decode_policy;
    d->metrics_scrape_interval_ms = s->metrics_scrape_interval_ms;
    d->kv_events_max_message_bytes = s->kv_events_max_message_bytes;
    d->check_engines_timeout_ms = s->check_engines_timeout_ms;
    d->check_engines_events_wait_ms = s->check_engines_events_wait_ms;
    d->dns_enabled = s->dns_enabled;
    d->k8s_enabled = s->k8s_enabled;
    d->protocol = pdgw_strdup(s->protocol);
    d->models.items = pdgw_calloc(s->models.count + 1, sizeof(char *));
    d->protocol_options.items = pdgw_calloc(s->protocol_options.count + 1, sizeof(pdgw_kv_t));
    if (d->protocol == NULL || d->models.items == NULL || d->protocol_options.items == NULL)
        return PDGW_ERR_NOMEM;
    for (i = 0; i < s->models.count; i++) {
        d->models.items[i] = pdgw_strdup(s->models.items[i]);
        if (d->models.items[i] == NULL)
            return PDGW_ERR_NOMEM;
        d->models.count++;
    }
    for (i = 0; i < s->protocol_options.count; i++) {
        pdgw_kv_t *kv = &d->protocol_options.items[i];
        kv->key = pdgw_strdup(s->protocol_options.items[i].key);
        kv->value = pdgw_strdup(s->protocol_options.items[i].value);
        d->protocol_options.count++;
        if (kv->key == NULL || kv->value == NULL)
            return PDGW_ERR_NOMEM;
    }
    return PDGW_OK;
}

pdgw_status_t pdgw_doctor_bg_create(const pdgw_config_t *cfg, pdgw_doctor_bg_t **out)
{
    pdgw_doctor_bg_t *bg = pdgw_calloc(1, sizeof(*bg));
    if (bg == NULL)
        return PDGW_ERR_NOMEM;
    if (bg_cfg_copy(&bg->cfg, cfg) != PDGW_OK) {
        bg_cfg_free(&bg->cfg);
        pdgw_free(bg);
        return PDGW_ERR_NOMEM;
    }
    if (pipe2(bg->stop_pipe, O_CLOEXEC) != 0) {
        bg_cfg_free(&bg->cfg);
        pdgw_free(bg);
        return PDGW_ERR_IO;
    }
    *out = bg;
    return PDGW_OK;
}

pdgw_status_t pdgw_doctor_bg_start(pdgw_doctor_bg_t *bg, sched_pool_t *pool, pdgw_metrics_t *reg)
{
    bg->pool = pool;
    if (pthread_create(&bg->thread, NULL, bg_main, bg) != 0)
        return PDGW_ERR_IO;
    bg->started = true;
    if (reg != NULL && pdgw_metrics_collector_add(reg, bg_metrics, bg) == PDGW_OK)
        bg->reg = reg;
    return PDGW_OK;
}

void pdgw_doctor_bg_destroy(pdgw_doctor_bg_t *bg)
{
    if (bg == NULL)
        return;
    if (bg->started) {
        if (write(bg->stop_pipe[1], "x", 1) < 0)
            pdgw_log_debug("doctor", "stop pipe: %s", strerror(errno));
        pthread_join(bg->thread, NULL);
    }
    if (bg->reg != NULL)
        pdgw_metrics_collector_remove(bg->reg, bg_metrics, bg);
    close(bg->stop_pipe[0]);
    close(bg->stop_pipe[1]);
    bg_cfg_free(&bg->cfg);
    pdgw_free(bg);
}
