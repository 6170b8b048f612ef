/*
 * pdgw_wf.c - the workflow object's life (pdgw_wf.h): made at dispatch from its worker's
 * free list, given back when its request is finalized.
 */
#include "pdgw_route.h"
#include "pdgw_server_int.h"
#include "pdgw_wf.h"

#include <stddef.h>
#include <string.h>

#include "pdgw_alloc.h"

/* Workflow objects kept for reuse per worker (as many as request objects). */
#define WF_POOL_MAX 1024

pdgw_wf_t *pdgw_wf_create(pdgw_req_t *r)
{
    /* The legs are most of the object and pdgw_leg_init sets each whole: everything else is
     * zeroed here, the legs once, by their init. */
    pdgw_wf_t *wf;
    if (r->w->wf_pool.obj_size == 0) /* the worker's first: the pool takes our size */
        pdgw_freelist_init(&r->w->wf_pool, sizeof(pdgw_wf_t), WF_POOL_MAX);
    wf = pdgw_freelist_get_dirty(&r->w->wf_pool);
    const size_t legs_at = offsetof(pdgw_wf_t, legs), legs_end = legs_at + sizeof(wf->legs);
    if (wf == NULL)
        return NULL;
    memset(wf, 0, legs_at);
    memset((char *)wf + legs_end, 0, sizeof(*wf) - legs_end);
    wf->req = r;
    wf->w = r->w;
    wf->fwd_ctx = r->fwd_ctx;
    wf->origin = (pdgw_leg_origin_t){
        .w = r->w, .id = wf->leg_id, .traceparent = r->traceparent, .headers = &r->fwd_headers};
    pdgw_leg_init(&wf->legs[PDGW_LEG_PREFILL], &wf->origin, wf, PDGW_LEG_PREFILL,
                  &pdgw_wf_leg_owner);
    pdgw_leg_init(&wf->legs[PDGW_LEG_DECODE], &wf->origin, wf, PDGW_LEG_DECODE, &pdgw_wf_leg_owner);
    r->wf = wf;
    return wf;
}

void pdgw_wf_release(pdgw_wf_t *wf)
{
    int k;
    for (k = 0; k < 2; k++)
        pdgw_leg_release(&wf->legs[k]);
    pdgw_route_req_release(wf); /* route hook */
    pdgw_free(wf->pt_model);    /* fleet: pass-through's model and headers */
    pdgw_buf_free(&wf->pt_headers);
    pdgw_free(wf->failed_ids);
    if (wf->req != NULL && wf->req->wf == wf)
        wf->req->wf = NULL;
    pdgw_freelist_put(&wf->w->wf_pool, wf);
}
