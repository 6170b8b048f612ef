/*
 * Latency targets of the config (gateway/src/admit/pdgw_slo.c): "TTFT[:TPOT]" durations as
 * slo_models values take them, within the bounds the request headers have (an hour to the
 * first token, a minute per token).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pdgw_slo.h"

static void test_targets_parse(void **s)
{
    pdgw_slo_target_t t;
    (void)s;
    assert_int_equal(pdgw_slo_parse_target("500ms:50ms", &t), PDGW_OK);
    assert_int_equal(t.ttft_ms, 500);
    assert_int_equal(t.tpot_ms, 50);
    assert_int_equal(pdgw_slo_parse_target("2", &t), PDGW_OK); /* plain seconds */
    assert_int_equal(t.ttft_ms, 2000);
    assert_int_equal(t.tpot_ms, 0);
    assert_int_equal(pdgw_slo_parse_target("0:40ms", &t), PDGW_OK); /* TPOT only */
    assert_int_equal(t.ttft_ms, 0);
    assert_int_equal(t.tpot_ms, 40);
    assert_int_equal(pdgw_slo_parse_target("1h:1m", &t), PDGW_OK);
}

static void test_bad_targets_refused(void **s)
{
    static const char *const bad[] = {"",    ":",  "fast",  "500ms:",         ":50ms",
                                      "-1s", "2h", "1s:2m", "500ms:50ms:5ms", "1s;2s"};
    pdgw_slo_target_t t = {7, 7};
    (void)s;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_not_equal(pdgw_slo_parse_target(bad[i], &t), PDGW_OK);
        assert_int_equal(t.ttft_ms, 7); /* untouched */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets_parse),
        cmocka_unit_test(test_bad_targets_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
