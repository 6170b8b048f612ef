/*
 * pdgw_kvctl_reload.c - the KV control service's options on a config reload (SIGHUP, POST
 * /admin/reload): the timing and admission keys of protocol_options apply live to every
 * service the server owns; a change of any other protocol option (sockets, peers, keys, chunk size,
 * the forwarder's own options) still needs a restart and keeps the running value.
 *
 * Live: notif_timeout_ms and notif_fallback (attempts that start waiting from now on),
 * reserve_timeout_ms, reserve_ttl_ms, reserve_retry_ms and reserve_on_refusal (reservations
 * asked from now on), admission_chunks (waiters that now fit are admitted at once).
 */
#include "pdgw_kvctl.h"

#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"

#include "pdgw_reload.h"
#include "pdgw_server_int.h"

static const char *const live_keys[] = {
    "notif_timeout_ms", "notif_fallback",     "reserve_timeout_ms", "reserve_ttl_ms",
    "reserve_retry_ms", "reserve_on_refusal", "admission_chunks",   NULL};

static bool is_live(const char *key)
{
    for (const char *const *k = live_keys; *k != NULL; k++)
        if (strcmp(*k, key) == 0)
            return true;
    return false;
}

/* The first key whose value differs between <a> and <b> and is not live, NULL if none. */
static const char *restart_key(const pdgw_kv_list_t *a, const pdgw_kv_list_t *b)
{
    for (int side = 0; side < 2; side++) {
        const pdgw_kv_list_t *x = side ? b : a, *y = side ? a : b;
        for (size_t i = 0; i < x->count; i++) {
            const char *other = pdgw_kv_list_get(y, x->items[i].key);
            if ((other == NULL || strcmp(other, x->items[i].value) != 0) &&
                !is_live(x->items[i].key))
                return x->items[i].key;
        }
    }
    return NULL;
}

void pdgw_kvctl_apply(pdgw_fwd_kv_svc_t *kv, const pdgw_fwd_kv_opts_t *o)
{
    pthread_mutex_lock(&kv->lock);
    kv->o.notif_timeout_ms = o->notif_timeout_ms;
    kv->o.notif_fallback_decode = o->notif_fallback_decode;
    kv->o.reserve_timeout_ms = o->reserve_timeout_ms;
    kv->o.reserve_ttl_ms = o->reserve_ttl_ms;
    kv->o.reserve_retry_ms = o->reserve_retry_ms;
    kv->o.on_refusal = o->on_refusal;
    kv->o.admission_chunks = o->admission_chunks;
    pdgw_kvctl_adm_grant_locked(kv);
    pdgw_kvctl_unlock(kv);
}

static pdgw_status_t kv_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                size_t errlen)
{
    const pdgw_kv_list_t *next = &pdgw_reload_txn_next(txn)->protocol_options;
    const char *key = restart_key(&pdgw_reload_txn_cur(txn)->protocol_options, next);
    pdgw_fwd_kv_opts_t *o;
    json_t *opts;
    char why[160];
    *state = NULL;
    if (!pdgw_reload_txn_changed(txn, "protocol_options"))
        return PDGW_OK;
    if (!pdgw_kvctl_svcs_any(ctx))
        return PDGW_OK; /* no KV control service: a new forwarder context takes them
                           (pdgw_server_reload.c) */
    if (key != NULL) {
        snprintf(why, sizeof(why), "protocol option %s is read at start-up", key);
        pdgw_reload_txn_keep(txn, "protocol_options", why);
        return PDGW_OK;
    }
    o = pdgw_calloc(1, sizeof(*o));
    opts = json_object();
    for (size_t i = 0; opts != NULL && i < next->count; i++)
        json_object_set_new(opts, next->items[i].key, pdgw_fwd_option_value(next->items[i].value));
    /* The same parse (defaults, ranges) as the forwarder's configure at start-up. */
    if (o == NULL || opts == NULL ||
        pdgw_fwd_kv_opts_parse(opts, 1, 1, o, err, errlen) != PDGW_FWD_OK) {
        if (o != NULL && opts != NULL && err[0] == '\0')
            snprintf(err, errlen, "protocol_options: out of memory");
        json_decref(opts);
        pdgw_free(o);
        return o == NULL || opts == NULL ? PDGW_ERR_NOMEM : PDGW_ERR_INVALID;
    }
    json_decref(opts);
    *state = o;
    return PDGW_OK;
}

static void kv_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    (void)txn;
    if (state == NULL)
        return;
    pdgw_kvctl_svcs_apply(ctx, state);
    pdgw_log_info("reload", "KV control: live protocol options applied");
    pdgw_free(state);
}

static void kv_abort(void *ctx, void *state)
{
    (void)ctx;
    pdgw_free(state);
}

pdgw_status_t pdgw_kvctl_reload_register(pdgw_reload_t *rl, pdgw_fwd_kv_svcs_t *set)
{
    static const char *const keys[] = {"protocol_options", NULL};
    pdgw_reload_hook_t h = {.name = "kvctl",
                            .ctx = set,
                            .keys = keys,
                            .prepare = kv_prepare,
                            .commit = kv_commit,
                            .abort = kv_abort};
    return pdgw_reload_register(rl, &h);
}
