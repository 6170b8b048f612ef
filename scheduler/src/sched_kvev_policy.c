/*
 * precise-prefix: route to the instance whose engine reports, through its
 * KV events, the longest run of the prompt's leading blocks as cached.
 *
 * Tokens: the policy hashes the prompt token ids the client sent (the
 * completions API's token-array prompt). Text prompts are not tokenized
 * here yet: without tokens the choice is the least loaded instance.
 *
 * Score (llm-d style weighted scorers, both terms in 0..1):
 *   prefix_weight × tier-weighted cached blocks / prompt blocks
 *   + load_weight × (1 − (load − least) / (most − least))
 * among the instances whose load is at most prefix_load_slack above the
 * least loaded one, so a hot prefix cannot pile every request on one
 * engine. Ties go to the lower load.
 */
#include <string.h>

#include "sched_alloc_int.h"
#include "sched_int.h"
#include "sched_kvev_int.h"

sched_status_t sched_kvev_pool_create(sched_pool_t *pool, const sched_config_t *cfg)
{
    sched_status_t st;

    /* slo reads the same index: a prompt's cached part is not computed again */
    if (pool->policy[0] != SCHED_POLICY_PRECISE_PREFIX &&
        pool->policy[1] != SCHED_POLICY_PRECISE_PREFIX && pool->policy[0] != SCHED_POLICY_SLO &&
        pool->policy[1] != SCHED_POLICY_SLO)
        return SCHED_OK;
    pool->kvev_prefix_w = cfg->kv_events_prefix_weight;
    pool->kvev_load_w = cfg->kv_events_load_weight;
    pool->kvev_other_w = cfg->kv_events_other_tier_weight;
    st = sched_kvev_index_create(cfg->kv_events_max_blocks ? cfg->kv_events_max_blocks : 1u << 20,
                                 &pool->kvev_index);
    if (st != SCHED_OK)
        return st;
    st = sched_kvev_sub_create(pool->kvev_index, cfg->kv_events_max_message_bytes, pool->log,
                               pool->log_arg, &pool->kvev_sub);
    if (st != SCHED_OK) {
        sched_kvev_index_destroy(pool->kvev_index);
        pool->kvev_index = NULL;
        return st;
    }
    sched_kvev_sub_set_silence(pool->kvev_sub, cfg->kv_events_silence_ms, pool->clock,
                               pool->clock_arg);
    return SCHED_OK;
}

sched_status_t sched_kvev_pool_start(sched_pool_t *pool)
{
    return pool->kvev_sub ? sched_kvev_sub_start(pool->kvev_sub) : SCHED_OK;
}

void sched_kvev_pool_destroy(sched_pool_t *pool)
{
    sched_kvev_sub_destroy(pool->kvev_sub);
    sched_kvev_index_destroy(pool->kvev_index);
    pool->kvev_sub = NULL;
    pool->kvev_index = NULL;
}

/* The pool tells what changed (sched_pool.c's rebuild), so a change costs what changed, not
 * a walk of both snapshots: a replaced instance (new descriptor) is a new object with a new
 * uid, the old one is unsubscribed and the new one subscribed afresh. */
void sched_kvev_pool_sync(sched_pool_t *pool, sched_instance_t *const *gone, size_t n_gone,
                          sched_instance_t *const *added, size_t n_added)
{
    if (!pool->kvev_sub)
        return;
    for (size_t i = 0; i < n_gone; i++)
        sched_kvev_sub_remove(pool->kvev_sub, gone[i]->uid);
    for (size_t i = 0; i < n_added; i++) {
        sched_instance_t *inst = added[i];
        char ep[512], rp[512];
        bool replay;
        int rank;
        if (!inst->desc.kv_events_endpoint || !inst->desc.kv_events_endpoint[0])
            continue;
        /* An instance that is one rank of a data-parallel engine (dp_size > 1) listens to
         * that rank's publisher: the configured endpoints offset by its rank, as the
         * engine offsets them. */
        rank = inst->desc.dp_size > 1 ? inst->desc.dp_rank : 0;
        replay = inst->desc.kv_events_replay_endpoint && inst->desc.kv_events_replay_endpoint[0];
        if (!sched_kvev_rank_endpoint(inst->desc.kv_events_endpoint, rank, ep, sizeof(ep)) ||
            (replay && !sched_kvev_rank_endpoint(inst->desc.kv_events_replay_endpoint, rank, rp,
                                                 sizeof(rp))) ||
            sched_kvev_sub_add(pool->kvev_sub, inst->uid, ep, replay ? rp : NULL) != SCHED_OK)
            sched_instance_set_error(inst, sched_pool_now(pool),
                                     "kv events: cannot subscribe to %s",
                                     inst->desc.kv_events_endpoint);
    }
}

sched_status_t sched_kvev_request_keys(sched_pool_t *pool, const sched_request_t *req,
                                       uint64_t **keys_out, size_t *n_out)
{
    uint64_t tmp[SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST];
    uint32_t bs;
    size_t n;

    *keys_out = NULL;
    *n_out = 0;
    if (!pool->kvev_index || !req->tokens || req->n_tokens == 0)
        return SCHED_OK;
    /* One block size for the fleet (one model per pool): the one the
     * engines report. Until one has, there is nothing to match. */
    bs = sched_kvev_index_block_size(pool->kvev_index, 0);
    n = sched_kvev_keys(req->tokens, req->n_tokens, bs, req->lora_name, req->cache_salt, tmp,
                        SCHED_PREFIX_MAX_BLOCKS_PER_REQUEST);
    if (n == 0)
        return SCHED_OK;
    *keys_out = sched_malloc(n * sizeof(uint64_t));
    if (!*keys_out)
        return SCHED_ERR_NO_MEMORY;
    memcpy(*keys_out, tmp, n * sizeof(uint64_t));
    *n_out = n;
    return SCHED_OK;
}

#define MAX_CAND SCHED_KVEV_MAX_SLOTS

sched_instance_t *sched_kvev_pick(sched_instance_t *const *arr, size_t n, int ridx,
                                  const sched_pick_ctx_t *ctx)
{
    const sched_pool_t *pool = ctx->pool;
    sched_instance_t *cand[MAX_CAND], *best = NULL;
    uint64_t uids[MAX_CAND], load[MAX_CAND], least = UINT64_MAX, most = 0;
    size_t depth[MAX_CAND], nc = 0, nofit = 0, n_keys = ctx->n_kv_keys;
    double weighted[MAX_CAND], best_score = -1.0;
    size_t best_i = 0;

    (void)ridx;
    if (!pool->kvev_index || !ctx->kv_keys || n_keys == 0) {
        best = sched_policy_least(arr, n, ctx, NULL);
        /* Tokens but no keys: no engine has told its block size yet. Its events are then
         * what is missing, if it serves such requests and stays quiet. */
        if (best && ctx->req && ctx->req->tokens && ctx->req->n_tokens > 0 && pool->kvev_sub)
            sched_kvev_sub_note_routed(pool->kvev_sub, best->uid);
        return best;
    }
    for (size_t i = 0; i < n && nc < MAX_CAND; i++) {
        if (!sched_pick_allowed(arr[i], ctx))
            continue;
        if (ctx->kv_need && !sched_kv_fits(arr[i], ctx->kv_need)) {
            nofit++; /* a decode without KV headroom: only if every one is full */
            continue;
        }
        cand[nc] = arr[i];
        uids[nc] = arr[i]->uid;
        load[nc] = sched_instance_score(arr[i], ctx->now_ms);
        if (load[nc] < least)
            least = load[nc];
        if (load[nc] > most)
            most = load[nc];
        nc++;
    }
    if (nc == 0)
        return nofit ? sched_kv_least_bad(arr, n, ctx) : NULL;
    sched_kvev_index_match(pool->kvev_index, ctx->kv_keys, n_keys, uids, nc, pool->kvev_other_w,
                           depth, weighted);
    for (size_t i = 0; i < nc; i++) {
        double hit = weighted[i] / (double)n_keys;
        double rel = most > least ? (double)(load[i] - least) / (double)(most - least) : 0.0;
        double score = pool->kvev_prefix_w * hit + pool->kvev_load_w * (1.0 - rel);
        if (load[i] > least + pool->prefix_slack)
            continue; /* load bound */
        if (score > best_score || (score == best_score && load[i] < load[best_i])) {
            best = cand[i];
            best_i = i;
            best_score = score;
        }
    }
    if (nofit)
        sched_kv_count_refusals(arr, n, ctx, best);
    /* At least one full block: the engine announces it once it has prefilled it. */
    if (best && pool->kvev_sub)
        sched_kvev_sub_note_routed(pool->kvev_sub, best->uid);
    return best;
}
