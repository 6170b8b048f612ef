/*
 * pdgw_tokenize_body.h - the body of an engine's POST /tokenize for a client's request, so the
 * ids it answers are the ones the request itself would run on.
 */
#ifndef PDGW_TOKENIZE_BODY_H
#define PDGW_TOKENIZE_BODY_H

#include <jansson.h>

/* vLLM's TokenizeCompletionRequest / TokenizeChatRequest for the client's body <client>:
 * chat: its messages and the chat-template options it set; completions: <prompt> (one text)
 * and add_special_tokens when set; <model> when not empty. A new object, or NULL when there
 * is no such prompt (no messages, a prompt that is not one text) or no memory. */
json_t *pdgw_tokenize_body(const json_t *client, int chat, const json_t *prompt, const char *model);

#endif /* PDGW_TOKENIZE_BODY_H */
