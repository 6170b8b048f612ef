/*
 * kvt_engine.h - the libkvt engine: what an inference engine embeds.
 *
 * One engine object = one TP rank of one instance, created from the pd_*
 * config (kvt_config.h). It owns a paged KV buffer pool, a data transport
 * (tcp / verbs) and a progress thread that polls its ZeroMQ sockets and the
 * transport completions. Every submission is thread-safe; results come back
 * as tasks completed through one eventfd.
 *
 *   sender (prefill)                          receiver (decode)
 *   kvt_submit_store(keys, bytes) --AllocRequest / PullReadyNotif-->  ROUTER
 *        writes pages (push)      <-- AscendAllocResponse / Ack ---
 *        or pins them (pull)      <== receiver READs (pull) =======
 *        ProxyNotif -> proxy, once the receiver confirmed the last batch
 *        landed (ProxyNotif echo on the alloc channel; only with a libkvt
 *        receiver, negotiated through kvt_ext)
 *
 * A receiver also serves upstream LMCache senders (async, sync, Ascend), each
 * answered in its own terms (docs/protocols/lmcache-wire.md).
 *                                   kvt_submit_wait_req(req_id)  -> landed
 *                                   kvt_submit_load(keys, dst)   -> bytes copied
 *                                   kvt_release(keys)            -> pages freed
 *
 * Roles: sender / receiver / both (pd_role). Mode: push unless
 * pd_pull_mode (sender's config); on the receiver pd_delay_pull turns a pull
 * into pull-delay (reads happen inside kvt_submit_load, in a ping-pong of two
 * chunk pools, and PullDoneSignal follows the last chunk).
 *
 * Layer-wise streaming: call kvt_submit_store several times with the same
 * req_id as parts are computed (each part goes out at once) and set
 * is_last_batch on the final part. The receiver reports the request landed
 * only after the last part, and ProxyNotif follows the last part.
 *
 * Keys are opaque strings (<= 4096 bytes, e.g. LMCache cache-key strings).
 * Every chunk is one page of <page_size> bytes except the last key of a
 * batch, which holds last_chunk_toks tokens (the store's `lens` say how many
 * bytes each chunk has).
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvt/kvt_clock.h"
#include "kvt/kvt_config.h"
#include "kvt/kvt_metrics.h"
#include "kvt/kvt_pool.h"
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_engine kvt_engine_t;
typedef uint64_t kvt_task_id_t; /* 0 is never a valid id */

typedef struct kvt_engine_params {
    const kvt_config_t *cfg; /* required; copied and validated */
    size_t page_size;        /* bytes of one full KV chunk (one page); required */
    /* Address the engine binds its sockets to (ROUTER, init, PULL, data
     * listener). NULL = "0.0.0.0". */
    const char *bind_host;
    /* Address peers use to reach this engine (sender_done_url, transport
     * handshake). NULL = bind_host, or "127.0.0.1" when bind_host is a
     * wildcard. */
    const char *advertise_host;
    /* Ports: taken from cfg (pd_peer_alloc_port / pd_peer_init_port /
     * kvt_config_pull_done_port at pd_tp_rank). A port of 0 means "pick an
     * ephemeral port" (read it back with kvt_engine_ports). */
    uint16_t data_port;         /* TCP data listener; 0 = ephemeral */
    const kvt_clock_t *clock;   /* NULL = monotonic; tests drive TTLs with it */
    uint32_t delay_pull_chunks; /* pull-delay ping-pong pool pages per side; 0 = 8 */
    uint32_t ctrl_timeout_ms;   /* per control request; 0 = pd_allocation_timeout_sec */
    /* Sender: called on the progress thread right after a ProxyNotif{req_id} went to the
     * proxy (the moment a proxy may start the decode); NULL = none. Must not block. */
    void (*on_proxy_notif)(void *arg, const char *req_id);
    void *on_proxy_notif_arg;
} kvt_engine_params_t;

/* Create and start (sockets bound, progress thread running). Output set
 * only on KVT_OK. */
kvt_status_t kvt_engine_create(const kvt_engine_params_t *p, kvt_engine_t **out);

/* Stop the progress thread, fail every pending task with KVT_ERR_CLOSED,
 * release every page, close everything. Tasks not yet harvested are freed. */
void kvt_engine_destroy(kvt_engine_t *e);

/* The injected clock (kvt_engine_params_t.clock) moved: the progress thread
 * sleeps until the earliest deadline as that clock saw it, so a test that
 * moves its clock calls this to have the deadlines now due run at once.
 * Never needed with the monotonic clock. Any thread. */
void kvt_engine_clock_moved(kvt_engine_t *e);

/* This engine's node id (pd_node_id or "<hostname>-<pid>"); owned by e. */
const char *kvt_engine_id(const kvt_engine_t *e);

typedef struct kvt_engine_ports {
    uint16_t alloc_port; /* receiver ROUTER (0 if not a receiver) */
    uint16_t init_port;  /* transport handshake ROUTER (0 if not a receiver) */
    uint16_t done_port;  /* sender PULL for PullDoneSignal (0 if not a sender) */
    uint16_t data_port;  /* TCP data listener (0 for other transports) */
} kvt_engine_ports_t;

/* Ports actually bound. */
void kvt_engine_ports(const kvt_engine_t *e, kvt_engine_ports_t *out);

/* ---- tasks ------------------------------------------------------------ */
typedef enum kvt_task_kind {
    KVT_TASK_STORE = 1,    /* sender: one batch of a request */
    KVT_TASK_LOAD = 2,     /* receiver: copy landed chunks into caller buffers */
    KVT_TASK_LOOKUP = 3,   /* receiver: which keys are here (matched keys locked) */
    KVT_TASK_WAIT_REQ = 4, /* receiver: a request's chunks have all landed */
} kvt_task_kind_t;

typedef struct kvt_task_result {
    kvt_task_id_t id;
    kvt_task_kind_t kind;
    kvt_status_t status; /* KVT_OK, or why the task failed as a whole */
    uint32_t nkeys;
    /* Bit i (kvt_bitmap_test) set = key i succeeded:
     *   STORE   the chunk is at the receiver (sent now or already there);
     *           skipped batches (breaker, alloc failure) have no bits set
     *   LOAD    bytes copied into the caller's buffer
     *   LOOKUP  present (and locked until kvt_unlock)
     *   WAIT_REQ unused (nkeys = 0) */
    uint8_t *bitmap; /* owned by the result: kvt_task_result_clear */
    void *user;      /* as given at submission */
} kvt_task_result_t;

/* eventfd that becomes readable when a task completes (level: stays
 * readable while unharvested results exist after a poll returned short). */
int kvt_engine_event_fd(const kvt_engine_t *e);

/* Harvest up to <max> completed tasks (any kind, completion order) without
 * blocking; returns how many were written. */
size_t kvt_task_poll(kvt_engine_t *e, kvt_task_result_t *out, size_t max);

/* Wait for task <id> up to <timeout_ms> (-1 = forever) and harvest it.
 * KVT_ERR_TIMEOUT if still running (it stays pending), KVT_ERR_NOT_FOUND if
 * unknown or already harvested. */
kvt_status_t kvt_task_wait(kvt_engine_t *e, kvt_task_id_t id, int timeout_ms,
                           kvt_task_result_t *out);

/* Free what a result owns. */
void kvt_task_result_clear(kvt_task_result_t *r);

/* ---- sender ------------------------------------------------------------ */
typedef struct kvt_store_desc {
    const char *req_id;       /* request id ("" allowed; then no ProxyNotif) */
    const char *peer_host;    /* receiver host; NULL = cfg pd_peer_host */
    uint16_t peer_alloc_port; /* receiver ROUTER port; 0 = cfg pd_peer_alloc_port[rank] */
    uint16_t peer_init_port;  /* receiver handshake port; 0 = cfg pd_peer_init_port[rank] */
    int32_t fmt;              /* chunk geometry (kvt_pool.h) */
    int64_t shape[KVT_MAX_DIMS];
    uint32_t ndim;
    const char *dtype;
    int64_t last_chunk_toks; /* tokens of the batch's last chunk (0 = full) */
    int is_last_batch;       /* last part of the request: ProxyNotif after it */
    uint32_t total_chunks;   /* chunks of the whole request (0 = unknown) */
    void *user;              /* copied into the result */
} kvt_store_desc_t;

/* Submit one batch: copy chunk i (<lens[i]> bytes from <bufs[i]>; the
 * chunk size the geometry gives, the last one sized by last_chunk_toks)
 * into the engine's buffer and transfer it to the receiver. Both sides must
 * use the same page_size.
 * Fails fast (no task) with KVT_ERR_TOO_LARGE when n exceeds the whole
 * buffer, KVT_ERR_NOSPACE when the staging buffer is full right now,
 * KVT_ERR_BACKPRESSURE in pull mode above the high-water mark,
 * KVT_ERR_INVALID for bad arguments. Otherwise the task completes with:
 *   KVT_OK            bitmap = chunks at the receiver (partial if some slots
 *                     failed there); pull: the receiver acked and reads
 *   KVT_ERR_BACKOFF   peer backed off by the breaker, nothing sent
 *   KVT_ERR_ALLOC_FAILED  the receiver had no space (trips the breaker)
 *   KVT_ERR_TIMEOUT / KVT_ERR_PEER / KVT_ERR_CANCELLED / KVT_ERR_CLOSED
 * Whatever the outcome, the request's ProxyNotif goes out after its last
 * batch so the decoder never waits forever (it recomputes what is missing). */
kvt_status_t kvt_submit_store(kvt_engine_t *e, const kvt_store_desc_t *d, const char *const *keys,
                              const void *const *bufs, const size_t *lens, uint32_t n,
                              kvt_task_id_t *id_out);

/* ---- receiver ---------------------------------------------------------- */
/* Completes when every chunk of <req_id> has landed here (the sender's last
 * batch completed), with KVT_ERR_TIMEOUT after <timeout_ms> (-1 = no limit)
 * or KVT_ERR_CANCELLED on CancelNotif. Already landed -> completes at once. */
kvt_status_t kvt_submit_wait_req(kvt_engine_t *e, const char *req_id, int timeout_ms, void *user,
                                 kvt_task_id_t *id_out);

/* Copy landed chunk <keys[i]> into <bufs[i]> (capacity <caps[i]> bytes;
 * the chunk's length is what the sender stored). Pull-delay chunks are read
 * from the sender now, pipelined. Bit i set on success. Pages stay until
 * kvt_release. <lens_out> (may be NULL) gets each chunk's length; it must
 * stay valid until the task completes. */
kvt_status_t kvt_submit_load(kvt_engine_t *e, const char *const *keys, void *const *bufs,
                             const size_t *caps, size_t *lens_out, uint32_t n, void *user,
                             kvt_task_id_t *id_out);

/* Which keys are here; matched keys are locked (not released by
 * kvt_release, not evicted) until kvt_unlock. */
kvt_status_t kvt_submit_lookup(kvt_engine_t *e, const char *const *keys, uint32_t n, void *user,
                               kvt_task_id_t *id_out);
/* Drop one lookup lock of each key (unknown keys ignored). */
void kvt_unlock(kvt_engine_t *e, const char *const *keys, uint32_t n);

/* Free the receiver pages of <keys> (locked keys are freed at their last
 * unlock). Returns how many keys were known. */
uint32_t kvt_release(kvt_engine_t *e, const char *const *keys, uint32_t n);
/* Free every key of <req_id> and its reservation. */
uint32_t kvt_release_req(kvt_engine_t *e, const char *req_id);

/* Cancel <req_id> here (release everything of it: pending tasks fail with
 * KVT_ERR_CANCELLED, pinned/allocated pages released) and send CancelNotif
 * to the peer (host, alloc_port; NULL/0 = config peer) when <notify_peer>. */
kvt_status_t kvt_engine_cancel(kvt_engine_t *e, const char *req_id, int notify_peer,
                               const char *peer_host, uint16_t peer_alloc_port);

/* ---- metrics ------------------------------------------------------------ */
void kvt_engine_metrics(kvt_engine_t *e, kvt_metrics_t *out);

/* Pool gauges (for tests): pages used and pinned in the engine's KV pool. */
void kvt_engine_pool_stats(kvt_engine_t *e, kvt_pool_stats_t *out);

/* ---- proxy side (the gateway) -------------------------------------------
 * A small client for the proxy role: receive ProxyNotif, reserve receiver
 * capacity before a prefill starts, send CancelNotif. Not thread-safe per
 * object except where noted; use one per thread or lock around it. */
typedef struct kvt_proxy kvt_proxy_t;

/* Bind a PULL on <host>:<port> (port 0 = ephemeral; read it back with
 * kvt_proxy_port). */
kvt_status_t kvt_proxy_create(const char *host, uint16_t port, kvt_proxy_t **out);
void kvt_proxy_destroy(kvt_proxy_t *p);
uint16_t kvt_proxy_port(const kvt_proxy_t *p);

/* A file descriptor for an epoll loop (ZMQ_FD: edge-style). When it turns
 * readable, call kvt_proxy_recv(timeout 0) until it returns KVT_ERR_TIMEOUT;
 * only that re-arms the fd. */
int kvt_proxy_fd(const kvt_proxy_t *p);

/* Receive one ProxyNotif: copies its req_id (truncated to cap-1, NUL
 * terminated). timeout_ms 0 = don't wait, -1 = forever. Garbage is counted
 * (kvt_proxy_bad_messages) and skipped. */
kvt_status_t kvt_proxy_recv(kvt_proxy_t *p, char *req_id, size_t cap, int timeout_ms);
uint64_t kvt_proxy_bad_messages(const kvt_proxy_t *p);

/* ReserveRequest to the receiver at host:alloc_port and wait up to
 * <timeout_ms> for its ReserveResponse. A socket that missed its reply is
 * closed, never reused. */
kvt_status_t kvt_proxy_reserve(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                               const char *req_id, int64_t total_chunks, int64_t ttl_ms,
                               int timeout_ms, int *granted_out, int64_t *free_chunks_out);

/* The same without waiting, for a loop that keeps many reservations in flight at once
 * (one receiver that does not answer must not hold up the others):
 *  - kvt_proxy_reserve_send sends the ReserveRequest on host:alloc_port's socket;
 *  - kvt_proxy_reserve_recv gives the next ReserveResponse that arrived on any of them
 *    (KVT_ERR_TIMEOUT when none is waiting; garbage is counted and skipped), with the
 *    endpoint it came from as kvt_proxy_reserve_endpoint writes it; a caller matches it to
 *    its request by endpoint and req_id;
 *  - kvt_proxy_reserve_fds lists the sockets' descriptors (ZMQ_FD, edge-style: call
 *    kvt_proxy_reserve_recv until KVT_ERR_TIMEOUT before waiting on them; any call on a
 *    socket, a send too, may take its readiness while an answer waits);
 *  - kvt_proxy_reserve_fd gives host:alloc_port's socket's descriptor (-1: none is open);
 *  - kvt_proxy_reserve_drop closes the socket of a receiver whose answer did not come in
 *    time: it is never reused, so an answer that comes later is never taken for another. */
typedef struct kvt_proxy_reply {
    char ep[300];
    char req_id[256];
    int granted;
    int64_t free_chunks;
} kvt_proxy_reply_t;
kvt_status_t kvt_proxy_reserve_send(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                                    const char *req_id, int64_t total_chunks, int64_t ttl_ms);
kvt_status_t kvt_proxy_reserve_recv(kvt_proxy_t *p, kvt_proxy_reply_t *out);
size_t kvt_proxy_reserve_fds(kvt_proxy_t *p, int *fds, size_t max);
int kvt_proxy_reserve_fd(kvt_proxy_t *p, const char *host, uint16_t alloc_port);
void kvt_proxy_reserve_drop(kvt_proxy_t *p, const char *host, uint16_t alloc_port);
void kvt_proxy_reserve_endpoint(const char *host, uint16_t alloc_port, char *ep, size_t cap);

/* CancelNotif{req_id, keys} to the receiver at host:alloc_port (fire and
 * forget; the receiver releases everything of req_id). */
kvt_status_t kvt_proxy_cancel(kvt_proxy_t *p, const char *host, uint16_t alloc_port,
                              const char *req_id, const char *const *keys, uint32_t nkeys);

#ifdef __cplusplus
}
#endif
#endif /* KVT_ENGINE_H */
