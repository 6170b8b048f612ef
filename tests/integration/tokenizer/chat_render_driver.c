/*
 * chat_render_driver.c - pdtok-tmpl-render, a test driver: renders chat templates for the
 * exactness test. One JSON object per input line, {template_dir, request}; one per output line,
 * {"ok": text} or {"error": message}. Templates are loaded once per directory and kept.
 * With --load-only DIR it loads one template and prints "ok" or the load error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pdtok/template.h"

#define MAX_TEMPLATES 16

typedef struct loaded {
    char *dir;
    pdtok_template_t *t;
    char err[512];
} loaded_t;

static loaded_t cache[MAX_TEMPLATES];

static loaded_t *get(const char *dir)
{
    for (int i = 0; i < MAX_TEMPLATES && cache[i].dir; i++)
        if (strcmp(cache[i].dir, dir) == 0)
            return &cache[i];
    for (int i = 0; i < MAX_TEMPLATES; i++)
        if (cache[i].dir == NULL) {
            cache[i].dir = strdup(dir);
            cache[i].t = pdtok_template_load(dir, cache[i].err, sizeof(cache[i].err));
            return &cache[i];
        }
    return NULL;
}

static void emit(const char *key, const char *s, size_t n)
{
    json_t *o = json_object();
    json_object_set_new(o, key, json_stringn(s, n));
    char *txt = json_dumps(o, JSON_COMPACT);
    puts(txt ? txt : "{\"error\":\"cannot encode\"}");
    free(txt);
    json_decref(o);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--load-only") == 0) {
        char err[512];
        pdtok_template_t *t = pdtok_template_load(argv[2], err, sizeof(err));
        puts(t ? "ok" : err);
        pdtok_template_free(t);
        return t ? 0 : 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t jerr;
        json_t *in = json_loadb(line, (size_t)n, 0, &jerr);
        const char *dir = json_string_value(json_object_get(in, "template_dir"));
        loaded_t *l = dir ? get(dir) : NULL;
        if (l == NULL) {
            emit("error", "bad input line", 14);
        } else if (l->t == NULL) {
            emit("error", l->err, strlen(l->err));
        } else {
            pdb_buf_t out = PDB_BUF_INIT;
            char err[512];
            if (pdtok_template_render(l->t, json_object_get(in, "request"), &out, err,
                                      sizeof(err)) == 0)
                emit("ok", out.data ? out.data : "", out.len);
            else
                emit("error", err, strlen(err));
            pdb_buf_free(&out);
        }
        json_decref(in);
        fflush(stdout);
    }
    free(line);
    for (int i = 0; i < MAX_TEMPLATES; i++) {
        free(cache[i].dir);
        pdtok_template_free(cache[i].t);
    }
    return 0;
}
