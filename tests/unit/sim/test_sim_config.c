/* pdgw-sim command line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "sim_int.h"

static int parse(const char *line, sim_config_t *c)
{
    char buf[512], *argv[32];
    int argc = 0;
    snprintf(buf, sizeof(buf), "pdgw-sim %s", line);
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t && argc < 31;
         t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    FILE *devnull = freopen("/dev/null", "w", stderr);
    (void)devnull;
    return sim_config_parse(argc, argv, c);
}

static void test_defaults(void **state)
{
    sim_config_t c;
    assert_int_equal(parse("", &c), 0);
    assert_int_equal(c.role, SIM_ROLE_BOTH);
    assert_int_equal(c.port, 8100);
    assert_string_equal(c.model, "sim-model");
    assert_string_equal(c.kv_host, "127.0.0.1");
    assert_string_equal(c.engine_id, "sim-both-8100");
    assert_int_equal(c.layerwise, 1);
    assert_int_equal(c.kv_mode, SIM_KV_MODE_AUTO);
    assert_int_equal(c.stall_after_tokens, -1);
}

static void test_values(void **state)
{
    sim_config_t c;
    assert_int_equal(parse("--role decode --port 8200 --alloc-port 7400,7401 --init-port "
                           "7300,7301 --kv-mode pull-delay --no-layerwise --host 0.0.0.0 "
                           "--zero-delay --tpot-ms 2.5 --fail-rate 0.5 --fail-status 503",
                           &c),
                     0);
    assert_int_equal(c.role, SIM_ROLE_DECODE);
    assert_int_equal(c.n_alloc_ports, 2);
    assert_int_equal(c.alloc_ports[1], 7401);
    assert_int_equal(c.init_ports[0], 7300);
    assert_int_equal(c.kv_mode, SIM_KV_MODE_PULL_DELAY);
    assert_int_equal(c.layerwise, 0);
    assert_string_equal(c.kv_host, "127.0.0.1"); /* a wildcard is not advertised */
    assert_int_equal(c.zero_delay, 1);
    assert_true(c.tpot_ms == 2.5);
    assert_int_equal(c.fail_status, 503);
}

static void test_errors(void **state)
{
    sim_config_t c;
    assert_int_equal(parse("--role middle", &c), -1);
    assert_int_equal(parse("--port 70000", &c), -1);
    assert_int_equal(parse("--port x", &c), -1);
    assert_int_equal(parse("--kv-mode fast", &c), -1);
    assert_int_equal(parse("--alloc-port 1,2 --init-port 3", &c), -1);
    assert_int_equal(parse("--alloc-port 0", &c), -1);
    assert_int_equal(parse("--kv-bytes-per-token 10 --layers 4", &c), -1);
    assert_int_equal(parse("--fail-rate 2", &c), -1);
    assert_int_equal(parse("--fail-status 200", &c), -1);
    assert_int_equal(parse("--nope", &c), -1);
    assert_int_equal(parse("extra", &c), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
