/*
 * Discovery back-ends of libpdsched.
 *
 * A back-end is a const ops table with a name. The pool creates every
 * built-in back-end whose configured() says its config section is filled
 * in, starts it from sched_pool_start(), ticks it from the background
 * thread and destroys it in sched_pool_destroy().
 *
 * Built-ins: "static" (config instances), "dns" (one name per role,
 * re-resolved on its own thread), "kubernetes" (EndpointSlices; lives in
 * scheduler/src/sched_discovery_k8s.c and defines sched_discovery_k8s_ops;
 * the build links it in when that file exists).
 *
 * A back-end reports what it sees through the pool functions below, from
 * any thread. It owns the instances of its own source only: it upserts
 * the ones it sees and retires the ones that vanished; reconciliation uses
 * sched_pool_foreach() filtered by source.
 */
#ifndef PDSCHED_DISCOVERY_H
#define PDSCHED_DISCOVERY_H

#include <pdsched/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sched_discovery_ops {
    const char *name;      /* "static", "dns", "kubernetes", ... */
    sched_source_t source; /* the source its instances carry */

    /* Whether <cfg> asks for this back-end (e.g. a selector is set). */
    bool (*configured)(const sched_config_t *cfg);

    /* Allocate state from <cfg> (copy what you keep: cfg is borrowed).
     * No threads, no I/O yet. Set *state_out on success only. */
    sched_status_t (*create)(const sched_config_t *cfg, sched_pool_t *pool, void **state_out);

    /* Begin discovering: may do first I/O or spawn its own thread (for
     * blocking work such as resolvers or watch streams). May be NULL. */
    sched_status_t (*start)(void *state);

    /* Called from the pool's background thread about every 100 ms (and
     * from sched_pool_poll()). Must not block. May be NULL. */
    void (*tick)(void *state, uint64_t now_ms);

    /* Stop threads, free state. Instances already reported stay in the
     * pool (the pool is being destroyed anyway). */
    void (*destroy)(void *state);

    /* Optional: the back-end's own Prometheus text (complete lines with
     * # HELP / # TYPE), malloc'd, or NULL. sched_metrics_text() appends it
     * and frees it. Called from any thread. */
    char *(*metrics_text)(void *state);
} sched_discovery_ops_t;

/* Defined in sched_discovery_k8s.c by the Kubernetes back-end. */
extern const sched_discovery_ops_t sched_discovery_k8s_ops;

/*
 * Register an extra (non built-in) back-end before any sched_pool_create().
 * SCHED_ERR_EXISTS for a duplicate name. Not thread-safe against pool
 * creation: call at start-up.
 */
sched_status_t sched_discovery_register(const sched_discovery_ops_t *ops);

/* The registered back-end of that name (built-ins included), or NULL. */
const sched_discovery_ops_t *sched_discovery_find(const char *name);

/* ---- pool functions a back-end calls -------------------------------- */

/*
 * Insert or update the instance with desc->id (required here). New id →
 * added (state up). Same id and same descriptor → kept (its load, health
 * and breaker state untouched); a retiring instance is un-retired, an
 * instance drained by discovery is undrained (an admin drain stays).
 * Same id, different descriptor → replaced by a fresh instance (bookings
 * holding the old one finish on it).
 */
sched_status_t sched_pool_upsert(sched_pool_t *pool, const sched_instance_desc_t *desc, char *err,
                                 size_t err_len);

/* Mark draining on behalf of discovery (e.g. endpoint not ready). */
sched_status_t sched_pool_discovery_drain(sched_pool_t *pool, const char *id);

/* Drain now, remove once nothing is in flight on it (checked by the pool
 * thread). Upserting the same id before then cancels the retirement. */
sched_status_t sched_pool_retire(sched_pool_t *pool, const char *id);

/* Visit every instance currently in the pool (a snapshot; the instance
 * is borrowed for the call). Stop early by returning false. */
typedef bool (*sched_instance_visit_fn)(void *arg, sched_instance_t *inst);
void sched_pool_foreach(sched_pool_t *pool, sched_instance_visit_fn fn, void *arg);

/* The pool's clock (the injected one in tests). */
uint64_t sched_pool_now_ms(sched_pool_t *pool);

/* Log one line through the pool's log function (config .log; stderr for
 * warnings and errors by default). printf-style, no trailing newline. */
void sched_pool_logf(const sched_pool_t *pool, sched_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif /* PDSCHED_DISCOVERY_H */
