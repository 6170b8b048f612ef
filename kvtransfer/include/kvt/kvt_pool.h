/*
 * kvt_pool.h -- paged KV buffer pools over registered memory regions.
 *
 * A pool owns one or more regions (contiguous memory, each with a UUID) cut
 * into pages of equal size; one page holds one KV chunk. Pages are named
 * inside the pool by a dense index 0..total_pages-1 (kvt_page_t); on the wire
 * a page is a buffer ref (region UUID, page index inside that region), which
 * kvt_pool_ref_resolve() checks against the region's bounds.
 *
 * Counts per page:
 *   ref  -- owners. kvt_pool_alloc() hands pages out with ref = 1;
 *           kvt_pool_ref() adds owners, kvt_pool_unref() (= kvt_pool_free())
 *           drops one; the page returns to the free list when ref reaches 0.
 *   pin  -- "a transfer is using this page". kvt_pool_pin() takes a pin AND a
 *           ref, kvt_pool_unpin() drops both, so a pinned page can never be
 *           handed out again, whatever its owner does meanwhile.
 * Unref of a free page is KVT_ERR_DOUBLE_FREE, unpin of an unpinned page is
 * KVT_ERR_UNDERFLOW; both are counted in kvt_pool_stats_t and never applied.
 *
 * Memory classes: host memory, or a device behind kvt_mem_ops_t (alloc/free/
 * copy to and from host). kvt_mem_device_emul_ops emulates a device with host
 * memory (tests, pdgw-sim). Regions are announced to transports through
 * kvt_region_hook_t exactly once (at pool creation or when the hook is
 * added), never per page.
 *
 * All functions are thread-safe (one mutex per pool) unless noted.
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stddef.h>
#include <stdint.h>
#include "kvt/kvt_status.h"
#include "kvt/kvt_uuid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- chunk geometry ------------------------------------------------------
 * (fmt, shape, dtype) of AllocRequest / PullReadyNotif -> bytes. fmt values
 * follow LMCache's MemoryFormat; the token dimension of shape is:
 *   KVT_FMT_KV_2LTD (1)    shape [2, layers, tokens, hidden]   -> dim 2
 *   KVT_FMT_KV_T2D  (2)    shape [tokens, 2, hidden]           -> dim 0
 *   KVT_FMT_KV_2TD  (3)    shape [2, tokens, hidden]           -> dim 1
 *   KVT_FMT_KV_MLA  (6)    shape [1, layers, tokens, head]     -> dim 2
 *   anything else          opaque bytes, no token dim; last_chunk_toks ignored
 * A chunk with t tokens has bytes = elem_size * prod(shape) / shape[tok] * t.
 * The last chunk of a request may be short: last_chunk_toks < shape[tok]. */
#define KVT_FMT_UNDEFINED     0
#define KVT_FMT_KV_2LTD       1
#define KVT_FMT_KV_T2D        2
#define KVT_FMT_KV_2TD        3
#define KVT_FMT_BINARY        4
#define KVT_FMT_BINARY_BUFFER 5
#define KVT_FMT_KV_MLA        6

#define KVT_MAX_DIMS  8
#define KVT_DTYPE_MAX 32 /* incl. NUL */

typedef struct kvt_chunk_geom {
    int32_t fmt;
    uint32_t ndim;
    int64_t shape[KVT_MAX_DIMS];
    char dtype[KVT_DTYPE_MAX]; /* as given, e.g. "bfloat16" */
    uint32_t elem_size;        /* bytes per element from dtype */
    int32_t token_dim;         /* index into shape, -1 = none */
} kvt_chunk_geom_t;

/* Bytes per element of a dtype name ("bfloat16", "half", "float16", "float",
 * "float32", "float64", "double", "int8", "uint8", "float8_e4m3fn",
 * "float8_e5m2", "int16", "int32", "int64"; an optional "torch." prefix is
 * accepted). 0 if unknown. */
uint32_t kvt_dtype_size(const char *dtype);

/* Token dimension of <fmt> (see table above) or -1. */
int kvt_fmt_token_dim(int32_t fmt);

/* Fill <g> from the wire fields. KVT_ERR_INVALID for unknown dtype, ndim 0 or
 * > KVT_MAX_DIMS, a dim <= 0, a shape too short for the format's token dim or
 * a byte size overflowing SIZE_MAX. */
kvt_status_t kvt_chunk_geom_init(kvt_chunk_geom_t *g, int32_t fmt, const int64_t *shape,
                                 uint32_t ndim, const char *dtype);

/* The geometry of one LMCache chunk, the unit its PD backends move and
 * allocate (LMCache lmcache/v1/gpu_connector.py get_shape): KV_2LTD
 * [2, layers, chunk_tokens, hidden] (hidden = kv heads x head size), or
 * KV_MLA [1, layers, chunk_tokens, hidden] when <mla>. kvt_chunk_bytes() of
 * it is the page size a receiver needs: one page holds a whole chunk, every
 * layer. */
kvt_status_t kvt_chunk_geom_lmcache(kvt_chunk_geom_t *g, int64_t layers, int64_t chunk_tokens,
                                    int64_t hidden, const char *dtype, int mla);

/* Tokens of a full chunk (shape[token_dim]); 0 when the format has none. */
int64_t kvt_chunk_full_tokens(const kvt_chunk_geom_t *g);

/* Bytes of a full chunk. */
size_t kvt_chunk_bytes(const kvt_chunk_geom_t *g);

/* Bytes of a chunk holding <ntoks> tokens; ntoks <= 0 or >= full means a full
 * chunk; formats without a token dim always give the full size. This is how
 * the last chunk of a request (last_chunk_toks) is sized. */
size_t kvt_chunk_bytes_toks(const kvt_chunk_geom_t *g, int64_t ntoks);

/* ---- memory classes --------------------------------------------------- */
typedef enum kvt_mem_class {
    KVT_MEM_HOST = 0,
    KVT_MEM_DEVICE = 1,
} kvt_mem_class_t;

/* Memory provider. <ctx> is kvt_pool_params_t.ops_ctx. Device memory that is
 * not host-addressable sets host_addressable = 0; the TCP transport then
 * stages through copy_to_host/copy_from_host. */
typedef struct kvt_mem_ops {
    const char *name;
    int host_addressable;
    kvt_status_t (*alloc)(void *ctx, size_t len, void **base_out);
    void (*free)(void *ctx, void *base, size_t len);
    kvt_status_t (*copy_to_host)(void *ctx, void *host_dst, const void *dev_src, size_t len);
    kvt_status_t (*copy_from_host)(void *ctx, void *dev_dst, const void *host_src, size_t len);
} kvt_mem_ops_t;

extern const kvt_mem_ops_t kvt_mem_host_ops;        /* page-aligned, zeroed host memory */
extern const kvt_mem_ops_t kvt_mem_device_emul_ops; /* "device" emulated by host memory */

/* ---- regions and registration hooks ----------------------------------- */
typedef struct kvt_region_info {
    kvt_uuid_t uuid;
    void *base;       /* first byte of the region */
    size_t length;    /* npages * page_size */
    size_t page_size; /* bytes per page */
    uint32_t npages;
    uint32_t first_page; /* pool-wide index of the region's page 0 */
    kvt_mem_class_t mem_class;
    int host_addressable;
} kvt_region_info_t;

/* A transport's registration hook. on_register runs once per region (under
 * no pool lock, before the pool is used by anything else when given in
 * kvt_pool_params_t; immediately for existing regions when added later with
 * kvt_pool_add_hook). A failing on_register fails pool creation /
 * kvt_pool_add_hook and regions registered so far are deregistered.
 * on_deregister runs at kvt_pool_destroy (or kvt_pool_remove_hook). <handle>
 * is whatever on_register stored (e.g. an ibv_mr). */
typedef struct kvt_region_hook {
    kvt_status_t (*on_register)(void *arg, const kvt_region_info_t *r, void **handle_out);
    void (*on_deregister)(void *arg, const kvt_region_info_t *r, void *handle);
    void *arg;
} kvt_region_hook_t;

#define KVT_POOL_MAX_HOOKS   4
#define KVT_POOL_MAX_REGIONS 64

/* ---- pool ------------------------------------------------------------- */
typedef struct kvt_pool kvt_pool_t;
typedef uint32_t kvt_page_t;
#define KVT_PAGE_NONE UINT32_MAX

/* Wire form of a page. */
typedef struct kvt_buf_ref {
    kvt_uuid_t region;
    uint32_t page; /* index inside the region */
} kvt_buf_ref_t;

typedef struct kvt_pool_params {
    const char *name;          /* for logs/metrics, e.g. "kv", "cpu-offload"; copied */
    kvt_mem_class_t mem_class; /* KVT_MEM_HOST or KVT_MEM_DEVICE */
    const kvt_mem_ops_t *ops;  /* NULL: kvt_mem_host_ops / kvt_mem_device_emul_ops */
    void *ops_ctx;
    size_t page_size;               /* bytes per page (= kvt_chunk_bytes of a full chunk); > 0 */
    size_t buffer_size;             /* total bytes; total_pages = buffer_size / page_size (>= 1) */
    uint32_t nregions;              /* split the buffer into this many regions; 0 = 1 */
    void *external_base;            /* non-NULL: use this caller-owned memory (buffer_size bytes,
                                       one region) instead of ops->alloc; never freed by the pool */
    const kvt_uuid_t *region_uuids; /* optional fixed UUIDs (nregions of them) */
    const kvt_region_hook_t *hooks; /* optional, nhooks of them, copied */
    uint32_t nhooks;
} kvt_pool_params_t;

typedef struct kvt_pool_stats {
    uint32_t total_pages;
    uint32_t free_pages;
    uint32_t used_pages;   /* total - free */
    uint32_t pinned_pages; /* pages with pin > 0 (gauge kvt_pinned_pages) */
    size_t page_size;
    uint64_t alloc_total;        /* pages handed out */
    uint64_t alloc_fail_total;   /* pages asked for and not given */
    uint64_t too_large_total;    /* requests larger than the whole pool */
    uint64_t double_free_total;  /* unref of free pages */
    uint64_t underflow_total;    /* unpin of unpinned pages */
    uint64_t bounds_error_total; /* refused refs / ranges */
} kvt_pool_stats_t;

/* Create a pool. All pages start free. Copies everything it needs from
 * <params>. */
kvt_status_t kvt_pool_create(const kvt_pool_params_t *params, kvt_pool_t **out);

/* Deregister (hooks in reverse order) and free the regions. Pages still in
 * use are released regardless (stats tell the caller if that was a leak). */
void kvt_pool_destroy(kvt_pool_t *pool);

const char *kvt_pool_name(const kvt_pool_t *pool);
size_t kvt_pool_page_size(const kvt_pool_t *pool);
uint32_t kvt_pool_total_pages(const kvt_pool_t *pool);
kvt_mem_class_t kvt_pool_mem_class(const kvt_pool_t *pool);
const kvt_mem_ops_t *kvt_pool_mem_ops(const kvt_pool_t *pool);
void kvt_pool_stats(kvt_pool_t *pool, kvt_pool_stats_t *out);

uint32_t kvt_pool_nregions(const kvt_pool_t *pool);
/* Region <i> (0..nregions-1) info copy. KVT_ERR_BOUNDS when out of range. */
kvt_status_t kvt_pool_region(const kvt_pool_t *pool, uint32_t i, kvt_region_info_t *out);
/* Region by UUID. KVT_ERR_NOT_FOUND when the pool has no such region. */
kvt_status_t kvt_pool_region_find(const kvt_pool_t *pool, const kvt_uuid_t *uuid,
                                  kvt_region_info_t *out);

/* Register one more hook; on_register runs now for every region. */
kvt_status_t kvt_pool_add_hook(kvt_pool_t *pool, const kvt_region_hook_t *hook);
/* Deregister a hook added earlier (matched by on_register+arg). */
kvt_status_t kvt_pool_remove_hook(kvt_pool_t *pool, const kvt_region_hook_t *hook);
/* Handle stored by hook number <hook_idx> (order of addition) for region <i>. */
void *kvt_pool_region_handle(const kvt_pool_t *pool, uint32_t i, uint32_t hook_idx);

/* Allocation flags. */
#define KVT_ALLOC_PARTIAL 0x1u /* give what is there; failed slots are marked */

/* Allocate <n> pages (ref = 1, pin = 0) into pages_out[0..n-1].
 *  - n > total_pages: KVT_ERR_TOO_LARGE at once (counted), nothing allocated.
 *  - all n available: KVT_OK.
 *  - otherwise without KVT_ALLOC_PARTIAL: KVT_ERR_NOSPACE, nothing allocated.
 *  - otherwise with KVT_ALLOC_PARTIAL: KVT_OK; the first free pages go to the
 *    first slots, the remaining slots get KVT_PAGE_NONE and their bit set in
 *    <failed_bitmap> (bit i = byte i/8, mask 1 << (i%8); (n+7)/8 bytes, may be
 *    NULL, fully rewritten). *nalloc_out (may be NULL) = pages given.
 * <keep_free> variant: only pages beyond the first <keep_free> free ones may
 * be taken (reservations of other requests). */
kvt_status_t kvt_pool_alloc(kvt_pool_t *pool, uint32_t n, unsigned flags, kvt_page_t *pages_out,
                            uint8_t *failed_bitmap, uint32_t *nalloc_out);
kvt_status_t kvt_pool_alloc_keep(kvt_pool_t *pool, uint32_t n, uint32_t keep_free, unsigned flags,
                                 kvt_page_t *pages_out, uint8_t *failed_bitmap,
                                 uint32_t *nalloc_out);

/* Batch count operations. Every page is processed; KVT_PAGE_NONE entries are
 * skipped. A bad page (out of range, free page for ref/pin, double free,
 * unpin below zero) is counted and left untouched, the others are applied,
 * and the first error is returned. */
kvt_status_t kvt_pool_ref(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n);
kvt_status_t kvt_pool_unref(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n);
kvt_status_t kvt_pool_free(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n); /* = unref */
kvt_status_t kvt_pool_pin(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n);
kvt_status_t kvt_pool_unpin(kvt_pool_t *pool, const kvt_page_t *pages, uint32_t n);

/* Current counts of one page (for tests and assertions). */
kvt_status_t kvt_pool_page_counts(kvt_pool_t *pool, kvt_page_t page, uint32_t *ref_out,
                                  uint32_t *pin_out);

/* Address of a page (valid while the pool lives). KVT_ERR_BOUNDS if page is
 * out of range. Works for free pages too (callers own the discipline). */
kvt_status_t kvt_pool_page_addr(const kvt_pool_t *pool, kvt_page_t page, void **addr_out);

/* Pool page <-> wire ref. */
kvt_status_t kvt_pool_page_to_ref(const kvt_pool_t *pool, kvt_page_t page, kvt_buf_ref_t *out);
kvt_status_t kvt_pool_ref_to_page(const kvt_pool_t *pool, const kvt_buf_ref_t *ref,
                                  kvt_page_t *out);
/* Bounds-checked resolution of a wire ref: unknown region -> KVT_ERR_NOT_FOUND,
 * page beyond the region -> KVT_ERR_BOUNDS (both counted). */
kvt_status_t kvt_pool_ref_resolve(kvt_pool_t *pool, const kvt_buf_ref_t *ref, void **addr_out,
                                  size_t *len_out);

/* Check a byte range [offset, offset+len) of region <uuid> (TCP transport
 * WRITE/READ requests). Overflow-safe. On KVT_OK *addr_out = base + offset
 * and *page_out (may be NULL) = pool page of offset. */
kvt_status_t kvt_pool_range_check(kvt_pool_t *pool, const kvt_uuid_t *uuid, uint64_t offset,
                                  uint64_t len, void **addr_out, kvt_page_t *page_out);

/* ---- copies / CPU offload ---------------------------------------------
 * Copy <bytes> (0 = a whole page) from page <src_page> of <src> to page
 * <dst_page> of <dst>, through the pools' mem ops (device->host uses
 * copy_to_host, host->device copy_from_host, device->device stages through a
 * bounded host buffer). */
kvt_status_t kvt_pool_copy_page(kvt_pool_t *dst, kvt_page_t dst_page, kvt_pool_t *src,
                                kvt_page_t src_page, size_t bytes);

/* Copy host bytes in/out of a page (bounds-checked: offset+len <= page). */
kvt_status_t kvt_pool_write(kvt_pool_t *pool, kvt_page_t page, size_t offset, const void *data,
                            size_t len);
kvt_status_t kvt_pool_read(kvt_pool_t *pool, kvt_page_t page, size_t offset, void *data,
                           size_t len);

/* Sender-side CPU offload (pd_use_cpu_offload): allocate <n> pages of
 * <cpu_pool> (all or nothing), copy src_pages[i] of <src> into them and
 * return them in cpu_pages_out (ref = 1). The caller keeps its ref on the
 * source pages (usually frees them right after, which is the point). Page
 * sizes must match (KVT_ERR_INVALID otherwise). */
kvt_status_t kvt_pool_offload(kvt_pool_t *cpu_pool, kvt_pool_t *src, const kvt_page_t *src_pages,
                              uint32_t n, kvt_page_t *cpu_pages_out);

/* Bitmap helpers (bit i = byte i/8, mask 1 << (i%8)). */
static inline int kvt_bitmap_test(const uint8_t *bm, uint32_t i)
{
    return (bm[i >> 3] >> (i & 7)) & 1;
}
static inline void kvt_bitmap_set(uint8_t *bm, uint32_t i)
{
    bm[i >> 3] = (uint8_t)(bm[i >> 3] | (1u << (i & 7)));
}
static inline void kvt_bitmap_clear(uint8_t *bm, uint32_t i)
{
    bm[i >> 3] = (uint8_t)(bm[i >> 3] & ~(1u << (i & 7)));
}
static inline size_t kvt_bitmap_bytes(uint32_t nbits)
{
    return ((size_t)nbits + 7) / 8;
}

#ifdef __cplusplus
}
#endif
#endif /* KVT_POOL_H */
