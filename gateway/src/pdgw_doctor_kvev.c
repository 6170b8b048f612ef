/*
 * pdgw_doctor_kvev.c - the doctor's KV-events probe: does the engine's publisher take
 * connections, do events arrive, what block size and DP ranks do they carry.
 *
 * vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) binds its PUB socket only when the
 * endpoint has a "*" (the wildcard host), holds "::", or is ipc:// or inproc://; to any
 * other address it *connects*. pdgw's subscriber connects as well, so an engine started with
 * `endpoint: tcp://<its own host>:PORT` leaves nobody listening: pdgw waits forever and the
 * precise-prefix policy routes blind. Nothing listening on the port is therefore the first
 * thing looked at. The wire: each message is [topic, 8-byte big-endian seq, msgpack batch];
 * the batch a map {ts, events, data_parallel_rank} (array [ts, events, dp_rank] in older
 * vLLM), a BlockStored event carries block_size. A replay ROUTER answers
 * [empty, start seq] with the buffered batches then seq -1: an idle engine still answers it.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <zmq.h>

#include "pdgw_doctor_int.h"
#include "pdgw_util.h"

#define DEFAULT_MAX_MSG (16u << 20)

typedef struct kv_seen {
    uint64_t live, replayed, undecodable;
    bool replay_end;
    int block_size;
    bool mixed;
    uint64_t dp_mask; /* ranks 0..63 seen */
    bool dp_big;      /* a rank >= 64 */
} kv_seen_t;

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key)
{
    uint32_t i;
    if (m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (i = 0; i < m->via.map.size; i++) {
        if (str_is(&m->via.map.ptr[i].key, key))
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

static void saw_block_size(kv_seen_t *s, const msgpack_object *o)
{
    int bs;
    if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > 1u << 20)
        return;
    bs = (int)o->via.u64;
    if (s->block_size != 0 && s->block_size != bs)
        s->mixed = true;
    s->block_size = bs;
}

/* One batch: its DP rank and the block size of its BlockStored events. */
static void decode_batch(kv_seen_t *s, const char *data, size_t len)
{
    msgpack_unpacked u;
    const msgpack_object *b, *events = NULL, *dp = NULL;
    uint32_t i;

    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, data, len, NULL) != MSGPACK_UNPACK_SUCCESS) {
        s->undecodable++;
        msgpack_unpacked_destroy(&u);
        return;
    }
    b = &u.data;
    if (b->type == MSGPACK_OBJECT_ARRAY && b->via.array.size >= 2) {
        events = &b->via.array.ptr[1];
        dp = b->via.array.size >= 3 ? &b->via.array.ptr[2] : NULL;
    } else if (b->type == MSGPACK_OBJECT_MAP) {
        events = map_get(b, "events");
        dp = map_get(b, "data_parallel_rank");
    }
    if (events == NULL || events->type != MSGPACK_OBJECT_ARRAY) {
        s->undecodable++;
        msgpack_unpacked_destroy(&u);
        return;
    }
    if (dp != NULL && dp->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (dp->via.u64 < 64)
            s->dp_mask |= (uint64_t)1 << dp->via.u64;
        else
            s->dp_big = true;
    } else {
        s->dp_mask |= 1; /* no rank: rank 0 */
    }
    for (i = 0; i < events->via.array.size; i++) {
        const msgpack_object *e = &events->via.array.ptr[i];
        if (e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size >= 5 &&
            str_is(&e->via.array.ptr[0], "BlockStored"))
            saw_block_size(s, &e->via.array.ptr[4]); /* tag, hashes, parent, tokens, size */
        else if (e->type == MSGPACK_OBJECT_MAP && map_get(e, "type") != NULL &&
                 str_is(map_get(e, "type"), "BlockStored"))
            saw_block_size(s, map_get(e, "block_size"));
    }
    msgpack_unpacked_destroy(&u);
}

/* Read one multipart message of <sock> into <parts> (up to 4 kept: the last ones). */
static int recv_parts(void *sock, zmq_msg_t *parts, int max)
{
    int n = 0, more = 1;
    size_t ml = sizeof(more);
    zmq_msg_t tmp;
    while (more) {
        zmq_msg_t *m = n < max ? &parts[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            return n;
        }
        if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) != 0)
            more = 0;
        if (n < max)
            n++;
        else
            zmq_msg_close(m);
    }
    return n;
}

static void close_parts(zmq_msg_t *parts, int n)
{
    int i;
    for (i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static void on_live(void *sub, kv_seen_t *s)
{
    zmq_msg_t p[4];
    int n = recv_parts(sub, p, 4);
    if (n >= 2) {
        s->live++;
        decode_batch(s, zmq_msg_data(&p[n - 1]), zmq_msg_size(&p[n - 1]));
    }
    close_parts(p, n);
}

static void on_replay(void *dealer, kv_seen_t *s)
{
    static const unsigned char end_seq[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    zmq_msg_t p[4];
    int n = recv_parts(dealer, p, 4);
    if (n >= 3) {
        zmq_msg_t *seq = &p[n - 2];
        if (zmq_msg_size(seq) == 8 && memcmp(zmq_msg_data(seq), end_seq, 8) == 0)
            s->replay_end = true;
        else {
            s->replayed++;
            decode_batch(s, zmq_msg_data(&p[n - 1]), zmq_msg_size(&p[n - 1]));
        }
    }
    close_parts(p, n);
}

static void *open_sock(void *ctx, int type, const char *ep, int64_t maxmsg)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0;
    if (s == NULL)
        return NULL;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (type == ZMQ_SUB)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(s, ep) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* Listen for <wait_ms> (or until the stop fd is readable). */
static void listen_events(doc_run_t *run, const doc_target_t *t, kv_seen_t *s)
{
    const char *ep = t->desc->kv_events_endpoint;
    const char *rp = t->desc->kv_events_replay_endpoint;
    uint64_t maxb = run->opts->cfg->kv_events_max_message_bytes;
    int64_t maxmsg = (int64_t)(maxb ? maxb : DEFAULT_MAX_MSG);
    uint64_t end = pdgw_time_mono_ms() + run->opts->events_wait_ms;
    void *ctx = zmq_ctx_new(), *sub = NULL, *dealer = NULL;

    if (ctx == NULL)
        return;
    sub = open_sock(ctx, ZMQ_SUB, ep, maxmsg);
    if (rp != NULL && rp[0] != '\0') {
        dealer = open_sock(ctx, ZMQ_DEALER, rp, maxmsg);
        if (dealer != NULL) {
            unsigned char zero_seq[8] = {0};
            zmq_send(dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(dealer, zero_seq, sizeof(zero_seq), ZMQ_DONTWAIT);
        }
    }
    while (sub != NULL) {
        zmq_pollitem_t items[3] = {{sub, 0, ZMQ_POLLIN, 0},
                                   {dealer, 0, ZMQ_POLLIN, 0},
                                   {NULL, run->opts->stop_fd, ZMQ_POLLIN, 0}};
        int n_items = dealer != NULL ? 2 : 1;
        uint64_t now = pdgw_time_mono_ms();
        if (now >= end)
            break;
        if (dealer == NULL) /* keep the stop fd at index 2 */
            items[1] = (zmq_pollitem_t){NULL, -1, 0, 0};
        if (run->opts->stop_fd >= 0)
            n_items = 3;
        if (zmq_poll(items, n_items, (long)(end - now)) < 0)
            break;
        if (n_items == 3 && (items[2].revents & ZMQ_POLLIN))
            break;
        if (items[0].revents & ZMQ_POLLIN)
            on_live(sub, s);
        if (dealer != NULL && (items[1].revents & ZMQ_POLLIN))
            on_replay(dealer, s);
        /* enough seen: a replay answered and a live batch came */
        if (s->live > 0 && (dealer == NULL || s->replay_end))
            break;
    }
    if (sub != NULL)
        zmq_close(sub);
    if (dealer != NULL)
        zmq_close(dealer);
    zmq_ctx_term(ctx);
}

static void ranks_text(const kv_seen_t *s, char *out, size_t cap)
{
    size_t used = 0;
    int r;
    out[0] = '\0';
    for (r = 0; r < 64; r++) {
        if (s->dp_mask & ((uint64_t)1 << r)) {
            int n = snprintf(out + used, cap - used, "%s%d", used ? "," : "", r);
            if (n < 0 || (size_t)n >= cap - used)
                return;
            used += (size_t)n;
        }
    }
    if (s->dp_big && used + 6 < cap)
        snprintf(out + used, cap - used, "%s64+", used ? "," : "");
}

static const char *const CONNECT_FIX =
    "start the engine with --kv-events-config '{\"endpoint\": \"tcp://*:PORT\", ...}' (vLLM binds "
    "only tcp://*:PORT, \"::\" addresses, ipc:// and inproc://; any other address it connects "
    "to, and pdgw connects too, so nobody listens); check the port and that "
    "enable_kv_cache_events is true";

/* tcp://host:port: host and port; false for other transports. */
static bool tcp_parts(const char *ep, char *host, size_t cap, int *port)
{
    const char *h, *colon;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    h = ep + 6;
    colon = strrchr(h, ':');
    if (colon == NULL || colon == h)
        return false;
    if (h[0] == '[' && colon[-1] == ']')
        snprintf(host, cap, "%.*s", (int)(colon - h - 2), h + 1);
    else
        snprintf(host, cap, "%.*s", (int)(colon - h), h);
    *port = atoi(colon + 1);
    return *port > 0;
}

void doc_probe_kvev(doc_run_t *run, doc_target_t *t)
{
    const char *ep = t->desc->kv_events_endpoint;
    const pdgw_config_t *cfg = run->opts->cfg;
    bool precise = cfg->prefill_policy == PDGW_POLICY_PRECISE_PREFIX ||
                   cfg->decode_policy == PDGW_POLICY_PRECISE_PREFIX;
    kv_seen_t s = {0};
    char host[256], err[512], ranks[256];
    int port = 0;

    if (ep == NULL || ep[0] == '\0') {
        if (precise)
            doc_row(run, t, "kv-events", PDGW_DOCTOR_WARN,
                    "set the instance's kv_events_endpoint (the engine's --kv-events-config "
                    "endpoint as seen from pdgw)",
                    "precise-prefix routing without kv_events_endpoint: this instance is "
                    "scored by load only");
        return;
    }
    if (tcp_parts(ep, host, sizeof(host), &port)) {
        if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) {
            doc_row(run, t, "kv-events", PDGW_DOCTOR_ERROR,
                    "kv_events_endpoint is where pdgw connects: name the engine's host "
                    "(tcp://ENGINE_HOST:PORT); the wildcard belongs in the engine's config",
                    "kv_events_endpoint %s is a bind address", ep);
            return;
        }
        if (doc_tcp_probe(host, port, run->opts->timeout_ms, err, sizeof(err)) != 0) {
            doc_row(run, t, "kv-events", PDGW_DOCTOR_ERROR, CONNECT_FIX,
                    "nothing listens on %s (%s): no KV event can arrive", ep, err);
            return;
        }
    }
    if (run->opts->events_wait_ms == 0) {
        doc_row(run, t, "kv-events", PDGW_DOCTOR_OK, NULL, "%s accepts connections", ep);
        return;
    }
    listen_events(run, t, &s);
    ranks_text(&s, ranks, sizeof(ranks));
    t->block_size = s.block_size;
    t->mixed_block_sizes = s.mixed;
    if (s.live + s.replayed == 0 && !s.replay_end)
        doc_row(run, t, "kv-events", PDGW_DOCTOR_WARN,
                "fine if the engine served nothing meanwhile; otherwise check "
                "enable_kv_cache_events and that the endpoint is the engine's PUB port, not "
                "its replay port (set kv_events_replay_endpoint to check an idle engine)",
                "connected to %s, no event within %llu ms", ep,
                (unsigned long long)run->opts->events_wait_ms);
    else if (s.live + s.replayed == 0)
        doc_row(run, t, "kv-events", PDGW_DOCTOR_OK, NULL,
                "publisher up (its replay ROUTER answered, nothing buffered), no event within "
                "%llu ms: idle engine",
                (unsigned long long)run->opts->events_wait_ms);
    else {
        char bsz[48];
        if (s.block_size > 0)
            snprintf(bsz, sizeof(bsz), ", block size %d", s.block_size);
        else
            snprintf(bsz, sizeof(bsz), ", no BlockStored yet");
        doc_row(run, t, "kv-events", s.undecodable ? PDGW_DOCTOR_WARN : PDGW_DOCTOR_OK,
                s.undecodable ? "run a vLLM whose events pdgw decodes (msgpack EventBatch)" : NULL,
                "%llu live + %llu replayed batch(es)%s; DP rank(s) %s%s",
                (unsigned long long)s.live, (unsigned long long)s.replayed, bsz,
                ranks[0] ? ranks : "-", s.undecodable ? "; some batches undecodable" : "");
    }
    if (s.block_size > 0)
        doc_row(run, t, "kv-events block size", s.mixed ? PDGW_DOCTOR_WARN : PDGW_DOCTOR_INFO,
                s.mixed ? "one block size per engine: check the engine's --block-size" : NULL,
                "%sblock size %d", s.mixed ? "several block sizes, last " : "", s.block_size);
    if (t->view.dp_size > 1 && s.dp_mask != 0 && t->view.dp_rank < 64 &&
        !(s.dp_mask & ((uint64_t)1 << t->view.dp_rank)))
        doc_row(run, t, "kv-events DP rank", PDGW_DOCTOR_WARN,
                "vLLM publishes DP rank r on the endpoint's port + r: point kv_events_endpoint "
                "at the port of this instance's rank",
                "the instance is DP rank %d, the events on %s carry rank(s) %s", t->view.dp_rank,
                ep, ranks);
}
