/*
 * fuzz_tcp_frame.c - bytes from a TCP lane into the TCP transport, in-process.
 *
 * The frame codecs (request and reply headers) and the address-blob codec
 * (kvt_tl_tcp_addr.c) get the raw input; then the
 * input is played as a whole lane into the target side (kvt_tl_tcp_serve)
 * through an in-memory reader, against a registered region with a few pages
 * granted to the peer "fuzz". Input byte 0 picks a prefix so the fuzzer
 * reaches the frame loop quickly: bit 0 = a valid HELLO from "fuzz" (with
 * the token this side issued to it), bit 1 = a HELLO from "fuzz" with a
 * wrong token (must be refused). The transport must never crash, over-read,
 * touch memory outside the region, accept a wrong token, or leak; every
 * reply it writes must decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvt/kvt_msg.h"
#include "kvt_tl_tcp_int.h"

#define FZ_PAGE  4096u
#define FZ_PAGES 16u
#define FZ_UUID  "0f0e0d0c-0b0a-4908-8706-050403020100"
#define FZ_WRONG "00000000-0000-4000-8000-000000000000"

static kvt_tl_t *g_tl;
static uint8_t *g_mem;
static char g_token[KVT_TCP_TOKEN_LEN + 1];

typedef struct mem_io {
    const uint8_t *p;
    size_t left;
    int replies;
    int refused_hello;
} mem_io_t;

static kvt_status_t mem_recv(void *ctx, void *buf, size_t len, kvt_tcp_phase_t phase)
{
    mem_io_t *m = ctx;
    (void)phase;
    if (len > m->left) {
        m->left = 0;
        return KVT_ERR_PEER; /* EOF in the middle */
    }
    memcpy(buf, m->p, len);
    m->p += len;
    m->left -= len;
    return KVT_OK;
}

static kvt_status_t mem_send(void *ctx, struct iovec *iov, int iovcnt)
{
    mem_io_t *m = ctx;
    kvt_tcp_reply_t r;

    /* the first piece of every send is a reply header that must decode */
    if (iovcnt < 1 || iov[0].iov_len != KVT_TCP_REPLY_LEN ||
        kvt_tcp_reply_decode(iov[0].iov_base, iov[0].iov_len, &r) != KVT_OK)
        abort();
    if (m->replies++ == 0 && r.status != KVT_OK)
        m->refused_hello = 1;
    return KVT_OK;
}

static void fz_init(void)
{
    kvt_tl_config_t c = {.local_id = "fuzz-target", .listen_host = "127.0.0.1", .lanes = 1};
    kvt_tl_region_params_t rp;
    kvt_tl_region_t *reg;
    uint32_t wpages[4] = {0, 1, 2, 3}, rpages[4] = {2, 3, 4, 5};
    uint8_t blob[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(blob);
    char host[256];
    uint16_t port;

    if (kvt_tl_tcp_desc.ops->create(&c, NULL, &g_tl) != KVT_OK)
        abort();
    g_mem = calloc(FZ_PAGES, FZ_PAGE);
    rp = (kvt_tl_region_params_t){
        .uuid = FZ_UUID, .base = g_mem, .length = FZ_PAGES * FZ_PAGE, .page_size = FZ_PAGE};
    if (kvt_tl_tcp_desc.ops->reg_region(g_tl, &rp, &reg) != KVT_OK ||
        kvt_tl_tcp_desc.ops->grant(g_tl, "fuzz", reg, wpages, 4, KVT_TL_ACCESS_WRITE) != KVT_OK ||
        kvt_tl_tcp_desc.ops->grant(g_tl, "fuzz", reg, rpages, 4, KVT_TL_ACCESS_READ) != KVT_OK)
        abort();
    /* the token "fuzz" must present, as its handshake blob would carry it */
    if (kvt_tl_tcp_desc.ops->peer_prepare(g_tl, "fuzz", blob, &bl) != KVT_OK ||
        kvt_tcp_addr_unpack(blob, bl, host, &port, g_token) != KVT_OK)
        abort();
}

static void check_codecs(const uint8_t *data, size_t size)
{
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;
    char host[256], token[KVT_TCP_TOKEN_LEN + 1];
    uint16_t port;

    /* a peer's address blob (it comes over the control plane): anything accepted packs
     * back to the same bytes */
    if (kvt_tcp_addr_unpack(data, size, host, &port, token) == KVT_OK) {
        uint8_t b[KVT_TL_BLOB_MAX];
        size_t bl = sizeof(b);
        if (kvt_tcp_addr_pack(host, port, token, b, &bl) != KVT_OK || bl != size ||
            memcmp(b, data, size) != 0)
            abort();
    }

    if (kvt_tcp_hdr_decode(data, size, &h) == KVT_OK) {
        /* anything accepted re-encodes to the same header */
        uint8_t b[KVT_TCP_HDR_LEN];
        kvt_tcp_hdr_t d;
        kvt_tcp_hdr_encode(&h, b);
        if (kvt_tcp_hdr_decode(b, sizeof(b), &d) != KVT_OK || d.op != h.op ||
            d.length != h.length || d.offset != h.offset || strcmp(d.uuid, h.uuid) != 0)
            abort();
    }
    if (kvt_tcp_reply_decode(data, size, &r) == KVT_OK) {
        uint8_t b[KVT_TCP_REPLY_LEN];
        kvt_tcp_reply_t d;
        kvt_tcp_reply_encode(&r, b);
        if (kvt_tcp_reply_decode(b, sizeof(b), &d) != KVT_OK || d.status != r.status ||
            d.seq != r.seq || d.flags != r.flags)
            abort();
    }
    (void)kvt_tcp_range_ok(size, size * 3, FZ_PAGES * FZ_PAGE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *lane;
    size_t n = 0;
    mem_io_t m = {0};
    kvt_tcp_io_t io = {.recv = mem_recv, .send = mem_send, .ctx = &m};
    tcp_conn_t c;
    int wrong = 0;

    if (g_tl == NULL)
        fz_init();
    check_codecs(data, size);
    if (size == 0)
        return 0;
    lane = malloc(KVT_TCP_HDR_LEN + 4 + size);
    if (data[0] & 3) {
        kvt_tcp_hdr_t hello = {.op = KVT_TCP_OP_HELLO, .length = 4};
        wrong = !(data[0] & 1);
        memcpy(hello.uuid, wrong ? FZ_WRONG : g_token, sizeof(hello.uuid));
        kvt_tcp_hdr_encode(&hello, lane);
        memcpy(lane + KVT_TCP_HDR_LEN, "fuzz", 4);
        n = KVT_TCP_HDR_LEN + 4;
    }
    memcpy(lane + n, data + 1, size - 1);
    n += size - 1;
    m.p = lane;
    m.left = n;
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    (void)kvt_tl_tcp_serve(g_tl, &c, &io);
    if (wrong && !m.refused_hello)
        abort(); /* a HELLO with another token was let in */
    free(lane);
    return 0;
}
