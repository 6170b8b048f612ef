/*
 * fuzz_validate.c - a client's request body into the gateway's parser and
 * validator (gateway/src/workflow/pdgw_validate.c): /v1/completions when byte 0 is
 * even, /v1/chat/completions when odd.
 *
 * Never a crash, over-read or leak; an accepted body yields consistent
 * results (a model name, n >= 1, owned prompt text of the stated length).
 * The text walk (pdgw_request_validate_flat) takes no body the tree refuses
 * or finds a PD control field in, and reads the same request info.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_validate.h"

/* The request info of the text walk and of the tree agree. */
static bool same_info(const pdgw_request_info_t *a, const pdgw_request_info_t *b)
{
    return strcmp(a->model, b->model) == 0 && a->stream == b->stream &&
           a->include_usage == b->include_usage && a->max_tokens == b->max_tokens && a->n == b->n &&
           a->n_prompts == b->n_prompts && a->est_prompt_tokens == b->est_prompt_tokens &&
           b->prompt_text != NULL && a->prompt_text_len == b->prompt_text_len &&
           memcmp(a->prompt_text, b->prompt_text, a->prompt_text_len) == 0 &&
           a->prompt_tokens == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pdgw_api_kind_t kind;
    pdgw_request_info_t info;
    pdgw_api_error_t err;
    json_t *body = NULL;
    char *copy;
    pdgw_request_info_t flat;
    pdgw_pd_fields_result_t pd;
    char model[128];
    bool flat_ok;

    if (size < 1)
        return 0;
    kind = (data[0] & 1) ? PDGW_API_CHAT_COMPLETIONS : PDGW_API_COMPLETIONS;
    copy = malloc(size - 1 ? size - 1 : 1); /* exact size: ASan sees any over-read */
    memcpy(copy, data + 1, size - 1);
    memset(&err, 0, sizeof(err));
    flat_ok = pdgw_request_validate_flat(kind, copy, size - 1, NULL, &flat, model, sizeof(model));
    if (pdgw_request_parse(copy, size - 1, &body, &err) == PDGW_OK) {
        memset(&info, 0, sizeof(info));
        memset(&err, 0, sizeof(err));
        if (pdgw_request_validate(kind, body, &info, &err) == PDGW_OK) {
            if (info.model == NULL || info.n < 1 || info.n_prompts < 1 ||
                (info.prompt_text != NULL && strlen(info.prompt_text) > info.prompt_text_len))
                abort();
            if (flat_ok && !same_info(&flat, &info))
                abort();
            pdgw_request_info_release(&info);
        } else if (flat_ok) {
            abort(); /* taken on its text, refused on the tree */
        }
        if (flat_ok &&
            (pdgw_request_pd_fields(body, PDGW_PD_FIELDS_PASS, NULL, &pd, &err) != PDGW_OK ||
             pd.n_hits != 0))
            abort();
        json_decref(body);
    } else if (flat_ok) {
        abort();
    }
    free(copy);
    return 0;
}
