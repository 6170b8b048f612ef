/*
 * Decoder for vLLM's KV-event payloads (vllm/distributed/kv_events.py).
 *
 * The batch and its events are msgspec structs, and vLLM has shipped three
 * shapes of them: older vLLM declared both array_like (a batch is
 * [ts, [events], dp_rank], an event an array whose first element is its tag,
 * "BlockStored", ..., followed by the fields in declaration order); some
 * versions declared neither (a batch is a map {ts, events, data_parallel_rank},
 * an event a map whose "type" key is the tag); current vLLM keeps the batch
 * array_like and the events not (an array batch of map events, pinned by
 * tests/v1/core/test_kv_events_contract.py), and its decoder ignores elements
 * a newer batch appends. omit_defaults lets trailing/defaulted fields be
 * absent in every shape. Everything decoded is allocated in the msgpack zone
 * of the unpacked object, freed together with it.
 */
#include <stdio.h>
#include <string.h>

#include <msgpack.h>
#include <xxhash.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

typedef struct dec {
    msgpack_zone *zone;
    char *err;
    size_t err_len;
} dec_t;

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static bool get_hash(const msgpack_object *o, uint64_t *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (uint64_t)o->via.i64;
        return true;
    case MSGPACK_OBJECT_BIN: {
        /* A digest as bytes: its last 8 bytes, big-endian (the int form
         * vLLM publishes by default is the same last 8 bytes). */
        uint64_t h = 0;
        uint32_t n = o->via.bin.size, from = n > 8 ? n - 8 : 0;
        if (n == 0)
            return false;
        for (uint32_t i = from; i < n; i++)
            h = (h << 8) | (unsigned char)o->via.bin.ptr[i];
        *out = h;
        return true;
    }
    default:
        return false;
    }
}

static uint64_t rd_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/*
 * Walk the msgpack bytes once before unpacking: true when they form
 * exactly one object, no container claims more elements than bytes
 * remain, and there are at most SCHED_KVEV_MAX_OBJECTS elements in all.
 * msgpack-c sizes a container's storage from its header, so a forged
 * header (an array of 4 billion elements in 5 bytes) would otherwise ask
 * for tens of gigabytes before failing; and it builds a 24-byte object for
 * every element, so 16 MiB of one-byte elements would take 384 MiB.
 */
static bool precheck(const unsigned char *b, size_t len)
{
    uint64_t pending = 1, objects = 1;
    size_t pos = 0;

    while (pending > 0) {
        unsigned char c;
        uint64_t n = 0, skip = 0, items = 0;
        int hdr = 0;
        if (pos >= len)
            return false;
        c = b[pos++];
        pending--;
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
            continue;
        } else if ((c & 0xf0) == 0x80) {
            items = 2u * (c & 0x0fu);
        } else if ((c & 0xf0) == 0x90) {
            items = c & 0x0fu;
        } else if ((c & 0xe0) == 0xa0) {
            skip = c & 0x1fu;
        } else {
            switch (c) {
            case 0xcc:
            case 0xd0:
                skip = 1;
                break;
            case 0xcd:
            case 0xd1:
                skip = 2;
                break;
            case 0xca:
            case 0xce:
            case 0xd2:
                skip = 4;
                break;
            case 0xcb:
            case 0xcf:
            case 0xd3:
                skip = 8;
                break;
            case 0xd4:
                skip = 2;
                break;
            case 0xd5:
                skip = 3;
                break;
            case 0xd6:
                skip = 5;
                break;
            case 0xd7:
                skip = 9;
                break;
            case 0xd8:
                skip = 17;
                break;
            case 0xc4:
            case 0xd9:
                hdr = 1;
                break;
            case 0xc5:
            case 0xda:
                hdr = 2;
                break;
            case 0xc6:
            case 0xdb:
                hdr = 4;
                break;
            case 0xc7:
                hdr = 1;
                skip = 1;
                break; /* ext: length, type */
            case 0xc8:
                hdr = 2;
                skip = 1;
                break;
            case 0xc9:
                hdr = 4;
                skip = 1;
                break;
            case 0xdc:
            case 0xde:
                hdr = 2;
                break;
            case 0xdd:
            case 0xdf:
                hdr = 4;
                break;
            default:
                return false; /* 0xc1: never used */
            }
            if (hdr) {
                if (len - pos < (size_t)hdr)
                    return false;
                n = rd_be(b + pos, hdr);
                pos += (size_t)hdr;
                if (c == 0xdc || c == 0xdd)
                    items = n;
                else if (c == 0xde || c == 0xdf)
                    items = 2 * n;
                else
                    skip += n;
            }
        }
        if (skip > len - pos || items > len - pos || items > SCHED_KVEV_MAX_OBJECTS - objects)
            return false;
        pos += (size_t)skip;
        pending += items;
        objects += items;
    }
    return pos == len;
}

static sched_status_t fail(dec_t *d, const char *what)
{
    sched_set_err(d->err, d->err_len, "%s", what);
    return SCHED_ERR_INVALID;
}

static sched_status_t get_hashes(dec_t *d, const msgpack_object *o, const uint64_t **out,
                                 size_t *n_out)
{
    uint64_t *arr;

    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, "block_hashes: not an array");
    arr = msgpack_zone_malloc(d->zone, (o->via.array.size + 1) * sizeof(uint64_t));
    if (!arr)
        return SCHED_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < o->via.array.size; i++)
        if (!get_hash(&o->via.array.ptr[i], &arr[i]))
            return fail(d, "block_hashes: element is not an int or bytes");
    *out = arr;
    *n_out = o->via.array.size;
    return SCHED_OK;
}

static sched_status_t get_tokens(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    uint32_t *arr;

    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, "token_ids: not an array");
    arr = msgpack_zone_malloc(d->zone, (o->via.array.size + 1) * sizeof(uint32_t));
    if (!arr)
        return SCHED_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *t = &o->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return fail(d, "token_ids: element is not a token id");
        arr[i] = (uint32_t)t->via.u64;
    }
    ev->token_ids = arr;
    ev->n_token_ids = o->via.array.size;
    return SCHED_OK;
}

static sched_status_t get_parent(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL) {
        ev->has_parent = false;
        return SCHED_OK;
    }
    if (!get_hash(o, &ev->parent_block_hash))
        return fail(d, "parent_block_hash: not an int, bytes or nil");
    ev->has_parent = true;
    return SCHED_OK;
}

/* 0 is taken: vLLM's offloading connector has announced its CPU copies with
 * block_size 0 and no tokens; the index refuses 0 where tokens need it. */
static sched_status_t get_block_size(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > 1u << 20)
        return fail(d, "block_size: not a non-negative int");
    ev->block_size = (uint32_t)o->via.u64;
    return SCHED_OK;
}

static sched_status_t get_medium(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL) {
        ev->medium_gpu = true;
        return SCHED_OK;
    }
    if (o->type != MSGPACK_OBJECT_STR)
        return fail(d, "medium: not a string or nil");
    ev->medium_gpu = str_is(o, "GPU");
    return SCHED_OK;
}

static sched_status_t get_lora_name(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    char *s;

    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_STR)
        return fail(d, "lora_name: not a string or nil");
    s = msgpack_zone_malloc(d->zone, o->via.str.size + 1);
    if (!s)
        return SCHED_ERR_NO_MEMORY;
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    ev->lora_name = s;
    return SCHED_OK;
}

static sched_status_t get_group(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT32_MAX)
        return fail(d, "group_idx: not a non-negative int or nil");
    ev->group_idx = (int64_t)o->via.u64;
    return SCHED_OK;
}

uint64_t sched_kvev_extra_digest(const void *msgpack_entry, size_t len)
{
    uint64_t h = XXH3_64bits_withSeed(msgpack_entry, len, 0x65787472616b6579ull);
    return h ? h : 1;
}

/* Digest of one extra_keys entry: packed again by msgpack-c, so the same entry gives the same
 * bytes whoever packed it first (and whatever header sizes it chose). */
static sched_status_t entry_digest(dec_t *d, const msgpack_object *o, uint64_t *out)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (msgpack_pack_object(&pk, *o) != 0 || sb.data == NULL) {
        msgpack_sbuffer_destroy(&sb);
        return fail(d, "extra_keys: entry cannot be packed");
    }
    *out = sched_kvev_extra_digest(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return SCHED_OK;
}

/* extra_keys: nil, or one entry per block, each nil or a tuple (msgpack array). */
static sched_status_t get_extra_keys(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev,
                                     size_t *n_out)
{
    uint64_t *arr;

    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, "extra_keys: not an array or nil");
    arr = msgpack_zone_malloc(d->zone, (o->via.array.size + 1) * sizeof(uint64_t));
    if (!arr)
        return SCHED_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        sched_status_t st;
        if (e->type == MSGPACK_OBJECT_NIL) {
            arr[i] = 0;
            continue;
        }
        if (e->type != MSGPACK_OBJECT_ARRAY)
            return fail(d, "extra_keys: entry is not a tuple or nil");
        st = entry_digest(d, e, &arr[i]);
        if (st != SCHED_OK)
            return st;
    }
    ev->extra_digests = arr;
    *n_out = o->via.array.size;
    return SCHED_OK;
}

static sched_status_t get_copies(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev,
                                 size_t *n_out)
{
    uint32_t *arr;

    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, "remaining_copy_counts: not an array or nil");
    arr = msgpack_zone_malloc(d->zone, (o->via.array.size + 1) * sizeof(uint32_t));
    if (!arr)
        return SCHED_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *c = &o->via.array.ptr[i];
        if (c->type != MSGPACK_OBJECT_POSITIVE_INTEGER || c->via.u64 > UINT32_MAX)
            return fail(d, "remaining_copy_counts: element is not a non-negative int");
        arr[i] = (uint32_t)c->via.u64;
    }
    ev->remaining_copies = arr;
    *n_out = o->via.array.size;
    return SCHED_OK;
}

static sched_status_t get_locality(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_STR)
        return fail(d, "locality: not a string or nil");
    if (str_is(o, "LOCAL"))
        ev->locality = SCHED_KVEV_LOC_LOCAL;
    else if (str_is(o, "REMOTE"))
        ev->locality = SCHED_KVEV_LOC_REMOTE;
    /* another value: unspecified, as vLLM itself treats an absent one */
    return SCHED_OK;
}

/* vllm/v1/kv_cache_interface.py KVCacheSpecKind: the kinds that keep only a tail of the
 * prefix (a window, a chunk, a state) cannot say alone whether a prefix hits. */
static sched_status_t get_spec_kind(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    static const char *const partial[] = {"sliding_window", "sliding_window_mla",
                                          "chunked_local_attention", "mamba"};
    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_STR)
        return fail(d, "kv_cache_spec_kind: not a string or nil");
    ev->spec = SCHED_KVEV_SPEC_FULL;
    for (size_t i = 0; i < sizeof(partial) / sizeof(partial[0]); i++)
        if (str_is(o, partial[i]))
            ev->spec = SCHED_KVEV_SPEC_PARTIAL;
    if (str_is(o, "unknown"))
        ev->spec = SCHED_KVEV_SPEC_UNKNOWN;
    return SCHED_OK;
}

static sched_status_t get_window(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        return SCHED_OK;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT32_MAX)
        return fail(d, "kv_cache_spec_sliding_window: not a non-negative int or nil");
    ev->sliding_window = (int64_t)o->via.u64;
    return SCHED_OK;
}

/* Lengths of the per-block arrays, checked against block_hashes once all fields are in (a
 * map may name them in any order). */
typedef struct ev_lens {
    size_t extra, copies;
} ev_lens_t;

/* Field <name> of an event; the one table both layouts go through. */
static sched_status_t event_field(dec_t *d, sched_kvev_event_t *ev, const char *name,
                                  const msgpack_object *v, unsigned *seen, ev_lens_t *lens)
{
    if (strcmp(name, "block_hashes") == 0) {
        *seen |= 1;
        return get_hashes(d, v, &ev->block_hashes, &ev->n_block_hashes);
    }
    if (ev->kind == SCHED_KVEV_STORED) {
        if (strcmp(name, "parent_block_hash") == 0) {
            *seen |= 2;
            return get_parent(d, v, ev);
        }
        if (strcmp(name, "token_ids") == 0) {
            *seen |= 4;
            return get_tokens(d, v, ev);
        }
        if (strcmp(name, "block_size") == 0) {
            *seen |= 8;
            return get_block_size(d, v, ev);
        }
        if (strcmp(name, "lora_name") == 0)
            return get_lora_name(d, v, ev);
        if (strcmp(name, "extra_keys") == 0)
            return get_extra_keys(d, v, ev, &lens->extra);
        if (strcmp(name, "kv_cache_spec_kind") == 0)
            return get_spec_kind(d, v, ev);
        if (strcmp(name, "kv_cache_spec_sliding_window") == 0)
            return get_window(d, v, ev);
    }
    if (ev->kind == SCHED_KVEV_REMOVED && strcmp(name, "remaining_copy_counts") == 0)
        return get_copies(d, v, ev, &lens->copies);
    if (strcmp(name, "medium") == 0)
        return get_medium(d, v, ev);
    if (strcmp(name, "group_idx") == 0)
        return get_group(d, v, ev);
    if (strcmp(name, "locality") == 0)
        return get_locality(d, v, ev);
    return SCHED_OK; /* lora_id, ownership, session_id, ...: not needed to route */
}

/* Declaration order of the fields after the tag (array layout). */
static const char *const stored_fields[] = {"block_hashes",
                                            "parent_block_hash",
                                            "token_ids",
                                            "block_size",
                                            "lora_id",
                                            "medium",
                                            "lora_name",
                                            "extra_keys",
                                            "group_idx",
                                            "kv_cache_spec_kind",
                                            "kv_cache_spec_sliding_window",
                                            "locality"};
static const char *const removed_fields[] = {"block_hashes", "medium", "group_idx"};

static sched_status_t kind_of(const msgpack_object *tag, sched_kvev_kind_t *kind)
{
    if (str_is(tag, "BlockStored"))
        *kind = SCHED_KVEV_STORED;
    else if (str_is(tag, "BlockRemoved"))
        *kind = SCHED_KVEV_REMOVED;
    else if (str_is(tag, "AllBlocksCleared"))
        *kind = SCHED_KVEV_CLEARED;
    else
        return SCHED_ERR_UNSUPPORTED;
    return SCHED_OK;
}

/* Required field bits per kind: stored needs hashes, parent, tokens, size. */
static unsigned required_of(sched_kvev_kind_t kind)
{
    return kind == SCHED_KVEV_STORED ? 15u : kind == SCHED_KVEV_REMOVED ? 1u : 0u;
}

static sched_status_t decode_event(dec_t *d, const msgpack_object *o, sched_kvev_event_t *ev)
{
    const msgpack_object *tag = NULL;
    sched_status_t st;
    unsigned seen = 0;

    ev_lens_t lens = {0, 0};

    memset(ev, 0, sizeof(*ev));
    ev->medium_gpu = true;
    ev->group_idx = -1;
    ev->sliding_window = -1;
    if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0) {
        const char *const *names;
        size_t n_names;
        tag = &o->via.array.ptr[0];
        if (tag->type != MSGPACK_OBJECT_STR)
            return fail(d, "event: first element is not a tag string");
        st = kind_of(tag, &ev->kind);
        if (st != SCHED_OK)
            return st;
        names = ev->kind == SCHED_KVEV_STORED ? stored_fields : removed_fields;
        n_names = ev->kind == SCHED_KVEV_STORED ? sizeof(stored_fields) / sizeof(stored_fields[0])
                  : ev->kind == SCHED_KVEV_REMOVED
                      ? sizeof(removed_fields) / sizeof(removed_fields[0])
                      : 0;
        for (uint32_t i = 1; i < o->via.array.size && i - 1 < n_names; i++) {
            st = event_field(d, ev, names[i - 1], &o->via.array.ptr[i], &seen, &lens);
            if (st != SCHED_OK)
                return st;
        }
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++)
            if (str_is(&o->via.map.ptr[i].key, "type"))
                tag = &o->via.map.ptr[i].val;
        if (!tag || tag->type != MSGPACK_OBJECT_STR)
            return fail(d, "event: map without a \"type\" string");
        st = kind_of(tag, &ev->kind);
        if (st != SCHED_OK)
            return st;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            char name[40];
            if (k->type != MSGPACK_OBJECT_STR)
                return fail(d, "event: map key is not a string");
            if (k->via.str.size >= sizeof(name))
                continue; /* no field we read is that long */
            memcpy(name, k->via.str.ptr, k->via.str.size);
            name[k->via.str.size] = '\0';
            st = event_field(d, ev, name, &o->via.map.ptr[i].val, &seen, &lens);
            if (st != SCHED_OK)
                return st;
        }
    } else {
        return fail(d, "event: neither a tagged array nor a tagged map");
    }
    if ((seen & required_of(ev->kind)) != required_of(ev->kind))
        return fail(d, "event: required field missing");
    if (ev->extra_digests && lens.extra != ev->n_block_hashes)
        return fail(d, "extra_keys: not one entry per block hash");
    if (ev->remaining_copies && lens.copies != ev->n_block_hashes)
        return fail(d, "remaining_copy_counts: not one count per block hash");
    return SCHED_OK;
}

static sched_status_t decode_batch(dec_t *d, const msgpack_object *root, sched_kvev_batch_t *out)
{
    const msgpack_object *ts = NULL, *events = NULL, *rank = NULL;
    sched_status_t st;

    if (root->type == MSGPACK_OBJECT_ARRAY) {
        if (root->via.array.size < 2)
            return fail(d, "batch: array shorter than [ts, events]");
        ts = &root->via.array.ptr[0];
        events = &root->via.array.ptr[1];
        if (root->via.array.size > 2)
            rank = &root->via.array.ptr[2];
        /* Elements a newer publisher appends (vLLM's decoder ignores trailing elements:
         * tests/v1/core/test_kv_events_contract.py): skipped. */
        if (root->via.array.size > 3)
            out->n_trailing = root->via.array.size - 3;
    } else if (root->type == MSGPACK_OBJECT_MAP) {
        out->map_layout = true;
        for (uint32_t i = 0; i < root->via.map.size; i++) {
            const msgpack_object *k = &root->via.map.ptr[i].key;
            if (str_is(k, "ts"))
                ts = &root->via.map.ptr[i].val;
            else if (str_is(k, "events"))
                events = &root->via.map.ptr[i].val;
            else if (str_is(k, "data_parallel_rank"))
                rank = &root->via.map.ptr[i].val;
        }
        if (!ts || !events)
            return fail(d, "batch: map without ts or events");
    } else {
        return fail(d, "batch: neither an array nor a map");
    }
    if (ts->type == MSGPACK_OBJECT_FLOAT64 || ts->type == MSGPACK_OBJECT_FLOAT32)
        out->ts = ts->via.f64;
    else if (ts->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        out->ts = (double)ts->via.u64;
    else
        return fail(d, "batch: ts is not a number");
    out->dp_rank = -1;
    if (rank && rank->type == MSGPACK_OBJECT_POSITIVE_INTEGER && rank->via.u64 <= INT32_MAX)
        out->dp_rank = (int64_t)rank->via.u64;
    else if (rank && rank->type != MSGPACK_OBJECT_NIL)
        return fail(d, "batch: data_parallel_rank is not an int or nil");
    if (events->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, "batch: events is not an array");
    out->events =
        msgpack_zone_malloc(d->zone, (events->via.array.size + 1) * sizeof(sched_kvev_event_t));
    if (!out->events)
        return SCHED_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < events->via.array.size; i++) {
        st = decode_event(d, &events->via.array.ptr[i], &out->events[out->n_events]);
        if (st == SCHED_ERR_UNSUPPORTED) {
            out->n_unknown++; /* a newer event type: skip it, keep the rest */
            continue;
        }
        if (st != SCHED_OK)
            return st;
        out->n_events++;
    }
    return SCHED_OK;
}

sched_status_t sched_kvev_decode(const void *buf, size_t len, sched_kvev_batch_t *out, char *err,
                                 size_t err_len)
{
    msgpack_unpacked *up;
    size_t off = 0;
    sched_status_t st;
    dec_t d = {.err = err, .err_len = err_len};

    memset(out, 0, sizeof(*out));
    up = sched_malloc(sizeof(*up));
    if (!up)
        return SCHED_ERR_NO_MEMORY;
    msgpack_unpacked_init(up);
    if (!precheck(buf, len) || msgpack_unpack_next(up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != len) {
        st = fail(&d, "payload: not exactly one msgpack object (of at most 4M elements)");
        goto err_free;
    }
    d.zone = up->zone;
    st = decode_batch(&d, &up->data, out);
    if (st != SCHED_OK)
        goto err_free;
    out->zone_ = up;
    return SCHED_OK;

err_free:
    msgpack_unpacked_destroy(up);
    sched_free(up);
    memset(out, 0, sizeof(*out));
    return st;
}

void sched_kvev_batch_free(sched_kvev_batch_t *batch)
{
    if (batch->zone_) {
        msgpack_unpacked_destroy(batch->zone_);
        sched_free(batch->zone_);
    }
    memset(batch, 0, sizeof(*batch));
}
