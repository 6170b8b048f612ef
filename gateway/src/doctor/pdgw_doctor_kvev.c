/*
 * pdgw_doctor_kvev.c - the doctor's KV-events probe: does the engine's publisher take
 * connections, do events arrive, what block size and DP ranks do they carry.
 *
 * vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) binds its PUB socket only when the
 * endpoint has a "*" (the wildcard host), holds "::", or is ipc:// or inproc://; to any
 * other address it *connects*. pdgw's subscriber connects as well, so an engine started with
 * `endpoint: tcp://<its own host>:PORT` leaves nobody listening: pdgw waits forever and the
 * precise-prefix policy routes blind. Nothing listening on the port is therefore the first
 * thing looked at. Each message is read by the scheduler's own reading of it
 * (sched_kvev_summarize, pdsched/kvev.h: the subscriber's framing and decoder), so what the
 * doctor calls undecodable the precise-prefix index drops too. A replay ROUTER answers
 * [empty, start seq] with the buffered batches then seq -1: an idle engine still answers it.
 */
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "pdgw_doctor_int.h"

#define DEFAULT_MAX_MSG (16u << 20)
#define MAX_PARTS       5 /* one more than a message may have: more is refused */

void doc_kvev_seen_add(doc_kv_seen_t *s, sched_kvev_source_t from, sched_status_t st,
                       const sched_kvev_summary_t *sum)
{
    size_t i, kept;
    if (st == SCHED_OK && sum->replay_end) {
        s->replay_end = true;
        return;
    }
    if (from == SCHED_KVEV_FROM_PUB)
        s->live++;
    else
        s->replayed++;
    if (st != SCHED_OK) {
        s->undecodable++;
        snprintf(s->last_error, sizeof(s->last_error), "%s", sum->error);
        return;
    }
    if (sum->dp_rank < 0)
        s->dp_mask |= 1; /* no rank (older vLLM): rank 0 */
    else if (sum->dp_rank < 64)
        s->dp_mask |= (uint64_t)1 << sum->dp_rank;
    else
        s->dp_big = true;
    kept = sum->n_block_sizes < SCHED_KVEV_SUMMARY_SIZES ? sum->n_block_sizes
                                                         : SCHED_KVEV_SUMMARY_SIZES;
    if (sum->n_block_sizes > 1)
        s->mixed = true;
    for (i = 0; i < kept; i++) {
        int bs = (int)sum->block_sizes[i];
        if (s->block_size != 0 && s->block_size != bs)
            s->mixed = true;
        s->block_size = bs;
    }
}

/* Read one multipart message of <sock> into <parts>: how many frames it had (at most
 * MAX_PARTS kept; more are counted as MAX_PARTS, which no message has). */
static int recv_parts(void *sock, zmq_msg_t *parts)
{
    int n = 0, more = 1;
    size_t ml = sizeof(more);
    zmq_msg_t tmp;
    while (more) {
        zmq_msg_t *m = n < MAX_PARTS ? &parts[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            return n;
        }
        if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) != 0)
            more = 0;
        if (n < MAX_PARTS)
            n++;
        else
            zmq_msg_close(m);
    }
    return n;
}

/* One message of <sock> read through the scheduler's own summary of it. */
static void on_message(void *sock, sched_kvev_source_t from, doc_kv_seen_t *s)
{
    zmq_msg_t p[MAX_PARTS];
    sched_kvev_frame_t f[MAX_PARTS];
    sched_kvev_summary_t sum;
    sched_status_t st;
    int n = recv_parts(sock, p), i;
    if (n == 0)
        return;
    for (i = 0; i < n; i++)
        f[i] = (sched_kvev_frame_t){zmq_msg_data(&p[i]), zmq_msg_size(&p[i])};
    st = sched_kvev_summarize(from, f, (size_t)n, &sum);
    doc_kvev_seen_add(s, from, st, &sum);
    for (i = 0; i < n; i++)
        zmq_msg_close(&p[i]);
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

/* Listen for <wait_ms>, or until the stop fd is readable: false then (nothing to judge by). */
static bool listen_events(doc_run_t *run, const doc_target_t *t, doc_kv_seen_t *s)
{
    const char *ep = t->desc->kv_events_endpoint;
    const char *rp = t->desc->kv_events_replay_endpoint;
    uint64_t maxb = run->opts->cfg->kv_events_max_message_bytes;
    int64_t maxmsg = (int64_t)(maxb ? maxb : DEFAULT_MAX_MSG);
    uint64_t end = pdgw_time_mono_ms() + run->opts->events_wait_ms;
    void *ctx = zmq_ctx_new(), *sub = NULL, *dealer = NULL;

    bool stopped = false;

    if (ctx == NULL)
        return true;
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
        if (n_items == 3 && (items[2].revents & ZMQ_POLLIN)) {
            stopped = true;
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            on_message(sub, SCHED_KVEV_FROM_PUB, s);
        if (dealer != NULL && (items[1].revents & ZMQ_POLLIN))
            on_message(dealer, SCHED_KVEV_FROM_REPLAY, s);
        /* enough seen: a replay answered and a live batch came */
        if (s->live > 0 && (dealer == NULL || s->replay_end))
            break;
    }
    if (sub != NULL)
        zmq_close(sub);
    if (dealer != NULL)
        zmq_close(dealer);
    zmq_ctx_term(ctx);
    return !stopped;
}

static void ranks_text(const doc_kv_seen_t *s, char *out, size_t cap)
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

doc_kv_endpoint_t doc_kvev_endpoint(const char *ep, char *host, size_t cap, int *port)
{
    const char *h, *colon;
    char *stop;
    long p;
    if (strncmp(ep, "tcp://", 6) != 0)
        return DOC_KV_EP_OTHER;
    h = ep + 6;
    colon = strrchr(h, ':');
    if (colon == NULL || colon == h)
        return DOC_KV_EP_OTHER;
    if (h[0] == '[' && colon[-1] == ']')
        snprintf(host, cap, "%.*s", (int)(colon - h - 2), h + 1);
    else
        snprintf(host, cap, "%.*s", (int)(colon - h), h);
    p = strtol(colon + 1, &stop, 10);
    if (*stop != '\0' || p <= 0 || p > 65535)
        return DOC_KV_EP_OTHER;
    *port = (int)p;
    /* the wildcards an engine binds (host "*", 0.0.0.0, [::]); pdgw cannot connect to them */
    if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0)
        return DOC_KV_EP_BIND;
    return DOC_KV_EP_TCP;
}
void doc_kvev_verdict(doc_run_t *run, doc_target_t *t, const char *ep, const doc_kv_seen_t *s)
{
    char ranks[256];
    ranks_text(s, ranks, sizeof(ranks));
    t->block_size = s->block_size;
    t->mixed_block_sizes = s->mixed;
    if (s->live + s->replayed == 0 && !s->replay_end)
        doc_row(run, t, "kv-events", PDGW_DOCTOR_WARN,
                "fine if the engine served nothing meanwhile; otherwise check "
                "enable_kv_cache_events and that the endpoint is the engine's PUB port, not "
                "its replay port (set kv_events_replay_endpoint to check an idle engine)",
                "connected to %s, no event within %llu ms", ep,
                (unsigned long long)run->opts->events_wait_ms);
    else if (s->live + s->replayed == 0)
        doc_row(run, t, "kv-events", PDGW_DOCTOR_OK, NULL,
                "publisher up (its replay ROUTER answered, nothing buffered), no event within "
                "%llu ms: idle engine",
                (unsigned long long)run->opts->events_wait_ms);
    else {
        char bsz[48], bad[224] = "";
        if (s->block_size > 0)
            snprintf(bsz, sizeof(bsz), ", block size %d", s->block_size);
        else
            snprintf(bsz, sizeof(bsz), ", no BlockStored yet");
        if (s->undecodable)
            snprintf(bad, sizeof(bad), "; %llu undecodable (%s)",
                     (unsigned long long)s->undecodable, s->last_error);
        doc_row(run, t, "kv-events", s->undecodable ? PDGW_DOCTOR_WARN : PDGW_DOCTOR_OK,
                s->undecodable ? "run a vLLM whose events pdgw decodes (msgpack EventBatch)" : NULL,
                "%llu live + %llu replayed batch(es)%s; DP rank(s) %s%s",
                (unsigned long long)s->live, (unsigned long long)s->replayed, bsz,
                ranks[0] ? ranks : "-", bad);
    }
    if (s->block_size > 0)
        doc_row(run, t, "kv-events block size", s->mixed ? PDGW_DOCTOR_WARN : PDGW_DOCTOR_INFO,
                s->mixed ? "one block size per engine: check the engine's --block-size" : NULL,
                "%s %d", s->mixed ? "several block sizes, the last" : "block size", s->block_size);
    if (t->view.dp_size > 1 && s->dp_mask != 0 && t->view.dp_rank >= 0 && t->view.dp_rank < 64 &&
        !(s->dp_mask & ((uint64_t)1 << t->view.dp_rank)))
        doc_row(run, t, "kv-events DP rank", PDGW_DOCTOR_WARN,
                "vLLM publishes DP rank r on the endpoint's port + r: point kv_events_endpoint "
                "at the port of this instance's rank",
                "the instance is DP rank %d, the events on %s carry rank(s) %s", t->view.dp_rank,
                ep, ranks);
}

void doc_probe_kvev(doc_run_t *run, doc_target_t *t)
{
    const char *ep = t->desc->kv_events_endpoint;
    const pdgw_config_t *cfg = run->opts->cfg;
    /* Only the roles precise-prefix chooses need the instance's events. */
    bool precise = (cfg->prefill_policy == PDGW_POLICY_PRECISE_PREFIX &&
                    (t->desc->role & SCHED_ROLE_PREFILL) != 0) ||
                   (cfg->decode_policy == PDGW_POLICY_PRECISE_PREFIX &&
                    (t->desc->role & SCHED_ROLE_DECODE) != 0);
    doc_kv_seen_t s = {0};
    char host[256], err[512];
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
    switch (doc_kvev_endpoint(ep, host, sizeof(host), &port)) {
    case DOC_KV_EP_BIND:
        doc_row(run, t, "kv-events", PDGW_DOCTOR_ERROR,
                "kv_events_endpoint is where pdgw connects: name the engine's host "
                "(tcp://ENGINE_HOST:PORT); the wildcard belongs in the engine's config",
                "kv_events_endpoint %s is a bind address", ep);
        return;
    case DOC_KV_EP_TCP:
        if (doc_tcp_probe(host, port, run->opts->timeout_ms, err, sizeof(err)) != 0) {
            doc_row(run, t, "kv-events", PDGW_DOCTOR_ERROR, CONNECT_FIX,
                    "nothing listens on %s (%s): no KV event can arrive", ep, err);
            return;
        }
        break;
    case DOC_KV_EP_OTHER:
        break;
    }
    if (run->opts->events_wait_ms == 0) {
        doc_row(run, t, "kv-events", PDGW_DOCTOR_OK, NULL, "%s accepts connections", ep);
        return;
    }
    if (listen_events(run, t, &s))
        doc_kvev_verdict(run, t, ep, &s);
}
