/*
 * pdgw_admin_usage.c - GET /admin/usage: the tenants' usage by PD phase, as JSON.
 *
 *   ?window=DURATION   the last DURATION of this replica at minute resolution (at most 1h);
 *                      absent = totals since start, fleet-wide when a quota store is shared
 *   ?tenant=NAME       one tenant ("other" = unknown keys)
 *   ?model=NAME        one model
 *
 * Every tenant's figures are shown, so the admin rule treats it like a write (pdgw_admin.c):
 * the admin key, or a loopback peer when none is configured.
 */
#include <stdio.h>
#include <string.h>

#include "pdgw_fleet.h"
#include "pdgw_server_int.h"
#include "pdquota/pdquota.h"

#define ARG_MAX 256

/* The arguments, copied (the walk's strings last only as long as the callback). */
typedef struct usage_args {
    char window[ARG_MAX], tenant[ARG_MAX], model[ARG_MAX], unknown[ARG_MAX];
    bool has_window, has_tenant, has_model;
} usage_args_t;

static bool usage_arg(void *arg, const char *name, const char *value)
{
    usage_args_t *a = arg;
    const char *v = value != NULL ? value : "";
    if (strcmp(name, "window") == 0) {
        a->has_window = true;
        snprintf(a->window, sizeof(a->window), "%s", v);
    } else if (strcmp(name, "tenant") == 0) {
        a->has_tenant = true;
        snprintf(a->tenant, sizeof(a->tenant), "%s", v);
    } else if (strcmp(name, "model") == 0) {
        a->has_model = true;
        snprintf(a->model, sizeof(a->model), "%s", v);
    } else {
        snprintf(a->unknown, sizeof(a->unknown), "%s", name);
        return false;
    }
    return true;
}

bool pdgw_admin_usage_serve(pdgw_req_t *r)
{
    pdq_t *q = r->w->srv->opts.quota;
    usage_args_t a = {0};
    uint64_t window_ms = 0;
    json_t *res;

    if (strcmp(r->path, "/admin/usage") != 0)
        return false;
    if (strcmp(r->method, "GET") != 0 && strcmp(r->method, "HEAD") != 0) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, "method_not_allowed",
                              "use GET for /admin/usage");
        return true;
    }
    if (q == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL,
                              "usage is accounted per tenant: no `tenants:` are configured");
        return true;
    }
    pdgw_req_query_each(r, usage_arg, &a);
    if (a.unknown[0] != '\0') {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, NULL,
                              "unknown argument '%s' (window, tenant, model)", a.unknown);
        return true;
    }
    if (a.has_window && (pdgw_duration_parse(a.window, &window_ms) != PDGW_OK || window_ms < 1000 ||
                         window_ms > 3600u * 1000u)) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, NULL,
                              "window must be a duration from 1s to 1h (e.g. 5m), got '%s'",
                              a.window);
        return true;
    }
    if (a.has_tenant && pdq_tenant_by_name(q, a.tenant) == (size_t)-1) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "no tenant named '%s'", a.tenant);
        return true;
    }
    res = pdq_usage_json(q, (uint32_t)(window_ms / 1000u), a.has_tenant ? a.tenant : NULL,
                         a.has_model ? a.model : NULL);
    pdgw_req_reply_json(r, 200, res); /* 500 when it cannot be rendered */
    return true;
}
