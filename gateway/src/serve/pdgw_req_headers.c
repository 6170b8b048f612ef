/*
 * pdgw_req_headers.c - the client's request head as the request path reads it: headers by
 * name, all headers, the query's arguments. The request arrived through libmicrohttpd or
 * through the native front end (pdgw_front.c); nothing above this file needs to know which.
 */
#include "pdgw_server_int.h"
#include "pdgw_front.h"

#include <string.h>

#include "pdgw_alloc.h"

typedef struct {
    pdgw_pair_fn fn;
    void *arg;
} mhd_walk_t;

static enum MHD_Result mhd_pair(void *cls, enum MHD_ValueKind kind, const char *name,
                                const char *value)
{
    mhd_walk_t *walk = cls;
    (void)kind;
    return walk->fn(walk->arg, name, value) ? MHD_YES : MHD_NO;
}

const char *pdgw_req_header_n(const pdgw_req_t *r, const char *name, size_t n)
{
    if (r->fc != NULL)
        return pdgw_front_head_get(pdgw_front_conn_head(r->fc), name, n);
    if (r->conn != NULL)
        return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
    return NULL;
}

void pdgw_req_headers_each(const pdgw_req_t *r, pdgw_pair_fn fn, void *arg)
{
    mhd_walk_t walk = {fn, arg};
    if (r->fc != NULL) {
        const pdgw_front_head_t *h = pdgw_front_conn_head(r->fc);
        unsigned i;
        for (i = 0; i < h->n_headers; i++)
            if (!fn(arg, h->headers[i].name, h->headers[i].value))
                return;
    } else if (r->conn != NULL) {
        MHD_get_connection_values(r->conn, MHD_HEADER_KIND, mhd_pair, &walk);
    }
}

/* libmicrohttpd splits the query and turns '+' into spaces but leaves the escapes
 * (mhd_keep_escapes, pdgw_server.c): each argument is decoded here. */
static enum MHD_Result mhd_query_pair(void *cls, enum MHD_ValueKind kind, const char *name,
                                      const char *value)
{
    mhd_walk_t *walk = cls;
    size_t nn = strlen(name), vn = value ? strlen(value) : 0;
    char *scratch = pdgw_malloc(nn + vn + 2);
    bool go;
    (void)kind;
    if (scratch == NULL)
        return MHD_NO;
    pdgw_front_query_decode(name, nn, scratch);
    if (value != NULL)
        pdgw_front_query_decode(value, vn, scratch + nn + 1);
    go = walk->fn(walk->arg, scratch, value ? scratch + nn + 1 : NULL);
    pdgw_free(scratch);
    return go ? MHD_YES : MHD_NO;
}

void pdgw_req_query_each(const pdgw_req_t *r, pdgw_pair_fn fn, void *arg)
{
    mhd_walk_t walk = {fn, arg};
    if (r->fc != NULL) {
        const char *q = pdgw_front_conn_head(r->fc)->query;
        char *scratch;
        if (q == NULL)
            return;
        scratch = pdgw_malloc(strlen(q) + 2); /* a decoded argument is never longer */
        if (scratch == NULL)
            return;
        pdgw_front_query_each(q, scratch, fn, arg);
        pdgw_free(scratch);
    } else if (r->conn != NULL) {
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, mhd_query_pair, &walk);
    }
}
