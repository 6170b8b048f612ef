/*
 * test_base.c - libpdb: fault injection names the failing call, jansson goes through the
 * wrapper, the map, the buffer and the Prometheus writer.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_buf.h"
#include "pdb/pdb_clock.h"
#include "pdb/pdb_dlist.h"
#include "pdb/pdb_map.h"
#include "pdb/pdb_prom.h"
#include "pdb/pdb_str.h"

static void test_fail_nth_names_site(void **state)
{
    char site[256];
    void *a, *b, *c;
    int line;

    (void)state;
    pdb_alloc_fail_at(2, 0);
    a = pdb_malloc(8);
    line = __LINE__ + 1;
    b = pdb_malloc(8);
    c = pdb_malloc(8); /* not sticky: the third works again */
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    assert_true(pdb_alloc_last_failure(site, sizeof(site)) > 0);
    char want[256];
    snprintf(want, sizeof(want), "%s:%d", __FILE__, line);
    assert_string_equal(site, want);
    pdb_free(a);
    pdb_free(c);

    pdb_alloc_fail_at(1, 1);
    assert_null(pdb_strdup("x"));
    assert_null(pdb_calloc(1, 4));
    pdb_alloc_fail_at(0, 0);
    a = pdb_strndup("abcdef", 3);
    assert_string_equal(a, "abc");
    pdb_free(a);
    assert_null(pdb_strdup(NULL));
}

/* Small blocks come from the thread's cache (a block just freed, still dirty) and are zeroed
 * by hand; large ones stay with calloc. */
static void test_calloc_zeroes_reused_blocks(void **state)
{
    static const size_t sizes[] = {1, 24, 512, 1024, 1025, 65536};
    (void)state;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        unsigned char *dirty = pdb_malloc(sizes[i]), *z;
        assert_non_null(dirty);
        memset(dirty, 0xa5, sizes[i]);
        pdb_free(dirty);
        z = pdb_calloc(1, sizes[i]);
        assert_non_null(z);
        for (size_t j = 0; j < sizes[i]; j++)
            if (z[j] != 0)
                fail_msg("calloc(1, %zu): byte %zu is %#x", sizes[i], j, z[j]);
        pdb_free(z);
    }
    void *p = pdb_calloc(0, 8);
    assert_non_null(p);
    pdb_free(p);
}

static void test_jansson_allocates_through_wrapper(void **state)
{
    uint64_t before = pdb_alloc_count();
    json_t *v;

    (void)state;
    v = json_string("through the wrapper");
    assert_non_null(v);
    assert_true(pdb_alloc_count() > before);
    json_decref(v);
    pdb_alloc_fail_at(1, 1);
    assert_null(json_object());
    pdb_alloc_fail_at(0, 0);
}

static int drop_odd(void *arg, const char *key, void *val)
{
    (void)arg;
    (void)key;
    return ((intptr_t)val & 1) != 0;
}

static void test_map(void **state)
{
    pdb_map_t m;
    char key[32];

    (void)state;
    assert_int_equal(pdb_map_init(&m, 0), PDB_OK);
    for (intptr_t i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "k%ld", (long)i);
        assert_int_equal(pdb_map_put(&m, key, (void *)i), PDB_OK);
    }
    assert_int_equal(pdb_map_put(&m, "k7", NULL), PDB_ERR_EXISTS);
    assert_int_equal(pdb_map_count(&m), 1000);
    assert_ptr_equal(pdb_map_get(&m, "k999"), (void *)999);
    assert_ptr_equal(pdb_map_remove(&m, "k998"), (void *)998);
    assert_null(pdb_map_get(&m, "k998"));
    pdb_map_filter(&m, drop_odd, NULL);
    assert_int_equal(pdb_map_count(&m), 499);
    assert_null(pdb_map_get(&m, "k999"));
    /* a failed put leaves the map as it was */
    pdb_alloc_fail_at(1, 0);
    assert_int_equal(pdb_map_put(&m, "new", NULL), PDB_ERR_NOMEM);
    assert_int_equal(pdb_map_count(&m), 499);
    pdb_map_fini(&m, NULL);
    pdb_map_fini(&m, NULL); /* safe twice */
}

static void test_buf_limit_and_failure(void **state)
{
    pdb_buf_t b = PDB_BUF_INIT;

    (void)state;
    b.limit = 8;
    assert_int_equal(pdb_buf_appendf(&b, "%d", 1234), PDB_OK);
    assert_int_equal(pdb_buf_append_str(&b, "56789"), PDB_ERR_TOO_LARGE);
    assert_string_equal(b.data, "1234");
    pdb_buf_consume(&b, 2);
    assert_string_equal(b.data, "34");
    pdb_buf_free(&b);
    pdb_alloc_fail_at(1, 0);
    assert_int_equal(pdb_buf_append_str(&b, "x"), PDB_ERR_NOMEM);
    assert_int_equal(b.len, 0);
}

static void test_buf_reserve_exact(void **state)
{
    pdb_buf_t b = PDB_BUF_INIT;
    (void)state;
    assert_int_equal(pdb_buf_append_str(&b, "abc"), PDB_OK);
    assert_int_equal(pdb_buf_reserve_exact(&b, 1000), PDB_OK);
    assert_int_equal(b.cap, 1004); /* exactly: not the next power of two */
    assert_string_equal(b.data, "abc");
    assert_int_equal(pdb_buf_reserve_exact(&b, 10), PDB_OK); /* already room: unchanged */
    assert_int_equal(b.cap, 1004);
    b.limit = 100;
    assert_int_equal(pdb_buf_reserve_exact(&b, 98), PDB_ERR_TOO_LARGE);
    pdb_buf_free(&b);
}

static void test_prom(void **state)
{
    pdb_buf_t b = PDB_BUF_INIT;
    pdb_prom_t p;

    (void)state;
    pdb_prom_init(&p, &b);
    pdb_prom_family(&p, "x_total", "counter", "Line one\nback\\slash");
    pdb_prom_sample_u64(&p, "x_total", "a=\"1\"", (const char *const[]){"id", "q\"\n", NULL},
                        18446744073709551615ull);
    pdb_prom_sample(&p, "y", NULL, NULL, 0.1);
    pdb_prom_sample(&p, "z", NULL, NULL, 1.0 / 0.0);
    assert_int_equal(pdb_prom_status(&p), PDB_OK);
    assert_string_equal(b.data, "# HELP x_total Line one\\nback\\\\slash\n"
                                "# TYPE x_total counter\n"
                                "x_total{a=\"1\",id=\"q\\\"\\n\"} 18446744073709551615\n"
                                "y 0.1\n"
                                "z +Inf\n");
    pdb_buf_free(&b);
}

static uint64_t fake_now(void *arg)
{
    return *(uint64_t *)arg;
}

static void test_str_join_cuts_like_snprintf(void **state)
{
    char buf[8];
    (void)state;
    assert_int_equal(pdb_str_join(buf, sizeof(buf), "ab", "cd"), 4);
    assert_string_equal(buf, "abcd");
    assert_int_equal(pdb_str_join(buf, sizeof(buf), "abcde", "fghij"), 10); /* cut in b */
    assert_string_equal(buf, "abcdefg");
    assert_int_equal(pdb_str_join(buf, sizeof(buf), "0123456789", "x"), 11); /* cut in a */
    assert_string_equal(buf, "0123456");
    assert_int_equal(pdb_str_join(buf, sizeof(buf), "", ""), 0);
    assert_string_equal(buf, "");
    assert_int_equal(pdb_str_join(buf, 1, "a", "b"), 2);
    assert_string_equal(buf, "");
}

static void test_clock_injectable(void **state)
{
    uint64_t t = 42;
    pdb_clock_t c = {fake_now, &t};
    uint64_t a = pdb_clock_now(NULL), b2;

    (void)state;
    assert_int_equal(pdb_clock_now(&c), 42);
    t = 99;
    assert_int_equal(pdb_clock_now(&c), 99);
    b2 = pdb_clock_mono_ns();
    assert_true(b2 >= a);
}

typedef struct item {
    int id;
    pdb_dlink_t link;
} item_t;

/* The ids on <list> from the head, as one number (digits in order), and the back links
 * checked on the way. */
static int dlist_ids(const pdb_dlist_t *list)
{
    int ids = 0;
    const pdb_dlink_t *prev = NULL;
    for (const pdb_dlink_t *l = list->head; l != NULL; prev = l, l = l->next) {
        assert_ptr_equal(l->prev, prev);
        ids = ids * 10 + PDB_DLIST_ENTRY(l, item_t, link)->id;
    }
    return ids;
}

static void test_dlist(void **state)
{
    item_t it[3] = {{.id = 1}, {.id = 2}, {.id = 3}};
    pdb_dlist_t list = {0};
    (void)state;
    assert_true(pdb_dlist_empty(&list));
    pdb_dlist_remove(&list, &it[0].link); /* not on it: nothing happens */
    for (int i = 0; i < 3; i++)
        pdb_dlist_push(&list, &it[i].link);
    pdb_dlist_push(&list, &it[1].link); /* on it already: stays where it is */
    assert_int_equal(dlist_ids(&list), 321);
    assert_true(pdb_dlist_linked(&list, &it[0].link)); /* the last one: no next, a prev */
    pdb_dlist_remove(&list, &it[1].link);              /* the middle */
    assert_int_equal(dlist_ids(&list), 31);
    assert_false(pdb_dlist_linked(&list, &it[1].link));
    pdb_dlist_remove(&list, &it[2].link); /* the head */
    assert_int_equal(dlist_ids(&list), 1);
    assert_true(pdb_dlist_linked(&list, &it[0].link)); /* alone: linked as the head */
    pdb_dlist_remove(&list, &it[0].link);
    assert_true(pdb_dlist_empty(&list));
    pdb_dlist_push(&list, &it[1].link); /* taken out links go on again */
    assert_int_equal(dlist_ids(&list), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_nth_names_site),
        cmocka_unit_test(test_calloc_zeroes_reused_blocks),
        cmocka_unit_test(test_jansson_allocates_through_wrapper),
        cmocka_unit_test(test_map),
        cmocka_unit_test(test_buf_limit_and_failure),
        cmocka_unit_test(test_buf_reserve_exact),
        cmocka_unit_test(test_prom),
        cmocka_unit_test(test_str_join_cuts_like_snprintf),
        cmocka_unit_test(test_clock_injectable),
        cmocka_unit_test(test_dlist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
