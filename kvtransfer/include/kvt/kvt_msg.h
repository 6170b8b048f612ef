/*
 * kvt_msg.h -- libkvt control messages (docs/protocols/lmcache-wire.md) and their
 * msgpack codec.
 *
 * Layout = Python msgspec tagged structs: a msgpack map whose first entry is
 * "type": "<ClassName>", followed by every field in the table order below.
 * kvt_msg_encode() writes exactly that. kvt_msg_decode() accepts any field
 * order, ignores unknown keys (whatever their value), applies defaults,
 * rejects missing required fields / wrong types (KVT_ERR_MSG_FIELD, with the
 * field name in kvt_msg_err_t), unknown types (KVT_ERR_MSG_TYPE), malformed
 * msgpack (KVT_ERR_PROTO) and oversized input (KVT_ERR_LIMIT). It never reads
 * out of bounds and its memory use is bounded by the KVT_MSG_MAX_* limits.
 *
 *  AllocRequest        keys:[str] fmt:int shape:[int] dtype:str last_chunk_toks:int
 *                      req_id:str="" is_last_batch:bool=false total_chunks:int=0
 *                      kvt_ext:int=0 (omitted when 0)
 *  AllocResponse       already_sent_indexes:[int]=[] remote_indexes:[int]   (sync order)
 *  AllocResponse       remote_indexes:[int] already_sent_indexes:[int]=[]   (async order,
 *                      encoder type KVT_MSG_ALLOC_RESPONSE_ASYNC; decodes as ALLOC_RESPONSE)
 *  AscendAllocResponse already_sent_indexes:[int] remote_indexes:[int]
 *                      remote_buffer_uuids:[str] alloc_failed:bool=false
 *                      kvt_ext:int=0 (omitted when 0)
 *  ProxyNotif          req_id:str
 *  PullReadyNotif      pull_id:str keys:[str] sender_buffer_uuids:[str]
 *                      sender_mem_indexes:[int] sender_id:str sender_done_url:str
 *                      fmt:int shape:[int] dtype:str last_chunk_toks:int
 *                      kvt_ext:int=0 (omitted when 0)
 *  PullReadyDoneAck    already_sent_indexes:[int] alloc_failed:bool=false
 *                      kvt_ext:int=0 (omitted when 0)
 *  PullDoneSignal      pull_id:str
 *  CancelNotif         req_id:str keys:[str]
 *  ReserveRequest      req_id:str total_chunks:int ttl_ms:int          (pdgw extension)
 *  ReserveResponse     req_id:str granted:bool free_chunks:int         (pdgw extension)
 *  TransportInit       node_id:str transport:str lanes:[TransportLane]
 *                      regions:[TransportRegion]=[] version:int=1 epoch:int=0
 *                      addr:bin=b"" (omitted when empty)               (pdgw extension)
 *    TransportLane     host:str="" port:int=0 qp_num:int=0 lid:int=0 gid:str=""
 *                      psn:int=0 mtu:int=0                 (nested map, "type" first)
 *    TransportRegion   uuid:str addr:int length:int rkey:int=0  (nested map, "type" first)
 *
 * kvt_ext (pdgw extension, never sent as 0): a libkvt sender puts
 * KVT_MSG_EXT_VERSION into its AllocRequest / PullReadyNotif; a libkvt
 * receiver answers such a sender with AscendAllocResponse / PullReadyDoneAck
 * carrying its own kvt_ext. Upstream LMCache (msgspec, unknown fields
 * ignored) never sees the field in a reply and ignores it in a request. Only
 * when both sides said so do they use the pdgw extensions (the "landed"
 * ProxyNotif echo).
 *
 * TransportInit is libkvt-only: both ends of the init-port handshake are
 * libkvt. Upstream LMCache's PD messages are AllocRequest, AllocResponse,
 * ProxyNotif and CancelNotif (lmcache/v1/storage_backend/pd_backend.py); its
 * init port carries the transfer channel's own handshake (NixlInitRequest /
 * NixlInitResponse with opaque agent metadata bytes,
 * lmcache/v1/transfer_channel/nixl_channel.py), which libkvt does not speak.
 * TransportInit is exchanged on pd_peer_init_port: each side sends its own
 * and answers with its own. TCP uses host/port per lane; verbs uses
 * qp_num/lid/gid/psn/mtu per lane (one lane = one QP) and addr/length/rkey
 * per region (a region may appear as several entries with the same uuid,
 * e.g. one per MR). epoch: random per process start, lets a peer notice a
 * restart.
 *
 * Memory: a decoded kvt_msg_t owns its strings and arrays (kvt_malloc);
 * release with kvt_msg_clear(). Builders below copy their inputs.
 */
#ifndef KVT_MSG_H
#define KVT_MSG_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds enforced by the decoder (and the encoder, so we never send what a
 * peer of ours would refuse). */
#define KVT_MSG_MAX_BYTES    (16u << 20) /* whole encoded message */
#define KVT_MSG_MAX_ITEMS    (1u << 18)  /* elements of any one array */
#define KVT_MSG_MAX_OBJECTS  (1u << 20)  /* msgpack objects in one message, all levels */
#define KVT_MSG_MAX_STR      4096u       /* bytes of any one string */
#define KVT_MSG_MAX_MAP_KEYS 256u        /* entries of any map (unknown keys count) */
#define KVT_MSG_MAX_DEPTH    16u         /* nesting of skipped unknown values */
#define KVT_MSG_MAX_DIMS     8u          /* shape length */

typedef enum kvt_msg_type {
    KVT_MSG_NONE = 0,
    KVT_MSG_ALLOC_REQUEST,
    KVT_MSG_ALLOC_RESPONSE,
    KVT_MSG_ASCEND_ALLOC_RESPONSE,
    KVT_MSG_PROXY_NOTIF,
    KVT_MSG_PULL_READY_NOTIF,
    KVT_MSG_PULL_READY_DONE_ACK,
    KVT_MSG_PULL_DONE_SIGNAL,
    KVT_MSG_CANCEL_NOTIF,
    KVT_MSG_RESERVE_REQUEST,
    KVT_MSG_RESERVE_RESPONSE,
    KVT_MSG_TRANSPORT_INIT,
    KVT_MSG_ALLOC_RESPONSE_ASYNC, /* "AllocResponse" in the async backend's field order */
    KVT_MSG_TYPE_COUNT
} kvt_msg_type_t;

/* pdgw extension level announced in kvt_ext (see above). */
#define KVT_MSG_EXT_VERSION 1

/* Wire class name ("AllocRequest", ...); NULL for NONE/out of range. */
const char *kvt_msg_type_name(kvt_msg_type_t t);
/* Inverse of kvt_msg_type_name (exact, case-sensitive); KVT_MSG_NONE if unknown. */
kvt_msg_type_t kvt_msg_type_from_name(const char *name, size_t len);

/* Arrays: <n> elements, pointer owned by the message. */
typedef struct kvt_str_list {
    char **v;
    uint32_t n;
} kvt_str_list_t;

typedef struct kvt_int_list {
    int64_t *v;
    uint32_t n;
} kvt_int_list_t;

/* Opaque bytes (msgpack bin), at most KVT_MSG_MAX_STR. */
typedef struct kvt_bytes {
    uint8_t *p;
    uint32_t n;
} kvt_bytes_t;

typedef struct kvt_msg_alloc_request {
    kvt_str_list_t keys;
    int64_t fmt;
    kvt_int_list_t shape;
    char *dtype;
    int64_t last_chunk_toks;
    char *req_id; /* "" default, never NULL after decode */
    int is_last_batch;
    int64_t total_chunks;
    int64_t kvt_ext; /* pdgw: sender is libkvt (0 = upstream peer) */
} kvt_msg_alloc_request_t;

/* AllocResponse and AscendAllocResponse share one struct; the plain
 * AllocResponse leaves remote_buffer_uuids empty and alloc_failed 0 (and does
 * not encode them). */
typedef struct kvt_msg_alloc_response {
    kvt_int_list_t already_sent_indexes; /* positions in the request's keys */
    kvt_int_list_t remote_indexes;       /* per key not already sent; -1 = failed */
    kvt_str_list_t remote_buffer_uuids;  /* Ascend: region UUID per remote index */
    int alloc_failed;
    int64_t kvt_ext; /* pdgw: receiver is libkvt (Ascend layout only) */
} kvt_msg_alloc_response_t;

typedef struct kvt_msg_proxy_notif {
    char *req_id;
} kvt_msg_proxy_notif_t;

typedef struct kvt_msg_pull_ready_notif {
    char *pull_id;
    kvt_str_list_t keys;
    kvt_str_list_t sender_buffer_uuids;
    kvt_int_list_t sender_mem_indexes;
    char *sender_id;
    char *sender_done_url;
    int64_t fmt;
    kvt_int_list_t shape;
    char *dtype;
    int64_t last_chunk_toks;
    int64_t kvt_ext;
} kvt_msg_pull_ready_notif_t;

typedef struct kvt_msg_pull_ready_done_ack {
    kvt_int_list_t already_sent_indexes;
    int alloc_failed;
    int64_t kvt_ext;
} kvt_msg_pull_ready_done_ack_t;

typedef struct kvt_msg_pull_done_signal {
    char *pull_id;
} kvt_msg_pull_done_signal_t;

typedef struct kvt_msg_cancel_notif {
    char *req_id;
    kvt_str_list_t keys;
} kvt_msg_cancel_notif_t;

typedef struct kvt_msg_reserve_request {
    char *req_id;
    int64_t total_chunks;
    int64_t ttl_ms;
} kvt_msg_reserve_request_t;

typedef struct kvt_msg_reserve_response {
    char *req_id;
    int granted;
    int64_t free_chunks;
} kvt_msg_reserve_response_t;

typedef struct kvt_msg_transport_lane {
    char *host; /* "" default */
    int64_t port;
    int64_t qp_num;
    int64_t lid;
    char *gid; /* "" default; verbs: 39-char "xxxx:...:xxxx" */
    int64_t psn;
    int64_t mtu;
} kvt_msg_transport_lane_t;

typedef struct kvt_msg_transport_region {
    char *uuid;
    uint64_t addr;
    uint64_t length;
    int64_t rkey;
} kvt_msg_transport_region_t;

typedef struct kvt_msg_transport_init {
    char *node_id;
    char *transport; /* "tcp" | "verbs" | "shm" */
    kvt_msg_transport_lane_t *lanes;
    uint32_t nlanes;
    kvt_msg_transport_region_t *regions;
    uint32_t nregions;
    int64_t version;  /* 1 */
    int64_t epoch;    /* 0 default */
    kvt_bytes_t addr; /* the transport's address blob, opaque to the engine */
} kvt_msg_transport_init_t;

typedef struct kvt_msg {
    kvt_msg_type_t type;
    uint64_t present; /* decoder: bit i = field i of the type's table was on the wire */
    union {
        kvt_msg_alloc_request_t alloc_req;       /* ALLOC_REQUEST */
        kvt_msg_alloc_response_t alloc_resp;     /* ALLOC_RESPONSE, ASCEND_ALLOC_RESPONSE */
        kvt_msg_proxy_notif_t proxy_notif;       /* PROXY_NOTIF */
        kvt_msg_pull_ready_notif_t pull_ready;   /* PULL_READY_NOTIF */
        kvt_msg_pull_ready_done_ack_t pull_ack;  /* PULL_READY_DONE_ACK */
        kvt_msg_pull_done_signal_t pull_done;    /* PULL_DONE_SIGNAL */
        kvt_msg_cancel_notif_t cancel;           /* CANCEL_NOTIF */
        kvt_msg_reserve_request_t reserve_req;   /* RESERVE_REQUEST */
        kvt_msg_reserve_response_t reserve_resp; /* RESERVE_RESPONSE */
        kvt_msg_transport_init_t tinit;          /* TRANSPORT_INIT */
    } u;
} kvt_msg_t;

/* Decoder diagnostics: which field was wrong and why (static strings). */
typedef struct kvt_msg_err {
    const char *field;  /* e.g. "keys", NULL if not field-specific */
    const char *reason; /* e.g. "missing required field", "expected array of str" */
    size_t offset;      /* byte offset where msgpack parsing failed (KVT_ERR_PROTO) */
} kvt_msg_err_t;

/* Zero <m> and set its type (all strings NULL, lists empty). */
void kvt_msg_init(kvt_msg_t *m, kvt_msg_type_t type);
/* Free everything <m> owns and reset it to KVT_MSG_NONE. Safe on a zeroed
 * or already-cleared message. */
void kvt_msg_clear(kvt_msg_t *m);

/* Encode <m>. On KVT_OK *data_out is a kvt_malloc'd buffer of *len_out bytes
 * owned by the caller (kvt_free). NULL strings encode as "". Fails with
 * KVT_ERR_LIMIT if the message would exceed a decoder bound, KVT_ERR_INVALID
 * for an unknown type. */
kvt_status_t kvt_msg_encode(const kvt_msg_t *m, void **data_out, size_t *len_out);

/* Decode one message from exactly <len> bytes (trailing bytes ->
 * KVT_ERR_PROTO). On KVT_OK <out> owns its memory (kvt_msg_clear). On error
 * <out> is left as KVT_MSG_NONE with nothing to free; <err> (may be NULL)
 * explains. */
kvt_status_t kvt_msg_decode(const void *data, size_t len, kvt_msg_t *out, kvt_msg_err_t *err);

/* 1 if the decoded message <m> carried field <name> on the wire (not a
 * default). Tells an async LMCache sender (req_id / is_last_batch /
 * total_chunks always encoded) from a sync or Ascend one. */
int kvt_msg_has_field(const kvt_msg_t *m, const char *name);

/* Read only the "type" of a message (cheap dispatch / metrics label).
 * KVT_ERR_MSG_TYPE if missing or unknown. */
kvt_status_t kvt_msg_peek_type(const void *data, size_t len, kvt_msg_type_t *type_out);

/* Deep copy. */
kvt_status_t kvt_msg_copy(kvt_msg_t *dst, const kvt_msg_t *src);

/* JSON view of a message (debugging, logs, the kvt-msgtool CLI): an object
 * with "type" first and every field, nested structs as objects. Returns a
 * kvt_malloc'd NUL-terminated string (caller kvt_free's) or NULL on no
 * memory. uint64 fields above INT64_MAX are not representable (clamped). */
char *kvt_msg_to_json(const kvt_msg_t *m);

/* Build a message from such a JSON object (same rules as kvt_msg_decode:
 * any order, unknown keys ignored, defaults applied, types checked).
 * KVT_ERR_PROTO for invalid JSON. */
kvt_status_t kvt_msg_from_json(const char *json, size_t len, kvt_msg_t *out, kvt_msg_err_t *err);

/* ---- building helpers (copy their inputs) ------------------------------ */
kvt_status_t kvt_str_list_set(kvt_str_list_t *l, const char *const *v, uint32_t n);
kvt_status_t kvt_str_list_push(kvt_str_list_t *l, const char *s);
kvt_status_t kvt_int_list_set(kvt_int_list_t *l, const int64_t *v, uint32_t n);
kvt_status_t kvt_int_list_push(kvt_int_list_t *l, int64_t v);
/* Replace *dst with a copy of <s> (NULL -> ""). */
/* Copy <n> bytes into <b> (freeing what it held); KVT_ERR_LIMIT past KVT_MSG_MAX_STR. */
kvt_status_t kvt_bytes_set(kvt_bytes_t *b, const void *p, size_t n);
kvt_status_t kvt_msg_set_str(char **dst, const char *s);
void kvt_str_list_clear(kvt_str_list_t *l);
void kvt_int_list_clear(kvt_int_list_t *l);

#ifdef __cplusplus
}
#endif
#endif /* KVT_MSG_H */
