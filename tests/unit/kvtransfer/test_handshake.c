/*
 * test_handshake.c - the init-port handshake carries the transport's address blob opaquely.
 *
 * TransportInit (libkvt-only; upstream LMCache's init port carries its transfer channel's own
 * NixlInitRequest/NixlInitResponse with opaque agent metadata bytes,
 * LMCache lmcache/v1/transfer_channel/nixl_channel.py) gets an "addr" bin field, left out when
 * empty so the existing encodings stay byte-identical (tests/integration/kvtransfer/
 * test_wire_golden.py). The TCP transport packs its own address bytes (kvt_tl_tcp_addr.c);
 * the engine names the peer from the envelope's node_id, never from the blob.
 */
#include <zmq.h>

#include "test_engine_common.h"
#include "kvt/kvt_msg.h"
#include "kvt_engine_int.h" /* the receiver's peer table */
#include "kvt_tl_tcp_int.h"

#define TOKEN "6f1c2a3b-4d5e-4f60-8172-839405a6b7c8"

static void test_addr_field_roundtrip(void **state)
{
    const uint8_t raw[6] = {0x00, 0xff, 0x10, 0x00, 0x7f, 0x80}; /* NULs: bytes, not a string */
    kvt_msg_t m, b, c;
    void *data = NULL;
    size_t len = 0;
    char *json;
    (void)state;

    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    kvt_msg_set_str(&m.u.tinit.node_id, "n1");
    kvt_msg_set_str(&m.u.tinit.transport, "tcp");
    assert_int_equal(kvt_bytes_set(&m.u.tinit.addr, raw, sizeof(raw)), KVT_OK);
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    assert_int_equal(kvt_msg_decode(data, len, &b, NULL), KVT_OK);
    assert_int_equal(b.u.tinit.addr.n, sizeof(raw));
    assert_memory_equal(b.u.tinit.addr.p, raw, sizeof(raw));
    json = kvt_msg_to_json(&b);
    assert_non_null(strstr(json, "\"00ff10007f80\"")); /* hex */
    assert_int_equal(kvt_msg_from_json(json, strlen(json), &c, NULL),
                     KVT_OK); /* hex back to bytes */
    assert_int_equal(c.u.tinit.addr.n, sizeof(raw));
    assert_memory_equal(c.u.tinit.addr.p, raw, sizeof(raw));
    kvt_free(json);
    kvt_msg_clear(&c);
    kvt_msg_clear(&b);
    kvt_free(data);
    /* empty: not on the wire at all (what a message without the field encodes to) */
    kvt_bytes_set(&m.u.tinit.addr, NULL, 0);
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    assert_null(memmem(data, len, "addr", 4));
    kvt_free(data);
    kvt_msg_clear(&m);
}

/* A str where bytes belong is refused, naming the field. */
static void test_addr_field_must_be_bin(void **state)
{
    const char *json = "{\"type\": \"TransportInit\", \"node_id\": \"n\", \"transport\": \"tcp\", "
                       "\"lanes\": []}";
    kvt_msg_t m;
    void *data = NULL;
    size_t len = 0;
    uint8_t *p;
    kvt_msg_err_t err = {0};
    (void)state;

    /* encode, then turn the (one-byte-longer) message into one with addr as a str */
    assert_int_equal(kvt_msg_from_json(json, strlen(json), &m, NULL), KVT_OK);
    assert_int_equal(kvt_bytes_set(&m.u.tinit.addr, "xy", 2), KVT_OK);
    assert_int_equal(kvt_msg_encode(&m, &data, &len), KVT_OK);
    kvt_msg_clear(&m);
    p = memmem(data, len, "\xc4\x02xy", 4); /* bin8 of 2 bytes */
    assert_non_null(p);
    p[0] = 0xa2; /* fixstr of 2 */
    memmove(p + 1, p + 2, len - (size_t)(p + 2 - (uint8_t *)data));
    len--;
    assert_int_equal(kvt_msg_decode(data, len, &m, &err), KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "addr");
    kvt_free(data);
}

static void test_tcp_addr_blob(void **state)
{
    uint8_t b[KVT_TL_BLOB_MAX], bad[KVT_TL_BLOB_MAX];
    size_t bl = sizeof(b), small = 10;
    char host[256], token[KVT_TCP_TOKEN_LEN + 1];
    uint16_t port = 0;
    (void)state;

    assert_int_equal(kvt_tcp_addr_pack("10.1.2.3", 7400, TOKEN, b, &bl), KVT_OK);
    assert_int_equal(kvt_tcp_addr_unpack(b, bl, host, &port, token), KVT_OK);
    assert_string_equal(host, "10.1.2.3");
    assert_int_equal(port, 7400);
    assert_string_equal(token, TOKEN);
    /* nothing but the address: no node id inside */
    assert_int_equal(bl, 44 + strlen("10.1.2.3"));
    assert_int_equal(kvt_tcp_addr_pack("10.1.2.3", 7400, TOKEN, b, &small), KVT_ERR_LIMIT);
    assert_int_equal(kvt_tcp_addr_pack("", 7400, TOKEN, b, &small), KVT_ERR_INVALID);
    assert_int_equal(kvt_tcp_addr_pack("h", 0, TOKEN, b, &small), KVT_ERR_INVALID);
    /* network input: every malformation refused */
    assert_int_equal(kvt_tcp_addr_unpack(b, bl - 1, host, &port, token), KVT_ERR_PROTO);
    assert_int_equal(kvt_tcp_addr_unpack(b, 3, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[bl] = 'x'; /* trailing byte */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl + 1, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[0] ^= 1; /* magic */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[4] = 2; /* version */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[6] = bad[7] = 0; /* port 0 */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[8] = 'g'; /* token not hex */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl, host, &port, token), KVT_ERR_PROTO);
    memcpy(bad, b, bl);
    bad[44] = '\0'; /* host with a NUL */
    assert_int_equal(kvt_tcp_addr_unpack(bad, bl, host, &port, token), KVT_ERR_PROTO);
}

/* [b"", envelope] to a receiver's init port; returns the reply payload length. */
static size_t init_exchange(void *dl, const kvt_msg_t *m, uint8_t *out, size_t cap)
{
    void *data = NULL;
    size_t len = 0;
    int n;
    zmq_msg_t f;

    assert_int_equal(kvt_msg_encode(m, &data, &len), KVT_OK);
    assert_true(zmq_send(dl, "", 0, ZMQ_SNDMORE) >= 0);
    assert_true(zmq_send(dl, data, len, 0) >= 0);
    kvt_free(data);
    zmq_msg_init(&f);
    do {
        assert_true(zmq_msg_recv(&f, dl, 0) >= 0);
    } while (zmq_msg_size(&f) == 0 && zmq_msg_more(&f));
    n = (int)zmq_msg_size(&f);
    assert_true((size_t)n <= cap);
    memcpy(out, zmq_msg_data(&f), (size_t)n);
    zmq_msg_close(&f);
    return (size_t)n;
}

/* A receiver answers an envelope with its own: its node id, its transport, its KV pool's
 * regions and a TCP address blob the transport can read; an envelope without an address
 * blob (an older libkvt) or for another transport gets the empty refusal and is counted. */
static void test_receiver_answers_envelope(void **state)
{
    kvt_config_t rc;
    kvt_engine_t *r;
    kvt_engine_params_t ep = {.page_size = T_PAGE, .bind_host = "127.0.0.1"};
    kvt_engine_ports_t ports;
    void *ctx = zmq_ctx_new(), *dl = zmq_socket(ctx, ZMQ_DEALER);
    uint8_t reply[8192], blob[128];
    size_t n, bl = sizeof(blob);
    char epst[64], host[256], token[KVT_TCP_TOKEN_LEN + 1];
    uint16_t port;
    int zero = 0, tmo = 5000;
    kvt_msg_t m, a;
    kvt_metrics_t mt;
    (void)state;

    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    ep.cfg = &rc;
    assert_int_equal(kvt_engine_create(&ep, &r), KVT_OK);
    kvt_engine_ports(r, &ports);
    zmq_setsockopt(dl, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(dl, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    snprintf(epst, sizeof(epst), "tcp://127.0.0.1:%u", (unsigned)ports.init_port);
    assert_int_equal(zmq_connect(dl, epst), 0);

    assert_int_equal(kvt_tcp_addr_pack("127.0.0.1", 9, TOKEN, blob, &bl), KVT_OK);
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    m.u.tinit.node_id = "peer-x";
    m.u.tinit.transport = "tcp";
    m.u.tinit.version = 1;
    m.u.tinit.addr.p = blob;
    m.u.tinit.addr.n = (uint32_t)bl;
    n = init_exchange(dl, &m, reply, sizeof(reply));
    assert_int_equal(kvt_msg_decode(reply, n, &a, NULL), KVT_OK);
    assert_int_equal(a.type, KVT_MSG_TRANSPORT_INIT);
    assert_string_equal(a.u.tinit.node_id, kvt_engine_id(r));
    assert_string_equal(a.u.tinit.transport, "tcp");
    assert_true(a.u.tinit.nregions >= 1);
    assert_int_equal(a.u.tinit.nlanes, 0); /* lanes are the transport's business now */
    assert_int_equal(kvt_tcp_addr_unpack(a.u.tinit.addr.p, a.u.tinit.addr.n, host, &port, token),
                     KVT_OK);
    assert_int_equal(port, ports.data_port);
    kvt_msg_clear(&a);

    /* no address blob: refused */
    m.u.tinit.addr.n = 0;
    assert_int_equal(init_exchange(dl, &m, reply, sizeof(reply)), 0);
    /* another transport's envelope: refused */
    m.u.tinit.addr.n = (uint32_t)bl;
    m.u.tinit.transport = "verbs";
    assert_int_equal(init_exchange(dl, &m, reply, sizeof(reply)), 0);
    /* a node id with a newline (ids are joined with newlines in grants): refused */
    m.u.tinit.transport = "tcp";
    m.u.tinit.node_id = "a\nb";
    assert_int_equal(init_exchange(dl, &m, reply, sizeof(reply)), 0);
    kvt_engine_metrics(r, &mt);
    assert_int_equal(mt.bad_messages_total, 3);

    zmq_close(dl);
    zmq_ctx_term(ctx);
    kvt_engine_destroy(r);
}

/* A handshake answer without an address blob (or for another transport) fails what waits
 * for that receiver with a protocol error, counted as a bad message. */
static void test_sender_refuses_answer_without_blob(void **state)
{
    kvt_config_t sc;
    kvt_engine_t *s;
    kvt_engine_params_t ep = {.page_size = T_PAGE, .bind_host = "127.0.0.1"};
    void *ctx = zmq_ctx_new(), *ra = zmq_socket(ctx, ZMQ_ROUTER), *ri = zmq_socket(ctx, ZMQ_ROUTER);
    char epst[64], ident[512], **keys = t_keys("nob", 2);
    size_t l, il;
    int zero = 0, tmo = 5000;
    zmq_msg_t f;
    kvt_msg_t m, r;
    kvt_task_result_t res;
    kvt_task_id_t id;
    kvt_status_t st;
    kvt_metrics_t mt;
    void *data = NULL;
    size_t len = 0;
    (void)state;

    zmq_setsockopt(ra, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(ri, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(ri, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    assert_int_equal(zmq_bind(ra, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_bind(ri, "tcp://127.0.0.1:*"), 0);
    t_cfg(&sc, KVT_ROLE_SENDER, MODE_PUSH, 8 * T_PAGE, "tcp");
    l = sizeof(epst);
    zmq_getsockopt(ra, ZMQ_LAST_ENDPOINT, epst, &l);
    sc.pd_peer_alloc_port.v[0] = (uint16_t)atoi(strrchr(epst, ':') + 1);
    l = sizeof(epst);
    zmq_getsockopt(ri, ZMQ_LAST_ENDPOINT, epst, &l);
    sc.pd_peer_init_port.v[0] = (uint16_t)atoi(strrchr(epst, ':') + 1);
    ep.cfg = &sc;
    assert_int_equal(kvt_engine_create(&ep, &s), KVT_OK);
    id = t_store(s, "nob-1", keys, 0, 2, 0, 1, 2, &st);
    assert_int_equal(st, KVT_OK);
    /* [ident, "", envelope]: the sender's own envelope carries its blob and its id */
    zmq_msg_init(&f);
    assert_true(zmq_msg_recv(&f, ri, 0) >= 0);
    il = zmq_msg_size(&f);
    memcpy(ident, zmq_msg_data(&f), il);
    do {
        assert_true(zmq_msg_recv(&f, ri, 0) >= 0);
    } while (zmq_msg_size(&f) == 0 && zmq_msg_more(&f));
    assert_int_equal(kvt_msg_decode(zmq_msg_data(&f), zmq_msg_size(&f), &m, NULL), KVT_OK);
    zmq_msg_close(&f);
    assert_string_equal(m.u.tinit.node_id, kvt_engine_id(s));
    assert_true(m.u.tinit.addr.n > 0);
    kvt_msg_clear(&m);
    kvt_msg_init(&r, KVT_MSG_TRANSPORT_INIT);
    r.u.tinit.node_id = "old-receiver";
    r.u.tinit.transport = "tcp";
    r.u.tinit.version = 1;
    assert_int_equal(kvt_msg_encode(&r, &data, &len), KVT_OK);
    zmq_send(ri, ident, il, ZMQ_SNDMORE);
    zmq_send(ri, "", 0, ZMQ_SNDMORE);
    zmq_send(ri, data, len, 0);
    kvt_free(data);
    assert_int_equal(t_wait(s, id, 5000, &res), KVT_OK);
    assert_int_equal(res.status, KVT_ERR_PROTO);
    kvt_task_result_clear(&res);
    kvt_engine_metrics(s, &mt);
    assert_int_equal(mt.bad_messages_total, 1);
    kvt_engine_destroy(s);
    zmq_close(ra);
    zmq_close(ri);
    zmq_ctx_term(ctx);
    t_keys_free(keys, 2);
}

/* TransportInit{<id>} from <src> to <port>; whether the receiver answered with its own. */
static int handshake_from(const char *src, uint16_t port, const char *id)
{
    void *ctx = zmq_ctx_new(), *dl = zmq_socket(ctx, ZMQ_DEALER);
    uint8_t reply[8192], blob[128];
    size_t n, bl = sizeof(blob);
    char ep[96];
    int zero = 0, tmo = 5000;
    kvt_msg_t m;

    zmq_setsockopt(dl, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(dl, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    snprintf(ep, sizeof(ep), "tcp://%s:0;127.0.0.1:%u", src, (unsigned)port);
    assert_int_equal(zmq_connect(dl, ep), 0);
    assert_int_equal(kvt_tcp_addr_pack("127.0.0.1", 9, TOKEN, blob, &bl), KVT_OK);
    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    m.u.tinit.node_id = (char *)id;
    m.u.tinit.transport = "tcp";
    m.u.tinit.version = 1;
    m.u.tinit.addr.p = blob;
    m.u.tinit.addr.n = (uint32_t)bl;
    n = init_exchange(dl, &m, reply, sizeof(reply));
    zmq_close(dl);
    zmq_ctx_term(ctx);
    return n > 0;
}

/* Whether <id> ran the handshake here: in the engine's table, and holding a lane token in the
 * transport's (a removed TCP peer keeps its entry, without tokens). */
static int known_peer(kvt_engine_t *r, const char *id)
{
    tcp_peer_t *p;
    int hs, tl;

    pthread_mutex_lock(&r->rx_lock);
    hs = kvt_map_get(&r->hs_peers, id) != NULL;
    pthread_mutex_unlock(&r->rx_lock);
    pthread_mutex_lock(&r->tl->lock);
    p = kvt_tl_tcp_peer_find_locked(r->tl, id);
    tl = p != NULL && p->token[0] != '\0';
    pthread_mutex_unlock(&r->tl->lock);
    assert_int_equal(hs, tl);
    return hs;
}

/* One source address keeps at most transfer_max_peers_per_addr node ids handshaken: past it
 * its least recent one is forgotten (transport and grant table), so handshakes under ever
 * new ids from 127.0.0.2 cannot fill the peer tables; a peer from another address stays, and
 * a known id handshaking again is the most recent, not a new one. */
static void test_peers_per_source_capped(void **state)
{
    kvt_config_t rc;
    kvt_engine_t *r;
    kvt_engine_params_t ep = {.page_size = T_PAGE, .bind_host = "127.0.0.1"};
    kvt_engine_ports_t ports;
    char id[32];
    (void)state;

    t_cfg(&rc, KVT_ROLE_RECEIVER, MODE_PUSH, 8 * T_PAGE, "tcp");
    rc.transfer_max_peers_per_addr = 3;
    ep.cfg = &rc;
    assert_int_equal(kvt_engine_create(&ep, &r), KVT_OK);
    kvt_engine_ports(r, &ports);
    assert_true(handshake_from("127.0.0.1", ports.init_port, "prefill-0"));
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        assert_true(handshake_from("127.0.0.2", ports.init_port, id));
    }
    assert_true(known_peer(r, "s0") && known_peer(r, "s1") && known_peer(r, "s2"));
    assert_true(handshake_from("127.0.0.2", ports.init_port, "s3"));
    assert_false(known_peer(r, "s0")); /* the oldest of that address */
    assert_true(known_peer(r, "s1") && known_peer(r, "s3"));
    assert_true(handshake_from("127.0.0.2", ports.init_port, "s1")); /* again: most recent */
    assert_true(handshake_from("127.0.0.2", ports.init_port, "s4"));
    assert_false(known_peer(r, "s2"));
    assert_true(known_peer(r, "s1") && known_peer(r, "s3") && known_peer(r, "s4"));
    for (int i = 5; i < 70; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        assert_true(handshake_from("127.0.0.2", ports.init_port, id));
    }
    assert_true(known_peer(r, "prefill-0")); /* another address: untouched */
    assert_true(known_peer(r, "s69"));
    pthread_mutex_lock(&r->rx_lock);
    assert_int_equal(r->hs_peers.count, 4);
    pthread_mutex_unlock(&r->rx_lock);
    kvt_engine_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addr_field_roundtrip),
        cmocka_unit_test(test_addr_field_must_be_bin),
        cmocka_unit_test(test_tcp_addr_blob),
        cmocka_unit_test(test_receiver_answers_envelope),
        cmocka_unit_test(test_sender_refuses_answer_without_blob),
        cmocka_unit_test(test_peers_per_source_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
