/*
 * pdgw_registry.c - forwarder registry (duplicates refused) and plugin loading with an
 * ABI version check.
 */
#include "pdgw_registry.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_fwd_sdk.h"
#include "pdgw_log.h"

#define REFUSAL_MAX 16

typedef struct registry_entry {
    const pdgw_fwd_desc_t *desc;
    pdgw_fwd_desc_t upgraded;    /* the plugin's descriptor, completed with defaults */
    pdgw_fwd_ops_t upgraded_ops; /* its ops table, completed the same way */
    char origin[256];            /* "built-in" or the plugin path */
    int logged;
} registry_entry_t;

typedef struct registry_refusal {
    pdgw_status_t status;
    char message[384];
    int logged;
} registry_refusal_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static registry_entry_t registry[PDGW_REGISTRY_MAX];
static size_t registry_count;
static registry_refusal_t refusals[REFUSAL_MAX];
static size_t refusal_count;
static const char *loading_path; /* plugin being dlopen'ed, under registry_lock */

static void registry_refuse(pdgw_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void registry_refuse(pdgw_status_t status, const char *fmt, ...)
{
    registry_refusal_t *r;
    va_list ap;
    if (refusal_count == REFUSAL_MAX)
        return;
    r = &refusals[refusal_count++];
    r->status = status;
    r->logged = 0;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
}

/* Bytes of the plugin's descriptor / ops table the gateway may read: fixed per version up to
 * ABI 3, declared by the plugin from ABI 4 on. */
static size_t desc_size_of(const pdgw_fwd_desc_t *d)
{
    switch (d->abi_version) {
    case 1:
        return offsetof(pdgw_fwd_desc_t, client_fields);
    case 2:
        return offsetof(pdgw_fwd_desc_t, native_paths);
    case 3:
        return offsetof(pdgw_fwd_desc_t, struct_size);
    default:
        return d->struct_size;
    }
}

static size_t ops_size_of(const pdgw_fwd_desc_t *d)
{
    if (d->abi_version < 3)
        return offsetof(pdgw_fwd_ops_t, rewrite_decode);
    if (d->abi_version == 3)
        return offsetof(pdgw_fwd_ops_t, check_instance) + sizeof(d->ops->check_instance);
    return d->ops_size;
}

/* ABI 4 and later: the sizes must at least cover the fields every version has. */
static int size_fields_ok(const pdgw_fwd_desc_t *d)
{
    if (d->abi_version < 4)
        return 1;
    return d->struct_size >= offsetof(pdgw_fwd_desc_t, ops_size) + sizeof(d->ops_size) &&
           d->ops_size >= offsetof(pdgw_fwd_ops_t, build_leg) + sizeof(d->ops->build_leg);
}

/* The registry's own copy of <d> and its ops: what the plugin's version has, the rest zero
 * (= the documented default), then the ops its ABI 4 fields stand for. */
static const pdgw_fwd_desc_t *upgrade(registry_entry_t *e, const pdgw_fwd_desc_t *d)
{
    size_t dn = desc_size_of(d), on = ops_size_of(d);

    memset(&e->upgraded, 0, sizeof(e->upgraded));
    memcpy(&e->upgraded, d, dn < sizeof(e->upgraded) ? dn : sizeof(e->upgraded));
    memset(&e->upgraded_ops, 0, sizeof(e->upgraded_ops));
    memcpy(&e->upgraded_ops, d->ops, on < sizeof(e->upgraded_ops) ? on : sizeof(e->upgraded_ops));
    e->upgraded.struct_size = sizeof(e->upgraded);
    e->upgraded.ops_size = sizeof(e->upgraded_ops);
    if (d->abi_version < 4) {
        e->upgraded.ctx_size = 0;
        e->upgraded.options = NULL;
        e->upgraded.state_size = 0;
    }
    e->upgraded.ops = &e->upgraded_ops;
    pdgw_fwd_sdk_complete_ops(&e->upgraded, &e->upgraded_ops);
    return &e->upgraded;
}

int pdgw_fwd_register(const pdgw_fwd_desc_t *desc)
{
    const char *origin;
    int rc = -1;
    size_t i;

    /* No I/O here: this runs from constructors before main(). */
    pthread_mutex_lock(&registry_lock);
    origin = loading_path ? loading_path : "built-in";
    if (desc == NULL) {
        registry_refuse(PDGW_ERR_INVALID, "%s: NULL forwarder descriptor", origin);
        goto out;
    }
    if (desc->abi_version < PDGW_FWD_ABI_MIN_VERSION || desc->abi_version > PDGW_FWD_ABI_VERSION) {
        /* Only abi_version is read from a foreign descriptor: its layout may differ. */
        registry_refuse(PDGW_ERR_ABI,
                        "%s: forwarder built for forwarder ABI version %u, but this pdgw "
                        "provides ABI versions %u..%u; rebuild it against this pdgw's "
                        "gateway/include/pdgw/forwarder.h",
                        origin, desc->abi_version, (unsigned)PDGW_FWD_ABI_MIN_VERSION,
                        (unsigned)PDGW_FWD_ABI_VERSION);
        goto out;
    }
    if (desc->name == NULL || desc->name[0] == '\0' || desc->ops == NULL ||
        desc->ops->build_leg == NULL || desc->modes == 0 || desc->dispatch == 0) {
        registry_refuse(PDGW_ERR_INVALID,
                        "%s: forwarder descriptor incomplete (needs name, modes, dispatch and "
                        "ops->build_leg)",
                        origin);
        goto out;
    }
    for (i = 0; i < registry_count; i++) {
        if (strcmp(registry[i].desc->name, desc->name) == 0) {
            registry_refuse(PDGW_ERR_EXISTS,
                            "%s: forwarder '%s' refused: name already registered by %s", origin,
                            desc->name, registry[i].origin);
            goto out;
        }
    }
    if (registry_count == PDGW_REGISTRY_MAX) {
        registry_refuse(PDGW_ERR_LIMIT, "%s: too many forwarders registered", origin);
        goto out;
    }
    if (!size_fields_ok(desc)) {
        registry_refuse(PDGW_ERR_ABI,
                        "%s: forwarder '%s' declares ABI %u but its struct_size/ops_size are "
                        "too small (build it with PDGW_FWD_DESC_HEADER)",
                        origin, desc->name, desc->abi_version);
        goto out;
    }
    desc = upgrade(&registry[registry_count], desc);
    registry[registry_count].desc = desc;
    snprintf(registry[registry_count].origin, sizeof(registry[registry_count].origin), "%s",
             origin);
    registry[registry_count].logged = 0;
    registry_count++;
    rc = 0;
out:
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

const pdgw_fwd_desc_t *pdgw_registry_find(const char *name)
{
    const pdgw_fwd_desc_t *found = NULL;
    size_t i;
    if (name == NULL)
        return NULL;
    pthread_mutex_lock(&registry_lock);
    for (i = 0; i < registry_count; i++) {
        if (strcmp(registry[i].desc->name, name) == 0) {
            found = registry[i].desc;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

size_t pdgw_registry_list(const pdgw_fwd_desc_t **out, size_t max)
{
    size_t i, n;
    pthread_mutex_lock(&registry_lock);
    n = registry_count;
    for (i = 0; i < n && i < max; i++)
        out[i] = registry[i].desc;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

void pdgw_registry_names(char *out, size_t len)
{
    size_t i, off = 0;
    if (len == 0)
        return;
    out[0] = '\0';
    pthread_mutex_lock(&registry_lock);
    for (i = 0; i < registry_count && off < len; i++) {
        int n = snprintf(out + off, len - off, "%s%s", i ? ", " : "", registry[i].desc->name);
        if (n < 0)
            break;
        off += (size_t)n;
    }
    pthread_mutex_unlock(&registry_lock);
}

pdgw_status_t pdgw_registry_load_plugin(const char *path, char *err, size_t errlen)
{
    size_t before_reg, before_ref;
    void *handle;
    pdgw_status_t status = PDGW_OK;

    pthread_mutex_lock(&registry_lock);
    before_reg = registry_count;
    before_ref = refusal_count;
    loading_path = path;
    pthread_mutex_unlock(&registry_lock);

    /* Constructors run inside dlopen and take registry_lock themselves. */
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);

    pthread_mutex_lock(&registry_lock);
    loading_path = NULL;
    if (handle == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "plugin %s: cannot load: %s", path, e ? e : "unknown error");
        status = PDGW_ERR_IO;
    } else if (refusal_count > before_ref) {
        snprintf(err, errlen, "plugin %s", refusals[before_ref].message);
        status = refusals[before_ref].status == PDGW_ERR_ABI      ? PDGW_ERR_ABI
                 : refusals[before_ref].status == PDGW_ERR_EXISTS ? PDGW_ERR_EXISTS
                                                                  : PDGW_ERR_INVALID;
        /* Drop what this plugin registered before the refusal: it is unloaded. */
        registry_count = before_reg;
        refusals[before_ref].logged = 1; /* reported through err */
    } else if (registry_count == before_reg) {
        snprintf(err, errlen,
                 "plugin %s: registered no forwarder (PDGW_FORWARDER_REGISTER missing?)", path);
        status = PDGW_ERR_INVALID;
    }
    pthread_mutex_unlock(&registry_lock);
    if (status != PDGW_OK && handle != NULL)
        dlclose(handle);
    /* A loaded plugin stays mapped for the life of the process. */
    return status;
}

size_t pdgw_registry_log(void)
{
    size_t i, n = 0;
    pthread_mutex_lock(&registry_lock);
    for (i = 0; i < registry_count; i++) {
        if (registry[i].logged)
            continue;
        registry[i].logged = 1;
        pdgw_log_info("registry", "forwarder '%s' registered (%s): %s", registry[i].desc->name,
                      registry[i].origin,
                      registry[i].desc->summary ? registry[i].desc->summary : "");
    }
    for (i = 0; i < refusal_count; i++) {
        if (refusals[i].logged)
            continue;
        refusals[i].logged = 1;
        pdgw_log_error("registry", "registration refused: %s", refusals[i].message);
        n++;
    }
    pthread_mutex_unlock(&registry_lock);
    return n;
}
