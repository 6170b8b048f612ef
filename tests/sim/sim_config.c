/* pdgw-sim command line. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_int.h"
#include "pdb/pdb_clock.h"

sim_config_t sim_cfg;

const char *sim_role_name(sim_role_t role)
{
    switch (role) {
    case SIM_ROLE_PREFILL:
        return "prefill";
    case SIM_ROLE_DECODE:
        return "decode";
    default:
        return "both";
    }
}

const char *sim_kv_mode_name(sim_kv_mode_t mode)
{
    switch (mode) {
    case SIM_KV_MODE_PUSH:
        return "push";
    case SIM_KV_MODE_PULL_EAGER:
        return "pull-eager";
    case SIM_KV_MODE_PULL_DELAY:
        return "pull-delay";
    default:
        return "auto";
    }
}

uint64_t sim_now_ns(void)
{
    return pdb_clock_mono_ns();
}

uint64_t sim_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pdgw-sim [options]\n"
            "A vLLM-compatible engine simulator (OpenAI API, vLLM metrics, PD roles).\n\n"
            "  --role both|prefill|decode   instance role (both)\n"
            "  --host ADDR                  listen address (127.0.0.1)\n"
            "  --port N                     HTTP port (8100)\n"
            "  --model NAME                 model (and served name unless the next) (sim-model)\n"
            "  --served-model-name N [N..]  names requests may use (first one answered)\n"
            "  --ttft-ms MS                 base time to first token (20)\n"
            "  --tpot-ms MS                 time per output token (10)\n"
            "  --prefill-ms-per-token MS    extra TTFT per uncached prompt token (0.02)\n"
            "  --max-tokens-default N       max_tokens when the request has none (16)\n"
            "  --max-model-len N            prompt + max_tokens limit (8192)\n"
            "  --tokenizer PATH             the model's tokenizer.json (file or folder; its\n"
            "                               tokenizer_config.json's chat template) instead of\n"
            "                               the built-in tokenizer\n"
            "  --zero-delay                 no waits at all (benchmarks)\n"
            "  --emit-timestamps            add \"sim_emit_ns\" to every streamed chunk\n"
            "  --enable-prompt-tokens-details  as vLLM: usage.prompt_tokens_details.\n"
            "                               cached_tokens (prefix-cache hits) when non-zero\n"
            "  --max-batch N                running requests (vLLM's max_num_seqs); the rest\n"
            "                               wait (256)\n"
            "Engine steps (tests/sim/README.md: a step costs base + prefill-ms-per-token x its\n"
            "prefill tokens + step-ms-per-seq x its decodes + step-ms-per-ktoken x their KV/1000;\n"
            "base = tpot-ms - step-ms-per-seq, so an idle engine keeps --ttft-ms and --tpot-ms):\n"
            "  --max-num-batched-tokens N   tokens one step computes; longer prompts are\n"
            "                               prefilled in chunks (vLLM V1's default, 2048)\n"
            "  --step-ms-per-seq MS         step cost of each decoding sequence (tpot-ms / 100)\n"
            "  --step-ms-per-ktoken MS      step cost of 1000 KV tokens decodes attend (0)\n"
            "  --speed F                    speed of every phase, < 1 slower (1)\n"
            "  --prefill-speed F            speed of prefill work, times --speed (1)\n"
            "  --decode-speed F             speed of decode work, times --speed (1)\n"
            "  --timing steps|per-request   per-request: each request its own clock (TTFT, then\n"
            "                               a token every --tpot-ms), whatever else runs (steps)\n"
            "  --block-size N               tokens per KV block (16)\n"
            "  --kv-bytes-per-token N       KV bytes per token over all layers (1024)\n"
            "  --kv-capacity-tokens N       KV capacity in tokens (262144)\n"
            "  --eos-period N               about 1 in N output tokens is EOS; 0 = never (64)\n"
            "  --no-prefix-cache            disable the prefix cache\n"
            "  --kv-offloading-size GIB     CPU offload tier of GIB GiB, as vLLM (0 = off)\n"
            "  --kv-offloading-blocks N     CPU offload tier of exactly N blocks (0 = off)\n"
            "  --kv-offloading-backend native   vLLM's backend choice (only native here)\n"
            "  --kv-offloading-load-cost F  a CPU-tier hit token costs F x\n"
            "                               --prefill-ms-per-token (0.25)\n"
            "  --record-capacity N          requests kept for GET /sim/requests; 0 = off (1024)\n"
            "  --record-tokenize            record /tokenize and /detokenize calls too (their\n"
            "                               time is the engine's: benchmarks count it so)\n"
            "  --no-return-token-ids        ignore return_token_ids, as a vLLM from before the\n"
            "                               field (answers carry no prompt_token_ids)\n"
            "PD / KV transfer:\n"
            "  --kv-host ADDR               host advertised for KV endpoints (--host, or "
            "127.0.0.1)\n"
            "  --kv-port N                  KV side channel (vllm-kvt / nixl / mooncake serial)\n"
            "  --bootstrap-port N           prefill: HTTP bootstrap server (GET /query, /route);\n"
            "                               decode: the port a null sglang bootstrap_port means\n"
            "  --dp-size N                  data-parallel ranks: /query lists them, "
            "X-data-parallel-rank\n"
            "                               picks one (without it the header is not read) (1)\n"
            "  --kv-connector NAME          nixl (default) | mooncake: a prefill follows vLLM's\n"
            "                               MooncakeConnector (transfer_id required, no params)\n"
            "  --alloc-port N[,N...]        lmcache receiver alloc port per TP rank\n"
            "  --init-port N[,N...]         lmcache receiver init port per TP rank\n"
            "  --engine-id ID               engine id (sim-<role>-<port>)\n"
            "  --proxy-host ADDR --proxy-port N   where lmcache ProxyNotif goes\n"
            "  --kv-mode push|pull-eager|pull-delay   force a transfer mode\n"
            "  --layers N                   layers (4)\n"
            "  --no-layerwise               push KV only after the last layer\n"
            "  --kv-hold-timeout-ms MS      free unclaimed prefill KV after MS (30000)\n"
            "  --nixl-shape newest|older    kv_transfer_params a NIXL prefill returns: vLLM's\n"
            "                               newest (block ids per KV-cache group, dcp/pp sizes,\n"
            "                               lease fields, randomized request id) or older (flat)\n"
            "  --nixl-stopped-prefill params|null   a NIXL prefill that stopped (EOS, stop\n"
            "                               string): params = vLLM's current connector (KV held,\n"
            "                               kv_transfer_params returned, as when length-capped);\n"
            "                               null = older vLLM (KV freed, no params; the default\n"
            "                               with --nixl-shape older)\n"
            "  --kv-wait-timeout-ms MS      decode deadline for remote KV (10000)\n"
            "  --kv-alloc-ttl-ms MS         libkvt receivers free allocations nobody wrote or\n"
            "                               claimed after MS (pd_alloc_ttl; 0 = never) (30000)\n"
            "  --kv-alloc-quota F           share of a libkvt receiver's pool one sender (source\n"
            "                               address) may hold unclaimed (pd_alloc_quota) (0.5)\n"
            "  --lmcache-chunk-size N       tokens per LMCache KV chunk (LMCache's chunk_size,\n"
            "                               its own setting, not --block-size) (256)\n"
            "  --lmcache-receiver lmcache|ascend   how this decode's LMCache receivers\n"
            "                               answer plain senders: LMCache's (async and sync\n"
            "                               backends) or LMCache-Ascend's (AscendAllocResponse)\n"
            "                               (lmcache)\n"
            "  --skip-last-n-tokens N       lmcache decode: look up KV for prompt[:-N] (LMCache's\n"
            "                               skip_last_n_tokens; its example decoders use 1) (0)\n"
            "  --kv-buffer-mb N             libkvt buffer per transfer engine (64)\n"
            "  --kv-link-gbps G             model a link of G Gbit/s for sent KV (0 = off)\n"
            "Faults:\n"
            "  --fail-rate P --fail-status S  fail a fraction P of requests with S (500)\n"
            "  --fail-retry-after S         those failures carry Retry-After: S (0 = none; what\n"
            "                               a load balancer in front of an engine sends)\n"
            "  --fail-in-front              those failures come from a proxy in front: the\n"
            "                               engine never sees the request, so a decode does not\n"
            "                               have the prefill free the KV the request names\n"
            "  --stall-after-tokens N       streams stop after N tokens (never finish)\n"
            "  --crash-after-ms MS          die MS after the first inference request\n"
            "  --kv-corrupt-rate P          corrupt a fraction P of sent KV pages\n"
            "  --fault-seed N               seed of the fault dice (1)\n"
            "KV events:\n"
            "  --kv-events-config JSON      as vLLM: {\"enable_kv_cache_events\":true,\n"
            "                               \"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\n"
            "                               \"replay_endpoint\":..,\"topic\":..}\n"
            "  --kv-events-layout L         current (vLLM today: an array batch of map events;\n"
            "                               default), map (a map batch) or array (older)\n");
}

enum {
    O_ROLE = 256,
    O_HOST,
    O_PORT,
    O_MODEL,
    O_SERVED,
    O_TTFT,
    O_TPOT,
    O_PREFILL_MS,
    O_MAXTOK,
    O_MAXLEN,
    O_TOKENIZER,
    O_ZERO,
    O_EMIT,
    O_PTD,
    O_BATCH,
    O_BLOCK,
    O_KVBPT,
    O_KVCAP,
    O_EOS,
    O_NOPC,
    O_RECCAP,
    O_RECTOK,
    O_NORETIDS,
    O_KVHOST,
    O_KVPORT,
    O_BOOT,
    O_DPSIZE,
    O_KVCONN,
    O_ALLOC,
    O_INIT,
    O_ENGINE,
    O_PROXYH,
    O_PROXYP,
    O_KVMODE,
    O_LAYERS,
    O_NOLW,
    O_HOLD,
    O_NIXLSHAPE,
    O_NIXLSTOP,
    O_LMCCHUNK,
    O_LMCRECV,
    O_KVWAIT,
    O_KVALLOCTTL,
    O_KVALLOCQUOTA,
    O_KVBUF,
    O_KVLINK,
    O_FAILRATE,
    O_FAILSTATUS,
    O_FAILRETRYAFTER,
    O_FAILINFRONT,
    O_STALL,
    O_CRASH,
    O_CORRUPT,
    O_FSEED,
    O_KVEVCFG,
    O_KVEVLAYOUT,
    O_SKIPLAST,
    O_KVOFFSIZE,
    O_KVOFFBLOCKS,
    O_KVOFFBACKEND,
    O_KVOFFCOST,
    O_MNBT,
    O_STEPSEQ,
    O_STEPKTOK,
    O_SPEED,
    O_PSPEED,
    O_DSPEED,
    O_TIMING,
    O_HELP,
};

static const struct option opts[] = {
    {"role", required_argument, 0, O_ROLE},
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"model", required_argument, 0, O_MODEL},
    {"served-model-name", required_argument, 0, O_SERVED},
    {"ttft-ms", required_argument, 0, O_TTFT},
    {"tpot-ms", required_argument, 0, O_TPOT},
    {"prefill-ms-per-token", required_argument, 0, O_PREFILL_MS},
    {"max-tokens-default", required_argument, 0, O_MAXTOK},
    {"max-model-len", required_argument, 0, O_MAXLEN},
    {"tokenizer", required_argument, 0, O_TOKENIZER},
    {"zero-delay", no_argument, 0, O_ZERO},
    {"emit-timestamps", no_argument, 0, O_EMIT},
    {"enable-prompt-tokens-details", no_argument, 0, O_PTD},
    {"max-batch", required_argument, 0, O_BATCH},
    {"max-num-seqs", required_argument, 0, O_BATCH},
    {"max-num-batched-tokens", required_argument, 0, O_MNBT},
    {"step-ms-per-seq", required_argument, 0, O_STEPSEQ},
    {"step-ms-per-ktoken", required_argument, 0, O_STEPKTOK},
    {"speed", required_argument, 0, O_SPEED},
    {"prefill-speed", required_argument, 0, O_PSPEED},
    {"decode-speed", required_argument, 0, O_DSPEED},
    {"timing", required_argument, 0, O_TIMING},
    {"block-size", required_argument, 0, O_BLOCK},
    {"kv-bytes-per-token", required_argument, 0, O_KVBPT},
    {"kv-capacity-tokens", required_argument, 0, O_KVCAP},
    {"eos-period", required_argument, 0, O_EOS},
    {"no-prefix-cache", no_argument, 0, O_NOPC},
    {"record-capacity", required_argument, 0, O_RECCAP},
    {"record-tokenize", no_argument, 0, O_RECTOK},
    {"no-return-token-ids", no_argument, 0, O_NORETIDS},
    {"kv-host", required_argument, 0, O_KVHOST},
    {"kv-port", required_argument, 0, O_KVPORT},
    {"bootstrap-port", required_argument, 0, O_BOOT},
    {"dp-size", required_argument, 0, O_DPSIZE},
    {"kv-connector", required_argument, 0, O_KVCONN},
    {"alloc-port", required_argument, 0, O_ALLOC},
    {"init-port", required_argument, 0, O_INIT},
    {"engine-id", required_argument, 0, O_ENGINE},
    {"proxy-host", required_argument, 0, O_PROXYH},
    {"proxy-port", required_argument, 0, O_PROXYP},
    {"kv-mode", required_argument, 0, O_KVMODE},
    {"layers", required_argument, 0, O_LAYERS},
    {"no-layerwise", no_argument, 0, O_NOLW},
    {"kv-hold-timeout-ms", required_argument, 0, O_HOLD},
    {"nixl-shape", required_argument, 0, O_NIXLSHAPE},
    {"nixl-stopped-prefill", required_argument, 0, O_NIXLSTOP},
    {"lmcache-chunk-size", required_argument, 0, O_LMCCHUNK},
    {"lmcache-receiver", required_argument, 0, O_LMCRECV},
    {"kv-wait-timeout-ms", required_argument, 0, O_KVWAIT},
    {"kv-alloc-ttl-ms", required_argument, 0, O_KVALLOCTTL},
    {"kv-alloc-quota", required_argument, 0, O_KVALLOCQUOTA},
    {"skip-last-n-tokens", required_argument, 0, O_SKIPLAST},
    {"kv-buffer-mb", required_argument, 0, O_KVBUF},
    {"kv-link-gbps", required_argument, 0, O_KVLINK},
    {"fail-rate", required_argument, 0, O_FAILRATE},
    {"fail-status", required_argument, 0, O_FAILSTATUS},
    {"fail-retry-after", required_argument, 0, O_FAILRETRYAFTER},
    {"fail-in-front", no_argument, 0, O_FAILINFRONT},
    {"stall-after-tokens", required_argument, 0, O_STALL},
    {"crash-after-ms", required_argument, 0, O_CRASH},
    {"kv-corrupt-rate", required_argument, 0, O_CORRUPT},
    {"fault-seed", required_argument, 0, O_FSEED},
    {"kv-events-config", required_argument, 0, O_KVEVCFG},
    {"kv-events-layout", required_argument, 0, O_KVEVLAYOUT},
    {"kv-offloading-size", required_argument, 0, O_KVOFFSIZE},
    {"kv-offloading-blocks", required_argument, 0, O_KVOFFBLOCKS},
    {"kv-offloading-backend", required_argument, 0, O_KVOFFBACKEND},
    {"kv-offloading-load-cost", required_argument, 0, O_KVOFFCOST},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static int parse_long(const char *name, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "pdgw-sim: --%s: '%s' is not an integer in [%ld, %ld]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *name, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "pdgw-sim: --%s: '%s' is not a number in [%g, %g]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_ports(const char *name, const char *s, int *ports, int *n)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (*n >= SIM_MAX_TP) {
            fprintf(stderr, "pdgw-sim: --%s: at most %d ports\n", name, SIM_MAX_TP);
            return -1;
        }
        if (parse_long(name, tok, 1, 65535, &v))
            return -1;
        ports[(*n)++] = (int)v;
    }
    if (*n == 0) {
        fprintf(stderr, "pdgw-sim: --%s: empty port list\n", name);
        return -1;
    }
    return 0;
}

static int copy_str(const char *name, char *dst, size_t cap, const char *s)
{
    if (strlen(s) >= cap || !*s) {
        fprintf(stderr, "pdgw-sim: --%s: value empty or longer than %zu\n", name, cap - 1);
        return -1;
    }
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

#define OPT_NOT_MINE 2 /* an option group's answer for another group's option */

/* Identity and HTTP front end of the engine. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_engine_opt(int c, const char *name, int argc, char **argv, sim_config_t *cfg)
{
    long v;

    switch (c) {
    case O_ROLE:
        if (!strcmp(optarg, "both"))
            cfg->role = SIM_ROLE_BOTH;
        else if (!strcmp(optarg, "prefill"))
            cfg->role = SIM_ROLE_PREFILL;
        else if (!strcmp(optarg, "decode"))
            cfg->role = SIM_ROLE_DECODE;
        else {
            fprintf(stderr, "pdgw-sim: --role: '%s' is not both|prefill|decode\n", optarg);
            return -1;
        }
        break;
    case O_HOST:
        if (copy_str(name, cfg->host, sizeof(cfg->host), optarg))
            return -1;
        break;
    case O_PORT:
        if (parse_long(name, optarg, 0, 65535, &v))
            return -1;
        cfg->port = (int)v;
        break;
    case O_MODEL:
        if (copy_str(name, cfg->model, sizeof(cfg->model), optarg))
            return -1;
        break;
    case O_SERVED:
        /* nargs="+" as vLLM's argument parser takes it: the following words too */
        cfg->n_served = 0;
        for (const char *n = optarg; n; n = NULL) {
            if (copy_str(name, cfg->served[cfg->n_served++], sizeof(cfg->served[0]), n))
                return -1;
            while (optind < argc && argv[optind][0] != '-' && cfg->n_served < SIM_MAX_SERVED)
                if (copy_str(name, cfg->served[cfg->n_served++], sizeof(cfg->served[0]),
                             argv[optind++]))
                    return -1;
        }
        break;
    case O_DPSIZE:
        if (parse_long(name, optarg, 1, 64, &v))
            return -1;
        cfg->dp_size = (int)v;
        cfg->dp_size_set = 1;
        break;
    case O_RECCAP:
        if (parse_long(name, optarg, 0, 1 << 20, &v))
            return -1;
        cfg->record_capacity = (int)v;
        break;
    case O_RECTOK:
        cfg->record_tokenize = 1;
        break;
    case O_NORETIDS:
        cfg->no_return_token_ids = 1;
        break;
    case O_ZERO:
        cfg->zero_delay = 1;
        break;
    case O_EMIT:
        cfg->emit_timestamps = 1;
        break;
    case O_PTD:
        cfg->prompt_tokens_details = 1;
        break;
    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

/* Timing and capacity model of the engine. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_model_opt(int c, const char *name, sim_config_t *cfg)
{
    long v;

    switch (c) {
    case O_TTFT:
        if (parse_double(name, optarg, 0, 3600000, &cfg->ttft_ms))
            return -1;
        break;
    case O_TPOT:
        if (parse_double(name, optarg, 0, 3600000, &cfg->tpot_ms))
            return -1;
        break;
    case O_PREFILL_MS:
        if (parse_double(name, optarg, 0, 60000, &cfg->prefill_ms_per_token))
            return -1;
        break;
    case O_MAXTOK:
        if (parse_long(name, optarg, 1, 1 << 20, &v))
            return -1;
        cfg->max_tokens_default = (int)v;
        break;
    case O_MAXLEN:
        if (parse_long(name, optarg, 2, 1 << 24, &v))
            return -1;
        cfg->max_model_len = (int)v;
        break;
    case O_TOKENIZER:
        cfg->tokenizer = optarg;
        break;
    case O_BATCH:
        if (parse_long(name, optarg, 1, 1 << 20, &v))
            return -1;
        cfg->max_batch = (int)v;
        break;
    case O_MNBT:
        if (parse_long(name, optarg, 1, 1 << 24, &v))
            return -1;
        cfg->max_num_batched_tokens = (int)v;
        break;
    case O_STEPSEQ:
        if (parse_double(name, optarg, 0, 3600000, &cfg->step_ms_per_seq))
            return -1;
        break;
    case O_STEPKTOK:
        if (parse_double(name, optarg, 0, 3600000, &cfg->step_ms_per_ktoken))
            return -1;
        break;
    case O_SPEED:
        if (parse_double(name, optarg, 0.001, 1000, &cfg->speed))
            return -1;
        break;
    case O_PSPEED:
        if (parse_double(name, optarg, 0.001, 1000, &cfg->prefill_speed))
            return -1;
        break;
    case O_DSPEED:
        if (parse_double(name, optarg, 0.001, 1000, &cfg->decode_speed))
            return -1;
        break;
    case O_TIMING:
        if (!strcmp(optarg, "steps")) {
            cfg->timing_per_request = 0;
        } else if (!strcmp(optarg, "per-request")) {
            cfg->timing_per_request = 1;
        } else {
            fprintf(stderr, "pdgw-sim: --timing must be steps or per-request, not '%s'\n", optarg);
            return -1;
        }
        break;
    case O_BLOCK:
        if (parse_long(name, optarg, 1, 4096, &v))
            return -1;
        cfg->block_size = (int)v;
        break;
    case O_KVBPT:
        if (parse_long(name, optarg, 1, 1 << 24, &v))
            return -1;
        cfg->kv_bytes_per_token = (int)v;
        break;
    case O_KVCAP:
        if (parse_long(name, optarg, 1, 1 << 28, &v))
            return -1;
        cfg->kv_capacity_tokens = (int)v;
        break;
    case O_EOS:
        if (parse_long(name, optarg, 0, 1 << 30, &v))
            return -1;
        cfg->eos_period = (int)v;
        break;
    case O_NOPC:
        cfg->no_prefix_cache = 1;
        break;
    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

/* The CPU offload tier and KV events. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_offload_opt(int c, const char *name, sim_config_t *cfg)
{
    long v;

    switch (c) {
    case O_KVOFFSIZE:
        if (parse_double(name, optarg, 0, 65536, &cfg->kv_offloading_size_gib))
            return -1;
        break;
    case O_KVOFFBLOCKS:
        if (parse_long(name, optarg, 0, 1 << 22, &v))
            return -1;
        cfg->kv_offloading_blocks = (int)v;
        break;
    case O_KVOFFBACKEND:
        /* vLLM: native | lmcache; LMCache's CPU tier is not simulated */
        if (strcmp(optarg, "native") != 0) {
            fprintf(stderr, "pdgw-sim: --kv-offloading-backend: only native is simulated\n");
            return -1;
        }
        break;
    case O_KVOFFCOST:
        if (parse_double(name, optarg, 0, 1, &cfg->kv_offloading_load_cost))
            return -1;
        break;
    case O_KVEVCFG:
        cfg->kv_events_config = optarg;
        break;
    case O_KVEVLAYOUT:
        cfg->kv_events_layout = optarg;
        break;
    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

/* KV transfer endpoints and connector. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_kv_endpoint_opt(int c, const char *name, sim_config_t *cfg)
{
    long v;

    switch (c) {
    case O_KVHOST:
        if (copy_str(name, cfg->kv_host, sizeof(cfg->kv_host), optarg))
            return -1;
        break;
    case O_KVPORT:
        if (parse_long(name, optarg, 1, 65535, &v))
            return -1;
        cfg->kv_port = (int)v;
        break;
    case O_BOOT:
        if (parse_long(name, optarg, 1, 65535, &v))
            return -1;
        cfg->bootstrap_port = (int)v;
        break;
    case O_KVCONN:
        if (!strcmp(optarg, "mooncake")) {
            cfg->mooncake_prefill = 1;
        } else if (strcmp(optarg, "nixl")) {
            fprintf(stderr, "pdgw-sim: --kv-connector must be nixl or mooncake\n");
            return -1;
        }
        break;
    case O_ALLOC:
        if (parse_ports(name, optarg, cfg->alloc_ports, &cfg->n_alloc_ports))
            return -1;
        break;
    case O_INIT:
        if (parse_ports(name, optarg, cfg->init_ports, &cfg->n_init_ports))
            return -1;
        break;
    case O_ENGINE:
        if (copy_str(name, cfg->engine_id, sizeof(cfg->engine_id), optarg))
            return -1;
        break;
    case O_PROXYH:
        if (copy_str(name, cfg->proxy_host, sizeof(cfg->proxy_host), optarg))
            return -1;
        break;
    case O_PROXYP:
        if (parse_long(name, optarg, 1, 65535, &v))
            return -1;
        cfg->proxy_port = (int)v;
        break;
    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

/* KV transfer behaviour and its timing. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_kv_transfer_opt(int c, const char *name, sim_config_t *cfg)
{
    long v;

    switch (c) {
    case O_KVMODE:
        if (!strcmp(optarg, "push"))
            cfg->kv_mode = SIM_KV_MODE_PUSH;
        else if (!strcmp(optarg, "pull-eager"))
            cfg->kv_mode = SIM_KV_MODE_PULL_EAGER;
        else if (!strcmp(optarg, "pull-delay"))
            cfg->kv_mode = SIM_KV_MODE_PULL_DELAY;
        else {
            fprintf(stderr, "pdgw-sim: --kv-mode: '%s' is not push|pull-eager|pull-delay\n",
                    optarg);
            return -1;
        }
        break;
    case O_LAYERS:
        if (parse_long(name, optarg, 1, 1024, &v))
            return -1;
        cfg->layers = (int)v;
        break;
    case O_NOLW:
        cfg->layerwise = 0;
        break;
    case O_HOLD:
        if (parse_long(name, optarg, 1, 86400000, &v))
            return -1;
        cfg->kv_hold_timeout_ms = (int)v;
        break;
    case O_NIXLSHAPE:
        if (!strcmp(optarg, "newest"))
            cfg->nixl_older = 0;
        else if (!strcmp(optarg, "older"))
            cfg->nixl_older = 1;
        else {
            fprintf(stderr, "pdgw-sim: --nixl-shape must be newest or older\n");
            return -1;
        }
        break;
    case O_NIXLSTOP:
        if (!strcmp(optarg, "params"))
            cfg->nixl_stop_drops = 0;
        else if (!strcmp(optarg, "null"))
            cfg->nixl_stop_drops = 1;
        else {
            fprintf(stderr, "pdgw-sim: --nixl-stopped-prefill must be params or null\n");
            return -1;
        }
        break;
    case O_LMCCHUNK:
        if (parse_long(name, optarg, 1, 65536, &v))
            return -1;
        cfg->lmcache_chunk_size = (int)v;
        break;
    case O_LMCRECV:
        if (!strcmp(optarg, "lmcache"))
            cfg->lmcache_ascend = 0;
        else if (!strcmp(optarg, "ascend"))
            cfg->lmcache_ascend = 1;
        else {
            fprintf(stderr, "pdgw-sim: --lmcache-receiver must be lmcache or ascend\n");
            return -1;
        }
        break;
    case O_KVWAIT:
        if (parse_long(name, optarg, 1, 86400000, &v))
            return -1;
        cfg->kv_wait_timeout_ms = (int)v;
        break;
    case O_KVALLOCTTL:
        if (parse_long(name, optarg, 0, 86400000, &v))
            return -1;
        cfg->kv_alloc_ttl_ms = (int)v;
        break;
    case O_KVALLOCQUOTA:
        if (parse_double(name, optarg, 0.001, 1, &cfg->kv_alloc_quota))
            return -1;
        break;
    case O_KVBUF:
        if (parse_long(name, optarg, 1, 65536, &v))
            return -1;
        cfg->kv_buffer_mb = (int)v;
        break;
    case O_KVLINK:
        if (parse_double(name, optarg, 0, 100000, &cfg->kv_link_gbps))
            return -1;
        break;
    case O_SKIPLAST:
        if (parse_long(name, optarg, 0, 1024, &v))
            return -1;
        cfg->skip_last_n_tokens = (int)v;
        break;
    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

/* Fault injection. Returns 0, -1 on error, OPT_NOT_MINE. */
static int parse_fault_opt(int c, const char *name, sim_config_t *cfg)
{
    long v;
    double d;

    switch (c) {
    case O_FAILRATE:
        if (parse_double(name, optarg, 0, 1, &cfg->fail_rate))
            return -1;
        break;
    case O_FAILSTATUS:
        if (parse_long(name, optarg, 400, 599, &v))
            return -1;
        cfg->fail_status = (int)v;
        break;
    case O_FAILINFRONT:
        cfg->fail_in_front = 1;
        break;
    case O_FAILRETRYAFTER:
        if (parse_long(name, optarg, 0, 86400, &v))
            return -1;
        cfg->fail_retry_after_s = (int)v;
        break;
    case O_STALL:
        if (parse_long(name, optarg, 0, 1 << 30, &v))
            return -1;
        cfg->stall_after_tokens = (int)v;
        break;
    case O_CRASH:
        if (parse_long(name, optarg, 0, 86400000, &v))
            return -1;
        cfg->crash_after_ms = (int)v;
        break;
    case O_CORRUPT:
        if (parse_double(name, optarg, 0, 1, &cfg->kv_corrupt_rate))
            return -1;
        break;
    case O_FSEED:
        if (parse_double(name, optarg, 0, 1e18, &d))
            return -1;
        cfg->fault_seed = (uint64_t)d;
        break;

    default:
        return OPT_NOT_MINE;
    }
    return 0;
}

static void set_defaults(sim_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->role = SIM_ROLE_BOTH;
    snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
    cfg->port = 8100;
    snprintf(cfg->model, sizeof(cfg->model), "sim-model");
    cfg->ttft_ms = 20;
    cfg->tpot_ms = 10;
    cfg->prefill_ms_per_token = 0.02;
    cfg->kv_offloading_load_cost = 0.25;
    cfg->max_tokens_default = 16;
    cfg->max_model_len = 8192;
    cfg->max_batch = 256;
    /* vLLM vllm/config/scheduler.py: SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS */
    cfg->max_num_batched_tokens = 2048;
    cfg->step_ms_per_seq = -1;
    cfg->speed = cfg->prefill_speed = cfg->decode_speed = 1;
    cfg->block_size = 16;
    cfg->kv_bytes_per_token = 1024;
    cfg->kv_capacity_tokens = 262144;
    cfg->eos_period = 64;
    cfg->record_capacity = 1024;
    cfg->layers = 4;
    cfg->layerwise = 1;
    cfg->kv_hold_timeout_ms = 30000;
    cfg->nixl_stop_drops = -1;
    cfg->lmcache_chunk_size = 256; /* LMCache lmcache/v1/config.py: chunk_size */
    cfg->kv_wait_timeout_ms = 10000;
    cfg->kv_alloc_ttl_ms = 30000;
    cfg->kv_alloc_quota = 0.5;
    cfg->dp_size = 1;
    cfg->kv_buffer_mb = 64;
    cfg->fail_status = 500;
    cfg->stall_after_tokens = -1;
    cfg->crash_after_ms = -1;
    cfg->fault_seed = 1;
}

/* Cross-option checks and the defaults that depend on other options. */
static int finish_config(sim_config_t *cfg)
{
    if (cfg->kv_bytes_per_token % cfg->layers) {
        fprintf(stderr, "pdgw-sim: --kv-bytes-per-token (%d) must be a multiple of --layers (%d)\n",
                cfg->kv_bytes_per_token, cfg->layers);
        return -1;
    }
    if (cfg->step_ms_per_seq < 0)
        cfg->step_ms_per_seq = cfg->tpot_ms / 100;
    if (cfg->step_ms_per_seq > cfg->tpot_ms) {
        fprintf(stderr,
                "pdgw-sim: --step-ms-per-seq (%g) cannot exceed --tpot-ms (%g): a lone decode's "
                "step is --tpot-ms\n",
                cfg->step_ms_per_seq, cfg->tpot_ms);
        return -1;
    }
    if (cfg->max_num_batched_tokens < cfg->max_batch && !cfg->zero_delay &&
        !cfg->timing_per_request)
        fprintf(stderr,
                "pdgw-sim: warning: --max-num-batched-tokens %d < --max-batch %d: at most %d "
                "sequences advance per step (vLLM refuses this setting)\n",
                cfg->max_num_batched_tokens, cfg->max_batch, cfg->max_num_batched_tokens);
    if (cfg->kv_capacity_tokens < cfg->block_size) {
        fprintf(stderr, "pdgw-sim: --kv-capacity-tokens must hold at least one block\n");
        return -1;
    }
    if (cfg->nixl_stop_drops < 0)
        cfg->nixl_stop_drops = cfg->nixl_older; /* the older connector dropped them */
    if (cfg->role != SIM_ROLE_BOTH) {
        /* a libkvt page holds one whole chunk of either geometry (all layers) */
        int tokens =
            cfg->block_size > cfg->lmcache_chunk_size ? cfg->block_size : cfg->lmcache_chunk_size;
        uint64_t page = (uint64_t)tokens * (uint64_t)cfg->kv_bytes_per_token;
        uint64_t buf =
            ((uint64_t)cfg->kv_buffer_mb << 20) * (uint64_t)(cfg->layerwise ? cfg->layers : 1);
        if (page > buf) {
            fprintf(stderr,
                    "pdgw-sim: a KV chunk of %d tokens (%" PRIu64 " bytes: --block-size / "
                    "--lmcache-chunk-size x --kv-bytes-per-token) does not fit the %" PRIu64
                    "-byte libkvt buffer (--kv-buffer-mb)\n",
                    tokens, page, buf);
            return -1;
        }
    }
    if (!cfg->kv_host[0]) {
        const char *h = cfg->host;
        if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::"))
            h = "127.0.0.1";
        snprintf(cfg->kv_host, sizeof(cfg->kv_host), "%s", h);
    }
    if (!cfg->engine_id[0])
        snprintf(cfg->engine_id, sizeof(cfg->engine_id), "sim-%s-%d", sim_role_name(cfg->role),
                 cfg->port);
    if (cfg->n_init_ports && cfg->n_alloc_ports && cfg->n_init_ports != cfg->n_alloc_ports) {
        fprintf(stderr, "pdgw-sim: --init-port and --alloc-port need one port per TP rank each\n");
        return -1;
    }
    return 0;
}

/* Parse argv into cfg; returns 0, 1 for --help (exit 0), -1 on error. */
int sim_config_parse(int argc, char **argv, sim_config_t *cfg)
{
    set_defaults(cfg);

    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *name = NULL;
        for (const struct option *o = opts; o->name; o++)
            if (o->val == c)
                name = o->name;
        int r = parse_engine_opt(c, name, argc, argv, cfg);
        if (r == OPT_NOT_MINE)
            r = parse_model_opt(c, name, cfg);
        if (r == OPT_NOT_MINE)
            r = parse_offload_opt(c, name, cfg);
        if (r == OPT_NOT_MINE)
            r = parse_kv_endpoint_opt(c, name, cfg);
        if (r == OPT_NOT_MINE)
            r = parse_kv_transfer_opt(c, name, cfg);
        if (r == OPT_NOT_MINE)
            r = parse_fault_opt(c, name, cfg);
        if (r == -1)
            return -1;
        if (r == 0)
            continue;
        switch (c) {
        case O_HELP:
        case 'h':
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "pdgw-sim: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return finish_config(cfg);
}

/* vLLM: the served names (--served-model-name, else the model) are the only accepted `model`
 * values; responses carry the first (vllm/entrypoints/openai/serving_models.py model_name). */
int sim_model_served(const char *name)
{
    if (sim_cfg.n_served == 0)
        return strcmp(name, sim_cfg.model) == 0;
    for (int i = 0; i < sim_cfg.n_served; i++)
        if (strcmp(name, sim_cfg.served[i]) == 0)
            return 1;
    return 0;
}

const char *sim_model_name(void)
{
    return sim_cfg.n_served ? sim_cfg.served[0] : sim_cfg.model;
}
