/* Without libkvt there is no prefix cache to build the CPU offload tier on:
 * asking for one is an error, everything else does nothing. */
#include <stdio.h>
#include <string.h>

#include "sim_int.h"

int sim_cpu_tier_init(void)
{
    if (sim_cfg.kv_offloading_blocks <= 0 && sim_cfg.kv_offloading_size_gib <= 0)
        return 0;
    fprintf(stderr, "pdgw-sim: the CPU offload tier needs libkvt (not built)\n");
    return -1;
}

void sim_cpu_tier_fini(void) {}

int sim_cpu_tier_enabled(void)
{
    return 0;
}

size_t sim_cpu_tier_load_locked(sim_req_t *req)
{
    (void)req;
    return 0;
}

void sim_cpu_tier_release_locked(sim_req_t *req)
{
    (void)req;
}

void sim_cpu_tier_store_locked(const sim_tokens_t *prompt)
{
    (void)prompt;
}

void sim_cpu_tier_stats(sim_cpu_tier_stats_t *st)
{
    memset(st, 0, sizeof(*st));
}

uint8_t *sim_cpu_tier_page(uint32_t page)
{
    (void)page;
    return NULL;
}

size_t sim_cpu_tier_page_bytes(void)
{
    return 0;
}
