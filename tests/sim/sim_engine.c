/*
 * The engine thread: admission (--max-batch running requests, KV capacity
 * in blocks, FIFO waiting queue), the timing model (TTFT = --ttft-ms +
 * --prefill-ms-per-token per uncached prompt token, then one token every
 * --tpot-ms) and token emission. One min-heap keyed by each running
 * request's next event time drives everything, so 10,000 open streams cost
 * a heap entry each, not a thread or a timer each. Connections waiting for
 * tokens are suspended; the engine collects the ones to resume and resumes
 * them after dropping its lock.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_int.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond;
static pthread_t thread;
static int started, stopping;

static sim_req_t **heap;
static size_t heap_n, heap_cap;

static int n_kv_wait; /* decode requests waiting for remote KV (vLLM counts them waiting) */
static struct MHD_Connection **resume_list;
static size_t resume_n, resume_cap;

void sim_engine_lock(void)
{
    pthread_mutex_lock(&lock);
}

static void flush_resumes_and_unlock(void)
{
    if (!resume_n) {
        pthread_mutex_unlock(&lock);
        return;
    }
    size_t n = resume_n;
    struct MHD_Connection **list = malloc(n * sizeof(*list));
    if (list) {
        memcpy(list, resume_list, n * sizeof(*list));
        resume_n = 0;
    }
    pthread_mutex_unlock(&lock);
    if (!list) {
        /* out of memory: resume under the lock rather than lose a stream */
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < resume_n; i++)
            sim_http_resume(resume_list[i]);
        resume_n = 0;
        pthread_mutex_unlock(&lock);
        return;
    }
    for (size_t i = 0; i < n; i++)
        sim_http_resume(list[i]);
    free(list);
}

void sim_engine_unlock(void)
{
    flush_resumes_and_unlock();
}

void sim_engine_wake_conn_locked(sim_req_t *req)
{
    if (!req->suspended || !req->conn)
        return;
    sim_watch_remove_locked(req); /* while the fd is still this connection's */
    if (resume_n == resume_cap) {
        size_t cap = resume_cap ? resume_cap * 2 : 256;
        struct MHD_Connection **l = realloc(resume_list, cap * sizeof(*l));
        if (!l) {
            sim_http_resume(req->conn);
            req->suspended = 0;
            return;
        }
        resume_list = l;
        resume_cap = cap;
    }
    resume_list[resume_n++] = req->conn;
    req->suspended = 0;
}

/* ---- heap ---- */
static void heap_swap(size_t a, size_t b)
{
    sim_req_t *t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
    heap[a]->heap_idx = a;
    heap[b]->heap_idx = b;
}

static void heap_up(size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (heap[p]->t_next <= heap[i]->t_next)
            break;
        heap_swap(p, i);
        i = p;
    }
}

static void heap_down(size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_n && heap[l]->t_next < heap[m]->t_next)
            m = l;
        if (r < heap_n && heap[r]->t_next < heap[m]->t_next)
            m = r;
        if (m == i)
            return;
        heap_swap(i, m);
        i = m;
    }
}

static int heap_push(sim_req_t *r)
{
    if (heap_n == heap_cap) {
        size_t cap = heap_cap ? heap_cap * 2 : 1024;
        sim_req_t **h = realloc(heap, cap * sizeof(*h));
        if (!h)
            return -1;
        heap = h;
        heap_cap = cap;
    }
    r->heap_idx = heap_n;
    heap[heap_n++] = r;
    heap_up(r->heap_idx);
    return 0;
}

static void heap_remove(sim_req_t *r)
{
    size_t i = r->heap_idx;
    if (i >= heap_n || heap[i] != r)
        return;
    heap_n--;
    if (i != heap_n) {
        heap[i] = heap[heap_n];
        heap[i]->heap_idx = i;
        heap_down(i);
        heap_up(i);
    }
    r->heap_idx = (size_t)-1;
}

/* ---- waiting queue and running list (share the wq links) ---- */
typedef struct rlist {
    sim_req_t *head, *tail;
    int n;
} rlist_t;

static rlist_t waitq, runq;
#define wq_head   (waitq.head)
#define n_waiting (waitq.n)
#define n_running (runq.n)

static void list_append(rlist_t *l, sim_req_t *r)
{
    r->wq_next = NULL;
    r->wq_prev = l->tail;
    if (l->tail)
        l->tail->wq_next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static void list_remove(rlist_t *l, sim_req_t *r)
{
    if (r->wq_prev)
        r->wq_prev->wq_next = r->wq_next;
    else
        l->head = r->wq_next;
    if (r->wq_next)
        r->wq_next->wq_prev = r->wq_prev;
    else
        l->tail = r->wq_prev;
    r->wq_prev = r->wq_next = NULL;
    l->n--;
}

/* ---- request lifetime ---- */
void sim_req_free(sim_req_t *req)
{
    if (!req)
        return;
    free(req->request_id);
    free(req->resp_id);
    sim_tokens_free(&req->prompt);
    for (size_t i = 0; i < req->sp.n_stop; i++)
        free(req->sp.stop[i]);
    free(req->sp.stop);
    sim_output_free(&req->out);
    free(req->blocks);
    free(req->error_msg);
    free(req->pend);
    if (req->kv)
        sim_kv_req_free(req->kv);
    if (req->resp_kv_params)
        json_decref(req->resp_kv_params);
    free(req);
}

void sim_req_unref_locked(sim_req_t *req)
{
    if (--req->refs == 0)
        sim_req_free(req);
}

static void leave_engine(sim_req_t *req, sim_req_state_t final)
{
    if (req->state == SIM_RS_KV_WAIT)
        n_kv_wait--;
    if (req->state == SIM_RS_WAITING)
        list_remove(&waitq, req);
    else if (req->state == SIM_RS_PREFILL || req->state == SIM_RS_DECODE)
        list_remove(&runq, req);
    heap_remove(req);
    req->state = final;
    req->t_done = sim_now_ns();
    sim_kv_on_finish_locked(req);     /* may keep the blocks (prefill hold) */
    sim_cpu_tier_release_locked(req); /* a load cut short by a cancel */
    if (req->blocks) {
        sim_blocks_release(req->blocks, req->n_blocks);
        free(req->blocks);
        req->blocks = NULL;
        req->n_blocks = 0;
    }
    req->response_ready = 1;
    sim_engine_wake_conn_locked(req);
    pthread_cond_signal(&cond); /* capacity freed: admit waiting requests */
    sim_req_unref_locked(req);  /* the engine's reference */
}

static void fail_locked(sim_req_t *req, int status, const char *type, const char *msg)
{
    if (!req->error_msg) {
        req->http_status = status;
        req->error_type = type;
        req->error_msg = strdup(msg);
    }
    atomic_fetch_add(&sim_ctr.req_errors, 1);
    leave_engine(req, SIM_RS_FAILED);
}

void sim_engine_submit(sim_req_t *req)
{
    pthread_mutex_lock(&lock);
    req->refs++;
    req->t_arrive = sim_now_ns();
    req->heap_idx = (size_t)-1;
    if (sim_kv_needs_remote(req)) {
        req->state = SIM_RS_KV_WAIT;
        n_kv_wait++;
        pthread_mutex_unlock(&lock);
        sim_kv_begin_remote(req);
        return;
    }
    req->state = SIM_RS_WAITING;
    list_append(&waitq, req);
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
}

void sim_engine_kv_ready_locked(sim_req_t *req, int kv_ok, int status, const char *msg)
{
    if (req->state != SIM_RS_KV_WAIT)
        return;
    if (!kv_ok) {
        fail_locked(req, status, status >= 500 ? "InternalServerError" : "BadRequestError", msg);
        return;
    }
    n_kv_wait--;
    req->state = SIM_RS_WAITING;
    list_append(&waitq, req);
    pthread_cond_signal(&cond);
}

void sim_engine_cancel_locked(sim_req_t *req)
{
    switch (req->state) {
    case SIM_RS_KV_WAIT:
    case SIM_RS_WAITING:
    case SIM_RS_PREFILL:
    case SIM_RS_DECODE:
        atomic_fetch_add(&sim_ctr.req_finished_abort, 1);
        leave_engine(req, SIM_RS_CANCELLED);
        break;
    default:
        break;
    }
}

static uint64_t ms_to_ns(double ms)
{
    return (uint64_t)(ms * 1e6);
}

static void finish_locked(sim_req_t *req)
{
    if (!strcmp(req->out.finish_reason, "stop"))
        atomic_fetch_add(&sim_ctr.req_finished_stop, 1);
    else
        atomic_fetch_add(&sim_ctr.req_finished_length, 1);
    leave_engine(req, SIM_RS_DONE);
}

/* One token became ready (the first one ends the prefill). */
static void token_ready(sim_req_t *req, uint64_t now)
{
    req->tokens_ready++;
    atomic_fetch_add(&sim_ctr.generation_tokens, 1);
    if (req->tokens_ready == 1) {
        req->t_first = now;
        atomic_fetch_add(&sim_ctr.ttft_us_sum, (now - req->t_arrive) / 1000);
        atomic_fetch_add(&sim_ctr.ttft_count, 1);
        if (req->stream)
            req->response_ready = 1;
    }
    if (req->stream)
        sim_engine_wake_conn_locked(req);
}

static void step_locked(sim_req_t *req, uint64_t now)
{
    if (req->state == SIM_RS_PREFILL && sim_kv_layered(req)) {
        /* layer by layer: each layer's KV may leave as soon as it exists */
        int L = sim_cfg.layers;
        do {
            sim_kv_on_layer_done_locked(req, req->layer_i);
            req->layer_i++;
        } while (sim_cfg.zero_delay && req->layer_i < L);
        if (req->state != SIM_RS_PREFILL)
            return; /* the KV hook failed the request */
        if (req->layer_i < L) {
            req->t_next =
                req->t_admit + req->prefill_ns * (uint64_t)(req->layer_i + 1) / (uint64_t)L;
            heap_push(req);
            return;
        }
    }
    if (req->state == SIM_RS_PREFILL) {
        sim_blocks_commit(&req->prompt, req->blocks, req->n_blocks);
        sim_cpu_tier_store_locked(&req->prompt);
        sim_cpu_tier_release_locked(req); /* its CPU-tier load is done */
        req->state = SIM_RS_DECODE;
        sim_kv_on_prefill_done_locked(req);
        if (req->state != SIM_RS_DECODE)
            return; /* the KV hook failed the request */
    }
    if (sim_cfg.zero_delay) {
        while (req->tokens_ready < req->out.n)
            token_ready(req, now);
    } else {
        token_ready(req, now);
    }
    if (req->tokens_ready >= req->out.n) {
        finish_locked(req);
        return;
    }
    if (sim_cfg.stall_after_tokens >= 0 && req->stream &&
        req->tokens_ready >= (size_t)sim_cfg.stall_after_tokens) {
        req->stalled = 1; /* keeps its slot and blocks; the stream never ends */
        atomic_fetch_add(&sim_ctr.faults_injected, 1);
        return;
    }
    req->t_next = now + ms_to_ns(sim_cfg.tpot_ms);
    heap_push(req);
}

static void admit_locked(uint64_t now)
{
    while (wq_head && n_running < sim_cfg.max_batch) {
        sim_req_t *req = wq_head;
        size_t total = req->prompt.n + (size_t)req->sp.max_tokens;
        if (sim_blocks_alloc(&req->prompt, total, &req->blocks, &req->n_blocks,
                             &req->cached_tokens))
            break; /* head of line waits for capacity */
        list_remove(&waitq, req);
        list_append(&runq, req);
        req->state = SIM_RS_PREFILL;
        req->t_admit = now;
        atomic_fetch_add(&sim_ctr.prompt_tokens, req->prompt.n);
        atomic_fetch_add(&sim_ctr.prefix_queries, req->prompt.n);
        atomic_fetch_add(&sim_ctr.prefix_hits, req->cached_tokens);
        /* then the CPU tier, for what the GPU did not hold (vLLM asks its
         * connector after the local prefix cache) */
        size_t cpu = sim_kv_remote_filled(req) ? 0 : sim_cpu_tier_load_locked(req);
        req->cached_tokens += cpu;
        uint64_t dur = 0;
        if (!sim_cfg.zero_delay) {
            size_t compute = req->prompt.n - req->cached_tokens;
            if (sim_kv_remote_filled(req))
                compute = 0; /* the prompt's KV came from the prefill instance */
            /* a CPU hit is loaded, not computed: cheaper, not free */
            dur = ms_to_ns(sim_cfg.ttft_ms +
                           sim_cfg.prefill_ms_per_token *
                               ((double)compute + sim_cfg.kv_offloading_load_cost * (double)cpu));
        }
        req->prefill_ns = dur;
        req->layer_i = 0;
        req->t_next = now + (sim_kv_layered(req) ? dur / (uint64_t)sim_cfg.layers : dur);
        if (heap_push(req)) {
            fail_locked(req, 500, "InternalServerError", "out of memory");
            continue;
        }
    }
}

static void *engine_main(void *arg)
{
    pthread_mutex_lock(&lock);
    while (!stopping) {
        uint64_t now = sim_now_ns();
        admit_locked(now);
        while (heap_n && heap[0]->t_next <= now) {
            sim_req_t *req = heap[0];
            heap_remove(req);
            step_locked(req, now);
            if (!heap_n || heap[0]->t_next > now)
                admit_locked(now); /* slots freed by finished requests */
        }
        if (resume_n) {
            flush_resumes_and_unlock();
            pthread_mutex_lock(&lock);
            continue;
        }
        if (heap_n) {
            uint64_t t = heap[0]->t_next;
            struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
                                  .tv_nsec = (long)(t % 1000000000ull)};
            pthread_cond_timedwait(&cond, &lock, &ts);
        } else {
            pthread_cond_wait(&cond, &lock);
        }
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

void sim_engine_signal_locked(void)
{
    pthread_cond_signal(&cond);
}

int sim_engine_start(void)
{
    pthread_condattr_t ca;
    int total = sim_cfg.kv_capacity_tokens / sim_cfg.block_size;
    if (sim_blocks_init(total))
        return -1;
    if (sim_cpu_tier_init()) {
        sim_blocks_fini();
        return -1;
    }
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&thread, NULL, engine_main, NULL)) {
        sim_cpu_tier_fini();
        sim_blocks_fini();
        return -1;
    }
    started = 1;
    return 0;
}

/* Stop the thread and fail everything still inside so each connection gets
 * its answer (or end of stream) before the HTTP daemon stops. */
void sim_engine_stop(void)
{
    if (!started)
        return;
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    pthread_mutex_lock(&lock);
    while (wq_head)
        fail_locked(wq_head, 503, "ServiceUnavailableError", "engine shutting down");
    while (runq.head)
        fail_locked(runq.head, 503, "ServiceUnavailableError", "engine shutting down");
    flush_resumes_and_unlock();
    started = 0;
}

void sim_engine_release_all(void);
void sim_engine_release_all(void)
{
    free(heap);
    heap = NULL;
    heap_n = heap_cap = 0;
    free(resume_list);
    resume_list = NULL;
    resume_n = resume_cap = 0;
    sim_cpu_tier_fini();
    sim_blocks_fini();
}

void sim_engine_stats(sim_engine_stats_t *st)
{
    pthread_mutex_lock(&lock);
    st->running = n_running;
    st->waiting = n_waiting + n_kv_wait;
    st->blocks_total = sim_blocks_total();
    st->blocks_used = sim_blocks_used();
    st->kv_usage = st->blocks_total ? (double)st->blocks_used / st->blocks_total : 0;
    pthread_mutex_unlock(&lock);
}
