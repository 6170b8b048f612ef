/*
 * fuzz_body_splice.c - a client body spliced into a leg body
 * (gateway/src/upstream/pdgw_body_splice.c).
 *
 * The input is the client's text. When jansson parses it to an object, a leg is made the way
 * forwarders make one (the client's member values shared), and edited with choices taken from
 * the last input bytes: members removed, replaced, added, token ids held as text. A splice that
 * succeeds must parse to an object equal to the leg (the ids as integers); one that refuses must
 * say PDGW_ERR_INVALID; the body text (spliced or serialised whole) parses to the same object.
 * Never a crash, over-read or leak.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <pdgw/forwarder.h>

#include "pdgw_alloc.h"
#include "pdgw_body_splice.h"

/* A prompt of token ids held as text (pdgw_json_raw.h) in <leg>, the same ids as integers in
 * <expect>: what the written body must parse to. */
static void set_ids_text(json_t *leg, json_t *expect, uint8_t choice)
{
    json_t *ids = json_pack("[I,I]", (json_int_t)choice, (json_int_t)choice * 977);
    size_t n;
    json_t *raw = pdgw_fwd_ids_text_from(ids, &n);
    json_t *more = pdgw_fwd_ids_text_append(raw, 7);
    if (more == NULL) {
        json_decref(ids);
        json_decref(raw);
        return;
    }
    json_array_append_new(ids, json_integer(7));
    json_object_set_new(leg, (choice & 128u) ? "prompt" : "token_ids", more);
    json_object_set_new(expect, (choice & 128u) ? "prompt" : "token_ids", ids);
    json_decref(raw);
}

static void edit(json_t *leg, uint8_t choice)
{
    const char *key;
    json_t *v;
    unsigned i = 0;
    json_object_foreach(leg, key, v)
    {
        (void)v;
        if (i++ % 4 != (choice & 3u))
            continue;
        if (choice & 4u)
            json_object_del(leg, key); /* deleting the current key is allowed while iterating */
        else
            json_object_set_new(leg, key, json_integer(choice));
        break;
    }
    if (choice & 8u)
        json_object_set_new(leg, "kv_transfer_params", json_pack("{s:b}", "do_remote_decode", 1));
    if (choice & 16u)
        json_object_set_new(leg, "stream", json_false());
    if (choice & 32u) /* a prompt of token ids, as some protocols rebuild it per leg */
        json_object_set_new(leg, "prompt",
                            json_pack("[I,I,I]", (json_int_t)choice, -(json_int_t)choice * 977,
                                      (json_int_t)INT64_MIN + choice));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *client = json_loadb((const char *)data, size, 0, NULL);
    json_t *leg, *back, *expect;
    pdgw_buf_t out;
    pdgw_status_t st;

    if (!json_is_object(client)) {
        json_decref(client);
        return 0;
    }
    leg = json_copy(client);
    if (leg == NULL) {
        json_decref(client);
        return 0;
    }
    if (size > 0)
        edit(leg, data[size - 1]);
    if (size > 1)
        edit(leg, data[size - 2]);
    expect = json_copy(leg);
    if (size > 2 && (data[size - 3] & 64u) && expect != NULL)
        set_ids_text(leg, expect, data[size - 3]);
    pdgw_buf_init(&out);
    st = pdgw_body_splice((const char *)data, size, client, leg, &out);
    if (st == PDGW_OK) {
        back = json_loadb(out.data, out.len, 0, NULL);
        if (back == NULL || !json_equal(back, expect))
            abort();
        json_decref(back);
    } else if (st != PDGW_ERR_INVALID && st != PDGW_ERR_NOMEM) {
        abort();
    }
    pdgw_buf_free(&out);
    {
        /* spliced or serialised whole, the text parses to the same object */
        size_t len = 0;
        char *text = pdgw_body_text((const char *)data, size, client, leg, &len);
        if (text != NULL) {
            back = json_loadb(text, len, 0, NULL);
            if (back == NULL || !json_equal(back, expect))
                abort();
            json_decref(back);
            pdgw_free(text);
        }
    }
    json_decref(expect);
    json_decref(leg);
    json_decref(client);
    return 0;
}
