/*
 * pdgw_validate.h - validation of OpenAI completions / chat completions request bodies and
 * extraction of what scheduling needs (stream flag, prompt for prefix hashing, token
 * estimates).
 *
 * The body is parsed once by the caller (pdgw_request_parse is offered for that); the
 * validator only reads the json_t. Rules follow what vLLM's OpenAI server accepts:
 *   - body is an object; "model" is a required non-empty string;
 *   - completions: "prompt" required: string | array of strings | array of ints (token ids)
 *     | array of arrays of ints; non-empty;
 *   - chat: "messages" required non-empty array of objects, each with a string "role" and a
 *     "content" that is a string, an array of content parts (objects with a string "type"),
 *     or null (assistant messages with tool_calls / tool messages);
 *   - optional fields, when present and not null, must have the right type/range:
 *     stream, echo, ignore_eos, logprobs(chat), skip_special_tokens: bool;
 *     max_tokens, max_completion_tokens: int >= 1; n, best_of: int >= 1; min_tokens: int >= 0;
 *     temperature: number >= 0; top_p: number in (0,1]; top_k: int >= -1;
 *     min_p: number 0..1; presence_penalty, frequency_penalty: number -2..2;
 *     repetition_penalty: number > 0; seed: int; stop: string | array of strings;
 *     stop_token_ids: array of ints; stream_options: object (only with stream=true) whose
 *     include_usage / continuous_usage_stats are bools; logprobs (completions): int >= 0;
 *     top_logprobs (chat): int >= 0; user, suffix: string; logit_bias: object of numbers;
 *     response_format: object with a string "type"; tool_choice: string | object;
 *     tools: array of objects; metadata: object.
 *   Limits an engine may configure (max_logprobs, n) are left to the engine.
 * Errors are 400 invalid_request_error with "param" naming the field ("messages[1].role",
 * "prompt[2]", "stream_options.include_usage") and code "invalid_type",
 * "missing_required_parameter" or "invalid_value".
 */
#ifndef PDGW_VALIDATE_H
#define PDGW_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pdgw_errors.h"
#include "pdgw_req_info.h" /* the types this fills */

/*
 * Parse <len> bytes of <body> as a JSON object. On success *out is a new reference.
 * Otherwise fills <err> (400, code "invalid_json", message with line/column) and returns
 * PDGW_ERR_PARSE.
 */
pdgw_status_t pdgw_request_parse(const char *body, size_t len, json_t **out, pdgw_api_error_t *err);

/*
 * Validate <body> (borrowed) as a request of <kind>. PDGW_OK and *info filled (caller
 * releases it), or PDGW_ERR_INVALID with <err> filled (*info untouched), or PDGW_ERR_NOMEM.
 */
pdgw_status_t pdgw_request_validate(pdgw_api_kind_t kind, const json_t *body,
                                    pdgw_request_info_t *info, pdgw_api_error_t *err);

/*
 * The same decision for a /v1/completions body taken on its text, without a tree
 * (pdgw_validate_flat.c): true when pdgw_request_parse, pdgw_request_validate and
 * pdgw_request_pd_fields (with <client_fields>) would all accept <body> and find no PD field;
 * then *info is filled (it owns nothing; info->model is <model>, a copy of up to
 * <model_cap> - 1 bytes, and the prompt text is borrowed from <body>). false = not decided
 * here (any other body, also every one they would refuse): take the tree's way.
 */
bool pdgw_request_validate_flat(pdgw_api_kind_t kind, const char *body, size_t len,
                                const char *const *client_fields, pdgw_request_info_t *info,
                                char *model, size_t model_cap);

/* Free what <info> owns; the struct may be reused. NULL-safe. */
void pdgw_request_info_release(pdgw_request_info_t *info);

/* "/v1/completions" / "/v1/chat/completions" -> kind. PDGW_ERR_NOT_FOUND for other paths. */
pdgw_status_t pdgw_api_kind_from_path(const char *path, pdgw_api_kind_t *out);

/* ---------------------------------------------------------------- PD control fields */

#define PDGW_PD_FIELDS_MAX_HITS 32
typedef struct pdgw_pd_fields_result {
    size_t n_hits;                              /* fields found (all, also beyond rules[]) */
    const char *rules[PDGW_PD_FIELDS_MAX_HITS]; /* matching rule names (static, bounded set) */
    char first_param[PDGW_API_ERR_PARAM_MAX];   /* "bootstrap_host", "vllm_xargs.kv_..." */
} pdgw_pd_fields_result_t;

/*
 * Look for PD control fields in <body> (the built-in list plus <extra>, the forwarder's
 * NULL-terminated list, names ending in '*' are prefixes). REJECT: PDGW_ERR_INVALID with a
 * 400 in <err> naming the field when one is present. STRIP: deletes them from <body>.
 * PASS: only counts. <res> always says what was found.
 */
pdgw_status_t pdgw_request_pd_fields(json_t *body, pdgw_pd_fields_mode_t mode,
                                     const char *const *extra, pdgw_pd_fields_result_t *res,
                                     pdgw_api_error_t *err);

/* Is the top-level member <key> one pdgw_request_pd_fields looks at (a PD control field of
 * the built-in list or <extra>, or vllm_xargs, whose keys may be)? */
bool pdgw_pd_field_named(const char *key, const char *const *extra);

#endif /* PDGW_VALIDATE_H */
