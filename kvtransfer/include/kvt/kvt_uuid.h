/*
 * kvt_uuid.h -- 16-byte region identifiers.
 *
 * Every registered memory region has a random (version 4) UUID. On the wire
 * it travels as the canonical lower-case string 8-4-4-4-12
 * ("3f2b6c1e-0d4a-4e8b-9c1f-5a6b7c8d9e0f"); parsing also accepts upper case.
 */
#ifndef KVT_UUID_H
#define KVT_UUID_H

#include <stdint.h>
#include "kvt/kvt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_UUID_STR_LEN 36 /* without the terminating NUL */

typedef struct kvt_uuid {
    uint8_t b[16];
} kvt_uuid_t;

/* Fresh random v4 UUID (getrandom(2); falls back to /dev/urandom). */
kvt_status_t kvt_uuid_generate(kvt_uuid_t *out);

/* Canonical string; <out> must hold KVT_UUID_STR_LEN + 1 bytes. Returns out. */
char *kvt_uuid_to_str(const kvt_uuid_t *u, char *out);

/* Parse exactly <len> bytes (must be 36, 8-4-4-4-12 hex). KVT_ERR_INVALID on
 * anything else. */
kvt_status_t kvt_uuid_parse(const char *s, size_t len, kvt_uuid_t *out);

int kvt_uuid_equal(const kvt_uuid_t *a, const kvt_uuid_t *b);
int kvt_uuid_is_nil(const kvt_uuid_t *u);

#ifdef __cplusplus
}
#endif
#endif /* KVT_UUID_H */
