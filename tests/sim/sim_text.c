/*
 * Deterministic tokenizer and output text.
 *
 * Prompt text splits into pieces: runs of letters/digits (and bytes >= 0x80),
 * and single punctuation characters; whitespace separates. A piece's token id
 * is a 31-bit hash of its bytes. Output token i is drawn from a fixed word
 * list by hashing (every token before it: the prompt and tokens 0..i-1, seed,
 * temperature), so the same request always yields the same text no matter
 * which instance (both or a PD decode) serves it, and generation is
 * autoregressive like a real model's: prompt + [token 0] continues with
 * token 1 (what LMCache's proxy relies on when it appends the prefill's
 * first token to the decode's prompt). An output word's token id is the id
 * the tokenizer gives that word, so /detokenize can map it back.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_int.h"

static const char *const words[] = {
    "the",    "quick",  "brown",   "fox",     "jumps",   "over",   "lazy",    "dog",
    "data",   "flows",  "through", "the",     "gateway", "to",     "prefill", "and",
    "decode", "nodes",  "while",   "cache",   "pages",   "move",   "across",  "fast",
    "links",  "every",  "token",   "arrives", "on",      "time",   "with",    "a",
    "steady", "rhythm", "of",      "small",   "bright",  "words",  "that",    "never",
    "repeat", "in",     "quite",   "the",     "same",    "order",  "again",   "river",
    "stone",  "light",  "north",   "south",   "green",   "blue",   "model",   "engine",
    "batch",  "queue",  "layer",   "block",   "hash",    "prefix", "stream",  "done",
};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

int sim_tokens_push(sim_tokens_t *t, uint32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        uint32_t *ids = realloc(t->ids, cap * sizeof(*ids));
        if (!ids)
            return -1;
        t->ids = ids;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return 0;
}

void sim_tokens_free(sim_tokens_t *t)
{
    free(t->ids);
    free(t->cache_salt);
    memset(t, 0, sizeof(*t));
}

static int is_word_byte(unsigned char c)
{
    return isalnum(c) || c >= 0x80 || c == '_';
}

int sim_tokenize(const char *text, size_t len, sim_tokens_t *out)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)text[i];
        if (isspace(c)) {
            i++;
            continue;
        }
        size_t start = i;
        if (is_word_byte(c)) {
            while (i < len && is_word_byte((unsigned char)text[i]))
                i++;
        } else {
            i++;
        }
        uint32_t id = (uint32_t)(XXH64(text + start, i - start, 0x5eed) & 0x7fffffff);
        if (sim_tokens_push(out, id))
            return -1;
    }
    return 0;
}

/* Content is a string, null, or a list of parts {type:"text", text}. */
static int append_content(char **buf, size_t *len, json_t *content)
{
    FILE *f;
    char *add = NULL;
    size_t addlen = 0;
    f = open_memstream(&add, &addlen);
    if (!f)
        return -1;
    if (json_is_string(content)) {
        fwrite(json_string_value(content), 1, json_string_length(content), f);
    } else if (json_is_array(content)) {
        size_t i;
        json_t *part;
        json_array_foreach(content, i, part)
        {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) {
                if (i)
                    fputc(' ', f);
                fwrite(json_string_value(t), 1, json_string_length(t), f);
            }
        }
    }
    fclose(f);
    char *nb = realloc(*buf, *len + addlen + 1);
    if (!nb) {
        free(add);
        return -1;
    }
    memcpy(nb + *len, add, addlen);
    *len += addlen;
    nb[*len] = 0;
    *buf = nb;
    free(add);
    return 0;
}

static int append_str(char **buf, size_t *len, const char *s)
{
    size_t l = strlen(s);
    char *nb = realloc(*buf, *len + l + 1);
    if (!nb)
        return -1;
    memcpy(nb + *len, s, l + 1);
    *len += l;
    *buf = nb;
    return 0;
}

char *sim_chat_template(json_t *messages)
{
    char *buf = NULL;
    size_t len = 0;
    size_t i;
    json_t *m;
    if (append_str(&buf, &len, ""))
        return NULL;
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (append_str(&buf, &len, "<|") || append_str(&buf, &len, role ? role : "user") ||
            append_str(&buf, &len, "|>\n") ||
            append_content(&buf, &len, json_object_get(m, "content")) ||
            append_str(&buf, &len, "\n")) {
            free(buf);
            return NULL;
        }
    }
    if (append_str(&buf, &len, "<|assistant|>\n")) {
        free(buf);
        return NULL;
    }
    return buf;
}

uint64_t sim_prompt_hash(const sim_tokens_t *prompt)
{
    return XXH64(prompt->ids, prompt->n * sizeof(uint32_t), 0x9e3779b97f4a7c15ull);
}

uint32_t sim_word_id(const char *w)
{
    return (uint32_t)(XXH64(w, strlen(w), 0x5eed) & 0x7fffffff);
}

const char *sim_word_of_id(uint32_t id)
{
    for (size_t i = 0; i < N_WORDS; i++)
        if (sim_word_id(words[i]) == id)
            return words[i];
    return NULL;
}

static uint64_t mix(uint64_t key, uint64_t i, uint64_t salt)
{
    uint64_t v[3] = {key, i, salt};
    return XXH64(v, sizeof(v), 0x243f6a8885a308d3ull);
}

/* Longest suffix of text[0..len) that is a proper prefix of some stop string. */
static size_t holdback(const char *text, size_t len, const sim_sampling_t *sp)
{
    size_t best = 0;
    for (size_t s = 0; s < sp->n_stop; s++) {
        size_t sl = strlen(sp->stop[s]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > best; k--) {
            if (k <= len && !memcmp(text + len - k, sp->stop[s], k)) {
                best = k;
                break;
            }
        }
    }
    return best;
}

int sim_output_plan(const sim_tokens_t *prompt, const sim_sampling_t *sp, sim_output_t *out)
{
    uint64_t temp_bits;
    memcpy(&temp_bits, &sp->temperature, sizeof(temp_bits));
    uint64_t salt = mix((uint64_t)(sp->has_seed ? sp->seed : 0), temp_bits, 0x51);
    /* the hash of the sequence so far (prompt, then each generated token) */
    XXH64_state_t *seq = XXH64_createState();
    if (!seq)
        return -1;
    XXH64_reset(seq, 0x9e3779b97f4a7c15ull);
    XXH64_update(seq, prompt->ids, prompt->n * sizeof(uint32_t));
    size_t max = (size_t)sp->max_tokens;
    memset(out, 0, sizeof(*out));
    out->off = calloc(max + 1, sizeof(size_t));
    out->ids = calloc(max + 1, sizeof(uint32_t));
    size_t cap = max * 10 + 16, len = 0;
    out->text = malloc(cap);
    if (!out->off || !out->ids || !out->text)
        goto err;
    out->text[0] = 0;
    out->finish_reason = "length";
    size_t visible = 0;
    size_t i;
    for (i = 0; i < max; i++) {
        out->off[i] = visible;
        uint64_t key = XXH64_digest(seq) ^ salt;
        uint64_t h = mix(key, 0, 1);
        int eos = sp->ignore_eos == 0 && sim_cfg.eos_period > 0 &&
                  (h % (uint64_t)sim_cfg.eos_period) == 0 && (int)i >= sp->min_tokens;
        if (eos) {
            out->ids[i] = SIM_EOS_TOKEN_ID;
            out->finish_reason = "stop";
            i++;
            break;
        }
        const char *w = words[mix(key, 0, 2) % N_WORDS];
        out->ids[i] = sim_word_id(w);
        XXH64_update(seq, &out->ids[i], sizeof(uint32_t));
        size_t wl = strlen(w);
        if (len + wl + 2 > cap) {
            cap = (len + wl + 2) * 2;
            char *nt = realloc(out->text, cap);
            if (!nt)
                goto err;
            out->text = nt;
        }
        out->text[len++] = ' ';
        memcpy(out->text + len, w, wl);
        len += wl;
        out->text[len] = 0;
        if ((int)i + 1 >= sp->min_tokens && sp->n_stop) {
            /* earliest stop string occurrence in the text so far */
            char *hit = NULL;
            size_t hit_s = 0;
            for (size_t s = 0; s < sp->n_stop; s++) {
                char *p = strstr(out->text, sp->stop[s]);
                if (p && (!hit || p < hit)) {
                    hit = p;
                    hit_s = s;
                }
            }
            if (hit) {
                len = (size_t)(hit - out->text);
                out->text[len] = 0;
                out->finish_reason = "stop";
                out->stop_reason = strdup(sp->stop[hit_s]);
                if (!out->stop_reason)
                    goto err;
                visible = len;
                i++;
                break;
            }
            visible = len - holdback(out->text, len, sp);
        } else {
            visible = len;
        }
    }
    out->n = i;
    for (size_t k = 0; k < out->n; k++)
        if (out->off[k] > len)
            out->off[k] = len;
    out->off[out->n] = len; /* the last token reveals whatever was held back */
    XXH64_freeState(seq);
    return 0;
err:
    XXH64_freeState(seq);
    sim_output_free(out);
    return -1;
}

void sim_output_free(sim_output_t *out)
{
    free(out->text);
    free(out->off);
    free(out->ids);
    free(out->stop_reason);
    memset(out, 0, sizeof(*out));
}
