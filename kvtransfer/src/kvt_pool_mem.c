/*
 * kvt_pool_mem.c -- memory providers (host, emulated device) and the copy
 * helpers between pools, including the sender-side CPU offload.
 */
#include "kvt_pool_int.h"
#include "kvt_tsan.h"

#include <string.h>
#include <sys/mman.h>

#ifdef KVT_TSAN
char kvt_tsan_wire;
#endif

/* Anonymous mappings: page aligned, zeroed, committed lazily, so a 1 GiB
 * buffer costs nothing until used. */
static kvt_status_t host_alloc(void *ctx, size_t len, void **base_out)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return KVT_ERR_NOMEM;
    *base_out = p;
    return KVT_OK;
}

static void host_free(void *ctx, void *base, size_t len)
{
    munmap(base, len);
}

static kvt_status_t host_copy(void *ctx, void *dst, const void *src, size_t len)
{
    memmove(dst, src, len);
    return KVT_OK;
}

const kvt_mem_ops_t kvt_mem_host_ops = {
    .name = "host",
    .host_addressable = 1,
    .alloc = host_alloc,
    .free = host_free,
    .copy_to_host = host_copy,
    .copy_from_host = host_copy,
};

/* A "device" backed by host memory: same bytes, but every copy goes through
 * the device copy entry points, as a CUDA/NPU provider's would. */
const kvt_mem_ops_t kvt_mem_device_emul_ops = {
    .name = "device-emul",
    .host_addressable = 1,
    .alloc = host_alloc,
    .free = host_free,
    .copy_to_host = host_copy,
    .copy_from_host = host_copy,
};

static int pool_is_host(const kvt_pool_t *pool)
{
    return pool->mem_class == KVT_MEM_HOST;
}

#define STAGE_BYTES (1u << 20)

static kvt_status_t copy_bytes(kvt_pool_t *dst, void *daddr, kvt_pool_t *src, const void *saddr,
                               size_t bytes)
{
    if (pool_is_host(dst) && pool_is_host(src)) {
        memcpy(daddr, saddr, bytes);
        return KVT_OK;
    }
    if (pool_is_host(dst)) /* device -> host */
        return src->ops->copy_to_host(src->ops_ctx, daddr, saddr, bytes);
    if (pool_is_host(src)) /* host -> device */
        return dst->ops->copy_from_host(dst->ops_ctx, daddr, saddr, bytes);

    /* device -> device through a bounded host staging buffer */
    {
        size_t stage_len = bytes < STAGE_BYTES ? bytes : STAGE_BYTES;
        char *stage = kvt_malloc(stage_len);
        kvt_status_t status = KVT_OK;
        if (stage == NULL)
            return KVT_ERR_NOMEM;
        for (size_t off = 0; off < bytes && status == KVT_OK; off += stage_len) {
            size_t n = bytes - off < stage_len ? bytes - off : stage_len;
            status = src->ops->copy_to_host(src->ops_ctx, stage, (const char *)saddr + off, n);
            if (status == KVT_OK)
                status = dst->ops->copy_from_host(dst->ops_ctx, (char *)daddr + off, stage, n);
        }
        kvt_free(stage);
        return status;
    }
}

kvt_status_t kvt_pool_copy_page(kvt_pool_t *dst, kvt_page_t dst_page, kvt_pool_t *src,
                                kvt_page_t src_page, size_t bytes)
{
    void *daddr, *saddr;
    kvt_status_t status;

    if (dst == NULL || src == NULL)
        return KVT_ERR_INVALID;
    if (bytes == 0)
        bytes = src->page_size;
    if (bytes > src->page_size || bytes > dst->page_size)
        return KVT_ERR_BOUNDS;
    status = kvt_pool_page_addr(dst, dst_page, &daddr);
    if (status == KVT_OK)
        status = kvt_pool_page_addr(src, src_page, &saddr);
    if (status != KVT_OK)
        return status;
    return copy_bytes(dst, daddr, src, saddr, bytes);
}

kvt_status_t kvt_pool_write(kvt_pool_t *pool, kvt_page_t page, size_t offset, const void *data,
                            size_t len)
{
    void *addr;
    kvt_status_t status;

    if (pool == NULL || (data == NULL && len > 0))
        return KVT_ERR_INVALID;
    if (offset > pool->page_size || len > pool->page_size - offset)
        return KVT_ERR_BOUNDS;
    status = kvt_pool_page_addr(pool, page, &addr);
    if (status != KVT_OK || len == 0)
        return status;
    if (pool_is_host(pool)) {
        KVT_TSAN_WIRE_ACQUIRE();
        memcpy((char *)addr + offset, data, len);
        return KVT_OK;
    }
    return pool->ops->copy_from_host(pool->ops_ctx, (char *)addr + offset, data, len);
}

kvt_status_t kvt_pool_read(kvt_pool_t *pool, kvt_page_t page, size_t offset, void *data, size_t len)
{
    void *addr;
    kvt_status_t status;

    if (pool == NULL || (data == NULL && len > 0))
        return KVT_ERR_INVALID;
    if (offset > pool->page_size || len > pool->page_size - offset)
        return KVT_ERR_BOUNDS;
    status = kvt_pool_page_addr(pool, page, &addr);
    if (status != KVT_OK || len == 0)
        return status;
    if (pool_is_host(pool)) {
        KVT_TSAN_WIRE_ACQUIRE();
        memcpy(data, (char *)addr + offset, len);
        return KVT_OK;
    }
    return pool->ops->copy_to_host(pool->ops_ctx, data, (char *)addr + offset, len);
}

kvt_status_t kvt_pool_offload(kvt_pool_t *cpu_pool, kvt_pool_t *src, const kvt_page_t *src_pages,
                              uint32_t n, kvt_page_t *cpu_pages_out)
{
    kvt_page_t *pages;
    kvt_status_t status;

    if (cpu_pool == NULL || src == NULL || (n > 0 && (src_pages == NULL || cpu_pages_out == NULL)))
        return KVT_ERR_INVALID;
    if (cpu_pool->page_size != src->page_size)
        return KVT_ERR_INVALID;
    if (n == 0)
        return KVT_OK;
    for (uint32_t i = 0; i < n; i++)
        if (src_pages[i] >= src->total_pages)
            return KVT_ERR_BOUNDS;
    pages = kvt_malloc((size_t)n * sizeof(*pages));
    if (pages == NULL)
        return KVT_ERR_NOMEM;
    status = kvt_pool_alloc(cpu_pool, n, 0, pages, NULL, NULL);
    if (status != KVT_OK)
        goto out;
    for (uint32_t i = 0; i < n && status == KVT_OK; i++)
        status = kvt_pool_copy_page(cpu_pool, pages[i], src, src_pages[i], 0);
    if (status != KVT_OK) {
        kvt_pool_free(cpu_pool, pages, n);
        goto out;
    }
    memcpy(cpu_pages_out, pages, (size_t)n * sizeof(*pages));
out:
    kvt_free(pages);
    return status;
}
