/*
 * kvt-bench - throughput / latency of libkvt.
 *
 * Transport level (like a transfer-engine bench):
 *   kvt-bench --mode target    --port P [--transport tcp|verbs] [--buffer-size B]
 *   kvt-bench --mode initiator --host H --port P --op write|read
 *             [--block-size B] [--batch N] [--lanes N] [--duration S | --bytes N]
 *   The initiator keeps two batches in flight (ping-pong halves), prints GB/s,
 *   ops/s and per-batch latency p50/p99; the target verifies the data it
 *   holds at the end (write), the initiator verifies what it read (read).
 *
 * Allocation handshake round trip against a receiver engine:
 *   kvt-bench --mode recv --port P ...          (a receiver engine)
 *   kvt-bench --mode initiator --op alloc --host H --port P [--batch N]
 *
 * Engine level, every byte verified by the receiver (push, or pull with
 * --pull / --delay):
 *   kvt-bench --mode recv --port P [--init-port Q] [--bytes N] [--hold]
 *   kvt-bench --mode send --host H --port P --init-port Q [--bytes N] [--pull]
 *             [--pending-ttl S] [--linger S]
 *
 * The last line of every run is "RESULT key=value ..." for scripts.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvt/kvt_engine.h"
#include "kvt/kvt_msg.h"
#include "kvt/kvt_uuid.h"
#include "../src/kvt_transport.h" /* the transport ops table (internal API) */

typedef struct opts {
    const char *mode;
    const char *op;
    const char *transport;
    const char *host;
    const char *bind;
    const char *device;
    uint16_t port;
    uint16_t init_port;
    uint64_t block;
    uint32_t batch;
    uint32_t lanes;
    uint32_t depth;
    double duration;
    uint64_t bytes;
    uint64_t buffer;
    int pull;
    int delay;
    int hold;
    double pending_ttl;
    double linger;
} opts_t;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
    }
    return (uint64_t)v;
}

/* Pattern byte j of block <blk> of stamp <k>: cheap to make and to check. */
static inline uint64_t pat_word(uint64_t k, uint64_t blk, uint64_t w)
{
    return (k * 0x9e3779b97f4a7c15ull) ^ (blk << 32) ^ (w * 0xff51afd7ed558ccdull);
}

/* A block = word 0 holds the stamp <k>, the rest a pattern of the block
 * index. Re-stamping a block for the next batch costs one store. */
static void fill_block(uint8_t *p, uint64_t len, uint64_t k, uint64_t blk)
{
    uint64_t *w = (uint64_t *)p;
    w[0] = k;
    for (uint64_t i = 1; i < len / 8; i++)
        w[i] = pat_word(0, blk, i);
}

static void stamp_block(uint8_t *p, uint64_t k)
{
    memcpy(p, &k, sizeof(k));
}

static int check_block(const uint8_t *p, uint64_t len, uint64_t k, uint64_t blk)
{
    const uint64_t *w = (const uint64_t *)p;
    if (w[0] != k)
        return 0;
    for (uint64_t i = 1; i < len / 8; i++) {
        if (w[i] != pat_word(0, blk, i))
            return 0;
    }
    return 1;
}

/* Benchmark regions: 2 MiB aligned and backed by huge pages where the kernel
 * allows (fewer TLB misses while the NIC/kernel copies into them). */
static uint8_t *region_alloc(uint64_t size)
{
    uint64_t len = (size + (2u << 20) - 1) & ~((2ull << 20) - 1);
    uint8_t *p = aligned_alloc(2u << 20, len);
    if (p != NULL)
        (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- transport level */

typedef struct bench_tl {
    const kvt_tl_ops_t *ops;
    kvt_tl_t *tl;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done[16]; /* per pipeline slot (cookie = slot) */
    kvt_status_t st[16];
    int failed;
} bench_tl_t;

static void b_complete(void *arg, uint64_t cookie, kvt_status_t st)
{
    bench_tl_t *b = arg;
    pthread_mutex_lock(&b->mu);
    b->done[cookie % 16] = 1;
    b->st[cookie % 16] = st;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void b_peer_failed(void *arg, const char *peer, kvt_status_t st)
{
    bench_tl_t *b = arg;
    fprintf(stderr, "kvt-bench: peer %s failed: %s\n", peer, kvt_strerror(st));
    pthread_mutex_lock(&b->mu);
    b->failed = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static int tl_open(bench_tl_t *b, const opts_t *o, const char *id)
{
    const kvt_transport_desc_t *d = kvt_transport_find(o->transport);
    kvt_tl_config_t c = {.local_id = id,
                         .listen_host = o->bind,
                         .lanes = o->lanes,
                         .timeout_ms = 30000,
                         .device = o->device};
    kvt_tl_callbacks_t cb = {.on_complete = b_complete, .on_peer_failed = b_peer_failed, .arg = b};
    kvt_status_t st;

    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (d == NULL) {
        fprintf(stderr, "kvt-bench: transport '%s' is not built in\n", o->transport);
        return -1;
    }
    b->ops = d->ops;
    st = b->ops->create(&c, &cb, &b->tl);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt-bench: %s transport: %s (%s)\n", o->transport, kvt_strerror(st),
                kvt_status_name(st));
        return -1;
    }
    return 0;
}

static void *zsock(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    return s;
}

/* Receive one frame (after an optional ROUTER identity) with a timeout. */
static int zrecv(void *s, int router, char *ident, size_t *ilen, void *buf, size_t cap,
                 int timeout_ms)
{
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    int n;
    if (zmq_poll(&it, 1, timeout_ms) != 1)
        return -1;
    if (router) {
        n = zmq_recv(s, ident, 256, 0);
        if (n < 0)
            return -1;
        *ilen = (size_t)n;
    }
    n = zmq_recv(s, buf, cap, 0);
    return n;
}

static int run_target(const opts_t *o)
{
    bench_tl_t b;
    void *ctx = zmq_ctx_new(), *rt = zsock(ctx, ZMQ_ROUTER);
    char ep[300], uuid[KVT_UUID_STR_LEN + 1], peer[256] = "";
    uint8_t *mem;
    kvt_uuid_t u;
    kvt_tl_region_t *reg;
    uint64_t size = o->buffer;
    uint64_t npages = size / o->block;
    int rc = 1;

    if (tl_open(&b, o, "kvt-bench-target") != 0)
        return 2;
    mem = region_alloc(size);
    if (mem == NULL || npages == 0) {
        fprintf(stderr, "kvt-bench: cannot allocate %" PRIu64 " bytes\n", size);
        return 2;
    }
    memset(mem, 0, size);
    kvt_uuid_generate(&u);
    kvt_uuid_to_str(&u, uuid);
    {
        kvt_tl_region_params_t rp = {
            .uuid = uuid, .base = mem, .length = npages * o->block, .page_size = o->block};
        if (b.ops->reg_region(b.tl, &rp, &reg) != KVT_OK) {
            fprintf(stderr, "kvt-bench: region registration failed\n");
            return 2;
        }
    }
    snprintf(ep, sizeof(ep), "tcp://%s:%u", o->bind, (unsigned)o->port);
    if (zmq_bind(rt, ep) != 0) {
        fprintf(stderr, "kvt-bench: bind %s: %s\n", ep, zmq_strerror(errno));
        return 2;
    }
    printf("target: %s region %s, %" PRIu64 " blocks of %" PRIu64 " bytes, control %s\n",
           o->transport, uuid, npages, o->block, ep);
    fflush(stdout);
    while (!g_stop) {
        char ident[256], msg[KVT_TL_BLOB_MAX + 1], reply[KVT_TL_BLOB_MAX];
        size_t il = 0, rl = 0;
        int n = zrecv(rt, 1, ident, &il, msg, sizeof(msg) - 1, 200);
        if (n < 0)
            continue;
        msg[n < (int)sizeof(msg) - 1 ? n : (int)sizeof(msg) - 1] = '\0';
        if (strncmp(msg, "INFO", 4) == 0) {
            rl = (size_t)snprintf(reply, sizeof(reply), "%s %" PRIu64 " %" PRIu64, uuid, npages,
                                  o->block);
        } else if (strncmp(msg, "FILL ", 5) == 0) {
            /* read benchmark: stamp every block with its index (k = 0) */
            for (uint64_t i = 0; i < npages; i++)
                fill_block(mem + i * o->block, o->block, 0, i);
            rl = (size_t)snprintf(reply, sizeof(reply), "OK");
        } else if (strncmp(msg, "VERIFY ", 7) == 0) {
            /* VERIFY <batch> <depth> <k0> .. <kD-1>: slot h holds stamp kh in
             * blocks [h*batch, (h+1)*batch); -1 = slot never used */
            unsigned long long batch = 0, depth = 0;
            long long k[16];
            uint64_t bad = 0, ok = 0;
            char *q = msg + 7;
            batch = strtoull(q, &q, 10);
            depth = strtoull(q, &q, 10);
            for (unsigned i = 0; i < depth && i < 16; i++)
                k[i] = strtoll(q, &q, 10);
            if (batch > 0 && depth > 0 && depth <= 16 && depth * batch <= npages) {
                for (unsigned h = 0; h < depth; h++) {
                    if (k[h] < 0)
                        continue;
                    for (uint64_t j = 0; j < batch; j++) {
                        uint64_t blk = h * batch + j;
                        if (check_block(mem + blk * o->block, o->block, (uint64_t)k[h], j))
                            ok += o->block;
                        else
                            bad++;
                    }
                }
            } else {
                bad = 1;
            }
            rl = (size_t)snprintf(reply, sizeof(reply), "%s %" PRIu64 " %" PRIu64,
                                  bad ? "BAD" : "OK", ok, bad);
        } else if (strncmp(msg, "BYE", 3) == 0) {
            rl = (size_t)snprintf(reply, sizeof(reply), "OK");
        } else {
            /* the initiator's transport address blob (opaque: the bench's initiator always
             * runs as "kvt-bench-initiator") */
            size_t bl = sizeof(reply);
            snprintf(peer, sizeof(peer), "%s", "kvt-bench-initiator");
            rl = 0;
            if (b.ops->peer_prepare(b.tl, peer, reply, &bl) == KVT_OK &&
                b.ops->peer_connect(b.tl, peer, msg, (size_t)n) == KVT_OK) {
                rl = bl;
                if (b.ops->grant != NULL) {
                    uint32_t *pg = malloc(npages * sizeof(uint32_t));
                    for (uint64_t i = 0; i < npages; i++)
                        pg[i] = (uint32_t)i;
                    b.ops->grant(b.tl, peer, reg, pg, npages,
                                 KVT_TL_ACCESS_READ | KVT_TL_ACCESS_WRITE);
                    free(pg);
                }
            }
        }
        zmq_send(rt, ident, il, ZMQ_SNDMORE);
        zmq_send(rt, reply, rl, 0);
        if (strncmp(msg, "BYE", 3) == 0 && o->duration <= 0) {
            rc = 0;
            break;
        }
    }
    if (g_stop)
        rc = 0;
    b.ops->destroy(b.tl);
    zmq_close(rt);
    zmq_ctx_term(ctx);
    free(mem);
    return rc;
}

static int ctl(void *d, const char *req, size_t rlen, char *out, size_t cap)
{
    int n;
    zmq_send(d, req, rlen, 0);
    n = zrecv(d, 0, NULL, NULL, out, cap - 1, 30000);
    if (n < 0)
        return -1;
    out[n < (int)cap - 1 ? n : (int)cap - 1] = '\0';
    return n;
}

/* Pipeline state of an initiator run: one slot per batch in flight. */
typedef struct init_run {
    double *lat; /* batch latencies, seconds */
    size_t nlat, cap_lat;
    double post_t[16];   /* when the slot's batch was posted, 0 never */
    uint64_t last_k[16]; /* the stamp last written through the slot */
    uint64_t moved, half_bytes;
} init_run_t;

/* Handshake with the target and check its region fits the run; its uuid
 * into <ruuid> (64 bytes). 0, or 2 (reported). */
static int init_connect(bench_tl_t *b, const opts_t *o, void *d, const char *ep, char *ruuid,
                        char *reply, size_t rcap)
{
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    unsigned long long rpages, rblock;
    int n;

    if (b->ops->peer_prepare(b->tl, "target", blob, &bl) != KVT_OK)
        return 2;
    n = ctl(d, (const char *)blob, bl, reply, rcap);
    if (n <= 0 || b->ops->peer_connect(b->tl, "target", reply, (size_t)n) != KVT_OK) {
        fprintf(stderr, "kvt-bench: handshake with %s failed\n", ep);
        return 2;
    }
    if (ctl(d, "INFO", 4, reply, rcap) < 0 ||
        sscanf(reply, "%63s %llu %llu", ruuid, &rpages, &rblock) != 3 || rblock != o->block ||
        rpages < (unsigned long long)o->depth * o->batch) {
        fprintf(stderr, "kvt-bench: target region too small or block size differs (%s)\n", reply);
        return 2;
    }
    return 0;
}

/* Wait until slot <h> has no batch in flight. */
static void init_wait_slot(bench_tl_t *b, uint32_t h)
{
    pthread_mutex_lock(&b->mu);
    while (!b->done[h] && !b->failed)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

/* At the end of a run: wait for the slots other than <h> (just accounted)
 * and account the batches they completed. */
static void init_drain(bench_tl_t *b, init_run_t *r, uint32_t h, uint32_t depth)
{
    for (uint32_t i = 1; i < depth; i++) {
        uint32_t other = (h + i) % depth;
        init_wait_slot(b, other);
        if (r->post_t[other] > 0 && b->st[other] == KVT_OK && r->nlat < r->cap_lat) {
            r->lat[r->nlat++] = now_s() - r->post_t[other];
            r->moved += r->half_bytes;
        }
    }
}

/* Account slot <h>'s completed batch; a read's data is checked on the first
 * batches and the last. 0, or 1 on a data mismatch. */
static int init_account(const opts_t *o, init_run_t *r, const uint8_t *mem, uint32_t h, uint64_t k,
                        int stop)
{
    int rc = 0;

    if (r->nlat == r->cap_lat) {
        r->cap_lat *= 2;
        r->lat = realloc(r->lat, r->cap_lat * sizeof(double));
    }
    r->lat[r->nlat++] = now_s() - r->post_t[h];
    r->moved += r->half_bytes;
    if (strcmp(o->op, "write") != 0 && (k < 4 || stop)) {
        for (uint32_t j = 0; j < o->batch; j++) {
            if (!check_block(mem + h * r->half_bytes + j * o->block, o->block, 0,
                             h * o->batch + j)) {
                fprintf(stderr, "kvt-bench: read data mismatch in block %u\n", j);
                rc = 1;
            }
        }
    }
    return rc;
}

/* Post slot <h>'s batch number <k> (a write stamps its blocks with <k> first). */
static kvt_status_t init_post(bench_tl_t *b, const opts_t *o, init_run_t *r, kvt_tl_xfer_t *x,
                              kvt_tl_region_t *reg, uint8_t *mem, const char *ruuid, uint32_t h,
                              uint64_t k)
{
    int is_write = strcmp(o->op, "write") == 0;

    if (is_write) {
        for (uint32_t j = 0; j < o->batch; j++)
            stamp_block(mem + h * r->half_bytes + j * o->block, k);
        r->last_k[h] = k;
    }
    for (uint32_t j = 0; j < o->batch; j++) {
        x[j].local = reg;
        x[j].local_offset = h * r->half_bytes + j * o->block;
        memcpy(x[j].remote_uuid, ruuid, KVT_TL_UUID_LEN + 1);
        x[j].remote_offset = (uint64_t)(h * o->batch + j) * o->block;
        x[j].length = o->block;
    }
    pthread_mutex_lock(&b->mu);
    b->done[h] = 0;
    pthread_mutex_unlock(&b->mu);
    r->post_t[h] = now_s();
    return b->ops->post(b->tl, "target", is_write ? KVT_TL_OP_WRITE : KVT_TL_OP_READ, x, o->batch,
                        (uint64_t)h);
}

/* Have the target verify what a write run left in each slot; the verdict
 * into <verdict>. Returns <rc>, or 1 when the target disagrees. */
static int init_verify(const opts_t *o, const init_run_t *r, void *d, char *reply, size_t rcap,
                       char *verdict, size_t vcap, int rc)
{
    if (strcmp(o->op, "write") == 0 && rc == 0) {
        char req[512];
        int rl = snprintf(req, sizeof(req), "VERIFY %u %u", o->batch, o->depth);
        for (uint32_t h = 0; h < o->depth; h++)
            rl += snprintf(req + rl, sizeof(req) - (size_t)rl, " %lld",
                           r->last_k[h] == UINT64_MAX ? -1LL : (long long)r->last_k[h]);
        if (ctl(d, req, (size_t)rl, reply, rcap) < 0 || strncmp(reply, "OK", 2) != 0) {
            fprintf(stderr, "kvt-bench: target verification failed: %s\n", reply);
            rc = 1;
        }
        snprintf(verdict, vcap, "%.100s", reply);
    } else if (strcmp(o->op, "write") != 0) {
        snprintf(verdict, vcap, rc == 0 ? "OK" : "BAD");
    }
    return rc;
}

/* Print the run's figures, for people and (RESULT line) for scripts. */
static void init_print(const opts_t *o, init_run_t *r, double el, const char *verdict, int rc)
{
    double p50 = 0, p99 = 0;
    size_t nlat = r->nlat;

    if (nlat > 0) {
        qsort(r->lat, nlat, sizeof(double), cmp_double);
        p50 = r->lat[nlat / 2];
        p99 =
            r->lat[(size_t)((double)nlat * 0.99) < nlat ? (size_t)((double)nlat * 0.99) : nlat - 1];
    }
    printf("%s %s: %" PRIu64 " bytes in %.3f s = %.3f GB/s, %.0f ops/s, batch latency p50 "
           "%.1f us p99 %.1f us (lanes %u, block %" PRIu64 ", batch %u), verify %s\n",
           o->transport, o->op, r->moved, el, (double)r->moved / el / 1e9,
           (double)nlat * o->batch / el, p50 * 1e6, p99 * 1e6, o->lanes, o->block, o->batch,
           verdict);
    printf("RESULT mode=initiator op=%s transport=%s lanes=%u bytes=%" PRIu64
           " seconds=%.3f gbps=%.3f ops=%.0f p50_us=%.1f p99_us=%.1f verified=%d\n",
           o->op, o->transport, o->lanes, r->moved, el, (double)r->moved / el / 1e9,
           (double)nlat * o->batch / el, p50 * 1e6, p99 * 1e6, rc == 0);
}

static int run_initiator(const opts_t *o)
{
    bench_tl_t b;
    void *ctx = zmq_ctx_new(), *d = zsock(ctx, ZMQ_DEALER);
    char ep[300], reply[KVT_TL_BLOB_MAX + 1], ruuid[64], verdict[128] = "n/a";
    uint8_t *mem;
    kvt_tl_region_t *reg;
    char uuid[KVT_UUID_STR_LEN + 1];
    kvt_uuid_t u;
    int is_write = strcmp(o->op, "write") == 0;
    uint32_t batch = o->batch, depth = o->depth;
    init_run_t r = {.cap_lat = 1 << 16, .half_bytes = (uint64_t)batch * o->block};
    kvt_tl_xfer_t *x;
    double t0, t_end, el;
    uint64_t k = 0;
    int rc = 0;

    if (tl_open(&b, o, "kvt-bench-initiator") != 0)
        return 2;
    snprintf(ep, sizeof(ep), "tcp://%s:%u", o->host, (unsigned)o->port);
    zmq_connect(d, ep);
    if (init_connect(&b, o, d, ep, ruuid, reply, sizeof(reply)) != 0)
        return 2;
    mem = region_alloc(depth * r.half_bytes);
    kvt_uuid_generate(&u);
    kvt_uuid_to_str(&u, uuid);
    {
        kvt_tl_region_params_t rp = {
            .uuid = uuid, .base = mem, .length = depth * r.half_bytes, .page_size = o->block};
        if (mem == NULL || b.ops->reg_region(b.tl, &rp, &reg) != KVT_OK)
            return 2;
    }
    for (uint32_t j = 0; j < depth * batch; j++)
        fill_block(mem + (uint64_t)j * o->block, o->block, 0, j % batch);
    if (!is_write)
        ctl(d, "FILL ", 5, reply, sizeof(reply));
    x = calloc(batch, sizeof(*x));
    r.lat = malloc(r.cap_lat * sizeof(double));
    t0 = now_s();
    t_end = o->duration > 0 ? t0 + o->duration : 1e300;
    for (uint32_t h = 0; h < depth; h++) {
        b.done[h] = 1;
        r.last_k[h] = UINT64_MAX;
    }
    for (;;) {
        uint32_t h = (uint32_t)(k % depth); /* pipeline slot of this batch */
        int stop = g_stop || now_s() >= t_end || (o->bytes > 0 && r.moved >= o->bytes);
        init_wait_slot(&b, h); /* its previous batch completed */
        if (b.failed || (r.post_t[h] > 0 && b.st[h] != KVT_OK)) {
            fprintf(stderr, "kvt-bench: transfer failed: %s\n", kvt_strerror(b.st[h]));
            rc = 1;
            break;
        }
        if (r.post_t[h] > 0 && init_account(o, &r, mem, h, k, stop))
            rc = 1;
        if (stop) {
            init_drain(&b, &r, h, depth);
            break;
        }
        if (init_post(&b, o, &r, x, reg, mem, ruuid, h, k) != KVT_OK) {
            fprintf(stderr, "kvt-bench: post failed\n");
            rc = 1;
            break;
        }
        k++;
    }
    el = now_s() - t0;
    rc = init_verify(o, &r, d, reply, sizeof(reply), verdict, sizeof(verdict), rc);
    b.ops->destroy(b.tl); /* before the target goes away: no peer-failure noise */
    b.tl = NULL;
    ctl(d, "BYE", 3, reply, sizeof(reply));
    init_print(o, &r, el, verdict, rc);
    free(x);
    free(r.lat);
    if (b.tl != NULL)
        b.ops->destroy(b.tl);
    free(mem);
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc;
}

/* ---------------------------------------------------------------- engine level */

#define B_LAYERS 4
#define B_HIDDEN 512

static void geom_shape(int64_t *shape, uint64_t block)
{
    /* [2, layers, tokens, hidden] half -> tokens chosen so a chunk = block */
    shape[0] = 2;
    shape[1] = B_LAYERS;
    shape[2] = (int64_t)(block / (2 * B_LAYERS * B_HIDDEN * 2));
    shape[3] = B_HIDDEN;
}

static int engine_open(const opts_t *o, kvt_role_t role, kvt_engine_t **out)
{
    kvt_config_t c;
    kvt_engine_params_t ep = {.page_size = o->block, .bind_host = o->bind};
    kvt_status_t st;

    if (o->block % (2 * B_LAYERS * B_HIDDEN * 2) != 0) {
        fprintf(stderr, "kvt-bench: --block-size must be a multiple of %d in send/recv modes\n",
                2 * B_LAYERS * B_HIDDEN * 2);
        return -1;
    }
    kvt_config_defaults(&c);
    c.pd_role = role;
    c.pd_buffer_size = o->buffer;
    c.pd_pull_mode = o->pull || o->delay;
    c.pd_delay_pull = o->delay;
    c.transfer_lanes = o->lanes;
    snprintf(c.verbs_device, sizeof(c.verbs_device), "%s", o->device);
    if (kvt_channel_parse(o->transport, &c.transfer_channel) != KVT_OK)
        return -1;
    snprintf(c.pd_peer_host, sizeof(c.pd_peer_host), "%s", o->host);
    c.pd_peer_alloc_port.v[0] = o->port;
    c.pd_peer_alloc_port.n = 1;
    c.pd_peer_init_port.v[0] = o->init_port;
    c.pd_peer_init_port.n = 1;
    c.pd_pull_done_port.v[0] = 0;
    c.pd_pull_done_port.n = 1;
    if (o->pending_ttl > 0)
        c.pd_pull_pending_ttl = o->pending_ttl;
    c.pd_allocation_timeout_sec = 10.0;
    ep.cfg = &c;
    st = kvt_engine_create(&ep, out);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt-bench: engine: %s\n", kvt_strerror(st));
        return -1;
    }
    return 0;
}

static void key_of(char *buf, size_t cap, uint64_t req, uint32_t j)
{
    snprintf(buf, cap, "bench-%" PRIu64 "/%u", req, j);
}

/* Receiver: wait for requests bench-0, bench-1, ...; load and verify every
 * chunk; release. */
static int run_recv(const opts_t *o)
{
    kvt_engine_t *e;
    kvt_engine_ports_t p;
    uint64_t req = 0, got = 0, bad = 0;
    uint32_t batch = o->batch;
    int idle = 0;
    char **keys = calloc(batch, sizeof(char *));
    uint8_t **bufs = calloc(batch, sizeof(uint8_t *));
    size_t *caps = calloc(batch, sizeof(size_t)), *lens = calloc(batch, sizeof(size_t));
    double t0 = 0;

    if (engine_open(o, KVT_ROLE_RECEIVER, &e) != 0)
        return 2;
    kvt_engine_ports(e, &p);
    printf("recv: alloc_port=%u init_port=%u data_port=%u id=%s\n", p.alloc_port, p.init_port,
           p.data_port, kvt_engine_id(e));
    fflush(stdout);
    for (uint32_t j = 0; j < batch; j++) {
        keys[j] = malloc(64);
        bufs[j] = aligned_alloc(64, o->block);
        caps[j] = o->block;
    }
    while (!g_stop && (o->bytes == 0 || got < o->bytes)) {
        char rid[64];
        kvt_task_id_t id;
        kvt_task_result_t res;
        snprintf(rid, sizeof(rid), "bench-%" PRIu64, req);
        if (kvt_submit_wait_req(e, rid, 500, NULL, &id) != KVT_OK ||
            kvt_task_wait(e, id, 2000, &res) != KVT_OK)
            break;
        if (res.status != KVT_OK) {
            kvt_task_result_clear(&res);
            if (++idle > 40) { /* 20 s without the next request: the sender is gone */
                fprintf(stderr, "kvt-bench: %s never arrived\n", rid);
                break;
            }
            continue; /* not there yet: wait again */
        }
        idle = 0;
        kvt_task_result_clear(&res);
        if (t0 == 0)
            t0 = now_s();
        if (o->hold) {
            printf("recv: holding %s\n", rid);
            fflush(stdout);
            req++;
            continue;
        }
        for (uint32_t j = 0; j < batch; j++)
            key_of(keys[j], 64, req, j);
        if (kvt_submit_load(e, (const char *const *)keys, (void *const *)bufs, caps, lens, batch,
                            NULL, &id) != KVT_OK ||
            kvt_task_wait(e, id, 30000, &res) != KVT_OK)
            break;
        for (uint32_t j = 0; j < batch; j++) {
            if (!kvt_bitmap_test(res.bitmap, j) || lens[j] != o->block ||
                !check_block(bufs[j], o->block, req, j))
                bad++;
            else
                got += o->block;
        }
        kvt_task_result_clear(&res);
        kvt_release_req(e, rid);
        req++;
    }
    {
        double el = t0 > 0 ? now_s() - t0 : 0;
        kvt_metrics_t m;
        kvt_engine_metrics(e, &m);
        printf("recv: verified %" PRIu64 " bytes in %" PRIu64 " requests, %" PRIu64
               " bad chunks, %.3f GB/s\n",
               got, req, bad, el > 0 ? (double)got / el / 1e9 : 0.0);
        printf("RESULT mode=recv verified_bytes=%" PRIu64 " bad=%" PRIu64 " requests=%" PRIu64
               " bytes_read=%" PRIu64 "\n",
               got, bad, req, m.bytes_read);
    }
    if (o->hold)
        while (!g_stop)
            usleep(100 * 1000);
    kvt_engine_destroy(e);
    for (uint32_t j = 0; j < batch; j++) {
        free(keys[j]);
        free(bufs[j]);
    }
    free(keys);
    free(bufs);
    free(caps);
    free(lens);
    return bad == 0 && (o->bytes == 0 || got >= o->bytes) ? 0 : 1;
}

/* Harvest store task <id>; adds <bytes> to *sent on success. */
static int store_done(kvt_engine_t *e, kvt_task_id_t id, uint64_t *sent, uint64_t bytes)
{
    kvt_task_result_t res;
    int rc = 0;

    if (kvt_task_wait(e, id, 60000, &res) != KVT_OK) {
        fprintf(stderr, "kvt-bench: store did not complete\n");
        return 1;
    }
    if (res.status != KVT_OK) {
        fprintf(stderr, "kvt-bench: store: %s\n", kvt_strerror(res.status));
        rc = 1;
    } else {
        *sent += bytes;
    }
    kvt_task_result_clear(&res);
    return rc;
}

static int run_send(const opts_t *o)
{
    kvt_engine_t *e;
    uint32_t batch = o->batch;
    char **keys = calloc(batch, sizeof(char *));
    uint8_t **bufs = calloc(batch, sizeof(uint8_t *));
    size_t *lens = calloc(batch, sizeof(size_t));
    uint64_t req = 0, sent = 0, submitted = 0;
    kvt_task_id_t prev = 0;
    kvt_store_desc_t d;
    double t0 = now_s(), t_end = o->duration > 0 ? t0 + o->duration : 1e300;
    int rc = 0;

    if (engine_open(o, KVT_ROLE_SENDER, &e) != 0)
        return 2;
    memset(&d, 0, sizeof(d));
    d.fmt = KVT_FMT_KV_2LTD;
    d.ndim = 4;
    geom_shape(d.shape, o->block);
    d.dtype = "half";
    d.is_last_batch = 1;
    for (uint32_t j = 0; j < batch; j++) {
        keys[j] = malloc(64);
        bufs[j] = aligned_alloc(64, o->block);
        lens[j] = o->block;
    }
    while (!g_stop && now_s() < t_end && (o->bytes == 0 || submitted < o->bytes)) {
        char rid[64];
        kvt_task_id_t id;
        kvt_status_t st;
        snprintf(rid, sizeof(rid), "bench-%" PRIu64, req);
        d.req_id = rid;
        d.total_chunks = batch;
        for (uint32_t j = 0; j < batch; j++) {
            key_of(keys[j], 64, req, j);
            fill_block(bufs[j], o->block, req, j);
        }
        st = kvt_submit_store(e, &d, (const char *const *)keys, (const void *const *)bufs, lens,
                              batch, &id);
        if (st == KVT_ERR_BACKPRESSURE || st == KVT_ERR_NOSPACE) {
            if (prev != 0) {
                if (store_done(e, prev, &sent, (uint64_t)batch * o->block) != 0) {
                    rc = 1;
                    prev = 0;
                    break;
                }
                prev = 0;
            } else {
                usleep(1000);
            }
            continue;
        }
        if (st != KVT_OK) {
            fprintf(stderr, "kvt-bench: store: %s\n", kvt_strerror(st));
            rc = 1;
            break;
        }
        /* two requests in flight: the next one is staged while this one moves */
        if (prev != 0 && store_done(e, prev, &sent, (uint64_t)batch * o->block) != 0) {
            rc = 1;
            prev = id;
            break;
        }
        prev = id;
        submitted += (uint64_t)batch * o->block;
        req++;
    }
    if (prev != 0 && store_done(e, prev, &sent, (uint64_t)batch * o->block) != 0)
        rc = 1;
    {
        double el = now_s() - t0;
        kvt_metrics_t m;
        kvt_engine_metrics(e, &m);
        printf("send: %" PRIu64 " bytes in %" PRIu64 " requests, %.3f s, %.3f GB/s\n", sent, req,
               el, (double)sent / el / 1e9);
        fflush(stdout);
        /* pull: keep serving the receiver's reads until every pin is gone
         * (done signals, or the TTL sweep), at most --linger seconds */
        for (double end = now_s() + (o->linger > 0 ? o->linger : 60.0); !g_stop && now_s() < end;) {
            kvt_engine_metrics(e, &m);
            printf("send: pinned=%u expired=%" PRIu64 "\n", m.pinned_pages, m.pull_expired_total);
            fflush(stdout);
            if (m.pinned_pages == 0)
                break;
            usleep(100 * 1000);
        }
        kvt_engine_metrics(e, &m);
        printf("RESULT mode=send bytes=%" PRIu64 " requests=%" PRIu64 " seconds=%.3f gbps=%.3f "
               "pinned=%u expired=%" PRIu64 " bytes_write=%" PRIu64 "\n",
               sent, req, el, (double)sent / el / 1e9, m.pinned_pages, m.pull_expired_total,
               m.bytes_write);
    }
    kvt_engine_destroy(e);
    for (uint32_t j = 0; j < batch; j++) {
        free(keys[j]);
        free(bufs[j]);
    }
    free(keys);
    free(bufs);
    free(lens);
    return rc;
}

/* AllocRequest -> AscendAllocResponse round trips against a receiver. */
static int run_alloc_rtt(const opts_t *o)
{
    void *ctx = zmq_ctx_new(), *d = zsock(ctx, ZMQ_DEALER);
    char ep[300];
    double *lat = malloc(1 << 20), t0 = now_s();
    size_t nlat = 0, cap = (1 << 20) / sizeof(double);
    int64_t shape[4];
    int rc = 0;

    geom_shape(shape, o->block);
    snprintf(ep, sizeof(ep), "tcp://%s:%u", o->host, (unsigned)o->port);
    zmq_setsockopt(d, ZMQ_ROUTING_ID, "kvt-bench-to-target", 19);
    zmq_connect(d, ep);
    for (uint64_t k = 0;
         !g_stop && now_s() - t0 < (o->duration > 0 ? o->duration : 2.0) && nlat < cap; k++) {
        kvt_msg_t m, c;
        void *data;
        size_t len;
        char rid[64], buf[1 << 16];
        double ts;
        int n;
        snprintf(rid, sizeof(rid), "alloc-%" PRIu64, k);
        kvt_msg_init(&m, KVT_MSG_ALLOC_REQUEST);
        for (uint32_t j = 0; j < o->batch; j++) {
            char key[96];
            snprintf(key, sizeof(key), "%.60s/%u", rid, j);
            kvt_str_list_push(&m.u.alloc_req.keys, key);
        }
        m.u.alloc_req.fmt = KVT_FMT_KV_2LTD;
        kvt_int_list_set(&m.u.alloc_req.shape, shape, 4);
        kvt_msg_set_str(&m.u.alloc_req.dtype, "half");
        kvt_msg_set_str(&m.u.alloc_req.req_id, rid);
        m.u.alloc_req.kvt_ext = KVT_MSG_EXT_VERSION; /* measured as a libkvt sender */
        kvt_msg_encode(&m, &data, &len);
        kvt_msg_clear(&m);
        ts = now_s();
        zmq_send(d, data, len, 0);
        kvt_free(data);
        n = zrecv(d, 0, NULL, NULL, buf, sizeof(buf), 10000);
        if (n < 0 || kvt_msg_decode(buf, (size_t)n, &m, NULL) != KVT_OK) {
            fprintf(stderr, "kvt-bench: no AllocResponse\n");
            rc = 1;
            break;
        }
        lat[nlat++] = now_s() - ts;
        if (m.u.alloc_resp.alloc_failed)
            rc = 1;
        kvt_msg_clear(&m);
        /* give the pages back */
        kvt_msg_init(&c, KVT_MSG_CANCEL_NOTIF);
        kvt_msg_set_str(&c.u.cancel.req_id, rid);
        kvt_msg_encode(&c, &data, &len);
        kvt_msg_clear(&c);
        zmq_send(d, data, len, 0);
        kvt_free(data);
        /* the receiver answers a cancel (AllocResponse{remote_indexes: []});
         * read it so it is not taken for the next request's answer */
        if (zrecv(d, 0, NULL, NULL, buf, sizeof(buf), 10000) < 0) {
            fprintf(stderr, "kvt-bench: CancelNotif not answered\n");
            rc = 1;
            break;
        }
    }
    if (nlat > 0) {
        qsort(lat, nlat, sizeof(double), cmp_double);
        printf("alloc handshake: %zu round trips, batch %u, p50 %.1f us p99 %.1f us\n", nlat,
               o->batch, lat[nlat / 2] * 1e6, lat[(size_t)((double)nlat * 0.99)] * 1e6);
        printf("RESULT mode=initiator op=alloc n=%zu p50_us=%.1f p99_us=%.1f\n", nlat,
               lat[nlat / 2] * 1e6, lat[(size_t)((double)nlat * 0.99)] * 1e6);
    }
    free(lat);
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvt-bench --mode initiator|target|send|recv [--op write|read|alloc]\n"
            "  [--transport tcp|verbs] [--host H] [--port P] [--init-port P] [--bind H]\n"
            "  [--block-size B] [--batch N] [--lanes N] [--duration S] [--bytes N]\n"
            "  [--buffer-size B] [--pull] [--delay] [--hold] [--pending-ttl S] [--linger S]\n"
            "  [--device DEV]  (verbs: [name][:port[:gid_index]])  [--depth N]  (batches in\n"
            "  flight, initiator, 1..16, default 4)\n");
}

/* One command-line option into <o>; -1 for an unknown one. */
static int apply_opt(int c, opts_t *o)
{
    switch (c) {
    case 'm':
        o->mode = optarg;
        break;
    case 'o':
        o->op = optarg;
        break;
    case 't':
        o->transport = optarg;
        break;
    case 'H':
        o->host = optarg;
        break;
    case 'p':
        o->port = (uint16_t)atoi(optarg);
        break;
    case 'i':
        o->init_port = (uint16_t)atoi(optarg);
        break;
    case 'B':
        o->bind = optarg;
        break;
    case 'b':
        o->block = parse_size(optarg);
        break;
    case 'n':
        o->batch = (uint32_t)atoi(optarg);
        break;
    case 'l':
        o->lanes = (uint32_t)atoi(optarg);
        break;
    case 'd':
        o->duration = atof(optarg);
        break;
    case 'y':
        o->bytes = parse_size(optarg);
        break;
    case 'S':
        o->buffer = parse_size(optarg);
        break;
    case 'P':
        o->pull = 1;
        break;
    case 'D':
        o->delay = 1;
        break;
    case 'h':
        o->hold = 1;
        break;
    case 'T':
        o->pending_ttl = atof(optarg);
        break;
    case 'L':
        o->linger = atof(optarg);
        break;
    case 'v':
        o->device = optarg;
        break;
    case 'e':
        o->depth = (uint32_t)atoi(optarg);
        break;
    default:
        return -1;
    }
    return 0;
}

/* Run the mode <o> asks for; 2 (after the usage) when its options do not fit it. */
static int run_mode(opts_t *o)
{
    if (strcmp(o->mode, "target") == 0)
        return run_target(o);
    if (strcmp(o->mode, "initiator") == 0) {
        if (o->port == 0) {
            usage();
            return 2;
        }
        if (strcmp(o->op, "alloc") == 0)
            return run_alloc_rtt(o);
        if (strcmp(o->op, "write") != 0 && strcmp(o->op, "read") != 0) {
            usage();
            return 2;
        }
        if (o->duration <= 0 && o->bytes == 0)
            o->duration = 5;
        return run_initiator(o);
    }
    if (strcmp(o->mode, "recv") == 0)
        return run_recv(o);
    if (strcmp(o->mode, "send") == 0) {
        if (o->port == 0 || o->init_port == 0) {
            usage();
            return 2;
        }
        return run_send(o);
    }
    usage();
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {.mode = NULL,
                .op = "write",
                .transport = "tcp",
                .host = "127.0.0.1",
                .device = "",
                .depth = 4,
                .bind = "127.0.0.1",
                .port = 0,
                .block = 1 << 20,
                .batch = 16,
                .lanes = 1,
                .duration = 0,
                .bytes = 0,
                .buffer = 0};
    static const struct option lo[] = {{"mode", 1, 0, 'm'},        {"op", 1, 0, 'o'},
                                       {"transport", 1, 0, 't'},   {"host", 1, 0, 'H'},
                                       {"port", 1, 0, 'p'},        {"init-port", 1, 0, 'i'},
                                       {"bind", 1, 0, 'B'},        {"block-size", 1, 0, 'b'},
                                       {"batch", 1, 0, 'n'},       {"lanes", 1, 0, 'l'},
                                       {"duration", 1, 0, 'd'},    {"bytes", 1, 0, 'y'},
                                       {"buffer-size", 1, 0, 'S'}, {"pull", 0, 0, 'P'},
                                       {"delay", 0, 0, 'D'},       {"hold", 0, 0, 'h'},
                                       {"pending-ttl", 1, 0, 'T'}, {"linger", 1, 0, 'L'},
                                       {"device", 1, 0, 'v'},      {"depth", 1, 0, 'e'},
                                       {"help", 0, 0, '?'},        {0, 0, 0, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (apply_opt(c, &o) != 0) {
            usage();
            return 2;
        }
    }
    if (o.mode == NULL || o.block < 4096 || o.block % 4096 || o.batch == 0 || o.lanes == 0 ||
        o.depth == 0 || o.depth > 16) {
        usage();
        return 2;
    }
    if (o.buffer == 0)
        o.buffer = (uint64_t)o.block * o.batch * 4;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    return run_mode(&o);
}
