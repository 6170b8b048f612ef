/*
 * fuzz_json_load.c - bodies parsed by the one-pass parser (gateway/src/util/pdgw_json_load.c)
 * against jansson on the same text.
 *
 * Whatever the parser takes, jansson takes too, as an equal tree with the same member order,
 * and pdgw_json_dump (gateway/src/util/pdgw_json_dump.c) writes every tree as jansson writes it;
 * pdgw_json_loadb (the parser, jansson when it declines) agrees with jansson on every input,
 * pdgw_json_load_members reads each member it is asked for as jansson does, and the answer's
 * usage counts (pdgw_gateway_metrics_usage, read without a parse) are what jansson's tree holds.
 * The input is used as it is and, so that the fuzzer reaches long strings without writing
 * hundreds of bytes, with every string of it made long by repeating its content (each "s"
 * becomes "ssss..."). Never a crash, over-read or leak.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_json_dump.h"
#include "pdgw_json_load.h"
#include "pdgw_metrics.h"

#define LONG_STRING 256

/* jansson writes both trees alike, and pdgw_json_dump writes them as jansson does */
static void same_text(const json_t *a, const json_t *b)
{
    char *x = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *y = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t n = 0;
    char *z = pdgw_json_dumps(a, &n);
    if (x == NULL || y == NULL || z == NULL || strcmp(x, y) != 0 || n != strlen(x) ||
        memcmp(x, z, n) != 0)
        abort();
    free(x);
    free(y);
    free(z);
}

/* pdgw_json_load_members on text jansson reads as an object: each listed member as in jansson's
 * tree (an escaped name makes it read the whole text: extra members are allowed then). */
static void same_members(const char *text, size_t len, const json_t *slow)
{
    static const char *const names[] = {"a", "s", "prompt", "kv_transfer_params", "", NULL};
    json_t *got;
    if (!json_is_object(slow))
        return;
    got = pdgw_json_load_members(text, len, names);
    if (got == NULL)
        abort();
    for (size_t i = 0; names[i] != NULL; i++) {
        const json_t *want = json_object_get(slow, names[i]),
                     *have = json_object_get(got, names[i]);
        if ((want == NULL) != (have == NULL) || (want != NULL && !json_equal(want, have)))
            abort();
    }
    json_decref(got);
}

/* The usage counts found without a parse, on text jansson accepts: present exactly when its
 * tree has a top-level "usage" object, with the counts json_integer_value reads from it. Names
 * are compared as written, so text with a \u escape (the only way to spell "usage" escaped) is
 * left out: engines do not write their member names that way, and a miss costs only a figure. */
static void same_usage(const char *text, size_t len, const json_t *slow)
{
    static pdgw_metrics_t *reg;
    static pdgw_gateway_metrics_t gm;
    static pdgw_proto_metrics_t pm;
    const json_t *u = json_is_object(slow) ? json_object_get(slow, "usage") : NULL;
    int64_t pt = -1, ct = -1;
    bool got;
    if (slow == NULL || memmem(text, len, "\\u", 2) != NULL)
        return;
    if (reg == NULL && (pdgw_metrics_create(0, &reg) != PDGW_OK ||
                        pdgw_gateway_metrics_init(reg, "0", &gm) != PDGW_OK))
        abort();
    if (pm.gm == NULL)
        pdgw_proto_metrics_init(&pm, &gm, "neutral");
    got = pdgw_gateway_metrics_usage(&pm, text, len, &pt, &ct);
    if (got != json_is_object(u) ||
        (got && (pt != json_integer_value(json_object_get(u, "prompt_tokens")) ||
                 ct != json_integer_value(json_object_get(u, "completion_tokens")))))
        abort();
    pt = ct = -1;
    if (pdgw_gateway_metrics_usage_answer(&pm, text, len, &pt, &ct) != got ||
        (got && (pt != json_integer_value(json_object_get(u, "prompt_tokens")) ||
                 ct != json_integer_value(json_object_get(u, "completion_tokens")))))
        abort();
}

static void check(const char *text, size_t len)
{
    json_t *quick = pdgw_json_load_fast(text, len);
    json_t *loaded = pdgw_json_loadb(text, len, NULL);
    json_t *slow = json_loadb(text, len, 0, NULL);
    if ((loaded == NULL) != (slow == NULL) || (quick != NULL && slow == NULL))
        abort();
    /* the check walks as the load does, for objects */
    if (pdgw_json_check_members(text, len, NULL, NULL) != (quick != NULL && json_is_object(quick)))
        abort();
    same_usage(text, len, slow);
    if (slow != NULL) {
        if (!json_equal(loaded, slow))
            abort();
        same_text(loaded, slow);
        same_members(text, len, slow);
    }
    json_decref(quick);
    json_decref(loaded);
    json_decref(slow);
}

/* Each string's content repeated until it is long: quotes are found as a JSON lexer finds
 * them; an escape cut by a repeat boundary is still an escape (content is repeated whole). */
static char *lengthen(const char *in, size_t len, size_t *out_len)
{
    size_t cap = len * 64 + 1, o = 0, i = 0;
    char *out = malloc(cap);
    if (out == NULL)
        return NULL;
    while (i < len) {
        if (in[i] != '"') {
            out[o++] = in[i++];
            continue;
        }
        size_t j = i + 1;
        while (j < len && in[j] != '"')
            j += in[j] == '\\' ? 2 : 1;
        if (j >= len) { /* does not close: copy the rest */
            memcpy(out + o, in + i, len - i);
            o += len - i;
            break;
        }
        size_t n = j - i - 1, reps = n ? (LONG_STRING + n - 1) / n : 0;
        if (reps > 63)
            reps = 63;
        out[o++] = '"';
        for (size_t r = 0; r < reps; r++) {
            memcpy(out + o, in + i + 1, n);
            o += n;
        }
        out[o++] = '"';
        i = j + 1;
    }
    *out_len = o;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n;
    char *longer;
    if (size > 4096)
        return 0;
    check((const char *)data, size);
    longer = lengthen((const char *)data, size, &n);
    if (longer != NULL)
        check(longer, n);
    free(longer);
    return 0;
}
