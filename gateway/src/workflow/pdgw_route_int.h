/*
 * pdgw_route_int.h - state shared by pdgw_tokenize.c and pdgw_pd_decide.c.
 */
#ifndef PDGW_ROUTE_INT_H
#define PDGW_ROUTE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "pdgw_config.h" /* pdgw_kv_list_t */
#include "pdgw_route.h"

typedef struct pdgw_local_tok pdgw_local_tok_t;
typedef struct pdgw_tok_set pdgw_tok_set_t;

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
    /* Tokenizers loaded in the gateway (pdgw_tokenize_local.c), by model: the set of the
     * running config, replaced by a reload under toks_mu; any_local says whether it holds one
     * (read without the lock). */
    pthread_mutex_t toks_mu;
    pdgw_tok_set_t *toks;
    uint64_t toks_gen; /* sets installed so far (under toks_mu) */
    atomic_bool any_local;
    pdgw_metric_family_t *tokenize_seconds; /* {how}: text, chat */
};

/* pdgw_tokenize_local.c.
 * pdgw_tok_set_load: the tokenizers of `tokenizers` (<list>; "engine" entries skipped).
 *   <strict> (a reload): one that does not load is an error naming model and
 *   path; else (start-up) it is warned about and that model asks its engine.
 * pdgw_tok_set_get / _put: a reference to the running set (NULL when it holds none) for the
 *   length of one tokenization.
 * pdgw_tok_set_install: <set> becomes the running one (taking its reference) with the next
 *   cache generation; the old one is freed when its last user puts it.
 * pdgw_tokenize_local_find: the tokenizer of <model> in <set> (NULL = the engine tokenizes).
 * pdgw_tokenize_local_ids: a /tokenize body's ids (false = the engine must: a field only it
 *   applies, a template that failed). */
pdgw_status_t pdgw_tok_set_load(const pdgw_kv_list_t *list, bool strict, char *err, size_t errlen,
                                pdgw_tok_set_t **out);
size_t pdgw_tok_set_size(const pdgw_tok_set_t *set);
uint64_t pdgw_tok_set_gen(const pdgw_tok_set_t *set);
pdgw_tok_set_t *pdgw_tok_set_get(pdgw_routing_t *rt);
void pdgw_tok_set_put(pdgw_tok_set_t *set);
void pdgw_tok_set_install(pdgw_routing_t *rt, pdgw_tok_set_t *set);
const pdgw_local_tok_t *pdgw_tokenize_local_find(const pdgw_tok_set_t *set, const char *model);
bool pdgw_tokenize_local_ids(const pdgw_routing_t *rt, const pdgw_local_tok_t *lt,
                             const json_t *body, bool chat, uint32_t **ids, size_t *n);

/* The request's route state, allocated on first use; NULL on OOM. */
pdgw_req_route_t *pdgw_route_req(pdgw_wf_t *wf);

#endif /* PDGW_ROUTE_INT_H */
