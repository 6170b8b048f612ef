/*
 * pdgw_main.c - the gateway binary. Start-up in stages:
 *   1. register: forwarders registered themselves from constructors (no I/O);
 *   2. read config: defaults < YAML < env < CLI, plugins loaded while checking the protocol;
 *   3. allocate: logger, API keys, metrics, instance pool, server (binds the port);
 *   4. start: pool threads, workers; then wait for signals: SIGHUP reloads the config
 *      (pdgw_reload.c), SIGTERM/SIGINT drain and stop.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <curl/curl.h>
#include <pdsched/sched.h>

#include "pdgw_alloc.h"

#include "pdgw_doctor.h"
#include "pdgw_fwd_setup.h"

#include "pdgw_otel.h"
#include "pdgw_registry.h"
#include "pdgw_reload.h"
#include "pdgw_route.h"

#include "pdgw_admit.h"
#include "pdgw_auth.h"
#include "pdgw_tenants.h"
#include "pdgw_wiring.h"
#include "pdtok/tokenizer.h" /* pdgw tokenize */
#include "pdgw_server_int.h"
#include "pdgw_slo.h"
#include "pdgw_tls.h"

extern char **environ;

/* ---------------------------------------------------------------- config hook */

static bool plugins_loaded;

static pdgw_status_t main_protocol_info(void *ctx, const pdgw_config_t *cfg,
                                        pdgw_protocol_info_t *info, char *err, size_t errlen)
{
    size_t i;
    (void)ctx;
    if (!plugins_loaded) {
        plugins_loaded = true;
        for (i = 0; i < cfg->plugins.count; i++) {
            pdgw_status_t st = pdgw_registry_load_plugin(cfg->plugins.items[i], err, errlen);
            if (st != PDGW_OK)
                return st;
        }
    }
    return pdgw_config_builtin_protocol_info(NULL, cfg, info, err, errlen);
}

/* ---------------------------------------------------------------- pool */

static sched_role_t map_role(pdgw_role_t r)
{
    return r == PDGW_ROLE_PREFILL  ? SCHED_ROLE_PREFILL
           : r == PDGW_ROLE_DECODE ? SCHED_ROLE_DECODE
                                   : SCHED_ROLE_BOTH;
}

static void map_instance(const pdgw_instance_config_t *ic, sched_instance_desc_t *d)
{
    size_t j;
    sched_instance_desc_init(d);
    d->id = ic->id;
    d->url = ic->url;
    d->role = map_role(ic->role);
    d->weight = ic->weight > 0 ? (unsigned)ic->weight : 1;
    d->kv_host = ic->kv_host;
    d->kv_port = ic->kv_port;
    d->bootstrap_port = ic->bootstrap_port;
    d->engine_id = ic->engine_id;
    d->kv_events_endpoint = ic->kv_events_endpoint;
    d->kv_events_replay_endpoint = ic->kv_events_replay_endpoint;
    for (j = 0; j < ic->alloc_ports.count && j < SCHED_MAX_TP; j++)
        d->alloc_ports[j] = ic->alloc_ports.items[j];
    d->n_alloc_ports = j;
    for (j = 0; j < ic->init_ports.count && j < SCHED_MAX_TP; j++)
        d->init_ports[j] = ic->init_ports.items[j];
    d->n_init_ports = j;
    d->tp_size = ic->tp_size;
    d->kv_capacity_tokens = (uint64_t)ic->kv_capacity_tokens;
    d->dp_rank = ic->dp_rank;
    d->dp_size = ic->dp_size;
    d->kv_engine = ic->kv_engine == 1 ? SCHED_KV_ENGINE_LIBKVT : SCHED_KV_ENGINE_UPSTREAM;
    d->max_concurrent = ic->max_concurrent > 0 ? (unsigned)ic->max_concurrent : 0;
    d->zone = ic->zone;
    d->attrs = ic->attrs_text;
    for (j = 0; j < ic->labels.count && j < SCHED_MAX_LABELS; j++) {
        d->labels[j].key = ic->labels.items[j].key;
        d->labels[j].value = ic->labels.items[j].value;
    }
    d->n_labels = j;
    for (j = 0; j < ic->models.count && j < SCHED_MAX_MODELS; j++)
        d->models[j] = ic->models.items[j];
    d->n_models = j;
    d->source = SCHED_SOURCE_STATIC;
}

/* libpdsched's messages (discovery, probes, breakers) through pdgw's logger. */
static void sched_log_adapter(void *arg, sched_log_level_t level, const char *msg)
{
    pdgw_log_level_t l = level == SCHED_LOG_DEBUG  ? PDGW_LOG_LEVEL_DEBUG
                         : level == SCHED_LOG_INFO ? PDGW_LOG_LEVEL_INFO
                         : level == SCHED_LOG_WARN ? PDGW_LOG_LEVEL_WARN
                                                   : PDGW_LOG_LEVEL_ERROR;
    (void)arg;
    if (pdgw_log_enabled(l))
        pdgw_log_write(l, "sched", "%s", msg);
}

/* The instance pool of <cfg>. <static_only>: an empty pool without discovery and without
 * log output (for --check-config, which must not reach the network). */
static pdgw_status_t make_pool(const pdgw_config_t *cfg, bool static_only, sched_pool_t **out,
                               char *err, size_t errlen)
{
    sched_config_t sc;
    sched_instance_desc_t *descs = NULL;
    sched_status_t st;
    size_t i;

    sched_config_init(&sc);
    sc.log = static_only ? NULL : sched_log_adapter;
    sc.log_arg = NULL;
    sc.prefill_policy = pdgw_policy_to_sched(cfg->prefill_policy);
    sc.decode_policy = pdgw_policy_to_sched(cfg->decode_policy);
    sc.health_interval_ms = cfg->health_interval_ms;
    sc.health_timeout_ms = cfg->health_timeout_ms;
    sc.healthy_threshold = (unsigned)cfg->healthy_threshold;
    sc.unhealthy_threshold = (unsigned)cfg->unhealthy_threshold;
    sc.metrics_scrape_interval_ms = cfg->metrics_scrape_interval_ms;
    sc.breaker_failures = (unsigned)cfg->breaker_failures;
    sc.breaker_open_ms = cfg->breaker_open_time_ms;
    sc.kv_events_prefix_weight = cfg->kv_events_prefix_weight;
    sc.prefill_step_tokens = (uint32_t)cfg->engine_step_tokens;
    sc.kv_events_load_weight = cfg->kv_events_load_weight;
    sc.kv_events_other_tier_weight = cfg->kv_events_other_tier_percent / 100.0;
    sc.kv_events_max_blocks = (size_t)cfg->kv_events_max_blocks;
    sc.kv_events_max_message_bytes = (size_t)cfg->kv_events_max_message_bytes;
    sc.kv_events_silence_ms = cfg->kv_events_silence_ms;
    sc.autoscale_ttft_ms =
        (uint32_t)(cfg->autoscale_ttft_ms ? cfg->autoscale_ttft_ms : cfg->slo_ttft_ms);
    sc.autoscale_tpot_ms =
        (uint32_t)(cfg->autoscale_tpot_ms ? cfg->autoscale_tpot_ms : cfg->slo_tpot_ms);
    sc.autoscale_tau_ms = cfg->autoscale_tau_ms;
    sc.autoscale_window_ms = cfg->autoscale_window_ms;
    if (cfg->n_instances > 0) {
        descs = pdgw_calloc(cfg->n_instances, sizeof(*descs));
        if (descs == NULL) {
            snprintf(err, errlen, "out of memory");
            return PDGW_ERR_NOMEM;
        }
        for (i = 0; i < cfg->n_instances; i++)
            map_instance(&cfg->instances[i], &descs[i]);
    }
    sc.instances = static_only ? NULL : descs;
    sc.n_instances = static_only ? 0 : cfg->n_instances;
    if (cfg->dns_enabled && !static_only) {
        sc.dns.prefill = cfg->dns.prefill;
        sc.dns.decode = cfg->dns.decode;
        sc.dns.both = cfg->dns.both;
        sc.dns.interval_ms = cfg->dns.interval_ms;
    }
    if (cfg->k8s_enabled && !static_only) {
        sc.kubernetes.namespace_ = cfg->k8s.namespace_name;
        sc.kubernetes.prefill_selector = cfg->k8s.prefill_selector;
        sc.kubernetes.decode_selector = cfg->k8s.decode_selector;
        sc.kubernetes.both_selector = cfg->k8s.both_selector;
        sc.kubernetes.port_name = cfg->k8s.port_name;
        sc.kubernetes.api_server = cfg->k8s.api_server;
        sc.kubernetes.token_file = cfg->k8s.token_file;
        sc.kubernetes.ca_file = cfg->k8s.ca_file;
    }
    st = sched_pool_create(&sc, out);
    pdgw_free(descs);
    if (st != SCHED_OK) {
        snprintf(err, errlen, "instances: %s", sched_strerror(st));
        return PDGW_ERR_INVALID;
    }
    return PDGW_OK;
}

static pdgw_status_t collect_sched_metrics(void *ctx, pdgw_buf_t *out)
{
    char *text = sched_metrics_text(ctx);
    pdgw_status_t st;
    if (text == NULL)
        return PDGW_ERR_NOMEM;
    st = pdgw_buf_append_str(out, text);
    free(text);
    return st;
}

static json_t *options_json(const pdgw_config_t *cfg)
{
    json_t *o = json_object();
    size_t i;
    if (o == NULL)
        return NULL;
    for (i = 0; i < cfg->protocol_options.count; i++)
        json_object_set_new(o, cfg->protocol_options.items[i].key,
                            pdgw_fwd_option_value(cfg->protocol_options.items[i].value));
    return o;
}

static pdgw_mode_t config_mode(const pdgw_config_t *cfg)
{
    return cfg->scheduling == PDGW_SCHED_STAGED ? PDGW_MODE_STAGED : PDGW_MODE_BATCH;
}

/* --check-config: what start-up does after reading the config, short of binding ports and
 * starting threads: the forwarder's configure and plan (check-only), the instance pool, and
 * the protocol's needs of every configured instance. Instances found by discovery are not
 * known yet and are not checked. */
/* The configured instances as the forwarder of <fs> sees them: its declared attributes and its
 * check_instance op, every unusable one named (as many as fit). At start-up and in the deep
 * check: a setting the protocol cannot use is an error before the first request, not then. */
static pdgw_status_t check_config_instances(const pdgw_config_t *cfg, const pdgw_fwd_setup_t *fs,
                                            char *err, size_t errlen)
{
    sched_pool_t *pool = NULL;
    pdgw_status_t st;
    size_t i, used = 0, bad = 0;

    st = make_pool(cfg, true, &pool, err, errlen);
    if (st == PDGW_OK && cfg->n_instances > 0) {
        /* The static instances join a pool when it starts; add them by hand (in one step:
         * one by one copies the set once per instance) to get the scheduler's own view of
         * each (URL parsed, defaults applied). */
        sched_instance_desc_t *descs = pdgw_calloc(cfg->n_instances, sizeof(*descs));
        char why[256];
        if (descs == NULL) {
            snprintf(err, errlen, "out of memory");
            st = PDGW_ERR_NOMEM;
        } else {
            for (i = 0; i < cfg->n_instances; i++)
                map_instance(&cfg->instances[i], &descs[i]);
            if (sched_pool_add_many(pool, descs, cfg->n_instances, why, sizeof(why)) != SCHED_OK) {
                snprintf(err, errlen, "instances: %s", why);
                st = PDGW_ERR_INVALID;
            }
            pdgw_free(descs);
        }
    }
    for (i = 0; st == PDGW_OK && i < cfg->n_instances; i++) {
        sched_instance_t *si;
        pdgw_instance_t view;
        char why[256];
        si = sched_pool_get(pool, cfg->instances[i].id);
        if (si == NULL)
            continue;
        pdgw_instance_view_from_sched(&view, si);
        if (pdgw_fwd_check_instance(fs, &view, why, sizeof(why)) != PDGW_OK) {
            if (used < errlen) {
                int n = snprintf(err + used, errlen - used, "%sinstances[%zu] %s: %s",
                                 bad ? "; " : "", i, view.id, why);
                if (n > 0)
                    used += (size_t)n;
            }
            bad++;
        }
        sched_instance_unref(si);
    }
    if (st == PDGW_OK && bad > 0)
        st = PDGW_ERR_INVALID;
    sched_pool_destroy(pool);
    return st;
}

/* The forwarder set up as --check-config does (no services), for the checks above. */
static pdgw_status_t check_setup(const pdgw_config_t *cfg, pdgw_fwd_setup_t *fs, char *err,
                                 size_t errlen)
{
    json_t *options = options_json(cfg);
    pdgw_status_t st;
    if (options == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    st = pdgw_fwd_setup(cfg->protocol, config_mode(cfg), options,
                        (unsigned)pdgw_config_workers(cfg), true, NULL, fs, err, errlen);
    json_decref(options);
    return st;
}

/* Start-up's own instance check (the deep check runs it too): true when one is unusable, the
 * reasons in <err>. */
static bool config_instances_unusable(const pdgw_config_t *cfg, char *err, size_t errlen)
{
    pdgw_fwd_setup_t fs = {0};
    pdgw_status_t st = check_setup(cfg, &fs, err, errlen);
    if (st == PDGW_OK)
        st = check_config_instances(cfg, &fs, err, errlen);
    pdgw_fwd_teardown(&fs);
    return st != PDGW_OK;
}

static pdgw_status_t main_deep_check(void *ctx, const pdgw_config_t *cfg, char *err, size_t errlen)
{
    pdgw_fwd_setup_t fs;
    pdgw_status_t st;
    (void)ctx;

    st = check_setup(cfg, &fs, err, errlen);
    if (st != PDGW_OK)
        return st;
    st = pdgw_fwd_check_client_pd_fields(&fs, (pdgw_pd_fields_mode_t)cfg->client_pd_fields, err,
                                         errlen);
    if (st == PDGW_OK) {
        pdgw_otel_config_t oc;
        st = pdgw_otel_config_load(cfg->tracing.otlp_endpoint, cfg->tracing.service_name,
                                   cfg->tracing.sample_ratio, environ, &oc, err, errlen);
    }
    if (st == PDGW_OK) /* the tokenizers the gateway would load, loaded */
        st = pdgw_tokenizers_check(&cfg->tokenizers, stderr, err, errlen);
    if (st == PDGW_OK) {
        /* tenants: their key files read, names, keys and the store's URL checked */
        pdq_t *q = NULL;
        pdgw_auth_t *auth = NULL;
        st = pdgw_auth_from_config(cfg, &auth, err, errlen);
        if (st == PDGW_OK)
            st = pdgw_tenants_create(cfg, &q, err, errlen);
        pdq_free(q);
        pdgw_auth_destroy(auth);
    }
    if (st == PDGW_OK)
        st = check_config_instances(cfg, &fs, err, errlen);
    pdgw_fwd_teardown(&fs);
    return st;
}

/* Every stream holds two sockets (client and engine): use the whole hard limit. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            pdgw_log_warn("main", "cannot raise the open-file limit: %s", strerror(errno));
    }
}

/* The server's options that come straight from the configuration (the caller adds what was
 * built from it: auth, pool, metrics, tracing, admission, TLS, reload). */
static void server_opts_from_config(const pdgw_config_t *c, json_t *options, pdgw_server_opts_t *o)
{
    pdgw_server_opts_init(o);
    o->listen_host = c->listen_host;
    o->listen_port = c->listen_port;
    o->workers = (unsigned)pdgw_config_workers(c);
    o->protocol = c->protocol;
    o->mode = config_mode(c);
    o->protocol_options = options;
    o->max_body_bytes = c->max_body_bytes;
    o->client_buffer_size = c->client_buffer_size;
    o->request_timeout_ms = c->request_timeout_ms;
    o->max_buffered_body_bytes = c->max_buffered_body_bytes;
    o->max_request_timeout_ms = c->max_request_timeout_ms;
    o->admin_untrusted_loopback = !c->admin_trust_loopback;
    o->metrics_need_key = c->metrics_need_key;
    o->connect_timeout_ms = c->connect_timeout_ms;
    o->first_byte_timeout_ms = c->first_byte_timeout_ms;
    o->idle_timeout_ms = c->idle_timeout_ms;
    o->retries = c->retries > 0 ? (unsigned)c->retries : 0;
    o->client_header_timeout_ms = c->client_header_timeout_ms;
    o->max_connections = c->max_connections > 0 ? (unsigned)c->max_connections : 0;
    o->max_connections_per_client =
        c->max_connections_per_client > 0 ? (unsigned)c->max_connections_per_client : 0;
    o->client_pd_fields = (pdgw_pd_fields_mode_t)c->client_pd_fields;
    o->upstream_client = (pdgw_upstream_client_t)c->upstream_client;
    o->stream_output = (pdgw_stream_output_t)c->stream_output;
    o->frontend = (pdgw_frontend_t)c->frontend;
    o->route.tokenize_timeout_ms = c->tokenize_timeout_ms;
    o->route.tokenize_cache_entries = (unsigned)c->tokenize_cache_entries;
    o->route.pd_min_prompt_tokens = (unsigned)c->pd_min_prompt_tokens;
    o->route.pd_skip_cached_percent = (unsigned)c->pd_skip_cached_percent;
    o->route.pd_skip_predicted = c->pd_skip_predicted;
    o->models = (const char *const *)c->models.items;
    o->n_models = c->models.count;
    o->no_passthrough = !c->passthrough;
    o->cors_origins = (const char *const *)c->cors_allowed_origins.items;
    o->n_cors_origins = c->cors_allowed_origins.count;
}

/* Admission limits, retry backoff, session affinity: one swappable struct. */
static pdgw_status_t make_admit(const pdgw_config_t *c, pdgw_metrics_t *reg, pdgw_admit_t **out,
                                char *err, size_t errlen)
{
    pdgw_admit_limits_t al;
    pdgw_status_t st;

    pdgw_admit_limits_init(&al);
    st = pdgw_admit_limits_from_config(c, &al, err, errlen);
    if (st == PDGW_OK)
        st = pdgw_admit_create(&al, reg, out);
    pdgw_admit_limits_free(&al);
    return st;
}

/* SIGTERM / SIGINT: stop taking requests, let those in flight finish within drain_timeout; a
 * second signal stops at once. */
static void drain(pdgw_server_t *srv, pdgw_reload_t *reload, const sigset_t *sigs, int sig)
{
    pdgw_log_info("main", "%s: draining (up to %llu ms, %llu request(s) in flight)",
                  sig == SIGTERM ? "SIGTERM" : "SIGINT",
                  (unsigned long long)pdgw_reload_drain_timeout_ms(reload),
                  (unsigned long long)pdgw_server_inflight(srv));
    pdgw_server_drain(srv);
    {
        uint64_t end = pdgw_time_mono_ms() + pdgw_reload_drain_timeout_ms(reload);
        struct timespec ts = {0, 20 * 1000 * 1000};
        while (pdgw_server_inflight(srv) > 0 && pdgw_time_mono_ms() < end) {
            int s = sigtimedwait(sigs, NULL, &ts);
            if (s == SIGINT || s == SIGTERM) {
                pdgw_log_warn("main", "second signal: stopping now");
                break;
            }
        }
    }
    if (pdgw_server_inflight(srv) > 0)
        pdgw_log_warn("main", "drain timeout: cancelling %llu request(s)",
                      (unsigned long long)pdgw_server_inflight(srv));
    else
        pdgw_log_info("main", "drained");
}

/* Signals are handled by the main thread only (sigwait), never by a worker. */
static void block_signals(sigset_t *sigs)
{
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(sigs);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
}

/* Client API keys (tenants' included) and the admin key. */
static pdgw_status_t make_auth(const pdgw_config_t *c, pdgw_auth_t **out, char *err, size_t errlen)
{
    return pdgw_auth_from_config(c, out, err, errlen);
}

/* The tenants' usage and the quota store's health on /metrics. */
static pdgw_status_t collect_quota_metrics(void *ctx, pdgw_buf_t *out)
{
    pdb_prom_t p;
    pdb_prom_init(&p, out);
    pdq_usage_prometheus(ctx, &p);
    return pdb_prom_status(&p) == PDB_OK ? PDGW_OK : PDGW_ERR_NOMEM;
}

/* SIGHUP reloads the configuration; returns the signal that stops the gateway. */
static int serve_until_stopped(pdgw_reload_t *reload, const sigset_t *sigs)
{
    int sig = 0;

    for (;;) {
        if (sigwait(sigs, &sig) != 0)
            continue;
        if (sig != SIGHUP)
            return sig;
        json_decref(pdgw_reload_run(reload, "SIGHUP"));
    }
}

/* Tracing (OTLP/HTTP), NULL when no endpoint is configured. */
static pdgw_status_t make_otel(const pdgw_config_t *c, pdgw_otel_t **out, char *err, size_t errlen)
{
    pdgw_otel_config_t oc;
    pdgw_status_t st = pdgw_otel_config_load(c->tracing.otlp_endpoint, c->tracing.service_name,
                                             c->tracing.sample_ratio, environ, &oc, err, errlen);
    return st != PDGW_OK ? st : pdgw_otel_create(&oc, out, err, errlen);
}

/* The reloader takes the config over; what the server borrows from it stays put (see
 * pdgw_reload.h), and SIGHUP / POST /admin/reload re-read it from here on. */
static pdgw_status_t make_reload(pdgw_config_t *cfg, int argc, char **argv,
                                 const pdgw_config_hooks_t *hooks, pdgw_metrics_t *reg,
                                 pdgw_auth_t *auth, sched_pool_t *pool, pdgw_admit_t *admit,
                                 pdq_t *quota, pdgw_reload_t **out)
{
    pdgw_config_t start = *cfg; /* scalars only, for the hooks' start-up view */

    if (pdgw_reload_create(cfg, argc, argv, environ, hooks, reg, out) != PDGW_OK ||
        pdgw_reload_hooks_register(*out, &start, auth, pool, quota, map_instance) != PDGW_OK ||
        (admit != NULL && pdgw_admit_reload_register(admit, *out) != PDGW_OK))
        return PDGW_ERR_NOMEM;
    return PDGW_OK;
}

/* The command line, environment and config file (pdgw_config_free even on failure). */
static pdgw_status_t load_config(pdgw_config_t *cfg, int argc, char **argv,
                                 pdgw_config_hooks_t *hooks, pdgw_config_action_t *action)
{
    pdgw_config_error_t cerr;

    memset(hooks, 0, sizeof(*hooks));
    hooks->protocol_info = main_protocol_info;
    hooks->deep_check = main_deep_check;
    hooks->progname = "pdgw";
    memset(&cerr, 0, sizeof(cerr));
    return pdgw_config_from_args(cfg, argc, argv, environ, hooks, action, &cerr);
}

/* `pdgw --check-engines`: the pool start-up builds (instances, discovery), then the doctor's
 * table (pdgw_doctor.h). Returns the exit status. */
static int check_engines(const pdgw_config_t *cfg, bool json)
{
    sched_pool_t *pool = NULL;
    char err[768];
    int rc = 1;

    pdgw_log_init(cfg->log_level > PDGW_LOG_LEVEL_WARN ? cfg->log_level : PDGW_LOG_LEVEL_WARN,
                  cfg->log_format, -1);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "pdgw: curl_global_init failed\n");
        return 1;
    }
    if (make_pool(cfg, false, &pool, err, sizeof(err)) != PDGW_OK)
        fprintf(stderr, "pdgw: %s\n", err);
    else if (sched_pool_start(pool) != SCHED_OK)
        fprintf(stderr, "pdgw: cannot start the instance pool\n");
    else
        rc = pdgw_doctor_main(cfg, pool, json, stdout);
    sched_pool_destroy(pool);
    curl_global_cleanup();
    return rc;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    pdgw_config_t cfg;
    pdgw_config_hooks_t hooks;
    pdgw_config_action_t action = PDGW_CONFIG_RUN;
    pdgw_auth_t *auth = NULL;
    pdgw_metrics_t *reg = NULL;
    pdgw_gateway_metrics_t gm;
    sched_pool_t *pool = NULL;
    pdgw_server_t *srv = NULL;
    pdgw_server_opts_t so;
    pdgw_otel_t *otel = NULL;
    pdgw_admit_t *admit = NULL;
    pdgw_tls_t *tls = NULL;
    pdgw_reload_t *reload = NULL;
    pdgw_doctor_bg_t *doctor = NULL;
    pdgw_slo_config_t *slo = NULL;
    pdq_t *quota = NULL;
    char **kv_bpt_models = NULL; /* kv_bytes_per_token, for the tenants' usage */
    uint64_t *kv_bpt = NULL;
    size_t n_kv_bpt = 0;
    json_t *options = NULL;
    sigset_t sigs;
    char err[768];
    int rc = 1;
    int sig = 0;

    /* A tool, not the gateway: token ids of JSON lines with a local tokenizer (libpdtok). */
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0)
        return pdtok_cli_main(argc - 1, argv + 1);

    /* Stage 1 happened before main(). */
    block_signals(&sigs);

    /* Stage 2: configuration. */
    if (load_config(&cfg, argc, argv, &hooks, &action) != PDGW_OK)
        goto out_cfg;
    if (action == PDGW_CONFIG_EXIT) {
        rc = 0;
        goto out_cfg;
    }
    if (action == PDGW_CONFIG_CHECK_ENGINES || action == PDGW_CONFIG_CHECK_ENGINES_JSON) {
        rc = check_engines(&cfg, action == PDGW_CONFIG_CHECK_ENGINES_JSON);
        goto out_cfg;
    }

    /* Stage 3: allocate. */
    pdgw_log_init(cfg.log_level, cfg.log_format, -1);
    pdgw_log_set_access(cfg.access_log);
    raise_fd_limit();
    if (pdgw_registry_log() > 0)
        pdgw_log_warn("main", "some forwarder registrations were refused (see above)");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        pdgw_log_error("main", "curl_global_init failed");
        goto out_cfg;
    }
    if (make_auth(&cfg, &auth, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_auth;
    }
    if (cfg.tls_cert[0] != '\0' &&
        pdgw_tls_create(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, &tls, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_auth;
    }
    if (pdgw_metrics_create(0, &reg) != PDGW_OK ||
        pdgw_gateway_metrics_init(reg, PDGW_VERSION_STRING, &gm) != PDGW_OK) {
        pdgw_log_error("main", "cannot create the metrics registry");
        goto out_auth;
    }
    pdgw_gateway_metrics_touch_protocol(&gm, cfg.protocol);
    if (make_pool(&cfg, false, &pool, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_metrics;
    }
    pdgw_metrics_collector_add(reg, collect_sched_metrics, pool);
    if (make_otel(&cfg, &otel, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_pool;
    }
    if (otel != NULL)
        pdgw_metrics_collector_add(reg, pdgw_otel_metrics, otel);
    options = options_json(&cfg);
    if (make_admit(&cfg, reg, &admit, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "admission: %s", err);
        goto out_pool;
    }
    if (pdgw_slo_config_create(&cfg, &slo, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_pool;
    }
    if (config_instances_unusable(&cfg, err, sizeof(err))) {
        pdgw_log_error("main", "%s", err);
        goto out_pool;
    }
    if (pdgw_tenants_create(&cfg, &quota, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "tenants: %s", err);
        goto out_pool;
    }
    if (quota != NULL)
        pdgw_metrics_collector_add(reg, collect_quota_metrics, quota);

    if (cfg.check_engines_at_start && pdgw_doctor_bg_create(&cfg, &doctor) != PDGW_OK) {
        pdgw_log_error("main", "out of memory");
        goto out_pool;
    }
    server_opts_from_config(&cfg, options, &so);
    so.auth = auth;
    so.pool = pool;
    so.metrics = &gm;
    so.otel = otel;
    so.admit = admit;
    so.slo = slo;
    so.quota = quota;
    so.quota_output_estimate = cfg.quota.output_estimate;
    /* built once, as the tenants are: the running config's list may move on reload */
    if (cfg.kv_bytes_per_token.count > 0) {
        n_kv_bpt = cfg.kv_bytes_per_token.count;
        kv_bpt_models = pdgw_calloc(n_kv_bpt, sizeof(*kv_bpt_models));
        kv_bpt = pdgw_calloc(n_kv_bpt, sizeof(*kv_bpt));
        for (size_t i = 0; kv_bpt_models && kv_bpt && i < cfg.kv_bytes_per_token.count; i++) {
            if (pdgw_kv_bytes_parse(cfg.kv_bytes_per_token.items[i].value, &kv_bpt[i]) != PDGW_OK ||
                (kv_bpt_models[i] = pdgw_strdup(cfg.kv_bytes_per_token.items[i].key)) == NULL)
                break;
            so.n_kv_bpt = i + 1;
        }
        so.kv_bpt_models = (const char *const *)kv_bpt_models;
        so.kv_bpt = kv_bpt;
    }
    so.tls = tls;
    if (make_reload(&cfg, argc, argv, &hooks, reg, auth, pool, admit, quota, &reload) != PDGW_OK) {
        pdgw_log_error("main", "cannot set up config reloads");
        goto out_pool;
    }
    so.reload = reload;
    /* The reload keeps the loaded config from here on (cfg was moved into it). */
    so.route.tokenizers = &pdgw_reload_config(reload)->tokenizers;
    if (pdgw_gateway_wire() != PDGW_OK) {
        pdgw_log_error("main", "cannot register the rooms' hooks (a wiring bug)");
        goto out_pool;
    }
    if (pdgw_server_create(&so, &srv, err, sizeof(err)) != PDGW_OK) {
        pdgw_log_error("main", "%s", err);
        goto out_pool;
    }
    if (pdgw_server_reload_register(srv, reload) != PDGW_OK ||
        pdgw_tokenize_reload_register(srv, reload) != PDGW_OK) {
        pdgw_log_error("main", "cannot set up config reloads");
        goto out_server;
    }

    /* Stage 4: start. */
    if (sched_pool_start(pool) != SCHED_OK) {
        pdgw_log_error("main", "cannot start the instance pool");
        goto out_server;
    }
    if (pdgw_server_start(srv) != PDGW_OK)
        goto out_server;
    if (quota != NULL && pdq_start(quota) != PDQ_OK) {
        pdgw_log_error("main", "cannot start the quota store's thread");
        goto out_server;
    }
    if (quota != NULL)
        pdgw_log_info("main", "%zu tenant(s), budgets %s", pdq_tenant_count(quota) - 1,
                      pdgw_reload_config(reload)->quota_store[0] ? "shared through the quota store"
                                                                 : "kept by this replica");
    if (doctor != NULL && pdgw_doctor_bg_start(doctor, pool, reg) != PDGW_OK)
        pdgw_log_warn("main", "cannot start the engine checks");
    if (pdgw_auth_key_count(auth) > 0)
        pdgw_log_info("main", "API keys required (%zu configured)", pdgw_auth_key_count(auth));

    sig = serve_until_stopped(reload, &sigs);
    drain(srv, reload, &sigs, sig);
    rc = 0;

out_server:
    pdgw_doctor_bg_destroy(doctor); /* before the pool it probes */
    doctor = NULL;
    pdgw_server_destroy(srv);
out_pool:
    pdgw_doctor_bg_destroy(doctor);
    pdgw_admit_destroy(admit); /* after the server: finalize released every slot */
    if (quota != NULL)
        pdgw_metrics_collector_remove(reg, collect_quota_metrics, quota);
    pdq_free(quota); /* after the server: every ticket was released; leases go back */
    for (size_t i = 0; kv_bpt_models != NULL && i < n_kv_bpt; i++)
        pdgw_free(kv_bpt_models[i]);
    pdgw_free(kv_bpt_models);
    pdgw_free(kv_bpt);
    pdgw_slo_config_destroy(slo);
    /* After the server: it borrowed strings of the running config. */
    pdgw_reload_destroy(reload);
    json_decref(options);
    /* After the server: every request has recorded its spans; the last batch goes out now. */
    if (otel != NULL)
        pdgw_metrics_collector_remove(reg, pdgw_otel_metrics, otel);
    pdgw_otel_destroy(otel);
    if (pool)
        pdgw_metrics_collector_remove(reg, collect_sched_metrics, pool);
    sched_pool_destroy(pool);
out_metrics:
    pdgw_metrics_destroy(reg);
out_auth:
    pdgw_tls_destroy(tls);
    pdgw_auth_destroy(auth);
    curl_global_cleanup();
out_cfg:
    pdgw_config_free(&cfg);
    return rc;
}
