/* pdgw-sim tokenizer, chat template and deterministic output plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static int setup(void **state)
{
    char *argv[] = {"pdgw-sim", NULL};
    return sim_config_parse(1, argv, &sim_cfg);
}

static void test_tokenize(void **state)
{
    sim_tokens_t a = {0}, b = {0};
    const char *s = "Hello, world!  Hello\tworld";
    assert_int_equal(sim_tokenize(s, strlen(s), &a), 0);
    assert_int_equal(a.n, 6); /* Hello , world ! Hello world */
    assert_int_equal(a.ids[0], a.ids[4]);
    assert_int_equal(a.ids[2], a.ids[5]);
    assert_int_not_equal(a.ids[0], a.ids[2]);
    for (size_t i = 0; i < a.n; i++)
        assert_true(a.ids[i] <= 0x7fffffff);
    /* multi-byte UTF-8 stays in one piece */
    assert_int_equal(sim_tokenize("caf\xc3\xa9 ok", 8, &b), 0);
    assert_int_equal(b.n, 2);
    sim_tokens_free(&a);
    sim_tokens_free(&b);
    assert_int_equal(sim_tokenize("   ", 3, &a), 0);
    assert_int_equal(a.n, 0);
    sim_tokens_free(&a);
}

static void test_chat_template(void **state)
{
    json_error_t err;
    json_t *m =
        json_loads("[{\"role\":\"system\",\"content\":\"be brief\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                   "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":null}]",
                   0, &err);
    char *t = sim_chat_template(m);
    assert_non_null(t);
    assert_string_equal(t, "<|system|>\nbe brief\n<|user|>\na b\n<|user|>\n\n<|assistant|>\n");
    free(t);
    json_decref(m);
}

static sim_tokens_t prompt_of(const char *s)
{
    sim_tokens_t t = {0};
    sim_tokenize(s, strlen(s), &t);
    return t;
}

static void check_offsets(const sim_output_t *o)
{
    /* the pieces revealed token by token concatenate to the text */
    assert_int_equal(o->off[0], 0);
    for (size_t i = 0; i < o->n; i++)
        assert_true(o->off[i] <= o->off[i + 1]);
    assert_int_equal(o->off[o->n], strlen(o->text));
}

static void test_output_deterministic(void **state)
{
    sim_tokens_t p = prompt_of("the same prompt twice");
    sim_sampling_t sp = {.max_tokens = 40, .ignore_eos = 1, .temperature = 1.0};
    sim_output_t a, b, c;
    assert_int_equal(sim_output_plan(&p, &sp, &a), 0);
    assert_int_equal(sim_output_plan(&p, &sp, &b), 0);
    assert_string_equal(a.text, b.text);
    assert_int_equal(a.n, 40);
    assert_string_equal(a.finish_reason, "length");
    check_offsets(&a);
    /* a shorter max_tokens gives a prefix */
    sp.max_tokens = 7;
    assert_int_equal(sim_output_plan(&p, &sp, &c), 0);
    assert_int_equal(strncmp(a.text, c.text, strlen(c.text)), 0);
    assert_int_equal(c.n, 7);
    sim_output_free(&c);
    /* the seed changes the text */
    sp.max_tokens = 40;
    sp.has_seed = 1;
    sp.seed = 9;
    assert_int_equal(sim_output_plan(&p, &sp, &c), 0);
    assert_string_not_equal(a.text, c.text);
    sim_output_free(&a);
    sim_output_free(&b);
    sim_output_free(&c);
    sim_tokens_free(&p);
}

static void test_stop_strings(void **state)
{
    sim_tokens_t p = prompt_of("stop string prompt");
    sim_sampling_t sp = {.max_tokens = 30, .ignore_eos = 1, .temperature = 1.0};
    sim_output_t full, cut;
    assert_int_equal(sim_output_plan(&p, &sp, &full), 0);
    /* stop on the 6th word (with its leading space) */
    const char *w = full.text;
    for (int k = 0; k < 5; k++)
        w = strchr(w + 1, ' ');
    const char *end = strchr(w + 1, ' ');
    char stop[64];
    snprintf(stop, sizeof(stop), "%.*s", (int)(end - w), w);
    char *stops[] = {stop};
    sp.stop = stops;
    sp.n_stop = 1;
    assert_int_equal(sim_output_plan(&p, &sp, &cut), 0);
    assert_string_equal(cut.finish_reason, "stop");
    assert_string_equal(cut.stop_reason, stop);
    /* cut before the earliest occurrence */
    const char *first = strstr(full.text, stop);
    assert_int_equal(strlen(cut.text), (size_t)(first - full.text));
    assert_int_equal(strncmp(cut.text, full.text, strlen(cut.text)), 0);
    check_offsets(&cut);
    sim_output_free(&cut);
    /* a stop string spanning two words is held back until it resolves */
    char span[64];
    const char *w2 = strchr(full.text + 1, ' ');
    snprintf(span, sizeof(span), "%.*s", (int)(w2 - full.text) + 3, full.text);
    stops[0] = span;
    assert_int_equal(sim_output_plan(&p, &sp, &cut), 0);
    assert_string_equal(cut.text, "");
    assert_true(cut.n >= 2 && cut.n <= 3);
    for (size_t i = 0; i <= cut.n; i++)
        assert_int_equal(cut.off[i], 0); /* nothing was revealed before the match */
    sim_output_free(&cut);
    sim_output_free(&full);
    sim_tokens_free(&p);
}

static void test_eos_and_min_tokens(void **state)
{
    sim_cfg.eos_period = 3;
    sim_tokens_t p = prompt_of("eos prompt");
    sim_sampling_t sp = {.max_tokens = 100, .temperature = 1.0};
    sim_output_t o, m, ig;
    assert_int_equal(sim_output_plan(&p, &sp, &o), 0);
    assert_string_equal(o.finish_reason, "stop");
    assert_null(o.stop_reason);
    assert_true(o.n < 100);
    check_offsets(&o);
    sp.min_tokens = (int)o.n + 5;
    assert_int_equal(sim_output_plan(&p, &sp, &m), 0);
    assert_true(m.n >= o.n + 5);
    sp.min_tokens = 0;
    sp.ignore_eos = 1;
    assert_int_equal(sim_output_plan(&p, &sp, &ig), 0);
    assert_int_equal(ig.n, 100);
    assert_string_equal(ig.finish_reason, "length");
    /* the words before EOS are the same with and without ignore_eos */
    assert_int_equal(strncmp(ig.text, o.text, strlen(o.text)), 0);
    sim_cfg.eos_period = 0;
    sim_output_free(&ig);
    sp.ignore_eos = 0;
    assert_int_equal(sim_output_plan(&p, &sp, &ig), 0);
    assert_int_equal(ig.n, 100);
    sim_output_free(&o);
    sim_output_free(&m);
    sim_output_free(&ig);
    sim_tokens_free(&p);
    sim_cfg.eos_period = 64;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_output_deterministic),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_eos_and_min_tokens),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
