/*
 * fwd_mc_bootstrap.h - engine ids of vLLM MooncakeConnector prefills, learnt from their
 * bootstrap servers (docs/protocols/vllm-mooncake.md).
 *
 * A Mooncake prefill runs an HTTP bootstrap server (default port 8998) whose GET /query
 * answers {"<dp_rank>": {"engine_id": E, "worker_addr": {...}}, ...}. The decode leg must name
 * E of the DP rank that ran the prefill, and vLLM mints a new E at every start, so the ids are
 * fetched, cached per prefill and refreshed: by a background thread every <ttl_ms>, and at once
 * when a request reports the cached id stale (a decode failed, the prefill was unreachable).
 * Fetches never run on a worker thread: a lookup that finds nothing usable returns PENDING and
 * the fetch wakes the request's waker when it ends.
 */
#ifndef FWD_MC_BOOTSTRAP_H
#define FWD_MC_BOOTSTRAP_H

#include <pdgw/forwarder.h>
#include <stdint.h>

typedef struct fwd_mc_boot fwd_mc_boot_t;

/* Start the fetch thread. <ttl_ms>: background refresh period of a cached answer;
 * <timeout_ms>: one GET /query. */
pdgw_fwd_status_t fwd_mc_boot_create(int64_t ttl_ms, int64_t timeout_ms, fwd_mc_boot_t **out,
                                     char *err, size_t errlen);
void fwd_mc_boot_destroy(fwd_mc_boot_t *b);

/* The engine id of DP rank <rank> of the bootstrap server <host>:<port>, copied into out.
 * OK: found. PENDING: a fetch is under way; <waker> is woken when it ends (call again).
 * ERR: the last fetch failed or the rank is not listed (message in err). Thread-safe. */
pdgw_fwd_status_t fwd_mc_boot_lookup(fwd_mc_boot_t *b, const char *host, int port, int rank,
                                     pdgw_fwd_waker_t *waker, char *out, size_t cap, char *err,
                                     size_t errlen);

/* A request found <engine_id> of <host>:<port> stale (or the prefill failed): the next lookup
 * fetches again. NULL engine_id: drop whatever is cached. Thread-safe. */
void fwd_mc_boot_invalidate(fwd_mc_boot_t *b, const char *host, int port, const char *engine_id);

/* Parse a /query answer: the engine id of <rank> (borrowed from <answer>) or NULL. */
const char *fwd_mc_boot_engine_of(const json_t *answer, int rank);

#endif /* FWD_MC_BOOTSTRAP_H */
