/*
 * tmpl_lex.c - the template lexer.
 *
 * Whitespace handling matches the Hugging Face loaders: first the source is rewritten as
 * trim_blocks/lstrip_blocks prescribe (keeping each byte's source line for messages), then
 * "{%-" strips the text before a tag and "-%}" the white space after it.
 */
#include <stdlib.h>
#include <string.h>

#include "tmpl_lex.h"

typedef struct lexer {
    tmpl_arena_t *a;
    const char *s; /* preprocessed source */
    const int *line;
    size_t n, pos;
    tmpl_tok_t *toks;
    size_t ntok, cap;
} lexer_t;

size_t tmpl_space_at(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    if (n == 0)
        return 0;
    if (c == ' ' || (c >= '\t' && c <= '\r'))
        return 1;
    if (c < 0x80)
        return 0;
    unsigned char c1 = n > 1 ? (unsigned char)s[1] : 0, c2 = n > 2 ? (unsigned char)s[2] : 0;
    if (c == 0xc2 && c1 == 0xa0) /* U+00A0 */
        return 2;
    if (c == 0xe1 && c1 == 0x9a && c2 == 0x80) /* U+1680 */
        return 3;
    if (c == 0xe2 && c1 == 0x80 &&
        ((c2 >= 0x80 && c2 <= 0x8a) || c2 == 0xa8 || c2 == 0xa9 ||
         c2 == 0xaf)) /* U+2000-200A, 2028, 2029, 202F */
        return 3;
    if (c == 0xe2 && c1 == 0x81 && c2 == 0x9f) /* U+205F */
        return 3;
    if (c == 0xe3 && c1 == 0x80 && c2 == 0x80) /* U+3000 */
        return 3;
    if (c == 0xef && c1 == 0xbb && c2 == 0xbf) /* U+FEFF */
        return 3;
    return 0;
}

size_t tmpl_space_before(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (tmpl_space_at(s + n - k, k) == k)
            return k;
    return 0;
}

static _Noreturn void lex_fail(lexer_t *lx, const char *what)
{
    int line = lx->pos < lx->n ? lx->line[lx->pos] : (lx->n ? lx->line[lx->n - 1] : 1);
    tmpl_failf(lx->a->fail, "line %d: %s", line, what);
}

static tmpl_tok_t *push(lexer_t *lx, tmpl_tok_kind_t kind, const char *s, size_t len, int line)
{
    if (lx->ntok == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        tmpl_tok_t *t = tmpl_alloc(lx->a, cap * sizeof(*t));
        if (lx->ntok)
            memcpy(t, lx->toks, lx->ntok * sizeof(*t));
        lx->toks = t;
        lx->cap = cap;
    }
    tmpl_tok_t *t = &lx->toks[lx->ntok++];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->s = s;
    t->len = len;
    t->line = line;
    return t;
}

/* "{%-" / "{{-" / "{#-": the text before loses its trailing white space. */
static void strip_last_text(lexer_t *lx)
{
    if (lx->ntok == 0 || lx->toks[lx->ntok - 1].kind != T_TEXT)
        return;
    tmpl_tok_t *t = &lx->toks[lx->ntok - 1];
    size_t k;
    while (t->len > 0 && (k = tmpl_space_before(t->s, t->len)) > 0)
        t->len -= k;
    if (t->len == 0)
        lx->ntok--;
}

static void skip_space(lexer_t *lx)
{
    size_t k;
    while (lx->pos < lx->n && (k = tmpl_space_at(lx->s + lx->pos, lx->n - lx->pos)) > 0)
        lx->pos += k;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static void put_utf8(tmpl_arena_t *a, tmpl_sb_t *sb, unsigned cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    }
    tmpl_sb_add(a, sb, b, n);
}

static void lex_string(lexer_t *lx)
{
    char q = lx->s[lx->pos++];
    int line = lx->line[lx->pos - 1];
    tmpl_sb_t sb = {0};
    tmpl_sb_add(lx->a, &sb, "", 0);
    for (;;) {
        if (lx->pos >= lx->n)
            lex_fail(lx, "unterminated string literal");
        char c = lx->s[lx->pos++];
        if (c == q)
            break;
        if (c != '\\') {
            tmpl_sb_add(lx->a, &sb, &c, 1);
            continue;
        }
        if (lx->pos >= lx->n)
            lex_fail(lx, "unterminated string literal");
        char e = lx->s[lx->pos++];
        const char *map = "n\nt\tr\rb\bf\fv\v''\"\"\\\\";
        const char *m = NULL;
        for (const char *p = map; *p; p += 2)
            if (*p == e) {
                m = p + 1;
                break;
            }
        if (m != NULL) {
            tmpl_sb_add(lx->a, &sb, m, 1);
        } else if (e == 'x' || e == 'u') {
            int nd = e == 'x' ? 2 : 4;
            unsigned cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = lx->pos < lx->n ? hexval(lx->s[lx->pos]) : -1;
                if (h < 0)
                    lex_fail(lx, "invalid hexadecimal escape in string literal");
                cp = cp * 16 + (unsigned)h;
                lx->pos++;
            }
            put_utf8(lx->a, &sb, cp);
        } else {
            lex_fail(lx, "unsupported escape in string literal");
        }
    }
    push(lx, T_STR, sb.d, sb.len, line);
}

static const char *const OPS[] = {"<=", ">=", "==", "!=", "**", "//", "(", ")", "{",
                                  "}",  "[",  "]",  ",",  ".",  ":",  "|", "<", ">",
                                  "+",  "-",  "~",  "*",  "/",  "%",  "="};

/* Tokens inside {{ }} or {% %}, up to and including the closing delimiter. */
static void lex_tag(lexer_t *lx, int stmt)
{
    int depth = 0;
    for (;;) {
        skip_space(lx);
        if (lx->pos >= lx->n)
            lex_fail(lx, stmt ? "unclosed '{%' tag" : "unclosed '{{' tag");
        const char *p = lx->s + lx->pos;
        size_t left = lx->n - lx->pos;
        int line = lx->line[lx->pos];
        int dash = left >= 3 && p[0] == '-' &&
                   ((stmt && p[1] == '%' && p[2] == '}') || (!stmt && p[1] == '}' && p[2] == '}'));
        if (dash || (left >= 2 && ((stmt && p[0] == '%' && p[1] == '}') ||
                                   (!stmt && depth == 0 && p[0] == '}' && p[1] == '}')))) {
            push(lx, stmt ? T_CLOSE_STMT : T_CLOSE_EXPR, p, 2, line);
            lx->pos += dash ? 3 : 2;
            if (dash)
                skip_space(lx);
            return;
        }
        if (left >= 2 && ((p[0] == '%' && p[1] == '}') || (p[0] == '}' && p[1] == '}' && !depth)))
            lex_fail(lx, "mismatched tag delimiters");
        if (left >= 2 && p[0] == '{' && (p[1] == '%' || p[1] == '{' || p[1] == '#'))
            lex_fail(lx, "tag opened inside a tag");
        unsigned char c = (unsigned char)*p;
        if (c == '\'' || c == '"') {
            lex_string(lx);
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t e = 0;
            while (e < left && p[e] >= '0' && p[e] <= '9')
                e++;
            int isfloat = 0;
            int after_dot = lx->ntok > 0 && lx->toks[lx->ntok - 1].kind == T_OP &&
                            lx->toks[lx->ntok - 1].s[0] == '.';
            if (!after_dot && e + 1 < left && p[e] == '.' && p[e + 1] >= '0' && p[e + 1] <= '9') {
                isfloat = 1;
                e++;
                while (e < left && p[e] >= '0' && p[e] <= '9')
                    e++;
            }
            char *num = tmpl_strndup(lx->a, p, e);
            tmpl_tok_t *t = push(lx, isfloat ? T_FLOAT : T_INT, num, e, line);
            if (isfloat)
                t->f = strtod(num, NULL);
            else
                t->i = strtoll(num, NULL, 10);
            if (!isfloat && e > 18)
                lex_fail(lx, "integer literal too large");
            lx->pos += e;
            continue;
        }
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t e = 0;
            while (e < left && (p[e] == '_' || (p[e] >= 'a' && p[e] <= 'z') ||
                                (p[e] >= 'A' && p[e] <= 'Z') || (p[e] >= '0' && p[e] <= '9')))
                e++;
            push(lx, T_NAME, p, e, line);
            lx->pos += e;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
            size_t ol = strlen(OPS[k]);
            if (ol <= left && memcmp(p, OPS[k], ol) == 0)
                break;
        }
        if (k == sizeof(OPS) / sizeof(OPS[0]))
            lex_fail(lx, "unexpected character in tag");
        size_t ol = strlen(OPS[k]);
        if (OPS[k][0] == '{')
            depth++;
        else if (OPS[k][0] == '}' && depth > 0)
            depth--;
        push(lx, T_OP, OPS[k], ol, line);
        lx->pos += ol;
    }
}

/* The trim_blocks / lstrip_blocks rewrite, with each kept byte's source line. */
static void preprocess(lexer_t *lx, const char *src, size_t len)
{
    if (len > 0 && src[len - 1] == '\n')
        len--;
    char *s1 = tmpl_alloc(lx->a, len + 1);
    int *l1 = tmpl_alloc(lx->a, (len + 1) * sizeof(int));
    size_t n1 = 0;
    int line = 1;
    for (size_t i = 0; i < len;) {
        if (i == 0 || src[i - 1] == '\n') { /* lstrip_blocks: blanks before a block tag */
            size_t j = i;
            while (j < len && (src[j] == ' ' || src[j] == '\t'))
                j++;
            if (j + 1 < len && src[j] == '{' &&
                (src[j + 1] == '%' || src[j + 1] == '#' || src[j + 1] == '-'))
                i = j;
        }
        if (i >= len)
            break;
        s1[n1] = src[i];
        l1[n1++] = line;
        if (src[i++] == '\n')
            line++;
    }
    char *s2 = tmpl_alloc(lx->a, n1 + 1);
    int *l2 = tmpl_alloc(lx->a, (n1 + 1) * sizeof(int));
    size_t n2 = 0;
    for (size_t i = 0; i < n1; i++) { /* trim_blocks: the newline after a block tag */
        if (s1[i] == '\n' && i >= 2 && s1[i - 1] == '}' &&
            (s1[i - 2] == '%' || s1[i - 2] == '#' || s1[i - 2] == '-'))
            continue;
        s2[n2] = s1[i];
        l2[n2++] = l1[i];
    }
    lx->s = s2;
    lx->line = l2;
    lx->n = n2;
}

tmpl_tok_t *tmpl_lex(tmpl_arena_t *a, const char *src, size_t len, size_t *count)
{
    lexer_t lx = {.a = a};
    preprocess(&lx, src, len);
    while (lx.pos < lx.n) {
        const char *p = lx.s + lx.pos;
        size_t left = lx.n - lx.pos;
        int line = lx.line[lx.pos];
        if (left >= 2 && p[0] == '{' && p[1] == '#') {
            const char *end = NULL;
            for (size_t k = 2; k + 1 < left; k++)
                if (p[k] == '#' && p[k + 1] == '}') {
                    end = p + k;
                    break;
                }
            if (end == NULL)
                lex_fail(&lx, "unclosed comment");
            if (left > 2 && p[2] == '-')
                strip_last_text(&lx);
            int strip_after = end > p + 2 && end[-1] == '-';
            lx.pos = (size_t)(end - lx.s) + 2;
            if (strip_after)
                skip_space(&lx);
            /* A comment ends text: what follows is a new text token. */
            push(&lx, T_CLOSE_STMT, "#}", 0, line)->i = 1;
            continue;
        }
        if (left >= 2 && p[0] == '{' && (p[1] == '%' || p[1] == '{')) {
            int stmt = p[1] == '%';
            lx.pos += 2;
            if (left >= 3 && p[2] == '-') {
                strip_last_text(&lx);
                lx.pos++;
            }
            push(&lx, stmt ? T_OPEN_STMT : T_OPEN_EXPR, p, 2, line);
            lex_tag(&lx, stmt);
            continue;
        }
        size_t e = 0;
        while (e < left && !(p[e] == '{' && e + 1 < left &&
                             (p[e + 1] == '%' || p[e + 1] == '{' || p[e + 1] == '#')))
            e++;
        push(&lx, T_TEXT, p, e, line);
        lx.pos += e;
    }
    /* Drop the markers comments left behind. */
    size_t w = 0;
    for (size_t r = 0; r < lx.ntok; r++)
        if (!(lx.toks[r].kind == T_CLOSE_STMT && lx.toks[r].i == 1))
            lx.toks[w++] = lx.toks[r];
    lx.ntok = w;
    push(&lx, T_EOF, "", 0, lx.n ? lx.line[lx.n - 1] : 1);
    *count = lx.ntok;
    return lx.toks;
}
