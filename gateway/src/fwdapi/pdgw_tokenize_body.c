/*
 * pdgw_tokenize_body.c - the body of an engine's POST /tokenize for a client's request.
 *
 * vLLM (vllm/entrypoints/serve/tokenize/protocol.py) tokenizes a chat request with the same
 * template options its chat completions take (add_generation_prompt, continue_final_message,
 * add_special_tokens, chat_template, chat_template_kwargs, media_io_kwargs,
 * mm_processor_kwargs, tools), and a completions prompt with add_special_tokens. Ids asked
 * without them differ from the request's own as soon as the client set one: tool definitions
 * missing from the prompt, a thinking switch not applied.
 */
#include "pdgw_tokenize_body.h"

#include <string.h>

json_t *pdgw_tokenize_body(const json_t *client, int chat, const json_t *prompt, const char *model)
{
    static const char *const chat_keys[] = {"add_generation_prompt",
                                            "continue_final_message",
                                            "add_special_tokens",
                                            "chat_template",
                                            "chat_template_kwargs",
                                            "media_io_kwargs",
                                            "mm_processor_kwargs",
                                            "tools",
                                            NULL};
    static const char *const text_keys[] = {"add_special_tokens", NULL};
    const char *const *keys = chat ? chat_keys : text_keys;
    json_t *b, *v;
    size_t i;

    if (chat) {
        prompt = json_object_get(client, "messages");
        if (!json_is_array(prompt) || json_array_size(prompt) == 0)
            return NULL;
    } else if (!json_is_string(prompt)) {
        return NULL;
    }
    b = json_object();
    if (b == NULL || json_object_set(b, chat ? "messages" : "prompt", (json_t *)prompt) != 0) {
        json_decref(b);
        return NULL;
    }
    /* vLLM's defaults (add_generation_prompt true) unless the client set them */
    for (i = 0; keys[i] != NULL; i++)
        if ((v = json_object_get(client, keys[i])) != NULL)
            json_object_set(b, keys[i], v);
    if (model != NULL && model[0] != '\0')
        json_object_set_new(b, "model", json_string(model));
    return b;
}
