/*
 * test_msg.c -- kvt_msg codec: every message round-trips; the decoder takes
 * reordered fields, unknown keys (with nested values) and missing defaulted
 * fields; it rejects wrong types, missing required fields, unknown types,
 * truncated / trailing / oversized / hostile input; allocation failures
 * unwind cleanly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "kvt/kvt_msg.h"

/* ---- building blocks --------------------------------------------------------- */

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void decode_ok(const msgpack_sbuffer *sb, kvt_msg_t *m)
{
    kvt_msg_err_t err;
    kvt_status_t st = kvt_msg_decode(sb->data, sb->size, m, &err);
    if (st != KVT_OK)
        fail_msg("decode failed: %s field=%s reason=%s", kvt_status_name(st),
                 err.field ? err.field : "-", err.reason ? err.reason : "-");
}

static kvt_status_t decode_err(const void *data, size_t len, kvt_msg_err_t *err)
{
    kvt_msg_t m;
    kvt_status_t st = kvt_msg_decode(data, len, &m, err);
    if (st == KVT_OK)
        kvt_msg_clear(&m);
    else
        assert_int_equal(m.type, KVT_MSG_NONE);
    return st;
}

/* Encode, decode, re-encode: bytes must be identical, and fields equal. */
static void roundtrip(const kvt_msg_t *m, kvt_msg_t *back)
{
    void *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    kvt_msg_err_t err;

    assert_int_equal(kvt_msg_encode(m, &a, &alen), KVT_OK);
    assert_int_equal(kvt_msg_decode(a, alen, back, &err), KVT_OK);
    assert_int_equal(back->type, m->type);
    assert_int_equal(kvt_msg_encode(back, &b, &blen), KVT_OK);
    assert_int_equal(alen, blen);
    assert_memory_equal(a, b, alen);
    kvt_free(a);
    kvt_free(b);
}

static kvt_msg_t make_alloc_request(void)
{
    kvt_msg_t m;
    const char *keys[] = {"vllm@model@1@0@aa01", "vllm@model@1@0@bb02", "vllm@model@1@0@cc03"};
    int64_t shape[] = {2, 32, 256, 1024};

    kvt_msg_init(&m, KVT_MSG_ALLOC_REQUEST);
    assert_int_equal(kvt_str_list_set(&m.u.alloc_req.keys, keys, 3), KVT_OK);
    m.u.alloc_req.fmt = 1;
    assert_int_equal(kvt_int_list_set(&m.u.alloc_req.shape, shape, 4), KVT_OK);
    assert_int_equal(kvt_msg_set_str(&m.u.alloc_req.dtype, "bfloat16"), KVT_OK);
    m.u.alloc_req.last_chunk_toks = 77;
    assert_int_equal(kvt_msg_set_str(&m.u.alloc_req.req_id, "cmpl-42"), KVT_OK);
    m.u.alloc_req.is_last_batch = 1;
    m.u.alloc_req.total_chunks = 3;
    return m;
}

/* ---- round trips ------------------------------------------------------------- */

static void test_roundtrip_alloc_request(void **state)
{
    kvt_msg_t m = make_alloc_request(), b;

    roundtrip(&m, &b);
    assert_int_equal(b.u.alloc_req.keys.n, 3);
    assert_string_equal(b.u.alloc_req.keys.v[2], "vllm@model@1@0@cc03");
    assert_int_equal(b.u.alloc_req.fmt, 1);
    assert_int_equal(b.u.alloc_req.shape.n, 4);
    assert_int_equal(b.u.alloc_req.shape.v[3], 1024);
    assert_string_equal(b.u.alloc_req.dtype, "bfloat16");
    assert_int_equal(b.u.alloc_req.last_chunk_toks, 77);
    assert_string_equal(b.u.alloc_req.req_id, "cmpl-42");
    assert_int_equal(b.u.alloc_req.is_last_batch, 1);
    assert_int_equal(b.u.alloc_req.total_chunks, 3);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);
    kvt_msg_clear(&m); /* idempotent */
}

static void test_roundtrip_responses(void **state)
{
    kvt_msg_t m, b;
    int64_t sent[] = {0, 2};
    int64_t remote[] = {5, -1, 9};
    const char *uuids[] = {"3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f",
                           "3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f",
                           "00000000-0000-4000-8000-000000000001"};

    kvt_msg_init(&m, KVT_MSG_ALLOC_RESPONSE);
    kvt_int_list_set(&m.u.alloc_resp.already_sent_indexes, sent, 2);
    kvt_int_list_set(&m.u.alloc_resp.remote_indexes, remote, 3);
    roundtrip(&m, &b);
    assert_int_equal(b.u.alloc_resp.remote_indexes.v[1], -1);
    assert_int_equal(b.u.alloc_resp.remote_buffer_uuids.n, 0);
    kvt_msg_clear(&b);

    m.type = KVT_MSG_ASCEND_ALLOC_RESPONSE;
    kvt_str_list_set(&m.u.alloc_resp.remote_buffer_uuids, uuids, 3);
    m.u.alloc_resp.alloc_failed = 1;
    roundtrip(&m, &b);
    assert_int_equal(b.u.alloc_resp.remote_buffer_uuids.n, 3);
    assert_string_equal(b.u.alloc_resp.remote_buffer_uuids.v[2], uuids[2]);
    assert_int_equal(b.u.alloc_resp.alloc_failed, 1);
    assert_int_equal(b.u.alloc_resp.already_sent_indexes.v[1], 2);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);
}

static void test_roundtrip_pull_and_small(void **state)
{
    kvt_msg_t m, b;
    const char *keys[] = {"k0", "k1"};
    const char *uuids[] = {"u0", "u1"};
    int64_t idx[] = {3, 4};
    int64_t shape[] = {256, 2, 512};

    kvt_msg_init(&m, KVT_MSG_PULL_READY_NOTIF);
    kvt_msg_set_str(&m.u.pull_ready.pull_id, "pull-1");
    kvt_str_list_set(&m.u.pull_ready.keys, keys, 2);
    kvt_str_list_set(&m.u.pull_ready.sender_buffer_uuids, uuids, 2);
    kvt_int_list_set(&m.u.pull_ready.sender_mem_indexes, idx, 2);
    kvt_msg_set_str(&m.u.pull_ready.sender_id, "prefill-0");
    kvt_msg_set_str(&m.u.pull_ready.sender_done_url, "tcp://10.0.0.1:7500");
    m.u.pull_ready.fmt = 2;
    kvt_int_list_set(&m.u.pull_ready.shape, shape, 3);
    kvt_msg_set_str(&m.u.pull_ready.dtype, "half");
    m.u.pull_ready.last_chunk_toks = 256;
    roundtrip(&m, &b);
    assert_string_equal(b.u.pull_ready.sender_done_url, "tcp://10.0.0.1:7500");
    assert_int_equal(b.u.pull_ready.sender_mem_indexes.v[1], 4);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_PULL_READY_DONE_ACK);
    kvt_int_list_push(&m.u.pull_ack.already_sent_indexes, 1);
    m.u.pull_ack.alloc_failed = 0;
    roundtrip(&m, &b);
    assert_int_equal(b.u.pull_ack.already_sent_indexes.n, 1);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_PULL_DONE_SIGNAL);
    kvt_msg_set_str(&m.u.pull_done.pull_id, "pull-1");
    roundtrip(&m, &b);
    assert_string_equal(b.u.pull_done.pull_id, "pull-1");
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    kvt_msg_set_str(&m.u.proxy_notif.req_id, "cmpl-42");
    roundtrip(&m, &b);
    assert_string_equal(b.u.proxy_notif.req_id, "cmpl-42");
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
    kvt_msg_set_str(&m.u.cancel.req_id, "cmpl-42");
    kvt_str_list_set(&m.u.cancel.keys, keys, 2);
    roundtrip(&m, &b);
    assert_string_equal(b.u.cancel.keys.v[1], "k1");
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_RESERVE_REQUEST);
    kvt_msg_set_str(&m.u.reserve_req.req_id, "r");
    m.u.reserve_req.total_chunks = 128;
    m.u.reserve_req.ttl_ms = 30000;
    roundtrip(&m, &b);
    assert_int_equal(b.u.reserve_req.total_chunks, 128);
    assert_int_equal(b.u.reserve_req.ttl_ms, 30000);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);

    kvt_msg_init(&m, KVT_MSG_RESERVE_RESPONSE);
    kvt_msg_set_str(&m.u.reserve_resp.req_id, "r");
    m.u.reserve_resp.granted = 1;
    m.u.reserve_resp.free_chunks = 900;
    roundtrip(&m, &b);
    assert_int_equal(b.u.reserve_resp.granted, 1);
    assert_int_equal(b.u.reserve_resp.free_chunks, 900);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);
}

static void test_roundtrip_transport_init(void **state)
{
    kvt_msg_t m, b, c;
    kvt_msg_transport_init_t *t;

    kvt_msg_init(&m, KVT_MSG_TRANSPORT_INIT);
    t = &m.u.tinit;
    kvt_msg_set_str(&t->node_id, "decode-1");
    kvt_msg_set_str(&t->transport, "verbs");
    t->nlanes = 2;
    t->lanes = kvt_calloc(2, sizeof(*t->lanes));
    kvt_msg_set_str(&t->lanes[0].host, "10.0.0.2");
    t->lanes[0].port = 7300;
    t->lanes[1].qp_num = 0x1234;
    t->lanes[1].lid = 7;
    kvt_msg_set_str(&t->lanes[1].gid, "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
    t->lanes[1].psn = 0xabcdef;
    t->lanes[1].mtu = 4096;
    t->nregions = 1;
    t->regions = kvt_calloc(1, sizeof(*t->regions));
    kvt_msg_set_str(&t->regions[0].uuid, "3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f");
    t->regions[0].addr = 0xffff800000001000ull; /* above INT64_MAX */
    t->regions[0].length = 1ull << 34;
    t->regions[0].rkey = 0x42;
    t->version = 1;
    t->epoch = 987654321;
    roundtrip(&m, &b);
    t = &b.u.tinit;
    assert_int_equal(t->nlanes, 2);
    assert_string_equal(t->lanes[0].host, "10.0.0.2");
    assert_string_equal(t->lanes[1].host, ""); /* NULL encodes as "" */
    assert_int_equal(t->lanes[1].qp_num, 0x1234);
    assert_string_equal(t->lanes[1].gid, "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
    assert_int_equal(t->nregions, 1);
    assert_true(t->regions[0].addr == 0xffff800000001000ull);
    assert_true(t->regions[0].length == 1ull << 34);
    assert_int_equal(t->epoch, 987654321);

    /* deep copy */
    assert_int_equal(kvt_msg_copy(&c, &b), KVT_OK);
    assert_string_equal(c.u.tinit.lanes[1].gid, t->lanes[1].gid);
    assert_ptr_not_equal(c.u.tinit.lanes, t->lanes);
    kvt_msg_clear(&c);
    kvt_msg_clear(&b);
    kvt_msg_clear(&m);
}

/* The exact byte layout: map, "type" first, fields in table order. */
static void test_encoding_layout(void **state)
{
    kvt_msg_t m;
    void *d;
    size_t len;
    static const uint8_t expect[] = {0x82, 0xa4, 't', 'y', 'p', 'e', 0xae, 'P',  'u', 'l', 'l',
                                     'D',  'o',  'n', 'e', 'S', 'i', 'g',  'n',  'a', 'l', 0xa7,
                                     'p',  'u',  'l', 'l', '_', 'i', 'd',  0xa1, 'x'};

    kvt_msg_init(&m, KVT_MSG_PULL_DONE_SIGNAL);
    kvt_msg_set_str(&m.u.pull_done.pull_id, "x");
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    assert_int_equal(len, sizeof(expect));
    assert_memory_equal(d, expect, sizeof(expect));
    kvt_free(d);
    kvt_msg_clear(&m);

    /* names */
    assert_string_equal(kvt_msg_type_name(KVT_MSG_ASCEND_ALLOC_RESPONSE), "AscendAllocResponse");
    assert_int_equal(kvt_msg_type_from_name("ReserveRequest", 14), KVT_MSG_RESERVE_REQUEST);
    assert_int_equal(kvt_msg_type_from_name("reserverequest", 14), KVT_MSG_NONE);
    assert_null(kvt_msg_type_name(KVT_MSG_NONE));
    assert_null(kvt_msg_type_name(KVT_MSG_TYPE_COUNT));
}

/* Per-flavour layouts (LMCache pd_backend_async.py: AllocResponse with
 * remote_indexes first; pd_backend.py: already_sent_indexes first) and the
 * kvt_ext extension, left out at 0 so upstream sees its own bytes. */
static void test_flavour_layouts(void **state)
{
    kvt_msg_t m, back;
    void *d;
    size_t len;
    /* {"type":"AllocResponse","remote_indexes":[],"already_sent_indexes":[]} */
    static const uint8_t cancel_reply[] = {
        0x83, 0xa4, 't', 'y', 'p', 'e',  0xad, 'A', 'l', 'l', 'o', 'c', 'R', 'e', 's',
        'p',  'o',  'n', 's', 'e', 0xae, 'r',  'e', 'm', 'o', 't', 'e', '_', 'i', 'n',
        'd',  'e',  'x', 'e', 's', 0x90, 0xb4, 'a', 'l', 'r', 'e', 'a', 'd', 'y', '_',
        's',  'e',  'n', 't', '_', 'i',  'n',  'd', 'e', 'x', 'e', 's', 0x90};
    (void)state;

    kvt_msg_init(&m, KVT_MSG_ALLOC_RESPONSE_ASYNC);
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    assert_int_equal(len, sizeof(cancel_reply));
    assert_memory_equal(d, cancel_reply, len);
    /* it decodes as the one AllocResponse type, both fields seen */
    assert_int_equal(kvt_msg_decode(d, len, &back, NULL), KVT_OK);
    assert_int_equal(back.type, KVT_MSG_ALLOC_RESPONSE);
    assert_true(kvt_msg_has_field(&back, "remote_indexes"));
    assert_true(kvt_msg_has_field(&back, "already_sent_indexes"));
    kvt_msg_clear(&back);
    kvt_free(d);

    /* kvt_ext: absent at 0, present otherwise, seen by has_field */
    m = make_alloc_request();
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    assert_null(memmem(d, len, "kvt_ext", 7));
    assert_int_equal(kvt_msg_decode(d, len, &back, NULL), KVT_OK);
    assert_false(kvt_msg_has_field(&back, "kvt_ext"));
    assert_true(kvt_msg_has_field(&back, "req_id")); /* libkvt writes every field */
    kvt_msg_clear(&back);
    kvt_free(d);
    m.u.alloc_req.kvt_ext = KVT_MSG_EXT_VERSION;
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    assert_non_null(memmem(d, len, "kvt_ext", 7));
    assert_int_equal(kvt_msg_decode(d, len, &back, NULL), KVT_OK);
    assert_int_equal(back.u.alloc_req.kvt_ext, KVT_MSG_EXT_VERSION);
    assert_true(kvt_msg_has_field(&back, "kvt_ext"));
    kvt_msg_clear(&back);
    kvt_free(d);
    kvt_msg_clear(&m);
}

/* ---- lenient decoding -------------------------------------------------------- */

static void test_reordered_unknown_defaults(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    kvt_msg_t m;
    kvt_msg_type_t t;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 9);
    pk_str(&pk, "dtype");
    pk_str(&pk, "half");
    /* unknown key with a deeply nested value of every type */
    pk_str(&pk, "future_field");
    msgpack_pack_map(&pk, 2);
    pk_str(&pk, "a");
    msgpack_pack_array(&pk, 5);
    msgpack_pack_nil(&pk);
    msgpack_pack_double(&pk, 1.5);
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "\x00\x01\x02", 3);
    msgpack_pack_ext(&pk, 2, 7);
    msgpack_pack_ext_body(&pk, "zz", 2);
    msgpack_pack_float(&pk, 2.5f);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 0);
    pk_str(&pk, "last_chunk_toks");
    msgpack_pack_int(&pk, 12);
    pk_str(&pk, "keys");
    msgpack_pack_array(&pk, 1);
    pk_str(&pk, "k");
    pk_str(&pk, "shape");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int(&pk, 16);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_int(&pk, 128);
    /* non-string key: also an unknown key */
    msgpack_pack_int(&pk, 5);
    msgpack_pack_true(&pk);
    pk_str(&pk, "fmt");
    msgpack_pack_int(&pk, 2);
    pk_str(&pk, "type"); /* tag not first */
    pk_str(&pk, "AllocRequest");
    pk_str(&pk, "another_unknown");
    msgpack_pack_int(&pk, -5);

    assert_int_equal(kvt_msg_peek_type(sb.data, sb.size, &t), KVT_OK);
    assert_int_equal(t, KVT_MSG_ALLOC_REQUEST);
    decode_ok(&sb, &m);
    assert_int_equal(m.type, KVT_MSG_ALLOC_REQUEST);
    assert_string_equal(m.u.alloc_req.dtype, "half");
    assert_int_equal(m.u.alloc_req.fmt, 2);
    assert_int_equal(m.u.alloc_req.last_chunk_toks, 12);
    assert_int_equal(m.u.alloc_req.shape.v[2], 128);
    /* defaults of the missing optional fields */
    assert_non_null(m.u.alloc_req.req_id);
    assert_string_equal(m.u.alloc_req.req_id, "");
    assert_int_equal(m.u.alloc_req.is_last_batch, 0);
    assert_int_equal(m.u.alloc_req.total_chunks, 0);
    kvt_msg_clear(&m);
    msgpack_sbuffer_destroy(&sb);
}

static void test_transport_init_defaults(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    kvt_msg_t m;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "type");
    pk_str(&pk, "TransportInit");
    pk_str(&pk, "node_id");
    pk_str(&pk, "n1");
    pk_str(&pk, "transport");
    pk_str(&pk, "tcp");
    pk_str(&pk, "lanes");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2); /* nested struct without its tag, fields partly missing */
    pk_str(&pk, "port");
    msgpack_pack_int(&pk, 7301);
    pk_str(&pk, "zzz");
    msgpack_pack_nil(&pk);
    decode_ok(&sb, &m);
    assert_int_equal(m.u.tinit.nlanes, 1);
    assert_int_equal(m.u.tinit.lanes[0].port, 7301);
    assert_string_equal(m.u.tinit.lanes[0].host, "");
    assert_int_equal(m.u.tinit.nregions, 0);
    assert_int_equal(m.u.tinit.version, 1);
    assert_int_equal(m.u.tinit.epoch, 0);
    kvt_msg_clear(&m);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- rejection --------------------------------------------------------------- */

static void pack_proxy_notif_with(msgpack_sbuffer *sb, int variant)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    switch (variant) {
    case 0: /* req_id of wrong type */
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "type");
        pk_str(&pk, "ProxyNotif");
        pk_str(&pk, "req_id");
        msgpack_pack_int(&pk, 7);
        break;
    case 1: /* missing required field */
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "type");
        pk_str(&pk, "ProxyNotif");
        break;
    case 2: /* unknown type */
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "type");
        pk_str(&pk, "ProxyNotification");
        pk_str(&pk, "req_id");
        pk_str(&pk, "x");
        break;
    case 3: /* no type */
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "req_id");
        pk_str(&pk, "x");
        break;
    case 4: /* type not a string */
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "type");
        msgpack_pack_int(&pk, 3);
        break;
    case 5: /* duplicate field */
        msgpack_pack_map(&pk, 3);
        pk_str(&pk, "type");
        pk_str(&pk, "ProxyNotif");
        pk_str(&pk, "req_id");
        pk_str(&pk, "a");
        pk_str(&pk, "req_id");
        pk_str(&pk, "b");
        break;
    case 6: /* top level is an array */
        msgpack_pack_array(&pk, 2);
        pk_str(&pk, "ProxyNotif");
        pk_str(&pk, "x");
        break;
    case 7: /* string with an embedded NUL */
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "type");
        pk_str(&pk, "ProxyNotif");
        pk_str(&pk, "req_id");
        msgpack_pack_str(&pk, 3);
        msgpack_pack_str_body(&pk, "a\0b", 3);
        break;
    }
}

static void test_reject_fields_and_types(void **state)
{
    static const struct {
        kvt_status_t st;
        const char *field;
    } expect[] = {
        {KVT_ERR_MSG_FIELD, "req_id"}, {KVT_ERR_MSG_FIELD, "req_id"}, {KVT_ERR_MSG_TYPE, "type"},
        {KVT_ERR_MSG_TYPE, "type"},    {KVT_ERR_MSG_TYPE, "type"},    {KVT_ERR_MSG_FIELD, "req_id"},
        {KVT_ERR_PROTO, NULL},         {KVT_ERR_MSG_FIELD, "req_id"},
    };
    for (int v = 0; v < 8; v++) {
        msgpack_sbuffer sb;
        kvt_msg_err_t err;
        pack_proxy_notif_with(&sb, v);
        assert_int_equal(decode_err(sb.data, sb.size, &err), expect[v].st);
        if (expect[v].field != NULL)
            assert_string_equal(err.field, expect[v].field);
        assert_non_null(err.reason);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void test_reject_list_element_types(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    kvt_msg_err_t err;

    /* remote_indexes holding a string */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pk_str(&pk, "type");
    pk_str(&pk, "AllocResponse");
    pk_str(&pk, "already_sent_indexes");
    msgpack_pack_array(&pk, 0);
    pk_str(&pk, "remote_indexes");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    pk_str(&pk, "2");
    assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "remote_indexes");
    msgpack_sbuffer_destroy(&sb);

    /* integer above INT64_MAX for an int field */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "type");
    pk_str(&pk, "ReserveRequest");
    pk_str(&pk, "req_id");
    pk_str(&pk, "r");
    pk_str(&pk, "total_chunks");
    msgpack_pack_uint64(&pk, UINT64_MAX);
    pk_str(&pk, "ttl_ms");
    msgpack_pack_int(&pk, 1);
    assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "total_chunks");
    msgpack_sbuffer_destroy(&sb);

    /* bool given as int */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "type");
    pk_str(&pk, "ReserveResponse");
    pk_str(&pk, "req_id");
    pk_str(&pk, "r");
    pk_str(&pk, "granted");
    msgpack_pack_int(&pk, 1);
    pk_str(&pk, "free_chunks");
    msgpack_pack_int(&pk, 1);
    assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "granted");
    msgpack_sbuffer_destroy(&sb);

    /* shape longer than KVT_MSG_MAX_DIMS */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 6);
    pk_str(&pk, "type");
    pk_str(&pk, "AllocRequest");
    pk_str(&pk, "keys");
    msgpack_pack_array(&pk, 0);
    pk_str(&pk, "fmt");
    msgpack_pack_int(&pk, 1);
    pk_str(&pk, "shape");
    msgpack_pack_array(&pk, 9);
    for (int i = 0; i < 9; i++)
        msgpack_pack_int(&pk, 1);
    pk_str(&pk, "dtype");
    pk_str(&pk, "half");
    pk_str(&pk, "last_chunk_toks");
    msgpack_pack_int(&pk, 1);
    assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_LIMIT);
    assert_string_equal(err.field, "shape");
    msgpack_sbuffer_destroy(&sb);

    /* nested lane of the wrong kind, and a bad field inside a lane */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "type");
    pk_str(&pk, "TransportInit");
    pk_str(&pk, "node_id");
    pk_str(&pk, "n");
    pk_str(&pk, "transport");
    pk_str(&pk, "tcp");
    pk_str(&pk, "lanes");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 1);
    pk_str(&pk, "port");
    msgpack_pack_int(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pk_str(&pk, "port");
    pk_str(&pk, "1");
    assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "port");
    msgpack_sbuffer_destroy(&sb);
}

static void test_reject_garbage(void **state)
{
    kvt_msg_err_t err;
    kvt_msg_t m = make_alloc_request();
    void *d;
    size_t len;
    uint8_t *buf;

    /* every truncation of a valid message is refused */
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(decode_err(d, cut, &err), cut == 0 ? KVT_ERR_PROTO : KVT_ERR_PROTO);
    /* trailing bytes */
    buf = malloc(len + 1);
    memcpy(buf, d, len);
    buf[len] = 0xc0;
    assert_int_equal(decode_err(buf, len + 1, &err), KVT_ERR_PROTO);
    /* the never-used byte 0xc1 */
    buf[0] = 0xc1;
    assert_int_equal(decode_err(buf, 1, &err), KVT_ERR_PROTO);
    free(buf);
    kvt_free(d);
    kvt_msg_clear(&m);

    /* hostile headers: huge declared counts in few bytes */
    {
        static const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
        static const uint8_t map32[] = {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa0};
        static const uint8_t str32[] = {0x81, 0xa4, 't',  'y',  'p', 'e',
                                        0xdb, 0xff, 0xff, 0xff, 0xf0};
        static const uint8_t arr_small[] = {0xdc, 0x00, 0x10, 0x01};
        static const uint8_t ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
        assert_int_equal(decode_err(arr32, sizeof(arr32), &err), KVT_ERR_LIMIT);
        assert_int_equal(decode_err(map32, sizeof(map32), &err), KVT_ERR_LIMIT);
        assert_int_equal(decode_err(str32, sizeof(str32), &err), KVT_ERR_PROTO);
        assert_int_equal(decode_err(arr_small, sizeof(arr_small), &err), KVT_ERR_PROTO);
        assert_int_equal(decode_err(ext32, sizeof(ext32), &err), KVT_ERR_PROTO);
        assert_int_equal(decode_err(NULL, 0, &err), KVT_ERR_PROTO);
    }
    /* nesting deeper than KVT_MSG_MAX_DEPTH */
    {
        uint8_t deep[64];
        memset(deep, 0x91, sizeof(deep)); /* [[[[...]]]] */
        deep[sizeof(deep) - 1] = 0x00;
        assert_int_equal(decode_err(deep, sizeof(deep), &err), KVT_ERR_LIMIT);
    }
    /* oversized input */
    {
        size_t big = KVT_MSG_MAX_BYTES + 1;
        uint8_t *p = calloc(1, big);
        assert_int_equal(decode_err(p, big, &err), KVT_ERR_LIMIT);
        free(p);
    }
    /* a string longer than KVT_MSG_MAX_STR in a known field */
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        char *s = malloc(KVT_MSG_MAX_STR + 1);
        memset(s, 'a', KVT_MSG_MAX_STR + 1);
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "type");
        pk_str(&pk, "PullDoneSignal");
        pk_str(&pk, "pull_id");
        msgpack_pack_str(&pk, KVT_MSG_MAX_STR + 1);
        msgpack_pack_str_body(&pk, s, KVT_MSG_MAX_STR + 1);
        assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_LIMIT);
        assert_string_equal(err.field, "pull_id");
        msgpack_sbuffer_destroy(&sb);
        free(s);
    }
    /* pseudo-random bytes never crash and never leak */
    {
        uint64_t x = 0x9e3779b97f4a7c15ull;
        uint8_t rnd[96];
        for (int it = 0; it < 20000; it++) {
            size_t n = (size_t)(it % 96) + 1;
            for (size_t i = 0; i < n; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                rnd[i] = (uint8_t)x;
            }
            if (it % 3 == 0)
                rnd[0] = (uint8_t)(0x80 | (rnd[0] & 0x0f)); /* start with a fixmap */
            (void)decode_err(rnd, n, &err);
        }
    }
}

static void test_encode_limits(void **state)
{
    kvt_msg_t m;
    void *d = NULL;
    size_t len;
    char *s = malloc(KVT_MSG_MAX_STR + 2);

    memset(s, 'b', KVT_MSG_MAX_STR + 1);
    s[KVT_MSG_MAX_STR + 1] = '\0';
    kvt_msg_init(&m, KVT_MSG_PROXY_NOTIF);
    kvt_msg_set_str(&m.u.proxy_notif.req_id, s);
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_ERR_LIMIT);
    assert_null(d);
    kvt_msg_clear(&m);
    free(s);

    kvt_msg_init(&m, KVT_MSG_NONE);
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_ERR_INVALID);
}

static void test_alloc_failures_unwind(void **state)
{
    kvt_msg_t m = make_alloc_request(), b;
    void *d;
    size_t len;
    int failures = 0;

    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    /* fail each allocation of decode in turn */
    for (uint64_t n = 1; n < 200; n++) {
        kvt_status_t st;
        kvt_alloc_fail_at(n, 0);
        st = kvt_msg_decode(d, len, &b, NULL);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK) {
            kvt_msg_clear(&b);
            break;
        }
        assert_int_equal(st, KVT_ERR_NOMEM);
        assert_int_equal(b.type, KVT_MSG_NONE);
        failures++;
    }
    assert_true(failures >= 6); /* keys array + 3 keys + shape + dtype + req_id */
    /* and of encode */
    for (uint64_t n = 1; n < 50; n++) {
        void *e = NULL;
        size_t elen;
        kvt_status_t st;
        kvt_alloc_fail_at(n, 0);
        st = kvt_msg_encode(&m, &e, &elen);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK) {
            kvt_free(e);
            break;
        }
        assert_int_equal(st, KVT_ERR_NOMEM);
    }
    /* and of copy */
    for (uint64_t n = 1; n < 50; n++) {
        kvt_status_t st;
        kvt_alloc_fail_at(n, 0);
        st = kvt_msg_copy(&b, &m);
        kvt_alloc_fail_at(0, 0);
        if (st == KVT_OK) {
            kvt_msg_clear(&b);
            break;
        }
        assert_int_equal(st, KVT_ERR_NOMEM);
    }
    kvt_free(d);
    kvt_msg_clear(&m);
}

static void test_json_view(void **state)
{
    kvt_msg_t m = make_alloc_request(), b;
    char *js = kvt_msg_to_json(&m);
    kvt_msg_err_t err;

    assert_non_null(js);
    assert_non_null(strstr(js, "{\"type\":\"AllocRequest\",\"keys\":["));
    assert_int_equal(kvt_msg_from_json(js, strlen(js), &b, &err), KVT_OK);
    assert_string_equal(b.u.alloc_req.req_id, "cmpl-42");
    assert_int_equal(b.u.alloc_req.total_chunks, 3);
    kvt_msg_clear(&b);
    kvt_free(js);
    kvt_msg_clear(&m);

    assert_int_equal(kvt_msg_from_json("{\"type\":\"ProxyNotif\"}", 21, &b, &err),
                     KVT_ERR_MSG_FIELD);
    assert_string_equal(err.field, "req_id");
    assert_int_equal(kvt_msg_from_json("{\"type\":\"Nope\"}", 15, &b, &err), KVT_ERR_MSG_TYPE);
    assert_int_equal(kvt_msg_from_json("[1]", 3, &b, &err), KVT_ERR_PROTO);
    assert_int_equal(kvt_msg_from_json("{", 1, &b, &err), KVT_ERR_PROTO);
}

/* Exactly KVT_MSG_MAX_ITEMS keys pass both ways; one more is refused by both. */
static void test_item_bound(void **state)
{
    kvt_msg_t m, b;
    void *d = NULL;
    size_t len;
    kvt_msg_err_t err;

    kvt_msg_init(&m, KVT_MSG_CANCEL_NOTIF);
    kvt_msg_set_str(&m.u.cancel.req_id, "r");
    m.u.cancel.keys.v = kvt_calloc(KVT_MSG_MAX_ITEMS + 1, sizeof(char *));
    for (uint32_t i = 0; i < KVT_MSG_MAX_ITEMS + 1; i++)
        m.u.cancel.keys.v[i] = kvt_strdup("k");
    m.u.cancel.keys.n = KVT_MSG_MAX_ITEMS + 1;
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_ERR_LIMIT);
    m.u.cancel.keys.n = KVT_MSG_MAX_ITEMS;
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    assert_int_equal(kvt_msg_decode(d, len, &b, &err), KVT_OK);
    assert_int_equal(b.u.cancel.keys.n, KVT_MSG_MAX_ITEMS);
    kvt_msg_clear(&b);
    kvt_free(d);
    m.u.cancel.keys.n = KVT_MSG_MAX_ITEMS + 1;
    kvt_msg_clear(&m);

    /* hand-made array32 of MAX_ITEMS + 1 one-byte strings */
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 3);
        pk_str(&pk, "type");
        pk_str(&pk, "CancelNotif");
        pk_str(&pk, "req_id");
        pk_str(&pk, "r");
        pk_str(&pk, "keys");
        msgpack_pack_array(&pk, KVT_MSG_MAX_ITEMS + 1);
        for (uint32_t i = 0; i < KVT_MSG_MAX_ITEMS + 1; i++)
            pk_str(&pk, "k");
        assert_int_equal(decode_err(sb.data, sb.size, &err), KVT_ERR_LIMIT);
        msgpack_sbuffer_destroy(&sb);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A realistic big AllocRequest decodes completely (its cost is printed). */
static void test_decode_speed(void **state)
{
    kvt_msg_t m = make_alloc_request(), b;
    void *d;
    size_t len;
    char key[96];
    double t0, per_us;
    int iters = 50;

    kvt_str_list_clear(&m.u.alloc_req.keys);
    for (int i = 0; i < 4096; i++) {
        snprintf(key, sizeof(key), "vllm@Qwen/Qwen2.5-7B@1@0@%064x", i);
        kvt_str_list_push(&m.u.alloc_req.keys, key);
    }
    assert_int_equal(kvt_msg_encode(&m, &d, &len), KVT_OK);
    t0 = now_s();
    for (int i = 0; i < iters; i++) {
        assert_int_equal(kvt_msg_decode(d, len, &b, NULL), KVT_OK);
        assert_int_equal(b.u.alloc_req.keys.n, 4096);
        kvt_msg_clear(&b);
    }
    per_us = (now_s() - t0) / iters * 1e6;
    /* Informational only: decoder speed belongs to benchmarks, not to a test's verdict. */
    printf("msg: AllocRequest with 4096 keys (%zu bytes) decoded in %.0f us\n", len, per_us);
    kvt_free(d);
    kvt_msg_clear(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_alloc_request),
        cmocka_unit_test(test_roundtrip_responses),
        cmocka_unit_test(test_roundtrip_pull_and_small),
        cmocka_unit_test(test_roundtrip_transport_init),
        cmocka_unit_test(test_encoding_layout),
        cmocka_unit_test(test_flavour_layouts),
        cmocka_unit_test(test_reordered_unknown_defaults),
        cmocka_unit_test(test_transport_init_defaults),
        cmocka_unit_test(test_reject_fields_and_types),
        cmocka_unit_test(test_reject_list_element_types),
        cmocka_unit_test(test_reject_garbage),
        cmocka_unit_test(test_encode_limits),
        cmocka_unit_test(test_alloc_failures_unwind),
        cmocka_unit_test(test_json_view),
        cmocka_unit_test(test_item_bound),
        cmocka_unit_test(test_decode_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
