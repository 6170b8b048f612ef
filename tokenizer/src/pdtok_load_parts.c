/*
 * pdtok_load_parts.c - reads the pipeline parts of tokenizer.json (normalizer,
 * pre_tokenizer, post_processor, decoder) into pdtok_t's chains. Sequences are flattened;
 * a type or option that cannot be run exactly is refused, naming it.
 */
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_load_int.h"

/* The pattern the reference's ByteLevel pre-tokenizer splits with when use_regex is on. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static bool jbool(const json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = pdb_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* The {"String": s} or {"Regex": r} pattern object: *is_regex, text and length. */
static bool pattern_of(const json_t *p, bool *is_regex, const char **s, size_t *n)
{
    json_t *str = json_object_get(p, "String"), *re = json_object_get(p, "Regex");
    json_t *v = json_is_string(str) ? str : json_is_string(re) ? re : NULL;
    if (!v)
        return false;
    *is_regex = v == re;
    *s = json_string_value(v);
    *n = json_string_length(v);
    return true;
}

static pdtok_status_t too_long(const char *what, char *err, size_t errlen)
{
    tok_set_err(err, errlen, "%s chain longer than %d steps", what, TOK_MAX_CHAIN);
    return PDTOK_ERR_UNSUPPORTED;
}

/* ---- normalizers ---- */

static pdtok_status_t add_norm(pdtok_t *tok, const json_t *n, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) {
        tok_set_err(err, errlen, "normalizer without a type");
        return PDTOK_ERR_INVALID;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            pdtok_status_t st = add_norm(tok, x, err, errlen);
            if (st != PDTOK_OK)
                return st;
        }
        return PDTOK_OK;
    }
    if (tok->nnorm == TOK_MAX_CHAIN)
        return too_long("normalizer", err, errlen);
    tok_norm_t *nm = &tok->norm[tok->nnorm];
    memset(nm, 0, sizeof(*nm));
    static const struct {
        const char *name;
        tok_norm_kind_t kind;
    } simple[] = {{"NFC", TOK_NORM_NFC},
                  {"NFD", TOK_NORM_NFD},
                  {"NFKC", TOK_NORM_NFKC},
                  {"NFKD", TOK_NORM_NFKD},
                  {"Lowercase", TOK_NORM_LOWERCASE}};
    for (size_t i = 0; i < sizeof(simple) / sizeof(simple[0]); i++)
        if (strcmp(type, simple[i].name) == 0) {
            nm->kind = simple[i].kind;
            tok->nnorm++;
            return PDTOK_OK;
        }
    if (strcmp(type, "Strip") == 0) {
        nm->kind = TOK_NORM_STRIP;
        nm->left = jbool(n, "strip_left", false);
        nm->right = jbool(n, "strip_right", false);
        tok->nnorm++;
        return PDTOK_OK;
    }
    if (strcmp(type, "Prepend") == 0) {
        json_t *p = json_object_get(n, "prepend");
        if (!json_is_string(p)) {
            tok_set_err(err, errlen, "normalizer Prepend without a prepend string");
            return PDTOK_ERR_INVALID;
        }
        nm->kind = TOK_NORM_PREPEND;
        nm->alen = json_string_length(p);
        if (!(nm->a = dup_n(json_string_value(p), nm->alen)))
            return PDTOK_ERR_NOMEM;
        tok->nnorm++;
        return PDTOK_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        bool is_re;
        const char *s;
        size_t len;
        json_t *content = json_object_get(n, "content");
        if (!pattern_of(json_object_get(n, "pattern"), &is_re, &s, &len) ||
            !json_is_string(content)) {
            tok_set_err(err, errlen, "normalizer Replace needs a pattern and a content");
            return PDTOK_ERR_INVALID;
        }
        if (strchr(json_string_value(content), '$')) {
            /* The reference's replaceAll reads $& $1 ... in the replacement. */
            tok_set_err(err, errlen, "normalizer Replace: a '$' in the content is not supported");
            return PDTOK_ERR_UNSUPPORTED;
        }
        nm->kind = is_re ? TOK_NORM_REPLACE_RE : TOK_NORM_REPLACE_STR;
        nm->alen = len;
        nm->blen = json_string_length(content);
        nm->a = dup_n(s, len);
        nm->b = dup_n(json_string_value(content), nm->blen);
        tok->nnorm++; /* counted now so pdtok_free releases a and b */
        if (!nm->a || !nm->b)
            return PDTOK_ERR_NOMEM;
        if (is_re)
            return tok_regex_compile(&nm->re, s, len, true, err, errlen);
        return PDTOK_OK;
    }
    tok_set_err(err, errlen, "normalizer %s is not supported", type);
    return PDTOK_ERR_UNSUPPORTED;
}

/* ---- pre-tokenizers ---- */

static pdtok_status_t behavior_of(const char *b, tok_split_behavior_t *out)
{
    static const struct {
        const char *name;
        tok_split_behavior_t v;
    } names[] = {{"Removed", TOK_SPLIT_REMOVED},
                 {"Isolated", TOK_SPLIT_ISOLATED},
                 {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
                 {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
                 {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (b && strcmp(b, names[i].name) == 0) {
            *out = names[i].v;
            return PDTOK_OK;
        }
    return PDTOK_ERR_UNSUPPORTED;
}

static pdtok_status_t add_pre(pdtok_t *tok, const json_t *p, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) {
        tok_set_err(err, errlen, "pre_tokenizer without a type");
        return PDTOK_ERR_INVALID;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            pdtok_status_t st = add_pre(tok, x, err, errlen);
            if (st != PDTOK_OK)
                return st;
        }
        return PDTOK_OK;
    }
    if (tok->npre == TOK_MAX_CHAIN)
        return too_long("pre_tokenizer", err, errlen);
    tok_pre_t *pre = &tok->pre[tok->npre];
    memset(pre, 0, sizeof(*pre));
    if (strcmp(type, "Split") == 0) {
        bool is_re;
        const char *s;
        size_t len;
        const char *b = json_string_value(json_object_get(p, "behavior"));
        if (!pattern_of(json_object_get(p, "pattern"), &is_re, &s, &len)) {
            tok_set_err(err, errlen, "pre_tokenizer Split without a pattern");
            return PDTOK_ERR_INVALID;
        }
        if (behavior_of(b, &pre->behavior) != PDTOK_OK) {
            tok_set_err(err, errlen, "pre_tokenizer Split: behavior %s is not supported",
                        b ? b : "(none)");
            return PDTOK_ERR_UNSUPPORTED;
        }
        pre->kind = TOK_PRE_SPLIT;
        pre->invert = jbool(p, "invert", false);
        tok->npre++;
        return is_re ? tok_regex_compile(&pre->re, s, len, true, err, errlen)
                     : tok_regex_compile_literal(&pre->re, s, len, err, errlen);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        pre->kind = TOK_PRE_BYTELEVEL;
        pre->add_prefix_space = jbool(p, "add_prefix_space", false);
        pre->use_regex = jbool(p, "use_regex", true);
        tok->npre++;
        if (pre->use_regex && !tok->gpt2_re.code)
            return tok_regex_compile(&tok->gpt2_re, gpt2_pattern, sizeof(gpt2_pattern) - 1, true,
                                     err, errlen);
        return PDTOK_OK;
    }
    const char *re = NULL;
    if (strcmp(type, "Digits") == 0) {
        pre->kind = TOK_PRE_DIGITS;
        re = jbool(p, "individual_digits", false) ? "[^\\d]+|\\d" : "[^\\d]+|\\d+";
    } else if (strcmp(type, "Punctuation") == 0) {
        pre->kind = TOK_PRE_PUNCT;
        re = "[^\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]+|"
             "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]+";
    } else if (strcmp(type, "Whitespace") == 0) {
        pre->kind = TOK_PRE_WHITESPACE;
        re = "\\w+|[^\\w\\s]+";
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        pre->kind = TOK_PRE_WSSPLIT;
        re = "\\S+";
    }
    if (re) {
        tok->npre++;
        return tok_regex_compile(&pre->re, re, strlen(re), true, err, errlen);
    }
    if (strcmp(type, "Metaspace") == 0) {
        json_t *r = json_object_get(p, "replacement");
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        if (!json_is_string(r) || json_string_length(r) == 0 ||
            json_string_length(r) >= sizeof(pre->meta)) {
            tok_set_err(err, errlen, "pre_tokenizer Metaspace: bad replacement");
            return PDTOK_ERR_INVALID;
        }
        pre->kind = TOK_PRE_METASPACE;
        pre->meta_len = json_string_length(r);
        memcpy(pre->meta, json_string_value(r), pre->meta_len);
        pre->add_prefix_space = jbool(p, "add_prefix_space", false);
        pre->prepend = !scheme || strcmp(scheme, "always") == 0 ? 1
                       : strcmp(scheme, "first") == 0           ? 2
                                                                : 0;
        tok->npre++;
        return PDTOK_OK;
    }
    tok_set_err(err, errlen, "pre_tokenizer %s is not supported", type);
    return PDTOK_ERR_UNSUPPORTED;
}

/* ---- decoders ---- */

static pdtok_status_t add_dec(pdtok_t *tok, const json_t *d, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) {
        tok_set_err(err, errlen, "decoder without a type");
        return PDTOK_ERR_INVALID;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(d, "decoders"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            pdtok_status_t st = add_dec(tok, x, err, errlen);
            if (st != PDTOK_OK)
                return st;
        }
        return PDTOK_OK;
    }
    if (tok->ndec == TOK_MAX_CHAIN)
        return too_long("decoder", err, errlen);
    tok_dec_t *dc = &tok->dec[tok->ndec];
    memset(dc, 0, sizeof(*dc));
    if (strcmp(type, "ByteLevel") == 0)
        dc->kind = TOK_DEC_BYTELEVEL;
    else if (strcmp(type, "ByteFallback") == 0)
        dc->kind = TOK_DEC_BYTEFALLBACK;
    else if (strcmp(type, "Fuse") == 0)
        dc->kind = TOK_DEC_FUSE;
    else if (strcmp(type, "Strip") == 0) {
        const char *c = json_string_value(json_object_get(d, "content"));
        json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
        if (!c || strlen(c) != 1 || !json_is_integer(start) || !json_is_integer(stop) ||
            json_integer_value(start) < 0 || json_integer_value(stop) < 0 ||
            json_integer_value(start) > 1024 || json_integer_value(stop) > 1024) {
            tok_set_err(err, errlen, "decoder Strip: only one ASCII character, small counts");
            return PDTOK_ERR_UNSUPPORTED;
        }
        dc->kind = TOK_DEC_STRIP;
        dc->strip_char = c[0];
        dc->start = (int)json_integer_value(start);
        dc->stop = (int)json_integer_value(stop);
    } else if (strcmp(type, "Replace") == 0 || strcmp(type, "Metaspace") == 0) {
        bool meta = type[0] == 'M';
        bool is_re = false;
        const char *s = NULL, *c = " ";
        size_t len = 0, clen = 1;
        if (meta) {
            json_t *r = json_object_get(d, "replacement");
            s = json_string_value(r);
            len = json_string_length(r);
            dc->add_prefix_space = jbool(d, "add_prefix_space", false);
        } else {
            json_t *content = json_object_get(d, "content");
            if (!pattern_of(json_object_get(d, "pattern"), &is_re, &s, &len) ||
                !json_is_string(content)) {
                tok_set_err(err, errlen, "decoder Replace needs a pattern and a content");
                return PDTOK_ERR_INVALID;
            }
            c = json_string_value(content);
            clen = json_string_length(content);
        }
        if (!s || len == 0 || is_re || strchr(c, '$')) {
            tok_set_err(err, errlen, "decoder %s: only a non-empty String pattern, no '$'", type);
            return PDTOK_ERR_UNSUPPORTED;
        }
        dc->kind = meta ? TOK_DEC_METASPACE : TOK_DEC_REPLACE;
        dc->alen = len;
        dc->blen = clen;
        dc->a = dup_n(s, len);
        dc->b = dup_n(c, clen);
        tok->ndec++;
        return dc->a && dc->b ? PDTOK_OK : PDTOK_ERR_NOMEM;
    } else {
        tok_set_err(err, errlen, "decoder %s is not supported", type);
        return PDTOK_ERR_UNSUPPORTED;
    }
    tok->ndec++;
    return PDTOK_OK;
}

pdtok_status_t tok_load_parts(pdtok_t *tok, const json_t *root, char *err, size_t errlen)
{
    json_t *n = json_object_get(root, "normalizer");
    json_t *p = json_object_get(root, "pre_tokenizer");
    json_t *d = json_object_get(root, "decoder");
    pdtok_status_t st = PDTOK_OK;
    if (n && !json_is_null(n))
        st = add_norm(tok, n, err, errlen);
    if (st == PDTOK_OK && p && !json_is_null(p))
        st = add_pre(tok, p, err, errlen);
    if (st == PDTOK_OK && d && !json_is_null(d)) {
        tok->has_decoder = true;
        st = add_dec(tok, d, err, errlen);
    }
    return st;
}

/* ---- post-processor ---- */

static pdtok_status_t add_template(pdtok_t *tok, const json_t *tp, char *err, size_t errlen)
{
    json_t *single = json_object_get(tp, "single"), *item;
    size_t i;
    bool seen_a = false;
    if (!json_is_array(single)) {
        tok_set_err(err, errlen, "TemplateProcessing without a single template");
        return PDTOK_ERR_INVALID;
    }
    json_array_foreach(single, i, item)
    {
        json_t *sp = json_object_get(item, "SpecialToken");
        json_t *seq = json_object_get(item, "Sequence");
        if (seq) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_a) {
                tok_set_err(err, errlen, "TemplateProcessing: single template must hold A once");
                return PDTOK_ERR_UNSUPPORTED;
            }
            seen_a = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        int32_t id = name ? pdtok_token_to_id(tok, name, strlen(name)) : -1;
        if (id < 0) {
            tok_set_err(err, errlen,
                        "TemplateProcessing: special token %s is not in the vocabulary",
                        name ? name : "(none)");
            return PDTOK_ERR_INVALID;
        }
        int32_t *list = seen_a ? tok->post_ids : tok->bos_template;
        size_t *cnt = seen_a ? &tok->npost : &tok->nbos_pre;
        if (*cnt == TOK_MAX_CHAIN)
            return too_long("template", err, errlen);
        list[(*cnt)++] = id;
    }
    return PDTOK_OK;
}

pdtok_status_t tok_load_post(pdtok_t *tok, const json_t *post, char *err, size_t errlen)
{
    if (!post || json_is_null(post))
        return PDTOK_OK;
    const char *type = json_string_value(json_object_get(post, "type"));
    if (type && strcmp(type, "ByteLevel") == 0)
        return PDTOK_OK; /* offsets only: ids unchanged */
    if (type && strcmp(type, "TemplateProcessing") == 0)
        return add_template(tok, post, err, errlen);
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(post, "processors"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            pdtok_status_t st = tok_load_post(tok, x, err, errlen);
            if (st != PDTOK_OK)
                return st;
        }
        return PDTOK_OK;
    }
    tok_set_err(err, errlen, "post_processor %s is not supported", type ? type : "(no type)");
    return PDTOK_ERR_UNSUPPORTED;
}
