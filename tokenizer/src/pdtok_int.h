/*
 * pdtok_int.h - internal types of libpdtok's tokenizer half.
 *
 * Data flow of an encode: UTF-8 repair -> added-token split (trie) -> per section:
 * normalizer chain -> pre-tokenizer chain (pieces) -> BPE per piece (per-thread cache) ->
 * post-processor (template bos). Everything reachable from pdtok_t is immutable after load.
 */
#ifndef PDTOK_INT_H
#define PDTOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdb/pdb_buf.h"
#include "pdtok/tokenizer.h"

/* ---- strings: pieces of text in one arena ---- */
typedef struct tok_span {
    size_t off;
    size_t len;
} tok_span_t;

typedef struct tok_pieces {
    pdb_buf_t text;
    tok_span_t *sp;
    size_t n, cap;
} tok_pieces_t;

pdtok_status_t tok_pieces_add(tok_pieces_t *p, const char *s, size_t len);
/* Appends to the last piece (adds one when there is none). */
pdtok_status_t tok_pieces_extend_last(tok_pieces_t *p, const char *s, size_t len);
void tok_pieces_reset(tok_pieces_t *p);
void tok_pieces_free(tok_pieces_t *p);
static inline const char *tok_piece(const tok_pieces_t *p, size_t i)
{
    return p->text.data + p->sp[i].off;
}

pdtok_status_t tok_ids_push(pdtok_ids_t *ids, int32_t id);

/* ---- UTF-8 ---- */
/* Decodes one code point of valid UTF-8 at <s> (n > 0 bytes left); returns its length. */
size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp);
size_t tok_utf8_put(uint32_t cp, char *out); /* out has room for 4 bytes */
/* Length of the valid UTF-8 prefix of <s>. */
size_t tok_utf8_valid_prefix(const char *s, size_t n);
/* Appends <s> to <out>, each maximal invalid subsequence replaced by U+FFFD (WHATWG). */
pdtok_status_t tok_utf8_repair(const char *s, size_t n, pdb_buf_t *out);
/* White space as JavaScript's \s and String.prototype.trim define it. */
bool tok_js_space(uint32_t cp);
size_t tok_js_trim_start(const char *s, size_t n); /* bytes of leading space */
size_t tok_js_trim_end(const char *s, size_t n);   /* bytes of trailing space */

/* ---- symbol table: every string BPE can hold, vocabulary tokens among them ---- */
typedef struct tok_syms {
    pdb_buf_t arena;
    uint32_t *off, *len; /* per symbol */
    int32_t *tok_id;     /* the token id the text maps to, or -1 (merge-only string) */
    size_t n, cap;
    int32_t *slots; /* open addressing: symbol index or -1 */
    size_t mask;
} tok_syms_t;

pdtok_status_t tok_syms_init(tok_syms_t *t, size_t hint);
void tok_syms_free(tok_syms_t *t);
int32_t tok_syms_find(const tok_syms_t *t, const char *s, size_t len);
/* The symbol of <s>, added when missing (tok_id -1). */
pdtok_status_t tok_syms_intern(tok_syms_t *t, const char *s, size_t len, int32_t *sym);
static inline const char *tok_sym_text(const tok_syms_t *t, int32_t sym)
{
    return t->arena.data + t->off[sym];
}

/* ---- merges: (left symbol, right symbol) -> rank, merged symbol ---- */
typedef struct tok_merge {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty slot */
    uint32_t rank;
    int32_t merged;
} tok_merge_t;

typedef struct tok_merges {
    tok_merge_t *slots;
    size_t mask, n;
} tok_merges_t;

pdtok_status_t tok_merges_init(tok_merges_t *m, size_t n);
void tok_merges_free(tok_merges_t *m);
/* A pair listed twice keeps the later rank. */
void tok_merges_put(tok_merges_t *m, int32_t left, int32_t right, uint32_t rank, int32_t merged);
const tok_merge_t *tok_merges_get(const tok_merges_t *m, int32_t left, int32_t right);

/* ---- regex (PCRE2, JavaScript semantics of the reference) ---- */
typedef struct tok_regex {
    pcre2_code *code;
    bool jit;
} tok_regex_t;

/* <js_semantics>: translate as the reference's JavaScript RegExp reads the pattern. */
pdtok_status_t tok_regex_compile(tok_regex_t *re, const char *pattern, size_t len,
                                 bool js_semantics, char *err, size_t errlen);
/* <s> matched as it is (a tokenizer.json "String" pattern). */
pdtok_status_t tok_regex_compile_literal(tok_regex_t *re, const char *s, size_t len, char *err,
                                         size_t errlen);
void tok_regex_free(tok_regex_t *re);
/* Next match at or after <start>: 1 with [*ms, *me), 0 none, <0 error. Empty matches are
 * returned; the caller steps one code point past them. */
int tok_regex_find(const tok_regex_t *re, const char *s, size_t n, size_t start, size_t *ms,
                   size_t *me);

/* ---- normalizers ---- */
typedef enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_REPLACE_STR,
    TOK_NORM_REPLACE_RE,
    TOK_NORM_PREPEND,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
} tok_norm_kind_t;

typedef struct tok_norm {
    tok_norm_kind_t kind;
    char *a; /* pattern / prepend text */
    size_t alen;
    char *b; /* replacement */
    size_t blen;
    tok_regex_t re;
    bool left, right;
} tok_norm_t;

pdtok_status_t tok_norm_apply(const tok_norm_t *n, const char *s, size_t len, pdb_buf_t *out);

/* ---- pre-tokenizers ---- */
typedef enum tok_pre_kind {
    TOK_PRE_SPLIT,
    TOK_PRE_BYTELEVEL,
    TOK_PRE_DIGITS,
    TOK_PRE_PUNCT,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WSSPLIT,
    TOK_PRE_METASPACE,
} tok_pre_kind_t;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior_t;

typedef struct tok_pre {
    tok_pre_kind_t kind;
    tok_regex_t re; /* Split, ByteLevel with use_regex, Digits, Punctuation, Whitespace */
    tok_split_behavior_t behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    bool use_regex;        /* ByteLevel */
    char meta[8];          /* Metaspace replacement (UTF-8) */
    size_t meta_len;
    int prepend; /* Metaspace: 0 never, 1 always, 2 first section */
    bool meta_split;
} tok_pre_t;

struct pdtok;
/* Runs <pre> over every piece of <in> into <out> (reset first). */
pdtok_status_t tok_pre_apply(const struct pdtok *tok, const tok_pre_t *pre, const tok_pieces_t *in,
                             size_t section, tok_pieces_t *out);

/* ---- decoders ---- */
typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE,
} tok_dec_kind_t;

typedef struct tok_dec {
    tok_dec_kind_t kind;
    char *a, *b; /* Replace pattern / content, Metaspace replacement */
    size_t alen, blen;
    char strip_char;
    int start, stop;
    bool add_prefix_space;
} tok_dec_t;

/* ---- added tokens: a byte trie over their contents ---- */
typedef struct tok_trie_edge {
    uint32_t key; /* node << 8 | byte, UINT32_MAX = empty */
    uint32_t child;
} tok_trie_edge_t;

typedef struct tok_added {
    int32_t id;
    uint32_t sym; /* text in the symbol arena */
    bool special, lstrip, rstrip;
} tok_added_t;

typedef struct tok_trie {
    tok_trie_edge_t *edges;
    size_t mask, nedges;
    int32_t *node_end;  /* per node: added-token index ending here, or -1 */
    uint8_t first[256]; /* bytes an entry starts with: other positions are skipped */
    size_t nnodes, capnodes;
} tok_trie_t;

pdtok_status_t tok_trie_init(tok_trie_t *t, size_t hint);
void tok_trie_free(tok_trie_t *t);
pdtok_status_t tok_trie_add(tok_trie_t *t, const char *s, size_t len, int32_t value);
/* The longest entry starting at s[0]: its value, *mlen its length; -1 when none. */
int32_t tok_trie_longest(const tok_trie_t *t, const char *s, size_t n, size_t *mlen);

/* ---- the tokenizer ---- */
#define TOK_MAX_CHAIN 16

struct pdtok {
    uint64_t instance; /* unique per load: keys the per-thread caches */
    tok_syms_t syms;
    tok_merges_t merges;
    int32_t *id_sym; /* token id -> symbol, or -1 */
    uint8_t *id_special;
    size_t nids;

    /* model (BPE) */
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_tok[256];          /* <0xXX> ids for byte fallback, -1 if missing */
    char *cont_prefix, *eow_suffix; /* refused when non-empty; kept for messages */

    tok_norm_t norm[TOK_MAX_CHAIN];
    size_t nnorm;
    tok_pre_t pre[TOK_MAX_CHAIN];
    size_t npre;
    tok_dec_t dec[TOK_MAX_CHAIN];
    size_t ndec;
    bool has_decoder;

    int32_t bos_template[TOK_MAX_CHAIN]; /* ids the template puts before/after A */
    size_t nbos_pre;
    int32_t post_ids[TOK_MAX_CHAIN];
    size_t npost;

    tok_added_t *added;
    size_t nadded;
    tok_trie_t trie;

    /* tokenizer_config.json */
    char *special_text[4];
    int32_t special_id[4];
    bool clean_up_spaces;

    /* byte-level tables */
    char bl_char[256][3]; /* byte -> its UTF-8 stand-in (1-2 bytes) */
    uint8_t bl_len[256];
    int16_t bl_byte[512]; /* stand-in code point -> byte, -1 */
    tok_regex_t gpt2_re;
    bool gpt2_re_ready;
};

/* BPE of one pre-tokenized word, ids appended to <out>. */
pdtok_status_t tok_bpe_word(const pdtok_t *tok, const char *w, size_t n, pdtok_ids_t *out);
void tok_bytelevel_tables(pdtok_t *tok);

/* Loading pieces (pdtok_load.c, pdtok_load_parts.c). */
struct json_t;
pdtok_status_t tok_load_config(pdtok_t *tok, const char *dir, char *err, size_t errlen);
void tok_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* PDTOK_INT_H */
