/*
 * kvt-lmc-peer - test helper for the LMCache interop tests
 * (test_lmcache_senders.py). Two roles:
 *
 *   kvt-lmc-peer recv --layers L --chunk-tokens T --hidden H [--dtype D]
 *                     --pages P [--flavour F] [--backoff S]
 *       (pages of one LMCache chunk each; --page-size N overrides)
 *       A libkvt receiver engine on ephemeral ports. Prints one JSON line
 *       {"alloc_port", "init_port", "node_id"}, then answers commands on
 *       stdin, one JSON line each:
 *         stats            {"used_pages", "pinned_pages", "refusals", ...}
 *         load <key> <cap> {"ok", "len", "hex"} (the chunk's bytes)
 *         quit
 *
 *   kvt-lmc-peer write --host H --init-port Q --node-id ID --page-size N
 *       The data half of a sender: runs libkvt's transport handshake on the
 *       receiver's init port (learning its regions), then reads lines
 *       "<remote_index> <hex bytes>" on stdin and WRITEs each chunk to the
 *       page LMCache's remote_indexes name (one index over the receiver's
 *       whole buffer). Prints {"ok": true|false, "status"} per line.
 *       "put <page> <hex bytes>" instead fills page <page> of its own region
 *       (--pages K) and lets the receiver READ it (the source of a pull):
 *       prints {"uuid", "index"} for the PullReadyNotif.
 *
 * The control plane (AllocRequest, CancelNotif, ...) is never spoken here:
 * the Python test scripts it exactly as upstream LMCache does.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvt/kvt_engine.h"
#include "kvt/kvt_msg.h"
#include "kvt/kvt_uuid.h"
#include "pdb/pdb_hex.h"
#include "kvt_transport.h"

static const char *arg(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return def;
}

/* ---- recv ----------------------------------------------------------------- */

static int run_recv(int argc, char **argv)
{
    kvt_config_t c;
    kvt_config_err_t err;
    kvt_engine_params_t p;
    kvt_engine_t *e;
    kvt_engine_ports_t ports;
    size_t page = strtoull(arg(argc, argv, "--page-size", "0"), NULL, 10);
    uint64_t pages = strtoull(arg(argc, argv, "--pages", "16"), NULL, 10);
    char line[8192];
    kvt_status_t st;
    kvt_chunk_geom_t cg;

    if (page == 0) {
        /* pages of one LMCache chunk: --layers x --chunk-tokens x --hidden */
        if (kvt_chunk_geom_lmcache(&cg, strtoll(arg(argc, argv, "--layers", "4"), NULL, 10),
                                   strtoll(arg(argc, argv, "--chunk-tokens", "256"), NULL, 10),
                                   strtoll(arg(argc, argv, "--hidden", "8"), NULL, 10),
                                   arg(argc, argv, "--dtype", "half"), 0) != KVT_OK) {
            fprintf(stderr, "bad chunk geometry\n");
            return 2;
        }
        page = kvt_chunk_bytes(&cg);
    }

    kvt_config_defaults(&c);
    c.pd_role = KVT_ROLE_RECEIVER;
    c.pd_buffer_size = page * pages;
    c.pd_peer_alloc_port.v[0] = 0;
    c.pd_peer_alloc_port.n = 1;
    c.pd_peer_init_port.v[0] = 0;
    c.pd_peer_init_port.n = 1;
    c.pd_alloc_fail_backoff_ttl = strtod(arg(argc, argv, "--backoff", "0.3"), NULL);
    snprintf(c.pd_peer_flavour, sizeof(c.pd_peer_flavour), "%s",
             arg(argc, argv, "--flavour", "auto"));
    snprintf(c.pd_node_id, sizeof(c.pd_node_id), "lmc-recv");
    if (kvt_config_validate(&c, &err) != KVT_OK) {
        fprintf(stderr, "config %s: %s\n", err.key, err.msg);
        return 2;
    }
    memset(&p, 0, sizeof(p));
    p.cfg = &c;
    p.page_size = page;
    p.bind_host = "127.0.0.1";
    st = kvt_engine_create(&p, &e);
    if (st != KVT_OK) {
        fprintf(stderr, "engine: %s\n", kvt_strerror(st));
        return 2;
    }
    kvt_engine_ports(e, &ports);
    printf("{\"alloc_port\": %u, \"init_port\": %u, \"node_id\": \"%s\", \"page_size\": %zu}\n",
           ports.alloc_port, ports.init_port, kvt_engine_id(e), page);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char key[4200];
        size_t cap = 0;
        if (strncmp(line, "stats", 5) == 0) {
            kvt_pool_stats_t ps;
            kvt_metrics_t m;
            kvt_engine_pool_stats(e, &ps);
            kvt_engine_metrics(e, &m);
            printf("{\"used_pages\": %u, \"pinned_pages\": %u, \"refusals\": %" PRIu64
                   ", \"alloc_failures\": %" PRIu64 ", \"cancels\": %" PRIu64
                   ", \"bad_messages\": %" PRIu64 "}\n",
                   (unsigned)ps.used_pages, (unsigned)ps.pinned_pages, m.refusals_total,
                   m.alloc_failures_total, m.cancels_total, m.bad_messages_total);
        } else if (sscanf(line, "load %4199s %zu", key, &cap) == 2 && cap <= (64u << 20)) {
            const char *kp = key;
            uint8_t *buf = malloc(cap ? cap : 1);
            size_t len = 0;
            kvt_task_id_t id;
            kvt_task_result_t res;
            int ok = 0;
            if (buf != NULL &&
                kvt_submit_load(e, &kp, (void *const *)&buf, &cap, &len, 1, NULL, &id) == KVT_OK &&
                kvt_task_wait(e, id, 10000, &res) == KVT_OK) {
                ok = res.status == KVT_OK && kvt_bitmap_test(res.bitmap, 0);
                kvt_task_result_clear(&res);
            }
            printf("{\"ok\": %s, \"len\": %zu, \"hex\": \"", ok ? "true" : "false", ok ? len : 0);
            for (size_t i = 0; ok && i < len; i++)
                printf("%02x", buf[i]);
            printf("\"}\n");
            free(buf);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            printf("{\"error\": \"unknown command\"}\n");
        }
        fflush(stdout);
    }
    kvt_engine_destroy(e);
    return 0;
}

/* ---- write ---------------------------------------------------------------- */

typedef struct done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
    kvt_status_t st;
} done_t;

static void on_complete(void *a, uint64_t cookie, kvt_status_t status)
{
    done_t *d = a;
    (void)cookie;
    pthread_mutex_lock(&d->lock);
    d->n++;
    d->st = status;
    pthread_cond_signal(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static int run_write(int argc, char **argv)
{
    const char *host = arg(argc, argv, "--host", "127.0.0.1");
    const char *node = arg(argc, argv, "--node-id", "lmc-sender");
    unsigned iport = (unsigned)strtoul(arg(argc, argv, "--init-port", "0"), NULL, 10);
    size_t page = strtoull(arg(argc, argv, "--page-size", "4096"), NULL, 10);
    const kvt_transport_desc_t *td = kvt_transport_find("tcp");
    done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, KVT_OK};
    kvt_tl_callbacks_t cb = {.on_complete = on_complete, .arg = &d};
    kvt_tl_config_t tc = {.local_id = node, .listen_host = "127.0.0.1"};
    kvt_tl_t *tl = NULL;
    kvt_tl_region_t *reg = NULL;
    uint32_t lpages = (uint32_t)strtoul(arg(argc, argv, "--pages", "4"), NULL, 10);
    uint8_t *mem = calloc(lpages ? lpages : 1, page);
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob), hl = 0;
    void *hs = NULL;
    char uuid[KVT_UUID_STR_LEN + 1], ep[300], line[1 << 20];
    kvt_uuid_t u;
    void *zctx = zmq_ctx_new(), *dl = zmq_socket(zctx, ZMQ_DEALER);
    zmq_msg_t f;
    kvt_msg_t m;
    int zero = 0, tmo = 10000;
    uint64_t firsts[KVT_POOL_MAX_REGIONS];
    char ruuid[KVT_POOL_MAX_REGIONS][KVT_UUID_STR_LEN + 1];
    uint32_t nreg = 0;

    kvt_uuid_generate(&u);
    kvt_uuid_to_str(&u, uuid);
    kvt_tl_region_params_t rp = {
        .uuid = uuid, .base = mem, .length = (uint64_t)lpages * page, .page_size = page};
    if (td == NULL || mem == NULL || td->ops->create(&tc, &cb, &tl) != KVT_OK ||
        td->ops->reg_region(tl, &rp, &reg) != KVT_OK ||
        td->ops->peer_prepare(tl, "receiver", blob, &bl) != KVT_OK) {
        fprintf(stderr, "transport setup failed\n");
        return 2;
    }
    /* libkvt's handshake: [b"", TransportInit{node_id, transport, addr: the transport's
     * blob}] to the init ROUTER */
    zmq_setsockopt(dl, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(dl, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    snprintf(ep, sizeof(ep), "tcp://%s:%u", host, iport);
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    m.u.tinit.node_id = (char *)node;
    m.u.tinit.transport = "tcp";
    m.u.tinit.version = 1;
    m.u.tinit.addr.p = blob;
    m.u.tinit.addr.n = (uint32_t)bl;
    if (kvt_msg_encode(&m, &hs, &hl) != KVT_OK || zmq_connect(dl, ep) != 0 ||
        zmq_send(dl, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(dl, hs, hl, 0) < 0) {
        fprintf(stderr, "handshake send failed\n");
        return 2;
    }
    kvt_free(hs);
    zmq_msg_init(&f);
    do {
        if (zmq_msg_recv(&f, dl, 0) < 0) {
            fprintf(stderr, "handshake: no answer\n");
            return 2;
        }
    } while (zmq_msg_size(&f) == 0 && zmq_msg_more(&f));
    if (kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &m, NULL) != KVT_OK ||
        m.type != KVT_MSG_TRANSPORT_INIT || m.u.tinit.nregions == 0 ||
        m.u.tinit.nregions > KVT_POOL_MAX_REGIONS) {
        fprintf(stderr, "handshake: bad answer (no regions)\n");
        return 2;
    }
    /* the receiver's buffer, in order: index i lives in the region whose
     * range of pages holds it */
    for (uint64_t first = 0; nreg < m.u.tinit.nregions; nreg++) {
        firsts[nreg] = first;
        snprintf(ruuid[nreg], sizeof(ruuid[nreg]), "%s", m.u.tinit.regions[nreg].uuid);
        first += m.u.tinit.regions[nreg].length / page;
    }
    if ((td->ops->peer_rename != NULL &&
         td->ops->peer_rename(tl, "receiver", m.u.tinit.node_id) != KVT_OK) ||
        td->ops->peer_connect(tl, m.u.tinit.node_id, m.u.tinit.addr.p, m.u.tinit.addr.n) !=
            KVT_OK) {
        fprintf(stderr, "handshake: connect failed\n");
        return 2;
    }
    printf("{\"ready\": true, \"regions\": %u}\n", nreg);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char *sp = strchr(line, ' ');
        if (strncmp(line, "put ", 4) == 0) {
            uint32_t lp = (uint32_t)strtoul(line + 4, &sp, 10);
            size_t k = 0;
            if (lp >= lpages || sp == NULL || *sp != ' ') {
                printf("{\"error\": \"bad put\"}\n");
                fflush(stdout);
                continue;
            }
            for (char *h = sp + 1; pdb_hex_val(h[0]) >= 0 && pdb_hex_val(h[1]) >= 0 && k < page;
                 h += 2)
                mem[(size_t)lp * page + k++] =
                    (uint8_t)(pdb_hex_val(h[0]) << 4 | pdb_hex_val(h[1]));
            if (td->ops->grant != NULL)
                (void)td->ops->grant(tl, m.u.tinit.node_id, reg, &lp, 1, KVT_TL_ACCESS_READ);
            printf("{\"uuid\": \"%s\", \"index\": %u}\n", uuid, lp);
            fflush(stdout);
            continue;
        }
        int64_t idx = strtoll(line, NULL, 10);
        size_t n = 0;
        kvt_status_t st = KVT_ERR_INVALID;
        uint32_t r = 0;
        if (sp != NULL && idx >= 0) {
            for (char *h = sp + 1; pdb_hex_val(h[0]) >= 0 && pdb_hex_val(h[1]) >= 0 && n < page;
                 h += 2)
                mem[n++] = (uint8_t)(pdb_hex_val(h[0]) << 4 | pdb_hex_val(h[1]));
            while (r + 1 < nreg && (uint64_t)idx >= firsts[r + 1])
                r++;
            kvt_tl_xfer_t x = {.local = reg, .local_offset = 0, .length = n};
            /* the staging page 0 is reused: a put page must not be page 0 */
            snprintf(x.remote_uuid, sizeof(x.remote_uuid), "%s", ruuid[r]);
            x.remote_offset = ((uint64_t)idx - firsts[r]) * page;
            pthread_mutex_lock(&d.lock);
            int want = d.n + 1;
            pthread_mutex_unlock(&d.lock);
            st = td->ops->post(tl, m.u.tinit.node_id, KVT_TL_OP_WRITE, &x, 1, 1);
            if (st == KVT_OK) {
                pthread_mutex_lock(&d.lock);
                while (d.n < want)
                    pthread_cond_wait(&d.cond, &d.lock);
                st = d.st;
                pthread_mutex_unlock(&d.lock);
            }
        }
        printf("{\"ok\": %s, \"status\": \"%s\"}\n", st == KVT_OK ? "true" : "false",
               kvt_status_name(st));
        fflush(stdout);
    }
    kvt_msg_clear(&m);
    zmq_msg_close(&f);
    td->ops->destroy(tl);
    free(mem);
    zmq_close(dl);
    zmq_ctx_term(zctx);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "recv") == 0)
        return run_recv(argc, argv);
    if (argc > 1 && strcmp(argv[1], "write") == 0)
        return run_write(argc, argv);
    fprintf(stderr, "usage: kvt-lmc-peer recv|write ...\n");
    return 2;
}
