/*
 * pdgw_admin.c - who may use /admin/..., and POST /admin/reload; client certificates.
 *
 * The rule (pdgw_auth_check_admin): with admin_api_key set, writes need that key and reads
 * take it or an API key; without it, writes are accepted only from a loopback peer (the
 * operator on the gateway's own host or pod), so that an admin API that can add an upstream
 * URL is never open to the network by default (admin_trust_loopback: false takes the loopback
 * exception away, for a gateway behind a local proxy or sidecar). Refusals are OpenAI-style error
 * bodies, 401 for a missing or wrong key and 403 for a write from elsewhere, counted in
 * pdgw_rejected_requests_total{reason="admin_auth"|"admin_forbidden"}.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_auth.h"
#include "pdgw_reload.h"

#include "pdgw_fleet.h"
#include "pdgw_tls.h"

/* Is the client of <r> on this host (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104)? */
static bool peer_is_loopback(const pdgw_req_t *r)
{
    const struct sockaddr *sa = &r->client_addr.sa; /* AF_UNSPEC when unknown */
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

/* Writes, and the reads that show every tenant's usage, need the admin credential. */
static bool is_write(const pdgw_req_t *r)
{
    return (strcmp(r->method, "GET") != 0 && strcmp(r->method, "HEAD") != 0) ||
           strcmp(r->path, "/admin/usage") == 0;
}

bool pdgw_admin_authorize(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    const char *h = pdgw_req_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    /* Behind a proxy or sidecar on this host every peer is loopback: the operator then
     * turns the trust off (admin_trust_loopback: false) and writes need the admin key. */
    bool trusted = !srv->opts.admin_untrusted_loopback && peer_is_loopback(r);
    pdgw_auth_result_t ar = pdgw_auth_check_admin(srv->opts.auth, h, is_write(r), trusted);
    pdgw_api_error_t e;
    size_t len = 0;
    char *body;

    if (pdgw_auth_allowed(ar))
        return true;
    if (ar != PDGW_AUTH_FORBIDDEN) {
        pdgw_auth_result_to_error(ar, &e);
        if (pdgw_auth_has_admin_key(srv->opts.auth))
            pdgw_api_error_set(&e, PDGW_API_ERR_UNAUTHORIZED, NULL, "%s",
                               is_write(r) ? "This admin operation needs the admin key: send "
                                             "\"Authorization: Bearer <admin_api_key>\"."
                                           : "Admin reads need the admin key or an API key.");
        pdgw_api_error_set_code(&e,
                                ar == PDGW_AUTH_MISSING ? "missing_api_key" : "invalid_api_key");
        pdgw_gateway_metrics_rejected(srv->opts.metrics, "admin_auth");
        pdgw_req_reply_error(r, &e);
        return false;
    }
    pdgw_api_error_set(&e, PDGW_API_ERR_UNAUTHORIZED, NULL,
                       "Admin writes are accepted only from the gateway's own host unless "
                       "admin_api_key is configured.");
    pdgw_api_error_set_type(&e, "permission_error");
    pdgw_api_error_set_code(&e, "admin_forbidden");
    pdgw_gateway_metrics_rejected(srv->opts.metrics, "admin_forbidden");
    pdgw_req_error_set(r, "%s", e.message);
    body = pdgw_api_error_body(&e, &len);
    pdgw_req_reply(r, 403, body, body ? len : 0, "application/json");
    return false;
}

bool pdgw_tls_authorize(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    const union MHD_ConnectionInfo *ci;
    pdgw_api_error_t e;
    char why[256] = "";
    size_t len = 0;
    char *body;

    if (!pdgw_tls_wants_client_cert(srv->opts.tls) || r->route == PDGW_ROUTE_HEALTH ||
        r->route == PDGW_ROUTE_READY)
        return true;
    ci = r->conn ? MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION) : NULL;
    if (pdgw_tls_verify_client(ci ? ci->tls_session : NULL, why, sizeof(why)) == PDGW_OK)
        return true;
    pdgw_api_error_set(&e, PDGW_API_ERR_UNAUTHORIZED, NULL,
                       "A client certificate signed by the gateway's tls_ca is required (%s).",
                       why);
    pdgw_api_error_set_type(&e, "permission_error");
    pdgw_api_error_set_code(&e, "client_certificate_required");
    pdgw_gateway_metrics_rejected(srv->opts.metrics, "client_cert");
    pdgw_req_error_set(r, "%s", e.message);
    body = pdgw_api_error_body(&e, &len);
    pdgw_req_reply(r, 403, body, body ? len : 0, "application/json");
    return false;
}

bool pdgw_admin_serve(pdgw_req_t *r)
{
    pdgw_server_t *srv = r->w->srv;
    json_t *res;
    char *text;
    bool ok;

    if (strcmp(r->path, "/admin/reload") != 0)
        return false;
    if (strcmp(r->method, "POST") != 0) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_METHOD_NOT_ALLOWED, "method_not_allowed",
                              "use POST for /admin/reload");
        return true;
    }
    if (srv->opts.reload == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_UNAVAILABLE, NULL, "reload is not available");
        return true;
    }
    /* Parsing and checking a config takes milliseconds; this worker's other connections
     * wait that long, as they would for any other short admin call. */
    res = pdgw_reload_run(srv->opts.reload, "POST /admin/reload");
    if (res == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return true;
    }
    ok = strcmp(json_string_value(json_object_get(res, "result")), "error") != 0; /* or partial */
    if (!ok) {
        pdgw_api_error_t e;
        pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, NULL, "config reload refused: %s",
                           json_string_value(json_object_get(res, "message")));
        pdgw_api_error_set_code(&e, "config_reload_failed");
        json_decref(res);
        pdgw_req_reply_error(r, &e);
        return true;
    }
    text = json_dumps(res, JSON_COMPACT);
    json_decref(res);
    if (text == NULL) {
        pdgw_req_reply_errorf(r, PDGW_API_ERR_INTERNAL, NULL, "out of memory");
        return true;
    }
    pdgw_req_reply(r, 200, text, strlen(text), "application/json");
    return true;
}

bool pdgw_admin_access(pdgw_req_t *r)
{
    return r->route != PDGW_ROUTE_ADMIN || pdgw_admin_authorize(r);
}

static bool admin_local(pdgw_req_t *r)
{
    if (!pdgw_admin_serve(r) && !pdgw_admin_usage_serve(r))
        pdgw_admin_instances_serve(r);
    return true;
}

const pdgw_route_ops_t pdgw_admin_route = {.local = admin_local};
