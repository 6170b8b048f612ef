/*
 * pdgw_req_info.h - what the request object keeps of a validated body (filled by the
 * workflow's validators, pdgw_validate.h) and how client PD fields are treated: types only.
 */
#ifndef PDGW_REQ_INFO_H
#define PDGW_REQ_INFO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef enum pdgw_api_kind {
    PDGW_API_COMPLETIONS = 0,      /* POST /v1/completions */
    PDGW_API_CHAT_COMPLETIONS = 1, /* POST /v1/chat/completions */
    PDGW_API_GENERATE = 2,         /* POST /generate (SGLang native; only when the protocol
                                    * lists it in its descriptor's native_paths) */
} pdgw_api_kind_t;

/* Owned results of a successful validation; release with pdgw_request_info_release(). */
typedef struct pdgw_request_info {
    pdgw_api_kind_t kind;
    const char *model; /* borrowed from the body: valid while the body lives */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    int64_t max_tokens; /* max_completion_tokens, else max_tokens; -1 when absent */
    int64_t n;          /* 1 when absent */
    /*
     * Prompt text for prefix hashing: completions string prompt (first one of an array of
     * strings); chat: concatenation of "<role>\n<text>\n" of every message (text parts of
     * content arrays joined). NULL when the prompt is token ids. A completions prompt is
     * borrowed from the body (valid while the body lives: the prompt is held once); chat text
     * is assembled, so owned.
     */
    const char *prompt_text;
    size_t prompt_text_len;
    bool prompt_text_owned;
    /* Token ids when the completions prompt is ids (first prompt of a batch). Owned. */
    int32_t *prompt_tokens;
    size_t n_prompt_tokens;
    size_t n_prompts;          /* completions batch size (1 for chat) */
    int64_t est_prompt_tokens; /* ids count, else ceil(bytes / 4) over all prompts */
    /* Validated on the text (pdgw_request_validate_flat): the body's top-level member names
     * (pdgw_json_name_bit), so a lookup of a member it lacks reads nothing. 0 otherwise. */
    uint64_t member_names;
} pdgw_request_info_t;

/*
 * What happens to PD control fields a client put in its body (kv_transfer_params,
 * bootstrap_*, remote_*, DP ranks, ...; the list is in pdgw_validate_pd.c): only the gateway
 * may set them, since they name KV peers and transfers.
 */
typedef enum pdgw_pd_fields_mode {
    PDGW_PD_FIELDS_REJECT = 0, /* 400 naming the first one */
    PDGW_PD_FIELDS_STRIP = 1,  /* remove them all, forward the rest */
    PDGW_PD_FIELDS_PASS = 2,   /* operator opt-in, plain proxies only: forward unchanged */
} pdgw_pd_fields_mode_t;

#endif /* PDGW_REQ_INFO_H */
