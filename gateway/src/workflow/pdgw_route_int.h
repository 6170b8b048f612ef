/*
 * pdgw_route_int.h - state shared by pdgw_tokenize.c and pdgw_pd_decide.c.
 */
#ifndef PDGW_ROUTE_INT_H
#define PDGW_ROUTE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "pdgw_config.h" /* pdgw_kv_list_t */
#include "pdgw_route.h"

typedef struct pdgw_local_tok pdgw_local_tok_t;

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
    /* Tokenizers loaded in the gateway (pdgw_tokenize_local.c), by model. */
    pdgw_local_tok_t *local;
    size_t n_local;
    pdgw_metric_family_t *tokenize_seconds; /* {how}: text, chat */
};

/* pdgw_tokenize_local.c: load `tokenizers` (warned and skipped when refused), free, the one of
 * <model> (NULL = the engine tokenizes), and a /tokenize body's ids (false = the engine must:
 * a field only it applies, a template that failed). */
pdgw_status_t pdgw_tokenize_local_load(pdgw_routing_t *rt, const pdgw_kv_list_t *list);
void pdgw_tokenize_local_free(pdgw_routing_t *rt);
const pdgw_local_tok_t *pdgw_tokenize_local_find(const pdgw_routing_t *rt, const char *model);
bool pdgw_tokenize_local_ids(const pdgw_routing_t *rt, const pdgw_local_tok_t *lt,
                             const json_t *body, bool chat, uint32_t **ids, size_t *n);

/* The request's route state, allocated on first use; NULL on OOM. */
pdgw_req_route_t *pdgw_route_req(pdgw_wf_t *wf);

#endif /* PDGW_ROUTE_INT_H */
