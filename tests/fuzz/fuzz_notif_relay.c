/*
 * fuzz_notif_relay.c - what a peer replica (or anyone who reaches the relay port) sends to the
 * ProxyNotif relay of the gateway (gateway/src/kvctl/pdgw_notif_relay.c): multipart frames into
 * pdgw_notif_relay_recv, which reads them straight from its ZeroMQ PULL (there is no separate
 * parser to call), so the frames travel over a real loopback connection from a PUSH.
 *
 * Input: byte 0 picks the mode (bit 0) and byte 1 the buffer sizes recv is given (0: the
 * gateway's own, 160 and 54 bytes, pdgw_kvctl_notif.c; else small ones, to test the limits).
 *  - raw (bit 0 clear): the rest is up to 6 frames, each a 2-byte big-endian length and its
 *    bytes (cut to what remains and to the relay's 1024-byte message bound, which ZeroMQ
 *    enforces by dropping the connection);
 *  - round trip (bit 0 set): the rest is an id and an engine address, split at the first
 *    0xff, handed to pdgw_notif_relay_forward on a second relay whose peer is the first.
 * Each input is followed by a marker notice on the same connection, so the order of what recv
 * returns is known and nothing waits on a timer.
 *
 * Properties: recv returns a notice iff it is [tag, id, sender] with 0 < |id| < id size and
 * |sender| < sender size (the wire of pdgw_notif_relay.c: RELAY_TAG and three frames), and
 * then exactly those bytes, NUL-terminated, within the buffers it was given (exact-size heap
 * buffers, so ASan sees a write past them); a forwarded notice that fits arrives unchanged.
 */
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "pdgw_notif.h"

#define TAG      "pdgw-notif-relay/1" /* RELAY_TAG of pdgw_notif_relay.c */
#define MAX_MSG  1024                 /* RELAY_MAX_MSG of pdgw_notif_relay.c */
#define ID_CAP   160                  /* KVCTL_ID_MAX, pdgw_kvctl.h */
#define PEER_CAP 54                   /* INET6_ADDRSTRLEN + 8, pdgw_kvctl_notif.c */
#define MARKER   "\x01"
#define SYNC     "\x02" /* the start-up's last notice */

static pdgw_notif_relay_t *recv_relay; /* its peer is 127.0.0.1: our PUSH is accepted */
static pdgw_notif_relay_t *fwd_relay;  /* its peer is recv_relay */
static void *ctx, *push;

static pdgw_notif_relay_t *relay_open(const char *peers)
{
    pdgw_fwd_kv_opts_t o;
    pdgw_notif_relay_t *r = NULL;
    char err[256];

    memset(&o, 0, sizeof(o));
    snprintf(o.proxy_host, sizeof(o.proxy_host), "127.0.0.1");
    snprintf(o.notif_relay_peers, sizeof(o.notif_relay_peers), "%s", peers);
    o.notif_relay_port = 0; /* any free port */
    if (pdgw_notif_relay_create("fuzz", &o, &r, err, sizeof(err)) != PDGW_FWD_OK) {
        fprintf(stderr, "fuzz_notif_relay: %s\n", err);
        abort();
    }
    return r;
}

/* The next notice recv_relay returns, waiting for it (the fd is edge-style: poll briefly and
 * ask again). A notice that never comes is a hang, which libFuzzer reports. */
static int recv_next(char *id, size_t cap, char *sender, size_t sendercap)
{
    struct pollfd p = {.fd = pdgw_notif_relay_fd(recv_relay), .events = POLLIN};
    for (;;) {
        if (pdgw_notif_relay_recv(recv_relay, id, cap, sender, sendercap) == 1)
            return 1;
        poll(&p, 1, 1);
    }
}

static void push_marker(void)
{
    zmq_send(push, TAG, strlen(TAG), ZMQ_SNDMORE);
    zmq_send(push, MARKER, 1, ZMQ_SNDMORE);
    zmq_send(push, "", 0, 0);
}

static bool is_marker(const char *id, const char *sender)
{
    return strcmp(id, MARKER) == 0 && sender[0] == '\0';
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char peers[64], ep[64], id[ID_CAP], sender[PEER_CAP];
    int zero = 0;
    (void)argc;
    (void)argv;

    /* Port 1 never answers; the entry only makes 127.0.0.1 a peer address. */
    recv_relay = relay_open("127.0.0.1:1");
    snprintf(peers, sizeof(peers), "127.0.0.1:%d", pdgw_notif_relay_port(recv_relay));
    fwd_relay = relay_open(peers);
    ctx = zmq_ctx_new();
    push = zmq_socket(ctx, ZMQ_PUSH);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof(zero));
    snprintf(ep, sizeof(ep), "tcp://%s", peers);
    if (zmq_connect(push, ep) != 0)
        abort();
    push_marker();
    if (!recv_next(id, sizeof(id), sender, sizeof(sender)) || !is_marker(id, sender))
        abort();
    /* The forwarding relay sends only once its PUSH is connected: wait for that. */
    for (;;) {
        struct pollfd p = {.fd = pdgw_notif_relay_fd(recv_relay), .events = POLLIN};
        pdgw_notif_relay_forward(fwd_relay, MARKER, "");
        poll(&p, 1, 10);
        if (pdgw_notif_relay_recv(recv_relay, id, sizeof(id), sender, sizeof(sender)) == 1)
            break;
    }
    /* Markers sent before the first one arrived may still be on their way: a last notice of
     * its own, in order behind them on that connection, says when all have come. */
    pdgw_notif_relay_forward(fwd_relay, SYNC, "");
    do
        recv_next(id, sizeof(id), sender, sizeof(sender));
    while (strcmp(id, SYNC) != 0);
    return 0;
}

static void expect_notice(const char *id, const char *sender, const uint8_t *want_id,
                          size_t want_id_len, const uint8_t *want_sender, size_t want_sender_len)
{
    if (memcmp(id, want_id, want_id_len) != 0 || id[want_id_len] != '\0' ||
        memcmp(sender, want_sender, want_sender_len) != 0 || sender[want_sender_len] != '\0')
        abort();
}

static void run_raw(const uint8_t *d, size_t n, size_t cap, size_t sendercap)
{
    const uint8_t *frame[6];
    size_t len[6], k = 0;
    char *id = malloc(cap), *sender = malloc(sendercap);
    bool valid;

    while (k < 6 && n >= 2) {
        size_t l = (size_t)d[0] << 8 | d[1];
        d += 2;
        n -= 2;
        if (l > n)
            l = n;
        if (l > MAX_MSG)
            l = MAX_MSG;
        frame[k] = d;
        len[k++] = l;
        d += l;
        n -= l;
    }
    if (k == 0) {
        frame[k] = d;
        len[k++] = 0;
    }
    for (size_t i = 0; i < k; i++)
        zmq_send(push, frame[i], len[i], i + 1 < k ? ZMQ_SNDMORE : 0);
    push_marker();
    valid = k == 3 && len[0] == strlen(TAG) && memcmp(frame[0], TAG, len[0]) == 0 && len[1] > 0 &&
            len[1] < cap && len[2] < sendercap;
    recv_next(id, cap, sender, sendercap);
    if (valid) {
        expect_notice(id, sender, frame[1], len[1], frame[2], len[2]);
        recv_next(id, cap, sender, sendercap);
    }
    if (!is_marker(id, sender))
        abort(); /* a refused message was returned, or the order changed */
    free(id);
    free(sender);
}

/* <n> bytes of <d> up to the first NUL, as a C string. */
static char *cstr(const uint8_t *d, size_t n)
{
    const uint8_t *nul = memchr(d, 0, n);
    size_t len = nul ? (size_t)(nul - d) : n;
    char *s = malloc(len + 1);
    memcpy(s, d, len);
    s[len] = '\0';
    return s;
}

static void run_forward(const uint8_t *d, size_t n, size_t cap, size_t sendercap)
{
    const uint8_t *cut = memchr(d, 0xff, n);
    size_t id_len = cut ? (size_t)(cut - d) : n;
    char *fid, *fsender, *id = malloc(cap), *sender = malloc(sendercap);
    size_t fid_len, fsender_len;

    /* C strings, as the gateway hands them over; at most one message bound each. */
    fid = cstr(d, id_len < MAX_MSG ? id_len : MAX_MSG);
    fsender = cut ? cstr(cut + 1, n - id_len - 1 < MAX_MSG ? n - id_len - 1 : MAX_MSG) : cstr(d, 0);
    fid_len = strlen(fid);
    fsender_len = strlen(fsender);
    pdgw_notif_relay_forward(fwd_relay, fid, fsender);
    pdgw_notif_relay_forward(fwd_relay, MARKER, "");
    recv_next(id, cap, sender, sendercap);
    if (fid_len > 0 && fid_len < cap && fsender_len < sendercap) {
        expect_notice(id, sender, (const uint8_t *)fid, fid_len, (const uint8_t *)fsender,
                      fsender_len);
        recv_next(id, cap, sender, sendercap);
    }
    if (!is_marker(id, sender))
        abort();
    free(fid);
    free(fsender);
    free(id);
    free(sender);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cap = ID_CAP, sendercap = PEER_CAP;

    if (size < 2)
        return 0;
    if (data[1] != 0) { /* small buffers; the marker needs an id of 1 byte and an empty sender */
        cap = 2 + (data[1] & 0x0f) * 4;
        sendercap = 1 + (data[1] >> 4) * 4;
    }
    if (data[0] & 1)
        run_forward(data + 2, size - 2, cap, sendercap);
    else
        run_raw(data + 2, size - 2, cap, sendercap);
    return 0;
}
