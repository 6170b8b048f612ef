/*
 * pdq_int.h - internal state of libpdquota.
 *
 * Locks: each tenant has its own mutex (budgets, concurrency counters, usage, free tickets);
 * the wait queue has one lock, taken only when the gateway or a tenant is full and on release
 * while someone waits. Order: queue lock, then a tenant's lock. The global shared-slot count
 * and the waiting count are atomics read on every admit and release.
 */
#ifndef PDQ_INT_H
#define PDQ_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "pdb/pdb_map.h"
#include "pdq_bucket.h"
#include "pdquota/pdq_fairq.h"
#include "pdquota/pdquota.h"

enum { PDQ_B_RPS, PDQ_B_RPM, PDQ_B_TPM, PDQ_B_PTPM, PDQ_B_CTPM, PDQ_B_COUNT };

typedef struct pdq_bset {
    pdq_bucket_t b[PDQ_B_COUNT];
} pdq_bset_t;

#define PDQ_HISTORY_MINUTES 60
#define PDQ_FREE_TICKETS    64 /* kept per tenant for reuse */

typedef struct pdq_usage_slot {
    pdq_usage_t total;
    pdq_usage_t minute[PDQ_HISTORY_MINUTES];
    uint64_t minute_id[PDQ_HISTORY_MINUTES];
    pdq_usage_t unpushed; /* not yet added to the store's totals */
    pdq_usage_t fleet;    /* the store's totals at the last push */
    bool fleet_valid;
} pdq_usage_slot_t;

typedef struct pdq_tenant {
    pthread_mutex_t lock;
    char *name;
    uint32_t idx;
    uint32_t max_concurrent, reserved, max_waiting;
    uint32_t inflight, res_used; /* under lock */
    uint32_t waiting;            /* under the queue lock */
    bool leased;                 /* buckets are in leased mode */
    atomic_bool removed;         /* dropped by a reload: no key leads here; what runs drains */
    pdq_bset_t budget;
    pdq_bset_t **model_budget; /* [n_models], NULL where none is configured */
    pdq_usage_slot_t *usage;   /* [n_models] */
    uint64_t refused[PDQ_CODE_COUNT];
    pdq_ticket_t *free_tickets;
    size_t n_free;
} pdq_tenant_t;

enum { PDQ_T_WAITING = 1, PDQ_T_GRANTED = 2 };
enum {
    PDQ_SLOT_NONE = 0,
    PDQ_SLOT_RESERVED,
    PDQ_SLOT_SHARED,
    PDQ_SLOT_TENANT_FULL,
    PDQ_SLOT_GLOBAL_FULL
};

struct pdq_ticket {
    pdq_t *q;
    pdq_fairq_item_t item;
    uint32_t tenant, model;
    uint8_t state, slot;
    bool reconciled;
    double cost[PDQ_B_COUNT]; /* charged to each bucket kind (tenant and model sets) */
    pdq_usage_t usage;
    uint64_t t_admit;
    pdq_on_ready_fn on_ready;
    void *arg;
    pdq_ticket_t *next_free;
};

typedef struct pdq_store pdq_store_t;

struct pdq {
    pdb_clock_t clock;
    /* Room for PDQ_MAX_TENANTS + 1 slots from the start (pages untouched until used), so a
     * reload adds a tenant by publishing the next slot: readers index without a lock. */
    pdq_tenant_t *tenants;
    atomic_size_t n_tenants; /* published slots: the configured, "other", then reload-added */
    atomic_size_t default_tenant;
    size_t other_tenant;
    pdb_map_t keys;   /* API key -> tenant index + 1 */
    pdb_map_t models; /* model name -> index + 1 */
    char **model_names;
    size_t n_models; /* configured + "other" (the last) */
    uint32_t max_concurrent;
    atomic_uint shared_cap;     /* max_concurrent minus every reservation (a reload moves it) */
    double local_share;         /* of each budget while serving on local limits */
    pthread_rwlock_t keys_lock; /* keys is replaced by a reload */
    atomic_uint shared_used;
    atomic_uint waiting;
    pthread_mutex_t fq_lock;
    pdq_fairq_t fq;
    pdq_store_t *store;
    atomic_bool store_up;   /* leases flow: buckets in leased mode */
    atomic_bool refuse_all; /* fail_closed and the store is down */
    pdq_log_fn log;
    void *log_arg;
};

static inline uint64_t pdq_now(const pdq_t *q)
{
    return pdb_clock_now(&q->clock);
}

size_t pdq_model_index(const pdq_t *q, const char *model);
/* Bring <t>'s buckets to the store's mode (tenant lock held). */
void pdq_tenant_sync_mode(pdq_t *q, pdq_tenant_t *t, uint64_t now);
void pdq_usage_add(pdq_usage_t *dst, const pdq_usage_t *src);
void pdq_usage_record(pdq_t *q, pdq_tenant_t *t, uint32_t model, const pdq_usage_t *u,
                      uint64_t now); /* tenant lock held */
void pdq_headers_build(pdq_t *q, pdq_tenant_t *t, uint32_t model, uint64_t now,
                       pdq_headers_t *out); /* tenant lock held */
void pdq_headers_add_retry(pdq_headers_t *h, uint64_t retry_after_ms);
/* Go-style duration text ("12ms", "1s", "6m0s", "1h2m3.5s") of <ns>, rounded up to ms. */
void pdq_duration_format(uint64_t ns, char *buf, size_t len);
void pdq_logf(pdq_t *q, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The store (pdq_store_redis.c). */
pdq_status_t pdq_store_new(pdq_t *q, const pdq_store_config_t *cfg, pdq_store_t **out, char *err,
                           size_t errlen);
pdq_status_t pdq_store_start(pdq_store_t *s);
void pdq_store_free(pdq_store_t *s);
void pdq_store_get_stats(pdq_store_t *s, pdq_store_stats_t *out);
/* A bucket's lease slice and sync period from its cap (at start, and when a reload moves it). */
void pdq_store_tune_bucket(const pdq_store_t *s, pdq_bucket_t *b);
/* Every bucket of <t> (at start, and for a tenant a reload adds). */
void pdq_store_tune_tenant(const pdq_store_t *s, pdq_tenant_t *t);

/* Shared by the constructor and reloads (pdq_core.c). */
#define PDQ_TENANT_SLOTS (PDQ_MAX_TENANTS + 1u)
pdq_status_t pdq_tenant_init(pdq_t *q, pdq_tenant_t *t, uint32_t idx, const pdq_tenant_config_t *tc,
                             const char *name, uint64_t now);
void pdq_tenant_fini(pdq_t *q, pdq_tenant_t *t);
pdq_status_t pdq_config_check(const pdq_config_t *cfg, char *err, size_t errlen);
void pdq_bset_init(pdq_bset_t *s, const pdq_budget_t *b, double share, uint64_t now);
bool pdq_budget_any(const pdq_budget_t *b);
/* The API key map of <cfg> (initialised here; pdb_map_fini it): tenant i of <cfg> is slot
 * slot_of[i] (NULL: slot i). */
pdq_status_t pdq_index_keys(pdb_map_t *keys, const pdq_config_t *cfg, const size_t *slot_of,
                            char *err, size_t errlen);
/* Hand free slots to waiters after limits grew (queue lock held; pdq_admit.c). */
void pdq_dispatch_locked(pdq_t *q);

#endif /* PDQ_INT_H */
