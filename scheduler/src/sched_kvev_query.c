/*
 * Questions the gateway asks the KV-event index outside a pick: how much of a
 * prompt one chosen instance already holds (selective PD: a decode that holds
 * most of the prompt needs no prefill leg), and which usable instance to ask
 * for a tokenization.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"
#include "sched_kvev_int.h"

bool sched_kvev_cached_tokens(sched_pool_t *pool, const sched_request_t *req,
                              const sched_instance_t *inst, size_t *cached_tokens_out)
{
    uint64_t *keys = NULL;
    size_t n_keys = 0, depth = 0;
    double weighted = 0.0;
    uint64_t uid;
    uint32_t bs;

    if (pool == NULL || req == NULL || inst == NULL || pool->kvev_index == NULL)
        return false;
    if (sched_kvev_request_keys(pool, req, &keys, &n_keys) != SCHED_OK || n_keys == 0) {
        sched_free(keys);
        return false;
    }
    uid = inst->uid;
    /* Any tier counts here: a block offloaded to CPU is still not recomputed. */
    sched_kvev_index_match(pool->kvev_index, keys, n_keys, &uid, 1, 1.0, &depth, &weighted);
    sched_free(keys);
    bs = sched_kvev_index_block_size(pool->kvev_index, 0);
    if (cached_tokens_out)
        *cached_tokens_out = depth * (size_t)bs;
    return true;
}

sched_instance_t *sched_pool_pick_usable(sched_pool_t *pool, sched_role_t role, uint64_t turn)
{
    int ridx = role == SCHED_ROLE_PREFILL ? SCHED_RIDX_PREFILL : SCHED_RIDX_DECODE;
    uint64_t now = sched_pool_now(pool);
    const sched_snapshot_t *snap;
    sched_instance_t *found = NULL;
    size_t n, usable = 0;

    pthread_rwlock_rdlock(&pool->lock);
    snap = pool->snap;
    n = snap->n_role[ridx];
    for (size_t i = 0; i < n; i++)
        if (sched_instance_selectable(snap->role[ridx][i], now))
            usable++;
    if (usable > 0) {
        size_t want = (size_t)(turn % usable);
        for (size_t i = 0; i < n; i++) {
            sched_instance_t *inst = snap->role[ridx][i];
            if (!sched_instance_selectable(inst, now))
                continue;
            if (want-- == 0) {
                found = sched_instance_ref(inst);
                break;
            }
        }
    }
    pthread_rwlock_unlock(&pool->lock);
    return found;
}

bool sched_pool_has_kv_index(sched_pool_t *pool)
{
    return pool != NULL && pool->kvev_index != NULL;
}

/*
 * The endpoint rank <dp_rank> of a data-parallel engine publishes on, from the endpoint its
 * configuration names: vLLM offsets it per rank (vllm-project/vllm
 * vllm/distributed/kv_events.py ZmqEventPublisher.offset_endpoint_port: tcp → port + rank,
 * inproc → "_dp<rank>" appended, rank 0 unchanged; anything else refused).
 */
bool sched_kvev_rank_endpoint(const char *endpoint, int dp_rank, char *out, size_t out_len)
{
    const char *colon;
    char *end;
    long port;
    int n;

    if (endpoint == NULL || endpoint[0] == '\0')
        return false;
    if (dp_rank <= 0)
        n = snprintf(out, out_len, "%s", endpoint);
    else if (strstr(endpoint, "inproc") != NULL)
        n = snprintf(out, out_len, "%s_dp%d", endpoint, dp_rank);
    else if (strstr(endpoint, "tcp") != NULL && (colon = strrchr(endpoint, ':')) != NULL) {
        port = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end != '\0' || port < 0 || port + dp_rank > 65535)
            return false;
        n = snprintf(out, out_len, "%.*s:%ld", (int)(colon - endpoint), endpoint, port + dp_rank);
    } else
        return false;
    return n > 0 && (size_t)n < out_len;
}
