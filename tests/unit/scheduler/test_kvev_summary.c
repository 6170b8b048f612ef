/*
 * The scheduler's public face for a caller that reads engines itself (the engine doctor):
 * sched_kvev_summarize (pdsched/kvev.h) over whole KV-event messages framed as they arrive,
 * and the engine metric names of pdsched/engine_metrics.h.
 *
 * Payloads are the golden vectors of kvev_vectors.py and kvev_vectors_current.py (encoded by
 * python3-msgpack; both name their upstream files), plus batches of several block sizes
 * packed the same way here. The framing is upstream's vllm/distributed/kv_events.py
 * (ZmqEventPublisher): live messages are (topic, 8-byte big-endian seq, payload); the replay
 * ROUTER answers (empty, seq, payload) per buffered batch, then (empty, seq -1, b"").
 * Metric names: vLLM vllm/v1/metrics/loggers.py (vllm:num_requests_running,
 * vllm:num_requests_waiting, vllm:kv_cache_usage_perc, the older vllm:gpu_cache_usage_perc),
 * SGLang python/sglang/srt/metrics/collector.py (sglang:num_running_reqs,
 * sglang:num_queue_reqs, sglang:token_usage and its PD queue gauges).
 */
#include <pdsched/engine_metrics.h>
#include <pdsched/kvev.h>

#include <unistd.h>

#include "kvev_vectors.h"
#include "sched_test_util.h"

static kvev_vec_t vecs[16];
static size_t n_vecs;

static const char MIXED_PY[] =
    "import msgpack\n"
    "def st(h, bs):\n"
    "    return {'type': 'BlockStored', 'block_hashes': [h], 'parent_block_hash': None,\n"
    "            'token_ids': list(range(bs)), 'block_size': bs, 'lora_id': None,\n"
    "            'medium': 'GPU', 'lora_name': None}\n"
    "two = {'ts': 1.0, 'events': [st(1, 16), st(2, 32), st(3, 16)], 'data_parallel_rank': 3}\n"
    "six = {'ts': 1.0, 'events': [st(i, 8 * i) for i in range(1, 7)]}\n"
    "print('mixed2', msgpack.packb(two, use_bin_type=True).hex())\n"
    "print('mixed6', msgpack.packb(six, use_bin_type=True).hex())\n";

static const kvev_vec_t *vec(const char *name)
{
    if (n_vecs == 0) {
        char script[] = "/tmp/pdgw-kvev-summary-XXXXXX", cmd[128];
        int fd;
        kvev_vectors_script("kvev_vectors.py", vecs, 16, &n_vecs);
        kvev_vectors_script("kvev_vectors_current.py", vecs, 16, &n_vecs);
        fd = mkstemp(script);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, MIXED_PY, sizeof(MIXED_PY) - 1),
                         (ssize_t)(sizeof(MIXED_PY) - 1));
        close(fd);
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s", script);
        kvev_vectors_run(cmd, vecs, 16, &n_vecs);
        unlink(script);
        assert_int_equal(n_vecs, 12);
    }
    for (size_t i = 0; i < n_vecs; i++)
        if (strcmp(vecs[i].name, name) == 0)
            return &vecs[i];
    fail_msg("no vector %s", name);
    return NULL;
}

static void be64(unsigned char *out, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* A live message (topic, seq, payload of vector <name>) summarized. */
static sched_status_t live(const char *name, uint64_t seq, sched_kvev_summary_t *s)
{
    const kvev_vec_t *v = vec(name);
    unsigned char sb[8];
    sched_kvev_frame_t f[3] = {{"kv", 2}, {sb, 8}, {v->buf, v->len}};
    be64(sb, seq);
    return sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 3, s);
}

static void test_map_batch(void **state)
{
    sched_kvev_summary_t s;
    (void)state;
    assert_int_equal(live("map", 41, &s), SCHED_OK);
    assert_string_equal(s.error, "");
    assert_false(s.replay_end);
    assert_int_equal(s.seq, 41);
    assert_false(s.has_publisher_id);
    assert_int_equal(s.n_events, 4);
    assert_int_equal(s.n_stored, 2);
    assert_int_equal(s.n_removed, 1);
    assert_int_equal(s.n_cleared, 1);
    assert_int_equal(s.n_block_sizes, 1);
    assert_int_equal(s.block_sizes[0], 4);
    assert_int_equal(s.dp_rank, 2);
}

static void test_array_batches(void **state)
{
    sched_kvev_summary_t s;
    (void)state;
    /* older vLLM: [ts, [["BlockStored", ...], ...], dp_rank] */
    assert_int_equal(live("array", 0, &s), SCHED_OK);
    assert_int_equal(s.n_stored, 2);
    assert_int_equal(s.n_removed, 1);
    assert_int_equal(s.n_cleared, 1);
    assert_int_equal(s.block_sizes[0], 4);
    assert_int_equal(s.dp_rank, 2);
    /* current vLLM: an array batch of map events, rank 1 */
    assert_int_equal(live("arraymap", 1, &s), SCHED_OK);
    assert_int_equal(s.n_events, 3);
    assert_int_equal(s.n_block_sizes, 1);
    assert_int_equal(s.block_sizes[0], 4);
    assert_int_equal(s.dp_rank, 1);
    /* a fourth batch element (a publisher id) is ignored */
    assert_int_equal(live("trailing", 2, &s), SCHED_OK);
    assert_int_equal(s.n_removed, 1);
    assert_int_equal(s.dp_rank, 0);
}

static void test_no_rank_unknown_event(void **state)
{
    sched_kvev_summary_t s;
    (void)state;
    assert_int_equal(live("bytes", 0, &s), SCHED_OK);
    assert_int_equal(s.dp_rank, -1); /* absent */
    assert_int_equal(s.n_removed, 1);
    assert_int_equal(s.n_block_sizes, 0);
    assert_int_equal(live("unknown", 0, &s), SCHED_OK);
    assert_int_equal(s.n_unknown, 1);
    assert_int_equal(s.n_cleared, 1);
}

static void test_block_sizes(void **state)
{
    sched_kvev_summary_t s;
    (void)state;
    assert_int_equal(live("mixed2", 0, &s), SCHED_OK);
    assert_int_equal(s.n_stored, 3);
    assert_int_equal(s.n_block_sizes, 2);
    assert_int_equal(s.block_sizes[0], 16);
    assert_int_equal(s.block_sizes[1], 32);
    assert_int_equal(s.dp_rank, 3);
    /* more distinct sizes than kept: the first ones, and the count */
    assert_int_equal(live("mixed6", 0, &s), SCHED_OK);
    assert_int_equal(s.n_block_sizes, 6);
    assert_int_equal(s.block_sizes[0], 8);
    assert_int_equal(s.block_sizes[3], 32);
}

static void test_replay(void **state)
{
    const kvev_vec_t *v = vec("map");
    unsigned char sb[24] = {0}, end[8];
    sched_kvev_summary_t s;
    (void)state;

    be64(sb, 7);
    {
        sched_kvev_frame_t f[3] = {{"", 0}, {sb, 8}, {v->buf, v->len}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_REPLAY, f, 3, &s), SCHED_OK);
        assert_false(s.replay_end);
        assert_int_equal(s.seq, 7);
        assert_int_equal(s.n_events, 4);
    }
    {
        /* with the topic before seq, and the 24-byte frame naming the publisher */
        sched_kvev_frame_t f[4] = {{"", 0}, {"kv", 2}, {sb, 24}, {v->buf, v->len}};
        memset(sb + 8, 0xAB, 16);
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_REPLAY, f, 4, &s), SCHED_OK);
        assert_true(s.has_publisher_id);
        assert_int_equal(s.seq, 7);
        assert_int_equal(s.dp_rank, 2);
    }
    memset(end, 0xFF, sizeof(end));
    {
        sched_kvev_frame_t f[3] = {{"", 0}, {end, 8}, {"", 0}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_REPLAY, f, 3, &s), SCHED_OK);
        assert_true(s.replay_end);
        assert_int_equal(s.n_events, 0);
        /* seq -1 on the live socket is no end marker: its empty payload is refused */
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 3, &s), SCHED_ERR_INVALID);
        assert_false(s.replay_end);
        assert_non_null(strstr(s.error, "payload"));
    }
}

static void test_bad_framing(void **state)
{
    const kvev_vec_t *v = vec("map");
    unsigned char sb[8] = {0};
    static const unsigned char junk[] = {0xC1, 0x00, 0x01};
    sched_kvev_summary_t s;
    (void)state;
    {
        sched_kvev_frame_t f[2] = {{sb, 8}, {v->buf, v->len}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 2, &s), SCHED_ERR_INVALID);
        assert_non_null(strstr(s.error, "2 frame(s)"));
    }
    {
        sched_kvev_frame_t f[3] = {{"kv", 2}, {sb, 7}, {v->buf, v->len}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 3, &s), SCHED_ERR_INVALID);
        assert_non_null(strstr(s.error, "7 bytes"));
    }
    {
        sched_kvev_frame_t f[3] = {{"x", 1}, {sb, 8}, {v->buf, v->len}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_REPLAY, f, 3, &s), SCHED_ERR_INVALID);
        assert_non_null(strstr(s.error, "empty frame"));
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_REPLAY, f, 5, &s), SCHED_ERR_INVALID);
    }
    {
        sched_kvev_frame_t f[3] = {{"kv", 2}, {sb, 8}, {junk, sizeof(junk)}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 3, &s), SCHED_ERR_INVALID);
        assert_true(strncmp(s.error, "payload: ", 9) == 0);
        assert_true(strlen(s.error) > 9);
        assert_int_equal(s.n_events, 0);
        assert_int_equal(s.dp_rank, -1);
    }
    /* a truncated golden payload */
    {
        sched_kvev_frame_t f[3] = {{"kv", 2}, {sb, 8}, {v->buf, v->len / 2}};
        assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, f, 3, &s), SCHED_ERR_INVALID);
    }
    assert_int_equal(sched_kvev_summarize(SCHED_KVEV_FROM_PUB, NULL, 3, &s), SCHED_ERR_INVALID);
}

/* Every engine has a main name for every gauge, and the scrape parser reads every name of
 * the table into the gauge the table says. */
static void test_metric_names(void **state)
{
    size_t n, i;
    const sched_engine_metric_t *m = sched_engine_metric_names(&n);
    int mains[2][SCHED_GAUGE_COUNT_] = {{0}};
    bool seen_gpu = false, seen_token_usage = false;
    (void)state;

    assert_true(n >= 6);
    for (i = 0; i < n; i++) {
        char line[160];
        sched_engine_metrics_t em;
        assert_true((unsigned)m[i].engine < 2);
        assert_true((unsigned)m[i].gauge < SCHED_GAUGE_COUNT_);
        assert_non_null(strchr(m[i].name, ':'));
        if (m[i].use == SCHED_METRIC_MAIN)
            mains[m[i].engine][m[i].gauge]++;
        seen_gpu |= strcmp(m[i].name, "vllm:gpu_cache_usage_perc") == 0 &&
                    m[i].use == SCHED_METRIC_FALLBACK;
        seen_token_usage |= strcmp(m[i].name, "sglang:token_usage") == 0;
        snprintf(line, sizeof(line), "%s{model_name=\"m\"} 0.5\n", m[i].name);
        assert_int_equal(sched_prom_parse(line, strlen(line), &em), SCHED_OK);
        switch (m[i].gauge) {
        case SCHED_GAUGE_RUNNING:
            assert_true(em.have_running && !em.have_waiting && !em.have_kv_usage);
            break;
        case SCHED_GAUGE_WAITING:
            assert_true(!em.have_running && em.have_waiting && !em.have_kv_usage);
            break;
        default:
            assert_true(!em.have_running && !em.have_waiting && em.have_kv_usage);
            assert_true(em.kv_usage == 0.5);
            break;
        }
    }
    for (i = 0; i < SCHED_GAUGE_COUNT_; i++) {
        assert_int_equal(mains[SCHED_ENGINE_VLLM][i], 1);
        assert_int_equal(mains[SCHED_ENGINE_SGLANG][i], 1);
        assert_string_not_equal(sched_engine_gauge_name((sched_engine_gauge_t)i), "?");
    }
    assert_true(seen_gpu);
    assert_true(seen_token_usage);
    assert_string_equal(sched_engine_gauge_name(SCHED_GAUGE_COUNT_), "?");
    assert_string_equal(sched_engine_kind_name(SCHED_ENGINE_SGLANG), "SGLang");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_batch),
        cmocka_unit_test(test_array_batches),
        cmocka_unit_test(test_no_rank_unknown_event),
        cmocka_unit_test(test_block_sizes),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_bad_framing),
        cmocka_unit_test(test_metric_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
