/*
 * The pool's id index (scheduler/src/sched_pool.c, pool->by_id): every by-id call (get, add's
 * uniqueness, upsert, remove, drain, retire) goes through a hash map kept in step with the
 * snapshot the pickers scan. After every kind of change, and after every allocation failure
 * of a change, the index and the snapshot must name the same instances: each id found maps
 * to the snapshot's object of that id, ids that left are not found, uids stay sorted.
 * Timing is not asserted here (measured by hand: see scheduler/README.md).
 */
#include "pdb/pdb_alloc.h"
#include "sched_test_util.h"

#define N_FLEET 2000

static void desc_of(sched_instance_desc_t *d, const char *id, char *url, size_t url_len, int port,
                    sched_role_t role)
{
    sched_instance_desc_init(d);
    snprintf(url, url_len, "http://127.0.0.1:%d", port);
    d->id = id;
    d->url = url;
    d->role = role;
}

static sched_status_t add(sched_pool_t *pool, const char *id, int port)
{
    sched_instance_desc_t d;
    char url[64], err[256];
    desc_of(&d, id, url, sizeof(url), port, port % 2 ? SCHED_ROLE_DECODE : SCHED_ROLE_PREFILL);
    return sched_pool_add(pool, &d, err, sizeof(err));
}

static sched_status_t upsert(sched_pool_t *pool, const char *id, int port)
{
    sched_instance_desc_t d;
    char url[64], err[256];
    desc_of(&d, id, url, sizeof(url), port, SCHED_ROLE_BOTH);
    return sched_pool_upsert(pool, &d, err, sizeof(err));
}

/* The index and the snapshot agree: same size, each snapshot entry is what its id finds, the
 * arrays sorted by uid (the prefix policy's binary search relies on it), weights summed. */
static void check_consistent(sched_pool_t *pool)
{
    const sched_snapshot_t *snap = pool->snap;
    size_t in_role[2] = {0, 0};

    assert_int_equal(pdb_map_count(&pool->by_id), snap->n_all);
    assert_int_equal(sched_pool_size(pool), snap->n_all);
    for (size_t i = 0; i < snap->n_all; i++) {
        sched_instance_t *inst = snap->all[i];
        sched_instance_t *got = sched_pool_get(pool, inst->desc.id);
        assert_ptr_equal(got, inst);
        sched_instance_unref(got);
        if (i > 0)
            assert_true(snap->all[i - 1]->uid < inst->uid);
        for (int r = 0; r < 2; r++)
            in_role[r] += (inst->roles & (r ? SCHED_ROLE_DECODE : SCHED_ROLE_PREFILL)) != 0;
    }
    for (int r = 0; r < 2; r++) {
        uint64_t sum = 0;
        assert_int_equal(snap->n_role[r], in_role[r]);
        for (size_t i = 0; i < snap->n_role[r]; i++) {
            if (i > 0)
                assert_true(snap->role[r][i - 1]->uid < snap->role[r][i]->uid);
            sum += snap->role[r][i]->weight;
            assert_true(snap->wsum[r][i] == sum);
        }
    }
}

static void test_add_get_remove(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    char id[32];
    sched_instance_t *inst;

    (void)state;
    for (int i = 0; i < N_FLEET; i++) {
        snprintf(id, sizeof(id), "e-%d", i);
        assert_int_equal(add(pool, id, 10000 + i), SCHED_OK);
    }
    check_consistent(pool);
    assert_int_equal(sched_pool_size(pool), N_FLEET);
    /* every id finds its own instance; an unknown one finds nothing */
    for (int i = 0; i < N_FLEET; i++) {
        snprintf(id, sizeof(id), "e-%d", i);
        inst = sched_pool_get(pool, id);
        assert_non_null(inst);
        assert_string_equal(sched_instance_id(inst), id);
        sched_instance_unref(inst);
    }
    assert_null(sched_pool_get(pool, "e-2000"));
    assert_null(sched_pool_get(pool, "e-"));
    assert_null(sched_pool_get(pool, NULL));
    /* an id is taken once */
    assert_int_equal(add(pool, "e-7", 9), SCHED_ERR_EXISTS);
    assert_int_equal(sched_pool_size(pool), N_FLEET);
    /* remove every third: gone from the index, the others stay */
    for (int i = 0; i < N_FLEET; i += 3) {
        snprintf(id, sizeof(id), "e-%d", i);
        assert_int_equal(sched_pool_remove(pool, id), SCHED_OK);
        assert_int_equal(sched_pool_remove(pool, id), SCHED_ERR_NOT_FOUND);
        assert_int_equal(sched_pool_drain(pool, id), SCHED_ERR_NOT_FOUND);
    }
    check_consistent(pool);
    for (int i = 0; i < N_FLEET; i++) {
        snprintf(id, sizeof(id), "e-%d", i);
        inst = sched_pool_get(pool, id);
        if (i % 3 == 0) {
            assert_null(inst);
        } else {
            assert_non_null(inst);
            sched_instance_unref(inst);
        }
    }
    /* a removed id can be taken again, by a new object */
    assert_int_equal(add(pool, "e-0", 20000), SCHED_OK);
    inst = sched_pool_get(pool, "e-0");
    assert_non_null(inst);
    assert_string_equal(sched_instance_url(inst), "http://127.0.0.1:20000");
    sched_instance_unref(inst);
    check_consistent(pool);
    sched_pool_destroy(pool);
}

/* Renames and replacements: an instance that moves to another id is found under the new one
 * only; a new descriptor under the same id replaces the object, and a reference to the old
 * one stays valid until dropped. */
static void test_rename_replace(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_instance_t *old, *now;

    (void)state;
    assert_int_equal(upsert(pool, "a", 9001), SCHED_OK);
    assert_int_equal(upsert(pool, "b", 9002), SCHED_OK);
    /* rename a → c: the engine at 9001 is now known as c */
    assert_int_equal(sched_pool_remove(pool, "a"), SCHED_OK);
    assert_int_equal(upsert(pool, "c", 9001), SCHED_OK);
    assert_null(sched_pool_get(pool, "a"));
    now = sched_pool_get(pool, "c");
    assert_non_null(now);
    assert_string_equal(sched_instance_url(now), "http://127.0.0.1:9001");
    sched_instance_unref(now);
    check_consistent(pool);
    /* rename onto a taken id is refused by add */
    assert_int_equal(add(pool, "b", 9001), SCHED_ERR_EXISTS);
    /* same descriptor: kept as it is (same object) */
    old = sched_pool_get(pool, "b");
    assert_int_equal(upsert(pool, "b", 9002), SCHED_OK);
    now = sched_pool_get(pool, "b");
    assert_ptr_equal(now, old);
    sched_instance_unref(now);
    /* new descriptor: a new object under the same id; the old reference still reads */
    assert_int_equal(upsert(pool, "b", 9003), SCHED_OK);
    now = sched_pool_get(pool, "b");
    assert_non_null(now);
    assert_ptr_not_equal(now, old);
    assert_true(now->uid > old->uid);
    assert_string_equal(sched_instance_url(now), "http://127.0.0.1:9003");
    assert_string_equal(sched_instance_url(old), "http://127.0.0.1:9002");
    sched_instance_unref(now);
    sched_instance_unref(old);
    assert_int_equal(sched_pool_size(pool), 2);
    check_consistent(pool);
    sched_pool_destroy(pool);
}

/* Retiring: removed by the pool thread once idle, all at once; an upsert first cancels it. */
static void test_retire_reap(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    char id[32];

    (void)state;
    for (int i = 0; i < 100; i++) {
        snprintf(id, sizeof(id), "r-%d", i);
        assert_int_equal(upsert(pool, id, 11000 + i), SCHED_OK);
    }
    for (int i = 0; i < 100; i += 2) {
        snprintf(id, sizeof(id), "r-%d", i);
        assert_int_equal(sched_pool_retire(pool, id), SCHED_OK);
    }
    test_set_inflight(pool, "r-0", 1);                      /* busy: stays until idle */
    assert_int_equal(upsert(pool, "r-2", 11002), SCHED_OK); /* back before the reap */
    assert_int_equal(sched_pool_poll(pool, 0), SCHED_OK);
    check_consistent(pool);
    assert_int_equal(sched_pool_size(pool), 52); /* 50 odd + r-0 (busy) + r-2 (back) */
    for (int i = 4; i < 100; i += 2) {
        snprintf(id, sizeof(id), "r-%d", i);
        assert_null(sched_pool_get(pool, id));
    }
    assert_non_null(test_inst(pool, "r-0"));
    assert_non_null(test_inst(pool, "r-2"));
    test_set_inflight(pool, "r-0", 0);
    assert_int_equal(sched_pool_poll(pool, 0), SCHED_OK);
    assert_null(sched_pool_get(pool, "r-0"));
    check_consistent(pool);
    sched_pool_destroy(pool);
}

/* Many at once (the static instances at start): all or none. */
static void test_add_many(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_instance_desc_t d[4];
    char url[4][64], err[256];
    const char *ids[4] = {"m-0", "m-1", "m-2", "m-1"};

    (void)state;
    for (int i = 0; i < 4; i++)
        desc_of(&d[i], ids[i], url[i], sizeof(url[i]), 12000 + i, SCHED_ROLE_BOTH);
    /* twice the same id in one batch: nothing added */
    assert_int_equal(sched_pool_add_many(pool, d, 4, err, sizeof(err)), SCHED_ERR_EXISTS);
    assert_non_null(strstr(err, "m-1"));
    assert_int_equal(sched_pool_size(pool), 0);
    check_consistent(pool);
    assert_int_equal(sched_pool_add_many(pool, d, 3, err, sizeof(err)), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), 3);
    /* an id already in the pool: nothing added */
    d[3].id = "m-3";
    assert_int_equal(sched_pool_add_many(pool, &d[2], 2, err, sizeof(err)), SCHED_ERR_EXISTS);
    assert_null(sched_pool_get(pool, "m-3"));
    /* an invalid descriptor: nothing added, its reason given */
    d[3].url = "ftp://x";
    assert_int_equal(sched_pool_add_many(pool, &d[3], 1, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_int_equal(sched_pool_size(pool), 3);
    check_consistent(pool);
    sched_pool_destroy(pool);
}

/* A change that meets an allocation failure changes nothing: for every N, fail the Nth
 * allocation of the change and check the old set is intact, until the change succeeds. */
static void test_alloc_failures(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    sched_instance_desc_t d[3];
    char url[3][64], err[256];
    const char *ids[3] = {"f-a", "f-b", "f-c"};
    sched_status_t st;
    int failures;

    (void)state;
    assert_int_equal(upsert(pool, "x", 13000), SCHED_OK);
    assert_int_equal(upsert(pool, "y", 13001), SCHED_OK);
    for (int op = 0; op < 4; op++) {
        sched_instance_t *x0 = sched_pool_get(pool, "x");
        size_t n0 = sched_pool_size(pool);
        failures = 0;
        for (uint64_t n = 1;; n++) {
            pdb_alloc_fail_at(n, 0);
            switch (op) {
            case 0: /* a new id */
                st = upsert(pool, "z", 13002);
                break;
            case 1: /* a replacement under the same id */
                st = upsert(pool, "x", 13100);
                break;
            case 2: /* a removal */
                st = sched_pool_remove(pool, "y");
                break;
            default: /* a batch */
                for (int i = 0; i < 3; i++)
                    desc_of(&d[i], ids[i], url[i], sizeof(url[i]), 13200 + i, SCHED_ROLE_BOTH);
                st = sched_pool_add_many(pool, d, 3, err, sizeof(err));
                break;
            }
            pdb_alloc_fail_at(0, 0);
            check_consistent(pool);
            if (st == SCHED_OK)
                break;
            assert_int_equal(st, SCHED_ERR_NO_MEMORY);
            failures++;
            /* nothing changed */
            assert_int_equal(sched_pool_size(pool), n0);
            assert_ptr_equal(test_inst(pool, "x"), x0);
            assert_non_null(test_inst(pool, "y"));
            assert_null(sched_pool_get(pool, op == 0 ? "z" : "f-a"));
        }
        assert_true(failures > 0); /* the loop did reach the change's allocations */
        sched_instance_unref(x0);
        if (op == 2) /* y again, for the batch case */
            assert_int_equal(upsert(pool, "y", 13001), SCHED_OK);
    }
    assert_int_equal(sched_pool_size(pool), 6); /* x (replaced), y, z, f-a..f-c */
    assert_string_equal(sched_instance_url(test_inst(pool, "x")), "http://127.0.0.1:13100");
    sched_pool_destroy(pool);
}

/* Static instances: validated and added together; a duplicate id is named. */
static void test_static_start(void **state)
{
    sched_config_t cfg;
    sched_pool_t *pool = NULL;
    static sched_instance_desc_t d[N_FLEET];
    static char ids[N_FLEET][16], urls[N_FLEET][64];
    char err[256];

    (void)state;
    test_config(&cfg, SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    for (int i = 0; i < N_FLEET; i++) {
        snprintf(ids[i], sizeof(ids[i]), "s-%d", i);
        desc_of(&d[i], ids[i], urls[i], sizeof(urls[i]), 14000 + i, SCHED_ROLE_BOTH);
    }
    cfg.instances = d;
    cfg.n_instances = N_FLEET;
    assert_int_equal(sched_pool_create(&cfg, &pool), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), 0); /* they join at start */
    assert_int_equal(sched_pool_start(pool), SCHED_OK);
    assert_int_equal(sched_pool_size(pool), N_FLEET);
    assert_non_null(test_inst(pool, "s-1999"));
    check_consistent(pool); /* the pool thread only reads: nothing changes meanwhile */
    sched_pool_destroy(pool);

    /* the same id twice, far apart; and twice the same URL without ids */
    d[1500].id = "s-3";
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_string_equal(err, "instances[1500].id: duplicate of instances[3]");
    d[1500].id = ids[1500];
    d[10].id = d[20].id = NULL;
    urls[20][0] = '\0';
    strcat(urls[20], urls[10]);
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_string_equal(err, "instances[20].id: duplicate of instances[10]");
    d[20].id = ids[20];
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_OK);
    /* the bound of one KV-event message */
    cfg.kv_events_max_message_bytes = 1024;
    assert_int_equal(sched_config_validate(&cfg, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "kv_events_max_message_bytes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_get_remove), cmocka_unit_test(test_rename_replace),
        cmocka_unit_test(test_retire_reap),    cmocka_unit_test(test_add_many),
        cmocka_unit_test(test_alloc_failures), cmocka_unit_test(test_static_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
