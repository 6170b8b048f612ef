/*
 * pdq_store_redis.c - the fleet-wide quota store on Redis, owned by one background thread.
 *
 * Every budget is one bucket hash in Redis ({level, ts}, refilled inside the script from the
 * server's own TIME, so replicas' clocks never meet). Each sync the thread tops every local
 * lease up to its slice (or gives back a lease that sat idle), all buckets in one script call;
 * usage deltas go in a second script call that returns the fleet's totals. Admission never
 * touches the connection: it spends the lease under the tenant's lock.
 *
 * Scripts run with EVALSHA; a server that lost its script cache (restart, SCRIPT FLUSH)
 * answers NOSCRIPT and the call is repeated with EVAL (redis src/eval.c: evalsha looks the
 * digest up and replies with the shared "NOSCRIPT" error when it is unknown).
 *
 * Failure: a connect or command that fails or exceeds its timeout drops the connection, flips
 * the library to local limits (fail_open) or refusal (fail_closed), logs that once, and
 * reconnection is retried with doubling backoff. Timers drive the thread (a condition wait
 * with a deadline), nothing polls.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_buf.h"
#include "pdq_int.h"
#include "pdq_redis_conn.h"
#include "pdquota/pdq_store_url.h"

/* KEYS: one bucket hash each. ARGV: cap, period_ms, delta per key (delta > 0 takes up to that
 * much, < 0 gives back). Replies granted, level per key, as strings (Lua numbers would be
 * truncated to integers on the way out). */
static const char BUCKET_SCRIPT[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000\n"
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  local cap = tonumber(ARGV[3*i-2])\n"
    "  local period = tonumber(ARGV[3*i-1])\n"
    "  local delta = tonumber(ARGV[3*i])\n"
    "  local h = redis.call('HMGET', KEYS[i], 'level', 'ts')\n"
    "  local level = tonumber(h[1])\n"
    "  local ts = tonumber(h[2])\n"
    "  if level == nil or ts == nil then level = cap; ts = now end\n"
    "  if now > ts then level = level + (now - ts) * cap / period end\n"
    "  if level > cap then level = cap end\n"
    "  local granted = delta\n"
    "  if delta > 0 then\n"
    "    granted = math.min(delta, math.max(level, 0))\n"
    "    level = level - granted\n"
    "  else\n"
    "    level = math.min(cap, level - delta)\n"
    "  end\n"
    "  redis.call('HSET', KEYS[i], 'level', tostring(level), 'ts', tostring(now))\n"
    "  redis.call('PEXPIRE', KEYS[i], math.floor(period * 2))\n"
    "  out[2*i-1] = tostring(granted)\n"
    "  out[2*i] = tostring(level)\n"
    "end\n"
    "return out\n";

/* KEYS: one usage hash per (tenant, model). ARGV: PDQ_USAGE_FIELDS increments per key, in
 * the order of usage_fields. Replies the new totals. */
static const char USAGE_SCRIPT[] =
    "local f = {'requests', 'prompt_tokens', 'cached_prompt_tokens', 'completion_tokens',\n"
    "  'kv_bytes', 'queue_ns', 'prefill_ns', 'transfer_ns', 'decode_ns'}\n"
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  for j = 1, #f do\n"
    "    local k = (i - 1) * #f + j\n"
    "    out[k] = redis.call('HINCRBY', KEYS[i], f[j], ARGV[k])\n"
    "  end\n"
    "end\n"
    "return out\n";

static const char *const kind_names[PDQ_B_COUNT] = {"rps", "rpm", "tpm", "ptpm", "ctpm"};

typedef struct lease_op {
    pdq_tenant_t *t;
    pdq_bucket_t *b;
    double delta;
    char key[400];
} lease_op_t;

struct pdq_store {
    pdq_t *q;
    pdq_store_url_t url;
    char *prefix;
    uint32_t connect_ms, command_ms, sync_ms, usage_ms, backoff_max_ms, idle_ms;
    double lease_fraction;
    pdq_fail_mode_t fail_mode;

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;

    pdq_rconn_t *c;  /* the thread's alone */
    pdq_rtls_t *tls; /* rediss://: credentials loaded at start-up */
    char bucket_sha[41], usage_sha[41];
    bool ever_connected, outage_logged;
    uint64_t next_usage_push;
    lease_op_t *ops;
    size_t n_ops, cap_ops;

    atomic_bool connected;
    atomic_uint_fast64_t errors, reconnects, syncs, noscript;
};

static uint64_t ms_or(uint32_t v, uint32_t dflt)
{
    return v ? v : dflt;
}

void pdq_store_tune_bucket(const pdq_store_t *s, pdq_bucket_t *b)
{
    b->slice = b->cap * s->lease_fraction < 2 ? 2 : b->cap * s->lease_fraction;
    b->sync_ns = (uint64_t)s->sync_ms * PDB_NSEC_PER_MSEC;
}

void pdq_store_tune_tenant(const pdq_store_t *s, pdq_tenant_t *t)
{
    for (size_t m = 0; m <= s->q->n_models; m++) {
        pdq_bset_t *set = m == s->q->n_models ? &t->budget : t->model_budget[m];
        for (int k = 0; set && k < PDQ_B_COUNT; k++)
            pdq_store_tune_bucket(s, &set->b[k]);
    }
}

pdq_status_t pdq_store_new(pdq_t *q, const pdq_store_config_t *cfg, pdq_store_t **out, char *err,
                           size_t errlen)
{
    pdq_store_url_t url;
    pdq_status_t st = pdq_store_url_parse(cfg->url, &url, err, errlen);
    if (st != PDQ_OK)
        return st;
    pdq_rtls_config_t tls = {cfg->tls_ca_file, cfg->tls_cert_file, cfg->tls_key_file,
                             cfg->tls_server_name};
    const char *tls_key = tls.ca_file && tls.ca_file[0]           ? "tls_ca_file"
                          : tls.cert_file && tls.cert_file[0]     ? "tls_cert_file"
                          : tls.key_file && tls.key_file[0]       ? "tls_key_file"
                          : tls.server_name && tls.server_name[0] ? "tls_server_name"
                                                                  : NULL;
    if (!url.tls && tls_key != NULL) {
        if (err && errlen)
            snprintf(err, errlen,
                     "quota_store: %s is set but the URL is redis:// (plain); "
                     "TLS needs rediss://",
                     tls_key);
        return PDQ_ERR_INVALID;
    }
    if (!(cfg->lease_fraction >= 0 && cfg->lease_fraction <= 1)) {
        if (err && errlen)
            snprintf(err, errlen, "quota_store: lease_fraction must be in (0, 1]");
        return PDQ_ERR_INVALID;
    }
    pdq_store_t *s = pdb_calloc(1, sizeof(*s));
    if (s == NULL)
        return PDQ_ERR_NOMEM;
    s->prefix = pdb_strdup(cfg->key_prefix ? cfg->key_prefix : "pdq:");
    if (s->prefix == NULL) {
        pdb_free(s);
        return PDQ_ERR_NOMEM;
    }
    s->q = q;
    s->url = url;
    if (url.tls) {
        char terr[320];
        st = pdq_rtls_new(&tls, &s->tls, terr, sizeof(terr));
        if (st != PDQ_OK) {
            if (err && errlen)
                snprintf(err, errlen, "%s", terr);
            pdb_free(s->prefix);
            pdb_free(s);
            return st;
        }
    }
    if (cfg->password != NULL && cfg->password[0] != '\0') {
        /* a password kept out of the URL (a secret in the environment) wins */
        if (strlen(cfg->password) >= sizeof(s->url.password)) {
            if (err && errlen)
                snprintf(err, errlen, "quota_store: password longer than %zu bytes",
                         sizeof(s->url.password) - 1);
            pdq_rtls_free(s->tls);
            pdb_free(s->prefix);
            pdb_free(s);
            return PDQ_ERR_INVALID;
        }
        snprintf(s->url.password, sizeof(s->url.password), "%s", cfg->password);
    }
    s->connect_ms = (uint32_t)ms_or(cfg->connect_timeout_ms, 200);
    s->command_ms = (uint32_t)ms_or(cfg->command_timeout_ms, 200);
    s->sync_ms = (uint32_t)ms_or(cfg->sync_interval_ms, 100);
    s->usage_ms = (uint32_t)ms_or(cfg->usage_interval_ms, 1000);
    s->backoff_max_ms = (uint32_t)ms_or(cfg->backoff_max_ms, 5000);
    s->idle_ms = (uint32_t)ms_or(cfg->lease_idle_ms, 1000);
    uint32_t replicas = cfg->expected_replicas ? cfg->expected_replicas : 1;
    s->lease_fraction = cfg->lease_fraction > 0 ? cfg->lease_fraction : 1.0 / (4.0 * replicas);
    s->fail_mode = cfg->fail_mode;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    /* Until the first connection the store is down: local limits or refusal. */
    atomic_store(&q->refuse_all, s->fail_mode == PDQ_FAIL_CLOSED);
    for (size_t i = 0; i < q->n_tenants; i++)
        pdq_store_tune_tenant(s, &q->tenants[i]);
    *out = s;
    return PDQ_OK;
}

void pdq_store_get_stats(pdq_store_t *s, pdq_store_stats_t *out)
{
    out->configured = true;
    out->connected = atomic_load(&s->connected);
    out->errors = atomic_load(&s->errors);
    out->reconnects = atomic_load(&s->reconnects);
    out->syncs = atomic_load(&s->syncs);
    out->noscript_fallbacks = atomic_load(&s->noscript);
}

void pdq_store_stats(pdq_t *q, pdq_store_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (q && q->store)
        pdq_store_get_stats(q->store, out);
}

static void mark_up(pdq_store_t *s)
{
    atomic_store(&s->connected, true);
    atomic_store(&s->q->store_up, true);
    atomic_store(&s->q->refuse_all, false);
    if (s->ever_connected)
        atomic_fetch_add(&s->reconnects, 1);
    if (s->outage_logged)
        pdq_logf(s->q, 0, "quota store %s:%u reachable again; budgets are fleet-wide again",
                 s->url.host, s->url.port);
    s->outage_logged = false;
    s->ever_connected = true;
}

static void mark_down(pdq_store_t *s, const char *why)
{
    if (s->c) {
        pdq_rconn_close(s->c);
        s->c = NULL;
    }
    atomic_fetch_add(&s->errors, 1);
    atomic_store(&s->connected, false);
    atomic_store(&s->q->store_up, false);
    if (s->fail_mode == PDQ_FAIL_CLOSED)
        atomic_store(&s->q->refuse_all, true);
    if (!s->outage_logged)
        pdq_logf(s->q, 1, "quota store %s:%u unreachable (%s); %s until it is back", s->url.host,
                 s->url.port, why,
                 s->fail_mode == PDQ_FAIL_CLOSED
                     ? "fail_closed: refusing requests"
                     : "fail_open: serving on local limits (budget / expected_replicas)");
    s->outage_logged = true;
}

/* A reply that is an error (or none): its text for the log. */
static const char *reply_error(const pdq_rconn_t *c, const redisReply *r)
{
    if (r == NULL)
        return pdq_rconn_error(c);
    if (r->type == REDIS_REPLY_ERROR)
        return r->str;
    return NULL;
}

static bool simple_command(pdq_store_t *s, char *why, size_t whylen, int argc, const char **argv,
                           char *sha_out)
{
    redisReply *r = pdq_rconn_command(s->c, argc, argv, NULL);
    const char *e = reply_error(s->c, r);
    bool ok = e == NULL;
    if (!ok)
        snprintf(why, whylen, "%s: %s", argv[0], e);
    if (ok && sha_out) {
        ok = r->type == REDIS_REPLY_STRING && r->len == 40;
        if (ok)
            memcpy(sha_out, r->str, 41);
        else
            snprintf(why, whylen, "SCRIPT LOAD: unexpected reply");
    }
    if (r)
        freeReplyObject(r);
    return ok;
}

static bool store_connect(pdq_store_t *s, char *why, size_t whylen)
{
    s->c =
        pdq_rconn_open(s->url.host, s->url.port, s->tls, s->connect_ms, s->command_ms, why, whylen);
    if (s->c == NULL)
        return false;
    if (s->url.password[0]) {
        const char *auth[] = {"AUTH", s->url.user, s->url.password};
        bool ok = s->url.user[0] ? simple_command(s, why, whylen, 3, auth, NULL)
                                 : simple_command(s, why, whylen, 2,
                                                  (const char *[]){"AUTH", s->url.password}, NULL);
        if (!ok)
            goto err_free;
    }
    if (s->url.db) {
        char db[16];
        snprintf(db, sizeof(db), "%u", s->url.db);
        if (!simple_command(s, why, whylen, 2, (const char *[]){"SELECT", db}, NULL))
            goto err_free;
    }
    if (!simple_command(s, why, whylen, 3, (const char *[]){"SCRIPT", "LOAD", BUCKET_SCRIPT},
                        s->bucket_sha) ||
        !simple_command(s, why, whylen, 3, (const char *[]){"SCRIPT", "LOAD", USAGE_SCRIPT},
                        s->usage_sha))
        goto err_free;
    return true;
err_free:
    if (s->c)
        pdq_rconn_close(s->c);
    s->c = NULL;
    return false;
}

/* EVALSHA, and EVAL when the server forgot the script. argv[0..1] are filled here. */
static redisReply *run_script(pdq_store_t *s, const char *sha, const char *body, int argc,
                              const char **argv, const size_t *lens)
{
    argv[0] = "EVALSHA";
    argv[1] = sha;
    redisReply *r = pdq_rconn_command(s->c, argc, argv, lens);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(r);
        atomic_fetch_add(&s->noscript, 1);
        argv[0] = "EVAL";
        argv[1] = body;
        r = pdq_rconn_command(s->c, argc, argv, lens);
    }
    return r;
}

static bool ops_reserve(pdq_store_t *s, size_t n)
{
    if (n <= s->cap_ops)
        return true;
    lease_op_t *ops = pdb_realloc(s->ops, n * sizeof(*ops));
    if (ops == NULL)
        return false;
    s->ops = ops;
    s->cap_ops = n;
    return true;
}

/* Decide each bucket's lease change (tenant locks held briefly); gives leave at once. */
static bool collect_leases(pdq_store_t *s, bool give_all)
{
    pdq_t *q = s->q;
    uint64_t now = pdq_now(q);
    uint64_t idle_ns = (uint64_t)s->idle_ms * PDB_NSEC_PER_MSEC;
    s->n_ops = 0;
    for (size_t i = 0; i < q->n_tenants; i++) {
        pdq_tenant_t *t = &q->tenants[i];
        if (!ops_reserve(s, s->n_ops + (q->n_models + 1) * PDQ_B_COUNT))
            return false;
        pthread_mutex_lock(&t->lock);
        pdq_tenant_sync_mode(q, t, now);
        for (size_t m = 0; m <= q->n_models; m++) {
            pdq_bset_t *set = m == q->n_models ? &t->budget : t->model_budget[m];
            for (int k = 0; set && k < PDQ_B_COUNT; k++) {
                pdq_bucket_t *b = &set->b[k];
                if (!pdq_bucket_on(b) || !b->leased)
                    continue;
                double target = b->want > b->slice / 2 ? b->want : b->slice / 2;
                if (target > b->cap)
                    target = b->cap;
                b->want = 0;
                if (give_all || (now > b->last_use && now - b->last_use > idle_ns))
                    target = 0; /* an idle lease goes back to the fleet */
                double delta = target - b->level;
                if (delta > -0.5 && delta < 0.5 && b->level >= 0)
                    delta = 0;
                if (delta < 0)
                    b->level = target;
                lease_op_t *op = &s->ops[s->n_ops++];
                op->t = t;
                op->b = b;
                op->delta = delta;
                snprintf(op->key, sizeof(op->key), "%sb:%s:%s:%s", s->prefix, t->name,
                         m == q->n_models ? "*" : q->model_names[m], kind_names[k]);
            }
        }
        pthread_mutex_unlock(&t->lock);
    }
    return true;
}

static bool sync_leases(pdq_store_t *s, bool give_all, char *why, size_t whylen)
{
    if (!collect_leases(s, give_all)) {
        snprintf(why, whylen, "out of memory");
        return true; /* not the store's fault: try again next time */
    }
    if (s->n_ops == 0)
        return true;
    size_t argc = 3 + s->n_ops * 4;
    const char **argv = pdb_calloc(argc, sizeof(char *));
    char *nums = pdb_malloc(s->n_ops * 3 * 32);
    if (argv == NULL || nums == NULL) {
        pdb_free(argv);
        pdb_free(nums);
        return true;
    }
    char nk[16];
    snprintf(nk, sizeof(nk), "%zu", s->n_ops);
    argv[2] = nk;
    for (size_t i = 0; i < s->n_ops; i++) {
        lease_op_t *op = &s->ops[i];
        char *n = nums + i * 3 * 32;
        snprintf(n, 32, "%.3f", op->b->cap);
        snprintf(n + 32, 32, "%.0f", op->b->period_ns / 1e6);
        snprintf(n + 64, 32, "%.3f", op->delta);
        argv[3 + i] = op->key;
        argv[3 + s->n_ops + 3 * i] = n;
        argv[3 + s->n_ops + 3 * i + 1] = n + 32;
        argv[3 + s->n_ops + 3 * i + 2] = n + 64;
    }
    redisReply *r = run_script(s, s->bucket_sha, BUCKET_SCRIPT, (int)argc, argv, NULL);
    pdb_free(argv);
    pdb_free(nums);
    const char *e = reply_error(s->c, r);
    bool ok = e == NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 * s->n_ops;
    if (!ok) {
        snprintf(why, whylen, "lease script: %s", e ? e : "unexpected reply");
        if (r)
            freeReplyObject(r);
        return false;
    }
    uint64_t now = pdq_now(s->q);
    for (size_t i = 0; i < s->n_ops; i++) {
        lease_op_t *op = &s->ops[i];
        const redisReply *g = r->element[2 * i], *l = r->element[2 * i + 1];
        double granted = g->type == REDIS_REPLY_STRING ? strtod(g->str, NULL) : 0;
        double level = l->type == REDIS_REPLY_STRING ? strtod(l->str, NULL) : 0;
        pthread_mutex_lock(&op->t->lock);
        if (op->b->leased) {
            if (granted > 0)
                op->b->level += granted;
            op->b->fleet_level = level;
            op->b->fleet_stamp = now;
            op->b->fleet_known = true;
        }
        pthread_mutex_unlock(&op->t->lock);
    }
    freeReplyObject(r);
    atomic_fetch_add(&s->syncs, 1);
    return true;
}

static void usage_fields(const pdq_usage_t *u, uint64_t v[PDQ_USAGE_FIELDS])
{
    v[0] = u->requests;
    v[1] = u->prompt_tokens;
    v[2] = u->cached_prompt_tokens;
    v[3] = u->completion_tokens;
    v[4] = u->kv_bytes;
    for (int p = 0; p < PDQ_PHASE_COUNT; p++)
        v[5 + p] = u->phase_ns[p];
}

static void usage_from(pdq_usage_t *u, const uint64_t v[PDQ_USAGE_FIELDS])
{
    u->requests = v[0];
    u->prompt_tokens = v[1];
    u->cached_prompt_tokens = v[2];
    u->completion_tokens = v[3];
    u->kv_bytes = v[4];
    for (int p = 0; p < PDQ_PHASE_COUNT; p++)
        u->phase_ns[p] = v[5 + p];
}

/* Push every (tenant, model)'s delta, read back the fleet's totals. A failed push puts the
 * deltas back (a reply lost after the server applied it counts twice: at least once). */
static bool push_usage(pdq_store_t *s, char *why, size_t whylen)
{
    pdq_t *q = s->q;
    size_t nt = q->n_tenants; /* once: a reload may publish more while this runs */
    size_t n = nt * q->n_models;
    size_t argc = 3 + n + n * PDQ_USAGE_FIELDS;
    const char **argv = pdb_calloc(argc, sizeof(char *));
    char *keys = pdb_malloc(n * 400);
    char *nums = pdb_malloc(n * PDQ_USAGE_FIELDS * 24);
    pdq_usage_t *deltas = pdb_calloc(n, sizeof(pdq_usage_t));
    bool ok = true;
    if (argv == NULL || keys == NULL || nums == NULL || deltas == NULL)
        goto out; /* try again next time */
    char nk[16];
    snprintf(nk, sizeof(nk), "%zu", n);
    argv[2] = nk;
    for (size_t i = 0; i < nt; i++) {
        pdq_tenant_t *t = &q->tenants[i];
        pthread_mutex_lock(&t->lock);
        for (size_t m = 0; m < q->n_models; m++) {
            deltas[i * q->n_models + m] = t->usage[m].unpushed;
            memset(&t->usage[m].unpushed, 0, sizeof(pdq_usage_t));
        }
        pthread_mutex_unlock(&t->lock);
        for (size_t m = 0; m < q->n_models; m++) {
            size_t j = i * q->n_models + m;
            char *key = keys + j * 400;
            snprintf(key, 400, "%su:%s:%s", s->prefix, t->name, q->model_names[m]);
            argv[3 + j] = key;
            uint64_t v[PDQ_USAGE_FIELDS];
            usage_fields(&deltas[j], v);
            for (int f = 0; f < PDQ_USAGE_FIELDS; f++) {
                char *num = nums + (j * PDQ_USAGE_FIELDS + (size_t)f) * 24;
                snprintf(num, 24, "%" PRIu64, v[f]);
                argv[3 + n + j * PDQ_USAGE_FIELDS + (size_t)f] = num;
            }
        }
    }
    redisReply *r = run_script(s, s->usage_sha, USAGE_SCRIPT, (int)argc, argv, NULL);
    const char *e = reply_error(s->c, r);
    ok = e == NULL && r->type == REDIS_REPLY_ARRAY && r->elements == n * PDQ_USAGE_FIELDS;
    if (!ok)
        snprintf(why, whylen, "usage script: %s", e ? e : "unexpected reply");
    for (size_t i = 0; i < nt; i++) {
        pdq_tenant_t *t = &q->tenants[i];
        pthread_mutex_lock(&t->lock);
        for (size_t m = 0; m < q->n_models; m++) {
            size_t j = i * q->n_models + m;
            if (!ok) {
                pdq_usage_add(&t->usage[m].unpushed, &deltas[j]);
                continue;
            }
            uint64_t v[PDQ_USAGE_FIELDS];
            for (int f = 0; f < PDQ_USAGE_FIELDS; f++) {
                const redisReply *x = r->element[j * PDQ_USAGE_FIELDS + (size_t)f];
                v[f] = x->type == REDIS_REPLY_INTEGER && x->integer > 0 ? (uint64_t)x->integer : 0;
            }
            usage_from(&t->usage[m].fleet, v);
            t->usage[m].fleet_valid = true;
        }
        pthread_mutex_unlock(&t->lock);
    }
    if (r)
        freeReplyObject(r);
out:
    pdb_free(argv);
    pdb_free(keys);
    pdb_free(nums);
    pdb_free(deltas);
    return ok;
}

static uint64_t mono_ms(void)
{
    return pdb_clock_mono_ns() / PDB_NSEC_PER_MSEC;
}

/* Sleep until <ms> from now or until stopped; true when stopping. */
static bool wait_ms(pdq_store_t *s, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + ms * PDB_NSEC_PER_MSEC;
    ts.tv_sec += (time_t)(ns / PDB_NSEC_PER_SEC);
    ts.tv_nsec = (long)(ns % PDB_NSEC_PER_SEC);
    pthread_mutex_lock(&s->lock);
    while (!s->stop && pthread_cond_timedwait(&s->cond, &s->lock, &ts) != ETIMEDOUT)
        ;
    bool stop = s->stop;
    pthread_mutex_unlock(&s->lock);
    return stop;
}

static void *store_main(void *arg)
{
    pdq_store_t *s = arg;
    uint64_t backoff = 50;
    char why[256];
    for (;;) {
        pthread_mutex_lock(&s->lock);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        if (s->c == NULL) {
            if (!store_connect(s, why, sizeof(why))) {
                mark_down(s, why);
                if (wait_ms(s, backoff))
                    break;
                backoff = backoff * 2 > s->backoff_max_ms ? s->backoff_max_ms : backoff * 2;
                continue;
            }
            backoff = 50;
            mark_up(s);
        }
        bool ok = sync_leases(s, false, why, sizeof(why));
        if (ok && mono_ms() >= s->next_usage_push) {
            ok = push_usage(s, why, sizeof(why));
            s->next_usage_push = mono_ms() + s->usage_ms;
        }
        if (!ok) {
            mark_down(s, why);
            continue; /* one immediate reconnect attempt, then backoff */
        }
        if (wait_ms(s, s->sync_ms))
            break;
    }
    if (s->c) {
        /* Leases this replica holds go back to the fleet; usage is flushed. */
        (void)sync_leases(s, true, why, sizeof(why));
        (void)push_usage(s, why, sizeof(why));
        pdq_rconn_close(s->c);
        s->c = NULL;
    }
    return NULL;
}

pdq_status_t pdq_store_start(pdq_store_t *s)
{
    if (s->started)
        return PDQ_ERR_STATE;
    if (pthread_create(&s->thread, NULL, store_main, s) != 0)
        return PDQ_ERR_NOMEM;
    s->started = true;
    return PDQ_OK;
}

void pdq_store_free(pdq_store_t *s)
{
    if (s == NULL)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->lock);
        s->stop = true;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    pdq_rtls_free(s->tls);
    pdb_free(s->ops);
    pdb_free(s->prefix);
    pdb_free(s);
}
