/*
 * Client-disconnect watcher for connections held suspended before their
 * response started (prefill computing, decode waiting for KV, queued for
 * admission). libmicrohttpd does not poll a suspended connection, so
 * without this a client that goes away is only noticed when the engine
 * resumes the connection, and its request keeps computing (and a prefill
 * keeps its KV) in the meantime.
 *
 * One thread, one epoll set: the socket of each such request is added with
 * EPOLLRDHUP (one-shot) when the connection is suspended, and removed
 * before the engine resumes it, so the fd is always still open (and owned
 * by that connection) while it is in the set. An epoll event carries a slot
 * number and a generation, never a pointer: the slot is looked up under the
 * engine lock, and a slot reused since then is recognised and ignored.
 * Streams between tokens are not watched (they are resumed every token and
 * notice a closed socket on their next write), so they cost no syscall.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim_int.h"

#define SIM_WATCH_STOP_TAG UINT64_MAX

typedef struct sim_watch_slot {
    sim_req_t *req; /* NULL = free */
    uint32_t gen;
    uint32_t next_free;
} sim_watch_slot_t;

/* guarded by the engine lock */
static sim_watch_slot_t *slots;
static uint32_t n_slots, cap_slots, free_head = UINT32_MAX;

static int ep = -1, stop_fd = -1;
static pthread_t thread;
static int running;

static uint64_t tag_of(uint32_t idx, uint32_t gen)
{
    return ((uint64_t)gen << 32) | idx;
}

static int slot_get(uint32_t *out)
{
    if (free_head != UINT32_MAX) {
        *out = free_head;
        free_head = slots[free_head].next_free;
        return 0;
    }
    if (n_slots == cap_slots) {
        uint32_t cap = cap_slots ? cap_slots * 2 : 256;
        sim_watch_slot_t *s = realloc(slots, cap * sizeof(*s));
        if (!s)
            return -1;
        slots = s;
        cap_slots = cap;
    }
    slots[n_slots].gen = 0;
    slots[n_slots].req = NULL;
    *out = n_slots++;
    return 0;
}

void sim_watch_add_locked(sim_req_t *req, int fd)
{
    uint32_t idx;
    if (ep < 0 || fd < 0 || req->watch_slot)
        return;
    if (slot_get(&idx))
        return; /* out of memory: noticed at resume time, as without a watcher */
    slots[idx].gen++;
    slots[idx].req = req;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT,
                             .data.u64 = tag_of(idx, slots[idx].gen)};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
        slots[idx].req = NULL;
        slots[idx].next_free = free_head;
        free_head = idx;
        return;
    }
    req->watch_slot = idx + 1;
    req->watch_fd = fd;
}

void sim_watch_remove_locked(sim_req_t *req)
{
    if (!req->watch_slot)
        return;
    uint32_t idx = req->watch_slot - 1;
    /* the connection is still suspended, so the fd is still its socket */
    if (ep >= 0)
        epoll_ctl(ep, EPOLL_CTL_DEL, req->watch_fd, NULL);
    if (idx < n_slots && slots[idx].req == req) {
        slots[idx].req = NULL;
        slots[idx].next_free = free_head;
        free_head = idx;
    }
    req->watch_slot = 0;
    req->watch_fd = -1;
}

int sim_watch_client_gone_locked(sim_req_t *req)
{
    if (req->client_gone)
        return 1;
    if (!req->http)
        return 0; /* an internal request (kvt batch compute) has no client */
    if (!req->conn)
        return 1; /* the connection already ended */
    if (!req->watch_slot)
        return 0;
    /* the watcher may not have run yet: look at the socket itself */
    char c;
    ssize_t n = recv(req->watch_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        sim_watch_remove_locked(req);
        req->client_gone = 1;
        atomic_fetch_add(&sim_ctr.client_disconnects, 1);
        return 1;
    }
    return 0;
}

static void on_event(uint64_t tag)
{
    uint32_t idx = (uint32_t)tag, gen = (uint32_t)(tag >> 32);
    sim_engine_lock();
    if (idx < n_slots && slots[idx].req && slots[idx].gen == gen) {
        sim_req_t *req = slots[idx].req;
        sim_watch_remove_locked(req);
        if (!req->client_gone) {
            req->client_gone = 1;
            atomic_fetch_add(&sim_ctr.client_disconnects, 1);
        }
        /* like a connection that ended: stop the compute, drop exports,
         * cancel imports; the resume that follows closes the connection */
        sim_engine_cancel_locked(req);
    }
    sim_engine_unlock();
}

static void *watch_main(void *arg)
{
    struct epoll_event evs[64];
    (void)arg;
    for (;;) {
        int n = epoll_wait(ep, evs, 64, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("pdgw-sim: epoll_wait (disconnect watcher)");
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == SIM_WATCH_STOP_TAG)
                return NULL;
            on_event(evs[i].data.u64);
        }
    }
}

int sim_watch_start(void)
{
    ep = epoll_create1(EPOLL_CLOEXEC);
    stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ep < 0 || stop_fd < 0)
        goto err_fds;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = SIM_WATCH_STOP_TAG};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd, &ev))
        goto err_fds;
    if (pthread_create(&thread, NULL, watch_main, NULL))
        goto err_fds;
    running = 1;
    return 0;
err_fds:
    perror("pdgw-sim: disconnect watcher");
    if (ep >= 0)
        close(ep);
    if (stop_fd >= 0)
        close(stop_fd);
    ep = stop_fd = -1;
    return -1;
}

void sim_watch_stop(void)
{
    if (running) {
        uint64_t one = 1;
        if (write(stop_fd, &one, sizeof(one)) < 0)
            perror("pdgw-sim: disconnect watcher stop");
        pthread_join(thread, NULL);
        running = 0;
    }
    sim_engine_lock();
    if (ep >= 0)
        close(ep);
    if (stop_fd >= 0)
        close(stop_fd);
    ep = stop_fd = -1;
    free(slots);
    slots = NULL;
    n_slots = cap_slots = 0;
    free_head = UINT32_MAX;
    sim_engine_unlock();
}
