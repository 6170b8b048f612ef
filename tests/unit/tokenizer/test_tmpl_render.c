/*
 * test_tmpl_render.c - the chat-template renderer construct by construct: statements, loop
 * variables, namespaces, macros, whitespace control, expressions, filters, methods, tojson.
 */
#include "tmpl_test_util.h"

static void test_text_and_output(void **state)
{
    (void)state;
    assert_render("plain", NULL, "plain");
    assert_render("a{{ 'b' }}c{{ 1 + 2 }}{{ 7 // 2 }}{{ 7 % 3 }}{{ 2 ** 3 }}", NULL, "abc3318");
    assert_render("{{ bos_token }}|{{ eos_token }}|{{ undefined_thing }}|", NULL, "<s>|</s>||");
    assert_render("{{ 1.5 }} {{ 2.0 }} {{ 10 / 4 }} {{ -3 }} {{ true }} {{ none }}", NULL,
                  "1.5 2.0 2.5 -3 true ");
    assert_render("{{ 'a' ~ 1 ~ true }}", NULL, "a1true");
    /* as the reference runtime: none in arithmetic or concatenation is an error */
    assert_render_fails("{{ 'a' ~ none }}", NULL, "none");
    /* one trailing newline of the template is dropped, as the loaders do */
    assert_render("x\n", NULL, "x");
    assert_render("x\n\n", NULL, "x\n");
    assert_render("{# comment #}y", NULL, "y");
    assert_render("{{ \"esc\\n\\t\\\"\\u00e9\" }}", NULL, "esc\n\t\"\xc3\xa9");
}

static void test_if_elif_else(void **state)
{
    (void)state;
    const char *t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
    assert_render(t, "{\"messages\":[],\"chat_template_kwargs\":{\"x\":1}}", "one");
    assert_render(t, "{\"messages\":[],\"chat_template_kwargs\":{\"x\":2}}", "two");
    assert_render(t, "{\"messages\":[],\"chat_template_kwargs\":{\"x\":3}}", "many");
    assert_render("{% if not x and (y or z) %}T{% endif %}",
                  "{\"messages\":[],\"chat_template_kwargs\":{\"z\":1}}", "T");
    assert_render("{{ 'y' if 1 > 2 else 'n' }}{{ 'only' if false }}", NULL, "n");
}

static void test_for_loop_variables(void **state)
{
    (void)state;
    assert_render("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}"
                  "{{ loop.last }}{{ loop.length }}{{ m.content }};{% endfor %}",
                  "{\"messages\":[{\"content\":\"a\"},{\"content\":\"b\"}]}",
                  "01truefalse2a;12falsetrue2b;");
    assert_render("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    assert_render("{% for x in [1,2,3,4] if x is odd %}{{ x }}{{ loop.length }}{% endfor %}", NULL,
                  "1232");
    assert_render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}", NULL,
                  "a=1,b=2,");
    assert_render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", NULL, "ab");
    assert_render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}"
                  "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
                  NULL, "02");
    assert_render("{% for x in messages[::-1] %}{{ x.content }}{% endfor %}",
                  "{\"messages\":[{\"content\":\"a\"},{\"content\":\"b\"},{\"content\":\"c\"}]}",
                  "cba");
    /* set inside a loop does not leak out of it */
    assert_render("{% set y = 0 %}{% for x in [1,2] %}{% set y = x %}{% endfor %}{{ y }}", NULL,
                  "0");
}

static void test_namespace_and_set(void **state)
{
    (void)state;
    assert_render(
        "{% set ns = namespace(n=0, s='') %}{% for x in [1,2,3] %}"
        "{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }}/{{ ns.s }}",
        NULL, "6/123");
    assert_render("{% set a, b = 1, 2 %}{{ a }}{{ b }}", NULL, "12");
    assert_render("{% set blk %}in {{ 1 }}{% endset %}[{{ blk }}]", NULL, "[in 1]");
    assert_render_fails("{% set x = 1 %}{% set x.y = 2 %}", NULL, "namespace");
}

static void test_macro(void **state)
{
    (void)state;
    assert_render("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}"
                  "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }}",
                  NULL, "hi a! hi b? hi c.");
    assert_render_fails("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "at most");
}

static void test_whitespace_control(void **state)
{
    (void)state;
    /* trim_blocks: newline after a block tag; lstrip_blocks: indentation before one */
    assert_render("{% if true %}\n  yes\n{% endif %}\nafter", NULL, "  yes\nafter");
    assert_render("line\n    {% if true %}x{% endif %}", NULL, "line\nx");
    /* {{ }} is not a block: no trimming around it */
    assert_render("  {{ 'a' }}\nb", NULL, "  a\nb");
    assert_render("a   {%- if true -%}   b   {%- endif -%}   c", NULL, "abc");
    assert_render("a \n {{- 'b' -}} \n c", NULL, "abc");
    assert_render("a  {#- note -#}  b", NULL, "ab");
}

static void test_expressions(void **state)
{
    (void)state;
    assert_render("{{ [1, 2, 3][1] }}{{ [1, 2, 3][-1] }}{{ 'abc'[0] }}{{ 'héllo'[1:3] }}", NULL,
                  "23aél");
    assert_render("{{ 'b' in 'abc' }}{{ 'x' not in ['x'] }}{{ 'k' in {'k': 1} }}", NULL,
                  "truefalsetrue");
    assert_render("{{ x is defined }}{{ messages is defined }}{{ none is none }}"
                  "{{ 'a' is string }}{{ {} is mapping }}{{ 3 is number }}{{ 2 is even }}",
                  NULL, "falsetruetruetruetruetruetrue");
    assert_render("{{ enable_thinking is false }}",
                  "{\"messages\":[],\"chat_template_kwargs\":{\"enable_thinking\":false}}", "true");
    assert_render("{{ messages|length - 1 }}", "{\"messages\":[1,2,3]}", "2");
    assert_render("{{ [1] + [2] }}", NULL, "[1, 2]");
    assert_render("{{ {'a': [1, 'x']} }}", NULL, "{\"a\": [1, \"x\"]}");
    assert_render("{{ messages[5].role }}|{{ none.x }}", NULL, "|");
}

static void test_filters(void **state)
{
    (void)state;
    assert_render("{{ '  x  '|trim }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ 'hello world'|title }}"
                  "|{{ 'hello'|capitalize }}|{{ [1,2]|join(',') }}|{{ 'abc'|length }}",
                  NULL, "x|AB|ab|Hello World|Hello|1,2|3");
    assert_render(
        "{{ x|default('d') }}{{ ''|default('e', true) }}{{ [3,4]|first }}{{ [3,4]|last }}", NULL,
        "de34");
    assert_render("{{ 'a-b-b'|replace('b', 'c') }}|{{ 12|string ~ 'x' }}|{{ '42'|int + 1 }}", NULL,
                  "a-c-c|12x|43");
    assert_render("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", NULL,
                  "a\n  b\n\n  c|  a\n  b");
    assert_render("{% for m in messages|selectattr('role', 'equalto', 'user') %}{{ m.content }}"
                  "{% endfor %}|{{ messages|rejectattr('x')|map(attribute='content')|join }}",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
                  "{\"role\":\"tool\",\"content\":\"t\",\"x\":1}]}",
                  "u|u");
    assert_render("{{ {'b': 1, 'a': 2}|items|list|length }}{{ [1,2]|reverse|join }}", NULL, "221");
    assert_render("{{ '<a & b>'|e }}{{ 'x'|safe }}", NULL, "&lt;a &amp; b&gt;x");
    assert_render_fails("{{ 'x'|nosuchfilter }}", NULL, "unsupported filter 'nosuchfilter'");
}

static void test_methods(void **state)
{
    (void)state;
    assert_render("{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}"
                  "{{ '\n\nx\n'.strip('\n') }}{{ '  y'.lstrip() }}{{ 'z  '.rstrip() }}",
                  NULL, "truetruexyz");
    assert_render("{{ 'a</think>b'.split('</think>')[-1] }}{{ 'a b  c'.split()|length }}"
                  "{{ 'a,b,c'.split(',', 1)[1] }}",
                  NULL, "b3b,c");
    assert_render(
        "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 'd') }}{{ {'a': 1}.keys()|list|length }}"
        "{{ {'a': 1}.values()[0] }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'aXa'.replace('a', 'b') "
        "}}",
        NULL, "1d11ABabbXb");
    assert_render_fails("{{ 'x'.frobnicate() }}", NULL, "unsupported method 'frobnicate()'");
}

static void test_tojson(void **state)
{
    (void)state;
    assert_render("{{ {'a': 'q\"\\\\\n\t\x01', 'b': [1, true, none], 'c': {}} | tojson }}", NULL,
                  "{\"a\": \"q\\\"\\\\\\n\\t\\u0001\", \"b\": [1, true, null], \"c\": {}}");
    assert_render("{{ 'é😀'|tojson }}{{ 'é😀'|tojson(ensure_ascii=true) }}", NULL,
                  "\"é😀\"\"\\u00e9\\ud83d\\ude00\"");
    assert_render("{{ {'a': [1, 2]}|tojson(indent=2) }}", NULL,
                  "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
    assert_render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true, separators=(',', ':')) }}", NULL,
                  "{\"a\":2,\"b\":1}");
    assert_render("{{ tools|tojson }}",
                  "{\"messages\":[],\"tools\":[{\"x\":0.5,\"y\":-7,\"z\":\"\\u2028\"}]}",
                  "[{\"x\": 0.5, \"y\": -7, \"z\": \"\xe2\x80\xa8\"}]");
}

static void test_globals_and_kwargs(void **state)
{
    (void)state;
    assert_render("{{ tools is none }}{{ add_generation_prompt }}", NULL, "truefalse");
    assert_render("{{ add_generation_prompt }}{{ reasoning_effort }}",
                  "{\"messages\":[],\"add_generation_prompt\":true,"
                  "\"chat_template_kwargs\":{\"reasoning_effort\":\"high\"}}",
                  "truehigh");
    assert_render_fails("{{ raise_exception('roles must alternate') }}", NULL,
                        "roles must alternate");
    assert_render_fails("x", "{\"messages\":[],\"chat_template_kwargs\":{\"tokenize\":true}}",
                        "tokenize");
    assert_render_fails("x", "{\"nomessages\":1}", "messages");
}

static uint64_t fixed_wall(void *arg)
{
    (void)arg;
    return 1767225600ull * PDB_NSEC_PER_SEC; /* 2026-01-01 00:00:00 UTC */
}

static void test_strftime_now_injected_clock(void **state)
{
    (void)state;
    setenv("TZ", "UTC", 1);
    char err[256];
    const char *src = "{{ strftime_now('%d %b %Y') }}";
    pdtok_template_t *t = pdtok_template_parse(src, strlen(src), NULL, NULL, err, sizeof(err));
    assert_non_null(t);
    json_t *req = json_pack("{s:[]}", "messages");
    pdb_buf_t out = PDB_BUF_INIT;
    pdb_clock_t wall = {.now = fixed_wall};
    assert_int_equal(pdtok_template_render_at(t, req, &wall, &out, err, sizeof(err)), 0);
    assert_string_equal(out.data, "01 Jan 2026");
    pdb_buf_free(&out);
    json_decref(req);
    pdtok_template_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_output),
        cmocka_unit_test(test_if_elif_else),
        cmocka_unit_test(test_for_loop_variables),
        cmocka_unit_test(test_namespace_and_set),
        cmocka_unit_test(test_macro),
        cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_globals_and_kwargs),
        cmocka_unit_test(test_strftime_now_injected_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
