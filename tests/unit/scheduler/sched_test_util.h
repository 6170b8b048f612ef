/*
 * Shared helpers of the scheduler unit tests: a manual clock, a quiet log,
 * pool set-up without background work, and direct access to an
 * instance's load counters (tests include sched_int.h).
 */
#ifndef SCHED_TEST_UTIL_H
#define SCHED_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sched_int.h"

static uint64_t test_now_ms = 1000000;

__attribute__((unused)) static uint64_t test_clock(void *arg)
{
    (void)arg;
    return __atomic_load_n(&test_now_ms, __ATOMIC_RELAXED);
}

__attribute__((unused)) static void test_set_now(uint64_t ms)
{
    __atomic_store_n(&test_now_ms, ms, __ATOMIC_RELAXED); /* the pool's thread reads it too */
}

__attribute__((unused)) static void test_advance(uint64_t ms)
{
    __atomic_add_fetch(&test_now_ms, ms, __ATOMIC_RELAXED);
}

__attribute__((unused)) static void test_quiet_log(void *arg, sched_log_level_t level,
                                                   const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg;
}

/* Config with the manual clock, no probes or scrapes, given policies. */
__attribute__((unused)) static void test_config(sched_config_t *cfg, sched_policy_t p,
                                                sched_policy_t d)
{
    sched_config_init(cfg);
    cfg->prefill_policy = p;
    cfg->decode_policy = d;
    cfg->health_interval_ms = 0;
    cfg->metrics_scrape_interval_ms = 0;
    cfg->clock = test_clock;
    cfg->log = test_quiet_log;
    cfg->seed = 12345;
}

__attribute__((unused)) static sched_pool_t *test_pool(sched_policy_t p, sched_policy_t d)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;

    test_config(&cfg, p, d);
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    return pool;
}

/* Add instance <id> at 127.0.0.1:<port> with <role>, <zone> and <weight>. */
__attribute__((unused)) static void test_add(sched_pool_t *pool, const char *id, int port,
                                             sched_role_t role, const char *zone, unsigned weight)
{
    sched_instance_desc_t d;
    char url[64], err[256];

    sched_instance_desc_init(&d);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    d.id = id;
    d.url = url;
    d.role = role;
    d.zone = zone;
    d.weight = weight;
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
}

/* Borrowed pointer (the pool keeps its reference). */
__attribute__((unused)) static sched_instance_t *test_inst(sched_pool_t *pool, const char *id)
{
    sched_instance_t *inst = sched_pool_get(pool, id);

    assert_non_null(inst);
    sched_instance_unref(inst);
    return inst;
}

__attribute__((unused)) static void test_set_inflight(sched_pool_t *pool, const char *id,
                                                      uint32_t n)
{
    atomic_store(&test_inst(pool, id)->inflight, n);
}

#endif /* SCHED_TEST_UTIL_H */
