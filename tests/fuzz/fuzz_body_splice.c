/*
 * fuzz_body_splice.c - a client body spliced into a leg body (gateway/src/pdgw_body_splice.c).
 *
 * The input is the client's text. When jansson parses it to an object, a leg is made the way
 * forwarders make one (the client's member values shared), and edited with choices taken from
 * the last input bytes: members removed, replaced, added. A splice that succeeds must parse to
 * an object equal to the leg; one that refuses must say PDGW_ERR_INVALID. Never a crash,
 * over-read or leak.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdgw_body_splice.h"

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
    json_t *leg, *back;
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
    pdgw_buf_init(&out);
    st = pdgw_body_splice((const char *)data, size, client, leg, &out);
    if (st == PDGW_OK) {
        back = json_loadb(out.data, out.len, 0, NULL);
        if (back == NULL || !json_equal(back, leg))
            abort();
        json_decref(back);
    } else if (st != PDGW_ERR_INVALID && st != PDGW_ERR_NOMEM) {
        abort();
    }
    pdgw_buf_free(&out);
    json_decref(leg);
    json_decref(client);
    return 0;
}
