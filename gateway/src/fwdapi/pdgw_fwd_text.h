/*
 * pdgw_fwd_text.h - the gateway's side of forwarder.h's pdgw_fwd_text_t: the buffer a
 * forwarder's rewrite_decode_text writes into.
 */
#ifndef PDGW_FWD_TEXT_H
#define PDGW_FWD_TEXT_H

#include <pdgw/forwarder.h>

#include "pdgw_util.h"

struct pdgw_fwd_text {
    pdgw_buf_t buf;
};

#endif /* PDGW_FWD_TEXT_H */
