/*
 * fwd_lmcache_int.h - pieces of the lmcache forwarder shared by its files: the tokenize
 * calls (fwd_lmcache_tok.c) and the first_tok flow's bodies and answer rewriting
 * (fwd_lmcache_flow.c), driven by fwd_lmcache.c.
 */
#ifndef FWD_LMCACHE_INT_H
#define FWD_LMCACHE_INT_H

#include "fwd_pd.h"

/* ---- tokenize call (fwd_lmcache_tok.c) ---- */
typedef pdgw_fwd_call_t lmc_tok_job_t;

/* POST <inst>/tokenize with <body> (stolen) on the request's worker; the request's waker runs
 * the gate again when it ends. NULL when it cannot start. Release with lmc_tok_release. */
lmc_tok_job_t *lmc_tok_start(const pdgw_fwd_request_t *req, const pdgw_instance_t *inst,
                             json_t *body, int64_t timeout_ms);
/* 0 pending; 1 done (*tokens = new reference to the id list); -1 failed (msg filled). */
int lmc_tok_result(const lmc_tok_job_t *j, json_t **tokens, char *msg, size_t cap);
void lmc_tok_release(lmc_tok_job_t *j);

/* ---- first_tok flow (fwd_lmcache_flow.c) ---- */

/* The /tokenize body for the client's request (NULL when the prompt needs none: it already
 * is a list of token ids, given in *ids as text). Token ids are held as text throughout
 * (forwarder.h pdgw_fwd_ids_text_*): written into both legs, never parsed into integers. */
json_t *lmc_flow_tokenize_body(const pdgw_fwd_request_t *req, json_t **ids);
/* Prefill leg: client body with prompt = ids, max_tokens 1, stream false, no messages,
 * stream_options or min_tokens, kv_transfer_params = {ret_first_tok: true, disagg_spec: spec
 * (stolen)}. With <ids> NULL the prefill keeps the client's text prompt. <ask_ids> adds
 * return_token_ids: vLLM answers the prompt's ids as it ran them, after its own truncation
 * (choices[0].prompt_token_ids). */
json_t *lmc_flow_prefill_body(const pdgw_fwd_request_t *req, const json_t *ids, int ask_ids,
                              json_t *spec);
/* Whether the client's prompt is one text (a completions request) that can go to the prefill
 * as it is, saving the /tokenize call. */
int lmc_flow_prompt_is_text(const pdgw_fwd_request_t *req);
/* Whether the first_tok flow can give the request its whole answer. It writes the prefill's
 * one token as text in front of the decode's answer, so an answer that also holds the prompt
 * (echo), several choices (n, best_of, beam search), logprobs or a grammar (structured
 * outputs) would come out wrong: the prompt twice, every choice with the same first token, no
 * logprobs for the first token, a grammar started again after it. Chat requests with tools
 * (or a tool_choice that forces one) or media need the chat endpoint, which the flow's
 * completions legs never reach. */
int lmc_flow_answer_fits(const pdgw_fwd_request_t *req);
/* Whether the client asked the engine to truncate the prompt (truncate_prompt_tokens). */
int lmc_flow_truncates(const pdgw_fwd_request_t *req);

/* What the prefill answered, kept for the client's answer. */
typedef struct lmc_head {
    json_int_t first_tok;
    int done;            /* finish_reason "stop": the first token ended the answer */
    json_t *usage;       /* the prefill's usage */
    json_t *stop_reason; /* when done */
    char *text;          /* the first token's text */
    char *id;
    char *model;
    json_int_t created;
    int sent; /* stream: the head events went out */
} lmc_head_t;

/* Decode leg (LMCache's proxy): client body with prompt = ids + [first_tok], max_tokens - 1
 * (max_completion_tokens too), no kv_transfer_params, no messages; one token when the
 * prefill's answer already ended (head->done). <ids_cut>: the ids are the prefill's
 * prompt_token_ids, already truncated (truncate_prompt_tokens is dropped). */
json_t *lmc_flow_decode_body(const pdgw_fwd_request_t *req, const json_t *ids, int ids_cut,
                             const lmc_head_t *head);

/* Read first_tok and the head from a prefill answer; -1 when kv_transfer_params.first_tok is
 * missing (msg filled). */
int lmc_flow_read_prefill(const json_t *resp, lmc_head_t *head, char *msg, size_t cap);
/* The same on the answer's text, with only its small members parsed; with <ids> also
 * choices[0].prompt_token_ids as ids text (*ids NULL when there are none). */
int lmc_flow_read_prefill_text(const char *text, size_t len, lmc_head_t *head, json_t **ids,
                               char *msg, size_t cap);
void lmc_head_clear(lmc_head_t *head);
/* The client's answer from one decode event / the decode's whole answer (pdgw_fwd_ops_t
 * rewrite_decode). */
json_t *lmc_flow_rewrite(lmc_head_t *head, const pdgw_fwd_request_t *req, int sse,
                         const json_t *resp);
/* The events a stream starts with (a new array of objects). */
json_t *lmc_flow_head_events(const lmc_head_t *h, int chat);

/* ---- the same rewrite on the answer's text (fwd_lmcache_text.c) ---- */

/* pdgw_fwd_ops_t rewrite_decode_text for the first_tok flow: 1 written into <out>, 0
 * unchanged, -1 lmc_flow_rewrite must do it (chat, an answer the first token ended, text it
 * does not recognise). */
int lmc_flow_rewrite_text(lmc_head_t *head, const pdgw_fwd_request_t *req, int sse,
                          const char *text, size_t len, pdgw_fwd_text_t *out);

#endif /* FWD_LMCACHE_INT_H */
