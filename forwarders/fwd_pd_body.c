/*
 * fwd_pd_body.c - what the PD forwarders share beyond the SDK's body and option helpers
 * (forwarder.h): the vllm serial prefill's kv_transfer_params and transfer-name randomness.
 */
#include "fwd_pd.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

json_t *fwd_pd_kvp_remote_decode(void)
{
    return json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                     "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
}

int64_t fwd_pd_random63(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        v = ((uint64_t)pdgw_fwd_now_ms() << 20) ^ (uint64_t)(uintptr_t)&v;
        v *= 0x9E3779B97F4A7C15ull;
    }
    return (int64_t)(v >> 1);
}

pdgw_fwd_status_t fwd_pd_kv_opts_parse(const json_t *options, int reserve_default, int proxy,
                                       fwd_pd_kv_opts_t *o, char *err, size_t errlen)
{
    static const char *const refusal[] = {"queue", "repick", NULL};
    int mode = 0;
    memset(o, 0, sizeof(*o));
    o->proxy = proxy;
    if (fwd_pd_opt_bool(options, "reserve", reserve_default, &o->reserve, err, errlen) ||
        fwd_pd_opt_int(options, "chunk_tokens", 256, 1, 1 << 20, &o->chunk_tokens, err, errlen) ||
        fwd_pd_opt_int(options, "reserve_ttl_ms", 30000, 1, 3600000, &o->reserve_ttl_ms, err,
                       errlen) ||
        fwd_pd_opt_int(options, "reserve_timeout_ms", 1000, 1, 60000, &o->reserve_timeout_ms, err,
                       errlen) ||
        fwd_pd_opt_int(options, "reserve_retry_ms", 50, 1, 60000, &o->reserve_retry_ms, err,
                       errlen) ||
        fwd_pd_opt_enum(options, "reserve_on_refusal", refusal, 0, &mode, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    o->on_refusal = (fwd_pd_refusal_t)mode;
    if (!proxy)
        return PDGW_FWD_OK;
    return fwd_pd_notif_opts_parse(options, o, err, errlen);
}
