/*
 * pdtok_config.c - tokenizer_config.json beside tokenizer.json (optional): the texts of
 * bos/eos/unk/pad, additional special tokens (skipped by decode with skip_special) and
 * clean_up_tokenization_spaces. Also which ids are special.
 */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_map.h"
#include "pdtok_int.h"

/* A token entry: a string, or an AddedToken object with "content". Borrowed. */
static const char *token_text(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static pdtok_status_t set_special(pdtok_t *tok, pdtok_special_t which, const char *text)
{
    if (!text)
        return PDTOK_OK;
    char *d = pdb_strdup(text);
    if (!d)
        return PDTOK_ERR_NOMEM;
    pdb_free(tok->special_text[which]);
    tok->special_text[which] = d;
    tok->special_id[which] = pdtok_token_to_id(tok, text, strlen(text));
    return PDTOK_OK;
}

/* id_special[id] for every id whose text is a special added token or listed as additional. */
static pdtok_status_t mark_special(pdtok_t *tok, const json_t *extra)
{
    pdb_map_t set;
    if (pdb_map_init(&set, tok->nadded + 16) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    pdtok_status_t st = PDTOK_OK;
    for (size_t i = 0; i < tok->nadded && st == PDTOK_OK; i++) {
        if (!tok->added[i].special)
            continue;
        pdb_status_t r =
            pdb_map_put(&set, tok_sym_text(&tok->syms, (int32_t)tok->added[i].sym), tok);
        st = r == PDB_OK || r == PDB_ERR_EXISTS ? PDTOK_OK : PDTOK_ERR_NOMEM;
    }
    size_t i;
    json_t *v;
    json_array_foreach((json_t *)extra, i, v)
    {
        const char *t = token_text(v);
        if (!t || st != PDTOK_OK)
            continue;
        pdb_status_t r = pdb_map_put(&set, t, tok);
        st = r == PDB_OK || r == PDB_ERR_EXISTS ? PDTOK_OK : PDTOK_ERR_NOMEM;
    }
    for (size_t id = 0; id < tok->nids && st == PDTOK_OK; id++)
        if (tok->id_sym[id] >= 0 && pdb_map_get(&set, tok_sym_text(&tok->syms, tok->id_sym[id])))
            tok->id_special[id] = 1;
    pdb_map_fini(&set, NULL);
    return st;
}

pdtok_status_t tok_load_config(pdtok_t *tok, const char *dir, char *err, size_t errlen)
{
    pdb_buf_t path = PDB_BUF_INIT;
    json_t *cfg = NULL;
    struct stat sb;
    tok->clean_up_spaces = true; /* the reference's default when the key is absent */
    if (pdb_buf_appendf(&path, "%s/tokenizer_config.json", dir) != PDB_OK)
        return PDTOK_ERR_NOMEM;
    if (stat(path.data, &sb) == 0) {
        json_error_t je;
        /* model_max_length is often 1e30, past any integer: read numbers as reals. */
        cfg = json_load_file(path.data, JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg || !json_is_object(cfg)) {
            tok_set_err(err, errlen, "%s:%d: %s", path.data, je.line,
                        cfg ? "not an object" : je.text);
            json_decref(cfg);
            pdb_buf_free(&path);
            return PDTOK_ERR_INVALID;
        }
    }
    pdb_buf_free(&path);
    pdtok_status_t st = PDTOK_OK;
    if (tok->unk_id >= 0)
        st = set_special(tok, PDTOK_SPECIAL_UNK, pdtok_id_to_token(tok, tok->unk_id, NULL));
    if (cfg) {
        json_t *c = json_object_get(cfg, "clean_up_tokenization_spaces");
        if (json_is_boolean(c))
            tok->clean_up_spaces = json_is_true(c);
        static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
        for (size_t i = 0; i < 4 && st == PDTOK_OK; i++)
            st = set_special(tok, (pdtok_special_t)i, token_text(json_object_get(cfg, keys[i])));
        if (st == PDTOK_OK && !tok->special_text[PDTOK_SPECIAL_PAD]) /* pad falls back to eos */
            st = set_special(tok, PDTOK_SPECIAL_PAD, tok->special_text[PDTOK_SPECIAL_EOS]);
    }
    if (st == PDTOK_OK)
        st = mark_special(tok, json_object_get(cfg, "additional_special_tokens"));
    json_decref(cfg);
    return st;
}
