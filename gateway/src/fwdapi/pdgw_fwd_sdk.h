/*
 * pdgw_fwd_sdk.h - the gateway's side of the forwarder SDK (pdgw_fwd_sdk.c): the attempt
 * arena's life cycle and the defaults a descriptor's ABI 4 fields stand for.
 */
#ifndef PDGW_FWD_SDK_H
#define PDGW_FWD_SDK_H

#include <stddef.h>
#include <stdint.h>

#include <pdgw/forwarder.h>

#include "pdgw_errors.h"

/* Start an attempt: its arena in req->arena and, for a descriptor with state_size and no
 * attempt_init, a zeroed *state from it. PDGW_ERR_NOMEM leaves nothing to end. */
pdgw_status_t pdgw_fwd_attempt_begin(const pdgw_fwd_desc_t *desc, pdgw_fwd_request_t *req,
                                     void **state);
/* End it after attempt_cleanup: kept JSON released, arena memory freed. Idempotent. */
void pdgw_fwd_attempt_end(pdgw_fwd_request_t *req);

/* Fill the ops a descriptor's option table stands for (configure, destroy) into <ops>, the
 * registry's copy of its table. */
void pdgw_fwd_sdk_complete_ops(const pdgw_fwd_desc_t *desc, pdgw_fwd_ops_t *ops);

/* <n> token ids as the SDK's ids text (pdgw_fwd_ids_text_from's kind); NULL on no memory. */
json_t *pdgw_fwd_ids_text_u32(const uint32_t *ids, size_t n);

#endif /* PDGW_FWD_SDK_H */
