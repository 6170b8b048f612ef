/*
 * The model's own tokenizer (--tokenizer PATH, as vLLM's --tokenizer names the Hugging Face
 * tokenizer to load: vllm/engine/arg_utils.py EngineArgs.tokenizer): a tokenizer.json and the
 * chat template of its tokenizer_config.json, run by libpdtok. Without it the simulator keeps
 * its built-in tokenizer (sim_text.c).
 *
 * What vLLM does with them (vllm/entrypoints/serve/tokenize/protocol.py, vllm/renderers/hf.py):
 * a completions prompt is encoded with add_special_tokens (true unless the request says
 * false); a chat request is rendered through the template with its messages, tools,
 * add_generation_prompt (true unless set) and chat_template_kwargs as variables, then encoded
 * with add_special_tokens false (the template writes the bos itself).
 *
 * The ids are the vocabulary's; the simulator's output tokens keep their own ids (sim_text.c),
 * so an answer's text is still the simulator's word list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdb/pdb_buf.h"
#include "pdtok/template.h"
#include "pdtok/tokenizer.h"
#include "sim_int.h"

static pdtok_t *hf_tok;
static pdtok_template_t *hf_tmpl; /* NULL: the model has no chat template it can render */

int sim_hf_tokenizer_load(const char *path, char *err, size_t errlen)
{
    char why[512];
    hf_tok = pdtok_load(path, err, errlen);
    if (hf_tok == NULL)
        return -1;
    hf_tmpl = pdtok_template_load(path, why, sizeof(why));
    if (hf_tmpl == NULL)
        fprintf(stderr, "pdgw-sim: chat template of %s not loaded (%s): chat requests get 400\n",
                path, why);
    return 0;
}

void sim_hf_tokenizer_free(void)
{
    pdtok_template_free(hf_tmpl);
    pdtok_free(hf_tok);
    hf_tmpl = NULL;
    hf_tok = NULL;
}

/* <key> of <body> when it is a boolean, else <dflt>. */
static int flag(const json_t *body, const char *key, int dflt)
{
    const json_t *v = json_object_get(body, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int hf_encode(const char *text, size_t len, int add_special, sim_tokens_t *out)
{
    pdtok_ids_t ids = {0};
    int rc = 0;
    if (pdtok_encode(hf_tok, text, len, add_special != 0, &ids) != PDTOK_OK)
        return -1;
    for (size_t i = 0; i < ids.len && rc == 0; i++)
        rc = sim_tokens_push(out, (uint32_t)ids.ids[i]);
    pdtok_ids_free(&ids);
    return rc;
}

int sim_tokenize_text(const json_t *body, const char *text, size_t len, sim_tokens_t *out)
{
    if (hf_tok == NULL)
        return sim_tokenize(text, len, out);
    return hf_encode(text, len, flag(body, "add_special_tokens", 1), out);
}

int sim_tokenize_chat(const json_t *body, sim_tokens_t *out, char *err, size_t errlen)
{
    pdb_buf_t text = PDB_BUF_INIT;
    json_t *req;
    int rc;

    if (hf_tok == NULL) {
        char *t = sim_chat_template(json_object_get(body, "messages"));
        rc = t != NULL ? sim_tokenize(t, strlen(t), out) : -1;
        free(t);
        if (rc != 0)
            snprintf(err, errlen, "out of memory");
        return rc;
    }
    if (hf_tmpl == NULL) {
        snprintf(err, errlen, "the model has no chat template");
        return -1;
    }
    req = json_object();
    if (req == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    json_object_set(req, "messages", json_object_get(body, "messages"));
    if (json_object_get(body, "tools") != NULL)
        json_object_set(req, "tools", json_object_get(body, "tools"));
    json_object_set_new(req, "add_generation_prompt",
                        json_boolean(flag(body, "add_generation_prompt", 1)));
    if (json_is_object(json_object_get(body, "chat_template_kwargs")))
        json_object_set(req, "chat_template_kwargs", json_object_get(body, "chat_template_kwargs"));
    rc = pdtok_template_render(hf_tmpl, req, &text, err, errlen);
    json_decref(req);
    if (rc == 0 && hf_encode(text.data, text.len, flag(body, "add_special_tokens", 0), out) != 0) {
        snprintf(err, errlen, "the rendered prompt does not encode");
        rc = -1;
    }
    pdb_buf_free(&text);
    return rc;
}
