/*
 * fwd_mc_bootstrap.h - engine ids of vLLM MooncakeConnector prefills, learnt from their
 * bootstrap servers (docs/protocols/vllm-mooncake.md).
 *
 * A Mooncake prefill runs an HTTP bootstrap server (default port 8998) whose GET /query
 * answers {"<dp_rank>": {"engine_id": E, "worker_addr": {...}}, ...}. The decode leg must name
 * E of the DP rank that ran the prefill, and vLLM mints a new E at every start, so the ids are
 * fetched, cached per prefill and refreshed: by the first request that finds the answer older
 * than <ttl_ms> (in the background: the old answer serves it), and before the next use when a
 * request reports the cached id stale (a decode failed, the prefill was unreachable). A fetch
 * is a call of the gateway's upstream client on the asking request's worker; requests that
 * find it under way get PENDING and are woken when it ends.
 */
#ifndef FWD_MC_BOOTSTRAP_H
#define FWD_MC_BOOTSTRAP_H

#include <pdgw/forwarder.h>
#include <stdint.h>

typedef struct fwd_mc_boot fwd_mc_boot_t;

/* A request's own fetch (zeroed in its attempt state). */
typedef struct fwd_mc_fetch {
    pdgw_fwd_call_t *call;
    char host[128];
    int port;
} fwd_mc_fetch_t;

/* <ttl_ms>: refresh period of a cached answer; <timeout_ms>: one GET /query. */
pdgw_fwd_status_t fwd_mc_boot_create(int64_t ttl_ms, int64_t timeout_ms, fwd_mc_boot_t **out,
                                     char *err, size_t errlen);
void fwd_mc_boot_destroy(fwd_mc_boot_t *b);

/* The engine id of DP rank <rank> of the bootstrap server at <inst>'s host, <port>, copied
 * into out; <f> is the request's fetch. From a request op on its worker (a gate).
 * OK: found. PENDING: a fetch is under way (maybe <f>); the request's waker runs when it ends
 * (call again). ERR: the last fetch failed or the rank is not listed (message in err). */
pdgw_fwd_status_t fwd_mc_boot_lookup(fwd_mc_boot_t *b, fwd_mc_fetch_t *f,
                                     const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                                     int port, int rank, char *out, size_t cap, char *err,
                                     size_t errlen);

/* Take the answer of <f>'s finished fetch into the cache (a background refresh ends after the
 * gate); <ending>: the attempt ends, so a fetch still under way is dropped (and its waiters
 * woken to ask again). From a request op. */
void fwd_mc_boot_settle(fwd_mc_boot_t *b, fwd_mc_fetch_t *f, int ending);

/* A request found <engine_id> of <host>:<port> stale (or the prefill failed): the next lookup
 * fetches again. NULL engine_id: drop whatever is cached. Thread-safe. */
void fwd_mc_boot_invalidate(fwd_mc_boot_t *b, const char *host, int port, const char *engine_id);

/* Parse a /query answer: the engine id of <rank> (borrowed from <answer>) or NULL. */
const char *fwd_mc_boot_engine_of(const json_t *answer, int rank);

#endif /* FWD_MC_BOOTSTRAP_H */
