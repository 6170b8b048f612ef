/*
 * libpdtok's tokenizer on tiny tokenizer.json files written by the test: merges by rank and
 * position, byte fallback and fuse_unk, added tokens with lstrip/rstrip, byte-level input
 * with invalid UTF-8, decode, refusal of files it cannot run, allocation failures, and one
 * tokenizer shared by several threads.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdb/pdb_alloc.h"
#include "pdtok/tokenizer.h"

static char tmpdir[64];

/* Writes <json> (stolen) as <tmpdir>/<name>/tokenizer.json; returns the directory. */
static const char *write_tok(const char *name, json_t *json)
{
    static char dir[128];
    char file[192];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    if (access(dir, F_OK) != 0)
        assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(file, sizeof(file), "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(json, file, 0), 0);
    json_decref(json);
    return dir;
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char file[192];
    snprintf(file, sizeof(file), "%s/%s", dir, name);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A BPE model over single letters with the merges given, in rank order. */
static json_t *letters_model(const char *merges_json, bool byte_fallback, bool fuse_unk)
{
    json_t *vocab = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "<unk>", 0, "a", 1, "b", 2, "c",
                              3, "ab", 4, "bc", 5, "abc", 6, "aa", 7);
    if (byte_fallback) {
        json_object_set_new(vocab, "<0xC3>", json_integer(8));
        json_object_set_new(vocab, "<0xA9>", json_integer(9));
    }
    json_t *model = json_pack("{s:s,s:o,s:o,s:s,s:b,s:b}", "type", "BPE", "vocab", vocab, "merges",
                              json_loads(merges_json, 0, NULL), "unk_token", "<unk>",
                              "byte_fallback", byte_fallback, "fuse_unk", fuse_unk);
    return json_pack("{s:[],s:n,s:n,s:n,s:n,s:o}", "added_tokens", "normalizer", "pre_tokenizer",
                     "post_processor", "decoder", "model", model);
}

static pdtok_t *load_ok(const char *dir)
{
    char err[256];
    pdtok_t *t = pdtok_load(dir, err, sizeof(err));
    if (!t)
        fail_msg("load %s: %s", dir, err);
    return t;
}

static void expect_ids(const pdtok_t *t, const char *text, size_t len, bool special,
                       const int32_t *want, size_t n)
{
    pdtok_ids_t ids = {0};
    assert_int_equal(pdtok_encode(t, text, len, special, &ids), PDTOK_OK);
    if (ids.len != n)
        fail_msg("\"%s\": %zu ids, want %zu", text, ids.len, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids.ids[i], want[i]);
    pdtok_ids_free(&ids);
}

#define EXPECT(t, s, sp, ...)                                                                      \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        expect_ids((t), (s), strlen(s), (sp), w_, sizeof(w_) / sizeof(w_[0]));                     \
    } while (0)

static void test_merges_by_rank(void **state)
{
    (void)state;
    /* b+c outranks a+b: "abc" -> a bc -> abc */
    pdtok_t *t = load_ok(write_tok("rank1", letters_model("[\"b c\", \"a b\", \"a bc\"]", 0, 0)));
    EXPECT(t, "abc", false, 6);
    pdtok_free(t);
    /* a+b first: "abc" -> ab c, and no (ab, c) merge exists */
    t = load_ok(write_tok(
        "rank2", letters_model("[[\"a\", \"b\"], [\"b\", \"c\"], [\"a\", \"bc\"]]", 0, 0)));
    EXPECT(t, "abc", false, 4, 3);
    /* equal ranks go left to right: "aaa" -> aa a */
    pdtok_free(t);
    t = load_ok(write_tok("rank3", letters_model("[\"a a\"]", 0, 0)));
    EXPECT(t, "aaa", false, 7, 1);
    EXPECT(t, "aaaa", false, 7, 7);
    pdtok_free(t);
}

static void test_byte_fallback_and_unk(void **state)
{
    (void)state;
    pdtok_t *t = load_ok(write_tok("fb", letters_model("[]", true, false)));
    EXPECT(t, "a\xc3\xa9", false, 1, 8, 9); /* é has its two byte tokens */
    EXPECT(t, "\xc3\xa8", false, 0);        /* è lacks <0xA8>: unk for the whole symbol */
    char *text = NULL;
    size_t len = 0;
    const int32_t ids[] = {1, 8, 9, 2};
    assert_int_equal(pdtok_decode(t, ids, 4, false, &text, &len), PDTOK_OK);
    assert_string_equal(text, "a <0xC3> <0xA9> b"); /* no decoder: tokens joined by spaces */
    free(text);
    pdtok_free(t);
    t = load_ok(write_tok("fuse", letters_model("[]", false, true)));
    EXPECT(t, "axyzb", false, 1, 0, 2); /* three unknown letters fuse into one unk */
    pdtok_free(t);
}

/* A byte-level tokenizer: every byte's stand-in character is a token (id = byte). */
static json_t *byte_level(json_t *added, const char *post)
{
    json_t *vocab = json_object();
    int next = 256; /* GPT-2's map: unprintable bytes move to U+0100 upwards, in order */
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = printable ? b : next++;
        char s[4] = {0};
        if (cp < 0x80)
            s[0] = (char)cp;
        else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0h", json_integer(256)); /* "Ġh": space + h */
    json_t *model =
        json_pack("{s:s,s:o,s:[[s,s]]}", "type", "BPE", "vocab", vocab, "merges", "\xc4\xa0", "h");
    json_t *pre = json_loads("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                             "\"pattern\":{\"Regex\":\" ?\\\\p{L}+|\\\\s+|[^\\\\s\\\\p{L}]+\"},"
                             "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                             "\"add_prefix_space\":false,\"use_regex\":false}]}",
                             0, NULL);
    assert_non_null(pre);
    return json_pack("{s:o,s:n,s:o,s:o,s:{s:s},s:o}", "added_tokens", added, "normalizer",
                     "pre_tokenizer", pre, "post_processor",
                     post ? json_loads(post, 0, NULL) : json_null(), "decoder", "type", "ByteLevel",
                     "model", model);
}

static void test_invalid_utf8_and_decode(void **state)
{
    (void)state;
    pdtok_t *t = load_ok(write_tok("bl", byte_level(json_array(), NULL)));
    EXPECT(t, "a h", false, 'a', 256);
    /* one U+FFFD (EF BF BD) per maximal invalid subsequence (WHATWG) */
    EXPECT(t, "\xff", false, 0xEF, 0xBF, 0xBD);
    EXPECT(t, "\xe2\x82", false, 0xEF, 0xBF, 0xBD);
    EXPECT(t, "\xc0\x80", false, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    EXPECT(t, "\xed\xa0\x80", false, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    /* decode: bytes back to text; a split UTF-8 sequence becomes U+FFFD */
    const int32_t ids[] = {'x', 256, 0xC3};
    char *text = NULL;
    size_t len;
    assert_int_equal(pdtok_decode(t, ids, 3, false, &text, &len), PDTOK_OK);
    assert_string_equal(text, "x h\xef\xbf\xbd");
    free(text);
    const int32_t bad[] = {1, 100000};
    assert_int_equal(pdtok_decode(t, bad, 2, false, &text, &len), PDTOK_ERR_RANGE);
    size_t tl;
    assert_string_equal(pdtok_id_to_token(t, 256, &tl), "\xc4\xa0h");
    assert_int_equal(pdtok_token_to_id(t, "\xc4\xa0h", 3), 256);
    assert_int_equal(pdtok_token_to_id(t, "zz", 2), -1);
    assert_int_equal(pdtok_vocab_size(t), 257);
    pdtok_free(t);
}

static void test_added_tokens(void **state)
{
    (void)state;
    json_t *added = json_loads(
        "[{\"id\":300,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":301,\"content\":\"<m>\",\"special\":true,\"lstrip\":true,\"rstrip\":true},"
        "{\"id\":302,\"content\":\"<mm>\",\"special\":false}]",
        0, NULL);
    const char *post =
        "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
        "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"pair\":[],\"special_tokens\":{}}";
    const char *dir = write_tok("added", byte_level(added, post));
    write_text(dir, "tokenizer_config.json",
               "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"<m>\"},"
               "\"clean_up_tokenization_spaces\":false,\"model_max_length\":1e30}");
    pdtok_t *t = load_ok(dir);
    EXPECT(t, "a", true, 300, 'a');
    EXPECT(t, "a", false, 'a');
    /* lstrip/rstrip eat the white space around <m>; <mm> is the longest match */
    EXPECT(t, "a  <m>\t b", false, 'a', 301, 'b');
    EXPECT(t, "<mm><m", false, 302, '<', 'm');
    EXPECT(t, "<s><s>", false, 300, 300);
    int32_t id;
    assert_string_equal(pdtok_special_token(t, PDTOK_SPECIAL_BOS, &id), "<s>");
    assert_int_equal(id, 300);
    assert_string_equal(pdtok_special_token(t, PDTOK_SPECIAL_EOS, &id), "<m>");
    assert_string_equal(pdtok_special_token(t, PDTOK_SPECIAL_PAD, &id), "<m>");
    assert_true(pdtok_is_special(t, 301));
    assert_false(pdtok_is_special(t, 302));
    const int32_t ids[] = {300, 'a', 302, 301};
    char *text;
    size_t len;
    assert_int_equal(pdtok_decode(t, ids, 4, false, &text, &len), PDTOK_OK);
    assert_string_equal(text, "<s>a<mm><m>");
    free(text);
    assert_int_equal(pdtok_decode(t, ids, 4, true, &text, &len), PDTOK_OK);
    assert_string_equal(text, "a<mm>");
    free(text);
    pdtok_free(t);
}

/* Each file is refused with a message naming what is wrong. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *json, *why;
    } cases[] = {
        {"{\"model\": ", "tokenizer.json:"},
        {"[1]", "no \"model\""},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", "merges[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[],\"dropout\":0.1}}", "dropout"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[],"
         "\"continuing_subword_prefix\":\"##\"}}",
         "continuing_subword_prefix"},
        {"{\"normalizer\":{\"type\":\"Precompiled\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},"
         "\"merges\":[]}}",
         "Precompiled"},
        {"{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":\"BPE\","
         "\"vocab\":{},\"merges\":[]}}",
         "BertPreTokenizer"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:x)\"},\"behavior\":"
         "\"Isolated\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "inline flags"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":"
         "\"Isolated\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "does not compile"},
        {"{\"decoder\":{\"type\":\"WordPiece\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},"
         "\"merges\":[]}}",
         "WordPiece"},
        {"{\"post_processor\":{\"type\":\"BertProcessing\"},\"model\":{\"type\":\"BPE\","
         "\"vocab\":{},\"merges\":[]}}",
         "BertProcessing"},
        {"{\"added_tokens\":[{\"id\":0,\"content\":\"x\",\"single_word\":true}],\"model\":"
         "{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
         "single_word"},
    };
    char err[256];
    assert_null(pdtok_load("/nonexistent/dir/x", err, sizeof(err)));
    assert_non_null(strstr(err, "cannot open"));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dir[128], file[192];
        snprintf(dir, sizeof(dir), "%s/bad%zu", tmpdir, i);
        mkdir(dir, 0700);
        snprintf(file, sizeof(file), "%s/tokenizer.json", dir);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs(cases[i].json, f);
        fclose(f);
        pdtok_t *t = pdtok_load(file, err, sizeof(err));
        if (t || !strstr(err, cases[i].why))
            fail_msg("case %zu: loaded=%d, message \"%s\" lacks \"%s\"", i, t != NULL, err,
                     cases[i].why);
    }
}

/* A prompt past PDTOK_MAX_TEXT (16 MiB) is refused whole, the ids given unchanged; a megabyte
 * of " h" pairs encodes to one merged id per pair. */
static void test_huge_text(void **state)
{
    (void)state;
    pdtok_t *t = load_ok(write_tok("huge", byte_level(json_array(), NULL)));
    size_t big = PDTOK_MAX_TEXT + 1;
    char *text = malloc(big);
    assert_non_null(text);
    memset(text, 'h', big);
    pdtok_ids_t ids = {0};
    assert_int_equal(pdtok_encode(t, "a", 1, false, &ids), PDTOK_OK);
    assert_int_equal(pdtok_encode(t, text, big, false, &ids), PDTOK_ERR_INVALID);
    assert_int_equal(ids.len, 1);
    for (size_t i = 0; i < (1u << 20); i += 2)
        text[i] = ' '; /* " h" pairs: the one merge applies everywhere */
    assert_int_equal(pdtok_encode(t, text, 1u << 20, false, &ids), PDTOK_OK);
    assert_int_equal(ids.len, 1 + (1u << 19));
    pdtok_ids_free(&ids);
    free(text);
    pdtok_free(t);
}

/* Every allocation of load and encode fails in turn: NULL or an error, never a crash; the
 * sanitizer build checks that nothing leaks. */
static void test_allocation_failures(void **state)
{
    (void)state;
    json_t *added = json_loads("[{\"id\":300,\"content\":\"<s>\",\"special\":true}]", 0, NULL);
    const char *dir = write_tok("alloc", byte_level(added, NULL));
    const char *text = "hello <s> world \xff h";
    pdtok_t *ref = load_ok(dir);
    pdtok_ids_t want = {0};
    assert_int_equal(pdtok_encode(ref, text, strlen(text), true, &want), PDTOK_OK);
    int loaded = 0, encoded = 0;
    for (uint64_t n = 1; n < 3000 && encoded < 20; n++) {
        char err[256];
        pdb_alloc_fail_at(n, 0);
        pdtok_t *t = pdtok_load(dir, err, sizeof(err));
        if (!t) {
            pdb_alloc_fail_at(0, 0);
            continue;
        }
        loaded++;
        pdtok_ids_t ids = {0};
        pdtok_status_t st = pdtok_encode(t, text, strlen(text), true, &ids);
        pdb_alloc_fail_at(0, 0);
        if (st == PDTOK_OK) {
            encoded++;
            assert_int_equal(ids.len, want.len);
            assert_memory_equal(ids.ids, want.ids, want.len * sizeof(int32_t));
        } else {
            assert_int_equal(st, PDTOK_ERR_NOMEM);
            assert_int_equal(ids.len, 0);
        }
        pdtok_ids_free(&ids);
        pdtok_free(t);
    }
    assert_true(loaded > 0);
    assert_true(encoded > 0);
    pdtok_ids_free(&want);
    pdtok_free(ref);
}

typedef struct shared {
    const pdtok_t *tok;
    const pdtok_ids_t *want;
    const char *const *texts;
    size_t n;
    int bad;
} shared_t;

static void *encode_many(void *arg)
{
    shared_t *s = arg;
    for (int r = 0; r < 200; r++)
        for (size_t i = 0; i < s->n; i++) {
            pdtok_ids_t ids = {0};
            if (pdtok_encode(s->tok, s->texts[i], strlen(s->texts[i]), true, &ids) != PDTOK_OK ||
                ids.len != s->want[i].len ||
                memcmp(ids.ids, s->want[i].ids, ids.len * sizeof(int32_t)) != 0)
                s->bad++;
            pdtok_ids_free(&ids);
        }
    return NULL;
}

/* One tokenizer, four threads: every thread gets the single-threaded answer. */
static void test_threads_share_one_tokenizer(void **state)
{
    (void)state;
    pdtok_t *t = load_ok(write_tok("threads", byte_level(json_array(), NULL)));
    static const char *const texts[] = {"a h b", "hhh h h", "\xe6\x97\xa5 h", " h h h h", "x"};
    pdtok_ids_t want[5] = {0};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(pdtok_encode(t, texts[i], strlen(texts[i]), true, &want[i]), PDTOK_OK);
    pthread_t th[4];
    shared_t sh[4];
    for (int i = 0; i < 4; i++) {
        sh[i] = (shared_t){t, want, texts, 5, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &sh[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sh[i].bad, 0);
    }
    for (size_t i = 0; i < 5; i++)
        pdtok_ids_free(&want[i]);
    pdtok_free(t);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pdtok-unit-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_byte_fallback_and_unk),
        cmocka_unit_test(test_invalid_utf8_and_decode),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_huge_text),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_threads_share_one_tokenizer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
