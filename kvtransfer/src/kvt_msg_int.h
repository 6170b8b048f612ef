/*
 * kvt_msg_int.h -- field descriptor tables shared by the message encoder,
 * decoder and the generic init/clear/copy code. One table per wire class,
 * fields in wire order; offsets are relative to the message's union member.
 */
#ifndef KVT_MSG_INT_H
#define KVT_MSG_INT_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_msg.h"

typedef enum kvt_msg_kind {
    KVT_F_STR,         /* char * */
    KVT_F_INT,         /* int64_t */
    KVT_F_U64,         /* uint64_t (non-negative msgpack int) */
    KVT_F_BOOL,        /* int 0/1 */
    KVT_F_STR_LIST,    /* kvt_str_list_t */
    KVT_F_INT_LIST,    /* kvt_int_list_t */
    KVT_F_STRUCT_LIST, /* T *ptr at off, uint32_t count at count_off, T per <elem> */
    KVT_F_BIN,         /* kvt_bytes_t */
} kvt_msg_kind_t;

typedef struct kvt_msg_desc kvt_msg_desc_t;

typedef struct kvt_msg_field {
    const char *name;
    kvt_msg_kind_t kind;
    size_t off;
    int required;
    int64_t def;                /* default of INT/BOOL fields when not required */
    uint32_t max_items;         /* lists: bound (0 = KVT_MSG_MAX_ITEMS) */
    size_t count_off;           /* STRUCT_LIST */
    const kvt_msg_desc_t *elem; /* STRUCT_LIST */
    int omit_default;           /* encode only when not the default (pdgw extensions) */
} kvt_msg_field_t;

struct kvt_msg_desc {
    const char *name; /* wire class name */
    const kvt_msg_field_t *fields;
    uint32_t nfields;
    size_t size; /* sizeof the C struct */
};

/* Descriptor of a top-level message type (NULL for NONE/out of range). */
const kvt_msg_desc_t *kvt_msg_desc(kvt_msg_type_t t);

/* Generic helpers over a descriptor. */
void kvt_msg_struct_clear(const kvt_msg_desc_t *d, void *base);
kvt_status_t kvt_msg_struct_copy(const kvt_msg_desc_t *d, void *dst, const void *src);
/* Apply defaults to every non-required field ("" strings, default ints). */
kvt_status_t kvt_msg_struct_defaults(const kvt_msg_desc_t *d, void *base);

#define KVT_FIELD_PTR(base, f, type)  ((type *)((char *)(base) + (f)->off))
#define KVT_FIELD_CPTR(base, f, type) ((const type *)((const char *)(base) + (f)->off))

#endif /* KVT_MSG_INT_H */

/* Structural pre-check of untrusted msgpack: exactly one object spanning
 * <len> bytes, every length inside the buffer, arrays <= KVT_MSG_MAX_ITEMS,
 * maps <= KVT_MSG_MAX_MAP_KEYS, depth <= KVT_MSG_MAX_DEPTH, objects <=
 * KVT_MSG_MAX_OBJECTS. KVT_ERR_PROTO / KVT_ERR_LIMIT with *err_off = offset. */
kvt_status_t kvt_msg_scan(const uint8_t *p, size_t len, size_t *err_off);
