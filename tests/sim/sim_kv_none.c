/* PD hooks: a `both` instance keeps all KV local. */
#include <stdio.h>
#include <stdlib.h>

#include "sim_int.h"

int sim_kv_start(void)
{
    if (sim_cfg.role != SIM_ROLE_BOTH) {
        fprintf(stderr, "pdgw-sim: --role %s is not available in this build\n",
                sim_role_name(sim_cfg.role));
        return -1;
    }
    return 0;
}

void sim_kv_stop(void) {}

int sim_kv_prepare(sim_req_t *req, json_t *body, char **msg)
{
    return 0;
}

void sim_kv_reject(const json_t *body)
{
    (void)body;
}

int sim_kv_layered(const sim_req_t *req)
{
    return 0;
}

void sim_kv_on_layer_done_locked(sim_req_t *req, int layer) {}

void sim_kv_on_prefill_done_locked(sim_req_t *req) {}

void sim_kv_on_finish_locked(sim_req_t *req) {}
void sim_kv_on_client_gone_locked(sim_req_t *req) {}

void sim_kv_req_free(struct sim_kv_req *kv) {}

int sim_kv_remote_filled(const sim_req_t *req)
{
    return 0;
}

int sim_kv_needs_remote(const sim_req_t *req)
{
    return 0;
}

void sim_kv_begin_remote(sim_req_t *req) {}

char *sim_kv_metrics_render(void)
{
    return NULL;
}

void sim_kv_pages(long long *used, long long *pinned)
{
    *used = *pinned = 0;
}
