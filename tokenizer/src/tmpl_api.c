/*
 * tmpl_api.c - pdtok_template_*: loading tokenizer_config.json, parsing once, rendering a
 * request with the variables transformers' apply_chat_template passes.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "pdb/pdb_alloc.h"
#include "pdtok/template.h"
#include "tmpl_rt.h"

struct pdtok_template {
    tmpl_arena_t arena; /* the tree and the strings below */
    tmpl_node_t **body;
    size_t nbody;
    char *bos, *eos; /* NULL = not set by the config */
};

static void set_err(char *err, size_t errlen, const char *msg)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", msg);
}

pdtok_template_t *pdtok_template_parse(const char *source, size_t len, const char *bos,
                                       const char *eos, char *err, size_t errlen)
{
    char msg[512] = "";
    pdtok_template_t *t = pdb_calloc(1, sizeof(*t));
    if (t == NULL) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    tmpl_fail_t fail = {.msg = msg, .msglen = sizeof(msg)};
    t->arena.fail = &fail;
    if (setjmp(fail.jb) != 0) {
        tmpl_arena_free(&t->arena);
        pdb_free(t);
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "chat template: %s", msg);
        return NULL;
    }
    t->body = tmpl_parse(&t->arena, source, len, &t->nbody);
    if (bos != NULL)
        t->bos = tmpl_strndup(&t->arena, bos, strlen(bos));
    if (eos != NULL)
        t->eos = tmpl_strndup(&t->arena, eos, strlen(eos));
    t->arena.fail = NULL; /* immutable from here on */
    return t;
}

/* A special token in tokenizer_config.json: a string or an AddedToken {"content": ...}. */
static const char *token_text(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

pdtok_template_t *pdtok_template_load(const char *dir_or_config, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    if (dir_or_config == NULL) {
        set_err(err, errlen, "no path given");
        return NULL;
    }
    size_t n = strlen(dir_or_config);
    if (stat(dir_or_config, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir_or_config);
    else if (n >= 14 && strcmp(dir_or_config + n - 14, "tokenizer.json") == 0 &&
             (n == 14 || dir_or_config[n - 15] == '/')) /* the tokenizer: the config beside it */
        snprintf(path, sizeof(path), "%.*stokenizer_config.json", (int)(n - 14), dir_or_config);
    else
        snprintf(path, sizeof(path), "%s", dir_or_config);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (cfg == NULL) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "%s: %s (line %d)", path, jerr.text, jerr.line);
        return NULL;
    }
    const json_t *tv = json_object_get(cfg, "chat_template");
    const char *src = NULL;
    size_t len = 0;
    if (json_is_string(tv)) {
        src = json_string_value(tv);
        len = json_string_length(tv);
    } else if (json_is_array(tv)) {
        size_t i;
        json_t *e;
        json_array_foreach(tv, i, e)
        {
            const json_t *name = json_object_get(e, "name");
            const json_t *body = json_object_get(e, "template");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 &&
                json_is_string(body)) {
                src = json_string_value(body);
                len = json_string_length(body);
            }
        }
        if (src == NULL) {
            if (err != NULL && errlen > 0)
                snprintf(err, errlen, "%s: chat_template list has no template named \"default\"",
                         path);
            json_decref(cfg);
            return NULL;
        }
    } else {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "%s: no chat_template string or list", path);
        json_decref(cfg);
        return NULL;
    }
    pdtok_template_t *t =
        pdtok_template_parse(src, len, token_text(json_object_get(cfg, "bos_token")),
                             token_text(json_object_get(cfg, "eos_token")), err, errlen);
    json_decref(cfg);
    return t;
}

void pdtok_template_free(pdtok_template_t *t)
{
    if (t == NULL)
        return;
    tmpl_arena_free(&t->arena);
    pdb_free(t);
}

static tmpl_val_t global_fn(tmpl_rctx_t *r, int which)
{
    tmpl_func_t *fn = tmpl_alloc(&r->a, sizeof(*fn));
    fn->kind = F_GLOBAL;
    fn->global = which;
    return (tmpl_val_t){.k = V_FUNC, .u.fn = fn};
}

static void setup(tmpl_rctx_t *r, const pdtok_template_t *t, const json_t *req,
                  tmpl_scope_t *globals)
{
    static const struct {
        const char *name;
        int which;
    } fns[] = {{"raise_exception", G_RAISE},
               {"range", G_RANGE},
               {"strftime_now", G_STRFTIME},
               {"namespace", G_NAMESPACE}};
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
        tmpl_scope_set(r, globals, fns[i].name, strlen(fns[i].name), global_fn(r, fns[i].which));
    if (!json_is_object(req))
        tmpl_failf(&r->fail, "request is not a JSON object");
    const json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs))
        tmpl_failf(&r->fail, "request has no messages array");
    const json_t *tools = json_object_get(req, "tools");
    const json_t *agp = json_object_get(req, "add_generation_prompt");
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (kw != NULL && !json_is_object(kw) && !json_is_null(kw))
        tmpl_failf(&r->fail, "chat_template_kwargs is not an object");
    /* vLLM refuses these two kwargs (vllm/renderers/hf.py, resolve_chat_template_kwargs). */
    if (json_object_get(kw, "chat_template") || json_object_get(kw, "tokenize"))
        tmpl_failf(&r->fail, "unexpected chat_template_kwargs: chat_template/tokenize");
    tmpl_scope_set(r, globals, "messages", 8, tv_from_json(r, msgs));
    tmpl_scope_set(r, globals, "tools", 5, tools ? tv_from_json(r, tools) : tv_none());
    tmpl_scope_set(r, globals, "add_generation_prompt", 21,
                   agp ? tv_from_json(r, agp) : tv_bool(0));
    if (t->bos)
        tmpl_scope_set(r, globals, "bos_token", 9, tv_str(r, t->bos, strlen(t->bos)));
    if (t->eos)
        tmpl_scope_set(r, globals, "eos_token", 9, tv_str(r, t->eos, strlen(t->eos)));
    const char *key;
    json_t *val;
    if (json_is_object(kw))
        json_object_foreach((json_t *)kw, key, val)
        {
            tmpl_scope_set(r, globals, tmpl_strndup(&r->a, key, strlen(key)), strlen(key),
                           tv_from_json(r, val));
        }
}

int pdtok_template_render_at(const pdtok_template_t *t, const json_t *request,
                             const pdb_clock_t *wall_clock, pdb_buf_t *out, char *err,
                             size_t errlen)
{
    if (t == NULL || out == NULL) {
        set_err(err, errlen, "no template or output buffer");
        return -1;
    }
    tmpl_rctx_t r;
    memset(&r, 0, sizeof(r));
    char msg[512] = "";
    r.fail.msg = msg;
    r.fail.msglen = sizeof(msg);
    r.a.fail = &r.fail;
    r.a.limit = PDTOK_TMPL_MAX_MEMORY;
    r.max_steps = PDTOK_TMPL_MAX_STEPS;
    r.wall = wall_clock;
    if (setjmp(r.fail.jb) != 0) {
        tmpl_arena_free(&r.a);
        set_err(err, errlen, msg);
        return -1;
    }
    tmpl_scope_t globals = {0};
    setup(&r, t, request, &globals);
    tmpl_scope_t top = {.parent = &globals};
    tmpl_sb_t sb = {.limit = PDTOK_TMPL_MAX_OUTPUT};
    tmpl_sb_add(&r.a, &sb, "", 0);
    tmpl_exec(&r, t->body, t->nbody, &top, &sb);
    pdb_status_t st = pdb_buf_append(out, sb.d, sb.len);
    tmpl_arena_free(&r.a);
    if (st != PDB_OK) {
        set_err(err, errlen, pdb_strerror(st));
        return -1;
    }
    return 0;
}

int pdtok_template_render(const pdtok_template_t *t, const json_t *request, pdb_buf_t *out,
                          char *err, size_t errlen)
{
    return pdtok_template_render_at(t, request, NULL, out, err, errlen);
}
