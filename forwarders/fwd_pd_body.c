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
