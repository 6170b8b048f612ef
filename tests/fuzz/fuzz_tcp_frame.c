/*
 * fuzz_tcp_frame.c - bytes from a TCP lane into the TCP transport.
 *
 * The frame codecs (request and reply headers) get the raw input; then the
 * input is played as a whole connection into the target side
 * (kvt_tl_tcp_serve_fd) over a socketpair, against a registered region
 * with a few pages granted to the peer "fuzz". Input byte 0 bit 0 set =
 * prepend a valid HELLO from "fuzz" so the fuzzer reaches the frame loop.
 * The transport must never crash, over-read, touch memory outside the
 * region, hang or leak.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvt_tl_tcp_int.h"

#define FZ_PAGE  4096u
#define FZ_PAGES 16u
#define FZ_UUID  "0f0e0d0c-0b0a-4908-8706-050403020100"

static kvt_tl_t *g_tl;
static uint8_t *g_mem;

static void fz_init(void)
{
    kvt_tl_config_t c = {.local_id = "fuzz-target", .listen_host = "127.0.0.1", .lanes = 1};
    kvt_tl_region_params_t rp;
    kvt_tl_region_t *reg;
    uint32_t wpages[4] = {0, 1, 2, 3}, rpages[4] = {2, 3, 4, 5};

    if (kvt_tl_tcp_desc.ops->create(&c, NULL, &g_tl) != KVT_OK)
        abort();
    g_mem = calloc(FZ_PAGES, FZ_PAGE);
    rp = (kvt_tl_region_params_t){
        .uuid = FZ_UUID, .base = g_mem, .length = FZ_PAGES * FZ_PAGE, .page_size = FZ_PAGE};
    if (kvt_tl_tcp_desc.ops->reg_region(g_tl, &rp, &reg) != KVT_OK ||
        kvt_tl_tcp_desc.ops->grant(g_tl, "fuzz", reg, wpages, 4, KVT_TL_ACCESS_WRITE) != KVT_OK ||
        kvt_tl_tcp_desc.ops->grant(g_tl, "fuzz", reg, rpages, 4, KVT_TL_ACCESS_READ) != KVT_OK)
        abort();
}

static void *drain(void *arg)
{
    int fd = *(int *)arg;
    char buf[65536];
    while (recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    return NULL;
}

static void feed(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_tcp_hdr_t h;
    kvt_tcp_reply_t r;
    int sv[2];
    pthread_t th;

    if (g_tl == NULL)
        fz_init();
    if (kvt_tcp_hdr_decode(data, size, &h) == KVT_OK) {
        /* anything accepted re-encodes to the same header */
        uint8_t b[KVT_TCP_HDR_LEN];
        kvt_tcp_hdr_t d;
        kvt_tcp_hdr_encode(&h, b);
        if (kvt_tcp_hdr_decode(b, sizeof(b), &d) != KVT_OK || d.op != h.op ||
            d.length != h.length || d.offset != h.offset || strcmp(d.uuid, h.uuid) != 0)
            abort();
    }
    (void)kvt_tcp_reply_decode(data, size, &r);
    (void)kvt_tcp_range_ok(size, size * 3, FZ_PAGES * FZ_PAGE);

    if (size == 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 0;
    pthread_create(&th, NULL, drain, &sv[0]);
    if (data[0] & 1) {
        uint8_t hb[KVT_TCP_HDR_LEN];
        kvt_tcp_hdr_t hello = {.op = KVT_TCP_OP_HELLO, .length = 4};
        kvt_tcp_hdr_encode(&hello, hb);
        feed(sv[0], hb, sizeof(hb));
        feed(sv[0], (const uint8_t *)"fuzz", 4);
    }
    feed(sv[0], data + 1, size - 1);
    shutdown(sv[0], SHUT_WR); /* EOF after the input: the server returns */
    (void)kvt_tl_tcp_serve_fd(g_tl, sv[1]);
    shutdown(sv[1], SHUT_RDWR);
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
