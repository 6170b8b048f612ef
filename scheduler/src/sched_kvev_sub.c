/*
 * KV-event subscriber: one ZeroMQ SUB socket per instance, connected to
 * the engine's publisher (vLLM binds a wildcard address; we connect), plus an
 * optional DEALER to its replay ROUTER.
 *
 * Wire (vllm/distributed/kv_events.py, ZmqEventPublisher): each message
 * is [topic, seq as 8-byte big-endian, msgpack payload]; seq counts from 0
 * per publisher process, so a seq lower than expected means the engine
 * restarted and its cache is gone. A replay request is [empty, start seq]
 * from a DEALER (the ROUTER sees [id, empty, seq]); the answers are
 * [empty, seq, payload] for every buffered batch from start seq on, then
 * [empty, seq = -1, empty]. Some versions add the topic before seq; both
 * are accepted.
 *
 * While a replay is outstanding live messages are dropped: the replay
 * brings them back, and a batch published after the replay was served
 * shows up as one more gap, answered by one more replay.
 *
 * Messages are bounded (kv_events_max_message_bytes, ZMQ_MAXMSGSIZE on both
 * sockets): ZeroMQ reads a frame's length first and drops a connection that
 * announces more, as a protocol error, without allocating the frame; and it
 * does not reconnect after a protocol error. A socket monitor sees the
 * disconnect (of any cause: an engine restart too) and the sockets are opened
 * again, so one bad frame cannot silence an engine's events for good.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "sched_int.h"
#include "sched_kvev_int.h"
#include "pdb/pdb_clock.h"

#define REPLAY_TIMEOUT_MS 1000
/* A SUB joins asynchronously: what the engine publishes after the first
 * replay was answered but before the SUB is connected reaches nobody, and no
 * later event may come to reveal the gap. One more replay from where we are,
 * this long after joining, closes that window. */
#define CATCHUP_DELAY_MS 1000
#define MAX_FRAMES       4
/* Messages ZeroMQ queues for us per socket (ZMQ_RCVHWM; its default is 1000). Beyond it ZeroMQ
 * stops reading the connection and the kernel's socket buffers hold the rest, plenty for an
 * engine's ordinary batches of a few KiB; what the publisher then drops shows as a gap and is
 * replayed. 16 keeps what a publisher can make us hold to 16 messages of the bound each. */
#define KVEV_RCVHWM 16

typedef struct sub_conn {
    uint64_t uid;
    int slot;
    void *sub, *replay;
    void *mon[2]; /* PAIRs reading the disconnects of sub and replay (socket monitors) */
    bool reopen;  /* a monitored socket lost its connection: open both again */
    bool reopen_logged;
    char *endpoint, *replay_endpoint;
    bool have_seq;
    uint64_t next_seq;  /* next seq to apply (live or replayed) */
    uint64_t live_next; /* 1 + last seq seen on the SUB socket itself */
    bool replaying;
    bool want_replay;       /* catch up from seq 0 once connected */
    uint64_t catchup_at_ms; /* the second catch-up replay is due (0: done) */
    uint64_t replay_deadline_ms;
    uint64_t replay_from; /* where the replay in flight started */
    bool replay_again;    /* this replay re-asks for what came during the last one */
    bool removed;
    bool have_pub_id;         /* a 24-byte sequence frame named the publisher */
    unsigned char pub_id[16]; /* ... this one (a new one: the engine restarted) */
    /* Silence (sub->mu): the last message, the first request routed to it since then. */
    uint64_t joined_ms, last_msg_ms; /* last_msg_ms 0: none yet */
    uint64_t first_routed_ms;        /* 0: none since the last message */
    uint64_t routed;                 /* requests routed since the last message */
    bool silent;                     /* warned, not yet resumed */
} sub_conn_t;

struct sched_kvev_sub {
    sched_kvev_index_t *idx;
    sched_log_fn log;
    void *log_arg;
    void *ctx;
    pthread_mutex_t mu; /* conns[] membership (add/remove from other threads) */
    sub_conn_t **conns;
    size_t n_conns, cap_conns;
    pthread_t thread;
    bool started;
    _Atomic bool stopping;
    _Atomic int replay_timeout_ms;
    _Atomic int catchup_delay_ms; /* < 0: no second catch-up replay */
    int64_t max_msg;              /* ZMQ_MAXMSGSIZE of every socket */
    uint64_t silence_ms;          /* kv_events_silence_ms */
    sched_clock_fn clock;         /* silence timing; NULL: monotonic */
    void *clock_arg;
    _Atomic uint64_t messages, events, gaps, replays, replays_done, replay_failed, restarts,
        cleared, bad, reconnects, lag_ms;
};

static uint64_t now_ms(void)
{
    return pdb_clock_mono_ms();
}

#define SILENCE_MS 30000

static uint64_t silence_now(const sched_kvev_sub_t *sub)
{
    return sub->clock ? sub->clock(sub->clock_arg) : pdb_clock_mono_ms();
}

static void logf_(sched_kvev_sub_t *sub, sched_log_level_t lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(sched_kvev_sub_t *sub, sched_log_level_t lvl, const char *fmt, ...)
{
    char buf[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (sub->log)
        sub->log(sub->log_arg, lvl, buf);
    else if (lvl >= SCHED_LOG_WARN)
        fprintf(stderr, "pdsched: %s\n", buf);
}

sched_status_t sched_kvev_sub_create(sched_kvev_index_t *idx, size_t max_msg_bytes,
                                     sched_log_fn log, void *log_arg, sched_kvev_sub_t **out)
{
    sched_kvev_sub_t *sub = sched_calloc(1, sizeof(*sub));

    if (!sub)
        return SCHED_ERR_NO_MEMORY;
    sub->idx = idx;
    sub->max_msg = max_msg_bytes ? (int64_t)max_msg_bytes : (int64_t)SCHED_KVEV_MAX_MSG_BYTES;
    sub->log = log;
    sub->log_arg = log_arg;
    atomic_store(&sub->replay_timeout_ms, REPLAY_TIMEOUT_MS);
    atomic_store(&sub->catchup_delay_ms, CATCHUP_DELAY_MS);
    sub->silence_ms = SILENCE_MS;
    sub->ctx = zmq_ctx_new();
    if (!sub->ctx || pthread_mutex_init(&sub->mu, NULL) != 0) {
        if (sub->ctx)
            zmq_ctx_term(sub->ctx);
        sched_free(sub);
        return SCHED_ERR_NO_MEMORY;
    }
    *out = sub;
    return SCHED_OK;
}

static void conn_close(sub_conn_t *c)
{
    void *socks[2] = {c->sub, c->replay};
    for (int i = 0; i < 2; i++) {
        if (socks[i] && c->mon[i])
            zmq_socket_monitor(socks[i], NULL, 0);
        if (c->mon[i])
            zmq_close(c->mon[i]);
        c->mon[i] = NULL;
        if (socks[i])
            zmq_close(socks[i]);
    }
    c->sub = c->replay = NULL;
}

/* Watch <sock>'s disconnects on a PAIR of its own (NULL when monitoring is unavailable:
 * the socket then works, only without the reopening). */
static void *monitor_open(sched_kvev_sub_t *sub, sub_conn_t *c, void *sock, int which)
{
    /* A name of its own each time: a stopped monitor may still hold its old one. */
    static _Atomic uint64_t serial;
    char ep[96];
    int zero = 0;
    void *pair;
    snprintf(ep, sizeof(ep), "inproc://pdsched-kvev-mon-%p-%d-%llu", (void *)c, which,
             (unsigned long long)atomic_fetch_add(&serial, 1));
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_DISCONNECTED) != 0)
        return NULL;
    pair = zmq_socket(sub->ctx, ZMQ_PAIR);
    if (pair == NULL)
        return NULL;
    zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_connect(pair, ep) != 0) {
        zmq_close(pair);
        return NULL;
    }
    return pair;
}

static void conn_free(sub_conn_t *c)
{
    conn_close(c);
    sched_free(c->endpoint);
    sched_free(c->replay_endpoint);
    sched_free(c);
}

static sched_status_t conn_open(sched_kvev_sub_t *sub, sub_conn_t *c)
{
    int zero = 0, hwm = KVEV_RCVHWM;
    int64_t maxmsg = sub->max_msg;

    c->sub = zmq_socket(sub->ctx, ZMQ_SUB);
    if (!c->sub)
        return SCHED_ERR_IO;
    zmq_setsockopt(c->sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(c->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    zmq_setsockopt(c->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(c->sub, ZMQ_SUBSCRIBE, "", 0);
    c->mon[0] = monitor_open(sub, c, c->sub, 0);
    if (zmq_connect(c->sub, c->endpoint) != 0) {
        logf_(sub, SCHED_LOG_WARN, "kv events: cannot connect to %s: %s", c->endpoint,
              zmq_strerror(zmq_errno()));
        return SCHED_ERR_INVALID;
    }
    if (c->replay_endpoint) {
        c->replay = zmq_socket(sub->ctx, ZMQ_DEALER);
        if (!c->replay)
            return SCHED_ERR_IO;
        zmq_setsockopt(c->replay, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(c->replay, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        zmq_setsockopt(c->replay, ZMQ_RCVHWM, &hwm, sizeof(hwm));
        c->mon[1] = monitor_open(sub, c, c->replay, 1);
        if (zmq_connect(c->replay, c->replay_endpoint) != 0) {
            logf_(sub, SCHED_LOG_WARN, "kv events: cannot connect to replay %s: %s",
                  c->replay_endpoint, zmq_strerror(zmq_errno()));
            return SCHED_ERR_INVALID;
        }
    }
    return SCHED_OK;
}

sched_status_t sched_kvev_sub_add(sched_kvev_sub_t *sub, uint64_t uid, const char *endpoint,
                                  const char *replay)
{
    sub_conn_t *c;
    sched_status_t st;

    if (!endpoint || !*endpoint)
        return SCHED_ERR_INVALID;
    pthread_mutex_lock(&sub->mu);
    for (size_t i = 0; i < sub->n_conns; i++)
        if (sub->conns[i]->uid == uid && !sub->conns[i]->removed) {
            pthread_mutex_unlock(&sub->mu);
            return SCHED_OK;
        }
    if (sub->n_conns == sub->cap_conns) {
        size_t cap = sub->cap_conns ? sub->cap_conns * 2 : 8;
        sub_conn_t **n = sched_realloc(sub->conns, cap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&sub->mu);
            return SCHED_ERR_NO_MEMORY;
        }
        sub->conns = n;
        sub->cap_conns = cap;
    }
    c = sched_calloc(1, sizeof(*c));
    if (!c) {
        pthread_mutex_unlock(&sub->mu);
        return SCHED_ERR_NO_MEMORY;
    }
    c->uid = uid;
    c->slot = sched_kvev_index_slot(sub->idx, uid);
    c->endpoint = sched_strdup(endpoint);
    c->replay_endpoint = replay && *replay ? sched_strdup(replay) : NULL;
    if (c->slot < 0) {
        logf_(sub, SCHED_LOG_WARN, "kv events: more than %d instances publish; %s ignored",
              SCHED_KVEV_MAX_SLOTS, endpoint);
        st = SCHED_ERR_NO_MEMORY;
        goto err_free;
    }
    if (!c->endpoint || (replay && *replay && !c->replay_endpoint)) {
        st = SCHED_ERR_NO_MEMORY;
        goto err_free;
    }
    st = conn_open(sub, c);
    if (st != SCHED_OK)
        goto err_free;
    /* A SUB misses what was published before it joined: ask the replay
     * buffer for everything so the blocks already cached are known. */
    c->want_replay = c->replay != NULL;
    int delay = atomic_load(&sub->catchup_delay_ms);
    c->catchup_at_ms = c->replay != NULL && delay >= 0 ? now_ms() + (uint64_t)delay : 0;
    c->joined_ms = silence_now(sub);
    sub->conns[sub->n_conns++] = c;
    pthread_mutex_unlock(&sub->mu);
    return SCHED_OK;

err_free:
    if (c->slot >= 0)
        sched_kvev_index_clear(sub->idx, c->slot, true);
    conn_free(c);
    pthread_mutex_unlock(&sub->mu);
    return st;
}

void sched_kvev_sub_remove(sched_kvev_sub_t *sub, uint64_t uid)
{
    /* Sockets belong to the polling thread: mark, it closes them. */
    pthread_mutex_lock(&sub->mu);
    for (size_t i = 0; i < sub->n_conns; i++)
        if (sub->conns[i]->uid == uid)
            sub->conns[i]->removed = true;
    pthread_mutex_unlock(&sub->mu);
}

static void reap_removed(sched_kvev_sub_t *sub)
{
    size_t j = 0;

    for (size_t i = 0; i < sub->n_conns; i++) {
        sub_conn_t *c = sub->conns[i];
        if (c->removed) {
            sched_kvev_index_clear(sub->idx, c->slot, true);
            conn_free(c);
        } else {
            sub->conns[j++] = c;
        }
    }
    sub->n_conns = j;
}

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Receive one multipart message into <frames> (at most MAX_FRAMES kept). */
static int recv_multipart(void *sock, zmq_msg_t *frames, int *n_out)
{
    int n = 0, more = 1, total = 0;

    while (more) {
        zmq_msg_t tmp, *m = n < MAX_FRAMES ? &frames[n] : &tmp;
        size_t sz = sizeof(more);
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&frames[i]);
            return -1;
        }
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
        if (m == &tmp)
            zmq_msg_close(m);
        else
            n++;
        total++;
    }
    *n_out = total > MAX_FRAMES ? MAX_FRAMES + 1 : n;
    return 0;
}

static void apply_payload(sched_kvev_sub_t *sub, sub_conn_t *c, const void *buf, size_t len)
{
    sched_kvev_batch_t b;
    char err[128];

    if (sched_kvev_decode(buf, len, &b, err, sizeof(err)) != SCHED_OK) {
        atomic_fetch_add(&sub->bad, 1);
        logf_(sub, SCHED_LOG_DEBUG, "kv events from %s: %s", c->endpoint, err);
        return;
    }
    for (size_t i = 0; i < b.n_events; i++) {
        sched_kvev_index_apply(sub->idx, c->slot, &b.events[i]);
        if (b.events[i].kind == SCHED_KVEV_CLEARED)
            atomic_fetch_add(&sub->cleared, 1);
    }
    {
        struct timespec ts;
        double now;
        clock_gettime(CLOCK_REALTIME, &ts);
        now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
        atomic_store(&sub->lag_ms, now > b.ts ? (uint64_t)((now - b.ts) * 1000.0) : 0);
    }
    atomic_fetch_add(&sub->messages, 1);
    atomic_fetch_add(&sub->events, b.n_events);
    sched_kvev_batch_free(&b);
}

static void request_replay(sched_kvev_sub_t *sub, sub_conn_t *c, uint64_t from)
{
    unsigned char seq[8];

    for (int i = 0; i < 8; i++)
        seq[i] = (unsigned char)(from >> (56 - 8 * i));
    if (zmq_send(c->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(c->replay, seq, 8, ZMQ_DONTWAIT) < 0) {
        atomic_fetch_add(&sub->replay_failed, 1);
        return;
    }
    atomic_fetch_add(&sub->replays, 1);
    c->replaying = true;
    c->replay_from = from;
    c->replay_deadline_ms = now_ms() + (uint64_t)atomic_load(&sub->replay_timeout_ms);
}

/* A message came from <c>'s publisher (a batch, an empty one, a replay answer). */
static void saw_message(sched_kvev_sub_t *sub, sub_conn_t *c)
{
    uint64_t now = silence_now(sub), quiet;
    bool resumed;

    pthread_mutex_lock(&sub->mu);
    quiet = now - (c->last_msg_ms ? c->last_msg_ms : c->joined_ms);
    resumed = c->silent;
    c->silent = false;
    c->last_msg_ms = now ? now : 1;
    c->first_routed_ms = 0;
    c->routed = 0;
    pthread_mutex_unlock(&sub->mu);
    if (resumed)
        logf_(sub, SCHED_LOG_INFO, "kv events from %s resumed after %.1f s of silence", c->endpoint,
              (double)quiet / 1000.0);
}

/* A 24-byte sequence frame (vLLM's publisher with a snapshot endpoint, docs/features/
 * kv_events.md: 8-byte sequence, then the 16-byte identity of the publisher's lifetime):
 * true when it names another publisher than the last one did. */
static bool new_publisher(sub_conn_t *c, zmq_msg_t *seq_frame)
{
    const unsigned char *id = (const unsigned char *)zmq_msg_data(seq_frame) + 8;
    bool changed;

    if (zmq_msg_size(seq_frame) != 24)
        return false;
    changed = c->have_pub_id && memcmp(c->pub_id, id, 16) != 0;
    memcpy(c->pub_id, id, 16);
    c->have_pub_id = true;
    return changed;
}

static void on_live(sched_kvev_sub_t *sub, sub_conn_t *c)
{
    zmq_msg_t f[MAX_FRAMES];
    int n;
    uint64_t seq;

    if (recv_multipart(c->sub, f, &n) != 0)
        return;
    if (n != 3 || (zmq_msg_size(&f[1]) != 8 && zmq_msg_size(&f[1]) != 24)) {
        atomic_fetch_add(&sub->bad, 1);
        goto out;
    }
    saw_message(sub, c);
    seq = be64(zmq_msg_data(&f[1]));
    if (new_publisher(c, &f[1]) || seq < c->live_next) {
        /* The live stream itself went back: a new publisher process, an
         * empty cache. */
        atomic_fetch_add(&sub->restarts, 1);
        logf_(sub, SCHED_LOG_INFO, "kv events: %s restarted (seq %llu after %llu)", c->endpoint,
              (unsigned long long)seq, (unsigned long long)c->live_next - 1);
        sched_kvev_index_clear(sub->idx, c->slot, false);
        c->have_seq = false;
        c->replaying = false;
    }
    c->live_next = seq + 1;
    if (c->replaying)
        goto out; /* the replay brings it */
    if (c->have_seq && seq < c->next_seq)
        goto out; /* already applied from a replay */
    /* The first message seen may not be seq 0 (we joined late): with a
     * replay endpoint, ask for what the engine still buffers so the blocks
     * it already holds are known. */
    if ((c->have_seq && seq > c->next_seq) || (!c->have_seq && seq > 0)) {
        if (c->have_seq)
            atomic_fetch_add(&sub->gaps, 1);
        if (c->replay) {
            request_replay(sub, c, c->have_seq ? c->next_seq : 0);
            if (c->replaying)
                goto out;
        }
    }
    apply_payload(sub, c, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    c->have_seq = true;
    c->next_seq = seq + 1;
    c->reopen_logged = false;
out:
    for (int i = 0; i < n && i < MAX_FRAMES; i++)
        zmq_msg_close(&f[i]);
}

static void on_replay(sched_kvev_sub_t *sub, sub_conn_t *c)
{
    zmq_msg_t f[MAX_FRAMES];
    int n, s;
    uint64_t seq;

    if (recv_multipart(c->replay, f, &n) != 0)
        return;
    /* [empty, seq, payload] or [empty, topic, seq, payload] */
    s = n == 3 ? 1 : n == 4 ? 2 : -1;
    if (s < 0 || zmq_msg_size(&f[0]) != 0 ||
        (zmq_msg_size(&f[s]) != 8 && zmq_msg_size(&f[s]) != 24)) {
        atomic_fetch_add(&sub->bad, 1);
        goto out;
    }
    saw_message(sub, c);
    seq = be64(zmq_msg_data(&f[s]));
    if (seq == UINT64_MAX) { /* -1: end of replay */
        uint64_t upto = c->have_seq ? c->next_seq : 0;
        c->replaying = false;
        atomic_fetch_add(&sub->replays_done, 1);
        /* Live messages that came while replaying were left to the replay, but the engine
         * may have answered from a buffer taken before they were published: ask again from
         * where the replay stopped, or they are lost until a later event shows the gap. A
         * re-ask that brought nothing is not repeated (the engine no longer buffers them). */
        if (c->live_next > upto && !(c->replay_again && upto == c->replay_from)) {
            request_replay(sub, c, upto);
            c->replay_again = true;
        } else {
            c->replay_again = false;
        }
        goto out;
    }
    if (c->have_seq && seq < c->next_seq)
        goto out; /* already applied */
    if (c->have_seq && seq > c->next_seq)
        atomic_fetch_add(&sub->gaps, 1); /* no longer buffered: lost for good */
    apply_payload(sub, c, zmq_msg_data(&f[s + 1]), zmq_msg_size(&f[s + 1]));
    c->have_seq = true;
    c->next_seq = seq + 1;
out:
    for (int i = 0; i < n && i < MAX_FRAMES; i++)
        zmq_msg_close(&f[i]);
}

/* A monitor says its socket lost the connection: drain the events, mark the reopening. */
static void on_monitor(sub_conn_t *c, void *pair)
{
    zmq_msg_t f[MAX_FRAMES];
    int n;
    while (recv_multipart(pair, f, &n) == 0) {
        for (int i = 0; i < n && i < MAX_FRAMES; i++)
            zmq_msg_close(&f[i]);
        c->reopen = true;
    }
}

/* Open the sockets of <c> again after a lost connection. What was published meanwhile shows
 * as a gap on the next live message, which asks the replay for it. */
static void conn_reopen(sched_kvev_sub_t *sub, sub_conn_t *c)
{
    c->reopen = false;
    c->replaying = false;
    conn_close(c);
    if (!c->reopen_logged)
        logf_(sub, SCHED_LOG_WARN,
              "kv events: connection to %s lost (engine restart, a message over %lld bytes or "
              "a protocol error); connecting again",
              c->endpoint, (long long)sub->max_msg);
    c->reopen_logged = true;
    atomic_fetch_add(&sub->reconnects, 1);
    if (conn_open(sub, c) != SCHED_OK)
        logf_(sub, SCHED_LOG_WARN, "kv events: cannot open %s again", c->endpoint);
}

void sched_kvev_sub_poll(sched_kvev_sub_t *sub, int timeout_ms)
{
    zmq_pollitem_t items[4 * SCHED_KVEV_MAX_SLOTS];
    sub_conn_t *owner[4 * SCHED_KVEV_MAX_SLOTS];
    int n = 0;
    uint64_t now, next_silence;

    next_silence = sched_kvev_sub_check_silence(sub);
    if (next_silence < (uint64_t)timeout_ms)
        timeout_ms = (int)next_silence;
    pthread_mutex_lock(&sub->mu);
    reap_removed(sub);
    now = now_ms();
    for (size_t i = 0; i < sub->n_conns && n + 4 <= (int)(sizeof(items) / sizeof(items[0])); i++) {
        sub_conn_t *c = sub->conns[i];
        if (c->reopen)
            conn_reopen(sub, c);
        if (c->sub == NULL)
            continue;
        if (c->replaying && now >= c->replay_deadline_ms) {
            /* No answer: take live messages again, as they come. */
            c->replaying = false;
            atomic_fetch_add(&sub->replay_failed, 1);
            logf_(sub, SCHED_LOG_WARN, "kv events: replay from %s timed out", c->replay_endpoint);
        }
        if (c->want_replay) {
            c->want_replay = false;
            request_replay(sub, c, 0);
        }
        if (c->catchup_at_ms != 0 && !c->replaying) {
            if (now >= c->catchup_at_ms) {
                c->catchup_at_ms = 0;
                request_replay(sub, c, c->next_seq);
            } else if ((int)(c->catchup_at_ms - now) < timeout_ms) {
                timeout_ms = (int)(c->catchup_at_ms - now);
            }
        }
        if (c->replaying && (int)(c->replay_deadline_ms - now) < timeout_ms)
            timeout_ms = (int)(c->replay_deadline_ms - now);
        items[n] = (zmq_pollitem_t){.socket = c->sub, .events = ZMQ_POLLIN};
        owner[n++] = c;
        if (c->replay) {
            items[n] = (zmq_pollitem_t){.socket = c->replay, .events = ZMQ_POLLIN};
            owner[n++] = c;
        }
        for (int m = 0; m < 2; m++)
            if (c->mon[m]) {
                items[n] = (zmq_pollitem_t){.socket = c->mon[m], .events = ZMQ_POLLIN};
                owner[n++] = c;
            }
    }
    pthread_mutex_unlock(&sub->mu);
    /* Sockets are only closed by this thread (reap_removed), so polling
     * them without the lock is safe. */
    if (n == 0) {
        struct timespec ts = {.tv_sec = timeout_ms / 1000,
                              .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return;
    }
    if (zmq_poll(items, n, timeout_ms) <= 0)
        return;
    for (int i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN))
            continue;
        if (items[i].socket == owner[i]->mon[0] || items[i].socket == owner[i]->mon[1]) {
            on_monitor(owner[i], items[i].socket);
            continue;
        }
        /* Drain what is queued, bounded so one chatty engine cannot starve. */
        for (int k = 0; k < 256; k++) {
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(items[i].socket, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
            if (items[i].socket == owner[i]->sub)
                on_live(sub, owner[i]);
            else
                on_replay(sub, owner[i]);
        }
    }
}

static void *sub_thread(void *arg)
{
    sched_kvev_sub_t *sub = arg;
    while (!atomic_load(&sub->stopping))
        sched_kvev_sub_poll(sub, 100);
    return NULL;
}

sched_status_t sched_kvev_sub_start(sched_kvev_sub_t *sub)
{
    if (sub->started)
        return SCHED_ERR_STATE;
    if (pthread_create(&sub->thread, NULL, sub_thread, sub) != 0)
        return SCHED_ERR_IO;
    sub->started = true;
    return SCHED_OK;
}

void sched_kvev_sub_set_timing(sched_kvev_sub_t *sub, int replay_timeout_ms, int catchup_delay_ms)
{
    atomic_store(&sub->replay_timeout_ms,
                 replay_timeout_ms > 0 ? replay_timeout_ms : REPLAY_TIMEOUT_MS);
    atomic_store(&sub->catchup_delay_ms, catchup_delay_ms);
}

void sched_kvev_sub_destroy(sched_kvev_sub_t *sub)
{
    if (!sub)
        return;
    atomic_store(&sub->stopping, true);
    if (sub->started)
        pthread_join(sub->thread, NULL);
    for (size_t i = 0; i < sub->n_conns; i++)
        conn_free(sub->conns[i]);
    sched_free(sub->conns);
    zmq_ctx_term(sub->ctx);
    pthread_mutex_destroy(&sub->mu);
    sched_free(sub);
}

void sched_kvev_sub_stats(sched_kvev_sub_t *sub, sched_kvev_sub_stats_t *out)
{
    *out = (sched_kvev_sub_stats_t){.messages = atomic_load(&sub->messages),
                                    .events = atomic_load(&sub->events),
                                    .gaps = atomic_load(&sub->gaps),
                                    .replays = atomic_load(&sub->replays),
                                    .replays_done = atomic_load(&sub->replays_done),
                                    .replay_failed = atomic_load(&sub->replay_failed),
                                    .restarts = atomic_load(&sub->restarts),
                                    .cleared = atomic_load(&sub->cleared),
                                    .bad_messages = atomic_load(&sub->bad),
                                    .reconnects = atomic_load(&sub->reconnects),
                                    .lag_ms = atomic_load(&sub->lag_ms)};
}

void sched_kvev_sub_set_silence(sched_kvev_sub_t *sub, uint64_t silence_ms, sched_clock_fn clock,
                                void *clock_arg)
{
    pthread_mutex_lock(&sub->mu);
    sub->silence_ms = silence_ms ? silence_ms : SILENCE_MS;
    sub->clock = clock;
    sub->clock_arg = clock_arg;
    pthread_mutex_unlock(&sub->mu);
}

void sched_kvev_sub_note_routed(sched_kvev_sub_t *sub, uint64_t uid)
{
    uint64_t now = silence_now(sub);

    pthread_mutex_lock(&sub->mu);
    for (size_t i = 0; i < sub->n_conns; i++) {
        sub_conn_t *c = sub->conns[i];
        if (c->uid != uid || c->removed)
            continue;
        if (c->first_routed_ms == 0)
            c->first_routed_ms = now ? now : 1;
        c->routed++;
    }
    pthread_mutex_unlock(&sub->mu);
}

#define SILENT_LOG_MAX 8

uint64_t sched_kvev_sub_check_silence(sched_kvev_sub_t *sub)
{
    struct {
        char endpoint[200];
        uint64_t routed, quiet_ms;
        bool ever;
    } warn[SILENT_LOG_MAX];
    size_t n_warn = 0;
    uint64_t now = silence_now(sub), next = UINT64_MAX;

    pthread_mutex_lock(&sub->mu);
    for (size_t i = 0; i < sub->n_conns; i++) {
        sub_conn_t *c = sub->conns[i];
        uint64_t due;
        if (c->removed || c->silent || c->first_routed_ms == 0)
            continue;
        due = c->first_routed_ms + sub->silence_ms;
        if (now < due) {
            if (due - now < next)
                next = due - now;
            continue;
        }
        if (n_warn == SILENT_LOG_MAX) {
            next = 0; /* the rest on the next turn */
            break;
        }
        c->silent = true;
        snprintf(warn[n_warn].endpoint, sizeof(warn[n_warn].endpoint), "%s", c->endpoint);
        warn[n_warn].routed = c->routed;
        warn[n_warn].quiet_ms = now - (c->last_msg_ms ? c->last_msg_ms : c->joined_ms);
        warn[n_warn].ever = c->last_msg_ms != 0;
        n_warn++;
    }
    pthread_mutex_unlock(&sub->mu);
    for (size_t i = 0; i < n_warn; i++)
        logf_(sub, SCHED_LOG_WARN,
              "kv events: nothing from %s for %.1f s (%s) although precise-prefix routed %llu "
              "request(s) to it since; its prefix cache is unknown, routing to it is blind "
              "(check its --kv-events-config and kv_events_endpoint)",
              warn[i].endpoint, (double)warn[i].quiet_ms / 1000.0,
              warn[i].ever ? "since its last event" : "no event ever since it joined",
              (unsigned long long)warn[i].routed);
    return next;
}

bool sched_kvev_sub_silence(sched_kvev_sub_t *sub, uint64_t uid, sched_kvev_silence_t *out)
{
    uint64_t now = silence_now(sub);
    bool found = false;

    pthread_mutex_lock(&sub->mu);
    for (size_t i = 0; i < sub->n_conns && !found; i++) {
        const sub_conn_t *c = sub->conns[i];
        uint64_t since;
        if (c->uid != uid || c->removed)
            continue;
        since = c->last_msg_ms ? c->last_msg_ms : c->joined_ms;
        *out = (sched_kvev_silence_t){.silence_ms = now > since ? now - since : 0,
                                      .ever = c->last_msg_ms != 0,
                                      .silent = c->silent,
                                      .routed = c->routed};
        found = true;
    }
    pthread_mutex_unlock(&sub->mu);
    return found;
}
