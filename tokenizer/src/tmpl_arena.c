/*
 * tmpl_arena.c - the bump allocator behind template trees and renderings, and the error jump.
 *
 * One arena per loaded template (its tree) and one per rendering (its values), released at
 * once: error paths, which longjmp out of deep recursion, then leak nothing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "tmpl_int.h"

struct tmpl_chunk {
    tmpl_chunk_t *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
};

#define CHUNK_MIN (64u << 10)

void tmpl_failf(tmpl_fail_t *f, const char *fmt, ...)
{
    if (f->msg != NULL && f->msglen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->msg, f->msglen, fmt, ap);
        va_end(ap);
    }
    longjmp(f->jb, 1);
}

void *tmpl_alloc(tmpl_arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    tmpl_chunk_t *c = a->head;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > CHUNK_MIN ? n : CHUNK_MIN;
        if (a->limit != 0 && (cap > a->limit || a->total > a->limit - cap))
            tmpl_failf(a->fail, "template rendering needs more than %zu bytes of memory", a->limit);
        c = pdb_malloc(sizeof(*c) + cap);
        if (c == NULL)
            tmpl_failf(a->fail, "out of memory");
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *tmpl_strndup(tmpl_arena_t *a, const char *s, size_t n)
{
    char *d = tmpl_alloc(a, n + 1);
    memcpy(d, s, n);
    return d;
}

void tmpl_arena_free(tmpl_arena_t *a)
{
    tmpl_chunk_t *c = a->head;
    while (c != NULL) {
        tmpl_chunk_t *next = c->next;
        pdb_free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

void tmpl_sb_add(tmpl_arena_t *a, tmpl_sb_t *sb, const char *s, size_t n)
{
    if (sb->limit != 0 && (n > sb->limit || sb->len > sb->limit - n))
        tmpl_failf(a->fail, "rendered text exceeds %zu bytes", sb->limit);
    if (sb->cap - sb->len < n + 1) {
        size_t cap = sb->cap ? sb->cap * 2 : 64;
        while (cap < sb->len + n + 1)
            cap *= 2;
        char *d = tmpl_alloc(a, cap);
        if (sb->len)
            memcpy(d, sb->d, sb->len);
        sb->d = d;
        sb->cap = cap;
    }
    memcpy(sb->d + sb->len, s, n);
    sb->len += n;
    sb->d[sb->len] = '\0';
}
