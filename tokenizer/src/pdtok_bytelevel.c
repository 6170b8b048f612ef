/*
 * pdtok_bytelevel.c - GPT-2's byte <-> printable character map: bytes that are printable
 * Latin-1 (! to ~, ¡ to ¬, ® to ÿ) stand for themselves, the other 68 are moved to
 * U+0100 upwards in byte order.
 */
#include <string.h>

#include "pdtok_int.h"

static bool printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

void tok_bytelevel_tables(pdtok_t *tok)
{
    int next = 256;
    for (int i = 0; i < 512; i++)
        tok->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = printable(b) ? (uint32_t)b : (uint32_t)next++;
        tok->bl_len[b] = (uint8_t)tok_utf8_put(cp, tok->bl_char[b]);
        tok->bl_byte[cp] = (int16_t)b;
    }
}
