/*
 * Session affinity by rendezvous (highest random weight) hashing: a key's instance is the
 * one whose hash with the key scores highest. Only the keys whose instance became unusable
 * move (to their next best), every other key stays put, and no ring has to be rebuilt when
 * the instance set changes. The hash is unseeded on purpose: gateways running side by side,
 * or one restarted, send a session to the same instance.
 */
#include <string.h>

#include "sched_int.h"

static uint64_t mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t sched_affinity_hash(const char *key, size_t len)
{
    return mix64(fnv1a(key, len));
}

static uint64_t score(uint64_t key_hash, const sched_instance_t *inst)
{
    const char *id = inst->desc.id ? inst->desc.id : "";
    return mix64(key_hash ^ fnv1a(id, strlen(id)));
}

sched_instance_t *sched_affinity_pick(sched_pool_t *pool, const sched_snapshot_t *snap, int ridx,
                                      uint64_t key_hash, const sched_pick_ctx_t *ctx)
{
    sched_instance_t *const *arr = snap->role[ridx];
    size_t n = snap->n_role[ridx];
    sched_instance_t *home = NULL, *best = NULL;
    uint64_t home_s = 0, best_s = 0;

    for (size_t i = 0; i < n; i++) {
        uint64_t s = score(key_hash, arr[i]);
        if (home == NULL || s > home_s) {
            home = arr[i];
            home_s = s;
        }
        if ((best == NULL || s > best_s) && sched_pick_allowed(arr[i], ctx)) {
            best = arr[i];
            best_s = s;
        }
    }
    if (best != NULL)
        atomic_fetch_add_explicit(best == home ? &pool->affinity_home[ridx]
                                               : &pool->affinity_moved[ridx],
                                  1, memory_order_relaxed);
    return best;
}
