/*
 * test_tmpl_errors.c - what the chat-template loader refuses (with the line), the bounds of a
 * rendering, loading tokenizer_config.json, allocation failures, and concurrent renders.
 */
#include <pthread.h>
#include <unistd.h>

#include "pdb/pdb_alloc.h"
#include "tmpl_test_util.h"

static void assert_load_fails(const char *src, const char *needle)
{
    char err[512] = "";
    pdtok_template_t *t = pdtok_template_parse(src, strlen(src), NULL, NULL, err, sizeof(err));
    if (t != NULL)
        fail_msg("\"%s\" loaded", src);
    if (strstr(err, needle) == NULL)
        fail_msg("error \"%s\" lacks \"%s\"", err, needle);
}

static void test_load_errors_name_line_and_construct(void **state)
{
    (void)state;
    assert_load_fails("a\nb\n{% include 'x' %}", "line 3: unsupported statement '{% include %}'");
    assert_load_fails("{% for x in y %}\n{{ x }}", "line 1: missing '{% endfor %}'");
    assert_load_fails("\n\n{{ x | frob }}", "line 3: unsupported filter 'frob'");
    assert_load_fails("{{ x is frob }}", "unsupported test 'frob'");
    assert_load_fails("{{ x.pop() }}", "unsupported method 'pop()'");
    assert_load_fails("{% if x %}a{% endfor %}", "unexpected end of block");
    assert_load_fails("{{ 'open", "unterminated string");
    assert_load_fails("{{ x ", "unclosed");
    assert_load_fails("{% call foo() %}{% endcall %}", "unsupported statement '{% call %}'");
    assert_load_fails(
        "{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
        "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
        "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
        "1 }}",
        "nested too deeply");
    assert_load_fails("{{ 1 $ 2 }}", "unexpected character");
    assert_load_fails("{% endif %}", "unexpected end of block");
}

static void test_bounds(void **state)
{
    (void)state;
    /* unbounded macro recursion */
    assert_render_fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested");
    /* output growing past the bound */
    assert_render_fails("{% for i in range(100000) %}{% for j in range(1000) %}"
                        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                        "{% endfor %}{% endfor %}",
                        NULL, "exceed");
    /* a loop that does nothing still stops */
    assert_render_fails("{% set r = range(10000) %}{% for i in r %}{% for j in r %}{% endfor %}"
                        "{% endfor %}",
                        NULL, "steps");
    /* a huge range is bounded too */
    assert_render_fails("{{ range(1000000000)|length }}", NULL, "template");
    /* a doubling string stops at the memory bound */
    assert_render_fails("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(60) %}"
                        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                        NULL, "bytes");
}

static char tmpdir[256];

static const char *write_config(const char *name, const char *json)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    return path;
}

static int setup_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pdtok-tmpl-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void render_file(const char *path, const char *expected)
{
    char err[512];
    pdtok_template_t *t = pdtok_template_load(path, err, sizeof(err));
    if (t == NULL)
        fail_msg("load: %s", err);
    json_t *req = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "q");
    pdb_buf_t out = PDB_BUF_INIT;
    assert_int_equal(pdtok_template_render(t, req, &out, err, sizeof(err)), 0);
    assert_string_equal(out.data, expected);
    pdb_buf_free(&out);
    json_decref(req);
    pdtok_template_free(t);
}

static void test_load_config(void **state)
{
    (void)state;
    char err[512];
    /* a directory; AddedToken objects for the special tokens; huge integers are fine */
    write_config(
        "tokenizer_config.json",
        "{\"model_max_length\": 1000000000000000019884624838656,"
        " \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"},"
        " \"eos_token\": \"<E>\","
        " \"chat_template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}");
    render_file(tmpdir, "<B>q<E>");
    /* the model's tokenizer.json names its folder: the config beside it (the file itself need
     * not exist for the template) */
    char tok_path[600];
    snprintf(tok_path, sizeof(tok_path), "%s/tokenizer.json", tmpdir);
    render_file(tok_path, "<B>q<E>");
    /* a list of named templates: "default" is the one */
    const char *p = write_config(
        "named.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                      " {\"name\": \"default\", \"template\": \"D{{ bos_token }}\"}]}");
    render_file(p, "D");
    p = write_config("nodefault.json",
                     "{\"chat_template\": [{\"name\": \"x\", \"template\": \"T\"}]}");
    assert_null(pdtok_template_load(p, err, sizeof(err)));
    assert_non_null(strstr(err, "default"));
    p = write_config("none.json", "{\"bos_token\": \"x\"}");
    assert_null(pdtok_template_load(p, err, sizeof(err)));
    assert_non_null(strstr(err, "chat_template"));
    p = write_config("garbage.json", "{\"chat_template\": \"{{ x \x01");
    assert_null(pdtok_template_load(p, err, sizeof(err)));
    p = write_config("broken.json", "{\"chat_template\": \"{% if x %}\"}");
    assert_null(pdtok_template_load(p, err, sizeof(err)));
    assert_non_null(strstr(err, "line 1"));
    assert_null(pdtok_template_load("/nonexistent/dir", err, sizeof(err)));
    assert_null(pdtok_template_load(NULL, err, sizeof(err)));
}

/* Every allocation of load and render, failed in turn: a clean error, nothing leaked (the
 * sanitizer build checks the leaks). */
static void test_allocation_failures(void **state)
{
    (void)state;
    const char *src = "{% set ns = namespace(a=[]) %}{% for m in messages %}"
                      "{{ m.content|upper ~ (m|tojson) }}{% endfor %}{% macro f(x) %}{{ x }}"
                      "{% endmacro %}{{ f('y') }}";
    json_t *req = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"},"
                             "{\"role\":\"assistant\",\"content\":\"d\"}]}",
                             0, NULL);
    assert_non_null(req);
    int loaded_ok = 0, rendered_ok = 0;
    for (uint64_t n = 1; n < 400; n++) {
        char err[256];
        pdb_alloc_fail_at(n, 0);
        pdtok_template_t *t = pdtok_template_parse(src, strlen(src), "<s>", NULL, err, sizeof(err));
        if (t == NULL) {
            pdb_alloc_fail_at(0, 0);
            continue;
        }
        loaded_ok++;
        pdb_buf_t out = PDB_BUF_INIT;
        int rc = pdtok_template_render(t, req, &out, err, sizeof(err));
        pdb_alloc_fail_at(0, 0);
        if (rc == 0) {
            rendered_ok++;
            assert_string_equal(out.data, "ABC{\"role\": \"user\", \"content\": \"abc\"}"
                                          "D{\"role\": \"assistant\", \"content\": \"d\"}y");
        } else {
            assert_int_equal(out.len, 0); /* output untouched on failure */
        }
        pdb_buf_free(&out);
        pdtok_template_free(t);
    }
    assert_true(loaded_ok > 0 && rendered_ok > 0);
    json_decref(req);
}

typedef struct worker {
    const pdtok_template_t *t;
    json_t *req;
    const char *expected;
    int ok;
} worker_t;

static void *render_many(void *arg)
{
    worker_t *w = arg;
    w->ok = 1;
    for (int i = 0; i < 200; i++) {
        pdb_buf_t out = PDB_BUF_INIT;
        char err[256];
        if (pdtok_template_render(w->t, w->req, &out, err, sizeof(err)) != 0 ||
            strcmp(out.data, w->expected) != 0)
            w->ok = 0;
        pdb_buf_free(&out);
    }
    return NULL;
}

static void test_concurrent_renders(void **state)
{
    (void)state;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}"
                      "{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ m.content }}{% endfor %}";
    char err[256];
    pdtok_template_t *t = pdtok_template_parse(src, strlen(src), NULL, NULL, err, sizeof(err));
    assert_non_null(t);
    worker_t w[4];
    pthread_t th[4];
    const char *reqs[] = {"{\"messages\":[{\"content\":\"a\"},{\"content\":\"b\"}]}",
                          "{\"messages\":[{\"content\":\"x\"}]}"};
    const char *exp[] = {"1a2b", "1x"};
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){.t = t, .req = json_loads(reqs[i % 2], 0, NULL), .expected = exp[i % 2]};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(w[i].ok);
        json_decref(w[i].req);
    }
    pdtok_template_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors_name_line_and_construct),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_load_config),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_concurrent_renders),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
