/*
 * pdgw_metrics.c - Prometheus registry with lock-free updates and lookups.
 *
 * Series of a family live in a fixed-capacity, append-only pointer array: readers load the
 * published count (acquire) and scan; a writer creating a series appends under the family
 * mutex and publishes the new count (release). Series are never removed before the
 * registry is destroyed, so a handle stays valid for the registry's lifetime.
 */
#include "pdb/pdb_prom.h"
#include "pdgw_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#define XXH_INLINE_ALL /* as pdgw_tokenize.c: header-only, nothing to link */
#include <xxhash.h>

#include "pdgw_alloc.h"
#include "pdgw_json_text.h"
#include "pdgw_log.h"

#define LABEL_VALUE_MAX 256
#define MAX_COLLECTORS  16

struct pdgw_metric {
    pdgw_metric_family_t *fam;
    uint64_t hash;
    char **values;            /* n_labels strings */
    _Atomic uint64_t ivalue;  /* counter: integer increments */
    _Atomic uint64_t dbits;   /* counter: fractional increments; gauge value; histogram sum */
    _Atomic uint64_t *counts; /* histogram: per bucket (not cumulative), n_bounds + 1 */
};

struct pdgw_metric_family {
    pdgw_metrics_t *reg;
    pdgw_metric_type_t type;
    char *name;
    char *help;
    char **labels;
    size_t n_labels;
    double *bounds;
    size_t n_bounds;
    size_t cap;
    _Atomic size_t count;
    pdgw_metric_t **series;
    pthread_mutex_t lock;
    pdgw_metric_family_t *next;
    uint64_t id; /* unique in the process: see series_memo_t */
};

static _Atomic uint64_t next_family_id = 1;

struct pdgw_metrics {
    size_t max_series;
    pthread_mutex_t lock; /* family list, collectors, render */
    pdgw_metric_family_t *first, *last;
    struct {
        pdgw_metrics_collect_fn fn;
        void *ctx;
    } collectors[MAX_COLLECTORS];
    size_t n_collectors;
    pdgw_metric_t *refused; /* pdgw_metrics_series_refused_total */
};

static const double default_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

const double pdgw_metrics_duration_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                                5,     10,   20,    30,   60,  120,  300, 600};
const size_t pdgw_metrics_duration_buckets_n =
    sizeof(pdgw_metrics_duration_buckets) / sizeof(double);
const double pdgw_metrics_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                            0.1,   0.25,  0.5,  0.75, 1,    2.5,  5,
                                            7.5,   10,    20,   40,   60};
const size_t pdgw_metrics_ttft_buckets_n = sizeof(pdgw_metrics_ttft_buckets) / sizeof(double);
const double pdgw_metrics_tpot_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                            0.2,   0.3,   0.4,  0.5,   0.75, 1,     2.5, 5};
const size_t pdgw_metrics_tpot_buckets_n = sizeof(pdgw_metrics_tpot_buckets) / sizeof(double);

/* ---------------------------------------------------------------- atomics on doubles */

static double bits_to_d(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static uint64_t d_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof(b));
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d_to_bits(bits_to_d(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* ---------------------------------------------------------------- names */

static bool valid_metric_name(const char *s)
{
    if (s == NULL || *s == '\0')
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

static bool valid_label_name(const char *s)
{
    if (s == NULL || *s == '\0' || strncmp(s, "__", 2) == 0)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

/* Well-formed UTF-8 (no overlongs, no surrogates), no NUL. */
static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

/* ---------------------------------------------------------------- registry */

static void family_free(pdgw_metric_family_t *fam)
{
    if (fam == NULL)
        return;
    size_t n = atomic_load(&fam->count);
    for (size_t i = 0; i < n; i++) {
        pdgw_metric_t *m = fam->series[i];
        for (size_t k = 0; k < fam->n_labels; k++)
            pdgw_free(m->values[k]);
        pdgw_free(m->values);
        pdgw_free(m->counts);
        pdgw_free(m);
    }
    for (size_t k = 0; k < fam->n_labels; k++)
        pdgw_free(fam->labels[k]);
    pdgw_free(fam->labels);
    pdgw_free(fam->series);
    pdgw_free(fam->bounds);
    pdgw_free(fam->name);
    pdgw_free(fam->help);
    pthread_mutex_destroy(&fam->lock);
    pdgw_free(fam);
}

pdgw_status_t pdgw_metrics_create(size_t max_series_per_family, pdgw_metrics_t **out)
{
    pdgw_metrics_t *reg = pdgw_calloc(1, sizeof(*reg));
    if (reg == NULL)
        return PDGW_ERR_NOMEM;
    reg->max_series =
        max_series_per_family != 0 ? max_series_per_family : PDGW_METRICS_DEFAULT_MAX_SERIES;
    pthread_mutex_init(&reg->lock, NULL);
    pdgw_metric_family_t *fam;
    pdgw_status_t st = pdgw_metrics_family_add(
        reg, PDGW_METRIC_COUNTER, "pdgw_metrics_series_refused_total",
        "Label sets refused because a metric family reached its series cap.", NULL, 0, NULL, 0,
        &fam);
    if (st != PDGW_OK)
        goto err_reg;
    reg->refused = pdgw_metric_family_series(fam, NULL);
    if (reg->refused == NULL) {
        st = PDGW_ERR_NOMEM;
        goto err_reg;
    }
    *out = reg;
    return PDGW_OK;

err_reg:
    pdgw_metrics_destroy(reg);
    return st;
}

void pdgw_metrics_destroy(pdgw_metrics_t *reg)
{
    if (reg == NULL)
        return;
    pdgw_metric_family_t *f = reg->first;
    while (f != NULL) {
        pdgw_metric_family_t *next = f->next;
        family_free(f);
        f = next;
    }
    pthread_mutex_destroy(&reg->lock);
    pdgw_free(reg);
}

static pdgw_metric_family_t *find_locked(pdgw_metrics_t *reg, const char *name)
{
    for (pdgw_metric_family_t *f = reg->first; f != NULL; f = f->next) {
        if (strcmp(f->name, name) == 0)
            return f;
    }
    return NULL;
}

pdgw_metric_family_t *pdgw_metrics_family_find(pdgw_metrics_t *reg, const char *name)
{
    pthread_mutex_lock(&reg->lock);
    pdgw_metric_family_t *f = find_locked(reg, name);
    pthread_mutex_unlock(&reg->lock);
    return f;
}

pdgw_status_t pdgw_metrics_family_add(pdgw_metrics_t *reg, pdgw_metric_type_t type,
                                      const char *name, const char *help,
                                      const char *const *label_names, size_t n_labels,
                                      const double *buckets, size_t n_buckets,
                                      pdgw_metric_family_t **out)
{
    if (reg == NULL || !valid_metric_name(name) || n_labels > PDGW_METRICS_MAX_LABELS ||
        (n_labels > 0 && label_names == NULL) || type < PDGW_METRIC_COUNTER ||
        type > PDGW_METRIC_HISTOGRAM)
        return PDGW_ERR_INVALID;
    for (size_t i = 0; i < n_labels; i++) {
        if (!valid_label_name(label_names[i]) ||
            (type == PDGW_METRIC_HISTOGRAM && strcmp(label_names[i], "le") == 0))
            return PDGW_ERR_INVALID;
        for (size_t k = 0; k < i; k++) {
            if (strcmp(label_names[i], label_names[k]) == 0)
                return PDGW_ERR_INVALID;
        }
    }
    if (type == PDGW_METRIC_HISTOGRAM) {
        if (buckets == NULL || n_buckets == 0) {
            buckets = default_buckets;
            n_buckets = sizeof(default_buckets) / sizeof(default_buckets[0]);
        }
        if (n_buckets > PDGW_METRICS_MAX_BUCKETS)
            return PDGW_ERR_INVALID;
        for (size_t i = 0; i < n_buckets; i++) {
            if (!isfinite(buckets[i]) || (i > 0 && !(buckets[i] > buckets[i - 1])))
                return PDGW_ERR_INVALID;
        }
    } else {
        n_buckets = 0;
    }

    pdgw_status_t st = PDGW_ERR_NOMEM;
    pdgw_metric_family_t *fam = pdgw_calloc(1, sizeof(*fam));
    if (fam == NULL)
        return PDGW_ERR_NOMEM;
    pthread_mutex_init(&fam->lock, NULL);
    fam->id = atomic_fetch_add_explicit(&next_family_id, 1, memory_order_relaxed);
    fam->reg = reg;
    fam->type = type;
    fam->cap = reg->max_series;
    fam->name = pdgw_strdup(name);
    fam->help = pdgw_strdup(help != NULL ? help : "");
    fam->series = pdgw_calloc(fam->cap, sizeof(*fam->series));
    if (fam->name == NULL || fam->help == NULL || fam->series == NULL)
        goto err_fam;
    if (n_labels > 0) {
        fam->labels = pdgw_calloc(n_labels, sizeof(char *));
        if (fam->labels == NULL)
            goto err_fam;
        for (size_t i = 0; i < n_labels; i++) {
            fam->labels[i] = pdgw_strdup(label_names[i]);
            if (fam->labels[i] == NULL)
                goto err_fam;
            fam->n_labels = i + 1;
        }
    }
    if (n_buckets > 0) {
        fam->bounds = pdgw_malloc(n_buckets * sizeof(double));
        if (fam->bounds == NULL)
            goto err_fam;
        memcpy(fam->bounds, buckets, n_buckets * sizeof(double));
        fam->n_bounds = n_buckets;
    }

    pthread_mutex_lock(&reg->lock);
    if (find_locked(reg, name) != NULL) {
        pthread_mutex_unlock(&reg->lock);
        st = PDGW_ERR_EXISTS;
        goto err_fam;
    }
    if (reg->last != NULL)
        reg->last->next = fam;
    else
        reg->first = fam;
    reg->last = fam;
    pthread_mutex_unlock(&reg->lock);
    if (out != NULL)
        *out = fam;
    return PDGW_OK;

err_fam:
    family_free(fam);
    return st;
}

/* ---------------------------------------------------------------- series */

const char *pdgw_metric_status_label(int status, char buf[PDGW_STATUS_LABEL_SIZE])
{
    /* Once per request and metric family: written without snprintf. */
    buf[PDGW_STATUS_LABEL_SIZE - 1] = '\0';
    return pdgw_json_int_text(status, buf + PDGW_STATUS_LABEL_SIZE - 1);
}

/* A request looks a series up by label values that are nearly always the same strings at the
 * same addresses (the protocol from the options, status and phase names from tables, a model
 * or instance name held for the request's life). Each thread remembers its recent lookups by
 * family and value addresses: a hit costs one strcmp per label instead of a hash and a scan.
 * The family is named by an id no other family ever gets (a freed family's address can be
 * reused), and a hit still compares the values with the series' own, so a value address that
 * now holds other text misses. */
#define MEMO_SLOTS  64
#define MEMO_LABELS 2
typedef struct series_memo {
    uint64_t fam_id;
    const char *values[MEMO_LABELS];
    pdgw_metric_t *m;
} series_memo_t;
static _Thread_local series_memo_t series_memo[MEMO_SLOTS];

static series_memo_t *memo_slot(const pdgw_metric_family_t *fam, const char *const *values)
{
    uint64_t h = fam->id * 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < fam->n_labels; i++)
        h = (h ^ (uint64_t)(uintptr_t)values[i]) * 0x9e3779b97f4a7c15u;
    return &series_memo[h >> 58]; /* 64 slots */
}

static pdgw_metric_t *memo_find(const series_memo_t *e, const pdgw_metric_family_t *fam,
                                const char *const *values)
{
    if (e->fam_id != fam->id || e->m == NULL)
        return NULL;
    for (size_t i = 0; i < fam->n_labels; i++)
        if (e->values[i] != values[i] || strcmp(e->m->values[i], values[i]) != 0)
            return NULL;
    return e->m;
}

static pdgw_metric_t *memo_keep(series_memo_t *e, const pdgw_metric_family_t *fam,
                                const char *const *values, pdgw_metric_t *m)
{
    if (m != NULL) {
        e->fam_id = fam->id;
        for (size_t i = 0; i < fam->n_labels; i++)
            e->values[i] = values[i];
        e->m = m;
    }
    return m;
}

/* Series missing from the memo are found by hash (a byte-at-a-time hash of their label values
 * was most of such a lookup). Each value's hash seeds the next, and its length goes in too, so
 * ("ab","c") and ("a","bc") differ. */
static uint64_t hash_values(const char *const *values, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(values[i]);
        h = XXH3_64bits_withSeed(values[i], len, h ^ len);
    }
    return h;
}

static bool series_matches(const pdgw_metric_t *m, uint64_t h, const char *const *values, size_t n)
{
    if (m->hash != h)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m->values[i], values[i]) != 0)
            return false;
    }
    return true;
}

static pdgw_metric_t *scan(pdgw_metric_family_t *fam, size_t from, size_t to, uint64_t h,
                           const char *const *values)
{
    for (size_t i = from; i < to; i++) {
        pdgw_metric_t *m = fam->series[i];
        if (series_matches(m, h, values, fam->n_labels))
            return m;
    }
    return NULL;
}

static pdgw_metric_t *series_new(pdgw_metric_family_t *fam, uint64_t h, const char *const *values)
{
    pdgw_metric_t *m = pdgw_calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->fam = fam;
    m->hash = h;
    if (fam->n_labels > 0) {
        m->values = pdgw_calloc(fam->n_labels, sizeof(char *));
        if (m->values == NULL)
            goto err_m;
        for (size_t i = 0; i < fam->n_labels; i++) {
            m->values[i] = pdgw_strdup(values[i]);
            if (m->values[i] == NULL)
                goto err_m;
        }
    }
    if (fam->type == PDGW_METRIC_HISTOGRAM) {
        m->counts = pdgw_calloc(fam->n_bounds + 1, sizeof(*m->counts));
        if (m->counts == NULL)
            goto err_m;
    }
    return m;

err_m:
    if (m->values != NULL) {
        for (size_t i = 0; i < fam->n_labels; i++)
            pdgw_free(m->values[i]);
        pdgw_free(m->values);
    }
    pdgw_free(m);
    return NULL;
}

pdgw_metric_t *pdgw_metric_family_series(pdgw_metric_family_t *fam, const char *const *label_values)
{
    if (fam == NULL)
        return NULL;
    if (fam->n_labels > 0) {
        if (label_values == NULL)
            return NULL;
        for (size_t i = 0; i < fam->n_labels; i++) {
            if (label_values[i] == NULL)
                return NULL;
        }
    }
    series_memo_t *memo = fam->n_labels <= MEMO_LABELS ? memo_slot(fam, label_values) : NULL;
    pdgw_metric_t *m = memo != NULL ? memo_find(memo, fam, label_values) : NULL;
    if (m != NULL)
        return m;
    uint64_t h = hash_values(label_values, fam->n_labels);
    size_t n = atomic_load_explicit(&fam->count, memory_order_acquire);
    m = scan(fam, 0, n, h, label_values);
    if (m != NULL) /* values equal to a series' were checked when it was made */
        return memo != NULL ? memo_keep(memo, fam, label_values, m) : m;
    for (size_t i = 0; i < fam->n_labels; i++) {
        size_t len = strnlen(label_values[i], LABEL_VALUE_MAX + 1);
        if (len > LABEL_VALUE_MAX || !valid_utf8(label_values[i], len))
            return NULL;
    }

    pthread_mutex_lock(&fam->lock);
    size_t n2 = atomic_load_explicit(&fam->count, memory_order_relaxed);
    m = scan(fam, n, n2, h, label_values);
    if (m == NULL) {
        if (n2 >= fam->cap) {
            pthread_mutex_unlock(&fam->lock);
            pdgw_counter_inc(fam->reg->refused);
            return NULL;
        }
        m = series_new(fam, h, label_values);
        if (m != NULL) {
            fam->series[n2] = m;
            atomic_store_explicit(&fam->count, n2 + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&fam->lock);
    return memo != NULL ? memo_keep(memo, fam, label_values, m) : m;
}

pdgw_metric_t *pdgw_metric_family_series1(pdgw_metric_family_t *fam, const char *v1)
{
    const char *v[1] = {v1};
    return pdgw_metric_family_series(fam, v);
}

pdgw_metric_t *pdgw_metric_family_series2(pdgw_metric_family_t *fam, const char *v1, const char *v2)
{
    const char *v[2] = {v1, v2};
    return pdgw_metric_family_series(fam, v);
}

size_t pdgw_metric_family_size(const pdgw_metric_family_t *fam)
{
    return fam != NULL ? atomic_load(&((pdgw_metric_family_t *)fam)->count) : 0;
}

static pdgw_metric_t *simple_new(pdgw_metrics_t *reg, pdgw_metric_type_t type, const char *name,
                                 const char *help, const double *buckets, size_t n_buckets)
{
    pdgw_metric_family_t *fam;
    pdgw_status_t st =
        pdgw_metrics_family_add(reg, type, name, help, NULL, 0, buckets, n_buckets, &fam);
    if (st != PDGW_OK) {
        pdgw_log_error("metrics", "cannot add metric %s: %s", name, pdgw_strerror(st));
        return NULL;
    }
    return pdgw_metric_family_series(fam, NULL);
}

pdgw_metric_t *pdgw_metrics_counter_new(pdgw_metrics_t *reg, const char *name, const char *help)
{
    return simple_new(reg, PDGW_METRIC_COUNTER, name, help, NULL, 0);
}

pdgw_metric_t *pdgw_metrics_gauge_new(pdgw_metrics_t *reg, const char *name, const char *help)
{
    return simple_new(reg, PDGW_METRIC_GAUGE, name, help, NULL, 0);
}

pdgw_metric_t *pdgw_metrics_histogram_new(pdgw_metrics_t *reg, const char *name, const char *help,
                                          const double *buckets, size_t n_buckets)
{
    return simple_new(reg, PDGW_METRIC_HISTOGRAM, name, help, buckets, n_buckets);
}

/* ---------------------------------------------------------------- updates */

static bool is_type(const pdgw_metric_t *m, pdgw_metric_type_t t)
{
    return m != NULL && m->fam->type == t;
}

void pdgw_counter_inc(pdgw_metric_t *m)
{
    pdgw_counter_add(m, 1);
}

void pdgw_counter_add(pdgw_metric_t *m, uint64_t n)
{
    if (is_type(m, PDGW_METRIC_COUNTER))
        atomic_fetch_add_explicit(&m->ivalue, n, memory_order_relaxed);
}

void pdgw_counter_add_f(pdgw_metric_t *m, double v)
{
    if (is_type(m, PDGW_METRIC_COUNTER) && v > 0 && isfinite(v))
        atomic_add_double(&m->dbits, v);
}

void pdgw_gauge_set(pdgw_metric_t *m, double v)
{
    if (is_type(m, PDGW_METRIC_GAUGE))
        atomic_store_explicit(&m->dbits, d_to_bits(v), memory_order_relaxed);
}

void pdgw_gauge_add(pdgw_metric_t *m, double v)
{
    if (is_type(m, PDGW_METRIC_GAUGE))
        atomic_add_double(&m->dbits, v);
}

void pdgw_gauge_inc(pdgw_metric_t *m)
{
    pdgw_gauge_add(m, 1.0);
}

void pdgw_gauge_dec(pdgw_metric_t *m)
{
    pdgw_gauge_add(m, -1.0);
}

void pdgw_histogram_observe(pdgw_metric_t *m, double v)
{
    if (!is_type(m, PDGW_METRIC_HISTOGRAM) || isnan(v))
        return;
    const pdgw_metric_family_t *f = m->fam;
    /* Binary search for the first bound >= v (le is inclusive). */
    size_t lo = 0, hi = f->n_bounds;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v <= f->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&m->counts[lo], 1, memory_order_relaxed);
    atomic_add_double(&m->dbits, v);
}

double pdgw_metric_value(const pdgw_metric_t *m)
{
    if (m == NULL)
        return 0;
    pdgw_metric_t *w = (pdgw_metric_t *)m;
    double d = bits_to_d(atomic_load(&w->dbits));
    if (m->fam->type == PDGW_METRIC_COUNTER)
        return (double)atomic_load(&w->ivalue) + d;
    return d;
}

uint64_t pdgw_histogram_count(const pdgw_metric_t *m)
{
    if (!is_type(m, PDGW_METRIC_HISTOGRAM))
        return 0;
    uint64_t c = 0;
    for (size_t i = 0; i <= m->fam->n_bounds; i++)
        c += atomic_load(&m->counts[i]);
    return c;
}

double pdgw_histogram_sum(const pdgw_metric_t *m)
{
    if (!is_type(m, PDGW_METRIC_HISTOGRAM))
        return 0;
    return bits_to_d(atomic_load(&((pdgw_metric_t *)m)->dbits));
}

/* ---------------------------------------------------------------- collectors */

pdgw_status_t pdgw_metrics_collector_add(pdgw_metrics_t *reg, pdgw_metrics_collect_fn fn, void *ctx)
{
    if (reg == NULL || fn == NULL)
        return PDGW_ERR_INVALID;
    pdgw_status_t st = PDGW_OK;
    pthread_mutex_lock(&reg->lock);
    if (reg->n_collectors == MAX_COLLECTORS) {
        st = PDGW_ERR_LIMIT;
    } else {
        reg->collectors[reg->n_collectors].fn = fn;
        reg->collectors[reg->n_collectors].ctx = ctx;
        reg->n_collectors++;
    }
    pthread_mutex_unlock(&reg->lock);
    return st;
}

void pdgw_metrics_collector_remove(pdgw_metrics_t *reg, pdgw_metrics_collect_fn fn, void *ctx)
{
    if (reg == NULL)
        return;
    pthread_mutex_lock(&reg->lock);
    for (size_t i = 0; i < reg->n_collectors; i++) {
        if (reg->collectors[i].fn == fn && reg->collectors[i].ctx == ctx) {
            memmove(&reg->collectors[i], &reg->collectors[i + 1],
                    (reg->n_collectors - i - 1) * sizeof(reg->collectors[0]));
            reg->n_collectors--;
            break;
        }
    }
    pthread_mutex_unlock(&reg->lock);
}

/* ---------------------------------------------------------------- exposition */

/* The exposition's number and escaping rules are the base writer's (pdb_prom.h). */
static pdgw_status_t prom_status(pdb_status_t st)
{
    return st == PDB_OK ? PDGW_OK : st == PDB_ERR_NOMEM ? PDGW_ERR_NOMEM : PDGW_ERR_TOO_LARGE;
}

static pdgw_status_t put_double(pdgw_buf_t *out, double v)
{
    return prom_status(pdb_prom_put_double(out, v));
}

static pdgw_status_t put_help(pdgw_buf_t *out, const char *s)
{
    return prom_status(pdb_prom_put_help(out, s));
}

static pdgw_status_t put_label_value(pdgw_buf_t *out, const char *s)
{
    return prom_status(pdb_prom_put_label_value(out, s));
}

/* "{a="x",b="y"" + optional le, closing brace; nothing when there are no labels. */
static pdgw_status_t put_labels(pdgw_buf_t *out, const pdgw_metric_family_t *f,
                                const pdgw_metric_t *m, const double *le)
{
    if (f->n_labels == 0 && le == NULL)
        return PDGW_OK;
    pdgw_status_t st = pdgw_buf_append_char(out, '{');
    for (size_t i = 0; i < f->n_labels && st == PDGW_OK; i++) {
        if (i > 0)
            st = pdgw_buf_append_char(out, ',');
        if (st == PDGW_OK)
            st = pdgw_buf_appendf(out, "%s=\"", f->labels[i]);
        if (st == PDGW_OK)
            st = put_label_value(out, m->values[i]);
        if (st == PDGW_OK)
            st = pdgw_buf_append_char(out, '"');
    }
    if (le != NULL && st == PDGW_OK) {
        st = pdgw_buf_append_str(out, f->n_labels > 0 ? ",le=\"" : "le=\"");
        if (st == PDGW_OK)
            st = put_double(out, *le);
        if (st == PDGW_OK)
            st = pdgw_buf_append_char(out, '"');
    }
    if (st == PDGW_OK)
        st = pdgw_buf_append_char(out, '}');
    return st;
}

static pdgw_status_t render_series(pdgw_buf_t *out, const pdgw_metric_family_t *f, pdgw_metric_t *m)
{
    pdgw_status_t st = PDGW_OK;
    if (f->type != PDGW_METRIC_HISTOGRAM) {
        st = pdgw_buf_append_str(out, f->name);
        if (st == PDGW_OK)
            st = put_labels(out, f, m, NULL);
        if (st == PDGW_OK)
            st = pdgw_buf_append_char(out, ' ');
        if (st == PDGW_OK) {
            double d = bits_to_d(atomic_load(&m->dbits));
            if (f->type == PDGW_METRIC_COUNTER && d == 0)
                st = pdgw_buf_appendf(out, "%llu", (unsigned long long)atomic_load(&m->ivalue));
            else
                st = put_double(out, pdgw_metric_value(m));
        }
        if (st == PDGW_OK)
            st = pdgw_buf_append_char(out, '\n');
        return st;
    }
    uint64_t cum = 0;
    for (size_t i = 0; i <= f->n_bounds && st == PDGW_OK; i++) {
        double le = i < f->n_bounds ? f->bounds[i] : INFINITY;
        cum += atomic_load(&m->counts[i]);
        st = pdgw_buf_appendf(out, "%s_bucket", f->name);
        if (st == PDGW_OK)
            st = put_labels(out, f, m, &le);
        if (st == PDGW_OK)
            st = pdgw_buf_appendf(out, " %llu\n", (unsigned long long)cum);
    }
    if (st == PDGW_OK)
        st = pdgw_buf_appendf(out, "%s_sum", f->name);
    if (st == PDGW_OK)
        st = put_labels(out, f, m, NULL);
    if (st == PDGW_OK)
        st = pdgw_buf_append_char(out, ' ');
    if (st == PDGW_OK)
        st = put_double(out, bits_to_d(atomic_load(&m->dbits)));
    if (st == PDGW_OK)
        st = pdgw_buf_appendf(out, "\n%s_count", f->name);
    if (st == PDGW_OK)
        st = put_labels(out, f, m, NULL);
    if (st == PDGW_OK)
        st = pdgw_buf_appendf(out, " %llu\n", (unsigned long long)cum); /* == +Inf bucket */
    return st;
}

static const char *type_name(pdgw_metric_type_t t)
{
    return t == PDGW_METRIC_COUNTER ? "counter" : t == PDGW_METRIC_GAUGE ? "gauge" : "histogram";
}

pdgw_status_t pdgw_metrics_render(pdgw_metrics_t *reg, pdgw_buf_t *out)
{
    if (reg == NULL || out == NULL)
        return PDGW_ERR_INVALID;
    pdgw_status_t st = PDGW_OK;
    pthread_mutex_lock(&reg->lock);
    for (pdgw_metric_family_t *f = reg->first; f != NULL && st == PDGW_OK; f = f->next) {
        st = pdgw_buf_appendf(out, "# HELP %s ", f->name);
        if (st == PDGW_OK)
            st = put_help(out, f->help);
        if (st == PDGW_OK)
            st = pdgw_buf_appendf(out, "\n# TYPE %s %s\n", f->name, type_name(f->type));
        size_t n = atomic_load_explicit(&f->count, memory_order_acquire);
        for (size_t i = 0; i < n && st == PDGW_OK; i++)
            st = render_series(out, f, f->series[i]);
    }
    for (size_t i = 0; i < reg->n_collectors && st == PDGW_OK; i++) {
        size_t before = out->len;
        st = reg->collectors[i].fn(reg->collectors[i].ctx, out);
        if (st == PDGW_OK && out->len > before && out->data[out->len - 1] != '\n')
            st = pdgw_buf_append_char(out, '\n');
    }
    pthread_mutex_unlock(&reg->lock);
    return st;
}

/* ---------------------------------------------------------------- gateway metrics */

pdgw_status_t pdgw_gateway_metrics_init(pdgw_metrics_t *reg, const char *version,
                                        pdgw_gateway_metrics_t *gm)
{
    static const char *const l_proto[] = {"protocol"};
    static const char *const l_proto_status[] = {"protocol", "status"};
    static const char *const l_proto_phase[] = {"protocol", "phase"};
    static const char *const l_inst_role[] = {"instance", "role"};
    static const char *const l_upstream[] = {"protocol", "instance", "kind"};
    static const char *const l_reason[] = {"reason"};
    static const char *const l_kind[] = {"kind"};
    static const char *const l_writer[] = {"writer"};
    static const char *const l_version[] = {"version"};
    static const char *const l_pd_field[] = {"protocol", "field", "action"};
    pdgw_gateway_metrics_t g;
    memset(&g, 0, sizeof(g));
    g.reg = reg;
    pdgw_metric_family_t *inflight = NULL, *build = NULL;
    pdgw_status_t st;

#define ADD(type, name, help, labels, nl, b, nb, outp)                                             \
    do {                                                                                           \
        st = pdgw_metrics_family_add(reg, type, name, help, labels, nl, b, nb, outp);              \
        if (st != PDGW_OK)                                                                         \
            goto err;                                                                              \
    } while (0)

    ADD(PDGW_METRIC_COUNTER, "pdgw_requests_total",
        "Requests answered, by protocol and HTTP status.", l_proto_status, 2, NULL, 0,
        &g.requests_total);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_request_duration_seconds",
        "Time from request arrival to the last byte sent.", l_proto, 1,
        pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n, &g.request_duration);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_ttft_seconds",
        "Time to the first content event relayed to the client.", l_proto, 1,
        pdgw_metrics_ttft_buckets, pdgw_metrics_ttft_buckets_n, &g.ttft);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_tpot_seconds",
        "Time between consecutive content events relayed to the client.", l_proto, 1,
        pdgw_metrics_tpot_buckets, pdgw_metrics_tpot_buckets_n, &g.tpot);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_phase_duration_seconds",
        "Duration of request phases: queue (arrival to the first upstream leg), prefill "
        "(prefill leg), kv_transfer (prefill done to the first decode event, two-stage only), "
        "decode (decode leg).",
        l_proto_phase, 2, pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n,
        &g.phase_duration);
    ADD(PDGW_METRIC_GAUGE, "pdgw_inflight_requests", "Requests being served now.", NULL, 0, NULL, 0,
        &inflight);
    ADD(PDGW_METRIC_GAUGE, "pdgw_instance_inflight_requests",
        "Upstream legs in flight per instance and role.", l_inst_role, 2, NULL, 0,
        &g.instance_inflight);
    ADD(PDGW_METRIC_COUNTER, "pdgw_upstream_errors_total",
        "Failed upstream legs by protocol, instance and kind.", l_upstream, 3, NULL, 0,
        &g.upstream_errors);
    ADD(PDGW_METRIC_COUNTER, "pdgw_client_disconnects_total",
        "Requests whose client went away before the response ended.", l_proto, 1, NULL, 0,
        &g.client_disconnects);
    ADD(PDGW_METRIC_COUNTER, "pdgw_retries_total", "Upstream attempts retried on another instance.",
        l_proto, 1, NULL, 0, &g.retries);
    ADD(PDGW_METRIC_COUNTER, "pdgw_rejected_requests_total",
        "Requests refused before forwarding, by reason.", l_reason, 1, NULL, 0, &g.rejected);
    ADD(PDGW_METRIC_GAUGE, "pdgw_build_info", "Build information; the value is always 1.",
        l_version, 1, NULL, 0, &build);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_prefill_seconds",
        "Prefill leg duration (leg start to prefill response).", l_proto, 1,
        pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n, &g.prefill_seconds);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_kv_wait_seconds",
        "Time from prefill completion to the first relayed decode event (two-stage).", l_proto, 1,
        pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n, &g.kv_wait_seconds);
    ADD(PDGW_METRIC_HISTOGRAM, "pdgw_decode_seconds", "Decode leg duration.", l_proto, 1,
        pdgw_metrics_duration_buckets, pdgw_metrics_duration_buckets_n, &g.decode_seconds);
    ADD(PDGW_METRIC_COUNTER, "pdgw_pd_failures_total",
        "Requests that failed for good, by PD phase (prefill, kv_transfer, decode).", l_proto_phase,
        2, NULL, 0, &g.pd_failures);
    ADD(PDGW_METRIC_COUNTER, "pdgw_prefill_missing_kv_params_total",
        "Prefill responses without kv_transfer_params (decode recomputes the prompt).", l_proto, 1,
        NULL, 0, &g.prefill_missing_kv_params);
    ADD(PDGW_METRIC_COUNTER, "pdgw_pd_cancel_notifs_total",
        "KV cancel notices sent to release reservations of abandoned requests.", l_proto, 1, NULL,
        0, &g.pd_cancel_notifs);
    ADD(PDGW_METRIC_COUNTER, "pdgw_local_resource_errors_total",
        "Requests refused because the gateway itself ran out of a resource (descriptors, memory).",
        l_kind, 1, NULL, 0, &g.local_resource_errors);
    ADD(PDGW_METRIC_COUNTER, "pdgw_client_connections_closed_total",
        "Client connections refused at accept (connection_limit, per_client_limit, "
        "descriptor_limit) or closed by the gateway: request headers or body not in time "
        "(header_timeout, body_timeout), an answer not read in time (write_timeout), a request "
        "head refused (malformed_request, head_too_large).",
        l_reason, 1, NULL, 0, &g.conn_closed);
    ADD(PDGW_METRIC_COUNTER, "pdgw_client_streams_total",
        "Committed client streams by who wrote their body: direct (the gateway, on the socket) "
        "or library (libmicrohttpd: TLS, HTTP/1.0).",
        l_writer, 1, NULL, 0, &g.client_streams);
    ADD(PDGW_METRIC_COUNTER, "pdgw_prompt_tokens_total",
        "Prompt tokens the engines reported in usage (non-stream responses, and streams whose "
        "client asked for stream_options.include_usage).",
        l_proto, 1, NULL, 0, &g.prompt_tokens);
    ADD(PDGW_METRIC_COUNTER, "pdgw_completion_tokens_total",
        "Completion tokens the engines reported in usage (as pdgw_prompt_tokens_total).", l_proto,
        1, NULL, 0, &g.completion_tokens);
    ADD(PDGW_METRIC_COUNTER, "pdgw_client_pd_fields_total",
        "PD control fields found in client bodies, by field rule and action "
        "(rejected, stripped, passed).",
        l_pd_field, 3, NULL, 0, &g.client_pd_fields);
#undef ADD

    g.inflight = pdgw_metric_family_series(inflight, NULL);
    g.build_info = pdgw_metric_family_series1(build, version != NULL ? version : "unknown");
    if (g.inflight == NULL || g.build_info == NULL) {
        st = PDGW_ERR_NOMEM;
        goto err;
    }
    pdgw_gauge_set(g.build_info, 1);
    *gm = g;
    return PDGW_OK;

err:
    pdgw_log_error("metrics", "cannot register the gateway metrics: %s", pdgw_strerror(st));
    return st;
}

static const char *const phase_names[PDGW_DURATION_PHASES] = {
    [PDGW_DURATION_QUEUE] = "queue",
    [PDGW_DURATION_PREFILL] = "prefill",
    [PDGW_DURATION_KV_TRANSFER] = "kv_transfer",
    [PDGW_DURATION_DECODE] = "decode",
};

void pdgw_proto_metrics_init(pdgw_proto_metrics_t *pm, pdgw_gateway_metrics_t *gm,
                             const char *protocol)
{
    memset(pm, 0, sizeof(*pm));
    if (gm != NULL && protocol != NULL) {
        pm->gm = gm;
        pm->protocol = protocol;
    }
}

/* The view's series of <fam> with the protocol label (and <v2>, NULL for a family without a
 * second label): from <slot> once it was looked up. */
static pdgw_metric_t *view_series(pdgw_proto_metrics_t *pm, _Atomic(pdgw_metric_t *) *slot,
                                  pdgw_metric_family_t *fam, const char *v2)
{
    pdgw_metric_t *m = atomic_load_explicit(slot, memory_order_acquire);
    if (m != NULL)
        return m;
    m = v2 != NULL ? pdgw_metric_family_series2(fam, pm->protocol, v2)
                   : pdgw_metric_family_series1(fam, pm->protocol);
    atomic_store_explicit(slot, m, memory_order_release);
    return m;
}

void pdgw_gateway_metrics_request_done(pdgw_proto_metrics_t *pm, int http_status, double duration_s)
{
    if (pm == NULL || pm->gm == NULL)
        return;
    char status[PDGW_STATUS_LABEL_SIZE];
    pdgw_counter_inc(
        http_status == 200
            ? view_series(pm, &pm->requests_ok, pm->gm->requests_total, "200")
            : pdgw_metric_family_series2(pm->gm->requests_total, pm->protocol,
                                         pdgw_metric_status_label(http_status, status)));
    if (duration_s >= 0)
        pdgw_histogram_observe(
            view_series(pm, &pm->request_duration, pm->gm->request_duration, NULL), duration_s);
}

void pdgw_gateway_metrics_observe_ttft(pdgw_proto_metrics_t *pm, double seconds)
{
    if (pm != NULL && pm->gm != NULL)
        pdgw_histogram_observe(view_series(pm, &pm->ttft, pm->gm->ttft, NULL), seconds);
}

void pdgw_gateway_metrics_observe_tpot(pdgw_proto_metrics_t *pm, double seconds)
{
    if (pm != NULL && pm->gm != NULL)
        pdgw_histogram_observe(view_series(pm, &pm->tpot, pm->gm->tpot, NULL), seconds);
}

void pdgw_gateway_metrics_observe_phase(pdgw_proto_metrics_t *pm, pdgw_duration_phase_t phase,
                                        double seconds)
{
    if (pm != NULL && pm->gm != NULL && phase >= 0 && phase < PDGW_DURATION_PHASES)
        pdgw_histogram_observe(
            view_series(pm, &pm->phase[phase], pm->gm->phase_duration, phase_names[phase]),
            seconds);
}

void pdgw_gateway_metrics_observe_prefill(pdgw_proto_metrics_t *pm, double seconds)
{
    if (pm != NULL && pm->gm != NULL)
        pdgw_histogram_observe(view_series(pm, &pm->prefill_seconds, pm->gm->prefill_seconds, NULL),
                               seconds);
}

void pdgw_gateway_metrics_observe_kv_wait(pdgw_proto_metrics_t *pm, double seconds)
{
    if (pm == NULL || pm->gm == NULL)
        return;
    pdgw_histogram_observe(view_series(pm, &pm->kv_wait_seconds, pm->gm->kv_wait_seconds, NULL),
                           seconds);
    pdgw_histogram_observe(view_series(pm, &pm->phase[PDGW_DURATION_KV_TRANSFER],
                                       pm->gm->phase_duration,
                                       phase_names[PDGW_DURATION_KV_TRANSFER]),
                           seconds);
}

void pdgw_gateway_metrics_observe_decode(pdgw_proto_metrics_t *pm, double seconds)
{
    if (pm != NULL && pm->gm != NULL)
        pdgw_histogram_observe(view_series(pm, &pm->decode_seconds, pm->gm->decode_seconds, NULL),
                               seconds);
}

void pdgw_gateway_metrics_upstream_error(pdgw_gateway_metrics_t *gm, const char *protocol,
                                         const char *instance, const char *kind)
{
    if (gm == NULL || protocol == NULL)
        return;
    const char *v[3] = {protocol, instance != NULL ? instance : "", kind != NULL ? kind : ""};
    pdgw_counter_inc(pdgw_metric_family_series(gm->upstream_errors, v));
}

void pdgw_gateway_metrics_client_disconnect(pdgw_gateway_metrics_t *gm, const char *protocol)
{
    if (gm != NULL && protocol != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->client_disconnects, protocol));
}

void pdgw_gateway_metrics_retry(pdgw_gateway_metrics_t *gm, const char *protocol)
{
    if (gm != NULL && protocol != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->retries, protocol));
}

void pdgw_gateway_metrics_rejected(pdgw_gateway_metrics_t *gm, const char *reason)
{
    if (gm != NULL && reason != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->rejected, reason));
}

void pdgw_gateway_metrics_pd_failure(pdgw_gateway_metrics_t *gm, const char *protocol,
                                     const char *phase)
{
    if (gm != NULL && protocol != NULL && phase != NULL)
        pdgw_counter_inc(pdgw_metric_family_series2(gm->pd_failures, protocol, phase));
}

void pdgw_gateway_metrics_prefill_missing_kv_params(pdgw_gateway_metrics_t *gm,
                                                    const char *protocol)
{
    if (gm != NULL && protocol != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->prefill_missing_kv_params, protocol));
}

void pdgw_gateway_metrics_cancel_notif(pdgw_gateway_metrics_t *gm, const char *protocol)
{
    if (gm != NULL && protocol != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->pd_cancel_notifs, protocol));
}

void pdgw_gateway_metrics_client_pd_field(pdgw_gateway_metrics_t *gm, const char *protocol,
                                          const char *field, const char *action)
{
    if (gm == NULL || protocol == NULL || field == NULL || action == NULL)
        return;
    const char *v[3] = {protocol, field, action};
    pdgw_counter_inc(pdgw_metric_family_series(gm->client_pd_fields, v));
}

void pdgw_gateway_metrics_touch_protocol(pdgw_gateway_metrics_t *gm, const char *protocol)
{
    if (gm == NULL || protocol == NULL)
        return;
    pdgw_metric_family_t *fams[] = {
        gm->request_duration,   gm->ttft,           gm->tpot,
        gm->client_disconnects, gm->retries,        gm->prefill_seconds,
        gm->kv_wait_seconds,    gm->decode_seconds, gm->prefill_missing_kv_params,
        gm->pd_cancel_notifs};
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++)
        (void)pdgw_metric_family_series1(fams[i], protocol);
}

/* Where a JSON text has `"usage"` followed by an object; NULL when it has none. */
static const char *usage_object_at(const char *s, size_t len)
{
    const char *end = s + len, *p = s;
    while (p < end) {
        const char *hit = memmem(p, (size_t)(end - p), "\"usage\"", 7);
        if (hit == NULL)
            return NULL;
        p = hit + 7;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ':'))
            p++;
        if (p < end && *p == '{')
            return hit;
    }
    return NULL;
}

/* The value of the last "usage" member of the object JSON text <s> ends with, when it is an
 * object: where it starts, NULL otherwise. No allocation: an answer is relayed as it is and
 * only this one member of it is read, walking back from its end (engines write usage last or
 * nearly so). */
static const char *usage_member(const char *s, size_t len)
{
    const char *val;
    size_t val_len;
    return pdgw_json_last_member(s, len, "usage", &val, &val_len) && val[0] == '{' ? val : NULL;
}

/* The JSON number token at <p>: its end, or NULL when it is not one. *integral says whether a
 * parse makes it an integer (no fraction, no exponent). */
static const char *number_end(const char *p, const char *end, bool *integral)
{
    const char *d;
    *integral = true;
    if (p < end && *p == '-')
        p++;
    d = p;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    if (p == d || (*d == '0' && p - d > 1))
        return NULL;
    if (p < end && *p == '.') {
        *integral = false;
        d = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integral = false;
        if (++p < end && (*p == '+' || *p == '-'))
            p++;
        d = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return NULL;
    }
    return p;
}

/* The integer a parse gives the value at <v>: 0 for anything but an integer, as
 * json_integer_value says. false for a number no parse accepts (malformed, beyond 64 bits). */
static bool member_integer(const char *v, const char *end, int64_t *out)
{
    bool integral, neg;
    const char *e;
    uint64_t u = 0;
    *out = 0;
    if (v >= end || (*v != '-' && (*v < '0' || *v > '9')))
        return true; /* a string, an object, null...: not an integer */
    neg = *v == '-';
    if ((e = number_end(v, end, &integral)) == NULL)
        return false;
    if (!integral)
        return true;
    for (const char *p = v + neg; p < e; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (u > (UINT64_MAX - d) / 10)
            return false;
        u = u * 10 + d;
    }
    if (u > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
        return false; /* beyond 64 bits: a parse refuses it */
    *out = neg ? (u == 0 ? 0 : -(int64_t)(u - 1) - 1) : (int64_t)u;
    return true;
}

/* prompt_tokens_details.cached_tokens: the details object <v> (<len> bytes), into *cached (0
 * when absent or not a valid integer). */
static void details_cached(const char *v, size_t len, int64_t *cached)
{
    pdgw_json_members_t it;
    pdgw_json_member_t d;
    if (v[0] != '{' || !pdgw_json_members_begin(&it, v, len))
        return;
    while (pdgw_json_members_next(&it, &d) == 0)
        if (d.key_len == 13 && memcmp(d.key, "cached_tokens", 13) == 0 &&
            !member_integer(d.val, d.val + d.val_len, cached))
            *cached = 0;
}

/* prompt_tokens and completion_tokens of the usage object at <p>: its own members only (not
 * those of prompt_tokens_details and the like), the last of a name counting as in a parse;
 * absent or not an integer is 0; and, when <cached> is not NULL, the details' cached_tokens
 * in the same walk. false on text that ends early or a number no parse accepts. */
static bool usage_counts(const char *p, const char *end, int64_t *pt, int64_t *ct, int64_t *cached)
{
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    int got;
    *pt = *ct = 0;
    if (cached)
        *cached = 0;
    if (!pdgw_json_members_begin(&it, p, (size_t)(end - p)))
        return false;
    while ((got = pdgw_json_members_next(&it, &m)) == 0) {
        if (cached && m.key_len == 21 && memcmp(m.key, "prompt_tokens_details", 21) == 0) {
            details_cached(m.val, m.val_len, cached);
            continue;
        }
        int64_t *slot = m.key_len == 13 && memcmp(m.key, "prompt_tokens", 13) == 0       ? pt
                        : m.key_len == 17 && memcmp(m.key, "completion_tokens", 17) == 0 ? ct
                                                                                         : NULL;
        if (slot != NULL && !member_integer(m.val, m.val + m.val_len, slot))
            return false;
    }
    return got == 1;
}

static bool usage_count(pdgw_proto_metrics_t *pm, int64_t pt, int64_t ct, int64_t *prompt_out,
                        int64_t *completion_out)
{
    if (pt > 0)
        pdgw_counter_add(view_series(pm, &pm->prompt_tokens, pm->gm->prompt_tokens, NULL),
                         (uint64_t)pt);
    if (ct > 0)
        pdgw_counter_add(view_series(pm, &pm->completion_tokens, pm->gm->completion_tokens, NULL),
                         (uint64_t)ct);
    if (prompt_out)
        *prompt_out = pt;
    if (completion_out)
        *completion_out = ct;
    return true;
}

static bool usage_read(pdgw_proto_metrics_t *pm, const char *json, size_t len, bool probe,
                       int64_t *prompt_out, int64_t *completion_out, int64_t *cached_out)
{
    int64_t pt, ct;
    const char *at;
    if (pm == NULL || pm->gm == NULL || json == NULL ||
        (probe && usage_object_at(json, len) == NULL))
        return false;
    at = usage_member(json, len);
    /* Only the two counts are read: no tree is built for them. */
    if (at == NULL || !usage_counts(at, json + len, &pt, &ct, cached_out))
        return false;
    return usage_count(pm, pt, ct, prompt_out, completion_out);
}

bool pdgw_gateway_metrics_usage(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                int64_t *prompt_out, int64_t *completion_out)
{
    return usage_read(pm, json, len, true, prompt_out, completion_out, NULL);
}

bool pdgw_gateway_metrics_usage_cached(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                       bool answer, int64_t *prompt_out, int64_t *completion_out,
                                       int64_t *cached_out)
{
    return usage_read(pm, json, len, !answer, prompt_out, completion_out, cached_out);
}

bool pdgw_gateway_metrics_usage_answer(pdgw_proto_metrics_t *pm, const char *json, size_t len,
                                       int64_t *prompt_out, int64_t *completion_out)
{
    return usage_read(pm, json, len, false, prompt_out, completion_out, NULL);
}

bool pdgw_gateway_metrics_usage_tree(pdgw_proto_metrics_t *pm, const json_t *reply,
                                     int64_t *prompt_out, int64_t *completion_out)
{
    const json_t *u = json_object_get(reply, "usage");
    if (pm == NULL || pm->gm == NULL || !json_is_object(u))
        return false;
    return usage_count(pm, json_integer_value(json_object_get(u, "prompt_tokens")),
                       json_integer_value(json_object_get(u, "completion_tokens")), prompt_out,
                       completion_out);
}

bool pdgw_usage_cached_tokens(const char *json, size_t len, int64_t *cached)
{
    const char *at, *end = json + len;
    pdgw_json_members_t it;
    pdgw_json_member_t m;
    *cached = 0;
    if (json == NULL || (at = usage_member(json, len)) == NULL ||
        !pdgw_json_members_begin(&it, at, (size_t)(end - at)))
        return false;
    while (pdgw_json_members_next(&it, &m) == 0)
        if (m.key_len == 21 && memcmp(m.key, "prompt_tokens_details", 21) == 0)
            details_cached(m.val, m.val_len, cached);
    return *cached > 0;
}

void pdgw_gateway_metrics_instance_leg(pdgw_gateway_metrics_t *gm, const char *instance,
                                       const char *role, int delta)
{
    if (gm != NULL && instance != NULL && role != NULL)
        pdgw_gauge_add(pdgw_metric_family_series2(gm->instance_inflight, instance, role), delta);
}

void pdgw_gateway_metrics_local_resource_error(pdgw_gateway_metrics_t *gm, const char *kind)
{
    if (gm != NULL && kind != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->local_resource_errors, kind));
}

void pdgw_gateway_metrics_conn_closed(pdgw_gateway_metrics_t *gm, const char *reason)
{
    if (gm != NULL && reason != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->conn_closed, reason));
}

void pdgw_gateway_metrics_client_stream(pdgw_gateway_metrics_t *gm, const char *writer)
{
    if (gm != NULL && writer != NULL)
        pdgw_counter_inc(pdgw_metric_family_series1(gm->client_streams, writer));
}
