/*
 * kvt_msg_scan.c -- bounded structural validation of untrusted msgpack.
 *
 * Runs before msgpack-c builds an object tree, so a 5-byte "array of 4
 * billion elements" or a deeply nested blob is refused before anything is
 * allocated: every declared count must fit in the remaining bytes (each
 * element takes at least one byte) and within the KVT_MSG_MAX_* bounds.
 */
#include "kvt_msg_int.h"

typedef struct scan {
    const uint8_t *p;
    size_t len;
    size_t off;
    uint64_t objects;
} scan_t;

static int scan_need(const scan_t *s, uint64_t n)
{
    return n <= (uint64_t)(s->len - s->off);
}

static uint64_t scan_be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Read an n-byte big-endian length at the cursor. */
static kvt_status_t scan_len(scan_t *s, unsigned n, uint64_t *out)
{
    if (!scan_need(s, n))
        return KVT_ERR_PROTO;
    *out = scan_be(s->p + s->off, n);
    s->off += n;
    return KVT_OK;
}

/* Header of a non-fix msgpack type <c> (0xc1..0xdf): the payload bytes to
 * skip, or the element count and kind of a container (1 array, 2 map). */
static kvt_status_t scan_head(scan_t *s, uint8_t c, uint64_t *n, uint64_t *skip, int *container)
{
    kvt_status_t status = KVT_OK;

    switch (c) {
    case 0xc4: /* bin8 */
    case 0xd9: /* str8 */
        status = scan_len(s, 1, skip);
        break;
    case 0xc5:
    case 0xda:
        status = scan_len(s, 2, skip);
        break;
    case 0xc6:
    case 0xdb:
        status = scan_len(s, 4, skip);
        break;
    case 0xc7: /* ext8/16/32: length then a type byte */
        status = scan_len(s, 1, skip);
        *skip += 1;
        break;
    case 0xc8:
        status = scan_len(s, 2, skip);
        *skip += 1;
        break;
    case 0xc9:
        status = scan_len(s, 4, skip);
        *skip += 1;
        break;
    case 0xca: /* float32 */
        *skip = 4;
        break;
    case 0xcb: /* float64 */
        *skip = 8;
        break;
    case 0xcc: /* uint8..64, int8..64 */
    case 0xd0:
        *skip = 1;
        break;
    case 0xcd:
    case 0xd1:
        *skip = 2;
        break;
    case 0xce:
    case 0xd2:
        *skip = 4;
        break;
    case 0xcf:
    case 0xd3:
        *skip = 8;
        break;
    case 0xd4: /* fixext 1/2/4/8/16 plus the type byte */
        *skip = 2;
        break;
    case 0xd5:
        *skip = 3;
        break;
    case 0xd6:
        *skip = 5;
        break;
    case 0xd7:
        *skip = 9;
        break;
    case 0xd8:
        *skip = 17;
        break;
    case 0xdc:
        status = scan_len(s, 2, n);
        *container = 1;
        break;
    case 0xdd:
        status = scan_len(s, 4, n);
        *container = 1;
        break;
    case 0xde:
        status = scan_len(s, 2, n);
        *container = 2;
        break;
    case 0xdf:
        status = scan_len(s, 4, n);
        *container = 2;
        break;
    default: /* 0xc1: never used */
        return KVT_ERR_PROTO;
    }
    return status;
}

static kvt_status_t scan_obj(scan_t *s, unsigned depth)
{
    uint64_t n = 0, skip = 0;
    int container = 0; /* 1 array, 2 map */
    kvt_status_t status = KVT_OK;
    uint8_t c;

    if (depth > KVT_MSG_MAX_DEPTH || ++s->objects > KVT_MSG_MAX_OBJECTS)
        return KVT_ERR_LIMIT;
    if (!scan_need(s, 1))
        return KVT_ERR_PROTO;
    c = s->p[s->off++];

    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return KVT_OK;
    if (c >= 0x80 && c <= 0x8f) {
        n = c & 0x0f;
        container = 2;
    } else if (c >= 0x90 && c <= 0x9f) {
        n = c & 0x0f;
        container = 1;
    } else if (c >= 0xa0 && c <= 0xbf) {
        skip = c & 0x1f;
    } else {
        status = scan_head(s, c, &n, &skip, &container);
        if (status != KVT_OK)
            return status;
    }

    if (container == 0) {
        if (!scan_need(s, skip))
            return KVT_ERR_PROTO;
        s->off += (size_t)skip;
        return KVT_OK;
    }
    if (container == 1 && n > KVT_MSG_MAX_ITEMS)
        return KVT_ERR_LIMIT;
    if (container == 2 && n > KVT_MSG_MAX_MAP_KEYS)
        return KVT_ERR_LIMIT;
    if (container == 2)
        n *= 2;
    if (!scan_need(s, n)) /* every element needs at least one byte */
        return KVT_ERR_PROTO;
    for (uint64_t i = 0; i < n; i++) {
        status = scan_obj(s, depth + 1);
        if (status != KVT_OK)
            return status;
    }
    return KVT_OK;
}

kvt_status_t kvt_msg_scan(const uint8_t *p, size_t len, size_t *err_off)
{
    scan_t s = {p, len, 0, 0};
    kvt_status_t status;

    if (p == NULL || len == 0) {
        *err_off = 0;
        return KVT_ERR_PROTO;
    }
    if (len > KVT_MSG_MAX_BYTES) {
        *err_off = 0;
        return KVT_ERR_LIMIT;
    }
    status = scan_obj(&s, 1);
    if (status == KVT_OK && s.off != len)
        status = KVT_ERR_PROTO; /* trailing bytes */
    if (status != KVT_OK)
        *err_off = s.off;
    return status;
}
