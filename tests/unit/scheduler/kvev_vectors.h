/*
 * kvev_vectors.h - golden KV-event messages for the scheduler's tests: a generator script
 * beside this file (kvev_vectors.py, kvev_vectors_current.py: vLLM's shapes packed by
 * Debian's python3-msgpack) prints "<name> <hex>" lines, read here into kvev_vec_t.
 */
#ifndef KVEV_VECTORS_H
#define KVEV_VECTORS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

typedef struct kvev_vec {
    char name[16];
    unsigned char buf[4096];
    size_t len;
} kvev_vec_t;

/* Run <cmd>, append its "<name> <hex>" lines to vecs[*n..max); the command must succeed. */
static inline void kvev_vectors_run(const char *cmd, kvev_vec_t *vecs, size_t max, size_t *n)
{
    static char line[16384];
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    while (*n < max && fgets(line, sizeof(line), p)) {
        char *sp = strchr(line, ' '), *hex;
        kvev_vec_t *v = &vecs[(*n)++];
        assert_non_null(sp);
        *sp = '\0';
        snprintf(v->name, sizeof(v->name), "%.15s", line);
        v->len = 0;
        for (hex = sp + 1; hex[0] && hex[1] && hex[0] != '\n' && v->len < sizeof(v->buf);
             hex += 2) {
            unsigned x;
            assert_int_equal(sscanf(hex, "%2x", &x), 1);
            v->buf[v->len++] = (unsigned char)x;
        }
    }
    assert_int_equal(pclose(p), 0);
}

/* The vectors of <script>, a generator in this directory, run by Debian's python3. */
static inline void kvev_vectors_script(const char *script, kvev_vec_t *vecs, size_t max, size_t *n)
{
    char dir[1024], cmd[2048], *slash;
    snprintf(dir, sizeof(dir), "%s", __FILE__);
    slash = strrchr(dir, '/');
    assert_non_null(slash);
    *slash = '\0';
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/%s", dir, script);
    kvev_vectors_run(cmd, vecs, max, n);
}

#endif /* KVEV_VECTORS_H */
