/*
 * The KV thread of a PD instance: libkvt engines (the bytes), the control
 * side channel between instances (ZeroMQ ROUTER on --kv-port of a prefill, or
 * an ephemeral port its HTTP bootstrap server names; DEALERs on a decode; JSON
 * messages), and the state machines of exports (prefill) and imports (decode).
 *
 * Side-channel messages (decode → prefill), one JSON object per frame:
 *   {"op":"pull", "xfer", "mode", "receiver":{host, alloc_ports, init_ports},
 *    "remote_request_id"?, "remote_block_ids"?, "remote_engine_id"?,
 *    "request_id", "prompt_hash", "engine_id"}      read KV a prefill holds
 *   {"op":"register", "key":"tid:<T>"|"room:<R>", "remote_engine_id"?,
 *    "prefill_dp_rank"?, ...same}    parallel rendezvous (the DP rank it expects)
 *   {"op":"compute", "body", "is_chat", ...same}    vllm-kvt batch: compute + push
 *   {"op":"cancel", "xfer"}                         the decode gave up
 *   {"op":"release", "xfer", "remote_request_id", "remote_engine_id"}
 *                                                   the decode refused the request: free
 *                                                   the KV held for it now (no reply)
 * Replies (prefill → decode): {"xfer", "ok", "error"?, "engine_id", "nchunks",
 * "layers_per_key"} (the prefill's unit: whole chunks, or one layer with
 * --layerwise -- the decode names its keys after it);
 * a later {"xfer", "ok":false, "error"} if the transfer fails after that.
 *
 * The KV itself always moves through libkvt: the prefill submits stores (one
 * batch of LMCache chunks per TP rank -- per layer and rank with --layerwise
 * -- with req_id = xfer) to the decode's receiver
 * engine in push or pull mode; the decode waits for the request to land,
 * loads every page, verifies every byte and releases the pages.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <kvt/kvt_engine.h>

#include "sim_pd_int.h"

#define KEY_MAX 512

typedef struct sim_kvt_eng {
    kvt_engine_t *e;
    kvt_engine_ports_t ports;
} sim_kvt_eng_t;

/* Two page sizes: engines that an LMCache peer may talk to -- the receivers on
 * --alloc-port and whoever sends to them (lmcache, vllm-kvt) -- have pages of the
 * larger whole chunk (sim_kv_engine_page_bytes: LMCache's chunk_size tokens by
 * default); the others, pages of one --block-size chunk. Both ends of a libkvt
 * transfer use the same page size.
 * senders[pull][family][rank], family SEND_BLOCK | SEND_LMC | SEND_LMC_PROXY;
 * receivers[lmc_pages * 2 + delay][rank] */
enum { SEND_BLOCK, SEND_LMC, SEND_LMC_PROXY, SEND_FAMS };
static sim_kvt_eng_t *senders[2][SEND_FAMS][SIM_MAX_TP];
static sim_kvt_eng_t *receivers[4][SIM_MAX_TP];
static int main_delay, main_nranks;
static pthread_mutex_t eng_lock = PTHREAD_MUTEX_INITIALIZER;
#define SIM_MAX_ENGINES (2 * SEND_FAMS * SIM_MAX_TP + 4 * SIM_MAX_TP)

static void *zctx, *router;
typedef struct dealer {
    struct dealer *next;
    char ep[160];
    void *sock;
} dealer_t;
static dealer_t *dealers;

typedef struct work {
    struct work *next;
    int type; /* 1 export, 2 import */
    void *p;
} work_t;
static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;
static work_t *work_head, *work_tail;
static int efd = -1;
static pthread_t thread;
static int running;
static atomic_int stopping;

static sim_import_t *imports; /* KV thread only */
static sim_export_t *paced;   /* exports waiting for the link model (engine lock) */
static uint64_t link_free_at; /* --kv-link-gbps: when the link is free again */
static atomic_ullong bad_ctl;

/* pending rendezvous registrations (engine lock) */
typedef struct reg {
    struct reg *next;
    char key[96];
    sim_receiver_t dest;
    char xfer[SIM_XFER_MAX];
    sim_kv_mode_t mode;
    uint8_t ident[64];
    size_t ident_len;
    uint64_t prompt_hash;
    uint64_t expire;
    int eid_rank; /* DP rank whose engine id the decode named; -1 = none named */
} reg_t;
static reg_t *regs;

enum { T_STORE = 1, T_WAIT, T_LOOKUP, T_LOAD };
typedef struct tctx {
    int kind;
    sim_export_t *exp;
    sim_import_t *imp;
    int rank;
    sim_kvt_eng_t *eng;
    uint64_t bytes;
} tctx_t;

/* ---- engines ---- */
static sim_kvt_eng_t *eng_create(int receiver, int pull, int delay, int proxy, int lmc_pages,
                                 int rank, uint16_t alloc_port, uint16_t init_port)
{
    kvt_config_t c;
    kvt_config_err_t err;
    kvt_engine_params_t p;
    kvt_status_t st;
    sim_kvt_eng_t *se = calloc(1, sizeof(*se));
    if (!se)
        return NULL;
    kvt_config_defaults(&c);
    c.pd_role = receiver ? KVT_ROLE_RECEIVER : KVT_ROLE_SENDER;
    /* a page holds a whole LMCache chunk (all layers); a layer-wise push
     * puts one layer in a page, so the buffer keeps --kv-buffer-mb of KV
     * with as many pages as layers allow (mmap'd: untouched bytes cost no
     * memory) */
    c.pd_buffer_size =
        ((uint64_t)sim_cfg.kv_buffer_mb << 20) * (uint64_t)(sim_cfg.layerwise ? sim_cfg.layers : 1);
    c.pd_pull_mode = pull || delay;
    c.pd_delay_pull = delay;
    c.chunk_size = (uint32_t)sim_cfg.lmcache_chunk_size;
    if (receiver && lmc_pages && sim_cfg.lmcache_ascend)
        snprintf(c.pd_peer_flavour, sizeof(c.pd_peer_flavour), "ascend");
    c.pd_alloc_ttl = sim_cfg.kv_alloc_ttl_ms / 1000.0;
    c.pd_alloc_quota = sim_cfg.kv_alloc_quota;
    if (receiver) {
        c.pd_peer_alloc_port.v[0] = alloc_port;
        c.pd_peer_alloc_port.n = 1;
        c.pd_peer_init_port.v[0] = init_port;
        c.pd_peer_init_port.n = 1;
    }
    if (proxy && sim_cfg.proxy_port) {
        snprintf(c.pd_proxy_host, sizeof(c.pd_proxy_host), "%s", sim_cfg.proxy_host);
        c.pd_proxy_port = (uint16_t)sim_cfg.proxy_port;
    }
    snprintf(c.pd_node_id, sizeof(c.pd_node_id), "%s-%s%s%s%s-r%d", sim_cfg.engine_id,
             receiver ? "recv" : "send", lmc_pages ? "" : "-blk", (pull || delay) ? "-pull" : "",
             delay ? "-delay" : "", rank);
    st = kvt_config_validate(&c, &err);
    if (st != KVT_OK) {
        fprintf(stderr, "pdgw-sim: libkvt config %s: %s\n", err.key, err.msg);
        free(se);
        return NULL;
    }
    memset(&p, 0, sizeof(p));
    p.cfg = &c;
    p.page_size = lmc_pages ? sim_kv_engine_page_bytes() : sim_geom.page_bytes;
    p.bind_host = sim_cfg.host;
    p.advertise_host = sim_cfg.kv_host;
    if (proxy && sim_cfg.proxy_port)
        p.on_proxy_notif = sim_pd_proxy_notif_sent; /* kv_proxy_notif_us of the record */
    st = kvt_engine_create(&p, &se->e);
    if (st != KVT_OK) {
        fprintf(stderr, "pdgw-sim: libkvt engine %s: %s\n", c.pd_node_id, kvt_strerror(st));
        free(se);
        return NULL;
    }
    kvt_engine_ports(se->e, &se->ports);
    return se;
}

/* The sender family of a transfer: lmcache (with ProxyNotif when configured), or to a
 * receiver with LMCache-sized pages, or block pages. */
static int send_family(int lmcache, int lmc_pages)
{
    if (lmcache)
        return sim_cfg.proxy_port ? SEND_LMC_PROXY : SEND_LMC;
    return lmc_pages ? SEND_LMC : SEND_BLOCK;
}

static sim_kvt_eng_t *sender_for(sim_kv_mode_t mode, int lmcache, int lmc_pages, int rank)
{
    int pull = mode != SIM_KV_MODE_PUSH;
    int fam = send_family(lmcache, lmc_pages);
    pthread_mutex_lock(&eng_lock);
    sim_kvt_eng_t *s = senders[pull][fam][rank];
    pthread_mutex_unlock(&eng_lock);
    if (s)
        return s;
    s = eng_create(0, pull, 0, fam == SEND_LMC_PROXY, fam != SEND_BLOCK, rank, 0, 0);
    pthread_mutex_lock(&eng_lock);
    senders[pull][fam][rank] = s;
    pthread_mutex_unlock(&eng_lock);
    return s;
}

int sim_pd_receiver(sim_kv_mode_t mode, int nranks, int lmc_pages, sim_receiver_t *out)
{
    int delay = mode == SIM_KV_MODE_PULL_DELAY;
    int slot = (lmc_pages ? 2 : 0) + delay;
    memset(out, 0, sizeof(*out));
    snprintf(out->host, sizeof(out->host), "%s", sim_cfg.kv_host);
    out->nranks = nranks;
    out->lmc_pages = lmc_pages;
    for (int r = 0; r < nranks; r++) {
        pthread_mutex_lock(&eng_lock);
        sim_kvt_eng_t *e = receivers[slot][r];
        pthread_mutex_unlock(&eng_lock);
        if (!e) {
            e = eng_create(1, 0, delay, 0, lmc_pages, r, 0, 0);
            if (!e)
                return -1;
            pthread_mutex_lock(&eng_lock);
            receivers[slot][r] = e;
            pthread_mutex_unlock(&eng_lock);
        }
        out->alloc_ports[r] = e->ports.alloc_port;
        out->init_ports[r] = e->ports.init_port;
    }
    return 0;
}

/* AUTO (lmcache receive) = the receivers named on the command line. */
static sim_kvt_eng_t *receiver_eng(sim_kv_mode_t mode, int lmc_pages, int rank)
{
    if (mode == SIM_KV_MODE_AUTO)
        mode = main_delay ? SIM_KV_MODE_PULL_DELAY : SIM_KV_MODE_PUSH;
    pthread_mutex_lock(&eng_lock);
    sim_kvt_eng_t *e = receivers[(lmc_pages ? 2 : 0) + (mode == SIM_KV_MODE_PULL_DELAY)][rank];
    pthread_mutex_unlock(&eng_lock);
    return e;
}

/* Imports that LMCache-sized pages receive: lmcache (its receivers are the ones on
 * --alloc-port) and vllm-kvt (the gateway reserves on those ports, and the transfer
 * draws from that reservation). */
static int imp_lmc_pages(const sim_import_t *imp)
{
    return imp->kind == SIM_PD_D_LMCACHE || imp->kind == SIM_PD_D_KVT_STAGED ||
           imp->kind == SIM_PD_D_KVT_BATCH;
}

static sim_kvt_eng_t *imp_receiver(const sim_import_t *imp, int rank)
{
    return receiver_eng(imp->mode, imp_lmc_pages(imp), rank);
}

/* ---- work queue ---- */
static int enqueue(int type, void *p)
{
    work_t *w = malloc(sizeof(*w));
    if (!w)
        return -1; /* the deadline sweep still resolves imports */
    w->type = type;
    w->p = p;
    w->next = NULL;
    pthread_mutex_lock(&work_lock);
    if (work_tail)
        work_tail->next = w;
    else
        work_head = w;
    work_tail = w;
    pthread_mutex_unlock(&work_lock);
    uint64_t one = 1;
    if (write(efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        perror("pdgw-sim: eventfd");
    return 0;
}

void sim_pd_kick_export(sim_export_t *e)
{
    e->refs++;
    enqueue(1, e);
}

void sim_pd_kick_import(sim_import_t *imp)
{
    /* counted before it is queued: the import outlives its queued work */
    atomic_fetch_add(&imp->queued, 1);
    if (enqueue(2, imp))
        atomic_fetch_sub(&imp->queued, 1);
}

typedef struct {
    char endpoint[160];
    json_t *msg;
} ctl_send_t;

void sim_pd_send_ctl(const char *endpoint, json_t *msg)
{
    ctl_send_t *c = calloc(1, sizeof(*c));
    if (!c) {
        json_decref(msg);
        return;
    }
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
    c->msg = msg;
    if (enqueue(3, c)) {
        json_decref(msg);
        free(c);
    }
}

/* ---- side channel ---- */
static void send_json(void *sock, const uint8_t *ident, size_t ident_len, json_t *msg)
{
    char *s = json_dumps(msg, JSON_COMPACT);
    if (!s)
        return;
    if (ident)
        zmq_send(sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(sock, s, strlen(s), ZMQ_DONTWAIT);
    free(s);
}

static void reply(const uint8_t *ident, size_t ident_len, const char *xfer, int ok,
                  const char *error, size_t nchunks)
{
    json_t *m = json_pack("{s:s,s:b,s:s,s:I,s:i}", "xfer", xfer ? xfer : "", "ok", ok, "engine_id",
                          sim_cfg.engine_id, "nchunks", (json_int_t)nchunks, "layers_per_key",
                          sim_cfg.layerwise ? 1 : sim_cfg.layers);
    if (!m)
        return;
    if (error)
        json_object_set_new(m, "error", json_string(error));
    send_json(router, ident, ident_len, m);
    json_decref(m);
}

static dealer_t *dealer_get(const char *ep)
{
    for (dealer_t *d = dealers; d; d = d->next)
        if (!strcmp(d->ep, ep))
            return d;
    dealer_t *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->sock = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    int64_t maxmsg = 1 << 20;
    zmq_setsockopt(d->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(d->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (!d->sock || zmq_connect(d->sock, ep)) {
        fprintf(stderr, "pdgw-sim: cannot connect to %s: %s\n", ep, zmq_strerror(zmq_errno()));
        if (d->sock)
            zmq_close(d->sock);
        free(d);
        return NULL;
    }
    snprintf(d->ep, sizeof(d->ep), "%s", ep);
    d->next = dealers;
    dealers = d;
    return d;
}

static int parse_receiver(json_t *o, sim_receiver_t *r)
{
    json_t *h = json_object_get(o, "host");
    json_t *a = json_object_get(o, "alloc_ports");
    json_t *i = json_object_get(o, "init_ports");
    memset(r, 0, sizeof(*r));
    if (!json_is_string(h) || json_string_length(h) >= sizeof(r->host) || !json_is_array(a) ||
        !json_is_array(i) || json_array_size(a) != json_array_size(i) || json_array_size(a) == 0 ||
        json_array_size(a) > SIM_MAX_TP)
        return -1;
    snprintf(r->host, sizeof(r->host), "%s", json_string_value(h));
    r->nranks = (int)json_array_size(a);
    r->lmc_pages = json_is_true(json_object_get(o, "lmc_pages"));
    for (int k = 0; k < r->nranks; k++) {
        json_t *pa = json_array_get(a, (size_t)k), *pi = json_array_get(i, (size_t)k);
        if (!json_is_integer(pa) || !json_is_integer(pi) || json_integer_value(pa) < 1 ||
            json_integer_value(pa) > 65535 || json_integer_value(pi) < 1 ||
            json_integer_value(pi) > 65535)
            return -1;
        r->alloc_ports[k] = (uint16_t)json_integer_value(pa);
        r->init_ports[k] = (uint16_t)json_integer_value(pi);
    }
    return 0;
}

static json_t *receiver_json(const sim_receiver_t *r)
{
    json_t *a = json_array(), *i = json_array();
    for (int k = 0; k < r->nranks; k++) {
        json_array_append_new(a, json_integer(r->alloc_ports[k]));
        json_array_append_new(i, json_integer(r->init_ports[k]));
    }
    return json_pack("{s:s,s:o,s:o,s:b}", "host", r->host, "alloc_ports", a, "init_ports", i,
                     "lmc_pages", r->lmc_pages);
}

static sim_kv_mode_t mode_of(const char *s)
{
    if (s && !strcmp(s, "pull-eager"))
        return SIM_KV_MODE_PULL_EAGER;
    if (s && !strcmp(s, "pull-delay"))
        return SIM_KV_MODE_PULL_DELAY;
    return SIM_KV_MODE_PUSH;
}

static uint64_t hash_of(json_t *m)
{
    const char *s = json_string_value(json_object_get(m, "prompt_hash"));
    return s ? strtoull(s, NULL, 16) : 0;
}

static void attach_dest_locked(sim_export_t *e, const sim_receiver_t *dest, const char *xfer,
                               sim_kv_mode_t mode, const uint8_t *ident, size_t ident_len)
{
    e->dest = *dest;
    e->have_dest = 1;
    e->mode = mode;
    e->t_expire = 0;
    snprintf(e->xfer, sizeof(e->xfer), "%s", xfer);
    if (ident_len <= sizeof(e->ident)) {
        memcpy(e->ident, ident, ident_len);
        e->ident_len = ident_len;
    }
    json_t *kv = e->rec_kv ? json_deep_copy(e->rec_kv) : NULL;
    if (kv) {
        json_object_set_new(kv, "xfer", json_string(xfer));
        json_object_set_new(kv, "req_id", json_string(xfer));
        sim_record_set(e->rec_seq, "kv", kv);
    }
}

/* A Mooncake decode names the engine id of the DP rank it expects the KV from; the transfer
 * fails if this request ran on another rank (upstream: each rank has its own worker). */
static void rank_check_locked(sim_export_t *e, int eid_rank)
{
    int rank = e->dp_rank < 0 ? 0 : e->dp_rank;
    if (eid_rank < 0 || eid_rank == rank || e->failed)
        return;
    e->failed = 1;
    snprintf(e->err, sizeof(e->err),
             "transfer %s ran on DP rank %d, the decode named the engine of rank %d", e->rv_key,
             rank, eid_rank);
}

void sim_pd_rendezvous_attach_locked(sim_export_t *e)
{
    for (reg_t **pp = &regs; *pp; pp = &(*pp)->next) {
        reg_t *r = *pp;
        if (strcmp(r->key, e->rv_key))
            continue;
        *pp = r->next;
        attach_dest_locked(e, &r->dest, r->xfer, r->mode, r->ident, r->ident_len);
        rank_check_locked(e, r->eid_rank);
        if (r->prompt_hash != e->prompt_hash) {
            e->failed = 1;
            snprintf(e->err, sizeof(e->err), "prompt of %s differs between prefill and decode",
                     e->rv_key);
        }
        free(r);
        return;
    }
}

static void pump_export(sim_export_t *e);
static void run_paced(void);

/* "release": the decode refused the request; free the KV held for it now
 * (no reply). */
static void ctl_release(json_t *m)
{
    const char *rid = json_string_value(json_object_get(m, "remote_request_id"));
    const char *eid = json_string_value(json_object_get(m, "remote_engine_id"));
    sim_export_t *e;

    sim_engine_lock();
    e = rid ? sim_pd_export_find_locked(rid, NULL, 0, NULL) : NULL;
    if (e && (!eid || !strcmp(eid, sim_cfg.engine_id)) && !e->req) {
        /* held after its prefill finished, nobody reading: free it now */
        atomic_fetch_add(&sim_ctr.kv_rejected_releases, 1);
        sim_pd_export_finish_locked(e, 0);
    } else {
        atomic_fetch_add(&bad_ctl, 1); /* unknown, another engine's, or still computing */
    }
    sim_engine_unlock();
}

/* "cancel": forget a registration, fail the export, cancel libkvt's transfers. */
static void ctl_cancel(const char *xfer)
{
    sim_export_t *e;

    sim_engine_lock();
    for (reg_t **pp = &regs; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->xfer, xfer)) {
            reg_t *r = *pp;
            *pp = r->next;
            free(r);
            break;
        }
    e = sim_pd_export_find_xfer_locked(xfer);
    if (e && !e->failed) {
        e->failed = 1;
        snprintf(e->err, sizeof(e->err), "cancelled by the decode instance");
        e->ident_len = 0; /* nobody to tell */
        sim_pd_kick_export(e);
    }
    if (e && e->kind == SIM_PD_P_COMPUTE && e->req)
        sim_engine_cancel_locked(e->req); /* nobody wants this compute any more */
    sim_engine_unlock();
    /* and whatever libkvt still has of it */
    pthread_mutex_lock(&eng_lock);
    for (int p = 0; p < 2; p++)
        for (int x = 0; x < SEND_FAMS; x++)
            for (int r = 0; r < SIM_MAX_TP; r++)
                if (senders[p][x][r])
                    kvt_engine_cancel(senders[p][x][r]->e, xfer, 0, NULL, 0);
    pthread_mutex_unlock(&eng_lock);
}

/* "pull": the decode asks for KV this prefill holds (NIXL-style handshake). */
static void ctl_pull(const uint8_t *ident, size_t ident_len, json_t *m, const char *xfer,
                     const sim_receiver_t *dest, sim_kv_mode_t mode)
{
    sim_export_t *e;
    char err[256] = "";
    size_t nchunks = 0;

    const char *rid = json_string_value(json_object_get(m, "remote_request_id"));
    const char *eid = json_string_value(json_object_get(m, "remote_engine_id"));
    json_t *ids = json_object_get(m, "remote_block_ids");
    sim_engine_lock();
    e = sim_pd_export_find_locked(rid, json_string_value(json_object_get(m, "request_id")),
                                  hash_of(m), NULL);
    if (!e) {
        snprintf(err, sizeof(err), "no KV held here for %s %s",
                 rid ? "remote_request_id" : "request",
                 rid ? rid : json_string_value(json_object_get(m, "request_id")));
    } else if (eid && strcmp(eid, sim_cfg.engine_id)) {
        snprintf(err, sizeof(err), "remote_engine_id %s is not this engine (%s)", eid,
                 sim_cfg.engine_id);
        e = NULL;
    } else if (e->prompt_hash != hash_of(m)) {
        snprintf(err, sizeof(err), "the decode's prompt differs from the prefill's");
        e = NULL;
    } else if (json_is_array(ids)) {
        int match = json_array_size(ids) == e->n_block_ids;
        for (size_t i = 0; match && i < e->n_block_ids; i++)
            match = json_integer_value(json_array_get(ids, i)) == e->block_ids[i];
        if (!match) {
            snprintf(err, sizeof(err), "remote_block_ids do not match the held blocks");
            e = NULL;
        }
    }
    if (e) {
        attach_dest_locked(e, dest, xfer, mode, ident, ident_len);
        nchunks = e->nchunks;
        e->refs++;
    }
    sim_engine_unlock();
    reply(ident, ident_len, xfer, e != NULL, e ? NULL : err, nchunks);
    if (e) {
        pump_export(e);
        sim_engine_lock();
        sim_pd_export_unref_locked(e);
        sim_engine_unlock();
    }
}

/* "register": the decode announces where the KV of <key> goes, before or after
 * the prefill has it. */
static void ctl_register(const uint8_t *ident, size_t ident_len, json_t *m, const char *xfer,
                         const sim_receiver_t *dest, sim_kv_mode_t mode)
{
    sim_export_t *e;
    char err[256] = "";
    size_t nchunks = 0;

    const char *key = json_string_value(json_object_get(m, "key"));
    const char *eid = json_string_value(json_object_get(m, "remote_engine_id"));
    if (!key || strlen(key) >= sizeof(((reg_t *)0)->key)) {
        atomic_fetch_add(&bad_ctl, 1);
        reply(ident, ident_len, xfer, 0, "register without a key", 0);
        return;
    }
    int eid_rank = eid ? sim_engine_id_rank(eid) : -1;
    json_t *pdr = json_object_get(m, "prefill_dp_rank"); /* sglang */
    if (json_is_integer(pdr))
        eid_rank = (int)json_integer_value(pdr);
    if (eid && eid_rank < 0) {
        snprintf(err, sizeof(err), "remote_engine_id %s is not an engine of this instance", eid);
        reply(ident, ident_len, xfer, 0, err, 0);
        return;
    }
    sim_engine_lock();
    e = sim_pd_export_find_locked(NULL, NULL, 0, key);
    if (e) {
        attach_dest_locked(e, dest, xfer, mode, ident, ident_len);
        rank_check_locked(e, eid_rank);
        if (e->prompt_hash != hash_of(m)) {
            e->failed = 1;
            snprintf(e->err, sizeof(e->err), "prompt of %s differs between prefill and decode",
                     key);
        }
        nchunks = e->nchunks;
        e->refs++;
    } else {
        reg_t *r = calloc(1, sizeof(*r));
        if (r) {
            snprintf(r->key, sizeof(r->key), "%s", key);
            snprintf(r->xfer, sizeof(r->xfer), "%s", xfer);
            r->dest = *dest;
            r->mode = mode;
            r->prompt_hash = hash_of(m);
            r->eid_rank = eid_rank;
            if (ident_len <= sizeof(r->ident)) {
                memcpy(r->ident, ident, ident_len);
                r->ident_len = ident_len;
            }
            r->expire = sim_now_ns() + (uint64_t)sim_cfg.kv_hold_timeout_ms * 1000000ull;
            r->next = regs;
            regs = r;
        }
    }
    sim_engine_unlock();
    reply(ident, ident_len, xfer, 1, NULL, nchunks);
    if (e) {
        pump_export(e);
        sim_engine_lock();
        sim_pd_export_unref_locked(e);
        sim_engine_unlock();
    }
}

/* "compute": run the prefill of <body> here and push its KV to <dest>. */
static void ctl_compute(const uint8_t *ident, size_t ident_len, json_t *m, const char *xfer,
                        const sim_receiver_t *dest)
{
    char *cerr = NULL;
    json_t *body = json_object_get(m, "body");
    if (!json_is_object(body)) {
        reply(ident, ident_len, xfer, 0, "compute without a body", 0);
    } else if (sim_pd_compute_request(body, json_is_true(json_object_get(m, "is_chat")),
                                      json_string_value(json_object_get(m, "request_id")), xfer,
                                      dest, SIM_KV_MODE_PUSH, ident, ident_len, &cerr)) {
        reply(ident, ident_len, xfer, 0, cerr ? cerr : "compute failed", 0);
    } else {
        reply(ident, ident_len, xfer, 1, NULL, 0);
    }
    free(cerr);
}

static void handle_ctl(const uint8_t *ident, size_t ident_len, const char *data, size_t len)
{
    json_error_t jerr;
    json_t *m = json_loadb(data, len, 0, &jerr);
    const char *op = json_string_value(json_object_get(m, "op"));
    const char *xfer = json_string_value(json_object_get(m, "xfer"));
    sim_receiver_t dest;
    if (!m || !op || !xfer || strlen(xfer) >= sizeof(((sim_export_t *)0)->xfer)) {
        atomic_fetch_add(&bad_ctl, 1);
        reply(ident, ident_len, xfer, 0, "malformed side-channel message", 0);
        json_decref(m);
        return;
    }
    if (!strcmp(op, "release")) {
        ctl_release(m);
        json_decref(m);
        return;
    }
    if (!strcmp(op, "cancel")) {
        ctl_cancel(xfer);
        json_decref(m);
        return;
    }
    sim_kv_mode_t mode = mode_of(json_string_value(json_object_get(m, "mode")));
    if (parse_receiver(json_object_get(m, "receiver"), &dest)) {
        atomic_fetch_add(&bad_ctl, 1);
        reply(ident, ident_len, xfer, 0, "side-channel message without a valid receiver", 0);
        json_decref(m);
        return;
    }
    if (!strcmp(op, "pull")) {
        ctl_pull(ident, ident_len, m, xfer, &dest, mode);
    } else if (!strcmp(op, "register")) {
        ctl_register(ident, ident_len, m, xfer, &dest, mode);
    } else if (!strcmp(op, "compute")) {
        ctl_compute(ident, ident_len, m, xfer, &dest);
    } else {
        atomic_fetch_add(&bad_ctl, 1);
        reply(ident, ident_len, xfer, 0, "unknown op", 0);
    }
    json_decref(m);
}

/* ---- exports ---- */
static void fail_export_locked(sim_export_t *e)
{
    if (e->done)
        return;
    if (e->ident_len) {
        json_t *m = json_pack("{s:s,s:b,s:s,s:s}", "xfer", e->xfer, "ok", 0, "error",
                              e->err[0] ? e->err : "KV transfer failed on the prefill", "engine_id",
                              sim_cfg.engine_id);
        if (m) {
            send_json(router, e->ident, e->ident_len, m);
            json_decref(m);
        }
    }
    fprintf(stderr, "pdgw-sim: KV export %s failed: %s\n", e->xfer[0] ? e->xfer : e->req_id,
            e->err[0] ? e->err : "request did not complete");
    sim_pd_export_finish_locked(e, 0);
}

/* One batch: every chunk of the prompt on <rank>, all layers (layer < 0) or
 * one layer of them (layer-wise). */
static void submit_layer(sim_export_t *e, const sim_kv_geom_t *g, int layer, int rank,
                         const sim_receiver_t *dest, const char *xfer, sim_kv_mode_t mode,
                         int lmcache, int *nsub, char *err, size_t errcap)
{
    /* the chunks of the geometry this transfer uses (the receiver's page family) */
    size_t n = sim_kv_nchunks(g, e->prompt.n);
    uint64_t *hashes = calloc(n ? n : 1, sizeof(uint64_t));
    char(*keys)[KEY_MAX] = malloc(n * KEY_MAX);
    const char **kp = malloc(n * sizeof(char *));
    const void **bp = malloc(n * sizeof(void *));
    size_t *lens = malloc(n * sizeof(size_t));
    uint8_t *buf = malloc(n * g->page_bytes);
    tctx_t *t = calloc(1, sizeof(*t));
    kvt_task_id_t id;
    sim_kvt_eng_t *s = sender_for(mode, lmcache, dest->lmc_pages, rank);
    if (!hashes || !keys || !kp || !bp || !lens || !buf || !t || !s) {
        snprintf(err, errcap, "%s", s ? "out of memory" : "cannot start a libkvt sender");
        goto out;
    }
    sim_kv_chunk_hashes(&e->prompt, g, hashes);
    uint64_t bytes = 0;
    for (size_t c = 0; c < n; c++) {
        sim_kv_key(keys[c], KEY_MAX, lmcache ? NULL : xfer, dest->nranks, rank, layer, hashes[c]);
        kp[c] = keys[c];
        bp[c] = buf + c * g->page_bytes;
        lens[c] = sim_kv_fill(&e->prompt, g, rank, layer, c, buf + c * g->page_bytes);
        bytes += lens[c];
        if (sim_fault_roll(sim_cfg.kv_corrupt_rate)) {
            buf[c * g->page_bytes + lens[c] / 2] ^= 0x5a;
            atomic_fetch_add(&sim_ctr.kv_corruptions_injected, 1);
        }
    }
    kvt_store_desc_t d;
    memset(&d, 0, sizeof(d));
    d.req_id = xfer;
    d.peer_host = dest->host;
    d.peer_alloc_port = dest->alloc_ports[rank];
    d.peer_init_port = dest->init_ports[rank];
    d.fmt = KVT_FMT_KV_2LTD;
    d.shape[0] = 2;
    d.shape[1] = layer < 0 ? g->layers : 1;
    d.shape[2] = g->block_size;
    d.shape[3] = g->hidden;
    d.ndim = 4;
    d.dtype = "bfloat16";
    size_t last = sim_kv_chunk_tokens(g, e->prompt.n, n - 1);
    d.last_chunk_toks = last < (size_t)g->block_size ? (int64_t)last : 0;
    d.is_last_batch = layer < 0 || layer == g->layers - 1;
    d.total_chunks = (uint32_t)(n * (size_t)(g->layers / g->unit_layers));
    t->kind = T_STORE;
    t->exp = e;
    t->rank = rank;
    t->eng = s;
    t->bytes = bytes;
    d.user = t;
    kvt_status_t st = kvt_submit_store(s->e, &d, kp, bp, lens, (uint32_t)n, &id);
    if (st != KVT_OK) {
        snprintf(err, errcap, "libkvt store: %s", kvt_strerror(st));
        goto out;
    }
    t = NULL;
    (*nsub)++;
out:
    free(t);
    free(hashes);
    free(keys);
    free(kp);
    free(bp);
    free(lens);
    free(buf);
}

/* Submit whatever layers are ready; finish or fail the export. Caller holds
 * a reference to e. */
static void pump_export(sim_export_t *e)
{
    for (;;) {
        sim_engine_lock();
        if (e->done || e->submitting) {
            sim_engine_unlock();
            return;
        }
        if (e->failed) {
            if (e->stores_outstanding == 0)
                fail_export_locked(e);
            sim_engine_unlock();
            return;
        }
        if (!e->have_dest) {
            sim_engine_unlock();
            return;
        }
        int L = sim_cfg.layers;
        int first = e->layers_submitted;
        /* LMCache moves whole chunks (all layers) once computed; the other
         * protocols may stream one layer at a time */
        int whole = e->lmcache || !sim_cfg.layerwise;
        int last = !whole ? e->layers_done : ((e->computed || e->layers_done >= L) ? L : 0);
        if (last <= first) {
            if (first == L && e->stores_outstanding == 0)
                sim_pd_export_finish_locked(e, 1);
            sim_engine_unlock();
            return;
        }
        if (sim_cfg.kv_link_gbps > 0) {
            /* link model: one layer at a time, each after the link carried it */
            uint64_t now = sim_now_ns();
            last = whole ? L : first + 1; /* a whole chunk holds every layer */
            if (!e->pace_ready) {
                double bytes =
                    (double)e->prompt.n * sim_cfg.kv_bytes_per_token * (last - first) / L;
                uint64_t start = now > link_free_at ? now : link_free_at;
                e->pace_ready = start + (uint64_t)(bytes * 8.0 / sim_cfg.kv_link_gbps);
                link_free_at = e->pace_ready;
            }
            if (now < e->pace_ready) {
                if (!e->paced) {
                    e->paced = 1;
                    e->refs++;
                    e->pace_next = paced;
                    paced = e;
                }
                sim_engine_unlock();
                return;
            }
            e->pace_ready = 0;
        }
        sim_receiver_t dest = e->dest;
        char xfer[SIM_XFER_MAX];
        snprintf(xfer, sizeof(xfer), "%s", e->xfer);
        sim_kv_mode_t mode = e->mode;
        int lmcache = e->lmcache;
        e->submitting = 1;
        sim_engine_unlock();

        sim_kv_geom_t g;
        char err[160] = "";
        int nsub = 0;
        /* lmcache, and vllm-kvt (a receiver with LMCache-sized pages), move chunks of
         * LMCache's chunk_size; the others chunks of vLLM's block */
        if ((lmcache || dest.lmc_pages) ? sim_kv_geom_lmcache(&g, dest.nranks)
                                        : sim_kv_geom_init(&g, dest.nranks))
            snprintf(err, sizeof(err), "bad TP size %d", dest.nranks);
        if (whole)
            g.unit_layers = g.layers;
        if (!err[0] && g.unit_layers == g.layers) {
            /* whole chunks (all layers): once the prefill computed them */
            for (int r = 0; r < dest.nranks && !err[0]; r++)
                submit_layer(e, &g, -1, r, &dest, xfer, mode, lmcache, &nsub, err, sizeof(err));
        } else {
            for (int l = first; l < last && !err[0]; l++)
                for (int r = 0; r < dest.nranks && !err[0]; r++)
                    submit_layer(e, &g, l, r, &dest, xfer, mode, lmcache, &nsub, err, sizeof(err));
        }

        sim_engine_lock();
        e->submitting = 0;
        e->stores_outstanding += nsub;
        e->refs += nsub; /* each store task holds a reference */
        e->layers_submitted = last;
        if (err[0] && !e->failed) {
            e->failed = 1;
            snprintf(e->err, sizeof(e->err), "%s", err);
            pthread_mutex_lock(&eng_lock);
            for (int r = 0; r < SIM_MAX_TP; r++)
                for (int p = 0; p < 2; p++)
                    if (senders[p][send_family(lmcache, dest.lmc_pages)][r])
                        kvt_engine_cancel(senders[p][send_family(lmcache, dest.lmc_pages)][r]->e,
                                          xfer, 1, dest.host, dest.alloc_ports[0]);
            pthread_mutex_unlock(&eng_lock);
        }
        sim_engine_unlock();
    }
}

/* ---- imports ---- */
static void import_resolve(sim_import_t *imp, int ok, int status, const char *msg)
{
    sim_engine_lock();
    if (imp->phase != 3) {
        imp->phase = 3;
        sim_req_t *req = imp->req;
        if (ok && !imp->recompute)
            req->kv->remote_filled = 1;
        uint64_t ms = (sim_now_ns() - imp->t_start) / 1000000ull;
        json_t *res = json_pack(
            "{s:b,s:I,s:I,s:I,s:b,s:I,s:s}", "ok", ok, "bytes", (json_int_t)imp->bytes, "pages",
            (json_int_t)imp->pages, "verify_failures", (json_int_t)imp->verify_failures,
            "recompute", imp->recompute, "ms", (json_int_t)ms, "mode", sim_kv_mode_name(imp->mode));
        if (res && !ok)
            json_object_set_new(res, "error", json_string(msg));
        if (res)
            sim_record_set(req->rec_seq, "kv_result", res);
        if (ok)
            atomic_fetch_add(&sim_ctr.kv_transfers_ok, imp->recompute ? 0 : 1);
        else
            atomic_fetch_add(&sim_ctr.kv_transfers_failed, 1);
        if (!ok)
            fprintf(stderr, "pdgw-sim: KV import %s failed: %s\n", imp->xfer, msg);
        sim_engine_kv_ready_locked(req, ok, status, msg);
    }
    sim_engine_unlock();
}

static void import_free_keys(sim_import_t *imp);

static void import_free(sim_import_t *imp)
{
    for (sim_import_t **pp = &imports; *pp; pp = &(*pp)->next)
        if (*pp == imp) {
            *pp = imp->next;
            break;
        }
    import_free_keys(imp);
    json_decref(imp->ctl);
    free(imp->expect_engine_id);
    free(imp->wait_id);
    sim_engine_lock();
    sim_pd_import_unname_locked(imp);
    if (imp->req->kv && imp->req->kv->imp == imp)
        imp->req->kv->imp = NULL; /* the request may live on (decoding) */
    sim_req_unref_locked(imp->req);
    sim_engine_unlock();
    free(imp);
}

static void import_release_kv(sim_import_t *imp, int failed)
{
    for (int r = 0; r < imp->nranks; r++) {
        sim_kvt_eng_t *re = imp_receiver(imp, r);
        if (!re)
            continue;
        if (imp->kind == SIM_PD_D_LMCACHE) {
            if (imp->locked[r])
                kvt_unlock(re->e, (const char *const *)imp->keyp[r], (uint32_t)imp->nkeys);
            imp->locked[r] = 0;
            kvt_release(re->e, (const char *const *)imp->keyp[r], (uint32_t)imp->nkeys);
        } else {
            if (failed)
                kvt_engine_cancel(re->e, imp->xfer, 0, NULL, 0);
            kvt_release_req(re->e, imp->xfer);
        }
    }
}

static void import_fail(sim_import_t *imp, int status, const char *msg)
{
    if (imp->failed)
        return;
    imp->failed = 1;
    import_resolve(imp, 0, status, msg);
    import_release_kv(imp, 1);
    if (imp->ctl && !strncmp(imp->endpoint, "tcp://", 6)) {
        dealer_t *d = dealer_get(imp->endpoint);
        json_t *m = json_pack("{s:s,s:s}", "op", "cancel", "xfer", imp->xfer);
        if (d && m)
            send_json(d->sock, NULL, 0, m);
        json_decref(m);
    }
}

static uint64_t lookup_grace_ns(void)
{
    int ms = sim_cfg.kv_wait_timeout_ms < 1000 ? sim_cfg.kv_wait_timeout_ms : 1000;
    return (uint64_t)ms * 1000000ull;
}

static void import_maybe_free(sim_import_t *imp)
{
    if (imp->phase == 3 && imp->outstanding == 0 && atomic_load(&imp->queued) == 0)
        import_free(imp);
}

static int resolve_bootstrap(sim_import_t *imp);

static void import_loads(sim_import_t *imp)
{
    for (int r = 0; r < imp->nranks; r++) {
        sim_kvt_eng_t *re = imp_receiver(imp, r);
        tctx_t *t = calloc(1, sizeof(*t));
        kvt_task_id_t id;
        if (!t || !re) {
            free(t);
            import_fail(imp, 500, "out of memory");
            return;
        }
        t->kind = T_LOAD;
        t->imp = imp;
        t->rank = r;
        t->eng = re;
        kvt_status_t st =
            kvt_submit_load(re->e, (const char *const *)imp->keyp[r], (void *const *)imp->bufp[r],
                            imp->caps[r], imp->lens[r], (uint32_t)imp->nkeys, t, &id);
        if (st != KVT_OK) {
            free(t);
            char m[128];
            snprintf(m, sizeof(m), "libkvt load: %s", kvt_strerror(st));
            import_fail(imp, 500, m);
            return;
        }
        imp->outstanding++;
    }
    imp->phase = 2;
}

static void import_free_keys(sim_import_t *imp)
{
    for (int r = 0; r < SIM_MAX_TP; r++) {
        free(imp->keys[r]);
        free(imp->keyp[r]);
        free(imp->bufs[r]);
        free(imp->bufp[r]);
        free(imp->lens[r]);
        free(imp->caps[r]);
        imp->keys[r] = NULL;
        imp->keyp[r] = NULL;
        imp->bufs[r] = NULL;
        imp->bufp[r] = NULL;
        imp->lens[r] = NULL;
        imp->caps[r] = NULL;
    }
}

static int import_setup_keys(sim_import_t *imp, sim_kv_geom_t *g)
{
    sim_tokens_t looked = imp->req->prompt; /* a view: prompt[:-skip_last_n_tokens] */
    const sim_tokens_t *prompt = &looked;
    if (imp->kind == SIM_PD_D_LMCACHE)
        looked.n = sim_kv_lookup_len(imp->req);
    size_t n = sim_kv_nchunks(g, prompt->n);
    uint64_t *h = calloc(n ? n : 1, sizeof(uint64_t));
    if (!h)
        return -1;
    sim_kv_chunk_hashes(prompt, g, h);
    imp->nchunks = n;
    imp->nkeys = n * (size_t)(g->layers / g->unit_layers);
    for (int r = 0; r < imp->nranks; r++) {
        imp->keys[r] = malloc(imp->nkeys * KEY_MAX);
        imp->keyp[r] = malloc(imp->nkeys * sizeof(char *));
        imp->bufs[r] = malloc(imp->nkeys * g->page_bytes);
        imp->bufp[r] = malloc(imp->nkeys * sizeof(void *));
        imp->lens[r] = calloc(imp->nkeys, sizeof(size_t));
        imp->caps[r] = malloc(imp->nkeys * sizeof(size_t));
        if (!imp->keys[r] || !imp->keyp[r] || !imp->bufs[r] || !imp->bufp[r] || !imp->lens[r] ||
            !imp->caps[r]) {
            free(h);
            return -1;
        }
        for (int u = 0; u < g->layers / g->unit_layers; u++)
            for (size_t c = 0; c < n; c++) {
                size_t k = (size_t)u * n + c;
                char *key = imp->keys[r] + k * KEY_MAX;
                sim_kv_key(key, KEY_MAX, imp->kind == SIM_PD_D_LMCACHE ? NULL : imp->xfer,
                           imp->nranks, r, g->unit_layers == g->layers ? -1 : u, h[c]);
                imp->keyp[r][k] = key;
                imp->bufp[r][k] = imp->bufs[r] + k * g->page_bytes;
                imp->caps[r][k] = g->page_bytes;
            }
    }
    free(h);
    imp->geom = *g;
    return 0;
}

/* lmcache receive: are this prompt's pages here? (content-addressed keys) */
static void import_lookups(sim_import_t *imp)
{
    for (int r = 0; r < imp->nranks; r++) {
        sim_kvt_eng_t *re = imp_receiver(imp, r);
        tctx_t *t = calloc(1, sizeof(*t));
        kvt_task_id_t id;
        if (!re || !t ||
            kvt_submit_lookup(re->e, (const char *const *)imp->keyp[r], (uint32_t)imp->nkeys, t,
                              &id) != KVT_OK) {
            free(t);
            import_fail(imp, 500, "libkvt lookup failed");
            return;
        }
        t->kind = T_LOOKUP;
        t->imp = imp;
        t->rank = r;
        t->eng = re;
        imp->outstanding++;
    }
    imp->phase = 1;
}

static void begin_import(sim_import_t *imp)
{
    sim_kv_geom_t g;
    imp->t_start = sim_now_ns();
    imp->deadline = imp->t_start + (uint64_t)sim_cfg.kv_wait_timeout_ms * 1000000ull;
    int bad = imp_lmc_pages(imp) ? sim_kv_geom_lmcache(&g, imp->nranks)
                                 : sim_kv_geom_init(&g, imp->nranks);
    if (!bad && imp->kind == SIM_PD_D_LMCACHE)
        g.unit_layers = g.layers; /* LMCache chunks are whole: all layers */
    if (bad || import_setup_keys(imp, &g)) {
        import_fail(imp, 500, "cannot lay out the KV pages of this request");
        return;
    }
    if (imp->kind == SIM_PD_D_LMCACHE) {
        if (imp->wait_id) {
            /* the decode leg named the transfer: wait for exactly it */
            for (int r = 0; r < imp->nranks; r++) {
                sim_kvt_eng_t *re = imp_receiver(imp, r);
                tctx_t *t = calloc(1, sizeof(*t));
                kvt_task_id_t id;
                if (!re || !t ||
                    kvt_submit_wait_req(re->e, imp->wait_id, sim_cfg.kv_wait_timeout_ms, t, &id) !=
                        KVT_OK) {
                    free(t);
                    import_fail(imp, 500, "libkvt wait failed");
                    return;
                }
                t->kind = T_WAIT;
                t->imp = imp;
                t->rank = r;
                t->eng = re;
                imp->outstanding++;
            }
            imp->phase = 1;
            return;
        }
        import_lookups(imp);
        return;
    }
    sim_receiver_t me;
    if (sim_pd_receiver(imp->mode, imp->nranks, imp_lmc_pages(imp), &me)) {
        import_fail(imp, 500, "cannot start a libkvt receiver");
        return;
    }
    json_object_set_new(imp->ctl, "receiver", receiver_json(&me));
    for (int r = 0; r < imp->nranks; r++) {
        sim_kvt_eng_t *re = imp_receiver(imp, r);
        tctx_t *t = calloc(1, sizeof(*t));
        kvt_task_id_t id;
        if (!t ||
            kvt_submit_wait_req(re->e, imp->xfer, sim_cfg.kv_wait_timeout_ms, t, &id) != KVT_OK) {
            free(t);
            import_fail(imp, 500, "libkvt wait failed");
            return;
        }
        t->kind = T_WAIT;
        t->imp = imp;
        t->rank = r;
        t->eng = re;
        imp->outstanding++;
    }
    imp->phase = 1;
    if (!strncmp(imp->endpoint, "http://", 7) && resolve_bootstrap(imp))
        return;
    dealer_t *d = dealer_get(imp->endpoint);
    if (!d) {
        import_fail(imp, 502, "cannot reach the prefill instance's side channel");
        return;
    }
    send_json(d->sock, NULL, 0, imp->ctl);
}

/* The decode asks the prefill's bootstrap server where its side channel is, as upstream
 * decodes do: vLLM Mooncake GET /query and the entry of remote_engine_id (none: the decode
 * fails the request, "remote engine_id ... not found", vLLM's default kv_load_failure_policy
 * "fail"); SGLang GET /route. Rewrites imp->endpoint to tcp://; 0 = resolved. */
static int resolve_bootstrap(sim_import_t *imp)
{
    char host[128], err[256], msg[640];
    const char *p = imp->endpoint + 7, *colon = strrchr(p, ':');
    int mooncake = imp->kind == SIM_PD_D_MOONCAKE_PAR;
    int port = colon ? atoi(colon + 1) : 0;
    size_t hl = colon ? (size_t)(colon - p) : 0;
    json_t *a = NULL;
    char *body;
    if (!hl || hl >= sizeof(host) || port <= 0) {
        import_fail(imp, 500, "bad bootstrap address");
        return -1;
    }
    memcpy(host, p, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    /* bounded by the decode's own KV deadline, as a loaded machine may be slow to answer;
     * SGLang's decode first asks for the topology (every rank -1, common/conn.py) */
    body = sim_http_get(host, port,
                        mooncake ? "/query"
                                 : "/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                                   "&target_tp_rank=-1&target_pp_rank=-1",
                        sim_cfg.kv_wait_timeout_ms, err, sizeof(err));
    if (body)
        a = json_loads(body, 0, NULL);
    free(body);
    if (!a) {
        snprintf(msg, sizeof(msg), "failed to connect to bootstrap server %s: %s", imp->endpoint,
                 body ? "not JSON" : err);
        import_fail(imp, 500, msg);
        return -1;
    }
    const char *addr = NULL;
    if (mooncake) {
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v)
        {
            const char *eid = json_string_value(json_object_get(v, "engine_id"));
            if (!imp->expect_engine_id ? !strcmp(k, "0")
                                       : (eid && !strcmp(eid, imp->expect_engine_id))) {
                json_t *tp0 = json_object_get(json_object_get(v, "worker_addr"), "0");
                addr = json_string_value(json_object_get(tp0, "0"));
                break;
            }
        }
        if (addr && strlen(addr) < sizeof(imp->endpoint)) {
            snprintf(imp->endpoint, sizeof(imp->endpoint), "%s", addr);
        } else {
            snprintf(msg, sizeof(msg), "remote engine_id %s not found from bootstrap server %s",
                     imp->expect_engine_id ? imp->expect_engine_id : "(rank 0)", imp->endpoint);
            json_decref(a);
            import_fail(imp, 500, msg);
            return -1;
        }
    } else {
        /* the prefill DP rank the KV comes from: disagg_prefill_dp_rank, else the room's */
        json_int_t pdp = json_integer_value(json_object_get(a, "dp_size"));
        int rank =
            imp->prefill_rank >= 0 ? imp->prefill_rank : (int)(imp->room % (pdp > 0 ? pdp : 1));
        char path[160];
        json_decref(a);
        a = NULL;
        /* then for that rank's worker (TP, CP and PP rank 0 here) */
        snprintf(path, sizeof(path),
                 "/route?prefill_dp_rank=%d&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                 rank);
        body = sim_http_get(host, port, path, sim_cfg.kv_wait_timeout_ms, err, sizeof(err));
        if (body)
            a = json_loads(body, 0, NULL);
        free(body);
        const char *ip = json_string_value(json_object_get(a, "rank_ip"));
        json_int_t rp = json_integer_value(json_object_get(a, "rank_port"));
        if (!ip || rp <= 0 || rp > 65535 || strlen(ip) > 100) {
            snprintf(msg, sizeof(msg),
                     "bootstrap server %s has no worker for prefill DP rank %d: %s", imp->endpoint,
                     rank, a ? "no rank_ip/rank_port" : err);
            json_decref(a);
            import_fail(imp, 500, msg);
            return -1;
        }
        snprintf(imp->endpoint, sizeof(imp->endpoint), "tcp://%s:%d", ip, (int)rp);
        json_object_set_new(imp->ctl, "prefill_dp_rank", json_integer(rank));
    }
    json_decref(a);
    return 0;
}

static void handle_reply(const char *data, size_t len)
{
    json_error_t jerr;
    json_t *m = json_loadb(data, len, 0, &jerr);
    const char *xfer = json_string_value(json_object_get(m, "xfer"));
    if (!m || !xfer) {
        atomic_fetch_add(&bad_ctl, 1);
        json_decref(m);
        return;
    }
    for (sim_import_t *imp = imports; imp; imp = imp->next) {
        if (strcmp(imp->xfer, xfer))
            continue;
        const char *eid = json_string_value(json_object_get(m, "engine_id"));
        if (!json_is_true(json_object_get(m, "ok"))) {
            const char *e = json_string_value(json_object_get(m, "error"));
            char msg[320];
            snprintf(msg, sizeof(msg), "prefill instance refused the KV transfer: %s",
                     e ? e : "unknown error");
            import_fail(imp, 500, msg);
        } else if (imp->kind != SIM_PD_D_MOONCAKE_PAR && imp->expect_engine_id && eid &&
                   strcmp(eid, imp->expect_engine_id)) {
            import_fail(imp, 500, "remote_engine_id does not match the prefill instance");
        } else if (!imp->failed && imp->peer_unit == 0) {
            /* key the pages as the prefill sends them (whole chunks or layers) */
            json_int_t u = json_integer_value(json_object_get(m, "layers_per_key"));
            sim_kv_geom_t g = imp->geom;
            imp->peer_unit = u > 0 ? (int)u : g.unit_layers;
            if (imp->peer_unit != g.unit_layers &&
                (imp->peer_unit != 1 && imp->peer_unit != g.layers)) {
                import_fail(imp, 500, "the prefill's KV unit does not match this model's layers");
            } else if (imp->peer_unit != g.unit_layers) {
                g.unit_layers = imp->peer_unit;
                import_free_keys(imp);
                if (import_setup_keys(imp, &g))
                    import_fail(imp, 500, "out of memory");
            }
            if (!imp->failed && imp->loads_waiting) {
                imp->loads_waiting = 0;
                import_loads(imp);
            }
        }
        import_maybe_free(imp);
        break;
    }
    json_decref(m);
}

static void verify_rank(sim_import_t *imp, int r, uint8_t *scratch)
{
    const sim_kv_geom_t *g = &imp->geom;
    sim_tokens_t looked = imp->req->prompt; /* the tokens whose KV was looked up */
    if (imp->kind == SIM_PD_D_LMCACHE)
        looked.n = sim_kv_lookup_len(imp->req);
    for (int u = 0; u < g->layers / g->unit_layers; u++)
        for (size_t c = 0; c < imp->nchunks; c++) {
            size_t k = (size_t)u * imp->nchunks + c;
            imp->bytes += imp->lens[r][k];
            imp->pages++;
            if (!sim_kv_verify(&looked, g, r, g->unit_layers == g->layers ? -1 : u, c,
                               imp->bufp[r][k], imp->lens[r][k], scratch))
                imp->verify_failures++;
        }
}

/* A store (push) of an export's pages finished. */
static void task_store(tctx_t *t, kvt_task_result_t *res)
{
    sim_export_t *e = t->exp;
    int ok = res->status == KVT_OK;
    for (uint32_t i = 0; ok && res->bitmap && i < res->nkeys; i++)
        ok = kvt_bitmap_test(res->bitmap, i);
    sim_engine_lock();
    e->stores_outstanding--;
    if (ok) {
        e->bytes_sent += t->bytes;
        atomic_fetch_add(&sim_ctr.kv_bytes_sent, t->bytes);
    } else if (!e->failed) {
        e->failed = 1;
        snprintf(e->err, sizeof(e->err), "libkvt store to %s failed: %s", e->dest.host,
                 kvt_strerror(res->status != KVT_OK ? res->status : KVT_ERR_PEER));
    }
    sim_engine_unlock();
    pump_export(e);
    sim_engine_lock();
    sim_pd_export_unref_locked(e);
    sim_engine_unlock();
}

/* The receiver's wait for an import's pages finished. */
static void task_wait(sim_import_t *imp, kvt_task_result_t *res)
{
    char msg[256];

    if (res->status != KVT_OK && imp->kind == SIM_PD_D_LMCACHE) {
        imp->recompute = 1; /* LMCache recomputes what did not arrive */
        if (imp->outstanding == 0)
            import_resolve(imp, 1, 200, NULL);
    } else if (res->status != KVT_OK) {
        int status = res->status == KVT_ERR_TIMEOUT ? 504 : 500;
        if (res->status == KVT_ERR_TIMEOUT)
            snprintf(msg, sizeof(msg), "no KV from the prefill instance within %d ms",
                     sim_cfg.kv_wait_timeout_ms);
        else
            snprintf(msg, sizeof(msg), "KV transfer failed: %s", kvt_strerror(res->status));
        import_fail(imp, status, msg);
    } else if (imp->outstanding == 0) {
        if (imp->kind == SIM_PD_D_LMCACHE)
            import_lookups(imp);
        else if (imp->peer_unit == 0)
            imp->loads_waiting = 1; /* the prefill's reply names its key layout */
        else
            import_loads(imp);
    }
}

/* Release the locks an import holds on every rank's pages. */
static void import_unlock_ranks(sim_import_t *imp)
{
    for (int r = 0; r < imp->nranks; r++)
        if (imp->locked[r]) {
            kvt_unlock(imp_receiver(imp, r)->e, (const char *const *)imp->keyp[r],
                       (uint32_t)imp->nkeys);
            imp->locked[r] = 0;
        }
}

/* A lookup (and lock) of one rank's pages finished. */
static void task_lookup(tctx_t *t, sim_import_t *imp, kvt_task_result_t *res)
{
    int all = res->status == KVT_OK && res->bitmap;
    uint32_t hits = 0;
    for (uint32_t i = 0; res->bitmap && i < res->nkeys; i++)
        if (kvt_bitmap_test(res->bitmap, i))
            hits++;
    if (res->status == KVT_OK && res->bitmap)
        imp->locked[t->rank] = hits == res->nkeys;
    if (hits != res->nkeys) {
        all = 0;
        for (uint32_t i = 0; res->bitmap && i < res->nkeys; i++)
            if (kvt_bitmap_test(res->bitmap, i))
                kvt_unlock(t->eng->e, (const char *const *)&imp->keyp[t->rank][i], 1);
    }
    if (!all)
        imp->recompute = 1;
    if (imp->outstanding == 0 && imp->recompute && !imp->wait_id &&
        sim_now_ns() < imp->t_start + lookup_grace_ns()) {
        /* the pages may still be landing (the receiver learns that a
         * request landed in parallel with the proxy): look again soon */
        import_unlock_ranks(imp);
        imp->recompute = 0;
        imp->retry_at = sim_now_ns() + 2000000ull;
        return;
    }
    if (imp->outstanding == 0) {
        if (imp->recompute) {
            /* like LMCache: KV that is not here is recomputed */
            import_unlock_ranks(imp);
            import_resolve(imp, 1, 200, NULL);
        } else {
            import_loads(imp);
        }
    }
}

/* A load of one rank's pages finished: verify them. */
static void task_load(tctx_t *t, sim_import_t *imp, kvt_task_result_t *res)
{
    char msg[256];

    int ok = res->status == KVT_OK;
    for (uint32_t i = 0; ok && res->bitmap && i < res->nkeys; i++)
        ok = kvt_bitmap_test(res->bitmap, i);
    if (!ok) {
        snprintf(msg, sizeof(msg), "loading KV pages failed: %s",
                 kvt_strerror(res->status != KVT_OK ? res->status : KVT_ERR_NOT_FOUND));
        import_fail(imp, 500, msg);
        return;
    }
    uint8_t *scratch = malloc(imp->geom.page_bytes);
    if (!scratch) {
        import_fail(imp, 500, "out of memory");
        return;
    }
    verify_rank(imp, t->rank, scratch);
    free(scratch);
    if (imp->outstanding == 0) {
        atomic_fetch_add(&sim_ctr.kv_bytes_received, imp->bytes);
        if (imp->verify_failures) {
            atomic_fetch_add(&sim_ctr.kv_verify_failures, imp->verify_failures);
            snprintf(msg, sizeof(msg),
                     "KV verification failed: %zu of %zu pages differ from the prompt's KV",
                     imp->verify_failures, imp->pages);
            import_fail(imp, 500, msg);
            return;
        }
        import_release_kv(imp, 0);
        import_resolve(imp, 1, 200, NULL);
    }
}

static void handle_task(kvt_task_result_t *res)
{
    tctx_t *t = res->user;
    if (!t)
        return;
    if (t->kind == T_STORE) {
        task_store(t, res);
        free(t);
        return;
    }
    sim_import_t *imp = t->imp;
    imp->outstanding--;
    if (imp->failed || imp->phase == 3) {
        if (t->kind == T_LOOKUP && res->status == KVT_OK && res->bitmap) {
            for (uint32_t i = 0; i < res->nkeys; i++)
                if (kvt_bitmap_test(res->bitmap, i))
                    kvt_unlock(t->eng->e, (const char *const *)&imp->keyp[t->rank][i], 1);
        }
        free(t);
        import_maybe_free(imp);
        return;
    }
    switch (t->kind) {
    case T_WAIT:
        task_wait(imp, res);
        break;
    case T_LOOKUP:
        task_lookup(t, imp, res);
        break;
    case T_LOAD:
        task_load(t, imp, res);
        break;
    }
    free(t);
    import_maybe_free(imp);
}

static void handle_work(work_t *w)
{
    if (w->type == 3) {
        ctl_send_t *c = w->p;
        dealer_t *d = dealer_get(c->endpoint);
        if (d)
            send_json(d->sock, NULL, 0, c->msg);
        json_decref(c->msg);
        free(c);
        return;
    }
    if (w->type == 1) {
        sim_export_t *e = w->p;
        pump_export(e);
        sim_engine_lock();
        sim_pd_export_unref_locked(e);
        sim_engine_unlock();
        return;
    }
    sim_import_t *imp = w->p;
    int known = 0;
    for (sim_import_t *x = imports; x; x = x->next)
        known |= x == imp;
    sim_engine_lock();
    int cancelled = imp->cancelled;
    sim_engine_unlock();
    if (!known) {
        imp->next = imports;
        imports = imp;
        if (cancelled) {
            imp->failed = 1;
            import_resolve(imp, 0, 499, "client went away");
        } else {
            begin_import(imp);
        }
    } else if (cancelled && !imp->failed) {
        import_fail(imp, 499, "client went away");
    }
    atomic_fetch_sub(&imp->queued, 1);
    import_maybe_free(imp);
}

static void sweep(uint64_t now)
{
    sim_engine_lock();
    sim_pd_exports_expire_locked(now);
    for (reg_t **pp = &regs; *pp;) {
        if (now >= (*pp)->expire) {
            reg_t *r = *pp;
            *pp = r->next;
            free(r);
        } else {
            pp = &(*pp)->next;
        }
    }
    sim_engine_unlock();
    for (sim_import_t *imp = imports, *next; imp; imp = next) {
        next = imp->next;
        if (imp->retry_at && now >= imp->retry_at && imp->outstanding == 0 && !imp->failed) {
            imp->retry_at = 0;
            import_lookups(imp);
        }
        if (imp->phase != 3 && now > imp->deadline + 2000000000ull) {
            import_fail(imp, 504, "KV transfer did not finish before the deadline");
            import_maybe_free(imp);
        }
    }
}

/* Every libkvt engine this instance runs (senders per protocol kind and TP rank, then
 * receivers), into all[]; returns how many. Caller holds eng_lock. */
static int all_engines_locked(sim_kvt_eng_t *all[SIM_MAX_ENGINES])
{
    int na = 0;
    for (int p = 0; p < 2; p++)
        for (int x = 0; x < SEND_FAMS; x++)
            for (int r = 0; r < SIM_MAX_TP; r++)
                if (senders[p][x][r])
                    all[na++] = senders[p][x][r];
    for (int dl = 0; dl < 4; dl++)
        for (int r = 0; r < SIM_MAX_TP; r++)
            if (receivers[dl][r])
                all[na++] = receivers[dl][r];
    return na;
}

static void harvest(sim_kvt_eng_t *se)
{
    kvt_task_result_t res[32];
    size_t n;
    if (!se)
        return;
    while ((n = kvt_task_poll(se->e, res, 32)) > 0) {
        for (size_t i = 0; i < n; i++) {
            handle_task(&res[i]);
            kvt_task_result_clear(&res[i]);
        }
        if (n < 32)
            break;
    }
}

static void *kv_main(void *arg)
{
    zmq_pollitem_t items[64 + SIM_MAX_ENGINES];
    uint64_t last_sweep = 0;
    while (!atomic_load(&stopping)) {
        int n = 0;
        items[n++] = (zmq_pollitem_t){.socket = NULL, .fd = efd, .events = ZMQ_POLLIN};
        if (router)
            items[n++] = (zmq_pollitem_t){.socket = router, .events = ZMQ_POLLIN};
        int first_dealer = n;
        for (dealer_t *d = dealers; d && n < 64; d = d->next)
            items[n++] = (zmq_pollitem_t){.socket = d->sock, .events = ZMQ_POLLIN};
        int ndealers = n - first_dealer;
        pthread_mutex_lock(&eng_lock);
        for (int p = 0; p < 2; p++)
            for (int x = 0; x < SEND_FAMS; x++)
                for (int r = 0; r < SIM_MAX_TP; r++)
                    if (senders[p][x][r])
                        items[n++] =
                            (zmq_pollitem_t){.socket = NULL,
                                             .fd = kvt_engine_event_fd(senders[p][x][r]->e),
                                             .events = ZMQ_POLLIN};
        for (int dl = 0; dl < 4; dl++)
            for (int r = 0; r < SIM_MAX_TP; r++)
                if (receivers[dl][r])
                    items[n++] = (zmq_pollitem_t){.socket = NULL,
                                                  .fd = kvt_engine_event_fd(receivers[dl][r]->e),
                                                  .events = ZMQ_POLLIN};
        pthread_mutex_unlock(&eng_lock);
        long timeout = 20;
        sim_engine_lock();
        for (sim_export_t *x = paced; x; x = x->pace_next) {
            uint64_t now = sim_now_ns();
            long ms = x->pace_ready > now ? (long)((x->pace_ready - now) / 1000000ull) : 0;
            if (ms < timeout)
                timeout = ms;
        }
        sim_engine_unlock();
        zmq_poll(items, n, timeout);
        run_paced();

        uint64_t v;
        if (read(efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
            perror("pdgw-sim: eventfd read");
        for (;;) {
            pthread_mutex_lock(&work_lock);
            work_t *w = work_head;
            if (w) {
                work_head = w->next;
                if (!work_head)
                    work_tail = NULL;
            }
            pthread_mutex_unlock(&work_lock);
            if (!w)
                break;
            handle_work(w);
            free(w);
        }
        if (router) {
            for (int k = 0; k < 256; k++) {
                zmq_msg_t id, body;
                zmq_msg_init(&id);
                zmq_msg_init(&body);
                if (zmq_msg_recv(&id, router, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&id);
                    zmq_msg_close(&body);
                    break;
                }
                int more = zmq_msg_more(&id);
                if (more && zmq_msg_recv(&body, router, 0) >= 0) {
                    /* drop any extra frames */
                    while (zmq_msg_more(&body)) {
                        zmq_msg_t extra;
                        zmq_msg_init(&extra);
                        zmq_msg_recv(&extra, router, 0);
                        int m2 = zmq_msg_more(&extra);
                        zmq_msg_close(&extra);
                        if (!m2)
                            break;
                    }
                    if (zmq_msg_size(&id) <= 64)
                        handle_ctl(zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
                                   zmq_msg_size(&body));
                    else
                        atomic_fetch_add(&bad_ctl, 1);
                }
                zmq_msg_close(&id);
                zmq_msg_close(&body);
            }
        }
        (void)ndealers;
        for (dealer_t *d = dealers; d; d = d->next) {
            for (int k = 0; k < 256; k++) {
                zmq_msg_t body;
                zmq_msg_init(&body);
                if (zmq_msg_recv(&body, d->sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&body);
                    break;
                }
                handle_reply(zmq_msg_data(&body), zmq_msg_size(&body));
                zmq_msg_close(&body);
            }
        }
        sim_kvt_eng_t *all[SIM_MAX_ENGINES];
        pthread_mutex_lock(&eng_lock);
        int na = all_engines_locked(all);
        pthread_mutex_unlock(&eng_lock);
        for (int k = 0; k < na; k++)
            harvest(all[k]);
        uint64_t now = sim_now_ns();
        if (now - last_sweep > 20000000ull) {
            last_sweep = now;
            sweep(now);
        }
    }
    return NULL;
}

static void run_paced(void)
{
    for (;;) {
        sim_export_t *due = NULL;
        uint64_t now = sim_now_ns();
        sim_engine_lock();
        for (sim_export_t **pp = &paced; *pp; pp = &(*pp)->pace_next)
            if ((*pp)->pace_ready <= now || (*pp)->failed || (*pp)->done) {
                due = *pp;
                *pp = due->pace_next;
                due->paced = 0;
                due->pace_next = NULL;
                break;
            }
        sim_engine_unlock();
        if (!due)
            return;
        pump_export(due);
        sim_engine_lock();
        sim_pd_export_unref_locked(due);
        sim_engine_unlock();
    }
}

/* Bind the side channel on <port> (0: an ephemeral one); sim_side_port says which. */
static int bind_router(int port)
{
    char ep[128], last[128];
    size_t len = sizeof(last);
    const char *h = sim_cfg.host, *colon;
    if (port)
        snprintf(ep, sizeof(ep), "tcp://%s:%d", strcmp(h, "0.0.0.0") ? h : "*", port);
    else
        snprintf(ep, sizeof(ep), "tcp://%s:*", strcmp(h, "0.0.0.0") ? h : "*");
    if (zmq_bind(router, ep)) {
        fprintf(stderr, "pdgw-sim: cannot bind the KV side channel %s: %s\n", ep,
                zmq_strerror(zmq_errno()));
        return -1;
    }
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, last, &len) == 0 &&
        (colon = strrchr(last, ':')) != NULL)
        sim_side_port = atoi(colon + 1);
    return 0;
}

int sim_pd_kvt_start(void)
{
    efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    zctx = zmq_ctx_new();
    if (efd < 0 || !zctx)
        goto err;
    if (sim_cfg.kv_port || (sim_cfg.bootstrap_port && sim_cfg.role == SIM_ROLE_PREFILL)) {
        int zero = 0;
        router = zmq_socket(zctx, ZMQ_ROUTER);
        if (!router)
            goto err;
        int64_t maxmsg = 64 << 20; /* a decode's request body at most */
        zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        /* the bootstrap port serves HTTP (sim_bootstrap.c), which names this channel */
        if (bind_router(sim_cfg.kv_port))
            goto err;
    }
    if (sim_cfg.role == SIM_ROLE_DECODE) {
        /* the receivers named on the command line (lmcache's alloc/init ports) */
        main_delay = sim_cfg.kv_mode == SIM_KV_MODE_PULL_DELAY;
        main_nranks = sim_cfg.n_alloc_ports ? sim_cfg.n_alloc_ports : 1;
        for (int r = 0; r < main_nranks; r++) {
            uint16_t ap = r < sim_cfg.n_alloc_ports ? (uint16_t)sim_cfg.alloc_ports[r] : 0;
            uint16_t ip = r < sim_cfg.n_init_ports ? (uint16_t)sim_cfg.init_ports[r] : 0;
            receivers[2 + main_delay][r] = eng_create(1, 0, main_delay, 0, 1, r, ap, ip);
            if (!receivers[2 + main_delay][r])
                goto err;
        }
    }
    running = 1;
    if (pthread_create(&thread, NULL, kv_main, NULL)) {
        running = 0;
        goto err;
    }
    return 0;
err:
    sim_pd_kvt_stop();
    return -1;
}

void sim_pd_kvt_stop(void)
{
    if (running) {
        atomic_store(&stopping, 1);
        uint64_t one = 1;
        if (write(efd, &one, sizeof(one)) < 0)
            perror("pdgw-sim: eventfd");
        pthread_join(thread, NULL);
        running = 0;
    }
    /* answer every waiting decode request before the HTTP server stops */
    for (sim_import_t *imp = imports; imp; imp = imp->next)
        if (imp->phase != 3)
            import_resolve(imp, 0, 503, "engine shutting down");
    while (work_head) {
        work_t *w = work_head;
        work_head = w->next;
        if (w->type == 3) {
            json_decref(((ctl_send_t *)w->p)->msg);
            free(w->p);
        } else if (w->type == 1) {
            sim_engine_lock();
            sim_pd_export_unref_locked(w->p);
            sim_engine_unlock();
        } else {
            sim_import_t *imp = w->p;
            int known = 0;
            for (sim_import_t *x = imports; x; x = x->next)
                known |= x == imp;
            if (!known) {
                imp->next = imports;
                imports = imp;
                import_resolve(imp, 0, 503, "engine shutting down");
            }
        }
        free(w);
    }
    work_tail = NULL;
    pthread_mutex_lock(&eng_lock);
    for (int p = 0; p < 2; p++)
        for (int x = 0; x < SEND_FAMS; x++)
            for (int r = 0; r < SIM_MAX_TP; r++)
                if (senders[p][x][r]) {
                    kvt_engine_destroy(senders[p][x][r]->e);
                    free(senders[p][x][r]);
                    senders[p][x][r] = NULL;
                }
    for (int dl = 0; dl < 4; dl++)
        for (int r = 0; r < SIM_MAX_TP; r++)
            if (receivers[dl][r]) {
                kvt_engine_destroy(receivers[dl][r]->e);
                free(receivers[dl][r]);
                receivers[dl][r] = NULL;
            }
    pthread_mutex_unlock(&eng_lock);
    /* engines are gone: no task will complete any more */
    while (imports) {
        sim_import_t *imp = imports;
        imp->outstanding = 0;
        imp->phase = 3;
        import_free(imp);
    }
    sim_engine_lock();
    while (paced) {
        sim_export_t *x = paced;
        paced = x->pace_next;
        x->paced = 0;
        sim_pd_export_unref_locked(x);
    }
    sim_pd_exports_drop_all_locked();
    while (regs) {
        reg_t *r = regs;
        regs = r->next;
        free(r);
    }
    sim_engine_unlock();
    while (dealers) {
        dealer_t *d = dealers;
        dealers = d->next;
        zmq_close(d->sock);
        free(d);
    }
    if (router)
        zmq_close(router);
    router = NULL;
    if (zctx)
        zmq_ctx_term(zctx);
    zctx = NULL;
    if (efd >= 0)
        close(efd);
    efd = -1;
}

void sim_pd_kvt_stats(uint64_t *used, uint64_t *pinned)
{
    *used = *pinned = 0;
    pthread_mutex_lock(&eng_lock);
    for (int p = 0; p < 2; p++)
        for (int x = 0; x < SEND_FAMS; x++)
            for (int r = 0; r < SIM_MAX_TP; r++)
                if (senders[p][x][r]) {
                    kvt_pool_stats_t st;
                    kvt_engine_pool_stats(senders[p][x][r]->e, &st);
                    *used += st.used_pages;
                    *pinned += st.pinned_pages;
                }
    for (int dl = 0; dl < 4; dl++)
        for (int r = 0; r < SIM_MAX_TP; r++)
            if (receivers[dl][r]) {
                kvt_pool_stats_t st;
                kvt_engine_pool_stats(receivers[dl][r]->e, &st);
                *used += st.used_pages;
                *pinned += st.pinned_pages;
            }
    pthread_mutex_unlock(&eng_lock);
}

void sim_kv_pages(long long *used, long long *pinned)
{
    uint64_t u, p;
    if (sim_cfg.role == SIM_ROLE_BOTH) {
        *used = *pinned = 0;
        return;
    }
    sim_pd_kvt_stats(&u, &p);
    sim_engine_lock();
    int held = sim_pd_held_pages_locked();
    sim_engine_unlock();
    *used = (long long)u + held;
    *pinned = (long long)p + held;
}

char *sim_pd_kvt_metrics(void)
{
    kvt_metrics_t sum, m;
    int any = 0;
    memset(&sum, 0, sizeof(sum));
    sim_kvt_eng_t *all[SIM_MAX_ENGINES];
    pthread_mutex_lock(&eng_lock);
    int na = all_engines_locked(all);
    for (int k = 0; k < na; k++) {
        kvt_engine_metrics(all[k]->e, &m);
        any = 1;
        sum.bytes_write += m.bytes_write;
        sum.bytes_read += m.bytes_read;
        sum.transfer_count += m.transfer_count;
        sum.transfer_seconds_sum += m.transfer_seconds_sum;
        for (int b = 0; b < KVT_METRICS_NBUCKETS; b++)
            sum.transfer_buckets[b] += m.transfer_buckets[b];
        sum.alloc_failures_total += m.alloc_failures_total;
        sum.pinned_pages += m.pinned_pages;
        sum.free_pages += m.free_pages;
        sum.used_pages += m.used_pages;
        sum.breaker_open += m.breaker_open;
        sum.breaker_skips_total += m.breaker_skips_total;
        sum.bad_messages_total += m.bad_messages_total;
        sum.ctrl_timeouts_total += m.ctrl_timeouts_total;
        sum.proxy_notifs_total += m.proxy_notifs_total;
        sum.pull_expired_total += m.pull_expired_total;
        sum.pull_early_done_total += m.pull_early_done_total;
        sum.cancels_total += m.cancels_total;
        sum.backpressure_total += m.backpressure_total;
        sum.already_sent_total += m.already_sent_total;
        sum.transfer_errors_total += m.transfer_errors_total;
        sum.reserve_granted_total += m.reserve_granted_total;
        sum.reserve_refused_total += m.reserve_refused_total;
        sum.refusals_total += m.refusals_total;
        sum.alloc_expired_total += m.alloc_expired_total;
        sum.alloc_quota_refused_total += m.alloc_quota_refused_total;
        sum.lanes_refused_cap += m.lanes_refused_cap;
        sum.lanes_refused_hello += m.lanes_refused_hello;
        sum.lanes_closed_idle += m.lanes_closed_idle;
        sum.lanes_closed_stall += m.lanes_closed_stall;
        sum.data_access_denied += m.data_access_denied;
        sum.data_bad_frames += m.data_bad_frames;
    }
    pthread_mutex_unlock(&eng_lock);
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "# HELP sim_kv_ctl_bad_messages_total Malformed side-channel messages.\n"
                      "# TYPE sim_kv_ctl_bad_messages_total counter\n"
                      "sim_kv_ctl_bad_messages_total %llu\n",
                      (unsigned long long)atomic_load(&bad_ctl));
    size_t need = any ? kvt_metrics_format(&sum, NULL, NULL, 0) : 0;
    char *out = malloc((size_t)hl + need + 1);
    if (!out)
        return NULL;
    memcpy(out, head, (size_t)hl + 1);
    if (any)
        kvt_metrics_format(&sum, NULL, out + hl, need + 1);
    return out;
}
