/*
 * kvt_hex.h - one hexadecimal digit's value, for the text forms libkvt reads (UUIDs, byte
 * strings in JSON messages, GIDs in the verbs handshake).
 */
#ifndef KVT_HEX_H
#define KVT_HEX_H

/* 0..15, or -1 when <c> is not a hexadecimal digit (either case). */
static inline int kvt_hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif /* KVT_HEX_H */
