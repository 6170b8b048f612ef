/*
 * pdgw_validate_flat.c - a completions body validated on its text, without a tree.
 *
 * Most completions bodies are a handful of scalar members (model, prompt, max_tokens,
 * temperature, stream, ...). Parsing one into jansson's tree, walking the tree and freeing it
 * took 10 of a proxied request's 17 allocations, and a forwarder that sends the client's bytes
 * as they came never reads that tree. This walk reaches the decision pdgw_request_parse +
 * pdgw_request_validate + pdgw_request_pd_fields reach for such a body, in one pass of the
 * fast parser that builds nothing, and declines every other body: an array or an object under
 * a rule, a model or prompt with escapes, a name with escapes, a value a rule refuses, a PD
 * control field, chat. A declined body goes the tree's way, so refusals and their messages
 * stay the tree validator's alone.
 */
#include <stdlib.h>
#include <string.h>

#include "pdgw_json_load.h"

#include "pdgw_validate_int.h"

#define NAME_MAX_FLAT 128 /* a longer member name is not copied: its body is declined */
#define NUMBER_MAX    64  /* pdgw_json_check_members declines longer number tokens */

typedef enum token {
    TOK_NULL,
    TOK_TRUE,
    TOK_FALSE,
    TOK_INT,
    TOK_REAL,
    TOK_STRING,
    TOK_OTHER, /* an array or an object */
} token_t;

/* The kind of the value whose bytes are <v> (syntax already checked). */
static token_t token_of(const char *v, size_t n)
{
    switch (v[0]) {
    case 'n':
        return TOK_NULL;
    case 't':
        return TOK_TRUE;
    case 'f':
        return TOK_FALSE;
    case '"':
        return TOK_STRING;
    case '{':
    case '[':
        return TOK_OTHER;
    default:
        for (size_t i = 0; i < n; i++)
            if (v[i] == '.' || v[i] == 'e' || v[i] == 'E')
                return TOK_REAL;
        return TOK_INT;
    }
}

/* The number token <v> as the tree holds it: an integer (TOK_INT) or a double. */
static bool number_of(const char *v, size_t n, token_t t, long long *i, double *d)
{
    char tok[NUMBER_MAX];
    if (t == TOK_INT && n <= 18) { /* checked JSON: an optional minus and digits, in range */
        long long x = 0;
        for (size_t k = v[0] == '-'; k < n; k++)
            x = x * 10 + (v[k] - '0');
        *i = v[0] == '-' ? -x : x;
        *d = (double)*i;
        return true;
    }
    if (n >= sizeof(tok))
        return false;
    memcpy(tok, v, n);
    tok[n] = '\0';
    if (t == TOK_INT) {
        *i = strtoll(tok, NULL, 10);
        *d = (double)*i; /* json_number_value of an integer */
    } else {
        *d = strtod(tok, NULL);
    }
    return true;
}

/* Does the optional-field rule <r> take the scalar <v> as the tree's check_rule would? Only
 * scalars are judged here: a rule that looks into an array or an object says no. */
static bool scalar_passes(const field_rule_t *r, token_t t, const char *v, size_t n)
{
    long long i = 0;
    double d = 0;
    switch (r->rule) {
    case R_BOOL:
        return t == TOK_TRUE || t == TOK_FALSE;
    case R_STRING:
    case R_STOP:
        return t == TOK_STRING;
    case R_INT:
        return t == TOK_INT && number_of(v, n, t, &i, &d) && i >= r->imin && i <= r->imax;
    case R_NUM:
        if ((t != TOK_INT && t != TOK_REAL) || !number_of(v, n, t, &i, &d))
            return false;
        if (r->min_open ? !(d > r->dmin) : !(d >= r->dmin))
            return false;
        return d <= r->dmax;
    default:
        return false;
    }
}

/* The walk's state: the last value of each member validation reads by name (a later
 * duplicate replaces an earlier one in the tree), and whether model and prompt are strings
 * as written (no escapes: their bytes between the quotes are their value). */
typedef struct flat_known {
    const char *const *client_fields;
    pdgw_json_member_t model, prompt, stream, max_tokens, n;
    bool has_model, has_prompt, has_stream, has_max_tokens, has_n;
    bool model_plain, prompt_plain;
    uint64_t names; /* every member's pdgw_json_name_bit */
} flat_known_t;

static void keep_known(flat_known_t *k, const char *name, const pdgw_json_member_t *m, bool plain)
{
    if (strcmp(name, "model") == 0) {
        k->model = *m;
        k->has_model = true;
        k->model_plain = plain;
    } else if (strcmp(name, "prompt") == 0) {
        k->prompt = *m;
        k->has_prompt = true;
        k->prompt_plain = plain;
    } else if (strcmp(name, "stream") == 0) {
        k->stream = *m;
        k->has_stream = true;
    } else if (strcmp(name, "max_tokens") == 0) {
        k->max_tokens = *m;
        k->has_max_tokens = true;
    } else if (name[0] == 'n' && name[1] == '\0') {
        k->n = *m;
        k->has_n = true;
    }
}

/* An integer member's value when it holds one, else <absent> (as the tree reads it). */
static int64_t int_or(bool has, const pdgw_json_member_t *m, int64_t absent)
{
    long long i = 0;
    double d = 0;
    if (!has || token_of(m->val, m->val_len) != TOK_INT ||
        !number_of(m->val, m->val_len, TOK_INT, &i, &d))
        return absent;
    return (int64_t)i;
}

/* One member of the body, its value already checked as JSON: false declines the body. */
static bool flat_member(void *arg, const pdgw_json_member_t *m, bool val_escaped)
{
    flat_known_t *k = arg;
    char name[NAME_MAX_FLAT];
    token_t t = token_of(m->val, m->val_len);

    if (m->key_escaped || m->key_len >= sizeof(name))
        return false;
    memcpy(name, m->key, m->key_len);
    name[m->key_len] = '\0';
    k->names |= pdgw_json_name_bit(name, m->key_len);
    if (pdgw_pd_field_named(name, k->client_fields))
        return false; /* refused, stripped or counted by the tree's check */
    keep_known(k, name, m, t == TOK_STRING && !val_escaped);
    const field_rule_t *r = t != TOK_NULL ? pdgw_validate_rule_for(name, API_CMPL) : NULL;
    return r == NULL || scalar_passes(r, t, m->val, m->val_len);
}

bool pdgw_request_validate_flat(pdgw_api_kind_t kind, const char *body, size_t len,
                                const char *const *client_fields, pdgw_request_info_t *info,
                                char *model, size_t model_cap)
{
    flat_known_t k;

    /* chat's messages are checked and joined into the prompt text on the tree */
    if (kind != PDGW_API_COMPLETIONS || body == NULL)
        return false;
    memset(&k, 0, sizeof(k));
    k.client_fields = client_fields;
    if (!pdgw_json_check_members(body, len, flat_member, &k))
        return false;
    /* model: a non-empty string; prompt: one string (arrays are the tree's); both as written
     * (an escape needs decoding: the tree's) */
    if (!k.has_model || !k.model_plain || k.model.val_len <= 2 || k.model.val_len - 2 >= model_cap)
        return false;
    if (!k.has_prompt || !k.prompt_plain)
        return false;
    memcpy(model, k.model.val + 1, k.model.val_len - 2);
    model[k.model.val_len - 2] = '\0';

    memset(info, 0, sizeof(*info));
    info->kind = kind;
    info->model = model;
    info->stream = k.has_stream && token_of(k.stream.val, k.stream.val_len) == TOK_TRUE;
    info->include_usage = false; /* a stream_options object was declined above */
    info->max_tokens = int_or(k.has_max_tokens, &k.max_tokens, -1);
    info->n = int_or(k.has_n, &k.n, 1);
    info->prompt_text = k.prompt.val + 1; /* borrowed from the body, like the tree's */
    info->prompt_text_len = k.prompt.val_len - 2;
    info->n_prompts = 1;
    info->est_prompt_tokens = pdgw_validate_est_tokens(info->prompt_text_len);
    info->member_names = k.names;
    return true;
}
