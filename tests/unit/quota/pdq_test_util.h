/*
 * pdq_test_util.h - a hand-driven clock and small builders for libpdquota's unit tests.
 */
#ifndef PDQ_TEST_UTIL_H
#define PDQ_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pdquota/pdquota.h"

typedef struct fake_clock {
    uint64_t now;
} fake_clock_t;

static uint64_t fake_now(void *arg)
{
    return ((fake_clock_t *)arg)->now;
}

static inline pdb_clock_t fake_clock_of(fake_clock_t *fc)
{
    pdb_clock_t c = {fake_now, fc};
    return c;
}

static inline void advance_ms(fake_clock_t *fc, uint64_t ms)
{
    fc->now += ms * PDB_NSEC_PER_MSEC;
}

/* The value of header <name> in <h>, or NULL. */
static inline const char *header(const pdq_headers_t *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->h[i].name, name) == 0)
            return h->h[i].value;
    return NULL;
}

static inline pdq_t *new_quota(const pdq_config_t *cfg, fake_clock_t *fc)
{
    pdb_clock_t c = fake_clock_of(fc);
    pdq_t *q = NULL;
    char err[256] = "";
    pdq_status_t st = pdq_new(cfg, &c, &q, err, sizeof(err));
    if (st != PDQ_OK)
        print_error("pdq_new: %s\n", err);
    assert_int_equal(st, PDQ_OK);
    return q;
}

#endif /* PDQ_TEST_UTIL_H */
