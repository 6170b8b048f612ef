/*
 * pdgw_server_reload.c - the request limits and the forwarder's options, applied by a config
 * reload (SIGHUP, POST /admin/reload) without a restart.
 *
 *   request_timeout, max_body_bytes, retries   atomics in the server; a request copies them
 *                                              when it arrives (req_new), so a request in
 *                                              flight keeps the values it started with
 *   protocol_options                           a new forwarder context, configured and
 *                                              planned like at start-up, replaces the current
 *                                              one for new requests; each request holds a
 *                                              reference to the context it started with, and
 *                                              the last one out destroys an old context
 *
 * A protocol_options change stays "needs restart" (the running context is kept) when the new
 * context cannot be made next to the running one (a forwarder that binds a fixed port cannot
 * bind it twice) or when it would plan a different dispatch (the server's stages are laid out
 * for the start-up plan). With a KV control service open (lmcache, vllm-kvt) the service's
 * hook (pdgw_kvctl_reload.c) decides instead: no second context is made.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_fwd_setup.h"
#include "pdgw_kvctl.h"

#include "pdgw_reload.h"
#include "pdgw_server_int.h"

struct pdgw_fwd_gen {
    atomic_int refs;
    const pdgw_fwd_desc_t *desc;
    void *ctx; /* owned: the forwarder's destroy runs when the last reference goes */
};

static pdgw_fwd_gen_t *gen_new(const pdgw_fwd_desc_t *desc, void *ctx)
{
    pdgw_fwd_gen_t *g = pdgw_calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    atomic_init(&g->refs, 1);
    g->desc = desc;
    g->ctx = ctx;
    return g;
}

static void gen_put(pdgw_fwd_gen_t *g)
{
    if (g == NULL || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    if (g->desc->ops->destroy && g->ctx)
        g->desc->ops->destroy(g->ctx);
    pdgw_free(g);
}

pdgw_status_t pdgw_server_live_init(pdgw_server_t *srv)
{
    pthread_mutex_init(&srv->fwd_gen_lock, NULL);
    atomic_init(&srv->live_max_body_bytes, srv->opts.max_body_bytes);
    atomic_init(&srv->live_request_timeout_ms, srv->opts.request_timeout_ms);
    atomic_init(&srv->live_retries, srv->opts.retries);
    srv->fwd_gen = gen_new(srv->desc, srv->fwd_ctx);
    return srv->fwd_gen != NULL ? PDGW_OK : PDGW_ERR_NOMEM;
}

void pdgw_server_live_fini(pdgw_server_t *srv)
{
    /* Every request is gone: this is the last reference of the current context (older
     * ones went with their last request). */
    gen_put(srv->fwd_gen);
    srv->fwd_gen = NULL;
    srv->fwd_ctx = NULL;
    pthread_mutex_destroy(&srv->fwd_gen_lock);
}

void pdgw_req_live_acquire(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    pthread_mutex_lock(&srv->fwd_gen_lock);
    r->fwd_gen = srv->fwd_gen;
    atomic_fetch_add(&r->fwd_gen->refs, 1);
    pthread_mutex_unlock(&srv->fwd_gen_lock);
    r->fwd_ctx = r->fwd_gen->ctx;
    r->max_body_bytes = atomic_load(&srv->live_max_body_bytes);
    r->request_timeout_ms = atomic_load(&srv->live_request_timeout_ms);
    r->max_retries = atomic_load(&srv->live_retries);
}

void pdgw_req_live_release(pdgw_req_t *r)
{
    gen_put(r->fwd_gen);
    r->fwd_gen = NULL;
    r->fwd_ctx = NULL;
}

/* ---------------------------------------------------------------- request limits */

static const char *const limit_keys[] = {"request_timeout", "max_body_bytes", "retries", NULL};

static void limits_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    pdgw_server_t *srv = ctx;
    const pdgw_config_t *n = pdgw_reload_txn_next(txn);
    (void)state;
    atomic_store(&srv->live_max_body_bytes, n->max_body_bytes);
    atomic_store(&srv->live_request_timeout_ms, n->request_timeout_ms);
    atomic_store(&srv->live_retries, n->retries > 0 ? (unsigned)n->retries : 0u);
}

/* ---------------------------------------------------------------- protocol_options */

static const char *const option_keys[] = {"protocol_options", NULL};

static json_t *options_json(const pdgw_config_t *cfg)
{
    json_t *o = json_object();
    for (size_t i = 0; o != NULL && i < cfg->protocol_options.count; i++)
        if (json_object_set_new(o, cfg->protocol_options.items[i].key,
                                pdgw_fwd_option_value(cfg->protocol_options.items[i].value)) != 0) {
            json_decref(o);
            return NULL;
        }
    return o;
}

static pdgw_status_t options_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                     size_t errlen)
{
    pdgw_server_t *srv = ctx;
    pdgw_fwd_setup_t fs;
    char why[256];
    json_t *options;
    pdgw_status_t st;

    *state = NULL;
    /* With a KV control service open (lmcache, vllm-kvt) its own hook decides which options
     * apply live (pdgw_kvctl_reload.c): a second context would open a second service. */
    if (!pdgw_reload_txn_changed(txn, "protocol_options") || pdgw_kvctl_svcs_any(srv->kv_svcs))
        return PDGW_OK;
    options = options_json(pdgw_reload_txn_next(txn));
    if (options == NULL) {
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    /* The reload's check already ran the check-only configure: the options are valid. */
    st = pdgw_fwd_setup(srv->opts.protocol, srv->opts.mode, options, srv->n_workers, false,
                        srv->kv_svcs, &fs, why, sizeof(why));
    json_decref(options);
    if (st != PDGW_OK) {
        /* The reason without the prefixes the key already says (the log line is short). */
        const char *w = why;
        size_t n = strlen(srv->desc->name);
        if (strncmp(w, "protocol_options: ", 18) == 0)
            w += 18;
        if (strncmp(w, srv->desc->name, n) == 0 && strncmp(w + n, ": ", 2) == 0)
            w += n + 2;
        if (strncmp(w, "protocol option ", 16) == 0)
            w += 16;
        pdgw_reload_txn_keep(txn, "protocol_options", w);
        return PDGW_OK;
    }
    if (fs.desc != srv->desc || memcmp(&fs.plan, &srv->plan, sizeof(fs.plan)) != 0) {
        pdgw_fwd_teardown(&fs);
        pdgw_reload_txn_keep(txn, "protocol_options",
                             "the new options change the forwarder's dispatch plan");
        return PDGW_OK;
    }
    *state = gen_new(fs.desc, fs.ctx);
    if (*state == NULL) {
        pdgw_fwd_teardown(&fs);
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    return PDGW_OK;
}

static void options_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    pdgw_server_t *srv = ctx;
    pdgw_fwd_gen_t *old;
    (void)txn;
    if (state == NULL)
        return; /* unchanged, or kept */
    pthread_mutex_lock(&srv->fwd_gen_lock);
    old = srv->fwd_gen;
    srv->fwd_gen = state;
    pthread_mutex_unlock(&srv->fwd_gen_lock);
    pdgw_log_info("reload", "protocol_options: new requests use the new %s options",
                  srv->desc->name);
    gen_put(old); /* destroyed now, or by the last request that started with it */
}

static void options_abort(void *ctx, void *state)
{
    (void)ctx;
    gen_put(state);
}

pdgw_status_t pdgw_server_reload_register(pdgw_server_t *srv, pdgw_reload_t *rl)
{
    pdgw_reload_hook_t limits = {
        .name = "request limits", .keys = limit_keys, .commit = limits_commit, .ctx = srv};
    pdgw_reload_hook_t options = {.name = "forwarder options",
                                  .keys = option_keys,
                                  .prepare = options_prepare,
                                  .commit = options_commit,
                                  .abort = options_abort,
                                  .ctx = srv};
    /* The KV control services this server's forwarder opened apply their live options
     * themselves (pdgw_kvctl_reload.c). */
    pdgw_status_t st = pdgw_kvctl_reload_register(rl, srv->kv_svcs);
    if (st == PDGW_OK)
        st = pdgw_reload_register(rl, &limits);
    return st != PDGW_OK ? st : pdgw_reload_register(rl, &options);
}
