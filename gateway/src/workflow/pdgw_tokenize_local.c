/*
 * pdgw_tokenize_local.c - a prompt's token ids from a tokenizer loaded in the gateway
 * (config `tokenizers: MODEL=PATH`; libpdtok), so precise-prefix routing and selective PD get
 * exact ids without the engine's POST /tokenize exchange.
 *
 * The request handed to the chat template is the /tokenize body pdgw would send the engine
 * (pdgw_tokenize_body.c), read as vLLM reads it (vllm/entrypoints/serve/tokenize/protocol.py):
 * add_generation_prompt true unless the client set it, add_special_tokens false for chat and
 * true for a completions prompt, chat_template_kwargs spread as the template's variables. What
 * only the engine can do — a client's own chat_template, continue_final_message, multimodal
 * inputs — goes to the engine as before. A tokenizer or template the library refuses is
 * reported at start and that model keeps using the engine.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdb/pdb_buf.h"
#include "pdgw_log.h"
#include "pdgw_route_int.h"
#include "pdgw_util.h"
#include "pdtok/template.h"
#include "pdtok/tokenizer.h"

struct pdgw_local_tok {
    char *model;
    pdtok_t *tok;
    pdtok_template_t *tmpl; /* NULL: no usable chat template (chat prompts go to the engine) */
};

/* The tokenizers of one config: read by many requests at once, replaced whole by a reload;
 * the last request still tokenizing with a replaced set frees it. */
struct pdgw_tok_set {
    atomic_int refs;
    uint64_t gen; /* mixed into the tokenize cache's keys: a new set never reads old ids */
    pdgw_local_tok_t *items;
    size_t n;
};

static void set_free(pdgw_tok_set_t *set)
{
    for (size_t i = 0; i < set->n; i++) {
        pdtok_template_free(set->items[i].tmpl);
        pdtok_free(set->items[i].tok);
        pdgw_free(set->items[i].model);
    }
    pdgw_free(set->items);
    pdgw_free(set);
}

pdgw_status_t pdgw_tok_set_load(const pdgw_kv_list_t *list, bool strict, char *err, size_t errlen,
                                pdgw_tok_set_t **out)
{
    pdgw_tok_set_t *set = pdgw_calloc(1, sizeof(*set));
    size_t count = list != NULL ? list->count : 0;

    if (set == NULL ||
        (count > 0 && (set->items = pdgw_calloc(count, sizeof(*set->items))) == NULL))
        goto nomem;
    atomic_init(&set->refs, 1);
    for (size_t i = 0; i < count; i++) {
        const char *model = list->items[i].key, *path = list->items[i].value;
        pdgw_local_tok_t *lt = &set->items[set->n];
        char why[512];
        uint64_t t0 = pdgw_time_mono_ms();

        if (strcmp(path, "engine") == 0)
            continue;
        lt->tok = pdtok_load(path, why, sizeof(why));
        if (lt->tok == NULL && strict) {
            snprintf(err, errlen, "tokenizers: model %s: %s does not load: %s", model, path, why);
            set_free(set);
            return PDGW_ERR_INVALID;
        }
        if (lt->tok == NULL) {
            pdgw_log_warn("tokenize",
                          "model %s: tokenizer %s refused (%s); its prompts are tokenized by "
                          "the engine",
                          model, path, why);
            continue;
        }
        lt->tmpl = pdtok_template_load(path, why, sizeof(why));
        if (lt->tmpl == NULL)
            pdgw_log_warn("tokenize",
                          "model %s: chat template of %s refused (%s); its chat prompts are "
                          "tokenized by the engine",
                          model, path, why);
        lt->model = pdgw_strdup(model);
        if (lt->model == NULL) {
            pdtok_template_free(lt->tmpl);
            pdtok_free(lt->tok);
            goto nomem;
        }
        pdgw_log_info("tokenize", "model %s: tokenizer %s loaded in %llu ms (%zu ids%s)", model,
                      path, (unsigned long long)(pdgw_time_mono_ms() - t0),
                      pdtok_vocab_size(lt->tok), lt->tmpl ? ", chat template" : "");
        set->n++;
    }
    *out = set;
    return PDGW_OK;
nomem:
    if (set != NULL)
        set_free(set);
    snprintf(err, errlen, "out of memory");
    return PDGW_ERR_NOMEM;
}

size_t pdgw_tok_set_size(const pdgw_tok_set_t *set)
{
    return set != NULL ? set->n : 0;
}

uint64_t pdgw_tok_set_gen(const pdgw_tok_set_t *set)
{
    return set != NULL ? set->gen : 0;
}

pdgw_tok_set_t *pdgw_tok_set_get(pdgw_routing_t *rt)
{
    pdgw_tok_set_t *set;
    if (!atomic_load_explicit(&rt->any_local, memory_order_acquire))
        return NULL; /* no tokenizer in the gateway: no lock on the request's path */
    pthread_mutex_lock(&rt->toks_mu);
    set = rt->toks;
    if (set != NULL)
        atomic_fetch_add(&set->refs, 1);
    pthread_mutex_unlock(&rt->toks_mu);
    return set;
}

void pdgw_tok_set_put(pdgw_tok_set_t *set)
{
    if (set != NULL && atomic_fetch_sub(&set->refs, 1) == 1)
        set_free(set);
}

void pdgw_tok_set_install(pdgw_routing_t *rt, pdgw_tok_set_t *set)
{
    pdgw_tok_set_t *old;
    pthread_mutex_lock(&rt->toks_mu);
    old = rt->toks;
    if (set != NULL)
        set->gen = ++rt->toks_gen; /* before any request can see it (the lock orders both) */
    rt->toks = set;
    atomic_store_explicit(&rt->any_local, pdgw_tok_set_size(set) > 0, memory_order_release);
    pthread_mutex_unlock(&rt->toks_mu);
    pdgw_tok_set_put(old); /* freed now, or by the last request tokenizing with it */
}

pdgw_status_t pdgw_tokenizers_check(const pdgw_kv_list_t *list, FILE *warn, char *err,
                                    size_t errlen)
{
    for (size_t i = 0; list != NULL && i < list->count; i++) {
        const char *model = list->items[i].key, *path = list->items[i].value;
        char why[512];
        pdtok_t *tok;
        pdtok_template_t *tmpl;

        if (strcmp(path, "engine") == 0)
            continue;
        if ((tok = pdtok_load(path, why, sizeof(why))) == NULL) {
            snprintf(err, errlen, "tokenizers: model %s: %s does not load: %s", model, path, why);
            return PDGW_ERR_INVALID;
        }
        pdtok_free(tok);
        if ((tmpl = pdtok_template_load(path, why, sizeof(why))) == NULL && warn != NULL)
            fprintf(warn,
                    "pdgw: warning: tokenizers: model %s: chat template of %s refused (%s); its "
                    "chat prompts would be tokenized by the engine\n",
                    model, path, why);
        pdtok_template_free(tmpl);
    }
    return PDGW_OK;
}

const pdgw_local_tok_t *pdgw_tokenize_local_find(const pdgw_tok_set_t *set, const char *model)
{
    for (size_t i = 0; set != NULL && model != NULL && i < set->n; i++)
        if (strcmp(set->items[i].model, model) == 0)
            return &set->items[i];
    return NULL;
}

/* A body field only the engine can apply. */
static bool engine_only(const json_t *body)
{
    return json_object_get(body, "chat_template") != NULL ||
           json_is_true(json_object_get(body, "continue_final_message")) ||
           json_object_get(body, "media_io_kwargs") != NULL ||
           json_object_get(body, "mm_processor_kwargs") != NULL;
}

static bool flag(const json_t *body, const char *name, bool dflt)
{
    const json_t *v = json_object_get(body, name);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* The rendered chat prompt of <body> (a /tokenize chat body) into <out>; false = not here. */
static bool render_chat(const pdgw_local_tok_t *lt, const json_t *body, pdb_buf_t *out)
{
    json_t *req = json_object();
    char err[256];
    bool ok;
    if (req == NULL)
        return false;
    json_object_set(req, "messages", json_object_get(body, "messages"));
    if (json_object_get(body, "tools") != NULL)
        json_object_set(req, "tools", json_object_get(body, "tools"));
    json_object_set_new(req, "add_generation_prompt",
                        json_boolean(flag(body, "add_generation_prompt", true)));
    if (json_is_object(json_object_get(body, "chat_template_kwargs")))
        json_object_set(req, "chat_template_kwargs", json_object_get(body, "chat_template_kwargs"));
    ok = pdtok_template_render(lt->tmpl, req, out, err, sizeof(err)) == 0;
    if (!ok)
        pdgw_log_debug("tokenize", "model %s: chat template: %s (the engine tokenizes it)",
                       lt->model, err);
    json_decref(req);
    return ok;
}

bool pdgw_tokenize_local_ids(const pdgw_routing_t *rt, const pdgw_local_tok_t *lt,
                             const json_t *body, bool chat, uint32_t **ids_out, size_t *n_out)
{
    uint64_t t0 = pdgw_time_mono_ns();
    pdb_buf_t text = PDB_BUF_INIT;
    pdtok_ids_t ids = {0};
    const char *s;
    size_t len;
    bool special, ok = false;

    if (engine_only(body) || (chat && lt->tmpl == NULL))
        return false;
    if (chat) {
        if (!render_chat(lt, body, &text))
            goto out;
        s = text.data;
        len = text.len;
        special = flag(body, "add_special_tokens", false); /* the template has the bos */
    } else {
        const json_t *p = json_object_get(body, "prompt");
        if (!json_is_string(p))
            goto out;
        s = json_string_value(p);
        len = json_string_length(p);
        special = flag(body, "add_special_tokens", true);
    }
    if (pdtok_encode(lt->tok, s, len, special, &ids) != PDTOK_OK)
        goto out;
    *ids_out = pdgw_malloc((ids.len ? ids.len : 1) * sizeof(uint32_t));
    if (*ids_out == NULL)
        goto out;
    for (size_t i = 0; i < ids.len; i++)
        (*ids_out)[i] = (uint32_t)ids.ids[i];
    *n_out = ids.len;
    ok = true;
    if (rt->tokenize_seconds)
        pdgw_histogram_observe(
            pdgw_metric_family_series1(rt->tokenize_seconds, chat ? "chat" : "text"),
            (double)(pdgw_time_mono_ns() - t0) / 1e9);
out:
    pdtok_ids_free(&ids);
    pdb_buf_free(&text);
    return ok;
}
