/*
 * pdgw_ids.c - randomness, request ids (uuid4) and W3C trace context (traceparent).
 * Declared in pdgw_util.h.
 */
#include "pdgw_util.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---------------------------------------------------------------- random, ids */

static pdgw_status_t getrandom_full(void *out, size_t len)
{
    unsigned char *p = out;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return PDGW_ERR_SYSTEM;
        }
        p += n;
        len -= (size_t)n;
    }
    return PDGW_OK;
}

/*
 * Small draws (ids, span ids: several per request) come from a per-thread pool refilled by
 * one getrandom(2), so the hot path does one syscall per ~20 requests instead of three per
 * request. Bytes handed out are wiped from the pool. A forked child must not replay its
 * parent's pool: a fork generation counter (bumped by a pthread_atfork child handler)
 * invalidates every pool in the child.
 */
#define RAND_POOL_BYTES 1024
#define RAND_POOL_MAX   64 /* larger draws go straight to the kernel */

static _Thread_local struct {
    unsigned char buf[RAND_POOL_BYTES];
    size_t pos;
    unsigned gen;
    bool valid;
} rand_pool;

static atomic_uint rand_fork_gen;
static pthread_once_t rand_once = PTHREAD_ONCE_INIT;

static void rand_on_fork_child(void)
{
    atomic_fetch_add(&rand_fork_gen, 1);
}

static void rand_register_atfork(void)
{
    pthread_atfork(NULL, NULL, rand_on_fork_child);
}

pdgw_status_t pdgw_random_bytes(void *out, size_t len)
{
    if (len > RAND_POOL_MAX)
        return getrandom_full(out, len);
    pthread_once(&rand_once, rand_register_atfork);
    unsigned gen = atomic_load_explicit(&rand_fork_gen, memory_order_relaxed);
    if (!rand_pool.valid || rand_pool.gen != gen || RAND_POOL_BYTES - rand_pool.pos < len) {
        pdgw_status_t st = getrandom_full(rand_pool.buf, RAND_POOL_BYTES);
        if (st != PDGW_OK)
            return st;
        rand_pool.pos = 0;
        rand_pool.gen = gen;
        rand_pool.valid = true;
    }
    memcpy(out, rand_pool.buf + rand_pool.pos, len);
    memset(rand_pool.buf + rand_pool.pos, 0, len);
    rand_pool.pos += len;
    return PDGW_OK;
}

/* "000102...ff": a byte's two hex digits in one copy (ids are formatted on every request). */
#define HEX_ROW(h)                                                                                 \
    h "0" h "1" h "2" h "3" h "4" h "5" h "6" h "7" h "8" h "9" h "a" h "b" h "c" h "d" h "e" h "f"
static const char hex_pairs[] = HEX_ROW("0") HEX_ROW("1") HEX_ROW("2") HEX_ROW("3") HEX_ROW("4")
    HEX_ROW("5") HEX_ROW("6") HEX_ROW("7") HEX_ROW("8") HEX_ROW("9") HEX_ROW("a") HEX_ROW("b")
        HEX_ROW("c") HEX_ROW("d") HEX_ROW("e") HEX_ROW("f");

static void hex_encode(const uint8_t *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        memcpy(out + 2 * i, hex_pairs + 2 * in[i], 2);
}

pdgw_status_t pdgw_uuid4(char out[PDGW_UUID_STR_LEN + 1])
{
    uint8_t b[16];
    pdgw_status_t st = pdgw_random_bytes(b, sizeof(b));
    if (st != PDGW_OK)
        return st;
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    /* 8-4-4-4-12 hex digits: the groups are fixed, so no test per byte for the dashes */
    hex_encode(b, 4, out);
    out[8] = '-';
    hex_encode(b + 4, 2, out + 9);
    out[13] = '-';
    hex_encode(b + 6, 2, out + 14);
    out[18] = '-';
    hex_encode(b + 8, 2, out + 19);
    out[23] = '-';
    hex_encode(b + 10, 6, out + 24);
    out[36] = '\0';
    return PDGW_OK;
}

bool pdgw_uuid_is_valid(const char *s, size_t len)
{
    if (len != PDGW_UUID_STR_LEN)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return false;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

bool pdgw_request_id_is_valid(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > 128)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && strchr("._:/+=@-", c) == NULL)
            return false;
        if (c == '\0')
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- traceparent */

static int lhex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* uppercase is invalid per the spec */
}

static int hex_decode(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = lhex_val(s[2 * i]), lo = lhex_val(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

pdgw_status_t pdgw_traceparent_parse(const char *s, size_t len, pdgw_traceparent_t *out)
{
    while (len > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    if (len < PDGW_TRACEPARENT_LEN)
        return PDGW_ERR_PARSE;
    pdgw_traceparent_t tp;
    if (hex_decode(s, 1, &tp.version) != 0 || tp.version == 0xff)
        return PDGW_ERR_PARSE;
    if (tp.version == 0 && len != PDGW_TRACEPARENT_LEN)
        return PDGW_ERR_PARSE;
    if (len > PDGW_TRACEPARENT_LEN && s[PDGW_TRACEPARENT_LEN] != '-')
        return PDGW_ERR_PARSE;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return PDGW_ERR_PARSE;
    if (hex_decode(s + 3, 16, tp.trace_id) != 0 || hex_decode(s + 36, 8, tp.parent_id) != 0 ||
        hex_decode(s + 53, 1, &tp.flags) != 0)
        return PDGW_ERR_PARSE;
    if (all_zero(tp.trace_id, 16) || all_zero(tp.parent_id, 8))
        return PDGW_ERR_PARSE;
    *out = tp;
    return PDGW_OK;
}

static pdgw_status_t new_span_id(uint8_t id[8])
{
    do {
        pdgw_status_t st = pdgw_random_bytes(id, 8);
        if (st != PDGW_OK)
            return st;
    } while (all_zero(id, 8));
    return PDGW_OK;
}

pdgw_status_t pdgw_traceparent_new(pdgw_traceparent_t *out)
{
    pdgw_traceparent_t tp = {.version = 0, .flags = 0x01};
    do {
        pdgw_status_t st = pdgw_random_bytes(tp.trace_id, sizeof(tp.trace_id));
        if (st != PDGW_OK)
            return st;
    } while (all_zero(tp.trace_id, 16));
    pdgw_status_t st = new_span_id(tp.parent_id);
    if (st != PDGW_OK)
        return st;
    *out = tp;
    return PDGW_OK;
}

pdgw_status_t pdgw_traceparent_child(const pdgw_traceparent_t *parent, pdgw_traceparent_t *out)
{
    pdgw_traceparent_t tp = *parent;
    tp.version = 0;
    pdgw_status_t st = new_span_id(tp.parent_id);
    if (st != PDGW_OK)
        return st;
    *out = tp;
    return PDGW_OK;
}

void pdgw_traceparent_format(const pdgw_traceparent_t *tp, char out[PDGW_TRACEPARENT_LEN + 1])
{
    out[0] = '0';
    out[1] = '0';
    out[2] = '-';
    hex_encode(tp->trace_id, 16, out + 3);
    out[35] = '-';
    hex_encode(tp->parent_id, 8, out + 36);
    out[52] = '-';
    hex_encode(&tp->flags, 1, out + 53);
    out[55] = '\0';
}
