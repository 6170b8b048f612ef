/*
 * The engine thread: admission (--max-batch running requests, KV capacity in blocks, FIFO
 * waiting queue), timing and token emission, in one of two models:
 *
 *   steps (default): continuous batching as vLLM's V1 scheduler does it
 *       (vllm/v1/core/sched/scheduler.py, schedule()): each engine step fills a budget of
 *       --max-num-batched-tokens with one token per running request first, then chunks of
 *       waiting prompts (chunked prefill); KV blocks grow as requests advance, and when a
 *       running request cannot get one the most recently admitted one is preempted (its
 *       blocks freed, its computed tokens lost, back to the front of the waiting queue).
 *       A step lasts base + prefill-ms-per-token x prefill tokens + step-ms-per-seq x
 *       decodes + step-ms-per-ktoken x their KV / 1000, divided by the speed factors;
 *       tokens are emitted and requests finish at step ends (tests/sim/README.md).
 *   per-request (--timing per-request, and --zero-delay): each request its own clock,
 *       TTFT = --ttft-ms + --prefill-ms-per-token per uncached prompt token, then one
 *       token every --tpot-ms, whatever else runs; blocks for prompt + max_tokens up front.
 *
 * One min-heap of event times drives either (per-request: each running request's next
 * token; steps: layer-by-layer KV of the prefills in the running step), so 10,000 open
 * streams cost a heap entry or a list link each, not a thread or a timer each. Connections
 * waiting for tokens are suspended; the engine collects the ones to resume and resumes them
 * after dropping its lock.
 */
#include <stdatomic.h>
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

static void list_prepend(rlist_t *l, sim_req_t *r)
{
    r->wq_prev = NULL;
    r->wq_next = l->head;
    if (l->head)
        l->head->wq_prev = r;
    else
        l->tail = r;
    l->head = r;
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

/* ---- timing ---- */
static uint64_t ms_to_ns(double ms)
{
    return ms > 0 ? (uint64_t)(ms * 1e6) : 0;
}

/* A factor on --speed set while running (POST /sim/speed): an engine that slows down. */
static _Atomic double live_speed = 1.0;

void sim_engine_set_live_speed(double f)
{
    atomic_store(&live_speed, f);
}

/* Speed factors of the two phases (< 1: slower). */
static double prefill_factor(void)
{
    return sim_cfg.speed * atomic_load(&live_speed) * sim_cfg.prefill_speed;
}

static double decode_factor(void)
{
    return sim_cfg.speed * atomic_load(&live_speed) * sim_cfg.decode_speed;
}

static int per_request_timing(void)
{
    return sim_cfg.timing_per_request || sim_cfg.zero_delay;
}

/* The fixed cost of a step with decodes: what a lone decode's step has beyond its own
 * sequence, so that it lasts --tpot-ms. */
static double step_base_ms(void)
{
    return sim_cfg.tpot_ms - sim_cfg.step_ms_per_seq;
}

/* The fixed cost of a step of prefills only (at most --ttft-ms). */
static double prefill_base_ms(void)
{
    double b = step_base_ms();
    return b < sim_cfg.ttft_ms ? b : sim_cfg.ttft_ms;
}

/* Arrival to schedulable: the part of --ttft-ms a lone prompt does not spend in its step,
 * so an idle engine answers a prompt of n uncached tokens (n <= --max-num-batched-tokens)
 * after exactly --ttft-ms + n x --prefill-ms-per-token. An admitted request waits it out
 * running (its slot and first blocks taken, as while vLLM computes its prompt) but costs
 * the other requests' steps nothing. */
static uint64_t admit_delay_ns(void)
{
    return ms_to_ns((sim_cfg.ttft_ms - prefill_base_ms()) / prefill_factor());
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
    req->t_eligible = req->t_arrive + (per_request_timing() ? 0 : admit_delay_ns());
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
    req->t_next = now + ms_to_ns(sim_cfg.tpot_ms / decode_factor());
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
            dur = ms_to_ns((sim_cfg.ttft_ms +
                            sim_cfg.prefill_ms_per_token *
                                ((double)compute + sim_cfg.kv_offloading_load_cost * (double)cpu)) /
                           prefill_factor());
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

/* ---- the step model ---- */
static sim_req_t **step_reqs; /* scheduled in the running step, a reference each */
static size_t step_n, step_cap;
static int step_running;
static uint64_t step_start, step_end;

/* Tokens a request knows (prompt + sampled): it computes until its KV holds them all. */
static size_t known_tokens(const sim_req_t *r)
{
    return r->prompt.n + r->tokens_ready;
}

static int step_add(sim_req_t *r, size_t n)
{
    if (step_n == step_cap) {
        size_t cap = step_cap ? step_cap * 2 : 256;
        sim_req_t **l = realloc(step_reqs, cap * sizeof(*l));
        if (!l)
            return -1; /* not scheduled this step; it stays running and is tried again */
        step_reqs = l;
        step_cap = cap;
    }
    step_reqs[step_n++] = r;
    r->refs++;
    r->sched = n;
    return 0;
}

/* vLLM V1 preemption (vllm/v1/core/sched/scheduler.py, _preempt_request): the request's
 * blocks are freed, its computed tokens are lost (recompute) and it goes back to the front
 * of the waiting queue; the tokens it already streamed stay sent. */
static void preempt_locked(sim_req_t *r)
{
    list_remove(&runq, r);
    heap_remove(r);
    sim_cpu_tier_release_locked(r);
    if (r->blocks) {
        sim_blocks_release(r->blocks, r->n_blocks);
        free(r->blocks);
        r->blocks = NULL;
        r->n_blocks = 0;
    }
    r->computed = 0;
    r->sched = 0;
    r->load_ms = 0;
    r->preemptions++;
    r->state = SIM_RS_WAITING;
    list_prepend(&waitq, r);
    atomic_fetch_add(&sim_ctr.preemptions, 1);
}

/* Running requests first, in admission order: one token per decode, the rest of a chunked
 * prompt. A request whose next block cannot be had preempts the newest running request
 * (running.pop() in vLLM's FCFS policy) until it fits or is itself the one preempted; then
 * scheduling stops. */
static void schedule_running(uint64_t step_now, size_t *budget, int *preempted)
{
    sim_req_t *r = runq.head;
    while (r && *budget > 0) {
        if (r->stalled || r->t_eligible > step_now) {
            r = r->wq_next;
            continue;
        }
        size_t need = known_tokens(r) - r->computed;
        if (need > *budget)
            need = *budget;
        while (sim_blocks_grow(&r->blocks, &r->n_blocks, r->computed + need)) {
            sim_req_t *victim = runq.tail;
            preempt_locked(victim);
            *preempted = 1;
            if (victim == r)
                break;
        }
        if (r->state == SIM_RS_WAITING)
            return;
        if (step_add(r, need))
            return;
        *budget -= need;
        r = r->wq_next;
    }
}

/* The first admission of a request: vLLM's counters, the CPU tier after the GPU hits, and
 * the modelled prefill time of an idle engine (recorded as prefill_model_us). */
static void first_admission(sim_req_t *r, uint64_t now, size_t hits, size_t *computed)
{
    size_t cpu = 0, compute;
    r->t_admit = now;
    r->cached_tokens = hits;
    atomic_fetch_add(&sim_ctr.prompt_tokens, r->prompt.n);
    atomic_fetch_add(&sim_ctr.prefix_queries, r->prompt.n);
    atomic_fetch_add(&sim_ctr.prefix_hits, hits);
    if (sim_kv_remote_filled(r)) {
        compute = 0; /* the prompt's KV came from the prefill instance */
        *computed = known_tokens(r) - 1;
    } else {
        cpu = sim_cpu_tier_load_locked(r);
        r->cached_tokens += cpu;
        compute = r->prompt.n - r->cached_tokens;
        *computed = r->cached_tokens;
    }
    /* a CPU hit is loaded, not computed: cheaper, not free (paid in the first step) */
    r->load_ms = sim_cfg.prefill_ms_per_token * sim_cfg.kv_offloading_load_cost * (double)cpu;
    r->prefill_ns =
        ms_to_ns((sim_cfg.ttft_ms + sim_cfg.prefill_ms_per_token * (double)compute + r->load_ms) /
                 prefill_factor());
    r->layer_i = 0;
}

/* Then waiting requests, FIFO, while the budget, --max-batch and the KV blocks allow: the
 * prefix-cache hits are taken and blocks for the first chunk allocated (vLLM allocates the
 * slots of the tokens it schedules). */
static void admit_waiting(uint64_t now, size_t *budget)
{
    while (waitq.head && *budget > 0 && n_running < sim_cfg.max_batch) {
        sim_req_t *r = waitq.head;
        size_t total = known_tokens(r), computed, chunk, cached, cover;
        int first = r->preemptions == 0, remote = first && sim_kv_remote_filled(r);
        int cpu = first && !remote && sim_cpu_tier_enabled();
        computed = sim_blocks_count_hits(&r->prompt, total);
        chunk = total - computed < *budget ? total - computed : *budget;
        cover = computed + chunk;
        if (remote) {
            cover = total; /* blocks for the whole received prompt */
        } else if (cpu) {
            /* the tier's hits need blocks too and are known only once it is asked (which
             * counts): ask only when the whole request would fit */
            if (sim_blocks_total() - sim_blocks_used() < sim_blocks_needed(total))
                return;
            cover = computed;
        }
        if (sim_blocks_alloc_cover(&r->prompt, total, cover, &r->blocks, &r->n_blocks, &cached))
            return; /* head of line waits for capacity */
        list_remove(&waitq, r);
        list_append(&runq, r);
        r->state = SIM_RS_PREFILL;
        if (first) {
            first_admission(r, now, cached, &computed);
            chunk = total - computed < *budget ? total - computed : *budget;
            if (sim_blocks_grow(&r->blocks, &r->n_blocks, computed + chunk)) {
                fail_locked(r, 500, "InternalServerError", "KV blocks vanished at admission");
                continue;
            }
        }
        r->computed = computed;
        if (r->t_eligible > now) {
            r->heap_ev = 1; /* runs once eligible */
            r->t_next = r->t_eligible;
            heap_push(r);
            continue;
        }
        if (step_add(r, chunk))
            return;
        *budget -= chunk;
    }
}

/* How long the scheduled step lasts (ms). A decode is a request computing the one token it
 * sampled last; everything else is prefill work (prompt chunks, recomputation). */
static double step_cost_ms(void)
{
    size_t ptok = 0, ndec = 0;
    double kv = 0, load = 0;
    for (size_t i = 0; i < step_n; i++) {
        sim_req_t *r = step_reqs[i];
        if (r->tokens_ready > 0 && r->sched == 1 && r->computed + 1 == known_tokens(r)) {
            ndec++;
            kv += (double)r->computed;
        } else {
            ptok += r->sched;
        }
        load += r->load_ms;
        r->load_ms = 0;
    }
    double base = ndec ? step_base_ms() / decode_factor() : prefill_base_ms() / prefill_factor();
    return base + (sim_cfg.prefill_ms_per_token * (double)ptok + load) / prefill_factor() +
           (sim_cfg.step_ms_per_seq * (double)ndec + sim_cfg.step_ms_per_ktoken * kv / 1000.0) /
               decode_factor();
}

static uint64_t layer_time(int layer)
{
    return step_start + (step_end - step_start) * (uint64_t)(layer + 1) / (uint64_t)sim_cfg.layers;
}

/* Layer-wise KV: the layers of a prompt's last chunk finish one after another across its
 * step, so each layer's KV may leave before the step ends. */
static void arm_layer_events(void)
{
    for (size_t i = 0; i < step_n; i++) {
        sim_req_t *r = step_reqs[i];
        if (r->tokens_ready || r->computed + r->sched < known_tokens(r) || !sim_kv_layered(r) ||
            r->layer_i >= sim_cfg.layers - 1)
            continue;
        r->heap_ev = 0;
        r->t_next = layer_time(r->layer_i);
        heap_push(r);
    }
}

static void on_layer_event(sim_req_t *r)
{
    if (r->state != SIM_RS_PREFILL || r->heap_ev == 1)
        return; /* t_eligible: the next step schedules it */
    sim_kv_on_layer_done_locked(r, r->layer_i);
    r->layer_i++;
    if (r->state == SIM_RS_PREFILL && r->layer_i < sim_cfg.layers - 1) {
        r->t_next = layer_time(r->layer_i);
        heap_push(r);
    }
}

static void start_step(uint64_t now)
{
    size_t budget = (size_t)sim_cfg.max_num_batched_tokens;
    int preempted = 0;
    schedule_running(now, &budget, &preempted);
    if (!preempted) /* vLLM admits nobody in a step that preempted */
        admit_waiting(now, &budget);
    if (!step_n)
        return;
    step_start = now;
    step_end = now + ms_to_ns(step_cost_ms());
    step_running = 1;
    arm_layer_events();
}

/* A request's KV now holds every token it knows: its prompt (re)computed or a decode
 * step done; a new token is sampled. */
static void on_computed(sim_req_t *r, uint64_t now)
{
    if (r->state == SIM_RS_PREFILL && r->tokens_ready == 0) {
        heap_remove(r);
        while (sim_kv_layered(r) && r->layer_i < sim_cfg.layers && r->state == SIM_RS_PREFILL) {
            sim_kv_on_layer_done_locked(r, r->layer_i);
            r->layer_i++;
        }
        if (r->state != SIM_RS_PREFILL)
            return; /* the KV hook failed the request */
        sim_blocks_commit(&r->prompt, r->blocks, r->n_blocks);
        sim_cpu_tier_store_locked(&r->prompt);
        sim_cpu_tier_release_locked(r); /* its CPU-tier load is done */
        r->state = SIM_RS_DECODE;
        sim_kv_on_prefill_done_locked(r);
        if (r->state != SIM_RS_DECODE)
            return; /* the KV hook failed the request */
    } else if (r->state == SIM_RS_PREFILL) {
        sim_blocks_commit(&r->prompt, r->blocks, r->n_blocks); /* recomputed after preemption */
        r->state = SIM_RS_DECODE;
    }
    token_ready(r, now);
    if (r->tokens_ready >= r->out.n) {
        finish_locked(r);
        return;
    }
    if (sim_cfg.stall_after_tokens >= 0 && r->stream &&
        r->tokens_ready >= (size_t)sim_cfg.stall_after_tokens) {
        r->stalled = 1; /* keeps its slot and blocks; the stream never ends */
        atomic_fetch_add(&sim_ctr.faults_injected, 1);
    }
}

static void finish_step(uint64_t now)
{
    size_t n = step_n;
    step_running = 0;
    step_n = 0;
    for (size_t i = 0; i < n; i++) {
        sim_req_t *r = step_reqs[i];
        if ((r->state == SIM_RS_PREFILL || r->state == SIM_RS_DECODE) && r->sched) {
            r->computed += r->sched;
            r->sched = 0;
            if (r->computed >= known_tokens(r))
                on_computed(r, now);
        }
        r->sched = 0;
        sim_req_unref_locked(r);
    }
}

static void release_step_locked(void)
{
    for (size_t i = 0; i < step_n; i++) {
        step_reqs[i]->sched = 0;
        sim_req_unref_locked(step_reqs[i]);
    }
    step_n = 0;
    step_running = 0;
}

/* The next time the step engine has something to do, UINT64_MAX: only a signal. */
static uint64_t steps_next_event(uint64_t now)
{
    uint64_t t = UINT64_MAX;
    if (step_running)
        t = step_end;
    if (heap_n && heap[0]->t_next < t)
        t = heap[0]->t_next;
    (void)now;
    return t;
}

static void steps_run_locked(uint64_t now)
{
    while (heap_n && heap[0]->t_next <= now) {
        sim_req_t *r = heap[0];
        heap_remove(r);
        on_layer_event(r);
    }
    if (step_running && step_end <= now)
        finish_step(now);
    if (!step_running)
        start_step(now);
}

static void *engine_main(void *arg)
{
    pthread_mutex_lock(&lock);
    while (!stopping) {
        uint64_t now = sim_now_ns();
        if (!per_request_timing()) {
            steps_run_locked(now);
            if (resume_n) {
                flush_resumes_and_unlock();
                pthread_mutex_lock(&lock);
                continue;
            }
            uint64_t t = steps_next_event(now);
            if (t <= sim_now_ns())
                continue;
            if (t == UINT64_MAX) {
                pthread_cond_wait(&cond, &lock);
            } else {
                struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
                                      .tv_nsec = (long)(t % 1000000000ull)};
                pthread_cond_timedwait(&cond, &lock, &ts);
            }
            continue;
        }
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
    release_step_locked();
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
    free(step_reqs);
    step_reqs = NULL;
    step_n = step_cap = 0;
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
