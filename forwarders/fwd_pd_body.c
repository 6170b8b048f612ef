/*
 * fwd_pd_body.c - what the PD forwarders share beyond the SDK's body and option helpers
 * (forwarder.h): the vllm serial prefill's kv_transfer_params and transfer-name randomness.
 */
#include "fwd_pd.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static json_t *remote_decode_kvp;
static pthread_once_t remote_decode_once = PTHREAD_ONCE_INIT;

static void remote_decode_kvp_make(void)
{
    remote_decode_kvp =
        json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                  "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
}

/* The same for every request: made once and shared (jansson counts references atomically,
 * and a leg body is not edited once built). */
json_t *fwd_pd_kvp_remote_decode(void)
{
    pthread_once(&remote_decode_once, remote_decode_kvp_make);
    return remote_decode_kvp != NULL ? json_incref(remote_decode_kvp) : NULL;
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
