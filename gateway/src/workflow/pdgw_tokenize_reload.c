/*
 * pdgw_tokenize_reload.c - `tokenizers` on a config reload (SIGHUP, POST /admin/reload).
 *
 * The new set is loaded while the running one serves (prepare); one tokenizer of it that does
 * not load refuses the reload, naming the model and the path, as `pdgw --check-config` does
 * (at start-up such a model only falls back to its engine: a reload must not quietly take a
 * working tokenizer away). Commit installs it for the requests that tokenize from then on; a
 * request tokenizing at that moment finishes with the old set, freed by the last one. The
 * tokenize cache's keys carry the set's generation, so ids of the old tokenizers are never
 * read again (they age out of the cache).
 */
#include <stdio.h>

#include "pdgw_log.h"
#include "pdgw_reload.h"
#include "pdgw_route.h"
#include "pdgw_route_int.h"
#include "pdgw_server_int.h"

static const char *const tok_keys[] = {"tokenizers", NULL};

static pdgw_status_t tok_prepare(void *ctx, pdgw_reload_txn_t *txn, void **state, char *err,
                                 size_t errlen)
{
    pdgw_server_t *srv = ctx;
    pdgw_tok_set_t *set = NULL;
    pdgw_status_t st;

    *state = NULL;
    if (!pdgw_reload_txn_changed(txn, "tokenizers"))
        return PDGW_OK;
    if (srv->routing == NULL) {
        pdgw_reload_txn_keep(txn, "tokenizers", "the server has not started");
        return PDGW_OK;
    }
    st = pdgw_tok_set_load(&pdgw_reload_txn_next(txn)->tokenizers, true, err, errlen, &set);
    if (st == PDGW_OK)
        *state = set;
    return st;
}

static void tok_commit(void *ctx, pdgw_reload_txn_t *txn, void *state)
{
    pdgw_server_t *srv = ctx;
    (void)txn;
    if (state == NULL)
        return;
    pdgw_tok_set_install(srv->routing, state);
    pdgw_log_info("reload", "tokenizers: new requests use %zu tokenizer(s) in the gateway",
                  pdgw_tok_set_size(state));
}

static void tok_abort(void *ctx, void *state)
{
    (void)ctx;
    pdgw_tok_set_put(state);
}

pdgw_status_t pdgw_tokenize_reload_register(pdgw_server_t *srv, pdgw_reload_t *rl)
{
    pdgw_reload_hook_t hook = {.name = "tokenizers",
                               .keys = tok_keys,
                               .prepare = tok_prepare,
                               .commit = tok_commit,
                               .abort = tok_abort,
                               .ctx = srv};
    return pdgw_reload_register(rl, &hook);
}
