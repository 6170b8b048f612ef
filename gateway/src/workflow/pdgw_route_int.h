/*
 * pdgw_route_int.h - state shared by pdgw_tokenize.c and pdgw_pd_decide.c.
 */
#ifndef PDGW_ROUTE_INT_H
#define PDGW_ROUTE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "pdgw_route.h"

/* One cached tokenization. */
typedef struct pdgw_tok_slot {
    uint64_t key[2];  /* 128-bit hash of the tokenize body */
    uint32_t *tokens; /* NULL = free way */
    size_t n;
    uint64_t used; /* LRU tick */
} pdgw_tok_slot_t;

struct pdgw_routing {
    pdgw_route_opts_t o;
    bool want_tokens;
    pthread_mutex_t mu; /* the cache, shared by the workers */
    pdgw_tok_slot_t *slots;
    size_t n_sets;
    uint64_t tick;
    atomic_uint_fast64_t turn;            /* which usable instance tokenizes next */
    pdgw_metric_family_t *pd_skipped;     /* {reason} */
    pdgw_metric_family_t *tokenize_total; /* {result} */
    pdgw_metric_family_t *kv_release;     /* {reason,result} */
};

/* The request's route state, allocated on first use; NULL on OOM. */
pdgw_req_route_t *pdgw_route_req(pdgw_wf_t *wf);

#endif /* PDGW_ROUTE_INT_H */
