/*
 * The bootstrap server of a prefill instance (--bootstrap-port), as upstream engines run one:
 *
 *   GET /query  vLLM's MooncakeBootstrapServer (vllm/distributed/kv_transfer/kv_connector/v1/
 *               mooncake/mooncake_utils.py): {"<dp_rank>": {"engine_id": E, "worker_addr":
 *               {"<tp_rank>": {"<pp_rank>": "tcp://host:port"}}}} for every DP rank. A router
 *               takes E from here for the decode's remote_engine_id; the decode asks it too
 *               and connects to worker_addr (here: this instance's ZeroMQ side channel).
 *   GET /route  SGLang's bootstrap server (python/sglang/srt/disaggregation/common/conn.py,
 *               CommonKVBootstrapServer): prefill_dp_rank, prefill_cp_rank, target_tp_rank and
 *               target_pp_rank are all required (400 without); all -1 asks for the topology
 *               (attn_tp_size, attn_cp_size, dp_size, pp_size, page_size, kv_cache_dtype,
 *               follow_bootstrap_room, ...), other values for one rank's {"rank_ip",
 *               "rank_port"} (404 for a rank nobody registered); 503 until every worker
 *               registered (here: until the side channel is bound). One worker per DP rank
 *               (TP, CP and PP of 1), all behind this instance's ZeroMQ side channel.
 *   GET /health "OK", as SGLang's.
 *
 * Engine ids: vLLM mints a new engine id at every start, one per DP rank. The sim keeps
 * --engine-id for rank 0 of the first start and derives the others ("<id>-dp<r>", "-g<n>"
 * after the n-th simulated restart, POST /sim/restart on the main port).
 *
 * Also the tiny HTTP GET the decode side uses to ask a bootstrap server (sim_http_get).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim_int.h"

int sim_side_port;
static atomic_int generation;
static struct MHD_Daemon *boot_daemon;

void sim_engine_id_of(int rank, char *out, size_t cap)
{
    int gen = atomic_load(&generation);
    char dp[24] = "", g[24] = "";
    if (sim_cfg.dp_size > 1)
        snprintf(dp, sizeof(dp), "-dp%d", rank);
    if (gen > 0)
        snprintf(g, sizeof(g), "-g%d", gen);
    snprintf(out, cap, "%s%s%s", sim_cfg.engine_id, dp, g);
}

int sim_engine_id_rank(const char *eid)
{
    char id[128];
    for (int r = 0; eid && r < sim_cfg.dp_size; r++) {
        sim_engine_id_of(r, id, sizeof(id));
        if (!strcmp(id, eid))
            return r;
    }
    return -1;
}

int sim_restart_bump(void)
{
    return atomic_fetch_add(&generation, 1) + 1;
}

static char *query_json(void)
{
    json_t *o = json_object();
    char id[128], addr[128];
    snprintf(addr, sizeof(addr), "tcp://%s:%d", sim_cfg.kv_host, sim_side_port);
    for (int r = 0; o && r < sim_cfg.dp_size; r++) {
        char key[16];
        sim_engine_id_of(r, id, sizeof(id));
        snprintf(key, sizeof(key), "%d", r);
        json_object_set_new(
            o, key, json_pack("{s:s,s:{s:{s:s}}}", "engine_id", id, "worker_addr", "0", "0", addr));
    }
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static enum MHD_Result boot_send_type(struct MHD_Connection *conn, unsigned status, char *body,
                                      const char *type)
{
    struct MHD_Response *r;
    enum MHD_Result ret;
    if (!body)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result boot_send(struct MHD_Connection *conn, unsigned status, char *body)
{
    return boot_send_type(conn, status, body, "application/json");
}

static enum MHD_Result boot_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
    return boot_send_type(conn, status, strdup(text), "text/plain; charset=utf-8");
}

/* An integer query argument; 0 when absent or not an integer. */
static int route_arg(struct MHD_Connection *conn, const char *key, long *out)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, key);
    char *end;
    if (!v || !*v)
        return 0;
    *out = strtol(v, &end, 10);
    return *end == '\0';
}

/* SGLang's GET /route (CommonKVBootstrapServer._handle_route_get). */
static enum MHD_Result route_answer(struct MHD_Connection *conn)
{
    long dp, cp, tp, pp;
    char msg[160];
    if (!route_arg(conn, "prefill_dp_rank", &dp) || !route_arg(conn, "prefill_cp_rank", &cp) ||
        !route_arg(conn, "target_tp_rank", &tp) || !route_arg(conn, "target_pp_rank", &pp))
        return boot_text(conn, 400, "Missing inputs for bootstrap server.");
    if (!sim_side_port) {
        snprintf(msg, sizeof(msg),
                 "Prefill server not fully registered yet (0 workers registered).");
        return boot_text(conn, 503, msg);
    }
    if (dp == -1 && cp == -1 && tp == -1 && pp == -1) {
        json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:i,s:s,s:b,s:b,s:i,s:n,s:n,s:n,s:n,s:n,s:n}",
                              "attn_tp_size", 1, "attn_cp_size", 1, "dp_size", sim_cfg.dp_size,
                              "pp_size", 1, "page_size", sim_cfg.block_size, "kv_cache_dtype",
                              "auto", "follow_bootstrap_room", 1, "enable_dsa_cache_layer_split", 0,
                              "prefill_http_port", sim_cfg.port, "target_tp_rank",
                              "target_tp_ranks", "target_cp_ranks", "target_pp_ranks",
                              "required_dst_info_num", "required_prefill_response_num");
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return boot_send(conn, 200, s);
    }
    if (dp < 0 || dp >= sim_cfg.dp_size || cp != 0 || tp != 0 || pp != 0) {
        snprintf(msg, sizeof(msg),
                 "Bootstrap info not found for dp_rank=%ld cp_rank=%ld tp_rank=%ld pp_rank=%ld", dp,
                 cp, tp, pp);
        return boot_text(conn, 404, msg);
    }
    json_t *o = json_pack("{s:s,s:i}", "rank_ip", sim_cfg.kv_host, "rank_port", sim_side_port);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return boot_send(conn, 200, s);
}

static enum MHD_Result on_boot_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version, const char *upload,
                                       size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    (void)upload;
    if (*con_cls == NULL) { /* first call: headers only */
        *con_cls = conn;
        return MHD_YES;
    }
    if (*upload_size) { /* bodies are not read here */
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET"))
        return boot_send(conn, 405, strdup("{\"detail\":\"Method Not Allowed\"}"));
    if (!strcmp(url, "/query"))
        return boot_send(conn, 200, query_json());
    if (!strcmp(url, "/route"))
        return route_answer(conn);
    if (!strcmp(url, "/health"))
        return boot_text(conn, 200, "OK");
    return boot_send(conn, 404, strdup("{\"detail\":\"Not Found\"}"));
}

int sim_bootstrap_start(void)
{
    struct sockaddr_in sa;
    if (sim_cfg.role != SIM_ROLE_PREFILL || !sim_cfg.bootstrap_port)
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)sim_cfg.bootstrap_port);
    if (inet_pton(AF_INET, strcmp(sim_cfg.host, "0.0.0.0") ? sim_cfg.host : "0.0.0.0",
                  &sa.sin_addr) != 1)
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    boot_daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL,
                                   (uint16_t)sim_cfg.bootstrap_port, NULL, NULL, on_boot_request,
                                   NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT,
                                   (unsigned)30, MHD_OPTION_END);
    if (!boot_daemon) {
        fprintf(stderr, "pdgw-sim: cannot serve the bootstrap server on port %d: in use?\n",
                sim_cfg.bootstrap_port);
        return -1;
    }
    return 0;
}

void sim_bootstrap_stop(void)
{
    if (boot_daemon)
        MHD_stop_daemon(boot_daemon);
    boot_daemon = NULL;
}

/* ---- the client side: one GET, HTTP/1.0, the body up to close ---- */

char *sim_http_get(const char *host, int port, const char *path, int timeout_ms, char *err,
                   size_t errlen)
{
    struct addrinfo hints, *ai = NULL;
    char ports[16], req[512], *buf = NULL;
    size_t len = 0, cap = 0;
    int fd = -1, status = 0;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    snprintf(ports, sizeof(ports), "%d", port);
    if (getaddrinfo(host, ports, &hints, &ai) || !ai) {
        snprintf(err, errlen, "cannot resolve %s", host);
        return NULL;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        snprintf(err, errlen, "cannot connect to %s:%d", host, port);
        goto fail;
    }
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s:%d\r\n\r\n", path, host, port);
    if (n <= 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
        snprintf(err, errlen, "cannot send to %s:%d", host, port);
        goto fail;
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) != 1) {
            snprintf(err, errlen, "%s:%d did not answer in %d ms", host, port, timeout_ms);
            goto fail;
        }
        if (len + 4096 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 8192;
            char *nb = nc <= (1u << 20) ? realloc(buf, nc) : NULL;
            if (!nb) {
                snprintf(err, errlen, "answer of %s:%d too large", host, port);
                goto fail;
            }
            buf = nb;
            cap = nc;
        }
        ssize_t r = read(fd, buf + len, 4096);
        if (r < 0) {
            snprintf(err, errlen, "read from %s:%d failed", host, port);
            goto fail;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (!buf) {
        snprintf(err, errlen, "%s:%d closed without an answer", host, port);
        goto fail;
    }
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1 || status != 200 || !body) {
        snprintf(err, errlen, "GET http://%s:%d%s: status %d", host, port, path, status);
        goto fail;
    }
    body += 4;
    memmove(buf, body, strlen(body) + 1);
    close(fd);
    freeaddrinfo(ai);
    return buf;
fail:
    free(buf);
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return NULL;
}
