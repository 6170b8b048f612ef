/*
 * PD roles: what each protocol's fields (docs/protocols/) ask of this
 * instance, and the prefill-side table of exports (KV computed here that a
 * decode instance will read or receive).
 *
 * Prefill side: a request with do_remote_decode (no transfer_id) holds its
 * KV after it finished and returns the vllm-nixl kv_transfer_params block;
 * one with transfer_id or bootstrap_room waits for a decode to register at
 * the bootstrap port; one with disagg_spec pushes to the named receiver. All
 * exports are freed when their transfer completes or, unclaimed, after
 * --kv-hold-timeout-ms.
 *
 * Decode side: the fields say where the KV is and how to get it; the request
 * waits in KV_WAIT (not counted as running) until sim_pd_kvt.c has loaded
 * and verified every page, then runs with its prefill already done.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "sim_pd_int.h"

sim_kv_geom_t sim_geom;
static sim_export_t *exports;
static uint64_t xfer_seq;
static sim_import_t *named; /* in-flight imports named by their X-Request-Id */

const char *sim_pd_kind_name(sim_pd_kind_t k)
{
    switch (k) {
    case SIM_PD_P_HOLD:
        return "hold";
    case SIM_PD_P_RENDEZVOUS:
        return "rendezvous";
    case SIM_PD_P_LMCACHE:
        return "lmcache-send";
    case SIM_PD_P_COMPUTE:
        return "kvt-compute";
    case SIM_PD_D_PULL_PARAMS:
        return "pull-params";
    case SIM_PD_D_KVT_STAGED:
        return "kvt-staged";
    case SIM_PD_D_KVT_BATCH:
        return "kvt-batch";
    case SIM_PD_D_MOONCAKE_PAR:
        return "mooncake-parallel";
    case SIM_PD_D_SGLANG:
        return "sglang";
    case SIM_PD_D_LMCACHE:
        return "lmcache-receive";
    default:
        return "none";
    }
}

/* ---- exports (engine lock held) ---- */
static void export_free(sim_export_t *e)
{
    free(e->hold_id);
    free(e->req_id);
    free(e->rv_key);
    sim_tokens_free(&e->prompt);
    free(e->blocks);
    free(e->block_ids);
    free(e->hashes);
    json_decref(e->rec_kv);
    free(e);
}

void sim_pd_export_unref_locked(sim_export_t *e)
{
    if (--e->refs == 0)
        export_free(e);
}

void sim_pd_export_remove_locked(sim_export_t *e)
{
    if (!e->in_table)
        return;
    for (sim_export_t **pp = &exports; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    e->in_table = 0;
    e->next = NULL;
    sim_pd_export_unref_locked(e);
}

/* ---- when the ProxyNotif went out ----
 * A proxy waits for an LMCache prefill's ProxyNotif before the decode, so the prefill engine's
 * part of a request lasts until the notice left (B3 counts it as engine time, not the
 * proxy's). libkvt sends it once the receiver confirmed the last batch, which can be well
 * after the sim hears that its stores finished (the confirmation waits its turn on the
 * receiver's channel) or, rarely, before: whichever of the two comes second writes the
 * record's kv_proxy_notif_us. Pending halves are few (one per transfer in flight); the
 * oldest are dropped past NOTIF_PENDING_MAX. */
#define NOTIF_PENDING_MAX 4096

typedef struct notif_pending {
    struct notif_pending *next;
    char xfer[SIM_XFER_MAX];
    uint64_t rec_seq; /* 0: the stores have not finished yet */
    uint64_t sent_us; /* 0: the ProxyNotif has not gone out yet */
} notif_pending_t;

static pthread_mutex_t notif_lock = PTHREAD_MUTEX_INITIALIZER;
static notif_pending_t *notif_head;
static size_t notif_count;

/* Record one half for <xfer>; stamps the record when the other half is there. */
static void notif_half(const char *xfer, uint64_t rec_seq, uint64_t sent_us)
{
    notif_pending_t **pp, *n = NULL;
    pthread_mutex_lock(&notif_lock);
    for (pp = &notif_head; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->xfer, xfer) == 0) {
            n = *pp;
            *pp = n->next;
            notif_count--;
            break;
        }
    }
    if (n != NULL) {
        uint64_t seq = rec_seq ? rec_seq : n->rec_seq;
        uint64_t at = sent_us ? sent_us : n->sent_us;
        free(n);
        pthread_mutex_unlock(&notif_lock);
        if (seq && at)
            sim_record_set(seq, "kv_proxy_notif_us", json_integer((json_int_t)at));
        return;
    }
    n = calloc(1, sizeof(*n));
    if (n != NULL) {
        snprintf(n->xfer, sizeof(n->xfer), "%s", xfer);
        n->rec_seq = rec_seq;
        n->sent_us = sent_us;
        n->next = notif_head;
        notif_head = n;
        if (++notif_count > NOTIF_PENDING_MAX) { /* drop the oldest (the list's tail) */
            for (pp = &notif_head; (*pp)->next != NULL; pp = &(*pp)->next)
                ;
            free(*pp);
            *pp = NULL;
            notif_count--;
        }
    }
    pthread_mutex_unlock(&notif_lock);
}

void sim_pd_proxy_notif_sent(void *arg, const char *xfer)
{
    (void)arg;
    if (xfer != NULL && xfer[0] != '\0')
        notif_half(xfer, 0, sim_now_ns() / 1000);
}

/* The transfer ended (or never will): free the held blocks, leave the table. */
void sim_pd_export_finish_locked(sim_export_t *e, int ok)
{
    if (e->done)
        return;
    e->done = 1;
    if (ok && e->lmcache && sim_cfg.proxy_port && e->rec_seq && e->xfer[0])
        notif_half(e->xfer, e->rec_seq, 0);
    if (ok) {
        atomic_fetch_add(&sim_ctr.kv_transfers_ok, 1);
    } else if (e->have_dest) {
        atomic_fetch_add(&sim_ctr.kv_transfers_failed, 1);
    }
    if (e->blocks) {
        sim_blocks_release(e->blocks, e->n_blocks);
        free(e->blocks);
        e->blocks = NULL;
        e->n_blocks = 0;
    }
    sim_pd_export_remove_locked(e);
    sim_engine_signal_locked(); /* freed capacity */
}

static int same_str(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

sim_export_t *sim_pd_export_find_locked(const char *hold_id, const char *req_id,
                                        uint64_t prompt_hash, const char *rv_key)
{
    sim_export_t *e;
    if (rv_key) {
        for (e = exports; e; e = e->next)
            if (!e->done && !e->have_dest && same_str(e->rv_key, rv_key))
                return e;
        return NULL;
    }
    if (hold_id) {
        for (e = exports; e; e = e->next)
            if (!e->done && e->kind == SIM_PD_P_HOLD && !e->have_dest &&
                same_str(e->hold_id, hold_id))
                return e;
        return NULL; /* an explicit id that is not here */
    }
    if (req_id) {
        for (e = exports; e; e = e->next)
            if (!e->done && e->kind == SIM_PD_P_HOLD && !e->have_dest &&
                same_str(e->req_id, req_id))
                return e;
    }
    for (e = exports; e; e = e->next)
        if (!e->done && e->kind == SIM_PD_P_HOLD && !e->have_dest &&
            e->prompt_hash == prompt_hash && e->computed)
            return e;
    return NULL;
}

sim_export_t *sim_pd_export_find_xfer_locked(const char *xfer)
{
    for (sim_export_t *e = exports; e; e = e->next)
        if (!e->done && e->have_dest && !strcmp(e->xfer, xfer))
            return e;
    return NULL;
}

sim_export_t *sim_pd_export_new_locked(sim_req_t *req, sim_pd_kind_t kind)
{
    sim_export_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->kind = kind;
    e->refs = 1; /* the table's */
    e->in_table = 1;
    e->hold_id = strdup(req->request_id);
    e->req_id = strdup(req->request_id);
    e->dp_rank = req->dp_rank;
    e->prompt_hash = req->prompt_hash;
    sim_kv_geom_t g = sim_geom;
    if (kind == SIM_PD_P_LMCACHE && sim_kv_geom_lmcache(&g, 1))
        g = sim_geom; /* checked when the request was read */
    e->nchunks = sim_kv_nchunks(&g, req->prompt.n);
    e->hashes = calloc(e->nchunks ? e->nchunks : 1, sizeof(uint64_t));
    for (size_t i = 0; i < req->prompt.n; i++)
        if (sim_tokens_push(&e->prompt, req->prompt.ids[i]))
            goto err;
    if (!e->hold_id || !e->req_id || !e->hashes)
        goto err;
    sim_kv_chunk_hashes(&e->prompt, &g, e->hashes);
    e->next = exports;
    exports = e;
    return e;
err:
    export_free(e);
    return NULL;
}

void sim_pd_exports_expire_locked(uint64_t now)
{
    sim_export_t *e = exports, *next;
    for (; e; e = next) {
        next = e->next;
        if (e->t_expire && now >= e->t_expire && !e->have_dest && !e->done) {
            atomic_fetch_add(&sim_ctr.kv_hold_timeouts, 1);
            fprintf(stderr, "pdgw-sim: KV of request %s unclaimed after %d ms, freed\n", e->req_id,
                    sim_cfg.kv_hold_timeout_ms);
            sim_pd_export_finish_locked(e, 0);
        }
    }
}

void sim_pd_exports_drop_all_locked(void)
{
    while (exports) {
        sim_export_t *e = exports;
        e->done = 1;
        if (e->blocks) {
            sim_blocks_release(e->blocks, e->n_blocks);
            free(e->blocks);
            e->blocks = NULL;
        }
        sim_pd_export_remove_locked(e);
    }
}

int sim_pd_held_pages_locked(void)
{
    int n = 0;
    for (sim_export_t *e = exports; e; e = e->next)
        if (e->blocks)
            n += (int)e->nchunks * (sim_cfg.layerwise ? sim_cfg.layers : 1); /* pages */
    return n;
}

/* ---- field parsing ---- */
static int fail400(char **msg, const char *fmt, const char *a)
{
    if (asprintf(msg, fmt, a) < 0)
        *msg = NULL;
    return 400;
}

static const char *opt_str(json_t *o, const char *k, int *bad)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_string(v)) {
        *bad = 1;
        return NULL;
    }
    return json_string_value(v);
}

/* Integer or integer-valued string (ids travel as either). Returns 1 if present. */
static int opt_id(json_t *o, const char *k, char *out, size_t cap, int *bad)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        snprintf(out, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return 1;
    }
    if (json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < cap) {
        snprintf(out, cap, "%s", json_string_value(v));
        return 1;
    }
    *bad = 1;
    return 0;
}

static int opt_port(json_t *o, const char *k, int *out, int *bad)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535) {
        *bad = 1;
        return 0;
    }
    *out = (int)json_integer_value(v);
    return 1;
}

static int port_list(json_t *a, uint16_t *out, int *n)
{
    size_t i;
    json_t *v;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > SIM_MAX_TP)
        return -1;
    json_array_foreach(a, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535)
            return -1;
        out[i] = (uint16_t)json_integer_value(v);
    }
    *n = (int)json_array_size(a);
    return 0;
}

/* "http://host:port" (or host:port) → http://host:port, the bootstrap server the KV thread
 * asks for the prefill's side channel */
static int parse_bootstrap_addr(const char *s, char *ep, size_t cap)
{
    const char *p = s;
    if (!strncmp(p, "http://", 7))
        p += 7;
    else if (!strncmp(p, "https://", 8))
        p += 8;
    const char *colon = strrchr(p, ':');
    if (!colon || colon == p)
        return -1;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (port < 1 || port > 65535 || (*end && *end != '/'))
        return -1;
    int hl = (int)(colon - p);
    if (hl >= 100)
        return -1;
    snprintf(ep, cap, "http://%.*s:%ld", hl, p, port);
    return 0;
}

static sim_kv_mode_t choose_mode(sim_pd_kind_t kind)
{
    sim_kv_mode_t forced = sim_cfg.kv_mode;
    switch (kind) {
    case SIM_PD_D_PULL_PARAMS:
    case SIM_PD_D_KVT_STAGED:
        /* the decode reads: pull-eager unless pull-delay is forced */
        return forced == SIM_KV_MODE_PULL_DELAY ? SIM_KV_MODE_PULL_DELAY : SIM_KV_MODE_PULL_EAGER;
    case SIM_PD_P_LMCACHE:
        return forced == SIM_KV_MODE_AUTO ? SIM_KV_MODE_PUSH : forced;
    case SIM_PD_D_LMCACHE:
        /* the sender picks push or pull; this receiver only decides on delay */
        return forced == SIM_KV_MODE_PULL_DELAY ? SIM_KV_MODE_PULL_DELAY : SIM_KV_MODE_AUTO;
    default:
        return SIM_KV_MODE_PUSH; /* the prefill writes into decode pages */
    }
}

static struct sim_kv_req *kv_new(sim_pd_kind_t kind)
{
    struct sim_kv_req *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return NULL;
    kv->kind = kind;
    kv->mode = choose_mode(kind);
    kv->info =
        json_pack("{s:s,s:s,s:s}", "side", kind >= SIM_PD_D_PULL_PARAMS ? "decode" : "prefill",
                  "kind", sim_pd_kind_name(kind), "mode", sim_kv_mode_name(kv->mode));
    return kv;
}

static int prepare_prefill(sim_req_t *req, json_t *body, json_t *kvp, char **msg)
{
    int bad = 0;
    sim_pd_kind_t kind = SIM_PD_NONE;
    char rv[96] = "";
    sim_receiver_t dest;
    const char *lmc_req = NULL;
    memset(&dest, 0, sizeof(dest));

    json_t *spec = kvp ? json_object_get(kvp, "disagg_spec") : NULL;
    json_t *drd = kvp ? json_object_get(kvp, "do_remote_decode") : NULL;
    if (drd && !json_is_null(drd) && !json_is_boolean(drd))
        return fail400(msg, "kv_transfer_params.%s must be a boolean", "do_remote_decode");
    if (spec && !json_is_null(spec)) {
        const char *host;
        int na = 0, ni = 0;
        if (!json_is_object(spec))
            return fail400(msg, "kv_transfer_params.%s must be an object", "disagg_spec");
        lmc_req = opt_str(spec, "req_id", &bad);
        host = opt_str(spec, "receiver_host", &bad);
        if (bad || !lmc_req || !*lmc_req || !host || !*host)
            return fail400(msg, "kv_transfer_params.disagg_spec needs %s",
                           "req_id and receiver_host strings");
        if (port_list(json_object_get(spec, "receiver_alloc_port"), dest.alloc_ports, &na) ||
            port_list(json_object_get(spec, "receiver_init_port"), dest.init_ports, &ni) ||
            na != ni)
            return fail400(msg, "kv_transfer_params.disagg_spec needs %s",
                           "receiver_alloc_port and receiver_init_port lists of equal length");
        if (strlen(host) >= sizeof(dest.host) || strlen(lmc_req) >= 100)
            return fail400(msg, "kv_transfer_params.disagg_spec.%s too long", "req_id/host");
        snprintf(dest.host, sizeof(dest.host), "%s", host);
        dest.nranks = na;
        sim_kv_geom_t g;
        if (sim_kv_geom_lmcache(&g, na))
            return fail400(msg, "%s does not divide this engine's KV bytes per layer",
                           "the receiver's TP size");
        kind = SIM_PD_P_LMCACHE;
    } else if (drd && json_is_true(drd)) {
        if (opt_id(kvp, "transfer_id", rv + 4, sizeof(rv) - 4, &bad)) {
            memcpy(rv, "tid:", 4);
            kind = SIM_PD_P_RENDEZVOUS;
        } else if (bad) {
            return fail400(msg, "kv_transfer_params.%s must be a string or an integer",
                           "transfer_id");
        } else if (sim_cfg.mooncake_prefill) {
            /* vLLM's MooncakeConnector (mooncake_connector.py, update_state_after_alloc):
             * without transfer_id it logs a warning and transfers nothing; the request runs
             * as a plain one and returns no kv_transfer_params */
            fprintf(stderr,
                    "pdgw-sim: request %s: missing transfer_id in kv_transfer_params; "
                    "its KV is not sent\n",
                    req->request_id);
            sim_record_set(req->rec_seq, "kv_warning",
                           json_string("missing transfer_id in kv_transfer_params"));
            return 0;
        } else {
            kind = SIM_PD_P_HOLD;
        }
    } else if (json_object_get(body, "bootstrap_room")) {
        int port;
        const char *h = opt_str(body, "bootstrap_host", &bad);
        int has_port = json_is_null(json_object_get(body, "bootstrap_port")) ||
                       opt_port(body, "bootstrap_port", &port, &bad);
        json_t *room = json_object_get(body, "bootstrap_room");
        if (bad || !h || !has_port || !json_is_integer(room) || json_integer_value(room) < 0)
            return fail400(msg, "%s",
                           "bootstrap_host (string), bootstrap_port (integer or null) and "
                           "bootstrap_room (non-negative integer) are required together");
        /* SGLang's prefill with DP runs a request on routed_dp_rank when the router pinned
         * one, else it follows the room: worker room % dp_size */
        json_t *rdr = json_object_get(body, "routed_dp_rank");
        if (rdr && !json_is_null(rdr)) {
            if (!json_is_integer(rdr) || json_integer_value(rdr) < 0 ||
                json_integer_value(rdr) >= sim_cfg.dp_size)
                return fail400(msg, "%s must be an integer in [0, --dp-size)", "routed_dp_rank");
            req->dp_rank = (int)json_integer_value(rdr);
        } else if (sim_cfg.dp_size > 1) {
            req->dp_rank = (int)(json_integer_value(room) % sim_cfg.dp_size);
        }
        snprintf(rv, sizeof(rv), "room:%" JSON_INTEGER_FORMAT, json_integer_value(room));
        kind = SIM_PD_P_RENDEZVOUS;
    }
    if (kind == SIM_PD_NONE)
        return 0;
    if (kind == SIM_PD_P_HOLD && !sim_cfg.kv_port)
        return fail400(msg, "%s", "this prefill instance has no --kv-port to serve its KV from");
    if (kind == SIM_PD_P_RENDEZVOUS && !sim_cfg.bootstrap_port)
        return fail400(msg, "%s", "this prefill instance has no --bootstrap-port");

    struct sim_kv_req *kv = kv_new(kind);
    if (!kv)
        return 500;
    req->kv = kv;
    sim_engine_lock();
    sim_export_t *e = sim_pd_export_new_locked(req, kind);
    if (!e) {
        sim_engine_unlock();
        return 500;
    }
    e->refs++; /* the request's */
    kv->exp = e;
    if (e->dp_rank >= 0)
        json_object_set_new(kv->info, "dp_rank", json_integer(e->dp_rank));
    if (rv[0]) {
        e->rv_key = strdup(rv);
        json_object_set_new(kv->info, "rendezvous", json_string(rv));
        sim_pd_rendezvous_attach_locked(e);
    }
    if (kind == SIM_PD_P_LMCACHE) {
        e->dest = dest;
        e->have_dest = 1;
        e->lmcache = 1;
        e->rec_seq = req->rec_seq; /* kv_proxy_notif_us */
        e->mode = kv->mode;
        snprintf(e->xfer, sizeof(e->xfer), "%s", lmc_req);
        json_object_set_new(kv->info, "req_id", json_string(lmc_req));
    } else {
        /* the record shows the transfer's req_id once a decode names it */
        e->rec_seq = req->rec_seq;
        e->rec_kv = json_deep_copy(kv->info);
    }
    sim_engine_unlock();
    return 0;
}

static int fail409(char **msg, const char *request_id)
{
    if (asprintf(msg,
                 "X-Request-Id '%s' names a KV transfer still in flight on this instance "
                 "(vllm-kvt uses it as the transfer's req_id); use a unique X-Request-Id",
                 request_id) < 0)
        *msg = NULL;
    return 409;
}

void sim_pd_import_unname_locked(sim_import_t *imp)
{
    if (!imp->named)
        return;
    for (sim_import_t **pp = &named; *pp; pp = &(*pp)->named_next)
        if (*pp == imp) {
            *pp = imp->named_next;
            break;
        }
    imp->named = 0;
    imp->named_next = NULL;
}

/* remote_block_ids of a NIXL decode leg as one flat list (new reference): older vLLM sends
 * a flat list, the newest one list per KV-cache group (this engine has one group). NULL when
 * absent or empty (the decode then recomputes); *bad on a wrong type. */
static json_t *nixl_block_ids(json_t *kvp, int *bad)
{
    json_t *ids = json_object_get(kvp, "remote_block_ids");
    json_t *flat, *v, *w;
    size_t i, j;
    if (!ids || json_is_null(ids))
        return NULL;
    if (!json_is_array(ids)) {
        *bad = 1;
        return NULL;
    }
    flat = json_array();
    json_array_foreach(ids, i, v)
    {
        if (json_is_integer(v)) {
            json_array_append(flat, v);
            continue;
        }
        if (!json_is_array(v)) {
            *bad = 1;
            break;
        }
        json_array_foreach(v, j, w)
        {
            if (!json_is_integer(w))
                *bad = 1;
            else
                json_array_append(flat, w);
        }
    }
    if (*bad || json_array_size(flat) == 0) {
        json_decref(flat);
        return NULL;
    }
    return flat;
}

/* Unusable NIXL params: like vLLM, compute the prompt here; count and record it. */
static void nixl_invalid_params(sim_req_t *req, json_t *kvp)
{
    static const char *const keys[] = {"remote_block_ids", "remote_engine_id", "remote_request_id",
                                       "remote_host", "remote_port"};
    const char *lack = "remote_block_ids";
    json_t *v;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        v = json_object_get(kvp, keys[i]);
        if (!v || (i == 0 && (json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)))) {
            lack = keys[i];
            break;
        }
    }
    atomic_fetch_add(&sim_ctr.kv_invalid_params, 1);
    fprintf(stderr,
            "pdgw-sim: request %s: Got invalid KVTransferParams (no usable %s); the prompt is "
            "recomputed\n",
            req->request_id, lack);
    sim_record_set(
        req->rec_seq, "kv",
        json_pack("{s:s,s:s,s:s}", "side", "decode", "kind", "pull-params", "invalid", lack));
    sim_record_set(req->rec_seq, "kv_result",
                   json_pack("{s:b,s:b,s:I,s:s}", "ok", 0, "recompute", 1, "bytes", (json_int_t)0,
                             "error", "invalid kv_transfer_params"));
}

/* Every NIXL key present but one of them null: vLLM schedules the pull, which cannot reach
 * a null peer, and its default kv_load_failure_policy "fail" (vllm/config/kv_transfer.py)
 * fails the request instead of computing the prompt. */
static int nixl_null_params(sim_req_t *req, json_t *kvp, char **msg)
{
    static const char *const keys[] = {"remote_engine_id", "remote_request_id", "remote_host",
                                       "remote_port"};
    const char *null_key = keys[0];
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (json_is_null(json_object_get(kvp, keys[i]))) {
            null_key = keys[i];
            break;
        }
    atomic_fetch_add(&sim_ctr.kv_transfers_failed, 1);
    sim_record_set(req->rec_seq, "kv_result",
                   json_pack("{s:b,s:b,s:I,s:s}", "ok", 0, "recompute", 0, "bytes", (json_int_t)0,
                             "error", "kv_transfer_params names a null peer"));
    if (asprintf(msg, "KV transfer failed: kv_transfer_params.%s is null", null_key) < 0)
        *msg = NULL;
    return 500;
}

/* What a decode leg's body asks of the KV import (prepare_decode's parse). */
typedef struct {
    sim_pd_kind_t kind;
    char ep[160], key[96];
    const char *expect_engine, *wait_id; /* borrowed from the body */
    json_t *ctl;                         /* the side-channel request to the prefill */
    int64_t room;
    int prefill_rank;
} decode_spec_t;

/* SGLang: bootstrap_host / bootstrap_port / bootstrap_room at the top level. */
static int parse_sglang_decode(json_t *body, decode_spec_t *d, char **msg)
{
    int bad = 0, port = 0;
    const char *h = opt_str(body, "bootstrap_host", &bad);
    int null_port = json_is_null(json_object_get(body, "bootstrap_port"));
    int has_port = null_port || opt_port(body, "bootstrap_port", &port, &bad);
    json_t *room = json_object_get(body, "bootstrap_room");
    if (bad || !h || !has_port || !json_is_integer(room) || json_integer_value(room) < 0 ||
        strlen(h) > 100)
        return fail400(msg, "%s",
                       "bootstrap_host (string), bootstrap_port (integer or null) and "
                       "bootstrap_room (non-negative integer) are required together");
    /* null: the engine's own --disaggregation-bootstrap-port (SGLang default 8998) */
    if (null_port)
        port = sim_cfg.bootstrap_port ? sim_cfg.bootstrap_port : 8998;
    snprintf(d->ep, sizeof(d->ep), "http://%s:%d", h, port);
    snprintf(d->key, sizeof(d->key), "room:%" JSON_INTEGER_FORMAT, json_integer_value(room));
    json_t *rdr = json_object_get(body, "routed_dp_rank");
    json_t *pdr = json_object_get(body, "disagg_prefill_dp_rank");
    if (rdr && !json_is_null(rdr) &&
        (!json_is_integer(rdr) || json_integer_value(rdr) < 0 ||
         json_integer_value(rdr) >= sim_cfg.dp_size))
        return fail400(msg, "%s must be an integer in [0, --dp-size)", "routed_dp_rank");
    if (pdr && !json_is_null(pdr) &&
        (!json_is_integer(pdr) || json_integer_value(pdr) < 0 || json_integer_value(pdr) > 65535))
        return fail400(msg, "%s must be a non-negative integer", "disagg_prefill_dp_rank");
    d->room = json_integer_value(room);
    d->prefill_rank = pdr && json_is_integer(pdr) ? (int)json_integer_value(pdr) : -1;
    d->kind = SIM_PD_D_SGLANG;
    return 0;
}

/* do_remote_prefill: Mooncake (transfer_id), NIXL (remote_block_ids...) or vllm-kvt staged. */
static int parse_remote_prefill(sim_req_t *req, json_t *kvp, decode_spec_t *d, char **msg)
{
    int bad = 0, port = 0;
    char tid[80];
    if (opt_id(kvp, "transfer_id", tid, sizeof(tid), &bad)) {
        const char *addr = opt_str(kvp, "remote_bootstrap_addr", &bad);
        const char *bh = opt_str(kvp, "bootstrap_server_host", &bad);
        int has_bp = opt_port(kvp, "bootstrap_server_port", &port, &bad);
        if (addr) {
            if (parse_bootstrap_addr(addr, d->ep, sizeof(d->ep)))
                return fail400(msg,
                               "kv_transfer_params.remote_bootstrap_addr '%s' is not "
                               "http://host:port",
                               addr);
        } else if (bh && has_bp && strlen(bh) <= 100) {
            snprintf(d->ep, sizeof(d->ep), "http://%s:%d", bh, port);
        } else {
            return fail400(msg, "kv_transfer_params with %s",
                           "transfer_id needs remote_bootstrap_addr");
        }
        d->expect_engine = opt_str(kvp, "remote_engine_id", &bad);
        snprintf(d->key, sizeof(d->key), "tid:%s", tid);
        d->kind = SIM_PD_D_MOONCAKE_PAR;
    } else if (bad) {
        return fail400(msg, "kv_transfer_params.%s must be a string or an integer", "transfer_id");
    } else {
        const char *host = opt_str(kvp, "remote_host", &bad);
        int has_port = opt_port(kvp, "remote_port", &port, &bad);
        int nixl = json_object_get(kvp, "remote_engine_id") ||
                   json_object_get(kvp, "remote_request_id") ||
                   json_object_get(kvp, "remote_block_ids");
        if (bad || (host && strlen(host) > 100))
            return fail400(msg, "kv_transfer_params.%s",
                           "remote_host (string) and remote_port (integer) are required");
        if (nixl || !host || !has_port) {
            /* vLLM NixlConnector (nixl/pull_scheduler.py, update_state_after_alloc):
             * pulls only with non-empty remote_block_ids and the keys remote_engine_id,
             * remote_request_id, remote_host, remote_port present (`p in params`: a key
             * present with null counts); otherwise it warns "Got invalid KVTransferParams"
             * and computes the prompt itself. */
            json_t *ids = nixl_block_ids(kvp, &bad);
            const char *rid = opt_str(kvp, "remote_request_id", &bad);
            d->expect_engine = opt_str(kvp, "remote_engine_id", &bad);
            if (bad) {
                json_decref(ids);
                return fail400(msg, "kv_transfer_params: %s",
                               "remote_block_ids must be a list of integers (or of lists of "
                               "integers); remote_engine_id and remote_request_id strings");
            }
            if (!ids || !json_object_get(kvp, "remote_engine_id") ||
                !json_object_get(kvp, "remote_request_id") ||
                !json_object_get(kvp, "remote_host") || !json_object_get(kvp, "remote_port")) {
                json_decref(ids);
                nixl_invalid_params(req, kvp);
                return 0;
            }
            if (!rid || !d->expect_engine || !host || !has_port) {
                json_decref(ids);
                return nixl_null_params(req, kvp, msg);
            }
            snprintf(d->ep, sizeof(d->ep), "tcp://%s:%d", host, port);
            d->kind = SIM_PD_D_PULL_PARAMS;
            d->ctl = json_pack("{s:s,s:s,s:o,s:s}", "op", "pull", "remote_request_id", rid,
                               "remote_block_ids", ids, "remote_engine_id", d->expect_engine);
        } else {
            snprintf(d->ep, sizeof(d->ep), "tcp://%s:%d", host, port);
            d->kind = SIM_PD_D_KVT_STAGED;
            d->ctl = json_pack("{s:s}", "op", "pull");
        }
    }
    return 0;
}

/* vllm-kvt batch: remote_host / remote_port without do_remote_prefill. */
static int parse_kvt_batch(sim_req_t *req, json_t *body, json_t *kvp, decode_spec_t *d, char **msg)
{
    int bad = 0, port = 0;
    const char *host = opt_str(kvp, "remote_host", &bad);
    int has_port = opt_port(kvp, "remote_port", &port, &bad);
    if (bad || !host || !has_port || strlen(host) > 100)
        return fail400(msg, "kv_transfer_params.%s",
                       "remote_host (string) and remote_port (integer) are required");
    snprintf(d->ep, sizeof(d->ep), "tcp://%s:%d", host, port);
    d->kind = SIM_PD_D_KVT_BATCH;
    /* the prefill computes this very request: send it the body */
    json_t *copy = json_deep_copy(body);
    d->ctl = json_pack("{s:s,s:o,s:b}", "op", "compute", "body", copy, "is_chat", req->is_chat);
    return 0;
}

/* LMCache: the decode waits for pushes named by disagg_spec.req_id (or its own id). */
static int parse_lmcache_decode(json_t *kvp, decode_spec_t *d, char **msg)
{
    int bad = 0;
    d->kind = SIM_PD_D_LMCACHE;
    json_t *spec = kvp ? json_object_get(kvp, "disagg_spec") : NULL;
    d->wait_id = spec ? opt_str(spec, "req_id", &bad) : NULL;
    if (bad || (d->wait_id && (!*d->wait_id || strlen(d->wait_id) >= 100)))
        return fail400(msg, "kv_transfer_params.disagg_spec.%s must be a string", "req_id");
    return 0;
}

static int parse_decode(sim_req_t *req, json_t *body, json_t *kvp, decode_spec_t *d, char **msg)
{
    json_t *drp = kvp ? json_object_get(kvp, "do_remote_prefill") : NULL;
    if (drp && !json_is_null(drp) && !json_is_boolean(drp))
        return fail400(msg, "kv_transfer_params.%s must be a boolean", "do_remote_prefill");
    if (json_object_get(body, "bootstrap_room"))
        return parse_sglang_decode(body, d, msg);
    if (drp && json_is_true(drp))
        return parse_remote_prefill(req, kvp, d, msg);
    if (kvp && json_object_get(kvp, "remote_host"))
        return parse_kvt_batch(req, body, kvp, d, msg);
    if (sim_cfg.n_alloc_ports > 0)
        return parse_lmcache_decode(kvp, d, msg);
    return 0;
}

static int prepare_decode(sim_req_t *req, json_t *body, json_t *kvp, char **msg)
{
    decode_spec_t spec = {.kind = SIM_PD_NONE, .prefill_rank = -1};
    decode_spec_t *d = &spec;
    int rc = parse_decode(req, body, kvp, d, msg);
    sim_pd_kind_t kind;
    json_t *ctl;

    if (rc != 0) {
        json_decref(d->ctl);
        return rc;
    }
    kind = d->kind;
    ctl = d->ctl;
    if (kind == SIM_PD_NONE)
        return 0;
    if ((kind == SIM_PD_D_SGLANG || kind == SIM_PD_D_MOONCAKE_PAR) && !ctl) {
        ctl = json_pack("{s:s,s:s}", "op", "register", "key", d->key);
        if (ctl && d->expect_engine) /* the prefill checks it names the rank that ran it */
            json_object_set_new(ctl, "remote_engine_id", json_string(d->expect_engine));
    }
    if (kind != SIM_PD_D_LMCACHE && !ctl)
        return 500;

    struct sim_kv_req *kv = kv_new(kind);
    sim_import_t *imp = calloc(1, sizeof(*imp));
    if (!kv || !imp) {
        free(kv);
        free(imp);
        json_decref(ctl);
        return 500;
    }
    req->kv = kv;
    kv->imp = imp;
    imp->kind = kind;
    imp->mode = kv->mode;
    imp->ctl = ctl;
    imp->nranks = kind == SIM_PD_D_LMCACHE ? sim_cfg.n_alloc_ports : 1;
    imp->room = d->room;
    imp->prefill_rank = d->prefill_rank;
    _Static_assert(sizeof(imp->endpoint) == sizeof(d->ep), "endpoint sizes");
    memcpy(imp->endpoint, d->ep, sizeof(imp->endpoint)); /* NUL-terminated by snprintf */
    if (d->expect_engine)
        imp->expect_engine_id = strdup(d->expect_engine);
    if (d->wait_id) {
        imp->wait_id = strdup(d->wait_id);
        json_object_set_new(kv->info, "req_id", json_string(d->wait_id));
    }
    sim_engine_lock();
    if (kind == SIM_PD_D_KVT_BATCH || kind == SIM_PD_D_KVT_STAGED) {
        /* vllm-kvt: the transfer is named by the decode leg's X-Request-Id,
         * so a gateway's ReserveRequest / CancelNotif for that id address it;
         * a second request with an id still in flight here is refused */
        for (sim_import_t *x = named; x; x = x->named_next)
            if (!strcmp(x->xfer, req->request_id)) {
                sim_engine_unlock();
                kv->imp = NULL;
                json_decref(imp->ctl);
                free(imp->expect_engine_id);
                free(imp->wait_id);
                free(imp);
                return fail409(msg, req->request_id);
            }
        snprintf(imp->xfer, sizeof(imp->xfer), "%s", req->request_id);
        imp->named = 1;
        imp->named_next = named;
        named = imp;
        json_object_set_new(kv->info, "req_id", json_string(imp->xfer));
    } else {
        snprintf(imp->xfer, sizeof(imp->xfer), "%.63s#%" PRIu64, sim_cfg.engine_id, ++xfer_seq);
    }
    req->refs++;
    imp->req = req;
    sim_engine_unlock();
    if (ctl) {
        char ph[32];
        snprintf(ph, sizeof(ph), "%016" PRIx64, req->prompt_hash);
        json_object_set_new(ctl, "xfer", json_string(imp->xfer));
        json_object_set_new(ctl, "mode", json_string(sim_kv_mode_name(imp->mode)));
        json_object_set_new(ctl, "request_id", json_string(req->request_id));
        json_object_set_new(ctl, "prompt_hash", json_string(ph));
        json_object_set_new(ctl, "engine_id", json_string(sim_cfg.engine_id));
        json_object_set_new(kv->info, "endpoint", json_string(d->ep));
    }
    json_object_set_new(kv->info, "xfer", json_string(imp->xfer));
    return 0;
}

int sim_kv_prepare(sim_req_t *req, json_t *body, char **msg)
{
    json_t *kvp = json_object_get(body, "kv_transfer_params");
    int rc;
    if (kvp && !json_is_null(kvp) && !json_is_object(kvp))
        return fail400(msg, "%s must be an object", "kv_transfer_params");
    if (kvp && json_is_null(kvp))
        kvp = NULL;
    if (kvp && json_object_get(kvp, "ret_first_tok") && req->out.n > 0 && !req->resp_kv_params) {
        /* LMCache's vLLM connector (lmcache/integration/vllm/vllm_v1_adapter.py,
         * request_finished): "ret_first_tok" in kv_transfer_params -> the answer's
         * kv_transfer_params = {"first_tok": the first output token id} */
        req->resp_kv_params = json_pack("{s:I}", "first_tok", (json_int_t)req->out.ids[0]);
        if (req->resp_kv_params)
            sim_record_set(req->rec_seq, "response_kv_transfer_params",
                           json_incref(req->resp_kv_params));
    }
    if (sim_cfg.role == SIM_ROLE_PREFILL)
        rc = prepare_prefill(req, body, kvp, msg);
    else if (sim_cfg.role == SIM_ROLE_DECODE)
        rc = prepare_decode(req, body, kvp, msg);
    else
        rc = 0;
    if (!rc && req->kv && req->kv->info)
        sim_record_set(req->rec_seq, "kv", json_incref(req->kv->info));
    return rc;
}

void sim_kv_reject(const json_t *body)
{
    const json_t *kvp = json_object_get(body, "kv_transfer_params");
    const char *rid = json_string_value(json_object_get(kvp, "remote_request_id"));
    const char *eid = json_string_value(json_object_get(kvp, "remote_engine_id"));
    const char *host = json_string_value(json_object_get(kvp, "remote_host"));
    json_t *port = json_object_get(kvp, "remote_port");
    char ep[160];
    static atomic_uint seq;
    char xfer[64];
    /* vLLM NixlConnector (nixl/pull_scheduler.py, request_finished): a request that ends
     * still marked do_remote_prefill (rejected before it was scheduled) queues an empty
     * read, and the worker's notification tells the prefill to free the blocks. Only a
     * request naming where the KV is can do that. */
    if (!json_is_true(json_object_get(kvp, "do_remote_prefill")) || !rid || !eid || !host ||
        strlen(host) > 100 || !json_is_integer(port) || json_integer_value(port) <= 0 ||
        json_integer_value(port) > 65535)
        return;
    snprintf(ep, sizeof(ep), "tcp://%s:%d", host, (int)json_integer_value(port));
    snprintf(xfer, sizeof(xfer), "%.40s#rel%u", sim_cfg.engine_id, atomic_fetch_add(&seq, 1));
    json_t *m = json_pack("{s:s,s:s,s:s,s:s}", "op", "release", "xfer", xfer, "remote_request_id",
                          rid, "remote_engine_id", eid);
    if (m)
        sim_pd_send_ctl(ep, m); /* takes m */
}

/* The prompt tokens whose KV an lmcache decode looks up: LMCache's connector drops the last
 * skip_last_n_tokens before its lookup (vllm_v1_adapter.py, get_num_new_matched_tokens), so a
 * decode whose prompt ends with the prefill's first token (LMCache's proxy appends it) finds
 * the KV the prefill stored for the prompt alone. */
size_t sim_kv_lookup_len(const sim_req_t *req)
{
    size_t skip = (size_t)sim_cfg.skip_last_n_tokens;
    return req->prompt.n > skip ? req->prompt.n - skip : 0;
}

/* ---- engine hooks ---- */
int sim_kv_layered(const sim_req_t *req)
{
    return sim_cfg.layerwise && req->kv && req->kv->exp;
}

int sim_kv_needs_remote(const sim_req_t *req)
{
    return req->kv && req->kv->imp && !req->kv->remote_filled && !req->kv->imp->recompute;
}

int sim_kv_remote_filled(const sim_req_t *req)
{
    return req->kv && req->kv->remote_filled;
}

void sim_kv_begin_remote(sim_req_t *req)
{
    sim_pd_kick_import(req->kv->imp);
}

void sim_kv_on_layer_done_locked(sim_req_t *req, int layer)
{
    sim_export_t *e = req->kv ? req->kv->exp : NULL;
    if (!e)
        return;
    e->layers_done = layer + 1;
    if (e->have_dest)
        sim_pd_kick_export(e);
}

/* The id vLLM's engine knows the request by, which a NIXL prefill hands out as
 * remote_request_id: the OpenAI layer wraps X-Request-Id ("cmpl-<id>-0" per completions
 * prompt, "chatcmpl-<id>" for chat; vllm/entrypoints/openai/serving_completion.py,
 * serving_chat.py) and the newest engines append "-" and 8 random hex characters
 * (vllm/v1/engine/input_processor.py, assign_request_id). */
static void nixl_hold_id(sim_export_t *e, const sim_req_t *req)
{
    char *id = NULL;
    unsigned r = 0;
    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        r = (unsigned)sim_now_ns();
    int n = sim_cfg.nixl_older ? asprintf(&id, "%s-%s%s", req->is_chat ? "chatcmpl" : "cmpl",
                                          req->request_id, req->is_chat ? "" : "-0")
                               : asprintf(&id, "%s-%s%s-%08x", req->is_chat ? "chatcmpl" : "cmpl",
                                          req->request_id, req->is_chat ? "" : "-0", r);
    if (n < 0)
        return; /* keep the plain id */
    free(e->hold_id);
    e->hold_id = id;
}

void sim_kv_on_prefill_done_locked(sim_req_t *req)
{
    sim_export_t *e = req->kv ? req->kv->exp : NULL;
    if (!e)
        return;
    e->layers_done = sim_cfg.layers;
    e->computed = 1;
    if (e->kind == SIM_PD_P_RENDEZVOUS && sim_cfg.mooncake_prefill &&
        strcmp(req->out.finish_reason, "length")) {
        /* vLLM's MooncakeConnector (request_finished): only a length-capped prefill sends
         * its KV; one that stopped (EOS, stop string) drops the transfer */
        e->failed = 1;
        snprintf(e->err, sizeof(e->err),
                 "the prefill finished with '%s', not 'length': its KV is not sent",
                 req->out.finish_reason);
        sim_record_set(req->rec_seq, "kv_warning", json_string(e->err));
    }
    if (e->kind == SIM_PD_P_HOLD) {
        if (!strcmp(req->out.finish_reason, "stop") && sim_cfg.nixl_stop_drops) {
            /* vLLM's older NixlConnector (nixl_connector.py, nixl/scheduler.py:
             * request_finished) kept KV only for FINISHED_LENGTH_CAPPED: a prefill that
             * stopped (EOS / stop string) returns no kv_transfer_params and frees its KV.
             * The current one (nixl/pull_scheduler.py) treats FINISHED_STOPPED alike:
             * it holds the blocks and returns the params below. */
            sim_pd_export_finish_locked(e, 0);
            return;
        }
        json_t *ids = json_array();
        e->block_ids = malloc((req->n_blocks ? req->n_blocks : 1) * sizeof(int));
        e->n_block_ids = e->block_ids ? req->n_blocks : 0;
        for (size_t i = 0; i < req->n_blocks; i++) {
            json_array_append_new(ids, json_integer(req->blocks[i]));
            if (e->block_ids)
                e->block_ids[i] = req->blocks[i];
        }
        nixl_hold_id(e, req);
        json_decref(req->resp_kv_params); /* replaces a first_tok-only block */
        /* vLLM NixlConnector request_finished (nixl/pull_scheduler.py): the newest shape
         * has one block list per KV-cache group, dcp/pp sizes, the computed token count, an
         * expiry that a prefill leaves null, and the transfer mode. */
        if (sim_cfg.nixl_older)
            req->resp_kv_params =
                json_pack("{s:b,s:b,s:o,s:s,s:s,s:s,s:i,s:i}", "do_remote_prefill", 1,
                          "do_remote_decode", 0, "remote_block_ids", ids, "remote_engine_id",
                          sim_cfg.engine_id, "remote_request_id", e->hold_id, "remote_host",
                          sim_cfg.kv_host, "remote_port", sim_cfg.kv_port, "tp_size", 1);
        else
            req->resp_kv_params = json_pack(
                "{s:b,s:b,s:[o],s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:I,s:n,s:s}", "do_remote_prefill", 1,
                "do_remote_decode", 0, "remote_block_ids", ids, "remote_engine_id",
                sim_cfg.engine_id, "remote_request_id", e->hold_id, "remote_host", sim_cfg.kv_host,
                "remote_port", sim_cfg.kv_port, "tp_size", 1, "dcp_size", 1, "pp_size", 1,
                "remote_num_tokens", (json_int_t)req->prompt.n, "remote_blocks_expiry_time",
                "transfer_mode", "pull");
        if (req->resp_kv_params)
            sim_record_set(req->rec_seq, "response_kv_transfer_params",
                           json_incref(req->resp_kv_params));
    }
    if (e->have_dest)
        sim_pd_kick_export(e);
}

void sim_kv_on_finish_locked(sim_req_t *req)
{
    if (!req->kv)
        return;
    sim_export_t *e = req->kv->exp;
    if (e) {
        req->kv->exp = NULL;
        e->req_gone = 1;
        e->req = NULL;
        if (req->state == SIM_RS_DONE && e->computed && !e->done &&
            sim_watch_client_gone_locked(req)) {
            /* the answer naming this KV can never arrive: do not hold it */
            e->failed = 1;
            snprintf(e->err, sizeof(e->err), "the prefill leg's client went away");
        }
        if (req->state == SIM_RS_DONE && e->computed && !e->done && !e->failed) {
            /* keep the prompt's KV until it is read / pushed, or the timeout */
            e->blocks = req->blocks;
            e->n_blocks = req->n_blocks;
            req->blocks = NULL;
            req->n_blocks = 0;
            if (!e->have_dest)
                e->t_expire = sim_now_ns() + (uint64_t)sim_cfg.kv_hold_timeout_ms * 1000000ull;
            else
                sim_pd_kick_export(e);
            /* until the answer reached the client, a late close drops it */
            req->kv->held = e;
            e->refs++;
        } else if (!e->done) {
            e->failed = 1;
            if (e->have_dest)
                sim_pd_kick_export(e); /* tells the decode, cancels sends */
            else
                sim_pd_export_finish_locked(e, 0);
        }
        sim_pd_export_unref_locked(e);
    }
    sim_import_t *imp = req->kv->imp;
    if (imp && req->state != SIM_RS_DONE && !imp->cancelled && imp->phase != 3) {
        imp->cancelled = 1;
        sim_pd_kick_import(imp);
    }
}

void sim_kv_on_client_gone_locked(sim_req_t *req)
{
    sim_export_t *e = req->kv ? req->kv->held : NULL;
    if (!e || e->done || e->failed)
        return;
    fprintf(stderr, "pdgw-sim: client of request %s went away before its answer; KV dropped\n",
            e->req_id);
    e->failed = 1;
    snprintf(e->err, sizeof(e->err), "the prefill leg's client went away");
    if (e->have_dest)
        sim_pd_kick_export(e); /* cancels the sends, tells the decode */
    else
        sim_pd_export_finish_locked(e, 0);
}

/* Engine lock held (called from sim_req_free). */
void sim_kv_req_free(struct sim_kv_req *kv)
{
    if (kv->held)
        sim_pd_export_unref_locked(kv->held);
    json_decref(kv->info);
    free(kv);
}

char *sim_kv_metrics_render(void)
{
    return sim_pd_kvt_metrics();
}

/* ---- kvt batch: a decode asks this prefill to compute its request ---- */
int sim_pd_compute_request(json_t *body, int is_chat, const char *request_id, const char *xfer,
                           const sim_receiver_t *dest, sim_kv_mode_t mode, const uint8_t *ident,
                           size_t ident_len, char **err)
{
    char *msg = NULL;
    const char *param = NULL;
    json_t *b = json_deep_copy(body);
    sim_req_t *req = calloc(1, sizeof(*req));
    if (!b || !req)
        goto err_mem;
    /* the hardened prefill leg of docs/protocols/README.md, hardened prefill leg */
    json_object_set_new(b, "max_tokens", json_integer(1));
    if (json_object_get(b, "max_completion_tokens"))
        json_object_set_new(b, "max_completion_tokens", json_integer(1));
    json_object_set_new(b, "stream", json_false());
    json_object_set_new(b, "ignore_eos", json_true());
    json_object_del(b, "stream_options");
    json_object_del(b, "min_tokens");
    json_object_del(b, "min_completion_tokens");
    json_object_del(b, "stop");
    req->refs = 1;
    req->request_id = strdup(request_id && *request_id ? request_id : xfer);
    req->created = (int64_t)sim_wall_ns() / 1000000000;
    if (!req->request_id || asprintf(&req->resp_id, "cmpl-%s", req->request_id) < 0)
        goto err_mem;
    json_t *entry = json_pack("{s:I,s:s,s:s,s:s,s:s,s:n,s:b,s:{},s:O,s:n}", "time_ns",
                              (json_int_t)sim_wall_ns(), "method", "KV", "path", "kvt:compute",
                              "role", sim_role_name(sim_cfg.role), "request_id", req->request_id,
                              "traceparent", "authorization", 0, "headers", "body", body, "status");
    if (entry)
        req->rec_seq = sim_record_add(entry);
    sim_fault_arm_crash();
    int rc = sim_openai_parse(b, is_chat, req, &msg, &param);
    if (rc) {
        *err = msg ? msg : strdup("invalid request");
        goto err;
    }
    struct sim_kv_req *kv = kv_new(SIM_PD_P_COMPUTE);
    if (!kv)
        goto err_mem;
    req->kv = kv;
    sim_engine_lock();
    sim_export_t *e = sim_pd_export_new_locked(req, SIM_PD_P_COMPUTE);
    if (!e) {
        sim_engine_unlock();
        goto err_mem;
    }
    e->refs++;
    kv->exp = e;
    e->req = req;
    e->dest = *dest;
    e->have_dest = 1;
    e->mode = mode;
    snprintf(e->xfer, sizeof(e->xfer), "%s", xfer);
    if (ident_len <= sizeof(e->ident)) {
        memcpy(e->ident, ident, ident_len);
        e->ident_len = ident_len;
    }
    json_object_set_new(kv->info, "xfer", json_string(xfer));
    json_object_set_new(kv->info, "req_id", json_string(xfer));
    sim_engine_unlock();
    sim_record_set(req->rec_seq, "kv", json_incref(kv->info));
    sim_record_set(req->rec_seq, "status", json_integer(200));
    json_decref(b);
    sim_engine_submit(req);
    sim_engine_lock();
    sim_req_unref_locked(req);
    sim_engine_unlock();
    return 0;
err_mem:
    *err = strdup("out of memory");
err:
    json_decref(b);
    if (req) {
        sim_engine_lock();
        sim_req_unref_locked(req);
        sim_engine_unlock();
    }
    return -1;
}

int sim_kv_start(void)
{
    if (sim_cfg.role == SIM_ROLE_BOTH)
        return 0;
    if (sim_kv_geom_init(&sim_geom, 1)) {
        fprintf(stderr, "pdgw-sim: --kv-bytes-per-token / --layers must be a multiple of 4 "
                        "(bfloat16 K and V)\n");
        return -1;
    }
    return sim_pd_kvt_start();
}

void sim_kv_stop(void)
{
    if (sim_cfg.role != SIM_ROLE_BOTH)
        sim_pd_kvt_stop();
}
