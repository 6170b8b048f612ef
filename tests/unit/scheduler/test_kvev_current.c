/*
 * KV events as current vLLM emits them: golden vectors of each batch shape
 * (kvev_vectors_current.py, which names the upstream files), and what the
 * index does with the newer fields: remaining_copy_counts, KV-cache groups
 * (group_idx, kv_cache_spec_kind), extra_keys folded into the block key,
 * locality. Then the subscriber's silence rule on the manual clock: one
 * warning per silent instance, one line when its events resume.
 */
#include <msgpack.h>
#include <zmq.h>

#include "pdb/pdb_clock.h"
#include "kvev_vectors.h"
#include "sched_kvev_int.h"
#include "sched_test_util.h"

static kvev_vec_t vecs[8];
static size_t n_vecs;

static void load_vectors(void)
{
    n_vecs = 0;
    kvev_vectors_script("kvev_vectors_current.py", vecs, 8, &n_vecs);
    assert_int_equal(n_vecs, 6);
}

static void decode(const char *name, sched_kvev_batch_t *b)
{
    char err[128] = "";
    if (n_vecs == 0)
        load_vectors();
    for (size_t i = 0; i < n_vecs; i++)
        if (strcmp(vecs[i].name, name) == 0) {
            sched_status_t st = sched_kvev_decode(vecs[i].buf, vecs[i].len, b, err, sizeof(err));
            if (st != SCHED_OK)
                fail_msg("%s: %s", name, err);
            return;
        }
    fail_msg("no vector %s", name);
}

static const uint32_t TOK[8] = {200, 201, 202, 203, 204, 205, 206, 207};

/* Leading blocks of TOK (under <lora>, <salt>) instance <uid> holds. */
static size_t depth_of(sched_kvev_index_t *idx, uint64_t uid, size_t n_tok, const char *lora,
                       const char *salt)
{
    uint64_t keys[4];
    size_t n = sched_kvev_keys(TOK, n_tok, 4, lora, salt, keys, 4), depth = 0;
    double w = 0;
    sched_kvev_index_match(idx, keys, n, &uid, 1, 1.0, &depth, &w);
    return depth;
}

static sched_kvev_index_t *index_with(const char *vector, int *slot)
{
    sched_kvev_index_t *idx;
    sched_kvev_batch_t b;

    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    *slot = sched_kvev_index_slot(idx, 7);
    decode(vector, &b);
    for (size_t i = 0; i < b.n_events; i++)
        sched_kvev_index_apply(idx, *slot, &b.events[i]);
    sched_kvev_batch_free(&b);
    return idx;
}

/* Array batch of map events (the contract test's batch), every field it carries. */
static void test_shape_array_of_maps(void **state)
{
    sched_kvev_batch_t b;
    const sched_kvev_event_t *e;

    (void)state;
    decode("arraymap", &b);
    assert_false(b.map_layout);
    assert_true(b.ts == 1.5);
    assert_int_equal(b.dp_rank, 1);
    assert_int_equal(b.n_events, 3);
    assert_int_equal(b.n_unknown, 0);
    e = &b.events[0];
    assert_int_equal(e->kind, SCHED_KVEV_STORED);
    assert_int_equal(e->n_block_hashes, 2);
    assert_true(e->block_hashes[1] == UINT64_MAX);
    assert_true(e->has_parent && e->parent_block_hash == 10);
    assert_int_equal(e->block_size, 4);
    assert_string_equal(e->lora_name, "adapter");
    assert_non_null(e->extra_digests);
    assert_true(e->extra_digests[0] != 0 && e->extra_digests[1] != 0);
    assert_true(e->extra_digests[0] != e->extra_digests[1]);
    assert_int_equal(e->group_idx, 0);
    assert_int_equal(e->spec, SCHED_KVEV_SPEC_FULL);
    assert_int_equal(e->locality, SCHED_KVEV_LOC_LOCAL);
    e = &b.events[1];
    assert_int_equal(e->kind, SCHED_KVEV_REMOVED);
    assert_false(e->medium_gpu);
    assert_int_equal(e->group_idx, 0);
    assert_null(e->remaining_copies);
    assert_int_equal(b.events[2].kind, SCHED_KVEV_CLEARED);
    sched_kvev_batch_free(&b);
}

/* A 4th batch element (a publisher id) and an unknown event field are ignored. */
static void test_shape_trailing(void **state)
{
    sched_kvev_batch_t b;

    (void)state;
    decode("trailing", &b);
    assert_int_equal(b.n_trailing, 1);
    assert_int_equal(b.dp_rank, 0);
    assert_int_equal(b.n_events, 1);
    assert_int_equal(b.events[0].kind, SCHED_KVEV_REMOVED);
    assert_true(b.events[0].block_hashes[0] == 11);
    sched_kvev_batch_free(&b);
}

/* A removal with copies left removes nothing; the last copy's removal does. */
static void test_remaining_copies(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_index_stats_t st;
    sched_kvev_batch_t b;
    int slot;

    (void)state;
    decode("copies", &b);
    assert_non_null(b.events[1].remaining_copies);
    assert_int_equal(b.events[1].remaining_copies[0], 1);
    assert_int_equal(b.events[1].remaining_copies[1], 0);
    sched_kvev_batch_free(&b);
    idx = index_with("copies", &slot);
    /* block 0 (hash 21) kept, block 1 (hash 22) gone */
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 1);
    sched_kvev_index_stats(idx, &st);
    assert_int_equal(st.kept, 1);
    sched_kvev_index_destroy(idx);
}

/* Storage remote to the instance is not indexed; a REMOTE removal leaves a local block. */
static void test_locality(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_index_stats_t st;
    uint64_t keys[2], uid = 7;
    size_t depth = 0;
    double w;
    int slot;
    uint32_t second[4] = {204, 205, 206, 207};

    (void)state;
    idx = index_with("locality", &slot);
    sched_kvev_index_stats(idx, &st);
    assert_int_equal(st.remote, 1);
    assert_int_equal(st.records, 1);
    assert_int_equal(depth_of(idx, 7, 4, NULL, NULL), 0); /* the REMOTE block 31 */
    /* block 32 is a chain of its own (no parent): TOK[4..8] as a first block */
    sched_kvev_keys(second, 4, 4, NULL, NULL, keys, 1);
    sched_kvev_index_match(idx, keys, 1, &uid, 1, 1.0, &depth, &w);
    assert_int_equal(depth, 1);
    sched_kvev_index_destroy(idx);
}

/* extra_keys are part of the key: LoRA on every block, the salt on the first, a
 * multimodal hash; an engine that sends no extra_keys still folds its LoRA name. */
static void test_extra_keys(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_event_t ev;
    uint64_t h = 77, keys[1], uid = 7;
    size_t depth = 0;
    double w;
    int slot;
    uint32_t second[4] = {204, 205, 206, 207};

    (void)state;
    idx = index_with("extra", &slot);
    assert_int_equal(depth_of(idx, 7, 8, "adapter-a", "salt-1"), 2);
    assert_int_equal(depth_of(idx, 7, 8, "adapter-a", "salt-2"), 0);
    assert_int_equal(depth_of(idx, 7, 8, "adapter-a", NULL), 0);
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 0); /* block 43: a multimodal hash */
    /* [None] is no extra key: block 44 is TOK[4..8] as a plain first block */
    sched_kvev_keys(second, 4, 4, NULL, NULL, keys, 1);
    sched_kvev_index_match(idx, keys, 1, &uid, 1, 1.0, &depth, &w);
    assert_int_equal(depth, 1);
    sched_kvev_index_destroy(idx);

    /* older vLLM: lora_name, no extra_keys */
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    slot = sched_kvev_index_slot(idx, 7);
    ev = (sched_kvev_event_t){.kind = SCHED_KVEV_STORED,
                              .block_hashes = &h,
                              .n_block_hashes = 1,
                              .token_ids = TOK,
                              .n_token_ids = 4,
                              .block_size = 4,
                              .medium_gpu = true,
                              .lora_name = "adapter-a",
                              .group_idx = -1,
                              .sliding_window = -1};
    sched_kvev_index_apply(idx, slot, &ev);
    assert_int_equal(depth_of(idx, 7, 4, "adapter-a", NULL), 1);
    assert_int_equal(depth_of(idx, 7, 4, NULL, NULL), 0);
    sched_kvev_index_destroy(idx);
}

/* One group's removal does not erase another's block; full-attention groups decide. */
static void test_groups(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_batch_t b;
    sched_kvev_event_t ev;
    uint64_t h = 52;
    int slot;

    (void)state;
    decode("hybrid", &b);
    assert_int_equal(b.events[1].spec, SCHED_KVEV_SPEC_PARTIAL);
    assert_int_equal(b.events[1].sliding_window, 8);
    assert_int_equal(b.events[2].group_idx, 1);
    sched_kvev_batch_free(&b);
    /* the window group evicted block 0: the full group still holds the prefix */
    idx = index_with("hybrid", &slot);
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 2);
    /* the full group's removal of block 1 cuts the prefix there */
    ev = (sched_kvev_event_t){.kind = SCHED_KVEV_REMOVED,
                              .block_hashes = &h,
                              .n_block_hashes = 1,
                              .medium_gpu = true,
                              .group_idx = 0};
    sched_kvev_index_apply(idx, slot, &ev);
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 1);
    sched_kvev_index_destroy(idx);
}

/* Two full-attention groups both decide: a block gone from one is no hit. */
static void test_groups_two_full(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_event_t ev;
    uint64_t h[2] = {61, 62};
    int slot;

    (void)state;
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    slot = sched_kvev_index_slot(idx, 7);
    for (int g = 0; g < 2; g++) {
        ev = (sched_kvev_event_t){.kind = SCHED_KVEV_STORED,
                                  .block_hashes = h,
                                  .n_block_hashes = 2,
                                  .token_ids = TOK,
                                  .n_token_ids = 8,
                                  .block_size = 4,
                                  .medium_gpu = true,
                                  .group_idx = g,
                                  .spec = SCHED_KVEV_SPEC_FULL,
                                  .sliding_window = -1};
        sched_kvev_index_apply(idx, slot, &ev);
    }
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 2);
    ev = (sched_kvev_event_t){.kind = SCHED_KVEV_REMOVED,
                              .block_hashes = &h[1],
                              .n_block_hashes = 1,
                              .medium_gpu = true,
                              .group_idx = 1};
    sched_kvev_index_apply(idx, slot, &ev);
    assert_int_equal(depth_of(idx, 7, 8, NULL, NULL), 1);
    sched_kvev_index_destroy(idx);
}

/* Per-block arrays must be one entry per block hash. */
static void test_bad_lengths(void **state)
{
    sched_kvev_batch_t b;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char err[128] = "";

    (void)state;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "BlockRemoved", 12);
    msgpack_pack_str_with_body(&pk, "block_hashes", 12);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_uint64(&pk, 2);
    msgpack_pack_str_with_body(&pk, "remaining_copy_counts", 21);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, 0);
    assert_int_equal(sched_kvev_decode(sb.data, sb.size, &b, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "remaining_copy_counts"));
    msgpack_sbuffer_destroy(&sb);
}

/* ---- silence ----------------------------------------------------------- */

static char last_log[512];
static int warns, infos;

static void capture_log(void *arg, sched_log_level_t lvl, const char *msg)
{
    (void)arg;
    if (strstr(msg, "nothing from") && lvl == SCHED_LOG_WARN)
        warns++;
    if (strstr(msg, "resumed"))
        infos++;
    snprintf(last_log, sizeof(last_log), "%s", msg);
}

static void test_silence(void **state)
{
    sched_kvev_index_t *idx;
    sched_kvev_sub_t *sub;
    sched_kvev_silence_t si;
    void *ctx, *pub;
    char ep[64];
    size_t sz = sizeof(ep);
    uint64_t deadline;

    (void)state;
    ctx = zmq_ctx_new();
    pub = zmq_socket(ctx, ZMQ_PUB);
    assert_int_equal(zmq_bind(pub, "tcp://127.0.0.1:*"), 0);
    zmq_getsockopt(pub, ZMQ_LAST_ENDPOINT, ep, &sz);
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    assert_int_equal(sched_kvev_sub_create(idx, 0, capture_log, NULL, &sub), SCHED_OK);
    sched_kvev_sub_set_silence(sub, 5000, test_clock, NULL);
    assert_int_equal(sched_kvev_sub_add(sub, 9, ep, NULL), SCHED_OK);

    /* Idle: quiet but nobody needs it. */
    test_advance(60000);
    assert_int_equal(sched_kvev_sub_check_silence(sub), UINT64_MAX);
    assert_true(sched_kvev_sub_silence(sub, 9, &si));
    assert_false(si.silent);
    assert_false(si.ever);
    assert_true(si.silence_ms == 60000);

    /* Routed to: the rule arms from that request on. */
    sched_kvev_sub_note_routed(sub, 9);
    sched_kvev_sub_note_routed(sub, 9);
    assert_true(sched_kvev_sub_check_silence(sub) == 5000);
    test_advance(4999);
    sched_kvev_sub_check_silence(sub);
    assert_int_equal(warns, 0);
    test_advance(1);
    sched_kvev_sub_check_silence(sub);
    assert_int_equal(warns, 1);
    assert_non_null(strstr(last_log, ep));
    assert_non_null(strstr(last_log, "no event ever"));
    /* One warning per instance, not one per check. */
    for (int i = 0; i < 5; i++) {
        test_advance(10000);
        sched_kvev_sub_note_routed(sub, 9);
        sched_kvev_sub_check_silence(sub);
    }
    assert_int_equal(warns, 1);
    assert_true(sched_kvev_sub_silence(sub, 9, &si));
    assert_true(si.silent);
    assert_int_equal(si.routed, 7);

    /* Events come again: one line says so, the state clears. */
    deadline = pdb_clock_mono_ms() + 10000;
    while (infos == 0 && pdb_clock_mono_ms() < deadline) {
        unsigned char seq[8] = {0};
        zmq_send(pub, "", 0, ZMQ_SNDMORE);
        zmq_send(pub, seq, 8, ZMQ_SNDMORE);
        zmq_send(pub, "\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x90", 11, 0); /* [1.0, []] */
        sched_kvev_sub_poll(sub, 50);
    }
    assert_int_equal(infos, 1);
    assert_true(sched_kvev_sub_silence(sub, 9, &si));
    assert_false(si.silent);
    assert_true(si.ever);
    assert_int_equal(si.routed, 0);
    assert_int_equal(warns, 1);

    sched_kvev_sub_destroy(sub);
    sched_kvev_index_destroy(idx);
    zmq_close(pub);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_array_of_maps),
        cmocka_unit_test(test_shape_trailing),
        cmocka_unit_test(test_remaining_copies),
        cmocka_unit_test(test_locality),
        cmocka_unit_test(test_extra_keys),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_groups_two_full),
        cmocka_unit_test(test_bad_lengths),
        cmocka_unit_test(test_silence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
