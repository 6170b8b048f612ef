/*
 * pdgw_cors.c - Cross-Origin Resource Sharing for browser clients (cors_allowed_origins).
 *
 * A preflight (OPTIONS with Origin and Access-Control-Request-Method, Fetch standard
 * "CORS-preflight request") from an allowed origin is answered 204 with the allowed methods,
 * headers and a max age, before routing and authentication (browsers send no credentials on
 * a preflight); one from any other origin gets 403 and is counted. Every response to an
 * allowed Origin, replies, streams and errors alike, carries Access-Control-Allow-Origin and
 * the headers a script may read. Without the option pdgw sends no CORS header at all.
 */
#include "pdgw_fleet.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CORS_METHODS "GET, POST, PUT, DELETE, OPTIONS"
/* Request headers an OpenAI client or SDK sends from a browser. */
#define CORS_DEFAULT_HEADERS                                                                       \
    "Authorization, Content-Type, X-Request-Id, X-Request-Timeout, traceparent, "                  \
    "OpenAI-Organization, OpenAI-Project"
/* Response headers a script may read besides the CORS-safelisted ones. */
#define CORS_EXPOSE  "X-Request-Id, X-PD-Failure-Phase, X-PD-Retryable, Retry-After"
#define CORS_MAX_AGE "600"

static bool origin_allowed(const pdgw_server_opts_t *o, const char *origin, bool *any_out)
{
    size_t i;
    *any_out = false;
    for (i = 0; i < o->n_cors_origins; i++) {
        const char *a = o->cors_origins[i];
        if (strcmp(a, "*") == 0) {
            *any_out = true;
            return true;
        }
        /* Origins are compared as serialised (scheme and host are lower case there). */
        if (strcasecmp(a, origin) == 0)
            return true;
    }
    return false;
}

void pdgw_cors_classify(pdgw_req_t *r)
{
    const pdgw_server_opts_t *o = &r->w->srv->opts;
    const char *origin = pdgw_req_header(r, "Origin");
    bool any;
    r->cors = PDGW_CORS_NONE;
    if (origin == NULL || origin[0] == '\0' || o->n_cors_origins == 0)
        return;
    r->cors = origin_allowed(o, origin, &any) ? PDGW_CORS_ALLOWED : PDGW_CORS_REFUSED;
}

/* A header value we may echo: printable, no line breaks, bounded. */
static bool echo_safe(const char *v)
{
    size_t n = 0;
    for (; v[n]; n++)
        if ((unsigned char)v[n] < 0x20 || (unsigned char)v[n] == 0x7f)
            return false;
    return n > 0 && n < 1024;
}

bool pdgw_cors_preflight(pdgw_req_t *r)
{
    const char *acrm;
    if (strcmp(r->method, "OPTIONS") != 0)
        return false;
    acrm = pdgw_req_header(r, "Access-Control-Request-Method");
    if (acrm == NULL || pdgw_req_header(r, "Origin") == NULL)
        return false; /* a plain OPTIONS: routed as any other method */
    if (r->cors != PDGW_CORS_ALLOWED) {
        pdgw_gateway_metrics_rejected(r->w->srv->opts.metrics, "cors_origin");
        pdgw_api_error_t e;
        size_t len = 0;
        char *body;
        pdgw_api_error_set(&e, PDGW_API_ERR_BAD_REQUEST, NULL,
                           "origin not allowed by cors_allowed_origins");
        pdgw_api_error_set_code(&e, "cors_origin_not_allowed");
        pdgw_req_error_set(r, "CORS preflight from a refused origin");
        body = pdgw_api_error_body(&e, &len);
        pdgw_req_reply(r, 403, body, body ? len : 0, "application/json");
        return true;
    }
    /* The CORS headers themselves are added when the reply is queued. */
    pdgw_req_reply(r, 204, NULL, 0, "text/plain");
    return true;
}

void pdgw_cors_add_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *out)
{
    (void)kind; /* on every answer */
    const pdgw_server_opts_t *o = &r->w->srv->opts;
    const char *origin;
    bool any = false;

    if (r->cors != PDGW_CORS_ALLOWED)
        return;
    origin = pdgw_req_header(r, "Origin");
    if (origin == NULL || !origin_allowed(o, origin, &any) || !echo_safe(origin))
        return;
    pdgw_hdr_add(out, "Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any)
        pdgw_hdr_add(out, "Vary", "Origin");
    if (r->reply_status == 204 && strcmp(r->method, "OPTIONS") == 0) {
        const char *acrh = pdgw_req_header(r, "Access-Control-Request-Headers");
        pdgw_hdr_add(out, "Access-Control-Allow-Methods", CORS_METHODS);
        pdgw_hdr_add(out, "Access-Control-Allow-Headers",
                     acrh && echo_safe(acrh) ? acrh : CORS_DEFAULT_HEADERS);
        pdgw_hdr_add(out, "Access-Control-Max-Age", CORS_MAX_AGE);
        return;
    }
    pdgw_hdr_add(out, "Access-Control-Expose-Headers", CORS_EXPOSE);
}

bool pdgw_cors_head(pdgw_req_t *r)
{
    return !pdgw_cors_preflight(r);
}
