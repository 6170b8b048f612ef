/*
 * fuzz_tmpl_parse.c - a chat template from a model's tokenizer_config.json (the Jinja subset
 * libpdtok renders): pdtok_template_parse, then rendering what it accepted with a fixed chat
 * request (system, user with parts, assistant with a tool call, a tool result; tools; a
 * chat_template_kwargs switch) under a fixed wall clock.
 *
 * Never a crash, over-read, leak or endless loop (the renderer's bounds stop a template that
 * loops over huge values); a template the parser refuses is told why; rendering the same request
 * twice gives the same text or the same refusal (whose text may be the template's own, empty
 * for raise_exception('')).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pdb/pdb_buf.h"
#include "pdb/pdb_clock.h"
#include "pdtok/template.h"

static const char request_json[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"héllo 世界\"}]},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
    "\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"2\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}],"
    "\"add_generation_prompt\":true,\"chat_template_kwargs\":{\"enable_thinking\":false}}";

static uint64_t fixed_ns(void *arg)
{
    (void)arg;
    return 1764547200000000000ull; /* 2025-12-01 */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *req;
    const pdb_clock_t wall = {.now = fixed_ns};
    char err[256] = "", err2[256] = "";
    pdb_buf_t a = PDB_BUF_INIT, b = PDB_BUF_INIT;
    pdtok_template_t *t;
    int ra, rb;

    if (req == NULL && (req = json_loads(request_json, 0, NULL)) == NULL)
        abort();
    t = pdtok_template_parse((const char *)data, size, "<s>", "</s>", err, sizeof(err));
    if (t == NULL) {
        if (err[0] == '\0')
            abort();
        return 0;
    }
    ra = pdtok_template_render_at(t, req, &wall, &a, err, sizeof(err));
    rb = pdtok_template_render_at(t, req, &wall, &b, err2, sizeof(err2));
    if (ra != rb || (ra == 0 && (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)) ||
        (ra != 0 && strcmp(err, err2) != 0))
        abort(); /* rendering is a function of the template and the request */
    pdb_buf_free(&a);
    pdb_buf_free(&b);
    pdtok_template_free(t);
    return 0;
}
