/*
 * test_auth.c - API key set and the Bearer check: correct / incorrect / missing / wrong
 * scheme, key file parsing, refusal of bad keys, and the constant-time property (the time
 * of a check does not depend on how much of a key matched or which key matched).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdgw_auth.h"
#include "pdgw_util.h"

static void test_results(void **state)
{
    (void)state;
    static const char *const keys[] = {"sk-alpha-123", "sk-beta-456"};
    pdgw_auth_t *a;
    assert_int_equal(pdgw_auth_create(keys, 2, NULL, NULL, 0, &a), PDGW_OK);
    assert_int_equal(pdgw_auth_key_count(a), 2);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-alpha-123"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-beta-456"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "bearer   sk-beta-456  "), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "BEARER\tsk-alpha-123"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-alpha-12"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-alpha-1234"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, "Bearer SK-ALPHA-123"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-alpha-123 extra"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, NULL), PDGW_AUTH_MISSING);
    assert_int_equal(pdgw_auth_check(a, ""), PDGW_AUTH_MISSING);
    assert_int_equal(pdgw_auth_check(a, "   "), PDGW_AUTH_MISSING);
    assert_int_equal(pdgw_auth_check(a, "Basic dXNlcjpwYXNz"), PDGW_AUTH_BAD_SCHEME);
    assert_int_equal(pdgw_auth_check(a, "sk-alpha-123"), PDGW_AUTH_BAD_SCHEME);
    assert_int_equal(pdgw_auth_check(a, "Bearer"), PDGW_AUTH_BAD_SCHEME);
    assert_int_equal(pdgw_auth_check(a, "Bearer    "), PDGW_AUTH_BAD_SCHEME);
    assert_int_equal(pdgw_auth_check(a, "Bearersk-alpha-123"), PDGW_AUTH_BAD_SCHEME);
    /* a token longer than any key slot is refused, not truncated into a match */
    char longtok[600];
    snprintf(longtok, sizeof(longtok), "Bearer sk-alpha-123%0500d", 0);
    assert_int_equal(pdgw_auth_check(a, longtok), PDGW_AUTH_INVALID);
    assert_true(pdgw_auth_allowed(PDGW_AUTH_OK));
    assert_true(pdgw_auth_allowed(PDGW_AUTH_DISABLED));
    assert_false(pdgw_auth_allowed(PDGW_AUTH_INVALID));
    assert_string_equal(pdgw_auth_result_name(PDGW_AUTH_BAD_SCHEME), "bad_scheme");

    pdgw_api_error_t e;
    pdgw_auth_result_to_error(PDGW_AUTH_MISSING, &e);
    assert_int_equal(pdgw_api_error_http_status(&e), 401);
    assert_string_equal(pdgw_api_err_type(e.kind), "authentication_error");
    assert_string_equal(e.code, "missing_api_key");
    pdgw_auth_result_to_error(PDGW_AUTH_INVALID, &e);
    assert_string_equal(e.code, "invalid_api_key");
    pdgw_auth_destroy(a);

    /* no keys: authentication is off */
    assert_int_equal(pdgw_auth_create(NULL, 0, NULL, NULL, 0, &a), PDGW_OK);
    assert_int_equal(pdgw_auth_check(a, NULL), PDGW_AUTH_DISABLED);
    assert_int_equal(pdgw_auth_check(a, "Bearer x"), PDGW_AUTH_DISABLED);
    pdgw_auth_destroy(a);
    assert_int_equal(pdgw_auth_check(NULL, NULL), PDGW_AUTH_DISABLED);
}

static void test_bad_keys(void **state)
{
    (void)state;
    pdgw_auth_t *a = NULL;
    char err[256];
    static const char *const empty[] = {""};
    assert_int_equal(pdgw_auth_create(empty, 1, NULL, err, sizeof(err), &a), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "api_keys[0]"));
    static const char *const blank[] = {"ok", "has space"};
    assert_int_equal(pdgw_auth_create(blank, 2, NULL, err, sizeof(err), &a), PDGW_ERR_INVALID);
    assert_non_null(strstr(err, "api_keys[1]"));
    char big[PDGW_AUTH_KEY_MAX + 2];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    const char *bigk[] = {big};
    assert_int_equal(pdgw_auth_create(bigk, 1, NULL, err, sizeof(err), &a), PDGW_ERR_INVALID);
    big[PDGW_AUTH_KEY_MAX] = '\0'; /* exactly the maximum is fine */
    assert_int_equal(pdgw_auth_create(bigk, 1, NULL, err, sizeof(err), &a), PDGW_OK);
    char hdr[PDGW_AUTH_KEY_MAX + 16];
    snprintf(hdr, sizeof(hdr), "Bearer %s", big);
    assert_int_equal(pdgw_auth_check(a, hdr), PDGW_AUTH_OK);
    pdgw_auth_destroy(a);
    assert_int_equal(pdgw_auth_create(NULL, 0, "/nonexistent/keys.txt", err, sizeof(err), &a),
                     PDGW_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/keys.txt"));
}

static void test_key_file(void **state)
{
    (void)state;
    char path[] = "/tmp/pdgw_keys_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    /* a key may name its tenant after a blank: the key alone is the credential */
    const char *text = "# team keys\n\n  sk-file-1  \nsk-file-2\t acme\r\n# sk-commented\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    static const char *const keys[] = {"sk-cfg"};
    pdgw_auth_t *a;
    assert_int_equal(pdgw_auth_create(keys, 1, path, NULL, 0, &a), PDGW_OK);
    assert_int_equal(pdgw_auth_key_count(a), 3);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-cfg"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-file-1"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-file-2"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(a, "Bearer sk-commented"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, "Bearer # sk-commented"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check(a, "Bearer acme"), PDGW_AUTH_INVALID);
    pdgw_auth_destroy(a);

    /* a bad line names the file and line number */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    text = "sk-ok\nbad key line\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char err[256];
    assert_int_equal(pdgw_auth_create(NULL, 0, path, err, sizeof(err), &a), PDGW_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof(want), "%s:2", path);
    assert_non_null(strstr(err, want));
    unlink(path);
}

/* The /admin rule: with an admin key, writes need it and reads take it or an API key; without
 * one, writes only from loopback and the API keys decide. */
static void test_admin(void **state)
{
    (void)state;
    static const char *const keys[] = {"sk-user"};
    pdgw_auth_t *a = NULL;
    assert_int_equal(pdgw_auth_create(keys, 1, NULL, NULL, 0, &a), PDGW_OK);
    assert_false(pdgw_auth_has_admin_key(a));
    /* no admin key */
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer sk-user", true, true), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check_admin(a, NULL, true, true), PDGW_AUTH_MISSING);
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer sk-user", true, false), PDGW_AUTH_FORBIDDEN);
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer sk-user", false, false), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check_admin(NULL, NULL, true, true), PDGW_AUTH_DISABLED);
    assert_int_equal(pdgw_auth_check_admin(NULL, NULL, true, false), PDGW_AUTH_FORBIDDEN);
    /* with one */
    assert_int_equal(pdgw_auth_set_admin_key(a, "adm-1", NULL, 0), PDGW_OK);
    assert_true(pdgw_auth_has_admin_key(a));
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer adm-1", true, false), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer sk-user", true, true), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_check_admin(a, NULL, true, true), PDGW_AUTH_MISSING);
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer sk-user", false, false), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check_admin(a, "Bearer adm-1", false, false), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check_admin(a, NULL, false, true), PDGW_AUTH_MISSING);
    /* the admin key is not an API key */
    assert_int_equal(pdgw_auth_check(a, "Bearer adm-1"), PDGW_AUTH_INVALID);
    assert_int_equal(pdgw_auth_set_admin_key(a, "bad key", NULL, 0), PDGW_ERR_INVALID);
    pdgw_auth_destroy(a);
}

/* A reload moves fresh key sets into the live object; the old keys stop working at once. */
static void test_swap(void **state)
{
    (void)state;
    static const char *const old_keys[] = {"sk-old"};
    static const char *const new_keys[] = {"sk-new"};
    pdgw_auth_t *live = NULL, *fresh = NULL;
    assert_int_equal(pdgw_auth_create(old_keys, 1, NULL, NULL, 0, &live), PDGW_OK);
    assert_int_equal(pdgw_auth_create(new_keys, 1, NULL, NULL, 0, &fresh), PDGW_OK);
    assert_int_equal(pdgw_auth_set_admin_key(fresh, "adm-2", NULL, 0), PDGW_OK);
    pdgw_auth_swap(live, fresh);
    assert_int_equal(pdgw_auth_check(live, "Bearer sk-new"), PDGW_AUTH_OK);
    assert_int_equal(pdgw_auth_check(live, "Bearer sk-old"), PDGW_AUTH_INVALID);
    assert_true(pdgw_auth_has_admin_key(live));
    assert_int_equal(pdgw_auth_check(fresh, "Bearer sk-old"), PDGW_AUTH_OK);
    assert_false(pdgw_auth_has_admin_key(fresh));
    pdgw_auth_destroy(fresh);
    /* keys can also be switched off by a reload */
    assert_int_equal(pdgw_auth_create(NULL, 0, NULL, NULL, 0, &fresh), PDGW_OK);
    pdgw_auth_swap(live, fresh);
    assert_int_equal(pdgw_auth_check(live, NULL), PDGW_AUTH_DISABLED);
    pdgw_auth_destroy(fresh);
    pdgw_auth_destroy(live);
}

static void test_ct_memeq(void **state)
{
    (void)state;
    assert_true(pdgw_ct_memeq("abc", "abc", 3));
    assert_false(pdgw_ct_memeq("abc", "abd", 3));
    assert_true(pdgw_ct_memeq("", "", 0));
}

/* Best-of-rounds time (ns) of <iters> checks of <hdr>. */
static uint64_t time_checks(const pdgw_auth_t *a, const char *hdr, int iters)
{
    uint64_t t0 = pdgw_time_mono_ns();
    volatile int sink = 0;
    for (int i = 0; i < iters; i++)
        sink += pdgw_auth_check(a, hdr);
    (void)sink;
    return pdgw_time_mono_ns() - t0;
}

static void test_constant_time(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Instrumented builds time the sanitizer's checks, not the comparison: the property
     * is asserted on the optimised build. */
    skip();
#endif
    /*
     * 128 keys of 250 bytes sharing a 240-byte prefix: a comparison that stops at the first
     * differing byte, or at the first matching key, does very different amounts of work for
     * the probes below; a constant-time one does the same work for all of them.
     */
    enum { NKEYS = 128, KLEN = 250 };
    static char keybuf[NKEYS][KLEN + 1];
    const char *keys[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        memset(keybuf[i], 'k', KLEN - 10);
        snprintf(keybuf[i] + KLEN - 10, 11, "%010d", i);
        keys[i] = keybuf[i];
    }
    pdgw_auth_t *a;
    assert_int_equal(pdgw_auth_create(keys, NKEYS, NULL, NULL, 0, &a), PDGW_OK);

    static char first[300], last[300], near[300], far[300], shortk[300];
    snprintf(first, sizeof(first), "Bearer %s", keys[0]);
    snprintf(last, sizeof(last), "Bearer %s", keys[NKEYS - 1]);
    snprintf(near, sizeof(near), "Bearer %s", keys[NKEYS - 1]);
    near[strlen(near) - 1] = 'x';                          /* wrong only in the last byte */
    snprintf(far, sizeof(far), "Bearer X%s", keys[0] + 1); /* wrong in the first byte */
    snprintf(shortk, sizeof(shortk), "Bearer kk");
    const char *probes[] = {first, last, near, far, shortk};
    const int expect[] = {PDGW_AUTH_OK, PDGW_AUTH_OK, PDGW_AUTH_INVALID, PDGW_AUTH_INVALID,
                          PDGW_AUTH_INVALID};
    uint64_t best[5];
    for (int p = 0; p < 5; p++)
        assert_int_equal(pdgw_auth_check(a, probes[p]), expect[p]);
    /* Interleaved rounds, minimum per probe: robust against a busy machine. A burst of
     * load can still slow one probe for a whole measurement, so a failing ratio is measured
     * again (up to 3 times); a comparison that really depends on the token fails every
     * time. */
    double ratio = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int p = 0; p < 5; p++)
            best[p] = UINT64_MAX;
        for (int round = 0; round < 30; round++) {
            for (int p = 0; p < 5; p++) {
                uint64_t t = time_checks(a, probes[p], 20);
                if (t < best[p])
                    best[p] = t;
            }
        }
        for (int p = 0; p < 5; p++) {
            lo = best[p] < lo ? best[p] : lo;
            hi = best[p] > hi ? best[p] : hi;
        }
        ratio = (double)hi / (double)lo;
        if (ratio <= 2.5)
            break;
    }
    pdgw_auth_destroy(a);
    if (ratio > 2.5)
        fail_msg("check time depends on the token: first %llu last %llu near %llu far %llu "
                 "short %llu ns / 20",
                 (unsigned long long)best[0], (unsigned long long)best[1],
                 (unsigned long long)best[2], (unsigned long long)best[3],
                 (unsigned long long)best[4]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_results),       cmocka_unit_test(test_bad_keys),
        cmocka_unit_test(test_key_file),      cmocka_unit_test(test_ct_memeq),
        cmocka_unit_test(test_constant_time), cmocka_unit_test(test_admin),
        cmocka_unit_test(test_swap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
