/*
 * pdtok/template.h - chat templates: the Jinja subset that models' tokenizer_config.json
 * templates use, rendered in process so the gateway can build prompts itself.
 *
 * A template is parsed once, at load, into an immutable tree; a construct the renderer does not
 * support is refused there (with its line), so the caller can fall back to the engine for that
 * model instead of failing mid-request. Rendering keeps all its state on the caller's stack and
 * in a per-call arena: any number of threads may render one template at once.
 *
 * Whitespace follows what Hugging Face's loaders use: trim_blocks and lstrip_blocks on, one
 * trailing newline of the template dropped.
 */
#ifndef PDTOK_TEMPLATE_H
#define PDTOK_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pdb/pdb_buf.h"
#include "pdb/pdb_clock.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdtok_template pdtok_template_t;

/* Bounds of one rendering: a template looping over a huge input stops with an error. */
#define PDTOK_TMPL_MAX_OUTPUT (16u << 20)  /* bytes of rendered text */
#define PDTOK_TMPL_MAX_MEMORY (256u << 20) /* bytes of intermediate values */
#define PDTOK_TMPL_MAX_STEPS  10000000u    /* evaluated nodes (a 1000-message chat takes ~1e5) */
#define PDTOK_TMPL_MAX_DEPTH  200          /* nesting of macro calls and expressions */

/*
 * Loads the chat template of a model. <dir_or_config> is a directory holding
 * tokenizer_config.json, that file, or the model's tokenizer.json (the config beside it). Its "chat_template" is a string or a list of
 * {name, template}: the one named "default" is used. bos_token / eos_token (strings or
 * {"content": ...} objects) become template variables.
 * Returns NULL with a message in <err> (line and construct for a template that does not parse
 * or uses something unsupported). The caller owns the result: pdtok_template_free().
 */
pdtok_template_t *pdtok_template_load(const char *dir_or_config, char *err, size_t errlen);

/* As pdtok_template_load, from template source text; <bos>/<eos> may be NULL (unset). */
pdtok_template_t *pdtok_template_parse(const char *source, size_t len, const char *bos,
                                       const char *eos, char *err, size_t errlen);

/*
 * Renders <request> (borrowed), an object {messages, tools?, add_generation_prompt?,
 * chat_template_kwargs?}, appending the prompt to <out>. The template sees what
 * transformers' apply_chat_template gives it: messages, tools (none when absent),
 * add_generation_prompt (false when absent), bos_token, eos_token, and every
 * chat_template_kwargs key as a variable of its own (e.g. enable_thinking).
 * Returns 0, or -1 with <out> unchanged and a message in <err> (a raise_exception's text, a
 * type error, a bound exceeded).
 */
int pdtok_template_render(const pdtok_template_t *tmpl, const json_t *request, pdb_buf_t *out,
                          char *err, size_t errlen);

/* As pdtok_template_render, with the wall clock strftime_now reads (NULL = the real one, in
 * nanoseconds since the epoch; tests inject a fixed time). */
int pdtok_template_render_at(const pdtok_template_t *tmpl, const json_t *request,
                             const pdb_clock_t *wall_clock, pdb_buf_t *out, char *err,
                             size_t errlen);

void pdtok_template_free(pdtok_template_t *tmpl);

#ifdef __cplusplus
}
#endif
#endif /* PDTOK_TEMPLATE_H */
