/*
 * fuzz_tok_load.c - a tokenizer.json that a model repository (or whoever writes the file
 * `tokenizers` names) hands pdgw: pdtok_load_json, then encoding and decoding with whatever
 * it accepted.
 *
 * Input: the tokenizer.json text, then optionally a NUL and a text to encode (without one a
 * fixed multilingual text is encoded). Never a crash, over-read or leak; a refused file says
 * why; every id an accepted tokenizer encodes is inside its vocabulary and decodes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdtok/tokenizer.h"

static const char fixed_text[] = "Hello, world! 123 héllo 世界 🙂\n\tdef f(x): return x  ";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *sep = memchr(data, '\0', size);
    size_t json_len = sep != NULL ? (size_t)(sep - (const char *)data) : size;
    const char *text = sep != NULL ? sep + 1 : fixed_text;
    size_t text_len = sep != NULL ? size - json_len - 1 : sizeof(fixed_text) - 1;
    char err[256] = "";
    pdtok_t *tok = pdtok_load_json((const char *)data, json_len, err, sizeof(err));
    pdtok_ids_t ids = {0};

    if (tok == NULL) {
        if (err[0] == '\0')
            abort(); /* a refusal always says why */
        return 0;
    }
    for (int special = 0; special < 2; special++) {
        ids.len = 0;
        if (pdtok_encode(tok, text, text_len, special != 0, &ids) != PDTOK_OK)
            continue;
        for (size_t i = 0; i < ids.len; i++)
            if (ids.ids[i] < 0 || (size_t)ids.ids[i] >= pdtok_vocab_size(tok))
                abort(); /* an id outside the vocabulary */
        char *out = NULL;
        size_t out_len = 0;
        if (pdtok_decode(tok, ids.ids, ids.len, special == 0, &out, &out_len) == PDTOK_OK &&
            out != NULL && strlen(out) > out_len)
            abort(); /* the length it reports is the text's */
        free(out);
    }
    pdtok_ids_free(&ids);
    pdtok_free(tok);
    return 0;
}
