/* GET /metrics: Prometheus text with vLLM's metric names plus sim_* ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

sim_counters_t sim_ctr;

#define LD(x) ((unsigned long long)atomic_load(&(x)))
#define LL(x) ((long long)atomic_load(&(x)))

/* The CPU offload tier's own figures (sim_cpu_tier.c). */
static void render_cpu_tier(FILE *f)
{
    sim_cpu_tier_stats_t st;
    sim_cpu_tier_stats(&st);
    fprintf(f,
            "# HELP sim_kv_offload_blocks CPU offload tier blocks by state.\n"
            "# TYPE sim_kv_offload_blocks gauge\n"
            "sim_kv_offload_blocks{state=\"total\"} %u\n"
            "sim_kv_offload_blocks{state=\"cached\"} %u\n"
            "sim_kv_offload_blocks{state=\"in_use\"} %u\n"
            "# HELP sim_kv_offload_blocks_stored_total Blocks copied into the CPU tier.\n"
            "# TYPE sim_kv_offload_blocks_stored_total counter\n"
            "sim_kv_offload_blocks_stored_total %llu\n"
            "# HELP sim_kv_offload_blocks_loaded_total CPU-tier blocks loaded for a prefill.\n"
            "# TYPE sim_kv_offload_blocks_loaded_total counter\n"
            "sim_kv_offload_blocks_loaded_total %llu\n"
            "# HELP sim_kv_offload_blocks_evicted_total CPU-tier blocks evicted (LRU).\n"
            "# TYPE sim_kv_offload_blocks_evicted_total counter\n"
            "sim_kv_offload_blocks_evicted_total %llu\n"
            "# HELP sim_kv_offload_store_no_space_total Blocks not stored: every CPU-tier block "
            "was in use.\n"
            "# TYPE sim_kv_offload_store_no_space_total counter\n"
            "sim_kv_offload_store_no_space_total %llu\n"
            "# HELP sim_kv_offload_verify_failures_total CPU-tier blocks whose bytes were not "
            "the block's on load (recomputed instead).\n"
            "# TYPE sim_kv_offload_verify_failures_total counter\n"
            "sim_kv_offload_verify_failures_total %llu\n",
            st.blocks, st.cached_blocks, st.blocks - st.free_blocks, LD(sim_ctr.offload_stored),
            LD(sim_ctr.offload_loaded), LD(sim_ctr.offload_evicted), LD(sim_ctr.offload_no_space),
            LD(sim_ctr.offload_verify_failures));
}

/* Scheduler-facing vLLM gauges and the prefix-cache counters. */
static void render_vllm_load(FILE *f, const char *m, const sim_engine_stats_t *st)
{
    fprintf(f,
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{model_name=\"%s\"} %d\n",
            m, st->running);
    fprintf(f,
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            "vllm:num_requests_waiting{model_name=\"%s\"} %d\n",
            m, st->waiting);
    fprintf(f,
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            "vllm:kv_cache_usage_perc{model_name=\"%s\"} %.6f\n",
            m, st->kv_usage);
    fprintf(f,
            "# HELP vllm:gpu_cache_usage_perc KV-cache usage (older name).\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            "vllm:gpu_cache_usage_perc{model_name=\"%s\"} %.6f\n",
            m, st->kv_usage);
    /* vLLM vllm/v1/metrics/loggers.py log_metrics_info: an info gauge of value 1 whose labels
     * are CacheConfig.metrics_info() (vllm/config/cache.py: every field, str()'d) plus
     * "engine"; a few of those fields here, the capacity ones among them. */
    fprintf(f,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\","
            "enable_prefix_caching=\"%s\",engine=\"0\",num_cpu_blocks=\"None\","
            "num_gpu_blocks=\"%d\"} 1.0\n",
            sim_cfg.block_size, sim_cfg.no_prefix_cache ? "False" : "True", st->blocks_total);
    fprintf(f,
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n"
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            "vllm:prefix_cache_queries_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.prefix_queries));
    fprintf(f,
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.\n"
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            "vllm:prefix_cache_hits_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.prefix_hits));
}

/* The KV connector's (here the CPU offload tier's) prefix-cache counters and the
 * tier's own figures. */
static void render_offload(FILE *f, const char *m)
{
    /* vLLM exports these when a KV connector (here its CPU offloading)
     * looks prompts up: tokens asked for, tokens it supplied
     * (vllm/v1/metrics/loggers.py, counter_connector_prefix_cache_*) */
    fprintf(f,
            "# HELP vllm:external_prefix_cache_queries_total External prefix cache queries "
            "from KV connector cross-instance cache sharing, in terms of number of queried "
            "tokens.\n"
            "# TYPE vllm:external_prefix_cache_queries_total counter\n"
            "vllm:external_prefix_cache_queries_total{model_name=\"%s\"} %llu\n"
            "# HELP vllm:external_prefix_cache_hits_total External prefix cache hits from KV "
            "connector cross-instance cache sharing, in terms of number of cached tokens.\n"
            "# TYPE vllm:external_prefix_cache_hits_total counter\n"
            "vllm:external_prefix_cache_hits_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.external_queries), m, LD(sim_ctr.external_hits));
    render_cpu_tier(f);
}

/* KV-event batches, vLLM's token and finished-request counters. */
static void render_vllm_tokens(FILE *f, const char *m)
{
    fprintf(f,
            "# HELP sim_kv_event_batches_total KV-event batches published (0 without KV "
            "events).\n"
            "# TYPE sim_kv_event_batches_total counter\n"
            "sim_kv_event_batches_total %llu\n",
            sim_kvev_published());
    fprintf(f,
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            "vllm:prompt_tokens_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.prompt_tokens));
    fprintf(f,
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            "vllm:generation_tokens_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.generation_tokens));
    fprintf(f,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"%s\"} %llu\n"
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"%s\"} %llu\n"
            "vllm:request_success_total{finished_reason=\"abort\",model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.req_finished_length), m, LD(sim_ctr.req_finished_stop), m,
            LD(sim_ctr.req_finished_abort));
    /* vLLM vllm/v1/metrics/loggers.py: the counter "vllm:num_preemptions" (a Prometheus
     * counter, exposed with _total) */
    fprintf(f,
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the "
            "engine.\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            "vllm:num_preemptions_total{model_name=\"%s\"} %llu\n",
            m, LD(sim_ctr.preemptions));
}

/* The HTTP front end, fault injection and capacity model. */
static void render_sim_http(FILE *f, const sim_engine_stats_t *st)
{
    fprintf(
        f,
        "# HELP sim_http_requests_total HTTP requests received.\n"
        "# TYPE sim_http_requests_total counter\n"
        "sim_http_requests_total %llu\n"
        "# HELP sim_http_errors_total HTTP error responses by class.\n"
        "# TYPE sim_http_errors_total counter\n"
        "sim_http_errors_total{class=\"4xx\"} %llu\n"
        "sim_http_errors_total{class=\"5xx\"} %llu\n"
        "# HELP sim_request_errors_total Requests the engine failed.\n"
        "# TYPE sim_request_errors_total counter\n"
        "sim_request_errors_total %llu\n"
        "# HELP sim_faults_injected_total Faults injected (--fail-rate, --stall-after-tokens).\n"
        "# TYPE sim_faults_injected_total counter\n"
        "sim_faults_injected_total %llu\n"
        "# HELP sim_client_disconnects_total Connections closed before the response ended.\n"
        "# TYPE sim_client_disconnects_total counter\n"
        "sim_client_disconnects_total %llu\n"
        "# HELP sim_active_connections Requests with an open connection.\n"
        "# TYPE sim_active_connections gauge\n"
        "sim_active_connections %lld\n"
        "# HELP sim_open_streams SSE streams being sent.\n"
        "# TYPE sim_open_streams gauge\n"
        "sim_open_streams %lld\n"
        "# HELP sim_kv_blocks_total KV blocks of the capacity model.\n"
        "# TYPE sim_kv_blocks_total gauge\n"
        "sim_kv_blocks_total %d\n"
        "# HELP sim_kv_blocks_used KV blocks referenced by requests.\n"
        "# TYPE sim_kv_blocks_used gauge\n"
        "sim_kv_blocks_used %d\n"
        "# HELP sim_ttft_seconds_sum Engine-side time to first token, summed.\n"
        "# TYPE sim_ttft_seconds_sum counter\n"
        "sim_ttft_seconds_sum %.6f\n"
        "# HELP sim_ttft_seconds_count Requests with a first token.\n"
        "# TYPE sim_ttft_seconds_count counter\n"
        "sim_ttft_seconds_count %llu\n",
        LD(sim_ctr.http_requests), LD(sim_ctr.http_4xx), LD(sim_ctr.http_5xx),
        LD(sim_ctr.req_errors), LD(sim_ctr.faults_injected), LD(sim_ctr.client_disconnects),
        LL(sim_ctr.active_connections), LL(sim_ctr.open_streams), st->blocks_total, st->blocks_used,
        (double)LD(sim_ctr.ttft_us_sum) / 1e6, LD(sim_ctr.ttft_count));
}

/* KV transfer figures; <kv_used>/<kv_pinned> are transfer pages. */
static void render_sim_kv(FILE *f, long long kv_used, long long kv_pinned)
{
    fprintf(f,
            "# HELP sim_kv_bytes_received_total KV bytes received from a remote instance.\n"
            "# TYPE sim_kv_bytes_received_total counter\n"
            "sim_kv_bytes_received_total %llu\n"
            "# HELP sim_kv_bytes_sent_total KV bytes sent to a remote instance.\n"
            "# TYPE sim_kv_bytes_sent_total counter\n"
            "sim_kv_bytes_sent_total %llu\n"
            "# HELP sim_kv_verify_failures_total Received KV pages whose bytes did not verify.\n"
            "# TYPE sim_kv_verify_failures_total counter\n"
            "sim_kv_verify_failures_total %llu\n"
            "# HELP sim_kv_transfers_total Finished KV transfers by result.\n"
            "# TYPE sim_kv_transfers_total counter\n"
            "sim_kv_transfers_total{result=\"ok\"} %llu\n"
            "sim_kv_transfers_total{result=\"failed\"} %llu\n"
            "# HELP sim_kv_hold_timeouts_total Held prefill KV freed because nobody claimed it.\n"
            "# TYPE sim_kv_hold_timeouts_total counter\n"
            "sim_kv_hold_timeouts_total %llu\n"
            "# HELP sim_kv_rejected_releases_total Held prefill KV freed at once because the "
            "decode refused the request that named it.\n"
            "# TYPE sim_kv_rejected_releases_total counter\n"
            "sim_kv_rejected_releases_total %llu\n"
            "# HELP sim_kv_invalid_params_total Decode requests whose NIXL kv_transfer_params "
            "could not be used (the prompt was recomputed, as vLLM does).\n"
            "# TYPE sim_kv_invalid_params_total counter\n"
            "sim_kv_invalid_params_total %llu\n"
            "# HELP sim_kv_corruptions_injected_total KV pages corrupted on purpose.\n"
            "# TYPE sim_kv_corruptions_injected_total counter\n"
            "sim_kv_corruptions_injected_total %llu\n"
            "# HELP sim_kv_pages_pinned KV pages pinned for a remote reader or writer.\n"
            "# TYPE sim_kv_pages_pinned gauge\n"
            "sim_kv_pages_pinned %lld\n"
            "# HELP sim_kv_pages_used KV transfer pages allocated.\n"
            "# TYPE sim_kv_pages_used gauge\n"
            "sim_kv_pages_used %lld\n",
            LD(sim_ctr.kv_bytes_received), LD(sim_ctr.kv_bytes_sent),
            LD(sim_ctr.kv_verify_failures), LD(sim_ctr.kv_transfers_ok),
            LD(sim_ctr.kv_transfers_failed), LD(sim_ctr.kv_hold_timeouts),
            LD(sim_ctr.kv_rejected_releases), LD(sim_ctr.kv_invalid_params),
            LD(sim_ctr.kv_corruptions_injected), kv_pinned, kv_used);
}

char *sim_metrics_render(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    sim_engine_stats_t st;
    const char *m = sim_model_name(); /* vLLM labels model_name with the first served name */
    if (!f)
        return NULL;
    long long kv_used, kv_pinned;
    sim_engine_stats(&st);
    sim_kv_pages(&kv_used, &kv_pinned);

    render_vllm_load(f, m, &st);
    if (sim_cpu_tier_enabled())
        render_offload(f, m);
    render_vllm_tokens(f, m);

    render_sim_http(f, &st);

    render_sim_kv(f, kv_used, kv_pinned);
    char *extra = sim_kv_metrics_render();
    if (extra) {
        fputs(extra, f);
        free(extra);
    }
    fclose(f);
    return buf;
}
