/*
 * fuzz_id_list.c - the fast token-id list reader (gateway/src/util/pdgw_json_text.c) against
 * jansson on the same text.
 *
 * The input is read as an id list and as a /tokenize answer's "tokens" member. The fast path
 * must agree with jansson: a list it accepts is the list jansson parses, and a list of
 * non-negative integers jansson accepts is one it accepts too, except where jansson is lenient
 * or the text is rare (a NUL byte between tokens, which jansson reads as nothing; "-0"): the
 * fast path refuses those, and the caller's parse then decides. Never a crash, over-read or leak.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <pdgw/forwarder.h>

#include "pdgw_json_raw.h"
#include "pdgw_json_text.h"

static int all_ids(const json_t *v)
{
    size_t i;
    json_t *x;
    if (!json_is_array(v))
        return 0;
    json_array_foreach(v, i, x) if (!json_is_integer(x) || json_integer_value(x) < 0) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    json_t *fast = pdgw_json_id_list(text, size);
    json_t *slow = json_loadb(text, size, JSON_DECODE_ANY, NULL);
    size_t n = 0;

    if (fast != NULL && (slow == NULL || !json_equal(fast, slow)))
        abort();
    /* the counting reader accepts exactly what the list reader does */
    if (pdgw_json_id_list_count(text, size, &n) != (fast != NULL) ||
        (fast != NULL && n != json_array_size(fast)))
        abort();
    if (fast == NULL && all_ids(slow) && memchr(text, 0, size) == NULL &&
        memchr(text, '-', size) == NULL)
        abort();
    json_decref(fast);
    json_decref(slow);

    fast = pdgw_json_member_id_list(text, size, "tokens");
    slow = json_loadb(text, size, 0, NULL);
    if (fast != NULL && slow != NULL && !json_equal(fast, json_object_get(slow, "tokens")))
        abort();
    {
        /* kept as text: the same acceptance, and the text parses to the same ids */
        json_t *raw = pdgw_fwd_answer_ids_text(text, size, "tokens", &n);
        const char *t;
        size_t tl;
        if ((raw != NULL) != (fast != NULL))
            abort();
        if (raw != NULL) {
            json_t *back;
            if (!pdgw_json_raw_text(raw, &t, &tl) || n != json_array_size(fast))
                abort();
            back = json_loadb(t, tl, JSON_DECODE_ANY, NULL);
            if (back == NULL || !json_equal(back, fast))
                abort();
            json_decref(back);
        }
        json_decref(raw);
    }
    json_decref(fast);
    json_decref(slow);
    return 0;
}
