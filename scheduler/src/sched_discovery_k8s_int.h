/*
 * Kubernetes EndpointSlice discovery: internal types shared by the JSON
 * parsing (sched_discovery_k8s_parse.c) and the list/watch client
 * (sched_discovery_k8s.c).
 *
 * Data flow: list/watch JSON → sched_k8s_slice_t per EndpointSlice (kept per
 * role, keyed by slice name) → pod annotations fetched once per pod
 * (sched_k8s_kv_t) → desired instance set → sched_pool_upsert / discovery_drain /
 * retire.
 */
#ifndef SCHED_DISCOVERY_K8S_INT_H
#define SCHED_DISCOVERY_K8S_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include <pdsched/discovery.h>
#include <pdsched/sched.h>

#define K8S_NAME_MAX 254 /* DNS subdomain names: 253 bytes + NUL */
#define K8S_HOST_MAX 256 /* IPv4, IPv6 or FQDN address */
#define K8S_ZONE_MAX 128

/* Annotations read from the pods behind the endpoints. */
#define K8S_ANN_KV_PORT        "pdgw.io/kv-port"
#define K8S_ANN_KV_HOST        "pdgw.io/kv-host"
#define K8S_ANN_BOOTSTRAP_PORT "pdgw.io/bootstrap-port"
#define K8S_ANN_SGL_BOOTSTRAP  "sglang.ai/bootstrap-port"
#define K8S_ANN_ENGINE_ID      "pdgw.io/engine-id"
#define K8S_ANN_ALLOC_PORTS    "pdgw.io/alloc-ports"
#define K8S_ANN_INIT_PORTS     "pdgw.io/init-ports"
#define K8S_ANN_TP_SIZE        "pdgw.io/tp-size"
#define K8S_ANN_DP_RANK        "pdgw.io/dp-rank"
#define K8S_ANN_DP_SIZE        "pdgw.io/dp-size"
#define K8S_ANN_WEIGHT         "pdgw.io/weight"
#define K8S_ANN_KV_ENGINE      "pdgw.io/kv-engine"
#define K8S_ANN_MODELS         "pdgw.io/models" /* comma-separated served model names */
/* The engine's KV-event publisher, spelt as in vLLM's --kv-events-config
 * (endpoint "tcp://HOST:5557" with HOST "*"): a wildcard host stands for the pod's address. */
#define K8S_ANN_KV_EVENTS        "pdgw.io/kv-events-endpoint"
#define K8S_ANN_KV_EVENTS_REPLAY "pdgw.io/kv-events-replay-endpoint"
#define K8S_KV_EVENTS_MAX        (K8S_HOST_MAX + 16)

/* Named ports of a slice that carry KV side channels. */
#define K8S_PORT_KV        "kv"
#define K8S_PORT_BOOTSTRAP "bootstrap"

/* One endpoint of an EndpointSlice, reduced to what an instance needs. */
typedef struct sched_k8s_endpoint {
    char id[SCHED_ID_MAX];   /* pod name, else "<address>-<port>" */
    char host[K8S_HOST_MAX]; /* first address */
    char pod[K8S_NAME_MAX];  /* targetRef name when kind == Pod, else "" */
    char zone[K8S_ZONE_MAX]; /* endpoint zone, "" if absent */
    char node[K8S_NAME_MAX]; /* nodeName, "" if absent */
    int port;                /* the port named port_name */
    int kv_port;             /* named port "kv", 0 if absent */
    int bootstrap_port;      /* named port "bootstrap", 0 if absent */
    bool ipv6;               /* addressType IPv6: bracket in URLs */
    bool ready;              /* conditions.ready (absent = true) */
    bool terminating;        /* conditions.terminating (absent = false) */
} sched_k8s_endpoint_t;

/* One EndpointSlice. */
typedef struct sched_k8s_slice {
    char name[K8S_NAME_MAX];
    char service[K8S_NAME_MAX]; /* label kubernetes.io/service-name */
    sched_k8s_endpoint_t *eps;  /* owned */
    size_t n_eps;
    bool port_missing; /* the slice has no port named port_name */
} sched_k8s_slice_t;

/* KV fields from pod annotations; has_* says which were present and valid. */
typedef struct sched_k8s_kv {
    int kv_port;
    int bootstrap_port;
    char kv_host[K8S_HOST_MAX];
    char engine_id[SCHED_ID_MAX];
    int alloc_ports[SCHED_MAX_TP];
    size_t n_alloc_ports;
    int init_ports[SCHED_MAX_TP];
    size_t n_init_ports;
    int tp_size, dp_rank, dp_size;
    unsigned weight;
    int kv_engine; /* SCHED_KV_ENGINE_* */
    char models[SCHED_MAX_MODELS][SCHED_MODEL_NAME_MAX + 1];
    size_t n_models;
    /* as annotated; resolved against the endpoint's address by sched_k8s_endpoint_desc */
    char kv_events[K8S_KV_EVENTS_MAX];
    char kv_events_replay[K8S_KV_EVENTS_MAX];
    bool has_kv_port, has_bootstrap_port, has_kv_host, has_engine_id;
    bool has_tp_size, has_dp_rank, has_dp_size, has_weight;
} sched_k8s_kv_t;

/*
 * Parse one discovery.k8s.io/v1 EndpointSlice object. Endpoints without an
 * address or when the slice has no port named <port_name> are left out
 * (the latter sets out->port_missing). On error <out> is untouched and
 * <err> says what was wrong; on success the caller owns out->eps
 * (sched_k8s_slice_clear()).
 */
sched_status_t sched_k8s_slice_parse(const json_t *obj, const char *port_name,
                                     sched_k8s_slice_t *out, char *err, size_t err_len);

/* Free a slice's endpoints and zero it. */
void sched_k8s_slice_clear(sched_k8s_slice_t *slice);

/*
 * Read the pdgw.io/ and sglang.ai/ annotations of a pod's
 * metadata.annotations object (NULL = none) into <kv> (zeroed first).
 * Invalid values are skipped; the number of invalid annotations is
 * returned and the first problem is described in <err>.
 */
int sched_k8s_kv_from_annotations(const json_t *annotations, sched_k8s_kv_t *kv, char *err,
                                  size_t err_len);

/*
 * Build the instance descriptor of <ep> (role <role>) into <desc> with
 * strings pointing into <ep>, <kv> and <url_buf> (all must outlive desc).
 * <kv> may be NULL (no pod information).
 */
void sched_k8s_endpoint_desc(const sched_k8s_endpoint_t *ep, const sched_k8s_kv_t *kv,
                             sched_role_t role, const char *service, char *url_buf, size_t url_len,
                             sched_instance_desc_t *desc);

/* Watch event types of a watch stream line. */
typedef enum sched_k8s_event_type {
    K8S_EVENT_ADDED,
    K8S_EVENT_MODIFIED,
    K8S_EVENT_DELETED,
    K8S_EVENT_BOOKMARK,
    K8S_EVENT_ERROR,
} sched_k8s_event_type_t;

/*
 * Split one watch event {"type": T, "object": O}: *object_out is borrowed
 * from <event>. SCHED_ERR_INVALID for anything else.
 */
sched_status_t sched_k8s_event_parse(const json_t *event, sched_k8s_event_type_t *type_out,
                                     const json_t **object_out, char *err, size_t err_len);

/* metadata.resourceVersion of an object (borrowed), or NULL. */
const char *sched_k8s_resource_version(const json_t *obj);

/* Status.code of an ERROR event object, 0 if absent. */
int sched_k8s_status_code(const json_t *obj);

#endif /* SCHED_DISCOVERY_K8S_INT_H */
