/*
 * pdgw_doctor_proto.c - the doctor's probes of what a protocol reaches besides the engine's
 * OpenAI port, one row of the table per protocol (docs/protocols/):
 *
 *   vllm-mooncake  prefill: GET /query of its bootstrap server (vLLM's MooncakeBootstrapServer:
 *                  {"<dp_rank>": {"engine_id", "worker_addr"}}): the instance's DP rank is
 *                  listed, and with mooncake_engine_id: config the configured id is the one the
 *                  engine runs (vLLM mints a new id at every start)
 *   sglang         prefill: GET /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1
 *                  &target_pp_rank=-1 of its bootstrap server (SGLang's CommonKVBootstrapServer
 *                  answers its topology, 503 until every worker registered)
 *   lmcache        decode: every alloc and init port (one per TP rank) greets as ZeroMQ
 *   vllm-kvt       prefill: the side channel (kv_host:kv_port) greets as ZeroMQ
 *
 * Only reads: GETs, and TCP connections that read the peer's ZeroMQ greeting and close before
 * the handshake ends, so no message reaches the engine.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "pdgw_alloc.h"
#include "pdgw_doctor_int.h"

/* The bootstrap port vLLM's Mooncake connector and SGLang default to. */
#define DEFAULT_BOOTSTRAP_PORT 8998

/* ---------------------------------------------------------------- sockets */

static int remaining_ms(uint64_t end)
{
    uint64_t now = pdgw_time_mono_ms();
    return now >= end ? 0 : (int)(end - now);
}

/* A connected TCP socket to host:port (non-blocking), or -1 with why in err. */
static int tcp_connect(const char *host, int port, uint64_t end, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL, *ai;
    char ps[16];
    int fd = -1, rc, soerr = 0;

    snprintf(ps, sizeof(ps), "%d", port);
    rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        struct pollfd p;
        socklen_t sl = sizeof(soerr);
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno != EINPROGRESS) {
            soerr = errno;
            close(fd);
            fd = -1;
            continue;
        }
        p = (struct pollfd){.fd = fd, .events = POLLOUT};
        rc = poll(&p, 1, remaining_ms(end));
        if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
            break;
        if (rc == 0)
            soerr = ETIMEDOUT;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "connect %s:%d: %s", host, port,
                 soerr ? strerror(soerr) : "no address");
    return fd;
}

int doc_tcp_probe(const char *host, int port, uint64_t timeout_ms, char *err, size_t errlen)
{
    int fd = tcp_connect(host, port, pdgw_time_mono_ms() + timeout_ms, err, errlen);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

int doc_zmtp_probe(const char *host, int port, uint64_t timeout_ms, char *err, size_t errlen)
{
    uint64_t end = pdgw_time_mono_ms() + timeout_ms;
    unsigned char sig[10];
    size_t got = 0;
    int fd = tcp_connect(host, port, end, err, errlen);

    if (fd < 0)
        return -1;
    /* libzmq sends its signature as soon as the connection is up; ours is never sent, so the
     * peer drops the half-done handshake without a message. */
    while (got < sizeof(sig)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (poll(&p, 1, remaining_ms(end)) != 1)
            break;
        n = recv(fd, sig + got, sizeof(sig) - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (got == sizeof(sig) && sig[0] == 0xFF && sig[9] == 0x7F)
        return 1;
    if (got == 0)
        snprintf(err, errlen,
                 "%s:%d accepts connections but sent no ZeroMQ greeting within %llu "
                 "ms",
                 host, port, (unsigned long long)timeout_ms);
    else
        snprintf(err, errlen,
                 "%s:%d answered %zu byte(s) that are not a ZeroMQ greeting (first "
                 "0x%02x)",
                 host, port, got, sig[0]);
    return 0;
}

/* ---------------------------------------------------------------- protocols */

static bool has_prefill(const doc_target_t *t)
{
    return t->view.role == PDGW_FWD_ROLE_PREFILL || t->view.role == PDGW_FWD_ROLE_BOTH;
}

static bool has_decode(const doc_target_t *t)
{
    return t->view.role == PDGW_FWD_ROLE_DECODE || t->view.role == PDGW_FWD_ROLE_BOTH;
}

static const char *option(const doc_run_t *run, const char *key, const char *def)
{
    const char *v = pdgw_kv_list_get(&run->opts->cfg->protocol_options, key);
    return v != NULL ? v : def;
}

/* GET a bootstrap path: the parsed JSON answer, or NULL after a row (status in *status). */
static json_t *boot_get(doc_run_t *run, doc_target_t *t, int port, const char *path, long *status,
                        char *raw, size_t rawcap)
{
    char base[512], url[768], err[512];
    char *body = NULL;
    json_t *j;
    doc_http_base(t->view.host, port, base, sizeof(base));
    snprintf(url, sizeof(url), "%s%s", base, path);
    if (doc_http_get(url, run->opts->timeout_ms, 1u << 20, status, &body, NULL, err, sizeof(err)) !=
        PDGW_OK) {
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_ERROR,
                t->view.bootstrap_port > 0
                    ? "set bootstrap_port to the engine's bootstrap port (vLLM: the Mooncake "
                      "connector's bootstrap port; SGLang: --disaggregation-bootstrap-port)"
                    : "the engine default 8998 is not answering: set the instance's "
                      "bootstrap_port",
                "%s", err);
        return NULL;
    }
    snprintf(raw, rawcap, "%s", body);
    j = json_loads(body, 0, NULL);
    pdgw_free(body);
    return j;
}

static void probe_mooncake(doc_run_t *run, doc_target_t *t)
{
    bool config_id = strcmp(option(run, "mooncake_engine_id", "bootstrap"), "config") == 0;
    bool parallel = strcmp(option(run, "mooncake_dispatch", "parallel"), "parallel") == 0;
    int port = t->view.bootstrap_port > 0 ? t->view.bootstrap_port : DEFAULT_BOOTSTRAP_PORT;
    int rank = t->view.dp_size > 1 ? t->view.dp_rank : 0;
    long status = 0;
    char raw[256], key[16], ids[512] = "";
    const char *k;
    json_t *q, *v, *mine;
    size_t used = 0;

    if (!has_prefill(t) || (!parallel && t->view.bootstrap_port <= 0))
        return;
    q = boot_get(run, t, port, "/query", &status, raw, sizeof(raw));
    if (status == 0)
        return;
    if (status != 200 || !json_is_object(q)) {
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_ERROR,
                "bootstrap_port must be the Mooncake bootstrap server of the prefill (it "
                "answers GET /query), not another port of the engine",
                "GET :%d/query answered %ld, not a Mooncake bootstrap answer: %.80s", port, status,
                raw);
        json_decref(q);
        return;
    }
    json_object_foreach(q, k, v)
    {
        const char *id = json_string_value(json_object_get(v, "engine_id"));
        if (used < sizeof(ids)) {
            int n = snprintf(ids + used, sizeof(ids) - used, "%s%s=%s", used ? ", " : "", k,
                             id ? id : "?");
            used += n > 0 ? (size_t)n : 0;
        }
    }
    snprintf(key, sizeof(key), "%d", rank);
    mine = json_object_get(q, key);
    if (json_object_size(q) == 0)
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_WARN,
                "wait for the prefill's workers to register, or look at its log",
                "GET :%d/query lists no DP rank yet (no worker registered)", port);
    else if (!json_is_string(json_object_get(mine, "engine_id")))
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_ERROR,
                "set the instance's dp_rank/dp_size to the engine's --data-parallel-* settings",
                "GET :%d/query lists no DP rank %d (engine ids: %s)", port, rank, ids);
    else if (config_id &&
             strcmp(json_string_value(json_object_get(mine, "engine_id")), t->view.engine_id))
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_ERROR,
                "update engine_id (vLLM mints a new engine id at every start), or use "
                "mooncake_engine_id: bootstrap",
                "configured engine_id \"%s\", the engine runs \"%s\" on DP rank %d",
                t->view.engine_id, json_string_value(json_object_get(mine, "engine_id")), rank);
    else
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_OK, NULL,
                "GET :%d/query: engine ids per DP rank: %s", port, ids);
    json_decref(q);
}

static void probe_sglang(doc_run_t *run, doc_target_t *t)
{
    int port = t->view.bootstrap_port > 0 ? t->view.bootstrap_port : DEFAULT_BOOTSTRAP_PORT;
    long status = 0;
    char raw[256];
    json_t *a;

    if (!has_prefill(t))
        return;
    a = boot_get(run, t, port,
                 "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                 "&target_pp_rank=-1",
                 &status, raw, sizeof(raw));
    if (status == 0)
        return;
    if (status == 503)
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_WARN,
                "wait for the prefill's workers to register, or look at its log",
                "GET :%d/route: %.120s", port, raw);
    else if (status != 200 || !json_is_object(a))
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_ERROR,
                "bootstrap_port must be the prefill's --disaggregation-bootstrap-port",
                "GET :%d/route answered %ld, not SGLang's bootstrap server: %.80s", port, status,
                raw);
    else if (json_is_integer(json_object_get(a, "dp_size")) &&
             json_integer_value(json_object_get(a, "dp_size")) != t->view.dp_size &&
             t->view.dp_size > 1)
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_WARN, "set dp_size to the prefill's DP size",
                "the bootstrap server reports dp_size %lld, the config %d",
                (long long)json_integer_value(json_object_get(a, "dp_size")), t->view.dp_size);
    else
        doc_row(run, t, "bootstrap", PDGW_DOCTOR_OK, NULL, "GET :%d/route: 200", port);
    json_decref(a);
}

static void zmtp_row(doc_run_t *run, doc_target_t *t, const char *check, int port, const char *fix)
{
    char err[512];
    int r = doc_zmtp_probe(t->view.kv_host, port, run->opts->timeout_ms, err, sizeof(err));
    if (r == 1)
        doc_row(run, t, check, PDGW_DOCTOR_OK, NULL, "%s:%d greets as ZeroMQ", t->view.kv_host,
                port);
    else
        doc_row(run, t, check, PDGW_DOCTOR_ERROR, fix, "%s", err);
}

static void probe_lmcache(doc_run_t *run, doc_target_t *t)
{
    size_t i;
    char check[64];
    if (!has_decode(t))
        return;
    for (i = 0; i < t->view.n_alloc_ports; i++) {
        snprintf(check, sizeof(check), "alloc port[%zu]", i);
        zmtp_row(run, t, check, t->view.alloc_ports[i],
                 "alloc_ports must be the decode's pd_peer_alloc_port (one per TP rank) on "
                 "kv_host, and its receiver must be up");
    }
    for (i = 0; i < t->view.n_init_ports; i++) {
        snprintf(check, sizeof(check), "init port[%zu]", i);
        zmtp_row(run, t, check, t->view.init_ports[i],
                 "init_ports must be the decode's pd_peer_init_port (one per TP rank) on "
                 "kv_host, and its receiver must be up");
    }
}

static void probe_kvt(doc_run_t *run, doc_target_t *t)
{
    if (!has_prefill(t) || t->view.kv_port <= 0)
        return;
    zmtp_row(run, t, "side channel", t->view.kv_port,
             "kv_host/kv_port must be the prefill's KV side channel");
}

typedef struct proto_probe {
    const char *protocol;
    void (*probe)(doc_run_t *run, doc_target_t *t);
} proto_probe_t;

static const proto_probe_t proto_probes[] = {
    {"vllm-mooncake", probe_mooncake},
    {"sglang", probe_sglang},
    {"lmcache", probe_lmcache},
    {"vllm-kvt", probe_kvt},
};

void doc_probe_proto(doc_run_t *run, doc_target_t *t)
{
    size_t i;
    for (i = 0; i < sizeof(proto_probes) / sizeof(proto_probes[0]); i++) {
        if (strcmp(run->protocol, proto_probes[i].protocol) == 0)
            proto_probes[i].probe(run, t);
    }
}
