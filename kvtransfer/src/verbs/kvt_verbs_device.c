/*
 * Device, port and GID choice, and opening the chosen device. The choice reads
 * sysfs under an injectable root so it is tested against a fake tree: the
 * configured device if any, else the NIC on (or nearest to) the NUMA node of
 * the memory being registered.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvt_verbs_dev.h"

#define SCORE_UNKNOWN 100000
#define SCORE_FAR     10000

void kvt_verbs_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvt verbs: %s\n", line);
}

void kvt_verbs_cfg_defaults(kvt_verbs_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->port = 0;
    cfg->gid_index = -1;
    cfg->qps_per_peer = KVT_VERBS_DEFAULT_QPS;
    cfg->slice_size = KVT_VERBS_SLICE_SIZE;
    cfg->max_wr = KVT_VERBS_DEFAULT_MAX_WR;
    cfg->batch = KVT_VERBS_DEFAULT_BATCH;
    cfg->retry_limit = KVT_VERBS_DEFAULT_RETRIES;
    cfg->max_mr_size = 0;
    cfg->sysfs_root = NULL;
}

static kvt_status_t parse_int(const char *s, size_t n, long lo, long hi, int *out)
{
    char buf[16], *end;
    long v;

    if (n == 0 || n >= sizeof(buf))
        return KVT_ERR_CONFIG;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    v = strtol(buf, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return KVT_ERR_CONFIG;
    *out = (int)v;
    return KVT_OK;
}

kvt_status_t kvt_verbs_cfg_parse_device(const char *s, kvt_verbs_cfg_t *cfg)
{
    const char *c1, *c2;
    size_t nlen;
    int port = 0, gid = -1;

    if (s == NULL)
        s = "";
    c1 = strchr(s, ':');
    nlen = c1 != NULL ? (size_t)(c1 - s) : strlen(s);
    if (nlen >= sizeof(cfg->device))
        return KVT_ERR_CONFIG;
    if (c1 != NULL) {
        c2 = strchr(c1 + 1, ':');
        if (c2 != NULL && strchr(c2 + 1, ':') != NULL)
            return KVT_ERR_CONFIG;
        size_t plen = c2 != NULL ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);

        if (plen > 0 && parse_int(c1 + 1, plen, 1, 255, &port) != KVT_OK)
            return KVT_ERR_CONFIG;
        if (c2 != NULL && c2[1] != '\0' &&
            parse_int(c2 + 1, strlen(c2 + 1), 0, 255, &gid) != KVT_OK)
            return KVT_ERR_CONFIG;
    }
    memcpy(cfg->device, s, nlen);
    cfg->device[nlen] = '\0';
    cfg->port = port;
    cfg->gid_index = gid;
    return KVT_OK;
}

/* Read a small sysfs file into buf (NUL-terminated, trailing newline cut). */
static bool read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL)
        return false;
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return true;
}

static const char *root_or_sys(const char *root)
{
    return root != NULL ? root : "/sys";
}

int kvt_verbs_dev_numa(const char *root, const char *dev)
{
    char path[512], buf[32], *end;
    long v;

    snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/numa_node", root_or_sys(root), dev);
    if (!read_small(path, buf, sizeof(buf)))
        return -1;
    v = strtol(buf, &end, 10);
    if (end == buf || *end != '\0' || v < 0 || v > 4095)
        return -1;
    return (int)v;
}

/* Distance from node <from> to node <to> per the node's distance table, -1 when
 * unknown. */
static int numa_distance(const char *root, int from, int to)
{
    char path[256], buf[1024], *p, *end;

    snprintf(path, sizeof(path), "%s/devices/system/node/node%d/distance", root_or_sys(root), from);
    if (!read_small(path, buf, sizeof(buf)))
        return -1;
    p = buf;
    for (int i = 0;; i++) {
        long v = strtol(p, &end, 10);

        if (end == p)
            return -1;
        if (i == to)
            return v < 0 || v > 1000 ? -1 : (int)v;
        p = end;
    }
}

kvt_status_t kvt_verbs_dev_pick(const char *root, const char *const *names, size_t n,
                                const char *want, int numa, size_t *idx)
{
    size_t best = 0;
    int best_score = -1;

    if (n == 0)
        return KVT_ERR_NOT_FOUND;
    if (want != NULL && want[0] != '\0') {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(names[i], want) == 0) {
                *idx = i;
                return KVT_OK;
            }
        }
        return KVT_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        int node = numa < 0 ? -1 : kvt_verbs_dev_numa(root, names[i]);
        int score;

        if (numa < 0 || node < 0) {
            score = SCORE_UNKNOWN;
        } else if (node == numa) {
            score = 0;
        } else {
            int d = numa_distance(root, numa, node);

            score = d >= 0 ? d : SCORE_FAR;
        }
        if (best_score < 0 || score < best_score) {
            best = i;
            best_score = score;
        }
    }
    *idx = best;
    return KVT_OK;
}

static bool gid_is_zero(const uint8_t g[16])
{
    for (int i = 0; i < 16; i++)
        if (g[i] != 0)
            return false;
    return true;
}

static bool gid_is_v4_mapped(const uint8_t g[16])
{
    for (int i = 0; i < 10; i++)
        if (g[i] != 0)
            return false;
    return g[10] == 0xff && g[11] == 0xff;
}

int kvt_verbs_gid_pick(const char *root, const char *dev, int port, int want)
{
    int first_v2 = -1, first_nonzero = -1;

    if (want >= 0)
        return want;
    for (int i = 0; i < 256; i++) {
        char path[512], buf[64], type[32];
        uint8_t g[16];

        snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%d/gids/%d", root_or_sys(root),
                 dev, port, i);
        if (!read_small(path, buf, sizeof(buf)))
            break;
        if (kvt_verbs_gid_parse(buf, g) != KVT_OK || gid_is_zero(g))
            continue;
        if (first_nonzero < 0)
            first_nonzero = i;
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
                 root_or_sys(root), dev, port, i);
        if (!read_small(path, type, sizeof(type)) || strcasecmp(type, "RoCE v2") != 0)
            continue;
        if (gid_is_v4_mapped(g))
            return i;
        if (first_v2 < 0)
            first_v2 = i;
    }
    if (first_v2 >= 0)
        return first_v2;
    return first_nonzero >= 0 ? first_nonzero : 0;
}

int kvt_verbs_numa_of(const void *addr)
{
    int node = -1;

    /* get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR): the node holding the page at
     * addr. */
    if (addr == NULL || syscall(SYS_get_mempolicy, &node, NULL, 0UL, addr, 3UL) != 0)
        return -1;
    return node;
}

int kvt_verbs_dev_available(void)
{
    struct ibv_device **list;
    int n = 0;

    list = ibv_get_device_list(&n);
    if (list == NULL)
        return 0;
    ibv_free_device_list(list);
    return n > 0 ? n : 0;
}

/* First ACTIVE port (or the configured one); fills dev->port. */
static kvt_status_t open_port(kvt_verbs_dev_t *dev, const kvt_verbs_cfg_t *cfg,
                              const struct ibv_device_attr *da)
{
    struct ibv_port_attr pa;
    union ibv_gid gid;
    int first = cfg->port > 0 ? cfg->port : 1;
    int last = cfg->port > 0 ? cfg->port : da->phys_port_cnt;
    int gidx;

    for (int p = first; p <= last; p++) {
        if (ibv_query_port(dev->ctx, (uint8_t)p, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
            continue;
        gidx = kvt_verbs_gid_pick(cfg->sysfs_root, dev->name, p, cfg->gid_index);
        if (gidx >= pa.gid_tbl_len || ibv_query_gid(dev->ctx, (uint8_t)p, gidx, &gid) != 0) {
            kvt_verbs_log("%s port %d: GID index %d unusable", dev->name, p, gidx);
            return KVT_ERR_CONFIG;
        }
        memset(&dev->port, 0, sizeof(dev->port));
        dev->port.port_num = (uint8_t)p;
        dev->port.lid = pa.lid;
        dev->port.mtu = (uint8_t)pa.active_mtu;
        dev->port.gid_index = (uint8_t)gidx;
        memcpy(dev->port.gid, gid.raw, 16);
        /* RoCE needs a GRH on every packet; IB inside one subnet routes by LID. */
        dev->port.global = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        return KVT_OK;
    }
    kvt_verbs_log("%s: no active port%s", dev->name, cfg->port > 0 ? " (configured)" : "");
    return KVT_ERR_NOT_FOUND;
}

kvt_status_t kvt_verbs_dev_open(const kvt_verbs_cfg_t *cfg, int numa, uint32_t cq_size,
                                kvt_verbs_dev_t **out)
{
    struct ibv_device **list;
    struct ibv_device_attr da;
    const char **names = NULL;
    kvt_verbs_dev_t *dev;
    kvt_status_t st;
    size_t idx;
    int n = 0, rc;

    errno = 0;
    list = ibv_get_device_list(&n);
    if (list == NULL || n <= 0) {
        kvt_verbs_log("transfer_channel verbs: no RDMA device on this host "
                      "(ibv_get_device_list: %s)",
                      list == NULL ? strerror(errno) : "empty list");
        if (list != NULL)
            ibv_free_device_list(list);
        return KVT_ERR_UNSUPPORTED;
    }
    st = KVT_ERR_NOMEM;
    names = kvt_calloc((size_t)n, sizeof(*names));
    dev = kvt_calloc(1, sizeof(*dev));
    if (names == NULL || dev == NULL)
        goto err_dev;
    for (int i = 0; i < n; i++)
        names[i] = ibv_get_device_name(list[i]);
    st = kvt_verbs_dev_pick(cfg->sysfs_root, names, (size_t)n, cfg->device, numa, &idx);
    if (st != KVT_OK) {
        kvt_verbs_log("configured RDMA device '%s' not found", cfg->device);
        goto err_dev;
    }
    snprintf(dev->name, sizeof(dev->name), "%s", names[idx]);
    dev->numa = kvt_verbs_dev_numa(cfg->sysfs_root, dev->name);
    st = KVT_ERR_IO;
    dev->ctx = ibv_open_device(list[idx]);
    if (dev->ctx == NULL) {
        kvt_verbs_log("ibv_open_device(%s) failed: %s", dev->name, strerror(errno));
        goto err_dev;
    }
    rc = ibv_query_device(dev->ctx, &da);
    if (rc != 0) {
        kvt_verbs_log("ibv_query_device(%s) failed: %s", dev->name, strerror(rc));
        goto err_ctx;
    }
    dev->max_mr_size = da.max_mr_size;
    dev->max_qp_wr = (uint32_t)da.max_qp_wr;
    dev->max_rd_atom =
        (uint8_t)(da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom
                                                             : da.max_qp_init_rd_atom);
    if (dev->max_rd_atom == 0)
        dev->max_rd_atom = 1;
    st = open_port(dev, cfg, &da);
    if (st != KVT_OK)
        goto err_ctx;
    st = KVT_ERR_IO;
    dev->pd = ibv_alloc_pd(dev->ctx);
    if (dev->pd == NULL) {
        kvt_verbs_log("ibv_alloc_pd(%s) failed: %s", dev->name, strerror(errno));
        goto err_ctx;
    }
    dev->channel = ibv_create_comp_channel(dev->ctx);
    if (dev->channel == NULL) {
        kvt_verbs_log("ibv_create_comp_channel(%s) failed: %s", dev->name, strerror(errno));
        goto err_pd;
    }
    if (da.max_cqe > 0 && cq_size > (uint32_t)da.max_cqe)
        cq_size = (uint32_t)da.max_cqe;
    dev->cq = ibv_create_cq(dev->ctx, (int)cq_size, NULL, dev->channel, 0);
    if (dev->cq == NULL) {
        kvt_verbs_log("ibv_create_cq(%s, %u) failed: %s", dev->name, cq_size, strerror(errno));
        goto err_channel;
    }
    dev->cq_size = cq_size;
    rc = ibv_req_notify_cq(dev->cq, 0);
    if (rc != 0) {
        kvt_verbs_log("ibv_req_notify_cq(%s) failed: %s", dev->name, strerror(rc));
        goto err_cq;
    }
    kvt_verbs_log("using %s port %u gid index %u (numa node %d, mtu %u)", dev->name,
                  dev->port.port_num, dev->port.gid_index, dev->numa,
                  kvt_verbs_mtu_bytes(dev->port.mtu));
    kvt_free(names);
    ibv_free_device_list(list);
    *out = dev;
    return KVT_OK;

err_cq:
    ibv_destroy_cq(dev->cq);
err_channel:
    ibv_destroy_comp_channel(dev->channel);
err_pd:
    ibv_dealloc_pd(dev->pd);
err_ctx:
    ibv_close_device(dev->ctx);
err_dev:
    kvt_free(dev);
    kvt_free(names);
    ibv_free_device_list(list);
    return st;
}

void kvt_verbs_dev_close(kvt_verbs_dev_t *dev)
{
    if (dev == NULL)
        return;
    ibv_destroy_cq(dev->cq);
    ibv_destroy_comp_channel(dev->channel);
    ibv_dealloc_pd(dev->pd);
    ibv_close_device(dev->ctx);
    kvt_free(dev);
}
