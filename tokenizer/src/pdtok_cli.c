/*
 * pdtok_cli.c - the command-line front end (`pdtok`, `pdgw tokenize`): JSON lines in, JSON
 * lines out, one output line per input line; a bad line gets {"error": ...} and the run
 * goes on.
 *
 *   --tokenizer PATH   tokenizer.json or its directory (required)
 *   --no-special       do not add the post-processor's special tokens (bos)
 *   --decode           also decode the ids: "decoded" (with --skip-special: specials dropped)
 *   --chat             lines are chat requests {"messages", "tools", ...}: render with the
 *                      model's chat template (tokenizer_config.json), encode without bos
 *   --bench ROUNDS     encode every input line ROUNDS times on --threads N threads and print
 *                      one JSON line of throughput instead of the ids
 * A text line is {"text": "..."} or {"text_hex": "..."} (raw bytes, for input that is not
 * UTF-8 and so cannot travel in a JSON string).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_buf.h"
#include "pdb/pdb_hex.h"
#include "pdtok/tokenizer.h"
#if __has_include("pdtok/template.h")
#include "pdtok/template.h"
#define PDTOK_CLI_CHAT 1
#endif

typedef struct cli_opts {
    const char *path;
    bool add_special, decode, skip_special, chat;
    long bench_rounds, threads;
} cli_opts_t;

static int usage(void)
{
    fprintf(stderr, "usage: pdtok --tokenizer PATH [--no-special] [--decode] [--skip-special] "
                    "[--chat] [--bench ROUNDS [--threads N]] < lines.jsonl\n");
    return 2;
}

static int parse_args(int argc, char **argv, cli_opts_t *o)
{
    *o = (cli_opts_t){.add_special = true, .threads = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc)
            o->path = argv[++i];
        else if (strcmp(a, "--no-special") == 0)
            o->add_special = false;
        else if (strcmp(a, "--decode") == 0)
            o->decode = true;
        else if (strcmp(a, "--skip-special") == 0)
            o->skip_special = true;
        else if (strcmp(a, "--chat") == 0)
            o->chat = true;
        else if (strcmp(a, "--bench") == 0 && i + 1 < argc)
            o->bench_rounds = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--threads") == 0 && i + 1 < argc)
            o->threads = strtol(argv[++i], NULL, 10);
        else
            return -1;
    }
    if (!o->path || o->bench_rounds < 0 || o->threads < 1 || o->threads > 256)
        return -1;
    return 0;
}

/* The bytes of a text line: "text" (UTF-8) or "text_hex". Returns NULL with <why> set. */
static const char *line_text(const json_t *req, pdb_buf_t *raw, size_t *len, const char **why)
{
    json_t *t = json_object_get(req, "text"), *h = json_object_get(req, "text_hex");
    if (json_is_string(t)) {
        *len = json_string_length(t);
        return json_string_value(t);
    }
    if (!json_is_string(h)) {
        *why = "a line needs \"text\" (string) or \"text_hex\"";
        return NULL;
    }
    const char *x = json_string_value(h);
    size_t n = json_string_length(h);
    if (n % 2) {
        *why = "text_hex has an odd number of digits";
        return NULL;
    }
    for (size_t i = 0; i < n; i += 2) {
        int hi = pdb_hex_val(x[i]), lo = pdb_hex_val(x[i + 1]);
        if (hi < 0 || lo < 0) {
            *why = "text_hex has a non-hex digit";
            return NULL;
        }
        if (pdb_buf_append_char(raw, (char)(hi * 16 + lo)) != PDB_OK) {
            *why = "out of memory";
            return NULL;
        }
    }
    *len = raw->len;
    return raw->data ? raw->data : "";
}

static void print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    } else {
        fputs("{\"error\":\"out of memory\"}\n", stdout);
    }
}

static void print_error(const char *msg)
{
    json_t *o = json_pack("{s:s}", "error", msg);
    print_json(o);
    json_decref(o);
}

/* One input line -> one output line. */
static void run_line(const pdtok_t *tok, const void *tmpl, const cli_opts_t *o, const char *line,
                     size_t n)
{
    json_error_t je;
    json_t *req = json_loadb(line, n, 0, &je), *out = NULL;
    pdb_buf_t raw = PDB_BUF_INIT, rendered = PDB_BUF_INIT;
    pdtok_ids_t ids = {0};
    const char *why = NULL, *text = NULL;
    char err[256] = "";
    size_t len = 0;
    if (!json_is_object(req)) {
        snprintf(err, sizeof(err), "bad JSON line: %s", req ? "not an object" : je.text);
        why = err;
    } else if (o->chat) {
#ifdef PDTOK_CLI_CHAT
        if (pdtok_template_render(tmpl, req, &rendered, err, sizeof(err)) != 0)
            why = err[0] ? err : "chat template failed";
        text = rendered.data ? rendered.data : "";
        len = rendered.len;
#else
        why = "this build has no chat templates";
#endif
    } else {
        text = line_text(req, &raw, &len, &why);
    }
    pdtok_status_t st = PDTOK_OK;
    if (!why) {
        st = pdtok_encode(tok, text, len, o->chat ? false : o->add_special, &ids);
        if (st != PDTOK_OK)
            why = pdtok_strerror(st);
    }
    if (!why) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < ids.len; i++)
            json_array_append_new(arr, json_integer(ids.ids[i]));
        out = json_object();
        json_object_set_new(out, "ids", arr);
        if (o->chat)
            json_object_set_new(out, "text", json_stringn(text, len));
        if (o->decode) {
            char *dec = NULL;
            size_t dlen = 0;
            st = pdtok_decode(tok, ids.ids, ids.len, o->skip_special, &dec, &dlen);
            json_object_set_new(out, "decoded",
                                st == PDTOK_OK ? json_stringn(dec, dlen) : json_null());
            free(dec);
        }
        print_json(out);
    } else {
        print_error(why);
    }
    json_decref(out);
    json_decref(req);
    pdb_buf_free(&raw);
    pdb_buf_free(&rendered);
    pdtok_ids_free(&ids);
}

/* ---- --bench ---- */
typedef struct bench {
    const pdtok_t *tok;
    char **texts;
    size_t *lens;
    size_t n;
    long rounds;
    bool add_special;
    size_t tokens;
    int failed;
} bench_t;

static void *bench_thread(void *arg)
{
    bench_t *b = arg;
    pdtok_ids_t ids = {0};
    for (long r = 0; r < b->rounds; r++)
        for (size_t i = 0; i < b->n; i++) {
            ids.len = 0;
            if (pdtok_encode(b->tok, b->texts[i], b->lens[i], b->add_special, &ids) != PDTOK_OK)
                b->failed = 1;
            b->tokens += ids.len;
        }
    pdtok_ids_free(&ids);
    return NULL;
}

static int run_bench(const pdtok_t *tok, const cli_opts_t *o, char **lines, size_t *lens, size_t n)
{
    size_t bytes = 0;
    char **texts = calloc(n ? n : 1, sizeof(*texts));
    size_t *tlens = calloc(n ? n : 1, sizeof(*tlens));
    bench_t *b = calloc((size_t)o->threads, sizeof(*b));
    pthread_t *th = calloc((size_t)o->threads, sizeof(*th));
    if (!texts || !tlens || !b || !th) {
        free(texts), free(tlens), free(b), free(th);
        return 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *req = json_loadb(lines[i], lens[i], 0, NULL);
        pdb_buf_t raw = PDB_BUF_INIT;
        const char *why = NULL;
        size_t len = 0;
        const char *t = req ? line_text(req, &raw, &len, &why) : NULL;
        if (t && (texts[k] = malloc(len + 1))) {
            memcpy(texts[k], t, len);
            tlens[k++] = len;
            bytes += len;
        }
        pdb_buf_free(&raw);
        json_decref(req);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long t = 0; t < o->threads; t++) {
        b[t] = (bench_t){tok, texts, tlens, k, o->bench_rounds, o->add_special, 0, 0};
        pthread_create(&th[t], NULL, bench_thread, &b[t]);
    }
    size_t tokens = 0;
    int failed = 0;
    for (long t = 0; t < o->threads; t++) {
        pthread_join(th[t], NULL);
        tokens += b[t].tokens;
        failed |= b[t].failed;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    double total = (double)bytes * (double)o->bench_rounds * (double)o->threads;
    printf("{\"threads\":%ld,\"rounds\":%ld,\"texts\":%zu,\"bytes\":%.0f,\"tokens\":%zu,"
           "\"seconds\":%.3f,\"mb_per_s\":%.2f,\"tokens_per_s\":%.0f,\"failed\":%d}\n",
           o->threads, o->bench_rounds, k, total, tokens, s, total / 1e6 / s, (double)tokens / s,
           failed);
    for (size_t i = 0; i < k; i++)
        free(texts[i]);
    free(texts), free(tlens), free(b), free(th);
    return failed;
}

int pdtok_cli_main(int argc, char **argv)
{
    cli_opts_t o;
    if (parse_args(argc, argv, &o) != 0)
        return usage();
    char err[512];
    pdtok_t *tok = pdtok_load(o.path, err, sizeof(err));
    if (!tok) {
        fprintf(stderr, "pdtok: %s\n", err);
        return 1;
    }
    void *tmpl = NULL;
    if (o.chat) {
#ifdef PDTOK_CLI_CHAT
        tmpl = pdtok_template_load(o.path, err, sizeof(err));
        if (!tmpl) {
            fprintf(stderr, "pdtok: chat template: %s\n", err);
            pdtok_free(tok);
            return 1;
        }
#else
        fprintf(stderr, "pdtok: this build has no chat templates\n");
        pdtok_free(tok);
        return 1;
#endif
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    char **lines = NULL;
    size_t *lens = NULL, nlines = 0, caplines = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        if (n == 0)
            continue;
        if (o.bench_rounds > 0) { /* keep the lines, encode them later under the clock */
            if (nlines == caplines) {
                caplines = caplines ? caplines * 2 : 1024;
                char **nl = realloc(lines, caplines * sizeof(*nl));
                size_t *nn = realloc(lens, caplines * sizeof(*nn));
                if (nl)
                    lines = nl;
                if (nn)
                    lens = nn;
                if (!nl || !nn) {
                    rc = 1;
                    break;
                }
            }
            if (!(lines[nlines] = strndup(line, (size_t)n))) {
                rc = 1;
                break;
            }
            lens[nlines++] = (size_t)n;
            continue;
        }
        run_line(tok, tmpl, &o, line, (size_t)n);
        fflush(stdout);
    }
    if (o.bench_rounds > 0 && rc == 0)
        rc = run_bench(tok, &o, lines, lens, nlines);
    for (size_t i = 0; i < nlines; i++)
        free(lines[i]);
    free(lines);
    free(lens);
    free(line);
#ifdef PDTOK_CLI_CHAT
    pdtok_template_free(tmpl);
#endif
    pdtok_free(tok);
    return rc;
}
