/*
 * fuzz_validate.c - a client's request body into the gateway's parser and
 * validator (gateway/src/pdgw_validate.c): /v1/completions when byte 0 is
 * even, /v1/chat/completions when odd.
 *
 * Never a crash, over-read or leak; an accepted body yields consistent
 * results (a model name, n >= 1, owned prompt text of the stated length).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pdgw_api_kind_t kind;
    pdgw_request_info_t info;
    pdgw_api_error_t err;
    json_t *body = NULL;
    char *copy;

    if (size < 1)
        return 0;
    kind = (data[0] & 1) ? PDGW_API_CHAT_COMPLETIONS : PDGW_API_COMPLETIONS;
    copy = malloc(size - 1 ? size - 1 : 1); /* exact size: ASan sees any over-read */
    memcpy(copy, data + 1, size - 1);
    memset(&err, 0, sizeof(err));
    if (pdgw_request_parse(copy, size - 1, &body, &err) == PDGW_OK) {
        memset(&info, 0, sizeof(info));
        memset(&err, 0, sizeof(err));
        if (pdgw_request_validate(kind, body, &info, &err) == PDGW_OK) {
            if (info.model == NULL || info.n < 1 || info.n_prompts < 1 ||
                (info.prompt_text != NULL && strlen(info.prompt_text) > info.prompt_text_len))
                abort();
            pdgw_request_info_release(&info);
        }
        json_decref(body);
    }
    free(copy);
    return 0;
}
