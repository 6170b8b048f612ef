/*
 * fuzz_kvev_decode.c - an engine's KV-event payload (the msgpack batch in the third frame of a
 * message on the publisher the scheduler subscribes to, or in a replay answer) into the
 * scheduler's decoder (scheduler/src/sched_kvev_decode.c, sched_kvev_decode), and the events
 * it accepts into a small index (sched_kvev_index_apply / _match).
 *
 * Beyond no crash, over-read (the payload is an exact-size copy), leak or UB:
 *  - a refused payload leaves the batch empty and gives a reason;
 *  - an accepted batch is sane: known kinds, a STORED event's block size at most 1 << 20,
 *    every array readable to its length;
 *  - the batch re-encoded in the map layout current vLLM publishes (vllm-project/vllm
 *    vllm/distributed/kv_events.py: {ts, events: [{type, ...}], data_parallel_rank}) decodes
 *    to the same events: what the decoder keeps depends on the fields, not on the layout;
 *  - the index stays within its bound whatever the events say.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

static sched_kvev_index_t *idx;
static int slot;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (sched_kvev_index_create(64, &idx) != SCHED_OK)
        abort();
    slot = sched_kvev_index_slot(idx, 1);
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pack_hash_list(msgpack_packer *pk, const uint64_t *h, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, h[i]);
}

/* The batch as current vLLM writes it: a map, events as maps tagged by "type". */
static void encode_map(const sched_kvev_batch_t *b, msgpack_sbuffer *sb)
{
    static const char *const tags[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    msgpack_packer pk;

    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "ts");
    msgpack_pack_double(&pk, b->ts);
    pack_str(&pk, "events");
    msgpack_pack_array(&pk, b->n_events);
    for (size_t i = 0; i < b->n_events; i++) {
        const sched_kvev_event_t *e = &b->events[i];
        bool stored = e->kind == SCHED_KVEV_STORED, removed = e->kind == SCHED_KVEV_REMOVED;
        msgpack_pack_map(&pk, 3 + (stored ? 5 : removed ? 1 : 0));
        pack_str(&pk, "type");
        pack_str(&pk, tags[e->kind]);
        if (stored || removed) {
            pack_str(&pk, "block_hashes");
            pack_hash_list(&pk, e->block_hashes, e->n_block_hashes);
        }
        if (stored) {
            pack_str(&pk, "parent_block_hash");
            if (e->has_parent)
                msgpack_pack_uint64(&pk, e->parent_block_hash);
            else
                msgpack_pack_nil(&pk);
            pack_str(&pk, "token_ids");
            msgpack_pack_array(&pk, e->n_token_ids);
            for (size_t k = 0; k < e->n_token_ids; k++)
                msgpack_pack_uint32(&pk, e->token_ids[k]);
            pack_str(&pk, "block_size");
            msgpack_pack_uint32(&pk, e->block_size);
            pack_str(&pk, "lora_name");
            if (e->lora_name)
                pack_str(&pk, e->lora_name);
            else
                msgpack_pack_nil(&pk);
        }
        pack_str(&pk, "medium");
        if (e->medium_gpu)
            pack_str(&pk, "GPU");
        else
            pack_str(&pk, "CPU");
        pack_str(&pk, "group_idx");
        if (e->group_idx >= 0)
            msgpack_pack_int64(&pk, e->group_idx);
        else
            msgpack_pack_nil(&pk);
    }
    pack_str(&pk, "data_parallel_rank");
    if (b->dp_rank >= 0)
        msgpack_pack_int64(&pk, b->dp_rank);
    else
        msgpack_pack_nil(&pk);
}

static bool same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static bool same_event(const sched_kvev_event_t *a, const sched_kvev_event_t *b)
{
    if (a->kind != b->kind || a->n_block_hashes != b->n_block_hashes ||
        a->medium_gpu != b->medium_gpu || a->group_idx != b->group_idx ||
        (a->n_block_hashes &&
         memcmp(a->block_hashes, b->block_hashes, a->n_block_hashes * sizeof(uint64_t)) != 0))
        return false;
    if (a->kind != SCHED_KVEV_STORED)
        return true;
    return a->has_parent == b->has_parent &&
           (!a->has_parent || a->parent_block_hash == b->parent_block_hash) &&
           a->n_token_ids == b->n_token_ids && a->block_size == b->block_size &&
           (a->n_token_ids == 0 ||
            memcmp(a->token_ids, b->token_ids, a->n_token_ids * sizeof(uint32_t)) == 0) &&
           same_str(a->lora_name, b->lora_name);
}

/* Every field of an accepted batch is in range and every array readable to its end. */
static uint64_t check_sane(const sched_kvev_batch_t *b)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < b->n_events; i++) {
        const sched_kvev_event_t *e = &b->events[i];
        if (e->kind < SCHED_KVEV_STORED || e->kind > SCHED_KVEV_CLEARED)
            abort();
        if (e->n_block_hashes > 0 && e->block_hashes == NULL)
            abort();
        for (size_t k = 0; k < e->n_block_hashes; k++)
            sum += e->block_hashes[k];
        if (e->kind == SCHED_KVEV_STORED) {
            if (e->block_size > (1u << 20) || (e->n_token_ids > 0 && e->token_ids == NULL))
                abort();
            for (size_t k = 0; k < e->n_token_ids; k++)
                sum += e->token_ids[k];
            if (e->lora_name)
                sum += strlen(e->lora_name);
        }
        if (e->group_idx < -1 || e->group_idx > INT32_MAX)
            abort();
    }
    if (b->dp_rank < -1 || b->dp_rank > INT32_MAX)
        abort();
    return sum;
}

static void apply_to_index(const sched_kvev_batch_t *b)
{
    sched_kvev_index_stats_t st;
    uint64_t keys[64];

    for (size_t i = 0; i < b->n_events; i++)
        sched_kvev_index_apply(idx, slot, &b->events[i]);
    for (size_t i = 0; i < b->n_events; i++) {
        const sched_kvev_event_t *e = &b->events[i];
        size_t n, depth;
        double w;
        uint64_t uid = 1;
        if (e->kind != SCHED_KVEV_STORED || e->block_size == 0)
            continue;
        n = sched_kvev_keys(e->token_ids, e->n_token_ids, e->block_size, e->lora_name, NULL, keys,
                            64);
        sched_kvev_index_match(idx, keys, n, &uid, 1, 0.5, &depth, &w);
        if (depth > n || w > (double)n)
            abort();
        break;
    }
    sched_kvev_index_stats(idx, &st);
    if (st.records > st.capacity)
        abort();
    sched_kvev_index_clear(idx, slot, false); /* the next input starts from an empty slot */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    sched_kvev_batch_t b, b2;
    msgpack_sbuffer sb;
    char err[128] = "";
    volatile uint64_t sink;

    memcpy(copy, data, size);
    if (sched_kvev_decode(copy, size, &b, err, sizeof(err)) != SCHED_OK) {
        if (b.n_events != 0 || b.events != NULL || b.zone_ != NULL || err[0] == '\0')
            abort();
        free(copy);
        return 0;
    }
    sink = check_sane(&b);
    (void)sink;

    encode_map(&b, &sb);
    if (sched_kvev_decode(sb.data, sb.size, &b2, err, sizeof(err)) != SCHED_OK)
        abort(); /* what was accepted, re-encoded, must be accepted */
    if (b2.n_events != b.n_events || b2.n_unknown != 0 || b2.dp_rank != b.dp_rank ||
        memcmp(&b2.ts, &b.ts, sizeof(double)) != 0)
        abort();
    for (size_t i = 0; i < b.n_events; i++)
        if (!same_event(&b.events[i], &b2.events[i]))
            abort();
    sched_kvev_batch_free(&b2);
    msgpack_sbuffer_destroy(&sb);

    apply_to_index(&b);
    sched_kvev_batch_free(&b);
    free(copy);
    return 0;
}
