/*
 * pdgw_validate_pd.c - the client may not steer KV: PD control fields in a client body.
 *
 * Engines behind the gateway take the PD control fields from the request body: vLLM's
 * connectors read `kv_transfer_params` (also when it arrives inside `vllm_xargs`, which vLLM
 * uses as the base of SamplingParams.extra_args), SGLang reads the top-level bootstrap_* and
 * DP-rank fields. A client that sets them makes an engine connect to an address the client
 * chose, or read KV that belongs to another request. Only the gateway (through its forwarder)
 * may set them, so they are refused (or stripped) before anything is sent.
 *
 * Fields, from upstream's request classes:
 *   vLLM  vllm/entrypoints/openai/completion/protocol.py, chat_completion/protocol.py
 *         (formerly vllm/entrypoints/openai/protocol.py): kv_transfer_params,
 *         ec_transfer_params, vllm_xargs (merged into extra_args, so its
 *         kv_transfer_params / ec_transfer_params keys count too);
 *   SGLang python/sglang/srt/managers/io_struct.py (GenerateReqInput) and
 *         python/sglang/srt/entrypoints/openai/protocol.py: bootstrap_host, bootstrap_port,
 *         bootstrap_room, bootstrap_pair_key, decode_tp_size, routed_dp_rank,
 *         disagg_prefill_dp_rank, data_parallel_rank (deprecated alias of routed_dp_rank),
 *         kv_router_hint (names a peer's control endpoint for KV reuse);
 *   the keys of kv_transfer_params that a client could also try at the top level
 *         (transfer_id, disagg_spec, do_remote_prefill, do_remote_decode, remote_*).
 */
#include "pdgw_validate.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct pd_rule {
    const char *name; /* exact key, or a prefix when it ends in '*' */
    const char *why;  /* for the error message */
} pd_rule_t;

static const pd_rule_t pd_rules[] = {
    {"kv_transfer_params", "names the KV transfer"},
    {"ec_transfer_params", "names the encoder-cache transfer"},
    {"disagg_spec", "names the KV receiver"},
    {"transfer_id", "names the KV transfer"},
    {"do_remote_prefill", "selects the PD role"},
    {"do_remote_decode", "selects the PD role"},
    {"bootstrap_*", "names the KV bootstrap server"},
    {"decode_tp_size", "shapes the KV transfer"},
    {"routed_dp_rank", "pins an engine DP rank"},
    {"disagg_prefill_dp_rank", "names the prefill DP rank holding the KV"},
    {"data_parallel_rank", "pins an engine DP rank"},
    {"kv_router_hint", "names a peer holding reusable KV"},
    {"remote_*", "names the KV peer"},
};

/* The member vLLM merges into SamplingParams.extra_args (its keys are checked too). */
static const char xargs_member[] = "vllm_xargs";

/* Keys of vllm_xargs that vLLM lifts into the request's KV parameters, and their rule names. */
static const char *const xargs_keys[][2] = {
    {"kv_transfer_params", "vllm_xargs.kv_transfer_params"},
    {"ec_transfer_params", "vllm_xargs.ec_transfer_params"},
};

static bool rule_match(const char *rule, const char *key)
{
    size_t n;
    if (rule[0] != key[0]) /* every body key is checked against every rule */
        return false;
    n = strlen(rule);
    if (n > 0 && rule[n - 1] == '*')
        return strncmp(rule, key, n - 1) == 0;
    return strcmp(rule, key) == 0;
}

/* The first letters of the built-in rules: every body key is checked, and most keys (model,
 * prompt, max_tokens, ...) start with none of them. */
static bool rule_initial[256];
static pthread_once_t rule_initials_once = PTHREAD_ONCE_INIT;

static void rule_initials_init(void)
{
    for (size_t i = 0; i < sizeof(pd_rules) / sizeof(pd_rules[0]); i++)
        rule_initial[(unsigned char)pd_rules[i].name[0]] = true;
}

/* The rule (built-in or the forwarder's) that <key> falls under, or NULL. */
static const char *match_key(const char *key, const char *const *extra, const char **why)
{
    (void)pthread_once(&rule_initials_once, rule_initials_init);
    for (size_t i = 0;
         rule_initial[(unsigned char)key[0]] && i < sizeof(pd_rules) / sizeof(pd_rules[0]); i++) {
        if (rule_match(pd_rules[i].name, key)) {
            *why = pd_rules[i].why;
            return pd_rules[i].name;
        }
    }
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++) {
        if (extra[i][0] != '\0' && rule_match(extra[i], key)) {
            *why = "is owned by the gateway's PD protocol";
            return extra[i];
        }
    }
    return NULL;
}

static void hit_add(pdgw_pd_fields_result_t *res, const char *rule, const char *param)
{
    if (res->n_hits == 0)
        snprintf(res->first_param, sizeof(res->first_param), "%s", param);
    if (res->n_hits < PDGW_PD_FIELDS_MAX_HITS)
        res->rules[res->n_hits] = rule;
    res->n_hits++;
}

bool pdgw_pd_field_named(const char *key, const char *const *extra)
{
    const char *why;
    return match_key(key, extra, &why) != NULL ||
           (key[0] == xargs_member[0] && strcmp(key, xargs_member) == 0);
}

pdgw_status_t pdgw_request_pd_fields(json_t *body, pdgw_pd_fields_mode_t mode,
                                     const char *const *extra, pdgw_pd_fields_result_t *res,
                                     pdgw_api_error_t *err)
{
    const char *key, *why = "";
    const char *first_why = NULL;
    json_t *v;
    void *tmp;

    memset(res, 0, sizeof(*res));
    if (!json_is_object(body))
        return PDGW_OK;
    json_object_foreach_safe(body, tmp, key, v)
    {
        const char *rule = match_key(key, extra, &why);
        if (rule == NULL)
            continue;
        if (first_why == NULL)
            first_why = why;
        hit_add(res, rule, key);
        if (mode == PDGW_PD_FIELDS_STRIP)
            json_object_del(body, key);
    }
    json_t *xargs = json_object_get(body, xargs_member);
    if (json_is_object(xargs)) {
        for (size_t i = 0; i < sizeof(xargs_keys) / sizeof(xargs_keys[0]); i++) {
            if (json_object_get(xargs, xargs_keys[i][0]) == NULL)
                continue;
            if (first_why == NULL)
                first_why = "names the KV transfer";
            hit_add(res, xargs_keys[i][1], xargs_keys[i][1]);
            if (mode == PDGW_PD_FIELDS_STRIP)
                json_object_del(xargs, xargs_keys[i][0]);
        }
    }
    if (res->n_hits > 0 && mode == PDGW_PD_FIELDS_REJECT) {
        pdgw_api_error_set(err, PDGW_API_ERR_BAD_REQUEST, res->first_param,
                           "'%s' may not be set by clients: it %s, which only the gateway "
                           "decides.",
                           res->first_param, first_why ? first_why : "controls PD");
        pdgw_api_error_set_code(err, "forbidden_parameter");
        return PDGW_ERR_INVALID;
    }
    return PDGW_OK;
}
