/*
 * fuzz_msg_decode.c -- libFuzzer target for the libkvt control-message
 * decoder (kvt_msg_decode / kvt_msg_peek_type) on untrusted bytes.
 *
 * Invariants checked beyond "no crash, no leak, no out-of-bounds read":
 *   - peek_type agrees with decode about the type of accepted input;
 *   - anything accepted re-encodes, and the re-encoding decodes to a message
 *     that encodes to the very same bytes (a canonical fixed point);
 *   - a rejected input leaves the output message empty.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvt/kvt_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_msg_t m, m2;
    kvt_msg_type_t t = KVT_MSG_NONE;
    kvt_msg_err_t err;
    void *enc = NULL, *enc2 = NULL;
    size_t elen = 0, elen2 = 0;
    kvt_status_t st;

    st = kvt_msg_decode(data, size, &m, &err);
    if (st != KVT_OK) {
        if (m.type != KVT_MSG_NONE)
            abort();
        return 0;
    }
    if (kvt_msg_peek_type(data, size, &t) != KVT_OK || t != m.type)
        abort();

    st = kvt_msg_encode(&m, &enc, &elen);
    if (st == KVT_OK) {
        if (kvt_msg_decode(enc, elen, &m2, &err) != KVT_OK)
            abort();
        if (kvt_msg_encode(&m2, &enc2, &elen2) != KVT_OK)
            abort();
        if (elen != elen2 || memcmp(enc, enc2, elen) != 0)
            abort();
        kvt_msg_clear(&m2);
        kvt_free(enc2);
        kvt_free(enc);
    } else if (st != KVT_ERR_LIMIT) {
        /* only a message over a size bound may fail to re-encode */
        abort();
    }
    {
        char *js = kvt_msg_to_json(&m);
        kvt_free(js);
    }
    kvt_msg_clear(&m);
    return 0;
}
