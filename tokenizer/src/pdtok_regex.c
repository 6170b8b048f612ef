/*
 * pdtok_regex.c - the split patterns of tokenizer.json, compiled with PCRE2.
 *
 * The reference tokenizer runs the patterns as JavaScript RegExps with the "u" flag, so a
 * pattern is read the way that engine reads it (ECMAScript RegExp semantics): \s is
 * JavaScript's white space (with U+FEFF, without U+0085), \d and \w are ASCII, "." excludes
 * all four line terminators, and the contraction group (?i:'s|'t|...) is matched case by
 * case in ASCII only, as the reference rewrites it (transformers.js tokenizers.js,
 * PROBLEMATIC_REGEX_MAP). Other inline flags are refused: the reference cannot run them.
 * Matching state (match data, JIT stack) is per thread, so one compiled pattern serves all.
 */
#include <pthread.h>
#include <string.h>

#include "pdb/pdb_alloc.h"
#include "pdb/pdb_buf.h"
#include "pdtok_int.h"

#define JS_SPACE_SET                                                                               \
    "\\t-\\r "                                                                                     \
    "\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"

static const char contraction_group[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
static const char contraction_js[] = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";

/* ECMAScript -> PCRE2 syntax for the constructs whose meaning differs. */
static pdtok_status_t translate_js(const char *p, size_t n, pdb_buf_t *out, char *err,
                                   size_t errlen)
{
    bool in_class = false;
    size_t cl = sizeof(contraction_group) - 1;
    for (size_t i = 0; i < n; i++) {
        pdb_status_t ok = PDB_OK;
        if (!in_class && n - i >= cl && memcmp(p + i, contraction_group, cl) == 0) {
            ok = pdb_buf_append_str(out, contraction_js);
            i += cl - 1;
        } else if (p[i] == '\\' && i + 1 < n) {
            char c = p[++i];
            if (c == 's')
                ok = pdb_buf_append_str(out, in_class ? JS_SPACE_SET : "[" JS_SPACE_SET "]");
            else if (c == 'S' && !in_class)
                ok = pdb_buf_append_str(out, "[^" JS_SPACE_SET "]");
            else if (c == 'S') {
                tok_set_err(err, errlen, "pattern uses \\S inside a character class");
                return PDTOK_ERR_UNSUPPORTED;
            } else if (c == 'u' && i + 4 < n && p[i + 1] != '{') {
                ok = pdb_buf_appendf(out, "\\x{%.4s}", p + i + 1);
                i += 4;
            } else if (c == 'u' && i + 1 < n && p[i + 1] == '{') {
                ok = pdb_buf_append_str(out, "\\x");
            } else {
                char esc[2] = {'\\', c};
                ok = pdb_buf_append(out, esc, 2);
            }
        } else if (p[i] == '[' && !in_class) {
            in_class = true;
            ok = pdb_buf_append_char(out, '[');
            if (i + 1 < n && p[i + 1] == '^')
                ok = pdb_buf_append_char(out, p[++i]);
            if (ok == PDB_OK && i + 1 < n && p[i + 1] == ']') {
                /* "[]" matches nothing in ECMAScript, but opens a class holding ']' in PCRE. */
                tok_set_err(err, errlen, "pattern has an empty character class");
                return PDTOK_ERR_UNSUPPORTED;
            }
        } else if (p[i] == ']' && in_class) {
            in_class = false;
            ok = pdb_buf_append_char(out, ']');
        } else if (p[i] == '.' && !in_class) {
            ok = pdb_buf_append_str(out, "[^\\n\\r\\x{2028}\\x{2029}]");
        } else if (p[i] == '(' && !in_class && i + 2 < n && p[i + 1] == '?' &&
                   strchr("imsx-", p[i + 2])) {
            tok_set_err(err, errlen, "pattern uses inline flags at offset %zu", i);
            return PDTOK_ERR_UNSUPPORTED;
        } else {
            ok = pdb_buf_append_char(out, p[i]);
        }
        if (ok != PDB_OK)
            return PDTOK_ERR_NOMEM;
    }
    return PDTOK_OK;
}

pdtok_status_t tok_regex_compile(tok_regex_t *re, const char *pattern, size_t len,
                                 bool js_semantics, char *err, size_t errlen)
{
    pdb_buf_t buf = PDB_BUF_INIT;
    uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
    const char *pat = pattern;
    size_t plen = len;
    if (js_semantics) {
        pdtok_status_t st = translate_js(pattern, len, &buf, err, errlen);
        if (st != PDTOK_OK) {
            pdb_buf_free(&buf);
            return st;
        }
        pat = buf.data ? buf.data : "";
        plen = buf.len;
    } else {
        opts |= PCRE2_UCP; /* Unicode \s \d \w, as the Rust tokenizers' regex crate reads them */
    }
    int code;
    PCRE2_SIZE off;
    re->code = pcre2_compile((PCRE2_SPTR)pat, plen, opts, &code, &off, NULL);
    pdb_buf_free(&buf);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof(msg));
        tok_set_err(err, errlen, "pattern does not compile: %s (offset %zu)", (char *)msg,
                    (size_t)off);
        return PDTOK_ERR_UNSUPPORTED;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return PDTOK_OK;
}

pdtok_status_t tok_regex_compile_literal(tok_regex_t *re, const char *s, size_t len, char *err,
                                         size_t errlen)
{
    int code;
    PCRE2_SIZE off;
    re->code = pcre2_compile((PCRE2_SPTR)s, len, PCRE2_UTF | PCRE2_LITERAL, &code, &off, NULL);
    if (!re->code) {
        tok_set_err(err, errlen, "split string does not compile (PCRE2 error %d)", code);
        return PDTOK_ERR_UNSUPPORTED;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return PDTOK_OK;
}

void tok_regex_free(tok_regex_t *re)
{
    if (re->code)
        pcre2_code_free(re->code);
    re->code = NULL;
}

/* ---- per-thread matching state ---- */
typedef struct match_state {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
} match_state_t;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
static _Thread_local match_state_t *tls_state;

static void state_destroy(void *p)
{
    match_state_t *s = p;
    if (!s)
        return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->stack);
    pdb_free(s);
}

static void state_key_create(void)
{
    pthread_key_create(&state_key, state_destroy);
}

static match_state_t *thread_state(void)
{
    if (tls_state)
        return tls_state;
    pthread_once(&state_once, state_key_create);
    match_state_t *s = pdb_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx || !s->stack) {
        state_destroy(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->stack);
    pthread_setspecific(state_key, s);
    tls_state = s;
    return s;
}

int tok_regex_find(const tok_regex_t *re, const char *s, size_t n, size_t start, size_t *ms,
                   size_t *me)
{
    match_state_t *st = thread_state();
    if (!st)
        return PDTOK_ERR_NOMEM;
    int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, 0, st->md, st->mctx)
                     : pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, st->md,
                                   st->mctx);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return PDTOK_ERR_REGEX;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
