/*
 * kvt_engine.c - engine life cycle and the progress thread.
 *
 * create: config -> transport -> pools (regions registered with the
 * transport once, through a pool hook) -> ZeroMQ sockets -> safety-net
 * tables -> progress thread. The progress thread waits on the sockets and the
 * wake eventfd (commands from users, completions from transport threads)
 * until the earliest armed timer (reply and handshake timeouts, TTL sweeps,
 * parked allocations, waits, reservation expiry) and runs the timers due;
 * with nothing armed it sleeps until woken. No periodic tick.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "kvt/kvt_uuid.h"
#include "kvt_tsan.h"
#include "kvt_engine_int.h"

static atomic_uint g_engine_seq;
/* The engine whose progress thread this is (NULL on every other thread). */
static _Thread_local kvt_engine_t *tl_progress_engine;

uint64_t kvt_engine_now(const kvt_engine_t *e)
{
    return kvt_clock_now(&e->clock);
}

void kvt_engine_wake(kvt_engine_t *e)
{
    uint64_t one = 1;
    if (write(e->wake_fd, &one, sizeof(one)) < 0) {
        /* counter saturated: the progress thread wakes anyway */
    }
}

void kvt_engine_clock_moved(kvt_engine_t *e)
{
    if (e != NULL)
        kvt_engine_wake(e);
}

/* Engine timers (pending, parked, waiter, sweep, expire) and two per sender peer. */
#define KVT_ENGINE_TIMERS 5u

kvt_status_t kvt_engine_timer_room(kvt_engine_t *e, uint32_t extra_speers)
{
    size_t need = KVT_ENGINE_TIMERS + 2u * ((size_t)e->nspeers + extra_speers);
    return pdb_timers_reserve(&e->timers, need) == PDB_OK ? KVT_OK : KVT_ERR_NOMEM;
}

void kvt_engine_arm(kvt_engine_t *e, pdb_timer_t *t, uint64_t due_ns)
{
    /* room was reserved for every timer: this cannot fail; say so loudly if it ever does */
    if (pdb_timer_arm(&e->timers, t, due_ns) != PDB_OK)
        fprintf(stderr, "kvt %s: timer heap full: a deadline is lost\n", e->id);
}

void kvt_engine_due_lower(kvt_engine_t *e, _Atomic uint64_t *due, uint64_t t)
{
    uint64_t cur = atomic_load(due);

    while (t < cur) {
        if (atomic_compare_exchange_weak(due, &cur, t)) {
            /* the progress thread re-reads the due times at the end of its turn */
            if (tl_progress_engine != e)
                kvt_engine_wake(e);
            return;
        }
    }
}

void kvt_engine_count(kvt_engine_t *e, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&e->mlock);
    *field += n;
    pthread_mutex_unlock(&e->mlock);
}

void kvt_engine_observe(kvt_engine_t *e, uint64_t start_ns)
{
    uint64_t now = kvt_clock_monotonic_ns();
    pthread_mutex_lock(&e->mlock);
    kvt_metrics_observe(&e->m, now > start_ns ? (double)(now - start_ns) / 1e9 : 0.0);
    pthread_mutex_unlock(&e->mlock);
}

void kvt_engine_bad_msg(kvt_engine_t *e, const char *where, kvt_status_t st,
                        const kvt_msg_err_t *err)
{
    uint64_t n;

    pthread_mutex_lock(&e->mlock);
    n = ++e->m.bad_messages_total;
    pthread_mutex_unlock(&e->mlock);
    /* the first few, then one in a thousand: a flood cannot fill the log */
    if (n <= 10 || n % 1000 == 0)
        fprintf(stderr, "kvt %s: bad message on %s (#%llu): %s%s%s%s%s\n", e->id, where,
                (unsigned long long)n, kvt_status_name(st),
                err != NULL && err->field != NULL ? " field " : "",
                err != NULL && err->field != NULL ? err->field : "",
                err != NULL && err->reason != NULL ? ": " : "",
                err != NULL && err->reason != NULL ? err->reason : "");
}

void kvt_engine_refuse(kvt_engine_t *e, const char *fmt, ...)
{
    uint64_t n;
    char why[512];
    va_list ap;

    pthread_mutex_lock(&e->mlock);
    n = ++e->m.refusals_total;
    pthread_mutex_unlock(&e->mlock);
    if (n > 10 && n % 1000 != 0)
        return; /* the first few, then one in a thousand */
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvt %s: refused (#%llu): %s\n", e->id, (unsigned long long)n, why);
}

uint64_t kvt_cookie(kvt_cookie_kind_t kind, void *ptr)
{
    return (uint64_t)(uintptr_t)ptr | (uint64_t)kind;
}

/* ---- regions --------------------------------------------------------- */

static kvt_status_t hook_register(void *arg, const kvt_region_info_t *r, void **handle_out)
{
    kvt_engine_t *e = arg;
    char uuid[KVT_UUID_STR_LEN + 1];
    kvt_tl_region_params_t p = {.uuid = kvt_uuid_to_str(&r->uuid, uuid),
                                .base = r->base,
                                .length = r->length,
                                .page_size = r->page_size};
    kvt_tl_region_t *reg;
    kvt_status_t st;

    if (e->nregions == sizeof(e->regions) / sizeof(e->regions[0]))
        return KVT_ERR_LIMIT;
    st = e->tdesc->ops->reg_region(e->tl, &p, &reg);
    if (st != KVT_OK)
        return st;
    e->regions[e->nregions++] = reg;
    *handle_out = reg;
    return KVT_OK;
}

static void hook_deregister(void *arg, const kvt_region_info_t *r, void *handle)
{
    kvt_engine_t *e = arg;
    (void)r;
    for (uint32_t i = 0; i < e->nregions; i++) {
        if (e->regions[i] == handle) {
            e->regions[i] = e->regions[--e->nregions];
            break;
        }
    }
    if (e->tl != NULL)
        e->tdesc->ops->dereg_region(e->tl, handle);
}

kvt_status_t kvt_engine_region_of(kvt_engine_t *e, kvt_pool_t *pool, kvt_page_t page,
                                  kvt_tl_region_t **region_out, uint64_t *off_out,
                                  char uuid_out[KVT_UUID_STR_LEN + 1])
{
    kvt_buf_ref_t ref;
    kvt_region_info_t info;
    uint32_t nr = kvt_pool_nregions(pool);
    kvt_status_t st = kvt_pool_page_to_ref(pool, page, &ref);

    if (st != KVT_OK)
        return st;
    for (uint32_t i = 0; i < nr; i++) {
        if (kvt_pool_region(pool, i, &info) != KVT_OK || !kvt_uuid_equal(&info.uuid, &ref.region))
            continue;
        *region_out = kvt_pool_region_handle(pool, i, 0);
        *off_out = (uint64_t)ref.page * info.page_size;
        if (uuid_out != NULL)
            kvt_uuid_to_str(&ref.region, uuid_out);
        return *region_out != NULL ? KVT_OK : KVT_ERR_NOT_FOUND;
    }
    return KVT_ERR_NOT_FOUND;
}

/* Config seconds to a transport's millisecond field: 0 stays "default", "inf" saturates. */
static unsigned sec_to_ms(double s)
{
    if (!(s > 0.0))
        return 0;
    if (s >= (double)UINT_MAX / 1000.0)
        return UINT_MAX;
    return s * 1000.0 < 1.0 ? 1u : (unsigned)(s * 1000.0);
}

kvt_status_t kvt_engine_grant(kvt_engine_t *e, const char *peer, kvt_pool_t *pool,
                              const kvt_page_t *pages, uint32_t n, unsigned access, int revoke)
{
    const kvt_tl_ops_t *ops = e->tdesc->ops;
    kvt_status_t first = KVT_OK;

    if (e->tl == NULL || ops->grant == NULL || peer == NULL || peer[0] == '\0')
        return KVT_OK;
    for (uint32_t i = 0; i < n; i++) {
        kvt_tl_region_t *reg;
        uint64_t off;
        uint32_t rp;
        kvt_status_t st;

        if (pages[i] == KVT_PAGE_NONE)
            continue;
        st = kvt_engine_region_of(e, pool, pages[i], &reg, &off, NULL);
        if (st == KVT_OK) {
            rp = (uint32_t)(off / kvt_pool_page_size(pool));
            if (revoke)
                ops->revoke(e->tl, peer, reg, &rp, 1, access);
            else
                st = ops->grant(e->tl, peer, reg, &rp, 1, access);
        }
        if (st != KVT_OK && first == KVT_OK)
            first = st;
    }
    return first;
}

/* ---- transport callbacks (any thread) -------------------------------- */

static void push_compl(kvt_engine_t *e, kvt_compl_t *c)
{
    pthread_mutex_lock(&e->lock);
    c->next = NULL;
    if (e->compl_tail != NULL)
        e->compl_tail->next = c;
    else
        e->compl_head = c;
    e->compl_tail = c;
    pthread_mutex_unlock(&e->lock);
    kvt_engine_wake(e);
}

static void on_tl_complete(void *arg, uint64_t cookie, kvt_status_t status)
{
    kvt_engine_t *e = arg;
    kvt_compl_t *c = kvt_calloc(1, sizeof(*c));

    if (c == NULL) {
        /* no node: the bounded spill area keeps it (retrying could spin forever) */
        int dropped;
        pthread_mutex_lock(&e->lock);
        dropped = e->n_compl_spill == KVT_COMPL_SPILL;
        if (!dropped) {
            e->compl_spill[e->n_compl_spill].cookie = cookie;
            e->compl_spill[e->n_compl_spill++].status = status;
        } else {
            e->compl_dropped++;
        }
        pthread_mutex_unlock(&e->lock);
        if (dropped)
            fprintf(stderr,
                    "kvt %s: out of memory: a transfer completion was dropped; the "
                    "transfer ends by its timeout\n",
                    e->id);
        kvt_engine_wake(e);
        return;
    }
    c->cookie = cookie;
    c->status = status;
    push_compl(e, c);
}

static void on_tl_peer_failed(void *arg, const char *peer_id, kvt_status_t status)
{
    kvt_engine_t *e = arg;
    kvt_compl_t *c = kvt_calloc(1, sizeof(*c));

    (void)status;
    if (c == NULL)
        return;
    c->peer_failed = kvt_strdup(peer_id);
    if (c->peer_failed == NULL) {
        kvt_free(c);
        return;
    }
    push_compl(e, c);
}

/* ---- progress thread --------------------------------------------------- */

static void run_commands(kvt_engine_t *e)
{
    kvt_cmd_t *c;

    pthread_mutex_lock(&e->lock);
    c = e->cmd_head;
    e->cmd_head = e->cmd_tail = NULL;
    pthread_mutex_unlock(&e->lock);
    while (c != NULL) {
        kvt_cmd_t *next = c->next;
        switch (c->kind) {
        case CMD_STORE:
            kvt_flow_sender_route(e, c->sreq, c->host, c->port, (uint16_t)c->timeout_ms);
            break;
        case CMD_LOAD_DELAY:
            kvt_flow_delay_start(e, c->job);
            break;
        case CMD_CANCEL:
            kvt_flow_sender_cancel(e, c->req_id);
            kvt_flow_recv_cancel(e, c->req_id, 1);
            if (c->notify) {
                kvt_msg_t m;
                kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
                m.u.cancel.req_id = c->req_id;
                kvt_flow_sender_notify(e, c->host, c->port, &m);
            }
            break;
        case CMD_WAIT_REQ:
            break;
        }
        kvt_free(c->req_id);
        kvt_free(c);
        c = next;
    }
}

static void dispatch_compl(kvt_engine_t *e, uint64_t cookie, kvt_status_t status)
{
    void *ptr = (void *)(uintptr_t)(cookie & ~(uint64_t)7);

    switch ((kvt_cookie_kind_t)(cookie & 7)) {
    case CK_PUSH_WRITE:
        kvt_flow_sender_on_write_done(e, ptr, status);
        break;
    case CK_PULL_READ:
        kvt_flow_recv_on_read_done(e, ptr, status);
        break;
    case CK_DELAY_READ:
        kvt_flow_delay_on_read_done(e, ptr, status);
        break;
    }
}

static void run_completions(kvt_engine_t *e)
{
    kvt_compl_t *c;
    uint32_t n_spill;
    uint64_t spill_cookie[KVT_COMPL_SPILL];
    kvt_status_t spill_status[KVT_COMPL_SPILL];

    pthread_mutex_lock(&e->lock);
    c = e->compl_head;
    e->compl_head = e->compl_tail = NULL;
    n_spill = e->n_compl_spill;
    for (uint32_t i = 0; i < n_spill; i++) {
        spill_cookie[i] = e->compl_spill[i].cookie;
        spill_status[i] = e->compl_spill[i].status;
    }
    e->n_compl_spill = 0;
    pthread_mutex_unlock(&e->lock);
    while (c != NULL) {
        kvt_compl_t *next = c->next;
        if (c->peer_failed != NULL) {
            kvt_flow_sender_peer_failed(e, c->peer_failed);
            kvt_free(c->peer_failed);
        } else {
            dispatch_compl(e, c->cookie, c->status);
        }
        kvt_free(c);
        c = next;
    }
    for (uint32_t i = 0; i < n_spill; i++)
        dispatch_compl(e, spill_cookie[i], spill_status[i]);
}

static void drain_socket(kvt_engine_t *e, void *sock, int which)
{
    for (int budget = 0; budget < 1024; budget++) {
        void *ident = NULL, *data = NULL;
        size_t ilen = 0, len = 0;
        int delim = 0;
        char peer[64] = "";
        kvt_status_t st = kvt_ctrl_recv_from(sock, which != 2, &ident, &ilen, &delim, &data, &len,
                                             peer, sizeof(peer));

        if (st == KVT_ERR_TIMEOUT || st == KVT_ERR_IO)
            return;
        if (st != KVT_OK) {
            kvt_engine_count(e, &e->m.bad_messages_total, 1);
            continue;
        }
        if (which == 0)
            kvt_flow_recv_on_router(e, ident, ilen, delim, data, len, peer);
        else if (which == 1)
            kvt_flow_recv_on_init(e, ident, ilen, delim, data, len, peer);
        else
            kvt_flow_sender_on_done_sock(e, data, len);
        kvt_free(ident);
        kvt_free(data);
    }
}

/* Control work a sender still owes its peers: a queued message (the landed echo,
 * a cancel) or one awaiting its reply. */
static int sender_owes_peers(const kvt_engine_t *e)
{
    for (const kvt_speer_t *p = e->speers; p != NULL; p = p->next)
        if (p->q_head != NULL || p->active != NULL)
            return 1;
    return 0;
}

/* Keep running? After destroy asked to stop, a sender finishes what it owes its
 * peers (up to pd_shutdown_timeout_sec): a store task completes before the
 * request's landed echo and ProxyNotif go out, and dropping them would leave the
 * receiver waiting for a request the caller saw succeed. */
static int progress_should_run(kvt_engine_t *e, uint64_t *drain_deadline_ns)
{
    uint64_t now;

    if (!atomic_load(&e->stop))
        return 1;
    if (!sender_owes_peers(e))
        return 0;
    now = kvt_clock_monotonic_ns();
    if (*drain_deadline_ns == 0)
        *drain_deadline_ns = now + (uint64_t)(e->cfg.pd_shutdown_timeout_sec * 1e9);
    return now < *drain_deadline_ns;
}

/* zmq_poll's timeout: until the earliest timer (rounded up: never early), -1 when none;
 * while draining at shutdown, no later than the drain deadline (real time: a test clock
 * that stands still must not keep destroy waiting). */
static long poll_timeout(kvt_engine_t *e, uint64_t drain_deadline_ns)
{
    int64_t next = pdb_timers_next(&e->timers);
    long ms = -1;

    if (next >= 0) {
        uint64_t now = kvt_engine_now(e), d;
        d = (uint64_t)next > now ? (uint64_t)next - now : 0;
        d = (d + KVT_NSEC_PER_MSEC - 1) / KVT_NSEC_PER_MSEC;
        ms = d > (uint64_t)INT_MAX ? INT_MAX : (long)d;
    }
    if (drain_deadline_ns != 0) {
        uint64_t now = kvt_clock_monotonic_ns();
        uint64_t d = drain_deadline_ns > now ? drain_deadline_ns - now : 0;
        uint64_t dms = (d + KVT_NSEC_PER_MSEC - 1) / KVT_NSEC_PER_MSEC;
        long dm = dms > (uint64_t)INT_MAX ? INT_MAX : (long)dms;
        if (ms < 0 || dm < ms)
            ms = dm;
    }
    return ms;
}

/* The pollset: wake fd, the receiver's ROUTERs, the sender's PULL and peer DEALERs. */
static size_t poll_items(kvt_engine_t *e, zmq_pollitem_t **items, size_t *cap)
{
    size_t n = 0, need = 4;

    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next)
        need += 2;
    if (need > *cap) {
        zmq_pollitem_t *ni = kvt_realloc(*items, need * sizeof(*ni));
        if (ni == NULL)
            return 0;
        *items = ni;
        *cap = need;
    }
    (*items)[n++] = (zmq_pollitem_t){.fd = e->wake_fd, .events = ZMQ_POLLIN};
    if (e->router != NULL)
        (*items)[n++] = (zmq_pollitem_t){.socket = e->router, .events = ZMQ_POLLIN};
    if (e->init_rt != NULL)
        (*items)[n++] = (zmq_pollitem_t){.socket = e->init_rt, .events = ZMQ_POLLIN};
    if (e->done_pull != NULL)
        (*items)[n++] = (zmq_pollitem_t){.socket = e->done_pull, .events = ZMQ_POLLIN};
    for (kvt_speer_t *p = e->speers; p != NULL; p = p->next) {
        if (p->dealer != NULL)
            (*items)[n++] = (zmq_pollitem_t){.socket = p->dealer, .events = ZMQ_POLLIN};
        if (p->init_dealer != NULL)
            (*items)[n++] = (zmq_pollitem_t){.socket = p->init_dealer, .events = ZMQ_POLLIN};
    }
    return n;
}

static void *progress_main(void *arg)
{
    kvt_engine_t *e = arg;
    zmq_pollitem_t *items = NULL;
    size_t cap = 0;
    uint64_t drain_deadline_ns = 0;

    tl_progress_engine = e;
    while (progress_should_run(e, &drain_deadline_ns)) {
        uint64_t v;
        size_t n = poll_items(e, &items, &cap);

        if (n == 0) {
            usleep(1000); /* no memory for the pollset: try again shortly */
            continue;
        }
        if (zmq_poll(items, (int)n, poll_timeout(e, drain_deadline_ns)) < 0 && errno != EINTR &&
            errno != EAGAIN)
            usleep(1000);
        if (read(e->wake_fd, &v, sizeof(v)) < 0) {
            /* nothing to read: woken by a socket or a timer */
        }
        run_commands(e);
        run_completions(e);
        kvt_engine_flush_out(e);
        if (e->router != NULL)
            drain_socket(e, e->router, 0);
        if (e->init_rt != NULL)
            drain_socket(e, e->init_rt, 1);
        if (e->done_pull != NULL)
            drain_socket(e, e->done_pull, 2);
        kvt_flow_sender_poll(e);
        pdb_timers_run(&e->timers, kvt_engine_now(e));
        kvt_flow_sender_kick_all(e);
        kvt_flow_recv_turn(e);
        atomic_fetch_add(&e->wakeups, 1); /* a turn done */
    }
    kvt_free(items);
    return NULL;
}

/* ---- create / destroy -------------------------------------------------- */

static kvt_status_t make_pool(kvt_engine_t *e, const char *name, size_t page_size, size_t size,
                              int device, kvt_pool_t **out)
{
    kvt_region_hook_t hook = {
        .on_register = hook_register, .on_deregister = hook_deregister, .arg = e};
    kvt_pool_params_t pp = {.name = name,
                            .mem_class = device ? KVT_MEM_DEVICE : KVT_MEM_HOST,
                            .page_size = page_size,
                            .buffer_size = size,
                            .hooks = &hook,
                            .nhooks = 1};
    return kvt_pool_create(&pp, out);
}

static kvt_status_t bind_sockets(kvt_engine_t *e)
{
    uint16_t alloc_port = kvt_config_port(&e->cfg, &e->cfg.pd_peer_alloc_port);
    uint16_t init_port = kvt_config_port(&e->cfg, &e->cfg.pd_peer_init_port);
    uint16_t done_port = kvt_config_port(&e->cfg, &e->cfg.pd_pull_done_port);
    kvt_status_t st;

    e->zctx = zmq_ctx_new();
    if (e->zctx == NULL)
        return KVT_ERR_IO;
    if (e->role & KVT_ROLE_RECEIVER) {
        e->router = kvt_ctrl_socket(e, ZMQ_ROUTER);
        e->init_rt = kvt_ctrl_socket(e, ZMQ_ROUTER);
        if (e->router == NULL || e->init_rt == NULL)
            return KVT_ERR_IO;
        st = kvt_ctrl_bind(e->router, e->bind_host, alloc_port, &e->ports.alloc_port);
        if (st == KVT_OK)
            st = kvt_ctrl_bind(e->init_rt, e->bind_host, init_port, &e->ports.init_port);
        if (st != KVT_OK)
            return st;
    }
    if (e->role & KVT_ROLE_SENDER) {
        if (e->cfg.pd_pull_done_port.n == 0 && alloc_port != 0)
            done_port = (uint16_t)(alloc_port + 100);
        e->done_pull = kvt_ctrl_socket(e, ZMQ_PULL);
        if (e->done_pull == NULL)
            return KVT_ERR_IO;
        st = kvt_ctrl_bind(e->done_pull, e->bind_host, done_port, &e->ports.done_port);
        if (st != KVT_OK)
            return st;
        if (e->cfg.pd_proxy_port != 0 && e->cfg.pd_proxy_host[0] != '\0') {
            char ep[300];
            int hwm = 100000;
            snprintf(ep, sizeof(ep), "tcp://%s:%u", e->cfg.pd_proxy_host,
                     (unsigned)e->cfg.pd_proxy_port);
            e->proxy_push = kvt_ctrl_socket(e, ZMQ_PUSH);
            if (e->proxy_push == NULL)
                return KVT_ERR_IO;
            zmq_setsockopt(e->proxy_push, ZMQ_SNDHWM, &hwm, sizeof(hwm));
            if (zmq_connect(e->proxy_push, ep) != 0)
                return KVT_ERR_CONFIG;
        }
    }
    return KVT_OK;
}

static void close_push(void *arg, const char *key, void *val)
{
    (void)arg;
    (void)key;
    kvt_ctrl_close(val);
}

static void free_val(void *arg, const char *key, void *val)
{
    (void)arg;
    (void)key;
    kvt_free(val);
}

static void engine_free(kvt_engine_t *e)
{
    kvt_pool_t *pools[3] = {e->pp_pool, e->cpu_pool, e->pool};

    /* 1. the transport: joins its threads, fails outstanding operations
     *    (their completions are queued), no byte moves after this */
    if (e->tl != NULL) {
        kvt_tl_t *tl = e->tl;
        e->tl = NULL;
        e->tdesc->ops->destroy(tl);
    }
    /* 2. let the flows see those failures (no transport calls any more) */
    run_completions(e);
    run_commands(e);
    /* 3. whatever the flows still hold */
    kvt_flow_delay_fini(e);
    kvt_flow_sender_fini(e);
    kvt_flow_recv_fini(e);
    kvt_guard_fini(e);
    kvt_engine_flush_out(e); /* the thread is gone: this one owns the sockets */
    if (e->done_pushes.buckets != NULL) {
        kvt_map_each(&e->done_pushes, close_push, NULL);
        kvt_map_fini(&e->done_pushes);
    }
    kvt_ctrl_close(e->router);
    kvt_ctrl_close(e->init_rt);
    kvt_ctrl_close(e->done_pull);
    kvt_ctrl_close(e->proxy_push);
    if (e->zctx != NULL)
        zmq_ctx_term(e->zctx);
    if (e->reserve != NULL)
        kvt_reserve_destroy(e->reserve);
    for (int i = 0; i < 3; i++) {
        if (pools[i] != NULL)
            kvt_pool_destroy(pools[i]);
    }
    if (e->breaker != NULL)
        kvt_breaker_destroy(e->breaker);
    if (e->pending != NULL)
        kvt_pending_destroy(e->pending);
    if (e->tasks.buckets != NULL)
        kvt_task_fini(e);
    if (e->rents.buckets != NULL)
        kvt_map_fini(&e->rents);
    if (e->rreqs.buckets != NULL)
        kvt_map_fini(&e->rreqs);
    if (e->tombs.buckets != NULL) {
        kvt_map_each(&e->tombs, free_val, NULL);
        kvt_map_fini(&e->tombs);
    }
    if (e->sgroups.buckets != NULL)
        kvt_map_fini(&e->sgroups);
    if (e->hs_peers.buckets != NULL)
        kvt_map_fini(&e->hs_peers);
    kvt_hs_fini(e);
    pdb_timers_free(&e->timers);
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    if (e->event_fd >= 0)
        close(e->event_fd);
    pthread_mutex_destroy(&e->lock);
    pthread_mutex_destroy(&e->rx_lock);
    pthread_mutex_destroy(&e->mlock);
    pthread_cond_destroy(&e->task_cond);
    kvt_free(e);
}

kvt_status_t kvt_engine_post(kvt_engine_t *e, const char *peer, kvt_tl_op_t op,
                             const kvt_tl_xfer_t *x, size_t n, uint64_t cookie)
{
    if (e->tl == NULL)
        return KVT_ERR_CLOSED;
    return e->tdesc->ops->post(e->tl, peer, op, x, n, cookie);
}

/* The data transport of <e> (by transfer_channel), listening on <data_port>. */
static kvt_status_t transport_open(kvt_engine_t *e, uint16_t data_port)
{
    kvt_tl_config_t tc;
    kvt_tl_callbacks_t cb;
    char device[KVT_CONFIG_STR_MAX + 16];
    const char *tname = kvt_channel_name(e->cfg.transfer_channel);
    kvt_status_t st;

    e->tdesc = kvt_transport_find(tname);
    if (e->tdesc == NULL)
        return KVT_ERR_UNSUPPORTED;
    snprintf(device, sizeof(device), e->cfg.verbs_gid_index >= 0 ? "%s::%d" : "%s",
             e->cfg.verbs_device, e->cfg.verbs_gid_index);
    memset(&tc, 0, sizeof(tc));
    memset(&cb, 0, sizeof(cb));
    tc.local_id = e->id;
    tc.listen_host = e->bind_host;
    tc.listen_port = data_port;
    tc.advertise_host = e->advertise;
    tc.lanes = e->cfg.transfer_lanes;
    tc.max_conns = e->cfg.transfer_max_conns;
    tc.max_conns_per_peer = e->cfg.transfer_max_conns_per_peer;
    tc.max_pending = e->cfg.transfer_max_pending;
    tc.max_conns_per_addr = e->cfg.transfer_max_conns_per_addr;
    tc.max_pending_per_addr = e->cfg.transfer_max_pending_per_addr;
    tc.addr_prefix_v6 = e->cfg.transfer_addr_prefix_v6;
    tc.hello_timeout_ms = sec_to_ms(e->cfg.transfer_hello_timeout);
    tc.idle_timeout_ms = sec_to_ms(e->cfg.transfer_idle_timeout);
    tc.timeout_ms = e->ctrl_timeout_ms > 30000 ? e->ctrl_timeout_ms : 30000;
    tc.device = device;
    cb.on_complete = on_tl_complete;
    cb.on_peer_failed = on_tl_peer_failed;
    cb.arg = e;
    st = e->tdesc->ops->create(&tc, &cb, &e->tl);
    if (st != KVT_OK)
        return st;
    /* the bound data port, from the transport (its blob is its own business) */
    e->ports.data_port = e->tdesc->ops->listen_port != NULL ? e->tdesc->ops->listen_port(e->tl) : 0;
    return KVT_OK;
}

kvt_status_t kvt_engine_create(const kvt_engine_params_t *p, kvt_engine_t **out)
{
    kvt_engine_t *e;
    kvt_status_t st;

    if (p == NULL || p->cfg == NULL || out == NULL || p->page_size == 0)
        return KVT_ERR_INVALID;
    st = kvt_config_validate(p->cfg, NULL);
    if (st != KVT_OK)
        return st;
    e = kvt_calloc(1, sizeof(*e));
    if (e == NULL)
        return KVT_ERR_NOMEM;
    e->wake_fd = e->event_fd = -1;
    pdb_timers_init(&e->timers);
    atomic_init(&e->waiter_due, UINT64_MAX);
    atomic_init(&e->sweep_due, UINT64_MAX);
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->rx_lock, NULL);
    pthread_mutex_init(&e->mlock, NULL);
    pthread_cond_init(&e->task_cond, NULL);
    e->cfg = *p->cfg;
    (void)kvt_flavour_parse(e->cfg.pd_peer_flavour, &e->flavour); /* validated: AUTO on error */
    e->role = e->cfg.pd_role;
    e->page_size = p->page_size;
    if (p->clock != NULL)
        e->clock = *p->clock;
    e->on_proxy_notif = p->on_proxy_notif;
    e->on_proxy_notif_arg = p->on_proxy_notif_arg;
    e->ctrl_timeout_ms = p->ctrl_timeout_ms
                             ? p->ctrl_timeout_ms
                             : (uint32_t)(e->cfg.pd_allocation_timeout_sec * 1000.0 + 0.5);
    if (e->ctrl_timeout_ms == 0)
        e->ctrl_timeout_ms = 5000;
    e->delay_chunks = p->delay_pull_chunks ? p->delay_pull_chunks : 8;
    snprintf(e->bind_host, sizeof(e->bind_host), "%s",
             p->bind_host != NULL ? p->bind_host : "0.0.0.0");
    if (p->advertise_host != NULL)
        snprintf(e->advertise, sizeof(e->advertise), "%s", p->advertise_host);
    else if (strcmp(e->bind_host, "0.0.0.0") == 0 || strcmp(e->bind_host, "*") == 0 ||
             strcmp(e->bind_host, "::") == 0)
        snprintf(e->advertise, sizeof(e->advertise), "127.0.0.1");
    else
        snprintf(e->advertise, sizeof(e->advertise), "%s", e->bind_host);
    if (e->cfg.pd_node_id[0] != '\0') {
        snprintf(e->id, sizeof(e->id), "%s", e->cfg.pd_node_id);
    } else {
        char host[128] = "host";
        gethostname(host, sizeof(host) - 1);
        snprintf(e->id, sizeof(e->id), "%s-%d-%u", host, (int)getpid(),
                 atomic_fetch_add(&g_engine_seq, 1));
    }

    kvt_flow_sender_init(e);
    kvt_flow_recv_init(e);
    st = KVT_ERR_NOMEM;
    if (kvt_engine_timer_room(e, 0) != KVT_OK || kvt_map_init(&e->tasks, 256) != KVT_OK ||
        kvt_map_init(&e->rents, 1024) != KVT_OK || kvt_map_init(&e->rreqs, 256) != KVT_OK ||
        kvt_map_init(&e->sgroups, 256) != KVT_OK || kvt_map_init(&e->done_pushes, 16) != KVT_OK ||
        kvt_map_init(&e->tombs, 64) != KVT_OK || kvt_map_init(&e->hs_peers, 16) != KVT_OK ||
        kvt_map_init(&e->hs_srcs, 16) != KVT_OK || kvt_guard_init(e) != KVT_OK)
        goto err;
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    st = KVT_ERR_IO;
    if (e->wake_fd < 0 || e->event_fd < 0)
        goto err;

    st = transport_open(e, p->data_port);
    if (st != KVT_OK)
        goto err;

    st = make_pool(e, "kv", e->page_size, e->cfg.pd_buffer_size, e->cfg.pd_buffer_is_device,
                   &e->pool);
    if (st != KVT_OK)
        goto err;
    e->stage = e->pool;
    if ((e->role & KVT_ROLE_SENDER) && e->cfg.pd_use_cpu_offload) {
        st = make_pool(e, "cpu-offload", e->page_size, kvt_config_cpu_buffer_size(&e->cfg), 0,
                       &e->cpu_pool);
        if (st != KVT_OK)
            goto err;
        e->stage = e->cpu_pool;
    }
    if ((e->role & KVT_ROLE_RECEIVER) && e->cfg.pd_delay_pull) {
        st = make_pool(e, "ping-pong", e->page_size, e->page_size * 2 * e->delay_chunks, 0,
                       &e->pp_pool);
        if (st != KVT_OK)
            goto err;
    }
    st = kvt_breaker_create(e->cfg.pd_alloc_fail_backoff_ttl, &e->clock, &e->breaker);
    if (st == KVT_OK)
        st = kvt_pending_create(e->cfg.pd_pull_pending_ttl, &e->clock, &e->pending);
    if (st == KVT_OK)
        st = kvt_reserve_create(e->pool, 30000, &e->clock, &e->reserve);
    if (st != KVT_OK)
        goto err;
    st = bind_sockets(e);
    if (st != KVT_OK)
        goto err;
    if (pthread_create(&e->thread, NULL, progress_main, e) != 0) {
        st = KVT_ERR_NOMEM;
        goto err;
    }
    *out = e;
    return KVT_OK;

err:
    engine_free(e);
    return st;
}

void kvt_engine_destroy(kvt_engine_t *e)
{
    if (e == NULL)
        return;
    atomic_store(&e->stop, 1);
    kvt_engine_wake(e);
    pthread_join(e->thread, NULL);
    engine_free(e);
}

const char *kvt_engine_id(const kvt_engine_t *e)
{
    return e != NULL ? e->id : "";
}

void kvt_engine_ports(const kvt_engine_t *e, kvt_engine_ports_t *out)
{
    if (e != NULL && out != NULL)
        *out = e->ports;
}

void kvt_engine_pool_stats(kvt_engine_t *e, kvt_pool_stats_t *out)
{
    if (e != NULL && out != NULL)
        kvt_pool_stats(e->pool, out);
}

void kvt_engine_metrics(kvt_engine_t *e, kvt_metrics_t *out)
{
    kvt_pool_stats_t ps, cs;
    kvt_breaker_stats_t bs;

    if (e == NULL || out == NULL)
        return;
    kvt_pool_stats(e->pool, &ps);
    kvt_breaker_stats(e->breaker, &bs);
    pthread_mutex_lock(&e->mlock);
    *out = e->m;
    pthread_mutex_unlock(&e->mlock);
    out->pinned_pages = ps.pinned_pages;
    out->free_pages = ps.free_pages;
    out->used_pages = ps.used_pages;
    if (e->cpu_pool != NULL) {
        kvt_pool_stats(e->cpu_pool, &cs);
        out->pinned_pages += cs.pinned_pages;
    }
    out->breaker_open = bs.open_peers;
    out->breaker_skips_total = bs.skips_total;
    if (e->tl != NULL && e->tdesc->ops->stats != NULL) {
        kvt_tl_stats_t ts = {0};
        e->tdesc->ops->stats(e->tl, &ts);
        out->lanes_refused_cap = ts.conns_refused;
        out->lanes_refused_hello = ts.hello_refused;
        out->lanes_closed_idle = ts.idle_closed;
        out->lanes_closed_stall = ts.stall_closed;
        out->data_access_denied = ts.access_denied;
        out->data_bad_frames = ts.bad_frames;
    }
}

static int on_progress_thread(const kvt_engine_t *e)
{
    return pthread_equal(pthread_self(), e->thread);
}

static void out_send(kvt_engine_t *e, kvt_out_t *o)
{
    if (o->url != NULL) {
        void *s = kvt_ctrl_done_push(e, o->url);
        if (s != NULL)
            (void)kvt_zmq_send(s, o->data, o->len, ZMQ_DONTWAIT);
    } else if (e->router != NULL) {
        (void)kvt_ctrl_reply_raw(e->router, o->ident, o->ident_len, o->delim, o->data, o->len);
    }
}

static void out_free(kvt_out_t *o)
{
    kvt_free(o->url);
    kvt_free(o->ident);
    kvt_free(o->data);
    kvt_free(o);
}

static void out_submit(kvt_engine_t *e, const char *url, const void *ident, size_t ident_len,
                       int delim, const kvt_msg_t *m)
{
    kvt_out_t *o = kvt_calloc(1, sizeof(*o));

    if (o == NULL || kvt_msg_encode(m, &o->data, &o->len) != KVT_OK)
        goto err;
    if (url != NULL && (o->url = kvt_strdup(url)) == NULL)
        goto err;
    if (ident != NULL) {
        o->ident = kvt_malloc(ident_len ? ident_len : 1);
        if (o->ident == NULL)
            goto err;
        memcpy(o->ident, ident, ident_len);
        o->ident_len = ident_len;
        o->delim = delim;
    }
    if (on_progress_thread(e) || atomic_load(&e->stop)) {
        out_send(e, o);
        out_free(o);
        return;
    }
    pthread_mutex_lock(&e->lock);
    if (e->out_tail != NULL)
        e->out_tail->next = o;
    else
        e->out_head = o;
    e->out_tail = o;
    pthread_mutex_unlock(&e->lock);
    kvt_engine_wake(e);
    return;
err:
    if (o != NULL)
        out_free(o);
}

void kvt_engine_send_done(kvt_engine_t *e, const char *url, const kvt_msg_t *m)
{
    out_submit(e, url, NULL, 0, 0, m);
}

void kvt_engine_router_reply(kvt_engine_t *e, const void *ident, size_t ident_len, int delim,
                             const kvt_msg_t *m)
{
    out_submit(e, NULL, ident, ident_len, delim, m);
}

void kvt_engine_flush_out(kvt_engine_t *e)
{
    kvt_out_t *o;

    pthread_mutex_lock(&e->lock);
    o = e->out_head;
    e->out_head = e->out_tail = NULL;
    pthread_mutex_unlock(&e->lock);
    while (o != NULL) {
        kvt_out_t *next = o->next;
        out_send(e, o);
        out_free(o);
        o = next;
    }
}

/* Queue a command for the progress thread. */
kvt_status_t kvt_engine_post_cmd(kvt_engine_t *e, kvt_cmd_t *c)
{
    pthread_mutex_lock(&e->lock);
    c->next = NULL;
    if (e->cmd_tail != NULL)
        e->cmd_tail->next = c;
    else
        e->cmd_head = c;
    e->cmd_tail = c;
    pthread_mutex_unlock(&e->lock);
    kvt_engine_wake(e);
    return KVT_OK;
}

kvt_status_t kvt_engine_cancel(kvt_engine_t *e, const char *req_id, int notify_peer,
                               const char *peer_host, uint16_t peer_alloc_port)
{
    kvt_cmd_t *c;

    if (e == NULL || req_id == NULL || req_id[0] == '\0')
        return KVT_ERR_INVALID;
    c = kvt_calloc(1, sizeof(*c));
    if (c == NULL)
        return KVT_ERR_NOMEM;
    c->kind = CMD_CANCEL;
    c->req_id = kvt_strdup(req_id);
    if (c->req_id == NULL) {
        kvt_free(c);
        return KVT_ERR_NOMEM;
    }
    c->notify = notify_peer;
    snprintf(c->host, sizeof(c->host), "%s", peer_host != NULL ? peer_host : e->cfg.pd_peer_host);
    c->port =
        peer_alloc_port ? peer_alloc_port : kvt_config_port(&e->cfg, &e->cfg.pd_peer_alloc_port);
    return kvt_engine_post_cmd(e, c);
}
