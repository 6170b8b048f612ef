/*
 * KV-cache events as vLLM publishes them (--kv-events-config).
 *
 * Upstream (vllm-project/vllm): vllm/config/kv_events.py names the config
 * keys (enable_kv_cache_events, publisher, endpoint, replay_endpoint,
 * buffer_steps, topic); vllm/distributed/kv_events.py the wire:
 * ZmqEventPublisher sends [topic, seq as 8-byte big-endian from 0,
 * msgpack EventBatch], binds when the endpoint has a wildcard (else
 * connects), and serves replays on a ROUTER: [id, "", start seq] →
 * [id, "", seq, payload] per buffered batch, then [id, "", -1, ""];
 * vllm/v1/core/block_pool.py when: one BlockStored per newly cached run of
 * full blocks (parent = the hash before the run, token ids of the run),
 * one BlockRemoved per evicted cached block, the batch taken per step.
 * medium names the tier: "GPU" for the block pool, "CPU" for the offload
 * tier (vllm/v1/kv_offload/mediums.py CPULoadStoreSpec.medium()).
 *
 * The encoding is msgspec's, in the three shapes vLLM has shipped
 * (--kv-events-layout): "current" (the default; the wire pinned by
 * tests/v1/core/test_kv_events_contract.py: batch [ts, events, dp_rank],
 * event {"type": "Tag", ...}), "map" (batch {ts, events,
 * data_parallel_rank}, maps too) and "array" (older array_like structs:
 * event ["Tag", fields...]). Defaulted fields are omitted as omit_defaults
 * does. Hooks are called under the engine lock; the replay ROUTER has a
 * thread of its own.
 *
 * A GPU BlockStored of a prompt carries what current vLLM's block pool
 * adds (vllm/v1/core/block_pool.py, cache_full_blocks): extra_keys, one
 * entry per block, nil or the tuple folded into that block's hash
 * (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: the
 * request's cache_salt on the first block only; this engine serves no
 * LoRA adapter and no multimodal input), and group_idx with the group's
 * kv_cache_spec_kind (one full-attention group, 0). The array layout keeps
 * the older 7 fields.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <msgpack.h>
#include <zmq.h>

#include "sim_int.h"

static void *ctx, *pub, *router;
static int enabled, map_layout, map_batch; /* events as maps; the batch as a map */
static char topic[256];
static uint64_t next_seq;
static atomic_ullong batches_published; /* read by /metrics on any thread */

/* events of the current step, packed; count kept aside */
static msgpack_sbuffer pending;
static msgpack_packer pk;
static size_t n_pending;

/* replay buffer: the last buffer_steps batches */
typedef struct sent {
    uint64_t seq;
    char *data;
    size_t len;
} sent_t;
static sent_t *ring;
static size_t ring_cap, ring_len, ring_head;
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t replay_thread;
static volatile int stopping, replay_started;

static void pack_str(const char *s)
{
    msgpack_pack_str_with_body(&pk, s, strlen(s));
}

static void pack_key(const char *k)
{
    if (map_layout)
        pack_str(k);
}

/* <salt_first>: the stored run starts at the prompt's first block (the one whose extra keys
 * hold the salt); <with_extra>: current vLLM's defaulted fields (map layouts only). */
static void pack_stored(const char *medium, int has_parent, uint64_t parent, const uint64_t *hashes,
                        size_t n, const uint32_t *tokens, int block_size, const char *salt,
                        int with_extra)
{
    int extra = with_extra && map_layout;

    if (!enabled || n == 0)
        return;
    /* BlockStored fields without defaults: block_hashes, parent_block_hash,
     * token_ids, block_size, lora_id, medium, lora_name */
    if (map_layout) {
        msgpack_pack_map(&pk, extra ? 11 : 8);
        pack_str("type");
    } else {
        msgpack_pack_array(&pk, 8);
    }
    pack_str("BlockStored");
    pack_key("block_hashes");
    msgpack_pack_array(&pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, hashes[i]);
    pack_key("parent_block_hash");
    if (has_parent)
        msgpack_pack_uint64(&pk, parent);
    else
        msgpack_pack_nil(&pk);
    pack_key("token_ids");
    msgpack_pack_array(&pk, (uint32_t)(n * (size_t)block_size));
    for (size_t i = 0; i < n * (size_t)block_size; i++)
        msgpack_pack_uint32(&pk, tokens[i]);
    pack_key("block_size");
    msgpack_pack_int(&pk, block_size);
    pack_key("lora_id");
    msgpack_pack_nil(&pk);
    pack_key("medium");
    pack_str(medium);
    pack_key("lora_name");
    msgpack_pack_nil(&pk);
    if (extra) {
        /* one entry per block: the salt tuple on the prompt's first block, else nil (vLLM
         * sends the list whenever the run has blocks, nil entries included) */
        pack_str("extra_keys");
        msgpack_pack_array(&pk, (uint32_t)n);
        for (size_t i = 0; i < n; i++) {
            if (i == 0 && salt) {
                msgpack_pack_array(&pk, 1);
                pack_str(salt);
            } else {
                msgpack_pack_nil(&pk);
            }
        }
        pack_str("group_idx");
        msgpack_pack_int(&pk, 0);
        pack_str("kv_cache_spec_kind");
        pack_str("full_attention");
    }
    n_pending++;
}

void sim_kvev_stored(const char *medium, int has_parent, uint64_t parent, const uint64_t *hashes,
                     size_t n, const uint32_t *tokens, int block_size)
{
    pack_stored(medium, has_parent, parent, hashes, n, tokens, block_size, NULL, 0);
}

void sim_kvev_stored_prompt(int has_parent, uint64_t parent, const uint64_t *hashes, size_t n,
                            const sim_tokens_t *prompt, size_t first_block, int block_size)
{
    const char *salt = first_block == 0 ? prompt->cache_salt : NULL;

    pack_stored("GPU", has_parent, parent, hashes, n,
                prompt->ids + first_block * (size_t)block_size, block_size, salt, 1);
}

void sim_kvev_removed(const char *medium, uint64_t hash)
{
    if (!enabled)
        return;
    if (map_layout) {
        msgpack_pack_map(&pk, 3);
        pack_str("type");
    } else {
        msgpack_pack_array(&pk, 3);
    }
    pack_str("BlockRemoved");
    pack_key("block_hashes");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, hash);
    pack_key("medium");
    pack_str(medium);
    n_pending++;
}

static void be64(uint64_t v, unsigned char out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (56 - 8 * i));
}

void sim_kvev_flush(void)
{
    msgpack_sbuffer batch;
    msgpack_packer bp;
    struct timespec ts;
    unsigned char seq[8];
    sent_t *slot;

    if (!enabled || n_pending == 0)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_sbuffer_init(&batch);
    msgpack_packer_init(&bp, &batch, msgpack_sbuffer_write);
    if (map_batch) {
        msgpack_pack_map(&bp, 3);
        msgpack_pack_str_with_body(&bp, "ts", 2);
    } else {
        msgpack_pack_array(&bp, 3);
    }
    msgpack_pack_double(&bp, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    if (map_batch)
        msgpack_pack_str_with_body(&bp, "events", 6);
    msgpack_pack_array(&bp, (uint32_t)n_pending);
    msgpack_sbuffer_write(&batch, pending.data, pending.size);
    if (map_batch)
        msgpack_pack_str_with_body(&bp, "data_parallel_rank", 18);
    msgpack_pack_int(&bp, 0);
    msgpack_sbuffer_clear(&pending);
    n_pending = 0;

    be64(next_seq, seq);
    zmq_send(pub, topic, strlen(topic), ZMQ_SNDMORE);
    zmq_send(pub, seq, 8, ZMQ_SNDMORE);
    zmq_send(pub, batch.data, batch.size, 0);

    pthread_mutex_lock(&ring_mu);
    slot = &ring[(ring_head + ring_len) % ring_cap];
    if (ring_len == ring_cap) {
        free(ring[ring_head].data);
        ring_head = (ring_head + 1) % ring_cap;
        ring_len--;
    }
    slot->seq = next_seq;
    slot->len = batch.size;
    slot->data = msgpack_sbuffer_release(&batch); /* ownership moves to the ring */
    ring_len++;
    pthread_mutex_unlock(&ring_mu);
    msgpack_sbuffer_destroy(&batch);
    next_seq++;
    atomic_fetch_add(&batches_published, 1);
}

unsigned long long sim_kvev_published(void)
{
    return atomic_load(&batches_published);
}

static void serve_replay(void)
{
    zmq_msg_t f[3];
    int n = 0, more = 1;
    unsigned char end[8];
    uint64_t start = 0;

    while (more) {
        size_t sz = sizeof(more);
        zmq_msg_t tmp, *m = n < 3 ? &f[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, router, 0) < 0) {
            zmq_msg_close(m);
            break;
        }
        zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz);
        if (m == &tmp)
            zmq_msg_close(m);
        n++;
    }
    if (n != 3 || zmq_msg_size(&f[2]) != 8) {
        fprintf(stderr, "pdgw-sim: invalid KV-event replay request (%d frames)\n", n);
        goto out;
    }
    for (int i = 0; i < 8; i++)
        start = (start << 8) | ((unsigned char *)zmq_msg_data(&f[2]))[i];
    pthread_mutex_lock(&ring_mu);
    for (size_t i = 0; i < ring_len; i++) {
        sent_t *s = &ring[(ring_head + i) % ring_cap];
        unsigned char seq[8];
        if (s->seq < start)
            continue;
        be64(s->seq, seq);
        zmq_send(router, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), ZMQ_SNDMORE);
        zmq_send(router, "", 0, ZMQ_SNDMORE);
        zmq_send(router, seq, 8, ZMQ_SNDMORE);
        zmq_send(router, s->data, s->len, 0);
    }
    pthread_mutex_unlock(&ring_mu);
    memset(end, 0xff, sizeof(end));
    zmq_send(router, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), ZMQ_SNDMORE);
    zmq_send(router, "", 0, ZMQ_SNDMORE);
    zmq_send(router, end, 8, ZMQ_SNDMORE);
    zmq_send(router, "", 0, 0);
out:
    for (int i = 0; i < n && i < 3; i++)
        zmq_msg_close(&f[i]);
}

static void *replay_main(void *arg)
{
    (void)arg;
    while (!stopping) {
        zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) > 0)
            serve_replay();
    }
    return NULL;
}

/* vLLM's heuristic: bind when the address is a wildcard or local transport. */
static int bind_or_connect(void *sock, const char *ep)
{
    if (strchr(ep, '*') || strstr(ep, "::") || strncmp(ep, "ipc://", 6) == 0 ||
        strncmp(ep, "inproc://", 9) == 0)
        return zmq_bind(sock, ep);
    return zmq_connect(sock, ep);
}

int sim_kvev_configure(const char *json_text, const char *layout)
{
    json_error_t jerr;
    json_t *cfg, *v;
    const char *endpoint = "tcp://*:5557", *replay = NULL, *publisher = NULL;
    long buffer_steps = 10000;
    int rc = -1;

    if (layout && strcmp(layout, "current") != 0 && strcmp(layout, "map") != 0 &&
        strcmp(layout, "array") != 0) {
        fprintf(stderr, "pdgw-sim: --kv-events-layout: current, map or array\n");
        return -1;
    }
    map_layout = !layout || strcmp(layout, "array") != 0;
    map_batch = layout && strcmp(layout, "map") == 0;
    if (!json_text)
        return 0;
    cfg = json_loads(json_text, 0, &jerr);
    if (!cfg || !json_is_object(cfg)) {
        fprintf(stderr, "pdgw-sim: --kv-events-config: not a JSON object\n");
        json_decref(cfg);
        return -1;
    }
    v = json_object_get(cfg, "enable_kv_cache_events");
    enabled = json_is_true(v);
    if ((v = json_object_get(cfg, "publisher")) && json_is_string(v))
        publisher = json_string_value(v);
    if (publisher && strcmp(publisher, "zmq") != 0) {
        enabled = 0; /* "null": no events */
        if (strcmp(publisher, "null") != 0) {
            fprintf(stderr, "pdgw-sim: --kv-events-config: publisher %s unsupported\n", publisher);
            goto out;
        }
    }
    if ((v = json_object_get(cfg, "endpoint")) && json_is_string(v))
        endpoint = json_string_value(v);
    if ((v = json_object_get(cfg, "replay_endpoint")) && json_is_string(v))
        replay = json_string_value(v);
    if ((v = json_object_get(cfg, "buffer_steps")) && json_is_integer(v))
        buffer_steps = (long)json_integer_value(v);
    if ((v = json_object_get(cfg, "topic")) && json_is_string(v))
        snprintf(topic, sizeof(topic), "%s", json_string_value(v));
    if (!enabled) {
        rc = 0;
        goto out;
    }
    ring_cap = buffer_steps > 0 && buffer_steps < 1000000 ? (size_t)buffer_steps : 10000;
    ring = calloc(ring_cap, sizeof(*ring));
    ctx = zmq_ctx_new();
    pub = ctx ? zmq_socket(ctx, ZMQ_PUB) : NULL;
    if (!ring || !pub || bind_or_connect(pub, endpoint) != 0) {
        fprintf(stderr, "pdgw-sim: KV events: cannot open %s: %s\n", endpoint,
                zmq_strerror(zmq_errno()));
        goto out;
    }
    if (replay) {
        router = zmq_socket(ctx, ZMQ_ROUTER);
        if (!router || zmq_bind(router, replay) != 0) {
            fprintf(stderr, "pdgw-sim: KV events: cannot bind replay %s: %s\n", replay,
                    zmq_strerror(zmq_errno()));
            goto out;
        }
        if (pthread_create(&replay_thread, NULL, replay_main, NULL) != 0)
            goto out;
        replay_started = 1;
    }
    msgpack_sbuffer_init(&pending);
    msgpack_packer_init(&pk, &pending, msgpack_sbuffer_write);
    rc = 0;
out:
    json_decref(cfg);
    return rc;
}

void sim_kvev_stop(void)
{
    int zero = 0;

    stopping = 1;
    if (replay_started)
        pthread_join(replay_thread, NULL);
    replay_started = 0;
    if (pub) {
        zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_close(pub);
    }
    if (router) {
        zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_close(router);
    }
    if (ctx)
        zmq_ctx_term(ctx);
    pub = router = ctx = NULL;
    for (size_t i = 0; i < ring_len; i++)
        free(ring[(ring_head + i) % ring_cap].data);
    free(ring);
    ring = NULL;
    if (enabled)
        msgpack_sbuffer_destroy(&pending);
    enabled = 0;
}
