/*
 * pdtok_load.c - tokenizer.json -> the compact tables of pdtok_t: the model (BPE vocabulary,
 * merges, options) and the added tokens. The pipeline parts (normalizer, pre-tokenizer,
 * post-processor, decoder) are read by pdtok_load_parts.c. Anything that cannot be run
 * exactly is refused with a message naming it.
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pdb/pdb_alloc.h"
#include "pdtok_int.h"
#include "pdtok_load_int.h"

#define MAX_TOKEN_ID (1 << 24)
#define MAX_FILE     (1ULL << 31)

static atomic_uint_fast64_t next_instance = 1;

static bool jbool(const json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* Highest id named by the vocabulary or the added tokens, or -1 with a message. */
static int64_t max_id(const json_t *vocab, const json_t *added, char *err, size_t errlen)
{
    int64_t m = -1;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)vocab, k, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= MAX_TOKEN_ID) {
            tok_set_err(err, errlen, "model.vocab: token \"%.40s\" has a bad id", k);
            return -2;
        }
        if (json_integer_value(v) > m)
            m = json_integer_value(v);
    }
    size_t i;
    json_array_foreach((json_t *)added, i, v)
    {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= MAX_TOKEN_ID) {
            tok_set_err(err, errlen, "added_tokens[%zu]: bad or missing id", i);
            return -2;
        }
        if (json_integer_value(id) > m)
            m = json_integer_value(id);
    }
    return m;
}

static pdtok_status_t set_token(pdtok_t *tok, const char *s, size_t len, int32_t id)
{
    int32_t sym;
    pdtok_status_t st = tok_syms_intern(&tok->syms, s, len, &sym);
    if (st != PDTOK_OK)
        return st;
    tok->syms.tok_id[sym] = id;
    tok->id_sym[id] = sym;
    return PDTOK_OK;
}

static pdtok_status_t load_merges(pdtok_t *tok, const json_t *merges, char *err, size_t errlen)
{
    size_t i;
    json_t *m;
    pdb_buf_t cat = PDB_BUF_INIT;
    pdtok_status_t st = tok_merges_init(&tok->merges, json_array_size(merges));
    json_array_foreach((json_t *)merges, i, m)
    {
        if (st != PDTOK_OK)
            break;
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(m)) {
            /* "left right": split at the first space; like the reference, the right part
             * ends at the next space. */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp) {
                tok_set_err(err, errlen, "model.merges[%zu]: no space in \"%.40s\"", i, a);
                st = PDTOK_ERR_INVALID;
                break;
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            const char *sp2 = strchr(b, ' ');
            blen = sp2 ? (size_t)(sp2 - b) : strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            tok_set_err(err, errlen, "model.merges[%zu]: not a pair of strings", i);
            st = PDTOK_ERR_INVALID;
            break;
        }
        int32_t sa, sb, sm;
        pdb_buf_reset(&cat);
        if (pdb_buf_append(&cat, a, alen) != PDB_OK || pdb_buf_append(&cat, b, blen) != PDB_OK) {
            st = PDTOK_ERR_NOMEM;
            break;
        }
        if ((st = tok_syms_intern(&tok->syms, a, alen, &sa)) != PDTOK_OK ||
            (st = tok_syms_intern(&tok->syms, b, blen, &sb)) != PDTOK_OK ||
            (st = tok_syms_intern(&tok->syms, cat.data, cat.len, &sm)) != PDTOK_OK)
            break;
        tok_merges_put(&tok->merges, sa, sb, (uint32_t)i, sm);
    }
    pdb_buf_free(&cat);
    return st;
}

static pdtok_status_t load_model(pdtok_t *tok, const json_t *model, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (type && strcmp(type, "BPE") != 0) {
        tok_set_err(err, errlen, "model type %s is not supported (BPE only)", type);
        return PDTOK_ERR_UNSUPPORTED;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        tok_set_err(err, errlen, "model: BPE needs a vocab object and a merges array");
        return type ? PDTOK_ERR_INVALID : PDTOK_ERR_UNSUPPORTED;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0) {
        tok_set_err(err, errlen, "model.dropout is not supported (random merges)");
        return PDTOK_ERR_UNSUPPORTED;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix",
                                          "continuing_subword_suffix"};
    for (size_t i = 0; i < 3; i++) {
        const char *v = json_string_value(json_object_get(model, affixes[i]));
        if (v && *v) {
            tok_set_err(err, errlen, "model.%s \"%s\" is not supported", affixes[i], v);
            return PDTOK_ERR_UNSUPPORTED;
        }
    }
    tok->byte_fallback = jbool(model, "byte_fallback", false);
    tok->fuse_unk = jbool(model, "fuse_unk", false);
    tok->ignore_merges = jbool(model, "ignore_merges", false);

    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v)
    {
        pdtok_status_t st = set_token(tok, k, strlen(k), (int32_t)json_integer_value(v));
        if (st != PDTOK_OK)
            return st;
    }
    return load_merges(tok, merges, err, errlen);
}

static pdtok_status_t load_added(pdtok_t *tok, const json_t *added, bool has_normalizer, char *err,
                                 size_t errlen)
{
    size_t n = json_array_size(added), i;
    json_t *a;
    tok->added = pdb_calloc(n ? n : 1, sizeof(*tok->added));
    if (!tok->added || tok_trie_init(&tok->trie, n * 8) != PDTOK_OK)
        return PDTOK_ERR_NOMEM;
    json_array_foreach((json_t *)added, i, a)
    {
        json_t *c = json_object_get(a, "content");
        if (!json_is_string(c) || json_string_length(c) == 0) {
            tok_set_err(err, errlen, "added_tokens[%zu]: content missing or empty", i);
            return PDTOK_ERR_INVALID;
        }
        if (jbool(a, "single_word", false)) {
            tok_set_err(err, errlen, "added token \"%.40s\": single_word is not supported",
                        json_string_value(c));
            return PDTOK_ERR_UNSUPPORTED;
        }
        bool special = jbool(a, "special", false);
        /* Matched on the raw text here; a normalized token would be matched after the
         * normalizer, which only agrees when there is none. */
        if (jbool(a, "normalized", !special) && has_normalizer) {
            tok_set_err(err, errlen,
                        "added token \"%.40s\": normalized=true with a normalizer is not "
                        "supported",
                        json_string_value(c));
            return PDTOK_ERR_UNSUPPORTED;
        }
        tok_added_t *t = &tok->added[tok->nadded];
        t->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->special = special;
        t->lstrip = jbool(a, "lstrip", false);
        t->rstrip = jbool(a, "rstrip", false);
        pdtok_status_t st = set_token(tok, json_string_value(c), json_string_length(c), t->id);
        if (st == PDTOK_OK)
            st = tok_trie_add(&tok->trie, json_string_value(c), json_string_length(c),
                              (int32_t)tok->nadded);
        if (st != PDTOK_OK)
            return st;
        t->sym = (uint32_t)tok->id_sym[t->id];
        tok->nadded++;
    }
    return PDTOK_OK;
}

static pdtok_status_t read_file(const char *file, json_t **root, char *err, size_t errlen)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tok_set_err(err, errlen, "%s: cannot open", file);
        return PDTOK_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 ||
        (unsigned long long)sb.st_size > MAX_FILE) {
        close(fd);
        tok_set_err(err, errlen, "%s: not a regular file of 1 byte to 2 GiB", file);
        return PDTOK_ERR_IO;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        tok_set_err(err, errlen, "%s: cannot map", file);
        return PDTOK_ERR_IO;
    }
    json_error_t je;
    *root = json_loadb(map, (size_t)sb.st_size, 0, &je);
    munmap(map, (size_t)sb.st_size);
    if (!*root) {
        tok_set_err(err, errlen, "%s:%d:%d: %s", file, je.line, je.column, je.text);
        return PDTOK_ERR_INVALID;
    }
    return PDTOK_OK;
}

/* <path> is the file or its directory: the tokenizer.json file and its directory. */
static pdtok_status_t resolve(const char *path, char **file, char **dir)
{
    struct stat sb;
    pdb_buf_t f = PDB_BUF_INIT, d = PDB_BUF_INIT;
    pdb_status_t ok;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        ok = pdb_buf_appendf(&f, "%s/tokenizer.json", path);
        if (ok == PDB_OK)
            ok = pdb_buf_append_str(&d, path);
    } else {
        ok = pdb_buf_append_str(&f, path);
        const char *slash = strrchr(path, '/');
        if (ok == PDB_OK)
            ok = slash ? pdb_buf_append(&d, path, (size_t)(slash - path) + (slash == path))
                       : pdb_buf_append_str(&d, ".");
    }
    if (ok != PDB_OK) {
        pdb_buf_free(&f);
        pdb_buf_free(&d);
        return PDTOK_ERR_NOMEM;
    }
    *file = pdb_buf_steal(&f, NULL);
    *dir = pdb_buf_steal(&d, NULL);
    return PDTOK_OK;
}

static pdtok_status_t build(pdtok_t *tok, json_t *root, char *err, size_t errlen)
{
    json_t *model = json_object_get(root, "model");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root) || !json_is_object(model)) {
        tok_set_err(err, errlen, "not a tokenizer.json: no \"model\" object");
        return PDTOK_ERR_INVALID;
    }
    if (added && !json_is_array(added)) {
        tok_set_err(err, errlen, "added_tokens is not an array");
        return PDTOK_ERR_INVALID;
    }
    json_t *vocab = json_object_get(model, "vocab");
    int64_t m = max_id(json_is_object(vocab) ? vocab : NULL, added, err, errlen);
    if (m < -1)
        return PDTOK_ERR_INVALID;
    tok->nids = (size_t)(m + 1);
    tok->id_sym = pdb_malloc((tok->nids ? tok->nids : 1) * sizeof(*tok->id_sym));
    tok->id_special = pdb_calloc(tok->nids ? tok->nids : 1, 1);
    if (!tok->id_sym || !tok->id_special)
        return PDTOK_ERR_NOMEM;
    memset(tok->id_sym, 0xff, (tok->nids ? tok->nids : 1) * sizeof(*tok->id_sym));
    size_t hint = (json_is_object(vocab) ? json_object_size(vocab) : 0) +
                  json_array_size(json_object_get(model, "merges")) + 1024;
    pdtok_status_t st = tok_syms_init(&tok->syms, hint);
    if (st == PDTOK_OK)
        st = load_model(tok, model, err, errlen);
    if (st == PDTOK_OK)
        st = tok_load_parts(tok, root, err, errlen);
    if (st == PDTOK_OK)
        st = load_added(tok, added, tok->nnorm > 0, err, errlen);
    if (st == PDTOK_OK)
        st = tok_load_post(tok, json_object_get(root, "post_processor"), err, errlen);
    if (st != PDTOK_OK)
        return st;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    int32_t usym = unk ? tok_syms_find(&tok->syms, unk, strlen(unk)) : -1;
    tok->unk_id = usym >= 0 ? tok->syms.tok_id[usym] : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        int32_t s = tok_syms_find(&tok->syms, name, 6);
        tok->byte_tok[b] = s >= 0 ? tok->syms.tok_id[s] : -1;
    }
    return PDTOK_OK;
}

pdtok_t *pdtok_load(const char *path, char *err, size_t errlen)
{
    tok_set_err(err, errlen, "ok");
    if (!path) {
        tok_set_err(err, errlen, "no path");
        return NULL;
    }
    pdtok_t *tok = pdb_calloc(1, sizeof(*tok));
    char *file = NULL, *dir = NULL;
    json_t *root = NULL;
    if (!tok || resolve(path, &file, &dir) != PDTOK_OK) {
        tok_set_err(err, errlen, "out of memory");
        goto err_free;
    }
    tok->instance = atomic_fetch_add(&next_instance, 1);
    for (size_t i = 0; i < 4; i++)
        tok->special_id[i] = -1;
    tok_bytelevel_tables(tok);
    pdtok_status_t st = read_file(file, &root, err, errlen);
    if (st == PDTOK_OK)
        st = build(tok, root, err, errlen);
    if (st == PDTOK_OK)
        st = tok_load_config(tok, dir, err, errlen);
    if (st != PDTOK_OK) {
        if (st == PDTOK_ERR_NOMEM)
            tok_set_err(err, errlen, "out of memory loading %s", file);
        goto err_free;
    }
    json_decref(root);
    pdb_free(file);
    pdb_free(dir);
    return tok;
err_free:
    json_decref(root);
    pdb_free(file);
    pdb_free(dir);
    pdtok_free(tok);
    return NULL;
}

pdtok_t *pdtok_load_json(const char *json, size_t len, char *err, size_t errlen)
{
    pdtok_t *tok = pdb_calloc(1, sizeof(*tok));
    json_error_t je;
    json_t *root;
    pdtok_status_t st;

    tok_set_err(err, errlen, "ok");
    if (tok == NULL || json == NULL) {
        tok_set_err(err, errlen, json == NULL ? "no text" : "out of memory");
        pdb_free(tok);
        return NULL;
    }
    tok->instance = atomic_fetch_add(&next_instance, 1);
    for (size_t i = 0; i < 4; i++)
        tok->special_id[i] = -1;
    tok_bytelevel_tables(tok);
    if (len > MAX_FILE || (root = json_loadb(json, len, 0, &je)) == NULL) {
        if (len > MAX_FILE)
            tok_set_err(err, errlen, "more than 2 GiB");
        else
            tok_set_err(err, errlen, "%d:%d: %s", je.line, je.column, je.text);
        pdtok_free(tok);
        return NULL;
    }
    st = build(tok, root, err, errlen);
    json_decref(root);
    if (st != PDTOK_OK) {
        if (st == PDTOK_ERR_NOMEM)
            tok_set_err(err, errlen, "out of memory");
        pdtok_free(tok);
        return NULL;
    }
    return tok;
}

void pdtok_free(pdtok_t *tok)
{
    if (!tok)
        return;
    tok_syms_free(&tok->syms);
    tok_merges_free(&tok->merges);
    tok_trie_free(&tok->trie);
    pdb_free(tok->id_sym);
    pdb_free(tok->id_special);
    pdb_free(tok->added);
    for (size_t i = 0; i < tok->nnorm; i++) {
        pdb_free(tok->norm[i].a);
        pdb_free(tok->norm[i].b);
        tok_regex_free(&tok->norm[i].re);
    }
    for (size_t i = 0; i < tok->npre; i++)
        tok_regex_free(&tok->pre[i].re);
    for (size_t i = 0; i < tok->ndec; i++) {
        pdb_free(tok->dec[i].a);
        pdb_free(tok->dec[i].b);
    }
    for (size_t i = 0; i < 4; i++)
        pdb_free(tok->special_text[i]);
    tok_regex_free(&tok->gpt2_re);
    pdb_free(tok);
}

/* ---- lookups ---- */

int32_t pdtok_token_to_id(const pdtok_t *tok, const char *token, size_t len)
{
    if (!tok || !token)
        return -1;
    int32_t s = tok_syms_find(&tok->syms, token, len);
    return s >= 0 ? tok->syms.tok_id[s] : -1;
}

const char *pdtok_id_to_token(const pdtok_t *tok, int32_t id, size_t *len)
{
    if (!tok || id < 0 || (size_t)id >= tok->nids || tok->id_sym[id] < 0)
        return NULL;
    if (len)
        *len = tok->syms.len[tok->id_sym[id]];
    return tok_sym_text(&tok->syms, tok->id_sym[id]);
}

size_t pdtok_vocab_size(const pdtok_t *tok)
{
    return tok ? tok->nids : 0;
}

bool pdtok_is_special(const pdtok_t *tok, int32_t id)
{
    return tok && id >= 0 && (size_t)id < tok->nids && tok->id_special[id];
}

const char *pdtok_special_token(const pdtok_t *tok, pdtok_special_t which, int32_t *id)
{
    if (!tok || (unsigned)which > PDTOK_SPECIAL_PAD) {
        if (id)
            *id = -1;
        return NULL;
    }
    if (id)
        *id = tok->special_id[which];
    return tok->special_text[which];
}
