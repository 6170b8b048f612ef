/*
 * kvt_engine_int.h - internals of the engine (progress thread, control
 * plane, flows). Not installed.
 *
 * Threads: user threads submit (thread-safe); ONE progress thread owns every
 * ZeroMQ socket and runs every flow state machine; transport threads only
 * queue completions (kvt_engine_tl_complete) and wake the progress thread.
 *
 * Locks: e->lock guards tasks, the command queue and the completion queue;
 * e->rx_lock guards the receiver's key dictionary and request table (users
 * read it directly for load/lookup/release). Lock order rx_lock -> lock.
 */
#ifndef KVT_ENGINE_INT_H
#define KVT_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kvt/kvt_breaker.h"
#include "kvt/kvt_engine.h"
#include "kvt/kvt_msg.h"
#include "kvt/kvt_pending.h"
#include "kvt/kvt_reserve.h"
#include "kvt_strmap_int.h"
#include "kvt_transport.h"
#include "pdb/pdb_timer.h"

/* ---- string map: the base map (kvt_strmap_int.h) under the engine's names */
typedef kvt_strmap_t kvt_map_t;

/* <nb>: expected entries (0 = small). */
static inline kvt_status_t kvt_map_init(kvt_map_t *m, size_t nb)
{
    return kvt_status_of_pdb(pdb_map_init(m, nb));
}

static inline void kvt_map_fini(kvt_map_t *m) /* frees entries, not values */
{
    pdb_map_fini(m, NULL);
}

static inline void *kvt_map_get(const kvt_map_t *m, const char *key)
{
    return pdb_map_get(m, key);
}

static inline kvt_status_t kvt_map_put(kvt_map_t *m, const char *key, void *val)
{
    return kvt_status_of_pdb(pdb_map_put(m, key, val)); /* EXISTS if present */
}

static inline void *kvt_map_del(kvt_map_t *m, const char *key) /* returns value */
{
    return pdb_map_remove(m, key);
}

/* Iterate: call fn for every value; fn may not modify the map. */
static inline void kvt_map_each(const kvt_map_t *m,
                                void (*fn)(void *arg, const char *key, void *val), void *arg)
{
    pdb_map_each(m, fn, arg);
}

/* ---- tasks (kvt_task.c) ------------------------------------------------ */
typedef struct kvt_task {
    struct kvt_task *next, *prev; /* done list (doubly linked: harvest unlinks in O(1)) */
    kvt_task_id_t id;
    kvt_task_kind_t kind;
    kvt_status_t status;
    uint32_t nkeys;
    uint8_t *bitmap;
    void *user;
    int done;
    uint64_t start_ns;
} kvt_task_t;

kvt_task_t *kvt_task_new(kvt_engine_t *e, kvt_task_kind_t kind, uint32_t nkeys, void *user);
/* Complete: moves to the done list, signals the eventfd. Takes e->lock. */
void kvt_task_complete(kvt_engine_t *e, kvt_task_t *t, kvt_status_t st);
/* Drop every task (destroy). */
void kvt_task_fini(kvt_engine_t *e);

/* ---- sender ------------------------------------------------------------ */
typedef enum {
    SREQ_QUEUED = 0,
    SREQ_WAIT_REPLY, /* AllocRequest / PullReadyNotif sent */
    SREQ_WRITING,    /* push writes posted */
    SREQ_DONE,
} kvt_sreq_state_t;

typedef struct kvt_speer kvt_speer_t;

typedef struct kvt_sreq {
    struct kvt_sreq *next;
    kvt_task_t *task;
    kvt_speer_t *peer;
    char *req_id;
    char **keys;
    size_t *lens;
    kvt_page_t *pages; /* staging pages (pinned while in use) */
    uint32_t n;
    kvt_pool_t *pool; /* pool of <pages> */
    int32_t fmt;
    int64_t shape[KVT_MAX_DIMS];
    uint32_t ndim;
    char dtype[KVT_DTYPE_MAX];
    int64_t last_chunk_toks;
    int is_last;
    uint32_t total_chunks;
    int pull;
    char pull_id[320];
    kvt_sreq_state_t state;
    uint64_t deadline_ns;
    uint8_t *sent_bm; /* keys not to release at completion (pull: still pinned) */
    int cancelled;
    const struct kvt_sop *op; /* what this item is: a batch, a cancel, a landed query */
    kvt_tl_xfer_t *retry_x;   /* writes to post again after a new handshake */
    size_t retry_n;
    int retried;
} kvt_sreq_t;

/* One kind of operation on a receiver's channel (UCX active-message style):
 * the channel code (queue, send, answer, timeout) only dispatches through
 * it. kvt_flow_send.c has the three: a batch (AllocRequest /
 * PullReadyNotif), the cancel (CancelNotif) and the landed query. */
typedef struct kvt_sop {
    const char *name;
    int before_handshake; /* may go out before the transport handshake */
    /* build and send the request on the peer's DEALER */
    kvt_status_t (*send)(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r);
    /* is <m> the answer to <r>? (otherwise it is counted bad and ignored) */
    int (*accepts)(const kvt_sreq_t *r, const kvt_msg_t *m);
    /* the answer arrived (the channel is free again; <m> is cleared after) */
    void (*on_reply)(kvt_engine_t *e, kvt_speer_t *p, kvt_sreq_t *r, kvt_msg_t *m);
    /* over: answered, failed, timed out or cancelled; frees <r> */
    void (*finish)(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st);
} kvt_sop_t;

/* One receiver endpoint (host:alloc_port) as seen by a sender. */
struct kvt_speer {
    kvt_speer_t *next;
    char addr[300]; /* "host:alloc_port" */
    char host[256];
    uint16_t alloc_port;
    uint16_t init_port;
    char peer_id[KVT_TL_PEER_ID_MAX + 1]; /* receiver node id (handshake) */
    void *dealer;                         /* alloc channel */
    void *init_dealer;                    /* handshake channel */
    int hs_state;                         /* 0 none, 1 sent, 2 done, -1 failed */
    uint64_t hs_deadline_ns;
    kvt_sreq_t *q_head, *q_tail; /* waiting for the channel */
    kvt_sreq_t *active;          /* request awaiting its reply */
    uint32_t dealer_gen;
    int64_t ext;             /* kvt_ext of the receiver's last answer (0: no pdgw extensions) */
    kvt_engine_t *eng;       /* for its timers' callbacks */
    pdb_timer_t hs_timer;    /* hs_deadline_ns while the handshake is unanswered */
    pdb_timer_t reply_timer; /* the deadline of <active> */
};

/* Request-level bookkeeping on the sender (ProxyNotif after every batch). */
typedef struct kvt_sgroup {
    char *req_id;
    uint32_t outstanding;
    int last_seen;
    int any_ok;    /* some batch reached the receiver: confirm landing first */
    int cancelled; /* CancelNotif: no ProxyNotif, dropped when idle */
    kvt_speer_t *peer;
} kvt_sgroup_t;

/* ---- receiver ---------------------------------------------------------- */
typedef enum {
    RENT_ALLOCATED = 1, /* push: waiting for the sender's writes */
    RENT_READING,       /* pull-eager: read in flight */
    RENT_LANDED,        /* bytes here */
    RENT_PROXY,         /* pull-delay: bytes still at the sender */
    RENT_CONSUMED,      /* pull-delay: read once by a load, gone */
} kvt_rent_state_t;

typedef struct kvt_rpull kvt_rpull_t;

/* Room for a sender's source key (kvt_alloc_guard.c): an IP address with its prefix, or
 * "id:" + a routing id's sender part. */
#define KVT_SRC_KEY_MAX (KVT_TL_PEER_ID_MAX + 8)

/* A sender as a receiver counts it for pd_alloc_quota (kvt_alloc_guard.c). */
typedef struct kvt_rsrc {
    char key[KVT_SRC_KEY_MAX];
    uint32_t pages; /* pages of its entries nobody claimed yet */
    uint32_t nents; /* entries counted against it */
} kvt_rsrc_t;

typedef struct kvt_rent {
    char *key;
    char *req_id;
    kvt_rent_state_t state;
    kvt_page_t page; /* KVT_PAGE_NONE for proxies */
    size_t len;
    uint32_t locks;
    int release_pending;              /* free at last unlock / end of read */
    int granted;                      /* WRITE grant to <writer> outstanding */
    char *writer;                     /* sender node id(s) granted WRITE, '\n'-separated (push) */
    kvt_rpull_t *pull;                /* pull it belongs to (pull modes) */
    char ruuid[KVT_UUID_STR_LEN + 1]; /* sender ref (pull) */
    uint64_t roff;
    int busy;                           /* a load is reading it (delay) */
    struct kvt_rreq *rq;                /* its request's record (NULL: none / forgotten) */
    struct kvt_rent *rq_next, *rq_prev; /* that record's entry list */
    /* Unclaimed (kvt_alloc_guard.c): until the consumer claims it (lookup, load) the entry
     * counts against its sender's quota and sits on the expiry queue. */
    kvt_rsrc_t *src;                    /* NULL once claimed */
    int queued;                         /* on the expiry queue */
    uint64_t expire_ns;                 /* freed then, unless claimed (pd_alloc_ttl) */
    struct kvt_rent *ex_next, *ex_prev; /* the expiry queue (earliest deadline first) */
} kvt_rent_t;

struct kvt_rpull {
    char *pull_id;
    char *req_id;
    char *sender_id;
    char *done_url;
    uint32_t remaining; /* keys still to read */
    uint32_t refs;      /* entries pointing here */
    int done_sent;
};

typedef struct kvt_rreq {
    char *req_id;
    int notified;     /* sender's ProxyNotif arrived */
    uint32_t reading; /* pull-eager reads in flight */
    int cancelled;
    kvt_task_t **waiters;
    uint64_t *waiter_deadline;
    uint32_t nwaiters;
    uint64_t touched_ns;
    void *ack_ident; /* the sender waiting for "landed" (ProxyNotif echo) */
    size_t ack_ident_len;
    int ack_delim;
    kvt_rent_t *ents; /* entries of this request: landing and release walk these */
    uint32_t nents;
} kvt_rreq_t;

/* Parked AllocRequest / PullReadyNotif waiting for space. */
typedef struct kvt_parked {
    struct kvt_parked *next;
    void *sock;
    void *ident;
    size_t ident_len;
    int delim;
    char src[KVT_SRC_KEY_MAX]; /* its sender's source key (pd_alloc_quota) */
    int quota;                 /* waits for its sender's quota, not for space: holds up nobody */
    kvt_msg_t msg;
    uint64_t deadline_ns;
} kvt_parked_t;

/* ---- commands and completions ------------------------------------------ */
typedef enum {
    CMD_STORE = 1,
    CMD_LOAD_DELAY,
    CMD_CANCEL,
    CMD_WAIT_REQ,
} kvt_cmd_kind_t;

typedef struct kvt_load_job kvt_load_job_t;

typedef struct kvt_cmd {
    struct kvt_cmd *next;
    kvt_cmd_kind_t kind;
    kvt_sreq_t *sreq;
    kvt_load_job_t *job;
    kvt_task_t *task;
    char *req_id;
    int notify;
    char host[256];
    uint16_t port;
    int timeout_ms;
} kvt_cmd_t;

typedef enum {
    CK_PUSH_WRITE = 1, /* ptr = sreq */
    CK_PULL_READ,      /* ptr = read ctx */
    CK_DELAY_READ,     /* ptr = load job */
} kvt_cookie_kind_t;

#define KVT_COMPL_SPILL 64

typedef struct kvt_compl {
    struct kvt_compl *next;
    uint64_t cookie;
    kvt_status_t status;
    char *peer_failed; /* non-NULL: a peer failure report */
} kvt_compl_t;

/* A pull-eager read in flight on the receiver. */
typedef struct kvt_rread {
    kvt_rpull_t *pull;
    kvt_rent_t **ents;
    uint32_t n;
    uint64_t start_ns;
} kvt_rread_t;

/* A load touching pull-delay proxies (ping-pong through two chunk pools). */
struct kvt_load_job {
    struct kvt_load_job *next;
    kvt_task_t *task;
    kvt_rent_t **ents; /* the proxy entries, in order */
    uint32_t *slot;    /* index of each entry in the caller's arrays */
    uint32_t n;
    void **bufs;
    size_t *caps;
    size_t *lens_out;
    uint32_t next_post; /* first entry not yet posted */
    uint32_t inflight_first, inflight_n, inflight_half;
    uint32_t ready_first, ready_n, ready_half; /* landed, to copy */
    int posted;
    kvt_status_t status;
    uint64_t start_ns;
};

/* A control message produced off the progress thread (a user's release
 * can finish a pull): ZeroMQ sockets belong to the progress thread, so it
 * is queued and sent from there. */
typedef struct kvt_out {
    struct kvt_out *next;
    char *url;   /* PUSH to this done URL, or NULL: reply on the ROUTER */
    void *ident; /* ROUTER identity */
    size_t ident_len;
    int delim;
    void *data;
    size_t len;
} kvt_out_t;

/* ---- the engine -------------------------------------------------------- */
struct kvt_engine {
    kvt_config_t cfg;
    kvt_role_t role;
    char id[KVT_TL_PEER_ID_MAX + 1];
    char bind_host[256];
    char advertise[256];
    size_t page_size;
    kvt_clock_t clock;
    uint32_t ctrl_timeout_ms;
    uint32_t delay_chunks;

    kvt_pool_t *pool;      /* KV pages (receiver landing / sender staging) */
    kvt_pool_t *cpu_pool;  /* sender CPU offload staging (pd_use_cpu_offload) */
    kvt_pool_t *pp_pool;   /* pull-delay ping-pong pages (2 * delay_chunks) */
    kvt_pool_t *stage;     /* pool sender batches are staged in */
    kvt_flavour_t flavour; /* receiver: pd_peer_flavour (AUTO = tell from the request) */

    const kvt_transport_desc_t *tdesc;
    kvt_tl_t *tl;
    kvt_tl_region_t *regions[3 * KVT_POOL_MAX_REGIONS];
    uint32_t nregions;

    void *zctx;
    void *router;     /* receiver alloc ROUTER */
    void *init_rt;    /* receiver handshake ROUTER */
    void *done_pull;  /* sender PULL for PullDoneSignal / CancelNotif */
    void *proxy_push; /* sender PUSH to pd_proxy */
    void (*on_proxy_notif)(void *arg, const char *req_id); /* kvt_engine_params_t */
    void *on_proxy_notif_arg;
    kvt_engine_ports_t ports;
    kvt_map_t done_pushes; /* receiver: done url -> PUSH socket */

    pthread_t thread;
    int wake_fd;
    int event_fd;
    atomic_int stop;

    pthread_mutex_t lock;
    pthread_cond_t task_cond;
    kvt_map_t tasks; /* "id" -> task (pending and done-unharvested) */
    kvt_task_t *done_head, *done_tail;
    kvt_task_id_t next_id;
    kvt_cmd_t *cmd_head, *cmd_tail;
    kvt_compl_t *compl_head, *compl_tail;
    /* Completions whose queue node could not be allocated: kept here (under lock) rather
     * than lost or retried forever; when even this is full one is dropped and counted, and
     * the transfer ends by its timeout. */
    struct {
        uint64_t cookie;
        kvt_status_t status;
    } compl_spill[KVT_COMPL_SPILL];
    uint32_t n_compl_spill;
    uint64_t compl_dropped;
    kvt_out_t *out_head, *out_tail;

    /* sender (progress thread only) */
    kvt_speer_t *speers;
    kvt_map_t sgroups; /* req_id -> kvt_sgroup_t */
    kvt_breaker_t *breaker;
    kvt_pending_t *pending;

    /* receiver (rx_lock) */
    pthread_mutex_t rx_lock;
    kvt_map_t rents;    /* key -> kvt_rent_t */
    kvt_map_t rreqs;    /* req_id -> kvt_rreq_t */
    kvt_map_t tombs;    /* cancelled req_id -> expiry (uint64_t ns, kvt_malloc'd) */
    kvt_map_t hs_peers; /* node ids that ran the transport handshake here (value unused) */
    kvt_map_t hs_srcs;  /* source key -> its handshaken node ids (kvt_handshake.c; progress) */
    kvt_reserve_t *reserve;
    /* Unclaimed allocations (kvt_alloc_guard.c): per-sender page counts and the expiry queue,
     * in deadline order (one TTL for all: arrival order, so a new deadline is the last). */
    kvt_map_t rsrcs;               /* source key -> kvt_rsrc_t */
    kvt_rent_t *ex_head, *ex_tail; /* unclaimed entries, earliest deadline first */
    uint64_t alloc_ttl_ns;         /* pd_alloc_ttl; 0 = no expiry */
    uint32_t alloc_quota;          /* pages one sender may hold unclaimed (pd_alloc_quota) */
    kvt_parked_t *parked;
    uint32_t nparked_space;   /* of them, waiting for pool space (progress thread) */
    atomic_uint parked_quota; /* of them, waiting for their sender's quota (claims wake) */
    kvt_load_job_t *jobs_head, *jobs_tail; /* delay loads, one active at a time */

    /* Timers (progress thread only): every deadline of the flows is armed here and the
     * progress thread sleeps until the earliest; nothing is polled. Deadlines set on other
     * threads (a user's wait, a record or tombstone that will go stale) lower an atomic due
     * time instead (kvt_engine_due_lower) and wake the thread, which arms the timer. Room for
     * every timer is reserved up front (kvt_engine_timer_room) so arming never fails. */
    pdb_timers_t timers;
    uint32_t nspeers;
    pdb_timer_t pending_timer; /* sender: the pull-pending table's first TTL */
    pdb_timer_t parked_timer;  /* receiver: the first parked request's final answer */
    pdb_timer_t waiter_timer;  /* receiver: the earliest kvt_submit_wait_req deadline */
    pdb_timer_t sweep_timer;   /* receiver: stale records, tombstones, reservations */
    pdb_timer_t expire_timer;  /* receiver: the first unclaimed allocation's deadline */
    _Atomic uint64_t waiter_due, sweep_due; /* UINT64_MAX: nothing to do */
    _Atomic uint64_t expire_due;            /* the expiry queue's head deadline */
    uint64_t sweep_last_ns;                 /* sweeps run at most once a second */
    uint64_t expire_last_ns;                /* expiry batches too (at most one a second) */
    atomic_ullong wakeups;                  /* progress turns done (tests: idle = none) */
    atomic_ullong parked_total;             /* requests ever parked (tests wait on it) */

    /* metrics */
    pthread_mutex_t mlock;
    kvt_metrics_t m;
    uint64_t pull_seq;
};

/* engine core (kvt_engine.c) */
void kvt_engine_wake(kvt_engine_t *e);
/* Arm <t> for <due_ns> on the engine clock (progress thread, or the destroying thread once
 * the progress thread is gone). */
void kvt_engine_arm(kvt_engine_t *e, pdb_timer_t *t, uint64_t due_ns);
/* Room in the heap for the engine's timers plus two per sender peer, <extra_speers> more
 * than now; KVT_ERR_NOMEM when it cannot grow. */
kvt_status_t kvt_engine_timer_room(kvt_engine_t *e, uint32_t extra_speers);
/* Any thread: make *due at most <t>; wakes the progress thread when it got earlier. */
void kvt_engine_due_lower(kvt_engine_t *e, _Atomic uint64_t *due, uint64_t t);
uint64_t kvt_engine_now(const kvt_engine_t *e);
void kvt_engine_count(kvt_engine_t *e, uint64_t *field, uint64_t n);
void kvt_engine_observe(kvt_engine_t *e, uint64_t start_ns);
uint64_t kvt_cookie(kvt_cookie_kind_t kind, void *ptr);
/* A receiver refused a request (or part of it): count it (kvt_refusals_total)
 * and log why, rate-limited like bad messages. */
void kvt_engine_refuse(kvt_engine_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Count a malformed message (kvt_bad_messages_total) and log why, rate-limited. */
void kvt_engine_bad_msg(kvt_engine_t *e, const char *where, kvt_status_t st,
                        const kvt_msg_err_t *err);
kvt_status_t kvt_engine_region_of(kvt_engine_t *e, kvt_pool_t *pool, kvt_page_t page,
                                  kvt_tl_region_t **region_out, uint64_t *off_out,
                                  char uuid_out[KVT_UUID_STR_LEN + 1]);
kvt_status_t kvt_engine_grant(kvt_engine_t *e, const char *peer, kvt_pool_t *pool,
                              const kvt_page_t *pages, uint32_t n, unsigned access, int revoke);

kvt_status_t kvt_engine_post_cmd(kvt_engine_t *e, kvt_cmd_t *c);
/* Send <m> to a sender's done URL (PUSH) / as a reply on the alloc ROUTER,
 * from any thread (sent at once on the progress thread, queued otherwise). */
void kvt_engine_send_done(kvt_engine_t *e, const char *url, const kvt_msg_t *m);
void kvt_engine_router_reply(kvt_engine_t *e, const void *ident, size_t ident_len, int delim,
                             const kvt_msg_t *m);
void kvt_engine_flush_out(kvt_engine_t *e);
/* transport post; KVT_ERR_CLOSED once the transport is gone */
kvt_status_t kvt_engine_post(kvt_engine_t *e, const char *peer, kvt_tl_op_t op,
                             const kvt_tl_xfer_t *x, size_t n, uint64_t cookie);

/* control plane helpers (kvt_ctrl.c) */
void *kvt_ctrl_socket(kvt_engine_t *e, int type);
void kvt_ctrl_close(void *sock);
kvt_status_t kvt_ctrl_bind(void *sock, const char *host, uint16_t port, uint16_t *bound_out);
kvt_status_t kvt_ctrl_send_msg(void *sock, const kvt_msg_t *m, int flags);
/* A request on a DEALER: [empty delimiter, payload], never blocking. */
kvt_status_t kvt_ctrl_send_req(void *dealer, const kvt_msg_t *m);
kvt_status_t kvt_ctrl_send_req_raw(void *dealer, const void *data, size_t len);
/* Send a reply on a ROUTER: identity, [empty delimiter], payload. */
kvt_status_t kvt_ctrl_reply(void *router, const void *ident, size_t ident_len, int delim,
                            const kvt_msg_t *m);
kvt_status_t kvt_ctrl_reply_raw(void *router, const void *ident, size_t ident_len, int delim,
                                const void *data, size_t len);
/* Receive one multipart message without blocking. For a ROUTER <ident> gets
 * the identity (kvt_malloc'd) and <delim> whether an empty frame followed.
 * The last frame is returned in *data and *len (kvt_malloc'd). KVT_ERR_TIMEOUT
 * when nothing is there. */
kvt_status_t kvt_ctrl_recv(void *sock, int router, void **ident, size_t *ident_len, int *delim,
                           void **data, size_t *len);
/* The same, and <peer> (<peer_cap> bytes) gets the IP address the message came from
 * (ZeroMQ's Peer-Address), "" when the transport has none (ipc, inproc). */
kvt_status_t kvt_ctrl_recv_from(void *sock, int router, void **ident, size_t *ident_len, int *delim,
                                void **data, size_t *len, char *peer, size_t peer_cap);
void *kvt_ctrl_done_push(kvt_engine_t *e, const char *url);

/* init-port handshake (kvt_handshake.c): TransportInit{node_id, transport, regions (the
 * receiver's answer), addr: the transport's blob, carried unread} */
kvt_status_t kvt_hs_encode(kvt_engine_t *e, const void *blob, size_t len, int with_regions,
                           void **out, size_t *out_len);
/* a peer's: decoded and checked (node id, our transport, an address blob); <m> is cleared
 * on error */
kvt_status_t kvt_hs_decode(kvt_engine_t *e, const void *data, size_t len, kvt_msg_t *m,
                           kvt_msg_err_t *err);
/* <peer> runs the handshake from the source <src> (kvt_guard_src_key): when that source keeps
 * transfer_max_peers_per_addr other node ids handshaken, its least recent one is forgotten
 * first (progress thread). */
void kvt_hs_note_peer(kvt_engine_t *e, const char *src, const char *peer);
void kvt_hs_fini(kvt_engine_t *e);

/* flows */
void kvt_flow_sender_submit(kvt_engine_t *e, kvt_sreq_t *r);
void kvt_flow_sender_route(kvt_engine_t *e, kvt_sreq_t *r, const char *host, uint16_t port,
                           uint16_t init_port);
/* the engine-level sender timers (kvt_engine_create) */
void kvt_flow_sender_init(kvt_engine_t *e);
/* every progress turn: peers with queued work (a completion queued a landing echo) send it */
void kvt_flow_sender_kick_all(kvt_engine_t *e);
/* drain the peers' DEALER sockets */
void kvt_flow_sender_poll(kvt_engine_t *e);
/* fire-and-forget message on the DEALER of receiver host:alloc_port */
void kvt_flow_sender_notify(kvt_engine_t *e, const char *host, uint16_t port, const kvt_msg_t *m);
void kvt_flow_sender_on_reply(kvt_engine_t *e, kvt_speer_t *p, const void *data, size_t len);
void kvt_flow_sender_on_hs_reply(kvt_engine_t *e, kvt_speer_t *p, const void *data, size_t len);
void kvt_flow_sender_on_write_done(kvt_engine_t *e, kvt_sreq_t *r, kvt_status_t st);
void kvt_flow_sender_on_done_sock(kvt_engine_t *e, const void *data, size_t len);
void kvt_flow_sender_cancel(kvt_engine_t *e, const char *req_id);
void kvt_flow_sender_peer_failed(kvt_engine_t *e, const char *peer_id);
void kvt_flow_sender_fini(kvt_engine_t *e);
void kvt_sreq_free(kvt_sreq_t *r);

/* <peer_addr>: the IP address it came from ("" if none), who it counts as (pd_alloc_quota) */
void kvt_flow_recv_on_router(kvt_engine_t *e, void *ident, size_t ident_len, int delim,
                             const void *data, size_t len, const char *peer_addr);
void kvt_flow_recv_on_init(kvt_engine_t *e, void *ident, size_t ident_len, int delim,
                           const void *data, size_t len, const char *peer_addr);
/* the engine-level receiver timers (kvt_engine_create) */
void kvt_flow_recv_init(kvt_engine_t *e);
/* every progress turn: the first parked request tries again (pages may have been freed) and
 * the timers whose due time other threads lowered are armed */
void kvt_flow_recv_turn(kvt_engine_t *e);
void kvt_flow_recv_on_read_done(kvt_engine_t *e, kvt_rread_t *rd, kvt_status_t st);
void kvt_flow_recv_cancel(kvt_engine_t *e, const char *req_id, int forward);
void kvt_flow_recv_fini(kvt_engine_t *e);
void kvt_rent_free_locked(kvt_engine_t *e, kvt_rent_t *r);

/* Unclaimed receiver allocations (kvt_alloc_guard.c): the expiry of what nobody wrote or
 * claimed within pd_alloc_ttl, and the per-sender quota pd_alloc_quota. The *_locked ones
 * run under rx_lock. */
/* create, once the pool exists: the TTL, the quota in pages, the table, the timer */
kvt_status_t kvt_guard_init(kvt_engine_t *e);
void kvt_guard_fini(kvt_engine_t *e); /* after every entry was freed */
/* The key a request from <peer_addr> (its Peer-Address, "" if none) counts under; <name> (the
 * routing id's sender part) names it when there is no address. */
void kvt_guard_src_key(const kvt_engine_t *e, const char *peer_addr, const char *name, char *out,
                       size_t cap);
/* Pages the sender <src> may still allocate (UINT32_MAX: no quota, pd_alloc_quota 1). */
uint32_t kvt_guard_room_locked(kvt_engine_t *e, const char *src);
/* A new entry of <src>: counted against it, and queued to expire a TTL from now. */
void kvt_guard_track_locked(kvt_engine_t *e, kvt_rent_t *r, const char *src);
/* Its bytes landed: the consumer gets a whole TTL from now to claim it. */
void kvt_guard_renew_locked(kvt_engine_t *e, kvt_rent_t *r);
/* The consumer took it (lookup, load), or it is freed: no longer the sender's, never expires. */
void kvt_guard_claim_locked(kvt_engine_t *e, kvt_rent_t *r);
/* When the expiry timer is due: the queue head's deadline, at most one batch a second
 * (UINT64_MAX: nothing queued). */
uint64_t kvt_guard_due(const kvt_engine_t *e);
/* The expiry timer: frees what is due (kvt_alloc_expired_total, one log line per batch). */
void kvt_guard_on_timer(pdb_timer_t *t, uint64_t now);

void kvt_flow_delay_start(kvt_engine_t *e, kvt_load_job_t *job);
void kvt_flow_delay_on_read_done(kvt_engine_t *e, kvt_load_job_t *job, kvt_status_t st);
void kvt_flow_delay_fini(kvt_engine_t *e);

#endif /* KVT_ENGINE_INT_H */
