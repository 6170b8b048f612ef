/*
 * pdtok/tokenizer.h - Hugging Face tokenizer.json in C: text -> token ids -> text.
 *
 * A loaded tokenizer is immutable: every function taking a `const pdtok_t *` may be called
 * from any number of threads at once without a lock (the per-thread word cache is private
 * to each thread). A tokenizer.json using a component or an option this library cannot run
 * exactly is refused by pdtok_load() with a message naming it; it never mis-tokenizes.
 *
 * Text in is UTF-8; bytes that are not valid UTF-8 are read as U+FFFD, one per maximal
 * invalid subsequence (the WHATWG decoder's rule), which is what a JavaScript or Python
 * caller handing the same bytes through a string decoder would tokenize.
 */
#ifndef PDTOK_TOKENIZER_H
#define PDTOK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdtok_status {
    PDTOK_OK = 0,
    PDTOK_ERR_NOMEM = -1,       /* allocation failed */
    PDTOK_ERR_INVALID = -2,     /* bad argument or malformed file */
    PDTOK_ERR_UNSUPPORTED = -3, /* a component this library cannot run exactly */
    PDTOK_ERR_IO = -4,          /* file could not be read */
    PDTOK_ERR_RANGE = -5,       /* a token id outside the vocabulary */
    PDTOK_ERR_REGEX = -6,       /* a pattern failed to match (PCRE2 resource limit) */
} pdtok_status_t;

/* Short static description of <st>; never NULL. */
const char *pdtok_strerror(pdtok_status_t st);

typedef struct pdtok pdtok_t;

/* A growable id array owned by the caller: zero-initialise, reuse, pdtok_ids_free(). */
typedef struct pdtok_ids {
    int32_t *ids;
    size_t len;
    size_t cap;
} pdtok_ids_t;

void pdtok_ids_free(pdtok_ids_t *ids);

/*
 * Loads <path>: a tokenizer.json file or a directory holding one (and, optionally,
 * tokenizer_config.json, read for bos/eos/unk/pad text, additional special tokens and
 * clean_up_tokenization_spaces). NULL on failure with a message in <err> (<errlen> bytes,
 * may be 0). The caller owns the result: pdtok_free().
 */
pdtok_t *pdtok_load(const char *path, char *err, size_t errlen);
/* As pdtok_load, from the text of a tokenizer.json in memory (no tokenizer_config.json). */
pdtok_t *pdtok_load_json(const char *json, size_t len, char *err, size_t errlen);
void pdtok_free(pdtok_t *tok);

/*
 * Encodes <len> bytes of <text> and appends the ids to <out> (out->len grows; existing ids
 * are kept). <add_special>: run the post-processor's special tokens (a bos where the
 * tokenizer.json's TemplateProcessing asks for one) as transformers' encode(text) does by
 * default. On error <out> is as it was. Texts over PDTOK_MAX_TEXT bytes are refused
 * (PDTOK_ERR_INVALID): a SentencePiece section is one BPE word, whose merge state is about
 * 100 bytes per character.
 */
#define PDTOK_MAX_TEXT (16u << 20)
pdtok_status_t pdtok_encode(const pdtok_t *tok, const char *text, size_t len, bool add_special,
                            pdtok_ids_t *out);

/*
 * Decodes <n> ids into text. *out_text is malloc'd (free()), NUL-terminated, *out_len bytes.
 * <skip_special>: drop special tokens (added tokens marked special and the config's
 * additional special tokens). PDTOK_ERR_RANGE for an id outside the vocabulary.
 */
pdtok_status_t pdtok_decode(const pdtok_t *tok, const int32_t *ids, size_t n, bool skip_special,
                            char **out_text, size_t *out_len);

/* The id of the token whose text is <token> (<len> bytes; added tokens included), or -1. */
int32_t pdtok_token_to_id(const pdtok_t *tok, const char *token, size_t len);
/* The text of token <id> (borrowed, lives as long as <tok>; *len set when non-NULL), or NULL. */
const char *pdtok_id_to_token(const pdtok_t *tok, int32_t id, size_t *len);
/* One past the highest id (model vocabulary and added tokens). */
size_t pdtok_vocab_size(const pdtok_t *tok);
/* Whether <id> is a special token (skipped by decode with skip_special). */
bool pdtok_is_special(const pdtok_t *tok, int32_t id);

typedef enum pdtok_special {
    PDTOK_SPECIAL_BOS,
    PDTOK_SPECIAL_EOS,
    PDTOK_SPECIAL_UNK,
    PDTOK_SPECIAL_PAD,
} pdtok_special_t;

/* The text of a special token from tokenizer_config.json (or the model's unk_token) and its
 * id: NULL and *id = -1 when not configured. Borrowed string. */
const char *pdtok_special_token(const pdtok_t *tok, pdtok_special_t which, int32_t *id);

/*
 * The command-line front end (`pdtok`, `pdgw tokenize`): --tokenizer PATH reads JSON lines
 * {"text": "..."} on stdin and writes {"ids": [...]} lines; --chat renders
 * {"messages": [...], ...} lines with the chat template and writes {"ids", "text"}. Returns
 * the process exit status.
 */
int pdtok_cli_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* PDTOK_TOKENIZER_H */
