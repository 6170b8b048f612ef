/*
 * pdgw_fwd_setup.c - the configured forwarder's start-up (descriptor, mode, configure,
 * plan), shared by the server and `pdgw --check-config` so both refuse the same configs.
 */
#include "pdgw_fwd_setup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_registry.h"

pdgw_status_t pdgw_fwd_setup(const char *protocol, pdgw_mode_t mode, const json_t *options,
                             unsigned n_workers, bool check_only, pdgw_fwd_kv_svcs_t *kv_svcs,
                             pdgw_fwd_setup_t *out, char *err, size_t errlen)
{
    pdgw_fwd_setup_t s;
    pdgw_fwd_env_t env;
    json_t *empty = NULL;
    pdgw_status_t status = PDGW_OK;
    char ferr[256] = "";

    memset(&s, 0, sizeof(s));
    s.desc = pdgw_registry_find(protocol);
    if (s.desc == NULL) {
        char names[512];
        pdgw_registry_names(names, sizeof(names));
        snprintf(err, errlen, "protocol: unknown forwarder '%s' (registered: %s)",
                 protocol ? protocol : "", names);
        return PDGW_ERR_NOT_FOUND;
    }
    if (!(s.desc->modes & (unsigned)mode)) {
        snprintf(err, errlen, "scheduling: forwarder '%s' does not support %s mode", s.desc->name,
                 mode == PDGW_MODE_BATCH ? "batch" : "staged");
        return PDGW_ERR_UNSUPPORTED;
    }
    memset(&env, 0, sizeof(env));
    env.abi_version = PDGW_FWD_ABI_VERSION;
    env.protocol = s.desc->name;
    env.mode = mode;
    env.n_workers = n_workers;
    env.check_only = check_only;
    env.kv_svcs = kv_svcs;
    if (options == NULL) {
        empty = json_object();
        if (empty == NULL) {
            snprintf(err, errlen, "out of memory");
            return PDGW_ERR_NOMEM;
        }
        options = empty;
    }
    if (s.desc->ops->configure) {
        pdgw_fwd_status_t fs = s.desc->ops->configure(options, &env, &s.ctx, ferr, sizeof(ferr));
        if (fs != PDGW_FWD_OK) {
            snprintf(err, errlen, "protocol_options: %s: %s", s.desc->name,
                     ferr[0] ? ferr : pdgw_fwd_strerror(fs));
            status = PDGW_ERR_INVALID;
            goto out;
        }
    } else if (json_object_size(options) > 0) {
        snprintf(err, errlen, "protocol_options: forwarder '%s' takes no options", s.desc->name);
        status = PDGW_ERR_INVALID;
        goto out;
    }
    s.plan.single_role = PDGW_FWD_ROLE_BOTH;
    if (s.desc->ops->plan) {
        if (s.desc->ops->plan(s.ctx, mode, &s.plan, ferr, sizeof(ferr)) != PDGW_FWD_OK) {
            snprintf(err, errlen, "protocol: %s: %s", s.desc->name,
                     ferr[0] ? ferr : "unsupported mode");
            pdgw_fwd_teardown(&s);
            status = PDGW_ERR_UNSUPPORTED;
            goto out;
        }
    } else {
        unsigned d = s.desc->dispatch;
        s.plan.dispatch = (d & PDGW_DISPATCH_SINGLE)   ? PDGW_DISPATCH_SINGLE
                          : (d & PDGW_DISPATCH_SERIAL) ? PDGW_DISPATCH_SERIAL
                                                       : PDGW_DISPATCH_PARALLEL;
    }
    *out = s;
out:
    json_decref(empty);
    return status;
}

pdgw_status_t pdgw_fwd_check_client_pd_fields(const pdgw_fwd_setup_t *s, pdgw_pd_fields_mode_t mode,
                                              char *err, size_t errlen)
{
    const pdgw_fwd_plan_t *p = &s->plan;
    if (mode != PDGW_PD_FIELDS_PASS ||
        (p->dispatch == PDGW_DISPATCH_SINGLE && p->single_role == PDGW_FWD_ROLE_BOTH &&
         !p->single_needs_prefill))
        return PDGW_OK;
    /* A PD forwarder puts its own PD fields into the legs: passing the client's through
     * would let clients name KV peers. Only a plain proxy may opt in. */
    snprintf(err, errlen,
             "client_pd_fields: 'pass' is only allowed for a plain-proxy protocol (such as "
             "neutral), not for '%s'; use reject or strip",
             s->desc->name);
    return PDGW_ERR_INVALID;
}

void pdgw_fwd_teardown(pdgw_fwd_setup_t *s)
{
    if (s->desc != NULL && s->desc->ops->destroy && s->ctx != NULL)
        s->desc->ops->destroy(s->ctx);
    s->ctx = NULL;
}

const pdgw_fwd_attr_t pdgw_fwd_attrs_none[] = {PDGW_FWD_ATTR_END};

/* The names <table> declares, "a, b" into out (for an error message). */
static void attr_names(const pdgw_fwd_attr_t *table, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (const pdgw_fwd_attr_t *a = table; a->name != NULL && used < cap; a++) {
        int n = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", a->name);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* One `key=value` line of an instance's attrs against <table>. */
static pdgw_status_t attr_check(const pdgw_fwd_desc_t *d, const char *key, const char *value,
                                char *err, size_t errlen)
{
    const pdgw_fwd_attr_t *a;
    char known[200];
    for (a = d->instance_attrs; a->name != NULL; a++)
        if (strcmp(a->name, key) == 0)
            break;
    if (a->name == NULL) {
        attr_names(d->instance_attrs, known, sizeof(known));
        if (known[0] != '\0')
            snprintf(err, errlen, "attrs.%s: protocol %s reads no such attribute (it reads: %s)",
                     key, d->name, known);
        else
            snprintf(err, errlen, "attrs.%s: protocol %s reads no instance attributes", key,
                     d->name);
        return PDGW_ERR_INVALID;
    }
    if (value[0] == '\0') {
        snprintf(err, errlen, "attrs.%s: empty", key);
        return PDGW_ERR_INVALID;
    }
    if (a->type == PDGW_FWD_ATTR_INT) {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (*end != '\0' || errno != 0 || v < a->min || v > a->max) {
            snprintf(err, errlen, "attrs.%s: '%s' is not an integer in [%lld, %lld]", key, value,
                     (long long)a->min, (long long)a->max);
            return PDGW_ERR_INVALID;
        }
    }
    return PDGW_OK;
}

/* The instance's attrs ("key=value" lines) against the protocol's table, when it has one. */
static pdgw_status_t attrs_check(const pdgw_fwd_desc_t *d, const char *attrs, char *err,
                                 size_t errlen)
{
    const char *line = attrs;
    if (d->instance_attrs == NULL || attrs == NULL)
        return PDGW_OK;
    while (*line != '\0') {
        const char *nl = strchr(line, '\n'), *eq = strchr(line, '=');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char key[128], value[256];
        if (eq != NULL && (size_t)(eq - line) < len) {
            snprintf(key, sizeof(key), "%.*s", (int)(eq - line), line);
            snprintf(value, sizeof(value), "%.*s", (int)(len - (size_t)(eq - line) - 1), eq + 1);
            pdgw_status_t st = attr_check(d, key, value, err, errlen);
            if (st != PDGW_OK)
                return st;
        }
        line += len + (nl != NULL);
    }
    return PDGW_OK;
}

pdgw_status_t pdgw_fwd_check_instance(const pdgw_fwd_setup_t *s, const pdgw_instance_t *inst,
                                      char *err, size_t errlen)
{
    char ferr[256] = "";
    if (s->desc == NULL)
        return PDGW_OK;
    if (attrs_check(s->desc, inst->attrs, err, errlen) != PDGW_OK)
        return PDGW_ERR_INVALID;
    if (s->desc->ops->check_instance == NULL)
        return PDGW_OK;
    if (s->desc->ops->check_instance(s->ctx, inst, ferr, sizeof(ferr)) == PDGW_FWD_OK)
        return PDGW_OK;
    snprintf(err, errlen, "%s", ferr[0] ? ferr : "not usable with this protocol");
    return PDGW_ERR_INVALID;
}
