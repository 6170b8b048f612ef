/*
 * test_engine_common.h - helpers shared by the engine tests: configs with
 * ephemeral ports, a sender/receiver pair on loopback, deterministic chunk
 * bytes, task waits with deadlines.
 */
#ifndef TEST_ENGINE_COMMON_H
#define TEST_ENGINE_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvt/kvt_engine.h"

#define T_LAYERS 2
#define T_TOKS   16
#define T_HIDDEN 64
/* half: 2 bytes; [2, layers, tokens, hidden] */
#define T_PAGE ((size_t)2 * T_LAYERS * T_TOKS * T_HIDDEN * 2)

typedef enum { MODE_PUSH = 0, MODE_PULL_EAGER = 1, MODE_PULL_DELAY = 2 } t_mode_t;

static inline uint64_t t_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void t_cfg(kvt_config_t *c, kvt_role_t role, t_mode_t mode, uint64_t buf,
                         const char *channel)
{
    kvt_config_defaults(c);
    c->pd_role = role;
    c->pd_buffer_size = buf;
    c->pd_pull_mode = mode != MODE_PUSH;
    c->pd_delay_pull = mode == MODE_PULL_DELAY;
    snprintf(c->pd_peer_host, sizeof(c->pd_peer_host), "127.0.0.1");
    c->pd_peer_alloc_port.v[0] = 0; /* ephemeral */
    c->pd_peer_alloc_port.n = 1;
    c->pd_peer_init_port.v[0] = 0;
    c->pd_peer_init_port.n = 1;
    c->pd_pull_done_port.v[0] = 0;
    c->pd_pull_done_port.n = 1;
    c->pd_allocation_timeout_sec = 5.0;
    c->pd_alloc_fail_backoff_ttl = 0.3;
    /* every sender of a test is 127.0.0.1, one source for the quota, and many tests fill the
     * receiver's pool on purpose: the quota's own tests (test_alloc_guard.c) set it */
    c->pd_alloc_quota = 1.0;
    if (channel != NULL)
        assert_int_equal(kvt_channel_parse(channel, &c->transfer_channel), KVT_OK);
}

typedef struct t_pair {
    kvt_engine_t *s;
    kvt_engine_t *r;
    kvt_engine_ports_t rp;
} t_pair_t;

/* Receiver first (its ports are ephemeral), then a sender pointing at it, whose
 * ProxyNotifs are reported to <on_notif> (NULL = none). Returns the create status of the
 * first engine that failed. */
static inline kvt_status_t t_pair_open_notif(t_pair_t *p, const kvt_config_t *scfg,
                                             const kvt_config_t *rcfg, const kvt_clock_t *clock,
                                             void (*on_notif)(void *, const char *), void *arg)
{
    kvt_engine_params_t ep = {.page_size = T_PAGE,
                              .bind_host = "127.0.0.1",
                              .clock = clock,
                              .delay_pull_chunks = 3,
                              .ctrl_timeout_ms = 3000};
    kvt_config_t sc = *scfg;
    kvt_status_t st;

    memset(p, 0, sizeof(*p));
    ep.cfg = rcfg;
    st = kvt_engine_create(&ep, &p->r);
    if (st != KVT_OK)
        return st;
    kvt_engine_ports(p->r, &p->rp);
    sc.pd_peer_alloc_port.v[0] = p->rp.alloc_port;
    sc.pd_peer_init_port.v[0] = p->rp.init_port;
    ep.cfg = &sc;
    ep.on_proxy_notif = on_notif;
    ep.on_proxy_notif_arg = arg;
    st = kvt_engine_create(&ep, &p->s);
    if (st != KVT_OK) {
        kvt_engine_destroy(p->r);
        p->r = NULL;
    }
    return st;
}

static inline kvt_status_t t_pair_open_ex(t_pair_t *p, const kvt_config_t *scfg,
                                          const kvt_config_t *rcfg, const kvt_clock_t *clock)
{
    return t_pair_open_notif(p, scfg, rcfg, clock, NULL, NULL);
}

static inline kvt_status_t t_pair_open(t_pair_t *p, t_mode_t mode, uint64_t sbuf, uint64_t rbuf,
                                       const char *channel)
{
    kvt_config_t sc, rc;
    t_cfg(&sc, KVT_ROLE_SENDER, mode, sbuf, channel);
    t_cfg(&rc, KVT_ROLE_RECEIVER, mode, rbuf, channel);
    return t_pair_open_ex(p, &sc, &rc, NULL);
}

static inline void t_pair_close(t_pair_t *p)
{
    kvt_engine_destroy(p->s);
    kvt_engine_destroy(p->r);
    memset(p, 0, sizeof(*p));
}

/* Deterministic byte j of chunk <key>. */
static inline uint8_t t_byte(const char *key, size_t j)
{
    uint32_t h = 2166136261u;
    for (const char *c = key; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    return (uint8_t)((h >> (j % 24)) + j * 131u);
}

static inline void t_fill(const char *key, uint8_t *buf, size_t len)
{
    for (size_t j = 0; j < len; j++)
        buf[j] = t_byte(key, j);
}

static inline int t_check(const char *key, const uint8_t *buf, size_t len)
{
    for (size_t j = 0; j < len; j++) {
        if (buf[j] != t_byte(key, j))
            return 0;
    }
    return 1;
}

static inline size_t t_chunk_len(int64_t toks)
{
    if (toks <= 0 || toks >= T_TOKS)
        return T_PAGE;
    return T_PAGE / T_TOKS * (size_t)toks;
}

static inline void t_desc(kvt_store_desc_t *d, const char *req_id, int64_t last_toks, int last,
                          uint32_t total)
{
    memset(d, 0, sizeof(*d));
    d->req_id = req_id;
    d->fmt = KVT_FMT_KV_2LTD;
    d->ndim = 4;
    d->shape[0] = 2;
    d->shape[1] = T_LAYERS;
    d->shape[2] = T_TOKS;
    d->shape[3] = T_HIDDEN;
    d->dtype = "half";
    d->last_chunk_toks = last_toks;
    d->is_last_batch = last;
    d->total_chunks = total;
}

/* Store keys[first..first+n) (chunk bytes from t_fill); the last one has
 * <last_toks> tokens. Returns the task id. */
static inline kvt_task_id_t t_store(kvt_engine_t *s, const char *req_id, char **keys,
                                    uint32_t first, uint32_t n, int64_t last_toks, int last,
                                    uint32_t total, kvt_status_t *st_out)
{
    kvt_store_desc_t d;
    const void **bufs = calloc(n + 1, sizeof(void *));
    size_t *lens = calloc(n + 1, sizeof(size_t));
    uint8_t **own = calloc(n + 1, sizeof(uint8_t *));
    kvt_task_id_t id = 0;

    t_desc(&d, req_id, last_toks, last, total);
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = (i + 1 == n) ? t_chunk_len(last_toks) : T_PAGE;
        own[i] = malloc(T_PAGE);
        t_fill(keys[first + i], own[i], lens[i]);
        bufs[i] = own[i];
    }
    *st_out = kvt_submit_store(s, &d, (const char *const *)&keys[first], bufs, lens, n, &id);
    for (uint32_t i = 0; i < n; i++)
        free(own[i]);
    free(own);
    free(bufs);
    free(lens);
    return id;
}

static inline kvt_status_t t_wait(kvt_engine_t *e, kvt_task_id_t id, int ms, kvt_task_result_t *res)
{
    return kvt_task_wait(e, id, ms, res);
}

static inline int t_bits(const kvt_task_result_t *r)
{
    int n = 0;
    for (uint32_t i = 0; i < r->nkeys; i++)
        n += kvt_bitmap_test(r->bitmap, i);
    return n;
}

/* Poll until the engine's pool has no used/pinned pages (or timeout). */
static inline int t_pool_drained(kvt_engine_t *e, int ms)
{
    uint64_t end = t_now_ms() + (uint64_t)ms;
    kvt_pool_stats_t ps;
    do {
        kvt_engine_pool_stats(e, &ps);
        if (ps.used_pages == 0 && ps.pinned_pages == 0)
            return 1;
        usleep(2000);
    } while (t_now_ms() < end);
    fprintf(stderr, "pool not drained: used %u pinned %u\n", ps.used_pages, ps.pinned_pages);
    return 0;
}

static inline char **t_keys(const char *req_id, uint32_t n)
{
    char **k = calloc(n + 1, sizeof(char *));
    for (uint32_t i = 0; i < n; i++) {
        k[i] = malloc(strlen(req_id) + 32);
        sprintf(k[i], "%s/chunk-%u", req_id, i);
    }
    return k;
}

static inline void t_keys_free(char **k, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free(k[i]);
    free(k);
}

#endif
