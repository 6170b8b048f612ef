/*
 * pdgw_reload.c - the reload transaction: parse, check, compare by table, prepare every hook,
 * commit every hook, count. See pdgw_reload.h.
 */
#include "pdgw_reload.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"

#define MAX_HOOKS 32
#define MAX_KEYS  256

struct pdgw_reload {
    pthread_mutex_t lock; /* one reload at a time; guards cur */
    pdgw_config_t cur;
    int argc;
    char **argv;
    char **envp;
    pdgw_config_hooks_t hooks;
    pdgw_reload_hook_t hook[MAX_HOOKS];
    size_t n_hooks;
    /* metrics (NULL without a registry) */
    pdgw_metric_t *m_ok, *m_error, *m_last_ok, *m_last_ts, *m_hash;
    uint64_t hash;
};

struct pdgw_reload_txn {
    pdgw_config_t *cur;
    pdgw_config_t *next;
    const char *changed[MAX_KEYS]; /* table keys (static strings) that differ */
    size_t n_changed;
    const char *kept[MAX_KEYS]; /* changed keys whose running value stays */
    char kept_why[MAX_KEYS][96];
    size_t n_kept;
    const char *swapped[MAX_KEYS]; /* keys whose values were exchanged (undone on refusal) */
    size_t n_swapped;
};

/* ---------------------------------------------------------------- txn accessors */

const pdgw_config_t *pdgw_reload_txn_cur(const pdgw_reload_txn_t *txn)
{
    return txn->cur;
}

const pdgw_config_t *pdgw_reload_txn_next(const pdgw_reload_txn_t *txn)
{
    return txn->next;
}

static bool key_in(const char *const *set, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(set[i], key) == 0)
            return true;
    return false;
}

bool pdgw_reload_txn_changed(const pdgw_reload_txn_t *txn, const char *key)
{
    return key_in(txn->changed, txn->n_changed, key) && !key_in(txn->kept, txn->n_kept, key);
}

/* ---------------------------------------------------------------- table compare */

static size_t opt_size(pdgw_opt_type_t t)
{
    switch (t) {
    case PDGW_OPT_STRING:
    case PDGW_OPT_HOSTPORT:
        return sizeof(char *);
    case PDGW_OPT_INT:
    case PDGW_OPT_ENUM:
        return sizeof(int);
    case PDGW_OPT_BOOL:
        return sizeof(bool);
    case PDGW_OPT_DURATION:
    case PDGW_OPT_SIZE:
        return sizeof(uint64_t);
    case PDGW_OPT_LIST:
        return sizeof(pdgw_str_list_t);
    case PDGW_OPT_MAP:
        return sizeof(pdgw_kv_list_t);
    case PDGW_OPT_INT_LIST:
        return sizeof(pdgw_int_list_t);
    default:
        return 0;
    }
}

static bool str_eq(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

/* Same value of row <o> in <a> and <b> (bases of the row's struct)? */
static bool opt_equal(const pdgw_config_option_t *o, const void *a, const void *b)
{
    const char *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
    switch (o->type) {
    case PDGW_OPT_STRING:
    case PDGW_OPT_HOSTPORT:
        return str_eq(*(char *const *)fa, *(char *const *)fb);
    case PDGW_OPT_LIST: {
        const pdgw_str_list_t *la = (const void *)fa, *lb = (const void *)fb;
        if (la->count != lb->count)
            return false;
        for (size_t i = 0; i < la->count; i++)
            if (!str_eq(la->items[i], lb->items[i]))
                return false;
        return true;
    }
    case PDGW_OPT_MAP: {
        const pdgw_kv_list_t *ma = (const void *)fa, *mb = (const void *)fb;
        if (ma->count != mb->count)
            return false;
        for (size_t i = 0; i < ma->count; i++)
            if (!str_eq(ma->items[i].value, pdgw_kv_list_get(mb, ma->items[i].key)))
                return false;
        return true;
    }
    case PDGW_OPT_INT_LIST: {
        const pdgw_int_list_t *ia = (const void *)fa, *ib = (const void *)fb;
        return ia->count == ib->count &&
               (ia->count == 0 || memcmp(ia->items, ib->items, ia->count * sizeof(int)) == 0);
    }
    default: {
        size_t n = opt_size(o->type);
        return n == 0 || memcmp(fa, fb, n) == 0;
    }
    }
}

static void swap_bytes(void *a, void *b, size_t n)
{
    unsigned char tmp[64];
    if (n == 0 || n > sizeof(tmp))
        return;
    memcpy(tmp, a, n);
    memcpy(a, b, n);
    memcpy(b, tmp, n);
}

static bool instances_equal(const pdgw_config_t *a, const pdgw_config_t *b)
{
    size_t n;
    const pdgw_config_option_t *itab = pdgw_config_instance_options(&n);
    if (a->n_instances != b->n_instances)
        return false;
    for (size_t i = 0; i < a->n_instances; i++)
        for (size_t k = 0; k < n; k++)
            if (itab[k].key != NULL && !opt_equal(&itab[k], &a->instances[i], &b->instances[i]))
                return false;
    return true;
}

/*
 * Put the running value of <key> back into the candidate (the candidate's own value goes
 * to the old struct, freed with it). Derived fields follow their key.
 */
static void swap_value(pdgw_config_t *cur, pdgw_config_t *next, const char *key)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    if (strcmp(key, "instances") == 0) {
        swap_bytes(&cur->instances, &next->instances, sizeof(cur->instances));
        swap_bytes(&cur->n_instances, &next->n_instances, sizeof(size_t));
        return;
    }
    if (strcmp(key, "tenants") == 0) {
        swap_bytes(&cur->tenants_json, &next->tenants_json, sizeof(char *));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (tab[i].key == NULL || strcmp(tab[i].key, key) != 0)
            continue;
        swap_bytes((char *)cur + tab[i].offset, (char *)next + tab[i].offset,
                   opt_size(tab[i].type));
        break;
    }
    if (strcmp(key, "listen") == 0) {
        swap_bytes(&cur->listen_host, &next->listen_host, sizeof(char *));
        swap_bytes(&cur->listen_port, &next->listen_port, sizeof(int));
    }
}

static void keep_value(pdgw_reload_txn_t *txn, const char *key)
{
    if (txn->n_swapped >= MAX_KEYS)
        return; /* cannot happen: the table has fewer rows */
    swap_value(txn->cur, txn->next, key);
    txn->swapped[txn->n_swapped++] = key;
}

/* A refused reload: give the running config its values back before the candidate goes. */
static void undo_keeps(pdgw_reload_txn_t *txn)
{
    while (txn->n_swapped > 0)
        swap_value(txn->cur, txn->next, txn->swapped[--txn->n_swapped]);
}

/* The table's own string for <key> (outlives the reload), NULL if unknown. */
static const char *stable_key(const char *key)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    for (size_t i = 0; i < n; i++)
        if (tab[i].key != NULL && strcmp(tab[i].key, key) == 0)
            return tab[i].key;
    return strcmp(key, "instances") == 0 ? "instances"
           : strcmp(key, "tenants") == 0 ? "tenants"
                                         : NULL;
}

static void note_kept(pdgw_reload_txn_t *txn, const char *key, const char *why)
{
    if (key_in(txn->kept, txn->n_kept, key) || txn->n_kept >= MAX_KEYS)
        return;
    snprintf(txn->kept_why[txn->n_kept], sizeof(txn->kept_why[0]), "%s", why ? why : "");
    txn->kept[txn->n_kept++] = key;
}

void pdgw_reload_txn_keep(pdgw_reload_txn_t *txn, const char *key, const char *why)
{
    const char *stable = stable_key(key);
    if (stable == NULL || key_in(txn->kept, txn->n_kept, stable))
        return;
    keep_value(txn, stable);
    note_kept(txn, stable, why);
}

static bool hooked(const pdgw_reload_t *rl, const char *key)
{
    for (size_t h = 0; h < rl->n_hooks; h++)
        for (const char *const *k = rl->hook[h].keys; k != NULL && *k != NULL; k++)
            if (strcmp(*k, key) == 0)
                return true;
    return false;
}

/*
 * Fill txn->changed. Every key no hook applies keeps its running value, changed or not:
 * the server borrows such values (listen host, protocol, model names, ...) from the running
 * config, so the very same memory moves into the candidate, which becomes the running config.
 * A changed one is reported as needing a restart.
 */
static void compare(pdgw_reload_t *rl, pdgw_reload_txn_t *txn)
{
    size_t n;
    const pdgw_config_option_t *tab = pdgw_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        bool same;
        if (tab[i].key == NULL || tab[i].type == PDGW_OPT_ACTION)
            continue;
        same = opt_equal(&tab[i], txn->cur, txn->next);
        if (!same && txn->n_changed < MAX_KEYS)
            txn->changed[txn->n_changed++] = tab[i].key;
        if (hooked(rl, tab[i].key))
            continue;
        keep_value(txn, tab[i].key);
        if (!same)
            note_kept(txn, tab[i].key, "not applied live");
    }
    if (!instances_equal(txn->cur, txn->next) && txn->n_changed < MAX_KEYS)
        txn->changed[txn->n_changed++] = "instances";
    /* Tenants apply live only where a quota layer runs (its hook); without one they would
     * need it built. */
    if (!str_eq(txn->cur->tenants_json, txn->next->tenants_json)) {
        if (txn->n_changed < MAX_KEYS)
            txn->changed[txn->n_changed++] = "tenants";
        if (!hooked(rl, "tenants")) {
            keep_value(txn, "tenants");
            note_kept(txn, "tenants", "no tenants ran at start: the quota layer is built then");
        }
    }
    /* Discovery is restart-only: its derived switches follow the kept keys. */
    txn->next->dns_enabled = txn->cur->dns_enabled;
    txn->next->k8s_enabled = txn->cur->k8s_enabled;
}

/* ---------------------------------------------------------------- create / destroy */

static const char *const drain_keys[] = {"drain_timeout", NULL};

pdgw_status_t pdgw_reload_create(pdgw_config_t *cfg, int argc, char **argv, char **envp,
                                 const pdgw_config_hooks_t *hooks, pdgw_metrics_t *reg,
                                 pdgw_reload_t **out)
{
    pdgw_reload_t *rl = pdgw_calloc(1, sizeof(*rl));
    pdgw_reload_hook_t drain = {.name = "drain", .keys = drain_keys};
    if (rl == NULL)
        return PDGW_ERR_NOMEM;
    pthread_mutex_init(&rl->lock, NULL);
    rl->cur = *cfg;
    memset(cfg, 0, sizeof(*cfg));
    rl->argc = argc;
    rl->argv = argv;
    rl->envp = envp;
    if (hooks != NULL)
        rl->hooks = *hooks;
    /* drain_timeout is read through pdgw_reload_drain_timeout_ms: nothing to apply. */
    rl->hook[rl->n_hooks++] = drain;
    if (reg != NULL) {
        static const char *const lbl[] = {"result"};
        pdgw_metric_family_t *fam = NULL;
        if (pdgw_metrics_family_add(reg, PDGW_METRIC_COUNTER, "pdgw_config_reloads_total",
                                    "Configuration reloads (SIGHUP, POST /admin/reload) by "
                                    "result; a refused file leaves the running config.",
                                    lbl, 1, NULL, 0, &fam) == PDGW_OK) {
            rl->m_ok = pdgw_metric_family_series1(fam, "ok");
            rl->m_error = pdgw_metric_family_series1(fam, "error");
        }
        rl->m_last_ok = pdgw_metrics_gauge_new(reg, "pdgw_config_last_reload_successful",
                                               "1 when the last reload was applied.");
        rl->m_last_ts = pdgw_metrics_gauge_new(
            reg, "pdgw_config_last_reload_success_timestamp_seconds",
            "Unix time the running config was loaded (start-up or the last good reload).");
        rl->m_hash = pdgw_metrics_gauge_new(
            reg, "pdgw_config_hash", "48-bit FNV-1a hash of the running config file (0 = none).");
    }
    {
        size_t len = 0;
        char *text =
            rl->cur.config_file ? pdgw_file_read_all(rl->cur.config_file, 64u << 20, &len) : NULL;
        rl->hash = text ? pdgw_reload_hash(text, len) : 0;
        free(text);
    }
    pdgw_gauge_set(rl->m_last_ok, 1);
    pdgw_gauge_set(rl->m_last_ts, (double)pdgw_time_real_ns() / 1e9);
    pdgw_gauge_set(rl->m_hash, (double)rl->hash);
    *out = rl;
    return PDGW_OK;
}

void pdgw_reload_destroy(pdgw_reload_t *rl)
{
    if (rl == NULL)
        return;
    pdgw_config_free(&rl->cur);
    pthread_mutex_destroy(&rl->lock);
    pdgw_free(rl);
}

pdgw_status_t pdgw_reload_register(pdgw_reload_t *rl, const pdgw_reload_hook_t *hook)
{
    pdgw_status_t st = PDGW_OK;
    pthread_mutex_lock(&rl->lock);
    if (rl->n_hooks == MAX_HOOKS)
        st = PDGW_ERR_LIMIT;
    else
        rl->hook[rl->n_hooks++] = *hook;
    pthread_mutex_unlock(&rl->lock);
    return st;
}

const pdgw_config_t *pdgw_reload_config(const pdgw_reload_t *rl)
{
    return &rl->cur;
}

uint64_t pdgw_reload_drain_timeout_ms(pdgw_reload_t *rl)
{
    uint64_t v;
    pthread_mutex_lock(&rl->lock);
    v = rl->cur.drain_timeout_ms;
    pthread_mutex_unlock(&rl->lock);
    return v;
}

uint64_t pdgw_reload_hash(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return (h ^ (h >> 48)) & 0xffffffffffffull;
}

/* ---------------------------------------------------------------- the reload */

static json_t *result_json(const char *result, const char *message, const pdgw_reload_txn_t *txn,
                           uint64_t hash)
{
    json_t *applied = json_array(), *kept = json_array();
    char hex[24];
    for (size_t i = 0; txn != NULL && i < txn->n_changed; i++) {
        if (!key_in(txn->kept, txn->n_kept, txn->changed[i]))
            json_array_append_new(applied, json_string(txn->changed[i]));
    }
    for (size_t i = 0; txn != NULL && i < txn->n_kept; i++)
        json_array_append_new(kept, json_string(txn->kept[i]));
    snprintf(hex, sizeof(hex), "%012llx", (unsigned long long)hash);
    return json_pack("{s:s,s:s,s:o,s:o,s:s}", "result", result, "message", message, "applied",
                     applied, "needs_restart", kept, "config_hash", hex);
}

static json_t *refuse(pdgw_reload_t *rl, const char *trigger, const char *why)
{
    pdgw_log_error("reload", "%s: config reload refused, the running config stays: %s", trigger,
                   why);
    pdgw_counter_inc(rl->m_error);
    pdgw_gauge_set(rl->m_last_ok, 0);
    return result_json("error", why, NULL, rl->hash);
}

/* Parse and check the candidate the way start-up does. */
static bool load_candidate(pdgw_reload_t *rl, pdgw_config_t *next, char *why, size_t whylen)
{
    pdgw_config_hooks_t hooks = rl->hooks;
    pdgw_config_action_t action = PDGW_CONFIG_RUN;
    pdgw_config_error_t cerr;
    FILE *sink = fopen("/dev/null", "w");
    pdgw_status_t st;

    /* from_args prints what it refuses; the reload logs one line of its own instead. */
    hooks.err = sink;
    hooks.out = sink;
    memset(&cerr, 0, sizeof(cerr));
    st = pdgw_config_from_args(next, rl->argc, rl->argv, rl->envp, &hooks, &action, &cerr);
    if (sink != NULL)
        fclose(sink);
    if (st != PDGW_OK) {
        snprintf(why, whylen, "%s", cerr.message[0] ? cerr.message : pdgw_strerror(st));
        return false;
    }
    if (hooks.deep_check != NULL) {
        char msg[512] = "";
        if (hooks.deep_check(hooks.ctx, next, msg, sizeof(msg)) != PDGW_OK) {
            snprintf(why, whylen, "%s", msg[0] ? msg : "the forwarder refused the config");
            return false;
        }
    }
    return true;
}

static void log_outcome(const char *trigger, const pdgw_reload_txn_t *txn, uint64_t hash,
                        const char *file)
{
    char applied[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < txn->n_changed; i++) {
        int w;
        if (key_in(txn->kept, txn->n_kept, txn->changed[i]))
            continue;
        w = snprintf(applied + used, sizeof(applied) - used, "%s%s", used ? ", " : "",
                     txn->changed[i]);
        if (w < 0 || (size_t)w >= sizeof(applied) - used)
            break;
        used += (size_t)w;
    }
    for (size_t i = 0; i < txn->n_kept; i++)
        pdgw_log_warn("reload",
                      "%s: '%s' changed but needs restart (%s): the running value is "
                      "kept",
                      trigger, txn->kept[i], txn->kept_why[i]);
    pdgw_log_info("reload", "%s: config reloaded from %s (hash %012llx): applied: %s%s", trigger,
                  file ? file : "(no file)", (unsigned long long)hash,
                  used ? applied : "nothing changed",
                  txn->n_kept ? "; some changes need a restart (see above)" : "");
}

json_t *pdgw_reload_run(pdgw_reload_t *rl, const char *trigger)
{
    pdgw_config_t next;
    pdgw_reload_txn_t txn;
    void *state[MAX_HOOKS];
    char why[768];
    json_t *res;
    size_t h, prepared = 0;
    uint64_t hash = 0;

    pthread_mutex_lock(&rl->lock);
    memset(&txn, 0, sizeof(txn));
    memset(&next, 0, sizeof(next));
    if (!load_candidate(rl, &next, why, sizeof(why))) {
        pdgw_config_free(&next);
        res = refuse(rl, trigger, why);
        pthread_mutex_unlock(&rl->lock);
        return res;
    }
    if (next.config_file != NULL) {
        size_t len = 0;
        char *text = pdgw_file_read_all(next.config_file, 64u << 20, &len);
        hash = text ? pdgw_reload_hash(text, len) : 0;
        free(text);
    }
    txn.cur = &rl->cur;
    txn.next = &next;
    compare(rl, &txn);
    for (h = 0; h < rl->n_hooks; h++) {
        pdgw_status_t st = PDGW_OK;
        state[h] = NULL;
        why[0] = '\0';
        if (rl->hook[h].prepare != NULL)
            st = rl->hook[h].prepare(rl->hook[h].ctx, &txn, &state[h], why, sizeof(why));
        if (st != PDGW_OK) {
            char msg[900];
            snprintf(msg, sizeof(msg), "%s: %s", rl->hook[h].name,
                     why[0] ? why : pdgw_strerror(st));
            while (h-- > 0)
                if (rl->hook[h].abort != NULL)
                    rl->hook[h].abort(rl->hook[h].ctx, state[h]);
            undo_keeps(&txn);
            pdgw_config_free(&next);
            res = refuse(rl, trigger, msg);
            pthread_mutex_unlock(&rl->lock);
            return res;
        }
        prepared++;
    }
    for (h = 0; h < prepared; h++)
        if (rl->hook[h].commit != NULL)
            rl->hook[h].commit(rl->hook[h].ctx, &txn, state[h]);
    log_outcome(trigger, &txn, hash, next.config_file);
    if (txn.n_kept > 0) {
        /* Not "reloaded": what needs a restart still runs with its old value. */
        char msg[600];
        size_t used = (size_t)snprintf(msg, sizeof(msg),
                                       "config reloaded in part; not applied until a restart:");
        for (size_t i = 0; i < txn.n_kept && used < sizeof(msg); i++)
            used += (size_t)snprintf(msg + used, sizeof(msg) - used, "%s %s", i ? "," : "",
                                     txn.kept[i]);
        res = result_json("partial", msg, &txn, hash);
    } else {
        res = result_json("ok", "config reloaded", &txn, hash);
    }
    /* The candidate (holding the kept values) becomes the running config. */
    pdgw_config_free(&rl->cur);
    rl->cur = next;
    rl->hash = hash;
    pdgw_counter_inc(rl->m_ok);
    pdgw_gauge_set(rl->m_last_ok, 1);
    pdgw_gauge_set(rl->m_last_ts, (double)pdgw_time_real_ns() / 1e9);
    pdgw_gauge_set(rl->m_hash, (double)hash);
    pthread_mutex_unlock(&rl->lock);
    return res;
}
