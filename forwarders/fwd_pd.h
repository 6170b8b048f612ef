/*
 * fwd_pd.h - helpers shared by the PD forwarders (vllm-nixl, vllm-mooncake, vllm-kvt, sglang,
 * lmcache): leg bodies with their kv_transfer_params (docs/protocols/) and option parsing.
 *
 * Data flow: a forwarder's ops build bodies with fwd_pd_body_*(); forwarders whose decode runs
 * libkvt open the gateway's KV control service (forwarder.h pdgw_fwd_kv_svc_*) in configure
 * and drive a pdgw_fwd_kv_req_t per attempt from their gate (admission -> reservation before
 * prefill; ProxyNotif count before decode). The service's thread and sockets are the
 * gateway's; request ops never block.
 */
#ifndef FWD_PD_H
#define FWD_PD_H

#include <pdgw/forwarder.h>
#include <stdint.h>

/* ---- bodies (fwd_pd_body.c) ---- */

/* The vllm-nixl / vllm-mooncake serial prefill kv_transfer_params (new reference). */
json_t *fwd_pd_kvp_remote_decode(void);

/* The bodies and options are the SDK's (forwarder.h); the in-tree names stay. */
#define fwd_pd_body_prefill pdgw_fwd_body_prefill_kvp
#define fwd_pd_body_decode  pdgw_fwd_body_decode_kvp
#define fwd_pd_resp_kvp     pdgw_fwd_resp_kvp

/* Count a prefill that returned no kv_transfer_params (pdgw_prefill_missing_kv_params_total). */
#define fwd_pd_count_missing_kv_params pdgw_fwd_prefill_missing_kv_params

/* ---- options (forwarder.h) ---- */
#define fwd_pd_opts_check pdgw_fwd_opts_check
#define fwd_pd_opt_int    pdgw_fwd_opt_int
#define fwd_pd_opt_bool   pdgw_fwd_opt_bool
#define fwd_pd_opt_enum   pdgw_fwd_opt_enum
#define fwd_pd_opt_str    pdgw_fwd_opt_str

/* A random 63-bit integer (never negative). */
int64_t fwd_pd_random63(void);

#endif /* FWD_PD_H */
