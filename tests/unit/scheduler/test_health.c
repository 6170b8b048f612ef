/*
 * Health probes and metric scrapes against fake engines (libmicrohttpd on
 * ephemeral ports), stale scrapes falling back to local accounting, and
 * the Prometheus text reader.
 */
#include <microhttpd.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "sched_test_util.h"

typedef struct fake_engine {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    int health_status;
    int metrics_status;
    char metrics[1024];
    int health_hits, metrics_hits;
} fake_engine_t;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    fake_engine_t *e = cls;
    struct MHD_Response *r;
    enum MHD_Result ret;
    char body[1024];
    int status;

    (void)method;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;
    pthread_mutex_lock(&e->mu);
    if (strcmp(url, "/health") == 0) {
        e->health_hits++;
        status = e->health_status;
        snprintf(body, sizeof(body), "%s", status == 200 ? "ok" : "unhealthy");
    } else if (strcmp(url, "/metrics") == 0) {
        e->metrics_hits++;
        status = e->metrics_status;
        snprintf(body, sizeof(body), "%s", e->metrics);
    } else {
        status = 404;
        snprintf(body, sizeof(body), "not found");
    }
    pthread_mutex_unlock(&e->mu);
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static void engine_start(fake_engine_t *e, int port)
{
    const union MHD_DaemonInfo *info;

    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->mu, NULL);
    e->health_status = 200;
    e->metrics_status = 200;
    e->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL, on_request,
                            e, MHD_OPTION_END);
    assert_non_null(e->d);
    info = MHD_get_daemon_info(e->d, MHD_DAEMON_INFO_BIND_PORT);
    e->port = info->port;
}

static void engine_stop(fake_engine_t *e)
{
    if (e->d)
        MHD_stop_daemon(e->d);
    e->d = NULL;
}

static void engine_set(fake_engine_t *e, int health, int metrics_status, const char *metrics)
{
    pthread_mutex_lock(&e->mu);
    e->health_status = health;
    e->metrics_status = metrics_status;
    if (metrics)
        snprintf(e->metrics, sizeof(e->metrics), "%s", metrics);
    pthread_mutex_unlock(&e->mu);
}

static int engine_hits(fake_engine_t *e, bool health)
{
    int n;

    pthread_mutex_lock(&e->mu);
    n = health ? e->health_hits : e->metrics_hits;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        uint64_t deadline_ = wall_ms() + 5000;                                                     \
        while (!(cond) && wall_ms() < deadline_)                                                   \
            usleep(5000);                                                                          \
        assert_true(cond);                                                                         \
    } while (0)

static sched_pool_t *live_pool(void)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;

    sched_config_init(&cfg);
    cfg.log = test_quiet_log;
    cfg.health_interval_ms = 40;
    cfg.health_timeout_ms = 500;
    cfg.healthy_threshold = 1;
    cfg.unhealthy_threshold = 2;
    cfg.metrics_scrape_interval_ms = 40;
    cfg.metrics_stale_ms = 300;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

static sched_state_t state_of(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);
    sched_state_t st = sched_instance_state(inst);

    sched_instance_unref(inst);
    return st;
}

static void test_probe_down_up(void **state)
{
    fake_engine_t e;
    sched_pool_t *pool;
    json_t *j;
    int port;

    (void)state;
    engine_start(&e, 0);
    port = e.port;
    pool = live_pool();
    test_add(pool, "e0", e.port, SCHED_ROLE_BOTH, "", 1);
    WAIT_FOR(engine_hits(&e, true) >= 2);
    assert_int_equal(state_of(pool, "e0"), SCHED_STATE_UP);

    /* 503 on /health: down after two probes, with the reason kept */
    engine_set(&e, 503, 200, NULL);
    WAIT_FOR(state_of(pool, "e0") == SCHED_STATE_DOWN);
    assert_false(sched_pool_ready(pool, SCHED_ROLE_BOTH));
    j = sched_admin_get(pool, "e0");
    assert_string_equal(json_string_value(json_object_get(j, "state")), "down");
    assert_non_null(strstr(json_string_value(json_object_get(j, "last_error")), "HTTP 503"));
    json_decref(j);
    engine_set(&e, 200, 200, NULL);
    WAIT_FOR(state_of(pool, "e0") == SCHED_STATE_UP);
    assert_true(sched_pool_ready(pool, SCHED_ROLE_BOTH));

    /* killed: connection refused → down; restarted on the same port → up */
    engine_stop(&e);
    WAIT_FOR(state_of(pool, "e0") == SCHED_STATE_DOWN);
    {
        char *text = sched_metrics_text(pool);
        assert_non_null(strstr(text, "pdgw_instance_healthy{instance=\"e0\",role=\"both\"} 0\n"));
        free(text);
    }
    engine_start(&e, port);
    WAIT_FOR(state_of(pool, "e0") == SCHED_STATE_UP);
    sched_pool_destroy(pool);
    engine_stop(&e);
}

static const char *const busy_metrics =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n";

static void test_scrape_and_stale_fallback(void **state)
{
    fake_engine_t a, b;
    sched_pool_t *pool;
    sched_request_t req = {0};
    sched_booking_t *bk = NULL;
    sched_instance_t *ia;
    json_t *j, *scraped;

    (void)state;
    engine_start(&a, 0);
    engine_start(&b, 0);
    engine_set(&a, 200, 200, busy_metrics);
    engine_set(&b, 200, 200, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n");
    pool = live_pool();
    test_add(pool, "a", a.port, SCHED_ROLE_DECODE, "", 1);
    test_add(pool, "b", b.port, SCHED_ROLE_DECODE, "", 1);
    ia = test_inst(pool, "a");
    WAIT_FOR(sched_scraped_reqs(ia) == 5000);
    assert_int_equal(sched_scraped_extra(ia), 2000 + 2000);
    /* max(0 local, 5 scraped) + 2 waiting + 0.5 × 4 KV + 1 */
    assert_int_equal(sched_instance_score(ia, 0), 10000);
    j = sched_admin_get(pool, "a");
    scraped = json_object_get(json_object_get(j, "load"), "scraped");
    assert_true(json_real_value(json_object_get(scraped, "running")) == 3.0);
    assert_true(json_real_value(json_object_get(scraped, "waiting")) == 2.0);
    assert_true(json_real_value(json_object_get(scraped, "kv_cache_usage")) == 0.5);
    assert_false(json_is_true(json_object_get(scraped, "stale")));
    json_decref(j);
    /* least-load sees the engine's own queue: b wins although both are idle locally */
    for (int i = 0; i < 10; i++) {
        assert_int_equal(sched_book_decode(pool, &req, &bk), SCHED_OK);
        assert_string_equal(sched_instance_id(sched_booking_instance(bk, SCHED_LEG_DECODE)), "b");
        sched_booking_destroy(&bk);
    }

    /* scrapes start failing: after metrics_stale_ms only local accounting counts */
    engine_set(&a, 200, 500, NULL);
    WAIT_FOR(sched_scraped_reqs(ia) == 0 && sched_scraped_extra(ia) == 0);
    assert_int_equal(sched_instance_score(ia, 0), 1000);
    j = sched_admin_get(pool, "a");
    scraped = json_object_get(json_object_get(j, "load"), "scraped");
    assert_true(json_is_true(json_object_get(scraped, "stale")));
    json_decref(j);
    assert_int_equal(state_of(pool, "a"), SCHED_STATE_UP); /* metrics failures are not health */
    sched_pool_destroy(pool);
    engine_stop(&a);
    engine_stop(&b);
}

static void test_prom_reader(void **state)
{
    sched_engine_metrics_t m;
    const char *old = "# old name only\n"
                      "vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.25\n"
                      "vllm:num_requests_running{model_name=\"x\",dp=\"0\"} 4\n"
                      "vllm:num_requests_running{model_name=\"x\",dp=\"1\"} 6 1700000000000\n"
                      "vllm:num_requests_waiting{le=\"a}b\\\"c\"} 1e1\n"
                      "garbage line without value\n"
                      "vllm:num_requests_waiting NaN\n"
                      "vllm:num_requests_running_extra 100\n";
    const char *both = "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n";

    (void)state;
    assert_int_equal(sched_prom_parse(old, strlen(old), &m), SCHED_OK);
    assert_true(m.running == 10.0);
    assert_true(m.waiting == 10.0);
    assert_true(m.kv_usage == 0.25); /* fallback name */
    assert_int_equal(sched_prom_parse(both, strlen(both), &m), SCHED_OK);
    assert_true(m.kv_usage == 0.1); /* the current name wins */
    assert_int_equal(sched_prom_parse("foo 1\n", 6, &m), SCHED_ERR_NOT_FOUND);
    /* truncated input never reads past len */
    assert_int_equal(sched_prom_parse("vllm:num_requests_running{a=\"", 29, &m),
                     SCHED_ERR_NOT_FOUND);
    assert_int_equal(sched_prom_parse("vllm:num_requests_running 7", 27, &m), SCHED_OK);
    assert_true(m.running == 7.0);
}

/* SGLang's names (upstream python/sglang/srt/metrics/collector.py,
 * SchedulerMetricsCollector): sglang:num_running_reqs, sglang:num_queue_reqs,
 * sglang:token_usage (a 0..1 fraction of the KV token pool) and, in PD mode, the
 * prealloc / transfer queues of requests that do not run yet. One sample per rank. */
static void test_prom_reader_sglang(void **state)
{
    sched_engine_metrics_t m;
    const char *l = "{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\","
                    "moe_ep_rank=\"0\"}";
    char text[2048];
    (void)state;
    snprintf(text, sizeof(text),
             "# TYPE sglang:num_running_reqs gauge\n"
             "sglang:num_running_reqs%s 5.0\n"
             "sglang:num_queue_reqs%s 2.0\n"
             "sglang:num_decode_prealloc_queue_reqs%s 1.0\n"
             "sglang:num_decode_transfer_queue_reqs%s 3.0\n"
             "sglang:num_prefill_inflight_queue_reqs%s 40.0\n"
             "sglang:token_usage%s 0.30\n"
             "sglang:token_usage%s 0.45\n"
             "sglang:num_used_tokens%s 9000\n",
             l, l, l, l, l, l, l, l);
    assert_int_equal(sched_prom_parse(text, strlen(text), &m), SCHED_OK);
    assert_true(m.running == 5.0);
    assert_true(m.waiting == 6.0); /* queue + prealloc + transfer; inflight = already sent */
    assert_true(m.kv_usage == 0.45);
    assert_true(m.have_running && m.have_waiting && m.have_kv_usage);
    assert_int_equal(sched_prom_parse("sglang:num_used_tokens 9\n", 25, &m), SCHED_ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prom_reader),
        cmocka_unit_test(test_prom_reader_sglang),
        cmocka_unit_test(test_probe_down_up),
        cmocka_unit_test(test_scrape_and_stale_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
