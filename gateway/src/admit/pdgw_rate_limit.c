/*
 * pdgw_rate_limit.c - token buckets and the bounded per-key table (see pdgw_rate_limit.h).
 * The table is open addressing with linear probing at most half full; it is rebuilt (not
 * deleted from) when idle buckets are dropped, which happens only when it is full.
 */
#include "pdgw_rate_limit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_util.h"

/* ---------------------------------------------------------------- one bucket */

static void refill(pdgw_token_bucket_t *b, uint64_t now_ms)
{
    if (now_ms > b->last_ms) {
        b->tokens += (double)(now_ms - b->last_ms) * b->rate / 1000.0;
        if (b->tokens > b->burst)
            b->tokens = b->burst;
        b->last_ms = now_ms;
    }
}

void pdgw_token_bucket_init(pdgw_token_bucket_t *b, double rate, double burst, uint64_t now_ms)
{
    b->rate = rate;
    b->burst = burst < 1 ? 1 : burst;
    b->tokens = b->burst;
    b->last_ms = now_ms;
}

void pdgw_token_bucket_set(pdgw_token_bucket_t *b, double rate, double burst, uint64_t now_ms)
{
    refill(b, now_ms);
    b->rate = rate;
    b->burst = burst < 1 ? 1 : burst;
    if (b->tokens > b->burst)
        b->tokens = b->burst;
}

bool pdgw_token_bucket_take(pdgw_token_bucket_t *b, uint64_t now_ms, uint64_t *wait_ms)
{
    refill(b, now_ms);
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return true;
    }
    if (wait_ms != NULL)
        *wait_ms = (uint64_t)ceil((1.0 - b->tokens) * 1000.0 / b->rate - 1e-6);
    return false;
}

static bool bucket_idle(const pdgw_token_bucket_t *b, uint64_t now_ms)
{
    double t = b->tokens;
    if (now_ms > b->last_ms)
        t += (double)(now_ms - b->last_ms) * b->rate / 1000.0;
    return t >= b->burst;
}

/* ---------------------------------------------------------------- keys */

static uint64_t key_seed;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t pdgw_rate_key_hash(const char *key, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull, seed = __atomic_load_n(&key_seed, __ATOMIC_RELAXED);
    size_t i;
    if (seed == 0) {
        uint64_t s = 0;
        if (pdgw_random_bytes(&s, sizeof(s)) != PDGW_OK || s == 0)
            s = pdgw_time_mono_ns() | 1;
        uint64_t expect = 0;
        __atomic_compare_exchange_n(&key_seed, &expect, s, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
        seed = __atomic_load_n(&key_seed, __ATOMIC_RELAXED);
    }
    h ^= seed;
    for (i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 0x100000001b3ull;
    }
    h = mix64(h ^ seed);
    return h ? h : 1; /* 0 marks a free slot */
}

typedef struct rate_slot {
    uint64_t h; /* 0 = free */
    pdgw_token_bucket_t b;
} rate_slot_t;

struct pdgw_rate_table {
    rate_slot_t *slots;
    size_t mask; /* capacity - 1 (power of two, >= 2 * max_keys) */
    size_t n, max_keys;
    pdgw_token_bucket_t overflow;
    bool overflow_init;
};

pdgw_status_t pdgw_rate_table_create(size_t max_keys, pdgw_rate_table_t **out)
{
    pdgw_rate_table_t *t;
    size_t cap = 4;
    if (max_keys == 0)
        max_keys = 1;
    while (cap < 2 * max_keys)
        cap *= 2;
    t = pdgw_calloc(1, sizeof(*t));
    if (t == NULL)
        return PDGW_ERR_NOMEM;
    t->slots = pdgw_calloc(cap, sizeof(*t->slots));
    if (t->slots == NULL) {
        pdgw_free(t);
        return PDGW_ERR_NOMEM;
    }
    t->mask = cap - 1;
    t->max_keys = max_keys;
    *out = t;
    return PDGW_OK;
}

void pdgw_rate_table_destroy(pdgw_rate_table_t *t)
{
    if (t == NULL)
        return;
    pdgw_free(t->slots);
    pdgw_free(t);
}

size_t pdgw_rate_table_size(const pdgw_rate_table_t *t)
{
    return t->n;
}

static rate_slot_t *probe(pdgw_rate_table_t *t, uint64_t h)
{
    size_t i = (size_t)h & t->mask;
    while (t->slots[i].h != 0 && t->slots[i].h != h)
        i = (i + 1) & t->mask;
    return &t->slots[i];
}

/* Drop every bucket that has refilled (reinserting the others keeps probing intact). */
static void drop_idle(pdgw_rate_table_t *t, uint64_t now_ms)
{
    size_t i, cap = t->mask + 1;
    rate_slot_t *old = t->slots, *fresh = pdgw_calloc(cap, sizeof(*fresh));
    if (fresh == NULL)
        return;
    t->slots = fresh;
    t->n = 0;
    for (i = 0; i < cap; i++) {
        if (old[i].h == 0 || bucket_idle(&old[i].b, now_ms))
            continue;
        *probe(t, old[i].h) = old[i];
        t->n++;
    }
    pdgw_free(old);
}

bool pdgw_rate_table_take(pdgw_rate_table_t *t, uint64_t h, double rate, double burst,
                          uint64_t now_ms, uint64_t *wait_ms)
{
    rate_slot_t *s = probe(t, h);
    if (s->h == 0) {
        if (t->n >= t->max_keys) {
            drop_idle(t, now_ms);
            s = probe(t, h);
        }
        if (t->n >= t->max_keys) {
            /* Every bucket is busy: the newcomer shares the overflow bucket. */
            if (!t->overflow_init) {
                pdgw_token_bucket_init(&t->overflow, rate, burst, now_ms);
                t->overflow_init = true;
            }
            return pdgw_token_bucket_take(&t->overflow, now_ms, wait_ms);
        }
        s->h = h;
        pdgw_token_bucket_init(&s->b, rate, burst, now_ms);
        t->n++;
    } else if (s->b.rate != rate || s->b.burst != (burst < 1 ? 1 : burst)) {
        pdgw_token_bucket_set(&s->b, rate, burst, now_ms);
    }
    return pdgw_token_bucket_take(&s->b, now_ms, wait_ms);
}

pdgw_status_t pdgw_rate_parse(const char *text, double *rate, double *burst)
{
    char *end;
    double r, b;
    if (text == NULL || *text == '\0')
        return PDGW_ERR_PARSE;
    r = strtod(text, &end);
    if (end == text || !(r > 0) || !isfinite(r))
        return PDGW_ERR_PARSE;
    if (*end == ':') {
        const char *p = end + 1;
        b = strtod(p, &end);
        if (end == p || !(b >= 1) || !isfinite(b) || *end != '\0')
            return PDGW_ERR_PARSE;
    } else if (*end == '\0') {
        b = r < 1 ? 1 : r;
    } else {
        return PDGW_ERR_PARSE;
    }
    *rate = r;
    *burst = b;
    return PDGW_OK;
}
