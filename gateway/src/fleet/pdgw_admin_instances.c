/*
 * pdgw_admin_instances.c - the admin API under /admin/instances: list, add, remove, drain and
 * undrain instances of the scheduler pool.
 */

#include "pdgw_fleet.h"
#include "pdgw_fwd_setup.h"

#include <stdio.h>
#include <string.h>

/* An instance added through the API gets the checks a configured one gets at start-up: what
 * the protocol needs of it (its ports, its declared attrs). */
static bool protocol_accepts(sched_instance_t *inst, void *arg, char *err, size_t err_len)
{
    const pdgw_server_t *srv = arg;
    pdgw_fwd_setup_t fs = {.desc = srv->desc, .ctx = srv->fwd_ctx, .plan = srv->plan};
    pdgw_instance_t view;

    if (srv->desc == NULL)
        return true;
    pdgw_instance_view_from_sched(&view, inst);
    return pdgw_fwd_check_instance(&fs, &view, err, err_len) == PDGW_OK;
}

void pdgw_admin_instances_serve(pdgw_req_t *r)
{
    sched_pool_t *pool = r->w->srv->opts.pool;
    const char *sub = r->admin_path ? r->admin_path : ""; /* after "/admin/instances" */
    char err[256] = "";

    if (sub[0] == '\0' || strcmp(sub, "/") == 0) {
        if (strcmp(r->method, "GET") == 0) {
            pdgw_req_reply_json(r, 200, sched_admin_list(pool));
            return;
        }
        if (strcmp(r->method, "POST") == 0) {
            json_error_t jerr;
            json_t *body = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &jerr);
            json_t *created = NULL;
            sched_status_t st;
            if (body == NULL) {
                pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "invalid_json",
                                      "body is not valid JSON: %s", jerr.text);
                return;
            }
            st = sched_admin_add_checked(pool, body, protocol_accepts, r->w->srv, &created, err,
                                         sizeof(err));
            json_decref(body);
            if (st == SCHED_OK) {
                pdgw_req_reply_json(r, 201, created);
                return;
            }
            json_decref(created);
            if (st == SCHED_ERR_EXISTS) {
                pdgw_api_error_t e;
                pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, NULL, "%s",
                                   err[0] ? err : "instance id already exists");
                pdgw_api_error_set_code(&e, "instance_exists");
                {
                    size_t len;
                    char *b = pdgw_api_error_body(&e, &len);
                    pdgw_req_reply(r, 409, b, b ? len : 0, "application/json");
                }
                return;
            }
            pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, "invalid_instance", "%s",
                                  err[0] ? err : sched_strerror(st));
            return;
        }
        pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, NULL,
                              "method %s not allowed on /admin/instances", r->method);
        return;
    }
    if (sub[0] == '/') {
        char id[SCHED_ID_MAX];
        const char *action = NULL;
        const char *slash = strchr(sub + 1, '/');
        size_t idlen = slash ? (size_t)(slash - sub - 1) : strlen(sub + 1);
        sched_status_t st;
        if (idlen == 0 || idlen >= sizeof(id)) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "no such instance");
            return;
        }
        memcpy(id, sub + 1, idlen);
        id[idlen] = '\0';
        if (slash)
            action = slash + 1;
        if (action == NULL && strcmp(r->method, "GET") == 0) {
            json_t *j = sched_admin_get(pool, id);
            if (j == NULL)
                pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "no instance '%s'", id);
            else
                pdgw_req_reply_json(r, 200, j);
            return;
        }
        if (action == NULL && strcmp(r->method, "DELETE") == 0) {
            st = sched_pool_remove(pool, id);
        } else if (action && (strcmp(action, "drain") == 0 || strcmp(action, "undrain") == 0)) {
            if (strcmp(r->method, "POST") != 0) {
                pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, NULL, "use POST for %s",
                                      action);
                return;
            }
            st = action[0] == 'd' ? sched_pool_drain(pool, id) : sched_pool_undrain(pool, id);
        } else if (action == NULL) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, NULL,
                                  "method %s not allowed here", r->method);
            return;
        } else {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "unknown admin path");
            return;
        }
        if (st == SCHED_ERR_NOT_FOUND) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "no instance '%s'", id);
            return;
        }
        if (st != SCHED_OK) {
            pdgw_req_reply_errorf(r, PDGW_API_ERR_BAD_REQUEST, NULL, "%s", sched_strerror(st));
            return;
        }
        pdgw_req_reply_json(r, 200, json_pack("{s:s,s:s}", "id", id, "status", "ok"));
        return;
    }
    pdgw_req_reply_errorf(r, PDGW_API_ERR_NOT_FOUND, NULL, "unknown admin path");
}
