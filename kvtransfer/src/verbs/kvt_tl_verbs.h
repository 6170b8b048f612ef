/*
 * The RDMA verbs transport of libkvt ("verbs"), built when libibverbs is found
 * (KVT_WITH_VERBS). See kvt_transport.h for the ops contract and README.md
 * beside this file for how data flows.
 */
#ifndef KVT_TL_VERBS_H
#define KVT_TL_VERBS_H

#include "kvt_transport.h"

extern const kvt_transport_desc_t kvt_tl_verbs_desc;

/* Referenced by kvt_transport.c so a static link keeps the registration. */
void kvt_tl_verbs_link(void);

#endif
