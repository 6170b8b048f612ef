/* DNS discovery through an injectable resolver: join, drain, removal when idle, errors. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "sched_test_util.h"

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *fake_addrs[8];
static size_t fake_n;
static bool fake_fail;
static int fake_calls;
static char fake_last_host[64];

static sched_status_t fake_resolve(void *arg, const char *host, sched_addr_t *addrs, size_t max,
                                   size_t *n_out)
{
    sched_status_t st = SCHED_OK;

    (void)arg;
    pthread_mutex_lock(&fake_mu);
    fake_calls++;
    snprintf(fake_last_host, sizeof(fake_last_host), "%s", host);
    if (fake_fail) {
        st = SCHED_ERR_IO;
    } else {
        size_t n = fake_n < max ? fake_n : max;
        for (size_t i = 0; i < n; i++)
            snprintf(addrs[i].ip, sizeof(addrs[i].ip), "%s", fake_addrs[i]);
        *n_out = n;
    }
    pthread_mutex_unlock(&fake_mu);
    return st;
}

static void fake_set(const char *const *addrs, size_t n, bool fail)
{
    pthread_mutex_lock(&fake_mu);
    for (size_t i = 0; i < n; i++)
        fake_addrs[i] = addrs[i];
    fake_n = n;
    fake_fail = fail;
    pthread_mutex_unlock(&fake_mu);
}

static int fake_calls_now(void)
{
    int n;

    pthread_mutex_lock(&fake_mu);
    n = fake_calls;
    pthread_mutex_unlock(&fake_mu);
    return n;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool has(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);

    sched_instance_unref(inst);
    return inst != NULL;
}

static sched_state_t state_of(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);
    sched_state_t st;

    assert_non_null(inst);
    st = sched_instance_state(inst);
    sched_instance_unref(inst);
    return st;
}

/* Poll <cond> for up to 5 s. */
#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        uint64_t deadline_ = wall_ms() + 5000;                                                     \
        while (!(cond) && wall_ms() < deadline_)                                                   \
            usleep(5000);                                                                          \
        assert_true(cond);                                                                         \
    } while (0)

static sched_pool_t *dns_pool(const char *decode_name)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;

    sched_config_init(&cfg);
    cfg.health_interval_ms = 0;
    cfg.metrics_scrape_interval_ms = 0;
    cfg.log = test_quiet_log;
    cfg.dns.decode = decode_name;
    cfg.dns.interval_ms = 20;
    cfg.dns.resolve = fake_resolve;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    return pool;
}

static void test_join_drain_remove(void **state)
{
    const char *first[] = {"10.0.0.1", "10.0.0.2"};
    const char *second[] = {"10.0.0.1", "10.0.0.3", "fd00::1"};
    sched_request_t req = {0};
    sched_booking_t *held = NULL;
    sched_pool_t *pool;
    sched_instance_t *inst;
    int calls;
    char last_host[sizeof(fake_last_host)];

    (void)state;
    fake_set(first, 2, false);
    pool = dns_pool("decode.test.svc:8000");
    WAIT_FOR(sched_pool_size(pool) == 2);
    pthread_mutex_lock(&fake_mu);
    snprintf(last_host, sizeof(last_host), "%s", fake_last_host);
    pthread_mutex_unlock(&fake_mu);
    assert_string_equal(last_host, "decode.test.svc");
    assert_true(has(pool, "decode@10.0.0.1:8000"));
    inst = sched_pool_get(pool, "decode@10.0.0.2:8000");
    assert_non_null(inst);
    assert_string_equal(sched_instance_url(inst), "http://10.0.0.2:8000");
    assert_int_equal(sched_instance_desc(inst)->role, SCHED_ROLE_DECODE);
    assert_int_equal(sched_instance_desc(inst)->source, SCHED_SOURCE_DNS);
    sched_instance_unref(inst);

    /* hold a booking on 10.0.0.2, then let it vanish from DNS */
    req.exclude_ids = (const char *const[]){"decode@10.0.0.1:8000"};
    req.n_exclude_ids = 1;
    assert_int_equal(sched_book_decode(pool, &req, &held), SCHED_OK);
    assert_string_equal(sched_instance_id(sched_booking_instance(held, SCHED_LEG_DECODE)),
                        "decode@10.0.0.2:8000");
    fake_set(second, 3, false);
    WAIT_FOR(has(pool, "decode@10.0.0.3:8000") && has(pool, "decode@[fd00::1]:8000"));
    WAIT_FOR(state_of(pool, "decode@10.0.0.2:8000") == SCHED_STATE_DRAINING);
    /* busy: it stays through several more resolutions */
    calls = fake_calls_now();
    WAIT_FOR(fake_calls_now() >= calls + 3);
    assert_true(has(pool, "decode@10.0.0.2:8000"));
    assert_int_equal(state_of(pool, "decode@10.0.0.1:8000"), SCHED_STATE_UP);
    inst = sched_pool_get(pool, "decode@[fd00::1]:8000");
    assert_string_equal(sched_instance_url(inst), "http://[fd00::1]:8000");
    sched_instance_unref(inst);
    /* in-flight request finishes → removed */
    assert_int_equal(sched_booking_finish(held, SCHED_LEG_DECODE, NULL), SCHED_OK);
    sched_booking_destroy(&held);
    WAIT_FOR(!has(pool, "decode@10.0.0.2:8000"));
    assert_int_equal(sched_pool_size(pool), 3);

    /* a failing resolver keeps the current set */
    fake_set(second, 3, true);
    calls = fake_calls_now();
    WAIT_FOR(fake_calls_now() >= calls + 3);
    assert_int_equal(sched_pool_size(pool), 3);
    assert_int_equal(state_of(pool, "decode@10.0.0.3:8000"), SCHED_STATE_UP);

    /* an empty answer drains everything, idle ones leave */
    fake_set(second, 0, false);
    WAIT_FOR(sched_pool_size(pool) == 0);
    assert_false(sched_pool_ready(pool, SCHED_ROLE_DECODE));

    /* and they come back */
    fake_set(first, 1, false);
    WAIT_FOR(sched_pool_size(pool) == 1);
    assert_true(sched_pool_ready(pool, SCHED_ROLE_DECODE));
    sched_pool_destroy(pool);
}

static void test_getaddrinfo_localhost(void **state)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;

    (void)state;
    sched_config_init(&cfg);
    cfg.health_interval_ms = 0;
    cfg.metrics_scrape_interval_ms = 0;
    cfg.log = test_quiet_log;
    cfg.dns.both = "localhost:18123";
    cfg.dns.interval_ms = 50;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    WAIT_FOR(has(pool, "both@127.0.0.1:18123") || has(pool, "both@[::1]:18123"));
    sched_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_drain_remove),
        cmocka_unit_test(test_getaddrinfo_localhost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
