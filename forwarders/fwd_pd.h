/*
 * fwd_pd.h - helpers shared by the PD forwarders (vllm-nixl, vllm-mooncake, vllm-kvt, sglang,
 * lmcache): leg bodies with their kv_transfer_params (docs/protocols/), option parsing,
 * the libkvt control thread (ReserveRequest, CancelNotif, ProxyNotif) and the weighted
 * admission semaphore.
 *
 * Data flow: a forwarder's ops build bodies with fwd_pd_body_*(); forwarders whose decode runs
 * libkvt keep a fwd_pd_kv_t in their context and, per attempt, a fwd_pd_kvreq_t that the gate
 * drives (admission -> reservation before prefill; ProxyNotif count before decode). Everything
 * that talks ZeroMQ runs on the control thread (fwd_pd_kvctl.c); request ops never block.
 */
#ifndef FWD_PD_H
#define FWD_PD_H

#include <pdgw/forwarder.h>
#include <stdint.h>

/* ---- bodies (fwd_pd_body.c) ---- */

/* The vllm-nixl / vllm-mooncake serial prefill kv_transfer_params (new reference). */
json_t *fwd_pd_kvp_remote_decode(void);

/* The bodies and options are the SDK's (forwarder.h); the in-tree names stay. */
#define fwd_pd_body_prefill pdgw_fwd_body_prefill_kvp
#define fwd_pd_body_decode  pdgw_fwd_body_decode_kvp
#define fwd_pd_resp_kvp     pdgw_fwd_resp_kvp

/* Count a prefill that returned no kv_transfer_params (pdgw_prefill_missing_kv_params_total). */
#define fwd_pd_count_missing_kv_params pdgw_fwd_prefill_missing_kv_params

/* ---- options (forwarder.h) ---- */
#define fwd_pd_opts_check pdgw_fwd_opts_check
#define fwd_pd_opt_int    pdgw_fwd_opt_int
#define fwd_pd_opt_bool   pdgw_fwd_opt_bool
#define fwd_pd_opt_enum   pdgw_fwd_opt_enum
#define fwd_pd_opt_str    pdgw_fwd_opt_str

/* A random 63-bit integer (never negative). */
int64_t fwd_pd_random63(void);

/* ---- libkvt side (fwd_pd_kvctl.c) ---- */

typedef enum { FWD_PD_REFUSAL_QUEUE = 0, FWD_PD_REFUSAL_REPICK = 1 } fwd_pd_refusal_t;

/* Options of the libkvt handshake, shared by vllm-kvt and lmcache. */
typedef struct fwd_pd_kv_opts {
    int reserve;            /* send ReserveRequest before prefill (batch) */
    int64_t chunk_tokens;   /* tokens per KV chunk */
    int64_t reserve_ttl_ms; /* ReserveRequest.ttl_ms */
    int64_t reserve_timeout_ms;
    int64_t reserve_retry_ms; /* queue: ask again after this */
    fwd_pd_refusal_t on_refusal;
    int proxy; /* bind the ProxyNotif PULL (lmcache) */
    char proxy_host[128];
    int64_t proxy_port;
    int64_t notif_timeout_ms;
    int64_t admission_chunks; /* weighted admission capacity; 0 = off */
    /* ProxyNotif trust and fallbacks (fwd_pd_notif.c) */
    int notif_check_peer;            /* accept only from the request's prefill addresses */
    int notif_fallback_decode;       /* at the deadline send the decode anyway (it recomputes) */
    int skip_proxy_notification;     /* engines run with pd_skip_proxy_notification: no wait */
    char curve_secret_key_file[256]; /* "" = plain TCP */
    char curve_client_keys_file[256];
    /* Replicas of this gateway that get the ProxyNotifs we do not own (fwd_pd_notif_relay.c) */
    char notif_relay_peers[512]; /* "host:port, ..." ("" = no relay) */
    int64_t notif_relay_port;    /* where the peers' notices come in */
} fwd_pd_kv_opts_t;

/* Keys fwd_pd_kv_opts_parse understands (for fwd_pd_opts_check). */
#define FWD_PD_KV_OPT_KEYS                                                                         \
    "reserve", "chunk_tokens", "reserve_ttl_ms", "reserve_timeout_ms", "reserve_retry_ms",         \
        "reserve_on_refusal"
#define FWD_PD_PROXY_OPT_KEYS                                                                      \
    "proxy_host", "proxy_port", "notif_timeout_ms", "admission_chunks", "notif_check_peer",        \
        "notif_fallback", "skip_proxy_notification", "notif_curve_secret_key_file",                \
        "notif_curve_client_keys_file", "notif_relay_peers", "notif_relay_port"

pdgw_fwd_status_t fwd_pd_kv_opts_parse(const json_t *options, int reserve_default, int proxy,
                                       fwd_pd_kv_opts_t *o, char *err, size_t errlen);

/* ---- ProxyNotif listener (fwd_pd_notif.c) ---- */

/* The proxy_* / notif_* options (FWD_PD_PROXY_OPT_KEYS) into <o>. proxy_host defaults to the
 * pod's address ($POD_IP), else the address of the gateway's host name, else 127.0.0.1:
 * never every interface unless configured. */
pdgw_fwd_status_t fwd_pd_notif_opts_parse(const json_t *options, fwd_pd_kv_opts_t *o, char *err,
                                          size_t errlen);

typedef struct fwd_pd_notif fwd_pd_notif_t;
/* Bind the PULL at o->proxy_host:o->proxy_port (CURVE server when a secret key file is
 * configured; only listed client keys when a client key file is). */
pdgw_fwd_status_t fwd_pd_notif_create(const char *protocol, const fwd_pd_kv_opts_t *o,
                                      fwd_pd_notif_t **out, char *err, size_t errlen);
void fwd_pd_notif_destroy(fwd_pd_notif_t *n);
int fwd_pd_notif_port(const fwd_pd_notif_t *n);
/* The fds to poll (ZMQ_FD, edge-style: call fwd_pd_notif_recv until it returns 0). */
size_t fwd_pd_notif_fds(const fwd_pd_notif_t *n, int fds[2]);
/* One ProxyNotif: 1 with its req_id and the sender's IP address (zmq Peer-Address, "" when
 * unknown), 0 when nothing is queued. Malformed messages are counted and skipped. */
int fwd_pd_notif_recv(fwd_pd_notif_t *n, char *id, size_t cap, char *peer, size_t peercap);
/* pdgw_fwd_proxy_notifs_rejected_total{protocol, reason}. */
void fwd_pd_notif_count_rejected(const char *protocol, const char *reason);

/* ---- ProxyNotif relay between gateway replicas (fwd_pd_notif_relay.c) ---- */

typedef struct fwd_pd_relay fwd_pd_relay_t;

/* Bind the relay PULL on proxy_host:notif_relay_port and connect to notif_relay_peers. */
pdgw_fwd_status_t fwd_pd_relay_create(const char *protocol, const fwd_pd_kv_opts_t *o,
                                      fwd_pd_relay_t **out, char *err, size_t errlen);
void fwd_pd_relay_destroy(fwd_pd_relay_t *r);
int fwd_pd_relay_port(const fwd_pd_relay_t *r);
/* The fd to poll (ZMQ_FD, edge-style: call fwd_pd_relay_recv until it returns 0). */
int fwd_pd_relay_fd(const fwd_pd_relay_t *r);
/* Hand a notice nobody here waits for to every peer, with the engine address it came from. */
void fwd_pd_relay_forward(fwd_pd_relay_t *r, const char *id, const char *sender);
/* The next notice a peer handed over: 1 with its req_id and the engine's address, 0 when none
 * is queued. Messages from addresses that are not peers are dropped and counted. */
int fwd_pd_relay_recv(fwd_pd_relay_t *r, char *id, size_t cap, char *sender, size_t sendercap);

typedef struct fwd_pd_kv fwd_pd_kv_t;       /* per forwarder: control thread, admission */
typedef struct fwd_pd_kvreq fwd_pd_kvreq_t; /* per attempt */

/* Start the control thread (and bind the ProxyNotif PULL when o->proxy). */
pdgw_fwd_status_t fwd_pd_kv_create(const char *protocol, const fwd_pd_kv_opts_t *o,
                                   fwd_pd_kv_t **out, char *err, size_t errlen);
void fwd_pd_kv_destroy(fwd_pd_kv_t *kv);
const fwd_pd_kv_opts_t *fwd_pd_kv_opts(const fwd_pd_kv_t *kv);
/* The bound ProxyNotif port (0 when none). */
int fwd_pd_kv_proxy_port(const fwd_pd_kv_t *kv);

/* Per attempt. <kv_req_id> names the transfer (disagg_spec.req_id / reservation). */
fwd_pd_kvreq_t *fwd_pd_kvreq_new(fwd_pd_kv_t *kv, const pdgw_fwd_request_t *req,
                                 const char *kv_req_id);
const char *fwd_pd_kvreq_id(const fwd_pd_kvreq_t *q);

/* BEFORE_PREFILL: weighted admission (if on), then the reservation on <decode> (if on and
 * the decode has alloc ports). OK / PENDING / ERR (err filled). */
pdgw_fwd_status_t fwd_pd_kvreq_before_prefill(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                                              const pdgw_instance_t *decode, pdgw_fwd_error_t *err);

/* Before the prefill leg: the attempt is in flight for ProxyNotif. From now on <need>
 * notices count, and only from <prefill>'s host or kv_host (option notif_check_peer). */
void fwd_pd_kvreq_expect_notifs(fwd_pd_kvreq_t *q, int need, const pdgw_instance_t *prefill);

/* BEFORE_DECODE: wait for <count> ProxyNotif{kv_req_id} (registers the attempt if
 * fwd_pd_kvreq_expect_notifs was not called). At the notif deadline: ERR 504 kv_transfer, or
 * OK with option notif_fallback: decode. OK at once with skip_proxy_notification. */
pdgw_fwd_status_t fwd_pd_kvreq_wait_notifs(fwd_pd_kvreq_t *q, const pdgw_fwd_request_t *req,
                                           int count, pdgw_fwd_error_t *err);

/* Whether a refusal error came from the reservation (retry_scope: re-pick the decode). */
int fwd_pd_kvreq_refused(const fwd_pd_kvreq_t *q);

/* Remember the decode instance (its KV host and alloc ports) for CancelNotif at the end. */
void fwd_pd_kvreq_set_decode(fwd_pd_kvreq_t *q, const pdgw_instance_t *decode);

/* End of the attempt: release admission slots; when the attempt did not complete (reason !=
 * OK), CancelNotif{kv_req_id} to the remembered decode's alloc ports (releases its reservation
 * and pages; counted in pdgw_pd_cancel_notifs_total). A completed transfer's reservation is
 * released by the receiver itself. Frees q. NULL is a no-op. */
void fwd_pd_kvreq_end(fwd_pd_kvreq_t *q, pdgw_end_reason_t reason);

#endif /* FWD_PD_H */
