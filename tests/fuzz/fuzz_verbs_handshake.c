/*
 * fuzz_verbs_handshake.c - a peer's verbs handshake blob (a TransportInit
 * message with transport "verbs": QP numbers, PSNs, LIDs, GIDs, MTUs, MR
 * addresses/keys) into kvt_verbs_hs_decode (kvtransfer/src/verbs/
 * kvt_verbs_handshake.c), and GID text into kvt_verbs_gid_parse.
 *
 * Never a crash, over-read or leak; a decoded handshake re-encodes and
 * decodes to the same lanes and regions (a fixed point); a parsed GID
 * formats back to text that parses to the same 16 bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_verbs_int.h"

static void gid(const uint8_t *data, size_t size)
{
    char s[64], text[40];
    uint8_t g[16], again[16];
    size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;

    memcpy(s, data, n);
    s[n] = '\0';
    if (kvt_verbs_gid_parse(s, g) == KVT_OK) {
        kvt_verbs_gid_format(g, text);
        if (kvt_verbs_gid_parse(text, again) != KVT_OK || memcmp(g, again, 16) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_verbs_hs_t hs, back;
    void *buf = NULL, *buf2 = NULL;
    size_t len = 0, len2 = 0;

    gid(data, size);
    memset(&hs, 0, sizeof(hs));
    if (kvt_verbs_hs_decode(data, size, &hs) != KVT_OK)
        return 0;
    /* accepted: encode -> decode -> encode is a fixed point */
    if (kvt_verbs_hs_encode(&hs, &buf, &len) != KVT_OK)
        abort();
    memset(&back, 0, sizeof(back));
    if (kvt_verbs_hs_decode(buf, len, &back) != KVT_OK ||
        kvt_verbs_hs_encode(&back, &buf2, &len2) != KVT_OK || len != len2 ||
        memcmp(buf, buf2, len) != 0)
        abort();
    kvt_verbs_hs_clear(&back);
    kvt_verbs_hs_clear(&hs);
    kvt_free(buf);
    kvt_free(buf2);
    return 0;
}
