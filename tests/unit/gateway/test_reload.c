/*
 * test_reload.c - the reload transaction without a server: keys a hook applies are handed
 * to it, every other changed key is kept and reported, the values the server borrows stay
 * at the same address across reloads, a refusing hook aborts the ones that prepared, and a
 * file that does not parse leaves the running config and counts an error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdgw_metrics.h"
#include "pdgw_reload.h"

typedef struct probe {
    int prepared, committed, aborted;
    bool refuse;
    bool keep_decode_policy;
    bool saw_level_change;
    pdgw_log_level_t level;
} probe_t;

static const char *const probe_keys[] = {"log_level", "decode_policy", NULL};

static pdgw_status_t probe_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                   size_t errlen)
{
    probe_t *p = ctx;
    p->prepared++;
    *state = p;
    if (p->keep_decode_policy && pdgw_reload_txn_changed(txn, "decode_policy"))
        pdgw_reload_txn_keep(txn, "decode_policy", "test says so");
    if (p->refuse) {
        snprintf(err, errlen, "refused by the probe");
        return PDGW_ERR_INVALID;
    }
    return PDGW_OK;
}

static void probe_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    probe_t *p = ctx;
    assert_ptr_equal(state, p);
    p->committed++;
    p->saw_level_change = pdgw_reload_txn_changed(txn, "log_level");
    p->level = pdgw_reload_txn_next(txn)->log_level;
}

static void probe_abort(void *ctx, void *state)
{
    probe_t *p = ctx;
    assert_ptr_equal(state, p);
    p->aborted++;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static bool json_list_has(json_t *arr, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (strcmp(json_string_value(v), s) == 0)
            return true;
    }
    return false;
}

/* A reloader over <path> as `pdgw --config <path>` would have it. */
static pdgw_reload_t *make(const char *path, char **argv, pdgw_metrics_t *reg)
{
    pdgw_config_t cfg;
    pdgw_config_action_t action;
    pdgw_config_error_t err;
    pdgw_reload_t *rl = NULL;
    static char *envp[] = {NULL};
    argv[0] = "pdgw";
    argv[1] = "--config";
    argv[2] = (char *)path;
    argv[3] = NULL;
    assert_int_equal(pdgw_config_from_args(&cfg, 3, argv, envp, NULL, &action, &err), PDGW_OK);
    assert_int_equal(pdgw_reload_create(&cfg, 3, argv, envp, NULL, reg, &rl), PDGW_OK);
    assert_null(cfg.listen); /* moved */
    return rl;
}

static void test_apply_and_keep(void **state)
{
    char path[] = "/tmp/pdgw-reload-XXXXXX";
    char *argv[4];
    probe_t p = {0};
    pdgw_metrics_t *reg = NULL;
    pdgw_reload_hook_t hook = {.name = "probe",
                               .keys = probe_keys,
                               .prepare = probe_prepare,
                               .commit = probe_commit,
                               .abort = probe_abort,
                               .ctx = &p};
    const char *listen_before, *protocol_before;
    json_t *res;
    (void)state;

    close(mkstemp(path));
    write_file(path, "listen: \"127.0.0.1:7001\"\nworkers: 2\nlog_level: info\n"
                     "instances:\n  - {id: a, url: \"http://127.0.0.1:9\"}\n");
    assert_int_equal(pdgw_metrics_create(0, &reg), PDGW_OK);
    pdgw_reload_t *rl = make(path, argv, reg);
    assert_int_equal(pdgw_reload_register(rl, &hook), PDGW_OK);
    listen_before = pdgw_reload_config(rl)->listen_host;
    protocol_before = pdgw_reload_config(rl)->protocol;

    /* log_level (hooked) and workers + listen (not hooked) change. */
    write_file(path, "listen: \"127.0.0.1:7002\"\nworkers: 3\nlog_level: debug\n"
                     "decode_policy: random\n"
                     "instances:\n  - {id: a, url: \"http://127.0.0.1:9\"}\n");
    p.keep_decode_policy = true;
    res = pdgw_reload_run(rl, "test");
    assert_non_null(res);
    /* kept keys make it a partial reload, never plainly "reloaded" */
    assert_string_equal(json_string_value(json_object_get(res, "result")), "partial");
    assert_non_null(
        strstr(json_string_value(json_object_get(res, "message")), "not applied until a restart"));
    assert_true(json_list_has(json_object_get(res, "applied"), "log_level"));
    assert_false(json_list_has(json_object_get(res, "applied"), "workers"));
    assert_true(json_list_has(json_object_get(res, "needs_restart"), "workers"));
    assert_true(json_list_has(json_object_get(res, "needs_restart"), "listen"));
    /* a hook may decide a key it handles needs a restart after all */
    assert_true(json_list_has(json_object_get(res, "needs_restart"), "decode_policy"));
    json_decref(res);
    assert_int_equal(p.prepared, 1);
    assert_int_equal(p.committed, 1);
    assert_true(p.saw_level_change);
    assert_int_equal(p.level, PDGW_LOG_LEVEL_DEBUG);
    /* The running config has the new level and the old restart-only values, at the very
     * addresses the server borrowed. */
    assert_int_equal(pdgw_reload_config(rl)->log_level, PDGW_LOG_LEVEL_DEBUG);
    assert_int_equal(pdgw_reload_config(rl)->workers, 2);
    assert_int_equal(pdgw_reload_config(rl)->listen_port, 7001);
    assert_int_equal(pdgw_reload_config(rl)->decode_policy, PDGW_POLICY_LEAST_LOAD);
    assert_ptr_equal(pdgw_reload_config(rl)->listen_host, listen_before);
    assert_ptr_equal(pdgw_reload_config(rl)->protocol, protocol_before);

    /* A refusing hook: nothing changes, the prepared state is released, an error counted. */
    write_file(path, "listen: \"127.0.0.1:7001\"\nworkers: 2\nlog_level: warn\n"
                     "instances:\n  - {id: a, url: \"http://127.0.0.1:9\"}\n");
    p.refuse = true;
    res = pdgw_reload_run(rl, "test");
    assert_string_equal(json_string_value(json_object_get(res, "result")), "error");
    assert_non_null(strstr(json_string_value(json_object_get(res, "message")), "refused by"));
    json_decref(res);
    assert_int_equal(p.committed, 1);
    assert_int_equal(p.aborted, 0); /* the refusing hook itself is not aborted */
    assert_int_equal(pdgw_reload_config(rl)->log_level, PDGW_LOG_LEVEL_DEBUG);

    /* A file that does not parse: refused before any hook runs. */
    p.refuse = false;
    write_file(path, "listen: [\n");
    res = pdgw_reload_run(rl, "test");
    assert_string_equal(json_string_value(json_object_get(res, "result")), "error");
    assert_non_null(strstr(json_string_value(json_object_get(res, "message")), path));
    json_decref(res);
    assert_int_equal(p.prepared, 2);
    assert_ptr_equal(pdgw_reload_config(rl)->listen_host, listen_before);

    {
        pdgw_buf_t out = {0};
        assert_int_equal(pdgw_metrics_render(reg, &out), PDGW_OK);
        assert_non_null(strstr(out.data, "pdgw_config_reloads_total{result=\"ok\"} 1"));
        assert_non_null(strstr(out.data, "pdgw_config_reloads_total{result=\"error\"} 2"));
        assert_non_null(strstr(out.data, "pdgw_config_last_reload_successful 0"));
        pdgw_buf_free(&out);
    }
    pdgw_reload_destroy(rl);
    pdgw_metrics_destroy(reg);
    unlink(path);
}

/* Two hooks: when the second refuses, the first's prepared state is aborted. */
static void test_abort_prepared(void **state)
{
    char path[] = "/tmp/pdgw-reload-XXXXXX";
    char *argv[4];
    probe_t first = {0}, second = {.refuse = true};
    static const char *const none[] = {NULL};
    pdgw_reload_hook_t h1 = {.name = "first",
                             .keys = probe_keys,
                             .prepare = probe_prepare,
                             .commit = probe_commit,
                             .abort = probe_abort,
                             .ctx = &first};
    pdgw_reload_hook_t h2 = h1;
    json_t *res;
    (void)state;
    h2.name = "second";
    h2.keys = none;
    h2.ctx = &second;
    close(mkstemp(path));
    write_file(path, "log_level: info\ninstances:\n  - {id: a, url: \"http://127.0.0.1:9\"}\n");
    pdgw_reload_t *rl = make(path, argv, NULL);
    assert_int_equal(pdgw_reload_register(rl, &h1), PDGW_OK);
    assert_int_equal(pdgw_reload_register(rl, &h2), PDGW_OK);
    res = pdgw_reload_run(rl, "test");
    assert_string_equal(json_string_value(json_object_get(res, "result")), "error");
    assert_non_null(strstr(json_string_value(json_object_get(res, "message")), "second"));
    json_decref(res);
    assert_int_equal(first.prepared, 1);
    assert_int_equal(first.aborted, 1);
    assert_int_equal(first.committed, 0);
    pdgw_reload_destroy(rl);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_and_keep),
        cmocka_unit_test(test_abort_prepared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
