/*
 * kvt_config.h -- libkvt configuration: the pd_* keys of docs/protocols/lmcache-wire.md
 * section B (LMCache names, kept exactly) plus transport keys.
 *
 * Loaders read a flat YAML or JSON mapping. Unknown keys and bad values are
 * errors naming the key (kvt_config_err_t). Sizes are integers of bytes (a
 * string with a KiB/MiB/GiB/KB/MB/GB suffix is accepted too); TTLs and
 * timeouts are numbers of seconds (a string with a unit, "500ms", "2s", "2m",
 * is accepted too). Booleans: true/false (YAML also True/False/yes/no/on/off).
 *
 * key                               type        default
 * pd_role                           str         "both"   (sender | receiver | both)
 * pd_buffer_size                    size        1 GiB
 * pd_buffer_device                  str         "cpu"    (cpu | device | cuda* | npu*)
 * pd_peer_host                      str         "127.0.0.1"
 * pd_peer_init_port                 [int]       []
 * pd_peer_alloc_port                [int]       []
 * pd_proxy_host                     str         ""
 * pd_proxy_port                     int         0
 * pd_pull_mode                      bool        false
 * pd_delay_pull                     bool        false
 * pd_pull_done_port                 [int]       []       (empty: alloc port + 100)
 * pd_use_cpu_offload                bool        false
 * pd_cpu_buffer_size                size        0        (0: pd_buffer_size)
 * pd_alloc_fail_backoff_ttl         seconds     2.0
 * pd_pull_pending_ttl               seconds     360.0
 * pd_pull_backpressure_reserve_pct  float       2.0
 * pd_allocation_timeout_sec         seconds     5.0
 * pd_shutdown_timeout_sec           seconds     5.0      (destroy: finish queued control work)
 * pd_alloc_ttl                      seconds     30.0     (pdgw, receiver: an allocation nobody
 *                                                         wrote (landed) or claimed (lookup,
 *                                                         load) within this is freed; landing
 *                                                         restarts it; 0 = never. Also caps a
 *                                                         ReserveRequest's ttl_ms)
 * pd_alloc_quota                    float       0.5      (pdgw, receiver: share of the pool one
 *                                                         sender (source address) may hold
 *                                                         unclaimed; (0, 1], 1 = the whole pool)
 * pd_node_id                        str         ""       (pdgw: "" = <hostname>-<pid>)
 * pd_tp_rank                        int         0        (pdgw: index into the port lists)
 * transfer_channel                  str         "tcp"    (tcp | verbs | shm)
 * transfer_lanes                    int         0        (lanes / QPs per peer; 0 = transport
 *                                                         default: tcp 4, verbs 2)
 * transfer_max_conns                int         0        (tcp data lanes served at once; 0 = 1024)
 * transfer_max_conns_per_peer       int         0        (tcp lanes of one peer; 0 = 64)
 * transfer_max_pending              int         0        (tcp lanes before HELLO; 0 = 64)
 * transfer_max_conns_per_addr       int         0        (tcp lanes from one address; 0 = 128)
 * transfer_max_pending_per_addr     int         0        (of those, before HELLO; 0 = 8)
 * transfer_addr_prefix_v6           int         0        (IPv6 sources grouped per /N; 0 = 64)
 * transfer_max_peers_per_addr       int         0        (receiver: node ids one source address
 *                                                         keeps handshaken at once; its oldest
 *                                                         is forgotten past it; 0 = 16)
 * transfer_hello_timeout            seconds     0        (tcp accept -> HELLO; 0 = 5)
 * transfer_idle_timeout             seconds     0        (tcp lane without frames; 0 = 300)
 * verbs_device                      str         ""       ("" = first device)
 * verbs_gid_index                   int         -1       (-1 = auto)
 * chunk_size                        int         256      (tokens per KV chunk)
 * enable_pd                         bool        true     (LMCache key, accepted)
 * local_cpu                         bool        false    (LMCache key, accepted)
 * pd_peer_flavour                   str         "auto"   (pdgw, receiver: which LMCache
 *                                                         sender the AllocRequests come from:
 *                                                         auto | async | sync | ascend)
 *
 * LMCache's "hccl"/"nixl" channel names are refused (not supported here).
 */
#ifndef KVT_CONFIG_H
#define KVT_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvt_role {
    KVT_ROLE_SENDER = 1,
    KVT_ROLE_RECEIVER = 2,
    KVT_ROLE_BOTH = 3, /* = SENDER | RECEIVER */
} kvt_role_t;

typedef enum kvt_channel {
    KVT_CHANNEL_TCP = 0,
    KVT_CHANNEL_VERBS = 1,
    KVT_CHANNEL_SHM = 2,
} kvt_channel_t;

#define KVT_CONFIG_MAX_PORTS 64
#define KVT_CONFIG_STR_MAX   256 /* incl. NUL */

typedef struct kvt_port_list {
    uint16_t v[KVT_CONFIG_MAX_PORTS];
    uint32_t n;
} kvt_port_list_t;

typedef struct kvt_config {
    kvt_role_t pd_role;
    uint64_t pd_buffer_size;
    char pd_buffer_device[KVT_CONFIG_STR_MAX];
    int pd_buffer_is_device; /* derived: 0 for "cpu", 1 otherwise */
    char pd_peer_host[KVT_CONFIG_STR_MAX];
    kvt_port_list_t pd_peer_init_port;
    kvt_port_list_t pd_peer_alloc_port;
    char pd_proxy_host[KVT_CONFIG_STR_MAX];
    uint16_t pd_proxy_port;
    int pd_pull_mode;
    int pd_delay_pull;
    kvt_port_list_t pd_pull_done_port;
    int pd_use_cpu_offload;
    uint64_t pd_cpu_buffer_size;
    double pd_alloc_fail_backoff_ttl;
    double pd_pull_pending_ttl;
    double pd_pull_backpressure_reserve_pct;
    double pd_allocation_timeout_sec;
    double pd_shutdown_timeout_sec;
    double pd_alloc_ttl;
    double pd_alloc_quota;
    char pd_node_id[KVT_CONFIG_STR_MAX];
    uint32_t pd_tp_rank;
    kvt_channel_t transfer_channel;
    uint32_t transfer_lanes;
    uint32_t transfer_max_conns;
    uint32_t transfer_max_conns_per_peer;
    uint32_t transfer_max_pending;
    uint32_t transfer_max_conns_per_addr;
    uint32_t transfer_max_pending_per_addr;
    uint32_t transfer_addr_prefix_v6;
    uint32_t transfer_max_peers_per_addr;
    double transfer_hello_timeout;
    double transfer_idle_timeout;
    char verbs_device[KVT_CONFIG_STR_MAX];
    int32_t verbs_gid_index;
    uint32_t chunk_size;
    int enable_pd;
    int local_cpu;
    char pd_peer_flavour[KVT_CONFIG_STR_MAX];
} kvt_config_t;

/* How a receiver answers an AllocRequest (docs/protocols/lmcache-wire.md):
 *   ASYNC   PDBackendAsync sender (DEALER): AllocResponse, one remote index
 *           per key, no dedup, -1 = slot failed
 *   SYNC    PDBackend sender (REQ): AllocResponse, dedup (already_sent_indexes)
 *   ASCEND  LMCache-Ascend sender (REQ): AscendAllocResponse (region uuids,
 *           alloc_failed)
 *   LIBKVT  a libkvt sender (it says so with kvt_ext): Ascend layout + kvt_ext
 * AUTO (config only): async when the request carries the async backend's
 * fields (req_id / is_last_batch / total_chunks), libkvt when it carries
 * kvt_ext, else sync -- a push-mode Ascend sender's AllocRequest is
 * byte-identical to a sync one, so Ascend push peers need "ascend". */
typedef enum kvt_flavour {
    KVT_FLAVOUR_AUTO = 0,
    KVT_FLAVOUR_ASYNC,
    KVT_FLAVOUR_SYNC,
    KVT_FLAVOUR_ASCEND,
    KVT_FLAVOUR_LIBKVT,
} kvt_flavour_t;

kvt_status_t kvt_flavour_parse(const char *s, kvt_flavour_t *out);
const char *kvt_flavour_name(kvt_flavour_t f);

/* Where a load failed. key may be "" (syntax error), line is 1-based (YAML
 * and JSON) or 0 when unknown. */
typedef struct kvt_config_err {
    char key[KVT_CONFIG_STR_MAX];
    char msg[256];
    int line;
} kvt_config_err_t;

/* Fill <cfg> with the defaults above. */
void kvt_config_defaults(kvt_config_t *cfg);

/* Set one key from its text form (CLI "--kvt-opt key=value", env). Lists are
 * comma separated ("7400,7401") or a JSON/YAML flow list ("[7400, 7401]").
 * Unknown key / bad value -> KVT_ERR_CONFIG with <err> filled (may be NULL). */
kvt_status_t kvt_config_set(kvt_config_t *cfg, const char *key, const char *value,
                            kvt_config_err_t *err);

/* Apply environment variables <prefix><KEY> (key upper-cased, e.g. with
 * prefix "KVT_": KVT_PD_ROLE=receiver, KVT_PD_PEER_ALLOC_PORT=7400,7401) with
 * kvt_config_set() semantics. Unset variables are skipped. On error <cfg> is
 * unchanged and <err> names the key. */
kvt_status_t kvt_config_load_env(kvt_config_t *cfg, const char *prefix, kvt_config_err_t *err);

/* Load a YAML / JSON mapping ON TOP of what <cfg> holds (call
 * kvt_config_defaults first). On error <cfg> is unchanged. */
kvt_status_t kvt_config_load_yaml_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err);
kvt_status_t kvt_config_load_yaml_string(kvt_config_t *cfg, const char *text, size_t len,
                                         kvt_config_err_t *err);
kvt_status_t kvt_config_load_json_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err);
kvt_status_t kvt_config_load_json_string(kvt_config_t *cfg, const char *text, size_t len,
                                         kvt_config_err_t *err);
/* By extension: .json -> JSON, anything else -> YAML (JSON is valid YAML flow
 * style too, but the JSON loader gives better errors). */
kvt_status_t kvt_config_load_file(kvt_config_t *cfg, const char *path, kvt_config_err_t *err);

/* Cross-key checks: pd_delay_pull needs pd_pull_mode; pd_use_cpu_offload
 * needs a sender role; buffer sizes > 0; reserve pct in [0, 100); TTLs >= 0;
 * pd_alloc_quota in (0, 1];
 * transfer_lanes in 0..64; receiver/both need pd_peer_alloc_port; port lists
 * cover pd_tp_rank where given. */
kvt_status_t kvt_config_validate(const kvt_config_t *cfg, kvt_config_err_t *err);

/* Derived values. */
/* CPU offload pool size (pd_cpu_buffer_size, or pd_buffer_size when 0). */
uint64_t kvt_config_cpu_buffer_size(const kvt_config_t *cfg);
/* Port of <list> for pd_tp_rank; 0 if the list does not cover it. */
uint16_t kvt_config_port(const kvt_config_t *cfg, const kvt_port_list_t *list);
/* PullDoneSignal port for pd_tp_rank: pd_pull_done_port[rank], else
 * pd_peer_alloc_port[rank] + 100, else 0. */
uint16_t kvt_config_pull_done_port(const kvt_config_t *cfg);

const char *kvt_role_name(kvt_role_t r);
const char *kvt_channel_name(kvt_channel_t c);

/* Parse helpers shared with tools: "sender"/"receiver"/"both"; "tcp"/"verbs"/"shm". */
kvt_status_t kvt_role_parse(const char *s, kvt_role_t *out);
kvt_status_t kvt_channel_parse(const char *s, kvt_channel_t *out);

/* Write <cfg> as a JSON object (every key) into <buf> of <size> bytes; returns
 * the length that was needed (like snprintf). */
size_t kvt_config_to_json(const kvt_config_t *cfg, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KVT_CONFIG_H */
