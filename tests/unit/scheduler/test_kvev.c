/*
 * KV events: decoder golden vectors (made by python3-msgpack in
 * kvev_vectors.py, shapes from vllm-project/vllm
 * vllm/distributed/kv_events.py), garbage input, the index (chained keys,
 * removals, tiers, LRU bound), the subscriber over real ZeroMQ sockets (gap
 * → replay, publisher restart, AllBlocksCleared, removal) and the
 * precise-prefix policy.
 */
#include <msgpack.h>
#include <zmq.h>

#include "sched_kvev_int.h"
#include "kvev_vectors.h"
#include "sched_test_util.h"

/* ---- decoder ------------------------------------------------------ */

/* The golden vectors of kvev_vectors.py (older vLLM's array and map layouts). */
static size_t load_vectors(kvev_vec_t *v, size_t max)
{
    size_t n = 0;
    kvev_vectors_script("kvev_vectors.py", v, max, &n);
    return n;
}

static void check_layout(const unsigned char *buf, size_t len, bool map)
{
    sched_kvev_batch_t b;
    char err[128] = "";
    const sched_kvev_event_t *e;

    assert_int_equal(sched_kvev_decode(buf, len, &b, err, sizeof(err)), SCHED_OK);
    assert_int_equal(b.map_layout, map);
    assert_true(b.ts > 1700000000.4 && b.ts < 1700000000.6);
    assert_int_equal(b.dp_rank, 2);
    assert_int_equal(b.n_events, 4);
    e = &b.events[0];
    assert_int_equal(e->kind, SCHED_KVEV_STORED);
    assert_int_equal(e->n_block_hashes, 2);
    assert_true(e->block_hashes[0] == 0x1111);
    assert_true(e->block_hashes[1] == 0xFFFFFFFFFFFFFFF0ull);
    assert_false(e->has_parent);
    assert_int_equal(e->n_token_ids, 8);
    assert_int_equal(e->token_ids[0], 100);
    assert_int_equal(e->token_ids[7], 107);
    assert_int_equal(e->block_size, 4);
    assert_true(e->medium_gpu);
    assert_null(e->lora_name);
    assert_int_equal(e->group_idx, -1);
    e = &b.events[1];
    assert_int_equal(e->kind, SCHED_KVEV_STORED);
    assert_true(e->has_parent);
    assert_true(e->parent_block_hash == 0xFFFFFFFFFFFFFFF0ull);
    assert_true(e->block_hashes[0] == 0x0123456789ABCDEFull);
    assert_false(e->medium_gpu);
    assert_string_equal(e->lora_name, "adapter-a");
    assert_int_equal(e->group_idx, 3);
    e = &b.events[2];
    assert_int_equal(e->kind, SCHED_KVEV_REMOVED);
    assert_int_equal(e->n_block_hashes, 1);
    assert_true(e->block_hashes[0] == 0x1111);
    assert_true(e->medium_gpu);
    assert_int_equal(b.events[3].kind, SCHED_KVEV_CLEARED);
    sched_kvev_batch_free(&b);
}

static void test_decode_golden(void **state)
{
    static kvev_vec_t v[8];
    int n = (int)load_vectors(v, 8), seen = 0;

    (void)state;
    for (int i = 0; i < n; i++) {
        sched_kvev_batch_t b;
        if (strcmp(v[i].name, "array") == 0) {
            check_layout(v[i].buf, v[i].len, false);
        } else if (strcmp(v[i].name, "map") == 0) {
            check_layout(v[i].buf, v[i].len, true);
        } else if (strcmp(v[i].name, "bytes") == 0) {
            assert_int_equal(sched_kvev_decode(v[i].buf, v[i].len, &b, NULL, 0), SCHED_OK);
            assert_int_equal(b.n_events, 1);
            /* bytes 0..31: the last 8 are 24..31 */
            assert_true(b.events[0].block_hashes[0] == 0x18191a1b1c1d1e1full);
            assert_int_equal(b.dp_rank, -1);
            sched_kvev_batch_free(&b);
        } else if (strcmp(v[i].name, "unknown") == 0) {
            assert_int_equal(sched_kvev_decode(v[i].buf, v[i].len, &b, NULL, 0), SCHED_OK);
            assert_int_equal(b.n_events, 1);
            assert_int_equal(b.n_unknown, 1);
            assert_int_equal(b.events[0].kind, SCHED_KVEV_CLEARED);
            sched_kvev_batch_free(&b);
        } else {
            fail_msg("unexpected vector %s", v[i].name);
        }
        seen++;
    }
    assert_int_equal(seen, 4);
}

static void test_decode_garbage(void **state)
{
    static kvev_vec_t v[8];
    int n = (int)load_vectors(v, 8);
    unsigned char junk[64];
    sched_kvev_batch_t b;
    char err[128];
    uint64_t rng = 42;

    (void)state;
    /* every truncation of a valid payload is refused, never a crash */
    for (int i = 0; i < n; i++)
        for (size_t cut = 0; cut < v[i].len; cut++)
            assert_int_equal(sched_kvev_decode(v[i].buf, cut, &b, err, sizeof(err)),
                             SCHED_ERR_INVALID);
    /* bit flips: either decodes or is refused; no crash, no leak */
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < v[i].len * 8; k += 3) {
            unsigned char copy[2048];
            memcpy(copy, v[i].buf, v[i].len);
            copy[k / 8] ^= (unsigned char)(1u << (k % 8));
            if (sched_kvev_decode(copy, v[i].len, &b, err, sizeof(err)) == SCHED_OK)
                sched_kvev_batch_free(&b);
        }
    for (int r = 0; r < 2000; r++) {
        for (size_t k = 0; k < sizeof(junk); k++)
            junk[k] = (unsigned char)(sched_rng_next(&rng) >> 24);
        if (sched_kvev_decode(junk, sizeof(junk), &b, err, sizeof(err)) == SCHED_OK)
            sched_kvev_batch_free(&b);
    }
    /* forged container sizes (4 billion elements in a few bytes) are refused
     * before anything is allocated for them */
    {
        static const unsigned char huge_array[] = {0x92, 0xcb, 0,    0,    0,    0,    0,   0,
                                                   0,    0,    0xdd, 0xff, 0xff, 0xff, 0xff};
        static const unsigned char huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa2, 't', 's'};
        static const unsigned char huge_str[] = {0xdb, 0x7f, 0xff, 0xff, 0xff, 'x'};
        assert_int_equal(sched_kvev_decode(huge_array, sizeof(huge_array), &b, err, sizeof(err)),
                         SCHED_ERR_INVALID);
        assert_int_equal(sched_kvev_decode(huge_map, sizeof(huge_map), &b, err, sizeof(err)),
                         SCHED_ERR_INVALID);
        assert_int_equal(sched_kvev_decode(huge_str, sizeof(huge_str), &b, err, sizeof(err)),
                         SCHED_ERR_INVALID);
    }
    /* more elements than SCHED_KVEV_MAX_OBJECTS (each would cost msgpack-c 24 bytes: 16 MiB
     * of them 384 MiB) are refused before anything is unpacked; one fewer is unpacked */
    {
        size_t items = (size_t)SCHED_KVEV_MAX_OBJECTS - 3, len = 0; /* + root, ts, events */
        unsigned char *big = malloc(items + 16);
        assert_non_null(big);
        big[len++] = 0x92; /* [ts, [[], [], ...]] */
        big[len++] = 0xcb;
        memset(big + len, 0, 8);
        len += 8;
        big[len++] = 0xdd;
        for (int i = 3; i >= 0; i--)
            big[len++] = (unsigned char)(items >> (8 * i));
        memset(big + len, 0x90, items);
        len += items;
        assert_int_equal(sched_kvev_decode(big, len, &b, err, sizeof(err)), SCHED_ERR_INVALID);
        assert_non_null(strstr(err, "event:")); /* unpacked, then refused as an event */
        items++;
        big[10] = (unsigned char)(items >> 24), big[11] = (unsigned char)(items >> 16);
        big[12] = (unsigned char)(items >> 8), big[13] = (unsigned char)items;
        big[len++] = 0x90;
        assert_int_equal(sched_kvev_decode(big, len, &b, err, sizeof(err)), SCHED_ERR_INVALID);
        assert_non_null(strstr(err, "4M elements"));
        free(big);
    }
    /* a batch whose event lacks token_ids is refused with a reason */
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_double(&pk, 1.0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_str_with_body(&pk, "BlockStored", 11);
        msgpack_pack_array(&pk, 0);
        assert_int_equal(sched_kvev_decode(sb.data, sb.size, &b, err, sizeof(err)),
                         SCHED_ERR_INVALID);
        assert_non_null(strstr(err, "required"));
        msgpack_sbuffer_destroy(&sb);
    }
}

/* ---- index -------------------------------------------------------- */

static sched_kvev_event_t stored(const uint64_t *hashes, size_t n, const uint64_t *parent,
                                 const uint32_t *tokens, uint32_t bs, bool gpu)
{
    return (sched_kvev_event_t){.kind = SCHED_KVEV_STORED,
                                .block_hashes = hashes,
                                .n_block_hashes = n,
                                .has_parent = parent != NULL,
                                .parent_block_hash = parent ? *parent : 0,
                                .token_ids = tokens,
                                .n_token_ids = n * bs,
                                .block_size = bs,
                                .medium_gpu = gpu,
                                .group_idx = -1};
}

static void test_index_chain(void **state)
{
    sched_kvev_index_t *idx;
    uint32_t toks[64];
    uint64_t keys[16], uids[2] = {7, 8}, h_a[2] = {501, 502}, h_b[2] = {601, 602}, h_x = 999;
    size_t depth[2];
    double w[2];
    int s7, s8;
    sched_kvev_event_t ev;

    (void)state;
    for (int i = 0; i < 64; i++)
        toks[i] = 1000u + (uint32_t)i;
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    s7 = sched_kvev_index_slot(idx, 7);
    s8 = sched_kvev_index_slot(idx, 8);
    assert_true(s7 >= 0 && s8 >= 0 && s7 != s8);
    assert_int_equal(sched_kvev_index_slot(idx, 7), s7);

    /* instance 7: blocks 0-1, then 2-3 chained by parent (engine hash 502) */
    ev = stored(h_a, 2, NULL, toks, 4, true);
    sched_kvev_index_apply(idx, s7, &ev);
    ev = stored(h_b, 2, &h_a[1], toks + 8, 4, true);
    sched_kvev_index_apply(idx, s7, &ev);
    /* instance 8: blocks 0-1 only, in CPU; its engine hashes differ (other seed) */
    ev = stored(h_b, 2, NULL, toks, 4, false);
    sched_kvev_index_apply(idx, s8, &ev);
    /* an orphan: parent never seen */
    ev = stored(&h_x, 1, &h_x, toks + 16, 4, true);
    sched_kvev_index_apply(idx, s8, &ev);

    assert_int_equal(sched_kvev_index_block_size(idx, 7), 4);
    assert_int_equal(sched_kvev_keys(toks, 22, 4, NULL, NULL, keys, 16), 5);
    sched_kvev_index_match(idx, keys, 5, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[0], 4);
    assert_int_equal(depth[1], 2);
    assert_true(w[0] == 4.0 && w[1] == 1.0);

    /* a different first block: nobody matches, even with equal later blocks */
    toks[0]++;
    assert_int_equal(sched_kvev_keys(toks, 16, 4, NULL, NULL, keys, 16), 4);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[0] + depth[1], 0);
    toks[0]--;
    /* a LoRA names another chain */
    sched_kvev_keys(toks, 16, 4, "adapter", NULL, keys, 16);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[0], 0);

    /* removal of block 1 on 7 (by engine hash) cuts its run at 1 */
    sched_kvev_keys(toks, 16, 4, NULL, NULL, keys, 16);
    ev = (sched_kvev_event_t){.kind = SCHED_KVEV_REMOVED,
                              .block_hashes = &h_a[1],
                              .n_block_hashes = 1,
                              .medium_gpu = true};
    sched_kvev_index_apply(idx, s7, &ev);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[0], 1);
    /* removing a GPU copy does not remove instance 8's CPU copy */
    ev.block_hashes = &h_b[0];
    sched_kvev_index_apply(idx, s8, &ev);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[1], 2);

    /* AllBlocksCleared on 8 */
    ev = (sched_kvev_event_t){.kind = SCHED_KVEV_CLEARED};
    sched_kvev_index_apply(idx, s8, &ev);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[1], 0);

    {
        sched_kvev_index_stats_t st;
        sched_kvev_index_stats(idx, &st);
        assert_int_equal(st.orphans, 1);
        assert_int_equal(st.records, 3); /* 7: blocks 0, 2, 3 */
    }
    /* releasing 7's slot forgets it */
    sched_kvev_index_clear(idx, s7, true);
    sched_kvev_index_match(idx, keys, 4, uids, 2, 0.5, depth, w);
    assert_int_equal(depth[0], 0);
    sched_kvev_index_destroy(idx);
}

/* A BlockStored of the offloading connector's shape (vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py
 * take_events: medium "CPU", no parent, no token ids, block_size 0 in some
 * versions) as msgpack in the map layout. */
static size_t cpu_copy_event(unsigned char *out, size_t cap, const uint64_t *h, size_t n)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t len;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "ts", 2);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_str_with_body(&pk, "events", 6);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 8);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "BlockStored", 11);
    msgpack_pack_str_with_body(&pk, "block_hashes", 12);
    msgpack_pack_array(&pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, h[i]);
    msgpack_pack_str_with_body(&pk, "parent_block_hash", 17);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    msgpack_pack_array(&pk, 0);
    msgpack_pack_str_with_body(&pk, "block_size", 10);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_str_with_body(&pk, "lora_id", 7);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "medium", 6);
    msgpack_pack_str_with_body(&pk, "CPU", 3);
    msgpack_pack_str_with_body(&pk, "lora_name", 9);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "data_parallel_rank", 18);
    msgpack_pack_int(&pk, 0);
    len = sb.size < cap ? sb.size : 0;
    memcpy(out, sb.data, len);
    msgpack_sbuffer_destroy(&sb);
    return len;
}

/*
 * CPU-tier copies of blocks: the tokenless shape takes the key of the GPU
 * copy with the same engine hash; a block cached in both tiers counts as
 * GPU, one left only in CPU counts the other-tier weight (llm-d-kv-cache
 * pkg/kvcache/kvblock_scorer.go: per block the best weight among the tiers
 * holding it, the CPU one below the GPU one), and removals name their tier.
 */
static void test_index_cpu_copies(void **state)
{
    sched_kvev_index_t *idx;
    uint32_t toks[16];
    uint64_t keys[4], uid = 7, h[3] = {501, 502, 777};
    unsigned char buf[512];
    size_t len, depth;
    double w;
    sched_kvev_batch_t b;
    sched_kvev_event_t ev;
    sched_kvev_index_stats_t st;
    char err[128] = "";
    int s;

    (void)state;
    for (int i = 0; i < 16; i++)
        toks[i] = 3000u + (uint32_t)i;
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    s = sched_kvev_index_slot(idx, uid);
    ev = stored(h, 2, NULL, toks, 4, true);
    sched_kvev_index_apply(idx, s, &ev);
    /* copies of 501, 502 and of 777, which was never announced */
    len = cpu_copy_event(buf, sizeof(buf), h, 3);
    assert_true(len > 0);
    assert_int_equal(sched_kvev_decode(buf, len, &b, err, sizeof(err)), SCHED_OK);
    assert_int_equal(b.n_events, 1);
    assert_false(b.events[0].medium_gpu);
    assert_int_equal(b.events[0].n_token_ids, 0);
    sched_kvev_index_apply(idx, s, &b.events[0]);
    sched_kvev_batch_free(&b);
    sched_kvev_index_stats(idx, &st);
    assert_int_equal(st.records, 4);
    assert_int_equal(st.orphans, 1);
    assert_int_equal(st.bad_events, 0);

    assert_int_equal(sched_kvev_keys(toks, 9, 4, NULL, NULL, keys, 4), 2);
    sched_kvev_index_match(idx, keys, 2, &uid, 1, 0.8, &depth, &w);
    assert_int_equal(depth, 2);
    assert_true(w == 2.0); /* both tiers: GPU counts */
    /* the GPU copy of block 1 goes: its CPU copy still counts, less */
    ev = (sched_kvev_event_t){
        .kind = SCHED_KVEV_REMOVED, .block_hashes = &h[1], .n_block_hashes = 1, .medium_gpu = true};
    sched_kvev_index_apply(idx, s, &ev);
    sched_kvev_index_match(idx, keys, 2, &uid, 1, 0.8, &depth, &w);
    assert_int_equal(depth, 2);
    assert_true(w > 1.79 && w < 1.81);
    /* then the CPU copy (a CPU removal): the run ends at block 0 */
    ev.medium_gpu = false;
    sched_kvev_index_apply(idx, s, &ev);
    sched_kvev_index_match(idx, keys, 2, &uid, 1, 0.8, &depth, &w);
    assert_int_equal(depth, 1);
    assert_true(w == 1.0);
    /* a tokenless GPU store still needs its tokens */
    ev = stored(&h[2], 1, NULL, toks, 4, true);
    ev.n_token_ids = 0;
    sched_kvev_index_apply(idx, s, &ev);
    sched_kvev_index_stats(idx, &st);
    assert_int_equal(st.bad_events, 1);
    sched_kvev_index_destroy(idx);
}

static void test_index_bound(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_index_stats_t st;
    uint32_t toks[4];
    uint64_t h, prev = 0, keys[1], uid = 3;
    size_t depth;
    double w;
    int s;

    (void)state;
    assert_int_equal(sched_kvev_index_create(64, &idx), SCHED_OK);
    s = sched_kvev_index_slot(idx, uid);
    /* a 1000-block chain: memory stays at 64 records, the newest survive */
    for (uint32_t i = 0; i < 1000; i++) {
        sched_kvev_event_t ev;
        for (int k = 0; k < 4; k++)
            toks[k] = i * 4 + (uint32_t)k;
        h = 10000 + i;
        ev = stored(&h, 1, i ? &prev : NULL, toks, 4, true);
        sched_kvev_index_apply(idx, s, &ev);
        prev = h;
    }
    sched_kvev_index_stats(idx, &st);
    assert_int_equal(st.records, 64);
    assert_int_equal(st.keys, 64);
    assert_int_equal(st.evicted, 1000 - 64);
    assert_int_equal(st.orphans, 0);
    /* the first block was evicted: a prompt starting there matches nothing */
    toks[0] = 0, toks[1] = 1, toks[2] = 2, toks[3] = 3;
    sched_kvev_keys(toks, 4, 4, NULL, NULL, keys, 1);
    sched_kvev_index_match(idx, keys, 1, &uid, 1, 0.5, &depth, &w);
    assert_int_equal(depth, 0);
    /* more than 64 instances: the 65th gets no slot */
    for (uint64_t u = 100; u < 163; u++)
        assert_true(sched_kvev_index_slot(idx, u) >= 0);
    assert_int_equal(sched_kvev_index_slot(idx, 999), -1);
    sched_kvev_index_destroy(idx);
}

/* ---- subscriber over real sockets --------------------------------- */

typedef struct fake_pub {
    void *ctx, *pub, *router;
    char pub_ep[64], router_ep[64];
    unsigned char buf[64][512]; /* replay buffer by seq */
    size_t len[64];
} fake_pub_t;

static void fake_open(fake_pub_t *f)
{
    size_t sz;
    memset(f, 0, sizeof(*f));
    f->ctx = zmq_ctx_new();
    f->pub = zmq_socket(f->ctx, ZMQ_PUB);
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(f->pub, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
    sz = sizeof(f->pub_ep);
    zmq_getsockopt(f->pub, ZMQ_LAST_ENDPOINT, f->pub_ep, &sz);
    sz = sizeof(f->router_ep);
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->router_ep, &sz);
}

static void fake_close(fake_pub_t *f)
{
    int zero = 0;
    zmq_setsockopt(f->pub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(f->pub);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
}

/* Payload (array layout): one BlockStored of 1 block of 4 tokens, or an
 * AllBlocksCleared when tok0 is UINT32_MAX. */
static void fake_store(fake_pub_t *f, uint64_t seq, uint64_t hash, const uint64_t *parent,
                       uint32_t tok0, bool send)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    unsigned char s8[8];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 1);
    if (tok0 == UINT32_MAX) {
        msgpack_pack_array(&pk, 1);
        msgpack_pack_str_with_body(&pk, "AllBlocksCleared", 16);
    } else {
        msgpack_pack_array(&pk, 8);
        msgpack_pack_str_with_body(&pk, "BlockStored", 11);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, hash);
        if (parent)
            msgpack_pack_uint64(&pk, *parent);
        else
            msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, 4);
        for (uint32_t k = 0; k < 4; k++)
            msgpack_pack_uint32(&pk, tok0 + k);
        msgpack_pack_uint32(&pk, 4);
        msgpack_pack_nil(&pk);
        msgpack_pack_str_with_body(&pk, "GPU", 3);
        msgpack_pack_nil(&pk);
    }
    msgpack_pack_int(&pk, 0);
    memcpy(f->buf[seq], sb.data, sb.size);
    f->len[seq] = sb.size;
    for (int i = 0; i < 8; i++)
        s8[i] = (unsigned char)(seq >> (56 - 8 * i));
    if (send) {
        zmq_send(f->pub, "kv", 2, ZMQ_SNDMORE);
        zmq_send(f->pub, s8, 8, ZMQ_SNDMORE);
        zmq_send(f->pub, sb.data, sb.size, 0);
    }
    msgpack_sbuffer_destroy(&sb);
}

/* Serve pending replay requests from the buffered batches (seq 0 up to the
 * first never stored), as ZmqEventPublisher does. */
static int fake_serve_replay(fake_pub_t *f)
{
    zmq_pollitem_t it = {.socket = f->router, .events = ZMQ_POLLIN};
    int served = 0;

    while (zmq_poll(&it, 1, 0) > 0) {
        char id[256];
        unsigned char delim[8], start[8], end[8];
        int idn = zmq_recv(f->router, id, sizeof(id), 0);
        zmq_recv(f->router, delim, sizeof(delim), 0);
        zmq_recv(f->router, start, sizeof(start), 0);
        uint64_t from = 0;
        for (int i = 0; i < 8; i++)
            from = (from << 8) | start[i];
        for (uint64_t s = from; s < 64 && f->len[s]; s++) {
            unsigned char s8[8];
            for (int i = 0; i < 8; i++)
                s8[i] = (unsigned char)(s >> (56 - 8 * i));
            zmq_send(f->router, id, (size_t)idn, ZMQ_SNDMORE);
            zmq_send(f->router, "", 0, ZMQ_SNDMORE);
            zmq_send(f->router, s8, 8, ZMQ_SNDMORE);
            zmq_send(f->router, f->buf[s], f->len[s], 0);
        }
        memset(end, 0xff, 8);
        zmq_send(f->router, id, (size_t)idn, ZMQ_SNDMORE);
        zmq_send(f->router, "", 0, ZMQ_SNDMORE);
        zmq_send(f->router, end, 8, ZMQ_SNDMORE);
        zmq_send(f->router, "", 0, 0);
        served++;
    }
    return served;
}

static size_t depth_of(sched_kvev_index_t *idx, uint64_t uid, uint32_t n_blocks)
{
    uint32_t toks[64];
    uint64_t keys[16];
    size_t depth;
    double w;

    for (uint32_t i = 0; i < n_blocks * 4; i++)
        toks[i] = 100 + i;
    sched_kvev_keys(toks, n_blocks * 4, 4, NULL, NULL, keys, 16);
    sched_kvev_index_match(idx, keys, n_blocks, &uid, 1, 0.5, &depth, &w);
    return depth;
}

/* Poll until the index shows <want> blocks for uid (bounded). */
static void wait_depth(sched_kvev_sub_t *sub, sched_kvev_index_t *idx, fake_pub_t *f, uint64_t uid,
                       uint32_t n, size_t want)
{
    for (int i = 0; i < 300; i++) {
        sched_kvev_sub_poll(sub, 10);
        fake_serve_replay(f);
        if (depth_of(idx, uid, n) == want)
            return;
    }
    fail_msg("index depth %zu, want %zu", depth_of(idx, uid, n), want);
}

static void test_sub_recovery(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_sub_t *sub;
    sched_kvev_sub_stats_t st;
    fake_pub_t f;
    uint64_t h[4] = {11, 12, 13, 14};

    (void)state;
    fake_open(&f);
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    assert_int_equal(sched_kvev_sub_create(idx, 0, test_quiet_log, NULL, &sub), SCHED_OK);
    /* The fake answers replays only between the steps below (a sanitizer build on a busy
     * machine stretches them past the default 1 s), and a delayed catch-up replay in flight
     * when seq 2 arrives would bring seq 1 with it and hide the gap this test counts. */
    sched_kvev_sub_set_timing(sub, 60000, -1);
    assert_int_equal(sched_kvev_sub_add(sub, 5, f.pub_ep, f.router_ep), SCHED_OK);
    /* a PUB drops messages until the SUB is connected; the catch-up replay
     * from seq 0 brings the batch anyway */
    fake_store(&f, 0, h[0], NULL, 100, true);
    wait_depth(sub, idx, &f, 5, 1, 1);
    assert_int_equal(depth_of(idx, 5, 1), 1);
    /* the catch-up replay ends before the next step (a live message that comes while it is
     * in flight is left to it, and seq 2 would then be re-asked for, not seen as a gap) */
    for (int i = 0; i < 300; i++) {
        sched_kvev_sub_stats(sub, &st);
        if (st.replays_done == st.replays)
            break;
        sched_kvev_sub_poll(sub, 10);
        fake_serve_replay(&f);
    }
    assert_int_equal(st.replays_done, st.replays);

    /* seq 1 is lost on the wire, seq 2 arrives: gap → replay from 1 */
    fake_store(&f, 1, h[1], &h[0], 104, false);
    fake_store(&f, 2, h[2], &h[1], 108, true);
    wait_depth(sub, idx, &f, 5, 3, 3);
    sched_kvev_sub_stats(sub, &st);
    assert_int_equal(st.gaps, 1);
    assert_true(st.replays >= 2); /* catch-up, then the gap */
    assert_int_equal(st.replay_failed, 0);

    /* publisher restart: seq 0 again, other content; old blocks forgotten */
    memset(f.len, 0, sizeof(f.len)); /* a new process: empty replay buffer */
    fake_store(&f, 0, 77, NULL, 5000, true);
    for (int i = 0; i < 300; i++) {
        sched_kvev_sub_poll(sub, 10);
        sched_kvev_sub_stats(sub, &st);
        if (st.restarts == 1)
            break;
    }
    assert_int_equal(st.restarts, 1);
    assert_int_equal(depth_of(idx, 5, 3), 0);

    /* rebuild, then AllBlocksCleared empties it */
    fake_store(&f, 1, h[0], NULL, 100, true);
    wait_depth(sub, idx, &f, 5, 1, 1);
    fake_store(&f, 2, 0, NULL, UINT32_MAX, true);
    wait_depth(sub, idx, &f, 5, 1, 0);
    sched_kvev_sub_stats(sub, &st);
    assert_int_equal(st.cleared, 1);

    /* garbage on the wire: counted, nothing else */
    zmq_send(f.pub, "kv", 2, ZMQ_SNDMORE);
    zmq_send(f.pub, "\0\0\0\0\0\0\0\3", 8, ZMQ_SNDMORE);
    zmq_send(f.pub, "\xc1\xc1", 2, 0);
    zmq_send(f.pub, "only-one-frame", 14, 0);
    for (int i = 0; i < 300; i++) {
        sched_kvev_sub_poll(sub, 10);
        sched_kvev_sub_stats(sub, &st);
        if (st.bad_messages >= 2)
            break;
    }
    assert_int_equal(st.bad_messages, 2);

    /* instance removal drops its blocks */
    fake_store(&f, 4, h[0], NULL, 100, true);
    wait_depth(sub, idx, &f, 5, 1, 1);
    sched_kvev_sub_remove(sub, 5);
    sched_kvev_sub_poll(sub, 0);
    assert_int_equal(depth_of(idx, 5, 1), 0);

    sched_kvev_sub_destroy(sub);
    sched_kvev_index_destroy(idx);
    fake_close(&f);
}

/* A subscriber that joins after the engine cached blocks learns them from
 * the replay buffer, without waiting for a new batch. */
static void test_sub_catch_up(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_sub_t *sub;
    fake_pub_t f;
    uint64_t h[3] = {21, 22, 23};

    (void)state;
    fake_open(&f);
    fake_store(&f, 0, h[0], NULL, 100, true); /* nobody listens yet: lost live */
    fake_store(&f, 1, h[1], &h[0], 104, true);
    fake_store(&f, 2, h[2], &h[1], 108, true);
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    assert_int_equal(sched_kvev_sub_create(idx, 0, test_quiet_log, NULL, &sub), SCHED_OK);
    assert_int_equal(sched_kvev_sub_add(sub, 9, f.pub_ep, f.router_ep), SCHED_OK);
    wait_depth(sub, idx, &f, 9, 3, 3);
    sched_kvev_sub_destroy(sub);
    sched_kvev_index_destroy(idx);
    fake_close(&f);
}

/* ---- policy -------------------------------------------------------- */

static void test_policy_precise(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_PRECISE_PREFIX);
    uint32_t toks[40];
    uint64_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    sched_booking_t *b = NULL;
    sched_request_t req = {.tokens = toks, .n_tokens = 40, .max_tokens = 8};
    const char *ids[3] = {"d0", "d1", "d2"};
    sched_kvev_event_t ev;

    (void)state;
    assert_non_null(pool->kvev_index);
    for (int i = 0; i < 3; i++)
        test_add(pool, ids[i], 9100 + i, SCHED_ROLE_DECODE, "", 1);
    for (uint32_t i = 0; i < 40; i++)
        toks[i] = 7 + i;
    /* d1 holds 8 blocks (32 tokens), d2 holds 2 */
    ev = stored(h, 8, NULL, toks, 4, true);
    sched_kvev_index_apply(
        pool->kvev_index, sched_kvev_index_slot(pool->kvev_index, test_inst(pool, "d1")->uid), &ev);
    ev = stored(h, 2, NULL, toks, 4, true);
    sched_kvev_index_apply(
        pool->kvev_index, sched_kvev_index_slot(pool->kvev_index, test_inst(pool, "d2")->uid), &ev);

    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d1");
    sched_booking_destroy(&b);
    /* moderate load on d1 (within the slack): still d1 */
    test_set_inflight(pool, "d1", 2);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d1");
    sched_booking_destroy(&b);
    /* beyond the slack (4 requests): the load bound sends it elsewhere */
    test_set_inflight(pool, "d1", 6);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d2");
    sched_booking_destroy(&b);
    test_set_inflight(pool, "d1", 0);
    /* no tokens: least load (everyone equal → any, but never an error) */
    req.tokens = NULL;
    req.n_tokens = 0;
    req.text = "hello";
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    sched_booking_destroy(&b);
    /* d1 removed: its blocks no longer attract */
    req.tokens = toks;
    req.n_tokens = 40;
    assert_int_equal(sched_pool_remove(pool, "d1"), SCHED_OK);
    assert_int_equal(sched_book_decode(pool, &req, &b), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)), "d2");
    sched_booking_destroy(&b);
    sched_pool_destroy(pool);
}

/* A DP rank's publisher, from the engine's configured endpoint, as vLLM offsets it
 * (vllm-project/vllm vllm/distributed/kv_events.py offset_endpoint_port: tcp port + rank,
 * inproc "_dp<rank>", rank 0 unchanged, anything else refused). */
static void test_rank_endpoint(void **state)
{
    char out[128];
    (void)state;
    assert_true(sched_kvev_rank_endpoint("tcp://10.0.0.5:5557", 0, out, sizeof(out)));
    assert_string_equal(out, "tcp://10.0.0.5:5557");
    assert_true(sched_kvev_rank_endpoint("tcp://10.0.0.5:5557", 3, out, sizeof(out)));
    assert_string_equal(out, "tcp://10.0.0.5:5560");
    assert_true(sched_kvev_rank_endpoint("tcp://[::1]:5557", 1, out, sizeof(out)));
    assert_string_equal(out, "tcp://[::1]:5558");
    assert_true(sched_kvev_rank_endpoint("inproc://cache", 2, out, sizeof(out)));
    assert_string_equal(out, "inproc://cache_dp2");
    assert_true(sched_kvev_rank_endpoint("ipc:///tmp/kv", 0, out, sizeof(out)));
    assert_false(sched_kvev_rank_endpoint("ipc:///tmp/kv", 1, out, sizeof(out)));
    assert_false(sched_kvev_rank_endpoint("tcp://h:65535", 1, out, sizeof(out)));
    assert_false(sched_kvev_rank_endpoint("tcp://h:x", 1, out, sizeof(out)));
    assert_false(sched_kvev_rank_endpoint("", 0, out, sizeof(out)));
    assert_false(sched_kvev_rank_endpoint("tcp://10.0.0.5:5557", 1, out, 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_golden), cmocka_unit_test(test_decode_garbage),
        cmocka_unit_test(test_index_chain),   cmocka_unit_test(test_index_cpu_copies),
        cmocka_unit_test(test_index_bound),   cmocka_unit_test(test_sub_recovery),
        cmocka_unit_test(test_sub_catch_up),  cmocka_unit_test(test_policy_precise),
        cmocka_unit_test(test_rank_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
