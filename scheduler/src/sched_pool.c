/*
 * The instance pool: life cycle, the snapshot of instances, membership and
 * administrative state changes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "sched_int.h"
#include "pdb/pdb_clock.h"

#define RELAXED memory_order_relaxed

static uint64_t default_clock(void *arg)
{
    (void)arg;
    return pdb_clock_mono_ms();
}

static void default_log(void *arg, sched_log_level_t level, const char *msg)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};

    (void)arg;
    if (level >= SCHED_LOG_WARN)
        fprintf(stderr, "pdsched %s: %s\n", names[level], msg);
}

uint64_t sched_pool_now(const sched_pool_t *pool)
{
    return pool->clock(pool->clock_arg);
}

uint64_t sched_pool_now_ms(sched_pool_t *pool)
{
    return sched_pool_now(pool);
}

void sched_pool_logf(const sched_pool_t *pool, sched_log_level_t level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pool->log(pool->log_arg, level, buf);
}

uint64_t sched_pool_kv_ttl_ms(const sched_pool_t *pool)
{
    uint64_t ttl = pool->scrape_interval_ms * 4;

    return ttl < 5000 ? 5000 : ttl;
}

/* ---- snapshots and the id index ------------------------------------ */

/*
 * The instance set is the snapshot (arrays the pickers scan) plus pool->by_id (id → member,
 * what the by-id calls and the uniqueness test read). A change of the set costs a copy of
 * the snapshot's arrays, but no scan by id and no reference per entry: the index holds the
 * one reference of each member and the snapshots borrow it. A reader reaches a snapshot only
 * under the read lock, and the writer swaps it under the write lock, so once the swap is done
 * nobody holds the previous one and an instance that left can be released.
 */

static void snapshot_free(sched_snapshot_t *snap)
{
    sched_free(snap);
}

static void snapshot_put(sched_snapshot_t *snap, sched_instance_t *inst)
{
    snap->all[snap->n_all++] = inst;
    for (int r = 0; r < 2; r++) {
        size_t k;
        if (!(inst->roles & (r == SCHED_RIDX_PREFILL ? SCHED_ROLE_PREFILL : SCHED_ROLE_DECODE)))
            continue;
        k = snap->n_role[r]++;
        snap->role[r][k] = inst;
        snap->wsum[r][k] = (k ? snap->wsum[r][k - 1] : 0) + inst->weight;
    }
}

/* The snapshot after <cur> (NULL: none) loses its <n_leaving> instances marked leaving and
 * gains add[0..n_add) at the end. */
static sched_snapshot_t *snapshot_next(const sched_snapshot_t *cur, size_t n_leaving,
                                       sched_instance_t *const *add, size_t n_add)
{
    size_t n = (cur ? cur->n_all - n_leaving : 0) + n_add, cap = n ? n : 1;
    sched_snapshot_t *snap;

    snap = sched_calloc(1, sizeof(*snap) + 2 * cap * sizeof(uint64_t) +
                               3 * cap * sizeof(sched_instance_t *));
    if (!snap)
        return NULL;
    snap->wsum[0] = (uint64_t *)(snap + 1);
    snap->wsum[1] = snap->wsum[0] + cap;
    snap->all = (sched_instance_t **)(snap->wsum[1] + cap);
    snap->role[0] = snap->all + cap;
    snap->role[1] = snap->role[0] + cap;
    for (size_t i = 0; cur && i < cur->n_all; i++)
        if (!cur->all[i]->leaving)
            snapshot_put(snap, cur->all[i]);
    for (size_t i = 0; i < n_add; i++)
        snapshot_put(snap, add[i]);
    return snap;
}

/* The instance holding <id> now (read lock or write_mu held), or NULL. */
static sched_instance_t *member_get(const sched_pool_t *pool, const char *id)
{
    const sched_member_t *m = pdb_map_get(&pool->by_id, id);

    return m ? m->inst : NULL;
}

static void member_free(void *val)
{
    sched_member_t *m = val;

    sched_instance_unref(m->inst);
    sched_free(m);
}

/*
 * Change the set (write_mu held): drop[0..n_drop) leave it, add[0..n_add) join it. An added
 * instance whose id is taken must replace the holder, which is then among <drop>. The added
 * get their uids here, in the order they join, so the arrays stay sorted by uid. Either all
 * of it happens or nothing: SCHED_ERR_NO_MEMORY, or SCHED_ERR_EXISTS when two of <add> share
 * an id (*clash_out: the index of the second).
 */
static sched_status_t rebuild(sched_pool_t *pool, sched_instance_t *const *drop, size_t n_drop,
                              sched_instance_t *const *add, size_t n_add, size_t *clash_out)
{
    sched_member_t **fresh = NULL; /* fresh[i]: the new entry for add[i], NULL on a replace */
    sched_snapshot_t *next, *prev;
    sched_status_t status = SCHED_OK;
    size_t put = 0;

    fresh = sched_calloc(n_add ? n_add : 1, sizeof(*fresh));
    if (!fresh)
        return SCHED_ERR_NO_MEMORY;
    for (size_t i = 0; i < n_add; i++) {
        if (member_get(pool, add[i]->desc.id) != NULL)
            continue;
        fresh[i] = sched_malloc(sizeof(*fresh[i]));
        if (!fresh[i]) {
            status = SCHED_ERR_NO_MEMORY;
            goto err_fresh;
        }
        fresh[i]->inst = add[i];
    }
    for (size_t i = 0; i < n_drop; i++)
        drop[i]->leaving = true;
    next = snapshot_next(pool->snap, n_drop, add, n_add);
    if (!next) {
        status = SCHED_ERR_NO_MEMORY;
        goto err_leaving;
    }

    pthread_rwlock_wrlock(&pool->lock);
    /* New ids first: the only step that can fail, undone before anything else changed. */
    for (; put < n_add; put++) {
        pdb_status_t ps;
        if (!fresh[put])
            continue;
        ps = pdb_map_put(&pool->by_id, add[put]->desc.id, fresh[put]);
        if (ps != PDB_OK) {
            status = ps == PDB_ERR_EXISTS ? SCHED_ERR_EXISTS : SCHED_ERR_NO_MEMORY;
            if (clash_out)
                *clash_out = put;
            break;
        }
    }
    if (status != SCHED_OK) {
        while (put-- > 0)
            if (fresh[put])
                pdb_map_remove(&pool->by_id, add[put]->desc.id);
        pthread_rwlock_unlock(&pool->lock);
        snapshot_free(next);
        goto err_leaving;
    }
    for (size_t i = 0; i < n_add; i++) {
        add[i]->uid = atomic_fetch_add(&pool->next_uid, 1);
        sched_instance_ref(add[i]);
        if (!fresh[i]) /* a replace: the entry changes hands */
            ((sched_member_t *)pdb_map_get(&pool->by_id, add[i]->desc.id))->inst = add[i];
    }
    for (size_t i = 0; i < n_drop; i++) {
        const sched_member_t *m = pdb_map_get(&pool->by_id, drop[i]->desc.id);
        if (m && m->inst == drop[i])
            sched_free(pdb_map_remove(&pool->by_id, drop[i]->desc.id));
    }
    prev = pool->snap;
    pool->snap = next;
    pthread_rwlock_unlock(&pool->lock);

    sched_kvev_pool_sync(pool, drop, n_drop, add, n_add);
    snapshot_free(prev);
    for (size_t i = 0; i < n_drop; i++) {
        drop[i]->leaving = false;
        sched_instance_unref(drop[i]); /* the index's reference */
    }
    sched_free(fresh);
    return SCHED_OK;

err_leaving:
    for (size_t i = 0; i < n_drop; i++)
        drop[i]->leaving = false;
err_fresh:
    for (size_t i = 0; i < n_add; i++)
        sched_free(fresh[i]);
    sched_free(fresh);
    return status;
}

/* ---- life cycle --------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

sched_status_t sched_pool_create(const sched_config_t *cfg, sched_pool_t **pool_out)
{
    sched_pool_t *pool;
    sched_status_t status;
    pthread_rwlockattr_t attr;
    char err[256];

    if (!cfg || !pool_out)
        return SCHED_ERR_INVALID;
    status = sched_config_validate(cfg, err, sizeof(err));
    if (status != SCHED_OK) {
        (cfg->log ? cfg->log : default_log)(cfg->log_arg, SCHED_LOG_ERROR, err);
        return status;
    }
    pthread_once(&curl_once, curl_init_once);

    pool = sched_calloc(1, sizeof(*pool));
    if (!pool)
        return SCHED_ERR_NO_MEMORY;
    pool->policy[SCHED_RIDX_PREFILL] = cfg->prefill_policy;
    pool->policy[SCHED_RIDX_DECODE] = cfg->decode_policy;
    pool->health_interval_ms = cfg->health_interval_ms;
    pool->health_timeout_ms = cfg->health_timeout_ms ? cfg->health_timeout_ms : 1000;
    pool->healthy_threshold = cfg->healthy_threshold ? cfg->healthy_threshold : 1;
    pool->unhealthy_threshold = cfg->unhealthy_threshold ? cfg->unhealthy_threshold : 1;
    pool->scrape_interval_ms = cfg->metrics_scrape_interval_ms;
    pool->stale_ms =
        cfg->metrics_stale_ms
            ? cfg->metrics_stale_ms
            : 3 * (cfg->metrics_scrape_interval_ms ? cfg->metrics_scrape_interval_ms : 2000);
    pool->breaker_failures = cfg->breaker_failures ? cfg->breaker_failures : 1;
    pool->breaker_open_ms = cfg->breaker_open_ms;
    pool->overload_penalty_ms = cfg->overload_penalty_ms;
    pool->prefix_block_tokens = cfg->prefix_block_tokens ? cfg->prefix_block_tokens : 16;
    pool->prefill_step_tokens =
        cfg->prefill_step_tokens ? cfg->prefill_step_tokens : SCHED_PQ_DEFAULT_STEP_TOKENS;
    pool->prefix_max_blocks = cfg->prefix_max_blocks ? cfg->prefix_max_blocks : 65536;
    pool->prefix_slack = (uint64_t)(cfg->prefix_load_slack * (double)SCHED_LOAD_UNIT);
    pool->zone_slack = (uint64_t)(cfg->zone_load_slack * (double)SCHED_LOAD_UNIT);
    pool->default_max_tokens = cfg->default_max_tokens ? cfg->default_max_tokens : 512;
    pool->clock = cfg->clock ? cfg->clock : default_clock;
    pool->clock_arg = cfg->clock_arg;
    pool->log = cfg->log ? cfg->log : default_log;
    pool->log_arg = cfg->log_arg;
    atomic_init(&pool->next_uid, 1);
    sched_rng_seed_base(cfg->seed);

    pool->health_path = sched_strdup(cfg->health_path ? cfg->health_path : "/health");
    pool->metrics_path = sched_strdup(cfg->metrics_path ? cfg->metrics_path : "/metrics");
    if (!pool->health_path || !pool->metrics_path) {
        status = SCHED_ERR_NO_MEMORY;
        goto err_strings;
    }

    pool->snap = snapshot_next(NULL, 0, NULL, 0);
    if (!pool->snap) {
        status = SCHED_ERR_NO_MEMORY;
        goto err_strings;
    }
    if (pdb_map_init(&pool->by_id, cfg->n_instances) != PDB_OK) {
        status = SCHED_ERR_NO_MEMORY;
        goto err_snap;
    }
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&pool->lock, &attr) != 0) {
        pthread_rwlockattr_destroy(&attr);
        status = SCHED_ERR_NO_MEMORY;
        goto err_snap;
    }
    pthread_rwlockattr_destroy(&attr);
    if (pthread_mutex_init(&pool->write_mu, NULL) != 0) {
        status = SCHED_ERR_NO_MEMORY;
        goto err_rwlock;
    }
    for (int r = 0; r < 2; r++) {
        if (pool->policy[r] != SCHED_POLICY_PREFIX_AWARE)
            continue;
        status = sched_prefix_create(pool->prefix_max_blocks, &pool->prefix[r]);
        if (status != SCHED_OK)
            goto err_prefix;
    }
    status = sched_kvev_pool_create(pool, cfg);
    if (status != SCHED_OK)
        goto err_prefix;
    status = sched_autoscale_create(pool, cfg);
    if (status != SCHED_OK)
        goto err_prefix;
    status = sched_health_create(pool, &pool->health);
    if (status != SCHED_OK)
        goto err_prefix;
    status = sched_discovery_create_all(pool, cfg);
    if (status != SCHED_OK)
        goto err_health;
    *pool_out = pool;
    return SCHED_OK;

err_health:
    sched_health_destroy(pool->health);
err_prefix:
    sched_autoscale_destroy(pool);
    sched_kvev_pool_destroy(pool);
    sched_prefix_destroy(pool->prefix[0]);
    sched_prefix_destroy(pool->prefix[1]);
    pthread_mutex_destroy(&pool->write_mu);
err_rwlock:
    pthread_rwlock_destroy(&pool->lock);
err_snap:
    pdb_map_fini(&pool->by_id, member_free);
    snapshot_free(pool->snap);
err_strings:
    sched_free(pool->health_path);
    sched_free(pool->metrics_path);
    sched_free(pool);
    return status;
}

static void *pool_thread_main(void *arg)
{
    sched_pool_t *pool = arg;

    while (!atomic_load(&pool->stopping))
        sched_health_run_once(pool, 100);
    return NULL;
}

sched_status_t sched_pool_start(sched_pool_t *pool)
{
    sched_status_t status;

    if (pool->started)
        return SCHED_ERR_STATE;
    status = sched_discovery_start_all(pool);
    if (status != SCHED_OK)
        return status;
    status = sched_kvev_pool_start(pool);
    if (status != SCHED_OK)
        return status;
    if (pthread_create(&pool->thread, NULL, pool_thread_main, pool) != 0) {
        sched_pool_logf(pool, SCHED_LOG_ERROR, "cannot start the scheduler thread");
        return SCHED_ERR_IO;
    }
    pool->started = true;
    return SCHED_OK;
}

sched_status_t sched_pool_poll(sched_pool_t *pool, int timeout_ms)
{
    if (pool->started)
        return SCHED_ERR_STATE;
    sched_health_run_once(pool, timeout_ms);
    return SCHED_OK;
}

void sched_pool_destroy(sched_pool_t *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stopping, true);
    if (pool->started) {
        sched_health_wakeup(pool->health);
        pthread_join(pool->thread, NULL);
    }
    sched_discovery_destroy_all(pool);
    sched_health_destroy(pool->health);
    sched_autoscale_destroy(pool);
    sched_kvev_pool_destroy(pool);
    sched_prefix_destroy(pool->prefix[0]);
    sched_prefix_destroy(pool->prefix[1]);
    snapshot_free(pool->snap);
    pdb_map_fini(&pool->by_id, member_free);
    pthread_mutex_destroy(&pool->write_mu);
    pthread_rwlock_destroy(&pool->lock);
    sched_free(pool->health_path);
    sched_free(pool->metrics_path);
    sched_free(pool);
}

/* ---- membership --------------------------------------------------- */

static sched_status_t add_instance(sched_pool_t *pool, sched_instance_t *inst, bool upsert)
{
    sched_status_t status;
    sched_instance_t *old;

    pthread_mutex_lock(&pool->write_mu);
    old = member_get(pool, inst->desc.id);
    if (old) {
        if (!upsert) {
            pthread_mutex_unlock(&pool->write_mu);
            return SCHED_ERR_EXISTS;
        }
        if (sched_desc_equal(&old->desc, &inst->desc)) {
            atomic_fetch_and(&old->gate, ~(uint32_t)(SCHED_DRAIN_RETIRING | SCHED_DRAIN_DISCOVERY));
            pthread_mutex_unlock(&pool->write_mu);
            return SCHED_INPROGRESS; /* unchanged; caller drops its copy */
        }
    }
    status = rebuild(pool, &old, old ? 1 : 0, &inst, 1, NULL);
    pthread_mutex_unlock(&pool->write_mu);
    if (status == SCHED_OK) {
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s (%s, %s) %s", inst->desc.id,
                        sched_role_name(inst->desc.role), inst->desc.url,
                        old ? "replaced" : "added");
        sched_health_wakeup(pool->health);
    }
    return status;
}

sched_status_t sched_pool_add(sched_pool_t *pool, const sched_instance_desc_t *desc, char *err,
                              size_t err_len)
{
    sched_instance_t *inst;
    sched_status_t status;

    status = sched_instance_create(pool, desc, err, err_len, &inst);
    if (status != SCHED_OK)
        return status;
    status = add_instance(pool, inst, false);
    if (status == SCHED_ERR_EXISTS)
        sched_set_err(err, err_len, "id: instance %s already exists", inst->desc.id);
    else if (status == SCHED_ERR_NO_MEMORY)
        sched_set_err(err, err_len, "out of memory");
    sched_instance_unref(inst);
    return status;
}

sched_status_t sched_pool_add_many(sched_pool_t *pool, const sched_instance_desc_t *descs, size_t n,
                                   char *err, size_t err_len)
{
    sched_instance_t **insts;
    sched_status_t status = SCHED_OK;
    size_t made = 0, clash = 0;

    insts = sched_calloc(n ? n : 1, sizeof(*insts));
    if (!insts) {
        sched_set_err(err, err_len, "out of memory");
        return SCHED_ERR_NO_MEMORY;
    }
    for (; made < n && status == SCHED_OK; made++)
        status = sched_instance_create(pool, &descs[made], err, err_len, &insts[made]);
    if (status != SCHED_OK) {
        made--; /* insts[made] was not made */
        goto out;
    }
    pthread_mutex_lock(&pool->write_mu);
    for (size_t i = 0; i < n && status == SCHED_OK; i++)
        if (member_get(pool, insts[i]->desc.id) != NULL) {
            status = SCHED_ERR_EXISTS;
            clash = i;
        }
    if (status == SCHED_OK)
        status = rebuild(pool, NULL, 0, insts, n, &clash);
    pthread_mutex_unlock(&pool->write_mu);
    if (status == SCHED_ERR_EXISTS)
        sched_set_err(err, err_len, "id: instance %s already exists", insts[clash]->desc.id);
    else if (status == SCHED_ERR_NO_MEMORY)
        sched_set_err(err, err_len, "out of memory");
    if (status == SCHED_OK) {
        sched_pool_logf(pool, SCHED_LOG_INFO, "%zu instances added", n);
        sched_health_wakeup(pool->health);
    }
out:
    for (size_t i = 0; i < made; i++)
        sched_instance_unref(insts[i]);
    sched_free(insts);
    return status;
}

sched_status_t sched_pool_upsert(sched_pool_t *pool, const sched_instance_desc_t *desc, char *err,
                                 size_t err_len)
{
    sched_instance_t *inst;
    sched_status_t status;

    if (!desc || !desc->id || !*desc->id) {
        sched_set_err(err, err_len, "id: required for upsert");
        return SCHED_ERR_INVALID;
    }
    status = sched_instance_create(pool, desc, err, err_len, &inst);
    if (status != SCHED_OK)
        return status;
    status = add_instance(pool, inst, true);
    if (status == SCHED_ERR_NO_MEMORY)
        sched_set_err(err, err_len, "out of memory");
    sched_instance_unref(inst);
    return status == SCHED_INPROGRESS ? SCHED_OK : status;
}

sched_instance_t *sched_pool_get(sched_pool_t *pool, const char *id)
{
    sched_instance_t *found;

    if (!id)
        return NULL;
    pthread_rwlock_rdlock(&pool->lock);
    found = sched_instance_ref(member_get(pool, id));
    pthread_rwlock_unlock(&pool->lock);
    return found;
}

static sched_status_t change_flags(sched_pool_t *pool, const char *id, uint32_t set, uint32_t clear)
{
    sched_instance_t *inst = sched_pool_get(pool, id);

    if (!inst)
        return SCHED_ERR_NOT_FOUND;
    if (clear)
        atomic_fetch_and(&inst->gate, ~clear);
    if (set)
        atomic_fetch_or(&inst->gate, set);
    sched_instance_unref(inst);
    return SCHED_OK;
}

sched_status_t sched_pool_drain(sched_pool_t *pool, const char *id)
{
    sched_status_t st = change_flags(pool, id, SCHED_DRAIN_ADMIN, 0);

    if (st == SCHED_OK)
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s draining", id);
    return st;
}

sched_status_t sched_pool_undrain(sched_pool_t *pool, const char *id)
{
    sched_status_t st = change_flags(pool, id, 0, SCHED_DRAIN_ADMIN | SCHED_DRAIN_DISCOVERY);

    if (st == SCHED_OK)
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s undrained", id);
    return st;
}

sched_status_t sched_pool_discovery_drain(sched_pool_t *pool, const char *id)
{
    return change_flags(pool, id, SCHED_DRAIN_DISCOVERY, 0);
}

sched_status_t sched_pool_retire(sched_pool_t *pool, const char *id)
{
    sched_status_t st = change_flags(pool, id, SCHED_DRAIN_RETIRING, 0);

    if (st == SCHED_OK)
        sched_health_wakeup(pool->health);
    return st;
}

sched_status_t sched_pool_remove(sched_pool_t *pool, const char *id)
{
    sched_status_t status;
    sched_instance_t *old;

    if (!id)
        return SCHED_ERR_INVALID;
    pthread_mutex_lock(&pool->write_mu);
    old = member_get(pool, id);
    status = old ? rebuild(pool, &old, 1, NULL, 0, NULL) : SCHED_ERR_NOT_FOUND;
    pthread_mutex_unlock(&pool->write_mu);
    if (status == SCHED_OK)
        sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s removed", id);
    return status;
}

sched_status_t sched_pool_set_policy(sched_pool_t *pool, sched_role_t role, sched_policy_t policy)
{
    int ridx;

    if (!pool || (unsigned)policy >= SCHED_POLICY_COUNT ||
        (role != SCHED_ROLE_PREFILL && role != SCHED_ROLE_DECODE))
        return SCHED_ERR_INVALID;
    ridx = role == SCHED_ROLE_PREFILL ? SCHED_RIDX_PREFILL : SCHED_RIDX_DECODE;
    if (policy == SCHED_POLICY_PREFIX_AWARE && !pool->prefix[ridx])
        return SCHED_ERR_STATE;
    if (policy == SCHED_POLICY_PRECISE_PREFIX && !pool->kvev_index)
        return SCHED_ERR_STATE;
    if (atomic_exchange(&pool->policy[ridx], policy) != policy)
        sched_pool_logf(pool, SCHED_LOG_INFO, "%s policy now %s",
                        ridx == SCHED_RIDX_PREFILL ? "prefill" : "decode",
                        sched_policy_name(policy));
    return SCHED_OK;
}

static bool reapable(const sched_instance_t *inst)
{
    return (sched_gate_drain(inst) & SCHED_DRAIN_RETIRING) && atomic_load(&inst->inflight) == 0;
}

void sched_pool_reap_retired(sched_pool_t *pool)
{
    sched_instance_t **arr;
    size_t n, n_gone = 0;

    if (sched_pool_collect(pool, &arr, &n) != SCHED_OK)
        return;
    for (size_t i = 0; i < n; i++)
        if (reapable(arr[i]))
            arr[n_gone++] = arr[i];
        else
            sched_instance_unref(arr[i]);
    if (n_gone > 0) {
        size_t k = 0;
        pthread_mutex_lock(&pool->write_mu);
        /* still the member of its id, still retiring, still idle; all in one snapshot */
        for (size_t i = 0; i < n_gone; i++)
            if (member_get(pool, arr[i]->desc.id) == arr[i] && reapable(arr[i]))
                arr[k++] = arr[i];
            else
                sched_instance_unref(arr[i]);
        n_gone = k;
        if (n_gone > 0 && rebuild(pool, arr, n_gone, NULL, 0, NULL) == SCHED_OK)
            for (size_t i = 0; i < n_gone; i++)
                sched_pool_logf(pool, SCHED_LOG_INFO, "instance %s retired", arr[i]->desc.id);
        pthread_mutex_unlock(&pool->write_mu);
    }
    sched_pool_release_collected(arr, n_gone);
}

sched_status_t sched_pool_collect(sched_pool_t *pool, sched_instance_t ***out, size_t *n_out)
{
    sched_instance_t **arr;
    const sched_snapshot_t *snap;
    size_t n;

    pthread_rwlock_rdlock(&pool->lock);
    snap = pool->snap;
    n = snap->n_all;
    arr = sched_malloc((n ? n : 1) * sizeof(*arr));
    if (!arr) {
        pthread_rwlock_unlock(&pool->lock);
        return SCHED_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        arr[i] = sched_instance_ref(snap->all[i]);
    pthread_rwlock_unlock(&pool->lock);
    *out = arr;
    *n_out = n;
    return SCHED_OK;
}

void sched_pool_release_collected(sched_instance_t **arr, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sched_instance_unref(arr[i]);
    sched_free(arr);
}

void sched_pool_foreach(sched_pool_t *pool, sched_instance_visit_fn fn, void *arg)
{
    sched_instance_t **arr;
    size_t n;

    if (sched_pool_collect(pool, &arr, &n) != SCHED_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        if (!fn(arg, arr[i]))
            break;
    }
    sched_pool_release_collected(arr, n);
}

size_t sched_pool_size(sched_pool_t *pool)
{
    size_t n;

    pthread_rwlock_rdlock(&pool->lock);
    n = pool->snap->n_all;
    pthread_rwlock_unlock(&pool->lock);
    return n;
}

size_t sched_pool_usable_count(sched_pool_t *pool, sched_role_t role)
{
    int ridx = role == SCHED_ROLE_PREFILL ? SCHED_RIDX_PREFILL : SCHED_RIDX_DECODE;
    uint64_t now = sched_pool_now(pool);
    const sched_snapshot_t *snap;
    size_t n = 0;

    pthread_rwlock_rdlock(&pool->lock);
    snap = pool->snap;
    if (role == SCHED_ROLE_BOTH) {
        for (size_t i = 0; i < snap->n_all; i++) {
            if (snap->all[i]->roles == SCHED_ROLE_BOTH &&
                sched_instance_selectable(snap->all[i], now))
                n++;
        }
    } else {
        for (size_t i = 0; i < snap->n_role[ridx]; i++) {
            if (sched_instance_selectable(snap->role[ridx][i], now))
                n++;
        }
    }
    pthread_rwlock_unlock(&pool->lock);
    return n;
}

bool sched_pool_ready(sched_pool_t *pool, sched_role_t roles)
{
    if ((roles & SCHED_ROLE_PREFILL) && sched_pool_usable_count(pool, SCHED_ROLE_PREFILL) == 0)
        return false;
    if ((roles & SCHED_ROLE_DECODE) && sched_pool_usable_count(pool, SCHED_ROLE_DECODE) == 0)
        return false;
    return true;
}

uint64_t sched_pool_double_releases(sched_pool_t *pool)
{
    return atomic_load(&pool->double_release);
}
