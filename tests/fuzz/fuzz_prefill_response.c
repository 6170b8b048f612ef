/*
 * fuzz_prefill_response.c - a prefill engine's response body into the
 * forwarders that read it, the way the workflow hands it over
 * (gateway/src/workflow/pdgw_workflow.c): its bytes to on_prefill_text (lmcache reads
 * the prompt's ids there), then json_loadb of them (NULL when it is not JSON)
 * to on_prefill_response (vllm-nixl, vllm-mooncake, ...); followed by the
 * decode leg that is built from what the forwarder kept.
 *
 * Byte 0 picks the mode (serial/parallel, stream or not); the rest is the
 * response body. Never a crash, over-read or leak; an accepted response
 * yields a decode body that is a JSON object.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw/forwarder.h"
#include "pdgw_registry.h"

#define MAX_FWD 32

static json_t *g_body;
static void *g_ctx[MAX_FWD];
static int g_ok[MAX_FWD];
static const pdgw_fwd_desc_t *g_fwd[MAX_FWD];
static size_t g_n;

static void fz_init(void)
{
    json_t *opts = json_object();
    g_body = json_pack("{s:s, s:s, s:i, s:b}", "model", "m", "prompt", "hello", "max_tokens", 8,
                       "stream", 0);
    g_n = pdgw_registry_list(g_fwd, MAX_FWD);
    for (size_t i = 0; i < g_n; i++) {
        pdgw_fwd_env_t env = {.abi_version = PDGW_FWD_ABI_VERSION,
                              .protocol = g_fwd[i]->name,
                              .mode = PDGW_MODE_BATCH,
                              .n_workers = 1};
        char err[256];
        const pdgw_fwd_ops_t *ops = g_fwd[i]->ops;
        if (ops->on_prefill_response == NULL && ops->on_prefill_text == NULL)
            continue;
        g_ok[i] = ops->configure == NULL ||
                  ops->configure(opts, &env, &g_ctx[i], err, sizeof(err)) == PDGW_FWD_OK;
    }
    json_decref(opts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int alloc_ports[2] = {7100, 7101}, init_ports[2] = {7200, 7201};
    pdgw_instance_t pre = {.id = "p0",
                           .url = "http://127.0.0.1:8100",
                           .host = "127.0.0.1",
                           .port = 8100,
                           .role = PDGW_FWD_ROLE_PREFILL,
                           .zone = "",
                           .kv_host = "127.0.0.1",
                           .kv_port = 7000,
                           .bootstrap_port = 8998,
                           .engine_id = "engine-p0",
                           .alloc_ports = alloc_ports,
                           .n_alloc_ports = 2,
                           .init_ports = init_ports,
                           .n_init_ports = 2,
                           .tp_size = 2};
    pdgw_instance_t dec = pre;
    pdgw_fwd_peers_t peers = {.prefill = &pre, .decode = &dec};
    pdgw_fwd_request_t req = {.request_id = "6f1c2a3b-4d5e-4f60-8172-839405a6b7c8",
                              .path = "/v1/completions",
                              .model = "m",
                              .prompt_tokens = 2,
                              .max_tokens = 8,
                              .client_request_id = "client-1"};
    json_t *resp;

    if (g_body == NULL)
        fz_init();
    if (size == 0)
        return 0;
    dec.id = "d0";
    dec.role = PDGW_FWD_ROLE_DECODE;
    dec.engine_id = "engine-d0";
    req.body = g_body;
    req.stream = data[0] & 1;
    req.dispatch = (data[0] & 2) ? PDGW_DISPATCH_PARALLEL : PDGW_DISPATCH_SERIAL;
    req.mode = PDGW_MODE_BATCH;
    req.deadline_ms = INT64_MAX / 2;
    resp = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    for (size_t i = 0; i < g_n; i++) {
        const pdgw_fwd_ops_t *ops = g_fwd[i]->ops;
        void *state = NULL;
        pdgw_fwd_error_t err;
        pdgw_fwd_leg_t leg;

        if (!g_ok[i])
            continue;
        memset(&err, 0, sizeof(err));
        if (ops->attempt_init != NULL &&
            ops->attempt_init(g_ctx[i], &req, &peers, &state, &err) != PDGW_FWD_OK)
            continue;
        if ((ops->on_prefill_text == NULL ||
             ops->on_prefill_text(g_ctx[i], state, &req, 200, (const char *)data + 1, size - 1,
                                  &err) == PDGW_FWD_OK) &&
            (ops->on_prefill_response == NULL ||
             ops->on_prefill_response(g_ctx[i], state, &req, 200, resp, &err) == PDGW_FWD_OK)) {
            memset(&leg, 0, sizeof(leg));
            if (ops->build_leg(g_ctx[i], state, &req, PDGW_LEG_DECODE, &peers, &leg, &err) ==
                PDGW_FWD_OK) {
                if (!leg.client_body && !json_is_object(leg.body))
                    abort();
                json_decref(leg.body);
            }
        }
        if (ops->retry_scope != NULL) {
            err.phase = PDGW_PHASE_DECODE;
            (void)ops->retry_scope(g_ctx[i], state, &req, &err);
        }
        if (ops->attempt_cleanup != NULL)
            ops->attempt_cleanup(g_ctx[i], state, &req, PDGW_END_FAILED);
    }
    json_decref(resp);
    return 0;
}
