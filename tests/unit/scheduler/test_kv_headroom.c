/*
 * KV headroom of decodes (scheduler/src/sched_kv_headroom.c): a decode where a request
 * would not fit is passed over while another has room, under every load-aware policy
 * (least-load, power-of-two, prefix-aware, precise-prefix without keys, slo), and counted;
 * when every decode is full the least-filled one is chosen (not refused) and counted as an
 * overcommit. Capacity comes from the descriptor, from vLLM's vllm:cache_config_info
 * (vllm/v1/metrics/loggers.py log_metrics_info: labels are vllm/config/cache.py
 * metrics_info, every value str()'d, num_gpu_blocks "None" until sized) or is learnt from
 * the scraped usage fraction.
 */
#include "sched_test_util.h"

static void add_decode(sched_pool_t *pool, const char *id, int port, unsigned weight,
                       uint64_t kv_capacity)
{
    sched_instance_desc_t d;
    char url[64], err[256];

    sched_instance_desc_init(&d);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    d.id = id;
    d.url = url;
    d.role = SCHED_ROLE_DECODE;
    d.weight = weight;
    d.kv_capacity_tokens = kv_capacity;
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
}

/* A prefill and two decodes: "small" (10,000 tokens, weight 8 so that load alone would
 * send it nearly everything) and "big" (100,000 tokens). */
static sched_pool_t *two_decodes(sched_policy_t decode_policy, uint64_t small_cap, uint64_t big_cap)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, decode_policy);
    test_add(pool, "p0", 9300, SCHED_ROLE_PREFILL, NULL, 1);
    add_decode(pool, "small", 9301, 8, small_cap);
    add_decode(pool, "big", 9302, 1, big_cap);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

/* Book <n> PD requests of 2000 + 1000 tokens without finishing them; count the decodes. */
static void hold(sched_pool_t *pool, int n, sched_booking_t **held, int *on_small)
{
    *on_small = 0;
    for (int i = 0; i < n; i++) {
        sched_request_t req = {.prompt_tokens = 2000, .max_tokens = 1000};
        assert_int_equal(sched_book_pd(pool, &req, &held[i]), SCHED_OK);
        if (strcmp(sched_instance_id(sched_booking_instance(held[i], SCHED_LEG_DECODE)), "small") ==
            0)
            (*on_small)++;
    }
}

static void release(sched_booking_t **held, int n)
{
    for (int i = 0; i < n; i++)
        sched_booking_destroy(&held[i]);
}

static void headroom_respected(sched_policy_t policy)
{
    sched_pool_t *pool = two_decodes(policy, 10000, 100000);
    sched_booking_t *held[20];
    int on_small;

    hold(pool, 20, held, &on_small);
    /* 3 x 3000 fit in 10,000, a fourth would not: the rest went to big */
    assert_int_equal(on_small, 3);
    assert_true(sched_kv_projected(test_inst(pool, "small")) <= 10000);
    assert_true(atomic_load(&test_inst(pool, "small")->kv_refusals) > 0);
    assert_int_equal(atomic_load(&test_inst(pool, "big")->kv_refusals), 0);
    assert_int_equal(atomic_load(&pool->kv_overcommit), 0);
    release(held, 20);
    /* released: room again */
    assert_int_equal(sched_kv_projected(test_inst(pool, "small")), 0);
    sched_pool_destroy(pool);
}

static void test_least_load(void **state)
{
    (void)state;
    headroom_respected(SCHED_POLICY_LEAST_LOAD);
}

static void test_prefix_aware(void **state)
{
    (void)state;
    headroom_respected(SCHED_POLICY_PREFIX_AWARE);
}

static void test_slo(void **state)
{
    (void)state;
    headroom_respected(SCHED_POLICY_SLO);
}

static void test_power_of_two(void **state)
{
    sched_pool_t *pool = two_decodes(SCHED_POLICY_POWER_OF_TWO, 10000, 100000);
    sched_booking_t *held[20];
    int on_small;

    (void)state;
    hold(pool, 20, held, &on_small);
    assert_true(on_small <= 3);
    assert_true(sched_kv_projected(test_inst(pool, "small")) <= 10000);
    release(held, 20);
    sched_pool_destroy(pool);
}

/* Without headroom the control: round-robin does not look, and overfills small. */
static void test_round_robin_control(void **state)
{
    sched_pool_t *pool = two_decodes(SCHED_POLICY_ROUND_ROBIN, 10000, 100000);
    sched_booking_t *held[20];
    int on_small;

    (void)state;
    hold(pool, 20, held, &on_small);
    assert_int_equal(on_small, 10);
    assert_true(sched_kv_projected(test_inst(pool, "small")) > 10000);
    release(held, 20);
    sched_pool_destroy(pool);
}

/* Every decode full: the least-filled is chosen (a booking, not a refusal), counted. */
static void all_full(sched_policy_t policy)
{
    sched_pool_t *pool = two_decodes(policy, 4000, 5000);
    sched_booking_t *held[3];
    sched_instance_t *third;
    int on_small;

    hold(pool, 2, held, &on_small);
    assert_int_equal(on_small, 1); /* one each: each fits once */
    assert_int_equal(atomic_load(&pool->kv_overcommit), 0);
    hold(pool, 1, &held[2], &on_small);
    third = sched_booking_instance(held[2], SCHED_LEG_DECODE);
    /* 6000 / 4000 on small against 6000 / 5000 on big: big is the least bad */
    assert_string_equal(sched_instance_id(third), "big");
    assert_int_equal(atomic_load(&pool->kv_overcommit), 1);
    release(held, 3);
    sched_pool_destroy(pool);
}

static void test_all_full_least_load(void **state)
{
    (void)state;
    all_full(SCHED_POLICY_LEAST_LOAD);
}

static void test_all_full_slo(void **state)
{
    (void)state;
    all_full(SCHED_POLICY_SLO);
}

static void test_all_full_precise_prefix(void **state)
{
    (void)state;
    all_full(SCHED_POLICY_PRECISE_PREFIX);
}

/* Unknown capacity never refuses. */
static void test_unknown_capacity(void **state)
{
    sched_pool_t *pool = two_decodes(SCHED_POLICY_LEAST_LOAD, 0, 0);
    sched_booking_t *held[20];
    int on_small;

    (void)state;
    hold(pool, 20, held, &on_small);
    assert_true(on_small > 10); /* weight 8: load alone decides */
    assert_int_equal(atomic_load(&pool->kv_overcommit), 0);
    release(held, 20);
    sched_pool_destroy(pool);
}

static void test_cache_config_info(void **state)
{
    static const char text[] =
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching="
        "\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\","
        "num_gpu_blocks=\"1000\",prefix_caching_hash_algo=\"sha256\"} 1.0\n"
        "vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"500\"} 1.0\n"
        "vllm:num_requests_running{model_name=\"m\"} 2\n";
    static const char unsized[] =
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n"
        "vllm:num_requests_running 1\n";
    static const char garbage[] = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1"
                                  "vllm:cache_config_info{num_gpu_blocks=12,block_size=\"x\"} 1\n"
                                  "vllm:cache_config_info{=\"\"} 1\n"
                                  "vllm:num_requests_running 1\n";
    sched_engine_metrics_t m;

    (void)state;
    assert_int_equal(sched_prom_parse(text, sizeof(text) - 1, &m), SCHED_OK);
    assert_true(m.have_kv_capacity);
    assert_true(m.kv_capacity_tokens == 24000.0); /* (1000 + 500) x 16, two engines */
    assert_int_equal(sched_prom_parse(unsized, sizeof(unsized) - 1, &m), SCHED_OK);
    assert_false(m.have_kv_capacity);
    assert_int_equal(sched_prom_parse(garbage, sizeof(garbage) - 1, &m), SCHED_OK);
    assert_false(m.have_kv_capacity);
    /* every prefix of the text: never reads past it */
    for (size_t n = 0; n < sizeof(text) - 1; n++)
        (void)sched_prom_parse(text, n, &m);
}

static int warnings;
static char last_warning[512];

static void capture_log(void *arg, sched_log_level_t level, const char *msg)
{
    (void)arg;
    if (level == SCHED_LOG_WARN) {
        warnings++;
        snprintf(last_warning, sizeof(last_warning), "%s", msg);
    }
}

static void test_capacity_sources(void **state)
{
    sched_pool_t *pool = two_decodes(SCHED_POLICY_LEAST_LOAD, 10000, 0);
    pool->log = capture_log; /* the warnings of a wrong declared capacity */
    sched_instance_t *small = test_inst(pool, "small"), *big = test_inst(pool, "big");
    sched_engine_metrics_t m = {.have_kv_usage = true, .kv_usage = 0.5};

    (void)state;
    assert_int_equal(atomic_load(&big->kv_capacity_source), SCHED_KV_CAP_NONE);
    /* usage too low to say anything */
    m.kv_usage = 0.05;
    sched_kv_on_scrape(pool, big, &m);
    assert_int_equal(atomic_load(&big->kv_capacity), 0);
    /* learnt: 4 x (2000 prompt + 1000 / 2 output) resident at half usage */
    atomic_store(&big->kv_tokens, 12000);
    atomic_store(&big->kv_decode_prompt, 8000);
    m.kv_usage = 0.5;
    sched_kv_on_scrape(pool, big, &m);
    assert_int_equal(atomic_load(&big->kv_capacity_source), SCHED_KV_CAP_LEARNT);
    assert_int_equal(atomic_load(&big->kv_capacity), 20000);
    assert_int_equal(atomic_load(&big->kv_engine_used), 10000);
    /* the engine's own figure wins over a learnt one, not over a declared one */
    m.have_kv_capacity = true;
    m.kv_capacity_tokens = 64000;
    sched_kv_on_scrape(pool, big, &m);
    sched_kv_on_scrape(pool, small, &m);
    assert_int_equal(atomic_load(&big->kv_capacity_source), SCHED_KV_CAP_ENGINE);
    assert_int_equal(atomic_load(&big->kv_capacity), 64000);
    assert_int_equal(atomic_load(&small->kv_capacity_source), SCHED_KV_CAP_DECLARED);
    assert_int_equal(atomic_load(&small->kv_capacity), 10000);
    /* ... and a declared figure the engine contradicts (10000 against 64000) is warned about,
     * once, naming the instance */
    assert_int_equal(warnings, 1);
    assert_non_null(strstr(last_warning, "instance small: kv_capacity_tokens 10000 declared"));
    sched_kv_on_scrape(pool, small, &m);
    assert_int_equal(warnings, 1);
    /* engine-reported use counts in the projection when above what pdgw booked */
    assert_int_equal(sched_kv_projected(big), 32000);
    sched_kv_on_stale(big);
    assert_int_equal(sched_kv_projected(big), 12000);
    sched_pool_destroy(pool);
}

static void test_metrics_and_admin(void **state)
{
    sched_pool_t *pool = two_decodes(SCHED_POLICY_LEAST_LOAD, 10000, 100000);
    sched_booking_t *held[6];
    json_t *j, *body, *created = NULL;
    char *text, err[256];
    int on_small;

    (void)state;
    hold(pool, 6, held, &on_small);
    text = sched_metrics_text(pool);
    assert_non_null(text);
    assert_non_null(strstr(text, "pdgw_decode_kv_headroom_refusals_total{instance=\"small\"} 3\n"));
    assert_non_null(strstr(text, "pdgw_decode_kv_headroom_refusals_total{instance=\"big\"} 0\n"));
    assert_non_null(strstr(text, "pdgw_instance_kv_capacity_tokens{instance=\"small\",role="
                                 "\"decode\",source=\"declared\"} 10000\n"));
    assert_non_null(strstr(
        text, "pdgw_instance_kv_projected_tokens{instance=\"small\",role=\"decode\"} 9000\n"));
    assert_non_null(strstr(text, "pdgw_decode_kv_overcommit_total 0\n"));
    free(text);
    j = sched_admin_get(pool, "small");
    assert_non_null(j);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "kv_headroom"), "capacity_tokens")),
        10000);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "kv_headroom"), "refusals")), 3);
    json_decref(j);
    release(held, 6);
    /* declared through the admin API; bad values named */
    body = json_pack("{s:s, s:s, s:s, s:I}", "id", "d3", "url", "http://127.0.0.1:9303", "role",
                     "decode", "kv_capacity_tokens", (json_int_t)32768);
    assert_int_equal(sched_admin_add(pool, body, &created, err, sizeof(err)), SCHED_OK);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(created, "kv_headroom"),
                                                        "capacity_tokens")),
                     32768);
    json_decref(created);
    json_decref(body);
    body = json_pack("{s:s, s:s, s:s, s:s}", "id", "d4", "url", "http://127.0.0.1:9304", "role",
                     "decode", "kv_capacity_tokens", "lots");
    assert_int_equal(sched_admin_add(pool, body, NULL, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "kv_capacity_tokens"));
    json_decref(body);
    body = json_pack("{s:s, s:s, s:s, s:I}", "id", "d5", "url", "http://127.0.0.1:9305", "role",
                     "decode", "kv_capacity_tokens", (json_int_t)-5);
    assert_int_equal(sched_admin_add(pool, body, NULL, err, sizeof(err)), SCHED_ERR_INVALID);
    json_decref(body);
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_load),
        cmocka_unit_test(test_prefix_aware),
        cmocka_unit_test(test_slo),
        cmocka_unit_test(test_power_of_two),
        cmocka_unit_test(test_round_robin_control),
        cmocka_unit_test(test_all_full_least_load),
        cmocka_unit_test(test_all_full_slo),
        cmocka_unit_test(test_all_full_precise_prefix),
        cmocka_unit_test(test_unknown_capacity),
        cmocka_unit_test(test_cache_config_info),
        cmocka_unit_test(test_capacity_sources),
        cmocka_unit_test(test_metrics_and_admin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
