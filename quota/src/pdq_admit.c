/*
 * pdq_admit.c - admission of one request: rate budgets first (refuse fast with a
 * Retry-After), then a concurrency slot (now, or later through the fair wait queue).
 *
 * Slots: a tenant's first <reserved> in-flight requests use its reserved slots, the rest
 * share max_concurrent minus all reservations (an atomic count, no lock). While anyone is
 * waiting, newcomers queue behind them instead of taking a freed shared slot first.
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdq_int.h"

/* Token counts from clients are bounded before they turn into debt (a max_tokens of 2^63 must
 * not lock a tenant out for centuries); Retry-After is bounded too. */
#define PDQ_MAX_TOKENS   1e12
#define PDQ_MAX_RETRY_NS (86400ull * PDB_NSEC_PER_SEC)

static void costs_of(double cost[PDQ_B_COUNT], double prompt, double completion)
{
    prompt = prompt < PDQ_MAX_TOKENS ? prompt : PDQ_MAX_TOKENS;
    completion = completion < PDQ_MAX_TOKENS ? completion : PDQ_MAX_TOKENS;
    cost[PDQ_B_RPS] = 1;
    cost[PDQ_B_RPM] = 1;
    cost[PDQ_B_TPM] = prompt + completion;
    cost[PDQ_B_PTPM] = prompt;
    cost[PDQ_B_CTPM] = completion;
}

/* Longest wait over the buckets of <set> for <cost>; the kind of the worst one in *worst. */
static uint64_t set_wait(pdq_bset_t *set, const double cost[PDQ_B_COUNT], uint64_t now, int *worst)
{
    uint64_t wait = 0;
    for (int k = 0; k < PDQ_B_COUNT; k++) {
        pdq_bucket_t *b = &set->b[k];
        if (!pdq_bucket_on(b))
            continue;
        pdq_bucket_refill(b, now);
        uint64_t w = pdq_bucket_wait_ns(b, cost[k], now);
        if (w > 0 && b->leased && cost[k] > b->want)
            b->want = cost[k]; /* ask the store for at least this much next time */
        if (w > wait) {
            wait = w;
            *worst = k;
        }
    }
    return wait;
}

static void set_spend(pdq_bset_t *set, const double cost[PDQ_B_COUNT], double sign, uint64_t now)
{
    for (int k = 0; set && k < PDQ_B_COUNT; k++)
        if (pdq_bucket_on(&set->b[k]) && cost[k] != 0)
            pdq_bucket_spend(&set->b[k], sign * cost[k], now);
}

/* Tenant lock held. */
static int try_slot(pdq_t *q, pdq_tenant_t *t, bool allow_shared)
{
    if (t->max_concurrent && t->inflight >= t->max_concurrent)
        return PDQ_SLOT_TENANT_FULL;
    if (t->res_used < t->reserved) {
        t->res_used++;
        t->inflight++;
        return PDQ_SLOT_RESERVED;
    }
    if (!allow_shared)
        return PDQ_SLOT_GLOBAL_FULL;
    if (q->max_concurrent) {
        unsigned used = atomic_load(&q->shared_used);
        do {
            if (used >= atomic_load_explicit(&q->shared_cap, memory_order_relaxed))
                return PDQ_SLOT_GLOBAL_FULL;
        } while (!atomic_compare_exchange_weak(&q->shared_used, &used, used + 1));
    }
    t->inflight++;
    return PDQ_SLOT_SHARED;
}

static void grant(pdq_t *q, pdq_ticket_t *tk, int slot, const pdq_ticket_t *self, uint64_t now)
{
    tk->slot = (uint8_t)slot;
    __atomic_store_n(&tk->state, PDQ_T_GRANTED, __ATOMIC_RELEASE); /* pdq_release peeks */
    q->tenants[tk->tenant].waiting--;
    atomic_fetch_sub(&q->waiting, 1);
    tk->usage.phase_ns[PDQ_PHASE_QUEUE] += now > tk->t_admit ? now - tk->t_admit : 0;
    if (tk != self && tk->on_ready)
        tk->on_ready(tk, tk->arg);
}

/*
 * Hand free slots to waiters (queue lock held): first the tenant whose slot was just freed,
 * if a reserved slot of its own came back, then in fair order across tenants.
 */
static void dispatch(pdq_t *q, size_t freed_by, const pdq_ticket_t *self)
{
    uint64_t now = pdq_now(q);
    if (freed_by < q->n_tenants) {
        pdq_fairq_unblock(&q->fq, (uint32_t)freed_by);
        if (pdq_fairq_tenant_count(&q->fq, (uint32_t)freed_by) > 0) {
            pdq_tenant_t *t = &q->tenants[freed_by];
            pthread_mutex_lock(&t->lock);
            int slot = try_slot(q, t, false);
            pthread_mutex_unlock(&t->lock);
            if (slot == PDQ_SLOT_RESERVED) {
                pdq_fairq_item_t *it = pdq_fairq_pop_tenant(&q->fq, (uint32_t)freed_by);
                grant(q, PDB_DLIST_ENTRY(it, pdq_ticket_t, item), slot, self, now);
            }
        }
    }
    pdq_fairq_item_t *it;
    while ((it = pdq_fairq_peek(&q->fq)) != NULL) {
        pdq_tenant_t *t = &q->tenants[it->tenant];
        pthread_mutex_lock(&t->lock);
        int slot = try_slot(q, t, true);
        pthread_mutex_unlock(&t->lock);
        if (slot == PDQ_SLOT_TENANT_FULL) {
            pdq_fairq_block(&q->fq, it->tenant);
            continue;
        }
        if (slot == PDQ_SLOT_GLOBAL_FULL)
            break;
        pdq_fairq_pop(&q->fq);
        grant(q, PDB_DLIST_ENTRY(it, pdq_ticket_t, item), slot, self, now);
    }
}

void pdq_dispatch_locked(pdq_t *q)
{
    for (size_t i = 0; i < q->n_tenants; i++)
        pdq_fairq_unblock(&q->fq, (uint32_t)i); /* a tenant still full blocks again */
    dispatch(q, SIZE_MAX, NULL);
}

static pdq_ticket_t *ticket_get(pdq_tenant_t *t)
{
    pdq_ticket_t *tk = t->free_tickets;
    if (tk != NULL) {
        t->free_tickets = tk->next_free;
        t->n_free--;
        memset(tk, 0, sizeof(*tk));
        return tk;
    }
    return pdb_calloc(1, sizeof(*tk));
}

static void ticket_put(pdq_tenant_t *t, pdq_ticket_t *tk)
{
    if (t->n_free >= PDQ_FREE_TICKETS) {
        pdb_free(tk);
        return;
    }
    tk->next_free = t->free_tickets;
    t->free_tickets = tk;
    t->n_free++;
}

static void refuse(pdq_t *q, pdq_tenant_t *t, size_t model, pdq_code_t code, uint64_t wait_ns,
                   uint64_t now, pdq_verdict_t *v)
{
    t->refused[code]++;
    if (v == NULL)
        return;
    v->code = code;
    v->http_status = code == PDQ_CODE_STORE_UNAVAILABLE ? 503 : 429;
    if (wait_ns > PDQ_MAX_RETRY_NS)
        wait_ns = PDQ_MAX_RETRY_NS;
    v->retry_after_ms = (wait_ns + PDB_NSEC_PER_MSEC - 1) / PDB_NSEC_PER_MSEC;
    pdq_headers_build(q, t, (uint32_t)model, now, &v->headers);
    pdq_headers_add_retry(&v->headers, v->retry_after_ms);
}

/* Charge the rate budgets (tenant lock held); PDQ_REFUSED fills the verdict. */
static pdq_status_t charge(pdq_t *q, pdq_tenant_t *t, size_t model, const double cost[],
                           uint64_t now, pdq_verdict_t *v)
{
    pdq_bset_t *mset = t->model_budget[model];
    int worst = PDQ_B_RPS;
    uint64_t wait = set_wait(&t->budget, cost, now, &worst);
    if (mset) {
        int mworst = PDQ_B_RPS;
        uint64_t mwait = set_wait(mset, cost, now, &mworst);
        if (mwait > wait) {
            wait = mwait;
            worst = mworst;
        }
    }
    if (wait > 0) {
        pdq_code_t code = worst <= PDQ_B_RPM ? PDQ_CODE_RATE_LIMITED : PDQ_CODE_TOKENS_EXHAUSTED;
        refuse(q, t, model, code, wait, now, v);
        return PDQ_REFUSED;
    }
    set_spend(&t->budget, cost, 1, now);
    set_spend(mset, cost, 1, now);
    return PDQ_OK;
}

pdq_status_t pdq_admit(pdq_t *q, size_t tenant, const char *model, uint64_t est_prompt_tokens,
                       uint64_t est_completion_tokens, pdq_on_ready_fn on_ready, void *arg,
                       pdq_ticket_t **out, pdq_verdict_t *verdict)
{
    return pdq_admit_deadline(q, tenant, model, est_prompt_tokens, est_completion_tokens, 0,
                              on_ready, arg, out, verdict);
}

pdq_status_t pdq_admit_deadline(pdq_t *q, size_t tenant, const char *model,
                                uint64_t est_prompt_tokens, uint64_t est_completion_tokens,
                                uint64_t deadline, pdq_on_ready_fn on_ready, void *arg,
                                pdq_ticket_t **out, pdq_verdict_t *verdict)
{
    if (out != NULL)
        *out = NULL;
    if (q == NULL || out == NULL || tenant >= q->n_tenants)
        return PDQ_ERR_INVALID;
    if (verdict)
        memset(verdict, 0, sizeof(*verdict));
    pdq_tenant_t *t = &q->tenants[tenant];
    size_t mi = pdq_model_index(q, model);
    uint64_t now = pdq_now(q);
    double cost[PDQ_B_COUNT];
    costs_of(cost, (double)est_prompt_tokens, (double)est_completion_tokens);

    pthread_mutex_lock(&t->lock);
    if (atomic_load_explicit(&q->refuse_all, memory_order_acquire)) {
        refuse(q, t, mi, PDQ_CODE_STORE_UNAVAILABLE, PDB_NSEC_PER_SEC, now, verdict);
        pthread_mutex_unlock(&t->lock);
        return PDQ_REFUSED;
    }
    pdq_tenant_sync_mode(q, t, now);
    if (charge(q, t, mi, cost, now, verdict) != PDQ_OK) {
        pthread_mutex_unlock(&t->lock);
        return PDQ_REFUSED;
    }
    pdq_ticket_t *tk = ticket_get(t);
    if (tk == NULL) {
        set_spend(&t->budget, cost, -1, now);
        set_spend(t->model_budget[mi], cost, -1, now);
        pthread_mutex_unlock(&t->lock);
        return PDQ_ERR_NOMEM;
    }
    tk->q = q;
    tk->tenant = (uint32_t)tenant;
    tk->model = (uint32_t)mi;
    memcpy(tk->cost, cost, sizeof(cost));
    tk->t_admit = now;
    tk->on_ready = on_ready;
    tk->arg = arg;
    if (verdict)
        pdq_headers_build(q, t, (uint32_t)mi, now, &verdict->headers);
    int slot = try_slot(q, t, atomic_load(&q->waiting) == 0);
    pthread_mutex_unlock(&t->lock);
    if (slot == PDQ_SLOT_RESERVED || slot == PDQ_SLOT_SHARED) {
        tk->slot = (uint8_t)slot;
        tk->state = PDQ_T_GRANTED;
        *out = tk;
        return PDQ_OK;
    }

    pthread_mutex_lock(&q->fq_lock);
    if (t->waiting >= t->max_waiting) {
        pthread_mutex_unlock(&q->fq_lock);
        pthread_mutex_lock(&t->lock);
        set_spend(&t->budget, cost, -1, now);
        set_spend(t->model_budget[mi], cost, -1, now);
        ticket_put(t, tk);
        if (verdict)
            memset(verdict, 0, sizeof(*verdict));
        refuse(q, t, mi, PDQ_CODE_QUEUE_FULL, PDB_NSEC_PER_SEC, now, verdict);
        pthread_mutex_unlock(&t->lock);
        return PDQ_REFUSED;
    }
    tk->state = PDQ_T_WAITING;
    t->waiting++;
    atomic_fetch_add(&q->waiting, 1); /* before looking at the slots again: see pdq_release */
    tk->item.deadline = deadline;
    if (deadline != 0)
        q->fq.by_deadline = true; /* from the first waiter with one (none: oldest first anyway) */
    pdq_fairq_push(&q->fq, (uint32_t)tenant, (uint64_t)cost[PDQ_B_TPM], &tk->item);
    /* Judge the tenant anew: one of its slots may have come back since it was blocked. */
    pdq_fairq_unblock(&q->fq, (uint32_t)tenant);
    dispatch(q, (size_t)-1, tk);
    pdq_status_t st = tk->state == PDQ_T_GRANTED ? PDQ_OK : PDQ_WAIT;
    pthread_mutex_unlock(&q->fq_lock);
    *out = tk;
    return st;
}

void pdq_reconcile(pdq_ticket_t *tk, uint64_t prompt_tokens, uint64_t cached_prompt_tokens,
                   uint64_t completion_tokens)
{
    if (tk == NULL || tk->reconciled || tk->state != PDQ_T_GRANTED)
        return;
    pdq_t *q = tk->q;
    pdq_tenant_t *t = &q->tenants[tk->tenant];
    double real[PDQ_B_COUNT], diff[PDQ_B_COUNT] = {0};
    costs_of(real, (double)prompt_tokens, (double)completion_tokens);
    for (int k = PDQ_B_TPM; k < PDQ_B_COUNT; k++)
        diff[k] = real[k] - tk->cost[k];
    uint64_t now = pdq_now(q);
    pthread_mutex_lock(&t->lock);
    pdq_tenant_sync_mode(q, t, now);
    set_spend(&t->budget, diff, 1, now);
    set_spend(t->model_budget[tk->model], diff, 1, now);
    pthread_mutex_unlock(&t->lock);
    memcpy(tk->cost, real, sizeof(real));
    if (cached_prompt_tokens > prompt_tokens)
        cached_prompt_tokens = prompt_tokens;
    tk->usage.prompt_tokens = prompt_tokens - cached_prompt_tokens;
    tk->usage.cached_prompt_tokens = cached_prompt_tokens;
    tk->usage.completion_tokens = completion_tokens;
    tk->reconciled = true;
}

void pdq_ticket_phase(pdq_ticket_t *tk, pdq_phase_t phase, uint64_t ns)
{
    if (tk && (unsigned)phase < PDQ_PHASE_COUNT)
        tk->usage.phase_ns[phase] += ns;
}

void pdq_ticket_kv_bytes(pdq_ticket_t *tk, uint64_t bytes)
{
    if (tk)
        tk->usage.kv_bytes += bytes;
}

size_t pdq_ticket_tenant(const pdq_ticket_t *tk)
{
    return tk->tenant;
}

void pdq_release(pdq_ticket_t *tk)
{
    if (tk == NULL)
        return;
    if (__atomic_load_n(&tk->state, __ATOMIC_ACQUIRE) == PDQ_T_WAITING) {
        (void)pdq_cancel(tk); /* cancels it, or releases it if it got its slot meanwhile */
        return;
    }
    pdq_t *q = tk->q;
    size_t tenant = tk->tenant;
    pdq_tenant_t *t = &q->tenants[tenant];
    uint64_t now = pdq_now(q);
    if (!tk->reconciled) {
        /* No real counts: the estimate is what was charged, record it. */
        tk->usage.prompt_tokens = (uint64_t)tk->cost[PDQ_B_PTPM];
        tk->usage.completion_tokens = (uint64_t)tk->cost[PDQ_B_CTPM];
    }
    tk->usage.requests = 1;
    pthread_mutex_lock(&t->lock);
    t->inflight--;
    if (tk->slot == PDQ_SLOT_RESERVED)
        t->res_used--;
    else if (q->max_concurrent)
        atomic_fetch_sub(&q->shared_used, 1); /* before reading waiting: see pdq_admit */
    pdq_usage_record(q, t, tk->model, &tk->usage, now);
    ticket_put(t, tk);
    pthread_mutex_unlock(&t->lock);
    if (atomic_load(&q->waiting) > 0) {
        pthread_mutex_lock(&q->fq_lock);
        dispatch(q, tenant, NULL);
        pthread_mutex_unlock(&q->fq_lock);
    }
}

bool pdq_cancel(pdq_ticket_t *tk)
{
    if (tk == NULL)
        return false;
    pdq_t *q = tk->q;
    pdq_tenant_t *t = &q->tenants[tk->tenant];
    pthread_mutex_lock(&q->fq_lock);
    if (tk->state != PDQ_T_WAITING) {
        pthread_mutex_unlock(&q->fq_lock);
        pdq_release(tk);
        return false;
    }
    pdq_fairq_remove(&q->fq, &tk->item);
    t->waiting--;
    atomic_fetch_sub(&q->waiting, 1);
    pthread_mutex_unlock(&q->fq_lock);
    uint64_t now = pdq_now(q);
    pthread_mutex_lock(&t->lock);
    pdq_tenant_sync_mode(q, t, now);
    set_spend(&t->budget, tk->cost, -1, now);
    set_spend(t->model_budget[tk->model], tk->cost, -1, now);
    ticket_put(t, tk);
    pthread_mutex_unlock(&t->lock);
    return true;
}

void pdq_ratelimit_headers(pdq_t *q, size_t tenant, const char *model, pdq_headers_t *out)
{
    out->n = 0;
    if (q == NULL || tenant >= q->n_tenants)
        return;
    pdq_tenant_t *t = &q->tenants[tenant];
    uint64_t now = pdq_now(q);
    pthread_mutex_lock(&t->lock);
    pdq_tenant_sync_mode(q, t, now);
    pdq_headers_build(q, t, (uint32_t)pdq_model_index(q, model), now, out);
    pthread_mutex_unlock(&t->lock);
}
