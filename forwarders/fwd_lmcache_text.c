/*
 * fwd_lmcache_text.c - the first_tok flow's rewrite of the decode's answer done on its text
 * (forwarder.h rewrite_decode_text). What it changes is what lmc_flow_rewrite changes: the
 * prefill's first token goes in front of choices[0].text of a whole answer, and usage counts
 * that token as generated (prompt_tokens - 1, completion_tokens + 1); a stream gets the head
 * events first; a chat client gets each object converted to its chat counterpart. Those are a
 * few values of the decode's answer, so they are spliced into a copy of its bytes (or, for
 * chat, written around them): the rest of a long answer (logprobs included) is neither parsed
 * nor written again, and a completions stream's chunks without usage are relayed as they came.
 * An answer the first token already ended, a chat answer of more than one choice, and anything
 * this file does not recognise go to the tree rewrite (-1).
 */
#include "fwd_lmcache_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One change of the text: <cut> bytes at <at> replaced by <ins> (escaped as a JSON string's
 * inside when <escape>). */
typedef struct edit {
    const char *at;
    size_t cut;
    const char *ins;
    size_t ins_len;
    int escape;
} edit_t;

#define MAX_EDITS 3

typedef struct edits {
    edit_t e[MAX_EDITS];
    int n;
    char num[2][24];
} edits_t;

static void edit_add(edits_t *ed, const char *at, size_t cut, const char *ins, size_t n, int escape)
{
    ed->e[ed->n++] = (edit_t){at, cut, ins, n, escape};
}

/* The top-level members the rewrite looks at, found in one walk. */
enum { M_ERROR, M_CHOICES, M_USAGE, M_ID, M_CREATED, M_MODEL, M_COUNT };

typedef struct answer {
    const char *v[M_COUNT];
    size_t n[M_COUNT];
} answer_t;

static int answer_read(answer_t *a, const char *text, size_t len)
{
    static const char *const names[] = {"error",   "choices", "usage", "id",
                                        "created", "model",   NULL};
    return pdgw_fwd_json_members(text, len, names, a->v, a->n);
}

/* usage with the first token moved to the generated side: 1 edits added, 0 nothing to change
 * (no usage object, or counts that are not integers, as the tree rewrite leaves them), -1 the
 * text needs the parse. */
static int usage_edits(const answer_t *a, edits_t *ed)
{
    static const char *const names[] = {"prompt_tokens", "completion_tokens", NULL};
    const char *v[2];
    size_t n[2];
    int64_t p, c;
    if (a->v[M_USAGE] == NULL || *a->v[M_USAGE] != '{')
        return 0;
    if (pdgw_fwd_json_members(a->v[M_USAGE], a->n[M_USAGE], names, v, n) != 0)
        return -1;
    if (v[0] == NULL || v[1] == NULL || !pdgw_fwd_json_int(v[0], n[0], &p) ||
        !pdgw_fwd_json_int(v[1], n[1], &c) || p < 1 || c == INT64_MAX)
        return 0;
    snprintf(ed->num[0], sizeof(ed->num[0]), "%" PRId64, p - 1);
    snprintf(ed->num[1], sizeof(ed->num[1]), "%" PRId64, c + 1);
    edit_add(ed, v[0], n[0], ed->num[0], strlen(ed->num[0]), 0);
    edit_add(ed, v[1], n[1], ed->num[1], strlen(ed->num[1]), 0);
    return 1;
}

/* The place of the first token's text: just inside the opening quote of choices[0].text. */
static const char *first_text_at(const answer_t *a)
{
    const char *ch0, *t;
    size_t ch0l, tl;
    if (a->v[M_CHOICES] == NULL ||
        pdgw_fwd_json_first(a->v[M_CHOICES], a->n[M_CHOICES], &ch0, &ch0l) != 1 || *ch0 != '{' ||
        pdgw_fwd_json_member(ch0, ch0l, "text", &t, &tl) != 1 || *t != '"')
        return NULL;
    return t + 1;
}

static int by_place(const void *a, const void *b)
{
    const edit_t *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* <text> with the edits made, into <out>. */
static int write_edited(pdgw_fwd_text_t *out, const char *text, size_t len, edits_t *ed)
{
    const char *p = text;
    qsort(ed->e, (size_t)ed->n, sizeof(ed->e[0]), by_place);
    for (int i = 0; i < ed->n; i++) {
        const edit_t *e = &ed->e[i];
        if (pdgw_fwd_text_append(out, p, (size_t)(e->at - p)) != 0 ||
            (e->escape ? pdgw_fwd_text_append_escaped(out, e->ins, e->ins_len)
                       : pdgw_fwd_text_append(out, e->ins, e->ins_len)) != 0)
            return -1;
        p = e->at + e->cut;
    }
    return pdgw_fwd_text_append(out, p, (size_t)(text + len - p));
}

/* The head events a stream starts with, each as "data: <json>\n\n". */
static int write_head(pdgw_fwd_text_t *out, const lmc_head_t *head, int chat)
{
    json_t *evs = lmc_flow_head_events(head, chat), *ev;
    size_t i;
    int rc = evs != NULL ? 0 : -1;
    json_array_foreach(evs, i, ev)
    {
        if (rc == 0 &&
            (pdgw_fwd_text_append(out, "data: ", 6) != 0 ||
             pdgw_fwd_text_append_json(out, ev) != 0 || pdgw_fwd_text_append(out, "\n\n", 2) != 0))
            rc = -1;
    }
    json_decref(evs);
    return rc;
}

static int put(pdgw_fwd_text_t *out, const char *s)
{
    return pdgw_fwd_text_append(out, s, strlen(s));
}

/* A value as it came, or null when the answer has none. */
static int put_raw(pdgw_fwd_text_t *out, const char *v, size_t n)
{
    return v != NULL ? pdgw_fwd_text_append(out, v, n) : put(out, "null");
}

/* choices[0] of a chat answer: its members as to_chat reads them. */
enum { C_INDEX, C_TEXT, C_LOGPROBS, C_FINISH, C_STOP_REASON, C_COUNT };

/* The decode's text_completion object as its chat counterpart, as lmc_flow_rewrite's to_chat
 * writes it (a stream's chunk: delta; a whole answer: message, with the first token's text in
 * front): 1 written, -1 for the tree (more than one choice, a choice without an index). */
static int write_chat(pdgw_fwd_text_t *out, const answer_t *a, int sse, const lmc_head_t *head)
{
    static const char *const names[] = {"index",         "text",        "logprobs",
                                        "finish_reason", "stop_reason", NULL};
    const char *ch0 = NULL, *c[C_COUNT], *after, *cend;
    size_t ch0l = 0, cl[C_COUNT];
    edits_t ed = {.n = 0};
    int rc = 0;
    if (a->v[M_CHOICES] == NULL ||
        pdgw_fwd_json_first(a->v[M_CHOICES], a->n[M_CHOICES], &ch0, &ch0l) != 1 || *ch0 != '{' ||
        pdgw_fwd_json_members(ch0, ch0l, names, c, cl) != 0 || c[C_INDEX] == NULL)
        return -1;
    cend = a->v[M_CHOICES] + a->n[M_CHOICES];
    for (after = ch0 + ch0l;
         after < cend && (*after == ' ' || *after == '\t' || *after == '\n' || *after == '\r');)
        after++;
    if (after >= cend || *after != ']' || (a->v[M_USAGE] != NULL && usage_edits(a, &ed) < 0))
        return -1; /* n > 1: the tree writes every choice */
    rc |= put(out, "{\"id\":") | put_raw(out, a->v[M_ID], a->n[M_ID]);
    rc |= put(out, sse ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                       : ",\"object\":\"chat.completion\",\"created\":");
    rc |= put_raw(out, a->v[M_CREATED], a->n[M_CREATED]) | put(out, ",\"model\":") |
          put_raw(out, a->v[M_MODEL], a->n[M_MODEL]);
    rc |= put(out, ",\"choices\":[{\"index\":") | put_raw(out, c[C_INDEX], cl[C_INDEX]);
    rc |= put(out, sse ? ",\"delta\":{\"content\":\""
                       : ",\"message\":{\"role\":\"assistant\",\"content\":\"");
    if (!sse)
        rc |= pdgw_fwd_text_append_escaped(out, head->text, strlen(head->text));
    if (c[C_TEXT] != NULL && *c[C_TEXT] == '"') /* a text that is not a string counts as "" */
        rc |= pdgw_fwd_text_append(out, c[C_TEXT] + 1, cl[C_TEXT] - 2);
    rc |= put(out, "\"},\"logprobs\":") | put_raw(out, c[C_LOGPROBS], cl[C_LOGPROBS]);
    rc |= put(out, ",\"finish_reason\":") | put_raw(out, c[C_FINISH], cl[C_FINISH]);
    if (!sse && c[C_STOP_REASON] != NULL)
        rc |= put(out, ",\"stop_reason\":") | put_raw(out, c[C_STOP_REASON], cl[C_STOP_REASON]);
    rc |= put(out, "}]");
    if (a->v[M_USAGE] != NULL)
        rc |= put(out, ",\"usage\":") | write_edited(out, a->v[M_USAGE], a->n[M_USAGE], &ed);
    rc |= put(out, "}");
    return rc == 0 ? 1 : -1;
}

int lmc_flow_rewrite_text(lmc_head_t *head, const pdgw_fwd_request_t *req, int sse,
                          const char *text, size_t len, pdgw_fwd_text_t *out)
{
    edits_t ed = {.n = 0};
    answer_t a;
    const char *at;
    int got;
    if (head->done || answer_read(&a, text, len) != 0)
        return -1;
    if (a.v[M_ERROR] != NULL)
        return 0; /* an error passes unchanged */
    if (req->is_chat) {
        if (sse && ((!head->sent && write_head(out, head, 1) != 0) ||
                    pdgw_fwd_text_append(out, "data: ", 6) != 0))
            return -1;
        if (write_chat(out, &a, sse, head) != 1 ||
            (sse && pdgw_fwd_text_append(out, "\n\n", 2) != 0))
            return -1;
        if (sse)
            head->sent = 1;
        return 1;
    }
    if (!sse) {
        if ((at = first_text_at(&a)) == NULL)
            return -1;
        edit_add(&ed, at, 0, head->text, strlen(head->text), 1);
        if (usage_edits(&a, &ed) < 0)
            return -1;
        return write_edited(out, text, len, &ed) == 0 ? 1 : -1;
    }
    if ((got = usage_edits(&a, &ed)) < 0)
        return -1;
    if (head->sent && got == 0)
        return 0; /* a chunk without usage: as it came */
    if (!head->sent && write_head(out, head, 0) != 0)
        return -1;
    if (pdgw_fwd_text_append(out, "data: ", 6) != 0 || write_edited(out, text, len, &ed) != 0 ||
        pdgw_fwd_text_append(out, "\n\n", 2) != 0)
        return -1;
    head->sent = 1;
    return 1;
}
