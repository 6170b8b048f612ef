/*
 * PD internals of pdgw-sim: KV chunk naming and content (sim_kv_data.c),
 * per-request PD state (sim_pd.c) and the KV thread that drives libkvt and
 * the control side channel between instances (sim_pd_kvt.c).
 *
 * KV layout (LMCache's): a prompt of n tokens is cut into chunks (the last
 * one may be short) of --lmcache-chunk-size tokens for the lmcache protocol
 * (LMCache's chunk_size, 256 by default) and of --block-size tokens (vLLM's
 * block) for every other protocol.
 * Each (TP rank, chunk) is one libkvt key (a CacheEngineKey string) and one
 * page: shape [2, layers, tokens, hidden] bfloat16 (K of every layer, then
 * V), hidden = kv_bytes_per_token / layers / tp / 4; with --layerwise each
 * layer of a chunk is its own key (LayerCacheEngineKey, [2, 1, tokens,
 * hidden]). Every byte is a deterministic function of (token id, position,
 * layer, rank, K|V), so the receiver can check every byte it loads.
 */
#ifndef PDGW_SIM_PD_INT_H
#define PDGW_SIM_PD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "sim_int.h"

/* A transfer's name (libkvt req_id and key scope): "<engine_id>#<n>", or for
 * vllm-kvt the decode leg's X-Request-Id (at most 256 bytes). */
#define SIM_XFER_MAX 264

/* ---- sim_kv_data.c ---- */
typedef struct sim_kv_geom {
    int layers;
    int ntp;
    int block_size;    /* tokens per chunk: --block-size, or LMCache's chunk_size */
    size_t tok_bytes;  /* bytes per token per layer per rank (K+V) */
    size_t page_bytes; /* bytes of a full chunk, all layers (one libkvt page) */
    int64_t hidden;    /* bfloat16 elements per token per K|V */
    int unit_layers;   /* layers per key: all, or 1 with --layerwise */
} sim_kv_geom_t;

/* The geometry of <ntp> TP ranks with chunks of --block-size tokens (every protocol but
 * lmcache); 0, or -1 when the KV bytes do not split into ntp ranks. */
int sim_kv_geom_init(sim_kv_geom_t *g, int ntp);
/* The same with chunks of --lmcache-chunk-size tokens (the lmcache protocol). */
int sim_kv_geom_lmcache(sim_kv_geom_t *g, int ntp);
/* Bytes of one libkvt page of this instance's engines: the larger whole chunk of
 * the two geometries, so any chunk either protocol family sends fits a page. */
size_t sim_kv_engine_page_bytes(void);
size_t sim_kv_nchunks(const sim_kv_geom_t *g, size_t ntokens);
/* Tokens held by chunk c of a prompt of n tokens. */
size_t sim_kv_chunk_tokens(const sim_kv_geom_t *g, size_t ntokens, size_t c);
/* Chained hashes of the prompt up to the end of each chunk (content
 * addresses); out has sim_kv_nchunks() entries. */
void sim_kv_chunk_hashes(const sim_tokens_t *prompt, const sim_kv_geom_t *g, uint64_t *out);
/* The prompt tokens an lmcache decode looks up (sim_pd.c: skip_last_n_tokens). */
size_t sim_kv_lookup_len(const sim_req_t *req);
/* CacheEngineKey string of chunk <chunk_hash> on TP <rank> of <ntp>; <scope>
 * (a transfer name, or NULL for content-addressed lmcache keys) is folded
 * into the hash; <layer> >= 0 gives the per-layer key. snprintf-style. */
int sim_kv_key(char *buf, size_t cap, const char *scope, int ntp, int rank, int layer,
               uint64_t chunk_hash);
/* Fill buf (>= page bytes) with chunk c of rank, every layer (layer < 0) or
 * one; returns its length. */
size_t sim_kv_fill(const sim_tokens_t *prompt, const sim_kv_geom_t *g, int rank, int layer,
                   size_t c, uint8_t *buf);
/* 1 if buf/len is exactly what sim_kv_fill produces. */
int sim_kv_verify(const sim_tokens_t *prompt, const sim_kv_geom_t *g, int rank, int layer, size_t c,
                  const uint8_t *buf, size_t len, uint8_t *scratch);

/* ---- protocol kinds seen by an instance ---- */
typedef enum {
    SIM_PD_NONE = 0,
    /* prefill side */
    SIM_PD_P_HOLD,       /* do_remote_decode: keep KV for a reader (nixl, mooncake serial,
                            kvt staged) */
    SIM_PD_P_RENDEZVOUS, /* transfer_id / bootstrap_room: push when decode registers */
    SIM_PD_P_LMCACHE,    /* disagg_spec: push to receiver, ProxyNotif */
    SIM_PD_P_COMPUTE,    /* kvt batch: computed on a decode's request */
    /* decode side */
    SIM_PD_D_PULL_PARAMS,  /* do_remote_prefill + remote_* (nixl, mooncake serial) */
    SIM_PD_D_KVT_STAGED,   /* do_remote_prefill + remote_host/port */
    SIM_PD_D_KVT_BATCH,    /* remote_host/port only: ask prefill to compute and push */
    SIM_PD_D_MOONCAKE_PAR, /* transfer_id + remote_bootstrap_addr */
    SIM_PD_D_SGLANG,       /* bootstrap_host/port/room */
    SIM_PD_D_LMCACHE,      /* plain request on a receiver: KV looked up by content */
} sim_pd_kind_t;

const char *sim_pd_kind_name(sim_pd_kind_t k);

typedef struct sim_receiver {
    char host[64];
    int nranks;
    uint16_t alloc_ports[SIM_MAX_TP];
    uint16_t init_ports[SIM_MAX_TP];
    int lmc_pages; /* its pages hold LMCache chunks (the receivers on --alloc-port) */
} sim_receiver_t;

/* Prefill-side export of one request's KV. Guarded by the engine lock. */
typedef struct sim_export {
    struct sim_export *next;
    int refs; /* table + queued work + running submissions */
    int in_table;
    char *hold_id; /* remote_request_id handed out (nixl etc.) */
    char *req_id;  /* X-Request-Id of the prefill leg */
    char *rv_key;  /* "tid:<T>" / "room:<R>" */
    int dp_rank;   /* the DP rank the request ran on (X-data-parallel-rank; -1 = none) */
    sim_pd_kind_t kind;
    sim_tokens_t prompt;
    uint64_t prompt_hash;
    size_t nchunks;
    uint64_t *hashes; /* chunk content hashes */
    int *blocks;      /* held after the request left the engine */
    size_t n_blocks;
    int *block_ids; /* remote_block_ids handed out */
    size_t n_block_ids;
    int layers_done;
    int computed;
    int req_gone;
    sim_req_t *req; /* kvt compute: its request while in the engine (not referenced) */
    /* destination, once known */
    int have_dest;
    sim_receiver_t dest;
    char xfer[SIM_XFER_MAX]; /* libkvt req_id and key scope */
    uint64_t rec_seq;        /* the prefill leg's /sim/requests entry */
    json_t *rec_kv;          /* its "kv" block, completed with req_id on attach */
    int lmcache;
    sim_kv_mode_t mode;
    int layers_submitted;
    int submitting;
    int stores_outstanding;
    int failed;
    int done;
    uint64_t bytes_sent;
    /* who to tell about a late failure (ROUTER identity) */
    uint8_t ident[64];
    size_t ident_len;
    uint64_t t_expire; /* monotonic ns; 0 = no expiry */
    char err[160];
    uint64_t pace_ready; /* --kv-link-gbps: next layer may go at */
    int paced;
    struct sim_export *pace_next;
} sim_export_t;

/* Decode-side import. */
typedef struct sim_import {
    struct sim_import *next;
    sim_req_t *req; /* referenced */
    sim_pd_kind_t kind;
    sim_kv_mode_t mode;
    char xfer[SIM_XFER_MAX];
    int named;                     /* xfer is the request's X-Request-Id */
    struct sim_import *named_next; /* in-flight named transfers (engine lock) */
    char endpoint[160];            /* tcp://host:port of the prefill side channel */
    json_t *ctl;                   /* message to send (owned) */
    char *expect_engine_id;
    int64_t room;     /* sglang: bootstrap_room */
    int prefill_rank; /* sglang: disagg_prefill_dp_rank, -1 = room % the prefill's dp_size */
    int nranks;
    int phase;         /* 0 new, 1 waiting, 2 loading, 3 done */
    int peer_unit;     /* layers per key the prefill sends (0: no reply yet) */
    int loads_waiting; /* landed before the prefill's reply said how it keys pages */
    atomic_int queued; /* work items naming it in the KV thread's queue */
    int outstanding;
    int failed;
    int cancelled;
    int recompute;
    int lookup_hits;
    char *wait_id;     /* lmcache: disagg_spec.req_id on the decode leg, if any */
    uint64_t retry_at; /* lmcache: next lookup while pages may still land */
    uint64_t deadline;
    uint64_t t_start;
    uint64_t bytes;
    size_t pages;
    size_t verify_failures;
    /* per rank keys and load buffers */
    sim_kv_geom_t geom;
    size_t nchunks, nkeys;
    char *keys[SIM_MAX_TP];  /* nkeys x KEY_MAX */
    char **keyp[SIM_MAX_TP]; /* into keys */
    uint8_t *bufs[SIM_MAX_TP];
    uint8_t **bufp[SIM_MAX_TP];
    size_t *lens[SIM_MAX_TP];
    size_t *caps[SIM_MAX_TP];
    int locked[SIM_MAX_TP]; /* lmcache: lookup locks held */
} sim_import_t;

struct sim_kv_req {
    sim_pd_kind_t kind;
    sim_kv_mode_t mode;
    sim_export_t *exp;
    sim_export_t *held; /* referenced: KV kept after the request finished */
    sim_import_t *imp;
    int remote_filled; /* decode: the prompt's KV came from remote */
    json_t *info;      /* what the record shows under "kv" */
};

/* sim_pd.c (engine lock held where noted) */
extern sim_kv_geom_t sim_geom;
sim_export_t *sim_pd_export_find_locked(const char *hold_id, const char *req_id,
                                        uint64_t prompt_hash, const char *rv_key);
void sim_pd_export_unref_locked(sim_export_t *e);
sim_export_t *sim_pd_export_find_xfer_locked(const char *xfer);
void sim_pd_export_remove_locked(sim_export_t *e);
void sim_pd_export_finish_locked(sim_export_t *e, int ok);
/* libkvt sent the ProxyNotif of transfer <xfer> (kvt_engine_params_t.on_proxy_notif; any
 * thread): the record's kv_proxy_notif_us is that moment. */
void sim_pd_proxy_notif_sent(void *arg, const char *xfer);
sim_export_t *sim_pd_export_new_locked(sim_req_t *req, sim_pd_kind_t kind);
void sim_pd_exports_expire_locked(uint64_t now);
/* A decode may have registered for e->rv_key before the prefill arrived. */
void sim_pd_rendezvous_attach_locked(sim_export_t *e);
void sim_pd_import_free(sim_import_t *imp);
/* An import named by its X-Request-Id ended: the name may be used again. */
void sim_pd_import_unname_locked(sim_import_t *imp);
int sim_pd_held_pages_locked(void);
/* kvt batch: start an internal prefill for a decode's request. */
int sim_pd_compute_request(json_t *body, int is_chat, const char *request_id, const char *xfer,
                           const sim_receiver_t *dest, sim_kv_mode_t mode, const uint8_t *ident,
                           size_t ident_len, char **err);
/* Shutdown: free every export. */
void sim_pd_exports_drop_all_locked(void);

/* sim_pd_kvt.c */
int sim_pd_kvt_start(void);
void sim_pd_kvt_stop(void);
void sim_pd_kick_export(sim_export_t *e); /* engine lock held; takes a ref */
void sim_pd_kick_import(sim_import_t *imp);
/* Send <msg> (taken) to the prefill side channel <endpoint> from the KV thread; no reply
 * is awaited (a decode's release of KV it will not read). */
void sim_pd_send_ctl(const char *endpoint, json_t *msg);
void sim_pd_kvt_stats(uint64_t *used, uint64_t *pinned);
char *sim_pd_kvt_metrics(void);
/* Receiver ports of this decode instance for <mode> (lazily created). */
int sim_pd_receiver(sim_kv_mode_t mode, int nranks, int lmc_pages, sim_receiver_t *out);

#endif
