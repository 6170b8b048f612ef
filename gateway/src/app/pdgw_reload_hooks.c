/*
 * pdgw_reload_hooks.c - what main's subsystems apply live on a reload: tenants, API and admin
 * keys, log level, the static instance set, scheduling policies. See pdgw_reload.h.
 */
#include <stdio.h>
#include <string.h>

#include <pdsched/sched.h>

#include "pdgw_alloc.h"
#include "pdgw_auth.h"
#include "pdgw_tenants.h"

#include "pdgw_reload.h"

/* Everything the hooks borrow. */
typedef struct hooks_ctx {
    pdgw_auth_t *auth;
    pdq_t *quota; /* NULL without tenants */
    sched_pool_t *pool;
    pdgw_reload_map_instance_fn map;
    pdgw_policy_t start_policy[2]; /* [0] prefill, [1] decode: what the pool built */
} hooks_ctx_t;

static hooks_ctx_t the_ctx; /* one gateway per process */

/* ---------------------------------------------------------------- auth */

static const char *const auth_keys[] = {"api_keys", "api_key_file", "admin_api_key", NULL};

/* Built on every reload: a key file may have changed under the same name. A file that drops
 * every API key (a lost line, a key file that moved) fails closed: the reload is refused
 * unless the file says `api_keys: []`. */
static pdgw_status_t auth_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                  size_t errlen)
{
    hooks_ctx_t *c = ctx;
    const pdgw_config_t *next = pdgw_reload_txn_next(txn);
    pdgw_auth_t *fresh = NULL;
    pdgw_status_t st;
    st = pdgw_auth_from_config(next, &fresh, err, errlen);
    if (st == PDGW_OK && pdgw_auth_key_count(c->auth) > 0 && pdgw_auth_key_count(fresh) == 0 &&
        !next->api_keys_cleared) {
        snprintf(err, errlen,
                 "the new config has no API key (the running one has %zu): say `api_keys: []` "
                 "to turn authentication off",
                 pdgw_auth_key_count(c->auth));
        st = PDGW_ERR_INVALID;
    }
    if (st != PDGW_OK) {
        pdgw_auth_destroy(fresh);
        return st;
    }
    *state = fresh;
    return PDGW_OK;
}

static void auth_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    hooks_ctx_t *c = ctx;
    (void)txn;
    pdgw_auth_swap(c->auth, state);
    pdgw_auth_destroy(state); /* now holds the old keys */
}

static void auth_abort(void *ctx, void *state)
{
    (void)ctx;
    pdgw_auth_destroy(state);
}

/* ---------------------------------------------------------------- tenants */

static const char *const tenant_keys[] = {"tenants", NULL};

/* Before auth, so that both see the same tenants when a change needs a restart. Prepared on
 * every reload, as auth is: a key file may have changed under the same name. */
static pdgw_status_t tenants_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                     size_t errlen)
{
    hooks_ctx_t *c = ctx;
    pdq_update_t *u = NULL;
    bool restart = false;
    char why[320] = "";
    pdgw_status_t st = pdgw_tenants_update_prepare(pdgw_reload_txn_next(txn), c->quota, &u,
                                                   &restart, why, sizeof(why));
    if (st != PDGW_OK) {
        snprintf(err, errlen, "%s", why);
        return st;
    }
    if (restart) {
        if (pdgw_reload_txn_changed(txn, "tenants"))
            pdgw_reload_txn_keep(txn, "tenants", why);
        return PDGW_OK;
    }
    *state = u;
    return PDGW_OK;
}

static void tenants_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    hooks_ctx_t *c = ctx;
    if (state == NULL)
        return;
    const char *summary = pdq_update_summary(state);
    if (pdgw_reload_txn_changed(txn, "tenants"))
        pdgw_log_info("reload", "tenants: limits, weights and keys applied%s%s",
                      summary[0] ? "; " : "", summary);
    pdq_update_commit(c->quota, state);
}

static void tenants_abort(void *ctx, void *state)
{
    (void)ctx;
    pdq_update_free(state);
}

/* ---------------------------------------------------------------- log */

static const char *const log_keys[] = {"log_level", "access_log", NULL};

static void log_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    const pdgw_config_t *next = pdgw_reload_txn_next(txn);
    (void)ctx;
    (void)state;
    pdgw_log_set_level(next->log_level);
    pdgw_log_set_access(next->access_log);
}

/* ---------------------------------------------------------------- instances */

static const char *const inst_keys[] = {"instances", NULL};

typedef struct inst_plan {
    char **remove; /* ids (borrowed from the running config) */
    size_t n_remove;
    const pdgw_instance_config_t **add; /* borrowed from the candidate */
    size_t n_add;
} inst_plan_t;

static const pdgw_instance_config_t *find_inst(const pdgw_config_t *cfg, const char *id)
{
    for (size_t i = 0; i < cfg->n_instances; i++)
        if (strcmp(cfg->instances[i].id, id) == 0)
            return &cfg->instances[i];
    return NULL;
}

/* Same instance for the pool? Compared through the descriptor the pool would get. */
static bool inst_same(hooks_ctx_t *c, const pdgw_instance_config_t *a,
                      const pdgw_instance_config_t *b)
{
    size_t n;
    const pdgw_config_option_t *itab = pdgw_config_instance_options(&n);
    (void)c;
    for (size_t k = 0; k < n; k++) {
        const pdgw_config_option_t *o = &itab[k];
        const char *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
        if (o->key == NULL)
            continue;
        switch (o->type) {
        case PDGW_OPT_STRING:
        case PDGW_OPT_HOSTPORT: {
            const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
            if (strcmp(sa ? sa : "", sb ? sb : "") != 0)
                return false;
            break;
        }
        case PDGW_OPT_INT:
        case PDGW_OPT_ENUM:
            if (*(const int *)fa != *(const int *)fb)
                return false;
            break;
        case PDGW_OPT_BOOL:
            if (*(const bool *)fa != *(const bool *)fb)
                return false;
            break;
        case PDGW_OPT_INT_LIST: {
            const pdgw_int_list_t *la = (const void *)fa, *lb = (const void *)fb;
            if (la->count != lb->count ||
                (la->count && memcmp(la->items, lb->items, la->count * sizeof(int)) != 0))
                return false;
            break;
        }
        case PDGW_OPT_MAP: {
            const pdgw_kv_list_t *ma = (const void *)fa, *mb = (const void *)fb;
            if (ma->count != mb->count)
                return false;
            for (size_t i = 0; i < ma->count; i++) {
                const char *v = pdgw_kv_list_get(mb, ma->items[i].key);
                if (v == NULL || strcmp(v, ma->items[i].value) != 0)
                    return false;
            }
            break;
        }
        case PDGW_OPT_LIST: {
            const pdgw_str_list_t *la = (const void *)fa, *lb = (const void *)fb;
            if (la->count != lb->count)
                return false;
            for (size_t i = 0; i < la->count; i++)
                if (strcmp(la->items[i], lb->items[i]) != 0)
                    return false;
            break;
        }
        default:
            break;
        }
    }
    return true;
}

static void plan_free(inst_plan_t *p)
{
    if (p == NULL)
        return;
    pdgw_free(p->remove);
    pdgw_free(p->add);
    pdgw_free(p);
}

static pdgw_status_t inst_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                  size_t errlen)
{
    hooks_ctx_t *c = ctx;
    const pdgw_config_t *cur = pdgw_reload_txn_cur(txn), *next = pdgw_reload_txn_next(txn);
    inst_plan_t *p;

    if (!pdgw_reload_txn_changed(txn, "instances"))
        return PDGW_OK;
    p = pdgw_calloc(1, sizeof(*p));
    if (p == NULL ||
        (cur->n_instances && (p->remove = pdgw_calloc(cur->n_instances, sizeof(char *))) == NULL) ||
        (next->n_instances && (p->add = pdgw_calloc(next->n_instances, sizeof(*p->add))) == NULL)) {
        plan_free(p);
        snprintf(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    /* Gone or changed: leaves the pool. */
    for (size_t i = 0; i < cur->n_instances; i++) {
        const pdgw_instance_config_t *n = find_inst(next, cur->instances[i].id);
        if (n == NULL || !inst_same(c, &cur->instances[i], n))
            p->remove[p->n_remove++] = cur->instances[i].id;
    }
    /* New or changed: joins it, unless the id belongs to an instance the config did not
     * make (added through /admin/instances or found by discovery). */
    for (size_t i = 0; i < next->n_instances; i++) {
        const pdgw_instance_config_t *ni = &next->instances[i];
        const pdgw_instance_config_t *o = find_inst(cur, ni->id);
        sched_instance_desc_t d;
        char why[256];
        if (o != NULL && inst_same(c, o, ni))
            continue;
        if (o == NULL) {
            sched_instance_t *si = sched_pool_get(c->pool, ni->id);
            if (si != NULL) {
                sched_instance_unref(si);
                snprintf(err, errlen,
                         "instances[%zu]: id '%s' is taken by an instance the config did not "
                         "add (admin API or discovery)",
                         i, ni->id);
                plan_free(p);
                return PDGW_ERR_EXISTS;
            }
        }
        c->map(ni, &d);
        if (sched_instance_desc_validate(&d, why, sizeof(why)) != SCHED_OK) {
            snprintf(err, errlen, "instances[%zu] %s: %s", i, ni->id, why);
            plan_free(p);
            return PDGW_ERR_INVALID;
        }
        p->add[p->n_add++] = ni;
    }
    *state = p;
    return PDGW_OK;
}

static void inst_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    hooks_ctx_t *c = ctx;
    inst_plan_t *p = state;
    size_t removed = 0, added = 0;
    (void)txn;
    if (p == NULL)
        return;
    /* Removed instances take no new booking from here on; a request holding one keeps its
     * reference and finishes (sched_pool_remove). */
    for (size_t i = 0; i < p->n_remove; i++)
        if (sched_pool_remove(c->pool, p->remove[i]) == SCHED_OK)
            removed++;
    for (size_t i = 0; i < p->n_add; i++) {
        sched_instance_desc_t d;
        char why[256];
        c->map(p->add[i], &d);
        if (sched_pool_add(c->pool, &d, why, sizeof(why)) == SCHED_OK)
            added++;
        else
            pdgw_log_error("reload", "instance %s not added: %s", p->add[i]->id, why);
    }
    pdgw_log_info("reload", "instances: %zu left the pool, %zu joined it", removed, added);
    plan_free(p);
}

static void inst_abort(void *ctx, void *state)
{
    (void)ctx;
    plan_free(state);
}

/* ---------------------------------------------------------------- policies */

static const char *const policy_keys[] = {"prefill_policy", "decode_policy", NULL};

/* Could the pool built at start-up run <p> for role index <r>? (what sched_pool_set_policy
 * will accept: the prefix index per role, the KV-event index for either role) */
static bool policy_possible(const hooks_ctx_t *c, int r, pdgw_policy_t p)
{
    if (p == PDGW_POLICY_PREFIX_AWARE)
        return c->start_policy[r] == PDGW_POLICY_PREFIX_AWARE;
    if (p == PDGW_POLICY_PRECISE_PREFIX)
        return c->start_policy[0] == PDGW_POLICY_PRECISE_PREFIX ||
               c->start_policy[1] == PDGW_POLICY_PRECISE_PREFIX;
    return true;
}

static pdgw_status_t policy_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                    size_t errlen)
{
    hooks_ctx_t *c = ctx;
    const pdgw_config_t *next = pdgw_reload_txn_next(txn);
    (void)state;
    (void)err;
    (void)errlen;
    if (pdgw_reload_txn_changed(txn, "prefill_policy") &&
        !policy_possible(c, 0, next->prefill_policy))
        pdgw_reload_txn_keep(txn, "prefill_policy", "its index is built at start-up");
    if (pdgw_reload_txn_changed(txn, "decode_policy") &&
        !policy_possible(c, 1, next->decode_policy))
        pdgw_reload_txn_keep(txn, "decode_policy", "its index is built at start-up");
    return PDGW_OK;
}

static void policy_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    hooks_ctx_t *c = ctx;
    const pdgw_config_t *next = pdgw_reload_txn_next(txn);
    (void)state;
    if (pdgw_reload_txn_changed(txn, "prefill_policy") &&
        sched_pool_set_policy(c->pool, SCHED_ROLE_PREFILL,
                              pdgw_policy_to_sched(next->prefill_policy)) != SCHED_OK)
        pdgw_log_error("reload", "prefill_policy %s refused by the pool",
                       pdgw_policy_name(next->prefill_policy));
    if (pdgw_reload_txn_changed(txn, "decode_policy") &&
        sched_pool_set_policy(c->pool, SCHED_ROLE_DECODE,
                              pdgw_policy_to_sched(next->decode_policy)) != SCHED_OK)
        pdgw_log_error("reload", "decode_policy %s refused by the pool",
                       pdgw_policy_name(next->decode_policy));
}

/* ---------------------------------------------------------------- registration */

pdgw_status_t pdgw_reload_hooks_register(pdgw_reload_t *rl, const pdgw_config_t *cfg,
                                         struct pdgw_auth *auth, struct sched_pool *pool,
                                         struct pdq *quota, pdgw_reload_map_instance_fn map)
{
    const pdgw_reload_hook_t hooks[] = {
        {.name = "tenants",
         .keys = tenant_keys,
         .prepare = tenants_prepare,
         .commit = tenants_commit,
         .abort = tenants_abort,
         .ctx = &the_ctx},
        {.name = "auth",
         .keys = auth_keys,
         .prepare = auth_prepare,
         .commit = auth_commit,
         .abort = auth_abort,
         .ctx = &the_ctx},
        {.name = "instances",
         .keys = inst_keys,
         .prepare = inst_prepare,
         .commit = inst_commit,
         .abort = inst_abort,
         .ctx = &the_ctx},
        {.name = "policies",
         .keys = policy_keys,
         .prepare = policy_prepare,
         .commit = policy_commit,
         .ctx = &the_ctx},
        {.name = "log", .keys = log_keys, .commit = log_commit, .ctx = &the_ctx},
    };
    the_ctx.auth = auth;
    the_ctx.quota = quota;
    the_ctx.pool = pool;
    the_ctx.map = map;
    the_ctx.start_policy[0] = cfg->prefill_policy;
    the_ctx.start_policy[1] = cfg->decode_policy;
    for (size_t i = quota == NULL ? 1 : 0; i < sizeof(hooks) / sizeof(hooks[0]); i++) {
        pdgw_status_t st = pdgw_reload_register(rl, &hooks[i]); /* tenants: with a quota layer */
        if (st != PDGW_OK)
            return st;
    }
    return PDGW_OK;
}
