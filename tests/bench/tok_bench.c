/*
 * tok-bench: libpdtok's encode throughput in tokens per CPU-second, driven by b9_tokenizer.py.
 * The tokenizer is loaded once; the driver then sends one command per line and reads one
 * answer line, so the JavaScript reference can run its rounds between ours on the same files.
 *
 * Usage: tok-bench TOKENIZER_DIR < commands
 *   cold FILE          a fresh thread (so an empty word cache) encodes FILE's texts once
 *   warm FILE MIN_MS   a fresh thread encodes them once untimed, then again until MIN_MS of
 *                      CPU time has gone by
 *   -> ok CPU_S TOKENS PASSES DIGEST    (DIGEST: count:fnv1a per text, of the last pass)
 *   -> error WHY
 * FILE holds texts each ended by a NUL byte. CPU time is the process's (getrusage), taken
 * while the main thread waits in pthread_join, and excludes reading FILE.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "pdtok/tokenizer.h"

typedef struct job {
    const pdtok_t *tok;
    char *buf;         /* the file; texts are NUL-ended inside it */
    size_t *off, *len; /* text i = buf + off[i], len[i] bytes */
    size_t n;          /* texts */
    pdtok_ids_t *ids;  /* per text, of the last pass */
    double min_cpu_s;  /* < 0: cold (one timed pass, nothing before it) */
    double cpu_s;
    size_t tokens, passes;
    int failed;
} job_t;

static double cpu_now(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static size_t encode_pass(job_t *j)
{
    size_t tokens = 0;

    for (size_t i = 0; i < j->n; i++) {
        j->ids[i].len = 0;
        if (pdtok_encode(j->tok, j->buf + j->off[i], j->len[i], true, &j->ids[i]) != PDTOK_OK)
            j->failed = 1;
        tokens += j->ids[i].len;
    }
    return tokens;
}

static void *run_job(void *arg)
{
    job_t *j = arg;

    if (j->min_cpu_s >= 0)
        encode_pass(j); /* fills this thread's word cache */
    double t0 = cpu_now();
    do {
        j->tokens += encode_pass(j);
        j->passes++;
        j->cpu_s = cpu_now() - t0;
    } while (j->cpu_s < j->min_cpu_s);
    return NULL;
}

/* Reads FILE and indexes its NUL-ended texts into <j>; 0 on success. */
static int job_read(job_t *j, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    j->buf = malloc((size_t)size + 1);
    size_t cap = 0;
    if (!j->buf || fread(j->buf, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        return -1;
    }
    fclose(f);
    for (size_t p = 0; p < (size_t)size;) {
        size_t l = strnlen(j->buf + p, (size_t)size - p);
        if (j->n == cap) {
            cap = cap ? 2 * cap : 64;
            j->off = realloc(j->off, cap * sizeof(size_t));
            j->len = realloc(j->len, cap * sizeof(size_t));
            if (!j->off || !j->len)
                return -1;
        }
        j->off[j->n] = p;
        j->len[j->n++] = l;
        p += l + 1;
    }
    j->ids = calloc(j->n ? j->n : 1, sizeof(pdtok_ids_t));
    return j->ids ? 0 : -1;
}

static void job_reply(const job_t *j)
{
    printf("ok %.6f %zu %zu ", j->cpu_s, j->tokens, j->passes);
    for (size_t i = 0; i < j->n; i++) {
        uint32_t h = 2166136261u; /* FNV-1a over the ids as 32-bit words, as the JS side */
        for (size_t k = 0; k < j->ids[i].len; k++)
            h = (h ^ (uint32_t)j->ids[i].ids[k]) * 16777619u;
        printf("%s%zu:%u", i ? "," : "", j->ids[i].len, h);
    }
    printf("\n");
}

static void job_free(job_t *j)
{
    for (size_t i = 0; j->ids && i < j->n; i++)
        pdtok_ids_free(&j->ids[i]);
    free(j->ids), free(j->off), free(j->len), free(j->buf);
}

int main(int argc, char **argv)
{
    char err[256] = "", line[4096], path[4000];

    if (argc != 2) {
        fprintf(stderr, "usage: tok-bench TOKENIZER_DIR < commands\n");
        return 2;
    }
    pdtok_t *tok = pdtok_load(argv[1], err, sizeof(err));
    if (!tok) {
        fprintf(stderr, "tok-bench: %s: %s\n", argv[1], err);
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof(line), stdin)) {
        job_t j = {.tok = tok, .min_cpu_s = -1};
        long min_ms = 0;
        pthread_t th;
        if (sscanf(line, "cold %3999s", path) == 1)
            ;
        else if (sscanf(line, "warm %3999s %ld", path, &min_ms) == 2)
            j.min_cpu_s = (double)min_ms / 1e3;
        else {
            printf("error bad command\n");
            continue;
        }
        if (job_read(&j, path) != 0)
            printf("error cannot read %s\n", path);
        else if (pthread_create(&th, NULL, run_job, &j) != 0)
            printf("error pthread_create\n");
        else {
            pthread_join(th, NULL);
            if (j.failed)
                printf("error an encode failed\n");
            else
                job_reply(&j);
        }
        job_free(&j);
    }
    pdtok_free(tok);
    return 0;
}
