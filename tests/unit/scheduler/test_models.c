/* Models: configured and learnt names filter every policy; the union; unknown names. */
#include "sched_test_util.h"

static void add_models(sched_pool_t *pool, const char *id, int port, sched_role_t role,
                       const char *const *models, size_t n)
{
    sched_instance_desc_t d;
    char url[64], err[256];

    sched_instance_desc_init(&d);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    d.id = id;
    d.url = url;
    d.role = role;
    for (size_t i = 0; i < n; i++)
        d.models[i] = models[i];
    d.n_models = n;
    assert_int_equal(sched_pool_add(pool, &d, err, sizeof(err)), SCHED_OK);
}

static const char *pick_decode(sched_pool_t *pool, const char *model)
{
    static char id[SCHED_ID_MAX];
    sched_request_t req = {.prompt_tokens = 10, .max_tokens = 10, .model = model};
    sched_booking_t *b = NULL;
    sched_status_t st = sched_book_decode(pool, &req, &b);
    if (st != SCHED_OK)
        return NULL;
    snprintf(id, sizeof(id), "%s", sched_instance_id(sched_booking_instance(b, SCHED_LEG_DECODE)));
    sched_booking_destroy(&b);
    return id;
}

/* What sched_pool_models_each handed out, copied for the asserts. */
typedef struct seen_model {
    char name[64], owned_by[64], entry[512], inst[4][SCHED_ID_MAX];
    size_t n_inst;
    unsigned roles;
    bool configured;
    int64_t created;
} seen_model_t;

typedef struct seen {
    seen_model_t m[8];
    size_t n, stop_after; /* stop_after 0 = never stop */
} seen_t;

static bool collect(const sched_model_info_t *m, void *arg)
{
    seen_t *s = arg;
    seen_model_t *c = &s->m[s->n++];
    assert_true(s->n <= 8);
    snprintf(c->name, sizeof(c->name), "%s", m->name);
    snprintf(c->owned_by, sizeof(c->owned_by), "%s", m->owned_by ? m->owned_by : "(null)");
    snprintf(c->entry, sizeof(c->entry), "%s", m->entry ? m->entry : "");
    c->n_inst = m->n_instances;
    for (size_t i = 0; i < m->n_instances && i < 4; i++)
        snprintf(c->inst[i], sizeof(c->inst[i]), "%s", sched_instance_id(m->instances[i]));
    c->roles = m->roles;
    c->configured = m->configured;
    c->created = m->created;
    return s->stop_after == 0 || s->n < s->stop_after;
}

static seen_t list_models(sched_pool_t *pool, bool *known)
{
    seen_t s;
    memset(&s, 0, sizeof(s));
    assert_int_equal(sched_pool_models_each(pool, collect, &s, known), SCHED_OK);
    return s;
}

/* Every policy picks only instances of the request's model. */
static void test_every_policy_filters(void **state)
{
    static const char *const alpha[] = {"alpha"}, *const beta[] = {"beta", "beta-chat"};
    (void)state;
    for (int p = 0; p < SCHED_POLICY_COUNT; p++) {
        sched_pool_t *pool = test_pool((sched_policy_t)p, (sched_policy_t)p);
        add_models(pool, "a0", 9000, SCHED_ROLE_DECODE, alpha, 1);
        add_models(pool, "b0", 9001, SCHED_ROLE_DECODE, beta, 2);
        add_models(pool, "a1", 9002, SCHED_ROLE_DECODE, alpha, 1);
        add_models(pool, "b1", 9003, SCHED_ROLE_DECODE, beta, 2);
        for (int i = 0; i < 40; i++) {
            const char *a = pick_decode(pool, "alpha");
            const char *b;
            assert_non_null(a);
            assert_true(a[0] == 'a');
            b = pick_decode(pool, i % 2 ? "beta" : "beta-chat");
            assert_non_null(b);
            assert_true(b[0] == 'b');
        }
        assert_null(pick_decode(pool, "gamma"));
        assert_true(sched_pool_has_model(pool, "beta-chat"));
        assert_false(sched_pool_has_model(pool, "gamma"));
        sched_pool_destroy(pool);
    }
}

/* Round-robin takes turns among one model's instances, whatever the other traffic. */
static void test_round_robin_per_model(void **state)
{
    static const char *const alpha[] = {"alpha"}, *const beta[] = {"beta"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_ROUND_ROBIN, SCHED_POLICY_ROUND_ROBIN);
    int a0 = 0, a1 = 0;

    (void)state;
    add_models(pool, "a0", 9000, SCHED_ROLE_DECODE, alpha, 1);
    add_models(pool, "a1", 9001, SCHED_ROLE_DECODE, alpha, 1);
    add_models(pool, "b0", 9002, SCHED_ROLE_DECODE, beta, 1);
    for (int i = 0; i < 20; i++) {
        const char *id = pick_decode(pool, "alpha");
        a0 += strcmp(id, "a0") == 0;
        a1 += strcmp(id, "a1") == 0;
        assert_string_equal(pick_decode(pool, "beta"), "b0"); /* interleaved traffic */
    }
    assert_int_equal(a0, 10);
    assert_int_equal(a1, 10);
    sched_pool_destroy(pool);
}

/* Not configured: any model until the engine's list is learnt, then only those names. */
static void test_learnt_names(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    static const char list[] =
        "{\"object\":\"list\",\"data\":[{\"id\":\"m1\",\"object\":\"model\",\"created\":5,"
        "\"owned_by\":\"vllm\",\"root\":\"/models/m\"},{\"id\":\"m2\",\"object\":\"model\"},"
        "{\"object\":\"model\"},{\"id\":7}]}";
    bool known = true;
    seen_t s;

    (void)state;
    test_add(pool, "x", 9000, SCHED_ROLE_BOTH, "", 1);
    assert_string_equal(pick_decode(pool, "anything"), "x");
    assert_true(sched_pool_has_model(pool, "anything"));
    s = list_models(pool, &known);
    assert_false(known);
    assert_int_equal(s.n, 0);

    /* garbage and empty lists keep the instance open to any model */
    sched_models_learn(pool, test_inst(pool, "x"), "not json", 8);
    sched_models_learn(pool, test_inst(pool, "x"), "{\"data\":[]}", 11);
    assert_true(sched_pool_has_model(pool, "anything"));

    sched_models_learn(pool, test_inst(pool, "x"), list, sizeof(list) - 1);
    assert_string_equal(pick_decode(pool, "m2"), "x");
    assert_null(pick_decode(pool, "anything"));
    assert_false(sched_pool_has_model(pool, "anything"));
    s = list_models(pool, &known);
    assert_true(known);
    assert_int_equal(s.n, 2); /* entries without a string id are skipped */
    /* the engine's own fields: created, owned_by, and the entry as it listed it */
    assert_string_equal(s.m[0].name, "m1");
    assert_false(s.m[0].configured);
    assert_int_equal(s.m[0].created, 5);
    assert_string_equal(s.m[0].owned_by, "vllm");
    assert_non_null(strstr(s.m[0].entry, "\"root\":\"/models/m\""));
    assert_string_equal(s.m[1].name, "m2");
    assert_string_equal(s.m[1].owned_by, "(null)");
    assert_true(s.m[1].created > 1000000000); /* not sent: the time of the call */
    assert_int_equal(s.m[1].n_inst, 1);
    assert_string_equal(s.m[1].inst[0], "x");
    assert_int_equal(s.m[1].roles, SCHED_ROLE_BOTH);
    sched_pool_destroy(pool);
}

/* A LoRA adapter is what vLLM lists with a `parent` (vllm/entrypoints/openai/models/serving.py
 * show_available_models: base models with parent null, each adapter with its base model's
 * name); configured names say nothing of it. */
static void test_adapters(void **state)
{
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    static const char list[] =
        "{\"object\":\"list\",\"data\":[{\"id\":\"base\",\"object\":\"model\",\"root\":\"/m\","
        "\"parent\":null},{\"id\":\"sql-lora\",\"object\":\"model\",\"root\":\"/loras/sql\","
        "\"parent\":\"base\"},{\"id\":\"odd\",\"parent\":7}]}";
    static const char relisted[] =
        "{\"object\":\"list\",\"data\":[{\"id\":\"base\"},{\"id\":\"sql-lora\"}]}";
    static const char *const names[] = {"base", "sql-lora"};

    (void)state;
    test_add(pool, "x", 9000, SCHED_ROLE_BOTH, "", 1);
    add_models(pool, "y", 9001, SCHED_ROLE_BOTH, names, 2);
    assert_false(sched_pool_model_is_adapter(pool, "sql-lora")); /* nothing learnt yet */
    sched_models_learn(pool, test_inst(pool, "x"), list, sizeof(list) - 1);
    assert_true(sched_pool_model_is_adapter(pool, "sql-lora"));
    assert_false(sched_pool_model_is_adapter(pool, "base"));
    assert_false(sched_pool_model_is_adapter(pool, "odd")); /* a parent that names nothing */
    assert_false(sched_pool_model_is_adapter(pool, "unknown"));
    assert_false(sched_pool_model_is_adapter(pool, NULL));
    assert_false(sched_pool_model_is_adapter(pool, ""));
    /* the same names listed again without parents: no adapter any more */
    sched_models_learn(pool, test_inst(pool, "x"), relisted, sizeof(relisted) - 1);
    assert_false(sched_pool_model_is_adapter(pool, "sql-lora"));
    sched_pool_destroy(pool);
}

/* The union lists a configured name once, with every usable instance serving it and their
 * roles; an instance that cannot take a booking is left out; fn can stop the walk. */
static void test_union(void **state)
{
    static const char *const ab[] = {"a", "b"}, *const b[] = {"b"}, *const c[] = {"c"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);
    bool known = false;
    seen_t s;

    (void)state;
    add_models(pool, "i0", 9000, SCHED_ROLE_PREFILL, ab, 2);
    add_models(pool, "i1", 9001, SCHED_ROLE_DECODE, b, 1);
    add_models(pool, "i2", 9002, SCHED_ROLE_DECODE, c, 1);
    assert_int_equal(sched_pool_drain(pool, "i2"), SCHED_OK);
    s = list_models(pool, &known);
    assert_true(known);
    assert_int_equal(s.n, 2); /* c: its only instance drains */
    assert_string_equal(s.m[0].name, "a");
    assert_int_equal(s.m[0].n_inst, 1);
    assert_int_equal(s.m[0].roles, SCHED_ROLE_PREFILL);
    assert_string_equal(s.m[1].name, "b");
    assert_int_equal(s.m[1].n_inst, 2);
    assert_string_equal(s.m[1].inst[0], "i0");
    assert_string_equal(s.m[1].inst[1], "i1");
    assert_int_equal(s.m[1].roles, SCHED_ROLE_PREFILL | SCHED_ROLE_DECODE);
    for (size_t i = 0; i < s.n; i++) {
        assert_true(s.m[i].configured);
        assert_string_equal(s.m[i].owned_by, "(null)"); /* the caller names the owner */
        assert_true(s.m[i].created > 1000000000);
        assert_string_equal(s.m[i].entry, "");
    }
    memset(&s, 0, sizeof(s));
    s.stop_after = 1;
    assert_int_equal(sched_pool_models_each(pool, collect, &s, NULL), SCHED_OK);
    assert_int_equal(s.n, 1);
    sched_pool_destroy(pool);
}

/* A usable instance to ask something of (the tokenizer) is one of the request's model. */
static void test_pick_usable_model(void **state)
{
    static const char *const alpha[] = {"alpha"}, *const beta[] = {"beta"};
    sched_pool_t *pool = test_pool(SCHED_POLICY_LEAST_LOAD, SCHED_POLICY_LEAST_LOAD);

    (void)state;
    add_models(pool, "a0", 9000, SCHED_ROLE_DECODE, alpha, 1);
    add_models(pool, "b0", 9001, SCHED_ROLE_DECODE, beta, 1);
    add_models(pool, "b1", 9002, SCHED_ROLE_DECODE, beta, 1);
    for (uint64_t turn = 0; turn < 6; turn++) {
        sched_instance_t *si = sched_pool_pick_usable_model(pool, SCHED_ROLE_DECODE, turn, "beta");
        assert_non_null(si);
        assert_string_equal(sched_instance_id(si), turn % 2 ? "b1" : "b0");
        sched_instance_unref(si);
    }
    assert_null(sched_pool_pick_usable_model(pool, SCHED_ROLE_DECODE, 0, "gamma"));
    sched_pool_destroy(pool);
}

/* The descriptor's JSON form (admin API, config) takes `models`. */
static void test_desc_json(void **state)
{
    json_t *o = json_loads("{\"url\":\"http://h:1\",\"models\":[\"a\",\"b\"]}", 0, NULL);
    sched_instance_desc_t d;
    char err[256];

    (void)state;
    assert_int_equal(sched_instance_desc_from_json(o, &d, err, sizeof(err)), SCHED_OK);
    assert_int_equal(d.n_models, 2);
    assert_string_equal(d.models[1], "b");
    json_decref(o);
    o = json_loads("{\"url\":\"http://h:1\",\"models\":[\"a\",\"\"]}", 0, NULL);
    assert_int_equal(sched_instance_desc_from_json(o, &d, err, sizeof(err)), SCHED_ERR_INVALID);
    assert_non_null(strstr(err, "models[1]"));
    json_decref(o);
    o = json_loads("{\"url\":\"http://h:1\",\"models\":\"a\"}", 0, NULL);
    assert_int_equal(sched_instance_desc_from_json(o, &d, err, sizeof(err)), SCHED_ERR_INVALID);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_policy_filters),
        cmocka_unit_test(test_round_robin_per_model),
        cmocka_unit_test(test_learnt_names),
        cmocka_unit_test(test_adapters),
        cmocka_unit_test(test_union),
        cmocka_unit_test(test_desc_json),
        cmocka_unit_test(test_pick_usable_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
